/*
 * scheduler.h - the scheduler of `rebound serve`: the one thread that owns the
 * model, every conversation's session (through the store) and the
 * --sessions folder, and runs the requests the connection threads queue.
 *
 * Threads and ownership:
 *   - connection threads fill an sv_request (sv_request_new, then the
 *     fields above `mu`), queue it (sv_sched_submit) and wait on its
 *     condition variable for its output. They never touch the model, a
 *     session, a sampler or a file.
 *   - the scheduler thread is the only thread that calls into the
 *     library after sv_sched_start: tokenizer, sessions, samplers,
 *     detokenizers, the store. It runs the active requests in rounds: a
 *     prefill chunk of each request still in its prompt, then one decoded
 *     token of all the others in one forward pass
 *     (rb_session_decode_multi).
 *   - an sv_request is shared by exactly those two: the fields above `mu`
 *     are written by the connection thread before it is queued and read
 *     only after; the fields below `mu` are guarded by it. It is freed by
 *     whichever side lets go last (refs).
 */
#ifndef RB_SERVE_SCHEDULER_H
#define RB_SERVE_SCHEDULER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "metrics.h"
#include "convstore.h"

#define SV_STOP_MAX 4     /* OpenAI's limit of stop sequences */
#define SV_STOP_LEN_MAX 256

/* A generation (chat, completion), or one of the model's utilities: the
 * scheduler answers those at once, their JSON in out. */
typedef enum sv_kind {
    SV_CHAT = 0, SV_COMPLETION = 1, SV_TOKENIZE, SV_DETOKENIZE, SV_APPLY_TEMPLATE, SV_EMBED,
    SV_INPUT_TOKENS /* a chat request's prompt, counted in n_prompt */
} sv_kind;

/* One input of a utility: a text, or token ids. */
typedef struct sv_input {
    char *text;                   /* NULL: toks */
    int32_t *toks;
    size_t n_toks;
} sv_input;

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

/* One generated token's log-probability and its best alternatives (the
 * token texts as bytes, cut at SV_LP_TOKEN_MAX). */
#define SV_LP_TOKEN_MAX 48
typedef struct sv_lp_token {
    char text[SV_LP_TOKEN_MAX];
    uint8_t n_text;
    float logprob;
} sv_lp_token;
typedef struct sv_logprob {
    sv_lp_token tok;
    uint8_t n_top;
    sv_lp_token top[RB_SAMPLER_MAX_LOGPROBS];
} sv_logprob;

/* What the reply must be (response_format, tool_choice). */
typedef enum sv_format { SV_FMT_TEXT = 0, SV_FMT_JSON_OBJECT = 1, SV_FMT_JSON_SCHEMA = 2 } sv_format;
typedef enum sv_tools {
    SV_TOOLS_NONE = 0,       /* no tools, or tool_choice "none" */
    SV_TOOLS_AUTO = 1,       /* rendered; the reply may call them */
    SV_TOOLS_REQUIRED = 2    /* rendered; the reply is tool calls, under tool_schema */
} sv_tools;

/* Where a request's time went (seconds), from its arrival (the body read)
 * to its end; set by the scheduler when it finishes the request. The
 * restore figures are its prompt's feeds' (rb_session_stats' restore_*,
 * summed over the feeds; busy times of the I/O and decode workers, which
 * overlap each other and the compute). */
typedef struct sv_timings {
    double prepare_s;             /* parse and tokenize (connection thread) */
    double queue_s;               /* waiting for the scheduler to take it */
    double open_s;                /* its conversation found, opened or reopened
                                     from its file, rewound; its sampler made */
    double prefill_s;             /* from then to its first token (restores
                                     ride in it; other streams' steps too) */
    double decode_s;              /* first token to the end */
    double restore_io_s, restore_decode_s, restore_wait_s;
    double restore_span_s;        /* each feed's restore, its start to its last
                                     page (wall time; the I/O bound shows) */
    double room_s;                /* each feed's wait for the pool's trims of
                                     other conversations (in the prefill) */
    uint64_t restore_bytes_io, restore_bytes_decoded;
    uint64_t restore_bytes_prefetched; /* brought by the restore begun at
                                          admission before the prefill took over */
    uint32_t restore_recomputed;
    double weights_wait_s;        /* forward passes blocked on streamed weights */
    int has_first;                /* a token was sampled (prefill_s, decode_s hold) */
} sv_timings;

typedef struct sv_request {
    /* ---- written by the connection thread before it is queued ---- */
    char ns[SV_NS_MAX + 1];       /* its namespace ("": the one of no keys) */
    sv_kind kind;
    int stream;
    int include_usage;            /* stream_options.include_usage */
    rb_chat_message *msgs;        /* SV_CHAT: roles and contents, owned */
    char **msg_calls;             /* SV_CHAT: [n_msgs] an assistant message's tool calls
                                     (JSON array) or NULL; owned; may be NULL */
    size_t n_msgs;
    char *prompt;                 /* SV_COMPLETION: owned */
    char conv_id[SV_ID_MAX + 1];  /* "": map by longest token prefix */
    int64_t max_tokens;           /* -1: until end of generation or full context */
    rb_sampler_params sp;
    int has_seed;                 /* sp.seed is the request's (else a random
                                     one, or -s, from sv_sched_prepare) */
    int32_t *toks;                /* the prompt's tokens (sv_sched_prepare);
                                     the scheduler takes them */
    size_t n_toks;
    char *stop[SV_STOP_MAX];
    int n_stop;
    sv_format format;
    char *schema;                 /* SV_FMT_JSON_SCHEMA: the schema as JSON text, owned */
    sv_tools tools;
    char *tools_text;             /* the tools as a JSON array (the template renders
                                     them); NULL when none or tool_choice none; owned */
    char *tool_schema;            /* SV_TOOLS_REQUIRED: a call's JSON Schema, owned */
    int parallel_tool_calls;      /* more than one call allowed (default 1) */
    int32_t *bias_ids;            /* logit_bias, owned */
    float *bias_vals;
    size_t n_bias;
    int completion_logprobs;      /* SV_COMPLETION: the legacy shape */
    sv_input *inputs;             /* utilities: the texts or token lists, owned */
    size_t n_inputs;
    int add_special, with_pieces, is_base64;
    double t_arrival;
    double t_prepared;            /* sv_sched_prepare done */
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
    const char *finish_reason;    /* "stop", "length", "cancelled" (static) */
    size_t n_prompt, n_cached, n_completion;
    char conv_out[SV_ID_MAX + 1]; /* the conversation that served it */
    const char *restore;          /* where its KV was when admitted (static
                                     string): sv_restore_name */
    sv_timings tm;                /* set with is_done */
    sv_logprob *lps;              /* is_logprobs: one per generated token */
    size_t n_lps, cap_lps;
    /* a utility's result (out holds a text result: detokenize's content,
       apply-template's prompt), set before is_done */
    int32_t *res_toks;            /* tokenize */
    char **res_pieces;            /* tokenize with_pieces: [n_res_toks] */
    size_t *res_lens;
    size_t n_res_toks;
    float *res_vecs;              /* embeddings: [n_inputs][res_dim] */
    uint32_t res_dim;
    size_t res_n_tokens;          /* embeddings: tokens read */
} sv_request;

/* A new request with one reference (the caller's), arrival now; NULL: no
 * memory. */
sv_request *sv_request_new(void);
/* Releases one side's hold; the last frees it and what it owns. */
void sv_request_release(sv_request *r);

typedef struct sv_sched sv_sched;

/* Chooses the chat template, creates the pool and the first session
 * (which loads the weights: an unsupported model fails here), loads the
 * --sessions folder, starts the thread. cfg, model and metrics are
 * borrowed until sv_sched_free. NULL after logging why. */
sv_sched *sv_sched_start(const sv_config *cfg, rb_model *model, sv_metrics *metrics);
/* The sessions' context length (after the start). */
uint32_t sv_sched_n_ctx(const sv_sched *s);
/* The largest body a request whose prompt fits the context can have
 * (its text at the longest token's bytes, each escaped in JSON). */
size_t sv_sched_max_body(const sv_sched *s);
/* On the connection thread, before sv_sched_submit: r's prompt tokens
 * (r->toks): a chat rendered with the template, its markers control
 * tokens and the messages' content text; a completion's prompt as text
 * (or with special tokens: cfg->completions_special); checked against the
 * context; an unseeded request's random seed. SV_ERR_NONE, or the error
 * with msg. Any thread: uses only what is immutable after the start and
 * the model's tokenizer (rb_model_tokenize may run on several threads). */
sv_err sv_sched_prepare(const sv_sched *s, sv_request *r, char *msg, size_t msg_n);
/* The same for a utility, on the connection thread: client token ids
 * checked against the vocabulary; /tokenize's tokens (and pieces) made
 * (r->res_toks); each embedding input's tokens (inputs[i].toks, 1 to
 * n_ctx). The scheduler then only computes embeddings, detokenizes or
 * renders. SV_ERR_NONE, or the error with msg. Any thread, as above. */
sv_err sv_sched_prepare_utility(const sv_sched *s, sv_request *r, char *msg, size_t msg_n);
/* Queues r (the scheduler takes a reference). SV_ERR_BUSY when parallel +
 * max_queue requests are in flight (queued or active) already,
 * SV_ERR_UNAVAILABLE while stopping; else SV_ERR_NONE. Any thread. */
sv_err sv_sched_submit(sv_sched *s, sv_request *r);
/* Stops the thread: active requests end (503, their conversations
 * saved), queued ones get 503, later submits SV_ERR_UNAVAILABLE. */
void sv_sched_stop(sv_sched *s);
/* Stops it if running and frees everything; no connection thread may
 * hold the scheduler any more (the HTTP daemon is stopped). NULL: no-op. */
void sv_sched_free(sv_sched *s);

#endif
