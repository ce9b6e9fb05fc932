/*
 * test_attention.c - the f16 attention loops give the bits of ggml's
 * order, spelled out here independently: q.k as ggml_vec_dot_f16 sums it
 * (32-element steps in 4 x 8 fused lanes, a fixed reduction tree, the tail
 * in double), V as f16(fma(v, s, acc)); the 8-position score equals eight
 * single scores. Quantized K rows (q8_0, q4_0 against a q8_0 query): the
 * dispatched kernel equals the scalar reference bit for bit, and a q8_0
 * score is close to the float dot of the dequantized rows. SwiGLU: on the
 * vector tiers the first n - n % 8 values of a row take ggml's vector exp
 * (spelled out here in scalar fmaf steps), the rest libm's expf; on the
 * ref tier every value libm's. The tiled f32 form: the tier's widen and
 * block kernels (avx2, avx512, neon) against rb_attn_widen_ref and
 * rb_attn_tblock_ref bit for bit, the dispatched walk against the scalar
 * one, and both against softmax(QK^T)V in double. All of it on every tier
 * this build has and this CPU runs (x86-64: ref, avx2, vnni, avx512;
 * aarch64: ref, neon, dotprod, i8mm - under qemu-user in CI).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "check.h"
#include "cpu.h"
#include "forward.h"
#include "kvcache.h"
#include "ops.h"
#include "ops_kernels.h"
#include "quant.h"
#include "testlib.h"

/* ggml_vec_dot_f16 on AVX2, element by element */
static float ggml_order_dot(const rb_f16 *x, const rb_f16 *y, int n)
{
    float lane[4][8] = {{0}};
    int np = n / 32 * 32;
    for (int i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 8; l++)
                lane[j][l] = fmaf(rb_fp16_to_fp32(x[i + 8 * j + l]),
                                  rb_fp16_to_fp32(y[i + 8 * j + l]), lane[j][l]);
    double sum = 0.0;
    if (np) {
        float t[8];
        for (int l = 0; l < 8; l++)
            t[l] = (lane[0][l] + lane[2][l]) + (lane[1][l] + lane[3][l]);
        float h0 = t[0] + t[4], h1 = t[1] + t[5], h2 = t[2] + t[6], h3 = t[3] + t[7];
        sum = (h0 + h1) + (h2 + h3);
    }
    for (int i = np; i < n; i++)
        sum += (double)(rb_fp16_to_fp32(x[i]) * rb_fp16_to_fp32(y[i]));
    return (float)sum;
}

/* Uniform in [-4, 4). */
static float frand(rb_test_rng *r) { return (float)(rb_test_rng_uniform(r) * 8.0 - 4.0); }

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_from(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* e^x as ggml's AVX2 / NEON SiLU computes it (ARM optimized-routines'
 * expf), one lane: fnmadd(a, b, c) is fmaf(-a, b, c) */
static float ggml_vexpf(float x)
{
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = f32_bits(z) << 23;
    const float scale = f32_from(e + f32_bits(1.0f));
    const float b2 = b * b;
    const float c45 = fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f);
    const float c23 = fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
    const float poly = fmaf(fmaf(c45, b2, c23), b2, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f))
        return fmaf(poly, scale, scale);
    const uint32_t neg = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = f32_from(neg + 0x7f000000u), s2 = f32_from(e - neg);
    if (fabsf(n) > 192.0f)
        return s1 * s1;
    return fmaf(s2, poly, s2) * s1;
}

static int is_vector_tier(int tier)
{
    return tier != RB_CPU_TIER_REF;
}

static void check_swiglu(rb_test_rng *seed)
{
    enum { N = 4003 };
    float gate[N], up[N], want[N];
    const int vec = is_vector_tier(rb_cpu_tier());
    for (int trial = 0; trial < 6; trial++) {
        const int64_t n = trial == 0 ? 7 : trial == 1 ? 8 : N - trial;
        for (int64_t i = 0; i < n; i++) {
            /* mostly ordinary, some past the exp's split (|x| > 87) and
               saturation (|x| > 133) points */
            const double r = rb_test_rng_uniform(seed);
            gate[i] = r < 0.1 ? (float)(rb_test_rng_uniform(seed) * 400.0 - 200.0) : frand(seed) * 3;
            up[i] = frand(seed);
        }
        const int64_t nv = vec ? n - n % 8 : 0;
        for (int64_t i = 0; i < n; i++) {
            const float g = gate[i];
            const float e = i < nv ? ggml_vexpf(0.0f - g) : expf(-g);
            want[i] = g / (1.0f + e) * up[i];
        }
        rb_swiglu(gate, up, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += memcmp(&gate[i], &want[i], 4) != 0;
        CHECK_EQ_INT(bad, 0);
    }
}

/* One query spelled out: every position first..last in order, the score
 * in ggml's order, the online-softmax step, V in the f16 accumulator. */
static void naive_query(const rb_kvcache *kv, uint32_t kvh, float kq, const float *qf, uint32_t first,
                        uint32_t last, float *out)
{
    const uint32_t hd = kv->head_dim_k;
    rb_f16 q[256], acc[256] = {0};
    float m = -INFINITY, sum = 0.0f;
    for (uint32_t i = 0; i < hd; i++)
        q[i] = rb_fp32_to_fp16(qf[i]);
    for (uint32_t p = first; p <= last; p++) {
        const rb_f16 *k = rb_kvcache_k(kv, 0, kvh, p), *v = rb_kvcache_v(kv, 0, kvh, p);
        const float s = ggml_order_dot(k, q, (int)hd) * kq;
        float ms = 1.0f, vs = 1.0f;
        if (s > m) {
            const float old = m;
            m = s;
            ms = expf(old - m);
            for (uint32_t i = 0; i < hd; i++)
                acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) * ms);
        } else {
            vs = expf(s - m);
        }
        for (uint32_t i = 0; i < hd; i++)
            acc[i] = rb_fp32_to_fp16(fmaf(rb_fp16_to_fp32(v[i]), vs, rb_fp16_to_fp32(acc[i])));
        sum = fmaf(sum, ms, vs);
    }
    const float inv = 1.0f / sum;
    for (uint32_t i = 0; i < hd; i++)
        out[i] = rb_fp16_to_fp32(acc[i]) * inv;
}

/* The tiled attention (rb_attn_f16: queries of a GQA group and a chunk of
 * tokens over 8-position blocks) == the untiled one (rb_attn_f16_ref) ==
 * the naive loop above, bit for bit, over random shapes: head dims with
 * and without the avx512 kernel, pages of 8, 12 (blocks across a page
 * boundary) and 256 positions, depth 0..~700, chunks of 1..32 queries
 * (group x tokens), with and without a sliding window; the pages wholly
 * before the earliest window are freed (the tiled walk must not read them). */
static void check_tiled(rb_test_rng *rng, int rounds)
{
    static const uint32_t dims[] = {64, 128, 256, 32, 8, 96};
    static const uint32_t pages[] = {256, 8, 12};
    static float qbuf[RB_ATTN_MAX_QUERIES * 256], got[RB_ATTN_MAX_QUERIES * 256],
        ref[RB_ATTN_MAX_QUERIES * 256], want[256];
    for (int r = 0; r < rounds; r++) {
        const uint32_t hd = dims[r % 6], pt = pages[(r / 6) % 3];
        const uint32_t n_kv = 2, kvh = (uint32_t)r % 2;
        uint32_t cap = RB_ATTN_ACC_HALVES / hd;
        cap = cap < RB_ATTN_MAX_QUERIES ? cap : RB_ATTN_MAX_QUERIES;
        const uint32_t group = 1 + (uint32_t)(rb_test_rng_uniform(rng) * 4); /* 1..4 */
        const uint32_t g = group < cap ? group : cap;
        const uint32_t max_tok = cap / g;
        const uint32_t n_tok = 1 + (uint32_t)(rb_test_rng_uniform(rng) * max_tok);
        const uint32_t depth = (uint32_t)(rb_test_rng_uniform(rng) * (r % 3 ? 700 : 20));
        const uint32_t window = r % 4 == 1 ? 1 + (uint32_t)(rb_test_rng_uniform(rng) * 300) : 0;
        const uint32_t n_pos = depth + n_tok;
        rb_kvcache kv;
        rb_error err = {0};
        CHECK(rb_kvcache_init(&kv, 1, n_kv, hd, hd, n_pos + 16, pt, &err) == RB_OK);
        CHECK(rb_kvcache_reserve(&kv, n_pos, &err) == RB_OK);
        /* scores of order 1..10: softmax weights spread, maxima raised often */
        const float qs_scale = 0.5f / sqrtf((float)hd);
        for (uint32_t p = 0; p < n_pos; p++)
            for (uint32_t h = 0; h < n_kv; h++)
                for (uint32_t i = 0; i < hd; i++) {
                    rb_kvcache_k(&kv, 0, h, p)[i] = rb_fp32_to_fp16(frand(rng) * (1.0f + (float)(p % 5)));
                    rb_kvcache_v(&kv, 0, h, p)[i] = rb_fp32_to_fp16(frand(rng));
                }
        rb_attn_query qs[RB_ATTN_MAX_QUERIES];
        uint32_t nq = 0, lo = UINT32_MAX;
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t h = 0; h < g; h++, nq++) {
                rb_attn_query *a = &qs[nq];
                for (uint32_t i = 0; i < hd; i++)
                    qbuf[nq * hd + i] = frand(rng) * qs_scale * 4.0f;
                a->q = qbuf + nq * hd;
                a->last = depth + t;
                a->first = window && a->last >= window ? a->last - window + 1 : 0;
                lo = a->first < lo ? a->first : lo;
            }
        for (uint32_t pg = 0; pg < lo / pt; pg++)
            rb_kvcache_free_page(&kv, 0, pg);
        const float kq = 1.0f / sqrtf((float)hd);
        for (uint32_t i = 0; i < nq; i++)
            qs[i].out = got + i * hd;
        rb_attn_f16(&kv, 0, kvh, kq, qs, nq);
        for (uint32_t i = 0; i < nq; i++)
            qs[i].out = ref + i * hd;
        rb_attn_f16_ref(&kv, 0, kvh, kq, qs, nq);
        int bad = 0;
        for (uint32_t i = 0; i < nq; i++) {
            naive_query(&kv, kvh, kq, qs[i].q, qs[i].first, qs[i].last, want);
            bad += memcmp(got + i * hd, want, hd * sizeof *want) != 0;
            bad += memcmp(ref + i * hd, want, hd * sizeof *want) != 0;
        }
        if (bad)
            printf("  tiled != untiled: head dim %u, page %u, group %u, tokens %u, depth %u, "
                   "window %u: %d rows differ\n",
                   hd, pt, g, n_tok, depth, window, bad);
        CHECK_EQ_INT(bad, 0);
        rb_kvcache_deinit(&kv);
    }
}

/* 1 ulp of f32 at |x| (x normal) */
static double ulp_of(double x)
{
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 24);
}

/* rb_attn_exp against exp() in double over [-87.3, 88]: at most 2 ulp
 * (measured 1 here; the bound in attention.h), 0 below ln(FLT_MIN), and
 * exp(0) = 1 exactly. */
static void check_exp(void)
{
    double worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        const float x = -87.3f + (float)i * (175.3f / 2000000.0f);
        const double want = exp((double)x);
        const double d = fabs((double)rb_attn_exp(x) - want) / ulp_of(want);
        worst = d > worst ? d : worst;
    }
    printf("  rb_attn_exp: max error %.2f ulp over [-87.3, 88]\n", worst);
    CHECK(worst <= 2.0);
    CHECK(rb_attn_exp(-88.0f) == 0.0f && rb_attn_exp(-INFINITY) == 0.0f);
    CHECK(rb_attn_exp(-FLT_MAX) == 0.0f && rb_attn_exp(0.0f) == 1.0f);
}

/*
 * The tiled f32 form (rb_attn_kv_tiled): the tier's kernel gives the
 * scalar form's bits (rb_attn_kv_tiled_ref; every lane is the same
 * sequence of operations, so the bound is 0), and both are within a
 * derived bound of softmax(kq q.K) V computed in double from the same f16
 * K and V: a score's f32 fma chain errs by at most E = kq * hd * u *
 * sum |q_i k_i| (u = 2^-24), which moves a weight by a factor within
 * e^(+-E), so the normalised sum by at most (e^(2E) - 1) max|v|; the
 * sequential f32 sums of n weights and of n weighted rows add n u each,
 * rb_attn_exp 2 ulp per weight: |out - ref| <= max|v| * (e^(2E) - 1 +
 * (2n + 8) u), doubled for slack. Random shapes: head dims 8..256 (with
 * and without each tier's kernel), 1..64 queries (a tile or less), KV
 * lengths that are not multiples of the 64-position block, pages of 8, 12
 * and 256 positions, causal spans, sliding windows whose starts fall
 * mid-block, and the pages before the earliest window freed; K and V f16,
 * q8_0 or q4_0 (head dims of 32s; the reference in double reads the same
 * dequantized values). And a query's result is the same bits computed
 * alone (a decode) as in its tile (attention.h: the blocks are absolute,
 * a position outside a span adds nothing).
 */
static void check_f32_tiled(rb_test_rng *rng, int rounds)
{
    static const uint32_t dims[] = {64, 128, 8, 32, 256, 96, 72, 40};
    static const uint32_t pages[] = {256, 8, 12};
    static float qbuf[RB_ATTN_TILE_Q * 256], got[RB_ATTN_TILE_Q * 256],
        ref[RB_ATTN_TILE_Q * 256], solo[256], kd[256], vd[256];
    static const uint32_t types[] = {RB_TYPE_F16, RB_TYPE_Q8_0, RB_TYPE_Q4_0};
    float *work = malloc(RB_ATTN_TILED_WORK_FLOATS(256) * sizeof *work);
    double worst = 0; /* |d| / bound */
    for (int r = 0; r < rounds; r++) {
        const uint32_t hd = dims[r % 8], pt = pages[(r / 8) % 3];
        const uint32_t n_kv = 2, kvh = (uint32_t)r % 2;
        const uint32_t group = 1 + (uint32_t)(rb_test_rng_uniform(rng) * 4); /* 1..4 */
        const uint32_t max_tok = RB_ATTN_TILE_Q / group;
        const uint32_t n_tok = r % 5 == 0 ? max_tok : 1 + (uint32_t)(rb_test_rng_uniform(rng) * max_tok);
        const uint32_t depth = (uint32_t)(rb_test_rng_uniform(rng) * (r % 3 ? 400 : 20));
        const uint32_t window = r % 4 == 1 ? 1 + (uint32_t)(rb_test_rng_uniform(rng) * 150) : 0;
        const uint32_t n_pos = depth + n_tok;
        const uint32_t tk = hd % 32 ? RB_TYPE_F16 : types[(r / 3) % 3];
        const uint32_t tv = hd % 32 ? RB_TYPE_F16 : types[(r / 5) % 3];
        rb_kvcache kv;
        rb_error err = {0};
        CHECK(rb_kvcache_init_typed(&kv, 1, n_kv, hd, hd, n_pos + 16, pt, tk, tv, &err) == RB_OK);
        CHECK(rb_kvcache_reserve(&kv, n_pos, &err) == RB_OK);
        for (uint32_t p = 0; p < n_pos; p++)
            for (uint32_t h = 0; h < n_kv; h++) {
                for (uint32_t i = 0; i < hd; i++) {
                    kd[i] = frand(rng) * (1.0f + (float)(p % 5));
                    vd[i] = frand(rng);
                }
                rb_forward_store_row(tk, kd, rb_kvcache_k_row(&kv, 0, h, p), hd);
                rb_forward_store_row(tv, vd, rb_kvcache_v_row(&kv, 0, h, p), hd);
            }
        const float qs_scale = 2.0f / sqrtf((float)hd);
        rb_attn_query qs[RB_ATTN_TILE_Q];
        uint32_t nq = 0, lo = UINT32_MAX;
        for (uint32_t t = 0; t < n_tok; t++)
            for (uint32_t h = 0; h < group; h++, nq++) {
                rb_attn_query *a = &qs[nq];
                for (uint32_t i = 0; i < hd; i++)
                    qbuf[nq * hd + i] = frand(rng) * qs_scale;
                a->q = qbuf + nq * hd;
                a->last = depth + t;
                a->first = window && a->last >= window ? a->last - window + 1 : 0;
                lo = a->first < lo ? a->first : lo;
            }
        for (uint32_t pg = 0; pg < lo / pt; pg++)
            rb_kvcache_free_page(&kv, 0, pg);
        const float kq = 1.0f / sqrtf((float)hd);
        for (uint32_t i = 0; i < nq; i++)
            qs[i].out = got + i * hd;
        rb_attn_kv_tiled(&kv, 0, kvh, kq, qs, nq, work);
        for (uint32_t i = 0; i < nq; i++)
            qs[i].out = ref + i * hd;
        rb_attn_kv_tiled_ref(&kv, 0, kvh, kq, qs, nq, work);
        int bad = memcmp(got, ref, (size_t)nq * hd * sizeof *got) != 0, far = 0, alone = 0;
        for (uint32_t i = 0; i < nq; i++) {
            rb_attn_query a = qs[i];
            a.out = solo;
            rb_attn_kv_tiled(&kv, 0, kvh, kq, &a, 1, work);
            alone += memcmp(solo, got + i * hd, hd * sizeof *solo) != 0;
        }
        for (uint32_t i = 0; i < nq; i++) {
            const rb_attn_query *a = &qs[i];
            const uint32_t n = a->last - a->first + 1;
            double *sc = malloc(n * sizeof *sc), mx = -INFINITY, E = 0, vmax = 0;
            float *vrows = malloc((size_t)n * hd * sizeof *vrows);
            for (uint32_t p = a->first; p <= a->last; p++) {
                const void *kr = rb_kvcache_k_row(&kv, 0, kvh, p);
                const void *vr = rb_kvcache_v_row(&kv, 0, kvh, p);
                rb_attn_widen_ref(tk, &kr, 1, (int)hd, kd);
                rb_attn_widen_ref(tv, &vr, 1, (int)hd, vrows + (size_t)(p - a->first) * hd);
                double s = 0, sa = 0;
                for (uint32_t d = 0; d < hd; d++) {
                    s += (double)a->q[d] * kd[d];
                    sa += fabs((double)a->q[d] * kd[d]);
                }
                sc[p - a->first] = s * kq;
                mx = sc[p - a->first] > mx ? sc[p - a->first] : mx;
                E = kq * hd * ldexp(sa, -24) > E ? kq * hd * ldexp(sa, -24) : E;
                for (uint32_t d = 0; d < hd; d++) {
                    const double v = fabs(vrows[(size_t)(p - a->first) * hd + d]);
                    vmax = v > vmax ? v : vmax;
                }
            }
            const double bound = 2 * vmax * (expm1(2 * E) + (2.0 * n + 8) * ldexp(1, -24));
            double l = 0;
            for (uint32_t p = 0; p < n; p++)
                l += exp(sc[p] - mx);
            for (uint32_t d = 0; d < hd; d++) {
                double o = 0;
                for (uint32_t p = 0; p < n; p++)
                    o += exp(sc[p] - mx) * vrows[(size_t)p * hd + d];
                o /= l;
                const double dd = fabs(got[i * hd + d] - o);
                far += !(dd <= bound);
                worst = dd / bound > worst ? dd / bound : worst;
            }
            free(sc);
            free(vrows);
        }
        if (bad || far || alone)
            printf("  f32 tiled: head dim %u, page %u, group %u, tokens %u, depth %u, window %u, "
                   "kv %s/%s: tier != ref %d, %d values past the bound, %d queries differ "
                   "alone\n", hd, pt, group, n_tok, depth, window, rb_type_name(tk),
                   rb_type_name(tv), bad, far, alone);
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(far, 0);
        CHECK_EQ_INT(alone, 0);
        rb_kvcache_deinit(&kv);
    }
    printf("  f32 tiled: worst |d| / bound %.3f\n", worst);
    free(work);
}

/* The tiled form's vector kernels of a tier and the head dims they take
 * (a multiple of the returned step; 0: the tier has none, as the
 * dispatcher in attention.c picks them) */
static int tier_tiled_kernels(int tier, rb_attn_widen_fn *widen, rb_attn_tblock_fn *block)
{
#if defined(__x86_64__)
    if (tier == RB_CPU_TIER_AVX512) {
        *widen = rb_attn_widen_avx512;
        *block = rb_attn_tblock_avx512;
        return 16;
    }
    if (tier == RB_CPU_TIER_AVX2 || tier == RB_CPU_TIER_VNNI) {
        *widen = rb_attn_widen_avx2;
        *block = rb_attn_tblock_avx2;
        return 8;
    }
#elif defined(__aarch64__)
    if (tier >= RB_CPU_TIER_NEON && tier <= RB_CPU_TIER_I8MM) {
        *widen = rb_attn_widen_neon;
        *block = rb_attn_tblock_neon;
        return 4;
    }
#endif
    (void)tier;
    *widen = NULL;
    *block = NULL;
    return 0;
}

/* A random f16 that is not a signalling NaN (converting one quiets it in
 * hardware, not in rb_fp16_to_fp32_soft): every finite value, subnormals,
 * +-0, +-inf and quiet NaNs */
static rb_f16 f16_any(rb_test_rng *rng)
{
    rb_f16 h = (rb_f16)(rb_test_rng_uniform(rng) * 65536.0);
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
        h |= 0x200;
    return h;
}

/*
 * The tier's widen kernel against rb_attn_widen_ref, bit for bit: f16
 * rows of any bits (but signalling NaNs), q8_0 rows with every byte
 * (-128 too) and scales of any finite f16 (subnormal, negative, zero),
 * q4_0 rows likewise; 1..64 rows at scattered addresses, head dims of the
 * tier's step (32s for the quantized types); nothing written past np rows.
 */
static void check_widen(rb_test_rng *rng, rb_attn_widen_fn widen, int step)
{
    enum { TKV = RB_ATTN_TILE_KV, MAXD = 256 };
    static const int dims[] = {4, 8, 12, 16, 20, 32, 64, 96, 128, 256, 36, 80};
    static const int nps[] = {64, 1, 3, 4, 5, 17, 63, 40, 2, 7};
    static const uint32_t types[] = {RB_TYPE_F16, RB_TYPE_Q8_0, RB_TYPE_Q4_0};
    static uint8_t pool[TKV * MAXD * 2 + 64];
    static float want[TKV * MAXD + 8], got[TKV * MAXD + 8];
    const void *rows[TKV];
    int cases = 0, bad = 0;
    for (size_t t = 0; t < 3; t++)
        for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
            const int hd = dims[di], np = nps[(di + t) % 10];
            if (hd % step || (types[t] != RB_TYPE_F16 && hd % 32))
                continue;
            const size_t rb = types[t] == RB_TYPE_F16    ? (size_t)hd * 2
                              : types[t] == RB_TYPE_Q8_0 ? (size_t)hd / 32 * sizeof(rb_block_q8_0)
                                                         : (size_t)hd / 32 * sizeof(rb_block_q4_0);
            for (size_t i = 0; i < TKV * rb; i++)
                pool[i] = (uint8_t)(rb_test_rng_uniform(rng) * 256.0);
            for (int p = 0; p < np; p++) {
                uint8_t *r = pool + (size_t)((p * 37) % TKV) * rb; /* not in order */
                if (types[t] == RB_TYPE_F16) {
                    rb_f16 *h = (rb_f16 *)r;
                    for (int d = 0; d < hd; d++)
                        h[d] = f16_any(rng);
                } else if (types[t] == RB_TYPE_Q8_0) {
                    rb_block_q8_0 *x = (rb_block_q8_0 *)r;
                    for (int b = 0; b < hd / 32; b++)
                        x[b].d = (rb_f16)(f16_any(rng) & 0xfbff); /* finite */
                } else {
                    rb_block_q4_0 *x = (rb_block_q4_0 *)r;
                    for (int b = 0; b < hd / 32; b++)
                        x[b].d = (rb_f16)(f16_any(rng) & 0xfbff);
                }
                rows[p] = r;
            }
            for (int i = 0; i < TKV * MAXD + 8; i++)
                want[i] = got[i] = 12345.0f;
            rb_attn_widen_ref(types[t], rows, np, hd, want);
            widen(types[t], rows, np, hd, got);
            const int differ = memcmp(want, got, sizeof want) != 0;
            if (differ)
                printf("  widen: %s, head dim %d, %d rows: tier != ref\n", rb_type_name(types[t]),
                       hd, np);
            cases++;
            bad += differ;
        }
    printf("  widen: %d cases, %d differ from the ref\n", cases, bad);
    CHECK_EQ_INT(bad, 0);
}

/*
 * The tier's block kernel against rb_attn_tblock_ref, bit for bit, on
 * acc, m and l of the first nq queries after three consecutive blocks on
 * the same state: head dims of the tier's step; 1..64 positions (the
 * 4-position steps and their tails, np < 64 as at a tile's ends) and
 * 1..64 queries (16 and under: the decode's 16-lane tile, acc rows 16 and
 * up must stay untouched); spans that cover the block, start or end in it,
 * miss it before or after, lie inside it, and are empty; a state of -inf
 * (a tile's start: l = acc = +0) or above the scores, acc holding -0s (a
 * position outside a span must add no fma: fma(0, v, -0) is +0). Edge
 * blocks: kq_scale 1e30 (scores of +-inf: exp(inf - inf) and
 * exp(-inf - -inf) are 0), a NaN and +-inf in K (a NaN score never
 * becomes the max: compare and select, not FMAX) and a score of +0
 * against a state of -0. A head dim off the tier's step returns 0 and
 * leaves everything as it was.
 */
static void check_tblock(rb_test_rng *rng, rb_attn_tblock_fn block, int step)
{
    enum { TQ = RB_ATTN_TILE_Q, TKV = RB_ATTN_TILE_KV, MAXD = 256 };
    static const int dims[] = {4, 8, 12, 20, 64, 128, 256, 16, 36, 80, 96, 32};
    static const int nps[] = {64, 1, 3, 4, 5, 17, 63, 64, 2, 40, 64, 7};
    static const int nqs[] = {64, 1, 5, 16, 33, 64, 4, 63, 17, 64, 2, 48};
    static float qt[MAXD * TQ], kf[TKV * MAXD], vf[TKV * MAXD], st[TQ * TKV], kt[MAXD * TKV];
    static float acc[2][TQ * MAXD], m[2][TQ], l[2][TQ];
    int32_t first[TQ], last[TQ];
    int cases = 0, bad_cases = 0;
    for (int c = 0; c < 3 * 12; c++) {
        const int hd = dims[c % 12], np = nps[(c + c / 12) % 12], nq = nqs[(c * 5 + c / 12) % 12];
        const int edge = c / 12; /* 0: plain, 1: +-inf scores, 2: NaN, inf and zeros in K */
        if (hd % step)
            continue;
        const float kq = edge == 1 ? 1e30f : 1.0f / sqrtf((float)hd);
        const int rows = nq <= 16 ? 16 : TQ; /* the acc rows the caller has */
        for (int d = 0; d < hd; d++)
            for (int q = 0; q < TQ; q++)
                qt[d * TQ + q] = q < nq ? frand(rng) * 0.6f : q < 16 || nq > 16 ? 0.0f : NAN;
        for (int q = 0; q < TQ; q++) {
            const int start = q % 3 == 0; /* a tile's first block: -inf, +0, +0 */
            float m0 = start ? -INFINITY : q % 3 == 1 ? 30.0f : frand(rng);
            if (edge == 2 && q % 8 == 3)
                m0 = -0.0f; /* a +0 score must leave it -0 (FMAX gives +0) */
            m[0][q] = m[1][q] = m0;
            l[0][q] = l[1][q] = start ? 0.0f : 1.0f + (float)rb_test_rng_uniform(rng) * 10.0f;
            for (int d = 0; d < hd; d++)
                acc[0][q * hd + d] = acc[1][q * hd + d] =
                    start ? 0.0f : d % 7 == 3 ? -0.0f : frand(rng);
        }
        for (int i = rows * hd; i < TQ * hd; i++)
            acc[0][i] = acc[1][i] = 777.0f; /* not the caller's: must stay */
        int good = 1;
        for (int blk = 0; blk < 3; blk++) {
            const int32_t p0 = 128 + blk * TKV;
            for (int p = 0; p < np; p++)
                for (int d = 0; d < hd; d++) {
                    kf[p * hd + d] = rb_fp16_to_fp32(rb_fp32_to_fp16(frand(rng) * (1.0f + (float)(p % 3))));
                    vf[p * hd + d] = rb_fp16_to_fp32(rb_fp32_to_fp16(frand(rng)));
                }
            if (edge == 2 && np >= 3) {
                kf[1 * hd + 0] = NAN;
                kf[2 * hd + hd - 1] = blk % 2 ? INFINITY : -INFINITY;
                memset(kf, 0, (size_t)hd * sizeof *kf); /* a score of +0 */
            }
            for (int q = 0; q < TQ; q++) {
                const int kind = (q + blk + c) % 7;
                int32_t f = p0, e = p0 + np - 1; /* 0: the whole block */
                if (q >= nq || kind == 1)        /* empty */
                    f = 1, e = 0;
                else if (kind == 2)              /* starts in it */
                    f = p0 + (int32_t)(rb_test_rng_uniform(rng) * np);
                else if (kind == 3)              /* ends in it */
                    e = p0 + (int32_t)(rb_test_rng_uniform(rng) * np);
                else if (kind == 4)              /* misses it: ends before */
                    f = 0, e = p0 - 1;
                else if (kind == 5) {            /* a window inside it */
                    f = p0 + (int32_t)(rb_test_rng_uniform(rng) * np);
                    e = f + (int32_t)(rb_test_rng_uniform(rng) * 5);
                } else if (kind == 6)            /* misses it: starts after */
                    f = p0 + np, e = p0 + np + 100;
                if (edge == 2 && q % 8 == 3 && q < nq)
                    f = e = p0; /* its state -0, its one score +0 (row 0) */
                first[q] = f;
                last[q] = e;
            }
            CHECK(rb_attn_tblock_ref(kf, vf, np, hd, nq, qt, first, last, p0, kq, st, kt, acc[0],
                                     m[0], l[0]) == 1);
            CHECK(block(kf, vf, np, hd, nq, qt, first, last, p0, kq, st, kt, acc[1], m[1], l[1]) ==
                  1);
            good &= memcmp(acc[0], acc[1], (size_t)nq * hd * sizeof(float)) == 0 &&
                    memcmp(m[0], m[1], (size_t)nq * sizeof(float)) == 0 &&
                    memcmp(l[0], l[1], (size_t)nq * sizeof(float)) == 0;
            for (int i = rows * hd; i < TQ * hd; i++)
                good &= acc[1][i] == 777.0f;
        }
        if (!good)
            printf("  tblock: head dim %d, %d positions, %d queries, edge %d: tier != ref\n", hd,
                   np, nq, edge);
        cases++;
        bad_cases += !good;
    }
    printf("  tblock: %d cases, %d differ from the ref\n", cases, bad_cases);
    CHECK_EQ_INT(bad_cases, 0);
    /* a head dim off the step: 0, nothing written */
    {
        const int hd = step + 2;
        for (int i = 0; i < TQ * hd; i++)
            acc[1][i] = 5.0f;
        for (int q = 0; q < TQ; q++) {
            m[1][q] = 1.0f;
            l[1][q] = 2.0f;
            first[q] = 0;
            last[q] = 1000;
        }
        CHECK(block(kf, vf, 8, hd, 8, qt, first, last, 0, 1.0f, st, kt, acc[1], m[1], l[1]) == 0);
        int same = 1;
        for (int i = 0; i < TQ * hd; i++)
            same &= acc[1][i] == 5.0f;
        for (int q = 0; q < TQ; q++)
            same &= m[1][q] == 1.0f && l[1][q] == 2.0f;
        CHECK(same);
    }
}

#if defined(__aarch64__)
/* rb_attn_exp_f32_neon == rb_attn_exp bit for bit on ~3M values: every
 * 2^-13 from -104 to 104 (1.7M), 4096 floats on each side of (and at)
 * RB_EXP_LO, 88, 0, +-1, ln 2 * (-126, -125, 127) and the ties of n's
 * rounding (+-ln 2 / 2), 1.2M random bit patterns (NaNs, infs,
 * subnormals, huge) and the named special values; a length that is not a
 * multiple of 4 runs the tail path. */
static void check_exp_neon(rb_test_rng *rng)
{
    enum { N = 3000000 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    int n = 0;
    for (int i = -(104 << 13); i < (104 << 13); i++)
        x[n++] = (float)i * 0x1p-13f;
    static const float at[] = {RB_EXP_LO, 88.0f, 0.0f, -87.3365447f, 88.0296919f, 0.34657359f,
                               -0.34657359f, -86.6433976f, 1.0f, -1.0f};
    for (size_t a = 0; a < sizeof at / sizeof at[0]; a++) {
        float lo = at[a], hi = at[a];
        x[n++] = at[a];
        for (int k = 0; k < 4096; k++) {
            lo = nextafterf(lo, -INFINITY);
            hi = nextafterf(hi, INFINITY);
            x[n++] = lo;
            x[n++] = hi;
        }
    }
    for (int i = 0; i < 1200000; i++)
        x[n++] = f32_from((uint32_t)(rb_test_rng_uniform(rng) * 4294967296.0));
    static const float special[] = {INFINITY, -INFINITY, NAN, -NAN, FLT_MAX, -FLT_MAX, FLT_MIN,
                                    -FLT_MIN, 0.0f, -0.0f, 88.0f, 89.0f, -88.0f, -87.0f};
    for (size_t a = 0; a < sizeof special / sizeof special[0]; a++)
        x[n++] = special[a];
    if (n % 4 == 0)
        x[n++] = -1.5f;
    CHECK(n <= N);
    rb_attn_exp_f32_neon(x, y, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        const float want = rb_attn_exp(x[i]);
        if (memcmp(&want, &y[i], sizeof want) != 0 && bad++ < 5)
            printf("  exp4(%a) = %a, rb_attn_exp %a\n", (double)x[i], (double)y[i], (double)want);
    }
    printf("  rb_attn_exp_f32_neon: %d values, %d differ from rb_attn_exp\n", n, bad);
    CHECK_EQ_INT(bad, 0);
    free(x);
    free(y);
}
#endif

static void check_tier(rb_test_rng *rng)
{
    rb_test_rng seed = *rng;
    int dims[] = {8, 32, 64, 128, 6, 34, 80, 96};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
        int n = dims[d];
        int64_t stride = n + (d % 2 ? 2 : 0); /* rows packed or with a gap */
        rb_f16 q[256], k[8 * 260], acc[256], ref[256], v[256];
        for (int i = 0; i < n; i++)
            q[i] = rb_fp32_to_fp16(frand(&seed));
        for (int i = 0; i < 8 * 260; i++)
            k[i] = rb_fp32_to_fp16(frand(&seed));
        float out[8];
        rb_attn_dot8_f16(q, k, stride, n, out);
        for (int l = 0; l < 8; l++) {
            float want = ggml_order_dot(k + l * stride, q, n);
            CHECK(out[l] == want);
            CHECK(rb_attn_dot_f16(q, k + l * stride, n) == want);
        }
        for (int i = 0; i < n; i++) {
            acc[i] = ref[i] = rb_fp32_to_fp16(frand(&seed));
            v[i] = rb_fp32_to_fp16(frand(&seed));
        }
        for (int step = 0; step < 50; step++) {
            float s = frand(&seed) * 0.25f;
            rb_attn_mad_f16(acc, v, s, n);
            for (int i = 0; i < n; i++)
                ref[i] = rb_fp32_to_fp16(fmaf(rb_fp16_to_fp32(v[i]), s, rb_fp16_to_fp32(ref[i])));
            rb_attn_scale_f16(acc, 0.999f, n);
            for (int i = 0; i < n; i++)
                ref[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(ref[i]) * 0.999f);
        }
        CHECK(memcmp(acc, ref, (size_t)n * sizeof *acc) == 0);
    }
    /* a block of 8 positions == the same steps one call at a time (the
       avx512 tier's block runs its own kernel for dims 64, 128, 256) */
    {
        static const int bdims[] = {8, 32, 64, 96, 128, 256};
        for (size_t d = 0; d < sizeof bdims / sizeof bdims[0]; d++) {
            const int n = bdims[d];
            const int64_t stride = n + 8;
            static rb_f16 q[256], k[8 * 264], v[8 * 264], acc[256], ref[256];
            for (int i = 0; i < n; i++)
                q[i] = rb_fp32_to_fp16(frand(&seed) * 0.02f); /* scores of order 1 */
            for (int i = 0; i < 8 * 264; i++) {
                k[i] = rb_fp32_to_fp16(frand(&seed));
                v[i] = rb_fp32_to_fp16(frand(&seed));
            }
            for (int i = 0; i < n; i++)
                acc[i] = ref[i] = 0;
            float m = -INFINITY, sum = 0.0f, rm = -INFINITY, rsum = 0.0f;
            const float kq = 0.125f;
            for (int blk = 0; blk < 4; blk++) {
                rb_attn_block8_f16(q, k, v, stride, n, kq, acc, &m, &sum);
                for (int l = 0; l < 8; l++) {
                    const float s = rb_attn_dot_f16(q, k + l * stride, n) * kq;
                    float ms = 1.0f, vs = 1.0f;
                    if (s > rm) {
                        const float old = rm;
                        rm = s;
                        ms = expf(old - rm);
                        rb_attn_scale_f16(ref, ms, n);
                    } else {
                        vs = expf(s - rm);
                    }
                    rb_attn_mad_f16(ref, v + l * stride, vs, n);
                    rsum = fmaf(rsum, ms, vs);
                }
                /* the next block's K rows: some scores above the max */
                for (int i = 0; i < 8 * 264; i++)
                    k[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(k[i]) * (blk % 2 ? 0.5f : 1.7f));
            }
            CHECK(memcmp(acc, ref, (size_t)n * sizeof *acc) == 0);
            CHECK(memcmp(&m, &rm, sizeof m) == 0);
            CHECK(memcmp(&sum, &rsum, sizeof sum) == 0);
        }
    }
    /* quantized K: dispatched == _ref, and near the float dot */
    for (int n = 32; n <= 256; n *= 2) {
        float x[256], y[256];
        for (int i = 0; i < n; i++)
            x[i] = frand(&seed), y[i] = frand(&seed);
        rb_block_q8_0 kq8[8], qq[8];
        rb_block_q4_0 kq4[8];
        rb_type_get_traits(RB_TYPE_Q8_0)->quantize_row(x, kq8, n);
        rb_type_get_traits(RB_TYPE_Q4_0)->quantize_row(x, kq4, n);
        rb_type_get_traits(RB_TYPE_Q8_0)->quantize_row(y, qq, n);
        float a = rb_attn_dot_q8_0(kq8, qq, n), b = rb_attn_dot_q8_0_ref(kq8, qq, n);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        a = rb_attn_dot_q4_0(kq4, qq, n), b = rb_attn_dot_q4_0_ref(kq4, qq, n);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        double exact = 0;
        for (int i = 0; i < n; i++)
            exact += (double)x[i] * y[i];
        CHECK(fabs(rb_attn_dot_q8_0(kq8, qq, n) - exact) < 0.02 * n);
    }
    /* q8_0 values of -128 (a K page may hold them) and full-range bytes */
    {
        rb_block_q8_0 kq8[4], qq[4];
        for (int b = 0; b < 4; b++) {
            kq8[b].d = rb_fp32_to_fp16(0.01f * (float)(b + 1));
            qq[b].d = rb_fp32_to_fp16(0.02f);
            for (int i = 0; i < 32; i++) {
                kq8[b].qs[i] = (int8_t)(i % 5 == 0 ? -128 : (int)(rb_test_rng_uniform(&seed) * 255) - 127);
                qq[b].qs[i] = (int8_t)(i % 7 == 0 ? -127 : (int)(rb_test_rng_uniform(&seed) * 255) - 127);
            }
        }
        float a = rb_attn_dot_q8_0(kq8, qq, 128), b = rb_attn_dot_q8_0_ref(kq8, qq, 128);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
    }
    /* a quantized V's f32 accumulator: one fmaf / one product per element */
    {
        static const int fdims[] = {5, 32, 64, 100, 128, 256};
        for (size_t d = 0; d < sizeof fdims / sizeof fdims[0]; d++) {
            const int n = fdims[d];
            float acc[256], ref[256], v[256];
            for (int i = 0; i < n; i++)
                acc[i] = ref[i] = frand(&seed), v[i] = frand(&seed);
            for (int step = 0; step < 20; step++) {
                const float s = frand(&seed) * 0.3f;
                rb_attn_mad_f32(acc, v, s, n);
                rb_attn_scale_f32(acc, 0.97f, n);
                for (int i = 0; i < n; i++)
                    ref[i] = fmaf(v[i], s, ref[i]) * 0.97f;
            }
            CHECK(memcmp(acc, ref, (size_t)n * sizeof *acc) == 0);
        }
    }
    check_swiglu(&seed);
    check_tiled(&seed, 72);
    check_exp();
    check_f32_tiled(&seed, 96);
    {
        rb_attn_widen_fn widen;
        rb_attn_tblock_fn block;
        const int step = tier_tiled_kernels(rb_cpu_tier(), &widen, &block);
        if (step) {
            check_widen(&seed, widen, step);
            check_tblock(&seed, block, step);
        }
    }
    *rng = seed;
}

int main(void)
{
    rb_test_rng seed = rb_test_rng_seed(42);
    const int tier0 = rb_cpu_tier();
    int ran = 0;
    for (int tier = 0; tier < RB_CPU_TIER_COUNT; tier++) {
        if (!rb_cpu_tier_available(tier))
            continue;
        rb_cpu_set_tier(tier);
        const int before = check_failures;
        check_tier(&seed);
        printf("tier %s: %s\n", rb_cpu_tier_name(tier), check_failures == before ? "ok" : "FAILED");
        ran++;
    }
    rb_cpu_set_tier(tier0);
    CHECK(ran >= 1);
#if defined(__aarch64__)
    check_exp_neon(&seed);
#endif
    return check_report();
}
