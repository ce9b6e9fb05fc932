/*
 * forward.h - the Llama-family forward pass (llama, qwen2, qwen3, gemma3).
 *
 * rb_forward binds a model's weights (checking every tensor's presence,
 * shape and type), owns the run state for batches of up to n_batch tokens
 * (allocated once, nothing per token), and computes logits for a batch of
 * tokens at consecutive positions, writing their K and V into a paged
 * rb_kvcache; or (rb_forward_multi) for the next tokens of several
 * sequences at once, each with its own cache and positions. It does not
 * sample, tokenize or decide residency.
 */
#ifndef RB_FORWARD_H
#define RB_FORWARD_H

#include <stdint.h>

#include "kvcache.h"
#include "model.h"
#include "ops.h"
#include "threadpool.h"

typedef struct rb_wmat {
    uint32_t type;           /* rb_type */
    const void *data;        /* n_rows rows of n_cols elements */
    int64_t n_rows, n_cols;  /* n_cols = the GGUF dims[0] */
} rb_wmat;

typedef struct rb_layer_weights {
    const float *attn_norm;  /* [n_embd] */
    rb_wmat wq, wk, wv;      /* [q_dim x n_embd], [kv_dim x n_embd] x 2 */
    const float *bq, *bk, *bv; /* qwen2 biases [q_dim], [kv_dim]; or NULL */
    const float *q_norm, *k_norm; /* qwen3, gemma3 per-head norms [head_dim]; or NULL */
    rb_wmat wo;              /* [n_embd x q_dim] */
    const float *attn_post_norm; /* gemma3 [n_embd]: on the attention's output; or NULL */
    const float *ffn_norm;   /* [n_embd] */
    rb_wmat w_gate, w_up;    /* [n_ff x n_embd] */
    rb_wmat w_down;          /* [n_embd x n_ff] */
    const float *ffn_post_norm; /* gemma3 [n_embd]: on the FFN's output; or NULL */
    uint32_t window;         /* sliding window in positions (rotated by
                                rope_swa); 0: attends to all (rope) */
} rb_layer_weights;

typedef struct rb_forward {
    rb_hparams hp;
    uint32_t q_dim, kv_dim;  /* n_head * head_dim, n_head_kv * head_dim */
    uint32_t n_batch, n_ctx;
    rb_rope rope;
    rb_rope rope_swa;        /* sliding-window layers (gemma3: their own base) */
    float embd_scale;        /* embedding rows multiplied by it (gemma3 sqrt(n_embd)); 1 */
    float q_scale;           /* Q multiplied by it before attention (gemma3); 1 */
    float kq_scale;          /* the scores multiplied by it: 1/sqrt(head_dim); 1 (gemma3) */
    int is_geglu;            /* FFN gelu(gate) * up (gemma3), else silu(gate) * up */

    /* weights (pointers into the model's data) */
    rb_wmat token_embd;      /* [n_vocab x n_embd] */
    const float *output_norm;
    rb_wmat output;          /* [n_vocab x n_embd] (token_embd when tied) */
    rb_layer_weights *layers;

    rb_threadpool *pool;     /* borrowed */
    /* asked before each layer is computed: nonzero stops the pass (the
       memory manager could not bring the layer back); called once more
       with layer == n_layers when the layers are done, before the output
       norm and matrix are read (nonzero stops the pass too); NULL: never
       asked */
    int (*layer_gate)(void *ctx, uint32_t layer);
    void *layer_gate_ctx;
    /* asked before the embedding rows of a batch's tokens are read
       (weight streaming fetches them); nonzero stops the pass; NULL: never */
    int (*rows_gate)(void *ctx, const int32_t *tokens, uint32_t n);
    void *rows_gate_ctx;
    size_t mem_bytes;        /* run state bytes (the scratch account),
                                whether held now or released */
    const rb_model_observer *obs; /* the model's; NULL: not observed */
    /* embeddings (rb_session_embed): when embd_rows is set, a pass of one
       sequence writes the output-normed hidden state of each position p in
       [embd_pos0, embd_pos0 + embd_n) to row p - embd_pos0 (a recomputed
       position overwrites its row: idempotent). NULL: off. */
    float *embd_rows;        /* [embd_n][n_embd] */
    uint32_t embd_pos0, embd_n;
    /* attention's arithmetic (attention.h): 0 (rb_forward_init's default):
       a query at a position >= RB_ATTN_EXACT_BELOW takes the tiled f32
       form, one below it the exact one-query form, however the tokens are
       batched; 1: always the exact form. Set between passes
       (rb_session_params.exact_attention). */
    int exact_attention;

    /* run state, one allocation; shapes per batch row t < n_batch */
    float *x;       /* [B][n_embd] residual stream */
    int32_t nonfinite_layer; /* the last batch: -1, or the first layer whose
                                output at the batch's last position held a
                                NaN or an infinity (n_layers: the logits) */
    float *xb;      /* [B][n_embd] normed input of a block */
    float *q;       /* [B][q_dim] */
    float *k;       /* [B][kv_dim] */
    float *v;       /* [B][kv_dim] */
    float *ao;      /* [B][q_dim] attention output */
    float *y;       /* [B][max(n_embd, ...)] a matmul's output before the residual add */
    float *hb;      /* [B][n_ff] gate, then silu(gate) * up */
    float *hb2;     /* [B][n_ff] up */
    uint8_t *act;   /* [B][max act row bytes] activations converted for a matmul */
    size_t act_stride;
    void *mem;
} rb_forward;

/*
 * Binds weights and allocates run state. The model's weights must be
 * loaded (rb_model_load_weights). Errors: RB_E_UNSUPPORTED (architecture,
 * tensor type, rope scaling), RB_E_FORMAT (missing tensor, wrong shape),
 * RB_E_NOMEM. The message names the architecture or tensor.
 */
rb_status rb_forward_init(rb_forward *f, const rb_model *model, uint32_t n_ctx,
                          uint32_t n_batch, rb_threadpool *pool, rb_error *err);
void rb_forward_deinit(rb_forward *f);
/* The run state (mem_bytes of activations) goes while the forward is idle
 * (a background session's) and comes back before its next pass:
 * rb_forward_ensure_run_state maps it again (RB_E_NOMEM); a pass needs it.
 * Only the forward's owner calls these, between passes. */
void rb_forward_release_run_state(rb_forward *f);
rb_status rb_forward_ensure_run_state(rb_forward *f, rb_error *err);

/* One head's K or V row of n floats into a cache row of type (f16, q8_0,
 * q4_0) as llama.cpp's copy into its cache converts it. */
void rb_forward_store_row(uint32_t type, const float *x, void *dst, uint32_t n);

/*
 * One sequence of a pass over several (rb_forward_multi): its own KV cache,
 * positions and gates. The caller fills the fields above `out`.
 */
typedef struct rb_forward_seq {
    rb_kvcache *kv;          /* its cache, pages reserved for pos0 + n */
    const int32_t *tokens;   /* n >= 1 tokens at positions pos0.. */
    uint32_t n, pos0;
    int all_logits;          /* logits of its n rows, else of its last one */
    /* as rb_forward's layer_gate / rows_gate, for this sequence; NULL:
       never asked */
    int (*layer_gate)(void *ctx, uint32_t layer);
    void *layer_gate_ctx;
    int (*rows_gate)(void *ctx, const int32_t *tokens, uint32_t n);
    void *rows_gate_ctx;
    /* out */
    int32_t nonfinite_layer; /* as rb_forward's nonfinite_layer, for its last row */
    uint32_t row0;           /* its first row of the run state (set by the pass) */
} rb_forward_seq;

/*
 * One forward pass over n_seqs sequences (the sum of their n <= n_batch):
 * every matrix product runs over the rows of all of them at once, so each
 * weight is read once per pass; attention runs each row over its own
 * sequence's cache. A sequence's logits and K/V are bit-identical to a pass
 * over it alone (the kernels compute each row by the same operations
 * whatever the number of rows: matmul_kernels.h). f's own gates are not
 * asked; before each layer every sequence's layer_gate is, in order, and
 * one nonzero answer stops the whole pass (returns -1; the logits and the
 * K/V of all sequences' positions are then unspecified). logits: the
 * rows of the sequences in order, all_logits ? n : 1 rows each, n_vocab
 * floats apart. The model's observer sees on_forward_begin once per
 * sequence, then the layers once.
 */
int rb_forward_multi(rb_forward *f, rb_forward_seq *seqs, uint32_t n_seqs, float *logits);

/*
 * Runs tokens[0..n) at positions pos0.. (n <= n_batch, pos0 + n <= n_ctx),
 * writing their K/V into kv (pages must be reserved). logits: when
 * all_logits, n rows of n_vocab floats; else one row (the last token's).
 * Returns 0, or -1 when the layer gate stopped the pass (logits and the
 * K/V of these positions are then unspecified).
 */
int rb_forward_batch(rb_forward *f, rb_kvcache *kv, const int32_t *tokens, uint32_t n,
                      uint32_t pos0, float *logits, int all_logits);
/* (rb_forward_batch also sets nonfinite_layer: a check of n_embd values per
 * layer and of the last logits row, nothing measurable beside the layer.) */

#endif
