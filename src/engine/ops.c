/*
 * ops.c - RMSNorm, RoPE, SwiGLU, softmax (contracts in ops.h). Scalar code
 * that the compiler vectorises: these are O(n) per token against the O(n^2)
 * of the matrix products, under 2% of decode time. Each follows ggml's
 * order of roundings (double sum in RMSNorm, the rope angle recurrence,
 * the contracted rope products, the vector exp in SwiGLU), so that the
 * logits are llama.cpp's bit for bit where the weights allow it.
 */
#include <math.h>
#include <pthread.h>

#include "cpu.h"
#include "ops.h"
#include "quant.h"
#include "ops_kernels.h"

static void rms_apply(float *y, const float *x, const float *w, int64_t n, double sum, float eps)
{
    const float mean = (float)(sum / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    if (w) {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * scale * w[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * scale;
    }
}

void rb_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps)
{
    double sum = 0.0; /* double, as ggml's rms_norm: long rows of large values */
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    rms_apply(y, x, w, n, sum, eps);
}

void rb_rmsnorm_rows(float *y, const float *x, const float *w, int64_t n, int64_t rows,
                     int64_t stride, float eps)
{
    int64_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *x0 = x + r * stride, *x1 = x0 + stride, *x2 = x1 + stride, *x3 = x2 + stride;
        /* each row's sum in its own order (ggml's): four independent chains */
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (int64_t i = 0; i < n; i++) {
            s0 += (double)(x0[i] * x0[i]);
            s1 += (double)(x1[i] * x1[i]);
            s2 += (double)(x2[i] * x2[i]);
            s3 += (double)(x3[i] * x3[i]);
        }
        float *y0 = y + r * stride;
        rms_apply(y0, x0, w, n, s0, eps);
        rms_apply(y0 + stride, x1, w, n, s1, eps);
        rms_apply(y0 + 2 * stride, x2, w, n, s2, eps);
        rms_apply(y0 + 3 * stride, x3, w, n, s3, eps);
    }
    for (; r < rows; r++)
        rb_rmsnorm(y + r * stride, x + r * stride, w, n, eps);
}

void rb_rope_angles(const rb_rope *r, int64_t pos, float *cos_t, float *sin_t)
{
    const float theta_scale = powf(r->freq_base, -2.0f / (float)r->n_rot);
    const int half = r->n_rot / 2;
    /* ggml's rope cache: theta grows from the position by repeated
       multiplication (not powf per dimension), and the frequency scale
       multiplies last, so the angles round as llama.cpp's do */
    float theta = (float)pos;
    for (int i = 0; i < half; i++) {
        float t = r->freq_factors ? theta / r->freq_factors[i] : theta;
        t *= r->freq_scale;
        cos_t[i] = cosf(t);
        sin_t[i] = sinf(t);
        theta *= theta_scale;
    }
}

void rb_rope_rotate(const rb_rope *r, float *x, int n_heads, int head_dim, const float *cos_t,
                    const float *sin_t)
{
#if defined(__x86_64__)
    /* this file is built without FMA: fmaf below is a libm call per value */
    const int tier = rb_cpu_tier();
    if (tier >= RB_CPU_TIER_AVX2 && tier <= RB_CPU_TIER_AVX512) {
        rb_rope_rotate_avx2(r->mode == RB_ROPE_NEOX, r->n_rot / 2, x, n_heads, head_dim, cos_t,
                            sin_t);
        return;
    }
#endif
    const int half = r->n_rot / 2;
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            int a = r->mode == RB_ROPE_NEOX ? i : 2 * i;
            int b = r->mode == RB_ROPE_NEOX ? i + half : 2 * i + 1;
            float x0 = v[a], x1 = v[b];
            /* gcc contracts ggml's x0*c - x1*s into fma(x0, c, -(x1*s)):
               the first product fused, the second rounded */
            v[a] = fmaf(x0, cos_t[i], -(x1 * sin_t[i]));
            v[b] = fmaf(x0, sin_t[i], x1 * cos_t[i]);
        }
    }
}

void rb_rope_apply(const rb_rope *r, float *x, int n_heads, int head_dim, int64_t pos)
{
    float cos_t[RB_ROPE_MAX_ROT / 2], sin_t[RB_ROPE_MAX_ROT / 2];
    rb_rope_angles(r, pos, cos_t, sin_t);
    rb_rope_rotate(r, x, n_heads, head_dim, cos_t, sin_t);
}


/* One row: ggml's SwiGLU takes 8 lanes at a time with the vector exp and
 * the tail with libm's expf, so where a row is cut into 8s matters. The
 * 8-lane part is ops_avx2.c's (x86 vector tiers) or ops_neon.c's (aarch64
 * vector tiers: the same bits); on the ref tier the row is scalar, libm's
 * expf throughout (within the golden bounds, not bitwise). */
void rb_swiglu(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
#if defined(__x86_64__)
    const int tier = rb_cpu_tier();
    if (tier >= RB_CPU_TIER_AVX2 && tier <= RB_CPU_TIER_AVX512)
        i = rb_swiglu8_avx2(gate, up, n);
#elif defined(__aarch64__)
    const int tier = rb_cpu_tier();
    if (tier >= RB_CPU_TIER_NEON && tier <= RB_CPU_TIER_I8MM)
        i = rb_swiglu8_neon(gate, up, n);
#endif
    for (; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* ggml's table: gelu of every f16 value, computed in float with the
 * constants and the expression ggml writes (0.5x(1 + tanh(sqrt(2/pi) x
 * (1 + 0.044715 x^2))), whose 1 + a*x*x gcc contracts into an fma), then
 * rounded to f16. */
static rb_f16 gelu_table[1 << 16];
static pthread_once_t gelu_once = PTHREAD_ONCE_INIT;

static void gelu_table_init(void)
{
    const float coef_a = 0.044715f, sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    for (uint32_t i = 0; i < (1u << 16); i++) {
        float x = rb_fp16_to_fp32((rb_f16)i);
        float inner = sqrt_2_over_pi * x * fmaf(coef_a * x, x, 1.0f);
        gelu_table[i] = rb_fp32_to_fp16(0.5f * x * (1.0f + tanhf(inner)));
    }
}

void rb_geglu(float *gate, const float *up, int64_t n)
{
    pthread_once(&gelu_once, gelu_table_init);
    for (int64_t i = 0; i < n; i++) {
        float x = gate[i];
        if (x <= -10.0f)
            gate[i] = 0.0f;
        else if (x >= 10.0f)
            gate[i] = x * up[i];
        else
            gate[i] = rb_fp16_to_fp32(gelu_table[rb_fp32_to_fp16(x)]) * up[i];
    }
}

void rb_softcap(float *x, int64_t n, float cap)
{
    const float inv = 1.0f / cap;
    for (int64_t i = 0; i < n; i++)
        x[i] = tanhf(x[i] * inv) * cap;
}

void rb_softmax(float *x, int64_t n)
{
    float max = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        max = x[i] > max ? x[i] : max;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - max);
        sum += x[i];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}
