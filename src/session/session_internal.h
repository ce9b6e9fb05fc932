/*
 * session_internal.h - the inside of an rb_session, for the tool code that
 * drives a session's KV cache directly (rebound kvquality round-trips every
 * resident page through the KV codec; bench_kv captures real KV pages).
 * The public API (include/rebound.h) is the way in for everything else.
 *
 * Touching kv between feeds is allowed as long as the pages' geometry is
 * kept: the forward pass reads K/V only through the page table. A page
 * restored from the spill keeps its copy there (residency.c), so a tool
 * that rewrites a page's contents after a restore must rewind past it
 * first (the tools here never trim).
 */
#ifndef RB_SESSION_INTERNAL_H
#define RB_SESSION_INTERNAL_H

#include <pthread.h>

#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "rebound.h"
#include "rebound_experimental.h"
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
    rb_session_params params;   /* .experimental points to exp; .pool is pool */
    /* the pool (session_memory.c): the session's own one (owns_pool) or
       the app's; member is the session's place in it */
    struct rb_pool *mpool;
    struct rb_pool_member *member;
    int owns_pool;
    /* the calls from any thread (session_memory.c). op_mu is held by the
       public call that uses the session (feed, rewind, shift, trim, save,
       set_restore); a trim from another thread posts a request under
       req_mu and raises `interrupt`: the holder serves it at its next
       layer boundary (a feed) or before it lets go */
    pthread_mutex_t op_mu;
    pthread_mutex_t req_mu;
    pthread_cond_t req_cv;
    int op_held;                    /* under req_mu: op_mu is held ... */
    pthread_t op_owner;             /* ... by this thread */
    uint64_t req_posted, req_served; /* under req_mu */
    uint64_t req_bytes, req_freed;
    rb_trim_level req_level;
    int req_kv_only;                /* every poster was the pool: KV only */
    int req_pending;
    _Atomic int interrupt;          /* a request someone waits for, or an abort:
                                       the feed stops at its next layer boundary */
    _Atomic int interrupt_batch;    /* a request nobody waits for (the pool's):
                                       it stops before its next batch, so
                                       sessions trimming each other cannot keep
                                       a batch from ever completing */
    _Atomic int abort_req;
    int stop_interrupt;             /* the feed's gate stopped for it */
    int grace_batch;                /* the batch after such a stop runs to its
                                       end (only an abort stops it) */
    int in_forward;                 /* a feed's restore and forward pass run */
    int held_layer;                 /* the layer whose weights the forward pass
                                       uses (rb_wcache_use), or -1 */
    rb_status gate_status;          /* a gate's own failure (weights unreadable) */
    uint32_t progress_layers;       /* restore progress: layers of the plan to go */
    rb_experimental_params exp; /* the caller's copy, or the defaults */
    struct rb_throttle *throttle;   /* the emulated device; NULL: host as is */
    double device_bw;               /* its bandwidth (bytes/s); 0: host */
    struct rb_store *store;         /* NULL: no spill tier (store_note says why) */
    char store_note[RB_ERROR_MESSAGE_MAX + 32];
    struct rb_wcache *wcache;       /* NULL: weights stay (mapped model) or stream */
    struct rb_wcache_stream *wstream; /* weight streaming under a budget; NULL: off */
    int weights_claim;              /* on the model's weights: 0 none, 1 shared, 2 streaming */
    struct rb_residency *res;
    uint32_t recomputed_tokens;     /* by the last feed */
    size_t n_kv_valid;              /* positions with K/V in some tier (<= n_tokens) */
    uint32_t window_dead_pages;     /* sliding-window layers: their pages below this
                                       hold positions no later query attends to, and
                                       are released (or will be once a restore ends) */
    uint32_t window_released_pages; /* ... and those below this are released */
    int restore_open;               /* a restore begun by rb_session_open_saved runs:
                                       the first feed joins it */
    uint32_t restore_open_from;     /* its begin_restore's recompute_from */

    /* the session file (session_file.c) */
    struct rb_sessfile *file;       /* NULL: not bound to a file */
    char *file_path;
    uint8_t *blob;                  /* the caller's blob, saved with the tokens */
    size_t blob_n;
    int file_fsync;
    uint64_t budget_over_bytes;     /* after the last feed's budget trim */
    int file_on_request;            /* RB_SAVE_ON_REQUEST: feeds do not commit */
    uint64_t file_lost_tokens;      /* the open fell back to an older state: */
    char file_recovery[RB_ERROR_MESSAGE_MAX]; /* why ("" when it did not) */
    char file_note[RB_ERROR_MESSAGE_MAX]; /* the last failed commit's message */
    const struct rb_os *file_os;    /* the file's syscalls; NULL: the default (tests
                                       slow or fail them) */
    uint64_t file_n_handover;       /* feeds that handed a commit over */
    double file_handover_s, file_handover_max_s; /* their cost to the feed */
    /* commits run on the storage worker (write-behind), or on the caller
       after it waited for the worker: the four fields below belong to the
       thread that runs the commit; the counters are atomic because
       rb_session_get_stats reads them at any time */
    struct rb_session_writer *file_writer; /* NULL: commits run in the caller */
    uint32_t *file_pinned;          /* ids of the pages the running commit wrote */
    uint32_t file_n_pinned;
    uint64_t file_epoch;            /* the residency epoch of the running commit */
    _Atomic(rb_status) file_status; /* the last commit's (a full disk: RB_E_IO) */
    _Atomic(uint64_t) file_commits, file_pages_written;
    _Atomic(double) file_commit_s;
    _Atomic(size_t) file_tokens_committed; /* tokens of the file's state */
};

rb_status rb_session_create_impl(rb_model *model, const rb_session_params *params,
                                 int is_lazy_weights, rb_session **out, rb_error *err);
/* A restore begun at open that no feed has joined yet: finish = 1 waits
 * for all of it (before a save, an unbind), 0 drops what has not started
 * (before a trim, a rewind, a new mode, a close). What failed or was not
 * read stays in its tier for the next feed's restore. No-op otherwise. */
void rb_session_settle_restore(rb_session *s, int finish);
/*
 * A feed in steps, for rb_session_decode_multi (session_multi.c), which
 * runs the new tokens of several sessions in one forward pass (op_mu held
 * throughout):
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

/* session_file.c: after a feed (hands the commit of the new full pages and
 * the tokens to the storage worker when bound, and returns; a failure is
 * recorded, never returned), after a rewind (waits for a running commit),
 * at destroy (the pending commit runs; before the memory manager goes) */
void rb_session_file_after_feed(rb_session *s);
void rb_session_file_rewound(rb_session *s);
/* The tokens from position `from` on changed (a context shift): the file's
 * pages from there on are dropped; the next commit writes the new state. */
void rb_session_file_shifted(rb_session *s, size_t from);
void rb_session_file_close(rb_session *s);
/* The storage worker's counters (zeros when none runs), for tests. */
/* Sliding-window layers (gemma3): releases their pages that hold only
 * positions a query at next_pos or later never attends to (session.c).
 * in_feed: a restore may be running (pages not resident wait). */
void rb_session_release_window(rb_session *s, size_t next_pos, int in_feed);
/* The first page of the sliding-window layers that a query at pos needs. */
uint32_t rb_session_window_first_page(const rb_session *s, size_t pos);

struct rb_session_writer_stats;
void rb_session_file_writer_stats(rb_session *s, struct rb_session_writer_stats *out);

/* session_memory.c: a public call takes the session (waits for another
 * call on it) and lets it go (serving the trims posted meanwhile). */
void rb_session_enter(rb_session *s);
void rb_session_leave(rb_session *s);
/* A session held by this thread is let go without serving anything (it is
 * being destroyed). */
void rb_session_let_go(rb_session *s);
/* Serves posted trims now (op_mu held; not inside a restore). */
void rb_session_serve_requests(rb_session *s);
/* After rb_forward_batch returned: the layer the pass used is let go. */
void rb_session_gate_release(rb_session *s);
/* The trim itself (op_mu held). kv_only: the model's weights stay. */
rb_status rb_session_trim_locked(rb_session *s, uint64_t bytes, rb_trim_level level,
                                 int kv_only, uint64_t *freed);

/* session_memory.c: set up / tear down the memory manager of a session
 * whose KV cache and forward state exist; the layer gate is installed.
 * is_cold: the model's layers are not read yet (a session opened from a
 * file): they are read in layer order by the first feed's restore. */
rb_status rb_session_memory_init(rb_session *s, int is_cold, rb_error *err);
/* A cold session's weights outside the layers (embeddings, output, norms),
 * read after rb_session_memory_init: the opener begins the layers' restore
 * first, so both share the device from the start. */
rb_status rb_session_memory_read_rest(rb_session *s, rb_error *err);
void rb_session_memory_deinit(rb_session *s);
/* Leaves the pool (first thing at destroy: the pool trims members from
 * other threads until then). */
void rb_session_memory_leave_pool(rb_session *s);
/* After a successful feed: enforces the budget (trims beyond it). */
rb_status rb_session_memory_after_feed(rb_session *s);
/* Weights stream under a budget (rb_session_params.weights_budget_bytes,
 * or a memory budget below the weights + the run state + a full context's
 * KV; the forward state and the KV cache must exist). */
int rb_session_wants_streaming(const rb_session *s);
/* Before a feed that grows the KV cache to n_pages_after pages per layer:
 * under a memory budget, the streaming weight cache gives up what the new
 * KV will take (down to its minimum; below that the KV is trimmed). */
void rb_session_memory_before_feed(rb_session *s, uint32_t n_pages_after);
/* A forward pass stopped by the weight stream's I/O error: copies it into
 * the session's error and returns it; RB_OK when the stream is fine. */
rb_status rb_session_memory_stream_error(rb_session *s);

/* The session's KV cache (pages resident for positions [0, n_tokens)). */
static inline rb_kvcache *rb_session_kvcache(rb_session *s) { return &s->kv; }
static inline rb_model *rb_session_model(rb_session *s) { return s->model; }

#endif
