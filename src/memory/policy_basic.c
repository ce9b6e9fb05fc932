/*
 * policy_basic.c - the recency-order policies: lru, fifo, mru, clock
 * (method table in policy.h).
 *
 * lru, fifo, mru keep the resident blocks on one intrusive list (links
 * prev/next: two u32 per key, 8 bytes, the paper's "about 1 MB per 512 MB
 * at 4 KiB"), head = most recent. lru moves a hit to the head and evicts
 * the tail; fifo never moves a hit and evicts the tail (the oldest load);
 * mru moves a hit to the head and evicts the head: on a loop larger than
 * the cache it keeps a fixed part of the loop, which lru cannot.
 *
 * clock keeps the resident blocks in a ring of `capacity` frames with one
 * reference bit each; a hit sets the bit; a miss sweeps the hand, clearing
 * set bits (a second chance), and replaces the first frame whose bit is
 * clear. A new block enters with its bit clear, so a block that is never
 * re-referenced goes around once, as in FIFO. A shrink (set_capacity)
 * empties frames into a stack of holes that later misses refill first; the
 * ring keeps the largest size it has had. Memory: frame_of (u32 per key),
 * frames and holes (u32 per frame), ref (1 byte per frame).
 * Invariant: n_used - n_holes == the resident count.
 *
 * Pinned blocks (policy.h) are skipped by every victim search: lru/fifo
 * move a pinned tail to the head, mru walks past a pinned head, clock's
 * hand passes pinned frames; after one full round of pinned candidates the
 * fetch bypasses.
 */
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "status.h"

/* ---- list policies ---------------------------------------------------------- */

typedef struct list_state {
    uint32_t *prev, *next;
    rb_plist l;
} list_state;

static size_t list_bytes(const rb_policy_config *cfg)
{
    return sizeof(list_state) + 2 * sizeof(uint32_t) * (size_t)cfg->n_keys;
}

static rb_status list_init(rb_policy *p, rb_error *err)
{
    list_state *s = calloc(1, sizeof *s);
    size_t n = p->cfg.n_keys ? p->cfg.n_keys : 1;
    if (s) {
        s->prev = malloc(n * sizeof *s->prev);
        s->next = malloc(n * sizeof *s->next);
    }
    if (!s || !s->prev || !s->next) {
        if (s) {
            free(s->prev);
            free(s->next);
        }
        free(s);
        return rb_error_set(err, RB_E_NOMEM, "policy %s: out of memory", p->m->name);
    }
    rb_plist_init(&s->l);
    p->impl = s;
    return RB_OK;
}

static void list_destroy(rb_policy *p)
{
    list_state *s = p->impl;
    free(s->prev);
    free(s->next);
    free(s);
    p->impl = NULL;
}

static void to_head(list_state *s, uint32_t k)
{
    if (s->l.head == k)
        return;
    rb_plist_remove(&s->l, s->prev, s->next, k);
    rb_plist_push_head(&s->l, s->prev, s->next, k);
}

static void lru_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    (void)now;
    to_head(p->impl, k);
}

static void fifo_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    (void)p, (void)k, (void)now;
}

/* lru and fifo: the tail is the victim; a pinned tail goes to the head. */
static int tail_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    (void)now;
    list_state *s = p->impl;
    if (p->n_resident >= p->cfg.capacity) {
        uint32_t v = s->l.tail;
        for (uint32_t tries = 0; rb_policy_is_pinned(p, v); tries++) {
            if (tries >= s->l.n)
                return 0;
            to_head(s, v);
            v = s->l.tail;
        }
        rb_plist_remove(&s->l, s->prev, s->next, v);
        *victim = v;
    }
    rb_plist_push_head(&s->l, s->prev, s->next, k);
    return 1;
}

static int mru_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    (void)now;
    list_state *s = p->impl;
    if (p->n_resident >= p->cfg.capacity) {
        uint32_t v = s->l.head;
        while (v != RB_PKEY_NONE && rb_policy_is_pinned(p, v))
            v = s->next[v];
        if (v == RB_PKEY_NONE)
            return 0;
        rb_plist_remove(&s->l, s->prev, s->next, v);
        *victim = v;
    }
    rb_plist_push_head(&s->l, s->prev, s->next, k);
    return 1;
}

static uint32_t tail_evict(rb_policy *p)
{
    list_state *s = p->impl;
    uint32_t v = s->l.tail;
    for (uint32_t tries = 0; v != RB_PKEY_NONE && rb_policy_is_pinned(p, v); tries++) {
        if (tries >= s->l.n)
            return RB_PKEY_NONE;
        to_head(s, v);
        v = s->l.tail;
    }
    if (v != RB_PKEY_NONE)
        rb_plist_remove(&s->l, s->prev, s->next, v);
    return v;
}

static uint32_t mru_evict(rb_policy *p)
{
    list_state *s = p->impl;
    uint32_t v = s->l.head;
    while (v != RB_PKEY_NONE && rb_policy_is_pinned(p, v))
        v = s->next[v];
    if (v != RB_PKEY_NONE)
        rb_plist_remove(&s->l, s->prev, s->next, v);
    return v;
}

static rb_status list_resize(rb_policy *p, uint32_t old_capacity, rb_error *err)
{
    (void)p, (void)old_capacity, (void)err; /* the links are per key */
    return RB_OK;
}

const rb_policy_methods rb_policy_lru = {
    "lru", "least recently used (the page cache's approximation of it)", 0,
    list_bytes, list_init, list_destroy, lru_hit, tail_miss, tail_evict, list_resize,
};
const rb_policy_methods rb_policy_fifo = {
    "fifo", "first in, first out", 0,
    list_bytes, list_init, list_destroy, fifo_hit, tail_miss, tail_evict, list_resize,
};
const rb_policy_methods rb_policy_mru = {
    "mru", "most recently used: evicts the newest block (loop-friendly)", 0,
    list_bytes, list_init, list_destroy, lru_hit, mru_miss, mru_evict, list_resize,
};

/* ---- clock -------------------------------------------------------------------- */

typedef struct clock_state {
    uint32_t *frame_of;   /* [n_keys] frame of a resident key */
    uint32_t *frames;     /* [cap_frames] key in each frame, RB_PKEY_NONE: a hole */
    uint8_t *ref;         /* [cap_frames] */
    uint32_t *holes;      /* [cap_frames] stack of frames emptied by a shrink */
    uint32_t cap_frames;  /* the largest capacity so far */
    uint32_t n_used;      /* frames [0, n_used) have held a key */
    uint32_t n_holes, hand;
} clock_state;

static size_t clock_bytes(const rb_policy_config *cfg)
{
    return sizeof(clock_state) + sizeof(uint32_t) * (size_t)cfg->n_keys +
           9 * (size_t)cfg->capacity;
}

static void clock_destroy(rb_policy *p)
{
    clock_state *s = p->impl;
    free(s->frame_of);
    free(s->frames);
    free(s->ref);
    free(s->holes);
    free(s);
    p->impl = NULL;
}

static rb_status clock_init(rb_policy *p, rb_error *err)
{
    clock_state *s = calloc(1, sizeof *s);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "policy clock: out of memory");
    p->impl = s;
    s->cap_frames = p->cfg.capacity;
    s->frame_of = malloc((p->cfg.n_keys ? p->cfg.n_keys : 1) * sizeof *s->frame_of);
    s->frames = malloc(s->cap_frames * sizeof *s->frames);
    s->ref = calloc(s->cap_frames, 1);
    s->holes = malloc(s->cap_frames * sizeof *s->holes);
    if (!s->frame_of || !s->frames || !s->ref || !s->holes) {
        clock_destroy(p);
        return rb_error_set(err, RB_E_NOMEM, "policy clock: out of memory");
    }
    return RB_OK;
}

static void clock_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    (void)now;
    clock_state *s = p->impl;
    s->ref[s->frame_of[k]] = 1;
}

/* Sweeps the hand to the first unpinned frame whose bit is clear, clearing
 * set bits on the way (a second chance); holes are passed. At most two
 * rounds: the first clears every bit, the second finds a clear one unless
 * every frame is pinned. Returns the frame or UINT32_MAX. */
static uint32_t clock_sweep(rb_policy *p, clock_state *s)
{
    uint64_t steps = 0, limit = 2ull * s->n_used + 1;
    for (;;) {
        if (++steps > limit || s->n_used == 0)
            return UINT32_MAX;
        uint32_t f = s->hand;
        s->hand = s->hand + 1 >= s->n_used ? 0 : s->hand + 1;
        if (s->frames[f] == RB_PKEY_NONE || rb_policy_is_pinned(p, s->frames[f]))
            continue;
        if (!s->ref[f])
            return f;
        s->ref[f] = 0;
    }
}

static int clock_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    (void)now;
    clock_state *s = p->impl;
    uint32_t f;
    if (p->n_resident < p->cfg.capacity) {
        /* invariant n_used - n_holes == n_resident: without holes,
           n_used < capacity <= cap_frames */
        f = s->n_holes ? s->holes[--s->n_holes] : s->n_used++;
    } else {
        f = clock_sweep(p, s);
        if (f == UINT32_MAX)
            return 0;
        *victim = s->frames[f];
    }
    s->frames[f] = k;
    s->frame_of[k] = f;
    s->ref[f] = 0;
    return 1;
}

static uint32_t clock_evict(rb_policy *p)
{
    clock_state *s = p->impl;
    uint32_t f = clock_sweep(p, s);
    if (f == UINT32_MAX)
        return RB_PKEY_NONE;
    uint32_t v = s->frames[f];
    s->frames[f] = RB_PKEY_NONE;
    s->holes[s->n_holes++] = f;
    return v;
}

static rb_status clock_resize(rb_policy *p, uint32_t old_capacity, rb_error *err)
{
    (void)old_capacity;
    clock_state *s = p->impl;
    uint32_t c = p->cfg.capacity;
    if (c <= s->cap_frames)
        return RB_OK; /* shrinking: evictions leave holes, refilled first */
    uint32_t *nf = realloc(s->frames, c * sizeof *nf);
    if (nf)
        s->frames = nf;
    uint8_t *nr = nf ? realloc(s->ref, c) : NULL;
    if (nr)
        s->ref = nr;
    uint32_t *nh = nr ? realloc(s->holes, c * sizeof *nh) : NULL;
    if (!nh)
        return rb_error_set(err, RB_E_NOMEM, "policy clock: out of memory for %u frames", c);
    s->holes = nh;
    memset(s->ref + s->cap_frames, 0, c - s->cap_frames);
    s->cap_frames = c;
    return RB_OK;
}

const rb_policy_methods rb_policy_clock = {
    "clock", "one reference bit per frame, second chance", 0,
    clock_bytes, clock_init, clock_destroy, clock_hit, clock_miss, clock_evict, clock_resize,
};
