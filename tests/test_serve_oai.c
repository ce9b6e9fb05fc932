/*
 * test_serve_oai.c - serve/oai: OpenAI request bodies into sv_request
 * (every field, the defaults, each wrong field refused with its name and
 * status) and sv_request into response, chunk, usage, error and model
 * objects (read back with jansson); invalid UTF-8 out of the model made
 * valid. Pure functions: no model, no server.
 */
#include <jansson.h>
#include <stdlib.h>

#include "check.h"
#include "oai.h"

static sv_config cfg;

static sv_request *parse(sv_kind kind, const char *body, sv_oai_error *e, int *rc)
{
    sv_request *r = sv_request_new();
    *rc = sv_oai_parse(&cfg, 512, kind, body, strlen(body), r, e);
    return r;
}

/* the body is refused with this status, param, and a message containing want */
static void check_refused(sv_kind kind, const char *body, const char *param, const char *want)
{
    sv_oai_error e;
    int rc;
    sv_request *r = parse(kind, body, &e, &rc);
    CHECK_EQ_INT(rc, -1);
    CHECK_EQ_INT(e.e, SV_ERR_INVALID);
    if (param)
        CHECK(e.param && !strcmp(e.param, param));
    else
        CHECK(e.param == NULL);
    if (!strstr(e.msg, want)) {
        fprintf(stderr, "body %s: message '%s' lacks '%s'\n", body, e.msg, want);
        CHECK(0);
    }
    sv_request_release(r);
}

static void test_parse_chat(void)
{
    sv_oai_error e;
    int rc;
    sv_request *r = parse(SV_CHAT,
        "{\"model\":\"x\",\"messages\":[{\"role\":\"developer\",\"content\":\"be brief\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hel\"},"
        "{\"type\":\"text\",\"text\":\"lo\"}]}],\"stream\":true,"
        "\"stream_options\":{\"include_usage\":true},\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":3,\"seed\":42,\"stop\":[\"a\",\"bc\"],"
        "\"conversation_id\":\"conv-1\"}", &e, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(r->kind, SV_CHAT);
    CHECK_EQ_U64(r->n_msgs, 2);
    CHECK(!strcmp(r->msgs[0].role, "system"));
    CHECK(!strcmp(r->msgs[0].content, "be brief"));
    CHECK(!strcmp(r->msgs[1].role, "user"));
    CHECK(!strcmp(r->msgs[1].content, "hello"));
    CHECK_EQ_INT(r->stream, 1);
    CHECK_EQ_INT(r->include_usage, 1);
    CHECK_EQ_INT(r->max_tokens, 7);
    CHECK_NEAR(r->sp.temp, 0.5, 1e-6);
    CHECK_NEAR(r->sp.top_p, 0.9, 1e-6);
    CHECK_EQ_INT(r->sp.top_k, 3);
    CHECK_EQ_INT(r->has_seed, 1);
    CHECK_EQ_U64(r->sp.seed, 42);
    CHECK_EQ_INT(r->n_stop, 2);
    CHECK(r->n_stop == 2 && !strcmp(r->stop[1], "bc"));
    CHECK(!strcmp(r->conv_id, "conv-1"));
    sv_request_release(r);

    /* defaults from the config */
    r = parse(SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", &e, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(r->stream, 0);
    CHECK_EQ_INT(r->max_tokens, cfg.n_predict);
    CHECK_NEAR(r->sp.temp, cfg.sampler.temp, 0);
    CHECK_EQ_INT(r->has_seed, 0);
    CHECK_EQ_INT(r->conv_id[0], 0);
    sv_request_release(r);
}

static void test_parse_completion(void)
{
    sv_oai_error e;
    int rc;
    sv_request *r = parse(SV_COMPLETION, "{\"prompt\":[\"once upon\"],\"max_completion_tokens\":3}",
                          &e, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(r->kind, SV_COMPLETION);
    CHECK(r->prompt && !strcmp(r->prompt, "once upon"));
    CHECK_EQ_INT(r->max_tokens, 3);
    CHECK_EQ_U64(r->n_msgs, 0);
    sv_request_release(r);
    /* max_tokens above the context is taken: the reply ends at the
       context's end with finish_reason "length" */
    r = parse(SV_COMPLETION, "{\"prompt\":\"x\",\"max_tokens\":4096}", &e, &rc);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(r->max_tokens, 4096);
    sv_request_release(r);
}

static void test_parse_tools_format(void)
{
    sv_oai_error e;
    int rc;
    sv_request *r = parse(SV_CHAT,
        "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":"
        "\"function\",\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"12C\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":"
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},"
        "\"required\":[\"city\"]}}}],\"tool_choice\":\"required\",\"parallel_tool_calls\":false,"
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
        "\"strict\":true,\"schema\":{\"type\":\"object\"}}},\"logprobs\":true,\"top_logprobs\":2,"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-1,\"logit_bias\":{\"7\":-100}}", &e, &rc);
    if (rc)
        fprintf(stderr, "tools: %s\n", e.msg);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(r->tools, SV_TOOLS_REQUIRED);
    CHECK_EQ_INT(r->parallel_tool_calls, 0);
    CHECK_EQ_INT(r->format, SV_FMT_JSON_SCHEMA);
    CHECK(r->schema && !strcmp(r->schema, "{\"type\":\"object\"}"));
    CHECK(r->tool_schema && strstr(r->tool_schema, "\"const\":\"get\""));
    /* the messages as sent; the template renders list, call and result */
    CHECK_EQ_U64(r->n_msgs, 3);
    CHECK(r->tools_text && r->tools_text[0] == '[' && strstr(r->tools_text, "\"name\":\"get\""));
    CHECK(r->msg_calls && !r->msg_calls[0] && !r->msg_calls[2] && r->msg_calls[1] &&
          !strcmp(r->msg_calls[1], "[{\"name\":\"get\",\"arguments\":{\"city\":\"Oslo\"}}]"));
    CHECK(!strcmp(r->msgs[2].role, "tool") && !strcmp(r->msgs[2].content, "12C"));
    if (r->msg_calls) {
        rb_chat_tools tl = {r->tools_text, (const char *const *)r->msg_calls};
        char text[4096];
        size_t len = 0;
        CHECK_EQ_INT(rb_chat_render_tools(RB_CHAT_TEMPLATE_CHATML, r->msgs, r->n_msgs, &tl, 1,
                                          text, sizeof text, &len), RB_OK);
        CHECK(strstr(text, "<|im_start|>system\n# Tools") && strstr(text, "<tools>\n{"));
        CHECK(strstr(text, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": "
                           "\"Oslo\"}}\n</tool_call>"));
        CHECK(strstr(text, "<|im_start|>user\n<tool_response>\n12C\n</tool_response><|im_end|>"));
    }
    CHECK_EQ_INT(r->sp.is_logprobs, 1);
    CHECK_EQ_INT(r->sp.n_top_logprobs, 2);
    CHECK_NEAR(r->sp.presence_penalty, 0.5, 0);
    CHECK_NEAR(r->sp.frequency_penalty, -1, 0);
    CHECK_EQ_U64(r->n_bias, 1);
    CHECK(r->bias_ids[0] == 7 && r->bias_vals[0] == -100.0f);
    sv_request_release(r);

    /* a reply with calls: message.tool_calls, finish_reason tool_calls */
    r = sv_request_new();
    r->kind = SV_CHAT;
    r->tools = SV_TOOLS_AUTO;
    const char *out = "Let me check.\n<tool_call>\n{\"name\": \"get\", \"arguments\": "
                      "{\"city\": \"Oslo\"}}\n</tool_call>";
    r->out = strdup(out);
    r->out_len = strlen(out);
    r->finish_reason = "stop";
    sv_oai_meta m = {"chatcmpl-1", 1, "model"};
    char *js = sv_oai_response(r, &m);
    CHECK(js && strstr(js, "\"tool_calls\":[{\"id\":\"call_0\",\"type\":\"function\","
                           "\"function\":{\"name\":\"get\",\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"}}]"));
    CHECK(js && strstr(js, "\"content\":\"Let me check.\""));
    CHECK(js && strstr(js, "\"finish_reason\":\"tool_calls\""));
    if (js && !strstr(js, "tool_calls\":[{"))
        fprintf(stderr, "%s\n", js);
    free(js);
    sv_request_release(r);

    /* mistral's and llama 3.1's own formats are read too; a plain text is not a call */
    static const struct {
        const char *out;
        int has_call;
    } others[] = {
        {"[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {\"city\": \"Oslo\"}}]", 1},
        {"<|python_tag|>{\"name\": \"get\", \"parameters\": {\"city\": \"Oslo\"}}", 1},
        {" {\"name\": \"get\", \"parameters\": {\"city\": \"Oslo\"}}", 1},
        {"[TOOL_CALLS] [{\"name\": \"get\"}]", 0},
        {"{\"answer\": 42}", 0},
        {"It is 12C in Oslo.", 0},
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        r = sv_request_new();
        r->kind = SV_CHAT;
        r->tools = SV_TOOLS_AUTO;
        r->out = strdup(others[i].out);
        r->out_len = strlen(others[i].out);
        r->finish_reason = "stop";
        js = sv_oai_response(r, &m);
        int has = js && strstr(js, "\"arguments\":\"{\\\"city\\\":\\\"Oslo\\\"}\"") &&
                  strstr(js, "\"finish_reason\":\"tool_calls\"");
        if (has != others[i].has_call)
            fprintf(stderr, "reply %zu: %s\n", i, js ? js : "NULL");
        CHECK_EQ_INT(has, others[i].has_call);
        free(js);
        sv_request_release(r);
    }
}

static void test_parse_refused(void)
{
    check_refused(SV_CHAT, "{\"messages\": [", NULL, "not valid JSON");
    check_refused(SV_CHAT, "[1]", NULL, "must be a JSON object");
    check_refused(SV_CHAT, "{}", "messages", "'messages' is required");
    check_refused(SV_CHAT, "{\"messages\":\"hi\"}", "messages", "must be an array, not a string");
    check_refused(SV_CHAT, "{\"messages\":[]}", "messages", "1 to 65536");
    check_refused(SV_CHAT, "{\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "messages",
                  "messages[0].role 'robot'");
    check_refused(SV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},"
                  "{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", "messages",
                  "messages[1].content[0]");
    const char *ok = "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],";
    char body[512];
    snprintf(body, sizeof body, "%s\"max_tokens\":0}", ok);
    check_refused(SV_CHAT, body, "max_tokens", "it must be from 1");
    snprintf(body, sizeof body, "%s\"max_tokens\":1.5}", ok);
    check_refused(SV_CHAT, body, "max_tokens", "must be an integer, not a number");
    snprintf(body, sizeof body, "%s\"temperature\":3}", ok);
    check_refused(SV_CHAT, body, "temperature", "from 0 to 2");
    snprintf(body, sizeof body, "%s\"stream\":1}", ok);
    check_refused(SV_CHAT, body, "stream", "true or false");
    snprintf(body, sizeof body, "%s\"n\":2}", ok);
    check_refused(SV_CHAT, body, "n", "from 1 to 1");
    snprintf(body, sizeof body, "%s\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", ok);
    check_refused(SV_CHAT, body, "stop", "at most 4");
    snprintf(body, sizeof body, "%s\"conversation_id\":\"../etc\"}", ok);
    check_refused(SV_CHAT, body, "conversation_id", "must be 1 to 64 characters");
    snprintf(body, sizeof body, "%s\"unknown_field\":{}}", ok);
    check_refused(SV_CHAT, body, "unknown_field", "'unknown_field' is not supported");
    snprintf(body, sizeof body, "%s\"response_format\":{\"type\":\"xml\"}}", ok);
    check_refused(SV_CHAT, body, "response_format", "'xml' is not text, json_object or json_schema");
    snprintf(body, sizeof body, "%s\"top_logprobs\":3}", ok);
    check_refused(SV_CHAT, body, "top_logprobs", "needs 'logprobs': true");
    snprintf(body, sizeof body, "%s\"logit_bias\":{\"12\":101}}", ok);
    check_refused(SV_CHAT, body, "logit_bias", "from -100 to 100");
    snprintf(body, sizeof body, "%s\"tool_choice\":\"required\"}", ok);
    check_refused(SV_CHAT, body, "tool_choice", "needs 'tools'");
    snprintf(body, sizeof body, "%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":"
             "\"f\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}}", ok);
    check_refused(SV_CHAT, body, "tool_choice", "names 'g', which is not in 'tools'");
    check_refused(SV_COMPLETION, "{\"prompt\":\"x\",\"echo\":true}", "echo", "not supported");
    check_refused(SV_COMPLETION, "{\"prompt\":\"\"}", "prompt", "'prompt' is empty");
    check_refused(SV_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt", "must be a string");
}

/* a done request as the scheduler leaves it */
static sv_request *done_request(sv_kind kind, const char *out, size_t n)
{
    sv_request *r = sv_request_new();
    r->kind = kind;
    r->out = malloc(n + 1);
    memcpy(r->out, out, n);
    r->out[n] = 0;
    r->out_len = n;
    r->n_prompt = 11, r->n_cached = 4, r->n_completion = 3;
    snprintf(r->conv_out, sizeof r->conv_out, "c0123");
    r->restore = "resident";
    r->finish_reason = "cancelled";
    r->is_started = r->is_done = 1;
    return r;
}

static json_t *load(char *s)
{
    CHECK(s != NULL);
    json_error_t je;
    json_t *j = s ? json_loads(s, 0, &je) : NULL;
    CHECK(j != NULL);
    free(s);
    return j;
}

static const char *str_at(json_t *j, const char *path)
{
    /* path: keys separated by '.', array index as a number */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok(buf, "."); k && j; k = strtok(NULL, "."))
        j = (*k >= '0' && *k <= '9') ? json_array_get(j, (size_t)atoi(k)) : json_object_get(j, k);
    return json_is_string(j) ? json_string_value(j) : NULL;
}

static long long int_at(json_t *j, const char *path)
{
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *k = strtok(buf, "."); k && j; k = strtok(NULL, "."))
        j = json_object_get(j, k);
    return json_is_integer(j) ? json_integer_value(j) : -1;
}

static void test_responses(void)
{
    sv_oai_meta m = {"chatcmpl-x", 1700000000, "tiny.gguf"};
    sv_request *r = done_request(SV_CHAT, "hi\xff", 3);
    json_t *j = load(sv_oai_response(r, &m));
    CHECK(str_at(j, "id") && !strcmp(str_at(j, "id"), "chatcmpl-x"));
    CHECK(str_at(j, "object") && !strcmp(str_at(j, "object"), "chat.completion"));
    CHECK(str_at(j, "model") && !strcmp(str_at(j, "model"), "tiny.gguf"));
    CHECK(str_at(j, "conversation_id") && !strcmp(str_at(j, "conversation_id"), "c0123"));
    CHECK(str_at(j, "restore") && !strcmp(str_at(j, "restore"), "resident"));
    const char *content = str_at(j, "choices.0.message.content");
    CHECK(content && !strcmp(content, "hi\xEF\xBF\xBD")); /* invalid byte -> U+FFFD */
    const char *fin = str_at(j, "choices.0.finish_reason");
    CHECK(fin && !strcmp(fin, "stop")); /* "cancelled" is told as "stop" */
    CHECK_EQ_INT(int_at(j, "usage.prompt_tokens"), 11);
    CHECK_EQ_INT(int_at(j, "usage.completion_tokens"), 3);
    CHECK_EQ_INT(int_at(j, "usage.total_tokens"), 14);
    CHECK_EQ_INT(int_at(j, "usage.prompt_tokens_details.cached_tokens"), 4);
    json_decref(j);

    j = load(sv_oai_chunk(r, &m, NULL, 0, NULL, 1));
    CHECK(str_at(j, "object") && !strcmp(str_at(j, "object"), "chat.completion.chunk"));
    CHECK(str_at(j, "choices.0.delta.role") && !strcmp(str_at(j, "choices.0.delta.role"), "assistant"));
    CHECK(json_is_null(json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                                       "finish_reason")));
    json_decref(j);
    j = load(sv_oai_chunk(r, &m, "ab", 2, "length", 0));
    CHECK(str_at(j, "choices.0.delta.content") && !strcmp(str_at(j, "choices.0.delta.content"), "ab"));
    CHECK(str_at(j, "choices.0.finish_reason") && !strcmp(str_at(j, "choices.0.finish_reason"), "length"));
    json_decref(j);
    j = load(sv_oai_usage_chunk(r, &m));
    CHECK_EQ_U64(json_array_size(json_object_get(j, "choices")), 0);
    CHECK_EQ_INT(int_at(j, "usage.prompt_tokens_details.cached_tokens"), 4);
    json_decref(j);
    sv_request_release(r);

    r = done_request(SV_COMPLETION, "text", 4);
    r->finish_reason = "length";
    m.id = "cmpl-y";
    j = load(sv_oai_response(r, &m));
    CHECK(str_at(j, "object") && !strcmp(str_at(j, "object"), "text_completion"));
    CHECK(str_at(j, "choices.0.text") && !strcmp(str_at(j, "choices.0.text"), "text"));
    CHECK(str_at(j, "choices.0.finish_reason") && !strcmp(str_at(j, "choices.0.finish_reason"), "length"));
    json_decref(j);
    sv_request_release(r);

    j = load(sv_oai_error_json(SV_ERR_BUSY, "slow down", NULL));
    CHECK(str_at(j, "error.type") && !strcmp(str_at(j, "error.type"), "rate_limit_error"));
    CHECK(str_at(j, "error.code") && !strcmp(str_at(j, "error.code"), "too_many_requests"));
    CHECK(str_at(j, "error.message") && !strcmp(str_at(j, "error.message"), "slow down"));
    json_decref(j);
    j = load(sv_oai_error_json(SV_ERR_INVALID, "bad \xC0", "stop"));
    CHECK(str_at(j, "error.param") && !strcmp(str_at(j, "error.param"), "stop"));
    CHECK(str_at(j, "error.type") && !strcmp(str_at(j, "error.type"), "invalid_request_error"));
    json_decref(j);
    j = load(sv_oai_models("tiny.gguf", 512, 5));
    CHECK(str_at(j, "data.0.id") && !strcmp(str_at(j, "data.0.id"), "tiny.gguf"));
    json_decref(j);
}

static void test_utf8(void)
{
    static const struct { const char *in; size_t n; const char *out; } cases[] = {
        {"abc", 3, "abc"},
        {"\xC3\xA9", 2, "\xC3\xA9"},                       /* e acute */
        {"\xC0\xAF", 2, "\xEF\xBF\xBD\xEF\xBF\xBD"},       /* overlong '/' */
        {"\xED\xA0\x80", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* surrogate */
        {"\xF0\x9F\x98\x80", 4, "\xF0\x9F\x98\x80"},       /* emoji */
        {"\xF0\x9F\x98", 3, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* cut short */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n = 0;
        char *o = sv_oai_utf8_clean(cases[i].in, cases[i].n, &n);
        CHECK(o && n == strlen(cases[i].out) && !memcmp(o, cases[i].out, n));
        free(o);
    }
}

int main(void)
{
    memset(&cfg, 0, sizeof cfg);
    cfg.sampler = rb_sampler_default_params();
    cfg.n_predict = -1;
    test_parse_chat();
    test_parse_completion();
    test_parse_refused();
    test_parse_tools_format();
    test_responses();
    test_utf8();
    return check_report();
}
