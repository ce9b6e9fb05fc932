/*
 * session_writer.c - the storage worker of a session file (contract in
 * session_writer.h).
 *
 * Memory: two job slots that swap roles (the pending one the submitter
 * fills, the running one the thread reads), each with a blob buffer grown
 * to the largest blob seen; nothing per job.
 *
 * Locking: `mu` guards every field below it in the struct. The thread
 * holds it only to take a job and to publish its result, never while the
 * job runs; the running slot belongs to the thread from the swap until it
 * publishes `is_running = 0`.
 */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "session_writer.h"
#include "status.h"
#include "throttle.h"

typedef struct job_slot {
    rb_commit_job job;
    uint8_t *blob;
    size_t blob_cap;
} job_slot;

struct rb_session_writer {
    rb_commit_fn fn;
    void *ctx;
    pthread_t thread;
    int is_started;

    pthread_mutex_t mu;
    pthread_cond_t cv_work;   /* a job is pending, or stop */
    pthread_cond_t cv_idle;   /* a job finished */
    job_slot slots[2];
    job_slot *pending, *running;
    int has_pending, is_running, stop;
    uint64_t n_failed_taken;
    rb_error last_err;
    rb_session_writer_stats st;
};

static void *writer_main(void *arg)
{
    rb_session_writer *w = arg;
#ifdef SCHED_BATCH
    /* A batch thread never preempts the thread that wakes it: at the
       normal policy the feed's wake-up handed its CPU to the commit (a
       hand-over of 40-90 us instead of 5-13 us on 2 loaded cores, and
       milliseconds when other processes took the CPU meanwhile); its
       share of CPU and its I/O priority stay normal, so a trim or a save
       waiting for it is not starved. */
    struct sched_param sp = {0};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
#endif
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->has_pending && !w->stop)
            pthread_cond_wait(&w->cv_work, &w->mu);
        if (!w->has_pending) /* stop, and nothing left to drain */
            break;
        job_slot *j = w->pending;
        w->pending = w->running;
        w->running = j;
        w->has_pending = 0;
        w->is_running = 1;
        w->st.n_started++;
        pthread_mutex_unlock(&w->mu);

        rb_error err = {0};
        double t0 = rb_throttle_now_s();
        rb_status rc = w->fn(w->ctx, &j->job, &err);
        double t1 = rb_throttle_now_s();

        pthread_mutex_lock(&w->mu);
        w->is_running = 0;
        w->st.n_run++;
        w->st.run_s += t1 - t0;
        if (rc != RB_OK) {
            w->st.n_failed++;
            w->last_err = err;
            if (!w->last_err.status)
                w->last_err.status = rc;
        }
        pthread_cond_broadcast(&w->cv_idle);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

rb_status rb_session_writer_create(rb_commit_fn fn, void *ctx, rb_session_writer **out,
                                   rb_error *err)
{
    rb_session_writer *w = calloc(1, sizeof *w);
    if (!w)
        return rb_error_set(err, RB_E_NOMEM, "session writer: out of memory");
    w->fn = fn;
    w->ctx = ctx;
    w->pending = &w->slots[0];
    w->running = &w->slots[1];
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_idle, NULL);
    if (pthread_create(&w->thread, NULL, writer_main, w) != 0) {
        rb_session_writer_destroy(w);
        return rb_error_set(err, RB_E_IO, "session writer: cannot start its thread");
    }
    w->is_started = 1;
    *out = w;
    return RB_OK;
}

void rb_session_writer_destroy(rb_session_writer *w)
{
    if (!w)
        return;
    if (w->is_started) {
        pthread_mutex_lock(&w->mu);
        w->stop = 1;
        pthread_cond_broadcast(&w->cv_work);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv_work);
    pthread_cond_destroy(&w->cv_idle);
    free(w->slots[0].blob);
    free(w->slots[1].blob);
    free(w);
}

rb_status rb_session_writer_submit(rb_session_writer *w, const rb_commit_job *job)
{
    int is_contended = pthread_mutex_trylock(&w->mu) != 0;
    if (is_contended) /* the worker is taking or finishing a job (no I/O under mu) */
        pthread_mutex_lock(&w->mu);
    job_slot *j = w->pending; /* never the running slot: that one is swapped out */
    if (job->blob_n > j->blob_cap) {
        uint8_t *b = realloc(j->blob, job->blob_n);
        if (!b) {
            pthread_mutex_unlock(&w->mu);
            return RB_E_NOMEM;
        }
        j->blob = b;
        j->blob_cap = job->blob_n;
    }
    if (job->blob_n)
        memcpy(j->blob, job->blob, job->blob_n);
    j->job = *job;
    j->job.blob = j->blob;
    w->st.n_coalesced += (uint64_t)w->has_pending;
    w->st.n_overlapped += (uint64_t)w->is_running;
    w->st.n_submitted++;
    w->st.n_contended += (uint64_t)is_contended;
    w->has_pending = 1;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    return RB_OK;
}

void rb_session_writer_wait(rb_session_writer *w, int drop_pending)
{
    pthread_mutex_lock(&w->mu);
    if (drop_pending)
        w->has_pending = 0;
    while (w->has_pending || w->is_running)
        pthread_cond_wait(&w->cv_idle, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

int rb_session_writer_take_error(rb_session_writer *w, rb_error *err)
{
    pthread_mutex_lock(&w->mu);
    int is_new = w->st.n_failed != w->n_failed_taken;
    if (is_new) {
        w->n_failed_taken = w->st.n_failed;
        *err = w->last_err;
    }
    pthread_mutex_unlock(&w->mu);
    return is_new;
}

void rb_session_writer_get_stats(rb_session_writer *w, rb_session_writer_stats *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->st;
    pthread_mutex_unlock(&w->mu);
}
