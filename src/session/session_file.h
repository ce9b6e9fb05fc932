/*
 * session_file.h - a session's binding to its session file
 * (session_file.c): the commits after feeds (write-behind on the storage
 * worker), an explicit save or snapshot, the state an open reads, and the
 * file's part of the stats.
 *
 * session.c embeds one rb_session_file and is the only caller; the binding
 * never calls back into session.c. It reads the session's tokens, KV
 * cache and memory wiring (the residency manager's pins and saved pages)
 * through the borrowed pointers below, set by rb_session_file_init. The
 * caller settles a restore begun at open before a save, an unbind or a
 * close (rb_session_memory_settle_restore): its workers read the file.
 *
 * Threads: the caller's thread (the session's op lock held), except the
 * storage worker, which runs one commit at a time: the fields marked
 * "commit" belong to the thread running the commit; the counters are
 * atomic because rb_session_get_stats reads them at any time.
 */
#ifndef RB_SESSION_FILE_H
#define RB_SESSION_FILE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "model.h"
#include "os.h"
#include "rebound.h"
#include "sessfile.h"
#include "session_memory.h"
#include "session_writer.h"

typedef struct rb_session_file {
    /* borrowed (rb_session_file_init) */
    rb_model *model;
    rb_kvcache *kv;
    rb_session_mem *mem;
    const int32_t *tokens;
    uint32_t n_vocab;
    rb_error *err;                  /* the session's message */

    struct rb_sessfile *file;       /* NULL: not bound to a file */
    char *path;
    uint8_t *blob;                  /* the caller's blob, saved with the tokens */
    size_t blob_n;
    int fsync;
    int on_request;                 /* RB_SAVE_ON_REQUEST: feeds do not commit */
    uint64_t lost_tokens;           /* the open fell back to an older state: */
    char recovery[RB_ERROR_MESSAGE_MAX]; /* why ("" when it did not) */
    char note[RB_ERROR_MESSAGE_MAX]; /* the last failed commit's message */
    const struct rb_os *os;         /* the file's syscalls; NULL: the default */
    uint64_t n_handover;            /* feeds that handed a commit over */
    double handover_s, handover_max_s; /* their cost to the feed */
    struct rb_session_writer *writer; /* NULL: commits run in the caller */
    uint32_t *pinned;               /* ids of the pages the running commit wrote (commit) */
    uint32_t n_pinned;              /* (commit) */
    uint64_t epoch;                 /* the residency epoch of the running commit (commit) */
    _Atomic(rb_status) status;      /* the last commit's (a full disk: RB_E_IO) */
    _Atomic(uint64_t) commits, pages_written;
    _Atomic(uint64_t) prefix_pages; /* pages in its prefix file (rb_sessfile_base_pages) */
    _Atomic(double) commit_s;
    _Atomic(size_t) tokens_committed; /* tokens of the file's state */
} rb_session_file;

void rb_session_file_init(rb_session_file *f, rb_model *model, rb_kvcache *kv,
                          rb_session_mem *mem, const int32_t *tokens, uint32_t n_vocab,
                          rb_error *err);
/* Closes the file (the pending commit runs first) and frees the blob. */
void rb_session_file_deinit(rb_session_file *f);

/* rb_session_save's work, the session holding n_tokens (a restore begun
 * at open settled first). Errors in f->err. */
rb_status rb_session_file_save(rb_session_file *f, const char *path, unsigned flags,
                               size_t n_tokens);
/* Opens the file at path for a session being built (geometry checked,
 * the model not yet): its tokens, blob and recovery note are taken;
 * *out is the open file for the caller to read the pages it holds, then
 * bind (rb_session_file_bind) or close. */
rb_status rb_session_file_open(rb_session_file *f, const char *path, unsigned flags,
                               rb_sessfile **out, rb_error *err);
/* rb_session_file_open of the file open at fd, read only (the handle keeps
 * its own duplicate; the caller keeps fd): nothing is ever written, locked
 * or removed, so the caller reads the state back and closes it (never
 * binds it for commits). name: the file in messages. */
rb_status rb_session_file_open_fd(rb_session_file *f, int fd, const char *name, unsigned flags,
                                  rb_sessfile **out, rb_error *err);
/* Binds an open file in place of the current one (its storage worker
 * starts). On failure nothing changes and sf stays the caller's. */
rb_status rb_session_file_bind(rb_session_file *f, rb_sessfile *sf, const char *path,
                               rb_error *err);
/* The bound file was written for this model (its fingerprint). */
rb_status rb_session_file_check_model(rb_session_file *f, rb_error *err);
/* Unbinds (the pending commit runs first). */
void rb_session_file_close(rb_session_file *f);

/* After a feed: hands the commit of the new full pages and the tokens to
 * the storage worker when bound, and returns; a failure is recorded (the
 * stats, the session's message), never returned. */
void rb_session_file_after_feed(rb_session_file *f, size_t n_tokens);
/* After a rewind to n_tokens: waits for a running commit. */
void rb_session_file_rewound(rb_session_file *f, size_t n_tokens);
/* The tokens from position `from` on changed (a context shift): the file's
 * pages from there on are dropped; the next commit writes the new state. */
void rb_session_file_shifted(rb_session_file *f, size_t from);

rb_status rb_session_file_set_blob(rb_session_file *f, const void *data, size_t n);
/* The file's fields of the stats. */
void rb_session_file_fill_stats(const rb_session_file *f, rb_session_stats *out);
/* session_debug.h: waits for the storage worker's commits; its counters. */
void rb_session_file_debug_wait(rb_session_file *f);
void rb_session_file_debug_writer_stats(rb_session_file *f, rb_session_writer_stats *out);

#endif
