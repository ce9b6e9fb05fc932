/*
 * attention.c - f16 attention loops in the order of operations of
 * llama.cpp's CPU flash attention (ggml_vec_dot_f16 for q.k, ggml_vec_mad_f16
 * for V), so that rebound's logits are llama.cpp's bit for bit (see
 * attention.h and fp_dot.h).
 *
 * Measured on the reference files (tests/test_golden.c): stories260K
 * (head dim 8: q.k entirely in ggml's double-summed tail) and parity-qwen3
 * (head dim 64: two 32-element vector steps) are bit-identical to
 * llama.cpp with q.k as fp_dot.h sums it and V accumulated as
 * f16(fma(v, s, acc)); with a sequential f32 q.k and a separately rounded
 * product in V they drifted to 1.4e-2 and 3.5e-2.
 *
 * llama.cpp 34af94cd9 itself has two other CPU forms: with 64 or more
 * queries in a call (its prefill) a tiled one (64 queries x 64 positions,
 * q.k as an f32 GEMM, a vectorized softmax per tile, V summed in f32), and
 * for one query over 512 or more f16 positions (decode) the positions split
 * into one range per thread, each range's f16 sum widened to f32 and the
 * ranges merged. The second is not used here (its order changes with the
 * thread count). The first has its counterpart at the end of this file
 * (rb_attn_kv_tiled, rebound's own tiling and exp, over f16, q8_0 and q4_0
 * KV): the one-query form spends ~10.8 ns per query x position x head on
 * a Zen 5 core at depth (scalar expf and f16 rounding at every position),
 * the f32 tiles a fraction of that. forward.c takes it by position, not by
 * batch (attention.h, RB_ATTN_EXACT_BELOW): every query at position 256
 * or later, in a prefill or a decode, unless exact_attention is set; so a
 * sequence's bits do not depend on how it was batched. The goldens (one
 * token per call, 1 thread, n_ctx 512, positions below 144) come from the
 * one-query form, which every position below 256 computes: there prefill
 * tiles the walk over the KV (rb_attn_f16), not the arithmetic of a query.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "attention.h"
#include "fp_dot.h"
#include "matmul.h"

#include "cpu.h"
#include "ops_kernels.h"

/* The vector tiers run ops_avx2.c's forms (x86-64) or ops_neon.c's
 * (aarch64); this file is compiled for the baseline. They give the same
 * bits as the loops below. RB_ATTN_VEC(call) runs call where the tier in
 * use has them; call names the kernel as RB_ATTN_K(rb_attn_...). */
#if defined(__x86_64__)
#define RB_ATTN_VEC_TIER(t) ((t) >= RB_CPU_TIER_AVX2 && (t) <= RB_CPU_TIER_AVX512)
#define RB_ATTN_K(name) name##_avx2
#elif defined(__aarch64__)
#define RB_ATTN_VEC_TIER(t) ((t) >= RB_CPU_TIER_NEON && (t) <= RB_CPU_TIER_I8MM)
#define RB_ATTN_K(name) name##_neon
#endif
#ifdef RB_ATTN_K
#define RB_ATTN_VEC(call)                                                   \
    do {                                                                    \
        if (RB_ATTN_VEC_TIER(rb_cpu_tier())) {                              \
            call;                                                           \
        }                                                                   \
    } while (0)
#else
#define RB_ATTN_VEC_TIER(t) 0
#define RB_ATTN_VEC(call) ((void)0)
#endif

float rb_attn_dot_f16(const rb_f16 *q, const rb_f16 *k, int n)
{
    RB_ATTN_VEC(return RB_ATTN_K(rb_attn_dot_f16)(q, k, n));
    return rb_dot_f16_ggml(k, q, n);
}

/* The rows are independent: one ggml-order dot each. (A head dim under 32
 * is all tail, summed in double; vectorising across positions would pay
 * only for toy models.) */
void rb_attn_dot8_f16(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8])
{
    RB_ATTN_VEC(RB_ATTN_K(rb_attn_dot8_f16)(q, k, stride, n, out); return);
    for (int l = 0; l < 8; l++)
        out[l] = rb_dot_f16_ggml(k + l * stride, q, n);
}

/* ggml fuses the multiply-add (an FMA in its vector loop; gcc contracts
 * its scalar tail), then rounds to f16 (RNE). */
void rb_attn_mad_f16(rb_f16 *acc, const rb_f16 *v, float s, int n)
{
    int i = 0;
    RB_ATTN_VEC(RB_ATTN_K(rb_attn_mad_f16)(acc, v, s, n); return);
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(fmaf(rb_fp16_to_fp32(v[i]), s, rb_fp16_to_fp32(acc[i])));
}

void rb_attn_scale_f16(rb_f16 *acc, float s, int n)
{
    int i = 0;
    RB_ATTN_VEC(RB_ATTN_K(rb_attn_scale_f16)(acc, s, n); return);
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) * s);
}

void rb_attn_block8_f16(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride, int n,
                        float kq_scale, rb_f16 *acc, float *m, float *sum)
{
#if defined(__x86_64__)
    if (rb_cpu_tier() == RB_CPU_TIER_AVX512 &&
        rb_attn_block8_f16_avx512(q, k, v, stride, n, kq_scale, acc, m, sum))
        return;
#endif
    RB_ATTN_VEC(RB_ATTN_K(rb_attn_block8_f16)(q, k, v, stride, n, kq_scale, acc, m, sum); return);
    float sc[8];
    rb_attn_dot8_f16(q, k, stride, n, sc);
    for (int l = 0; l < 8; l++) {
        const float s = sc[l] * kq_scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > *m) {
            const float m_old = *m;
            *m = s;
            ms = expf(m_old - *m);
            rb_attn_scale_f16(acc, ms, n);
        } else {
            vs = expf(s - *m);
        }
        rb_attn_mad_f16(acc, v + l * stride, vs, n);
        *sum = fmaf(*sum, ms, vs);
    }
}

void rb_attn_tile8_f16(const rb_f16 *k, const rb_f16 *v, int64_t stride, int n, float kq_scale,
                       int nq, const uint8_t *idx, const rb_f16 *qh, rb_f16 *acc, float *m,
                       float *sum)
{
#if defined(__x86_64__)
    if (rb_cpu_tier() == RB_CPU_TIER_AVX512 &&
        rb_attn_tile8_f16_avx512(k, v, stride, n, kq_scale, nq, idx, qh, acc, m, sum))
        return;
    if (RB_ATTN_VEC_TIER(rb_cpu_tier()) &&
        rb_attn_tile8_f16_avx2(k, v, stride, n, kq_scale, nq, idx, qh, acc, m, sum))
        return;
#endif
    for (int j = 0; j < nq; j++) {
        const int i = idx[j];
        rb_attn_block8_f16(qh + (size_t)i * n, k, v, stride, n, kq_scale, acc + (size_t)i * n,
                           &m[i], &sum[i]);
    }
}

/* One online-softmax step at a position with score s (llama.cpp's). */
static void attn_step(rb_f16 *acc, const rb_f16 *v, float s, int hd, float *m, float *sum)
{
    float ms = 1.0f, vs = 1.0f;
    if (s > *m) {
        const float m_old = *m;
        *m = s;
        ms = expf(m_old - *m);
        rb_attn_scale_f16(acc, ms, hd);
    } else {
        vs = expf(s - *m);
    }
    rb_attn_mad_f16(acc, v, vs, hd);
    *sum = fmaf(*sum, ms, vs); /* ggml's S*ms + vs, contracted by gcc */
}

/* Why the positions are the outer loop: every query of a KV head's group
 * (and every token of a prefill chunk) reads the same K and V rows, so the
 * rows of a block of 8 positions are read from RAM once for all the
 * queries and used while they are in L1. One query per pass read the KV
 * from RAM once per query head and token: at 8192 positions (32 MiB of KV
 * per layer for qwen3-0.6b, beyond the L3), an 8-token turn ran at memory
 * bandwidth. A query whose span covers a block only in part (the causal
 * end, the window's start) or a block across a page boundary takes it
 * position by position, in the same order. A position outside a query's
 * span is skipped as llama.cpp skips a -inf mask entry. */
void rb_attn_f16(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                 const rb_attn_query *qs, uint32_t nq)
{
    const uint32_t hd = kv->head_dim_k, pt = kv->page_tokens;
    rb_f16 qh[RB_ATTN_ACC_HALVES], acc[RB_ATTN_ACC_HALVES];
    float m[RB_ATTN_MAX_QUERIES], sum[RB_ATTN_MAX_QUERIES];
    uint8_t full[RB_ATTN_MAX_QUERIES];
    uint32_t lo = UINT32_MAX, end = 0;
    for (uint32_t qi = 0; qi < nq; qi++) {
        rb_matmul_quantize_act(RB_TYPE_F16, qs[qi].q, qh + qi * hd, hd); /* rb_fp32_to_fp16's bits */
        m[qi] = -INFINITY;
        sum[qi] = 0.0f;
        lo = qs[qi].first < lo ? qs[qi].first : lo;
        end = qs[qi].last + 1 > end ? qs[qi].last + 1 : end;
    }
    memset(acc, 0, (size_t)nq * hd * sizeof *acc);
    for (uint32_t p0 = nq ? lo / 8 * 8 : 0; p0 < end; p0 += 8) {
        const rb_f16 *k0 = rb_kvcache_k(kv, layer, kvh, p0);
        const int in_page = p0 % pt + 8 <= pt;
        int n_full = 0;
        for (uint32_t qi = 0; qi < nq; qi++) {
            const rb_attn_query *a = &qs[qi];
            if (p0 > a->last || p0 + 8 <= a->first)
                continue;
            if (in_page && p0 + 8 <= a->last + 1 && p0 >= a->first) {
                full[n_full++] = (uint8_t)qi;
                continue;
            }
            const rb_f16 *q = qh + qi * hd;
            for (uint32_t p = p0 > a->first ? p0 : a->first; p <= a->last && p < p0 + 8; p++)
                attn_step(acc + qi * hd, rb_kvcache_v(kv, layer, kvh, p),
                          rb_attn_dot_f16(q, rb_kvcache_k(kv, layer, kvh, p), (int)hd) * kq_scale,
                          (int)hd, &m[qi], &sum[qi]);
        }
        if (n_full)
            rb_attn_tile8_f16(k0, rb_kvcache_v(kv, layer, kvh, p0), hd, (int)hd, kq_scale, n_full,
                              full, qh, acc, m, sum);
    }
    for (uint32_t qi = 0; qi < nq; qi++) {
        const float inv = 1.0f / sum[qi]; /* a reciprocal, as ggml scales by it */
        for (uint32_t i = 0; i < hd; i++)
            qs[qi].out[i] = rb_fp16_to_fp32(acc[qi * hd + i]) * inv;
    }
}

void rb_attn_f16_ref(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                     const rb_attn_query *qs, uint32_t nq)
{
    const uint32_t hd = kv->head_dim_k;
    rb_f16 qh[RB_ATTN_ACC_HALVES], acc[RB_ATTN_ACC_HALVES];
    for (uint32_t qi = 0; qi < nq; qi++) {
        const rb_attn_query *a = &qs[qi];
        float m = -INFINITY, sum = 0.0f;
        for (uint32_t i = 0; i < hd; i++)
            qh[i] = rb_fp32_to_fp16(a->q[i]);
        memset(acc, 0, hd * sizeof *acc);
        for (uint32_t p = a->first; p <= a->last; p++)
            attn_step(acc, rb_kvcache_v(kv, layer, kvh, p),
                      rb_attn_dot_f16(qh, rb_kvcache_k(kv, layer, kvh, p), (int)hd) * kq_scale,
                      (int)hd, &m, &sum);
        const float inv = 1.0f / sum;
        for (uint32_t i = 0; i < hd; i++)
            a->out[i] = rb_fp16_to_fp32(acc[i]) * inv;
    }
}

/*
 * Quantized K (llama.cpp's --cache-type-k q8_0 / q4_0): the score is its
 * vec_dot of the K row with the query quantized to q8_0, in the order of
 * its AVX2 kernel, which this scalar code reproduces exactly: per block of
 * 32, eight lanes each hold the integer sum of 4 consecutive products
 * (exact in float), multiplied by d_k * d_q (one float product) and added
 * to the lane's accumulator with one fma; then the lanes are summed as
 * hsum_float_8 does, (l0 + l4) + (l2 + l6) + ((l1 + l5) + (l3 + l7)).
 */
static float kv_hsum8(const float a[8])
{
    const float r0 = a[4] + a[0], r1 = a[5] + a[1], r2 = a[6] + a[2], r3 = a[7] + a[3];
    return (r0 + r2) + (r1 + r3);
}

float rb_attn_dot_q8_0(const void *k_row, const void *q_row, int n)
{
    const int tier = rb_cpu_tier();
    (void)tier;
#if defined(__x86_64__)
    if (RB_ATTN_VEC_TIER(tier))
        return rb_attn_dot_q8_0_avx2(k_row, q_row, n);
#elif defined(__aarch64__)
    if (tier >= RB_CPU_TIER_DOTPROD && tier <= RB_CPU_TIER_I8MM)
        return rb_attn_dot_q8_0_dotprod(k_row, q_row, n);
    if (RB_ATTN_VEC_TIER(tier))
        return rb_attn_dot_q8_0_neon(k_row, q_row, n);
#endif
    return rb_attn_dot_q8_0_ref(k_row, q_row, n);
}

float rb_attn_dot_q4_0(const void *k_row, const void *q_row, int n)
{
    const int tier = rb_cpu_tier();
    (void)tier;
#if defined(__x86_64__)
    if (RB_ATTN_VEC_TIER(tier))
        return rb_attn_dot_q4_0_avx2(k_row, q_row, n);
#elif defined(__aarch64__)
    if (tier >= RB_CPU_TIER_DOTPROD && tier <= RB_CPU_TIER_I8MM)
        return rb_attn_dot_q4_0_dotprod(k_row, q_row, n);
    if (RB_ATTN_VEC_TIER(tier))
        return rb_attn_dot_q4_0_neon(k_row, q_row, n);
#endif
    return rb_attn_dot_q4_0_ref(k_row, q_row, n);
}

float rb_attn_dot_q8_0_ref(const void *k_row, const void *q_row, int n)
{
    const rb_block_q8_0 *x = k_row, *y = q_row;
    float acc[8] = {0};
    for (int b = 0; b < n / RB_QK8_0; b++) {
        const float d = rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d);
        for (int l = 0; l < 8; l++) {
            int sum = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++)
                sum += x[b].qs[i] * y[b].qs[i];
            acc[l] = fmaf(d, (float)sum, acc[l]);
        }
    }
    return kv_hsum8(acc);
}

float rb_attn_dot_q4_0_ref(const void *k_row, const void *q_row, int n)
{
    const rb_block_q4_0 *x = k_row;
    const rb_block_q8_0 *y = q_row;
    float acc[8] = {0};
    for (int b = 0; b < n / RB_QK4_0; b++) {
        const float d = rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d);
        for (int l = 0; l < 8; l++) {
            int sum = 0;
            for (int i = 4 * l; i < 4 * l + 4; i++) {
                /* values 0..15 are the low nibbles, 16..31 the high ones */
                int q = i < 16 ? x[b].qs[i] & 0x0f : x[b].qs[i - 16] >> 4;
                sum += (q - 8) * y[b].qs[i];
            }
            acc[l] = fmaf(d, (float)sum, acc[l]);
        }
    }
    return kv_hsum8(acc);
}

/* V quantized: ggml accumulates in f32, acc[i] = fma(v[i], s, acc[i]) and
 * acc[i] * ms (ggml_vec_mad_f32 / ggml_vec_scale_f32). */
void rb_attn_mad_f32(float *acc, const float *v, float s, int n)
{
#if defined(__x86_64__)
    RB_ATTN_VEC(rb_attn_mad_f32_avx2(acc, v, s, n); return);
#endif
    for (int i = 0; i < n; i++)
        acc[i] = fmaf(v[i], s, acc[i]);
}

void rb_attn_scale_f32(float *acc, float s, int n)
{
#if defined(__x86_64__)
    RB_ATTN_VEC(rb_attn_scale_f32_avx2(acc, s, n); return);
#endif
    for (int i = 0; i < n; i++)
        acc[i] *= s;
}

/*
 * The tiled f32 form (attention.h). llama.cpp 34af94cd9 switches its CPU
 * flash attention to such a form when a call has 64 or more queries (its
 * GGML_FA_TILE_Q); rebound's forward.c takes it for every query at a
 * position >= RB_ATTN_EXACT_BELOW unless the session asked for the exact
 * arithmetic. The order of every operation is fixed per lane (attention.h), so that
 * the vector kernels in ops_avx2.c / ops_avx512.c (x86-64) and ops_neon.c
 * (aarch64) are checked against this scalar code bit for bit. The exp's
 * constants are in ops_kernels.h.
 */
float rb_attn_exp(float x)
{
    if (!(x >= RB_EXP_LO))
        return 0.0f;
    x = x < 88.0f ? x : 88.0f;
    const float n = fmaf(x, RB_EXP_LOG2E, RB_EXP_SHIFT) - RB_EXP_SHIFT;
    float r = fmaf(n, -RB_EXP_LN2_HI, x);
    r = fmaf(n, -RB_EXP_LN2_LO, r);
    float p = RB_EXP_C7;
    p = fmaf(p, r, RB_EXP_C6);
    p = fmaf(p, r, RB_EXP_C5);
    p = fmaf(p, r, RB_EXP_C4);
    p = fmaf(p, r, RB_EXP_C3);
    p = fmaf(p, r, RB_EXP_C2);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    const uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* Exact conversions (attention.h): an f16 widened, a q8_0 / q4_0 value
 * d * q (rb_dequantize_row_q8_0's products). */
void rb_attn_widen_ref(uint32_t type, const void *const *rows, int np, int hd, float *out)
{
    for (int p = 0; p < np; p++) {
        float *o = out + (size_t)p * hd;
        if (type == RB_TYPE_F16) {
            const rb_f16 *r = rows[p];
            for (int d = 0; d < hd; d++)
                o[d] = rb_fp16_to_fp32(r[d]);
        } else if (type == RB_TYPE_Q8_0) {
            const rb_block_q8_0 *x = rows[p];
            for (int b = 0; b < hd / RB_QK8_0; b++) {
                const float dd = rb_fp16_to_fp32(x[b].d);
                for (int i = 0; i < RB_QK8_0; i++)
                    o[b * RB_QK8_0 + i] = dd * (float)x[b].qs[i];
            }
        } else { /* q4_0: values 0..15 the low nibbles, 16..31 the high ones */
            const rb_block_q4_0 *x = rows[p];
            for (int b = 0; b < hd / RB_QK4_0; b++) {
                const float dd = rb_fp16_to_fp32(x[b].d);
                for (int i = 0; i < RB_QK4_0 / 2; i++) {
                    o[b * RB_QK4_0 + i] = dd * (float)((x[b].qs[i] & 0x0f) - 8);
                    o[b * RB_QK4_0 + i + 16] = dd * (float)((x[b].qs[i] >> 4) - 8);
                }
            }
        }
    }
}

int rb_attn_tblock_ref(const float *kf, const float *vf, int np, int hd, int nq,
                       const float *qt, const int32_t *first, const int32_t *last, int32_t p0,
                       float kq_scale, float *st, float *kt, float *acc, float *m, float *l)
{
    const int TQ = RB_ATTN_TILE_Q;
    float ms[RB_ATTN_TILE_Q];
    (void)kt;
    for (int p = 0; p < np; p++)
        for (int q = 0; q < nq; q++) {
            float c = 0.0f;
            for (int d = 0; d < hd; d++)
                c = fmaf(kf[p * hd + d], qt[d * TQ + q], c);
            const int32_t pos = p0 + p;
            st[p * TQ + q] = first[q] <= pos && pos <= last[q] ? c * kq_scale : -INFINITY;
        }
    for (int q = 0; q < nq; q++) {
        float mx = m[q];
        for (int p = 0; p < np; p++)
            mx = st[p * TQ + q] > mx ? st[p * TQ + q] : mx;
        ms[q] = rb_attn_exp(m[q] - mx);
        m[q] = mx;
        float s = l[q] * ms[q];
        for (int p = 0; p < np; p++) {
            const float w = rb_attn_exp(st[p * TQ + q] - mx);
            st[p * TQ + q] = w;
            s = s + w;
        }
        l[q] = s;
    }
    for (int q = 0; q < nq; q++)
        for (int d = 0; d < hd; d++) {
            float a = acc[q * hd + d] * ms[q];
            for (int p = 0; p < np; p++)
                if (first[q] <= p0 + p && p0 + p <= last[q])
                    a = fmaf(st[p * TQ + q], vf[p * hd + d], a);
            acc[q * hd + d] = a;
        }
    return 1;
}

/* The decode kernel's type (rb_attn_tblock_few_avx512) */
typedef int (*attn_few_fn)(uint32_t type_k, uint32_t type_v, const void *const *kr,
                           const void *const *vr, int np, int hd, int nq, const float *qt,
                           const int32_t *first, const int32_t *last, int32_t p0,
                           float kq_scale, float *kt, float *acc, float *m, float *l);

/* The kernels of this CPU's tier for head dim hd (the portable ones
 * where it has none; few: NULL where the tier has no decode kernel, as on
 * aarch64, whose decode tiles run the widen and block kernels). */
static void tiled_kernels(int hd, rb_attn_widen_fn *widen, rb_attn_tblock_fn *block,
                          attn_few_fn *few)
{
    *widen = rb_attn_widen_ref;
    *block = rb_attn_tblock_ref;
    *few = NULL;
#if defined(__x86_64__)
    const int tier = rb_cpu_tier();
    if (tier == RB_CPU_TIER_AVX512 && hd % 16 == 0) {
        *widen = rb_attn_widen_avx512;
        *block = rb_attn_tblock_avx512;
        *few = rb_attn_tblock_few_avx512;
    } else if (RB_ATTN_VEC_TIER(tier) && hd % 8 == 0) {
        *widen = rb_attn_widen_avx2;
        *block = rb_attn_tblock_avx2;
        *few = rb_attn_tblock_few_avx2;
    }
#elif defined(__aarch64__)
    if (RB_ATTN_VEC_TIER(rb_cpu_tier()) && hd % 4 == 0) { /* neon, dotprod, i8mm */
        *widen = rb_attn_widen_neon;
        *block = rb_attn_tblock_neon;
    }
#endif
    (void)hd;
}

/* Bytes of a row of n values of type (f16, q8_0, q4_0) */
static size_t row_bytes(uint32_t type, int n)
{
    return type == RB_TYPE_F16   ? (size_t)n * 2
           : type == RB_TYPE_Q8_0 ? (size_t)n / RB_QK8_0 * sizeof(rb_block_q8_0)
                                  : (size_t)n / RB_QK4_0 * sizeof(rb_block_q4_0);
}

static void prefetch_rows(const void *const *rows, int np, size_t bytes)
{
    for (int p = 0; p < np; p++)
        for (size_t o = 0; o < bytes; o += 64)
            __builtin_prefetch((const char *)rows[p] + o, 0, 2);
}

/* The K and V rows of positions p0..p1-1: a division per page, not per
 * row (the rows of a page are consecutive) */
static void block_rows(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, uint32_t p0,
                       uint32_t p1, const void *rows[2][RB_ATTN_TILE_KV])
{
    const uint32_t pt = kv->page_tokens;
    const uint8_t *k = NULL, *v = NULL;
    for (uint32_t p = p0, in_page = p0 % pt; p < p1; p++, in_page++) {
        if (p == p0 || in_page == pt) {
            in_page = p % pt;
            k = rb_kvcache_k_row(kv, layer, kvh, p);
            v = rb_kvcache_v_row(kv, layer, kvh, p);
        }
        rows[0][p - p0] = k;
        rows[1][p - p0] = v;
        k += kv->row_k;
        v += kv->row_v;
    }
}

/* One tile: the queries transposed into qt (zero past nq, whose spans are
 * empty), the positions lo..end-1 in the absolute blocks [64k, 64k + 64)
 * they meet (a block cut to lo..end-1: the positions outside add nothing
 * to any query, attention.h), out = acc / l. While a block is computed
 * the next one's rows are prefetched. */
static void attn_tiled(rb_attn_widen_fn widen, rb_attn_tblock_fn block, attn_few_fn few,
                       const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                       const rb_attn_query *qs, uint32_t nq, float *work)
{
    const int TQ = RB_ATTN_TILE_Q, TKV = RB_ATTN_TILE_KV;
    const int hd = (int)kv->head_dim_k;
    float *qt = work, *acc = qt + (size_t)hd * TQ, *kt = acc + (size_t)hd * TQ;
    float *kf = kt + (size_t)hd * TKV, *vf = kf + (size_t)hd * TKV, *st = vf + (size_t)hd * TKV;
    float *m = st + TQ * TKV, *l = m + TQ;
    int32_t *first = (int32_t *)(l + TQ), *last = first + TQ;
    const void *rows[2][2][RB_ATTN_TILE_KV]; /* [block parity][K, V][position] */
    const size_t kb = row_bytes(kv->type_k, hd), vb = row_bytes(kv->type_v, hd);
    uint32_t lo = UINT32_MAX, end = 0;
    if (nq == 0)
        return;
    /* the lanes a kernel reads: 16 queries for a tile of up to 16 (a
       decode), else all 64 */
    const int lanes = nq <= 16 ? 16 : TQ;
    for (int q = 0; q < TQ; q++) {
        const int real = q < (int)nq;
        for (int d = 0; d < hd && q < lanes; d++)
            qt[d * TQ + q] = real ? qs[q].q[d] : 0.0f;
        first[q] = real ? (int32_t)qs[q].first : 1;
        last[q] = real ? (int32_t)qs[q].last : 0;
        m[q] = -INFINITY;
        l[q] = 0.0f;
        if (real) {
            lo = qs[q].first < lo ? qs[q].first : lo;
            end = qs[q].last + 1 > end ? qs[q].last + 1 : end;
        }
    }
    memset(acc, 0, (size_t)lanes * hd * sizeof *acc);
    int cur = 0;
    uint32_t b0 = lo, b1 = (lo / TKV + 1) * TKV < end ? (lo / TKV + 1) * TKV : end;
    block_rows(kv, layer, kvh, b0, b1, rows[cur]);
    while (b0 < end) {
        const int np = (int)(b1 - b0);
        /* the next block's rows, prefetched while this one is computed */
        const uint32_t n0 = b1, n1 = b1 + TKV < end ? b1 + TKV : end;
        block_rows(kv, layer, kvh, n0, n1, rows[!cur]);
        if (n1 > n0) {
            prefetch_rows(rows[!cur][0], (int)(n1 - n0), kb);
            prefetch_rows(rows[!cur][1], (int)(n1 - n0), vb);
        }
        if (!few || !few(kv->type_k, kv->type_v, rows[cur][0], rows[cur][1], np, hd, (int)nq,
                         qt, first, last, (int32_t)b0, kq_scale, kt, acc, m, l)) {
            widen(kv->type_k, rows[cur][0], np, hd, kf);
            widen(kv->type_v, rows[cur][1], np, hd, vf);
            block(kf, vf, np, hd, (int)nq, qt, first, last, (int32_t)b0, kq_scale, st, kt, acc,
                  m, l);
        }
        b0 = n0;
        b1 = n1;
        cur = !cur;
    }
    for (uint32_t q = 0; q < nq; q++) {
        const float inv = 1.0f / l[q];
        for (int d = 0; d < hd; d++)
            qs[q].out[d] = acc[(size_t)q * hd + d] * inv;
    }
}

void rb_attn_kv_tiled(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                      const rb_attn_query *qs, uint32_t nq, float *work)
{
    rb_attn_widen_fn widen;
    rb_attn_tblock_fn block;
    attn_few_fn few;
    tiled_kernels((int)kv->head_dim_k, &widen, &block, &few);
    attn_tiled(widen, block, few, kv, layer, kvh, kq_scale, qs, nq, work);
}

void rb_attn_kv_tiled_ref(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                          const rb_attn_query *qs, uint32_t nq, float *work)
{
    attn_tiled(rb_attn_widen_ref, rb_attn_tblock_ref, NULL, kv, layer, kvh, kq_scale, qs, nq,
               work);
}
