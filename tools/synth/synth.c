/*
 * synth.c - synthetic GGUF models (contract in synth.h).
 *
 * Does: the table of named shapes, the tensor list of each architecture in
 * llama.cpp's names and dims, the metadata, and the weight generator. Does
 * not: tokenizer construction (vocab_synth.c), type choice (quant_rules.c),
 * quantization and threading (convert.c), file layout (gguf_write.c).
 *
 * Tensors are written in data-flow order (token_embd, blk.0 .. blk.N-1,
 * output_norm, output) so that each layer's weights are contiguous in the
 * file: a layer is one sequential read for the weight cache later.
 *
 * The generator: values are approximately N(0, 0.02), the scale of trained
 * Llama weights, made as a sum of four 16-bit uniforms (Irwin-Hall, n = 4:
 * bounded tails at 3.5 sigma, one 64-bit random number per value), because
 * speed matters here: tinyllama-1.1b has 1.1e9 values to make.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"
#include "status.h"
#include "synth.h"
#include "vocab_synth.h"

#define WEIGHT_STD 0.02f

static const rb_synth_shape shapes[] = {
    /* name             arch     embd layers head kv hd  ff     vocab   ctx    rope      eps   tied bpe pre */
    {"tiny",            "llama",   64,  2,  4, 2,   0,  256,    512,   256, 10000.0f, 1e-5f, 0, 0, NULL, 0},
    {"stories260k",     "llama",   64,  5,  8, 4,   0,  172,    512,   128, 10000.0f, 1e-5f, 0, 0, NULL, 0},
    /* smollm2-360m: vocab 32000, not the real 49152: llama.cpp's reference
       file for this shape has 32000 tokens (its 200.1 MiB Q4_0 size in
       shared/models/README.md is matched only with 32000), and benchmarks
       compare bytes read per token */
    {"smollm2-360m",    "llama",  960, 32, 15, 5,   0, 2560,  32000,  8192, 100000.0f, 1e-5f, 1, 1, "smollm", 0},
    {"tinyllama-1.1b",  "llama", 2048, 22, 32, 4,   0, 5632,  32000,  2048, 10000.0f, 1e-5f, 0, 0, NULL, 0},
    {"llama3.2-1b",     "llama", 2048, 16, 32, 8,   0, 8192, 128256, 131072, 500000.0f, 1e-5f, 1, 1, "llama-bpe", 0},
    {"qwen3-0.6b",      "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f, 1, 1, "qwen2", 0},
    /* Gemma 3 (google/gemma-3-*'s config.json): a 512-position sliding
       window on 5 of every 6 layers; Gemma's 262144-token SentencePiece
       vocabulary size, built as the synth's SPM vocabulary without the
       space prefix (as Gemma files have it) */
    {"gemma3-270m",    "gemma3",  640, 18,  4, 1, 256, 2048, 262144, 32768, 1000000.0f, 1e-6f, 1, 0, NULL, 512},
    {"gemma3-1b",      "gemma3", 1152, 26,  4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f, 1, 0, NULL, 512},
};

const rb_synth_shape *rb_synth_shape_find(const char *name)
{
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        if (strcmp(shapes[i].name, name) == 0)
            return &shapes[i];
    return NULL;
}

const char *rb_synth_shape_names(void)
{
    return "tiny, stories260k, smollm2-360m, tinyllama-1.1b, llama3.2-1b, qwen3-0.6b, "
           "gemma3-270m, gemma3-1b";
}

static uint32_t head_dim(const rb_synth_shape *s)
{
    return s->head_dim ? s->head_dim : s->n_embd / s->n_head;
}

rb_status rb_synth_shape_check(const rb_synth_shape *s, rb_error *err)
{
    if (strcmp(s->arch, "llama") != 0 && strcmp(s->arch, "qwen3") != 0 &&
        strcmp(s->arch, "gemma3") != 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "make-model: architecture '%s' is not one of llama, qwen3, gemma3",
                            s->arch);
    if (s->n_embd == 0 || s->n_layers == 0 || s->n_head == 0 || s->n_head_kv == 0 ||
        s->n_ff == 0 || s->n_ctx == 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "make-model: dim, layers, heads, kv-heads, ffn and ctx must be > 0");
    if (!s->head_dim && s->n_embd % s->n_head != 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "make-model: dim %" PRIu32 " is not a multiple of heads %" PRIu32
                            " (give --head-dim)", s->n_embd, s->n_head);
    if (s->n_head % s->n_head_kv != 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "make-model: kv-heads %" PRIu32 " does not divide heads %" PRIu32,
                            s->n_head_kv, s->n_head);
    if (head_dim(s) % 2 != 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "make-model: head dim %" PRIu32 " must be even (RoPE rotates pairs)",
                            head_dim(s));
    if (s->n_vocab < 260)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "make-model: vocab %" PRIu32 " is below 260 (3 specials + 256 bytes + 1)",
                            s->n_vocab);
    if (s->n_layers > 100000 || s->n_embd > (1u << 20) || s->n_ff > (1u << 22))
        return rb_error_set(err, RB_E_INVALID_ARG, "make-model: dims are implausibly large");
    return RB_OK;
}

/* ---- tensors ------------------------------------------------------------- */

typedef struct synth_tensor {
    char name[64];
    uint32_t n_dims;
    uint64_t dims[2];
    int is_norm;     /* filled with 1.0 */
} synth_tensor;

static void add(synth_tensor *t, size_t *n, const char *name, uint32_t n_dims,
                uint64_t d0, uint64_t d1, int is_norm)
{
    synth_tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->n_dims = n_dims;
    x->dims[0] = d0;
    x->dims[1] = d1;
    x->is_norm = is_norm;
}

/* The tensor list of a shape, in file order; returns the count. */
static size_t list_tensors(const rb_synth_shape *s, synth_tensor *t)
{
    size_t n = 0;
    uint64_t hd = head_dim(s), q = hd * s->n_head, kv = hd * s->n_head_kv;
    int is_gemma3 = strcmp(s->arch, "gemma3") == 0;
    int qk_norm = strcmp(s->arch, "qwen3") == 0 || is_gemma3;
    char name[64];
    add(t, &n, "token_embd.weight", 2, s->n_embd, s->n_vocab, 0);
    for (uint32_t l = 0; l < s->n_layers; l++) {
#define LAYER(suffix, nd, a, b, norm)                                          \
        do {                                                                   \
            snprintf(name, sizeof name, "blk.%" PRIu32 ".%s", l, suffix);      \
            add(t, &n, name, nd, a, b, norm);                                  \
        } while (0)
        LAYER("attn_norm.weight", 1, s->n_embd, 1, 1);
        LAYER("attn_q.weight", 2, s->n_embd, q, 0);
        LAYER("attn_k.weight", 2, s->n_embd, kv, 0);
        LAYER("attn_v.weight", 2, s->n_embd, kv, 0);
        if (qk_norm) {
            LAYER("attn_q_norm.weight", 1, hd, 1, 1);
            LAYER("attn_k_norm.weight", 1, hd, 1, 1);
        }
        LAYER("attn_output.weight", 2, q, s->n_embd, 0);
        if (is_gemma3)
            LAYER("post_attention_norm.weight", 1, s->n_embd, 1, 1);
        LAYER("ffn_norm.weight", 1, s->n_embd, 1, 1);
        LAYER("ffn_gate.weight", 2, s->n_embd, s->n_ff, 0);
        LAYER("ffn_down.weight", 2, s->n_ff, s->n_embd, 0);
        LAYER("ffn_up.weight", 2, s->n_embd, s->n_ff, 0);
        if (is_gemma3)
            LAYER("post_ffw_norm.weight", 1, s->n_embd, 1, 1);
#undef LAYER
    }
    add(t, &n, "output_norm.weight", 1, s->n_embd, 1, 1);
    if (!s->is_tied_output)
        add(t, &n, "output.weight", 2, s->n_embd, s->n_vocab, 0);
    return n;
}

/* ---- weights ------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t hash_name(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

typedef struct weight_source {
    uint64_t seed;      /* already mixed with the tensor name */
    int is_norm;
} weight_source;

static rb_status make_rows(void *ctx, uint64_t row0, uint64_t n_rows,
                           uint64_t row_len, float *dst, rb_error *err)
{
    const weight_source *ws = ctx;
    (void)err;
    /* sqrt(3) / 65536: the sum of four 16-bit uniforms has std 65536/sqrt(3) */
    const float scale = WEIGHT_STD * 1.7320508f / 65536.0f;
    for (uint64_t r = 0; r < n_rows; r++) {
        float *row = dst + r * row_len;
        if (ws->is_norm) {
            for (uint64_t i = 0; i < row_len; i++)
                row[i] = 1.0f;
            continue;
        }
        uint64_t state = ws->seed ^ ((row0 + r) * 0xd1342543de82ef95ull);
        for (uint64_t i = 0; i < row_len; i++) {
            uint64_t x = splitmix64(&state);
            int32_t sum = (int32_t)(x & 0xffff) + (int32_t)((x >> 16) & 0xffff) +
                          (int32_t)((x >> 32) & 0xffff) + (int32_t)(x >> 48);
            row[i] = (float)(sum - 2 * 65535) * scale;
        }
    }
    return RB_OK;
}

/* ---- metadata ------------------------------------------------------------ */

static void set_arch_u32(rb_gguf_writer *w, const char *arch, const char *suffix, uint32_t v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    rb_gguf_writer_set_u32(w, key, v);
}

static void set_arch_f32(rb_gguf_writer *w, const char *arch, const char *suffix, float v)
{
    char key[96];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    rb_gguf_writer_set_f32(w, key, v);
}

static rb_status write_metadata(rb_gguf_writer *w, const rb_synth_params *p,
                                rb_error *err)
{
    const rb_synth_shape *s = &p->shape;
    const char *a = s->arch;
    char name[128];
    snprintf(name, sizeof name, "rebound-synthetic-%s", s->name);
    rb_gguf_writer_set_str(w, "general.architecture", a);
    rb_gguf_writer_set_str(w, "general.name", name);
    rb_gguf_writer_set_u32(w, "general.file_type", p->kind->ftype);
    if (rb_type_get_traits(p->kind->base_type)->is_quantized)
        rb_gguf_writer_set_u32(w, "general.quantization_version", 2);
    set_arch_u32(w, a, "context_length", s->n_ctx);
    set_arch_u32(w, a, "embedding_length", s->n_embd);
    set_arch_u32(w, a, "block_count", s->n_layers);
    set_arch_u32(w, a, "feed_forward_length", s->n_ff);
    set_arch_u32(w, a, "attention.head_count", s->n_head);
    set_arch_u32(w, a, "attention.head_count_kv", s->n_head_kv);
    if (s->head_dim) {
        set_arch_u32(w, a, "attention.key_length", s->head_dim);
        set_arch_u32(w, a, "attention.value_length", s->head_dim);
    } else {
        set_arch_u32(w, a, "rope.dimension_count", head_dim(s));
    }
    set_arch_f32(w, a, "rope.freq_base", s->rope_freq_base);
    set_arch_f32(w, a, "attention.layer_norm_rms_epsilon", s->rms_eps);
    set_arch_u32(w, a, "vocab_size", s->n_vocab);
    if (s->sliding_window)
        set_arch_u32(w, a, "attention.sliding_window", s->sliding_window);

    rb_vocab_synth v;
    rb_status st = s->is_bpe_vocab ? rb_vocab_synth_bpe(s->n_vocab, &v)
                                   : rb_vocab_synth_spm(s->n_vocab, &v);
    if (st != RB_OK)
        return rb_error_set(err, st, "make-model: cannot build a %" PRIu32 "-token vocabulary",
                            s->n_vocab);
    rb_gguf_writer_set_str(w, "tokenizer.ggml.model", v.model);
    if (s->is_bpe_vocab)
        rb_gguf_writer_set_str(w, "tokenizer.ggml.pre", s->bpe_pre ? s->bpe_pre : v.pre);
    rb_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", v.n_tokens,
                                 (const char *const *)v.tokens);
    if (v.scores)
        rb_gguf_writer_set_array(w, "tokenizer.ggml.scores", RB_GGUF_F32, v.n_tokens, v.scores);
    rb_gguf_writer_set_array(w, "tokenizer.ggml.token_type", RB_GGUF_I32, v.n_tokens,
                             v.token_types);
    if (v.merges)
        rb_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", v.n_merges,
                                     (const char *const *)v.merges);
    if (v.bos_id != RB_TOKEN_NONE)
        rb_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", v.bos_id);
    if (v.eos_id != RB_TOKEN_NONE)
        rb_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", v.eos_id);
    if (v.unk_id != RB_TOKEN_NONE)
        rb_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", v.unk_id);
    if (v.pad_id != RB_TOKEN_NONE)
        rb_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", v.pad_id);
    rb_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v.add_bos);
    rb_gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", 0);
    if (strcmp(a, "gemma3") == 0)
        rb_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", 0);
    rb_vocab_synth_free(&v);
    return RB_OK;
}

/* ---- the file ------------------------------------------------------------ */

rb_status rb_synth_write(const char *path, const rb_synth_params *p,
                         rb_convert_hooks *hooks, rb_error *err)
{
    const rb_synth_shape *s = &p->shape;
    rb_status st = rb_synth_shape_check(s, err);
    if (st != RB_OK)
        return st;
    /* 9 tensors per layer (11 with Q/K norms, 13 with gemma3's post norms)
       + 3 outside layers */
    size_t cap = (size_t)s->n_layers * 13 + 3;
    synth_tensor *t = malloc(cap * sizeof *t);
    uint32_t *types = malloc(cap * sizeof *types);
    rb_gguf_writer *w = NULL;
    if (!t || !types) {
        st = rb_error_set(err, RB_E_NOMEM, "make-model: out of memory");
        goto done;
    }
    size_t n = list_tensors(s, t);
    if ((st = rb_gguf_writer_create(path, 0, NULL, &w, err)) != RB_OK)
        goto done;
    if ((st = write_metadata(w, p, err)) != RB_OK)
        goto done;
    if (hooks)
        hooks->total_bytes = hooks->done_bytes = 0;
    for (size_t i = 0; i < n; i++)
        types[i] = rb_convert_declare(w, p->kind, t[i].name, t[i].n_dims, t[i].dims,
                                      s->n_layers, !s->is_tied_output, hooks);
    if ((st = rb_gguf_writer_begin_data(w)) != RB_OK) {
        rb_error_set(err, st, "%s", rb_gguf_writer_errmsg(w));
        goto done;
    }
    for (size_t i = 0; i < n && st == RB_OK; i++) {
        weight_source ws = {p->seed ^ hash_name(t[i].name), t[i].is_norm};
        st = rb_convert_tensor(w, types[i], t[i].dims[0], t[i].dims[1], make_rows, &ws,
                               p->n_threads, hooks, err);
    }
    if (st == RB_OK && (st = rb_gguf_writer_finish(w)) != RB_OK)
        rb_error_set(err, st, "%s", rb_gguf_writer_errmsg(w));
done:
    rb_gguf_writer_destroy(w);
    free(t);
    free(types);
    return st;
}
