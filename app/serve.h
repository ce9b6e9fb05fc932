/*
 * serve.h - what the two halves of `rebound serve` share: the HTTP side
 * (serve_http.c: libmicrohttpd's connection threads, jansson for JSON)
 * and the scheduler (serve_sched.c: the one compute thread that owns the
 * model, every session and the conversation store).
 *
 * Threads and ownership:
 *   - connection threads (libmicrohttpd, one per connection) parse and
 *     check a request, put an sv_request on the scheduler's queue, and
 *     wait on the request's condition variable for its output. They never
 *     touch the model, a session, a sampler or a file.
 *   - the scheduler thread is the only thread that calls into the
 *     library: tokenizer, sessions (create, open, feed, save, trim,
 *     destroy), samplers, detokenizers, and the --sessions folder. It
 *     runs the active requests in rounds: a prefill chunk of each request
 *     still in its prompt, then one decoded token of all the others in
 *     one forward pass (rb_session_decode_multi).
 *   - an sv_request is shared by exactly those two: the fields above `mu`
 *     are written by the connection thread before it is queued and read
 *     only after; the fields below `mu` are guarded by it. It is freed by
 *     whichever side lets go last (refs).
 *   - the metrics are the server's, guarded by sv_server.metrics_mu.
 */
#ifndef RB_SERVE_H
#define RB_SERVE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

#define SV_ID_MAX 64      /* conversation ids: [A-Za-z0-9_-]{1,64} */
#define SV_STOP_MAX 4     /* OpenAI's limit of stop sequences */
#define SV_STOP_LEN_MAX 256

typedef enum sv_kind { SV_CHAT = 0, SV_COMPLETION = 1 } sv_kind;

/* OpenAI-style error classes and their HTTP statuses. */
typedef enum sv_err {
    SV_ERR_NONE = 0,
    SV_ERR_INVALID = 400,   /* invalid_request_error */
    SV_ERR_AUTH = 401,      /* authentication_error */
    SV_ERR_NOT_FOUND = 404,
    SV_ERR_METHOD = 405,
    SV_ERR_TOO_LARGE = 413,
    SV_ERR_BUSY = 429,      /* too many requests in flight */
    SV_ERR_SERVER = 500,
    SV_ERR_UNAVAILABLE = 503
} sv_err;

typedef struct sv_request {
    /* ---- written by the connection thread before it is queued ---- */
    sv_kind kind;
    int stream;
    int include_usage;            /* stream_options.include_usage */
    rb_chat_message *msgs;        /* SV_CHAT: roles and contents, owned */
    size_t n_msgs;
    char *prompt;                 /* SV_COMPLETION: owned */
    char conv_id[SV_ID_MAX + 1];  /* "": map by longest token prefix */
    int64_t max_tokens;           /* -1: until end of generation or full context */
    rb_sampler_params sp;
    int has_seed;                 /* sp.seed is the request's */
    char *stop[SV_STOP_MAX];
    int n_stop;
    double t_arrival;
    struct sv_request *next;      /* the scheduler's queue (under its mu) */

    /* ---- shared, under mu ---- */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                     /* 2 while both sides hold it */
    int is_started;               /* the prompt was accepted: usage counts known */
    int is_done;
    int is_cancelled;             /* the client left: the scheduler stops it */
    sv_err err;                   /* an error the request ended with */
    char errmsg[256];
    char *out;                    /* generated text safe to send (stop strings cut) */
    size_t out_len, out_cap;
    const char *finish_reason;    /* "stop", "length", "cancelled" */
    size_t n_prompt, n_cached, n_completion;
    char conv_out[SV_ID_MAX + 1]; /* the conversation that served it */
    const char *restore;          /* where its KV was when admitted (static
                                     string): sv_restore_name */
} sv_request;

/* Releases one side's hold; the last frees it. */
void sv_request_release(sv_request *r);

typedef struct sv_config {
    const char *model_path;
    const char *model_name;       /* /v1/models id: the file's base name */
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
    int baseline_recompute;       /* --baseline recompute: an idle conversation
                                     keeps no KV (rewound to nothing after each
                                     request, never reopened from its file); a
                                     returning one is computed again from its
                                     tokens: the baseline bench-serve compares */
} sv_config;

/* A snapshot of what the scheduler holds, for /metrics. */
typedef struct sv_mem_snapshot {
    uint64_t weights_bytes;
    uint64_t kv_resident_bytes, kv_compressed_bytes, kv_stored_bytes, kv_dropped_bytes;
    uint64_t scratch_bytes, other_bytes;
    uint64_t n_conv_open, n_conv_stored, n_conv_total;
    uint64_t disk_bytes;
    uint64_t pool_total_bytes, pool_over_bytes;   /* rb_pool_stats */
    uint64_t pool_trimmed_bytes, pool_weights_released_bytes;
} sv_mem_snapshot;

#define SV_TTFT_BUCKETS 10
/* Where a request found its conversation's KV when it was admitted (the
 * X-Rebound-Restore header): all of it in RAM, some in the compressed RAM
 * tier (none on storage), some on storage, a session reopened from its
 * file, a new conversation, or KV to compute again from the tokens (the
 * baseline, or pages a trim dropped). */
typedef enum sv_restore {
    SV_RESTORE_RESIDENT = 0,
    SV_RESTORE_COMPRESSED,
    SV_RESTORE_STORED,
    SV_RESTORE_FILE,
    SV_RESTORE_NEW,
    SV_RESTORE_RECOMPUTED
} sv_restore;
/* "resident", "compressed", "stored", "file", "new", "recomputed" */
const char *sv_restore_name(sv_restore k);

typedef struct sv_metrics {
    uint64_t requests[6][6];        /* endpoint x status class (2xx..5xx, other) */
    uint64_t in_flight;
    uint64_t tokens_prompt, tokens_cached, tokens_completion;
    uint64_t restores[6];           /* by sv_restore */
    uint64_t conv_evicted, conv_closed, cancelled;
    uint64_t decode_passes_single;  /* decode steps of one stream */
    uint64_t decode_passes_multi;   /* of several streams in one forward pass */
    uint64_t ttft_count, ttft_bucket[SV_TTFT_BUCKETS];
    double ttft_sum_s;
    sv_mem_snapshot mem;
} sv_metrics;

typedef struct sv_sched sv_sched;

typedef struct sv_server {
    sv_config cfg;
    rb_model *model;
    sv_sched *sched;
    pthread_mutex_t metrics_mu;
    sv_metrics metrics;
} sv_server;

/* The scheduler (serve_sched.c). start: chooses the chat template, scans
 * the sessions folder, creates the first session (which loads the
 * weights), starts the thread. Returns 0, or 1 after printing why. */
int sv_sched_start(sv_server *srv);
/* Queues r (the scheduler takes a reference). SV_ERR_BUSY when parallel +
 * max_queue requests are in flight (queued or active) already, SV_ERR_UNAVAILABLE while stopping; else 0. */
sv_err sv_sched_submit(sv_sched *s, sv_request *r);
/* Stops the thread: active requests end (503, their conversations
 * saved), queued ones get 503, later submits SV_ERR_UNAVAILABLE. */
void sv_sched_stop(sv_sched *s);
/* Stops it if running and frees everything; no connection thread may
 * hold the scheduler any more (the HTTP daemon is stopped). */
void sv_sched_free(sv_sched *s);

/* Logs one line on stderr: "rebound serve: ..." (any thread). */
void sv_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ids: 1 when id is 1..SV_ID_MAX characters of [A-Za-z0-9_-]. */
int sv_id_is_valid(const char *id);

#endif
