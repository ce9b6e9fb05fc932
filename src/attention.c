/*
 * attention.c - f16 attention loops in the order of operations that
 * reproduces llama.cpp's reference logits bit for bit on parity-Q8_0.gguf
 * (see attention.h): q.k summed sequentially in f32 (products of two f16
 * values are exact in f32), V accumulated as f16(acc + v * s) with the
 * product and the sum rounded separately.
 *
 * Measured on the reference files: with these loops parity-Q8_0's logits
 * equal llama.cpp's exactly at every position; with ggml's AVX2 order (four
 * 8-lane FMA accumulators, fused multiply-add into the f16 accumulator)
 * they differ by up to 0.1. So the reference was evidently made with the
 * scalar forms. The AVX2 versions keep those bits: V is vectorised across
 * dimensions (independent), the score across positions (each lane one
 * sequential sum).
 */
#include "attention.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define RB_ATTN_AVX2 1
#endif

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

float rb_attn_dot_f16(const rb_f16 *q, const rb_f16 *k, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += rb_fp16_to_fp32(q[i]) * rb_fp16_to_fp32(k[i]);
    return s;
}

/*
 * Eight positions at once, one per lane: each lane runs the sequential sum
 * of rb_attn_dot_f16 (multiply, then add: two roundings, as there), so the
 * bits are the same; the vector only removes the dependency chain between
 * positions. K rows are gathered two f16 at a time (a 32-bit gather) and
 * split into the even and the odd dimension.
 */
void rb_attn_dot8_f16(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8])
{
#ifdef RB_ATTN_AVX2
    if (n % 2 == 0 && stride % 2 == 0 && stride * 7 < (1 << 30)) {
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                               _mm256_set1_epi32((int)(stride / 2)));
        const __m256i low = _mm256_set1_epi32(0xffff);
        __m256 s = _mm256_setzero_ps();
        for (int i = 0; i < n; i += 2) {
            __m256i w = _mm256_i32gather_epi32((const int *)(k + i), idx, 4);
            __m256i p = _mm256_packus_epi32(_mm256_and_si256(w, low), _mm256_srli_epi32(w, 16));
            p = _mm256_permute4x64_epi64(p, 0xd8); /* [even 0..7 | odd 0..7] */
            __m256 k0 = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
            __m256 k1 = _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1));
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(rb_fp16_to_fp32(q[i])), k0));
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_set1_ps(rb_fp16_to_fp32(q[i + 1])), k1));
        }
        _mm256_storeu_ps(out, s);
        return;
    }
#endif
    for (int l = 0; l < 8; l++)
        out[l] = rb_attn_dot_f16(q, k + l * stride, n);
}

void rb_attn_mad_f16(rb_f16 *acc, const rb_f16 *v, float s, int n)
{
    int i = 0;
#ifdef RB_ATTN_AVX2
    /* lanes are independent dimensions: multiply, add, round to f16 (RNE),
       the scalar loop's operations exactly */
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
        a = _mm256_add_ps(a, _mm256_mul_ps(x, vs));
        _mm_storeu_si128((__m128i *)(acc + i), _mm256_cvtps_ph(a, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) + rb_fp16_to_fp32(v[i]) * s);
}

void rb_attn_scale_f16(rb_f16 *acc, float s, int n)
{
    int i = 0;
#ifdef RB_ATTN_AVX2
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        _mm_storeu_si128((__m128i *)(acc + i),
                         _mm256_cvtps_ph(_mm256_mul_ps(a, vs), _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) * s);
}
