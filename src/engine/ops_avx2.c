/*
 * ops_avx2.c - the AVX2 + FMA + F16C bodies of the forward pass's vector
 * ops outside the matrix products (contracts in ops_kernels.h): SwiGLU's
 * 8-lane part (ops.c), attention's f16 loops and its quantized-K scores
 * (attention.c). The one file
 * of them compiled with those flags; the callers dispatch on rb_cpu_tier().
 */
#include "ops_kernels.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <float.h>
#include <immintrin.h>
#include <math.h>

#include "fp_dot.h"

/*
 * e^x in 8 lanes by the algorithm of ARM's optimized-routines expf, which
 * ggml's AVX2 SiLU uses (max error 1.45 + 0.5 ulp, not libm's expf): the
 * same steps give the same bits as llama.cpp's SwiGLU. x = n ln2 + b with
 * n = round(x / ln2) by the 1.5 * 2^23 shift, ln2 in two parts; e^b by a
 * degree-5 polynomial; 2^n assembled in the exponent bits. |n| > 126 needs
 * the scale split in two factors so that neither overflows; |n| > 192
 * saturates to 0 or inf.
 */
static __m256 rb_expf8(__m256 x)
{
    const __m256 shift = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), shift);
    const __m256 n = _mm256_sub_ps(z, shift);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 scale =
        _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 b2 = _mm256_mul_ps(b, b);
    const __m256 c45 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f));
    const __m256 c23 = _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f));
    const __m256 poly = _mm256_fmadd_ps(_mm256_fmadd_ps(c45, b2, c23), b2,
                                        _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    const __m256 normal = _mm256_fmadd_ps(poly, scale, scale);
    if (!_mm256_movemask_ps(big))
        return normal;
    const __m256i neg = _mm256_and_si256(
        _mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
        _mm256_set1_epi32((int)0x82000000u));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(neg, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, neg));
    const __m256 huge = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192), _CMP_GT_OQ);
    const __m256 split = _mm256_mul_ps(_mm256_fmadd_ps(s2, poly, s2), s1);
    return _mm256_blendv_ps(_mm256_blendv_ps(normal, split, big), _mm256_mul_ps(s1, s1), huge);
}

void rb_rope_rotate_avx2(int neox, int half, float *x, int n_heads, int head_dim,
                         const float *cos_t, const float *sin_t)
{
    for (int h = 0; h < n_heads; h++) {
        float *v = x + (int64_t)h * head_dim;
        int i = 0;
        if (neox)
            for (; i + 8 <= half; i += 8) {
                const __m256 x0 = _mm256_loadu_ps(v + i), x1 = _mm256_loadu_ps(v + i + half);
                const __m256 c = _mm256_loadu_ps(cos_t + i), s = _mm256_loadu_ps(sin_t + i);
                /* fma(x0, c, -(x1*s)) = fmsub(x0, c, x1*s): the negation is exact */
                _mm256_storeu_ps(v + i, _mm256_fmsub_ps(x0, c, _mm256_mul_ps(x1, s)));
                _mm256_storeu_ps(v + i + half, _mm256_fmadd_ps(x0, s, _mm256_mul_ps(x1, c)));
            }
        for (; i < half; i++) {
            const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = fmaf(x0, cos_t[i], -(x1 * sin_t[i]));
            v[b] = fmaf(x0, sin_t[i], x1 * cos_t[i]);
        }
    }
}

int64_t rb_swiglu8_avx2(float *gate, const float *up, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = rb_expf8(_mm256_sub_ps(_mm256_setzero_ps(), g));
        const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1), e));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    return i;
}

float rb_attn_dot_f16_avx2(const rb_f16 *q, const rb_f16 *k, int n)
{
    return rb_dot_f16_ggml(k, q, n);
}

void rb_attn_dot8_f16_avx2(const rb_f16 *q, const rb_f16 *k, int64_t stride, int n, float out[8])
{
    for (int l = 0; l < 8; l++)
        out[l] = rb_dot_f16_ggml(k + l * stride, q, n);
}

void rb_attn_mad_f16_avx2(rb_f16 *acc, const rb_f16 *v, float s, int n)
{
    int i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
        _mm_storeu_si128((__m128i *)(acc + i),
                         _mm256_cvtps_ph(_mm256_fmadd_ps(x, vs, a), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(fmaf(rb_fp16_to_fp32(v[i]), s, rb_fp16_to_fp32(acc[i])));
}

void rb_attn_scale_f16_avx2(rb_f16 *acc, float s, int n)
{
    int i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        _mm_storeu_si128((__m128i *)(acc + i),
                         _mm256_cvtps_ph(_mm256_mul_ps(a, vs), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) * s);
}

/* attention.c's rb_attn_block8_f16: the dot products and online-softmax
 * steps of 8 positions in one call (attend() ran four calls and two tier
 * checks per position), each step's operations those of the separate
 * functions: the same bits */
static inline void rb_attn_scale_inl(rb_f16 *acc, float s, int n)
{
    int i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        _mm_storeu_si128((__m128i *)(acc + i),
                         _mm256_cvtps_ph(_mm256_mul_ps(a, vs), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) * s);
}

static inline void rb_attn_mad_inl(rb_f16 *acc, const rb_f16 *v, float s, int n)
{
    int i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(acc + i)));
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + i)));
        _mm_storeu_si128((__m128i *)(acc + i),
                         _mm256_cvtps_ph(_mm256_fmadd_ps(x, vs, a), _MM_FROUND_TO_NEAREST_INT));
    }
    for (; i < n; i++)
        acc[i] = rb_fp32_to_fp16(fmaf(rb_fp16_to_fp32(v[i]), s, rb_fp16_to_fp32(acc[i])));
}

void rb_attn_block8_f16_avx2(const rb_f16 *q, const rb_f16 *k, const rb_f16 *v, int64_t stride,
                             int n, float kq_scale, rb_f16 *acc, float *m, float *sum)
{
    float sc[8];
    for (int l = 0; l < 8; l++)
        sc[l] = rb_dot_f16_ggml(k + l * stride, q, n);
    float mm = *m, ss = *sum;
    for (int l = 0; l < 8; l++) {
        const float s = sc[l] * kq_scale;
        float ms = 1.0f, vs = 1.0f;
        if (s > mm) {
            const float m_old = mm;
            mm = s;
            ms = expf(m_old - mm);
            rb_attn_scale_inl(acc, ms, n);
        } else {
            vs = expf(s - mm);
        }
        rb_attn_mad_inl(acc, v + l * stride, vs, n);
        ss = fmaf(ss, ms, vs);
    }
    *m = mm;
    *sum = ss;
}

/* attention.c's rb_attn_tile8_f16 (a block of 8 positions for several
 * queries) for head dims that are multiples of 32 up to 256: per query
 * rb_attn_block8_f16_avx2's operations in its order (the same bits), with
 * what the queries share done once, as ops_avx512.c's tile does: the 8 K
 * and V rows widened to f32 once, and each query's 8 online-softmax steps
 * (libm's expf) run before its V rows are summed, so that no vector
 * register lives across the calls. */
static inline __m256 rb_round8_f16(__m256 x)
{
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

int rb_attn_tile8_f16_avx2(const rb_f16 *k, const rb_f16 *v, int64_t stride, int n, float kq_scale,
                           int nq, const uint8_t *idx, const rb_f16 *qh, rb_f16 *acc, float *m,
                           float *sum)
{
    if (n % 32 || n > 256)
        return 0;
    float kf[8 * 256] __attribute__((aligned(32)));
    float vf[8 * 256] __attribute__((aligned(32)));
    float qf[256] __attribute__((aligned(32)));
    for (int l = 0; l < 8; l++)
        for (int c = 0; c < n; c += 8) {
            _mm256_store_ps(kf + l * n + c, rb_fp_load8_f16(k + l * stride + c));
            _mm256_store_ps(vf + l * n + c, rb_fp_load8_f16(v + l * stride + c));
        }
    for (int j = 0; j < nq; j++) {
        const int qi = idx[j];
        const rb_f16 *q = qh + (size_t)qi * n;
        rb_f16 *ac = acc + (size_t)qi * n;
        for (int c = 0; c < n; c += 8)
            _mm256_store_ps(qf + c, rb_fp_load8_f16(q + c));
        float sc[8];
        for (int l = 0; l < 8; l++) {
            const float *kr = kf + l * n;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int i = 0; i < n; i += 32) {
                a0 = _mm256_fmadd_ps(_mm256_load_ps(kr + i), _mm256_load_ps(qf + i), a0);
                a1 = _mm256_fmadd_ps(_mm256_load_ps(kr + i + 8), _mm256_load_ps(qf + i + 8), a1);
                a2 = _mm256_fmadd_ps(_mm256_load_ps(kr + i + 16), _mm256_load_ps(qf + i + 16), a2);
                a3 = _mm256_fmadd_ps(_mm256_load_ps(kr + i + 24), _mm256_load_ps(qf + i + 24), a3);
            }
            sc[l] = rb_fp_reduce4(a0, a1, a2, a3);
        }
        float ms[8], vs[8];
        unsigned raised = 0;
        float mm = m[qi], ss = sum[qi];
        for (int l = 0; l < 8; l++) {
            const float s = sc[l] * kq_scale;
            ms[l] = 1.0f;
            vs[l] = 1.0f;
            if (s > mm) {
                const float m_old = mm;
                mm = s;
                ms[l] = expf(m_old - mm);
                raised |= 1u << l;
            } else {
                vs[l] = expf(s - mm);
            }
            ss = fmaf(ss, ms[l], vs[l]);
        }
        m[qi] = mm;
        sum[qi] = ss;
        /* 64 values at a time in 8 registers: 8 independent chains per
           row step (f32 values that are f16 values), then the next 64 */
        for (int c = 0; c < n; c += 64) {
            const int w8 = n - c < 64 ? (n - c) / 8 : 8; /* 4 or 8 */
            __m256 x[8];
            for (int i = 0; i < 8; i++)
                x[i] = i < w8 ? rb_fp_load8_f16(ac + c + 8 * i) : _mm256_setzero_ps();
            for (int l = 0; l < 8; l++) {
                if (raised & (1u << l)) {
                    const __m256 f = _mm256_set1_ps(ms[l]);
                    for (int i = 0; i < 8; i++)
                        x[i] = rb_round8_f16(_mm256_mul_ps(x[i], f));
                }
                const __m256 w = _mm256_set1_ps(vs[l]);
                const float *vr = vf + l * n + c;
                if (w8 == 8) {
                    for (int i = 0; i < 8; i++)
                        x[i] = rb_round8_f16(_mm256_fmadd_ps(_mm256_load_ps(vr + 8 * i), w, x[i]));
                } else {
                    for (int i = 0; i < 4; i++)
                        x[i] = rb_round8_f16(_mm256_fmadd_ps(_mm256_load_ps(vr + 8 * i), w, x[i]));
                }
            }
            for (int i = 0; i < w8; i++)
                _mm_storeu_si128((__m128i *)(ac + c + 8 * i),
                                 _mm256_cvtps_ph(x[i], _MM_FROUND_TO_NEAREST_INT));
        }
    }
    return 1;
}

/* attention.c's rb_attn_mad_f32 / rb_attn_scale_f32 (a quantized V's f32
 * accumulator): one fused multiply-add / one product per element, as the
 * portable fmaf / `*` loops */
void rb_attn_mad_f32_avx2(float *acc, const float *v, float s, int n)
{
    int i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(_mm256_loadu_ps(v + i), vs, _mm256_loadu_ps(acc + i)));
    for (; i < n; i++)
        acc[i] = fmaf(v[i], s, acc[i]);
}

void rb_attn_scale_f32_avx2(float *acc, float s, int n)
{
    int i = 0;
    const __m256 vs = _mm256_set1_ps(s);
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_mul_ps(_mm256_loadu_ps(acc + i), vs));
    for (; i < n; i++)
        acc[i] *= s;
}

/* attention.c's rb_attn_dot_q8_0 / _q4_0 (quantized K against a q8_0
 * query): llama.cpp's AVX2 vec_dot, the same bits as their _ref forms */
/* ggml's hsum_float_8: (hi + lo), then pairs, then the last two */
static float kv_hsum8_avx2(__m256 x)
{
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* 8 lanes of 4-product sums of signed bytes x * y, as float */
static __m256 kv_sum4_avx2(__m256i x, __m256i y)
{
    const __m256i dot = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot));
}

float rb_attn_dot_q8_0_avx2(const void *k_row, const void *q_row, int n)
{
    const rb_block_q8_0 *x = k_row, *y = q_row;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / RB_QK8_0; b++) {
        const __m256 d = _mm256_set1_ps(rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d));
        const __m256 q = kv_sum4_avx2(_mm256_loadu_si256((const __m256i *)x[b].qs),
                                      _mm256_loadu_si256((const __m256i *)y[b].qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    return kv_hsum8_avx2(acc);
}

float rb_attn_dot_q4_0_avx2(const void *k_row, const void *q_row, int n)
{
    const rb_block_q4_0 *x = k_row;
    const rb_block_q8_0 *y = q_row;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < n / RB_QK4_0; b++) {
        const __m256 d = _mm256_set1_ps(rb_fp16_to_fp32(x[b].d) * rb_fp16_to_fp32(y[b].d));
        const __m128i raw = _mm_loadu_si128((const __m128i *)x[b].qs);
        __m256i qx = _mm256_and_si256(_mm256_set1_epi8(0x0f),
                                      _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw));
        qx = _mm256_sub_epi8(qx, _mm256_set1_epi8(8));
        const __m256 q = kv_sum4_avx2(qx, _mm256_loadu_si256((const __m256i *)y[b].qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    return kv_hsum8_avx2(acc);
}

/*
 * rb_attn_tblock_avx2: attention.h's tiled block in 8-lane registers
 * (the 64 queries of a tile are 8 ymm). Scores: 4 positions x 16 queries
 * in 8 accumulators; V: 4 queries x 16 dims in 8 accumulators (the fma of
 * a position outside a query's span blended away where some span does not
 * hold the whole block); the softmax down the lanes. Each lane takes
 * rb_attn_tblock_ref's operations in its order: the same bits.
 */
static inline __attribute__((always_inline)) __m256 rb_texp8(__m256 x)
{
    const __m256 ok = _mm256_cmp_ps(x, _mm256_set1_ps(RB_EXP_LO), _CMP_GE_OQ);
    x = _mm256_min_ps(x, _mm256_set1_ps(88.0f));
    const __m256 sh = _mm256_set1_ps(RB_EXP_SHIFT);
    const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(RB_EXP_LOG2E), sh), sh);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-RB_EXP_LN2_HI), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-RB_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(RB_EXP_C7);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(RB_EXP_C6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(RB_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(RB_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(RB_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(RB_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(ok, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* NP positions (4 or 1) from p, queries q..q+15 */
static inline __attribute__((always_inline)) void
rb_tscore8(const float *kf, const float *qt, int hd, int p, int q, int32_t p0, __m256 scale,
           const int32_t *first, const int32_t *last, float *st, const int NP)
{
    __m256 c[4][2];
    _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++) {
        c[i][0] = _mm256_setzero_ps();
        c[i][1] = _mm256_setzero_ps();
    }
    for (int d = 0; d < hd; d++) {
        const __m256 q0 = _mm256_loadu_ps(qt + d * 64 + q), q1 = _mm256_loadu_ps(qt + d * 64 + q + 8);
        _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++) {
            const __m256 k = _mm256_broadcast_ss(kf + (p + i) * hd + d);
            c[i][0] = _mm256_fmadd_ps(k, q0, c[i][0]);
            c[i][1] = _mm256_fmadd_ps(k, q1, c[i][1]);
        }
    }
    const __m256 neg = _mm256_set1_ps(-INFINITY);
    _Pragma("GCC unroll 4") for (int i = 0; i < NP; i++) {
        const __m256i pos = _mm256_set1_epi32(p0 + p + i);
        _Pragma("GCC unroll 2") for (int j = 0; j < 2; j++) {
            const __m256i f = _mm256_loadu_si256((const __m256i *)(first + q + 8 * j));
            const __m256i l = _mm256_loadu_si256((const __m256i *)(last + q + 8 * j));
            const __m256i out = _mm256_or_si256(_mm256_cmpgt_epi32(f, pos), _mm256_cmpgt_epi32(pos, l));
            _mm256_storeu_ps(st + (p + i) * 64 + q + 8 * j,
                             _mm256_blendv_ps(_mm256_mul_ps(c[i][j], scale), neg,
                                              _mm256_castsi256_ps(out)));
        }
    }
}

/* 1 when the spans of queries q..q+n-1 all hold positions p0..p0+np-1 */
static inline __attribute__((always_inline)) int
rb_tcover8(const int32_t *first, const int32_t *last, int q, int n, int32_t p0, int np)
{
    int all = 1;
    for (int i = 0; i < n; i++)
        all &= first[q + i] <= p0 && p0 + np - 1 <= last[q + i];
    return all;
}

/* the fma of query q at position pos, or a where pos is outside its span */
static inline __attribute__((always_inline)) __m256
rb_span_fma8(const int32_t *first, const int32_t *last, int q, int32_t pos, __m256 w, __m256 v,
             __m256 a, const int MASKED)
{
    if (!MASKED)
        return _mm256_fmadd_ps(w, v, a);
    const __m256 in = _mm256_castsi256_ps(
        _mm256_set1_epi32(first[q] <= pos && pos <= last[q] ? -1 : 0));
    return _mm256_blendv_ps(a, _mm256_fmadd_ps(w, v, a), in);
}

/* queries q..q+3, NV vectors (2 or 1) of dims from d; MASKED: the fma of
 * a position outside a query's span left out (else every span holds the
 * block) */
static inline __attribute__((always_inline)) void
rb_tvacc8(const float *vf, const float *st, const float *ms, float *acc, int hd, int np, int q,
          int d, int32_t p0, const int32_t *first, const int32_t *last, const int NV,
          const int MASKED)
{
    __m256 a[4][2];
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        const __m256 s = _mm256_set1_ps(ms[q + i]);
        _Pragma("GCC unroll 2") for (int j = 0; j < NV; j++)
            a[i][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + (q + i) * hd + d + 8 * j), s);
    }
    for (int p = 0; p < np; p++) {
        __m256 v[2];
        _Pragma("GCC unroll 2") for (int j = 0; j < NV; j++) v[j] = _mm256_loadu_ps(vf + p * hd + d + 8 * j);
        _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
            const __m256 w = _mm256_broadcast_ss(st + p * 64 + q + i);
            _Pragma("GCC unroll 2") for (int j = 0; j < NV; j++)
                a[i][j] = rb_span_fma8(first, last, q + i, p0 + p, w, v[j], a[i][j], MASKED);
        }
    }
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++)
        _Pragma("GCC unroll 2") for (int j = 0; j < NV; j++)
            _mm256_storeu_ps(acc + (q + i) * hd + d + 8 * j, a[i][j]);
}

/* 32 q8_0 values from qs, times d, into o */
static inline __attribute__((always_inline)) void rb_widen_q8(const int8_t *qs, __m256 d, float *o)
{
    _Pragma("GCC unroll 4") for (int i = 0; i < 4; i++) {
        const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8 * i)));
        _mm256_storeu_ps(o + 8 * i, _mm256_mul_ps(d, _mm256_cvtepi32_ps(v)));
    }
}

void rb_attn_widen_avx2(uint32_t type, const void *const *rows, int np, int hd, float *out)
{
    for (int p = 0; p < np; p++) {
        float *o = out + (size_t)p * hd;
        if (type == RB_TYPE_F16) {
            const rb_f16 *r = rows[p];
            for (int d = 0; d < hd; d += 8)
                _mm256_storeu_ps(o + d, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r + d))));
        } else if (type == RB_TYPE_Q8_0) {
            const rb_block_q8_0 *x = rows[p];
            for (int b = 0; b < hd / RB_QK8_0; b++)
                rb_widen_q8(x[b].qs, _mm256_set1_ps(rb_fp16_to_fp32(x[b].d)), o + b * RB_QK8_0);
        } else {
            const rb_block_q4_0 *x = rows[p];
            for (int b = 0; b < hd / RB_QK4_0; b++) {
                const __m128i raw = _mm_loadu_si128((const __m128i *)x[b].qs);
                const __m128i m4 = _mm_set1_epi8(0x0f), e8 = _mm_set1_epi8(8);
                int8_t q[32];
                _mm_storeu_si128((__m128i *)q, _mm_sub_epi8(_mm_and_si128(raw, m4), e8));
                _mm_storeu_si128((__m128i *)(q + 16),
                                 _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), e8));
                rb_widen_q8(q, _mm256_set1_ps(rb_fp16_to_fp32(x[b].d)), o + b * RB_QK4_0);
            }
        }
    }
}

/*
 * rb_attn_tblock_few_avx2: the decode kernel of ops_avx512.c in 8-lane
 * registers: the block's K rows widened and transposed once (8 x 8 in
 * registers), each query dotted with 8 positions per fma (8 independent
 * chains over the block's 64 positions), its softmax over the block's
 * scores in 8 registers, the V rows read once for two queries, the fma of
 * a position outside a query's span blended away. The same operations per (query, position) as
 * rb_attn_tblock_ref: the same bits.
 */
static inline __attribute__((always_inline)) void rb_tr8(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    /* t[2i], 128-bit half h: rows 2i, 2i+1 of columns 4h, 4h+1; t[2i+1]: 4h+2, 4h+3 */
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
    }
    /* u[4i + j], half h: column 4h + j of rows 4i..4i+3 */
    for (int j = 0; j < 4; j++) {
        r[j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x20);
        r[4 + j] = _mm256_permute2f128_ps(u[j], u[4 + j], 0x31);
    }
}

/* values c..c+7 of a row of type (f16, q8_0, q4_0; c a multiple of 8), as
 * rb_attn_widen_ref gives them */
static inline __attribute__((always_inline)) __m256 rb_row8(uint32_t type, const void *row, int c)
{
    if (type == RB_TYPE_F16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const rb_f16 *)row + c)));
    if (type == RB_TYPE_Q8_0) {
        const rb_block_q8_0 *x = (const rb_block_q8_0 *)row + c / RB_QK8_0;
        const __m128i v = _mm_loadl_epi64((const __m128i *)(x->qs + c % RB_QK8_0));
        return _mm256_mul_ps(_mm256_set1_ps(rb_fp16_to_fp32(x->d)),
                             _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
    }
    const rb_block_q4_0 *x = (const rb_block_q4_0 *)row + c / RB_QK4_0;
    const int off = c % RB_QK4_0;
    __m128i v = _mm_loadl_epi64((const __m128i *)(x->qs + (off & 15)));
    if (off >= 16)
        v = _mm_srli_epi16(v, 4);
    v = _mm_sub_epi8(_mm_and_si128(v, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
    return _mm256_mul_ps(_mm256_set1_ps(rb_fp16_to_fp32(x->d)),
                         _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)));
}

/* query q's NG groups of 8 positions' raw scores (NG independent chains) */
static inline __attribute__((always_inline)) void
rb_dscore8(const float *kt, const float *qt, int hd, int q, __m256 *s, const int NG)
{
    _Pragma("GCC unroll 8") for (int g = 0; g < NG; g++) s[g] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const __m256 qd = _mm256_broadcast_ss(qt + d * 64 + q);
        _Pragma("GCC unroll 8") for (int g = 0; g < NG; g++)
            s[g] = _mm256_fmadd_ps(_mm256_loadu_ps(kt + d * 64 + 8 * g), qd, s[g]);
    }
}

/* QB queries (1 or 2) from q, NV vectors (4 or 1) of dims from d */
static inline __attribute__((always_inline)) void
rb_dvacc8(uint32_t type_v, const void *const *vr, int np, int hd, int q, int d,
          const float (*w)[64], const float *ms, float *acc, int32_t p0, const int32_t *first,
          const int32_t *last, const int QB, const int NV)
{
    __m256 a[2][4];
    _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            a[i][j] = _mm256_mul_ps(_mm256_loadu_ps(acc + (size_t)(q + i) * hd + d + 8 * j),
                                    _mm256_set1_ps(ms[q + i]));
    for (int p = 0; p < np; p++) {
        __m256 v[4];
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) v[j] = rb_row8(type_v, vr[p], d + 8 * j);
        _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++) {
            const __m256 wv = _mm256_set1_ps(w[q + i][p]);
            _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
                a[i][j] = rb_span_fma8(first, last, q + i, p0 + p, wv, v[j], a[i][j], 1);
        }
    }
    _Pragma("GCC unroll 2") for (int i = 0; i < QB; i++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++)
            _mm256_storeu_ps(acc + (size_t)(q + i) * hd + d + 8 * j, a[i][j]);
}

int rb_attn_tblock_few_avx2(uint32_t type_k, uint32_t type_v, const void *const *kr,
                            const void *const *vr, int np, int hd, int nq, const float *qt,
                            const int32_t *first, const int32_t *last, int32_t p0,
                            float kq_scale, float *kt, float *acc, float *m, float *l)
{
    if (hd % 8 != 0 || nq > RB_ATTN_TBLOCK_FEW)
        return 0;
    for (int g = 0; g < np; g += 8) { /* kt[d * 64 + p], rows past np zero */
        const int nr = np - g < 8 ? np - g : 8;
        for (int c = 0; c < hd; c += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; i++)
                r[i] = i < nr ? rb_row8(type_k, kr[g + i], c) : _mm256_setzero_ps();
            rb_tr8(r);
            for (int i = 0; i < 8; i++)
                _mm256_storeu_ps(kt + (size_t)(c + i) * 64 + g, r[i]);
        }
    }
    const int ng = (np + 7) / 8;
    const __m256 scale = _mm256_set1_ps(kq_scale), neg = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    float w[RB_ATTN_TBLOCK_FEW][64], ms[RB_ATTN_TBLOCK_FEW];
    for (int q = 0; q < nq; q++) {
        __m256 s[8];
        if (ng == 8)
            rb_dscore8(kt, qt, hd, q, s, 8);
        else
            for (int g = 0; g < ng; g++)
                rb_dscore8(kt + 8 * g, qt, hd, q, s + g, 1);
        const __m256i fq = _mm256_set1_epi32(first[q] - 1), lq = _mm256_set1_epi32(last[q] + 1);
        __m256 mxv = _mm256_set1_ps(m[q]);
        for (int g = 0; g < ng; g++) {
            const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(8 * g), lane);
            const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(p0), idx);
            const __m256i in = _mm256_and_si256(
                _mm256_and_si256(_mm256_cmpgt_epi32(pos, fq), _mm256_cmpgt_epi32(lq, pos)),
                _mm256_cmpgt_epi32(_mm256_set1_epi32(np), idx));
            s[g] = _mm256_blendv_ps(neg, _mm256_mul_ps(s[g], scale), _mm256_castsi256_ps(in));
            mxv = _mm256_max_ps(s[g], mxv);
        }
        float mt[8], mx = m[q];
        _mm256_storeu_ps(mt, mxv);
        for (int i = 0; i < 8; i++)
            mx = mt[i] > mx ? mt[i] : mx;
        ms[q] = _mm256_cvtss_f32(rb_texp8(_mm256_set1_ps(m[q] - mx)));
        for (int g = 0; g < ng; g++)
            _mm256_storeu_ps(w[q] + 8 * g, rb_texp8(_mm256_sub_ps(s[g], _mm256_set1_ps(mx))));
        float sum = l[q] * ms[q];
        for (int p = 0; p < np; p++)
            sum = sum + w[q][p];
        l[q] = sum;
        m[q] = mx;
    }
    for (int q = 0; q < nq; q += 2) {
        const int qb = nq - q >= 2 ? 2 : 1;
        int d = 0;
        for (; d + 32 <= hd; d += 32) {
            if (qb == 2)
                rb_dvacc8(type_v, vr, np, hd, q, d, (const float (*)[64])w, ms, acc, p0, first, last, 2, 4);
            else
                rb_dvacc8(type_v, vr, np, hd, q, d, (const float (*)[64])w, ms, acc, p0, first, last, 1, 4);
        }
        for (; d < hd; d += 8)
            for (int i = 0; i < qb; i++)
                rb_dvacc8(type_v, vr, np, hd, q + i, d, (const float (*)[64])w, ms, acc, p0, first,
                          last, 1, 1);
    }
    return 1;
}

int rb_attn_tblock_avx2(const float *kf, const float *vf, int np, int hd, int nq,
                        const float *qt, const int32_t *first, const int32_t *last, int32_t p0,
                        float kq_scale, float *st, float *kt, float *acc, float *m, float *l)
{
    (void)kt;
    if (hd % 8 != 0)
        return 0;
    float ms[64];
    const __m256 scale = _mm256_set1_ps(kq_scale);
    for (int q = 0; q < nq; q += 16) {
        int p = 0;
        for (; p + 4 <= np; p += 4)
            rb_tscore8(kf, qt, hd, p, q, p0, scale, first, last, st, 4);
        for (; p < np; p++)
            rb_tscore8(kf, qt, hd, p, q, p0, scale, first, last, st, 1);
    }
    for (int q = 0; q < nq; q += 8) {
        const __m256 mo = _mm256_loadu_ps(m + q);
        __m256 mx = mo;
        for (int p = 0; p < np; p++)
            mx = _mm256_max_ps(_mm256_loadu_ps(st + p * 64 + q), mx);
        const __m256 msv = rb_texp8(_mm256_sub_ps(mo, mx));
        _mm256_storeu_ps(ms + q, msv);
        _mm256_storeu_ps(m + q, mx);
        __m256 s = _mm256_mul_ps(_mm256_loadu_ps(l + q), msv);
        for (int p = 0; p < np; p++) {
            const __m256 w = rb_texp8(_mm256_sub_ps(_mm256_loadu_ps(st + p * 64 + q), mx));
            _mm256_storeu_ps(st + p * 64 + q, w);
            s = _mm256_add_ps(s, w);
        }
        _mm256_storeu_ps(l + q, s);
    }
    for (int q = 0; q < nq; q += 4) {
        int d = 0;
        if (rb_tcover8(first, last, q, 4, p0, np)) {
            for (; d + 16 <= hd; d += 16)
                rb_tvacc8(vf, st, ms, acc, hd, np, q, d, p0, first, last, 2, 0);
            for (; d < hd; d += 8)
                rb_tvacc8(vf, st, ms, acc, hd, np, q, d, p0, first, last, 1, 0);
        } else {
            for (; d + 16 <= hd; d += 16)
                rb_tvacc8(vf, st, ms, acc, hd, np, q, d, p0, first, last, 2, 1);
            for (; d < hd; d += 8)
                rb_tvacc8(vf, st, ms, acc, hd, np, q, d, p0, first, last, 1, 1);
        }
    }
    return 1;
}

#else
typedef int rb_ops_avx2_unused; /* ISO C: a translation unit is not empty */
#endif
