/*
 * test_chat_template.c - the built-in chat templates of `rebound chat`
 * (app/chat_template.c): for each family, a system prompt and two turns
 * rendered piece by piece, as the chat feeds them, must join into exactly
 * the text the family's own template produces (with the generation prompt
 * at the end); the rules that pick a family from a model's Jinja text,
 * vocabulary, architecture and name; names; edge cases (no system, empty
 * message, out-of-range template); and rb_model_meta_str, the public
 * getter the chat reads tokenizer.chat_template with, on a synthetic model
 * given a template (llama3's, so detection by text beats the SPM vocab).
 */
#include <stdint.h>
#include <stdlib.h>

#include "chat_template.h"
#include "check.h"
#include "quant_rules.h"
#include "rebound.h"
#include "synth.h"

/* The conversation every template renders: system, a user turn, a reply,
 * a second user turn (the assistant's header is left open for the model). */
#define SYSTEM "You are terse."
#define USER1 "Hi"
#define REPLY1 "Hello!"
#define USER2 "Bye"

/* Renders the conversation the way cmd_chat.c feeds it. */
static char *transcript(rb_chat_template t, const char *system)
{
    int has_system = system && *system;
    rb_chat_text first = {0}, end = {0}, second = {0};
    CHECK_EQ_INT(rb_chat_render_system(t, system, &first), 0);
    CHECK_EQ_INT(rb_chat_render_user(t, USER1, 1, has_system, &first), 0);
    CHECK_EQ_INT(rb_chat_render_reply_end(t, &end), 0);
    CHECK_EQ_INT(rb_chat_render_user(t, USER2, 0, has_system, &second), 0);
    /* the reply sits between the assistant's header and the reply end */
    size_t n = first.len + strlen(REPLY1) + end.len + second.len + 1;
    char *all = malloc(n);
    if (all)
        snprintf(all, n, "%s%s%s%s", first.ptr, REPLY1, end.ptr, second.ptr);
    rb_chat_text_free(&first);
    rb_chat_text_free(&end);
    rb_chat_text_free(&second);
    return all;
}

static void check_transcript(rb_chat_template t, const char *system, const char *want)
{
    char *got = transcript(t, system);
    CHECK_STR_EQ(got, want);
    free(got);
}

static void test_transcripts(void)
{
    /* Qwen2/Qwen3/SmolLM2's template with add_generation_prompt */
    check_transcript(RB_CHAT_TEMPLATE_CHATML, SYSTEM,
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    /* Llama 3's (BOS <|begin_of_text|> is a token the chat adds) */
    check_transcript(RB_CHAT_TEMPLATE_LLAMA3, SYSTEM,
        "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    /* Llama 2 chat: the system prompt inside the first [INST]; each later
       turn a new sequence (the first BOS is a token the chat adds) */
    check_transcript(RB_CHAT_TEMPLATE_LLAMA2, SYSTEM,
        "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST]Hello!</s><s>[INST] Bye [/INST]");
    check_transcript(RB_CHAT_TEMPLATE_LLAMA2, NULL,
        "[INST] Hi [/INST]Hello!</s><s>[INST] Bye [/INST]");
    /* Zephyr / TinyLlama chat */
    check_transcript(RB_CHAT_TEMPLATE_ZEPHYR, SYSTEM,
        "<|system|>\nYou are terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n"
        "<|user|>\nBye</s>\n<|assistant|>\n");
    check_transcript(RB_CHAT_TEMPLATE_PLAIN, SYSTEM,
        "You are terse.\n\nUser: Hi\nAssistant:Hello!\nUser: Bye\nAssistant:");
    /* no system prompt: no system block at all */
    check_transcript(RB_CHAT_TEMPLATE_CHATML, "",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    check_transcript(RB_CHAT_TEMPLATE_PLAIN, NULL, "User: Hi\nAssistant:Hello!\nUser: Bye\nAssistant:");
}

static void test_render_edges(void)
{
    rb_chat_text t = {0};
    /* an empty system renders nothing, and leaves the buffer unallocated */
    CHECK_EQ_INT(rb_chat_render_system(RB_CHAT_TEMPLATE_CHATML, "", &t), 0);
    CHECK_EQ_INT(t.len, 0);
    /* an empty message is still a turn */
    CHECK_EQ_INT(rb_chat_render_user(RB_CHAT_TEMPLATE_CHATML, "", 1, 0, &t), 0);
    CHECK_STR_EQ(t.ptr, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    /* clear keeps the memory and empties the text */
    rb_chat_text_clear(&t);
    CHECK_EQ_INT(t.len, 0);
    CHECK_STR_EQ(t.ptr, "");
    /* a long message grows the buffer past its first size */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    CHECK_EQ_INT(rb_chat_render_user(RB_CHAT_TEMPLATE_PLAIN, big, 1, 0, &t), 0);
    CHECK_EQ_INT(t.len, strlen("User: ") + sizeof big - 1 + strlen("\nAssistant:"));
    CHECK_EQ_INT(strlen(t.ptr), t.len);
    /* out-of-range templates render nothing */
    rb_chat_text_clear(&t);
    CHECK_EQ_INT(rb_chat_render_user(RB_CHAT_TEMPLATE_COUNT, "x", 1, 0, &t), 0);
    CHECK_EQ_INT(rb_chat_render_reply_end((rb_chat_template)-1, &t), 0);
    CHECK_EQ_INT(t.len, 0);
    rb_chat_text_free(&t);
    CHECK(t.ptr == NULL);
}

static void test_names(void)
{
    const char *names[] = {"chatml", "llama3", "llama2", "zephyr", "plain"};
    for (int i = 0; i < RB_CHAT_TEMPLATE_COUNT; i++) {
        CHECK_STR_EQ(rb_chat_template_name((rb_chat_template)i), names[i]);
        CHECK_EQ_INT(rb_chat_template_from_name(names[i]), i);
        CHECK_CONTAINS(rb_chat_template_names(), names[i]);
    }
    CHECK_EQ_INT(rb_chat_template_from_name("ChatML"), -1);
    CHECK_EQ_INT(rb_chat_template_from_name(""), -1);
    CHECK_EQ_INT(rb_chat_template_from_name(NULL), -1);
    CHECK_STR_EQ(rb_chat_template_name(RB_CHAT_TEMPLATE_COUNT), "?");
    CHECK_STR_EQ(rb_chat_template_marker(RB_CHAT_TEMPLATE_CHATML), "<|im_start|>");
    CHECK_STR_EQ(rb_chat_template_marker(RB_CHAT_TEMPLATE_LLAMA3), "<|eot_id|>");
    CHECK(rb_chat_template_marker(RB_CHAT_TEMPLATE_PLAIN) == NULL);
    /* only llama2's first turn continues the system block */
    CHECK_STR_EQ(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_LLAMA2), "[INST] ");
    CHECK(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_CHATML) == NULL);
    CHECK(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_PLAIN) == NULL);
    CHECK(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_COUNT) == NULL);
    CHECK_STR_EQ(rb_chat_vocab_probe[RB_CHAT_VOCAB_IM_START], "<|im_start|>");
}

static rb_chat_template detect_jinja(const char *jinja)
{
    rb_chat_template_hints h = {0};
    h.jinja = jinja;
    h.jinja_len = strlen(jinja);
    h.architecture = "llama";
    return rb_chat_template_detect(&h, NULL);
}

static void test_detect(void)
{
    /* 1. the Jinja text, abridged from the families' own templates */
    CHECK_EQ_INT(detect_jinja("{% for message in messages %}{{'<|im_start|>' + message['role'] "
                              "+ '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"),
                 RB_CHAT_TEMPLATE_CHATML);
    CHECK_EQ_INT(detect_jinja("{% set content = '<|start_header_id|>' + message['role'] + "
                              "'<|end_header_id|>\\n\\n' + message['content'] | trim + "
                              "'<|eot_id|>' %}"), RB_CHAT_TEMPLATE_LLAMA3);
    CHECK_EQ_INT(detect_jinja("{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"),
                 RB_CHAT_TEMPLATE_LLAMA2);
    CHECK_EQ_INT(detect_jinja("{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
                              "message['content'] + eos_token }}{% endif %}{{ '<|assistant|>' }}"),
                 RB_CHAT_TEMPLATE_ZEPHYR);
    /* Phi-3 shares zephyr's role tags but ends turns with <|end|>: not zephyr */
    CHECK_EQ_INT(detect_jinja("{{'<|user|>' + '\\n' + message['content'] + '<|end|>'}}"
                              "{{ '<|assistant|>\\n' }}"), RB_CHAT_TEMPLATE_PLAIN);
    CHECK_EQ_INT(detect_jinja("{{ messages }}"), RB_CHAT_TEMPLATE_PLAIN);
    /* the text beats the architecture and the vocabulary */
    {
        rb_chat_template_hints h = {0};
        const char *j = "<|start_header_id|>";
        h.jinja = j, h.jinja_len = strlen(j), h.architecture = "qwen3";
        h.vocab_specials = 1u << RB_CHAT_VOCAB_IM_START;
        CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_LLAMA3);
    }
    /* jinja_len bounds the search: a marker beyond it is not seen */
    {
        rb_chat_template_hints h = {0};
        h.jinja = "abc<|im_start|>", h.jinja_len = 3;
        CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_PLAIN);
    }
    const char *why = NULL;
    rb_chat_template_hints h = {0};
    /* 2. the vocabulary */
    h.architecture = "llama";
    h.vocab_specials = 1u << RB_CHAT_VOCAB_IM_START; /* SmolLM2: a llama with chatml */
    CHECK_EQ_INT(rb_chat_template_detect(&h, &why), RB_CHAT_TEMPLATE_CHATML);
    CHECK_CONTAINS(why, "<|im_start|>");
    h.vocab_specials = (1u << RB_CHAT_VOCAB_EOT_ID) | (1u << RB_CHAT_VOCAB_START_HEADER);
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_LLAMA3);
    h.vocab_specials = 1u << RB_CHAT_VOCAB_EOT_ID; /* <|eot_id|> alone is not Llama 3 */
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_PLAIN);
    /* 3. the architecture */
    h.vocab_specials = 0;
    const char *qwens[] = {"qwen2", "qwen2moe", "qwen3", "qwen3moe"};
    for (size_t i = 0; i < sizeof qwens / sizeof qwens[0]; i++) {
        h.architecture = qwens[i];
        CHECK_EQ_INT(rb_chat_template_detect(&h, &why), RB_CHAT_TEMPLATE_CHATML);
    }
    CHECK_CONTAINS(why, "Qwen");
    /* 4. the name */
    h.architecture = "llama";
    h.model_name = "TinyLlama-1.1B-Chat-v1.0";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_ZEPHYR);
    h.model_name = "LLaMA v2 7B";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_PLAIN);
    h.model_name = "Llama-2-7b-chat-hf";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_LLAMA2);
    h.model_name = "Llama-2-7b-hf"; /* the base model has no chat format */
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL), RB_CHAT_TEMPLATE_PLAIN);
    /* 5. nothing known */
    h.model_name = "";
    CHECK_EQ_INT(rb_chat_template_detect(&h, &why), RB_CHAT_TEMPLATE_PLAIN);
    CHECK(why != NULL && *why);
    CHECK_EQ_INT(rb_chat_template_detect(NULL, NULL), RB_CHAT_TEMPLATE_PLAIN);
}

/* Jinja text of llama3's kind, padded to a length that keeps the patched
 * file's tensor data aligned (see add_chat_template). */
#define LLAMA3_JINJA "{% for message in messages %}{{ '<|start_header_id|>' + " \
    "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + " \
    "'<|eot_id|>' }}{% endfor %}"

/*
 * Inserts a string kv "tokenizer.chat_template" = jinja as the first kv of
 * the GGUF at path. The kv takes 8 + 23 + 4 + 8 + len bytes; with len
 * chosen so that this is a multiple of 256, every later byte moves by a
 * multiple of any alignment up to 256, so the data stays aligned and the
 * tensor offsets (relative to the data) stay right. Returns 0 on success.
 */
static int add_chat_template(const char *path, const char *jinja)
{
    static const char key[] = "tokenizer.chat_template";
    uint64_t key_len = sizeof key - 1, val_len = strlen(jinja);
    uint64_t kv_bytes = 8 + key_len + 4 + 8 + val_len;
    uint64_t padded = (kv_bytes + 255) / 256 * 256;
    val_len += padded - kv_bytes; /* padded with spaces, which Jinja ignores */
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *old = malloc((size_t)size);
    size_t got = old ? fread(old, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!old || got != (size_t)size || size < 24) {
        free(old);
        return -1;
    }
    uint64_t n_kv;
    memcpy(&n_kv, old + 16, 8); /* magic, version u32, n_tensors u64, n_kv u64 */
    n_kv++;
    memcpy(old + 16, &n_kv, 8);
    f = fopen(path, "wb");
    int bad = !f;
    uint32_t type_string = 8;
    if (f) {
        bad |= fwrite(old, 1, 24, f) != 24;
        bad |= fwrite(&key_len, 8, 1, f) != 1 || fwrite(key, 1, key_len, f) != key_len;
        bad |= fwrite(&type_string, 4, 1, f) != 1 || fwrite(&val_len, 8, 1, f) != 1;
        bad |= fwrite(jinja, 1, strlen(jinja), f) != strlen(jinja);
        for (uint64_t i = strlen(jinja); i < val_len; i++)
            bad |= fputc(' ', f) == EOF;
        bad |= fwrite(old + 24, 1, (size_t)size - 24, f) != (size_t)size - 24;
        bad |= fclose(f) != 0;
    }
    free(old);
    return bad ? -1 : 0;
}

static void test_model_meta(void)
{
    const char *path = REBOUND_TEST_TMP "/test_chat_template.gguf";
    rb_synth_params sp = {*rb_synth_shape_find("tiny"), rb_file_kind_find("f32"), 1, 1};
    rb_error err;
    CHECK_EQ_INT(rb_synth_write(path, &sp, NULL, &err), RB_OK);
    rb_model *m = NULL;
    const char *text = NULL;
    size_t len = 0;
    /* the synthetic file has no template */
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    if (!m)
        return;
    CHECK_EQ_INT(rb_model_meta_str(m, "tokenizer.chat_template", &text, &len), RB_E_NOT_FOUND);
    CHECK(text == NULL && len == 0); /* unchanged on failure */
    CHECK_EQ_INT(rb_model_meta_str(m, "general.architecture", &text, &len), RB_OK);
    CHECK(len == 5 && text && memcmp(text, "llama", 5) == 0);
    CHECK_EQ_INT(rb_model_meta_str(m, "llama.context_length", &text, &len), RB_E_FORMAT);
    CHECK_EQ_INT(rb_model_meta_str(m, NULL, &text, &len), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_model_meta_str(NULL, "general.name", &text, &len), RB_E_INVALID_ARG);
    rb_model_close(m);
    m = NULL;

    CHECK_EQ_INT(add_chat_template(path, LLAMA3_JINJA), 0);
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    if (!m) {
        fprintf(stderr, "open after patch: %s\n", err.message);
        return;
    }
    CHECK_EQ_INT(rb_model_meta_str(m, "tokenizer.chat_template", &text, &len), RB_OK);
    CHECK(len >= strlen(LLAMA3_JINJA) && memcmp(text, LLAMA3_JINJA, strlen(LLAMA3_JINJA)) == 0);
    rb_model_info mi;
    CHECK_EQ_INT(rb_model_get_info(m, &mi), RB_OK);
    rb_chat_template_hints h = {text, len, mi.architecture, mi.name, 0};
    const char *why = NULL;
    CHECK_EQ_INT(rb_chat_template_detect(&h, &why), RB_CHAT_TEMPLATE_LLAMA3);
    CHECK_CONTAINS(why, "tokenizer.chat_template");
    /* the patched file still runs: its tensors were found where they were */
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m, NULL, &s, &err), RB_OK);
    int32_t tok = 1;
    if (s)
        CHECK_EQ_INT(rb_session_feed(s, &tok, 1, NULL), RB_OK);
    rb_session_destroy(s);
    rb_model_close(m);
    remove(path);
}

int main(void)
{
    test_transcripts();
    test_render_edges();
    test_names();
    test_detect();
    test_model_meta();
    return check_report();
}
