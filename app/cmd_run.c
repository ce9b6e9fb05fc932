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

/* The ids of a token file; NULL with errno set (EINVAL: not a number;
 * ERANGE: *bad receives the word that is no 32-bit id, never wrapped). */
static int32_t *read_token_file(const char *path, size_t *n, char *bad, size_t bad_n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    size_t cap = 256, k = 0;
    int32_t *t = malloc(cap * sizeof *t);
    char word[64];
    while (t && fscanf(f, "%63s", word) == 1) {
        char *end;
        errno = 0;
        long long v = strtoll(word, &end, 10);
        if (*end || end == word) {
            free(t);
            t = NULL;
            errno = EINVAL;
            break;
        }
        if (errno == ERANGE || v < INT32_MIN || v > INT32_MAX) {
            snprintf(bad, bad_n, "%s", word);
            free(t);
            t = NULL;
            errno = ERANGE;
            break;
        }
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
    if (t && !feof(f)) { /* stopped on a read error */
        free(t);
        t = NULL;
        errno = EINVAL;
    }
    fclose(f);
    *n = k;
    return t;
}

/* Writes the pieces of tokens through the streaming detokenizer; buf holds
 * rb_detokenizer_max_bytes(d) bytes. show 0: the detokenizer sees them (so
 * that what follows is spaced right), stdout does not (--no-display-prompt).
 * stops: --reverse-prompt's matcher, or NULL; returns 1 when it matched. */
static int emit(rb_detokenizer *d, char *buf, const int32_t *tokens, size_t n, int show,
                rb_cli_stops *stops)
{
    size_t cap = rb_detokenizer_max_bytes(d);
    int hit = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        if (rb_detokenizer_push(d, tokens[i], buf, cap, &k) != RB_OK)
            fprintf(stderr, "rebound run: %s\n", rb_detokenizer_errmsg(d));
        if (show)
            fwrite(buf, 1, k, stdout);
        if (stops && rb_cli_stops_push(stops, buf, k))
            hit = 1;
    }
    fflush(stdout);
    return hit;
}

int rb_cmd_run(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL, *tokens_path = NULL, *dump_path = NULL;
    const char *trace_path = NULL, *prompt_file = NULL;
    int64_t n_predict_arg = 64;
    rb_sampler_params sp = rb_sampler_default_params();
    rb_session_params p = rb_session_default_params();
    int use_mmap = 0, show_stats = 0, report_ttft = 0, escape = 0, no_cnv = 1, seed_given = 0;
    int wait = 0, do_fsync = 0;
    int ctx_shift = 0;
    uint64_t n_keep_opt = 0;
    const char *session_path = NULL;
    rb_cli_stops stops = {0};
    rb_cli_eog eog = {0};
    int ignore_eos = 0, color = 0, no_display = 0;
    const char *grammar_text = NULL, *grammar_file = NULL, *schema_text = NULL;
    const char *schema_file = NULL;
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &model_path, 0, 0, NULL, NULL},
        {"-p|--prompt", RB_OPT_STR, "TEXT", "prompt text (BOS added as the model asks)", &prompt,
         0, 0, NULL, NULL},
        {"-f|--file", RB_OPT_STR, "FILE", "the prompt from a file (one final newline dropped)",
         &prompt_file, 0, 0, NULL, NULL},
        {"--tokens", RB_OPT_STR, "FILE",
         "prompt as token ids (whitespace-separated), fed as they are", &tokens_path, 0, 0, NULL,
         NULL},
        {"-e|--escape", RB_OPT_FLAG, NULL,
         "process escapes in the prompt: \\n \\r \\t \\' \\\" \\\\ \\xHH (llama.cpp does by\n"
         "default; rebound only when asked)", &escape, 0, 0, NULL, NULL},
        {"--no-escape", RB_OPT_FLAG_OFF, NULL, "take the prompt as it is (the default)", &escape,
         0, 0, NULL, NULL},
        {"-n|--n-predict|--predict", RB_OPT_I64, "N",
         "tokens to generate (default 64; 0: none; -1: until the end of text or a\n"
         "full context; -2, llama.cpp's \"until the context is full\", is the same here)",
         &n_predict_arg, -2, 9.2e18, NULL, NULL},
        {"-no-cnv|--no-conversation", RB_OPT_FLAG, NULL,
         "plain completion: what run always does (conversations: `rebound chat`)", &no_cnv, 0, 0,
         NULL, NULL},
        {"--mmap", RB_OPT_FLAG, NULL, "map the model file instead of reading it", &use_mmap, 0, 0,
         NULL, NULL},
        {"--no-mmap", RB_OPT_FLAG_OFF, NULL, "read the model file into RAM (the default)",
         &use_mmap, 0, 0, NULL, NULL},
        {"--dump-logits", RB_OPT_STR, "FILE",
         "write the logits of every position fed (f32 [positions][n_vocab])", &dump_path, 0, 0,
         NULL, NULL},
        {"--stats", RB_OPT_FLAG, NULL,
         "print the session's memory by category and tier at the end", &show_stats, 0, 0, NULL,
         NULL},
        {"--session", RB_OPT_STR, "FILE",
         "continue the session saved in FILE (the prompt is appended), or start\n"
         "it; saved there at the end (and after every feed)", &session_path, 0, 0, NULL, NULL},
        {"--wait", RB_OPT_FLAG, NULL,
         "a --session FILE another process is writing: wait for it (default:\n"
         "refuse, naming that process)", &wait, 0, 0, NULL, NULL},
        {"--fsync", RB_OPT_FLAG, NULL,
         "fdatasync --session FILE at each save, and its directory when the file\n"
         "is renamed: a power cut too loses no saved turn (default: a kill\n"
         "cannot lose what was written; the OS flushes it later)", &do_fsync, 0, 0, NULL,
         NULL},
        {"--context-shift|--ctx-shift", RB_OPT_FLAG, NULL,
         "when the context is full, drop the oldest half (after the BOS and --keep)\n"
         "and go on, the kept keys rotated in place (default: stop)", &ctx_shift, 0, 0, NULL,
         NULL},
        {"--keep", RB_OPT_SIZE, "N", "prompt tokens the shift keeps after the BOS (default 0)",
         &n_keep_opt, 0, 0, NULL, NULL},
        {"--report-ttft", RB_OPT_FLAG, NULL,
         "print the CLOCK_MONOTONIC time of the first token (stderr)", &report_ttft, 0, 0, NULL,
         NULL},
        {"--trace", RB_OPT_STR, "FILE",
         "record the model-file accesses (load, and per token the weight ranges\n"
         "read) for `rebound classify|sim` (format: tools/analysis/trace.h)", &trace_path, 0,
         0, NULL, NULL},
        RB_CLI_SESSION_OPTS(&p),
        RB_CLI_SAMPLER_OPTS(&sp, &seed_given),
        {"--grammar", RB_OPT_STR, "GBNF", "constrain the output to a GBNF grammar (start rule root)",
         &grammar_text, 0, 0, NULL, NULL},
        {"--grammar-file", RB_OPT_STR, "FILE", "the grammar from a file", &grammar_file, 0, 0,
         NULL, NULL},
        {"-j|--json-schema", RB_OPT_STR, "SCHEMA",
         "constrain the output to JSON valid under a JSON Schema ('{}': any object)",
         &schema_text, 0, 0, NULL, NULL},
        {"-jf|--json-schema-file", RB_OPT_STR, "FILE", "the JSON Schema from a file",
         &schema_file, 0, 0, NULL, NULL},
        RB_CLI_LLAMA_OPTS(&stops, &ignore_eos, &color, &no_display, &rb_cli_quiet),
        {"-i|--interactive|-if|--interactive-first", RB_OPT_REFUSED, NULL,
         "run is one prompt in, one text out; `rebound chat -m MODEL` is the\n"
         "interactive conversation (llama.cpp's -i and -cnv)", NULL, 0, 0, NULL, NULL},
        RB_CLI_GPU_OPTS,
        {"-sys|--system-prompt", RB_OPT_IGNORED, "TEXT",
         "run is plain completion (llama.cpp's -no-cnv); `rebound chat` applies\n"
         "a system prompt", NULL, 0, 0, NULL, NULL},
        {"--chat-template", RB_OPT_IGNORED, "NAME",
         "run is plain completion (llama.cpp's -no-cnv); `rebound chat` applies\n"
         "a chat template", NULL, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cmd = {
        "run", "-m MODEL (-p PROMPT | -f FILE | --tokens FILE) [options]",
        "Prompt in, text out, with llama.cpp's flag names (llama-completion -no-cnv).\n"
        "stdout: the prompt and the generated text, nothing else; stderr: the seed, load\n"
        "time, prefill and decode speed, peak RSS.",
        opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    (void)no_cnv;
    uint64_t n_predict = n_predict_arg < 0 ? UINT64_MAX : (uint64_t)n_predict_arg;
    if (!model_path)
        return rb_cli_usage_error("run", "no model given (-m MODEL)",
                                  "rebound make-model --shape stories260k -o m.gguf");
    if (!!prompt + !!prompt_file + !!tokens_path != 1)
        return rb_cli_usage_error("run", "give exactly one of -p PROMPT, -f FILE and --tokens FILE",
                                  NULL);
    char *prompt_buf = NULL; /* -f's text, or -e's copy of the prompt */
    if (prompt_file) {
        if (!(prompt_buf = rb_cli_read_text(prompt_file))) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot read the prompt from '%s': %s", prompt_file,
                     strerror(errno));
            return rb_cli_fail("run", msg, NULL);
        }
        prompt = prompt_buf;
    } else if (prompt && escape && !(prompt = prompt_buf = strdup(prompt))) {
        return rb_cli_fail("run", "out of memory", NULL);
    }
    if (escape && prompt_buf)
        rb_cli_unescape(prompt_buf);
    rb_cli_seed("run", &sp.seed, seed_given);
    if (!!grammar_text + !!grammar_file + !!schema_text + !!schema_file > 1) {
        free(prompt_buf);
        return rb_cli_usage_error("run", "give at most one of --grammar, --grammar-file, "
                                         "--json-schema and --json-schema-file", NULL);
    }
    char *constraint_buf = NULL; /* the grammar or schema read from a file */
    if (grammar_file || schema_file) {
        const char *f = grammar_file ? grammar_file : schema_file;
        if (!(constraint_buf = rb_cli_read_text(f))) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot read '%s': %s", f, strerror(errno));
            free(prompt_buf);
            return rb_cli_fail("run", msg, NULL);
        }
        if (grammar_file)
            grammar_text = constraint_buf;
        else
            schema_text = constraint_buf;
    }

    double t0 = rb_cli_now_s();
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = use_mmap;
    rb_model *model = NULL;
    if (rb_model_open(model_path, &mp, &model, &err) != RB_OK) {
        free(prompt_buf);
        free(constraint_buf);
        return rb_cli_fail("run", err.message, NULL);
    }
    rb_cli_warn_ctx("run", model, p.n_ctx);
    struct rb_trace_writer *trace = NULL;
    if (trace_path && rb_cli_trace_attach("run", model, model_path, trace_path, &trace)) {
        free(prompt_buf);
        free(constraint_buf);
        rb_model_close(model);
        return 1;
    }
    rb_session *s = NULL;
    rb_sampler *sampler = NULL;
    rb_grammar *grammar = NULL;
    rb_detokenizer *detok = NULL;
    int32_t *tokens = NULL;
    float *dump = NULL;
    char *piece = NULL;
    int rc = 1;
    /* --session: resume the file when it exists (the prompt continues it),
       else start one; saved again at the end */
    int resumed = session_path && access(session_path, F_OK) == 0;
    unsigned save_flags = (wait ? RB_SAVE_WAIT : 0) | (do_fsync ? RB_SAVE_FSYNC : 0);
    p.file_flags = save_flags;
    if (resumed ? rb_session_open_saved(model, &p, session_path, &s, &err) != RB_OK
                : rb_session_create(model, &p, &s, &err) != RB_OK) {
        rb_cli_fail("run", err.message, resumed && err.status == RB_E_UNSUPPORTED
                    ? "give the -c (n_ctx) the session was saved with" : NULL);
        goto done;
    }
    if (resumed)
        rb_cli_warn_recovery("run", s);
    /* a new session file is bound now, so every feed below is committed
       (a kill loses at most the token in flight) */
    if (session_path && !resumed && rb_session_save(s, session_path, save_flags) != RB_OK) {
        rb_cli_fail("run", rb_session_errmsg(s), NULL);
        goto done;
    }
    /* a resumed session's text goes on: no BOS in the middle of it, and the
       first new piece keeps its leading space */
    const int continues = rb_session_n_tokens(s) > 0;
    if (rb_sampler_create(&sp, rb_session_n_vocab(s), &sampler, &err) != RB_OK ||
        rb_detokenizer_create_flags(model, continues ? RB_DETOKENIZER_CONTINUATION : 0, &detok,
                                    &err) != RB_OK) {
        rb_cli_fail("run", err.message, NULL);
        goto done;
    }
    if (grammar_text || schema_text) {
        /* "{}" is OpenAI's json_object: any object */
        int any_object = schema_text && strspn(schema_text, " \t\r\n{}") == strlen(schema_text);
        rb_status gst =
            grammar_text ? rb_grammar_create(model, grammar_text, strlen(grammar_text), NULL,
                                             &grammar, &err)
                         : rb_grammar_from_json_schema(model, any_object ? NULL : schema_text,
                                                       any_object ? 0 : strlen(schema_text),
                                                       &grammar, &err);
        if (gst != RB_OK || rb_sampler_set_grammar(sampler, grammar) != RB_OK) {
            rb_cli_fail("run", gst != RB_OK ? err.message : rb_sampler_errmsg(sampler), NULL);
            goto done;
        }
    }
    piece = malloc(rb_detokenizer_max_bytes(detok));
    if (!piece) {
        rb_cli_fail("run", "out of memory", NULL);
        goto done;
    }
    double t_loaded = rb_cli_now_s();

    size_t n_prompt = 0;
    if (tokens_path) {
        char bad_word[64] = "";
        tokens = read_token_file(tokens_path, &n_prompt, bad_word, sizeof bad_word);
        if (!tokens) {
            char msg[700];
            if (errno == ERANGE)
                snprintf(msg, sizeof msg, "'%s': token id %s is out of range (ids are 32-bit, "
                         "below the vocabulary size)", tokens_path, bad_word);
            else
                snprintf(msg, sizeof msg, "cannot read token ids from '%s': %s", tokens_path,
                         errno == EINVAL ? "a word that is not a number" : strerror(errno));
            rb_cli_fail("run", msg, NULL);
            goto done;
        }
    } else {
        size_t len = strlen(prompt), cap = len + 8;
        tokens = malloc(cap * sizeof *tokens);
        if (!tokens || rb_model_tokenize(model, prompt, len, !continues, 1, tokens, cap,
                                         &n_prompt) != RB_OK) {
            rb_cli_fail("run", rb_model_errmsg(model), NULL);
            goto done;
        }
    }
    int32_t *fed = tokens;
    size_t n_fed = n_prompt;
    if (n_prompt == 0 && continues) {
        /* nothing new to say: the session's last token is fed again (after
           a rewind by one) for the logits that continue it */
        size_t n = rb_session_n_tokens(s);
        fed = tokens = realloc(tokens, sizeof *tokens);
        if (!tokens) {
            rb_cli_fail("run", "out of memory", NULL);
            goto done;
        }
        tokens[0] = rb_session_get_tokens(s)[n - 1];
        n_fed = 1;
        if (rb_session_rewind(s, n - 1) != RB_OK) {
            rb_cli_fail("run", rb_session_errmsg(s), NULL);
            goto done;
        }
    } else if (n_prompt == 0) {
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
        dump = malloc(n_fed * rb_session_n_vocab(s) * sizeof *dump);
        if (!dump) {
            rb_cli_fail("run", "out of memory for --dump-logits", NULL);
            goto done;
        }
    }
    /* --color: the prompt in yellow, as llama.cpp's (on a terminal only:
       stdout in a file or a pipe is exactly the text) */
    color = color && isatty(STDOUT_FILENO);
    if (color && !no_display)
        fputs("\033[33m", stdout);
    emit(detok, piece, tokens, n_prompt, !no_display, NULL);
    if (color && !no_display) {
        fputs("\033[0m", stdout);
        fflush(stdout);
    }
    if (ignore_eos && rb_cli_eog_init(&eog, model, rb_session_n_vocab(s))) {
        rb_cli_fail("run", "out of memory", NULL);
        goto done;
    }
    double t_pp0 = rb_cli_now_s();
    if (rb_session_feed(s, fed, n_fed, dump) != RB_OK) {
        rb_cli_fail("run", rb_session_errmsg(s), NULL);
        goto done;
    }
    double t_pp1 = rb_cli_now_s();
    uint64_t n_gen = 0, n_sampled = 0;
    double t_sample = 0;
    int out_errno = 0;
    while (n_gen < n_predict) {
        if (rb_session_n_tokens(s) >= rb_session_n_ctx(s)) {
            /* llama.cpp's shift: keep --keep tokens (and the BOS), drop half
               of the rest, rotate the kept keys in place */
            size_t n_past = rb_session_n_tokens(s), keep = (size_t)n_keep_opt;
            if (rb_session_get_tokens(s)[0] == rb_model_token_bos(model))
                keep++;
            keep = keep < n_past ? keep : n_past;
            size_t n_discard = (n_past - keep) / 2;
            if (!ctx_shift || n_discard == 0) {
                fprintf(stderr, "\nrebound run: context full (%" PRIu32 " tokens)%s\n",
                        rb_session_n_ctx(s), ctx_shift ? ": --keep leaves nothing to drop"
                                                       : "; --context-shift drops the oldest "
                                                         "half and goes on");
                break;
            }
            if (rb_session_shift(s, keep, n_discard) != RB_OK) {
                rb_cli_fail("run", rb_session_errmsg(s), NULL);
                goto done;
            }
            fprintf(stderr, "\nrebound run: context shift: kept %zu, dropped %zu tokens\n", keep,
                    n_discard);
        }
        if (grammar && !rb_grammar_can_continue(grammar))
            break; /* the grammar is complete and nothing can follow */
        int32_t next;
        double t_s0 = rb_cli_now_s();
        const float *logits = rb_session_get_logits(s);
        if (ignore_eos)
            logits = rb_cli_eog_mask(&eog, logits);
        if (rb_sampler_sample(sampler, logits, rb_session_get_tokens(s), rb_session_n_tokens(s),
                              &next) != RB_OK) {
            rb_cli_fail("run", rb_sampler_errmsg(sampler), NULL);
            goto done;
        }
        t_sample += rb_cli_now_s() - t_s0;
        n_sampled++;
        if (rb_model_token_is_eog(model, next))
            break;
        if (n_gen == 0 && report_ttft) { /* for `switch`: CLOCK_MONOTONIC is system-wide */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            fprintf(stderr, "rebound run: first token at monotonic %.6f\n",
                    (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
        }
        int stop_hit = emit(detok, piece, &next, 1, 1, &stops);
        n_gen++;
        if (stop_hit && !session_path) /* -r: the text is out; nothing more */
            break;
        /* the last token is fed only when a session keeps it (a later
           run continues after it) */
        if (n_gen == n_predict && !session_path)
            break;
        if (rb_session_feed(s, &next, 1, NULL) != RB_OK) {
            rb_cli_fail("run", rb_session_errmsg(s), NULL);
            goto done;
        }
        if (stop_hit) /* -r with --session: the last token is kept first */
            break;
    }
    {
        size_t k = 0;
        if (rb_detokenizer_flush(detok, piece, rb_detokenizer_max_bytes(detok), &k) != RB_OK)
            fprintf(stderr, "rebound run: %s\n", rb_detokenizer_errmsg(detok));
        fwrite(piece, 1, k, stdout); /* no newline: stdout is exactly the text */
        if (fflush(stdout) != 0 || ferror(stdout)) /* a full disk, a closed stdout */
            out_errno = errno ? errno : EIO;
    }
    double t_end = rb_cli_now_s();
    if (session_path && rb_session_save(s, session_path, save_flags) != RB_OK) {
        rb_cli_fail("run", rb_session_errmsg(s), NULL);
        goto done;
    }
    if (dump_path) {
        FILE *f = fopen(dump_path, "wb");
        size_t n = n_fed * rb_session_n_vocab(s);
        if (!f || fwrite(dump, sizeof *dump, n, f) != n || fclose(f) != 0) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot write '%s': %s", dump_path, strerror(errno));
            rb_cli_fail("run", msg, NULL);
            goto done;
        }
    }
    if (out_errno) { /* the session is saved; the text is not all out */
        char msg[160];
        snprintf(msg, sizeof msg, "writing the text to stdout: %s", strerror(out_errno));
        rb_cli_fail("run", msg, NULL);
        goto done;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    if (!rb_cli_quiet)
        fprintf(stderr, "rebound run: load %.3f s | prefill %zu tokens %.2f tok/s | decode %" PRIu64
                " tokens %.2f tok/s | peak RSS %.1f MiB\n", t_loaded - t0, n_prompt,
                (double)n_prompt / (t_pp1 - t_pp0), n_gen,
                n_gen > 1 ? (double)(n_gen - 1) / (t_end - t_pp1) : 0.0,
                (double)ru.ru_maxrss / 1024.0);
    if (grammar && n_sampled && !rb_cli_quiet)
        fprintf(stderr, "rebound run: sampling under the grammar %.3f ms/token (mask, draw, "
                "advance), decode %.1f ms/token\n", 1e3 * t_sample / (double)n_sampled,
                n_gen > 1 ? 1e3 * (t_end - t_pp1) / (double)(n_gen - 1) : 0.0);
    int warned = 0;
    rb_cli_warn_pressure("run", s, &warned);
    if (show_stats) {
        rb_session_stats stats;
        if (rb_session_get_stats(s, &stats) == RB_OK)
            rb_cli_print_stats(stderr, &stats);
    }
    rc = 0;
done:
    rb_cli_eog_free(&eog);
    free(prompt_buf);
    free(constraint_buf);
    free(tokens);
    free(dump);
    free(piece);
    rb_detokenizer_destroy(detok);
    rb_sampler_destroy(sampler);
    rb_grammar_destroy(grammar);
    rb_session_destroy(s);
    rb_model_close(model);
    if (rb_cli_trace_detach("run", trace))
        rc = 1;
    return rc;
}
