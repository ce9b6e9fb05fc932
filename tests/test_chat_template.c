/*
 * test_chat_template.c - the built-in chat templates of `rebound chat`
 * (app/chat_template.c): for each family, a system prompt and two turns
 * rendered piece by piece, as the chat feeds them, must join into exactly
 * the text the family's own template produces (with the generation prompt
 * at the end); the rules that pick a family from a model's Jinja text,
 * vocabulary, architecture and name; names; edge cases (no system, empty
 * message, out-of-range template).
 */
#include <stdlib.h>

#include "chat_template.h"
#include "check.h"

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

int main(void)
{
    test_transcripts();
    test_render_edges();
    test_names();
    test_detect();
    return check_report();
}
