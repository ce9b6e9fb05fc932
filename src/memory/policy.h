/*
 * policy.h - block replacement policies behind one method table, shared by
 * the simulator (sim.c) and the runtime weight cache (wcache_stream): the
 * same code decides in both, so a simulated hit ratio is the runtime's.
 *
 * Keys are dense block ids in [0, n_keys): the runtime numbers the 4 KiB
 * blocks of its model file, the simulator the blocks of a trace
 * (rb_block_stream). Dense keys let every policy keep its per-block state
 * in flat arrays instead of hash tables (the simulator's speed target is
 * 10 M accesses/s per policy).
 *
 * A cache of `capacity` blocks. rb_policy_fetch is the one entry point;
 * its steps (numbered in policy.c as in sqlite's pcache1 fetch):
 *   1. resident?  -> the method's hit(): update recency; RB_FETCH_HIT
 *   2. not resident -> the method's miss(): decide whether to admit the
 *      block and, if the cache is full, which unpinned block to evict
 *   3. the core clears the victim's resident bit
 *   4. the core sets the block's resident bit (RB_FETCH_MISS) or leaves it
 *      out (RB_FETCH_BYPASS: delivered through the caller's stream window,
 *      not cached)
 * The caller reads the block from storage on MISS and BYPASS, and drops
 * its copy of the victim.
 *
 * Pinned vs unpinned: rb_policy_pin marks a resident block in use (the
 * runtime pins the blocks a layer's compute is reading); a policy never
 * chooses a pinned victim, it skips it as if it had just been used. When
 * every candidate is pinned, the fetch bypasses. The simulator never pins.
 * (The class policy's own "pinned hot set / loop prefix" is a policy
 * decision inside it, not this in-use pin.)
 *
 * Policies: lru, fifo, clock, 2q, arc, lirs, mru, class (the paper's
 * LLM-aware policy over Algorithm 1), opt (Belady, needs the future: the
 * simulator's next-use index; not available to the runtime).
 *
 * Threads: a policy is not thread-safe; the owner serializes fetches
 * (the runtime's cache lock guards all of it).
 */
#ifndef RB_POLICY_H
#define RB_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

#define RB_PKEY_NONE UINT32_MAX

enum { RB_FETCH_BYPASS = 0, RB_FETCH_MISS = 1, RB_FETCH_HIT = 2 };

typedef struct rb_policy_config {
    uint32_t n_keys;            /* key space */
    uint32_t capacity;          /* blocks the cache holds, >= 1 */
    /* class: */
    uint32_t window;            /* class: streaming window blocks (0: default
                                   min(16, capacity / 64), at least 1) */
    const uint8_t *key_class;   /* optional offline labels per key (classify.h);
                                   NULL: Algorithm 1 online, as the runtime runs */
    /* opt: next_use[i] = index of the next access to the key accessed at
       access i (UINT64_MAX: never); `now` passed to fetch is i */
    const uint64_t *next_use;
} rb_policy_config;

typedef struct rb_policy rb_policy;

typedef struct rb_policy_methods {
    const char *name;
    const char *summary;
    int needs_future;           /* 1: needs config.next_use (opt) */
    /* state bytes the method allocates for cfg (for the accounting) */
    size_t (*state_bytes)(const rb_policy_config *cfg);
    rb_status (*init)(rb_policy *p, rb_error *err);   /* allocates p->impl */
    void (*destroy)(rb_policy *p);
    void (*hit)(rb_policy *p, uint32_t key, uint64_t now);
    /* returns 1 to admit key (after evicting *victim when full), 0 to bypass */
    int (*miss)(rb_policy *p, uint32_t key, uint64_t now, uint32_t *victim);
    /* removes one unpinned resident block in the policy's own order and
       returns it (RB_PKEY_NONE if every resident block is pinned) */
    uint32_t (*evict)(rb_policy *p);
    /* cfg.capacity has just changed from old_capacity: adjust the method's
       own sizes (before any eviction). RB_E_NOMEM leaves the state valid. */
    rb_status (*resize)(rb_policy *p, uint32_t old_capacity, rb_error *err);
} rb_policy_methods;

struct rb_policy {
    const rb_policy_methods *m;
    rb_policy_config cfg;
    uint32_t n_resident;        /* <= cfg.capacity */
    uint8_t *resident;          /* [n_keys] 1 when cached */
    uint8_t *pins;              /* [n_keys] in-use count (saturates at 255) */
    void *impl;                 /* the method's state */
    uint32_t window_req;        /* the window asked for (0: the default) */
    uint64_t n_hits, n_misses, n_bypass, n_evictions;
};

/* The methods by name (NULL when unknown), and the list of names. */
const rb_policy_methods *rb_policy_find(const char *name);
int rb_policy_count(void);
const rb_policy_methods *rb_policy_at(int i);

/* Creates a policy. Errors: RB_E_NOT_FOUND (unknown name: the message lists
 * the known ones), RB_E_INVALID_ARG (capacity 0, opt without next_use),
 * RB_E_NOMEM. cfg's pointers must outlive the policy. */
rb_status rb_policy_create(const char *name, const rb_policy_config *cfg, rb_policy **out,
                           rb_error *err);
void rb_policy_destroy(rb_policy *p);

/* The fetch steps above; *victim = the evicted key or RB_PKEY_NONE.
 * now: the access's index in the stream (opt reads cfg.next_use[now]; the
 * others ignore it, so the runtime passes any counter). */
int rb_policy_fetch(rb_policy *p, uint32_t key, uint64_t now, uint32_t *victim);

/*
 * Changes the capacity: the runtime re-balances its pinned loop prefix S as
 * the KV cache grows and takes pool bytes from the weights.
 * Growing keeps every block; shrinking evicts n_resident - capacity blocks
 * in the policy's own eviction order (class: streamed and SEQ blocks, then
 * the loop prefix's end, the hot set last) and writes their keys to
 * victims (room for that many, or NULL); *n_victims says how many.
 * Errors: RB_E_INVALID_ARG (capacity 0), RB_E_BUDGET (more blocks are
 * pinned in use than the new capacity holds), RB_E_NOMEM; on error nothing
 * changed.
 */
rb_status rb_policy_set_capacity(rb_policy *p, uint32_t capacity, uint32_t *victims,
                                 uint32_t *n_victims, rb_error *err);

/* In-use pins on a resident block (no-op when not resident). */
void rb_policy_pin(rb_policy *p, uint32_t key);
void rb_policy_unpin(rb_policy *p, uint32_t key);
static inline int rb_policy_is_pinned(const rb_policy *p, uint32_t key)
{
    return p->pins[key] != 0;
}

/* Bytes of metadata: the core's two bytes per key plus the method's state. */
size_t rb_policy_state_bytes(const rb_policy *p);

/* ---- helpers the policy families share (policy_*.c) --------------------- */

/* An intrusive doubly linked list over keys: links live in caller arrays
 * prev/next (one pair per key); head = most recent end. */
typedef struct rb_plist {
    uint32_t head, tail, n;
} rb_plist;

static inline void rb_plist_init(rb_plist *l) { l->head = l->tail = RB_PKEY_NONE, l->n = 0; }

static inline void rb_plist_push_head(rb_plist *l, uint32_t *prev, uint32_t *next, uint32_t k)
{
    prev[k] = RB_PKEY_NONE;
    next[k] = l->head;
    if (l->head != RB_PKEY_NONE)
        prev[l->head] = k;
    else
        l->tail = k;
    l->head = k;
    l->n++;
}

static inline void rb_plist_remove(rb_plist *l, uint32_t *prev, uint32_t *next, uint32_t k)
{
    uint32_t p = prev[k], n = next[k];
    if (p != RB_PKEY_NONE)
        next[p] = n;
    else
        l->head = n;
    if (n != RB_PKEY_NONE)
        prev[n] = p;
    else
        l->tail = p;
    l->n--;
}

/* Method tables of each family. */
extern const rb_policy_methods rb_policy_lru, rb_policy_fifo, rb_policy_mru, rb_policy_clock;
extern const rb_policy_methods rb_policy_2q, rb_policy_arc, rb_policy_lirs;
extern const rb_policy_methods rb_policy_class, rb_policy_opt;

#endif /* RB_POLICY_H */
