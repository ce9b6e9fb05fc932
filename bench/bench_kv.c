/*
 * bench_kv.c - the KV codec benchmark: ratio, encode and decode
 * speed of every codec mode on KV captured from a real model run, next to
 * lz4 and zstd (-1, -3), the codecs zRAM would use.
 *
 * Method:
 *   1. run the model: the prompt, then greedy tokens up to -n (or the
 *      context); one thread per core, as `rebound run`;
 *   2. capture: every layer's positions cut into units of U tokens (U = 256,
 *      the KV page, or the whole run when shorter), each copied out in the
 *      page layout of kvcache.h (K [heads][U][dk], V [heads][U][dv]);
 *   3. tile the captured units to at least --mb MiB (64 by default) so that
 *      neither the input nor the output stays in the caches;
 *   4. per mode: encode every unit into its own slot, decode all back and
 *      verify (lossless: bit-exact; lossy: the _ref kernels give the same
 *      page) before timing; then time -r passes of encode and of decode
 *      over the whole set, one core, and report the median (the best
 *      pass too, in the machine-readable line). GB/s are
 *      page (f16) bytes per second for both directions;
 *   5. lossless also reports the entropy bound (kvcodec.h) per unit, summed.
 * lz4/zstd compress each unit as one buffer (the same granularity as the
 * codec; zRAM's 4 KiB pages would only compress worse).
 *
 * Output: a human table on stdout and one `result bench=kvcodec ...` line
 * per row (source, mode, ratio, GB/s, commit, compiler, CPU).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvcache.h"
#include "kvcodec.h"
#include "rebound.h"
#include "session_debug.h"

#ifdef REBOUND_HAVE_LZ4
#include <lz4.h>
#endif
#ifdef REBOUND_HAVE_ZSTD
#include <zstd.h>
#endif

#ifndef REBOUND_COMMIT
#define REBOUND_COMMIT "unknown"
#endif

static char cpu_name[128] = "unknown";
/* --cputime: time the codec by this thread's CPU time instead of the wall
 * clock: on a shared machine (load above the core count) the wall clock
 * counts the time other processes held the core. */
static clockid_t bench_clock = CLOCK_MONOTONIC;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(bench_clock, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void read_cpu_name(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char *p = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && p) {
            p += 2;
            p[strcspn(p, "\n")] = 0;
            snprintf(cpu_name, sizeof cpu_name, "%s", p);
            for (char *c = cpu_name; *c; c++)
                if (*c == ' ')
                    *c = '_';
            break;
        }
    }
    fclose(f);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define MAX_REPS 15

typedef struct bench_set {
    rb_kvcodec_dims dims;
    size_t unit_bytes, n_units;
    uint8_t *raw;       /* n_units x unit_bytes */
    uint8_t *out;       /* same size: decode target */
    const char *source; /* label in the rows */
    int reps;
} bench_set;

static void print_row(const bench_set *b, const char *mode, double ratio, double bound_ratio,
                      double enc, double dec, double enc_best, double dec_best, const char *note)
{
    char bound[32] = "";
    if (bound_ratio > 0)
        snprintf(bound, sizeof bound, "%.4f (%.1f%%)", bound_ratio, 100 * ratio / bound_ratio);
    if (note) {
        printf("| %-12s | %-8s | %-18s | %-18s | %-9s | %-9s |\n", b->source, mode, note, "", "", "");
        printf("result bench=kvcodec source=%s mode=%s status=%s commit=%s compiler=\"%s\" cpu=%s\n",
               b->source, mode, note, REBOUND_COMMIT, __VERSION__, cpu_name);
        return;
    }
    printf("| %-12s | %-8s | %-18.4f | %-18s | %9.2f | %9.2f |\n", b->source, mode, ratio, bound,
           enc, dec);
    printf("result bench=kvcodec source=%s mode=%s ratio=%.4f bound_ratio=%.4f enc_gbs=%.3f "
           "dec_gbs=%.3f enc_gbs_best=%.3f dec_gbs_best=%.3f bytes=%zu unit_tokens=%" PRIu32 " heads=%" PRIu32 " dk=%" PRIu32
           " dv=%" PRIu32 " reps=%d threads=1 clock=%s commit=%s compiler=\"%s\" cpu=%s\n",
           b->source, mode, ratio, bound_ratio, enc, dec, enc_best, dec_best,
           b->n_units * b->unit_bytes,
           b->dims.n_tokens, b->dims.n_kv_heads, b->dims.head_dim_k, b->dims.head_dim_v, b->reps,
           bench_clock == CLOCK_MONOTONIC ? "wall" : "thread_cpu", REBOUND_COMMIT, __VERSION__,
           cpu_name);
    fflush(stdout);
}

typedef rb_status (*enc_fn)(const rb_kvcodec_dims *, rb_kvcodec_id, const rb_f16 *, void *,
                            size_t, size_t *, rb_error *);
typedef rb_status (*dec_fn)(const rb_kvcodec_dims *, const void *, size_t, rb_f16 *, size_t,
                            rb_error *);

/* One codec mode: verify, then time. Returns 0, or 1 on a failed check. */
static int bench_mode(bench_set *b, rb_kvcodec_id codec, int ref, double bound_ratio)
{
    const enc_fn enc = ref ? rb_kvcodec_encode_ref : rb_kvcodec_encode;
    const dec_fn dec = ref ? rb_kvcodec_decode_ref : rb_kvcodec_decode;
    const size_t slot = (size_t)rb_kvcodec_bound(&b->dims, codec), elems = b->unit_bytes / 2;
    uint8_t *frames = malloc(slot * b->n_units);
    size_t *sizes = malloc(b->n_units * sizeof *sizes);
    char mode[32];
    snprintf(mode, sizeof mode, "%s%s", rb_kvcodec_name(codec), ref ? "-ref" : "");
    if (!frames || !sizes) {
        fprintf(stderr, "bench_kv: out of memory\n");
        return 1;
    }
    rb_error err;
    double te[MAX_REPS], td[MAX_REPS];
    uint64_t total = 0;
    for (int r = 0; r <= b->reps; r++) { /* pass 0: warm-up and verification */
        double t0 = now_s();
        for (size_t u = 0; u < b->n_units; u++)
            if (enc(&b->dims, codec, (const rb_f16 *)(b->raw + u * b->unit_bytes),
                    frames + u * slot, slot, &sizes[u], &err) != RB_OK) {
                fprintf(stderr, "bench_kv: %s encode: %s\n", mode, err.message);
                return 1;
            }
        double t1 = now_s();
        for (size_t u = 0; u < b->n_units; u++)
            if (dec(&b->dims, frames + u * slot, sizes[u], (rb_f16 *)(b->out + u * b->unit_bytes),
                    elems, &err) != RB_OK) {
                fprintf(stderr, "bench_kv: %s decode: %s\n", mode, err.message);
                return 1;
            }
        double t2 = now_s();
        if (r == 0) {
            for (size_t u = 0; u < b->n_units; u++)
                total += sizes[u];
            if (codec == RB_KVCODEC_LOSSLESS &&
                memcmp(b->raw, b->out, b->n_units * b->unit_bytes) != 0) {
                fprintf(stderr, "bench_kv: lossless round trip is not bit-exact\n");
                return 1;
            }
            if (codec != RB_KVCODEC_LOSSLESS) { /* the _ref decoder agrees on a sample */
                rb_f16 *chk = malloc(b->unit_bytes);
                for (size_t u = 0; u < b->n_units; u += b->n_units / 7 + 1) {
                    rb_kvcodec_decode_ref(&b->dims, frames + u * slot, sizes[u], chk, elems, NULL);
                    if (memcmp(chk, b->out + u * b->unit_bytes, b->unit_bytes)) {
                        fprintf(stderr, "bench_kv: %s: _ref and dispatched decoders differ\n", mode);
                        return 1;
                    }
                }
                free(chk);
            }
            continue;
        }
        te[r - 1] = t1 - t0;
        td[r - 1] = t2 - t1;
    }
    qsort(te, (size_t)b->reps, sizeof *te, cmp_double);
    qsort(td, (size_t)b->reps, sizeof *td, cmp_double);
    const double bytes = (double)(b->n_units * b->unit_bytes);
    print_row(b, mode, bytes / (double)total, bound_ratio, bytes / te[b->reps / 2] / 1e9,
              bytes / td[b->reps / 2] / 1e9, bytes / te[0] / 1e9, bytes / td[0] / 1e9, NULL);
    free(frames);
    free(sizes);
    return 0;
}

enum { GP_LZ4, GP_ZSTD1, GP_ZSTD3 };

/* The general-purpose baselines: same units, same verification. */
static int bench_general(bench_set *b, int which)
{
    const char *mode = which == GP_LZ4 ? "lz4" : which == GP_ZSTD1 ? "zstd-1" : "zstd-3";
#if !defined(REBOUND_HAVE_LZ4)
    if (which == GP_LZ4) {
        print_row(b, mode, 0, 0, 0, 0, 0, 0, "not built (liblz4 not found by pkg-config)");
        return 0;
    }
#endif
#if !defined(REBOUND_HAVE_ZSTD)
    if (which != GP_LZ4) {
        print_row(b, mode, 0, 0, 0, 0, 0, 0, "not built (libzstd not found by pkg-config)");
        return 0;
    }
#endif
    size_t slot = b->unit_bytes + b->unit_bytes / 16 + 1024; /* >= both libraries' bounds */
    uint8_t *frames = malloc(slot * b->n_units);
    size_t *sizes = malloc(b->n_units * sizeof *sizes);
    double te[MAX_REPS], td[MAX_REPS];
    uint64_t total = 0;
    for (int r = 0; r <= b->reps; r++) {
        double t0 = now_s();
        for (size_t u = 0; u < b->n_units; u++) {
            const uint8_t *src = b->raw + u * b->unit_bytes;
            uint8_t *dst = frames + u * slot;
            size_t n = 0;
            (void)src, (void)dst; /* unused when neither library is built in */
#ifdef REBOUND_HAVE_LZ4
            if (which == GP_LZ4)
                n = (size_t)LZ4_compress_default((const char *)src, (char *)dst,
                                                 (int)b->unit_bytes, (int)slot);
#endif
#ifdef REBOUND_HAVE_ZSTD
            if (which != GP_LZ4) {
                n = ZSTD_compress(dst, slot, src, b->unit_bytes, which == GP_ZSTD1 ? 1 : 3);
                if (ZSTD_isError(n))
                    n = 0;
            }
#endif
            if (!n) {
                fprintf(stderr, "bench_kv: %s compress failed\n", mode);
                return 1;
            }
            sizes[u] = n;
        }
        double t1 = now_s();
        for (size_t u = 0; u < b->n_units; u++) {
            uint8_t *dst = b->out + u * b->unit_bytes;
            size_t n = 0;
            (void)dst;
#ifdef REBOUND_HAVE_LZ4
            if (which == GP_LZ4)
                n = (size_t)LZ4_decompress_safe((const char *)frames + u * slot, (char *)dst,
                                                (int)sizes[u], (int)b->unit_bytes);
#endif
#ifdef REBOUND_HAVE_ZSTD
            if (which != GP_LZ4)
                n = ZSTD_decompress(dst, b->unit_bytes, frames + u * slot, sizes[u]);
#endif
            if (n != b->unit_bytes) {
                fprintf(stderr, "bench_kv: %s decompress failed\n", mode);
                return 1;
            }
        }
        double t2 = now_s();
        if (r == 0) {
            for (size_t u = 0; u < b->n_units; u++)
                total += sizes[u];
            if (memcmp(b->raw, b->out, b->n_units * b->unit_bytes)) {
                fprintf(stderr, "bench_kv: %s round trip differs\n", mode);
                return 1;
            }
            continue;
        }
        te[r - 1] = t1 - t0;
        td[r - 1] = t2 - t1;
    }
    qsort(te, (size_t)b->reps, sizeof *te, cmp_double);
    qsort(td, (size_t)b->reps, sizeof *td, cmp_double);
    const double bytes = (double)(b->n_units * b->unit_bytes);
    print_row(b, mode, bytes / (double)total, 0, bytes / te[b->reps / 2] / 1e9,
              bytes / td[b->reps / 2] / 1e9, bytes / te[0] / 1e9, bytes / td[0] / 1e9, NULL);
    free(frames);
    free(sizes);
    return 0;
}

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* The captured KV: n units of one page geometry, and where it came from. */
typedef struct capture {
    rb_kvcodec_dims dims;
    size_t n_units, n_tokens;
    uint32_t n_layers;
    uint8_t *units;
} capture;

/* Steps 1 and 2: run the model, cut every layer's KV into units. */
static int capture_run(const char *model_path, const char *prompt, long n_gen, long n_ctx,
                       long threads, const char *label, capture *c)
{
    rb_error err;
    rb_model *model = NULL;
    if (rb_model_open(model_path, NULL, &model, &err) != RB_OK) {
        fprintf(stderr, "bench_kv: %s\n", err.message);
        return 1;
    }
    rb_session_params sp = rb_session_default_params();
    sp.n_ctx = (uint32_t)n_ctx;
    sp.n_threads = (int)threads;
    rb_session *s = NULL;
    if (rb_session_create(model, &sp, &s, &err) != RB_OK) {
        fprintf(stderr, "bench_kv: %s\n", err.message);
        return 1;
    }
    size_t cap = strlen(prompt) + 8, n_prompt = 0;
    int32_t *toks = malloc(cap * sizeof *toks);
    if (!toks || rb_model_tokenize(model, prompt, strlen(prompt), 1, 1, toks, cap, &n_prompt) != RB_OK ||
        n_prompt == 0 || n_prompt > rb_session_n_ctx(s)) {
        fprintf(stderr, "bench_kv: cannot tokenize the prompt into the context\n");
        return 1;
    }
    double t0 = now_s();
    if (rb_session_feed(s, toks, n_prompt, NULL) != RB_OK) {
        fprintf(stderr, "bench_kv: %s\n", rb_session_errmsg(s));
        return 1;
    }
    for (long i = 0; i < n_gen && rb_session_n_tokens(s) < rb_session_n_ctx(s); i++) {
        int32_t t = argmax(rb_session_get_logits(s), rb_session_n_vocab(s));
        if (rb_session_feed(s, &t, 1, NULL) != RB_OK) {
            fprintf(stderr, "bench_kv: %s\n", rb_session_errmsg(s));
            return 1;
        }
    }
    const size_t T = rb_session_n_tokens(s);
    fprintf(stderr, "bench_kv: %s: %zu tokens run in %.1f s\n", label, T, now_s() - t0);
    const rb_kvcache *kv = rb_session_kvcache(s);
    const uint32_t U = T < RB_KV_PAGE_TOKENS ? (uint32_t)T : RB_KV_PAGE_TOKENS;
    c->dims = (rb_kvcodec_dims){U, kv->n_kv_heads, kv->head_dim_k, kv->head_dim_v};
    c->n_tokens = T;
    c->n_layers = kv->n_layers;
    const size_t per_layer = T / U, ub = (size_t)rb_kvcodec_page_bytes(&c->dims);
    c->n_units = kv->n_layers * per_layer;
    c->units = malloc(c->n_units * ub);
    if (!c->units) {
        fprintf(stderr, "bench_kv: out of memory\n");
        return 1;
    }
    for (size_t u = 0; u < c->n_units; u++) {
        const uint32_t layer = (uint32_t)(u / per_layer), p0 = (uint32_t)(u % per_layer) * U;
        rb_f16 *dst = (rb_f16 *)(c->units + u * ub);
        for (uint32_t h = 0; h < kv->n_kv_heads; h++)
            for (uint32_t t = 0; t < U; t++, dst += kv->head_dim_k)
                memcpy(dst, rb_kvcache_k(kv, layer, h, p0 + t), 2 * kv->head_dim_k);
        for (uint32_t h = 0; h < kv->n_kv_heads; h++)
            for (uint32_t t = 0; t < U; t++, dst += kv->head_dim_v)
                memcpy(dst, rb_kvcache_v(kv, layer, h, p0 + t), 2 * kv->head_dim_v);
    }
    free(toks);
    rb_session_destroy(s);
    rb_model_close(model);
    return 0;
}

/* --save-kv / --load-kv file: "RBKVCAP1", u32 tokens, heads, dk, dv,
 * layers, u64 run tokens, units; then the units (host byte order). */
static int save_capture(const char *path, const capture *c)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return 1;
    uint32_t h[5] = {c->dims.n_tokens, c->dims.n_kv_heads, c->dims.head_dim_k,
                     c->dims.head_dim_v, c->n_layers};
    uint64_t n[2] = {c->n_tokens, c->n_units};
    size_t ub = (size_t)rb_kvcodec_page_bytes(&c->dims);
    int ok = fwrite("RBKVCAP1", 1, 8, f) == 8 && fwrite(h, sizeof h, 1, f) == 1 &&
             fwrite(n, sizeof n, 1, f) == 1 && fwrite(c->units, ub, c->n_units, f) == c->n_units;
    return fclose(f) != 0 || !ok;
}

static int load_capture(const char *path, capture *c)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return 1;
    char magic[8];
    uint32_t h[5];
    uint64_t n[2];
    int ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, "RBKVCAP1", 8) &&
             fread(h, sizeof h, 1, f) == 1 && fread(n, sizeof n, 1, f) == 1;
    c->dims = (rb_kvcodec_dims){h[0], h[1], h[2], h[3]};
    size_t ub = ok ? (size_t)rb_kvcodec_page_bytes(&c->dims) : 0;
    ok = ok && ub && n[1] && n[1] < (1u << 20);
    c->n_layers = h[4];
    c->n_tokens = (size_t)n[0];
    c->n_units = (size_t)n[1];
    c->units = ok ? malloc(c->n_units * ub) : NULL;
    ok = ok && c->units && fread(c->units, ub, c->n_units, f) == c->n_units;
    fclose(f);
    return !ok;
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: bench_kv (-m MODEL | --load-kv FILE) [options]\n"
        "  -m MODEL       GGUF model whose KV is captured\n"
        "  -p PROMPT      prompt (default \"Once upon a time\")\n"
        "  -n N           greedy tokens after the prompt (default 256; stops at the context)\n"
        "  -c N           context (default: the model's trained context)\n"
        "  -t N           threads for the model run (the codec runs on one)\n"
        "  --label NAME   source label in the rows (default: the file name; say\n"
        "                 \"synthetic\" in it for generated models)\n"
        "  --save-kv F    write the captured KV to F;  --load-kv F  use it instead of a run\n"
        "  --mb N         tile the captured KV to at least N MiB (default 64)\n"
        "  -r N           timed passes per mode, median reported (default 5, max 15)\n"
        "  --ref          also time the _ref kernels (lossless, q8)\n"
        "  --only MODE    only this row (lossless, q8, q4, q2, lz4, zstd-1, zstd-3)\n"
        "  --cputime      time by the thread's CPU time, not the wall clock (loaded machine)\n");
}

int main(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = "Once upon a time", *label = NULL;
    const char *only = NULL, *save_path = NULL, *load_path = NULL;
    long n_gen = 256, n_ctx = 0, mb = 64, reps = 5, threads = 0;
    int with_ref = 0;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(o, "--ref")) {
            with_ref = 1;
            continue;
        } else if (!strcmp(o, "--cputime")) {
            bench_clock = CLOCK_THREAD_CPUTIME_ID;
            continue;
        }
        if (!v) {
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(o, "-m"))
            model_path = v;
        else if (!strcmp(o, "-p"))
            prompt = v;
        else if (!strcmp(o, "--only"))
            only = v;
        else if (!strcmp(o, "--label"))
            label = v;
        else if (!strcmp(o, "--save-kv"))
            save_path = v;
        else if (!strcmp(o, "--load-kv"))
            load_path = v;
        else if (!strcmp(o, "-n"))
            n_gen = atol(v);
        else if (!strcmp(o, "-c"))
            n_ctx = atol(v);
        else if (!strcmp(o, "--mb"))
            mb = atol(v);
        else if (!strcmp(o, "-r"))
            reps = atol(v);
        else if (!strcmp(o, "-t"))
            threads = atol(v);
        else {
            usage(stderr);
            return 2;
        }
    }
    if (!!model_path == !!load_path || reps < 1 || reps > MAX_REPS || mb < 1 || n_gen < 0) {
        usage(stderr);
        return 2;
    }
    read_cpu_name();
    const char *src = model_path ? model_path : load_path;
    if (!label)
        label = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;

    capture c;
    memset(&c, 0, sizeof c);
    if (load_path ? load_capture(load_path, &c)
                  : capture_run(model_path, prompt, n_gen, n_ctx, threads, label, &c)) {
        if (load_path)
            fprintf(stderr, "bench_kv: cannot read a capture from '%s'\n", load_path);
        return 1;
    }
    if (save_path && save_capture(save_path, &c)) {
        fprintf(stderr, "bench_kv: cannot write '%s'\n", save_path);
        return 1;
    }

    /* 3. tile */
    bench_set b;
    memset(&b, 0, sizeof b);
    b.source = label;
    b.reps = (int)reps;
    b.dims = c.dims;
    b.unit_bytes = (size_t)rb_kvcodec_page_bytes(&b.dims);
    const size_t n_cap = c.n_units, want = (size_t)mb << 20;
    b.n_units = (want + b.unit_bytes - 1) / b.unit_bytes;
    b.n_units = b.n_units < n_cap ? n_cap : b.n_units;
    b.raw = malloc(b.n_units * b.unit_bytes);
    b.out = malloc(b.n_units * b.unit_bytes);
    if (!b.raw || !b.out) {
        fprintf(stderr, "bench_kv: out of memory\n");
        return 1;
    }
    for (size_t u = 0; u < b.n_units; u++)
        memcpy(b.raw + u * b.unit_bytes, c.units + (u % n_cap) * b.unit_bytes, b.unit_bytes);
    memset(b.out, 0, b.n_units * b.unit_bytes); /* fault the pages in before timing */

    /* 5. the entropy bound over the distinct captured units */
    double bound_bytes = 0;
    for (size_t u = 0; u < n_cap; u++) {
        rb_kvcodec_entropy_info e;
        rb_kvcodec_entropy(&b.dims, (const rb_f16 *)(c.units + u * b.unit_bytes), &e, NULL);
        bound_bytes += e.bound_bytes;
    }
    const double bound_ratio = (double)(n_cap * b.unit_bytes) / bound_bytes;

    printf("KV of %s: %zu tokens, %" PRIu32 " layers x %" PRIu32 " KV heads x %" PRIu32 "/%"
           PRIu32 " dims; %zu distinct units of %" PRIu32 " tokens (%zu KiB), tiled to %zu units"
           " = %.1f MiB; one core, median of %d passes\n\n", label, c.n_tokens, c.n_layers,
           b.dims.n_kv_heads, b.dims.head_dim_k, b.dims.head_dim_v, n_cap, b.dims.n_tokens,
           b.unit_bytes >> 10, b.n_units, (double)(b.n_units * b.unit_bytes) / (1 << 20),
           b.reps);
    printf("| %-12s | %-8s | %-18s | %-18s | %-9s | %-9s |\n", "source", "mode", "ratio",
           "bound (% reached)", "enc GB/s", "dec GB/s");
    printf("|--------------|----------|--------------------|--------------------|-----------|-----------|\n");
    int rc = 0;
#define WANT(name) (!only || !strcmp(only, name))
    if (WANT("lossless"))
        rc |= bench_mode(&b, RB_KVCODEC_LOSSLESS, 0, bound_ratio);
    if (with_ref && WANT("lossless"))
        rc |= bench_mode(&b, RB_KVCODEC_LOSSLESS, 1, bound_ratio);
    if (WANT("q8"))
        rc |= bench_mode(&b, RB_KVCODEC_Q8, 0, 0);
    if (with_ref && WANT("q8"))
        rc |= bench_mode(&b, RB_KVCODEC_Q8, 1, 0);
    if (WANT("q4"))
        rc |= bench_mode(&b, RB_KVCODEC_Q4, 0, 0);
    if (WANT("q2"))
        rc |= bench_mode(&b, RB_KVCODEC_Q2, 0, 0);
    if (WANT("lz4"))
        rc |= bench_general(&b, GP_LZ4);
    if (WANT("zstd-1"))
        rc |= bench_general(&b, GP_ZSTD1);
    if (WANT("zstd-3"))
        rc |= bench_general(&b, GP_ZSTD3);
    free(b.raw);
    free(b.out);
    free(c.units);
    return rc;
}
