/*
 * residency.h - the memory manager: which pieces of a session are in RAM,
 * which tier the others are in, and bringing them back in layer order
 * while the forward pass computes (DESIGN.md, the mzCache design).
 *
 * It knows segments, bytes, layers and tiers; it does not know attention
 * or matmul. A KV segment is one page of one layer (the page table comes
 * from the KV cache as a table of slots); a weight segment is one layer's
 * weights (their bytes live in the model's weight cache, shared by every
 * session of the model: a layer another session released is planned like
 * one this one released). Bytes of the tiers live
 * with their mechanism: compressed frames here (kvcodec), spilled pages in
 * the store, released weights in the model file (wcache).
 *
 * The forward pass asks rb_residency_wait_layer(L) before computing layer
 * L; nothing else of the engine calls in here except the session.
 */
#ifndef RB_RESIDENCY_H
#define RB_RESIDENCY_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "kvcodec.h"
#include "rebound.h"
#include "store.h"
#include "wcache.h"

/* KV page buffers: rb_kvpage_alloc / rb_kvpage_free (kvcache.h), page
 * aligned (RB_PAGE_ALIGN) so that a page can be written to and read from
 * storage with O_DIRECT straight from / into the buffer compute reads.
 * The KV cache owns the slots: residency empties and fills them through
 * rb_kvcache_free_slot / rb_kvcache_fill_slot, never by writing the table. */
#define RB_PAGE_ALIGN 4096

/* The KV cache as residency sees it: its slots and the codec's geometry. */
typedef struct rb_residency_kv {
    rb_kvcache *cache;         /* borrowed: its page table [n_layers][pages_per_layer] */
    uint32_t n_layers;
    uint32_t pages_per_layer;
    size_t page_bytes;
    rb_kvcodec_dims dims;      /* one page for the codec */
} rb_residency_kv;

typedef struct rb_residency_params {
    rb_restore_mode restore;
    rb_ram_codec ram_codec;    /* the compressed tier's codec */
    double decode_bytes_per_s; /* D; 0: measured on the first trim */
    double storage_bytes_per_s;/* R; > 0 (the caller resolves profile/measure) */
    double storage_latency_s;  /* per I/O, for the split */
    int storage_bw_fixed;      /* R was given by the caller: never lowered to
                                  what the storage path delivered */
    struct rb_throttle *throttle; /* the device weight reloads go through;
                                  NULL: the host as it is */
} rb_residency_params;

typedef struct rb_residency rb_residency;

/* store and wcache are borrowed and may be NULL (then that tier is not
 * used: no spill, weights never released). Starts the restore workers
 * (two for storage reads, one for decodes). Errors: RB_E_NOMEM, RB_E_IO
 * (threads). */
rb_status rb_residency_create(const rb_residency_params *p, const rb_residency_kv *kv,
                              rb_store *store, rb_wcache *wcache, rb_residency **out,
                              rb_error *err);
void rb_residency_destroy(rb_residency *r);

/* The context now uses pages [0, n_pages) of every layer (the session
 * calls this after reserving pages for a feed). */
void rb_residency_set_pages(rb_residency *r, uint32_t n_pages);

/*
 * Trim (the algorithm is in residency.c): frees at least `bytes` (level
 * RB_TRIM_BYTES) or what the level names. *freed receives the RAM bytes
 * freed. Must not overlap a restore: the holder calls it (or the pool,
 * through rb_residency_pool_trim below).
 */
rb_status rb_residency_trim(rb_residency *r, uint64_t bytes, rb_trim_level level,
                            uint64_t *freed, rb_error *err);
/* What a trim may take. */
typedef enum rb_trim_scope {
    RB_TRIM_SCOPE_ALL = 0,    /* KV, then the weights (the last layers') */
    RB_TRIM_SCOPE_KV = 1,     /* KV only: the weights stay (the memory pool
                                 takes them last, after every session's KV) */
    RB_TRIM_SCOPE_KV_TO_STORAGE = 2, /* KV only, every page to storage when
                                 there is a store, compressed ones included
                                 (the pool's budget: a stored page frees all
                                 of its RAM, a compressed one a fraction) */
    RB_TRIM_SCOPE_KV_OWN = 3  /* the same, but a page another session holds
                                 too (kvcache.h's shared pages) stays: its
                                 RAM stays with the others, and every holder
                                 that let it go would read it back (the
                                 pool's budget takes those last) */
} rb_trim_scope;
/* The same, within scope (rb_residency_trim is RB_TRIM_SCOPE_ALL). */
rb_status rb_residency_trim_kv(rb_residency *r, uint64_t bytes, rb_trim_level level,
                               rb_trim_scope scope, uint64_t *freed, rb_error *err);

/*
 * Before a feed: plans the restore of everything not resident and starts
 * the workers (pipelined), or restores it all before returning (eager).
 * *recompute_from receives the first position whose KV must be recomputed
 * (DROPPED pages), or UINT32_MAX; the session re-feeds the tokens from
 * there (after rb_residency_forget_from).
 */
rb_status rb_residency_begin_restore(rb_residency *r, uint32_t *recompute_from,
                                     rb_error *err);
/* The same for the first `pages` pages of every layer only (a fork's
 * prefix: rb_session_fork); a page beyond them stays in its tier, and a
 * dropped one there is left to the next feed's restore. */
rb_status rb_residency_begin_restore_pages(rb_residency *r, uint32_t pages,
                                           uint32_t *recompute_from, rb_error *err);

/*
 * Restoring ahead of time (a prefetch): the restore a feed would begin,
 * begun while the session is idle (its holder's thread plans it, holding
 * the manager; the workers go on after it lets go). Only pages below the
 * first DROPPED one, layer by layer, while their RAM fits in max_bytes;
 * nothing is forgotten and nothing waits (eager mode too). *planned: the
 * RAM bytes it brings back; *n_segs its segments (0: nothing to do or
 * nothing fits, and no plan is left open; also when a restore is open).
 * A feed does not join it: it settles it (rb_residency_settle_prefetch)
 * and plans what is still missing.
 */
void rb_residency_begin_prefetch(rb_residency *r, uint64_t max_bytes, uint64_t *planned,
                                 uint32_t *n_segs);
/* The RAM bytes a prefetch now would bring back (KV pages below the first
 * DROPPED one that are stored or compressed; 0 while a restore is open).
 * Any thread. */
uint64_t rb_residency_restore_need(rb_residency *r);
/*
 * The spare: page buffers for the next restore, taken from other members'
 * trims instead of unmapped there and mapped again here. A return's
 * restore then writes into pages that are already faulted in, and the
 * trims free nothing: on a phone-sized machine those page faults, the
 * zeroing and the unmaps' TLB shootdowns run on the cores the returning
 * pass computes on.
 *
 *   rb_residency_open_spare  before a feed's budget trim, or a prefetch's
 *                       grant (the holder's thread): the spare takes up to
 *                       `bytes` of pages, what the restore will bring back
 *                       (the caller's rb_residency_restore_need); what it
 *                       holds beyond that is freed.
 *   rb_residency_pool_trim(..., sink)  a trim done now puts each buffer it
 *                       frees there (not a shared page, not a mapped one).
 *   the restore          takes spare buffers before it maps any; a spare
 *                       buffer's bytes past page_bytes are zeroed (it held
 *                       another conversation's KV; the restore writes the
 *                       rest). rb_residency_end_restore frees what it left
 *                       and closes the spare, as rb_residency_close_spare
 *                       does when no restore began; but a prefetch that a
 *                       feed takes over (rb_residency_settle_prefetch with
 *                       count 0) leaves its spare to the feed's restore.
 *
 * The buffers in the spare are in nobody's count: the trim took them out
 * of the trimmed member's, and the feed's restore puts them in its own.
 * The spare never holds more than the feed restores, so the process holds
 * no more than when the trim unmapped them and the restore mapped as many.
 * spare_mu is a leaf lock (taken under the trimmed manager's mu).
 */
void rb_residency_open_spare(rb_residency *r, uint64_t bytes);
/* Closes the spare (no more puts) and frees what no restore took. */
void rb_residency_close_spare(rb_residency *r);
/* Buffers put into the spare, and taken by restores, so far. */
void rb_residency_spare_counts(rb_residency *r, uint64_t *put, uint64_t *used);
/* A prefetch is open (begun, not settled): its segments may still come. */
int rb_residency_is_prefetching(rb_residency *r);
/* The holder ends an open prefetch: what has not started stays in its
 * tier (count: a prefetch with segments left is counted as cancelled; a
 * feed that takes over passes 0). Returns how much the manager's RAM
 * (KV + tables) grew since it began. No-op (0) without one. */
uint64_t rb_residency_settle_prefetch(rb_residency *r, int count);
/* The pool's cancel (any thread, the pool's mutex held): ends an open
 * prefetch of a manager nobody holds (counted as cancelled when it had
 * segments left), *growth as above. 0 when held (the holder settles it
 * before anything else), else 1. */
int rb_residency_pool_stop_prefetch(rb_residency *r, uint64_t *growth);

/* The segments (KV pages from storage or compressed RAM, released layers'
 * weights) the last rb_residency_begin_restore planned to bring back: 0
 * when the feed restores nothing. Thread: the session's. */
uint32_t rb_residency_n_restoring(rb_residency *r);

/* Blocks until layer L's segments are resident. 0, or -1 when one of them
 * could not be restored (the session then recomputes from
 * rb_residency_end_restore's position). Thread: the forward pass's. */
int rb_residency_wait_layer(rb_residency *r, uint32_t layer);

/*
 * After the feed (or when the forward pass stopped): waits for the
 * workers. *damaged_from receives the first position of a page that
 * failed its restore (checksum, I/O), or UINT32_MAX. RB_E_IO when weights
 * could not be reloaded (nothing can be computed then).
 */
rb_status rb_residency_end_restore(rb_residency *r, uint32_t *damaged_from, rb_error *err);

/* A feed computed n_tokens in seconds (its forward pass, no recompute).
 * The trim's split predicts the next feed's compute per layer from it: a
 * turn (2..512 tokens) is what follows a return from the background; a
 * feed during which a restore ran is not counted (it waited). */
void rb_residency_note_compute(rb_residency *r, size_t n_tokens, double seconds);

/* Stops a pipelined restore short (a session opened from a file is being
 * trimmed, rewound or closed before its first feed came for the layers):
 * the jobs not started are dropped - their segments stay where they were
 * (STORED, COMPRESSED, a layer's weights released) - and the running ones
 * finish. rb_residency_end_restore must follow; the next restore plans
 * what is left. */
void rb_residency_cancel_restore(rb_residency *r);

/* Forgets pages >= first_page in every layer (frees buffers, frames and
 * spill copies); the session recomputes them. */
void rb_residency_forget_from(rb_residency *r, uint32_t first_page);

/* Releases one page of one layer for good (a sliding-window layer's page
 * that no later position attends to): its buffer, frame and spill copy go,
 * and it stays RESIDENT with an empty slot, so that no trim, restore,
 * spill or save ever touches it again (a forget_from below it is needed
 * before its positions are written again). Waits for a pin on it. Inside a
 * feed (a restore may be running) a page not RESIDENT is left as it is and
 * 0 returned: the caller releases it once the restore ended. 1: released
 * (or nothing there). */
int rb_residency_release_page(rb_residency *r, uint32_t layer, uint32_t page, int in_feed);

/* Changes the placement and restore policy for later trims and feeds
 * (between feeds only). RB_E_INVALID_ARG for an unknown mode or codec. */
rb_status rb_residency_set_mode(rb_residency *r, rb_restore_mode restore,
                                rb_ram_codec ram_codec, rb_error *err);

/* The forward pass finished the feed's last layer (closes the timeline's
 * last compute span). */
void rb_residency_compute_done(rb_residency *r);

/* Copies up to max timeline events of the last feed; returns the count. */
size_t rb_residency_events(const rb_residency *r, rb_restore_event *out, size_t max);

/*
 * A second home for KV pages besides the spill store: the session file.
 * read() fills a page buffer from it (checksum checked): 0, or -1 on
 * failure; with may_map (a cold restore: every page comes from the
 * source, none is resident) it may instead turn buf into a mapping of the
 * source's copy and return 1: the page is then freed with munmap as any
 * other and release() called after (the source drops its cached copy). A
 * page marked saved (a full page whose copy there is identical: positions
 * below the context's end never change) is trimmed to the STORED tier
 * without any write, and restored by read().
 */
typedef int (*rb_residency_read_fn)(void *ctx, uint32_t layer, uint32_t page, void *buf,
                                    int may_map, rb_error *err);
typedef void (*rb_residency_release_fn)(void *ctx, uint32_t layer, uint32_t page);
void rb_residency_set_saved_source(rb_residency *r, rb_residency_read_fn read,
                                   rb_residency_release_fn release, void *ctx);
/* Optional, beside read(): pages page0 .. page0 + n - 1 of a layer into
 * bufs with one request (their records side by side at the source): 0
 * when all n were read and checked; -1 when not (nothing read is
 * trusted: the worker reads them one by one with read(), whose error
 * names the page). An I/O worker takes up to 1 MiB of a layer's
 * consecutive saved pages at once when it is set: with small pages
 * (kv_page_tokens 32: 128 KiB) one request per page costs the pass more
 * than the bytes. */
typedef int (*rb_residency_read_run_fn)(void *ctx, uint32_t layer, uint32_t page0, uint32_t n,
                                        void *const *bufs, rb_error *err);
void rb_residency_set_saved_run_reader(rb_residency *r, rb_residency_read_run_fn read_run);
/* The page has (1) or no longer has (0) an identical copy at the source;
 * ignored when a forget happened since epoch (rb_residency_epoch): the
 * page's contents are being recomputed. A partly filled page (the last
 * one) changes again when the session appends to it: for one, writes is
 * rb_residency_writes when the copy's state was taken, and the mark is
 * ignored when the session wrote since; RB_RESIDENCY_FULL for a full page.
 * A marked last page lets a trim drop it without a write, as a full one. */
#define RB_RESIDENCY_FULL UINT64_MAX
void rb_residency_mark_saved(rb_residency *r, uint32_t layer, uint32_t page, int saved,
                             uint64_t epoch, uint64_t writes);
/* The session is about to write positions from page `page` on (a feed,
 * by the thread that holds it): that page, when partly filled, is no
 * longer identical to a saved copy of it. rb_residency_writes: how many
 * such calls so far. */
void rb_residency_will_write(rb_residency *r, uint32_t page);
uint64_t rb_residency_writes(rb_residency *r);

/*
 * For the session file's storage worker, which writes pages while the
 * session goes on (any thread). rb_residency_epoch: the count of forgets
 * so far. rb_residency_pin: the buffer of a RESIDENT page, unchanged until
 * rb_residency_unpin (a trim by bytes skips the page, a trim by level and
 * a forget wait for the unpin: one page write); NULL when the page is not
 * resident or a forget happened since epoch.
 */
uint64_t rb_residency_epoch(rb_residency *r);
const void *rb_residency_pin(rb_residency *r, uint32_t layer, uint32_t page, uint64_t epoch);
void rb_residency_unpin(rb_residency *r, uint32_t layer, uint32_t page);
/* How often a trim or forget waited for a pin, a trim by bytes skipped a
 * pinned page, and a pin failed for a passed epoch (tests). */
void rb_residency_pin_counts(rb_residency *r, uint64_t *waits, uint64_t *skips,
                             uint64_t *stale);
/* A page not in RAM whose data is at the source (a session opened from a
 * file): STORED there; is_clean as for mark_saved. */
void rb_residency_adopt_saved(rb_residency *r, uint32_t layer, uint32_t page, int is_clean);

/*
 * The holder and the pool. A session's operations (feed, rewind, trim,
 * save...) hold the manager; the memory pool (pool.c) trims a member's
 * manager from any thread, directly, without the session:
 *
 *   rb_residency_hold      the holder's operation begins (its thread is
 *                          recorded); waits while a pool trim of the idle
 *                          manager runs.
 *   rb_residency_let_go    the operation ends: 1; 0 (still held) when a
 *                          pool trim is pending: the holder serves it
 *                          (rb_residency_serve_pool_trim), publishes its
 *                          bytes, and calls again.
 *   rb_residency_set_in_pass  the holder's forward pass runs (1) / ended (0).
 *   rb_residency_pool_trim    the pool's trim (scope KV or KV to storage):
 *                          done now when nobody holds the manager (a
 *                          restore begun at open is stopped first), or
 *                          when this thread holds it outside a pass and
 *                          a restore; else recorded (merged with one
 *                          pending: the most bytes, the deepest level,
 *                          the widest scope) and 0 returned. *freed: the
 *                          trim's bytes; *ram_drop: how much the manager's
 *                          own count (rb_residency_get_bytes: KV in RAM +
 *                          tables) went down, for the pool's accounts.
 *                          A failure is counted (rb_residency_trim_failures).
 *                          sink (NULL: none): the member whose feed the
 *                          trim makes room for; the page buffers a trim
 *                          done now frees go to its spare while it takes
 *                          them (rb_residency_open_spare).
 *   rb_residency_trim_pending  a recorded trim waits (an atomic read: the
 *                          layer gate polls it).
 *   rb_residency_serve_pool_trim  the holder serves it (not inside a pass
 *                          or a restore); returns the bytes freed.
 *
 * Threads: hold, let_go, set_in_pass and serve belong to the holder's
 * thread; pool_trim and trim_pending any thread. Lock order: the pool's
 * mutex, then the manager's; nothing here calls up.
 */
void rb_residency_hold(rb_residency *r);
int rb_residency_let_go(rb_residency *r);
void rb_residency_set_in_pass(rb_residency *r, int in_pass);
int rb_residency_pool_trim(rb_residency *r, uint64_t bytes, rb_trim_level level,
                           rb_trim_scope scope, rb_residency *sink, uint64_t *freed,
                           uint64_t *ram_drop);
int rb_residency_trim_pending(const rb_residency *r);
uint64_t rb_residency_serve_pool_trim(rb_residency *r);
/* The pool's trims that failed: their count, the last one's status and
 * when (rb_throttle_now_s; 0: none). */
void rb_residency_trim_failures(rb_residency *r, uint64_t *n, rb_status *last, double *when_s);
/* A restore begun (rb_residency_begin_restore) has not ended: a feed may
 * join it. 0 after a pool trim stopped one begun at open. */
int rb_residency_restore_is_open(rb_residency *r);

/* Every layer's slot of page `page` that is shared (kvcache.h) becomes
 * the session's own before its positions are written again (a rewind
 * into the page): a copy, or the page itself for its last holder. Waits
 * for a pin of the session file's writer on it first. A private or empty
 * slot is left as it is. RB_E_NOMEM (the layers done so far are private,
 * the rest still shared). */
rb_status rb_residency_unshare_page(rb_residency *r, uint32_t page, rb_error *err);

/* The RAM the manager holds, as numbers of its own (the memory pool's
 * accounts): KV pages in RAM (resident buffers but the shared ones, which
 * the pool counts once; compressed frames) and its
 * tables and buffers (with the store's RAM). Any thread: it reads the
 * pages in use (below rb_residency_set_pages' count) under the manager's
 * mutex, never the ones the KV cache is handing out beyond them. */
typedef struct rb_residency_bytes {
    uint64_t kv_ram_bytes;
    uint64_t tables_bytes;
    uint64_t kv_shared_bytes; /* the resident pages it shares (kvcache.h):
                                 the pool's account counts them, not
                                 kv_ram_bytes */
} rb_residency_bytes;
void rb_residency_get_bytes(const rb_residency *r, rb_residency_bytes *out);

/* Fills the KV, weight and restore fields of a session's stats. */
void rb_residency_stats(const rb_residency *r, rb_session_stats *out);

#endif
