/*
 * session.c - the public rb_session: tokens, KV cache and forward state of
 * one conversation.
 *
 * Does: validate and append tokens, reserve KV pages as the context grows,
 * run the forward pass in batches, and around each feed let the memory
 * wiring (session_memory.h) bring back what a trim evicted; the public
 * calls on memory (trim, stats, restore mode) and on the session file
 * (save, open, unbind, blob), which it hands to the memory wiring and the
 * file binding (session_file.h). The top of src/session/: those two never
 * call back. Does not: sample or tokenize (the caller does, through the
 * sampler and tokenizer APIs), or decide what to evict.
 *
 * Messages: s->err belongs to the thread using the session. A trim may
 * come from any thread (rb_session_trim): its failure's message goes to a
 * per-thread slot (tl_trim below) that rb_session_errmsg returns on that
 * thread only, until that thread's next call that takes the session; a
 * trim posted by the pool is counted in the memory wiring (trim_note).
 *
 * Memory: the token array (n_ctx entries), the KV page table and pages
 * (grown with the context), the forward run state, one logits row, the
 * thread pool, the memory manager. Invariant: tokens[0..n_tokens) are
 * exactly the positions whose K/V the cache holds, in some tier; a
 * position whose K/V was dropped or damaged is recomputed from its token
 * before anything reads it. A fork (rb_session_fork) holds its source's
 * full prefix pages as shared pages (kvcache.h): writes start at
 * n_kv_valid, and a rewind whose n_kv_valid falls inside a shared page
 * makes that page the session's own first.
 */
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "forward.h"
#include "gguf.h"
#include "kvcache.h"
#include "model.h"
#include "pool.h"
#include "rebound.h"
#include "session_debug.h"
#include "session_internal.h"
#include "status.h"
#include "threadpool.h"
#include "throttle.h"

#define DEFAULT_BATCH 128

/* The last failed trim of this thread, for rb_session_errmsg on s. */
static _Thread_local struct {
    const rb_session *s;
    char message[RB_ERROR_MESSAGE_MAX];
} tl_trim;

void rb_session_enter(rb_session *s)
{
    if (tl_trim.s == s)
        tl_trim.s = NULL; /* a new call: its own message from now on */
    rb_session_memory_enter(&s->mem);
}

void rb_session_leave(rb_session *s) { rb_session_memory_leave(&s->mem); }

static const char *const kv_type_names[] = {"f16", "q8_0", "q4_0"};

const char *rb_kv_type_name(rb_kv_type t)
{
    return (unsigned)t <= RB_KV_Q4_0 ? kv_type_names[t] : "?";
}

int rb_kv_type_from_name(const char *name)
{
    for (int i = 0; name && i <= RB_KV_Q4_0; i++)
        if (strcmp(name, kv_type_names[i]) == 0)
            return i;
    return -1;
}

static uint32_t kv_type(rb_kv_type t)
{
    return t == RB_KV_Q8_0 ? RB_TYPE_Q8_0 : t == RB_KV_Q4_0 ? RB_TYPE_Q4_0 : RB_TYPE_F16;
}

static rb_session_params session_defaults(void)
{
    rb_session_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.n_batch = DEFAULT_BATCH;
    return p;
}

void rb_session_params_init(rb_session_params *params, size_t struct_size)
{
    rb_session_params d = session_defaults();
    rb_params_init(params, struct_size, &d, sizeof d);
}

rb_experimental_params rb_experimental_default_params(void)
{
    rb_experimental_params x;
    memset(&x, 0, sizeof x);
    return x;
}

static rb_status create_impl(rb_model *model, const rb_session_params *params,
                             int is_lazy_weights, rb_session **out, rb_error *err);

rb_status rb_session_create(rb_model *model, const rb_session_params *params,
                            rb_session **out, rb_error *err)
{
    rb_status st = create_impl(model, params, 0, out, err);
    if (st == RB_OK)
        rb_session_leave(*out); /* held since it was made: the pool may trim it now */
    return st;
}

static rb_status create_impl(rb_model *model, const rb_session_params *params,
                             int is_lazy_weights, rb_session **out, rb_error *err)
{
    if (!model || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model and out are required");
    rb_session_params p = session_defaults();
    if (params) {
        rb_status pst = rb_params_copy(&p, sizeof p, params, "rb_session_params", err);
        if (pst != RB_OK)
            return pst;
    }
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
    if (p.pool && p.budget_bytes)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: a session in a pool has no budget "
                            "of its own (the pool holds it): budget_bytes must be 0");
    if (p.exact_attention != 0 && p.exact_attention != 1)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: exact_attention %d is not 0 "
                            "(tiled f32 from position 256) or 1 (always exact)", p.exact_attention);
    const uint32_t page_tokens = p.kv_page_tokens ? p.kv_page_tokens : RB_KV_PAGE_TOKENS;
    if (page_tokens % 32 || page_tokens > 1024)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: kv_page_tokens %" PRIu32 " is not "
                            "0 (256) or a multiple of 32 from 32 to 1024", p.kv_page_tokens);
    if ((unsigned)p.priority > RB_PRIORITY_BACKGROUND)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: priority %d is not foreground or "
                            "background", (int)p.priority);
    rb_session *s = calloc(1, sizeof *s);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "session: out of memory");
    s->model = model;
    s->params = p;
    s->exp = p.experimental ? *p.experimental : rb_experimental_default_params();
    s->params.experimental = &s->exp;
    /* held until it is built: a pool it joins trims it only after that */
    s->mem = (rb_session_mem){.model = model, .kv = &s->kv, .fwd = &s->fwd,
                              .params = &s->params, .exp = &s->exp, .err = &s->err,
                              .handle = s};
    rb_session_memory_early_init(&s->mem);
    rb_session_file_init(&s->file, model, &s->kv, &s->mem, NULL, hp->n_vocab, &s->err);
    rb_status st;
    int locked = 0;
    /* the weight buffer first (nothing read): the forward pass binds its
       addresses, and only then is it known whether the weights fit. A
       cold restore without budgets (which never streams) maps the file:
       its weights are read into the page cache instead of into memory the
       kernel must zero first (model.h) */
    int map_weights = is_lazy_weights && !p.weights_budget_bytes && !p.budget_bytes;
    /* the model's weights are set up by one session at a time: the first
       loads them, the others find them loaded (and the shared cache) */
    rb_model_lock(model);
    locked = 1;
    if ((st = rb_model_reserve_weights(model, map_weights)) != RB_OK) {
        rb_error_set(err, st, "%s", rb_model_errmsg(model));
        goto fail;
    }
    if ((st = rb_threadpool_create(n_threads, &s->pool, err)) != RB_OK)
        goto fail;
    if ((st = rb_forward_init(&s->fwd, model, n_ctx, n_batch, s->pool, err)) != RB_OK)
        goto fail;
    s->fwd.exact_attention = p.exact_attention;
    if ((unsigned)p.kv_type_k > RB_KV_Q4_0 || (unsigned)p.kv_type_v > RB_KV_Q4_0) {
        st = rb_error_set(err, RB_E_INVALID_ARG, "session: KV cache types %d / %d are not f16, "
                          "q8_0 or q4_0", (int)p.kv_type_k, (int)p.kv_type_v);
        goto fail;
    }
    if ((p.kv_type_k != RB_KV_F16 || p.kv_type_v != RB_KV_F16) &&
        p.ram_codec == RB_RAM_CODEC_Q8) {
        st = rb_error_set(err, RB_E_INVALID_ARG, "session: the q8 RAM codec re-quantizes an f16 "
                          "KV cache; a %s/%s cache goes to the lossless codec or storage",
                          rb_kv_type_name(p.kv_type_k), rb_kv_type_name(p.kv_type_v));
        goto fail;
    }
    if ((st = rb_kvcache_init_typed(&s->kv, hp->n_layers, hp->n_head_kv, hp->head_dim_k,
                                    hp->head_dim_v, n_ctx, page_tokens,
                                    kv_type(p.kv_type_k), kv_type(p.kv_type_v), err)) != RB_OK)
        goto fail;
    s->tokens = malloc((size_t)n_ctx * sizeof *s->tokens);
    s->logits = malloc((size_t)hp->n_vocab * sizeof *s->logits);
    if (!s->tokens || !s->logits) {
        st = rb_error_set(err, RB_E_NOMEM, "session: out of memory");
        goto fail;
    }
    s->file.tokens = s->tokens;
    /* streamed weights are read on use; a cold start reads the layers in
       the first feed's restore; else everything now */
    int is_streaming = rb_session_memory_wants_streaming(&s->mem);
    if ((st = rb_model_claim_weights(model, is_streaming, err)) != RB_OK)
        goto fail;
    s->weights_claim = is_streaming ? 2 : 1;
    /* a model another session opened from a file is being read layer by
       layer by that session's restore: this one plans what it lacks itself
       and reads the rest through the shared cache (never the whole file) */
    int joins_cold = !is_streaming && !is_lazy_weights && rb_model_weights_owner(model) &&
                     rb_model_weights_load(model) == RB_WEIGHTS_LAZY;
    int lazy = is_lazy_weights || joins_cold;
    if (!is_streaming && (st = lazy ? rb_model_load_weights_lazy(model)
                                    : rb_model_load_weights(model)) != RB_OK) {
        rb_error_set(err, st, "%s", rb_model_errmsg(model));
        goto fail;
    }
    if ((st = rb_session_memory_init(&s->mem,
                                     lazy && rb_model_weights_load(model) == RB_WEIGHTS_LAZY,
                                     err)) !=
        RB_OK)
        goto fail;
    rb_model_unlock(model);
    locked = 0;
    if (joins_cold && (st = rb_session_memory_read_rest(&s->mem, err)) != RB_OK)
        goto fail;
    *out = s;
    return RB_OK;
fail:
    if (locked)
        rb_model_unlock(model);
    rb_session_destroy(s);
    return st;
}

void rb_session_destroy(rb_session *s)
{
    if (!s)
        return;
    if (tl_trim.s == s)
        tl_trim.s = NULL;
    rb_session_memory_leave_pool(&s->mem); /* no trim reaches it from now on */
    rb_session_memory_let_go(&s->mem);     /* a session that failed while it was built */
    rb_session_memory_settle_restore(&s->mem, 0); /* its workers read the file */
    rb_session_file_deinit(&s->file); /* its storage worker pins pages: before residency */
    rb_session_memory_deinit(&s->mem); /* stops the restore workers first */
    if (s->weights_claim) {
        rb_model_lock(s->model);
        rb_model_unclaim_weights(s->model, s->weights_claim == 2);
        rb_model_unlock(s->model);
    }
    rb_forward_deinit(&s->fwd);
    rb_kvcache_deinit(&s->kv);
    rb_threadpool_destroy(s->pool);
    free(s->tokens);
    free(s->logits);
    free(s);
}

const char *rb_session_errmsg(const rb_session *s)
{
    if (s && tl_trim.s == s)
        return tl_trim.message;
    return s && s->err.status ? s->err.message : "";
}

rb_status rb_session_nonfinite_error(rb_session *s, int32_t layer, uint32_t pos)
{
    char what[48] = "the output layer"; /* NaN logits would sample token 0 */
    if ((uint32_t)layer < s->fwd.hp.n_layers)
        snprintf(what, sizeof what, "layer %" PRId32, layer);
    return rb_error_set(&s->err, RB_E_FORMAT, "forward: %s produced NaN or infinite values "
                        "(position %" PRIu32 "): the model's weights are not finite there",
                        what, pos);
}

/* Computes toks[0..n) at positions pos0.. in batches (pages reserved
 * first). *stopped: a gate stopped the pass (the memory manager could not
 * restore a layer, or a trim or an abort came: rb_session_memory_take_stop);
 * *done: the tokens of the batches that completed. Progress: after each
 * batch, RB_PROGRESS_FEED with prog_base + done of prog_total (the feed's
 * own tokens, the same total whatever stops and resumes it; prog_total 0:
 * none, for a recompute). */
static rb_status run_tokens(rb_session *s, const int32_t *toks, size_t n, uint32_t pos0,
                            float *logits, int *stopped, size_t *done_out, size_t prog_base,
                            size_t prog_total)
{
    const uint32_t n_vocab = s->fwd.hp.n_vocab;
    *done_out = 0;
    if (n == 0)
        return RB_OK;
    rb_status st = rb_kvcache_reserve(&s->kv, pos0 + (uint32_t)n, &s->err);
    if (st != RB_OK)
        return st;
    rb_session_memory_set_pages(&s->mem, s->kv.n_pages_reserved);
    for (size_t done = 0; done < n;) {
        uint32_t m = (uint32_t)(n - done < s->fwd.n_batch ? n - done : s->fwd.n_batch);
        uint32_t pos = pos0 + (uint32_t)done;
        float *out = logits ? logits + done * n_vocab : NULL;
        int rc;
        if (out) {
            rc = rb_forward_batch(&s->fwd, &s->kv, toks + done, m, pos, out, 1);
            if (rc == 0)
                memcpy(s->logits, out + (size_t)(m - 1) * n_vocab, n_vocab * sizeof(float));
        } else {
            rc = rb_forward_batch(&s->fwd, &s->kv, toks + done, m, pos, s->logits, 0);
        }
        rb_session_memory_gate_release(&s->mem);
        rb_session_memory_pass_end(&s->mem); /* another session's pass may run now */
        if (rc != 0) {
            *stopped = 1;
            return RB_OK;
        }
        if ((st = rb_model_check_mapping(s->model, &s->err)) != RB_OK)
            return st;
        if (s->fwd.nonfinite_layer >= 0)
            return rb_session_nonfinite_error(s, s->fwd.nonfinite_layer, pos + m - 1);
        done += m;
        *done_out = done;
        rb_session_memory_batch_done(&s->mem);
        rb_session_memory_release_window(&s->mem, pos0 + done, 1);
        if (s->params.progress && prog_total &&
            s->params.progress(s->params.progress_ctx, RB_PROGRESS_FEED, prog_base + done,
                               prog_total)) {
            rb_session_abort(s); /* stops at the next boundary */
        }
    }
    return RB_OK;
}

static rb_status feed_locked(rb_session *s, const int32_t *tokens, size_t n, float *logits);

rb_status rb_session_feed(rb_session *s, const int32_t *tokens, size_t n, float *logits)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if (n == 0)
        return RB_OK;
    rb_session_enter(s);
    rb_status st = feed_locked(s, tokens, n, logits);
    rb_session_leave(s);
    return st;
}

/*
 * A feed, in attempts: each plans the restore of what a trim evicted,
 * recomputes what was dropped, computes the new tokens, and ends the
 * restore. A damaged page found by the restore starts another attempt
 * (recompute from it). A trim posted from another thread, or an abort,
 * stops the forward pass at a layer boundary: the batches that completed
 * are kept (their tokens appended), the trim is served, and the feed goes
 * on with the rest (an abort returns instead). In steps
 * (session_internal.h): begin, then attempts of prepare, run, finish;
 * rb_session_decode_multi runs several sessions' new tokens in one pass in
 * place of their run step.
 */
static rb_status feed_locked(rb_session *s, const int32_t *tokens, size_t n, float *logits)
{
    rb_feed fd;
    rb_status st = rb_session_feed_begin(s, tokens, n, logits, &fd);
    return st != RB_OK ? st : rb_session_feed_continue(s, &fd);
}

rb_status rb_session_compute_logits(rb_session *s)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if (rb_session_get_logits(s))
        return RB_OK;
    size_t n = rb_session_n_tokens(s);
    if (n == 0)
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: it holds no token to "
                            "compute the logits of");
    int32_t last = s->tokens[n - 1];
    rb_status st = rb_session_rewind(s, n - 1);
    return st != RB_OK ? st : rb_session_feed(s, &last, 1, NULL);
}

rb_status rb_session_feed_begin(rb_session *s, const int32_t *tokens, size_t n, float *logits,
                                rb_feed *fd)
{
    const uint32_t n_vocab = s->fwd.hp.n_vocab;
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
    memset(fd, 0, sizeof *fd);
    fd->tokens = tokens;
    fd->n = n;
    fd->logits = logits;
    fd->damaged = UINT32_MAX;
    s->recomputed_tokens = 0;
    return RB_OK;
}

/* A restore that finds a damaged page (checksum, I/O) recomputes from that
 * page on; a second damaged restore of the same feed is not expected (the
 * recomputed pages are fresh), the bound only keeps a broken device from
 * looping. A stop for a trim is not an attempt. */
#define FEED_ATTEMPTS 4

rb_status rb_session_feed_prepare(rb_session *s, rb_feed *fd)
{
    rb_status rst = rb_session_memory_ensure_run_state(&s->mem, &s->err);
    if (rst != RB_OK)
        return rst;
    while (fd->attempt < FEED_ATTEMPTS) {
        const size_t rest = fd->n - fd->fed;
        /* before any restore is planned: a re-balance may trim KV */
        rb_session_memory_before_feed(&s->mem, (uint32_t)((s->n_tokens + rest +
                                                           s->kv.page_tokens - 1) /
                                                          s->kv.page_tokens));
        /* positions whose K/V exists in some tier: all of them, except after
           a session was opened from a file that did not hold every page */
        size_t kv_valid = s->n_kv_valid < s->n_tokens ? s->n_kv_valid : s->n_tokens;
        uint32_t recompute_from;
        rb_status st = rb_session_memory_begin_restore(&s->mem, &recompute_from);
        if (st != RB_OK)
            return st;
        if (fd->damaged < recompute_from)
            recompute_from = fd->damaged;
        if (recompute_from < kv_valid &&
            rb_session_memory_recompute_point(&s->mem, recompute_from) == 0 &&
            recompute_from > 0) {
            /* a sliding window reaches released pages: all from 0, with
               nothing of the old context restored (the next attempt plans
               only what the weights need) */
            rb_session_memory_drop_restore(&s->mem);
            rb_session_memory_forget_from(&s->mem, 0);
            s->n_kv_valid = 0;
            fd->damaged = UINT32_MAX;
            fd->attempt++;
            continue;
        }
        if (recompute_from < kv_valid) {
            rb_kvcache_truncate(&s->kv, recompute_from / s->kv.page_tokens);
            kv_valid = recompute_from;
            s->n_kv_valid = kv_valid; /* if this feed fails, the next recomputes */
        }
        rb_session_memory_will_write(&s->mem, (uint32_t)(kv_valid / s->kv.page_tokens));
        rb_session_memory_pass_begin(&s->mem);
        fd->kv_valid = kv_valid;
        fd->stopped = 0;
        fd->done_re = fd->done_new = 0;
        fd->st = run_tokens(s, s->tokens + kv_valid, s->n_tokens - kv_valid, (uint32_t)kv_valid,
                            NULL, &fd->stopped, &fd->done_re, 0, 0);
        fd->ready = fd->st == RB_OK && !fd->stopped;
        return RB_OK;
    }
    return rb_error_set(&s->err, RB_E_IO, "session: the evicted context could not be "
                        "restored or recomputed after %d attempts", FEED_ATTEMPTS);
}

void rb_session_feed_run(rb_session *s, rb_feed *fd)
{
    const uint32_t n_vocab = s->fwd.hp.n_vocab;
    double t0 = rb_throttle_now_s();
    fd->st = run_tokens(s, fd->tokens + fd->fed, fd->n - fd->fed, (uint32_t)s->n_tokens,
                        fd->logits ? fd->logits + fd->fed * n_vocab : NULL, &fd->stopped,
                        &fd->done_new, fd->fed, fd->n);
    /* the split's compute estimate */
    if (fd->st == RB_OK && !fd->stopped && fd->fed == 0)
        rb_session_memory_note_compute(&s->mem, fd->n, rb_throttle_now_s() - t0);
}

rb_status rb_session_feed_finish(rb_session *s, rb_feed *fd, int *done)
{
    const size_t rest = fd->n - fd->fed, kv_valid = fd->kv_valid;
    rb_status st = fd->st;
    *done = 1;
    rb_status rst = rb_session_memory_end_restore(&s->mem, &fd->damaged);
    if (st != RB_OK)
        return st;
    if (rst != RB_OK)
        return rst; /* weights could not be re-read: nothing computes */
    if ((st = rb_session_memory_pass_error(&s->mem, fd->stopped)) != RB_OK)
        return st;  /* the same, found by the layer gate or the weight stream */
    const int stop_for_request = rb_session_memory_take_stop(&s->mem);
    if (!fd->stopped && fd->damaged == UINT32_MAX) {
        s->recomputed_tokens += (uint32_t)(s->n_tokens - kv_valid);
        memcpy(s->tokens + s->n_tokens, fd->tokens + fd->fed, rest * sizeof *fd->tokens);
        s->n_tokens += rest;
        s->n_kv_valid = s->n_tokens;
        s->has_logits = 1;
        rb_session_memory_release_window(&s->mem, s->n_tokens, 0); /* the restore ended */
        rb_session_file_after_feed(&s->file, s->n_tokens); /* never fails the feed */
        rb_session_memory_after_feed(&s->mem);
        return RB_OK;
    }
    *done = 0;
    if (fd->stopped && stop_for_request && fd->damaged == UINT32_MAX) {
        /* a trim or an abort at a layer boundary: keep what completed */
        if (fd->done_new == 0) {
            s->n_kv_valid = kv_valid + fd->done_re;
            s->recomputed_tokens += (uint32_t)fd->done_re;
        } else {
            s->recomputed_tokens += (uint32_t)(s->n_tokens - kv_valid);
            memcpy(s->tokens + s->n_tokens, fd->tokens + fd->fed,
                   fd->done_new * sizeof *fd->tokens);
            s->n_tokens += fd->done_new;
            s->n_kv_valid = s->n_tokens;
            s->has_logits = 1;
            fd->fed += fd->done_new;
        }
        rb_session_memory_release_window(&s->mem, s->n_kv_valid, 0);
        if (rb_session_memory_take_abort(&s->mem)) {
            rb_session_memory_serve_requests(&s->mem);
            if (fd->done_new)
                rb_session_file_after_feed(&s->file, s->n_tokens);
            rb_session_memory_after_feed(&s->mem);
            *done = 1;
            return rb_error_set(&s->err, RB_E_ABORTED, "session: feed aborted after %zu of "
                                "%zu tokens (the session holds %zu)", fd->fed, fd->n,
                                s->n_tokens);
        }
        rb_session_memory_serve_requests(&s->mem);
        rb_session_memory_grant_grace(&s->mem); /* the next batch completes whatever comes */
        return RB_OK;
    }
    if (fd->damaged != UINT32_MAX) {
        fd->damaged = (uint32_t)rb_session_memory_recompute_point(&s->mem, fd->damaged);
        rb_session_memory_forget_from(&s->mem, fd->damaged / s->kv.page_tokens);
        if (fd->damaged < s->n_kv_valid)
            s->n_kv_valid = fd->damaged;
    }
    fd->attempt++;
    return RB_OK;
}

rb_status rb_session_feed_continue(rb_session *s, rb_feed *fd)
{
    for (;;) {
        rb_status st = rb_session_feed_prepare(s, fd);
        if (st != RB_OK)
            return st;
        if (fd->ready)
            rb_session_feed_run(s, fd);
        int done;
        st = rb_session_feed_finish(s, fd, &done);
        if (done)
            return st;
    }
}

static rb_status rewind_locked(rb_session *s, size_t n_tokens);

/*
 * Embeddings: rewind to nothing, feed the tokens with the forward pass
 * writing each position's output-normed hidden state into a scratch
 * [n][n_embd], pool as the GGUF says, L2-normalize.
 */
rb_status rb_session_embed(rb_session *s, const int32_t *tokens, size_t n, float *out,
                           size_t n_out)
{
    if (!s)
        return RB_E_INVALID_ARG;
    const uint32_t E = s->fwd.hp.n_embd;
    if (!tokens || n == 0 || !out)
        return rb_error_set(&s->err, RB_E_INVALID_ARG,
                            "session: embed needs tokens (n >= 1) and an output");
    if (n_out != E)
        return rb_error_set(&s->err, RB_E_INVALID_ARG,
                            "session: embed writes n_embd = %u floats, not %zu", E, n_out);
    if (n > s->fwd.n_ctx)
        return rb_error_set(&s->err, RB_E_INVALID_ARG,
                            "session: %zu tokens to embed exceed the context of %u", n,
                            s->fwd.n_ctx);
    /* <arch>.pooling_type as llama.cpp numbers it: 1 mean (also the default
       when absent or 0), 2 cls (the first token), 3 last */
    uint32_t pooling = 1;
    const char *arch = NULL;
    size_t arch_len = 0;
    if (rb_model_get_meta_str(s->model, "general.architecture", &arch, &arch_len) == RB_OK &&
        arch_len < 64) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.pooling_type", (int)arch_len, arch);
        uint32_t v = 0;
        if (rb_gguf_get_u32(rb_model_gguf(s->model), key, &v) == RB_OK && v >= 1 && v <= 3)
            pooling = v;
    }
    float *rows = malloc(sizeof *rows * (size_t)E * n);
    if (!rows)
        return rb_error_set(&s->err, RB_E_NOMEM, "session: out of memory for %zu embedding rows",
                            n);
    rb_session_enter(s);
    rb_status st = rewind_locked(s, 0);
    if (st == RB_OK) {
        s->fwd.embd_rows = rows;
        s->fwd.embd_pos0 = 0;
        s->fwd.embd_n = (uint32_t)n;
        st = feed_locked(s, tokens, n, NULL);
        s->fwd.embd_rows = NULL;
        s->fwd.embd_n = 0;
    }
    rb_session_leave(s);
    if (st == RB_OK) {
        double norm = 0.0;
        for (uint32_t j = 0; j < E; j++) {
            double v;
            if (pooling == 2) {
                v = rows[j];
            } else if (pooling == 3) {
                v = rows[(n - 1) * E + j];
            } else {
                v = 0.0;
                for (size_t t = 0; t < n; t++)
                    v += rows[t * E + j];
                v /= (double)n;
            }
            out[j] = (float)v;
            norm += v * v;
        }
        norm = sqrt(norm);
        if (norm > 0.0)
            for (uint32_t j = 0; j < E; j++)
                out[j] = (float)(out[j] / norm);
    }
    free(rows);
    return st;
}

rb_status rb_session_rewind(rb_session *s, size_t n_tokens)
{
    if (!s)
        return RB_E_INVALID_ARG;
    rb_session_enter(s);
    rb_status st = rewind_locked(s, n_tokens);
    rb_session_leave(s);
    return st;
}

static rb_status rewind_locked(rb_session *s, size_t n_tokens)
{
    if (n_tokens > s->n_tokens)
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: cannot rewind to %zu tokens: "
                            "it holds %zu", n_tokens, s->n_tokens);
    uint32_t keep_pages = (uint32_t)((n_tokens + s->kv.page_tokens - 1) / s->kv.page_tokens);
    rb_session_memory_settle_restore(&s->mem, 0);
    /* behind a sliding window's released pages: everything is recomputed */
    size_t valid = rb_session_memory_recompute_point(&s->mem, n_tokens);
    rb_session_memory_forget_from(&s->mem, valid == 0 ? 0 : keep_pages);
    s->n_tokens = n_tokens;
    if (s->n_kv_valid > valid)
        s->n_kv_valid = valid;
    s->has_logits = 0;
    rb_session_file_rewound(&s->file, s->n_tokens);
    /* the next write starts at n_kv_valid: a shared page there is copied
       first (kvcache.h); without the memory for a copy, the page is
       recomputed instead */
    const uint32_t P = s->kv.page_tokens, page = (uint32_t)(s->n_kv_valid / P);
    if (s->n_kv_valid % P && rb_session_memory_unshare_page(&s->mem, page) != RB_OK) {
        rb_session_memory_forget_from(&s->mem, page);
        s->n_kv_valid = (size_t)page * P;
    }
    return RB_OK;
}

static rb_status restore_all(rb_session *s);
static rb_status restore_pages(rb_session *s, uint32_t pages);

/*
 * The fork, in steps (the source held throughout, the fork held until it
 * is built):
 *  1. the fork is created in the source's pool with the source's context
 *     and KV types;
 *  2. every page the source evicted comes back (as a shift does), so that
 *     the prefix is resident;
 *  3. the full pages of the prefix become shared pages, the partly filled
 *     last one is copied (rb_session_memory_fork_pages); a page the source
 *     could not bring back ends what is shared, and the fork's first feed
 *     recomputes from there;
 *  4. the tokens are copied, and the last logits when the fork is the
 *     whole source.
 */
rb_status rb_session_fork(rb_session *src, size_t n_tokens, const rb_session_params *params,
                          rb_session **out, rb_error *err)
{
    if (!src || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: fork: src and out are required");
    rb_session_params p = src->params;
    if (params) {
        rb_status pst = rb_params_copy(&p, sizeof p, params, "rb_session_params", err);
        if (pst != RB_OK)
            return pst;
    }
    rb_pool *pool = rb_session_memory_pool(&src->mem);
    if (p.pool && p.pool != pool)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: fork: a fork is in its source's "
                            "pool (params.pool is another pool)");
    if (p.n_ctx && p.n_ctx != src->kv.n_ctx)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: fork: n_ctx %" PRIu32 " is not "
                            "the source's %" PRIu32 " (0: the source's)", p.n_ctx,
                            src->kv.n_ctx);
    if (kv_type(p.kv_type_k) != src->kv.type_k || kv_type(p.kv_type_v) != src->kv.type_v)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: fork: KV types %s/%s are not the "
                            "source's %s/%s", rb_kv_type_name(p.kv_type_k),
                            rb_kv_type_name(p.kv_type_v), rb_kv_type_name(src->params.kv_type_k),
                            rb_kv_type_name(src->params.kv_type_v));
    if (p.kv_page_tokens && p.kv_page_tokens != src->kv.page_tokens)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: fork: kv_page_tokens %" PRIu32
                            " is not the source's %" PRIu32 " (0: the source's)",
                            p.kv_page_tokens, src->kv.page_tokens);
    p.pool = pool;
    p.budget_bytes = 0;
    p.n_ctx = src->kv.n_ctx;
    p.kv_page_tokens = src->kv.page_tokens;
    rb_session *f = NULL;
    rb_status st = create_impl(src->model, &p, 0, &f, err);
    if (st != RB_OK)
        return st;
    rb_session_enter(src);
    if (n_tokens > src->n_tokens) {
        st = rb_error_set(err, RB_E_INVALID_ARG, "session: fork: %zu tokens, but the source "
                          "holds %zu", n_tokens, src->n_tokens);
        goto out;
    }
    /* only the pages the fork takes: the source's others stay where they
       are (a trimmed source would otherwise come back whole, over the
       budget, for a prefix) */
    const uint32_t P = src->kv.page_tokens;
    if ((st = restore_pages(src, (uint32_t)((n_tokens + P - 1) / P))) != RB_OK) {
        rb_error_set(err, st, "session: fork: %s", src->err.message);
        goto out;
    }
    size_t valid = src->n_kv_valid < n_tokens ? src->n_kv_valid : n_tokens, got = 0;
    st = rb_session_memory_fork_pages(&f->mem, &src->mem, valid, &got, err);
    if (st != RB_OK)
        goto out;
    memcpy(f->tokens, src->tokens, n_tokens * sizeof *f->tokens);
    f->n_tokens = n_tokens;
    f->n_kv_valid = got;
    if (n_tokens == src->n_tokens && src->has_logits && got == n_tokens) {
        memcpy(f->logits, src->logits, (size_t)f->fwd.hp.n_vocab * sizeof *f->logits);
        f->has_logits = 1;
    }
out:
    rb_session_leave(src);
    if (st != RB_OK) {
        rb_session_destroy(f);
        return st;
    }
    rb_session_memory_after_feed(&f->mem); /* its bytes counted, the budget kept */
    rb_session_leave(f);
    *out = f;
    return RB_OK;
}

/* Brings every evicted page back without computing (as an unbind does);
 * what is damaged or dropped becomes positions to recompute. */
static rb_status restore_all(rb_session *s) { return restore_pages(s, UINT32_MAX); }

/* The same for the first `pages` pages of every layer (a fork's prefix). */
static rb_status restore_pages(rb_session *s, uint32_t pages)
{
    uint32_t from;
    rb_status st = rb_session_memory_restore_pages(&s->mem, pages, &from);
    if (st != RB_OK)
        return st;
    if (from < s->n_kv_valid) {
        uint32_t page = from / s->kv.page_tokens;
        rb_session_memory_forget_from(&s->mem, page);
        s->n_kv_valid = (size_t)page * s->kv.page_tokens;
    }
    return RB_OK;
}

/*
 * The shift, in steps:
 *  1. every page back in RAM (restore_all);
 *  2. the rows that survive from the first page the shift touches on are
 *     copied out: the kept ones before n_keep as they are, the moved ones
 *     with K rotated by -n_discard (f32, then rounded or quantized back);
 *  3. those pages are forgotten in every tier and freed, then allocated
 *     again and the rows written back at their new positions;
 *  4. the tokens move; positions whose K/V did not exist (a cold open's
 *     uncovered tail) stay to be recomputed.
 */
static rb_status shift_locked(rb_session *s, size_t n_keep, size_t n_discard);

rb_status rb_session_shift(rb_session *s, size_t n_keep, size_t n_discard)
{
    if (!s)
        return RB_E_INVALID_ARG;
    rb_session_enter(s);
    rb_status st = shift_locked(s, n_keep, n_discard);
    rb_session_leave(s);
    return st;
}

static rb_status shift_locked(rb_session *s, size_t n_keep, size_t n_discard)
{
    if (n_keep > s->n_tokens || n_discard > s->n_tokens - n_keep)
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: cannot keep %zu and discard "
                            "%zu of %zu tokens", n_keep, n_discard, s->n_tokens);
    if (n_discard == 0)
        return RB_OK;
    if (s->fwd.hp.n_swa)
        return rb_error_set(&s->err, RB_E_UNSUPPORTED, "session: a context shift is not "
                            "possible with sliding-window layers (the kept tokens may be "
                            "outside their window): rewind and feed again instead");
    rb_status st = restore_all(s);
    if (st != RB_OK)
        return st;
    /* the file's writer reads the tokens and pages: it finishes first, and
       the file keeps only the prefix the shift leaves as it is */
    rb_session_file_shifted(&s->file, n_keep / s->kv.page_tokens * s->kv.page_tokens);
    const rb_hparams *hp = &s->fwd.hp;
    rb_kvcache *kv = &s->kv;
    const uint32_t P = kv->page_tokens, L = kv->n_layers, H = kv->n_kv_heads;
    const size_t valid = s->n_kv_valid < s->n_tokens ? s->n_kv_valid : s->n_tokens;
    const uint32_t first_page = (uint32_t)(n_keep / P);
    const size_t base = (size_t)first_page * P, kept_end = valid < n_keep ? valid : n_keep;
    const size_t head = kept_end > base ? kept_end - base : 0; /* kept rows of the first page */
    const size_t moved = valid > n_keep + n_discard ? valid - n_keep - n_discard : 0;
    const size_t rows = head + moved, row = kv->row_k + kv->row_v;
    uint8_t *tmp = rows ? malloc((size_t)L * H * rows * row) : NULL;
    float *kf = malloc(hp->head_dim_k * sizeof *kf);
    if ((rows && !tmp) || !kf) {
        free(tmp);
        free(kf);
        return rb_error_set(&s->err, RB_E_NOMEM, "session: out of memory for a context shift");
    }
    const rb_type_traits *kt = rb_type_get_traits(kv->type_k);
    uint8_t *o = tmp;
    for (uint32_t l = 0; l < L; l++) {
        const rb_rope *rope = s->fwd.layers[l].window ? &s->fwd.rope_swa : &s->fwd.rope;
        for (uint32_t h = 0; h < H; h++)
            for (size_t r = 0; r < rows; r++, o += row) {
                uint32_t pos = (uint32_t)(r < head ? (size_t)first_page * P + r
                                                   : n_keep + n_discard + (r - head));
                memcpy(o + kv->row_k, rb_kvcache_v_row(kv, l, h, pos), kv->row_v);
                const void *k = rb_kvcache_k_row(kv, l, h, pos);
                if (r < head) {
                    memcpy(o, k, kv->row_k);
                    continue;
                }
                kt->dequantize_row(k, kf, hp->head_dim_k);
                rb_rope_apply(rope, kf, 1, (int)hp->head_dim_k, -(int64_t)n_discard);
                rb_forward_store_row(kv->type_k, kf, o, hp->head_dim_k);
            }
    }
    free(kf);
    rb_session_memory_forget_from(&s->mem, first_page);
    st = rb_kvcache_reserve(kv, (uint32_t)((size_t)first_page * P + rows), &s->err);
    if (st == RB_OK) {
        o = tmp;
        for (uint32_t l = 0; l < L; l++)
            for (uint32_t h = 0; h < H; h++)
                for (size_t r = 0; r < rows; r++, o += row) {
                    uint32_t pos = (uint32_t)((size_t)first_page * P + r);
                    memcpy(rb_kvcache_k_row(kv, l, h, pos), o, kv->row_k);
                    memcpy(rb_kvcache_v_row(kv, l, h, pos), o + kv->row_k, kv->row_v);
                }
    }
    free(tmp);
    memmove(s->tokens + n_keep, s->tokens + n_keep + n_discard,
            (s->n_tokens - n_keep - n_discard) * sizeof *s->tokens);
    s->n_tokens -= n_discard;
    /* the K/V that exists: up to the moved rows (all of it when the reserve
       failed before writing: nothing from the first page on) */
    s->n_kv_valid = st == RB_OK ? (size_t)first_page * P + rows : (size_t)first_page * P;
    rb_session_memory_set_pages(&s->mem, kv->n_pages_reserved);
    return st;
}

const float *rb_session_get_logits(const rb_session *s)
{
    return s->has_logits ? s->logits : NULL;
}

size_t rb_session_n_tokens(const rb_session *s) { return s->n_tokens; }
const int32_t *rb_session_get_tokens(const rb_session *s) { return s->tokens; }
uint32_t rb_session_n_ctx(const rb_session *s) { return s->kv.n_ctx; }
uint32_t rb_session_n_vocab(const rb_session *s) { return s->fwd.hp.n_vocab; }

/* ---- memory: the calls from any thread, the stats ------------------------------ */

void rb_session_abort(rb_session *s)
{
    if (s)
        rb_session_memory_abort(&s->mem);
}

/* Prefetches s if no call holds it (trim_background: may make room from
 * background sessions); 0 planned when busy. Never blocks on a feed. */
static int prefetch_idle(rb_session *s, int trim_background, uint64_t *planned)
{
    *planned = 0;
    if (!rb_session_memory_try_enter(&s->mem))
        return 0;
    rb_session_memory_prefetch(&s->mem, trim_background, planned);
    rb_session_memory_leave(&s->mem);
    return 1;
}

rb_status rb_session_set_priority(rb_session *s, rb_priority priority)
{
    if (!s || (unsigned)priority > RB_PRIORITY_BACKGROUND)
        return RB_E_INVALID_ARG;
    rb_status st = rb_session_memory_set_priority(&s->mem, priority);
    uint64_t planned;
    if (st == RB_OK && priority == RB_PRIORITY_FOREGROUND) /* coming back: restore now */
        (void)prefetch_idle(s, 1, &planned);
    if (st == RB_OK && priority == RB_PRIORITY_BACKGROUND &&
        rb_session_memory_try_enter(&s->mem)) { /* idle: its run state goes till its next feed */
        rb_session_memory_release_run_state(&s->mem);
        rb_session_memory_leave(&s->mem);
    }
    return st;
}

rb_status rb_session_prefetch(rb_session *s, uint64_t *planned_bytes)
{
    if (!s)
        return RB_E_INVALID_ARG;
    uint64_t planned;
    const int fg = s->mem.member &&
                   rb_pool_member_priority(s->mem.member) == RB_PRIORITY_FOREGROUND;
    (void)prefetch_idle(s, fg, &planned);
    if (planned_bytes)
        *planned_bytes = planned;
    return RB_OK;
}

rb_status rb_pool_prefetch_next(rb_pool *pool, rb_session **picked, uint64_t *planned_bytes)
{
    if (!pool)
        return RB_E_INVALID_ARG;
    rb_session *c[64];
    uint32_t n = rb_pool_prefetch_candidates(pool, c, 64);
    rb_session *pick = NULL;
    uint64_t planned = 0;
    /* the first idle one (busy: its feed restores it anyway) */
    for (uint32_t i = 0; i < n && !pick; i++)
        if (prefetch_idle(c[i], 0, &planned))
            pick = c[i];
    if (picked)
        *picked = pick;
    if (planned_bytes)
        *planned_bytes = planned;
    return RB_OK;
}

rb_status rb_session_trim(rb_session *s, uint64_t bytes, rb_trim_level level,
                          uint64_t *freed_out)
{
    if (!s || (unsigned)level > RB_TRIM_COMPLETE)
        return RB_E_INVALID_ARG;
    uint64_t freed = 0;
    rb_error e = {0};
    rb_status st = rb_session_memory_trim(&s->mem, bytes, level, &freed, &e);
    if (st != RB_OK) { /* this thread's message, never the session's */
        snprintf(tl_trim.message, sizeof tl_trim.message, "%s", e.message);
        tl_trim.s = s;
    }
    if (freed_out)
        *freed_out = freed;
    return st;
}

rb_status rb_session_get_stats_sized(const rb_session *s, rb_session_stats *out, size_t out_size)
{
    if (!s || !out || !out_size)
        return RB_E_INVALID_ARG;
    /* the caller's struct may be an older, shorter one: fill what it has */
    rb_session_stats all;
    rb_session_memory_fill_stats(&s->mem, &all);
    rb_session_file_fill_stats(&s->file, &all);
    all.restore_recomputed_tokens = s->recomputed_tokens;
    memcpy(out, &all, out_size < sizeof all ? out_size : sizeof all);
    return RB_OK;
}

rb_status rb_session_set_restore(rb_session *s, rb_restore_mode mode, rb_ram_codec codec)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if (codec == RB_RAM_CODEC_Q8 && (s->kv.type_k != RB_TYPE_F16 || s->kv.type_v != RB_TYPE_F16))
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: the q8 RAM codec re-quantizes "
                            "an f16 KV cache; this one is quantized");
    rb_session_enter(s);
    rb_status st = rb_session_memory_set_mode(&s->mem, mode, codec);
    if (st == RB_OK) {
        s->params.restore = mode;
        s->params.ram_codec = codec;
    }
    rb_session_leave(s);
    return st;
}

size_t rb_session_restore_events(const rb_session *s, rb_restore_event *out, size_t max)
{
    return s ? rb_session_memory_events(&s->mem, out, max) : 0;
}

/* ---- the session file ----------------------------------------------------------- */

rb_status rb_session_save(rb_session *s, const char *path, unsigned flags)
{
    if (!s || !path)
        return RB_E_INVALID_ARG;
    rb_session_enter(s);
    rb_session_memory_settle_restore(&s->mem, 1); /* a save holds the whole context */
    rb_status st = rb_session_file_save(&s->file, path, flags, s->n_tokens);
    rb_session_leave(s);
    return st;
}

rb_status rb_session_remove_file(const char *path, rb_error *err)
{
    if (!path)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: no path to remove");
    return rb_sessfile_remove(path, err);
}

/* The positions an open file covers: page by page, every layer must hold
 * all of the page's positions below n, except that a sliding-window layer
 * needs no page before the window of position n. A recompute from there
 * reads the windows before it: when the file lacks one of their pages,
 * everything is recomputed. The pages covered are adopted (STORED in the
 * file) for the first feed's restore. */
static void adopt_file_pages(rb_session *s, rb_sessfile *f, size_t n, uint32_t n_shared)
{
    const uint32_t P = s->kv.page_tokens;
    size_t covered = 0;
    uint32_t pages = 0;
    while (covered < n) {
        uint32_t need = n - covered >= P ? P : (uint32_t)(n - covered);
        int all = 1;
        for (uint32_t l = 0; l < s->kv.n_layers && all; l++)
            all = rb_sessfile_page_tokens(f, l, pages) >= need ||
                  (s->fwd.layers[l].window &&
                   pages < rb_session_memory_window_first_page(&s->mem, n));
        if (!all)
            break;
        covered += need;
        pages++;
    }
    uint32_t first_win = rb_session_memory_window_first_page(&s->mem, covered);
    for (uint32_t l = 0; covered < n && l < s->kv.n_layers; l++)
        for (uint32_t p = first_win; s->fwd.layers[l].window && p < covered / P; p++)
            if (rb_sessfile_page_tokens(f, l, p) < P)
                covered = pages = first_win = 0;
    if (n_shared > pages) /* in RAM already (cannot be: the file covers them) */
        n_shared = pages;
    for (uint32_t l = 0; l < s->kv.n_layers; l++)
        for (uint32_t p = s->fwd.layers[l].window ? first_win : 0; p < pages; p++)
            if (p >= n_shared)
                rb_session_memory_adopt_saved(&s->mem, l, p,
                                              rb_sessfile_page_tokens(f, l, p) == P);
    rb_session_memory_adopted(&s->mem, pages, first_win);
    s->n_kv_valid = covered;
}

static rb_status open_saved(rb_model *model, const rb_session_params *params,
                            const char *path, int fd, rb_session *peer, rb_session **out,
                            rb_error *err);
static rb_status unbind_locked(rb_session *s);

/* The leading full pages of the file that peer holds in RAM with the same
 * tokens and the same bits (each layer's page against the file's
 * checksum), shared into s as a fork shares its source's: how many. */
static uint32_t share_from_peer(rb_session *s, rb_sessfile *f, rb_session *peer)
{
    if (rb_session_memory_pool(&peer->mem) != rb_session_memory_pool(&s->mem) ||
        !rb_kvcache_same_layout(&s->kv, &peer->kv))
        return 0;
    const uint32_t P = s->kv.page_tokens;
    const int32_t *ft = rb_sessfile_tokens(f);
    rb_session_enter(peer);
    size_t n = rb_sessfile_n_tokens(f), same = 0;
    if (n > peer->n_kv_valid)
        n = peer->n_kv_valid;
    while (same < n && peer->tokens[same] == ft[same])
        same++;
    /* as a fork: those pages of peer settled in RAM (a restore or a
       prefetch of them done; a trimmed one read back once, for both) */
    if (same >= P && restore_pages(peer, (uint32_t)(same / P)) != RB_OK)
        same = 0;
    if (same > peer->n_kv_valid) /* the restore found some damaged */
        same = peer->n_kv_valid;
    uint32_t k = 0;
    for (; k < same / P; k++) {
        int ok = 1;
        for (uint32_t l = 0; l < s->kv.n_layers && ok; l++) {
            const void *buf = peer->kv.pages[(size_t)l * peer->kv.pages_per_layer + k];
            ok = buf && rb_sessfile_page_tokens(f, l, k) == P &&
                 rb_kvcodec_hash64(buf, peer->kv.page_bytes) == rb_sessfile_page_hash(f, l, k);
        }
        if (!ok)
            break;
    }
    size_t got = 0;
    rb_error e;
    if (k && rb_session_memory_fork_pages(&s->mem, &peer->mem, (size_t)k * P, &got, &e) !=
                 RB_OK)
        got -= got % P; /* what it took stays shared */
    rb_session_leave(peer);
    return (uint32_t)(got / P);
}

rb_status rb_session_open_saved(rb_model *model, const rb_session_params *params,
                                const char *path, rb_session **out, rb_error *err)
{
    if (!model || !path || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model, path and out are required");
    if (access(path, F_OK) != 0)
        return rb_error_set(err, RB_E_NOT_FOUND, "session file: '%s' does not exist", path);
    return open_saved(model, params, path, -1, NULL, out, err);
}

rb_status rb_session_open_saved_sharing(rb_model *model, const rb_session_params *params,
                                        const char *path, rb_session *peer, rb_session **out,
                                        rb_error *err)
{
    if (!model || !path || !out || !peer)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model, path, peer and out are "
                            "required");
    if (access(path, F_OK) != 0)
        return rb_error_set(err, RB_E_NOT_FOUND, "session file: '%s' does not exist", path);
    return open_saved(model, params, path, -1, peer, out, err);
}

rb_status rb_session_open_saved_fd(rb_model *model, const rb_session_params *params, int fd,
                                   rb_session **out, rb_error *err)
{
    if (!model || fd < 0 || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model, a file descriptor (%d) and "
                            "out are required", fd);
    char name[48];
    snprintf(name, sizeof name, "file descriptor %d", fd);
    return open_saved(model, params, name, fd, NULL, out, err);
}

/* path: the file, or (fd >= 0) what names the descriptor in messages; a
 * descriptor's state is read into the session and the file let go (the
 * file binding opens it read only: no commit may follow). peer (may be
 * NULL): the session in whose pool it opens, sharing its first pages. */
static rb_status open_saved(rb_model *model, const rb_session_params *params,
                            const char *path, int fd, rb_session *peer, rb_session **out,
                            rb_error *err)
{
    /* kv_page_tokens 0: the page size the file was saved with */
    rb_session_params p = session_defaults();
    if (params) {
        rb_status pst = rb_params_copy(&p, sizeof p, params, "rb_session_params", err);
        if (pst != RB_OK)
            return pst;
    }
    if (peer) {
        rb_pool *pool = rb_session_memory_pool(&peer->mem);
        if (!pool || (p.pool && p.pool != pool))
            return rb_error_set(err, RB_E_INVALID_ARG, "session: open sharing: the peer must "
                                "be in the pool params.pool names");
        p.pool = pool;
    }
    if (!p.kv_page_tokens) { /* one the file cannot hold: the open says what is wrong */
        const uint32_t t = rb_sessfile_peek_page_tokens(path, fd, NULL);
        p.kv_page_tokens = t >= 32 && t <= 1024 && t % 32 == 0 ? t : 0;
    }
    rb_session *s = NULL;
    rb_status st = create_impl(model, &p, 1, &s, err);
    if (st != RB_OK)
        return st;
    rb_sessfile *f = NULL;
    st = fd >= 0 ? rb_session_file_open_fd(&s->file, fd, path, s->params.file_flags, &f, err)
                 : rb_session_file_open(&s->file, path, s->params.file_flags, &f, err);
    if (st != RB_OK) {
        rb_session_destroy(s);
        return st;
    }
    size_t n = rb_sessfile_n_tokens(f); /* <= n_ctx: rb_session_file_open checks it */
    memcpy(s->tokens, rb_sessfile_tokens(f), n * sizeof *s->tokens);
    s->n_tokens = n;
    const uint32_t shared = peer ? share_from_peer(s, f, peer) : 0;
    adopt_file_pages(s, f, n, shared);
    if ((st = rb_session_file_bind(&s->file, f, path, err)) != RB_OK) {
        rb_sessfile_close(f);
        rb_session_destroy(s);
        return st;
    }
    rb_session_memory_mark_saved(&s->mem, shared); /* the file holds them */
    rb_session_memory_open_restore(&s->mem);
    if ((st = rb_session_file_check_model(&s->file, err)) != RB_OK ||
        (st = rb_session_memory_read_rest(&s->mem, err)) != RB_OK) {
        rb_session_destroy(s); /* drops the restore first */
        return st;
    }
    /* a descriptor: everything it holds read back now, then let go */
    if (fd >= 0 && (st = unbind_locked(s)) != RB_OK) {
        rb_error_set(err, st, "%s", s->err.message);
        rb_session_destroy(s);
        return st;
    }
    rb_session_leave(s); /* held since it was created: the pool may trim it now */
    *out = s;
    return RB_OK;
}

rb_status rb_session_unbind(rb_session *s)
{
    if (!s)
        return RB_E_INVALID_ARG;
    rb_session_enter(s);
    rb_status st = unbind_locked(s);
    rb_session_leave(s);
    return st;
}

static rb_status unbind_locked(rb_session *s)
{
    if (!s->file.file)
        return RB_OK;
    /* a restore without a forward pass: what is only in the file comes
       back, and what is damaged or missing becomes positions to recompute,
       as a feed would treat them */
    rb_status st = restore_all(s);
    if (st == RB_OK)
        rb_session_file_close(&s->file);
    return st;
}

rb_status rb_session_set_blob(rb_session *s, const void *data, size_t n)
{
    if (!s || (n && !data))
        return RB_E_INVALID_ARG;
    return rb_session_file_set_blob(&s->file, data, n);
}

const void *rb_session_get_blob(const rb_session *s, size_t *n)
{
    *n = s ? s->file.blob_n : 0;
    return s ? s->file.blob : NULL;
}

/* ---- the debug interface (session_debug.h) -------------------------------------- */

rb_kvcache *rb_session_kvcache(rb_session *s) { return &s->kv; }
size_t rb_session_debug_kv_valid(const rb_session *s) { return s->n_kv_valid; }
uint32_t rb_session_debug_recomputed_tokens(const rb_session *s) { return s->recomputed_tokens; }
void rb_session_debug_hold(rb_session *s) { rb_session_enter(s); }
void rb_session_debug_release(rb_session *s) { rb_session_leave(s); }
rb_residency *rb_session_debug_residency(rb_session *s) { return s->mem.res; }
rb_store *rb_session_debug_store(rb_session *s) { return s->mem.store; }

rb_status rb_session_debug_swap_store(rb_session *s, rb_store *store,
                                      const rb_residency_params *rp, rb_error *err)
{
    return rb_session_memory_swap_store(&s->mem, store, rp, err);
}

void rb_session_debug_set_file_os(rb_session *s, const struct rb_os *os) { s->file.os = os; }

size_t rb_session_debug_file_tokens_committed(const rb_session *s)
{
    return s->file.tokens_committed;
}

void rb_session_debug_wait_writer(rb_session *s) { rb_session_file_debug_wait(&s->file); }

void rb_session_debug_writer_stats(rb_session *s, rb_session_writer_stats *out)
{
    rb_session_file_debug_writer_stats(&s->file, out);
}

void rb_session_debug_handover(const rb_session *s, uint64_t *n, double *total_s,
                               double *max_s)
{
    *n = s->file.n_handover;
    *total_s = s->file.handover_s;
    *max_s = s->file.handover_max_s;
}
