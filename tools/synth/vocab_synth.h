/*
 * vocab_synth.h - synthetic tokenizer vocabularies for `rebound make-model`.
 *
 * Makes the tokenizer arrays a GGUF file needs, deterministically (the same
 * n_vocab always gives the same vocabulary), in the two styles llama.cpp
 * loads:
 *
 *   SentencePiece style (tokenizer.ggml.model = "llama"): <unk>, <s>, </s>
 *   (ids 0, 1, 2), the 256 byte tokens <0x00>..<0xFF> (type BYTE), then
 *   pieces that use U+2581 ("\xe2\x96\x81") for a leading space, with
 *   scores (higher merges first). Every piece longer than one character has
 *   its prefix pieces in the vocabulary, so the SPM merge loop can reach it.
 *
 *   GPT-2 byte-level BPE (tokenizer.ggml.model = "gpt2"): the 256
 *   byte-level symbols (GPT-2's bytes_to_unicode map: 'G' with a dot,
 *   "\xc4\xa0", is the space), then tokens each made by one merge "A B" of
 *   two earlier tokens, listed in tokenizer.ggml.merges in rank order, then
 *   control tokens at the end (<|endoftext|>, <|im_start|>, <|im_end|>).
 *
 * Tokens are built first from a built-in list of common English words (with
 * and without a leading space) so that real text tokenizes into plausible
 * pieces, then filled up to n_vocab with further deterministic pieces.
 * Memory: everything is owned by the rb_vocab_synth and freed by
 * rb_vocab_synth_free.
 */
#ifndef RB_VOCAB_SYNTH_H
#define RB_VOCAB_SYNTH_H

#include <stdint.h>
#include "rebound.h"

/* llama.cpp token types (tokenizer.ggml.token_type). */
enum {
    RB_TOKEN_TYPE_NORMAL = 1,
    RB_TOKEN_TYPE_UNKNOWN = 2,
    RB_TOKEN_TYPE_CONTROL = 3,
    RB_TOKEN_TYPE_USER_DEFINED = 4,
    RB_TOKEN_TYPE_UNUSED = 5,
    RB_TOKEN_TYPE_BYTE = 6,
};

#define RB_TOKEN_NONE UINT32_MAX

typedef struct rb_vocab_synth {
    const char *model;      /* "llama" or "gpt2" (tokenizer.ggml.model) */
    const char *pre;        /* tokenizer.ggml.pre ("qwen2") or NULL */
    uint32_t n_tokens;
    char **tokens;          /* n_tokens NUL-terminated UTF-8 strings, all distinct */
    float *scores;          /* n_tokens scores (SPM); NULL for gpt2 */
    int32_t *token_types;   /* n_tokens RB_TOKEN_TYPE_* */
    uint32_t n_merges;
    char **merges;          /* n_merges "A B" strings (gpt2); NULL for SPM */
    uint32_t bos_id, eos_id, unk_id, pad_id; /* RB_TOKEN_NONE when absent */
    int add_bos;            /* tokenizer.ggml.add_bos_token */
} rb_vocab_synth;

/*
 * Builds a SentencePiece-style vocabulary of exactly n_vocab tokens.
 * Errors: RB_E_INVALID_ARG when n_vocab < 260 (3 specials + 256 bytes + 1),
 *         RB_E_NOMEM. On failure *out is left zeroed.
 */
rb_status rb_vocab_synth_spm(uint32_t n_vocab, rb_vocab_synth *out);

/*
 * Builds a GPT-2 byte-level BPE vocabulary of exactly n_vocab tokens (the
 * last three are the control tokens; bos = eos = <|endoftext|>, add_bos 0,
 * pre = "qwen2").
 * Errors: RB_E_INVALID_ARG when n_vocab < 260, RB_E_NOMEM.
 */
rb_status rb_vocab_synth_bpe(uint32_t n_vocab, rb_vocab_synth *out);

/* Frees what rb_vocab_synth_* allocated; the struct is zeroed. */
void rb_vocab_synth_free(rb_vocab_synth *v);

#endif /* RB_VOCAB_SYNTH_H */
