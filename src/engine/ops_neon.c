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
 */
#include "ops_kernels.h"

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#include <math.h>

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

#endif /* !RB_OPS_DOTPROD_BUILD */

#else
typedef int rb_ops_neon_unused; /* ISO C: a translation unit is not empty */
#endif
