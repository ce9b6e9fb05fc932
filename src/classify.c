/*
 * classify.c - Algorithm 1 online and the offline labelling (classify.h).
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
 * Offline: two passes over the stream, counters per key (accesses, and
 * re-reads with a sequential neighbour), then one label per key.
 *
 * Memory: the online state's arrays (classify.h); offline, two u32
 * counters per key and a bitmap for the per-token loop length, freed
 * before returning. Nothing global.
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

rb_status rb_classify_offline(const rb_block_stream *s, uint8_t *cls, rb_error *err)
{
    uint32_t *n_acc = calloc(s->n_keys ? s->n_keys : 1, sizeof *n_acc);
    uint32_t *n_seq = calloc(s->n_keys ? s->n_keys : 1, sizeof *n_seq);
    if (!n_acc || !n_seq) {
        free(n_acc);
        free(n_seq);
        return rb_error_set(err, RB_E_NOMEM, "classify: out of memory");
    }
    for (size_t i = 0; i < s->n; i++) {
        uint32_t k = s->key[i];
        int seq = (i > 0 && s->key[i - 1] + 1 == k) || (i + 1 < s->n && s->key[i + 1] == k + 1);
        if (n_acc[k] < UINT32_MAX) {
            /* only re-reads vote: a hot block's first read is often the
               load scan's, which is sequential */
            if (n_acc[k] > 0)
                n_seq[k] += (uint32_t)seq;
            n_acc[k]++;
        }
    }
    for (uint32_t k = 0; k < s->n_keys; k++) {
        if (n_acc[k] == 0)
            cls[k] = RB_CLASS_NONE;
        else if (n_acc[k] == 1)
            cls[k] = RB_CLASS_SEQ;
        else
            cls[k] = 2ull * n_seq[k] >= n_acc[k] - 1 ? RB_CLASS_LOOP : RB_CLASS_HOT;
    }
    free(n_acc);
    free(n_seq);
    return RB_OK;
}

void rb_classify_report_free(rb_classify_report *r)
{
    free(r->file_bytes);
    free(r->cls);
    memset(r, 0, sizeof *r);
}

rb_status rb_classify_run(const rb_block_stream *s, rb_classify_report *out, rb_error *err)
{
    rb_classify_report r;
    memset(&r, 0, sizeof r);
    const uint64_t B = RB_TRACE_BLOCK;
    r.n_files = s->n_files;
    r.cls = malloc(s->n_keys ? s->n_keys : 1);
    r.file_bytes = calloc(s->n_files + 1, sizeof *r.file_bytes);
    uint32_t *seen = calloc(s->n_keys ? s->n_keys : 1, sizeof *seen); /* span stamp + 1 */
    rb_classify_online on;
    memset(&on, 0, sizeof on);
    rb_status st = RB_OK;
    if (!r.cls || !r.file_bytes || !seen) {
        st = rb_error_set(err, RB_E_NOMEM, "classify: out of memory");
        goto done;
    }
    if ((st = rb_classify_offline(s, r.cls, err)) != RB_OK ||
        (st = rb_classify_online_init(&on, s->n_keys, err)) != RB_OK)
        goto done;
    for (size_t i = 0; i < s->n; i++) {
        int c = rb_classify_online_access(&on, s->key[i]);
        if (c == RB_CLASS_NONE) {
            st = rb_error_set(err, RB_E_NOMEM, "classify: out of memory for runs");
            goto done;
        }
        r.online_accesses[c]++;
    }
    for (uint32_t k = 0; k < s->n_keys; k++) {
        if (r.cls[k] == RB_CLASS_NONE)
            continue;
        r.offline_bytes[r.cls[k]] += B;
        r.online_bytes[rb_classify_online_class(&on, k)] += B;
        uint32_t f = rb_block_stream_file(s, k);
        if (f < s->n_files)
            r.file_bytes[f][r.cls[k]] += B;
    }
    r.loop_bytes = r.offline_bytes[RB_CLASS_LOOP];
    /* loop length per token: distinct LOOP blocks in each span */
    r.loop_min = UINT64_MAX;
    double sum = 0;
    for (size_t t = 0; t < s->n_tok; t++) {
        uint64_t n = 0;
        for (size_t i = s->tok_start[t]; i < s->tok_start[t + 1]; i++) {
            uint32_t k = s->key[i];
            if (r.cls[k] == RB_CLASS_LOOP && seen[k] != (uint32_t)t + 1) {
                seen[k] = (uint32_t)t + 1;
                n++;
            }
        }
        n *= B;
        r.loop_min = n < r.loop_min ? n : r.loop_min;
        r.loop_max = n > r.loop_max ? n : r.loop_max;
        sum += (double)n;
    }
    r.n_tokens = s->n_tok;
    if (s->n_tok == 0)
        r.loop_min = r.loop_max = r.loop_bytes, r.loop_mean = (double)r.loop_bytes;
    else
        r.loop_mean = sum / (double)s->n_tok;
done:
    free(seen);
    rb_classify_online_deinit(&on);
    if (st != RB_OK) {
        rb_classify_report_free(&r);
        return st;
    }
    *out = r;
    return RB_OK;
}
