/*
 * policy.c - the policy core: method lookup, the fetch steps, in-use pins,
 * accounting (contract and the steps in policy.h).
 *
 * Memory layout of one policy (all from malloc at create, nothing per
 * fetch):
 *
 *   rb_policy  { methods, config, counters }
 *   resident[n_keys]  1 byte per key: cached or not (the core owns it, so a
 *                     hit is decided in one load whatever the method)
 *   pins[n_keys]      1 byte per key: in-use count, saturating
 *   impl              the method's own state (policy_*.c), typically one or
 *                     two u32 link arrays over keys and a few list heads
 *
 * Invariants: n_resident == number of keys with resident[k] == 1 and
 * <= capacity; a method's miss() returns a victim only when the cache was
 * full, and the victim is resident and unpinned.
 */
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "status.h"

static const rb_policy_methods *const methods[] = {
    &rb_policy_lru, &rb_policy_fifo, &rb_policy_clock, &rb_policy_2q, &rb_policy_arc,
    &rb_policy_lirs, &rb_policy_mru, &rb_policy_class, &rb_policy_opt,
};
#define N_METHODS (int)(sizeof methods / sizeof methods[0])

int rb_policy_count(void) { return N_METHODS; }
const rb_policy_methods *rb_policy_at(int i) { return i >= 0 && i < N_METHODS ? methods[i] : NULL; }

const rb_policy_methods *rb_policy_find(const char *name)
{
    for (int i = 0; name && i < N_METHODS; i++)
        if (strcmp(methods[i]->name, name) == 0)
            return methods[i];
    return NULL;
}

/* The class policy's stream window for a capacity: as asked, at most the
 * capacity; by default min(16, capacity / 64) and at least 1 block. 16
 * blocks is one 64 KiB stream step; a 64-block window cost the class
 * policy 3% of hit ratio on a 2048-block loop (measured). */
static uint32_t window_for(uint32_t asked, uint32_t capacity)
{
    uint32_t w = asked;
    if (w == 0) {
        w = capacity / 64;
        w = w < 1 ? 1 : w > 16 ? 16 : w;
    }
    return w > capacity ? capacity : w;
}

rb_status rb_policy_create(const char *name, const rb_policy_config *cfg, rb_policy **out,
                           rb_error *err)
{
    const rb_policy_methods *m = rb_policy_find(name);
    if (!m)
        return rb_error_set(err, RB_E_NOT_FOUND, "policy: unknown policy '%s' (lru, fifo, clock, "
                            "2q, arc, lirs, mru, class, opt)", name ? name : "(null)");
    if (cfg->capacity == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "policy %s: capacity must be at least 1 block",
                            name);
    if (m->needs_future && !cfg->next_use)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "policy %s: needs the future (a next-use index over the trace); "
                            "only the simulator can run it", name);
    rb_policy *p = calloc(1, sizeof *p);
    if (!p)
        return rb_error_set(err, RB_E_NOMEM, "policy: out of memory");
    p->m = m;
    p->cfg = *cfg;
    if (p->cfg.capacity > p->cfg.n_keys && p->cfg.n_keys > 0)
        p->cfg.capacity = p->cfg.n_keys; /* more room than blocks: same result, less memory */
    p->window_req = cfg->window;
    p->cfg.window = window_for(p->window_req, p->cfg.capacity);
    size_t nk = cfg->n_keys ? cfg->n_keys : 1;
    p->resident = calloc(nk, 1);
    p->pins = calloc(nk, 1);
    if (!p->resident || !p->pins) {
        rb_policy_destroy(p);
        return rb_error_set(err, RB_E_NOMEM, "policy %s: out of memory for %u keys", name,
                            cfg->n_keys);
    }
    rb_status st = m->init(p, err);
    if (st != RB_OK) {
        p->impl = NULL;
        rb_policy_destroy(p);
        return st;
    }
    *out = p;
    return RB_OK;
}

void rb_policy_destroy(rb_policy *p)
{
    if (!p)
        return;
    if (p->impl)
        p->m->destroy(p);
    free(p->resident);
    free(p->pins);
    free(p);
}

int rb_policy_fetch(rb_policy *p, uint32_t key, uint64_t now, uint32_t *victim)
{
    uint32_t v = RB_PKEY_NONE;
    /* 1. resident: a hit; the method updates its recency or frequency */
    if (p->resident[key]) {
        p->m->hit(p, key, now);
        p->n_hits++;
        *victim = RB_PKEY_NONE;
        return RB_FETCH_HIT;
    }
    /* 2. a miss: the method admits or bypasses, and names a victim if full */
    int admit = p->m->miss(p, key, now, &v);
    p->n_misses++;
    /* 3. the victim leaves the cache */
    if (v != RB_PKEY_NONE) {
        p->resident[v] = 0;
        p->n_resident--;
        p->n_evictions++;
    }
    /* 4. the block enters the cache, or streams past it */
    if (admit) {
        p->resident[key] = 1;
        p->n_resident++;
    } else {
        p->n_bypass++;
    }
    *victim = v;
    return admit ? RB_FETCH_MISS : RB_FETCH_BYPASS;
}

rb_status rb_policy_set_capacity(rb_policy *p, uint32_t capacity, uint32_t *victims,
                                 uint32_t *n_victims, rb_error *err)
{
    if (n_victims)
        *n_victims = 0;
    if (capacity == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "policy %s: capacity must be at least 1 block",
                            p->m->name);
    if (p->cfg.n_keys > 0 && capacity > p->cfg.n_keys)
        capacity = p->cfg.n_keys;
    /* 1. enough unpinned blocks to give back? (checked first: on error
          nothing has changed) */
    if (p->n_resident > capacity && !p->m->needs_future) {
        uint32_t pinned = 0;
        for (uint32_t k = 0; k < p->cfg.n_keys; k++)
            pinned += p->resident[k] && p->pins[k];
        if (pinned > capacity)
            return rb_error_set(err, RB_E_BUDGET,
                                "policy %s: %u blocks are pinned in use; a capacity of %u cannot "
                                "hold them", p->m->name, pinned, capacity);
    }
    /* 2. the method's own sizes follow the new capacity */
    uint32_t old = p->cfg.capacity, old_window = p->cfg.window;
    p->cfg.capacity = capacity;
    p->cfg.window = window_for(p->window_req, capacity);
    rb_status st = p->m->resize(p, old, err);
    if (st != RB_OK) {
        p->cfg.capacity = old;
        p->cfg.window = old_window;
        return st;
    }
    /* 3. evict down to the new capacity, in the policy's order */
    uint32_t k = 0;
    while (p->n_resident > capacity) {
        uint32_t v = p->m->evict(p);
        if (v == RB_PKEY_NONE)
            break; /* cannot happen after step 1; keeps the loop finite */
        p->resident[v] = 0;
        p->n_resident--;
        p->n_evictions++;
        if (victims)
            victims[k] = v;
        k++;
    }
    if (n_victims)
        *n_victims = k;
    return RB_OK;
}

void rb_policy_pin(rb_policy *p, uint32_t key)
{
    if (p->resident[key] && p->pins[key] < 255)
        p->pins[key]++;
}

void rb_policy_unpin(rb_policy *p, uint32_t key)
{
    if (p->pins[key] > 0 && p->pins[key] < 255)
        p->pins[key]--;
}

size_t rb_policy_state_bytes(const rb_policy *p)
{
    return 2 * (size_t)p->cfg.n_keys + p->m->state_bytes(&p->cfg);
}
