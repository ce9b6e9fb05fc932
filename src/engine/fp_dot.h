/*
 * fp_dot.h - f32 and f16 dot products in ggml's summation order, shared by
 * the F32/F16 matrix kernels and attention's q.k.
 *
 * Why an order at all: llama.cpp's reference logits (shared/models/golden)
 * come from ggml_vec_dot_f32 / ggml_vec_dot_f16 on AVX2, and a float sum's
 * last bits depend on its order. In a model whose activations are rounded
 * to f16 later (the KV cache, the f16 attention accumulator) one ulp here
 * flips an f16 rounding there, and the logits then drift by 1e-3..1e-2
 * (stories260K: 1.4e-2 with a single 8-lane accumulator). With this order
 * stories260K, parity-F16 and parity-qwen3 match llama.cpp bit for bit.
 *
 * The order: elements in steps of 32, four 8-lane accumulators (lane l of
 * accumulator j takes elements 32s + 8j + l, fused multiply-add); then
 * acc0 += acc2, acc1 += acc3, acc0 += acc1 lane-wise; the two 4-lane halves
 * added; then ((t0 + t1) + (t2 + t3)) (two horizontal adds). The n % 32
 * tail: f32 - product rounded, then added, one by one in float (fusing
 * them measurably breaks the match: stories260K 1.3e-3); f16 - products
 * (exact in f32) summed in double onto the vector sum, as ggml_float.
 * (The build has -ffp-contract=off, so `s += x * y` stays two roundings.)
 *
 * The portable forms compute the same lanes with fmaf, so every target gets
 * the same bits; the AVX2 forms are the fast path, in the files compiled
 * with AVX2 (matmul_avx2.c, ops_avx2.c: attention's x86 loops).
 */
#ifndef RB_FP_DOT_H
#define RB_FP_DOT_H

#include <math.h>
#include <stdint.h>

#include "quant.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

static inline float rb_fp_reduce4(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
    a0 = _mm256_add_ps(a0, a2);
    a1 = _mm256_add_ps(a1, a3);
    a0 = _mm256_add_ps(a0, a1);
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(a0), _mm256_extractf128_ps(a0, 1));
    t = _mm_hadd_ps(t, t);
    return _mm_cvtss_f32(_mm_hadd_ps(t, t));
}

static inline float rb_dot_f32_ggml(const float *x, const float *y, int64_t n)
{
    const int64_t np = n & ~(int64_t)31;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < np; i += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(y + i + 24), a3);
    }
    float s = np ? rb_fp_reduce4(a0, a1, a2, a3) : 0.0f;
    for (int64_t i = np; i < n; i++)
        s += x[i] * y[i];
    return s;
}

static inline __m256 rb_fp_load8_f16(const rb_f16 *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline float rb_dot_f16_ggml(const rb_f16 *x, const rb_f16 *y, int64_t n)
{
    const int64_t np = n & ~(int64_t)31;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < np; i += 32) {
        a0 = _mm256_fmadd_ps(rb_fp_load8_f16(x + i), rb_fp_load8_f16(y + i), a0);
        a1 = _mm256_fmadd_ps(rb_fp_load8_f16(x + i + 8), rb_fp_load8_f16(y + i + 8), a1);
        a2 = _mm256_fmadd_ps(rb_fp_load8_f16(x + i + 16), rb_fp_load8_f16(y + i + 16), a2);
        a3 = _mm256_fmadd_ps(rb_fp_load8_f16(x + i + 24), rb_fp_load8_f16(y + i + 24), a3);
    }
    double s = np ? rb_fp_reduce4(a0, a1, a2, a3) : 0.0;
    for (int64_t i = np; i < n; i++)
        s += (double)(rb_fp16_to_fp32(x[i]) * rb_fp16_to_fp32(y[i]));
    return (float)s;
}

#else /* portable: the same lanes, the same roundings */

static inline float rb_fp_reduce32(float a[32])
{
    float t[8], h[4];
    for (int l = 0; l < 8; l++)
        t[l] = (a[l] + a[16 + l]) + (a[8 + l] + a[24 + l]);
    for (int l = 0; l < 4; l++)
        h[l] = t[l] + t[4 + l];
    return (h[0] + h[1]) + (h[2] + h[3]);
}

static inline float rb_dot_f32_ggml(const float *x, const float *y, int64_t n)
{
    const int64_t np = n & ~(int64_t)31;
    float a[32] = {0};
    for (int64_t i = 0; i < np; i += 32)
        for (int l = 0; l < 32; l++)
            a[l] = fmaf(x[i + l], y[i + l], a[l]);
    float s = np ? rb_fp_reduce32(a) : 0.0f;
    for (int64_t i = np; i < n; i++)
        s += x[i] * y[i];
    return s;
}

static inline float rb_dot_f16_ggml(const rb_f16 *x, const rb_f16 *y, int64_t n)
{
    const int64_t np = n & ~(int64_t)31;
    float a[32] = {0};
    for (int64_t i = 0; i < np; i += 32)
        for (int l = 0; l < 32; l++)
            a[l] = fmaf(rb_fp16_to_fp32(x[i + l]), rb_fp16_to_fp32(y[i + l]), a[l]);
    double s = np ? rb_fp_reduce32(a) : 0.0;
    for (int64_t i = np; i < n; i++)
        s += (double)(rb_fp16_to_fp32(x[i]) * rb_fp16_to_fp32(y[i]));
    return (float)s;
}

#endif
#endif
