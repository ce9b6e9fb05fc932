/*
 * config.h - what every file of serve/ shares: the service's settings
 * (sv_config, filled by the CLI's `serve` command and read-only once the
 * service starts), the log line, the clock.
 *
 * serve/ is one module in seven files with one direction between them
 * (a file includes only the headers of the files before it):
 *
 *   config <- metrics <- convstore <- scheduler <- oai <- http <- serve
 *
 *   config     settings, sv_log, sv_now_s
 *   metrics    the counters and gauges /metrics shows, and their text
 *   convstore  the conversations: ids, prefix lookup, session files,
 *              limits (not "store.h": the memory module has one)
 *   scheduler  the one thread that owns the model and runs the requests
 *              (not "sched.h": that would hide the system's <sched.h>)
 *   oai        OpenAI JSON <-> request structs: pure functions, no I/O
 *   http       libmicrohttpd: routing, auth, server-sent events
 *   serve      the module's face (serve.h): start, wait for a signal, stop
 *
 * tests/layout/check_layout.sh checks that direction from the includes.
 * There is no global state: each object is a struct its creator owns and
 * passes down (libmicrohttpd's context pointers carry the HTTP side's).
 */
#ifndef RB_SERVE_CONFIG_H
#define RB_SERVE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

#define SV_NS_MAX 40          /* namespace names: [A-Za-z0-9_-]{1,40}; "" the one of no keys */
#define SV_KEYS_MAX 64

/* 1 when ns is "" or 1..SV_NS_MAX characters of [A-Za-z0-9_-]. */
int sv_ns_is_valid(const char *ns);

/* An API key and the namespace it opens (its name: [A-Za-z0-9_-]{1,40}). */
typedef struct sv_key {
    const char *key;
    const char *name;
} sv_key;

typedef struct sv_config {
    const char *model_path;
    const char *model_name;       /* /v1/models id: the file's base name */
    int use_mmap;
    rb_session_params sp;         /* per conversation (budget_bytes 0) */
    rb_sampler_params sampler;    /* request defaults */
    int has_seed;                 /* -s given: the default seed; else random per request */
    int64_t n_predict;            /* default max_tokens; -1: none */
    const char *chat_template;    /* NULL: the model's */
    const char *sessions_dir;     /* NULL: conversations live in RAM only */
    uint64_t mem_budget_bytes;    /* the pool's budget (0: none): it trims
                                     background sessions' KV, least recently
                                     used first, then weights; beyond that
                                     idle sessions are closed */
    int watch_pressure;           /* --pressure: the pool trims on the kernel's
                                     memory pressure signals (PSI, cgroup) */
    uint32_t max_conversations;   /* stored conversations; oldest deleted first */
    uint64_t max_disk_bytes;      /* session files in all; 0: no limit */
    uint32_t max_open;            /* sessions open in RAM at once */
    uint32_t parallel;            /* requests computed at once (decoded in one pass) */
    uint32_t max_queue;           /* requests waiting beyond those (429 beyond) */
    uint32_t max_stall_ms;        /* --max-stall-ms: the gap between a decoding
                                     stream's tokens that a prefill chunk is cut
                                     to keep under (scheduler.c) */
    int baseline_recompute;       /* --baseline recompute: an idle conversation
                                     keeps no KV (rewound to nothing after each
                                     request, never reopened from its file); a
                                     returning one is computed again from its
                                     tokens: the baseline bench-serve compares */
    int completions_special;      /* --completions-special: /v1/completions
                                     prompts may hold special tokens as text */
    /* HTTP */
    const char *host;             /* IPv4 or IPv6 address */
    int port;                     /* 0: any free port */
    const char *unix_path;        /* a Unix socket instead of TCP */
    const sv_key *keys;           /* --api-key / --api-keys: each its namespace */
    size_t n_keys;                /* 0: none (a Unix peer's uid, or one namespace) */
    uint64_t max_body;            /* bytes of a request body */
    uint32_t max_conn;            /* connections served at once */
    uint32_t max_conn_per_peer;   /* of one address (TCP) or uid (Unix) */
    double request_timeout_s;     /* a request's head and body must arrive within */
    uint64_t max_inflight_bytes;  /* bodies held at once; 503 beyond */
    const char *const *cors;      /* --cors origins ("*": any) */
    size_t n_cors;
} sv_config;

/* Logs one line on stderr, "rebound serve: ...", written by one stdio call
 * so that lines of several threads never mix (any thread). */
void sv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Seconds on the monotonic clock. */
double sv_now_s(void);

/* Makes room for `need` elements of `elem` bytes in the array *p of *cap
 * (doubling, from 16): 0, or -1 with *p and *cap as they were. */
int sv_grow(void **p, size_t *cap, size_t need, size_t elem);

#endif
