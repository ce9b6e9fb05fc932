/*
 * cmd_info.c - `rebound info MODEL.gguf [-c CTX] [--tensors]`: what a model
 * is and what it costs in memory (weights in total and per layer, KV cache
 * per token and at a context length): the numbers of the mzCache paper's
 * Table 1 for any GGUF model. Uses only the public API.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "rebound.h"

#define MAX_TYPES 32

int rb_cmd_info(int argc, char **argv)
{
    const char *path = NULL;
    uint64_t ctx = 0;
    int list_tensors = 0, show_cpu = 0, n_pos = 0;
    const rb_opt opts[] = {
        {"-c|--ctx-size|--ctx", RB_OPT_SIZE, "N",
         "context length for the KV figures (default: the model's trained context)", &ctx, 1,
         UINT32_MAX, NULL, NULL},
        {"--tensors", RB_OPT_FLAG, NULL, "list every tensor with its type, dims, bytes and file offset",
         &list_tensors, 0, 0, NULL, NULL},
        {"--cpu", RB_OPT_FLAG, NULL,
         "the CPU features found, the kernel tier and the kernel per weight type "
         "(REBOUND_CPU=ref|avx2|vnni|avx512|neon|dotprod|i8mm caps the tier)", &show_cpu, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cmd = {
        "info", "MODEL.gguf [-c CTX] [--tensors] | --cpu",
        "What a model is and what it costs in memory: shape, tensor types, weight\n"
        "bytes in total and per layer, KV cache per token and at a context length.",
        opts, NULL, &path, 1, &n_pos, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (show_cpu) { /* alone, or before the model's figures */
        char d[1024];
        rb_cpu_describe(d, sizeof d);
        fputs(d, stdout);
        if (!path && n_pos == 0)
            return 0;
    }
    if (n_pos > 1)
        return rb_cli_usage_error("info", "more than one model given", NULL);
    if (!path)
        return rb_cli_usage_error("info", "no model given",
                                  "rebound make-model -o tiny.gguf; rebound info tiny.gguf");

    rb_model *model = NULL;
    rb_error err;
    if (rb_model_open(path, NULL, &model, &err) != RB_OK)
        return rb_cli_fail("info", err.message,
                           err.status == RB_E_FORMAT ? "the file is damaged or not a GGUF model" : NULL);
    rb_model_info mi;
    rb_model_get_info(model, &mi);
    if (ctx == 0)
        ctx = mi.n_ctx_train ? mi.n_ctx_train : 512;

    char a[32], b[32], c[32], e[32];
    printf("model         %s\n", path);
    printf("architecture  %s%s%s%s, GGUF v%" PRIu32 "\n", mi.architecture,
           mi.name[0] ? " (" : "", mi.name, mi.name[0] ? ")" : "", mi.gguf_version);
    printf("file          %s bytes (%s)\n", rb_cli_grouped(mi.file_bytes, a, sizeof a),
           rb_cli_bytes(mi.file_bytes, b, sizeof b));
    printf("shape         dim %" PRIu32 ", %" PRIu32 " layers, %" PRIu32 " heads, %" PRIu32
           " KV heads, head dim %" PRIu32 ", ffn %" PRIu32 ", vocab %" PRIu32 "\n",
           mi.n_embd, mi.n_layers, mi.n_head, mi.n_head_kv, mi.head_dim, mi.n_ff, mi.n_vocab);
    printf("context       %" PRIu32 " trained; rope dims %" PRIu32 ", base %g; rms eps %g\n",
           mi.n_ctx_train, mi.n_rot, (double)mi.rope_freq_base, (double)mi.rms_eps);
    printf("output        %s\n", mi.is_tied_output ? "tied (token_embd.weight is reused)"
                                                    : "separate output.weight");

    /* tensor count by type, in order of first appearance */
    const char *type_names[MAX_TYPES];
    uint64_t type_counts[MAX_TYPES], type_bytes[MAX_TYPES];
    int n_types = 0;
    for (uint64_t i = 0; i < mi.n_tensors; i++) {
        rb_tensor_info ti;
        rb_model_get_tensor_info(model, i, &ti);
        int k = 0;
        while (k < n_types && strcmp(type_names[k], ti.type_name) != 0)
            k++;
        if (k == n_types && n_types < MAX_TYPES) {
            type_names[n_types] = ti.type_name;
            type_counts[n_types] = type_bytes[n_types] = 0;
            n_types++;
        }
        if (k < n_types) {
            type_counts[k]++;
            type_bytes[k] += ti.n_bytes;
        }
    }
    printf("tensors       %" PRIu64 ":", mi.n_tensors);
    for (int k = 0; k < n_types; k++)
        printf("%s %s x%" PRIu64 " (%s)", k ? "," : "", type_names[k], type_counts[k],
               rb_cli_bytes(type_bytes[k], a, sizeof a));
    printf("\n");

    uint64_t lmin = UINT64_MAX, lmax = 0;
    for (uint32_t l = 0; l < mi.n_layers; l++) {
        uint64_t x = rb_model_get_layer_bytes(model, l);
        lmin = x < lmin ? x : lmin;
        lmax = x > lmax ? x : lmax;
    }
    printf("weights       %s bytes (%s) of tensor data\n",
           rb_cli_grouped(mi.tensor_data_bytes, a, sizeof a),
           rb_cli_bytes(mi.tensor_data_bytes, b, sizeof b));
    if (lmin == lmax)
        printf("  per layer   %s bytes (%s), every layer\n", rb_cli_grouped(lmin, a, sizeof a),
               rb_cli_bytes(lmin, b, sizeof b));
    else
        printf("  per layer   %s to %s bytes (layers differ in tensor types)\n",
               rb_cli_grouped(lmin, a, sizeof a), rb_cli_grouped(lmax, b, sizeof b));
    printf("  all layers  %s bytes (%s) in %" PRIu32 " layers\n",
           rb_cli_grouped(mi.layer_weight_bytes, a, sizeof a),
           rb_cli_bytes(mi.layer_weight_bytes, b, sizeof b), mi.n_layers);
    printf("  other       %s bytes (%s): embeddings, output, final norm\n",
           rb_cli_grouped(mi.other_weight_bytes, a, sizeof a),
           rb_cli_bytes(mi.other_weight_bytes, b, sizeof b));

    uint64_t kv = rb_model_kv_bytes(model, ctx);
    printf("KV cache f16  %s bytes per token = 2 (K,V) x %" PRIu32 " layers x %" PRIu32
           " KV heads x %" PRIu32 " dims x 2 bytes\n",
           rb_cli_grouped(mi.kv_bytes_per_token, a, sizeof a), mi.n_layers, mi.n_head_kv,
           mi.head_dim);
    if (mi.n_layers_swa)
        printf("  sliding     %" PRIu32 " of the %" PRIu32 " layers attend to the last %" PRIu32
               " positions: they hold at most that many (older pages are freed, never "
               "spilled), the other %" PRIu32 " the whole context\n",
               mi.n_layers_swa, mi.n_layers, mi.sliding_window, mi.n_layers - mi.n_layers_swa);
    printf("  at ctx %-5" PRIu64 "%s bytes (%s)\n", ctx, rb_cli_grouped(kv, a, sizeof a),
           rb_cli_bytes(kv, b, sizeof b));
    if (mi.head_dim % 32 == 0) /* llama.cpp's blocks of 32: 34 bytes (q8_0), 18 (q4_0) */
        printf("  -ctk/-ctv   q8_0: %s bytes (%s), q4_0: %s bytes (%s) at ctx %" PRIu64 "\n",
               rb_cli_grouped(kv / 64 * 34, a, sizeof a), rb_cli_bytes(kv / 64 * 34, b, sizeof b),
               rb_cli_grouped(kv / 64 * 18, c, sizeof c), rb_cli_bytes(kv / 64 * 18, e, sizeof e),
               ctx);
    else
        printf("  -ctk/-ctv   q8_0, q4_0: not for head dim %" PRIu32 " (blocks of 32)\n",
               mi.head_dim);
    printf("footprint     %s bytes (%s) = weights + KV at ctx %" PRIu64 " (%s of it KV)\n",
           rb_cli_grouped(mi.tensor_data_bytes + kv, a, sizeof a),
           rb_cli_bytes(mi.tensor_data_bytes + kv, b, sizeof b), ctx,
           (snprintf(c, sizeof c, "%.1f%%",
                     100.0 * (double)kv / (double)(mi.tensor_data_bytes + kv)), c));

    if (list_tensors) {
        printf("\n%-28s %-6s %-24s %14s %12s\n", "tensor", "type", "dims", "bytes", "offset");
        for (uint64_t i = 0; i < mi.n_tensors; i++) {
            rb_tensor_info ti;
            rb_model_get_tensor_info(model, i, &ti);
            char dims[64];
            int n = 0;
            for (uint32_t d = 0; d < ti.n_dims; d++)
                n += snprintf(dims + n, sizeof dims - (size_t)n, "%s%" PRIu64, d ? " x " : "",
                              ti.dims[d]);
            printf("%-28s %-6s %-24s %14" PRIu64 " %#12" PRIx64 "\n", ti.name, ti.type_name,
                   dims, ti.n_bytes, ti.file_offset);
        }
    }
    rb_model_close(model);
    return 0;
}
