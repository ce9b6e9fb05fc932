/*
 * bench_grammar.c - what constrained sampling costs per token: the sampler
 * with a grammar (mask, draw, advance) against the same sampler without,
 * over the same rows of logits, in CPU time (which other processes on the
 * machine disturb less than the wall clock).
 *
 * Method:
 *   1. the model's vocabulary only (no weights are computed): a grammar
 *      from a JSON Schema file (-s) or any JSON object (no -s);
 *   2. rows of random logits (normal, scale 3, seeded) as a random-weight
 *      model gives, -n of them, made before any timing;
 *   3. verify: every token the grammar's sampler draws is one the grammar
 *      allowed (rb_grammar_accept on a second grammar); the text so far
 *      stays a prefix of a valid document;
 *   4. -r rounds, alternating: -n tokens sampled free, then -n under the
 *      grammar (reset when it completes); per round the CPU ms per token
 *      of each and their difference (the grammar's overhead); medians
 *      printed with the share of trie walks and cache hits.
 *
 * Output: a table and one `result bench=grammar ...` line.
 *
 * usage: bench_grammar -m MODEL [-s SCHEMA.json] [-n 400] [-r 5]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grammar.h"
#include "rebound.h"

static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return 1e3 * (double)t.tv_sec + 1e-6 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double normal(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    double u = ((double)(rng >> 11) + 0.5) * 0x1.0p-53;
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    double v = ((double)(rng >> 11) + 0.5) * 0x1.0p-53;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *schema_path = NULL;
    int n = 400, rounds = 5;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model_path = argv[++i];
        else if (!strcmp(argv[i], "-s") && i + 1 < argc)
            schema_path = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-r") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_grammar -m MODEL [-s SCHEMA.json] [-n 400] [-r 5]\n");
            return 2;
        }
    }
    if (!model_path || n < 1 || rounds < 1 || rounds > 64) {
        fprintf(stderr, "usage: bench_grammar -m MODEL [-s SCHEMA.json] [-n 400] [-r 5]\n");
        return 2;
    }
    char *schema = NULL;
    size_t schema_len = 0;
    if (schema_path) {
        FILE *f = fopen(schema_path, "rb");
        if (!f) {
            perror(schema_path);
            return 1;
        }
        schema = malloc(1 << 20);
        schema_len = fread(schema, 1, (1 << 20) - 1, f);
        fclose(f);
    }
    rb_error err;
    rb_model *m = NULL;
    if (rb_model_open(model_path, NULL, &m, &err) != RB_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    rb_model_info info;
    rb_model_get_info(m, &info);
    uint32_t V = info.n_vocab;
    double t0 = cpu_ms();
    rb_grammar *g = NULL, *check = NULL;
    if (rb_grammar_from_json_schema(m, schema, schema_len, &g, &err) != RB_OK ||
        rb_grammar_from_json_schema(m, schema, schema_len, &check, &err) != RB_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    double t_create = cpu_ms() - t0;
    float *rows = malloc(sizeof *rows * (size_t)V * (size_t)n);
    for (size_t i = 0; i < (size_t)V * (size_t)n; i++)
        rows[i] = (float)(3.0 * normal());
    rb_sampler_params p = rb_sampler_default_params();
    p.temp = 1.0f;
    rb_sampler *free_s = NULL, *gram_s = NULL;
    rb_sampler_create(&p, V, &free_s, NULL);
    rb_sampler_create(&p, V, &gram_s, NULL);
    rb_sampler_set_grammar(gram_s, g);
    double d_free[64], d_gram[64], d_over[64];
    long n_docs = 0;
    for (int r = 0; r < rounds; r++) {
        int32_t t;
        double a = cpu_ms();
        for (int i = 0; i < n; i++)
            rb_sampler_sample(free_s, rows + (size_t)i * V, NULL, 0, &t);
        double b = cpu_ms();
        for (int i = 0; i < n; i++) {
            if (!rb_grammar_can_continue(g) || (rb_grammar_is_complete(g) && i % 97 == 0)) {
                rb_grammar_reset(g);
                rb_grammar_reset(check);
                n_docs++;
            }
            if (rb_sampler_sample(gram_s, rows + (size_t)i * V, NULL, 0, &t) != RB_OK) {
                fprintf(stderr, "sample: %s\n", rb_sampler_errmsg(gram_s));
                return 1;
            }
            if (rb_model_token_is_eog(m, t)) {
                rb_grammar_reset(g);
                rb_grammar_reset(check);
                n_docs++;
            } else if (rb_grammar_accept(check, t) != RB_OK) { /* 3. verify */
                fprintf(stderr, "verify: token %d was not allowed: %s\n", (int)t,
                        rb_grammar_errmsg(check));
                return 1;
            }
        }
        double c = cpu_ms();
        d_free[r] = (b - a) / n;
        d_gram[r] = (c - b) / n;
        d_over[r] = d_gram[r] - d_free[r];
        printf("round %d: free %.3f ms/token, grammar %.3f ms/token, overhead %.3f ms/token\n", r,
               d_free[r], d_gram[r], d_over[r]);
    }
    qsort(d_free, (size_t)rounds, sizeof(double), cmp_d);
    qsort(d_gram, (size_t)rounds, sizeof(double), cmp_d);
    qsort(d_over, (size_t)rounds, sizeof(double), cmp_d);
    rb_grammar_stats gs;
    rb_grammar_get_stats(g, &gs);
    double hits = (double)gs.n_cache_hits / (double)(gs.n_cache_hits + gs.n_walks);
    printf("vocabulary %u tokens, grammar built in %.1f ms CPU, %ld documents; trie walks %llu "
           "(%.0f nodes each), cached masks %.1f%%\n", V, t_create, n_docs,
           (unsigned long long)gs.n_walks,
           gs.n_walks ? (double)gs.n_trie_visits / (double)gs.n_walks : 0.0, 100 * hits);
    printf("result bench=grammar model=%s schema=%s n_vocab=%u tokens=%d rounds=%d "
           "free_ms=%.3f grammar_ms=%.3f overhead_ms=%.3f cache_hit=%.3f\n", model_path,
           schema_path ? schema_path : "json_object", V, n, rounds, d_free[rounds / 2],
           d_gram[rounds / 2], d_over[rounds / 2], hits);
    rb_sampler_destroy(free_s);
    rb_sampler_destroy(gram_s);
    rb_grammar_destroy(g);
    rb_grammar_destroy(check);
    rb_model_close(m);
    free(rows);
    free(schema);
    return 0;
}
