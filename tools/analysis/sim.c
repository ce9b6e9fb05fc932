/*
 * sim.c - the trace-driven cache simulator (contract in sim.h).
 *
 * One replay walks the stream once: for access i, rb_policy_fetch(key[i],
 * now = i); the token span i falls in collects hits, storage bytes and
 * merged requests. The policy is the runtime's own code (policy.h); the
 * simulator adds only the counting. OPT reads the next-use index built by
 * rb_sim_next_use in one backward pass (last position per key).
 *
 * Memory: the policy's state (policy.c) for the duration of one replay;
 * rb_sim_next_use's output (8 bytes per access) and a per-key scratch
 * array. Nothing per access is allocated.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "policy.h"
#include "sim.h"
#include "status.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

rb_status rb_sim_next_use(const rb_block_stream *s, uint64_t **out, rb_error *err)
{
    uint64_t *next = malloc((s->n ? s->n : 1) * sizeof *next);
    uint64_t *last = malloc((s->n_keys ? s->n_keys : 1) * sizeof *last);
    if (!next || !last) {
        free(next);
        free(last);
        return rb_error_set(err, RB_E_NOMEM, "sim: out of memory for the next-use index of %zu "
                            "accesses", s->n);
    }
    memset(last, 0xff, (size_t)s->n_keys * sizeof *last);
    for (size_t i = s->n; i-- > 0;) {
        next[i] = last[s->key[i]];
        last[s->key[i]] = i;
    }
    free(last);
    *out = next;
    return RB_OK;
}

rb_status rb_sim_run(const rb_block_stream *s, const char *policy, uint64_t cache_bytes,
                     const rb_sim_params *sp, rb_sim_result *out, rb_error *err)
{
    if (cache_bytes < RB_TRACE_BLOCK)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sim: cache of %" PRIu64 " bytes is below one %u-byte block",
                            cache_bytes, RB_TRACE_BLOCK);
    uint64_t cap = cache_bytes / RB_TRACE_BLOCK;
    rb_policy_config cfg = {0};
    cfg.n_keys = s->n_keys;
    cfg.capacity = cap > UINT32_MAX - 1 ? UINT32_MAX - 1 : (uint32_t)cap;
    cfg.window = sp->window;
    cfg.key_class = sp->labels;
    cfg.next_use = sp->next_use;
    rb_policy *p = NULL;
    rb_status st = rb_policy_create(policy, &cfg, &p, err);
    if (st != RB_OK)
        return st;
    rb_sim_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.policy, sizeof r.policy, "%s", policy);
    r.cache_bytes = cache_bytes;
    r.capacity = cfg.capacity;
    r.state_bytes = rb_policy_state_bytes(p);
    const uint32_t req_blocks = (uint32_t)(sp->profile.request_bytes / RB_TRACE_BLOCK);
    double t0 = now_s();
    uint64_t tok_miss = 0, tok_req = 0;
    double io_s = 0;
    size_t i = 0;
    /* span -1: accesses before the first token (the load); then spans */
    for (size_t t = 0; t <= s->n_tok; t++) {
        size_t end = t < s->n_tok ? s->tok_start[t] : s->n;
        int in_tok = t > 0;
        uint64_t miss = 0, req = 0;
        uint32_t run = 0, prev_miss = RB_PKEY_NONE - 1;
        for (; i < end; i++) {
            uint32_t k = s->key[i], v;
            int res = rb_policy_fetch(p, k, i, &v);
            if (res == RB_FETCH_HIT) {
                prev_miss = RB_PKEY_NONE - 1;
                continue;
            }
            miss++;
            /* merge: the block right after the previous miss extends the
               request, up to the profile's request size */
            if (k == prev_miss + 1 && run < req_blocks) {
                run++;
            } else {
                req++;
                run = 1;
            }
            prev_miss = k;
        }
        if (in_tok) {
            tok_miss += miss;
            tok_req += req;
            io_s += rb_profile_read_s(&sp->profile, req, miss * RB_TRACE_BLOCK);
            r.tok_accesses += end - s->tok_start[t - 1];
        }
        if (t < s->n_tok)
            i = s->tok_start[t];
    }
    r.replay_s = now_s() - t0;
    r.accesses = s->n;
    r.hits = p->n_hits;
    r.bypass = p->n_bypass;
    r.hit_ratio = s->n ? (double)r.hits / (double)s->n : 0.0;
    r.tok_hits = r.tok_accesses - tok_miss;
    r.tok_hit_ratio = r.tok_accesses ? (double)r.tok_hits / (double)r.tok_accesses : 0.0;
    if (s->n_tok) {
        r.bytes_per_token = (double)tok_miss * RB_TRACE_BLOCK / (double)s->n_tok;
        r.requests_per_token = (double)tok_req / (double)s->n_tok;
        r.io_s_per_token = io_s / (double)s->n_tok;
    }
    rb_policy_destroy(p);
    *out = r;
    return RB_OK;
}

/* ---- the plot --------------------------------------------------------------------- */

static const char *colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

rb_status rb_sim_write_svg(const char *path, const char *title, const rb_sim_result *r,
                           size_t n, int use_tok, rb_error *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return rb_error_set(err, RB_E_IO, "sim: cannot create '%s'", path);
    const double W = 760, H = 460, L = 70, R = 150, T = 40, B = 60;
    double xmax = 0;
    for (size_t i = 0; i < n; i++)
        if ((double)r[i].cache_bytes / RB_MIB > xmax)
            xmax = (double)r[i].cache_bytes / RB_MIB;
    if (xmax <= 0)
        xmax = 1;
    double pw = W - L - R, ph = H - T - B;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n", W, H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"14\">", L);
    for (const char *c = title; *c; c++) /* escape what XML needs */
        fputs(*c == '<' ? "&lt;" : *c == '>' ? "&gt;" : *c == '&' ? "&amp;" : (char[]){*c, 0}, f);
    fprintf(f, "</text>\n");
    for (int g = 0; g <= 10; g += 2) { /* y grid: hit ratio 0..1 */
        double y = T + ph - ph * g / 10.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L,
                y, L + pw, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.1f</text>\n", L - 6, y + 4,
                g / 10.0);
    }
    for (int g = 0; g <= 5; g++) {
        double x = L + pw * g / 5.0;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x,
                T, x, T + ph);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", x,
                T + ph + 18, xmax * g / 5.0);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" "
               "stroke=\"black\"/>\n", L, T, pw, ph);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">cache size (MiB)</text>\n",
            L + pw / 2, H - 18);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" text-anchor=\"middle\" transform=\"rotate(-90 18 %.1f)\">"
               "%s</text>\n", T + ph / 2, T + ph / 2,
            use_tok ? "hit ratio (per-token accesses)" : "hit ratio (all accesses)");
    int series = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && strcmp(r[j].policy, r[i].policy) == 0)
            j++;
        const char *col = colors[series % 10];
        const char *dash = series >= 10 ? " stroke-dasharray=\"6 3\"" : "";
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col, dash);
        for (size_t k = i; k < j; k++) {
            double h = use_tok ? r[k].tok_hit_ratio : r[k].hit_ratio;
            fprintf(f, "%.1f,%.1f ", L + pw * ((double)r[k].cache_bytes / RB_MIB) / xmax,
                    T + ph - ph * h);
        }
        fprintf(f, "\"/>\n");
        for (size_t k = i; k < j; k++) {
            double h = use_tok ? r[k].tok_hit_ratio : r[k].hit_ratio;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n",
                    L + pw * ((double)r[k].cache_bytes / RB_MIB) / xmax, T + ph - ph * h, col);
        }
        double ly = T + 14 + 18 * series;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\"%s/>\n", L + pw + 12, ly - 4, L + pw + 36, ly - 4, col, dash);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", L + pw + 42, ly, r[i].policy);
        series++;
        i = j;
    }
    fprintf(f, "</svg>\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return rb_error_set(err, RB_E_IO, "sim: write to '%s' failed", path);
    return RB_OK;
}
