/*
 * cmd_plan.c - `rebound plan`: the capacity model (tools/analysis/plan.h) for a device
 * profile: how much of the weight loop must stay pinned so that storage
 * delivers the rest in time, with the hot set and the KV cache drawing on
 * the same page-cache pool. With -m MODEL the loop is the model's per-token
 * weight bytes and the hot set its GGUF header (metadata, tokenizer).
 * A tool subcommand: uses the internal headers of model, profile, plan.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "gguf.h"
#include "model.h"
#include "plan.h"
#include "profile.h"

/* "1.1B", "360M", "7e9": a parameter count with decimal suffixes. */
static int parse_count(const char *s, double *out)
{
    if (!s)
        return -1;
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0))
        return -1;
    double mul = *end == 'K' || *end == 'k' ? 1e3 : *end == 'M' || *end == 'm' ? 1e6
               : *end == 'B' || *end == 'b' || *end == 'G' || *end == 'g' ? 1e9 : 1;
    if (mul != 1)
        end++;
    if (*end)
        return -1;
    *out = v * mul;
    return 0;
}

static int opt_count(void *dest, const char *v, char *why, size_t why_n)
{
    if (parse_count(v, dest)) {
        snprintf(why, why_n, "a positive count (K, M, B suffixes: 1.1B, 360M)");
        return -1;
    }
    return 0;
}

static int opt_quant(void *dest, const char *v, char *why, size_t why_n)
{
    if (rb_plan_bytes_per_param(v) == 0) {
        snprintf(why, why_n, "int4, q4_0, q4_k, q8_0 or f16");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

static int opt_cache(void *dest, const char *v, char *why, size_t why_n)
{
    if (v[0] == '-') {
        snprintf(why, why_n, "a pool size: the cache pool cannot be negative");
        return -1;
    }
    if (rb_cli_parse_u64(v, dest)) {
        snprintf(why, why_n, "a size in bytes (K/M/G)");
        return -1;
    }
    return 0;
}

static void mib(char *buf, size_t n, uint64_t b) { snprintf(buf, n, "%.1f MiB", (double)b / RB_MIB); }

int rb_cmd_plan(int argc, char **argv)
{
    const char *device = NULL, *model_path = NULL, *quant = "q4_0";
    double bw = NAN, lat_us = NAN, tps = 10.0, params = 0;
    uint64_t request = 0, cache = 0, hot = 0, ctx = 0, kv = 0, loop = 0;
    int has_cache = 0, has_hot = 0, has_kv = 0, has_ctx = 0;
    const rb_opt opts[] = {
        {"--device", RB_OPT_STR, "D", "watch, phone, host, custom, or all (each in turn)", &device,
         0, 0, NULL, NULL},
        {"--bw", RB_OPT_DOUBLE, "MIB_S", "storage read bandwidth (overrides the profile)", &bw, 0,
         0, NULL, NULL},
        {"--latency", RB_OPT_DOUBLE, "US", "per-request latency in microseconds", &lat_us, 0, 0,
         NULL, NULL},
        {"--request", RB_OPT_SIZE, "BYTES", "largest merged read request", &request, 0, 0, NULL,
         NULL},
        {"--cache", RB_OPT_CALL, "BYTES",
         "the page-cache pool the OS gives the model app (default: the\n"
         "profile's range: watch 64M, phone 512M and 1G)", &cache, 0, 0, opt_cache, &has_cache},
        {"--hot", RB_OPT_SIZE, "BYTES", "hot set (default 4M, or the model's GGUF header with -m)",
         &hot, 0, 0, NULL, &has_hot},
        {"-m|--model", RB_OPT_STR, "FILE",
         "take the loop (per-token weight bytes) and KV size from a GGUF model", &model_path, 0,
         0, NULL, NULL},
        {"-c|--ctx-size", RB_OPT_SIZE, "CTX",
         "context length: KV share = KV bytes per token x CTX (needs -m)", &ctx, 0, UINT32_MAX,
         NULL, &has_ctx},
        {"--kv", RB_OPT_SIZE, "BYTES", "KV share given directly", &kv, 0, 0, NULL, &has_kv},
        {"--loop", RB_OPT_SIZE, "BYTES", "loop length N per token given directly", &loop, 0, 0,
         NULL, NULL},
        {"--params", RB_OPT_CALL, "N", "loop from a parameter count (1.1B, 360M) at --quant",
         &params, 0, 0, opt_count, NULL},
        {"--quant", RB_OPT_CALL, "Q", "int4, q4_0 (default), q4_k, q8_0, f16: bytes per parameter",
         &quant, 0, 0, opt_quant, NULL},
        {"--tps", RB_OPT_DOUBLE, "R", "target tokens/s (default 10: T = 0.1 s)", &tps, 0, 0, NULL,
         NULL},
        {0},
    };
    const rb_cli_cmd cli = {
        "plan", "--device watch|phone|host|custom|all [options]",
        "The capacity model: the pinned loop S >= max(0, N - BW*T), the hot set and\n"
        "the KV share of the pool.",
        opts,
        "Without --kv or -c, the profile's default share of the pool stands for hot set + KV\n"
        "(phone: half the pool, the paper's 256-512 MB loop share of a 512 MB-1 GB pool).",
        NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cli, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (!device)
        return rb_cli_usage_error("plan", "no device given (--device watch|phone|host|custom|all)",
                                  NULL);
    if (!strcmp(device, "all")) {
        /* every profile in turn: the same arguments with --device NAME */
        int rc = 0;
        for (int k = 0; k < rb_profile_count() && rc == 0; k++) {
            for (int i = 1; i + 1 < argc; i++)
                if (!strcmp(argv[i], "--device"))
                    argv[i + 1] = (char *)rb_profile_at(k)->name;
            if (k)
                printf("\n");
            rc = rb_cmd_plan(argc, argv);
        }
        return rc;
    }
    rb_error err;
    rb_plan_input in;
    memset(&in, 0, sizeof in);
    if (rb_profile_get(device, &in.profile, &err) != RB_OK)
        return rb_cli_fail("plan", err.message, NULL);
    if (!isnan(bw))
        in.profile.bw_bytes_per_s = bw * RB_MIB;
    if (!isnan(lat_us))
        in.profile.latency_s = lat_us * 1e-6;
    if (request)
        in.profile.request_bytes = request;
    in.tps = tps;
    in.bytes_per_param = rb_plan_bytes_per_param(quant);
    in.hot_bytes = in.profile.hot_bytes;
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32];
    char model_desc[256] = "";
    if (model_path) {
        rb_model *m = NULL;
        if (rb_model_open(model_path, NULL, &m, &err) != RB_OK)
            return rb_cli_fail("plan", err.message, NULL);
        rb_model_info mi;
        rb_model_get_info(m, &mi);
        const rb_gguf *g = rb_model_gguf(m);
        const rb_gguf_tensor *embd = rb_gguf_find_tensor(g, "token_embd.weight");
        /* per token: every layer, the output norm and matrix; of the
           embedding table only the token's row (unless tied: all of it) */
        loop = mi.tensor_data_bytes - (embd && !mi.is_tied_output ? embd->n_bytes : 0);
        if (!has_hot)
            in.hot_bytes = (rb_gguf_data_offset(g) + 4095) / 4096 * 4096;
        if (has_ctx) {
            kv = mi.kv_bytes_per_token * ctx;
            has_kv = 1;
        }
        snprintf(model_desc, sizeof model_desc, "%s (%s, %" PRIu32 " layers): loop N = %s per "
                 "token, hot set (GGUF header) %s, KV %s per token", model_path, mi.architecture,
                 mi.n_layers, rb_cli_bytes(loop, b1, sizeof b1),
                 rb_cli_bytes(in.hot_bytes, b2, sizeof b2),
                 rb_cli_bytes(mi.kv_bytes_per_token, b3, sizeof b3));
        rb_model_close(m);
    } else if (has_ctx) {
        return rb_cli_fail("plan", "-c needs a model (-m) for its KV bytes per token",
                           "or give the KV share with --kv BYTES");
    }
    if (params > 0 && !model_path) {
        loop = (uint64_t)(params * rb_plan_bytes_per_param(quant));
        snprintf(model_desc, sizeof model_desc, "%.3g parameters at %s: loop N = %s per token",
                 params, quant, rb_cli_bytes(loop, b1, sizeof b1));
    } else if (loop && !model_path) {
        snprintf(model_desc, sizeof model_desc, "loop N = %s per token",
                 rb_cli_bytes(loop, b1, sizeof b1));
    }
    if (has_hot)
        in.hot_bytes = hot;
    in.has_kv = has_kv;
    in.kv_bytes = kv;
    in.loop_bytes = loop;
    uint64_t pools[2] = {has_cache ? cache : in.profile.pool_bytes, in.profile.pool_max_bytes};
    int n_pools = !has_cache && in.profile.pool_max_bytes != in.profile.pool_bytes ? 2 : 1;
    rb_plan pl[2];
    for (int i = 0; i < n_pools; i++) {
        in.pool_bytes = pools[i];
        if (rb_plan_compute(&in, &pl[i], &err) != RB_OK)
            return rb_cli_fail("plan", err.message, NULL);
    }
    printf("device %s: %s, %.0f MiB/s, %.0f us per request, %s requests; T = %.3g s per token "
           "(%.3g tok/s)\n", in.profile.name, in.profile.storage,
           in.profile.bw_bytes_per_s / RB_MIB, in.profile.latency_s * 1e6,
           rb_cli_bytes(in.profile.request_bytes, b1, sizeof b1), 1.0 / tps, tps);
    if (model_desc[0])
        printf("%s\n", model_desc);
    printf("\n| pool | hot set | KV share | loop cache L | BW x T | largest loop L + BW x T | "
           "parameters at %s | metadata (8 B per 4 KiB block) |\n|---|---|---|---|---|---|---|---|\n",
           quant);
    for (int i = 0; i < n_pools; i++) {
        const rb_plan *p = &pl[i];
        char kvs[48];
        mib(kvs, sizeof kvs, p->kv_bytes);
        if (!has_kv)
            strncat(kvs, " (default share)", sizeof kvs - strlen(kvs) - 1);
        mib(b1, sizeof b1, p->pool_bytes);
        mib(b2, sizeof b2, p->hot_bytes);
        mib(b3, sizeof b3, p->loop_cache_bytes);
        mib(b4, sizeof b4, p->stream_bytes);
        mib(b5, sizeof b5, p->max_loop_bytes);
        char par[32];
        if (p->max_params >= 1e9)
            snprintf(par, sizeof par, "%.2fB", p->max_params / 1e9);
        else
            snprintf(par, sizeof par, "%.0fM", p->max_params / 1e6);
        printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", b1, b2, kvs, b3, b4, b5, par,
               rb_cli_bytes(p->meta_bytes, b6, sizeof b6));
    }
    if (loop) {
        printf("\n| pool | loop N | S = max(0, N - BW x T) | pinned min(N, L) | meets %.3g tok/s | "
               "I/O-bound tok/s | weights + hot set%s vs pool |\n|---|---|---|---|---|---|---|\n", tps,
               has_kv ? " + KV" : "");
        for (int i = 0; i < n_pools; i++) {
            const rb_plan *p = &pl[i];
            mib(b1, sizeof b1, p->pool_bytes);
            mib(b2, sizeof b2, p->loop_bytes);
            mib(b3, sizeof b3, p->s_needed_bytes);
            mib(b4, sizeof b4, p->s_pinned_bytes);
            char rate[32];
            if (p->io_tok_s > 0)
                snprintf(rate, sizeof rate, "%.2f", p->io_tok_s);
            else
                snprintf(rate, sizeof rate, "no reads");
            /* the demand on the pool: a default KV share is not a demand */
            mib(b5, sizeof b5, p->loop_bytes + p->hot_bytes + (has_kv ? p->kv_bytes : 0));
            printf("| %s | %s | %s | %s | %s | %s | %s over %s |\n", b1, b2, b3, b4,
                   p->meets_rate ? "yes" : "no", rate, b5, b1);
        }
        for (int i = 0; i < n_pools; i++)
            if (!pl[i].meets_rate)
                printf("pool %.1f MiB: S needs %.1f MiB but only %.1f MiB are left for the loop: "
                       "the token rate falls to %.2f tok/s (I/O bound)\n",
                       (double)pl[i].pool_bytes / RB_MIB, (double)pl[i].s_needed_bytes / RB_MIB,
                       (double)pl[i].loop_cache_bytes / RB_MIB, pl[i].io_tok_s);
    }
    return 0;
}
