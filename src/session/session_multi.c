/*
 * session_multi.c - rb_session_decode_multi: the next token of several
 * sessions of one model computed in one forward pass, so that each weight
 * is read from memory once per step for all of them (decode is bound by
 * that read: a step over 4 sessions costs little more than over one).
 *
 * Does: validates the set, runs each session's feed up to its new token
 * (session.c's steps: token checks, the restore begun or joined, positions
 * to recompute computed alone), then one rb_forward_multi over the new
 * tokens of the sessions that are ready, in groups of the pass's n_batch,
 * then finishes each feed (restore ended, token appended, logits kept,
 * file commit handed over, budget enforced). A session whose pass was
 * stopped by its memory manager or whose restore found damaged pages
 * carries on alone, as rb_session_feed would. Does not: sample, schedule
 * requests, or run sessions of different models together.
 *
 * The pass runs on the first ready session's forward state and thread
 * pool; each sequence reads its own KV cache, positions and layer gate
 * (forward.h). Its results are bit-identical to feeding each session
 * alone: every kernel computes a row by the same operations whatever the
 * number of rows (matmul_kernels.h), attention is per sequence.
 *
 * Threads: the call takes every session as a feed does (in address order);
 * a trim another thread posts to one of them stops the shared pass at a
 * layer boundary: that session serves it and goes on alone, the others
 * retry the step alone.
 *
 * Memory: one allocation per call: the feeds' state, the pass's sequence
 * table and its logits rows (n_batch x n_vocab floats at most), freed
 * before returning.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "residency.h"
#include "session_internal.h"
#include "status.h"
#include "threadpool.h"
#include "throttle.h"

/* Validates the set: every session once, one model, one thread count, no
 * weight streaming (its cache fetches blocks per session into the one
 * weight buffer). */
static rb_status check_set(rb_session **ss, const int32_t *tokens, size_t n, rb_error *err)
{
    if (!ss || !tokens)
        return rb_error_set(err, RB_E_INVALID_ARG, "decode_multi: sessions and tokens are "
                            "required");
    for (size_t i = 0; i < n; i++) {
        rb_session *s = ss[i];
        if (!s)
            return rb_error_set(err, RB_E_INVALID_ARG, "decode_multi: session %zu is NULL", i);
        for (size_t k = 0; k < i; k++)
            if (ss[k] == s)
                return rb_error_set(err, RB_E_INVALID_ARG, "decode_multi: sessions %zu and %zu "
                                    "are the same session (one token per session per step)",
                                    k, i);
        if (s->model != ss[0]->model)
            return rb_error_set(err, RB_E_INVALID_ARG, "decode_multi: session %zu is of model "
                                "'%s', session 0 of '%s': one pass runs one model", i,
                                rb_model_path(s->model), rb_model_path(ss[0]->model));
        if (rb_threadpool_n_threads(s->pool) != rb_threadpool_n_threads(ss[0]->pool))
            return rb_error_set(err, RB_E_INVALID_ARG, "decode_multi: session %zu has %d "
                                "threads, session 0 %d: the pass runs on one pool", i,
                                rb_threadpool_n_threads(s->pool),
                                rb_threadpool_n_threads(ss[0]->pool));
        if (s->mem.wstream != ss[0]->mem.wstream) /* one model: one shared stream, or none */
            return rb_error_set(err, RB_E_INVALID_ARG, "decode_multi: session %zu %s its "
                                "weights and session 0 %s: one pass reads them one way", i,
                                s->mem.wstream ? "streams" : "does not stream",
                                ss[0]->mem.wstream ? "does" : "does not");
    }
    return RB_OK;
}

/* One pass over the new tokens of ss[0..k) (their feeds ready): sets each
 * feed's st and stopped as rb_session_feed_run would. */
static void run_group(rb_session **ss, rb_feed **fd, size_t k, rb_forward_seq *seqs,
                      float *logits)
{
    rb_forward *f = NULL;
    uint32_t m = 0;
    for (size_t i = 0; i < k; i++) {
        rb_session *s = ss[i];
        fd[i]->stopped = 0;
        fd[i]->st = rb_kvcache_reserve(&s->kv, (uint32_t)(s->n_tokens + fd[i]->n - fd[i]->fed),
                                       &s->err);
        if (fd[i]->st != RB_OK)
            continue;
        rb_session_memory_set_pages(&s->mem, s->kv.n_pages_reserved);
        if (!f)
            f = &s->fwd;
        seqs[m] = (rb_forward_seq){.kv = &s->kv, .tokens = fd[i]->tokens + fd[i]->fed,
                                   .n = (uint32_t)(fd[i]->n - fd[i]->fed),
                                   .pos0 = (uint32_t)s->n_tokens,
                                   .layer_gate = s->fwd.layer_gate,
                                   .layer_gate_ctx = s->fwd.layer_gate_ctx,
                                   .rows_gate = s->fwd.rows_gate,
                                   .rows_gate_ctx = s->fwd.rows_gate_ctx};
        m++;
    }
    if (m == 0)
        return;
    const uint32_t n_vocab = f->hp.n_vocab;
    const double t0 = rb_throttle_now_s();
    const int rc = rb_forward_multi(f, seqs, m, logits);
    const double dt = rb_throttle_now_s() - t0;
    /* the shared stream's pass (every session's gate acquired each unit
       once: the stream's own; wcache_stream.h) */
    for (size_t i = 0; i < k; i++)
        rb_session_memory_pass_end(&ss[i]->mem);
    uint32_t j = 0;
    for (size_t i = 0; i < k; i++) {
        rb_session *s = ss[i];
        if (fd[i]->st != RB_OK)
            continue;
        const rb_forward_seq *sq = &seqs[j++];
        rb_session_memory_gate_release(&s->mem); /* the last layer its gate held */
        if (rc != 0) {
            fd[i]->stopped = 1;
            continue;
        }
        /* a model file cut under the pass: an error naming it (model.h) */
        if ((fd[i]->st = rb_model_check_mapping(s->model, &s->err)) != RB_OK)
            continue;
        if (sq->nonfinite_layer >= 0) {
            fd[i]->st = rb_session_nonfinite_error(s, sq->nonfinite_layer, sq->pos0 + sq->n - 1);
            continue;
        }
        memcpy(s->logits, logits + (size_t)(j - 1) * n_vocab, n_vocab * sizeof *logits);
        fd[i]->done_new = sq->n;
        rb_session_memory_release_window(&s->mem, sq->pos0 + sq->n, 1);
        if (s->params.progress &&
            s->params.progress(s->params.progress_ctx, RB_PROGRESS_FEED, sq->n, sq->n))
            rb_session_memory_abort(&s->mem); /* as a feed: stops at its next boundary */
        /* the split's compute estimate: the pass is what its restore races */
        if (fd[i]->fed == 0)
            rb_session_memory_note_compute(&s->mem, sq->n, dt);
    }
}

static int cmp_session(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)*(rb_session *const *)a, y = (uintptr_t)*(rb_session *const *)b;
    return x < y ? -1 : x > y;
}

static rb_status decode_locked(rb_session **sessions, const int32_t *tokens, size_t n,
                               rb_error *err);

/* Takes every session (as each public call does), in address order so
 * that two calls over overlapping sets cannot wait for each other. */
rb_status rb_session_decode_multi(rb_session **sessions, const int32_t *tokens, size_t n,
                                  rb_error *err)
{
    if (n == 0)
        return RB_OK;
    rb_status st = check_set(sessions, tokens, n, err);
    if (st != RB_OK)
        return st;
    rb_session **order = malloc(n * sizeof *order);
    if (!order)
        return rb_error_set(err, RB_E_NOMEM, "decode_multi: out of memory for %zu sessions", n);
    memcpy(order, sessions, n * sizeof *order);
    qsort(order, n, sizeof *order, cmp_session);
    for (size_t i = 0; i < n; i++)
        rb_session_enter(order[i]);
    st = decode_locked(sessions, tokens, n, err);
    for (size_t i = n; i-- > 0;)
        rb_session_leave(order[i]);
    free(order);
    return st;
}

static rb_status decode_locked(rb_session **sessions, const int32_t *tokens, size_t n,
                               rb_error *err)
{
    rb_status st = RB_OK;
    /* the largest group a pass takes: the smallest n_batch of the set, so
       that any session's forward state can run it */
    size_t group = n;
    for (size_t i = 0; i < n; i++)
        if (sessions[i]->fwd.n_batch < group)
            group = sessions[i]->fwd.n_batch;
    const size_t n_vocab = sessions[0]->fwd.hp.n_vocab;
    /* one block: feeds, the ready sessions and their feeds, the pass's
       sequences, each session's prepare status, the pass's logits */
    const size_t fd_b = n * sizeof(rb_feed), rdy_b = n * sizeof(rb_session *),
                 rfd_b = n * sizeof(rb_feed *), seq_b = group * sizeof(rb_forward_seq),
                 pst_b = n * sizeof(rb_status);
    uint8_t *mem = malloc(fd_b + rdy_b + rfd_b + seq_b + pst_b + group * n_vocab * sizeof(float));
    if (!mem)
        return rb_error_set(err, RB_E_NOMEM, "decode_multi: out of memory for %zu sessions", n);
    rb_feed *fd = (rb_feed *)mem;
    rb_session **ready = (rb_session **)(mem + fd_b);
    rb_feed **ready_fd = (rb_feed **)(mem + fd_b + rdy_b);
    rb_forward_seq *seqs = (rb_forward_seq *)(mem + fd_b + rdy_b + rfd_b);
    rb_status *pst = (rb_status *)(mem + fd_b + rdy_b + rfd_b + seq_b);
    float *logits = (float *)(mem + fd_b + rdy_b + rfd_b + seq_b + pst_b);
    /* 1. every token checked before any session changes */
    for (size_t i = 0; i < n && st == RB_OK; i++)
        if ((st = rb_session_feed_begin(sessions[i], &tokens[i], 1, NULL, &fd[i])) != RB_OK)
            rb_error_set(err, st, "decode_multi: session %zu: %s", i, sessions[i]->err.message);
    if (st != RB_OK) {
        free(mem);
        return st;
    }
    /* 2. each feed up to its new token (restores begun, what must be
       recomputed computed alone) */
    size_t n_ready = 0;
    for (size_t i = 0; i < n; i++) {
        pst[i] = rb_session_feed_prepare(sessions[i], &fd[i]);
        if (pst[i] == RB_OK && fd[i].ready) {
            ready[n_ready] = sessions[i];
            ready_fd[n_ready++] = &fd[i];
        }
    }
    /* 3. the new tokens of the ready ones, a pass per group */
    for (size_t i = 0; i < n_ready; i += group)
        run_group(ready + i, ready_fd + i, n_ready - i < group ? n_ready - i : group, seqs,
                  logits);
    /* 4. each feed finished in order; one that is not done (a stopped
       pass, damaged pages) carries on alone */
    for (size_t i = 0; i < n; i++) {
        rb_session *s = sessions[i];
        rb_status si = pst[i];
        if (si == RB_OK) {
            int done;
            si = rb_session_feed_finish(s, &fd[i], &done);
            if (!done)
                si = rb_session_feed_continue(s, &fd[i]);
        }
        if (si != RB_OK && st == RB_OK)
            st = rb_error_set(err, si, "decode_multi: session %zu: %s", i, s->err.message);
    }
    free(mem);
    return st;
}
