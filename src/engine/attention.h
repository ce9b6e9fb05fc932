/*
 * attention.h - the inner loops of attention over an f16 KV cache, in
 * llama.cpp's CPU flash-attention arithmetic (the reference logits were
 * made with it): q rounded to f16, the score q.k summed in ggml's order
 * (fp_dot.h), the weighted sum of V kept in an f16 accumulator rounded at
 * every step, online softmax in the caller. attention.c says why.
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
