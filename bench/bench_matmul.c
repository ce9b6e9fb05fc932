/*
 * bench_matmul.c - speed of rb_matmul (not a test; never registered).
 *
 *   decode : y = W x for one token, W of tinyllama's shapes (2048 x 2048,
 *            5632 x 2048, 2048 x 5632), Q4_0 / Q8_0 / Q4_K / Q6_K, 1 and 2
 *            threads. Weights are read from DRAM, not L3: the benchmark
 *            cycles through enough copies of W to exceed 128 MiB (this
 *            machine's L3 is 32 MiB). Reports ns per row and GB/s of weight
 *            bytes read.
 *   prefill: the same matrices times 128 tokens (Q4_0, Q8_0, Q4_K), GOP/s
 *            (2 ops per multiply-add).
 *   model  : the matmuls of a tinyllama-1.1b decode step (22 layers of q, k,
 *            v, o, gate, up, down + the Q6_K output layer), each layer its
 *            own weights: the decode ceiling set by matmul alone, in tok/s,
 *            to compare with llama.cpp's 29.8 tok/s (Q4_0, 2 threads); and
 *            the same with 128-token prefill chunks (llama.cpp pp512: 60.2).
 *
 * Every configuration is verified against the _ref kernels before it is
 * timed (llm.c style). Output: one `result ...` line per measurement
 * (machine-readable: commit, compiler, cpu, threads) and a table.
 *
 * usage: bench_matmul [--quick] [--model] [--prefill] [--cputime]
 *   --prefill  the prefill rows only (no decode, no model)
 *   --cputime  one thread, timed by the process's CPU time: kernel A/B on a
 *              loaded machine, where wall time mostly measures the others
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "matmul.h"
#include "matmul_kernels.h"
#include "quant.h"
#include "threadpool.h"

#ifndef REBOUND_COMMIT
#define REBOUND_COMMIT "unknown"
#endif

static char cpu_name[128] = "unknown";
static int quick;
static int use_cputime; /* --cputime: process CPU time, one thread only */
static int n_pools = 2;
static int only_prefill;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(use_cputime ? CLOCK_PROCESS_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 20);
}

static void read_cpu_name(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = 0;
                snprintf(cpu_name, sizeof cpu_name, "%s", p);
                for (char *c = cpu_name; *c; c++)
                    if (*c == ' ')
                        *c = '_';
            }
            break;
        }
    }
    fclose(f);
}

/* Random weight bytes with small finite f16 scales (speed does not depend
 * on the values; this is much faster than quantizing). */
static void fill_weights(uint32_t type, uint8_t *w, int64_t n_rows, int64_t n_cols)
{
    const rb_type_traits *tr = rb_type_get_traits(type);
    const size_t bytes = (size_t)rb_type_row_bytes(type, (uint64_t)n_cols) * (size_t)n_rows;
    for (size_t i = 0; i < bytes; i++)
        w[i] = (uint8_t)rnd();
    const size_t nb = bytes / tr->block_bytes;
    const rb_f16 s = rb_fp32_to_fp16(0.01f);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = w + b * tr->block_bytes;
        switch (type) {
        case RB_TYPE_Q4_0:
        case RB_TYPE_Q5_0:
        case RB_TYPE_Q8_0: memcpy(blk, &s, 2); break;
        case RB_TYPE_Q4_K: memcpy(blk, &s, 2); memcpy(blk + 2, &s, 2); break;
        case RB_TYPE_Q6_K: memcpy(blk + 208, &s, 2); break;
        case RB_TYPE_F16:
            for (uint32_t i = 0; i < tr->block_bytes; i += 2)
                memcpy(blk + i, &s, 2);
            break;
        default: break;
        }
    }
}

static void *make_act(uint32_t type, int64_t n_cols, int64_t n_tok)
{
    const size_t arb = rb_matmul_act_row_bytes(type, n_cols);
    uint8_t *a = malloc(arb * (size_t)n_tok);
    float *x = malloc(sizeof(float) * (size_t)n_cols);
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t i = 0; i < n_cols; i++)
            x[i] = (float)((int)(rnd() % 2001) - 1000) * 1e-3f;
        rb_matmul_quantize_act(type, x, a + (size_t)t * arb, n_cols);
    }
    free(x);
    return a;
}

/* rb_matmul against the _ref tile on a sample of rows; 0 when it agrees */
static int verify(rb_threadpool *pool, uint32_t type, const uint8_t *w, int64_t n_rows,
                  int64_t n_cols, const void *act, int64_t n_tok)
{
    const size_t wrb = (size_t)rb_type_row_bytes(type, (uint64_t)n_cols);
    const size_t arb = rb_matmul_act_row_bytes(type, n_cols);
    float *y = malloc(sizeof(float) * (size_t)(n_rows * n_tok));
    rb_matmul(pool, type, w, n_rows, n_cols, act, arb, n_tok, y, n_rows);
    int bad = 0;
    for (int64_t t = 0; t < n_tok; t += (n_tok > 8 ? 7 : 1))
        for (int64_t r = 0; r < n_rows; r += 13) {
            float ref;
            rb_matmul_isa_ref.tile[type](n_cols, w + (size_t)r * wrb, wrb, 1,
                                         (const char *)act + (size_t)t * arb, arb, 1, &ref, 1);
            float got = y[t * n_rows + r];
            if (!(fabsf(got - ref) <= 1e-4f * (1.0f + fabsf(ref)))) {
                if (!bad)
                    fprintf(stderr, "verify %s %lldx%lld tok %lld: y[%lld] %g vs ref %g\n",
                            rb_type_name(type), (long long)n_rows, (long long)n_cols,
                            (long long)n_tok, (long long)r, got, ref);
                bad++;
            }
        }
    free(y);
    return bad;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds per call over 7 batches, cycling through n_copies
 * matrices so that the weights come from DRAM. */
static double time_matmul(rb_threadpool *pool, uint32_t type, uint8_t **copies, int n_copies,
                          int64_t n_rows, int64_t n_cols, const void *act, int64_t n_tok,
                          float *y)
{
    const size_t arb = rb_matmul_act_row_bytes(type, n_cols);
    double batch[7];
    const double min_batch_s = quick ? 0.02 : 0.08;
    int c = 0;
    for (int i = 0; i < n_copies; i++) /* warm up: page in every copy */
        rb_matmul(pool, type, copies[i], n_rows, n_cols, act, arb, n_tok, y, n_rows);
    for (int b = 0; b < 7; b++) {
        int calls = 0;
        double t0 = now_s(), t1;
        do {
            rb_matmul(pool, type, copies[c], n_rows, n_cols, act, arb, n_tok, y, n_rows);
            c = (c + 1) % n_copies;
            calls++;
        } while ((t1 = now_s()) - t0 < min_batch_s);
        batch[b] = (t1 - t0) / calls;
    }
    qsort(batch, 7, sizeof batch[0], cmp_double);
    return batch[3];
}

typedef struct shape { int64_t rows, cols; } shape;

static void bench_decode_prefill(rb_threadpool *pools[2])
{
    static const uint32_t types[] = {RB_TYPE_Q4_0, RB_TYPE_Q8_0, RB_TYPE_Q4_K, RB_TYPE_Q6_K};
    static const shape shapes[] = {{2048, 2048}, {5632, 2048}, {2048, 5632}};
    const int64_t prefill_tok = 128;
    printf("\n%-6s %-11s %3s %8s %10s %9s | %s\n", "type", "shape", "thr", "tok", "ns/row",
           "GB/s", "GOP/s (prefill)");
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int64_t n_rows = shapes[si].rows, n_cols = shapes[si].cols;
            const size_t bytes = (size_t)rb_type_row_bytes(type, (uint64_t)n_cols) * (size_t)n_rows;
            int n_copies = (int)((128u << 20) / bytes) + 1;
            uint8_t **copies = malloc(sizeof(uint8_t *) * (size_t)n_copies);
            for (int i = 0; i < n_copies; i++) {
                copies[i] = malloc(bytes);
                fill_weights(type, copies[i], n_rows, n_cols);
            }
            void *act = make_act(type, n_cols, prefill_tok);
            float *y = malloc(sizeof(float) * (size_t)(n_rows * prefill_tok));
            for (int p = 0; p < n_pools; p++) {
                const int nth = rb_threadpool_n_threads(pools[p]);
                for (int pf = only_prefill; pf < 2; pf++) {
                    if (pf && type == RB_TYPE_Q6_K)
                        continue;
                    const int64_t n_tok = pf ? prefill_tok : 1;
                    if (verify(pools[p], type, copies[0], n_rows, n_cols, act, n_tok)) {
                        printf("result bench=matmul VERIFY_FAILED type=%s\n", rb_type_name(type));
                        continue;
                    }
                    double s = time_matmul(pools[p], type, copies, pf ? 2 : n_copies, n_rows,
                                           n_cols, act, n_tok, y);
                    double gbps = (double)bytes / s * 1e-9;
                    double gops = 2.0 * (double)n_rows * (double)n_cols * (double)n_tok / s * 1e-9;
                    double ns_row = s * 1e9 / (double)n_rows;
                    printf("result bench=matmul_%s type=%s rows=%lld cols=%lld tokens=%lld "
                           "threads=%d ns_per_row=%.1f weight_gbps=%.2f gops=%.1f isa=%s "
                           "commit=%s compiler=\"%s\" cpu=%s\n",
                           pf ? "prefill" : "decode", rb_type_name(type), (long long)n_rows,
                           (long long)n_cols, (long long)n_tok, nth, ns_row, gbps, gops,
                           rb_matmul_isa_best()->name, REBOUND_COMMIT, __VERSION__, cpu_name);
                    if (pf)
                        printf("%-6s %5lldx%-5lld %3d %8lld %10s %9s | %.1f\n", rb_type_name(type),
                               (long long)n_rows, (long long)n_cols, nth, (long long)n_tok, "-",
                               "-", gops);
                    else
                        printf("%-6s %5lldx%-5lld %3d %8d %10.1f %9.2f |\n", rb_type_name(type),
                               (long long)n_rows, (long long)n_cols, nth, 1, ns_row, gbps);
                    fflush(stdout);
                }
            }
            for (int i = 0; i < n_copies; i++)
                free(copies[i]);
            free(copies);
            free(act);
            free(y);
        }
    }
}

/* tinyllama-1.1b: dim 2048, 22 layers, 4 KV heads of 64 (k, v: 256 rows),
 * ffn 5632, vocab 32000 (output in Q6_K, as llama-quantize writes it). */
static void bench_model(rb_threadpool *pools[2], uint32_t type)
{
    static const shape layer[] = {{2048, 2048}, {256, 2048}, {256, 2048}, {2048, 2048},
                                  {5632, 2048}, {5632, 2048}, {2048, 5632}};
    enum { N_MATS = 7, N_LAYERS = 22 };
    uint8_t *w[N_LAYERS][N_MATS];
    size_t total = 0;
    for (int l = 0; l < N_LAYERS; l++)
        for (int m = 0; m < N_MATS; m++) {
            size_t b = (size_t)rb_type_row_bytes(type, (uint64_t)layer[m].cols) * (size_t)layer[m].rows;
            w[l][m] = malloc(b);
            fill_weights(type, w[l][m], layer[m].rows, layer[m].cols);
            total += b;
        }
    const uint32_t out_type = RB_TYPE_Q6_K;
    const size_t out_bytes = (size_t)rb_type_row_bytes(out_type, 2048) * 32000;
    uint8_t *out = malloc(out_bytes);
    fill_weights(out_type, out, 32000, 2048);
    total += out_bytes;

    const int64_t pf_tok = quick ? 32 : 128;
    void *a2048 = make_act(type, 2048, pf_tok), *a5632 = make_act(type, 5632, pf_tok);
    void *aout = make_act(out_type, 2048, pf_tok);
    float *y = malloc(sizeof(float) * 32000 * (size_t)pf_tok);
    for (int p = 0; p < 2; p++) {
        const int nth = rb_threadpool_n_threads(pools[p]);
        for (int pf = 0; pf < 2; pf++) {
            const int64_t n_tok = pf ? pf_tok : 1;
            const int reps = pf ? 1 : (quick ? 3 : 10);
            double best = 1e30;
            for (int rep = 0; rep < reps + 1; rep++) { /* first rep warms up */
                double t0 = now_s();
                for (int l = 0; l < N_LAYERS; l++)
                    for (int m = 0; m < N_MATS; m++) {
                        const void *a = layer[m].cols == 2048 ? a2048 : a5632;
                        rb_matmul(pools[p], type, w[l][m], layer[m].rows, layer[m].cols, a,
                                  rb_matmul_act_row_bytes(type, layer[m].cols), n_tok, y,
                                  layer[m].rows);
                    }
                /* the output layer only for the last token, as in generation */
                rb_matmul(pools[p], out_type, out, 32000, 2048, aout,
                          rb_matmul_act_row_bytes(out_type, 2048), 1, y, 32000);
                double s = now_s() - t0;
                if (rep > 0 && s < best)
                    best = s;
            }
            double tok_s = (double)n_tok / best;
            printf("result bench=model_%s model=tinyllama-1.1b type=%s tokens=%lld threads=%d "
                   "tok_per_s=%.1f weight_gbps=%.2f isa=%s commit=%s compiler=\"%s\" cpu=%s\n",
                   pf ? "prefill" : "decode", rb_type_name(type), (long long)n_tok, nth, tok_s,
                   pf ? 0.0 : (double)total / best * 1e-9, rb_matmul_isa_best()->name,
                   REBOUND_COMMIT, __VERSION__, cpu_name);
            printf("tinyllama %s matmuls only, %s %lld tok, %d threads: %.1f tok/s%s\n",
                   rb_type_name(type), pf ? "prefill" : "decode", (long long)n_tok, nth, tok_s,
                   pf ? "" : " (weights from DRAM)");
            fflush(stdout);
        }
    }
    for (int l = 0; l < N_LAYERS; l++)
        for (int m = 0; m < N_MATS; m++)
            free(w[l][m]);
    free(out);
    free(a2048);
    free(a5632);
    free(aout);
    free(y);
}

int main(int argc, char **argv)
{
    int only_model = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            quick = 1;
        else if (strcmp(argv[i], "--model") == 0)
            only_model = 1;
        else if (strcmp(argv[i], "--prefill") == 0)
            only_prefill = 1;
        else if (strcmp(argv[i], "--cputime") == 0)
            use_cputime = 1, n_pools = 1;
        else {
            fprintf(stderr, "usage: bench_matmul [--quick] [--model] [--prefill] [--cputime]\n");
            return 2;
        }
    }
    read_cpu_name();
    rb_threadpool *pools[2] = {NULL, NULL};
    rb_error err;
    for (int p = 0; p < 2; p++)
        if (rb_threadpool_create(p + 1, &pools[p], &err) != RB_OK) {
            fprintf(stderr, "bench_matmul: %s\n", err.message);
            return 1;
        }
    printf("bench_matmul: isa %s, cpu %s, compiler %s\n", rb_matmul_isa_best()->name, cpu_name,
           __VERSION__);
    if (!only_model)
        bench_decode_prefill(pools);
    if (only_prefill)
        goto done;
    bench_model(pools, RB_TYPE_Q4_0);
    bench_model(pools, RB_TYPE_Q8_0);
done:
    for (int p = 0; p < 2; p++)
        rb_threadpool_destroy(pools[p]);
    return 0;
}
