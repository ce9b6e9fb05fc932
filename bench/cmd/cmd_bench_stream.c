/*
 * cmd_bench_stream.c - `rebound bench --weights-budget 25%,50%,75%
 * [--policy class,lru] [--device phone]`: decode speed when the weights do
 * not fit the memory given, every configuration in one run:
 *
 *   1. the compute rate C: decode with every weight in RAM;
 *   2. per budget and policy: a streaming session (wcache_stream.h) warmed
 *      up by two tokens (the first pass reads everything and forms the
 *      pinned loop prefix), then -n tokens one at a time; measured tok/s,
 *      bytes read per token, the storage bandwidth the reads achieved, and
 *      the largest RSS seen (sampled every millisecond);
 *   3. the prediction min(C, BW / bytes per token), where bytes per token
 *      is N - S for class (S: the pinned loop prefix) and N for the others
 *      (a loop larger than the cache misses on every block), and BW the
 *      device profile's bandwidth (or, on the host profile, the bandwidth
 *      the run's reads achieved);
 *   4. where the machine permits (root, a memory cgroup), a plain mmap run
 *      of the same decode in a child process under a cgroup memory limit of
 *      the budget plus the run state: what the page cache does.
 *
 * Reaches past include/rebound.h for the cgroup (as `switch` does).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cgroup.h"
#include "cli.h"
#include "rebound.h"
#include "rebound_experimental.h"

#define MAX_ITEMS 16

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &res) != 2)
            res = 0;
        fclose(f);
    }
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

typedef struct rss_sampler {
    pthread_t thread;
    atomic_int stop;
    _Atomic uint64_t max;
} rss_sampler;

static void *sample_main(void *arg)
{
    rss_sampler *r = arg;
    while (!atomic_load(&r->stop)) {
        uint64_t v = rss_bytes();
        if (v > atomic_load(&r->max))
            atomic_store(&r->max, v);
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

typedef struct stream_run {
    double tok_s, bytes_per_token, bw, wait_ms_per_token, io_frac, room_frac, idle_frac;
    uint64_t max_rss, rss0, session_bytes;
    rb_session_stats st;
} stream_run;

/* -n tokens one at a time after a warm-up of 2; the stats at the end. */
static int decode_run(rb_model *model, const rb_session_params *p, const int32_t *tokens,
                      uint32_t n, uint64_t rss_base, stream_run *out)
{
    memset(out, 0, sizeof *out);
    out->rss0 = rss_base;
    rb_session *s = NULL;
    rb_error err;
    if (rb_session_create(model, p, &s, &err) != RB_OK)
        return rb_cli_fail("bench", err.message, NULL);
    rb_status st = rb_session_feed(s, tokens, 1, NULL);
    if (st == RB_OK)
        st = rb_session_feed(s, tokens + 1, 1, NULL);
    rb_session_stats a, b;
    rb_session_get_stats(s, &a);
    rss_sampler rs = {0};
    atomic_store(&rs.max, rss_bytes());
    int has_sampler = pthread_create(&rs.thread, NULL, sample_main, &rs) == 0;
    double t0 = rb_cli_now_s();
    for (uint32_t i = 0; i < n && st == RB_OK; i++)
        st = rb_session_feed(s, &tokens[2 + i], 1, NULL);
    double t1 = rb_cli_now_s();
    if (has_sampler) {
        atomic_store(&rs.stop, 1);
        pthread_join(rs.thread, NULL);
    }
    if (st != RB_OK) {
        rb_cli_fail("bench", rb_session_errmsg(s), NULL);
        rb_session_destroy(s);
        return 1;
    }
    rb_session_get_stats(s, &b);
    out->st = b;
    out->tok_s = n / (t1 - t0);
    out->max_rss = atomic_load(&rs.max);
    out->session_bytes = b.weights_budget_bytes + b.scratch_bytes + b.other_bytes +
                         b.kv_raw_bytes;
    if (b.weights_streaming) {
        uint64_t passes = b.weights_passes - a.weights_passes;
        double io = b.weights_io_s - a.weights_io_s;
        uint64_t bytes = b.weights_read_bytes - a.weights_read_bytes;
        out->bytes_per_token = passes ? (double)bytes / passes : 0;
        out->bw = io > 0 ? bytes / io : 0;
        out->wait_ms_per_token = passes ? (b.weights_wait_s - a.weights_wait_s) * 1e3 / passes
                                        : 0;
        double wall = t1 - t0;
        out->io_frac = io / wall;
        out->room_frac = (b.weights_room_wait_s - a.weights_room_wait_s) / wall;
        out->idle_frac = (b.weights_idle_s - a.weights_idle_s) / wall;
    }
    rb_session_destroy(s);
    return 0;
}

/* "25%,50%,3G" -> bytes (percent of the weight bytes); count or -1. */
static int parse_budgets(const char *v, uint64_t weights, uint64_t *out, int max)
{
    int n = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", v ? v : "");
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (n == max)
            return -1;
        size_t len = strlen(t);
        if (len > 1 && t[len - 1] == '%') {
            double pct = atof(t);
            if (!(pct > 0 && pct <= 1000))
                return -1;
            out[n++] = (uint64_t)(pct / 100.0 * (double)weights);
        } else if (rb_cli_parse_u64(t, &out[n++]) || out[n - 1] == 0) {
            return -1;
        }
    }
    return n;
}

/*
 * The page cache's answer: a child `rebound bench --mmap -p 0 -n N` inside
 * a memory cgroup of `limit` bytes. tok/s, or a negative value with *why.
 */
static double mmap_cgroup_run(const char *model_path, uint64_t limit, uint32_t n, int threads,
                              char *why, size_t why_n)
{
    rb_cgroup *cg = NULL;
    rb_error err;
    char label[64];
    /* the file's pages out of the page cache first: pages another process
       (or the compute-rate run) cached stay charged to it, and the child's
       faults would hit them for free */
    int fd = open(model_path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    snprintf(label, sizeof label, "bench-mmap-%" PRIu64, limit >> 20);
    if (rb_cgroup_create(label, limit, &cg, &err) != RB_OK) {
        snprintf(why, why_n, "%s", err.message);
        return -1;
    }
    int go[2], out[2];
    if (pipe(go) != 0 || pipe(out) != 0) {
        rb_cgroup_destroy(cg, &err);
        snprintf(why, why_n, "pipe failed");
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        char c;
        close(go[1]);
        close(out[0]);
        if (read(go[0], &c, 1) != 1)
            _exit(127);
        dup2(out[1], 2);
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0)
            dup2(devnull, 1);
        char nbuf[32], tbuf[32];
        snprintf(nbuf, sizeof nbuf, "%u", (unsigned)n);
        snprintf(tbuf, sizeof tbuf, "%d", threads);
        execl("/proc/self/exe", "rebound", "bench", "-m", model_path, "--mmap", "-p", "0",
              "-n", nbuf, "-r", "1", "-t", tbuf, (char *)NULL);
        _exit(127);
    }
    close(go[0]);
    close(out[1]);
    double tok_s = -1;
    if (pid < 0 || rb_cgroup_attach(cg, pid, &err) != RB_OK) {
        snprintf(why, why_n, "%s", pid < 0 ? "fork failed" : err.message);
        if (pid > 0)
            kill(pid, SIGKILL);
    } else if (write(go[1], "g", 1) == 1) {
        char line[1024];
        FILE *f = fdopen(out[0], "r");
        while (f && fgets(line, sizeof line, f)) {
            const char *m = strstr(line, "result bench=tg");
            const char *v = m ? strstr(m, "tok_s_median=") : NULL;
            if (v)
                tok_s = atof(v + 13);
        }
        if (f)
            fclose(f);
        out[0] = -1;
        if (tok_s < 0)
            snprintf(why, why_n, "the child reported no result (killed by the limit?)");
    }
    close(go[1]);
    if (out[0] >= 0)
        close(out[0]);
    int status = 0;
    if (pid > 0)
        waitpid(pid, &status, 0);
    rb_cgroup_destroy(cg, &err);
    return tok_s;
}

int rb_cmd_bench_stream(int argc, char **argv)
{
    const char *model_path = NULL, *budgets_arg = NULL, *policies_arg = "class,lru";
    const char *device = "phone";
    uint64_t n_tg = 16, n_threads = 0;
    int do_cgroup = 1;
    /* bench's table (cmd_bench.c) parsed argv already and has the help */
    const char *ignored = NULL;
    int ignored_flag = 0;
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &model_path, 0, 0, NULL, NULL},
        {"--weights-budget", RB_OPT_STR, "B[,B..]",
         "budgets: BYTES (K/M/G) or N% of the weights, comma-separated", &budgets_arg, 0, 0,
         NULL, NULL},
        {"--policy", RB_OPT_STR, "P[,P..]", "weight cache policies: class, lru (default both)",
         &policies_arg, 0, 0, NULL, NULL},
        {"--device", RB_OPT_STR, "D", "storage profile: phone (default), watch, host", &device, 0,
         0, NULL, NULL},
        {"-n|--n-gen", RB_OPT_SIZE, "N", "tokens decoded per configuration (default 16)", &n_tg,
         1, 4096, NULL, NULL},
        {"-t|--threads", RB_OPT_SIZE, "N", "threads (default: all cores)", &n_threads, 0, 256,
         NULL, NULL},
        {"--no-cgroup", RB_OPT_FLAG_OFF, NULL,
         "skip the page-cache baseline under a memory cgroup", &do_cgroup, 0, 0, NULL, NULL},
        /* one decode run per configuration: pp tests and repeats do not apply */
        {"-p|--n-prompt|-r|--repetitions|-o|--output|-b|--batch-size", RB_OPT_STR, "X",
         "accepted, do not apply here", &ignored, 0, 0, NULL, NULL},
        {"--mmap|--no-mmap", RB_OPT_FLAG, NULL, "accepted, do not apply here", &ignored_flag, 0,
         0, NULL, NULL},
        /* llama.cpp's GPU flags: `bench` noted them already */
        {"-ngl|--gpu-layers|--n-gpu-layers|-fa|--flash-attn", RB_OPT_STR, "X", "noted by bench",
         &ignored, 0, 0, NULL, NULL},
        {"--mlock", RB_OPT_FLAG, NULL, "noted by bench", &ignored_flag, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cmd = {
        "bench", "-m MODEL --weights-budget 25%,50%,75% [--policy class,lru] [--device D] [-n 16]",
        NULL, opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (!model_path)
        return rb_cli_usage_error("bench", "no model given (-m MODEL)", NULL);
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    rb_model *model = NULL;
    if (rb_model_open(model_path, &mp, &model, &err) != RB_OK)
        return rb_cli_fail("bench", err.message, NULL);
    rb_model_info mi;
    rb_model_get_info(model, &mi);
    uint64_t rss_base = rss_bytes(); /* the process before any session: code, header, vocab */
    uint64_t budgets[MAX_ITEMS];
    int n_budgets = parse_budgets(budgets_arg, mi.tensor_data_bytes, budgets, MAX_ITEMS);
    char pol_buf[256];
    const char *policies[MAX_ITEMS];
    int n_pol = 0;
    snprintf(pol_buf, sizeof pol_buf, "%s", policies_arg);
    for (char *save = NULL, *t = strtok_r(pol_buf, ",", &save); t && n_pol < MAX_ITEMS;
         t = strtok_r(NULL, ",", &save))
        policies[n_pol++] = t;
    int rc = 1;
    int32_t *tokens = malloc((n_tg + 3) * sizeof *tokens);
    if (n_budgets <= 0 || n_pol == 0 || !tokens) {
        rb_cli_fail("bench", n_budgets <= 0 ? "--weights-budget needs BYTES or N% values, "
                    "comma-separated" : "out of memory", NULL);
        goto done;
    }
    for (uint32_t i = 0; i < n_tg + 3; i++)
        tokens[i] = (int32_t)(((uint64_t)i * 2654435761u + 1) % mi.n_vocab);
    rb_session_params p = rb_session_default_params();
    p.n_threads = (int)n_threads;
    p.n_ctx = (uint32_t)n_tg + 16;
    rb_experimental_params x = rb_experimental_default_params();
    x.device = device;
    p.experimental = &x;
    const char *name = strrchr(model_path, '/') ? strrchr(model_path, '/') + 1 : model_path;

    /* 1. the compute rate, every weight in RAM */
    stream_run full;
    if (decode_run(model, &p, tokens, (uint32_t)n_tg, rss_base, &full))
        goto done;
    printf("model %s: %.1f MiB of weights; device %s; compute rate (all weights in RAM) "
           "%.2f tok/s\n\n", name, mi.tensor_data_bytes / 1048576.0, device, full.tok_s);
    printf("| budget | policy | S pinned MiB | N-S MiB | read MiB/token | storage MB/s | "
           "predicted tok/s (profile BW) | predicted (BW achieved) | measured tok/s | "
           "measured / predicted | waited ms/token | max RSS MiB (session budget) |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int bi = 0; bi < n_budgets; bi++) {
        double class_tok_s = 0, lru_tok_s = 0, n_over = 0;
        for (int pi = 0; pi < n_pol; pi++) {
            rb_session_params q = p;
            q.weights_budget_bytes = budgets[bi];
            q.weights_policy = policies[pi];
            stream_run r;
            if (decode_run(model, &q, tokens, (uint32_t)n_tg, rss_base, &r))
                goto done;
            const rb_session_stats *s = &r.st;
            int is_class = !strcmp(policies[pi], "class");
            double expect = is_class ? (double)(s->weights_loop_bytes -
                                                s->weights_pinned_loop_bytes)
                                     : (double)s->weights_loop_bytes;
            /* the profile's bandwidth when throttled, else what the reads achieved */
            double bw = s->storage_bytes_per_s > 0 && strcmp(device, "host") != 0
                            ? s->storage_bytes_per_s : r.bw;
            double pred = expect > 0 && bw > 0 ? bw / expect : full.tok_s;
            if (pred > full.tok_s)
                pred = full.tok_s;
            /* the same with the bandwidth the reads achieved: a shared host
               disk may deliver less than the profile (the throttle can only
               slow it down) */
            double pred_real = expect > 0 && r.bw > 0 ? r.bw / expect : full.tok_s;
            if (pred_real > full.tok_s)
                pred_real = full.tok_s;
            if (is_class) {
                class_tok_s = r.tok_s;
                n_over = expect > 0 ? (double)s->weights_loop_bytes / expect : 0;
            } else if (!strcmp(policies[pi], "lru")) {
                lru_tok_s = r.tok_s;
            }
            double pct = 100.0 * (double)budgets[bi] / (double)mi.tensor_data_bytes;
            printf("| %.0f%% (%.1f MiB) | %s | %.1f | %.1f | %.1f | %.0f | %.2f | %.2f | %.2f | "
                   "%.2f / %.2f | %.1f | %.1f (%.1f) |\n", pct, budgets[bi] / 1048576.0,
                   policies[pi], s->weights_pinned_loop_bytes / 1048576.0, expect / 1048576.0,
                   r.bytes_per_token / 1048576.0, r.bw / 1e6, pred, pred_real, r.tok_s,
                   r.tok_s / pred, r.tok_s / pred_real,
                   r.wait_ms_per_token, r.max_rss / 1048576.0,
                   (r.session_bytes + r.rss0) / 1048576.0);
            fprintf(stderr, "result bench=stream model=%s budget_bytes=%" PRIu64 " policy=%s "
                    "device=%s tok_s=%.3f predicted_tok_s=%.3f predicted_achieved_bw_tok_s=%.3f "
                    "compute_tok_s=%.3f "
                    "read_bytes_per_token=%.0f bw_bytes_per_s=%.0f loop_bytes=%" PRIu64
                    " pinned_bytes=%" PRIu64 " max_rss_bytes=%" PRIu64 " rss_before_bytes=%"
                    PRIu64 " session_budget_bytes=%" PRIu64 " reader_reading=%.3f "
                    "reader_waiting_window=%.3f reader_idle=%.3f\n", name, budgets[bi],
                    policies[pi], device, r.tok_s, pred, pred_real, full.tok_s, r.bytes_per_token,
                    r.bw,
                    s->weights_loop_bytes, s->weights_pinned_loop_bytes, r.max_rss, r.rss0,
                    r.session_bytes, r.io_frac, r.room_frac, r.idle_frac);
        }
        if (class_tok_s > 0 && lru_tok_s > 0)
            printf("|  | class / lru (target: N/(N-S) x 0.9) | | | | | %.2f x 0.9 = %.2f | | %.2f "
                   "| | | |\n",
                   n_over, 0.9 * n_over, class_tok_s / lru_tok_s);
        if (do_cgroup) {
            char why[RB_ERROR_MESSAGE_MAX + 64] = "";
            /* the same session budget, plus the process baseline */
            uint64_t limit = budgets[bi] + full.st.scratch_bytes + full.st.other_bytes +
                             full.st.kv_raw_bytes + rss_base;
            double t = mmap_cgroup_run(model_path, limit, (uint32_t)n_tg, (int)n_threads, why,
                                       sizeof why);
            if (t > 0)
                printf("|  | mmap, cgroup limit %.0f MiB (host disk through the page cache, "
                       "not throttled) | | | | | | | %.2f | | | |\n", limit / 1048576.0, t);
            else
                printf("|  | mmap under a cgroup limit: not run (%s) | | | | | | | | | | |\n",
                       why);
        }
    }
    rc = 0;
done:
    free(tokens);
    rb_model_close(model);
    return rc;
}
