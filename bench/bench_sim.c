/*
 * bench_sim.c - replay speed of every cache policy in the simulator (not a
 * test; never registered). Target: >= 10 M block accesses per
 * second per policy, OPT included (with its precomputed next-use index).
 *
 * The stream: a synthetic model app (rb_trace_synth: load scan, hot set,
 * a 256 MiB weight loop read 24 times: 1.6 M block accesses), or the trace
 * given on the command line (e.g. a `rebound run --trace` of tinyllama).
 * Before timing, the replay is verified: LRU must miss the loop at half its
 * size, OPT must be at least every other policy, and class within 5% of
 * OPT. Each policy is then replayed -r times at 50% of the loop; the best
 * time counts. Output: one `result ...` line per policy (commit, compiler,
 * CPU) and a table.
 *
 * usage: bench_sim [TRACE] [-r REPEATS]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "classify_offline.h"
#include "policy.h"
#include "sim.h"
#include "trace.h"

#ifndef REBOUND_COMMIT
#define REBOUND_COMMIT "unknown"
#endif

static void read_cpu_name(char *out, size_t n)
{
    snprintf(out, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            snprintf(out, n, "%s", strchr(line, ':') + 2);
            out[strcspn(out, "\n")] = 0;
            for (char *c = out; *c; c++)
                if (*c == ' ')
                    *c = '_';
            break;
        }
    fclose(f);
}

int main(int argc, char **argv)
{
    const char *path = NULL;
    int reps = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else
            path = argv[i];
    }
    if (reps < 1)
        reps = 1;
    rb_error err;
    rb_trace t;
    rb_trace_init(&t);
    rb_trace_diag d;
    rb_status st = path ? rb_trace_read(path, &t, &d, &err)
                        : rb_trace_synth(&t, 256u << 20, 4u << 20, 24, 1, &err);
    rb_block_stream s;
    if (st != RB_OK || rb_block_stream_build(&t, &s, &err) != RB_OK) {
        fprintf(stderr, "bench_sim: %s\n", err.message);
        return 1;
    }
    rb_classify_report cr;
    uint64_t *next = NULL;
    if (rb_classify_run(&s, &cr, &err) != RB_OK || rb_sim_next_use(&s, &next, &err) != RB_OK) {
        fprintf(stderr, "bench_sim: %s\n", err.message);
        return 1;
    }
    uint64_t loop = cr.loop_max ? cr.loop_max : cr.loop_bytes, cache = loop / 2;
    rb_sim_params sp;
    memset(&sp, 0, sizeof sp);
    rb_profile_get("phone", &sp.profile, &err);
    sp.next_use = next;
    /* verify before timing */
    rb_sim_result opt, r;
    int bad = 0;
    rb_sim_run(&s, "opt", cache, &sp, &opt, &err);
    for (int i = 0; i < rb_policy_count(); i++) {
        const char *name = rb_policy_at(i)->name;
        rb_sim_run(&s, name, cache, &sp, &r, &err);
        if (r.hits > opt.hits) {
            fprintf(stderr, "bench_sim: %s beats OPT (%llu > %llu hits): broken\n", name,
                    (unsigned long long)r.hits, (unsigned long long)opt.hits);
            bad = 1;
        }
        if (!strcmp(name, "lru") && r.tok_hit_ratio > 0.01 && s.n_tok > 1) {
            fprintf(stderr, "bench_sim: lru hits %.3f of a loop twice the cache\n", r.tok_hit_ratio);
            bad = 1;
        }
        if (!strcmp(name, "class") && opt.hit_ratio - r.hit_ratio > 0.05) {
            fprintf(stderr, "bench_sim: class %.4f is not within 5%% of opt %.4f\n", r.hit_ratio,
                    opt.hit_ratio);
            bad = 1;
        }
    }
    if (bad)
        return 1;
    char cpu[128];
    read_cpu_name(cpu, sizeof cpu);
    printf("stream: %s, %zu block accesses, %zu token spans, loop %.1f MiB, cache %.1f MiB "
           "(50%%), best of %d\n\n| policy | M accesses/s | hit ratio |\n|---|---|---|\n",
           path ? path : "synthetic (256 MiB loop x 24 tokens)", s.n, s.n_tok,
           (double)loop / (1 << 20), (double)cache / (1 << 20), reps);
    for (int i = 0; i < rb_policy_count(); i++) {
        const char *name = rb_policy_at(i)->name;
        double best = 1e30;
        for (int k = 0; k < reps; k++) {
            rb_sim_run(&s, name, cache, &sp, &r, &err);
            best = r.replay_s < best ? r.replay_s : best;
        }
        double rate = (double)s.n / best / 1e6;
        printf("| %s | %.1f | %.4f |\n", name, rate, r.hit_ratio);
        fprintf(stderr, "result bench=sim policy=%s accesses=%zu seconds=%.4f maccess_per_s=%.2f "
                "target_met=%d commit=%s compiler=\"%s\" cpu=%s\n", name, s.n, best, rate,
                rate >= 10.0, REBOUND_COMMIT, __VERSION__, cpu);
    }
    free(next);
    rb_classify_report_free(&cr);
    rb_block_stream_free(&s);
    rb_trace_free(&t);
    return 0;
}
