/*
 * kvcodec.h - the KV codec: one KV page in, one self-describing frame out,
 * and back. The compressed-in-RAM tier of the memory manager (DESIGN.md).
 *
 * A page is laid out as in kvcache.h (f16, n_kv = KV heads, P = tokens):
 *
 *   +---------------------------+---------------------------+
 *   | K [n_kv][P][head_dim_k]    | V [n_kv][P][head_dim_v]    |
 *   +---------------------------+---------------------------+
 *
 * Frame (all integers little-endian; 48-byte header, then the payload):
 *
 *   off size field
 *     0    4 magic "RBKV"
 *     4    1 version (1)
 *     5    1 codec (rb_kvcodec_id; the one actually used: a lossless
 *            request that would not shrink the page is stored as STORE)
 *     6    2 flags (0; anything else is rejected)
 *     8    4 n_tokens        12 4 n_kv_heads
 *    16    4 head_dim_k      20 4 head_dim_v
 *    24    8 payload_bytes (bytes after the header)
 *    32    8 checksum: rb_kvcodec_hash64 of the decoded page bytes (for a
 *            lossy codec: of the dequantized page the decoder produces)
 *    40    4 header check: low 32 bits of rb_kvcodec_hash64(bytes 0..39)
 *    44    4 reserved (0)
 *
 * Payloads: see kvcodec_lossless.c (LOSSLESS; its decoder in
 * kvcodec_lossless_dec.c) and kvcodec_quant.c (Q8, Q4, Q2); STORE is the
 * page bytes as they are.
 *
 * Contract for every function: pure (no global state, no allocation, no
 * I/O), thread-safe on distinct buffers, writes only into the buffers the
 * caller passes and never beyond the sizes given with them.
 */
#ifndef RB_KVCODEC_H
#define RB_KVCODEC_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "rebound.h"

#define RB_KVCODEC_HEADER_BYTES 48
#define RB_KVCODEC_VERSION 1
/* Group length of the lossy codecs (values sharing one min and scale). */
#define RB_KVCODEC_GROUP 64

typedef enum rb_kvcodec_id {
    RB_KVCODEC_STORE = 0,    /* the f16 bytes as they are */
    RB_KVCODEC_LOSSLESS = 1, /* bit-exact: entropy-coded sign+exponent, raw mantissa */
    RB_KVCODEC_Q8 = 2,       /* 8-bit asymmetric groups of 64 (KIVI layout) */
    RB_KVCODEC_Q4 = 3,       /* 4-bit, same layout */
    RB_KVCODEC_Q2 = 4,       /* 2-bit, same layout */
    RB_KVCODEC_COUNT
} rb_kvcodec_id;

/* The geometry of one page. Limits (else RB_E_INVALID_ARG): every field in
 * [1, 65536], head dims <= RB_KVCODEC_MAX_HEAD_DIM, page <= 2^32 values. */
#define RB_KVCODEC_MAX_HEAD_DIM 1024
typedef struct rb_kvcodec_dims {
    uint32_t n_tokens;   /* positions in the page (kvcache's page_tokens) */
    uint32_t n_kv_heads;
    uint32_t head_dim_k;
    uint32_t head_dim_v;
} rb_kvcodec_dims;

/* "store", "lossless", "q8", "q4", "q2"; "?" for an unknown id. */
const char *rb_kvcodec_name(rb_kvcodec_id codec);
/* The id for a name (also "8bit"/"4bit"/"2bit"); -1 when unknown. */
int rb_kvcodec_from_name(const char *name);

/* Checks dims against the limits above; RB_OK or RB_E_INVALID_ARG naming
 * the field. */
rb_status rb_kvcodec_check_dims(const rb_kvcodec_dims *dims, rb_error *err);

/* Elements and bytes of the decoded page; 0 for invalid dims. */
uint64_t rb_kvcodec_page_elems(const rb_kvcodec_dims *dims);
uint64_t rb_kvcodec_page_bytes(const rb_kvcodec_dims *dims);

/* The largest frame rb_kvcodec_encode can write for these dims and codec
 * (header included); 0 for invalid dims or codec. A destination of this
 * size never fails for lack of room. For the lossy codecs it is also the
 * exact frame size. */
uint64_t rb_kvcodec_bound(const rb_kvcodec_dims *dims, rb_kvcodec_id codec);

/*
 * Encodes one page into a frame.
 * page       rb_kvcodec_page_elems(dims) halves, read only.
 * dst        dst_size bytes; rb_kvcodec_bound() is always enough.
 * out_bytes  receives the frame size on success.
 * Errors: RB_E_INVALID_ARG (dims, codec, NULL buffers; a lossy codec given
 * an Inf or NaN: the message names head, position and channel - such a
 * page must be kept lossless), RB_E_BUDGET (dst_size below the frame
 * size). On failure *out_bytes is unchanged and dst's bytes unspecified.
 * A lossless request whose encoding would not be smaller than the page is
 * written as a STORE frame (the header says which).
 */
rb_status rb_kvcodec_encode(const rb_kvcodec_dims *dims, rb_kvcodec_id codec,
                            const rb_f16 *page, void *dst, size_t dst_size,
                            size_t *out_bytes, rb_error *err);

/*
 * Decodes a frame into a page of the given dims. src_size may exceed the
 * frame (trailing bytes are ignored: frames may sit in larger slots).
 * Everything is validated: magic, version, flags, header check, dims equal
 * to `dims`, codec known, payload within src_size and of the size its
 * codec implies, every table and stream in the payload, and the checksum
 * of what was decoded. Errors: RB_E_FORMAT (the message names the field or
 * the check: "kvcodec: frame truncated: ...", "checksum mismatch", "frame
 * is for 128 tokens x 4 heads x 64/64 dims, the page is ...", "unknown
 * codec 9"), RB_E_UNSUPPORTED (a newer version), RB_E_INVALID_ARG
 * (dst_elems below the page size, bad dims). Never reads outside
 * [src, src+src_size) nor writes outside [page, page+dst_elems); on
 * failure the page's contents are unspecified.
 */
rb_status rb_kvcodec_decode(const rb_kvcodec_dims *dims, const void *src, size_t src_size,
                            rb_f16 *page, size_t dst_elems, rb_error *err);

/* What a frame header says, after the header checks (not the payload). */
typedef struct rb_kvcodec_frame_info {
    rb_kvcodec_id codec;
    rb_kvcodec_dims dims;
    uint64_t payload_bytes;
    uint64_t frame_bytes;   /* header + payload */
    uint64_t checksum;
} rb_kvcodec_frame_info;

rb_status rb_kvcodec_frame_info_get(const void *src, size_t src_size,
                                    rb_kvcodec_frame_info *out, rb_error *err);

/*
 * The empirical limit of the lossless model: for every channel
 * (head, dim) of K and of V, the order-0 entropy of its 6 sign+exponent
 * bits over the page's tokens, plus 10 raw mantissa bits per value.
 * Tables and framing are free in this bound; the codec pays for them.
 */
typedef struct rb_kvcodec_entropy_info {
    uint64_t n_values;
    double sign_exp_bits;   /* sum over channels of count x H(channel) */
    double mantissa_bits;   /* 10 x n_values */
    double bound_bytes;     /* (sign_exp_bits + mantissa_bits) / 8 */
    double bound_ratio;     /* page bytes / bound_bytes */
} rb_kvcodec_entropy_info;

rb_status rb_kvcodec_entropy(const rb_kvcodec_dims *dims, const rb_f16 *page,
                             rb_kvcodec_entropy_info *out, rb_error *err);

/*
 * rb_kvcodec_hash64: the frame checksum. 4 lanes of 64 bits over 32-byte
 * stripes (x = data ^ key; lane += lo32(x) * hi32(x); neighbour lane +=
 * data), lanes scrambled every 512 bytes so that order matters, length and
 * lanes folded at the end. 37 GB/s on one AVX2 core over a cached 32 KiB
 * buffer (EPYC, CPU time), several times the decoders' speed, so it runs
 * over every decoded page. Streaming form for
 * decoders that produce a page piece by piece; both forms give the same
 * value for the same bytes however they are split.
 */
typedef struct rb_kvcodec_hash {
    uint64_t acc[4];
    uint64_t n_stripes;     /* full stripes absorbed */
    uint64_t total_bytes;
    uint8_t buf[32];
    uint32_t buf_len;
} rb_kvcodec_hash;

void rb_kvcodec_hash_init(rb_kvcodec_hash *h);
void rb_kvcodec_hash_update(rb_kvcodec_hash *h, const void *data, size_t n);
uint64_t rb_kvcodec_hash_final(const rb_kvcodec_hash *h);
uint64_t rb_kvcodec_hash64(const void *data, size_t n);

/* ---- kernels (exposed for the tests: each ISA variant beside its _ref) -- */

/* Stripe absorption: count 32-byte stripes starting at global stripe
 * index `first` (which decides the keys and where scrambles fall). */
void rb_kvcodec_hash_stripes_ref(uint64_t acc[4], uint64_t first, const uint8_t *p,
                                 size_t count);
#if defined(__x86_64__) /* kvcodec_avx2.c; run only where rb_cpu_tier_available(RB_CPU_TIER_AVX2) */
void rb_kvcodec_hash_stripes_avx2(uint64_t acc[4], uint64_t first, const uint8_t *p,
                                  size_t count);
/* kvcodec_avx512.c; run only where rb_cpu_tier_available(RB_CPU_TIER_AVX512) */
void rb_kvcodec_hash_stripes_avx512(uint64_t acc[4], uint64_t first, const uint8_t *p,
                                    size_t count);
#elif defined(__aarch64__) /* kvcodec_neon.c; any aarch64 (NEON is its floor) */
void rb_kvcodec_hash_stripes_neon(uint64_t acc[4], uint64_t first, const uint8_t *p,
                                  size_t count);
#endif

/* Dequantizes n packed values (bits 8, 4 or 2; packing in kvcodec_quant.c)
 * to f16: out[i] = f16(m + s * q[i]) computed in float, multiply then add,
 * no fused multiply-add, so every variant gives the same bits. per_elem:
 * m[i], s[i] per value (a K row: per-channel groups); else m[i / 64],
 * s[i / 64] (a V row: groups of 64 along the row). */
void rb_kvcodec_dequant_ref(const uint8_t *q, size_t n, int bits, const float *m,
                            const float *s, int per_elem, rb_f16 *out);
#if defined(__x86_64__) /* kvcodec_avx2.c; run only where rb_cpu_tier_available(RB_CPU_TIER_AVX2) */
void rb_kvcodec_dequant_avx2(const uint8_t *q, size_t n, int bits, const float *m,
                             const float *s, int per_elem, rb_f16 *out);
/* kvcodec_avx512.c; run only where rb_cpu_tier_available(RB_CPU_TIER_AVX512) */
void rb_kvcodec_dequant_avx512(const uint8_t *q, size_t n, int bits, const float *m,
                               const float *s, int per_elem, rb_f16 *out);
#elif defined(__aarch64__) /* kvcodec_neon.c; any aarch64 (NEON is its floor) */
void rb_kvcodec_dequant_neon(const uint8_t *q, size_t n, int bits, const float *m,
                             const float *s, int per_elem, rb_f16 *out);
#endif

#if defined(__x86_64__) /* kvcodec_avx512.c; run only where rb_cpu_tier_available(RB_CPU_TIER_AVX512) */
/* rb_kvcodec_dequant_avx512 of n values into out, and out absorbed into h
 * (the same bits and hash as dequant then rb_kvcodec_hash_update): from
 * the registers when n is a multiple of 32 and of the packing's chunk and
 * h is at an even stripe, else in those two steps. */
void rb_kvcodec_dequant_absorb_avx512(const uint8_t *q, size_t n, int bits, const float *m,
                                      const float *s, int per_elem, rb_f16 *out,
                                      rb_kvcodec_hash *h);
#endif

/* Lossless mantissa merge: out[i] = (top[i] & 0xfc00) | hi2(i) << 8 | lo8[i]
 * over n values (top may be out: in place; hi2 packing in
 * kvcodec_lossless.c), absorbing the result into h. */
void rb_kvcodec_merge_ref(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8, const uint8_t *hi2,
                          size_t n, rb_kvcodec_hash *h);
#if defined(__x86_64__) /* kvcodec_avx2.c; run only where rb_cpu_tier_available(RB_CPU_TIER_AVX2) */
void rb_kvcodec_merge_avx2(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8, const uint8_t *hi2,
                           size_t n, rb_kvcodec_hash *h);
/* kvcodec_avx512.c; run only where rb_cpu_tier_available(RB_CPU_TIER_AVX512) */
void rb_kvcodec_merge_avx512(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8,
                             const uint8_t *hi2, size_t n, rb_kvcodec_hash *h);
#elif defined(__aarch64__) /* kvcodec_neon.c; any aarch64 (NEON is its floor) */
void rb_kvcodec_merge_neon(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8, const uint8_t *hi2,
                           size_t n, rb_kvcodec_hash *h);
#endif

/* encode/decode with the _ref kernels only: the tests check that they give
 * the same frames and pages as the dispatched kernels. */
rb_status rb_kvcodec_encode_ref(const rb_kvcodec_dims *dims, rb_kvcodec_id codec,
                                const rb_f16 *page, void *dst, size_t dst_size,
                                size_t *out_bytes, rb_error *err);
rb_status rb_kvcodec_decode_ref(const rb_kvcodec_dims *dims, const void *src, size_t src_size,
                                rb_f16 *page, size_t dst_elems, rb_error *err);

#endif
