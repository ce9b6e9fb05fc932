/*
 * attention.h - the inner loops of attention over the KV cache, in two
 * arithmetics:
 *   exact  llama.cpp's one-query form (the reference logits were made
 *          with it, one token per call): q rounded to f16, the score q.k
 *          summed in ggml's order (fp_dot.h), the weighted sum of V kept
 *          in an f16 accumulator rounded at every step, online softmax
 *          with libm's expf. rb_attn_f16 and the functions before it.
 *   tiled  rebound's f32 form, after llama.cpp's prefill tiling: a tile of
 *          up to 64 queries against blocks of the 64 positions
 *          [64k, 64k + 64), K and V widened to f32 once per block for the
 *          whole tile, the scores as a small f32 GEMM, online softmax in
 *          f32 with a vectorised exp (rb_attn_exp), V summed in f32.
 *          rb_attn_kv_tiled.
 * Which runs is forward.c's choice, by position (RB_ATTN_EXACT_BELOW) and
 * rb_forward.exact_attention; attention.c says why there are two.
 */
#ifndef RB_ATTENTION_H
#define RB_ATTENTION_H

#include <stdint.h>

#include "kvcache.h"
#include "quant.h"

/* sum_i q[i] * k[i] in ggml_vec_dot_f16's order (n <= 1024). */
float rb_attn_dot_f16(const rb_f16 *q, const rb_f16 *k, int n);
/* The scores of 8 consecutive positions whose K rows are stride elements
 * apart: out[l] = rb_attn_dot_f16(q, k + l * stride, n), the same bits. */
void rb_attn_dot8_f16(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8]);
/* acc[i] = f16(fma(v[i], s, acc[i])) */
void rb_attn_mad_f16(rb_f16 *acc, const rb_f16 *v, float s, int n);
/* acc[i] = f16(acc[i] * s) */
void rb_attn_scale_f16(rb_f16 *acc, float s, int n);

/* 8 consecutive positions of one query, K and V rows stride elements apart:
 * for each, score = rb_attn_dot_f16(q, k row) * kq_scale, then the online
 * softmax step (m, sum: the running max and sum): when the score exceeds m,
 * acc is scaled by expf(m - score) and m raised, else the weight is
 * expf(score - m); acc gets the weighted V row (rb_attn_mad_f16) and
 * sum = fmaf(sum, ms, vs). llama.cpp's flash attention step, the same bits
 * as the separate calls. */
void rb_attn_block8_f16(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride, int n,
                        float kq_scale, rb_f16 *acc, float *m, float *sum);

/* The block of 8 positions of rb_attn_block8_f16 for several queries at
 * once: for each j < nq, query i = idx[j] (row qh + i * n, accumulator
 * acc + i * n, state m[i], sum[i]) takes exactly rb_attn_block8_f16's
 * operations in its order (the same bits); the K and V rows are shared
 * (read and widened once for all the queries on the avx512 tier). */
void rb_attn_tile8_f16(const rb_f16 *k, const rb_f16 *v, int64_t stride, int n, float kq_scale,
                       int nq, const uint8_t *idx, const rb_f16 *qh, rb_f16 *acc, float *m,
                       float *sum);

/* The queries one rb_attn_f16 call takes: nq <= RB_ATTN_MAX_QUERIES and
 * nq * head_dim <= RB_ATTN_ACC_HALVES (their f16 rows live on its stack). */
#define RB_ATTN_MAX_QUERIES 32
#define RB_ATTN_ACC_HALVES (RB_ATTN_MAX_QUERIES * 256)

typedef struct rb_attn_query {
    const float *q;       /* head_dim values, read */
    float *out;           /* head_dim values, written */
    uint32_t first, last; /* it attends to positions first..last (first <= last) */
} rb_attn_query;

/* Attention of nq queries over KV head kvh of `layer` in an f16 cache:
 * out = softmax(kq_scale * q.K[first..last]) V[first..last], in llama.cpp's
 * flash-attention arithmetic: q rounded to f16, for every position in
 * order the score (rb_attn_dot_f16), the online-softmax step and the f16
 * accumulator (rb_attn_block8_f16's step), out = acc / sum. Tiled: the
 * positions are walked once, 8 at a time, and every query whose span
 * covers a block takes it while its rows are in L1 (rb_attn_tile8_f16);
 * each query's operations and their order are those of one query alone
 * (rb_attn_f16_ref), so the result is the same bits. Only pages holding
 * positions between the smallest `first` and the largest `last` are read;
 * they must be resident. */
void rb_attn_f16(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                 const rb_attn_query *qs, uint32_t nq);
/* The untiled form: one query after the other, one position after the
 * other, through the single-position functions. The same bits; kept as
 * the reference of tests/test_attention.c. */
void rb_attn_f16_ref(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                     const rb_attn_query *qs, uint32_t nq);

/*
 * The rule between the two forms (forward.c): a query at a position below
 * RB_ATTN_EXACT_BELOW takes the exact form, one at or above it the tiled
 * form, in a prefill and in a decode alike, however the tokens were
 * batched (unless rb_forward.exact_attention). 256 keeps every reference
 * golden (the longest, gemma3's, reaches position 143) on the exact form,
 * bit-identical to llama.cpp, and gives the tiled form the depths where
 * it pays.
 */
#define RB_ATTN_EXACT_BELOW 256

/*
 * The tiled f32 form. A tile is up to RB_ATTN_TILE_Q queries of one KV
 * head (rb_attn_query, any spans); the positions between the smallest
 * `first` and the largest `last` are walked in the blocks of
 * RB_ATTN_TILE_KV positions [64k, 64k + 64) that they meet (aligned to
 * absolute positions, not to the tile). Per block: the K and V rows
 * widened to f32; for every query q and position p of the block the score
 *   s = kq_scale * (fma chain over d = 0..hd-1 of q[d] * k[d], from 0)
 * or -inf where p is outside q's span; then per query the online step:
 * M' = max(M, the block's scores), ms = rb_attn_exp(M - M'), l = l * ms,
 * then for p in order w_p = rb_attn_exp(s_p - M'), l = l + w_p;
 * acc = acc * ms, then for p of q's span in order acc = fma(w_p, v_p,
 * acc). M starts at -inf, l and acc at +0. At the end out = acc * (1 / l).
 * Why a query's result does not depend on the tile it shares: a position
 * outside its span has w = 0 (rb_attn_exp(-inf) = 0) and adds nothing (l +
 * 0 = l, no fma); a block wholly outside its span leaves its
 * state as it was (before the span: M' = -inf, ms = rb_attn_exp(NaN) = 0
 * on l = +0 and acc = +0; after it: M' = M, ms = 1), and the blocks of its
 * span hold the same positions whatever the tile. So a query computes the
 * same bits alone (a decode), in any prefill chunk and beside any other
 * queries. Every operation of every lane is fixed above, so the vector
 * tiers give the scalar form's bits.
 */
#define RB_ATTN_TILE_Q 64
#define RB_ATTN_TILE_KV 64

/* exp(x) in f32 (the tiled form's, the same bits on every tier): 2^n *
 * p(r), n = round(x log2 e), r = x - n ln 2 (two-constant Cody-Waite),
 * p the degree-7 Taylor polynomial (Horner, fma). 0 for x < -87.33 (where
 * exp(x) < FLT_MIN) and for a NaN; x is capped at 88. Against exp() in
 * double over [-87.3, 88] (2M points, tests/test_attention.c): 0.90 ulp
 * at most, checked <= 2. */
float rb_attn_exp(float x);

/* Floats of scratch rb_attn_kv_tiled needs for head dim hd. */
#define RB_ATTN_TILED_WORK_FLOATS(hd)                                                            \
    ((size_t)(hd) * (2 * RB_ATTN_TILE_Q + 3 * RB_ATTN_TILE_KV) +                                 \
     (size_t)RB_ATTN_TILE_Q * RB_ATTN_TILE_KV + 8 * RB_ATTN_TILE_Q)

/* Attention of nq <= RB_ATTN_TILE_Q queries over KV head kvh of `layer`,
 * in the tiled f32 form above, over a cache whose K and V are each f16,
 * q8_0 or q4_0 (a quantized row is widened to its exact values d * q, as
 * an f16 one is; the query stays f32). work: at least
 * RB_ATTN_TILED_WORK_FLOATS(head_dim_k) floats, the caller's (any
 * alignment; its contents are not kept). Only pages holding positions
 * between the smallest `first` and the largest `last` are read; they must
 * be resident. Runs the vector tier rb_cpu_tier() names when it has the
 * head dim (avx512: multiples of 16; avx2: multiples of 8; neon, dotprod
 * and i8mm: multiples of 4), else the portable kernels. */
void rb_attn_kv_tiled(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                      const rb_attn_query *qs, uint32_t nq, float *work);
/* The portable form (the tests' oracle): the same bits. */
void rb_attn_kv_tiled_ref(const rb_kvcache *kv, uint32_t layer, uint32_t kvh, float kq_scale,
                          const rb_attn_query *qs, uint32_t nq, float *work);

/* A block's rows to f32: out[p * hd + d] = value d of rows[p] (np rows of
 * type f16, q8_0 or q4_0; hd a multiple of 32 for the quantized ones).
 * Every conversion is exact (an f16 widened; d * q, an 11-bit by 8-bit
 * product), so every tier gives the same bits. */
typedef void (*rb_attn_widen_fn)(uint32_t type, const void *const *rows, int np, int hd,
                                 float *out);
void rb_attn_widen_ref(uint32_t type, const void *const *rows, int np, int hd, float *out);

/* One block of the tiled form (the kernel every tier implements): kf, vf:
 * the block's np <= RB_ATTN_TILE_KV K and V rows as f32 (np x hd),
 * positions p0..p0+np-1; qt: the tile's queries transposed, qt[d * 64 +
 * q], zero past nq (lanes 0..15 only are read when nq <= 16); first/last:
 * the 64 queries' spans (an empty span past nq); st: 64 x 64 floats of
 * scratch (scores, then weights, st[p * 64 + q]); kt: hd x 64 floats of
 * scratch; acc: 64 x hd accumulators (16 x hd when nq <= 16); m, l: the
 * 64 running max and sum. Only the first nq queries' acc, m and l are
 * defined afterwards. Returns 0 (and does nothing) when the tier has no
 * kernel for hd. */
typedef int (*rb_attn_tblock_fn)(const float *kf, const float *vf, int np, int hd, int nq,
                                 const float *qt, const int32_t *first, const int32_t *last,
                                 int32_t p0, float kq_scale, float *st, float *kt, float *acc,
                                 float *m, float *l);
int rb_attn_tblock_ref(const float *kf, const float *vf, int np, int hd, int nq,
                       const float *qt, const int32_t *first, const int32_t *last, int32_t p0,
                       float kq_scale, float *st, float *kt, float *acc, float *m, float *l);

/* Quantized K rows (q8_0, q4_0) against a query row quantized to q8_0
 * (n values, a multiple of 32), in llama.cpp's AVX2 vec_dot order. */
float rb_attn_dot_q8_0(const void *k_row, const void *q_row, int n);
float rb_attn_dot_q4_0(const void *k_row, const void *q_row, int n);
/* The scalar versions (the same bits: every lane sum is an exact integer). */
float rb_attn_dot_q8_0_ref(const void *k_row, const void *q_row, int n);
float rb_attn_dot_q4_0_ref(const void *k_row, const void *q_row, int n);
/* acc[i] = fma(v[i], s, acc[i]); acc[i] *= s (a quantized V's f32 path) */
void rb_attn_mad_f32(float *acc, const float *v, float s, int n);
void rb_attn_scale_f32(float *acc, float s, int n);

#endif
