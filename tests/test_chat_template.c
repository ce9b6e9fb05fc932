/*
 * test_chat_template.c - the library's built-in chat templates
 * (src/chat_template.c, public in rebound.h): for each family, a system
 * prompt and two turns rendered piece by piece, as the chat feeds them,
 * must join into exactly the text the family's own template produces and
 * into rb_chat_render's whole-conversation text; llama.cpp's renderings of
 * its six-message test conversation for every family; the rules that pick
 * a family from a model's Jinja text, vocabulary, architecture and name,
 * and the fallback's report (the text's first line); names; buffers and
 * bad input; and rb_model_get_meta_str / rb_chat_template_choose /
 * rb_chat_apply_template on synthetic models (one given llama3's template,
 * a gemma3 one without any).
 */
#include <stdint.h>
#include <stdlib.h>

#include "chat_template.h"
#include "check.h"
#include "quant_rules.h"
#include "rebound.h"
#include "synth.h"
#include "testlib.h"

/* The conversation every template renders: system, a user turn, a reply,
 * a second user turn (the assistant's header is left open for the model). */
#define SYSTEM "You are terse."
#define USER1 "Hi"
#define REPLY1 "Hello!"
#define USER2 "Bye"

static char *piece(rb_chat_template t, rb_chat_piece p, const char *text, unsigned flags)
{
    size_t n = 0;
    CHECK_EQ_INT(rb_chat_render_piece(t, p, text, flags, NULL, 0, &n), RB_OK);
    char *buf = malloc(n + 1);
    size_t m = 0;
    CHECK_EQ_INT(rb_chat_render_piece(t, p, text, flags, buf, n + 1, &m), RB_OK);
    CHECK_EQ_INT(m, n);
    return buf;
}

/* Renders the conversation the way cmd_chat.c feeds it; reply is what the
 * model writes after the assistant's header. */
static char *transcript(rb_chat_template t, const char *system, const char *reply)
{
    unsigned sys = system && *system ? RB_CHAT_HAS_SYSTEM : 0;
    char *a = piece(t, RB_CHAT_PIECE_SYSTEM, system, 0);
    char *b = piece(t, RB_CHAT_PIECE_USER, USER1, RB_CHAT_FIRST_TURN | sys);
    char *c = piece(t, RB_CHAT_PIECE_REPLY_END, NULL, 0);
    char *d = piece(t, RB_CHAT_PIECE_USER, USER2, sys);
    size_t n = strlen(a) + strlen(b) + strlen(reply) + strlen(c) + strlen(d) + 1;
    char *all = malloc(n);
    snprintf(all, n, "%s%s%s%s%s", a, b, reply, c, d);
    free(a), free(b), free(c), free(d);
    return all;
}

/* The same conversation as messages, rendered whole. */
static char *whole(rb_chat_template t, const char *system)
{
    rb_chat_message m[4] = {{"system", system ? system : ""}, {"user", USER1},
                            {"assistant", REPLY1}, {"user", USER2}};
    int has = system && *system;
    size_t n = 0;
    CHECK_EQ_INT(rb_chat_render(t, m + !has, 4 - !has, 1, NULL, 0, &n), RB_OK);
    char *buf = malloc(n + 1);
    CHECK_EQ_INT(rb_chat_render(t, m + !has, 4 - !has, 1, buf, n + 1, &n), RB_OK);
    return buf;
}

static void check_transcript(rb_chat_template t, const char *system, const char *want)
{
    /* mistral's reply starts with the space its model writes itself */
    char *got = transcript(t, system, t == RB_CHAT_TEMPLATE_MISTRAL ? " " REPLY1 : REPLY1);
    CHECK_STR_EQ(got, want);
    free(got);
    got = whole(t, system);
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
    /* Gemma: no system role, its text opens the first user turn */
    check_transcript(RB_CHAT_TEMPLATE_GEMMA, SYSTEM,
        "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
        "Hello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    check_transcript(RB_CHAT_TEMPLATE_GEMMA, NULL,
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
        "Hello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n");
    check_transcript(RB_CHAT_TEMPLATE_PHI3, SYSTEM,
        "<|system|>\nYou are terse.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello!<|end|>\n"
        "<|user|>\nBye<|end|>\n<|assistant|>\n");
    check_transcript(RB_CHAT_TEMPLATE_MISTRAL, SYSTEM,
        "[INST] You are terse.\n\nHi[/INST] Hello!</s>[INST] Bye[/INST]");
    check_transcript(RB_CHAT_TEMPLATE_DEEPSEEK_R1, SYSTEM,
        "You are terse.\n\n<\xef\xbd\x9cUser\xef\xbd\x9c>Hi<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
        "Hello!<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
        "<\xef\xbd\x9cUser\xef\xbd\x9c>Bye<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
    /* no system prompt: no system block at all */
    check_transcript(RB_CHAT_TEMPLATE_CHATML, "",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n");
    check_transcript(RB_CHAT_TEMPLATE_PLAIN, NULL, "User: Hi\nAssistant:Hello!\nUser: Bye\nAssistant:");
}

/* llama.cpp's test conversation (tests/test-chat-template.cpp) and the
 * text its built-in templates give for it (zephyr: TinyLlama's own
 * template, whose turns end with </s>). */
static void check_known(rb_chat_template t, const char *want)
{
    static const rb_chat_message conv[] = {
        {"system", "You are a helpful assistant"}, {"user", "Hello"},
        {"assistant", "Hi there"}, {"user", "Who are you"},
        {"assistant", "   I am an assistant   "}, {"user", "Another question"}};
    char buf[1024];
    size_t n = 0;
    CHECK_EQ_INT(rb_chat_render(t, conv, 6, 1, buf, sizeof buf, &n), RB_OK);
    CHECK_EQ_INT(n, strlen(want));
    CHECK_STR_EQ(buf, want);
}

static void test_known_renderings(void)
{
    check_known(RB_CHAT_TEMPLATE_CHATML,
        "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n"
        "<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\n"
        "Another question<|im_end|>\n<|im_start|>assistant\n");
    check_known(RB_CHAT_TEMPLATE_LLAMA2, /* llama.cpp's llama2-sys-bos */
        "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>"
        "[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]");
    check_known(RB_CHAT_TEMPLATE_LLAMA3,
        "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant"
        "<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
        "Who are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant"
        "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    check_known(RB_CHAT_TEMPLATE_GEMMA,
        "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
        "<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you"
        "<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n"
        "<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n");
    check_known(RB_CHAT_TEMPLATE_PHI3,
        "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\n"
        "Hi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   "
        "<|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n");
    check_known(RB_CHAT_TEMPLATE_MISTRAL, /* llama.cpp's mistral-v3 */
        "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST]"
        " I am an assistant</s>[INST] Another question[/INST]");
    check_known(RB_CHAT_TEMPLATE_DEEPSEEK_R1, /* llama.cpp's deepseek3 */
        "You are a helpful assistant\n\n<\xef\xbd\x9cUser\xef\xbd\x9c>Hello"
        "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>Hi there"
        "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
        "<\xef\xbd\x9cUser\xef\xbd\x9c>Who are you<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
        "   I am an assistant   <\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
        "<\xef\xbd\x9cUser\xef\xbd\x9c>Another question<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>");
    check_known(RB_CHAT_TEMPLATE_ZEPHYR,
        "<|system|>\nYou are a helpful assistant</s>\n<|user|>\nHello</s>\n<|assistant|>\n"
        "Hi there</s>\n<|user|>\nWho are you</s>\n<|assistant|>\n   I am an assistant   </s>\n"
        "<|user|>\nAnother question</s>\n<|assistant|>\n");
}

static void test_render_edges(void)
{
    char buf[64];
    size_t n = 99;
    /* an empty system renders nothing */
    CHECK_EQ_INT(rb_chat_render_piece(RB_CHAT_TEMPLATE_CHATML, RB_CHAT_PIECE_SYSTEM, "", 0, buf,
                                      sizeof buf, &n), RB_OK);
    CHECK_EQ_INT(n, 0);
    CHECK_STR_EQ(buf, "");
    /* an empty message is still a turn */
    char *t = piece(RB_CHAT_TEMPLATE_CHATML, RB_CHAT_PIECE_USER, "", RB_CHAT_FIRST_TURN);
    CHECK_STR_EQ(t, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n");
    free(t);
    /* a small buffer gets a NUL-terminated prefix, the length is the whole */
    CHECK_EQ_INT(rb_chat_render_piece(RB_CHAT_TEMPLATE_PLAIN, RB_CHAT_PIECE_USER, "abc", 0, buf,
                                      5, &n), RB_OK);
    CHECK_EQ_INT(n, strlen("User: abc\nAssistant:"));
    CHECK_STR_EQ(buf, "User");
    /* a long message */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    t = piece(RB_CHAT_TEMPLATE_PLAIN, RB_CHAT_PIECE_USER, big, RB_CHAT_FIRST_TURN);
    CHECK_EQ_INT(strlen(t), strlen("User: ") + sizeof big - 1 + strlen("\nAssistant:"));
    free(t);
    /* bad input */
    CHECK_EQ_INT(rb_chat_render_piece(RB_CHAT_TEMPLATE_COUNT, RB_CHAT_PIECE_USER, "x", 0, buf,
                                      sizeof buf, &n), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_render_piece(RB_CHAT_TEMPLATE_CHATML, (rb_chat_piece)7, "x", 0, buf,
                                      sizeof buf, &n), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_render_piece(RB_CHAT_TEMPLATE_CHATML, RB_CHAT_PIECE_USER, "x", 0, NULL,
                                      4, &n), RB_E_INVALID_ARG);
    const rb_chat_message tool[] = {{"tool", "x"}}, null_content[] = {{"user", NULL}};
    CHECK_EQ_INT(rb_chat_render(RB_CHAT_TEMPLATE_CHATML, tool, 1, 1, buf, sizeof buf, &n),
                 RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_render(RB_CHAT_TEMPLATE_CHATML, null_content, 1, 1, buf, sizeof buf, &n),
                 RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_render(RB_CHAT_TEMPLATE_CHATML, NULL, 0, 1, buf, sizeof buf, NULL),
                 RB_E_INVALID_ARG);
    /* no messages: just the generation prompt */
    CHECK_EQ_INT(rb_chat_render(RB_CHAT_TEMPLATE_CHATML, NULL, 0, 1, buf, sizeof buf, &n), RB_OK);
    CHECK_STR_EQ(buf, "<|im_start|>assistant\n");
}

static void test_names(void)
{
    const char *names[] = {"chatml", "llama3", "llama2", "zephyr", "plain",
                           "gemma", "phi3", "mistral", "deepseek-r1"};
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
    CHECK_STR_EQ(rb_chat_template_marker(RB_CHAT_TEMPLATE_GEMMA), "<start_of_turn>");
    CHECK(rb_chat_template_marker(RB_CHAT_TEMPLATE_PLAIN) == NULL);
    /* the families whose system block opens the first user turn */
    CHECK_STR_EQ(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_LLAMA2), "[INST] ");
    CHECK_STR_EQ(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_MISTRAL), "[INST] ");
    CHECK_STR_EQ(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_GEMMA), "<start_of_turn>user\n");
    CHECK(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_CHATML) == NULL);
    CHECK(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_PLAIN) == NULL);
    CHECK(rb_chat_template_first_user_skip(RB_CHAT_TEMPLATE_COUNT) == NULL);
    CHECK_STR_EQ(rb_chat_vocab_probe[RB_CHAT_VOCAB_IM_START], "<|im_start|>");
}

static rb_chat_template detect_jinja(const char *jinja, int *fallback)
{
    rb_chat_template_hints h = {0};
    h.jinja = jinja;
    h.jinja_len = strlen(jinja);
    h.architecture = "llama";
    return rb_chat_template_detect(&h, NULL, fallback);
}

static void test_detect(void)
{
    int fb = -1;
    /* 1. the Jinja text, abridged from the families' own templates */
    CHECK_EQ_INT(detect_jinja("{% for message in messages %}{{'<|im_start|>' + message['role'] "
                              "+ '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}",
                              &fb), RB_CHAT_TEMPLATE_CHATML);
    CHECK_EQ_INT(fb, 0);
    CHECK_EQ_INT(detect_jinja("{% set content = '<|start_header_id|>' + message['role'] + "
                              "'<|end_header_id|>\\n\\n' + message['content'] | trim + "
                              "'<|eot_id|>' %}", NULL), RB_CHAT_TEMPLATE_LLAMA3);
    CHECK_EQ_INT(detect_jinja("{{ bos_token + '[INST] <<SYS>>\\n' + content.strip() + ' [/INST]' }}",
                              NULL), RB_CHAT_TEMPLATE_LLAMA2);
    CHECK_EQ_INT(detect_jinja("{{ bos_token + '[INST] ' + content + '[/INST]' }}", NULL),
                 RB_CHAT_TEMPLATE_MISTRAL);
    CHECK_EQ_INT(detect_jinja("{% if message['role'] == 'user' %}{{ '<|user|>\\n' + "
                              "message['content'] + eos_token }}{% endif %}{{ '<|assistant|>' }}",
                              NULL), RB_CHAT_TEMPLATE_ZEPHYR);
    /* Phi-3 shares zephyr's role tags but ends turns with <|end|> */
    CHECK_EQ_INT(detect_jinja("{{'<|user|>' + '\\n' + message['content'] + '<|end|>'}}"
                              "{{ '<|assistant|>\\n' }}", NULL), RB_CHAT_TEMPLATE_PHI3);
    CHECK_EQ_INT(detect_jinja("{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim "
                              "+ '<end_of_turn>\\n' }}", NULL), RB_CHAT_TEMPLATE_GEMMA);
    CHECK_EQ_INT(detect_jinja("{{'<\xef\xbd\x9cUser\xef\xbd\x9c>' + message['content']}}"
                              "{{'<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>'}}", NULL),
                 RB_CHAT_TEMPLATE_DEEPSEEK_R1);
    CHECK_EQ_INT(detect_jinja("{{ messages }}", &fb), RB_CHAT_TEMPLATE_PLAIN);
    CHECK_EQ_INT(fb, 1);
    /* the text beats the architecture and the vocabulary */
    {
        rb_chat_template_hints h = {0};
        const char *j = "<|start_header_id|>";
        h.jinja = j, h.jinja_len = strlen(j), h.architecture = "qwen3";
        h.vocab_specials = 1u << RB_CHAT_VOCAB_IM_START;
        CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_LLAMA3);
    }
    /* jinja_len bounds the search: a marker beyond it is not seen */
    {
        rb_chat_template_hints h = {0};
        h.jinja = "abc<|im_start|>", h.jinja_len = 3;
        CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_PLAIN);
    }
    const char *why = NULL;
    rb_chat_template_hints h = {0};
    /* 2. the vocabulary */
    h.architecture = "llama";
    h.vocab_specials = 1u << RB_CHAT_VOCAB_IM_START; /* SmolLM2: a llama with chatml */
    CHECK_EQ_INT(rb_chat_template_detect(&h, &why, NULL), RB_CHAT_TEMPLATE_CHATML);
    CHECK_CONTAINS(why, "<|im_start|>");
    h.vocab_specials = (1u << RB_CHAT_VOCAB_EOT_ID) | (1u << RB_CHAT_VOCAB_START_HEADER);
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_LLAMA3);
    h.vocab_specials = 1u << RB_CHAT_VOCAB_START_OF_TURN;
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_GEMMA);
    h.vocab_specials = 1u << RB_CHAT_VOCAB_EOT_ID; /* <|eot_id|> alone is not Llama 3 */
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_PLAIN);
    /* 3. the architecture */
    h.vocab_specials = 0;
    const char *qwens[] = {"qwen2", "qwen2moe", "qwen3", "qwen3moe"};
    for (size_t i = 0; i < sizeof qwens / sizeof qwens[0]; i++) {
        h.architecture = qwens[i];
        CHECK_EQ_INT(rb_chat_template_detect(&h, &why, NULL), RB_CHAT_TEMPLATE_CHATML);
    }
    CHECK_CONTAINS(why, "Qwen");
    h.architecture = "gemma3";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_GEMMA);
    h.architecture = "phi3";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_PHI3);
    /* 4. the name */
    h.architecture = "llama";
    h.model_name = "TinyLlama-1.1B-Chat-v1.0";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_ZEPHYR);
    h.model_name = "LLaMA v2 7B";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_PLAIN);
    h.model_name = "Llama-2-7b-chat-hf";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_LLAMA2);
    h.model_name = "Llama-2-7b-hf"; /* the base model has no chat format */
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_PLAIN);
    h.model_name = "Mistral-7B-Instruct-v0.3";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_MISTRAL);
    h.model_name = "DeepSeek-R1-Distill-Qwen-1.5B";
    CHECK_EQ_INT(rb_chat_template_detect(&h, NULL, NULL), RB_CHAT_TEMPLATE_DEEPSEEK_R1);
    /* 5. nothing known: the fallback says so, and why */
    h.model_name = "";
    CHECK_EQ_INT(rb_chat_template_detect(&h, &why, &fb), RB_CHAT_TEMPLATE_PLAIN);
    CHECK_EQ_INT(fb, 1);
    CHECK_CONTAINS(why, "no tokenizer.chat_template");
    CHECK_CONTAINS(why, "fallback plain");
    h.jinja = "{{ x }}", h.jinja_len = 7;
    CHECK_EQ_INT(rb_chat_template_detect(&h, &why, &fb), RB_CHAT_TEMPLATE_PLAIN);
    CHECK_CONTAINS(why, "tokenizer.chat_template not recognised");
    CHECK_EQ_INT(rb_chat_template_detect(NULL, NULL, NULL), RB_CHAT_TEMPLATE_PLAIN);
}

/* rb_chat_template_choose by name, by text, and on models without text. */
static void test_choose(void)
{
    rb_chat_template_info info;
    CHECK_EQ_INT(rb_chat_template_choose(NULL, NULL, &info), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_template_choose(NULL, "gemma", NULL), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_template_choose(NULL, "gemma", &info), RB_OK);
    CHECK_EQ_INT(info.tmpl, RB_CHAT_TEMPLATE_GEMMA);
    CHECK_STR_EQ(info.name, "gemma");
    CHECK_EQ_INT(info.is_fallback, 0);
    CHECK_EQ_INT(info.marker_token, -1);
    /* template text given by the caller */
    CHECK_EQ_INT(rb_chat_template_choose(NULL, "{{ '<|im_start|>' }}", &info), RB_OK);
    CHECK_EQ_INT(info.tmpl, RB_CHAT_TEMPLATE_CHATML);
    CHECK_EQ_INT(info.has_text, 1);
    /* an unknown text: the plain fallback, with the text's first line */
    CHECK_EQ_INT(rb_chat_template_choose(NULL, "{%- set x = 1 -%}\n{{ messages }}", &info), RB_OK);
    CHECK_EQ_INT(info.tmpl, RB_CHAT_TEMPLATE_PLAIN);
    CHECK_EQ_INT(info.is_fallback, 1);
    CHECK_STR_EQ(info.first_line, "{%- set x = 1 -%}");
    CHECK_CONTAINS(info.reason, "not recognised");
    char longline[300];
    memset(longline, 'a', sizeof longline - 1);
    longline[sizeof longline - 1] = 0;
    CHECK_EQ_INT(rb_chat_template_choose(NULL, longline, &info), RB_OK);
    CHECK_EQ_INT(strlen(info.first_line), RB_CHAT_FIRST_LINE_MAX - 1);
    CHECK(strstr(info.first_line, "...") != NULL);

    /* a model without template text: the tiny llama falls back (and says
       why); a gemma3 one is a Gemma by its architecture */
    const char *path = REBOUND_TEST_TMP "/test_chat_choose.gguf";
    const char *shapes[] = {"tiny", "gemma3-270m"};
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(rb_test_make_model(path, &(rb_test_model_spec){
                                                  .shape = shapes[k], .n_embd = 64, .n_layers = 1,
                                                  .n_head = 2, .n_head_kv = 1, .head_dim = 32,
                                                  .n_ff = 64, .n_vocab = 300, .n_ctx = 64,
                                                  .kind = "f32", .seed = 1}),
                     RB_OK);
        rb_error err;
        rb_model *m = NULL;
        CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
        if (!m)
            continue;
        CHECK_EQ_INT(rb_chat_template_choose(m, NULL, &info), RB_OK);
        if (k == 0) {
            CHECK_EQ_INT(info.tmpl, RB_CHAT_TEMPLATE_PLAIN);
            CHECK_EQ_INT(info.is_fallback, 1);
            CHECK_EQ_INT(info.has_text, 0);
            CHECK_CONTAINS(info.reason, "no tokenizer.chat_template");
        } else {
            CHECK_EQ_INT(info.tmpl, RB_CHAT_TEMPLATE_GEMMA);
            CHECK_CONTAINS(info.reason, "Gemma");
            CHECK_EQ_INT(info.marker_token, -1); /* the synthetic vocab lacks it */
        }
        /* "</s>" is the synthetic SPM vocabulary's EOS, one special token */
        CHECK_EQ_INT(rb_chat_template_choose(m, "llama2", &info), RB_OK);
        CHECK_EQ_INT(info.marker_token, 2);
        rb_model_close(m);
    }
    remove(path);
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
    CHECK_EQ_INT(rb_model_get_meta_str(m, "tokenizer.chat_template", &text, &len), RB_E_NOT_FOUND);
    CHECK(text == NULL && len == 0); /* unchanged on failure */
    CHECK_EQ_INT(rb_model_get_meta_str(m, "general.architecture", &text, &len), RB_OK);
    CHECK(len == 5 && text && memcmp(text, "llama", 5) == 0);
    CHECK_EQ_INT(rb_model_get_meta_str(m, "llama.context_length", &text, &len), RB_E_FORMAT);
    CHECK_EQ_INT(rb_model_get_meta_str(m, NULL, &text, &len), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_model_get_meta_str(NULL, "general.name", &text, &len), RB_E_INVALID_ARG);
    rb_model_close(m);
    m = NULL;

    CHECK_EQ_INT(add_chat_template(path, LLAMA3_JINJA), 0);
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    if (!m) {
        fprintf(stderr, "open after patch: %s\n", err.message);
        return;
    }
    CHECK_EQ_INT(rb_model_get_meta_str(m, "tokenizer.chat_template", &text, &len), RB_OK);
    CHECK(len >= strlen(LLAMA3_JINJA) && memcmp(text, LLAMA3_JINJA, strlen(LLAMA3_JINJA)) == 0);
    rb_model_info mi;
    CHECK_EQ_INT(rb_model_get_info(m, &mi), RB_OK);
    rb_chat_template_hints h = {text, len, mi.architecture, mi.name, 0};
    const char *why = NULL;
    CHECK_EQ_INT(rb_chat_template_detect(&h, &why, NULL), RB_CHAT_TEMPLATE_LLAMA3);
    CHECK_CONTAINS(why, "tokenizer.chat_template");
    /* the library's choice reads the same text from the file */
    rb_chat_template_info info;
    CHECK_EQ_INT(rb_chat_template_choose(m, NULL, &info), RB_OK);
    CHECK_EQ_INT(info.tmpl, RB_CHAT_TEMPLATE_LLAMA3);
    CHECK_EQ_INT(info.is_fallback, 0);
    CHECK_EQ_INT(info.has_text, 1);
    CHECK_STR_EQ(info.first_line, "");
    const rb_chat_message msgs[] = {{"user", " Hi "}};
    char out[256];
    size_t n = 0;
    CHECK_EQ_INT(rb_chat_apply_template(m, NULL, msgs, 1, 1, out, sizeof out, &n), RB_OK);
    CHECK_STR_EQ(out, "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n");
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

/* ---- tools ---------------------------------------------------------------- */

#define TOOLS "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":" \
              "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}]"
#define TOOL_JSON "{\"type\": \"function\", \"function\": {\"name\": \"get\", \"parameters\": " \
                  "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}"

static char *render_tools(rb_chat_template t, const rb_chat_message *m, size_t n,
                          const rb_chat_tools *tl)
{
    size_t len = 0;
    CHECK_EQ_INT(rb_chat_render_tools(t, m, n, tl, 1, NULL, 0, &len), RB_OK);
    char *buf = malloc(len + 1);
    size_t got = 0;
    CHECK_EQ_INT(rb_chat_render_tools(t, m, n, tl, 1, buf, len + 1, &got), RB_OK);
    CHECK_EQ_INT(got, len);
    return buf;
}

/* A whole agent turn per family: system, user, the assistant's call, the
 * tool's result, then the assistant's header; checked against the text the
 * family's own Jinja template (llama.cpp's models/templates) writes. */
static void test_tool_rendering(void)
{
    const rb_chat_message m[] = {{"system", "Be brief."}, {"user", "Weather in Oslo?"},
                                 {"assistant", ""}, {"tool", "12C"}};
    const char *calls[] = {NULL, NULL,
                           "[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get\","
                           "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]",
                           NULL};
    rb_chat_tools tl = {TOOLS, calls};
    char *s = render_tools(RB_CHAT_TEMPLATE_CHATML, m, 4, &tl);
    CHECK_STR_EQ(s,
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> "
        "XML tags:\n<tools>\n" TOOL_JSON "\n</tools>\n\nFor each function call, return a json "
        "object with function name and arguments within <tool_call></tool_call> XML tags:\n"
        "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": "
        "\"Oslo\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n12C\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n");
    free(s);

    s = render_tools(RB_CHAT_TEMPLATE_LLAMA3, m, 4, &tl);
    CHECK_STR_EQ(s,
        "<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge "
        "Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
        "respond with a JSON for a function call with its proper arguments that best answers "
        "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.Do not use variables.\n\n" TOOL_JSON "\n\n"
        "Weather in Oslo?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "{\"name\": \"get\", \"parameters\": {\"city\": \"Oslo\"}}<|eot_id|>"
        "<|start_header_id|>ipython<|end_header_id|>\n\n12C<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);

    s = render_tools(RB_CHAT_TEMPLATE_MISTRAL, m, 4, &tl);
    CHECK_STR_EQ(s,
        "[AVAILABLE_TOOLS][" TOOL_JSON "][/AVAILABLE_TOOLS][INST] Be brief.\n\nWeather in Oslo?"
        "[/INST] [TOOL_CALLS][{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}]</s>"
        "[TOOL_RESULTS]{\"content\": \"12C\"}[/TOOL_RESULTS]");
    free(s);

    /* the generic fallback: Hermes text in the family's own turns (zephyr) */
    s = render_tools(RB_CHAT_TEMPLATE_ZEPHYR, m + 1, 3, &(rb_chat_tools){TOOLS, calls + 1});
    CHECK(strncmp(s, "<|system|>\n# Tools\n", 19) == 0);
    CHECK(strstr(s, "<tools>\n" TOOL_JSON "\n</tools>") != NULL);
    CHECK(strstr(s, "</s>\n<|user|>\nWeather in Oslo?</s>\n<|assistant|>\n<tool_call>\n"
                    "{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call></s>\n"
                    "<|user|>\n<tool_response>\n12C\n</tool_response></s>\n<|assistant|>\n") != NULL);
    free(s);

    /* two results in a row: one user turn (Qwen2.5's template) */
    const rb_chat_message two[] = {{"user", "x"}, {"tool", "a"}, {"tool", "b"}};
    s = render_tools(RB_CHAT_TEMPLATE_CHATML, two, 3, NULL);
    CHECK_STR_EQ(s, "<|im_start|>user\nx<|im_end|>\n<|im_start|>user\n<tool_response>\na\n"
                    "</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n"
                    "<|im_start|>assistant\n");
    free(s);

    /* without tools the text is rb_chat_render's, for every family */
    for (int t = 0; t < RB_CHAT_TEMPLATE_COUNT; t++) {
        size_t a = 0, b = 0;
        CHECK_EQ_INT(rb_chat_render((rb_chat_template)t, m, 3, 1, NULL, 0, &a), RB_OK);
        CHECK_EQ_INT(rb_chat_render_tools((rb_chat_template)t, m, 3, NULL, 1, NULL, 0, &b), RB_OK);
        CHECK_EQ_INT(a, b);
    }
    /* bad input */
    size_t n = 0;
    CHECK_EQ_INT(rb_chat_render(RB_CHAT_TEMPLATE_CHATML, m, 4, 1, NULL, 0, &n), RB_E_INVALID_ARG);
    rb_chat_tools bad = {"{\"not\": \"a list\"}", NULL};
    CHECK_EQ_INT(rb_chat_render_tools(RB_CHAT_TEMPLATE_CHATML, m, 2, &bad, 1, NULL, 0, &n),
                 RB_E_INVALID_ARG);
    const char *badcall[] = {NULL, NULL, "[{\"function\":{\"name\":\"get\",\"arguments\":\"{\"}}]",
                             NULL};
    CHECK_EQ_INT(rb_chat_render_tools(RB_CHAT_TEMPLATE_CHATML, m, 4,
                                      &(rb_chat_tools){TOOLS, badcall}, 1, NULL, 0, &n),
                 RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_format_tool_calls(RB_CHAT_TEMPLATE_COUNT, "[]", NULL, 0, &n),
                 RB_E_INVALID_ARG);
}

/* Parses text; checks the calls' names and arguments, and the content. */
static void expect_calls(rb_chat_template t, const char *text, size_t n_calls,
                         const char *name0, const char *args0, const char *content)
{
    rb_chat_tool_calls c;
    CHECK_EQ_INT(rb_chat_parse_tool_calls(t, text, strlen(text), &c), RB_OK);
    CHECK_EQ_INT(c.n, n_calls);
    if (c.n && name0) {
        CHECK_STR_EQ(c.calls[0].name, name0);
        CHECK_STR_EQ(c.calls[0].arguments, args0);
    }
    if (content)
        CHECK(c.content && !strcmp(c.content, content));
    else
        CHECK(c.content == NULL);
    if (c.n != n_calls)
        fprintf(stderr, "  in: %s\n", text);
    rb_chat_tool_calls_free(&c);
}

static void test_tool_parsing(void)
{
    rb_chat_template C = RB_CHAT_TEMPLATE_CHATML;
    expect_calls(C, "Let me check.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": "
                    "\"Oslo\"}}\n</tool_call>", 1, "get", "{\"city\":\"Oslo\"}", "Let me check.");
    expect_calls(C, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>"
                    "{\"name\":\"b\",\"arguments\":{\"x\":[1,2.5e3,true,null]}}</tool_call>",
                 2, "a", "{}", NULL);
    /* "</tool_call>" inside an argument's string does not close the tag
       (found by fuzz_grammar's round trip) */
    expect_calls(C, "<tool_call>{\"name\": \"a\", \"arguments\": {\"s\": \"x</tool_call>y\"}}"
                    "</tool_call> after", 1, "a", "{\"s\":\"x</tool_call>y\"}", "after");
    /* a tag whose body is not a call stays in the content */
    expect_calls(C, "<tool_call>{\"name\": 3}</tool_call>", 0, NULL, NULL,
                 "<tool_call>{\"name\": 3}</tool_call>");
    expect_calls(C, "<tool_call>{\"name\": \"a\", \"arguments\": {}", 0, NULL, NULL,
                 "<tool_call>{\"name\": \"a\", \"arguments\": {}");
    expect_calls(C, "[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}]", 1,
                 "get", "{\"city\":\"Oslo\"}", NULL);
    expect_calls(C, "[TOOL_CALLS][{\"name\": \"get\"}]", 0, NULL, NULL,
                 "[TOOL_CALLS][{\"name\": \"get\"}]");
    expect_calls(C, "<|python_tag|>{\"name\": \"get\", \"parameters\": {\"city\": \"O\\\"s}\"}}",
                 1, "get", "{\"city\":\"O\\\"s}\"}", NULL);
    expect_calls(C, "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}",
                 2, "a", "{}", NULL);
    expect_calls(C, "{\"name\": \"a\", \"parameters\": {}} and more", 0, NULL, NULL,
                 "{\"name\": \"a\", \"parameters\": {}} and more");
    expect_calls(C, "The answer is 4.", 0, NULL, NULL, "The answer is 4.");
    expect_calls(C, "  \n", 0, NULL, NULL, NULL);
    rb_chat_tool_calls c;
    CHECK_EQ_INT(rb_chat_parse_tool_calls(RB_CHAT_TEMPLATE_COUNT, "", 0, &c), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_chat_parse_tool_calls(C, NULL, 3, &c), RB_E_INVALID_ARG);
}

/* Every family: calls written by rb_chat_format_tool_calls (and inside a
 * rendered conversation) read back as the same calls. */
static void test_tool_round_trip(void)
{
    const char *calls = "[{\"name\":\"get\",\"arguments\":{\"city\":\"Oslo \\\"N\\\"\\n\","
                        "\"days\":[1,2],\"deep\":{\"a\":null,\"b\":-0.5}}},"
                        "{\"function\":{\"name\":\"put\",\"arguments\":\"{\\\"k\\\":\\\"\\u00e9\\\"}\"}}]";
    for (int t = 0; t < RB_CHAT_TEMPLATE_COUNT; t++) {
        size_t n = 0;
        CHECK_EQ_INT(rb_chat_format_tool_calls((rb_chat_template)t, calls, NULL, 0, &n), RB_OK);
        char *s = malloc(n + 1);
        CHECK_EQ_INT(rb_chat_format_tool_calls((rb_chat_template)t, calls, s, n + 1, &n), RB_OK);
        rb_chat_tool_calls c;
        CHECK_EQ_INT(rb_chat_parse_tool_calls((rb_chat_template)t, s, n, &c), RB_OK);
        CHECK_EQ_INT(c.n, 2);
        if (c.n == 2) {
            CHECK_STR_EQ(c.calls[0].name, "get");
            CHECK_STR_EQ(c.calls[0].arguments, "{\"city\":\"Oslo \\\"N\\\"\\n\",\"days\":[1,2],"
                                               "\"deep\":{\"a\":null,\"b\":-0.5}}");
            CHECK_STR_EQ(c.calls[1].name, "put");
            CHECK_STR_EQ(c.calls[1].arguments, "{\"k\":\"\xc3\xa9\"}");
        } else {
            fprintf(stderr, "  %s: %s\n", rb_chat_template_name((rb_chat_template)t), s);
        }
        CHECK(c.content == NULL);
        rb_chat_tool_calls_free(&c);
        free(s);
    }
}

int main(void)
{
    test_transcripts();
    test_known_renderings();
    test_render_edges();
    test_names();
    test_detect();
    test_choose();
    test_model_meta();
    test_tool_rendering();
    test_tool_parsing();
    test_tool_round_trip();
    return check_report();
}
