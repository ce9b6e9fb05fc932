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

static void print_usage(FILE *f)
{
    fprintf(f,
        "usage: rebound make-model [-o OUT.gguf] [--shape NAME] [--type TYPE] [options]\n"
        "  --shape NAME     %s (default tiny)\n"
        "  --type TYPE      %s (default f32)\n"
        "  -o, --output F   output file (default <shape>-<type>.gguf)\n"
        "  --seed N         weight seed (default 1)\n"
        "  -t, --threads N  worker threads (default: all cores)\n"
        "custom dims, starting from the shape:\n"
        "  --arch llama|qwen3  --dim N  --layers N  --heads N  --kv-heads N  --head-dim N\n"
        "  --ffn N  --vocab N  --ctx N  --rope-base F  --tied | --separate-output  --vocab-style spm|bpe\n",
        rb_synth_shape_names(), rb_file_kind_names());
}

static int need_u32(const char *opt, const char *val, uint32_t *out)
{
    uint64_t v;
    if (!val || rb_cli_parse_u64(val, &v) != 0 || v > UINT32_MAX) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s needs a non-negative integer", opt);
        rb_cli_fail("make-model", msg, NULL);
        return -1;
    }
    *out = (uint32_t)v;
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
                return rb_cli_fail("make-model", "unknown shape", rb_synth_shape_names());
            shape = *base;
        }
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int custom = 1, rc = 0;
        if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
            print_usage(stdout);
            return 0;
        } else if (strcmp(o, "--shape") == 0) {
            i++, custom = 0;
        } else if (strcmp(o, "--type") == 0) {
            if (!v)
                return rb_cli_fail("make-model", "--type needs a value", rb_file_kind_names());
            type_name = v, i++, custom = 0;
        } else if (strcmp(o, "-o") == 0 || strcmp(o, "--output") == 0) {
            if (!v)
                return rb_cli_fail("make-model", "-o needs a file name", NULL);
            out = v, i++, custom = 0;
        } else if (strcmp(o, "--seed") == 0) {
            if (!v || rb_cli_parse_u64(v, &seed) != 0)
                return rb_cli_fail("make-model", "--seed needs an integer", NULL);
            i++, custom = 0;
        } else if (strcmp(o, "-t") == 0 || strcmp(o, "--threads") == 0) {
            rc = need_u32(o, v, &threads), i++, custom = 0;
        } else if (strcmp(o, "--arch") == 0) {
            if (!v || (strcmp(v, "llama") != 0 && strcmp(v, "qwen3") != 0))
                return rb_cli_fail("make-model", "--arch must be llama or qwen3", NULL);
            shape.arch = strcmp(v, "llama") == 0 ? "llama" : "qwen3";
            i++;
        } else if (strcmp(o, "--dim") == 0) {
            rc = need_u32(o, v, &shape.n_embd), i++;
        } else if (strcmp(o, "--layers") == 0) {
            rc = need_u32(o, v, &shape.n_layers), i++;
        } else if (strcmp(o, "--heads") == 0) {
            rc = need_u32(o, v, &shape.n_head), i++;
        } else if (strcmp(o, "--kv-heads") == 0) {
            rc = need_u32(o, v, &shape.n_head_kv), i++;
        } else if (strcmp(o, "--head-dim") == 0) {
            rc = need_u32(o, v, &shape.head_dim), i++;
        } else if (strcmp(o, "--ffn") == 0) {
            rc = need_u32(o, v, &shape.n_ff), i++;
        } else if (strcmp(o, "--vocab") == 0) {
            rc = need_u32(o, v, &shape.n_vocab), i++;
        } else if (strcmp(o, "--ctx") == 0) {
            rc = need_u32(o, v, &shape.n_ctx), i++;
        } else if (strcmp(o, "--rope-base") == 0) {
            float f;
            if (!v || sscanf(v, "%f", &f) != 1 || !(f > 0))
                return rb_cli_fail("make-model", "--rope-base needs a positive number", NULL);
            shape.rope_freq_base = f, i++;
        } else if (strcmp(o, "--tied") == 0) {
            shape.is_tied_output = 1;
        } else if (strcmp(o, "--separate-output") == 0) {
            shape.is_tied_output = 0;
        } else if (strcmp(o, "--vocab-style") == 0) {
            if (!v || (strcmp(v, "spm") != 0 && strcmp(v, "bpe") != 0))
                return rb_cli_fail("make-model", "--vocab-style must be spm or bpe", NULL);
            shape.is_bpe_vocab = strcmp(v, "bpe") == 0;
            if (shape.is_bpe_vocab && !shape.bpe_pre)
                shape.bpe_pre = "qwen2";
            i++;
        } else {
            print_usage(stderr);
            return rb_cli_fail("make-model", "unknown option", o);
        }
        if (rc)
            return 1;
        is_custom |= custom;
    }
    if (is_custom)
        shape.name = "custom";
    const rb_file_kind *kind = rb_file_kind_find(type_name);
    if (!kind)
        return rb_cli_fail("make-model", "unknown --type", rb_file_kind_names());
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
