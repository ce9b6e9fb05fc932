/*
 * chat_template.c - the built-in chat formats (contracts in rebound.h and
 * chat_template.h): a table of the text around each role per family, the
 * rules that pick a family for a model, and the renderers of a whole
 * conversation or of one piece of it at a time.
 *
 * Does: recognise a family from the GGUF's Jinja text by its markers (never
 * evaluates it), or from the vocabulary, architecture and name when the
 * text says nothing; render text. Does not: tokenize what it renders, add
 * BOS, or know anything of sessions (the CLI's chat does that); print.
 *
 * Each family's layout, for system S, user U, reply A (what the model
 * writes between the assistant header and the reply end):
 *   chatml   <|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n
 *            <|im_start|>assistant\nA<|im_end|>\n
 *   llama3   <|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>
 *            <|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>
 *            <|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>
 *   llama2   [INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST]A</s><s>[INST] U2 [/INST]
 *   zephyr   <|system|>\nS</s>\n<|user|>\nU</s>\n<|assistant|>\nA</s>\n
 *   plain    S\n\nUser: U\nAssistant:A\n
 *   gemma    <start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n
 *   phi3     <|system|>\nS<|end|>\n<|user|>\nU<|end|>\n<|assistant|>\nA<|end|>\n
 *   mistral  [INST] S\n\nU[/INST] A</s>[INST] U2[/INST]
 *   deepseek-r1  S\n\n<｜User｜>U<｜Assistant｜>A<｜end▁of▁sentence｜>
 * These are llama.cpp's built-in renderings (its llama2-sys-bos, gemma,
 * phi3, mistral-v3 and deepseek3), except zephyr, which follows
 * TinyLlama's own template (turns end with its EOS </s>; llama.cpp's
 * "zephyr" ends them with <|endoftext|>). llama2 closes a reply with
 * "</s><s>": every later [INST] starts a new sequence there, and putting
 * its BOS at the end of the reply keeps each user turn's text the same
 * (and a turn's first token the same for the context shift, which cuts at
 * turn starts). gemma has no system role: the system text opens the first
 * user turn, as llama2's and mistral's do.
 *
 * Memory: a render grows one text buffer by doubling (realloc), copies it
 * out and frees it.
 */
#include "chat_template.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The text around each role: renderers never branch on the family. */
typedef struct chat_format {
    const char *name;
    const char *system_prefix, *system_suffix;
    const char *user_prefix;     /* before a user message */
    const char *user_end;        /* after it */
    const char *assistant_header;/* opens the assistant's reply */
    const char *assistant_prefix;/* before a rendered reply's text (mistral's space,
                                    which the model writes itself when it replies) */
    const char *reply_end;       /* closes the assistant's reply */
    int system_opens_first_user; /* the system block is the start of the first
                                    user turn, whose prefix is then skipped */
    int trim;                    /* 1: every content trimmed; 2: replies only */
    const char *marker;          /* a special token every turn uses */
} chat_format;

static const chat_format formats[RB_CHAT_TEMPLATE_COUNT] = {
    [RB_CHAT_TEMPLATE_CHATML] = {
        "chatml", "<|im_start|>system\n", "<|im_end|>\n", "<|im_start|>user\n", "<|im_end|>\n",
        "<|im_start|>assistant\n", "", "<|im_end|>\n", 0, 0, "<|im_start|>"},
    [RB_CHAT_TEMPLATE_LLAMA3] = {
        "llama3", "<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>",
        "<|start_header_id|>assistant<|end_header_id|>\n\n", "", "<|eot_id|>", 0, 1,
        "<|eot_id|>"},
    [RB_CHAT_TEMPLATE_LLAMA2] = {
        "llama2", "[INST] <<SYS>>\n", "\n<</SYS>>\n\n", "[INST] ", " [/INST]", "", "",
        "</s><s>", 1, 0, "</s>"},
    [RB_CHAT_TEMPLATE_ZEPHYR] = {
        "zephyr", "<|system|>\n", "</s>\n", "<|user|>\n", "</s>\n", "<|assistant|>\n", "",
        "</s>\n", 0, 0, "</s>"},
    [RB_CHAT_TEMPLATE_PLAIN] = {
        "plain", "", "\n\n", "User: ", "\n", "Assistant:", "", "\n", 0, 0, NULL},
    [RB_CHAT_TEMPLATE_GEMMA] = {
        "gemma", "<start_of_turn>user\n", "\n\n", "<start_of_turn>user\n", "<end_of_turn>\n",
        "<start_of_turn>model\n", "", "<end_of_turn>\n", 1, 1, "<start_of_turn>"},
    [RB_CHAT_TEMPLATE_PHI3] = {
        "phi3", "<|system|>\n", "<|end|>\n", "<|user|>\n", "<|end|>\n", "<|assistant|>\n", "",
        "<|end|>\n", 0, 0, "<|end|>"},
    [RB_CHAT_TEMPLATE_MISTRAL] = {
        "mistral", "[INST] ", "\n\n", "[INST] ", "[/INST]", "", " ", "</s>", 1, 2, "</s>"},
    [RB_CHAT_TEMPLATE_DEEPSEEK_R1] = {
        "deepseek-r1", "", "\n\n", "<\xef\xbd\x9cUser\xef\xbd\x9c>", "",
        "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", "",
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", 0, 0,
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"},
};

const char *const rb_chat_vocab_probe[RB_CHAT_VOCAB_COUNT] = {
    [RB_CHAT_VOCAB_IM_START] = "<|im_start|>",
    [RB_CHAT_VOCAB_EOT_ID] = "<|eot_id|>",
    [RB_CHAT_VOCAB_START_HEADER] = "<|start_header_id|>",
    [RB_CHAT_VOCAB_START_OF_TURN] = "<start_of_turn>",
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
    return "chatml, llama3, llama2, zephyr, plain, gemma, phi3, mistral, deepseek-r1";
}

/* ---- choosing ------------------------------------------------------------ */

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

/* The family the Jinja text names by its markers, or -1. */
static int detect_text(const char *j, size_t jn, const char **why)
{
#define HAS(s) has_bytes(j, jn, s)
    if (HAS("<|im_start|>"))
        return *why = "tokenizer.chat_template has <|im_start|>", RB_CHAT_TEMPLATE_CHATML;
    if (HAS("[INST]")) {
        if (HAS("<<SYS>>"))
            return *why = "tokenizer.chat_template has [INST] and <<SYS>>", RB_CHAT_TEMPLATE_LLAMA2;
        return *why = "tokenizer.chat_template has [INST] without <<SYS>>", RB_CHAT_TEMPLATE_MISTRAL;
    }
    if (HAS("<|assistant|>") && HAS("<|end|>"))
        return *why = "tokenizer.chat_template has <|assistant|>, <|end|>", RB_CHAT_TEMPLATE_PHI3;
    if (HAS("<|user|>") && HAS("<|assistant|>"))
        return *why = "tokenizer.chat_template has <|user|>, <|assistant|>", RB_CHAT_TEMPLATE_ZEPHYR;
    if (HAS("<start_of_turn>"))
        return *why = "tokenizer.chat_template has <start_of_turn>", RB_CHAT_TEMPLATE_GEMMA;
    if (HAS("<|start_header_id|>"))
        return *why = "tokenizer.chat_template has <|start_header_id|>", RB_CHAT_TEMPLATE_LLAMA3;
    if (HAS("<\xef\xbd\x9cUser\xef\xbd\x9c>") && HAS("<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"))
        return *why = "tokenizer.chat_template has <\xef\xbd\x9cUser\xef\xbd\x9c>, "
                      "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>", RB_CHAT_TEMPLATE_DEEPSEEK_R1;
#undef HAS
    return -1;
}

rb_chat_template rb_chat_template_detect(const rb_chat_template_hints *h, const char **why,
                                         int *is_fallback)
{
    static const rb_chat_template_hints none;
    const char *reason = NULL;
    int t = -1;
    if (!h)
        h = &none;
    const char *arch = h->architecture ? h->architecture : "";
    const char *name = h->model_name;
    unsigned v = h->vocab_specials;

    /* 1. the file's own template: its markers are the format's */
    if (h->jinja && h->jinja_len)
        t = detect_text(h->jinja, h->jinja_len, &reason);
    if (t >= 0) {
    /* 2. the vocabulary: a family's marker tokens */
    } else if (v & (1u << RB_CHAT_VOCAB_IM_START)) {
        t = RB_CHAT_TEMPLATE_CHATML, reason = "<|im_start|> is a special token";
    } else if ((v & (1u << RB_CHAT_VOCAB_EOT_ID)) && (v & (1u << RB_CHAT_VOCAB_START_HEADER))) {
        t = RB_CHAT_TEMPLATE_LLAMA3, reason = "<|eot_id|> and <|start_header_id|> are special tokens";
    } else if (v & (1u << RB_CHAT_VOCAB_START_OF_TURN)) {
        t = RB_CHAT_TEMPLATE_GEMMA, reason = "<start_of_turn> is a special token";
    /* 3. the architecture */
    } else if (!strcmp(arch, "qwen2") || !strcmp(arch, "qwen2moe") || !strcmp(arch, "qwen3") ||
               !strcmp(arch, "qwen3moe")) {
        t = RB_CHAT_TEMPLATE_CHATML, reason = "architecture is a Qwen";
    } else if (!strcmp(arch, "gemma") || !strcmp(arch, "gemma2") || !strcmp(arch, "gemma3")) {
        t = RB_CHAT_TEMPLATE_GEMMA, reason = "architecture is a Gemma";
    } else if (!strcmp(arch, "phi3")) {
        t = RB_CHAT_TEMPLATE_PHI3, reason = "architecture is phi3";
    /* 4. the name, for SentencePiece llamas whose markers are plain text */
    } else if (has_word_nocase(name, "tinyllama") || has_word_nocase(name, "zephyr")) {
        t = RB_CHAT_TEMPLATE_ZEPHYR, reason = "model name says TinyLlama/Zephyr";
    } else if ((has_word_nocase(name, "llama-2") || has_word_nocase(name, "llama2")) &&
               has_word_nocase(name, "chat")) {
        t = RB_CHAT_TEMPLATE_LLAMA2, reason = "model name says Llama 2 chat";
    } else if (has_word_nocase(name, "mistral") && has_word_nocase(name, "instruct")) {
        t = RB_CHAT_TEMPLATE_MISTRAL, reason = "model name says Mistral instruct";
    } else if (has_word_nocase(name, "deepseek-r1")) {
        t = RB_CHAT_TEMPLATE_DEEPSEEK_R1, reason = "model name says DeepSeek-R1";
    }
    if (is_fallback)
        *is_fallback = t < 0;
    if (t < 0) {
        t = RB_CHAT_TEMPLATE_PLAIN;
        reason = h->jinja && h->jinja_len
                     ? "tokenizer.chat_template not recognised, and no marker token, "
                       "architecture or name names a family: fallback plain"
                     : "no tokenizer.chat_template, and no marker token, architecture or "
                       "name names a family: fallback plain";
    }
    if (why)
        *why = reason;
    return (rb_chat_template)t;
}

/* The first line of text (n bytes) into out, "..." when cut. */
static void first_line(const char *text, size_t n, char *out, size_t size)
{
    size_t k = 0;
    while (k < n && text[k] != '\n' && text[k] != '\r' && text[k])
        k++;
    if (k + 1 <= size) {
        memcpy(out, text, k);
        out[k] = 0;
        return;
    }
    size_t keep = size - 4;
    while (keep > 0 && ((unsigned char)text[keep] & 0xc0) == 0x80)
        keep--; /* not inside a UTF-8 character */
    memcpy(out, text, keep);
    memcpy(out + keep, "...", 4);
}

rb_status rb_chat_template_choose(rb_model *model, const char *tmpl, rb_chat_template_info *out)
{
    if (!out || (!model && !tmpl))
        return RB_E_INVALID_ARG;
    rb_chat_template_info info;
    memset(&info, 0, sizeof info);
    rb_chat_template_hints h = {0};
    int named = tmpl ? rb_chat_template_from_name(tmpl) : -1;
    if (named >= 0) {
        info.tmpl = (rb_chat_template)named;
        info.reason = "chosen by name";
    } else {
        if (tmpl) {
            h.jinja = tmpl, h.jinja_len = strlen(tmpl);
        } else {
            rb_model_info mi;
            rb_model_get_info(model, &mi);
            h.architecture = mi.architecture;
            h.model_name = mi.name;
            if (rb_model_get_meta_str(model, "tokenizer.chat_template", &h.jinja, &h.jinja_len) !=
                RB_OK)
                h.jinja = NULL, h.jinja_len = 0;
            for (int i = 0; i < RB_CHAT_VOCAB_COUNT; i++) {
                const char *probe = rb_chat_vocab_probe[i];
                int32_t id;
                size_t n = 0;
                if (rb_model_tokenize(model, probe, strlen(probe), 0, 1, &id, 1, &n) == RB_OK &&
                    n == 1)
                    h.vocab_specials |= 1u << i;
            }
        }
        info.tmpl = rb_chat_template_detect(&h, &info.reason, &info.is_fallback);
        info.has_text = h.jinja_len > 0;
        const char *ignored;
        if (info.has_text && detect_text(h.jinja, h.jinja_len, &ignored) < 0)
            first_line(h.jinja, h.jinja_len, info.first_line, sizeof info.first_line);
    }
    info.name = rb_chat_template_name(info.tmpl);
    info.marker = rb_chat_template_marker(info.tmpl);
    info.marker_token = -1;
    if (model && info.marker) {
        int32_t id;
        size_t n = 0;
        if (rb_model_tokenize(model, info.marker, strlen(info.marker), 0, 1, &id, 1, &n) ==
                RB_OK && n == 1)
            info.marker_token = id;
    }
    *out = info;
    return RB_OK;
}

/* ---- rendering ----------------------------------------------------------- */

typedef struct text {
    char *ptr;
    size_t len, cap;
    int failed;
} text;

static void put_n(text *t, const char *s, size_t n)
{
    if (t->failed)
        return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *p = realloc(t->ptr, cap);
        if (!p) {
            t->failed = 1;
            return;
        }
        t->ptr = p, t->cap = cap;
    }
    memcpy(t->ptr + t->len, s, n);
    t->len += n;
    t->ptr[t->len] = 0;
}

static void put(text *t, const char *s) { put_n(t, s, strlen(s)); }

/* content, trimmed of ASCII white space at both ends when trim */
static void put_content(text *t, const char *s, int trim)
{
    size_t n = strlen(s);
    if (trim) {
        while (n && isspace((unsigned char)*s))
            s++, n--;
        while (n && isspace((unsigned char)s[n - 1]))
            n--;
    }
    put_n(t, s, n);
}

/* Copies t out as snprintf would and frees it. */
static rb_status finish(text *t, char *buf, size_t size, size_t *out_len)
{
    rb_status st = t->failed ? RB_E_NOMEM : RB_OK;
    if (st == RB_OK) {
        *out_len = t->len;
        if (buf && size) {
            size_t k = t->len < size - 1 ? t->len : size - 1;
            if (k)
                memcpy(buf, t->ptr, k);
            buf[k] = 0;
        }
    }
    free(t->ptr);
    return st;
}

rb_status rb_chat_render(rb_chat_template tm, const rb_chat_message *msgs, size_t n_msgs,
                         int add_assistant, char *buf, size_t size, size_t *out_len)
{
    if ((unsigned)tm >= RB_CHAT_TEMPLATE_COUNT || !out_len || (n_msgs && !msgs) ||
        (!buf && size))
        return RB_E_INVALID_ARG;
    const chat_format *f = &formats[tm];
    for (size_t i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content ||
            (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") &&
             strcmp(msgs[i].role, "assistant")))
            return RB_E_INVALID_ARG;
    text t = {0};
    put(&t, "");
    int opened = 0; /* the system block opened the user turn that follows */
    for (size_t i = 0; i < n_msgs; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        if (!strcmp(role, "system")) {
            put(&t, f->system_prefix);
            put_content(&t, c, f->trim == 1);
            put(&t, f->system_suffix);
            opened = f->system_opens_first_user;
        } else if (!strcmp(role, "user")) {
            if (!opened)
                put(&t, f->user_prefix);
            put_content(&t, c, f->trim == 1);
            put(&t, f->user_end);
            opened = 0;
        } else {
            put(&t, f->assistant_header);
            put(&t, f->assistant_prefix);
            put_content(&t, c, f->trim != 0);
            put(&t, f->reply_end);
            opened = 0;
        }
    }
    if (add_assistant)
        put(&t, f->assistant_header);
    return finish(&t, buf, size, out_len);
}

rb_status rb_chat_apply_template(rb_model *model, const char *tmpl, const rb_chat_message *msgs,
                                 size_t n_msgs, int add_assistant, char *buf, size_t size,
                                 size_t *out_len)
{
    rb_chat_template_info info;
    rb_status st = rb_chat_template_choose(model, tmpl, &info);
    if (st != RB_OK)
        return st;
    return rb_chat_render(info.tmpl, msgs, n_msgs, add_assistant, buf, size, out_len);
}

rb_status rb_chat_render_piece(rb_chat_template tm, rb_chat_piece piece, const char *s,
                               unsigned flags, char *buf, size_t size, size_t *out_len)
{
    if ((unsigned)tm >= RB_CHAT_TEMPLATE_COUNT || !out_len || (!buf && size) ||
        (unsigned)piece > RB_CHAT_PIECE_REPLY_END)
        return RB_E_INVALID_ARG;
    const chat_format *f = &formats[tm];
    text t = {0};
    put(&t, "");
    if (!s)
        s = "";
    if (piece == RB_CHAT_PIECE_SYSTEM) {
        if (*s) {
            put(&t, f->system_prefix);
            put_content(&t, s, f->trim == 1);
            put(&t, f->system_suffix);
        }
    } else if (piece == RB_CHAT_PIECE_USER) {
        int continues_system = f->system_opens_first_user && (flags & RB_CHAT_FIRST_TURN) &&
                               (flags & RB_CHAT_HAS_SYSTEM);
        if (!continues_system)
            put(&t, f->user_prefix);
        put_content(&t, s, f->trim == 1);
        put(&t, f->user_end);
        put(&t, f->assistant_header);
    } else {
        put(&t, f->reply_end);
    }
    return finish(&t, buf, size, out_len);
}
