/*
 * ops_kernels.h - internal: the vector bodies of ops.c's SwiGLU and of
 * attention.c's loops. x86-64: ops_avx2.c (-mavx2 -mfma -mf16c, the avx2
 * and vnni tiers) and ops_avx512.c (the avx512 tier). aarch64: ops_neon.c
 * (armv8-a: the neon, dotprod and i8mm tiers) and its +dotprod build
 * ops_dotprod.c (the quantized-K scores of the dotprod and i8mm tiers).
 * Each gives the bits of the portable form beside its caller except where
 * that says otherwise.
 */
#ifndef RB_OPS_KERNELS_H
#define RB_OPS_KERNELS_H

#include <stdint.h>

#include "quant.h"

/* rb_attn_exp's constants (attention.h), shared by every tier's copy */
#define RB_EXP_LOG2E 1.44269504088896341f
#define RB_EXP_SHIFT 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer */
#define RB_EXP_LN2_HI 0.693359375f
#define RB_EXP_LN2_LO -2.12194440e-4f
#define RB_EXP_LO -87.33654f /* ln(FLT_MIN) */
#define RB_EXP_C7 (1.0f / 5040)
#define RB_EXP_C6 (1.0f / 720)
#define RB_EXP_C5 (1.0f / 120)
#define RB_EXP_C4 (1.0f / 24)
#define RB_EXP_C3 (1.0f / 6)
#define RB_EXP_C2 0.5f

#if defined(__x86_64__)
/* gate[i] = silu(gate[i]) * up[i] for the first n - n % 8 values, in
 * ggml's vector exp; returns how many it did */
int64_t rb_swiglu8_avx2(float *gate, const float *up, int64_t n);

/* ops.c's rb_rope_rotate (neox: pairs (i, i + half), else (2i, 2i + 1));
 * the same bits: its fmaf inline here, 8 pairs at a time for neox */
void rb_rope_rotate_avx2(int neox, int half, float *x, int n_heads, int head_dim,
                         const float *cos_t, const float *sin_t);

/* attention.c's rb_attn_* in AVX2 (the same bits) */
float rb_attn_dot_f16_avx2(const rb_f16 *q, const rb_f16 *k, int n);
void rb_attn_dot8_f16_avx2(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8]);
void rb_attn_mad_f16_avx2(rb_f16 *acc, const rb_f16 *v, float s, int n);
void rb_attn_scale_f16_avx2(rb_f16 *acc, float s, int n);
void rb_attn_block8_f16_avx2(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                             int n, float kq_scale, rb_f16 *acc, float *m, float *sum);
/* rb_attn_tile8_f16 for head dims that are multiples of 32 up to 256;
 * returns 0 (and does nothing) for other n */
int rb_attn_tile8_f16_avx2(const rb_f16 *k, const rb_f16 *v, int64_t stride, int n, float kq_scale,
                           int nq, const uint8_t *idx, const rb_f16 *qh, rb_f16 *acc, float *m,
                           float *sum);
void rb_attn_mad_f32_avx2(float *acc, const float *v, float s, int n);
void rb_attn_scale_f32_avx2(float *acc, float s, int n);
float rb_attn_dot_q8_0_avx2(const void *k_row, const void *q_row, int n);
float rb_attn_dot_q4_0_avx2(const void *k_row, const void *q_row, int n);
/* ops_avx512.c (avx512 tier): rb_attn_block8_f16_avx2's bits for head dims
 * 64, 128 and 256; returns 0 (and does nothing) for other n */
int rb_attn_block8_f16_avx512(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                              int n, float kq_scale, rb_f16 *acc, float *m, float *sum);
/* rb_attn_tile8_f16 on the avx512 tier for head dims 64, 128 and 256;
 * returns 0 (and does nothing) for other n */
int rb_attn_tile8_f16_avx512(const rb_f16 *k, const rb_f16 *v, int64_t stride, int n,
                             float kq_scale, int nq, const uint8_t *idx, const rb_f16 *qh,
                             rb_f16 *acc, float *m, float *sum);
/* attention.h's tiled form: rb_attn_widen_ref's and rb_attn_tblock_ref's
 * contracts and bits; avx2 for head dims that are multiples of 8, avx512
 * for multiples of 16 (the block kernels return 0, and do nothing, for
 * other hd) */
void rb_attn_widen_avx2(uint32_t type, const void *const *rows, int np, int hd, float *out);
void rb_attn_widen_avx512(uint32_t type, const void *const *rows, int np, int hd, float *out);
int rb_attn_tblock_avx2(const float *kf, const float *vf, int np, int hd, int nq,
                        const float *qt, const int32_t *first, const int32_t *last, int32_t p0,
                        float kq_scale, float *st, float *kt, float *acc, float *m, float *l);
/* The block of a tile of up to RB_ATTN_TBLOCK_FEW queries (a decode),
 * from the K and V rows themselves (type_k, type_v: f16, q8_0, q4_0):
 * rb_attn_tblock_ref's results and bits for the first nq queries, kt its
 * scratch (hd x 64 floats); returns 0 (and does nothing) when hd is not a
 * multiple of 16 (avx512) or 8 (avx2), or nq is above RB_ATTN_TBLOCK_FEW */
#define RB_ATTN_TBLOCK_FEW 8
int rb_attn_tblock_few_avx2(uint32_t type_k, uint32_t type_v, const void *const *kr,
                            const void *const *vr, int np, int hd, int nq, const float *qt,
                            const int32_t *first, const int32_t *last, int32_t p0,
                            float kq_scale, float *kt, float *acc, float *m, float *l);
int rb_attn_tblock_few_avx512(uint32_t type_k, uint32_t type_v, const void *const *kr,
                              const void *const *vr, int np, int hd, int nq, const float *qt,
                              const int32_t *first, const int32_t *last, int32_t p0,
                              float kq_scale, float *kt, float *acc, float *m, float *l);
int rb_attn_tblock_avx512(const float *kf, const float *vf, int np, int hd, int nq,
                          const float *qt, const int32_t *first, const int32_t *last,
                          int32_t p0, float kq_scale, float *st, float *kt, float *acc,
                          float *m, float *l);
#endif

#if defined(__aarch64__)
/* rb_swiglu8_avx2's contract and bits, in NEON */
int64_t rb_swiglu8_neon(float *gate, const float *up, int64_t n);

/* attention.c's rb_attn_* in NEON (the same bits) */
float rb_attn_dot_f16_neon(const rb_f16 *q, const rb_f16 *k, int n);
void rb_attn_dot8_f16_neon(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8]);
void rb_attn_mad_f16_neon(rb_f16 *acc, const rb_f16 *v, float s, int n);
void rb_attn_scale_f16_neon(rb_f16 *acc, float s, int n);
void rb_attn_block8_f16_neon(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                             int n, float kq_scale, rb_f16 *acc, float *m, float *sum);
float rb_attn_dot_q8_0_neon(const void *k_row, const void *q_row, int n);
float rb_attn_dot_q4_0_neon(const void *k_row, const void *q_row, int n);
/* ops_dotprod.c: the two above with SDOT (dotprod tier only) */
float rb_attn_dot_q8_0_dotprod(const void *k_row, const void *q_row, int n);
float rb_attn_dot_q4_0_dotprod(const void *k_row, const void *q_row, int n);
/* attention.h's tiled form: rb_attn_widen_ref's and rb_attn_tblock_ref's
 * contracts and bits, for head dims that are multiples of 4 (the neon,
 * dotprod and i8mm tiers: no int8 product in them; the block kernel
 * returns 0, and does nothing, for other hd) */
void rb_attn_widen_neon(uint32_t type, const void *const *rows, int np, int hd, float *out);
int rb_attn_tblock_neon(const float *kf, const float *vf, int np, int hd, int nq,
                        const float *qt, const int32_t *first, const int32_t *last, int32_t p0,
                        float kq_scale, float *st, float *kt, float *acc, float *m, float *l);
/* y[i] = rb_attn_exp(x[i]) for i < n, the same bits: that block's 4-lane
 * exp, here for the tests (x and y may be the same array) */
void rb_attn_exp_f32_neon(const float *x, float *y, int64_t n);
#endif

#endif
