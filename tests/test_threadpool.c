/*
 * test_threadpool.c - the pool runs every job on every worker exactly once
 * with the right (ith, nth), results written by workers are visible when
 * rb_threadpool_run returns, sleeping workers wake up, and destroy is clean
 * (run under ASan / TSan in CI builds). Prints the per-job overhead.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "threadpool.h"

#define MAX_THREADS 8

typedef struct count_ctx {
    atomic_int seen[MAX_THREADS];
    atomic_int bad; /* a call with wrong nth or ith out of range */
    int expect_nth;
} count_ctx;

static void count_task(void *p, int ith, int nth)
{
    count_ctx *c = p;
    if (nth != c->expect_nth || ith < 0 || ith >= nth || ith >= MAX_THREADS) {
        atomic_fetch_add(&c->bad, 1);
        return;
    }
    atomic_fetch_add_explicit(&c->seen[ith], 1, memory_order_relaxed);
}

/* Plain (non-atomic) writes by the workers, read by the caller after run:
 * the pool's completion must order them (TSan checks this). */
typedef struct sum_ctx {
    const int64_t *x;
    int64_t n;
    int64_t partial[MAX_THREADS];
} sum_ctx;

static void sum_task(void *p, int ith, int nth)
{
    sum_ctx *c = p;
    int64_t s = 0;
    for (int64_t i = ith; i < c->n; i += nth)
        s += c->x[i];
    c->partial[ith] = s;
}

static void noop_task(void *p, int ith, int nth)
{
    (void)p;
    (void)ith;
    (void)nth;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void test_threads(int n_threads)
{
    rb_threadpool *pool = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_threadpool_create(n_threads, &pool, &err), RB_OK);
    if (!pool)
        return;
    CHECK_EQ_INT(rb_threadpool_n_threads(pool), n_threads);

    /* every job: each worker exactly once */
    int bad_jobs = 0;
    for (int job = 0; job < 3000; job++) {
        count_ctx c;
        for (int i = 0; i < MAX_THREADS; i++)
            atomic_init(&c.seen[i], 0);
        atomic_init(&c.bad, 0);
        c.expect_nth = n_threads;
        rb_threadpool_run(pool, count_task, &c);
        int ok = atomic_load(&c.bad) == 0;
        for (int i = 0; i < MAX_THREADS; i++)
            ok &= atomic_load(&c.seen[i]) == (i < n_threads ? 1 : 0);
        bad_jobs += !ok;
        if (job % 1000 == 999)
            sleep_ms(4); /* longer than the spin: the workers go to sleep */
    }
    CHECK_EQ_INT(bad_jobs, 0);

    /* results of plain writes */
    enum { N = 10007 };
    int64_t *x = malloc(N * sizeof *x);
    int64_t want = 0;
    for (int64_t i = 0; i < N; i++) {
        x[i] = (i * 7919) % 1000 - 300;
        want += x[i];
    }
    int wrong = 0;
    for (int rep = 0; rep < 500; rep++) {
        sum_ctx c = {.x = x, .n = N};
        rb_threadpool_run(pool, sum_task, &c);
        int64_t got = 0;
        for (int i = 0; i < n_threads; i++)
            got += c.partial[i];
        wrong += got != want;
    }
    CHECK_EQ_INT(wrong, 0);
    free(x);

    /* overhead of an empty job while the workers spin */
    const int n_jobs = 20000;
    rb_threadpool_run(pool, noop_task, NULL);
    double t0 = now_s();
    for (int i = 0; i < n_jobs; i++)
        rb_threadpool_run(pool, noop_task, NULL);
    double us = (now_s() - t0) * 1e6 / n_jobs;
    /* and one wake from the condvar */
    sleep_ms(5);
    t0 = now_s();
    rb_threadpool_run(pool, noop_task, NULL);
    double wake_us = (now_s() - t0) * 1e6;
    fprintf(stderr, "overhead: threads %d empty job %.2f us (spinning), %.1f us (woken)\n",
            n_threads, us, wake_us);

    rb_threadpool_destroy(pool);
}

/* Each worker writes its own scratch slot while a job runs; the caller's
 * slot (n_threads) is read by the job. */
typedef struct scratch_ctx {
    rb_threadpool *pool;
    const unsigned char *shared;
    int ok[8];
} scratch_ctx;

static void scratch_task(void *ctx, int ith, int nth)
{
    scratch_ctx *c = ctx;
    (void)nth;
    unsigned char *mine = rb_threadpool_scratch(c->pool, ith, 4096 + 64 * (size_t)ith);
    int ok = mine != NULL && ((uintptr_t)mine % 64) == 0;
    if (mine)
        memset(mine, ith + 1, 4096 + 64 * (size_t)ith);
    for (int i = 0; i < 100; i++)
        ok &= c->shared[i] == 0xab;
    c->ok[ith] = ok;
}

static void test_scratch(int n_threads)
{
    rb_threadpool *pool = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_threadpool_create(n_threads, &pool, &err), RB_OK);
    CHECK(rb_threadpool_scratch(NULL, 0, 16) == NULL);
    CHECK(rb_threadpool_scratch(pool, -1, 16) == NULL);
    CHECK(rb_threadpool_scratch(pool, n_threads + 1, 16) == NULL);
    CHECK(rb_threadpool_scratch(pool, 0, SIZE_MAX) == NULL);
    unsigned char *shared = rb_threadpool_scratch(pool, n_threads, 100);
    CHECK(shared != NULL);
    memset(shared, 0xab, 100);
    /* a smaller request keeps the block; a larger one may move it */
    CHECK(rb_threadpool_scratch(pool, n_threads, 50) == shared);
    scratch_ctx c = {.pool = pool, .shared = shared};
    for (int round = 0; round < 3; round++) {
        memset(c.ok, 0, sizeof c.ok);
        rb_threadpool_run(pool, scratch_task, &c);
        for (int i = 0; i < n_threads; i++)
            CHECK_EQ_INT(c.ok[i], 1);
    }
    /* the slots are distinct and hold what their worker wrote */
    for (int i = 0; i < n_threads; i++) {
        const unsigned char *p = rb_threadpool_scratch(pool, i, 16);
        CHECK(p != NULL && p[0] == i + 1 && p[4095] == i + 1);
    }
    rb_threadpool_destroy(pool);
}

int main(void)
{
    rb_threadpool *pool = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_threadpool_create(0, &pool, &err), RB_E_INVALID_ARG);
    CHECK(pool == NULL);
    CHECK_CONTAINS(err.message, "n_threads");
    rb_threadpool_destroy(NULL);

    for (int n = 1; n <= 4; n++)
        test_threads(n);
    for (int n = 1; n <= 4; n++)
        test_scratch(n);

    /* create and destroy without running anything (workers may be asleep or
     * not yet started) */
    for (int i = 0; i < 20; i++) {
        CHECK_EQ_INT(rb_threadpool_create(1 + i % 4, &pool, &err), RB_OK);
        rb_threadpool_destroy(pool);
    }
    return check_report();
}
