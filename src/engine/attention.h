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
