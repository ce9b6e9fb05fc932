/*
 * bench_multi.c - decode of several concurrent streams in one forward pass
 * (rb_session_decode_multi) against one stream (rb_session_feed), as
 * aggregate tokens per second.
 *
 * Method:
 *   1. one model, K sessions (K = the largest of --multi), each fed its own
 *      prompt of -p tokens (different tokens per session);
 *   2. verify: one step of all K together, then each session rewound by
 *      one token and fed the same token alone: its logits must be equal bit
 *      for bit (else the benchmark stops);
 *   3. -r rounds, alternating: one stream decodes -n tokens one at a time
 *      (session 0, rb_session_feed); then, for each N of --multi, N
 *      streams decode -n steps together (sessions 0..N-1, one
 *      rb_session_decode_multi per step); every session is rewound to its
 *      prompt after its part of a round, so each part decodes the same
 *      positions. Tokens are fixed (no sampling: the speed of the pass).
 *   4. per N: the median over rounds of aggregate tok/s (N * n / seconds)
 *      and of the ratio to the same round's one stream; and the same
 *      ratio in CPU time per token (all threads), which other processes
 *      on the machine disturb less than the wall clock (the load average
 *      goes into the result line).
 *
 * Output: a table and one `result bench=multi ...` line per N (CPU, tier,
 * threads, model, prompt, steps, rounds).
 *
 * usage: bench_multi -m MODEL [--multi 2,4] [-p 64] [-n 32] [-r 5] [-t N]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rebound.h"

#define MAX_MULTI 16
#define MAX_ROUNDS 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the process's CPU time (every thread): on a machine others load, the
 * wall clock of a memory-bound decode is not its own; CPU seconds per
 * token say what the work costs */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int32_t token_at(uint32_t seq, uint32_t pos, uint32_t n_vocab)
{
    return (int32_t)((seq * 7919u + pos * 104729u + 13u) % n_vocab);
}

static int die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_multi: %s: %s\n", what, msg);
    return 1;
}

int main(int argc, char **argv)
{
    const char *model_path = NULL;
    int multi[MAX_MULTI], n_multi = 0, n_prompt = 64, n_gen = 32, rounds = 5, n_threads = 0;
    for (int i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return die(a, "needs a value (usage: bench_multi -m MODEL [--multi 2,4] [-p 64] "
                          "[-n 32] [-r 5] [-t N])");
        if (!strcmp(a, "-m"))
            model_path = v;
        else if (!strcmp(a, "--multi"))
            for (char *s = argv[i + 1], *end; *s && n_multi < MAX_MULTI; s = *end ? end + 1 : end)
                multi[n_multi++] = (int)strtol(s, &end, 10);
        else if (!strcmp(a, "-p"))
            n_prompt = atoi(v);
        else if (!strcmp(a, "-n"))
            n_gen = atoi(v);
        else if (!strcmp(a, "-r"))
            rounds = atoi(v);
        else if (!strcmp(a, "-t"))
            n_threads = atoi(v);
        else
            return die(a, "unknown option");
    }
    if (!n_multi)
        multi[n_multi++] = 4;
    int k_max = 1;
    for (int i = 0; i < n_multi; i++) {
        if (multi[i] < 2 || multi[i] > MAX_MULTI)
            return die("--multi", "each N must be in 2..16");
        k_max = multi[i] > k_max ? multi[i] : k_max;
    }
    if (!model_path || n_prompt < 1 || n_gen < 1 || rounds < 1 || rounds > MAX_ROUNDS)
        return die("arguments", "-m MODEL is required; -p, -n >= 1; -r in 1..64");
    rb_error err = {0};
    rb_model *m = NULL;
    if (rb_model_open(model_path, NULL, &m, &err) != RB_OK)
        return die(model_path, err.message);
    rb_session_params sp = rb_session_default_params();
    sp.n_ctx = (uint32_t)(n_prompt + n_gen + 1);
    sp.n_threads = n_threads;
    rb_session *s[MAX_MULTI];
    int32_t *buf = malloc((size_t)(n_prompt > n_gen ? n_prompt : n_gen) * sizeof *buf);
    for (int i = 0; i < k_max; i++) {
        if (rb_session_create(m, &sp, &s[i], &err) != RB_OK)
            return die("session", err.message);
        const uint32_t nv = rb_session_n_vocab(s[i]);
        for (int t = 0; t < n_prompt; t++)
            buf[t] = token_at((uint32_t)i, (uint32_t)t, nv);
        if (rb_session_feed(s[i], buf, (size_t)n_prompt, NULL) != RB_OK)
            return die("prompt", rb_session_errmsg(s[i]));
    }
    const uint32_t nv = rb_session_n_vocab(s[0]);
    const size_t P = (size_t)n_prompt;

    /* 2. verify before timing */
    {
        int32_t tok[MAX_MULTI];
        float *got = malloc((size_t)k_max * nv * sizeof *got);
        for (int i = 0; i < k_max; i++)
            tok[i] = token_at((uint32_t)i, (uint32_t)P, nv);
        if (rb_session_decode_multi(s, tok, (size_t)k_max, &err) != RB_OK)
            return die("decode_multi", err.message);
        for (int i = 0; i < k_max; i++)
            memcpy(got + (size_t)i * nv, rb_session_get_logits(s[i]), nv * sizeof *got);
        for (int i = 0; i < k_max; i++) {
            rb_session_rewind(s[i], P);
            if (rb_session_feed(s[i], &tok[i], 1, NULL) != RB_OK)
                return die("feed", rb_session_errmsg(s[i]));
            if (memcmp(got + (size_t)i * nv, rb_session_get_logits(s[i]), nv * sizeof *got)) {
                fprintf(stderr, "bench_multi: session %d: logits of the pass over %d sessions "
                        "differ from feeding it alone; not timing\n", i, k_max);
                return 1;
            }
            rb_session_rewind(s[i], P);
        }
        free(got);
        printf("verified: %d sessions decoded together = each alone, logits bit for bit\n",
               k_max);
    }

    /* 3. alternating rounds */
    double one[MAX_ROUNDS], agg[MAX_MULTI][MAX_ROUNDS], ratio[MAX_MULTI][MAX_ROUNDS];
    double one_cpu[MAX_ROUNDS], cpu_ratio[MAX_MULTI][MAX_ROUNDS]; /* CPU ms per token */
    for (int r = 0; r < rounds; r++) {
        for (int t = 0; t < n_gen; t++)
            buf[t] = token_at(0, (uint32_t)(P + t), nv);
        double t0 = now_s(), c0 = cpu_s();
        for (int t = 0; t < n_gen; t++)
            if (rb_session_feed(s[0], &buf[t], 1, NULL) != RB_OK)
                return die("feed", rb_session_errmsg(s[0]));
        one[r] = n_gen / (now_s() - t0);
        one_cpu[r] = (cpu_s() - c0) * 1e3 / n_gen;
        rb_session_rewind(s[0], P);
        for (int k = 0; k < n_multi; k++) {
            const int N = multi[k];
            int32_t tok[MAX_MULTI];
            t0 = now_s();
            c0 = cpu_s();
            for (int t = 0; t < n_gen; t++) {
                for (int i = 0; i < N; i++)
                    tok[i] = token_at((uint32_t)i, (uint32_t)(P + t), nv);
                if (rb_session_decode_multi(s, tok, (size_t)N, &err) != RB_OK)
                    return die("decode_multi", err.message);
            }
            agg[k][r] = (double)N * n_gen / (now_s() - t0);
            ratio[k][r] = agg[k][r] / one[r];
            cpu_ratio[k][r] = one_cpu[r] / ((cpu_s() - c0) * 1e3 / ((double)N * n_gen));
            for (int i = 0; i < N; i++)
                rb_session_rewind(s[i], P);
        }
        fprintf(stderr, "round %d: 1 stream %.2f tok/s", r + 1, one[r]);
        for (int k = 0; k < n_multi; k++)
            fprintf(stderr, ", %d streams %.2f tok/s (%.2fx)", multi[k], agg[k][r], ratio[k][r]);
        fprintf(stderr, "\n");
    }

    /* 4. report */
    char desc[1024], cpu[256] = "unknown", tier[64] = "unknown";
    rb_cpu_describe(desc, sizeof desc);
    sscanf(desc, "cpu: %255[^\n]", cpu);
    const char *tl = strstr(desc, "tier: ");
    if (tl)
        sscanf(tl, "tier: %63s", tier);
    const int threads = n_threads > 0 ? n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    double one_med = median(one, rounds), one_cpu_med = median(one_cpu, rounds);
    double load[3] = {0, 0, 0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
            load[0] = -1;
        fclose(la);
    }
    printf("\n| streams | aggregate tok/s (median of %d) | per stream | vs 1 stream (median "
           "ratio) | CPU ms per token | vs 1 stream |\n|---|---|---|---|---|---|\n"
           "| 1 | %.2f | %.2f | 1.00x | %.1f | 1.00x |\n", rounds, one_med, one_med, one_cpu_med);
    for (int k = 0; k < n_multi; k++) {
        double a = median(agg[k], rounds), q = median(ratio[k], rounds);
        double cq = median(cpu_ratio[k], rounds);
        printf("| %d | %.2f | %.2f | %.2fx | %.1f | %.2fx |\n", multi[k], a, a / multi[k], q,
               one_cpu_med / cq, cq);
        printf("result bench=multi streams=%d agg_tok_s=%.2f one_tok_s=%.2f ratio=%.3f "
               "cpu_ratio=%.3f prompt=%d gen=%d rounds=%d threads=%d tier=%s load1=%.2f "
               "model=%s cpu=\"%s\"\n", multi[k], a, one_med, q, cq, n_prompt, n_gen, rounds,
               threads, tier, load[0], model_path, cpu);
    }
    for (int i = 0; i < k_max; i++)
        rb_session_destroy(s[i]);
    free(buf);
    rb_model_close(m);
    return 0;
}
