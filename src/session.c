/*
 * session.c - the public rb_session: tokens, KV cache and forward state of
 * one conversation.
 *
 * Does: validate and append tokens, reserve KV pages as the context grows,
 * run the forward pass in batches. Does not: sample or tokenize (the caller
 * does, through the sampler and tokenizer APIs), or manage residency (the
 * residency manager will sit between the session and the KV cache).
 *
 * Memory: the token array (n_ctx entries), the KV page table and pages
 * (grown with the context), the forward run state, one logits row, the
 * thread pool. Invariant: tokens[0..n_tokens) are exactly the positions
 * whose K/V the cache holds.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward.h"
#include "kvcache.h"
#include "model.h"
#include "rebound.h"
#include "status.h"
#include "threadpool.h"

#define DEFAULT_BATCH 128

struct rb_session {
    rb_model *model;
    rb_threadpool *pool;
    rb_forward fwd;
    rb_kvcache kv;
    int32_t *tokens;        /* n_ctx entries */
    size_t n_tokens;
    float *logits;          /* n_vocab: the last token's */
    int has_logits;
    rb_error err;
};

rb_session_params rb_session_default_params(void)
{
    rb_session_params p;
    memset(&p, 0, sizeof p);
    p.n_batch = DEFAULT_BATCH;
    return p;
}

rb_status rb_session_create(rb_model *model, const rb_session_params *params,
                            rb_session **out, rb_error *err)
{
    if (!model || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model and out are required");
    rb_session_params p = params ? *params : rb_session_default_params();
    const rb_hparams *hp = rb_model_hparams(model);
    uint32_t n_ctx = p.n_ctx ? p.n_ctx : (hp->n_ctx_train ? hp->n_ctx_train : 4096);
    uint32_t n_batch = p.n_batch ? p.n_batch : DEFAULT_BATCH;
    if (n_batch > n_ctx)
        n_batch = n_ctx;
    int n_threads = p.n_threads;
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)n : 1;
    }
    if (n_ctx > (1u << 24))
        return rb_error_set(err, RB_E_INVALID_ARG, "session: n_ctx %" PRIu32 " is too large",
                            n_ctx);
    rb_session *s = calloc(1, sizeof *s);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "session: out of memory");
    s->model = model;
    rb_status st;
    if ((st = rb_model_load_weights(model)) != RB_OK) {
        rb_error_set(err, st, "%s", rb_model_errmsg(model));
        goto fail;
    }
    if ((st = rb_threadpool_create(n_threads, &s->pool, err)) != RB_OK)
        goto fail;
    if ((st = rb_forward_init(&s->fwd, model, n_ctx, n_batch, s->pool, err)) != RB_OK)
        goto fail;
    if ((st = rb_kvcache_init(&s->kv, hp->n_layers, hp->n_head_kv, hp->head_dim_k,
                              hp->head_dim_v, n_ctx, RB_KV_PAGE_TOKENS, err)) != RB_OK)
        goto fail;
    s->tokens = malloc((size_t)n_ctx * sizeof *s->tokens);
    s->logits = malloc((size_t)hp->n_vocab * sizeof *s->logits);
    if (!s->tokens || !s->logits) {
        st = rb_error_set(err, RB_E_NOMEM, "session: out of memory");
        goto fail;
    }
    *out = s;
    return RB_OK;
fail:
    rb_session_destroy(s);
    return st;
}

void rb_session_destroy(rb_session *s)
{
    if (!s)
        return;
    rb_forward_deinit(&s->fwd);
    rb_kvcache_deinit(&s->kv);
    rb_threadpool_destroy(s->pool);
    free(s->tokens);
    free(s->logits);
    free(s);
}

const char *rb_session_errmsg(const rb_session *s)
{
    return s && s->err.status ? s->err.message : "";
}

rb_status rb_session_feed(rb_session *s, const int32_t *tokens, size_t n, float *logits)
{
    const uint32_t n_vocab = s->fwd.hp.n_vocab;
    if (n == 0)
        return RB_OK;
    if (!tokens)
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: tokens is NULL");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= n_vocab)
            return rb_error_set(&s->err, RB_E_INVALID_ARG,
                                "session: token %zu is %" PRId32 ", outside the vocabulary of %"
                                PRIu32, i, tokens[i], n_vocab);
    if (n > s->kv.n_ctx - s->n_tokens)
        return rb_error_set(&s->err, RB_E_BUDGET,
                            "session: %zu more tokens exceed the context: %zu of %" PRIu32
                            " positions are used", n, s->n_tokens, s->kv.n_ctx);
    rb_status st = rb_kvcache_reserve(&s->kv, (uint32_t)(s->n_tokens + n), &s->err);
    if (st != RB_OK)
        return st;
    for (size_t done = 0; done < n;) {
        uint32_t m = (uint32_t)(n - done < s->fwd.n_batch ? n - done : s->fwd.n_batch);
        uint32_t pos = (uint32_t)(s->n_tokens + done);
        float *out = logits ? logits + done * n_vocab : NULL;
        if (out) {
            rb_forward_batch(&s->fwd, &s->kv, tokens + done, m, pos, out, 1);
            memcpy(s->logits, out + (size_t)(m - 1) * n_vocab, n_vocab * sizeof(float));
        } else {
            rb_forward_batch(&s->fwd, &s->kv, tokens + done, m, pos, s->logits, 0);
        }
        done += m;
    }
    memcpy(s->tokens + s->n_tokens, tokens, n * sizeof *tokens);
    s->n_tokens += n;
    s->has_logits = 1;
    return RB_OK;
}

const float *rb_session_logits(const rb_session *s)
{
    return s->has_logits ? s->logits : NULL;
}

size_t rb_session_n_tokens(const rb_session *s) { return s->n_tokens; }
const int32_t *rb_session_tokens(const rb_session *s) { return s->tokens; }
uint32_t rb_session_n_ctx(const rb_session *s) { return s->kv.n_ctx; }
uint32_t rb_session_n_vocab(const rb_session *s) { return s->fwd.hp.n_vocab; }
