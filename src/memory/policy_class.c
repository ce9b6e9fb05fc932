/*
 * policy_class.c - the LLM-aware policy of Kim, Lee and Bahn (2025), and
 * OPT, the offline optimum it is measured against (method table in
 * policy.h).
 *
 * class, in prose first: every access goes through Algorithm 1 (or an
 * offline label, classify.h). The cache is split into a pinned area of
 * capacity - window blocks; the rest, and any frame the pinned area does
 * not use yet, hold the stream (at least `window` blocks).
 *   - HOT blocks (tokenizer, metadata, indexes, embedding rows) are pinned
 *     first; when the pinned area is full, a HOT block takes the place of
 *     the most recently pinned LOOP block (the end of the loop prefix).
 *   - LOOP blocks are pinned while there is room: the first S bytes of the
 *     weight loop stay for good, which is what S >= max(0, N - BW*T) sizes.
 *     The rest of the loop streams through.
 *   - SEQ blocks (the load scan) only ever enter the stream: they keep
 *     frames nobody else wants yet and are evicted first.
 *   - A streamed block can be hit while it is still cached (the load
 *     scan's head, read again by the first token; a block two tensors
 *     share); one that turns HOT or LOOP on a hit moves to the pinned area
 *     if there is room, in place.
 *   - The stream gives up its newest block first (window_victim says why).
 * Eviction order is therefore SEQ and streamed blocks first, then LOOP (the
 * prefix's end), HOT last, as in the paper's Evict(). Measured: within
 * 0.3% (absolute hit ratio) of OPT on a 32-token trace of rebound decoding
 * a tinyllama-1.1b-shape Q4_0 model, 10% to 100% of the loop.
 *
 * Memory: where[] (1 byte per key), links for the stream list and the loop
 * prefix stack (two u32 per key), and Algorithm 1's run table (classify.h:
 * 4 bytes per key, 9 per live run) when labels are online.
 *
 * opt (Belady's MIN, demand fetching: every miss is cached): the resident
 * block whose next use is farthest is evicted. A max-heap of resident keys
 * ordered by next use, with each key's heap position, gives O(log c) per
 * access; the next-use index over the trace comes from the simulator
 * (config.next_use). The runtime cannot know the future: opt refuses to be
 * created without it. opt ignores in-use pins (the simulator never pins).
 */
#include <stdlib.h>
#include <string.h>

#include "classify.h"
#include "policy.h"
#include "status.h"

/* ---- class ------------------------------------------------------------------ */

enum { C_NONE = 0, C_HOT = 1, C_LOOP = 2, C_WIN = 3 };

typedef struct class_state {
    uint8_t *where;
    uint32_t *prev, *next;      /* stream list and loop stack share the links */
    rb_plist win, loop, hot;
    uint32_t pin_cap;           /* capacity - window */
    int is_online;
    rb_classify_online cl;
} class_state;

static size_t class_bytes(const rb_policy_config *cfg)
{
    size_t b = sizeof(class_state) + 9 * (size_t)cfg->n_keys;
    return cfg->key_class ? b : b + rb_classify_online_bytes(cfg->n_keys);
}

static void class_destroy(rb_policy *p)
{
    class_state *s = p->impl;
    free(s->where);
    free(s->prev);
    free(s->next);
    rb_classify_online_deinit(&s->cl);
    free(s);
    p->impl = NULL;
}

static rb_status class_init(rb_policy *p, rb_error *err)
{
    class_state *s = calloc(1, sizeof *s);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "policy class: out of memory");
    p->impl = s;
    size_t n = p->cfg.n_keys ? p->cfg.n_keys : 1;
    s->where = calloc(n, 1);
    s->prev = malloc(n * sizeof *s->prev);
    s->next = malloc(n * sizeof *s->next);
    if (!s->where || !s->prev || !s->next) {
        class_destroy(p);
        return rb_error_set(err, RB_E_NOMEM, "policy class: out of memory");
    }
    s->is_online = p->cfg.key_class == NULL;
    if (s->is_online) {
        rb_status st = rb_classify_online_init(&s->cl, p->cfg.n_keys, err);
        if (st != RB_OK) {
            class_destroy(p);
            return st;
        }
    }
    rb_plist_init(&s->win);
    rb_plist_init(&s->loop);
    rb_plist_init(&s->hot);
    s->pin_cap = p->cfg.capacity - p->cfg.window;
    return RB_OK;
}

static int label(class_state *s, const rb_policy *p, uint32_t k)
{
    return s->is_online ? rb_classify_online_access(&s->cl, k) : p->cfg.key_class[k];
}

static rb_plist *list_of(class_state *s, uint8_t w)
{
    return w == C_HOT ? &s->hot : w == C_LOOP ? &s->loop : &s->win;
}

static void enter(class_state *s, uint8_t w, uint32_t k)
{
    s->where[k] = w;
    rb_plist_push_head(list_of(s, w), s->prev, s->next, k);
}

static void leave(class_state *s, uint32_t k)
{
    rb_plist_remove(list_of(s, s->where[k]), s->prev, s->next, k);
    s->where[k] = C_NONE;
}

static uint32_t n_pinned(const class_state *s) { return s->hot.n + s->loop.n; }

static void class_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    (void)now;
    class_state *s = p->impl;
    int c = label(s, p, k);
    if (s->where[k] == C_WIN && (c == RB_CLASS_HOT || c == RB_CLASS_LOOP) &&
        n_pinned(s) < s->pin_cap) {
        leave(s, k);
        enter(s, c == RB_CLASS_HOT ? C_HOT : C_LOOP, k);
    }
}

/* The newest unpinned block of the stream, or RB_PKEY_NONE. Newest first:
 * a scan's tail is what a loop that follows it in file order reads last,
 * so evicting the oldest would throw out exactly the blocks the next pass
 * needs first (FIFO's failure on a loop); a block read twice in a row (two
 * tensors sharing it) is hit before the next miss, so it loses nothing. */
static uint32_t window_victim(rb_policy *p, class_state *s)
{
    uint32_t v = s->win.head;
    while (v != RB_PKEY_NONE && rb_policy_is_pinned(p, v))
        v = s->next[v];
    return v;
}

static uint32_t pinned_end(rb_policy *p, class_state *s, const rb_plist *l);

/* A free frame: none needed below capacity, else a stream block (SEQ and
 * streamed blocks are evicted first), else, while the pinned area is over
 * its size (the capacity shrank: set_capacity only evicts down to the new
 * capacity, so the stream may be left with no frame at all), the loop
 * prefix's end, then the hot set's. 0 when all are in use. */
static int make_room(rb_policy *p, class_state *s, uint32_t *victim)
{
    if (p->n_resident < p->cfg.capacity)
        return 1;
    uint32_t v = window_victim(p, s);
    if (v == RB_PKEY_NONE && n_pinned(s) > s->pin_cap) {
        v = pinned_end(p, s, &s->loop);
        if (v == RB_PKEY_NONE)
            v = pinned_end(p, s, &s->hot);
    }
    if (v == RB_PKEY_NONE)
        return 0;
    leave(s, v);
    *victim = v;
    return 1;
}

static int class_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    (void)now;
    class_state *s = p->impl;
    int c = label(s, p, k);
    /* 1. HOT or LOOP with room in the pinned area: pin it (taking the
       frame of the oldest streamed block if the cache is full) */
    if ((c == RB_CLASS_HOT || c == RB_CLASS_LOOP) && n_pinned(s) < s->pin_cap) {
        if (!make_room(p, s, victim))
            return 0;
        enter(s, c == RB_CLASS_HOT ? C_HOT : C_LOOP, k);
        return 1;
    }
    /* 2. HOT with the pinned area full: the loop prefix gives up its end */
    if (c == RB_CLASS_HOT && s->loop.n > 0) {
        uint32_t v = s->loop.head;
        while (v != RB_PKEY_NONE && rb_policy_is_pinned(p, v))
            v = s->next[v];
        if (v != RB_PKEY_NONE) {
            leave(s, v);
            enter(s, C_HOT, k);
            *victim = v;
            return 1;
        }
    }
    /* 3. everything else streams through: it may use any frame
       the pinned area does not, and at least `window` frames */
    if (!make_room(p, s, victim))
        return 0;
    enter(s, C_WIN, k);
    return 1;
}

/* The most recently pinned unpinned-in-use block of a pinned list. */
static uint32_t pinned_end(rb_policy *p, class_state *s, const rb_plist *l)
{
    uint32_t v = l->head;
    while (v != RB_PKEY_NONE && rb_policy_is_pinned(p, v))
        v = s->next[v];
    return v;
}

/* A shrink's order, the paper's Evict(): streamed and SEQ blocks, then the
 * loop prefix's end, the hot set last; but while the pinned area is over
 * its (new) size, it gives up blocks first, so the stream keeps its window. */
static uint32_t class_evict(rb_policy *p)
{
    class_state *s = p->impl;
    int over = n_pinned(s) > s->pin_cap;
    uint32_t v = over ? RB_PKEY_NONE : window_victim(p, s);
    if (v == RB_PKEY_NONE)
        v = pinned_end(p, s, &s->loop);
    if (v == RB_PKEY_NONE)
        v = pinned_end(p, s, &s->hot);
    if (v == RB_PKEY_NONE && over)
        v = window_victim(p, s);
    if (v != RB_PKEY_NONE)
        leave(s, v);
    return v;
}

static rb_status class_resize(rb_policy *p, uint32_t old_capacity, rb_error *err)
{
    (void)old_capacity, (void)err;
    class_state *s = p->impl;
    s->pin_cap = p->cfg.capacity - p->cfg.window;
    return RB_OK;
}

const rb_policy_methods rb_policy_class = {
    "class", "LLM-aware (Algorithm 1): SEQ streamed, HOT pinned, loop prefix pinned", 0,
    class_bytes, class_init, class_destroy, class_hit, class_miss, class_evict, class_resize,
};

/* ---- opt ------------------------------------------------------------------------ */

typedef struct opt_state {
    uint32_t *heap;     /* [cap_heap] keys, max-heap by nu[] */
    uint32_t *pos;      /* [n_keys] heap index of a resident key */
    uint64_t *nu;       /* [n_keys] next use of a resident key */
    uint32_t n, cap_heap;
} opt_state;

static size_t opt_bytes(const rb_policy_config *cfg)
{
    return sizeof(opt_state) + 12 * (size_t)cfg->n_keys + 4 * (size_t)cfg->capacity;
}

static void opt_destroy(rb_policy *p)
{
    opt_state *s = p->impl;
    free(s->heap);
    free(s->pos);
    free(s->nu);
    free(s);
    p->impl = NULL;
}

static rb_status opt_init(rb_policy *p, rb_error *err)
{
    opt_state *s = calloc(1, sizeof *s);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "policy opt: out of memory");
    p->impl = s;
    size_t n = p->cfg.n_keys ? p->cfg.n_keys : 1;
    s->cap_heap = p->cfg.capacity;
    s->heap = malloc(s->cap_heap * sizeof *s->heap);
    s->pos = malloc(n * sizeof *s->pos);
    s->nu = malloc(n * sizeof *s->nu);
    if (!s->heap || !s->pos || !s->nu) {
        opt_destroy(p);
        return rb_error_set(err, RB_E_NOMEM, "policy opt: out of memory");
    }
    return RB_OK;
}

static void sift_up(opt_state *s, uint32_t i)
{
    uint32_t k = s->heap[i];
    uint64_t v = s->nu[k];
    while (i > 0) {
        uint32_t up = (i - 1) / 2;
        if (s->nu[s->heap[up]] >= v)
            break;
        s->heap[i] = s->heap[up];
        s->pos[s->heap[i]] = i;
        i = up;
    }
    s->heap[i] = k;
    s->pos[k] = i;
}

static void sift_down(opt_state *s, uint32_t i)
{
    uint32_t k = s->heap[i];
    uint64_t v = s->nu[k];
    for (;;) {
        uint32_t l = 2 * i + 1, r = l + 1, big = i;
        uint64_t bv = v;
        if (l < s->n && s->nu[s->heap[l]] > bv)
            big = l, bv = s->nu[s->heap[l]];
        if (r < s->n && s->nu[s->heap[r]] > bv)
            big = r;
        if (big == i)
            break;
        s->heap[i] = s->heap[big];
        s->pos[s->heap[i]] = i;
        i = big;
    }
    s->heap[i] = k;
    s->pos[k] = i;
}

static void opt_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    opt_state *s = p->impl;
    s->nu[k] = p->cfg.next_use[now]; /* later than before: moves up */
    sift_up(s, s->pos[k]);
}

static int opt_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    opt_state *s = p->impl;
    s->nu[k] = p->cfg.next_use[now];
    if (s->n >= p->cfg.capacity) {
        *victim = s->heap[0]; /* farthest next use */
        s->heap[0] = k;
        s->pos[k] = 0;
        sift_down(s, 0);
        return 1;
    }
    s->heap[s->n] = k;
    s->pos[k] = s->n;
    s->n++;
    sift_up(s, s->n - 1);
    return 1;
}

static uint32_t opt_evict(rb_policy *p)
{
    opt_state *s = p->impl;
    if (s->n == 0)
        return RB_PKEY_NONE;
    uint32_t v = s->heap[0];
    if (--s->n > 0) {
        s->heap[0] = s->heap[s->n];
        s->pos[s->heap[0]] = 0;
        sift_down(s, 0);
    }
    return v;
}

static rb_status opt_resize(rb_policy *p, uint32_t old_capacity, rb_error *err)
{
    (void)old_capacity;
    opt_state *s = p->impl;
    if (p->cfg.capacity <= s->cap_heap)
        return RB_OK;
    uint32_t *h = realloc(s->heap, p->cfg.capacity * sizeof *h);
    if (!h)
        return rb_error_set(err, RB_E_NOMEM, "policy opt: out of memory");
    s->heap = h;
    s->cap_heap = p->cfg.capacity;
    return RB_OK;
}

const rb_policy_methods rb_policy_opt = {
    "opt", "Belady's MIN: evicts the block used farthest in the future (simulator only)", 1,
    opt_bytes, opt_init, opt_destroy, opt_hit, opt_miss, opt_evict, opt_resize,
};
