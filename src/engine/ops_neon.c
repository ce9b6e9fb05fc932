/*
 * ops_neon.c - the AArch64 NEON bodies of attention's loops and of SwiGLU's
 * vector part (contracts in ops_kernels.h), the counterparts of
 * ops_avx2.c. Built twice, like matmul_neon.c: for armv8-a (the neon tier)
 * and, through ops_dotprod.c, with +dotprod for the quantized-K scores
 * (the only loops here that an int8 dot product speeds up; that build
 * defines those two alone).
 *
 * Every function gives the bits of its portable form, so that an aarch64
 * build computes what the x86 tiers compute:
 *   - the f16 q.k keeps ggml's AVX2 lanes (fp_dot.h): each 8-lane
 *     accumulator is two 4-lane registers, the reduction tree is the same
 *     (a0 + a2, a1 + a3, their sum, the halves, two pairwise adds);
 *   - V and the rescale: fused multiply-add / multiply in f32, rounded to
 *     f16 by FCVTN (round to nearest even, the FPCR default);
 *   - quantized K: lane l of a block is the integer sum of products
 *     4l..4l+3 (SDOT, or widening multiplies and pairwise adds), one fused
 *     multiply-add per lane, ggml's hsum_float_8;
 *   - SwiGLU: the vector exp of ops_avx2.c step for step (fused where it
 *     fuses), 4 lanes twice per 8 values, so that the first n - n % 8
 *     values of a row get llama.cpp's AVX2 bits on ARM too.
 *   - the tiled f32 form (attention.h): rb_attn_widen_ref's exact
 *     conversions and rb_attn_tblock_ref's operations lane by lane, its
 *     exp (rb_attn_exp) in 4 lanes; head dims that are multiples of 4, on
 *     the neon, dotprod and i8mm tiers alike (defined once, in the
 *     armv8-a build: nothing in it is an int8 product).
 */
#include "ops_kernels.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#if defined(RB_OPS_DOTPROD_BUILD)
#if !defined(__ARM_FEATURE_DOTPROD)
#error "ops_dotprod.c needs -march=armv8.2-a+dotprod"
#endif
#define RB_OPS_SFX(name) name##_dotprod
#else
#define RB_OPS_SFX(name) name##_neon
#endif

/* ---- quantized K --------------------------------------------------------- */

/* lane l: sum of a[4l..4l+3] * b[4l..4l+3], exact */
static inline int32x4_t rb_ops_sum4_s8(int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(vdupq_n_s32(0), a, b);
#else
    const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    const int32x4_t hi = vpaddlq_s16(vmull_high_s8(a, b));
    return vpaddq_s32(lo, hi);
#endif
}

/* ggml's hsum_float_8 over lanes lo = 0..3, hi = 4..7:
 * (l0 + l4) + (l2 + l6) + ((l1 + l5) + (l3 + l7)) */
static inline float rb_ops_hsum8(float32x4_t lo, float32x4_t hi)
{
    const float32x4_t r = vaddq_f32(hi, lo);
    return vpadds_f32(vadd_f32(vget_low_f32(r), vget_high_f32(r)));
}

float RB_OPS_SFX(rb_attn_dot_q8_0)(const void *k_row, const void *q_row, int n)
{
    const rb_block_q8_0 *x = k_row, *y = q_row;
    float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
    for (int b = 0; b < n / RB_QK8_0; b++) {
        const float d = rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d);
        const int32x4_t s0 = rb_ops_sum4_s8(vld1q_s8(x[b].qs), vld1q_s8(y[b].qs));
        const int32x4_t s1 = rb_ops_sum4_s8(vld1q_s8(x[b].qs + 16), vld1q_s8(y[b].qs + 16));
        lo = vfmaq_n_f32(lo, vcvtq_f32_s32(s0), d);
        hi = vfmaq_n_f32(hi, vcvtq_f32_s32(s1), d);
    }
    return rb_ops_hsum8(lo, hi);
}

float RB_OPS_SFX(rb_attn_dot_q4_0)(const void *k_row, const void *q_row, int n)
{
    const rb_block_q4_0 *x = k_row;
    const rb_block_q8_0 *y = q_row;
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
    for (int b = 0; b < n / RB_QK4_0; b++) {
        const float d = rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d);
        const uint8x16_t raw = vld1q_u8(x[b].qs);
        /* values 0..15 are the low nibbles, 16..31 the high ones */
        const int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, m4)), eight);
        const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight);
        const int32x4_t s0 = rb_ops_sum4_s8(q0, vld1q_s8(y[b].qs));
        const int32x4_t s1 = rb_ops_sum4_s8(q1, vld1q_s8(y[b].qs + 16));
        lo = vfmaq_n_f32(lo, vcvtq_f32_s32(s0), d);
        hi = vfmaq_n_f32(hi, vcvtq_f32_s32(s1), d);
    }
    return rb_ops_hsum8(lo, hi);
}

#if !defined(RB_OPS_DOTPROD_BUILD) /* the rest: one definition, the armv8-a build's */

/* ---- f16 attention --------------------------------------------------------- */

static inline float32x4_t rb_ops_ld4_f16(const rb_f16 *p)
{
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p)));
}

static inline void rb_ops_st4_f16(rb_f16 *p, float32x4_t x)
{
    vst1_u16(p, vreinterpret_u16_f16(vcvt_f16_f32(x)));
}

/* fp_dot.h's rb_dot_f16_ggml: AVX2 accumulator j, lanes 0-3 in a[2j], lanes
 * 4-7 in a[2j + 1] */
static inline float rb_ops_dot_f16(const rb_f16 *x, const rb_f16 *y, int64_t n)
{
    const int64_t np = n & ~(int64_t)31;
    float32x4_t a[8];
    for (int j = 0; j < 8; j++)
        a[j] = vdupq_n_f32(0.0f);
    for (int64_t i = 0; i < np; i += 32)
        for (int j = 0; j < 8; j++)
            a[j] = vfmaq_f32(a[j], rb_ops_ld4_f16(x + i + 4 * j), rb_ops_ld4_f16(y + i + 4 * j));
    double s = 0.0;
    if (np) {
        /* a0 += a2, a1 += a3, a0 += a1 (per 4-lane half) */
        const float32x4_t tl = vaddq_f32(vaddq_f32(a[0], a[4]), vaddq_f32(a[2], a[6]));
        const float32x4_t th = vaddq_f32(vaddq_f32(a[1], a[5]), vaddq_f32(a[3], a[7]));
        /* the two 128-bit halves, then two horizontal adds */
        const float32x4_t h = vaddq_f32(tl, th);
        const float32x2_t p = vpadd_f32(vget_low_f32(h), vget_high_f32(h));
        s = vpadds_f32(p);
    }
    for (int64_t i = np; i < n; i++)
        s += (double)(rb_fp16_to_fp32(x[i]) * rb_fp16_to_fp32(y[i]));
    return (float)s;
}

static inline void rb_ops_mad_f16(rb_f16 *acc, const rb_f16 *v, float s, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4)
        rb_ops_st4_f16(acc + i, vfmaq_n_f32(rb_ops_ld4_f16(acc + i), rb_ops_ld4_f16(v + i), s));
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(fmaf(rb_fp16_to_fp32(v[i]), s, rb_fp16_to_fp32(acc[i])));
}

static inline void rb_ops_scale_f16(rb_f16 *acc, float s, int n)
{
    int i = 0;
    for (; i + 4 <= n; i += 4)
        rb_ops_st4_f16(acc + i, vmulq_n_f32(rb_ops_ld4_f16(acc + i), s));
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) * s);
}

float rb_attn_dot_f16_neon(const rb_f16 *q, const rb_f16 *k, int n)
{
    return rb_ops_dot_f16(k, q, n);
}

void rb_attn_dot8_f16_neon(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8])
{
    for (int l = 0; l < 8; l++)
        out[l] = rb_ops_dot_f16(k + l * stride, q, n);
}

void rb_attn_mad_f16_neon(rb_f16 *acc, const rb_f16 *v, float s, int n)
{
    rb_ops_mad_f16(acc, v, s, n);
}

void rb_attn_scale_f16_neon(rb_f16 *acc, float s, int n)
{
    rb_ops_scale_f16(acc, s, n);
}

/* attention.c's rb_attn_block8_f16 in one call, as ops_avx2.c's */
void rb_attn_block8_f16_neon(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                             int n, float kq_scale, rb_f16 *acc, float *m, float *sum)
{
    float sc[8];
    for (int l = 0; l < 8; l++)
        sc[l] = rb_ops_dot_f16(k + l * stride, q, n);
    float mm = *m, ss = *sum;
    for (int l = 0; l < 8; l++) {
        const float s = sc[l] * kq_scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > mm) {
            const float m_old = mm;
            mm = s;
            ms = expf(m_old - mm);
            rb_ops_scale_f16(acc, ms, n);
        } else {
            vs = expf(s - mm);
        }
        rb_ops_mad_f16(acc, v + l * stride, vs, n);
        ss = fmaf(ss, ms, vs);
    }
    *m = mm;
    *sum = ss;
}

/* ---- SwiGLU ------------------------------------------------------------------ */

/* ops_avx2.c's rb_expf8 in 4 lanes, operation for operation: each fused
 * multiply-add there is one here (vfmaq / vfmsq round once, as
 * _mm256_fmadd_ps / _mm256_fnmadd_ps do), the rest plain IEEE steps */
static inline float32x4_t rb_expf4(float32x4_t x)
{
    const float32x4_t shift = vdupq_n_f32(0x1.8p23f);
    const float32x4_t z = vfmaq_f32(shift, x, vdupq_n_f32(0x1.715476p+0f));
    const float32x4_t n = vsubq_f32(z, shift);
    const float32x4_t b = vfmsq_f32(vfmsq_f32(x, n, vdupq_n_f32(0x1.62e4p-1f)), n,
                                    vdupq_n_f32(0x1.7f7d1cp-20f));
    const uint32x4_t e = vshlq_n_u32(vreinterpretq_u32_f32(z), 23);
    const float32x4_t scale =
        vreinterpretq_f32_u32(vaddq_u32(e, vreinterpretq_u32_f32(vdupq_n_f32(1.0f))));
    const float32x4_t abs_n = vabsq_f32(n);
    const uint32x4_t big = vcgtq_f32(abs_n, vdupq_n_f32(126.0f));
    const float32x4_t b2 = vmulq_f32(b, b);
    const float32x4_t c45 = vfmaq_f32(vdupq_n_f32(0x1.573e2ep-5f), vdupq_n_f32(0x1.0e4020p-7f), b);
    const float32x4_t c23 = vfmaq_f32(vdupq_n_f32(0x1.fffdb6p-2f), vdupq_n_f32(0x1.555e66p-3f), b);
    const float32x4_t poly = vfmaq_f32(vmulq_f32(vdupq_n_f32(0x1.ffffecp-1f), b),
                                       vfmaq_f32(c23, c45, b2), b2);
    const float32x4_t normal = vfmaq_f32(scale, poly, scale);
    if (vmaxvq_u32(big) == 0)
        return normal;
    const uint32x4_t neg = vandq_u32(vclezq_f32(n), vdupq_n_u32(0x82000000u));
    const float32x4_t s1 = vreinterpretq_f32_u32(vaddq_u32(neg, vdupq_n_u32(0x7f000000u)));
    const float32x4_t s2 = vreinterpretq_f32_u32(vsubq_u32(e, neg));
    const uint32x4_t huge = vcgtq_f32(abs_n, vdupq_n_f32(192.0f));
    const float32x4_t split = vmulq_f32(vfmaq_f32(s2, s2, poly), s1);
    return vbslq_f32(huge, vmulq_f32(s1, s1), vbslq_f32(big, split, normal));
}

int64_t rb_swiglu8_neon(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    const float32x4_t one = vdupq_n_f32(1.0f), zero = vdupq_n_f32(0.0f);
    for (; i + 8 <= n; i += 8)
        for (int64_t j = i; j < i + 8; j += 4) {
            const float32x4_t g = vld1q_f32(gate + j);
            const float32x4_t e = rb_expf4(vsubq_f32(zero, g));
            const float32x4_t silu = vdivq_f32(g, vaddq_f32(one, e));
            vst1q_f32(gate + j, vmulq_f32(silu, vld1q_f32(up + j)));
        }
    return i;
}

/* ---- the tiled f32 form ------------------------------------------------------ */

/*
 * rb_attn_widen_neon and rb_attn_tblock_neon: attention.h's tiled form in
 * 4-lane registers, for head dims that are multiples of 4 (no int8 product
 * in them: one definition serves the neon, dotprod and i8mm tiers). Each
 * lane takes rb_attn_widen_ref's and rb_attn_tblock_ref's operations in
 * their order, so the same bits:
 *   - widen: an f16 value by FCVTL (exact); a q8_0 / q4_0 value as the
 *     product d * q in f32 (exact: an 11-bit by 8-bit product), q4_0's
 *     values 0..15 the low nibbles, 16..31 the high ones;
 *   - scores: 4 positions x 16 queries in 16 accumulators; for each d in
 *     order one fused multiply-add per lane (FMLA by element, the K value
 *     taken from a 4-dim load of the widened row), from 0, then one
 *     product by kq_scale, or -inf outside the query's span;
 *   - softmax: 4 queries down the lanes, positions in order; the max is a
 *     compare and select (s > m ? s : m, as the scalar form writes it: a
 *     NaN score never wins, and m's sign of zero stays; FMAX would differ
 *     on both), the sum a plain add per position;
 *   - V: 4 queries x 16 dims in 16 accumulators, acc * ms first, then one
 *     fused multiply-add per position of the query's span in order (a
 *     position outside it is selected away where some span of the 4 does
 *     not hold the whole block: fma(0, v, -0) would give +0);
 *   - exp: rb_attn_exp step for step (rb_attn_exp4 below).
 * Scores and softmax run to the next multiple of 16 and 4 queries past nq,
 * V to the next multiple of 4 (attention.h: qt, first, last, m, l hold 64
 * queries, acc 16 when nq <= 16, and only the first nq are defined after).
 */

/* rb_attn_exp in 4 lanes: each fmaf is one vfmaq (one rounding), the
 * clamp to 88 a minimum (x < 88 ? x : 88 wherever x is not a NaN, and a
 * NaN lane is zeroed below), n converted exactly (it is an integer), and
 * the lanes where !(x >= RB_EXP_LO) (below, or a NaN) set to +0 */
static inline float32x4_t rb_attn_exp4(float32x4_t x)
{
    const uint32x4_t ok = vcgeq_f32(x, vdupq_n_f32(RB_EXP_LO));
    x = vminq_f32(x, vdupq_n_f32(88.0f));
    const float32x4_t sh = vdupq_n_f32(RB_EXP_SHIFT);
    const float32x4_t n = vsubq_f32(vfmaq_f32(sh, x, vdupq_n_f32(RB_EXP_LOG2E)), sh);
    float32x4_t r = vfmaq_f32(x, n, vdupq_n_f32(-RB_EXP_LN2_HI));
    r = vfmaq_f32(r, n, vdupq_n_f32(-RB_EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(RB_EXP_C7);
    p = vfmaq_f32(vdupq_n_f32(RB_EXP_C6), p, r);
    p = vfmaq_f32(vdupq_n_f32(RB_EXP_C5), p, r);
    p = vfmaq_f32(vdupq_n_f32(RB_EXP_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(RB_EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(RB_EXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const float32x4_t y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vandq_u32(ok, vreinterpretq_u32_f32(y)));
}

void rb_attn_exp_f32_neon(const float *x, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, rb_attn_exp4(vld1q_f32(x + i)));
    if (i < n) {
        float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        memcpy(t, x + i, (size_t)(n - i) * sizeof *t);
        vst1q_f32(t, rb_attn_exp4(vld1q_f32(t)));
        memcpy(y + i, t, (size_t)(n - i) * sizeof *t);
    }
}

/* 16 int8 values (q8_0's, or q4_0's after the nibble split) times d, into o */
static inline void rb_widen16_s8(int8x16_t q, float d, float *o)
{
    const int16x8_t lo = vmovl_s8(vget_low_s8(q)), hi = vmovl_high_s8(q);
    vst1q_f32(o + 0, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), d));
    vst1q_f32(o + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(lo)), d));
    vst1q_f32(o + 8, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), d));
    vst1q_f32(o + 12, vmulq_n_f32(vcvtq_f32_s32(vmovl_high_s16(hi)), d));
}

void rb_attn_widen_neon(uint32_t type, const void *const *rows, int np, int hd, float *out)
{
    const uint8x16_t m4 = vdupq_n_u8(0x0f);
    const int8x16_t eight = vdupq_n_s8(8);
    for (int p = 0; p < np; p++) {
        float *o = out + (size_t)p * hd;
        if (type == RB_TYPE_F16) {
            const rb_f16 *r = rows[p];
            int d = 0;
            for (; d + 4 <= hd; d += 4)
                vst1q_f32(o + d, rb_ops_ld4_f16(r + d));
            for (; d < hd; d++)
                o[d] = rb_fp16_to_fp32(r[d]);
        } else if (type == RB_TYPE_Q8_0) {
            const rb_block_q8_0 *x = rows[p];
            for (int b = 0; b < hd / RB_QK8_0; b++) {
                const float dd = rb_fp16_to_fp32(x[b].d);
                rb_widen16_s8(vld1q_s8(x[b].qs), dd, o + b * RB_QK8_0);
                rb_widen16_s8(vld1q_s8(x[b].qs + 16), dd, o + b * RB_QK8_0 + 16);
            }
        } else {
            const rb_block_q4_0 *x = rows[p];
            for (int b = 0; b < hd / RB_QK4_0; b++) {
                const float dd = rb_fp16_to_fp32(x[b].d);
                const uint8x16_t raw = vld1q_u8(x[b].qs);
                rb_widen16_s8(vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, m4)), eight), dd,
                              o + b * RB_QK4_0);
                rb_widen16_s8(vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), eight), dd,
                              o + b * RB_QK4_0 + 16);
            }
        }
    }
}

/* FMLA by element: c += a * b[lane], lane a constant */
#define RB_FMA_LANE(c, a, b, lane) ((c) = vfmaq_laneq_f32((c), (a), (b), (lane)))

/* the scores' dim d + L: each accumulator c[i][j] += q (dim d + L,
 * queries q + 4j..) * K (position p + i, dim d + L: lane L of k[i]) */
#define RB_TSCORE_DIM(L)                                                                         \
    do {                                                                                         \
        float32x4_t qv[4];                                                                       \
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                      \
            qv[j] = vld1q_f32(qt + (d + (L)) * 64 + q + 4 * j);                                  \
        _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++)                                     \
            _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++)                                  \
                RB_FMA_LANE(c[i][j], qv[j], k[i], (L));                                          \
    } while (0)

/* NP positions (4 or 1) from p of the scores, queries q..q+15 */
static inline __attribute__((always_inline)) void
rb_tscore4(const float *kf, const float *qt, int hd, int p, int q, int32_t p0, float kq_scale,
           const int32_t *first, const int32_t *last, float *st, const int NP)
{
    float32x4_t c[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) c[i][j] = vdupq_n_f32(0.0f);
    for (int d = 0; d < hd; d += 4) {
        float32x4_t k[4];
        _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++) k[i] = vld1q_f32(kf + (p + i) * hd + d);
        RB_TSCORE_DIM(0);
        RB_TSCORE_DIM(1);
        RB_TSCORE_DIM(2);
        RB_TSCORE_DIM(3);
    }
    const float32x4_t neg = vdupq_n_f32(-INFINITY);
    _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++) {
        const int32x4_t pos = vdupq_n_s32(p0 + p + i);
        _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
            const uint32x4_t in = vandq_u32(vcleq_s32(vld1q_s32(first + q + 4 * j), pos),
                                            vcleq_s32(pos, vld1q_s32(last + q + 4 * j)));
            vst1q_f32(st + (p + i) * 64 + q + 4 * j,
                      vbslq_f32(in, vmulq_n_f32(c[i][j], kq_scale), neg));
        }
    }
}

/* 1 when the spans of queries q..q+3 all hold positions p0..p0+np-1 */
static inline int rb_tcover4(const int32_t *first, const int32_t *last, int q, int32_t p0, int np)
{
    int all = 1;
    for (int i = 0; i < 4; i++)
        all &= first[q + i] <= p0 && p0 + np - 1 <= last[q + i];
    return all;
}

/* a[i] += v * w[i] for i < 4 (FMLA by element), or, MASKED, only for the
 * queries i whose span holds position pos (the others keep a[i]) */
#define RB_TVACC_FMA(i)                                                                          \
    do {                                                                                         \
        const float32x4_t f = vfmaq_laneq_f32(a[i][j], v[j], w, (i));                            \
        a[i][j] = MASKED ? vbslq_f32(in[i], f, a[i][j]) : f;                                     \
    } while (0)

/* queries q..q+3, NV vectors (4 or 1) of dims from d; MASKED: the fma of
 * a position outside a query's span left out (else every span of the 4
 * holds the block) */
static inline __attribute__((always_inline)) void
rb_tvacc4(const float *vf, const float *st, const float *ms, float *acc, int hd, int np, int q,
          int d, int32_t p0, const int32_t *first, const int32_t *last, const int NV,
          const int MASKED)
{
    float32x4_t a[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            a[i][j] = vmulq_n_f32(vld1q_f32(acc + (q + i) * hd + d + 4 * j), ms[q + i]);
    for (int p = 0; p < np; p++) {
        float32x4_t v[4];
        uint32x4_t in[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) v[j] = vld1q_f32(vf + p * hd + d + 4 * j);
        if (MASKED) {
            const int32_t pos = p0 + p;
            _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
                in[i] = vdupq_n_u32(first[q + i] <= pos && pos <= last[q + i] ? ~0u : 0u);
        }
        const float32x4_t w = vld1q_f32(st + p * 64 + q);
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) {
            RB_TVACC_FMA(0);
            RB_TVACC_FMA(1);
            RB_TVACC_FMA(2);
            RB_TVACC_FMA(3);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            vst1q_f32(acc + (q + i) * hd + d + 4 * j, a[i][j]);
}

/* the V sums of queries q..q+3 over all dims */
static inline __attribute__((always_inline)) void
rb_tvrows4(const float *vf, const float *st, const float *ms, float *acc, int hd, int np, int q,
           int32_t p0, const int32_t *first, const int32_t *last, const int MASKED)
{
    int d = 0;
    for (; d + 16 <= hd; d += 16)
        rb_tvacc4(vf, st, ms, acc, hd, np, q, d, p0, first, last, 4, MASKED);
    for (; d < hd; d += 4)
        rb_tvacc4(vf, st, ms, acc, hd, np, q, d, p0, first, last, 1, MASKED);
}

int rb_attn_tblock_neon(const float *kf, const float *vf, int np, int hd, int nq,
                        const float *qt, const int32_t *first, const int32_t *last, int32_t p0,
                        float kq_scale, float *st, float *kt, float *acc, float *m, float *l)
{
    (void)kt;
    if (hd % 4 != 0)
        return 0;
    float ms[64];
    for (int q = 0; q < nq; q += 16) {
        int p = 0;
        for (; p + 4 <= np; p += 4)
            rb_tscore4(kf, qt, hd, p, q, p0, kq_scale, first, last, st, 4);
        for (; p < np; p++)
            rb_tscore4(kf, qt, hd, p, q, p0, kq_scale, first, last, st, 1);
    }
    for (int q = 0; q < nq; q += 4) {
        const float32x4_t mo = vld1q_f32(m + q);
        float32x4_t mx = mo;
        for (int p = 0; p < np; p++) {
            const float32x4_t s = vld1q_f32(st + p * 64 + q);
            mx = vbslq_f32(vcgtq_f32(s, mx), s, mx);
        }
        const float32x4_t msv = rb_attn_exp4(vsubq_f32(mo, mx));
        vst1q_f32(ms + q, msv);
        vst1q_f32(m + q, mx);
        float32x4_t s = vmulq_f32(vld1q_f32(l + q), msv);
        for (int p = 0; p < np; p++) {
            const float32x4_t w = rb_attn_exp4(vsubq_f32(vld1q_f32(st + p * 64 + q), mx));
            vst1q_f32(st + p * 64 + q, w);
            s = vaddq_f32(s, w);
        }
        vst1q_f32(l + q, s);
    }
    for (int q = 0; q < nq; q += 4) {
        if (rb_tcover4(first, last, q, p0, np))
            rb_tvrows4(vf, st, ms, acc, hd, np, q, p0, first, last, 0);
        else
            rb_tvrows4(vf, st, ms, acc, hd, np, q, p0, first, last, 1);
    }
    return 1;
}

#endif /* !RB_OPS_DOTPROD_BUILD */

#else
typedef int rb_ops_neon_unused; /* ISO C: a translation unit is not empty */
#endif
