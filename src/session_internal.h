/*
 * session_internal.h - the inside of an rb_session, for the tool code that
 * drives a session's KV cache directly (rebound kvquality round-trips every
 * resident page through the KV codec; bench_kv captures real KV pages).
 * The public API (include/rebound.h) is the way in for everything else.
 *
 * Touching kv between feeds is allowed as long as the pages' geometry is
 * kept: the forward pass reads K/V only through the page table.
 */
#ifndef RB_SESSION_INTERNAL_H
#define RB_SESSION_INTERNAL_H

#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "rebound.h"
#include "threadpool.h"

struct rb_session {
    rb_model *model;
    rb_threadpool *pool;
    rb_forward fwd;
    rb_kvcache kv;
    int32_t *tokens;        /* n_ctx entries */
    size_t n_tokens;
    float *logits;          /* n_vocab: the last token's */
    int has_logits;
    rb_error err;

    /* the memory manager (session_memory.c) */
    rb_session_params params;
    struct rb_throttle *throttle;   /* the emulated device; NULL: host as is */
    struct rb_store *store;         /* NULL: no spill tier (store_note says why) */
    char store_note[RB_ERROR_MESSAGE_MAX + 32];
    struct rb_wcache *wcache;       /* NULL: weights stay (mapped model) or stream */
    struct rb_wcache_stream *wstream; /* weight streaming under a budget; NULL: off */
    struct rb_residency *res;
    uint32_t recomputed_tokens;     /* by the last feed */
    size_t n_kv_valid;              /* positions with K/V in some tier (<= n_tokens) */

    /* the session file (session_file.c) */
    struct rb_sessfile *file;       /* NULL: not bound to a file */
    char *file_path;
    uint8_t *blob;                  /* the caller's blob, saved with the tokens */
    size_t blob_n;
    int file_fsync;
    rb_status file_status;          /* the last commit's (a full disk: RB_E_IO) */
    char file_note[RB_ERROR_MESSAGE_MAX];
    uint64_t file_commits, file_pages_written;
    double file_commit_s;
};

rb_status rb_session_create_impl(rb_model *model, const rb_session_params *params,
                                 int is_lazy_weights, rb_session **out, rb_error *err);
/* session_file.c: after a feed (commits new full pages and the tokens when
 * bound; a failure is recorded, never returned), after a rewind, at destroy */
void rb_session_file_after_feed(rb_session *s);
void rb_session_file_rewound(rb_session *s);
void rb_session_file_close(rb_session *s);

/* session_memory.c: set up / tear down the memory manager of a session
 * whose KV cache and forward state exist; the layer gate is installed.
 * is_cold: the model's layers are not read yet (a session opened from a
 * file): they are read in layer order by the first feed's restore. */
rb_status rb_session_memory_init(rb_session *s, int is_cold, rb_error *err);
void rb_session_memory_deinit(rb_session *s);
/* After a successful feed: enforces the budget (trims beyond it). */
rb_status rb_session_memory_after_feed(rb_session *s);

/* The session's KV cache (pages resident for positions [0, n_tokens)). */
static inline rb_kvcache *rb_session_kvcache(rb_session *s) { return &s->kv; }
static inline rb_model *rb_session_model(rb_session *s) { return s->model; }

#endif
/* Weights stream under a budget (rb_session_params.weights_budget_bytes,
 * or a memory budget below the model's weight bytes). */
int rb_session_wants_streaming(const rb_model *model, const rb_session_params *p);
/* Before a feed that grows the KV cache to n_pages_after pages per layer:
 * under a memory budget, the streaming weight cache gives up what the new
 * KV will take (down to its minimum; below that the KV is trimmed). */
void rb_session_memory_before_feed(rb_session *s, uint32_t n_pages_after);
/* A forward pass stopped by the weight stream's I/O error: copies it into
 * the session's error and returns it; RB_OK when the stream is fine. */
rb_status rb_session_memory_stream_error(rb_session *s);
