/*
 * cmd_kvquality.c - `rebound kvquality`: what a KV codec costs in model
 * quality. A tool subcommand: it drives the session's KV cache directly
 * (session_debug.h) and the codec (kvcodec.h).
 *
 * Per prompt, three runs of the same model:
 *   A  the prompt, then greedy tokens up to N = prompt + n (or the
 *      context): gives the token sequence T (generation goes on past an
 *      end-of-text token: only the positions matter here);
 *   B  reference: T[0, N/2) fed, then T[N/2, N) fed with the logits of
 *      every position kept;
 *   C  the same, but between the two feeds every resident KV page of every
 *      layer is encoded with the codec and decoded back into place (the
 *      positions not yet written are zeroed first: they hold no data and
 *      are overwritten by the second feed).
 * B and C feed identical batches, so the only difference between their
 * logits is the codec (a lossless codec gives KL 0 exactly). Reported over
 * the positions after the round trip: top-1 agreement (argmax equal) and
 * KL(B || C) of the next-token distributions, mean and max.
 *
 * --cache-type T instead of --codec: C is a session whose live KV cache is
 * of type T (q8_0, q4_0: llama.cpp's -ctk/-ctv) for the whole run, fed as
 * B is; the ratio is then f16's page bytes over T's.
 *
 * Without -p, six built-in short story openings: on stories260K (context
 * 128) that is 6 x 64 = 384 positions after the round trip.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvcache.h"
#include "kvcodec.h"
#include "rebound.h"
#include "session_debug.h"

#define MAX_PROMPTS 64

static const char *const BUILTIN_PROMPTS[] = {
    "Once upon a time",
    "One day, a little girl named Lily",
    "Tom and his dog went to the park",
    "The sun was shining and the birds",
    "There was a big red ball in the garden",
    "Sam wanted to build a tall tower",
};

static int32_t argmax(const float *x, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* KL(p || q) of the softmax distributions of logits a (p) and b (q). */
static double kl_logits(const float *a, const float *b, uint32_t n)
{
    double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0, kl = 0;
    for (uint32_t i = 0; i < n; i++) {
        ma = a[i] > ma ? a[i] : ma;
        mb = b[i] > mb ? b[i] : mb;
    }
    for (uint32_t i = 0; i < n; i++) {
        sa += exp(a[i] - ma);
        sb += exp(b[i] - mb);
    }
    const double la = ma + log(sa), lb = mb + log(sb);
    for (uint32_t i = 0; i < n; i++) {
        double lpa = a[i] - la, lpb = b[i] - lb;
        kl += exp(lpa) * (lpa - lpb);
    }
    return kl > 0 ? kl : 0; /* rounding can give -1e-17 for equal rows */
}

typedef struct rt_stats {
    uint64_t pages, raw_bytes, frame_bytes, stored_pages;
} rt_stats;

/* Round-trips every resident page of the session's KV cache through the
 * codec. buf holds rb_kvcodec_bound bytes. */
static int round_trip(rb_session *s, rb_kvcodec_id codec, uint8_t *buf, size_t buf_size,
                      rt_stats *st, char *msg, size_t msg_size)
{
    rb_kvcache *kv = rb_session_kvcache(s);
    const rb_kvcodec_dims d = {kv->page_tokens, kv->n_kv_heads, kv->head_dim_k, kv->head_dim_v};
    const size_t n_used = rb_session_n_tokens(s), elems = (size_t)rb_kvcodec_page_elems(&d);
    for (uint32_t l = 0; l < kv->n_layers; l++) {
        for (uint32_t pg = 0; pg < kv->pages_per_layer; pg++) {
            rb_f16 *page = kv->pages[(size_t)l * kv->pages_per_layer + pg];
            if (!page)
                continue;
            /* positions past the context's end: never written, may hold any
             * bits (Inf/NaN would stop a lossy codec); zero them */
            size_t p0 = (size_t)pg * kv->page_tokens;
            size_t valid = n_used > p0 ? n_used - p0 : 0;
            if (valid < kv->page_tokens) {
                for (uint32_t h = 0; h < kv->n_kv_heads; h++) {
                    memset(rb_kvcache_k(kv, l, h, (uint32_t)(p0 + valid)), 0,
                           (kv->page_tokens - valid) * kv->head_dim_k * sizeof(rb_f16));
                    memset(rb_kvcache_v(kv, l, h, (uint32_t)(p0 + valid)), 0,
                           (kv->page_tokens - valid) * kv->head_dim_v * sizeof(rb_f16));
                }
            }
            size_t n = 0;
            rb_error err;
            if (rb_kvcodec_encode(&d, codec, page, buf, buf_size, &n, &err) != RB_OK ||
                rb_kvcodec_decode(&d, buf, n, page, elems, &err) != RB_OK) {
                snprintf(msg, msg_size, "layer %" PRIu32 " page %" PRIu32 ": %s", l, pg,
                         err.message);
                return 1;
            }
            rb_kvcodec_frame_info fi;
            rb_kvcodec_frame_info_get(buf, n, &fi, NULL);
            st->pages++;
            st->raw_bytes += 2 * elems;
            st->frame_bytes += n;
            st->stored_pages += fi.codec == RB_KVCODEC_STORE && codec != RB_KVCODEC_STORE;
        }
    }
    return 0;
}

/* -p, repeatable: the prompts in order */
struct prompt_list {
    const char **v;
    int n;
};

static int opt_prompt(void *dest, const char *v, char *why, size_t why_n)
{
    struct prompt_list *l = dest;
    if (l->n == MAX_PROMPTS) {
        snprintf(why, why_n, "taken: at most %d prompts", MAX_PROMPTS);
        return -1;
    }
    l->v[l->n++] = v;
    return 0;
}

int rb_cmd_kvquality(int argc, char **argv)
{
    const char *model_path = NULL, *codec_name = NULL, *label = NULL, *cache_type = NULL;
    const char *prompts[MAX_PROMPTS];
    int n_prompts = 0;
    uint64_t n_predict = 256, n_ctx = 0, n_threads = 0;
    struct prompt_list pl = {prompts, 0};
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &model_path, 0, 0, NULL, NULL},
        {"--codec", RB_OPT_STR, "MODE", "lossless, q8, q4, q2 (or store)", &codec_name, 0, 0, NULL,
         NULL},
        {"--cache-type", RB_OPT_STR, "T",
         "instead of a codec: the live KV cache in q8_0 or q4_0 (K and V), against f16",
         &cache_type, 0, 0, NULL, NULL},
        {"-p|--prompt", RB_OPT_CALL, "TEXT",
         "a prompt; repeat for several (default: 6 built-in ones)", &pl, 0, 0, opt_prompt, NULL},
        {"-n|--n-predict", RB_OPT_SIZE, "N",
         "greedy tokens after each prompt (default 256; capped by the context)", &n_predict, 0, 0,
         NULL, NULL},
        {"-c|--ctx-size", RB_OPT_SIZE, "N", "context (default: the model's trained context)",
         &n_ctx, 0, UINT32_MAX, NULL, NULL},
        {"-t|--threads", RB_OPT_SIZE, "N", "threads (default: all cores)", &n_threads, 0, 256,
         NULL, NULL},
        {"--label", RB_OPT_STR, "TEXT", "model label in the result lines (default: the file name)",
         &label, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cli = {
        "kvquality", "-m MODEL --codec MODE [options]",
        "Runs each prompt three times (generate; reference; KV round-tripped through the\n"
        "codec at the midpoint) and reports top-1 agreement and KL divergence after the\n"
        "round trip.",
        opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cli, argc, argv);
    if (rc0 >= 0)
        return rc0;
    n_prompts = pl.n;
    if (!model_path)
        return rb_cli_usage_error("kvquality", "no model given (-m MODEL)", NULL);
    const int kv_type = cache_type ? rb_kv_type_from_name(cache_type) : RB_KV_F16;
    if (kv_type < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "unknown --cache-type '%s'", cache_type);
        return rb_cli_usage_error("kvquality", msg, "q8_0 or q4_0");
    }
    if (cache_type)
        codec_name = "store"; /* no round trip: the cache type is the difference */
    if (!codec_name)
        return rb_cli_usage_error("kvquality", "no codec given (--codec MODE)",
                                  "lossless, q8, q4 or q2");
    const int codec = rb_kvcodec_from_name(codec_name);
    if (codec < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "unknown codec '%s'", codec_name);
        return rb_cli_usage_error("kvquality", msg, "lossless, q8, q4, q2 or store");
    }
    if (n_prompts == 0)
        for (size_t i = 0; i < sizeof BUILTIN_PROMPTS / sizeof *BUILTIN_PROMPTS; i++)
            prompts[n_prompts++] = BUILTIN_PROMPTS[i];
    if (!label)
        label = strrchr(model_path, '/') ? strrchr(model_path, '/') + 1 : model_path;

    rb_error err;
    rb_model *model = NULL;
    if (rb_model_open(model_path, NULL, &model, &err) != RB_OK)
        return rb_cli_fail("kvquality", err.message, NULL);
    rb_session_params sp = rb_session_default_params();
    sp.n_ctx = (uint32_t)n_ctx;
    sp.n_threads = (int)n_threads;
    rb_session *sa = NULL, *sb = NULL, *sc = NULL;
    int32_t *toks = NULL;
    float *lref = NULL, *ltest = NULL;
    uint8_t *buf = NULL;
    int rc = 1;
    char msg[768];
    if (rb_session_create(model, &sp, &sa, &err) != RB_OK) {
        rb_cli_fail("kvquality", err.message, NULL);
        goto done;
    }
    const uint32_t ctx = rb_session_n_ctx(sa), n_vocab = rb_session_n_vocab(sa);
    const rb_kvcache *kv0 = rb_session_kvcache(sa);
    const rb_kvcodec_dims pd = {kv0->page_tokens, kv0->n_kv_heads, kv0->head_dim_k,
                                kv0->head_dim_v};
    const size_t buf_size = (size_t)rb_kvcodec_bound(&pd, (rb_kvcodec_id)codec);
    toks = malloc((size_t)ctx * sizeof *toks);
    buf = malloc(buf_size);
    if (!toks || !buf) {
        rb_cli_fail("kvquality", "out of memory", NULL);
        goto done;
    }
    printf("kvquality: %s, %s%s, %d prompt(s), context %" PRIu32 ", page %" PRIu32
           " tokens x %" PRIu32 " KV heads x %" PRIu32 "/%" PRIu32 " dims\n", label,
           cache_type ? "KV cache " : "codec ",
           cache_type ? cache_type : rb_kvcodec_name((rb_kvcodec_id)codec), n_prompts, ctx,
           pd.n_tokens, pd.n_kv_heads, pd.head_dim_k, pd.head_dim_v);
    uint64_t n_pos = 0, n_agree = 0;
    double kl_sum = 0, kl_max = 0;
    rt_stats rts = {0};
    for (int pi = 0; pi < n_prompts; pi++) {
        /* A: the prompt and its greedy continuation */
        rb_session_destroy(sa);
        sa = NULL;
        if (rb_session_create(model, &sp, &sa, &err) != RB_OK) {
            rb_cli_fail("kvquality", err.message, NULL);
            goto done;
        }
        size_t n_prompt = 0;
        if (rb_model_tokenize(model, prompts[pi], strlen(prompts[pi]), 1, 1, toks, ctx,
                              &n_prompt) != RB_OK || n_prompt == 0) {
            snprintf(msg, sizeof msg, "prompt %d does not tokenize into the context of %" PRIu32
                     ": %s", pi + 1, ctx, rb_model_errmsg(model));
            rb_cli_fail("kvquality", msg, NULL);
            goto done;
        }
        if (n_prompt + 1 >= ctx) {
            snprintf(msg, sizeof msg, "prompt %d has %zu tokens; the context holds %" PRIu32,
                     pi + 1, n_prompt, ctx);
            rb_cli_fail("kvquality", msg, NULL);
            goto done;
        }
        const size_t N = n_prompt + n_predict < ctx ? n_prompt + (size_t)n_predict : ctx;
        int fed = rb_session_feed(sa, toks, n_prompt, NULL) == RB_OK;
        for (size_t i = n_prompt; fed && i < N; i++) {
            toks[i] = argmax(rb_session_get_logits(sa), n_vocab);
            fed = rb_session_feed(sa, &toks[i], 1, NULL) == RB_OK;
        }
        if (!fed) {
            rb_cli_fail("kvquality", rb_session_errmsg(sa), NULL);
            goto done;
        }
        const size_t mid = N / 2;
        if (mid == 0) {
            rb_cli_fail("kvquality", "the run is too short for a midpoint (raise -n)", NULL);
            goto done;
        }
        /* logits of the positions after the midpoint, for B and C */
        float *nr = realloc(lref, (N - mid) * n_vocab * sizeof *lref);
        lref = nr ? nr : lref;
        float *nt = nr ? realloc(ltest, (N - mid) * n_vocab * sizeof *ltest) : NULL;
        ltest = nt ? nt : ltest;
        if (!nr || !nt) {
            rb_cli_fail("kvquality", "out of memory for the logits", NULL);
            goto done;
        }
        /* B and C: the same feeds, C with the round trip between them */
        rb_session *runs[2] = {NULL, NULL};
        float *outs[2] = {lref, ltest};
        rt_stats prs = {0};
        for (int r = 0; r < 2; r++) {
            rb_session_params rp = sp;
            if (r == 1)
                rp.kv_type_k = rp.kv_type_v = (rb_kv_type)kv_type;
            if (rb_session_create(model, &rp, &runs[r], &err) != RB_OK) {
                rb_cli_fail("kvquality", err.message, NULL);
                goto done;
            }
            if (r == 0)
                sb = runs[0];
            else
                sc = runs[1];
            if (rb_session_feed(runs[r], toks, mid, NULL) != RB_OK) {
                rb_cli_fail("kvquality", rb_session_errmsg(runs[r]), NULL);
                goto done;
            }
            if (r == 1 && cache_type) {
                const rb_kvcache *qk = rb_session_kvcache(runs[1]);
                prs.pages = 1;
                prs.raw_bytes = rb_session_kvcache(runs[0])->page_bytes;
                prs.frame_bytes = qk->page_bytes;
            } else if (r == 1 && round_trip(runs[r], (rb_kvcodec_id)codec, buf, buf_size, &prs,
                                            msg, sizeof msg)) {
                rb_cli_fail("kvquality", msg, NULL);
                goto done;
            }
            if (rb_session_feed(runs[r], toks + mid, N - mid, outs[r]) != RB_OK) {
                rb_cli_fail("kvquality", rb_session_errmsg(runs[r]), NULL);
                goto done;
            }
        }
        rb_session_destroy(sb);
        rb_session_destroy(sc);
        sb = sc = NULL;
        uint64_t agree = 0;
        double ksum = 0, kmax = 0;
        for (size_t i = 0; i < N - mid; i++) {
            const float *a = lref + i * n_vocab, *b = ltest + i * n_vocab;
            agree += argmax(a, n_vocab) == argmax(b, n_vocab);
            double k = kl_logits(a, b, n_vocab);
            ksum += k;
            kmax = k > kmax ? k : kmax;
        }
        printf("prompt %d: %zu tokens (%zu prompt), round trip at %zu: %" PRIu64 " pages, "
               "ratio %.3fx; top-1 %" PRIu64 "/%zu (%.2f%%), mean KL %.3g, max KL %.3g\n",
               pi + 1, N, n_prompt, mid, prs.pages,
               (double)prs.raw_bytes / (double)prs.frame_bytes, agree, N - mid,
               100.0 * (double)agree / (double)(N - mid), ksum / (double)(N - mid), kmax);
        n_pos += N - mid;
        n_agree += agree;
        kl_sum += ksum;
        kl_max = kmax > kl_max ? kmax : kl_max;
        rts.pages += prs.pages;
        rts.raw_bytes += prs.raw_bytes;
        rts.frame_bytes += prs.frame_bytes;
        rts.stored_pages += prs.stored_pages;
    }
    printf("total: %" PRIu64 " positions after the round trip; top-1 agreement %" PRIu64 "/%"
           PRIu64 " = %.2f%%; mean KL %.3g, max KL %.3g; KV ratio %.3fx over %" PRIu64
           " pages%s\n", n_pos, n_agree, n_pos, 100.0 * (double)n_agree / (double)n_pos,
           kl_sum / (double)n_pos, kl_max, (double)rts.raw_bytes / (double)rts.frame_bytes,
           rts.pages, rts.stored_pages ? " (some stored raw: not compressible)" : "");
    printf("result kvquality model=%s codec=%s prompts=%d positions=%" PRIu64 " top1=%.6f "
           "mean_kl=%.6g max_kl=%.6g ratio=%.4f pages=%" PRIu64 "\n", label,
           cache_type ? cache_type : rb_kvcodec_name((rb_kvcodec_id)codec), n_prompts, n_pos,
           (double)n_agree / (double)n_pos, kl_sum / (double)n_pos, kl_max,
           (double)rts.raw_bytes / (double)rts.frame_bytes, rts.pages);
    rc = 0;
done:
    rb_session_destroy(sa);
    rb_session_destroy(sb);
    rb_session_destroy(sc);
    rb_model_close(model);
    free(toks);
    free(lref);
    free(ltest);
    free(buf);
    return rc;
}
