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

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "ops.h"
#include "quant.h"

void rb_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps)
{
    double sum = 0.0; /* double, as ggml's rms_norm: long rows of large values */
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
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

void rb_rope_apply(const rb_rope *r, float *x, int n_heads, int head_dim, int64_t pos)
{
    const float theta_scale = powf(r->freq_base, -2.0f / (float)r->n_rot);
    const int half = r->n_rot / 2;
    float cos_t[512], sin_t[512]; /* n_rot <= 1024: checked when binding weights */
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

#if defined(__AVX2__) && defined(__FMA__)
/*
 * e^x in 8 lanes by the algorithm of ARM's optimized-routines expf, which
 * ggml's AVX2 SiLU uses (max error 1.45 + 0.5 ulp, not libm's expf): the
 * same steps give the same bits as llama.cpp's SwiGLU. x = n ln2 + b with
 * n = round(x / ln2) by the 1.5 * 2^23 shift, ln2 in two parts; e^b by a
 * degree-5 polynomial; 2^n assembled in the exponent bits. |n| > 126 needs
 * the scale split in two factors so that neither overflows; |n| > 192
 * saturates to 0 or inf.
 */
static __m256 rb_expf8(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 scale =
        _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 b2 = _mm256_mul_ps(b, b);
    const __m256 c45 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 c23 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 poly = _mm256_fmadd_ps(_mm256_fmadd_ps(c45, b2, c23), b2,
                                        _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(poly, scale, scale);
    if (!_mm256_movemask_ps(big))
        return normal;
    const __m256i neg = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
        _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(neg, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, neg));
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192), _CMP_GT_OQ);
    const __m256 split = _mm256_mul_ps(_mm256_fmadd_ps(s2, poly, s2), s1);
    return _mm256_blendv_ps(_mm256_blendv_ps(normal, split, big), _mm256_mul_ps(s1, s1), huge);
}
#endif

/* One row: ggml's SwiGLU takes 8 lanes at a time with the vector exp and
 * the tail with libm's expf, so where a row is cut into 8s matters. */
void rb_swiglu(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = rb_expf8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1), e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
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
