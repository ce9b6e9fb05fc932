/*
 * classify.c - Algorithm 1 online (classify.h); the offline labelling of
 * whole traces is the analysis tools' (tools/analysis/classify_offline.c).
 *
 * Online layout: run_of[key] is the run a block belongs to; run_class[run]
 * its class, run_n[run] its member count. Joining B to B-1's run is a few
 * stores (run_of[B] = run(B-1), two counts), so a run is never walked; "a
 * HOT run that grows becomes SEQ" is one store to run_class. A block that
 * leaves a run by joining another leaves the old run's class untouched for
 * the blocks still in it, as in the paper; a run left empty goes on the
 * free stack and its id is reused.
 * Invariants: run_of[k] < n_runs or UINT32_MAX; run_n[r] equals the number
 * of keys with run_of == r; a run is on the free stack iff run_n[r] == 0.
 *
 * Memory: the online state's arrays (classify.h). Nothing global.
 */
#include <stdlib.h>
#include <string.h>

#include "classify.h"
#include "status.h"

static const char *class_names[] = {"none", "SEQ", "HOT", "LOOP"};

const char *rb_class_name(int cls) { return cls >= 0 && cls < 4 ? class_names[cls] : "?"; }

rb_status rb_classify_online_init(rb_classify_online *c, uint32_t n_keys, rb_error *err)
{
    memset(c, 0, sizeof *c);
    c->n_keys = n_keys;
    c->prev = UINT32_MAX;
    c->run_of = malloc((n_keys ? n_keys : 1) * sizeof *c->run_of);
    c->cap_runs = 1024;
    c->run_class = malloc(c->cap_runs);
    c->run_n = malloc(c->cap_runs * sizeof *c->run_n);
    c->free_runs = malloc(c->cap_runs * sizeof *c->free_runs);
    if (!c->run_of || !c->run_class || !c->run_n || !c->free_runs) {
        rb_classify_online_deinit(c);
        return rb_error_set(err, RB_E_NOMEM, "classify: out of memory for %u blocks", n_keys);
    }
    memset(c->run_of, 0xff, (size_t)n_keys * sizeof *c->run_of);
    return RB_OK;
}

void rb_classify_online_deinit(rb_classify_online *c)
{
    free(c->run_of);
    free(c->run_class);
    free(c->run_n);
    free(c->free_runs);
    memset(c, 0, sizeof *c);
}

size_t rb_classify_online_bytes(uint32_t n_keys) { return (size_t)n_keys * (4 + 1 + 4 + 4); }

/* A run id for a new run: a recycled one, else the next (growing the
 * arrays by doubling). UINT32_MAX when memory runs out. */
static uint32_t new_run(rb_classify_online *c, int cls)
{
    uint32_t r;
    if (c->n_free > 0) {
        r = c->free_runs[--c->n_free];
    } else {
        if (c->n_runs == c->cap_runs) {
            if (c->cap_runs >= UINT32_MAX / 2)
                return UINT32_MAX;
            size_t cap = (size_t)c->cap_runs * 2;
            uint8_t *nc = realloc(c->run_class, cap);
            if (!nc)
                return UINT32_MAX;
            c->run_class = nc;
            uint32_t *nn = realloc(c->run_n, cap * sizeof *nn);
            if (!nn)
                return UINT32_MAX;
            c->run_n = nn;
            uint32_t *nf = realloc(c->free_runs, cap * sizeof *nf);
            if (!nf)
                return UINT32_MAX;
            c->free_runs = nf;
            c->cap_runs = (uint32_t)cap;
        }
        r = c->n_runs++;
    }
    c->run_class[r] = (uint8_t)cls;
    c->run_n[r] = 0;
    return r;
}

/* Moves block b into run r; an emptied run is recycled. */
static void move_to(rb_classify_online *c, uint32_t b, uint32_t r)
{
    uint32_t old = c->run_of[b];
    if (old == r)
        return;
    if (old != UINT32_MAX && --c->run_n[old] == 0)
        c->free_runs[c->n_free++] = old;
    c->run_of[b] = r;
    c->run_n[r]++;
}

int rb_classify_online_access(rb_classify_online *c, uint32_t b)
{
    uint32_t prev = c->prev;
    c->prev = b;
    uint32_t r = c->run_of[b];
    if (b == prev && r != UINT32_MAX)
        return c->run_class[r]; /* two requests sharing a block: one access */
    if (b > 0 && prev == b - 1 && c->run_of[prev] != UINT32_MAX) {
        /* sequential: B joins B-1's run; a growing HOT run is a scan */
        uint32_t pr = c->run_of[prev];
        move_to(c, b, pr);
        if (c->run_class[pr] == RB_CLASS_HOT)
            c->run_class[pr] = RB_CLASS_SEQ;
        return c->run_class[pr];
    }
    if (r != UINT32_MAX && c->run_class[r] != RB_CLASS_HOT) {
        /* a scanned or looped block comes back: a new LOOP run */
        uint32_t nr = new_run(c, RB_CLASS_LOOP);
        if (nr == UINT32_MAX)
            return RB_CLASS_NONE;
        move_to(c, b, nr);
        return RB_CLASS_LOOP;
    }
    if (r == UINT32_MAX) {
        uint32_t nr = new_run(c, RB_CLASS_HOT);
        if (nr == UINT32_MAX)
            return RB_CLASS_NONE;
        move_to(c, b, nr);
        return RB_CLASS_HOT;
    }
    return RB_CLASS_HOT; /* a hot block read again */
}
