/*
 * oai.c - OpenAI JSON <-> sv_request (oai.h), with jansson: it parses JSON
 * with the line and column of an error, rejects invalid UTF-8, caps
 * nesting, and keeps integers and reals apart, so a wrong type is told
 * from a wrong value. Text the model generated is made valid UTF-8
 * (sv_oai_utf8_clean) before it goes into a JSON string.
 *
 * Memory: jansson's objects while a function runs; the returned strings.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jansson.h>

#include "oai.h"

/* Valid UTF-8: invalid bytes become U+FFFD. Allocated. */
char *sv_oai_utf8_clean(const char *s, size_t n, size_t *out_n)
{
    char *o = malloc(3 * n + 1), *q = o;
    if (!o)
        return NULL;
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && i + len <= n;
        for (size_t k = 1; ok && k < len; k++)
            ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
        if (ok && len > 1) { /* overlong forms and surrogates, as jansson checks */
            uint32_t cp = len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
            for (size_t k = 1; k < len; k++)
                cp = cp << 6 | ((unsigned char)s[i + k] & 0x3F);
            ok = !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) &&
                 !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) && !(cp >= 0xD800 && cp <= 0xDFFF);
        }
        if (ok) {
            memcpy(q, s + i, len);
            q += len, i += len;
        } else {
            memcpy(q, "\xEF\xBF\xBD", 3);
            q += 3, i++;
        }
    }
    *q = 0;
    *out_n = (size_t)(q - o);
    return o;
}

static json_t *json_text(const char *s, size_t n)
{
    size_t m = 0;
    char *c = sv_oai_utf8_clean(s, n, &m);
    json_t *j = c ? json_stringn(c, m) : NULL;
    free(c);
    return j;
}

static const char *err_type(sv_err e)
{
    switch (e) {
    case SV_ERR_AUTH: return "authentication_error";
    case SV_ERR_NOT_FOUND: return "not_found_error";
    case SV_ERR_BUSY: return "rate_limit_error";
    case SV_ERR_SERVER:
    case SV_ERR_UNAVAILABLE: return "server_error";
    default: return "invalid_request_error";
    }
}

static json_t *error_object(sv_err e, const char *msg, const char *param)
{
    static const struct { sv_err e; const char *code; } codes[] = {
        {SV_ERR_AUTH, "invalid_api_key"}, {SV_ERR_TOO_LARGE, "request_too_large"},
        {SV_ERR_BUSY, "too_many_requests"}, {SV_ERR_UNAVAILABLE, "unavailable"},
        {SV_ERR_NOT_FOUND, "not_found"}, {SV_ERR_METHOD, "method_not_allowed"},
    };
    const char *code = NULL;
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (codes[i].e == e)
            code = codes[i].code;
    json_t *o = json_object();
    json_object_set_new(o, "message", json_text(msg, strlen(msg)));
    json_object_set_new(o, "type", json_string(err_type(e)));
    json_object_set_new(o, "param", param ? json_string(param) : json_null());
    json_object_set_new(o, "code", code ? json_string(code) : json_null());
    json_t *root = json_object();
    json_object_set_new(root, "error", o);
    return root;
}

/* ---- request parsing ------------------------------------------------------- */

typedef sv_oai_error perr;

static int bad(perr *p, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(perr *p, const char *param, const char *fmt, ...)
{
    p->e = SV_ERR_INVALID;
    p->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, sizeof p->msg, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *json_type_name(const json_t *j)
{
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* A number field within [lo, hi]; absent or null leaves *out. */
static int get_num(json_t *root, const char *key, double lo, double hi, float *out, perr *p)
{
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_number(j))
        return bad(p, key, "'%s' must be a number, not %s", key, json_type_name(j));
    double v = json_number_value(j);
    if (!(v >= lo && v <= hi))
        return bad(p, key, "'%s' is %g; it must be from %g to %g", key, v, lo, hi);
    *out = (float)v;
    return 0;
}

static int get_int(json_t *root, const char *key, long long lo, long long hi, long long *out,
                   int *given, perr *p)
{
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_integer(j))
        return bad(p, key, "'%s' must be an integer, not %s", key, json_type_name(j));
    long long v = json_integer_value(j);
    if (v < lo || v > hi)
        return bad(p, key, "'%s' is %lld; it must be from %lld to %lld", key, v, lo, hi);
    *out = v;
    if (given)
        *given = 1;
    return 0;
}

static int get_bool(json_t *root, const char *key, int *out, perr *p)
{
    json_t *j = json_object_get(root, key);
    if (!j || json_is_null(j))
        return 0;
    if (!json_is_boolean(j))
        return bad(p, key, "'%s' must be true or false, not %s", key, json_type_name(j));
    *out = json_is_true(j);
    return 0;
}

/* A message's content: a string, or an array of {"type":"text","text":...}. */
static char *content_text(json_t *j, size_t i, perr *p)
{
    if (json_is_string(j))
        return strdup(json_string_value(j));
    if (json_is_null(j))
        return strdup("");
    if (!json_is_array(j)) {
        bad(p, "messages", "messages[%zu].content must be a string or an array of text parts, "
            "not %s", i, json_type_name(j));
        return NULL;
    }
    size_t n = 0, k;
    json_t *part;
    json_array_foreach(j, k, part) {
        json_t *t = json_object_get(part, "text"), *ty = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(ty) || strcmp(json_string_value(ty), "text") ||
            !json_is_string(t)) {
            bad(p, "messages", "messages[%zu].content[%zu] must be {\"type\": \"text\", \"text\": "
                "STRING} (rebound serves text only)", i, k);
            return NULL;
        }
        n += json_string_length(t);
    }
    char *s = malloc(n + 1), *q = s;
    if (!s)
        return NULL;
    json_array_foreach(j, k, part) {
        json_t *t = json_object_get(part, "text");
        memcpy(q, json_string_value(t), json_string_length(t));
        q += json_string_length(t);
    }
    *q = 0;
    return s;
}

/* An assistant message's earlier tool calls as a JSON array of {"name",
 * "arguments": OBJECT} (the template writes them in its family's form). */
static char *assistant_calls(json_t *calls, size_t i, perr *p)
{
    if (!json_is_array(calls)) {
        bad(p, "messages", "messages[%zu].tool_calls must be an array", i);
        return NULL;
    }
    json_t *out = json_array();
    size_t k;
    json_t *call;
    json_array_foreach(calls, k, call) {
        json_t *fn = json_object_get(call, "function");
        json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
        json_t *obj = NULL;
        if (json_is_string(args)) {
            json_error_t je;
            obj = json_loads(json_string_value(args), 0, &je);
        } else if (json_is_object(args)) {
            obj = json_incref(args);
        } else if (!args) {
            obj = json_object();
        }
        if (!json_is_string(name) || !json_is_object(obj)) {
            json_decref(obj);
            json_decref(out);
            bad(p, "messages", "messages[%zu].tool_calls[%zu] must be {\"type\": \"function\", "
                "\"function\": {\"name\": STRING, \"arguments\": STRING of a JSON object}}", i, k);
            return NULL;
        }
        json_array_append_new(out, json_pack("{s:O, s:o}", "name", name, "arguments", obj));
    }
    char *s = json_dumps(out, JSON_COMPACT);
    json_decref(out);
    if (!s)
        bad(p, NULL, "out of memory");
    return s;
}

/* Fields rebound serve reads; any other is refused by name (never
 * silently ignored). "user" and "metadata" only label a request. */
static const char *const KNOWN[] = {
    "model", "messages", "prompt", "stream", "stream_options", "max_tokens",
    "max_completion_tokens", "temperature", "top_p", "min_p", "top_k", "repeat_penalty",
    "presence_penalty", "frequency_penalty", "seed", "n", "stop", "conversation_id",
    "response_format", "tools", "tool_choice", "parallel_tool_calls", "logprobs",
    "top_logprobs", "logit_bias", "user", "metadata", NULL};

/* The tools: their prompt text, and for required/named calls the call's
 * schema (anyOf over the functions allowed). */
static int parse_tools(json_t *root, sv_request *r, perr *p)
{
    json_t *tools = json_object_get(root, "tools"), *tc = json_object_get(root, "tool_choice");
    if (get_bool(root, "parallel_tool_calls", &r->parallel_tool_calls, p))
        return -1;
    if (!tools || json_is_null(tools)) {
        if (tc && !json_is_null(tc) && !(json_is_string(tc) && !strcmp(json_string_value(tc), "none")))
            return bad(p, "tool_choice", "'tool_choice' needs 'tools'");
        return 0;
    }
    if (r->kind != SV_CHAT)
        return bad(p, "tools", "'tools' is for /v1/chat/completions");
    if (!json_is_array(tools) || json_array_size(tools) == 0 || json_array_size(tools) > 128)
        return bad(p, "tools", "'tools' must be an array of 1 to 128 tools");
    const char *named = NULL;
    r->tools = SV_TOOLS_AUTO;
    if (tc && !json_is_null(tc)) {
        if (json_is_string(tc)) {
            const char *v = json_string_value(tc);
            if (!strcmp(v, "none"))
                r->tools = SV_TOOLS_NONE;
            else if (!strcmp(v, "required"))
                r->tools = SV_TOOLS_REQUIRED;
            else if (strcmp(v, "auto"))
                return bad(p, "tool_choice", "'tool_choice' is '%.40s'; it must be none, auto, "
                           "required or {\"type\": \"function\", \"function\": {\"name\": ...}}", v);
        } else {
            json_t *nm = json_object_get(json_object_get(tc, "function"), "name");
            if (!json_is_object(tc) || !json_is_string(nm))
                return bad(p, "tool_choice", "'tool_choice' must be a string or {\"type\": "
                           "\"function\", \"function\": {\"name\": STRING}}");
            named = json_string_value(nm);
            r->tools = SV_TOOLS_REQUIRED;
        }
    }
    json_t *any = json_array(), *list = json_array();
    size_t k;
    json_t *t;
    int found = named == NULL;
    json_array_foreach(tools, k, t) {
        json_t *fn = json_object_get(t, "function"), *ty = json_object_get(t, "type");
        json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
        if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") ||
            !json_is_object(fn) || !json_is_string(name) || (params && !json_is_object(params))) {
            json_decref(any);
            json_decref(list);
            return bad(p, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": "
                       "{\"name\": STRING, \"parameters\": OBJECT}}", k);
        }
        json_array_append(list, t);
        if (named && strcmp(named, json_string_value(name)))
            continue;
        found = 1;
        json_t *pa = params ? json_incref(params) : json_pack("{s:s}", "type", "object");
        json_t *call = json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s, s], s:b}", "type", "object",
                                 "properties", "name", "const", name, "arguments", pa,
                                 "required", "name", "arguments", "additionalProperties", 0);
        json_array_append_new(any, call);
    }
    if (!found) {
        json_decref(any);
        json_decref(list);
        return bad(p, "tool_choice", "'tool_choice' names '%.60s', which is not in 'tools'", named);
    }
    char *ls = json_dumps(list, JSON_COMPACT);
    json_t *sch = json_pack("{s:o}", "anyOf", any);
    r->tool_schema = json_dumps(sch, JSON_COMPACT);
    json_decref(sch);
    json_decref(list);
    if (!ls || !r->tool_schema) {
        free(ls);
        return bad(p, NULL, "out of memory");
    }
    /* the model's chat template renders the list (none for "none") */
    if (r->tools == SV_TOOLS_NONE)
        free(ls);
    else
        r->tools_text = ls;
    return 0;
}

static int parse_format(json_t *root, sv_request *r, perr *p)
{
    json_t *rf = json_object_get(root, "response_format");
    if (!rf || json_is_null(rf))
        return 0;
    json_t *ty = json_object_get(rf, "type");
    if (!json_is_object(rf) || !json_is_string(ty))
        return bad(p, "response_format", "'response_format' must be {\"type\": \"text\" | "
                   "\"json_object\" | \"json_schema\", ...}");
    const char *t = json_string_value(ty);
    if (!strcmp(t, "text"))
        return 0;
    if (!strcmp(t, "json_object")) {
        r->format = SV_FMT_JSON_OBJECT;
        return 0;
    }
    if (strcmp(t, "json_schema"))
        return bad(p, "response_format", "response_format.type '%.40s' is not text, json_object "
                   "or json_schema", t);
    json_t *js = json_object_get(rf, "json_schema");
    json_t *sch = json_object_get(js, "schema"), *strict = json_object_get(js, "strict");
    if (!json_is_object(js) || !json_is_string(json_object_get(js, "name")))
        return bad(p, "response_format", "response_format.json_schema must be an object with a "
                   "'name'");
    if (strict && !json_is_boolean(strict) && !json_is_null(strict))
        return bad(p, "response_format", "response_format.json_schema.strict must be true or false");
    if (sch && !json_is_object(sch))
        return bad(p, "response_format", "response_format.json_schema.schema must be an object");
    /* strict or not, the output is generated under the schema */
    r->format = sch ? SV_FMT_JSON_SCHEMA : SV_FMT_JSON_OBJECT;
    if (sch && !(r->schema = json_dumps(sch, JSON_COMPACT)))
        return bad(p, NULL, "out of memory");
    return 0;
}

static int parse_logprobs_bias(json_t *root, sv_request *r, perr *p)
{
    json_t *lp = json_object_get(root, "logprobs");
    long long v = 0;
    if (r->kind == SV_CHAT) {
        int on = 0;
        if (get_bool(root, "logprobs", &on, p))
            return -1;
        int given = 0;
        if (get_int(root, "top_logprobs", 0, 20, &v, &given, p))
            return -1;
        if (given && !on)
            return bad(p, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        r->sp.is_logprobs = on;
        r->sp.n_top_logprobs = (int32_t)v;
    } else if (lp && !json_is_null(lp)) {
        if (get_int(root, "logprobs", 0, 5, &v, NULL, p))
            return -1;
        r->sp.is_logprobs = 1;
        r->sp.n_top_logprobs = (int32_t)v;
        r->completion_logprobs = 1;
    }
    json_t *lb = json_object_get(root, "logit_bias");
    if (lb && !json_is_null(lb)) {
        if (!json_is_object(lb))
            return bad(p, "logit_bias", "'logit_bias' must be an object of token id -> bias");
        size_t n = json_object_size(lb);
        if (n > 1024)
            return bad(p, "logit_bias", "'logit_bias' has %zu entries; at most 1024", n);
        r->bias_ids = malloc((n ? n : 1) * sizeof *r->bias_ids);
        r->bias_vals = malloc((n ? n : 1) * sizeof *r->bias_vals);
        if (!r->bias_ids || !r->bias_vals)
            return bad(p, NULL, "out of memory");
        const char *key;
        json_t *val;
        json_object_foreach(lb, key, val) {
            char *end = NULL;
            long id = strtol(key, &end, 10);
            if (!*key || *end || id < 0 || id > INT32_MAX)
                return bad(p, "logit_bias", "logit_bias key '%.40s' is not a token id", key);
            if (!json_is_number(val) || json_number_value(val) < -100 || json_number_value(val) > 100)
                return bad(p, "logit_bias", "logit_bias['%.40s'] must be a number from -100 to 100",
                           key);
            r->bias_ids[r->n_bias] = (int32_t)id;
            r->bias_vals[r->n_bias++] = (float)json_number_value(val);
        }
    }
    return 0;
}

/* The request's fields into r; -1 with p filled when one is wrong. */
static int parse_fields(const sv_config *cfg, uint32_t n_ctx, sv_kind kind, json_t *root,
                        sv_request *r, perr *p)
{
    if (!json_is_object(root))
        return bad(p, NULL, "the body must be a JSON object, not %s", json_type_name(root));
    r->kind = kind;
    {
        const char *key;
        json_t *val;
        json_object_foreach(root, key, val) {
            int known = 0;
            for (const char *const *k = KNOWN; *k && !known; k++)
                known = !strcmp(*k, key);
            if (!known) {
                /* key dies with the JSON: the error keeps a copy */
                snprintf(p->param_buf, sizeof p->param_buf, "%s", key);
                return bad(p, p->param_buf, "'%.60s' is not supported by rebound serve (it is "
                           "refused, not ignored)", key);
            }
        }
    }
    r->parallel_tool_calls = 1;
    json_t *j = json_object_get(root, "model");
    if (j && !json_is_string(j) && !json_is_null(j))
        return bad(p, "model", "'model' must be a string, not %s", json_type_name(j));
    if (r->kind == SV_CHAT) {
        json_t *m = json_object_get(root, "messages");
        if (!m)
            return bad(p, "messages", "'messages' is required");
        if (!json_is_array(m))
            return bad(p, "messages", "'messages' must be an array, not %s", json_type_name(m));
        size_t n = json_array_size(m);
        if (n == 0 || n > 65536)
            return bad(p, "messages", "'messages' has %zu entries; it must have 1 to 65536", n);
        if (!(r->msgs = calloc(n, sizeof *r->msgs)) ||
            !(r->msg_calls = calloc(n, sizeof *r->msg_calls)))
            return bad(p, NULL, "out of memory");
        for (size_t i = 0; i < n; i++) {
            json_t *msg = json_array_get(m, i);
            if (!json_is_object(msg))
                return bad(p, "messages", "messages[%zu] must be an object, not %s", i,
                           json_type_name(msg));
            json_t *role = json_object_get(msg, "role");
            if (!json_is_string(role))
                return bad(p, "messages", "messages[%zu].role must be a string", i);
            const char *rs = json_string_value(role);
            if (!strcmp(rs, "developer"))
                rs = "system";
            if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") &&
                strcmp(rs, "tool"))
                return bad(p, "messages", "messages[%zu].role '%.40s' is not system, user, "
                           "assistant or tool", i, rs);
            char *content = content_text(json_object_get(msg, "content"), i, p);
            if (!content)
                return -1;
            char *calls = NULL;
            if (!strcmp(rs, "assistant") && json_object_get(msg, "tool_calls") &&
                !json_is_null(json_object_get(msg, "tool_calls")) &&
                !(calls = assistant_calls(json_object_get(msg, "tool_calls"), i, p))) {
                free(content);
                return -1;
            }
            r->msg_calls[i] = calls;
            r->msgs[i].role = strdup(rs);
            r->msgs[i].content = content;
            r->n_msgs = i + 1;
            if (!r->msgs[i].role)
                return bad(p, NULL, "out of memory");
        }
    } else {
        json_t *pr = json_object_get(root, "prompt");
        if (json_is_array(pr) && json_array_size(pr) == 1)
            pr = json_array_get(pr, 0);
        if (!pr)
            return bad(p, "prompt", "'prompt' is required");
        if (!json_is_string(pr))
            return bad(p, "prompt", "'prompt' must be a string (or an array of one string), "
                       "not %s", json_type_name(pr));
        if (json_string_length(pr) == 0)
            return bad(p, "prompt", "'prompt' is empty");
        if (!(r->prompt = strdup(json_string_value(pr))))
            return bad(p, NULL, "out of memory");
    }
    if (get_bool(root, "stream", &r->stream, p))
        return -1;
    json_t *so = json_object_get(root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return bad(p, "stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, p))
            return -1;
    }
    long long v = -1;
    int given = 0;
    (void)n_ctx; /* max_tokens over the room left is not refused: the reply
                    ends at the context's end with finish_reason "length" */
    r->max_tokens = cfg->n_predict;
    const char *mt = json_object_get(root, "max_completion_tokens") ? "max_completion_tokens"
                                                                    : "max_tokens";
    if (get_int(root, mt, 1, INT64_MAX, &v, &given, p))
        return -1;
    if (given)
        r->max_tokens = v;
    r->sp = cfg->sampler;
    if (get_num(root, "temperature", 0, 2, &r->sp.temp, p) ||
        get_num(root, "top_p", 1e-6, 1, &r->sp.top_p, p) ||
        get_num(root, "min_p", 0, 1, &r->sp.min_p, p) ||
        get_num(root, "repeat_penalty", 1e-3, 100, &r->sp.repeat_penalty, p))
        return -1;
    if (get_num(root, "presence_penalty", -2, 2, &r->sp.presence_penalty, p) ||
        get_num(root, "frequency_penalty", -2, 2, &r->sp.frequency_penalty, p))
        return -1;
    if (parse_logprobs_bias(root, r, p) || parse_format(root, r, p) || parse_tools(root, r, p))
        return -1;
    v = r->sp.top_k;
    if (get_int(root, "top_k", 0, 1 << 30, &v, NULL, p))
        return -1;
    r->sp.top_k = (int32_t)v;
    if (get_int(root, "seed", INT64_MIN, INT64_MAX, &v, &r->has_seed, p))
        return -1;
    if (r->has_seed)
        r->sp.seed = (uint64_t)v;
    v = 1;
    if (get_int(root, "n", 1, 1, &v, NULL, p))
        return -1;
    json_t *stop = json_object_get(root, "stop");
    if (stop && !json_is_null(stop)) {
        size_t n = json_is_array(stop) ? json_array_size(stop) : 1;
        if (!json_is_array(stop) && !json_is_string(stop))
            return bad(p, "stop", "'stop' must be a string or an array of strings, not %s",
                       json_type_name(stop));
        if (n > SV_STOP_MAX)
            return bad(p, "stop", "'stop' has %zu strings; at most %d", n, SV_STOP_MAX);
        for (size_t i = 0; i < n; i++) {
            json_t *s = json_is_array(stop) ? json_array_get(stop, i) : stop;
            if (!json_is_string(s))
                return bad(p, "stop", "stop[%zu] must be a string, not %s", i, json_type_name(s));
            size_t len = json_string_length(s);
            if (len == 0 || len > SV_STOP_LEN_MAX || strlen(json_string_value(s)) != len)
                return bad(p, "stop", "stop[%zu] must have 1 to %d bytes (no NUL)", i,
                           SV_STOP_LEN_MAX);
            if (!(r->stop[r->n_stop] = strdup(json_string_value(s))))
                return bad(p, NULL, "out of memory");
            r->n_stop++;
        }
    }
    json_t *id = json_object_get(root, "conversation_id");
    if (id && !json_is_null(id)) {
        if (!json_is_string(id) || !sv_id_is_valid(json_string_value(id)))
            return bad(p, "conversation_id", "'conversation_id' must be 1 to %d characters of "
                       "A-Z, a-z, 0-9, '-' and '_'", SV_ID_MAX);
        snprintf(r->conv_id, sizeof r->conv_id, "%s", json_string_value(id));
    }
    return 0;
}

/* ---- responses ------------------------------------------------------------- */

static json_t *usage_object(const sv_request *r)
{
    json_t *u = json_object(), *d = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer((json_int_t)r->n_prompt));
    json_object_set_new(u, "completion_tokens", json_integer((json_int_t)r->n_completion));
    json_object_set_new(u, "total_tokens", json_integer((json_int_t)(r->n_prompt + r->n_completion)));
    json_object_set_new(d, "cached_tokens", json_integer((json_int_t)r->n_cached));
    json_object_set_new(u, "prompt_tokens_details", d);
    return u;
}

/* Where the request's time went: llama-server's "timings" fields (prompt_*
 * count the tokens computed, cache_n those reused) and rebound's phases of
 * the first token (sv_timings). */
static json_t *timings_object(const sv_request *r)
{
    const sv_timings *t = &r->tm;
    json_t *o = json_object();
    size_t n_prompt = r->n_prompt - r->n_cached, n_pred = r->n_completion;
    double prompt_ms = t->prefill_s * 1e3, pred_ms = t->decode_s * 1e3;
#define TSET(k, v) json_object_set_new(o, k, v)
    TSET("cache_n", json_integer((json_int_t)r->n_cached));
    TSET("prompt_n", json_integer((json_int_t)n_prompt));
    TSET("prompt_ms", json_real(prompt_ms));
    TSET("prompt_per_token_ms", json_real(n_prompt ? prompt_ms / (double)n_prompt : 0));
    TSET("prompt_per_second", json_real(prompt_ms > 0 ? 1e3 * (double)n_prompt / prompt_ms : 0));
    /* the first token is sampled at the prefill's end: the decode steps
       made the others */
    size_t n_steps = n_pred > 1 ? n_pred - 1 : 0;
    TSET("predicted_n", json_integer((json_int_t)n_pred));
    TSET("predicted_ms", json_real(pred_ms));
    TSET("predicted_per_token_ms", json_real(n_steps ? pred_ms / (double)n_steps : 0));
    TSET("predicted_per_second", json_real(pred_ms > 0 ? 1e3 * (double)n_steps / pred_ms : 0));
    TSET("ttft_ms", t->has_first ? json_real((t->prepare_s + t->queue_s + t->open_s +
                                              t->prefill_s) * 1e3) : json_null());
    TSET("prepare_ms", json_real(t->prepare_s * 1e3));
    TSET("queue_ms", json_real(t->queue_s * 1e3));
    TSET("open_ms", json_real(t->open_s * 1e3));
    TSET("restore_io_ms", json_real(t->restore_io_s * 1e3));
    TSET("restore_decode_ms", json_real(t->restore_decode_s * 1e3));
    TSET("restore_wait_ms", json_real(t->restore_wait_s * 1e3));
    TSET("restore_span_ms", json_real(t->restore_span_s * 1e3));
    TSET("room_ms", json_real(t->room_s * 1e3));
    TSET("restore_read_bytes", json_integer((json_int_t)t->restore_bytes_io));
    TSET("restore_decoded_bytes", json_integer((json_int_t)t->restore_bytes_decoded));
    TSET("restore_prefetched_bytes", json_integer((json_int_t)t->restore_bytes_prefetched));
    TSET("restore_recomputed_tokens", json_integer((json_int_t)t->restore_recomputed));
    TSET("weights_wait_ms", json_real(t->weights_wait_s * 1e3));
#undef TSET
    return o;
}

static json_t *base_object(const sv_request *r, const sv_oai_meta *m, const char *object)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(m->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer((json_int_t)m->created));
    json_object_set_new(o, "model", json_string(m->model));
    json_object_set_new(o, "conversation_id", json_string(r->conv_out));
    if (r->restore)
        json_object_set_new(o, "restore", json_string(r->restore));
    return o;
}

/*
 * The tool calls in a reply, read by the library (rb_chat_parse_tool_calls:
 * Hermes <tool_call> tags, mistral's [TOOL_CALLS], llama 3.1's JSON), each
 * as {"id", "type": "function", "function": {"name", "arguments": the
 * arguments as a JSON string}}; *content gets the text outside the calls
 * (null when only white space). Returns the calls (an array, maybe empty).
 * Pure: the same text gives the same calls.
 */
static json_t *tool_calls(const sv_request *r, json_t **content)
{
    json_t *calls = json_array();
    rb_chat_tool_calls c;
    /* every family's reply is read in all the forms: the template is any */
    if (rb_chat_parse_tool_calls(RB_CHAT_TEMPLATE_CHATML, r->out ? r->out : "",
                                 r->out ? r->out_len : 0, &c) != RB_OK) {
        if (content)
            *content = json_text(r->out ? r->out : "", r->out_len);
        return calls;
    }
    for (size_t i = 0; i < c.n; i++) {
        char id[32];
        snprintf(id, sizeof id, "call_%zu", i);
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type",
                                               "function", "function", "name", c.calls[i].name,
                                               "arguments", c.calls[i].arguments));
    }
    if (content)
        *content = c.content ? json_text(c.content, strlen(c.content)) : json_null();
    rb_chat_tool_calls_free(&c);
    return calls;
}

static int has_tool_calls(const sv_request *r)
{
    if (r->kind != SV_CHAT || r->tools == SV_TOOLS_NONE)
        return 0;
    json_t *c = tool_calls(r, NULL);
    int n = (int)json_array_size(c);
    json_decref(c);
    return n > 0;
}

const char *sv_oai_finish_name(const sv_request *r)
{
    if (r->finish_reason && !strcmp(r->finish_reason, "stop") && has_tool_calls(r))
        return "tool_calls";
    return r->finish_reason && strcmp(r->finish_reason, "cancelled") ? r->finish_reason : "stop";
}

static json_t *lp_token(const sv_lp_token *t, int with_bytes)
{
    json_t *o = json_object();
    json_object_set_new(o, "token", json_text(t->text, t->n_text));
    json_object_set_new(o, "logprob", json_real(t->logprob));
    if (with_bytes) {
        json_t *b = json_array();
        for (size_t i = 0; i < t->n_text; i++)
            json_array_append_new(b, json_integer((unsigned char)t->text[i]));
        json_object_set_new(o, "bytes", b);
    }
    return o;
}

/* logprobs of r->lps[lp0..lp1): the chat shape ({"content": [...]}) or the
 * completions' legacy one; call with r->mu held while the request runs. */
static json_t *logprobs_object(const sv_request *r, size_t lp0, size_t lp1)
{
    if (!r->sp.is_logprobs)
        return json_null();
    if (r->kind == SV_CHAT) {
        json_t *arr = json_array();
        for (size_t i = lp0; i < lp1 && i < r->n_lps; i++) {
            json_t *e = lp_token(&r->lps[i].tok, 1), *top = json_array();
            for (size_t k = 0; k < r->lps[i].n_top; k++)
                json_array_append_new(top, lp_token(&r->lps[i].top[k], 1));
            json_object_set_new(e, "top_logprobs", top);
            json_array_append_new(arr, e);
        }
        json_t *o = json_object();
        json_object_set_new(o, "content", arr);
        return o;
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t off = 0;
    for (size_t i = lp0; i < lp1 && i < r->n_lps; i++) {
        json_array_append_new(toks, json_text(r->lps[i].tok.text, r->lps[i].tok.n_text));
        json_array_append_new(lps, json_real(r->lps[i].tok.logprob));
        json_t *t = json_object();
        for (size_t k = 0; k < r->lps[i].n_top; k++) {
            json_t *key = json_text(r->lps[i].top[k].text, r->lps[i].top[k].n_text);
            json_object_set_new(t, json_string_value(key), json_real(r->lps[i].top[k].logprob));
            json_decref(key);
        }
        json_array_append_new(tops, t);
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += r->lps[i].tok.n_text;
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", toks);
    json_object_set_new(o, "token_logprobs", lps);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

/* The whole reply, once done. Called with the request done. */
static json_t *full_response(const sv_request *r, const sv_oai_meta *meta)
{
    int chat = r->kind == SV_CHAT;
    json_t *o = base_object(r, meta, chat ? "chat.completion" : "text_completion");
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    json_t *text = json_text(r->out ? r->out : "", r->out_len);
    if (chat) {
        json_t *m = json_object();
        json_object_set_new(m, "role", json_string("assistant"));
        json_t *content = NULL, *calls = r->tools != SV_TOOLS_NONE ? tool_calls(r, &content) : NULL;
        if (calls && json_array_size(calls)) {
            json_decref(text);
            json_object_set_new(m, "content", content);
            json_object_set_new(m, "tool_calls", calls);
        } else {
            json_decref(calls);
            json_decref(content);
            json_object_set_new(m, "content", text);
        }
        json_object_set_new(choice, "message", m);
    } else {
        json_object_set_new(choice, "text", text);
    }
    json_object_set_new(choice, "logprobs", logprobs_object(r, 0, r->n_lps));
    json_object_set_new(choice, "finish_reason", json_string(sv_oai_finish_name(r)));
    json_t *arr = json_array();
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_object(r));
    json_object_set_new(o, "timings", timings_object(r));
    return o;
}

/* One chunk event: delta text (NULL: none), finish reason (NULL: none). */
static json_t *chunk(const sv_request *r, const sv_oai_meta *m, const char *text, size_t n,
                     const char *finish, int role, size_t lp0, size_t lp1, int calls)
{
    int chat = r->kind == SV_CHAT;
    json_t *o = base_object(r, m, chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    if (chat) {
        json_t *d = json_object();
        if (role)
            json_object_set_new(d, "role", json_string("assistant"));
        if (calls) {
            /* the whole reply at once: its calls (with their index), or its text */
            json_t *content = NULL, *tc = tool_calls(r, &content);
            if (json_array_size(tc)) {
                size_t k;
                json_t *c;
                json_array_foreach(tc, k, c)
                    json_object_set_new(c, "index", json_integer((json_int_t)k));
                json_object_set_new(d, "tool_calls", tc);
                if (!json_is_null(content))
                    json_object_set_new(d, "content", content);
                else
                    json_decref(content);
            } else {
                json_decref(tc);
                json_decref(content);
                json_object_set_new(d, "content", json_text(r->out ? r->out : "", r->out_len));
            }
        } else if (text) {
            json_object_set_new(d, "content", json_text(text, n));
        }
        json_object_set_new(choice, "delta", d);
    } else {
        json_object_set_new(choice, "text", json_text(text ? text : "", text ? n : 0));
    }
    if (lp1 > lp0)
        json_object_set_new(choice, "logprobs", logprobs_object(r, lp0, lp1));
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *arr = json_array();
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
    if (finish) /* the last chunk: the request is done (as llama-server) */
        json_object_set_new(o, "timings", timings_object(r));
    return o;
}


/* ---- the face ------------------------------------------------------------- */

/* j as compact JSON (j consumed); NULL: out of memory */
static char *dump(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

int sv_oai_parse(const sv_config *cfg, uint32_t n_ctx, sv_kind kind, const char *body, size_t len,
                 sv_request *r, sv_oai_error *err)
{
    memset(err, 0, sizeof *err);
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", len, 0, &jerr);
    if (!root)
        return bad(err, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    int rc = parse_fields(cfg, n_ctx, kind, root, r, err);
    json_decref(root);
    return rc;
}

char *sv_oai_error_json(sv_err e, const char *msg, const char *param)
{
    return dump(error_object(e, msg, param));
}

char *sv_oai_response(const sv_request *r, const sv_oai_meta *m)
{
    return dump(full_response(r, m));
}

char *sv_oai_chunk(const sv_request *r, const sv_oai_meta *m, const char *text, size_t n,
                   const char *finish, int role)
{
    return dump(chunk(r, m, text, n, finish, role, 0, 0, 0));
}

char *sv_oai_chunk_ex(const sv_request *r, const sv_oai_meta *m, const char *text, size_t n,
                      size_t lp0, size_t lp1, int calls)
{
    return dump(chunk(r, m, text, n, NULL, 0, lp0, lp1, calls));
}

char *sv_oai_usage_chunk(const sv_request *r, const sv_oai_meta *m)
{
    json_t *u = base_object(r, m, r->kind == SV_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(u, "choices", json_array());
    json_object_set_new(u, "usage", usage_object(r));
    json_object_set_new(u, "timings", timings_object(r));
    return dump(u);
}

char *sv_oai_models(const char *model, uint32_t n_ctx, int64_t created)
{
    json_t *m = json_object(), *l = json_object(), *a = json_array();
    json_object_set_new(m, "id", json_string(model));
    json_object_set_new(m, "object", json_string("model"));
    json_object_set_new(m, "created", json_integer((json_int_t)created));
    json_object_set_new(m, "owned_by", json_string("rebound"));
    json_object_set_new(m, "context_length", json_integer(n_ctx));
    json_array_append_new(a, m);
    json_object_set_new(l, "object", json_string("list"));
    json_object_set_new(l, "data", a);
    return dump(l);
}

/* ---- the utilities ---------------------------------------------------------- */

static int token_list(json_t *j, const char *param, sv_input *in, perr *p)
{
    size_t n = json_array_size(j);
    in->toks = malloc((n ? n : 1) * sizeof *in->toks);
    if (!in->toks)
        return bad(p, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(j, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX)
            return bad(p, param, "'%s'[%zu] must be a token id (an integer >= 0)", param, i);
        in->toks[i] = (int32_t)json_integer_value(t);
    }
    in->n_toks = n;
    return 0;
}

int sv_oai_parse_utility(sv_kind kind, const char *body, size_t len, sv_request *r,
                         sv_oai_error *err)
{
    memset(err, 0, sizeof *err);
    json_error_t jerr;
    json_t *root = json_loadb(body ? body : "", len, 0, &jerr);
    if (!root)
        return bad(err, NULL, "the body is not valid JSON: %s (line %d, column %d)", jerr.text,
                   jerr.line, jerr.column);
    int rc = 0;
    r->kind = kind;
    static const char *const known[][6] = {
        {"content", "add_special", "with_pieces", "parse_special", NULL},
        {"tokens", NULL},
        {"messages", "model", "tools", "tool_choice", NULL},
        {"input", "model", "encoding_format", "user", "dimensions", NULL},
        {NULL}, /* input_tokens: a whole chat request, checked as one */
    };
    const char *const *kn = known[kind - SV_TOKENIZE];
    const char *key;
    json_t *val;
    if (!json_is_object(root)) {
        rc = bad(err, NULL, "the body must be a JSON object, not %s", json_type_name(root));
        goto out;
    }
    json_object_foreach(root, key, val) {
        if (kind == SV_INPUT_TOKENS)
            break;
        int ok = 0;
        for (const char *const *k = kn; *k && !ok; k++)
            ok = !strcmp(*k, key);
        if (!ok) {
            snprintf(err->param_buf, sizeof err->param_buf, "%s", key);
            rc = bad(err, err->param_buf, "'%.60s' is not supported here (it is refused, not "
                     "ignored)", key);
            goto out;
        }
    }
    if (!(r->inputs = calloc(1, sizeof *r->inputs))) {
        rc = bad(err, NULL, "out of memory");
        goto out;
    }
    if (kind == SV_TOKENIZE) {
        json_t *c = json_object_get(root, "content");
        if (!json_is_string(c)) {
            rc = bad(err, "content", "'content' must be a string");
            goto out;
        }
        r->n_inputs = 1;
        if (!(r->inputs[0].text = strdup(json_string_value(c)))) {
            rc = bad(err, NULL, "out of memory");
            goto out;
        }
        if (get_bool(root, "add_special", &r->add_special, err) ||
            get_bool(root, "with_pieces", &r->with_pieces, err)) {
            rc = -1;
            goto out;
        }
    } else if (kind == SV_DETOKENIZE) {
        json_t *t = json_object_get(root, "tokens");
        if (!json_is_array(t)) {
            rc = bad(err, "tokens", "'tokens' must be an array of token ids");
            goto out;
        }
        r->n_inputs = 1;
        rc = token_list(t, "tokens", &r->inputs[0], err);
    } else if (kind == SV_APPLY_TEMPLATE) {
        sv_config cfg;
        memset(&cfg, 0, sizeof cfg);
        json_t *m = json_object_get(root, "messages");
        json_t *only = json_pack("{s:O}", "messages", m ? m : json_null());
        static const char *const extra[] = {"tools", "tool_choice"};
        for (size_t i = 0; i < 2; i++)
            if (json_object_get(root, extra[i]))
                json_object_set(only, extra[i], json_object_get(root, extra[i]));
        rc = parse_fields(&cfg, 1, SV_CHAT, only, r, err);
        json_decref(only);
        r->kind = SV_APPLY_TEMPLATE;
    } else if (kind == SV_INPUT_TOKENS) {
        /* the chat request as /v1/chat/completions reads it (all its checks) */
        sv_config cfg;
        memset(&cfg, 0, sizeof cfg);
        rc = parse_fields(&cfg, UINT32_MAX, SV_CHAT, root, r, err);
        r->kind = SV_INPUT_TOKENS;
    } else {
        json_t *in = json_object_get(root, "input"), *ef = json_object_get(root, "encoding_format");
        json_t *dim = json_object_get(root, "dimensions");
        if (dim && !json_is_null(dim)) {
            rc = bad(err, "dimensions", "'dimensions' is not supported (the model's width is "
                     "fixed)");
            goto out;
        }
        if (ef && !json_is_null(ef)) {
            if (!json_is_string(ef) || (strcmp(json_string_value(ef), "float") &&
                                        strcmp(json_string_value(ef), "base64"))) {
                rc = bad(err, "encoding_format", "'encoding_format' must be float or base64");
                goto out;
            }
            r->is_base64 = !strcmp(json_string_value(ef), "base64");
        }
        /* a string, an array of strings, of token ids, or of arrays of ids */
        size_t n = json_is_array(in) ? json_array_size(in) : 1;
        int is_ids = json_is_array(in) && n && json_is_integer(json_array_get(in, 0));
        if (!in || (!json_is_string(in) && !json_is_array(in)) || n == 0 || n > 2048) {
            rc = bad(err, "input", "'input' must be a string, an array of 1 to 2048 strings, "
                     "an array of token ids or an array of such arrays");
            goto out;
        }
        if (is_ids || json_is_string(in))
            n = 1;
        free(r->inputs);
        if (!(r->inputs = calloc(n, sizeof *r->inputs))) {
            rc = bad(err, NULL, "out of memory");
            goto out;
        }
        r->n_inputs = n;
        for (size_t i = 0; i < n && rc == 0; i++) {
            json_t *x = json_is_string(in) ? in : is_ids ? in : json_array_get(in, i);
            if (json_is_string(x)) {
                if (json_string_length(x) == 0)
                    rc = bad(err, "input", "input[%zu] is empty", i);
                else if (!(r->inputs[i].text = strdup(json_string_value(x))))
                    rc = bad(err, NULL, "out of memory");
            } else if (json_is_array(x)) {
                rc = token_list(x, "input", &r->inputs[i], err);
                if (rc == 0 && r->inputs[i].n_toks == 0)
                    rc = bad(err, "input", "input[%zu] has no tokens", i);
            } else {
                rc = bad(err, "input", "input[%zu] must be a string or an array of token ids", i);
            }
        }
    }
out:
    json_decref(root);
    return rc;
}

static char *tokens_json(const int32_t *toks, size_t n, char *const *pieces, const size_t *lens)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) {
        if (pieces) {
            json_t *o = json_object();
            json_object_set_new(o, "id", json_integer(toks[i]));
            json_object_set_new(o, "piece", json_text(pieces[i] ? pieces[i] : "",
                                                      pieces[i] ? lens[i] : 0));
            json_array_append_new(a, o);
        } else {
            json_array_append_new(a, json_integer(toks[i]));
        }
    }
    return dump(json_pack("{s:o}", "tokens", a));
}

static char *content_json(const char *text, size_t n)
{
    return dump(json_pack("{s:o}", "content", json_text(text, n)));
}

static char *prompt_json(const char *text, size_t n)
{
    return dump(json_pack("{s:o}", "prompt", json_text(text, n)));
}

static char *base64(const unsigned char *p, size_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *o = malloc(4 * ((n + 2) / 3) + 1), *q = o;
    if (!o)
        return NULL;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < n ? p[i + 2] : 0);
        *q++ = tab[v >> 18 & 63];
        *q++ = tab[v >> 12 & 63];
        *q++ = i + 1 < n ? tab[v >> 6 & 63] : '=';
        *q++ = i + 2 < n ? tab[v & 63] : '=';
    }
    *q = 0;
    return o;
}

static char *embeddings_json(const float *vecs, size_t n, uint32_t dim, int is_base64,
                             const char *model, size_t n_tokens)
{
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_object();
        json_object_set_new(e, "object", json_string("embedding"));
        json_object_set_new(e, "index", json_integer((json_int_t)i));
        if (is_base64) {
            /* little-endian float32, as the OpenAI SDKs decode it */
            unsigned char *b = malloc((size_t)dim * 4);
            for (uint32_t k = 0; b && k < dim; k++) {
                uint32_t u;
                memcpy(&u, &vecs[i * dim + k], 4);
                for (int z = 0; z < 4; z++)
                    b[4 * k + (uint32_t)z] = (unsigned char)(u >> (8 * z));
            }
            char *s = b ? base64(b, (size_t)dim * 4) : NULL;
            json_object_set_new(e, "embedding", s ? json_string(s) : json_null());
            free(s);
            free(b);
        } else {
            json_t *v = json_array();
            for (uint32_t k = 0; k < dim; k++)
                json_array_append_new(v, json_real(vecs[i * dim + k]));
            json_object_set_new(e, "embedding", v);
        }
        json_array_append_new(data, e);
    }
    return dump(json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data, "model",
                          model, "usage", "prompt_tokens", (json_int_t)n_tokens, "total_tokens",
                          (json_int_t)n_tokens));
}

char *sv_oai_utility_response(const sv_request *r, const char *model)
{
    switch (r->kind) {
    case SV_TOKENIZE: return tokens_json(r->res_toks, r->n_res_toks, r->res_pieces, r->res_lens);
    case SV_DETOKENIZE: return content_json(r->out ? r->out : "", r->out_len);
    case SV_APPLY_TEMPLATE: return prompt_json(r->out ? r->out : "", r->out_len);
    case SV_INPUT_TOKENS:
        return dump(json_pack("{s:s, s:I}", "object", "response.input_tokens", "input_tokens",
                              (json_int_t)r->n_prompt));
    case SV_EMBED:
        return embeddings_json(r->res_vecs, r->n_inputs, r->res_dim, r->is_base64, model,
                               r->res_n_tokens);
    default: return NULL;
    }
}
