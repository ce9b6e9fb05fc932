/*
 * cmd_sim.c - `rebound sim TRACE`: replay a trace against each policy over
 * a sweep of cache sizes (tools/analysis/sim.h); print hit ratios, storage bytes and
 * modelled I/O time per token as tables, the class-vs-OPT gap, the replay
 * speed per policy; optionally a CSV and an SVG plot.
 * A tool subcommand: uses the internal headers of trace, classify, sim.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "classify_offline.h"
#include "cli.h"
#include "policy.h"
#include "profile.h"
#include "sim.h"
#include "trace.h"

#define MAX_SIZES 64
#define MAX_POLICIES 16

static int parse_sizes(const char *s, uint64_t loop, uint64_t *out, int *n)
{
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", s);
    *n = 0;
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n >= MAX_SIZES)
            return -1;
        size_t len = strlen(tok);
        if (len > 1 && tok[len - 1] == '%') {
            char *end;
            double pct = strtod(tok, &end);
            if (end != tok + len - 1 || !(pct > 0) || pct > 10000)
                return -1;
            out[(*n)++] = (uint64_t)((double)loop * pct / 100.0);
        } else if (rb_cli_parse_u64(tok, &out[*n]) == 0) {
            (*n)++;
        } else {
            return -1;
        }
    }
    return *n > 0 ? 0 : -1;
}

static int opt_labels(void *dest, const char *v, char *why, size_t why_n)
{
    if (strcmp(v, "online") && strcmp(v, "offline")) {
        snprintf(why, why_n, "online or offline");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

int rb_cmd_sim(int argc, char **argv)
{
    const char *path = NULL, *sizes_arg = NULL, *pol_arg = NULL, *csv = NULL, *svg = NULL;
    const char *device = "phone", *labels_arg = "online";
    double bw = 0, lat_us = -1;
    uint64_t request = 0, window = 0;
    int use_tok = 0;
    int n_pos = 0;
    const rb_opt opts[] = {
        {"--cache", RB_OPT_STR, "SIZES",
         "comma list of cache sizes: bytes with K/M/G, or percentages of the\n"
         "loop length N per token (default 10%,20%,...,100%)", &sizes_arg, 0, 0, NULL, NULL},
        {"--policy", RB_OPT_STR, "LIST",
         "comma list of lru,fifo,clock,2q,arc,lirs,mru,class,opt (default all)", &pol_arg, 0, 0,
         NULL, NULL},
        {"--device", RB_OPT_STR, "NAME",
         "device profile for the I/O time: watch, phone (default), host, custom", &device, 0, 0,
         NULL, NULL},
        {"--bw", RB_OPT_DOUBLE, "MIB_S", "override the profile's read bandwidth", &bw, 1e-9, 1e18,
         NULL, NULL},
        {"--latency", RB_OPT_DOUBLE, "US", "override the profile's per-request latency", &lat_us,
         0, 1e18, NULL, NULL},
        {"--request", RB_OPT_SIZE, "BYTES", "override the profile's largest request (at least 4K)",
         &request, 4096, 1e19, NULL, NULL},
        {"--window", RB_OPT_SIZE, "BLOCKS",
         "class: streaming window (default min(16, capacity/64), at least 1)", &window, 0,
         1u << 30, NULL, NULL},
        {"--labels", RB_OPT_CALL, "online|offline",
         "class: Algorithm 1 as it runs (default) or whole-trace labels", &labels_arg, 0, 0,
         opt_labels, NULL},
        {"--csv", RB_OPT_STR, "FILE", "every result as CSV", &csv, 0, 0, NULL, NULL},
        {"--svg", RB_OPT_STR, "FILE", "plot of hit ratio vs cache size per policy", &svg, 0, 0,
         NULL, NULL},
        {"--tok", RB_OPT_FLAG, NULL, "plot the hit ratio of the per-token accesses (default: all)",
         &use_tok, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cli = {
        "sim", "TRACE [options]",
        "Replays TRACE against cache policies over cache sizes (the policies' method\n"
        "table is the runtime's) and OPT.",
        opts, NULL, &path, 1, &n_pos, NULL,
    };
    int rc0 = rb_cli_parse(&cli, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (n_pos > 1)
        return rb_cli_usage_error("sim", "give one trace", NULL);
    if (!path)
        return rb_cli_usage_error("sim", "no trace given", NULL);
    rb_error err;
    rb_sim_params sp;
    memset(&sp, 0, sizeof sp);
    if (rb_profile_get(device, &sp.profile, &err) != RB_OK)
        return rb_cli_fail("sim", err.message, NULL);
    if (bw > 0)
        sp.profile.bw_bytes_per_s = bw * RB_MIB;
    if (lat_us >= 0)
        sp.profile.latency_s = lat_us * 1e-6;
    if (request)
        sp.profile.request_bytes = request;
    sp.window = (uint32_t)window;
    /* policies */
    const char *pols[MAX_POLICIES];
    int n_pol = 0;
    char polbuf[256];
    if (pol_arg) {
        snprintf(polbuf, sizeof polbuf, "%s", pol_arg);
        for (char *p = strtok(polbuf, ","); p; p = strtok(NULL, ",")) {
            if (!rb_policy_find(p) || n_pol >= MAX_POLICIES) {
                char msg[128];
                snprintf(msg, sizeof msg, "unknown policy '%.60s' in --policy", p);
                return rb_cli_usage_error("sim", msg, "lru,fifo,clock,2q,arc,lirs,mru,class,opt");
            }
            pols[n_pol++] = p;
        }
    } else {
        for (int i = 0; i < rb_policy_count(); i++)
            pols[n_pol++] = rb_policy_at(i)->name;
    }
    rb_trace t;
    rb_block_stream s;
    if (rb_cli_load_trace("sim", path, &t, &s))
        return 1;
    int rc = 1;
    rb_classify_report cr;
    memset(&cr, 0, sizeof cr);
    uint64_t *next = NULL;
    rb_sim_result *res = NULL;
    FILE *cf = NULL;
    if (rb_classify_run(&s, &cr, &err) != RB_OK) {
        rb_cli_fail("sim", err.message, NULL);
        goto done;
    }
    uint64_t loop = cr.loop_max ? cr.loop_max : cr.loop_bytes;
    uint64_t sizes[MAX_SIZES];
    int n_sizes = 0;
    if (!sizes_arg && loop == 0) {
        rb_cli_fail("sim", "the trace has no LOOP blocks to size the cache sweep by",
                    "give --cache with sizes in bytes");
        goto done;
    }
    if (parse_sizes(sizes_arg ? sizes_arg : "10%,20%,30%,40%,50%,60%,70%,80%,90%,100%", loop,
                    sizes, &n_sizes) != 0) {
        rc = rb_cli_usage_error("sim", "--cache needs a comma list of sizes (64M) or "
                                "percentages (50%)", NULL);
        goto done;
    }
    for (int i = 0; i < n_sizes; i++)
        if (sizes[i] < RB_TRACE_BLOCK) {
            rb_cli_fail("sim", "a cache size is below one 4 KiB block", NULL);
            goto done;
        }
    if (!strcmp(labels_arg, "offline"))
        sp.labels = cr.cls;
    if (rb_sim_next_use(&s, &next, &err) != RB_OK) {
        rb_cli_fail("sim", err.message, NULL);
        goto done;
    }
    sp.next_use = next;
    res = calloc((size_t)n_pol * n_sizes, sizeof *res);
    if (!res) {
        rb_cli_fail("sim", "out of memory", NULL);
        goto done;
    }
    /* results grouped by policy (the plot's series) */
    for (int p = 0; p < n_pol; p++)
        for (int z = 0; z < n_sizes; z++)
            if (rb_sim_run(&s, pols[p], sizes[z], &sp, &res[p * n_sizes + z], &err) != RB_OK) {
                rb_cli_fail("sim", err.message, NULL);
                goto done;
            }
    char b1[32], b2[32];
    printf("trace %s: %zu block accesses, %zu token spans, loop N per token %s; device %s "
           "(%.0f MiB/s, %.0f us/request, %s requests); class labels %s\n",
           path, s.n, s.n_tok, rb_cli_bytes(loop, b1, sizeof b1), sp.profile.name,
           sp.profile.bw_bytes_per_s / RB_MIB, sp.profile.latency_s * 1e6,
           rb_cli_bytes(sp.profile.request_bytes, b2, sizeof b2), labels_arg);
    for (int table = 0; table < 4; table++) {
        static const char *titles[] = {
            "hit ratio, all accesses (load scan included)",
            "hit ratio, per-token accesses (prefill and decode)",
            "storage MiB read per token",
            "modelled I/O ms per token (merged requests)"};
        if (table >= 2 && s.n_tok == 0)
            break;
        if (table == 1 && s.n_tok == 0)
            continue;
        printf("\n%s:\n| cache | of loop |", titles[table]);
        for (int p = 0; p < n_pol; p++)
            printf(" %s |", pols[p]);
        printf("\n|---|---|");
        for (int p = 0; p < n_pol; p++)
            printf("---|");
        printf("\n");
        for (int z = 0; z < n_sizes; z++) {
            printf("| %s | %.0f%% |", rb_cli_bytes(sizes[z], b1, sizeof b1),
                   loop ? 100.0 * (double)sizes[z] / (double)loop : 0.0);
            for (int p = 0; p < n_pol; p++) {
                const rb_sim_result *r = &res[p * n_sizes + z];
                double v = table == 0 ? r->hit_ratio : table == 1 ? r->tok_hit_ratio
                         : table == 2 ? r->bytes_per_token / RB_MIB : r->io_s_per_token * 1e3;
                printf(table < 2 ? " %.4f |" : " %.2f |", v);
            }
            printf("\n");
        }
    }
    int ci = -1, oi = -1;
    for (int p = 0; p < n_pol; p++) {
        if (!strcmp(pols[p], "class"))
            ci = p;
        if (!strcmp(pols[p], "opt"))
            oi = p;
    }
    if (ci >= 0 && oi >= 0) {
        double worst = 0, worst_tok = 0;
        for (int z = 0; z < n_sizes; z++) {
            double g = res[oi * n_sizes + z].hit_ratio - res[ci * n_sizes + z].hit_ratio;
            double gt = res[oi * n_sizes + z].tok_hit_ratio - res[ci * n_sizes + z].tok_hit_ratio;
            worst = g > worst ? g : worst;
            worst_tok = gt > worst_tok ? gt : worst_tok;
        }
        printf("\nclass vs opt: largest gap %.4f (all accesses), %.4f (per-token accesses) "
               "over these sizes\n", worst, worst_tok);
    }
    printf("\nreplay speed and metadata per policy:\n| policy | M accesses/s | metadata at the "
           "largest size | per cached block |\n|---|---|---|---|\n");
    for (int p = 0; p < n_pol; p++) {
        double tsum = 0, nsum = 0;
        for (int z = 0; z < n_sizes; z++) {
            tsum += res[p * n_sizes + z].replay_s;
            nsum += (double)res[p * n_sizes + z].accesses;
        }
        const rb_sim_result *big = &res[p * n_sizes + n_sizes - 1];
        for (int z = 0; z < n_sizes; z++)
            if (res[p * n_sizes + z].capacity > big->capacity)
                big = &res[p * n_sizes + z];
        printf("| %s | %.1f | %s | %.1f B |\n", pols[p], tsum > 0 ? nsum / tsum / 1e6 : 0.0,
               rb_cli_bytes(big->state_bytes, b1, sizeof b1),
               (double)big->state_bytes / (double)big->capacity);
        fprintf(stderr, "result sim policy=%s accesses=%.0f seconds=%.4f maccess_per_s=%.2f\n",
                pols[p], nsum, tsum, tsum > 0 ? nsum / tsum / 1e6 : 0.0);
    }
    if (csv) {
        cf = fopen(csv, "w");
        if (!cf) {
            rb_cli_fail("sim", "cannot create the CSV file", csv);
            goto done;
        }
        fprintf(cf, "policy,cache_bytes,capacity_blocks,accesses,hits,hit_ratio,tok_accesses,"
                    "tok_hits,tok_hit_ratio,bytes_per_token,requests_per_token,io_s_per_token,"
                    "state_bytes,replay_s\n");
        for (int i = 0; i < n_pol * n_sizes; i++) {
            const rb_sim_result *r = &res[i];
            fprintf(cf, "%s,%" PRIu64 ",%" PRIu32 ",%" PRIu64 ",%" PRIu64 ",%.6f,%" PRIu64 ",%"
                    PRIu64 ",%.6f,%.1f,%.2f,%.6f,%zu,%.6f\n", r->policy, r->cache_bytes,
                    r->capacity, r->accesses, r->hits, r->hit_ratio, r->tok_accesses, r->tok_hits,
                    r->tok_hit_ratio, r->bytes_per_token, r->requests_per_token,
                    r->io_s_per_token, r->state_bytes, r->replay_s);
        }
        int bad = ferror(cf);
        bad |= fclose(cf) != 0;
        cf = NULL;
        if (bad) {
            rb_cli_fail("sim", "write of the CSV file failed", csv);
            goto done;
        }
    }
    if (svg) {
        char title[512];
        const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        snprintf(title, sizeof title, "%s: hit ratio vs cache size (loop N = %s per token)", base,
                 rb_cli_bytes(loop, b1, sizeof b1));
        if (rb_sim_write_svg(svg, title, res, (size_t)n_pol * n_sizes, use_tok, &err) != RB_OK) {
            rb_cli_fail("sim", err.message, NULL);
            goto done;
        }
    }
    rc = 0;
done:
    free(res);
    free(next);
    rb_classify_report_free(&cr);
    rb_block_stream_free(&s);
    rb_trace_free(&t);
    return rc;
}
