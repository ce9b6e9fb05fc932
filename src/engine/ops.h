/*
 * ops.h - the element-wise and per-row operations of the forward pass
 * (everything that is not a matrix product): RMSNorm, RoPE, SwiGLU, softmax.
 * Each follows llama.cpp's arithmetic (what the golden logits were made
 * with): RMSNorm sums squares in double, RoPE builds its angles by repeated
 * multiplication of theta_scale in float.
 */
#ifndef RB_OPS_H
#define RB_OPS_H

#include <stdint.h>

/* y = x / sqrt(mean(x^2) + eps) * w (w may be NULL: no weight); y may be x. */
void rb_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps);
/* rb_rmsnorm of `rows` rows stride floats apart (y's rows at the same
 * stride; y may be x): the same bits, four rows' sums interleaved so that
 * their in-order double chains overlap. */
void rb_rmsnorm_rows(float *y, const float *x, const float *w, int64_t n, int64_t rows,
                     int64_t stride, float eps);

/* RoPE variants: NORM rotates adjacent pairs (x[2i], x[2i+1]) (llama);
 * NEOX rotates (x[i], x[i + n_rot/2]) (qwen2, qwen3). */
enum { RB_ROPE_NORM = 0, RB_ROPE_NEOX = 2 };

typedef struct rb_rope {
    int mode;               /* RB_ROPE_NORM or RB_ROPE_NEOX */
    int n_rot;              /* rotated dims per head (even) */
    float freq_base;
    float freq_scale;       /* 1 / linear scaling factor (1 when none) */
    const float *freq_factors; /* n_rot/2 divisors (llama3 rope_freqs) or NULL */
} rb_rope;

/* Rotates n_heads heads of head_dim floats at x, for position pos:
 * rb_rope_angles then rb_rope_rotate. */
void rb_rope_apply(const rb_rope *r, float *x, int n_heads, int head_dim, int64_t pos);
/* The n_rot/2 angles' cosines and sines of position pos (ggml's rope
 * cache: the same bits). A position's Q and K heads share them. */
void rb_rope_angles(const rb_rope *r, int64_t pos, float *cos_t, float *sin_t);
/* Rotates n_heads heads by the angles of rb_rope_angles (ggml's contracted
 * products; the vector tiers give the same bits). */
void rb_rope_rotate(const rb_rope *r, float *x, int n_heads, int head_dim, const float *cos_t,
                    const float *sin_t);
/* The most rotated dims a head may have (checked when binding weights). */
#define RB_ROPE_MAX_ROT 1024

/* gate[i] = silu(gate[i]) * up[i] over ONE row of n (llama.cpp's
 * rounding depends on where the row starts: call it per token). */
void rb_swiglu(float *gate, const float *up, int64_t n);

/* gate[i] = gelu(gate[i]) * up[i], llama.cpp's GeGLU: the tanh form of
 * GELU looked up in a table of f16 results indexed by the f16 of the input
 * (exactly 0 at or below -10, the input itself at or above 10). The table
 * (128 KiB) is built on first use; thread-safe. */
void rb_geglu(float *gate, const float *up, int64_t n);

/* x = cap * tanh(x / cap), llama.cpp's final logit softcapping. */
void rb_softcap(float *x, int64_t n, float cap);

/* x = softmax(x) in place over n values; returns nothing. */
void rb_softmax(float *x, int64_t n);

#endif
