/*
 * test_wcache_stream.c - weight streaming under a budget, through real
 * sessions on generated models (separate and tied output):
 *   - logits bit-identical to a session with every weight in RAM, for
 *     class and lru, budgets from the minimum to more than the model,
 *     prefill in batches of 7 and single-token decode;
 *   - the cache never holds more than its budget; class reads about N - S
 *     per token and lru about N (the loop is larger than the cache);
 *   - a budget below the minimum fails with RB_E_BUDGET naming it;
 *   - under a memory budget the weights give up cache to the growing KV
 *     (re-balanced, still exact);
 *   - a complete trim drops the cache, the next token streams it back;
 *   - a model file that shrinks under the session fails the feed with an
 *     error naming the file, the tokens stay, and once the file is whole
 *     again the same feed gives the right logits.
 * Many sessions of one model stream from its one shared stream:
 *   - two and three sessions with different prompts, one thread alternating
 *     their tokens and one thread each at once, at the minimum budget and
 *     above: every session's logits bit-identical to it alone with every
 *     weight in RAM; the stream's RAM counted once;
 *   - a session closed while the others stream; a multi-sequence decode of
 *     streaming sessions; a file cut under two sessions (both fail naming
 *     it, both go on exactly once it is whole);
 *   - a session without a weights budget is refused while one streams, and
 *     the other way round, with a message naming the conflict.
 * And the two weight caches through their own interfaces, no session:
 * wcache releases a layer (its bytes leave RAM) and reloads it byte-equal;
 * wcache_stream at its minimum budget serves every unit in order with the
 * file's bytes while holding no more than its budget, and drops them all.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "gguf.h"
#include "model.h"
#include "session_debug.h"
#include "testlib.h"
#include "wcache.h"
#include "wcache_stream.h"

#define N_PROMPT 40
#define N_STEPS 8
#define V 512

static int32_t prompt[600], steps[N_STEPS];

static void make_model(const char *path, int tied)
{
    CHECK_EQ_INT(rb_test_make_model(path, &(rb_test_model_spec){
                                              .n_embd = 128, .n_layers = 4, .n_head = 4,
                                              .n_head_kv = 2, .n_ff = 384, .n_vocab = V,
                                              .n_ctx = 1024, .is_tied_output = tied,
                                              .seed = 11}),
                 RB_OK);
}

/* The bytes of every tensor of blk.<layer> (layer < 0: all tensors) of a
 * loaded model equal those of ref. */
static int layer_equal(const rb_model *m, const rb_model *ref, int layer)
{
    const rb_gguf *g = rb_model_gguf(m);
    char prefix[32];
    snprintf(prefix, sizeof prefix, "blk.%d.", layer);
    int same = 1;
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        if (layer >= 0 && strncmp(t->name, prefix, strlen(prefix)) != 0)
            continue;
        const void *a = rb_model_tensor_data(m, t);
        const void *b = rb_model_tensor_data(ref, rb_gguf_tensor_at(rb_model_gguf(ref), i));
        same &= a && b && memcmp(a, b, t->n_bytes) == 0;
    }
    return same;
}

static void unit_test(const char *path)
{
    rb_model *m = NULL, *ref = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    CHECK_EQ_INT(rb_model_open(path, NULL, &ref, &err), RB_OK);
    if (!m || !ref)
        goto done;
    CHECK_EQ_INT(rb_model_load_weights(m), RB_OK);
    CHECK_EQ_INT(rb_model_load_weights(ref), RB_OK);

    rb_wcache *w = NULL;
    CHECK_EQ_INT(rb_wcache_create(m, path, NULL, &w, &err), RB_OK);
    if (w) {
        uint64_t all = rb_wcache_resident_bytes(w), lb = rb_wcache_layer_bytes(w, 1);
        CHECK(lb > 0 && all == rb_wcache_total_bytes(w));
        /* a layer a forward pass uses stays */
        CHECK_EQ_INT(rb_wcache_use(w, 1, NULL, &err), RB_OK);
        CHECK_EQ_INT(rb_wcache_release(w, 1), 0);
        CHECK(rb_wcache_is_resident(w, 1));
        rb_wcache_unuse(w, 1);
        CHECK_EQ_INT(rb_wcache_release(w, 1), 1);
        CHECK_EQ_INT(rb_wcache_release(w, 1), 0); /* released already */
        CHECK(!rb_wcache_is_resident(w, 1) && rb_wcache_is_resident(w, 0));
        CHECK_EQ_U64(rb_wcache_resident_bytes(w), all - lb);
        CHECK(!layer_equal(m, ref, 1)); /* the released pages read as zero */
        CHECK_EQ_INT(rb_wcache_reload(w, 1, NULL, &err), RB_OK);
        CHECK(rb_wcache_is_resident(w, 1));
        CHECK_EQ_U64(rb_wcache_resident_bytes(w), all);
        CHECK(layer_equal(m, ref, -1));
        /* use of a released layer reads it first */
        CHECK_EQ_INT(rb_wcache_release(w, 2), 1);
        CHECK_EQ_INT(rb_wcache_use(w, 2, NULL, &err), RB_OK);
        CHECK(rb_wcache_is_resident(w, 2) && layer_equal(m, ref, -1));
        rb_wcache_unuse(w, 2);
        rb_wcache_destroy(w);
    }
    rb_model_close(m);
    m = NULL;

    /* a lazy load reads nothing and says so; from then on the cache alone
       knows what is read: the layers (its reloads) and the rest (once).
       Without the SIGBUS guard the buffer is anonymous memory, never the
       file's mapping; what it holds before a read is whatever the
       allocator gave (the previous model's freed pages, possibly), so the
       test poisons the embeddings before the read */
    rb_model_params lazy_p = rb_model_default_params();
    lazy_p.sigbus_guard = 0;
    CHECK_EQ_INT(rb_model_open(path, &lazy_p, &m, &err), RB_OK);
    if (!m)
        goto done;
    CHECK_EQ_INT(rb_model_reserve_weights(m, 0), RB_OK);
    CHECK_EQ_INT(rb_model_weights_load(m), RB_WEIGHTS_RESERVED);
    CHECK_EQ_INT(rb_model_load_weights_lazy(m), RB_OK);
    CHECK_EQ_INT(rb_model_weights_load(m), RB_WEIGHTS_LAZY);
    w = NULL;
    CHECK_EQ_INT(rb_wcache_create(m, path, NULL, &w, &err), RB_OK);
    if (w) {
        CHECK_EQ_INT(rb_wcache_mark_unread(w, &err), RB_OK);
        CHECK(!rb_wcache_is_resident(w, 0));
        const rb_gguf_tensor *emb = rb_gguf_find_tensor(rb_model_gguf(m), "token_embd.weight");
        const rb_gguf_tensor *emb_ref = rb_gguf_find_tensor(rb_model_gguf(ref),
                                                            "token_embd.weight");
        CHECK(emb && emb_ref);
        if (emb && emb_ref) {
            memset((void *)rb_model_tensor_data(m, emb), 0xa5, emb->n_bytes);
            CHECK_EQ_INT(rb_wcache_read_rest(w, NULL, &err), RB_OK);
            CHECK(memcmp(rb_model_tensor_data(m, emb), rb_model_tensor_data(ref, emb_ref),
                         emb->n_bytes) == 0);
            /* read once: a second call reads nothing (the bytes changed
               here stay as they are) */
            uint8_t *e0 = (uint8_t *)rb_model_tensor_data(m, emb);
            e0[0] ^= 0xff;
            CHECK_EQ_INT(rb_wcache_read_rest(w, NULL, &err), RB_OK);
            CHECK(e0[0] != ((const uint8_t *)rb_model_tensor_data(ref, emb_ref))[0]);
            e0[0] ^= 0xff;
        }
        for (uint32_t l = 0; l < rb_wcache_n_layers(w); l++)
            CHECK_EQ_INT(rb_wcache_reload(w, l, NULL, &err), RB_OK);
        CHECK(layer_equal(m, ref, -1));
        CHECK_EQ_INT(rb_model_weights_load(m), RB_WEIGHTS_LAZY); /* the model's record: its load */
        rb_wcache_destroy(w);
    }
    rb_model_close(m);
    m = NULL;

    /* streaming at its minimum budget */
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    if (!m)
        goto done;
    CHECK_EQ_INT(rb_model_reserve_weights(m, 0), RB_OK);
    uint64_t min_budget = 0;
    rb_wcache_stream_params sp = {.budget_bytes = 1, .min_budget_out = &min_budget};
    rb_wcache_stream *ws = NULL;
    CHECK_EQ_INT(rb_wcache_stream_create(m, path, NULL, NULL, &sp, &ws, &err), RB_E_BUDGET);
    CHECK(min_budget > 0);
    sp.budget_bytes = min_budget;
    CHECK_EQ_INT(rb_wcache_stream_create(m, path, NULL, NULL, &sp, &ws, &err), RB_OK);
    if (ws) {
        const uint32_t L = 4;
        for (int pass = 0; pass < 2; pass++)
            for (uint32_t u = 0; u <= L; u++) {
                CHECK_EQ_INT(rb_wcache_stream_acquire(ws, u), 0);
                if (u < L)
                    CHECK(layer_equal(m, ref, (int)u));
            }
        rb_wcache_stream_stats st;
        rb_wcache_stream_get_stats(ws, &st);
        CHECK(st.max_resident_bytes <= st.budget_bytes);
        CHECK(st.read_bytes > 0 && st.n_passes == 2);
        uint64_t before = st.resident_bytes, freed = rb_wcache_stream_drop(ws);
        rb_wcache_stream_get_stats(ws, &st);
        CHECK(freed > 0 && st.resident_bytes + freed == before);
        CHECK(st.resident_bytes * 8 < before); /* nearly all of it goes */
        rb_wcache_stream_destroy(ws);
    }
done:
    rb_model_close(m);
    rb_model_close(ref);
}

static rb_session_params params(uint64_t weights_budget, const char *policy)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 1024;
    p.n_threads = 2;
    p.n_batch = 7;
    p.weights_budget_bytes = weights_budget;
    p.weights_policy = policy;
    return p;
}

/* prompt (N_PROMPT) then N_STEPS single tokens; each step's logits into out.
 * Returns the session (for its stats) or NULL when creation failed. */
static rb_session_stats after_prompt; /* the last run's stats after its prompt */

static rb_session *run(rb_model *m, const rb_session_params *p, float *out, rb_error *err)
{
    rb_session *s = NULL;
    if (rb_session_create(m, p, &s, err) != RB_OK)
        return NULL;
    CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
    rb_session_get_stats(s, &after_prompt);
    for (int i = 0; i < N_STEPS; i++) {
        rb_status st = rb_session_feed(s, &steps[i], 1, NULL);
        CHECK_EQ_INT(st, RB_OK);
        if (st != RB_OK) {
            fprintf(stderr, "feed: %s\n", rb_session_errmsg(s));
            break;
        }
        memcpy(out + (size_t)i * V, rb_session_get_logits(s), V * sizeof(float));
    }
    return s;
}

static uint64_t weight_bytes(rb_model *m)
{
    rb_model_info mi;
    rb_model_get_info(m, &mi);
    return mi.tensor_data_bytes;
}

static rb_model *open_model(const char *path)
{
    rb_model *m = NULL;
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    CHECK_EQ_INT(rb_model_open(path, &mp, &m, &err), RB_OK);
    return m;
}

static void test_exact_and_reads(const char *path)
{
    rb_error err;
    rb_model *m = open_model(path);
    if (!m)
        return;
    uint64_t W = weight_bytes(m);
    float *ref = malloc(sizeof(float) * V * N_STEPS), *got = malloc(sizeof(float) * V * N_STEPS);
    rb_session_params p0 = params(0, NULL);
    rb_session *s = run(m, &p0, ref, &err);
    CHECK(s != NULL);
    rb_session_destroy(s);

    /* the minimum: ask for 1 byte, read it back from the error */
    rb_session_params tiny = params(1, "class");
    CHECK_EQ_INT(rb_session_create(m, &tiny, &s, &err), RB_E_BUDGET);
    CHECK(strstr(err.message, "minimum") != NULL);
    const char *mn = strstr(err.message, "minimum of ");
    uint64_t min = mn ? strtoull(mn + 11, NULL, 10) : 0;
    CHECK(min > 0 && min < W);
    fprintf(stderr, "weights %llu bytes, minimum budget %llu: %s\n", (unsigned long long)W,
            (unsigned long long)min, err.message);
    rb_session_params below = params(min - 4096, "lru");
    CHECK_EQ_INT(rb_session_create(m, &below, &s, &err), RB_E_BUDGET);

    const char *policies[] = {"class", "lru"};
    uint64_t budgets[] = {min, W / 2 > min ? W / 2 : min + 8192, W * 3 / 4, W * 2};
    double per_token[2][4] = {{0}};
    for (int pi = 0; pi < 2; pi++)
        for (int bi = 0; bi < 4; bi++) {
            rb_session_params p = params(budgets[bi], policies[pi]);
            memset(got, 0, sizeof(float) * V * N_STEPS);
            s = run(m, &p, got, &err);
            CHECK(s != NULL);
            if (!s) {
                fprintf(stderr, "%s at %llu: %s\n", policies[pi],
                        (unsigned long long)budgets[bi], err.message);
                continue;
            }
            CHECK(memcmp(ref, got, sizeof(float) * V * N_STEPS) == 0);
            rb_session_stats st;
            rb_session_get_stats(s, &st);
            CHECK_EQ_INT(st.weights_streaming, 1);
            CHECK(st.weights_max_resident_bytes <= st.weights_budget_bytes);
            CHECK(st.weights_bytes <= st.weights_budget_bytes);
            CHECK(st.weights_loop_bytes > 0 && st.weights_loop_bytes <= W);
            /* the single-token steps' reads (a prompt batch also reads its
               tokens' embedding rows) */
            uint64_t passes = st.weights_passes - after_prompt.weights_passes;
            per_token[pi][bi] = passes ? (double)(st.weights_read_bytes -
                                                  after_prompt.weights_read_bytes) / passes : 0;
            fprintf(stderr, "%s budget %llu: S %llu, N %llu, read %.0f per pass (%llu passes), "
                    "most held %llu\n", policies[pi], (unsigned long long)budgets[bi],
                    (unsigned long long)st.weights_pinned_loop_bytes,
                    (unsigned long long)st.weights_loop_bytes, per_token[pi][bi],
                    (unsigned long long)passes,
                    (unsigned long long)st.weights_max_resident_bytes);
            if (budgets[bi] < st.weights_loop_bytes) {
                double n = (double)st.weights_loop_bytes;
                if (pi == 0) /* class: N - S, with a little for shared boundary blocks */
                    CHECK(per_token[pi][bi] <= 1.1 * (n - (double)st.weights_pinned_loop_bytes));
                else /* lru: the whole loop, every token */
                    CHECK(per_token[pi][bi] >= 0.9 * n);
            }
            if (budgets[bi] >= W) { /* everything fits: nothing is read twice */
                rb_model_info mi;
                rb_model_get_info(m, &mi);
                CHECK(st.weights_read_bytes <= mi.file_bytes);
                if (st.weights_read_bytes > mi.file_bytes)
                    fprintf(stderr, "read %llu of a %llu-byte file, %llu reads, misses %llu\n", (unsigned long long)st.weights_read_bytes, (unsigned long long)mi.file_bytes, (unsigned long long)st.weights_reads, (unsigned long long)st.weights_misses);
                CHECK_EQ_U64(st.weights_pinned_loop_bytes, st.weights_loop_bytes);
                CHECK(per_token[pi][bi] == 0);
            }
            rb_session_destroy(s);
        }
    CHECK(per_token[0][1] < per_token[1][1]); /* at half the model class reads less */

    /* a complete trim drops the cache; the next tokens stream it back */
    rb_session_params p = params(W / 2 > min ? W / 2 : min, "class");
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
    for (int i = 0; i < N_STEPS && s; i++) {
        if (i == 3) {
            rb_session_stats a, b;
            rb_session_get_stats(s, &a);
            uint64_t freed = 0;
            CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, &freed), RB_OK);
            rb_session_get_stats(s, &b);
            CHECK(b.weights_bytes < a.weights_bytes / 4);
            CHECK(freed >= a.weights_bytes - b.weights_bytes);
        }
        CHECK_EQ_INT(rb_session_feed(s, &steps[i], 1, NULL), RB_OK);
        CHECK(memcmp(rb_session_get_logits(s), ref + (size_t)i * V, V * sizeof(float)) == 0);
    }
    rb_session_destroy(s);

    /* a non-streaming session after the streaming ones reads the weights again */
    s = run(m, &p0, got, &err);
    CHECK(s != NULL);
    CHECK(memcmp(ref, got, sizeof(float) * V * N_STEPS) == 0);
    rb_session_destroy(s);
    free(ref);
    free(got);
    rb_model_close(m);
}

/* A memory budget below the weights: streaming, and the KV's growth over
 * 600 tokens (3 pages) takes cache from the weights. */
static void test_mem_budget(const char *path)
{
    rb_error err;
    rb_model *m = open_model(path);
    if (!m)
        return;
    uint64_t W = weight_bytes(m);
    rb_session_params p = params(0, NULL);
    p.n_batch = 128;
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, prompt, 600, NULL), RB_OK);
    float *ref = malloc(V * sizeof(float));
    memcpy(ref, rb_session_get_logits(s), V * sizeof(float));
    rb_session_stats full;
    rb_session_get_stats(s, &full);
    rb_session_destroy(s);

    /* room for 90% of the weights beside the run state at the start; the
       3 pages of KV then take most of it, down to the weights' minimum
       plus 64 KiB */
    p.budget_bytes = full.scratch_bytes + full.other_bytes + W * 9 / 10;
    rb_session_params q = params(1, NULL);
    CHECK_EQ_INT(rb_session_create(m, &q, &s, &err), RB_E_BUDGET);
    const char *mn = strstr(err.message, "minimum of ");
    uint64_t min = mn ? strtoull(mn + 11, NULL, 10) : 0;
    if (full.kv_raw_bytes + min + 65536 > W * 9 / 10)
        p.budget_bytes = full.scratch_bytes + full.other_bytes + full.kv_raw_bytes + min + 65536;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s) {
        fprintf(stderr, "mem budget: %s\n", err.message);
        free(ref);
        rb_model_close(m);
        return;
    }
    rb_session_stats a, b;
    rb_session_get_stats(s, &a);
    CHECK_EQ_INT(a.weights_streaming, 1);
    for (int i = 0; i < 600; i += 100) {
        CHECK_EQ_INT(rb_session_feed(s, prompt + i, 100, NULL), RB_OK);
        rb_session_stats c;
        rb_session_get_stats(s, &c);
        fprintf(stderr, "  after %d tokens: weights %llu of %llu, KV %llu, total %llu\n", i + 100,
                (unsigned long long)c.weights_bytes, (unsigned long long)c.weights_budget_bytes,
                (unsigned long long)c.kv_raw_bytes, (unsigned long long)c.total_bytes);
    }
    CHECK(memcmp(rb_session_get_logits(s), ref, V * sizeof(float)) == 0);
    rb_session_get_stats(s, &b);
    fprintf(stderr, "mem budget %llu: weights budget %llu -> %llu (%llu rebalances), KV %llu, "
            "total %llu\n", (unsigned long long)p.budget_bytes,
            (unsigned long long)a.weights_budget_bytes, (unsigned long long)b.weights_budget_bytes,
            (unsigned long long)b.weights_rebalances, (unsigned long long)b.kv_raw_bytes,
            (unsigned long long)b.total_bytes);
    CHECK(b.weights_rebalances >= 1);
    CHECK(b.weights_budget_bytes < a.weights_budget_bytes);
    CHECK(b.weights_given_up_bytes > 0);
    CHECK(b.total_bytes <= p.budget_bytes + p.budget_bytes / 20);
    CHECK(b.weights_budget_bytes >= min);
    CHECK_EQ_U64(b.kv_raw_bytes, full.kv_raw_bytes); /* the KV fit: nothing trimmed */
    rb_session_destroy(s);
    free(ref);
    rb_model_close(m);
}

/* A streaming session in an app's pool is in the pool like any other:
 * its weights get what the pool's budget leaves after its run state and
 * KV (the stream's own weights_budget_bytes is only a cap). It used to
 * keep its own budget whatever the pool's was. */
static void test_pool_budget(const char *path)
{
    rb_error err;
    rb_model *m = open_model(path);
    if (!m)
        return;
    uint64_t W = weight_bytes(m);
    rb_session_params p = params(W, NULL); /* streams, all of the weights allowed */
    p.n_batch = 128;
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s) {
        rb_model_close(m);
        return;
    }
    CHECK_EQ_INT(rb_session_feed(s, prompt, 300, NULL), RB_OK);
    float *ref = malloc(V * sizeof(float));
    memcpy(ref, rb_session_get_logits(s), V * sizeof(float));
    rb_session_stats full;
    rb_session_get_stats(s, &full);
    rb_session_destroy(s);
    CHECK_EQ_INT(full.weights_streaming, 1);

    /* the pool: the run state, the KV and 70% of the weights */
    uint64_t budget = full.scratch_bytes + full.other_bytes + full.kv_raw_bytes + W * 7 / 10;
    rb_pool *pool = NULL;
    CHECK_EQ_INT(rb_pool_create(m, budget, &pool, &err), RB_OK);
    p.pool = pool;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (s) {
        CHECK_EQ_INT(rb_session_feed(s, prompt, 300, NULL), RB_OK);
        CHECK(memcmp(rb_session_get_logits(s), ref, V * sizeof(float)) == 0);
        rb_session_stats b;
        rb_session_get_stats(s, &b);
        fprintf(stderr, "stream in a pool of %llu: weights budget %llu of %llu, total %llu\n",
                (unsigned long long)budget, (unsigned long long)b.weights_budget_bytes,
                (unsigned long long)W, (unsigned long long)b.total_bytes);
        CHECK(b.weights_budget_bytes <= W * 7 / 10 + W / 50);
        CHECK(b.total_bytes <= budget + budget / 20);
        CHECK_EQ_U64(b.kv_raw_bytes, full.kv_raw_bytes); /* the KV fit: nothing trimmed */
        rb_session_destroy(s);
    }
    /* two streaming sessions in one pool: one cache, counted once; each
       session exact */
    uint64_t budget2 = 2 * (full.scratch_bytes + full.other_bytes + full.kv_raw_bytes) +
                       W * 7 / 10;
    rb_pool *pool2 = NULL;
    CHECK_EQ_INT(rb_pool_create(m, budget2, &pool2, &err), RB_OK);
    p.pool = pool2;
    rb_session *s2[2] = {0};
    CHECK_EQ_INT(rb_session_create(m, &p, &s2[0], &err), RB_OK);
    CHECK_EQ_INT(rb_session_create(m, &p, &s2[1], &err), RB_OK);
    if (s2[0] && s2[1]) {
        for (int i = 0; i < 2; i++) {
            CHECK_EQ_INT(rb_session_feed(s2[i], prompt, 300, NULL), RB_OK);
            CHECK(memcmp(rb_session_get_logits(s2[i]), ref, V * sizeof(float)) == 0);
        }
        rb_session_stats b0, b1;
        rb_session_get_stats(s2[0], &b0);
        rb_session_get_stats(s2[1], &b1);
        rb_pool_stats ps;
        rb_pool_get_stats(pool2, &ps);
        fprintf(stderr, "two streams in a pool of %llu: weights budget %llu, pool total %llu\n",
                (unsigned long long)budget2, (unsigned long long)b0.weights_budget_bytes,
                (unsigned long long)ps.total_bytes);
        CHECK_EQ_U64(b0.weights_budget_bytes, b1.weights_budget_bytes);
        /* not shrunk by counting it twice (the pool takes the idle
           session's KV before the weights) */
        CHECK(b0.weights_budget_bytes >= W / 2);
        CHECK(ps.total_bytes <= budget2 + budget2 / 20);
    }
    rb_session_destroy(s2[0]);
    rb_session_destroy(s2[1]);
    rb_pool_destroy(pool2);
    rb_pool_destroy(pool);
    free(ref);
    rb_model_close(m);
}

static int copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    char buf[65536];
    size_t n;
    int ok = a && b;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0)
        ok = fwrite(buf, 1, n, b) == n;
    if (a)
        fclose(a);
    if (b && fclose(b) != 0)
        ok = 0;
    return ok ? 0 : -1;
}

/* The model file loses its second half under a streaming session. */
static void test_file_shrinks(const char *path)
{
    char copy[600];
    snprintf(copy, sizeof copy, "%s.copy", path);
    CHECK_EQ_INT(copy_file(path, copy), 0);
    rb_error err;
    rb_model *m = open_model(copy);
    if (!m)
        return;
    uint64_t W = weight_bytes(m);
    float *ref = malloc(sizeof(float) * V * N_STEPS);
    rb_session_params p0 = params(0, NULL);
    rb_session *s = run(m, &p0, ref, &err);
    rb_session_destroy(s);

    rb_session_params p = params(W / 2, "class");
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
    off_t size = 0;
    FILE *f = fopen(copy, "rb");
    if (f) {
        fseek(f, 0, SEEK_END);
        size = ftell(f);
        fclose(f);
    }
    CHECK_EQ_INT(truncate(copy, size / 2), 0);
    rb_status st = rb_session_feed(s, &steps[0], 1, NULL);
    CHECK(st == RB_E_SHORT_READ || st == RB_E_IO);
    CHECK(strstr(rb_session_errmsg(s), copy) != NULL);
    fprintf(stderr, "file cut: %s\n", rb_session_errmsg(s));
    CHECK_EQ_INT(rb_session_n_tokens(s), N_PROMPT); /* nothing was fed */
    CHECK_EQ_INT(copy_file(path, copy), 0);
    for (int i = 0; i < N_STEPS; i++) {
        CHECK_EQ_INT(rb_session_feed(s, &steps[i], 1, NULL), RB_OK);
        CHECK(memcmp(rb_session_get_logits(s), ref + (size_t)i * V, V * sizeof(float)) == 0);
    }
    rb_session_destroy(s);
    free(ref);
    rb_model_close(m);
    unlink(copy);
}


/* ---- many sessions, one stream ---------------------------------------------- */

#define N_SESS 3

/* session i's prompt and steps: different tokens per session */
static int32_t sprompt[N_SESS][N_PROMPT], ssteps[N_SESS][N_STEPS];
static float *sref[N_SESS]; /* [N_STEPS][V] each, weights fully resident */

static void shared_inputs(void)
{
    for (int i = 0; i < N_SESS; i++) {
        for (int t = 0; t < N_PROMPT; t++)
            sprompt[i][t] = (int32_t)((t * 7919u + 3 + 101u * i) % V);
        for (int t = 0; t < N_STEPS; t++)
            ssteps[i][t] = (int32_t)((t * 104729u + 11 + 37u * i) % V);
    }
}

/* one step of session i: the prompt at step -1, else its step-th token;
   the logits compared with the resident reference */
static int sess_step(rb_session *s, int i, int step)
{
    rb_status st = step < 0 ? rb_session_feed(s, sprompt[i], N_PROMPT, NULL)
                            : rb_session_feed(s, &ssteps[i][step], 1, NULL);
    if (st != RB_OK) {
        fprintf(stderr, "session %d step %d: %s\n", i, step, rb_session_errmsg(s));
        return 0;
    }
    if (step < 0)
        return 1;
    if (!sref[i]) { /* the reference run itself */
        return 1;
    }
    return memcmp(rb_session_get_logits(s), sref[i] + (size_t)step * V, V * sizeof(float)) == 0;
}

static void shared_refs(rb_model *m)
{
    rb_error err;
    for (int i = 0; i < N_SESS; i++) {
        rb_session_params p = params(0, NULL);
        rb_session *s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
        if (!s)
            continue;
        float *r = malloc(sizeof(float) * V * N_STEPS);
        CHECK_EQ_INT(rb_session_feed(s, sprompt[i], N_PROMPT, NULL), RB_OK);
        for (int t = 0; t < N_STEPS; t++) {
            CHECK_EQ_INT(rb_session_feed(s, &ssteps[i][t], 1, NULL), RB_OK);
            memcpy(r + (size_t)t * V, rb_session_get_logits(s), V * sizeof(float));
        }
        rb_session_destroy(s);
        sref[i] = r;
    }
}

typedef struct {
    rb_session *s;
    int i, ok;
} sess_job;

static void *sess_thread(void *arg)
{
    sess_job *j = arg;
    j->ok = sess_step(j->s, j->i, -1);
    for (int t = 0; t < N_STEPS && j->ok; t++)
        j->ok = sess_step(j->s, j->i, t);
    return NULL;
}

static void test_shared(const char *path)
{
    rb_error err;
    rb_model *m = open_model(path);
    if (!m)
        return;
    uint64_t W = weight_bytes(m);
    shared_refs(m);
    /* the minimum, from the error of a budget of 1 byte */
    rb_session *s[N_SESS] = {0};
    rb_session_params tiny = params(1, "class");
    CHECK_EQ_INT(rb_session_create(m, &tiny, &s[0], &err), RB_E_BUDGET);
    const char *mn = strstr(err.message, "minimum of ");
    uint64_t min = mn ? strtoull(mn + 11, NULL, 10) : 0;
    CHECK(min > 0 && min < W);
    uint64_t budgets[] = {min, W / 2 > min ? W / 2 : min + 8192, W * 2};
    for (int bi = 0; bi < 3; bi++)
        for (int n = 2; n <= N_SESS; n++) {
            /* one thread alternating: prompts, then one token each in turn;
               with three sessions, session 0 closes half-way */
            rb_session_params p = params(budgets[bi], "class");
            int ok = 1;
            for (int i = 0; i < n; i++) {
                CHECK_EQ_INT(rb_session_create(m, &p, &s[i], &err), RB_OK);
                ok &= s[i] != NULL;
            }
            if (!ok) {
                fprintf(stderr, "shared at %llu: %s\n", (unsigned long long)budgets[bi],
                        err.message);
                for (int i = 0; i < n; i++)
                    rb_session_destroy(s[i]), s[i] = NULL;
                continue;
            }
            for (int i = 0; i < n; i++)
                CHECK(sess_step(s[i], i, -1));
            for (int t = 0; t < N_STEPS; t++) {
                if (n == 3 && t == N_STEPS / 2) {
                    rb_session_destroy(s[0]);
                    s[0] = NULL;
                }
                for (int i = 0; i < n; i++)
                    if (s[i])
                        CHECK(sess_step(s[i], i, t));
            }
            /* one stream: the same figures seen from every session; its
               RAM counted in one session's accounts */
            rb_session_stats a, b;
            rb_session_get_stats(s[1], &a);
            rb_session_get_stats(s[n - 1], &b);
            CHECK_EQ_INT(a.weights_streaming, 1);
            /* (the worker may still read ahead between the two calls) */
            CHECK_EQ_U64(a.weights_passes, b.weights_passes);
            CHECK(b.weights_read_bytes >= a.weights_read_bytes);
            CHECK_EQ_U64(a.weights_budget_bytes, b.weights_budget_bytes);
            CHECK(a.weights_max_resident_bytes <= a.weights_budget_bytes);
            CHECK(a.weights_passes >= (uint64_t)(n - 1) * N_STEPS);
            fprintf(stderr, "shared x%d at %llu: read %llu, passes %llu, most held %llu\n", n,
                    (unsigned long long)budgets[bi], (unsigned long long)a.weights_read_bytes,
                    (unsigned long long)a.weights_passes,
                    (unsigned long long)a.weights_max_resident_bytes);
            for (int i = 0; i < n; i++)
                rb_session_destroy(s[i]), s[i] = NULL;

            /* one thread per session, at once */
            pthread_t th[N_SESS];
            sess_job jobs[N_SESS];
            for (int i = 0; i < n; i++) {
                CHECK_EQ_INT(rb_session_create(m, &p, &s[i], &err), RB_OK);
                jobs[i] = (sess_job){.s = s[i], .i = i};
            }
            for (int i = 0; i < n; i++)
                CHECK_EQ_INT(pthread_create(&th[i], NULL, sess_thread, &jobs[i]), 0);
            for (int i = 0; i < n; i++) {
                pthread_join(th[i], NULL);
                CHECK(jobs[i].ok);
            }
            for (int i = 0; i < n; i++)
                rb_session_destroy(s[i]), s[i] = NULL;
        }

    /* a session closed on its thread while another streams on its own */
    {
        rb_session_params p = params(budgets[1], "class");
        CHECK_EQ_INT(rb_session_create(m, &p, &s[0], &err), RB_OK);
        CHECK_EQ_INT(rb_session_create(m, &p, &s[1], &err), RB_OK);
        sess_job j = {.s = s[1], .i = 1};
        pthread_t th;
        CHECK_EQ_INT(pthread_create(&th, NULL, sess_thread, &j), 0);
        CHECK(sess_step(s[0], 0, -1));
        CHECK(sess_step(s[0], 0, 0));
        rb_session_destroy(s[0]);
        s[0] = NULL;
        pthread_join(th, NULL);
        CHECK(j.ok);
        rb_session_destroy(s[1]);
        s[1] = NULL;
    }

    /* a multi-sequence decode of two streaming sessions: one pass, each
       unit acquired once, the logits as alone */
    {
        rb_session_params p = params(budgets[0], "class");
        CHECK_EQ_INT(rb_session_create(m, &p, &s[0], &err), RB_OK);
        CHECK_EQ_INT(rb_session_create(m, &p, &s[1], &err), RB_OK);
        if (s[0] && s[1]) {
            CHECK(sess_step(s[0], 0, -1));
            CHECK(sess_step(s[1], 1, -1));
            rb_session_stats a0, a1;
            rb_session_get_stats(s[0], &a0);
            for (int t = 0; t < N_STEPS; t++) {
                int32_t toks[2] = {ssteps[0][t], ssteps[1][t]};
                CHECK_EQ_INT(rb_session_decode_multi(s, toks, 2, &err), RB_OK);
                for (int i = 0; i < 2; i++)
                    CHECK(memcmp(rb_session_get_logits(s[i]), sref[i] + (size_t)t * V,
                                 V * sizeof(float)) == 0);
            }
            rb_session_get_stats(s[0], &a1);
            CHECK_EQ_U64(a1.weights_passes - a0.weights_passes, N_STEPS); /* one per step */
        }
        rb_session_destroy(s[0]);
        rb_session_destroy(s[1]);
        s[0] = s[1] = NULL;
    }

    /* streaming and resident at once: refused, naming the conflict */
    {
        rb_session_params ps = params(budgets[1], "class"), pr = params(0, NULL);
        CHECK_EQ_INT(rb_session_create(m, &ps, &s[0], &err), RB_OK);
        CHECK_EQ_INT(rb_session_create(m, &pr, &s[1], &err), RB_E_INVALID_ARG);
        CHECK(strstr(err.message, "weights budget") != NULL);
        fprintf(stderr, "mixed: %s\n", err.message);
        CHECK(sess_step(s[0], 0, -1)); /* the streaming one is unharmed */
        CHECK(sess_step(s[0], 0, 0));
        rb_session_destroy(s[0]);
        CHECK_EQ_INT(rb_session_create(m, &pr, &s[1], &err), RB_OK);
        CHECK_EQ_INT(rb_session_create(m, &ps, &s[0], &err), RB_E_INVALID_ARG);
        CHECK(strstr(err.message, "weights budget") != NULL);
        CHECK(sess_step(s[1], 1, -1));
        CHECK(sess_step(s[1], 1, 0));
        rb_session_destroy(s[1]);
        s[0] = s[1] = NULL;
    }
    rb_model_close(m);
}

/* A file cut under two streaming sessions: both feeds fail naming the
 * file, nothing is fed; once it is whole both go on exactly. */
static void test_shared_io_error(const char *path)
{
    char copy[600];
    snprintf(copy, sizeof copy, "%s.copy2", path);
    CHECK_EQ_INT(copy_file(path, copy), 0);
    rb_error err;
    rb_model *m = open_model(copy);
    if (!m)
        return;
    uint64_t W = weight_bytes(m);
    rb_session_params p = params(W / 2, "class");
    rb_session *s[2] = {0};
    CHECK_EQ_INT(rb_session_create(m, &p, &s[0], &err), RB_OK);
    CHECK_EQ_INT(rb_session_create(m, &p, &s[1], &err), RB_OK);
    if (s[0] && s[1]) {
        CHECK(sess_step(s[0], 0, -1));
        CHECK(sess_step(s[1], 1, -1));
        FILE *f = fopen(copy, "rb");
        off_t size = 0;
        if (f) {
            fseek(f, 0, SEEK_END);
            size = ftell(f);
            fclose(f);
        }
        CHECK_EQ_INT(truncate(copy, size / 2), 0);
        for (int i = 0; i < 2; i++) {
            rb_status st = rb_session_feed(s[i], &ssteps[i][0], 1, NULL);
            CHECK(st == RB_E_SHORT_READ || st == RB_E_IO);
            CHECK(strstr(rb_session_errmsg(s[i]), copy) != NULL);
            CHECK_EQ_INT(rb_session_n_tokens(s[i]), N_PROMPT);
        }
        CHECK_EQ_INT(copy_file(path, copy), 0);
        for (int t = 0; t < N_STEPS; t++)
            for (int i = 0; i < 2; i++)
                CHECK(sess_step(s[i], i, t));
    }
    rb_session_destroy(s[0]);
    rb_session_destroy(s[1]);
    rb_model_close(m);
    unlink(copy);
}

int main(void)
{
    for (int i = 0; i < 600; i++)
        prompt[i] = (int32_t)((i * 7919u + 3) % V);
    for (int i = 0; i < N_STEPS; i++)
        steps[i] = (int32_t)((i * 104729u + 11) % V);
    char sep[512], tied[512];
    snprintf(sep, sizeof sep, "%s/wstream-sep.gguf", REBOUND_TEST_TMP);
    snprintf(tied, sizeof tied, "%s/wstream-tied.gguf", REBOUND_TEST_TMP);
    make_model(sep, 0);
    make_model(tied, 1);
    test_exact_and_reads(sep);
    test_exact_and_reads(tied);
    test_mem_budget(sep);
    test_pool_budget(sep);
    test_file_shrinks(sep);
    shared_inputs();
    test_shared(sep);
    test_shared_io_error(sep);
    for (int i = 0; i < N_SESS; i++)
        free(sref[i]);
    unit_test(sep);
    unlink(sep);
    unlink(tied);
    return check_report();
}
