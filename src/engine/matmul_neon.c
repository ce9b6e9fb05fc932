/*
 * matmul_neon.c - AArch64 NEON kernels (compiled only for __aarch64__; built
 * three times: for armv8-a here, with the dotprod extension
 * (matmul_dotprod.c), and with dotprod + i8mm (matmul_i8mm.c: SMMLA
 * prefill tiles for Q4_0 / Q8_0, below).
 *
 * Scope: vectorized activation converters and one vec_dot per type; the
 * tile is a loop of vec_dots (no weight reuse across tokens yet: prefill on
 * ARM runs at decode speed per token). Integer products use vdotq_s32 with
 * the dotprod extension, else vmull_s8 + pairwise widening adds; both give
 * the same exact integers as the reference. Each block's integer sum is
 * folded into a scalar float in block order, so for the quantized types
 * the results equal the _ref kernels' up to the order of the final
 * multiply (sumi * (dw * da)) and the float F32/F16/BF16 kernels differ
 * from _ref only in summation order (4 lanes x 4 accumulators).
 */
#include "matmul_kernels.h"

#if defined(__aarch64__) && defined(__ARM_NEON)

/* The build of this file: neon (the armv8-a floor), or dotprod
 * (matmul_dotprod.c includes it, compiled with +dotprod: vdotq_s32, the
 * same exact integers, so the same results). */
#if defined(RB_NEON_I8MM_BUILD)
#if !defined(__ARM_FEATURE_DOTPROD) || !defined(__ARM_FEATURE_MATMUL_INT8)
#error "matmul_i8mm.c needs -march=armv8.2-a+dotprod+i8mm"
#endif
#define RB_NEON_TABLE rb_matmul_isa_i8mm
#define RB_NEON_NAME "i8mm"
#elif defined(RB_NEON_DOTPROD_BUILD)
#if !defined(__ARM_FEATURE_DOTPROD)
#error "matmul_dotprod.c needs -march=armv8.2-a+dotprod"
#endif
#define RB_NEON_TABLE rb_matmul_isa_dotprod
#define RB_NEON_NAME "dotprod"
#else
#define RB_NEON_TABLE rb_matmul_isa_neon
#define RB_NEON_NAME "neon"
#endif

#include <arm_neon.h>
#include <stddef.h>
#include <math.h>
#include <string.h>

static inline int32x4_t rb_dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    int16x8_t hi = vmull_high_s8(a, b);
    return vpadalq_s16(vpadalq_s16(acc, lo), hi);
#endif
}

/* ---- activation converters ------------------------------------------------ */

/* rb_quantize_act_q8_0_ref's rule: id = 127 / amax, vcvtnq rounds half to even */
static void rb_quantize_act_q8_0_neon(const float *x, void *dst, int64_t n)
{
    rb_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / RB_QK8_0; b++, x += RB_QK8_0) {
        float32x4_t v[8];
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int k = 0; k < 8; k++) {
            v[k] = vld1q_f32(x + 4 * k);
            m = vmaxq_f32(m, vabsq_f32(v[k]));
        }
        const float amax = vmaxvq_f32(m);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = rb_fp32_to_fp16(d);
        int16x4_t h[8];
        for (int k = 0; k < 8; k++) {
            int32x4_t i = vcvtnq_s32_f32(vmulq_n_f32(v[k], id));
            i = vminq_s32(vmaxq_s32(i, vdupq_n_s32(-127)), vdupq_n_s32(127));
            h[k] = vmovn_s32(i);
        }
        for (int k = 0; k < 2; k++) {
            int8x8_t lo = vmovn_s16(vcombine_s16(h[4 * k], h[4 * k + 1]));
            int8x8_t hi = vmovn_s16(vcombine_s16(h[4 * k + 2], h[4 * k + 3]));
            vst1q_s8(y[b].qs + 16 * k, vcombine_s8(lo, hi));
        }
    }
}

static void rb_quantize_act_q8_K_neon(const float *x, void *dst, int64_t n)
{
    /* once per token per matrix: the reference is fast enough and exact */
    rb_quantize_act_q8_K_ref(x, dst, n);
}

static void rb_quantize_act_f16_neon(const float *x, void *dst, int64_t n)
{
    rb_f16 *y = dst;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        float16x4_t h = vcvt_f16_f32(vld1q_f32(x + i)); /* FPCR default: nearest even */
        vst1_u16(y + i, vreinterpret_u16_f16(h));
    }
    for (; i < n; i++)
        y[i] = rb_fp32_to_fp16(x[i]);
}

/* ---- vec dots ---------------------------------------------------------------- */

static float rb_vec_dot_q4_0_q8_0_neon(int64_t n, const void *w, const void *a)
{
    const rb_block_q4_0 *x = w;
    const rb_block_q8_0 *y = a;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        uint8x16_t raw = vld1q_u8(x[b].qs);
        int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
        int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vdupq_n_s8(8));
        int32x4_t s = rb_dot_s8(vdupq_n_s32(0), lo, vld1q_s8(y[b].qs));
        s = rb_dot_s8(s, hi, vld1q_s8(y[b].qs + 16));
        sumf += (float)vaddvq_s32(s) * (rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d));
    }
    return sumf;
}

static float rb_vec_dot_q5_0_q8_0_neon(int64_t n, const void *w, const void *a)
{
    const rb_block_q5_0 *x = w;
    const rb_block_q8_0 *y = a;
    static const uint8_t bit_of[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bits = vld1q_u8(bit_of);
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        /* byte j of h0 / h1: qh bit j / bit j + 16, as 0x10 or 0 */
        uint8x8_t q0 = vdup_n_u8(x[b].qh[0]), q1 = vdup_n_u8(x[b].qh[1]);
        uint8x8_t q2 = vdup_n_u8(x[b].qh[2]), q3 = vdup_n_u8(x[b].qh[3]);
        uint8x16_t h0 = vtstq_u8(vcombine_u8(q0, q1), bits);
        uint8x16_t h1 = vtstq_u8(vcombine_u8(q2, q3), bits);
        h0 = vandq_u8(h0, vdupq_n_u8(0x10));
        h1 = vandq_u8(h1, vdupq_n_u8(0x10));
        uint8x16_t raw = vld1q_u8(x[b].qs);
        int8x16_t lo = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vandq_u8(raw, vdupq_n_u8(0x0f)), h0)), vdupq_n_s8(16));
        int8x16_t hi = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(raw, 4), h1)), vdupq_n_s8(16));
        int32x4_t s = rb_dot_s8(vdupq_n_s32(0), lo, vld1q_s8(y[b].qs));
        s = rb_dot_s8(s, hi, vld1q_s8(y[b].qs + 16));
        sumf += (float)vaddvq_s32(s) * (rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d));
    }
    return sumf;
}

static float rb_vec_dot_q8_0_q8_0_neon(int64_t n, const void *w, const void *a)
{
    const rb_block_q8_0 *x = w;
    const rb_block_q8_0 *y = a;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        int32x4_t s = rb_dot_s8(vdupq_n_s32(0), vld1q_s8(x[b].qs), vld1q_s8(y[b].qs));
        s = rb_dot_s8(s, vld1q_s8(x[b].qs + 16), vld1q_s8(y[b].qs + 16));
        sumf += (float)vaddvq_s32(s) * (rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d));
    }
    return sumf;
}

static float rb_vec_dot_q4_K_q8_K_neon(int64_t n, const void *w, const void *a)
{
    const rb_block_q4_K *x = w;
    const rb_block_q8_K *y = a;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        uint8_t sc[8], m[8];
        rb_k4_scales_mins(x[b].scales, sc, m);
        int sumi = 0, summ = 0;
        for (int g = 0; g < 4; g++) {
            const int8_t *yq = y[b].qs + 64 * g;
            int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
            for (int h = 0; h < 2; h++) {
                uint8x16_t raw = vld1q_u8(x[b].qs + 32 * g + 16 * h);
                s0 = rb_dot_s8(s0, vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), vld1q_s8(yq + 16 * h));
                s1 = rb_dot_s8(s1, vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vld1q_s8(yq + 32 + 16 * h));
            }
            sumi += sc[2 * g] * vaddvq_s32(s0) + sc[2 * g + 1] * vaddvq_s32(s1);
        }
        for (int j = 0; j < 8; j++)
            summ += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        const float d = rb_fp16_to_fp32(x[b].d) * y[b].d;
        const float dmin = rb_fp16_to_fp32(x[b].dmin) * y[b].d;
        sumf += d * (float)sumi - dmin * (float)summ;
    }
    return sumf;
}

static float rb_vec_dot_q6_K_q8_K_neon(int64_t n, const void *w, const void *a)
{
    const rb_block_q6_K *x = w;
    const rb_block_q8_K *y = a;
    float sumf = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m3 = vdupq_n_u8(0x30);
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        int sumi = 0;
        for (int h = 0; h < 2; h++) {
            const int8_t *sc = x[b].scales + 8 * h;
            const int8_t *yq = y[b].qs + 128 * h;
            for (int half = 0; half < 2; half++) { /* elements l = 16 half .. +15 */
                uint8x16_t l0 = vld1q_u8(x[b].ql + 64 * h + 16 * half);
                uint8x16_t l1 = vld1q_u8(x[b].ql + 64 * h + 32 + 16 * half);
                uint8x16_t qh = vld1q_u8(x[b].qh + 32 * h + 16 * half);
                uint8x16_t q[4];
                q[0] = vorrq_u8(vandq_u8(l0, m4), vandq_u8(vshlq_n_u8(qh, 4), m3));
                q[1] = vorrq_u8(vandq_u8(l1, m4), vandq_u8(vshlq_n_u8(qh, 2), m3));
                q[2] = vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(qh, m3));
                q[3] = vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(vshrq_n_u8(qh, 2), m3));
                for (int k = 0; k < 4; k++) {
                    int8x16_t qs = vsubq_s8(vreinterpretq_s8_u8(q[k]), vdupq_n_s8(32));
                    int32x4_t s = rb_dot_s8(vdupq_n_s32(0), qs, vld1q_s8(yq + 32 * k + 16 * half));
                    sumi += sc[2 * k + half] * vaddvq_s32(s);
                }
            }
        }
        sumf += rb_fp16_to_fp32(x[b].d) * y[b].d * (float)sumi;
    }
    return sumf;
}

/* F32 / F16 / BF16: 16 elements per step in 4 accumulators, scalar tail */
#define RB_NEON_FP_DOT(fname, LOAD4, LOAD1)                                           \
    static float fname(int64_t n, const void *w, const void *a)                       \
    {                                                                                 \
        float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0),         \
                              vdupq_n_f32(0)};                                        \
        int64_t i = 0;                                                                \
        for (; i + 16 <= n; i += 16)                                                  \
            for (int k = 0; k < 4; k++)                                               \
                acc[k] = vfmaq_f32(acc[k], LOAD4(w, i + 4 * k), LOAD4(a, i + 4 * k)); \
        float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]),                     \
                                       vaddq_f32(acc[2], acc[3])));                   \
        for (; i < n; i++)                                                            \
            s += LOAD1(w, i) * LOAD1(a, i);                                           \
        return s;                                                                     \
    }

#define RB_LD4_F32(p, i) vld1q_f32((const float *)(p) + (i))
#define RB_LD1_F32(p, i) (((const float *)(p))[i])
#define RB_LD4_F16(p, i) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(p) + (i))))
#define RB_LD1_F16(p, i) rb_fp16_to_fp32(((const uint16_t *)(p))[i])
#define RB_LD4_BF16(p, i) \
    vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(p) + (i)), 16))
#define RB_LD1_BF16(p, i) rb_bf16_to_fp32(((const uint16_t *)(p))[i])

RB_NEON_FP_DOT(rb_vec_dot_f32_neon, RB_LD4_F32, RB_LD1_F32)
RB_NEON_FP_DOT(rb_vec_dot_f16_neon, RB_LD4_F16, RB_LD1_F16)
RB_NEON_FP_DOT(rb_vec_dot_bf16_neon, RB_LD4_BF16, RB_LD1_BF16)

#define RB_NEON_TILE(name, dot)                                                          \
    static void name(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,      \
                     const void *act, size_t act_row_bytes, int n_tok, float *y,         \
                     int64_t y_stride)                                                   \
    {                                                                                    \
        for (int t = 0; t < n_tok; t++)                                                  \
            for (int r = 0; r < n_rows; r++)                                             \
                y[t * y_stride + r] = dot(n_cols, (const char *)w + r * w_row_bytes,     \
                                          (const char *)act + t * act_row_bytes);        \
    }

RB_NEON_TILE(rb_tile_q4_0_neon, rb_vec_dot_q4_0_q8_0_neon)
RB_NEON_TILE(rb_tile_q5_0_neon, rb_vec_dot_q5_0_q8_0_neon)
RB_NEON_TILE(rb_tile_q8_0_neon, rb_vec_dot_q8_0_q8_0_neon)
RB_NEON_TILE(rb_tile_q4_K_neon, rb_vec_dot_q4_K_q8_K_neon)
/* Q5_K: Q4_K's nibbles with bit j of qh[l] as bit 4 of chunk j's codes
 * (vshlq by 4 - j: a negative count shifts right); codes <= 31 are valid
 * signed bytes for the dot. Per block, the exact sum(scale * q * a) and
 * sum(min * bsum) each become one float term. */
static float rb_vec_dot_q5_K_q8_K_neon(int64_t n, const void *w, const void *a)
{
    const rb_block_q5_K *x = w;
    const rb_block_q8_K *y = a;
    float sumf = 0.0f, summ = 0.0f;
    const uint8x16_t m4 = vdupq_n_u8(0x0f), m16 = vdupq_n_u8(0x10);
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        uint8_t sc[8], m[8];
        rb_k4_scales_mins(x[b].scales, sc, m);
        int32_t imin = 0;
        for (int j = 0; j < 8; j++)
            imin += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        const uint8x16_t qh[2] = {vld1q_u8(x[b].qh), vld1q_u8(x[b].qh + 16)};
        const int8_t *yq = y[b].qs;
        int32_t sumi = 0;
        for (int g = 0; g < 4; g++) {
            int32x4_t s0 = vdupq_n_s32(0), s1 = vdupq_n_s32(0);
            for (int half = 0; half < 2; half++) {
                const uint8x16_t raw = vld1q_u8(x[b].qs + 32 * g + 16 * half);
                const uint8x16_t h0 = vandq_u8(vshlq_u8(qh[half], vdupq_n_s8((int8_t)(4 - 2 * g))), m16);
                const uint8x16_t h1 = vandq_u8(vshlq_u8(qh[half], vdupq_n_s8((int8_t)(3 - 2 * g))), m16);
                const int8x16_t lo = vreinterpretq_s8_u8(vorrq_u8(vandq_u8(raw, m4), h0));
                const int8x16_t hi = vreinterpretq_s8_u8(vorrq_u8(vshrq_n_u8(raw, 4), h1));
                s0 = rb_dot_s8(s0, lo, vld1q_s8(yq + 64 * g + 16 * half));
                s1 = rb_dot_s8(s1, hi, vld1q_s8(yq + 64 * g + 32 + 16 * half));
            }
            sumi += sc[2 * g] * vaddvq_s32(s0) + sc[2 * g + 1] * vaddvq_s32(s1);
        }
        sumf += rb_fp16_to_fp32(x[b].d) * y[b].d * (float)sumi;
        summ += rb_fp16_to_fp32(x[b].dmin) * y[b].d * (float)imin;
    }
    return sumf - summ;
}

/* Q4_1 (is_q5 0) / Q5_1 (1) against Q8_1: unsigned codes (<= 31, valid
 * signed bytes) times a, and the block's m * s from the activation. */
static inline float rb_vec_dot_q4_5_1_q8_1_neon(int64_t n, const void *w, const void *a,
                                                const int is_q5)
{
    const rb_block_q8_1 *y = a;
    static const uint8_t bit_of[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bits = vld1q_u8(bit_of);
    const size_t bb = is_q5 ? sizeof(rb_block_q5_1) : sizeof(rb_block_q4_1);
    float sumf = 0.0f, summs = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        const char *xb = (const char *)w + b * bb;
        rb_f16 dh, mh;
        memcpy(&dh, xb, sizeof dh);
        memcpy(&mh, xb + 2, sizeof mh);
        const uint8_t *qs = (const uint8_t *)xb + (is_q5 ? offsetof(rb_block_q5_1, qs)
                                                         : offsetof(rb_block_q4_1, qs));
        const uint8x16_t raw = vld1q_u8(qs);
        uint8x16_t lo = vandq_u8(raw, vdupq_n_u8(0x0f)), hi = vshrq_n_u8(raw, 4);
        if (is_q5) {
            const uint8_t *qh = ((const rb_block_q5_1 *)xb)->qh;
            const uint8x16_t h0 = vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), bits);
            const uint8x16_t h1 = vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), bits);
            lo = vorrq_u8(lo, vandq_u8(h0, vdupq_n_u8(0x10)));
            hi = vorrq_u8(hi, vandq_u8(h1, vdupq_n_u8(0x10)));
        }
        int32x4_t s = rb_dot_s8(vdupq_n_s32(0), vreinterpretq_s8_u8(lo), vld1q_s8(y[b].qs));
        s = rb_dot_s8(s, vreinterpretq_s8_u8(hi), vld1q_s8(y[b].qs + 16));
        sumf += (float)vaddvq_s32(s) * (rb_fp16_to_fp32(dh) * rb_fp16_to_fp32(y[b].d));
        summs += rb_fp16_to_fp32(mh) * rb_fp16_to_fp32(y[b].s);
    }
    return sumf + summs;
}

static float rb_vec_dot_q4_1_q8_1_neon(int64_t n, const void *w, const void *a)
{
    return rb_vec_dot_q4_5_1_q8_1_neon(n, w, a, 0);
}

static float rb_vec_dot_q5_1_q8_1_neon(int64_t n, const void *w, const void *a)
{
    return rb_vec_dot_q4_5_1_q8_1_neon(n, w, a, 1);
}

RB_NEON_TILE(rb_tile_q6_K_neon, rb_vec_dot_q6_K_q8_K_neon)
RB_NEON_TILE(rb_tile_q5_K_neon, rb_vec_dot_q5_K_q8_K_neon)
RB_NEON_TILE(rb_tile_q4_1_neon, rb_vec_dot_q4_1_q8_1_neon)
RB_NEON_TILE(rb_tile_q5_1_neon, rb_vec_dot_q5_1_q8_1_neon)
RB_NEON_TILE(rb_tile_f32_neon, rb_vec_dot_f32_neon)
RB_NEON_TILE(rb_tile_f16_neon, rb_vec_dot_f16_neon)
RB_NEON_TILE(rb_tile_bf16_neon, rb_vec_dot_bf16_neon)

#if defined(RB_NEON_I8MM_BUILD)
/*
 * Q4_0 / Q8_0 prefill with SMMLA (the i8mm build): the tile's rows and
 * tokens go in pairs; one vmmlaq_s32 multiplies an 8-byte slice of two
 * weight rows with the same slice of two activation rows, giving the four
 * integer sums [r0.t0, r0.t1, r1.t0, r1.t1]; four slices make a block's
 * exact integer dots. Each is then folded as the vec_dot above folds it,
 * sumf += (float)sumi * (d_w * d_a), in block order, one chain per
 * (row, token): the same bits as the dotprod tier (determinism rule of
 * matmul_kernels.h). An odd row or token is paired with itself and its
 * second copy dropped. One token (decode) runs the vec_dot: a pair would
 * waste half of every SMMLA.
 */

/* a block's 32 signed codes as two 16-byte halves: Q4_0 nibbles - 8 ... */
static inline void rb_i8mm_codes_q4_0(const void *row, int64_t b, int8x16_t q[2])
{
    const rb_block_q4_0 *x = (const rb_block_q4_0 *)row + b;
    const uint8x16_t raw = vld1q_u8(x->qs);
    q[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(raw, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    q[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(raw, 4)), vdupq_n_s8(8));
}

/* ... and Q8_0's as they are */
static inline void rb_i8mm_codes_q8_0(const void *row, int64_t b, int8x16_t q[2])
{
    const rb_block_q8_0 *x = (const rb_block_q8_0 *)row + b;
    q[0] = vld1q_s8(x->qs);
    q[1] = vld1q_s8(x->qs + 16);
}

/* the four block dots of rows (x0, x1) with tokens (y0, y1), each given as
 * its two 16-byte code halves */
static inline int32x4_t rb_i8mm_block(const int8x16_t x0[2], const int8x16_t x1[2],
                                      const int8x16_t y0[2], const int8x16_t y1[2])
{
    int32x4_t acc = vdupq_n_s32(0);
    for (int h = 0; h < 2; h++) {
        const int64x2_t a0 = vreinterpretq_s64_s8(x0[h]), a1 = vreinterpretq_s64_s8(x1[h]);
        const int64x2_t b0 = vreinterpretq_s64_s8(y0[h]), b1 = vreinterpretq_s64_s8(y1[h]);
        /* slice 0: bytes 0-7 of each, slice 1: bytes 8-15 */
        acc = vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip1q_s64(a0, a1)),
                         vreinterpretq_s8_s64(vzip1q_s64(b0, b1)));
        acc = vmmlaq_s32(acc, vreinterpretq_s8_s64(vzip2q_s64(a0, a1)),
                         vreinterpretq_s8_s64(vzip2q_s64(b0, b1)));
    }
    return acc;
}

typedef void (*rb_i8mm_codes_fn)(const void *row, int64_t b, int8x16_t q[2]);

static inline void rb_i8mm_tile_x_0(int64_t n_cols, const void *w, size_t w_row_bytes,
                                    int n_rows, const void *act, size_t act_row_bytes, int n_tok,
                                    float *y, int64_t y_stride, rb_i8mm_codes_fn codes,
                                    size_t w_block_bytes)
{
    const int64_t nb = n_cols / RB_QK8_0;
    for (int r = 0; r < n_rows; r += 2) {
        const int r1 = r + 1 < n_rows ? r + 1 : r;
        const char *w0 = (const char *)w + r * w_row_bytes, *w1 = (const char *)w + r1 * w_row_bytes;
        for (int t = 0; t < n_tok; t += 2) {
            const int t1 = t + 1 < n_tok ? t + 1 : t;
            const rb_block_q8_0 *a0 = (const rb_block_q8_0 *)((const char *)act + t * act_row_bytes);
            const rb_block_q8_0 *a1 = (const rb_block_q8_0 *)((const char *)act + t1 * act_row_bytes);
            /* lanes: (r, t), (r, t1), (r1, t), (r1, t1) */
            float32x4_t sum = vdupq_n_f32(0.0f);
            for (int64_t b = 0; b < nb; b++) {
                int8x16_t x0[2], x1[2], y0[2], y1[2];
                codes(w0, b, x0);
                codes(w1, b, x1);
                rb_i8mm_codes_q8_0(a0, b, y0);
                rb_i8mm_codes_q8_0(a1, b, y1);
                const int32x4_t sumi = rb_i8mm_block(x0, x1, y0, y1);
                rb_f16 dw0, dw1;
                memcpy(&dw0, w0 + b * w_block_bytes, sizeof dw0); /* d leads both blocks */
                memcpy(&dw1, w1 + b * w_block_bytes, sizeof dw1);
                const float fw0 = rb_fp16_to_fp32(dw0), fw1 = rb_fp16_to_fp32(dw1);
                const float fa0 = rb_fp16_to_fp32(a0[b].d), fa1 = rb_fp16_to_fp32(a1[b].d);
                const float dd[4] = {fw0 * fa0, fw0 * fa1, fw1 * fa0, fw1 * fa1};
                /* sumf += (float)sumi * d, unfused (-ffp-contract=off) */
                sum = vaddq_f32(sum, vmulq_f32(vcvtq_f32_s32(sumi), vld1q_f32(dd)));
            }
            y[t * y_stride + r] = vgetq_lane_f32(sum, 0);
            if (t1 != t)
                y[t1 * y_stride + r] = vgetq_lane_f32(sum, 1);
            if (r1 != r) {
                y[t * y_stride + r1] = vgetq_lane_f32(sum, 2);
                if (t1 != t)
                    y[t1 * y_stride + r1] = vgetq_lane_f32(sum, 3);
            }
        }
    }
}

static void rb_tile_q4_0_i8mm(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,
                              const void *act, size_t act_row_bytes, int n_tok, float *y,
                              int64_t y_stride)
{
    if (n_tok == 1) {
        rb_tile_q4_0_neon(n_cols, w, w_row_bytes, n_rows, act, act_row_bytes, n_tok, y, y_stride);
        return;
    }
    rb_i8mm_tile_x_0(n_cols, w, w_row_bytes, n_rows, act, act_row_bytes, n_tok, y, y_stride,
                     rb_i8mm_codes_q4_0, sizeof(rb_block_q4_0));
}

static void rb_tile_q8_0_i8mm(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,
                              const void *act, size_t act_row_bytes, int n_tok, float *y,
                              int64_t y_stride)
{
    if (n_tok == 1) {
        rb_tile_q8_0_neon(n_cols, w, w_row_bytes, n_rows, act, act_row_bytes, n_tok, y, y_stride);
        return;
    }
    rb_i8mm_tile_x_0(n_cols, w, w_row_bytes, n_rows, act, act_row_bytes, n_tok, y, y_stride,
                     rb_i8mm_codes_q8_0, sizeof(rb_block_q8_0));
}
#endif

const rb_matmul_isa RB_NEON_TABLE = {
    .name = RB_NEON_NAME,
    .act = {
        [RB_TYPE_F32] = rb_quantize_act_f32_ref,
        [RB_TYPE_F16] = rb_quantize_act_f16_neon,
        [RB_TYPE_BF16] = rb_quantize_row_bf16_ref,
        [RB_TYPE_Q8_0] = rb_quantize_act_q8_0_neon,
        [RB_TYPE_Q8_K] = rb_quantize_act_q8_K_neon,
        [RB_TYPE_Q8_1] = rb_quantize_act_q8_1_ref,
    },
    .tile = {
        [RB_TYPE_F32] = rb_tile_f32_neon,
        [RB_TYPE_F16] = rb_tile_f16_neon,
        [RB_TYPE_BF16] = rb_tile_bf16_neon,
#if defined(RB_NEON_I8MM_BUILD)
        [RB_TYPE_Q4_0] = rb_tile_q4_0_i8mm,
        [RB_TYPE_Q8_0] = rb_tile_q8_0_i8mm,
#else
        [RB_TYPE_Q4_0] = rb_tile_q4_0_neon,
        [RB_TYPE_Q8_0] = rb_tile_q8_0_neon,
#endif
        [RB_TYPE_Q5_0] = rb_tile_q5_0_neon,
        [RB_TYPE_Q4_K] = rb_tile_q4_K_neon,
        [RB_TYPE_Q6_K] = rb_tile_q6_K_neon,
        [RB_TYPE_Q5_K] = rb_tile_q5_K_neon,
        [RB_TYPE_Q4_1] = rb_tile_q4_1_neon,
        [RB_TYPE_Q5_1] = rb_tile_q5_1_neon,
    },
    .decode_rows = 1,
#if defined(RB_NEON_I8MM_BUILD)
    /* 4 x 4: two row pairs x two token pairs, each weight block unpacked
     * once for 4 tokens (the other types' tiles loop over vec_dots) */
    .prefill_rows = 4,
    .prefill_toks = 4,
#else
    .prefill_rows = 1,
    .prefill_toks = 1,
#endif
};

#else
typedef int rb_matmul_neon_unused; /* ISO C: a translation unit is not empty */
#endif
