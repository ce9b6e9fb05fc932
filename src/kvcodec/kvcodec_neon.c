/*
 * kvcodec_neon.c - the KV codec's AArch64 NEON kernels, the counterparts of
 * kvcodec_avx2.c: the frame checksum's stripe absorption (also the session
 * file's and the spill store's checksum), the lossy codecs'
 * dequantization and the lossless codec's mantissa merge (contracts and
 * _ref forms in kvcodec.h). Compiled for armv8-a, where NEON is the floor;
 * kvcodec.c runs this kernel set on the neon and dotprod tiers.
 *
 * The same bits as the _ref kernels: the hash is integer arithmetic
 * (UMULL for the 32 x 32 -> 64-bit products); the dequantization computes
 * m + s * q in float, multiply then add, and rounds to f16 by FCVTN (round
 * to nearest even); the merge is bit operations. The payload coders
 * themselves (kvcodec_quant.c, kvcodec_lossless_dec.c) need no second
 * build here: the baseline already has NEON, so the set points at the
 * baseline ones, which call these kernels through it.
 */
#include "kvcodec_internal.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>

#define G RB_KVCODEC_GROUP

/* ---- hash ------------------------------------------------------------------ */

/* lanes 0-1 and 2-3 of the hash in two registers */
typedef struct { uint64x2_t a0, a1; } rb_kv_acc_neon;

/* x * 0x9E3779B1 mod 2^64 per lane: lo32 * p + (hi32 * p) << 32 */
static inline uint64x2_t mul_prime(uint64x2_t x)
{
    const uint32x2_t p = vdup_n_u32(0x9E3779B1u);
    const uint64x2_t lo = vmull_u32(vmovn_u64(x), p);
    const uint64x2_t hi = vmull_u32(vshrn_n_u64(x, 32), p);
    return vaddq_u64(lo, vshlq_n_u64(hi, 32));
}

/* rb_kvcodec_hash_stripes_ref's step for the stripe d0 (bytes 0-15), d1
 * (16-31) at global stripe index idx */
static inline void absorb(rb_kv_acc_neon *a, uint64x2_t d0, uint64x2_t d1, uint64_t idx)
{
    const uint64_t *k = rb_kvcodec_hash_keys + (idx & 15) * 4;
    const uint64x2_t x0 = veorq_u64(d0, vld1q_u64(k)), x1 = veorq_u64(d1, vld1q_u64(k + 2));
    /* lane l += lo32(x) * hi32(x) + w[l ^ 1] */
    const uint64x2_t p0 = vmull_u32(vmovn_u64(x0), vshrn_n_u64(x0, 32));
    const uint64x2_t p1 = vmull_u32(vmovn_u64(x1), vshrn_n_u64(x1, 32));
    a->a0 = vaddq_u64(a->a0, vaddq_u64(p0, vextq_u64(d0, d0, 1)));
    a->a1 = vaddq_u64(a->a1, vaddq_u64(p1, vextq_u64(d1, d1, 1)));
    if ((idx & 15) == 15) { /* scramble: fold, key, multiply by the 32-bit prime */
        const uint64_t *seed = rb_kvcodec_hash_keys + 64;
        uint64x2_t s0 = veorq_u64(a->a0, vshrq_n_u64(a->a0, 47));
        uint64x2_t s1 = veorq_u64(a->a1, vshrq_n_u64(a->a1, 47));
        a->a0 = mul_prime(veorq_u64(s0, vld1q_u64(seed)));
        a->a1 = mul_prime(veorq_u64(s1, vld1q_u64(seed + 2)));
    }
}

static inline uint64x2_t ld_u64x2(const uint8_t *p) { return vreinterpretq_u64_u8(vld1q_u8(p)); }

void rb_kvcodec_hash_stripes_neon(uint64_t acc[4], uint64_t first, const uint8_t *p, size_t count)
{
    rb_kv_acc_neon a = {vld1q_u64(acc), vld1q_u64(acc + 2)};
    for (size_t i = 0; i < count; i++, p += 32)
        absorb(&a, ld_u64x2(p), ld_u64x2(p + 16), first + i);
    vst1q_u64(acc, a.a0);
    vst1q_u64(acc + 2, a.a1);
}

/* ---- dequantization ---------------------------------------------------------- */

/* 8 values (the bytes of b8) at index i: f16(m + s * q), multiply then add */
static inline void emit8(uint8x8_t b8, size_t i, const float *m, const float *s, int per_elem,
                         rb_f16 *out)
{
    const uint16x8_t w = vmovl_u8(b8);
    const float32x4_t f0 = vcvtq_f32_u32(vmovl_u16(vget_low_u16(w)));
    const float32x4_t f1 = vcvtq_f32_u32(vmovl_high_u16(w));
    float32x4_t m0, m1, s0, s1;
    if (per_elem) {
        m0 = vld1q_f32(m + i), m1 = vld1q_f32(m + i + 4);
        s0 = vld1q_f32(s + i), s1 = vld1q_f32(s + i + 4);
    } else { /* i is a multiple of 8, so the 8 values share a group */
        m0 = m1 = vdupq_n_f32(m[i / G]);
        s0 = s1 = vdupq_n_f32(s[i / G]);
    }
    const float16x4_t h0 = vcvt_f16_f32(vaddq_f32(m0, vmulq_f32(s0, f0)));
    const float16x8_t h = vcvt_high_f16_f32(h0, vaddq_f32(m1, vmulq_f32(s1, f1)));
    vst1q_u16(out + i, vreinterpretq_u16_f16(h));
}

static inline void emit16(uint8x16_t v, size_t i, const float *m, const float *s, int per_elem,
                          rb_f16 *out)
{
    emit8(vget_low_u8(v), i, m, s, per_elem, out);
    emit8(vget_high_u8(v), i + 8, m, s, per_elem, out);
}

void rb_kvcodec_dequant_neon(const uint8_t *q, size_t n, int bits, const float *m, const float *s,
                             int per_elem, rb_f16 *out)
{
    const size_t c = (size_t)(128 / bits), full = n / c;
    const uint8x16_t mask = vdupq_n_u8((uint8_t)((1 << bits) - 1));
    for (size_t k = 0; k < full; k++) {
        /* byte j of a chunk: values j, j + 16, j + 32, j + 48 at bit offsets
         * 0, bits, 2 bits, 3 bits (kvcodec_quant.c) */
        const uint8x16_t v = vld1q_u8(q + 16 * k);
        const size_t i = k * c;
        if (bits == 8) {
            emit16(v, i, m, s, per_elem, out);
        } else if (bits == 4) {
            emit16(vandq_u8(v, mask), i, m, s, per_elem, out);
            emit16(vshrq_n_u8(v, 4), i + 16, m, s, per_elem, out);
        } else {
            emit16(vandq_u8(v, mask), i, m, s, per_elem, out);
            emit16(vandq_u8(vshrq_n_u8(v, 2), mask), i + 16, m, s, per_elem, out);
            emit16(vandq_u8(vshrq_n_u8(v, 4), mask), i + 32, m, s, per_elem, out);
            emit16(vshrq_n_u8(v, 6), i + 48, m, s, per_elem, out);
        }
    }
    if (full * c < n)
        rb_kvcodec_dequant_tail(q, n, bits, m, s, per_elem, out, full * c);
}

/* ---- lossless mantissa merge ----------------------------------------------------- */

/* 32 values a step: the two mantissa bits of hi2 (byte j: values j, 8 + j,
 * 16 + j, 24 + j at bits 0, 2, 4, 6) interleaved with the 8 of lo8 into 16
 * lanes, OR-ed under the top 6 bits, stored, and absorbed into the hash
 * from the registers when the hash is at a stripe boundary (as the AVX2
 * merge). */
void rb_kvcodec_merge_neon(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8, const uint8_t *hi2,
                           size_t n, rb_kvcodec_hash *h)
{
    const size_t full = n / 32;
    const uint8x8_t three = vdup_n_u8(3);
    const uint16x8_t top6 = vdupq_n_u16(0xfc00);
    const int fused = h->buf_len == 0;
    rb_kv_acc_neon acc = {vld1q_u64(h->acc), vld1q_u64(h->acc + 2)};
    uint64_t idx = h->n_stripes;
    for (size_t b = 0; b < full; b++) {
        const uint8x8_t hb = vld1_u8(hi2 + 8 * b);
        const uint8x16_t h01 = vcombine_u8(vand_u8(hb, three), vand_u8(vshr_n_u8(hb, 2), three));
        const uint8x16_t h23 = vcombine_u8(vand_u8(vshr_n_u8(hb, 4), three), vshr_n_u8(hb, 6));
        const uint8x16_t l0 = vld1q_u8(lo8 + 32 * b), l1 = vld1q_u8(lo8 + 32 * b + 16);
        const rb_f16 *t = top + 32 * b;
        uint16x8_t r[4];
        r[0] = vreinterpretq_u16_u8(vzip1q_u8(l0, h01));
        r[1] = vreinterpretq_u16_u8(vzip2q_u8(l0, h01));
        r[2] = vreinterpretq_u16_u8(vzip1q_u8(l1, h23));
        r[3] = vreinterpretq_u16_u8(vzip2q_u8(l1, h23));
        for (int j = 0; j < 4; j++)
            r[j] = vorrq_u16(vandq_u16(vld1q_u16(t + 8 * j), top6), r[j]);
        rb_f16 *o = out + 32 * b;
        for (int j = 0; j < 4; j++)
            vst1q_u16(o + 8 * j, r[j]);
        if (fused) {
            absorb(&acc, vreinterpretq_u64_u16(r[0]), vreinterpretq_u64_u16(r[1]), idx++);
            absorb(&acc, vreinterpretq_u64_u16(r[2]), vreinterpretq_u64_u16(r[3]), idx++);
        }
    }
    if (fused) {
        vst1q_u64(h->acc, acc.a0);
        vst1q_u64(h->acc + 2, acc.a1);
        h->n_stripes = idx;
        h->total_bytes += 64 * full;
    } else {
        rb_kvcodec_hash_update_k(h, out, 64 * full, &rb_kvcodec_kernels_neon);
    }
    for (size_t i = 32 * full; i < n; i++)
        out[i] = (rb_f16)((top[i] & 0xfc00) | rb_kv_hi2_at(hi2, n, i) << 8 | lo8[i]);
    rb_kvcodec_hash_update_k(h, out + 32 * full, 2 * (n - 32 * full), &rb_kvcodec_kernels_neon);
}

const rb_kvcodec_kernels rb_kvcodec_kernels_neon = {
    rb_kvcodec_hash_stripes_neon, rb_kvcodec_dequant_neon, rb_kvcodec_merge_neon,
    rb_kvcodec_quant_encode, rb_kvcodec_quant_decode, rb_kvcodec_lossless_decode,
};

#else
typedef int rb_kvcodec_neon_unused; /* ISO C: a translation unit is not empty */
#endif
