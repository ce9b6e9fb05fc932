/*
 * quant.c - the type traits table, fp16/bf16 conversions and the scalar
 * reference quantizers and dequantizers.
 *
 * What it does: maps every GGML type id that rebound knows to its block
 * geometry (one static const table indexed by id; holes are NULL), converts
 * between f32 and f16/bf16 in portable C, and turns rows of floats into the
 * GGUF block formats of quant.h and back. The block layouts are ggml's, byte
 * for byte: a file written here loads in llama.cpp and a llama.cpp file
 * dequantizes here to the same floats (tests/test_quant.c checks both the
 * hand-computed layout and real llama-quantize output).
 *
 * What it does not do: no SIMD, no dot products, no threading, no
 * allocation (every function works in caller memory, keeps no state and is
 * safe to call from any thread). Types without a function here (Q2_K,
 * Q3_K, Q8_K, Q8_1, IQ*, the integer types) have NULL pointers in the table.
 *
 * Contracts shared by every row function:
 *   - n is a multiple of the type's block size (asserted); src holds
 *     n / block_elems blocks, dst room for as many.
 *   - The quantizers are deterministic: scalar float code in a fixed order,
 *     no FMA contraction (the clang pragma below; gcc in ISO C mode does not
 *     contract), so one input gives the same bytes on every machine.
 *   - Non-finite inputs give unspecified (but defined-behaviour) codes: every
 *     float-to-int conversion is clamped before the cast.
 *
 * Choices and why:
 *   - fp16: bit manipulation with round-to-nearest-even, subnormals handled
 *     exactly, NaN made quiet (as x86 F16C and ARM conversions do). Every
 *     one of the 65536 halves survives f16 -> f32 -> f16 unchanged except
 *     that a signalling NaN comes back quiet.
 *   - bf16: ggml's rule: NaN -> truncate and set the quiet bit; anything
 *     else round-to-nearest-even on the top 16 bits (overflow gives Inf).
 *   - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: the same arithmetic as ggml's
 *     quantize_row_*_ref (Q4_0: d = signed max-abs value / -8, codes by
 *     truncating x/d + 8.5; Q8_0: d = max|x| / 127, codes by roundf), so
 *     the bytes match llama.cpp's for the same input.
 *   - Q4_K, Q5_K, Q6_K: our own search (not ggml's code, same layout). Per
 *     sub-block a small grid of candidate step counts, each followed by a
 *     least-squares refit of scale (and min) for the codes it chose; then the
 *     per-sub-block scales are quantized against one fp16 super-scale and
 *     each 6- or 8-bit scale code is nudged by +-1 if that lowers the
 *     sub-block's squared error after requantization. Unweighted squared
 *     error: the objective is the RMS error of the weights themselves.
 *     Measured (tests/test_quant.c, gcc 12 -O2): round-trip RMS on 4096
 *     N(0,1) values Q4_K 0.0705, Q6_K 0.0172 (Q4_0 0.0853, Q8_0 0.0053);
 *     on the parity model's N(0, 0.08) weights, mean |error| against the
 *     F16 file Q4_K 0.00467 vs llama-quantize's 0.00472, Q6_K 0.00110 vs
 *     0.00116. Cost: 11 candidate fits per sub-block (22 for Q6_K, both
 *     signs) plus 9 (Q4_K) or 3
 *     (Q6_K) requantizations; quantizing is a one-time, offline step.
 */
#include "quant.h"

#include <assert.h>
#include <float.h>
#include <math.h>
#include <string.h>

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- traits table -------------------------------------------------------- */

#define RB_TRAITS(nm, be, bb, isq, qf, df) \
    { .name = (nm), .block_elems = (be), .block_bytes = (bb), \
      .is_quantized = (isq), .quantize_row = (qf), .dequantize_row = (df) }

static const rb_type_traits rb_traits[RB_TYPE_COUNT] = {
    [RB_TYPE_F32] = RB_TRAITS("F32", 1, 4, 0, rb_quantize_row_f32_ref,
                              rb_dequantize_row_f32),
    [RB_TYPE_F16] = RB_TRAITS("F16", 1, 2, 0, rb_quantize_row_f16_ref,
                              rb_dequantize_row_f16),
    [RB_TYPE_Q4_0] = RB_TRAITS("Q4_0", RB_QK4_0, sizeof(rb_block_q4_0), 1,
                               rb_quantize_row_q4_0_ref, rb_dequantize_row_q4_0),
    [RB_TYPE_Q4_1] = RB_TRAITS("Q4_1", RB_QK4_1, sizeof(rb_block_q4_1), 1,
                               rb_quantize_row_q4_1_ref, rb_dequantize_row_q4_1),
    [RB_TYPE_Q5_0] = RB_TRAITS("Q5_0", RB_QK5_0, sizeof(rb_block_q5_0), 1,
                               rb_quantize_row_q5_0_ref, rb_dequantize_row_q5_0),
    [RB_TYPE_Q5_1] = RB_TRAITS("Q5_1", RB_QK5_1, sizeof(rb_block_q5_1), 1,
                               rb_quantize_row_q5_1_ref, rb_dequantize_row_q5_1),
    [RB_TYPE_Q8_0] = RB_TRAITS("Q8_0", RB_QK8_0, sizeof(rb_block_q8_0), 1,
                               rb_quantize_row_q8_0_ref, rb_dequantize_row_q8_0),
    [RB_TYPE_Q8_1] = RB_TRAITS("Q8_1", RB_QK8_0, sizeof(rb_block_q8_1), 1,
                               NULL, NULL),
    [RB_TYPE_Q2_K] = RB_TRAITS("Q2_K", RB_QK_K, sizeof(rb_block_q2_K), 1,
                               NULL, NULL),
    [RB_TYPE_Q3_K] = RB_TRAITS("Q3_K", RB_QK_K, sizeof(rb_block_q3_K), 1,
                               NULL, NULL),
    [RB_TYPE_Q4_K] = RB_TRAITS("Q4_K", RB_QK_K, sizeof(rb_block_q4_K), 1,
                               rb_quantize_row_q4_K_ref, rb_dequantize_row_q4_K),
    [RB_TYPE_Q5_K] = RB_TRAITS("Q5_K", RB_QK_K, sizeof(rb_block_q5_K), 1,
                               rb_quantize_row_q5_K_ref, rb_dequantize_row_q5_K),
    [RB_TYPE_Q6_K] = RB_TRAITS("Q6_K", RB_QK_K, sizeof(rb_block_q6_K), 1,
                               rb_quantize_row_q6_K_ref, rb_dequantize_row_q6_K),
    [RB_TYPE_Q8_K] = RB_TRAITS("Q8_K", RB_QK_K, sizeof(rb_block_q8_K), 1,
                               NULL, NULL),
    /* IQ4_NL: [d:f16][qs:16] over a 16-entry non-linear codebook. */
    [RB_TYPE_IQ4_NL] = RB_TRAITS("IQ4_NL", 32, 18, 1, NULL, NULL),
    /* IQ4_XS: [d:f16][scales_h:u16][scales_l:4][qs:128]. */
    [RB_TYPE_IQ4_XS] = RB_TRAITS("IQ4_XS", RB_QK_K, 136, 1, NULL, NULL),
    [RB_TYPE_I8] = RB_TRAITS("I8", 1, 1, 0, NULL, NULL),
    [RB_TYPE_I16] = RB_TRAITS("I16", 1, 2, 0, NULL, NULL),
    [RB_TYPE_I32] = RB_TRAITS("I32", 1, 4, 0, NULL, NULL),
    [RB_TYPE_I64] = RB_TRAITS("I64", 1, 8, 0, NULL, NULL),
    [RB_TYPE_F64] = RB_TRAITS("F64", 1, 8, 0, NULL, NULL),
    [RB_TYPE_BF16] = RB_TRAITS("BF16", 1, 2, 0, rb_quantize_row_bf16_ref,
                               rb_dequantize_row_bf16),
};

const rb_type_traits *rb_type_get_traits(uint32_t type)
{
    if (type >= RB_TYPE_COUNT || rb_traits[type].name == NULL)
        return NULL;
    return &rb_traits[type];
}

const char *rb_type_name(uint32_t type)
{
    const rb_type_traits *t = rb_type_get_traits(type);
    return t ? t->name : "unknown";
}

/* ASCII-only case fold: type names are ASCII and the locale must not matter. */
static int rb_ascii_lower(int c)
{
    return (c >= 'A' && c <= 'Z') ? c - 'A' + 'a' : c;
}

static int rb_ascii_ieq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        if (rb_ascii_lower((unsigned char)*a) != rb_ascii_lower((unsigned char)*b))
            return 0;
    }
    return *a == *b;
}

int rb_type_from_name(const char *name)
{
    if (name == NULL)
        return -1;
    for (uint32_t i = 0; i < RB_TYPE_COUNT; i++) {
        if (rb_traits[i].name && rb_ascii_ieq(rb_traits[i].name, name))
            return (int)i;
    }
    return -1;
}

uint64_t rb_type_row_bytes(uint32_t type, uint64_t n)
{
    const rb_type_traits *t = rb_type_get_traits(type);
    if (t == NULL || n % t->block_elems != 0)
        return 0;
    uint64_t n_blocks = n / t->block_elems;
    if (n_blocks > UINT64_MAX / t->block_bytes)
        return 0;
    return n_blocks * t->block_bytes;
}

/* ---- fp16 / bf16 --------------------------------------------------------- */

static uint32_t rb_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float rb_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/*
 * f32 -> f16, round to nearest even. Ranges of |x| (as f32 bits):
 *   NaN            -> quiet NaN, top payload bits kept
 *   >= 65520       -> Inf (65520 is the tie between 65504 and 2^16; even wins)
 *   >= 2^-14       -> normal: rebias the exponent, round off 13 mantissa bits
 *                     (a carry out of the mantissa bumps the exponent, which is
 *                     exactly the right result, up to Inf)
 *   <  2^-14       -> subnormal: round(|x| * 2^24) with ties to even; values
 *                     up to 2^-25 (a tie with 0) become zero
 */
rb_f16 rb_fp32_to_fp16_soft(float f)
{
    uint32_t u = rb_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;

    if (a > 0x7f800000u) /* NaN */
        return (rb_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* >= 65520 or Inf */
        return (rb_f16)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* normal half */
        uint32_t h = (a >> 13) - (112u << 10);
        uint32_t rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
            h++;
        return (rb_f16)(sign | h);
    }
    if (a <= 0x33000000u) /* <= 2^-25: rounds to zero */
        return sign;
    uint32_t e = a >> 23;                       /* 102..112 here */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;   /* implicit one */
    uint32_t shift = 126u - e;                  /* 14..24 */
    uint32_t h = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (h & 1u)))
        h++; /* may carry into 0x400: the smallest normal, as it should */
    return (rb_f16)(sign | h);
}

float rb_fp16_to_fp32_soft(rb_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;
    if (e == 0x1f) /* Inf or NaN: payload moves up unchanged */
        return rb_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e != 0)
        return rb_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    /* zero or subnormal: m * 2^-24 is exact in f32 */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
}

rb_bf16 rb_fp32_to_bf16(float f)
{
    uint32_t u = rb_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (rb_bf16)((u >> 16) | 0x40u); /* NaN: keep it quiet */
    /* round to nearest even; a carry into the exponent is correct (to Inf) */
    return (rb_bf16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float rb_bf16_to_fp32(rb_bf16 h)
{
    return rb_bits_f32((uint32_t)h << 16);
}

/* ---- helpers ------------------------------------------------------------- */

/* (int)v truncated toward zero and clamped to [lo, hi]; NaN gives lo. */
static int rb_trunc_clamp(float v, int lo, int hi)
{
    if (!(v >= (float)lo))
        return lo;
    if (v >= (float)hi)
        return hi;
    return (int)v;
}

/* Nearest integer (ties away from zero, like roundf) clamped to [lo, hi]. */
static inline int rb_round_clamp(float v, int lo, int hi)
{
    /* roundf without the libm call and without branches (this sits in the
     * quantizers' inner loops, where the rounding direction is random and
     * branches mispredict): clamping first makes the cast defined (NaN goes
     * to lo); truncation and the fraction are both exact in this range, so
     * ties still round away from zero, bit-identical to roundf */
    float c = v > (float)lo ? v : (float)lo;
    c = c < (float)hi ? c : (float)hi;
    int i = (int)c;
    float f = c - (float)i;
    return i + (f >= 0.5f) - (f <= -0.5f);
}

static uint32_t rb_load_u32le(const uint8_t b[4])
{
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) |
           ((uint32_t)b[3] << 24);
}

static void rb_store_u32le(uint8_t b[4], uint32_t v)
{
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
    b[2] = (uint8_t)(v >> 16);
    b[3] = (uint8_t)(v >> 24);
}

/* ---- plain types --------------------------------------------------------- */

void rb_quantize_row_f32_ref(const float *src, void *dst, int64_t n)
{
    assert(n >= 0);
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void rb_dequantize_row_f32(const void *src, float *dst, int64_t n)
{
    assert(n >= 0);
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void rb_quantize_row_f16_ref(const float *src, void *dst, int64_t n)
{
    rb_f16 *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = rb_fp32_to_fp16(src[i]);
}

void rb_dequantize_row_f16(const void *src, float *dst, int64_t n)
{
    const rb_f16 *x = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = rb_fp16_to_fp32(x[i]);
}

void rb_quantize_row_bf16_ref(const float *src, void *dst, int64_t n)
{
    rb_bf16 *y = dst;
    for (int64_t i = 0; i < n; i++)
        y[i] = rb_fp32_to_bf16(src[i]);
}

void rb_dequantize_row_bf16(const void *src, float *dst, int64_t n)
{
    const rb_bf16 *x = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = rb_bf16_to_fp32(x[i]);
}

/* ---- 32-element blocks ----------------------------------------------------
 *
 * Nibble order for Q4_x and Q5_x: byte j holds element j in its low nibble
 * and element j + 16 in its high nibble. Q5_x keeps bit 4 of element i in
 * bit i of the little-endian 32-bit qh.
 */

/* The value with the largest magnitude, sign kept (first one wins ties). */
static float rb_signed_absmax(const float *x, int n)
{
    float amax = 0.0f, vmax = 0.0f;
    for (int i = 0; i < n; i++) {
        if (amax < fabsf(x[i])) {
            amax = fabsf(x[i]);
            vmax = x[i];
        }
    }
    return vmax;
}

static void rb_minmax(const float *x, int n, float *mn, float *mx)
{
    float lo = FLT_MAX, hi = -FLT_MAX;
    for (int i = 0; i < n; i++) {
        if (x[i] < lo)
            lo = x[i];
        if (x[i] > hi)
            hi = x[i];
    }
    *mn = lo;
    *mx = hi;
}

void rb_quantize_row_q4_0_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK4_0 == 0);
    rb_block_q4_0 *y = dst;
    for (int64_t b = 0; b < n / RB_QK4_0; b++) {
        const float *x = src + b * RB_QK4_0;
        const float d = rb_signed_absmax(x, RB_QK4_0) / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = rb_fp32_to_fp16(d);
        for (int j = 0; j < RB_QK4_0 / 2; j++) {
            int q0 = rb_trunc_clamp(x[j] * id + 8.5f, 0, 15);
            int q1 = rb_trunc_clamp(x[j + RB_QK4_0 / 2] * id + 8.5f, 0, 15);
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void rb_dequantize_row_q4_0(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK4_0 == 0);
    const rb_block_q4_0 *x = src;
    for (int64_t b = 0; b < n / RB_QK4_0; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        float *y = dst + b * RB_QK4_0;
        for (int j = 0; j < RB_QK4_0 / 2; j++) {
            y[j] = d * (float)((x[b].qs[j] & 0x0f) - 8);
            y[j + RB_QK4_0 / 2] = d * (float)((x[b].qs[j] >> 4) - 8);
        }
    }
}

void rb_quantize_row_q4_1_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK4_1 == 0);
    rb_block_q4_1 *y = dst;
    for (int64_t b = 0; b < n / RB_QK4_1; b++) {
        const float *x = src + b * RB_QK4_1;
        float mn, mx;
        rb_minmax(x, RB_QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = rb_fp32_to_fp16(d);
        y[b].m = rb_fp32_to_fp16(mn);
        for (int j = 0; j < RB_QK4_1 / 2; j++) {
            int q0 = rb_trunc_clamp((x[j] - mn) * id + 0.5f, 0, 15);
            int q1 = rb_trunc_clamp((x[j + RB_QK4_1 / 2] - mn) * id + 0.5f, 0, 15);
            y[b].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

void rb_dequantize_row_q4_1(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK4_1 == 0);
    const rb_block_q4_1 *x = src;
    for (int64_t b = 0; b < n / RB_QK4_1; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        const float m = rb_fp16_to_fp32(x[b].m);
        float *y = dst + b * RB_QK4_1;
        for (int j = 0; j < RB_QK4_1 / 2; j++) {
            y[j] = d * (float)(x[b].qs[j] & 0x0f) + m;
            y[j + RB_QK4_1 / 2] = d * (float)(x[b].qs[j] >> 4) + m;
        }
    }
}

void rb_quantize_row_q5_0_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK5_0 == 0);
    rb_block_q5_0 *y = dst;
    for (int64_t b = 0; b < n / RB_QK5_0; b++) {
        const float *x = src + b * RB_QK5_0;
        const float d = rb_signed_absmax(x, RB_QK5_0) / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[b].d = rb_fp32_to_fp16(d);
        for (int j = 0; j < RB_QK5_0 / 2; j++) {
            int q0 = rb_trunc_clamp(x[j] * id + 16.5f, 0, 31);
            int q1 = rb_trunc_clamp(x[j + RB_QK5_0 / 2] * id + 16.5f, 0, 31);
            y[b].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + RB_QK5_0 / 2);
        }
        rb_store_u32le(y[b].qh, qh);
    }
}

void rb_dequantize_row_q5_0(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK5_0 == 0);
    const rb_block_q5_0 *x = src;
    for (int64_t b = 0; b < n / RB_QK5_0; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        const uint32_t qh = rb_load_u32le(x[b].qh);
        float *y = dst + b * RB_QK5_0;
        for (int j = 0; j < RB_QK5_0 / 2; j++) {
            int q0 = (x[b].qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            int q1 = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * (float)(q0 - 16);
            y[j + RB_QK5_0 / 2] = d * (float)(q1 - 16);
        }
    }
}

void rb_quantize_row_q5_1_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK5_1 == 0);
    rb_block_q5_1 *y = dst;
    for (int64_t b = 0; b < n / RB_QK5_1; b++) {
        const float *x = src + b * RB_QK5_1;
        float mn, mx;
        rb_minmax(x, RB_QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[b].d = rb_fp32_to_fp16(d);
        y[b].m = rb_fp32_to_fp16(mn);
        for (int j = 0; j < RB_QK5_1 / 2; j++) {
            int q0 = rb_trunc_clamp((x[j] - mn) * id + 0.5f, 0, 31);
            int q1 = rb_trunc_clamp((x[j + RB_QK5_1 / 2] - mn) * id + 0.5f, 0, 31);
            y[b].qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + RB_QK5_1 / 2);
        }
        rb_store_u32le(y[b].qh, qh);
    }
}

void rb_dequantize_row_q5_1(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK5_1 == 0);
    const rb_block_q5_1 *x = src;
    for (int64_t b = 0; b < n / RB_QK5_1; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        const float m = rb_fp16_to_fp32(x[b].m);
        const uint32_t qh = rb_load_u32le(x[b].qh);
        float *y = dst + b * RB_QK5_1;
        for (int j = 0; j < RB_QK5_1 / 2; j++) {
            int q0 = (x[b].qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            int q1 = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * (float)q0 + m;
            y[j + RB_QK5_1 / 2] = d * (float)q1 + m;
        }
    }
}

void rb_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK8_0 == 0);
    rb_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        const float *x = src + b * RB_QK8_0;
        float amax = 0.0f;
        for (int j = 0; j < RB_QK8_0; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = rb_fp32_to_fp16(d);
        for (int j = 0; j < RB_QK8_0; j++)
            y[b].qs[j] = (int8_t)rb_round_clamp(x[j] * id, -127, 127);
    }
}

void rb_dequantize_row_q8_0(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK8_0 == 0);
    const rb_block_q8_0 *x = src;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        for (int j = 0; j < RB_QK8_0; j++)
            dst[b * RB_QK8_0 + j] = d * (float)x[b].qs[j];
    }
}

/* ---- K-quants: scale/min packing -----------------------------------------
 *
 * Q4_K and Q5_K keep 8 six-bit scales sc[j] and mins m[j] in 12 bytes:
 *
 *   byte  0..3 : sc[0..3]  low 6 bits | (sc[4..7] >> 4) << 6
 *   byte  4..7 : m[0..3]   low 6 bits | (m[4..7]  >> 4) << 6
 *   byte 8..11 : (sc[4..7] & 0xF) | (m[4..7] & 0xF) << 4
 *
 * Sub-block j covers elements 32j..32j+31 of the super-block. The 4-bit
 * codes of sub-blocks 2g and 2g+1 share qs[32g..32g+31]: low nibbles hold
 * sub-block 2g, high nibbles 2g+1. Q5_K adds bit 4 of sub-block 2g's codes
 * in bit 2g of qh[l], and of sub-block 2g+1's in bit 2g+1.
 */

static void rb_get_scale_min_k4(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static void rb_set_scale_min_k4(uint8_t q[RB_K_SCALE_SIZE], const int sc[8],
                                const int m[8])
{
    for (int j = 0; j < 4; j++) {
        q[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        q[j + 4] = (uint8_t)((m[j] & 63) | ((m[j + 4] >> 4) << 6));
        q[j + 8] = (uint8_t)((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
    }
}

void rb_dequantize_row_q4_K(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK_K == 0);
    const rb_block_q4_K *x = src;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        const float dmin = rb_fp16_to_fp32(x[b].dmin);
        float *y = dst + b * RB_QK_K;
        for (int g = 0; g < 4; g++) {
            const uint8_t *q = x[b].qs + 32 * g;
            int sc0, m0, sc1, m1;
            rb_get_scale_min_k4(2 * g, x[b].scales, &sc0, &m0);
            rb_get_scale_min_k4(2 * g + 1, x[b].scales, &sc1, &m1);
            const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                y[64 * g + l] = d0 * (float)(q[l] & 0x0f) - mm0;
                y[64 * g + 32 + l] = d1 * (float)(q[l] >> 4) - mm1;
            }
        }
    }
}

void rb_dequantize_row_q5_K(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK_K == 0);
    const rb_block_q5_K *x = src;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        const float dmin = rb_fp16_to_fp32(x[b].dmin);
        float *y = dst + b * RB_QK_K;
        for (int g = 0; g < 4; g++) {
            const uint8_t *q = x[b].qs + 32 * g;
            int sc0, m0, sc1, m1;
            rb_get_scale_min_k4(2 * g, x[b].scales, &sc0, &m0);
            rb_get_scale_min_k4(2 * g + 1, x[b].scales, &sc1, &m1);
            const float d0 = d * (float)sc0, mm0 = dmin * (float)m0;
            const float d1 = d * (float)sc1, mm1 = dmin * (float)m1;
            for (int l = 0; l < 32; l++) {
                int h0 = (x[b].qh[l] >> (2 * g)) & 1;
                int h1 = (x[b].qh[l] >> (2 * g + 1)) & 1;
                y[64 * g + l] = d0 * (float)((q[l] & 0x0f) | (h0 << 4)) - mm0;
                y[64 * g + 32 + l] = d1 * (float)((q[l] >> 4) | (h1 << 4)) - mm1;
            }
        }
    }
}

/*
 * Fits x[i] ~= s * q[i] - m over n values, q[i] in [0, nmax], s >= 0, m >= 0
 * (the Q4_K sub-block model). The plain min/max fit puts the extremes on
 * codes 0 and nmax; a slightly larger or smaller step count often serves the
 * bulk of a bell-shaped block better, so try step counts nmax +- 0.5 in tenths
 * and, for the codes each one chooses, refit (s, -m) by least squares (m
 * pinned to 0 when the fit wants it negative). Keeps the lowest squared
 * error; writes m and returns s.
 */
#define RB_FIT_GRID 5

static float rb_fit_scale_min(const float *x, int n, int nmax, float *m_out)
{
    float lo, hi;
    rb_minmax(x, n, &lo, &hi);
    if (lo > 0.0f)
        lo = 0.0f; /* m >= 0: a block of positives is fitted from zero */
    if (!(hi > lo)) {
        *m_out = -lo;
        return 0.0f;
    }
    float best_s = (hi - lo) / (float)nmax, best_m = -lo;
    double best_err = -1.0, sx = 0, sxx = 0;
    for (int i = 0; i < n; i++) {
        sx += x[i];
        sxx += (double)x[i] * x[i];
    }
    for (int k = -RB_FIT_GRID; k <= RB_FIT_GRID; k++) {
        const float iscale = ((float)nmax + 0.1f * (float)k) / (hi - lo);
        double sq = 0, sqq = 0, sqx = 0;
        for (int i = 0; i < n; i++) {
            int q = rb_round_clamp((x[i] - lo) * iscale, 0, nmax);
            sq += q;
            sqq += (double)q * q;
            sqx += (double)q * x[i];
        }
        double det = n * sqq - sq * sq;
        double s, c; /* x ~= s * q + c, c = -m */
        if (det > 0) {
            s = (n * sqx - sq * sx) / det;
            c = (sx - s * sq) / n;
        } else {
            s = 0;
            c = sx / n;
        }
        if (c > 0) {
            c = 0;
            s = sqq > 0 ? sqx / sqq : 0;
        }
        if (s < 0)
            s = 0;
        /* sum (s q + c - x)^2 expanded: no second pass over the block */
        double err = s * s * sqq + 2 * s * c * sq + n * c * c - 2 * s * sqx - 2 * c * sx + sxx;
        if (best_err < 0 || err < best_err) {
            best_err = err;
            best_s = (float)s;
            best_m = (float)-c;
        }
    }
    *m_out = best_m;
    return best_s;
}

/* Codes for x ~= ds * q - dm, q in [0, nmax]; returns the squared error. */
static double rb_quant_affine(const float *x, int n, int nmax, float ds,
                              float dm, uint8_t *q)
{
    double err = 0;
    const float id = ds > 0.0f ? 1.0f / ds : 0.0f;
    for (int i = 0; i < n; i++) {
        int v = rb_round_clamp((x[i] + dm) * id, 0, nmax);
        double e = (double)(ds * (float)v - dm) - x[i];
        err += e * e;
        q[i] = (uint8_t)v;
    }
    return err;
}

/* One Q4_K / Q5_K super-block (nmax 15 / 31): the fp16 super-scales, the
 * packed 6-bit scales and mins, and the codes in element order. */
static void rb_quantize_k_affine(const float *x, int nmax, rb_f16 *d_out, rb_f16 *dmin_out,
                                 uint8_t scales[RB_K_SCALE_SIZE], uint8_t codes[RB_QK_K])
{
    float s[8], m[8], max_s = 0.0f, max_m = 0.0f;
    for (int j = 0; j < 8; j++) {
        s[j] = rb_fit_scale_min(x + 32 * j, 32, nmax, &m[j]);
        max_s = fmaxf(max_s, s[j]);
        max_m = fmaxf(max_m, m[j]);
    }
    /* 6-bit codes against fp16 super-scales; use the rounded values */
    *d_out = rb_fp32_to_fp16(max_s / 63.0f);
    *dmin_out = rb_fp32_to_fp16(max_m / 63.0f);
    const float d = rb_fp16_to_fp32(*d_out);
    const float dmin = rb_fp16_to_fp32(*dmin_out);
    int sc[8], mc[8];
    for (int j = 0; j < 8; j++) {
        int ls = d > 0.0f ? rb_round_clamp(s[j] / d, 0, 63) : 0;
        int lm = dmin > 0.0f ? rb_round_clamp(m[j] / dmin, 0, 63) : 0;
        /* the code pair that is nearest is not always best after the
         * codes are requantized: try the +-1 neighbours */
        double best = -1.0;
        uint8_t trial[32];
        sc[j] = ls;
        mc[j] = lm;
        for (int a = ls - 1; a <= ls + 1; a++) {
            for (int c = lm - 1; c <= lm + 1; c++) {
                if (a < 0 || a > 63 || c < 0 || c > 63)
                    continue;
                double e = rb_quant_affine(x + 32 * j, 32, nmax, d * (float)a,
                                           dmin * (float)c, trial);
                if (best < 0 || e < best) {
                    best = e;
                    sc[j] = a;
                    mc[j] = c;
                    memcpy(codes + 32 * j, trial, 32);
                }
            }
        }
    }
    rb_set_scale_min_k4(scales, sc, mc);
}

void rb_quantize_row_q4_K_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK_K == 0);
    rb_block_q4_K *y = dst;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        uint8_t codes[RB_QK_K];
        rb_quantize_k_affine(src + b * RB_QK_K, 15, &y[b].d, &y[b].dmin, y[b].scales, codes);
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) {
                y[b].qs[32 * g + l] = (uint8_t)(codes[64 * g + l] |
                                                (codes[64 * g + 32 + l] << 4));
            }
        }
    }
}

/* Q4_K's search with 5-bit codes; bit 4 of sub-block j's codes goes to bit
 * j of qh[l] (the layout comment above rb_get_scale_min_k4). */
void rb_quantize_row_q5_K_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK_K == 0);
    rb_block_q5_K *y = dst;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        uint8_t codes[RB_QK_K];
        rb_quantize_k_affine(src + b * RB_QK_K, 31, &y[b].d, &y[b].dmin, y[b].scales, codes);
        memset(y[b].qh, 0, sizeof y[b].qh);
        for (int g = 0; g < 4; g++) {
            for (int l = 0; l < 32; l++) {
                const uint8_t c0 = codes[64 * g + l], c1 = codes[64 * g + 32 + l];
                y[b].qs[32 * g + l] = (uint8_t)((c0 & 0x0f) | ((c1 & 0x0f) << 4));
                y[b].qh[l] |= (uint8_t)(((c0 >> 4) << (2 * g)) | ((c1 >> 4) << (2 * g + 1)));
            }
        }
    }
}

/* ---- Q6_K ------------------------------------------------------------------
 *
 * 16 sub-blocks of 16 elements, signed 8-bit scale each, 6-bit codes stored
 * as q + 32. Each 128-element half h uses ql[64h..64h+63], qh[32h..32h+31].
 * For element i = 128h + 32k + l (k = 0..3, l = 0..31):
 *   low 4 bits : ql[64h + l + 32 * (k & 1)], low nibble for k < 2, high else
 *   high 2 bits: qh[32h + l] bits 2k, 2k+1
 *   scale      : scales[i / 16]
 */

void rb_dequantize_row_q6_K(const void *src, float *dst, int64_t n)
{
    assert(n % RB_QK_K == 0);
    const rb_block_q6_K *x = src;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        const float d = rb_fp16_to_fp32(x[b].d);
        float *y = dst + b * RB_QK_K;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[b].ql + 64 * h;
            const uint8_t *qh = x[b].qh + 32 * h;
            const int8_t *sc = x[b].scales + 8 * h;
            for (int l = 0; l < 32; l++) {
                int is = l / 16;
                int q0 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
                int q1 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
                int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[128 * h + l] = d * (float)sc[is + 0] * (float)q0;
                y[128 * h + l + 32] = d * (float)sc[is + 2] * (float)q1;
                y[128 * h + l + 64] = d * (float)sc[is + 4] * (float)q2;
                y[128 * h + l + 96] = d * (float)sc[is + 6] * (float)q3;
            }
        }
    }
}

/*
 * Fits x[i] ~= s * q[i], q[i] in [-32, 31], s of either sign (a negative s
 * lets the larger magnitude side use code -32). For step counts around the
 * range ends, choose codes and refit s = <x,q>/<q,q>; keep the best.
 */
static float rb_fit_scale_sym6(const float *x, int n)
{
    const float vmax = rb_signed_absmax(x, n);
    if (vmax == 0.0f)
        return 0.0f;
    float best_s = vmax / -32.0f;
    double best_score = -1.0; /* <x,q>^2 / <q,q>: error = <x,x> - score */
    for (int sign = -1; sign <= 1; sign += 2) {
        for (int k = -RB_FIT_GRID; k <= RB_FIT_GRID; k++) {
            const float t = (sign < 0 ? 32.0f : 31.0f) + 0.1f * (float)k;
            const float iscale = (float)sign * t / vmax;
            double sxq = 0, sqq = 0;
            for (int i = 0; i < n; i++) {
                int q = rb_round_clamp(x[i] * iscale, -32, 31);
                sxq += (double)x[i] * q;
                sqq += (double)q * q;
            }
            if (sqq <= 0)
                continue;
            double score = sxq * sxq / sqq;
            if (score > best_score) {
                best_score = score;
                best_s = (float)(sxq / sqq);
            }
        }
    }
    return best_s;
}

/* Codes (q + 32) for x ~= ds * q, q in [-32, 31]; returns squared error. */
static double rb_quant_sym6(const float *x, int n, float ds, uint8_t *q)
{
    double err = 0;
    const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
    for (int i = 0; i < n; i++) {
        int v = rb_round_clamp(x[i] * id, -32, 31);
        double e = (double)(ds * (float)v) - x[i];
        err += e * e;
        q[i] = (uint8_t)(v + 32);
    }
    return err;
}

void rb_quantize_row_q6_K_ref(const float *src, void *dst, int64_t n)
{
    assert(n % RB_QK_K == 0);
    rb_block_q6_K *y = dst;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        const float *x = src + b * RB_QK_K;
        float s[16], smax = 0.0f;
        for (int j = 0; j < 16; j++) {
            s[j] = rb_fit_scale_sym6(x + 16 * j, 16);
            if (fabsf(s[j]) > fabsf(smax))
                smax = s[j];
        }
        /* the largest scale takes code -128, the full int8 range */
        y[b].d = rb_fp32_to_fp16(smax / -128.0f);
        const float d = rb_fp16_to_fp32(y[b].d);
        uint8_t codes[RB_QK_K];
        for (int j = 0; j < 16; j++) {
            int ls = d != 0.0f ? rb_round_clamp(s[j] / d, -128, 127) : 0;
            double best = -1.0;
            uint8_t trial[16];
            y[b].scales[j] = (int8_t)ls;
            for (int a = ls - 1; a <= ls + 1; a++) {
                if (a < -128 || a > 127)
                    continue;
                double e = rb_quant_sym6(x + 16 * j, 16, d * (float)a, trial);
                if (best < 0 || e < best) {
                    best = e;
                    y[b].scales[j] = (int8_t)a;
                    memcpy(codes + 16 * j, trial, 16);
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            uint8_t *ql = y[b].ql + 64 * h;
            uint8_t *qh = y[b].qh + 32 * h;
            const uint8_t *c = codes + 128 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((c[l] & 0x0f) | ((c[l + 64] & 0x0f) << 4));
                ql[l + 32] = (uint8_t)((c[l + 32] & 0x0f) | ((c[l + 96] & 0x0f) << 4));
                qh[l] = (uint8_t)((c[l] >> 4) | ((c[l + 32] >> 4) << 2) |
                                  ((c[l + 64] >> 4) << 4) | ((c[l + 96] >> 4) << 6));
            }
        }
    }
}
