/*
 * matmul.h - the compute kernels of the forward pass: weight-row dot
 * products against quantized activations, and the threaded matrix-vector /
 * matrix-matrix driver.
 *
 * Each weight type has a "vec_dot type" that activations are converted to
 * before the dot products (llama.cpp's choice, so that results agree with
 * it within the golden bounds): F32 -> F32, F16 -> F16, BF16 -> BF16,
 * Q4_0 / Q8_0 / Q5_0 -> Q8_0, Q4_1 / Q5_1 -> Q8_1, Q4_K / Q5_K / Q6_K -> Q8_K.
 * A weight matrix is stored as in GGUF: n_rows rows of n_cols elements,
 * row-major, each row rb_type_row_bytes(type, n_cols) bytes.
 *
 * Every kernel has a scalar `_ref` version and, per ISA level, versions in
 * files of their own (AVX2, its VNNI build, AVX-512; NEON and its dotprod
 * build), each compiled with that level's flags; the table of the tier in
 * use (cpu.h: detected once, REBOUND_CPU caps it) runs, and the tests
 * compare every tier the CPU has with _ref.
 */
#ifndef RB_MATMUL_H
#define RB_MATMUL_H

#include <stddef.h>
#include <stdint.h>

#include "threadpool.h"

/* 1 when rebound can compute with weights of this type. */
int rb_matmul_supports(uint32_t w_type);

/* The activation type used with weights of w_type, and its row bytes. */
uint32_t rb_matmul_act_type(uint32_t w_type);
size_t rb_matmul_act_row_bytes(uint32_t w_type, int64_t n_cols);

/* Converts one activation row of n_cols floats for use with w_type. */
void rb_matmul_quantize_act(uint32_t w_type, const float *x, void *dst, int64_t n_cols);

/* Dot product of one weight row with one converted activation row. */
float rb_matmul_vec_dot(uint32_t w_type, const void *w_row, const void *act_row,
                        int64_t n_cols);

/*
 * y[t][r] = sum_c W[r][c] * x[t][c] for t < n_tokens, r < n_rows.
 *   w       weight rows (w_type), n_rows x n_cols
 *   act     n_tokens activation rows already converted with
 *           rb_matmul_quantize_act (act_stride bytes apart)
 *   y       n_tokens rows of n_rows floats (y_stride floats apart)
 * Split across the pool's workers by rows; for n_tokens > 1 each weight
 * block is used for several tokens while it is in cache (prefill).
 */
void rb_matmul(rb_threadpool *pool, uint32_t w_type, const void *w, int64_t n_rows,
               int64_t n_cols, const void *act, size_t act_stride, int64_t n_tokens,
               float *y, int64_t y_stride);

#endif
