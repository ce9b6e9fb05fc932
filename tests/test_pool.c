/*
 * test_pool.c - many sessions on one model under one memory pool: the
 * weights are the model's, trims and aborts come from any thread, and
 * every session's logits stay bit-identical to a session that was never
 * trimmed (the lossless tiers).
 *
 * Regression tests first: sessions created from two threads at once on one
 * model (the model's lazy weight load raced: the token streams differed),
 * and a complete trim of one session while another shares the model (the
 * other computed with released weights: logits up to 0.88 off).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "check.h"
#include "rebound.h"
#include "session_debug.h"
#include "testlib.h"

#define N_VOCAB_MAX 4096

static char path[512], path_big[512];

static rb_session_params params(int n_threads)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 256;
    p.n_batch = 16;
    p.n_threads = n_threads;
    p.ram_codec = RB_RAM_CODEC_LOSSLESS;
    return p;
}

/* The test model, opened, and a pool of it without a budget. */
static rb_pool *open_pool(rb_model **m)
{
    rb_error err;
    rb_pool *pool = NULL;
    CHECK_EQ_INT(rb_model_open(path, NULL, m, &err), RB_OK);
    if (*m)
        CHECK_EQ_INT(rb_pool_create(*m, 0, &pool, &err), RB_OK);
    return pool;
}

static int argmax(const float *x, uint32_t n)
{
    int b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = (int)i;
    return b;
}

/* The prompt of conversation k. */
static void prompt(int k, int32_t *out, size_t n, uint32_t n_vocab)
{
    rb_test_rng r = rb_test_rng_seed(1000 + (uint64_t)k);
    for (size_t i = 0; i < n; i++)
        out[i] = (int32_t)rb_test_rng_below(&r, n_vocab);
}

/* ---- concurrent create ------------------------------------------------------ */

typedef struct greedy_job {
    rb_model *model;
    pthread_barrier_t *start; /* NULL: none */
    int32_t out[24];
    rb_status st;
} greedy_job;

static void *greedy(void *arg)
{
    greedy_job *j = arg;
    if (j->start)
        pthread_barrier_wait(j->start);
    rb_session_params p = params(1);
    rb_session *s = NULL;
    rb_error err;
    j->st = rb_session_create(j->model, &p, &s, &err);
    if (j->st != RB_OK)
        return NULL;
    int32_t tok = 1;
    uint32_t nv = rb_session_n_vocab(s);
    for (int i = 0; i < 24 && j->st == RB_OK; i++) {
        j->st = rb_session_feed(s, &tok, 1, NULL);
        tok = j->out[i] = argmax(rb_session_get_logits(s), nv);
    }
    rb_session_destroy(s);
    return NULL;
}

static void test_concurrent_create(void)
{
    int32_t ref[24];
    int n_differ = 0;
    {
        rb_model *m = NULL;
        rb_error err;
        CHECK_EQ_INT(rb_model_open(path_big, NULL, &m, &err), RB_OK);
        greedy_job j = {.model = m};
        greedy(&j);
        CHECK_EQ_INT(j.st, RB_OK);
        memcpy(ref, j.out, sizeof ref);
        rb_model_close(m);
    }
    for (int round = 0; round < 5; round++) {
        rb_model *m = NULL;
        rb_error err;
        CHECK_EQ_INT(rb_model_open(path_big, NULL, &m, &err), RB_OK);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 2);
        greedy_job j[2] = {{.model = m, .start = &start}, {.model = m, .start = &start}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            pthread_create(&t[i], NULL, greedy, &j[i]);
        for (int i = 0; i < 2; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < 2; i++) {
            CHECK_EQ_INT(j[i].st, RB_OK);
            n_differ += memcmp(j[i].out, ref, sizeof ref) != 0;
        }
        rb_model_close(m);
    }
    CHECK_EQ_INT(n_differ, 0);
    printf("concurrent create: %d of 10 token streams differ from the reference\n", n_differ);
}

/* ---- a trim of one session with another on the model ------------------------ */

static void test_cross_session_trim(void)
{
    rb_model *m = NULL, *mr = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    CHECK_EQ_INT(rb_model_open(path, NULL, &mr, &err), RB_OK);
    rb_session_params p = params(1);
    rb_session *a = NULL, *b = NULL, *ref = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &a, &err), RB_OK);
    CHECK_EQ_INT(rb_session_create(m, &p, &b, &err), RB_OK);
    CHECK_EQ_INT(rb_session_create(mr, &p, &ref, &err), RB_OK);
    uint32_t nv = rb_session_n_vocab(b);
    int32_t toks[64];
    prompt(0, toks, 64, nv);
    CHECK_EQ_INT(rb_session_feed(a, toks, 64, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(b, toks, 64, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(ref, toks, 64, NULL), RB_OK);
    uint64_t freed = 0;
    CHECK_EQ_INT(rb_session_trim(a, 0, RB_TRIM_COMPLETE, &freed), RB_OK);
    rb_session_stats st;
    rb_session_get_stats(b, &st);
    CHECK(st.weights_evicted_bytes > 0); /* b sees the model's weights released */
    int32_t next = 7;
    CHECK_EQ_INT(rb_session_feed(b, &next, 1, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(ref, &next, 1, NULL), RB_OK);
    CHECK(memcmp(rb_session_get_logits(b), rb_session_get_logits(ref), nv * sizeof(float)) == 0);
    CHECK_EQ_INT(rb_session_feed(a, &next, 1, NULL), RB_OK);
    CHECK(memcmp(rb_session_get_logits(a), rb_session_get_logits(ref), nv * sizeof(float)) == 0);
    rb_session_destroy(a);
    rb_session_destroy(b);
    rb_session_destroy(ref);
    rb_model_close(m);
    rb_model_close(mr);
}

/* ---- reference logits of each conversation ----------------------------------- */

#define K 4
#define TURNS 6
#define TURN 20

typedef struct conv_ref {
    int32_t toks[TURNS * TURN];
    float logits[TURNS][N_VOCAB_MAX]; /* after each turn */
} conv_ref;

static conv_ref refs[K];
static uint32_t n_vocab;
static uint64_t conv_kv; /* a whole conversation's KV in RAM */

static void make_refs(void)
{
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    rb_session_params p = params(1);
    for (int k = 0; k < K; k++) {
        rb_session *s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
        n_vocab = rb_session_n_vocab(s);
        prompt(k, refs[k].toks, TURNS * TURN, n_vocab);
        for (int t = 0; t < TURNS; t++) {
            CHECK_EQ_INT(rb_session_feed(s, refs[k].toks + t * TURN, TURN, NULL), RB_OK);
            memcpy(refs[k].logits[t], rb_session_get_logits(s), n_vocab * sizeof(float));
        }
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        conv_kv = st.kv_raw_bytes;
        rb_session_destroy(s);
    }
    rb_model_close(m);
}

/* ---- 4 sessions, 2 feeding threads, a trimming thread ------------------------ */

typedef struct feeder {
    rb_session *s[2];
    int k[2];
    int mismatches;
    rb_status st;
} feeder;

static atomic_int stop_trims;

/* Runs work(a0) and work(a1) on two threads while trim(t) runs on a third
 * until both are done (stop_trims ends it). */
static void race(void *(*work)(void *), void *a0, void *a1, void *(*trim)(void *), void *t)
{
    pthread_t th[3];
    atomic_store(&stop_trims, 0);
    pthread_create(&th[2], NULL, trim, t);
    pthread_create(&th[0], NULL, work, a0);
    pthread_create(&th[1], NULL, work, a1);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    atomic_store(&stop_trims, 1);
    pthread_join(th[2], NULL);
}

static void *feed_two(void *arg)
{
    feeder *f = arg;
    for (int t = 0; t < TURNS; t++)
        for (int i = 0; i < 2; i++) {
            const conv_ref *r = &refs[f->k[i]];
            rb_status st = rb_session_feed(f->s[i], r->toks + t * TURN, TURN, NULL);
            if (st != RB_OK) {
                f->st = st;
                return NULL;
            }
            if (memcmp(rb_session_get_logits(f->s[i]), r->logits[t], n_vocab * sizeof(float)))
                f->mismatches++;
        }
    return NULL;
}

typedef struct trimmer {
    rb_session **s;
    rb_pool *pool;
    int n_trims;
} trimmer;

static void *trim_loop(void *arg)
{
    trimmer *t = arg;
    rb_test_rng r = rb_test_rng_seed(77);
    while (!atomic_load(&stop_trims)) {
        uint32_t pick = rb_test_rng_below(&r, K + 1);
        rb_trim_level lv = (rb_trim_level)(1 + rb_test_rng_below(&r, 3));
        if (pick == K)
            rb_pool_trim(t->pool, 0, lv, NULL);
        else
            rb_session_trim(t->s[pick], 0, lv, NULL);
        t->n_trims++;
    }
    return NULL;
}

static void test_threads(void)
{
    rb_model *m = NULL;
    rb_error err;
    rb_pool *pool = open_pool(&m);
    rb_session *s[K] = {0};
    rb_session_params p = params(1);
    p.pool = pool;
    for (int k = 0; k < K; k++)
        CHECK_EQ_INT(rb_session_create(m, &p, &s[k], &err), RB_OK);
    feeder f[2] = {{{s[0], s[1]}, {0, 1}, 0, RB_OK}, {{s[2], s[3]}, {2, 3}, 0, RB_OK}};
    trimmer tr = {s, pool, 0};
    race(feed_two, &f[0], &f[1], trim_loop, &tr);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(f[i].st, RB_OK);
        CHECK_EQ_INT(f[i].mismatches, 0);
    }
    CHECK(tr.n_trims > 0);
    printf("threads: %d trims from a third thread, logits identical\n", tr.n_trims);
    rb_pool_stats ps;
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK_EQ_INT((int)ps.n_sessions, K);
    rb_pool_destroy(pool); /* goes with its last session */
    for (int k = 0; k < K; k++)
        rb_session_destroy(s[k]);
    rb_model_close(m);
}

/* ---- the pool trims residency from another thread ----------------------------- */

/*
 * The app's onTrimMemory: a thread of its own calls the pool (every trim
 * level, trims by bytes, a budget set and lifted) while two sessions of
 * that pool feed and rewind on two more threads. The pool trims each
 * member's residency manager itself (pool.c, rb_residency_pool_trim): at
 * once when the member is idle, else the manager records the request and
 * the feeding thread serves it at its layer gate or when it lets go.
 * Every logit, after every feed and every replay after a rewind, is
 * compared with a session never trimmed, bit for bit. Then both paths
 * deterministically: a member held by one thread is not touched by a
 * pool trim from another (posted; its KV stays), an idle one is trimmed
 * at once, and the held one's request is served when it is let go.
 */
typedef struct rewinder {
    rb_session *s;
    int k;
    int n_checked, mismatches;
    rb_status st;
} rewinder;

static int feed_check(rewinder *f, int t)
{
    const conv_ref *r = &refs[f->k];
    rb_status st = rb_session_feed(f->s, r->toks + t * TURN, TURN, NULL);
    if (st != RB_OK) {
        f->st = st;
        return -1;
    }
    f->n_checked++;
    if (memcmp(rb_session_get_logits(f->s), r->logits[t], n_vocab * sizeof(float)))
        f->mismatches++;
    return 0;
}

static void *feed_rewind(void *arg)
{
    rewinder *f = arg;
    for (int t = 0; t < TURNS; t++) {
        if (feed_check(f, t))
            return NULL;
        if (t == 0)
            continue;
        /* replay the last two turns: the rewind forgets pages a trim may
           have sent to any tier, the feeds restore or recompute the rest */
        rb_status st = rb_session_rewind(f->s, (size_t)(t - 1) * TURN);
        if (st != RB_OK) {
            f->st = st;
            return NULL;
        }
        if (feed_check(f, t - 1) || feed_check(f, t))
            return NULL;
    }
    return NULL;
}

typedef struct pool_trimmer {
    rb_pool *pool;
    uint64_t tight_budget;
    int n_calls;
} pool_trimmer;

static void *pool_trim_loop(void *arg)
{
    pool_trimmer *t = arg;
    rb_test_rng r = rb_test_rng_seed(91);
    const struct timespec pause = {0, 200000}; /* 0.2 ms: the feeds go on between */
    while (!atomic_load(&stop_trims)) {
        switch (rb_test_rng_below(&r, 5)) {
        case 0: rb_pool_trim(t->pool, 0, RB_TRIM_BACKGROUND, NULL); break;
        case 1: rb_pool_trim(t->pool, 0, RB_TRIM_MODERATE, NULL); break;
        case 2: rb_pool_trim(t->pool, conv_kv / 2, RB_TRIM_BYTES, NULL); break;
        case 3: rb_pool_trim(t->pool, 0, RB_TRIM_COMPLETE, NULL); break;
        default: /* a budget the feeds then enforce themselves, and none */
            rb_pool_set_budget(t->pool, t->n_calls % 2 ? t->tight_budget : 0);
        }
        t->n_calls++;
        nanosleep(&pause, NULL);
    }
    rb_pool_set_budget(t->pool, 0);
    return NULL;
}

typedef struct trim_once {
    rb_pool *pool;
    rb_trim_level level;
} trim_once;

static void *pool_trim_once(void *arg)
{
    trim_once *t = arg;
    rb_pool_trim(t->pool, 0, t->level, NULL);
    return NULL;
}

static uint64_t kv_ram(rb_session *s)
{
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    return st.kv_raw_bytes + st.kv_compressed_bytes;
}

static void test_pool_trims_residency(void)
{
    rb_model *m = NULL;
    rb_error err;
    rb_pool *pool = open_pool(&m);
    rb_session_params p = params(1);
    p.pool = pool;
    rewinder f[2] = {{NULL, 0, 0, 0, RB_OK}, {NULL, 1, 0, 0, RB_OK}};
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(rb_session_create(m, &p, &f[i].s, &err), RB_OK);
    rb_pool_stats ps0;
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps0), RB_OK);
    /* the weights and one conversation's KV: the two do not fit */
    pool_trimmer tr = {pool, ps0.weights_bytes + ps0.sessions_bytes + conv_kv, 0};
    race(feed_rewind, &f[0], &f[1], pool_trim_loop, &tr);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(f[i].st, RB_OK);
        CHECK_EQ_INT(f[i].mismatches, 0);
        CHECK_EQ_INT(f[i].n_checked, 3 * TURNS - 2);
    }
    CHECK(tr.n_calls > 0);
    rb_pool_stats ps;
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    printf("pool trims residency: %d pool calls from a third thread while 2 sessions fed "
           "and rewound (%d + %d feeds compared, identical); %llu trims posted, %.1f KiB "
           "trimmed\n", tr.n_calls, f[0].n_checked, f[1].n_checked,
           (unsigned long long)ps.n_trims_posted, (double)ps.trimmed_bytes / 1024.0);

    /* both paths, in order: every page back first (replay the last turn) */
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(rb_session_rewind(f[i].s, (TURNS - 1) * TURN), RB_OK);
        CHECK_EQ_INT(feed_check(&f[i], TURNS - 1), 0);
    }
    const uint64_t kv0 = kv_ram(f[0].s), kv1 = kv_ram(f[1].s);
    CHECK(kv0 > 0 && kv1 > 0);
    rb_session_debug_hold(f[0].s); /* this thread holds session 0 */
    trim_once once = {pool, RB_TRIM_MODERATE};
    pthread_t t1;
    pthread_create(&t1, NULL, pool_trim_once, &once);
    pthread_join(t1, NULL);
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps0), RB_OK);
    CHECK_EQ_U64(ps0.n_trims_posted, ps.n_trims_posted + 1); /* session 0's */
    CHECK_EQ_U64(kv_ram(f[0].s), kv0);                       /* untouched while held */
    CHECK(kv_ram(f[1].s) < kv1);                             /* idle: trimmed at once */
    rb_session_debug_release(f[0].s); /* serves the request */
    CHECK(kv_ram(f[0].s) < kv0);
    for (int i = 0; i < 2; i++) { /* and the logits are still the reference's */
        CHECK_EQ_INT(rb_session_rewind(f[i].s, (TURNS - 1) * TURN), RB_OK);
        CHECK_EQ_INT(feed_check(&f[i], TURNS - 1), 0);
        CHECK_EQ_INT(f[i].mismatches, 0);
    }
    rb_pool_destroy(pool);
    for (int i = 0; i < 2; i++)
        rb_session_destroy(f[i].s);
    rb_model_close(m);
}

/* ---- restoring ahead of time (rb_session_prefetch, rb_pool_prefetch_next) --- */

/* Feeds turns [0, n) of conversation k into s. */
static void feed_turns(rb_session *s, int k, int n)
{
    for (int t = 0; t < n; t++)
        CHECK_EQ_INT(rb_session_feed(s, refs[k].toks + t * TURN, TURN, NULL), RB_OK);
}

/* Waits (up to 10 s) until s's open prefetch has nothing left to bring. */
static void wait_prefetch(rb_session *s)
{
    const struct timespec ms = {0, 1000000};
    rb_session_stats st;
    for (int i = 0; i < 10000; i++) {
        rb_session_get_stats(s, &st);
        if (st.prefetch_pending == 0)
            return;
        nanosleep(&ms, NULL);
    }
    CHECK(!"the prefetch never finished");
}

static uint32_t pages_out(rb_session *s)
{
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    return st.n_kv_pages[RB_TIER_STORED] + st.n_kv_pages[RB_TIER_COMPRESSED];
}

/* The budget's trims level the members: three background conversations
 * over a budget one conversation short each give part of theirs (their
 * last layers), none gives all of it, as least-recently-used-first would;
 * and each one's next turn still gives the reference's logits. */
/* A pool of the test model and three background sessions in it, each fed
 * all turns of its conversation but the last; NULL when one could not be
 * created (checked). */
static rb_pool *three_conversations(rb_model **m, rb_session *s[3])
{
    rb_error err;
    rb_pool *pool = open_pool(m);
    rb_session_params p = params(1);
    p.pool = pool;
    p.priority = RB_PRIORITY_BACKGROUND;
    for (int i = 0; i < 3; i++) {
        s[i] = NULL;
        CHECK_EQ_INT(rb_session_create(*m, &p, &s[i], &err), RB_OK);
        if (!s[i])
            return NULL;
        feed_turns(s[i], i, TURNS - 1);
    }
    return pool;
}

static void test_leveled_trim(void)
{
    rb_model *m = NULL;
    rb_session *s[3];
    rb_pool *pool = three_conversations(&m, s);
    if (!pool)
        return;
    for (int i = 0; i < 3; i++) {
        /* set to the background while idle: its run state goes (the
           logits stay), and comes back with its next feed (below) */
        rb_session_stats a, b;
        rb_session_get_stats(s[i], &a);
        CHECK_EQ_INT(rb_session_set_priority(s[i], RB_PRIORITY_BACKGROUND), RB_OK);
        rb_session_get_stats(s[i], &b);
        CHECK_EQ_U64(b.scratch_bytes, (uint64_t)n_vocab * sizeof(float));
        CHECK(a.scratch_bytes > b.scratch_bytes);
        CHECK(!memcmp(rb_session_get_logits(s[i]), refs[i].logits[TURNS - 2],
                      n_vocab * sizeof(float)));
    }
    rb_pool_stats ps;
    rb_pool_get_stats(pool, &ps);
    const uint64_t kv0 = kv_ram(s[0]);
    CHECK_EQ_INT(rb_pool_set_budget(pool, ps.total_bytes - kv0), RB_OK);
    uint32_t out[3], total_out = 0, min_out = UINT32_MAX, max_out = 0;
    rb_session_stats st;
    rb_session_get_stats(s[0], &st);
    const uint32_t pages = st.n_kv_pages[RB_TIER_RESIDENT] + pages_out(s[0]);
    for (int i = 0; i < 3; i++) {
        out[i] = pages_out(s[i]);
        total_out += out[i];
        min_out = out[i] < min_out ? out[i] : min_out;
        max_out = out[i] > max_out ? out[i] : max_out;
    }
    CHECK(total_out >= pages);  /* a conversation's worth went */
    CHECK(min_out >= 1);        /* from each */
    CHECK(max_out < pages);     /* and none gave all its pages */
    CHECK(total_out <= pages + 1); /* (the store's index grew a little) */
    rb_pool_get_stats(pool, &ps);
    CHECK(ps.total_bytes <= ps.budget_bytes);
    CHECK_EQ_INT(rb_pool_set_budget(pool, 0), RB_OK);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(rb_session_feed(s[i], refs[i].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
        rb_session_get_stats(s[i], &st);
        CHECK(st.scratch_bytes > (uint64_t)n_vocab * sizeof(float)); /* back */
        CHECK(!memcmp(rb_session_get_logits(s[i]), refs[i].logits[TURNS - 1],
                      n_vocab * sizeof(float)));
    }
    printf("leveled trim: a conversation's %u pages came from 3 members as %u + %u + %u; "
           "logits identical after\n", pages, out[0], out[1], out[2]);
    rb_pool_destroy(pool);
    for (int i = 0; i < 3; i++)
        rb_session_destroy(s[i]);
    rb_model_close(m);
}

/* A session trimmed completely (its KV to the RAM codec or storage, the
 * model's weights released) is prefetched whole: every page and layer is
 * back before its next feed, which then restores nothing, and its logits
 * are a never-trimmed session's, bit for bit. */
static void test_prefetch_full(void)
{
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    rb_session_params p = params(1);
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    feed_turns(s, 0, TURNS - 1);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    const uint32_t out = pages_out(s);
    CHECK(out > 0);
    CHECK(st.n_layers_weights_evicted > 0);
    uint64_t planned = 0;
    CHECK_EQ_INT(rb_session_prefetch(s, &planned), RB_OK);
    CHECK(planned > 0);
    wait_prefetch(s);
    rb_session_get_stats(s, &st);
    CHECK_EQ_U64(pages_out(s), 0);
    CHECK_EQ_INT(st.n_layers_weights_evicted, 0);
    CHECK_EQ_U64(st.n_prefetches, 1);
    CHECK_EQ_U64(st.prefetch_pages, out);
    CHECK(st.prefetch_bytes >= (uint64_t)out * (conv_kv / (out ? out : 1)) / 2);
    uint64_t again = 1;
    CHECK_EQ_INT(rb_session_prefetch(s, &again), RB_OK); /* open: nothing more */
    CHECK_EQ_U64(again, 0);
    CHECK_EQ_INT(rb_session_feed(s, refs[0].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
    rb_session_get_stats(s, &st);
    CHECK_EQ_U64(st.restore_bytes_io + st.restore_bytes_decoded, 0);
    CHECK_EQ_U64(st.n_prefetch_cancelled, 0);
    CHECK_EQ_INT(st.prefetch_pending, 0);
    CHECK(!memcmp(rb_session_get_logits(s), refs[0].logits[TURNS - 1],
                  n_vocab * sizeof(float)));
    printf("prefetch full: %u pages and the released layers (%llu bytes planned, %llu "
           "brought) before the feed; the feed restored 0 bytes, logits identical\n",
           out, (unsigned long long)planned, (unsigned long long)st.prefetch_bytes);
    /* a server's admit: foreground (its restore begins), then at once a
       rewind to the common prefix; the prefetch ends cleanly and the
       replayed turn is exact */
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_set_priority(s, RB_PRIORITY_FOREGROUND), RB_OK);
    CHECK_EQ_INT(rb_session_rewind(s, (TURNS - 1) * TURN), RB_OK);
    rb_session_get_stats(s, &st);
    CHECK_EQ_INT(st.prefetch_pending, 0);
    CHECK_EQ_U64(st.n_prefetches, 2);
    CHECK_EQ_INT(rb_session_feed(s, refs[0].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
    CHECK(!memcmp(rb_session_get_logits(s), refs[0].logits[TURNS - 1],
                  n_vocab * sizeof(float)));
    rb_session_destroy(s);
    rb_model_close(m);
}

/* Under a budget with room for about two of a session's four pages, the
 * pool's prefetch brings the first layers' pages and no more, trims
 * nothing (the other session keeps its KV), and the feed restores the
 * rest: the logits are still the reference's. Then a foreground session
 * with no room makes it from the background session, never from another
 * foreground one. */
static void test_prefetch_budget(void)
{
    rb_model *m = NULL;
    rb_error err;
    rb_pool *pool = open_pool(&m);
    rb_session_params p = params(1);
    p.pool = pool;
    p.priority = RB_PRIORITY_BACKGROUND;
    rb_session *a = NULL, *c = NULL, *d = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &a, &err), RB_OK);
    CHECK_EQ_INT(rb_session_create(m, &p, &c, &err), RB_OK);
    p.priority = RB_PRIORITY_FOREGROUND;
    CHECK_EQ_INT(rb_session_create(m, &p, &d, &err), RB_OK);
    feed_turns(a, 0, TURNS - 1);
    feed_turns(c, 1, TURNS - 1);
    feed_turns(d, 2, TURNS - 1);
    /* the pool's trim: a is the least recently used background session;
       its KV goes to storage, the weights stay */
    CHECK_EQ_INT(rb_pool_trim(pool, conv_kv, RB_TRIM_BYTES, NULL), RB_OK);
    const uint32_t out = pages_out(a);
    CHECK(out >= 3);
    rb_session_stats st;
    rb_session_get_stats(c, &st);
    const uint64_t page = st.kv_raw_bytes / st.n_kv_pages[RB_TIER_RESIDENT];
    rb_pool_stats ps;
    rb_pool_get_stats(pool, &ps);
    const uint64_t budget = ps.total_bytes + 2 * page + page / 2;
    CHECK_EQ_INT(rb_pool_set_budget(pool, budget), RB_OK);
    const uint64_t kv_c = kv_ram(c), kv_d = kv_ram(d);
    const uint64_t trimmed0 = ps.trimmed_bytes;

    rb_session *picked = NULL;
    uint64_t planned = 0;
    CHECK_EQ_INT(rb_pool_prefetch_next(pool, &picked, &planned), RB_OK);
    CHECK(picked == a); /* the only one with something out of RAM */
    CHECK(planned > 0 && planned <= 2 * page + page / 2);
    wait_prefetch(a);
    rb_session_get_stats(a, &st);
    CHECK_EQ_U64(st.prefetch_pages, 2);
    CHECK_EQ_U64(pages_out(a), out - 2);
    CHECK_EQ_U64(kv_ram(c), kv_c); /* nothing trimmed for it */
    CHECK_EQ_U64(kv_ram(d), kv_d);
    rb_pool_get_stats(pool, &ps);
    CHECK(ps.total_bytes <= budget);
    CHECK_EQ_U64(ps.n_prefetches, 1);
    CHECK_EQ_U64(ps.prefetch_granted_bytes, planned);
    CHECK_EQ_U64(ps.prefetch_trimmed_bytes, 0);
    CHECK_EQ_U64(ps.trimmed_bytes, trimmed0);
    CHECK_EQ_INT(rb_session_feed(a, refs[0].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
    rb_session_get_stats(a, &st);
    CHECK(st.restore_bytes_io + st.restore_bytes_decoded > 0); /* the rest */
    CHECK(!memcmp(rb_session_get_logits(a), refs[0].logits[TURNS - 1],
                  n_vocab * sizeof(float)));
    printf("prefetch under a budget: %llu of %u pages' bytes planned (room for 2.5), "
           "nothing trimmed; the feed restored the rest, logits identical\n",
           (unsigned long long)planned, out);

    /* a foreground return with no room: background sessions give it */
    CHECK_EQ_INT(rb_pool_set_budget(pool, 0), RB_OK);
    CHECK_EQ_INT(rb_session_rewind(c, (TURNS - 2) * TURN), RB_OK);
    CHECK_EQ_INT(rb_session_feed(c, refs[1].toks + (TURNS - 2) * TURN, TURN, NULL), RB_OK);
    CHECK_EQ_INT(rb_pool_trim(pool, conv_kv, RB_TRIM_BYTES, NULL), RB_OK); /* a's */
    CHECK(pages_out(a) > 0);
    CHECK_EQ_U64(pages_out(c), 0);
    rb_pool_get_stats(pool, &ps);
    CHECK_EQ_INT(rb_pool_set_budget(pool, ps.total_bytes), RB_OK);
    const uint64_t kv_c2 = kv_ram(c), kv_d2 = kv_ram(d);
    CHECK(kv_c2 > 0);
    CHECK_EQ_INT(rb_session_set_priority(a, RB_PRIORITY_FOREGROUND), RB_OK);
    wait_prefetch(a);
    rb_pool_get_stats(pool, &ps);
    CHECK(ps.prefetch_trimmed_bytes > 0);
    CHECK(kv_ram(c) < kv_c2);      /* the background one gave */
    CHECK_EQ_U64(kv_ram(d), kv_d2); /* never another foreground one */
    rb_session_get_stats(a, &st);
    CHECK_EQ_U64(st.n_prefetches, 2);
    /* any trim cancels an open prefetch first; the pages that came stay valid */
    CHECK_EQ_INT(rb_session_trim(a, UINT64_MAX, RB_TRIM_BYTES, NULL), RB_OK);
    rb_session_get_stats(a, &st);
    CHECK_EQ_INT(st.prefetch_pending, 0);
    CHECK_EQ_INT(rb_session_rewind(a, (TURNS - 1) * TURN), RB_OK);
    CHECK_EQ_INT(rb_session_feed(a, refs[0].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
    CHECK(!memcmp(rb_session_get_logits(a), refs[0].logits[TURNS - 1],
                  n_vocab * sizeof(float)));
    printf("foreground prefetch: background sessions gave %llu bytes, the foreground "
           "one none\n", (unsigned long long)ps.prefetch_trimmed_bytes);
    rb_session_destroy(a);
    rb_session_destroy(c);
    rb_session_destroy(d);
    rb_pool_destroy(pool);
    rb_model_close(m);
}

/*
 * A return's restore writes into the page buffers that the budget's trims
 * of the other members freed for it (residency.h, the spare), for the
 * feed's own trims and for a foreground prefetch's: the buffers are taken
 * from the spare, the logits are a never-trimmed session's bit for bit
 * (and the trimmed members' too, after their own restores), and the pool
 * ends within its budget.
 */
static void spare_counts(rb_session *s, uint64_t *put, uint64_t *used)
{
    rb_residency_spare_counts(rb_session_debug_residency(s), put, used);
}

static void test_spare_restore(void)
{
    rb_model *m = NULL;
    rb_session *s[3];
    rb_pool *pool = three_conversations(&m, s);
    if (!pool)
        return;
    /* a foreground prefetch: s1 went out whole, the background ones give */
    CHECK_EQ_INT(rb_session_trim(s[1], UINT64_MAX, RB_TRIM_BYTES, NULL), RB_OK);
    const uint32_t out1 = pages_out(s[1]);
    CHECK(out1 >= 3);
    rb_pool_stats ps;
    rb_pool_get_stats(pool, &ps);
    CHECK_EQ_INT(rb_pool_set_budget(pool, ps.total_bytes), RB_OK);
    uint64_t put, used;
    spare_counts(s[1], &put, &used);
    CHECK_EQ_U64(put, 0);
    CHECK_EQ_INT(rb_session_set_priority(s[1], RB_PRIORITY_FOREGROUND), RB_OK);
    wait_prefetch(s[1]);
    spare_counts(s[1], &put, &used);
    CHECK(used >= 1); /* the prefetch wrote into the others' buffers */
    CHECK(used <= put);
    CHECK(put <= out1); /* never more than it brings */
    CHECK(pages_out(s[0]) + pages_out(s[2]) >= 1);
    const uint64_t used_pre = used;
    /* the feed takes the prefetch over, and the buffers it did not use */
    CHECK_EQ_INT(rb_session_feed(s[1], refs[1].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
    CHECK(!memcmp(rb_session_get_logits(s[1]), refs[1].logits[TURNS - 1],
                  n_vocab * sizeof(float)));
    spare_counts(s[1], &put, &used);
    CHECK(used_pre < out1); /* the grant left pages to the feed */
    CHECK_EQ_U64(used, out1);
    printf("spare: a foreground prefetch of %u pages took %llu of the buffers its trims "
           "freed, the feed that took it over the rest (%llu of %llu); logits identical\n",
           out1, (unsigned long long)used_pre, (unsigned long long)used,
           (unsigned long long)put);

    /* the feed: s1 and s2 back whole, s0 out whole, no room; its budget
       trim makes it */
    CHECK_EQ_INT(rb_pool_set_budget(pool, 0), RB_OK);
    for (int i = 1; i < 3; i++) {
        uint64_t planned;
        CHECK_EQ_INT(rb_session_prefetch(s[i], &planned), RB_OK);
        wait_prefetch(s[i]);
        CHECK_EQ_U64(pages_out(s[i]), 0);
    }
    CHECK_EQ_INT(rb_session_trim(s[0], UINT64_MAX, RB_TRIM_BYTES, NULL), RB_OK);
    const uint32_t out0 = pages_out(s[0]);
    rb_pool_get_stats(pool, &ps);
    CHECK_EQ_INT(rb_pool_set_budget(pool, ps.total_bytes), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s[0], refs[0].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
    CHECK(!memcmp(rb_session_get_logits(s[0]), refs[0].logits[TURNS - 1],
                  n_vocab * sizeof(float)));
    spare_counts(s[0], &put, &used);
    CHECK(used >= 1);
    CHECK(used <= put);
    CHECK(put <= out0);
    rb_pool_get_stats(pool, &ps);
    CHECK_EQ_U64(ps.over_bytes, 0);
    /* s2, whose pages went to both: its own restore is exact */
    CHECK_EQ_INT(rb_pool_set_budget(pool, 0), RB_OK);
    CHECK(pages_out(s[2]) >= 1);
    CHECK_EQ_INT(rb_session_feed(s[2], refs[2].toks + (TURNS - 1) * TURN, TURN, NULL), RB_OK);
    CHECK(!memcmp(rb_session_get_logits(s[2]), refs[2].logits[TURNS - 1],
                  n_vocab * sizeof(float)));
    printf("spare: a feed's restore of %u pages took %llu of %llu; the member that gave to "
           "both restores exactly\n", out0, (unsigned long long)used, (unsigned long long)put);
    for (int i = 0; i < 3; i++)
        rb_session_destroy(s[i]);
    rb_pool_destroy(pool);
    rb_model_close(m);
}

/* The pool picks by feeds / (1 + the others' feeds since): x fed 4 times
 * then y once then z once scores x 4/3, z 1/1, y 1/2. A session with an
 * open prefetch or nothing out of RAM is not picked. */
static void test_prefetch_order(void)
{
    rb_model *m = NULL;
    rb_error err;
    rb_pool *pool = open_pool(&m);
    rb_session_params p = params(1);
    p.pool = pool;
    rb_session *x = NULL, *y = NULL, *z = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &x, &err), RB_OK);
    CHECK_EQ_INT(rb_session_create(m, &p, &y, &err), RB_OK);
    CHECK_EQ_INT(rb_session_create(m, &p, &z, &err), RB_OK);
    feed_turns(x, 0, 4);
    feed_turns(y, 1, 1);
    feed_turns(z, 2, 1);
    rb_session *picked = (rb_session *)1;
    CHECK_EQ_INT(rb_pool_prefetch_next(pool, &picked, NULL), RB_OK);
    CHECK(picked == NULL); /* everything is resident */
    CHECK_EQ_INT(rb_pool_trim(pool, 0, RB_TRIM_MODERATE, NULL), RB_OK);
    rb_session *want[3] = {x, z, y};
    for (int i = 0; i < 3; i++) {
        uint64_t planned = 0;
        CHECK_EQ_INT(rb_pool_prefetch_next(pool, &picked, &planned), RB_OK);
        CHECK(picked == want[i]);
        CHECK(planned > 0);
    }
    CHECK_EQ_INT(rb_pool_prefetch_next(pool, &picked, NULL), RB_OK);
    CHECK(picked == NULL);
    rb_pool_stats ps;
    rb_pool_get_stats(pool, &ps);
    CHECK_EQ_U64(ps.n_prefetches, 3);
    wait_prefetch(x);
    wait_prefetch(y);
    wait_prefetch(z);
    printf("prefetch order: x (4 feeds, 2 since) before z (1, 0 since) before y (1, 1 "
           "since)\n");
    rb_session_destroy(x);
    rb_session_destroy(y);
    rb_session_destroy(z);
    rb_pool_destroy(pool);
    rb_model_close(m);
}

typedef struct prefetcher {
    rb_session **s;
    rb_pool *pool;
    int n_calls;
    uint64_t planned;
} prefetcher;

static atomic_int stop_prefetch;

static void *prefetch_loop(void *arg)
{
    prefetcher *f = arg;
    rb_test_rng r = rb_test_rng_seed(123);
    while (!atomic_load(&stop_prefetch)) {
        uint64_t planned = 0;
        uint32_t what = rb_test_rng_below(&r, 5), i = rb_test_rng_below(&r, 2);
        if (what == 0)
            rb_pool_prefetch_next(f->pool, NULL, &planned);
        else if (what == 1)
            rb_session_set_priority(f->s[i], RB_PRIORITY_FOREGROUND);
        else if (what == 2)
            rb_session_set_priority(f->s[i], RB_PRIORITY_BACKGROUND);
        else
            rb_session_prefetch(f->s[i], &planned);
        f->planned += planned;
        f->n_calls++;
        const struct timespec pause = {0, 50000};
        nanosleep(&pause, NULL);
    }
    return NULL;
}

static void *trim_both_loop(void *arg)
{
    prefetcher *f = arg;
    rb_test_rng r = rb_test_rng_seed(321);
    const struct timespec pause = {0, 100000};
    while (!atomic_load(&stop_prefetch)) {
        uint32_t what = rb_test_rng_below(&r, 4), i = rb_test_rng_below(&r, 2);
        if (what == 0)
            rb_pool_trim(f->pool, 0, RB_TRIM_MODERATE, NULL);
        else if (what == 1)
            rb_pool_trim(f->pool, conv_kv / 2, RB_TRIM_BYTES, NULL);
        else
            rb_session_trim(f->s[i], 0, (rb_trim_level)(1 + rb_test_rng_below(&r, 3)), NULL);
        f->n_calls++;
        nanosleep(&pause, NULL);
    }
    return NULL;
}

/* Prefetches (the session's, the pool's, a priority set to foreground)
 * race with trims (the session's, the pool's) and with two sessions'
 * feeds and rewinds, on four threads; every logit stays the reference's.
 * Then the same without feeds: an idle session trimmed and prefetched
 * from two threads at once ends consistent, and its next feed exact. */
static void test_prefetch_race(void)
{
    rb_model *m = NULL;
    rb_error err;
    rb_pool *pool = open_pool(&m);
    rb_session_params p = params(1);
    p.pool = pool;
    rewinder f[2] = {{NULL, 0, 0, 0, RB_OK}, {NULL, 1, 0, 0, RB_OK}};
    rb_session *s[2];
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(rb_session_create(m, &p, &f[i].s, &err), RB_OK);
        s[i] = f[i].s;
    }
    prefetcher pf = {s, pool, 0, 0}, tr = {s, pool, 0, 0};
    pthread_t th[4];
    atomic_store(&stop_prefetch, 0);
    pthread_create(&th[2], NULL, prefetch_loop, &pf);
    pthread_create(&th[3], NULL, trim_both_loop, &tr);
    pthread_create(&th[0], NULL, feed_rewind, &f[0]);
    pthread_create(&th[1], NULL, feed_rewind, &f[1]);
    pthread_join(th[0], NULL);
    pthread_join(th[1], NULL);
    atomic_store(&stop_prefetch, 1);
    pthread_join(th[2], NULL);
    pthread_join(th[3], NULL);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(f[i].st, RB_OK);
        CHECK_EQ_INT(f[i].mismatches, 0);
        CHECK_EQ_INT(f[i].n_checked, 3 * TURNS - 2);
    }
    rb_session_stats st[2];
    for (int i = 0; i < 2; i++)
        rb_session_get_stats(s[i], &st[i]);
    printf("prefetch race with feeds: %d prefetch calls (%llu bytes planned), %d trims; "
           "%llu + %llu prefetches, %llu + %llu cancelled; logits identical\n", pf.n_calls,
           (unsigned long long)pf.planned, tr.n_calls,
           (unsigned long long)st[0].n_prefetches, (unsigned long long)st[1].n_prefetches,
           (unsigned long long)st[0].n_prefetch_cancelled,
           (unsigned long long)st[1].n_prefetch_cancelled);

    /* idle sessions: prefetch against trim only */
    atomic_store(&stop_prefetch, 0);
    pf.n_calls = tr.n_calls = 0;
    pthread_create(&th[2], NULL, prefetch_loop, &pf);
    pthread_create(&th[3], NULL, trim_both_loop, &tr);
    const struct timespec run = {0, 300000000};
    nanosleep(&run, NULL);
    atomic_store(&stop_prefetch, 1);
    pthread_join(th[2], NULL);
    pthread_join(th[3], NULL);
    for (int i = 0; i < 2; i++) {
        rb_session_get_stats(s[i], &st[i]);
        CHECK_EQ_INT(rb_session_rewind(f[i].s, (TURNS - 1) * TURN), RB_OK);
        f[i].mismatches = 0;
        CHECK_EQ_INT(feed_check(&f[i], TURNS - 1), 0);
        CHECK_EQ_INT(f[i].mismatches, 0);
    }
    rb_pool_stats ps;
    rb_pool_get_stats(pool, &ps);
    printf("prefetch race, idle: %d prefetch calls, %d trims; %llu + %llu cancelled; the "
           "pool granted %llu bytes to %llu prefetches\n", pf.n_calls, tr.n_calls,
           (unsigned long long)st[0].n_prefetch_cancelled,
           (unsigned long long)st[1].n_prefetch_cancelled,
           (unsigned long long)ps.prefetch_granted_bytes, (unsigned long long)ps.n_prefetches);
    rb_pool_destroy(pool);
    for (int i = 0; i < 2; i++)
        rb_session_destroy(s[i]);
    rb_model_close(m);
}

/* ---- a randomized schedule under one budget ---------------------------------- */

static int progress_stop_after(void *ctx, rb_progress_phase phase, uint64_t done,
                               uint64_t total)
{
    (void)total;
    int *n = ctx;
    return *n > 0 && phase == RB_PROGRESS_FEED && done >= (uint64_t)*n;
}

static void test_schedule(void)
{
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    /* the budget: the weights and about two conversations' context */
    rb_model_info info;
    rb_model_get_info(m, &info);
    rb_pool *pool = NULL;
    rb_session *s[K] = {0};
    rb_session_params p = params(1);
    int stop_at = 0;
    p.progress = progress_stop_after;
    p.progress_ctx = &stop_at;
    /* the budget comes after the sessions exist: their run state counts */
    CHECK_EQ_INT(rb_pool_create(m, 0, &pool, &err), RB_OK);
    p.pool = pool;
    for (int k = 0; k < K; k++) {
        p.priority = k % 2 ? RB_PRIORITY_BACKGROUND : RB_PRIORITY_FOREGROUND;
        CHECK_EQ_INT(rb_session_create(m, &p, &s[k], &err), RB_OK);
    }
    rb_pool_stats ps;
    rb_pool_get_stats(pool, &ps);
    /* about one and a half conversations' KV besides the weights and the
       sessions' run state */
    uint64_t budget = ps.total_bytes + conv_kv * 3 / 2;
    CHECK_EQ_INT(rb_pool_set_budget(pool, budget), RB_OK);

    int turn[K] = {0};
    rb_test_rng r = rb_test_rng_seed(5);
    int n_aborts = 0, n_trims = 0, mismatches = 0, over = 0;
    for (int step = 0; step < 60; step++) {
        int k = (int)rb_test_rng_below(&r, K);
        uint32_t what = rb_test_rng_below(&r, 10);
        if (what == 0) {
            rb_session_trim(s[k], 0, (rb_trim_level)(1 + rb_test_rng_below(&r, 3)), NULL);
            n_trims++;
            continue;
        }
        if (turn[k] >= TURNS)
            continue;
        const conv_ref *cr = &refs[k];
        const int32_t *tt = cr->toks + turn[k] * TURN;
        size_t before = rb_session_n_tokens(s[k]);
        size_t want = (size_t)(turn[k] + 1) * TURN;
        if (what == 1) { /* stop after the first batch, then go on */
            stop_at = 1;
            rb_status st = rb_session_feed(s[k], tt, TURN, NULL);
            stop_at = 0;
            CHECK(st == RB_E_ABORTED);
            size_t have = rb_session_n_tokens(s[k]);
            CHECK(have >= before && have <= want);
            n_aborts++;
            CHECK_EQ_INT(rb_session_feed(s[k], cr->toks + have, want - have, NULL), RB_OK);
        } else {
            CHECK_EQ_INT(rb_session_feed(s[k], tt, TURN, NULL), RB_OK);
        }
        CHECK_EQ_U64(rb_session_n_tokens(s[k]), want);
        if (memcmp(rb_session_get_logits(s[k]), cr->logits[turn[k]], n_vocab * sizeof(float)))
            mismatches++;
        turn[k]++;
        rb_pool_get_stats(pool, &ps);
        if (ps.total_bytes > budget + budget / 20)
            over++;
    }
    CHECK_EQ_INT(mismatches, 0);
    CHECK_EQ_INT(over, 0);
    rb_pool_get_stats(pool, &ps);
    CHECK(ps.trimmed_bytes > 0); /* the budget made the pool work */
    /* the sessions' KV meets the budget (to storage, compressed pages too):
       the weights every feed reads stay */
    CHECK_EQ_U64(ps.weights_released_bytes, 0);
    printf("schedule: budget %llu (a conversation's KV %llu): %d aborts, %d trims, pool "
           "trimmed %llu bytes, weights released %llu, %llu enforcements\n",
           (unsigned long long)budget, (unsigned long long)conv_kv, n_aborts, n_trims,
           (unsigned long long)ps.trimmed_bytes, (unsigned long long)ps.weights_released_bytes,
           (unsigned long long)ps.n_enforcements);
    for (int k = 0; k < K; k++)
        rb_session_destroy(s[k]);
    rb_pool_destroy(pool);
    rb_model_close(m);
}

/* ---- an abort from another thread -------------------------------------------- */

/* Both outcomes of the race between an abort and the feed, each made
 * certain. During: the feed's progress callback, after its first batch,
 * lets the other thread post the abort and waits until it has, so the feed
 * must stop at its next boundary with exactly the first batch kept. After:
 * the feed has returned when the other thread posts it, so the next feed
 * must be refused whole. Either way the conversation then goes on to the
 * logits of a session never aborted. */
typedef struct abort_race {
    rb_session *s;
    atomic_int go;      /* the feed is past its first batch: post it now */
    atomic_int posted;  /* the abort is posted */
} abort_race;

static void *abort_when_told(void *arg)
{
    abort_race *j = arg;
    while (!atomic_load(&j->go))
        ;
    rb_session_abort(j->s);
    atomic_store(&j->posted, 1);
    return NULL;
}

static int progress_hold_for_abort(void *ctx, rb_progress_phase phase, uint64_t done,
                                   uint64_t total)
{
    (void)done, (void)total;
    abort_race *j = ctx;
    if (phase == RB_PROGRESS_FEED && !atomic_load(&j->go)) {
        atomic_store(&j->go, 1);
        while (!atomic_load(&j->posted))
            ;
    }
    return 0;
}

static void test_abort_thread(void)
{
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    const conv_ref *cr = &refs[0];
    const size_t n = TURNS * TURN;
    for (int during = 1; during >= 0; during--) {
        abort_race j;
        atomic_init(&j.go, 0);
        atomic_init(&j.posted, 0);
        rb_session_params p = params(1);
        p.n_batch = 8;
        if (during) {
            p.progress = progress_hold_for_abort;
            p.progress_ctx = &j;
        }
        rb_session *s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
        if (!s)
            break;
        j.s = s;
        pthread_t t;
        pthread_create(&t, NULL, abort_when_told, &j);
        if (during) {
            CHECK_EQ_INT(rb_session_feed(s, cr->toks, n, NULL), RB_E_ABORTED);
            pthread_join(t, NULL);
            CHECK_EQ_U64(rb_session_n_tokens(s), 8); /* the first batch, whole */
        } else {
            CHECK_EQ_INT(rb_session_feed(s, cr->toks, n - 1, NULL), RB_OK);
            atomic_store(&j.go, 1);
            pthread_join(t, NULL);
            CHECK_EQ_INT(rb_session_feed(s, cr->toks + n - 1, 1, NULL), RB_E_ABORTED);
            CHECK_EQ_U64(rb_session_n_tokens(s), n - 1); /* nothing of it taken */
        }
        size_t have = rb_session_n_tokens(s);
        /* the abort is spent: the rest goes through */
        CHECK_EQ_INT(rb_session_feed(s, cr->toks + have, n - have, NULL), RB_OK);
        CHECK_EQ_U64(rb_session_n_tokens(s), n);
        const float *l = rb_session_get_logits(s);
        CHECK(l && memcmp(l, cr->logits[TURNS - 1], n_vocab * sizeof(float)) == 0);
        rb_session_destroy(s);
    }
    rb_model_close(m);
}

/* ---- open_saved and create at once on a fresh model ------------------------- */

typedef struct open_job {
    rb_model *model;
    pthread_barrier_t *start;
    const char *file;   /* NULL: create and feed the whole conversation */
    int k;
    int ok;
} open_job;

static void *open_or_create(void *arg)
{
    open_job *j = arg;
    rb_session_params p = params(1);
    rb_session *s = NULL;
    rb_error err;
    const conv_ref *cr = &refs[j->k];
    pthread_barrier_wait(j->start);
    rb_status st = j->file ? rb_session_open_saved(j->model, &p, j->file, &s, &err)
                           : rb_session_create(j->model, &p, &s, &err);
    if (st != RB_OK) {
        fprintf(stderr, "open_or_create: %s\n", err.message);
        return NULL;
    }
    /* turn by turn, as the references were fed (a batch's rows are
       summed in its own order) */
    for (size_t have = rb_session_n_tokens(s); st == RB_OK && have < TURNS * TURN; have += TURN)
        st = rb_session_feed(s, cr->toks + have, TURN, NULL);
    if (st != RB_OK)
        fprintf(stderr, "open_or_create: %s\n", rb_session_errmsg(s));
    const float *lg = rb_session_get_logits(s);
    j->ok = st == RB_OK && lg &&
            memcmp(lg, cr->logits[TURNS - 1], n_vocab * sizeof(float)) == 0;
    rb_session_destroy(s);
    return NULL;
}

static void test_concurrent_open(void)
{
    for (int round = 0; round < 3; round++) {
        /* the files: conversations 2 and 1 part way (each round its own:
           a session bound to a file commits every feed to it) */
        char file[600], file1[600], name[64];
        snprintf(name, sizeof name, "conv2_%d.rbs", round);
        rb_test_tmp_path(file, sizeof file, "test_pool", name);
        snprintf(name, sizeof name, "conv1_%d.rbs", round);
        rb_test_tmp_path(file1, sizeof file1, "test_pool", name);
        remove(file);
        remove(file1);
        rb_model *m = NULL;
        rb_error err;
        CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
        rb_session_params p = params(1);
        rb_session *s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
        for (int t = 0; t < 3; t++)
            CHECK_EQ_INT(rb_session_feed(s, refs[2].toks + t * TURN, TURN, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_save(s, file, 0), RB_OK);
        rb_session_destroy(s);
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
        for (int t = 0; t < 2; t++)
            CHECK_EQ_INT(rb_session_feed(s, refs[1].toks + t * TURN, TURN, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_save(s, file1, 0), RB_OK);
        rb_session_destroy(s);
        rb_model_close(m);
        /* a fresh model: two cold opens and a create at once */
        CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, 3);
        open_job j[3] = {{m, &start, file, 2, 0}, {m, &start, NULL, 3, 0},
                         {m, &start, file1, 1, 0}};
        pthread_t t[3];
        for (int i = 0; i < 3; i++)
            pthread_create(&t[i], NULL, open_or_create, &j[i]);
        for (int i = 0; i < 3; i++)
            pthread_join(t[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 0; i < 3; i++)
            CHECK(j[i].ok);
        rb_model_close(m);
    }
}

/* ---- a mapped model's complete trim ----------------------------------------- */

static void test_mapped_trim(void)
{
    rb_model *m = NULL;
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = 1;
    CHECK_EQ_INT(rb_model_open(path, &mp, &m, &err), RB_OK);
    rb_session_params p = params(1);
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    const conv_ref *cr = &refs[1];
    CHECK_EQ_INT(rb_session_feed(s, cr->toks, 2 * TURN, NULL), RB_OK);
    uint64_t freed = 0;
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, &freed), RB_OK);
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    CHECK(freed > 0);
    CHECK_EQ_U64(st.kv_raw_bytes, 0);
    CHECK_EQ_INT(rb_session_feed(s, cr->toks + 2 * TURN, TURN, NULL), RB_OK);
    CHECK(memcmp(rb_session_get_logits(s), cr->logits[2], n_vocab * sizeof(float)) == 0);
    rb_session_destroy(s);
    rb_model_close(m);
}

/* ---- the pressure monitor ------------------------------------------------------ */

static void test_pressure_watch(void)
{
    rb_model *m = NULL;
    rb_error err;
    rb_pool *pool = open_pool(&m);
    rb_pool_pressure_params pp = {.is_system_wide = 1};
    rb_status st = rb_pool_watch_pressure(pool, &pp, &err);
    if (st == RB_E_UNSUPPORTED) {
        printf("pressure: no PSI on this machine (%s)\n", err.message);
    } else {
        CHECK_EQ_INT(st, RB_OK);
        rb_pool_stats ps;
        rb_pool_get_stats(pool, &ps);
        CHECK(strstr(ps.pressure_source, "/proc/pressure/memory") != NULL);
        CHECK_EQ_INT(rb_pool_watch_pressure(pool, &pp, &err), RB_E_INVALID_ARG);
        CHECK(strstr(err.message, "already watching") != NULL);
        rb_pool_unwatch_pressure(pool);
        rb_pool_get_stats(pool, &ps);
        CHECK_EQ_INT((int)strlen(ps.pressure_source), 0);
        /* the default: the process's own cgroup, or the machine */
        st = rb_pool_watch_pressure(pool, NULL, &err);
        CHECK_EQ_INT(st, RB_OK);
        rb_pool_get_stats(pool, &ps);
        printf("pressure: watching %s\n", ps.pressure_source);
    }
    rb_pool_destroy(pool); /* stops the monitor */
    rb_model_close(m);
}

/* ---- bad input ---------------------------------------------------------------- */

static void test_errors(void)
{
    rb_model *m = NULL, *m2 = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    CHECK_EQ_INT(rb_model_open(path, NULL, &m2, &err), RB_OK);
    rb_pool *pool = NULL;
    CHECK_EQ_INT(rb_pool_create(m, 1 << 20, &pool, &err), RB_OK);
    rb_session_params p = params(1);
    p.pool = pool;
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m2, &p, &s, &err), RB_E_INVALID_ARG); /* another model */
    CHECK(strstr(err.message, "another model") != NULL);
    p.budget_bytes = 1 << 20;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG); /* two budgets */
    CHECK(strstr(err.message, "budget_bytes must be 0") != NULL);
    p.budget_bytes = 0;
    p.priority = (rb_priority)7;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_pool_trim(pool, 0, (rb_trim_level)9, NULL), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_pool_create(NULL, 0, &pool, &err), RB_E_INVALID_ARG);
    CHECK(strcmp(rb_status_name(RB_E_ABORTED), "RB_E_ABORTED") == 0);
    rb_pool_destroy(pool);
    rb_model_close(m);
    rb_model_close(m2);
}

int main(void)
{
    rb_test_tmp_path(path, sizeof path, "test_pool", "model.gguf");
    rb_test_model_spec spec = {.shape = "tiny", .n_layers = 4, .kind = "q8_0", .seed = 11};
    if (rb_test_make_model(path, &spec) != RB_OK)
        return 1;
    /* big enough that two loads overlap (7 MB) */
    rb_test_tmp_path(path_big, sizeof path_big, "test_pool", "big.gguf");
    rb_test_model_spec big = {.shape = "tiny", .n_embd = 256, .n_layers = 8, .n_head = 4,
                              .n_head_kv = 4, .n_ff = 768, .n_vocab = 4096, .kind = "q8_0",
                              .seed = 12};
    if (rb_test_make_model(path_big, &big) != RB_OK)
        return 1;
    test_concurrent_create();
    test_cross_session_trim();
    make_refs();
    test_threads();
    test_pool_trims_residency();
    test_leveled_trim();
    test_prefetch_full();
    test_prefetch_budget();
    test_spare_restore();
    test_prefetch_order();
    test_prefetch_race();
    test_schedule();
    test_abort_thread();
    test_concurrent_open();
    test_mapped_trim();
    test_pressure_watch();
    test_errors();
    return check_report();
}
