/*
 * test_sampler.c - the sampler chain against hand-made distributions and a
 * brute-force reference (full sort), the PRNG's determinism and
 * save/restore, empirical frequencies against softmax, penalties, NaN/Inf
 * rows and parameter checks. Fixed seeds throughout.
 */
#include <float.h>
#include <stdlib.h>

#include "check.h"
#include "testlib.h"
#include "sampler.h"

/* chi-square critical values at p = 0.001 by degrees of freedom. */
static const double chi2_999[] = {0, 10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12};

static rb_sampler *make(rb_sampler_params p, uint32_t n_vocab)
{
    rb_sampler *s = NULL;
    rb_error err;
    rb_status st = rb_sampler_create(&p, n_vocab, &s, &err);
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK)
        fprintf(stderr, "create: %s\n", err.message);
    return s;
}

/* The API's status-returning calls as the token / count, -1 / 0 on error,
 * so that the checks below read as values. */
static int32_t sample1(rb_sampler *s, const float *logits, const int32_t *history,
                       size_t n_history)
{
    int32_t token = -1;
    return rb_sampler_sample(s, logits, history, n_history, &token) == RB_OK ? token : -1;
}

static size_t candidates1(rb_sampler *s, const float *logits, const int32_t *history,
                          size_t n_history, const rb_sampler_candidate **out)
{
    size_t n = 0;
    if (rb_sampler_get_candidates(s, logits, history, n_history, out, &n) != RB_OK)
        return 0;
    return n;
}

static rb_sampler_params plain(float temp, uint64_t seed)
{
    rb_sampler_params p = rb_sampler_default_params();
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

/* Random rows: a stream of their own, independent of the sampler's. */
static rb_test_rng rnd_state = {12345};
static double rnd(void) { return rb_test_rng_uniform(&rnd_state); }

/* Sorted candidate ids, for set comparisons. */
static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static size_t cand_ids(rb_sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                       int32_t *ids)
{
    const rb_sampler_candidate *c = NULL;
    size_t n = candidates1(s, logits, hist, n_hist, &c);
    for (size_t i = 0; i < n; i++)
        ids[i] = c[i].id;
    qsort(ids, n, sizeof *ids, cmp_i32);
    return n;
}

static void test_defaults_and_invalid(void)
{
    rb_sampler_params d = rb_sampler_default_params();
    CHECK_NEAR(d.temp, 0.8, 1e-7);
    CHECK_EQ_INT(d.top_k, 40);
    CHECK_NEAR(d.top_p, 0.95, 1e-7);
    CHECK_NEAR(d.min_p, 0.05, 1e-7);
    CHECK_NEAR(d.repeat_penalty, 1.0, 0);
    CHECK_EQ_INT(d.repeat_last_n, 64);

    struct {
        const char *name;
        rb_sampler_params p;
        uint32_t n_vocab;
    } bad[12];
    int nb = 0;
    for (int i = 0; i < 12; i++) {
        bad[i].p = d;
        bad[i].n_vocab = 100;
    }
    bad[nb].name = "n_vocab", bad[nb].n_vocab = 0, nb++;
    bad[nb].name = "temp", bad[nb].p.temp = NAN, nb++;
    bad[nb].name = "temp", bad[nb].p.temp = INFINITY, nb++;
    bad[nb].name = "top_k", bad[nb].p.top_k = -1, nb++;
    bad[nb].name = "top_p", bad[nb].p.top_p = 0.0f, nb++;
    bad[nb].name = "top_p", bad[nb].p.top_p = 1.5f, nb++;
    bad[nb].name = "top_p", bad[nb].p.top_p = NAN, nb++;
    bad[nb].name = "min_p", bad[nb].p.min_p = -0.1f, nb++;
    bad[nb].name = "min_p", bad[nb].p.min_p = NAN, nb++;
    bad[nb].name = "repeat_penalty", bad[nb].p.repeat_penalty = 0.0f, nb++;
    bad[nb].name = "repeat_last_n", bad[nb].p.repeat_last_n = -2, nb++;
    for (int i = 0; i < nb; i++) {
        rb_sampler *s = (rb_sampler *)&bad; /* sentinel: must stay */
        rb_error err = {RB_OK, ""};
        CHECK_EQ_INT(rb_sampler_create(&bad[i].p, bad[i].n_vocab, &s, &err), RB_E_INVALID_ARG);
        CHECK_EQ_INT(err.status, RB_E_INVALID_ARG);
        CHECK(s == (rb_sampler *)&bad);
        CHECK_CONTAINS(err.message, bad[i].name);
    }
    /* NULL err is allowed; NULL params mean defaults. */
    rb_sampler *s = NULL;
    CHECK_EQ_INT(rb_sampler_create(&bad[0].p, 0, &s, NULL), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_sampler_create(NULL, 10, &s, NULL), RB_OK);
    CHECK(s != NULL);
    CHECK_EQ_INT(rb_sampler_get_params(s).top_k, 40);
    CHECK(rb_sampler_size_bytes(150000) >= 150000ull * 16);
    CHECK_EQ_U64(rb_sampler_size_bytes(0), 0);
    CHECK_EQ_U64(rb_sampler_size_bytes(UINT32_MAX), 0);
    CHECK_EQ_INT(candidates1(s, (const float[10]){0}, NULL, 0, NULL), 0);
    float row[10] = {0};
    CHECK_EQ_INT(sample1(s, NULL, NULL, 0), -1);
    CHECK_CONTAINS(rb_sampler_errmsg(s), "logits");
    CHECK_EQ_INT(sample1(s, row, NULL, 3), -1);
    CHECK_CONTAINS(rb_sampler_errmsg(s), "history");
    CHECK_EQ_INT(sample1(NULL, row, NULL, 0), -1);
    rb_sampler_destroy(s);
    rb_sampler_destroy(NULL);
}

static void test_greedy(void)
{
    float row[6] = {0.1f, 2.0f, -3.0f, 1.9f, 2.0f, 0.0f};
    for (int k = 0; k < 2; k++) {
        rb_sampler_params p = rb_sampler_default_params();
        p.temp = k ? -1.0f : 0.0f;
        rb_sampler *s = make(p, 6);
        rb_sampler_state before, after;
        rb_sampler_get_state(s, &before);
        for (int i = 0; i < 5; i++)
            CHECK_EQ_INT(sample1(s, row, NULL, 0), 1); /* tie 1/4 -> 1 */
        rb_sampler_get_state(s, &after);
        CHECK(memcmp(&before, &after, sizeof before) == 0); /* no draws */
        float row2[6] = {-5, -4, -3, -2, -1, -0.5f};
        CHECK_EQ_INT(sample1(s, row2, NULL, 0), 5);
        rb_sampler_destroy(s);
    }
    /* Greedy on a 150k row with the maximum tied at the end and start. */
    uint32_t n = 150000;
    float *big = malloc(n * sizeof *big);
    for (uint32_t i = 0; i < n; i++)
        big[i] = (float)(rnd() * 10.0);
    big[n - 1] = 20.0f;
    big[77777] = 20.0f;
    rb_sampler *s = make(plain(0.0f, 1), n);
    CHECK_EQ_INT(sample1(s, big, NULL, 0), 77777);
    rb_sampler_destroy(s);
    free(big);
}

static void random_row(float *row, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++)
        row[i] = (float)((rnd() - 0.5) * scale);
}

static void test_seed_and_state(void)
{
    enum { V = 50, N = 200 };
    float row[V];
    random_row(row, V, 4.0);
    rb_sampler_params p = rb_sampler_default_params();
    p.seed = 42;
    rb_sampler *a = make(p, V), *b = make(p, V);
    p.seed = 43;
    rb_sampler *c = make(p, V);
    int32_t sa[N], sb[N];
    int n_diff = 0;
    for (int i = 0; i < N; i++) {
        sa[i] = sample1(a, row, NULL, 0);
        sb[i] = sample1(b, row, NULL, 0);
        n_diff += sa[i] != sample1(c, row, NULL, 0);
        CHECK(sa[i] >= 0 && sa[i] < V);
    }
    CHECK(memcmp(sa, sb, sizeof sa) == 0);
    CHECK(n_diff > N / 4);

    /* The sequence is pinned: a change here breaks resumed sessions. */
    static const int32_t golden[12] = {0, 31, 30, 10, 8, 16, 12, 33, 49, 45, 30, 36};
    rb_sampler_destroy(b);
    p.seed = 42;
    b = make(p, V);
    for (int i = 0; i < 12; i++)
        CHECK_EQ_INT(sample1(b, row, NULL, 0), golden[i]);

    /* The generator is xoshiro256**: from state {1, 2, 3, 4} its published
     * outputs start 11520, 0, 1509978240, 1215971899390074240. On 256 equal
     * logits a draw picks token floor(u * 256), the output's top 8 bits. */
    {
        static const int32_t top8[16] = {0,   0,   0,  16,  16,  8,   224, 117,
                                         147, 40,  200, 17, 181, 149, 229, 215};
        float flat[256] = {0};
        rb_sampler *f = make(plain(1.0f, 0), 256);
        rb_sampler_state ref = {0, {1, 2, 3, 4}};
        CHECK_EQ_INT(rb_sampler_set_state(f, &ref), RB_OK);
        for (int i = 0; i < 16; i++)
            CHECK_EQ_INT(sample1(f, flat, NULL, 0), top8[i]);
        rb_sampler_destroy(f);
    }

    /* Save after 10, record 30, restore (also into a sampler seeded
     * differently), and the 30 repeat. */
    rb_sampler_state st, st2;
    for (int i = 0; i < 10; i++)
        sample1(a, row, NULL, 0);
    rb_sampler_get_state(a, &st);
    CHECK_EQ_U64(st.seed, 42);
    int32_t rec[30];
    for (int i = 0; i < 30; i++)
        rec[i] = sample1(a, row, NULL, 0);
    CHECK_EQ_INT(rb_sampler_set_state(a, &st), RB_OK);
    CHECK_EQ_INT(rb_sampler_set_state(c, &st), RB_OK);
    rb_sampler_get_state(c, &st2);
    CHECK(memcmp(&st, &st2, sizeof st) == 0);
    for (int i = 0; i < 30; i++) {
        CHECK_EQ_INT(sample1(a, row, NULL, 0), rec[i]);
        CHECK_EQ_INT(sample1(c, row, NULL, 0), rec[i]);
    }

    /* An all-zero xoshiro state is refused and leaves the sampler as it was. */
    rb_sampler_state zero = {7, {0, 0, 0, 0}};
    rb_sampler_get_state(a, &st);
    CHECK_EQ_INT(rb_sampler_set_state(a, &zero), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_sampler_errmsg(a), "all-zero");
    CHECK_EQ_INT(rb_sampler_set_state(a, NULL), RB_E_INVALID_ARG);
    rb_sampler_get_state(a, &st2);
    CHECK(memcmp(&st, &st2, sizeof st) == 0);

    /* One draw per call, whatever the row: a sampler fed degenerate rows
     * stays in step with one fed normal rows. */
    float dead[V];
    for (int i = 0; i < V; i++)
        dead[i] = -INFINITY;
    p.seed = 9;
    rb_sampler *x = make(p, V), *y = make(p, V);
    for (int i = 0; i < 7; i++) {
        sample1(x, row, NULL, 0);
        sample1(y, i % 2 ? dead : row, NULL, 0);
    }
    rb_sampler_get_state(x, &st);
    rb_sampler_get_state(y, &st2);
    CHECK(memcmp(&st, &st2, sizeof st) == 0);

    rb_sampler_destroy(a);
    rb_sampler_destroy(b);
    rb_sampler_destroy(c);
    rb_sampler_destroy(x);
    rb_sampler_destroy(y);
}

static void test_top_k_1_is_greedy(void)
{
    enum { V = 3000 };
    static float row[V];
    rb_sampler_params p = rb_sampler_default_params();
    p.top_k = 1;
    p.temp = 1.3f;
    rb_sampler *s = make(p, V), *g = make(plain(0.0f, 0), V);
    for (int t = 0; t < 50; t++) {
        random_row(row, V, 8.0);
        if (t % 5 == 0)
            row[V - 1] = row[t] = 100.0f; /* tie: lowest id wins */
        CHECK_EQ_INT(sample1(s, row, NULL, 0), sample1(g, row, NULL, 0));
    }
    rb_sampler_destroy(s);
    rb_sampler_destroy(g);
}

/* Draws n samples and returns the chi-square statistic against expected
 * probabilities q (zero-probability tokens must never come out). */
static double chi_square(rb_sampler *s, const float *row, int v, const double *q, int n)
{
    int count[16] = {0};
    for (int i = 0; i < n; i++) {
        int32_t t = sample1(s, row, NULL, 0);
        CHECK(t >= 0 && t < v);
        if (t >= 0 && t < v)
            count[t]++;
    }
    double chi = 0.0;
    for (int i = 0; i < v; i++) {
        if (q[i] == 0.0) {
            CHECK_EQ_INT(count[i], 0);
            continue;
        }
        double e = q[i] * n;
        chi += (count[i] - e) * (count[i] - e) / e;
    }
    return chi;
}

static void test_frequencies(void)
{
    enum { V = 8, N = 200000 };
    const float row[V] = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, 1.5f, -1.0f, 0.8f};
    const float temps[3] = {1.0f, 0.7f, 2.0f};
    for (int k = 0; k < 3; k++) {
        double q[V], z = 0.0;
        for (int i = 0; i < V; i++)
            z += q[i] = exp(row[i] / temps[k]);
        for (int i = 0; i < V; i++)
            q[i] /= z;
        rb_sampler *s = make(plain(temps[k], 1000 + (uint64_t)k), V);
        double chi = chi_square(s, row, V, q, N);
        printf("softmax temp %.1f: chi2 = %.2f (df 7, p=0.001 critical %.2f)\n", temps[k], chi,
               chi2_999[7]);
        CHECK(chi < chi2_999[7]);
        rb_sampler_destroy(s);
    }
    /* top-k 3 at temp 1.5: the three best renormalized, the rest never. */
    rb_sampler_params p = plain(1.5f, 7);
    p.top_k = 3;
    rb_sampler *s = make(p, V);
    double q[V] = {0}, z = 0.0;
    const int keep[3] = {3, 5, 0};
    for (int i = 0; i < 3; i++)
        z += q[keep[i]] = exp(row[keep[i]] / 1.5);
    for (int i = 0; i < V; i++)
        q[i] /= z;
    double chi = chi_square(s, row, V, q, N);
    printf("top_k 3 temp 1.5: chi2 = %.2f (df 2, critical %.2f)\n", chi, chi2_999[2]);
    CHECK(chi < chi2_999[2]);
    rb_sampler_destroy(s);
}

/* Probabilities 0.5 0.25 0.15 0.07 0.03 on ids 4 2 0 3 1 (shuffled). */
static void hand_row(float *row)
{
    row[4] = logf(0.5f);
    row[2] = logf(0.25f);
    row[0] = logf(0.15f);
    row[3] = logf(0.07f);
    row[1] = logf(0.03f);
}

static void expect_ids(rb_sampler_params p, const float *row, int v, const int32_t *want,
                       size_t n_want, int line)
{
    rb_sampler *s = make(p, (uint32_t)v);
    int32_t ids[64];
    size_t n = cand_ids(s, row, NULL, 0, ids);
    int ok = n == n_want;
    for (size_t i = 0; ok && i < n; i++)
        ok = ids[i] == want[i];
    if (!ok)
        fprintf(stderr, "line %d: got %zu candidates, want %zu\n", line, n, n_want);
    CHECK(ok);
    rb_sampler_destroy(s);
}

static void test_top_p_min_p(void)
{
    float row[5];
    hand_row(row);
    for (int top_k = 0; top_k <= 40; top_k += 40) { /* unsorted and top-k paths */
        rb_sampler_params p = plain(1.0f, 0);
        p.top_k = top_k;
        p.top_p = 0.45f; /* 0.5 >= 0.45 */
        expect_ids(p, row, 5, (const int32_t[]){4}, 1, __LINE__);
        p.top_p = 0.7f; /* 0.75 */
        expect_ids(p, row, 5, (const int32_t[]){2, 4}, 2, __LINE__);
        p.top_p = 0.8f; /* 0.9 */
        expect_ids(p, row, 5, (const int32_t[]){0, 2, 4}, 3, __LINE__);
        p.top_p = 0.95f; /* 0.97 */
        expect_ids(p, row, 5, (const int32_t[]){0, 2, 3, 4}, 4, __LINE__);
        p.top_p = 1.0f;
        expect_ids(p, row, 5, (const int32_t[]){0, 1, 2, 3, 4}, 5, __LINE__);

        p.min_p = 0.1f; /* >= 0.05: 0.03 goes */
        expect_ids(p, row, 5, (const int32_t[]){0, 2, 3, 4}, 4, __LINE__);
        p.min_p = 0.2f; /* >= 0.10 */
        expect_ids(p, row, 5, (const int32_t[]){0, 2, 4}, 3, __LINE__);
        p.min_p = 0.6f; /* >= 0.30 */
        expect_ids(p, row, 5, (const int32_t[]){4}, 1, __LINE__);
        /* Both: the shorter prefix. */
        p.min_p = 0.1f;
        p.top_p = 0.7f;
        expect_ids(p, row, 5, (const int32_t[]){2, 4}, 2, __LINE__);
        p.min_p = 0.4f; /* >= 0.2 */
        p.top_p = 0.8f;
        expect_ids(p, row, 5, (const int32_t[]){2, 4}, 2, __LINE__);
    }
    /* top-p after top-k normalizes over the top-k set: with k = 2 the two
     * have 2/3 and 1/3, so top_p 0.6 keeps only id 4. */
    rb_sampler_params p = plain(1.0f, 0);
    p.top_k = 2;
    p.top_p = 0.6f;
    expect_ids(p, row, 5, (const int32_t[]){4}, 1, __LINE__);
    p.top_p = 0.7f;
    expect_ids(p, row, 5, (const int32_t[]){2, 4}, 2, __LINE__);
    /* The sorted (top-k) path: k = 4 drops id 1 and renormalizes the rest
     * by 0.97 (0.515 0.258 0.155 0.072), so top_p 0.76 stops at two tokens
     * where without top-k (0.5 + 0.25 < 0.76) it takes three. min_p's
     * threshold is relative to the max and does not move. */
    p.top_k = 4;
    p.top_p = 0.76f;
    expect_ids(p, row, 5, (const int32_t[]){2, 4}, 2, __LINE__);
    p.top_k = 0;
    expect_ids(p, row, 5, (const int32_t[]){0, 2, 4}, 3, __LINE__);
    p.top_k = 4;
    p.top_p = 1.0f;
    p.min_p = 0.1f;
    expect_ids(p, row, 5, (const int32_t[]){0, 2, 3, 4}, 4, __LINE__);
    p.min_p = 0.2f;
    expect_ids(p, row, 5, (const int32_t[]){0, 2, 4}, 3, __LINE__);
    p.min_p = 0.0f;
    p.top_k = 2;
    p.top_p = 0.7f;
    /* Temperature comes after the cuts: it does not change the kept set. */
    p.temp = 5.0f;
    expect_ids(p, row, 5, (const int32_t[]){2, 4}, 2, __LINE__);
}

/* ---- brute-force reference: full sort, then the chain ------------------ */

static int cmp_cand(const void *a, const void *b)
{
    const rb_sampler_candidate *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static size_t reference(const rb_sampler_params *p, const float *row, size_t v,
                        rb_sampler_candidate *c, int32_t *ids)
{
    size_t n = 0;
    for (size_t i = 0; i < v; i++)
        if (row[i] > -INFINITY)
            c[n++] = (rb_sampler_candidate){(int32_t)i, row[i]};
    qsort(c, n, sizeof *c, cmp_cand);
    if (p->top_k > 0 && (size_t)p->top_k < n)
        n = (size_t)p->top_k;
    float max = c[0].logit;
    if (p->top_p < 1.0f) {
        double z = 0.0, cum = 0.0;
        for (size_t i = 0; i < n; i++)
            z += (double)expf(c[i].logit - max);
        for (size_t i = 0; i < n; i++) {
            cum += (double)expf(c[i].logit - max);
            if (cum / z >= (double)p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f)
        for (size_t i = 1; i < n; i++)
            if (c[i].logit < max + logf(p->min_p)) {
                n = i;
                break;
            }
    for (size_t i = 0; i < n; i++)
        ids[i] = c[i].id;
    qsort(ids, n, sizeof *ids, cmp_i32);
    return n;
}

static void test_against_reference(void)
{
    const uint32_t sizes[3] = {700, 5000, 150000};
    struct { int32_t top_k; float top_p, min_p; double scale; } cases[] = {
        {40, 0.95f, 0.05f, 10.0}, {0, 0.95f, 0.05f, 10.0}, {0, 0.9f, 0.0f, 30.0},
        {0, 0.95f, 0.0f, 1.0},    /* flat: the radix fallback */
        {0, 0.5f, 0.0f, 40.0},    /* peaked: the first chunk suffices */
        {2000, 0.9f, 0.0f, 3.0},  /* k above the heap limit: radix */
        {0, 1.0f, 0.3f, 5.0},     {100, 1.0f, 0.0f, 5.0}, {5, 0.99f, 0.5f, 2.0},
        {50, 1.0f, 0.2f, 5.0},    /* min-p on the sorted path */
    };
    int32_t *ids = malloc(150000 * sizeof *ids), *ref_ids = malloc(150000 * sizeof *ids);
    rb_sampler_candidate *c = malloc(150000 * sizeof *c);
    float *row = malloc(150000 * sizeof *row);
    for (size_t z = 0; z < 3; z++) {
        for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
            rb_sampler_params p = plain(0.8f, 0);
            p.top_k = cases[k].top_k;
            p.top_p = cases[k].top_p;
            p.min_p = cases[k].min_p;
            rb_sampler *s = make(p, sizes[z]);
            for (int t = 0; t < 4; t++) {
                random_row(row, sizes[z], cases[k].scale);
                /* Ties: quantize some logits (t = 2), or all of them
                 * (t = 3: whole numbers share their low bits, so the radix
                 * sort skips a pass). */
                if (t >= 2)
                    for (uint32_t i = 0; i < sizes[z]; i += t == 2 ? 3 : 1)
                        row[i] = floorf(row[i]);
                size_t n = cand_ids(s, row, NULL, 0, ids);
                size_t nr = reference(&p, row, sizes[z], c, ref_ids);
                int same = n == nr && memcmp(ids, ref_ids, n * sizeof *ids) == 0;
                if (!same)
                    fprintf(stderr, "vocab %u case %zu row %d: %zu candidates, reference %zu\n",
                            sizes[z], k, t, n, nr);
                CHECK(same);
            }
            rb_sampler_destroy(s);
        }
    }
    free(ids);
    free(ref_ids);
    free(c);
    free(row);
}

static float logit_of(const rb_sampler_candidate *c, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (c[i].id == id)
            return c[i].logit;
    return NAN;
}

static void test_penalties(void)
{
    const float row[6] = {2.0f, -1.0f, 0.5f, 3.0f, 0.0f, 1.0f};
    const int32_t hist[7] = {5, 3, 1, 3, -7, 4, 1000};
    rb_sampler_params p = plain(1.0f, 0);
    p.repeat_penalty = 2.0f;
    p.repeat_last_n = 64;
    rb_sampler *s = make(p, 6);
    const rb_sampler_candidate *c;
    for (int round = 0; round < 2; round++) { /* `seen` must be clean again */
        size_t n = candidates1(s, row, hist, 7, &c);
        CHECK_EQ_INT(n, 6);
        CHECK_NEAR(logit_of(c, n, 0), 2.0, 0);   /* not in history */
        CHECK_NEAR(logit_of(c, n, 1), -2.0, 0);  /* <= 0: multiplied */
        CHECK_NEAR(logit_of(c, n, 2), 0.5, 0);
        CHECK_NEAR(logit_of(c, n, 3), 1.5, 0);   /* twice, divided once */
        CHECK_NEAR(logit_of(c, n, 4), 0.0, 0);   /* 0 * 2 */
        CHECK_NEAR(logit_of(c, n, 5), 0.5, 0);
    }
    rb_sampler_destroy(s);

    /* The window is the last repeat_last_n tokens: 3 entries = {-7, 4, 1000}. */
    p.repeat_last_n = 3;
    s = make(p, 6);
    size_t n = candidates1(s, row, hist, 7, &c);
    CHECK_NEAR(logit_of(c, n, 3), 3.0, 0);
    CHECK_NEAR(logit_of(c, n, 5), 1.0, 0);
    rb_sampler_destroy(s);
    p.repeat_last_n = 5; /* {1, 3, -7, 4, 1000} */
    s = make(p, 6);
    n = candidates1(s, row, hist, 7, &c);
    CHECK_NEAR(logit_of(c, n, 3), 1.5, 0);
    CHECK_NEAR(logit_of(c, n, 1), -2.0, 0);
    CHECK_NEAR(logit_of(c, n, 5), 1.0, 0);
    rb_sampler_destroy(s);
    p.repeat_last_n = 0; /* off */
    s = make(p, 6);
    n = candidates1(s, row, hist, 7, &c);
    CHECK_NEAR(logit_of(c, n, 3), 3.0, 0);
    rb_sampler_destroy(s);
    p.repeat_last_n = -1; /* whole history */
    s = make(p, 6);
    n = candidates1(s, row, hist, 7, &c);
    CHECK_NEAR(logit_of(c, n, 5), 0.5, 0);
    rb_sampler_destroy(s);

    /* Greedy sees the penalized logits: 3 (3.0 -> 1.5) loses to 0 (2.0). */
    p = plain(0.0f, 0);
    p.repeat_penalty = 2.0f;
    s = make(p, 6);
    CHECK_EQ_INT(sample1(s, row, NULL, 0), 3);
    CHECK_EQ_INT(sample1(s, row, hist, 7), 0);
    rb_sampler_destroy(s);
    /* A penalty below 1 boosts. */
    p.repeat_penalty = 0.5f;
    s = make(p, 6);
    const int32_t h2[1] = {0};
    CHECK_EQ_INT(sample1(s, row, h2, 1), 0); /* 2.0 / 0.5 = 4 > 3 */
    rb_sampler_destroy(s);
}

static void test_nan_inf(void)
{
    enum { V = 6, N = 20000 };
    rb_sampler *s = make(plain(1.0f, 3), V), *g = make(plain(0.0f, 3), V);
    /* NaN tokens are never drawn. */
    float r1[V] = {NAN, 0.0f, NAN, 0.5f, NAN, -0.5f};
    int ok = 1;
    for (int i = 0; i < N; i++) {
        int32_t t = sample1(s, r1, NULL, 0);
        ok &= t == 1 || t == 3 || t == 5;
    }
    CHECK(ok);
    CHECK_EQ_INT(sample1(g, r1, NULL, 0), 3);
    /* +inf tokens share everything, equally. */
    float r2[V] = {5.0f, INFINITY, NAN, INFINITY, -INFINITY, 100.0f};
    int c1 = 0, c3 = 0;
    for (int i = 0; i < N; i++) {
        int32_t t = sample1(s, r2, NULL, 0);
        c1 += t == 1;
        c3 += t == 3;
    }
    CHECK_EQ_INT(c1 + c3, N);
    CHECK_NEAR((double)c1 / N, 0.5, 0.02);
    CHECK_EQ_INT(sample1(g, r2, NULL, 0), 1);
    /* Nothing finite: the raw argmax (first -inf), or 0 when all NaN. */
    float r3[V] = {NAN, NAN, -INFINITY, NAN, -INFINITY, NAN};
    float r4[V] = {NAN, NAN, NAN, NAN, NAN, NAN};
    float r5[V] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    CHECK_EQ_INT(sample1(s, r3, NULL, 0), 2);
    CHECK_EQ_INT(sample1(g, r3, NULL, 0), 2);
    CHECK_EQ_INT(sample1(s, r4, NULL, 0), 0);
    CHECK_EQ_INT(sample1(g, r4, NULL, 0), 0);
    CHECK_EQ_INT(sample1(s, r5, NULL, 0), 0);
    /* Extreme finite logits: no overflow into NaN. */
    float r6[V] = {FLT_MAX, -FLT_MAX, 0.0f, FLT_MAX, 1e-38f, -0.0f};
    ok = 1;
    for (int i = 0; i < 1000; i++) {
        int32_t t = sample1(s, r6, NULL, 0);
        ok &= t == 0 || t == 3;
    }
    CHECK(ok);
    rb_sampler_destroy(s);
    rb_sampler_destroy(g);
    /* Defaults on a bad row of a big vocabulary. */
    rb_sampler_params p = rb_sampler_default_params();
    p.repeat_penalty = 1.3f;
    s = make(p, 2000);
    float *row = malloc(2000 * sizeof *row);
    random_row(row, 2000, 6.0);
    for (int i = 0; i < 2000; i += 7)
        row[i] = NAN;
    row[11] = -INFINITY;
    int32_t hist[3] = {11, 14, 1999};
    int32_t t = sample1(s, row, hist, 3);
    CHECK(t >= 0 && t < 2000 && t % 7 != 0 && t != 11);
    free(row);
    rb_sampler_destroy(s);
}

int main(void)
{
    test_defaults_and_invalid();
    test_greedy();
    test_seed_and_state();
    test_top_k_1_is_greedy();
    test_frequencies();
    test_top_p_min_p();
    test_against_reference();
    test_penalties();
    test_nan_inf();
    return check_report();
}
