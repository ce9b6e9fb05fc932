/*
 * session_memory.c - a session's memory manager: the emulated storage
 * device (profile + throttle), the spill store, the weight cache and the
 * residency manager, wired to the forward pass's layer gate; and the public
 * rb_session_trim / rb_session_get_stats_sized.
 *
 * Ownership: everything here belongs to the session and dies with it; the
 * residency manager's workers are stopped first (rb_session_memory_deinit
 * runs before the KV cache and the forward state are freed).
 *
 * Failure policy: a spill directory that cannot be used is not fatal unless
 * the caller named it (the session then runs without the storage tier and
 * the stats say why); a memory-mapped model keeps its weights (they belong
 * to the page cache).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stdatomic.h>
#include <time.h>

#include "pool.h"
#include "profile.h"
#include "residency.h"
#include "session_internal.h"
#include "status.h"
#include "store.h"
#include "throttle.h"
#include "wcache.h"
#include "wcache_stream.h"

void rb_session_gate_release(rb_session *s)
{
    if (s->held_layer >= 0 && s->wcache)
        rb_wcache_unuse(s->wcache, (uint32_t)s->held_layer);
    s->held_layer = -1;
}

static rb_status pool_join(rb_session *s, rb_error *err);

static int layer_gate(void *ctx, uint32_t layer)
{
    rb_session *s = ctx;
    rb_session_gate_release(s); /* the previous layer is done */
    /* a trim posted from another thread, an abort: stop at this boundary
       (the pool's trims at a batch's first) */
    /* after a stop for a trim, the batch computed again runs to its end
       (an abort still stops it): trims that keep coming cannot keep a feed
       from ever completing one; they wait one batch at most */
    if (s->grace_batch ? atomic_load_explicit(&s->abort_req, memory_order_acquire)
                       : (atomic_load_explicit(&s->interrupt, memory_order_acquire) ||
                          (layer == 0 &&
                           atomic_load_explicit(&s->interrupt_batch, memory_order_acquire)))) {
        s->stop_interrupt = 1;
        return -1;
    }
    if (s->params.progress && s->progress_layers && layer < s->kv.n_layers) {
        if (s->params.progress(s->params.progress_ctx, RB_PROGRESS_RESTORE, layer,
                               s->kv.n_layers)) {
            atomic_store(&s->abort_req, 1);
            s->stop_interrupt = 1;
            return -1;
        }
        if (layer + 1 == s->kv.n_layers)
            s->progress_layers = 0;
    }
    /* weights first: the unit's blocks (layer L, or the output at
       n_layers), then the layer's KV */
    if (s->wstream && rb_wcache_stream_acquire(s->wstream, layer) != 0)
        return -1;
    if (layer >= s->kv.n_layers) {
        rb_residency_compute_done(s->res);
        return 0;
    }
    if (rb_residency_wait_layer(s->res, layer) != 0)
        return -1;
    /* the model's weights: another session may have released the layer
       after this feed's restore was planned; none releases it now */
    if (s->wcache) {
        rb_error e = {0};
        if (rb_wcache_use(s->wcache, layer, s->throttle, &e) != RB_OK) {
            s->gate_status = rb_error_set(&s->err, e.status, "%s", e.message);
            return -1;
        }
        s->held_layer = (int)layer;
    }
    return 0;
}

static int rows_gate(void *ctx, const int32_t *tokens, uint32_t n)
{
    rb_session *s = ctx;
    return rb_wcache_stream_rows(s->wstream, tokens, n);
}

/* The stats' scratch (forward run state, logits) and the session's own
 * part of "other" (tokens, the page table; residency adds its tables). */
static uint64_t scratch_bytes(const rb_session *s)
{
    return s->fwd.mem_bytes + (uint64_t)s->fwd.hp.n_vocab * sizeof(float);
}

static uint64_t table_bytes(const rb_session *s)
{
    return (uint64_t)s->kv.n_ctx * sizeof(int32_t) +
           (uint64_t)s->kv.n_layers * s->kv.pages_per_layer * sizeof(void *);
}

/* RAM the session holds besides weights and KV, before residency exists. */
static uint64_t fixed_bytes(const rb_session *s) { return scratch_bytes(s) + table_bytes(s); }

int rb_session_wants_streaming(const rb_session *s)
{
    const rb_session_params *p = &s->params;
    if (p->weights_budget_bytes)
        return 1;
    if (!p->budget_bytes || rb_model_is_mapped(s->model))
        return 0; /* a mapped model's weights belong to the page cache */
    /* the weights stream when they and a full context's KV do not fit:
       spilled KV would be read back by every token just the same, and the
       weights are the part that streams in layer order with read-ahead */
    rb_model_info info;
    rb_model_get_info(s->model, &info);
    /* a full context's pages; a sliding-window layer holds its window's */
    uint64_t pages = 0, win = rb_session_window_first_page(s, s->kv.n_ctx - 1);
    for (uint32_t l = 0; l < s->kv.n_layers; l++)
        pages += s->fwd.layers[l].window ? s->kv.pages_per_layer - win : s->kv.pages_per_layer;
    uint64_t kv_full = pages * rb_kvcache_page_alloc_bytes(&s->kv);
    return p->budget_bytes < info.tensor_data_bytes + fixed_bytes(s) + kv_full;
}

/* The weight cache's share: its own budget, and what a memory budget
 * leaves after `fixed` bytes of run state and tables and kv_bytes of KV
 * (0: nothing left). */
static uint64_t weights_share(const rb_session *s, uint64_t fixed, uint64_t kv_bytes)
{
    const rb_session_params *p = &s->params;
    uint64_t cap = p->weights_budget_bytes ? p->weights_budget_bytes : UINT64_MAX;
    if (p->budget_bytes) {
        uint64_t rest = fixed + kv_bytes;
        uint64_t left = p->budget_bytes > rest ? p->budget_bytes - rest : 0;
        cap = left < cap ? left : cap;
    }
    return cap;
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

static rb_status stream_init(rb_session *s, rb_error *err)
{
    const rb_session_params *p = &s->params;
    /* before the memory manager exists: its tables are not counted yet;
       the first feed re-balances with the real figures before any read */
    uint64_t min = 0;
    rb_wcache_stream_params wp = {.budget_bytes = weights_share(s, fixed_bytes(s), 0),
                                  .policy = p->weights_policy, .min_budget_out = &min};
    if (wp.budget_bytes == 0)
        wp.budget_bytes = 1; /* nothing left: the error below names the minimum */
    rb_error e = {0};
    rb_status st = rb_wcache_stream_create(s->model, rb_model_path(s->model), NULL, s->throttle,
                                           &wp, &s->wstream, &e);
    if (st == RB_E_BUDGET && !p->weights_budget_bytes) /* in the budget the caller gave */
        return rb_error_set(err, st, "session: a memory budget of %.2f MiB leaves %.2f MiB for "
                            "weights after the run state (%.2f MiB), below the weights' minimum "
                            "of %.2f MiB: it needs at least %.2f MiB (%s)", mib(p->budget_bytes),
                            mib(wp.budget_bytes), mib(fixed_bytes(s)), mib(min),
                            mib(min + fixed_bytes(s)), e.message);
    if (st != RB_OK)
        return rb_error_set(err, st, "%s", e.message);
    s->fwd.rows_gate = rows_gate;
    s->fwd.rows_gate_ctx = s;
    return RB_OK;
}

rb_status rb_session_memory_init(rb_session *s, int is_cold, rb_error *err)
{
    const rb_session_params *p = &s->params;
    const rb_experimental_params *x = &s->exp;
    if ((unsigned)p->restore > RB_RESTORE_RECOMPUTE)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: restore mode %d is not one of "
                            "pipelined, eager, recompute", (int)p->restore);
    if (!(x->decode_bytes_per_s >= 0) || !(x->storage_bytes_per_s >= 0))
        return rb_error_set(err, RB_E_INVALID_ARG, "session: decode (%g) and storage (%g) "
                            "bandwidths must be >= 0 (0: measured)", x->decode_bytes_per_s,
                            x->storage_bytes_per_s);
    rb_profile prof;
    rb_status st = rb_profile_get(x->device && *x->device ? x->device : "host", &prof, err);
    if (st != RB_OK)
        return st;
    s->device_bw = prof.is_throttled ? prof.bw_bytes_per_s : 0;
    if (prof.is_throttled) {
        if (!(s->throttle = calloc(1, sizeof *s->throttle)))
            return rb_error_set(err, RB_E_NOMEM, "session: out of memory");
        if ((st = rb_throttle_init(s->throttle, prof.bw_bytes_per_s, prof.latency_s, err)) !=
            RB_OK) {
            free(s->throttle);
            s->throttle = NULL;
            return st;
        }
    }

    rb_store_params sp = rb_store_default_params();
    sp.dir = p->spill_dir;
    sp.throttle = s->throttle;
    rb_error serr = {0};
    if (rb_store_open(&sp, &s->store, &serr) == RB_OK) {
        snprintf(s->store_note, sizeof s->store_note, "%s", rb_store_io_mode(s->store));
    } else {
        s->store = NULL;
        if (p->spill_dir && *p->spill_dir)
            return rb_error_set(err, serr.status, "%s", serr.message);
        snprintf(s->store_note, sizeof s->store_note, "no storage tier: %s", serr.message);
    }

    rb_error werr = {0};
    if (rb_session_wants_streaming(s)) {
        if ((st = stream_init(s, err)) != RB_OK)
            return st;
        is_cold = 0; /* the stream reads every block on use */
    } else if (rb_wcache_shared(s->model, &s->wcache, &werr) != RB_OK) {
        s->wcache = NULL;
        if (werr.status != RB_E_UNSUPPORTED) /* mapped: weights just stay */
            return rb_error_set(err, werr.status, "%s", werr.message);
    }

    rb_residency_kv kv = {
        .slots = (void **)s->kv.pages,
        .n_layers = s->kv.n_layers,
        .pages_per_layer = s->kv.pages_per_layer,
        .page_bytes = s->kv.page_bytes,
        /* a quantized page is its bytes to the codec: the lossless codec
           sees them as f16 values (every row is an even number of bytes) */
        .dims = {s->kv.page_tokens, s->kv.n_kv_heads, (uint32_t)(s->kv.row_k / 2),
                 (uint32_t)(s->kv.row_v / 2)},
    };
    rb_residency_params rp = {
        .restore = p->restore,
        .ram_codec = p->ram_codec,
        .decode_bytes_per_s = x->decode_bytes_per_s,
        .storage_bytes_per_s = x->storage_bytes_per_s > 0 ? x->storage_bytes_per_s
                               : prof.is_throttled ? prof.bw_bytes_per_s : 0,
        .storage_latency_s = prof.latency_s,
        .storage_bw_fixed = x->storage_bytes_per_s > 0,
        .throttle = s->throttle,
    };
    if (is_cold && !s->wcache && !s->wstream)
        return rb_error_set(err, RB_E_UNSUPPORTED, "session: a cold start needs the weight "
                            "cache (%s)", werr.message);
    if (is_cold && (st = rb_wcache_mark_unread(s->wcache, err)) != RB_OK)
        return st;
    if ((st = rb_residency_create(&rp, &kv, s->store, s->wcache, &s->res, err)) != RB_OK)
        return st;
    s->fwd.layer_gate = layer_gate;
    s->fwd.layer_gate_ctx = s;
    return pool_join(s, err);
}

rb_status rb_session_memory_read_rest(rb_session *s, rb_error *err)
{
    return s->wcache ? rb_wcache_read_rest(s->wcache, s->throttle, err) : RB_OK;
}

void rb_session_memory_leave_pool(rb_session *s)
{
    /* first: the pool trims members from other threads until it lets go */
    rb_pool_leave(s->member);
    s->member = NULL;
    if (s->owns_pool)
        rb_pool_destroy(s->mpool);
    s->mpool = NULL;
    s->owns_pool = 0;
}

void rb_session_memory_deinit(rb_session *s)
{
    rb_session_memory_leave_pool(s);
    rb_residency_destroy(s->res);
    s->res = NULL;
    s->fwd.layer_gate = NULL;
    s->fwd.rows_gate = NULL;
    rb_wcache_stream_destroy(s->wstream);
    s->wstream = NULL;
    s->wcache = NULL; /* the model's */
    rb_store_close(s->store);
    s->store = NULL;
    if (s->throttle) {
        rb_throttle_deinit(s->throttle);
        free(s->throttle);
        s->throttle = NULL;
    }
}

static void fill_stats(const rb_session *s, rb_session_stats *out);

/* ---- the pool and the calls from any thread ------------------------------ */

static int is_zram_codec(rb_ram_codec c)
{
    return c == RB_RAM_CODEC_LZ4 || c == RB_RAM_CODEC_ZSTD;
}

/* What the session holds in RAM besides the model's weights. */
static uint64_t own_bytes(const rb_session *s, const rb_session_stats *st)
{
    return st->kv_raw_bytes + st->kv_compressed_bytes + st->scratch_bytes + st->other_bytes +
           (s->wstream ? st->weights_bytes : 0);
}

/* From stats the caller just filled (NULL: filled here). */
static void publish_stats(rb_session *s, const rb_session_stats *st)
{
    if (!s->member)
        return;
    rb_session_stats mine;
    if (!st) {
        fill_stats(s, &mine);
        st = &mine;
    }
    rb_pool_member_set_bytes(s->member, own_bytes(s, st));
}

static void publish_bytes(rb_session *s) { publish_stats(s, NULL); }

static void mark_held(rb_session *s)
{
    pthread_mutex_lock(&s->req_mu);
    s->op_held = 1;
    s->op_owner = pthread_self();
    pthread_mutex_unlock(&s->req_mu);
}

/* 1 when this thread holds the session (a callback, or its own pool). */
static int held_by_me(rb_session *s)
{
    pthread_mutex_lock(&s->req_mu);
    int me = s->op_held && pthread_equal(s->op_owner, pthread_self());
    pthread_mutex_unlock(&s->req_mu);
    return me;
}

void rb_session_enter(rb_session *s)
{
    pthread_mutex_lock(&s->op_mu);
    mark_held(s);
}

void rb_session_let_go(rb_session *s)
{
    if (held_by_me(s)) {
        pthread_mutex_lock(&s->req_mu);
        s->op_held = 0;
        pthread_mutex_unlock(&s->req_mu);
        pthread_mutex_unlock(&s->op_mu);
    }
}

void rb_session_leave(rb_session *s)
{
    rb_session_serve_requests(s);
    pthread_mutex_lock(&s->req_mu);
    s->op_held = 0;
    pthread_mutex_unlock(&s->req_mu);
    pthread_mutex_unlock(&s->op_mu);
}

void rb_session_serve_requests(rb_session *s)
{
    pthread_mutex_lock(&s->req_mu);
    if (!s->req_pending) {
        atomic_store(&s->interrupt, atomic_load(&s->abort_req));
        atomic_store(&s->interrupt_batch, 0);
        pthread_mutex_unlock(&s->req_mu);
        return;
    }
    uint64_t id = s->req_posted, bytes = s->req_bytes;
    rb_trim_level level = s->req_level;
    int kv_only = s->req_kv_only;
    s->req_pending = 0;
    atomic_store(&s->interrupt, atomic_load(&s->abort_req));
    atomic_store(&s->interrupt_batch, 0);
    pthread_mutex_unlock(&s->req_mu);
    uint64_t freed = 0;
    (void)rb_session_trim_locked(s, bytes, level, kv_only, &freed); /* message on s */
    pthread_mutex_lock(&s->req_mu);
    s->req_freed = freed;
    s->req_served = id;
    pthread_cond_broadcast(&s->req_cv);
    pthread_mutex_unlock(&s->req_mu);
}

/* Posts a trim for the thread that holds the session; wait: until it was
 * served (then the bytes it freed), else 0 at once. */
static uint64_t post_request(rb_session *s, uint64_t bytes, rb_trim_level level, int kv_only,
                             int wait)
{
    pthread_mutex_lock(&s->req_mu);
    if (s->op_held && pthread_equal(s->op_owner, pthread_self()))
        wait = 0; /* from the feed's own callback: served when it returns */
    if (!s->req_pending) {
        s->req_bytes = bytes;
        s->req_level = level;
        s->req_kv_only = kv_only;
    } else {
        if (level > s->req_level)
            s->req_level = level;
        if (bytes > s->req_bytes)
            s->req_bytes = bytes;
        if (kv_only < s->req_kv_only) /* the least restricted of them */
            s->req_kv_only = kv_only;
    }
    s->req_pending = 1;
    uint64_t id = ++s->req_posted;
    atomic_store_explicit(wait ? &s->interrupt : &s->interrupt_batch, 1, memory_order_release);
    while (wait && s->req_served < id) {
        pthread_mutex_unlock(&s->req_mu);
        /* the holder may have let go before it saw the request */
        if (pthread_mutex_trylock(&s->op_mu) == 0) {
            mark_held(s);
            rb_session_leave(s);
        }
        pthread_mutex_lock(&s->req_mu);
        if (s->req_served < id) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 2000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&s->req_cv, &s->req_mu, &ts);
        }
    }
    uint64_t freed = wait ? s->req_freed : 0;
    pthread_mutex_unlock(&s->req_mu);
    return freed;
}

/* The pool takes memory back (its mutex held; any thread): the KV only;
 * for its budget (bytes) to storage, compressed pages too, because a page
 * there frees all of its RAM and a compressed one a fraction (a level, the
 * app-switch moment, keeps the two-path split). */
static uint64_t member_trim(void *ctx, uint64_t bytes, rb_trim_level level)
{
    rb_session *s = ctx;
    uint64_t freed = 0;
    const int kv_only = level == RB_TRIM_BYTES ? 2 : 1;
    if (held_by_me(s)) {
        if (s->in_forward) /* a callback inside the pass: at the next boundary */
            return post_request(s, bytes, level, kv_only, 0);
        (void)rb_session_trim_locked(s, bytes, level, kv_only, &freed);
        return freed;
    }
    if (pthread_mutex_trylock(&s->op_mu) == 0) {
        mark_held(s);
        (void)rb_session_trim_locked(s, bytes, level, kv_only, &freed);
        rb_session_leave(s);
        return freed;
    }
    return post_request(s, bytes, level, kv_only, 0);
}

static rb_status pool_join(rb_session *s, rb_error *err)
{
    rb_pool *pool = s->params.pool;
    rb_status st;
    if (pool) {
        if (rb_pool_model(pool) != s->model)
            return rb_error_set(err, RB_E_INVALID_ARG, "session: the pool is of another model "
                                "(one model per pool)");
    } else {
        if ((st = rb_pool_create_impl(s->model, s->params.budget_bytes, &pool, err)) != RB_OK)
            return st;
        s->owns_pool = 1;
    }
    s->mpool = pool;
    rb_model_info info;
    rb_model_get_info(s->model, &info);
    /* the weights the pool counts: the model's cache, or all of them
       (mapped), or none (a stream: the session counts its cache) */
    rb_pool_set_weights(pool, s->wcache, s->wcache || s->wstream ? 0 : info.tensor_data_bytes);
    if ((st = rb_pool_join(pool, s, member_trim, s->params.priority, &s->member, err)) != RB_OK)
        return st;
    publish_bytes(s);
    return RB_OK;
}

rb_status rb_session_set_priority(rb_session *s, rb_priority priority)
{
    if (!s || (unsigned)priority > RB_PRIORITY_BACKGROUND)
        return RB_E_INVALID_ARG;
    if (s->member)
        rb_pool_member_set_priority(s->member, priority);
    return RB_OK;
}

void rb_session_abort(rb_session *s)
{
    if (!s)
        return;
    atomic_store(&s->abort_req, 1);
    atomic_store_explicit(&s->interrupt, 1, memory_order_release);
}

rb_status rb_session_trim_locked(rb_session *s, uint64_t bytes, rb_trim_level level,
                                 int kv_only, uint64_t *freed_out)
{
    if (!s->res)
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: no memory manager");
    if ((unsigned)level > RB_TRIM_COMPLETE)
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: unknown trim level %d",
                            (int)level);
    rb_session_settle_restore(s, 0);
    uint64_t freed = 0;
    rb_status st = rb_residency_trim_kv(s->res, bytes, level, kv_only, &freed, &s->err);
    /* streamed weights: a complete trim, or bytes the KV could not give,
       come out of the block cache (they stream back on use) */
    if (st == RB_OK && s->wstream && !kv_only &&
        (level == RB_TRIM_COMPLETE || (level == RB_TRIM_BYTES && freed < bytes)))
        freed += rb_wcache_stream_drop(s->wstream);
    /* a mapped model's weights are the page cache's: a complete trim drops
       the process's mapping of them (they fault back from the file) */
    if (st == RB_OK && !kv_only && level == RB_TRIM_COMPLETE && !s->wcache && !s->wstream)
        freed += rb_model_drop_mapped_pages(s->model);
    publish_bytes(s);
    if (freed_out)
        *freed_out = freed;
    return st;
}

rb_status rb_session_trim(rb_session *s, uint64_t bytes, rb_trim_level level,
                          uint64_t *freed_out)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if ((unsigned)level > RB_TRIM_COMPLETE)
        return RB_E_INVALID_ARG;
    uint64_t freed = 0;
    rb_status st = RB_OK;
    if (pthread_mutex_trylock(&s->op_mu) == 0) { /* idle: trim now */
        mark_held(s);
        st = rb_session_trim_locked(s, bytes, level, 0, &freed);
        rb_session_leave(s);
    } else {
        freed = post_request(s, bytes, level, 0, 1);
    }
    if (freed_out)
        *freed_out = freed;
    return st;
}

static void fill_stats(const rb_session *s, rb_session_stats *out)
{
    memset(out, 0, sizeof *out);
    rb_model_info info;
    rb_model_get_info(s->model, &info);
    out->weights_bytes = s->wcache ? rb_wcache_resident_bytes(s->wcache) : info.tensor_data_bytes;
    out->weights_evicted_bytes = s->wcache ? rb_wcache_total_bytes(s->wcache) -
                                                 out->weights_bytes : 0;
    if (s->wstream) {
        rb_wcache_stream_stats ws;
        rb_wcache_stream_get_stats(s->wstream, &ws);
        out->weights_bytes = ws.resident_bytes;
        out->weights_evicted_bytes = info.tensor_data_bytes > ws.resident_bytes
                                         ? info.tensor_data_bytes - ws.resident_bytes : 0;
        out->weights_streaming = 1;
        out->weights_policy = ws.policy;
        out->weights_budget_bytes = ws.budget_bytes;
        out->weights_min_budget_bytes = ws.min_budget_bytes;
        out->weights_loop_bytes = ws.loop_bytes;
        out->weights_pinned_loop_bytes = ws.pinned_loop_bytes;
        out->weights_window_bytes = ws.window_bytes;
        out->weights_max_resident_bytes = ws.max_resident_bytes;
        out->weights_read_bytes = ws.read_bytes;
        out->weights_reads = ws.n_reads;
        out->weights_hits = ws.n_hits;
        out->weights_misses = ws.n_misses;
        out->weights_passes = ws.n_passes;
        out->weights_rebalances = ws.n_rebalances;
        out->weights_given_up_bytes = ws.budget_given_up_bytes;
        out->weights_io_s = ws.io_s;
        out->weights_wait_s = ws.wait_s;
        out->weights_room_wait_s = ws.room_wait_s;
        out->weights_idle_s = ws.idle_s;
    }
    out->scratch_bytes = scratch_bytes(s);
    out->other_bytes = table_bytes(s);
    if (s->res)
        rb_residency_stats(s->res, out);
    out->total_bytes = out->weights_bytes + out->kv_raw_bytes + out->kv_compressed_bytes +
                       out->scratch_bytes + out->other_bytes;
    out->budget_bytes = s->mpool ? rb_pool_budget(s->mpool) : s->params.budget_bytes;
    out->storage_io = s->store_note;
    out->device_bytes_per_s = s->device_bw;
    out->restore_recomputed_tokens = s->recomputed_tokens;
    out->file_commits = s->file_commits;
    out->file_pages_written = s->file_pages_written;
    out->file_commit_s = s->file_commit_s;
    out->file_status = s->file_status;
    out->file_recovery = s->file_recovery[0] ? s->file_recovery : NULL;
    out->file_lost_tokens = s->file_lost_tokens;
    out->budget_over_bytes = s->budget_over_bytes;
}

rb_status rb_session_get_stats_sized(const rb_session *s, rb_session_stats *out, size_t out_size)
{
    if (!s || !out || !out_size)
        return RB_E_INVALID_ARG;
    /* the caller's struct may be an older, shorter one: fill what it has */
    rb_session_stats all;
    fill_stats(s, &all);
    memcpy(out, &all, out_size < sizeof all ? out_size : sizeof all);
    return RB_OK;
}

rb_status rb_session_memory_after_feed(rb_session *s)
{
    publish_bytes(s);
    rb_pool_member_touch(s->member);
    /* over budget: the pool takes the excess back - the other sessions'
       KV, least recently used first, then this one's (last layers first),
       then the weights (the zram baseline keeps them: it compresses KV
       only, as the kernel's zRAM would); what cannot go stays, and the
       stats show it */
    s->budget_over_bytes = rb_pool_enforce(s->mpool, s->member, 0, 1,
                                           !is_zram_codec(s->params.ram_codec));
    return RB_OK;
}

void rb_session_memory_before_feed(rb_session *s, uint32_t n_pages_after)
{
    rb_session_stats st;
    if (!s->wstream && s->mpool && rb_pool_budget(s->mpool)) {
        /* the feed brings this session's KV back and grows it: the other
           sessions make room first (this one trims after the feed) */
        fill_stats(s, &st);
        uint64_t now = st.kv_raw_bytes + st.kv_compressed_bytes;
        uint64_t after = (uint64_t)n_pages_after * s->kv.n_layers *
                         rb_kvcache_page_alloc_bytes(&s->kv);
        /* and the model's weights any session released: the pass reads
           them all back */
        uint64_t extra = (after > now ? after - now : 0) + st.weights_evicted_bytes;
        publish_stats(s, &st); /* the figures just filled, not a second scan */
        rb_pool_enforce(s->mpool, s->member, extra, 0, 0);
    }
    if (!s->wstream || !s->params.budget_bytes)
        return;
    rb_session_get_stats(s, &st);
    uint64_t kv = st.kv_raw_bytes + st.kv_compressed_bytes;
    if (n_pages_after > s->kv.n_pages_reserved)
        kv += (uint64_t)(n_pages_after - s->kv.n_pages_reserved) * s->kv.n_layers *
              rb_kvcache_page_alloc_bytes(&s->kv);
    uint64_t share = weights_share(s, st.scratch_bytes + st.other_bytes, kv);
    uint64_t min = rb_wcache_stream_min_budget(s->wstream);
    if (share < min) {
        /* the weights are at their floor: the KV gives the rest (last
           layers first, as a trim); what it cannot give shows in the stats */
        uint64_t excess = min - share;
        rb_residency_trim(s->res, excess, RB_TRIM_BYTES, NULL, &s->err);
        share = min;
    }
    /* block granularity: the KV grows a page at a time, so this changes
       the cache (and drops its read-ahead) only when a page is added */
    rb_wcache_stream_stats ws;
    rb_wcache_stream_get_stats(s->wstream, &ws);
    if (share / ws.block_bytes != ws.budget_bytes / ws.block_bytes)
        rb_wcache_stream_set_budget(s->wstream, share, &s->err);
}

rb_status rb_session_memory_stream_error(rb_session *s)
{
    return s->wstream ? rb_wcache_stream_error(s->wstream, &s->err) : RB_OK;
}

rb_status rb_session_set_restore(rb_session *s, rb_restore_mode mode, rb_ram_codec codec)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if (codec == RB_RAM_CODEC_Q8 && (s->kv.type_k != RB_TYPE_F16 || s->kv.type_v != RB_TYPE_F16))
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: the q8 RAM codec re-quantizes "
                            "an f16 KV cache; this one is quantized");
    rb_session_enter(s);
    rb_session_settle_restore(s, 0);
    rb_status st = rb_residency_set_mode(s->res, mode, codec, &s->err);
    if (st == RB_OK) {
        s->params.restore = mode;
        s->params.ram_codec = codec;
    }
    rb_session_leave(s);
    return st;
}

size_t rb_session_restore_events(const rb_session *s, rb_restore_event *out, size_t max)
{
    return s && s->res ? rb_residency_events(s->res, out, max) : 0;
}
