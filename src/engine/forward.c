/*
 * forward.c - the forward pass of llama / qwen2 / qwen3 / gemma3 (contract
 * in forward.h). Reads like the equations, in data-flow order:
 *
 *   x = embed(tokens)                 (gemma3: times sqrt(n_embd))
 *   for each layer:
 *     xb = rmsnorm(x) * attn_norm
 *     q, k, v = Wq xb (+bq), Wk xb (+bk), Wv xb (+bv)
 *     q, k = rmsnorm per head * q_norm, k_norm          (qwen3, gemma3)
 *     q, k = rope(q, pos), rope(k, pos)                  (gemma3: sliding-window
 *                                                         layers at their own base)
 *     K[pos], V[pos] = k, v                              (f16, paged)
 *     ao = softmax(q K^T / sqrt(head_dim)) V             (causal, GQA; gemma3: q
 *                                                         pre-scaled, a window)
 *     x += Wo ao                        (gemma3: rmsnorm(Wo ao) * post_attention_norm)
 *     xb = rmsnorm(x) * ffn_norm
 *     x += Wdown (silu(Wgate xb) * Wup xb)
 *                                       (gemma3: gelu, then rmsnorm(.) * post_ffw_norm)
 *   logits = Wout (rmsnorm(x) * output_norm)  (tanh softcap when the file has one)
 *
 * Matrix products go through rb_matmul (threaded, quantized activations as
 * llama.cpp does); attention runs on the pool, one claimed task per KV
 * head and chunk of tokens (all the queries that read the same K and V).
 * Memory: the run state is one allocation sized at init for n_batch tokens
 * and n_ctx positions; nothing is allocated per token.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/mman.h>

#include "attention.h"
#include "forward.h"
#include "matmul.h"
#include "quant.h"
#include "os.h"
#include "status.h"

/* ---- binding weights ----------------------------------------------------- */

typedef struct binder {
    const rb_model *model;
    const rb_gguf *g;
    rb_error *err;
} binder;

static const rb_gguf_tensor *find(binder *b, const char *name, int required, rb_status *st)
{
    const rb_gguf_tensor *t = rb_gguf_find_tensor(b->g, name);
    if (!t && required && *st == RB_OK)
        *st = rb_error_set(b->err, RB_E_FORMAT, "model: tensor '%s' is missing", name);
    return t;
}

/* A 1-D F32 vector of n values (norms, biases); NULL when absent. */
static const float *bind_vec(binder *b, const char *name, int64_t n, int required,
                             rb_status *st)
{
    const rb_gguf_tensor *t = find(b, name, required, st);
    if (!t || *st != RB_OK)
        return NULL;
    if (t->type != RB_TYPE_F32 || t->n_elems != (uint64_t)n) {
        *st = rb_error_set(b->err, RB_E_FORMAT,
                           "model: tensor '%s' is %s with %" PRIu64 " elements; expected F32 with %" PRId64,
                           name, rb_type_name(t->type), t->n_elems, n);
        return NULL;
    }
    return rb_model_tensor_data(b->model, t);
}

static rb_wmat bind_mat(binder *b, const char *name, int64_t rows, int64_t cols, rb_status *st)
{
    rb_wmat m = {0};
    const rb_gguf_tensor *t = find(b, name, 1, st);
    if (!t || *st != RB_OK)
        return m;
    if (t->n_dims != 2 || t->dims[0] != (uint64_t)cols || t->dims[1] != (uint64_t)rows) {
        *st = rb_error_set(b->err, RB_E_FORMAT,
                           "model: tensor '%s' has dims %" PRIu64 " x %" PRIu64 "; expected %" PRId64
                           " x %" PRId64, name, t->dims[0], t->dims[1], cols, rows);
        return m;
    }
    if (!rb_matmul_supports(t->type) || !rb_type_get_traits(t->type)->dequantize_row) {
        *st = rb_error_set(b->err, RB_E_UNSUPPORTED,
                           "model: tensor '%s' has type %s, which rebound cannot compute with yet",
                           name, rb_type_name(t->type));
        return m;
    }
    m.type = t->type;
    m.data = rb_model_tensor_data(b->model, t);
    m.n_rows = rows;
    m.n_cols = cols;
    return m;
}

static rb_status bind_rope(rb_forward *f, binder *b)
{
    const rb_hparams *hp = &f->hp;
    int is_qwen = strcmp(hp->arch, "qwen2") == 0 || strcmp(hp->arch, "qwen3") == 0 ||
                  strcmp(hp->arch, "gemma3") == 0;
    f->rope.mode = is_qwen ? RB_ROPE_NEOX : RB_ROPE_NORM;
    f->rope.n_rot = (int)hp->n_rot;
    f->rope.freq_base = hp->rope_freq_base;
    f->rope.freq_scale = 1.0f;
    if (hp->n_rot % 2 != 0 || hp->n_rot > RB_ROPE_MAX_ROT)
        return rb_error_set(b->err, RB_E_UNSUPPORTED, "model: rope dims %" PRIu32
                            " must be even and at most 1024", hp->n_rot);
    char key[96];
    rb_gguf_str type;
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    if (rb_gguf_get_str(b->g, key, &type) == RB_OK && !rb_gguf_str_eq(type, "none")) {
        if (!rb_gguf_str_eq(type, "linear"))
            return rb_error_set(b->err, RB_E_UNSUPPORTED,
                                "model: rope scaling '%.*s' is not supported (none, linear)",
                                (int)(type.len > 32 ? 32 : type.len), type.ptr);
        float factor = 1.0f;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", hp->arch);
        if (rb_gguf_get_f32(b->g, key, &factor) == RB_OK && factor > 0.0f)
            f->rope.freq_scale = 1.0f / factor;
    }
    rb_status st = RB_OK;
    /* llama3's rope_freqs: per-dimension divisors of the angle */
    f->rope.freq_factors = bind_vec(b, "rope_freqs.weight", hp->n_rot / 2, 0, &st);
    /* sliding-window layers: their own base, no scaling (llama.cpp's
       rope_freq_scale_train_swa is 1) */
    f->rope_swa = f->rope;
    f->rope_swa.freq_base = hp->rope_freq_base_swa;
    f->rope_swa.freq_scale = 1.0f;
    return st;
}

static rb_status bind_weights(rb_forward *f, const rb_model *model, rb_error *err)
{
    const rb_hparams *hp = &f->hp;
    binder b = {model, rb_model_gguf(model), err};
    rb_status st = RB_OK;
    int64_t E = hp->n_embd, Q = f->q_dim, KV = f->kv_dim, F = hp->n_ff, V = hp->n_vocab;
    int is_qwen3 = strcmp(hp->arch, "qwen3") == 0, is_gemma3 = strcmp(hp->arch, "gemma3") == 0;
    f->token_embd = bind_mat(&b, "token_embd.weight", V, E, &st);
    f->output_norm = bind_vec(&b, "output_norm.weight", E, 1, &st);
    if (st == RB_OK)
        f->output = rb_gguf_find_tensor(b.g, "output.weight")
                        ? bind_mat(&b, "output.weight", V, E, &st) : f->token_embd;
    if (st == RB_OK)
        st = bind_rope(f, &b);
    for (uint32_t l = 0; l < hp->n_layers && st == RB_OK; l++) {
        rb_layer_weights *w = &f->layers[l];
        char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%" PRIu32 "." s, l), name)
        w->attn_norm = bind_vec(&b, NAME("attn_norm.weight"), E, 1, &st);
        w->wq = bind_mat(&b, NAME("attn_q.weight"), Q, E, &st);
        w->wk = bind_mat(&b, NAME("attn_k.weight"), KV, E, &st);
        w->wv = bind_mat(&b, NAME("attn_v.weight"), KV, E, &st);
        w->bq = bind_vec(&b, NAME("attn_q.bias"), Q, 0, &st);
        w->bk = bind_vec(&b, NAME("attn_k.bias"), KV, 0, &st);
        w->bv = bind_vec(&b, NAME("attn_v.bias"), KV, 0, &st);
        int qk_norm = is_qwen3 || is_gemma3;
        w->q_norm = bind_vec(&b, NAME("attn_q_norm.weight"), hp->head_dim_k, qk_norm, &st);
        w->k_norm = bind_vec(&b, NAME("attn_k_norm.weight"), hp->head_dim_k, qk_norm, &st);
        w->wo = bind_mat(&b, NAME("attn_output.weight"), E, Q, &st);
        w->ffn_norm = bind_vec(&b, NAME("ffn_norm.weight"), E, 1, &st);
        w->w_gate = bind_mat(&b, NAME("ffn_gate.weight"), F, E, &st);
        w->w_up = bind_mat(&b, NAME("ffn_up.weight"), F, E, &st);
        w->w_down = bind_mat(&b, NAME("ffn_down.weight"), E, F, &st);
        if (is_gemma3) {
            w->attn_post_norm = bind_vec(&b, NAME("post_attention_norm.weight"), E, 1, &st);
            w->ffn_post_norm = bind_vec(&b, NAME("post_ffw_norm.weight"), E, 1, &st);
        }
        w->window = rb_hparams_layer_is_swa(hp, l) ? hp->n_swa : 0;
#undef NAME
    }
    return st;
}

/* ---- init ---------------------------------------------------------------- */

static size_t max_act_bytes(const rb_forward *f)
{
    size_t m = 0;
    for (uint32_t l = 0; l < f->hp.n_layers; l++) {
        const rb_layer_weights *w = &f->layers[l];
        const rb_wmat *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up, &w->w_down};
        for (int i = 0; i < 7; i++) {
            size_t b = rb_matmul_act_row_bytes(mats[i]->type, mats[i]->n_cols);
            m = b > m ? b : m;
        }
    }
    size_t b = rb_matmul_act_row_bytes(f->output.type, f->output.n_cols);
    return b > m ? b : m;
}

enum { RUN_PIECES = 10 };
static size_t run_state_sizes(const rb_forward *f, size_t sizes[RUN_PIECES]);

rb_status rb_forward_init(rb_forward *f, const rb_model *model, uint32_t n_ctx,
                          uint32_t n_batch, rb_threadpool *pool, rb_error *err)
{
    memset(f, 0, sizeof *f);
    f->hp = *rb_model_hparams(model);
    const rb_hparams *hp = &f->hp;
    const int is_gemma3 = strcmp(hp->arch, "gemma3") == 0;
    if (strcmp(hp->arch, "llama") != 0 && strcmp(hp->arch, "qwen2") != 0 &&
        strcmp(hp->arch, "qwen3") != 0 && !is_gemma3)
        return rb_error_set(err, RB_E_UNSUPPORTED,
                            "model: architecture '%s' is not supported (llama, qwen2, qwen3, "
                            "gemma3)", hp->arch);
    if (hp->n_ff == 0 || hp->n_vocab == 0 || hp->head_dim_k != hp->head_dim_v)
        return rb_error_set(err, RB_E_FORMAT,
                            "model: feed_forward_length %" PRIu32 ", vocab %" PRIu32
                            ", key/value head dims %" PRIu32 "/%" PRIu32 " are not usable",
                            hp->n_ff, hp->n_vocab, hp->head_dim_k, hp->head_dim_v);
    if (hp->head_dim_k > 1024)
        return rb_error_set(err, RB_E_UNSUPPORTED, "model: head dim %" PRIu32 " above 1024",
                            hp->head_dim_k);
    if (n_batch == 0 || n_ctx == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "forward: n_batch and n_ctx must be > 0");
    f->q_dim = hp->n_head * hp->head_dim_k;
    /* gemma3: embeddings times sqrt(n_embd); Q scaled before attention
       and the scores not again (llama.cpp's kq_scale 1) */
    f->embd_scale = is_gemma3 ? sqrtf((float)hp->n_embd) : 1.0f;
    f->q_scale = hp->attn_scale > 0.0f ? hp->attn_scale : 1.0f;
    f->kq_scale = hp->attn_scale > 0.0f ? 1.0f : 1.0f / sqrtf((float)hp->head_dim_k);
    f->is_geglu = is_gemma3;
    f->kv_dim = hp->n_head_kv * hp->head_dim_k;
    f->n_batch = n_batch;
    f->n_ctx = n_ctx;
    f->pool = pool;
    f->obs = rb_model_get_observer(model);
    f->layers = calloc(hp->n_layers, sizeof *f->layers);
    if (!f->layers)
        return rb_error_set(err, RB_E_NOMEM, "forward: out of memory");
    rb_status st = bind_weights(f, model, err);
    if (st != RB_OK) {
        rb_forward_deinit(f);
        return st;
    }
    f->act_stride = (max_act_bytes(f) + 63) / 64 * 64;
    size_t sizes[RUN_PIECES];
    f->mem_bytes = run_state_sizes(f, sizes);
    if ((st = rb_forward_ensure_run_state(f, err)) != RB_OK) {
        rb_forward_deinit(f);
        return st;
    }
    return RB_OK;
}

void rb_forward_deinit(rb_forward *f)
{
    free(f->layers);
    rb_forward_release_run_state(f);
    memset(f, 0, sizeof *f);
}

/* The run state's pieces (every one 64-byte aligned in one block): their
 * sizes, and the block's. */
static size_t run_state_sizes(const rb_forward *f, size_t sizes[RUN_PIECES])
{
    const size_t B = f->n_batch, E = f->hp.n_embd, Q = f->q_dim, KV = f->kv_dim, F = f->hp.n_ff;
    const size_t s[RUN_PIECES] = {B * E * 4, B * E * 4, B * Q * 4, B * KV * 4, B * KV * 4,
                                  B * Q * 4, B * E * 4, B * F * 4, B * F * 4, B * f->act_stride};
    size_t total = 0;
    for (size_t i = 0; i < RUN_PIECES; i++) {
        sizes[i] = (s[i] + 63) / 64 * 64;
        total += sizes[i];
    }
    return total;
}

/* A mapping of its own (not the heap): released, its pages leave the
 * process at once. */
rb_status rb_forward_ensure_run_state(rb_forward *f, rb_error *err)
{
    if (f->mem)
        return RB_OK;
    size_t sizes[RUN_PIECES];
    const size_t total = run_state_sizes(f, sizes);
    void *mem = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return rb_error_set(err, RB_E_NOMEM, "forward: out of memory for %zu bytes of run state",
                            total);
    f->mem = mem;
    uint8_t *p = mem;
    void **slots[RUN_PIECES] = {(void **)&f->x,  (void **)&f->xb, (void **)&f->q,
                                (void **)&f->k,  (void **)&f->v,  (void **)&f->ao,
                                (void **)&f->y,  (void **)&f->hb, (void **)&f->hb2,
                                (void **)&f->act};
    for (size_t i = 0; i < RUN_PIECES; i++) {
        *slots[i] = p;
        p += sizes[i];
    }
    return RB_OK;
}

void rb_forward_release_run_state(rb_forward *f)
{
    if (!f->mem)
        return;
    munmap(f->mem, f->mem_bytes);
    f->mem = NULL;
    f->x = f->xb = f->q = f->k = f->v = f->ao = f->y = f->hb = f->hb2 = NULL;
    f->act = NULL;
}

/* ---- the pass ------------------------------------------------------------ */

/*
 * y_i[t] = W_i x[t] for k matrices that read the same input (Q, K, V; gate,
 * up), n tokens, x rows x_stride floats apart. The input is converted for
 * the matrices' activation type once, and again only when a matrix needs
 * another type (Q4_K_M mixes Q4_K and Q6_K, which share Q8_K; a fallback
 * Q5_0 needs Q8_0).
 */
static void matmuls(rb_forward *f, const rb_wmat *const *w, float *const *y,
                    const int64_t *y_stride, int k, const float *x, int64_t x_stride,
                    uint32_t n)
{
    uint32_t converted = UINT32_MAX; /* activation type in f->act */
    for (int i = 0; i < k; i++) {
        uint32_t at = rb_matmul_act_type(w[i]->type);
        if (at != converted) {
            for (uint32_t t = 0; t < n; t++)
                rb_matmul_quantize_act(w[i]->type, x + t * x_stride, f->act + t * f->act_stride,
                                       w[i]->n_cols);
            converted = at;
        }
        rb_matmul(f->pool, w[i]->type, w[i]->data, w[i]->n_rows, w[i]->n_cols, f->act,
                  f->act_stride, n, y[i], y_stride[i]);
    }
}

static void matmul(rb_forward *f, const rb_wmat *w, const float *x, int64_t x_stride,
                   uint32_t n, float *y, int64_t y_stride)
{
    matmuls(f, &w, &y, &y_stride, 1, x, x_stride, n);
}

typedef struct attn_job {
    rb_forward *f;
    const rb_forward_seq *seqs; /* each its own KV cache, positions and rows */
    uint32_t n_seqs, layer;
    uint32_t chunk;         /* tokens per task */
    uint32_t heads;         /* query heads of a KV head's group per task */
    uint32_t n_splits;      /* tasks a group is split into (heads > the cap) */
    _Atomic uint32_t next;  /* next (sequence, KV head, token chunk, heads) task */
    int tiled;              /* tasks are tiles of the f32 form (attend_tiled) */
} attn_job;

/* Queries one task keeps in flight (attention.h's limits): a task is a KV
 * head and a chunk of tokens, all the queries that read the same K and V
 * rows (rb_attn_f16 walks them once for all of them). */
#define ATTN_MAX_QUERIES RB_ATTN_MAX_QUERIES
#define ATTN_ACC_HALVES RB_ATTN_ACC_HALVES

static uint32_t attn_queries_per_task(const rb_hparams *hp)
{
    uint32_t cap = ATTN_ACC_HALVES / hp->head_dim_k;
    return cap < ATTN_MAX_QUERIES ? cap : ATTN_MAX_QUERIES;
}

typedef struct attn_query {
    const float *q;
    float *out;
    uint32_t first;    /* the first position it attends to (sliding window) */
    uint32_t last;     /* the last position it attends to (causal) */
    float m, sum;
} attn_query;

/* The queries of heads g0..g1 of KV head kvh's group for tokens t0..t1 of
 * sq (token-major), their spans: positions 0..pos0+t, in a sliding-window
 * layer the last `window` of them. Returns how many. */
static uint32_t fill_queries(const attn_job *j, const rb_forward_seq *sq, uint32_t kvh,
                             uint32_t g0, uint32_t g1, uint32_t t0, uint32_t t1,
                             rb_attn_query *qs)
{
    const rb_forward *f = j->f;
    const uint32_t hd = f->hp.head_dim_k, group = f->hp.n_head / f->hp.n_head_kv;
    const uint32_t window = f->layers[j->layer].window;
    uint32_t nq = 0;
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t g = g0; g < g1; g++, nq++) {
            const uint32_t h = kvh * group + g;
            rb_attn_query *a = &qs[nq];
            a->q = f->q + (size_t)(sq->row0 + t) * f->q_dim + (size_t)h * hd;
            a->out = f->ao + (size_t)(sq->row0 + t) * f->q_dim + (size_t)h * hd;
            a->last = sq->pos0 + t;
            a->first = window && a->last >= window ? a->last - window + 1 : 0;
        }
    return nq;
}

/* Every query of one KV head over a chunk of tokens: causal attention over
 * positions 0..pos0+t (in a sliding-window layer the last `window` of
 * them), llama.cpp's CPU flash attention (attention.h). No page before the
 * earliest query's window is touched (such pages may have been freed). */
static void attend(attn_job *j, const rb_forward_seq *sq, uint32_t kvh, uint32_t g0,
                   uint32_t g1, uint32_t t0, uint32_t t1)
{
    rb_forward *f = j->f;
    rb_attn_query qs[ATTN_MAX_QUERIES];
    const uint32_t nq = fill_queries(j, sq, kvh, g0, g1, t0, t1, qs);
    rb_attn_f16(sq->kv, j->layer, kvh, f->kq_scale, qs, nq);
}

static void attend_quant(attn_job *j, const rb_forward_seq *sq, uint32_t kvh, uint32_t g0,
                         uint32_t g1, uint32_t t0, uint32_t t1);

/* K and V both f16: the exact form is attend(), else attend_quant() */
static int is_f16_kv(const rb_kvcache *kv)
{
    return kv->type_k == RB_TYPE_F16 && kv->type_v == RB_TYPE_F16;
}

/* The caches the tiled form takes (rb_attn_kv_tiled): K and V each f16,
 * q8_0 or q4_0 (every type a cache holds) */
static int tiled_kv(const rb_kvcache *kv)
{
    const uint32_t t[2] = {kv->type_k, kv->type_v};
    for (int i = 0; i < 2; i++)
        if (t[i] != RB_TYPE_F16 && t[i] != RB_TYPE_Q8_0 && t[i] != RB_TYPE_Q4_0)
            return 0;
    return 1;
}

/* The first token of sq (its index in the pass) that takes the tiled
 * form: the first at a position >= RB_ATTN_EXACT_BELOW (attention.h), or
 * sq->n when none does or exact_attention is set. The rule is by position,
 * so a sequence's bits do not depend on how it was batched. */
static uint32_t first_tiled(const rb_forward *f, const rb_forward_seq *sq)
{
    if (f->exact_attention || !tiled_kv(sq->kv))
        return sq->n;
    if (sq->pos0 >= RB_ATTN_EXACT_BELOW)
        return 0;
    return RB_ATTN_EXACT_BELOW - sq->pos0 < sq->n ? RB_ATTN_EXACT_BELOW - sq->pos0 : sq->n;
}

/* Splits a task of the tiled job's size (up to RB_ATTN_TILE_Q queries) into
 * calls of the exact form's size (attn_queries_per_task): for a sequence of the job
 * that is not tiled. The exact form's bits do not depend on how queries
 * are grouped. */
static void attend_exact(attn_job *j, const rb_forward_seq *sq, uint32_t kvh, uint32_t g0,
                         uint32_t g1, uint32_t t0, uint32_t t1,
                         void (*fn)(attn_job *, const rb_forward_seq *, uint32_t, uint32_t,
                                    uint32_t, uint32_t, uint32_t))
{
    const uint32_t nh = g1 - g0, cap = attn_queries_per_task(&j->f->hp);
    if (nh >= cap) {
        for (uint32_t t = t0; t < t1; t++)
            for (uint32_t g = g0; g < g1; g += cap)
                fn(j, sq, kvh, g, g + cap < g1 ? g + cap : g1, t, t + 1);
        return;
    }
    const uint32_t step = cap / nh;
    for (uint32_t t = t0; t < t1; t += step)
        fn(j, sq, kvh, g0, g1, t, t + step < t1 ? t + step : t1);
}

/* attend() in the tiled f32 form: the task's queries are one tile
 * (rb_attn_kv_tiled), in the worker's scratch slot. No scratch (out of
 * memory): the exact form, which needs none. */
static void attend_tiled(attn_job *j, const rb_forward_seq *sq, uint32_t kvh, uint32_t g0,
                         uint32_t g1, uint32_t t0, uint32_t t1, int ith)
{
    rb_forward *f = j->f;
    const uint32_t hd = f->hp.head_dim_k;
    float *work = rb_threadpool_scratch(f->pool, ith,
                                        RB_ATTN_TILED_WORK_FLOATS(hd) * sizeof(float));
    if (!work) {
        attend_exact(j, sq, kvh, g0, g1, t0, t1, is_f16_kv(sq->kv) ? attend : attend_quant);
        return;
    }
    rb_attn_query qs[RB_ATTN_TILE_Q];
    const uint32_t nq = fill_queries(j, sq, kvh, g0, g1, t0, t1, qs);
    rb_attn_kv_tiled(sq->kv, j->layer, kvh, f->kq_scale, qs, nq, work);
}

/* A quantized K or V (llama.cpp's flash attention with such a cache): q
 * quantized to q8_0 for a quantized K (else rounded to f16), each V row
 * dequantized and summed in f32 (an f16 V in the f16 accumulator), online
 * softmax over the window. As attend() does, the positions are the outer
 * loop, so that a K row is read and a V row dequantized once for all the
 * task's queries; each query sees its positions in order (the same bits as
 * one query at a time). */
static void attend_quant(attn_job *j, const rb_forward_seq *sq, uint32_t kvh, uint32_t g0,
                         uint32_t g1, uint32_t t0, uint32_t t1)
{
    rb_forward *f = j->f;
    const rb_kvcache *kv = sq->kv;
    const uint32_t hd = f->hp.head_dim_k, group = f->hp.n_head / f->hp.n_head_kv;
    const uint32_t window = f->layers[j->layer].window;
    const int k_f16 = kv->type_k == RB_TYPE_F16, v_f16 = kv->type_v == RB_TYPE_F16;
    rb_f16 qh[ATTN_ACC_HALVES], acc16[ATTN_ACC_HALVES];
    rb_block_q8_0 qq[ATTN_ACC_HALVES / RB_QK8_0];
    float acc[ATTN_ACC_HALVES], vrow[1024];
    attn_query qs[ATTN_MAX_QUERIES];
    const rb_dequantize_row_fn v_to_float = rb_type_get_traits(kv->type_v)->dequantize_row;
    const uint32_t nb = hd / RB_QK8_0; /* q8_0 blocks of a query row */
    uint32_t nq = 0;
    for (uint32_t t = t0; t < t1; t++)
        for (uint32_t g = g0; g < g1; g++, nq++) {
            const uint32_t h = kvh * group + g;
            attn_query *a = &qs[nq];
            a->q = f->q + (size_t)(sq->row0 + t) * f->q_dim + (size_t)h * hd;
            a->out = f->ao + (size_t)(sq->row0 + t) * f->q_dim + (size_t)h * hd;
            a->last = sq->pos0 + t;
            a->first = window && a->last >= window ? a->last - window + 1 : 0;
            a->m = -INFINITY;
            a->sum = 0.0f;
            if (k_f16) /* the tier's F16C/FCVTN rounding: rb_fp32_to_fp16's bits */
                rb_matmul_quantize_act(RB_TYPE_F16, a->q, qh + nq * hd, hd);
            else
                rb_matmul_quantize_act(RB_TYPE_Q8_0, a->q, qq + nq * nb, hd);
        }
    if (v_f16)
        memset(acc16, 0, (size_t)nq * hd * sizeof *acc16);
    else
        memset(acc, 0, (size_t)nq * hd * sizeof *acc);
    const uint32_t start = nq ? qs[0].first : 0, end = sq->pos0 + t1;
    for (uint32_t p = start; p < end; p++) {
        const void *krow = rb_kvcache_k_row(kv, j->layer, kvh, p);
        const void *vr = rb_kvcache_v_row(kv, j->layer, kvh, p);
        int have_v = 0;
        for (uint32_t qi = 0; qi < nq; qi++) {
            attn_query *a = &qs[qi];
            if (p > a->last || p < a->first)
                continue;
            float s = k_f16 ? rb_attn_dot_f16(qh + qi * hd, krow, (int)hd)
                      : kv->type_k == RB_TYPE_Q8_0 ? rb_attn_dot_q8_0(krow, qq + qi * nb, (int)hd)
                                                   : rb_attn_dot_q4_0(krow, qq + qi * nb, (int)hd);
            s *= f->kq_scale;
            float ms = 1.0f, vs = 1.0f;
            if (s > a->m) {
                const float m_old = a->m;
                a->m = s;
                ms = expf(m_old - a->m);
                if (v_f16)
                    rb_attn_scale_f16(acc16 + qi * hd, ms, (int)hd);
                else
                    rb_attn_scale_f32(acc + qi * hd, ms, (int)hd);
            } else {
                vs = expf(s - a->m);
            }
            if (v_f16) {
                rb_attn_mad_f16(acc16 + qi * hd, vr, vs, (int)hd);
            } else {
                if (!have_v)
                    v_to_float(vr, vrow, hd), have_v = 1;
                rb_attn_mad_f32(acc + qi * hd, vrow, vs, (int)hd);
            }
            a->sum = fmaf(a->sum, ms, vs);
        }
    }
    for (uint32_t qi = 0; qi < nq; qi++) {
        const float inv = 1.0f / qs[qi].sum;
        for (uint32_t i = 0; i < hd; i++)
            qs[qi].out[i] = (v_f16 ? rb_fp16_to_fp32(acc16[qi * hd + i]) : acc[qi * hd + i]) * inv;
    }
}

static void attn_worker(void *ctx, int ith, int nth)
{
    attn_job *j = ctx;
    const uint32_t n_kv = j->f->hp.n_head_kv, group = j->f->hp.n_head / n_kv;
    const uint32_t per_chunk = n_kv * j->n_splits;
    (void)nth;
    /* relaxed: the task index is the only thing shared, results go to
       disjoint rows, and the pool's job barrier orders them for the caller.
       Tasks are numbered sequence by sequence; within one, the last chunks
       (the longest causal spans) are claimed first. */
    for (uint32_t task = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);;
         task = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) {
        const rb_forward_seq *sq = j->seqs;
        uint32_t n_chunks = (sq->n + j->chunk - 1) / j->chunk;
        for (uint32_t i = 1; task >= n_chunks * per_chunk && i < j->n_seqs; i++) {
            task -= n_chunks * per_chunk;
            sq = &j->seqs[i];
            n_chunks = (sq->n + j->chunk - 1) / j->chunk;
        }
        if (task >= n_chunks * per_chunk)
            return; /* past the last sequence's tasks */
        uint32_t c = n_chunks - 1 - task / per_chunk, t0 = c * j->chunk;
        uint32_t t1 = t0 + j->chunk < sq->n ? t0 + j->chunk : sq->n;
        uint32_t kvh = task % per_chunk / j->n_splits, g0 = task % j->n_splits * j->heads;
        uint32_t g1 = g0 + j->heads < group ? g0 + j->heads : group;
        const int f16 = is_f16_kv(sq->kv);
        if (j->tiled) {
            /* tokens below the rule's position: the exact form, in calls of
               its size; from it on, one tile */
            uint32_t ts = first_tiled(j->f, sq);
            ts = ts < t0 ? t0 : ts > t1 ? t1 : ts;
            if (ts > t0)
                attend_exact(j, sq, kvh, g0, g1, t0, ts, f16 ? attend : attend_quant);
            if (ts < t1)
                attend_tiled(j, sq, kvh, g0, g1, ts, t1, ith);
        } else if (f16) {
            attend(j, sq, kvh, g0, g1, t0, t1);
        } else {
            attend_quant(j, sq, kvh, g0, g1, t0, t1);
        }
    }
}

static void add_rows(float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += y[i];
}

static void add_bias(float *x, const float *b, uint32_t n_tok, uint32_t dim)
{
    if (!b)
        return;
    for (uint32_t t = 0; t < n_tok; t++)
        add_rows(x + (size_t)t * dim, b, dim);
}

/* One head's K or V row into the cache as llama.cpp's copy into its cache
 * converts it: f16 by rounding, q8_0 by the CPU quantizer its activations
 * use (rb_matmul_quantize_act, the same rounding), q4_0 by its reference
 * quantizer (ggml has no other for q4_0). */
void rb_forward_store_row(uint32_t type, const float *x, void *dst, uint32_t n)
{
    if (type == RB_TYPE_F16) {
        /* the tier's F16C/FCVTN rounding, rb_fp32_to_fp16's bits (the core
           files are built without F16C, where that is ~20 instructions) */
        rb_matmul_quantize_act(RB_TYPE_F16, x, dst, n);
    } else if (type == RB_TYPE_Q8_0) {
        rb_matmul_quantize_act(RB_TYPE_Q8_0, x, dst, n);
    } else {
        rb_type_get_traits(type)->quantize_row(x, dst, n);
    }
}

/* gemma3: y = rmsnorm(y) * w, a block's output normed before the residual add */
static void post_norm(rb_forward *f, const float *w, uint32_t n)
{
    const uint32_t E = f->hp.n_embd;
    if (!w)
        return;
    rb_rmsnorm_rows(f->y, f->y, w, E, n, E, f->hp.rms_eps);
}

/* The attention block of layer l over n rows of n_seqs sequences: every
 * row-wise step (norms, matrix products, rope, the K/V store) runs on all
 * rows at once, each row at its own sequence's position into its own KV
 * cache; each query attends over its own sequence's cache only. */
static void attention_block(rb_forward *f, const rb_forward_seq *seqs, uint32_t n_seqs,
                            uint32_t l, uint32_t n)
{
    const rb_hparams *hp = &f->hp;
    const rb_layer_weights *w = &f->layers[l];
    uint32_t E = hp->n_embd, hd = hp->head_dim_k;
    rb_rmsnorm_rows(f->xb, f->x, w->attn_norm, E, n, E, hp->rms_eps);
    const rb_wmat *qkv[] = {&w->wq, &w->wk, &w->wv};
    float *qkv_out[] = {f->q, f->k, f->v};
    const int64_t qkv_stride[] = {f->q_dim, f->kv_dim, f->kv_dim};
    matmuls(f, qkv, qkv_out, qkv_stride, 3, f->xb, E, n);
    add_bias(f->q, w->bq, n, f->q_dim);
    add_bias(f->k, w->bk, n, f->kv_dim);
    add_bias(f->v, w->bv, n, f->kv_dim);
    for (uint32_t t = 0, si = 0; t < n; t++) {
        while (t >= seqs[si].row0 + seqs[si].n)
            si++;
        rb_kvcache *kv = seqs[si].kv;
        const uint32_t pos = seqs[si].pos0 + (t - seqs[si].row0);
        float *q = f->q + (size_t)t * f->q_dim, *k = f->k + (size_t)t * f->kv_dim;
        if (w->q_norm) {
            rb_rmsnorm_rows(q, q, w->q_norm, hd, hp->n_head, hd, hp->rms_eps);
            rb_rmsnorm_rows(k, k, w->k_norm, hd, hp->n_head_kv, hd, hp->rms_eps);
        }
        const rb_rope *rope = w->window ? &f->rope_swa : &f->rope;
        float cos_t[RB_ROPE_MAX_ROT / 2], sin_t[RB_ROPE_MAX_ROT / 2];
        rb_rope_angles(rope, pos, cos_t, sin_t);
        rb_rope_rotate(rope, q, (int)hp->n_head, (int)hd, cos_t, sin_t);
        rb_rope_rotate(rope, k, (int)hp->n_head_kv, (int)hd, cos_t, sin_t);
        if (f->q_scale != 1.0f)
            for (uint32_t i = 0; i < f->q_dim; i++)
                q[i] *= f->q_scale;
        const float *v = f->v + (size_t)t * f->kv_dim;
        for (uint32_t h = 0; h < hp->n_head_kv; h++) {
            rb_forward_store_row(kv->type_k, k + h * hd, rb_kvcache_k_row(kv, l, h, pos), hd);
            rb_forward_store_row(kv->type_v, v + h * hd, rb_kvcache_v_row(kv, l, h, pos), hd);
        }
    }
    /* a task is a KV head's group (or part of it) over a chunk of tokens:
       one tile of the f32 form when a token of the pass takes it (the
       exact form's tokens of such a task are split into its calls), else
       one call of the exact form */
    int tiled = 0;
    for (uint32_t i = 0; i < n_seqs; i++)
        tiled |= first_tiled(f, &seqs[i]) < seqs[i].n;
    const uint32_t group = hp->n_head / hp->n_head_kv;
    const uint32_t cap = tiled ? RB_ATTN_TILE_Q : attn_queries_per_task(hp);
    const uint32_t heads = group < cap ? group : cap, chunk = group < cap ? cap / group : 1;
    attn_job job = {f, seqs, n_seqs, l, chunk, heads, (group + heads - 1) / heads, 0, tiled};
    rb_threadpool_run(f->pool, attn_worker, &job);
    matmul(f, &w->wo, f->ao, f->q_dim, n, f->y, E);
    post_norm(f, w->attn_post_norm, n);
    add_rows(f->x, f->y, (size_t)n * E);
}

static void ffn_block(rb_forward *f, uint32_t l, uint32_t n)
{
    const rb_hparams *hp = &f->hp;
    const rb_layer_weights *w = &f->layers[l];
    uint32_t E = hp->n_embd, F = hp->n_ff;
    rb_rmsnorm_rows(f->xb, f->x, w->ffn_norm, E, n, E, hp->rms_eps);
    const rb_wmat *gate_up[] = {&w->w_gate, &w->w_up};
    float *gate_up_out[] = {f->hb, f->hb2};
    const int64_t gate_up_stride[] = {F, F};
    matmuls(f, gate_up, gate_up_out, gate_up_stride, 2, f->xb, E, n);
    for (uint32_t t = 0; t < n; t++) {
        if (f->is_geglu)
            rb_geglu(f->hb + (size_t)t * F, f->hb2 + (size_t)t * F, F);
        else
            rb_swiglu(f->hb + (size_t)t * F, f->hb2 + (size_t)t * F, F);
    }
    matmul(f, &w->w_down, f->hb, F, n, f->y, E);
    post_norm(f, w->ffn_post_norm, n);
    add_rows(f->x, f->y, (size_t)n * E);
}

/* 1 when x[0..n) are all finite: x * 0 is 0 for a finite x and NaN for a
 * NaN or an infinity (no -ffast-math here: the product is not folded). */
static int is_finite_row(const float *x, uint32_t n)
{
    float acc = 0.0f;
    for (uint32_t i = 0; i < n; i++)
        acc += x[i] * 0.0f;
    return acc == acc;
}

int rb_forward_multi(rb_forward *f, rb_forward_seq *seqs, uint32_t n_seqs, float *logits)
{
    const rb_hparams *hp = &f->hp;
    const uint32_t E = hp->n_embd;
    const rb_type_traits *et = rb_type_get_traits(f->token_embd.type);
    const size_t row_bytes = rb_type_row_bytes(f->token_embd.type, E);
    uint32_t n = 0; /* rows of all sequences */
    for (uint32_t i = 0; i < n_seqs; i++) {
        seqs[i].row0 = n;
        seqs[i].nonfinite_layer = -1;
        n += seqs[i].n;
    }
    for (uint32_t i = 0; i < n_seqs; i++)
        if (seqs[i].rows_gate &&
            seqs[i].rows_gate(seqs[i].rows_gate_ctx, seqs[i].tokens, seqs[i].n) != 0)
            return -1;
    const rb_model_observer *obs = f->obs; /* the I/O analysis sees each sequence */
    if (obs && obs->on_forward_begin)
        for (uint32_t i = 0; i < n_seqs; i++)
            obs->on_forward_begin(obs->ctx, seqs[i].tokens, seqs[i].n, seqs[i].pos0);
    for (uint32_t i = 0; i < n_seqs; i++)
        for (uint32_t t = 0; t < seqs[i].n; t++) {
            float *x = f->x + (size_t)(seqs[i].row0 + t) * E;
            et->dequantize_row((const uint8_t *)f->token_embd.data +
                                   (size_t)seqs[i].tokens[t] * row_bytes, x, E);
            if (f->embd_scale != 1.0f)
                for (uint32_t c = 0; c < E; c++)
                    x[c] *= f->embd_scale;
        }
    for (uint32_t l = 0; l <= hp->n_layers; l++) {
        /* every sequence's gate before layer l (l == n_layers: the layers
           are done, before the output's weights); one "no" stops all */
        for (uint32_t i = 0; i < n_seqs; i++)
            if (seqs[i].layer_gate && seqs[i].layer_gate(seqs[i].layer_gate_ctx, l) != 0) {
                if (l < hp->n_layers && obs && obs->on_forward_end)
                    obs->on_forward_end(obs->ctx);
                return -1;
            }
        if (l == hp->n_layers)
            break;
        if (obs && obs->on_forward_layer)
            obs->on_forward_layer(obs->ctx, l);
        attention_block(f, seqs, n_seqs, l, n);
        ffn_block(f, l, n);
        for (uint32_t i = 0; i < n_seqs; i++)
            if (seqs[i].nonfinite_layer < 0 &&
                !is_finite_row(f->x + (size_t)(seqs[i].row0 + seqs[i].n - 1) * E, E))
                seqs[i].nonfinite_layer = (int32_t)l;
        if (l + 1 == hp->n_layers && obs && obs->on_forward_end)
            obs->on_forward_end(obs->ctx);
    }
    /* embeddings: the normed rows of the positions asked for */
    if (f->embd_rows && n_seqs == 1) {
        for (uint32_t t = 0; t < seqs[0].n; t++) {
            uint32_t p = seqs[0].pos0 + t;
            if (p >= f->embd_pos0 && p - f->embd_pos0 < f->embd_n)
                rb_rmsnorm(f->embd_rows + (size_t)(p - f->embd_pos0) * E,
                           f->x + (size_t)(seqs[0].row0 + t) * E, f->output_norm, E,
                           hp->rms_eps);
        }
    }
    /* the rows that give logits, packed: a sequence's all or its last */
    uint32_t m = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        const uint32_t first = seqs[i].all_logits ? 0 : seqs[i].n - 1;
        for (uint32_t t = first; t < seqs[i].n; t++, m++)
            rb_rmsnorm(f->xb + (size_t)m * E, f->x + (size_t)(seqs[i].row0 + t) * E,
                       f->output_norm, E, hp->rms_eps);
    }
    matmul(f, &f->output, f->xb, E, m, logits, hp->n_vocab);
    if (hp->final_logit_softcap > 0.0f)
        rb_softcap(logits, (int64_t)m * hp->n_vocab, hp->final_logit_softcap);
    m = 0;
    for (uint32_t i = 0; i < n_seqs; i++) {
        m += seqs[i].all_logits ? seqs[i].n : 1;
        if (seqs[i].nonfinite_layer < 0 &&
            !is_finite_row(logits + (size_t)(m - 1) * hp->n_vocab, hp->n_vocab))
            seqs[i].nonfinite_layer = (int32_t)hp->n_layers;
    }
    return 0;
}

int rb_forward_batch(rb_forward *f, rb_kvcache *kv, const int32_t *tokens, uint32_t n,
                     uint32_t pos0, float *logits, int all_logits)
{
    rb_forward_seq seq = {.kv = kv, .tokens = tokens, .n = n, .pos0 = pos0,
                          .all_logits = all_logits,
                          .layer_gate = f->layer_gate, .layer_gate_ctx = f->layer_gate_ctx,
                          .rows_gate = f->rows_gate, .rows_gate_ctx = f->rows_gate_ctx};
    f->nonfinite_layer = -1;
    int rc = rb_forward_multi(f, &seq, 1, logits);
    f->nonfinite_layer = seq.nonfinite_layer;
    return rc;
}
