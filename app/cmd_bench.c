/*
 * cmd_bench.c - `rebound bench`: prompt processing (pp) and text generation
 * (tg) speed the way llama-bench measures them: pp feeds N tokens in
 * batches to an empty context; tg feeds N tokens one at a time, each after
 * the previous one (no sampling: the speed of the forward pass). A warm-up
 * run first, then -r repeats; the median and the spread are reported, one
 * machine-readable line per result and a table. Uses only the public API.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "rebound.h"

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* tok/s of one run: pp (n tokens at once) or tg (n tokens one by one). */
static int run_once(rb_model *model, const rb_session_params *p, const int32_t *tokens,
                    uint32_t n, int is_tg, double *tok_s)
{
    rb_session *s = NULL;
    rb_error err;
    if (rb_session_create(model, p, &s, &err) != RB_OK)
        return rb_cli_fail("bench", err.message, NULL);
    double t0 = rb_cli_now_s();
    rb_status st = RB_OK;
    if (is_tg) {
        for (uint32_t i = 0; i < n && st == RB_OK; i++)
            st = rb_session_feed(s, &tokens[i], 1, NULL);
    } else {
        st = rb_session_feed(s, tokens, n, NULL);
    }
    double t1 = rb_cli_now_s();
    if (st != RB_OK) {
        rb_cli_fail("bench", rb_session_errmsg(s), NULL);
        rb_session_destroy(s);
        return 1;
    }
    rb_session_destroy(s);
    *tok_s = (double)n / (t1 - t0);
    return 0;
}

int rb_cmd_bench(int argc, char **argv)
{
    const char *model_path = NULL, *trace_path = NULL;
    uint64_t n_pp = 512, n_tg = 128, n_threads = 0, reps = 3, n_batch = 0;
    int use_mmap = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--weights-budget"))
            return rb_cmd_bench_stream(argc, argv);
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            printf("usage: rebound bench -m MODEL [-p 512] [-n 128] [-t THREADS] [-r 3] [-b BATCH] [--mmap] [--trace FILE]\n"
                   "       rebound bench -m MODEL --weights-budget 25%%,50%%,75%% [--policy class,lru] [--device phone|watch|host] [-n 16] [-t THREADS] [--no-cgroup]\n");
            return 0;
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            bad = !v, model_path = v, i++;
        } else if (!strcmp(o, "-p") || !strcmp(o, "--n-prompt")) {
            bad = rb_cli_parse_u64(v, &n_pp) || n_pp > 65536, i++;
        } else if (!strcmp(o, "-n") || !strcmp(o, "--n-gen")) {
            bad = rb_cli_parse_u64(v, &n_tg) || n_tg > 65536, i++;
        } else if (!strcmp(o, "-t") || !strcmp(o, "--threads")) {
            bad = rb_cli_parse_u64(v, &n_threads) || n_threads > 256, i++;
        } else if (!strcmp(o, "-r") || !strcmp(o, "--repetitions")) {
            bad = rb_cli_parse_u64(v, &reps) || reps == 0 || reps > 100, i++;
        } else if (!strcmp(o, "-b") || !strcmp(o, "--batch-size")) {
            bad = rb_cli_parse_u64(v, &n_batch) || n_batch > 65536, i++;
        } else if (!strcmp(o, "--mmap")) {
            use_mmap = 1;
        } else if (!strcmp(o, "--trace")) {
            bad = !v, trace_path = v, i++;
        } else {
            return rb_cli_fail("bench", "unknown option", o);
        }
        if (bad) {
            char msg[96];
            snprintf(msg, sizeof msg, "option %s needs a valid value", o);
            return rb_cli_fail("bench", msg, NULL);
        }
    }
    if (!model_path)
        return rb_cli_fail("bench", "no model given (-m MODEL)", NULL);
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (uint64_t)n : 1;
    }
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = use_mmap;
    rb_model *model = NULL;
    if (rb_model_open(model_path, &mp, &model, &err) != RB_OK)
        return rb_cli_fail("bench", err.message, NULL);
    struct rb_trace_writer *trace = NULL;
    if (trace_path && rb_cli_trace_attach("bench", model, model_path, trace_path, &trace)) {
        rb_model_close(model);
        return 1;
    }
    rb_model_info mi;
    rb_model_get_info(model, &mi);
    uint32_t n_max = (uint32_t)(n_pp > n_tg ? n_pp : n_tg);
    int32_t *tokens = malloc((n_max + 1) * sizeof *tokens);
    double *pp = calloc(reps, sizeof *pp), *tg = calloc(reps, sizeof *tg);
    int rc = 1;
    if (!tokens || !pp || !tg) {
        rb_cli_fail("bench", "out of memory", NULL);
        goto done;
    }
    /* token ids spread over the vocabulary, fixed: speed does not depend on them */
    for (uint32_t i = 0; i <= n_max; i++)
        tokens[i] = (int32_t)(((uint64_t)i * 2654435761u + 1) % mi.n_vocab);
    /* each test with its own session shape, and all of one test's runs
       before the next test's, as llama-bench does: a tg run then never
       follows a prefill's seconds of full load, nor inherits its batch */
    rb_session_params p = rb_session_default_params(), ptg;
    p.n_threads = (int)n_threads;
    ptg = p;
    p.n_ctx = (uint32_t)n_pp + 16;
    ptg.n_ctx = (uint32_t)n_tg + 16;
    if (n_batch)
        p.n_batch = ptg.n_batch = (uint32_t)n_batch;
    else if (n_pp > 0)
        p.n_batch = (uint32_t)(n_pp < 512 ? n_pp : 512);
    double warm;
    if (n_pp && run_once(model, &p, tokens, (uint32_t)(n_pp < 32 ? n_pp : 32), 0, &warm))
        goto done;
    for (uint64_t r = 0; n_pp && r < reps; r++)
        if (run_once(model, &p, tokens, (uint32_t)n_pp, 0, &pp[r]))
            goto done;
    if (n_tg && run_once(model, &ptg, tokens, (uint32_t)(n_tg < 4 ? n_tg : 4), 1, &warm))
        goto done;
    for (uint64_t r = 0; n_tg && r < reps; r++)
        if (run_once(model, &ptg, tokens, (uint32_t)n_tg, 1, &tg[r]))
            goto done;
    char cpu[128] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[256];
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(cpu, sizeof cpu, "%s", c + 2);
                    cpu[strcspn(cpu, "\n")] = 0;
                }
                break;
            }
        fclose(f);
    }
    const char *name = strrchr(model_path, '/') ? strrchr(model_path, '/') + 1 : model_path;
    printf("| model | size MiB | threads | test | tok/s (median) | min - max |\n");
    printf("|---|---|---|---|---|---|\n");
    for (int which = 0; which < 2; which++) {
        uint64_t n = which ? n_tg : n_pp;
        double *x = which ? tg : pp;
        if (n == 0)
            continue;
        qsort(x, reps, sizeof *x, cmp_double);
        double med = reps % 2 ? x[reps / 2] : 0.5 * (x[reps / 2 - 1] + x[reps / 2]);
        printf("| %s | %.1f | %" PRIu64 " | %s%" PRIu64 " | %.2f | %.2f - %.2f |\n", name,
               (double)mi.tensor_data_bytes / (1 << 20), n_threads, which ? "tg" : "pp", n, med,
               x[0], x[reps - 1]);
        fprintf(stderr, "result bench=%s%" PRIu64 " model=%s arch=%s size_bytes=%" PRIu64
                " threads=%" PRIu64 " reps=%" PRIu64 " tok_s_median=%.3f tok_s_min=%.3f "
                "tok_s_max=%.3f cpu=\"%s\"\n", which ? "tg" : "pp", n, name, mi.architecture,
                mi.tensor_data_bytes, n_threads, reps, med, x[0], x[reps - 1], cpu);
        if (which)
            fprintf(stderr, "tg reads the weights once per token: %.1f GB/s at the median\n",
                    med * (double)mi.tensor_data_bytes / 1e9);
    }
    rc = 0;
done:
    free(tokens);
    free(pp);
    free(tg);
    rb_model_close(model);
    if (rb_cli_trace_detach("bench", trace))
        rc = 1;
    return rc;
}
