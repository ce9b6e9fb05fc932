/*
 * kvcodec_avx2.c - the KV codec's AVX2 kernels: the frame checksum's stripe
 * absorption, the lossy codecs' dequantization and the lossless codec's
 * mantissa merge (contracts and _ref forms in kvcodec.h). This file alone
 * of the codec is compiled with -mavx2 -mfma -mf16c; kvcodec.c runs its
 * kernel set where rb_cpu_tier() is avx2 or vnni (avx512 runs
 * kvcodec_avx512.c's, whose merge falls back to this one's when the hash
 * is not at an even stripe).
 */
#include "kvcodec_internal.h"

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

#define G RB_KVCODEC_GROUP

void rb_kvcodec_hash_stripes_avx2(uint64_t acc[4], uint64_t first, const uint8_t *p, size_t count)
{
    __m256i a = _mm256_loadu_si256((const __m256i *)acc);
    for (size_t i = 0; i < count; i++, p += 32)
        a = rb_kv_absorb_avx2(a, _mm256_loadu_si256((const __m256i *)p), first + i);
    _mm256_storeu_si256((__m256i *)acc, a);
}

/* 8 values (as 8 bytes in the low half of b8) at index i. */
static inline void emit8(__m128i b8, size_t i, const float *m, const float *s, int per_elem,
                         rb_f16 *out)
{
    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b8));
    __m256 vm, vs;
    if (per_elem) {
        vm = _mm256_loadu_ps(m + i);
        vs = _mm256_loadu_ps(s + i);
    } else {
        vm = _mm256_set1_ps(m[i / G]);
        vs = _mm256_set1_ps(s[i / G]);
    }
    __m256 y = _mm256_add_ps(vm, _mm256_mul_ps(vs, f));
    _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
}

/* 16 values: the 16 bytes of v, at index i. */
static inline void emit16(__m128i v, size_t i, const float *m, const float *s, int per_elem,
                          rb_f16 *out)
{
    emit8(v, i, m, s, per_elem, out);
    emit8(_mm_srli_si128(v, 8), i + 8, m, s, per_elem, out);
}

void rb_kvcodec_dequant_avx2(const uint8_t *q, size_t n, int bits, const float *m, const float *s,
                             int per_elem, rb_f16 *out)
{
    const size_t c = (size_t)(128 / bits), full = n / c;
    const __m128i mask = _mm_set1_epi8((char)((1 << bits) - 1));
    for (size_t k = 0; k < full; k++) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(q + 16 * k));
        const size_t i = k * c;
        if (bits == 8) {
            emit16(v, i, m, s, per_elem, out);
        } else if (bits == 4) {
            emit16(_mm_and_si128(v, mask), i, m, s, per_elem, out);
            emit16(_mm_and_si128(_mm_srli_epi16(v, 4), mask), i + 16, m, s, per_elem, out);
        } else {
            emit16(_mm_and_si128(v, mask), i, m, s, per_elem, out);
            emit16(_mm_and_si128(_mm_srli_epi16(v, 2), mask), i + 16, m, s, per_elem, out);
            emit16(_mm_and_si128(_mm_srli_epi16(v, 4), mask), i + 32, m, s, per_elem, out);
            emit16(_mm_and_si128(_mm_srli_epi16(v, 6), mask), i + 48, m, s, per_elem, out);
        }
    }
    if (full * c < n)
        rb_kvcodec_dequant_tail(q, n, bits, m, s, per_elem, out, full * c);
}

/* 32 values a step: the mantissa bits widened to 16 lanes twice, OR-ed
 * under the decoded top 6 bits, stored, and absorbed into the hash from
 * the registers (when the hash is at a stripe boundary: always for pages
 * whose head regions are multiples of 16 values). */
void rb_kvcodec_merge_avx2(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8, const uint8_t *hi2,
                           size_t n, rb_kvcodec_hash *h)
{
    const size_t full = n / 32;
    const __m128i three = _mm_set1_epi8(3);
    const __m256i top6 = _mm256_set1_epi16((short)0xfc00);
    const int fused = h->buf_len == 0;
    __m256i acc = _mm256_loadu_si256((const __m256i *)h->acc);
    uint64_t idx = h->n_stripes;
    for (size_t b = 0; b < full; b++) {
        __m128i hb = _mm_set1_epi64x((long long)rb_kv_load64(hi2 + 8 * b));
        /* bytes 0-7: values j (bits 0-1), 8-15: values 8+j (bits 2-3) */
        __m128i v01 = _mm_and_si128(_mm_unpacklo_epi64(hb, _mm_srli_epi64(hb, 2)), three);
        __m128i v23 = _mm_and_si128(_mm_unpacklo_epi64(_mm_srli_epi64(hb, 4),
                                                       _mm_srli_epi64(hb, 6)), three);
        __m128i l0 = _mm_loadu_si128((const __m128i *)(lo8 + 32 * b));
        __m128i l1 = _mm_loadu_si128((const __m128i *)(lo8 + 32 * b + 16));
        __m256i m0 = _mm256_or_si256(_mm256_cvtepu8_epi16(l0),
                                     _mm256_slli_epi16(_mm256_cvtepu8_epi16(v01), 8));
        __m256i m1 = _mm256_or_si256(_mm256_cvtepu8_epi16(l1),
                                     _mm256_slli_epi16(_mm256_cvtepu8_epi16(v23), 8));
        const __m256i *t = (const __m256i *)(top + 32 * b);
        __m256i *o = (__m256i *)(out + 32 * b);
        __m256i r0 = _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256(t), top6), m0);
        __m256i r1 = _mm256_or_si256(_mm256_and_si256(_mm256_loadu_si256(t + 1), top6), m1);
        _mm256_storeu_si256(o, r0);
        _mm256_storeu_si256(o + 1, r1);
        if (fused) {
            acc = rb_kv_absorb_avx2(acc, r0, idx++);
            acc = rb_kv_absorb_avx2(acc, r1, idx++);
        }
    }
    if (fused) {
        _mm256_storeu_si256((__m256i *)h->acc, acc);
        h->n_stripes = idx;
        h->total_bytes += 64 * full;
    } else {
        rb_kvcodec_hash_update_k(h, out, 64 * full, &rb_kvcodec_kernels_avx2);
    }
    for (size_t i = 32 * full; i < n; i++)
        out[i] = (rb_f16)((top[i] & 0xfc00) | rb_kv_hi2_at(hi2, n, i) << 8 | lo8[i]);
    rb_kvcodec_hash_update_k(h, out + 32 * full, 2 * (n - 32 * full), &rb_kvcodec_kernels_avx2);
}

const rb_kvcodec_kernels rb_kvcodec_kernels_avx2 = {
    rb_kvcodec_hash_stripes_avx2, rb_kvcodec_dequant_avx2, rb_kvcodec_merge_avx2,
    rb_kvcodec_quant_encode_avx2, rb_kvcodec_quant_decode_avx2, rb_kvcodec_lossless_decode_avx2,
};

#else
typedef int rb_kvcodec_avx2_unused; /* ISO C: a translation unit is not empty */
#endif
