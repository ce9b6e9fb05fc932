/*
 * chat_template.h - the built-in chat formats (public API in rebound.h:
 * rb_chat_template_choose, rb_chat_render, rb_chat_apply_template,
 * rb_chat_render_piece) and, for tests, the rules that pick a family from
 * what a model says about itself.
 *
 * A conversation is fed to a session one piece at a time, each piece
 * tokenized on its own and appended to the KV cache (the earlier pieces are
 * never re-rendered):
 *
 *     [BOS] system-block  user-turn  <reply>  reply-end  user-turn  <reply> ...
 *
 * BOS is a token the caller adds when the model asks for one; everything
 * else is text in which the template's markers (<|im_start|>, </s>, ...)
 * are written out, to be tokenized with special-token parsing on.
 */
#ifndef RB_CHAT_TEMPLATE_H
#define RB_CHAT_TEMPLATE_H

#include <stddef.h>

#include "rebound.h"

/*
 * Marker texts whose presence in the vocabulary as one special token says
 * which family a model belongs to when its file carries no template text.
 * rb_chat_template_choose tokenizes each (special parsing on) and sets bit
 * (1u << i) of rb_chat_template_hints.vocab_specials when it gives exactly
 * one token.
 */
enum {
    RB_CHAT_VOCAB_IM_START = 0,      /* "<|im_start|>" */
    RB_CHAT_VOCAB_EOT_ID = 1,        /* "<|eot_id|>" */
    RB_CHAT_VOCAB_START_HEADER = 2,  /* "<|start_header_id|>" */
    RB_CHAT_VOCAB_START_OF_TURN = 3, /* "<start_of_turn>" */
    RB_CHAT_VOCAB_COUNT
};
extern const char *const rb_chat_vocab_probe[RB_CHAT_VOCAB_COUNT];

/* What the choice of a template looks at; any field may be NULL / 0. */
typedef struct rb_chat_template_hints {
    const char *jinja;        /* tokenizer.chat_template (not NUL-terminated) */
    size_t jinja_len;
    const char *architecture; /* general.architecture */
    const char *model_name;   /* general.name */
    unsigned vocab_specials;  /* bit set over RB_CHAT_VOCAB_* */
} rb_chat_template_hints;

/*
 * Chooses the template for a model. In order:
 *   1. the Jinja text, by distinctive markers (llama.cpp's rules where they
 *      name one of these families): "<|im_start|>" chatml; "[INST]" llama2
 *      with "<<SYS>>", else mistral; "<|assistant|>" with "<|end|>" phi3;
 *      "<|user|>" with "<|assistant|>" zephyr; "<start_of_turn>" gemma;
 *      "<|start_header_id|>" llama3; "<｜User｜>" with "<｜Assistant｜>"
 *      deepseek-r1;
 *   2. the vocabulary: <|im_start|> -> chatml; <|eot_id|> and
 *      <|start_header_id|> -> llama3; <start_of_turn> -> gemma;
 *   3. the architecture: qwen2/qwen2moe/qwen3/qwen3moe -> chatml;
 *      gemma/gemma2/gemma3 -> gemma; phi3 -> phi3;
 *   4. the name: "tinyllama" or "zephyr" -> zephyr; "llama-2"/"llama2" with
 *      "chat" -> llama2; "mistral" with "instruct" -> mistral; "deepseek-r1"
 *      -> deepseek-r1 (case-insensitive);
 *   5. plain, *is_fallback = 1.
 * *why (may be NULL) receives a static phrase naming the rule that fired.
 */
rb_chat_template rb_chat_template_detect(const rb_chat_template_hints *hints, const char **why,
                                         int *is_fallback);

/* The special-token text a template's turns rely on, or NULL for plain. */
const char *rb_chat_template_marker(rb_chat_template t);

#endif /* RB_CHAT_TEMPLATE_H */
