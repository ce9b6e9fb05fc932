/*
 * matmul_ref.c - the scalar reference kernels: activation converters and
 * weight-row dot products, written to follow ggml's scalar math so that
 * results agree with llama.cpp (ggml-quants.c quantize_row_q8_K_ref,
 * ggml-cpu/quants.c ggml_vec_dot_*_generic).
 *
 * What it does not do: no SIMD, no threading, no allocation. These are the
 * yardsticks the ISA variants are tested against and the fallback on
 * machines without AVX2 or NEON.
 *
 * Arithmetic, per type (w weight codes, a activation codes, per block):
 *   Q4_0 . Q8_0   sumi = sum (w - 8) * a           y += sumi * dw * da
 *   Q5_0 . Q8_0   sumi = sum (w5 - 16) * a         same
 *   Q8_0 . Q8_0   sumi = sum w * a                 same
 *   Q4_K . Q8_K   per 256, 8 int lanes (lane i: elements 4i..4i+3 of each
 *                 32-chunk j, times sc_j), acc_i = fma(da * d, lane_i, acc_i);
 *                 4 min lanes (lane k: mins 2k, 2k+1 times their bsum pairs),
 *                 accm_k = fma(-da * dmin, lane_k, accm_k);
 *                 y = hsum8(acc) + hsum4(accm)  (ggml's AVX2 order)
 *   Q6_K . Q8_K   the same 8 lanes of sc_s * (w6 - 32) * a, fma with da * d,
 *                 y = hsum8(acc)
 *   Q5_K . Q8_K   8 lanes of sc_j * w5 * a as Q6_K's (lane i: elements
 *                 4i..4i+3 of each 32-chunk j), acc_i = fma(da * d, lane_i,
 *                 acc_i); one scalar chain summs = fma(-da * dmin,
 *                 sum m_j * bsum_j, summs); y = hsum8(acc) + summs
 *   Q4_1 . Q8_1   8 lanes of w * a (lane i: elements 4i..4i+3), acc_i =
 *                 fma(dw * da, lane_i, acc_i); summs = fma(m, s, summs)
 *                 with s = da * sum(a) from the activation block;
 *                 y = hsum8(acc) + summs
 *   Q5_1 . Q8_1   the same with the 5-bit codes
 *   F32/F16/BF16  widen to f32, products accumulated in double (ggml_float)
 * Integer sums are exact (bounds: |Q6_K sumi| < 2^28), so every ISA gets the
 * same integers and differs only in the float accumulation order.
 */
#include <math.h>
#include <string.h>

#include "matmul_kernels.h"

void rb_quantize_act_f32_ref(const float *x, void *dst, int64_t n)
{
    memcpy(dst, x, (size_t)n * sizeof(float));
}

/* round half to even for |v| < 2^22: ggml's nearest_int */

void rb_quantize_act_q8_K_ref(const float *x, void *dst, int64_t n)
{
    rb_block_q8_K *y = dst;
    for (int64_t b = 0; b < n / RB_QK_K; b++, x += RB_QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < RB_QK_K; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < RB_QK_K; j++) {
            int v = rb_nearest_int(iscale * x[j]);
            y[b].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < RB_QK_K / 16; g++) {
            int sum = 0;
            for (int l = 0; l < 16; l++)
                sum += y[b].qs[16 * g + l];
            y[b].bsums[g] = (int16_t)sum;
        }
        y[b].d = 1.0f / iscale;
    }
}

float rb_vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q4_0 *x = w;
    const rb_block_q8_0 *y = a;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < RB_QK4_0 / 2; j++) {
            sumi += ((x[b].qs[j] & 0x0f) - 8) * y[b].qs[j];
            sumi += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + RB_QK4_0 / 2];
        }
        /* llama.cpp's order on AVX2 (the repacked q4_0_8x8 gemv): one fused
         * multiply-add per block */
        sumf = fmaf((float)sumi, rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d), sumf);
    }
    return sumf;
}

float rb_vec_dot_q5_0_q8_0_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q5_0 *x = w;
    const rb_block_q8_0 *y = a;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        uint32_t qh = (uint32_t)x[b].qh[0] | (uint32_t)x[b].qh[1] << 8 |
                      (uint32_t)x[b].qh[2] << 16 | (uint32_t)x[b].qh[3] << 24;
        int sumi = 0;
        for (int j = 0; j < RB_QK5_0 / 2; j++) {
            int q0 = (x[b].qs[j] & 0x0f) | (int)(((qh >> j) & 1u) << 4);
            int q1 = (x[b].qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1u) << 4);
            sumi += (q0 - 16) * y[b].qs[j] + (q1 - 16) * y[b].qs[j + RB_QK5_0 / 2];
        }
        sumf += (float)sumi * (rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d));
    }
    return sumf;
}

float rb_vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q8_0 *x = w;
    const rb_block_q8_0 *y = a;
    float sumf = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        int sumi = 0;
        for (int j = 0; j < RB_QK8_0; j++)
            sumi += x[b].qs[j] * y[b].qs[j];
        sumf += (float)sumi * (rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d));
    }
    return sumf;
}

/* ggml's AVX2 horizontal sums, as scalars: hsum_float_8 adds the high
 * half to the low half, then lanes 0+2 and 1+3, then those two. */
static float rb_hsum4_ref(const float v[4])
{
    const float a0 = v[0] + v[2], a1 = v[1] + v[3];
    return a0 + a1;
}

static float rb_hsum8_ref(const float v[8])
{
    const float h[4] = {v[0] + v[4], v[1] + v[5], v[2] + v[6], v[3] + v[7]};
    return rb_hsum4_ref(h);
}

/* The K-quant dots in llama.cpp's AVX2 order:
 *   Q4_K (repacked q4_K_8x8 gemv, matrices with a multiple of 8 rows): per
 *     super-block the exact integers sum(scale * q * a) and sum(min * bsum)
 *     are each fused-multiply-added into one float chain (d * da, dmin *
 *     da); the result is the first chain minus the second.
 *   Q6_K (ggml_vec_dot_q6_K_q8_K): 8 int32 lanes, lane i holding elements
 *     4i..4i+3 of each 32-element chunk (times the sub-block scale) with the
 *     unsigned codes q + 32, minus 32 * scale * bsum of sub-blocks 2i and
 *     2i+1; per super-block each lane is converted to float and
 *     fused-multiply-added with d = da * dw into a float lane accumulator;
 *     the 8 lanes are reduced at the end by hsum_float_8. */
float rb_vec_dot_q4_K_q8_K_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q4_K *x = w;
    const rb_block_q8_K *y = a;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        uint8_t sc[8], m[8];
        rb_k4_scales_mins(x[b].scales, sc, m);
        int32_t isum = 0, imin = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = x[b].qs + 32 * (j / 2);
            const int8_t *yq = y[b].qs + 32 * j;
            const int shift = (j & 1) ? 4 : 0;
            int32_t s = 0;
            for (int l = 0; l < 32; l++)
                s += ((q[l] >> shift) & 0x0f) * yq[l];
            isum += sc[j] * s;
            imin += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        }
        acc = fmaf((float)isum, rb_fp16_to_fp32(x[b].d) * y[b].d, acc);
        accm = fmaf((float)imin, rb_fp16_to_fp32(x[b].dmin) * y[b].d, accm);
    }
    return acc - accm;
}

float rb_vec_dot_q6_K_q8_K_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q6_K *x = w;
    const rb_block_q8_K *y = a;
    float acc[8] = {0};
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        int32_t lane[8] = {0};
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[b].ql + 64 * h;
            const uint8_t *qh = x[b].qh + 32 * h;
            const int8_t *sc = x[b].scales + 8 * h;
            const int8_t *yq = y[b].qs + 128 * h;
            for (int k = 0; k < 4; k++) {
                for (int l = 0; l < 32; l++) {
                    int lo = (k & 2) ? (ql[l + 32 * (k & 1)] >> 4) : (ql[l + 32 * (k & 1)] & 0x0f);
                    int q = lo | (((qh[l] >> (2 * k)) & 3) << 4); /* 0..63: the code + 32 */
                    lane[l / 4] += sc[2 * k + l / 16] * (q * yq[32 * k + l]);
                }
            }
        }
        for (int i = 0; i < 8; i++)
            lane[i] -= 32 * (x[b].scales[2 * i] * y[b].bsums[2 * i] +
                             x[b].scales[2 * i + 1] * y[b].bsums[2 * i + 1]);
        const float d = y[b].d * rb_fp16_to_fp32(x[b].d);
        for (int i = 0; i < 8; i++)
            acc[i] = fmaf(d, (float)lane[i], acc[i]);
    }
    return rb_hsum8_ref(acc);
}

/* ggml_vec_dot_q5_K_q8_K's AVX2 order (llama.cpp repacks Q5_K only for
 * NEON, so on x86 every Q5_K matrix runs this): Q4_K's unpacking plus the
 * fifth bit, the integer lanes of Q6_K's kernel (no offset: the 5-bit codes
 * are unsigned), and the mins in a scalar chain of their own. ggml writes
 * that chain as `summs += dmin * isum`, which gcc (-ffp-contract=fast) and
 * clang (-ffp-contract=on) both compile to one fused multiply-add when FMA
 * is enabled, as it is in an AVX2 build. */
float rb_vec_dot_q5_K_q8_K_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q5_K *x = w;
    const rb_block_q8_K *y = a;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        uint8_t sc[8], m[8];
        rb_k4_scales_mins(x[b].scales, sc, m);
        int32_t lane[8] = {0}, imin = 0;
        for (int j = 0; j < 8; j++) {
            const uint8_t *q = x[b].qs + 32 * (j / 2);
            const int8_t *yq = y[b].qs + 32 * j;
            const int shift = (j & 1) ? 4 : 0;
            for (int l = 0; l < 32; l++) {
                const int q5 = ((q[l] >> shift) & 0x0f) | (((x[b].qh[l] >> j) & 1) << 4);
                lane[l / 4] += sc[j] * (q5 * yq[l]);
            }
            imin += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        }
        const float d = y[b].d * rb_fp16_to_fp32(x[b].d);
        const float dmin = -y[b].d * rb_fp16_to_fp32(x[b].dmin);
        summs = fmaf(dmin, (float)imin, summs);
        for (int i = 0; i < 8; i++)
            acc[i] = fmaf(d, (float)lane[i], acc[i]);
    }
    return rb_hsum8_ref(acc) + summs;
}

/* One Q4_1/Q5_1 block against its Q8_1 block, given the 8 integer lane
 * sums: m * s into the scalar chain (fused), d_x * d_y * lane into acc. */
static void add_block_1(const int32_t lane[8], rb_f16 xd, rb_f16 xm, const rb_block_q8_1 *y,
                        float acc[8], float *summs)
{
    *summs = fmaf(rb_fp16_to_fp32(xm), rb_fp16_to_fp32(y->s), *summs);
    const float d = rb_fp16_to_fp32(xd) * rb_fp16_to_fp32(y->d);
    for (int i = 0; i < 8; i++)
        acc[i] = fmaf(d, (float)lane[i], acc[i]);
}

/* ggml_vec_dot_q4_1_q8_1's AVX2 order: 8 float lanes of 4 products each,
 * the block's m * s in a scalar chain (fused, as for Q5_K's summs). */
float rb_vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q4_1 *x = w;
    const rb_block_q8_1 *y = a;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        int32_t lane[8] = {0};
        for (int l = 0; l < RB_QK4_1 / 2; l++) {
            lane[l / 4] += (x[b].qs[l] & 0x0f) * y[b].qs[l];
            lane[4 + l / 4] += (x[b].qs[l] >> 4) * y[b].qs[l + RB_QK4_1 / 2];
        }
        add_block_1(lane, x[b].d, x[b].m, &y[b], acc, &summs);
    }
    return rb_hsum8_ref(acc) + summs;
}

/* ggml_vec_dot_q5_1_q8_1's AVX2 order: Q4_1's with bit j of qh as bit 4 of
 * element j's code (as Q5_0) */
float rb_vec_dot_q5_1_q8_1_ref(int64_t n, const void *w, const void *a)
{
    const rb_block_q5_1 *x = w;
    const rb_block_q8_1 *y = a;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        const uint32_t qh = (uint32_t)x[b].qh[0] | (uint32_t)x[b].qh[1] << 8 |
                            (uint32_t)x[b].qh[2] << 16 | (uint32_t)x[b].qh[3] << 24;
        int32_t lane[8] = {0};
        for (int l = 0; l < RB_QK5_1 / 2; l++) {
            const int q0 = (x[b].qs[l] & 0x0f) | (int)(((qh >> l) & 1u) << 4);
            const int q1 = (x[b].qs[l] >> 4) | (int)(((qh >> (l + 16)) & 1u) << 4);
            lane[l / 4] += q0 * y[b].qs[l];
            lane[4 + l / 4] += q1 * y[b].qs[l + RB_QK5_1 / 2];
        }
        add_block_1(lane, x[b].d, x[b].m, &y[b], acc, &summs);
    }
    return rb_hsum8_ref(acc) + summs;
}

float rb_vec_dot_f32_f32_ref(int64_t n, const void *w, const void *a)
{
    const float *x = w, *y = a;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * y[i]);
    return (float)sum;
}

float rb_vec_dot_f16_f16_ref(int64_t n, const void *w, const void *a)
{
    const rb_f16 *x = w, *y = a;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(rb_fp16_to_fp32(x[i]) * rb_fp16_to_fp32(y[i]));
    return (float)sum;
}

float rb_vec_dot_bf16_bf16_ref(int64_t n, const void *w, const void *a)
{
    const rb_bf16 *x = w, *y = a;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(rb_bf16_to_fp32(x[i]) * rb_bf16_to_fp32(y[i]));
    return (float)sum;
}

/* ---- tiles: one vec_dot per (row, token) ---------------------------------- */

#define RB_REF_TILE(name, dot)                                                           \
    static void name(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,      \
                     const void *act, size_t act_row_bytes, int n_tok, float *y,         \
                     int64_t y_stride)                                                   \
    {                                                                                    \
        for (int t = 0; t < n_tok; t++)                                                  \
            for (int r = 0; r < n_rows; r++)                                             \
                y[t * y_stride + r] = dot(n_cols, (const char *)w + r * w_row_bytes,     \
                                          (const char *)act + t * act_row_bytes);        \
    }

RB_REF_TILE(rb_tile_q4_0_ref, rb_vec_dot_q4_0_q8_0_ref)
RB_REF_TILE(rb_tile_q5_0_ref, rb_vec_dot_q5_0_q8_0_ref)
RB_REF_TILE(rb_tile_q8_0_ref, rb_vec_dot_q8_0_q8_0_ref)
RB_REF_TILE(rb_tile_q4_K_ref, rb_vec_dot_q4_K_q8_K_ref)
RB_REF_TILE(rb_tile_q6_K_ref, rb_vec_dot_q6_K_q8_K_ref)
RB_REF_TILE(rb_tile_q5_K_ref, rb_vec_dot_q5_K_q8_K_ref)
RB_REF_TILE(rb_tile_q4_1_ref, rb_vec_dot_q4_1_q8_1_ref)
RB_REF_TILE(rb_tile_q5_1_ref, rb_vec_dot_q5_1_q8_1_ref)
RB_REF_TILE(rb_tile_f32_ref, rb_vec_dot_f32_f32_ref)
RB_REF_TILE(rb_tile_f16_ref, rb_vec_dot_f16_f16_ref)
RB_REF_TILE(rb_tile_bf16_ref, rb_vec_dot_bf16_bf16_ref)

/*
 * Activations to Q8_0 as llama.cpp's SIMD code does it on x86 and ARM (what
 * the reference logits were made with), not as its scalar _ref: scale by
 * id = 127 / amax and round half to even. The two differ on exact ties,
 * rarely, but a tie flips one code and the logits move by up to 0.1
 * (measured on parity-Q4_0.gguf: bit-identical logits with this rule).
 */
void rb_quantize_act_q8_0_ref(const float *x, void *dst, int64_t n)
{
    rb_block_q8_0 *y = dst;
    for (int64_t b = 0; b < n / RB_QK8_0; b++, x += RB_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < RB_QK8_0; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = rb_fp32_to_fp16(d);
        for (int j = 0; j < RB_QK8_0; j++) {
            float v = x[j] * id; /* |v| <= 127 up to rounding */
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            y[b].qs[j] = (int8_t)rb_nearest_int(v);
        }
    }
}

/* Q8_1 (for Q4_1 weights) as llama.cpp's SIMD quantize_row_q8_1: the Q8_0
 * codes and d above, and s = fp16(d * sum of the codes) */
void rb_quantize_act_q8_1_ref(const float *x, void *dst, int64_t n)
{
    rb_block_q8_1 *y = dst;
    for (int64_t b = 0; b < n / RB_QK8_0; b++, x += RB_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < RB_QK8_0; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int sum = 0;
        y[b].d = rb_fp32_to_fp16(d);
        for (int j = 0; j < RB_QK8_0; j++) {
            float v = x[j] * id;
            v = v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v;
            y[b].qs[j] = (int8_t)rb_nearest_int(v);
            sum += y[b].qs[j];
        }
        y[b].s = rb_fp32_to_fp16(d * (float)sum);
    }
}

const rb_matmul_isa rb_matmul_isa_ref = {
    .name = "ref",
    .act = {
        [RB_TYPE_F32] = rb_quantize_act_f32_ref,
        [RB_TYPE_F16] = rb_quantize_row_f16_ref,
        [RB_TYPE_BF16] = rb_quantize_row_bf16_ref,
        [RB_TYPE_Q8_0] = rb_quantize_act_q8_0_ref,
        [RB_TYPE_Q8_K] = rb_quantize_act_q8_K_ref,
        [RB_TYPE_Q8_1] = rb_quantize_act_q8_1_ref,
    },
    .tile = {
        [RB_TYPE_F32] = rb_tile_f32_ref,
        [RB_TYPE_F16] = rb_tile_f16_ref,
        [RB_TYPE_BF16] = rb_tile_bf16_ref,
        [RB_TYPE_Q4_0] = rb_tile_q4_0_ref,
        [RB_TYPE_Q5_0] = rb_tile_q5_0_ref,
        [RB_TYPE_Q8_0] = rb_tile_q8_0_ref,
        [RB_TYPE_Q4_K] = rb_tile_q4_K_ref,
        [RB_TYPE_Q6_K] = rb_tile_q6_K_ref,
        [RB_TYPE_Q5_K] = rb_tile_q5_K_ref,
        [RB_TYPE_Q4_1] = rb_tile_q4_1_ref,
        [RB_TYPE_Q5_1] = rb_tile_q5_1_ref,
    },
    .decode_rows = 1,
    .prefill_rows = 1,
    .prefill_toks = 1,
};
