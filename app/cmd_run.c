/*
 * cmd_run.c - `rebound run`: prompt in, text out, with llama.cpp's flag
 * names. stdout gets the prompt followed by the generated text and nothing
 * else; stderr gets load time, prefill and decode speed and peak RSS.
 * Uses only the public API (include/rebound.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "rebound.h"

static void print_usage(FILE *f)
{
    fprintf(f,
        "usage: rebound run -m MODEL (-p PROMPT | --tokens FILE) [options]\n"
        "  -m, --model F        GGUF model\n"
        "  -p, --prompt TEXT    prompt text (BOS added as the model asks)\n"
        "  --tokens FILE        prompt as token ids (whitespace-separated), fed as they are\n"
        "  -n, --n-predict N    tokens to generate (default 64; 0: none)\n"
        "  -c, --ctx-size N     context length (default: the model's trained context)\n"
        "  -b, --batch-size N   prefill batch (default 128)\n"
        "  -t, --threads N      threads (default: all cores)\n"
        "  --temp T             temperature (default 0.8; 0: greedy)\n"
        "  --top-k N  --top-p P  --min-p P  --repeat-penalty R  --repeat-last-n N  --seed S\n"
        "  --mmap               map the model file instead of reading it\n"
        "  --dump-logits FILE   write the logits of every position fed (f32 [positions][n_vocab])\n"
        "  --stats              print the session's memory by category and tier at the end\n"
        "  --session FILE       continue the session saved in FILE (the prompt is appended),\n"
        "                       or start it; saved there at the end (and after every feed)\n"
        "  --report-ttft        print the CLOCK_MONOTONIC time of the first token (stderr)\n"
        "  --device D           storage profile for the memory manager: phone, watch, host\n"
        "  --mem-budget BYTES   RAM the session may hold (K/M/G); beyond it, it trims itself\n"
        "  --restore MODE       pipelined (default), eager, recompute\n"
        "  --ram-codec C        lossless (default), q8: the compressed RAM tier\n"
        "  --spill-dir DIR      where evicted KV goes on storage (default $TMPDIR or /tmp)\n"
        "  --trace FILE         record the model-file accesses (load, and per token the weight\n"
        "                       ranges read) for `rebound classify|sim` (format: tools/analysis/trace.h)\n");
}

static int32_t *read_token_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 256, k = 0;
    int32_t *t = malloc(cap * sizeof *t);
    long v;
    while (t && fscanf(f, "%ld", &v) == 1) {
        if (k == cap) {
            int32_t *nt = realloc(t, (cap *= 2) * sizeof *t);
            if (!nt) {
                free(t);
                t = NULL;
                break;
            }
            t = nt;
        }
        t[k++] = (int32_t)v;
    }
    if (t && !feof(f)) { /* stopped on something that is not a number */
        free(t);
        t = NULL;
        errno = EINVAL;
    }
    fclose(f);
    *n = k;
    return t;
}

/* Writes the pieces of tokens through the streaming detokenizer; buf holds
 * rb_detokenizer_max_bytes(d) bytes. */
static void emit(rb_detokenizer *d, char *buf, const int32_t *tokens, size_t n)
{
    size_t cap = rb_detokenizer_max_bytes(d);
    for (size_t i = 0; i < n; i++) {
        size_t k = rb_detokenizer_push(d, tokens[i], buf, cap);
        fwrite(buf, 1, k, stdout);
    }
    fflush(stdout);
}

int rb_cmd_run(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *tokens_path = NULL, *dump_path = NULL;
    const char *trace_path = NULL;
    uint64_t n_predict = 64;
    rb_sampler_params sp = rb_sampler_default_params();
    rb_session_params p = rb_session_default_params();
    int use_mmap = 0, show_stats = 0, report_ttft = 0;
    const char *session_path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
            print_usage(stdout);
            return 0;
        } else if (!strcmp(o, "-m") || !strcmp(o, "--model")) {
            bad = !v, model_path = v, i++;
        } else if (!strcmp(o, "-p") || !strcmp(o, "--prompt")) {
            bad = !v, prompt = v, i++;
        } else if (!strcmp(o, "--tokens")) {
            bad = !v, tokens_path = v, i++;
        } else if (!strcmp(o, "--trace")) {
            bad = !v, trace_path = v, i++;
        } else if (!strcmp(o, "--dump-logits")) {
            bad = !v, dump_path = v, i++;
        } else if (!strcmp(o, "-n") || !strcmp(o, "--n-predict")) {
            bad = rb_cli_parse_u64(v, &n_predict), i++;
        } else if (!strcmp(o, "--mmap")) {
            use_mmap = 1;
        } else if (!strcmp(o, "--stats")) {
            show_stats = 1;
        } else if (!strcmp(o, "--report-ttft")) {
            report_ttft = 1;
        } else if (!strcmp(o, "--session")) {
            bad = !v, session_path = v, i++;
        } else if (rb_cli_session_opt(o, v, &p, &bad) || rb_cli_sampler_opt(o, v, &sp, &bad)) {
            i++;
        } else {
            print_usage(stderr);
            return rb_cli_fail("run", "unknown option", o);
        }
        if (bad) {
            char msg[96];
            snprintf(msg, sizeof msg, "option %s needs a valid value", o);
            return rb_cli_fail("run", msg, NULL);
        }
    }
    if (!model_path)
        return rb_cli_fail("run", "no model given (-m MODEL)", "rebound make-model --shape stories260k -o m.gguf");
    if (!!prompt == !!tokens_path)
        return rb_cli_fail("run", "give exactly one of -p PROMPT and --tokens FILE", NULL);

    double t0 = rb_cli_now_s();
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = use_mmap;
    rb_model *model = NULL;
    if (rb_model_open(model_path, &mp, &model, &err) != RB_OK)
        return rb_cli_fail("run", err.message, NULL);
    rb_cli_warn_ctx("run", model, p.n_ctx);
    struct rb_trace_writer *trace = NULL;
    if (trace_path && rb_cli_trace_attach("run", model, model_path, trace_path, &trace)) {
        rb_model_close(model);
        return 1;
    }
    rb_session *s = NULL;
    rb_sampler *sampler = NULL;
    rb_detokenizer *detok = NULL;
    int32_t *tokens = NULL;
    float *dump = NULL;
    char *piece = NULL;
    int rc = 1;
    /* --session: resume the file when it exists (the prompt continues it),
       else start one; saved again at the end */
    int resumed = session_path && access(session_path, F_OK) == 0;
    if (resumed ? rb_session_open_saved(model, &p, session_path, &s, &err) != RB_OK
                : rb_session_create(model, &p, &s, &err) != RB_OK) {
        rb_cli_fail("run", err.message, resumed && err.status == RB_E_UNSUPPORTED
                    ? "give the -c the session was saved with" : NULL);
        goto done;
    }
    /* a new session file is bound now, so every feed below is committed
       (a kill loses at most the token in flight) */
    if (session_path && !resumed && rb_session_save(s, session_path, 0) != RB_OK) {
        rb_cli_fail("run", rb_session_errmsg(s), NULL);
        goto done;
    }
    if (rb_sampler_create(&sp, rb_session_n_vocab(s), &sampler, &err) != RB_OK ||
        rb_detokenizer_create(model, &detok, &err) != RB_OK) {
        rb_cli_fail("run", err.message, NULL);
        goto done;
    }
    piece = malloc(rb_detokenizer_max_bytes(detok));
    if (!piece) {
        rb_cli_fail("run", "out of memory", NULL);
        goto done;
    }
    double t_loaded = rb_cli_now_s();

    size_t n_prompt = 0;
    if (tokens_path) {
        tokens = read_token_file(tokens_path, &n_prompt);
        if (!tokens) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot read token ids from '%s': %s", tokens_path,
                     strerror(errno));
            rb_cli_fail("run", msg, NULL);
            goto done;
        }
    } else {
        size_t len = strlen(prompt), cap = len + 8;
        tokens = malloc(cap * sizeof *tokens);
        if (!tokens || rb_model_tokenize(model, prompt, len, 1, 1, tokens, cap, &n_prompt) != RB_OK) {
            rb_cli_fail("run", rb_model_errmsg(model), NULL);
            goto done;
        }
    }
    if (n_prompt == 0) {
        rb_cli_fail("run", "the prompt has no tokens", NULL);
        goto done;
    }
    if (n_prompt > rb_session_n_ctx(s) - rb_session_n_tokens(s)) {
        char msg[160];
        snprintf(msg, sizeof msg, "the prompt has %zu tokens but the context holds %" PRIu32
                 "%s", n_prompt, rb_session_n_ctx(s) - (uint32_t)rb_session_n_tokens(s),
                 resumed ? " more (after the saved session)" : "");
        rb_cli_fail("run", msg, "raise -c");
        goto done;
    }
    if (dump_path) {
        dump = malloc(n_prompt * rb_session_n_vocab(s) * sizeof *dump);
        if (!dump) {
            rb_cli_fail("run", "out of memory for --dump-logits", NULL);
            goto done;
        }
    }
    emit(detok, piece, tokens, n_prompt);
    double t_pp0 = rb_cli_now_s();
    if (rb_session_feed(s, tokens, n_prompt, dump) != RB_OK) {
        rb_cli_fail("run", rb_session_errmsg(s), NULL);
        goto done;
    }
    double t_pp1 = rb_cli_now_s();
    uint64_t n_gen = 0;
    while (n_gen < n_predict) {
        if (rb_session_n_tokens(s) >= rb_session_n_ctx(s)) {
            fprintf(stderr, "\nrebound run: context full (%" PRIu32 " tokens)\n", rb_session_n_ctx(s));
            break;
        }
        int32_t next;
        if (rb_sampler_sample(sampler, rb_session_get_logits(s), rb_session_get_tokens(s),
                              rb_session_n_tokens(s), &next) != RB_OK) {
            rb_cli_fail("run", rb_sampler_errmsg(sampler), NULL);
            goto done;
        }
        if (rb_model_token_is_eog(model, next))
            break;
        if (n_gen == 0 && report_ttft) { /* for `switch`: CLOCK_MONOTONIC is system-wide */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            fprintf(stderr, "rebound run: first token at monotonic %.6f\n",
                    (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
        }
        emit(detok, piece, &next, 1);
        n_gen++;
        if (n_gen == n_predict)
            break;
        if (rb_session_feed(s, &next, 1, NULL) != RB_OK) {
            rb_cli_fail("run", rb_session_errmsg(s), NULL);
            goto done;
        }
    }
    {
        size_t k = rb_detokenizer_flush(detok, piece, rb_detokenizer_max_bytes(detok));
        fwrite(piece, 1, k, stdout); /* no newline: stdout is exactly the text */
        fflush(stdout);
    }
    double t_end = rb_cli_now_s();
    if (session_path && rb_session_save(s, session_path, 0) != RB_OK) {
        rb_cli_fail("run", rb_session_errmsg(s), NULL);
        goto done;
    }
    if (dump_path) {
        FILE *f = fopen(dump_path, "wb");
        size_t n = n_prompt * rb_session_n_vocab(s);
        if (!f || fwrite(dump, sizeof *dump, n, f) != n || fclose(f) != 0) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot write '%s': %s", dump_path, strerror(errno));
            rb_cli_fail("run", msg, NULL);
            goto done;
        }
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    fprintf(stderr, "rebound run: load %.3f s | prefill %zu tokens %.2f tok/s | decode %" PRIu64
            " tokens %.2f tok/s | peak RSS %.1f MiB\n", t_loaded - t0, n_prompt,
            (double)n_prompt / (t_pp1 - t_pp0), n_gen,
            n_gen > 1 ? (double)(n_gen - 1) / (t_end - t_pp1) : 0.0,
            (double)ru.ru_maxrss / 1024.0);
    if (show_stats) {
        rb_session_stats stats;
        if (rb_session_get_stats(s, &stats) == RB_OK)
            rb_cli_print_stats(stderr, &stats);
    }
    rc = 0;
done:
    free(tokens);
    free(dump);
    free(piece);
    rb_detokenizer_destroy(detok);
    rb_sampler_destroy(sampler);
    rb_session_destroy(s);
    rb_model_close(model);
    if (rb_cli_trace_detach("run", trace))
        rc = 1;
    return rc;
}
