/*
 * bench_wstream_shared.c - decode speed of sessions that stream one
 * model's weights from its one shared stream (wcache_stream.h), against
 * one session alone at the same weight budget:
 *
 *   one   - one session, N tokens one at a time;
 *   alt   - two sessions, one thread alternating their tokens (N in all);
 *   multi - the same two sessions' tokens in one pass each step
 *           (rb_session_decode_multi: every unit read once for both);
 *   thr   - two sessions on two threads at once (N/2 each).
 *
 * The configurations alternate for R rounds in one run (the machine may be
 * shared: ratios to `one` of the same round are what it reports), each
 * after a prompt of 8 tokens and 2 warm-up tokens per session; it prints
 * the total tok/s and the weight bytes read per token (the stream's own
 * counters: one stream, whichever session asks).
 *
 *   bench_wstream_shared MODEL BUDGET% [N=32] [ROUNDS=3] [THREADS=2] [DEVICE=phone]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rebound.h"
#include "rebound_experimental.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static rb_session_params sp;
static rb_experimental_params xp;
static int32_t toks[2][4096];

static void die(const char *what, const char *msg)
{
    fprintf(stderr, "bench_wstream_shared: %s: %s\n", what, msg);
    exit(1);
}

static rb_session *open_warm(rb_model *m, int who)
{
    rb_session *s = NULL;
    rb_error err;
    if (rb_session_create(m, &sp, &s, &err) != RB_OK)
        die("session", err.message);
    if (rb_session_feed(s, toks[who], 8, NULL) != RB_OK ||
        rb_session_feed(s, &toks[who][8], 1, NULL) != RB_OK ||
        rb_session_feed(s, &toks[who][9], 1, NULL) != RB_OK)
        die("warm-up", rb_session_errmsg(s));
    return s;
}

typedef struct {
    rb_session *s;
    int who, n;
} job;

static void *run_job(void *arg)
{
    job *j = arg;
    for (int i = 0; i < j->n; i++)
        if (rb_session_feed(j->s, &toks[j->who][10 + i], 1, NULL) != RB_OK)
            die("feed", rb_session_errmsg(j->s));
    return NULL;
}

/* mode 0 one, 1 alt, 2 multi, 3 thr: tok/s; *bpt bytes read per token */
static double run(rb_model *m, int mode, int n, double *bpt)
{
    rb_session *s[2] = {open_warm(m, 0), mode ? open_warm(m, 1) : NULL};
    rb_session_stats a, b;
    rb_session_get_stats(s[0], &a);
    double t0 = now_s();
    if (mode == 0) {
        job j = {s[0], 0, n};
        run_job(&j);
    } else if (mode == 1) {
        for (int i = 0; i < n / 2; i++)
            for (int k = 0; k < 2; k++)
                if (rb_session_feed(s[k], &toks[k][10 + i], 1, NULL) != RB_OK)
                    die("feed", rb_session_errmsg(s[k]));
    } else if (mode == 2) {
        rb_error err;
        for (int i = 0; i < n / 2; i++) {
            int32_t t[2] = {toks[0][10 + i], toks[1][10 + i]};
            if (rb_session_decode_multi(s, t, 2, &err) != RB_OK)
                die("decode_multi", err.message);
        }
    } else {
        pthread_t th[2];
        job j[2] = {{s[0], 0, n / 2}, {s[1], 1, n / 2}};
        for (int k = 0; k < 2; k++)
            pthread_create(&th[k], NULL, run_job, &j[k]);
        for (int k = 0; k < 2; k++)
            pthread_join(th[k], NULL);
    }
    double dt = now_s() - t0;
    rb_session_get_stats(s[0], &b);
    int tokens = mode ? n / 2 * 2 : n;
    *bpt = (double)(b.weights_read_bytes - a.weights_read_bytes) / tokens;
    rb_session_destroy(s[0]);
    rb_session_destroy(s[1]);
    return tokens / dt;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        die("usage", "MODEL BUDGET% [N=32] [ROUNDS=3] [THREADS=2] [DEVICE=phone]");
    int n = argc > 3 ? atoi(argv[3]) : 32, rounds = argc > 4 ? atoi(argv[4]) : 3;
    if (n < 2 || n > 4000)
        die("usage", "N is 2..4000");
    rb_model *m = NULL;
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    if (rb_model_open(argv[1], &mp, &m, &err) != RB_OK)
        die("model", err.message);
    rb_model_info mi;
    rb_model_get_info(m, &mi);
    sp = rb_session_default_params();
    sp.n_ctx = 256;
    sp.n_threads = argc > 5 ? atoi(argv[5]) : 2;
    sp.weights_budget_bytes = (uint64_t)(atof(argv[2]) / 100.0 * (double)mi.tensor_data_bytes);
    xp = rb_experimental_default_params();
    xp.device = argc > 6 ? argv[6] : "phone";
    sp.experimental = &xp;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 4096; i++)
            toks[k][i] = (int32_t)((i * 7919u + 13u + 4099u * k) % (mi.n_vocab > 1000 ? 1000
                                                                                     : mi.n_vocab));
    printf("weights %.1f MiB, budget %s%% = %.1f MiB, %d tokens per run, device %s, %d threads\n",
           mi.tensor_data_bytes / 1048576.0, argv[2], sp.weights_budget_bytes / 1048576.0, n,
           xp.device, sp.n_threads);
    static const char *names[] = {"one", "alt", "multi", "thr"};
    for (int r = 0; r < rounds; r++) {
        double ts[4], bpt[4];
        for (int k = 0; k < 4; k++) { /* the order rotates per round */
            int mode = (k + r) % 4;
            ts[mode] = run(m, mode, n, &bpt[mode]);
        }
        printf("round %d:", r + 1);
        for (int k = 0; k < 4; k++)
            printf("  %s %.2f tok/s (x%.2f) %.1f MiB/token", names[k], ts[k], ts[k] / ts[0],
                   bpt[k] / 1048576.0);
        printf("\n");
        fflush(stdout);
    }
    rb_model_close(m);
    return 0;
}
