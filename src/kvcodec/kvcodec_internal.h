/*
 * kvcodec_internal.h - what kvcodec.c (frames, hash, dispatch) shares with
 * the payload coders kvcodec_lossless.c and kvcodec_quant.c. Not for use
 * outside the kvcodec module.
 */
#ifndef RB_KVCODEC_INTERNAL_H
#define RB_KVCODEC_INTERNAL_H

#include <string.h>

#include "kvcodec.h"

#define RB_KV_ALIGN32 __attribute__((aligned(32)))

/* One set of kernels: the best the build has, or the _ref ones. */
typedef struct rb_kvcodec_kernels rb_kvcodec_kernels;
struct rb_kvcodec_kernels {
    void (*hash_stripes)(uint64_t acc[4], uint64_t first, const uint8_t *p, size_t count);
    void (*dequant)(const uint8_t *q, size_t n, int bits, const float *m, const float *s,
                    int per_elem, rb_f16 *out);
    void (*merge)(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8, const uint8_t *hi2,
                  size_t n, rb_kvcodec_hash *h);
    /* the lossless payload decoder (rb_kvcodec_lossless_decode below), the
     * same code built for the set's ISA (kvcodec_lossless_dec_avx2.c) */
    /* the lossy payload coders (rb_kvcodec_quant_encode / _decode below) */
    rb_status (*quant_encode)(const rb_kvcodec_dims *d, int bits, const rb_f16 *page,
                              uint8_t *dst, rb_kvcodec_hash *h, const rb_kvcodec_kernels *k,
                              rb_error *err);
    void (*quant_decode)(const rb_kvcodec_dims *d, int bits, const uint8_t *src, rb_f16 *page,
                         rb_kvcodec_hash *h, const rb_kvcodec_kernels *k);
    rb_status (*lossless_decode)(const rb_kvcodec_dims *d, const uint8_t *src, size_t n,
                                 rb_f16 *page, rb_kvcodec_hash *h, const rb_kvcodec_kernels *k,
                                 rb_error *err);
};

extern const rb_kvcodec_kernels rb_kvcodec_kernels_ref;
#if defined(__x86_64__)
extern const rb_kvcodec_kernels rb_kvcodec_kernels_avx2; /* kvcodec_avx2.c */
extern const rb_kvcodec_kernels rb_kvcodec_kernels_avx512; /* kvcodec_avx512.c */
#elif defined(__aarch64__)
extern const rb_kvcodec_kernels rb_kvcodec_kernels_neon; /* kvcodec_neon.c */
#endif
/* The set the tier in use runs (cpu.h). */
const rb_kvcodec_kernels *rb_kvcodec_kernels_get(void);

void rb_kvcodec_hash_update_k(rb_kvcodec_hash *h, const void *data, size_t n,
                              const rb_kvcodec_kernels *k);

/* Lossless payload. encode: returns the payload bytes written, or 0 when
 * the payload would reach `cap` bytes (the caller then stores the page).
 * decode: fills the page and absorbs it into h; RB_E_FORMAT on any
 * inconsistency. */
size_t rb_kvcodec_lossless_encode(const rb_kvcodec_dims *d, const rb_f16 *page, uint8_t *dst,
                                  size_t cap);
rb_status rb_kvcodec_lossless_decode(const rb_kvcodec_dims *d, const uint8_t *src, size_t n,
                                     rb_f16 *page, rb_kvcodec_hash *h,
                                     const rb_kvcodec_kernels *k, rb_error *err);
#if defined(__x86_64__)
rb_status rb_kvcodec_lossless_decode_avx2(const rb_kvcodec_dims *d, const uint8_t *src, size_t n,
                                          rb_f16 *page, rb_kvcodec_hash *h,
                                          const rb_kvcodec_kernels *k, rb_error *err);
#endif

/* Shared by the lossless encoder and decoder (the format is described in
 * kvcodec_lossless.c). */
#define RB_KVLL_MAXLEN 7 /* longest code: 7-bit table peeks, 8 symbols a load */
#define RB_KVLL_NSYM 64  /* sign + 5 exponent bits */
/* The payload's first byte: 3 is written; 2 (a stream per CLUSTERED
 * channel) is still read, for frames already on disk; payloads before 2
 * had none. */
#define RB_KVLL_VERSION 3
#define RB_KVLL_VERSION_MIN 2
#define RB_KVLL_CHUNK 128 /* channels clustered together */
#define RB_KVLL_KMAX 32   /* codes per chunk */
enum { RB_KVLL_CLUSTERED = 0, RB_KVLL_SHARED = 1 };
/* Version 3's CLUSTERED streams: stream j (j < min(8, nc)) holds chunk
 * channels j, j + 8, j + 16, ... back to back; its bytes at most those of
 * its symbols at MAXLEN bits each. */
static inline uint64_t rb_kvll_stream_max_bytes(uint32_t nc, uint32_t j, uint32_t P)
{
    return ((uint64_t)(nc - j + 7) / 8 * P * RB_KVLL_MAXLEN + 7) / 8;
}

static inline unsigned rb_kvll_bit_width(uint64_t v)
{
    unsigned w = 0;
    for (; v; v >>= 1)
        w++;
    return w;
}

/* Lossy payloads (bits 8, 4, 2): exact sizes, encode computing the hash of
 * the page the decoder will produce. */
uint64_t rb_kvcodec_quant_payload_bytes(const rb_kvcodec_dims *d, int bits);
rb_status rb_kvcodec_quant_encode(const rb_kvcodec_dims *d, int bits, const rb_f16 *page,
                                  uint8_t *dst, rb_kvcodec_hash *h,
                                  const rb_kvcodec_kernels *k, rb_error *err);
/* dequantization of values from..n-1 (rb_kvcodec_dequant_ref's rule): the
 * scalar tail of the vector kernels */
void rb_kvcodec_dequant_tail(const uint8_t *q, size_t n, int bits, const float *m,
                             const float *s, int per_elem, rb_f16 *out, size_t from);

/* bit pair i of the lossless coder's hi2 array of n values */
static inline unsigned rb_kv_hi2_at(const uint8_t *hi2, size_t n, size_t i)
{
    const size_t full = n / 32;
    if (i < full * 32)
        return (hi2[i / 32 * 8 + (i & 7)] >> (2 * ((i & 31) >> 3))) & 3;
    size_t k = i - full * 32;
    return (hi2[full * 8 + k / 4] >> (2 * (k % 4))) & 3;
}

void rb_kvcodec_quant_decode(const rb_kvcodec_dims *d, int bits, const uint8_t *src,
                             rb_f16 *page, rb_kvcodec_hash *h, const rb_kvcodec_kernels *k);
#if defined(__x86_64__) /* kvcodec_quant_avx2.c: the same code built for the avx2 set */
rb_status rb_kvcodec_quant_encode_avx2(const rb_kvcodec_dims *d, int bits, const rb_f16 *page,
                                       uint8_t *dst, rb_kvcodec_hash *h,
                                       const rb_kvcodec_kernels *k, rb_error *err);
void rb_kvcodec_quant_decode_avx2(const rb_kvcodec_dims *d, int bits, const uint8_t *src,
                                  rb_f16 *page, rb_kvcodec_hash *h, const rb_kvcodec_kernels *k);
/* kvcodec_quant_avx512.c: the decoder built for the avx512 set, each row
 * dequantized and hashed at once (rb_kvcodec_dequant_absorb_avx512) */
void rb_kvcodec_quant_decode_avx512(const rb_kvcodec_dims *d, int bits, const uint8_t *src,
                                    rb_f16 *page, rb_kvcodec_hash *h, const rb_kvcodec_kernels *k);
#endif

/* The hash's stripe keys (16 x 4), lane seeds (4), final keys (4). */
extern const uint64_t rb_kvcodec_hash_keys[72];

#if defined(__AVX2__)
#include <immintrin.h>

/* Absorbs stripe d, global stripe index idx, into the four lanes a (the
 * AVX2 form of rb_kvcodec_hash_stripes_ref's step; decoders that hold a
 * decoded stripe in a register hash it without storing and reloading). */
static inline __m256i rb_kv_absorb_avx2(__m256i a, __m256i d, uint64_t idx)
{
    __m256i k = _mm256_load_si256((const __m256i *)(rb_kvcodec_hash_keys + (idx & 15) * 4));
    __m256i x = _mm256_xor_si256(d, k);
    __m256i prod = _mm256_mul_epu32(x, _mm256_srli_epi64(x, 32));
    __m256i sw = _mm256_shuffle_epi32(d, _MM_SHUFFLE(1, 0, 3, 2)); /* w[l ^ 1] */
    a = _mm256_add_epi64(a, _mm256_add_epi64(prod, sw));
    if ((idx & 15) == 15) { /* scramble: fold, key, multiply by the 32-bit prime */
        const __m256i prime = _mm256_set1_epi64x(0x9E3779B1);
        a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const __m256i *)(rb_kvcodec_hash_keys + 64)));
        __m256i lo = _mm256_mul_epu32(a, prime);
        __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), prime);
        a = _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
    }
    return a;
}
#endif

static inline uint16_t rb_kv_rd16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline void rb_kv_wr16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline uint64_t rb_kv_load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only: x86-64 and aarch64 */
    return v;
}

#endif
