/*
 * residency.c - segments, tiers, trim and the layer-ordered restore.
 *
 * Does: decide which segments leave RAM and to which tier, keep the
 * accounts, and bring segments back with workers (storage reads on the
 * I/O workers, codec decodes on the decode worker) in layer order while the
 * forward pass computes. Does not: own KV page contents (the KV cache's
 * slots), read weights (wcache), do file I/O (store), or know what a layer
 * computes.
 *
 * Memory:
 *
 *   segs[layer][page]   kv_seg: tier, failed flag, the compressed frame
 *                       (malloc'd to its exact size, owned here)
 *   slots[layer][page]  the KV cache's (kv.cache->pages): NULL or a page
 *                       buffer (rb_kvpage_alloc: a mapping of its own); a
 *                       restore fills the slot from the plan's batch
 *                       mapping, a trim empties it, both through the KV
 *                       cache's rb_kvcache_fill_slot / _free_slot
 *   jobs                the restore plan: segment ids in layer order, one
 *                       array per worker, sized for every segment at create
 *   enc_buf             one frame of rb_kvcodec_bound() for trims
 *
 * Segment ids: layer * pages_per_layer + page for KV; n_kv_segs + layer for
 * a layer's weights. The store is keyed by the KV id.
 *
 * Locking: `mu` guards every kv_seg field, the slots while a restore runs,
 * pending[], layer_failed[], the job queues and the stats. Workers take a
 * job under mu, do the I/O or decode outside it, and publish the slot
 * under mu; the forward pass reads a layer's slots only after
 * rb_residency_wait_layer returned for it (mu gives the happens-before).
 * Trim runs only between feeds (no restore in flight): the session's own
 * trims run while it holds the manager (rb_residency_hold .. _let_go),
 * and the pool's (rb_residency_pool_trim, any thread) run either while
 * nobody holds it, under `hold_mu`, which the holder takes to begin, or
 * by the holder when it serves the request the pool left (the rule is
 * above rb_residency_hold, at the end of the file). `hold_mu` guards the
 * holder's fields and the request; lock order: the pool's mutex, then
 * hold_mu, then mu. A prefetch (rb_residency_begin_prefetch) is the one
 * restore in flight while the session is idle: every trim stops it first
 * (stop_open_restore: its queued jobs dropped, the running ones waited
 * for), so a trim still never overlaps a restore.
 *
 * Pins (the session file's storage worker, which writes pages while the
 * session goes on): a pinned page is RESIDENT and its slot's buffer stays
 * as it is until unpinned - a trim by bytes skips it (it may run inside a
 * feed: the budget), a trim by level and a forget wait for the unpin on
 * cv_pin. `epoch` counts forgets: a pin taken for an epoch that has passed
 * fails, so the writer never reads a slot that the KV cache refills (the
 * cache writes slots without mu, but only after a forget). Pins, epoch and
 * n_pinned are guarded by mu.
 *
 * Invariants: a page below n_pages is in exactly one tier; RESIDENT means
 * its slot holds the data; COMPRESSED means frame != NULL and slot NULL;
 * STORED means the store has its id and slot NULL; DROPPED means nothing
 * anywhere; RESIDENT with slot NULL is a page released for good (outside a
 * sliding window: rb_residency_release_page), which nothing touches. Pages at or beyond n_pages are RESIDENT with whatever slot the
 * KV cache gave them (the cache allocates them on reserve).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "os.h"
#include "residency.h"
#include "rebound_experimental.h"
#include "residency_split.h"
#include "status.h"
#include "zram.h"

/* Storage reads in flight on the I/O workers (the decode worker adds one
 * when it has nothing to decode). The emulated device's bandwidth is
 * shared by them all, so more workers never read faster than the profile;
 * they hide the real disk's per-request jitter under the model: a cold
 * restore of qwen3-0.6b Q8_0 at 2048 tokens (670 MiB read, phone profile,
 * this VM's shared disk at 0.7-1.1 GB/s for one stream) took a median TTFT
 * of 1.70 s with one I/O worker and 1.43 s with two (11 alternating pairs;
 * the restore itself 1.39 -> 1.05 s). */
#define N_IO_WORKERS 2

typedef struct kv_seg {
    uint8_t tier;        /* rb_tier */
    uint8_t failed;      /* its restore failed: recompute from here */
    uint8_t is_zram;     /* the frame is an lz4/zstd one (zram.h), else kvcodec */
    uint8_t saved;       /* an identical copy is at the saved source */
    uint8_t from_saved;  /* STORED at the saved source, not in the spill */
    uint8_t pins;        /* the session file's writer is reading the slot */
    uint8_t mapped;      /* the slot maps the saved source's copy */
    uint8_t disk_full;   /* a write to the store failed for it once (counted) */
    uint8_t spilled;     /* RESIDENT, and the store still holds an identical
                            copy (a full page restored from it): the next
                            trim moves it to STORED without a write */
    uint32_t frame_bytes;
    void *frame;         /* COMPRESSED only */
} kv_seg;

struct rb_residency {
    rb_residency_params p;
    rb_residency_kv kv;
    rb_store *store;     /* may be NULL */
    rb_wcache *wcache;   /* may be NULL */
    rb_residency_read_fn saved_read; /* the session file, or NULL */
    rb_residency_release_fn saved_release;
    rb_residency_read_run_fn saved_read_run; /* may be NULL */
    void *saved_ctx;
    int plan_cold;       /* this restore reads every page from the source */
    uint32_t n_kv_segs;
    uint32_t n_pages;    /* pages in use per layer */
    kv_seg *segs;
    void *enc_buf;
    size_t enc_cap;
    double D;            /* codec decode bytes/s (0 until measured) */
    double layer_compute_s; /* the next feed's compute per layer, predicted from
                               the last feeds (rb_residency_note_compute) */
    double last_layer_compute_s; /* of the last feed of one token */
    uint32_t last_plan_jobs; /* the last restore's segments (0: none) */
    uint32_t plan_pages;     /* n_pages when it began: pages below the last are full */
    rb_split_page *picks; /* a trim's candidates (n_kv_segs), their ids, */
    uint32_t *pick_ids;
    double *split_weights; /* and the weight bytes each layer's restore reads */
    double frame_frac;   /* frame bytes / page bytes of the RAM codec, running */
    double R;            /* storage read bytes/s (0 until measured) */

    pthread_mutex_t mu;
    pthread_cond_t cv_work;
    pthread_cond_t cv_layer;
    pthread_cond_t cv_idle;
    pthread_cond_t cv_pin;   /* a page was unpinned */
    uint64_t epoch;          /* forgets so far */
    uint64_t writes;         /* rb_residency_will_write calls so far */
    uint32_t n_pinned;
    uint64_t n_pin_waits, n_pin_skips, n_pin_stale; /* races with the writer, counted */
    uint32_t *pending;       /* [n_layers] */
    uint8_t *layer_failed;   /* [n_layers] */
    uint32_t *io_jobs, n_io, io_next;
    uint32_t *dec_jobs, n_dec, dec_next;
    void **batch;            /* page buffers mapped for this plan */
    uint32_t batch_n, batch_next;
    /* spare page buffers (rb_residency_open_spare): the pages the pool's
       trims of other members freed for this manager's next restore,
       already faulted in. spare_mu is a leaf lock: a trimmed manager puts
       under its own mu, this one's workers take without it. */
    pthread_mutex_t spare_mu;
    void **spare;            /* [n_kv_segs] */
    uint32_t n_spare, spare_cap;
    uint64_t n_spare_put, n_spare_used; /* counters (spare_mu) */
    struct rb_residency *sink; /* in a pool trim: where freed buffers go (mu) */
    void **dead_frames;      /* decoded frames, freed at end_restore */
    uint32_t n_dead;
    int n_busy;              /* workers inside a job */
    int stop;
    int n_threads_started;
    pthread_t threads[N_IO_WORKERS + 1]; /* the I/O workers, then the decode worker */
    int weights_failed;
    rb_error worker_err;

    /* the last feed's timeline (mu) */
    rb_restore_event *ev;
    uint32_t n_ev;
    int cur_layer;       /* layer being computed, -1: none */
    double cur_start;

    /* stats (mu) */
    double t_begin, io_busy_s, dec_busy_s, wait_s, t_last_done;
    double t_last_io_done; /* the storage path's last read of this restore */
    double R_seen;         /* what the storage path delivered (0: not yet) */
    uint64_t bytes_io, bytes_dec, n_disk_full, n_damaged;
    int is_restore_open;   /* begin_restore ran, end_restore not yet (mu) */
    /* a prefetch (rb_residency_begin_prefetch): the open restore was begun
       by no feed; its counters (mu) */
    int is_prefetch;
    uint64_t prefetch_ram_base; /* KV + tables in RAM when it began */
    uint64_t n_prefetches, prefetch_pages, prefetch_bytes, n_prefetch_cancelled;
    uint64_t n_trim_failures; /* the pool's trims that failed (mu) */
    rb_status trim_status;    /* the last one's, */
    double trim_fail_s;       /* and when (rb_throttle_now_s) */

    /* the holder and the pool's requests (hold_mu; the file's opening) */
    pthread_mutex_t hold_mu;
    int is_held;           /* a session operation holds the manager ... */
    pthread_t holder;      /* ... on this thread */
    int is_in_pass;        /* its forward pass runs */
    int req_pending;       /* a pool trim waits for the holder */
    uint64_t req_bytes;
    rb_trim_level req_level;
    rb_trim_scope req_scope;
    _Atomic int trim_pending; /* req_pending, for the layer gate without the lock */
};

#define MAX_EVENTS 8192

/* mu held */
static void log_event(rb_residency *r, rb_event_kind kind, uint32_t layer, double t0, double t1)
{
    if (r->n_ev >= MAX_EVENTS)
        return;
    rb_restore_event *e = &r->ev[r->n_ev++];
    e->kind = kind;
    e->layer = layer;
    e->start_s = t0 - r->t_begin;
    e->end_s = t1 - r->t_begin;
}

static size_t page_alloc_bytes(const rb_residency *r)
{
    return (r->kv.page_bytes + RB_PAGE_ALIGN - 1) / RB_PAGE_ALIGN * RB_PAGE_ALIGN;
}

static uint32_t seg_layer(const rb_residency *r, uint32_t id)
{
    return id >= r->n_kv_segs ? id - r->n_kv_segs : id / r->kv.pages_per_layer;
}

/* ---- codecs: kvcodec frames, or the zram baseline's lz4/zstd frames ------ */

static int is_zram(rb_ram_codec c) { return c == RB_RAM_CODEC_LZ4 || c == RB_RAM_CODEC_ZSTD; }

static rb_status check_codec(rb_ram_codec c, rb_error *err)
{
    if ((unsigned)c > RB_RAM_CODEC_ZSTD)
        return rb_error_set(err, RB_E_INVALID_ARG, "residency: RAM tier codec %d is not one of "
                            "lossless, q8, lz4, zstd", (int)c);
    if (is_zram(c) && !rb_zram_available(c == RB_RAM_CODEC_LZ4 ? RB_ZRAM_LZ4 : RB_ZRAM_ZSTD))
        return rb_error_set(err, RB_E_UNSUPPORTED, "residency: the %s RAM tier is not part of "
                            "this build (liblz4 / libzstd were not found)",
                            c == RB_RAM_CODEC_LZ4 ? "lz4" : "zstd");
    return RB_OK;
}

static rb_status encode_page(const rb_residency *r, rb_ram_codec c, const void *page,
                             size_t *n, rb_error *err)
{
    if (is_zram(c))
        return rb_zram_encode(c == RB_RAM_CODEC_LZ4 ? RB_ZRAM_LZ4 : RB_ZRAM_ZSTD, page,
                              r->kv.page_bytes, r->enc_buf, r->enc_cap, n, err);
    return rb_kvcodec_encode(&r->kv.dims, c == RB_RAM_CODEC_Q8 ? RB_KVCODEC_Q8
                                                               : RB_KVCODEC_LOSSLESS,
                             page, r->enc_buf, r->enc_cap, n, err);
}

static rb_status decode_page(const rb_residency *r, int zram, const void *frame, size_t n,
                             void *page, rb_error *err)
{
    if (zram)
        return rb_zram_decode(frame, n, page, r->kv.page_bytes, err);
    return rb_kvcodec_decode(&r->kv.dims, frame, n, page, r->kv.page_bytes / sizeof(rb_f16),
                             err);
}

/* ---- workers ------------------------------------------------------------ */

/* ---- spare page buffers (rb_residency_open_spare) ------------------------ */

/* Takes a buffer another manager's trim freed (1), or leaves it to the
 * caller (0): this one's spare is closed, full, or of another page size. */
static int spare_put(rb_residency *r, void *buf, size_t n)
{
    pthread_mutex_lock(&r->spare_mu);
    const int ok = n == page_alloc_bytes(r) && r->n_spare < r->spare_cap;
    if (ok) {
        r->spare[r->n_spare++] = buf;
        r->n_spare_put++;
    }
    pthread_mutex_unlock(&r->spare_mu);
    return ok;
}

/* A spare buffer for a restore, or NULL. It held another conversation's
 * KV (maybe another app's): the restore overwrites its first page_bytes
 * (a read or a decode of the whole page, or the buffer is freed), and the
 * rest of it, which no restore writes, is zeroed here. */
static void *spare_take(rb_residency *r)
{
    pthread_mutex_lock(&r->spare_mu);
    void *buf = r->n_spare ? r->spare[--r->n_spare] : NULL;
    r->n_spare_used += buf != NULL;
    pthread_mutex_unlock(&r->spare_mu);
    if (buf && page_alloc_bytes(r) > r->kv.page_bytes)
        memset((uint8_t *)buf + r->kv.page_bytes, 0, page_alloc_bytes(r) - r->kv.page_bytes);
    return buf;
}

void rb_residency_close_spare(rb_residency *r)
{
    pthread_mutex_lock(&r->spare_mu);
    r->spare_cap = 0;
    for (uint32_t i = 0; i < r->n_spare; i++)
        rb_kvpage_free(r->spare[i], page_alloc_bytes(r));
    r->n_spare = 0;
    pthread_mutex_unlock(&r->spare_mu);
}

static uint32_t spare_count(rb_residency *r)
{
    pthread_mutex_lock(&r->spare_mu);
    const uint32_t n = r->n_spare;
    pthread_mutex_unlock(&r->spare_mu);
    return n;
}

/* A page buffer for a restore: a spare one (faulted in already), the next
 * of the batch begin_restore mapped for this plan (one mmap), or a single
 * mapping when the batch could not be made; faulted in with one call.
 * Called without mu. */
static void *alloc_page(rb_residency *r, int populate)
{
    void *buf = spare_take(r);
    if (buf)
        return buf;
    pthread_mutex_lock(&r->mu);
    buf = r->batch_next < r->batch_n ? r->batch[r->batch_next++] : NULL;
    pthread_mutex_unlock(&r->mu);
    if (!buf)
        buf = rb_kvpage_alloc(page_alloc_bytes(r));
    if (buf && populate) /* the worker takes the page faults, not the forward pass */
        rb_kvpage_populate(buf, page_alloc_bytes(r));
    return buf;
}

/* A KV segment's page buffer (NULL: not in RAM). */
static inline void *slot(const rb_residency *r, uint32_t id) { return r->kv.cache->pages[id]; }

/* Frees a slot's page (under mu); a mapped one's source drops its copy.
 * In a pool trim for another member's restore (r->sink) the buffer goes
 * to that member's spare instead, when it takes it. */
static void free_slot(rb_residency *r, uint32_t id)
{
    void *buf = r->sink && !r->segs[id].mapped ? rb_kvcache_take_slot(r->kv.cache, id) : NULL;
    if (buf && !spare_put(r->sink, buf, page_alloc_bytes(r)))
        rb_kvpage_free(buf, page_alloc_bytes(r));
    if (!buf)
        rb_kvcache_free_slot(r->kv.cache, id);
    if (r->segs[id].mapped && r->saved_release)
        r->saved_release(r->saved_ctx, id / r->kv.pages_per_layer, id % r->kv.pages_per_layer);
    r->segs[id].mapped = 0;
}

/* Whether the store holds a copy of the segment: it was stored there, or
 * it kept the copy it was restored from. */
static int in_store(const kv_seg *s)
{
    return (s->tier == RB_TIER_STORED && !s->from_saved) || s->spilled;
}

/* A resident page about to change loses its kept spill copy. mu held. */
static void drop_spilled(rb_residency *r, uint32_t id)
{
    if (r->segs[id].spilled)
        rb_store_drop(r->store, id);
    r->segs[id].spilled = 0;
}

/* Restores one segment; called without mu. Returns 0 or -1. */
static int restore_one(rb_residency *r, uint32_t id, int is_io, rb_error *err)
{
    if (id >= r->n_kv_segs)
        return rb_wcache_reload(r->wcache, id - r->n_kv_segs, r->p.throttle, err) == RB_OK
                   ? 0 : -1;
    kv_seg *s = &r->segs[id];
    /* a page read from the session file is not faulted in first: its read
       faults it (O_DIRECT) or maps the file's copy (nothing to zero) */
    int from_saved = is_io && s->from_saved;
    void *buf = alloc_page(r, !from_saved);
    if (!buf) {
        rb_error_set(err, RB_E_NOMEM, "residency: out of memory restoring a KV page");
        return -1;
    }
    rb_status st;
    int mapped = 0;
    if (from_saved) {
        int rc = r->saved_read(r->saved_ctx, id / r->kv.pages_per_layer,
                               id % r->kv.pages_per_layer, buf, r->plan_cold, err);
        mapped = rc == 1;
        st = rc >= 0 ? RB_OK : (err->status ? err->status : RB_E_IO);
    } else if (is_io)
        st = rb_store_get(r->store, id, buf, r->kv.page_bytes, err);
    else
        st = decode_page(r, s->is_zram, s->frame, s->frame_bytes, buf, err);
    if (st != RB_OK) {
        rb_kvpage_free(buf, page_alloc_bytes(r));
        if (from_saved && r->saved_release) /* a bad copy is not kept cached */
            r->saved_release(r->saved_ctx, id / r->kv.pages_per_layer,
                             id % r->kv.pages_per_layer);
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    rb_kvcache_fill_slot(r->kv.cache, id, buf);
    s->mapped = (uint8_t)mapped;
    if (is_io && s->from_saved) {
        s->from_saved = 0; /* the copy stays in the file */
    } else if (is_io) {
        /* a full page never changes again (only the last in-use page is
           written, and a forget drops the copies from the page before its
           first): its copy is kept for the next trim */
        if (id % r->kv.pages_per_layer + 1 < r->plan_pages)
            s->spilled = 1;
        else
            rb_store_drop(r->store, id);
    } else {
        /* freed after the forward pass (end_restore): a large free is a
           munmap, whose TLB shootdown interrupts the computing threads */
        r->dead_frames[r->n_dead++] = s->frame;
        s->frame = NULL;
        s->frame_bytes = 0;
    }
    s->tier = RB_TIER_RESIDENT;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* A page read from the saved source goes in its slot (mu taken here). */
static void place_saved(rb_residency *r, uint32_t id, void *buf)
{
    pthread_mutex_lock(&r->mu);
    rb_kvcache_fill_slot(r->kv.cache, id, buf);
    r->segs[id].mapped = 0;
    r->segs[id].from_saved = 0; /* the copy stays in the file */
    r->segs[id].tier = RB_TIER_RESIDENT;
    pthread_mutex_unlock(&r->mu);
}

/* The most pages one request reads: 1 MiB, the profiles' request size. */
static uint32_t run_max(const rb_residency *r)
{
    enum { RUN_CAP = 64 };
    const size_t n = ((size_t)1 << 20) / page_alloc_bytes(r);
    return n < 1 ? 1 : n > RUN_CAP ? RUN_CAP : (uint32_t)n;
}

/* Restores n consecutive saved pages of one layer (ids[i] = ids[0] + i)
 * with one request; rc[i] as restore_one's. Called without mu. When the
 * run read fails, each page is read again alone into its buffer, so a
 * damaged page fails alone and its message names it. */
static void restore_run(rb_residency *r, const uint32_t *ids, uint32_t n, int *rc, rb_error *err)
{
    enum { RUN_CAP = 64 };
    void *bufs[RUN_CAP];
    uint32_t got = 0;
    while (got < n && (bufs[got] = alloc_page(r, 0)))
        got++;
    const uint32_t ppl = r->kv.pages_per_layer, layer = ids[0] / ppl;
    rb_error run_err = {0};
    const int ok = got == n && r->saved_read_run(r->saved_ctx, layer, ids[0] % ppl, n, bufs,
                                                 &run_err) == 0;
    for (uint32_t i = 0; i < n; i++) {
        rc[i] = 0;
        if (i >= got) {
            rb_error_set(err, RB_E_NOMEM, "residency: out of memory restoring a KV page");
            rc[i] = -1;
            continue;
        }
        if (!ok && r->saved_read(r->saved_ctx, layer, ids[i] % ppl, bufs[i], 0, err) < 0) {
            rb_kvpage_free(bufs[i], page_alloc_bytes(r));
            if (r->saved_release) /* a bad copy is not kept cached */
                r->saved_release(r->saved_ctx, layer, ids[i] % ppl);
            rc[i] = -1;
            continue;
        }
        place_saved(r, ids[i], bufs[i]);
    }
}

/*
 * A worker takes its own queue's next job; the decode worker, when its
 * queue is empty, also takes storage reads (a cold restore from a session
 * file has nothing to decode). The I/O workers never decode: decoding is
 * CPU the forward pass needs. Storage requests in flight: N_IO_WORKERS,
 * plus the decode worker when idle.
 */
static void worker_loop(rb_residency *r, int own_is_io)
{
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->stop && r->io_next == r->n_io && (own_is_io || r->dec_next == r->n_dec))
            pthread_cond_wait(&r->cv_work, &r->mu);
        if (r->stop)
            break;
        int is_io = own_is_io || r->dec_next == r->n_dec;
        uint32_t id = is_io ? r->io_jobs[r->io_next++] : r->dec_jobs[r->dec_next++];
        /* a run: the layer's next saved pages, side by side in the queue */
        enum { RUN_CAP = 64 };
        uint32_t run[RUN_CAP];
        int rcs[RUN_CAP];
        uint32_t n_run = 1;
        run[0] = id;
        if (is_io && id < r->n_kv_segs && r->segs[id].from_saved && r->saved_read_run) {
            const uint32_t max = run_max(r), ppl = r->kv.pages_per_layer;
            while (n_run < max && r->io_next < r->n_io &&
                   r->io_jobs[r->io_next] == id + n_run && (id + n_run) % ppl != 0 &&
                   r->segs[id + n_run].from_saved)
                run[n_run++] = r->io_jobs[r->io_next++];
        }
        r->n_busy++;
        pthread_mutex_unlock(&r->mu);

        rb_error err = {0};
        double t0 = rb_throttle_now_s();
        if (n_run > 1)
            restore_run(r, run, n_run, rcs, &err);
        else
            rcs[0] = restore_one(r, id, is_io, &err);
        double t1 = rb_throttle_now_s();

        pthread_mutex_lock(&r->mu);
        for (uint32_t k = 0; k < n_run; k++) {
            id = run[k];
            const int rc = rcs[k];
            uint32_t layer = seg_layer(r, id);
            if (rc != 0) {
                if (id >= r->n_kv_segs) {
                    r->weights_failed = 1;
                    r->worker_err = err;
                } else {
                    r->segs[id].failed = 1;
                    r->segs[id].tier = RB_TIER_DROPPED;
                    if (r->segs[id].frame) {
                        free(r->segs[id].frame);
                        r->segs[id].frame = NULL;
                    }
                    if (is_io && !r->segs[id].from_saved)
                        rb_store_drop(r->store, id);
                    r->segs[id].from_saved = r->segs[id].saved = 0;
                    r->n_damaged++;
                }
                r->layer_failed[layer] = 1;
            }
            uint64_t bytes = id >= r->n_kv_segs ? rb_wcache_layer_bytes(r->wcache, layer)
                                                : r->kv.page_bytes;
            log_event(r, is_io ? RB_EVENT_RESTORE_IO : RB_EVENT_RESTORE_DECODE, layer, t0, t1);
            const double busy = k == 0 ? t1 - t0 : 0.0; /* a run is one request */
            if (is_io) {
                r->io_busy_s += busy;
                r->bytes_io += bytes;
            } else {
                r->dec_busy_s += busy;
                r->bytes_dec += bytes;
            }
            r->t_last_done = t1;
            if (is_io)
                r->t_last_io_done = t1;
            if (r->is_prefetch && rc == 0) {
                r->prefetch_pages += id < r->n_kv_segs;
                r->prefetch_bytes += bytes;
            }
            r->pending[layer]--;
        }
        r->n_busy--;
        pthread_cond_broadcast(&r->cv_layer);
        pthread_cond_broadcast(&r->cv_idle);
    }
    pthread_mutex_unlock(&r->mu);
}

static void *io_worker(void *arg)
{
    worker_loop(arg, 1);
    return NULL;
}

static void *dec_worker(void *arg)
{
    worker_loop(arg, 0);
    return NULL;
}

/* ---- lifetime ------------------------------------------------------------ */

rb_status rb_residency_create(const rb_residency_params *p, const rb_residency_kv *kv,
                              rb_store *store, rb_wcache *wcache, rb_residency **out,
                              rb_error *err)
{
    if (!p || !kv || !out || !kv->cache || kv->n_layers == 0 || kv->page_bytes == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "residency: bad arguments");
    rb_status cst = check_codec(p->ram_codec, err);
    if (cst != RB_OK)
        return cst;
    if (!(p->storage_bytes_per_s >= 0) || !(p->decode_bytes_per_s >= 0))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "residency: bandwidths must be >= 0 (0: measured), got R %g, D %g",
                            p->storage_bytes_per_s, p->decode_bytes_per_s);
    if (rb_kvcodec_page_bytes(&kv->dims) != kv->page_bytes)
        return rb_error_set(err, RB_E_INVALID_ARG, "residency: page of %zu bytes does not "
                            "match the codec geometry", kv->page_bytes);
    rb_residency *r = calloc(1, sizeof *r);
    if (!r)
        return rb_error_set(err, RB_E_NOMEM, "residency: out of memory");
    r->p = *p;
    r->kv = *kv;
    r->store = store;
    r->wcache = wcache;
    r->D = p->decode_bytes_per_s;
    r->R = p->storage_bytes_per_s;
    r->n_kv_segs = kv->n_layers * kv->pages_per_layer;
    uint32_t n_all = r->n_kv_segs + kv->n_layers;
    r->segs = calloc(r->n_kv_segs ? r->n_kv_segs : 1, sizeof *r->segs);
    r->pending = calloc(kv->n_layers, sizeof *r->pending);
    r->layer_failed = calloc(kv->n_layers, 1);
    r->io_jobs = malloc(n_all * sizeof *r->io_jobs);
    r->dec_jobs = malloc(n_all * sizeof *r->dec_jobs);
    r->batch = malloc(n_all * sizeof *r->batch);
    r->dead_frames = malloc(n_all * sizeof *r->dead_frames);
    r->spare = malloc((r->n_kv_segs ? r->n_kv_segs : 1) * sizeof *r->spare);
    /* room for any codec rb_residency_set_mode may switch to */
    r->enc_cap = 0;
    for (int c = RB_KVCODEC_LOSSLESS; c <= RB_KVCODEC_Q4; c++) {
        uint64_t b = rb_kvcodec_bound(&kv->dims, (rb_kvcodec_id)c);
        r->enc_cap = b > r->enc_cap ? b : r->enc_cap;
    }
    for (int c = RB_ZRAM_LZ4; c <= RB_ZRAM_ZSTD; c++) {
        uint64_t b = rb_zram_bound((rb_zram_codec)c, kv->page_bytes);
        r->enc_cap = b > r->enc_cap ? b : r->enc_cap;
    }
    r->enc_buf = malloc(r->enc_cap);
    r->ev = malloc(MAX_EVENTS * sizeof *r->ev);
    r->picks = malloc((r->n_kv_segs ? r->n_kv_segs : 1) * sizeof *r->picks);
    r->pick_ids = malloc((r->n_kv_segs ? r->n_kv_segs : 1) * sizeof *r->pick_ids);
    r->split_weights = calloc(kv->n_layers ? kv->n_layers : 1, sizeof *r->split_weights);
    r->cur_layer = -1;
    if (!r->segs || !r->pending || !r->layer_failed || !r->io_jobs ||
        !r->dec_jobs || !r->enc_buf || !r->ev || !r->batch || !r->dead_frames || !r->picks ||
        !r->pick_ids || !r->split_weights || !r->spare) {
        rb_residency_destroy(r);
        return rb_error_set(err, RB_E_NOMEM, "residency: out of memory");
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_mutex_init(&r->hold_mu, NULL);
    pthread_mutex_init(&r->spare_mu, NULL);
    pthread_cond_init(&r->cv_work, NULL);
    pthread_cond_init(&r->cv_layer, NULL);
    pthread_cond_init(&r->cv_idle, NULL);
    pthread_cond_init(&r->cv_pin, NULL);
    r->n_threads_started = -1; /* the sync objects exist */
    for (int i = 0; i <= N_IO_WORKERS; i++) {
        if (pthread_create(&r->threads[i], NULL, i < N_IO_WORKERS ? io_worker : dec_worker, r)
            != 0) {
            rb_residency_destroy(r);
            return rb_error_set(err, RB_E_IO, "residency: cannot start the %s worker",
                                i < N_IO_WORKERS ? "I/O" : "decode");
        }
        r->n_threads_started = i + 1;
    }
    *out = r;
    return RB_OK;
}

void rb_residency_destroy(rb_residency *r)
{
    if (!r)
        return;
    if (r->n_threads_started != 0) {
        pthread_mutex_lock(&r->mu);
        r->stop = 1;
        pthread_cond_broadcast(&r->cv_work);
        pthread_mutex_unlock(&r->mu);
        for (int i = 0; i < r->n_threads_started; i++)
            pthread_join(r->threads[i], NULL);
        pthread_mutex_destroy(&r->mu);
        pthread_mutex_destroy(&r->hold_mu);
        pthread_mutex_destroy(&r->spare_mu);
        pthread_cond_destroy(&r->cv_work);
        pthread_cond_destroy(&r->cv_layer);
        pthread_cond_destroy(&r->cv_idle);
        pthread_cond_destroy(&r->cv_pin);
    }
    for (uint32_t i = 0; r->segs && i < r->n_kv_segs; i++) {
        free(r->segs[i].frame);
        if (in_store(&r->segs[i]) && r->store)
            rb_store_drop(r->store, i);
    }
    free(r->segs);
    free(r->pending);
    free(r->layer_failed);
    free(r->io_jobs);
    free(r->dec_jobs);
    free(r->picks);
    free(r->pick_ids);
    free(r->split_weights);
    for (uint32_t i = 0; r->batch && i < r->batch_n; i++)
        if (i >= r->batch_next)
            rb_kvpage_free(r->batch[i], page_alloc_bytes(r));
    for (uint32_t i = 0; r->dead_frames && i < r->n_dead; i++)
        free(r->dead_frames[i]);
    for (uint32_t i = 0; r->spare && i < r->n_spare; i++)
        rb_kvpage_free(r->spare[i], page_alloc_bytes(r));
    free(r->spare);
    free(r->batch);
    free(r->dead_frames);
    free(r->enc_buf);
    free(r->ev);
    free(r);
}

void rb_residency_set_pages(rb_residency *r, uint32_t n_pages)
{
    pthread_mutex_lock(&r->mu); /* read by rb_residency_restore_need, any thread */
    r->n_pages = n_pages < r->kv.pages_per_layer ? n_pages : r->kv.pages_per_layer;
    pthread_mutex_unlock(&r->mu);
}

/* ---- trim ------------------------------------------------------------------ */

/* D, measured once on real data: decode time of the first page trimmed
 * (best of 3, so that a cold cache does not decide the split). */
static void measure_decode(rb_residency *r, const void *page)
{
    size_t n = 0;
    if (encode_page(r, r->p.ram_codec, page, &n, NULL) != RB_OK)
        return;
    r->frame_frac = (double)n / (double)r->kv.page_bytes;
    void *probe = rb_os_aligned_alloc(RB_PAGE_ALIGN, page_alloc_bytes(r));
    if (!probe)
        return;
    double best = 0;
    for (int i = 0; i < 3; i++) {
        double t0 = rb_throttle_now_s();
        if (decode_page(r, is_zram(r->p.ram_codec), r->enc_buf, n, probe, NULL) != RB_OK)
            break;
        double t = rb_throttle_now_s() - t0;
        best = (i == 0 || t < best) ? t : best;
    }
    free(probe);
    if (best > 0 && r->p.decode_bytes_per_s <= 0)
        r->D = (double)r->kv.page_bytes / best;
}

/* R, when the profile does not give it (the host as is): the read time of
 * the first page trimmed, written once and read back 4 times (best). */
#define PROBE_ID UINT64_MAX
static void measure_storage(rb_residency *r, const void *page)
{
    if (rb_store_put(r->store, PROBE_ID, page, r->kv.page_bytes, NULL) != RB_OK)
        return;
    void *probe = rb_os_aligned_alloc(RB_PAGE_ALIGN, page_alloc_bytes(r));
    double best = 0;
    for (int i = 0; probe && i < 4; i++) {
        double t0 = rb_throttle_now_s();
        if (rb_store_get(r->store, PROBE_ID, probe, r->kv.page_bytes, NULL) != RB_OK)
            break;
        double t = rb_throttle_now_s() - t0;
        best = (i == 0 || t < best) ? t : best;
    }
    free(probe);
    rb_store_drop(r->store, PROBE_ID);
    if (best > 0)
        r->R = (double)r->kv.page_bytes / best;
}

/* R for the split: the profile's (or measured) rate, or what the storage
 * path delivered in the last restores when that was less. mu held. */
static double storage_rate(const rb_residency *r)
{
    double R = r->R > 0 ? r->R : 1e9;
    return r->R_seen > 0 && r->R_seen < R ? r->R_seen : R;
}

/* Moves one resident page to the compressed tier; returns bytes freed, or
 * 0 with err set. */
static uint64_t compress_page(rb_residency *r, uint32_t id, rb_error *err)
{
    size_t n = 0;
    rb_ram_codec c = r->p.ram_codec;
    /* a lossy codec refuses a page with Inf/NaN: such a page stays exact */
    if (encode_page(r, c, slot(r, id), &n, NULL) != RB_OK) {
        c = RB_RAM_CODEC_LOSSLESS;
        if (encode_page(r, c, slot(r, id), &n, err) != RB_OK)
            return 0;
    }
    void *frame = malloc(n);
    if (!frame) {
        rb_error_set(err, RB_E_NOMEM, "residency: out of memory for a compressed page");
        return 0;
    }
    memcpy(frame, r->enc_buf, n);
    drop_spilled(r, id); /* a lossy frame is not that copy */
    free_slot(r, id);
    r->segs[id].frame = frame;
    r->segs[id].frame_bytes = (uint32_t)n;
    r->segs[id].is_zram = (uint8_t)is_zram(c);
    r->frame_frac = 0.9 * r->frame_frac + 0.1 * (double)n / (double)r->kv.page_bytes;
    r->segs[id].tier = RB_TIER_COMPRESSED;
    return r->kv.page_bytes > n ? r->kv.page_bytes - n : 0;
}

/*
 * The trim algorithm (the steps are labelled in the code):
 *  1. The candidates: every resident KV page of the layers the level names
 *     (last quarter, last half, all), or of all layers for a byte count,
 *     from the last layer to the first (the restore runs in layer order and
 *     the forward pass starts on layer 0, so the last layers have the
 *     longest time to come back). A byte count skips pages the session
 *     file's worker has pinned (never a wait inside a feed); a level waits.
 *  2. The tiers: recompute mode drops every page; eager mode stores it; a
 *     page already on storage (the spill's kept copy, the session file) is
 *     dropped without a write; otherwise (pipelined) residency_split.c
 *     picks its path, walking the pages in restore order: storage when the
 *     storage path (at R, or the lower rate the last restores saw) delivers
 *     it before the forward pass reaches its layer (layer x the last turn's
 *     compute per layer), else, for a level, the path whose predicted
 *     finish time with this page is smaller (compressed bytes / D, storage
 *     bytes / R + per-I/O latency: the two finish together, the split
 *     D/(D+R)); for a byte count, the path with the smaller predicted
 *     restore time per byte freed: a compressed page frees only what the
 *     codec saves (lossless at 1.25x frees 20% of a page), and every byte
 *     it does not free takes a page of an earlier layer - so a byte count
 *     takes pages until the split frees enough.
 *  3. Move them, in trim order. A store write that fails (a full disk)
 *     keeps the page: it is compressed instead and counted (n_disk_full).
 *  4. If the KV was not enough (bytes) or the level is complete, the
 *     weights of layers go, last first.
 */
rb_status rb_residency_trim(rb_residency *r, uint64_t bytes, rb_trim_level level,
                            uint64_t *freed_out, rb_error *err)
{
    return rb_residency_trim_kv(r, bytes, level, RB_TRIM_SCOPE_ALL, freed_out, err);
}

/* A compressed page goes to storage (mu held): its frame is decoded into
 * a page buffer, written, and both freed. Returns the RAM freed (the
 * frame), 0 when it stays (no memory, a failed write: it is still in the
 * compressed tier, nothing lost). */
static uint64_t demote_frame(rb_residency *r, uint32_t id)
{
    kv_seg *s = &r->segs[id];
    /* a scratch page of its own: alloc_page takes mu, which the trim holds
       (a pool trim by bytes over compressed pages hung here) */
    void *buf = rb_kvpage_alloc(page_alloc_bytes(r));
    if (!buf)
        return 0;
    rb_error e = {0};
    uint64_t freed = 0;
    if (decode_page(r, s->is_zram, s->frame, s->frame_bytes, buf, &e) == RB_OK &&
        rb_store_put(r->store, id, buf, r->kv.page_bytes, &e) == RB_OK) {
        freed = s->frame_bytes;
        free(s->frame);
        s->frame = NULL;
        s->frame_bytes = 0;
        s->tier = RB_TIER_STORED;
    }
    rb_kvpage_free(buf, page_alloc_bytes(r));
    return freed;
}

rb_status rb_residency_trim_kv(rb_residency *r, uint64_t bytes, rb_trim_level level,
                               rb_trim_scope scope, uint64_t *freed_out, rb_error *err)
{
    /* the pool's trims: storage only (a page there frees all of its RAM,
       a compressed one a fraction), compressed pages too */
    const int to_storage =
        (scope == RB_TRIM_SCOPE_KV_TO_STORAGE || scope == RB_TRIM_SCOPE_KV_OWN) && r->store;
    const int own_only = scope == RB_TRIM_SCOPE_KV_OWN;
    const uint32_t L = r->kv.n_layers;
    uint32_t first_layer = 0;
    int weights = 0;
    switch (level) {
    case RB_TRIM_BYTES: break;
    case RB_TRIM_BACKGROUND: first_layer = L - (L + 3) / 4; break;
    case RB_TRIM_MODERATE: first_layer = L - (L + 1) / 2; break;
    case RB_TRIM_COMPLETE: weights = 1; break;
    default:
        return rb_error_set(err, RB_E_INVALID_ARG, "residency: unknown trim level %d",
                            (int)level);
    }
    const int by_bytes = level == RB_TRIM_BYTES;
    uint64_t freed = 0;
    rb_status st = RB_OK;
    const uint64_t pb = r->kv.page_bytes;

    pthread_mutex_lock(&r->mu);
    /* 1. the candidates, in trim order; a byte count takes pages being
       saved last (never a wait), a level waits for them */
    uint32_t n = 0;
    for (uint32_t l = L; l-- > first_layer;)
        for (uint32_t pg = 0; pg < r->n_pages; pg++) {
            uint32_t id = l * r->kv.pages_per_layer + pg;
            kv_seg *s = &r->segs[id];
            if (s->pins && by_bytes) {
                r->n_pin_skips++;
                continue;
            }
            r->n_pin_waits += s->pins != 0;
            while (s->pins)
                pthread_cond_wait(&r->cv_pin, &r->mu);
            if (to_storage && s->tier == RB_TIER_COMPRESSED && !s->is_zram && r->store) {
                r->pick_ids[n] = id; /* its frame goes to storage (step 3) */
                r->picks[n++] = (rb_split_page){l, 0, 1};
                continue;
            }
            if (s->tier != RB_TIER_RESIDENT || !slot(r, id))
                continue;
            if (own_only && rb_kvcache_slot_has_others(r->kv.cache, id))
                continue; /* the others' too: it stays */
            r->pick_ids[n] = id;
            r->picks[n++] = (rb_split_page){l, (uint8_t)(s->spilled || (s->saved && r->saved_read)),
                                            0};
        }
    /* 2. the tiers: recompute drops, eager stores, zram compresses, and a
       pipelined restore splits (residency_split.h) */
    const int split = r->store && r->p.restore == RB_RESTORE_PIPELINED &&
                      !is_zram(r->p.ram_codec) && !to_storage;
    if (n && r->store && r->R <= 0)
        measure_storage(r, slot(r, r->pick_ids[0]));
    if (n && split && (r->D <= 0 || r->frame_frac <= 0))
        measure_decode(r, slot(r, r->pick_ids[0]));
    uint32_t take = n;
    if (split) {
        for (uint32_t l = 0; l < L; l++)
            r->split_weights[l] = r->wcache && (!rb_wcache_is_resident(r->wcache, l) || weights)
                                      ? (double)rb_wcache_layer_bytes(r->wcache, l) : 0;
        const double R = storage_rate(r);
        rb_split_params sp = {
            .R = R, .D = r->D > 0 ? r->D : R, .latency_s = r->p.storage_latency_s,
            .page_bytes = (double)pb, .frame_frac = r->frame_frac,
            .layer_compute_s = r->layer_compute_s > 0 ? r->layer_compute_s
                                                      : r->last_layer_compute_s,
            .weights_bytes = r->split_weights,
            .n_layers = L, .by_bytes = by_bytes,
        };
        if (by_bytes) {
            /* the fewest pages that could free enough (all stored), then
               more while the split frees too little */
            take = (uint32_t)(bytes / pb + (bytes % pb != 0));
            take = take < n ? take : n;
            for (uint64_t got; (got = rb_split_assign(&sp, r->picks, take)) < bytes && take < n;) {
                uint64_t more = (bytes - got) / pb; /* a page frees at most pb */
                take += more > 0 && more < n - take ? (uint32_t)more : 1;
            }
        } else {
            rb_split_assign(&sp, r->picks, take);
        }
    } else {
        for (uint32_t i = 0; i < n; i++)
            r->picks[i].to_store = r->store && (!is_zram(r->p.ram_codec) || to_storage);
    }
    /* 3. move them, in trim order. A byte count is met by the pages let
       go (taken), each at its size, shared or not: the holders of a
       shared page, asked in turn, let go of the same pages (the same
       order), and the last one's frees their RAM; *freed_out says what
       this one freed */
    uint64_t taken = 0;
    for (uint32_t i = 0; i < take && st == RB_OK; i++) {
        if (by_bytes && taken >= bytes)
            break;
        uint32_t id = r->pick_ids[i];
        kv_seg *s = &r->segs[id];
        if (to_storage && s->tier == RB_TIER_COMPRESSED) {
            const uint64_t f = demote_frame(r, id);
            freed += f;
            taken += f;
            continue;
        }
        if (s->tier != RB_TIER_RESIDENT || !slot(r, id))
            continue;
        if (s->pins) { /* pinned again since step 1 */
            if (by_bytes) {
                r->n_pin_skips++;
                continue;
            }
            r->n_pin_waits++;
            while (s->pins)
                pthread_cond_wait(&r->cv_pin, &r->mu);
        }
        /* a page the others hold too frees no RAM here (the last holder's
           trim frees it) */
        const uint64_t gives = rb_kvcache_slot_has_others(r->kv.cache, id) ? 0 : pb;
        if (r->p.restore == RB_RESTORE_RECOMPUTE) {
            drop_spilled(r, id);
            free_slot(r, id);
            s->tier = RB_TIER_DROPPED;
            freed += gives;
            taken += pb;
            continue;
        }
        if (r->picks[i].saved && !is_zram(r->p.ram_codec)) {
            /* already on storage, identical (the spill's kept copy, else
               the session file's): nothing to write */
            free_slot(r, id);
            s->tier = RB_TIER_STORED;
            s->from_saved = !s->spilled;
            s->spilled = 0;
            freed += gives;
            taken += pb;
            continue;
        }
        if (r->picks[i].to_store) {
            rb_error werr = {0};
            if (rb_store_put(r->store, id, slot(r, id), pb, &werr) == RB_OK) {
                free_slot(r, id);
                s->tier = RB_TIER_STORED;
                freed += gives;
                taken += pb;
                continue;
            }
            if (!s->disk_full) { /* kept in RAM: compressed instead; each page */
                s->disk_full = 1; /* counted once, however often it is trimmed */
                r->n_disk_full++;
            }
        }
        rb_error cerr = {0};
        uint64_t f = compress_page(r, id, &cerr);
        if (s->tier != RB_TIER_COMPRESSED) {
            st = rb_error_set(err, cerr.status ? cerr.status : RB_E_NOMEM, "%s",
                              cerr.message);
            break;
        }
        freed += f;
        taken += f;
    }
    /* 4. the weights, last layer first (the zram baseline compresses KV
       only, as the kernel's zRAM would) */
    if (st == RB_OK && r->wcache && scope == RB_TRIM_SCOPE_ALL &&
        (weights || (by_bytes && freed < bytes && !is_zram(r->p.ram_codec))))
        freed += rb_wcache_release_last(r->wcache, weights ? UINT64_MAX : bytes - freed);
    pthread_mutex_unlock(&r->mu);
    if (freed_out)
        *freed_out = freed;
    return st;
}

/* ---- restore ---------------------------------------------------------------- */

/* mu held */
static int pinned_from(const rb_residency *r, uint32_t first_page)
{
    for (uint32_t l = 0; r->n_pinned && l < r->kv.n_layers; l++)
        for (uint32_t pg = first_page; pg < r->kv.pages_per_layer; pg++)
            if (r->segs[l * r->kv.pages_per_layer + pg].pins)
                return 1;
    return 0;
}

static void forget_locked(rb_residency *r, uint32_t first_page)
{
    if (pinned_from(r, first_page)) {
        r->n_pin_waits++;
        while (pinned_from(r, first_page))
            pthread_cond_wait(&r->cv_pin, &r->mu);
    }
    r->epoch++; /* pins for the old contents fail from here on */
    for (uint32_t l = 0; l < r->kv.n_layers; l++)
        for (uint32_t pg = first_page; pg < r->kv.pages_per_layer; pg++) {
            uint32_t id = l * r->kv.pages_per_layer + pg;
            kv_seg *s = &r->segs[id];
            free_slot(r, id);
            free(s->frame);
            s->frame = NULL;
            s->frame_bytes = 0;
            if (in_store(s) && r->store)
                rb_store_drop(r->store, id);
            s->tier = RB_TIER_RESIDENT;
            s->failed = s->saved = s->from_saved = s->spilled = 0;
        }
    /* the page before: its positions from the forget on are written again,
       so no copy elsewhere is identical any more (the session file keeps
       that page's record for the positions before the cut: a restore may
       read it, a trim must write the page) */
    for (uint32_t l = 0; first_page > 0 && first_page <= r->kv.pages_per_layer &&
                         l < r->kv.n_layers; l++) {
        drop_spilled(r, l * r->kv.pages_per_layer + first_page - 1);
        r->segs[l * r->kv.pages_per_layer + first_page - 1].saved = 0;
    }
    if (r->n_pages > first_page)
        r->n_pages = first_page;
}

rb_status rb_residency_unshare_page(rb_residency *r, uint32_t page, rb_error *err)
{
    rb_status st = RB_OK;
    pthread_mutex_lock(&r->mu);
    for (uint32_t l = 0; l < r->kv.n_layers && st == RB_OK; l++) {
        const uint32_t id = l * r->kv.pages_per_layer + page;
        if (page >= r->kv.pages_per_layer || !rb_kvcache_slot_is_shared(r->kv.cache, id))
            continue;
        if (r->segs[id].pins) { /* the writer reads the old buffer: it stays until unpinned */
            r->n_pin_waits++;
            while (r->segs[id].pins)
                pthread_cond_wait(&r->cv_pin, &r->mu);
        }
        st = rb_kvcache_unshare_slot(r->kv.cache, id, err);
    }
    pthread_mutex_unlock(&r->mu);
    return st;
}

int rb_residency_release_page(rb_residency *r, uint32_t layer, uint32_t page, int in_feed)
{
    if (layer >= r->kv.n_layers || page >= r->kv.pages_per_layer)
        return 1;
    const uint32_t id = layer * r->kv.pages_per_layer + page;
    kv_seg *s = &r->segs[id];
    pthread_mutex_lock(&r->mu);
    if (in_feed && s->tier != RB_TIER_RESIDENT) {
        pthread_mutex_unlock(&r->mu);
        return 0;
    }
    if (s->pins) {
        r->n_pin_waits++;
        while (s->pins)
            pthread_cond_wait(&r->cv_pin, &r->mu);
    }
    free_slot(r, id);
    free(s->frame);
    s->frame = NULL;
    s->frame_bytes = 0;
    if (in_store(s) && r->store)
        rb_store_drop(r->store, id);
    s->tier = RB_TIER_RESIDENT;
    s->failed = s->saved = s->from_saved = s->spilled = 0;
    pthread_mutex_unlock(&r->mu);
    return 1;
}

void rb_residency_forget_from(rb_residency *r, uint32_t first_page)
{
    pthread_mutex_lock(&r->mu);
    forget_locked(r, first_page);
    pthread_mutex_unlock(&r->mu);
}

/*
 * The restore plan:
 *  1. The first DROPPED page (in any layer) fixes where recomputation
 *     starts; every page from there on is forgotten, in every layer (the
 *     recomputation rewrites them all).
 *  2. Each layer in order: its weights (if released) and its STORED pages
 *     go to the I/O worker's queue, its COMPRESSED pages to the decode
 *     worker's; pending[layer] counts them.
 *  3. Pipelined: wake the workers and return; the forward pass waits per
 *     layer. Eager: wait for everything before returning.
 */
uint32_t rb_residency_n_restoring(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    uint32_t n = r->n_io + r->n_dec;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static uint64_t ram_bytes(const rb_residency *r);

/* Steps 2 and 3 of the plan (mu held): the segments of pages below
 * `pages` that are not in RAM, layer by layer, while their bytes fit in
 * max_bytes (a prefetch's grant; UINT64_MAX for a feed: all of them). The
 * plan stops at the first segment that does not fit, so what it brings
 * back is a prefix in layer order (what the next feed needs first).
 * *planned: the RAM bytes the plan brings back (page buffers; released
 * weights). wait: an eager restore returns when all of it is in. */
static void plan_locked(rb_residency *r, uint32_t pages, uint64_t max_bytes, int wait,
                        uint64_t *planned)
{
    uint64_t bytes = 0;
    int full = 0;
    r->n_io = r->io_next = r->n_dec = r->dec_next = 0;
    r->io_busy_s = r->dec_busy_s = r->wait_s = 0;
    r->bytes_io = r->bytes_dec = 0;
    r->weights_failed = 0;
    r->t_begin = r->t_last_done = r->t_last_io_done = rb_throttle_now_s();
    r->n_ev = 0;
    r->cur_layer = -1;
    for (uint32_t l = 0; l < r->kv.n_layers; l++) {
        r->pending[l] = 0;
        r->layer_failed[l] = 0;
    }
    for (uint32_t l = 0; l < r->kv.n_layers && !full; l++) {
        if (r->wcache && !rb_wcache_is_resident(r->wcache, l)) {
            /* released by any session: the model's weights are shared */
            const uint64_t wb = rb_wcache_layer_bytes(r->wcache, l);
            if (wb > max_bytes - bytes) {
                full = 1;
                break;
            }
            bytes += wb;
            r->io_jobs[r->n_io++] = r->n_kv_segs + l;
            r->pending[l]++;
        }
        for (uint32_t pg = 0; pg < pages && !full; pg++) {
            uint32_t id = l * r->kv.pages_per_layer + pg;
            const uint8_t tier = r->segs[id].tier;
            if (tier != RB_TIER_STORED && tier != RB_TIER_COMPRESSED)
                continue;
            if (page_alloc_bytes(r) > max_bytes - bytes) {
                full = 1;
                break;
            }
            bytes += page_alloc_bytes(r);
            if (tier == RB_TIER_STORED)
                r->io_jobs[r->n_io++] = id;
            else
                r->dec_jobs[r->n_dec++] = id;
            r->pending[l]++;
        }
    }
    /* every KV page of the plan in one mapping (the workers fault them in) */
    uint32_t n_kv_jobs = r->n_dec;
    for (uint32_t i = 0; i < r->n_io; i++)
        n_kv_jobs += r->io_jobs[i] < r->n_kv_segs;
    r->batch_n = r->batch_next = 0;
    /* huge pages for what this process trimmed itself (kvcache.h says why) */
    int cold = 0;
    for (uint32_t i = 0; i < r->n_io && !cold; i++)
        cold = r->io_jobs[i] < r->n_kv_segs && r->segs[r->io_jobs[i]].from_saved;
    /* pages may map the source's copies when none is resident: the page
       cache's read-around then reads only pages this restore needs */
    r->plan_cold = cold;
    for (uint32_t i = 0; i < r->n_kv_segs && r->plan_cold; i++)
        if (i % r->kv.pages_per_layer < r->n_pages)
            r->plan_cold = r->segs[i].tier != RB_TIER_RESIDENT &&
                           r->segs[i].tier != RB_TIER_COMPRESSED;
    /* the spare buffers first (alloc_page), then the batch */
    const uint32_t n_spare = spare_count(r);
    n_kv_jobs = n_kv_jobs > n_spare ? n_kv_jobs - n_spare : 0;
    if (n_kv_jobs &&
        rb_kvpage_alloc_batch(page_alloc_bytes(r), n_kv_jobs, !cold, r->batch) == 0)
        r->batch_n = n_kv_jobs;
    r->last_plan_jobs = r->n_io + r->n_dec;
    r->plan_pages = r->n_pages;
    r->is_restore_open = 1;
    if (r->n_io + r->n_dec > 0)
        pthread_cond_broadcast(&r->cv_work);
    if (wait && r->p.restore == RB_RESTORE_EAGER)
        while (r->io_next < r->n_io || r->dec_next < r->n_dec || r->n_busy > 0)
            pthread_cond_wait(&r->cv_idle, &r->mu);
    *planned = bytes;
}

/* mu held: the first page DROPPED in any layer, or UINT32_MAX. */
static uint32_t first_dropped_locked(const rb_residency *r)
{
    uint32_t first = UINT32_MAX;
    for (uint32_t l = 0; l < r->kv.n_layers; l++)
        for (uint32_t pg = 0; pg < r->n_pages && pg < first; pg++)
            if (r->segs[l * r->kv.pages_per_layer + pg].tier == RB_TIER_DROPPED)
                first = pg;
    return first;
}

rb_status rb_residency_begin_restore(rb_residency *r, uint32_t *recompute_from, rb_error *err)
{
    return rb_residency_begin_restore_pages(r, UINT32_MAX, recompute_from, err);
}

rb_status rb_residency_begin_restore_pages(rb_residency *r, uint32_t pages,
                                           uint32_t *recompute_from, rb_error *err)
{
    (void)err;
    pthread_mutex_lock(&r->mu);
    if (pages > r->n_pages)
        pages = r->n_pages;
    uint32_t first_dropped = first_dropped_locked(r);
    if (first_dropped >= pages) /* beyond the pages asked: the next feed's */
        first_dropped = UINT32_MAX;
    if (first_dropped != UINT32_MAX)
        forget_locked(r, first_dropped);
    *recompute_from = first_dropped == UINT32_MAX ? UINT32_MAX
                                                  : first_dropped * r->kv.dims.n_tokens;
    uint64_t planned;
    r->is_prefetch = 0;
    plan_locked(r, first_dropped < pages ? first_dropped : pages, UINT64_MAX, 1, &planned);
    pthread_mutex_unlock(&r->mu);
    return RB_OK;
}

void rb_residency_open_spare(rb_residency *r, uint64_t bytes)
{
    const uint64_t pages = bytes / page_alloc_bytes(r);
    pthread_mutex_lock(&r->spare_mu);
    r->spare_cap = pages < r->n_kv_segs ? (uint32_t)pages : r->n_kv_segs;
    /* a prefetch's that its feed took over stay, up to the new need */
    while (r->n_spare > r->spare_cap)
        rb_kvpage_free(r->spare[--r->n_spare], page_alloc_bytes(r));
    pthread_mutex_unlock(&r->spare_mu);
}

void rb_residency_spare_counts(rb_residency *r, uint64_t *put, uint64_t *used)
{
    pthread_mutex_lock(&r->spare_mu);
    *put = r->n_spare_put;
    *used = r->n_spare_used;
    pthread_mutex_unlock(&r->spare_mu);
}

uint64_t rb_residency_restore_need(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t need = 0;
    const uint32_t pages = r->is_restore_open ? 0 : first_dropped_locked(r);
    for (uint32_t l = 0; l < r->kv.n_layers; l++)
        for (uint32_t pg = 0; pg < r->n_pages && pg < pages; pg++) {
            const uint8_t t = r->segs[l * r->kv.pages_per_layer + pg].tier;
            need += t == RB_TIER_STORED || t == RB_TIER_COMPRESSED ? page_alloc_bytes(r) : 0;
        }
    pthread_mutex_unlock(&r->mu);
    return need;
}

/*
 * A prefetch: the plan of a feed's restore begun while the session is
 * idle, cut to max_bytes, never blocking (an eager mode waits at the feed).
 * Unlike a feed's it forgets nothing: it plans only the pages below the
 * first DROPPED one (those a feed restores whatever it recomputes), so a
 * prefetch stopped anywhere leaves every page in a valid tier. The feed
 * does not join it: it stops what has not started (rb_residency_stop_
 * prefetch) and plans the rest as usual.
 */
void rb_residency_begin_prefetch(rb_residency *r, uint64_t max_bytes, uint64_t *planned,
                                 uint32_t *n_segs)
{
    *planned = 0;
    *n_segs = 0;
    const uint64_t base = ram_bytes(r);
    pthread_mutex_lock(&r->mu);
    if (r->is_restore_open) { /* one plan at a time */
        pthread_mutex_unlock(&r->mu);
        return;
    }
    uint32_t pages = first_dropped_locked(r);
    if (pages > r->n_pages)
        pages = r->n_pages;
    r->prefetch_ram_base = base;
    r->is_prefetch = 1;
    plan_locked(r, pages, max_bytes, 0, planned);
    *n_segs = r->n_io + r->n_dec;
    if (*n_segs == 0) { /* nothing fits or nothing to do: no plan left open */
        r->is_restore_open = 0;
        r->is_prefetch = 0;
        for (uint32_t i = 0; i < r->batch_n; i++)
            rb_kvpage_free(r->batch[i], page_alloc_bytes(r));
        r->batch_n = r->batch_next = 0;
        pthread_mutex_unlock(&r->mu);
        return;
    }
    r->n_prefetches++;
    pthread_mutex_unlock(&r->mu);
}

int rb_residency_wait_layer(rb_residency *r, uint32_t layer)
{
    pthread_mutex_lock(&r->mu);
    double t = rb_throttle_now_s();
    if (r->cur_layer >= 0) /* the previous layer's compute ends here */
        log_event(r, RB_EVENT_COMPUTE, (uint32_t)r->cur_layer, r->cur_start, t);
    if (r->pending[layer] > 0) {
        while (r->pending[layer] > 0)
            pthread_cond_wait(&r->cv_layer, &r->mu);
        double t1 = rb_throttle_now_s();
        r->wait_s += t1 - t;
        log_event(r, RB_EVENT_WAIT, layer, t, t1);
        t = t1;
    }
    int rc = (r->layer_failed[layer] || r->weights_failed) ? -1 : 0;
    r->cur_layer = rc == 0 ? (int)layer : -1;
    r->cur_start = t;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void rb_residency_compute_done(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    if (r->cur_layer >= 0)
        log_event(r, RB_EVENT_COMPUTE, (uint32_t)r->cur_layer, r->cur_start, rb_throttle_now_s());
    r->cur_layer = -1;
    pthread_mutex_unlock(&r->mu);
}

size_t rb_residency_events(const rb_residency *cr, rb_restore_event *out, size_t max)
{
    rb_residency *r = (rb_residency *)cr;
    pthread_mutex_lock(&r->mu);
    size_t n = r->n_ev;
    memcpy(out, r->ev, (n < max ? n : max) * sizeof *out);
    pthread_mutex_unlock(&r->mu);
    return n;
}

rb_status rb_residency_set_mode(rb_residency *r, rb_restore_mode restore,
                                rb_ram_codec ram_codec, rb_error *err)
{
    if ((unsigned)restore > RB_RESTORE_RECOMPUTE)
        return rb_error_set(err, RB_E_INVALID_ARG, "residency: unknown restore mode %d",
                            (int)restore);
    rb_status cst = check_codec(ram_codec, err);
    if (cst != RB_OK)
        return cst;
    pthread_mutex_lock(&r->mu);
    if (ram_codec != r->p.ram_codec && r->p.decode_bytes_per_s <= 0)
        r->D = 0; /* another codec decodes at another speed: measure again */
    if (ram_codec != r->p.ram_codec)
        r->frame_frac = 0; /* and shrinks by another ratio */
    r->p.restore = restore;
    r->p.ram_codec = ram_codec;
    pthread_mutex_unlock(&r->mu);
    return RB_OK;
}

/* keep_spare: a prefetch a feed takes over; its spare buffers go to the
 * feed's restore (rb_residency_open_spare keeps them). */
static rb_status end_restore(rb_residency *r, uint32_t *damaged_from, rb_error *err,
                             int keep_spare)
{
    pthread_mutex_lock(&r->mu);
    while (r->io_next < r->n_io || r->dec_next < r->n_dec || r->n_busy > 0)
        pthread_cond_wait(&r->cv_idle, &r->mu);
    uint32_t first = UINT32_MAX;
    for (uint32_t l = 0; l < r->kv.n_layers; l++)
        for (uint32_t pg = 0; pg < r->n_pages && pg < first; pg++)
            if (r->segs[l * r->kv.pages_per_layer + pg].failed)
                first = pg;
    *damaged_from = first == UINT32_MAX ? UINT32_MAX : first * r->kv.dims.n_tokens;
    rb_status st = RB_OK;
    if (r->weights_failed) {
        st = rb_error_set(err, r->worker_err.status ? r->worker_err.status : RB_E_IO, "%s",
                          r->worker_err.message);
        /* the layers that failed stay released; a later feed retries them */
    }
    /* what the decode path really delivered, contention with the forward
       pass included (on a machine whose cores the forward pass fills, the
       first estimate - one page decoded alone - is optimistic); the next
       trim splits by it. A caller-given D stays as given. */
    if (r->p.decode_bytes_per_s <= 0 && r->bytes_dec >= (4u << 20) && r->dec_busy_s > 0) {
        double seen = (double)r->bytes_dec / r->dec_busy_s;
        r->D = r->D > 0 ? 0.5 * r->D + 0.5 * seen : seen;
    }
    /* the same for storage: every read is queued at the start, so the
       span to the last one is the rate the device (and the CPU left to the
       workers) gave; a disk slower than the profile then splits by what it
       gives. A caller-given R stays as given. */
    if (!r->p.storage_bw_fixed && r->bytes_io >= (4u << 20) && r->t_last_io_done > r->t_begin) {
        double seen = (double)r->bytes_io / (r->t_last_io_done - r->t_begin);
        r->R_seen = r->R_seen > 0 ? 0.5 * r->R_seen + 0.5 * seen : seen;
    }
    const int decoded = r->n_dec > 0;
    r->is_restore_open = 0;
    r->n_io = r->io_next = r->n_dec = r->dec_next = 0;
    for (uint32_t i = r->batch_next; i < r->batch_n; i++) /* pages of failed reads */
        rb_kvpage_free(r->batch[i], page_alloc_bytes(r));
    r->batch_n = r->batch_next = 0;
    for (uint32_t i = 0; i < r->n_dead; i++)
        free(r->dead_frames[i]);
    r->n_dead = 0;
    pthread_mutex_unlock(&r->mu);
    if (!keep_spare)
        rb_residency_close_spare(r);
    /* the decoded pages' frames went back to the heap: give its free
       pages back to the OS, or the process keeps what the accounts freed */
    if (decoded)
        rb_os_trim_heap();
    return st;
}

rb_status rb_residency_end_restore(rb_residency *r, uint32_t *damaged_from, rb_error *err)
{
    return end_restore(r, damaged_from, err, 0);
}

void rb_residency_note_compute(rb_residency *r, size_t n_tokens, double seconds)
{
    pthread_mutex_lock(&r->mu);
    if (!r->last_plan_jobs && n_tokens > 0 && seconds > 0 && r->kv.n_layers) {
        double per_layer = seconds / r->kv.n_layers;
        if (n_tokens == 1)
            r->last_layer_compute_s = per_layer;
        else if (n_tokens <= 512)
            r->layer_compute_s = per_layer;
    }
    pthread_mutex_unlock(&r->mu);
}

void rb_residency_cancel_restore(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    for (uint32_t i = r->io_next; i < r->n_io; i++) {
        uint32_t id = r->io_jobs[i]; /* a layer's weights stay released */
        r->pending[seg_layer(r, id)]--;
    }
    for (uint32_t i = r->dec_next; i < r->n_dec; i++)
        r->pending[seg_layer(r, r->dec_jobs[i])]--;
    r->io_next = r->n_io;
    r->dec_next = r->n_dec;
    while (r->n_busy > 0)
        pthread_cond_wait(&r->cv_idle, &r->mu);
    pthread_mutex_unlock(&r->mu);
}

/* ---- the saved source (a session file) ------------------------------------------ */

void rb_residency_set_saved_source(rb_residency *r, rb_residency_read_fn read,
                                   rb_residency_release_fn release, void *ctx)
{
    pthread_mutex_lock(&r->mu);
    r->saved_read = read;
    r->saved_release = release;
    r->saved_ctx = ctx;
    if (!read)
        r->saved_read_run = NULL;
    pthread_mutex_unlock(&r->mu);
}

void rb_residency_set_saved_run_reader(rb_residency *r, rb_residency_read_run_fn read_run)
{
    pthread_mutex_lock(&r->mu);
    r->saved_read_run = read_run;
    pthread_mutex_unlock(&r->mu);
}

void rb_residency_mark_saved(rb_residency *r, uint32_t layer, uint32_t page, int saved,
                             uint64_t epoch, uint64_t writes)
{
    if (layer >= r->kv.n_layers || page >= r->kv.pages_per_layer)
        return;
    pthread_mutex_lock(&r->mu);
    kv_seg *s = &r->segs[layer * r->kv.pages_per_layer + page];
    if (!s->from_saved && epoch == r->epoch && (writes == RB_RESIDENCY_FULL || writes == r->writes))
        s->saved = (uint8_t)(saved != 0);
    pthread_mutex_unlock(&r->mu);
}

void rb_residency_will_write(rb_residency *r, uint32_t page)
{
    pthread_mutex_lock(&r->mu);
    r->writes++;
    for (uint32_t l = 0; page < r->kv.pages_per_layer && l < r->kv.n_layers; l++) {
        const uint32_t id = l * r->kv.pages_per_layer + page;
        /* a STORED one is still read from its source (from_saved), then
           written to: either way no copy stays identical */
        drop_spilled(r, id);
        r->segs[id].saved = 0;
    }
    pthread_mutex_unlock(&r->mu);
}

uint64_t rb_residency_writes(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t w = r->writes;
    pthread_mutex_unlock(&r->mu);
    return w;
}

uint64_t rb_residency_epoch(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    uint64_t e = r->epoch;
    pthread_mutex_unlock(&r->mu);
    return e;
}

const void *rb_residency_pin(rb_residency *r, uint32_t layer, uint32_t page, uint64_t epoch)
{
    if (layer >= r->kv.n_layers || page >= r->kv.pages_per_layer)
        return NULL;
    const uint32_t id = layer * r->kv.pages_per_layer + page;
    const void *buf = NULL;
    pthread_mutex_lock(&r->mu);
    kv_seg *s = &r->segs[id];
    if (epoch != r->epoch) {
        r->n_pin_stale++;
    } else if (s->tier == RB_TIER_RESIDENT && slot(r, id) && s->pins < 255) {
        s->pins++;
        r->n_pinned++;
        buf = slot(r, id);
    }
    pthread_mutex_unlock(&r->mu);
    return buf;
}

void rb_residency_pin_counts(rb_residency *r, uint64_t *waits, uint64_t *skips,
                             uint64_t *stale)
{
    pthread_mutex_lock(&r->mu);
    *waits = r->n_pin_waits;
    *skips = r->n_pin_skips;
    *stale = r->n_pin_stale;
    pthread_mutex_unlock(&r->mu);
}

void rb_residency_unpin(rb_residency *r, uint32_t layer, uint32_t page)
{
    pthread_mutex_lock(&r->mu);
    kv_seg *s = &r->segs[layer * r->kv.pages_per_layer + page];
    if (s->pins) {
        s->pins--;
        r->n_pinned--;
    }
    pthread_cond_broadcast(&r->cv_pin);
    pthread_mutex_unlock(&r->mu);
}

void rb_residency_adopt_saved(rb_residency *r, uint32_t layer, uint32_t page, int is_clean)
{
    if (layer >= r->kv.n_layers || page >= r->kv.pages_per_layer)
        return;
    pthread_mutex_lock(&r->mu);
    uint32_t id = layer * r->kv.pages_per_layer + page;
    kv_seg *s = &r->segs[id];
    free_slot(r, id);
    s->tier = RB_TIER_STORED;
    s->from_saved = 1;
    s->saved = (uint8_t)(is_clean != 0);
    if (page + 1 > r->n_pages)
        r->n_pages = page + 1;
    pthread_mutex_unlock(&r->mu);
}

/* ---- accounts ------------------------------------------------------------------ */

/* Its tables and buffers: the encode buffer, the segments, the job and
 * pick lists, and the event log (touched as a restore logs); the store's
 * RAM. */
static uint64_t tables_bytes(const rb_residency *r)
{
    uint64_t n = r->enc_cap + (size_t)r->n_kv_segs * sizeof(kv_seg) +
                 (size_t)MAX_EVENTS * sizeof *r->ev +
                 (size_t)(r->n_kv_segs + r->kv.n_layers) *
                     (2 * sizeof *r->io_jobs + sizeof *r->batch + sizeof *r->dead_frames) +
                 (size_t)r->n_kv_segs * (sizeof *r->picks + sizeof *r->pick_ids);
    return n + (r->store ? rb_store_ram_bytes(r->store) : 0);
}

void rb_residency_get_bytes(const rb_residency *cr, rb_residency_bytes *out)
{
    rb_residency *r = (rb_residency *)cr; /* the lock is not part of the value */
    uint64_t kv = 0, shared = 0;
    pthread_mutex_lock(&r->mu);
    for (uint32_t id = 0; id < r->n_kv_segs; id++) {
        /* only pages in use: the cache hands out the ones beyond without
           mu (rb_kvcache_reserve on the holder's thread), and the pool's
           leveling calls this from another */
        if (id % r->kv.pages_per_layer >= r->n_pages)
            continue;
        const kv_seg *s = &r->segs[id];
        if (s->tier == RB_TIER_RESIDENT && slot(r, id)) {
            if (!rb_kvcache_slot_is_shared(r->kv.cache, id)) /* the pool counts those */
                kv += page_alloc_bytes(r);
            else
                shared += page_alloc_bytes(r);
        } else if (s->tier == RB_TIER_COMPRESSED)
            kv += s->frame_bytes;
    }
    out->kv_ram_bytes = kv;
    out->kv_shared_bytes = shared;
    out->tables_bytes = tables_bytes(r);
    pthread_mutex_unlock(&r->mu);
}

void rb_residency_stats(const rb_residency *cr, rb_session_stats *out)
{
    rb_residency *r = (rb_residency *)cr; /* the lock is not part of the value */
    pthread_mutex_lock(&r->mu);
    memset(out->n_kv_pages, 0, sizeof out->n_kv_pages);
    out->kv_raw_bytes = out->kv_compressed_bytes = out->kv_compressed_raw_bytes = 0;
    out->kv_stored_bytes = out->kv_dropped_bytes = 0;
    for (uint32_t l = 0; l < r->kv.n_layers; l++)
        for (uint32_t pg = 0; pg < r->kv.pages_per_layer; pg++) {
            uint32_t id = l * r->kv.pages_per_layer + pg;
            const kv_seg *s = &r->segs[id];
            if (s->tier == RB_TIER_RESIDENT && !slot(r, id))
                continue;
            out->n_kv_pages[s->tier]++;
            switch (s->tier) {
            case RB_TIER_RESIDENT: out->kv_raw_bytes += page_alloc_bytes(r); break;
            case RB_TIER_COMPRESSED:
                out->kv_compressed_bytes += s->frame_bytes;
                out->kv_compressed_raw_bytes += r->kv.page_bytes;
                break;
            case RB_TIER_STORED: out->kv_stored_bytes += r->kv.page_bytes; break;
            default: out->kv_dropped_bytes += r->kv.page_bytes; break;
            }
        }
    out->n_layers_weights_evicted = 0;
    for (uint32_t l = 0; l < r->kv.n_layers; l++)
        out->n_layers_weights_evicted += r->wcache && !rb_wcache_is_resident(r->wcache, l);
    out->n_disk_full = r->n_disk_full;
    out->n_spill_damaged = r->n_damaged;
    out->decode_bytes_per_s = r->D;
    out->storage_bytes_per_s = storage_rate(r);
    out->restore_io_s = r->io_busy_s;
    out->restore_decode_s = r->dec_busy_s;
    out->restore_wait_s = r->wait_s;
    out->restore_total_s = r->t_last_done - r->t_begin;
    out->restore_bytes_io = r->bytes_io;
    out->restore_bytes_decoded = r->bytes_dec;
    out->n_prefetches = r->n_prefetches;
    out->prefetch_pages = r->prefetch_pages;
    out->prefetch_bytes = r->prefetch_bytes;
    out->n_prefetch_cancelled = r->n_prefetch_cancelled;
    out->prefetch_pending = r->is_restore_open && r->is_prefetch
                                ? (r->n_io - r->io_next) + (r->n_dec - r->dec_next) +
                                      (uint32_t)r->n_busy
                                : 0;
    out->other_bytes += tables_bytes(r);
    pthread_mutex_unlock(&r->mu);
}

/* ---- the holder and the pool ------------------------------------------------------ */

/*
 * The pool trims a member's residency itself (pool.c); the session only
 * says when the manager is in use. The rule, under hold_mu:
 *
 *   not held                  trim now, hold_mu held throughout: a session
 *                             that takes the manager meanwhile
 *                             (rb_residency_hold) waits for the trim. A
 *                             restore begun at open that no feed joined is
 *                             stopped first (cancel + end; what was not
 *                             read stays in its tier, the next feed plans
 *                             it again).
 *   held by this thread,      trim now (the holder's own call into the
 *   no pass, no restore open  pool: after a feed, or a set of sessions one
 *                             thread holds)
 *   otherwise                 record the request (the widest of those
 *                             posted) for the holder: its layer gate sees
 *                             rb_residency_trim_pending and stops before a
 *                             batch, and it serves the request
 *                             (rb_residency_serve_pool_trim) before it
 *                             lets go; rb_residency_let_go refuses while
 *                             one is pending.
 *
 * Lock order: the pool's mutex, then hold_mu, then mu. Nothing here calls
 * the pool or the session; a trim under hold_mu takes only mu and the
 * store, KV cache and codec below it.
 */

static int restore_is_open(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    int open = r->is_restore_open;
    pthread_mutex_unlock(&r->mu);
    return open;
}

int rb_residency_restore_is_open(rb_residency *r) { return restore_is_open(r); }

static uint64_t ram_bytes(const rb_residency *r)
{
    rb_residency_bytes b;
    rb_residency_get_bytes(r, &b);
    return b.kv_ram_bytes + b.tables_bytes;
}

/* A restore no feed joined (begun at open, or a prefetch) stops: what
 * has not started stays in its tier; counted as a cancelled prefetch
 * (count) when a prefetch still had segments to bring. Returns how much
 * the manager's RAM grew since the prefetch began (0 for another one).
 * The caller owns the manager (hold_mu, or the holder). */
static uint64_t stop_open_restore(rb_residency *r, int count)
{
    pthread_mutex_lock(&r->mu);
    const int open = r->is_restore_open, pre = r->is_prefetch;
    const uint32_t left = (r->n_io - r->io_next) + (r->n_dec - r->dec_next);
    const uint64_t base = r->prefetch_ram_base;
    pthread_mutex_unlock(&r->mu);
    if (!open)
        return 0;
    uint32_t damaged;
    rb_error ignored = {0};
    rb_residency_cancel_restore(r);
    (void)end_restore(r, &damaged, &ignored, pre && !count);
    pthread_mutex_lock(&r->mu);
    if (pre && left && count)
        r->n_prefetch_cancelled++;
    r->is_prefetch = 0;
    pthread_mutex_unlock(&r->mu);
    const uint64_t now = pre ? ram_bytes(r) : 0;
    return now > base ? now - base : 0;
}

int rb_residency_is_prefetching(rb_residency *r)
{
    pthread_mutex_lock(&r->mu);
    const int pre = r->is_restore_open && r->is_prefetch;
    pthread_mutex_unlock(&r->mu);
    return pre;
}

uint64_t rb_residency_settle_prefetch(rb_residency *r, int count)
{
    return rb_residency_is_prefetching(r) ? stop_open_restore(r, count) : 0;
}

int rb_residency_pool_stop_prefetch(rb_residency *r, uint64_t *growth)
{
    *growth = 0;
    pthread_mutex_lock(&r->hold_mu);
    if (r->is_held) { /* the holder's next step settles it */
        pthread_mutex_unlock(&r->hold_mu);
        return 0;
    }
    if (rb_residency_is_prefetching(r))
        *growth = stop_open_restore(r, 1);
    pthread_mutex_unlock(&r->hold_mu);
    return 1;
}

/* The pool's trim, by whoever owns the manager now (the pool under
 * hold_mu, or the holder). A failure is counted (the pool has no one to
 * tell; the session's stats show it). */
static void pool_trim_now(rb_residency *r, uint64_t bytes, rb_trim_level level,
                          rb_trim_scope scope, rb_residency *sink, uint64_t *freed,
                          uint64_t *ram_drop)
{
    stop_open_restore(r, 1); /* begun at open or a prefetch: no pass joined it */
    const uint64_t before = ram_bytes(r);
    rb_error e = {0};
    pthread_mutex_lock(&r->mu);
    r->sink = sink != r ? sink : NULL;
    pthread_mutex_unlock(&r->mu);
    const rb_status st = rb_residency_trim_kv(r, bytes, level, scope, freed, &e);
    pthread_mutex_lock(&r->mu);
    r->sink = NULL;
    if (st != RB_OK) {
        r->n_trim_failures++;
        r->trim_status = e.status;
        r->trim_fail_s = rb_throttle_now_s();
    }
    pthread_mutex_unlock(&r->mu);
    const uint64_t after = ram_bytes(r);
    *ram_drop = before > after ? before - after : 0;
}

void rb_residency_hold(rb_residency *r)
{
    pthread_mutex_lock(&r->hold_mu); /* waits for a pool trim in progress */
    r->is_held = 1;
    r->holder = pthread_self();
    pthread_mutex_unlock(&r->hold_mu);
}

int rb_residency_let_go(rb_residency *r)
{
    pthread_mutex_lock(&r->hold_mu);
    int ok = !r->req_pending;
    if (ok) {
        r->is_held = 0;
        r->is_in_pass = 0;
    }
    pthread_mutex_unlock(&r->hold_mu);
    return ok;
}

void rb_residency_set_in_pass(rb_residency *r, int in_pass)
{
    pthread_mutex_lock(&r->hold_mu);
    r->is_in_pass = in_pass;
    pthread_mutex_unlock(&r->hold_mu);
}

int rb_residency_trim_pending(const rb_residency *r)
{
    return atomic_load_explicit(&((rb_residency *)r)->trim_pending, memory_order_acquire);
}

int rb_residency_pool_trim(rb_residency *r, uint64_t bytes, rb_trim_level level,
                           rb_trim_scope scope, rb_residency *sink, uint64_t *freed,
                           uint64_t *ram_drop)
{
    *freed = *ram_drop = 0;
    pthread_mutex_lock(&r->hold_mu);
    if (r->is_held && (!pthread_equal(r->holder, pthread_self()) || r->is_in_pass ||
                       restore_is_open(r))) {
        if (!r->req_pending) {
            r->req_bytes = bytes;
            r->req_level = level;
            r->req_scope = scope;
        } else { /* the widest of them */
            r->req_bytes = bytes > r->req_bytes ? bytes : r->req_bytes;
            r->req_level = level > r->req_level ? level : r->req_level;
            r->req_scope = scope < r->req_scope ? scope : r->req_scope;
        }
        r->req_pending = 1;
        atomic_store_explicit(&r->trim_pending, 1, memory_order_release);
        pthread_mutex_unlock(&r->hold_mu);
        return 0;
    }
    pool_trim_now(r, bytes, level, scope, sink, freed, ram_drop);
    pthread_mutex_unlock(&r->hold_mu);
    return 1;
}

uint64_t rb_residency_serve_pool_trim(rb_residency *r)
{
    pthread_mutex_lock(&r->hold_mu);
    const int pending = r->req_pending;
    const uint64_t bytes = r->req_bytes;
    const rb_trim_level level = r->req_level;
    const rb_trim_scope scope = r->req_scope;
    r->req_pending = 0;
    atomic_store_explicit(&r->trim_pending, 0, memory_order_release);
    pthread_mutex_unlock(&r->hold_mu);
    uint64_t freed = 0, drop = 0;
    if (pending) /* the holder owns the manager: no lock across the trim */
        pool_trim_now(r, bytes, level, scope, NULL, &freed, &drop);
    return freed;
}

void rb_residency_trim_failures(rb_residency *r, uint64_t *n, rb_status *last, double *when_s)
{
    pthread_mutex_lock(&r->mu);
    *n = r->n_trim_failures;
    *last = r->trim_status;
    *when_s = r->trim_fail_s;
    pthread_mutex_unlock(&r->mu);
}
