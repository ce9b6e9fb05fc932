/*
 * ops_avx512.c - attention.c's f16 block of 8 positions in 512-bit
 * registers, for one query (rb_attn_block8_f16) and for several queries
 * sharing the block's rows (rb_attn_tile8_f16, the prefill's tiled walk);
 * and the tiled f32 form's kernels (attention.h: the block of a tile, the
 * decode's block of a few queries, the rows widened), at the end.
 * This file alone of the ops is compiled with the AVX-512 flags;
 * attention.c runs it on the avx512 tier for head dims 64, 128 and 256,
 * the AVX2 forms elsewhere.
 *
 * The same bits as rb_attn_block8_f16_avx2, operation for operation:
 *   q.k   ggml_vec_dot_f16's four 8-lane accumulators of a 32-element step
 *         are two zmm here (elements 0..15 of the step: accumulators 0 and
 *         1; 16..31: 2 and 3), each lane the same fma chain; the reduction
 *         (a0 + a2) + (a1 + a3), halves, two hadds, is fp_dot.h's.
 *   V     the f16 accumulator, acc = f16(fma(v, w, acc)) per element, is
 *         held in registers as floats that are f16 values (rounded with
 *         vcvtps2ph and widened back after every step: exact), so it is
 *         loaded and stored once per block of 8 positions, not per position.
 *   softmax  the scalar online step of attention.c, expf from libm.
 * The query is widened once per call, not once per position.
 */
#include "ops_kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__) && \
    defined(__F16C__)
#include <float.h>
#include <immintrin.h>
#include <math.h>

#define RB_INLINE static inline __attribute__((always_inline))

/* an f16 rounding of 16 floats, widened back (exact) */
RB_INLINE __m512 rb_round_f16(__m512 x)
{
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

RB_INLINE __m512 rb_load16_f16(const rb_f16 *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

RB_INLINE void rb_block8(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                         float kq_scale, rb_f16 *acc, float *m, float *sum, const int N)
{
    __m512 qv[16], a[16];
    _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++) {
        qv[c] = rb_load16_f16(q + 16 * c);
        a[c] = rb_load16_f16(acc + 16 * c);
    }
    float sc[8];
    _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) {
        const rb_f16 *kr = k + l * stride;
        __m512 s01 = _mm512_setzero_ps(), s23 = _mm512_setzero_ps();
        _Pragma("GCC unroll 8") for (int i = 0; i < N; i += 32) {
            s01 = _mm512_fmadd_ps(rb_load16_f16(kr + i), qv[i / 16], s01);
            s23 = _mm512_fmadd_ps(rb_load16_f16(kr + i + 16), qv[i / 16 + 1], s23);
        }
        const __m512 s = _mm512_add_ps(s01, s23); /* a0 + a2 | a1 + a3 */
        const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps(s, 1));
        __m128 t = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        t = _mm_hadd_ps(t, t);
        sc[l] = _mm_cvtss_f32(_mm_hadd_ps(t, t));
    }
    float mm = *m, ss = *sum;
    _Pragma("GCC unroll 1") for (int l = 0; l < 8; l++) {
        const float s = sc[l] * kq_scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > mm) {
            const float m_old = mm;
            mm = s;
            ms = expf(m_old - mm);
            const __m512 msv = _mm512_set1_ps(ms);
            _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
                a[c] = rb_round_f16(_mm512_mul_ps(a[c], msv));
        } else {
            vs = expf(s - mm);
        }
        const __m512 vsv = _mm512_set1_ps(vs);
        const rb_f16 *vr = v + l * stride;
        _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
            a[c] = rb_round_f16(_mm512_fmadd_ps(rb_load16_f16(vr + 16 * c), vsv, a[c]));
        ss = fmaf(ss, ms, vs);
    }
    _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
        _mm256_storeu_si256((__m256i *)(acc + 16 * c),
                            _mm512_cvtps_ph(a[c], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    *m = mm;
    *sum = ss;
}

int rb_attn_block8_f16_avx512(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                              int n, float kq_scale, rb_f16 *acc, float *m, float *sum)
{
    switch (n) {
    case 64: rb_block8(q, k, v, stride, kq_scale, acc, m, sum, 64); return 1;
    case 128: rb_block8(q, k, v, stride, kq_scale, acc, m, sum, 128); return 1;
    case 256: rb_block8(q, k, v, stride, kq_scale, acc, m, sum, 256); return 1;
    default: return 0;
    }
}

/*
 * rb_attn_tile8_f16_avx512: the block of 8 positions for several queries
 * (attention.c's rb_attn_tile8_f16). Per query the operations are
 * rb_block8's, in its order; what the queries share is done once:
 *   K, V   the 8 rows are widened to f32 once for all the queries (a
 *          scratch of 8 x N floats each, in L1), not once per query;
 *   q.k    the reductions of the 8 positions' sums run side by side in
 *          the lanes of a few registers: the same additions of the same
 *          operands as fp_dot.h's (a0 + a2) + (a1 + a3), halves, two
 *          hadds (floating-point addition commutes bit for bit);
 *   softmax  the 8 online steps (libm's expf) run before V is touched, so
 *          no vector register is live across the expf calls (rb_block8
 *          spilled its accumulators around every call); each step's ms
 *          and vs are kept and applied to V in order: a rescale where the
 *          step raised the max, then the weighted row.
 */
RB_INLINE void rb_tile8(const rb_f16 *k, const rb_f16 *v, int64_t stride, float kq_scale, int nq,
                        const uint8_t *idx, const rb_f16 *qh, rb_f16 *acc, float *m, float *sum,
                        const int N)
{
    float kf[8 * 256] __attribute__((aligned(64)));
    float vf[8 * 256] __attribute__((aligned(64)));
    _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++)
        _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++) {
            _mm512_store_ps(kf + l * N + 16 * c, rb_load16_f16(k + l * stride + 16 * c));
            _mm512_store_ps(vf + l * N + 16 * c, rb_load16_f16(v + l * stride + 16 * c));
        }
    _Pragma("GCC unroll 1") for (int j = 0; j < nq; j++) {
        const int qi = idx[j];
        const rb_f16 *q = qh + (size_t)qi * N;
        rb_f16 *ac = acc + (size_t)qi * N;
        __m512 s[8];
        {
            __m512 qv[16];
            _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
                qv[c] = rb_load16_f16(q + 16 * c);
            _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) {
                const float *kr = kf + l * N;
                __m512 s01 = _mm512_setzero_ps(), s23 = _mm512_setzero_ps();
                _Pragma("GCC unroll 8") for (int i = 0; i < N; i += 32) {
                    s01 = _mm512_fmadd_ps(_mm512_load_ps(kr + i), qv[i / 16], s01);
                    s23 = _mm512_fmadd_ps(_mm512_load_ps(kr + i + 16), qv[i / 16 + 1], s23);
                }
                s[l] = _mm512_add_ps(s01, s23); /* a0 + a2 | a1 + a3 */
            }
        }
        /* h = (a0 + a2) + (a1 + a3): two positions per register, as
           [h_l lo 4 | h_l hi 4 | h_l+1 lo 4 | h_l+1 hi 4] */
        __m512 h[4];
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++)
            h[p] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm512_shuffle_f32x4(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
        /* t = lo 4 + hi 4: four positions per register, one per 128 bits */
        const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_f32x4(h[0], h[1], _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(h[2], h[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                        _mm512_shuffle_f32x4(h[2], h[3], _MM_SHUFFLE(3, 1, 3, 1)));
        /* the hadds: u = [t0 + t1, t2 + t3] of positions c and 4 + c in
           128-bit lane c, then r = u0 + u1 */
        const __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_ps(t0, t1, _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(u, u, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_ps(u, u, _MM_SHUFFLE(3, 1, 3, 1)));
        float rr[16] __attribute__((aligned(64)));
        _mm512_store_ps(rr, r);
        float ms[8], vs[8];
        unsigned raised = 0;
        float mm = m[qi], ss = sum[qi];
        _Pragma("GCC unroll 1") for (int l = 0; l < 8; l++) {
            const float sc = rr[(l & 3) * 4 + (l >> 2)] * kq_scale;
            ms[l] = 1.0f;
            vs[l] = 1.0f;
            if (sc > mm) {
                const float m_old = mm;
                mm = sc;
                ms[l] = expf(m_old - mm);
                raised |= 1u << l;
            } else {
                vs[l] = expf(sc - mm);
            }
            ss = fmaf(ss, ms[l], vs[l]);
        }
        m[qi] = mm;
        sum[qi] = ss;
        /* the accumulator in registers (N / 16 of them, f32 values that
           are f16 values), the 8 rows' steps one after the other */
        __m512 a[16];
        _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
            a[c] = rb_load16_f16(ac + 16 * c);
        _Pragma("GCC unroll 1") for (int l = 0; l < 8; l++) {
            if (raised & (1u << l)) {
                const __m512 f = _mm512_set1_ps(ms[l]);
                _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
                    a[c] = rb_round_f16(_mm512_mul_ps(a[c], f));
            }
            const __m512 w = _mm512_set1_ps(vs[l]);
            const float *vr = vf + l * N;
            _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
                a[c] = rb_round_f16(_mm512_fmadd_ps(_mm512_load_ps(vr + 16 * c), w, a[c]));
        }
        _Pragma("GCC unroll 16") for (int c = 0; c < N / 16; c++)
            _mm256_storeu_si256((__m256i *)(ac + 16 * c),
                                _mm512_cvtps_ph(a[c], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

int rb_attn_tile8_f16_avx512(const rb_f16 *k, const rb_f16 *v, int64_t stride, int n,
                             float kq_scale, int nq, const uint8_t *idx, const rb_f16 *qh,
                             rb_f16 *acc, float *m, float *sum)
{
    switch (n) {
    case 64: rb_tile8(k, v, stride, kq_scale, nq, idx, qh, acc, m, sum, 64); return 1;
    case 128: rb_tile8(k, v, stride, kq_scale, nq, idx, qh, acc, m, sum, 128); return 1;
    case 256: rb_tile8(k, v, stride, kq_scale, nq, idx, qh, acc, m, sum, 256); return 1;
    default: return 0;
    }
}

/*
 * rb_attn_tblock_avx512: attention.h's tiled block, 16 queries to a
 * register (the 64 queries of a tile are 4 zmm). Scores: 4 positions x 64
 * queries in 16 accumulators, each lane the fma chain over d of the
 * scalar form (K broadcast from the widened row, q from the transposed
 * tile). Softmax: the tile's queries down the lanes, positions in order.
 * V: 4 queries x 64 dims in 16 accumulators, positions in order, the fma
 * of a position outside a query's span masked off (where some span does
 * not hold the whole block). The same operations per lane as
 * rb_attn_tblock_ref, so the same bits.
 */
RB_INLINE __m512 rb_exp16(__m512 x)
{
    const __mmask16 ok = _mm512_cmp_ps_mask(x, _mm512_set1_ps(RB_EXP_LO), _CMP_GE_OQ);
    x = _mm512_min_ps(x, _mm512_set1_ps(88.0f));
    const __m512 sh = _mm512_set1_ps(RB_EXP_SHIFT);
    const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(RB_EXP_LOG2E), sh), sh);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-RB_EXP_LN2_HI), x);
    r = _mm512_fmadd_ps(n, _mm512_set1_ps(-RB_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(RB_EXP_C7);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(RB_EXP_C6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(RB_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(RB_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(RB_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(RB_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps(ok, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}

/* NP positions (1 or 4) from p of the scores, NQV vectors of 16 queries */
RB_INLINE void rb_tscore(const float *kf, const float *qt, int hd, int p, int32_t p0,
                         __m512 scale, const __m512i *fv, const __m512i *lv, float *st,
                         const int NP, const int NQV)
{
    __m512 c[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NQV; j++) c[i][j] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 qv[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < NQV; j++) qv[j] = _mm512_loadu_ps(qt + d * 64 + 16 * j);
        _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++) {
            const __m512 k = _mm512_set1_ps(kf[(p + i) * hd + d]);
            _Pragma("GCC unroll 4") for (int j = 0; j < NQV; j++) c[i][j] = _mm512_fmadd_ps(k, qv[j], c[i][j]);
        }
    }
    const __m512 neg = _mm512_set1_ps(-INFINITY);
    _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++) {
        const __m512i pos = _mm512_set1_epi32(p0 + p + i);
        _Pragma("GCC unroll 4") for (int j = 0; j < NQV; j++) {
            const __mmask16 in = _mm512_cmple_epi32_mask(fv[j], pos) & _mm512_cmple_epi32_mask(pos, lv[j]);
            _mm512_storeu_ps(st + (p + i) * 64 + 16 * j,
                             _mm512_mask_mov_ps(neg, in, _mm512_mul_ps(c[i][j], scale)));
        }
    }
}

/* 1 when the spans of queries q..q+n-1 all hold positions p0..p0+np-1 */
RB_INLINE int rb_tcover(const int32_t *first, const int32_t *last, int q, int n, int32_t p0,
                        int np)
{
    int all = 1;
    for (int i = 0; i < n; i++)
        all &= first[q + i] <= p0 && p0 + np - 1 <= last[q + i];
    return all;
}

/* NQ queries (4) from q, NV vectors (4 or 1) of dims from d; MASKED: the
 * fma of a position outside a query's span left out (else every span
 * holds the block) */
RB_INLINE void rb_tvacc(const float *vf, const float *st, const float *ms, float *acc, int hd,
                        int np, int q, int d, int32_t p0, const int32_t *first,
                        const int32_t *last, const int NV, const int MASKED)
{
    __m512 a[4][4];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        const __m512 s = _mm512_set1_ps(ms[q + i]);
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            a[i][j] = _mm512_mul_ps(_mm512_loadu_ps(acc + (q + i) * hd + d + 16 * j), s);
    }
    for (int p = 0; p < np; p++) {
        __m512 v[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) v[j] = _mm512_loadu_ps(vf + p * hd + d + 16 * j);
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            const __m512 w = _mm512_set1_ps(st[p * 64 + q + i]);
            if (MASKED) {
                const __mmask16 in = first[q + i] <= p0 + p && p0 + p <= last[q + i] ? 0xffff : 0;
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[i][j] = _mm512_mask3_fmadd_ps(w, v[j], a[i][j], in);
            } else {
                _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[i][j] = _mm512_fmadd_ps(w, v[j], a[i][j]);
            }
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(acc + (q + i) * hd + d + 16 * j, a[i][j]);
}

/* 32 q8_0 values from qs (two 16-byte loads), times d, into o */
RB_INLINE void rb_widen32_q8(__m128i lo, __m128i hi, __m512 d, float *o)
{
    _mm512_storeu_ps(o, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo))));
    _mm512_storeu_ps(o + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))));
}

void rb_attn_widen_avx512(uint32_t type, const void *const *rows, int np, int hd, float *out)
{
    for (int p = 0; p < np; p++) {
        float *o = out + (size_t)p * hd;
        if (type == RB_TYPE_F16) {
            const rb_f16 *r = rows[p];
            for (int d = 0; d < hd; d += 16)
                _mm512_storeu_ps(o + d, rb_load16_f16(r + d));
        } else if (type == RB_TYPE_Q8_0) {
            const rb_block_q8_0 *x = rows[p];
            for (int b = 0; b < hd / RB_QK8_0; b++)
                rb_widen32_q8(_mm_loadu_si128((const __m128i *)x[b].qs),
                              _mm_loadu_si128((const __m128i *)(x[b].qs + 16)),
                              _mm512_set1_ps(rb_fp16_to_fp32(x[b].d)), o + b * RB_QK8_0);
        } else {
            const rb_block_q4_0 *x = rows[p];
            const __m128i m4 = _mm_set1_epi8(0x0f), e8 = _mm_set1_epi8(8);
            for (int b = 0; b < hd / RB_QK4_0; b++) {
                const __m128i raw = _mm_loadu_si128((const __m128i *)x[b].qs);
                rb_widen32_q8(_mm_sub_epi8(_mm_and_si128(raw, m4), e8),
                              _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), e8),
                              _mm512_set1_ps(rb_fp16_to_fp32(x[b].d)), o + b * RB_QK4_0);
            }
        }
    }
}

/* The scores of all 64 lanes (NQV = 4) or of the first 16 (1) */
RB_INLINE void rb_tscores(const float *kf, const float *qt, int hd, int np, int32_t p0,
                          __m512 scale, const __m512i *fv, const __m512i *lv, float *st,
                          const int NQV)
{
    int p = 0;
    for (; p + 4 <= np; p += 4)
        rb_tscore(kf, qt, hd, p, p0, scale, fv, lv, st, 4, NQV);
    for (; p < np; p++)
        rb_tscore(kf, qt, hd, p, p0, scale, fv, lv, st, 1, NQV);
}

/*
 * The decode kernel (a tile of up to RB_ATTN_TBLOCK_FEW queries): lanes
 * are positions, not queries. The block's K rows are widened and
 * transposed once (kt[d * 64 + p], 16 x 16 in registers), then queries
 * are dotted, two at a time, with 16 positions per fma (8 independent
 * chains), each lane the same fma chain over d as the scalar form; a
 * query's softmax takes the block's 64 scores in 4 registers (the max is
 * exact in any order; the weights are summed position by position); the V
 * rows are read (widened) once for two queries, positions in order, the
 * fma of a position outside a query's span masked off. The same operations per (query, position) as
 * rb_attn_tblock_ref: the same bits. The 64-lane tile kernel would spend
 * 64 - nq of its lanes on empty queries; no f32 copy of K or V is made.
 */
RB_INLINE void rb_tr16(__m512 r[16])
{
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    /* r[4i + j], 128-bit lane k: column 4k + j of rows 4i..4i+3 */
    for (int j = 0; j < 4; j++) {
        t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);
        t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xdd);
        t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
        t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xdd);
    }
    for (int j = 0; j < 4; j++) {
        r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
        r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
        r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);
        r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xdd);
    }
}

/* Values c..c+15 of a row of type (f16, q8_0, q4_0; c a multiple of 16),
 * exactly as rb_attn_widen_ref gives them */
RB_INLINE __m512 rb_row16(uint32_t type, const void *row, int c)
{
    if (type == RB_TYPE_F16)
        return rb_load16_f16((const rb_f16 *)row + c);
    if (type == RB_TYPE_Q8_0) {
        const rb_block_q8_0 *x = (const rb_block_q8_0 *)row + c / RB_QK8_0;
        const __m128i v = _mm_loadu_si128((const __m128i *)(x->qs + c % RB_QK8_0));
        return _mm512_mul_ps(_mm512_set1_ps(rb_fp16_to_fp32(x->d)),
                             _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)));
    }
    const rb_block_q4_0 *x = (const rb_block_q4_0 *)row + c / RB_QK4_0;
    __m128i v = _mm_loadu_si128((const __m128i *)x->qs);
    if (c % RB_QK4_0)
        v = _mm_srli_epi16(v, 4);
    v = _mm_sub_epi8(_mm_and_si128(v, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
    return _mm512_mul_ps(_mm512_set1_ps(rb_fp16_to_fp32(x->d)),
                         _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)));
}

/* kt[d * 64 + p] = value d of K row p, widened, for p < 16 * ceil(np / 16)
 * (rows past np zero) */
static void rb_ttranspose(uint32_t type, const void *const *kr, int np, int hd, float *kt)
{
    for (int g = 0; g < np; g += 16) {
        const int nr = np - g < 16 ? np - g : 16;
        for (int c = 0; c < hd; c += 16) {
            __m512 r[16];
            if (nr == 16) {
                for (int i = 0; i < 16; i++)
                    r[i] = rb_row16(type, kr[g + i], c);
            } else {
                for (int i = 0; i < 16; i++)
                    r[i] = i < nr ? rb_row16(type, kr[g + i], c) : _mm512_setzero_ps();
            }
            rb_tr16(r);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_ps(kt + (size_t)(c + i) * 64 + g, r[i]);
        }
    }
}

/* The scores of QB queries (1 or 2) from q over NG groups of 16
 * positions, into s[i][g]: 4 * QB independent fma chains */
RB_INLINE void rb_dscore(const float *kt, const float *qt, int hd, int q, __m512 s[2][4],
                         const int QB, const int NG)
{
    _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) s[i][g] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        __m512 k[4];
        _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) k[g] = _mm512_loadu_ps(kt + d * 64 + 16 * g);
        _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++) {
            const __m512 qd = _mm512_set1_ps(qt[d * 64 + q + i]);
            _Pragma("GCC unroll 4") for (int g = 0; g < NG; g++) s[i][g] = _mm512_fmadd_ps(k[g], qd, s[i][g]);
        }
    }
}

RB_INLINE void rb_dscores(const float *kt, const float *qt, int hd, int q, __m512 s[2][4],
                          const int QB, int ng)
{
    switch (ng) {
    case 4: rb_dscore(kt, qt, hd, q, s, QB, 4); break;
    case 3: rb_dscore(kt, qt, hd, q, s, QB, 3); break;
    case 2: rb_dscore(kt, qt, hd, q, s, QB, 2); break;
    default: rb_dscore(kt, qt, hd, q, s, QB, 1); break;
    }
}

/* QB queries from q: acc[q + i][d..d + 16 NV) = acc * ms, then the block's
 * weighted V rows in position order, a position outside the query's span
 * left out */
RB_INLINE void rb_dvacc(uint32_t type_v, const void *const *vr, int np, int hd, int q, int d,
                        const float (*w)[64], const float *ms, float *acc, int32_t p0,
                        const int32_t *first, const int32_t *last, const int QB,
                        const int NV)
{
    __m512 a[2][4];
    _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            a[i][j] = _mm512_mul_ps(_mm512_loadu_ps(acc + (size_t)(q + i) * hd + d + 16 * j),
                                    _mm512_set1_ps(ms[q + i]));
    for (int p = 0; p < np; p++) {
        __m512 v[4];
        if (type_v == RB_TYPE_F16) {
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                v[j] = rb_load16_f16((const rb_f16 *)vr[p] + d + 16 * j);
        } else {
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) v[j] = rb_row16(type_v, vr[p], d + 16 * j);
        }
        _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++) {
            const __m512 wv = _mm512_set1_ps(w[q + i][p]);
            const __mmask16 in = first[q + i] <= p0 + p && p0 + p <= last[q + i] ? 0xffff : 0;
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) a[i][j] = _mm512_mask3_fmadd_ps(wv, v[j], a[i][j], in);
        }
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm512_storeu_ps(acc + (size_t)(q + i) * hd + d + 16 * j, a[i][j]);
}

int rb_attn_tblock_few_avx512(uint32_t type_k, uint32_t type_v, const void *const *kr,
                              const void *const *vr, int np, int hd, int nq, const float *qt,
                              const int32_t *first, const int32_t *last, int32_t p0,
                              float kq_scale, float *kt, float *acc, float *m, float *l)
{
    if (hd % 16 != 0 || nq > RB_ATTN_TBLOCK_FEW)
        return 0;
    rb_ttranspose(type_k, kr, np, hd, kt);
    const int ng = (np + 15) / 16;
    const __m512 scale = _mm512_set1_ps(kq_scale), neg = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    float w[RB_ATTN_TBLOCK_FEW][64], ms[RB_ATTN_TBLOCK_FEW];
    for (int q0 = 0; q0 < nq; q0 += 2) {
        __m512 s[2][4];
        const int qb = nq - q0 >= 2 ? 2 : 1;
        if (qb == 2)
            rb_dscores(kt, qt, hd, q0, s, 2, ng);
        else
            rb_dscores(kt, qt, hd, q0, s, 1, ng);
        for (int i = 0; i < qb; i++) {
            const int q = q0 + i;
            const __m512i fq = _mm512_set1_epi32(first[q]), lq = _mm512_set1_epi32(last[q]);
            __m512 mxv = _mm512_set1_ps(m[q]);
            for (int g = 0; g < ng; g++) {
                const __m512i pos = _mm512_add_epi32(_mm512_set1_epi32(p0 + 16 * g), lane);
                const __mmask16 in =
                    _mm512_cmple_epi32_mask(fq, pos) & _mm512_cmple_epi32_mask(pos, lq) &
                    _mm512_cmplt_epi32_mask(_mm512_add_epi32(_mm512_set1_epi32(16 * g), lane),
                                            _mm512_set1_epi32(np));
                s[i][g] = _mm512_mask_mov_ps(neg, in, _mm512_mul_ps(s[i][g], scale));
                mxv = _mm512_max_ps(s[i][g], mxv);
            }
            const float mx = _mm512_reduce_max_ps(mxv);
            ms[q] = _mm512_cvtss_f32(rb_exp16(_mm512_set1_ps(m[q] - mx)));
            for (int g = 0; g < ng; g++)
                _mm512_storeu_ps(w[q] + 16 * g, rb_exp16(_mm512_sub_ps(s[i][g], _mm512_set1_ps(mx))));
            float sum = l[q] * ms[q];
            for (int p = 0; p < np; p++)
                sum = sum + w[q][p];
            l[q] = sum;
            m[q] = mx;
        }
    }
    for (int d = 0; d < hd; d += 64) {
        const int nv = hd - d >= 64 ? 4 : (hd - d) / 16;
        for (int q = 0; q < nq; q += 2) {
            const int qb = nq - q >= 2 ? 2 : 1;
            if (nv == 4 && qb == 2)
                rb_dvacc(type_v, vr, np, hd, q, d, (const float (*)[64])w, ms, acc, p0, first, last, 2, 4);
            else if (nv == 4)
                rb_dvacc(type_v, vr, np, hd, q, d, (const float (*)[64])w, ms, acc, p0, first, last, 1, 4);
            else
                for (int j = 0; j < nv; j++)
                    for (int i = 0; i < qb; i++)
                        rb_dvacc(type_v, vr, np, hd, q + i, d + 16 * j,
                                 (const float (*)[64])w, ms, acc, p0, first, last, 1, 1);
        }
    }
    return 1;
}

int rb_attn_tblock_avx512(const float *kf, const float *vf, int np, int hd, int nq,
                          const float *qt, const int32_t *first, const int32_t *last,
                          int32_t p0, float kq_scale, float *st, float *kt, float *acc,
                          float *m, float *l)
{
    if (hd % 16 != 0)
        return 0;
    (void)kt;
    float ms[64];
    __m512i fv[4], lv[4];
    for (int j = 0; j < 4; j++) {
        fv[j] = _mm512_loadu_si512(first + 16 * j);
        lv[j] = _mm512_loadu_si512(last + 16 * j);
    }
    const __m512 scale = _mm512_set1_ps(kq_scale);
    if (nq <= 16)
        rb_tscores(kf, qt, hd, np, p0, scale, fv, lv, st, 1);
    else
        rb_tscores(kf, qt, hd, np, p0, scale, fv, lv, st, 4);
    for (int q = 0; q < nq; q += 16) {
        const __m512 mo = _mm512_loadu_ps(m + q);
        __m512 mx = mo;
        for (int p = 0; p < np; p++)
            mx = _mm512_max_ps(_mm512_loadu_ps(st + p * 64 + q), mx);
        const __m512 msv = rb_exp16(_mm512_sub_ps(mo, mx));
        _mm512_storeu_ps(ms + q, msv);
        _mm512_storeu_ps(m + q, mx);
        __m512 s = _mm512_mul_ps(_mm512_loadu_ps(l + q), msv);
        for (int p = 0; p < np; p++) {
            const __m512 w = rb_exp16(_mm512_sub_ps(_mm512_loadu_ps(st + p * 64 + q), mx));
            _mm512_storeu_ps(st + p * 64 + q, w);
            s = _mm512_add_ps(s, w);
        }
        _mm512_storeu_ps(l + q, s);
    }
    for (int q = 0; q < nq; q += 4) {
        int d = 0;
        if (rb_tcover(first, last, q, 4, p0, np)) {
            for (; d + 64 <= hd; d += 64)
                rb_tvacc(vf, st, ms, acc, hd, np, q, d, p0, first, last, 4, 0);
            for (; d < hd; d += 16)
                rb_tvacc(vf, st, ms, acc, hd, np, q, d, p0, first, last, 1, 0);
        } else {
            for (; d + 64 <= hd; d += 64)
                rb_tvacc(vf, st, ms, acc, hd, np, q, d, p0, first, last, 4, 1);
            for (; d < hd; d += 16)
                rb_tvacc(vf, st, ms, acc, hd, np, q, d, p0, first, last, 1, 1);
        }
    }
    return 1;
}

#else
typedef int rb_ops_avx512_unused; /* ISO C: a translation unit is not empty */
#endif
