/*
 * matmul_avx2.c - AVX2 + FMA + F16C kernels (this file alone is compiled
 * with -mavx2 -mfma -mf16c; cpu.c decides at run time whether they run).
 *
 * Tiles: every kernel is one always-inline body instantiated for each tile
 * shape (R rows x T tokens, 1..4 each): per block, the weight row is
 * unpacked once and used for all T tokens; each (r, t) pair has its own
 * 8-lane float accumulator, reduced by the same horizontal sum at the end.
 * That makes the result of (r, t) independent of the tile shape (see
 * matmul_kernels.h), so decode (R = 4, T = 1) and prefill (R = 2, T = 4)
 * give identical numbers for a token.
 *
 * Integer dot products: u8 x s8 -> s32 lanes of 4 products. With AVX-VNNI
 * or AVX512-VNNI+VL available that is one vpdpbusd; otherwise
 * maddubs + madd(1) + add (no saturation is possible: |u| <= 128,
 * |s| <= 127, pair sums <= 32512). The two paths give identical integers.
 *   Q4_0 / Q5_0: unsigned codes q times a, minus 8 (16) * sum(a) per lane:
 *                equals sum (q - 8) * a exactly, without the sign trick.
 *   Q8_0: |w| times sign(a, w) (ggml's trick).
 *   Q4_K / Q5_K: maddubs of the 4- (5-) bit codes, then madd with the 6-bit
 *         scale (int16); the mins from the activation's bsums.
 *   Q4_1 / Q5_1: unsigned codes times a; the offset m * s from the Q8_1 block.
 *   Q6_K: maddubs of the unsigned 6-bit codes, madd with the scales, minus
 *         32 * scale * bsum per lane (ggml's AVX2 form since llama.cpp PR
 *         22345): every int32 lane holds exactly the integer of ggml's
 *         lane, so the per-lane float FMA and the final hsum round as
 *         llama.cpp's do.
 * Float order (the golden build, llama.cpp 34af94cd9, AVX2): Q4_0 and Q4_K
 * matrices are repacked at load there and run ggml_gemv_*_8x8, one float
 * chain per output (rb_chains below); Q5_0, Q8_0, Q6_K, Q5_K, Q4_1, Q5_1
 * run ggml_vec_dot_* (8 float lanes, hsum at the end; Q5_K, Q4_1, Q5_1 add a
 * scalar chain of their min / offset terms after the hsum); F32 / F16 ggml_vec_dot_f32/_f16's order
 * (fp_dot.h), per (r, t). With these, every reference file's logits are
 * llama.cpp's bit for bit (test_golden).
 * Prefetch: each row prefetches the same block of the row R rows further
 * on (the next tile): with only the hardware prefetcher a core streamed
 * 2048-column Q4_0 rows from DRAM at ~7 GB/s, with it ~12 GB/s (1 thread)
 * and tinyllama decode matmuls went from 24 to 32 tok/s on 2 threads.
 * Into L2 (T1), not L1: on Zen 4 the L1 hint kept the Q8_0 rows at 11-12
 * GB/s and L2 gave 14-20 (bench_matmul-style, 1 thread, 256 x 2048 rows
 * cycled through 150 MB).
 */
#include "matmul_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "fp_dot.h"

#define RB_INLINE static inline __attribute__((always_inline))

/* The build of this file: avx2 (default), or vnni (matmul_vnni.c includes
 * it with RB_AVX2_VNNI and the AVX512-VL + VNNI flags: the same kernels with
 * vpdpbusd / vpdpwssd for the integer products, which give the same
 * integers, so the vnni tier's results are the avx2 tier's bit for bit). */
#if defined(RB_AVX2_VNNI) && !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
#error "matmul_vnni.c needs -mavx512vl -mavx512vnni"
#endif
#ifdef RB_AVX2_VNNI
#define RB_AVX2_TABLE rb_matmul_isa_vnni
#define RB_AVX2_NAME "vnni"
#else
#define RB_AVX2_TABLE rb_matmul_isa_avx2
#define RB_AVX2_NAME "avx2"
#endif

/* acc + sum of 4 u8*s8 products per int32 lane */
RB_INLINE __m256i rb_dot_u8s8(__m256i acc, __m256i u, __m256i s)
{
#ifdef RB_AVX2_VNNI
    return _mm256_dpbusd_epi32(acc, u, s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s),
                                                   _mm256_set1_epi16(1)));
#endif
}

/* acc + sum of 2 s16*s16 products per int32 lane */
RB_INLINE __m256i rb_madd16_acc(__m256i acc, __m256i a, __m256i b)
{
#ifdef RB_AVX2_VNNI
    return _mm256_dpwssd_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

RB_INLINE float rb_hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* exact integer sums of the lanes */
RB_INLINE int32_t rb_hsum_i32x4(__m128i v)
{
    v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
    v = _mm_add_epi32(v, _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(v);
}

RB_INLINE int32_t rb_hsum_i32x8(__m256i v)
{
    return rb_hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

/* lane k = exact sum of the int32 lanes of vk */
RB_INLINE __m128i rb_hsum4x_i32x8(__m256i v0, __m256i v1, __m256i v2, __m256i v3)
{
    /* a 4 x 4 transpose-and-add per 128-bit half, then the halves: 2.5%
     * faster than three vphaddd (Q4_0 decode tile, EPYC) */
    const __m256i a01 = _mm256_add_epi32(_mm256_unpacklo_epi32(v0, v1), _mm256_unpackhi_epi32(v0, v1));
    const __m256i a23 = _mm256_add_epi32(_mm256_unpacklo_epi32(v2, v3), _mm256_unpackhi_epi32(v2, v3));
    const __m256i h = _mm256_add_epi32(_mm256_unpacklo_epi64(a01, a23), _mm256_unpackhi_epi64(a01, a23));
    return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

RB_INLINE __m128i rb_hsum4x_i32x4(__m128i v0, __m128i v1, __m128i v2, __m128i v3)
{
    return _mm_hadd_epi32(_mm_hadd_epi32(v0, v1), _mm_hadd_epi32(v2, v3));
}

RB_INLINE float rb_h2f(rb_f16 h) { return _cvtsh_ss(h); }

/* 32 4-bit codes of a Q4_0/Q5_0 block as bytes in element order */
RB_INLINE __m256i rb_nibbles32(const uint8_t *qs)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}

/* byte i = 0x10 when bit i of the 32-bit qh is set, else 0 */
RB_INLINE __m256i rb_bits32_x16(const uint8_t *qh)
{
    uint32_t x32;
    memcpy(&x32, qh, sizeof x32);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x32), shuf);
    bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    bytes = _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(bytes, _mm256_set1_epi8(0x10));
}

/* ---- activation converters ----------------------------------------------- */

#define RB_FOR4_ACT(i) _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)


/* four vectors of 8 integral floats -> 32 int8 in order (saturating) */
RB_INLINE __m256i rb_pack32_i8(__m256 v0, __m256 v1, __m256 v2, __m256 v3)
{
    __m256i i0 = _mm256_cvtps_epi32(v0), i1 = _mm256_cvtps_epi32(v1);
    __m256i i2 = _mm256_cvtps_epi32(v2), i3 = _mm256_cvtps_epi32(v3);
    i0 = _mm256_packs_epi32(i0, i1);
    i2 = _mm256_packs_epi32(i2, i3);
    i0 = _mm256_packs_epi16(i0, i2);
    return _mm256_permutevar8x32_epi32(i0, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Same bytes as rb_quantize_act_q8_0_ref: d = amax / 127, id = 127 / amax,
 * codes rounded half to even (|x * id| <= 127 up to rounding; saturating pack). */
static void rb_quantize_act_q8_0_avx2(const float *x, void *dst, int64_t n)
{
    rb_block_q8_0 *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / RB_QK8_0; b++, x += RB_QK8_0) {
        __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
        __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m256 vid = _mm256_set1_ps(id);
#define RB_RNE(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
        __m256i q = rb_pack32_i8(RB_RNE(_mm256_mul_ps(v0, vid)), RB_RNE(_mm256_mul_ps(v1, vid)),
                                 RB_RNE(_mm256_mul_ps(v2, vid)), RB_RNE(_mm256_mul_ps(v3, vid)));
#undef RB_RNE
        _mm256_storeu_si256((__m256i *)y[b].qs, q);
    }
}

/* Same bytes as rb_quantize_act_q8_1_ref: Q8_0's codes and d, and
 * s = fp16(d * sum of the codes), the sum taken from the rounded floats
 * before the saturating pack, as llama.cpp's quantize_row_q8_1 does */
static void rb_quantize_act_q8_1_avx2(const float *x, void *dst, int64_t n)
{
    rb_block_q8_1 *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / RB_QK8_0; b++, x += RB_QK8_0) {
        __m256 v[4];
        RB_FOR4_ACT(k) v[k] = _mm256_loadu_ps(x + 8 * k);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        y[b].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m256 vid = _mm256_set1_ps(id);
        __m256 r[4];
        RB_FOR4_ACT(k) r[k] = _mm256_round_ps(_mm256_mul_ps(v[k], vid),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(r[0]), _mm256_cvtps_epi32(r[1])),
                                             _mm256_add_epi32(_mm256_cvtps_epi32(r[2]), _mm256_cvtps_epi32(r[3])));
        y[b].s = _cvtss_sh(d * (float)rb_hsum_i32x8(s32), _MM_FROUND_TO_NEAREST_INT);
        _mm256_storeu_si256((__m256i *)y[b].qs, rb_pack32_i8(r[0], r[1], r[2], r[3]));
    }
}

/* Same bytes as rb_quantize_act_q8_K_ref (ggml's quantize_row_q8_K_ref). */
static void rb_quantize_act_q8_K_avx2(const float *x, void *dst, int64_t n)
{
    rb_block_q8_K *y = dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / RB_QK_K; b++, x += RB_QK_K) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < RB_QK_K; j += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (!(amax > 0.0f)) { /* zero block (or NaN: unspecified, but defined) */
            memset(&y[b], 0, sizeof y[b]);
            continue;
        }
        /* the first element of largest magnitude gives the sign of the scale */
        float max = amax;
        const __m256 vamax = _mm256_set1_ps(amax);
        for (int j = 0; j < RB_QK_K; j += 8) {
            __m256 v = _mm256_loadu_ps(x + j);
            int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, v), vamax, _CMP_EQ_OQ));
            if (mask) {
                max = x[j + __builtin_ctz((unsigned)mask)];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 vis = _mm256_set1_ps(iscale);
        for (int j = 0; j < RB_QK_K; j += 32) {
            __m256 r[4];
            for (int k = 0; k < 4; k++)
                r[k] = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vis),
                                       _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            __m256i q = rb_pack32_i8(r[0], r[1], r[2], r[3]);
            _mm256_storeu_si256((__m256i *)(y[b].qs + j), q);
            /* bsums of the two 16-groups */
            __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
            __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
            /* low 128 bits: elements j..j+15, high: j+16..j+31 */
            __m128i lo = _mm256_castsi256_si128(s32), hi = _mm256_extracti128_si256(s32, 1);
            lo = _mm_hadd_epi32(lo, hi);
            lo = _mm_hadd_epi32(lo, lo);
            y[b].bsums[j / 16] = (int16_t)_mm_cvtsi128_si32(lo);
            y[b].bsums[j / 16 + 1] = (int16_t)_mm_extract_epi32(lo, 1);
        }
        y[b].d = 1.0f / iscale;
    }
}

static void rb_quantize_act_f16_avx2(const float *x, void *dst, int64_t n)
{
    rb_f16 *y = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = rb_fp32_to_fp16(x[i]);
}

/* ggml's bf16 rounding: NaN -> truncated with the quiet bit set, otherwise
 * round to nearest even on the top 16 bits. */
static void rb_quantize_act_bf16_avx2(const float *x, void *dst, int64_t n)
{
    rb_bf16 *y = dst;
    int64_t i = 0;
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    for (; i + 16 <= n; i += 16) {
        __m256i h[2];
        for (int k = 0; k < 2; k++) {
            __m256i u = _mm256_castps_si256(_mm256_loadu_ps(x + i + 8 * k));
            __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            __m256i rnd = _mm256_srli_epi32(
                _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd), 16);
            __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
            h[k] = _mm256_blendv_epi8(rnd, qnan, is_nan);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(y + i), p);
    }
    for (; i < n; i++)
        y[i] = rb_fp32_to_bf16(x[i]);
}

/* A K-quant block's 12 bytes of 6-bit scales and mins: scales to bytes
 * 0..7, mins to bytes 8..15 (ggml's kmask arithmetic, the values of
 * rb_k4_scales_mins); shared by the Q4_K and Q5_K tiles. */
static inline __m128i k_scales_mins(const uint8_t scales[12])
{
    uint32_t u[4];
    rb_k4_scales_mins_u32(scales, u);
    return _mm_loadu_si128((const __m128i *)u);
}

/* A Q8_K block's 16 sums of 16 as the 8 sums of its 32-element sub-blocks. */
static inline __m128i q8_K_pair_sums(const rb_block_q8_K *ab)
{
    return _mm_hadd_epi16(_mm_loadu_si128((const __m128i *)ab->bsums),
                          _mm_loadu_si128((const __m128i *)(ab->bsums + 8)));
}

static void rb_quantize_act_f32_avx2(const float *x, void *dst, int64_t n)
{
    memcpy(dst, x, (size_t)n * sizeof(float));
}

/* ---- tile bodies ------------------------------------------------------------
 * w: row r at w + r * wrb; a: token t at a + t * arb; y[t * ys + r]. */

#define RB_FOR(i, n) _Pragma("GCC unroll 4") for (int i = 0; i < (n); i++)
#define RB_FOR8(i, n) _Pragma("GCC unroll 8") for (int i = 0; i < (n); i++)

/*
 * Scalar chains: on AVX2 llama.cpp repacks Q4_0 and Q4_K matrices whose row
 * count is a multiple of 8 (ggml-cpu/repack.cpp, q4_0_8x8 / q4_K_8x8) and
 * decodes with ggml_gemv_*_8x8 (one token per call is always a gemv), which
 * keeps ONE float per output row: per block, the block's exact integer dot
 * product is converted and fused-multiply-added,
 *     acc = fma((float)isum_block, dw * da, acc).
 * Four such chains share a vector here: lanes = tokens when T == 4 (prefill
 * tiles), rows when R == 4 (decode tiles), otherwise one scalar per (r, t).
 * Each lane does the scalar's operations, so the grouping (and hence tile
 * shape, chunking and thread count) never changes a bit. The horizontal
 * integer sums of 4 (r, t) pairs are done together (rb_hsum4x_*).
 * A matrix whose row count is not a multiple of 8 is not repacked by
 * llama.cpp and keeps ggml_vec_dot's 8-lane order there; rebound uses the
 * chains for every Q4_0 / Q4_K matrix (no model of the shapes we know has
 * such a matrix).
 */
typedef struct rb_chains {
    __m128 v[RB_TILE_MAX];                /* T == 4: v[r], lane t; R == 4: v[t], lane r */
    float s[RB_TILE_MAX][RB_TILE_MAX];    /* otherwise */
} rb_chains;

RB_INLINE void rb_chains_zero(rb_chains *c, const int R, const int T)
{
    RB_FOR(i, RB_TILE_MAX) c->v[i] = _mm_setzero_ps();
    RB_FOR(r, R) RB_FOR(t, T) c->s[r][t] = 0.0f;
}

/* one block: the integer sums are the int32 lanes of p[r][t] (8 lanes, or 4
 * when p4 is used), the scale dw[r] * dy[t]; dyv holds dy[0..3] when T == 4,
 * dwv holds dw[0..3] when R == 4 (built by the caller from the blocks'
 * f16 fields: loading them as a vector from the scalars just stored made
 * the Q4_0 decode tile 1.9x slower, a store-forwarding stall by the look of
 * it) */
RB_INLINE void rb_chains_step(rb_chains *c, const __m256i p[RB_TILE_MAX][RB_TILE_MAX],
                              const __m128i p4[RB_TILE_MAX][RB_TILE_MAX], const float *dw,
                              const float *dy, __m128 dwv, __m128 dyv, const int R, const int T)
{
#define RB_ISUM4(a, b, cc, d) (p4 ? rb_hsum4x_i32x4(p4 a, p4 b, p4 cc, p4 d) \
                                  : rb_hsum4x_i32x8(p a, p b, p cc, p d))
    if (T == 4) {
        RB_FOR(r, R) {
            const __m128i is = RB_ISUM4([r][0], [r][1], [r][2], [r][3]);
            c->v[r] = _mm_fmadd_ps(_mm_cvtepi32_ps(is), _mm_mul_ps(_mm_set1_ps(dw[r]), dyv), c->v[r]);
        }
    } else if (R == 4) {
        RB_FOR(t, T) {
            const __m128i is = RB_ISUM4([0][t], [1][t], [2][t], [3][t]);
            c->v[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(is), _mm_mul_ps(dwv, _mm_set1_ps(dy[t])), c->v[t]);
        }
    } else {
        RB_FOR(r, R) RB_FOR(t, T) {
            const int32_t is = p4 ? rb_hsum_i32x4(p4[r][t]) : rb_hsum_i32x8(p[r][t]);
            c->s[r][t] = fmaf((float)is, dw[r] * dy[t], c->s[r][t]);
        }
    }
#undef RB_ISUM4
}

/* four f16 at p, p + stride, ... as floats */
RB_INLINE __m128 rb_h2f_x4(const char *p, size_t stride)
{
    rb_f16 h[4];
    RB_FOR(k, 4) memcpy(&h[k], p + k * stride, sizeof h[k]);
    return _mm_cvtph_ps(_mm_setr_epi16((short)h[0], (short)h[1], (short)h[2], (short)h[3], 0, 0, 0, 0));
}

RB_INLINE void rb_chains_get(const rb_chains *c, float out[RB_TILE_MAX][RB_TILE_MAX], const int R,
                             const int T)
{
    float l[RB_TILE_MAX][4];
    RB_FOR(i, RB_TILE_MAX) _mm_storeu_ps(l[i], c->v[i]);
    RB_FOR(r, R) RB_FOR(t, T) out[r][t] = T == 4 ? l[r][t] : R == 4 ? l[t][r] : c->s[r][t];
}

/* Q4_0 (off 8) and Q5_0 (off 16) against Q8_0. Q4_0 in the chains of
 * llama.cpp's repacked gemv (above); Q5_0, which llama.cpp does not repack
 * on AVX2, in ggml_vec_dot_q5_0_q8_0's 8 float lanes and hsum.
 * Decode tiles (T == 1) reduce block b - 2 after loading block b: the
 * reduction of a block waits for all R rows, and with weights streaming
 * from DRAM that join stalled the loads behind it (Q4_0 decode from DRAM
 * at 0.89x of the 8-lane kernel; lag 1: ~0.96x; lag 2: ~1.0-1.06x; EPYC,
 * one thread). Prefill tiles have the registers for no lag (lag 2 there:
 * 0.82x from spills). */
RB_INLINE void rb_tile_q4_5_0(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                              float *y, int64_t ys, const int R, const int T, const int is_q5)
{
    __m256 acc[RB_TILE_MAX][RB_TILE_MAX];
    RB_FOR(r, R) RB_FOR(t, T) acc[r][t] = _mm256_setzero_ps();
    rb_chains ch;
    rb_chains_zero(&ch, R, T);
    const int lag = T == 1 ? 2 : 0;
    /* blocks b - 1 (1) and b - 2 (2) waiting for their reduction */
    __m256i p1[RB_TILE_MAX][RB_TILE_MAX], p2[RB_TILE_MAX][RB_TILE_MAX];
    float dw1[RB_TILE_MAX] = {0}, dw2[RB_TILE_MAX] = {0}, dy1[RB_TILE_MAX] = {0},
          dy2[RB_TILE_MAX] = {0};
    RB_FOR(r, R) RB_FOR(t, T) p1[r][t] = p2[r][t] = _mm256_setzero_si256();
    __m128 dwv1 = _mm_setzero_ps(), dwv2 = _mm_setzero_ps();
    const __m128 z = _mm_setzero_ps();
    const __m256i koff = _mm256_set1_epi8(is_q5 ? 16 : 8);
    const size_t wbb = is_q5 ? sizeof(rb_block_q5_0) : sizeof(rb_block_q4_0);
    const int64_t nb = n / RB_QK8_0;
    for (int64_t b = 0; b < nb; b++) {
        __m256i ya[RB_TILE_MAX], nc[RB_TILE_MAX], p[RB_TILE_MAX][RB_TILE_MAX];
        float dy[RB_TILE_MAX], dw[RB_TILE_MAX];
        RB_FOR(t, T) {
            const rb_block_q8_0 *ab = (const rb_block_q8_0 *)(a + t * arb) + b;
            ya[t] = _mm256_loadu_si256((const __m256i *)ab->qs);
            nc[t] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                     rb_dot_u8s8(_mm256_setzero_si256(), koff, ya[t]));
            dy[t] = rb_h2f(ab->d);
        }
        RB_FOR(r, R) {
            const char *wb = w + r * wrb + b * wbb;
            /* the same block of the next tile's rows: ~R rows ahead in the
             * stream, enough to cover DRAM latency (the hardware prefetcher
             * alone gave 7 GB/s on one core for 2048-column rows) */
            _mm_prefetch(wb + R * wrb, _MM_HINT_T1);
            __m256i q;
            if (is_q5) {
                const rb_block_q5_0 *x = (const rb_block_q5_0 *)wb;
                q = _mm256_or_si256(rb_nibbles32(x->qs), rb_bits32_x16(x->qh));
                dw[r] = rb_h2f(x->d);
            } else {
                const rb_block_q4_0 *x = (const rb_block_q4_0 *)wb;
                q = rb_nibbles32(x->qs);
                dw[r] = rb_h2f(x->d);
            }
            RB_FOR(t, T) {
                p[r][t] = rb_dot_u8s8(nc[t], q, ya[t]);
                if (is_q5)
                    acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw[r] * dy[t]),
                                                _mm256_cvtepi32_ps(p[r][t]), acc[r][t]);
            }
        }
        if (is_q5)
            continue;
        const __m128 dyv = T == 4 ? rb_h2f_x4(a + b * sizeof(rb_block_q8_0), arb) : z;
        const __m128 dwv = R == 4 ? rb_h2f_x4(w + b * wbb, wrb) : z;
        if (lag == 0) {
            rb_chains_step(&ch, p, NULL, dw, dy, dwv, dyv, R, T);
            continue;
        }
        /* lag 2 (T == 1, so dyv is unused) */
        if (b >= 2)
            rb_chains_step(&ch, p2, NULL, dw2, dy2, dwv2, z, R, T);
        RB_FOR(r, R) {
            dw2[r] = dw1[r];
            dw1[r] = dw[r];
            RB_FOR(t, T) {
                p2[r][t] = p1[r][t];
                p1[r][t] = p[r][t];
            }
        }
        RB_FOR(t, T) {
            dy2[t] = dy1[t];
            dy1[t] = dy[t];
        }
        dwv2 = dwv1;
        dwv1 = dwv;
    }
    if (is_q5) {
        RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = rb_hsum8(acc[r][t]);
        return;
    }
    if (lag == 2) { /* the last two blocks, in order */
        if (nb >= 2)
            rb_chains_step(&ch, p2, NULL, dw2, dy2, dwv2, z, R, T);
        if (nb >= 1)
            rb_chains_step(&ch, p1, NULL, dw1, dy1, dwv1, z, R, T);
    }
    float out[RB_TILE_MAX][RB_TILE_MAX];
    rb_chains_get(&ch, out, R, T);
    RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = out[r][t];
}

RB_INLINE void rb_tile_q8_0(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                            float *y, int64_t ys, const int R, const int T)
{
    __m256 acc[RB_TILE_MAX][RB_TILE_MAX];
    RB_FOR(r, R) RB_FOR(t, T) acc[r][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        __m256i ya[RB_TILE_MAX];
        float dy[RB_TILE_MAX];
        RB_FOR(t, T) {
            const rb_block_q8_0 *ab = (const rb_block_q8_0 *)(a + t * arb) + b;
            ya[t] = _mm256_loadu_si256((const __m256i *)ab->qs);
            dy[t] = rb_h2f(ab->d);
        }
        RB_FOR(r, R) {
            const rb_block_q8_0 *x = (const rb_block_q8_0 *)(w + r * wrb) + b;
            _mm_prefetch((const char *)x + R * wrb, _MM_HINT_T1);
            _mm_prefetch((const char *)x + R * wrb + 32, _MM_HINT_T1);
            __m256i q = _mm256_loadu_si256((const __m256i *)x->qs);
            __m256i u = _mm256_sign_epi8(q, q);
            float dw = rb_h2f(x->d);
            RB_FOR(t, T) {
                __m256i p = rb_dot_u8s8(_mm256_setzero_si256(), u, _mm256_sign_epi8(ya[t], q));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dy[t]), _mm256_cvtepi32_ps(p), acc[r][t]);
            }
        }
    }
    RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = rb_hsum8(acc[r][t]);
}

RB_INLINE void rb_tile_q4_K(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                            float *y, int64_t ys, const int R, const int T)
{
    /* ggml_gemv_q4_K_8x8_q8_K's order (the chains above): per super-block
     * the exact integers sum(scale * q * a) and sum(min * bsum) go into two
     * chains, with d * da and dmin * da; the output is their difference */
    rb_chains acc, accm;
    rb_chains_zero(&acc, R, T);
    rb_chains_zero(&accm, R, T);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        __m256i sumi[RB_TILE_MAX][RB_TILE_MAX];
        __m128i prod[RB_TILE_MAX][RB_TILE_MAX], bs[RB_TILE_MAX];
        float dy[RB_TILE_MAX], dw[RB_TILE_MAX], dwm[RB_TILE_MAX];
        RB_FOR(t, T) {
            const rb_block_q8_K *ab = (const rb_block_q8_K *)(a + t * arb) + b;
            /* the 8 sub-block sums of 32 */
            bs[t] = q8_K_pair_sums(ab);
            dy[t] = ab->d;
        }
        RB_FOR(r, R) {
            const rb_block_q4_K *x = (const rb_block_q4_K *)(w + r * wrb) + b;
            RB_FOR8(l, 3) _mm_prefetch((const char *)x + R * wrb + 64 * l, _MM_HINT_T1);
            const __m128i sm = k_scales_mins(x->scales);
            const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
            const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
            __m256i scv[8]; /* scale j in every int16 lane */
            RB_FOR8(j, 8) scv[j] = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
            __m256i lo[4], hi[4];
            RB_FOR8(g, 4) {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * g));
                lo[g] = _mm256_and_si256(raw, m4);
                hi[g] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            }
            dw[r] = rb_h2f(x->d);
            dwm[r] = rb_h2f(x->dmin);
            RB_FOR(t, T) {
                const rb_block_q8_K *ab = (const rb_block_q8_K *)(a + t * arb) + b;
                __m256i si = _mm256_setzero_si256();
                RB_FOR8(g, 4) {
                    __m256i p0 = _mm256_maddubs_epi16(lo[g], _mm256_loadu_si256((const __m256i *)(ab->qs + 64 * g)));
                    __m256i p1 = _mm256_maddubs_epi16(hi[g], _mm256_loadu_si256((const __m256i *)(ab->qs + 64 * g + 32)));
                    si = rb_madd16_acc(si, p0, scv[2 * g]);
                    si = rb_madd16_acc(si, p1, scv[2 * g + 1]);
                }
                sumi[r][t] = si;
                prod[r][t] = _mm_madd_epi16(mins16, bs[t]);
            }
        }
        const rb_block_q8_K *a0 = (const rb_block_q8_K *)a + b;
        const __m128 dyv = T == 4 ? _mm_setr_ps(a0->d, ((const rb_block_q8_K *)(a + arb) + b)->d,
                                                ((const rb_block_q8_K *)(a + 2 * arb) + b)->d,
                                                ((const rb_block_q8_K *)(a + 3 * arb) + b)->d)
                                  : _mm_setzero_ps();
        const char *x0 = w + b * sizeof(rb_block_q4_K);
        const __m128 dwv = R == 4 ? rb_h2f_x4(x0 + offsetof(rb_block_q4_K, d), wrb) : _mm_setzero_ps();
        const __m128 dwmv = R == 4 ? rb_h2f_x4(x0 + offsetof(rb_block_q4_K, dmin), wrb) : _mm_setzero_ps();
        rb_chains_step(&acc, sumi, NULL, dw, dy, dwv, dyv, R, T);
        rb_chains_step(&accm, NULL, prod, dwm, dy, dwmv, dyv, R, T);
    }
    float s[RB_TILE_MAX][RB_TILE_MAX], m[RB_TILE_MAX][RB_TILE_MAX];
    rb_chains_get(&acc, s, R, T);
    rb_chains_get(&accm, m, R, T);
    RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = s[r][t] - m[r][t];
}

RB_INLINE void rb_tile_q6_K(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                            float *y, int64_t ys, const int R, const int T)
{
    __m256 acc[RB_TILE_MAX][RB_TILE_MAX];
    RB_FOR(r, R) RB_FOR(t, T) acc[r][t] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        RB_FOR(r, R) {
            const rb_block_q6_K *x = (const rb_block_q6_K *)(w + r * wrb) + b;
            RB_FOR8(l, 4) _mm_prefetch((const char *)x + R * wrb + 64 * l, _MM_HINT_T1);
            __m256i q[8];   /* q[4h + k]: elements 128h + 32k .. +31, values 0..63 */
            __m256i scv[8]; /* int16 scale of lanes: low 8 -> sub-block 2k', high 8 -> 2k'+1 */
            RB_FOR8(h, 2) {
                __m256i l0 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h));
                __m256i l1 = _mm256_loadu_si256((const __m256i *)(x->ql + 64 * h + 32));
                __m256i qh = _mm256_loadu_si256((const __m256i *)(x->qh + 32 * h));
                q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 4), m3));
                q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                               _mm256_and_si256(_mm256_slli_epi16(qh, 2), m3));
                q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_and_si256(qh, m3));
                q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3));
            }
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
            {
                const __m256i s_lo = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16));
                const __m256i s_hi = _mm256_broadcastsi128_si256(_mm256_extracti128_si256(sc16, 1));
                /* low 128: word 2k' of the 8, high 128: word 2k'+1 */
                RB_FOR8(k, 4) {
                    const __m256i sel = _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * k + 1))),
                                                         _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * k))));
                    scv[k] = _mm256_shuffle_epi8(s_lo, sel);
                    scv[k + 4] = _mm256_shuffle_epi8(s_hi, sel);
                }
            }
            const float d = rb_h2f(x->d);
            RB_FOR(t, T) {
                const rb_block_q8_K *ab = (const rb_block_q8_K *)(a + t * arb) + b;
                /* ggml's lanes (arch/x86/quants.c since llama.cpp PR 22345):
                 * int32 lane i holds sum(scale * q * a) over elements
                 * 4i..4i+3 of every 32-chunk with the unsigned codes q + 32,
                 * minus 32 * (scale * bsum) of sub-blocks 2i and 2i+1 (the
                 * offset, from the activation's bsums). The total is the same
                 * integer as any other grouping, but each lane's integer, and
                 * so its float rounding, is llama.cpp's */
                __m256i sumi = _mm256_setzero_si256();
                RB_FOR8(k, 8) {
                    const __m256i ya = _mm256_loadu_si256((const __m256i *)(ab->qs + 32 * k));
                    sumi = rb_madd16_acc(sumi, _mm256_maddubs_epi16(q[k], ya), scv[k]);
                }
                const __m256i bs = _mm256_loadu_si256((const __m256i *)ab->bsums);
                sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(d * ab->d), _mm256_cvtepi32_ps(sumi), acc[r][t]);
            }
        }
    }
    RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = rb_hsum8(acc[r][t]);
}

/* Q5_K in ggml_vec_dot_q5_K_q8_K's order (llama.cpp repacks Q5_K only on
 * ARM): Q4_K's unpacking with bit j of qh[l] as bit 4 of chunk j's codes,
 * Q6_K's 8 int32 lanes (sum(scale * q * a) over elements 4i..4i+3 of every
 * 32-chunk, unsigned codes, no offset) fused into float lanes with
 * d = da * dw, and per (r, t) one scalar chain of the mins,
 * summs = fma(-da * dmin, sum(min * bsum), summs). y = hsum8 + summs. */
RB_INLINE void rb_tile_q5_K(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                            float *y, int64_t ys, const int R, const int T)
{
    __m256 acc[RB_TILE_MAX][RB_TILE_MAX];
    float summs[RB_TILE_MAX][RB_TILE_MAX];
    RB_FOR(r, R) RB_FOR(t, T) {
        acc[r][t] = _mm256_setzero_ps();
        summs[r][t] = 0.0f;
    }
    const __m256i m4 = _mm256_set1_epi8(0x0f), m16 = _mm256_set1_epi8(0x10);
    for (int64_t b = 0; b < n / RB_QK_K; b++) {
        __m128i bs[RB_TILE_MAX];
        float dy[RB_TILE_MAX];
        RB_FOR(t, T) {
            const rb_block_q8_K *ab = (const rb_block_q8_K *)(a + t * arb) + b;
            bs[t] = q8_K_pair_sums(ab);
            dy[t] = ab->d;
        }
        RB_FOR(r, R) {
            const rb_block_q5_K *x = (const rb_block_q5_K *)(w + r * wrb) + b;
            RB_FOR8(l, 3) _mm_prefetch((const char *)x + R * wrb + 64 * l, _MM_HINT_T1);
            const __m128i sm = k_scales_mins(x->scales);
            const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm, 8));
            const __m256i sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
            /* chunk j's 5-bit codes, two chunks (one qs load) at a time,
             * used at once for every token: holding all 8 unpacked chunks
             * and their scales took 16 of the 16 ymm registers and the
             * prefill tile spilled. The 16-bit shifts that bring bit j of
             * each qh byte to bit 4 carry bits across the byte pair only
             * into bits 0..3 (left) or 5..7 (right), which the mask drops */
            const __m256i hb = _mm256_loadu_si256((const __m256i *)x->qh);
            __m256i sumi[RB_TILE_MAX];
            RB_FOR(t, T) sumi[t] = _mm256_setzero_si256();
            RB_FOR8(g, 4) {
                const __m256i raw = _mm256_loadu_si256((const __m256i *)(x->qs + 32 * g));
                const int j0 = 2 * g, j1 = 2 * g + 1;
                const __m256i h0 = j0 <= 4 ? _mm256_slli_epi16(hb, 4 - j0) : _mm256_srli_epi16(hb, j0 - 4);
                const __m256i h1 = j1 <= 4 ? _mm256_slli_epi16(hb, 4 - j1) : _mm256_srli_epi16(hb, j1 - 4);
                const __m256i q0 = _mm256_or_si256(_mm256_and_si256(raw, m4), _mm256_and_si256(h0, m16));
                const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(raw, 4), m4),
                                                   _mm256_and_si256(h1, m16));
                const __m256i sc0 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j0)));
                const __m256i sc1 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j1)));
                RB_FOR(t, T) {
                    const rb_block_q8_K *ab = (const rb_block_q8_K *)(a + t * arb) + b;
                    const __m256i y0 = _mm256_loadu_si256((const __m256i *)(ab->qs + 32 * j0));
                    const __m256i y1 = _mm256_loadu_si256((const __m256i *)(ab->qs + 32 * j1));
                    sumi[t] = rb_madd16_acc(sumi[t], _mm256_maddubs_epi16(q0, y0), sc0);
                    sumi[t] = rb_madd16_acc(sumi[t], _mm256_maddubs_epi16(q1, y1), sc1);
                }
            }
            const float dw = rb_h2f(x->d), dwm = rb_h2f(x->dmin);
            RB_FOR(t, T) {
                const int32_t imin = rb_hsum_i32x4(_mm_madd_epi16(mins16, bs[t]));
                summs[r][t] = fmaf(-dy[t] * dwm, (float)imin, summs[r][t]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dy[t] * dw), _mm256_cvtepi32_ps(sumi[t]), acc[r][t]);
            }
        }
    }
    RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = rb_hsum8(acc[r][t]) + summs[r][t];
}

/* Q4_1 / Q5_1 against Q8_1 in ggml_vec_dot_q4_1_q8_1's (_q5_1_q8_1's)
 * order: the unsigned codes times a in 8 int32 lanes of 4, fused into
 * float lanes with dw * da; the block's m * s (s = da * sum(a), from the
 * activation) in a scalar chain. */
RB_INLINE void rb_tile_q4_5_1(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                              float *y, int64_t ys, const int R, const int T, const int is_q5)
{
    const size_t wbb = is_q5 ? sizeof(rb_block_q5_1) : sizeof(rb_block_q4_1);
    __m256 acc[RB_TILE_MAX][RB_TILE_MAX];
    float summs[RB_TILE_MAX][RB_TILE_MAX];
    RB_FOR(r, R) RB_FOR(t, T) {
        acc[r][t] = _mm256_setzero_ps();
        summs[r][t] = 0.0f;
    }
    for (int64_t b = 0; b < n / RB_QK8_0; b++) {
        __m256i ya[RB_TILE_MAX];
        float dy[RB_TILE_MAX], sy[RB_TILE_MAX];
        RB_FOR(t, T) {
            const rb_block_q8_1 *ab = (const rb_block_q8_1 *)(a + t * arb) + b;
            ya[t] = _mm256_loadu_si256((const __m256i *)ab->qs);
            dy[t] = rb_h2f(ab->d);
            sy[t] = rb_h2f(ab->s);
        }
        RB_FOR(r, R) {
            const char *wb = w + r * wrb + b * wbb;
            _mm_prefetch(wb + R * wrb, _MM_HINT_T1);
            __m256i q;
            float dw, mw;
            if (is_q5) {
                const rb_block_q5_1 *x = (const rb_block_q5_1 *)wb;
                q = _mm256_or_si256(rb_nibbles32(x->qs), rb_bits32_x16(x->qh));
                dw = rb_h2f(x->d);
                mw = rb_h2f(x->m);
            } else {
                const rb_block_q4_1 *x = (const rb_block_q4_1 *)wb;
                q = rb_nibbles32(x->qs);
                dw = rb_h2f(x->d);
                mw = rb_h2f(x->m);
            }
            RB_FOR(t, T) {
                const __m256i p = rb_dot_u8s8(_mm256_setzero_si256(), q, ya[t]);
                summs[r][t] = fmaf(mw, sy[t], summs[r][t]);
                acc[r][t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dy[t]), _mm256_cvtepi32_ps(p), acc[r][t]);
            }
        }
    }
    RB_FOR(r, R) RB_FOR(t, T) y[t * ys + r] = rb_hsum8(acc[r][t]) + summs[r][t];
}

/* BF16 (and the F32 / F16 loads): 8 elements per step, a scalar tail for n % 8 */
enum { RB_FP_F32, RB_FP_F16, RB_FP_BF16 };

RB_INLINE __m256 rb_load8_fp(const char *p, int64_t i, const int kind)
{
    if (kind == RB_FP_F32)
        return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (kind == RB_FP_F16)
        return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

RB_INLINE float rb_load1_fp(const char *p, int64_t i, const int kind)
{
    if (kind == RB_FP_F32)
        return ((const float *)p)[i];
    if (kind == RB_FP_F16)
        return rb_h2f(((const uint16_t *)p)[i]);
    return rb_bf16_to_fp32(((const uint16_t *)p)[i]);
}

RB_INLINE void rb_tile_fp(int64_t n, const char *w, size_t wrb, const char *a, size_t arb,
                          float *y, int64_t ys, const int R, const int T, const int kind)
{
    /* F32 and F16 in ggml's order (fp_dot.h): the bits of llama.cpp's
       logits. One (row, token) at a time: the 4 x 8 accumulators of that
       order leave no registers for a tile; the weight row stays in L1
       across the T tokens. */
    if (kind == RB_FP_F32) {
        RB_FOR(r, R) RB_FOR(t, T)
            y[t * ys + r] = rb_dot_f32_ggml((const float *)(w + r * wrb),
                                            (const float *)(a + t * arb), n);
        return;
    }
    if (kind == RB_FP_F16) {
        RB_FOR(r, R) RB_FOR(t, T)
            y[t * ys + r] = rb_dot_f16_ggml((const rb_f16 *)(w + r * wrb),
                                            (const rb_f16 *)(a + t * arb), n);
        return;
    }
    __m256 acc[RB_TILE_MAX][RB_TILE_MAX];
    RB_FOR(r, R) RB_FOR(t, T) acc[r][t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 at[RB_TILE_MAX];
        RB_FOR(t, T) at[t] = rb_load8_fp(a + t * arb, i, kind);
        RB_FOR(r, R) {
            __m256 wr = rb_load8_fp(w + r * wrb, i, kind);
            RB_FOR(t, T) acc[r][t] = _mm256_fmadd_ps(wr, at[t], acc[r][t]);
        }
    }
    RB_FOR(r, R) RB_FOR(t, T) {
        float s = rb_hsum8(acc[r][t]);
        for (int64_t j = i; j < n; j++)
            s += rb_load1_fp(w + r * wrb, j, kind) * rb_load1_fp(a + t * arb, j, kind);
        y[t * ys + r] = s;
    }
}

/* ---- instantiation: one function per type, switching on the shape ------- */

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

#define RB_DEF_TILE(fname, body, ...)                                                   \
    static void fname(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,   \
                      size_t arb, int n_tok, float *y, int64_t ys)                       \
    {                                                                                    \
        _Static_assert(RB_TILE_MAX == 4, "shapes below");                                \
        const char *wc = w, *ac = a;                                                     \
        (void)wc; (void)ac;                                                              \
        RB_SHAPES(body)                                                                  \
    }

#define RB_C_Q4_0(R, T) rb_tile_q4_5_0(n, wc, wrb, ac, arb, y, ys, R, T, 0)
#define RB_C_Q5_0(R, T) rb_tile_q4_5_0(n, wc, wrb, ac, arb, y, ys, R, T, 1)
#define RB_C_Q8_0(R, T) rb_tile_q8_0(n, wc, wrb, ac, arb, y, ys, R, T)
#define RB_C_Q4_K(R, T) rb_tile_q4_K(n, wc, wrb, ac, arb, y, ys, R, T)
#define RB_C_Q6_K(R, T) rb_tile_q6_K(n, wc, wrb, ac, arb, y, ys, R, T)
#define RB_C_Q5_K(R, T) rb_tile_q5_K(n, wc, wrb, ac, arb, y, ys, R, T)
#define RB_C_Q4_1(R, T) rb_tile_q4_5_1(n, wc, wrb, ac, arb, y, ys, R, T, 0)
#define RB_C_Q5_1(R, T) rb_tile_q4_5_1(n, wc, wrb, ac, arb, y, ys, R, T, 1)
#define RB_C_F32(R, T) rb_tile_fp(n, wc, wrb, ac, arb, y, ys, R, T, RB_FP_F32)
#define RB_C_F16(R, T) rb_tile_fp(n, wc, wrb, ac, arb, y, ys, R, T, RB_FP_F16)
#define RB_C_BF16(R, T) rb_tile_fp(n, wc, wrb, ac, arb, y, ys, R, T, RB_FP_BF16)

RB_DEF_TILE(rb_tile_q4_0_avx2, RB_C_Q4_0)
RB_DEF_TILE(rb_tile_q5_0_avx2, RB_C_Q5_0)
RB_DEF_TILE(rb_tile_q8_0_avx2, RB_C_Q8_0)
RB_DEF_TILE(rb_tile_q4_K_avx2, RB_C_Q4_K)
RB_DEF_TILE(rb_tile_q6_K_avx2, RB_C_Q6_K)
RB_DEF_TILE(rb_tile_q5_K_avx2, RB_C_Q5_K)
RB_DEF_TILE(rb_tile_q4_1_avx2, RB_C_Q4_1)
RB_DEF_TILE(rb_tile_q5_1_avx2, RB_C_Q5_1)
RB_DEF_TILE(rb_tile_f32_avx2, RB_C_F32)
RB_DEF_TILE(rb_tile_f16_avx2, RB_C_F16)
RB_DEF_TILE(rb_tile_bf16_avx2, RB_C_BF16)

/* few (a step of 2..RB_FEW_MAX sequences): 4-row tiles over every token,
 * rows outer, so that a tile's weight blocks come from DRAM once and are
 * still in L1 for the next 4 tokens. At 2 or 3 tokens the Q4_0 and Q4_K
 * chains then run as vectors over the 4 rows (the prefill tiles' 2 x 4
 * shape keeps one scalar chain per output there); each output has the
 * bits of any other tile. */
#define RB_DEF_FEW(fname, tile)                                                         \
    static void fname(int64_t n, const void *w, size_t wrb, int n_rows, const void *a,   \
                      size_t arb, int n_tok, float *y, int64_t ys)                       \
    {                                                                                    \
        for (int r = 0; r < n_rows; r += 4)                                              \
            for (int t = 0; t < n_tok; t += 4)                                           \
                tile(n, (const char *)w + (size_t)r * wrb, wrb,                          \
                     n_rows - r < 4 ? n_rows - r : 4, (const char *)a + (size_t)t * arb, \
                     arb, n_tok - t < 4 ? n_tok - t : 4, y + t * ys + r, ys);            \
    }

RB_DEF_FEW(rb_few_q4_0_avx2, rb_tile_q4_0_avx2)
RB_DEF_FEW(rb_few_q8_0_avx2, rb_tile_q8_0_avx2)
RB_DEF_FEW(rb_few_q4_K_avx2, rb_tile_q4_K_avx2)
RB_DEF_FEW(rb_few_q6_K_avx2, rb_tile_q6_K_avx2)

const rb_matmul_isa RB_AVX2_TABLE = {
    .name = RB_AVX2_NAME,
    .act = {
        [RB_TYPE_F32] = rb_quantize_act_f32_avx2,
        [RB_TYPE_F16] = rb_quantize_act_f16_avx2,
        [RB_TYPE_BF16] = rb_quantize_act_bf16_avx2,
        [RB_TYPE_Q8_0] = rb_quantize_act_q8_0_avx2,
        [RB_TYPE_Q8_K] = rb_quantize_act_q8_K_avx2,
        [RB_TYPE_Q8_1] = rb_quantize_act_q8_1_avx2,
    },
    .tile = {
        [RB_TYPE_F32] = rb_tile_f32_avx2,
        [RB_TYPE_F16] = rb_tile_f16_avx2,
        [RB_TYPE_BF16] = rb_tile_bf16_avx2,
        [RB_TYPE_Q4_0] = rb_tile_q4_0_avx2,
        [RB_TYPE_Q5_0] = rb_tile_q5_0_avx2,
        [RB_TYPE_Q8_0] = rb_tile_q8_0_avx2,
        [RB_TYPE_Q4_K] = rb_tile_q4_K_avx2,
        [RB_TYPE_Q6_K] = rb_tile_q6_K_avx2,
        [RB_TYPE_Q5_K] = rb_tile_q5_K_avx2,
        [RB_TYPE_Q4_1] = rb_tile_q4_1_avx2,
        [RB_TYPE_Q5_1] = rb_tile_q5_1_avx2,
    },
    .few = {
        [RB_TYPE_Q4_0] = rb_few_q4_0_avx2,
        [RB_TYPE_Q8_0] = rb_few_q8_0_avx2,
        [RB_TYPE_Q4_K] = rb_few_q4_K_avx2,
        [RB_TYPE_Q6_K] = rb_few_q6_K_avx2,
    },
    .decode_rows = 4,
    .prefill_rows = 2,
    .prefill_toks = 4,
};

#else
typedef int rb_matmul_avx2_unused; /* ISO C: a translation unit is not empty */
#endif
