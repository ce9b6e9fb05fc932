/*
 * http.c - `rebound serve`'s HTTP/1.1 side (http.h), on libmicrohttpd
 * (GNU, Debian's libmicrohttpd-dev): it parses HTTP/1.1 (chunked bodies,
 * keep-alive, limits on header memory and connections) and runs a thread
 * per connection, so a handler may block while its request waits for the
 * scheduler. The JSON is oai.c's; the request's compute is scheduler.c's.
 *
 * A connection's life: accepted (on_connection: its peer, an address or a
 * Unix uid; over --max-connections-per-peer it is shut down at once; its
 * request's deadline set), the headers (a NUL in one, Content-Length with
 * Transfer-Encoding: 400; a Content-Length over --max-body or over what a
 * prompt that fits the context can take: 413 before any byte is kept; its
 * bytes counted against --max-inflight: 503 + Retry-After), the body, the
 * namespace (the API key's, compared in constant time with every key:
 * 401; or the Unix peer's uid), the JSON checked field by field
 * (sv_oai_parse: 400 naming the field), the body freed, the prompt
 * tokenized here (sv_sched_prepare: never on the scheduler), the request
 * queued (429 + Retry-After when --max-queue wait already), then the
 * handler waits for the scheduler: for a stream until the prompt is
 * accepted (so an error still gets its status), then events as the text
 * comes; else until the reply is complete. While it waits it checks every
 * 100 ms whether the client left (peer_closed: a half-closed client is
 * still answered); if so the request is cancelled and the scheduler stops
 * it at its next step (the conversation keeps what was computed).
 * The watchdog thread shuts down a connection whose request's head and
 * body have not arrived within --request-timeout of its start (or of the
 * previous answer on a kept-alive connection).
 *
 * State: the server's sv_http (the closure of every callback: no global),
 * one sv_peer per connection (libmicrohttpd's socket context, in the
 * watchdog's list) and one conn per request (the request context pointer),
 * freed when libmicrohttpd says the request completed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "oai.h"

/* One connection (libmicrohttpd's socket context), from its accept to its
 * close: whom it comes from and the deadline of the request it is sending. */
typedef struct sv_peer {
    struct sv_peer *prev, *next;  /* sv_http.peers, under sv_http.mu */
    int fd;                       /* a dup of the connection's socket, ours: the
                                     watchdog shuts it down (never another's
                                     socket: the number is ours until we close it) */
    char who[64];                 /* the address, or "uid N" (the per-peer cap) */
    char uid_ns[SV_NS_MAX + 1];   /* a Unix peer's namespace "uid<N>"; "" for TCP */
    double deadline;              /* the request's head and body by then (monotonic
                                     s); 0: none, the server's turn (under mu) */
    int is_refused;               /* over the per-peer cap: shut down at once */
} sv_peer;

struct sv_http {
    const sv_config *cfg;     /* borrowed */
    sv_sched *sched;          /* borrowed */
    sv_metrics *metrics;      /* borrowed */
    uint32_t n_ctx;
    uint64_t max_body;        /* --max-body, and no more than the context takes */
    int has_namespaces;       /* keys, or a Unix socket: /metrics per namespace */
    struct MHD_Daemon *daemon;
    int unix_fd;              /* -1: TCP */
    int lock_fd;              /* the --unix socket's lock file; -1: none */
    char lock_path[4200];
    pthread_t watchdog;
    int has_watchdog;
    pthread_mutex_t mu;       /* everything below */
    pthread_cond_t cv;        /* the watchdog's sleep; is_stopping */
    uint32_t n_conn;          /* connections open now */
    uint64_t inflight_bytes;  /* bodies held by connections now */
    sv_peer *peers;
    uint64_t n_timeouts, n_refused;
    int is_stopping;
};

typedef struct conn {
    sv_http *h;               /* the server's */
    sv_peer *peer;            /* the connection's */
    char ns[SV_NS_MAX + 1];   /* the caller's namespace (once known) */
    int has_ns;
    uint64_t held;            /* bytes of inflight_bytes this request holds */
    sv_endpoint endpoint;
    char *body;
    size_t len, cap;
    int too_large;
    int too_busy;             /* over --max-inflight while the body came */
    int is_post;
    struct MHD_Connection *mc;
    sv_request *req;          /* once queued: our reference */
    /* streaming */
    char *pending;            /* the event being handed to libmicrohttpd */
    size_t p_len, p_off;
    size_t sent;              /* bytes of req->out already in events */
    size_t lp_sent;           /* entries of req->lps already in events */
    int stage;
    char id[80];
    time_t created;
    sv_oai_meta meta;         /* id, created, the model's name */
    int sent_102;             /* an interim 102 went out (peer_closed) */
} conn;

/* a == b in time that depends only on b's length (the key's) */
static int key_equal(const char *given, const char *key)
{
    size_t ng = strlen(given), nk = strlen(key);
    volatile unsigned char d = (unsigned char)(ng != nk);
    for (size_t i = 0; i < nk; i++)
        d |= (unsigned char)((i < ng ? (unsigned char)given[i] : 0) ^ (unsigned char)key[i]);
    return d == 0;
}

/* --cors: the request's Origin echoed when allowed ("*": any) */
static void add_cors(conn *c, struct MHD_Response *r)
{
    const sv_config *cfg = c->h->cfg;
    if (!cfg->n_cors)
        return;
    const char *origin = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin");
    for (size_t i = 0; i < cfg->n_cors; i++) {
        if (!strcmp(cfg->cors[i], "*")) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
            return;
        }
        if (origin && !strcmp(cfg->cors[i], origin)) {
            MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
            MHD_add_response_header(r, "Vary", "Origin");
            return;
        }
    }
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
    if (status == SV_ERR_UNAVAILABLE || status == SV_ERR_BUSY)
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == SV_ERR_UNAVAILABLE || status == SV_ERR_TOO_LARGE)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close"); /* this one goes */
    add_cors(c, r);
    if (c->req && c->req->conv_out[0])
        MHD_add_response_header(r, "X-Rebound-Conversation", c->req->conv_out);
    if (c->req && c->req->restore)
        MHD_add_response_header(r, "X-Rebound-Restore", c->req->restore);
    enum MHD_Result ok = MHD_queue_response(c->mc, status, r);
    MHD_destroy_response(r);
    sv_metrics_count_request(c->h->metrics, c->has_ns ? c->ns : NULL, c->endpoint, status);
    return ok;
}

/* s: JSON (malloc'ed, consumed); NULL: out of memory */
static enum MHD_Result respond_json(conn *c, unsigned status, char *s)
{
    if (!s)
        return MHD_NO;
    return respond(c, status, "application/json", s, strlen(s));
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
    return respond_json(c, (unsigned)e, sv_oai_error_json(e, msg, param));
}

/* 1 when the client is gone. A client that only half-closed (shutdown of
 * its sending side after the request) still reads the reply: on the end
 * of its stream the first time, an interim "102 Processing" (which HTTP/1.1
 * clients skip) is sent; a client that closed its socket answers it with a
 * reset, which the next check sees. A stream's client is told by its
 * events failing, so nothing is sent for it. */
static int peer_closed(conn *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return 1;
    int fd = ci->connect_fd;
    struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&pf, 1, 0) <= 0)
        return 0;
    if (pf.revents & (POLLERR | POLLHUP | POLLNVAL))
        return 1;
    char b;
    ssize_t n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)))
        return 0;
    if (n < 0)
        return 1;
    /* the end of the client's stream: half-closed, or gone */
    if (c->req && c->req->stream)
        return 1;
    if (!c->sent_102) {
        static const char p[] = "HTTP/1.1 102 Processing\r\n\r\n";
        c->sent_102 = 1;
        return send(fd, p, sizeof p - 1, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)(sizeof p - 1);
    }
    return 0;
}

/* Waits until r started (or is done), or until it is done; with have !=
 * (size_t)-1, until it holds more than have bytes of text. 0; 1 when
 * max_s seconds passed first (max_s 0: no limit); -1 when the client left
 * (r is then cancelled). */
static int wait_request(conn *c, int until_done, size_t have, double max_s)
{
    sv_request *r = c->req;
    double last_check = sv_now_s(), t0 = last_check;
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
        double now = sv_now_s();
        if (max_s > 0 && now - t0 >= max_s) {
            pthread_mutex_unlock(&r->mu);
            return 1;
        }
        if (now - last_check >= 0.1) {
            last_check = now;
            if (peer_closed(c)) {
                r->is_cancelled = 1;
                pthread_mutex_unlock(&r->mu);
                return -1;
            }
        }
    }
    pthread_mutex_unlock(&r->mu);
    return 0;
}

/* Appends "data: JSON\n\n" (s: JSON, consumed) or, with is_done, "data:
 * [DONE]" to pending. -1: out of memory. */
static int add_event(conn *c, char *s, int is_done)
{
    if (!s && !is_done)
        return -1;
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
            if (r->kind == SV_CHAT && add_event(c, sv_oai_chunk(r, &c->meta, NULL, 0, NULL, 1), 0))
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
            /* with tools the reply goes out whole when done (its calls
               parsed); else the new text with its tokens' logprobs */
            int whole = r->kind == SV_CHAT && r->tools != SV_TOOLS_NONE;
            pthread_mutex_lock(&r->mu);
            int done = r->is_done;
            size_t n = whole && !done ? 0 : r->out_len - c->sent;
            size_t lp1 = whole && !done ? c->lp_sent : r->n_lps;
            char *ev = NULL;
            if (n || lp1 > c->lp_sent)
                ev = sv_oai_chunk_ex(r, &c->meta, n ? r->out + c->sent : NULL, n, c->lp_sent, lp1,
                                     whole && n);
            pthread_mutex_unlock(&r->mu);
            if ((n || lp1 > c->lp_sent) && !ev)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            c->sent += n;
            c->lp_sent = lp1;
            if (ev && add_event(c, ev, 0))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            if (done && c->sent == r->out_len)
                c->stage = ST_END;
            continue;
        }
        /* ST_END: the request is done and all its text was sent */
        c->stage = ST_DONE;
        int rc;
        if (r->err != SV_ERR_NONE) {
            rc = add_event(c, sv_oai_error_json(r->err, r->errmsg, NULL), 0);
        } else {
            rc = add_event(c, sv_oai_chunk(r, &c->meta, NULL, 0, sv_oai_finish_name(r), 0), 0);
            if (!rc && r->include_usage)
                rc = add_event(c, sv_oai_usage_chunk(r, &c->meta), 0);
        }
        if (rc || add_event(c, NULL, 1))
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
}

/* ---- /metrics ---------------------------------------------------------- */

static enum MHD_Result metrics_page(conn *c)
{
    sv_counts m;
    int per_ns = c->h->has_namespaces;
    sv_metrics_get(c->h->metrics, per_ns ? c->ns : NULL, &m);
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f)
        return MHD_NO;
    sv_metrics_write(&m, !per_ns, c->h->cfg->mem_budget_bytes, f);
    if (fclose(f) != 0) {
        free(buf);
        return MHD_NO;
    }
    return respond(c, 200, "text/plain; version=0.0.4", buf, n);
}

/* ---- the handler ----------------------------------------------------------- */

static sv_endpoint route(const char *url)
{
    static const struct { const char *path; sv_endpoint ep; } routes[] = {
        {"/v1/chat/completions", SV_EP_CHAT}, {"/chat/completions", SV_EP_CHAT},
        {"/v1/completions", SV_EP_COMPLETIONS}, {"/completions", SV_EP_COMPLETIONS},
        {"/v1/models", SV_EP_MODELS}, {"/models", SV_EP_MODELS},
        {"/health", SV_EP_HEALTH}, {"/metrics", SV_EP_METRICS},
        {"/tokenize", SV_EP_TOKENIZE}, {"/detokenize", SV_EP_DETOKENIZE},
        {"/apply-template", SV_EP_APPLY_TEMPLATE}, {"/v1/embeddings", SV_EP_EMBEDDINGS},
        {"/embeddings", SV_EP_EMBEDDINGS},
        {"/v1/chat/completions/input_tokens", SV_EP_INPUT_TOKENS},
    };
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (!strcmp(url, routes[i].path))
            return routes[i].ep;
    return SV_EP_OTHER;
}

static void in_flight_add(sv_http *h, const char *ns, int d)
{
    sv_metrics_add(h->metrics, ns, in_flight, (uint64_t)(int64_t)d);
}

/* 0 when h may hold n more body bytes (then held), else -1 */
static int hold_bytes(conn *c, uint64_t n)
{
    sv_http *h = c->h;
    int ok;
    pthread_mutex_lock(&h->mu);
    ok = h->inflight_bytes + n <= h->cfg->max_inflight_bytes;
    if (ok)
        h->inflight_bytes += n, c->held += n;
    pthread_mutex_unlock(&h->mu);
    return ok ? 0 : -1;
}

static void release_bytes(conn *c)
{
    pthread_mutex_lock(&c->h->mu);
    c->h->inflight_bytes -= c->held;
    pthread_mutex_unlock(&c->h->mu);
    c->held = 0;
}

static void set_deadline(sv_http *h, sv_peer *p, double when)
{
    if (!p)
        return;
    pthread_mutex_lock(&h->mu);
    p->deadline = when;
    pthread_mutex_unlock(&h->mu);
}

static enum MHD_Result generate(conn *c)
{
    sv_http *h = c->h;
    const sv_config *cfg = h->cfg;
    sv_request *r = sv_request_new();
    if (!r)
        return respond_error(c, SV_ERR_UNAVAILABLE, NULL, "out of memory");
    snprintf(r->ns, sizeof r->ns, "%s", c->ns);
    sv_oai_error p;
    if (sv_oai_parse(cfg, h->n_ctx, c->endpoint == SV_EP_CHAT ? SV_CHAT : SV_COMPLETION, c->body,
                     c->len, r, &p)) {
        sv_request_release(r);
        return respond_json(c, (unsigned)p.e, sv_oai_error_json(p.e, p.msg, p.param));
    }
    /* the body is no longer needed: its bytes go back before the tokens
       are made, here on the connection's thread (never the scheduler's) */
    free(c->body);
    c->body = NULL, c->len = c->cap = 0;
    release_bytes(c);
    char msg[400];
    sv_err e = sv_sched_prepare(h->sched, r, msg, sizeof msg);
    if (e != SV_ERR_NONE) {
        sv_request_release(r);
        return respond_error(c, e, NULL, "%s", msg);
    }
    e = sv_sched_submit(h->sched, r);
    if (e != SV_ERR_NONE) {
        sv_request_release(r);
        return e == SV_ERR_BUSY
                   ? respond_error(c, e, NULL, "too many requests in flight (--parallel %" PRIu32
                                   " + --max-queue %" PRIu32 "); retry later",
                                   cfg->parallel, cfg->max_queue)
                   : respond_error(c, e, NULL, "the server is stopping");
    }
    c->req = r;
    in_flight_add(h, c->ns, 1);
    uint64_t rid[2] = {0, 0};
    sv_random(rid, sizeof rid);
    snprintf(c->id, sizeof c->id, "%s-%016" PRIx64 "%016" PRIx64,
             r->kind == SV_CHAT ? "chatcmpl" : "cmpl", rid[0], rid[1]);
    c->created = time(NULL);
    c->meta = (sv_oai_meta){c->id, (int64_t)c->created, cfg->model_name};
    if (wait_request(c, !r->stream, (size_t)-1, 0) != 0)
        return MHD_NO; /* the client left: cancelled */
    if (r->err != SV_ERR_NONE && (!r->is_started || !r->stream)) /* is_done: stable */
        return respond_error(c, r->err, NULL, "%s", r->errmsg);
    if (!r->stream)
        return respond_json(c, 200, sv_oai_response(r, &c->meta));
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, c, NULL);
    if (!resp)
        return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    add_cors(c, resp);
    MHD_add_response_header(resp, "X-Rebound-Conversation", r->conv_out);
    if (r->restore)
        MHD_add_response_header(resp, "X-Rebound-Restore", r->restore);
    enum MHD_Result ok = MHD_queue_response(c->mc, 200, resp);
    MHD_destroy_response(resp);
    sv_metrics_count_request(h->metrics, c->ns, c->endpoint, 200);
    return ok;
}

/* A utility, in the caller's namespace (behind the API key as any
 * request; fair turns and --max-queue as a generation): parsed and
 * tokenized here (sv_sched_prepare_utility), answered by the scheduler
 * (the only thread that computes with the model: embeddings on a session
 * of their own, never a conversation), its JSON sent as it is. */
static enum MHD_Result utility(conn *c)
{
    sv_http *h = c->h;
    static const sv_kind kinds[] = {[SV_EP_TOKENIZE] = SV_TOKENIZE,
                                    [SV_EP_DETOKENIZE] = SV_DETOKENIZE,
                                    [SV_EP_APPLY_TEMPLATE] = SV_APPLY_TEMPLATE,
                                    [SV_EP_EMBEDDINGS] = SV_EMBED,
                                    [SV_EP_INPUT_TOKENS] = SV_INPUT_TOKENS};
    sv_request *r = sv_request_new();
    if (!r)
        return respond_error(c, SV_ERR_UNAVAILABLE, NULL, "out of memory");
    snprintf(r->ns, sizeof r->ns, "%s", c->ns);
    sv_oai_error p;
    if (sv_oai_parse_utility(kinds[c->endpoint], c->body, c->len, r, &p)) {
        sv_request_release(r);
        return respond_json(c, (unsigned)p.e, sv_oai_error_json(p.e, p.msg, p.param));
    }
    free(c->body);
    c->body = NULL, c->len = c->cap = 0;
    release_bytes(c);
    char msg[400];
    sv_err e = sv_sched_prepare_utility(h->sched, r, msg, sizeof msg);
    if (e != SV_ERR_NONE) {
        sv_request_release(r);
        return respond_error(c, e, NULL, "%s", msg);
    }
    e = sv_sched_submit(h->sched, r);
    if (e != SV_ERR_NONE) {
        sv_request_release(r);
        return respond_error(c, e, NULL, e == SV_ERR_BUSY ? "too many requests in flight; retry "
                             "later" : "the server is stopping");
    }
    c->req = r;
    in_flight_add(h, c->ns, 1);
    if (wait_request(c, 1, (size_t)-1, 0) != 0)
        return MHD_NO;
    if (r->err != SV_ERR_NONE)
        return respond_error(c, r->err, NULL, "%s", r->errmsg);
    return respond_json(c, 200, sv_oai_utility_response(r, h->cfg->model_name));
}

/* Sets *(int *)cls when a header's name or value holds a NUL byte (the C
 * strings libmicrohttpd hands out would end there). */
static enum MHD_Result header_has_nul(void *cls, enum MHD_ValueKind kind, const char *key,
                                      size_t key_size, const char *value, size_t value_size)
{
    (void)kind;
    if (strlen(key) != key_size || (value && strlen(value) != value_size)) {
        *(int *)cls = 1;
        return MHD_NO;
    }
    return MHD_YES;
}

/* The caller's namespace into c->ns: its key's name (with --api-key),
 * its uid on a Unix socket, else "". 0, or -1 when the key is missing or
 * wrong (every key compared, each in time that depends on its length). */
static int resolve_ns(conn *c, const char **why)
{
    const sv_config *cfg = c->h->cfg;
    if (cfg->n_keys) {
        const char *auth = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND,
                                                       MHD_HTTP_HEADER_AUTHORIZATION);
        const char *given = auth && !strncmp(auth, "Bearer ", 7) ? auth + 7 : "";
        const sv_key *hit = NULL;
        for (size_t i = 0; i < cfg->n_keys; i++)
            if (key_equal(given, cfg->keys[i].key) && !hit)
                hit = &cfg->keys[i];
        if (!hit) {
            *why = auth ? "the API key is not this server's"
                        : "an API key is required (Authorization: Bearer KEY)";
            return -1;
        }
        snprintf(c->ns, sizeof c->ns, "%s", hit->name);
    } else if (c->peer && c->peer->uid_ns[0]) {
        snprintf(c->ns, sizeof c->ns, "%s", c->peer->uid_ns);
    } else {
        c->ns[0] = 0;
    }
    c->has_ns = 1;
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    (void)version;
    sv_http *h = cls;
    conn *c = *con_cls;
    if (!c) { /* the headers are in */
        if (!(c = calloc(1, sizeof *c)))
            return MHD_NO;
        *con_cls = c;
        c->h = h;
        c->mc = mc;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        c->peer = ci ? ci->socket_context : NULL;
        c->endpoint = route(url);
        c->is_post = !strcmp(method, MHD_HTTP_METHOD_POST);
        pthread_mutex_lock(&h->mu);
        uint32_t n_conn = h->n_conn;
        pthread_mutex_unlock(&h->mu);
        if (n_conn > h->cfg->max_conn)
            return respond_error(c, SV_ERR_UNAVAILABLE, NULL, "too many connections (%" PRIu32
                                 " open, --max-connections %" PRIu32 "); retry later", n_conn,
                                 h->cfg->max_conn);
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *te = MHD_lookup_connection_value(mc, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_TRANSFER_ENCODING);
        int has_nul = 0;
        MHD_get_connection_values_n(mc, MHD_HEADER_KIND, header_has_nul, &has_nul);
        if (has_nul)
            return respond_error(c, SV_ERR_INVALID, NULL, "a header holds a NUL byte");
        if (cl && te) /* which one ends the body? a smuggling attempt, or a broken client */
            return respond_error(c, SV_ERR_INVALID, NULL, "the request has both Content-Length "
                                 "and Transfer-Encoding");
        if (c->is_post) {
            uint64_t n = cl ? strtoull(cl, NULL, 10) : 0;
            if (cl && n > h->max_body)
                return respond_error(c, SV_ERR_TOO_LARGE, NULL, "the body has %s bytes; the "
                                     "limit is %" PRIu64 " (%s)", cl, h->max_body,
                                     h->max_body < h->cfg->max_body
                                         ? "what a prompt that fits the context can take"
                                         : "--max-body");
            /* the whole body's bytes, counted before any arrives */
            if (cl && hold_bytes(c, n))
                return respond_error(c, SV_ERR_UNAVAILABLE, NULL, "too many request bytes in "
                                     "flight (--max-inflight %" PRIu64 "); retry later",
                                     h->cfg->max_inflight_bytes);
        }
        /* every request is answered once it is all in (libmicrohttpd's
           last call): an answer queued earlier closes the connection, and
           a kept-alive GET must not */
        return MHD_YES;
    }
    if (c->is_post && *upload_size) {
        if (!c->too_large && c->len + *upload_size > h->max_body)
            c->too_large = 1;
        if (!c->too_large && c->len + *upload_size > c->held &&
            hold_bytes(c, c->len + *upload_size - c->held))
            c->too_busy = 1;
        if (!c->too_large && !c->too_busy) {
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
    /* the request is in: the server's turn, no deadline until it answers */
    set_deadline(h, c->peer, 0);
    if (c->too_large)
        return respond_error(c, SV_ERR_TOO_LARGE, NULL, "the body is larger than %" PRIu64
                             " bytes (%s)", h->max_body, h->max_body < h->cfg->max_body
                             ? "what a prompt that fits the context can take" : "--max-body");
    if (c->too_busy)
        return respond_error(c, SV_ERR_UNAVAILABLE, NULL, "too many request bytes in flight "
                             "(--max-inflight %" PRIu64 "); retry later",
                             h->cfg->max_inflight_bytes);
    if (h->cfg->n_cors && !strcmp(method, MHD_HTTP_METHOD_OPTIONS)) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
        add_cors(c, r);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        enum MHD_Result ok = MHD_queue_response(mc, 204, r);
        MHD_destroy_response(r);
        sv_metrics_count_request(h->metrics, NULL, c->endpoint, 204);
        return ok;
    }
    if (c->endpoint == SV_EP_OTHER)
        return respond_error(c, SV_ERR_NOT_FOUND, NULL, "no endpoint %.200s (rebound serves "
                             "/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models, "
                             "/v1/chat/completions/input_tokens, /tokenize, /detokenize, /apply-template, "
                             "/health, /metrics)", url);
    int is_utility = c->endpoint == SV_EP_TOKENIZE || c->endpoint == SV_EP_DETOKENIZE ||
                     c->endpoint == SV_EP_APPLY_TEMPLATE || c->endpoint == SV_EP_EMBEDDINGS ||
                     c->endpoint == SV_EP_INPUT_TOKENS;
    int wants_post = c->endpoint == SV_EP_CHAT || c->endpoint == SV_EP_COMPLETIONS || is_utility;
    if (wants_post != c->is_post || (!c->is_post && strcmp(method, MHD_HTTP_METHOD_GET) &&
                                     strcmp(method, MHD_HTTP_METHOD_HEAD)))
        return respond_error(c, SV_ERR_METHOD, NULL, "%.20s %.200s: use %s", method, url,
                             wants_post ? "POST" : "GET");
    if (c->endpoint == SV_EP_HEALTH) {
        char *b = strdup("{\"status\":\"ok\"}");
        return b ? respond(c, 200, "application/json", b, strlen(b)) : MHD_NO;
    }
    const char *why = NULL;
    if (resolve_ns(c, &why))
        return respond_error(c, SV_ERR_AUTH, NULL, "%s", why);
    if (c->endpoint == SV_EP_METRICS)
        return metrics_page(c);
    if (c->endpoint == SV_EP_MODELS)
        return respond_json(c, 200, sv_oai_models(h->cfg->model_name, h->n_ctx,
                                                  (int64_t)time(NULL)));
    if (is_utility)
        return utility(c);
    return generate(c);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)mc, (void)toe;
    sv_http *h = cls;
    conn *c = *con_cls;
    if (!c)
        return;
    if (c->req) {
        pthread_mutex_lock(&c->req->mu);
        if (!c->req->is_done)
            c->req->is_cancelled = 1; /* the client left mid-stream */
        pthread_mutex_unlock(&c->req->mu);
        sv_request_release(c->req);
        in_flight_add(c->h, c->ns, -1);
    }
    release_bytes(c);
    /* a kept-alive connection's next request: its head and body in time */
    set_deadline(h, c->peer, sv_now_s() + h->cfg->request_timeout_s);
    free(c->body);
    free(c->pending);
    free(c);
    *con_cls = NULL;
}

/* A connection opens: its peer (address or uid), the per-peer cap, the
 * deadline of its first request; and closes. The cap's refusal and the
 * deadline shut the connection's socket down (through our own dup of it),
 * which libmicrohttpd's thread sees as the client's end. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    sv_http *h = cls;
    if (toe != MHD_CONNECTION_NOTIFY_STARTED) {
        sv_peer *p = *socket_context;
        pthread_mutex_lock(&h->mu);
        if (h->n_conn > 0)
            h->n_conn--;
        if (p) {
            if (p->prev)
                p->prev->next = p->next;
            else
                h->peers = p->next;
            if (p->next)
                p->next->prev = p->prev;
        }
        pthread_mutex_unlock(&h->mu);
        if (p) {
            if (p->fd >= 0)
                close(p->fd);
            free(p);
        }
        *socket_context = NULL;
        return;
    }
    sv_peer *p = calloc(1, sizeof *p);
    const union MHD_ConnectionInfo *fdi =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (p) {
        p->fd = fdi ? fcntl(fdi->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
        const struct sockaddr *sa = ai ? ai->client_addr : NULL;
        struct ucred cred;
        socklen_t cl = sizeof cred;
        if (h->unix_fd >= 0 && p->fd >= 0 &&
            getsockopt(p->fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
            snprintf(p->who, sizeof p->who, "uid %u", (unsigned)cred.uid);
            snprintf(p->uid_ns, sizeof p->uid_ns, "uid%u", (unsigned)cred.uid);
        } else if (sa && sa->sa_family == AF_INET) {
            inet_ntop(AF_INET, &((const struct sockaddr_in *)sa)->sin_addr, p->who, sizeof p->who);
        } else if (sa && sa->sa_family == AF_INET6) {
            inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)sa)->sin6_addr, p->who,
                      sizeof p->who);
        }
        p->deadline = sv_now_s() + h->cfg->request_timeout_s;
    }
    pthread_mutex_lock(&h->mu);
    h->n_conn++;
    if (p) {
        uint32_t same = 0;
        for (sv_peer *q = h->peers; q; q = q->next)
            same += !strcmp(q->who, p->who) && !q->is_refused;
        p->is_refused = same >= h->cfg->max_conn_per_peer;
        if (p->is_refused) {
            h->n_refused++;
            if (p->fd >= 0)
                shutdown(p->fd, SHUT_RDWR);
            p->deadline = 0;
        }
        p->next = h->peers;
        if (h->peers)
            h->peers->prev = p;
        h->peers = p;
        if (p->is_refused && (h->n_refused & (h->n_refused - 1)) == 0)
            sv_log("http: %s holds %" PRIu32 " connections (--max-connections-per-peer): "
                   "its next ones are closed at once (%" PRIu64 " so far; said at powers of 2)",
                   p->who, same, h->n_refused);
    }
    pthread_mutex_unlock(&h->mu);
    *socket_context = p;
}

/* The watchdog: every 250 ms, a connection whose request (head and body)
 * has not arrived by its deadline is shut down. A slow client (a header
 * byte a second) is cut after --request-timeout however it trickles. */
static void *watchdog_main(void *arg)
{
    sv_http *h = arg;
    pthread_mutex_lock(&h->mu);
    while (!h->is_stopping) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 250 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000)
            ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&h->cv, &h->mu, &ts);
        double now = sv_now_s();
        for (sv_peer *p = h->peers; p; p = p->next)
            if (p->deadline > 0 && now > p->deadline && p->fd >= 0) {
                shutdown(p->fd, SHUT_RDWR);
                p->deadline = 0;
                h->n_timeouts++;
                if ((h->n_timeouts & (h->n_timeouts - 1)) == 0)
                    sv_log("http: %s did not send its request within --request-timeout %.0f s: "
                           "closed (%" PRIu64 " so far; said at powers of 2)", p->who,
                           h->cfg->request_timeout_s, h->n_timeouts);
            }
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    sv_log("http: %s", msg);
}

/* The --unix socket: refused when another server holds PATH.lock (a lock
 * held for the process's life) or answers on PATH; a socket nobody
 * answers on is a dead server's and is replaced. */
static int listen_unix(sv_http *h, const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) {
        sv_log("error: --unix path is longer than %zu bytes", sizeof a.sun_path - 1);
        return -1;
    }
    snprintf(h->lock_path, sizeof h->lock_path, "%s.lock", path);
    h->lock_fd = open(h->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (h->lock_fd < 0 || flock(h->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        sv_log("error: --unix %s: another rebound serve holds %s%s%s", path, h->lock_path,
               h->lock_fd < 0 ? ": " : "", h->lock_fd < 0 ? strerror(errno) : "");
        return -1;
    }
    memcpy(a.sun_path, path, strlen(path) + 1);
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            sv_log("error: --unix %s exists and is not a socket", path);
            return -1;
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int live = probe >= 0 && connect(probe, (struct sockaddr *)&a, sizeof a) == 0;
        if (probe >= 0)
            close(probe);
        if (live) {
            sv_log("error: --unix %s: a server answers on it; refusing to take it over", path);
            return -1;
        }
        unlink(path); /* a socket left by a server that is gone */
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || chmod(path, 0600) != 0 ||
        listen(fd, 128) != 0) {
        sv_log("error: --unix %s: %s", path, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}


/* ---- start and stop -------------------------------------------------------- */

sv_http *sv_http_start(const sv_config *cfg, sv_sched *sched, sv_metrics *metrics)
{
    sv_http *h = calloc(1, sizeof *h);
    if (!h) {
        sv_log("error: out of memory");
        return NULL;
    }
    h->cfg = cfg;
    h->sched = sched;
    h->metrics = metrics;
    h->n_ctx = sv_sched_n_ctx(sched);
    h->unix_fd = -1;
    h->lock_fd = -1;
    h->has_namespaces = cfg->n_keys > 0 || cfg->unix_path;
    h->max_body = cfg->max_body;
    size_t ctx_body = sv_sched_max_body(sched);
    if (ctx_body < h->max_body)
        h->max_body = ctx_body;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    const char *host = cfg->host;
    unsigned flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    struct sockaddr_storage sa;
    memset(&sa, 0, sizeof sa);
    if (cfg->unix_path) {
        if ((h->unix_fd = listen_unix(h, cfg->unix_path)) < 0)
            goto fail;
    } else if (strchr(host, ':')) {
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&sa;
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)cfg->port);
        if (inet_pton(AF_INET6, host, &a6->sin6_addr) != 1) {
            sv_log("error: --host %s is not an IPv6 address", host);
            goto fail;
        }
        flags |= MHD_USE_IPv6;
    } else {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&sa;
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)cfg->port);
        if (inet_pton(AF_INET, host, &a4->sin_addr) != 1) {
            sv_log("error: --host %s is not an IPv4 address", host);
            goto fail;
        }
    }
    struct MHD_OptionItem listen_opt[] = {
        h->unix_fd >= 0 ? (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, h->unix_fd, NULL}
                        : (struct MHD_OptionItem){MHD_OPTION_SOCK_ADDR, 0, &sa},
        {MHD_OPTION_END, 0, NULL},
    };
    h->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, h,
                                 MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                                 MHD_OPTION_ARRAY, listen_opt,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_conn + 8,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
                                 MHD_OPTION_CONNECTION_TIMEOUT, 60u,
                                 MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
#if MHD_VERSION >= 0x00097700
                                 MHD_OPTION_CLIENT_DISCIPLINE_LVL, 1,
#else
                                 MHD_OPTION_STRICT_FOR_CLIENT, 1,
#endif
                                 MHD_OPTION_END);
    if (!h->daemon) {
        if (cfg->unix_path)
            sv_log("error: cannot serve on %s", cfg->unix_path);
        else
            sv_log("error: cannot listen on %s port %d: %s", host, cfg->port, strerror(errno));
        if (!cfg->unix_path)
            fprintf(stderr, "hint: another server may use the port; --port 0 picks a free one\n");
        goto fail;
    }
    if (pthread_create(&h->watchdog, NULL, watchdog_main, h) != 0) {
        sv_log("error: cannot start the connections' watchdog thread");
        goto fail;
    }
    h->has_watchdog = 1;
#if MHD_VERSION < 0x00097700
    sv_log("http: strict client discipline of libmicrohttpd %s: HTTP/1.1 without Host and "
           "Content-Length with Transfer-Encoding refused; a NUL in a header cuts its value "
           "there (0.9.77 refuses it)", MHD_get_version());
#endif
    if (cfg->n_keys)
        sv_log("namespaces: one per API key (%zu)", cfg->n_keys);
    else if (cfg->unix_path)
        sv_log("namespaces: one per peer uid on the Unix socket");
    else
        sv_log("namespaces: one (no --api-key, not --unix): every client sees every "
               "conversation");
    if (cfg->unix_path) {
        sv_log("listening on unix:%s (model %s, context %" PRIu32 ", parallel %" PRIu32 ")",
               cfg->unix_path, cfg->model_name, h->n_ctx, cfg->parallel);
    } else {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
        int bound = di ? (int)di->port : cfg->port;
        sv_log("listening on http://%s%s%s:%d (model %s, context %" PRIu32 ", parallel %" PRIu32
               ")", strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "", bound,
               cfg->model_name, h->n_ctx, cfg->parallel);
    }
    return h;
fail:
    sv_http_stop(h);
    return NULL;
}

void sv_http_stop(sv_http *h)
{
    if (!h)
        return;
    if (h->daemon)
        MHD_stop_daemon(h->daemon);
    if (h->has_watchdog) {
        pthread_mutex_lock(&h->mu);
        h->is_stopping = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->watchdog, NULL);
    }
    if (h->unix_fd >= 0) {
        close(h->unix_fd);
        unlink(h->cfg->unix_path);
    }
    if (h->lock_fd >= 0) {
        if (h->unix_fd >= 0)
            unlink(h->lock_path);
        close(h->lock_fd);
    }
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}
