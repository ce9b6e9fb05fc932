/*
 * chat_template.c - the built-in chat formats of `rebound chat`: a table of
 * the text around each role per family, the rules that pick a family for a
 * model, and the renderers of one conversation piece at a time.
 *
 * Does: recognise a family from the GGUF's Jinja text by its markers (never
 * evaluates it), or from the vocabulary, architecture and name when the
 * file has no template; render text. Does not: tokenize, add BOS, or know
 * anything of sessions (cmd_chat.c does that).
 *
 * Each family's layout, for system S, user U, reply A (what the model
 * writes between the assistant header and the reply end):
 *   chatml  <|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n
 *           <|im_start|>assistant\nA<|im_end|>\n
 *   llama3  <|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>
 *           <|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>
 *           <|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>
 *   llama2  [INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]A</s><s>[INST] U2 [/INST]
 *   zephyr  <|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\nA</s>\n
 *   plain   S\n\nUser: U\nAssistant:A\n
 * llama2 closes a reply with "</s><s>": every later [INST] starts a new
 * sequence there, and putting its BOS at the end of the reply keeps each
 * user turn's text the same (and a turn's first token the same for the
 * context shift, which cuts at turn starts).
 *
 * Memory: rb_chat_text grows by doubling with realloc; nothing else is
 * allocated.
 */
#include "chat_template.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* The text around each role: renderers never branch on the family, except
 * for llama2's first [INST], which the system block opens. */
typedef struct chat_format {
    const char *name;
    const char *system_prefix, *system_suffix;
    const char *user_prefix;     /* before a user message */
    const char *user_suffix;     /* after it, through the assistant's header */
    const char *reply_end;       /* closes the assistant's reply */
    int system_opens_first_user; /* the system block is the start of the first
                                    user turn, whose prefix is then skipped */
    const char *marker;          /* a special token every turn uses */
} chat_format;

static const chat_format formats[RB_CHAT_TEMPLATE_COUNT] = {
    [RB_CHAT_TEMPLATE_CHATML] = {
        "chatml", "<|im_start|>system\n", "<|im_end|>\n", "<|im_start|>user\n",
        "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n", 0, "<|im_start|>"},
    [RB_CHAT_TEMPLATE_LLAMA3] = {
        "llama3", "<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\n",
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", 0,
        "<|eot_id|>"},
    [RB_CHAT_TEMPLATE_LLAMA2] = {
        "llama2", "[INST] <<SYS>>\n", "\n<</SYS>>\n\n", "[INST] ", " [/INST]", "</s><s>", 1, "</s>"},
    [RB_CHAT_TEMPLATE_ZEPHYR] = {
        "zephyr", "<|system|>\n", "</s>\n", "<|user|>\n", "</s>\n<|assistant|>\n", "</s>\n", 0,
        "</s>"},
    [RB_CHAT_TEMPLATE_PLAIN] = {
        "plain", "", "\n\n", "User: ", "\nAssistant:", "\n", 0, NULL},
};

const char *const rb_chat_vocab_probe[RB_CHAT_VOCAB_COUNT] = {
    [RB_CHAT_VOCAB_IM_START] = "<|im_start|>",
    [RB_CHAT_VOCAB_EOT_ID] = "<|eot_id|>",
    [RB_CHAT_VOCAB_START_HEADER] = "<|start_header_id|>",
};

const char *rb_chat_template_name(rb_chat_template t)
{
    return (unsigned)t < RB_CHAT_TEMPLATE_COUNT ? formats[t].name : "?";
}

const char *rb_chat_template_marker(rb_chat_template t)
{
    return (unsigned)t < RB_CHAT_TEMPLATE_COUNT ? formats[t].marker : NULL;
}

const char *rb_chat_template_first_user_skip(rb_chat_template t)
{
    if ((unsigned)t >= RB_CHAT_TEMPLATE_COUNT || !formats[t].system_opens_first_user)
        return NULL;
    return formats[t].user_prefix;
}

int rb_chat_template_from_name(const char *name)
{
    for (int i = 0; name && i < RB_CHAT_TEMPLATE_COUNT; i++)
        if (strcmp(name, formats[i].name) == 0)
            return i;
    return -1;
}

const char *rb_chat_template_names(void)
{
    return "chatml, llama3, llama2, zephyr, plain";
}

/* 1 when needle occurs in the n bytes at hay (which may hold NULs). */
static int has_bytes(const char *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    if (!hay || k == 0 || k > n)
        return 0;
    for (size_t i = 0; i + k <= n; i++)
        if (hay[i] == needle[0] && memcmp(hay + i, needle, k) == 0)
            return 1;
    return 0;
}

/* 1 when needle (lowercase) occurs in s, ignoring ASCII case. */
static int has_word_nocase(const char *s, const char *needle)
{
    size_t k = strlen(needle);
    for (; s && *s; s++) {
        size_t i = 0;
        while (i < k && s[i] && tolower((unsigned char)s[i]) == needle[i])
            i++;
        if (i == k)
            return 1;
    }
    return 0;
}

rb_chat_template rb_chat_template_detect(const rb_chat_template_hints *h, const char **why)
{
    static const rb_chat_template_hints none;
    const char *reason = "no template text, vocabulary marker, or known architecture";
    rb_chat_template t = RB_CHAT_TEMPLATE_PLAIN;
    if (!h)
        h = &none;
    const char *j = h->jinja;
    size_t jn = h->jinja ? h->jinja_len : 0;
    const char *arch = h->architecture ? h->architecture : "";
    unsigned v = h->vocab_specials;

    /* 1. the file's own template: its markers are the format's */
    if (has_bytes(j, jn, "<|im_start|>")) {
        t = RB_CHAT_TEMPLATE_CHATML, reason = "tokenizer.chat_template has <|im_start|>";
    } else if (has_bytes(j, jn, "<|start_header_id|>")) {
        t = RB_CHAT_TEMPLATE_LLAMA3, reason = "tokenizer.chat_template has <|start_header_id|>";
    } else if (has_bytes(j, jn, "[INST]")) {
        t = RB_CHAT_TEMPLATE_LLAMA2, reason = "tokenizer.chat_template has [INST]";
    } else if (has_bytes(j, jn, "<|user|>") && has_bytes(j, jn, "<|assistant|>") &&
               !has_bytes(j, jn, "<|end|>")) {
        /* Phi-3 uses the same role tags but closes turns with <|end|> */
        t = RB_CHAT_TEMPLATE_ZEPHYR, reason = "tokenizer.chat_template has <|user|>, <|assistant|>";
    /* 2. the vocabulary: a family's marker tokens */
    } else if (v & (1u << RB_CHAT_VOCAB_IM_START)) {
        t = RB_CHAT_TEMPLATE_CHATML, reason = "<|im_start|> is a special token";
    } else if ((v & (1u << RB_CHAT_VOCAB_EOT_ID)) && (v & (1u << RB_CHAT_VOCAB_START_HEADER))) {
        t = RB_CHAT_TEMPLATE_LLAMA3, reason = "<|eot_id|> and <|start_header_id|> are special tokens";
    /* 3. the architecture: Qwen models are all chatml */
    } else if (!strcmp(arch, "qwen2") || !strcmp(arch, "qwen2moe") || !strcmp(arch, "qwen3") ||
               !strcmp(arch, "qwen3moe")) {
        t = RB_CHAT_TEMPLATE_CHATML, reason = "architecture is a Qwen";
    /* 4. the name, for SentencePiece llamas whose markers are plain text */
    } else if (has_word_nocase(h->model_name, "tinyllama") ||
               has_word_nocase(h->model_name, "zephyr")) {
        t = RB_CHAT_TEMPLATE_ZEPHYR, reason = "model name says TinyLlama/Zephyr";
    } else if ((has_word_nocase(h->model_name, "llama-2") ||
                has_word_nocase(h->model_name, "llama2")) &&
               has_word_nocase(h->model_name, "chat")) {
        t = RB_CHAT_TEMPLATE_LLAMA2, reason = "model name says Llama 2 chat";
    }
    if (why)
        *why = reason;
    return t;
}

void rb_chat_text_clear(rb_chat_text *t)
{
    t->len = 0;
    if (t->ptr)
        t->ptr[0] = 0;
}

void rb_chat_text_free(rb_chat_text *t)
{
    free(t->ptr);
    t->ptr = NULL;
    t->len = t->cap = 0;
}

static int append(rb_chat_text *t, const char *s)
{
    size_t n = strlen(s);
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *p = realloc(t->ptr, cap);
        if (!p)
            return -1;
        t->ptr = p, t->cap = cap;
    }
    memcpy(t->ptr + t->len, s, n + 1);
    t->len += n;
    return 0;
}

int rb_chat_render_system(rb_chat_template t, const char *system, rb_chat_text *out)
{
    if ((unsigned)t >= RB_CHAT_TEMPLATE_COUNT || !system || !*system)
        return 0;
    const chat_format *f = &formats[t];
    return append(out, f->system_prefix) || append(out, system) || append(out, f->system_suffix)
               ? -1 : 0;
}

int rb_chat_render_user(rb_chat_template t, const char *user, int is_first_turn, int has_system,
                        rb_chat_text *out)
{
    if ((unsigned)t >= RB_CHAT_TEMPLATE_COUNT)
        return 0;
    const chat_format *f = &formats[t];
    int continues_system = f->system_opens_first_user && is_first_turn && has_system;
    if (!continues_system && append(out, f->user_prefix))
        return -1;
    return append(out, user ? user : "") || append(out, f->user_suffix) ? -1 : 0;
}

int rb_chat_render_reply_end(rb_chat_template t, rb_chat_text *out)
{
    if ((unsigned)t >= RB_CHAT_TEMPLATE_COUNT)
        return 0;
    return append(out, formats[t].reply_end);
}
