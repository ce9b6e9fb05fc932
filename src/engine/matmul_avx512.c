/*
 * matmul_avx512.c - 512-bit kernels (AVX-512 F/BW/VL/DQ + VNNI; this file
 * alone is compiled with those flags). The avx512 tier runs these where
 * they exist and the vnni build of matmul_avx2.c's kernels elsewhere
 * (matmul.c merges the tables).
 *
 * Two blocks per register: a zmm holds the 32 codes of block b in its low
 * half and those of block b + 1 in its high half, so one vpdpbusd does the
 * integer products of two blocks. The float arithmetic after the integers
 * is matmul_avx2.c's, in its order, block by block:
 *   Q8_0  int32 lane l of a block = sum of its codes 4l..4l+3 times the
 *         activation's (the same lanes as the AVX2 kernel: (q + 128) * a
 *         by vpdpbusd, minus 128 * sum(a), exact), then per block
 *         acc = fma(dw * da, float(lanes), acc) on 8 float lanes, hsum8.
 *   Q4_0  the exact integer of each block, into llama.cpp's repacked-gemv
 *         chains acc = fma(float(isum), dw * da, acc), one per output.
 * So the avx512 tier's results are the avx2 tier's bit for bit (and
 * llama.cpp's golden logits): test_matmul and test_golden check it.
 */
#include "matmul_kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <stdalign.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#define RB_INLINE static inline __attribute__((always_inline))
#define RB_FOR(i, n) _Pragma("GCC unroll 4") for (int i = 0; i < (n); i++)
#define RB_FOR8(i, n) _Pragma("GCC unroll 8") for (int i = 0; i < (n); i++)

RB_INLINE float rb_h2f(rb_f16 h) { return _cvtsh_ss(h); }

RB_INLINE float rb_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* the 32 bytes of two blocks' codes: block b low, b + 1 high (hi may be NULL
 * for a lone last block: zeros) */
RB_INLINE __m512i rb_load2x32(const void *lo, const void *hi)
{
    const __m512i l = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo));
    return hi ? _mm512_inserti64x4(l, _mm256_loadu_si256((const __m256i *)hi), 1) : l;
}

/* 32 4-bit codes of two Q4_0 blocks as bytes in element order */
RB_INLINE __m512i rb_nibbles2x32(const uint8_t *qs0, const uint8_t *qs1)
{
    const __m128i r0 = _mm_loadu_si128((const __m128i *)qs0);
    const __m128i r1 = qs1 ? _mm_loadu_si128((const __m128i *)qs1) : _mm_setzero_si128();
    __m512i v = _mm512_castsi128_si512(r0);
    v = _mm512_inserti32x4(v, _mm_srli_epi16(r0, 4), 1);
    v = _mm512_inserti32x4(v, r1, 2);
    v = _mm512_inserti32x4(v, _mm_srli_epi16(r1, 4), 3);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

/* the exact integer sums of each block half of four zmm:
 * *b0 lane k = sum of the low 8 lanes of vk, *b1 lane k = the high 8 */
RB_INLINE void rb_hsum4x_i32x16(__m512i v0, __m512i v1, __m512i v2, __m512i v3, __m128i *b0,
                                __m128i *b1)
{
    const __m512i a01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
    const __m512i a23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
    /* 128-bit lane j: [v0, v1, v2, v3] partial sums of that quarter */
    const __m512i h = _mm512_add_epi32(_mm512_unpacklo_epi64(a01, a23), _mm512_unpackhi_epi64(a01, a23));
    const __m256i lo = _mm512_castsi512_si256(h), hi = _mm512_extracti64x4_epi64(h, 1);
    *b0 = _mm_add_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    *b1 = _mm_add_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1));
}

RB_INLINE int32_t rb_hsum_i32x8(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* four f16 at p, p + stride, ... as floats */
RB_INLINE __m128 rb_h2f_x4(const char *p, size_t stride)
{
    rb_f16 h[4];
    RB_FOR(k, 4) memcpy(&h[k], p + k * stride, sizeof h[k]);
    return _mm_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], 0, 0, 0, 0));
}

/* ---- Q8_0 ------------------------------------------------------------------ */

RB_INLINE void rb_tile_q8_0(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                            float *y, int64_t ys, const int R, const int T)
{
    __m256 acc[RB_TILE_MAX][RB_TILE_MAX];
    RB_FOR(r, R) RB_FOR(t, T) acc[r][t] = _mm256_setzero_ps();
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    const int64_t nb = n / RB_QK8_0;
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i ya[RB_TILE_MAX], nc[RB_TILE_MAX];
        float dy0[RB_TILE_MAX], dy1[RB_TILE_MAX];
        RB_FOR(t, T) {
            const rb_block_q8_0 *ab = (const rb_block_q8_0 *)(a + t * arb) + b;
            ya[t] = rb_load2x32(ab[0].qs, two ? ab[1].qs : NULL);
            /* -128 * (sum of 4 activation codes) per lane */
            nc[t] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, ya[t]));
            dy0[t] = rb_h2f(ab[0].d);
            dy1[t] = two ? rb_h2f(ab[1].d) : 0.0f;
        }
        RB_FOR(r, R) {
            const rb_block_q8_0 *x = (const rb_block_q8_0 *)(w + r * wrb) + b;
            _mm_prefetch((const char *)x + R * wrb, _MM_HINT_T0);
            _mm_prefetch((const char *)x + R * wrb + 64, _MM_HINT_T0);
            const __m512i u = _mm512_xor_si512(rb_load2x32(x[0].qs, two ? x[1].qs : NULL), k80);
            const float dw0 = rb_h2f(x[0].d), dw1 = two ? rb_h2f(x[1].d) : 0.0f;
            RB_FOR(t, T) {
                const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(nc[t], u, ya[t]));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw0 * dy0[t]), _mm512_castps512_ps256(f),
                                            acc[r][t]);
                if (two)
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw1 * dy1[t]),
                                                _mm512_extractf32x8_ps(f, 1), acc[r][t]);
            }
        }
    }
    RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = rb_hsum8(acc[r][t]);
}

/* ---- Q4_0: llama.cpp's repacked-gemv chains (matmul_avx2.c's rb_chains) --- */

typedef struct rb_chains {
    __m128 v[RB_TILE_MAX];                /* T == 4: v[r], lane t; R == 4: v[t], lane r */
    float s[RB_TILE_MAX][RB_TILE_MAX];    /* otherwise */
} rb_chains;

/* one block's step: isum4 = the exact integers of 4 (r, t) pairs in
 * matmul_avx2.c's lane order; the same operations as its rb_chains_step */
RB_INLINE void rb_chains_step4(__m128 *v, __m128i isum4, __m128 scale4)
{
    *v = _mm_fmadd_ps(_mm_cvtepi32_ps(isum4), scale4, *v);
}

RB_INLINE void rb_tile_q4_0(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                            float *y, int64_t ys, const int R, const int T)
{
    rb_chains ch;
    RB_FOR(i, RB_TILE_MAX) ch.v[i] = _mm_setzero_ps();
    RB_FOR(r, R) RB_FOR(t, T) ch.s[r][t] = 0.0f;
    const __m512i k8 = _mm512_set1_epi8(8);
    const size_t wbb = sizeof(rb_block_q4_0);
    const int64_t nb = n / RB_QK8_0;
    for (int64_t b = 0; b < nb; b += 2) {
        const int two = b + 1 < nb;
        __m512i ya[RB_TILE_MAX], nc[RB_TILE_MAX], p[RB_TILE_MAX][RB_TILE_MAX];
        float dy0[RB_TILE_MAX], dy1[RB_TILE_MAX], dw0[RB_TILE_MAX], dw1[RB_TILE_MAX];
        RB_FOR(t, T) {
            const rb_block_q8_0 *ab = (const rb_block_q8_0 *)(a + t * arb) + b;
            ya[t] = rb_load2x32(ab[0].qs, two ? ab[1].qs : NULL);
            nc[t] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), k8, ya[t]));
            dy0[t] = rb_h2f(ab[0].d);
            dy1[t] = two ? rb_h2f(ab[1].d) : 0.0f;
        }
        RB_FOR(r, R) {
            const rb_block_q4_0 *x = (const rb_block_q4_0 *)(w + r * wrb + b * wbb);
            _mm_prefetch((const char *)x + R * wrb, _MM_HINT_T0);
            _mm_prefetch((const char *)x + R * wrb + 36, _MM_HINT_T0);
            const __m512i q = rb_nibbles2x32(x[0].qs, two ? x[1].qs : NULL);
            dw0[r] = rb_h2f(x[0].d);
            dw1[r] = two ? rb_h2f(x[1].d) : 0.0f;
            RB_FOR(t, T) p[r][t] = _mm512_dpbusd_epi32(nc[t], q, ya[t]);
        }
        if (T == 4) {
            const __m128 dyv0 = rb_h2f_x4(a + b * sizeof(rb_block_q8_0), arb);
            const __m128 dyv1 = two ? rb_h2f_x4(a + (b + 1) * sizeof(rb_block_q8_0), arb) : dyv0;
            RB_FOR(r, R) {
                __m128i s0, s1;
                rb_hsum4x_i32x16(p[r][0], p[r][1], p[r][2], p[r][3], &s0, &s1);
                rb_chains_step4(&ch.v[r], s0, _mm_mul_ps(_mm_set1_ps(dw0[r]), dyv0));
                if (two)
                    rb_chains_step4(&ch.v[r], s1, _mm_mul_ps(_mm_set1_ps(dw1[r]), dyv1));
            }
        } else if (R == 4) {
            const __m128 dwv0 = rb_h2f_x4(w + b * wbb, wrb);
            const __m128 dwv1 = two ? rb_h2f_x4(w + (b + 1) * wbb, wrb) : dwv0;
            RB_FOR(t, T) {
                __m128i s0, s1;
                rb_hsum4x_i32x16(p[0][t], p[1][t], p[2][t], p[3][t], &s0, &s1);
                rb_chains_step4(&ch.v[t], s0, _mm_mul_ps(dwv0, _mm_set1_ps(dy0[t])));
                if (two)
                    rb_chains_step4(&ch.v[t], s1, _mm_mul_ps(dwv1, _mm_set1_ps(dy1[t])));
            }
        } else {
            RB_FOR(r, R) RB_FOR(t, T) {
                const int32_t i0 = rb_hsum_i32x8(_mm512_castsi512_si256(p[r][t]));
                ch.s[r][t] = fmaf((float)i0, dw0[r] * dy0[t], ch.s[r][t]);
                if (two) {
                    const int32_t i1 = rb_hsum_i32x8(_mm512_extracti64x4_epi64(p[r][t], 1));
                    ch.s[r][t] = fmaf((float)i1, dw1[r] * dy1[t], ch.s[r][t]);
                }
            }
        }
    }
    float l[RB_TILE_MAX][4];
    RB_FOR(i, RB_TILE_MAX) _mm_storeu_ps(l[i], ch.v[i]);
    RB_FOR(r, R) RB_FOR(t, T)
        y[t * ys + r] = T == 4 ? l[r][t] : R == 4 ? l[t][r] : ch.s[r][t];
}

/* ---- prefill panels (matmul_kernels.h's gemm) --------------------------------
 * Q4_0: one output row per int32 lane. The panel's 32 rows are repacked
 * (gathered) into 16-row groups: for block b, quad q (elements 4q..4q+3),
 * group g a zmm whose dword i holds row 16g + i's four unsigned codes, and
 * the rows' scales as floats. Per block and token one vpdpbusd per quad and
 * group, with the token's four activation codes broadcast from its Q8_0
 * row, starting from corr = -8 * sum(a) gives each row's exact block
 * integer in its lane; then acc = fma(float(isum), dw * da, acc): the
 * chains of the tile kernels (llama.cpp's repacked gemm), lane by lane. No
 * horizontal sums, and each weight byte is loaded once per token tile of
 * RB_G_TOK tokens.
 * Q8_0: two rows per zmm (row 2p in the low 256 bits, 2p + 1 high), the
 * token's block broadcast to both halves: vpdpbusd from corr = -128 * (the
 * sums of 4 activation codes) gives ggml_vec_dot_q8_0_q8_0's 8 int32 lanes
 * of each row (codes + 128 as the unsigned operand), then its per-block
 * fma(dw * da, float(lanes), acc) and hsum8 at the end. */

#define RB_G_TOK 6 /* tokens per tile: 2 x 6 int + 2 x 6 float accumulators */

static void rb_gemm_side_q4_0(const void *act, size_t arb, int64_t n, int64_t t0, int64_t t1,
                              float *d, int32_t *corr)
{
    const int64_t nb = n / RB_QK8_0;
    for (int64_t t = t0; t < t1; t++) {
        const rb_block_q8_0 *ab = (const rb_block_q8_0 *)((const char *)act + t * arb);
        for (int64_t b = 0; b < nb; b++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)ab[b].qs);
            /* sum of the unsigned a + 128, minus 32 * 128 */
            const __m256i s = _mm256_sad_epu8(_mm256_xor_si256(a, _mm256_set1_epi8((char)0x80)),
                                              _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
            const int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 4096;
            d[t * nb + b] = rb_h2f(ab[b].d);
            corr[t * nb + b] = -8 * sum;
        }
    }
}

static void rb_gemm_side_q8_0(const void *act, size_t arb, int64_t n, int64_t t0, int64_t t1,
                              float *d, int32_t *corr)
{
    const int64_t nb = n / RB_QK8_0;
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    for (int64_t t = t0; t < t1; t++) {
        const rb_block_q8_0 *ab = (const rb_block_q8_0 *)((const char *)act + t * arb);
        for (int64_t b = 0; b < nb; b++) {
            const __m256i a = _mm256_loadu_si256((const __m256i *)ab[b].qs);
            const __m256i c = _mm256_sub_epi32(_mm256_setzero_si256(),
                                               _mm256_dpbusd_epi32(_mm256_setzero_si256(), k80, a));
            _mm256_storeu_si256((__m256i *)(corr + (t * nb + b) * 8), c);
            d[t * nb + b] = rb_h2f(ab[b].d);
        }
    }
}

/* the panel's rows as 16-row groups (see above); rows >= n_rows are zeros */
static void rb_gemm_pack_q4_0(int64_t nb, const char *w, size_t wrb, int n_rows, __m512i *pw,
                              float *ps)
{
    for (int g = 0; g < RB_GEMM_ROWS / 16; g++) {
        const int left = n_rows - 16 * g;
        const __mmask16 m = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32((int)wrb));
        const char *wg = w + (size_t)(16 * g) * wrb;
        const __m512i k0f = _mm512_set1_epi8(0x0f);
        for (int64_t b = 0; b < nb; b++) {
            const char *bb = wg + b * sizeof(rb_block_q4_0);
            const __m512i dd = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, bb, 1);
            _mm512_storeu_ps(ps + (b * (RB_GEMM_ROWS / 16) + g) * 16,
                             _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
            for (int q = 0; q < 4; q++) {
                const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx,
                                                              bb + 2 + 4 * q, 1);
                pw[(b * 8 + q) * (RB_GEMM_ROWS / 16) + g] = _mm512_and_si512(v, k0f);
                pw[(b * 8 + q + 4) * (RB_GEMM_ROWS / 16) + g] =
                    _mm512_and_si512(_mm512_srli_epi16(v, 4), k0f);
            }
        }
    }
}

RB_INLINE void rb_gemm_q4_0_tile(int64_t nb, const __m512i *pw, const float *ps, const char *a,
                                 size_t arb, const float *sd, const int32_t *sc, float *y,
                                 int64_t ys, __mmask16 m0, __mmask16 m1, const int T)
{
    enum { G = RB_GEMM_ROWS / 16 };
    __m512 acc[G][RB_G_TOK];
    RB_FOR8(g, G) RB_FOR8(t, T) acc[g][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i is[G][RB_G_TOK];
        RB_FOR8(t, T) {
            const __m512i c = _mm512_set1_epi32(sc[t * nb + b]);
            RB_FOR8(g, G) is[g][t] = c;
        }
        const char *ab = a + b * sizeof(rb_block_q8_0) + offsetof(rb_block_q8_0, qs);
        const __m512i *pb = pw + b * 8 * G;
        _Pragma("GCC unroll 8") for (int q = 0; q < 8; q++) {
            const __m512i w0 = _mm512_load_si512(pb + q * G);
            const __m512i w1 = _mm512_load_si512(pb + q * G + 1);
            RB_FOR8(t, T) {
                int32_t a4;
                memcpy(&a4, ab + t * arb + 4 * q, 4);
                const __m512i av = _mm512_set1_epi32(a4);
                is[0][t] = _mm512_dpbusd_epi32(is[0][t], w0, av);
                is[1][t] = _mm512_dpbusd_epi32(is[1][t], w1, av);
            }
        }
        const __m512 dw0 = _mm512_load_ps(ps + b * 16 * G), dw1 = _mm512_load_ps(ps + b * 16 * G + 16);
        RB_FOR8(t, T) {
            const __m512 da = _mm512_set1_ps(sd[t * nb + b]);
            acc[0][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[0][t]), _mm512_mul_ps(dw0, da), acc[0][t]);
            acc[1][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[1][t]), _mm512_mul_ps(dw1, da), acc[1][t]);
        }
    }
    RB_FOR8(t, T) {
        _mm512_mask_storeu_ps(y + t * ys, m0, acc[0][t]);
        _mm512_mask_storeu_ps(y + t * ys + 16, m1, acc[1][t]);
    }
}

static void rb_gemm_q4_0_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int64_t n_tok, const float *sd, const int32_t *sc,
                                float *y, int64_t ys, void *scratch)
{
    const int64_t nb = n / RB_QK8_0;
    __m512i *pw = scratch;
    float *ps = (float *)(pw + nb * 8 * (RB_GEMM_ROWS / 16));
    rb_gemm_pack_q4_0(nb, w, wrb, n_rows, pw, ps);
    const __mmask16 m0 = n_rows >= 16 ? 0xffff : (__mmask16)((1u << n_rows) - 1);
    const __mmask16 m1 = n_rows >= 32 ? 0xffff : n_rows <= 16 ? 0 : (__mmask16)((1u << (n_rows - 16)) - 1);
    const char *ac = a;
    int64_t t = 0;
    for (; t + RB_G_TOK <= n_tok; t += RB_G_TOK)
        rb_gemm_q4_0_tile(nb, pw, ps, ac + t * arb, arb, sd + t * nb, sc + t * nb, y + t * ys, ys,
                          m0, m1, RB_G_TOK);
    switch (n_tok - t) {
#define RB_GQ4(T) rb_gemm_q4_0_tile(nb, pw, ps, ac + t * arb, arb, sd + t * nb, sc + t * nb, \
                                    y + t * ys, ys, m0, m1, T)
    case 1: RB_GQ4(1); break;
    case 2: RB_GQ4(2); break;
    case 3: RB_GQ4(3); break;
    case 4: RB_GQ4(4); break;
    case 5: RB_GQ4(5); break;
    default: break;
#undef RB_GQ4
    }
}

/* Q8_0 panel: per row pair p and block b, a zmm of the two rows' codes
 * + 128 (pw) and one of their scales (8 x dw of row 2p, 8 x dw of 2p + 1) */
static void rb_gemm_pack_q8_0(int64_t nb, const char *w, size_t wrb, int n_rows, __m512i *pw,
                              __m512 *ps)
{
    const __m512i k80 = _mm512_set1_epi8((char)0x80);
    for (int p = 0; p < RB_GEMM_ROWS / 2; p++) {
        const int r0 = 2 * p;
        const rb_block_q8_0 *x0 = r0 < n_rows ? (const rb_block_q8_0 *)(w + r0 * wrb) : NULL;
        const rb_block_q8_0 *x1 = r0 + 1 < n_rows ? (const rb_block_q8_0 *)(w + (r0 + 1) * wrb) : NULL;
        for (int64_t b = 0; b < nb; b++) {
            const __m256i l = x0 ? _mm256_loadu_si256((const __m256i *)x0[b].qs) : _mm256_set1_epi8((char)0x80);
            const __m256i h = x1 ? _mm256_loadu_si256((const __m256i *)x1[b].qs) : _mm256_set1_epi8((char)0x80);
            pw[b * (RB_GEMM_ROWS / 2) + p] =
                _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1), k80);
            const float d0 = x0 ? rb_h2f(x0[b].d) : 0.0f, d1 = x1 ? rb_h2f(x1[b].d) : 0.0f;
            ps[b * (RB_GEMM_ROWS / 2) + p] =
                _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1);
        }
    }
}

#define RB_G8_PAIRS 4
#define RB_G8_TOK 3

RB_INLINE void rb_gemm_q8_0_tile(int64_t nb, const __m512i *pw, const __m512 *ps, const char *a,
                                 size_t arb, const float *sd, const int32_t *sc, float *y,
                                 int64_t ys, int r0, int n_rows, const int T)
{
    enum { P = RB_G8_PAIRS };
    __m512 acc[P][RB_G8_TOK];
    RB_FOR8(p, P) RB_FOR8(t, T) acc[p][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i av[RB_G8_TOK], cv[RB_G8_TOK];
        __m512 dav[RB_G8_TOK];
        RB_FOR8(t, T) {
            const rb_block_q8_0 *ab = (const rb_block_q8_0 *)(a + t * arb) + b;
            av[t] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)ab->qs));
            cv[t] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(sc + (t * nb + b) * 8)));
            dav[t] = _mm512_set1_ps(sd[t * nb + b]);
        }
        RB_FOR8(p, P) {
            const __m512i wv = _mm512_load_si512(pw + b * (RB_GEMM_ROWS / 2) + p);
            const __m512 dw = _mm512_load_ps((const float *)(ps + b * (RB_GEMM_ROWS / 2) + p));
            RB_FOR8(t, T) {
                const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(cv[t], wv, av[t]));
                acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dav[t]), f, acc[p][t]);
            }
        }
    }
    RB_FOR8(p, P) RB_FOR8(t, T) {
        const int r = r0 + 2 * p;
        if (r < n_rows)
            y[t * ys + r] = rb_hsum8(_mm512_castps512_ps256(acc[p][t]));
        if (r + 1 < n_rows)
            y[t * ys + r + 1] = rb_hsum8(_mm512_extractf32x8_ps(acc[p][t], 1));
    }
}

static void rb_gemm_q8_0_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int64_t n_tok, const float *sd, const int32_t *sc,
                                float *y, int64_t ys, void *scratch)
{
    const int64_t nb = n / RB_QK8_0;
    __m512i *pw = scratch;
    __m512 *ps = (__m512 *)(pw + nb * (RB_GEMM_ROWS / 2));
    rb_gemm_pack_q8_0(nb, w, wrb, n_rows, pw, ps);
    const char *ac = a;
    for (int pp = 0; pp < RB_GEMM_ROWS / 2 && 2 * pp < n_rows; pp += RB_G8_PAIRS) {
        const __m512i *pwp = pw + pp;
        const __m512 *psp = ps + pp;
        int64_t t = 0;
        for (; t + RB_G8_TOK <= n_tok; t += RB_G8_TOK)
            rb_gemm_q8_0_tile(nb, pwp, psp, ac + t * arb, arb, sd + t * nb, sc + t * nb * 8,
                              y + t * ys, ys, 2 * pp, n_rows, RB_G8_TOK);
        if (n_tok - t == 2)
            rb_gemm_q8_0_tile(nb, pwp, psp, ac + t * arb, arb, sd + t * nb, sc + t * nb * 8,
                              y + t * ys, ys, 2 * pp, n_rows, 2);
        else if (n_tok - t == 1)
            rb_gemm_q8_0_tile(nb, pwp, psp, ac + t * arb, arb, sd + t * nb, sc + t * nb * 8,
                              y + t * ys, ys, 2 * pp, n_rows, 1);
    }
}

/* ---- K-quant prefill panels ------------------------------------------------
 * Q4_K (llama.cpp's repacked q4_K gemv chains, matmul_avx2.c's rb_tile_q4_K):
 * one output row per int32 lane, as Q4_0's panel. Per super-block and
 * 16-row group the repack holds 64 zmm of codes (chunk j, quad q: dword i =
 * row i's four codes 32j + 4q..+3 as bytes), 8 zmm of the rows' 6-bit
 * scales (int32), 4 of their mins as int16 pairs (m[2p], m[2p + 1]) and
 * the rows' d and dmin as floats. Per token: for each chunk, eight vpdpbusd
 * with the token's four activation codes broadcast give each row's chunk
 * sum, one vpmulld by the chunk's scale adds it to the row's super-block
 * integer; four vpdpwssd against the token's sub-block sum pairs (the side
 * table) give sum(min * bsum). Both are the tile's exact integers, then
 * the tile's two chains acc = fma(float(isum), dw * da, acc) and
 * accm = fma(float(imin), dmin * da, accm), y = acc - accm, lane by lane.
 * Q6_K (ggml_vec_dot_q6_K_q8_K's 8 lanes, matmul_avx2.c's rb_tile_q6_K):
 * two rows per zmm (row 2p low 256 bits, 2p + 1 high), each half the AVX2
 * kernel's ymm: per 32-element chunk vpmaddubsw of the unsigned 6-bit codes
 * (repacked as bytes) with the token's codes broadcast to both halves, and
 * vpdpwssd with the chunk's two sub-block scales (vpermw from the rows' 16
 * int16 scales), from the start value -32 * (scale * bsum) of each lane
 * pair; per super-block fma(dw * da, float(lanes), acc), hsum8 per row at
 * the end: the AVX2 lanes' integers and floats in their order. */

#define RB_GK_ZMM 78 /* zmm per (super-block, 16-row group) of the Q4_K panel */
#define RB_GK_TOK 4  /* tokens per Q4_K tile */

static void rb_gemm_side_q4_K(const void *act, size_t arb, int64_t n, int64_t t0, int64_t t1,
                              float *d, int32_t *corr)
{
    const int64_t nb = n / RB_QK_K;
    for (int64_t t = t0; t < t1; t++) {
        const rb_block_q8_K *ab = (const rb_block_q8_K *)((const char *)act + t * arb);
        for (int64_t b = 0; b < nb; b++) {
            /* the 8 sub-block sums of 32, as int16 pairs (2p, 2p + 1) */
            const __m128i ps = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab[b].bsums),
                                              _mm_loadu_si128((const __m128i *)(ab[b].bsums + 8)));
            _mm_storeu_si128((__m128i *)(corr + (t * nb + b) * 4), ps);
            d[t * nb + b] = ab[b].d;
        }
    }
}

static void rb_gemm_pack_q4_K(int64_t nb, const char *w, size_t wrb, int n_rows, __m512i *pw)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)wrb));
    const __m512i k0f = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < RB_GEMM_ROWS / 16; g++) {
        const int left = n_rows - 16 * g;
        const __mmask16 m = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        const char *wg = w + (size_t)(16 * g) * wrb;
        for (int64_t b = 0; b < nb; b++) {
            __m512i *o = pw + (b * (RB_GEMM_ROWS / 16) + g) * RB_GK_ZMM;
            const char *bb = wg + b * sizeof(rb_block_q4_K) + offsetof(rb_block_q4_K, qs);
            for (int k = 0; k < 32; k++) {
                const __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, idx, bb + 4 * k, 1);
                o[(2 * (k / 8)) * 8 + k % 8] = _mm512_and_si512(v, k0f);
                o[(2 * (k / 8) + 1) * 8 + k % 8] = _mm512_and_si512(_mm512_srli_epi16(v, 4), k0f);
            }
            alignas(64) int32_t sc[8][16], mn[4][16];
            alignas(64) float dw[16], dwm[16];
            memset(sc, 0, sizeof sc);
            memset(mn, 0, sizeof mn);
            memset(dw, 0, sizeof dw);
            memset(dwm, 0, sizeof dwm);
            for (int i = 0; i < 16 && i < left; i++) {
                const rb_block_q4_K *x = (const rb_block_q4_K *)(wg + (size_t)i * wrb) + b;
                uint8_t s[8], mm[8];
                rb_k4_scales_mins(x->scales, s, mm);
                for (int j = 0; j < 8; j++)
                    sc[j][i] = s[j];
                for (int p = 0; p < 4; p++)
                    mn[p][i] = (int32_t)((uint32_t)mm[2 * p] | ((uint32_t)mm[2 * p + 1] << 16));
                dw[i] = rb_h2f(x->d);
                dwm[i] = rb_h2f(x->dmin);
            }
            for (int j = 0; j < 8; j++)
                o[64 + j] = _mm512_load_si512(sc[j]);
            for (int p = 0; p < 4; p++)
                o[72 + p] = _mm512_load_si512(mn[p]);
            o[76] = _mm512_castps_si512(_mm512_load_ps(dw));
            o[77] = _mm512_castps_si512(_mm512_load_ps(dwm));
        }
    }
}

RB_INLINE void rb_gemm_q4_K_tile(int64_t nb, const __m512i *pw, int g, const char *a, size_t arb,
                                 const float *sd, const int32_t *sc, float *y, int64_t ys,
                                 __mmask16 m, const int T)
{
    __m512 acc[RB_GK_TOK], accm[RB_GK_TOK];
    RB_FOR8(t, T) acc[t] = accm[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m512i *o = pw + (b * (RB_GEMM_ROWS / 16) + g) * RB_GK_ZMM;
        const char *ab = a + b * sizeof(rb_block_q8_K) + offsetof(rb_block_q8_K, qs);
        __m512i is[RB_GK_TOK];
        RB_FOR8(t, T) is[t] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            __m512i wq[8];
            RB_FOR8(q, 8) wq[q] = _mm512_load_si512(o + 8 * j + q);
            const __m512i scj = _mm512_load_si512(o + 64 + j);
            RB_FOR8(t, T) {
                const char *aq = ab + t * arb + 32 * j;
                __m512i s = _mm512_setzero_si512();
                RB_FOR8(q, 8) {
                    int32_t a4;
                    memcpy(&a4, aq + 4 * q, 4);
                    s = _mm512_dpbusd_epi32(s, wq[q], _mm512_set1_epi32(a4));
                }
                is[t] = _mm512_add_epi32(is[t], _mm512_mullo_epi32(s, scj));
            }
        }
        const __m512 dw = _mm512_castsi512_ps(_mm512_load_si512(o + 76));
        const __m512 dwm = _mm512_castsi512_ps(_mm512_load_si512(o + 77));
        RB_FOR8(t, T) {
            const int32_t *c = sc + (t * nb + b) * 4;
            __m512i im = _mm512_setzero_si512();
            RB_FOR(p, 4) im = _mm512_dpwssd_epi32(im, _mm512_load_si512(o + 72 + p), _mm512_set1_epi32(c[p]));
            const __m512 da = _mm512_set1_ps(sd[t * nb + b]);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[t]), _mm512_mul_ps(dw, da), acc[t]);
            accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dwm, da), accm[t]);
        }
    }
    RB_FOR8(t, T) _mm512_mask_storeu_ps(y + t * ys, m, _mm512_sub_ps(acc[t], accm[t]));
}

static void rb_gemm_q4_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int64_t n_tok, const float *sd, const int32_t *sc,
                                float *y, int64_t ys, void *scratch)
{
    const int64_t nb = n / RB_QK_K;
    __m512i *pw = scratch;
    rb_gemm_pack_q4_K(nb, w, wrb, n_rows, pw);
    const char *ac = a;
    for (int g = 0; g < RB_GEMM_ROWS / 16 && 16 * g < n_rows; g++) {
        const int left = n_rows - 16 * g;
        const __mmask16 m = left >= 16 ? 0xffff : (__mmask16)((1u << left) - 1);
        float *yg = y + 16 * g;
        int64_t t = 0;
        for (; t + RB_GK_TOK <= n_tok; t += RB_GK_TOK)
            rb_gemm_q4_K_tile(nb, pw, g, ac + t * arb, arb, sd + t * nb, sc + t * nb * 4, yg + t * ys,
                              ys, m, RB_GK_TOK);
        switch (n_tok - t) {
#define RB_GQK(T) rb_gemm_q4_K_tile(nb, pw, g, ac + t * arb, arb, sd + t * nb, sc + t * nb * 4, \
                                    yg + t * ys, ys, m, T)
        case 1: RB_GQK(1); break;
        case 2: RB_GQK(2); break;
        case 3: RB_GQK(3); break;
        default: break;
#undef RB_GQK
        }
    }
}

/* Q6_K panel: per super-block and row pair, 8 zmm of codes (chunk c =
 * 4h + k: elements 128h + 32k..+31 of row 2p low, of row 2p + 1 high, as
 * unsigned bytes 0..63), one of the rows' 16 scales as int16 (row 2p low),
 * one of their d (8 x each) */
#define RB_G6_ZMM 10
#define RB_G6_PAIRS 2
#define RB_G6_TOK 4

static void rb_gemm_side_q6_K(const void *act, size_t arb, int64_t n, int64_t t0, int64_t t1,
                              float *d, int32_t *corr)
{
    (void)corr;
    const int64_t nb = n / RB_QK_K;
    for (int64_t t = t0; t < t1; t++) {
        const rb_block_q8_K *ab = (const rb_block_q8_K *)((const char *)act + t * arb);
        for (int64_t b = 0; b < nb; b++)
            d[t * nb + b] = ab[b].d;
    }
}

/* the 8 chunks of a Q6_K block's codes as bytes 0..63 (NULL: zeros) */
RB_INLINE void rb_q6_K_codes(const rb_block_q6_K *x, __m256i q[8])
{
    if (!x) {
        RB_FOR8(c, 8) q[c] = _mm256_setzero_si256();
        return;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x30);
    RB_FOR8(h, 2) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
        q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m3));
        q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m3));
        q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(qh, m3));
        q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3));
    }
}

static void rb_gemm_pack_q6_K(int64_t nb, const char *w, size_t wrb, int n_rows, __m512i *pw)
{
    for (int p = 0; p < RB_GEMM_ROWS / 2; p++) {
        const int r0 = 2 * p;
        const rb_block_q6_K *x0 = r0 < n_rows ? (const rb_block_q6_K *)(w + r0 * wrb) : NULL;
        const rb_block_q6_K *x1 = r0 + 1 < n_rows ? (const rb_block_q6_K *)(w + (r0 + 1) * wrb) : NULL;
        for (int64_t b = 0; b < nb; b++) {
            __m512i *o = pw + (b * (RB_GEMM_ROWS / 2) + p) * RB_G6_ZMM;
            __m256i q0[8], q1[8];
            rb_q6_K_codes(x0 ? x0 + b : NULL, q0);
            rb_q6_K_codes(x1 ? x1 + b : NULL, q1);
            RB_FOR8(c, 8) o[c] = _mm512_inserti64x4(_mm512_castsi256_si512(q0[c]), q1[c], 1);
            const __m256i s0 = x0 ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x0[b].scales))
                                  : _mm256_setzero_si256();
            const __m256i s1 = x1 ? _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x1[b].scales))
                                  : _mm256_setzero_si256();
            o[8] = _mm512_inserti64x4(_mm512_castsi256_si512(s0), s1, 1);
            const float d0 = x0 ? rb_h2f(x0[b].d) : 0.0f, d1 = x1 ? rb_h2f(x1[b].d) : 0.0f;
            o[9] = _mm512_castps_si512(
                _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d0)), _mm256_set1_ps(d1), 1));
        }
    }
}

RB_INLINE void rb_gemm_q6_K_tile(int64_t nb, const __m512i *pw, int p0, const char *a, size_t arb,
                                 const float *sd, float *y, int64_t ys, int n_rows, const int T)
{
    enum { P = RB_G6_PAIRS };
    __m512 acc[P][RB_G6_TOK];
    RB_FOR8(p, P) RB_FOR8(t, T) acc[p][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        RB_FOR8(p, P) {
            const __m512i *o = pw + (b * (RB_GEMM_ROWS / 2) + p0 + p) * RB_G6_ZMM;
            const __m512i sc16 = _mm512_load_si512(o + 8);
            __m512i sumi[RB_G6_TOK];
            RB_FOR8(t, T) {
                const rb_block_q8_K *ab = (const rb_block_q8_K *)(a + t * arb) + b;
                const __m512i bs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)ab->bsums));
                sumi[t] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                           _mm512_slli_epi32(_mm512_madd_epi16(bs, sc16), 5));
            }
            RB_FOR8(c, 8) {
                /* words 0..7 of each row: scale 8h + 2k, 8..15: 8h + 2k + 1 */
                const int s = 8 * (c / 4) + 2 * (c % 4);
                const __m512i sel = _mm512_set_epi16(
                    16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1,
                    16 + s, 16 + s, 16 + s, 16 + s, 16 + s, 16 + s, 16 + s, 16 + s,
                    s + 1, s + 1, s + 1, s + 1, s + 1, s + 1, s + 1, s + 1, s, s, s, s, s, s, s, s);
                const __m512i scv = _mm512_permutexvar_epi16(sel, sc16);
                const __m512i wv = _mm512_load_si512(o + c);
                RB_FOR8(t, T) {
                    const int8_t *aq = ((const rb_block_q8_K *)(a + t * arb) + b)->qs + 32 * c;
                    const __m512i av = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)aq));
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(wv, av), scv);
                }
            }
            const __m512 dw = _mm512_castsi512_ps(_mm512_load_si512(o + 9));
            RB_FOR8(t, T)
                acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(sd[t * nb + b])),
                                            _mm512_cvtepi32_ps(sumi[t]), acc[p][t]);
        }
    }
    RB_FOR8(p, P) RB_FOR8(t, T) {
        const int r = 2 * (p0 + p);
        if (r < n_rows)
            y[t * ys + r] = rb_hsum8(_mm512_castps512_ps256(acc[p][t]));
        if (r + 1 < n_rows)
            y[t * ys + r + 1] = rb_hsum8(_mm512_extractf32x8_ps(acc[p][t], 1));
    }
}

static void rb_gemm_q6_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int64_t n_tok, const float *sd, const int32_t *sc,
                                float *y, int64_t ys, void *scratch)
{
    (void)sc;
    const int64_t nb = n / RB_QK_K;
    __m512i *pw = scratch;
    rb_gemm_pack_q6_K(nb, w, wrb, n_rows, pw);
    const char *ac = a;
    for (int pp = 0; pp < RB_GEMM_ROWS / 2 && 2 * pp < n_rows; pp += RB_G6_PAIRS) {
        int64_t t = 0;
        for (; t + RB_G6_TOK <= n_tok; t += RB_G6_TOK)
            rb_gemm_q6_K_tile(nb, pw, pp, ac + t * arb, arb, sd + t * nb, y + t * ys, ys, n_rows,
                              RB_G6_TOK);
        switch (n_tok - t) {
#define RB_GQ6(T) rb_gemm_q6_K_tile(nb, pw, pp, ac + t * arb, arb, sd + t * nb, y + t * ys, ys, \
                                    n_rows, T)
        case 1: RB_GQ6(1); break;
        case 2: RB_GQ6(2); break;
        case 3: RB_GQ6(3); break;
        default: break;
#undef RB_GQ6
        }
    }
}

/* Q5_K panel (ggml_vec_dot_q5_K_q8_K's order, matmul_avx2.c's rb_tile_q5_K):
 * Q6_K's two rows per zmm with the 5-bit codes as bytes and one scale per
 * 32-element chunk; per super-block and row pair 8 zmm of codes, one of the
 * rows' scales and mins as int16 (row 2p: words 0..7 scales, 8..15 mins;
 * row 2p + 1 the same in the high half), one of their d and one of their
 * dmin (8 x each). The mins: vpmaddwd of that zmm with the token's 8
 * sub-block sums in words 8..15 of each half, the four dwords of the upper
 * 128 bits of each half summed in place (exact), then the tile's scalar
 * chain summs = fma(-da * dmin, float(imin), summs), one lane per row;
 * y = hsum8(acc) + summs. */
#define RB_G5_ZMM 11

static void rb_gemm_pack_q5_K(int64_t nb, const char *w, size_t wrb, int n_rows, __m512i *pw)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    for (int p = 0; p < RB_GEMM_ROWS / 2; p++) {
        const rb_block_q5_K *xr[2];
        for (int h = 0; h < 2; h++)
            xr[h] = 2 * p + h < n_rows ? (const rb_block_q5_K *)(w + (size_t)(2 * p + h) * wrb) : NULL;
        for (int64_t b = 0; b < nb; b++) {
            __m512i *o = pw + (b * (RB_GEMM_ROWS / 2) + p) * RB_G5_ZMM;
            __m256i q[2][8], sm[2];
            float d[2], dm[2];
            for (int h = 0; h < 2; h++) {
                const rb_block_q5_K *x = xr[h] ? xr[h] + b : NULL;
                if (!x) {
                    for (int c = 0; c < 8; c++)
                        q[h][c] = _mm256_setzero_si256();
                    sm[h] = _mm256_setzero_si256();
                    d[h] = dm[h] = 0.0f;
                    continue;
                }
                const __m256i hb = _mm256_loadu_si256((const __m256i *)x->qh);
                for (int g = 0; g < 4; g++) {
                    const __m256i raw = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * g));
                    const int j0 = 2 * g, j1 = 2 * g + 1;
                    const __m256i h0 = _mm256_and_si256(_mm256_srlv_epi16(hb, _mm256_set1_epi16((short)j0)), _mm256_set1_epi8(1));
                    const __m256i h1 = _mm256_and_si256(_mm256_srlv_epi16(hb, _mm256_set1_epi16((short)j1)), _mm256_set1_epi8(1));
                    q[h][j0] = _mm256_or_si256(_mm256_and_si256(raw, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(h0, 4), m16));
                    q[h][j1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                               _mm256_and_si256(_mm256_slli_epi16(h1, 4), m16));
                }
                uint8_t s8[8], m8[8];
                rb_k4_scales_mins(x->scales, s8, m8);
                sm[h] = _mm256_setr_epi16(s8[0], s8[1], s8[2], s8[3], s8[4], s8[5], s8[6], s8[7],
                                          m8[0], m8[1], m8[2], m8[3], m8[4], m8[5], m8[6], m8[7]);
                d[h] = rb_h2f(x->d);
                dm[h] = rb_h2f(x->dmin);
            }
            for (int c = 0; c < 8; c++)
                o[c] = _mm512_inserti64x4(_mm512_castsi256_si512(q[0][c]), q[1][c], 1);
            o[8] = _mm512_inserti64x4(_mm512_castsi256_si512(sm[0]), sm[1], 1);
            o[9] = _mm512_castps_si512(
                _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(d[0])), _mm256_set1_ps(d[1]), 1));
            o[10] = _mm512_castps_si512(
                _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(dm[0])), _mm256_set1_ps(dm[1]), 1));
        }
    }
}

RB_INLINE void rb_gemm_q5_K_tile(int64_t nb, const __m512i *pw, int p0, const char *a, size_t arb,
                                 const float *sd, float *y, int64_t ys, int n_rows, const int T)
{
    enum { P = RB_G6_PAIRS };
    __m512 acc[P][RB_G6_TOK], summs[P][RB_G6_TOK];
    RB_FOR8(p, P) RB_FOR8(t, T) acc[p][t] = summs[p][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512i pz[RB_G6_TOK];
        RB_FOR8(t, T) {
            const rb_block_q8_K *ab = (const rb_block_q8_K *)(a + t * arb) + b;
            const __m128i ps = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab->bsums),
                                              _mm_loadu_si128((const __m128i *)(ab->bsums + 8)));
            pz[t] = _mm512_broadcast_i64x4(_mm256_inserti128_si256(_mm256_setzero_si256(), ps, 1));
        }
        RB_FOR8(p, P) {
            const __m512i *o = pw + (b * (RB_GEMM_ROWS / 2) + p0 + p) * RB_G5_ZMM;
            const __m512i scm = _mm512_load_si512(o + 8);
            __m512i sumi[RB_G6_TOK];
            RB_FOR8(t, T) sumi[t] = _mm512_setzero_si512();
            RB_FOR8(c, 8) {
                const __m512i scv = _mm512_permutexvar_epi16(
                    _mm512_inserti64x4(_mm512_set1_epi16((short)c), _mm256_set1_epi16((short)(16 + c)), 1), scm);
                const __m512i wv = _mm512_load_si512(o + c);
                RB_FOR8(t, T) {
                    const int8_t *aq = ((const rb_block_q8_K *)(a + t * arb) + b)->qs + 32 * c;
                    const __m512i av = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)aq));
                    sumi[t] = _mm512_dpwssd_epi32(sumi[t], _mm512_maddubs_epi16(wv, av), scv);
                }
            }
            const __m512 dw = _mm512_castsi512_ps(_mm512_load_si512(o + 9));
            const __m512 dwm = _mm512_castsi512_ps(_mm512_load_si512(o + 10));
            RB_FOR8(t, T) {
                const float da = sd[t * nb + b];
                __m512i im = _mm512_madd_epi16(scm, pz[t]);
                im = _mm512_add_epi32(im, _mm512_shuffle_epi32(im, _MM_PERM_CDAB));
                im = _mm512_add_epi32(im, _mm512_shuffle_epi32(im, _MM_PERM_BADC));
                summs[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-da), dwm), _mm512_cvtepi32_ps(im),
                                              summs[p][t]);
                acc[p][t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(da)), _mm512_cvtepi32_ps(sumi[t]),
                                            acc[p][t]);
            }
        }
    }
    RB_FOR8(p, P) RB_FOR8(t, T) {
        const int r = 2 * (p0 + p);
        float sv[16];
        _mm512_storeu_ps(sv, summs[p][t]);
        if (r < n_rows)
            y[t * ys + r] = rb_hsum8(_mm512_castps512_ps256(acc[p][t])) + sv[4];
        if (r + 1 < n_rows)
            y[t * ys + r + 1] = rb_hsum8(_mm512_extractf32x8_ps(acc[p][t], 1)) + sv[12];
    }
}

static void rb_gemm_q5_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int64_t n_tok, const float *sd, const int32_t *sc,
                                float *y, int64_t ys, void *scratch)
{
    (void)sc;
    const int64_t nb = n / RB_QK_K;
    __m512i *pw = scratch;
    rb_gemm_pack_q5_K(nb, w, wrb, n_rows, pw);
    const char *ac = a;
    for (int pp = 0; pp < RB_GEMM_ROWS / 2 && 2 * pp < n_rows; pp += RB_G6_PAIRS) {
        int64_t t = 0;
        for (; t + RB_G6_TOK <= n_tok; t += RB_G6_TOK)
            rb_gemm_q5_K_tile(nb, pw, pp, ac + t * arb, arb, sd + t * nb, y + t * ys, ys, n_rows,
                              RB_G6_TOK);
        switch (n_tok - t) {
#define RB_GQ5(T) rb_gemm_q5_K_tile(nb, pw, pp, ac + t * arb, arb, sd + t * nb, y + t * ys, ys, \
                                    n_rows, T)
        case 1: RB_GQ5(1); break;
        case 2: RB_GQ5(2); break;
        case 3: RB_GQ5(3); break;
        default: break;
#undef RB_GQ5
        }
    }
}

/* ---- decode and steps of several sequences: Q4_0, 16 rows x T tokens -----------
 * Four rows per zmm (one 128-bit lane each: a block's 16 bytes of codes),
 * their low and high nibbles against the block's activation codes 0..15 and
 * 16..31 broadcast to every lane: two vpdpbusd give each row four partial
 * integers; a 4 x 4 transpose-and-add over the four zmm sums them, lane
 * 4j + k holding row 4k + j, and -8 * sum(a) completes the exact block
 * integer. Then the chains' acc = fma(float(isum), dw * da, acc), lane by
 * lane: the tiles' bits. A block of 16 rows is loaded and unpacked once
 * (four zmm of low and four of high nibbles, the rows' scales) and run
 * against each of the T tokens' blocks, so every output has the bits of
 * one token alone (the decode gemv below runs it at T = 1 for rows whose
 * blocks do not come in fours).
 * From DRAM this loop runs at half its speed on weights in L2 unless the
 * lines arrive early: the 16 rows ahead are one contiguous range, prefetched
 * into L2 (T1: into L1 it was 30% slower) 64 KiB ahead, one line per 64
 * bytes, not per row and block. The tokens' per-block -8 * sum(a) and scale
 * are computed once per call (a 64-row chunk: four row groups share them)
 * for up to RB_FEW_SEG blocks at a time, not once per 16 rows. (A gather of
 * the 16 scales instead of 16 scalar loads was slower on Zen 4.) Rows
 * beyond a multiple of 16 go to the vnni tiles. */

/* how far ahead the prefetch runs: 64 KiB did best at both 2048 and 5632
 * columns (3.5 and 1.4 groups; one group ahead was 20% slower at 5632) */
#define RB_GEMV_PREFETCH_BYTES 65536

#define RB_FEW_SEG 256 /* blocks per side table: 8 tokens x 256 x 8 B = 16 KiB */

/* the tokens' side values of blocks b0..b1 - 1: corr[(b - b0) * T + t] =
 * -8 * sum of the codes, da[...] = the scale as a float */
RB_INLINE void rb_few_side_q4_0(const char *a, size_t arb, int64_t b0, int64_t b1, int32_t *corr,
                                float *da, const int T)
{
    const __m256i k80 = _mm256_set1_epi8((char)0x80);
    for (int64_t b = b0; b < b1; b++)
        RB_FOR8(t, T) {
            const rb_block_q8_0 *ab = (const rb_block_q8_0 *)(a + t * arb) + b;
            const __m256i av = _mm256_loadu_si256((const __m256i *)ab->qs);
            const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(av, k80), _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
            const int32_t sum = (int32_t)(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 4096;
            corr[(b - b0) * T + t] = -8 * sum;
            da[(b - b0) * T + t] = rb_h2f(ab->d);
        }
}

RB_INLINE void rb_few_q4_0(int64_t n, const char *w, size_t wrb, int n_rows, const char *a,
                           size_t arb, float *y, int64_t ys, const int T)
{
    const int64_t nb = n / RB_QK8_0;
    const __m512i k0f = _mm512_set1_epi8(0x0f);
    const __m512i unperm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const size_t bs = sizeof(rb_block_q4_0);
    int32_t corr[RB_FEW_SEG * RB_FEW_MAX];
    float da[RB_FEW_SEG * RB_FEW_MAX];
    const int n16 = n_rows / 16 * 16;
    for (int p0 = 0; p0 < n16; p0 += 64) {
        /* a piece of up to 4 row groups shares the side tables; the
         * accumulators wait in memory between segments of blocks */
        const int ng = (n16 - p0) / 16 < 4 ? (n16 - p0) / 16 : 4;
        __m512 accm[4][RB_FEW_MAX];
        for (int gi = 0; gi < 4; gi++)
            RB_FOR8(t, T) accm[gi][t] = _mm512_setzero_ps();
        for (int64_t s0 = 0; s0 < nb; s0 += RB_FEW_SEG) {
            const int64_t s1 = s0 + RB_FEW_SEG < nb ? s0 + RB_FEW_SEG : nb;
            rb_few_side_q4_0(a, arb, s0, s1, corr, da, T);
            for (int gi = 0; gi < ng; gi++) {
                const char *w0 = w + (size_t)(p0 + 16 * gi) * wrb;
                /* the range RB_GEMV_PREFETCH_BYTES on, into L2, one
                 * line per 64 bytes */
                const char *next = w0 + RB_GEMV_PREFETCH_BYTES;
                __m512 acc[RB_FEW_MAX];
                RB_FOR8(t, T) acc[t] = accm[gi][t];
                for (int64_t b = s0; b < s1; b++) {
                    const char *bb = w0 + b * bs;
                    const char *pf = next + b * 16 * bs;
                    RB_FOR(k, 5) _mm_prefetch(pf + 64 * k, _MM_HINT_T1);
                    __m512i lo[4], hi[4];
                    rb_f16 dh[16];
                    RB_FOR(g, 4) {
                        const char *r = bb + (size_t)(4 * g) * wrb;
                        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(r + 2)));
                        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r + wrb + 2)), 1);
                        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r + 2 * wrb + 2)), 2);
                        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(r + 3 * wrb + 2)), 3);
                        lo[g] = _mm512_and_si512(v, k0f);
                        hi[g] = _mm512_and_si512(_mm512_srli_epi16(v, 4), k0f);
                        RB_FOR(j, 4) memcpy(&dh[4 * j + g], r + j * wrb, sizeof(rb_f16));
                    }
                    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dh));
                    RB_FOR8(t, T) {
                        const rb_block_q8_0 *ab = (const rb_block_q8_0 *)(a + t * arb) + b;
                        const __m512i alo = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)ab->qs));
                        const __m512i ahi = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ab->qs + 16)));
                        __m512i z[4];
                        RB_FOR(g, 4) z[g] = _mm512_dpbusd_epi32(
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[g], alo), hi[g], ahi);
                        const __m512i a01 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]),
                                                             _mm512_unpackhi_epi32(z[0], z[1]));
                        const __m512i a23 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]),
                                                             _mm512_unpackhi_epi32(z[2], z[3]));
                        const int64_t k = (b - s0) * T + t;
                        const __m512i is = _mm512_add_epi32(
                            _mm512_add_epi32(_mm512_unpacklo_epi64(a01, a23), _mm512_unpackhi_epi64(a01, a23)),
                            _mm512_set1_epi32(corr[k]));
                        acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dw, _mm512_set1_ps(da[k])),
                                                 acc[t]);
                    }
                }
                RB_FOR8(t, T) accm[gi][t] = acc[t];
            }
        }
        for (int gi = 0; gi < ng; gi++)
            RB_FOR8(t, T) _mm512_storeu_ps(y + t * ys + p0 + 16 * gi, _mm512_permutexvar_ps(unperm, accm[gi][t]));
    }
    for (int r0 = n16; r0 < n_rows; r0 += 4) {
        const int nr = n_rows - r0 < 4 ? n_rows - r0 : 4;
        for (int t0 = 0; t0 < T; t0 += 4)
            rb_matmul_isa_vnni.tile[RB_TYPE_Q4_0](n, w + (size_t)r0 * wrb, wrb, nr, a + t0 * arb, arb,
                                                  T - t0 < 4 ? T - t0 : 4, y + t0 * ys + r0, ys);
    }
}

#define RB_FEW_SHAPES(CALL)                                                            \
    switch (n_tok) {                                                                   \
    case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break;            \
    case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break;            \
    case 8: CALL(8); break; default: break;                                            \
    }

static void rb_few_q4_0_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                               size_t arb, int n_tok, float *y, int64_t ys)
{
    _Static_assert(RB_FEW_MAX == 8, "shapes above");
#define RB_FQ4(T) rb_few_q4_0(n, w, wrb, n_rows, a, arb, y, ys, T)
    RB_FEW_SHAPES(RB_FQ4)
#undef RB_FQ4
}

/* ---- decode: Q4_0, four rows x four blocks ----------------------------------
 * Four consecutive blocks of a row are 72 contiguous bytes with their codes
 * at the even offsets 18j + 2: one 64-byte load, one 16-byte load (bytes
 * 56..71, the last block's codes) and one vpermt2w put block j's 16 code
 * bytes in 128-bit lane j, and the 64 bytes give the four scales too
 * (words 9j). The token's codes are laid out once per call to match (lane
 * j: block 4s + j's codes 0..15, and 16..31), so per row and step two
 * vpdpbusd, started from -8 * sum(a) spread over each lane's dwords, leave
 * each block's exact integer in a lane's four dwords; the 4 x 4
 * transpose-and-add over four rows gives dword 4j + k = row k's integer of
 * block 4s + j. Then the chains' acc = fma(float(isum), dw * da, acc) per
 * row, block j before j + 1 (lane j of each vector): the tiles' bits.
 * Each row is one sequential stream, its lines pf bytes on prefetched into
 * L2 as the Q4_K gemv does (two lines per row and step: with one, a line
 * in nine goes unfetched and the stream halves). Measured on qwen3-0.6b's
 * Q4_0 shapes (28 layers, 236 MiB), Zen 4, one thread (CPU time): 17.5 GB/s
 * for the few kernel at one token (16 rows, 18 bytes of each per step),
 * 23-25 here at 16 rows ahead (21.3 at 8, 22.8 at 24, 19.7-22.3 at 32;
 * into L1 9.8); 25.6 against 30.7 with the weights in L2. Four xmm loads
 * and three inserts per row in place of the vpermt2w: 26.8 in L2, 23.7.
 * The token's layout takes 256 bytes per 4 blocks, so it is built for
 * RB_Q40_SEG_STEPS steps at a time; the rows' chains wait in y between
 * segments (a float stored and reloaded: the same chain). */
#define RB_Q40_SEG_STEPS 64 /* 256 blocks (8192 columns): 16 KiB of stack */
#define RB_Q40_PF_ROWS 16

typedef struct rb_q40_act_step {
    __m512i lo, hi; /* lane j: block 4s + j's codes 0..15, 16..31 */
    __m512i corr;   /* lane j: -8 * sum of block 4s + j's codes, in 4 dwords */
    __m512 da;      /* dword 4j + k: block 4s + j's scale */
} rb_q40_act_step;

RB_INLINE void rb_q40_act_prep(const char *a, int64_t s0, int64_t s1, rb_q40_act_step *st)
{
    const __m512i k8 = _mm512_set1_epi8(8);
    const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const size_t astride = sizeof(rb_block_q8_0);
    for (int64_t s = s0; s < s1; s++) {
        rb_q40_act_step *o = &st[s - s0];
        const rb_block_q8_0 *ab = (const rb_block_q8_0 *)a + 4 * s;
        /* [block 0 | block 1], [block 2 | block 3]: 32 codes each */
        const __m512i c01 = rb_load2x32(ab[0].qs, ab[1].qs), c23 = rb_load2x32(ab[2].qs, ab[3].qs);
        o->lo = _mm512_shuffle_i32x4(c01, c23, _MM_SHUFFLE(2, 0, 2, 0));
        o->hi = _mm512_shuffle_i32x4(c01, c23, _MM_SHUFFLE(3, 1, 3, 1));
        /* lane j's dwords sum to 8 * sum(a) of block j: negated, the
         * rows' dot products of codes + 8 start from -8 * sum(a) */
        o->corr = _mm512_sub_epi32(_mm512_setzero_si512(),
                                   _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), k8, o->lo),
                                                       k8, o->hi));
        o->da = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(rb_h2f_x4((const char *)ab, astride)));
    }
}

/* rows w .. w + 3 over steps s0..s1 - 1; y in and out (the chains) */
RB_INLINE void rb_dec_q4_0(const char *w, size_t wrb, const rb_q40_act_step *st, int64_t s0,
                           int64_t s1, float *y, size_t pf)
{
    /* lane j: words 9j + 1 .. 9j + 8 of A (block j's codes), lane 3 from B;
     * word 4j + k: row k's scale of block j (k = 0, 1 from rows 0, 1; 2, 3
     * from rows 2, 3) */
    static const alignas(64) int16_t idx[3][32] = {
        {1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15, 16, 17,
         19, 20, 21, 22, 23, 24, 25, 26, 32, 33, 34, 35, 36, 37, 38, 39},
        {0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59, 0, 0},
        {0, 0, 0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59},
    };
    const __m512i cidx = _mm512_load_si512((const void *)idx[0]);
    const __m512i didx01 = _mm512_load_si512((const void *)idx[1]);
    const __m512i didx23 = _mm512_load_si512((const void *)idx[2]);
    const __m512i k0f = _mm512_set1_epi8(0x0f);
    __m128 acc = _mm_loadu_ps(y);
    for (int64_t s = s0; s < s1; s++) {
        const rb_q40_act_step *as = &st[s - s0];
        __m512i raw[4], z[4];
        RB_FOR(r, 4) {
            const char *x = w + (size_t)r * wrb + (size_t)s * 4 * sizeof(rb_block_q4_0);
            _mm_prefetch(x + pf, _MM_HINT_T1);
            _mm_prefetch(x + pf + 64, _MM_HINT_T1);
            raw[r] = _mm512_loadu_si512((const void *)x);
            const __m512i b = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(x + 56)));
            const __m512i q = _mm512_permutex2var_epi16(raw[r], cidx, b);
            const __m512i lo = _mm512_and_si512(q, k0f);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), k0f);
            z[r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(as->corr, lo, as->lo), hi, as->hi);
        }
        const __m512i a01 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[0], z[1]), _mm512_unpackhi_epi32(z[0], z[1]));
        const __m512i a23 = _mm512_add_epi32(_mm512_unpacklo_epi32(z[2], z[3]), _mm512_unpackhi_epi32(z[2], z[3]));
        const __m512i is = _mm512_add_epi32(_mm512_unpacklo_epi64(a01, a23), _mm512_unpackhi_epi64(a01, a23));
        const __m256i dh = _mm256_mask_blend_epi16(
            0xcccc, _mm512_castsi512_si256(_mm512_permutex2var_epi16(raw[0], didx01, raw[1])),
            _mm512_castsi512_si256(_mm512_permutex2var_epi16(raw[2], didx23, raw[3])));
        const __m512 f = _mm512_cvtepi32_ps(is);
        const __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(dh), as->da);
        acc = _mm_fmadd_ps(_mm512_castps512_ps128(f), _mm512_castps512_ps128(sc), acc);
        acc = _mm_fmadd_ps(_mm512_extractf32x4_ps(f, 1), _mm512_extractf32x4_ps(sc, 1), acc);
        acc = _mm_fmadd_ps(_mm512_extractf32x4_ps(f, 2), _mm512_extractf32x4_ps(sc, 2), acc);
        acc = _mm_fmadd_ps(_mm512_extractf32x4_ps(f, 3), _mm512_extractf32x4_ps(sc, 3), acc);
    }
    _mm_storeu_ps(y, acc);
}

/* rows whose blocks do not come in fours: the few kernel at one token (its
 * own frame: the two kernels' tables do not share the stack) */
static __attribute__((noinline)) void rb_gemv_q4_0_few(int64_t n, const void *w, size_t wrb,
                                                       int n_rows, const void *a, float *y)
{
    rb_few_q4_0(n, w, wrb, n_rows, a, 0, y, 0, 1);
}

/* the decode gemv: the loop above where the blocks come in fours, else
 * the few kernel (the same bits either way) */
static void rb_gemv_q4_0_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                float *y)
{
    _Static_assert(sizeof(rb_block_q4_0) == 18, "the offsets above");
    const int64_t nb = n / RB_QK8_0;
    if (nb % 4) {
        rb_gemv_q4_0_few(n, w, wrb, n_rows, a, y);
        return;
    }
    rb_q40_act_step st[RB_Q40_SEG_STEPS];
    const int n4 = n_rows / 4 * 4;
    for (int r = 0; r < n4; r++)
        y[r] = 0.0f;
    for (int64_t s0 = 0; s0 < nb / 4; s0 += RB_Q40_SEG_STEPS) {
        const int64_t s1 = s0 + RB_Q40_SEG_STEPS < nb / 4 ? s0 + RB_Q40_SEG_STEPS : nb / 4;
        rb_q40_act_prep(a, s0, s1, st);
        for (int r = 0; r < n4; r += 4)
            rb_dec_q4_0((const char *)w + (size_t)r * wrb, wrb, st, s0, s1, y + r, RB_Q40_PF_ROWS * wrb);
    }
    if (n4 < n_rows) /* the last 1-3 rows: the vnni tile */
        rb_matmul_isa_vnni.tile[RB_TYPE_Q4_0](n, (const char *)w + (size_t)n4 * wrb, wrb, n_rows - n4, a, 0,
                                              1, y + n4, 0);
}

/* ---- decode: Q6_K, two rows per zmm ---------------------------------------
 * One token against up to four rows (the decode tile): the prefill panel's
 * arithmetic (row 2p in the low 256 bits, 2p + 1 in the high, each half the
 * AVX2 kernel's ymm lanes, from -32 * (scale * bsum)) with the codes
 * unpacked straight from the rows, no repack: per super-block one
 * vpmaddubsw and one vpdpwssd per chunk and row pair where the vnni tile
 * runs two of each, and one fma per row pair. The lanes' integers are the
 * AVX2 kernel's and each half's floats go through fma(dw * da, float(lanes),
 * acc) in its order, so the bits are the vnni tile's (test_matmul). Each
 * row's lines pf bytes on are prefetched (the tile: the next tile's rows,
 * R rows on, as the vnni tile does). */
RB_INLINE __m512i rb_join256(const void *lo, const void *hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

RB_INLINE void rb_dec_q6_K(int64_t n, const char *w, size_t wrb, const char *a, float *y,
                           const int R, size_t pf)
{
    enum { P = 2 };
    const int np = (R + 1) / 2;
    const __m512i m4 = _mm512_set1_epi8(0x0f), m3 = _mm512_set1_epi8(0x30);
    __m512 acc[P];
    RB_FOR(p, P) acc[p] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        const rb_block_q8_K *ab = (const rb_block_q8_K *)a + b;
        const __m512i bs = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)ab->bsums));
        const __m512 da = _mm512_set1_ps(ab->d);
        RB_FOR(p, P) {
            if (p >= np)
                break;
            const rb_block_q6_K *x0 = (const rb_block_q6_K *)(w + (size_t)(2 * p) * wrb) + b;
            /* an odd last row pairs with itself; its high half is dropped */
            const rb_block_q6_K *x1 = 2 * p + 1 < R ? (const rb_block_q6_K *)(w + (size_t)(2 * p + 1) * wrb) + b : x0;
            RB_FOR8(l, 4) _mm_prefetch((const char *)x0 + pf + 64 * l, _MM_HINT_T1);
            if (x1 != x0)
                RB_FOR8(l, 4) _mm_prefetch((const char *)x1 + pf + 64 * l, _MM_HINT_T1);
            const __m512i sc16 = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x0->scales))),
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x1->scales)), 1);
            __m512i sumi = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_madd_epi16(bs, sc16), 5));
            RB_FOR8(h, 2) {
                const __m512i l0 = rb_join256(x0->ql + 64 * h, x1->ql + 64 * h);
                const __m512i l1 = rb_join256(x0->ql + 64 * h + 32, x1->ql + 64 * h + 32);
                const __m512i qh = rb_join256(x0->qh + 32 * h, x1->qh + 32 * h);
                __m512i q[4];
                q[0] = _mm512_or_si512(_mm512_and_si512(l0, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m3));
                q[1] = _mm512_or_si512(_mm512_and_si512(l1, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m3));
                q[2] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), m4), _mm512_and_si512(qh, m3));
                q[3] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), m4),
                                       _mm512_and_si512(_mm512_srli_epi16(qh, 2), m3));
                RB_FOR8(k, 4) {
                    /* words 0..7 of each row: scale 8h + 2k, 8..15: 8h + 2k + 1 */
                    const int s = 8 * h + 2 * k;
                    const __m512i sel = _mm512_set_epi16(
                        16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1, 16 + s + 1,
                        16 + s + 1, 16 + s, 16 + s, 16 + s, 16 + s, 16 + s, 16 + s, 16 + s, 16 + s, s + 1,
                        s + 1, s + 1, s + 1, s + 1, s + 1, s + 1, s + 1, s, s, s, s, s, s, s, s);
                    const __m512i av = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(ab->qs + 128 * h + 32 * k)));
                    sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[k], av),
                                               _mm512_permutexvar_epi16(sel, sc16));
                }
            }
            const __m512 dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(rb_h2f(x0->d))),
                                                 _mm256_set1_ps(rb_h2f(x1->d)), 1);
            acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(sumi), acc[p]);
        }
    }
    RB_FOR(p, P) {
        if (2 * p < R)
            y[2 * p] = rb_hsum8(_mm512_castps512_ps256(acc[p]));
        if (2 * p + 1 < R)
            y[2 * p + 1] = rb_hsum8(_mm512_extractf32x8_ps(acc[p], 1));
    }
}

static void rb_tile_q6_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int n_tok, float *y, int64_t ys)
{
    if (n_tok != 1) {
        rb_matmul_isa_vnni.tile[RB_TYPE_Q6_K](n, w, wrb, n_rows, a, arb, n_tok, y, ys);
        return;
    }
    switch (n_rows) {
    case 1: rb_dec_q6_K(n, w, wrb, a, y, 1, 1 * wrb); break;
    case 2: rb_dec_q6_K(n, w, wrb, a, y, 2, 2 * wrb); break;
    case 3: rb_dec_q6_K(n, w, wrb, a, y, 3, 3 * wrb); break;
    case 4: rb_dec_q6_K(n, w, wrb, a, y, 4, 4 * wrb); break;
    default: break;
    }
}

/* the decode gemv: the tile above over a chunk's rows, four at a time (the
 * same bits), prefetching 16 rows ahead as the Q4_K gemv does. qwen3-0.6b's
 * tied output matrix (151936 x 1024, 122 MiB), Zen 4, one thread (CPU
 * time): 17.0 GB/s at the tile's 4 rows ahead, 23.8 at 8, 24.7 at 16, 23.6-
 * 24.7 at 32. */
#define RB_Q6_PF_ROWS 16
static void rb_gemv_q6_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                float *y)
{
    const char *wr = w;
    int r = 0;
    for (; r + 4 <= n_rows; r += 4)
        rb_dec_q6_K(n, wr + (size_t)r * wrb, wrb, a, y + r, 4, RB_Q6_PF_ROWS * wrb);
    if (r < n_rows) /* the last 1-3 rows: the tile, at its own distance */
        rb_tile_q6_K_avx512(n, wr + (size_t)r * wrb, wrb, n_rows - r, a, 0, 1, y + r, 0);
}

/* ---- decode: Q4_K, two rows per zmm for the integers, chains by row ------
 * The chains (matmul_avx2.c's rb_chains: one float per output row, per
 * super-block acc = fma(float(isum), dw * da, acc) and accm = fma(float(
 * imin), dmin * da, accm), y = acc - accm) need each row's exact integers
 * only, so these are computed two rows per zmm: the codes' low and high
 * nibbles by vpmaddubsw against the token's chunk broadcast to both halves,
 * vpdpwssd with the sub-block's scale of each row, and the mins of all four
 * rows in one vpmaddwd against the sub-block sums; one transpose gives the
 * four rows' isum and imin. The chains run as the vnni tile's four-row
 * lanes, whose per-lane arithmetic is also that of its scalar chains for
 * fewer rows: the vnni tile's bits (test_matmul).
 *
 * A block's first 16 bytes are d, dmin and the 12 scale bytes, so one zmm
 * holds the four rows' headers (128-bit lane r: row r) and the 6-bit
 * scales and mins of all four unpack there at once (rb_k4_scales_mins_u32's
 * arithmetic on dwords, ggml's kmask); d and dmin come out of it by one
 * vpermw, each sub-block's scale of a row pair by one vpshufb. The integer
 * sums run in two chains per row pair (low and high nibbles). Each row's
 * lines pf bytes on are prefetched (the tile: the next tile's rows). */
RB_INLINE __m512i rb_k4_load_hdr4(const char *const xr[4], int64_t b)
{
    const size_t o = (size_t)b * sizeof(rb_block_q4_K);
    __m512i h = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(xr[0] + o)));
    h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(xr[1] + o)), 1);
    h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(xr[2] + o)), 2);
    return _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(xr[3] + o)), 3);
}

/* lane r of h: [d dmin | q0..3 | q4..7 | q8..11] of row r -> bytes 0..7 its
 * scales, 8..15 its mins */
RB_INLINE __m512i rb_k4_unpack_hdr4(__m512i h)
{
    /* dwords (u0, u2, u1, u2) and (u0, u0, u1, u1) */
    const __m512i a = _mm512_shuffle_epi32(h, (_MM_PERM_ENUM)_MM_SHUFFLE(3, 2, 3, 1));
    const __m512i c = _mm512_shuffle_epi32(h, (_MM_PERM_ENUM)_MM_SHUFFLE(2, 2, 1, 1));
    const __m512i sh = _mm512_srlv_epi32(a, _mm512_set4_epi32(4, 0, 0, 0));
    const __m512i m_lo = _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f);
    const __m512i m_hi = _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0);
    /* (sh & m_lo) | (c >> 2 & m_hi) */
    return _mm512_or_si512(_mm512_and_si512(sh, m_lo), _mm512_and_si512(_mm512_srli_epi32(c, 2), m_hi));
}

RB_INLINE void rb_dec_q4_K(int64_t n, const char *w, size_t wrb, const char *a, float *y,
                           const int R, size_t pf)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i gather = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    /* word 8r: d of row r, 8r + 1: its dmin */
    const __m512i dsel = _mm512_zextsi128_si512(_mm_setr_epi16(0, 8, 16, 24, 1, 9, 17, 25));
    __m512i bsel[8];
    RB_FOR8(j, 8) bsel[j] = _mm512_set1_epi16((short)(0x0101 * 2 * j + 0x0100));
    const char *xr[4];
    RB_FOR(r, 4) xr[r] = w + (size_t)(r < R ? r : 0) * wrb;
    __m128 acc = _mm_setzero_ps(), accm = _mm_setzero_ps();
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        const rb_block_q8_K *ab = (const rb_block_q8_K *)a + b;
        const __m128i bsp = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab->bsums),
                                           _mm_loadu_si128((const __m128i *)(ab->bsums + 8)));
        RB_FOR(r, R) RB_FOR8(l, 3) _mm_prefetch(xr[r] + (size_t)b * sizeof(rb_block_q4_K) + pf + 64 * l,
                                                _MM_HINT_T1);
        const __m512i hdr = rb_k4_load_hdr4(xr, b);
        const __m512i u = rb_k4_unpack_hdr4(hdr);
        const __m512i sw = _mm512_unpacklo_epi8(u, _mm512_setzero_si512());
        const __m512i mn = _mm512_unpackhi_epi8(u, _mm512_setzero_si512());
        __m512i av[8];
        RB_FOR8(j, 8) av[j] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(ab->qs + 32 * j)));
        __m512i z[2];
        RB_FOR(p, 2) {
            const rb_block_q4_K *x0 = (const rb_block_q4_K *)xr[2 * p] + b;
            const rb_block_q4_K *x1 = (const rb_block_q4_K *)xr[2 * p + 1] + b;
            /* 128-bit lanes: row 2p's scales twice, row 2p + 1's twice */
            const __m512i sp = p == 0 ? _mm512_shuffle_i64x2(sw, sw, _MM_SHUFFLE(1, 1, 0, 0))
                                      : _mm512_shuffle_i64x2(sw, sw, _MM_SHUFFLE(3, 3, 2, 2));
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            RB_FOR8(g, 4) {
                const __m512i raw = rb_join256(x0->qs + 32 * g, x1->qs + 32 * g);
                const __m512i lo = _mm512_and_si512(raw, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
                s0 = _mm512_dpwssd_epi32(s0, _mm512_maddubs_epi16(lo, av[2 * g]),
                                         _mm512_shuffle_epi8(sp, bsel[2 * g]));
                s1 = _mm512_dpwssd_epi32(s1, _mm512_maddubs_epi16(hi, av[2 * g + 1]),
                                         _mm512_shuffle_epi8(sp, bsel[2 * g + 1]));
            }
            z[p] = _mm512_add_epi32(s0, s1);
        }
        /* the mins of row r in 128-bit lane r, against the 8 sub-block sums */
        const __m512i im = _mm512_madd_epi16(mn, _mm512_broadcast_i32x4(bsp));
        /* lane r: row r's 8 integer lanes folded to 4, then each lane's 4 of
         * isum and imin summed: isum of row r at dword 4r, imin at 4r + 1 */
        const __m512i uz = _mm512_add_epi32(_mm512_shuffle_i64x2(z[0], z[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                            _mm512_shuffle_i64x2(z[0], z[1], _MM_SHUFFLE(3, 1, 3, 1)));
        __m512i t = _mm512_add_epi32(_mm512_unpacklo_epi32(uz, im), _mm512_unpackhi_epi32(uz, im));
        t = _mm512_add_epi32(t, _mm512_shuffle_epi32(t, _MM_PERM_BADC));
        const __m256i is = _mm512_castsi512_si256(_mm512_permutexvar_epi32(gather, t));
        const __m128 dy = _mm_set1_ps(ab->d);
        /* d of rows 0..3, then their dmin */
        const __m256 dd = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutexvar_epi16(dsel, hdr)));
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm256_castsi256_si128(is)), _mm_mul_ps(_mm256_castps256_ps128(dd), dy), acc);
        accm = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm256_extracti128_si256(is, 1)), _mm_mul_ps(_mm256_extractf128_ps(dd, 1), dy),
                            accm);
    }
    float out[4];
    _mm_storeu_ps(out, _mm_sub_ps(acc, accm));
    RB_FOR(r, R) y[r] = out[r];
}

static void rb_tile_q4_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int n_tok, float *y, int64_t ys)
{
    if (n_tok != 1) {
        rb_matmul_isa_vnni.tile[RB_TYPE_Q4_K](n, w, wrb, n_rows, a, arb, n_tok, y, ys);
        return;
    }
    switch (n_rows) {
    case 1: rb_dec_q4_K(n, w, wrb, a, y, 1, 1 * wrb); break;
    case 2: rb_dec_q4_K(n, w, wrb, a, y, 2, 2 * wrb); break;
    case 3: rb_dec_q4_K(n, w, wrb, a, y, 3, 3 * wrb); break;
    case 4: rb_dec_q4_K(n, w, wrb, a, y, 4, 4 * wrb); break;
    default: break;
    }
}

/* the decode gemv: the tile above over a chunk's rows, four at a time (the
 * same bits), prefetching 16 rows ahead where the tile fetches the next
 * tile's 4: at the tile's distance a 1024-column matrix's lines (2.3 KB
 * ahead) arrive late. Measured on qwen3-0.6b's Q4_K shapes, Zen 4 (2
 * cores, 28 GB/s), one thread streaming them (CPU time): 14.2 GB/s at 4
 * rows ahead, 20.0 at 8, 21.6-24.7 at 16, 17.9 at 32 (the kernel before
 * the header unpack above: 14.0-14.6 at 4, 20.0-20.6 at 16). */
static void rb_gemv_q4_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                float *y)
{
    const char *wr = w;
    int r = 0;
    for (; r + 4 <= n_rows; r += 4)
        rb_dec_q4_K(n, wr + (size_t)r * wrb, wrb, a, y + r, 4, 16 * wrb);
    if (r < n_rows) /* the last 1-3 rows: the tile, at its own distance */
        rb_tile_q4_K_avx512(n, wr + (size_t)r * wrb, wrb, n_rows - r, a, 0, 1, y + r, 0);
}

/* ---- decode: Q5_K, two rows per zmm ---------------------------------------
 * matmul_avx2.c's rb_tile_q5_K with row 2p in the low 256 bits and 2p + 1
 * in the high: the 5-bit codes (bit j of qh as bit 4 of chunk j), each
 * half's 8 int32 lanes the AVX2 kernel's integers, fused per super-block by
 * fma(da * dw, float(lanes), acc); the four rows' mins in one vpmaddwd and
 * their scalar chains summs = fma(-da * dmin, imin, summs) as four lanes of
 * one vector (the same operations per lane). y = hsum8 + summs: the vnni
 * tile's bits (test_matmul). */
RB_INLINE void rb_dec_q5_K(int64_t n, const char *w, size_t wrb, const char *a, float *y,
                           const int R)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m16 = _mm512_set1_epi8(0x10);
    const __m512i gather = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const char *xr[4];
    RB_FOR(r, 4) xr[r] = w + (size_t)(r < R ? r : 0) * wrb;
    __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    __m128 summs = _mm_setzero_ps();
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        const rb_block_q8_K *ab = (const rb_block_q8_K *)a + b;
        const __m128i bsp = _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab->bsums),
                                           _mm_loadu_si128((const __m128i *)(ab->bsums + 8)));
        uint32_t sm[4][4];
        RB_FOR(p, 2) {
            const rb_block_q5_K *x0 = (const rb_block_q5_K *)xr[2 * p] + b;
            const rb_block_q5_K *x1 = (const rb_block_q5_K *)xr[2 * p + 1] + b;
            if (2 * p < R)
                RB_FOR8(l, 3) _mm_prefetch((const char *)x0 + R * wrb + 64 * l, _MM_HINT_T1);
            if (2 * p + 1 < R)
                RB_FOR8(l, 3) _mm_prefetch((const char *)x1 + R * wrb + 64 * l, _MM_HINT_T1);
            rb_k4_scales_mins_u32(x0->scales, sm[2 * p]);
            rb_k4_scales_mins_u32(x1->scales, sm[2 * p + 1]);
            const __m512i sc = _mm512_inserti64x4(
                _mm512_zextsi256_si512(_mm256_zextsi128_si256(
                    _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm[2 * p])))),
                _mm256_zextsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sm[2 * p + 1]))), 1);
            const __m512i hb = rb_join256(x0->qh, x1->qh);
            __m512i si = _mm512_setzero_si512();
            RB_FOR8(g, 4) {
                const __m512i raw = rb_join256(x0->qs + 32 * g, x1->qs + 32 * g);
                const int j0 = 2 * g, j1 = 2 * g + 1;
                const __m512i h0 = j0 <= 4 ? _mm512_slli_epi16(hb, 4 - j0) : _mm512_srli_epi16(hb, j0 - 4);
                const __m512i h1 = j1 <= 4 ? _mm512_slli_epi16(hb, 4 - j1) : _mm512_srli_epi16(hb, j1 - 4);
                const __m512i q0 = _mm512_or_si512(_mm512_and_si512(raw, m4), _mm512_and_si512(h0, m16));
                const __m512i q1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(raw, 4), m4),
                                                   _mm512_and_si512(h1, m16));
                const __m512i y0 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(ab->qs + 32 * j0)));
                const __m512i y1 = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(ab->qs + 32 * j1)));
                const __m512i s0 = _mm512_inserti64x4(_mm512_set1_epi16((short)j0), _mm256_set1_epi16((short)(16 + j0)), 1);
                const __m512i s1 = _mm512_inserti64x4(_mm512_set1_epi16((short)j1), _mm256_set1_epi16((short)(16 + j1)), 1);
                si = _mm512_dpwssd_epi32(si, _mm512_maddubs_epi16(q0, y0), _mm512_permutexvar_epi16(s0, sc));
                si = _mm512_dpwssd_epi32(si, _mm512_maddubs_epi16(q1, y1), _mm512_permutexvar_epi16(s1, sc));
            }
            const __m512 dw = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(rb_h2f(x0->d))),
                                                 _mm256_set1_ps(rb_h2f(x1->d)), 1);
            acc[p] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(ab->d), dw), _mm512_cvtepi32_ps(si), acc[p]);
        }
        __m512i mn = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&sm[0][2])));
        mn = _mm512_inserti32x4(mn, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&sm[1][2])), 1);
        mn = _mm512_inserti32x4(mn, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&sm[2][2])), 2);
        mn = _mm512_inserti32x4(mn, _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)&sm[3][2])), 3);
        __m512i im = _mm512_madd_epi16(mn, _mm512_broadcast_i32x4(bsp));
        im = _mm512_add_epi32(im, _mm512_shuffle_epi32(im, _MM_PERM_BADC));
        im = _mm512_add_epi32(im, _mm512_shuffle_epi32(im, _MM_PERM_CDAB));
        const __m128i imin = _mm512_castsi512_si128(_mm512_permutexvar_epi32(gather, im));
        rb_f16 hm[4];
        RB_FOR(r, 4)
            memcpy(&hm[r], xr[r] + b * sizeof(rb_block_q5_K) + offsetof(rb_block_q5_K, dmin), sizeof(rb_f16));
        const __m128 dwm = _mm_cvtph_ps(_mm_setr_epi16((short)hm[0], (short)hm[1], (short)hm[2], (short)hm[3], 0, 0, 0, 0));
        summs = _mm_fmadd_ps(_mm_mul_ps(_mm_set1_ps(-ab->d), dwm), _mm_cvtepi32_ps(imin), summs);
    }
    float sv[4];
    _mm_storeu_ps(sv, summs);
    RB_FOR(p, 2) {
        if (2 * p < R)
            y[2 * p] = rb_hsum8(_mm512_castps512_ps256(acc[p])) + sv[2 * p];
        if (2 * p + 1 < R)
            y[2 * p + 1] = rb_hsum8(_mm512_extractf32x8_ps(acc[p], 1)) + sv[2 * p + 1];
    }
}

static void rb_tile_q5_K_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int n_tok, float *y, int64_t ys)
{
    if (n_tok != 1) {
        rb_matmul_isa_vnni.tile[RB_TYPE_Q5_K](n, w, wrb, n_rows, a, arb, n_tok, y, ys);
        return;
    }
    switch (n_rows) {
    case 1: rb_dec_q5_K(n, w, wrb, a, y, 1); break;
    case 2: rb_dec_q5_K(n, w, wrb, a, y, 2); break;
    case 3: rb_dec_q5_K(n, w, wrb, a, y, 3); break;
    case 4: rb_dec_q5_K(n, w, wrb, a, y, 4); break;
    default: break;
    }
}

/* ---- instantiation (matmul_avx2.c's shape switch) ---------------------------- */

#define RB_SHAPES(CALL)                                                               \
    switch (n_rows * 8 + n_tok) {                                                     \
    case 1 * 8 + 1: CALL(1, 1); break; case 1 * 8 + 2: CALL(1, 2); break;              \
    case 1 * 8 + 3: CALL(1, 3); break; case 1 * 8 + 4: CALL(1, 4); break;              \
    case 2 * 8 + 1: CALL(2, 1); break; case 2 * 8 + 2: CALL(2, 2); break;              \
    case 2 * 8 + 3: CALL(2, 3); break; case 2 * 8 + 4: CALL(2, 4); break;              \
    case 3 * 8 + 1: CALL(3, 1); break; case 3 * 8 + 2: CALL(3, 2); break;              \
    case 3 * 8 + 3: CALL(3, 3); break; case 3 * 8 + 4: CALL(3, 4); break;              \
    case 4 * 8 + 1: CALL(4, 1); break; case 4 * 8 + 2: CALL(4, 2); break;              \
    case 4 * 8 + 3: CALL(4, 3); break; case 4 * 8 + 4: CALL(4, 4); break;              \
    default: break;                                                                   \
    }

#define RB_DEF_TILE(fname, body)                                                        \
    static void fname(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,   \
                      size_t arb, int n_tok, float *y, int64_t ys)                       \
    {                                                                                    \
        _Static_assert(RB_TILE_MAX == 4, "shapes below");                                \
        const char *wc = w, *ac = a;                                                     \
        RB_SHAPES(body)                                                                  \
    }

#define RB_C_Q4_0(R, T) rb_tile_q4_0(n, wc, wrb, ac, arb, y, ys, R, T)
#define RB_C_Q8_0(R, T) rb_tile_q8_0(n, wc, wrb, ac, arb, y, ys, R, T)

RB_DEF_TILE(rb_tile_q4_0_avx512_body, RB_C_Q4_0)

/* Q4_0 decode (one token) stays on the vnni kernel: with weights streaming
 * from DRAM its lagged per-block reduction kept the loads going, and this
 * one's two-block join ran 16-18% more CPU time per token (tinyllama tg16,
 * 1 thread, perf samples, Zen 4); the prefill tiles are this file's. Both
 * give the same bits. */
static void rb_tile_q4_0_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int n_tok, float *y, int64_t ys)
{
    if (n_tok == 1)
        rb_matmul_isa_vnni.tile[RB_TYPE_Q4_0](n, w, wrb, n_rows, a, arb, n_tok, y, ys);
    else
        rb_tile_q4_0_avx512_body(n, w, wrb, n_rows, a, arb, n_tok, y, ys);
}
RB_DEF_TILE(rb_tile_q8_0_avx512_body, RB_C_Q8_0)

/* Q8_0 decode on the vnni kernel too: this file's two-block tile streamed
 * 6.3-9.6 GB/s against the vnni one's 10.4-12.7 (bench_matmul --cputime,
 * one thread, tinyllama's shapes, Zen 4); the same bits either way */
static void rb_tile_q8_0_avx512(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,
                                size_t arb, int n_tok, float *y, int64_t ys)
{
    if (n_tok == 1)
        rb_matmul_isa_vnni.tile[RB_TYPE_Q8_0](n, w, wrb, n_rows, a, arb, n_tok, y, ys);
    else
        rb_tile_q8_0_avx512_body(n, w, wrb, n_rows, a, arb, n_tok, y, ys);
}

const rb_matmul_isa rb_matmul_isa_avx512_own = {
    .name = "avx512",
    .tile = {
        [RB_TYPE_Q4_0] = rb_tile_q4_0_avx512,
        [RB_TYPE_Q8_0] = rb_tile_q8_0_avx512,
        [RB_TYPE_Q6_K] = rb_tile_q6_K_avx512,
        [RB_TYPE_Q4_K] = rb_tile_q4_K_avx512,
        [RB_TYPE_Q5_K] = rb_tile_q5_K_avx512,
    },
    .gemv = {
        [RB_TYPE_Q4_0] = rb_gemv_q4_0_avx512,
        [RB_TYPE_Q4_K] = rb_gemv_q4_K_avx512,
        [RB_TYPE_Q6_K] = rb_gemv_q6_K_avx512,
    },
    .few = {
        [RB_TYPE_Q4_0] = rb_few_q4_0_avx512,
    },
    .gemm = {
        [RB_TYPE_Q4_0] = rb_gemm_q4_0_avx512,
        [RB_TYPE_Q8_0] = rb_gemm_q8_0_avx512,
        [RB_TYPE_Q4_K] = rb_gemm_q4_K_avx512,
        [RB_TYPE_Q6_K] = rb_gemm_q6_K_avx512,
        [RB_TYPE_Q5_K] = rb_gemm_q5_K_avx512,
    },
    .gemm_side = {
        [RB_TYPE_Q4_0] = rb_gemm_side_q4_0,
        [RB_TYPE_Q8_0] = rb_gemm_side_q8_0,
        [RB_TYPE_Q4_K] = rb_gemm_side_q4_K,
        [RB_TYPE_Q6_K] = rb_gemm_side_q6_K,
        [RB_TYPE_Q5_K] = rb_gemm_side_q6_K,
    },
    .gemm_corr_lanes = {
        [RB_TYPE_Q4_0] = 1,
        [RB_TYPE_Q8_0] = 8,
        [RB_TYPE_Q4_K] = 4,
        [RB_TYPE_Q6_K] = 0,
        [RB_TYPE_Q5_K] = 0,
    },
};

#else
typedef int rb_matmul_avx512_unused; /* ISO C: a translation unit is not empty */
#endif
