/*
 * serve_http.c - `rebound serve`: an OpenAI-compatible HTTP/1.1 service
 * over one model. This file is the HTTP side and the command: options,
 * the listening socket (TCP, loopback by default, or a Unix socket),
 * libmicrohttpd's connection threads, the JSON of requests and responses
 * (jansson), server-sent events, /metrics. The compute side (the one
 * thread that owns the model and the conversations) is serve_sched.c;
 * serve.h states who owns what.
 *
 * Libraries: libmicrohttpd (GNU, Debian's libmicrohttpd-dev) parses
 * HTTP/1.1 (chunked bodies, keep-alive, limits on header memory and
 * connections) and runs a thread per connection, so a handler may block
 * while its request waits for the scheduler; jansson (libjansson-dev)
 * parses JSON with the line and column of an error, rejects invalid
 * UTF-8, caps nesting, and keeps integers and reals apart, so a wrong
 * type is told from a wrong value.
 *
 * A connection's life: headers (Content-Length over --max-body: 413 at
 * once), the body gathered up to --max-body (413), the API key checked in
 * constant time (401), the JSON checked field by field (400 naming the
 * field), the request queued (429 when --max-queue wait already), then the
 * handler waits for the scheduler: for a stream until the prompt is
 * accepted (so an error still gets its status), then events as the text
 * comes; else until the reply is complete. While it waits it checks every
 * 100 ms whether the client closed the connection; if so the request is
 * cancelled and the scheduler stops it at its next step (the conversation
 * keeps what was computed, consistent).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"

#define CMD "serve"

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

void sv_log(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&log_mu);
    fputs("rebound serve: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    pthread_mutex_unlock(&log_mu);
    va_end(ap);
}

int sv_id_is_valid(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++) {
        char ch = id[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_'))
            return 0;
        if (n >= SV_ID_MAX)
            return 0;
    }
    return n > 0;
}

/* ---- the server's HTTP state --------------------------------------------- */

enum { EP_CHAT, EP_COMPLETIONS, EP_MODELS, EP_HEALTH, EP_METRICS, EP_OTHER, EP_COUNT };
static const char *const ep_names[EP_COUNT] = {"chat_completions", "completions", "models",
                                               "health", "metrics", "other"};

typedef struct http {
    sv_server *srv;
    const char *api_key;      /* NULL: none */
    uint64_t max_body;
    uint32_t n_ctx;
    uint32_t max_conn;        /* connections served; beyond: 503 (the daemon
                                 accepts a few more so that they hear it) */
    uint64_t n_seq;           /* response ids */
    uint32_t n_conn;          /* connections open now */
    pthread_mutex_t mu;       /* n_seq, n_conn */
} http;

static http g_http;           /* read-only after start except n_seq (mu) */

typedef struct conn {
    int endpoint;
    char *body;
    size_t len, cap;
    int too_large;
    int is_post;
    struct MHD_Connection *mc;
    sv_request *req;          /* once queued: our reference */
    /* streaming */
    char *pending;            /* the event being handed to libmicrohttpd */
    size_t p_len, p_off;
    size_t sent;              /* bytes of req->out already in events */
    int stage;
    char id[80];
    time_t created;
} conn;

/* ---- small helpers --------------------------------------------------------- */

/* Valid UTF-8: invalid bytes become U+FFFD. Allocated. */
static char *utf8_clean(const char *s, size_t n, size_t *out_n)
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
    char *c = utf8_clean(s, n, &m);
    json_t *j = c ? json_stringn(c, m) : NULL;
    free(c);
    return j;
}

/* a == b in time that depends only on b's length (the key's) */
static int key_equal(const char *given, const char *key)
{
    size_t ng = strlen(given), nk = strlen(key);
    volatile unsigned char d = (unsigned char)(ng != nk);
    for (size_t i = 0; i < nk; i++)
        d |= (unsigned char)((i < ng ? (unsigned char)given[i] : 0) ^ (unsigned char)key[i]);
    return d == 0;
}

static void count_request(int endpoint, unsigned status)
{
    sv_server *srv = g_http.srv;
    int cls = status >= 200 && status < 600 ? (int)(status / 100) - 2 : 4;
    if (cls < 0)
        cls = 4;
    pthread_mutex_lock(&srv->metrics_mu);
    srv->metrics.requests[endpoint][cls]++;
    pthread_mutex_unlock(&srv->metrics_mu);
}

static enum MHD_Result respond(conn *c, unsigned status, const char *type, char *body,
                               size_t n)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(n, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == SV_ERR_UNAVAILABLE) /* too many connections: this one goes */
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (c->req && c->req->conv_out[0])
        MHD_add_response_header(r, "X-Rebound-Conversation", c->req->conv_out);
    if (c->req && c->req->restore)
        MHD_add_response_header(r, "X-Rebound-Restore", c->req->restore);
    enum MHD_Result ok = MHD_queue_response(c->mc, status, r);
    MHD_destroy_response(r);
    count_request(c->endpoint, status);
    return ok;
}

static enum MHD_Result respond_json(conn *c, unsigned status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s)
        return MHD_NO;
    return respond(c, status, "application/json", s, strlen(s));
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

static enum MHD_Result respond_error(conn *c, sv_err e, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static enum MHD_Result respond_error(conn *c, sv_err e, const char *param, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return respond_json(c, (unsigned)e, error_object(e, msg, param));
}

/* 1 when the peer has closed its end (or the socket is gone). */
static int peer_closed(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 1;
    char b;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Waits until r started (or is done), or until it is done; with have !=
 * (size_t)-1, until it holds more than have bytes of text. 0; 1 when
 * max_s seconds passed first (max_s 0: no limit); -1 when the client left
 * (r is then cancelled). */
static int wait_request(conn *c, int until_done, size_t have, double max_s)
{
    sv_request *r = c->req;
    double last_check = rb_cli_now_s(), t0 = last_check;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->is_done || (!until_done && r->is_started && (have == (size_t)-1 ||
                                                            r->out_len > have)))
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000)
            ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
        /* every 100 ms, also while text keeps coming (a whole reply) */
        double now = rb_cli_now_s();
        if (max_s > 0 && now - t0 >= max_s) {
            pthread_mutex_unlock(&r->mu);
            return 1;
        }
        if (now - last_check >= 0.1) {
            last_check = now;
            if (peer_closed(c->mc)) {
                r->is_cancelled = 1;
                pthread_mutex_unlock(&r->mu);
                return -1;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* ---- request parsing ------------------------------------------------------- */

typedef struct perr {
    sv_err e;
    const char *param;
    char msg[400];
} perr;

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
static int parse_request(sv_server *srv, int endpoint, json_t *root, sv_request *r, perr *p)
{
    if (!json_is_object(root))
        return bad(p, NULL, "the body must be a JSON object, not %s", json_type_name(root));
    r->kind = endpoint == EP_CHAT ? SV_CHAT : SV_COMPLETION;
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
    r->max_tokens = srv->cfg.n_predict;
    const char *mt = json_object_get(root, "max_completion_tokens") ? "max_completion_tokens"
                                                                    : "max_tokens";
    if (get_int(root, mt, 1, g_http.n_ctx, &v, &given, p))
        return -1;
    if (given)
        r->max_tokens = v;
    r->sp = srv->cfg.sampler;
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

static json_t *base_object(conn *c, const char *object)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(c->id));
    json_object_set_new(o, "object", json_string(object));
    json_object_set_new(o, "created", json_integer((json_int_t)c->created));
    json_object_set_new(o, "model", json_string(g_http.srv->cfg.model_name));
    json_object_set_new(o, "conversation_id", json_string(c->req->conv_out));
    if (c->req->restore)
        json_object_set_new(o, "restore", json_string(c->req->restore));
    return o;
}

static const char *finish_name(const sv_request *r)
{
    return r->finish_reason && strcmp(r->finish_reason, "cancelled") ? r->finish_reason : "stop";
}

/* The whole reply, once done. Called with the request done. */
static json_t *full_response(conn *c)
{
    sv_request *r = c->req;
    int chat = r->kind == SV_CHAT;
    json_t *o = base_object(c, chat ? "chat.completion" : "text_completion");
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
    json_object_set_new(choice, "finish_reason", json_string(finish_name(r)));
    json_t *arr = json_array();
    json_array_append_new(arr, choice);
    json_object_set_new(o, "choices", arr);
    json_object_set_new(o, "usage", usage_object(r));
    return o;
}

/* One chunk event: delta text (NULL: none), finish reason (NULL: none). */
static json_t *chunk(conn *c, const char *text, size_t n, const char *finish, int role)
{
    int chat = c->req->kind == SV_CHAT;
    json_t *o = base_object(c, chat ? "chat.completion.chunk" : "text_completion");
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

/* Appends "data: JSON\n\n" (j consumed; NULL: "data: [DONE]") to pending. */
static int add_event(conn *c, json_t *j)
{
    char *s = NULL;
    if (j) {
        s = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        if (!s)
            return -1;
    }
    const char *body = s ? s : "[DONE]";
    size_t n = strlen(body) + 8;
    char *q = realloc(c->pending, c->p_len + n + 1);
    if (!q) {
        free(s);
        return -1;
    }
    c->pending = q;
    c->p_len += (size_t)snprintf(q + c->p_len, n + 1, "data: %s\n\n", body);
    free(s);
    return 0;
}

enum { ST_ROLE, ST_TEXT, ST_END, ST_DONE };
#define SV_KEEPALIVE_S 10.0 /* well within the 60 s idle timeout below */

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    conn *c = cls;
    sv_request *r = c->req;
    (void)pos;
    for (;;) {
        if (c->p_off < c->p_len) {
            size_t n = c->p_len - c->p_off < max ? c->p_len - c->p_off : max;
            memcpy(buf, c->pending + c->p_off, n);
            c->p_off += n;
            return (ssize_t)n;
        }
        c->p_off = c->p_len = 0;
        if (c->stage == ST_DONE)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (c->stage == ST_ROLE) {
            c->stage = ST_TEXT;
            if (r->kind == SV_CHAT && add_event(c, chunk(c, NULL, 0, NULL, 1)))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        if (c->stage == ST_TEXT) {
            /* a long prefill sends nothing for a while: a comment line
               every SV_KEEPALIVE_S keeps the connection within
               libmicrohttpd's idle timeout (and proxies'); SSE clients
               skip lines that start with ':' */
            int w = wait_request(c, 0, c->sent, SV_KEEPALIVE_S);
            if (w < 0)
                return MHD_CONTENT_READER_END_WITH_ERROR; /* the client left */
            if (w > 0) {
                static const char ka[] = ": keep-alive\n\n";
                if (max < sizeof ka - 1)
                    continue;
                memcpy(buf, ka, sizeof ka - 1);
                return (ssize_t)(sizeof ka - 1);
            }
            pthread_mutex_lock(&r->mu);
            size_t n = r->out_len - c->sent;
            char *t = n ? malloc(n) : NULL;
            if (t)
                memcpy(t, r->out + c->sent, n);
            int done = r->is_done;
            pthread_mutex_unlock(&r->mu);
            if (n && !t)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            c->sent += n;
            if (n) {
                int rc = add_event(c, chunk(c, t, n, NULL, 0));
                free(t);
                if (rc)
                    return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (done && c->sent == r->out_len)
                c->stage = ST_END;
            continue;
        }
        /* ST_END: the request is done and all its text was sent */
        c->stage = ST_DONE;
        int rc;
        if (r->err != SV_ERR_NONE) {
            rc = add_event(c, error_object(r->err, r->errmsg, NULL));
        } else {
            rc = add_event(c, chunk(c, NULL, 0, finish_name(r), 0));
            if (!rc && r->include_usage) {
                json_t *u = base_object(c, r->kind == SV_CHAT ? "chat.completion.chunk"
                                                              : "text_completion");
                json_object_set_new(u, "choices", json_array());
                json_object_set_new(u, "usage", usage_object(r));
                rc = add_event(c, u);
            }
        }
        if (rc || add_event(c, NULL))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* ---- /metrics ---------------------------------------------------------- */

static enum MHD_Result metrics_page(conn *c)
{
    sv_server *srv = g_http.srv;
    pthread_mutex_lock(&srv->metrics_mu);
    sv_metrics m = srv->metrics;
    pthread_mutex_unlock(&srv->metrics_mu);
    static const char *const cls[] = {"2xx", "3xx", "4xx", "5xx", "other"};
    static const double le[SV_TTFT_BUCKETS] = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return MHD_NO;
    fprintf(f, "# HELP rebound_requests_total HTTP requests answered, by endpoint and status class.\n"
               "# TYPE rebound_requests_total counter\n");
    for (int e = 0; e < EP_COUNT; e++)
        for (int k = 0; k < 5; k++)
            fprintf(f, "rebound_requests_total{endpoint=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                    ep_names[e], cls[k], m.requests[e][k]);
    fprintf(f, "# HELP rebound_requests_in_flight Generation requests queued or running.\n"
               "# TYPE rebound_requests_in_flight gauge\nrebound_requests_in_flight %" PRIu64 "\n",
            m.in_flight);
    fprintf(f, "# HELP rebound_requests_cancelled_total Requests whose client left before the end.\n"
               "# TYPE rebound_requests_cancelled_total counter\n"
               "rebound_requests_cancelled_total %" PRIu64 "\n", m.cancelled);
    fprintf(f, "# HELP rebound_tokens_total Tokens: prompt (all), cached (of the prompt, not "
               "computed again), completion.\n# TYPE rebound_tokens_total counter\n"
               "rebound_tokens_total{kind=\"prompt\"} %" PRIu64 "\n"
               "rebound_tokens_total{kind=\"cached\"} %" PRIu64 "\n"
               "rebound_tokens_total{kind=\"completion\"} %" PRIu64 "\n",
            m.tokens_prompt, m.tokens_cached, m.tokens_completion);
    fprintf(f, "# HELP rebound_decode_passes_total Decode steps: forward passes of one "
               "stream, and of several concurrent streams in one pass.\n"
               "# TYPE rebound_decode_passes_total counter\n"
               "rebound_decode_passes_total{streams=\"1\"} %" PRIu64 "\n"
               "rebound_decode_passes_total{streams=\"several\"} %" PRIu64 "\n",
            m.decode_passes_single, m.decode_passes_multi);
    fprintf(f, "# HELP rebound_conversation_restores_total Where a request found its "
               "conversation's KV: resident (all in RAM), compressed (some in the compressed "
               "RAM tier), stored (some on storage), file (reopened from its session file), "
               "new, recomputed (computed again from its tokens).\n"
               "# TYPE rebound_conversation_restores_total counter\n");
    for (int k = SV_RESTORE_RESIDENT; k <= SV_RESTORE_RECOMPUTED; k++)
        fprintf(f, "rebound_conversation_restores_total{path=\"%s\"} %" PRIu64 "\n",
                sv_restore_name((sv_restore)k), m.restores[k]);
    fprintf(f, "# HELP rebound_conversations Conversations by where they are: open (a session "
               "in RAM), stored (a session file), total.\n# TYPE rebound_conversations gauge\n"
               "rebound_conversations{state=\"open\"} %" PRIu64 "\n"
               "rebound_conversations{state=\"stored\"} %" PRIu64 "\n"
               "rebound_conversations{state=\"total\"} %" PRIu64 "\n",
            m.mem.n_conv_open, m.mem.n_conv_stored, m.mem.n_conv_total);
    fprintf(f, "# HELP rebound_conversations_deleted_total Conversations deleted to keep the "
               "count and disk limits, oldest first.\n"
               "# TYPE rebound_conversations_deleted_total counter\n"
               "rebound_conversations_deleted_total %" PRIu64 "\n"
               "# HELP rebound_conversations_closed_total Idle sessions closed (kept in their "
               "file) for --max-open or --mem-budget.\n"
               "# TYPE rebound_conversations_closed_total counter\n"
               "rebound_conversations_closed_total %" PRIu64 "\n", m.conv_evicted, m.conv_closed);
    fprintf(f, "# HELP rebound_memory_bytes Memory of the open sessions by kind and tier "
               "(weights counted once: the model's one buffer).\n"
               "# TYPE rebound_memory_bytes gauge\n"
               "rebound_memory_bytes{kind=\"weights\",tier=\"resident\"} %" PRIu64 "\n"
               "rebound_memory_bytes{kind=\"kv\",tier=\"resident\"} %" PRIu64 "\n"
               "rebound_memory_bytes{kind=\"kv\",tier=\"compressed\"} %" PRIu64 "\n"
               "rebound_memory_bytes{kind=\"kv\",tier=\"stored\"} %" PRIu64 "\n"
               "rebound_memory_bytes{kind=\"kv\",tier=\"dropped\"} %" PRIu64 "\n"
               "rebound_memory_bytes{kind=\"scratch\",tier=\"resident\"} %" PRIu64 "\n"
               "rebound_memory_bytes{kind=\"other\",tier=\"resident\"} %" PRIu64 "\n",
            m.mem.weights_bytes, m.mem.kv_resident_bytes, m.mem.kv_compressed_bytes,
            m.mem.kv_stored_bytes, m.mem.kv_dropped_bytes, m.mem.scratch_bytes, m.mem.other_bytes);
    fprintf(f, "# HELP rebound_pool_bytes The memory pool (one budget over the weights and "
               "every session): total as it counts, over the budget after its last check, "
               "taken from sessions, weights released (the last two since the start).\n"
               "# TYPE rebound_pool_bytes gauge\n"
               "rebound_pool_bytes{what=\"total\"} %" PRIu64 "\n"
               "rebound_pool_bytes{what=\"over\"} %" PRIu64 "\n"
               "rebound_pool_bytes{what=\"trimmed\"} %" PRIu64 "\n"
               "rebound_pool_bytes{what=\"weights_released\"} %" PRIu64 "\n",
            m.mem.pool_total_bytes, m.mem.pool_over_bytes, m.mem.pool_trimmed_bytes,
            m.mem.pool_weights_released_bytes);
    fprintf(f, "# HELP rebound_memory_budget_bytes --mem-budget (0: none).\n"
               "# TYPE rebound_memory_budget_bytes gauge\nrebound_memory_budget_bytes %" PRIu64 "\n"
               "# HELP rebound_sessions_disk_bytes Bytes of the conversations' session files.\n"
               "# TYPE rebound_sessions_disk_bytes gauge\nrebound_sessions_disk_bytes %" PRIu64 "\n",
            srv->cfg.mem_budget_bytes, m.mem.disk_bytes);
    fprintf(f, "# HELP rebound_ttft_seconds Time from a request's arrival to its first "
               "token.\n# TYPE rebound_ttft_seconds histogram\n");
    for (int i = 0; i < SV_TTFT_BUCKETS; i++)
        fprintf(f, "rebound_ttft_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", le[i], m.ttft_bucket[i]);
    fprintf(f, "rebound_ttft_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n"
               "rebound_ttft_seconds_sum %.6f\nrebound_ttft_seconds_count %" PRIu64 "\n",
            m.ttft_count, m.ttft_sum_s, m.ttft_count);
    if (fclose(f) != 0) {
        free(buf);
        return MHD_NO;
    }
    return respond(c, 200, "text/plain; version=0.0.4", buf, n);
}

/* ---- the handler ----------------------------------------------------------- */

static int route(const char *url)
{
    static const struct { const char *path; int ep; } routes[] = {
        {"/v1/chat/completions", EP_CHAT}, {"/chat/completions", EP_CHAT},
        {"/v1/completions", EP_COMPLETIONS}, {"/completions", EP_COMPLETIONS},
        {"/v1/models", EP_MODELS}, {"/models", EP_MODELS},
        {"/health", EP_HEALTH}, {"/metrics", EP_METRICS},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path))
            return routes[i].ep;
    return EP_OTHER;
}

static void in_flight_add(int d)
{
    sv_server *srv = g_http.srv;
    pthread_mutex_lock(&srv->metrics_mu);
    srv->metrics.in_flight += (uint64_t)(int64_t)d;
    pthread_mutex_unlock(&srv->metrics_mu);
}

static enum MHD_Result generate(conn *c)
{
    sv_server *srv = g_http.srv;
    json_error_t jerr;
    json_t *root = json_loadb(c->body ? c->body : "", c->len, 0, &jerr);
    if (!root)
        return respond_error(c, SV_ERR_INVALID, NULL, "the body is not valid JSON: %s (line %d, "
                             "column %d)", jerr.text, jerr.line, jerr.column);
    sv_request *r = calloc(1, sizeof *r);
    if (!r) {
        json_decref(root);
        return respond_error(c, SV_ERR_UNAVAILABLE, NULL, "out of memory");
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->t_arrival = rb_cli_now_s();
    perr p = {0};
    int rc = parse_request(srv, c->endpoint, root, r, &p);
    json_decref(root);
    if (rc) {
        sv_request_release(r);
        return respond_json(c, (unsigned)p.e, error_object(p.e, p.msg, p.param));
    }
    sv_err e = sv_sched_submit(srv->sched, r);
    if (e != SV_ERR_NONE) {
        sv_request_release(r);
        return e == SV_ERR_BUSY
                   ? respond_error(c, e, NULL, "too many requests in flight (--parallel %" PRIu32
                                   " + --max-queue %" PRIu32 "); retry later",
                                   srv->cfg.parallel, srv->cfg.max_queue)
                   : respond_error(c, e, NULL, "the server is stopping");
    }
    c->req = r;
    in_flight_add(1);
    pthread_mutex_lock(&g_http.mu);
    uint64_t seq = ++g_http.n_seq;
    pthread_mutex_unlock(&g_http.mu);
    snprintf(c->id, sizeof c->id, "%s-%" PRIu64, r->kind == SV_CHAT ? "chatcmpl" : "cmpl", seq);
    c->created = time(NULL);
    if (wait_request(c, !r->stream, (size_t)-1, 0) != 0)
        return MHD_NO; /* the client left: cancelled */
    if (r->err != SV_ERR_NONE && (!r->is_started || !r->stream)) /* is_done: stable */
        return respond_error(c, r->err, NULL, "%s", r->errmsg);
    if (!r->stream)
        return respond_json(c, 200, full_response(c));
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, c, NULL);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Rebound-Conversation", r->conv_out);
    if (r->restore)
        MHD_add_response_header(resp, "X-Rebound-Restore", r->restore);
    enum MHD_Result ok = MHD_queue_response(c->mc, 200, resp);
    MHD_destroy_response(resp);
    count_request(c->endpoint, 200);
    return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    (void)cls, (void)version;
    conn *c = *con_cls;
    if (!c) { /* the headers are in */
        if (!(c = calloc(1, sizeof *c)))
            return MHD_NO;
        *con_cls = c;
        c->mc = mc;
        c->endpoint = route(url);
        c->is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
        pthread_mutex_lock(&g_http.mu);
        uint32_t n_conn = g_http.n_conn;
        pthread_mutex_unlock(&g_http.mu);
        if (n_conn > g_http.max_conn)
            return respond_error(c, SV_ERR_UNAVAILABLE, NULL, "too many connections (%" PRIu32
                                 " open, --max-connections %" PRIu32 "); retry later", n_conn,
                                 g_http.max_conn);
        if (c->is_post) {
            const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                         MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > g_http.max_body)
                return respond_error(c, SV_ERR_TOO_LARGE, NULL, "the body has %s bytes; "
                                     "--max-body is %" PRIu64, cl, g_http.max_body);
            return MHD_YES;
        }
    }
    if (c->is_post && *upload_size) {
        if (!c->too_large && c->len + *upload_size > g_http.max_body)
            c->too_large = 1;
        if (!c->too_large) {
            if (c->len + *upload_size + 1 > c->cap) {
                size_t cap = c->cap ? c->cap : 4096;
                while (cap < c->len + *upload_size + 1)
                    cap *= 2;
                char *b = realloc(c->body, cap);
                if (!b)
                    return MHD_NO;
                c->body = b, c->cap = cap;
            }
            memcpy(c->body + c->len, upload, *upload_size);
            c->len += *upload_size;
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->too_large)
        return respond_error(c, SV_ERR_TOO_LARGE, NULL, "the body is larger than --max-body "
                             "(%" PRIu64 " bytes)", g_http.max_body);
    if (c->endpoint == EP_OTHER)
        return respond_error(c, SV_ERR_NOT_FOUND, NULL, "no endpoint %.200s (rebound serves "
                             "/v1/chat/completions, /v1/completions, /v1/models, /health, "
                             "/metrics)", url);
    int wants_post = c->endpoint == EP_CHAT || c->endpoint == EP_COMPLETIONS;
    if (wants_post != c->is_post || (!c->is_post && strcmp(method, MHD_HTTP_METHOD_GET) &&
                                     strcmp(method, MHD_HTTP_METHOD_HEAD)))
        return respond_error(c, SV_ERR_METHOD, NULL, "%.20s %.200s: use %s", method, url,
                             wants_post ? "POST" : "GET");
    if (c->endpoint == EP_HEALTH) {
        char *b = strdup("{\"status\":\"ok\"}");
        return b ? respond(c, 200, "application/json", b, strlen(b)) : MHD_NO;
    }
    if (g_http.api_key && c->endpoint != EP_METRICS) {
        const char *h = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                    MHD_HTTP_HEADER_AUTHORIZATION);
        const char *given = h && !strncmp(h, "Bearer ", 7) ? h + 7 : "";
        if (!key_equal(given, g_http.api_key))
            return respond_error(c, SV_ERR_AUTH, NULL, "%s", h ? "the API key is not this "
                                 "server's" : "an API key is required (Authorization: Bearer KEY)");
    }
    if (c->endpoint == EP_METRICS)
        return metrics_page(c);
    if (c->endpoint == EP_MODELS) {
        json_t *m = json_object(), *l = json_object(), *a = json_array();
        json_object_set_new(m, "id", json_string(g_http.srv->cfg.model_name));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer((json_int_t)time(NULL)));
        json_object_set_new(m, "owned_by", json_string("rebound"));
        json_object_set_new(m, "context_length", json_integer(g_http.n_ctx));
        json_array_append_new(a, m);
        json_object_set_new(l, "object", json_string("list"));
        json_object_set_new(l, "data", a);
        return respond_json(c, 200, l);
    }
    return generate(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls, (void)mc, (void)toe;
    conn *c = *con_cls;
    if (!c)
        return;
    if (c->req) {
        pthread_mutex_lock(&c->req->mu);
        if (!c->req->is_done)
            c->req->is_cancelled = 1; /* the client left mid-stream */
        pthread_mutex_unlock(&c->req->mu);
        sv_request_release(c->req);
        in_flight_add(-1);
    }
    free(c->body);
    free(c->pending);
    free(c);
    *con_cls = NULL;
}

static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    (void)cls, (void)mc, (void)socket_context;
    pthread_mutex_lock(&g_http.mu);
    if (toe == MHD_CONNECTION_NOTIFY_STARTED)
        g_http.n_conn++;
    else if (g_http.n_conn > 0)
        g_http.n_conn--;
    pthread_mutex_unlock(&g_http.mu);
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    sv_log("http: %s", msg);
}

/* ---- the command ----------------------------------------------------------- */

static int listen_unix(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        fprintf(stderr, "rebound serve: error: --unix path is longer than %zu bytes\n",
                sizeof a.sun_path - 1);
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            fprintf(stderr, "rebound serve: error: --unix %s exists and is not a socket\n", path);
            return -1;
        }
        unlink(path); /* a socket left by an earlier server */
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || chmod(path, 0600) != 0 ||
        listen(fd, 128) != 0) {
        fprintf(stderr, "rebound serve: error: --unix %s: %s\n", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

static int opt_api_key(void *dest, const char *v, char *why, size_t why_n)
{
    if (!*v || strlen(v) > 1024) {
        snprintf(why, why_n, "a key of 1 to 1024 characters");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

/* --baseline: "recompute" (idle conversations keep no KV) or "none" */
static int opt_baseline(void *dest, const char *v, char *why, size_t why_n)
{
    if (strcmp(v, "recompute") && strcmp(v, "none")) {
        snprintf(why, why_n, "recompute or none");
        return -1;
    }
    *(int *)dest = !strcmp(v, "recompute");
    return 0;
}

int rb_cmd_serve(int argc, char **argv)
{
    sv_server srv = {0};
    sv_config *cfg = &srv.cfg;
    const char *host = "127.0.0.1", *unix_path = NULL, *alias = NULL;
    int port = 8080, use_mmap = 0, seed_given = 0;
    uint64_t max_body = 4u << 20, mem_budget = 0, max_disk = 0;
    uint32_t max_conv = 64, max_open = 4, parallel = 4, max_queue = 64, max_conn = 64;
    int64_t n_predict = -1;
    cfg->sp = rb_session_default_params();
    cfg->sampler = rb_sampler_default_params();
    const char *api_key = NULL;
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &cfg->model_path, 0, 0, NULL, NULL},
        {"--alias", RB_OPT_STR, "NAME", "the model's id in /v1/models (default: the file's name)",
         &alias, 0, 0, NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "listening:", NULL, 0, 0, NULL, NULL},
        {"--host", RB_OPT_STR, "ADDR", "IPv4 or IPv6 address to listen on (default 127.0.0.1: "
         "this machine only)", &host, 0, 0, NULL, NULL},
        {"--port", RB_OPT_INT, "N", "TCP port (default 8080; 0: any free port, printed)", &port,
         0, 65535, NULL, NULL},
        {"--unix", RB_OPT_STR, "PATH", "listen on a Unix socket instead (mode 0600)", &unix_path,
         0, 0, NULL, NULL},
        {"--api-key", RB_OPT_CALL, "KEY", "require Authorization: Bearer KEY on /v1/* (compared "
         "in constant time)", &api_key, 0, 0, opt_api_key, NULL},
        {"--max-body", RB_OPT_SIZE, "BYTES", "largest request body (K/M/G; default 4M): 413 beyond",
         &max_body, 1, 1e12, NULL, NULL},
        {"--max-connections", RB_OPT_U32, "N", "connections served at once (default 64); a few "
         "more hear 503,\nthe rest are refused", &max_conn, 1, 4096, NULL, NULL},
        {"-np|--parallel", RB_OPT_U32, "N", "requests computed at once (default 4): their decode "
         "steps run\nas one forward pass, their prompts in chunks between the steps", &parallel, 1, 256, NULL, NULL},
        {"--max-queue", RB_OPT_U32, "N", "requests waiting beyond those (default 64): 429 beyond",
         &max_queue, 0, 1e6, NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "conversations:", NULL, 0, 0, NULL, NULL},
        {"--sessions", RB_OPT_STR, "DIR", "keep every conversation in DIR as a session file: "
         "they survive a\nkill and a restart (default: in RAM only)", &cfg->sessions_dir, 0, 0,
         NULL, NULL},
        {"--max-conversations", RB_OPT_U32, "N", "conversations kept (default 64); the least "
         "recently used are deleted", &max_conv, 1, 1e6, NULL, NULL},
        {"--max-disk", RB_OPT_SIZE, "BYTES", "bytes of session files in all (K/M/G; default: no "
         "limit)", &max_disk, 1, 1e19, NULL, NULL},
        {"--max-open", RB_OPT_U32, "N", "sessions open in RAM at once (default 4; at least "
         "--parallel)", &max_open, 1, 4096, NULL, NULL},
        {"--mem-budget", RB_OPT_SIZE, "BYTES", "the memory pool's budget over the weights and every "
         "open session (K/M/G):\nbeyond it the idle conversations' KV goes first (least "
         "recently used),\nthen weights; idle sessions are closed when that is not enough",
         &mem_budget, 1, 1e19, NULL, NULL},
        {"--pressure", RB_OPT_FLAG, NULL, "trim the pool on the kernel's memory pressure "
         "signals (PSI or the cgroup's\nlevels: low -> the last quarter of the layers' KV, "
         "medium -> half, critical -> all\nand the weights)", &cfg->watch_pressure, 0, 0, NULL,
         NULL},
        {"--baseline", RB_OPT_CALL, "MODE", "recompute: an idle conversation keeps no KV and a "
         "returning one is\ncomputed again from its tokens (what a server without tiers "
         "pays;\nbench-serve compares the two); none (default)", &cfg->baseline_recompute, 0,
         0, opt_baseline, NULL},
        {"--chat-template|--template", RB_OPT_STR, "NAME", "chat format (default: the model's)",
         &cfg->chat_template, 0, 0, NULL, NULL},
        {"-n|--n-predict", RB_OPT_I64, "N", "default max_tokens (default -1: until the model "
         "ends or the context is full)", &n_predict, -1, 9.2e18, NULL, NULL},
        {"--mmap", RB_OPT_FLAG, NULL, "map the model file instead of reading it", &use_mmap, 0, 0,
         NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "each conversation's session:", NULL, 0, 0, NULL, NULL},
        {"-c|--ctx-size", RB_OPT_U32, "N", "context length (default: the model's trained context)",
         &cfg->sp.n_ctx, 0, 0, NULL, NULL},
        {"-b|--batch-size", RB_OPT_CALL, "N", "prefill chunk (default 128): a long prompt is "
         "computed in\nchunks between the other requests' tokens", &cfg->sp.n_batch, 0, 0,
         rb_cli_opt_batch, NULL},
        {"-t|--threads", RB_OPT_INT, "N", "threads (default: all cores)", &cfg->sp.n_threads, 0,
         256, NULL, NULL},
        {"--device", RB_OPT_CALL, "D", "storage profile for the memory manager: phone, watch, host",
         &cfg->sp, 0, 0, rb_cli_opt_device, NULL},
        {"-ctk|--cache-type-k", RB_OPT_CALL, "T", "KV cache type of K: f16 (default), q8_0, q4_0",
         &cfg->sp.kv_type_k, 0, 0, rb_cli_opt_kv_type, NULL},
        {"-ctv|--cache-type-v", RB_OPT_CALL, "T", "the same for V", &cfg->sp.kv_type_v, 0, 0,
         rb_cli_opt_kv_type, NULL},
        {"--spill-dir", RB_OPT_STR, "DIR", "where evicted KV goes on storage (default $TMPDIR or "
         "/tmp)", &cfg->sp.spill_dir, 0, 0, NULL, NULL},
        RB_CLI_SAMPLER_OPTS(&cfg->sampler, &seed_given),
        {0},
    };
    const rb_cli_cmd cmd = {
        CMD, "-m MODEL [options]",
        "An OpenAI-compatible HTTP service on one model: POST /v1/chat/completions\n"
        "and /v1/completions (stream as server-sent events), GET /v1/models,\n"
        "/health and /metrics (Prometheus). A request continues the stored\n"
        "conversation that shares the longest token prefix with it (or the one its\n"
        "\"conversation_id\" names): only new tokens are computed. The sampling\n"
        "options are the defaults of requests that do not set them.",
        opts,
        "example:\n"
        "  rebound serve -m model.gguf --sessions convs &\n"
        "  curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n",
        NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (!cfg->model_path)
        return rb_cli_usage_error(CMD, "no model given (-m MODEL)",
                                  "rebound make-model --shape tiny -o m.gguf");
    if (cfg->chat_template && rb_chat_template_from_name(cfg->chat_template) < 0) {
        char msg[160], hint[128];
        snprintf(msg, sizeof msg, "unknown --chat-template '%s'", cfg->chat_template);
        snprintf(hint, sizeof hint, "known templates: %s", rb_chat_template_names());
        return rb_cli_usage_error(CMD, msg, hint);
    }
    if (max_open < parallel) {
        char msg[128];
        snprintf(msg, sizeof msg, "--max-open %" PRIu32 " is below --parallel %" PRIu32,
                 max_open, parallel);
        return rb_cli_usage_error(CMD, msg, NULL);
    }
    cfg->n_predict = n_predict;
    cfg->mem_budget_bytes = mem_budget;
    cfg->max_conversations = max_conv;
    cfg->max_disk_bytes = max_disk;
    cfg->max_open = max_open;
    cfg->parallel = parallel;
    cfg->max_queue = max_queue;
    cfg->has_seed = seed_given; /* else each request without a seed gets a random one */
    const char *base = strrchr(cfg->model_path, '/');
    cfg->model_name = alias ? alias : base ? base + 1 : cfg->model_path;

    rb_error err;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = use_mmap;
    if (rb_model_open(cfg->model_path, &mp, &srv.model, &err) != RB_OK)
        return rb_cli_fail(CMD, err.message, NULL);
    rb_cli_warn_ctx(CMD, srv.model, cfg->sp.n_ctx);
    pthread_mutex_init(&srv.metrics_mu, NULL);
    pthread_mutex_init(&g_http.mu, NULL);

    /* the signals that stop the server go to this thread alone (sigwait);
       the threads started below inherit the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1, unix_fd = -1;
    struct MHD_Daemon *d = NULL;
    if (sv_sched_start(&srv))
        goto done;
    g_http.srv = &srv;
    g_http.api_key = api_key;
    g_http.max_body = max_body;
    g_http.max_conn = max_conn;
    g_http.n_ctx = cfg->sp.n_ctx;

    unsigned flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    if (unix_path) {
        if ((unix_fd = listen_unix(unix_path)) < 0)
            goto done;
    } else if (strchr(host, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&sa;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1) {
            rc = rb_cli_usage_error(CMD, "--host is not an IPv6 address", NULL);
            goto done;
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&sa;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, host, &a4->sin_addr) != 1) {
            rc = rb_cli_usage_error(CMD, "--host is not an IPv4 address (give a number such as "
                                    "127.0.0.1 or 0.0.0.0)", NULL);
            goto done;
        }
    }
    struct MHD_OptionItem listen_opt[] = {
        unix_fd >= 0 ? (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, unix_fd, NULL}
                     : (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, &sa},
        {MHD_OPTION_END, 0, NULL},
    };
    d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, &srv,
                         MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                         MHD_OPTION_ARRAY, listen_opt,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn + 8,
                         MHD_OPTION_NOTIFY_CONNECTION, on_connection, NULL,
                         MHD_OPTION_CONNECTION_TIMEOUT, 60u,
                         MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                         MHD_OPTION_END);
    if (!d) {
        if (unix_path)
            fprintf(stderr, "rebound serve: error: cannot serve on %s\n", unix_path);
        else
            fprintf(stderr, "rebound serve: error: cannot listen on %s port %d: %s\n", host, port,
                    strerror(errno));
        if (!unix_path)
            fprintf(stderr, "hint: another server may use the port; --port 0 picks a free one\n");
        goto done;
    }
    if (unix_path) {
        sv_log("listening on unix:%s (model %s, context %" PRIu32 ", parallel %" PRIu32 ")",
               unix_path, cfg->model_name, cfg->sp.n_ctx, parallel);
    } else {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        int bound = di ? (int)di->port : port;
        sv_log("listening on http://%s%s%s:%d (model %s, context %" PRIu32 ", parallel %" PRIu32
               ")", strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", bound,
               cfg->model_name, cfg->sp.n_ctx, parallel);
    }
    if (!cfg->sessions_dir)
        sv_log("note: no --sessions folder: conversations live in RAM only and end with the "
               "server");
    int sig = 0;
    sigwait(&sigs, &sig);
    sv_log("%s: stopping (running requests end; conversations are saved)",
           sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    /* the scheduler first: it ends the waiting handlers, so that the
       daemon's connection threads can be joined */
    sv_sched_stop(srv.sched);
    if (d)
        MHD_stop_daemon(d);
    sv_sched_free(srv.sched);
    if (unix_fd >= 0) {
        close(unix_fd);
        unlink(unix_path);
    }
    rb_model_close(srv.model);
    pthread_mutex_destroy(&srv.metrics_mu);
    return rc;
}
