/*
 * session_writer.h - the session file's storage worker: commits run on a
 * thread of their own, behind the feeds (write-behind), so that a token
 * never waits for the storage.
 *
 * One commit runs at a time. A commit submitted while one runs becomes the
 * pending one; a later submission replaces it (it coalesces: the newer
 * state holds everything the older one did). Submitting copies the job
 * (and its blob) and returns: it never waits for I/O, only for the
 * writer's mutex, which no one holds across I/O.
 *
 * What a job may read while it runs is the caller's contract (for the
 * session: tokens below job.n_tokens never change until the caller waits,
 * and pages are pinned at the residency manager).
 */
#ifndef RB_SESSION_WRITER_H
#define RB_SESSION_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

typedef struct rb_commit_job {
    size_t n_tokens;        /* the state: tokens [0, n_tokens) */
    uint64_t epoch;         /* the residency epoch when it was submitted */
    uint64_t writes;        /* and its count of writes (rb_residency_writes) */
    int fsync;
    const uint8_t *blob;    /* the writer's copy while the job runs */
    size_t blob_n;
    size_t n_shared;        /* tokens [0, n_shared) are pages shared with
                               another session (rb_sessfile_commit_shared) */
} rb_commit_job;

/* Runs a job on the writer thread; a failure is kept (rb_session_writer_
 * take_error), never retried: the next job commits a newer state. */
typedef rb_status (*rb_commit_fn)(void *ctx, const rb_commit_job *job, rb_error *err);

typedef struct rb_session_writer_stats {
    uint64_t n_submitted;   /* jobs handed over */
    uint64_t n_started;     /* jobs taken by the thread */
    uint64_t n_run;         /* jobs that ran to their end */
    uint64_t n_coalesced;   /* pending jobs a later one replaced */
    uint64_t n_overlapped;  /* submitted while a job was running */
    uint64_t n_contended;   /* submits that found the mutex taken (the worker
                               swapping jobs: no I/O is ever under it) */
    uint64_t n_failed;
    double run_s;           /* time spent running jobs, in all */
} rb_session_writer_stats;

typedef struct rb_session_writer rb_session_writer;

/* Starts the thread. Errors: RB_E_NOMEM, RB_E_IO (thread). */
rb_status rb_session_writer_create(rb_commit_fn fn, void *ctx, rb_session_writer **out,
                                   rb_error *err);
/* Drains (the pending job runs), then stops the thread. NULL is a no-op. */
void rb_session_writer_destroy(rb_session_writer *w);

/* Hands a job over (blob copied). RB_E_NOMEM when the blob cannot be
 * copied (the job is not taken). Thread: one submitter at a time. */
rb_status rb_session_writer_submit(rb_session_writer *w, const rb_commit_job *job);

/* Returns when no job runs and none is pending; drop_pending: a pending
 * job is discarded instead of run (the caller commits a newer state). */
void rb_session_writer_wait(rb_session_writer *w, int drop_pending);

/* 1 and *err when a job failed since the last call, else 0. */
int rb_session_writer_take_error(rb_session_writer *w, rb_error *err);

void rb_session_writer_get_stats(rb_session_writer *w, rb_session_writer_stats *out);

#endif
