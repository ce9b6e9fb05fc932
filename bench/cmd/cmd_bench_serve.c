/*
 * cmd_bench_serve.c - `rebound bench-serve URL`: a workload driver for any
 * OpenAI-compatible server (rebound serve, llama.cpp's llama-server, ...),
 * so that one run can be pointed at each of them.
 *
 * The workload: K conversations, each opened with a long first message of
 * about C tokens (deterministic English words from the seed), then R
 * rounds in which the user returns to each conversation (a shuffled order
 * each round, or K draws from a Zipf law over a shuffled ranking) with a
 * short new message of about T tokens; every reply is G tokens at
 * temperature 0. Each request carries the whole conversation (as every
 * OpenAI client does), so the server finds its conversation by prefix.
 * All openings end before the first return starts; -j N requests run at
 * once, a conversation never has two in flight.
 *
 * What it measures, per request: TTFT = from sending the request to the
 * first server-sent event that carries content (streaming, with usage in
 * the last chunk), the decode rate after that first token, the
 * server-reported prompt, cached and completion tokens, and where the
 * server found the conversation's KV: rebound serve's X-Rebound-Restore
 * header (resident, compressed, stored, file, new, recomputed), "unknown"
 * from servers that do not say. With --pid, a thread samples the server's
 * /proc/PID/status (VmRSS, RssAnon every 5 ms, VmHWM at the end), and
 * each turn reads its minor page faults (/proc/PID/stat) at the send and
 * at the first token: a return whose restore or pass touches memory for
 * the first time shows there (with -j 1 the count is the request's).
 * The report: TTFT p50/p95/max per turn kind (opening, return) and place,
 * decode tok/s; where the returns' first tokens went by phase when the
 * server sends "timings" (rebound serve's queue, open, prefill and the
 * restore inside it), with the slowest returns one by one; with --rate,
 * each return against its floor (the resident return's TTFT plus the
 * bytes it read at the device's rate); a table by default, JSON with
 * -o json.
 *
 * HTTP: libcurl (one easy handle per worker thread): chunked transfer,
 * keep-alive, Unix sockets and TLS come from a library every distribution
 * keeps patched, rather than hand-written socket code. JSON: jansson, as
 * serve. Memory: the conversations' histories (jansson arrays) and one
 * record per turn, all freed at the end.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "cli.h"

#define CMD "bench-serve"
#define MAX_K 4096
#define MAX_J 256
#define PLACE_LEN 16

typedef struct bs_opts {
    const char *url, *unix_path, *model, *api_key, *order, *output;
    uint32_t k, context, rounds, turn, gen, jobs, system;
    int64_t seed;
    int pid;
    double zipf_s, timeout_s;
    double rate_mib_s, resident_ms; /* --rate, --resident-ms: the floor (0: none) */
    int ignore_eos;
} bs_opts;

/* The phases of a request's first token that rebound serve reports in its
 * "timings" (ms), in the order of the report's columns. */
enum { BS_N_PHASES = 10 };
static const char *const phase_keys[BS_N_PHASES] = {
    "prepare_ms", "queue_ms", "open_ms", "prompt_ms", "room_ms", "restore_io_ms",
    "restore_decode_ms", "restore_wait_ms", "restore_span_ms", "weights_wait_ms"};
static const char *const phase_names[BS_N_PHASES] = {
    "prepare", "queue", "open", "prefill", "room (trims)", "restore I/O", "restore decode",
    "restore wait", "restore span", "weights wait"};
enum { PH_QUEUE = 1, PH_OPEN, PH_PREFILL, PH_ROOM, PH_IO, PH_DECODE, PH_WAIT };

typedef struct bs_turn {
    int conv, round;          /* round 0: the opening */
    int idx_in_conv;          /* its place among its conversation's turns */
    /* results: written by the worker that ran it */
    int is_done;
    char place[PLACE_LEN];    /* X-Rebound-Restore, or "unknown" */
    double t_send, ttft_s, decode_s;
    int64_t prompt_tokens, cached_tokens, completion_tokens; /* -1: not reported */
    int64_t n_content;        /* content events received */
    /* the server's "timings" (rebound serve: where its first token went;
       ms, bytes); has_srv 0: the server sent none */
    int has_srv;
    double srv[BS_N_PHASES];
    int64_t srv_read_bytes;
    /* with --pid: the server process's minor page faults from the send to
       the first token (the whole process's: with -j 1, this request's);
       -1 unknown */
    int64_t faults;
} bs_turn;

typedef struct bs_conv {
    json_t *messages;         /* the history so far (owned) */
    int is_busy;
    int n_taken;              /* its turns handed to workers */
} bs_conv;

/* One request in flight: what the curl callbacks fill. */
typedef struct bs_call {
    bs_turn *t;
    double t0;
    char *line;               /* the event line being received */
    size_t line_len, line_cap;
    char *body;               /* a non-stream (error) body */
    size_t body_len;
    char *reply;              /* the content received */
    size_t reply_len, reply_cap;
    double t_first, t_last;
    int pid;                  /* --pid, or 0 */
    int64_t flt0;             /* its minor faults at the send, or -1 */
    char server_err[256];
} bs_call;

typedef struct bench {
    bs_opts o;
    char endpoint[2048];
    bs_turn *turns;
    size_t n_turns;
    bs_conv *convs;
    pthread_mutex_t mu;       /* guards the fields below, convs' is_busy, n_taken */
    pthread_cond_t cv;
    size_t n_opens_done;
    int is_failed;
    char fail_msg[1024];
    const char *fail_hint;
} bench;

/* ---- deterministic text ------------------------------------------------------ */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t x = *s += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double unit(uint64_t *s)
{
    return (double)(splitmix(s) >> 11) * (1.0 / 9007199254740992.0);
}

/* Common English words: one token each in the BPE and SentencePiece
 * vocabularies of the models people ship (and in make-model's). */
static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "was", "that", "for", "on", "are", "with", "as",
    "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by", "but", "some",
    "what", "there", "we", "can", "out", "other", "were", "all", "your", "when", "up", "use",
    "word", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will",
    "way", "about", "many", "then", "them", "would", "write", "like", "so", "these", "her",
    "long", "make", "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go",
    "come", "did", "my", "sound", "no", "most", "number", "who", "over", "know", "water",
    "than", "call", "first", "people", "may", "down", "side", "been", "now", "find", "any",
    "new", "work", "part", "take", "get", "place", "made", "live", "where", "after", "back",
    "little", "only", "round", "man", "year", "came", "show", "every", "good", "me", "give",
    "our", "under", "name", "very", "through", "just", "form", "much", "great", "think",
    "say", "help", "low", "line", "before", "turn", "cause", "same", "mean", "differ", "move",
    "right", "boy", "old", "too", "does", "tell", "sentence", "set", "three", "want", "air",
    "well", "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large",
    "spell", "add", "even", "land", "here", "must", "big", "high", "such", "follow", "act",
    "why", "ask", "men", "change", "went", "light", "kind", "off", "need", "house", "picture",
    "try", "us", "again", "animal", "point", "mother", "world", "near", "build", "self",
    "earth", "father", "head", "stand", "own", "page", "should", "country", "found", "answer",
    "school", "grow", "study", "still", "learn", "plant", "cover", "food", "sun", "four",
    "thought", "let", "keep", "eye", "never", "last", "door", "between", "city", "tree",
    "cross", "since", "hard", "start", "might", "story", "saw", "far", "sea", "draw", "left",
    "late", "run", "while", "press", "close", "night", "real", "life", "few", "stop", "open",
    "seem", "together", "next", "white", "children", "begin", "got", "walk", "example",
    "ease", "paper", "often", "always", "music", "those", "both", "mark", "book", "letter",
    "until", "mile", "river", "car", "feet", "care", "second", "group", "carry", "took",
    "rain", "eat", "room", "friend", "began", "idea", "fish", "mountain", "north", "once",
    "base", "hear", "horse", "cut", "sure", "watch", "color", "face", "wood", "main", "enough",
    "plain", "girl", "usual", "young", "ready", "above", "ever", "red", "list", "though",
    "feel", "talk", "bird", "soon", "body", "dog", "family", "direct", "pose", "leave", "song",
    "measure", "state", "product", "black", "short", "numeral", "class", "wind", "question",
};

/* Appends about n_tokens tokens of words (a word or a full stop: one token
 * each) to *buf; ends with end_mark. 0, or -1 out of memory. */
static int gen_text(uint64_t *rng, uint32_t n_tokens, char end_mark, char **buf, size_t *len,
                    size_t *cap)
{
    const size_t n_words = sizeof words / sizeof words[0];
    uint32_t est = 0, in_sentence = 0, sentence_len = 5 + (uint32_t)(splitmix(rng) % 10);
    while (est + 1 < n_tokens || est == 0) {
        const char *w = words[splitmix(rng) % n_words];
        size_t wl = strlen(w);
        if (*len + wl + 4 > *cap) {
            size_t c = *cap ? *cap * 2 : 4096;
            while (c < *len + wl + 4)
                c *= 2;
            char *q = realloc(*buf, c);
            if (!q)
                return -1;
            *buf = q, *cap = c;
        }
        if (*len)
            (*buf)[(*len)++] = ' ';
        memcpy(*buf + *len, w, wl);
        *len += wl;
        est++;
        if (++in_sentence == sentence_len && est + 2 < n_tokens) {
            (*buf)[(*len)++] = '.';
            est++;
            in_sentence = 0;
            sentence_len = 5 + (uint32_t)(splitmix(rng) % 10);
        }
    }
    (*buf)[(*len)++] = end_mark;
    (*buf)[*len] = 0;
    return 0;
}

/* ---- the server's memory ----------------------------------------------------- */

typedef struct rss_watch {
    int pid;
    atomic_int stop;
    int is_gone;              /* the process ended during the run */
    uint64_t max_rss, max_anon, hwm; /* bytes */
    pthread_t th;
} rss_watch;

/* The minor page faults of process pid so far (/proc/PID/stat, field 10:
 * every thread's, the ones taken inside the kernel's own copies, such as
 * an O_DIRECT read into pages not yet touched, included); -1 when it
 * cannot be read. */
static int64_t read_minflt(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the name may hold spaces and parentheses */
    if (!p)
        return -1;
    long long v = -1;
    /* after the name: state ppid pgrp session tty_nr tpgid flags minflt */
    if (sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %lld", &v) != 1)
        return -1;
    return v;
}

/* VmRSS, RssAnon and VmHWM of pid in bytes; -1 when it cannot be read. */
static int read_status(int pid, uint64_t *rss, uint64_t *anon, uint64_t *hwm)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    *rss = *anon = *hwm = 0;
    unsigned long long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1)
            *rss = kb * 1024;
        else if (sscanf(line, "RssAnon: %llu kB", &kb) == 1)
            *anon = kb * 1024;
        else if (sscanf(line, "VmHWM: %llu kB", &kb) == 1)
            *hwm = kb * 1024;
    }
    fclose(f);
    return 0;
}

static void *rss_main(void *arg)
{
    rss_watch *w = arg;
    const struct timespec pause = {0, 5 * 1000 * 1000};
    while (!atomic_load_explicit(&w->stop, memory_order_relaxed)) {
        uint64_t rss, anon, hwm;
        if (read_status(w->pid, &rss, &anon, &hwm) != 0) {
            w->is_gone = 1;
            break;
        }
        if (rss > w->max_rss)
            w->max_rss = rss;
        if (anon > w->max_anon)
            w->max_anon = anon;
        if (hwm > w->hwm)
            w->hwm = hwm;
        nanosleep(&pause, NULL);
    }
    return NULL;
}

/* ---- one request --------------------------------------------------------------- */

static int append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1)
            c *= 2;
        char *q = realloc(*buf, c);
        if (!q)
            return -1;
        *buf = q, *cap = c;
    }
    memcpy(*buf + *len, p, n);
    *len += n;
    (*buf)[*len] = 0;
    return 0;
}

static int64_t get_count(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

/* One "data: ..." payload of the stream. */
static void on_event(bs_call *c, const char *data)
{
    if (!strcmp(data, "[DONE]"))
        return;
    json_t *j = json_loads(data, 0, NULL);
    if (!j)
        return;
    double now = rb_cli_now_s();
    json_t *err = json_object_get(j, "error");
    if (err && !c->server_err[0]) {
        json_t *m = json_is_object(err) ? json_object_get(err, "message") : err;
        snprintf(c->server_err, sizeof c->server_err, "%s",
                 json_is_string(m) ? json_string_value(m) : "an error event");
    }
    json_t *choices = json_object_get(j, "choices");
    json_t *ch = json_is_array(choices) ? json_array_get(choices, 0) : NULL;
    if (ch) {
        json_t *delta = json_object_get(ch, "delta");
        json_t *content = delta ? json_object_get(delta, "content") : json_object_get(ch, "text");
        if (json_is_string(content) && json_string_length(content) > 0) {
            if (!c->t->n_content) {
                c->t_first = now;
                const int64_t f = c->flt0 >= 0 ? read_minflt(c->pid) : -1;
                c->t->faults = f >= c->flt0 ? f - c->flt0 : -1;
            }
            c->t_last = now;
            c->t->n_content++;
            if (append(&c->reply, &c->reply_len, &c->reply_cap, json_string_value(content),
                       json_string_length(content)))
                snprintf(c->server_err, sizeof c->server_err, "out of memory");
        }
    }
    json_t *tm = json_object_get(j, "timings");
    if (json_is_object(tm) && json_is_number(json_object_get(tm, "prompt_ms"))) {
        c->t->has_srv = 1;
        for (int i = 0; i < BS_N_PHASES; i++) {
            json_t *v = json_object_get(tm, phase_keys[i]);
            c->t->srv[i] = json_is_number(v) ? json_number_value(v) : 0;
        }
        /* what the return brought back: at admission, and in its prefill */
        c->t->srv_read_bytes = get_count(tm, "restore_read_bytes") +
                               get_count(tm, "restore_prefetched_bytes");
    }
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        c->t->prompt_tokens = get_count(usage, "prompt_tokens");
        c->t->completion_tokens = get_count(usage, "completion_tokens");
        json_t *d = json_object_get(usage, "prompt_tokens_details");
        if (json_is_object(d))
            c->t->cached_tokens = get_count(d, "cached_tokens");
    }
    json_decref(j);
}

static size_t on_body(char *p, size_t size, size_t n, void *arg)
{
    bs_call *c = arg;
    size_t total = size * n;
    for (size_t i = 0; i < total; i++) {
        char ch = p[i];
        if (c->body_len < 4096) { /* the start of the body, for errors */
            char *q = realloc(c->body, c->body_len + 2);
            if (!q)
                return 0;
            c->body = q;
            c->body[c->body_len++] = ch;
            c->body[c->body_len] = 0;
        }
        if (ch == '\n') {
            if (c->line_len && c->line[c->line_len - 1] == '\r')
                c->line[--c->line_len] = 0;
            if (c->line_len > 5 && !strncmp(c->line, "data:", 5)) {
                const char *d = c->line + 5;
                while (*d == ' ')
                    d++;
                on_event(c, d);
            }
            c->line_len = 0;
            continue;
        }
        if (append(&c->line, &c->line_len, &c->line_cap, &ch, 1))
            return 0;
    }
    return total;
}

static size_t on_header(char *p, size_t size, size_t n, void *arg)
{
    bs_call *c = arg;
    size_t total = size * n;
    static const char name[] = "x-rebound-restore:";
    if (total > sizeof name - 1 && !strncasecmp(p, name, sizeof name - 1)) {
        size_t i = sizeof name - 1, k = 0;
        while (i < total && (p[i] == ' ' || p[i] == '\t'))
            i++;
        char v[PLACE_LEN];
        while (i < total && k + 1 < sizeof v && (isalnum((unsigned char)p[i]) || p[i] == '_'))
            v[k++] = p[i++];
        v[k] = 0;
        if (k)
            snprintf(c->t->place, sizeof c->t->place, "%s", v);
    }
    return total;
}

static void fail(bench *b, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(bench *b, const char *hint, const char *fmt, ...)
{
    pthread_mutex_lock(&b->mu);
    if (!b->is_failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->fail_msg, sizeof b->fail_msg, fmt, ap);
        va_end(ap);
        b->fail_hint = hint;
        b->is_failed = 1;
    }
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

/* The user's new message of turn t (deterministic: seed, conversation, round). */
static char *turn_text(const bench *b, const bs_turn *t)
{
    uint64_t rng = (uint64_t)b->o.seed * 0x100000001b3ull ^ ((uint64_t)t->conv << 20) ^
                   (uint64_t)t->round;
    splitmix(&rng);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc;
    if (t->round == 0) {
        char head[64];
        snprintf(head, sizeof head, "Document %d:", t->conv + 1);
        rc = append(&buf, &len, &cap, head, strlen(head));
        rc = rc ? rc : gen_text(&rng, b->o.context > 8 ? b->o.context - 4 : 4, '.', &buf, &len, &cap);
    } else {
        rc = gen_text(&rng, b->o.turn, '?', &buf, &len, &cap);
    }
    if (rc) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* Runs turn t of conversation cv on the handle h. 0, or -1 after fail(). */
static int run_turn(bench *b, CURL *h, bs_turn *t, bs_conv *cv)
{
    char *text = turn_text(b, t);
    json_t *req = json_object(), *msgs = json_deep_copy(cv->messages), *m = json_object();
    if (!text || !req || !msgs || !m) {
        free(text);
        json_decref(req), json_decref(msgs), json_decref(m);
        fail(b, NULL, "out of memory");
        return -1;
    }
    json_object_set_new(m, "role", json_string("user"));
    json_object_set_new(m, "content", json_string(text));
    free(text);
    json_array_append(msgs, m);
    json_object_set_new(req, "model", json_string(b->o.model));
    json_object_set_new(req, "messages", msgs);
    json_object_set_new(req, "max_tokens", json_integer(b->o.gen));
    json_object_set_new(req, "temperature", json_real(0));
    json_object_set_new(req, "seed", json_integer(b->o.seed));
    json_object_set_new(req, "stream", json_true());
    json_t *so = json_object();
    json_object_set_new(so, "include_usage", json_true());
    json_object_set_new(req, "stream_options", so);
    if (b->o.ignore_eos)
        json_object_set_new(req, "ignore_eos", json_true());
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!body) {
        json_decref(m);
        fail(b, NULL, "out of memory");
        return -1;
    }

    bs_call c = {.t = t, .pid = b->o.pid, .flt0 = -1};
    t->faults = -1;
    snprintf(t->place, sizeof t->place, "unknown");
    t->prompt_tokens = t->cached_tokens = t->completion_tokens = -1;
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    hdr = curl_slist_append(hdr, "Accept: text/event-stream");
    char auth[1100];
    if (b->o.api_key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", b->o.api_key);
        hdr = curl_slist_append(hdr, auth);
    }
    char curl_err[CURL_ERROR_SIZE] = "";
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, b->endpoint);
    if (b->o.unix_path)
        curl_easy_setopt(h, CURLOPT_UNIX_SOCKET_PATH, b->o.unix_path);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &c);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &c);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(b->o.timeout_s * 1000));
    c.flt0 = c.pid ? read_minflt(c.pid) : -1;
    t->t_send = c.t0 = rb_cli_now_s();
    CURLcode cc = curl_easy_perform(h);
    double t_end = rb_cli_now_s();
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hdr);
    free(body);
    int rc = -1;
    if (cc != CURLE_OK) {
        fail(b, cc == CURLE_COULDNT_CONNECT ? "is the server running, on that host and port?"
                                            : NULL,
             "%s: %s", b->endpoint, curl_err[0] ? curl_err : curl_easy_strerror(cc));
    } else if (status != 200) {
        json_t *j = c.body ? json_loads(c.body, 0, NULL) : NULL;
        json_t *e = j ? json_object_get(j, "error") : NULL;
        json_t *msg = json_is_object(e) ? json_object_get(e, "message") : e;
        fail(b, status == 404 ? "the URL should be the server's base (http://HOST:PORT) or its "
                                "/v1/chat/completions" : NULL,
             "%s answered HTTP %ld: %s", b->endpoint, status,
             json_is_string(msg) ? json_string_value(msg) : c.body ? c.body : "(no body)");
        json_decref(j);
    } else if (c.server_err[0]) {
        fail(b, NULL, "%s: the stream ended with an error: %s", b->endpoint, c.server_err);
    } else if (!t->n_content && t->completion_tokens != 0) {
        fail(b, "is it an OpenAI-compatible chat endpoint that streams (stream: true)?",
             "%s: the reply carried no content events", b->endpoint);
    } else {
        t->ttft_s = (t->n_content ? c.t_first : t_end) - c.t0;
        t->decode_s = t->n_content > 1 ? c.t_last - c.t_first : 0;
        if (t->completion_tokens < 0)
            t->completion_tokens = t->n_content;
        json_t *a = json_object();
        json_object_set_new(a, "role", json_string("assistant"));
        json_object_set_new(a, "content", json_string(c.reply ? c.reply : ""));
        /* the conversation is this worker's until it is handed back */
        json_array_append_new(cv->messages, m);
        json_array_append_new(cv->messages, a);
        m = NULL;
        t->is_done = 1;
        rc = 0;
    }
    json_decref(m);
    free(c.line);
    free(c.body);
    free(c.reply);
    return rc;
}

/* ---- the workload ------------------------------------------------------------------ */

static void *worker_main(void *arg)
{
    bench *b = arg;
    CURL *h = curl_easy_init();
    if (!h) {
        fail(b, NULL, "curl_easy_init failed");
        return NULL;
    }
    size_t K = b->o.k;
    pthread_mutex_lock(&b->mu);
    for (;;) {
        if (b->is_failed)
            break;
        /* the first turn in order whose conversation is idle and whose
           earlier turns are done; returns wait for every opening */
        bs_turn *t = NULL;
        size_t n_left = 0;
        for (size_t i = 0; i < b->n_turns; i++) {
            bs_turn *x = &b->turns[i];
            bs_conv *cv = &b->convs[x->conv];
            if (x->idx_in_conv < cv->n_taken)
                continue;
            n_left++;
            if (cv->is_busy || x->idx_in_conv != cv->n_taken ||
                (x->round > 0 && b->n_opens_done < K))
                continue;
            t = x;
            break;
        }
        if (!t) {
            if (!n_left)
                break;
            pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        bs_conv *cv = &b->convs[t->conv];
        cv->is_busy = 1;
        cv->n_taken++;
        pthread_mutex_unlock(&b->mu);
        int rc = run_turn(b, h, t, cv);
        pthread_mutex_lock(&b->mu);
        cv->is_busy = 0;
        if (rc == 0 && t->round == 0)
            b->n_opens_done++;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    curl_easy_cleanup(h);
    return NULL;
}

/* The turns: K openings, then R rounds of returns in the chosen order. */
static int plan_turns(bench *b)
{
    const bs_opts *o = &b->o;
    size_t K = o->k;
    b->n_turns = K * (1 + (size_t)o->rounds);
    b->turns = calloc(b->n_turns, sizeof *b->turns);
    b->convs = calloc(K, sizeof *b->convs);
    int *perm = malloc(K * sizeof *perm), *n_seen = calloc(K, sizeof *n_seen);
    double *cdf = malloc(K * sizeof *cdf);
    if (!b->turns || !b->convs || !perm || !n_seen || !cdf) {
        free(perm), free(n_seen), free(cdf);
        return -1;
    }
    uint64_t rng = (uint64_t)o->seed ^ 0x5eedull;
    int is_zipf = !strcmp(o->order, "zipf");
    for (size_t i = 0; i < K; i++)
        perm[i] = (int)i;
    double sum = 0;
    for (size_t i = 0; i < K; i++)
        cdf[i] = (sum += 1.0 / pow((double)(i + 1), o->zipf_s));
    for (size_t i = K; i-- > 1;) { /* the Zipf ranking: a shuffle */
        size_t j = splitmix(&rng) % (i + 1);
        int x = perm[i];
        perm[i] = perm[j], perm[j] = x;
    }
    size_t n = 0;
    for (size_t i = 0; i < K; i++)
        b->turns[n++] = (bs_turn){.conv = (int)i, .round = 0};
    for (uint32_t r = 1; r <= o->rounds; r++) {
        if (!is_zipf) {
            for (size_t i = K; i-- > 1;) {
                size_t j = splitmix(&rng) % (i + 1);
                int x = perm[i];
                perm[i] = perm[j], perm[j] = x;
            }
        }
        for (size_t i = 0; i < K; i++) {
            int conv = perm[i];
            if (is_zipf) {
                double u = unit(&rng) * sum;
                size_t rank = 0;
                while (rank + 1 < K && cdf[rank] < u)
                    rank++;
                conv = perm[rank];
            }
            b->turns[n++] = (bs_turn){.conv = conv, .round = (int)r};
        }
    }
    for (size_t i = 0; i < n; i++)
        b->turns[i].idx_in_conv = n_seen[b->turns[i].conv]++;
    free(perm), free(n_seen), free(cdf);
    /* --system S: one system message of about S tokens opens every
       conversation (the same text: what apps send to each chat) */
    char *sys = NULL;
    size_t sys_len = 0, sys_cap = 0;
    if (b->o.system) {
        uint64_t srng = (uint64_t)b->o.seed * 0x9e3779b97f4a7c15ull ^ 0x5e5ull;
        splitmix(&srng);
        if (append(&sys, &sys_len, &sys_cap, "Instructions:", 13) ||
            gen_text(&srng, b->o.system > 4 ? b->o.system - 2 : 2, '.', &sys, &sys_len, &sys_cap)) {
            free(sys);
            return -1;
        }
    }
    for (size_t i = 0; i < K; i++) {
        if (!(b->convs[i].messages = json_array()))
            goto fail;
        if (sys) {
            json_t *m = json_object();
            if (!m || json_object_set_new(m, "role", json_string("system")) ||
                json_object_set_new(m, "content", json_string(sys)) ||
                json_array_append_new(b->convs[i].messages, m))
                goto fail;
        }
    }
    free(sys);
    return 0;
fail:
    free(sys);
    return -1;
}

/* ---- the report --------------------------------------------------------------------- */

/* Tokens after the first over the time they took: the server's count of
 * completion tokens when it gave one (an event may carry several tokens),
 * else the content events. 0 when there is no second token. */
static double decode_tokens(const bs_turn *t)
{
    int64_t n = t->completion_tokens > 0 ? t->completion_tokens : t->n_content;
    return t->decode_s > 0 && n > 1 ? (double)(n - 1) : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* nearest rank: the smallest value with at least p of the values at or below it */
static double pct(const double *sorted, size_t n, double p)
{
    size_t r = (size_t)ceil(p * (double)n);
    return sorted[r ? r - 1 : 0];
}

typedef struct bs_group {
    const char *turn, *place;
    size_t n;
    double p50_ms, p95_ms, max_ms;
    double prompt_mean;
} bs_group;

static const char *const places[] = {"resident", "compressed", "stored", "file",
                                     "new",      "recomputed", "unknown"};

/* TTFT of the done turns of one kind (round 0 or not) and place (NULL: any). */
static int group_stats(const bench *b, int is_return, const char *place, bs_group *g)
{
    double *v = malloc((b->n_turns + 1) * sizeof *v);
    if (!v)
        return -1;
    size_t n = 0;
    double prompt = 0;
    size_t n_prompt = 0;
    for (size_t i = 0; i < b->n_turns; i++) {
        const bs_turn *t = &b->turns[i];
        if (!t->is_done || (t->round > 0) != is_return || (place && strcmp(t->place, place)))
            continue;
        v[n++] = t->ttft_s * 1e3;
        if (t->prompt_tokens >= 0)
            prompt += (double)t->prompt_tokens, n_prompt++;
    }
    g->turn = is_return ? "return" : "open";
    g->place = place ? place : "all";
    g->n = n;
    if (n) {
        qsort(v, n, sizeof *v, cmp_double);
        g->p50_ms = pct(v, n, 0.50);
        g->p95_ms = pct(v, n, 0.95);
        g->max_ms = v[n - 1];
    }
    g->prompt_mean = n_prompt ? prompt / (double)n_prompt : -1;
    free(v);
    return 0;
}

static void read_loadavg(double *l1)
{
    *l1 = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", l1) != 1)
            *l1 = -1;
        fclose(f);
    }
}

static int opt_order(void *dest, const char *v, char *why, size_t why_n)
{
    if (strcmp(v, "shuffle") && strcmp(v, "zipf")) {
        snprintf(why, why_n, "shuffle or zipf");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

static int opt_output(void *dest, const char *v, char *why, size_t why_n)
{
    if (strcmp(v, "table") && strcmp(v, "json")) {
        snprintf(why, why_n, "table or json");
        return -1;
    }
    *(const char **)dest = v;
    return 0;
}

/* The endpoint from URL: a base (http://h:p, http://h:p/v1) gets
 * /v1/chat/completions; a URL ending in /chat/completions is used as is. */
static int make_endpoint(bench *b, char *why, size_t why_n)
{
    const char *u = b->o.url;
    size_t n = strlen(u);
    if (strncmp(u, "http://", 7) && strncmp(u, "https://", 8)) {
        snprintf(why, why_n, "URL '%s' is not http:// or https://", u);
        return -1;
    }
    const char *host = strstr(u, "://") + 3;
    if (!*host || *host == '/') {
        snprintf(why, why_n, "URL '%s' has no host", u);
        return -1;
    }
    if (n + 32 > sizeof b->endpoint) {
        snprintf(why, why_n, "URL is too long (%zu characters)", n);
        return -1;
    }
    while (n && u[n - 1] == '/')
        n--;
    const char *tail = "/v1/chat/completions";
    if (n >= 17 && !strncmp(u + n - 17, "/chat/completions", 17))
        tail = "";
    else if (n >= 3 && !strncmp(u + n - 3, "/v1", 3))
        tail = "/chat/completions";
    snprintf(b->endpoint, sizeof b->endpoint, "%.*s%s", (int)n, u, tail);
    return 0;
}

/* The returns' first tokens by phase (the server's timings): p50, p95 and
 * max of each phase over the returns, then the slowest returns one by
 * one, so that a tail shows where its seconds went. */
static void print_phases(const bench *b)
{
    size_t n = 0;
    for (size_t i = 0; i < b->n_turns; i++)
        n += b->turns[i].is_done && b->turns[i].round > 0 && b->turns[i].has_srv;
    if (!n)
        return;
    double *v = malloc(n * sizeof *v);
    size_t *ix = malloc(n * sizeof *ix);
    if (!v || !ix) {
        free(v), free(ix);
        return;
    }
    printf("\nreturns' first token by phase (the server's timings, %zu returns; restores ride "
           "in prefill):\n%-15s %10s %10s %10s\n", n, "phase", "p50", "p95", "max (ms)");
    for (int ph = 0; ph < BS_N_PHASES; ph++) {
        size_t k = 0;
        for (size_t i = 0; i < b->n_turns; i++) {
            const bs_turn *t = &b->turns[i];
            if (t->is_done && t->round > 0 && t->has_srv)
                v[k++] = t->srv[ph];
        }
        qsort(v, k, sizeof *v, cmp_double);
        printf("%-15s %10.1f %10.1f %10.1f\n", phase_names[ph], pct(v, k, 0.5), pct(v, k, 0.95),
               v[k - 1]);
    }
    /* the slowest returns by client TTFT */
    size_t k = 0;
    for (size_t i = 0; i < b->n_turns; i++) {
        const bs_turn *t = &b->turns[i];
        if (t->is_done && t->round > 0 && t->has_srv)
            ix[k++] = i;
    }
    for (size_t a = 0; a < k; a++) /* selection of the 5 slowest: k is small */
        for (size_t c = a + 1; c < k; c++)
            if (b->turns[ix[c]].ttft_s > b->turns[ix[a]].ttft_s) {
                size_t x = ix[a];
                ix[a] = ix[c], ix[c] = x;
            }
    /* with --pid: the server's page faults by each return's first token */
    size_t nf = 0;
    for (size_t i = 0; i < b->n_turns; i++) {
        const bs_turn *t = &b->turns[i];
        if (t->is_done && t->round > 0 && t->has_srv && t->faults >= 0)
            v[nf++] = (double)t->faults;
    }
    if (nf) {
        qsort(v, nf, sizeof *v, cmp_double);
        printf("%-15s %10.0f %10.0f %10.0f (the server process's minor faults%s)\n",
               "page faults", pct(v, nf, 0.5), pct(v, nf, 0.95), v[nf - 1],
               b->o.jobs > 1 ? ", every request in flight's" : "");
    }
    printf("slowest returns: TTFT = queue + open + prefill (room ms; restore: MiB read, I/O ms, "
           "decode ms, wait ms%s)\n", nf ? "; page faults" : "");
    for (size_t a = 0; a < k && a < 5; a++) {
        const bs_turn *t = &b->turns[ix[a]];
        printf("  conversation %d round %d (%s): %.0f ms = %.0f + %.0f + %.0f (%.0f; %.1f MiB, %.0f, "
               "%.0f, %.0f); %" PRId64 " of %" PRId64 " prompt tokens cached", t->conv, t->round,
               t->place, t->ttft_s * 1e3, t->srv[PH_QUEUE], t->srv[PH_OPEN], t->srv[PH_PREFILL],
               t->srv[PH_ROOM], t->srv_read_bytes > 0 ? (double)t->srv_read_bytes / 1048576.0 : 0.0,
               t->srv[PH_IO], t->srv[PH_DECODE], t->srv[PH_WAIT], t->cached_tokens,
               t->prompt_tokens);
        if (t->faults >= 0)
            printf("; %" PRId64 " page faults", t->faults);
        printf("\n");
    }
    free(v), free(ix);
}

/*
 * With --rate: each return against its floor, the resident return's TTFT
 * plus the bytes its restore read at the device's rate (issue targets:
 * every return within 1.25x of it, returns' p95 within 1.5x of the
 * resident p50). The resident TTFT is --resident-ms, else this run's
 * resident returns' p50 (a run whose budget keeps none resident must be
 * given it from a run without one). Returns without the server's
 * timings are left out. n 0: no floor.
 */
typedef struct bs_floor {
    double resident_ms;       /* the base used */
    const char *resident_from; /* "--resident-ms" or "this run's resident returns" */
    size_t n, n_over;         /* returns compared, those above 1.25x */
    double ratio_p50, ratio_max;
    int worst;                /* the worst's index in turns */
    double p95_over_resident; /* returns' p95 TTFT / resident_ms */
} bs_floor;

static int floor_stats(const bench *b, bs_floor *f)
{
    memset(f, 0, sizeof *f);
    f->worst = -1;
    if (!(b->o.rate_mib_s > 0))
        return 0;
    f->resident_ms = b->o.resident_ms;
    f->resident_from = "--resident-ms";
    bs_group g;
    if (!(f->resident_ms > 0)) {
        if (group_stats(b, 1, "resident", &g) != 0)
            return -1;
        if (!g.n)
            return 0;
        f->resident_ms = g.p50_ms;
        f->resident_from = "this run's resident returns";
    }
    double *v = malloc((b->n_turns + 1) * sizeof *v);
    if (!v)
        return -1;
    for (size_t i = 0; i < b->n_turns; i++) {
        const bs_turn *t = &b->turns[i];
        if (!t->is_done || t->round == 0 || !t->has_srv)
            continue;
        const double read_ms = t->srv_read_bytes > 0 ? (double)t->srv_read_bytes / 1048576.0 /
                                                           b->o.rate_mib_s * 1e3 : 0.0;
        const double r = t->ttft_s * 1e3 / (f->resident_ms + read_ms);
        v[f->n++] = r;
        f->n_over += r > 1.25;
        if (f->worst < 0 || r > f->ratio_max)
            f->ratio_max = r, f->worst = (int)i;
    }
    if (f->n) {
        qsort(v, f->n, sizeof *v, cmp_double);
        f->ratio_p50 = pct(v, f->n, 0.5);
    }
    free(v);
    if (group_stats(b, 1, NULL, &g) != 0)
        return -1;
    f->p95_over_resident = g.n ? g.p95_ms / f->resident_ms : 0;
    return 0;
}

static void print_floor(const bench *b, const bs_floor *f)
{
    if (!(b->o.rate_mib_s > 0))
        return;
    if (!f->n) {
        printf("\nfloor: no return to compare (%s)\n",
               f->resident_ms > 0 ? "the server sent no timings"
                                  : "no resident return in this run: give --resident-ms");
        return;
    }
    const bs_turn *w = &b->turns[f->worst];
    printf("\nreturns against their floor (resident %.1f ms from %s + MiB read / %.0f MiB/s):\n"
           "  TTFT / floor p50 %.2fx, max %.2fx (conversation %d round %d: %.1f ms, %.1f MiB "
           "read); above 1.25x: %zu of %zu\n  returns' p95 / resident: %.2fx\n",
           f->resident_ms, f->resident_from, b->o.rate_mib_s, f->ratio_p50, f->ratio_max, w->conv,
           w->round, w->ttft_s * 1e3,
           w->srv_read_bytes > 0 ? (double)w->srv_read_bytes / 1048576.0 : 0.0, f->n_over, f->n,
           f->p95_over_resident);
}

/* With --system: what the openings after the first took from the shared
 * prompt (the server's cached tokens) and their TTFT against the first's. */
static void shared_stats(const bench *b, double *first_ms, double *p50_ms, double *p95_ms,
                         double *cached_mean, size_t *n_out)
{
    double *v = malloc((b->n_turns + 1) * sizeof *v), cached = 0;
    size_t n = 0;
    *first_ms = *p50_ms = *p95_ms = *cached_mean = -1;
    for (size_t i = 0; v && i < b->n_turns; i++) {
        const bs_turn *t = &b->turns[i];
        if (!t->is_done || t->round != 0)
            continue;
        if (t->conv == 0) {
            *first_ms = t->ttft_s * 1e3;
            continue;
        }
        v[n++] = t->ttft_s * 1e3;
        cached += t->cached_tokens > 0 ? (double)t->cached_tokens : 0;
    }
    if (n) {
        qsort(v, n, sizeof *v, cmp_double);
        *p50_ms = pct(v, n, 0.5), *p95_ms = pct(v, n, 0.95);
        *cached_mean = cached / (double)n;
    }
    *n_out = n;
    free(v);
}

static void print_shared(const bench *b)
{
    double first, p50, p95, cached;
    size_t n;
    shared_stats(b, &first, &p50, &p95, &cached, &n);
    if (!n)
        return;
    printf("\nshared system prompt of ~%" PRIu32 " tokens: the first opening %.1f ms; the %zu "
           "after it %.1f ms p50, %.1f ms p95, %.0f cached tokens on average\n", b->o.system,
           first, n, p50, p95, cached);
}

static void print_table(const bench *b, const bs_group *g, size_t n_g, double wall_s,
                        double tok_s_med, double tok_s_all, const rss_watch *w, double load0,
                        double load1, const char *cpu)
{
    const bs_opts *o = &b->o;
    char bb[32];
    printf("bench-serve %s: %" PRIu32 " conversations of ~%" PRIu32 " tokens, %" PRIu32
           " rounds (%s), turns of ~%" PRIu32 " tokens, %" PRIu32 " generated, -j %" PRIu32
           ", seed %" PRId64 "\n", b->endpoint, o->k, o->context, o->rounds, o->order, o->turn,
           o->gen, o->jobs, o->seed);
    printf("client CPU %s, load average %.2f at start, %.2f at end; wall %.1f s\n\n", cpu, load0,
           load1, wall_s);
    printf("%-7s %-11s %4s %12s %10s %10s %10s\n", "turn", "kv was", "n", "prompt tok", "TTFT p50",
           "p95", "max (ms)");
    for (size_t i = 0; i < n_g; i++) {
        char pr[32] = "-";
        if (g[i].prompt_mean >= 0)
            snprintf(pr, sizeof pr, "%.0f", g[i].prompt_mean);
        printf("%-7s %-11s %4zu %12s %10.1f %10.1f %10.1f\n", g[i].turn, g[i].place, g[i].n, pr,
               g[i].p50_ms, g[i].p95_ms, g[i].max_ms);
    }
    if (o->system)
        print_shared(b);
    printf("\ndecode: %.1f tok/s a stream (median of turns), %.1f tok/s over all turns' decode "
           "time\n", tok_s_med, tok_s_all);
    print_phases(b);
    bs_floor fl;
    if (floor_stats(b, &fl) == 0)
        print_floor(b, &fl);
    if (w) {
        printf("server pid %d: max RSS %s sampled", w->pid, rb_cli_bytes(w->max_rss, bb, sizeof bb));
        printf(" (anonymous %s)", rb_cli_bytes(w->max_anon, bb, sizeof bb));
        printf(", VmHWM %s (its peak since it started)%s\n", rb_cli_bytes(w->hwm, bb, sizeof bb),
               w->is_gone ? "; the process ended during the run" : "");
    }
}

static json_t *json_report(const bench *b, const bs_group *g, size_t n_g, double wall_s,
                           double tok_s_med, double tok_s_all, const rss_watch *w, double load0,
                           double load1, const char *cpu)
{
    const bs_opts *o = &b->o;
    json_t *r = json_object(), *groups = json_array(), *turns = json_array();
    json_object_set_new(r, "endpoint", json_string(b->endpoint));
    json_object_set_new(r, "conversations", json_integer(o->k));
    json_object_set_new(r, "context_tokens", json_integer(o->context));
    json_object_set_new(r, "rounds", json_integer(o->rounds));
    json_object_set_new(r, "order", json_string(o->order));
    json_object_set_new(r, "turn_tokens", json_integer(o->turn));
    json_object_set_new(r, "system_tokens", json_integer(o->system));
    if (o->system) {
        double first, p50, p95, cached;
        size_t n;
        shared_stats(b, &first, &p50, &p95, &cached, &n);
        json_t *x = json_object();
        json_object_set_new(x, "first_opening_ttft_ms", json_real(first));
        json_object_set_new(x, "later_openings", json_integer((json_int_t)n));
        json_object_set_new(x, "later_ttft_p50_ms", json_real(p50));
        json_object_set_new(x, "later_ttft_p95_ms", json_real(p95));
        json_object_set_new(x, "later_cached_tokens_mean", json_real(cached));
        json_object_set_new(r, "shared_prefix", x);
    }
    bs_floor fl;
    if (o->rate_mib_s > 0 && floor_stats(b, &fl) == 0 && fl.n) {
        json_t *x = json_object();
        json_object_set_new(x, "rate_mib_s", json_real(o->rate_mib_s));
        json_object_set_new(x, "resident_ms", json_real(fl.resident_ms));
        json_object_set_new(x, "resident_from", json_string(fl.resident_from));
        json_object_set_new(x, "returns", json_integer((json_int_t)fl.n));
        json_object_set_new(x, "ratio_p50", json_real(fl.ratio_p50));
        json_object_set_new(x, "ratio_max", json_real(fl.ratio_max));
        json_object_set_new(x, "above_1_25x", json_integer((json_int_t)fl.n_over));
        json_object_set_new(x, "p95_over_resident", json_real(fl.p95_over_resident));
        json_object_set_new(r, "floor", x);
    } else {
        json_object_set_new(r, "floor", json_null());
    }
    json_object_set_new(r, "gen_tokens", json_integer(o->gen));
    json_object_set_new(r, "concurrency", json_integer(o->jobs));
    json_object_set_new(r, "seed", json_integer(o->seed));
    json_object_set_new(r, "cpu", json_string(cpu));
    json_object_set_new(r, "load_start", json_real(load0));
    json_object_set_new(r, "load_end", json_real(load1));
    json_object_set_new(r, "wall_s", json_real(wall_s));
    json_object_set_new(r, "decode_tok_s_median", json_real(tok_s_med));
    json_object_set_new(r, "decode_tok_s_all", json_real(tok_s_all));
    for (size_t i = 0; i < n_g; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "turn", json_string(g[i].turn));
        json_object_set_new(x, "kv_was", json_string(g[i].place));
        json_object_set_new(x, "n", json_integer((json_int_t)g[i].n));
        json_object_set_new(x, "prompt_tokens_mean",
                            g[i].prompt_mean >= 0 ? json_real(g[i].prompt_mean) : json_null());
        json_object_set_new(x, "ttft_p50_ms", json_real(g[i].p50_ms));
        json_object_set_new(x, "ttft_p95_ms", json_real(g[i].p95_ms));
        json_object_set_new(x, "ttft_max_ms", json_real(g[i].max_ms));
        json_array_append_new(groups, x);
    }
    json_object_set_new(r, "ttft", groups);
    for (size_t i = 0; i < b->n_turns; i++) {
        const bs_turn *t = &b->turns[i];
        if (!t->is_done)
            continue;
        json_t *x = json_object();
        json_object_set_new(x, "conversation", json_integer(t->conv));
        json_object_set_new(x, "round", json_integer(t->round));
        json_object_set_new(x, "kv_was", json_string(t->place));
        json_object_set_new(x, "ttft_ms", json_real(t->ttft_s * 1e3));
        json_object_set_new(x, "prompt_tokens", json_integer(t->prompt_tokens));
        json_object_set_new(x, "cached_tokens", json_integer(t->cached_tokens));
        json_object_set_new(x, "completion_tokens", json_integer(t->completion_tokens));
        json_object_set_new(x, "server_page_faults",
                            t->faults >= 0 ? json_integer(t->faults) : json_null());
        json_object_set_new(x, "decode_tok_s", decode_tokens(t) > 0
                                                   ? json_real(decode_tokens(t) / t->decode_s)
                                                   : json_null());
        if (t->has_srv) {
            json_t *tm = json_object();
            for (int ph = 0; ph < BS_N_PHASES; ph++)
                json_object_set_new(tm, phase_keys[ph], json_real(t->srv[ph]));
            json_object_set_new(tm, "restore_read_bytes", json_integer(t->srv_read_bytes));
            json_object_set_new(x, "server_timings", tm);
        } else {
            json_object_set_new(x, "server_timings", json_null());
        }
        json_array_append_new(turns, x);
    }
    json_object_set_new(r, "turns", turns);
    if (w) {
        json_t *x = json_object();
        json_object_set_new(x, "pid", json_integer(w->pid));
        json_object_set_new(x, "max_rss_bytes", json_integer((json_int_t)w->max_rss));
        json_object_set_new(x, "max_rss_anon_bytes", json_integer((json_int_t)w->max_anon));
        json_object_set_new(x, "vm_hwm_bytes", json_integer((json_int_t)w->hwm));
        json_object_set_new(x, "ended_during_run", json_boolean(w->is_gone));
        json_object_set_new(r, "server", x);
    } else {
        json_object_set_new(r, "server", json_null());
    }
    return r;
}

int rb_cmd_bench_serve(int argc, char **argv)
{
    bench b = {0};
    bs_opts *o = &b.o;
    *o = (bs_opts){.model = "default", .order = "shuffle", .output = "table", .k = 4,
                   .context = 2048, .rounds = 3, .turn = 8, .gen = 32, .jobs = 1, .seed = 1,
                   .zipf_s = 1.0, .timeout_s = 600};
    const char *pos[1] = {NULL};
    int n_pos = 0;
    const rb_opt opts[] = {
        {NULL, RB_OPT_SECTION, NULL, "the workload:", NULL, 0, 0, NULL, NULL},
        {"-k|--conversations", RB_OPT_U32, "K", "conversations (default 4)", &o->k, 1, MAX_K,
         NULL, NULL},
        {"-c|--context", RB_OPT_U32, "C", "tokens of each conversation's first message "
         "(default 2048; English\nwords, about one token each: the server's count is "
         "reported)", &o->context, 8, 1e7, NULL, NULL},
        {"-r|--rounds", RB_OPT_U32, "R", "rounds of returns to the conversations (default 3)",
         &o->rounds, 0, 1e5, NULL, NULL},
        {"--order", RB_OPT_CALL, "O", "a round's order: shuffle (each conversation once, "
         "default) or zipf\n(K draws, rank r with weight 1/r^s)", &o->order, 0, 0, opt_order,
         NULL},
        {"--zipf-s", RB_OPT_DOUBLE, "S", "the Zipf exponent (default 1.0)", &o->zipf_s, 0, 10,
         NULL, NULL},
        {"--system", RB_OPT_U32, "S", "a system message of about S tokens, the same in every "
         "conversation\n(apps' shared instructions; default 0: none)", &o->system, 0, 1e7, NULL,
         NULL},
        {"--turn", RB_OPT_U32, "T", "tokens of each returning message (default 8)", &o->turn,
         2, 1e6, NULL, NULL},
        {"-n|--gen", RB_OPT_U32, "G", "tokens generated a turn (max_tokens; default 32)",
         &o->gen, 1, 1e6, NULL, NULL},
        {"-j|--concurrency", RB_OPT_U32, "N", "requests in flight at once (default 1)",
         &o->jobs, 1, MAX_J, NULL, NULL},
        {"-s|--seed", RB_OPT_I64, "N", "the text and the order (default 1)", &o->seed, 0,
         9.2e18, NULL, NULL},
        {"--ignore-eos", RB_OPT_FLAG, NULL, "send ignore_eos (llama-server): replies of G "
         "tokens", &o->ignore_eos, 0, 0, NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "the server:", NULL, 0, 0, NULL, NULL},
        {"--unix", RB_OPT_STR, "PATH", "connect to a Unix socket (URL still names the path)",
         &o->unix_path, 0, 0, NULL, NULL},
        {"--model", RB_OPT_STR, "NAME", "the requests' \"model\" (default \"default\")",
         &o->model, 0, 0, NULL, NULL},
        {"--api-key", RB_OPT_STR, "KEY", "sent as Authorization: Bearer KEY", &o->api_key, 0, 0,
         NULL, NULL},
        {"--pid", RB_OPT_INT, "PID", "the server's process: its RSS is sampled every 5 ms "
         "(/proc/PID/status),\nits page faults counted to each first token (/proc/PID/stat)", &o->pid, 1, 4194304, NULL, NULL},
        {"--timeout", RB_OPT_DOUBLE, "S", "seconds a request may take (default 600)",
         &o->timeout_s, 0.1, 1e6, NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "the floor (each return against resident TTFT + bytes "
         "read / rate):", NULL, 0, 0, NULL, NULL},
        {"--rate", RB_OPT_DOUBLE, "MIB_S", "the device's read rate in MiB/s (the server's "
         "--device: phone 1000,\nwatch 100, host 2000); reports each return's TTFT over its "
         "floor", &o->rate_mib_s, 1, 1e7, NULL, NULL},
        {"--resident-ms", RB_OPT_DOUBLE, "MS", "the resident return's TTFT (default: this "
         "run's resident returns' p50;\na budgeted run may have none: take it from a run "
         "without one)", &o->resident_ms, 0.001, 1e7, NULL, NULL},
        {"-o|--output", RB_OPT_CALL, "FMT", "table (default) or json, on stdout", &o->output, 0,
         0, opt_output, NULL},
        {0},
    };
    const rb_cli_cmd cmd = {
        CMD, "URL [options]",
        "A workload driver for any OpenAI-compatible server (URL: http://HOST:PORT,\n"
        "or its /v1/chat/completions): K conversations, each opened with a long\n"
        "message, then R rounds of short returns to each, streamed. Reports TTFT\n"
        "p50/p95/max of openings and returns by where the server found the\n"
        "conversation's KV (rebound serve's X-Rebound-Restore: resident, compressed,\n"
        "stored, file, new, recomputed; other servers: unknown), decode tok/s and,\n"
        "with --pid, the server's max RSS.",
        opts,
        "example:\n"
        "  rebound serve -m model.gguf --port 8080 & \n"
        "  rebound bench-serve http://127.0.0.1:8080 -k 10 -c 2048 -r 3 --pid $!\n",
        pos, 1, &n_pos, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (n_pos != 1)
        return rb_cli_usage_error(CMD, n_pos ? "one URL only" : "no URL given",
                                  "rebound bench-serve http://127.0.0.1:8080");
    o->url = pos[0];
    char why[256];
    if (make_endpoint(&b, why, sizeof why))
        return rb_cli_usage_error(CMD, why, "give the server's base, e.g. http://127.0.0.1:8080");
    rss_watch w = {.pid = o->pid};
    if (o->pid) {
        uint64_t x, y, z;
        if (read_status(o->pid, &x, &y, &z) != 0) {
            snprintf(why, sizeof why, "--pid %d: cannot read /proc/%d/status: %s", o->pid, o->pid,
                     strerror(errno));
            return rb_cli_fail(CMD, why, "give the server's process id (e.g. $! after starting it)");
        }
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0)
        return rb_cli_fail(CMD, "curl_global_init failed", NULL);
    int rc = 1;
    pthread_t th[MAX_J];
    uint32_t n_th = 0;
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    if (plan_turns(&b) != 0) {
        rb_cli_fail(CMD, "out of memory", NULL);
        goto done;
    }
    char cpu[256];
    rb_cli_cpu_name(cpu, sizeof cpu);
    double load0, load1;
    read_loadavg(&load0);
    if (o->pid && pthread_create(&w.th, NULL, rss_main, &w) != 0) {
        rb_cli_fail(CMD, "cannot start the RSS sampling thread", NULL);
        goto done;
    }
    double t0 = rb_cli_now_s();
    for (; n_th < o->jobs; n_th++)
        if (pthread_create(&th[n_th], NULL, worker_main, &b) != 0) {
            fail(&b, NULL, "cannot start worker thread %" PRIu32, n_th);
            break;
        }
    for (uint32_t i = 0; i < n_th; i++)
        pthread_join(th[i], NULL);
    double wall_s = rb_cli_now_s() - t0;
    read_loadavg(&load1);
    if (o->pid) {
        atomic_store_explicit(&w.stop, 1, memory_order_relaxed);
        pthread_join(w.th, NULL);
        uint64_t x, y, hwm;
        if (read_status(o->pid, &x, &y, &hwm) == 0 && hwm > w.hwm)
            w.hwm = hwm;
    }
    if (b.is_failed) {
        rb_cli_fail(CMD, b.fail_msg, b.fail_hint);
        goto done;
    }
    /* TTFT by turn kind and place; decode rate */
    bs_group g[2 * (sizeof places / sizeof places[0] + 1)];
    size_t n_g = 0;
    for (int is_ret = 0; is_ret < 2; is_ret++) {
        for (size_t p = 0; p < sizeof places / sizeof places[0]; p++) {
            if (group_stats(&b, is_ret, places[p], &g[n_g]) != 0)
                goto nomem;
            n_g += g[n_g].n > 0;
        }
        if (is_ret && o->rounds) {
            if (group_stats(&b, 1, NULL, &g[n_g]) != 0)
                goto nomem;
            n_g++;
        }
    }
    double *rate = malloc(b.n_turns * sizeof *rate), dec_s = 0, dec_tok = 0;
    if (!rate)
        goto nomem;
    size_t n_rate = 0;
    for (size_t i = 0; i < b.n_turns; i++) {
        const bs_turn *t = &b.turns[i];
        if (decode_tokens(t) > 0) {
            rate[n_rate++] = decode_tokens(t) / t->decode_s;
            dec_s += t->decode_s, dec_tok += decode_tokens(t);
        }
    }
    qsort(rate, n_rate, sizeof *rate, cmp_double);
    double tok_s_med = n_rate ? pct(rate, n_rate, 0.5) : 0, tok_s_all = dec_s > 0 ? dec_tok / dec_s : 0;
    free(rate);
    if (!strcmp(o->output, "json")) {
        json_t *r = json_report(&b, g, n_g, wall_s, tok_s_med, tok_s_all, o->pid ? &w : NULL,
                                load0, load1, cpu);
        if (!r || json_dumpf(r, stdout, JSON_INDENT(1)) != 0)
            goto nomem;
        json_decref(r);
        printf("\n");
    } else {
        print_table(&b, g, n_g, wall_s, tok_s_med, tok_s_all, o->pid ? &w : NULL, load0, load1,
                    cpu);
    }
    rc = 0;
    goto done;
nomem:
    rb_cli_fail(CMD, "out of memory", NULL);
done:
    for (size_t i = 0; b.convs && i < o->k; i++)
        json_decref(b.convs[i].messages);
    free(b.convs);
    free(b.turns);
    pthread_mutex_destroy(&b.mu);
    pthread_cond_destroy(&b.cv);
    curl_global_cleanup();
    return rc;
}
