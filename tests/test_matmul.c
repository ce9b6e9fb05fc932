/*
 * test_matmul.c - the matmul kernels and driver.
 *
 *   1. activation converters: every ISA variant gives the same bytes as its
 *      _ref (ties, zero blocks, equal +-max magnitudes included);
 *   2. tiles: every ISA variant against the _ref vec_dot, every tile shape,
 *      several n_cols; and every shape bit-identical to the 1 x 1 tile;
 *      AVX2 Q4_0 / Q4_1 / Q5_1 / Q4_K / Q5_K / Q6_K bit-identical to _ref (both in llama.cpp's
 *      AVX2 order, see matmul_ref.c);
 *   3. rb_matmul against a naive double-precision product of dequantized
 *      weights and dequantized (already rounded) activations; 1, 2 and 3
 *      threads and decode-vs-prefill bit-identical;
 *   4. rb_matmul_supports for types without kernels.
 * Fixed seeds; random weight BYTES (with sane scales) as well as quantized
 * random floats, so every code value (Q8_0 -128, Q6_K scale -128, 6-bit
 * maxima) is exercised.
 */
#include <stdlib.h>

#include "check.h"
#include "matmul.h"
#include "cpu.h"
#include "matmul_kernels.h"
#include "quant.h"
#include "threadpool.h"

/* Named tolerances, relative to sum_i |w_i * a_i| (the condition of the dot
 * product): float accumulation in a different order costs a few ulps per
 * block, far below these. */
#define TOL_ISA_VS_REF 2e-6   /* same integers, different float order */
#define TOL_VS_NAIVE 2e-6     /* kernel vs double product of dequantized values */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_u32(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return (uint32_t)(x >> 16);
}

static float rng_uniform(void) /* [-1, 1) */
{
    return (float)((double)rng_u32() / 2147483648.0 - 1.0);
}

static float rng_normalish(void)
{
    return (rng_uniform() + rng_uniform() + rng_uniform()) * 0.8f;
}

static const uint32_t w_types[] = {RB_TYPE_F32, RB_TYPE_F16, RB_TYPE_BF16, RB_TYPE_Q4_0,
                                   RB_TYPE_Q5_0, RB_TYPE_Q8_0, RB_TYPE_Q4_K, RB_TYPE_Q6_K,
                                   RB_TYPE_Q5_K, RB_TYPE_Q4_1, RB_TYPE_Q5_1};
#define N_W_TYPES (sizeof w_types / sizeof w_types[0])

/* every vector tier this build has and this CPU runs (cpu.h), NULL-ended */
static const rb_matmul_isa *isas[RB_CPU_TIER_COUNT + 1];

static void find_isas(void)
{
    int k = 0;
    for (int t = RB_CPU_TIER_REF + 1; t < RB_CPU_TIER_COUNT; t++)
        if (rb_cpu_tier_available(t) && rb_matmul_isa_for_tier(t))
            isas[k++] = rb_matmul_isa_for_tier(t);
    isas[k] = NULL;
}

/* the tiers whose kernels sum in llama.cpp's AVX2 order: matmul_avx2.c's
 * two builds, and matmul_avx512.c's (two blocks per zmm, the same floats) */
static int is_avx2_order(const rb_matmul_isa *isa)
{
    return strcmp(isa->name, "avx2") == 0 || strcmp(isa->name, "vnni") == 0 ||
           strcmp(isa->name, "avx512") == 0;
}

static size_t row_bytes(uint32_t type, int64_t n)
{
    return (size_t)rb_type_row_bytes(type, (uint64_t)n);
}

/* Random rows of a weight type: half of them quantized from random floats,
 * half random bytes with the f16 scales overwritten by sane values. */
static void make_weights(uint32_t type, int64_t n_rows, int64_t n_cols, uint8_t *dst)
{
    const rb_type_traits *tr = rb_type_get_traits(type);
    const size_t rb = row_bytes(type, n_cols);
    float *row = malloc((size_t)n_cols * sizeof *row);
    for (int64_t r = 0; r < n_rows; r++) {
        uint8_t *d = dst + r * rb;
        if (!tr->is_quantized || r % 2 == 0) {
            for (int64_t i = 0; i < n_cols; i++)
                row[i] = rng_normalish() * 0.1f;
            tr->quantize_row(row, d, n_cols);
            continue;
        }
        for (size_t i = 0; i < rb; i++)
            d[i] = (uint8_t)rng_u32();
        const int64_t nb = n_cols / tr->block_elems;
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *blk = d + b * tr->block_bytes;
            rb_f16 s1 = rb_fp32_to_fp16(0.001f + 0.01f * (rng_uniform() + 1.0f));
            rb_f16 s2 = rb_fp32_to_fp16(0.001f + 0.01f * (rng_uniform() + 1.0f));
            switch (type) {
            case RB_TYPE_Q4_0:
            case RB_TYPE_Q5_0:
            case RB_TYPE_Q8_0: memcpy(blk, &s1, 2); break;
            case RB_TYPE_Q4_K:
            case RB_TYPE_Q5_K: memcpy(blk, &s1, 2); memcpy(blk + 2, &s2, 2); break;
            case RB_TYPE_Q4_1: /* m of either sign */
            case RB_TYPE_Q5_1:
                s2 = rb_fp32_to_fp16(0.1f * rng_uniform());
                memcpy(blk, &s1, 2); memcpy(blk + 2, &s2, 2); break;
            case RB_TYPE_Q6_K: memcpy(blk + 208, &s1, 2); break;
            default: break;
            }
        }
    }
    free(row);
}

/* Activation rows as floats, with special blocks mixed in. */
static void make_act_floats(int64_t n, float *x, int variant)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_normalish();
    if (variant == 1 && n >= 256) {
        for (int i = 0; i < 32; i++) /* a zero Q8_0 block */
            x[i] = 0.0f;
        for (int i = 32; i < 64; i++) /* amax 127: id = 1, exact .5 ties */
            x[i] = (float)(i % 7) - 3.5f;
        x[33] = 127.0f;
        for (int i = 0; i < 256; i++) /* Q8_K block with -max first, then +max */
            x[256 * (n / 256 - 1) + i] = (float)((i * 13) % 200 - 100) * 0.5f;
        x[256 * (n / 256 - 1) + 5] = -127.0f;
        x[256 * (n / 256 - 1) + 9] = 127.0f;
    }
    if (variant == 2)
        for (int64_t i = 0; i < n; i++) /* a zero Q8_K block when n == 256 */
            x[i] = (n == 256) ? 0.0f : x[i] * 1e-3f;
}

static void dequant_act(uint32_t act_type, const void *src, float *dst, int64_t n)
{
    if (act_type == RB_TYPE_Q8_1) {
        const rb_block_q8_1 *b = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = rb_fp16_to_fp32(b[i / 32].d) * (float)b[i / 32].qs[i % 32];
        return;
    }
    if (act_type == RB_TYPE_Q8_K) {
        const rb_block_q8_K *b = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = b[i / 256].d * (float)b[i / 256].qs[i % 256];
        return;
    }
    rb_type_get_traits(act_type)->dequantize_row(src, dst, n);
}

static double dot_abs(const float *w, const float *a, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += fabs((double)w[i] * (double)a[i]);
    return s;
}

/* Q4_1 / Q5_1 . Q8_1 use the activation's s = fp16(d * sum(q)) for the m term
 * (llama.cpp's arithmetic), not the exact sum of the dequantized a: the
 * naive product gets sum_b m_b * (s_b - d_b * sum q_b) added, and
 * sum_b |m_b * s_b| added to the tolerance's scale. 0 for other types. */
static double q4_1_s_fix(uint32_t wt, const void *w, const void *a, int64_t n, double *abs_extra)
{
    *abs_extra = 0.0;
    if (wt != RB_TYPE_Q4_1 && wt != RB_TYPE_Q5_1)
        return 0.0;
    const size_t wbb = wt == RB_TYPE_Q4_1 ? sizeof(rb_block_q4_1) : sizeof(rb_block_q5_1);
    const rb_block_q8_1 *y = a;
    double fix = 0.0;
    for (int64_t b = 0; b < n / 32; b++) {
        rb_f16 mh; /* m follows d in both layouts */
        memcpy(&mh, (const char *)w + b * wbb + 2, sizeof mh);
        int sum = 0;
        for (int j = 0; j < 32; j++)
            sum += y[b].qs[j];
        const double m = rb_fp16_to_fp32(mh), sb = rb_fp16_to_fp32(y[b].s);
        fix += m * (sb - (double)rb_fp16_to_fp32(y[b].d) * sum);
        *abs_extra += fabs(m * sb);
    }
    return fix;
}

/* ---- 1. activation converters --------------------------------------------- */

static void test_act_converters(void)
{
    static const uint32_t act_types[] = {RB_TYPE_F32, RB_TYPE_F16, RB_TYPE_BF16, RB_TYPE_Q8_0,
                                         RB_TYPE_Q8_K, RB_TYPE_Q8_1};
    static const int64_t sizes[] = {256, 512, 2048, 5632};
    for (int k = 0; isas[k]; k++) {
        for (size_t a = 0; a < sizeof act_types / sizeof act_types[0]; a++) {
            const uint32_t at = act_types[a];
            for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
                for (int variant = 0; variant < 3; variant++) {
                    const int64_t n = variant == 2 && s == 0 ? 256 : sizes[s];
                    float *x = malloc((size_t)n * sizeof *x);
                    make_act_floats(n, x, variant);
                    const size_t nb = row_bytes(at, n);
                    uint8_t *want = calloc(1, nb), *got = calloc(1, nb);
                    rb_matmul_isa_ref.act[at](x, want, n);
                    isas[k]->act[at](x, got, n);
                    int same = memcmp(want, got, nb) == 0;
                    if (!same)
                        fprintf(stderr, "act %s isa %s n %lld variant %d differs\n",
                                rb_type_name(at), isas[k]->name, (long long)n, variant);
                    CHECK(same);
                    free(x);
                    free(want);
                    free(got);
                }
            }
        }
        /* odd lengths for the plain types (tails) */
        for (int64_t n = 1; n < 40; n += 3) {
            float x[40];
            make_act_floats(n, x, 0);
            uint16_t want[40], got[40];
            rb_matmul_isa_ref.act[RB_TYPE_F16](x, want, n);
            isas[k]->act[RB_TYPE_F16](x, got, n);
            CHECK(memcmp(want, got, (size_t)n * 2) == 0);
            rb_matmul_isa_ref.act[RB_TYPE_BF16](x, want, n);
            isas[k]->act[RB_TYPE_BF16](x, got, n);
            CHECK(memcmp(want, got, (size_t)n * 2) == 0);
        }
    }
    /* Q8_K reference: a block whose largest magnitude is negative and first */
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = (float)(i % 10) * 0.1f;
    x[3] = -2.0f;
    x[7] = 2.0f;
    rb_block_q8_K q;
    rb_quantize_act_q8_K_ref(x, &q, 256);
    CHECK_EQ_INT(q.qs[3], -127); /* iscale = -127 / -2: the first max maps to -127 */
    CHECK_EQ_INT(q.qs[7], 127);
    CHECK_NEAR(q.d, 2.0 / 127.0, 1e-9);
    x[3] = 2.0f;
    x[7] = -2.0f;
    rb_quantize_act_q8_K_ref(x, &q, 256);
    CHECK_EQ_INT(q.qs[3], -127);
    CHECK_NEAR(q.d, -2.0 / 127.0, 1e-9);
    int bs = 0;
    for (int i = 0; i < 16; i++)
        bs += q.qs[i];
    CHECK_EQ_INT(q.bsums[0], bs);
    /* Q8_1: Q8_0's codes and d, s = fp16(d * sum of the codes) */
    rb_block_q8_0 q0[8];
    rb_block_q8_1 q1[8];
    rb_quantize_act_q8_0_ref(x, q0, 256);
    rb_quantize_act_q8_1_ref(x, q1, 256);
    for (int b = 0; b < 8; b++) {
        int sum = 0;
        for (int j = 0; j < 32; j++)
            sum += q1[b].qs[j];
        CHECK(memcmp(q0[b].qs, q1[b].qs, 32) == 0);
        CHECK_EQ_INT(q1[b].d, q0[b].d);
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fabsf(x[32 * b + j]) > amax ? fabsf(x[32 * b + j]) : amax;
        CHECK_EQ_INT(q1[b].s, rb_fp32_to_fp16(amax / 127.0f * (float)sum));
    }
}

/* ---- 2. tiles ------------------------------------------------------------------- */

static int same_bits_as_ref(uint32_t wt)
{
    return wt == RB_TYPE_Q4_0 || wt == RB_TYPE_Q4_K || wt == RB_TYPE_Q6_K || wt == RB_TYPE_Q5_K ||
           wt == RB_TYPE_Q4_1 || wt == RB_TYPE_Q5_1;
}

static void test_tiles(void)
{
    static const int64_t sizes_k[] = {256, 512, 2048};
    static const int64_t sizes_32[] = {32, 96, 640};
    static const int64_t sizes_fp[] = {7, 64, 172, 1000};
    for (size_t ti = 0; ti < N_W_TYPES; ti++) {
        const uint32_t wt = w_types[ti];
        const rb_type_traits *tr = rb_type_get_traits(wt);
        const uint32_t at = rb_matmul_act_type(wt);
        const int64_t *sizes = tr->block_elems == 256 ? sizes_k : tr->block_elems == 32 ? sizes_32 : sizes_fp;
        const int n_sizes = tr->block_elems == 1 ? 4 : 3;
        for (int si = 0; si < n_sizes; si++) {
            const int64_t n = sizes[si];
            const size_t wrb = row_bytes(wt, n), arb = row_bytes(at, n);
            uint8_t *w = malloc(wrb * RB_TILE_MAX), *a = malloc(arb * RB_TILE_MAX);
            float *wf = malloc((size_t)n * RB_TILE_MAX * sizeof *wf);
            float *af = malloc((size_t)n * RB_TILE_MAX * sizeof *af);
            float *x = malloc((size_t)n * sizeof *x);
            make_weights(wt, RB_TILE_MAX, n, w);
            for (int t = 0; t < RB_TILE_MAX; t++) {
                make_act_floats(n, x, t == 1);
                rb_matmul_isa_ref.act[at](x, a + t * arb, n);
                dequant_act(at, a + t * arb, af + t * n, n);
            }
            for (int r = 0; r < RB_TILE_MAX; r++)
                tr->dequantize_row(w + r * wrb, wf + r * n, n);
            float ref[RB_TILE_MAX][RB_TILE_MAX];
            for (int r = 0; r < RB_TILE_MAX; r++)
                for (int t = 0; t < RB_TILE_MAX; t++) {
                    float y;
                    rb_matmul_isa_ref.tile[wt](n, w + r * wrb, wrb, 1, a + t * arb, arb, 1, &y, 1);
                    ref[r][t] = y;
                    /* the ref kernel itself against the naive double product */
                    double extra;
                    double naive = q4_1_s_fix(wt, w + r * wrb, a + t * arb, n, &extra);
                    for (int64_t i = 0; i < n; i++)
                        naive += (double)wf[r * n + i] * (double)af[t * n + i];
                    double tol = TOL_VS_NAIVE * (dot_abs(wf + r * n, af + t * n, n) + extra) + 1e-30;
                    if (!(fabs(naive - y) <= tol))
                        fprintf(stderr, "ref %s n %lld r %d t %d\n", tr->name, (long long)n, r, t);
                    CHECK_NEAR(y, naive, tol);
                }
            for (int k = 0; isas[k]; k++) {
                float one[RB_TILE_MAX][RB_TILE_MAX];
                for (int r = 0; r < RB_TILE_MAX; r++)
                    for (int t = 0; t < RB_TILE_MAX; t++) {
                        isas[k]->tile[wt](n, w + r * wrb, wrb, 1, a + t * arb, arb, 1, &one[r][t], 1);
                        double extra;
                        (void)q4_1_s_fix(wt, w + r * wrb, a + t * arb, n, &extra);
                        double tol = TOL_ISA_VS_REF * (dot_abs(wf + r * n, af + t * n, n) + extra) + 1e-30;
                        if (!(fabs(one[r][t] - ref[r][t]) <= tol))
                            fprintf(stderr, "isa %s %s n %lld r %d t %d\n", isas[k]->name,
                                    tr->name, (long long)n, r, t);
                        CHECK_NEAR(one[r][t], ref[r][t], tol);
                    }
                /* the types whose _ref is written in llama.cpp's AVX2 order
                 * (the golden logits' arithmetic) give the same bits */
                if (is_avx2_order(isas[k]) && same_bits_as_ref(wt)) {
                    int diff = 0;
                    for (int r = 0; r < RB_TILE_MAX; r++)
                        for (int t = 0; t < RB_TILE_MAX; t++)
                            diff += memcmp(&one[r][t], &ref[r][t], sizeof(float)) != 0;
                    if (diff)
                        fprintf(stderr, "%s %s n %lld: %d results differ from _ref in bits\n",
                                isas[k]->name, tr->name, (long long)n, diff);
                    CHECK_EQ_INT(diff, 0);
                }
                /* i8mm folds the dotprod kernels' exact integers in their
                 * float steps: the same bits, every type */
                const rb_matmul_isa *dp = rb_matmul_isa_for_tier(RB_CPU_TIER_DOTPROD);
                if (strcmp(isas[k]->name, "i8mm") == 0 && dp) {
                    int diff = 0;
                    for (int r = 0; r < RB_TILE_MAX; r++)
                        for (int t = 0; t < RB_TILE_MAX; t++) {
                            float d1;
                            dp->tile[wt](n, w + r * wrb, wrb, 1, a + t * arb, arb, 1, &d1, 1);
                            diff += memcmp(&one[r][t], &d1, sizeof d1) != 0;
                        }
                    float y4[RB_TILE_MAX * RB_TILE_MAX], d4[RB_TILE_MAX * RB_TILE_MAX];
                    isas[k]->tile[wt](n, w, wrb, RB_TILE_MAX, a, arb, RB_TILE_MAX, y4, RB_TILE_MAX);
                    dp->tile[wt](n, w, wrb, RB_TILE_MAX, a, arb, RB_TILE_MAX, d4, RB_TILE_MAX);
                    diff += memcmp(y4, d4, sizeof y4) != 0;
                    if (diff)
                        fprintf(stderr, "i8mm %s n %lld: %d results differ from dotprod in bits\n",
                                tr->name, (long long)n, diff);
                    CHECK_EQ_INT(diff, 0);
                }
                int mismatches = 0;
                for (int nr = 1; nr <= RB_TILE_MAX; nr++)
                    for (int nt = 1; nt <= RB_TILE_MAX; nt++) {
                        float y[RB_TILE_MAX * 5];
                        for (int i = 0; i < RB_TILE_MAX * 5; i++)
                            y[i] = -1234.5f;
                        isas[k]->tile[wt](n, w, wrb, nr, a, arb, nt, y, 5);
                        for (int t = 0; t < RB_TILE_MAX; t++)
                            for (int r = 0; r < 5; r++) {
                                float want = (r < nr && t < nt) ? one[r][t] : -1234.5f;
                                mismatches += memcmp(&y[t * 5 + r], &want, sizeof want) != 0;
                            }
                    }
                if (mismatches)
                    fprintf(stderr, "isa %s %s n %lld: %d tile-shape mismatches\n",
                            isas[k]->name, tr->name, (long long)n, mismatches);
                CHECK_EQ_INT(mismatches, 0);
            }
            free(w);
            free(a);
            free(wf);
            free(af);
            free(x);
        }
    }
}

/* ---- 3. rb_matmul ------------------------------------------------------------ */

static void test_matmul_driver(rb_threadpool *pools[3])
{
    static const int64_t rows[] = {1, 5, 37, 100};
    static const int64_t toks[] = {1, 2, 3, 4, 5, 7, 8, 20, 64};
    for (size_t ti = 0; ti < N_W_TYPES; ti++) {
        const uint32_t wt = w_types[ti];
        const rb_type_traits *tr = rb_type_get_traits(wt);
        const uint32_t at = rb_matmul_act_type(wt);
        CHECK(rb_matmul_supports(wt));
        const int64_t n_cols = tr->block_elems == 256 ? 512 : tr->block_elems == 32 ? 160 : 172;
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            const int64_t n_rows = rows[ri];
            const size_t wrb = row_bytes(wt, n_cols);
            CHECK_EQ_U64(rb_matmul_act_row_bytes(wt, n_cols), row_bytes(at, n_cols));
            const size_t arb = rb_matmul_act_row_bytes(wt, n_cols) + 16; /* padded stride */
            const int64_t max_tok = 64, ys = n_rows + 3;
            uint8_t *w = malloc(wrb * (size_t)n_rows), *a = malloc(arb * (size_t)max_tok);
            float *wf = malloc(sizeof(float) * (size_t)(n_rows * n_cols));
            float *af = malloc(sizeof(float) * (size_t)(max_tok * n_cols));
            float *x = malloc(sizeof(float) * (size_t)n_cols);
            float *y[3], *y1 = malloc(sizeof(float) * (size_t)(max_tok * ys));
            for (int p = 0; p < 3; p++)
                y[p] = malloc(sizeof(float) * (size_t)(max_tok * ys));
            make_weights(wt, n_rows, n_cols, w);
            for (int64_t r = 0; r < n_rows; r++)
                tr->dequantize_row(w + r * wrb, wf + r * n_cols, n_cols);
            for (int64_t t = 0; t < max_tok; t++) {
                make_act_floats(n_cols, x, 0);
                rb_matmul_quantize_act(wt, x, a + t * arb, n_cols);
                dequant_act(at, a + t * arb, af + t * n_cols, n_cols);
            }
            for (size_t k = 0; k < sizeof toks / sizeof toks[0]; k++) {
                const int64_t n_tok = toks[k];
                for (int p = 0; p < 3; p++) {
                    for (int64_t i = 0; i < max_tok * ys; i++)
                        y[p][i] = -7.0f;
                    rb_matmul(pools[p], wt, w, n_rows, n_cols, a, arb, n_tok, y[p], ys);
                }
                CHECK(memcmp(y[0], y[1], sizeof(float) * (size_t)(n_tok * ys)) == 0);
                CHECK(memcmp(y[0], y[2], sizeof(float) * (size_t)(n_tok * ys)) == 0);
                int bad = 0, pad_bad = 0, decode_diff = 0;
                for (int64_t t = 0; t < n_tok; t++) {
                    /* the same token decoded alone */
                    rb_matmul(pools[1], wt, w, n_rows, n_cols, a + t * arb, arb, 1, y1, ys);
                    decode_diff += memcmp(y1, y[0] + t * ys, sizeof(float) * (size_t)n_rows) != 0;
                    for (int64_t r = 0; r < ys; r++) {
                        float got = y[0][t * ys + r];
                        if (r >= n_rows) {
                            pad_bad += got != -7.0f;
                            continue;
                        }
                        double extra;
                        double naive = q4_1_s_fix(wt, w + r * wrb, a + t * arb, n_cols, &extra);
                        for (int64_t i = 0; i < n_cols; i++)
                            naive += (double)wf[r * n_cols + i] * (double)af[t * n_cols + i];
                        double tol = TOL_VS_NAIVE * (dot_abs(wf + r * n_cols, af + t * n_cols, n_cols) + extra) + 1e-30;
                        if (!(fabs(naive - got) <= tol)) {
                            if (!bad)
                                fprintf(stderr, "matmul %s rows %lld tok %lld: y[%lld][%lld] %g vs %g\n",
                                        tr->name, (long long)n_rows, (long long)n_tok,
                                        (long long)t, (long long)r, got, naive);
                            bad++;
                        }
                    }
                }
                CHECK_EQ_INT(bad, 0);
                CHECK_EQ_INT(pad_bad, 0);
                CHECK_EQ_INT(decode_diff, 0);
            }
            free(w);
            free(a);
            free(wf);
            free(af);
            free(x);
            free(y1);
            for (int p = 0; p < 3; p++)
                free(y[p]);
        }
    }
}

/* Larger shapes, decode and prefill, 2 threads: chunks and tile remainders
 * across many chunks (rows not a multiple of the chunk size). */
static void test_matmul_large_shape(rb_threadpool *pool1, rb_threadpool *pool2, const uint32_t *types,
                                    size_t n_types, int64_t n_rows, int64_t n_cols, int64_t n_tok)
{
    for (size_t ti = 0; ti < n_types; ti++) {
        const uint32_t wt = types[ti];
        const size_t wrb = row_bytes(wt, n_cols), arb = rb_matmul_act_row_bytes(wt, n_cols);
        uint8_t *w = malloc(wrb * n_rows), *a = malloc(arb * n_tok);
        float *x = malloc(sizeof(float) * n_cols);
        float *ya = malloc(sizeof(float) * n_rows * n_tok), *yb = malloc(sizeof(float) * n_rows * n_tok);
        make_weights(wt, n_rows, n_cols, w);
        for (int64_t t = 0; t < n_tok; t++) {
            make_act_floats(n_cols, x, 0);
            rb_matmul_quantize_act(wt, x, a + t * arb, n_cols);
        }
        rb_matmul(pool2, wt, w, n_rows, n_cols, a, arb, n_tok, ya, n_rows);
        /* the tolerance also scales with sum |w_i a_i|: the random-byte rows
         * cancel to results far below their terms, and an ISA whose float
         * order differs from _ref's (NEON Q6_K) is only that close */
        float *wf = malloc(sizeof(float) * n_cols), *af = malloc(sizeof(float) * n_cols * n_tok);
        for (int64_t t = 0; t < n_tok; t++)
            dequant_act(rb_matmul_act_type(wt), a + t * arb, af + t * n_cols, n_cols);
        int bad = 0;
        for (int64_t r = 0; r < n_rows; r++) {
            rb_type_get_traits(wt)->dequantize_row(w + r * wrb, wf, n_cols);
            for (int64_t t = 0; t < n_tok; t++) {
                float ref = 0.0f;
                rb_matmul_isa_ref.tile[wt](n_cols, w + r * wrb, wrb, 1, a + t * arb, arb, 1, &ref, 1);
                double extra;
                (void)q4_1_s_fix(wt, w + r * wrb, a + t * arb, n_cols, &extra);
                const double tol = 1e-4 * (1.0 + fabsf(ref)) +
                                   TOL_ISA_VS_REF * (dot_abs(wf, af + t * n_cols, n_cols) + extra);
                bad += !(fabs((double)ya[t * n_rows + r] - ref) <= tol);
            }
        }
        for (int64_t t = 0; t < n_tok; t++)
            rb_matmul(pool1, wt, w, n_rows, n_cols, a + t * arb, arb, 1, yb + t * n_rows, n_rows);
        free(wf);
        free(af);
        CHECK_EQ_INT(bad, 0);
        CHECK(memcmp(ya, yb, sizeof(float) * n_rows * n_tok) == 0);
        free(w);
        free(a);
        free(x);
        free(ya);
        free(yb);
    }
}

static void test_matmul_large(rb_threadpool *pool1, rb_threadpool *pool2)
{
    static const uint32_t types[] = {RB_TYPE_Q4_0, RB_TYPE_Q8_0, RB_TYPE_Q4_K, RB_TYPE_Q6_K,
                                     RB_TYPE_Q5_K, RB_TYPE_Q4_1, RB_TYPE_Q5_1, RB_TYPE_F16};
    test_matmul_large_shape(pool1, pool2, types, sizeof types / sizeof types[0], 301, 1024, 70);
    /* the avx512 Q4_0 gemv: rows of 260 blocks (its token layout built in
     * two segments) and of 33 (not in fours: the few kernel) */
    static const uint32_t q4_0[] = {RB_TYPE_Q4_0};
    test_matmul_large_shape(pool1, pool2, q4_0, 1, 70, 8320, 17);
    test_matmul_large_shape(pool1, pool2, q4_0, 1, 70, 1056, 17);
}

int main(void)
{
    find_isas();
    fprintf(stderr, "matmul ISA in use: %s; tested against _ref:", rb_matmul_isa_best()->name);
    for (int k = 0; isas[k]; k++)
        fprintf(stderr, " %s", isas[k]->name);
    fprintf(stderr, "\n");
    CHECK(rb_matmul_supports(RB_TYPE_Q4_1));
    CHECK(rb_matmul_supports(RB_TYPE_Q5_K));
    CHECK(rb_matmul_supports(RB_TYPE_Q5_1));
    CHECK(!rb_matmul_supports(RB_TYPE_Q2_K));
    CHECK(!rb_matmul_supports(RB_TYPE_IQ4_NL));
    CHECK(!rb_matmul_supports(RB_TYPE_COUNT));
    CHECK(!rb_matmul_supports(1000));
    CHECK_EQ_INT(rb_matmul_act_type(RB_TYPE_Q4_0), RB_TYPE_Q8_0);
    CHECK_EQ_INT(rb_matmul_act_type(RB_TYPE_Q6_K), RB_TYPE_Q8_K);
    CHECK_EQ_INT(rb_matmul_act_type(RB_TYPE_Q5_K), RB_TYPE_Q8_K);
    CHECK_EQ_INT(rb_matmul_act_type(RB_TYPE_Q4_1), RB_TYPE_Q8_1);
    CHECK_EQ_INT(rb_matmul_act_type(RB_TYPE_Q5_1), RB_TYPE_Q8_1);
    CHECK_EQ_INT(rb_matmul_act_type(RB_TYPE_F16), RB_TYPE_F16);

    test_act_converters();
    test_tiles();

    rb_threadpool *pools[3] = {NULL, NULL, NULL};
    rb_error err = {0};
    for (int p = 0; p < 3; p++)
        CHECK_EQ_INT(rb_threadpool_create(p + 1, &pools[p], &err), RB_OK);
    /* the driver on every tier (rb_matmul runs the tier in use) */
    const int tier0 = rb_cpu_tier();
    for (int t = 0; t < RB_CPU_TIER_COUNT && pools[0] && pools[1] && pools[2]; t++) {
        if (!rb_cpu_tier_available(t))
            continue;
        rb_cpu_set_tier(t);
        test_matmul_driver(pools);
        test_matmul_large(pools[0], pools[1]);
    }
    rb_cpu_set_tier(tier0);
    for (int p = 0; p < 3; p++)
        rb_threadpool_destroy(pools[p]);
    return check_report();
}
