/*
 * chat_template.h - the chat formats `rebound chat` knows, built in (no
 * Jinja interpreter), how one is chosen for a model, and how a turn of a
 * conversation is rendered as text.
 *
 * A conversation is fed to the session one piece at a time, each piece
 * tokenized on its own and appended to the KV cache (the earlier pieces are
 * never re-rendered):
 *
 *     [BOS] system-block  user-turn  <reply>  reply-end  user-turn  <reply> ...
 *
 * BOS is a token the caller adds when the model asks for one; everything
 * else is text in which the template's markers (<|im_start|>, </s>, ...)
 * are written out, to be tokenized with special-token parsing on.
 *
 * Pure string code: no model, no tokenizer, no I/O; it is linked into the
 * CLI and into tests/test_chat_template.c.
 */
#ifndef RB_CHAT_TEMPLATE_H
#define RB_CHAT_TEMPLATE_H

#include <stddef.h>

typedef enum rb_chat_template {
    RB_CHAT_TEMPLATE_CHATML = 0, /* Qwen2/Qwen3, SmolLM2: <|im_start|>role\n...<|im_end|>\n */
    RB_CHAT_TEMPLATE_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    RB_CHAT_TEMPLATE_LLAMA2,     /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST] */
    RB_CHAT_TEMPLATE_ZEPHYR,     /* TinyLlama chat: <|user|>\n...</s>\n<|assistant|>\n */
    RB_CHAT_TEMPLATE_PLAIN,      /* no markers: "User: ...\nAssistant:" */
    RB_CHAT_TEMPLATE_COUNT
} rb_chat_template;

/* "chatml", "llama3", ...; "?" when out of range. */
const char *rb_chat_template_name(rb_chat_template t);

/* The template named name, or -1 when no template has that name. */
int rb_chat_template_from_name(const char *name);

/* "chatml, llama3, llama2, zephyr, plain": for usage and error messages. */
const char *rb_chat_template_names(void);

/*
 * Marker texts whose presence in the vocabulary as one special token says
 * which family a model belongs to when its file carries no template text.
 * The caller tokenizes each rb_chat_vocab_probe[i] (special parsing on) and
 * sets bit (1u << i) of rb_chat_template_hints.vocab_specials when it gives
 * exactly one token.
 */
enum {
    RB_CHAT_VOCAB_IM_START = 0,     /* "<|im_start|>" */
    RB_CHAT_VOCAB_EOT_ID = 1,       /* "<|eot_id|>" */
    RB_CHAT_VOCAB_START_HEADER = 2, /* "<|start_header_id|>" */
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
 *   1. the Jinja text, by distinctive markers: "<|im_start|>" chatml,
 *      "<|start_header_id|>" llama3, "[INST]" llama2, "<|user|>" and
 *      "<|assistant|>" without Phi-3's "<|end|>" zephyr;
 *   2. the vocabulary: <|im_start|> a special token -> chatml;
 *      <|eot_id|> and <|start_header_id|> special tokens -> llama3;
 *   3. the architecture: qwen2, qwen2moe, qwen3, qwen3moe -> chatml;
 *   4. the name: "tinyllama" or "zephyr" -> zephyr; "llama-2" or "llama2"
 *      with "chat" -> llama2 (names compared case-insensitively);
 *   5. plain.
 * *why (may be NULL) receives a static phrase naming the rule that fired,
 * e.g. "tokenizer.chat_template has <|im_start|>".
 */
rb_chat_template rb_chat_template_detect(const rb_chat_template_hints *hints, const char **why);

/* The special-token text a template's turns rely on ("<|im_start|>",
 * "<|eot_id|>", "</s>"), so the caller can warn when the vocabulary lacks
 * it and the marker would be fed as plain text; NULL for plain. */
const char *rb_chat_template_marker(rb_chat_template t);

/* What a user turn loses when it comes right after the system block
 * (llama2's "[INST] ", which that block already opened), or NULL for
 * templates whose turns stand alone. A context shift that keeps the system
 * prompt but drops the turns before a kept one removes this prefix from
 * the kept turn, so the context reads as if that turn had been the first. */
const char *rb_chat_template_first_user_skip(rb_chat_template t);

/* A growing text buffer, always NUL-terminated once anything was appended.
 * Zero-initialise it; rb_chat_text_free releases it. */
typedef struct rb_chat_text {
    char *ptr;
    size_t len;
    size_t cap;
} rb_chat_text;

void rb_chat_text_clear(rb_chat_text *t);
void rb_chat_text_free(rb_chat_text *t);

/*
 * Renderers: each appends to out and returns 0, or -1 when out of memory
 * (out then holds a prefix of the text).
 *
 * render_system   the block that opens a conversation with a system prompt;
 *                 appends nothing for a NULL or empty system. For llama2
 *                 the block is the opening of the first [INST], so the
 *                 first user turn continues it.
 * render_user     one user message and the assistant's header that follows
 *                 it. is_first_turn: no earlier user turn in the context;
 *                 has_system: a non-empty system block was fed before it.
 * render_reply_end  closes the assistant's reply (always fed after a reply,
 *                 whether the model ended it or a limit did: the model's own
 *                 end token is sampled, never fed, so the context holds the
 *                 template's exact closing either way).
 */
int rb_chat_render_system(rb_chat_template t, const char *system, rb_chat_text *out);
int rb_chat_render_user(rb_chat_template t, const char *user, int is_first_turn,
                        int has_system, rb_chat_text *out);
int rb_chat_render_reply_end(rb_chat_template t, rb_chat_text *out);

#endif /* RB_CHAT_TEMPLATE_H */
