/*
 * quant.h - tensor element types: the traits table and the reference
 * quantizers.
 *
 * Every GGML tensor type rebound knows is one row of a traits table (block
 * size in elements, bytes per block, name); everything that dispatches per
 * type (the GGUF reader's size checks, `rebound info`, the quantizers, later
 * the matmul kernels) goes through it. The block structs below follow the
 * GGUF on-disk layout byte for byte (ggml's ggml-common.h), each with a
 * static_assert on its size, because the file format is the contract.
 *
 * Block layouts (QK_K = 256 elements per super-block for the K-quants):
 *
 *   Q4_0  [d:f16][qs:16]           32 elems, x = d * (q - 8)
 *   Q4_1  [d:f16][m:f16][qs:16]    32 elems, x = d * q + m
 *   Q5_0  [d:f16][qh:4][qs:16]     32 elems, x = d * (q - 16), bit 4 in qh
 *   Q5_1  [d:f16][m:f16][qh:4][qs:16]
 *   Q8_0  [d:f16][qs:32 int8]      32 elems, x = d * q
 *   Q2_K  [scales:16][qs:64][d:f16][dmin:f16]                   84 B
 *   Q3_K  [hmask:32][qs:64][scales:12][d:f16]                  110 B
 *   Q4_K  [d:f16][dmin:f16][scales:12][qs:128]                 144 B
 *         8 sub-blocks of 32; 6-bit scale and min per sub-block
 *   Q5_K  [d:f16][dmin:f16][scales:12][qh:32][qs:128]          176 B
 *   Q6_K  [ql:128][qh:64][scales:16 int8][d:f16]               210 B
 *         16 sub-blocks of 16; x = d * scale * (q - 32)
 *   Q8_K  [d:f32][qs:256 int8][bsums:16 int16]                 292 B
 *
 * Quantizers are the `_ref` scalar versions: deterministic, no SIMD, so that
 * a file made on one machine is byte-identical on another.
 */
#ifndef RB_QUANT_H
#define RB_QUANT_H

#include <stddef.h>
#include <stdint.h>

/* GGML type ids as stored in GGUF tensor infos (ggml.h enum ggml_type). */
typedef enum rb_type {
    RB_TYPE_F32 = 0,
    RB_TYPE_F16 = 1,
    RB_TYPE_Q4_0 = 2,
    RB_TYPE_Q4_1 = 3,
    RB_TYPE_Q5_0 = 6,
    RB_TYPE_Q5_1 = 7,
    RB_TYPE_Q8_0 = 8,
    RB_TYPE_Q8_1 = 9,
    RB_TYPE_Q2_K = 10,
    RB_TYPE_Q3_K = 11,
    RB_TYPE_Q4_K = 12,
    RB_TYPE_Q5_K = 13,
    RB_TYPE_Q6_K = 14,
    RB_TYPE_Q8_K = 15,
    RB_TYPE_IQ4_NL = 20,
    RB_TYPE_IQ4_XS = 23,
    RB_TYPE_I8 = 24,
    RB_TYPE_I16 = 25,
    RB_TYPE_I32 = 26,
    RB_TYPE_I64 = 27,
    RB_TYPE_F64 = 28,
    RB_TYPE_BF16 = 30,
    RB_TYPE_COUNT = 31 /* one past the largest id in the table */
} rb_type;

#define RB_QK4_0 32
#define RB_QK4_1 32
#define RB_QK5_0 32
#define RB_QK5_1 32
#define RB_QK8_0 32
#define RB_QK_K 256
#define RB_K_SCALE_SIZE 12

typedef uint16_t rb_f16;  /* IEEE half, stored bits */
typedef uint16_t rb_bf16; /* bfloat16, stored bits */

typedef struct { rb_f16 d; uint8_t qs[RB_QK4_0 / 2]; } rb_block_q4_0;
typedef struct { rb_f16 d; rb_f16 m; uint8_t qs[RB_QK4_1 / 2]; } rb_block_q4_1;
typedef struct { rb_f16 d; uint8_t qh[4]; uint8_t qs[RB_QK5_0 / 2]; } rb_block_q5_0;
typedef struct { rb_f16 d; rb_f16 m; uint8_t qh[4]; uint8_t qs[RB_QK5_1 / 2]; } rb_block_q5_1;
typedef struct { rb_f16 d; int8_t qs[RB_QK8_0]; } rb_block_q8_0;
typedef struct { rb_f16 d; rb_f16 s; int8_t qs[RB_QK8_0]; } rb_block_q8_1;
typedef struct { uint8_t scales[RB_QK_K / 16]; uint8_t qs[RB_QK_K / 4]; rb_f16 d; rb_f16 dmin; } rb_block_q2_K;
typedef struct { uint8_t hmask[RB_QK_K / 8]; uint8_t qs[RB_QK_K / 4]; uint8_t scales[12]; rb_f16 d; } rb_block_q3_K;
typedef struct { rb_f16 d; rb_f16 dmin; uint8_t scales[RB_K_SCALE_SIZE]; uint8_t qs[RB_QK_K / 2]; } rb_block_q4_K;
typedef struct { rb_f16 d; rb_f16 dmin; uint8_t scales[RB_K_SCALE_SIZE]; uint8_t qh[RB_QK_K / 8]; uint8_t qs[RB_QK_K / 2]; } rb_block_q5_K;
typedef struct { uint8_t ql[RB_QK_K / 2]; uint8_t qh[RB_QK_K / 4]; int8_t scales[RB_QK_K / 16]; rb_f16 d; } rb_block_q6_K;
typedef struct { float d; int8_t qs[RB_QK_K]; int16_t bsums[RB_QK_K / 16]; } rb_block_q8_K;

_Static_assert(sizeof(rb_block_q4_0) == 18, "q4_0 block layout");
_Static_assert(sizeof(rb_block_q4_1) == 20, "q4_1 block layout");
_Static_assert(sizeof(rb_block_q5_0) == 22, "q5_0 block layout");
_Static_assert(sizeof(rb_block_q5_1) == 24, "q5_1 block layout");
_Static_assert(sizeof(rb_block_q8_0) == 34, "q8_0 block layout");
_Static_assert(sizeof(rb_block_q8_1) == 36, "q8_1 block layout");
_Static_assert(sizeof(rb_block_q2_K) == 84, "q2_K block layout");
_Static_assert(sizeof(rb_block_q3_K) == 110, "q3_K block layout");
_Static_assert(sizeof(rb_block_q4_K) == 144, "q4_K block layout");
_Static_assert(sizeof(rb_block_q5_K) == 176, "q5_K block layout");
_Static_assert(sizeof(rb_block_q6_K) == 210, "q6_K block layout");
_Static_assert(sizeof(rb_block_q8_K) == 292, "q8_K block layout");

/* Quantize n floats (n a multiple of the block size) into dst. */
typedef void (*rb_quantize_row_fn)(const float *src, void *dst, int64_t n);
/* Dequantize n elements of src into floats. */
typedef void (*rb_dequantize_row_fn)(const void *src, float *dst, int64_t n);

typedef struct rb_type_traits {
    const char *name;        /* "Q4_K"; NULL for ids that are not types */
    uint32_t block_elems;    /* elements per block (1 for plain types) */
    uint32_t block_bytes;    /* bytes per block */
    int is_quantized;
    rb_quantize_row_fn quantize_row;     /* NULL: rebound cannot write this type */
    rb_dequantize_row_fn dequantize_row; /* NULL: rebound cannot read this type */
} rb_type_traits;

/* Traits of a type id, or NULL when the id is not a known type. */
const rb_type_traits *rb_type_get_traits(uint32_t type);

/* Name of a type id ("Q4_0"), or "unknown" when not known. */
const char *rb_type_name(uint32_t type);

/* Parses a type name, case-insensitive ("q4_0", "F16"); -1 when unknown. */
int rb_type_from_name(const char *name);

/*
 * Bytes of a row of n elements of a known type; 0 when n is not a multiple
 * of the block size or the type is unknown. 64-bit: callers check products.
 */
uint64_t rb_type_row_bytes(uint32_t type, uint64_t n);

/* Scalar conversions (round to nearest even; NaN and Inf preserved). The
 * _soft versions are portable bit manipulation; the inline ones use the
 * F16C instructions where the build targets them (one instruction instead
 * of ~20: attention converts every K and V element it reads), and give the
 * same bits (test_quant checks all 65536 halves, and the float to half
 * direction against _soft over a sweep of 2^32 / 4093 float bit patterns).
 * Not __fp16 on aarch64: gcc 12's cross compiler crashed vectorising a
 * loop of test_kvcodec.c with it (internal compiler error in
 * vect_transform_reduction); the vector kernels convert with FCVTN. */
rb_f16 rb_fp32_to_fp16_soft(float f);
float rb_fp16_to_fp32_soft(rb_f16 h);

#if defined(__F16C__)
#include <immintrin.h>
static inline rb_f16 rb_fp32_to_fp16(float f) { return (rb_f16)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }
static inline float rb_fp16_to_fp32(rb_f16 h) { return _cvtsh_ss(h); }
#else
/* the baseline build (no F16C: the vector kernels are in their own files):
 * half to float inline, the same bits as rb_fp16_to_fp32_soft (a call per
 * value was 17% of the KV codec's q8 round trip) */
static inline rb_f16 rb_fp32_to_fp16(float f) { return rb_fp32_to_fp16_soft(f); }
static inline float rb_fp16_to_fp32(rb_f16 h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    union { uint32_t u; float f; } v;
    if (e == 0x1f) {
        v.u = sign | 0x7f800000u | (m << 13);
    } else if (e != 0) {
        v.u = sign | ((e + 112u) << 23) | (m << 13);
    } else { /* zero or subnormal: m * 2^-24 is exact in f32 */
        v.f = (float)m * 0x1p-24f;
        v.u |= sign;
    }
    return v.f;
}
#endif
rb_bf16 rb_fp32_to_bf16(float f);
float rb_bf16_to_fp32(rb_bf16 h);

/* The reference quantizers and dequantizers, one per type rebound writes. */
void rb_quantize_row_f32_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_f16_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_bf16_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q4_0_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q4_1_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q5_0_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q5_1_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q8_0_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q4_K_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q5_K_ref(const float *src, void *dst, int64_t n);
void rb_quantize_row_q6_K_ref(const float *src, void *dst, int64_t n);

void rb_dequantize_row_f32(const void *src, float *dst, int64_t n);
void rb_dequantize_row_f16(const void *src, float *dst, int64_t n);
void rb_dequantize_row_bf16(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q4_0(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q4_1(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q5_0(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q5_1(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q8_0(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q4_K(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q5_K(const void *src, float *dst, int64_t n);
void rb_dequantize_row_q6_K(const void *src, float *dst, int64_t n);

#endif /* RB_QUANT_H */
