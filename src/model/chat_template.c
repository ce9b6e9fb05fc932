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
#include "json.h"

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

/* ---- tools ------------------------------------------------------------------ */

/* How a family writes tools, calls and results (see rebound.h). */
typedef enum tool_style { STYLE_HERMES, STYLE_LLAMA3, STYLE_MISTRAL } tool_style;

static tool_style style_of(rb_chat_template tm)
{
    return tm == RB_CHAT_TEMPLATE_LLAMA3    ? STYLE_LLAMA3
           : tm == RB_CHAT_TEMPLATE_MISTRAL ? STYLE_MISTRAL
                                            : STYLE_HERMES;
}

/* s[0..n) as a JSON string literal (UTF-8 kept, controls escaped). */
static void put_json_string(text *t, const char *s, size_t n)
{
    put(t, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\', e[1] = (char)c, e[2] = 0;
        } else if (c < 0x20) {
            const char *nm = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r"
                             : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (nm)
                snprintf(e, sizeof e, "%s", nm);
            else
                snprintf(e, sizeof e, "\\u%04x", c);
        } else {
            put_n(t, s + i, 1);
            continue;
        }
        put(t, e);
    }
    put(t, "\"");
}

/* v as JSON text, members in their order; spaced: ", " and ": " between
 * items (Python's json.dumps, what the Jinja templates' tojson writes),
 * else "," and ":" (compact). */
static void put_json(text *t, const rb_json *v, int spaced)
{
    switch (v->type) {
    case RB_JSON_NULL: put(t, "null"); break;
    case RB_JSON_BOOL: put(t, v->is_true ? "true" : "false"); break;
    case RB_JSON_NUMBER: put_n(t, v->raw, v->raw_len); break;
    case RB_JSON_STRING: put_json_string(t, v->str, v->str_len); break;
    case RB_JSON_ARRAY:
    case RB_JSON_OBJECT: {
        int obj = v->type == RB_JSON_OBJECT;
        put(t, obj ? "{" : "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                put(t, spaced ? ", " : ",");
            if (obj) {
                put_json_string(t, v->keys[i], v->key_lens[i]);
                put(t, spaced ? ": " : ":");
            }
            put_json(t, v->items[i], spaced);
        }
        put(t, obj ? "}" : "]");
        break;
    }
    }
}

/* The length of the JSON object or array at s[0..n) (strings skipped,
 * brackets counted), or 0 when it does not close. Not a validation: the
 * span is then parsed. */
static size_t json_span(const char *s, size_t n)
{
    if (!n || (*s != '{' && *s != '['))
        return 0;
    size_t depth = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\')
                    i++;
            if (i >= n)
                return 0;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0)
                return i + 1;
        }
    }
    return 0;
}

/* A call's name and arguments from an object {"name", "arguments" | "parameters"}
 * or OpenAI's {"function": {"name", "arguments": OBJECT | STRING of one}}.
 * *args_doc holds a parsed string's arguments (free it). 0 or -1. */
static int call_parts(const rb_json *c, const rb_json **name, const rb_json **args,
                      rb_json_doc *args_doc)
{
    args_doc->root = NULL, args_doc->blocks = NULL;
    if (!c || c->type != RB_JSON_OBJECT)
        return -1;
    const rb_json *fn = rb_json_get(c, "function");
    if (fn && fn->type == RB_JSON_OBJECT)
        c = fn;
    *name = rb_json_get(c, "name");
    *args = rb_json_get(c, "arguments");
    if (!*args)
        *args = rb_json_get(c, "parameters");
    if (!*name || (*name)->type != RB_JSON_STRING || !*args)
        return -1;
    if ((*args)->type == RB_JSON_STRING) {
        rb_error e;
        if (rb_json_parse((*args)->str, (*args)->str_len, args_doc, &e) != RB_OK)
            return -1;
        *args = args_doc->root;
    }
    if ((*args)->type != RB_JSON_OBJECT) {
        rb_json_free(args_doc);
        return -1;
    }
    return 0;
}

/* One call in the family's form. */
static void put_call(text *t, tool_style st, const rb_json *name, const rb_json *args)
{
    if (st == STYLE_HERMES) {
        put(t, "<tool_call>\n{\"name\": ");
        put_json_string(t, name->str, name->str_len);
        put(t, ", \"arguments\": ");
        put_json(t, args, 1);
        put(t, "}\n</tool_call>");
    } else {
        put(t, "{\"name\": ");
        put_json_string(t, name->str, name->str_len);
        put(t, st == STYLE_LLAMA3 ? ", \"parameters\": " : ", \"arguments\": ");
        put_json(t, args, 1);
        put(t, "}");
    }
}

/* The calls of a JSON array (either shape call_parts reads), in the
 * family's form. RB_E_INVALID_ARG when one is not a call. */
static rb_status put_calls(text *t, tool_style st, const rb_json *arr)
{
    if (!arr || arr->type != RB_JSON_ARRAY)
        return RB_E_INVALID_ARG;
    if (st == STYLE_MISTRAL && arr->n)
        put(t, "[TOOL_CALLS][");
    for (size_t k = 0; k < arr->n; k++) {
        const rb_json *name, *args;
        rb_json_doc d;
        if (call_parts(arr->items[k], &name, &args, &d))
            return RB_E_INVALID_ARG;
        if (k)
            put(t, st == STYLE_MISTRAL ? ", " : "\n");
        put_call(t, st, name, args);
        rb_json_free(&d);
    }
    if (st == STYLE_MISTRAL && arr->n)
        put(t, "]");
    return RB_OK;
}

static const char HERMES_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char HERMES_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
static const char LLAMA3_HEAD[] =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format "
    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}."
    "Do not use variables.\n\n";
static const char LLAMA3_SYSTEM[] =
    "Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

/* The tool list as the family announces it. */
static void put_tool_list(text *t, tool_style st, const rb_json *tools)
{
    if (st == STYLE_HERMES) {
        put(t, HERMES_HEAD);
        for (size_t i = 0; i < tools->n; i++) {
            put(t, "\n");
            put_json(t, tools->items[i], 1);
        }
        put(t, HERMES_TAIL);
    } else if (st == STYLE_LLAMA3) {
        put(t, LLAMA3_HEAD);
        for (size_t i = 0; i < tools->n; i++) {
            put_json(t, tools->items[i], 1);
            put(t, "\n\n");
        }
    } else {
        put(t, "[AVAILABLE_TOOLS][");
        for (size_t i = 0; i < tools->n; i++) {
            if (i)
                put(t, ", ");
            put_json(t, tools->items[i], 1);
        }
        put(t, "][/AVAILABLE_TOOLS]");
    }
}

/* content trimmed as the family trims (trim: 1 both ends) into a new text */
static void put_trimmed(text *t, const char *s, int trim) { put_content(t, s, trim); }

/* The whole renderer; tl may be NULL (no tools, no calls). */
static rb_status render(rb_chat_template tm, const rb_chat_message *msgs, size_t n_msgs,
                        const rb_chat_tools *tl, int add_assistant, char *buf, size_t size,
                        size_t *out_len)
{
    if ((unsigned)tm >= RB_CHAT_TEMPLATE_COUNT || !out_len || (n_msgs && !msgs) ||
        (!buf && size))
        return RB_E_INVALID_ARG;
    const chat_format *f = &formats[tm];
    tool_style st = style_of(tm);
    size_t first_user = n_msgs, last_user = n_msgs;
    for (size_t i = 0; i < n_msgs; i++) {
        if (!msgs[i].role || !msgs[i].content ||
            (strcmp(msgs[i].role, "system") && strcmp(msgs[i].role, "user") &&
             strcmp(msgs[i].role, "assistant") && (!tl || strcmp(msgs[i].role, "tool"))))
            return RB_E_INVALID_ARG;
        if (!strcmp(msgs[i].role, "user")) {
            if (first_user == n_msgs)
                first_user = i;
            last_user = i;
        }
    }
    rb_json_doc tools = {0};
    if (tl && tl->tools) {
        rb_error e;
        if (rb_json_parse(tl->tools, strlen(tl->tools), &tools, &e) != RB_OK)
            return RB_E_INVALID_ARG;
        int ok = tools.root->type == RB_JSON_ARRAY;
        for (size_t i = 0; ok && i < tools.root->n; i++)
            ok = tools.root->items[i]->type == RB_JSON_OBJECT;
        if (!ok) {
            rb_json_free(&tools);
            return RB_E_INVALID_ARG;
        }
    }
    const rb_json *tv = tools.root && tools.root->n ? tools.root : NULL;
    text t = {0}, c = {0};
    rb_status rs = RB_OK;
    put(&t, "");
    int opened = 0; /* the system block opened the user turn that follows */
    int sys_done = 0;
    /* a system block of its own for the tools (or llama3's environment) */
    if (tv && (n_msgs == 0 || strcmp(msgs[0].role, "system")) && st != STYLE_MISTRAL) {
        put(&t, f->system_prefix);
        if (st == STYLE_LLAMA3) {
            put(&t, LLAMA3_SYSTEM);
            if (first_user == n_msgs)
                put_tool_list(&t, st, tv);
        } else {
            put_tool_list(&t, st, tv);
        }
        put(&t, f->system_suffix);
        opened = f->system_opens_first_user;
        sys_done = 1;
    }
    for (size_t i = 0; i < n_msgs && rs == RB_OK; i++) {
        const char *role = msgs[i].role, *s = msgs[i].content;
        free(c.ptr);
        c = (text){0};
        put(&c, "");
        if (!strcmp(role, "system")) {
            if (tv && st == STYLE_MISTRAL && f->system_opens_first_user) {
                size_t u = i + 1;
                while (u < n_msgs && strcmp(msgs[u].role, "user"))
                    u++;
                if (u == last_user)
                    put_tool_list(&t, st, tv);
            }
            if (tv && !sys_done && st == STYLE_LLAMA3) {
                put(&c, LLAMA3_SYSTEM);
                if (first_user == n_msgs)
                    put_tool_list(&c, st, tv);
                put_trimmed(&c, s, 1);
            } else if (tv && !sys_done && st == STYLE_HERMES) {
                put_trimmed(&c, s, f->trim == 1);
                if (c.len)
                    put(&c, "\n\n");
                put_tool_list(&c, st, tv);
            } else {
                put_trimmed(&c, s, f->trim == 1);
            }
            sys_done = 1;
            put(&t, f->system_prefix);
            put_n(&t, c.ptr ? c.ptr : "", c.len);
            put(&t, f->system_suffix);
            opened = f->system_opens_first_user;
        } else if (!strcmp(role, "user")) {
            if (tv && st == STYLE_MISTRAL && i == last_user && !opened)
                put_tool_list(&t, st, tv);
            if (tv && st == STYLE_LLAMA3 && i == first_user)
                put_tool_list(&c, st, tv);
            put_trimmed(&c, s, f->trim == 1);
            if (!opened)
                put(&t, f->user_prefix);
            put_n(&t, c.ptr ? c.ptr : "", c.len);
            put(&t, f->user_end);
            opened = 0;
        } else if (!strcmp(role, "assistant")) {
            const char *calls = tl && tl->calls ? tl->calls[i] : NULL;
            rb_json_doc cd = {0};
            if (calls) {
                rb_error e;
                if (rb_json_parse(calls, strlen(calls), &cd, &e) != RB_OK) {
                    rs = RB_E_INVALID_ARG;
                    break;
                }
            }
            if (cd.root && cd.root->type == RB_JSON_ARRAY && cd.root->n) {
                /* llama 3.1 replies with the call alone */
                if (st != STYLE_LLAMA3) {
                    put_trimmed(&c, s, f->trim != 0);
                    if (c.len)
                        put(&c, "\n");
                }
                rs = put_calls(&c, st, cd.root);
            } else if (cd.root && cd.root->type != RB_JSON_ARRAY) {
                rs = RB_E_INVALID_ARG;
            } else {
                put_trimmed(&c, s, f->trim != 0);
            }
            rb_json_free(&cd);
            put(&t, f->assistant_header);
            put(&t, f->assistant_prefix);
            put_n(&t, c.ptr ? c.ptr : "", c.len);
            put(&t, f->reply_end);
            opened = 0;
        } else { /* tool */
            int first = i == 0 || strcmp(msgs[i - 1].role, "tool");
            int last = i + 1 == n_msgs || strcmp(msgs[i + 1].role, "tool");
            if (st == STYLE_LLAMA3) {
                put(&t, "<|start_header_id|>ipython<|end_header_id|>\n\n");
                put(&t, s);
                put(&t, "<|eot_id|>");
            } else if (st == STYLE_MISTRAL) {
                rb_json_doc d;
                rb_error e;
                put(&t, "[TOOL_RESULTS]{\"content\": ");
                if (rb_json_parse(s, strlen(s), &d, &e) == RB_OK) {
                    put(&t, s);
                    rb_json_free(&d);
                } else {
                    put_json_string(&t, s, strlen(s));
                }
                put(&t, "}[/TOOL_RESULTS]");
            } else {
                if (first && !opened)
                    put(&t, f->user_prefix);
                put(&t, first ? "<tool_response>\n" : "\n<tool_response>\n");
                put(&t, s);
                put(&t, "\n</tool_response>");
                if (last)
                    put(&t, f->user_end);
            }
            opened = 0;
        }
    }
    free(c.ptr);
    rb_json_free(&tools);
    if (c.failed)
        t.failed = 1;
    if (rs != RB_OK) {
        free(t.ptr);
        return rs;
    }
    if (add_assistant)
        put(&t, f->assistant_header);
    return finish(&t, buf, size, out_len);
}

rb_status rb_chat_render(rb_chat_template tm, const rb_chat_message *msgs, size_t n_msgs,
                         int add_assistant, char *buf, size_t size, size_t *out_len)
{
    return render(tm, msgs, n_msgs, NULL, add_assistant, buf, size, out_len);
}

rb_status rb_chat_render_tools(rb_chat_template tm, const rb_chat_message *msgs, size_t n_msgs,
                               const rb_chat_tools *tools, int add_assistant, char *buf,
                               size_t size, size_t *out_len)
{
    rb_chat_tools none = {0};
    return render(tm, msgs, n_msgs, tools ? tools : &none, add_assistant, buf, size, out_len);
}

rb_status rb_chat_format_tool_calls(rb_chat_template tm, const char *calls, char *buf,
                                    size_t size, size_t *out_len)
{
    if ((unsigned)tm >= RB_CHAT_TEMPLATE_COUNT || !calls || !out_len || (!buf && size))
        return RB_E_INVALID_ARG;
    rb_json_doc d;
    rb_error e;
    if (rb_json_parse(calls, strlen(calls), &d, &e) != RB_OK)
        return RB_E_INVALID_ARG;
    text t = {0};
    put(&t, "");
    rb_status st = put_calls(&t, style_of(tm), d.root);
    rb_json_free(&d);
    if (st != RB_OK) {
        free(t.ptr);
        return st;
    }
    return finish(&t, buf, size, out_len);
}

/* ---- reading calls back ------------------------------------------------------- */

static int add_parsed(rb_chat_tool_calls *out, const rb_json *c, int allow_parameters)
{
    if (!c || c->type != RB_JSON_OBJECT)
        return -1;
    const rb_json *name = rb_json_get(c, "name"), *args = rb_json_get(c, "arguments");
    if (!args && allow_parameters)
        args = rb_json_get(c, "parameters");
    if (!name || name->type != RB_JSON_STRING || !args || args->type != RB_JSON_OBJECT)
        return -1;
    rb_chat_tool_call *p = realloc(out->calls, (out->n + 1) * sizeof *p);
    if (!p)
        return -2;
    out->calls = p;
    text a = {0};
    put(&a, "");
    put_json(&a, args, 0);
    char *nm = malloc(name->str_len + 1);
    if (a.failed || !nm) {
        free(a.ptr);
        free(nm);
        return -2;
    }
    memcpy(nm, name->str, name->str_len + 1);
    p[out->n].name = nm;
    p[out->n].arguments = a.ptr;
    out->n++;
    return 0;
}

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* The untagged forms: "[TOOL_CALLS]" then an array of {"name", "arguments"}
 * (mistral), or (after an optional "<|python_tag|>") one or more objects
 * {"name", "parameters" | "arguments"} separated by white space or ';', or
 * an array of them, and nothing else (llama 3.1). Returns the bytes the
 * calls take from the start (the rest is content), 0 when these are not
 * calls, -2 out of memory. */
static long untagged(const char *t, size_t n, rb_chat_tool_calls *out)
{
    size_t i = 0;
    while (i < n && is_ws(t[i]))
        i++;
    static const char mistral[] = "[TOOL_CALLS]", python[] = "<|python_tag|>";
    int is_mistral = n - i >= sizeof mistral - 1 && !memcmp(t + i, mistral, sizeof mistral - 1);
    if (is_mistral)
        i += sizeof mistral - 1;
    else if (n - i >= sizeof python - 1 && !memcmp(t + i, python, sizeof python - 1))
        i += sizeof python - 1;
    for (int k = 0;; k++) {
        while (i < n && (is_ws(t[i]) || (k && !is_mistral && t[i] == ';')))
            i++;
        if (i == n || (is_mistral && k))
            break;
        size_t sp = json_span(t + i, n - i);
        if (!sp)
            break;
        rb_json_doc d;
        rb_error e;
        if (rb_json_parse(t + i, sp, &d, &e) != RB_OK)
            break;
        int bad = 0;
        if (d.root->type == RB_JSON_ARRAY) {
            for (size_t j = 0; j < d.root->n && !bad; j++)
                bad = add_parsed(out, d.root->items[j], !is_mistral);
            if (!d.root->n)
                bad = -1;
        } else {
            bad = is_mistral ? -1 : add_parsed(out, d.root, 1);
        }
        rb_json_free(&d);
        if (bad)
            return bad == -2 ? -2 : 0;
        i += sp;
    }
    if (!out->n)
        return 0;
    if (!is_mistral)
        for (size_t j = i; j < n; j++)
            if (!is_ws(t[j]))
                return 0; /* llama's form is the whole reply */
    return (long)i;
}

void rb_chat_tool_calls_free(rb_chat_tool_calls *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n; i++) {
        free(c->calls[i].name);
        free(c->calls[i].arguments);
    }
    free(c->calls);
    free(c->content);
    c->calls = NULL, c->content = NULL, c->n = 0;
}

rb_status rb_chat_parse_tool_calls(rb_chat_template tm, const char *s, size_t n,
                                   rb_chat_tool_calls *out)
{
    if (!out)
        return RB_E_INVALID_ARG;
    memset(out, 0, sizeof *out);
    if ((unsigned)tm >= RB_CHAT_TEMPLATE_COUNT || (!s && n))
        return RB_E_INVALID_ARG;
    text rest = {0};
    put(&rest, "");
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    size_t i = 0;
    int oom = 0;
    while (i < n) {
        const char *a = NULL; /* the next open tag */
        for (size_t j = i; j + sizeof open - 1 <= n; j++)
            if (!memcmp(s + j, open, sizeof open - 1)) {
                a = s + j;
                break;
            }
        const char *b = NULL;
        if (a) {
            /* the close tag after the body's JSON (a string in it may hold
               "</tool_call>"), else the first one */
            const char *body = a + sizeof open - 1, *end = s + n;
            while (body < end && is_ws(*body))
                body++;
            size_t sp = json_span(body, (size_t)(end - body));
            const char *q = body + sp;
            while (sp && q < end && is_ws(*q))
                q++;
            if (sp && (size_t)(end - q) >= sizeof close - 1 && !memcmp(q, close, sizeof close - 1))
                b = q;
            for (q = a + sizeof open - 1; !b && q + sizeof close - 1 <= end; q++)
                if (!memcmp(q, close, sizeof close - 1))
                    b = q;
        }
        if (!a || !b) {
            put_n(&rest, s + i, n - i);
            break;
        }
        const char *body = a + sizeof open - 1;
        while (body < b && is_ws(*body))
            body++;
        size_t bl = (size_t)(b - body);
        while (bl && is_ws(body[bl - 1]))
            bl--;
        rb_json_doc d;
        rb_error e;
        int r = -1;
        if (rb_json_parse(body, bl, &d, &e) == RB_OK) {
            r = add_parsed(out, d.root, 0);
            rb_json_free(&d);
        }
        if (r == -2) {
            oom = 1;
            break;
        }
        size_t end = (size_t)(b + sizeof close - 1 - s);
        if (r == 0)
            put_n(&rest, s + i, (size_t)(a - (s + i)));
        else
            put_n(&rest, s + i, end - i);
        i = end;
    }
    if (!oom && out->n == 0) {
        long u = untagged(s, n, out);
        if (u == 0)
            rb_chat_tool_calls_free(out); /* a partial list is no list */
        if (u < 0) {
            oom = 1;
        } else if (u > 0) {
            free(rest.ptr);
            rest = (text){0};
            put(&rest, "");
            put_n(&rest, s + u, n - (size_t)u);
        }
    }
    if (oom || rest.failed) {
        free(rest.ptr);
        rb_chat_tool_calls_free(out);
        return RB_E_NOMEM;
    }
    /* the content: trimmed, NULL when nothing is left */
    size_t lo = 0, hi = rest.len;
    while (lo < hi && is_ws(rest.ptr[lo]))
        lo++;
    while (hi > lo && is_ws(rest.ptr[hi - 1]))
        hi--;
    if (hi > lo) {
        memmove(rest.ptr, rest.ptr + lo, hi - lo);
        rest.ptr[hi - lo] = 0;
        out->content = rest.ptr;
    } else {
        free(rest.ptr);
    }
    return RB_OK;
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
