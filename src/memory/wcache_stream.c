/*
 * wcache_stream.c - the weight cache's streaming mode (wcache_stream.h):
 * a block cache over the model file under a budget, driven by the shared
 * replacement policies, with an I/O worker that reads the next units while
 * the current one computes.
 *
 * Memory: the RAM of cached blocks lives in the model's weight buffer at
 * the blocks' own addresses (anonymous memory: a dropped block is given
 * back with MADV_DONTNEED and reads as zero until it is read again). Here:
 * per key one state byte and one label byte, the policy's state (policy.h:
 * ~11 bytes per key for class), per unit its key list, the victim list,
 * the list of sessions sharing the stream (who, requested budget).
 *
 * Sharing (wcache_stream.h): the stream is the model's, joined by each
 * streaming session; passes take turns under the pass lock (pass_mu +
 * pass_owner, held across calls by the thread whose pass it is), so the
 * unit and row holds below are always one pass's.
 *
 * Block states (kstate, guarded by mu):
 *      ABSENT --fetch MISS--> LOADING --read done--> READY
 *      READY --victim of a fetch--> DROPPING --next flush--> ABSENT
 *      READY --budget shrink or drop (quiesced)--> ABSENT
 *      ABSENT --BYPASS (rows only)--> TRANSIENT --next acquire--> ABSENT
 * A fetch's victims are given back by the next flush, unlocked and merged
 * into ranges (one madvise per run of blocks instead of one per block:
 * each call is a TLB shootdown into the computing threads); a fetch that
 * finds a block DROPPING drains the list first.
 * A LOADING block is held (pinned in use) by the thread reading it, so it
 * is never a victim; a thread that finds a block LOADING waits for READY.
 *
 * Unit holds (held[u], guarded by mu): 0 none, LOADING (the worker is
 * fetching it), READY (every block resident and pinned once for this
 * hold). The forward pass holds one unit (cur) at a time; the worker holds
 * the units after it, in cyclic order, as far as the window lets it: when
 * a fetch bypasses (every frame it could take is held), the worker waits
 * for the forward pass to let go of a unit. That cannot deadlock: the
 * worker only ever waits while it loads the first unit the forward pass
 * does not hold, and the forward pass lets go of its unit before it waits.
 *
 * The fetch of one unit, as numbered in load_keys():
 *   1. under mu, each key: rb_policy_fetch; HIT -> pin (wait later if it
 *      is LOADING elsewhere); MISS -> pin, LOADING, queue the victim's
 *      drop and the read; BYPASS -> flush what is queued first, then wait
 *      for a release and fetch the key again
 *   2. unlocked (flush): the victims go back to the OS, then the queued
 *      keys are read in merged requests (consecutive keys, up to
 *      max_request_bytes; two in flight) straight into place, through the
 *      device throttle
 *   3. under mu: READY, broadcast; wait for keys others were reading
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "classify.h"
#include "policy.h"
#include "status.h"
#include "wcache_stream.h"

#define WS_PAGE 4096u
#define WS_BLOCK_DEFAULT (64u << 10) /* embedding rows as used cost one block each; 64 KiB
                                        keeps that small and the key count (10 k for a
                                        607 MiB model) cheap to fetch every token */
#define WS_REQUEST_DEFAULT (1u << 20) /* the phone profile's request size */

enum { K_ABSENT = 0, K_LOADING = 1, K_READY = 2, K_TRANSIENT = 3, K_DROPPING = 4 };
enum { U_NONE = 0, U_LOADING = 1, U_READY = 2 };

typedef struct ws_unit {
    uint32_t *keys;           /* ascending: the blocks of the unit's tensors (the
                                 output unit's two tensors may lie far apart) */
    uint32_t n;
} ws_unit;

struct rb_wcache_stream {
    /* set at create, read-only afterwards */
    rb_model *model;
    const rb_os *os;
    rb_throttle *throttle;    /* may be NULL */
    char *path;
    int fd, fd_buffered, is_direct;
    uintptr_t base;           /* address of file offset 0 */
    uint64_t mem_lo, mem_hi;  /* file offsets with RAM behind them (page bounds) */
    uint64_t file_size;
    uint32_t blk, max_req;
    uint32_t n_keys;
    uint8_t *label;           /* [n_keys] RB_CLASS_* from the layout */
    uint32_t n_units;         /* n_layers + 1 (output) */
    ws_unit *units;
    uint64_t embd_off, embd_row_bytes; /* token_embd rows (rows as used) */
    uint32_t *glob, n_glob;   /* keys held for good (rope factors) */
    uint32_t hot_blocks, loop_blocks, min_blocks, max_unit_blocks;
    uint32_t pair_blocks;     /* the largest two consecutive units: the window
                                 that lets a unit's reads overlap the previous
                                 one's compute */
    uint64_t loop_bytes, hot_bytes;
    int is_class;

    /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;        /* any state change: a read done, a release, cur */
    rb_policy *pol;
    uint8_t *kstate;          /* [n_keys] K_* */
    uint8_t *held;            /* [n_units] U_* */
    int32_t cur;              /* the unit the forward pass holds, -1: none */
    int io_busy;              /* the worker is inside load_keys */
    int cancel;               /* quiesce: the worker gives up the unit it loads */
    int stop;
    uint32_t *rows;           /* keys held for the embedding rows of the last call */
    uint32_t n_rows, cap_rows;
    uint64_t now;             /* access counter for the policy */
    uint64_t resident_bytes, max_resident_bytes, cap0_bytes;
    uint64_t read_bytes, n_reads, n_hits, n_misses, n_passes, n_rebalances;
    double io_s, wait_s;
    double room_wait_s, idle_s; /* the worker: waiting for a frame, for work */
    rb_status io_status;
    rb_error io_err;
    uint32_t *victims;        /* [n_keys] scratch for set_capacity */
    uint32_t *dq, n_dq;       /* [n_keys] victims DROPPING, for the next flush */

    struct ws_reader *reader; /* the second reader (NULL: none) */

    /* the sessions sharing the stream (guarded by the model's lock: join
       and leave run under it; request under pass_mu too) */
    struct ws_user { const void *who; uint64_t want; } *users;
    uint32_t n_users, cap_users;
    rb_throttle *own_throttle;  /* the throttle the stream took over (freed with it) */

    /* the pass: one forward pass at a time over the stream (guarded by
       pass_mu). A pass is a thread: whoever holds it may call acquire and
       rows; set_budget and drop take it too, so no pass is ever quiesced
       under its feet by another thread */
    pthread_mutex_t pass_mu;
    pthread_cond_t pass_cv;
    pthread_t pass_owner;
    int pass_busy;
    uint64_t n_pass_waits;      /* passes that waited for another's */
    double pass_wait_s;         /* the time they waited */

    /* the worker's own */
    pthread_t thread;
    int has_thread;
    uint32_t *io_list;        /* [max_unit_blocks] */
};

static int pass_take(rb_wcache_stream *ws);

/* ---- keys ------------------------------------------------------------------ */

static uint64_t key_lo(const rb_wcache_stream *ws, uint32_t k)
{
    uint64_t a = (uint64_t)k * ws->blk;
    return a < ws->mem_lo ? ws->mem_lo : a;
}

static uint64_t key_hi(const rb_wcache_stream *ws, uint32_t k)
{
    uint64_t b = ((uint64_t)k + 1) * ws->blk;
    return b > ws->mem_hi ? ws->mem_hi : b;
}

static uint64_t key_bytes(const rb_wcache_stream *ws, uint32_t k)
{
    uint64_t a = key_lo(ws, k), b = key_hi(ws, k);
    return b > a ? b - a : 0;
}

/* The block's RAM goes back to the OS; the addresses stay valid. */
static void drop_key(rb_wcache_stream *ws, uint32_t k)
{
    uint64_t n = key_bytes(ws, k);
    if (n)
        madvise((void *)(ws->base + key_lo(ws, k)), n, MADV_DONTNEED);
    if (ws->kstate[k] == K_LOADING || ws->kstate[k] == K_READY)
        ws->resident_bytes -= n;
    ws->kstate[k] = K_ABSENT;
}

/* A fetch's victim: out of the accounts now, its RAM back at the next
 * flush (mu held). */
static void queue_drop(rb_wcache_stream *ws, uint32_t k)
{
    if (ws->kstate[k] != K_READY && ws->kstate[k] != K_LOADING) {
        ws->kstate[k] = K_ABSENT; /* nothing in RAM to give back */
        return;
    }
    ws->resident_bytes -= key_bytes(ws, k);
    ws->kstate[k] = K_DROPPING;
    ws->dq[ws->n_dq++] = k;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* madvise(DONTNEED) over runs of consecutive keys (unlocked: DROPPING
 * keys are nobody's until they are ABSENT). */
static void give_back(rb_wcache_stream *ws, uint32_t *keys, uint32_t n)
{
    qsort(keys, n, sizeof *keys, cmp_u32);
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i + 1;
        while (j < n && keys[j] == keys[j - 1] + 1)
            j++;
        uint64_t a = key_lo(ws, keys[i]), b = key_hi(ws, keys[j - 1]);
        if (b > a)
            madvise((void *)(ws->base + a), b - a, MADV_DONTNEED);
        i = j;
    }
}

static void note_resident(rb_wcache_stream *ws, uint32_t k)
{
    ws->resident_bytes += key_bytes(ws, k);
    if (ws->resident_bytes > ws->max_resident_bytes)
        ws->max_resident_bytes = ws->resident_bytes;
}

/* ---- reads ----------------------------------------------------------------- */

/* Reads file [a, b) into place (a, b page-aligned; b may pass the file's
 * end, whose last partial page is read buffered: O_DIRECT cannot continue
 * a short read at an unaligned offset). Runs unlocked. */
static rb_status read_range(rb_wcache_stream *ws, uint64_t a, uint64_t b, rb_error *err)
{
    uint64_t end = b < ws->file_size ? b : ws->file_size;
    uint64_t direct_end = ws->is_direct ? end / WS_PAGE * WS_PAGE : a;
    if (direct_end < a)
        direct_end = a;
    int64_t t0 = rb_throttle_now_ns();
    size_t got = 0;
    int e = 0;
    rb_status st = RB_OK;
    if (direct_end > a)
        st = rb_os_read_full(ws->os, ws->fd, (void *)(ws->base + a), (size_t)(direct_end - a), a,
                             &got, &e);
    if (st == RB_OK && end > direct_end) {
        st = rb_os_read_full(ws->os, ws->fd_buffered, (void *)(ws->base + direct_end),
                             (size_t)(end - direct_end), direct_end, &got, &e);
        if (!ws->is_direct) /* keep the page cache out of the measurement */
            posix_fadvise(ws->fd_buffered, (off_t)direct_end, (off_t)(end - direct_end),
                          POSIX_FADV_DONTNEED);
    }
    if (st != RB_OK)
        return rb_error_set(err, st, "wcache: reading %s at offset %" PRIu64 ": %s", ws->path,
                            a, st == RB_E_SHORT_READ ? "the file ended" : strerror(e));
    if (ws->throttle)
        rb_throttle_io_since(ws->throttle, end - a, t0);
    return RB_OK;
}

/* A second reader: storage requests of one flush are shared between the
 * thread that flushes and this one (queue depth 2). The modelled device's
 * bandwidth stays shared through the throttle; the real disk here reads
 * faster with two requests in flight (its per-request latency overlaps),
 * which the session's restore workers measured too (residency.c). */
typedef struct ws_reader {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int has_thread, stop, busy;     /* busy: a job is posted and not finished */
    const uint64_t *req;            /* [n][2] file ranges of the job */
    uint32_t n;
    _Atomic uint32_t next;          /* the next request to take */
    rb_status st;                   /* the helper's first failure */
    rb_error err;
    uint32_t helper_done;           /* 1 when the helper finished the job */
} ws_reader;

/* Takes requests of the posted job until none is left; the first failure. */
static rb_status take_requests(rb_wcache_stream *ws, ws_reader *r, rb_error *err)
{
    rb_status st = RB_OK;
    for (;;) {
        uint32_t i = atomic_fetch_add(&r->next, 1);
        if (i >= r->n)
            return st;
        if (st == RB_OK)
            st = read_range(ws, r->req[2 * i], r->req[2 * i + 1], err);
    }
}

static void *reader_main(void *arg)
{
    rb_wcache_stream *ws = arg;
    ws_reader *r = ws->reader;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && (!r->busy || r->helper_done))
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        pthread_mutex_unlock(&r->mu);
        rb_error e = {0};
        rb_status st = take_requests(ws, r, &e);
        pthread_mutex_lock(&r->mu);
        if (st != RB_OK && r->st == RB_OK)
            r->st = st, r->err = e;
        r->helper_done = 1;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Step 2: the queued keys (ascending), in merged requests, two at a time
 * when the second reader is free. */
static rb_status read_keys(rb_wcache_stream *ws, const uint32_t *keys, uint32_t n,
                           uint64_t *bytes, uint64_t *n_req, rb_error *err)
{
    uint64_t one[2], *req = n > 1 ? malloc(2 * sizeof(uint64_t) * n) : one;
    if (!req)
        return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    rb_status st = RB_OK;
    uint32_t m = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i + 1;
        uint64_t a = key_lo(ws, keys[i]), b = key_hi(ws, keys[i]);
        while (j < n && keys[j] == keys[j - 1] + 1 && key_hi(ws, keys[j]) - a <= ws->max_req)
            b = key_hi(ws, keys[j++]);
        req[2 * m] = a, req[2 * m + 1] = b, m++;
        *bytes += b - a;
        i = j;
    }
    *n_req += m;
    ws_reader *r = ws->reader;
    int shared = 0;
    if (m >= 2 && r && r->has_thread) {
        pthread_mutex_lock(&r->mu);
        if (!r->busy) {
            r->busy = 1, r->helper_done = 0, r->req = req, r->n = m, r->st = RB_OK;
            atomic_store(&r->next, 0);
            shared = 1;
            pthread_cond_broadcast(&r->cv);
        }
        pthread_mutex_unlock(&r->mu);
    }
    if (!shared) {
        for (uint32_t i = 0; i < m && st == RB_OK; i++)
            st = read_range(ws, req[2 * i], req[2 * i + 1], err);
    } else {
        st = take_requests(ws, r, err);
        pthread_mutex_lock(&r->mu);
        while (!r->helper_done)
            pthread_cond_wait(&r->cv, &r->mu);
        if (st == RB_OK && r->st != RB_OK) {
            st = r->st;
            if (err)
                *err = r->err;
        }
        r->busy = 0;
        pthread_mutex_unlock(&r->mu);
    }
    if (req != one)
        free(req);
    return st;
}

/* ---- fetching -------------------------------------------------------------- */

/* The reads queued by load_keys so far (mu held on entry and exit). */
static rb_status flush(rb_wcache_stream *ws, uint32_t *q, uint32_t *nq, rb_error *err)
{
    if (*nq == 0 && ws->n_dq == 0)
        return RB_OK;
    /* the victims queued so far (by any thread) are ours to give back */
    uint32_t n_drop = ws->n_dq, *drop = n_drop ? malloc(n_drop * sizeof *drop) : NULL;
    if (drop)
        memcpy(drop, ws->dq, n_drop * sizeof *drop);
    else
        while (ws->n_dq) /* no memory for the copy: one by one, locked */
            drop_key(ws, ws->dq[--ws->n_dq]);
    ws->n_dq = 0;
    pthread_mutex_unlock(&ws->mu);
    if (drop)
        give_back(ws, drop, n_drop);
    uint64_t bytes = 0, n_req = 0;
    int64_t t0 = rb_throttle_now_ns();
    rb_status st = *nq ? read_keys(ws, q, *nq, &bytes, &n_req, err) : RB_OK;
    double dt = (double)(rb_throttle_now_ns() - t0) * 1e-9;
    pthread_mutex_lock(&ws->mu);
    for (uint32_t i = 0; drop && i < n_drop; i++)
        ws->kstate[drop[i]] = K_ABSENT;
    free(drop);
    ws->io_s += dt;
    ws->read_bytes += bytes;
    ws->n_reads += n_req;
    for (uint32_t i = 0; i < *nq; i++) {
        uint32_t k = q[i];
        if (st == RB_OK)
            ws->kstate[k] = K_READY;
        else /* nothing usable arrived: the policy keeps the frame, the next
                fetch that hits it reads it again */
            drop_key(ws, k);
    }
    *nq = 0;
    pthread_cond_broadcast(&ws->cv);
    return st;
}

/*
 * Holds the n keys of `list` (ascending): every one resident and pinned
 * once, by steps 1-3 above. allow_transient:
 * a bypassed key is read in place outside the cache (embedding rows: the
 * caller cannot wait for a release). *n_done: the keys taken (pinned, or
 * TRANSIENT), from the first; on error they stay so and the caller lets
 * go of them. mu held.
 */
static rb_status load_keys(rb_wcache_stream *ws, const uint32_t *list, uint32_t n,
                           int allow_transient, uint32_t *q, uint32_t *n_done, rb_error *err)
{
    uint32_t nq = 0;
    *n_done = 0;
    for (uint32_t i = 0; i < n && !ws->stop && !ws->cancel;) {
        uint32_t k = list[i], victim = RB_PKEY_NONE;
        if (ws->kstate[k] == K_TRANSIENT) {
            /* an embedding row read outside the cache that the forward pass
               may be reading now: its next acquire drops it */
            pthread_cond_wait(&ws->cv, &ws->mu);
            continue;
        }
        /* 1. */
        if (ws->kstate[k] == K_DROPPING) { /* its RAM is on its way back to the OS */
            if (nq > 0 || ws->n_dq > 0) {
                rb_status st = flush(ws, q, &nq, err);
                if (st != RB_OK)
                    return st;
            } else { /* another thread is giving it back now */
                pthread_cond_wait(&ws->cv, &ws->mu);
            }
            continue;
        }
        int r = rb_policy_fetch(ws->pol, k, ws->now++, &victim);
        if (victim != RB_PKEY_NONE)
            queue_drop(ws, victim);
        if (r == RB_FETCH_HIT && ws->kstate[k] == K_ABSENT) { /* its read had failed */
            ws->n_misses++;
            rb_policy_pin(ws->pol, k);
            ws->kstate[k] = K_LOADING;
            note_resident(ws, k);
            q[nq++] = k;
        } else if (r == RB_FETCH_HIT) {
            ws->n_hits++;
            rb_policy_pin(ws->pol, k);
        } else if (r == RB_FETCH_MISS) {
            ws->n_misses++;
            rb_policy_pin(ws->pol, k);
            ws->kstate[k] = K_LOADING;
            note_resident(ws, k);
            q[nq++] = k;
        } else if (allow_transient) {
            ws->n_misses++;
            ws->kstate[k] = K_TRANSIENT;
            uint32_t one = k, n1 = 1;
            pthread_mutex_unlock(&ws->mu);
            uint64_t b = 0, nr = 0;
            rb_status st = read_keys(ws, &one, n1, &b, &nr, err);
            pthread_mutex_lock(&ws->mu);
            ws->read_bytes += b;
            ws->n_reads += nr;
            if (st != RB_OK) {
                ws->kstate[k] = K_ABSENT;
                flush(ws, q, &nq, err);
                return st;
            }
            i++;
            (*n_done)++; /* not pinned: TRANSIENT keys are dropped by the next acquire */
            continue;
        } else {
            /* every frame it could take is held: read what is queued, then
               wait for the forward pass to let go of a unit. A flush
               unlocks: a release may have come meanwhile, so fetch again
               first; without one, fetch and wait are under one lock hold */
            if (nq > 0 || ws->n_dq > 0) {
                rb_status st = flush(ws, q, &nq, err);
                if (st != RB_OK)
                    return st;
                continue;
            }
            int64_t t0 = rb_throttle_now_ns();
            pthread_cond_wait(&ws->cv, &ws->mu);
            ws->room_wait_s += (double)(rb_throttle_now_ns() - t0) * 1e-9;
            continue;
        }
        (*n_done)++;
        i++;
    }
    /* 2. */
    rb_status st = flush(ws, q, &nq, err);
    if (st != RB_OK)
        return st;
    /* 3. blocks another thread was reading */
    for (uint32_t i = 0; i < n && !ws->stop && !ws->cancel; i++) {
        uint32_t k = list[i];
        while (ws->kstate[k] == K_LOADING && !ws->stop && !ws->cancel)
            pthread_cond_wait(&ws->cv, &ws->mu);
    }
    return RB_OK;
}

static void unpin_list(rb_wcache_stream *ws, const uint32_t *keys, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        rb_policy_unpin(ws->pol, keys[i]);
}

static void release_unit(rb_wcache_stream *ws, uint32_t u)
{
    if (ws->held[u] == U_READY)
        unpin_list(ws, ws->units[u].keys, ws->units[u].n);
    ws->held[u] = U_NONE;
}

static void release_rows(rb_wcache_stream *ws)
{
    for (uint32_t i = 0; i < ws->n_rows; i++) {
        uint32_t k = ws->rows[i];
        if (ws->kstate[k] == K_TRANSIENT)
            drop_key(ws, k);
        else
            rb_policy_unpin(ws->pol, k);
    }
    ws->n_rows = 0;
}

/* Lets go of every unit hold; the worker gives up the unit it is loading
 * (it may be waiting for a release that only the caller could make). mu
 * held. */
static void quiesce(rb_wcache_stream *ws)
{
    ws->cur = -1;
    ws->cancel = 1;
    pthread_cond_broadcast(&ws->cv);
    while (ws->io_busy)
        pthread_cond_wait(&ws->cv, &ws->mu);
    ws->cancel = 0;
    for (uint32_t u = 0; u < ws->n_units; u++)
        release_unit(ws, u);
    release_rows(ws);
}

/* ---- the I/O worker -------------------------------------------------------- */

/* The first unit after cur (cyclic, cur itself first) that nobody holds,
 * or -1. The worker holds at most n_units - 1 units ahead. */
static int32_t next_unit(const rb_wcache_stream *ws)
{
    if (ws->cur < 0)
        return -1;
    for (uint32_t i = 0; i < ws->n_units; i++) {
        uint32_t u = ((uint32_t)ws->cur + i) % ws->n_units;
        if (ws->held[u] == U_NONE)
            return i + 1 < ws->n_units ? (int32_t)u : -1;
    }
    return -1;
}

static void *io_main(void *arg)
{
    rb_wcache_stream *ws = arg;
    pthread_mutex_lock(&ws->mu);
    while (!ws->stop) {
        int32_t u = ws->io_status == RB_OK ? next_unit(ws) : -1;
        if (u < 0) {
            int64_t t0 = rb_throttle_now_ns();
            pthread_cond_wait(&ws->cv, &ws->mu);
            ws->idle_s += (double)(rb_throttle_now_ns() - t0) * 1e-9;
            continue;
        }
        ws->held[u] = U_LOADING;
        ws->io_busy = 1;
        uint32_t n_pinned = 0;
        rb_error e = {0};
        rb_status st = load_keys(ws, ws->units[u].keys, ws->units[u].n, 0, ws->io_list,
                                 &n_pinned, &e);
        if (st == RB_OK && !ws->stop && !ws->cancel) {
            ws->held[u] = U_READY;
        } else {
            unpin_list(ws, ws->units[u].keys, n_pinned);
            ws->held[u] = U_NONE;
            if (st != RB_OK) {
                ws->io_status = st;
                ws->io_err = e;
            }
        }
        ws->io_busy = 0;
        pthread_cond_broadcast(&ws->cv);
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

/* ---- the forward pass's side ----------------------------------------------- */

int rb_wcache_stream_acquire(rb_wcache_stream *ws, uint32_t unit)
{
    if (unit >= ws->n_units)
        return 0;
    (void)pass_take(ws); /* this thread's pass from now until pass_end */
    pthread_mutex_lock(&ws->mu);
    if (ws->cur == (int32_t)unit && ws->held[unit] == U_READY) {
        /* the same pass asks again (a multi-sequence pass asks each
           session's gate): the unit is held already, nothing to let go */
        pthread_mutex_unlock(&ws->mu);
        return 0;
    }
    release_rows(ws);
    int32_t expected = ws->cur < 0 ? 0 : (int32_t)(((uint32_t)ws->cur + 1) % ws->n_units);
    if (ws->cur >= 0 && (int32_t)unit != expected) {
        /* the pass restarted elsewhere (a stopped feed): the read-ahead is
           for the wrong units */
        quiesce(ws);
    } else if (ws->cur >= 0) {
        release_unit(ws, (uint32_t)ws->cur);
    }
    if (ws->io_status != RB_OK && ws->held[unit] != U_READY)
        ws->io_status = RB_OK; /* a new attempt after a failed read */
    ws->cur = (int32_t)unit;
    pthread_cond_broadcast(&ws->cv);
    int64_t t0 = rb_throttle_now_ns();
    while (ws->held[unit] != U_READY && ws->io_status == RB_OK && !ws->stop)
        pthread_cond_wait(&ws->cv, &ws->mu);
    ws->wait_s += (double)(rb_throttle_now_ns() - t0) * 1e-9;
    int rc = ws->held[unit] == U_READY ? 0 : -1;
    if (rc == 0 && unit == ws->n_units - 1)
        ws->n_passes++;
    pthread_mutex_unlock(&ws->mu);
    return rc;
}

int rb_wcache_stream_rows(rb_wcache_stream *ws, const int32_t *tokens, uint32_t n)
{
    (void)pass_take(ws); /* this thread's pass from now until pass_end */
    pthread_mutex_lock(&ws->mu);
    /* the rows of this pass are held until its first acquire: a
       multi-sequence pass calls this once per sequence before layer 0, so
       the rows held already stay (new ones are appended after them) */
    uint32_t n_old = ws->n_rows;
    /* a row spans row_bytes / blk + 2 keys at most (an F32 row may be
       larger than a block) */
    size_t per_row = (size_t)(ws->embd_row_bytes / ws->blk) + 2,
           need = per_row * n + n_old;
    if (ws->cap_rows < need) {
        uint32_t *r = realloc(ws->rows, need * sizeof *r);
        if (!r) {
            ws->io_status = rb_error_set(&ws->io_err, RB_E_NOMEM, "wcache: out of memory");
            pthread_mutex_unlock(&ws->mu);
            return -1;
        }
        ws->rows = r;
        ws->cap_rows = (uint32_t)need;
    }
    /* the distinct keys of the rows, ascending, and not held already */
    uint32_t *nr = ws->rows + n_old, m = 0;
    for (uint32_t t = 0; t < n; t++) {
        uint64_t a = ws->embd_off + (uint64_t)tokens[t] * ws->embd_row_bytes;
        uint64_t b = a + ws->embd_row_bytes;
        for (uint64_t k = a / ws->blk; k * ws->blk < b; k++)
            nr[m++] = (uint32_t)k;
    }
    qsort(nr, m, sizeof *nr, cmp_u32);
    uint32_t d = 0;
    for (uint32_t i = 0; i < m; i++) {
        int dup = d > 0 && nr[d - 1] == nr[i];
        for (uint32_t j = 0; !dup && j < n_old; j++)
            dup = ws->rows[j] == nr[i];
        if (!dup)
            nr[d++] = nr[i];
    }
    uint32_t *q = malloc((size_t)(d ? d : 1) * sizeof *q);
    rb_error e = {0};
    uint32_t n_pinned = 0;
    rb_status st = q ? load_keys(ws, nr, d, 1, q, &n_pinned, &e)
                     : rb_error_set(&e, RB_E_NOMEM, "wcache: out of memory");
    free(q);
    /* pinned and transient ones, let go of at the pass's first acquire */
    ws->n_rows = n_old + n_pinned;
    if (st != RB_OK) {
        ws->io_status = st;
        ws->io_err = e;
    }
    pthread_mutex_unlock(&ws->mu);
    return st == RB_OK ? 0 : -1;
}

/* ---- the pass lock ----------------------------------------------------------- */

/* 1 when this thread took the pass (it then lets go of it itself). */
static int pass_take(rb_wcache_stream *ws)
{
    pthread_mutex_lock(&ws->pass_mu);
    if (ws->pass_busy && pthread_equal(ws->pass_owner, pthread_self())) {
        pthread_mutex_unlock(&ws->pass_mu);
        return 0; /* this thread's pass already (a multi-sequence pass, a trim at its stop) */
    }
    if (ws->pass_busy) {
        int64_t t0 = rb_throttle_now_ns();
        while (ws->pass_busy)
            pthread_cond_wait(&ws->pass_cv, &ws->pass_mu);
        ws->n_pass_waits++;
        ws->pass_wait_s += (double)(rb_throttle_now_ns() - t0) * 1e-9;
    }
    ws->pass_busy = 1;
    ws->pass_owner = pthread_self();
    pthread_mutex_unlock(&ws->pass_mu);
    return 1;
}

static void pass_give(rb_wcache_stream *ws)
{
    pthread_mutex_lock(&ws->pass_mu);
    ws->pass_busy = 0;
    pthread_cond_broadcast(&ws->pass_cv);
    pthread_mutex_unlock(&ws->pass_mu);
}

void rb_wcache_stream_pass_begin(rb_wcache_stream *ws) { (void)pass_take(ws); }

void rb_wcache_stream_pass_end(rb_wcache_stream *ws)
{
    pthread_mutex_lock(&ws->pass_mu);
    int mine = ws->pass_busy && pthread_equal(ws->pass_owner, pthread_self());
    pthread_mutex_unlock(&ws->pass_mu);
    if (!mine)
        return;
    /* rows a stopped pass fetched and never reached layer 0 with */
    pthread_mutex_lock(&ws->mu);
    release_rows(ws);
    pthread_mutex_unlock(&ws->mu);
    pass_give(ws);
}

/* ---- between feeds --------------------------------------------------------- */

/* The stream window for a capacity: two consecutive units when the budget
 * allows it, else one (a unit's reads then wait for the previous compute);
 * never more than the capacity (class pins capacity - window). */
static uint32_t window_for(const rb_wcache_stream *ws, uint32_t cap)
{
    if (cap >= ws->n_keys) /* everything fits: pin it all (a stream would only
                              make the hot set evict the loop prefix) */
        return 1;
    uint32_t w = ws->hot_blocks + ws->pair_blocks + 2 <= cap ? ws->pair_blocks + 2
                                                               : ws->max_unit_blocks + 2;
    return w < cap ? w : cap;
}

/* New capacity with the window that goes with it (mu held, quiesced);
 * victims dropped. */
static rb_status set_capacity(rb_wcache_stream *ws, uint32_t cap, uint32_t window,
                              rb_error *err)
{
    uint32_t old_window = ws->pol->window_req, nv = 0;
    ws->pol->window_req = window; /* the policy derives cfg.window from it */
    rb_status st = rb_policy_set_capacity(ws->pol, cap, ws->victims, &nv, err);
    if (st != RB_OK)
        ws->pol->window_req = old_window;
    for (uint32_t i = 0; i < nv; i++)
        drop_key(ws, ws->victims[i]);
    return st;
}

rb_status rb_wcache_stream_set_budget(rb_wcache_stream *ws, uint64_t bytes, rb_error *err)
{
    uint64_t cap = bytes / ws->blk;
    if (cap < ws->min_blocks)
        return rb_error_set(err, RB_E_BUDGET, "wcache: a weight budget of %" PRIu64 " bytes is "
                            "below the minimum of %" PRIu64 " (hot set %" PRIu64 " + the "
                            "largest unit %" PRIu64 ")", bytes,
                            (uint64_t)ws->min_blocks * ws->blk, ws->hot_bytes,
                            (uint64_t)ws->max_unit_blocks * ws->blk);
    if (cap > ws->n_keys)
        cap = ws->n_keys;
    int took = pass_take(ws); /* never under another thread's pass */
    pthread_mutex_lock(&ws->mu);
    rb_status st = RB_OK;
    if (cap != ws->pol->cfg.capacity) {
        quiesce(ws);
        st = set_capacity(ws, (uint32_t)cap, window_for(ws, (uint32_t)cap), err);
        if (st == RB_OK)
            ws->n_rebalances++;
    }
    pthread_mutex_unlock(&ws->mu);
    if (took)
        pass_give(ws);
    return st;
}

uint64_t rb_wcache_stream_drop(rb_wcache_stream *ws)
{
    int took = pass_take(ws); /* never under another thread's pass */
    pthread_mutex_lock(&ws->mu);
    quiesce(ws);
    uint64_t before = ws->resident_bytes;
    uint32_t cap = ws->pol->cfg.capacity, window = ws->pol->window_req;
    rb_error e = {0};
    /* shrink to the keys held for good, then grow back: the policy's own
       eviction order, and it keeps its sizes */
    uint32_t keep = ws->n_glob ? ws->n_glob : 1;
    if (set_capacity(ws, keep, keep, &e) == RB_OK)
        set_capacity(ws, cap, window, &e);
    uint64_t freed = before - ws->resident_bytes;
    pthread_mutex_unlock(&ws->mu);
    if (took)
        pass_give(ws);
    return freed;
}

/* ---- sharing ------------------------------------------------------------------ */

/* The budget the users ask for together: the largest request. */
static uint64_t users_want(const rb_wcache_stream *ws)
{
    uint64_t w = 0;
    for (uint32_t i = 0; i < ws->n_users; i++)
        if (ws->users[i].want > w)
            w = ws->users[i].want;
    return w;
}

static struct ws_user *find_user(rb_wcache_stream *ws, const void *who)
{
    for (uint32_t i = 0; i < ws->n_users; i++)
        if (ws->users[i].who == who)
            return &ws->users[i];
    return NULL;
}

static void free_throttle(rb_throttle *t)
{
    if (t) {
        rb_throttle_deinit(t);
        free(t);
    }
}

rb_status rb_wcache_stream_join(rb_model *model, const char *path, const rb_os *os,
                                rb_throttle *throttle, const rb_wcache_stream_params *p,
                                const void *who, rb_wcache_stream **out, rb_error *err)
{
    rb_throttle *given = p->takes_throttle ? throttle : NULL; /* ours to free or keep */
    rb_wcache_stream *ws = rb_model_weights_stream(model);
    rb_status st = RB_OK;
    int created = 0;
    if (!ws) {
        if ((st = rb_wcache_stream_create(model, path, os, throttle, p, &ws, err)) != RB_OK) {
            free_throttle(given);
            return st;
        }
        created = 1;
        ws->own_throttle = given;
        given = NULL;
    } else if (p->min_budget_out) {
        *p->min_budget_out = rb_wcache_stream_min_budget(ws);
    }
    free_throttle(given); /* the stream keeps the device it was created with */
    /* the list grows under pass_mu: a request on another thread reads it */
    pthread_mutex_lock(&ws->pass_mu);
    struct ws_user *u = ws->users;
    if (ws->n_users == ws->cap_users) {
        uint32_t cap = ws->cap_users ? 2 * ws->cap_users : 4;
        if ((u = realloc(ws->users, cap * sizeof *u)) != NULL)
            ws->users = u, ws->cap_users = cap;
    }
    pthread_mutex_unlock(&ws->pass_mu);
    if (!u) {
        if (created)
            rb_wcache_stream_destroy(ws);
        return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    }
    uint64_t want = p->budget_bytes;
    if (!created) {
        /* the shared budget is the largest request: a larger one grows it */
        uint64_t min = rb_wcache_stream_min_budget(ws);
        if (want < min)
            return rb_error_set(err, RB_E_BUDGET, "wcache: a weight budget of %" PRIu64
                                " bytes is below the minimum of %" PRIu64 " bytes (%.1f MiB) "
                                "of the model's shared stream", want, min,
                                (double)min / 1048576.0);
        pthread_mutex_lock(&ws->pass_mu);
        uint64_t now = users_want(ws);
        pthread_mutex_unlock(&ws->pass_mu);
        if (want > now && (st = rb_wcache_stream_set_budget(ws, want, err)) != RB_OK)
            return st;
    }
    pthread_mutex_lock(&ws->pass_mu);
    ws->users[ws->n_users++] = (struct ws_user){.who = who, .want = want};
    pthread_mutex_unlock(&ws->pass_mu);
    if (created)
        rb_model_set_weights_stream(model, ws);
    *out = ws;
    return RB_OK;
}

void rb_wcache_stream_leave(rb_model *model, rb_wcache_stream *ws, const void *who)
{
    if (!ws)
        return;
    pthread_mutex_lock(&ws->pass_mu);
    for (uint32_t i = 0; i < ws->n_users; i++)
        if (ws->users[i].who == who) { /* the others keep their age order */
            memmove(&ws->users[i], &ws->users[i + 1],
                    (ws->n_users - 1 - i) * sizeof *ws->users);
            ws->n_users--;
            break;
        }
    uint32_t n_left = ws->n_users;
    uint64_t w = users_want(ws);
    pthread_mutex_unlock(&ws->pass_mu);
    if (n_left == 0) {
        if (rb_model_weights_stream(model) == ws)
            rb_model_set_weights_stream(model, NULL);
        rb_wcache_stream_destroy(ws);
        return;
    }
    /* the budget follows the largest request left */
    if (w / ws->blk < rb_wcache_stream_capacity_blocks(ws) && w >= rb_wcache_stream_min_budget(ws))
        rb_wcache_stream_set_budget(ws, w, NULL);
}
rb_status rb_wcache_stream_request(rb_wcache_stream *ws, const void *who, uint64_t bytes,
                                   rb_error *err)
{
    pthread_mutex_lock(&ws->pass_mu);
    struct ws_user *u = find_user(ws, who);
    if (u)
        u->want = bytes;
    /* the latest request: made before a feed, with every session's
       bytes as they are now (an older one may count KV since grown) */
    uint64_t w = bytes;
    pthread_mutex_unlock(&ws->pass_mu);
    if (!u)
        return rb_error_set(err, RB_E_INVALID_ARG, "wcache: not a user of this stream");
    uint64_t cap = w / ws->blk, now = rb_wcache_stream_capacity_blocks(ws);
    if (cap == now || (cap >= ws->n_keys && now == ws->n_keys))
        return RB_OK; /* block granularity: nothing changes (no read-ahead dropped) */
    return rb_wcache_stream_set_budget(ws, w, err);
}

int rb_wcache_stream_counts_for(const rb_wcache_stream *ws, const void *who)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&ws->pass_mu;
    pthread_mutex_lock(mu);
    int yes = ws->n_users > 0 && ws->users[0].who == who;
    pthread_mutex_unlock(mu);
    return yes;
}

uint32_t rb_wcache_stream_capacity_blocks(const rb_wcache_stream *ws)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&ws->mu;
    pthread_mutex_lock(mu);
    uint32_t c = ws->pol->cfg.capacity;
    pthread_mutex_unlock(mu);
    return c;
}

uint64_t rb_wcache_stream_min_budget(const rb_wcache_stream *ws)
{
    return (uint64_t)ws->min_blocks * ws->blk;
}

rb_status rb_wcache_stream_error(const rb_wcache_stream *ws, rb_error *err)
{
    pthread_mutex_lock((pthread_mutex_t *)&ws->mu);
    rb_status st = ws->io_status;
    if (st != RB_OK && err)
        *err = ws->io_err;
    pthread_mutex_unlock((pthread_mutex_t *)&ws->mu);
    return st;
}

void rb_wcache_stream_get_stats(const rb_wcache_stream *ws, rb_wcache_stream_stats *o)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&ws->mu;
    pthread_mutex_lock(mu);
    memset(o, 0, sizeof *o);
    o->policy = ws->pol->m->name;
    o->budget_bytes = (uint64_t)ws->pol->cfg.capacity * ws->blk;
    o->min_budget_bytes = (uint64_t)ws->min_blocks * ws->blk;
    o->block_bytes = ws->blk;
    o->loop_bytes = ws->loop_bytes;
    o->hot_bytes = ws->hot_bytes;
    o->window_bytes = (uint64_t)ws->pol->cfg.window * ws->blk;
    uint64_t pinned = 0;
    if (ws->is_class) { /* the plan: what the pinned area leaves for the loop */
        /* with room for everything the stream is never evicted either */
        uint32_t cap = ws->pol->cfg.capacity;
        uint32_t pin_cap = cap >= ws->hot_blocks + ws->loop_blocks ? cap
                                                                    : cap - ws->pol->cfg.window;
        uint64_t s = pin_cap > ws->hot_blocks ? pin_cap - ws->hot_blocks : 0;
        pinned = s > ws->loop_blocks ? ws->loop_blocks : s;
        o->pinned_loop_bytes = pinned * ws->blk;
        if (o->pinned_loop_bytes > ws->loop_bytes)
            o->pinned_loop_bytes = ws->loop_bytes;
    } else {
        for (uint32_t k = 0; k < ws->n_keys; k++)
            if (ws->label[k] == RB_CLASS_LOOP && ws->pol->resident[k])
                o->pinned_loop_bytes += key_bytes(ws, k);
    }
    o->resident_bytes = ws->resident_bytes;
    o->max_resident_bytes = ws->max_resident_bytes;
    o->read_bytes = ws->read_bytes;
    o->n_reads = ws->n_reads;
    o->n_hits = ws->n_hits;
    o->n_misses = ws->n_misses;
    o->n_passes = ws->n_passes;
    o->n_rebalances = ws->n_rebalances;
    o->budget_given_up_bytes = ws->cap0_bytes > o->budget_bytes ? ws->cap0_bytes -
                                                                      o->budget_bytes : 0;
    o->io_s = ws->io_s;
    o->wait_s = ws->wait_s;
    o->room_wait_s = ws->room_wait_s;
    o->idle_s = ws->idle_s;
    o->io_mode = ws->is_direct ? "O_DIRECT" : "buffered + fadvise(DONTNEED)";
    pthread_mutex_unlock(mu);
    pthread_mutex_lock((pthread_mutex_t *)&ws->pass_mu);
    o->n_users = ws->n_users;
    o->n_pass_waits = ws->n_pass_waits;
    o->pass_wait_s = ws->pass_wait_s;
    pthread_mutex_unlock((pthread_mutex_t *)&ws->pass_mu);
}

/* ---- create ---------------------------------------------------------------- */

/* The unit a tensor belongs to: its layer, the output unit, or -1. */
static int64_t unit_of(const rb_wcache_stream *ws, const rb_gguf_tensor *t, int is_tied)
{
    int64_t l = rb_tensor_layer(t->name);
    if (l >= 0)
        return l < ws->n_units - 1 ? l : -1;
    if (!strcmp(t->name, "output.weight") || !strcmp(t->name, "output_norm.weight") ||
        (is_tied && !strcmp(t->name, "token_embd.weight")))
        return ws->n_units - 1;
    return -1;
}

/* Each unit's key list: the blocks its tensors touch, ascending. */
static rb_status build_units(rb_wcache_stream *ws, int is_tied, rb_error *err)
{
    const rb_gguf *g = rb_model_gguf(ws->model);
    uint8_t *mark = calloc(ws->n_keys, 1);
    if (!mark)
        return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    for (uint32_t u = 0; u < ws->n_units; u++) {
        memset(mark, 0, ws->n_keys);
        uint32_t n = 0;
        for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
            const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
            if (unit_of(ws, t, is_tied) != (int64_t)u || t->n_bytes == 0)
                continue;
            for (uint64_t k = t->file_offset / ws->blk; k * ws->blk < t->file_offset + t->n_bytes;
                 k++)
                if (!mark[k])
                    mark[k] = 1, n++;
        }
        ws->units[u].keys = malloc((size_t)(n ? n : 1) * sizeof(uint32_t));
        if (!ws->units[u].keys) {
            free(mark);
            return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
        }
        for (uint32_t k = 0; k < ws->n_keys; k++)
            if (mark[k])
                ws->units[u].keys[ws->units[u].n++] = k;
    }
    free(mark);
    return RB_OK;
}

static void label_range(rb_wcache_stream *ws, uint64_t a, uint64_t b, uint8_t cls)
{
    if (b <= a)
        return;
    for (uint64_t k = a / ws->blk; k * ws->blk < b && k < ws->n_keys; k++)
        if (cls == RB_CLASS_HOT || ws->label[k] == RB_CLASS_NONE)
            ws->label[k] = cls;
}

/* Units, labels and the plan's sizes from the tensor index. */
static rb_status map_layout(rb_wcache_stream *ws, rb_error *err)
{
    const rb_gguf *g = rb_model_gguf(ws->model);
    const rb_gguf_tensor *embd = rb_gguf_find_tensor(g, "token_embd.weight");
    if (!embd || embd->n_dims < 2 || embd->dims[1] == 0)
        return rb_error_set(err, RB_E_FORMAT, "wcache: token_embd.weight is missing or not a "
                            "matrix");
    int is_tied = rb_gguf_find_tensor(g, "output.weight") == NULL;
    ws->embd_off = embd->file_offset;
    ws->embd_row_bytes = embd->n_bytes / embd->dims[1];
    rb_status st = build_units(ws, is_tied, err);
    if (st != RB_OK)
        return st;
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        uint64_t a = t->file_offset, b = t->file_offset + t->n_bytes;
        int is_small = t->n_dims == 1;
        if (unit_of(ws, t, is_tied) >= 0)
            label_range(ws, a, b, is_small ? RB_CLASS_HOT : RB_CLASS_LOOP);
        else if (t == embd || is_small) /* rows as used; rope factors */
            label_range(ws, a, b, RB_CLASS_HOT);
    }
    /* the plan's sizes */
    for (uint32_t k = 0; k < ws->n_keys; k++) {
        if (ws->label[k] == RB_CLASS_LOOP)
            ws->loop_blocks++, ws->loop_bytes += key_bytes(ws, k);
        else if (ws->label[k] == RB_CLASS_HOT && !(key_lo(ws, k) >= ws->embd_off &&
                 key_hi(ws, k) <= ws->embd_off + embd->n_bytes && !is_tied))
            ws->hot_blocks++, ws->hot_bytes += key_bytes(ws, k);
    }
    uint32_t pair = 0;
    for (uint32_t u = 0; u < ws->n_units; u++) {
        uint32_t na = ws->units[u].n, nb = ws->units[(u + 1) % ws->n_units].n;
        if (na > ws->max_unit_blocks)
            ws->max_unit_blocks = na;
        if (na + nb > pair)
            pair = na + nb;
    }
    ws->pair_blocks = pair;
    /* + 2: the embedding rows of one decoded token (a row may straddle two blocks) */
    ws->min_blocks = ws->hot_blocks + ws->max_unit_blocks + 2;
    return RB_OK;
}

static rb_status open_files(rb_wcache_stream *ws, rb_error *err)
{
    if (ws->base % WS_PAGE == 0)
        ws->fd = ws->os->open(ws->path, O_RDONLY | O_DIRECT | O_CLOEXEC, 0);
    ws->is_direct = ws->fd >= 0;
    ws->fd_buffered = ws->os->open(ws->path, O_RDONLY | O_CLOEXEC, 0);
    if (ws->fd < 0)
        ws->fd = ws->fd_buffered >= 0 ? dup(ws->fd_buffered) : -1;
    if (ws->fd < 0 || ws->fd_buffered < 0)
        return rb_error_set(err, RB_E_IO, "wcache: cannot open %s: %s", ws->path,
                            strerror(errno));
    return RB_OK;
}

rb_status rb_wcache_stream_create(rb_model *model, const char *path, const rb_os *os,
                                  rb_throttle *throttle, const rb_wcache_stream_params *p,
                                  rb_wcache_stream **out, rb_error *err)
{
    const rb_gguf *g = rb_model_gguf(model);
    if (!path || !p || rb_gguf_n_tensors(g) == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "wcache: a model file with tensors is needed");
    const rb_gguf_tensor *t0 = rb_gguf_tensor_at(g, 0);
    if (rb_gguf_tensor_data(g, t0))
        return rb_error_set(err, RB_E_UNSUPPORTED, "wcache: %s is memory-mapped: streaming "
                            "needs the weight buffer (open the model without mmap)", path);
    const uint8_t *d0 = rb_model_tensor_data(model, t0);
    if (!d0)
        return rb_error_set(err, RB_E_INVALID_ARG, "wcache: the weight buffer is not allocated");
    const char *pname = p->policy && *p->policy ? p->policy : "class";
    const rb_policy_methods *m = rb_policy_find(pname);
    if (!m || m->needs_future)
        return rb_error_set(err, RB_E_NOT_FOUND, "wcache: policy '%s' %s (class, lru, fifo, "
                            "clock, 2q, arc, lirs, mru)", pname,
                            m ? "needs the future: simulator only" : "is unknown");
    uint32_t blk = p->block_bytes;
    if (!blk) { /* 64 KiB, or less for a small model: a layer spans >= 16 blocks */
        uint64_t largest = 0;
        for (uint32_t l = 0; l < rb_model_hparams(model)->n_layers; l++)
            if (rb_model_get_layer_bytes(model, l) > largest)
                largest = rb_model_get_layer_bytes(model, l);
        for (blk = WS_BLOCK_DEFAULT; blk > WS_PAGE && (uint64_t)blk * 16 > largest; blk /= 2)
            ;
    }
    if (blk % WS_PAGE != 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "wcache: block size %" PRIu32 " is not a "
                            "multiple of 4 KiB", blk);
    rb_wcache_stream *ws = calloc(1, sizeof *ws);
    if (!ws)
        return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    ws->model = model;
    ws->os = os ? os : rb_os_default();
    ws->throttle = throttle;
    ws->fd = ws->fd_buffered = -1;
    ws->blk = blk;
    ws->max_req = p->max_request_bytes ? p->max_request_bytes : WS_REQUEST_DEFAULT;
    if (ws->max_req < blk)
        ws->max_req = blk;
    ws->base = (uintptr_t)d0 - (uintptr_t)t0->file_offset;
    ws->file_size = rb_gguf_file_size(g);
    ws->mem_lo = rb_gguf_data_offset(g) / WS_PAGE * WS_PAGE;
    ws->mem_hi = (ws->file_size + WS_PAGE - 1) / WS_PAGE * WS_PAGE;
    ws->n_keys = (uint32_t)((ws->mem_hi + blk - 1) / blk);
    ws->n_units = rb_model_hparams(model)->n_layers + 1;
    ws->cur = -1;
    ws->is_class = !strcmp(m->name, "class");
    pthread_mutex_init(&ws->mu, NULL);
    pthread_cond_init(&ws->cv, NULL);
    pthread_mutex_init(&ws->pass_mu, NULL);
    pthread_cond_init(&ws->pass_cv, NULL);
    ws->path = strdup(path);
    ws->label = calloc(ws->n_keys, 1);
    ws->kstate = calloc(ws->n_keys, 1);
    ws->units = calloc(ws->n_units, sizeof *ws->units);
    ws->held = calloc(ws->n_units, 1);
    ws->victims = malloc((size_t)ws->n_keys * sizeof *ws->victims);
    ws->dq = malloc((size_t)ws->n_keys * sizeof *ws->dq);
    rb_status st = RB_OK;
    if (!ws->path || !ws->label || !ws->kstate || !ws->units || !ws->held || !ws->victims ||
        !ws->dq)
        st = rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    if (st == RB_OK)
        st = map_layout(ws, err);
    if (st == RB_OK && !(ws->io_list = malloc((size_t)(ws->max_unit_blocks + 1) *
                                              sizeof *ws->io_list)))
        st = rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    uint64_t cap = p->budget_bytes / blk;
    if (st == RB_OK && p->min_budget_out)
        *p->min_budget_out = (uint64_t)ws->min_blocks * blk;
    if (st == RB_OK && cap < ws->min_blocks)
        st = rb_error_set(err, RB_E_BUDGET, "wcache: a weight budget of %" PRIu64 " bytes is "
                          "below the minimum of %" PRIu64 " bytes (%.1f MiB: the hot set %.1f "
                          "MiB + the largest unit %.1f MiB + 2 embedding blocks)",
                          p->budget_bytes, (uint64_t)ws->min_blocks * blk,
                          (double)ws->min_blocks * blk / 1048576.0, ws->hot_bytes / 1048576.0,
                          (double)ws->max_unit_blocks * blk / 1048576.0);
    if (cap > ws->n_keys)
        cap = ws->n_keys;
    if (st == RB_OK) {
        rb_policy_config cfg = {.n_keys = ws->n_keys, .capacity = (uint32_t)cap,
                                .window = window_for(ws, (uint32_t)cap), .key_class = ws->label};
        st = rb_policy_create(m->name, &cfg, &ws->pol, err);
    }
    if (st == RB_OK)
        st = open_files(ws, err);
    if (st != RB_OK) {
        rb_wcache_stream_destroy(ws);
        return st;
    }
    ws->cap0_bytes = cap * blk;
    /* the buffer may hold a previous session's weights: the cache owns it now */
    madvise((void *)(ws->base + ws->mem_lo), ws->mem_hi - ws->mem_lo, MADV_DONTNEED);
    madvise((void *)(ws->base + ws->mem_lo), ws->mem_hi - ws->mem_lo, MADV_NOHUGEPAGE);
    rb_model_set_weights_unread(model);
    /* keys every unit reads but no unit holds (rope factors): held for
       good; marked first, so a block two such tensors share is held once */
    uint8_t *mark = calloc(ws->n_keys, 1);
    ws->glob = malloc((size_t)ws->n_keys * sizeof *ws->glob);
    if (!mark || !ws->glob) {
        free(mark);
        rb_wcache_stream_destroy(ws);
        return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    }
    int is_tied = rb_gguf_find_tensor(g, "output.weight") == NULL;
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        if (t->n_dims == 1 && unit_of(ws, t, is_tied) < 0)
            for (uint64_t k = t->file_offset / blk; k * blk < t->file_offset + t->n_bytes; k++)
                mark[k] = 1;
    }
    for (uint32_t k = 0; k < ws->n_keys; k++)
        if (mark[k])
            ws->glob[ws->n_glob++] = k;
    free(mark);
    if (ws->n_glob) {
        uint32_t *q = malloc((size_t)ws->n_glob * sizeof *q), n_pinned = 0;
        pthread_mutex_lock(&ws->mu);
        st = q ? load_keys(ws, ws->glob, ws->n_glob, 0, q, &n_pinned, err)
               : rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
        pthread_mutex_unlock(&ws->mu);
        free(q);
        if (st != RB_OK) {
            rb_wcache_stream_destroy(ws);
            return st;
        }
    }
    if ((ws->reader = calloc(1, sizeof *ws->reader)) != NULL) {
        pthread_mutex_init(&ws->reader->mu, NULL);
        pthread_cond_init(&ws->reader->cv, NULL);
        ws->reader->has_thread = pthread_create(&ws->reader->thread, NULL, reader_main, ws) == 0;
    } /* without it, reads go one at a time */
    if (pthread_create(&ws->thread, NULL, io_main, ws) != 0) {
        rb_wcache_stream_destroy(ws);
        return rb_error_set(err, RB_E_IO, "wcache: cannot start the I/O worker");
    }
    ws->has_thread = 1;
    *out = ws;
    return RB_OK;
}

void rb_wcache_stream_destroy(rb_wcache_stream *ws)
{
    if (!ws)
        return;
    if (ws->has_thread) {
        pthread_mutex_lock(&ws->mu);
        ws->stop = 1;
        pthread_cond_broadcast(&ws->cv);
        pthread_mutex_unlock(&ws->mu);
        pthread_join(ws->thread, NULL);
    }
    if (ws->reader) {
        ws_reader *r = ws->reader;
        if (r->has_thread) {
            pthread_mutex_lock(&r->mu);
            r->stop = 1;
            pthread_cond_broadcast(&r->cv);
            pthread_mutex_unlock(&r->mu);
            pthread_join(r->thread, NULL);
        }
        pthread_cond_destroy(&r->cv);
        pthread_mutex_destroy(&r->mu);
        free(r);
    }
    /* the weights read so far leave RAM with the cache (the model says
       they are unread, so a later session reads them again) */
    if (ws->mem_hi > ws->mem_lo && ws->kstate)
        madvise((void *)(ws->base + ws->mem_lo), ws->mem_hi - ws->mem_lo, MADV_DONTNEED);
    if (ws->fd >= 0)
        ws->os->close(ws->fd);
    if (ws->fd_buffered >= 0)
        ws->os->close(ws->fd_buffered);
    rb_policy_destroy(ws->pol);
    pthread_cond_destroy(&ws->cv);
    pthread_mutex_destroy(&ws->mu);
    pthread_cond_destroy(&ws->pass_cv);
    pthread_mutex_destroy(&ws->pass_mu);
    free(ws->users);
    free_throttle(ws->own_throttle);
    free(ws->path);
    free(ws->label);
    free(ws->kstate);
    for (uint32_t u = 0; ws->units && u < ws->n_units; u++)
        free(ws->units[u].keys);
    free(ws->units);
    free(ws->held);
    free(ws->victims);
    free(ws->dq);
    free(ws->io_list);
    free(ws->rows);
    free(ws->glob);
    free(ws);
}
