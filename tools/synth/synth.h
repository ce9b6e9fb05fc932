/*
 * synth.h - synthetic models for `rebound make-model`: complete GGUF files
 * of real model shapes with deterministic pseudo-random weights.
 *
 * A synthetic file has everything llama.cpp's loader expects of its
 * architecture: hyperparameter keys, a tokenizer (SentencePiece-style or
 * GPT-2 byte-level BPE, from vocab_synth), and every tensor under its
 * llama.cpp name, typed by llama-quantize's rules (quant_rules). Weights
 * are N(0, 0.02) (norms 1.0); each row's values depend only on (seed,
 * tensor name, row), so the file is the same for any thread count, and a
 * Q4_0 file holds exactly the quantized values of the F32 file.
 */
#ifndef RB_SYNTH_H
#define RB_SYNTH_H

#include <stdint.h>

#include "convert.h"
#include "quant_rules.h"
#include "rebound.h"

typedef struct rb_synth_shape {
    const char *name;       /* "tinyllama-1.1b", or "custom" */
    const char *arch;       /* "llama", "qwen3" or "gemma3" */
    uint32_t n_embd;
    uint32_t n_layers;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;      /* 0: n_embd / n_head */
    uint32_t n_ff;
    uint32_t n_vocab;
    uint32_t n_ctx;
    float rope_freq_base;
    float rms_eps;
    int is_tied_output;
    int is_bpe_vocab;       /* 0: SentencePiece style, 1: GPT-2 BPE */
    const char *bpe_pre;    /* tokenizer.ggml.pre for BPE vocabularies */
    uint32_t sliding_window; /* gemma3: attention.sliding_window (0: none) */
} rb_synth_shape;

/* The named shape, or NULL. */
const rb_synth_shape *rb_synth_shape_find(const char *name);
/* Names of all shapes, comma-separated, for messages. */
const char *rb_synth_shape_names(void);

/*
 * Checks a shape for what a file needs (heads divide the width, vocabulary
 * of at least 260, ...). RB_E_INVALID_ARG with a message naming the field.
 */
rb_status rb_synth_shape_check(const rb_synth_shape *s, rb_error *err);

typedef struct rb_synth_params {
    rb_synth_shape shape;
    const rb_file_kind *kind;
    uint64_t seed;
    int n_threads;
} rb_synth_params;

/* Writes the model to path (atomically: path.tmp then rename). */
rb_status rb_synth_write(const char *path, const rb_synth_params *p,
                         rb_convert_hooks *hooks, rb_error *err);

#endif /* RB_SYNTH_H */
