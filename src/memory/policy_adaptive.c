/*
 * policy_adaptive.c - the policies that remember history beyond the cache:
 * 2q, arc, lirs (method table in policy.h). Each keeps ghost entries of
 * recently evicted keys to tell a block re-used at a long distance from a
 * block used once.
 *
 * 2q (Johnson & Shasha 1994, the full version): A1in is a FIFO of blocks
 * seen once (Kin = c/4 of the cache), A1out a ghost FIFO of keys evicted
 * from A1in (Kout = c/2 keys), Am an LRU of blocks seen again. A miss on a
 * key in A1out goes to Am; any other miss to A1in. Room is made from A1in
 * when it is over Kin, else from Am's tail.
 *
 * arc (Megiddo & Modha 2003): T1 (seen once) and T2 (seen twice or more)
 * are resident, B1/B2 their ghosts; the target size p of T1 moves up on a
 * B1 ghost hit and down on a B2 ghost hit; REPLACE evicts from T1 when it
 * is over p, else from T2. |T1|+|B1| <= c and the four lists hold <= 2c.
 *
 * lirs (Jiang & Zhang 2002): blocks with a short inter-reference recency
 * (LIR, c - c/100 of the cache) stay; the rest (HIR, at least one block)
 * pass through a small resident queue Q; the recency stack S also holds
 * non-resident HIR keys so that a HIR block re-used within the LIR set's
 * recency is promoted. The stack is pruned so its bottom is always LIR.
 *
 * Memory: each keeps one list membership byte per key and u32 links (two
 * per key for 2q and arc, four for lirs: a key can be on S and Q at once).
 * Pinned blocks are skipped as candidates by moving them to their list's
 * most recent end; a full round of pinned candidates bypasses the fetch.
 */
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "status.h"

/* Shared: per key a list tag and one pair of links. */
typedef struct multi_state {
    uint8_t *where;
    uint32_t *prev, *next;
    rb_plist l[4];
    uint32_t p;                 /* arc: target size of T1 */
    /* lirs only */
    uint32_t *qprev, *qnext;
    uint8_t *in_s;
    uint32_t n_lir, l_lir;
} multi_state;

static void multi_destroy(rb_policy *p)
{
    multi_state *s = p->impl;
    free(s->where);
    free(s->prev);
    free(s->next);
    free(s->qprev);
    free(s->qnext);
    free(s->in_s);
    free(s);
    p->impl = NULL;
}

static rb_status multi_alloc(rb_policy *p, int is_lirs, rb_error *err)
{
    multi_state *s = calloc(1, sizeof *s);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "policy %s: out of memory", p->m->name);
    p->impl = s;
    size_t n = p->cfg.n_keys ? p->cfg.n_keys : 1;
    s->where = calloc(n, 1);
    s->prev = malloc(n * sizeof *s->prev);
    s->next = malloc(n * sizeof *s->next);
    int ok = s->where && s->prev && s->next;
    if (is_lirs) {
        s->qprev = malloc(n * sizeof *s->qprev);
        s->qnext = malloc(n * sizeof *s->qnext);
        s->in_s = calloc(n, 1);
        ok = ok && s->qprev && s->qnext && s->in_s;
    }
    if (!ok) {
        multi_destroy(p);
        return rb_error_set(err, RB_E_NOMEM, "policy %s: out of memory for %u keys",
                            p->m->name, p->cfg.n_keys);
    }
    for (int i = 0; i < 4; i++)
        rb_plist_init(&s->l[i]);
    return RB_OK;
}

/* list ids are where-1 */
static void put(multi_state *s, uint8_t w, uint32_t k)
{
    s->where[k] = w;
    rb_plist_push_head(&s->l[w - 1], s->prev, s->next, k);
}

static void take(multi_state *s, uint32_t k)
{
    rb_plist_remove(&s->l[s->where[k] - 1], s->prev, s->next, k);
    s->where[k] = 0;
}

/* The tail of list w that is not pinned, rotating pinned ones to the head;
 * RB_PKEY_NONE when the list is empty or all pinned. */
static uint32_t unpinned_tail(rb_policy *p, multi_state *s, uint8_t w)
{
    rb_plist *l = &s->l[w - 1];
    for (uint32_t tries = 0; l->tail != RB_PKEY_NONE; tries++) {
        uint32_t v = l->tail;
        if (!rb_policy_is_pinned(p, v))
            return v;
        if (tries >= l->n)
            return RB_PKEY_NONE;
        take(s, v);
        put(s, w, v);
    }
    return RB_PKEY_NONE;
}

/* ---- 2q ------------------------------------------------------------------------ */

enum { Q_A1IN = 1, Q_AM = 2, Q_A1OUT = 3 };

static size_t twoq_bytes(const rb_policy_config *cfg)
{
    return sizeof(multi_state) + 9 * (size_t)cfg->n_keys;
}

static rb_status twoq_init(rb_policy *p, rb_error *err) { return multi_alloc(p, 0, err); }

static void twoq_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    (void)now;
    multi_state *s = p->impl;
    if (s->where[k] == Q_AM) {
        take(s, k);
        put(s, Q_AM, k);
    } /* A1in: a second access soon after the first says nothing: stays */
}

/* Frees one frame: from A1in (its key remembered in A1out) when A1in is
 * over Kin or Am is empty, else from Am's tail; the other list when the
 * first has only pinned blocks. RB_PKEY_NONE when every block is pinned. */
static uint32_t twoq_reclaim(rb_policy *p, multi_state *s)
{
    uint32_t c = p->cfg.capacity, kin = c / 4 ? c / 4 : 1, kout = c / 2 ? c / 2 : 1;
    int from_in = s->l[Q_A1IN - 1].n > kin || s->l[Q_AM - 1].n == 0;
    for (int attempt = 0; attempt < 2; attempt++, from_in = !from_in) {
        uint32_t v = unpinned_tail(p, s, from_in ? Q_A1IN : Q_AM);
        if (v == RB_PKEY_NONE)
            continue;
        take(s, v);
        if (from_in) {
            put(s, Q_A1OUT, v);
            while (s->l[Q_A1OUT - 1].n > kout)
                take(s, s->l[Q_A1OUT - 1].tail);
        }
        return v;
    }
    return RB_PKEY_NONE;
}

static int twoq_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    (void)now;
    multi_state *s = p->impl;
    int was_ghost = s->where[k] == Q_A1OUT;
    if (was_ghost)
        take(s, k);
    if (p->n_resident >= p->cfg.capacity) {
        uint32_t v = twoq_reclaim(p, s);
        if (v == RB_PKEY_NONE) {
            if (was_ghost)
                put(s, Q_A1OUT, k);
            return 0;
        }
        *victim = v;
    }
    put(s, was_ghost ? Q_AM : Q_A1IN, k);
    return 1;
}

static uint32_t twoq_evict(rb_policy *p) { return twoq_reclaim(p, p->impl); }

static rb_status twoq_resize(rb_policy *p, uint32_t old_capacity, rb_error *err)
{
    (void)old_capacity, (void)err;
    multi_state *s = p->impl;
    uint32_t kout = p->cfg.capacity / 2 ? p->cfg.capacity / 2 : 1;
    while (s->l[Q_A1OUT - 1].n > kout)
        take(s, s->l[Q_A1OUT - 1].tail);
    return RB_OK;
}

const rb_policy_methods rb_policy_2q = {
    "2q", "A1in FIFO (c/4), A1out ghosts (c/2), Am LRU", 0,
    twoq_bytes, twoq_init, multi_destroy, twoq_hit, twoq_miss, twoq_evict, twoq_resize,
};

/* ---- arc ------------------------------------------------------------------------- */

enum { A_T1 = 1, A_T2 = 2, A_B1 = 3, A_B2 = 4 };
#define LN(s, w) ((s)->l[(w) - 1].n)

static size_t arc_bytes(const rb_policy_config *cfg)
{
    return sizeof(multi_state) + 9 * (size_t)cfg->n_keys;
}

static rb_status arc_init(rb_policy *p, rb_error *err) { return multi_alloc(p, 0, err); }

static void arc_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    (void)now;
    multi_state *s = p->impl;
    take(s, k);
    put(s, A_T2, k);
}

/* REPLACE: evict T1's LRU to B1 when T1 is over its target, else T2's to
 * B2. Returns the victim or RB_PKEY_NONE when all candidates are pinned. */
static uint32_t arc_replace(rb_policy *p, multi_state *s, int in_b2)
{
    uint32_t t1 = LN(s, A_T1);
    int from_t1 = t1 >= 1 && ((in_b2 && t1 == s->p) || t1 > s->p);
    uint32_t v = unpinned_tail(p, s, from_t1 ? A_T1 : A_T2);
    if (v == RB_PKEY_NONE) {
        from_t1 = !from_t1;
        v = unpinned_tail(p, s, from_t1 ? A_T1 : A_T2);
        if (v == RB_PKEY_NONE)
            return v;
    }
    take(s, v);
    put(s, from_t1 ? A_B1 : A_B2, v);
    return v;
}

static int arc_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    (void)now;
    multi_state *s = p->impl;
    uint32_t c = p->cfg.capacity;
    int full = p->n_resident >= c;
    uint8_t w = s->where[k];
    if (w == A_B1 || w == A_B2) {
        /* a ghost hit: adapt the target, make room, the block goes to T2 */
        uint32_t b1 = LN(s, A_B1), b2 = LN(s, A_B2);
        if (w == A_B1) {
            uint32_t d = b2 / b1 > 1 ? b2 / b1 : 1;
            s->p = s->p + d < c ? s->p + d : c;
        } else {
            uint32_t d = b1 / b2 > 1 ? b1 / b2 : 1;
            s->p = s->p > d ? s->p - d : 0;
        }
        if (full) {
            uint32_t v = arc_replace(p, s, w == A_B2);
            if (v == RB_PKEY_NONE)
                return 0;
            *victim = v;
        }
        take(s, k);
        put(s, A_T2, k);
        return 1;
    }
    /* a new key */
    uint32_t l1 = LN(s, A_T1) + LN(s, A_B1);
    if (l1 >= c) {
        if (LN(s, A_T1) < c) {
            take(s, s->l[A_B1 - 1].tail);
            if (full) {
                uint32_t v = arc_replace(p, s, 0);
                if (v == RB_PKEY_NONE)
                    return 0;
                *victim = v;
            }
        } else {
            uint32_t v = unpinned_tail(p, s, A_T1);
            if (v == RB_PKEY_NONE)
                return 0;
            take(s, v); /* straight out, no ghost: B1 is empty */
            *victim = v;
        }
    } else {
        uint32_t total = l1 + LN(s, A_T2) + LN(s, A_B2);
        if (total >= c) {
            if (total >= 2 * c && LN(s, A_B2) > 0)
                take(s, s->l[A_B2 - 1].tail);
            if (full) {
                uint32_t v = arc_replace(p, s, 0);
                if (v == RB_PKEY_NONE)
                    return 0;
                *victim = v;
            }
        }
    }
    put(s, A_T1, k);
    return 1;
}

/* Ghost lists back within |T1| + |B1| <= c and all four lists <= 2c. */
static void arc_trim_ghosts(rb_policy *p, multi_state *s)
{
    uint32_t c = p->cfg.capacity;
    while (LN(s, A_T1) + LN(s, A_B1) > c && LN(s, A_B1) > 0)
        take(s, s->l[A_B1 - 1].tail);
    while (LN(s, A_T1) + LN(s, A_B1) + LN(s, A_T2) + LN(s, A_B2) > 2 * c) {
        uint8_t w = LN(s, A_B2) > 0 ? A_B2 : A_B1;
        if (LN(s, w) == 0)
            break;
        take(s, s->l[w - 1].tail);
    }
}

static uint32_t arc_evict(rb_policy *p)
{
    multi_state *s = p->impl;
    uint32_t v = arc_replace(p, s, 0);
    if (v != RB_PKEY_NONE)
        arc_trim_ghosts(p, s);
    return v;
}

static rb_status arc_resize(rb_policy *p, uint32_t old_capacity, rb_error *err)
{
    (void)old_capacity, (void)err;
    multi_state *s = p->impl;
    if (s->p > p->cfg.capacity)
        s->p = p->cfg.capacity;
    arc_trim_ghosts(p, s);
    return RB_OK;
}

const rb_policy_methods rb_policy_arc = {
    "arc", "adaptive replacement cache: T1/T2 with ghosts B1/B2", 0,
    arc_bytes, arc_init, multi_destroy, arc_hit, arc_miss, arc_evict, arc_resize,
};

/* ---- lirs ---------------------------------------------------------------------------- */

enum { L_NONE = 0, L_LIR = 1, L_HIR = 2, L_HIR_GHOST = 3 };
/* S uses prev/next and l[0]; Q uses qprev/qnext and l[1] */

static size_t lirs_bytes(const rb_policy_config *cfg)
{
    return sizeof(multi_state) + 18 * (size_t)cfg->n_keys;
}

static rb_status lirs_init(rb_policy *p, rb_error *err)
{
    rb_status st = multi_alloc(p, 1, err);
    if (st != RB_OK)
        return st;
    multi_state *s = p->impl;
    uint32_t hir = p->cfg.capacity / 100 ? p->cfg.capacity / 100 : 1;
    s->l_lir = p->cfg.capacity - (hir < p->cfg.capacity ? hir : p->cfg.capacity);
    return RB_OK;
}

static void s_push(multi_state *s, uint32_t k)
{
    if (s->in_s[k])
        rb_plist_remove(&s->l[0], s->prev, s->next, k);
    rb_plist_push_head(&s->l[0], s->prev, s->next, k);
    s->in_s[k] = 1;
}

static void s_drop(multi_state *s, uint32_t k)
{
    rb_plist_remove(&s->l[0], s->prev, s->next, k);
    s->in_s[k] = 0;
}

static void q_push(multi_state *s, uint32_t k)
{
    rb_plist_push_head(&s->l[1], s->qprev, s->qnext, k);
}

static void q_drop(multi_state *s, uint32_t k)
{
    rb_plist_remove(&s->l[1], s->qprev, s->qnext, k);
}

/* Stack pruning: the bottom of S must be a LIR block. */
static void lirs_prune(multi_state *s)
{
    while (s->l[0].tail != RB_PKEY_NONE && s->where[s->l[0].tail] != L_LIR) {
        uint32_t y = s->l[0].tail;
        s_drop(s, y);
        if (s->where[y] == L_HIR_GHOST)
            s->where[y] = L_NONE;
    }
}

/* The bottom LIR block of S becomes a resident HIR block at Q's end. */
static void lirs_demote_bottom(multi_state *s, uint32_t except)
{
    uint32_t y = s->l[0].tail;
    if (y == RB_PKEY_NONE || y == except || s->where[y] != L_LIR)
        return;
    s_drop(s, y);
    s->where[y] = L_HIR;
    q_push(s, y);
    s->n_lir--;
    lirs_prune(s);
}

static void lirs_hit(rb_policy *p, uint32_t k, uint64_t now)
{
    (void)now;
    multi_state *s = p->impl;
    if (s->where[k] == L_LIR) {
        int was_bottom = s->l[0].tail == k;
        s_push(s, k);
        if (was_bottom)
            lirs_prune(s);
        return;
    }
    /* resident HIR */
    if (s->in_s[k] && s->l_lir > 0) {
        s_push(s, k);
        q_drop(s, k);
        s->where[k] = L_LIR;
        s->n_lir++;
        lirs_demote_bottom(s, k);
    } else {
        s_push(s, k);
        q_drop(s, k);
        q_push(s, k);
    }
}

/* The front of Q (its tail here) leaves the cache and stays in S as a
 * ghost; pinned ones rotate to Q's end. RB_PKEY_NONE if none can go. */
static uint32_t lirs_q_victim(rb_policy *p, multi_state *s)
{
    rb_plist *q = &s->l[1];
    for (uint32_t tries = 0; q->tail != RB_PKEY_NONE && tries <= q->n; tries++) {
        uint32_t v = q->tail;
        q_drop(s, v);
        if (!rb_policy_is_pinned(p, v)) {
            s->where[v] = s->in_s[v] ? L_HIR_GHOST : L_NONE;
            return v;
        }
        q_push(s, v);
    }
    return RB_PKEY_NONE;
}

static int lirs_miss(rb_policy *p, uint32_t k, uint64_t now, uint32_t *victim)
{
    (void)now;
    multi_state *s = p->impl;
    if (p->n_resident >= p->cfg.capacity) {
        uint32_t v = lirs_q_victim(p, s);
        if (v == RB_PKEY_NONE)
            return 0;
        *victim = v;
    }
    if (s->n_lir < s->l_lir && s->where[k] != L_HIR_GHOST) {
        s->where[k] = L_LIR; /* warm-up: the first blocks fill the LIR set */
        s->n_lir++;
        s_push(s, k);
    } else if (s->where[k] == L_HIR_GHOST && s->l_lir > 0) {
        s_push(s, k);
        s->where[k] = L_LIR;
        s->n_lir++;
        if (s->n_lir > s->l_lir)
            lirs_demote_bottom(s, k);
    } else {
        s_push(s, k);
        s->where[k] = L_HIR;
        q_push(s, k);
    }
    return 1;
}

static uint32_t lirs_evict(rb_policy *p)
{
    multi_state *s = p->impl;
    uint32_t v = lirs_q_victim(p, s);
    if (v != RB_PKEY_NONE)
        return v;
    /* no resident HIR block can go: the oldest unpinned LIR block does */
    for (v = s->l[0].tail; v != RB_PKEY_NONE; v = s->prev[v])
        if (s->where[v] == L_LIR && !rb_policy_is_pinned(p, v))
            break;
    if (v == RB_PKEY_NONE)
        return v;
    s_drop(s, v);
    s->where[v] = L_NONE;
    s->n_lir--;
    lirs_prune(s);
    return v;
}

/* The LIR set follows the capacity: a smaller one demotes the bottom LIR
 * blocks of S to resident HIR blocks, which evictions then take first. */
static rb_status lirs_resize(rb_policy *p, uint32_t old_capacity, rb_error *err)
{
    (void)old_capacity, (void)err;
    multi_state *s = p->impl;
    uint32_t c = p->cfg.capacity, hir = c / 100 ? c / 100 : 1;
    s->l_lir = c - (hir < c ? hir : c);
    while (s->n_lir > s->l_lir && s->l[0].tail != RB_PKEY_NONE &&
           s->where[s->l[0].tail] == L_LIR)
        lirs_demote_bottom(s, RB_PKEY_NONE);
    return RB_OK;
}

const rb_policy_methods rb_policy_lirs = {
    "lirs", "low inter-reference recency set (c - c/100 LIR, HIR queue)", 0,
    lirs_bytes, lirs_init, multi_destroy, lirs_hit, lirs_miss, lirs_evict, lirs_resize,
};
