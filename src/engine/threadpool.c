/*
 * threadpool.c - persistent workers that run one job at a time with
 * (ith, nth), the caller being worker 0.
 *
 * What it does: creates n_threads - 1 threads once; each job is published by
 * bumping a generation counter that idle workers spin on (then sleep on a
 * condition variable); the caller runs its share and spins until a done
 * counter says every worker finished. What it does not do: no queue (one job
 * at a time, from one thread at a time), no work splitting (the job's ctx
 * owns its chunk counter, ggml-cpu.c style), no affinity.
 *
 * Layout: the two hot counters live on their own cache lines so that the
 * workers' increments of n_done do not bounce the line the idle workers are
 * spinning on:
 *
 *   line 0: n_job    generation of the last published job (caller writes)
 *   line 1: n_done   workers (not the caller) that finished the current job
 *   line 2: fn, ctx  the job, written by the caller before n_job is bumped
 *   then   : mutex / condvar / n_sleeping for the slow path; thread ids
 *
 * Memory: one malloc for the pool (rb_os_aligned_alloc, 64 B) and one for the
 * pthread_t array, both freed by rb_threadpool_destroy.
 *
 * Protocol (each worker sees every generation exactly once, because the
 * caller publishes job g+1 only after all workers reported job g done):
 *   caller: n_done = 0 (relaxed; no worker touches it between jobs)
 *           fn, ctx = job (plain stores)
 *           n_job += 1 (seq_cst: releases fn/ctx/n_done, and orders against
 *                       the load of n_sleeping below, see "sleep")
 *           if n_sleeping > 0: lock, broadcast, unlock
 *           fn(ctx, 0, nth)
 *           spin until n_done == nth - 1 (acquire: the workers' results
 *                       are visible when rb_threadpool_run returns)
 *   worker: wait until n_job != seen (acquire: sees fn, ctx)
 *           fn(ctx, ith, nth)
 *           n_done += 1 (release: publishes what the job wrote)
 *
 * Sleep: after RB_POOL_SPIN_NS of spinning a worker locks the mutex,
 * increments n_sleeping (seq_cst), rechecks n_job (seq_cst) and only then
 * waits. Against the caller's seq_cst "n_job += 1; load n_sleeping" this is
 * Dekker's pattern: either the caller sees n_sleeping > 0 and broadcasts
 * (under the mutex, so it cannot fall between the worker's check and its
 * wait), or the worker's recheck sees the new job. Cost: the fast path is
 * one atomic add and one load for the caller, no syscalls.
 *
 * Measured (2-core AMD EPYC Zen 4 VM, gcc 12 -O2, tests/test_threadpool.c
 * "overhead" line): an empty job with 2 threads ~0.5 us round trip while
 * the worker spins; ~70 us when it has to be woken from the condvar. With
 * more threads than cores every wait loop yields every 256 pauses (without
 * that, 3-4 threads on 2 cores took milliseconds per job; with it ~10-16 us).
 */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "os.h"
#include "status.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define rb_cpu_relax() _mm_pause()
#elif defined(__aarch64__)
#define rb_cpu_relax() __asm__ __volatile__("yield" ::: "memory")
#else
#define rb_cpu_relax() ((void)0)
#endif

#define RB_CACHE_LINE 64

/* How long an idle worker spins before sleeping: longer than the gap
 * between two jobs of one decode step (sampling, small ops: ~10-100 us),
 * short enough that an idle session does not burn a core for long. */
#define RB_POOL_SPIN_NS 2000000LL

struct rb_threadpool {
    alignas(RB_CACHE_LINE) atomic_int n_job; /* caller writes; workers spin */
    alignas(RB_CACHE_LINE) atomic_int n_done; /* workers add; caller spins */
    alignas(RB_CACHE_LINE) rb_task_fn fn;     /* guarded by the n_job protocol */
    void *ctx;
    atomic_int stop; /* set once by destroy, before the last n_job bump */
    alignas(RB_CACHE_LINE) pthread_mutex_t mutex; /* guards the condvar wait */
    pthread_cond_t cond;
    atomic_int n_sleeping; /* workers inside the condvar wait loop */
    int n_threads;
    int n_started; /* threads created (so destroy joins only those) */
    pthread_t *threads;
    /* rb_threadpool_scratch: n_threads + 1 slots, each owned as it says */
    void **scratch;
    size_t *scratch_bytes;
};

typedef struct rb_worker_arg {
    rb_threadpool *pool;
    int ith;
} rb_worker_arg;

static int64_t rb_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Waits until n_job differs from seen and returns its new value. */
static int rb_worker_wait(rb_threadpool *pool, int seen)
{
    int64_t start = 0;
    for (unsigned spins = 0;; spins++) {
        /* acquire: pairs with the caller's bump, so fn/ctx are visible */
        int job = atomic_load_explicit(&pool->n_job, memory_order_acquire);
        if (job != seen)
            return job;
        rb_cpu_relax();
        if ((spins & 255u) == 255u) {
            /* more threads than cores: let the one we wait for run */
            sched_yield();
            int64_t now = rb_now_ns();
            if (start == 0)
                start = now;
            else if (now - start > RB_POOL_SPIN_NS)
                break;
        }
    }
    pthread_mutex_lock(&pool->mutex);
    /* seq_cst increment then seq_cst load: see "Sleep" at the top */
    atomic_fetch_add_explicit(&pool->n_sleeping, 1, memory_order_seq_cst);
    int job;
    while ((job = atomic_load_explicit(&pool->n_job, memory_order_seq_cst)) == seen)
        pthread_cond_wait(&pool->cond, &pool->mutex);
    atomic_fetch_sub_explicit(&pool->n_sleeping, 1, memory_order_relaxed);
    pthread_mutex_unlock(&pool->mutex);
    return job;
}

static void *rb_worker_main(void *p)
{
    rb_worker_arg arg = *(rb_worker_arg *)p;
    free(p);
    rb_threadpool *pool = arg.pool;
    int seen = 0; /* n_job is 0 when the threads start */
    for (;;) {
        seen = rb_worker_wait(pool, seen);
        /* relaxed: ordered after the acquire load of n_job above */
        if (atomic_load_explicit(&pool->stop, memory_order_relaxed))
            break;
        pool->fn(pool->ctx, arg.ith, pool->n_threads);
        /* release: the job's writes happen-before the caller's acquire */
        atomic_fetch_add_explicit(&pool->n_done, 1, memory_order_release);
    }
    return NULL;
}

/* Wakes sleeping workers after n_job was bumped (seq_cst). */
static void rb_pool_wake(rb_threadpool *pool, int force)
{
    if (force || atomic_load_explicit(&pool->n_sleeping, memory_order_seq_cst) > 0) {
        pthread_mutex_lock(&pool->mutex);
        pthread_cond_broadcast(&pool->cond);
        pthread_mutex_unlock(&pool->mutex);
    }
}

static void rb_pool_stop_and_join(rb_threadpool *pool)
{
    atomic_store_explicit(&pool->stop, 1, memory_order_relaxed);
    /* seq_cst bump: releases stop; the forced wake covers sleepers */
    atomic_fetch_add_explicit(&pool->n_job, 1, memory_order_seq_cst);
    rb_pool_wake(pool, 1);
    for (int i = 0; i < pool->n_started; i++)
        pthread_join(pool->threads[i], NULL);
}

rb_status rb_threadpool_create(int n_threads, rb_threadpool **out, rb_error *err)
{
    if (n_threads < 1 || n_threads > 1024)
        return rb_error_set(err, RB_E_INVALID_ARG, "threadpool: n_threads %d not in 1..1024",
                            n_threads);
    size_t size = (sizeof(rb_threadpool) + RB_CACHE_LINE - 1) / RB_CACHE_LINE * RB_CACHE_LINE;
    rb_threadpool *pool = rb_os_aligned_alloc(RB_CACHE_LINE, size);
    if (!pool)
        return rb_error_set(err, RB_E_NOMEM, "threadpool: out of memory");
    memset(pool, 0, size);
    atomic_init(&pool->n_job, 0);
    atomic_init(&pool->n_done, 0);
    atomic_init(&pool->stop, 0);
    atomic_init(&pool->n_sleeping, 0);
    pool->n_threads = n_threads;
    pool->threads = NULL;
    pool->scratch = calloc((size_t)n_threads + 1, sizeof *pool->scratch);
    pool->scratch_bytes = calloc((size_t)n_threads + 1, sizeof *pool->scratch_bytes);
    if (!pool->scratch || !pool->scratch_bytes) {
        free(pool->scratch);
        free(pool->scratch_bytes);
        free(pool);
        return rb_error_set(err, RB_E_NOMEM, "threadpool: out of memory");
    }
    if (n_threads > 1) {
        pool->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!pool->threads) {
            free(pool->scratch);
            free(pool->scratch_bytes);
            free(pool);
            return rb_error_set(err, RB_E_NOMEM, "threadpool: out of memory");
        }
    }
    pthread_mutex_init(&pool->mutex, NULL);
    pthread_cond_init(&pool->cond, NULL);
    for (int i = 1; i < n_threads; i++) {
        rb_worker_arg *arg = malloc(sizeof *arg);
        int rc = arg ? 0 : -1;
        if (arg) {
            arg->pool = pool;
            arg->ith = i;
            rc = pthread_create(&pool->threads[i - 1], NULL, rb_worker_main, arg);
            if (rc != 0)
                free(arg);
        }
        if (rc != 0) {
            rb_pool_stop_and_join(pool);
            pthread_cond_destroy(&pool->cond);
            pthread_mutex_destroy(&pool->mutex);
            free(pool->threads);
            free(pool->scratch);
            free(pool->scratch_bytes);
            free(pool);
            if (rc < 0)
                return rb_error_set(err, RB_E_NOMEM, "threadpool: out of memory");
            return rb_error_set(err, RB_E_IO, "threadpool: pthread_create for worker %d: %s", i,
                                strerror(rc));
        }
        pool->n_started++;
    }
    *out = pool;
    return RB_OK;
}

void rb_threadpool_destroy(rb_threadpool *pool)
{
    if (!pool)
        return;
    rb_pool_stop_and_join(pool);
    pthread_cond_destroy(&pool->cond);
    pthread_mutex_destroy(&pool->mutex);
    free(pool->threads);
    for (int i = 0; i <= pool->n_threads; i++)
        free(pool->scratch[i]);
    free(pool->scratch);
    free(pool->scratch_bytes);
    free(pool);
}

void *rb_threadpool_scratch(rb_threadpool *pool, int slot, size_t bytes)
{
    if (!pool || slot < 0 || slot > pool->n_threads || bytes > SIZE_MAX / 2)
        return NULL;
    if (pool->scratch_bytes[slot] < bytes) {
        /* grown by half again, so that a run of growing requests reallocates
         * a few times only */
        size_t size = (bytes + bytes / 2 + RB_CACHE_LINE - 1) / RB_CACHE_LINE * RB_CACHE_LINE;
        void *p = rb_os_aligned_alloc(RB_CACHE_LINE, size);
        if (!p)
            return NULL;
        free(pool->scratch[slot]);
        pool->scratch[slot] = p;
        pool->scratch_bytes[slot] = size;
    }
    return pool->scratch[slot];
}

int rb_threadpool_n_threads(const rb_threadpool *pool)
{
    return pool ? pool->n_threads : 1;
}

void rb_threadpool_run(rb_threadpool *pool, rb_task_fn fn, void *ctx)
{
    if (!pool || pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    const int n_workers = pool->n_threads - 1;
    /* relaxed: every worker finished the previous job (the caller saw
     * n_done == n_workers), and the bump below releases this store */
    atomic_store_explicit(&pool->n_done, 0, memory_order_relaxed);
    pool->fn = fn;
    pool->ctx = ctx;
    /* seq_cst: releases the job, and is ordered before the n_sleeping load */
    atomic_fetch_add_explicit(&pool->n_job, 1, memory_order_seq_cst);
    rb_pool_wake(pool, 0);

    fn(ctx, 0, pool->n_threads);

    /* acquire: pairs with each worker's release increment */
    unsigned spins = 0;
    while (atomic_load_explicit(&pool->n_done, memory_order_acquire) != n_workers) {
        rb_cpu_relax();
        /* ~5-10 us of pause, then yield: with more threads than cores the
         * worker we wait for may need this core */
        if ((++spins & 255u) == 0)
            sched_yield();
    }
}
