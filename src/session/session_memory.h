/*
 * session_memory.h - a session's memory wiring (session_memory.c): the
 * emulated storage device, the spill store, the weight cache or stream,
 * the residency manager and the pool membership, wired to the forward
 * pass's gates; and the calls that reach a session from other threads
 * (trims, an abort), which are memory requests.
 *
 * session.c embeds one rb_session_mem and is the only caller; the memory
 * wiring never calls back into session.c (it sees the session's KV cache,
 * forward state, parameters and error through the pointers below, which
 * the session sets before rb_session_memory_init and which outlive it).
 *
 * Threads: the fields marked "op" belong to the thread that holds the
 * session (rb_session_memory_enter .. _leave), which holds the residency
 * manager too (rb_residency_hold .. _let_go: the pool trims the manager
 * itself only while nobody holds it, and leaves its request with the
 * manager otherwise; session_memory.c's opening has the whole rule); the
 * request fields are under req_mu; the flags are atomic.
 */
#ifndef RB_SESSION_MEMORY_H
#define RB_SESSION_MEMORY_H

#include <pthread.h>
#include <stdatomic.h>

#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "rebound.h"
#include "rebound_experimental.h"
#include "residency.h"
#include "store.h"

struct rb_pool;
struct rb_pool_member;
struct rb_throttle;
struct rb_store;
struct rb_wcache;
struct rb_wcache_stream;
struct rb_residency;

typedef struct rb_session_mem {
    /* borrowed from the session (set before init, outlive the wiring) */
    rb_model *model;
    rb_kvcache *kv;
    rb_forward *fwd;
    const rb_session_params *params;    /* .restore and .ram_codec as created */
    const rb_experimental_params *exp;
    rb_error *err;                       /* the session's message (op) */
    rb_session *handle;                  /* the session, for the pool's
                                            rb_pool_next_to_close (never called) */

    /* the parts (op; read by stats) */
    struct rb_throttle *throttle;   /* the emulated device; NULL: host as is */
    double device_bw;               /* its bandwidth (bytes/s); 0: host */
    struct rb_store *store;         /* NULL: no spill tier (store_note says why) */
    char store_note[RB_ERROR_MESSAGE_MAX + 32];
    struct rb_wcache *wcache;       /* NULL: weights stay (mapped model) or stream */
    struct rb_wcache_stream *wstream; /* weight streaming under a budget; NULL: off */
    struct rb_residency *res;
    /* the pool: the session's own one (owns_pool) or the app's */
    struct rb_pool *mpool;
    struct rb_pool_member *member;
    int owns_pool;
    uint64_t budget_over_bytes;     /* after the last feed's budget trim */
    double room_s;                  /* the last feed's budget trim before it */
    _Atomic int run_state_out;      /* the forward's run state is released
                                       (written under op; read by stats) */

    /* sliding-window layers: their pages below window_dead_pages hold
       positions no later query attends to, and are released (or will be
       once a restore ends); those below window_released_pages are (op) */
    uint32_t window_dead_pages;
    uint32_t window_released_pages;
    int restore_open;               /* a restore begun at open runs: the first
                                       feed joins it (op) */
    uint32_t restore_open_from;     /* its begin_restore's recompute_from */
    int restore_is_prefetch;        /* the open restore is a prefetch: a feed
                                       settles it and plans the rest (op) */

    /* the forward pass's gate (op) */
    int held_layer;                 /* the layer whose weights the pass uses
                                       (rb_wcache_use), or -1 */
    int stop_interrupt;             /* the gate stopped for a request or an abort */
    int grace_batch;                /* the batch after such a stop runs to its
                                       end (only an abort stops it) */
    rb_status gate_status;          /* a gate's own failure (weights unreadable) */
    uint32_t progress_layers;       /* restore progress: layers of the plan to go */

    /* the calls from any thread. op_mu is held by the public call that uses
       the session (feed, rewind, shift, trim, save, set_restore); a trim
       from another thread posts a request under req_mu and raises
       `interrupt`: the holder serves it at its next layer boundary (a feed)
       or before it lets go */
    pthread_mutex_t op_mu;
    pthread_mutex_t req_mu;
    pthread_cond_t req_cv;
    int op_held;                    /* under req_mu: op_mu is held ... */
    pthread_t op_owner;             /* ... by this thread */
    uint64_t req_posted, req_served; /* under req_mu */
    uint64_t req_bytes, req_freed;
    rb_trim_level req_level;
    rb_trim_scope req_scope; /* the widest of the posters' */
    int req_pending;
    rb_status req_status;           /* the served request's */
    rb_error req_err;               /* its message, for a poster that waits */
    uint64_t n_trim_failures;       /* trims that failed, posted ones too (req_mu) */
    rb_status trim_status;          /* the last failed one's status (req_mu) */
    double trim_fail_s;             /* and when (rb_throttle_now_s; req_mu); the
                                       pool's failures are the residency's */
    _Atomic int interrupt;          /* a request someone waits for, or an abort:
                                       the feed stops at its next layer boundary */
    _Atomic int interrupt_batch;    /* a request nobody waits for (rb_session_trim
                                       from the feed's own callback; the
                                       pool's are the residency manager's,
                                       rb_residency_trim_pending): it stops
                                       before its next batch, so
                                       sessions trimming each other cannot keep
                                       a batch from ever completing */
    _Atomic int abort_req;
} rb_session_mem;

/* ---- lifetime -------------------------------------------------------------- */

/* The locks, held by the caller from here on (a pool the session joins
 * trims it only after rb_session_memory_leave). */
void rb_session_memory_early_init(rb_session_mem *m);
/* Sets up the wiring of a session whose KV cache and forward state exist;
 * the layer gate is installed and the pool joined. is_cold: the model's
 * layers are not read yet (a session opened from a file): they are read
 * in layer order by the first feed's restore. */
rb_status rb_session_memory_init(rb_session_mem *m, int is_cold, rb_error *err);
/* A cold session's weights outside the layers (embeddings, output, norms),
 * read after rb_session_memory_init: the opener begins the layers' restore
 * first, so both share the device from the start. */
rb_status rb_session_memory_read_rest(rb_session_mem *m, rb_error *err);
/* Leaves the pool (first thing at destroy: the pool trims members from
 * other threads until then). */
void rb_session_memory_leave_pool(rb_session_mem *m);
/* Tears the wiring down (the restore workers stop first); before the KV
 * cache and the forward state are freed. Then the locks. */
void rb_session_memory_deinit(rb_session_mem *m);
/* Weights stream under a budget (rb_session_params.weights_budget_bytes,
 * or a memory budget below the weights + the run state + a full context's
 * KV; the forward state and the KV cache must exist). */
int rb_session_memory_wants_streaming(const rb_session_mem *m);

/* ---- the calls from any thread -------------------------------------------- */

/* A public call takes the session (waits for another call on it) and lets
 * it go (serving the trims posted meanwhile). */
void rb_session_memory_enter(rb_session_mem *m);
void rb_session_memory_leave(rb_session_mem *m);
/* A session held by this thread is let go without serving anything (it is
 * being destroyed). */
void rb_session_memory_let_go(rb_session_mem *m);
/* Serves posted trims now (op held; not inside a restore). */
void rb_session_memory_serve_requests(rb_session_mem *m);
/* rb_session_trim: now when the session is free, else posted for the
 * thread that holds it and waited for. The status is the trim's, served
 * or not; a failure's message goes to err (never to the session's own
 * message, which belongs to the thread using the session). */
rb_status rb_session_memory_trim(rb_session_mem *m, uint64_t bytes, rb_trim_level level,
                                 uint64_t *freed, rb_error *err);
/* The trim itself (op held): by the session's own call, or a served
 * request. err: where a failure's message goes. */
rb_status rb_session_memory_trim_locked(rb_session_mem *m, uint64_t bytes, rb_trim_level level,
                                        rb_trim_scope scope, uint64_t *freed,
                                        rb_error *err);
void rb_session_memory_abort(rb_session_mem *m);
/* The abort asked for since the last call (and cleared). */
int rb_session_memory_take_abort(rb_session_mem *m);
rb_status rb_session_memory_set_priority(rb_session_mem *m, rb_priority priority);
/* Takes the session when no other call holds it (1), else 0 at once. */
int rb_session_memory_try_enter(rb_session_mem *m);
/* Restoring ahead of time (op held): begins the restore of what is out of
 * RAM on the residency's workers, within the bytes the pool grants
 * (trim_background: a foreground session's, which may make room from
 * background sessions); *planned the bytes it brings back (0: nothing to
 * do, no room, or a restore is open). The next feed, trim, rewind, save
 * or close settles it (rb_session_memory_settle_restore). */
void rb_session_memory_prefetch(rb_session_mem *m, int trim_background, uint64_t *planned);

/* ---- around a feed (op held) ---------------------------------------------- */

/* Before a feed that grows the KV cache to n_pages_after pages per layer:
 * the other sessions of the pool make room; under a memory budget, the
 * streaming weight cache gives up what the new KV will take (down to its
 * minimum; below that the KV is trimmed). */
void rb_session_memory_before_feed(rb_session_mem *m, uint32_t n_pages_after);
/* Plans the restore of what a trim evicted (or joins the one begun at
 * open); *recompute_from: the first position whose K/V is gone. */
rb_status rb_session_memory_begin_restore(rb_session_mem *m, uint32_t *recompute_from);
/* Drops a restore begun by begin_restore before any pass ran. */
void rb_session_memory_drop_restore(rb_session_mem *m);
/* A restore begun at open that no feed has joined yet: finish = 1 waits
 * for all of it (before a save, an unbind), 0 drops what has not started
 * (before a trim, a rewind, a new mode, a close). What failed or was not
 * read stays in its tier for the next feed's restore. No-op otherwise. */
void rb_session_memory_settle_restore(rb_session_mem *m, int finish);
/* A forward pass begins (with_progress: report the restore's layers). */
void rb_session_memory_pass_begin(rb_session_mem *m);
/* The context uses pages [0, n_pages) of every layer (after a reserve). */
void rb_session_memory_set_pages(rb_session_mem *m, uint32_t n_pages);
/* After rb_forward_batch returned: the layer the pass used is let go. */
/* After a forward pass returned (also when a gate stopped it): a
 * streaming session lets go of the shared stream's pass, so another
 * session's pass may run (wcache_stream.h). Thread: the pass's. */
void rb_session_memory_pass_end(rb_session_mem *m);
void rb_session_memory_gate_release(rb_session_mem *m);
/* A batch completed: the grace after a stop is over. */
void rb_session_memory_batch_done(rb_session_mem *m);
/* The feed computed n tokens in seconds (the split's compute estimate). */
void rb_session_memory_note_compute(rb_session_mem *m, size_t n, double seconds);
/* Ends the pass's restore: *damaged the first damaged position or
 * UINT32_MAX; an error when weights could not be re-read. */
rb_status rb_session_memory_end_restore(rb_session_mem *m, uint32_t *damaged);
/* After the pass: the gate's own failure, or a streaming read error when
 * the pass stopped not for a request (copied into the session's message);
 * RB_OK otherwise. */
rb_status rb_session_memory_pass_error(rb_session_mem *m, int stopped);
/* The gate stopped the pass for a request or an abort (and clears it). */
int rb_session_memory_take_stop(rb_session_mem *m);
/* After a stop for a request: the batch computed again runs to its end. */
void rb_session_memory_grant_grace(rb_session_mem *m);
/* After a successful feed: publishes the bytes and enforces the budget. */
void rb_session_memory_after_feed(rb_session_mem *m);
/* Brings the evicted pages below `pages` (UINT32_MAX: every one) back
 * without computing; *from receives the first position to recompute
 * (dropped or damaged), or UINT32_MAX. */
rb_status rb_session_memory_restore_pages(rb_session_mem *m, uint32_t pages, uint32_t *from);

/* ---- pages ------------------------------------------------------------------ */

/* The first page of the sliding-window layers that a query at pos needs. */
uint32_t rb_session_memory_window_first_page(const rb_session_mem *m, size_t pos);
/* Releases the sliding-window layers' pages that hold only positions a
 * query at next_pos or later never attends to. in_feed: a restore may be
 * running (pages not resident wait). */
void rb_session_memory_release_window(rb_session_mem *m, size_t next_pos, int in_feed);
/* Before K/V is recomputed from position `from`: 0 when a sliding-window
 * layer's window from there reaches a released page, else from. */
size_t rb_session_memory_recompute_point(const rb_session_mem *m, size_t from);
/* Forgets pages >= first_page in every tier and the cache. */
void rb_session_memory_forget_from(rb_session_mem *m, uint32_t first_page);
/* The forward's run state: released while the session is idle in the
 * background (rb_session_set_priority), mapped again before its next feed
 * (RB_E_NOMEM); both publish the bytes. op held. */
rb_status rb_session_memory_ensure_run_state(rb_session_mem *m, rb_error *err);
void rb_session_memory_release_run_state(rb_session_mem *m);
/* The feed writes positions from page `page` on (rb_residency_will_write). */
void rb_session_memory_will_write(rb_session_mem *m, uint32_t page);

/* Shared pages (rb_session_fork; the rule in kvcache.h). The pool the
 * session is in. */
struct rb_pool *rb_session_memory_pool(const rb_session_mem *m);
/* dst (a new session, held, no page yet) takes src's pages (src held, no
 * restore running) for positions [0, n_valid): the full pages as shared
 * pages in the pool's account, the partly filled last one as a copy; only
 * the leading pages resident in every layer of src (a page src released
 * or evicted ends it). *dst_valid: the positions whose K/V dst now holds
 * (n_valid, or the start of the first page it could not take). Both
 * sessions' bytes are published. RB_E_NOMEM (dst holds what it took). */
rb_status rb_session_memory_fork_pages(rb_session_mem *dst, rb_session_mem *src, size_t n_valid,
                                       size_t *dst_valid, rb_error *err);
/* Page `page` of every layer becomes the session's own (it is about to be
 * written: a rewind into it). RB_E_NOMEM. */
rb_status rb_session_memory_unshare_page(rb_session_mem *m, uint32_t page);
/* A page the session file holds (an open): STORED there; is_clean: a full
 * page whose copy is identical. Then the context's pages (and which
 * sliding-window pages were never adopted). */
void rb_session_memory_adopt_saved(rb_session_mem *m, uint32_t layer, uint32_t page,
                                   int is_clean);
void rb_session_memory_adopted(rb_session_mem *m, uint32_t n_pages, uint32_t first_window_page);
/* The first n_pages pages of every layer (in RAM) have a copy in the
 * session file: a trim drops them without a write. */
void rb_session_memory_mark_saved(rb_session_mem *m, uint32_t n_pages);

/* Begins the layers' restore at open (a cold start, pipelined, no budget):
 * the first feed joins it. No-op otherwise. */
void rb_session_memory_open_restore(rb_session_mem *m);
/* session_debug.h's swap: the store taken over, the residency manager
 * rebuilt over it with rp. */
rb_status rb_session_memory_swap_store(rb_session_mem *m, rb_store *store,
                                       const rb_residency_params *rp, rb_error *err);

/* ---- what the public calls read ---------------------------------------------- */

/* Fills out from zero with the memory fields of the stats (the session
 * and the file add theirs). */
void rb_session_memory_fill_stats(const rb_session_mem *m, rb_session_stats *out);
rb_status rb_session_memory_set_mode(rb_session_mem *m, rb_restore_mode mode,
                                     rb_ram_codec codec);
size_t rb_session_memory_events(const rb_session_mem *m, rb_restore_event *out, size_t max);

#endif
