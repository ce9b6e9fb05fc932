/*
 * session_internal.h - struct rb_session, for the two files at the top of
 * src/session/: session.c (the public session calls) and session_multi.c
 * (rb_session_decode_multi, which runs the feed steps below for several
 * sessions in one forward pass). Nothing else includes it: the memory
 * wiring (session_memory.h) and the file binding (session_file.h) have
 * structs of their own, embedded here, and never call back; tools, tests,
 * benchmarks and fuzzers use session_debug.h.
 *
 * The files of the folder, top to bottom (check_layout checks that no
 * include or call goes back up):
 *   session_multi.c  -> session.c
 *   session.c        -> session_file.c, session_memory.c
 *   session_file.c   -> session_writer.c, session_memory.c (its residency)
 *   session_memory.c -> src/memory (pool, residency, wcache, store)
 */
#ifndef RB_SESSION_INTERNAL_H
#define RB_SESSION_INTERNAL_H

#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "rebound.h"
#include "rebound_experimental.h"
#include "session_file.h"
#include "session_memory.h"
#include "threadpool.h"

struct rb_session {
    rb_model *model;
    rb_threadpool *pool;
    rb_forward fwd;
    rb_kvcache kv;
    int32_t *tokens;        /* n_ctx entries */
    size_t n_tokens;
    size_t n_kv_valid;      /* positions with K/V in some tier (<= n_tokens) */
    float *logits;          /* n_vocab: the last token's */
    int has_logits;
    rb_error err;           /* the last failed call's (the thread using the
                               session; a trim's goes elsewhere: session.c) */
    rb_session_params params;   /* .experimental points to exp */
    rb_experimental_params exp; /* the caller's copy, or the defaults */
    int weights_claim;      /* on the model's weights: 0 none, 1 shared, 2 streaming */
    uint32_t recomputed_tokens; /* by the last feed */
    rb_session_mem mem;     /* the memory wiring (session_memory.h) */
    rb_session_file file;   /* the session file (session_file.h) */
};

/*
 * A feed in steps, for rb_session_decode_multi (session_multi.c), which
 * runs the new tokens of several sessions in one forward pass (the
 * session held throughout):
 *   begin     validates (tokens, context room; the session is unchanged on
 *             an error);
 *   prepare   one attempt up to the new tokens: re-balances a streaming
 *             weight cache, begins (or joins) the restore, recomputes
 *             positions whose K/V is gone; ready = 1 when the new tokens
 *             can run now; an error ends the feed;
 *   run       the new tokens (rb_session_feed's way), setting st, stopped
 *             and done_new; the multi pass sets them for its sessions;
 *   finish    ends the restore; done = 1: the feed is over with the status
 *             returned (success: tokens appended, logits kept, window pages
 *             released, the file's commit handed over, the budget enforced);
 *             done = 0: another attempt (damaged pages, a stopped pass; a
 *             trim served at a stop keeps the tokens that completed).
 * rb_session_feed = begin, then continue (prepare, run, finish until done).
 */
typedef struct rb_feed {
    const int32_t *tokens;  /* the caller's, n of them */
    size_t n;
    float *logits;          /* the caller's (n rows), or NULL */
    size_t fed;             /* of the new tokens, appended already (a stop between batches) */
    size_t kv_valid;        /* this attempt's: positions whose K/V exists in some tier */
    uint32_t damaged;       /* the last restore's first damaged position */
    int attempt;
    int ready;              /* prepare: the new tokens can run */
    int stopped;            /* a gate stopped the pass */
    size_t done_re, done_new; /* tokens of completed batches: recomputed, new */
    rb_status st;           /* the attempt's compute status */
} rb_feed;

rb_status rb_session_feed_begin(rb_session *s, const int32_t *tokens, size_t n, float *logits,
                                rb_feed *fd);
rb_status rb_session_feed_prepare(rb_session *s, rb_feed *fd);
void rb_session_feed_run(rb_session *s, rb_feed *fd);
rb_status rb_session_feed_finish(rb_session *s, rb_feed *fd, int *done);
rb_status rb_session_feed_continue(rb_session *s, rb_feed *fd);
/* The error of a pass whose nonfinite_layer is layer (>= 0), at pos. */
rb_status rb_session_nonfinite_error(rb_session *s, int32_t layer, uint32_t pos);

/* A public call takes the session (waits for another call on it) and lets
 * it go (serving the trims posted meanwhile). */
void rb_session_enter(rb_session *s);
void rb_session_leave(rb_session *s);

#endif
