/*
 * session_memory.c - a session's memory wiring (session_memory.h): the
 * emulated storage device (profile + throttle), the spill store, the
 * weight cache or stream and the residency manager, wired to the forward
 * pass's layer gate; the pool membership; the calls that reach a session
 * from other threads (trims, an abort); the sliding-window pages.
 *
 * Direction: session.c calls in; nothing here calls session.c. What the
 * wiring needs of the session (its KV cache, forward state, parameters,
 * error message) it reads through the borrowed pointers of rb_session_mem.
 * The memory pool never calls in here: it trims the session's residency
 * manager itself (rb_pool_join takes it). What is still called from below
 * is the forward pass's layer and rows gates (check_layout's list).
 *
 * Locks and threads (the rule): op_mu is held by the thread using the
 * session (a public call, enter .. leave); while it holds op_mu that
 * thread also holds the residency manager (rb_residency_hold right after
 * taking op_mu, rb_residency_let_go right before letting it go; the
 * forward pass is marked with rb_residency_set_in_pass). A pool trim from
 * any thread (an app's onTrimMemory, the pressure monitor, another
 * session's feed) trims the manager at once only while nobody holds it,
 * under the manager's hold_mu, so rb_residency_hold waits for it; else the
 * manager records it, the layer gate stops before the next batch when it
 * sees it (rb_residency_trim_pending), and this thread serves it
 * (serve_pool_trim: rb_residency_serve_pool_trim, then the bytes
 * published) at that stop and before it lets go. req_mu guards the
 * session's own posted trims (rb_session_trim from another thread, which
 * waits). Lock order: op_mu, then the pool's mutex, then the manager's
 * hold_mu, then its mu; req_mu is never held while another is taken.
 *
 * Ownership: everything here belongs to the session and dies with it; the
 * residency manager's workers are stopped first (rb_session_memory_deinit
 * runs before the KV cache and the forward state are freed).
 *
 * Failure policy: a spill directory that cannot be used is not fatal unless
 * the caller named it (the session then runs without the storage tier and
 * the stats say why); a memory-mapped model keeps its weights (they belong
 * to the page cache). A trim never writes the session's own message: a
 * trim from another thread would change what rb_session_errmsg returns to
 * the thread using the session. Its failure goes to the poster that waits
 * (rb_session_trim), and every failed trim is counted in the stats
 * (trim_failures, trim_status).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <stdatomic.h>
#include <time.h>

#include "pool.h"
#include "profile.h"
#include "residency.h"
#include "session_memory.h"
#include "status.h"
#include "store.h"
#include "throttle.h"
#include "wcache.h"
#include "wcache_stream.h"

void rb_session_memory_gate_release(rb_session_mem *m)
{
    if (m->held_layer >= 0 && m->wcache)
        rb_wcache_unuse(m->wcache, (uint32_t)m->held_layer);
    m->held_layer = -1;
}

static rb_status pool_join(rb_session_mem *m, rb_error *err);

static int layer_gate(void *ctx, uint32_t layer)
{
    rb_session_mem *m = ctx;
    const rb_session_params *p = m->params;
    rb_session_memory_gate_release(m); /* the previous layer is done */
    /* a trim posted from another thread, an abort: stop at this boundary
       (the pool's trims, which the residency manager records, at a
       batch's first) */
    /* after a stop for a trim, the batch computed again runs to its end
       (an abort still stops it): trims that keep coming cannot keep a feed
       from ever completing one; they wait one batch at most */
    if (m->grace_batch ? atomic_load_explicit(&m->abort_req, memory_order_acquire)
                       : (atomic_load_explicit(&m->interrupt, memory_order_acquire) ||
                          (layer == 0 &&
                           (atomic_load_explicit(&m->interrupt_batch, memory_order_acquire) ||
                            (m->res && rb_residency_trim_pending(m->res)))))) {
        m->stop_interrupt = 1;
        return -1;
    }
    if (p->progress && m->progress_layers && layer < m->kv->n_layers) {
        if (p->progress(p->progress_ctx, RB_PROGRESS_RESTORE, layer, m->kv->n_layers)) {
            atomic_store(&m->abort_req, 1);
            m->stop_interrupt = 1;
            return -1;
        }
        if (layer + 1 == m->kv->n_layers)
            m->progress_layers = 0;
    }
    /* weights first: the unit's blocks (layer L, or the output at
       n_layers), then the layer's KV */
    if (m->wstream && rb_wcache_stream_acquire(m->wstream, layer) != 0)
        return -1;
    if (layer >= m->kv->n_layers) {
        rb_residency_compute_done(m->res);
        return 0;
    }
    if (rb_residency_wait_layer(m->res, layer) != 0)
        return -1;
    /* the model's weights: another session may have released the layer
       after this feed's restore was planned; none releases it now */
    if (m->wcache) {
        rb_error e = {0};
        if (rb_wcache_use(m->wcache, layer, m->throttle, &e) != RB_OK) {
            m->gate_status = rb_error_set(m->err, e.status, "%s", e.message);
            return -1;
        }
        m->held_layer = (int)layer;
    }
    return 0;
}

static int rows_gate(void *ctx, const int32_t *tokens, uint32_t n)
{
    rb_session_mem *m = ctx;
    return rb_wcache_stream_rows(m->wstream, tokens, n);
}

/* The stats' scratch (forward run state, logits) and the session's own
 * part of "other" (tokens, the page table; residency adds its tables). */
static void publish_bytes(rb_session_mem *m);

static uint64_t scratch_bytes(const rb_session_mem *m)
{
    const uint64_t run = atomic_load_explicit(&m->run_state_out, memory_order_relaxed)
                             ? 0 : m->fwd->mem_bytes;
    return run + (uint64_t)m->fwd->hp.n_vocab * sizeof(float);
}

rb_status rb_session_memory_ensure_run_state(rb_session_mem *m, rb_error *err)
{
    if (!atomic_load_explicit(&m->run_state_out, memory_order_relaxed))
        return RB_OK;
    rb_status st = rb_forward_ensure_run_state(m->fwd, err);
    if (st == RB_OK) {
        atomic_store_explicit(&m->run_state_out, 0, memory_order_relaxed);
        publish_bytes(m); /* before the feed's enforcement counts it */
    }
    return st;
}

void rb_session_memory_release_run_state(rb_session_mem *m)
{
    if (atomic_load_explicit(&m->run_state_out, memory_order_relaxed))
        return;
    rb_forward_release_run_state(m->fwd);
    atomic_store_explicit(&m->run_state_out, 1, memory_order_relaxed);
    publish_bytes(m);
}

static uint64_t table_bytes(const rb_session_mem *m)
{
    return (uint64_t)m->kv->n_ctx * sizeof(int32_t) +
           (uint64_t)m->kv->n_layers * m->kv->pages_per_layer * sizeof(void *);
}

/* RAM the session holds besides weights and KV, before residency exists. */
static uint64_t fixed_bytes(const rb_session_mem *m) { return scratch_bytes(m) + table_bytes(m); }

int rb_session_memory_wants_streaming(const rb_session_mem *m)
{
    const rb_session_params *p = m->params;
    if (p->weights_budget_bytes)
        return 1;
    if (!p->budget_bytes || rb_model_is_mapped(m->model))
        return 0; /* a mapped model's weights belong to the page cache */
    /* the weights stream when they and a full context's KV do not fit:
       spilled KV would be read back by every token just the same, and the
       weights are the part that streams in layer order with read-ahead */
    rb_model_info info;
    rb_model_get_info(m->model, &info);
    /* a full context's pages; a sliding-window layer holds its window's */
    uint64_t pages = 0, win = rb_session_memory_window_first_page(m, m->kv->n_ctx - 1);
    for (uint32_t l = 0; l < m->kv->n_layers; l++)
        pages += m->fwd->layers[l].window ? m->kv->pages_per_layer - win : m->kv->pages_per_layer;
    uint64_t kv_full = pages * rb_kvcache_page_alloc_bytes(m->kv);
    return p->budget_bytes < info.tensor_data_bytes + fixed_bytes(m) + kv_full;
}

/* The weight cache's share: its own budget, and what a memory budget
 * leaves after `fixed` bytes of run state and tables and kv_bytes of KV
 * (0: nothing left). budget: the pool's less what the pool counts for the
 * others (0: no memory budget). */
static uint64_t weights_share(const rb_session_mem *m, uint64_t budget, uint64_t fixed,
                              uint64_t kv_bytes)
{
    const rb_session_params *p = m->params;
    uint64_t cap = p->weights_budget_bytes ? p->weights_budget_bytes : UINT64_MAX;
    if (budget) {
        uint64_t rest = fixed + kv_bytes;
        uint64_t left = budget > rest ? budget - rest : 0;
        cap = left < cap ? left : cap;
    }
    return cap;
}

static double mib(uint64_t b) { return (double)b / 1048576.0; }

/* Joins the model's shared stream (the caller holds the model's lock:
 * session.c's setup). The stream reads through a throttle of its own
 * (the same device profile): it may outlive this session. */
static rb_status stream_init(rb_session_mem *m, const rb_profile *prof, rb_error *err)
{
    const rb_session_params *p = m->params;
    /* before the memory manager exists: its tables are not counted yet;
       the first feed re-balances with the real figures before any read */
    uint64_t min = 0;
    rb_wcache_stream_params wp = {.budget_bytes = weights_share(m, p->budget_bytes,
                                                                fixed_bytes(m), 0),
                                  .policy = p->weights_policy, .min_budget_out = &min};
    if (wp.budget_bytes == 0)
        wp.budget_bytes = 1; /* nothing left: the error below names the minimum */
    rb_throttle *t = NULL;
    if (prof->is_throttled) {
        if (!(t = calloc(1, sizeof *t)))
            return rb_error_set(err, RB_E_NOMEM, "session: out of memory");
        rb_status tst = rb_throttle_init(t, prof->bw_bytes_per_s, prof->latency_s, err);
        if (tst != RB_OK) {
            free(t);
            return tst;
        }
        wp.takes_throttle = 1;
    }
    rb_error e = {0};
    rb_status st = rb_wcache_stream_join(m->model, rb_model_path(m->model), NULL, t, &wp, m,
                                         &m->wstream, &e);
    if (st == RB_E_BUDGET && !p->weights_budget_bytes) /* in the budget the caller gave */
        return rb_error_set(err, st, "session: a memory budget of %.2f MiB leaves %.2f MiB for "
                            "weights after the run state (%.2f MiB), below the weights' minimum "
                            "of %.2f MiB: it needs at least %.2f MiB (%s)", mib(p->budget_bytes),
                            mib(wp.budget_bytes), mib(fixed_bytes(m)), mib(min),
                            mib(min + fixed_bytes(m)), e.message);
    if (st != RB_OK)
        return rb_error_set(err, st, "%s", e.message);
    m->fwd->rows_gate = rows_gate;
    m->fwd->rows_gate_ctx = m;
    return RB_OK;
}

rb_status rb_session_memory_init(rb_session_mem *m, int is_cold, rb_error *err)
{
    const rb_session_params *p = m->params;
    const rb_experimental_params *x = m->exp;
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
    m->device_bw = prof.is_throttled ? prof.bw_bytes_per_s : 0;
    if (prof.is_throttled) {
        if (!(m->throttle = calloc(1, sizeof *m->throttle)))
            return rb_error_set(err, RB_E_NOMEM, "session: out of memory");
        if ((st = rb_throttle_init(m->throttle, prof.bw_bytes_per_s, prof.latency_s, err)) !=
            RB_OK) {
            free(m->throttle);
            m->throttle = NULL;
            return st;
        }
    }

    rb_store_params sp = rb_store_default_params();
    sp.dir = p->spill_dir;
    sp.throttle = m->throttle;
    rb_error serr = {0};
    if (rb_store_open(&sp, &m->store, &serr) == RB_OK) {
        snprintf(m->store_note, sizeof m->store_note, "%s", rb_store_io_mode(m->store));
    } else {
        m->store = NULL;
        if (p->spill_dir && *p->spill_dir)
            return rb_error_set(err, serr.status, "%s", serr.message);
        snprintf(m->store_note, sizeof m->store_note, "no storage tier: %s", serr.message);
    }

    rb_error werr = {0};
    if (rb_session_memory_wants_streaming(m)) {
        if ((st = stream_init(m, &prof, err)) != RB_OK)
            return st;
        is_cold = 0; /* the stream reads every block on use */
    } else if (rb_wcache_shared(m->model, &m->wcache, &werr) != RB_OK) {
        m->wcache = NULL;
        if (werr.status != RB_E_UNSUPPORTED) /* mapped: weights just stay */
            return rb_error_set(err, werr.status, "%s", werr.message);
    }

    rb_residency_kv kv = {
        .cache = m->kv,
        .n_layers = m->kv->n_layers,
        .pages_per_layer = m->kv->pages_per_layer,
        .page_bytes = m->kv->page_bytes,
        /* a quantized page is its bytes to the codec: the lossless codec
           sees them as f16 values (every row is an even number of bytes) */
        .dims = {m->kv->page_tokens, m->kv->n_kv_heads, (uint32_t)(m->kv->row_k / 2),
                 (uint32_t)(m->kv->row_v / 2)},
    };
    rb_residency_params rp = {
        .restore = p->restore,
        .ram_codec = p->ram_codec,
        .decode_bytes_per_s = x->decode_bytes_per_s,
        .storage_bytes_per_s = x->storage_bytes_per_s > 0 ? x->storage_bytes_per_s
                               : prof.is_throttled ? prof.bw_bytes_per_s : 0,
        .storage_latency_s = prof.latency_s,
        .storage_bw_fixed = x->storage_bytes_per_s > 0,
        .throttle = m->throttle,
    };
    if (is_cold && !m->wcache && !m->wstream)
        return rb_error_set(err, RB_E_UNSUPPORTED, "session: a cold start needs the weight "
                            "cache (%s)", werr.message);
    if (is_cold && (st = rb_wcache_mark_unread(m->wcache, err)) != RB_OK)
        return st;
    if ((st = rb_residency_create(&rp, &kv, m->store, m->wcache, &m->res, err)) != RB_OK)
        return st;
    rb_residency_hold(m->res); /* the session is held while it is built */
    m->fwd->layer_gate = layer_gate;
    m->fwd->layer_gate_ctx = m;
    return pool_join(m, err);
}

rb_status rb_session_memory_read_rest(rb_session_mem *m, rb_error *err)
{
    return m->wcache ? rb_wcache_read_rest(m->wcache, m->throttle, err) : RB_OK;
}

void rb_session_memory_leave_pool(rb_session_mem *m)
{
    /* first: the pool trims members from other threads until it lets go */
    rb_pool_leave(m->member);
    m->member = NULL;
    if (m->owns_pool)
        rb_pool_destroy(m->mpool);
    m->mpool = NULL;
    m->owns_pool = 0;
}

void rb_session_memory_early_init(rb_session_mem *m)
{
    pthread_mutex_init(&m->op_mu, NULL);
    pthread_mutex_init(&m->req_mu, NULL);
    pthread_cond_init(&m->req_cv, NULL);
    m->held_layer = -1;
    /* held until the session is built: a pool it joins trims it only after */
    rb_session_memory_enter(m);
}

void rb_session_memory_deinit(rb_session_mem *m)
{
    rb_session_memory_leave_pool(m);
    rb_residency_destroy(m->res);
    m->res = NULL;
    m->fwd->layer_gate = NULL;
    m->fwd->rows_gate = NULL;
    if (m->wstream) { /* the last session of the model destroys the stream */
        rb_wcache_stream_pass_end(m->wstream);
        rb_model_lock(m->model);
        rb_wcache_stream_leave(m->model, m->wstream, m);
        rb_model_unlock(m->model);
    }
    m->wstream = NULL;
    m->wcache = NULL; /* the model's */
    rb_store_close(m->store);
    m->store = NULL;
    if (m->throttle) {
        rb_throttle_deinit(m->throttle);
        free(m->throttle);
        m->throttle = NULL;
    }
    pthread_mutex_destroy(&m->op_mu);
    pthread_mutex_destroy(&m->req_mu);
    pthread_cond_destroy(&m->req_cv);
}


/* ---- the pool and the calls from any thread ------------------------------ */

static int is_zram_codec(rb_ram_codec c)
{
    return c == RB_RAM_CODEC_LZ4 || c == RB_RAM_CODEC_ZSTD;
}

/* What the session holds in RAM besides the model's weights, from the
 * memory modules' own numbers (never the public stats): KV in RAM in any
 * form, the run state and tables (the session's and residency's), and a
 * streaming session's block cache. */
typedef struct own_bytes {
    uint64_t kv, fixed, stream;
    uint64_t kv_shared; /* resident shared pages: the pool counts them */
} own_bytes;

static own_bytes count_own(const rb_session_mem *m)
{
    own_bytes o = {0, fixed_bytes(m), 0, 0};
    if (m->res) {
        rb_residency_bytes rb;
        rb_residency_get_bytes(m->res, &rb);
        o.kv = rb.kv_ram_bytes;
        o.kv_shared = rb.kv_shared_bytes;
        o.fixed += rb.tables_bytes;
    }
    if (m->wstream && rb_wcache_stream_counts_for(m->wstream, m)) { /* counted once */
        rb_wcache_stream_stats ws;
        rb_wcache_stream_get_stats(m->wstream, &ws);
        o.stream = ws.resident_bytes;
    }
    return o;
}

static uint64_t own_total(const own_bytes *o) { return o->kv + o->fixed + o->stream; }

static void publish_bytes(rb_session_mem *m)
{
    if (!m->member)
        return;
    own_bytes o = count_own(m);
    rb_pool_member_set_bytes(m->member, own_total(&o));
}

static void mark_held(rb_session_mem *m)
{
    pthread_mutex_lock(&m->req_mu);
    m->op_held = 1;
    m->op_owner = pthread_self();
    pthread_mutex_unlock(&m->req_mu);
}

/* 1 when this thread holds the session (a callback, or its own pool). */
static int held_by_me(rb_session_mem *m)
{
    pthread_mutex_lock(&m->req_mu);
    int me = m->op_held && pthread_equal(m->op_owner, pthread_self());
    pthread_mutex_unlock(&m->req_mu);
    return me;
}

/* op_mu was just taken: the session is this thread's, and so is its
 * residency manager (which waits for a pool trim running on it). */
static void take_op(rb_session_mem *m)
{
    mark_held(m);
    if (m->res)
        rb_residency_hold(m->res);
}

void rb_session_memory_enter(rb_session_mem *m)
{
    pthread_mutex_lock(&m->op_mu);
    take_op(m);
}

int rb_session_memory_try_enter(rb_session_mem *m)
{
    if (pthread_mutex_trylock(&m->op_mu) != 0)
        return 0;
    take_op(m);
    return 1;
}

void rb_session_memory_let_go(rb_session_mem *m)
{
    if (held_by_me(m)) {
        pthread_mutex_lock(&m->req_mu);
        m->op_held = 0;
        pthread_mutex_unlock(&m->req_mu);
        pthread_mutex_unlock(&m->op_mu);
    }
}

void rb_session_memory_leave(rb_session_mem *m)
{
    /* the residency lets go only when no pool trim waits for this thread */
    do
        rb_session_memory_serve_requests(m);
    while (m->res && !rb_residency_let_go(m->res));
    pthread_mutex_lock(&m->req_mu);
    m->op_held = 0;
    pthread_mutex_unlock(&m->req_mu);
    pthread_mutex_unlock(&m->op_mu);
}

/* A trim that failed: counted with its status (req_mu taken here). */
static void note_trim_failure(rb_session_mem *m, const rb_error *e)
{
    pthread_mutex_lock(&m->req_mu);
    m->n_trim_failures++;
    m->trim_status = e->status;
    m->trim_fail_s = rb_throttle_now_s();
    pthread_mutex_unlock(&m->req_mu);
}

/* The pool's trim the residency manager recorded for this thread (op
 * held, outside a pass): served, and the bytes published. */
static void serve_pool_trim(rb_session_mem *m)
{
    if (!m->res || !rb_residency_trim_pending(m->res))
        return;
    rb_session_memory_settle_restore(m, 0);
    (void)rb_residency_serve_pool_trim(m->res); /* a failure is counted there */
    publish_bytes(m);
}

void rb_session_memory_serve_requests(rb_session_mem *m)
{
    serve_pool_trim(m);
    pthread_mutex_lock(&m->req_mu);
    if (!m->req_pending) {
        atomic_store(&m->interrupt, atomic_load(&m->abort_req));
        atomic_store(&m->interrupt_batch, 0);
        pthread_mutex_unlock(&m->req_mu);
        return;
    }
    uint64_t id = m->req_posted, bytes = m->req_bytes;
    rb_trim_level level = m->req_level;
    rb_trim_scope scope = m->req_scope;
    m->req_pending = 0;
    atomic_store(&m->interrupt, atomic_load(&m->abort_req));
    atomic_store(&m->interrupt_batch, 0);
    pthread_mutex_unlock(&m->req_mu);
    uint64_t freed = 0;
    rb_error e = {0};
    rb_status st = rb_session_memory_trim_locked(m, bytes, level, scope, &freed, &e);
    pthread_mutex_lock(&m->req_mu);
    m->req_freed = freed;
    m->req_status = st;
    m->req_err = e;
    m->req_served = id;
    pthread_cond_broadcast(&m->req_cv);
    pthread_mutex_unlock(&m->req_mu);
}

/* Posts a trim for the thread that holds the session; wait: until it was
 * served (then the bytes it freed and its status, its message in err),
 * else 0 and RB_OK at once (a failure is counted when it is served). */
static uint64_t post_request(rb_session_mem *m, uint64_t bytes, rb_trim_level level,
                             rb_trim_scope scope, int wait, rb_status *st_out,
                             rb_error *err)
{
    pthread_mutex_lock(&m->req_mu);
    if (m->op_held && pthread_equal(m->op_owner, pthread_self()))
        wait = 0; /* from the feed's own callback: served when it returns */
    if (!m->req_pending) {
        m->req_bytes = bytes;
        m->req_level = level;
        m->req_scope = scope;
    } else {
        if (level > m->req_level)
            m->req_level = level;
        if (bytes > m->req_bytes)
            m->req_bytes = bytes;
        if (scope < m->req_scope) /* the least restricted of them */
            m->req_scope = scope;
    }
    m->req_pending = 1;
    uint64_t id = ++m->req_posted;
    atomic_store_explicit(wait ? &m->interrupt : &m->interrupt_batch, 1, memory_order_release);
    while (wait && m->req_served < id) {
        pthread_mutex_unlock(&m->req_mu);
        /* the holder may have let go before it saw the request */
        if (pthread_mutex_trylock(&m->op_mu) == 0) {
            take_op(m);
            rb_session_memory_leave(m);
        }
        pthread_mutex_lock(&m->req_mu);
        if (m->req_served < id) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 2000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&m->req_cv, &m->req_mu, &ts);
        }
    }
    uint64_t freed = wait ? m->req_freed : 0;
    rb_status st = wait ? m->req_status : RB_OK;
    if (st != RB_OK)
        rb_error_set(err, st, "%s", m->req_err.message);
    pthread_mutex_unlock(&m->req_mu);
    if (st_out)
        *st_out = st;
    return freed;
}

static rb_status pool_join(rb_session_mem *m, rb_error *err)
{
    rb_pool *pool = m->params->pool;
    rb_status st;
    if (pool) {
        if (rb_pool_model(pool) != m->model)
            return rb_error_set(err, RB_E_INVALID_ARG, "session: the pool is of another model "
                                "(one model per pool)");
    } else {
        if ((st = rb_pool_create_impl(m->model, m->params->budget_bytes, &pool, err)) != RB_OK)
            return st;
        m->owns_pool = 1;
    }
    m->mpool = pool;
    rb_model_info info;
    rb_model_get_info(m->model, &info);
    /* the weights the pool counts: the model's cache, or all of them
       (mapped), or none (a stream: the session counts its cache) */
    rb_pool_set_weights(pool, m->wcache, m->wcache || m->wstream ? 0 : info.tensor_data_bytes);
    if ((st = rb_pool_join(pool, m->res, m->params->priority, m->handle, &m->member, err)) !=
        RB_OK)
        return st;
    publish_bytes(m);
    return RB_OK;
}

rb_status rb_session_memory_set_priority(rb_session_mem *m, rb_priority priority)
{
    if (m->member)
        rb_pool_member_set_priority(m->member, priority);
    return RB_OK;
}

void rb_session_memory_prefetch(rb_session_mem *m, int trim_background, uint64_t *planned)
{
    *planned = 0;
    if (!m->res || m->restore_open)
        return; /* one restore at a time: a prefetch, or one begun at open */
    const uint64_t kv_need = rb_residency_restore_need(m->res);
    uint64_t want = kv_need;
    if (m->wcache) /* the model's released layers: the next pass reads them */
        want += rb_wcache_total_bytes(m->wcache) - rb_wcache_resident_bytes(m->wcache);
    if (!want)
        return;
    publish_bytes(m); /* the pool's room is counted from fresh figures */
    if (m->member && trim_background) /* the trimmed buffers: this restore's pages */
        rb_residency_open_spare(m->res, kv_need);
    uint64_t grant = m->member ? rb_pool_grant_prefetch(m->mpool, m->member, want,
                                                        trim_background)
                               : want;
    uint32_t n = 0;
    if (grant)
        rb_residency_begin_prefetch(m->res, grant, planned, &n);
    if (!n)
        rb_residency_close_spare(m->res);
    if (m->member)
        rb_pool_member_set_prefetch(m->member, n ? *planned : 0);
    if (n) {
        m->restore_open = 1;
        m->restore_is_prefetch = 1;
        m->restore_open_from = UINT32_MAX;
    } else {
        *planned = 0;
    }
}

/* An open prefetch ends (op held): what came is the session's, published;
 * the pool's reservation goes. count: as rb_residency_settle_prefetch. */
static void settle_prefetch(rb_session_mem *m, int count)
{
    m->restore_open = 0;
    m->restore_is_prefetch = 0;
    (void)rb_residency_settle_prefetch(m->res, count);
    publish_bytes(m);
    if (m->member)
        rb_pool_member_set_prefetch(m->member, 0);
}

void rb_session_memory_abort(rb_session_mem *m)
{
    atomic_store(&m->abort_req, 1);
    atomic_store_explicit(&m->interrupt, 1, memory_order_release);
}

int rb_session_memory_take_abort(rb_session_mem *m) { return atomic_exchange(&m->abort_req, 0); }

rb_status rb_session_memory_trim_locked(rb_session_mem *m, uint64_t bytes, rb_trim_level level,
                                        rb_trim_scope scope, uint64_t *freed_out,
                                        rb_error *err)
{
    rb_status st;
    uint64_t freed = 0;
    if (!m->res) {
        st = rb_error_set(err, RB_E_INVALID_ARG, "session: no memory manager");
    } else if ((unsigned)level > RB_TRIM_COMPLETE) {
        st = rb_error_set(err, RB_E_INVALID_ARG, "session: unknown trim level %d", (int)level);
    } else {
        rb_session_memory_settle_restore(m, 0);
        st = rb_residency_trim_kv(m->res, bytes, level, scope, &freed, err);
        /* streamed weights: a complete trim, or bytes the KV could not
           give, come out of the block cache (they stream back on use) */
        if (st == RB_OK && m->wstream && scope == RB_TRIM_SCOPE_ALL &&
            (level == RB_TRIM_COMPLETE || (level == RB_TRIM_BYTES && freed < bytes)))
            freed += rb_wcache_stream_drop(m->wstream);
        /* a mapped model's weights are the page cache's: a complete trim
           drops the process's mapping of them (they fault back from the
           file) */
        if (st == RB_OK && scope == RB_TRIM_SCOPE_ALL && level == RB_TRIM_COMPLETE &&
            !m->wcache && !m->wstream)
            freed += rb_model_drop_mapped_pages(m->model);
        publish_bytes(m);
    }
    if (st != RB_OK)
        note_trim_failure(m, err);
    if (freed_out)
        *freed_out = freed;
    return st;
}

rb_status rb_session_memory_trim(rb_session_mem *m, uint64_t bytes, rb_trim_level level,
                                 uint64_t *freed, rb_error *err)
{
    rb_status st = RB_OK;
    if (pthread_mutex_trylock(&m->op_mu) == 0) { /* idle: trim now */
        take_op(m);
        st = rb_session_memory_trim_locked(m, bytes, level, RB_TRIM_SCOPE_ALL, freed, err);
        rb_session_memory_leave(m);
    } else {
        *freed = post_request(m, bytes, level, RB_TRIM_SCOPE_ALL, 1, &st, err);
    }
    return st;
}

void rb_session_memory_fill_stats(const rb_session_mem *m, rb_session_stats *out)
{
    memset(out, 0, sizeof *out);
    rb_model_info info;
    rb_model_get_info(m->model, &info);
    out->weights_bytes = m->wcache ? rb_wcache_resident_bytes(m->wcache) : info.tensor_data_bytes;
    out->weights_evicted_bytes = m->wcache ? rb_wcache_total_bytes(m->wcache) -
                                                 out->weights_bytes : 0;
    if (m->wstream) {
        rb_wcache_stream_stats ws;
        rb_wcache_stream_get_stats(m->wstream, &ws);
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
    out->scratch_bytes = scratch_bytes(m);
    out->other_bytes = table_bytes(m);
    if (m->res)
        rb_residency_stats(m->res, out);
    out->total_bytes = out->weights_bytes + out->kv_raw_bytes + out->kv_compressed_bytes +
                       out->scratch_bytes + out->other_bytes;
    out->budget_bytes = m->mpool ? rb_pool_budget(m->mpool) : m->params->budget_bytes;
    out->storage_io = m->store_note;
    out->device_bytes_per_s = m->device_bw;
    out->budget_over_bytes = m->budget_over_bytes;
    out->room_s = m->room_s;
    if (m->res) {
        uint64_t put;
        rb_residency_spare_counts(m->res, &put, &out->restore_spare_pages);
    }
    rb_session_mem *mm = (rb_session_mem *)m; /* the lock is not part of the value */
    pthread_mutex_lock(&mm->req_mu);
    out->trim_failures = m->n_trim_failures;
    out->trim_status = m->trim_status;
    const double own_s = m->trim_fail_s;
    pthread_mutex_unlock(&mm->req_mu);
    if (m->res) { /* and the pool's, which the residency manager counts */
        uint64_t n;
        rb_status last;
        double when_s;
        rb_residency_trim_failures(m->res, &n, &last, &when_s);
        out->trim_failures += n;
        if (n && when_s >= own_s)
            out->trim_status = last;
    }
}

void rb_session_memory_after_feed(rb_session_mem *m)
{
    publish_bytes(m);
    rb_pool_member_touch(m->member);
    /* over budget: the pool takes the excess back - the other sessions'
       KV, least recently used first, then this one's (last layers first),
       then the weights (the zram baseline keeps them: it compresses KV
       only, as the kernel's zRAM would); what cannot go stays, and the
       stats show it */
    m->budget_over_bytes = rb_pool_enforce(m->mpool, m->member, 0, 1,
                                           !is_zram_codec(m->params->ram_codec));
}

void rb_session_memory_before_feed(rb_session_mem *m, uint32_t n_pages_after)
{
    /* a prefetch: the feed takes over. What came is resident; what has
       not started is planned again by begin_restore (waits only for the
       segments in flight) */
    if (m->restore_open && m->restore_is_prefetch)
        settle_prefetch(m, 0);
    own_bytes o = count_own(m);
    const uint64_t budget = m->mpool ? rb_pool_budget(m->mpool) : 0;
    m->room_s = 0;
    if (budget) {
        /* the feed brings this session's KV back and grows it: the other
           sessions make room first (this one trims after the feed). What
           it holds already counts, the pages it shares too (a fork's
           prefix is in the pool's total, not a growth) */
        uint64_t after = (uint64_t)n_pages_after * m->kv->n_layers *
                         rb_kvcache_page_alloc_bytes(m->kv);
        const uint64_t held = o.kv + o.kv_shared;
        /* and the model's weights any session released: the pass reads
           them all back */
        uint64_t evicted = m->wcache ? rb_wcache_total_bytes(m->wcache) -
                                           rb_wcache_resident_bytes(m->wcache) : 0;
        uint64_t extra = (after > held ? after - held : 0) + evicted;
        if (m->member) /* the figures just counted, not a second scan */
            rb_pool_member_set_bytes(m->member, own_total(&o));
        const double t0 = rb_throttle_now_s();
        if (m->res && extra) /* the others' trimmed buffers: this restore's pages */
            rb_residency_open_spare(m->res, rb_residency_restore_need(m->res));
        rb_pool_enforce(m->mpool, m->member, extra, 0, 0);
        m->room_s = rb_throttle_now_s() - t0;
    }
    if (!m->wstream || !budget)
        return;
    /* a streaming session is in the pool like any other: its weights get
       what the pool's budget leaves after the others, its run state and
       its KV (in its own pool: its budget_bytes) */
    uint64_t others = rb_pool_others_bytes(m->mpool, m->member);
    if (!rb_wcache_stream_counts_for(m->wstream, m)) {
        /* the shared stream's blocks are in its oldest session's count:
           they are this session's weights too, not the others' memory */
        rb_wcache_stream_stats ws;
        rb_wcache_stream_get_stats(m->wstream, &ws);
        others = others > ws.resident_bytes ? others - ws.resident_bytes : 0;
    }
    uint64_t kv = o.kv;
    if (n_pages_after > m->kv->n_pages_reserved)
        kv += (uint64_t)(n_pages_after - m->kv->n_pages_reserved) * m->kv->n_layers *
              rb_kvcache_page_alloc_bytes(m->kv);
    uint64_t share = weights_share(m, budget > others ? budget - others : 1, o.fixed, kv);
    uint64_t min = rb_wcache_stream_min_budget(m->wstream);
    if (share < min) {
        /* the weights are at their floor: the KV gives the rest (last
           layers first, as a trim); what it cannot give shows in the stats */
        uint64_t excess = min - share;
        rb_residency_trim(m->res, excess, RB_TRIM_BYTES, NULL, m->err);
        share = min;
    }
    /* the shared stream holds the largest request of its sessions; block
       granularity: the KV grows a page at a time, so this changes the
       cache (and drops its read-ahead) only when a page is added */
    rb_wcache_stream_request(m->wstream, m, share, m->err);
}

void rb_session_memory_pass_end(rb_session_mem *m)
{
    if (m->wstream)
        rb_wcache_stream_pass_end(m->wstream);
}

rb_status rb_session_memory_set_mode(rb_session_mem *m, rb_restore_mode mode, rb_ram_codec codec)
{
    rb_session_memory_settle_restore(m, 0);
    return rb_residency_set_mode(m->res, mode, codec, m->err);
}

size_t rb_session_memory_events(const rb_session_mem *m, rb_restore_event *out, size_t max)
{
    return m->res ? rb_residency_events(m->res, out, max) : 0;
}

/* ---- around a feed ------------------------------------------------------------ */

rb_status rb_session_memory_begin_restore(rb_session_mem *m, uint32_t *recompute_from)
{
    *recompute_from = UINT32_MAX;
    if (m->restore_open && m->restore_is_prefetch)
        settle_prefetch(m, 0); /* the feed plans what has not come */
    if (m->restore_open) { /* begun at open: this feed joins it */
        m->restore_open = 0;
        if (rb_residency_restore_is_open(m->res)) { /* a pool trim did not stop it */
            *recompute_from = m->restore_open_from;
            return RB_OK;
        }
    }
    return m->res ? rb_residency_begin_restore(m->res, recompute_from, m->err) : RB_OK;
}

void rb_session_memory_drop_restore(rb_session_mem *m)
{
    if (!m->res)
        return;
    uint32_t ignored;
    rb_error e = {0};
    rb_residency_cancel_restore(m->res);
    (void)rb_residency_end_restore(m->res, &ignored, &e);
}

void rb_session_memory_settle_restore(rb_session_mem *m, int finish)
{
    if (!m->restore_open)
        return;
    if (m->restore_is_prefetch) { /* nothing waits for a prefetch */
        settle_prefetch(m, 1);
        return;
    }
    m->restore_open = 0;
    if (!rb_residency_restore_is_open(m->res))
        return; /* a pool trim stopped it while the session was idle */
    if (!finish)
        rb_residency_cancel_restore(m->res);
    uint32_t damaged;
    rb_error e = {0};
    (void)rb_residency_end_restore(m->res, &damaged, &e); /* the next feed retries */
}

/* Begins the layers' restore at open, before the first feed asks for it:
 * weights and KV then stream from the start while the model's fingerprint
 * is checked, the rest of the weights read and the caller builds its
 * tokenizer. Only for the plain cold start (pipelined, no budgets): a
 * budget may trim before the feed, eager would block the open. */
void rb_session_memory_open_restore(rb_session_mem *m)
{
    const rb_session_params *p = m->params;
    if (!m->res || p->restore != RB_RESTORE_PIPELINED || p->budget_bytes ||
        p->weights_budget_bytes)
        return;
    rb_error e = {0};
    if (rb_residency_begin_restore(m->res, &m->restore_open_from, &e) == RB_OK)
        m->restore_open = 1;
}

void rb_session_memory_pass_begin(rb_session_mem *m)
{
    if (m->res) /* the pool's trims wait for the pass (its gate serves them) */
        rb_residency_set_in_pass(m->res, 1);
    m->stop_interrupt = 0;
    m->gate_status = RB_OK;
    /* restore progress only when this plan brings something back */
    m->progress_layers = m->params->progress && m->res && rb_residency_n_restoring(m->res)
                             ? m->kv->n_layers : 0;
}

void rb_session_memory_set_pages(rb_session_mem *m, uint32_t n_pages)
{
    if (m->res)
        rb_residency_set_pages(m->res, n_pages);
}

void rb_session_memory_batch_done(rb_session_mem *m) { m->grace_batch = 0; }

void rb_session_memory_note_compute(rb_session_mem *m, size_t n, double seconds)
{
    if (m->res)
        rb_residency_note_compute(m->res, n, seconds);
}

rb_status rb_session_memory_end_restore(rb_session_mem *m, uint32_t *damaged)
{
    rb_status st = RB_OK;
    *damaged = UINT32_MAX;
    if (m->res)
        st = rb_residency_end_restore(m->res, damaged, m->err);
    if (m->res)
        rb_residency_set_in_pass(m->res, 0);
    m->progress_layers = 0;
    return st;
}

rb_status rb_session_memory_pass_error(rb_session_mem *m, int stopped)
{
    if (m->gate_status != RB_OK)
        return m->gate_status; /* weights could not be re-read: nothing computes */
    if (stopped && !m->stop_interrupt && m->wstream)
        return rb_wcache_stream_error(m->wstream, m->err); /* the same, streamed */
    return RB_OK;
}

int rb_session_memory_take_stop(rb_session_mem *m)
{
    int stop = m->stop_interrupt;
    m->stop_interrupt = 0;
    return stop;
}

void rb_session_memory_grant_grace(rb_session_mem *m) { m->grace_batch = 1; }

rb_status rb_session_memory_restore_pages(rb_session_mem *m, uint32_t pages, uint32_t *from)
{
    *from = UINT32_MAX;
    rb_session_memory_settle_restore(m, 1);
    if (!m->res)
        return RB_OK;
    uint32_t damaged = UINT32_MAX;
    rb_status st = rb_residency_begin_restore_pages(m->res, pages, from, m->err);
    if (st != RB_OK)
        return st;
    if ((st = rb_residency_end_restore(m->res, &damaged, m->err)) != RB_OK)
        return st;
    if (damaged < *from)
        *from = damaged;
    return RB_OK;
}

/* ---- pages ---------------------------------------------------------------------- */

uint32_t rb_session_memory_window_first_page(const rb_session_mem *m, size_t pos)
{
    const uint32_t w = m->fwd->hp.n_swa;
    if (w == 0 || pos < w)
        return 0;
    return (uint32_t)((pos - w + 1) / m->kv->page_tokens);
}

/* A page of a sliding-window layer whose last position is before the
 * window of the next query is never read again: it goes (RAM, compressed
 * frame, spill copy). A rewind behind the window, or a recompute from a
 * position whose window reaches a released page, recomputes from 0 (the
 * layers' K/V at a position depend on the windows before it, layer by
 * layer: there is no shorter exact path). */
void rb_session_memory_release_window(rb_session_mem *m, size_t next_pos, int in_feed)
{
    const uint32_t dead = rb_session_memory_window_first_page(m, next_pos);
    if (dead <= m->window_released_pages)
        return;
    uint32_t released = dead;
    for (uint32_t l = 0; l < m->kv->n_layers; l++) {
        if (!m->fwd->layers[l].window)
            continue;
        for (uint32_t pg = m->window_released_pages; pg < dead; pg++) {
            if (m->res) {
                if (!rb_residency_release_page(m->res, l, pg, in_feed) && pg < released)
                    released = pg;
            } else {
                rb_kvcache_free_page(m->kv, l, pg);
            }
        }
    }
    if (dead > m->window_dead_pages)
        m->window_dead_pages = dead;
    m->window_released_pages = released;
}

size_t rb_session_memory_recompute_point(const rb_session_mem *m, size_t from)
{
    if (from == 0 || m->window_dead_pages == 0)
        return from;
    return rb_session_memory_window_first_page(m, from) < m->window_dead_pages ? 0 : from;
}

void rb_session_memory_will_write(rb_session_mem *m, uint32_t page)
{
    if (m->res)
        rb_residency_will_write(m->res, page);
}

void rb_session_memory_forget_from(rb_session_mem *m, uint32_t first_page)
{
    if (m->res)
        rb_residency_forget_from(m->res, first_page);
    rb_kvcache_truncate(m->kv, first_page);
    if (m->window_dead_pages > first_page)
        m->window_dead_pages = first_page;
    if (m->window_released_pages > first_page)
        m->window_released_pages = first_page;
}

struct rb_pool *rb_session_memory_pool(const rb_session_mem *m) { return m->mpool; }

rb_status rb_session_memory_fork_pages(rb_session_mem *dst, rb_session_mem *src, size_t n_valid,
                                       size_t *dst_valid, rb_error *err)
{
    rb_kvcache *d = dst->kv, *s = src->kv;
    const uint32_t P = s->page_tokens, full = (uint32_t)(n_valid / P);
    const uint32_t want = (uint32_t)((n_valid + P - 1) / P);
    *dst_valid = 0;
    if (!rb_kvcache_same_layout(d, s))
        return rb_error_set(err, RB_E_INVALID_ARG, "session: a fork's KV cache must have its "
                            "source's context and types");
    if (dst->mpool != src->mpool)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: a fork is in its source's pool");
    /* the leading pages every layer of src holds in RAM */
    uint32_t k = 0;
    for (; k < want && k < s->n_pages_reserved; k++) {
        int all = 1;
        for (uint32_t l = 0; l < s->n_layers && all; l++)
            all = s->pages[(size_t)l * s->pages_per_layer + k] != NULL;
        if (!all)
            break;
    }
    rb_kvshare *acct = rb_pool_kvshare(src->mpool);
    rb_status st = RB_OK;
    uint32_t done = 0;
    for (; done < k && st == RB_OK; done++)
        for (uint32_t l = 0; l < s->n_layers && st == RB_OK; l++) {
            const size_t id = (size_t)l * s->pages_per_layer + done;
            st = done < full ? rb_kvcache_share_slot(d, s, id, acct, err)
                             : rb_kvcache_copy_slot(d, s, id, err);
        }
    if (st != RB_OK) { /* what it took of the failed page goes */
        done--;
        rb_kvcache_truncate(d, done);
    }
    d->n_pages_reserved = done;
    if (dst->res)
        rb_residency_set_pages(dst->res, done);
    *dst_valid = done == want ? n_valid : (size_t)done * P;
    publish_bytes(src);
    publish_bytes(dst);
    return st;
}

rb_status rb_session_memory_unshare_page(rb_session_mem *m, uint32_t page)
{
    if (m->res)
        return rb_residency_unshare_page(m->res, page, m->err);
    rb_status st = RB_OK;
    for (uint32_t l = 0; l < m->kv->n_layers && st == RB_OK; l++)
        st = rb_kvcache_unshare_slot(m->kv, (size_t)l * m->kv->pages_per_layer + page, m->err);
    return st;
}

void rb_session_memory_adopt_saved(rb_session_mem *m, uint32_t layer, uint32_t page,
                                   int is_clean)
{
    rb_residency_adopt_saved(m->res, layer, page, is_clean);
}

void rb_session_memory_mark_saved(rb_session_mem *m, uint32_t n_pages)
{
    for (uint32_t l = 0; m->res && l < m->kv->n_layers; l++)
        for (uint32_t p = 0; p < n_pages; p++)
            rb_residency_mark_saved(m->res, l, p, 1, rb_residency_epoch(m->res),
                                    RB_RESIDENCY_FULL);
}

void rb_session_memory_adopted(rb_session_mem *m, uint32_t n_pages, uint32_t first_window_page)
{
    m->kv->n_pages_reserved = n_pages;
    rb_residency_set_pages(m->res, n_pages);
    m->window_dead_pages = m->window_released_pages = first_window_page; /* never adopted */
}

/* ---- the debug interface (session_debug.h) ------------------------------------- */

rb_status rb_session_memory_swap_store(rb_session_mem *m, rb_store *store,
                                       const rb_residency_params *rp, rb_error *err)
{
    if (m->member) /* the pool trims no manager while it is replaced */
        rb_pool_member_set_residency(m->member, NULL);
    rb_residency_destroy(m->res);
    m->res = NULL;
    rb_store_close(m->store);
    m->store = store;
    rb_residency_kv kv = {
        .cache = m->kv,
        .n_layers = m->kv->n_layers,
        .pages_per_layer = m->kv->pages_per_layer,
        .page_bytes = m->kv->page_bytes,
        .dims = {m->kv->page_tokens, m->kv->n_kv_heads, (uint32_t)(m->kv->row_k / 2),
                 (uint32_t)(m->kv->row_v / 2)},
    };
    rb_status st = rb_residency_create(rp, &kv, m->store, m->wcache, &m->res, err);
    if (st == RB_OK && held_by_me(m))
        rb_residency_hold(m->res); /* a caller that holds the session holds it */
    if (m->member)
        rb_pool_member_set_residency(m->member, m->res);
    return st;
}
