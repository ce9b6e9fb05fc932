/*
 * ops.c - RMSNorm, RoPE, SwiGLU, softmax (contracts in ops.h). Scalar code
 * that the compiler vectorises: these are O(n) per token against the O(n^2)
 * of the matrix products, under 2% of decode time.
 */
#include <math.h>

#include "ops.h"

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
    float theta = (float)pos * r->freq_scale;
    for (int i = 0; i < half; i++) {
        float t = r->freq_factors ? theta / r->freq_factors[i] : theta;
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
            v[a] = x0 * cos_t[i] - x1 * sin_t[i];
            v[b] = x0 * sin_t[i] + x1 * cos_t[i];
        }
    }
}

void rb_swiglu(float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
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
