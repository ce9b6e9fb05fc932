/*
 * cmd_bench.c - `rebound bench`: prompt processing (pp) and text generation
 * (tg) speed the way llama-bench measures them: pp feeds N tokens in
 * batches to an empty context; tg feeds N tokens one at a time, each after
 * the previous one (no sampling: the speed of the forward pass). A warm-up
 * run first, then -r repeats; the median and the spread are reported, one
 * machine-readable line per result and a table (or, with -o, llama-bench's
 * json / jsonl / csv fields). Lists (-p 16,32 -n 64 -t 1,2) run every
 * combination, in llama-bench's order. -d N (llama-bench's depth) first
 * feeds N tokens, untimed, so that each test runs with N positions already
 * in the KV cache; -pg P,G (llama-bench's pp+tg test) times P tokens fed at
 * once and then G one by one, tok/s = (P + G) / time. Uses only the public
 * API.
 * With tg it also measures the machine's read bandwidth (one thread and
 * the tg test's threads, a buffer 8x a large L3) and states decode's weight
 * reads against it: decode reads every weight once per token, so that is
 * its ceiling.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
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

/* ---- read bandwidth ---------------------------------------------------------
 * n threads each sum their slice of one 256 MiB buffer (touched first, so
 * no page faults are timed); the best of 3 passes, GB/s of bytes read. */
#define RB_BW_BYTES ((size_t)256 << 20)

typedef struct bw_job {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
} bw_job;

static void *bw_read(void *arg)
{
    bw_job *j = arg;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = 0; i + 4 <= j->n; i += 4) {
        s0 += j->p[i];
        s1 += j->p[i + 1];
        s2 += j->p[i + 2];
        s3 += j->p[i + 3];
    }
    j->sum = s0 + s1 + s2 + s3;
    return NULL;
}

static volatile uint64_t bw_sink;

static double read_gbps(const uint64_t *buf, int n_threads)
{
    pthread_t th[64];
    bw_job job[64];
    n_threads = n_threads < 1 ? 1 : n_threads > 64 ? 64 : n_threads;
    const size_t words = RB_BW_BYTES / 8, per = words / (size_t)n_threads;
    double best = 0;
    for (int pass = 0; pass < 3; pass++) {
        const double t0 = rb_cli_now_s();
        int started = 0;
        for (int t = 0; t < n_threads; t++) {
            job[t] = (bw_job){buf + (size_t)t * per, per, 0};
            if (t > 0 && pthread_create(&th[t], NULL, bw_read, &job[t]) == 0)
                started = t;
            else if (t > 0)
                bw_read(&job[t]);
        }
        bw_read(&job[0]);
        for (int t = 1; t <= started; t++)
            pthread_join(th[t], NULL);
        for (int t = 0; t < n_threads; t++)
            bw_sink += job[t].sum; /* the sums are used: the reads stay */
        const double gbps = (double)(per * (size_t)n_threads * 8) / (rb_cli_now_s() - t0) / 1e9;
        best = gbps > best ? gbps : best;
    }
    return best;
}

/* tok/s of one run after `depth` untimed tokens (fed in batches): n_pp
 * tokens at once, then n_tg one by one (pp: n_tg = 0; tg: n_pp = 0). */
static int run_once(rb_model *model, const rb_session_params *p, const int32_t *tokens,
                    uint32_t depth, uint32_t n_pp, uint32_t n_tg, double *tok_s)
{
    rb_session *s = NULL;
    rb_error err;
    if (rb_session_create(model, p, &s, &err) != RB_OK)
        return rb_cli_fail("bench", err.message, NULL);
    rb_status st = RB_OK;
    if (depth)
        st = rb_session_feed(s, tokens, depth, NULL);
    double t0 = rb_cli_now_s();
    if (st == RB_OK && n_pp)
        st = rb_session_feed(s, tokens + depth, n_pp, NULL);
    for (uint32_t i = 0; i < n_tg && st == RB_OK; i++)
        st = rb_session_feed(s, &tokens[depth + n_pp + i], 1, NULL);
    double t1 = rb_cli_now_s();
    if (st != RB_OK) {
        rb_cli_fail("bench", rb_session_errmsg(s), NULL);
        rb_session_destroy(s);
        return 1;
    }
    rb_session_destroy(s);
    *tok_s = (double)(n_pp + n_tg) / (t1 - t0);
    return 0;
}

/* a test's name as llama-bench prints it: pp512, tg128, pp512+tg128, then
 * " @ d4096" at a depth */
static void test_name(uint32_t n_pp, uint32_t n_tg, uint32_t depth, char *buf, size_t n)
{
    int k = n_pp && n_tg ? snprintf(buf, n, "pp%" PRIu32 "+tg%" PRIu32, n_pp, n_tg)
            : n_tg      ? snprintf(buf, n, "tg%" PRIu32, n_tg)
                        : snprintf(buf, n, "pp%" PRIu32, n_pp);
    if (depth && k > 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, " @ d%" PRIu32, depth);
}

/* One test of the run: pp (n_prompt) or tg (n_gen), its shape and samples. */
typedef struct bench_test {
    uint32_t n_prompt, n_gen, n_threads, n_batch, n_depth;
    double *tok_s; /* reps samples, in run order (reps <= 100) */
    char time[32]; /* when it started, ISO 8601 UTC as llama-bench's test_time */
} bench_test;

static double mean(const double *x, uint64_t n)
{
    double s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += x[i];
    return n ? s / (double)n : 0;
}

/* sample standard deviation (n - 1), 0 for one sample, as llama-bench */
static double stdev(const double *x, uint64_t n)
{
    if (n <= 1)
        return 0;
    double m = mean(x, n), s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += (x[i] - m) * (x[i] - m);
    return sqrt(s / (double)(n - 1));
}

/* A string for JSON or CSV: quoted, with " escaped the format's way. */
static void put_quoted(FILE *f, const char *s, int csv)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"')
            fputs(csv ? "\"\"" : "\\\"", f);
        else if (*s == '\\' && !csv)
            fputs("\\\\", f);
        else if ((unsigned char)*s < 0x20 && !csv)
            fprintf(f, "\\u%04x", (unsigned)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* Fields of llama-bench's json/csv output that apply to rebound, under the
 * same names (CPU only: no GPU layers; one batch size, so n_ubatch =
 * n_batch; an f16 KV cache; n_depth as -d). */
static const char *const FIELDS[] = {
    "cpu_info", "model_filename", "model_type", "model_size", "model_n_params", "n_batch",
    "n_ubatch", "n_threads", "type_k", "type_v", "n_gpu_layers", "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
};
enum { N_FIELDS = sizeof FIELDS / sizeof FIELDS[0] };

typedef struct bench_model {
    const char *cpu, *name, *arch;
    uint64_t size_bytes, n_params;
} bench_model;

/* Field k of test t as text; *is_str when JSON quotes it. */
static void field(const bench_model *m, const bench_test *t, uint64_t reps, int k, char *buf,
                  size_t n, int *is_str)
{
    double ns[128], tok = t->n_prompt + t->n_gen;
    for (uint64_t r = 0; r < reps && r < 128; r++)
        ns[r] = 1e9 * tok / t->tok_s[r];
    *is_str = 0;
    switch (k) {
    case 0: *is_str = 1, snprintf(buf, n, "%s", m->cpu); break;
    case 1: *is_str = 1, snprintf(buf, n, "%s", m->name); break;
    case 2: *is_str = 1, snprintf(buf, n, "%s", m->arch); break;
    case 3: snprintf(buf, n, "%" PRIu64, m->size_bytes); break;
    case 4: snprintf(buf, n, "%" PRIu64, m->n_params); break;
    case 5: case 6: snprintf(buf, n, "%" PRIu32, t->n_batch); break;
    case 7: snprintf(buf, n, "%" PRIu32, t->n_threads); break;
    case 8: case 9: *is_str = 1, snprintf(buf, n, "f16"); break;
    case 10: snprintf(buf, n, "0"); break;
    case 11: snprintf(buf, n, "%" PRIu32, t->n_prompt); break;
    case 12: snprintf(buf, n, "%" PRIu32, t->n_gen); break;
    case 13: snprintf(buf, n, "%" PRIu32, t->n_depth); break;
    case 14: *is_str = 1, snprintf(buf, n, "%s", t->time); break;
    case 15: snprintf(buf, n, "%.0f", mean(ns, reps)); break;
    case 16: snprintf(buf, n, "%.0f", stdev(ns, reps)); break;
    case 17: snprintf(buf, n, "%.6f", mean(t->tok_s, reps)); break;
    default: snprintf(buf, n, "%.6f", stdev(t->tok_s, reps)); break;
    }
}

/* -o json, jsonl or csv: llama-bench's layout (json: an array of objects
 * with samples_ns and samples_ts; jsonl: one object per line; csv: a
 * header line, then every value quoted). */
static void print_machine(FILE *f, const char *fmt, const bench_model *m, const bench_test *t,
                          int n_tests, uint64_t reps)
{
    int csv = !strcmp(fmt, "csv"), jsonl = !strcmp(fmt, "jsonl");
    char buf[256];
    int is_str;
    if (csv) {
        for (int k = 0; k < N_FIELDS; k++)
            fprintf(f, "%s%s", k ? "," : "", FIELDS[k]);
        fputc('\n', f);
    } else if (!jsonl) {
        fprintf(f, "[\n");
    }
    for (int i = 0; i < n_tests; i++) {
        if (!csv)
            fprintf(f, "%s{", jsonl ? "" : i ? ",\n  " : "  ");
        for (int k = 0; k < N_FIELDS; k++) {
            field(m, &t[i], reps, k, buf, sizeof buf, &is_str);
            if (csv) {
                fprintf(f, "%s", k ? "," : "");
                put_quoted(f, buf, 1);
                continue;
            }
            fprintf(f, "%s\"%s\": ", jsonl ? "" : "\n    ", FIELDS[k]);
            if (is_str)
                put_quoted(f, buf, 0);
            else
                fputs(buf, f);
            fputs(jsonl ? ", " : ",", f);
        }
        if (csv) {
            fputc('\n', f);
            continue;
        }
        double tok = t[i].n_prompt + t[i].n_gen;
        fprintf(f, "%s\"samples_ns\": [ ", jsonl ? "" : "\n    ");
        for (uint64_t r = 0; r < reps; r++)
            fprintf(f, "%s%.0f", r ? ", " : "", 1e9 * tok / t[i].tok_s[r]);
        fprintf(f, " ],%s\"samples_ts\": [ ", jsonl ? " " : "\n    ");
        for (uint64_t r = 0; r < reps; r++)
            fprintf(f, "%s%.6f", r ? ", " : "", t[i].tok_s[r]);
        fprintf(f, " ]%s}%s", jsonl ? "" : "\n  ", jsonl ? "\n" : "");
    }
    if (!csv && !jsonl)
        fprintf(f, "\n]\n");
}

static int opt_output(void *dest, const char *v, char *why, size_t why_n)
{
    if (strcmp(v, "md") && strcmp(v, "json") && strcmp(v, "jsonl") && strcmp(v, "csv")) {
        snprintf(why, why_n, "md, json, jsonl or csv");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

int rb_cmd_bench(int argc, char **argv)
{
    const char *model_path = NULL, *trace_path = NULL, *output = "md";
    const char *weights_budget = NULL, *policy = NULL, *device = NULL;
    rb_cli_list n_pp = {{512}, 1}, n_tg = {{128}, 1}, threads = {{0}, 1}, batch = {{0}, 1};
    rb_cli_list depths = {{0}, 1}, pg = {{0}, 0};
    uint64_t reps = 3;
    int use_mmap = 0, no_cgroup = 0;
    rb_session_params base = rb_session_default_params(); /* --exact-attention */
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &model_path, 0, 0, NULL, NULL},
        {"-p|--n-prompt", RB_OPT_LIST, "N[,N..]",
         "prompt-processing tests: N tokens fed at once (default 512; 0: none)", &n_pp, 0, 65536,
         NULL, NULL},
        {"-n|--n-gen", RB_OPT_LIST, "N[,N..]",
         "generation tests: N tokens fed one by one (default 128; 0: none)", &n_tg, 0, 65536,
         NULL, NULL},
        {"-pg", RB_OPT_LIST, "P,G",
         "a pp+tg test: P tokens at once, then G one by one, timed together", &pg, 0, 65536, NULL,
         NULL},
        {"-d|--n-depth", RB_OPT_LIST, "N[,N..]",
         "depth: N tokens already in the KV cache (fed untimed) before each test (default 0)",
         &depths, 0, 1 << 20, NULL, NULL},
        {"-t|--threads", RB_OPT_LIST, "N[,N..]", "threads (default: all cores)", &threads, 0, 256,
         NULL, NULL},
        {"-b|--batch-size", RB_OPT_LIST, "N[,N..]",
         "prefill batch (default: the prompt's length up to 512)", &batch, 0, 65536, NULL, NULL},
        {"-r|--repetitions", RB_OPT_SIZE, "N", "runs of each test after a warm-up (default 3)",
         &reps, 1, 100, NULL, NULL},
        RB_CLI_EXACT_ATTENTION_OPT(&base),
        {"-o|--output", RB_OPT_CALL, "FMT",
         "stdout as md (default: a table), json, jsonl or csv (llama-bench's\n"
         "field names); the result lines on stderr stay", &output, 0, 0, opt_output, NULL},
        {"--mmap", RB_OPT_FLAG, NULL, "map the model file instead of reading it", &use_mmap, 0, 0,
         NULL, NULL},
        {"--no-mmap", RB_OPT_FLAG_OFF, NULL, "read the model file into RAM (the default)",
         &use_mmap, 0, 0, NULL, NULL},
        {"--trace", RB_OPT_STR, "FILE", "record the model-file accesses (see `rebound trace`)",
         &trace_path, 0, 0, NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL,
         "weight streaming (decode under a weight budget; -p and -r do not apply):", NULL, 0, 0,
         NULL, NULL},
        {"--weights-budget", RB_OPT_STR, "B[,B..]",
         "budgets: BYTES (K/M/G) or N% of the weights, comma-separated", &weights_budget, 0, 0,
         NULL, NULL},
        {"--policy", RB_OPT_STR, "P[,P..]", "weight cache policies: class, lru (default both)",
         &policy, 0, 0, NULL, NULL},
        {"--device", RB_OPT_STR, "D", "storage profile: phone (default), watch, host", &device, 0,
         0, NULL, NULL},
        {"--no-cgroup", RB_OPT_FLAG, NULL,
         "skip the page-cache baseline under a memory cgroup", &no_cgroup, 0, 0, NULL, NULL},
        RB_CLI_GPU_OPTS,
        {0},
    };
    const rb_cli_cmd cmd = {
        "bench",
        "-m MODEL [-p 512[,N..]] [-n 128[,N..]] [-pg P,G] [-d N[,N..]] [-t N[,N..]] [-r 3]\n"
        "      [-o md|json|csv] [options]\n"
        "-m MODEL --weights-budget 25%,50%,75% [--policy class,lru] [--device D] [-n 16]",
        "Prompt processing (pp) and text generation (tg) speed the way llama-bench\n"
        "measures them: every test (each -p and -n value, for each -t and -b value)\n"
        "after a warm-up, -r runs, no sampling.",
        opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (weights_budget)
        return rb_cmd_bench_stream(argc, argv);
    if (!model_path)
        return rb_cli_usage_error("bench", "no model given (-m MODEL)", NULL);
    if (pg.n && (pg.n != 2 || !pg.v[0] || !pg.v[1]))
        return rb_cli_usage_error("bench", "-pg takes two positive counts, P,G (e.g. -pg 512,128)",
                                  NULL);
    for (int i = 0; i < threads.n; i++)
        if (threads.v[i] == 0) {
            long n = sysconf(_SC_NPROCESSORS_ONLN);
            threads.v[i] = n > 0 ? (uint64_t)n : 1;
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
    uint64_t n_params = 0;
    for (uint64_t i = 0; i < mi.n_tensors; i++) {
        rb_tensor_info ti;
        if (rb_model_get_tensor_info(model, i, &ti) != RB_OK)
            continue;
        uint64_t e = 1;
        for (uint32_t d = 0; d < ti.n_dims; d++)
            e *= ti.dims[d];
        n_params += e;
    }
    uint32_t n_max = pg.n ? (uint32_t)(pg.v[0] + pg.v[1]) : 0, d_max = 0;
    int n_tests = pg.n ? 1 : 0;
    for (int i = 0; i < depths.n; i++)
        d_max = depths.v[i] > d_max ? (uint32_t)depths.v[i] : d_max;
    for (int i = 0; i < n_pp.n; i++) {
        n_max = n_pp.v[i] > n_max ? (uint32_t)n_pp.v[i] : n_max;
        n_tests += n_pp.v[i] > 0;
    }
    for (int i = 0; i < n_tg.n; i++) {
        n_max = n_tg.v[i] > n_max ? (uint32_t)n_tg.v[i] : n_max;
        n_tests += n_tg.v[i] > 0;
    }
    n_tests *= threads.n * batch.n * depths.n;
    int32_t *tokens = malloc(((size_t)d_max + n_max + 1) * sizeof *tokens);
    bench_test *tests = calloc((size_t)n_tests + 1, sizeof *tests);
    double *samples = calloc((size_t)n_tests * reps + 1, sizeof *samples);
    int rc = 1, k = 0;
    if (!tokens || !tests || !samples) {
        rb_cli_fail("bench", "out of memory", NULL);
        goto done;
    }
    /* token ids spread over the vocabulary, fixed: speed does not depend on them */
    for (uint32_t i = 0; i <= d_max + n_max; i++)
        tokens[i] = (int32_t)(((uint64_t)i * 2654435761u + 1) % mi.n_vocab);
    /* llama-bench's order: per shape (batch, then threads), its pp tests,
       then its tg tests; each test with its own session shape and all its
       runs before the next test's, so a tg run never follows a prefill's
       seconds of full load, nor inherits its batch */
    for (int bi = 0; bi < batch.n; bi++)
        for (int ti = 0; ti < threads.n; ti++)
            for (int which = 0; which < 3; which++) {
                /* which: 0 pp, 1 tg, 2 pp+tg */
                const rb_cli_list *l = which == 1 ? &n_tg : &n_pp;
                for (int li = 0; li < (which == 2 ? (pg.n ? 1 : 0) : l->n); li++)
                    for (int di = 0; di < depths.n; di++) {
                    const uint32_t n_p = which == 0 ? (uint32_t)l->v[li] : which == 2 ? (uint32_t)pg.v[0] : 0;
                    const uint32_t n_g = which == 1 ? (uint32_t)l->v[li] : which == 2 ? (uint32_t)pg.v[1] : 0;
                    const uint32_t depth = (uint32_t)depths.v[di];
                    if (n_p + n_g == 0)
                        continue;
                    bench_test *t = &tests[k];
                    t->tok_s = samples + (size_t)k * reps;
                    k++;
                    rb_session_params p = rb_session_default_params();
                    p.n_threads = (int)threads.v[ti];
                    p.exact_attention = base.exact_attention;
                    p.n_ctx = depth + n_p + n_g + 16;
                    if (batch.v[bi])
                        p.n_batch = (uint32_t)batch.v[bi];
                    else if (n_p || depth)
                        p.n_batch = n_p + depth < 512 ? n_p + depth : 512;
                    t->n_prompt = n_p;
                    t->n_gen = n_g;
                    t->n_depth = depth;
                    t->n_threads = (uint32_t)p.n_threads;
                    t->n_batch = p.n_batch;
                    time_t now = time(NULL);
                    struct tm tmv;
                    strftime(t->time, sizeof t->time, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tmv));
                    /* the warm-up: a short run of the same kind, no depth */
                    double warm;
                    if (run_once(model, &p, tokens, 0, n_p < 32 ? n_p : 32, n_g < 4 ? n_g : 4, &warm))
                        goto done;
                    for (uint64_t r = 0; r < reps; r++)
                        if (run_once(model, &p, tokens, depth, n_p, n_g, &t->tok_s[r]))
                            goto done;
                }
            }
    n_tests = k;
    char cpu[128];
    rb_cli_cpu_name(cpu, sizeof cpu);
    const char *name = strrchr(model_path, '/') ? strrchr(model_path, '/') + 1 : model_path;
    int is_md = !strcmp(output, "md");
    double tg_gbps = 0; /* the last tg test's weight reads, and its threads */
    uint32_t tg_threads = 0;
    if (is_md) {
        printf("| model | size MiB | threads | test | tok/s (median) | min - max |\n");
        printf("|---|---|---|---|---|---|\n");
    }
    for (int i = 0; i < n_tests; i++) {
        bench_test *t = &tests[i];
        int is_tg = t->n_gen > 0 && t->n_prompt == 0;
        char tname[64], tkey[64];
        test_name(t->n_prompt, t->n_gen, t->n_depth, tname, sizeof tname);
        test_name(t->n_prompt, t->n_gen, 0, tkey, sizeof tkey);
        double *x = t->tok_s;
        double sorted[128];
        uint64_t m = reps < 128 ? reps : 128;
        memcpy(sorted, x, m * sizeof *x);
        qsort(sorted, m, sizeof *sorted, cmp_double);
        double med = m % 2 ? sorted[m / 2] : 0.5 * (sorted[m / 2 - 1] + sorted[m / 2]);
        if (is_md)
            printf("| %s | %.1f | %" PRIu32 " | %s | %.2f | %.2f - %.2f |\n", name,
                   (double)mi.tensor_data_bytes / (1 << 20), t->n_threads, tname, med, sorted[0],
                   sorted[m - 1]);
        fprintf(stderr, "result bench=%s depth=%" PRIu32 " model=%s arch=%s size_bytes=%" PRIu64
                " threads=%" PRIu32 " reps=%" PRIu64 " tok_s_median=%.3f tok_s_min=%.3f "
                "tok_s_max=%.3f cpu=\"%s\"\n", tkey, t->n_depth, name, mi.architecture,
                mi.tensor_data_bytes, t->n_threads, reps, med, sorted[0], sorted[m - 1], cpu);
        if (is_tg && !t->n_depth) { /* at a depth tg reads the KV too */
            tg_gbps = med * (double)mi.tensor_data_bytes / 1e9;
            tg_threads = t->n_threads;
        }
    }
    if (tg_threads) {
        uint64_t *buf = malloc(RB_BW_BYTES);
        if (buf) {
            memset(buf, 1, RB_BW_BYTES);
            const double bw1 = read_gbps(buf, 1), bwn = read_gbps(buf, (int)tg_threads);
            free(buf);
            char cpu_d[1024];
            rb_cpu_describe(cpu_d, sizeof cpu_d);
            const char *tier = strstr(cpu_d, "tier: ");
            if (is_md)
                printf("\nread bandwidth (256 MiB, best of 3): %.1f GB/s on 1 thread, %.1f GB/s on %"
                       PRIu32 " threads\ntg reads the weights once per token: %.1f GB/s at the "
                       "median, %.0f%% of the %" PRIu32 "-thread bandwidth\n%.*s\n", bw1, bwn,
                       tg_threads, tg_gbps, 100.0 * tg_gbps / bwn, tg_threads,
                       tier ? (int)strcspn(tier, "\n") : 0, tier ? tier : "");
            fprintf(stderr, "result bench=read_bandwidth threads=1 gbps=%.2f\n"
                    "result bench=read_bandwidth threads=%" PRIu32 " gbps=%.2f\n"
                    "result bench=tg_weight_reads threads=%" PRIu32 " gbps=%.2f "
                    "fraction_of_bandwidth=%.3f\n",
                    bw1, tg_threads, bwn, tg_threads, tg_gbps, tg_gbps / bwn);
        }
    }
    if (!is_md) {
        bench_model bm = {cpu, name, mi.architecture, mi.tensor_data_bytes, n_params};
        print_machine(stdout, output, &bm, tests, n_tests, reps);
    }
    rc = 0;
done:
    free(tokens);
    free(tests);
    free(samples);
    rb_model_close(model);
    if (rb_cli_trace_detach("bench", trace))
        rc = 1;
    return rc;
}
