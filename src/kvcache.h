/*
 * kvcache.h - the paged f16 KV cache.
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
 * contiguous rows of K and V.
 *
 * Pages are allocated on first write (rb_kvcache_reserve), so memory grows
 * with the context, not with n_ctx. 256-token pages: a page of
 * tinyllama-1.1b's layer is 256 x 4 x 64 x 2 x 2 B = 256 KiB, large enough
 * for efficient storage I/O and small enough that a trim frees only what it
 * must.
 */
#ifndef RB_KVCACHE_H
#define RB_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "quant.h"
#include "rebound.h"

#define RB_KV_PAGE_TOKENS 256

typedef struct rb_kvcache {
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim_k;
    uint32_t head_dim_v;
    uint32_t page_tokens;
    uint32_t n_ctx;          /* capacity in positions */
    uint32_t pages_per_layer;
    size_t page_bytes;
    rb_f16 **pages;          /* [n_layers][pages_per_layer]; NULL: not resident */
    uint64_t resident_bytes; /* sum over allocated pages */
} rb_kvcache;

rb_status rb_kvcache_init(rb_kvcache *kv, uint32_t n_layers, uint32_t n_kv_heads,
                          uint32_t head_dim_k, uint32_t head_dim_v, uint32_t n_ctx,
                          uint32_t page_tokens, rb_error *err);
void rb_kvcache_deinit(rb_kvcache *kv);

/* Allocates every page that positions [0, n_pos) of every layer touch. */
rb_status rb_kvcache_reserve(rb_kvcache *kv, uint32_t n_pos, rb_error *err);

/* Releases one page (its contents are lost); NULL-safe on absent pages. */
void rb_kvcache_release_page(rb_kvcache *kv, uint32_t layer, uint32_t page);

/* K / V row of (layer, kv head, position); the page must be resident. */
static inline rb_f16 *rb_kvcache_k(const rb_kvcache *kv, uint32_t layer, uint32_t head,
                                   uint32_t pos)
{
    rb_f16 *page = kv->pages[(size_t)layer * kv->pages_per_layer + pos / kv->page_tokens];
    return page + ((size_t)head * kv->page_tokens + pos % kv->page_tokens) * kv->head_dim_k;
}

static inline rb_f16 *rb_kvcache_v(const rb_kvcache *kv, uint32_t layer, uint32_t head,
                                   uint32_t pos)
{
    rb_f16 *page = kv->pages[(size_t)layer * kv->pages_per_layer + pos / kv->page_tokens];
    size_t k_elems = (size_t)kv->n_kv_heads * kv->page_tokens * kv->head_dim_k;
    return page + k_elems + ((size_t)head * kv->page_tokens + pos % kv->page_tokens) * kv->head_dim_v;
}

#endif
