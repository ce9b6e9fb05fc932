/*
 * rebound.h - the whole public API of librebound.
 *
 * rebound is an on-device LLM runtime whose reason to exist is memory: it
 * keeps a conversation usable while the operating system takes memory away,
 * and brings the model back fast when the user returns.
 *
 * Conventions (hold for every function below):
 *   - Functions return an rb_status; RB_OK (0) is success.
 *   - Objects are opaque handles with lifetime pairs _open/_close (bound to a
 *     file) or _create/_destroy.
 *   - On failure an object stays valid and out-parameters stay unchanged.
 *   - A failed call leaves a message on its handle (rb_model_errmsg). A call
 *     that has no handle yet (an _open) writes its message to an rb_error
 *     the caller passes (may be NULL).
 *   - The library never prints and never exits.
 *   - Thread rule: a handle may be used by one thread at a time; distinct
 *     handles are independent.
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
#define REBOUND_VERSION_MINOR 1
#define REBOUND_VERSION_PATCH 0

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

typedef struct rb_model_params {
    int use_mmap;          /* nonzero: map the file; zero: read by offset (pread) */
} rb_model_params;

/* Defaults: use_mmap = 0. */
RB_API rb_model_params rb_model_default_params(void);

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
 */
RB_API rb_status rb_model_open(const char *path, const rb_model_params *params,
                               rb_model **out, rb_error *err);

/* Releases everything the model owns. NULL is a no-op. */
RB_API void rb_model_close(rb_model *model);

/* The message of the last failed call on this handle ("" if none). Valid
 * until the next call on the handle. */
RB_API const char *rb_model_errmsg(const rb_model *model);

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
} rb_model_info;

RB_API rb_status rb_model_get_info(const rb_model *model, rb_model_info *out);

/* Bytes of the tensors of one layer (blk.<layer>.*). 0 when out of range. */
RB_API uint64_t rb_model_layer_bytes(const rb_model *model, uint32_t layer);

/* One tensor of the file's index, by position (0 .. n_tensors-1). */
typedef struct rb_tensor_info {
    const char *name;       /* lives as long as the model */
    const char *type_name;  /* "F32", "Q4_K", ... */
    uint32_t n_dims;
    uint64_t dims[4];       /* dims[0] is the row length (innermost) */
    uint64_t n_bytes;
    uint64_t file_offset;   /* absolute offset of the data in the file */
} rb_tensor_info;

RB_API rb_status rb_model_tensor_info(rb_model *model, uint64_t index,
                                      rb_tensor_info *out);

#ifdef __cplusplus
}
#endif
#endif /* REBOUND_H */
