/*
 * kvcodec_avx512.c - the KV codec's AVX-512 kernels: the frame checksum's
 * stripe absorption, the lossy codecs' dequantization and the lossless
 * codec's mantissa merge (contracts and _ref forms in kvcodec.h). This
 * file alone of the codec is compiled with the avx512 set's flags
 * (AVX-512 F/BW/VL/DQ/VNNI); kvcodec.c runs its kernel set where
 * rb_cpu_tier() is RB_CPU_TIER_AVX512. The payload coders themselves are
 * the avx2 builds (kvcodec_quant_avx2.c encode, kvcodec_lossless_dec_avx2.c)
 * and the lossy decoder built for this set (kvcodec_quant_avx512.c): they
 * reach these kernels through the set they are given.
 *
 * Same bits as _ref:
 *   - hash: the accumulate step of a stripe is a sum of 64-bit lanes, so
 *     within one 16-stripe block (until its scramble) two stripes are
 *     absorbed at once, stripe 2j in the low 256 bits of a zmm and 2j+1 in
 *     the high; the two halves are added (mod 2^64, order-free) before the
 *     block's scramble and at the end of a call. An odd first stripe is
 *     absorbed alone.
 *   - dequant: f16(m + s * q) with one float multiply and one float add
 *     (no FMA: the build has -ffp-contract=off and the intrinsics are the
 *     separate mul and add), rounded to f16 by vcvtps2ph's nearest-even,
 *     16 values a step.
 *   - merge: the same OR of top bits, hi2 pair and lo8 byte, 32 values
 *     (two stripes) a step, hashed from the register.
 *   - dequant_absorb: dequant's values 32 a step, stored and hashed from
 *     the register (the q8/q4/q2 decoder of kvcodec_quant_avx512.c calls
 *     it per row instead of dequantizing a tile and hashing it after:
 *     1.5x on a standalone loop of 64 MiB of q8 K rows, Zen 5).
 * Memory: none beyond the caller's buffers.
 */
#include "kvcodec_internal.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>

#define G RB_KVCODEC_GROUP

/* The scramble of a 256-bit accumulator (rb_kvcodec_hash_stripes_ref's
 * every-16th-stripe step). */
static inline __m256i scramble256(__m256i a)
{
    const __m256i prime = _mm256_set1_epi64x(0x9E3779B1);
    a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
    a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(rb_kvcodec_hash_keys + 64)));
    __m256i lo = _mm256_mul_epu32(a, prime);
    __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), prime);
    return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

/* The state of an absorption two stripes a step: acc is the four lanes as
 * of the last scramble (or the call's start), sum the lanes' additions
 * since then, stripe idx in the low half and idx+1 in the high. */
typedef struct hash2 {
    __m256i acc;
    __m512i sum;
    uint64_t idx; /* the next stripe's global index */
} hash2;

static inline __m256i fold(__m256i acc, __m512i sum)
{
    return _mm256_add_epi64(acc, _mm256_add_epi64(_mm512_castsi512_si256(sum),
                                                  _mm512_extracti64x4_epi64(sum, 1)));
}

/* Absorbs stripes idx (low half of d) and idx + 1 (high half); idx even. */
static inline void absorb2(hash2 *s, __m512i d)
{
    const uint64_t b = s->idx & 15;
    __m512i k = _mm512_loadu_si512((const void *)(rb_kvcodec_hash_keys + b * 4));
    __m512i x = _mm512_xor_si512(d, k);
    __m512i prod = _mm512_mul_epu32(x, _mm512_srli_epi64(x, 32));
    __m512i sw = _mm512_shuffle_epi32(d, (_MM_PERM_ENUM)_MM_SHUFFLE(1, 0, 3, 2)); /* w[l ^ 1] */
    s->sum = _mm512_add_epi64(s->sum, _mm512_add_epi64(prod, sw));
    s->idx += 2;
    if (b == 14) { /* stripe idx + 1 closed the block */
        s->acc = scramble256(fold(s->acc, s->sum));
        s->sum = _mm512_setzero_si512();
    }
}

static inline __m256i finish2(const hash2 *s) { return fold(s->acc, s->sum); }

void rb_kvcodec_hash_stripes_avx512(uint64_t acc[4], uint64_t first, const uint8_t *p,
                                    size_t count)
{
    __m256i a = _mm256_loadu_si256((const __m256i *)acc);
    if (count && (first & 1)) { /* odd: one stripe alone, then pairs */
        a = rb_kv_absorb_avx2(a, _mm256_loadu_si256((const __m256i *)p), first);
        first++, count--, p += 32;
    }
    hash2 s = {a, _mm512_setzero_si512(), first};
    for (; count >= 2; count -= 2, p += 64)
        absorb2(&s, _mm512_loadu_si512((const void *)p));
    a = finish2(&s);
    if (count)
        a = rb_kv_absorb_avx2(a, _mm256_loadu_si256((const __m256i *)p), s.idx);
    _mm256_storeu_si256((__m256i *)acc, a);
}

/* 16 values: the 16 bytes of b (one value each) at index i. */
static inline void emit16(__m128i b, size_t i, const float *m, const float *s, int per_elem,
                          rb_f16 *out)
{
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
    __m512 vm, vs;
    if (per_elem) {
        vm = _mm512_loadu_ps(m + i);
        vs = _mm512_loadu_ps(s + i);
    } else { /* i % 16 == 0 and G % 16 == 0: one group */
        vm = _mm512_set1_ps(m[i / G]);
        vs = _mm512_set1_ps(s[i / G]);
    }
    __m512 y = _mm512_add_ps(vm, _mm512_mul_ps(vs, f));
    _mm256_storeu_si256((__m256i *)(out + i), _mm512_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT));
}

void rb_kvcodec_dequant_avx512(const uint8_t *q, size_t n, int bits, const float *m,
                               const float *s, int per_elem, rb_f16 *out)
{
    const size_t c = (size_t)(128 / bits), full = n / c;
    const __m128i mask = _mm_set1_epi8((char)((1 << bits) - 1));
    size_t k = 0;
    if (bits == 8) { /* 64 values a step, then 16 */
        for (; k + 4 <= full; k += 4) {
            const __m512i v = _mm512_loadu_si512((const void *)(q + 16 * k));
            emit16(_mm512_castsi512_si128(v), 16 * k, m, s, per_elem, out);
            emit16(_mm512_extracti32x4_epi32(v, 1), 16 * k + 16, m, s, per_elem, out);
            emit16(_mm512_extracti32x4_epi32(v, 2), 16 * k + 32, m, s, per_elem, out);
            emit16(_mm512_extracti32x4_epi32(v, 3), 16 * k + 48, m, s, per_elem, out);
        }
    }
    for (; k < full; k++) {
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

/* The f16 of 16 values (the 16 bytes of b) at index i. */
static inline __m256i deq16(__m128i b, size_t i, const float *m, const float *s, int per_elem)
{
    __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b));
    __m512 vm, vs;
    if (per_elem) {
        vm = _mm512_loadu_ps(m + i);
        vs = _mm512_loadu_ps(s + i);
    } else {
        vm = _mm512_set1_ps(m[i / G]);
        vs = _mm512_set1_ps(s[i / G]);
    }
    return _mm512_cvtps_ph(_mm512_add_ps(vm, _mm512_mul_ps(vs, f)), _MM_FROUND_TO_NEAREST_INT);
}

void rb_kvcodec_dequant_absorb_avx512(const uint8_t *q, size_t n, int bits, const float *m,
                                      const float *s, int per_elem, rb_f16 *out,
                                      rb_kvcodec_hash *h)
{
    const size_t c = (size_t)(128 / bits);
    if (n % 32 || n % c || h->buf_len != 0 || (h->n_stripes & 1)) {
        rb_kvcodec_dequant_avx512(q, n, bits, m, s, per_elem, out);
        rb_kvcodec_hash_update_k(h, out, 2 * n, &rb_kvcodec_kernels_avx512);
        return;
    }
    const __m128i mask = _mm_set1_epi8((char)((1 << bits) - 1));
    hash2 st = {_mm256_loadu_si256((const __m256i *)h->acc), _mm512_setzero_si512(),
                h->n_stripes};
    for (size_t i = 0; i < n; i += 32) {
        __m128i b0, b1; /* the bytes of values i..i+15 and i+16..i+31 */
        if (bits == 8) {
            b0 = _mm_loadu_si128((const __m128i *)(q + i));
            b1 = _mm_loadu_si128((const __m128i *)(q + i + 16));
        } else if (bits == 4) { /* chunk i / 32: low nibbles, high nibbles */
            const __m128i v = _mm_loadu_si128((const __m128i *)(q + i / 2));
            b0 = _mm_and_si128(v, mask);
            b1 = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
        } else { /* chunk i / 64: bit pairs 0-1 and 2-3, or 4-5 and 6-7 */
            const __m128i v = _mm_loadu_si128((const __m128i *)(q + i / 64 * 16));
            const int sh = (i & 32) ? 4 : 0;
            b0 = _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(sh)), mask);
            b1 = _mm_and_si128(_mm_srl_epi16(v, _mm_cvtsi32_si128(sh + 2)), mask);
        }
        const __m512i d = _mm512_inserti64x4(
            _mm512_castsi256_si512(deq16(b0, i, m, s, per_elem)), deq16(b1, i + 16, m, s, per_elem),
            1);
        _mm512_storeu_si512((void *)(out + i), d);
        absorb2(&st, d);
    }
    _mm256_storeu_si256((__m256i *)h->acc, finish2(&st));
    h->n_stripes = st.idx;
    h->total_bytes += 2 * n;
}

/* 32 values a step: the 8 bytes of hi2 repeated to 32 lanes of 16 bits
 * (lane i holds byte i % 8, whose bit pair i / 8 is value i's), shifted
 * per lane, masked and OR-ed with the lo8 bytes under the top 6 bits;
 * stored and absorbed into the hash from the register when the hash is at
 * an even stripe boundary (always for heads of a multiple of 32 values),
 * else by the avx2 merge. */
void rb_kvcodec_merge_avx512(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8,
                             const uint8_t *hi2, size_t n, rb_kvcodec_hash *h)
{
    if (h->buf_len != 0 || (h->n_stripes & 1)) {
        rb_kvcodec_merge_avx2(out, top, lo8, hi2, n, h);
        return;
    }
    const size_t full = n / 32;
    const __m512i shifts = _mm512_set_epi64(0x0006000600060006, 0x0006000600060006,
                                            0x0004000400040004, 0x0004000400040004,
                                            0x0002000200020002, 0x0002000200020002, 0, 0);
    const __m512i three = _mm512_set1_epi16(3);
    const __m512i top6 = _mm512_set1_epi16((short)0xfc00);
    hash2 s = {_mm256_loadu_si256((const __m256i *)h->acc), _mm512_setzero_si512(),
               h->n_stripes};
    for (size_t b = 0; b < full; b++) {
        __m512i hb = _mm512_cvtepu8_epi16(_mm256_set1_epi64x((long long)rb_kv_load64(hi2 + 8 * b)));
        __m512i v2 = _mm512_and_si512(_mm512_srlv_epi16(hb, shifts), three);
        __m512i l = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(lo8 + 32 * b)));
        __m512i t = _mm512_and_si512(_mm512_loadu_si512((const void *)(top + 32 * b)), top6);
        __m512i r = _mm512_or_si512(_mm512_or_si512(t, l), _mm512_slli_epi16(v2, 8));
        _mm512_storeu_si512((void *)(out + 32 * b), r);
        absorb2(&s, r);
    }
    _mm256_storeu_si256((__m256i *)h->acc, finish2(&s));
    h->n_stripes = s.idx;
    h->total_bytes += 64 * full;
    for (size_t i = 32 * full; i < n; i++)
        out[i] = (rb_f16)((top[i] & 0xfc00) | rb_kv_hi2_at(hi2, n, i) << 8 | lo8[i]);
    rb_kvcodec_hash_update_k(h, out + 32 * full, 2 * (n - 32 * full), &rb_kvcodec_kernels_avx512);
}

const rb_kvcodec_kernels rb_kvcodec_kernels_avx512 = {
    rb_kvcodec_hash_stripes_avx512, rb_kvcodec_dequant_avx512, rb_kvcodec_merge_avx512,
    rb_kvcodec_quant_encode_avx2, rb_kvcodec_quant_decode_avx512, rb_kvcodec_lossless_decode_avx2,
};

#else
typedef int rb_kvcodec_avx512_unused; /* ISO C: a translation unit is not empty */
#endif
