/*
 * tokenizer.h - text <-> token ids, reproducing llama.cpp's tokenizer
 * (llama-vocab.cpp, unicode.cpp) id for id, from a GGUF file's metadata.
 *
 * Two vocabulary kinds, chosen by `tokenizer.ggml.model`:
 *
 *   "llama"  SentencePiece BPE (llama.cpp's llm_tokenizer_spm): spaces
 *            become U+2581, a space is prepended to each text fragment that
 *            follows BOS/a special token (add_space_prefix, default on),
 *            adjacent symbols merge by the highest vocabulary score, and
 *            what stays outside the vocabulary falls back to <0xXX> tokens.
 *   "gpt2"   byte-level BPE (llm_tokenizer_bpe): the text is split into
 *            words by the pre-tokenizer named by `tokenizer.ggml.pre`, each
 *            word's bytes are mapped through GPT-2's bytes_to_unicode, and
 *            `tokenizer.ggml.merges` are applied lowest rank first.
 *
 * Special tokens (types CONTROL, USER_DEFINED and UNKNOWN) are cut out of the
 * raw text first, longest first, as llama.cpp's tokenizer_st_partition does:
 * USER_DEFINED ones always, CONTROL/UNKNOWN ones only with parse_special.
 *
 * Metadata read (defaults as llama.cpp): tokens (required), scores (f32 or
 * i32), token_type (i32), merges (required for gpt2), pre, bos/eos/eot/eom/
 * unknown/padding token ids, add_bos_token, add_eos_token,
 * add_space_prefix. The end-of-generation set is llama.cpp's: eos, eot, eom,
 * FIM pad/repo/sep, and tokens whose text is one of <|eot_id|>, <|im_end|>,
 * <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>, ... (forced to
 * CONTROL as llama.cpp does).
 *
 * Not reproduced: llama.cpp's per-model-name lstrip/rstrip attributes
 * (phi-3, jina, modern-bert), the gpt-oss/gemma4 workarounds, and the WPM,
 * UGM, RWKV and PLaMo-2 vocabulary kinds (RB_E_UNSUPPORTED).
 *
 * Threads: a tokenizer is read-only after create; encode/decode/piece may
 * run on several threads at once (each call allocates its own scratch), and
 * creates of distinct tokenizers are independent (no global state).
 *
 * Ties llama.cpp leaves to chance are fixed here: special tokens of equal
 * length are matched in id order; the auto-detected EOT is the lowest id.
 * A streaming detokenizer (rb_detok) belongs to one thread.
 */
#ifndef RB_TOKENIZER_H
#define RB_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "rebound.h"

#define RB_TOKEN_NULL (-1) /* "no such token" */

typedef struct rb_tokenizer rb_tokenizer;

typedef enum rb_tokenizer_kind {
    RB_TOKENIZER_SPM = 1, /* tokenizer.ggml.model = "llama" */
    RB_TOKENIZER_BPE = 2, /* tokenizer.ggml.model = "gpt2" */
} rb_tokenizer_kind;

/* Pre-tokenizers (word splits) of byte-level BPE vocabularies. */
typedef enum rb_pretok {
    RB_PRETOK_DEFAULT = 0, /* llama.cpp's fallback chain (no/"default" pre) */
    RB_PRETOK_GPT2,        /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+|
                              ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    RB_PRETOK_LLAMA3,      /* (?i:'s|..|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
                              ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    RB_PRETOK_QWEN2,       /* the llama3 pattern with \p{N} (one digit) */
    RB_PRETOK_SMOLLM,      /* \p{N} (each digit alone), then the gpt2 pattern */
} rb_pretok;

/* Token attributes (bit set), as llama.cpp's llama_token_attr. */
enum {
    RB_TOKEN_ATTR_NORMAL = 1 << 0,
    RB_TOKEN_ATTR_UNKNOWN = 1 << 1,
    RB_TOKEN_ATTR_CONTROL = 1 << 2,
    RB_TOKEN_ATTR_USER_DEFINED = 1 << 3,
    RB_TOKEN_ATTR_UNUSED = 1 << 4,
    RB_TOKEN_ATTR_BYTE = 1 << 5,
    RB_TOKEN_ATTR_EOG = 1 << 6, /* ends generation (rb_tokenizer_is_eog) */
};

/*
 * Builds a tokenizer from g's `tokenizer.ggml.*` metadata. Everything needed
 * is copied: g may be closed right after. Loading a 152k-token vocabulary
 * with 152k merges takes ~27 ms (two hash tables, one string arena;
 * measured by tests/test_tokenizer.c).
 *
 * Errors (err names the key and the value):
 *   RB_E_FORMAT       a key missing or of the wrong type (tokens, model,
 *                     merges for gpt2), scores/token_type shorter than
 *                     tokens, a duplicate token text, a merge without a
 *                     space separator, a bos/eos/eot/unknown id out of range,
 *                     add_bos/add_eos set without the token.
 *   RB_E_UNSUPPORTED  a tokenizer model or pre-tokenizer llama.cpp names but
 *                     this file does not implement.
 *   RB_E_NOMEM, RB_E_INVALID_ARG (NULL g or out).
 * On failure *out is unchanged.
 */
rb_status rb_tokenizer_create(const rb_gguf *g, rb_tokenizer **out,
                              rb_error *err);

/* Frees everything. NULL is a no-op. */
void rb_tokenizer_destroy(rb_tokenizer *t);

/*
 * Tokenizes text[0..len) (any bytes; invalid UTF-8 is handled as llama.cpp
 * does) into tokens[0..n_max).
 *   add_special    add BOS/EOS where the vocabulary asks for them
 *                  (tokenizer.ggml.add_bos_token / add_eos_token).
 *   parse_special  recognise CONTROL and UNKNOWN token texts ("<s>",
 *                  "<|im_start|>") in the text; USER_DEFINED ones are always
 *                  recognised.
 * On RB_OK *n_out is the token count. When n_max is too small (tokens may
 * be NULL with n_max 0 to ask): RB_E_INVALID_ARG, *n_out = the count needed
 * (the one exception to "out-parameters stay unchanged"), tokens untouched.
 * Other errors: RB_E_NOMEM. Time: O(len log len); a 10 KB English text
 * takes ~1.8 ms with the Llama 2 SPM vocab (32k) and ~0.5 ms with the
 * GPT-2 BPE vocab (50k) (tests/test_tokenizer.c, -O2).
 */
rb_status rb_tokenizer_encode(const rb_tokenizer *t, const char *text,
                              size_t len, int add_special, int parse_special,
                              int32_t *tokens, size_t n_max, size_t *n_out,
                              rb_error *err);

/*
 * The bytes token id stands for (llama.cpp's token_to_piece with
 * special=true, lstrip 0): SPM pieces with U+2581 turned into spaces, byte
 * tokens as their one byte, GPT-2 pieces mapped back to bytes, CONTROL /
 * UNKNOWN / USER_DEFINED tokens as their text, UNUSED ones as "". A piece
 * may be part of a UTF-8 character. Returns the piece's length and copies
 * it into buf when it fits in n (no NUL is added); copies nothing when it
 * does not fit. Returns -1 for an invalid id.
 */
int rb_tokenizer_piece(const rb_tokenizer *t, int32_t id, char *buf, size_t n);

/* The longest piece in bytes (sizes the buffers of rb_detok). */
size_t rb_tokenizer_max_piece_bytes(const rb_tokenizer *t);

/* Flags of rb_tokenizer_decode and rb_detok. */
enum {
    /* llama_detokenize's remove_special: drop a leading BOS and a trailing
     * EOS when the vocabulary adds them. */
    RB_DECODE_REMOVE_SPECIAL = 1,
    /* llama_detokenize's unparse_special: render CONTROL and UNKNOWN tokens
     * as their text (without it they render as ""). */
    RB_DECODE_UNPARSE_SPECIAL = 2,
    /* rb_detok only: drop one leading space of the first piece (an SPM
     * prompt's "▁Once" -> "Once"). rb_tokenizer_decode does this on its own
     * as llama.cpp does: for add_space_prefix vocabularies when the first
     * token is not a removed BOS. */
    RB_DECODE_STRIP_LEADING_SPACE = 4,
};

/*
 * Detokenizes tokens[0..n) into text as llama.cpp's llama_detokenize does
 * (flags RB_DECODE_REMOVE_SPECIAL / RB_DECODE_UNPARSE_SPECIAL), including
 * its clean-up of " ." " ," " 's" for vocabularies with clean_spaces (the
 * gpt-2 and llama3 pre-tokenizers). The result is not NUL-terminated.
 * On RB_OK *n_out is the byte count. Errors: RB_E_INVALID_ARG for an id
 * out of range (err names its index) or, with *n_out = the bytes needed,
 * when n_buf is too small (buf may be NULL with n_buf 0 to ask);
 * RB_E_NOMEM.
 */
rb_status rb_tokenizer_decode(const rb_tokenizer *t, const int32_t *tokens,
                              size_t n, int flags, char *buf, size_t n_buf,
                              size_t *n_out, rb_error *err);

/* ---- getters (all O(1); ids are RB_TOKEN_NULL when absent) ------------- */

rb_tokenizer_kind rb_tokenizer_get_kind(const rb_tokenizer *t);
rb_pretok rb_tokenizer_get_pretok(const rb_tokenizer *t); /* BPE only */
uint32_t rb_tokenizer_n_vocab(const rb_tokenizer *t);
int32_t rb_tokenizer_bos(const rb_tokenizer *t);
int32_t rb_tokenizer_eos(const rb_tokenizer *t);
int32_t rb_tokenizer_eot(const rb_tokenizer *t);
int32_t rb_tokenizer_unk(const rb_tokenizer *t);
int32_t rb_tokenizer_nl(const rb_tokenizer *t); /* the newline token */
int rb_tokenizer_adds_bos(const rb_tokenizer *t);
int rb_tokenizer_adds_eos(const rb_tokenizer *t);
/* tokenizer.ggml.add_space_prefix (SPM: a space before the first word). */
int rb_tokenizer_adds_space_prefix(const rb_tokenizer *t);
/* 1 when id is in the end-of-generation set (eos, eot, <|im_end|>, ...). */
int rb_tokenizer_is_eog(const rb_tokenizer *t, int32_t id);
/* 1 when 0 <= id < n_vocab. */
int rb_tokenizer_is_valid(const rb_tokenizer *t, int32_t id);
/* RB_OK when every id is valid; RB_E_INVALID_ARG naming the first bad one. */
rb_status rb_tokenizer_validate(const rb_tokenizer *t, const int32_t *tokens,
                                size_t n, rb_error *err);
/* RB_TOKEN_ATTR_* bits of id; 0 for an invalid id. */
uint32_t rb_tokenizer_attr(const rb_tokenizer *t, int32_t id);
/* The vocabulary text of id (as stored: "▁the", "Ġthe", "<0x0A>"), not
 * NUL-terminated, *len bytes; NULL for an invalid id. Lives as long as t. */
const char *rb_tokenizer_text(const rb_tokenizer *t, int32_t id, size_t *len);
/* The id whose vocabulary text is exactly s[0..len), or RB_TOKEN_NULL. */
int32_t rb_tokenizer_find(const rb_tokenizer *t, const char *s, size_t len);

/* ---- streaming detokenizer ----------------------------------------------
 * Turns tokens into text one at a time and only ever hands out complete,
 * valid UTF-8: bytes of a character split across tokens wait for the rest;
 * a byte that cannot be part of a valid character becomes U+FFFD as soon as
 * that is certain, and rb_detok_flush turns an unfinished tail into U+FFFD.
 * Caller storage; no allocation.
 */
typedef struct rb_detok {
    const rb_tokenizer *tok;
    int flags;                 /* RB_DECODE_* */
    int n_pushed;              /* pieces with text pushed so far */
    uint32_t n_pending;        /* bytes in pending (an unfinished character) */
    unsigned char pending[4];
} rb_detok;

/* out buffers of rb_detok_push/flush must hold at least this many bytes. */
size_t rb_detok_out_bytes(const rb_tokenizer *t);

void rb_detok_init(rb_detok *d, const rb_tokenizer *t, int flags);

/*
 * Feeds token id; writes the text that is now complete to out (at most
 * rb_detok_out_bytes(t) bytes; no NUL) and its length to *n_written.
 * Errors: RB_E_INVALID_ARG (id invalid, or n_out_max below
 * rb_detok_out_bytes): nothing is consumed.
 */
rb_status rb_detok_push(rb_detok *d, int32_t id, char *out, size_t n_out_max,
                        size_t *n_written);

/* Ends the stream: writes U+FFFD for an unfinished character (at most 3
 * bytes); returns the byte count. The detokenizer may be reused after. */
size_t rb_detok_flush(rb_detok *d, char *out, size_t n_out_max);

/* ---- internal: pre-tokenizer splits (tokenizer_pre.c), for tests -------- */

/*
 * Splits the code points cps[0..n) (with fl[i] = rb_ucd_flags(cps[i])) into
 * words by pre-tokenizer kind; writes each word's length in code points to
 * lens (room for n entries; words are never empty) and returns the word
 * count. tmp is scratch of n entries. Words cover cps in order.
 */
size_t rb_pretok_split(rb_pretok kind, const uint32_t *cps, const uint8_t *fl,
                       size_t n, uint32_t *lens, uint32_t *tmp);

/* The pre-tokenizer llama.cpp uses for a `tokenizer.ggml.pre` value (NULL
 * or "" for none); *ignore_merges, *add_bos (-1: no opinion) and
 * *clean_spaces as llama.cpp sets them. RB_E_UNSUPPORTED when unknown. */
rb_status rb_pretok_from_name(const char *name, size_t len, rb_pretok *kind,
                              int *ignore_merges, int *add_bos,
                              int *clean_spaces);

#endif /* RB_TOKENIZER_H */
