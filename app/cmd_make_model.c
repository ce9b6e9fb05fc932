/*
 * cmd_make_model.c - `rebound make-model`: writes a synthetic GGUF model of
 * a named shape (or custom dims) in one of the file kinds, for tests and
 * benchmarks that must run anywhere. Tool subcommand: it drives the
 * internal synth module directly.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "progress.h"
#include "synth.h"

static int opt_arch(void *dest, const char *v, char *why, size_t why_n)
{
    if (strcmp(v, "llama") != 0 && strcmp(v, "qwen3") != 0 && strcmp(v, "gemma3") != 0) {
        snprintf(why, why_n, "llama, qwen3 or gemma3");
        return -1;
    }
    ((rb_synth_shape *)dest)->arch = strcmp(v, "llama") == 0   ? "llama"
                                     : strcmp(v, "qwen3") == 0 ? "qwen3"
                                                               : "gemma3";
    return 0;
}

static int opt_vocab_style(void *dest, const char *v, char *why, size_t why_n)
{
    rb_synth_shape *shape = dest;
    if (strcmp(v, "spm") != 0 && strcmp(v, "bpe") != 0) {
        snprintf(why, why_n, "spm or bpe");
        return -1;
    }
    shape->is_bpe_vocab = strcmp(v, "bpe") == 0;
    if (shape->is_bpe_vocab && !shape->bpe_pre)
        shape->bpe_pre = "qwen2";
    return 0;
}

int rb_cmd_make_model(int argc, char **argv)
{
    const rb_synth_shape *base = rb_synth_shape_find("tiny");
    rb_synth_shape shape = *base;
    const char *shape_name = "tiny", *type_name = "f32", *out = NULL;
    int is_custom = 0;
    uint64_t seed = 1;
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t threads = nproc > 0 ? (uint32_t)nproc : 1;

    /* the shape first, so that custom dims override it wherever they stand */
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--shape") == 0) {
            shape_name = argv[i + 1];
            base = rb_synth_shape_find(shape_name);
            if (!base)
                return rb_cli_usage_error("make-model", "unknown shape", rb_synth_shape_names());
            shape = *base;
        }
    char shape_help[512], type_help[512];
    snprintf(shape_help, sizeof shape_help, "%s (default tiny)", rb_synth_shape_names());
    snprintf(type_help, sizeof type_help, "%s (default f32)", rb_file_kind_names());
    const char *shape_arg = NULL;
    const rb_opt opts[] = {
        {"--shape", RB_OPT_STR, "NAME", shape_help, &shape_arg, 0, 0, NULL, NULL},
        {"--type", RB_OPT_STR, "TYPE", type_help, &type_name, 0, 0, NULL, NULL},
        {"-o|--output", RB_OPT_STR, "FILE", "output file (default <shape>-<type>.gguf)", &out, 0,
         0, NULL, NULL},
        {"--seed", RB_OPT_SIZE, "N", "weight seed (default 1)", &seed, 0, 0, NULL, NULL},
        {"-t|--threads", RB_OPT_U32, "N", "worker threads (default: all cores)", &threads, 0, 0,
         NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "custom dims, starting from the shape (wherever --shape stands):",
         NULL, 0, 0, NULL, NULL},
        {"--arch", RB_OPT_CALL, "A", "llama, qwen3 or gemma3", &shape, 0, 0, opt_arch,
         &is_custom},
        {"--window", RB_OPT_U32, "N", "gemma3's sliding window (0: none)", &shape.sliding_window,
         0, 0, NULL, &is_custom},
        {"--dim", RB_OPT_U32, "N", "embedding width", &shape.n_embd, 0, 0, NULL, &is_custom},
        {"--layers", RB_OPT_U32, "N", "layers", &shape.n_layers, 0, 0, NULL, &is_custom},
        {"--heads", RB_OPT_U32, "N", "attention heads", &shape.n_head, 0, 0, NULL, &is_custom},
        {"--kv-heads", RB_OPT_U32, "N", "KV heads", &shape.n_head_kv, 0, 0, NULL, &is_custom},
        {"--head-dim", RB_OPT_U32, "N", "width per head (default dim / heads)", &shape.head_dim, 0,
         0, NULL, &is_custom},
        {"--ffn", RB_OPT_U32, "N", "feed-forward width", &shape.n_ff, 0, 0, NULL, &is_custom},
        {"--vocab", RB_OPT_U32, "N", "vocabulary size", &shape.n_vocab, 0, 0, NULL, &is_custom},
        {"--ctx", RB_OPT_U32, "N", "trained context", &shape.n_ctx, 0, 0, NULL, &is_custom},
        {"--rope-base", RB_OPT_FLOAT, "F", "rope frequency base (positive)", &shape.rope_freq_base,
         1e-30, 3e38, NULL, &is_custom},
        {"--tied", RB_OPT_FLAG, NULL, "no output.weight: token_embd is reused",
         &shape.is_tied_output, 0, 0, NULL, &is_custom},
        {"--separate-output", RB_OPT_FLAG_OFF, NULL, "a separate output.weight",
         &shape.is_tied_output, 0, 0, NULL, &is_custom},
        {"--vocab-style", RB_OPT_CALL, "spm|bpe",
         "SentencePiece-style vocabulary, or GPT-2 byte-level BPE", &shape, 0, 0,
         opt_vocab_style, &is_custom},
        {0},
    };
    const rb_cli_cmd cli = {
        "make-model", "[-o OUT.gguf] [--shape NAME] [--type TYPE] [options]",
        "A synthetic GGUF model of a named shape (or custom dims) in one of the file\n"
        "kinds, with llama.cpp's metadata keys, tensor names and tokenizer arrays;\n"
        "weights N(0, 0.02), deterministic in the seed.",
        opts, NULL, NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cli, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (is_custom)
        shape.name = "custom";
    const rb_file_kind *kind = rb_file_kind_find(type_name);
    if (!kind)
        return rb_cli_usage_error("make-model", "unknown --type", rb_file_kind_names());
    char default_out[160];
    if (!out) {
        snprintf(default_out, sizeof default_out, "%s-%s.gguf", shape.name, kind->name);
        out = default_out;
    }

    rb_synth_params p = {shape, kind, seed, (int)threads};
    rb_cli_progress prog;
    rb_cli_progress_init(&prog, "make-model");
    rb_convert_hooks hooks = {rb_cli_progress_update, rb_cli_progress_note, &prog, 0, 0};
    rb_error err;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rb_status st = rb_synth_write(out, &p, &hooks, &err);
    rb_cli_progress_done(&prog);
    if (st != RB_OK)
        return rb_cli_fail("make-model", err.message,
                           st == RB_E_IO ? "check the output folder exists and has space" : NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    FILE *f = fopen(out, "rb");
    long size = -1;
    if (f && fseek(f, 0, SEEK_END) == 0)
        size = ftell(f);
    if (f)
        fclose(f);
    char a[32], b[32];
    printf("wrote %s: %s bytes (%s), shape %s, type %s, in %.2f s\n", out,
           rb_cli_grouped((uint64_t)(size < 0 ? 0 : size), a, sizeof a),
           rb_cli_bytes((uint64_t)(size < 0 ? 0 : size), b, sizeof b), shape.name, kind->name,
           secs);
    return 0;
}
