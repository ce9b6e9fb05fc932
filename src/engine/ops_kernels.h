/*
 * ops_kernels.h - internal: the AVX2 bodies of ops.c's SwiGLU and of
 * attention.c's f16 loops (ops_avx2.c, the one file of them compiled with
 * -mavx2 -mfma -mf16c). Callers run them only where rb_cpu_tier() is an x86
 * vector tier (cpu.h); each gives the bits of the portable form beside its
 * caller except where that says otherwise.
 */
#ifndef RB_OPS_KERNELS_H
#define RB_OPS_KERNELS_H

#include <stdint.h>

#include "quant.h"

#if defined(__x86_64__)
/* gate[i] = silu(gate[i]) * up[i] for the first n - n % 8 values, in
 * ggml's vector exp; returns how many it did */
int64_t rb_swiglu8_avx2(float *gate, const float *up, int64_t n);

/* attention.c's rb_attn_* in AVX2 (the same bits) */
float rb_attn_dot_f16_avx2(const rb_f16 *q, const rb_f16 *k, int n);
void rb_attn_dot8_f16_avx2(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8]);
void rb_attn_mad_f16_avx2(rb_f16 *acc, const rb_f16 *v, float s, int n);
void rb_attn_scale_f16_avx2(rb_f16 *acc, float s, int n);
void rb_attn_block8_f16_avx2(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                             int n, float kq_scale, rb_f16 *acc, float *m, float *sum);
#endif

#endif
