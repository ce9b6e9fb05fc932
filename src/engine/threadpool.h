/*
 * threadpool.h - a persistent pool of worker threads for the forward pass.
 *
 * The caller thread is worker 0; n_threads - 1 workers wait between jobs.
 * A job is one function run by every worker with (ith, nth): the shape of
 * ggml-cpu.c, where each worker takes its first chunk by thread id and then
 * claims further chunks with an atomic counter that the job's context owns.
 * rb_threadpool_run returns when every worker has finished the job.
 *
 * Decode runs ~7 jobs per layer per token (a few hundred per token), each
 * as short as ~20 us, so waking workers must cost a few microseconds: the
 * workers spin on an atomic job counter for a while before sleeping on a
 * condition variable.
 *
 * Threads: rb_threadpool_run may be called from one thread at a time.
 */
#ifndef RB_THREADPOOL_H
#define RB_THREADPOOL_H

#include "rebound.h"

typedef struct rb_threadpool rb_threadpool;

typedef void (*rb_task_fn)(void *ctx, int ith, int nth);

/* n_threads >= 1 (1: no workers, jobs run on the caller). RB_E_NOMEM or
 * RB_E_IO (thread creation failed; message in err). */
rb_status rb_threadpool_create(int n_threads, rb_threadpool **out, rb_error *err);
void rb_threadpool_destroy(rb_threadpool *pool);
int rb_threadpool_n_threads(const rb_threadpool *pool);

/* Runs fn(ctx, ith, nth) on every worker (ith = 0 on the caller). */
void rb_threadpool_run(rb_threadpool *pool, rb_task_fn fn, void *ctx);

/* Scratch memory a job's worker may use: slot 0..n_threads - 1 belongs to
 * worker ith while a job runs (no other thread touches it), slot n_threads
 * to the caller between jobs (a job may read it). At least `bytes` bytes,
 * 64-aligned, kept and reused by later calls (grown when too small, freed by
 * rb_threadpool_destroy); its contents do not survive a call that grows it.
 * NULL when pool is NULL, slot is out of range or memory ran out. */
void *rb_threadpool_scratch(rb_threadpool *pool, int slot, size_t bytes);

#endif
