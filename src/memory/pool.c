/*
 * pool.c - the memory pool (pool.h): members, accounts, the order in which
 * memory is taken back, and the public rb_pool_* calls.
 *
 * Layout: a small array of members (sessions of one model: a handful to a
 * few hundred), each with its published bytes (atomic), priority and the
 * pool tick of its last use. The weights are the model's weight cache,
 * whose resident bytes it counts itself.
 *
 * Memory: the pool struct and the member array (grown by doubling); a
 * member struct per joined session, freed when it leaves. The pool is
 * freed when the app destroyed it (or its owner session did, for a
 * session's own pool) and the last member left.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pool.h"
#include "pressure.h"
#include "status.h"

struct rb_pool_member {
    rb_pool *pool;
    rb_residency *res;    /* the member's KV, trimmed here (NULL: none) */
    rb_session *handle;   /* the app's, for rb_pool_next_to_close */
    _Atomic uint64_t bytes;
    _Atomic uint64_t prefetch_bytes; /* RAM its open prefetch may still take
                                        (a reservation in the total: the
                                        restored pages are in no published
                                        count until the session settles) */
    rb_priority priority; /* under the pool's mu */
    uint64_t last_used;   /* under the pool's mu */
    uint64_t n_feeds;     /* its feeds (mu) */
    uint64_t feeds_mark;  /* the pool's n_feeds after its last feed (mu) */
};

struct rb_pool {
    pthread_mutex_t mu;
    rb_model *model;
    _Atomic uint64_t budget;
    rb_wcache *weights;          /* NULL: weights_fixed counts them */
    uint64_t weights_fixed;
    uint64_t base;               /* rb_pool_count_process: what the process
                                    held besides the weights and the members
                                    (the model's metadata and tokenizer, the
                                    app's heap, thread stacks); never trimmed */
    rb_kvshare *kvshare;         /* KV pages several members hold (forks),
                                    counted here once and in no member's
                                    bytes (kvcache.h); atomic, its own lifetime */
    rb_pool_member **members;
    uint32_t n_members, cap;
    uint64_t tick;
    int is_destroyed;            /* the app let go: freed with its last member */
    /* counters (under mu) */
    uint64_t n_enforce, n_posted, trimmed_bytes, weights_released_bytes, over_bytes;
    uint64_t n_feeds;            /* every member's feeds (the prefetch score) */
    uint64_t n_prefetches, prefetch_granted_bytes, prefetch_trimmed_bytes;
    uint64_t n_leveled, level_line; /* trim_leveled's count and last line */
    uint64_t n_shared_trims;        /* enforcements that took shared pages */
    /* the pressure monitor (rb_pool_watch_pressure); its thread calls
       rb_pool_trim. watch_mu orders start, stop and destroy. */
    pthread_mutex_t watch_mu;
    rb_pressure_monitor *monitor;
    _Atomic uint64_t n_pressure[4]; /* by rb_pressure_level */
    char watch_source[256];
};

/* The process's anonymous resident memory now, less the model's loaded
 * weights (the pool counts those itself): the part of "what the process
 * holds" no session and no weight cache accounts for. 0 where
 * /proc/self/statm cannot be read. */
static uint64_t process_base(const rb_model *model)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0, shared = 0;
    if (!f)
        return 0;
    int n = fscanf(f, "%lu %lu %lu", &size, &res, &shared);
    fclose(f);
    if (n != 3 || res < shared)
        return 0;
    uint64_t anon = (uint64_t)(res - shared) * (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t w = rb_model_loaded_bytes(model);
    return anon > w ? anon - w : 0;
}

rb_status rb_pool_create_impl(rb_model *model, uint64_t budget_bytes, rb_pool **out,
                              rb_error *err)
{
    if (!model || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "pool: model and out are required");
    rb_pool *p = calloc(1, sizeof *p);
    if (p && !(p->kvshare = rb_kvshare_create())) {
        free(p);
        p = NULL;
    }
    if (!p)
        return rb_error_set(err, RB_E_NOMEM, "pool: out of memory");
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->watch_mu, NULL);
    p->model = model;
    atomic_init(&p->budget, budget_bytes);
    rb_model_info info;
    rb_model_get_info(model, &info);
    p->weights_fixed = info.tensor_data_bytes;
    *out = p;
    return RB_OK;
}

rb_status rb_pool_create(rb_model *model, uint64_t budget_bytes, rb_pool **out, rb_error *err)
{
    return rb_pool_create_impl(model, budget_bytes, out, err);
}

static void pool_free(rb_pool *p)
{
    pthread_mutex_destroy(&p->watch_mu);
    pthread_mutex_destroy(&p->mu);
    free(p->members);
    rb_kvshare_release(p->kvshare); /* a cache that still shares keeps it */
    free(p);
}

void rb_pool_destroy(rb_pool *p)
{
    if (!p)
        return;
    rb_pool_unwatch_pressure(p); /* no trim comes from its thread after this */
    pthread_mutex_lock(&p->mu);
    p->is_destroyed = 1;
    int last = p->n_members == 0;
    pthread_mutex_unlock(&p->mu);
    if (last)
        pool_free(p);
}

rb_model *rb_pool_model(const rb_pool *p) { return p->model; }
rb_kvshare *rb_pool_kvshare(rb_pool *p) { return p->kvshare; }

static uint64_t shared_bytes(const rb_pool *p)
{
    return atomic_load_explicit(&p->kvshare->bytes, memory_order_relaxed);
}

void rb_pool_set_weights(rb_pool *p, rb_wcache *weights, uint64_t fixed_bytes)
{
    pthread_mutex_lock(&p->mu);
    p->weights = weights;
    p->weights_fixed = fixed_bytes;
    pthread_mutex_unlock(&p->mu);
}

rb_status rb_pool_join(rb_pool *p, rb_residency *res, rb_priority priority, rb_session *handle,
                       rb_pool_member **out, rb_error *err)
{
    rb_pool_member *m = calloc(1, sizeof *m);
    if (!m)
        return rb_error_set(err, RB_E_NOMEM, "pool: out of memory");
    m->pool = p;
    m->res = res;
    m->handle = handle;
    m->priority = priority;
    pthread_mutex_lock(&p->mu);
    if (p->n_members == p->cap) {
        uint32_t cap = p->cap ? p->cap * 2 : 8;
        rb_pool_member **a = realloc(p->members, cap * sizeof *a);
        if (!a) {
            pthread_mutex_unlock(&p->mu);
            free(m);
            return rb_error_set(err, RB_E_NOMEM, "pool: out of memory");
        }
        p->members = a;
        p->cap = cap;
    }
    m->last_used = ++p->tick;
    p->members[p->n_members++] = m;
    pthread_mutex_unlock(&p->mu);
    *out = m;
    return RB_OK;
}

void rb_pool_leave(rb_pool_member *m)
{
    if (!m)
        return;
    rb_pool *p = m->pool;
    pthread_mutex_lock(&p->mu);
    for (uint32_t i = 0; i < p->n_members; i++)
        if (p->members[i] == m) {
            p->members[i] = p->members[--p->n_members];
            break;
        }
    int last = p->is_destroyed && p->n_members == 0;
    pthread_mutex_unlock(&p->mu);
    free(m);
    if (last)
        pool_free(p);
}

void rb_pool_member_set_residency(rb_pool_member *m, rb_residency *res)
{
    pthread_mutex_lock(&m->pool->mu);
    m->res = res;
    pthread_mutex_unlock(&m->pool->mu);
}

void rb_pool_member_set_bytes(rb_pool_member *m, uint64_t bytes)
{
    atomic_store_explicit(&m->bytes, bytes, memory_order_relaxed);
}

void rb_pool_member_touch(rb_pool_member *m)
{
    pthread_mutex_lock(&m->pool->mu);
    m->last_used = ++m->pool->tick;
    m->n_feeds++;
    m->feeds_mark = ++m->pool->n_feeds;
    pthread_mutex_unlock(&m->pool->mu);
}

void rb_pool_member_set_priority(rb_pool_member *m, rb_priority priority)
{
    pthread_mutex_lock(&m->pool->mu);
    m->priority = priority;
    pthread_mutex_unlock(&m->pool->mu);
}

rb_priority rb_pool_member_priority(const rb_pool_member *m)
{
    rb_pool *p = m->pool;
    pthread_mutex_lock(&p->mu);
    rb_priority r = m->priority;
    pthread_mutex_unlock(&p->mu);
    return r;
}

uint64_t rb_pool_budget(const rb_pool *p) { return atomic_load(&p->budget); }

/* mu held */
static uint64_t weights_bytes(const rb_pool *p)
{
    return p->weights ? rb_wcache_resident_bytes(p->weights) : p->weights_fixed;
}

/* mu held */
static uint64_t total_bytes(const rb_pool *p)
{
    uint64_t t = weights_bytes(p) + p->base + shared_bytes(p);
    for (uint32_t i = 0; i < p->n_members; i++)
        t += atomic_load_explicit(&p->members[i]->bytes, memory_order_relaxed) +
             atomic_load_explicit(&p->members[i]->prefetch_bytes, memory_order_relaxed);
    return t;
}

/* Every open prefetch but except's stops (mu held): a prefetch never holds
 * memory the budget wants back, so any trim cancels them first. What they
 * restored stays (resident, in the member's count from now on: it grew by
 * what its manager grew) and is trimmed like any page; their reservations
 * go. A member held by its session is settled by that session's next step
 * (its feed or trim), not here. */
static void cancel_prefetches(rb_pool *p, const rb_pool_member *except)
{
    for (uint32_t i = 0; i < p->n_members; i++) {
        rb_pool_member *m = p->members[i];
        uint64_t growth = 0;
        if (m == except || !m->res ||
            !atomic_load_explicit(&m->prefetch_bytes, memory_order_relaxed) ||
            !rb_residency_pool_stop_prefetch(m->res, &growth))
            continue;
        atomic_fetch_add_explicit(&m->bytes, growth, memory_order_relaxed);
        atomic_store_explicit(&m->prefetch_bytes, 0, memory_order_relaxed);
    }
}

uint64_t rb_pool_others_bytes(rb_pool *p, const rb_pool_member *self)
{
    pthread_mutex_lock(&p->mu);
    uint64_t t = total_bytes(p);
    uint64_t own = self ? atomic_load_explicit(&self->bytes, memory_order_relaxed) : 0;
    pthread_mutex_unlock(&p->mu);
    return t > own ? t - own : 0;
}

/* Takes memory back from one member (mu held): its KV only, never the
 * model's weights (released by the pool itself, after every member's KV);
 * for the budget (bytes) to storage, compressed pages too, because a page
 * there frees all of its RAM and a compressed one a fraction (a level, the
 * app-switch moment, keeps the two-path split). The member's residency
 * trims now, or records the request for the thread that holds it
 * (counted as posted). own: a budget trim leaves the pages that other
 * members hold too (RB_TRIM_SCOPE_KV_OWN: letting one go frees no RAM,
 * and each holder would read it back); rb_pool_enforce takes them only
 * when nothing else is left. The member's published bytes go down by
 * what its residency counts as freed. Returns the bytes freed now. */
static uint64_t trim_member(rb_pool *p, rb_pool_member *m, uint64_t bytes, rb_trim_level level,
                            int own, rb_residency *sink)
{
    if (!m->res)
        return 0;
    const rb_trim_scope scope = level != RB_TRIM_BYTES ? RB_TRIM_SCOPE_KV
                                : own                  ? RB_TRIM_SCOPE_KV_OWN
                                                       : RB_TRIM_SCOPE_KV_TO_STORAGE;
    uint64_t freed = 0, drop = 0;
    if (!rb_residency_pool_trim(m->res, bytes, level, scope, sink, &freed, &drop)) {
        p->n_posted++; /* busy: served at its next layer boundary */
        return 0;
    }
    uint64_t b = atomic_load_explicit(&m->bytes, memory_order_relaxed);
    atomic_store_explicit(&m->bytes, b > drop ? b - drop : 0, memory_order_relaxed);
    return freed;
}

/* The members in trim order (mu held): background before foreground, least
 * recently used first, `last` (may be NULL) at the end. */
static uint32_t trim_order(const rb_pool *p, const rb_pool_member *last, rb_pool_member **out)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->n_members; i++)
        if (p->members[i] != last)
            out[n++] = p->members[i];
    /* insertion sort: few members */
    for (uint32_t i = 1; i < n; i++) {
        rb_pool_member *m = out[i];
        uint32_t j = i;
        while (j > 0 && (out[j - 1]->priority < m->priority ||
                         (out[j - 1]->priority == m->priority &&
                          out[j - 1]->last_used > m->last_used))) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = m;
    }
    if (last)
        out[n++] = (rb_pool_member *)last;
    return n;
}

/* A member's KV in RAM, its own and the shared pages it holds (mu held;
 * takes its residency's mu, below). */
static rb_residency_bytes member_bytes(const rb_pool_member *m)
{
    rb_residency_bytes b = {0};
    if (m->res)
        rb_residency_get_bytes(m->res, &b);
    return b;
}

/*
 * The budget's trim (mu held): `need` bytes from the members of `order`
 * (in trim order) of one priority, leveled. Returns the bytes freed.
 *
 * Which conversation returns next is not known, and a return's wait is
 * the bytes it must read back: so the members give from their KV down to
 * one water line, the fullest first, each from its last layers. Every
 * conversation keeps the same share of first layers, and a return's
 * restore is the rest, overlapped by the pass computing those layers; the
 * least recently used one given away whole would make some returns read
 * all of theirs. Members held by a session (posted) or with pinned pages
 * free less now; the caller goes on in trim order for what is left.
 */
static uint64_t trim_leveled(rb_pool *p, rb_pool_member **order, uint32_t n,
                             rb_priority priority, const rb_pool_member *skip, uint64_t need,
                             rb_residency *sink)
{
    enum { MAX_LEVEL = 256 };
    rb_pool_member *c[MAX_LEVEL];
    uint64_t kv[MAX_LEVEL];
    uint32_t k = 0;
    for (uint32_t i = 0; i < n && k < MAX_LEVEL; i++) {
        if (order[i] == skip || order[i]->priority != priority || !order[i]->res)
            continue;
        uint64_t b = member_bytes(order[i]).kv_ram_bytes;
        if (!b)
            continue;
        /* insertion by KV, the fullest first (ties: trim order) */
        uint32_t j = k++;
        while (j > 0 && kv[j - 1] < b) {
            c[j] = c[j - 1];
            kv[j] = kv[j - 1];
            j--;
        }
        c[j] = order[i];
        kv[j] = b;
    }
    if (!k)
        return 0;
    /* the line: the top t members down to it free `need`; below it the
       rest keep what they have */
    uint64_t sum = 0, line = 0;
    uint32_t t = 0;
    while (t < k) {
        sum += kv[t++];
        const uint64_t next = t < k ? kv[t] : 0;
        if (sum - (uint64_t)t * next >= need) {
            line = (sum - need + t - 1) / t; /* up: the shares never pass need */
            break;
        }
    }
    p->n_leveled++;
    p->level_line = line;
    /* a member frees whole pages, so at least what it is asked: what one
       gave beyond its share is asked less of the next */
    uint64_t freed = 0, gone = 0, share = 0; /* gone: as the members count it */
    for (uint32_t i = 0; i < t && gone < need; i++) {
        if (kv[i] <= line)
            continue;
        share += kv[i] - line;
        if (share <= gone)
            continue;
        freed += trim_member(p, c[i], share - gone, RB_TRIM_BYTES, 1, sink);
        const uint64_t now = member_bytes(c[i]).kv_ram_bytes;
        gone += kv[i] > now ? kv[i] - now : 0;
    }
    return freed;
}

/* Releases weights, last layer first, until `need` bytes went (mu held). */
static uint64_t release_weights(rb_pool *p, uint64_t need)
{
    if (!p->weights)
        return 0;
    uint64_t freed = rb_wcache_release_last(p->weights, need);
    p->weights_released_bytes += freed;
    return freed;
}

uint64_t rb_pool_enforce(rb_pool *p, rb_pool_member *self, uint64_t extra, int self_too,
                         int weights_too)
{
    const uint64_t budget = atomic_load(&p->budget);
    if (!budget)
        return 0;
    pthread_mutex_lock(&p->mu);
    p->n_enforce++;
    uint64_t total = total_bytes(p) + extra;
    if (total > budget && p->n_members) {
        cancel_prefetches(p, NULL);
        total = total_bytes(p) + extra;
    }
    if (total > budget && p->n_members) {
        rb_pool_member **order = malloc(p->n_members * sizeof *order);
        uint32_t n = order ? trim_order(p, self, order) : 0;
        /* room for self's feed: the others' freed page buffers go to its
           restore (rb_residency_open_spare) */
        rb_residency *sink = extra && !self_too && self ? self->res : NULL;
        /* the others leveled, background before foreground; then in trim
           order what they could not give now, self last */
        for (int pr = RB_PRIORITY_BACKGROUND; pr >= RB_PRIORITY_FOREGROUND && total > budget;
             pr--) {
            p->trimmed_bytes += trim_leveled(p, order, n, (rb_priority)pr, self, total - budget,
                                             sink);
            total = total_bytes(p) + extra;
        }
        for (uint32_t i = 0; i < n && total > budget; i++) {
            if (order[i] == self && !self_too)
                continue;
            p->trimmed_bytes += trim_member(p, order[i], total - budget, RB_TRIM_BYTES, 1, sink);
            total = total_bytes(p) + extra;
        }
        /* the pages several members share, last: each holder lets go of
           the same ones (residency.c: in its trim order, as many bytes as
           asked), and the RAM goes with the last holder. Not while self
           holds some and is not trimmed: the others would let go of pages
           that stay; its own trim after the feed takes them with it */
        const int shared_pass = total > budget && shared_bytes(p) &&
                                (self_too || !self || !member_bytes(self).kv_shared_bytes);
        p->n_shared_trims += shared_pass;
        for (uint32_t i = 0; shared_pass && i < n && total > budget; i++) {
            if (order[i] == self && !self_too)
                continue;
            p->trimmed_bytes += trim_member(p, order[i], total - budget, RB_TRIM_BYTES, 0, sink);
            total = total_bytes(p) + extra;
        }
        free(order);
        if (total > budget && weights_too)
            release_weights(p, total - budget);
        total = total_bytes(p) + extra;
    }
    p->over_bytes = total > budget ? total - budget : 0;
    uint64_t over = p->over_bytes;
    pthread_mutex_unlock(&p->mu);
    return over;
}

rb_status rb_pool_count_process(rb_pool *p)
{
    if (!p)
        return RB_E_INVALID_ARG;
    uint64_t base = process_base(p->model);
    pthread_mutex_lock(&p->mu);
    /* the sessions' own bytes are in the process's too: not twice */
    uint64_t members = shared_bytes(p);
    for (uint32_t i = 0; i < p->n_members; i++)
        members += atomic_load_explicit(&p->members[i]->bytes, memory_order_relaxed);
    p->base = base > members ? base - members : 0;
    pthread_mutex_unlock(&p->mu);
    return RB_OK;
}

rb_status rb_pool_set_budget(rb_pool *p, uint64_t budget_bytes)
{
    if (!p)
        return RB_E_INVALID_ARG;
    atomic_store(&p->budget, budget_bytes);
    rb_pool_enforce(p, NULL, 0, 1, 1);
    return RB_OK;
}

rb_status rb_pool_trim(rb_pool *p, uint64_t bytes, rb_trim_level level, uint64_t *freed_out)
{
    if (!p || (unsigned)level > RB_TRIM_COMPLETE)
        return RB_E_INVALID_ARG;
    uint64_t freed = 0;
    pthread_mutex_lock(&p->mu);
    rb_pool_member **order = p->n_members ? malloc(p->n_members * sizeof *order) : NULL;
    uint32_t n = order ? trim_order(p, NULL, order) : 0;
    if (p->n_members && !order) {
        pthread_mutex_unlock(&p->mu);
        return RB_E_NOMEM;
    }
    cancel_prefetches(p, NULL);
    for (uint32_t i = 0; i < n; i++) {
        if (level == RB_TRIM_BYTES && freed >= bytes)
            break;
        freed += trim_member(p, order[i], level == RB_TRIM_BYTES ? bytes - freed : 0, level, 0,
                             NULL);
    }
    free(order);
    p->trimmed_bytes += freed;
    if (level == RB_TRIM_COMPLETE)
        freed += release_weights(p, UINT64_MAX);
    else if (level == RB_TRIM_BYTES && freed < bytes)
        freed += release_weights(p, bytes - freed);
    pthread_mutex_unlock(&p->mu);
    if (freed_out)
        *freed_out = freed;
    return RB_OK;
}

rb_session *rb_pool_next_to_close(rb_pool *p, uint32_t max_sessions)
{
    if (!p)
        return NULL;
    const uint64_t budget = atomic_load(&p->budget);
    rb_session *pick = NULL;
    pthread_mutex_lock(&p->mu);
    int over = (budget && total_bytes(p) > budget) ||
               (max_sessions && p->n_members > max_sessions);
    const rb_pool_member *lru = NULL;
    for (uint32_t i = 0; over && i < p->n_members; i++) {
        const rb_pool_member *m = p->members[i];
        if (m->priority == RB_PRIORITY_BACKGROUND && m->handle &&
            (!lru || m->last_used < lru->last_used))
            lru = m;
    }
    if (lru)
        pick = lru->handle;
    pthread_mutex_unlock(&p->mu);
    return pick;
}

/* A trim for a grant (mu held): counts what it freed, takes the new total
 * (*total: the one before), returns the budget's room now. */
static uint64_t count_grant_trim(rb_pool *p, uint64_t freed, uint64_t budget, uint64_t *total)
{
    p->trimmed_bytes += freed;
    const uint64_t after = total_bytes(p);
    if (after < *total)
        p->prefetch_trimmed_bytes += *total - after;
    *total = after;
    return budget > after ? budget - after : 0;
}

uint64_t rb_pool_grant_prefetch(rb_pool *p, rb_pool_member *self, uint64_t want,
                                int trim_background)
{
    const uint64_t budget = atomic_load(&p->budget);
    pthread_mutex_lock(&p->mu);
    uint64_t grant = want;
    if (budget) {
        uint64_t total = total_bytes(p);
        uint64_t room = budget > total ? budget - total : 0;
        if (room < want && trim_background && p->n_members) {
            /* a foreground session's restore: the others' prefetches go
               first, then background sessions, leveled; never a
               foreground one */
            cancel_prefetches(p, self);
            total = total_bytes(p);
            room = budget > total ? budget - total : 0;
            rb_pool_member **order = malloc(p->n_members * sizeof *order);
            uint32_t n = order ? trim_order(p, self, order) : 0;
            rb_residency *sink = self->res; /* the freed buffers: its restore's */
            /* leveled first (trim_leveled), then in trim order */
            if (n)
                room = count_grant_trim(p, trim_leveled(p, order, n, RB_PRIORITY_BACKGROUND,
                                                        self, want - room, sink),
                                        budget, &total);
            for (uint32_t i = 0; i < n && room < want; i++) {
                if (order[i] == self || order[i]->priority != RB_PRIORITY_BACKGROUND)
                    continue;
                room = count_grant_trim(p, trim_member(p, order[i], want - room, RB_TRIM_BYTES,
                                                       1, sink),
                                        budget, &total);
            }
            free(order);
        }
        grant = want < room ? want : room;
    }
    atomic_store_explicit(&self->prefetch_bytes, grant, memory_order_relaxed);
    pthread_mutex_unlock(&p->mu);
    return grant;
}

void rb_pool_member_set_prefetch(rb_pool_member *m, uint64_t planned)
{
    rb_pool *p = m->pool;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&m->prefetch_bytes, planned, memory_order_relaxed);
    if (planned) {
        p->n_prefetches++;
        p->prefetch_granted_bytes += planned;
    }
    pthread_mutex_unlock(&p->mu);
}

/* The score of a member's return (mu held): feeds / (1 + the other
 * members' feeds since its last one). Frequent members score high, and a
 * member's score halves, thirds... as the others go on without it: a
 * frequency decayed by recency, with no clock and no tuning. */
static double return_score(const rb_pool *p, const rb_pool_member *m)
{
    return (double)m->n_feeds / (1.0 + (double)(p->n_feeds - m->feeds_mark));
}

uint32_t rb_pool_prefetch_candidates(rb_pool *p, rb_session **out, uint32_t max)
{
    pthread_mutex_lock(&p->mu);
    rb_pool_member **c = p->n_members ? malloc(p->n_members * sizeof *c) : NULL;
    uint32_t n = 0;
    for (uint32_t i = 0; c && i < p->n_members; i++) {
        rb_pool_member *m = p->members[i];
        if (m->handle && m->res && !atomic_load(&m->prefetch_bytes) &&
            rb_residency_restore_need(m->res) > 0)
            c[n++] = m;
    }
    for (uint32_t i = 1; i < n; i++) { /* by score, then the most recent first */
        rb_pool_member *m = c[i];
        const double sm = return_score(p, m);
        uint32_t j = i;
        while (j > 0) {
            const double sj = return_score(p, c[j - 1]);
            if (sj > sm || (sj == sm && c[j - 1]->last_used > m->last_used))
                break;
            c[j] = c[j - 1];
            j--;
        }
        c[j] = m;
    }
    if (n > max)
        n = max;
    for (uint32_t i = 0; i < n; i++)
        out[i] = c[i]->handle;
    pthread_mutex_unlock(&p->mu);
    free(c);
    return n;
}

rb_status rb_pool_get_stats_sized(const rb_pool *cp, rb_pool_stats *out, size_t out_size)
{
    if (!cp || !out || !out_size)
        return RB_E_INVALID_ARG;
    rb_pool *p = (rb_pool *)cp; /* the lock is not part of the value */
    rb_pool_stats st;
    memset(&st, 0, sizeof st);
    pthread_mutex_lock(&p->mu);
    st.budget_bytes = atomic_load(&p->budget);
    st.weights_bytes = weights_bytes(p);
    st.total_bytes = total_bytes(p);
    st.base_bytes = p->base;
    st.sessions_bytes = st.total_bytes - st.weights_bytes - p->base;
    st.weights_total_bytes = p->weights ? rb_wcache_total_bytes(p->weights) : p->weights_fixed;
    st.n_sessions = p->n_members;
    for (uint32_t i = 0; i < p->n_members; i++)
        st.n_background += p->members[i]->priority == RB_PRIORITY_BACKGROUND;
    st.n_enforcements = p->n_enforce;
    st.n_trims_posted = p->n_posted;
    st.trimmed_bytes = p->trimmed_bytes;
    st.weights_released_bytes = p->weights_released_bytes;
    st.over_bytes = p->over_bytes;
    st.shared_kv_bytes = shared_bytes(p);
    st.n_shared_kv_pages = atomic_load_explicit(&p->kvshare->n_pages, memory_order_relaxed);
    st.n_prefetches = p->n_prefetches;
    st.prefetch_granted_bytes = p->prefetch_granted_bytes;
    st.prefetch_trimmed_bytes = p->prefetch_trimmed_bytes;
    st.n_leveled_trims = p->n_leveled;
    st.level_line_bytes = p->level_line;
    st.n_shared_trims = p->n_shared_trims;
    pthread_mutex_unlock(&p->mu);
    for (int l = 1; l <= 3; l++)
        st.n_pressure_events[l - 1] = atomic_load(&p->n_pressure[l]);
    pthread_mutex_lock(&p->watch_mu);
    snprintf(st.pressure_source, sizeof st.pressure_source, "%s", p->watch_source);
    pthread_mutex_unlock(&p->watch_mu);
    memcpy(out, &st, out_size < sizeof st ? out_size : sizeof st);
    return RB_OK;
}

/* ---- pressure ----------------------------------------------------------------- */

static void on_pressure(void *ctx, const rb_pressure_event *ev)
{
    rb_pool *p = ctx;
    if (ev->level >= RB_PRESSURE_LOW && ev->level <= RB_PRESSURE_CRITICAL)
        atomic_fetch_add(&p->n_pressure[ev->level], 1);
    rb_pool_trim(p, 0, rb_pressure_trim_level(ev->level), NULL);
}

rb_status rb_pool_watch_pressure(rb_pool *p, const rb_pool_pressure_params *pp, rb_error *err)
{
    if (!p)
        return rb_error_set(err, RB_E_INVALID_ARG, "pool: pool is NULL");
    rb_pool_pressure_params dflt;
    memset(&dflt, 0, sizeof dflt);
    if (!pp)
        pp = &dflt;
    rb_pressure_params mp = rb_pressure_params_default();
    char dir[512];
    int is_v2 = 0;
    if (pp->cgroup_dir) {
        snprintf(dir, sizeof dir, "%s", pp->cgroup_dir);
        char probe[600];
        snprintf(probe, sizeof probe, "%s/memory.pressure", dir);
        is_v2 = access(probe, F_OK) == 0;
        mp.cgroup_dir = dir;
    } else if (!pp->is_system_wide && rb_pressure_own_cgroup(dir, sizeof dir, &is_v2) == 0) {
        mp.cgroup_dir = dir;
    }
    mp.cgroup_is_v2 = is_v2;
    if (pp->window_ms)
        mp.psi_window_us = pp->window_ms * 1000u;
    if (pp->low_some_ms)
        mp.psi_low_some_us = pp->low_some_ms * 1000u;
    if (pp->medium_some_ms)
        mp.psi_medium_some_us = pp->medium_some_ms * 1000u;
    if (pp->critical_full_ms)
        mp.psi_critical_full_us = pp->critical_full_ms * 1000u;
    mp.on_event = on_pressure;
    mp.ctx = p;
    pthread_mutex_lock(&p->watch_mu);
    if (p->monitor) {
        pthread_mutex_unlock(&p->watch_mu);
        return rb_error_set(err, RB_E_INVALID_ARG, "pool: already watching the pressure (%s)",
                            p->watch_source);
    }
    rb_status st = rb_pressure_monitor_start(&mp, &p->monitor, err);
    if (st == RB_OK) {
        rb_pressure_info info;
        rb_pressure_monitor_info(p->monitor, &info);
        snprintf(p->watch_source, sizeof p->watch_source, "%s%s%s%s",
                 info.is_armed[RB_PRESSURE_SOURCE_PSI] ? info.psi_path : "",
                 info.is_armed[RB_PRESSURE_SOURCE_V1_LEVEL] ? " + v1 pressure_level" : "",
                 info.is_armed[RB_PRESSURE_SOURCE_V1_OOM] ? " + v1 oom_control" : "",
                 mp.cgroup_dir && !is_v2 ? " (cgroup v1)" : "");
    } else {
        p->monitor = NULL;
    }
    pthread_mutex_unlock(&p->watch_mu);
    return st;
}

void rb_pool_unwatch_pressure(rb_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->watch_mu);
    rb_pressure_monitor *m = p->monitor;
    p->monitor = NULL;
    p->watch_source[0] = 0;
    pthread_mutex_unlock(&p->watch_mu);
    rb_pressure_monitor_destroy(m); /* joins its thread: no trim after */
}
