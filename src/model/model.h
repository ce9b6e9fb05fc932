/*
 * model.h - a GGUF file seen as a model: the hyperparameters of its
 * architecture and the map from tensors to layers.
 *
 * Reads `<arch>.*` metadata keys (the names llama.cpp's loader uses) into
 * rb_hparams, with llama.cpp's defaults where a key is optional. Does not
 * check that rebound can *run* the architecture (the engine does); `rebound
 * info` can describe any GGUF model with the common keys.
 */
#ifndef RB_MODEL_H
#define RB_MODEL_H

#include <stdint.h>

#include "gguf.h"
#include "rebound.h"

#define RB_ARCH_NAME_MAX 64

typedef struct rb_hparams {
    char arch[RB_ARCH_NAME_MAX];
    uint32_t n_layers;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim_k;   /* <arch>.attention.key_length, default n_embd / n_head */
    uint32_t head_dim_v;   /* <arch>.attention.value_length, default head_dim_k */
    uint32_t n_ff;         /* 0 when the key is absent */
    uint32_t n_vocab;
    uint32_t n_ctx_train;
    uint32_t n_rot;        /* <arch>.rope.dimension_count, default head_dim_k */
    float rope_freq_base;  /* default 10000 */
    float rms_eps;         /* default 1e-5 */
    /* gemma3 (llama.cpp's defaults when a key is absent; 0 for others) */
    uint32_t n_swa;        /* attention.sliding_window; 0: every layer global */
    uint32_t swa_pattern;  /* attention.sliding_window_pattern, default 6: layer
                              l slides when l % pattern < pattern - 1 */
    float rope_freq_base_swa;  /* rope.freq_base_swa, default 10000 */
    float attn_scale;      /* Q multiplier before attention; 0: scores scaled
                              by 1/sqrt(head_dim) instead */
    float final_logit_softcap; /* final_logit_softcapping; 0: none */
} rb_hparams;

/* Layer l attends over a sliding window of hp->n_swa positions. */
int rb_hparams_layer_is_swa(const rb_hparams *hp, uint32_t l);

/*
 * Reads the hyperparameters. Errors: RB_E_UNSUPPORTED when a required key
 * (general.architecture, block_count, embedding_length, head_count) is
 * missing; RB_E_FORMAT when a key has the wrong type or an impossible value
 * (zero heads, head_count_kv not dividing head_count, ...). The message
 * names the key.
 */
rb_status rb_hparams_read(const rb_gguf *g, rb_hparams *hp, rb_error *err);

/* f16 K and V bytes per token over all layers. */
uint64_t rb_hparams_kv_bytes_per_token(const rb_hparams *hp);
/* ... and at n_tokens positions, sliding-window layers holding their window. */
uint64_t rb_hparams_kv_bytes(const rb_hparams *hp, uint64_t n_tokens);

/* Layer of a "blk.<N>." tensor name, or -1 for tensors outside layers. */
int64_t rb_tensor_layer(const char *name);

/*
 * The weight buffer: model.c owns its allocation (or private file mapping)
 * and its load, and records only what that load read (rb_weights_load).
 * After a lazy load, which of its bytes have been read since - each
 * layer, and the bytes outside the layers - is the weight cache's state
 * (memory/wcache.c), the one object that reads, releases and reloads them
 * for every session; nothing here tracks or changes it.
 */
typedef enum rb_weights_load {
    RB_WEIGHTS_NONE = 0,  /* no buffer: not loaded yet, or a mapped model */
    RB_WEIGHTS_READ,      /* every tensor read (rb_model_load_weights) */
    RB_WEIGHTS_LAZY,      /* nothing read: the weight cache reads the
                             layers (its restore) and the rest
                             (rb_wcache_read_rest) from storage */
    RB_WEIGHTS_RESERVED   /* nothing read and no one reads it on the cache's
                             behalf: reserved for weight streaming, given
                             back by a stream, or a load that failed */
} rb_weights_load;

/*
 * Makes every tensor's bytes addressable: with use_mmap the mapping already
 * is; otherwise the data section is read into one 64-byte aligned buffer
 * (a sequential read, like llama.cpp --no-mmap). Idempotent; over a buffer
 * loaded lazily or reserved it reads every tensor.
 * Errors: RB_E_NOMEM, RB_E_IO, RB_E_SHORT_READ (message on the model).
 */
rb_status rb_model_load_weights(rb_model *model);
/* The same without reading anything (RB_WEIGHTS_LAZY: the buffer's space
 * is reserved): a cold restore reads each layer while earlier layers
 * compute, and the bytes outside the layers beside them, through the
 * weight cache. Caller holds the model's lock (below). */
rb_status rb_model_load_weights_lazy(rb_model *model);
/* What the last load read (caller holds the model's lock while it may
 * change: a session's setup). */
rb_weights_load rb_model_weights_load(const rb_model *model);
/* The weight bytes read into the model's own buffer (0: not loaded, mapped
 * or reserved for streaming). */
uint64_t rb_model_loaded_bytes(const rb_model *model);
/* The weight buffer without reading anything (weight streaming reads
 * blocks on use: wcache_stream.h). A later rb_model_load_weights(_lazy)
 * reads what it needs. as_file_mapping: a private mapping of the file (a
 * cold restore without budgets: see rb_model_weights_file_mapped) where
 * the file system allows it; 0: allocated memory (a mapping made for an
 * earlier session that no session uses now is replaced). */
rb_status rb_model_reserve_weights(rb_model *model, int as_file_mapping);
/* The buffer's contents are no longer the file's (a streaming cache gave
 * its pages back): the next load reads every tensor again. */
void rb_model_set_weights_unread(rb_model *model);
/* Sessions register their use of the weight buffer: any number share it
 * as loaded, or any number stream from it through the one stream they
 * share (rb_model_weights_stream; it gives pages back); never both at
 * once. RB_E_INVALID_ARG, naming the conflict, when a claim mixes them. The caller holds the model's
 * lock (below) around the claim and the load that follows. */
rb_status rb_model_claim_weights(rb_model *model, int is_streaming, rb_error *err);
void rb_model_unclaim_weights(rb_model *model, int is_streaming);
/* Opened with use_mmap: the tensors are the file's mapping. */
int rb_model_is_mapped(const rb_model *model);
/* A model opened with use_mmap: drops the process's pages of the weights'
 * mapping (MADV_DONTNEED; they fault back from the file on use, so any
 * session may compute meanwhile) and returns the bytes it held (mincore).
 * 0 for any other model. */
uint64_t rb_model_drop_mapped_pages(rb_model *model);
/* Loaded lazily (a cold restore): the weight buffer is a private mapping of
 * the file, its pages the page cache's (the weight cache fills them with
 * rb_os_populate_read and gives them back with MADV_DONTNEED +
 * fadvise(DONTNEED)); 0 for an allocated buffer. */
int rb_model_weights_file_mapped(const rb_model *model);
/* RB_OK, or RB_E_IO naming the file when it was cut under that mapping
 * (the faulting pages read as zeros since: whatever was computed from
 * them is void). Call after a forward pass. Any thread. */
rb_status rb_model_check_mapping(const rb_model *model, rb_error *err);

/*
 * The model's lock. Sessions of one model may be created, opened and
 * destroyed from any threads: each holds this lock while it sets up or
 * gives up its use of the weight buffer (reserve, claim, load, the
 * weights' owner below), which happens once per session, never per token.
 */
void rb_model_lock(rb_model *model);
void rb_model_unlock(rb_model *model);
/*
 * The weights' owner: the one object of the memory manager that releases
 * and reloads the weight buffer's layers for every session of the model
 * (memory/wcache.h). The model keeps it until the model closes or the
 * buffer it works on goes (a mapping replaced, a streaming session that
 * owns the buffer alone), and then calls destroy. Caller holds the lock.
 */
void *rb_model_weights_owner(const rb_model *model);
void rb_model_set_weights_owner(rb_model *model, void *obj, void (*destroy)(void *));
/* The weight stream the model's streaming sessions share (an
 * rb_wcache_stream, memory/wcache_stream.h: it is created by the first
 * streaming session's join and destroyed by the last one's leave, which
 * set it here); NULL: none. Caller holds the lock. */
void *rb_model_weights_stream(const rb_model *model);
void rb_model_set_weights_stream(rb_model *model, void *stream);

/* Bytes of tensor t; NULL before rb_model_load_weights succeeded. */
const void *rb_model_tensor_data(const rb_model *model, const rb_gguf_tensor *t);

/* The model's tokenizer, built from its metadata on first use; the message
 * of a failure is on the model. Thread-safe (built under the
 * model's lock). */
struct rb_tokenizer;
rb_status rb_model_tokenizer(rb_model *model, const struct rb_tokenizer **out);

/*
 * Observer: what an analysis tool sees of a model without the engine
 * knowing the tool (tools/analysis/trace.c records the weight I/O this
 * way). on_load: the weights are about to be loaded; on_read: the model
 * read [file_offset, +n_bytes) of its file (the header read at open is not
 * reported: the observer adds it when it attaches). The forward pass of a
 * session created after this call reports each batch: on_forward_begin
 * (the batch's tokens), on_forward_layer before each layer, on_forward_end
 * after the last (or when a gate stops the pass). Callbacks run on the
 * thread that loads or computes, never concurrently for one model; NULL
 * members are skipped. An observed model loads by reading, never by
 * mapping, so that every read is seen. The struct is copied; NULL
 * detaches. Set it before the weights are loaded and before sessions exist.
 */
typedef struct rb_model_observer {
    void *ctx;
    void (*on_load)(void *ctx);
    void (*on_read)(void *ctx, uint64_t file_offset, uint64_t n_bytes);
    void (*on_forward_begin)(void *ctx, const int32_t *tokens, uint32_t n, uint32_t pos0);
    void (*on_forward_layer)(void *ctx, uint32_t layer);
    void (*on_forward_end)(void *ctx);
} rb_model_observer;

void rb_model_set_observer(rb_model *model, const rb_model_observer *obs);
/* The observer set, or NULL when none. Valid until the next set. */
const rb_model_observer *rb_model_get_observer(const rb_model *model);

/* The model's message slot, for modules that report through it. */
rb_error *rb_model_error(rb_model *model);
/* Copies e into the model's message under its lock: for the calls that
 * may run on several threads at once (rb_model_tokenize). */
void rb_model_set_error(rb_model *model, const rb_error *e);

/* Internal access for modules that hold an rb_model. */
const rb_gguf *rb_model_gguf(const rb_model *model);
/* The path the model was opened with. */
const char *rb_model_path(const rb_model *model);
const rb_hparams *rb_model_hparams(const rb_model *model);

#endif /* RB_MODEL_H */
