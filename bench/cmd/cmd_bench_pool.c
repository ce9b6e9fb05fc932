/*
 * cmd_bench_pool.c - `rebound bench-pool`: the app-switch workload with K
 * conversations on one model under one memory pool.
 *
 * K sessions of the model, C tokens of context each, in one pool; first
 * every conversation is built and takes a warm turn (all resident: the
 * warm TTFT), then the pool's budget is set to the weights, the sessions'
 * run state and about 1/K of their KV, and the user returns to the
 * conversations in a shuffled order, R rounds, each time with a short turn
 * (8 tokens). Each return's TTFT is the feed of its turn (the restore of
 * what the pool took runs inside it, layer by layer). The recompute
 * baseline is what a runtime without tiers pays: the conversation's
 * prefill plus the turn. A thread samples the process's RSS every 2 ms.
 * Then (unless --no-verify) the same turns run again on never-trimmed
 * sessions, and every turn's logits are compared bit for bit.
 *
 * Think time and prefetch (--think-ms, --prefetch): the user spends N ms
 * in a conversation before its turn (opens it, reads, types). With
 * prefetch on, at the start of that time the app does what a real one
 * would: the returning conversation goes to the foreground
 * (rb_session_set_priority, which begins its restore at once) and the
 * pool prefetches, with what budget is left free, the conversation most
 * likely to come next (rb_pool_prefetch_next). Off: all conversations
 * stay background (the pool's order is the same: the feeding one is
 * trimmed last) and nothing restores before the feed. alternate: returns
 * take turns, so both are measured in one run, under the same load.
 *
 * Output: a table on stdout, every figure as JSON (--json), and the
 * timeline picture (--svg): each return's TTFT, and RSS against the
 * budget over the run.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "rebound.h"
#include "rebound_experimental.h"

#define MAX_K 64
#define MAX_RETURNS 4096
#define MAX_SAMPLES 200000

typedef struct ret_rec {
    int conv;
    int prefetch;         /* this return prefetched during its think time */
    uint64_t prefetch_bytes; /* what its prefetches brought before the feed */
    double t_start, ttft_s;
    uint64_t bytes_io, bytes_dec;
    uint32_t recomputed;
    double io_s, dec_s, wait_s; /* the restore's workers' busy times, the pass's waits */
    uint64_t logits_hash;
    double rss_max_mib, rss_after_mib; /* the process's RSS during the return, and after */
} ret_rec;

typedef struct rss_sampler {
    atomic_int stop;
    double t0;
    uint64_t max_rss, max_anon;
    uint32_t n;
    float *t, *rss; /* MiB */
    pthread_t th;
} rss_sampler;

static void read_rss(uint64_t *rss, uint64_t *anon)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0, shared = 0;
    if (f) {
        if (fscanf(f, "%lu %lu %lu", &size, &res, &shared) != 3)
            res = shared = 0;
        fclose(f);
    }
    long page = sysconf(_SC_PAGESIZE);
    *rss = (uint64_t)res * (uint64_t)page;
    *anon = (uint64_t)(res > shared ? res - shared : 0) * (uint64_t)page;
}

static void *sample_loop(void *arg)
{
    rss_sampler *r = arg;
    while (!atomic_load(&r->stop)) {
        uint64_t rss, anon;
        read_rss(&rss, &anon);
        if (rss > r->max_rss)
            r->max_rss = rss;
        if (anon > r->max_anon)
            r->max_anon = anon;
        if (r->n < MAX_SAMPLES) {
            r->t[r->n] = (float)(rb_cli_now_s() - r->t0);
            r->rss[r->n] = (float)((double)rss / 1048576.0);
            r->n++;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static uint64_t fnv(const float *x, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    const unsigned char *b = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof *x; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int opt_prefetch(void *dest, const char *v, char *why, size_t why_n)
{
    static const char *const names[] = {"off", "on", "alternate"};
    for (int i = 0; v && i < 3; i++)
        if (!strcmp(v, names[i])) {
            *(int *)dest = i;
            return 0;
        }
    snprintf(why, why_n, "off, on or alternate");
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(double *v, int n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double pos = q * (n - 1);
    int i = (int)pos;
    double f = pos - i;
    return i + 1 < n ? v[i] * (1 - f) + v[i + 1] * f : v[i];
}

typedef struct bench_opts {
    const char *model, *device, *json, *svg;
    uint32_t k, ctx, turn, rounds, n_batch, think_ms;
    int prefetch; /* 0 off, 1 on, 2 alternate */
    int n_threads, no_verify;
    uint64_t budget, seed;
    rb_restore_mode restore;
    rb_ram_codec codec;
} bench_opts;

/* The conversation tokens: C of context, then one turn per return. */
static void conv_tokens(const bench_opts *o, uint32_t n_vocab, int k, int32_t *out, size_t n)
{
    uint64_t s = o->seed * 1000003u + (uint64_t)k;
    for (size_t i = 0; i < n; i++)
        out[i] = (int32_t)(splitmix(&s) % n_vocab);
}

/* The sessions of one pass: created in `pool`, each prefilled with its C
 * tokens (prefill_s) and given its warm turn (warm_s). */
static int build(const bench_opts *o, rb_model *model, rb_pool *pool, rb_session **s,
                 int32_t **toks, size_t *pos, double *prefill_s, double *warm_s)
{
    rb_experimental_params x = rb_experimental_default_params();
    x.device = o->device;
    rb_session_params p = rb_session_default_params();
    p.n_ctx = o->ctx + o->turn * (o->rounds + 2) + 16;
    p.n_batch = o->n_batch;
    p.n_threads = o->n_threads;
    p.restore = o->restore;
    p.ram_codec = o->codec;
    p.pool = pool;
    p.experimental = &x;
    rb_error err;
    for (uint32_t k = 0; k < o->k; k++) {
        if (rb_session_create(model, &p, &s[k], &err) != RB_OK)
            return rb_cli_fail("bench-pool", err.message, NULL);
        double t0 = rb_cli_now_s();
        if (rb_session_feed(s[k], toks[k], o->ctx, NULL) != RB_OK)
            return rb_cli_fail("bench-pool", rb_session_errmsg(s[k]), NULL);
        double t1 = rb_cli_now_s();
        if (rb_session_feed(s[k], toks[k] + o->ctx, o->turn, NULL) != RB_OK)
            return rb_cli_fail("bench-pool", rb_session_errmsg(s[k]), NULL);
        double t2 = rb_cli_now_s();
        prefill_s[k] = t1 - t0;
        warm_s[k] = t2 - t1;
        pos[k] = o->ctx + o->turn;
        fprintf(stderr, "bench-pool: conversation %u: %u tokens in %.2f s, warm turn %.1f ms\n",
                k, o->ctx, t1 - t0, 1e3 * (t2 - t1));
    }
    return 0;
}

int rb_cmd_bench_pool(int argc, char **argv)
{
    bench_opts o = {.device = "phone", .k = 4, .ctx = 2048, .turn = 8, .rounds = 3,
                    .n_batch = 128, .seed = 1, .restore = RB_RESTORE_PIPELINED,
                    .codec = RB_RAM_CODEC_LOSSLESS};
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &o.model, 0, 0, NULL, NULL},
        {"-k|--conversations", RB_OPT_U32, "K", "conversations (default 4)", &o.k, 1, MAX_K,
         NULL, NULL},
        {"-c|--ctx", RB_OPT_U32, "C", "tokens of context per conversation (default 2048)", &o.ctx,
         1, 1 << 20, NULL, NULL},
        {"--turn", RB_OPT_U32, "N", "tokens of each returning turn (default 8)", &o.turn, 1, 4096,
         NULL, NULL},
        {"--rounds", RB_OPT_U32, "R", "rounds of returns, each a shuffled order (default 3)",
         &o.rounds, 1, 64, NULL, NULL},
        {"--budget", RB_OPT_SIZE, "BYTES",
         "the pool's budget (K/M/G); default: the weights, the sessions' run state\n"
         "and 1/K of their KV", &o.budget, 1, 1e19, NULL, NULL},
        {"--device", RB_OPT_STR, "D", "storage profile: phone (default), watch, host", &o.device,
         0, 0, NULL, NULL},
        {"--restore", RB_OPT_CALL, "MODE", "pipelined (default), eager, recompute", &o.restore, 0,
         0, rb_cli_opt_restore, NULL},
        {"--ram-codec", RB_OPT_CALL, "CODEC", "the RAM tier's codec: lossless (default), q8",
         &o.codec, 0, 0, rb_cli_opt_ram_codec, NULL},
        {"-t|--threads", RB_OPT_INT, "N", "threads (default: all cores)", &o.n_threads, 0, 256,
         NULL, NULL},
        {"-b|--batch-size", RB_OPT_U32, "N", "prefill batch (default 128)", &o.n_batch, 1, 65536,
         NULL, NULL},
        {"--seed", RB_OPT_SIZE, "N", "tokens and order seed (default 1)", &o.seed, 0, 1e18, NULL,
         NULL},
        {"--think-ms", RB_OPT_U32, "N",
         "idle time before each return's turn (the user reads, types; default 0)",
         &o.think_ms, 0, 600000, NULL, NULL},
        {"--prefetch", RB_OPT_CALL, "MODE",
         "restore during the think time: off (default), on, alternate\n"
         "(returns take turns: both measured in one run)", &o.prefetch, 0, 0, opt_prefetch,
         NULL},
        {"--json", RB_OPT_STR, "FILE", "every figure as JSON", &o.json, 0, 0, NULL, NULL},
        {"--svg", RB_OPT_STR, "FILE", "the timeline picture", &o.svg, 0, 0, NULL, NULL},
        {"--no-verify", RB_OPT_FLAG, NULL,
         "skip the second pass that checks every turn's logits against\n"
         "never-trimmed sessions", &o.no_verify, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cmd = {
        "bench-pool",
        "-m MODEL [-k 4] [-c 2048] [--turn 8] [--rounds 3] [--device phone]\n"
        "    [--think-ms N] [--prefetch off|on|alternate] [--json F] [--svg F]",
        "K conversations of one model under one memory pool whose budget holds the\n"
        "weights and about 1/K of their KV; the user returns to them in shuffled\n"
        "order with short turns. Reports each return's TTFT against the warm turn\n"
        "and against recomputing the context, bytes restored per tier, max RSS.",
        opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (!o.model)
        return rb_cli_usage_error("bench-pool", "no model given (-m MODEL)", NULL);

    rb_error err;
    rb_model *model = NULL;
    if (rb_model_open(o.model, NULL, &model, &err) != RB_OK)
        return rb_cli_fail("bench-pool", err.message, NULL);
    rb_model_info info;
    rb_model_get_info(model, &info);
    const uint32_t n_vocab = info.n_vocab;
    const size_t n_conv_tokens = o.ctx + (size_t)o.turn * (o.rounds + 1);
    const int n_ret = (int)(o.k * o.rounds);
    int rc = 1;
    rb_session *s[MAX_K] = {0};
    int32_t *toks[MAX_K] = {0};
    size_t pos[MAX_K];
    double prefill_s[MAX_K], warm_s[MAX_K];
    ret_rec *rec = calloc((size_t)n_ret, sizeof *rec);
    int *order = calloc((size_t)n_ret, sizeof *order);
    rss_sampler smp = {.t0 = rb_cli_now_s()};
    smp.t = malloc(MAX_SAMPLES * sizeof *smp.t);
    smp.rss = malloc(MAX_SAMPLES * sizeof *smp.rss);
    rb_pool *pool = NULL;
    if (!rec || !order || !smp.t || !smp.rss)
        goto out;
    for (uint32_t k = 0; k < o.k; k++) {
        if (!(toks[k] = malloc(n_conv_tokens * sizeof *toks[k])))
            goto out;
        conv_tokens(&o, n_vocab, (int)k, toks[k], n_conv_tokens);
    }
    /* the order: R shuffled rounds */
    uint64_t rs = o.seed ^ 0x5eedull;
    for (uint32_t r = 0; r < o.rounds; r++) {
        int *ord = order + r * o.k;
        for (uint32_t k = 0; k < o.k; k++)
            ord[k] = (int)k;
        for (uint32_t k = o.k; k > 1; k--) {
            uint32_t j = (uint32_t)(splitmix(&rs) % k);
            int t = ord[k - 1];
            ord[k - 1] = ord[j];
            ord[j] = t;
        }
    }

    if (rb_pool_create(model, 0, &pool, &err) != RB_OK) {
        rb_cli_fail("bench-pool", err.message, NULL);
        goto out;
    }
    /* the budget bounds the process: what it holds besides the weights and
       the sessions (measured before they exist, so that nothing of theirs
       is taken for it) */
    rb_pool_count_process(pool);
    atomic_init(&smp.stop, 0);
    pthread_create(&smp.th, NULL, sample_loop, &smp);
    if (build(&o, model, pool, s, toks, pos, prefill_s, warm_s))
        goto stop;
    rb_pool_stats ps;
    rb_pool_get_stats(pool, &ps);
    uint64_t kv_all = 0;
    for (uint32_t k = 0; k < o.k; k++) {
        rb_session_stats st;
        rb_session_get_stats(s[k], &st);
        kv_all += st.kv_raw_bytes;
    }
    uint64_t budget = o.budget ? o.budget : ps.total_bytes - kv_all + kv_all / o.k;
    fprintf(stderr, "bench-pool: pool holds %.1f MiB (weights %.1f, KV %.1f, process other "
            "%.1f); budget %.1f MiB\n", ps.total_bytes / 1048576.0, ps.weights_bytes / 1048576.0,
            kv_all / 1048576.0, ps.base_bytes / 1048576.0, budget / 1048576.0);
    double t_budget = rb_cli_now_s() - smp.t0;
    rb_pool_set_budget(pool, budget);
    uint64_t max_rss_before = smp.max_rss;
    smp.max_rss = smp.max_anon = 0; /* from the budget on */

    for (uint32_t j = 0; j < o.k; j++) /* off: nothing restores before a feed */
        rb_session_set_priority(s[j], RB_PRIORITY_BACKGROUND);
    for (int i = 0; i < n_ret; i++) {
        int k = order[i];
        const int pre = o.prefetch == 1 || (o.prefetch == 2 && i % 2 == 0);
        rb_session_stats st0;
        rb_session_get_stats(s[k], &st0);
        for (uint32_t j = 0; j < o.k; j++)
            if ((int)j != k || !pre)
                rb_session_set_priority(s[j], RB_PRIORITY_BACKGROUND);
        if (pre) { /* the user opens conversation k: it comes to the front */
            rb_session_set_priority(s[k], RB_PRIORITY_FOREGROUND);
            rb_pool_prefetch_next(pool, NULL, NULL); /* the free rest, for the next one */
        }
        if (o.think_ms) {
            struct timespec ts = {o.think_ms / 1000, (long)(o.think_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        double t0 = rb_cli_now_s();
        if (rb_session_feed(s[k], toks[k] + pos[k], o.turn, NULL) != RB_OK) {
            rb_cli_fail("bench-pool", rb_session_errmsg(s[k]), NULL);
            goto stop;
        }
        double t1 = rb_cli_now_s();
        rb_session_stats st;
        rb_session_get_stats(s[k], &st);
        rec[i] = (ret_rec){k, pre, st.prefetch_bytes - st0.prefetch_bytes, t0 - smp.t0, t1 - t0, st.restore_bytes_io,
                           st.restore_bytes_decoded, st.restore_recomputed_tokens,
                           st.restore_io_s, st.restore_decode_s, st.restore_wait_s,
                           fnv(rb_session_get_logits(s[k]), n_vocab), 0, 0};

        pos[k] += o.turn;
    }
    rc = 0;
stop:
    atomic_store(&smp.stop, 1);
    pthread_join(smp.th, NULL);
    for (uint32_t k = 0; k < o.k; k++) {
        rb_session_destroy(s[k]);
        s[k] = NULL;
    }
    rb_pool_destroy(pool);
    pool = NULL;
    if (rc)
        goto out;

    /* the same turns on sessions that are never trimmed */
    int verified = -1, mismatches = 0;
    if (!o.no_verify) {
        rc = 1;
        if (rb_pool_create(model, 0, &pool, &err) != RB_OK) {
            rb_cli_fail("bench-pool", err.message, NULL);
            goto out;
        }
        double ps2[MAX_K], ws2[MAX_K];
        fprintf(stderr, "bench-pool: verifying on never-trimmed sessions\n");
        if (build(&o, model, pool, s, toks, pos, ps2, ws2))
            goto out;
        for (int i = 0; i < n_ret; i++) {
            int k = order[i];
            if (rb_session_feed(s[k], toks[k] + pos[k], o.turn, NULL) != RB_OK) {
                rb_cli_fail("bench-pool", rb_session_errmsg(s[k]), NULL);
                goto out;
            }
            mismatches += fnv(rb_session_get_logits(s[k]), n_vocab) != rec[i].logits_hash;
            pos[k] += o.turn;
        }
        verified = mismatches == 0;
        rc = 0;
    }

    /* RSS during each return (its TTFT window) and at the next one's start */
    for (int i = 0; i < n_ret; i++) {
        double a = rec[i].t_start, b = a + rec[i].ttft_s;
        double next = i + 1 < n_ret ? rec[i + 1].t_start : b + 0.05;
        for (uint32_t j = 0; j < smp.n; j++) {
            if (smp.t[j] >= a && smp.t[j] <= b && smp.rss[j] > rec[i].rss_max_mib)
                rec[i].rss_max_mib = smp.rss[j];
            if (smp.t[j] > b && smp.t[j] <= next)
                rec[i].rss_after_mib = smp.rss[j]; /* the last sample before the next */
        }
    }
    /* the figures */
    double *v = malloc((size_t)(n_ret + o.k) * sizeof *v);
    if (!v) {
        rc = 1;
        goto out;
    }
    for (int i = 0; i < n_ret; i++)
        v[i] = rec[i].ttft_s;
    double ret_p50 = quantile(v, n_ret, 0.5), ret_p95 = quantile(v, n_ret, 0.95);
    double ret_max = quantile(v, n_ret, 1.0);
    /* by mode: the returns that prefetched during their think time, and not */
    double mode_p50[2] = {0, 0}, mode_p95[2] = {0, 0};
    int mode_n[2] = {0, 0};
    for (int m = 0; m < 2; m++) {
        int n = 0;
        for (int i = 0; i < n_ret; i++)
            if (rec[i].prefetch == m)
                v[n++] = rec[i].ttft_s;
        mode_n[m] = n;
        mode_p50[m] = quantile(v, n, 0.5);
        mode_p95[m] = quantile(v, n, 0.95);
    }
    for (uint32_t k = 0; k < o.k; k++)
        v[k] = warm_s[k];
    double warm_p50 = quantile(v, (int)o.k, 0.5);
    for (uint32_t k = 0; k < o.k; k++)
        v[k] = prefill_s[k] + warm_s[k];
    double rec_p50 = quantile(v, (int)o.k, 0.5);
    free(v);
    uint64_t io = 0, dec = 0, recomputed = 0;
    for (int i = 0; i < n_ret; i++) {
        io += rec[i].bytes_io;
        dec += rec[i].bytes_dec;
        recomputed += rec[i].recomputed;
    }
    const double mib = 1048576.0;
    static const char *const pf_names[] = {"off", "on", "alternate"};
    printf("## bench-pool: %u conversations x %u tokens, %u-token turns, %u rounds, device %s, "
           "think %u ms, prefetch %s\n\n", o.k, o.ctx, o.turn, o.rounds, o.device, o.think_ms,
           pf_names[o.prefetch]);
    /* where a return's time went: the forward pass waited for restored
       layers (wait), computed the rest; the workers' busy times overlap it */
    printf("| return | conversation | TTFT ms | vs warm | waited for the restore ms | "
           "restored from storage MiB (I/O ms) | decoded MiB (ms) | recomputed tokens | "
           "RSS during / after, MiB | prefetch (MiB before the feed) |\n"
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < n_ret; i++)
        printf("| %d | %d | %.1f | %.2fx | %.1f | %.2f (%.1f) | %.2f (%.1f) | %u | "
               "%.1f / %.1f | %s (%.1f) |\n",
               i + 1, rec[i].conv, 1e3 * rec[i].ttft_s, rec[i].ttft_s / warm_p50,
               1e3 * rec[i].wait_s, rec[i].bytes_io / mib, 1e3 * rec[i].io_s,
               rec[i].bytes_dec / mib, 1e3 * rec[i].dec_s, rec[i].recomputed,
               rec[i].rss_max_mib, rec[i].rss_after_mib, rec[i].prefetch ? "on" : "off",
               rec[i].prefetch_bytes / mib);
    printf("\n| figure | value |\n|---|---:|\n");
    printf("| warm turn TTFT, median | %.1f ms |\n", 1e3 * warm_p50);
    printf("| returning turn TTFT, median / p95 / max | %.1f / %.1f / %.1f ms |\n", 1e3 * ret_p50,
           1e3 * ret_p95, 1e3 * ret_max);
    printf("| p95 return / warm | %.2fx (target <= 1.5x) |\n", ret_p95 / warm_p50);
    for (int m = 1; m >= 0; m--)
        if (mode_n[m])
            printf("| returns with prefetch %s (%d): TTFT median / p95 | %.1f / %.1f ms |\n",
                   m ? "on" : "off", mode_n[m], 1e3 * mode_p50[m], 1e3 * mode_p95[m]);
    printf("| recompute baseline (prefill + turn), median | %.1f ms |\n", 1e3 * rec_p50);
    printf("| recompute / p95 return | %.1fx (target >= 10x) |\n", rec_p50 / ret_p95);
    printf("| restored: storage / RAM tier / recomputed tokens | %.1f MiB / %.1f MiB / %" PRIu64
           " |\n", io / mib, dec / mib, recomputed);
    printf("| budget | %.1f MiB |\n", budget / mib);
    printf("| max RSS over the returns (anonymous) | %.1f MiB (%.1f MiB): %.1f%% of budget |\n",
           smp.max_rss / mib, smp.max_anon / mib, 100.0 * (double)smp.max_rss / (double)budget);
    printf("| max RSS while building (no budget) | %.1f MiB |\n", max_rss_before / mib);
    printf("| every turn's logits = a never-trimmed session's | %s |\n",
           verified < 0 ? "not checked (--no-verify)"
           : verified ? "yes (bit for bit)" : "NO");
    if (verified == 0)
        printf("\n%d of %d turns differ\n", mismatches, n_ret);
    if (o.json) {
        FILE *f = fopen(o.json, "w");
        if (!f) {
            rc = rb_cli_fail("bench-pool", "cannot write the JSON file", o.json);
            goto out;
        }
        fprintf(f, "{\"model\": \"%s\", \"conversations\": %u, \"ctx\": %u, \"turn\": %u, "
                   "\"rounds\": %u, \"device\": \"%s\", \"budget_bytes\": %" PRIu64 ",\n",
                o.model, o.k, o.ctx, o.turn, o.rounds, o.device, budget);
        fprintf(f, " \"warm_ttft_s\": [");
        for (uint32_t k = 0; k < o.k; k++)
            fprintf(f, "%s%.6f", k ? ", " : "", warm_s[k]);
        fprintf(f, "],\n \"prefill_s\": [");
        for (uint32_t k = 0; k < o.k; k++)
            fprintf(f, "%s%.6f", k ? ", " : "", prefill_s[k]);
        fprintf(f, "],\n \"returns\": [\n");
        for (int i = 0; i < n_ret; i++)
            fprintf(f, "  {\"conversation\": %d, \"t_s\": %.6f, \"ttft_s\": %.6f, "
                       "\"restored_io_bytes\": %" PRIu64 ", \"decoded_bytes\": %" PRIu64 ", "
                       "\"recomputed_tokens\": %u, \"restore_io_s\": %.6f, "
                       "\"restore_decode_s\": %.6f, \"restore_wait_s\": %.6f, "
                       "\"rss_max_mib\": %.1f, \"rss_after_mib\": %.1f, \"prefetch\": %s, "
                       "\"prefetched_bytes\": %" PRIu64 "}%s\n",
                    rec[i].conv, rec[i].t_start, rec[i].ttft_s, rec[i].bytes_io, rec[i].bytes_dec,
                    rec[i].recomputed, rec[i].io_s, rec[i].dec_s, rec[i].wait_s,
                    rec[i].rss_max_mib, rec[i].rss_after_mib, rec[i].prefetch ? "true" : "false",
                    rec[i].prefetch_bytes, i + 1 < n_ret ? "," : "");
        fprintf(f, " ],\n \"return_ttft_p50_s\": %.6f, \"return_ttft_p95_s\": %.6f, "
                   "\"warm_ttft_p50_s\": %.6f, \"recompute_ttft_p50_s\": %.6f,\n"
                   " \"think_ms\": %u, \"prefetch\": \"%s\", \"prefetch_on_p50_s\": %.6f, "
                   "\"prefetch_on_p95_s\": %.6f, \"prefetch_off_p50_s\": %.6f, "
                   "\"prefetch_off_p95_s\": %.6f,\n"
                   " \"max_rss_bytes\": %" PRIu64 ", \"max_anon_bytes\": %" PRIu64 ", "
                   "\"lossless\": %s}\n", ret_p50, ret_p95, warm_p50, rec_p50, o.think_ms,
                pf_names[o.prefetch], mode_p50[1], mode_p95[1], mode_p50[0], mode_p95[0],
                smp.max_rss,
                smp.max_anon, verified < 0 ? "null" : verified ? "true" : "false");
        fclose(f);
    }
    if (o.svg) {
        FILE *f = fopen(o.svg, "w");
        if (!f) {
            rc = rb_cli_fail("bench-pool", "cannot write the SVG file", o.svg);
            goto out;
        }
        const double W = 900, H = 420, x0 = 60, y0 = 20, pw = W - x0 - 20, ph = 160;
        double t_end = smp.n ? smp.t[smp.n - 1] : 1;
        double rmax = budget / mib * 1.2;
        for (uint32_t i = 0; i < smp.n; i++)
            if (smp.rss[i] > rmax)
                rmax = smp.rss[i] * 1.05;
        fprintf(f, "<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' "
                   "font-family='sans-serif' font-size='11'>\n<rect width='100%%' height='100%%' "
                   "fill='white'/>\n", W, H);
        fprintf(f, "<text x='%.0f' y='14'>RSS (MiB) over the run; dashed: the budget (set at "
                   "%.1f s)</text>\n<polyline fill='none' stroke='#1f77b4' points='", x0,
                t_budget);
        uint32_t step = smp.n > 2000 ? smp.n / 2000 : 1;
        for (uint32_t i = 0; i < smp.n; i += step)
            fprintf(f, "%.1f,%.1f ", x0 + pw * smp.t[i] / t_end,
                    y0 + ph - ph * smp.rss[i] / rmax);
        double yb = y0 + ph - ph * (budget / mib) / rmax;
        fprintf(f, "'/>\n<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' stroke='#d62728' "
                   "stroke-dasharray='4 3'/>\n", x0 + pw * t_budget / t_end, x0 + pw, yb, yb);
        fprintf(f, "<text x='4' y='%.1f'>%.0f</text><text x='4' y='%.1f'>0</text>\n", y0 + 4,
                rmax, y0 + ph);
        /* TTFT bars per return */
        const double by0 = y0 + ph + 50, bh = 160;
        double tmax = ret_max > warm_p50 ? ret_max * 1.1 : warm_p50 * 1.1;
        fprintf(f, "<text x='%.0f' y='%.1f'>TTFT of each return (bars, ms; one colour per "
                   "conversation); dashed: the warm turn's median</text>\n", x0, by0 - 8);
        static const char *col[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                    "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
        double bw = pw / n_ret;
        for (int i = 0; i < n_ret; i++) {
            double h = bh * rec[i].ttft_s / tmax;
            fprintf(f, "<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' fill='%s'/>\n",
                    x0 + i * bw + 1, by0 + bh - h, bw > 3 ? bw - 2 : bw, h, col[rec[i].conv % 8]);
        }
        double yw = by0 + bh - bh * warm_p50 / tmax;
        fprintf(f, "<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' stroke='black' "
                   "stroke-dasharray='4 3'/>\n<text x='4' y='%.1f'>%.0f</text>\n</svg>\n", x0,
                x0 + pw, yw, yw, by0 + 4, 1e3 * tmax);
        fclose(f);
    }
out:
    for (uint32_t k = 0; k < o.k && k < MAX_K; k++) {
        rb_session_destroy(s[k]);
        free(toks[k]);
    }
    rb_pool_destroy(pool);
    rb_model_close(model);
    free(rec);
    free(order);
    free(smp.t);
    free(smp.rss);
    return rc;
}
