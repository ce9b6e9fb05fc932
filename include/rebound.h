/* SPDX-License-Identifier: MIT */
/*
 * rebound.h - the whole public API of librebound.
 *
 * rebound is an on-device LLM runtime whose reason to exist is memory: it
 * keeps a conversation usable while the operating system takes memory away,
 * and brings the model back fast when the user returns.
 *
 * Conventions (hold for every function below):
 *   - Errors: a function that can fail returns an rb_status; RB_OK (0) is
 *     success. A failed call leaves a message on its handle
 *     (rb_<object>_errmsg); a call that has no handle yet (_open, _create)
 *     writes status and message to an rb_error the caller passes (may be
 *     NULL); a call on a const handle leaves no message (the status says
 *     which of its documented errors it was). Functions that cannot fail
 *     return their value directly (a count, a pointer, a documented
 *     "none" value such as -1 for a missing special token). No call
 *     truncates or drops data silently.
 *   - On failure an object stays valid and out-parameters stay unchanged.
 *   - Names: rb_<object>_<verb>; objects are opaque handles with lifetime
 *     pairs _open/_close (bound to a file) or _create/_destroy. Accessors:
 *     rb_<object>_get_<what> / _set_<what>; counts rb_<object>_n_<what>;
 *     predicates rb_<object>_is_<what>.
 *   - Structs the library fills (rb_model_info, rb_session_stats) only ever
 *     grow at their end: the getters take the caller's sizeof (the macros
 *     pass it), so a program built against an older header keeps working
 *     with a newer library.
 *   - Cost: each function says when it may block on I/O or allocate; a
 *     function that says neither does neither.
 *   - The library never prints and never exits.
 *   - Thread rule: a handle may be used by one thread at a time; distinct
 *     handles are independent (sessions of one model may be created,
 *     opened, fed and destroyed from different threads at once). The
 *     exceptions, callable from any thread at any time: rb_session_trim,
 *     rb_session_abort, rb_session_set_priority, rb_session_prefetch and
 *     every rb_pool_* call;
 *     a feed running on another thread honours a trim or an abort at its
 *     next layer boundary. A model is shared by its sessions: which
 *     rb_model_* calls may run at once is said after rb_model_errmsg.
 *   - Versions. The API version is MAJOR.MINOR.PATCH (REBOUND_VERSION_*;
 *     rb_version says the library's). PATCH: fixes only. MINOR: additions
 *     a program built against the previous header survives (new functions,
 *     new enum values, fields added at the end of the versioned structs).
 *     MAJOR (while it is 0: MINOR) and the shared library's SOVERSION
 *     (librebound.so.N) change together whenever a program built against
 *     the previous header could break; 0.3 is SOVERSION 1. Versioned
 *     structs: the params structs a program fills (rb_model_params,
 *     rb_session_params) begin with struct_size, which their
 *     _default_params() set to the program's sizeof, and the structs the
 *     library fills (rb_model_info, rb_session_stats) are read through
 *     _sized getters; both only grow at their end, so a program built
 *     against an older header keeps working with a newer library.
 *   - Research and benchmark knobs (emulated storage devices, the tier
 *     split's rates, the baselines rebound is measured against) are in
 *     rebound_experimental.h, not here.
 */
#ifndef REBOUND_H
#define REBOUND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RB_API __attribute__((visibility("default")))
#else
#define RB_API
#endif

#define REBOUND_VERSION_MAJOR 0
#define REBOUND_VERSION_MINOR 5
#define REBOUND_VERSION_PATCH 0
#define REBOUND_VERSION_STRING "0.5.0"

/* The library's version as "MAJOR.MINOR.PATCH" (the library the program
 * runs against, which may be newer than the header it was built with), and
 * as MAJOR << 16 | MINOR << 8 | PATCH. */
RB_API const char *rb_version(void);
RB_API uint32_t rb_version_number(void);

/* ---- status ------------------------------------------------------------ */

typedef enum rb_status {
    RB_OK = 0,
    RB_E_INVALID_ARG = 1,  /* a parameter is out of its documented range */
    RB_E_NOMEM = 2,        /* an allocation failed */
    RB_E_IO = 3,           /* a system call failed; the message has errno */
    RB_E_SHORT_READ = 4,   /* the file ended before the bytes it promised */
    RB_E_FORMAT = 5,       /* the file is malformed; the message names the field */
    RB_E_UNSUPPORTED = 6,  /* well-formed but not supported (version, type, arch) */
    RB_E_NOT_FOUND = 7,    /* a named key, tensor or file does not exist */
    RB_E_BUDGET = 8,       /* a memory budget cannot be met */
    RB_E_BUSY = 9,         /* another process holds the file (its pid in the message) */
    RB_E_ABORTED = 10,     /* rb_session_abort or the progress callback stopped a feed */
} rb_status;

/* A short constant name for a status ("RB_E_FORMAT"); never NULL. */
RB_API const char *rb_status_name(rb_status status);

/* Message buffer for calls that have no handle yet. */
#define RB_ERROR_MESSAGE_MAX 512
typedef struct rb_error {
    rb_status status;
    char message[RB_ERROR_MESSAGE_MAX];
} rb_error;

/* ---- model ------------------------------------------------------------- */

typedef struct rb_model rb_model;

/* What a progress callback is told: the phase, and how far it is. done
 * grows from 0 to total; total stays the same through one call of the
 * function it reports on (a feed, a load). The return value: non-zero
 * stops a feed (as rb_session_abort); a load ignores it. */
typedef enum rb_progress_phase {
    RB_PROGRESS_RESTORE = 0, /* bringing back what a trim evicted (or what a
                                reopened session's file holds): layers, once
                                per feed that restores anything, never when
                                nothing is evicted */
    RB_PROGRESS_FEED = 1,    /* computing the feed's tokens (and any
                                recompute): tokens */
    RB_PROGRESS_LOAD = 2     /* reading a model's weights whole (the first
                                rb_session_create of a model): bytes. A
                                reopened session's weights come back with
                                its restore (RB_PROGRESS_RESTORE) */
} rb_progress_phase;
typedef int (*rb_progress_fn)(void *ctx, rb_progress_phase phase, uint64_t done,
                              uint64_t total);

typedef struct rb_model_params {
    size_t struct_size;    /* sizeof(rb_model_params) as the program was
                              compiled: set by rb_model_default_params (or
                              rb_model_params_init); never set it by hand.
                              The library reads that many bytes, so a
                              program built against an older header works
                              with a newer library (fields it lacks take
                              their defaults); 0: RB_E_INVALID_ARG. */
    int use_mmap;          /* nonzero: map the whole file for the header and
                              tensor reads (a file cut under this mapping
                              raises SIGBUS, unguarded); zero: read by
                              offset (pread) */
    /* The SIGBUS guard, the library's only process-wide state. 1 (default):
       a session may map the weights file itself (a cold restore then reads
       it through the page cache: measured 0.01-0.03 s of system time per
       600 MiB against 0.35-0.40 s for a read into anonymous memory), and the
       first such mapping in the process installs a SIGBUS handler (with
       sigaction, SA_SIGINFO | SA_ONSTACK; it stays for the life of the
       process) so that a file cut under the mapping becomes RB_E_IO at the
       next feed instead of killing the process. A fault outside the
       library's mappings goes to the action that was installed before it
       (or the default action: the process dies as it would have).
       0: this model never maps its weights file and never installs the
       handler (weights are read into memory). An app with its own SIGBUS
       handler either installs it before the first rb_model_open, and the
       library chains to it; or, installing it later, calls the previous
       action that sigaction returned for every fault at an address it does
       not own; or opens every model with sigbus_guard = 0. */
    int sigbus_guard;
    /* called while the model's weights are read whole (RB_PROGRESS_LOAD,
       done and total in bytes of tensor data; done 0 first, total last),
       on the thread that reads them (the one creating the model's first
       session), before each tensor; its return value is ignored. NULL:
       none. */
    rb_progress_fn progress;
    void *progress_ctx;
} rb_model_params;

/* Fills the first struct_size bytes of params with the defaults (use_mmap
 * 0, sigbus_guard 1, no progress) and params->struct_size with
 * struct_size; bytes past this library's struct are zeroed. For bindings
 * that cannot inline rb_model_default_params. */
RB_API void rb_model_params_init(rb_model_params *params, size_t struct_size);
/* The defaults, sized for the header the program is compiled with. */
static inline rb_model_params rb_model_default_params(void)
{
    rb_model_params p;
    rb_model_params_init(&p, sizeof p);
    return p;
}

/*
 * Opens a GGUF model file: reads and validates the header, metadata and
 * tensor index (not the tensor data). Every offset and size in the file is
 * checked; a malformed file fails with RB_E_FORMAT and a message naming the
 * field, the value and its file offset.
 *
 * path    file to open; params may be NULL (defaults).
 * out     receives the handle on success; unchanged on failure.
 * err     may be NULL; receives the status and message on failure.
 * Errors: RB_E_IO, RB_E_SHORT_READ, RB_E_FORMAT, RB_E_UNSUPPORTED (GGUF
 *         version, or a model without the hyperparameters of its
 *         architecture), RB_E_NOMEM.
 * Cost: reads the header and index (blocks on I/O); allocates them. The
 * weights are loaded by the first session.
 */
RB_API rb_status rb_model_open(const char *path, const rb_model_params *params,
                               rb_model **out, rb_error *err);

/*
 * rb_model_open of a file already open at fd (an Android asset's or a
 * content URI's descriptor, a file in a sandbox): the whole file, from
 * offset 0 (a descriptor into a larger file, such as an asset packed in an
 * APK at some offset, is not supported: give the asset its own file).
 * Ownership: the model keeps its own duplicate of fd (closed by
 * rb_model_close); the caller keeps fd and may close it once this returns.
 * The model names the file /proc/self/fd/N (N: its duplicate) in messages
 * and opens it again through that name where the library reads weights
 * with its own descriptor (the weight cache, a cold restore's mapping):
 * Linux and Android. fd must be readable; it is never written or moved
 * (reads are positioned).
 * Errors: as rb_model_open; RB_E_INVALID_ARG (fd < 0 or not open).
 */
RB_API rb_status rb_model_open_fd(int fd, const rb_model_params *params, rb_model **out,
                                  rb_error *err);

/* Releases everything the model owns. NULL is a no-op. Only after every
 * session and pool of the model is destroyed, with no other call on the
 * model running. */
RB_API void rb_model_close(rb_model *model);

/* The message of the last failed call on this handle ("" if none). Valid
 * until the next call on the handle. */
RB_API const char *rb_model_errmsg(const rb_model *model);

/*
 * A shared model (the thread rule's exception for rb_model_*). A model is
 * shared by its sessions and pools, and the rb_model_* calls below may run
 * on any threads at once, with each other and with any session's calls:
 * rb_model_get_info_sized, rb_model_kv_bytes, rb_model_get_meta_str,
 * rb_model_get_layer_bytes, rb_model_get_tensor_info (read what the open
 * parsed, never changed after); rb_model_tokenize, rb_model_token_bos /
 * _eos / _is_eog, rb_model_token_to_piece and rb_detokenizer_create (the
 * tokenizer is built once, under the model's lock, by the first of them,
 * then only read). The one thing they share is the model's error message:
 * when two of them fail at once, rb_model_errmsg may give the other's
 * message (the statuses are always each call's own); read it only where
 * the calls that can fail are not concurrent. rb_model_close: alone, last.
 */

/*
 * What a model is and what it costs in memory (the numbers of the mzCache
 * paper's Table 1). Strings point into the model and live as long as it.
 */
typedef struct rb_model_info {
    const char *architecture;    /* general.architecture, e.g. "llama" */
    const char *name;            /* general.name, or "" */
    uint32_t gguf_version;
    uint32_t n_layers;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;           /* key/value width per head */
    uint32_t n_ff;
    uint32_t n_vocab;
    uint32_t n_ctx_train;
    uint32_t n_rot;              /* rope dimensions */
    float rope_freq_base;
    float rms_eps;
    int is_tied_output;          /* no output.weight: token_embd is reused */
    uint64_t n_tensors;
    uint64_t file_bytes;
    uint64_t tensor_data_bytes;  /* sum of all tensors' bytes */
    uint64_t layer_weight_bytes; /* sum over blk.* tensors */
    uint64_t other_weight_bytes; /* embeddings, output, final norm */
    uint64_t kv_bytes_per_token; /* f16 K and V over all layers */
    /* new fields only here, at the end */
    uint32_t sliding_window;     /* positions a sliding-window layer attends to; 0: none */
    uint32_t n_layers_swa;       /* layers with the sliding window (their KV pages
                                    outside it are freed: rb_model_kv_bytes) */
} rb_model_info;

/* Fills out (out_size bytes of it: the caller's sizeof, which the macro
 * passes). Errors: RB_E_INVALID_ARG (NULL, or out_size 0). */
RB_API rb_status rb_model_get_info_sized(const rb_model *model, rb_model_info *out,
                                         size_t out_size);
#define rb_model_get_info(model, out) rb_model_get_info_sized((model), (out), sizeof *(out))

/* f16 K and V bytes a context of n_tokens positions needs: every layer
 * holds n_tokens positions, a sliding-window layer at most its window
 * (a session frees its older pages). 0 for a NULL model. */
RB_API uint64_t rb_model_kv_bytes(const rb_model *model, uint64_t n_tokens);

/*
 * A string value of the file's metadata by key, e.g.
 * "tokenizer.chat_template" (the Jinja text `rebound chat` recognises).
 *
 * out, len  receive the bytes and their count on success; unchanged on
 *           failure. The bytes are NOT NUL-terminated and may hold any
 *           value; they point into the model and stay valid until
 *           rb_model_close.
 * Errors: RB_E_INVALID_ARG (a NULL argument), RB_E_NOT_FOUND (no such
 * key), RB_E_FORMAT (the key holds another type than a string). The model
 * is const, so no message is left: the status says which.
 */
RB_API rb_status rb_model_get_meta_str(const rb_model *model, const char *key,
                                       const char **out, size_t *len);

/* Bytes of the tensors of one layer (blk.<layer>.*). 0 when out of range. */
RB_API uint64_t rb_model_get_layer_bytes(const rb_model *model, uint32_t layer);

/* One tensor of the file's index, by position (0 .. n_tensors-1). */
typedef struct rb_tensor_info {
    const char *name;       /* lives as long as the model */
    const char *type_name;  /* "F32", "Q4_K", ... */
    uint32_t n_dims;
    uint64_t dims[4];       /* dims[0] is the row length (innermost) */
    uint64_t n_bytes;
    uint64_t file_offset;   /* absolute offset of the data in the file */
} rb_tensor_info;

/* Errors: RB_E_INVALID_ARG (index out of range; message on the model). */
RB_API rb_status rb_model_get_tensor_info(rb_model *model, uint64_t index,
                                          rb_tensor_info *out);

/* ---- session ----------------------------------------------------------- */

/*
 * A session is one conversation on a model: its tokens, its KV cache and
 * the compute state to extend it. Several sessions may share one model
 * (see rb_session_create for the rules today).
 */
typedef struct rb_session rb_session;
typedef struct rb_pool rb_pool;

/* Where an evicted piece of the session lives (rb_session_stats). */
typedef enum rb_tier {
    RB_TIER_RESIDENT = 0,   /* in RAM, usable */
    RB_TIER_COMPRESSED = 1, /* KV: in RAM, encoded by the KV codec */
    RB_TIER_STORED = 2,     /* KV: in the spill file; weights: in the model file */
    RB_TIER_DROPPED = 3,    /* KV: gone, recomputed from the session's tokens */
    RB_TIER_COUNT
} rb_tier;

/* How evicted KV comes back (rb_session_params.restore). Value 1 is the
 * storage-offload baseline of rebound_experimental.h. */
typedef enum rb_restore_mode {
    RB_RESTORE_PIPELINED = 0, /* both tiers, restored in layer order while the
                                 forward pass computes (the default) */
    RB_RESTORE_RECOMPUTE = 2  /* KV dropped, rebuilt from the tokens */
} rb_restore_mode;

/* The codec of the compressed RAM tier (rb_session_params.ram_codec).
 * Values 2 and 3 are the zRAM baselines of rebound_experimental.h. */
typedef enum rb_ram_codec {
    RB_RAM_CODEC_LOSSLESS = 0, /* bit-exact (the default) */
    RB_RAM_CODEC_Q8 = 1        /* 8-bit groups of 64: ~1.9x smaller, lossy */
} rb_ram_codec;

struct rb_experimental_params; /* rebound_experimental.h */
/* The live KV cache's element type (rb_session_params.kv_type_k / _v):
 * llama.cpp's --cache-type-k / -v, in its block layout and attention
 * arithmetic. q8_0 holds a context in 34/64 of f16's bytes, q4_0 in 18/64;
 * both need head dims that are multiples of 32. */
typedef enum rb_kv_type {
    RB_KV_F16 = 0,  /* the default */
    RB_KV_Q8_0 = 1,
    RB_KV_Q4_0 = 2
} rb_kv_type;

/* "f16", "q8_0", "q4_0"; "?" out of range. */
RB_API const char *rb_kv_type_name(rb_kv_type t);
/* The type of that name, or -1. */
RB_API int rb_kv_type_from_name(const char *name);

/* A session's place in its memory pool: the pool takes memory back from
 * background sessions before foreground ones (rb_pool_create: how). */
typedef enum rb_priority {
    RB_PRIORITY_FOREGROUND = 0,
    RB_PRIORITY_BACKGROUND = 1
} rb_priority;

typedef struct rb_session_params {
    size_t struct_size; /* sizeof(rb_session_params) as the program was
                           compiled: set by rb_session_default_params (or
                           rb_session_params_init); never by hand. The
                           library reads that many bytes (fields an older
                           header lacks take their defaults); 0:
                           RB_E_INVALID_ARG. Fields are only ever added at
                           the end. */
    uint32_t n_ctx;     /* context length; 0: the model's trained context
                           (beyond it is allowed: RoPE extrapolates, quality
                           may drop, as in llama.cpp) */
    uint32_t n_batch;   /* tokens per forward batch in prefill; default 128 */
    int n_threads;      /* worker threads; 0: all online cores */
    /* memory manager (rb_session_trim) */
    rb_restore_mode restore;
    rb_ram_codec ram_codec;
    const char *spill_dir;     /* spill file folder; NULL: $TMPDIR or /tmp */
    uint64_t budget_bytes;     /* 0: none; else RAM the session may hold:
                                  after a feed beyond it, it trims itself */
    /* weight streaming: the weights are read through rebound's own block
       cache (bypassing the page cache) instead of being loaded whole; the
       hot set and a loop prefix stay, the rest streams from storage every
       token with read-ahead. On when weights_budget_bytes > 0, or when
       budget_bytes cannot hold the weights, the run state and a full
       context's KV (n_ctx tokens); budget_bytes then covers everything and
       the weights give up cache to KV as the context grows (before each
       feed). A budget below the least that works: RB_E_BUDGET at creation,
       naming it. Every streaming session of a model shares one stream
       (rb_session_create); a session without streaming beside them:
       RB_E_INVALID_ARG. */
    uint64_t weights_budget_bytes; /* 0: none (or from budget_bytes) */
    const char *weights_policy;    /* "class" (NULL: class), or "lru" (the page
                                      cache's policy); the research baselines
                                      are in rebound_experimental.h */
    /* research and benchmark knobs (rebound_experimental.h); NULL: none.
       Copied at creation. */
    const struct rb_experimental_params *experimental;
    unsigned file_flags;           /* RB_SAVE_* flags rb_session_open_saved
                                      binds the file with (FSYNC, ON_REQUEST,
                                      WAIT) */
    /* the KV cache's types (default f16). A quantized cache's pages go to
       the tiers as their bytes: the lossless RAM codec or storage (the q8
       RAM codec re-quantizes f16 values: RB_E_INVALID_ARG with it) */
    rb_kv_type kv_type_k, kv_type_v;
    /* the memory pool the session joins (rb_pool_create; same model): one
       budget over the model's weights and the memory of all its sessions.
       NULL: the session has a pool of its own, of budget_bytes (which must
       be 0 when a pool is given: the pool holds the budget). */
    rb_pool *pool;
    rb_priority priority;          /* in the pool: FOREGROUND (default) or
                                      BACKGROUND (trimmed first) */
    /* called on the feeding thread: RB_PROGRESS_FEED after each batch
       (done of total = the tokens of this feed call; a recompute of
       evicted context before them is not counted), RB_PROGRESS_RESTORE
       before each layer of a feed that restores something (done = the
       layer, total = n_layers). Return non-zero to stop the feed there, as
       rb_session_abort does. NULL: none. */
    rb_progress_fn progress;
    void *progress_ctx;
    /* attention's arithmetic. 0 (default): a query at position 256 or
       later is attended in tiles of f32 (scores as a small matrix
       product, softmax and V sums in f32), over f16, q8_0 and q4_0 KV
       caches, in a prefill and in a decode alike; earlier positions take
       llama.cpp's exact one-query arithmetic. The rule is by position, so
       a conversation's logits are the same bits however its tokens were
       batched (one per call, chunks, one prefill); up to position 255
       they are bit-identical to llama.cpp fed one token per call, later
       ones match it to float rounding. 1: every position in the exact
       arithmetic: logits bit-identical to llama.cpp fed one token per
       call throughout. Other values: RB_E_INVALID_ARG. */
    int exact_attention;
    /* tokens per KV page: 0 (default) 256, else a multiple of 32 from 32
       to 1024. The page is the unit of everything the memory manager
       does (a trim, a restore, a page shared between forks, a session
       file's record); the logits are the same bits at any size. Smaller
       pages let forks (rb_session_fork) share more of a common prefix
       (the partly filled page where conversations part is copied) and
       trim closer to a byte count, for more bookkeeping per token. A
       session file keeps its size: rb_session_open_saved with 0 takes
       the file's, with another size it is RB_E_INVALID_ARG, naming both. */
    uint32_t kv_page_tokens;
} rb_session_params;

/* Fills the first struct_size bytes of params with the defaults (n_batch
 * 128, everything else 0 / NULL) and params->struct_size with struct_size;
 * bytes past this library's struct are zeroed. For bindings that cannot
 * inline rb_session_default_params. */
RB_API void rb_session_params_init(rb_session_params *params, size_t struct_size);
/* The defaults, sized for the header the program is compiled with. */
static inline rb_session_params rb_session_default_params(void)
{
    rb_session_params p;
    rb_session_params_init(&p, sizeof p);
    return p;
}

/*
 * Creates a session: loads the model's weights if not yet loaded (read, or
 * mapped when the model was opened with use_mmap), checks that rebound can
 * run the architecture and every tensor, and allocates the run state.
 * The model must outlive the session.
 * Sessions of one model share its weights: any thread may create (or
 * open_saved) them at any time (the first loads the weights, the others
 * wait for it). A layer's weights released by one session's trim or its
 * pool are restored by any session's feed that needs them, and a release
 * skips a layer a forward pass computes. Weight-streaming sessions of one
 * model share one block cache (created by the first, destroyed with the
 * last; its budget is the largest of their weights budgets, or in a pool
 * the share the pool leaves the weights; its RAM counted once) and take
 * turns over it, one forward pass at a time: two conversations on two
 * threads both stream, each bit-identical to alone. A model's sessions
 * all stream or none does: a session without a weights budget is refused
 * (RB_E_INVALID_ARG, naming the conflict) while one streams, and a
 * streaming one while one computes from resident weights.
 * Errors: RB_E_UNSUPPORTED (architecture, tensor type), RB_E_FORMAT
 * (missing tensor, wrong shape), RB_E_NOMEM, RB_E_IO; message in err.
 * Cost: the first session of a model reads its weights (blocks on I/O);
 * allocates the run state and a thread pool (starts n_threads - 1 threads).
 */
RB_API rb_status rb_session_create(rb_model *model, const rb_session_params *params,
                                   rb_session **out, rb_error *err);
/* Stops the session's threads (waits for a pending session-file commit)
 * and frees everything it owns. NULL is a no-op. */
RB_API void rb_session_destroy(rb_session *session);
/* The message of the last failed call on this handle ("" if none). */
RB_API const char *rb_session_errmsg(const rb_session *session);

/*
 * Appends n tokens to the session and computes them (in batches of
 * n_batch). logits: NULL, or room for n x n_vocab floats that receive the
 * logits after each token fed (for --dump-logits). Afterwards
 * rb_session_logits gives the last token's logits.
 * Errors: RB_E_INVALID_ARG (a token id outside the vocabulary: nothing is
 * fed), RB_E_BUDGET (the context would exceed n_ctx: nothing is fed),
 * RB_E_NOMEM. On failure the session's tokens are unchanged.
 * Cost: the forward pass (all n_threads); restores what a trim evicted
 * (blocks on storage I/O, layer by layer beside the compute); may allocate
 * KV pages as the context grows; hands a commit to the session file's
 * worker when bound.
 */
RB_API rb_status rb_session_feed(rb_session *session, const int32_t *tokens, size_t n,
                                 float *logits);

/* Logits of the last token fed (n_vocab floats), or NULL when there are
 * none: before any feed, after rb_session_rewind, after an abort before a
 * batch completed, and in a session rb_session_open_saved just opened (the
 * file holds tokens and their K/V, not logits: rb_session_compute_logits
 * gives them). Valid until the next feed, rewind or destroy. */
RB_API const float *rb_session_get_logits(const rb_session *session);

/*
 * Makes rb_session_get_logits non-NULL when the session holds tokens but no
 * logits (a session just reopened with rb_session_open_saved, or after a
 * rewind): forgets the last token and feeds it again (restoring the K/V it
 * attends to, like any feed). The logits are bit for bit those the last
 * feed of that token computed. Does nothing when there are logits already.
 * Errors: RB_E_INVALID_ARG (the session holds no token); a feed's errors
 * (then the session holds one token fewer: feed it again).
 * Cost: one token's forward pass, and the restore of what was evicted.
 */
RB_API rb_status rb_session_compute_logits(rb_session *session);

/* The session's tokens (rb_session_n_tokens of them), valid until the next
 * feed, rewind or destroy. */
RB_API size_t rb_session_n_tokens(const rb_session *session);
RB_API const int32_t *rb_session_get_tokens(const rb_session *session);
RB_API uint32_t rb_session_n_ctx(const rb_session *session);
RB_API uint32_t rb_session_n_vocab(const rb_session *session);

/*
 * Decodes one token in each of n sessions of one model in one forward
 * pass: tokens[i] is appended to sessions[i] and computed, each weight
 * read once for all of them (in groups of the smallest n_batch of the
 * set). Each session ends exactly as rb_session_feed(sessions[i],
 * &tokens[i], 1, NULL) would leave it: the same logits bit for bit (the
 * forward pass computes each row by the same operations whatever the
 * number of rows), its evicted context restored, its file committed, its
 * budget enforced. A session whose restore stops the shared pass, or finds
 * damaged pages, completes its feed alone.
 * Errors: RB_E_INVALID_ARG (NULL arguments, a session given twice,
 * sessions of different models or thread counts, a token outside the
 * vocabulary: then no session changed), RB_E_BUDGET (a session's context
 * is full: no session changed), RB_E_INVALID_ARG (some sessions stream
 * their weights and others do not); streaming sessions share the model's
 * stream and the pass reads each of its units once; after the pass, a session's own
 * feed error (RB_E_NOMEM, RB_E_IO, RB_E_FORMAT): that session is as a
 * failed rb_session_feed leaves it, the others are fed. The message in
 * err names the session's index (its own rb_session_errmsg has its part).
 * Threads: the caller must be the only user of all n sessions for the
 * call; the pass runs on the thread pool of one of them.
 * Cost: one forward pass per group; per call, one allocation of the feeds'
 * state and the group's logits (n_batch x n_vocab floats at most).
 */
RB_API rb_status rb_session_decode_multi(rb_session **sessions, const int32_t *tokens,
                                         size_t n, rb_error *err);

/* ---- memory ------------------------------------------------------------ */

/* Android-like trim levels for rb_session_trim. */
typedef enum rb_trim_level {
    RB_TRIM_BYTES = 0,      /* free the bytes given, no more */
    RB_TRIM_BACKGROUND = 1, /* the KV of the last quarter of the layers */
    RB_TRIM_MODERATE = 2,   /* the KV of the last half of the layers */
    RB_TRIM_COMPLETE = 3    /* all KV and all layers' weights */
} rb_trim_level;

/*
 * Gives memory back. With RB_TRIM_BYTES, frees at least `bytes` of RAM
 * (bytes that leave RAM: a page moved to the compressed tier frees only
 * what the codec saves), taking the last layers first: their KV pages,
 * then, if that is not enough, their weights. With a level, `bytes` is
 * ignored. Each KV page goes to the compressed tier or to storage so that
 * the two restore paths would finish together; weights are re-read from
 * the model file. The next rb_session_feed brings everything back (how:
 * rb_session_params.restore); nothing already computed is lost.
 * *freed_out (may be NULL) receives the bytes freed. A KV page that a
 * fork shares (rb_session_fork) leaves this session but its RAM stays
 * with the others: it counts as freed only for its last holder.
 * Errors: RB_E_INVALID_ARG (an unknown level), RB_E_IO / RB_E_NOMEM
 * (then what was trimmed so far stays trimmed, the rest resident: the
 * session stays usable). A full disk is not an error: the page is
 * compressed instead, and the stats count it.
 * A model opened with use_mmap: its weights are the page cache's, never
 * the session's, and are not an error either: RB_TRIM_BYTES and the
 * levels below RB_TRIM_COMPLETE free KV only (*freed_out says how much);
 * RB_TRIM_COMPLETE frees the KV and drops the mapping's pages (they fault
 * back from the file on use).
 * Cost: writes pages to storage (blocks on I/O) and encodes them (CPU);
 * allocates compressed frames.
 * Threads: any thread, any time. Between feeds it trims before returning.
 * While a feed runs on another thread, that thread stops its forward pass
 * at the next layer boundary, trims as between feeds, and goes on: the
 * batch it stopped is computed again and restores what it needs, so the
 * feed's results stay exact; this call waits for the trim (one layer's
 * compute; one batch's when the feed was just stopped for another trim:
 * the batch computed again runs to its end, so trims that keep coming
 * cannot keep a feed from completing). Called from the session's own progress callback, the
 * trim happens before the feed's next batch and *freed_out is 0.
 * A failure's message belongs to the calling thread: rb_session_errmsg
 * returns it there until that thread's next call on the session, and
 * never changes what it returns to another thread; a waited-for trim that
 * the feeding thread served returns the status it failed with. Every
 * failed trim (the pool's too) is counted in the stats (trim_failures).
 */
RB_API rb_status rb_session_trim(rb_session *session, uint64_t bytes, rb_trim_level level,
                                 uint64_t *freed_out);

/*
 * Stops the feed running now on another thread at its next layer boundary
 * (or the next feed, at its first): that rb_session_feed returns
 * RB_E_ABORTED. The session stays consistent: it holds the tokens it held
 * before the feed plus those of the feed's batches that completed
 * (rb_session_n_tokens says how many; a batch is n_batch tokens), with
 * their K/V; the logits are those of the last completed token, or none
 * (rb_session_get_logits returns NULL) when no batch completed. Feed the
 * rest again to go on. Any thread, any time; does not block.
 */
RB_API void rb_session_abort(rb_session *session);

/* Moves the session in its pool: a background session gives its memory
 * back before any foreground one. RB_PRIORITY_FOREGROUND also begins, at
 * once, the restore of whatever of the session is out of RAM (its KV in
 * the compressed or stored tier, the model's released layers), as
 * rb_session_prefetch does: the app's conversation comes to the front,
 * and its next feed waits only for what has not arrived by then.
 * RB_PRIORITY_BACKGROUND also gives back an idle session's run state (the
 * forward pass's activations: for a 0.6B model at a 128-token batch,
 * about 8 MiB), mapped again by its next feed; its logits stay. Does
 * not block: a session busy on another thread is only moved. Any thread,
 * any time. Errors: RB_E_INVALID_ARG (NULL, an unknown priority). */
RB_API rb_status rb_session_set_priority(rb_session *session, rb_priority priority);

/*
 * Restores the session ahead of its next feed: the restore that feed would
 * begin starts now on the session's restore workers (storage reads,
 * decodes of the compressed tier, released weights), layer by layer from
 * the first, and this call returns without waiting for it. The next feed
 * takes over: it waits only for what has not arrived, and restores the rest
 * as usual. What it may take: in a pool with a budget, the budget's free
 * bytes; a foreground session's prefetch makes room first, from
 * background sessions only, leveled as a budget trim (rb_pool_create; never
 * from another foreground one); a background session's never trims anything. A plan
 * that does not fit is cut: the first layers' pages come, the rest waits
 * for the feed. A prefetch never holds memory the budget wants back: any
 * trim (the session's, the pool's, a rewind) cancels what has not started
 * first, and what came stays, counted as the session's. Pages of the
 * context whose K/V must be recomputed are not touched (the feed does it).
 * *planned_bytes (may be NULL): the RAM bytes it will bring back; 0 when
 * nothing is out of RAM, the budget has no room, a prefetch or a feed runs
 * (the session busy on another thread: this call does not wait for it).
 * Cost: maps the restore's page buffers; no I/O on this thread. Any
 * thread, any time (rb_session_prefetch and rb_session_set_priority).
 * The stats count it (n_prefetches, prefetch_bytes, n_prefetch_cancelled,
 * prefetch_pending). Errors: RB_E_INVALID_ARG (NULL session).
 */
RB_API rb_status rb_session_prefetch(rb_session *session, uint64_t *planned_bytes);

/* ---- memory pool ------------------------------------------------------- */

/*
 * A memory pool: one budget over a model's weights (shared by all its
 * sessions: they belong to the model) and the KV cache, compressed KV,
 * run state and tables of every session that joins it
 * (rb_session_params.pool). After each feed, and before a feed that grows
 * a session, a pool over its budget takes memory back: from background
 * sessions before foreground ones, leveled (the sessions holding the most
 * KV give first, down to one line, so that each keeps an equal share of
 * its first layers and no return must read back a whole conversation; what
 * a busy session cannot give now, least recently used first), the feeding
 * session last (each session's last layers first), and then the weights
 * (last layers first; a layer another session computes stays). Nothing
 * computed is lost: a session's next feed restores what it needs.
 * budget_bytes 0: no limit (the pool still shares the weights and takes
 * trims). One model per pool. The pool must outlive nothing: destroy it
 * when you like; it goes with its last session.
 * Errors: RB_E_INVALID_ARG, RB_E_NOMEM (message in err).
 */
RB_API rb_status rb_pool_create(rb_model *model, uint64_t budget_bytes, rb_pool **out,
                                rb_error *err);
RB_API void rb_pool_destroy(rb_pool *pool);
/* A new budget, enforced at once (a busy session gives its part at its
 * next layer boundary). Any thread. */
RB_API rb_status rb_pool_set_budget(rb_pool *pool, uint64_t budget_bytes);
/* Counts the process's other memory in the pool's total from now on, so
 * that the budget bounds what the process holds (its resident anonymous
 * memory), not only what the library accounts for: measured now (Linux:
 * /proc/self/statm) as the process's anonymous resident bytes less the
 * loaded weights and the sessions' own bytes - the model's metadata and
 * tokenizer, thread stacks, the app's heap. Call it when the app has
 * loaded what it keeps (again to measure anew). Executable and library
 * pages (file-backed) are not counted. Any thread. */
RB_API rb_status rb_pool_count_process(rb_pool *pool);
/*
 * The app-switch moment for every session of the pool, from any thread
 * (an Android memory callback on the main thread while the model thread
 * computes): each session gives back what `level` names (RB_TRIM_BYTES:
 * `bytes` in all, in the pool's order); RB_TRIM_COMPLETE releases the
 * weights too. An idle session is trimmed before this returns; a session
 * feeding on another thread is trimmed by that thread at its next layer
 * boundary (the feed then goes on, restoring what it needs: its results
 * stay exact), and *freed_out counts only what went before the return.
 * The pool's own trims of a feeding session (its budget, this call) wait
 * for the feed's next batch instead of its next layer: sessions that trim
 * each other never keep a batch from completing.
 */
RB_API rb_status rb_pool_trim(rb_pool *pool, uint64_t bytes, rb_trim_level level,
                              uint64_t *freed_out);
/*
 * The budget's last step, after every session's KV and the weights: a
 * session to close. What an open session holds besides its KV (its run
 * state, tables, thread pool) no trim takes back; an app that keeps many
 * sessions open (a server's conversations) asks the pool which to close.
 * Returns the least recently used background session (rb_session_params
 * .priority, rb_session_set_priority: the app marks the sessions it may
 * close) while the pool counts more than its budget, or holds more than
 * max_sessions sessions (0: no limit); NULL when within both or when no
 * background session is left. The pool closes nothing: the app saves the
 * session if it wants, destroys it, and asks again until NULL. The
 * session returned stays the app's (valid until it destroys it). Any
 * thread; the app must not destroy that session from another thread
 * meanwhile.
 */
RB_API rb_session *rb_pool_next_to_close(rb_pool *pool, uint32_t max_sessions);

/*
 * Restores ahead of time the idle session of the pool most likely to
 * return next: among the sessions with something out of RAM, no open
 * prefetch and no call running, the one with the highest score
 * feeds / (1 + feeds of the pool's other sessions since its last feed) -
 * frequency, decayed by what the others did since (recency); ties go to
 * the most recently used. It prefetches as rb_session_prefetch does, but
 * with the budget's free bytes only, whatever its priority: it never trims
 * anything. An app calls it when it is idle (between turns, while the
 * user reads). *picked (may be NULL): the session prefetched, NULL when no
 * session qualified; *planned_bytes (may be NULL): the bytes it brings
 * (0 when the budget has no room). Cost: as rb_session_prefetch, and a
 * scan of the pool's sessions. Any thread; the app must not destroy a
 * session of the pool from another thread meanwhile.
 * Errors: RB_E_INVALID_ARG (NULL pool), RB_E_NOMEM.
 */
RB_API rb_status rb_pool_prefetch_next(rb_pool *pool, rb_session **picked,
                                       uint64_t *planned_bytes);

typedef struct rb_pool_stats {
    uint64_t budget_bytes;       /* 0: none */
    uint64_t total_bytes;        /* weights + sessions + base, as the pool counts them */
    uint64_t weights_bytes;      /* the model's weights in RAM */
    uint64_t weights_total_bytes;/* ... and all of them */
    uint64_t sessions_bytes;     /* every session's KV (any form in RAM), scratch, tables */
    uint64_t over_bytes;         /* over the budget after the last enforcement */
    uint32_t n_sessions, n_background;
    uint64_t n_enforcements;     /* times the pool checked its budget */
    uint64_t n_trims_posted;     /* trims a busy session served at a layer boundary */
    uint64_t trimmed_bytes;      /* taken from sessions by the pool */
    uint64_t weights_released_bytes; /* weights released by the pool */
    uint64_t n_pressure_events[3];   /* the monitor's low, medium, critical events */
    uint64_t base_bytes;             /* the process's other memory, as
                                        rb_pool_count_process measured it: in
                                        total_bytes, never trimmed */
    char pressure_source[256];       /* what it watches ("" when it does not) */
    uint64_t shared_kv_bytes;        /* KV pages several sessions hold
                                        (rb_session_fork), counted once: in
                                        sessions_bytes and total_bytes */
    uint64_t n_shared_kv_pages;      /* ... and their number */
    /* restoring ahead of time: prefetches begun in the pool's sessions,
       the bytes they were granted (planned), and what background sessions
       gave up to make room for a foreground one's */
    uint64_t n_prefetches;
    uint64_t prefetch_granted_bytes;
    uint64_t prefetch_trimmed_bytes;
    /* the budget's leveled trims: how many, and the KV each member trimmed
       by the last one kept at most (its water line) */
    uint64_t n_leveled_trims;
    uint64_t level_line_bytes;
    /* budget trims that had to take pages several sessions share: those
       go last, after every session's own KV (a shared page's RAM leaves
       with its last holder, and each holder would read it back) */
    uint64_t n_shared_trims;
} rb_pool_stats;
RB_API rb_status rb_pool_get_stats_sized(const rb_pool *pool, rb_pool_stats *out,
                                         size_t out_size);
#define rb_pool_get_stats(pool, out) rb_pool_get_stats_sized((pool), (out), sizeof *(out))

/*
 * Memory pressure, judged by the library (opt-in). A monitor thread waits
 * on the kernel's signals and trims the pool by the level they reach, with
 * no help from the app:
 *
 *   source (first found)                    level     the pool's trim
 *   PSI "some" >= low_some_ms per window    low       RB_TRIM_BACKGROUND
 *   PSI "some" >= medium_some_ms            medium    RB_TRIM_MODERATE
 *   PSI "full" >= critical_full_ms          critical  RB_TRIM_COMPLETE
 *   cgroup v1 memory.pressure_level         low / medium / critical, as above
 *   cgroup v1 memory.oom_control            critical
 *
 * PSI is read from the cgroup's memory.pressure on cgroup v2, else from
 * /proc/pressure/memory (the whole machine: on cgroup v1 there is no
 * per-cgroup PSI). Why these levels: "some" stall means at least one task
 * waits for memory (reclaim is working: give back what is cheapest to
 * restore, the last layers' KV); "full" stall means every task waits (the
 * low-memory killer comes next: give back everything, the weights too -
 * the sessions' tokens survive, so nothing is lost). The defaults follow
 * Android's lmkd, which acts on PSI "some" 70-100 ms per 1 s: window
 * 2000 ms (the kernel takes 2 s windows without CAP_SYS_RESOURCE), low at
 * some 100 ms, medium at some 200 ms, critical at full 200 ms.
 *
 * Android (API 34+): an app gets only TRIM_MEMORY_UI_HIDDEN and
 * TRIM_MEMORY_BACKGROUND in onTrimMemory (the other levels are no longer
 * delivered), so the library has to judge the pressure itself: watch it
 * (this call), and from onTrimMemory call, on any thread:
 *   UI_HIDDEN   the user left the app: rb_session_set_priority(s,
 *               RB_PRIORITY_BACKGROUND) for its sessions, and
 *               rb_pool_trim(pool, 0, RB_TRIM_BACKGROUND, NULL);
 *   BACKGROUND  the app is on the LRU list and may be killed next:
 *               rb_pool_trim(pool, 0, RB_TRIM_COMPLETE, NULL) (and save the
 *               sessions bound to files: their tokens are already there).
 * A feed running on the model thread meanwhile trims at its next layer
 * boundary.
 *
 * p may be NULL (the defaults: the process's own memory cgroup when it has
 * one, else system-wide PSI). Errors: RB_E_UNSUPPORTED (no signal this
 * machine offers could be armed: the message says why for each),
 * RB_E_INVALID_ARG (already watching, a threshold out of range), RB_E_IO.
 * rb_pool_unwatch_pressure stops it (rb_pool_destroy does too); no trim
 * comes from the monitor after it returns.
 */
typedef struct rb_pool_pressure_params {
    const char *cgroup_dir;   /* a cgroup to watch; NULL: the process's own */
    int is_system_wide;       /* nonzero: /proc/pressure/memory only */
    uint32_t window_ms;       /* PSI window; 0: 2000 */
    uint32_t low_some_ms, medium_some_ms, critical_full_ms; /* per window; 0: defaults */
} rb_pool_pressure_params;
RB_API rb_status rb_pool_watch_pressure(rb_pool *pool, const rb_pool_pressure_params *p,
                                        rb_error *err);
RB_API void rb_pool_unwatch_pressure(rb_pool *pool);

/* Bytes of the session by category and tier, and the last restore's
 * phases. All byte counts are of RAM unless the name says otherwise.
 * Strings (storage_io, weights_policy, file_recovery): owned by the
 * session, valid until it is destroyed (they are set when it is created
 * or opened and never change after); NULL where the field says so. */
typedef struct rb_session_stats {
    uint64_t weights_bytes;          /* resident weight bytes */
    uint64_t weights_evicted_bytes;  /* released, to re-read from the model file */
    uint64_t kv_raw_bytes;           /* resident KV pages */
    uint64_t kv_compressed_bytes;    /* compressed tier frames */
    uint64_t kv_compressed_raw_bytes;/* what those frames decode to */
    uint64_t kv_stored_bytes;        /* on storage (not RAM) */
    uint64_t kv_dropped_bytes;       /* to recompute (not RAM) */
    uint64_t scratch_bytes;          /* forward run state, logits */
    uint64_t other_bytes;            /* tokens, tables, codec buffers */
    uint64_t total_bytes;            /* the sum of the RAM categories */
    uint64_t budget_bytes;           /* 0: none */
    uint32_t n_kv_pages[RB_TIER_COUNT];
    uint32_t n_layers_weights_evicted;
    uint64_t n_disk_full;            /* pages kept in RAM because a write to the
                                        storage tier failed (each page once) */
    uint64_t n_spill_damaged;        /* pages recomputed after a bad spill */
    double decode_bytes_per_s;       /* D and R of the tier split (R: the
                                        profile's, or what the disk gave) */
    double storage_bytes_per_s;
    const char *storage_io;          /* "O_DIRECT" or the fallback's reason */
    /* the last feed's restore (zeros when it restored nothing); the
       workers' busy times are summed over their streams */
    double restore_io_s;             /* I/O worker busy time */
    double restore_decode_s;         /* decode worker busy time */
    double restore_wait_s;           /* forward pass blocked on a layer */
    double restore_total_s;          /* from the feed's start to its last restore */
    uint64_t restore_bytes_io;
    uint64_t restore_bytes_decoded;
    uint32_t restore_recomputed_tokens;
    /* the session file, when bound */
    uint64_t file_commits;
    uint64_t file_pages_written;
    double file_commit_s;            /* time spent committing, in all */
    rb_status file_status;           /* the last commit's */
    /* weight streaming, when on (weights_streaming 1) */
    int weights_streaming;
    const char *weights_policy;
    uint64_t weights_budget_bytes;       /* the cache's capacity now */
    uint64_t weights_min_budget_bytes;   /* the least that works */
    uint64_t weights_loop_bytes;         /* N: read per token */
    uint64_t weights_pinned_loop_bytes;  /* S: kept (the rest streams) */
    uint64_t weights_window_bytes;       /* stream window */
    uint64_t weights_max_resident_bytes; /* the most the cache held */
    uint64_t weights_read_bytes;         /* from storage, since the session began */
    uint64_t weights_reads;              /* read requests */
    uint64_t weights_hits, weights_misses;   /* block fetches */
    uint64_t weights_passes;             /* forward passes (tokens in decode) */
    uint64_t weights_rebalances;         /* budget changes as KV grew */
    uint64_t weights_given_up_bytes;     /* cache given to KV since the start */
    double weights_io_s;                 /* read time (throttle included) */
    double weights_wait_s;               /* forward pass blocked on weights */
    double weights_room_wait_s;          /* read-ahead waited for the window */
    double weights_idle_s;               /* read-ahead had nothing to read */
    /* the device profile's storage bandwidth (0: host, unthrottled); the
       split's R (storage_bytes_per_s) is lower when the disk gave less */
    double device_bytes_per_s;
    /* new fields only here, at the end */
    const char *file_recovery;       /* NULL; or why the open fell back to an
                                        older state of the file (damage) */
    uint64_t file_lost_tokens;       /* tokens that newer state held beyond
                                        the one opened (0: none or unknown) */
    uint64_t budget_over_bytes;      /* RAM above budget_bytes after the last
                                        feed's trim: what could not go (a full
                                        disk, the run state) */
    uint64_t trim_failures;          /* trims that failed: rb_session_trim's
                                        (its status said so) and the memory
                                        pool's, which run on whichever thread
                                        holds the session and return to no
                                        caller; none changes rb_session_errmsg */
    rb_status trim_status;           /* the last failed one's (RB_OK: none) */
    /* restoring ahead of time (rb_session_prefetch, rb_pool_prefetch_next,
       rb_session_set_priority to foreground) */
    uint64_t n_prefetches;           /* prefetches begun (with something to bring) */
    uint64_t prefetch_pages;         /* KV pages they brought back */
    uint64_t prefetch_bytes;         /* bytes they brought back (KV pages and
                                        released layers' weights) */
    uint64_t n_prefetch_cancelled;   /* stopped with segments left by a trim
                                        (the session's, the pool's: any), a
                                        rewind or a close; a feed that takes
                                        over a prefetch does not count */
    uint32_t prefetch_pending;       /* segments of the open prefetch still
                                        to arrive (0: none open, or all in) */
    double room_s;                   /* the last feed's wait for room: the
                                        memory pool's trims of other sessions
                                        before it (0: no budget, or room) */
    uint64_t restore_spare_pages;    /* KV pages restores wrote into page
                                        buffers those trims freed, not into
                                        new mappings (all feeds) */
    uint64_t file_prefix_pages;      /* KV pages of the session file whose
                                        record is its prefix file's (shared
                                        with other files: rb_session_remove_
                                        file), 0 when it has none */
} rb_session_stats;

/* Fills out (out_size bytes of it: the caller's sizeof, which the macro
 * passes). Errors: RB_E_INVALID_ARG (NULL, or out_size 0). */
RB_API rb_status rb_session_get_stats_sized(const rb_session *session, rb_session_stats *out,
                                            size_t out_size);
#define rb_session_get_stats(session, out) \
    rb_session_get_stats_sized((session), (out), sizeof *(out))

/*
 * How later trims place KV and how the next feeds restore it (see
 * rb_session_params). Pages already evicted stay where they are and come
 * back by the path they took. Call between feeds.
 * Errors: RB_E_INVALID_ARG naming the value.
 */
RB_API rb_status rb_session_set_restore(rb_session *session, rb_restore_mode mode,
                                        rb_ram_codec codec);

/*
 * Forgets the tokens from position n_tokens on (n_tokens <= the current
 * count): the context becomes its first n_tokens tokens, as if the rest had
 * never been fed (to regenerate a reply, or to replay a turn). Pages that
 * only later positions used are freed. The logits are cleared.
 * Errors: RB_E_INVALID_ARG (n_tokens beyond the current count).
 */
RB_API rb_status rb_session_rewind(rb_session *session, size_t n_tokens);

/*
 * The embedding of tokens[0..n) as one sequence: the session is rewound to
 * no tokens, the tokens are fed (they stay in the session; rewind to reuse
 * it), and the output-normed hidden states are pooled as the GGUF's
 * <arch>.pooling_type says (mean when absent; cls: the first token; last:
 * the last) and scaled to unit length, as OpenAI's embeddings are. out:
 * n_out = n_embd floats (rb_model_info). Errors: RB_E_INVALID_ARG (no
 * tokens, n_out not n_embd, n over the context), RB_E_NOMEM, and those of
 * rb_session_feed. Allocates n x n_embd floats for the call.
 */
RB_API rb_status rb_session_embed(rb_session *session, const int32_t *tokens, size_t n,
                                  float *out, size_t n_out);

/*
 * Context shift without recomputing (llama.cpp's rule): the first n_keep
 * tokens stay, the n_discard after them go, and the later ones move down
 * by n_discard positions, their keys rotated in place by -n_discard
 * positions (RoPE composes: the same as if they had been computed there,
 * up to rounding; a quantized K is dequantized, rotated and quantized
 * again, as llama.cpp does). Pages evicted to a tier are brought back
 * first; the pages the shift rewrites are forgotten in every tier and the
 * session file holds the new state at its next commit. The last logits
 * stay (they continue the context). A model with sliding-window layers
 * cannot shift (the kept prefix may be outside their window):
 * RB_E_UNSUPPORTED. Errors: RB_E_INVALID_ARG (n_keep + n_discard beyond the
 * tokens), RB_E_NOMEM, RB_E_IO (a restore that failed).
 */
RB_API rb_status rb_session_shift(rb_session *session, size_t n_keep, size_t n_discard);

/*
 * A new session whose context is src's first n_tokens tokens (n_tokens <=
 * rb_session_n_tokens(src); 0 and all are allowed), sharing src's KV pages
 * instead of computing or copying them: the full pages of the prefix are
 * held by both sessions (copy-on-write at page granularity), the partly
 * filled last page is copied. Cost: a page-table walk and one page per
 * layer, after src's evicted pages are brought back (as rb_session_shift
 * does). Both sessions then go on independently, and each one's logits
 * are bit-identical to a session fed its tokens alone: a shared page is
 * never written (a rewind of either into it copies it first, or
 * recomputes it when the copy's memory is not there), and it is freed
 * when its last holder lets it go (a rewind below it, a trim, a sliding
 * window, destroy).
 *
 * params: the fork's settings (NULL: src's). The fork is in src's pool
 * (params->pool NULL or that pool; a src with a pool of its own shares it
 * with the fork, which keeps it alive); n_ctx 0 or src's, and src's KV
 * types. The last logits are copied when n_tokens is all of src (else
 * none, as after a rewind). The fork has no session file (rb_session_save
 * binds one, holding its own copy of every page).
 *
 * Memory: a shared page is counted once, in the pool (rb_pool_stats's
 * shared_kv_bytes), not in either session's bytes in the pool (each
 * session's stats, kv_raw_bytes and n_kv_pages, still show every page it
 * uses, shared or not). A trim of a
 * session takes its own copy of a shared page to its own tiers (RAM
 * codec, storage, its session file) and lets the page go; the RAM stays
 * for the other holders and is freed (and uncounted) with the last. Only
 * resident pages are shared: the compressed and stored tiers hold one
 * copy per session.
 *
 * Threads: src is taken for the call (it waits for another call on src);
 * the fork and src may then be used from different threads, trimmed by
 * the pool from any thread, and destroyed in any order.
 * Errors: RB_E_INVALID_ARG (NULL src/out, n_tokens beyond src, another
 * pool, another n_ctx or KV type), RB_E_NOMEM, RB_E_IO (a restore of src
 * that failed), and those of rb_session_create. On an error *out is
 * unchanged and src keeps its context.
 */
RB_API rb_status rb_session_fork(rb_session *src, size_t n_tokens,
                                 const rb_session_params *params, rb_session **out,
                                 rb_error *err);

/* ---- session files ----------------------------------------------------- */

/*
 * Saves the session to path (created, or replaced when the session is not
 * yet bound to it) and binds it there: from now on every feed appends the
 * pages that filled up and the tokens (not the partly filled last page:
 * its positions are recomputed on open if it was never saved), so a kill
 * at any instant leaves the file at the last feed (or the one before).
 * An explicit call also writes the last page. A new file appears at path
 * only with this first state (created under a temporary name, mode 0600);
 * a symbolic link at path is followed. The file is locked while bound: a
 * second process gets RB_E_BUSY naming the holder's pid (RB_SAVE_WAIT:
 * waits). The file holds the tokens,
 * the blob (rb_session_set_blob), the model's fingerprint and every KV page
 * with a checksum. flags: RB_SAVE_FSYNC, RB_SAVE_SNAPSHOT (below).
 * Errors: RB_E_IO (the message names the path; a full disk leaves the
 * file's previous state and the session in RAM as it was).
 * Cost: writes and (RB_SAVE_FSYNC) syncs the file: blocks on I/O; waits
 * for a pending commit first.
 */
enum {
    RB_SAVE_FSYNC = 1,    /* fdatasync each commit: survives a power cut too */
    RB_SAVE_SNAPSHOT = 2, /* write a copy of the session now and stay as before
                             (not bound to path, no commits after feeds) */
    RB_SAVE_ON_REQUEST = 4, /* feeds do not commit: the file changes only at
                             rb_session_save, so each of its states is one
                             the caller saved (with a blob that describes it,
                             e.g. a chat's turns) */
    RB_SAVE_WAIT = 8      /* a file another process holds (one writer at a
                             time): wait until it lets go, instead of RB_E_BUSY */
};
RB_API rb_status rb_session_save(rb_session *session, const char *path, unsigned flags);

/*
 * A fork's file and its prefix file. When a session's first tokens are
 * pages it shares with another session (rb_session_fork), the first commit
 * of its file does not write them: it links path.base to the prefix file
 * of those tokens in the same folder (.rbprefix-KEY-N, written once by the
 * first fork that needs it, never changed) and names its records, after
 * checking that they hold this session's bits. So K forks of one prompt
 * hold it once on storage (the source's own file keeps its copy). Moving
 * a file elsewhere: move path.base along, or its prefix's positions are
 * computed again on open (the tokens stay). Delete a file with
 * rb_session_remove_file: it takes the link and, with the last one, the
 * prefix file.
 */
/*
 * Removes the session file at path (no session may be bound to it), its
 * link path.base and each prefix file of its folder that no file links to
 * any more. RB_OK also when there was nothing; RB_E_IO naming the file.
 */
RB_API rb_status rb_session_remove_file(const char *path, rb_error *err);

/*
 * Opens a session saved by rb_session_save on the same model (its
 * fingerprint must match) with these params (n_ctx must be the saved
 * one). Cold restore: the file's catalog and the model's non-layer
 * tensors are read now; each layer's weights and KV pages are read in
 * layer order by workers that start here (pipelined, without budgets; else
 * at the first feed), so the restore goes on while the caller builds its
 * tokenizer or the user types, and the first feed computes each layer as
 * soon as it is in. A trim, rewind or close before that feed stops the
 * reading short (what was not read stays in the file); a save waits for
 * it. Pages that fail their checksum, or that the file does not have, are
 * recomputed from the tokens. The session stays bound to path.
 * A damaged newest state falls back to the older one: the stats say so
 * (file_recovery, file_lost_tokens). params->file_flags: RB_SAVE_FSYNC,
 * RB_SAVE_ON_REQUEST, RB_SAVE_WAIT.
 * Errors: RB_E_NOT_FOUND (no file), RB_E_BUSY (another process holds it),
 * RB_E_FORMAT (not a session file, damaged beyond its tokens, a token
 * outside the vocabulary), RB_E_INVALID_ARG (another model: its dimensions
 * in the message), RB_E_UNSUPPORTED (another context length, or more
 * tokens than n_ctx: the message says which -c opens it), and
 * rb_session_create's.
 * Cost: reads the file's catalog and the non-layer weights (blocks on
 * I/O); starts the restore's workers; allocates as rb_session_create.
 */
RB_API rb_status rb_session_open_saved(rb_model *model, const rb_session_params *params,
                                       const char *path, rb_session **out, rb_error *err);

/*
 * rb_session_open_saved, but the leading pages that peer (an open session
 * in the same pool) holds in RAM for the same tokens, with the same bits
 * (each checked against the file's checksums), are shared with it as a
 * fork shares its source's (rb_session_fork) instead of read: a
 * conversation reopened beside another that shares its prompt reads only
 * its own tail, and the prompt is held once. The session is in peer's
 * pool (params->pool: NULL or that pool). Of those pages, the ones peer
 * let go to its tiers are brought back into peer first (once, for both,
 * as rb_session_fork brings back its source's); pages peer holds with
 * other bits, or beyond the tokens they share, are read from the file.
 * Errors: RB_E_INVALID_ARG (no peer, or a peer in no pool or in another
 * one), and rb_session_open_saved's.
 * Cost: rb_session_open_saved's, less the pages shared; hashes the shared
 * pages once, holding peer's lock meanwhile.
 */
RB_API rb_status rb_session_open_saved_sharing(rb_model *model, const rb_session_params *params,
                                               const char *path, rb_session *peer,
                                               rb_session **out, rb_error *err);

/*
 * rb_session_open_saved of a session file already open at fd (a content
 * URI's or an asset's descriptor, a file in a sandbox; the whole file,
 * from offset 0), read only: the state it holds is read into the session
 * before this returns (as rb_session_unbind does: a page that fails its
 * checksum is recomputed by the next feed) and the file is let go, so the
 * session is bound to no file (feeds are not committed; rb_session_save
 * binds one by path). Ownership: the library reads through its own
 * duplicate of fd and closes it before returning; the caller keeps fd.
 * Nothing is written to the file, and no lock is taken: another writer
 * must not change it during the call. Errors: as rb_session_open_saved
 * (RB_E_INVALID_ARG also for fd < 0 or not open; the messages name the
 * file "file descriptor N"). Cost: reads the whole state (blocks on I/O).
 */
RB_API rb_status rb_session_open_saved_fd(rb_model *model, const rb_session_params *params,
                                          int fd, rb_session **out, rb_error *err);

/*
 * Stops committing to the file the session is bound to (rb_session_save,
 * rb_session_open_saved): a pending commit finishes first and the file
 * keeps that state, which later feeds no longer change. Pages whose only
 * copy is in the file (a session just opened) are read back first; one
 * that fails its checksum is recomputed from the tokens by the next feed.
 * No file bound: nothing to do. Errors: RB_E_IO (layer weights could not
 * be re-read; the session stays bound).
 */
RB_API rb_status rb_session_unbind(rb_session *session);

/* The caller's bytes saved with the session (sampler state, chat history):
 * copied (allocates); at most 256 KiB; RB_E_INVALID_ARG when larger. The
 * getter's pointer lives until the next set_blob or open; NULL (and *n 0)
 * when there is none. */
RB_API rb_status rb_session_set_blob(rb_session *session, const void *data, size_t n);
RB_API const void *rb_session_get_blob(const rb_session *session, size_t *n);

/* One span of the last feed's timeline (rb_session_restore_events): what
 * ran for which layer, in seconds from the feed's start. */
typedef enum rb_event_kind {
    RB_EVENT_RESTORE_IO = 0,     /* the I/O worker read a segment of the layer */
    RB_EVENT_RESTORE_DECODE = 1, /* the decode worker decoded a page of the layer */
    RB_EVENT_COMPUTE = 2,        /* the forward pass computed the layer */
    RB_EVENT_WAIT = 3            /* the forward pass waited for the layer */
} rb_event_kind;

typedef struct rb_restore_event {
    rb_event_kind kind;
    uint32_t layer;
    double start_s;
    double end_s;
} rb_restore_event;

/* Copies up to max events of the last feed into out (in the order they
 * ended; at most 8192 are kept per feed) and returns how many there were. */
RB_API size_t rb_session_restore_events(const rb_session *session, rb_restore_event *out,
                                        size_t max);

/* ---- tokens ------------------------------------------------------------ */

/*
 * Text to token ids with the model's tokenizer (SentencePiece or GPT-2
 * byte-level BPE, from the GGUF metadata; built on first use).
 * add_special: add BOS/EOS as the model asks; parse_special: recognise
 * special-token text such as "<|im_start|>".
 * Errors: RB_E_INVALID_ARG when n_max is too small (*n_out then holds the
 * count needed; tokens may be NULL with n_max 0 to ask for it), and the
 * tokenizer's load errors (RB_E_FORMAT, RB_E_UNSUPPORTED naming the key).
 * Message on the model.
 * Cost: the first call builds the tokenizer (allocates its tables).
 * Threads: an exception to the one-thread rule: any number of threads may
 * tokenize with one model at once, and at the same time as sessions of
 * the model feed (the tokenizer is read-only once built; the first call
 * builds it under the model's lock). A failure's message is set under
 * that lock too, so with several threads it is the last failing call's:
 * read it only when no other thread may fail meanwhile.
 */
RB_API rb_status rb_model_tokenize(rb_model *model, const char *text, size_t len,
                                   int add_special, int parse_special, int32_t *tokens,
                                   size_t n_max, size_t *n_out);

/* Special token ids, or -1 when the model has none (or no tokenizer). */
RB_API int32_t rb_model_token_bos(rb_model *model);
RB_API int32_t rb_model_token_eos(rb_model *model);
/* 1 when the token ends generation (EOS, end-of-turn tokens). */
RB_API int rb_model_token_is_eog(rb_model *model, int32_t token);

/*
 * The bytes of one token (llama.cpp's llama_token_to_piece with lstrip 0):
 * SentencePiece's U+2581 as a space, a byte token as its byte, a GPT-2
 * piece mapped back to bytes; a control or unknown token as its text when
 * special, else as "". A piece may be part of a UTF-8 character (or hold a
 * NUL byte): *out_len is its length. Writes at most size bytes with a NUL
 * after the piece when it fits (buf may be NULL with size 0 to ask).
 * Errors: RB_E_INVALID_ARG (token out of range, out_len NULL), the
 * tokenizer's load errors (message on the model).
 */
RB_API rb_status rb_model_token_to_piece(rb_model *model, int32_t token, int special, char *buf,
                                         size_t size, size_t *out_len);

/*
 * Streaming detokenizer: turns tokens into text one at a time and emits
 * only complete UTF-8 characters (a character split across tokens comes out
 * whole with the token that completes it). Special tokens are not rendered.
 * The space a SentencePiece vocabulary with add_space_prefix puts before a
 * text's first word is dropped from the first piece, so prompt +
 * continuation print as llama.cpp prints them; a text that continues
 * earlier text (a resumed session) keeps it: RB_DETOKENIZER_CONTINUATION.
 */
typedef struct rb_detokenizer rb_detokenizer;

#define RB_DETOKENIZER_CONTINUATION 1u /* keep the first piece's leading space */

RB_API rb_status rb_detokenizer_create(rb_model *model, rb_detokenizer **out, rb_error *err);
/* The same with RB_DETOKENIZER_* flags (0: as rb_detokenizer_create).
 * RB_E_INVALID_ARG for an unknown flag. */
RB_API rb_status rb_detokenizer_create_flags(rb_model *model, unsigned flags,
                                             rb_detokenizer **out, rb_error *err);
RB_API void rb_detokenizer_destroy(rb_detokenizer *d);
/* The most bytes one push or flush can write (the longest piece plus an
 * unfinished character): size out buffers with it. */
RB_API size_t rb_detokenizer_max_bytes(const rb_detokenizer *d);
/* Writes the text completed by this token to out (no NUL) and its length
 * to *n_out. Errors: RB_E_INVALID_ARG when out_size is below
 * rb_detokenizer_max_bytes(d), a pointer is NULL or the token is not in
 * the vocabulary: nothing is consumed, nothing is written (message:
 * rb_detokenizer_errmsg). Allocates nothing. */
RB_API rb_status rb_detokenizer_push(rb_detokenizer *d, int32_t token, char *out, size_t out_size,
                                     size_t *n_out);
/* Writes what remains (an unfinished character becomes U+FFFD) and ends
 * the stream. Errors: as push's (out_size, NULL). */
RB_API rb_status rb_detokenizer_flush(rb_detokenizer *d, char *out, size_t out_size,
                                      size_t *n_out);
/* The message of the last failed call on d ("" if none). */
RB_API const char *rb_detokenizer_errmsg(const rb_detokenizer *d);

/* ---- chat templates ------------------------------------------------------ */

/*
 * Built-in chat formats (no Jinja interpreter): a model's family is
 * recognised from its tokenizer.chat_template text by the family's markers,
 * else from its vocabulary, architecture and name; a family renders a
 * conversation as llama.cpp's built-in templates do. The text holds the
 * markers written out (<|im_start|>, [INST], ...): tokenize it with special
 * parsing on; BOS is not part of it (add it as the model asks).
 */
typedef enum rb_chat_template {
    RB_CHAT_TEMPLATE_CHATML = 0, /* Qwen2/Qwen3, SmolLM2: <|im_start|>role\n...<|im_end|>\n */
    RB_CHAT_TEMPLATE_LLAMA3,     /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    RB_CHAT_TEMPLATE_LLAMA2,     /* [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]...</s><s> */
    RB_CHAT_TEMPLATE_ZEPHYR,     /* TinyLlama chat: <|user|>\n...</s>\n<|assistant|>\n */
    RB_CHAT_TEMPLATE_PLAIN,      /* no markers: "User: ...\nAssistant:" (the fallback) */
    RB_CHAT_TEMPLATE_GEMMA,      /* <start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n */
    RB_CHAT_TEMPLATE_PHI3,       /* <|user|>\n...<|end|>\n<|assistant|>\n */
    RB_CHAT_TEMPLATE_MISTRAL,    /* [INST] ...[/INST] ...</s> (Mistral's v3) */
    RB_CHAT_TEMPLATE_DEEPSEEK_R1,/* DeepSeek-R1 distills: <｜User｜>...<｜Assistant｜> */
    RB_CHAT_TEMPLATE_COUNT
} rb_chat_template;

/* One message: role "system", "user" or "assistant"; content UTF-8. */
typedef struct rb_chat_message {
    const char *role;
    const char *content;
} rb_chat_message;

#define RB_CHAT_FIRST_LINE_MAX 96

/* Which template a model gets, and why. Strings are static. */
typedef struct rb_chat_template_info {
    rb_chat_template tmpl;
    const char *name;          /* "chatml", "gemma", ... */
    const char *reason;        /* e.g. "tokenizer.chat_template has <start_of_turn>" */
    int is_fallback;           /* nothing named a family: tmpl is the plain fallback */
    int has_text;              /* template text was given or is in the file */
    char first_line[RB_CHAT_FIRST_LINE_MAX]; /* an unrecognised text's first line
                                  (cut to fit, "..." appended); "" otherwise */
    const char *marker;        /* a special token every turn uses; NULL (plain) */
    int32_t marker_token;      /* its id when the vocabulary has it as one
                                  special token; -1: it would be fed as text */
} rb_chat_template_info;

/*
 * Chooses the template. tmpl: NULL for the model's own (its
 * tokenizer.chat_template text, else the vocabulary's marker tokens, the
 * architecture, the name); a family name ("chatml", "llama3", "llama2",
 * "zephyr", "plain", "gemma", "phi3", "mistral", "deepseek-r1"); any other
 * string is taken as template text and recognised by its markers. When
 * nothing is recognised the plain fallback is used and is_fallback says so
 * (with the text's first line when there was text). model may be NULL when
 * tmpl is given (marker_token is then -1). Never prints.
 * Errors: RB_E_INVALID_ARG (out NULL, or both model and tmpl NULL).
 */
RB_API rb_status rb_chat_template_choose(rb_model *model, const char *tmpl,
                                         rb_chat_template_info *out);

/*
 * Renders a conversation: messages in order, then (add_assistant) the
 * header that opens the assistant's reply. Writes at most size bytes
 * including a NUL (as snprintf: a prefix when the buffer is small; buf may
 * be NULL with size 0) and sets *out_len to the whole text's length.
 * llama3 and gemma trim each message's content, mistral an assistant's;
 * gemma has no system role and puts the system text at the start of the
 * next user turn. Errors: RB_E_INVALID_ARG (unknown template or role, a
 * NULL message field, out_len NULL), RB_E_NOMEM.
 */
RB_API rb_status rb_chat_render(rb_chat_template t, const rb_chat_message *msgs, size_t n_msgs,
                                int add_assistant, char *buf, size_t size, size_t *out_len);

/* rb_chat_template_choose(model, tmpl) then rb_chat_render, in one call. */
RB_API rb_status rb_chat_apply_template(rb_model *model, const char *tmpl,
                                        const rb_chat_message *msgs, size_t n_msgs,
                                        int add_assistant, char *buf, size_t size,
                                        size_t *out_len);

/*
 * One piece of a conversation fed one at a time (the earlier pieces are
 * never re-rendered): RB_CHAT_PIECE_SYSTEM the block that opens it (nothing
 * for an empty text); RB_CHAT_PIECE_USER a user message and the assistant
 * header after it (flags RB_CHAT_FIRST_TURN: no user turn before it;
 * RB_CHAT_HAS_SYSTEM: a system block was fed); RB_CHAT_PIECE_REPLY_END what
 * closes the assistant's reply (text ignored). Pieces joined with the
 * replies in between are rb_chat_render's text. Buffer and errors as
 * rb_chat_render.
 */
typedef enum rb_chat_piece {
    RB_CHAT_PIECE_SYSTEM = 0,
    RB_CHAT_PIECE_USER = 1,
    RB_CHAT_PIECE_REPLY_END = 2
} rb_chat_piece;
#define RB_CHAT_FIRST_TURN 1u
#define RB_CHAT_HAS_SYSTEM 2u
RB_API rb_status rb_chat_render_piece(rb_chat_template t, rb_chat_piece piece, const char *text,
                                      unsigned flags, char *buf, size_t size, size_t *out_len);

/*
 * Tools (function calling). Each family announces a tool list, writes a
 * call and takes a tool's result back the way its models were trained:
 *   chatml (Qwen2.5/Qwen3, Hermes): "# Tools ... <tools>\n{tool}\n...</tools>
 *     ... <tool_call>...</tool_call>" after the system text (a system block
 *     of its own when there is none); a call is "<tool_call>\n{"name": N,
 *     "arguments": {...}}\n</tool_call>"; results are one user turn of
 *     "<tool_response>\nR\n</tool_response>" per result, consecutive ones
 *     joined with "\n".
 *   llama3 (Llama 3.1): the system block opens with "Environment: ipython\n"
 *     and the knowledge/today dates; the list (with its "Given the following
 *     functions..." instruction) opens the first user message (the system
 *     block when there is none); a call is the reply {"name": N,
 *     "parameters": {...}} alone; a result is an ipython turn
 *     (<|start_header_id|>ipython<|end_header_id|>\n\nR<|eot_id|>).
 *   mistral: "[AVAILABLE_TOOLS][{tool}, ...][/AVAILABLE_TOOLS]" right before
 *     the last user turn; calls are "[TOOL_CALLS][{"name": N, "arguments":
 *     {...}}, ...]"; a result is "[TOOL_RESULTS]{"content": R}[/TOOL_RESULTS]"
 *     (R as is when it is JSON, else as a JSON string).
 *   every other family (no tool format of its own): the generic fallback is
 *     chatml's Hermes text inside the family's own turns (the list in the
 *     system block, calls in <tool_call> tags, results as user turns of
 *     <tool_response>).
 * JSON is written as the templates' tojson does (", " and ": "), members in
 * the caller's order. What the dates and tool text say is fixed (llama3's
 * "26 Jul 2024", as its template's default), not the clock's.
 */
typedef struct rb_chat_tools {
    const char *tools;        /* JSON array of OpenAI tools ({"type": "function",
                                 "function": {...}}, written as given), or NULL */
    const char *const *calls; /* NULL, or [n_msgs]: for an assistant message the
                                 JSON array of its calls (OpenAI's {"function":
                                 {"name", "arguments": OBJECT or its JSON text}}
                                 or {"name", "arguments"}), else NULL */
} rb_chat_tools;

/*
 * rb_chat_render with tools: the list announced, role "tool" messages
 * (content: the result) and assistant messages' calls rendered in the
 * family's form (above). tools NULL: no list, no calls, but role "tool" is
 * accepted. Buffer as rb_chat_render. Errors: RB_E_INVALID_ARG (as
 * rb_chat_render, or the tool list or a message's calls not JSON of the
 * shape above), RB_E_NOMEM.
 */
RB_API rb_status rb_chat_render_tools(rb_chat_template t, const rb_chat_message *msgs,
                                      size_t n_msgs, const rb_chat_tools *tools,
                                      int add_assistant, char *buf, size_t size,
                                      size_t *out_len);

/* The text a reply of these calls (a JSON array as rb_chat_tools.calls)
 * is in family t. Buffer and errors as rb_chat_render_tools. */
RB_API rb_status rb_chat_format_tool_calls(rb_chat_template t, const char *calls, char *buf,
                                           size_t size, size_t *out_len);

/* One call read from a reply; both strings owned by the rb_chat_tool_calls. */
typedef struct rb_chat_tool_call {
    char *name;
    char *arguments; /* the arguments object as compact JSON ("," and ":") */
} rb_chat_tool_call;

typedef struct rb_chat_tool_calls {
    rb_chat_tool_call *calls;
    size_t n;
    char *content;   /* the reply's text outside the calls, trimmed; NULL when none */
} rb_chat_tool_calls;

/*
 * Reads the tool calls in a reply text[0..len): every <tool_call>JSON
 * </tool_call> whose JSON is {"name": STRING, "arguments": OBJECT} (a tag
 * whose body is not stays in the content); when there is none, mistral's
 * "[TOOL_CALLS][{"name", "arguments"}, ...]" at the start (text after the
 * array is content), or llama 3.1's whole reply as {"name", "parameters" |
 * "arguments"} objects (after an optional "<|python_tag|>", separated by
 * white space or ';', or in one array). Every family's reply is read in all
 * three forms (models drift between them); t picks none of them but must be
 * valid. Pure: the same text gives the same calls. Free with
 * rb_chat_tool_calls_free. Errors: RB_E_INVALID_ARG (out NULL, t unknown,
 * text NULL with len > 0), RB_E_NOMEM (out then holds nothing).
 */
RB_API rb_status rb_chat_parse_tool_calls(rb_chat_template t, const char *text, size_t len,
                                          rb_chat_tool_calls *out);
/* Frees what rb_chat_parse_tool_calls filled in and empties it; NULL ok. */
RB_API void rb_chat_tool_calls_free(rb_chat_tool_calls *calls);

/* "chatml", ...; "?" out of range. */
RB_API const char *rb_chat_template_name(rb_chat_template t);
/* The template of that name, or -1. */
RB_API int rb_chat_template_from_name(const char *name);
/* All names, comma-separated, for usage and error messages. */
RB_API const char *rb_chat_template_names(void);
/* What a user turn leaves out right after the system block (llama2's,
 * mistral's and gemma's system block opens the first user turn), or NULL:
 * a context shift that keeps the system block but drops the turns before a
 * kept one removes this prefix from the kept turn. */
RB_API const char *rb_chat_template_first_user_skip(rb_chat_template t);

/* ---- sampling (src/model/sampler.h describes the chain) ---------------------- */

typedef struct rb_sampler rb_sampler;

typedef struct rb_sampler_params {
    float temp;             /* <= 0: greedy; must not be NaN or infinite */
    int32_t top_k;          /* >= 0; 0 turns top-k off */
    float top_p;            /* in (0, 1]; 1 turns top-p off */
    float min_p;            /* in [0, 1]; 0 turns min-p off */
    float repeat_penalty;   /* > 0 and finite; 1 turns the penalty off */
    int32_t repeat_last_n;  /* tokens of history the penalty looks at; 0 off,
                               -1 the whole history */
    uint64_t seed;          /* the PRNG seed; the library never picks one */
    /* OpenAI's penalties over the same window of the history as
     * repeat_penalty (pass only the generated tokens and repeat_last_n -1
     * for OpenAI's exact meaning): a token that occurs c times in it has
     * c * frequency_penalty + (c > 0) * presence_penalty subtracted from
     * its logit. Finite; 0 is off. */
    float presence_penalty;
    float frequency_penalty;
    /* 1: each rb_sampler_sample records the drawn token's log-probability
     * and the n_top_logprobs best alternatives (rb_sampler_get_logprobs).
     * n_top_logprobs in [0, RB_SAMPLER_MAX_LOGPROBS]. */
    int32_t is_logprobs;
    int32_t n_top_logprobs;
} rb_sampler_params;

#define RB_SAMPLER_MAX_LOGPROBS 20

#define RB_SAMPLER_DEFAULT_SEED UINT64_C(0)

/* llama.cpp's defaults: temp 0.8, top_k 40, top_p 0.95, min_p 0.05,
 * repeat_penalty 1.0 (off), repeat_last_n 64, seed RB_SAMPLER_DEFAULT_SEED. */
RB_API rb_sampler_params rb_sampler_default_params(void);

/*
 * The whole random state of a sampler, a plain struct that a session file
 * may store as it is (host byte order) to resume sampling exactly.
 */
typedef struct rb_sampler_state {
    uint64_t seed;          /* the seed the generator started from */
    uint64_t s[4];          /* xoshiro256** state; never all zero */
} rb_sampler_state;

/* One token that survived the chain. logit is after the penalties and
 * before the temperature. */
typedef struct rb_sampler_candidate {
    int32_t id;
    float logit;
} rb_sampler_candidate;

/* Bytes rb_sampler_create allocates for n_vocab tokens (about 16 per token:
 * 2.4 MB for a 150k vocabulary). 0 when n_vocab is out of range. */
RB_API uint64_t rb_sampler_size_bytes(uint32_t n_vocab);

/*
 * Creates a sampler for rows of n_vocab logits. All scratch memory is
 * allocated here, once; sampling allocates nothing.
 *
 * params  may be NULL (defaults); copied.
 * out     receives the handle on success; unchanged on failure.
 * err     may be NULL; receives the status and message on failure.
 * Errors: RB_E_INVALID_ARG (the message names the parameter: temp, top_k,
 *         top_p, min_p, repeat_penalty, repeat_last_n, n_vocab),
 *         RB_E_NOMEM.
 */
RB_API rb_status rb_sampler_create(const rb_sampler_params *params, uint32_t n_vocab,
                            rb_sampler **out, rb_error *err);

/* Releases the sampler. NULL is a no-op. */
RB_API void rb_sampler_destroy(rb_sampler *s);

/*
 * Samples one token id in [0, n_vocab).
 *
 * logits     n_vocab values, not modified. NaN counts as -inf. When some
 *            logits are +inf, those tokens share all the probability. When
 *            every logit is -inf or NaN, the result is the lowest id whose
 *            logit is -inf (the argmax of the raw row), or 0 if all are NaN.
 * history    the tokens of the context so far, oldest first (prompt and
 *            generated alike, as llama.cpp feeds its penalty sampler); may
 *            be NULL when n_history is 0. Ids outside [0, n_vocab) are
 *            ignored.
 * token      receives the token id on success; unchanged on failure.
 * Errors: RB_E_INVALID_ARG when s, logits or token is NULL, or history is
 * NULL with n_history > 0 (the message is left on s when s is not NULL).
 * Advances the PRNG by one draw when temp > 0, not at all otherwise.
 * Thread rule: one thread at a time per sampler. Allocates nothing.
 */
RB_API rb_status rb_sampler_sample(rb_sampler *s, const float *logits, const int32_t *history,
                                   size_t n_history, int32_t *token);

/*
 * Runs the chain without the draw and exposes the survivors: *out points to
 * *n_out candidates (>= 1), valid until the next call on s. Their order is
 * unspecified. The PRNG is not touched. With temp <= 0 the one survivor is
 * the greedy token. Errors: those of rb_sampler_sample (out and n_out
 * unchanged).
 */
RB_API rb_status rb_sampler_get_candidates(rb_sampler *s, const float *logits,
                                           const int32_t *history, size_t n_history,
                                           const rb_sampler_candidate **out, size_t *n_out);

/*
 * OpenAI's logit_bias: bias[i] is added to the logit of ids[i] before the
 * penalties and the chain (-100 in practice bans a token, +100 forces it).
 * Replaces any earlier set; n 0 clears it. Copied. Errors:
 * RB_E_INVALID_ARG (an id outside [0, n_vocab), a bias not finite; the
 * message names it; the old set is kept), RB_E_NOMEM. Allocates n_vocab
 * floats on first use.
 */
RB_API rb_status rb_sampler_set_logit_bias(rb_sampler *s, const int32_t *ids, const float *bias,
                                           size_t n);

/* A token and its log-probability. */
typedef struct rb_sampler_logprob {
    int32_t id;
    float logprob;
} rb_sampler_logprob;

/*
 * After rb_sampler_sample with is_logprobs: the drawn token's natural-log
 * probability and up to n_top_logprobs alternatives, best first, in the
 * distribution the chain started from (the row after logit_bias, the
 * penalties and the grammar's mask, at temperature 1; OpenAI's and
 * llama-server's default). top may be NULL when n_top_max is 0.
 * Errors: RB_E_INVALID_ARG when is_logprobs is off or no sample was drawn
 * yet (message on s).
 */
RB_API rb_status rb_sampler_get_logprobs(rb_sampler *s, rb_sampler_logprob *chosen,
                                         rb_sampler_logprob *top, size_t n_top_max,
                                         size_t *n_top);

/* Copies the random state out. */
RB_API void rb_sampler_get_state(const rb_sampler *s, rb_sampler_state *out);

/* Restores a state saved by rb_sampler_get_state: the following draws
 * repeat those that followed the save. Errors: RB_E_INVALID_ARG when the
 * xoshiro state is all zero (left as a message on s; s unchanged). */
RB_API rb_status rb_sampler_set_state(rb_sampler *s, const rb_sampler_state *state);

/* The parameters the sampler was created with. */
RB_API rb_sampler_params rb_sampler_get_params(const rb_sampler *s);

/* The message of the last failed call on s ("" if none). Valid until the
 * next call on s. */
RB_API const char *rb_sampler_errmsg(const rb_sampler *s);

/* ---- constrained sampling: grammars (src/model/grammar.h) -------------- */

/*
 * A grammar that the sampler enforces token by token: llama.cpp's GBNF
 * (rules `name ::= ...`, alternatives `|`, string literals, character
 * classes with ranges and `^` negation, `.`, groups, `*` `+` `?` `{m,n}`),
 * compiled to a byte-level automaton over the model's vocabulary. A
 * sampler with a grammar (rb_sampler_set_grammar) draws only tokens whose
 * bytes the grammar allows next, and end-of-generation tokens only when the
 * grammar is complete.
 *
 * Cost: creation reads every token's bytes and builds a trie of them
 * (about 40 bytes per token); each sample walks the trie nodes the grammar
 * can reach from its state (typically a few thousand) unless the state's
 * mask is cached (up to 8 MB of masks per grammar). Allocates while it
 * grows its working arrays.
 * Thread rule: one thread at a time per grammar (a sampler using it counts).
 */
typedef struct rb_grammar rb_grammar;

/*
 * Compiles text[0..len) (root: the start rule's name; NULL means "root").
 * Errors: RB_E_FORMAT (the message names line and column and the problem:
 * an undefined or twice-defined rule, a left-recursive rule, a bad escape,
 * an unterminated literal or class...), RB_E_UNSUPPORTED (a grammar too
 * ambiguous for the automaton's limits), RB_E_NOMEM, the tokenizer's load
 * errors. out unchanged on failure.
 */
RB_API rb_status rb_grammar_create(rb_model *model, const char *text, size_t len,
                                   const char *root, rb_grammar **out, rb_error *err);

/*
 * A grammar for JSON that validates against a JSON Schema (schema[0..len)),
 * as OpenAI's structured outputs take it: objects with properties, required
 * (the others optional, in the schema's order), additionalProperties (no
 * extra keys are generated), strings with enum, const, pattern (a regular
 * expression subset: literals, classes, ., groups, |, quantifiers, \d \w
 * \s), minLength/maxLength and format date/uuid, integers with minimum/
 * maximum (exclusive too), numbers (with bounds: integers in them),
 * booleans, null, arrays with items/minItems/maxItems, nested objects,
 * anyOf/oneOf, type lists, $ref to #/$defs or #/definitions (recursion
 * allowed). schema NULL with len 0: any JSON object (OpenAI's json_object).
 * Errors: RB_E_FORMAT (the schema is not JSON), RB_E_UNSUPPORTED (a keyword
 * the converter does not handle, named with its place in the schema), those
 * of rb_grammar_create.
 */
RB_API rb_status rb_grammar_from_json_schema(rb_model *model, const char *schema, size_t len,
                                             rb_grammar **out, rb_error *err);

/*
 * The GBNF text rb_grammar_from_json_schema compiles, malloc'd into *out
 * (NUL-terminated, *out_len bytes; free() it). Errors as above.
 */
RB_API rb_status rb_json_schema_to_grammar(const char *schema, size_t len, char **out,
                                           size_t *out_len, rb_error *err);

RB_API void rb_grammar_destroy(rb_grammar *g);

/* Advances the grammar by one token (a sampler with the grammar does this
 * itself after each draw). Errors: RB_E_INVALID_ARG when the grammar does
 * not allow the token (message names it; the grammar is unchanged). */
RB_API rb_status rb_grammar_accept(rb_grammar *g, int32_t token);

/* 1 when the text so far is a whole match of the start rule (an
 * end-of-generation token is allowed). */
RB_API int rb_grammar_is_complete(const rb_grammar *g);

/* 1 when some byte may still follow (0: complete and nothing can follow,
 * so generation should stop). */
RB_API int rb_grammar_can_continue(const rb_grammar *g);

/* Back to the start state. Errors: RB_E_NOMEM. */
RB_API rb_status rb_grammar_reset(rb_grammar *g);

RB_API const char *rb_grammar_errmsg(const rb_grammar *g);

/*
 * Attaches a grammar to a sampler (NULL detaches it). The sampler borrows
 * g, which must outlive it or be detached: every rb_sampler_sample masks
 * the row to the tokens g allows, then advances g by the token drawn.
 * rb_sampler_get_candidates masks too but does not advance. Errors:
 * RB_E_INVALID_ARG when g's vocabulary size differs from the sampler's.
 */
RB_API rb_status rb_sampler_set_grammar(rb_sampler *s, rb_grammar *g);

/* ---- names of 0.1 ------------------------------------------------------ */

/* The 0.1 names of renamed functions, kept for source compatibility until
 * 0.3; define REBOUND_NO_COMPAT to leave them out. (rb_sampler_sample and
 * rb_sampler_candidates changed their signature: they return an rb_status
 * now.) */
#ifndef REBOUND_NO_COMPAT
#define rb_model_meta_str rb_model_get_meta_str
#define rb_model_layer_bytes rb_model_get_layer_bytes
#define rb_model_tensor_info rb_model_get_tensor_info
#define rb_session_logits rb_session_get_logits
#define rb_session_tokens rb_session_get_tokens
#define rb_sampler_state_get rb_sampler_get_state
#define rb_sampler_state_set rb_sampler_set_state
#endif

/* ---- CPU ---------------------------------------------------------------- */

/* What this process computes with: the CPU (brand, the features found), the
 * kernel tier in use and the best one here, and per weight type the kernel
 * set its matrix products run (one build per architecture picks them at
 * run time; the environment variable REBOUND_CPU=ref|avx2|vnni|avx512|
 * neon|dotprod|i8mm caps the tier, read once at the first use). Lines of text
 * "key: value", NUL-terminated, cut to size; returns the length it needed.
 * Any thread. */
RB_API size_t rb_cpu_describe(char *buf, size_t size);

#ifdef __cplusplus
}
#endif
#endif /* REBOUND_H */
