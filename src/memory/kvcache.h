/*
 * kvcache.h - the paged KV cache (f16, or llama.cpp's q8_0 / q4_0 blocks).
 *
 * Per layer, the context is cut into pages of page_tokens positions; each
 * page is one separately allocated block that the memory manager can
 * release and restore without touching any other page. The forward pass
 * reaches K and V only through the page table (rb_kvcache_k / _v).
 *
 * Page layout (f16, n_kv = KV heads, P = page_tokens):
 *
 *   +---------------------------+---------------------------+
 *   | K [n_kv][P][head_dim_k]    | V [n_kv][P][head_dim_v]    |
 *   +---------------------------+---------------------------+
 *
 * Head-major inside a page, so that attention for one head scans
 * contiguous rows of K and V. With a quantized type a row is the head's
 * head_dim values in blocks of 32 (llama.cpp's block_q8_0 / block_q4_0,
 * as its quantized cache stores them): row_k / row_v bytes instead of
 * head_dim x 2.
 *
 * Pages are allocated on first write (rb_kvcache_reserve), so memory grows
 * with the context, not with n_ctx. 256-token pages: a page of
 * tinyllama-1.1b's layer is 256 x 4 x 64 x 2 x 2 B = 256 KiB, large enough
 * for efficient storage I/O and small enough that a trim frees only what it
 * must.
 */
#ifndef RB_KVCACHE_H
#define RB_KVCACHE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "rebound.h"

#define RB_KV_PAGE_TOKENS 256
/* Page buffers are 4 KiB aligned and sized in whole 4 KiB blocks, so that
 * a page goes to and from storage with O_DIRECT straight from and into the
 * buffer the forward pass reads (the residency manager's RB_PAGE_ALIGN). */
#define RB_KV_PAGE_ALIGN 4096

/*
 * Shared pages (rb_session_fork). A page buffer may be held by the slots of
 * several caches of one pool: a fork's first pages are its source's
 * buffers. The rule that makes that safe without a lock:
 *   - a shared page is immutable: it is a full page (all page_tokens
 *     positions written) below every holder's valid K/V, and a holder
 *     writes only from its valid end on; a rewind into a shared page
 *     unshares it first (rb_kvcache_unshare_slot: a copy, or the page
 *     itself when this cache is its last holder);
 *   - its holders count is atomic (rb_kvpage_ref.n); a holder lets go by
 *     emptying its slot (rb_kvcache_free_slot: residency trims, truncate,
 *     a sliding window, deinit), and the one that takes the count to 0
 *     frees the buffer. A count goes up only from a holder (the fork holds
 *     its source), so a count of 1 seen by its holder stays 1;
 *   - the account (rb_kvshare) counts each shared page once for the pool;
 *     the caches that hold a page do not count it (rb_kvcache_slot_is_shared).
 * The slots and refs[] of one cache are its owner's (the session's, with
 * the residency manager's rules for its slots), as the page table is.
 */
typedef struct rb_kvshare {
    _Atomic uint64_t bytes;   /* alloc bytes of the shared pages alive */
    _Atomic uint64_t n_pages;
    _Atomic uint32_t refs;    /* its pool and each cache that shared a page */
} rb_kvshare;

/* One per shared page: its holders (caches whose slot holds the buffer). */
typedef struct rb_kvpage_ref {
    _Atomic uint32_t n;
} rb_kvpage_ref;

/* A new account (refs 1) or NULL; released by each holder, freed by the last. */
rb_kvshare *rb_kvshare_create(void);
void rb_kvshare_release(rb_kvshare *a);

typedef struct rb_kvcache {
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim_k;
    uint32_t head_dim_v;
    uint32_t page_tokens;
    uint32_t type_k, type_v; /* RB_TYPE_F16, RB_TYPE_Q8_0 or RB_TYPE_Q4_0 */
    size_t row_k, row_v;     /* bytes of one head's K / V row */
    uint32_t n_ctx;          /* capacity in positions */
    uint32_t pages_per_layer;
    size_t page_bytes;
    rb_f16 **pages;          /* [n_layers][pages_per_layer]; NULL: not resident */
    uint32_t n_pages_reserved; /* pages [0, n) of every layer were handed out */
    rb_kvpage_ref **refs;    /* like pages; NULL entry: the page is this cache's
                                alone; the array is made at the first share */
    rb_kvshare *share;       /* the account of the shared pages (a ref held), or NULL */
} rb_kvcache;

static inline size_t rb_kvcache_page_alloc_bytes(const rb_kvcache *kv)
{
    return (kv->page_bytes + RB_KV_PAGE_ALIGN - 1) / RB_KV_PAGE_ALIGN * RB_KV_PAGE_ALIGN;
}

/*
 * Page buffers are anonymous mappings of their own (mmap / munmap), not
 * malloc blocks: a freed page goes back to the OS at once (a trim must
 * really lower RSS), and a restore maps all its pages in one call and
 * faults each in with one call instead of one trap per 4 KiB (with the
 * frame frees moved past the forward pass: q8 restores of 117 MB went from
 * 0.4-0.7 GB/s to 7 GB/s of decode on one core).
 * n: rb_kvcache_page_alloc_bytes. NULL on failure.
 */
void *rb_kvpage_alloc(size_t n);
/* n_pages pages of n bytes each, one mapping (one syscall); out[i] each
 * freed on its own with rb_kvpage_free. 0 or -1. huge: the mapping is
 * 2 MiB-aligned and asks for transparent huge pages. Why and when: a
 * process that just gave memory back gets it again as huge pages in 1/4
 * of the time (this VM, 448 MiB: faulted in 0.20-0.25 -> 0.06 s, unmapped
 * page by page 0.04 -> 0.01 s), but a fresh process pays the kernel's
 * compaction for them (1.4 GB: 0.7-1.0 -> 1.3-2.5 s): restores of what
 * this process trimmed ask, a cold restore does not. On the switch at 8192
 * tokens, 50% trimmed, 4 alternating pairs: median TTFT storage 1406 ->
 * 1086 ms, lossless 2149 -> 1487, q8 1106 -> 1053 (restore I/O busy
 * 0.45-0.64 -> 0.24-0.39 s). */
int rb_kvpage_alloc_batch(size_t n, size_t n_pages, int huge, void **out);
/* Faults a page's memory in with one call (MADV_POPULATE_WRITE), so that
 * the decode or the read that fills it does not trap every 4 KiB. */
void rb_kvpage_populate(void *page, size_t n);
void rb_kvpage_free(void *page, size_t n);

rb_status rb_kvcache_init(rb_kvcache *kv, uint32_t n_layers, uint32_t n_kv_heads,
                          uint32_t head_dim_k, uint32_t head_dim_v, uint32_t n_ctx,
                          uint32_t page_tokens, rb_error *err);
/* The same with K and V types (RB_TYPE_F16, RB_TYPE_Q8_0, RB_TYPE_Q4_0;
 * a quantized head dim must be a multiple of 32). RB_E_INVALID_ARG. */
rb_status rb_kvcache_init_typed(rb_kvcache *kv, uint32_t n_layers, uint32_t n_kv_heads,
                                uint32_t head_dim_k, uint32_t head_dim_v, uint32_t n_ctx,
                                uint32_t page_tokens, uint32_t type_k, uint32_t type_v,
                                rb_error *err);
void rb_kvcache_deinit(rb_kvcache *kv);

/* Allocates the pages that positions [0, n_pos) touch and that were never
 * allocated (pages beyond n_pages_reserved). Evicted pages below it are
 * left empty: the residency manager restores them. */
rb_status rb_kvcache_reserve(rb_kvcache *kv, uint32_t n_pos, rb_error *err);

/* Frees pages >= first_page of every layer (their contents are lost, to be
 * recomputed) and lowers n_pages_reserved to first_page. */
void rb_kvcache_truncate(rb_kvcache *kv, uint32_t first_page);

/* Frees one page of one layer (its contents are lost) and empties its
 * slot; no-op on an empty slot. n_pages_reserved stays. A shared page is
 * let go (freed by its last holder). */
void rb_kvcache_free_page(rb_kvcache *kv, uint32_t layer, uint32_t page);
/* The same by slot id (layer * pages_per_layer + page), and its inverse:
 * an empty slot takes a page buffer (rb_kvpage_alloc / _alloc_batch) that
 * the cache frees from then on. The residency manager moves pages between
 * tiers through these two: the cache is the one owner of the slots. */
void rb_kvcache_free_slot(rb_kvcache *kv, size_t id);
void rb_kvcache_fill_slot(rb_kvcache *kv, size_t id, void *page);
/* The slot's buffer handed to the caller, who frees it (rb_kvpage_free)
 * or fills another slot with it; the slot is empty after. NULL, with the
 * slot as it was, when it is empty or shared (a shared page has other
 * holders: rb_kvcache_free_slot lets go of it). */
void *rb_kvcache_take_slot(rb_kvcache *kv, size_t id);

/* Shared pages (the rule above). Whether a slot's page is shared (its
 * holders counted in an account, not in this cache). */
static inline int rb_kvcache_slot_is_shared(const rb_kvcache *kv, size_t id)
{
    return kv->refs && kv->refs[id];
}
/* Whether another cache holds the slot's page too (a shared page with
 * more than one holder): letting it go frees no RAM. A count seen above 1
 * may fall to 1 at any time (the others let go), never rise from 1. */
static inline int rb_kvcache_slot_has_others(const rb_kvcache *kv, size_t id)
{
    return rb_kvcache_slot_is_shared(kv, id) &&
           atomic_load_explicit(&kv->refs[id]->n, memory_order_relaxed) > 1;
}
/* dst's empty slot id takes src's page (resident, full, never written again
 * by src below its valid end) as a shared page, counted in acct (both
 * caches must use the same account). Geometry must be equal
 * (rb_kvcache_same_layout). RB_E_NOMEM, RB_E_INVALID_ARG (another account). */
rb_status rb_kvcache_share_slot(rb_kvcache *dst, rb_kvcache *src, size_t id, rb_kvshare *acct,
                                rb_error *err);
/* dst's empty slot id takes a private copy of src's resident page. RB_E_NOMEM. */
rb_status rb_kvcache_copy_slot(rb_kvcache *dst, const rb_kvcache *src, size_t id,
                               rb_error *err);
/* The slot's page becomes this cache's own, to be written: the page
 * itself when this cache is its last holder (moved out of the account),
 * else a copy (the other holders keep theirs). No-op on a private or empty
 * slot. RB_E_NOMEM (the slot unchanged). */
rb_status rb_kvcache_unshare_slot(rb_kvcache *kv, size_t id, rb_error *err);
/* 1 when the two caches have the same geometry and types (a page of one
 * is a page of the other). */
int rb_kvcache_same_layout(const rb_kvcache *a, const rb_kvcache *b);

/* K / V row of (layer, kv head, position) in the cache's type; the page
 * must be resident. */
static inline void *rb_kvcache_k_row(const rb_kvcache *kv, uint32_t layer, uint32_t head,
                                     uint32_t pos)
{
    uint8_t *page = (uint8_t *)kv->pages[(size_t)layer * kv->pages_per_layer +
                                         pos / kv->page_tokens];
    return page + ((size_t)head * kv->page_tokens + pos % kv->page_tokens) * kv->row_k;
}

static inline void *rb_kvcache_v_row(const rb_kvcache *kv, uint32_t layer, uint32_t head,
                                     uint32_t pos)
{
    uint8_t *page = (uint8_t *)kv->pages[(size_t)layer * kv->pages_per_layer +
                                         pos / kv->page_tokens];
    size_t k_bytes = (size_t)kv->n_kv_heads * kv->page_tokens * kv->row_k;
    return page + k_bytes + ((size_t)head * kv->page_tokens + pos % kv->page_tokens) * kv->row_v;
}

/* The same as f16 rows (an f16 cache only). */
static inline rb_f16 *rb_kvcache_k(const rb_kvcache *kv, uint32_t layer, uint32_t head,
                                   uint32_t pos)
{
    return (rb_f16 *)rb_kvcache_k_row(kv, layer, head, pos);
}

static inline rb_f16 *rb_kvcache_v(const rb_kvcache *kv, uint32_t layer, uint32_t head,
                                   uint32_t pos)
{
    return (rb_f16 *)rb_kvcache_v_row(kv, layer, head, pos);
}

#endif
