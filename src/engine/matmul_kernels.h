/*
 * matmul_kernels.h - internal: the per-ISA kernel tables behind matmul.h.
 *
 * Two kinds of kernel, each with a scalar `_ref` version (matmul_ref.c) and
 * AVX2+FMA+F16C (matmul_avx2.c) / NEON (matmul_neon.c) versions:
 *
 *   act   converts a row of floats to the activation type of a weight type
 *         (F32 copy, F16, BF16, Q8_0, Q8_1, Q8_K), indexed by the ACTIVATION type.
 *   tile  dot products of up to RB_TILE_MAX weight rows with up to
 *         RB_TILE_MAX activation rows, indexed by the WEIGHT type:
 *           y[t * y_stride + r] = dot(w row r, act row t)
 *         A vec_dot is a 1 x 1 tile.
 *
 * Determinism rule every tile obeys: the result for (r, t) is computed by
 * the same sequence of float operations whatever n_rows / n_tok the tile
 * was called with (one accumulator chain per (r, t), the same horizontal
 * sum). So rb_matmul gives bit-identical outputs for any thread count,
 * chunking or tiling, and a token's logits do not depend on whether it was
 * decoded alone or in a prefill batch. Different ISAs differ in float
 * summation order (not in the integer sums, which are exact).
 *
 * n_cols: a multiple of the weight block size (32 or 256); F32/F16/BF16
 * accept any n_cols.
 */
#ifndef RB_MATMUL_KERNELS_H
#define RB_MATMUL_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "quant.h"

/* Which kernel files the build has (each compiled with its own flags, see
 * CMakeLists.txt; cpu.h says which tier runs them). */
#if defined(__x86_64__)
#define RB_MATMUL_HAVE_X86 1
#endif
#if defined(__aarch64__)
#define RB_MATMUL_HAVE_ARM64 1
#endif

#define RB_TILE_MAX 4

typedef void (*rb_act_fn)(const float *x, void *dst, int64_t n);
typedef void (*rb_tile_fn)(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,
                           const void *act, size_t act_row_bytes, int n_tok, float *y,
                           int64_t y_stride);

/*
 * gemm: prefill of a whole panel of up to RB_GEMM_ROWS weight rows against
 * n_tok activation rows, for the weight types an ISA has one for. Before
 * the panels run, `side` converts the activation rows' per-block values
 * that every panel shares (for token t, block b: d[t * nb + b] = the
 * block's scale as a float, corr[(t * nb + b) * corr_lanes ...] the
 * integer correction of the kernel's unsigned weight codes); the panel
 * kernel repacks its rows into `scratch` (RB_GEMM_SCRATCH(n_cols) bytes,
 * 64-aligned) and writes y[t * y_stride + r] for r < n_rows, t < n_tok.
 * Same determinism rule as the tiles: every output is computed by the float
 * operations of the tile kernels of its table, bit for bit.
 */
#define RB_GEMM_ROWS 32
#define RB_GEMM_SCRATCH(n_cols) ((size_t)(n_cols) * 2 * RB_GEMM_ROWS + 64)

typedef void (*rb_gemm_side_fn)(const void *act, size_t act_row_bytes, int64_t n_cols,
                                int64_t t0, int64_t t1, float *d, int32_t *corr);
typedef void (*rb_gemm_fn)(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,
                           const void *act, size_t act_row_bytes, int64_t n_tok,
                           const float *side_d, const int32_t *side_corr, float *y,
                           int64_t y_stride, void *scratch);

/* gemv: decode (one token) of n_rows consecutive weight rows, y[r] for
 * r < n_rows; the same bits as the type's tile with n_tok = 1. */
typedef void (*rb_gemv_fn)(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,
                           const void *act, float *y);

/* few: one decode step of several sequences, 2 <= n_tok <= RB_FEW_MAX
 * activation rows against n_rows consecutive weight rows, y[t * y_stride +
 * r]; each weight block is loaded once for all the tokens, and every output
 * has the bits of the type's tile (and so of the one-token gemv). */
#define RB_FEW_MAX 8
typedef void (*rb_few_fn)(int64_t n_cols, const void *w, size_t w_row_bytes, int n_rows,
                          const void *act, size_t act_row_bytes, int n_tok, float *y,
                          int64_t y_stride);

typedef struct rb_matmul_isa {
    const char *name;                 /* "ref", "avx2", "vnni", "avx512", "neon", "dotprod",
                                         "i8mm" */
    rb_act_fn act[RB_TYPE_COUNT];     /* by activation type; NULL: none */
    rb_tile_fn tile[RB_TYPE_COUNT];   /* by weight type; NULL: unsupported */
    rb_gemv_fn gemv[RB_TYPE_COUNT];   /* by weight type; NULL: tiles only */
    rb_gemm_fn gemm[RB_TYPE_COUNT];   /* by weight type; NULL: tiles only */
    rb_few_fn few[RB_TYPE_COUNT];     /* by weight type; NULL: tiles only */
    rb_gemm_side_fn gemm_side[RB_TYPE_COUNT];
    int gemm_corr_lanes[RB_TYPE_COUNT];
    int decode_rows;                  /* rows per tile when n_tok == 1 */
    int prefill_rows, prefill_toks;   /* tile shape when n_tok > 1 */
} rb_matmul_isa;

extern const rb_matmul_isa rb_matmul_isa_ref;
#ifdef RB_MATMUL_HAVE_X86
extern const rb_matmul_isa rb_matmul_isa_avx2;   /* matmul_avx2.c */
extern const rb_matmul_isa rb_matmul_isa_vnni;   /* matmul_avx2.c built with VNNI */
extern const rb_matmul_isa rb_matmul_isa_avx512_own; /* matmul_avx512.c: its own kernels */
#endif
#ifdef RB_MATMUL_HAVE_ARM64
extern const rb_matmul_isa rb_matmul_isa_neon;    /* matmul_neon.c, armv8-a */
extern const rb_matmul_isa rb_matmul_isa_dotprod; /* the same, built with +dotprod */
extern const rb_matmul_isa rb_matmul_isa_i8mm;    /* ... with +dotprod+i8mm (matmul_i8mm.c) */
#endif

/* The table of a tier (cpu.h), NULL when this build has none; the avx512
 * table is the vnni one with matmul_avx512.c's kernels in place of its. */
const rb_matmul_isa *rb_matmul_isa_for_tier(int tier);

/* The table rb_matmul uses: the tier in use (rb_cpu_tier). */
const rb_matmul_isa *rb_matmul_isa_best(void);

/* ---- reference kernels (matmul_ref.c), also the scalar building blocks -- */

/* ggml's quantize_row_q8_K_ref: per 256 block the value of largest
 * magnitude (first one on ties) max, iscale = -127 / max, codes
 * nearest-even(iscale * x) capped at 127, d = 1 / iscale, bsums of 16. */
void rb_quantize_act_q8_K_ref(const float *x, void *dst, int64_t n);
void rb_quantize_act_f32_ref(const float *x, void *dst, int64_t n);

void rb_quantize_act_q8_0_ref(const float *x, void *dst, int64_t n);
/* Q8_0's codes and d, plus s = fp16(d * sum of the codes) (for Q4_1) */
void rb_quantize_act_q8_1_ref(const float *x, void *dst, int64_t n);

/* ggml's nearest_int: ties to even, |v| < 2^22, via the float magic
 * number (1.5 * 2^23): adding it leaves the rounded integer in the low
 * mantissa bits */
static inline int rb_nearest_int(float v)
{
    float t = v + 12582912.0f;
    int32_t i;
    memcpy(&i, &t, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

float rb_vec_dot_q4_0_q8_0_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_q5_0_q8_0_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_q8_0_q8_0_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_q4_K_q8_K_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_q6_K_q8_K_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_q5_K_q8_K_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_q4_1_q8_1_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_q5_1_q8_1_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_f32_f32_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_f16_f16_ref(int64_t n, const void *w, const void *a);
float rb_vec_dot_bf16_bf16_ref(int64_t n, const void *w, const void *a);

/* The 6-bit scales and mins of a Q4_K / Q5_K super-block, unpacked. */
/* the same values as four words: bytes 0..7 the scales, 8..15 the mins
 * (ggml's kmask arithmetic), for the kernels that load them as a vector */
static inline void rb_k4_scales_mins_u32(const uint8_t q[RB_K_SCALE_SIZE], uint32_t u[4])
{
    memcpy(u, q, 12);
    u[3] = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
    const uint32_t u1 = u[1] & 0x3f3f3f3fu;
    u[1] = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
    u[2] = u1;
    u[0] &= 0x3f3f3f3fu;
}

static inline void rb_k4_scales_mins(const uint8_t q[RB_K_SCALE_SIZE], uint8_t sc[8],
                                     uint8_t m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 0x0f) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

#endif
