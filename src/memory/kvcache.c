/*
 * kvcache.c - page table of the f16 KV cache (layout in kvcache.h).
 *
 * Memory: the page-pointer table (n_layers x pages_per_layer pointers,
 * allocated at init) and one block per resident page, allocated on first
 * use with rb_kvpage_alloc and freed with rb_kvpage_free (a mapping per
 * page, see kvcache.h): the residency manager frees and refills slots with
 * the same allocator. Does
 * not decide what to evict: the residency manager does.
 *
 * Shared pages (kvcache.h has the rule): refs[] (malloc'd at the first
 * share, one pointer per slot), one malloc'd rb_kvpage_ref per shared
 * page (freed with the page by its last holder), and the pool's account
 * (rb_kvshare, malloc'd, freed by its last holder). Every count is atomic;
 * a slot and its refs[] entry change only in the owner's calls.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>

#include "kvcache.h"
#include "status.h"

rb_kvshare *rb_kvshare_create(void)
{
    rb_kvshare *a = calloc(1, sizeof *a);
    if (a)
        atomic_init(&a->refs, 1);
    return a;
}

void rb_kvshare_release(rb_kvshare *a)
{
    if (a && atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) == 1)
        free(a);
}

void *rb_kvpage_alloc(size_t n)
{
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int rb_kvpage_alloc_batch(size_t n, size_t n_pages, int huge, void **out)
{
    if (n_pages == 0)
        return 0;
    const size_t len = n * n_pages, align = huge ? (size_t)2 << 20 : 0;
    uint8_t *raw = mmap(NULL, len + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (raw == MAP_FAILED)
        return -1;
    uint8_t *p = raw;
#ifdef MADV_HUGEPAGE
    if (huge) { /* 2 MiB-aligned, the slack on either side unmapped */
        p = (uint8_t *)(((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1));
        if (p > raw)
            munmap(raw, (size_t)(p - raw));
        munmap(p + len, (size_t)(raw + align - p));
        madvise(p, len, MADV_HUGEPAGE);
    }
#endif
    for (size_t i = 0; i < n_pages; i++)
        out[i] = p + i * n; /* munmap of a part of a mapping is allowed */
    return 0;
}

void rb_kvpage_populate(void *page, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    madvise(page, n, MADV_POPULATE_WRITE); /* Linux 5.14; else faults on touch */
#else
    (void)page;
    (void)n;
#endif
}

void rb_kvpage_free(void *page, size_t n)
{
    if (page)
        munmap(page, n);
}

rb_status rb_kvcache_init(rb_kvcache *kv, uint32_t n_layers, uint32_t n_kv_heads,
                          uint32_t head_dim_k, uint32_t head_dim_v, uint32_t n_ctx,
                          uint32_t page_tokens, rb_error *err)
{
    return rb_kvcache_init_typed(kv, n_layers, n_kv_heads, head_dim_k, head_dim_v, n_ctx,
                                 page_tokens, RB_TYPE_F16, RB_TYPE_F16, err);
}

rb_status rb_kvcache_init_typed(rb_kvcache *kv, uint32_t n_layers, uint32_t n_kv_heads,
                                uint32_t head_dim_k, uint32_t head_dim_v, uint32_t n_ctx,
                                uint32_t page_tokens, uint32_t type_k, uint32_t type_v,
                                rb_error *err)
{
    memset(kv, 0, sizeof *kv);
    if (n_layers == 0 || n_kv_heads == 0 || head_dim_k == 0 || head_dim_v == 0 ||
        n_ctx == 0 || page_tokens == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcache: zero-sized dimension");
    const uint32_t types[2] = {type_k, type_v}, dims[2] = {head_dim_k, head_dim_v};
    for (int i = 0; i < 2; i++) {
        if (types[i] != RB_TYPE_F16 && types[i] != RB_TYPE_Q8_0 && types[i] != RB_TYPE_Q4_0)
            return rb_error_set(err, RB_E_INVALID_ARG, "kvcache: %s type %s is not one of "
                                "f16, q8_0, q4_0", i ? "V" : "K", rb_type_name(types[i]));
        if (rb_type_row_bytes(types[i], dims[i]) == 0)
            return rb_error_set(err, RB_E_UNSUPPORTED, "kvcache: a %s cache of type %s needs "
                                "a head dim that is a multiple of 32; it is %" PRIu32,
                                i ? "V" : "K", rb_type_name(types[i]), dims[i]);
    }
    kv->type_k = type_k;
    kv->type_v = type_v;
    kv->row_k = rb_type_row_bytes(type_k, head_dim_k);
    kv->row_v = rb_type_row_bytes(type_v, head_dim_v);
    kv->n_layers = n_layers;
    kv->n_kv_heads = n_kv_heads;
    kv->head_dim_k = head_dim_k;
    kv->head_dim_v = head_dim_v;
    kv->page_tokens = page_tokens;
    kv->n_ctx = n_ctx;
    kv->pages_per_layer = (n_ctx + page_tokens - 1) / page_tokens;
    kv->page_bytes = (size_t)n_kv_heads * page_tokens * (kv->row_k + kv->row_v);
    kv->pages = calloc((size_t)n_layers * kv->pages_per_layer, sizeof *kv->pages);
    if (!kv->pages)
        return rb_error_set(err, RB_E_NOMEM, "kvcache: out of memory for the page table");
    return RB_OK;
}

void rb_kvcache_deinit(rb_kvcache *kv)
{
    if (!kv->pages)
        return;
    for (size_t i = 0; i < (size_t)kv->n_layers * kv->pages_per_layer; i++)
        rb_kvcache_free_slot(kv, i);
    free(kv->pages);
    free(kv->refs);
    rb_kvshare_release(kv->share);
    memset(kv, 0, sizeof *kv);
}

rb_status rb_kvcache_reserve(rb_kvcache *kv, uint32_t n_pos, rb_error *err)
{
    if (n_pos > kv->n_ctx)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "kvcache: %" PRIu32 " positions exceed the context of %" PRIu32,
                            n_pos, kv->n_ctx);
    uint32_t n_pages = (n_pos + kv->page_tokens - 1) / kv->page_tokens;
    /* only pages never handed out: a page below n_pages_reserved with an
       empty slot is evicted, and the residency manager brings it back */
    for (uint32_t p = kv->n_pages_reserved; p < n_pages; p++)
        for (uint32_t l = 0; l < kv->n_layers; l++) {
            rb_f16 **slot = &kv->pages[(size_t)l * kv->pages_per_layer + p];
            if (*slot)
                continue;
            *slot = rb_kvpage_alloc(rb_kvcache_page_alloc_bytes(kv));
            if (!*slot)
                return rb_error_set(err, RB_E_NOMEM,
                                    "kvcache: out of memory for page %" PRIu32 " of layer %" PRIu32
                                    " (%zu bytes)", p, l, kv->page_bytes);
        }
    if (n_pages > kv->n_pages_reserved)
        kv->n_pages_reserved = n_pages;
    return RB_OK;
}

/* Lets a shared slot's page go: the last holder (the count taken to 0,
 * acq_rel: every holder's reads happen before the free) frees the buffer
 * and its ref and takes it out of the account. */
static void drop_shared(rb_kvcache *kv, size_t id)
{
    rb_kvpage_ref *ref = kv->refs[id];
    kv->refs[id] = NULL;
    if (atomic_fetch_sub_explicit(&ref->n, 1, memory_order_acq_rel) != 1)
        return;
    const size_t n = rb_kvcache_page_alloc_bytes(kv);
    rb_kvpage_free(kv->pages[id], n);
    free(ref);
    atomic_fetch_sub_explicit(&kv->share->bytes, n, memory_order_relaxed);
    atomic_fetch_sub_explicit(&kv->share->n_pages, 1, memory_order_relaxed);
}

void rb_kvcache_free_slot(rb_kvcache *kv, size_t id)
{
    if (rb_kvcache_slot_is_shared(kv, id))
        drop_shared(kv, id);
    else
        rb_kvpage_free(kv->pages[id], rb_kvcache_page_alloc_bytes(kv));
    kv->pages[id] = NULL;
}

void *rb_kvcache_take_slot(rb_kvcache *kv, size_t id)
{
    void *page = kv->pages[id];
    if (!page || rb_kvcache_slot_is_shared(kv, id))
        return NULL;
    kv->pages[id] = NULL;
    return page;
}

int rb_kvcache_same_layout(const rb_kvcache *a, const rb_kvcache *b)
{
    return a->n_layers == b->n_layers && a->n_kv_heads == b->n_kv_heads &&
           a->head_dim_k == b->head_dim_k && a->head_dim_v == b->head_dim_v &&
           a->page_tokens == b->page_tokens && a->type_k == b->type_k &&
           a->type_v == b->type_v && a->n_ctx == b->n_ctx && a->page_bytes == b->page_bytes;
}

/* refs[] and the account of a cache about to hold a shared page. */
static rb_status prepare_share(rb_kvcache *kv, rb_kvshare *acct, rb_error *err)
{
    if (kv->share && kv->share != acct)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcache: pages are shared only inside "
                            "one pool (this cache shares with another pool's)");
    if (!kv->refs) {
        kv->refs = calloc((size_t)kv->n_layers * kv->pages_per_layer, sizeof *kv->refs);
        if (!kv->refs)
            return rb_error_set(err, RB_E_NOMEM, "kvcache: out of memory for the page "
                                "references");
    }
    if (!kv->share) {
        atomic_fetch_add_explicit(&acct->refs, 1, memory_order_relaxed);
        kv->share = acct;
    }
    return RB_OK;
}

rb_status rb_kvcache_share_slot(rb_kvcache *dst, rb_kvcache *src, size_t id, rb_kvshare *acct,
                                rb_error *err)
{
    rb_status st;
    if ((st = prepare_share(src, acct, err)) != RB_OK ||
        (st = prepare_share(dst, acct, err)) != RB_OK)
        return st;
    rb_kvpage_ref *ref = src->refs[id];
    if (!ref) { /* src's own page until now: the account counts it from here */
        if (!(ref = malloc(sizeof *ref)))
            return rb_error_set(err, RB_E_NOMEM, "kvcache: out of memory for a page reference");
        atomic_init(&ref->n, 1);
        src->refs[id] = ref;
        atomic_fetch_add_explicit(&acct->bytes, rb_kvcache_page_alloc_bytes(src),
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&acct->n_pages, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&ref->n, 1, memory_order_relaxed); /* src holds it: > 0 */
    dst->pages[id] = src->pages[id];
    dst->refs[id] = ref;
    return RB_OK;
}

rb_status rb_kvcache_copy_slot(rb_kvcache *dst, const rb_kvcache *src, size_t id, rb_error *err)
{
    void *page = rb_kvpage_alloc(rb_kvcache_page_alloc_bytes(dst));
    if (!page)
        return rb_error_set(err, RB_E_NOMEM, "kvcache: out of memory copying a page (%zu "
                            "bytes)", dst->page_bytes);
    memcpy(page, src->pages[id], src->page_bytes);
    dst->pages[id] = page;
    return RB_OK;
}

rb_status rb_kvcache_unshare_slot(rb_kvcache *kv, size_t id, rb_error *err)
{
    if (!kv->pages[id] || !rb_kvcache_slot_is_shared(kv, id))
        return RB_OK;
    rb_kvpage_ref *ref = kv->refs[id];
    const size_t n = rb_kvcache_page_alloc_bytes(kv);
    if (atomic_load_explicit(&ref->n, memory_order_acquire) == 1) {
        /* the last holder: nobody else can take it again (a count goes up
           only from a holder), so the page is this cache's now */
        kv->refs[id] = NULL;
        free(ref);
        atomic_fetch_sub_explicit(&kv->share->bytes, n, memory_order_relaxed);
        atomic_fetch_sub_explicit(&kv->share->n_pages, 1, memory_order_relaxed);
        return RB_OK;
    }
    void *page = rb_kvpage_alloc(n);
    if (!page)
        return rb_error_set(err, RB_E_NOMEM, "kvcache: out of memory copying a shared page "
                            "(%zu bytes)", kv->page_bytes);
    memcpy(page, kv->pages[id], kv->page_bytes);
    drop_shared(kv, id); /* may free it: another holder let go meanwhile */
    kv->pages[id] = page;
    return RB_OK;
}

void rb_kvcache_fill_slot(rb_kvcache *kv, size_t id, void *page)
{
    kv->pages[id] = page;
}

void rb_kvcache_free_page(rb_kvcache *kv, uint32_t layer, uint32_t page)
{
    rb_kvcache_free_slot(kv, (size_t)layer * kv->pages_per_layer + page);
}

void rb_kvcache_truncate(rb_kvcache *kv, uint32_t first_page)
{
    for (uint32_t l = 0; l < kv->n_layers; l++)
        for (uint32_t p = first_page; p < kv->pages_per_layer; p++)
            rb_kvcache_free_page(kv, l, p);
    if (kv->n_pages_reserved > first_page)
        kv->n_pages_reserved = first_page;
}
