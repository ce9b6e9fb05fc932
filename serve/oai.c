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

/* The request's fields into r; -1 with p filled when one is wrong. */
static int parse_fields(const sv_config *cfg, uint32_t n_ctx, sv_kind kind, json_t *root,
                        sv_request *r, perr *p)
{
    if (!json_is_object(root))
        return bad(p, NULL, "the body must be a JSON object, not %s", json_type_name(root));
    r->kind = kind;
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
        if (!(r->msgs = calloc(n, sizeof *r->msgs)))
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
            if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant"))
                return bad(p, "messages", "messages[%zu].role '%.40s' is not system, user or "
                           "assistant", i, rs);
            char *content = content_text(json_object_get(msg, "content"), i, p);
            if (!content)
                return -1;
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
    float ignored = 0;
    if (get_num(root, "presence_penalty", -2, 2, &ignored, p) ||
        get_num(root, "frequency_penalty", -2, 2, &ignored, p))
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

const char *sv_oai_finish_name(const sv_request *r)
{
    return r->finish_reason && strcmp(r->finish_reason, "cancelled") ? r->finish_reason : "stop";
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
        json_object_set_new(m, "content", text);
        json_object_set_new(choice, "message", m);
    } else {
        json_object_set_new(choice, "text", text);
        json_object_set_new(choice, "logprobs", json_null());
    }
    json_object_set_new(choice, "finish_reason", json_string(sv_oai_finish_name(r)));
    json_t *arr = json_array();
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_object(r));
    return o;
}

/* One chunk event: delta text (NULL: none), finish reason (NULL: none). */
static json_t *chunk(const sv_request *r, const sv_oai_meta *m, const char *text, size_t n,
                     const char *finish, int role)
{
    int chat = r->kind == SV_CHAT;
    json_t *o = base_object(r, m, chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = json_object();
    json_object_set_new(choice, "index", json_integer(0));
    if (chat) {
        json_t *d = json_object();
        if (role)
            json_object_set_new(d, "role", json_string("assistant"));
        if (text)
            json_object_set_new(d, "content", json_text(text, n));
        json_object_set_new(choice, "delta", d);
    } else {
        json_object_set_new(choice, "text", json_text(text ? text : "", text ? n : 0));
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_t *arr = json_array();
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
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
    return dump(chunk(r, m, text, n, finish, role));
}

char *sv_oai_usage_chunk(const sv_request *r, const sv_oai_meta *m)
{
    json_t *u = base_object(r, m, r->kind == SV_CHAT ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(u, "choices", json_array());
    json_object_set_new(u, "usage", usage_object(r));
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
