/*
 * test_multi.c - several sequences in one forward pass.
 *
 * Engine: rb_forward_multi over sequences of different lengths and context
 * positions (a decode token, a prefill chunk, all logits or the last) gives
 * each one's logits bit for bit as rb_forward_batch over it alone, for Q8_0
 * and Q4_0 weights and f16 / q8_0 / q4_0 KV caches.
 * Session: rb_session_decode_multi over sessions with different context
 * lengths (one across a page boundary, one trimmed to the tiers between
 * steps, one with a smaller n_batch that splits the pass) for many steps
 * equals feeding each session alone, logits bit for bit and token counts;
 * sessions of one memory pool decoded together while another thread trims
 * the pool equal sessions never trimmed. The errors: a session twice,
 * sessions of two models, different thread counts, a token outside the
 * vocabulary, a full context (no session changed), NULL arguments.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "forward.h"
#include "rebound_experimental.h"
#include "session_debug.h"
#include "testlib.h"

#define N_CTX 512
#define N_VOCAB 512

static void make_model(char *path, size_t size, const char *name, const char *kind,
                       uint64_t seed)
{
    rb_test_tmp_path(path, size, "test_multi", name);
    CHECK_EQ_INT(rb_test_make_model(path, &(rb_test_model_spec){
                                              .n_embd = 128, .n_layers = 4, .n_head = 4,
                                              .n_head_kv = 2, .head_dim = 32, .n_ff = 256,
                                              .n_vocab = N_VOCAB, .n_ctx = N_CTX,
                                              .kind = kind, .seed = seed}),
                 RB_OK);
}

static rb_model *open_model(const char *path)
{
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    if (m)
        CHECK_EQ_INT(rb_model_load_weights(m), RB_OK); /* the engine test's forward state */
    return m;
}

static int32_t token_at(uint32_t seq, uint32_t pos)
{
    return (int32_t)((seq * 131u + pos * 29u + (pos * pos) % 7u) % N_VOCAB);
}

/* ---- engine ----------------------------------------------------------------- */

#define E_SEQS 4

/* Sequences of prompt lengths 1, 37, 250, 9 decoded alone and together:
 * per step each sequence takes `step_n[s]` tokens (a prefill chunk rides
 * along with decodes, across the page at 256), with all logits for some. */
static void engine_test(rb_model *m, uint32_t kv_type)
{
    static const uint32_t prompt[E_SEQS] = {1, 37, 250, 9};
    static const uint32_t step_n[E_SEQS] = {1, 1, 5, 3};
    static const int all[E_SEQS] = {0, 1, 0, 1};
    const uint32_t n_steps = 12;
    rb_error err;
    rb_threadpool *pool = NULL;
    rb_forward f;
    CHECK_EQ_INT(rb_threadpool_create(2, &pool, &err), RB_OK);
    CHECK_EQ_INT(rb_forward_init(&f, m, N_CTX, 16, pool, &err), RB_OK);
    const rb_hparams *hp = &f.hp;
    const size_t V = hp->n_vocab;
    rb_kvcache alone[E_SEQS], multi[E_SEQS];
    float *want = malloc(16 * V * sizeof *want), *got = malloc(16 * V * sizeof *got);
    int32_t toks[E_SEQS][16];
    for (uint32_t s = 0; s < E_SEQS; s++) {
        CHECK_EQ_INT(rb_kvcache_init_typed(&alone[s], hp->n_layers, hp->n_head_kv,
                                           hp->head_dim_k, hp->head_dim_v, N_CTX,
                                           RB_KV_PAGE_TOKENS, kv_type, kv_type, &err), RB_OK);
        CHECK_EQ_INT(rb_kvcache_init_typed(&multi[s], hp->n_layers, hp->n_head_kv,
                                           hp->head_dim_k, hp->head_dim_v, N_CTX,
                                           RB_KV_PAGE_TOKENS, kv_type, kv_type, &err), RB_OK);
        const uint32_t end = prompt[s] + n_steps * step_n[s];
        CHECK_EQ_INT(rb_kvcache_reserve(&alone[s], end, &err), RB_OK);
        CHECK_EQ_INT(rb_kvcache_reserve(&multi[s], end, &err), RB_OK);
        /* the prompts, alone, into both caches (the same bits) */
        for (uint32_t p = 0; p < prompt[s]; p += 16) {
            const uint32_t n = prompt[s] - p < 16 ? prompt[s] - p : 16;
            for (uint32_t i = 0; i < n; i++)
                toks[s][i] = token_at(s, p + i);
            CHECK_EQ_INT(rb_forward_batch(&f, &alone[s], toks[s], n, p, want, 0), 0);
            CHECK_EQ_INT(rb_forward_batch(&f, &multi[s], toks[s], n, p, want, 0), 0);
        }
    }
    int same = 1;
    for (uint32_t step = 0; step < n_steps; step++) {
        rb_forward_seq seqs[E_SEQS];
        size_t rows = 0;
        for (uint32_t s = 0; s < E_SEQS; s++) {
            const uint32_t pos = prompt[s] + step * step_n[s];
            for (uint32_t i = 0; i < step_n[s]; i++)
                toks[s][i] = token_at(s, pos + i);
            seqs[s] = (rb_forward_seq){.kv = &multi[s], .tokens = toks[s], .n = step_n[s],
                                       .pos0 = pos, .all_logits = all[s]};
        }
        CHECK_EQ_INT(rb_forward_multi(&f, seqs, E_SEQS, got), 0);
        for (uint32_t s = 0; s < E_SEQS; s++) {
            const uint32_t pos = prompt[s] + step * step_n[s], m_rows = all[s] ? step_n[s] : 1;
            CHECK_EQ_INT(rb_forward_batch(&f, &alone[s], toks[s], step_n[s], pos, want, all[s]),
                         0);
            CHECK_EQ_INT(seqs[s].nonfinite_layer, -1);
            CHECK_EQ_INT(seqs[s].row0, s == 0 ? 0 : seqs[s - 1].row0 + step_n[s - 1]);
            if (memcmp(want, got + rows * V, m_rows * V * sizeof *got) != 0) {
                if (same)
                    fprintf(stderr, "engine: kv %s, step %u, sequence %u differs\n",
                            rb_type_name(kv_type), step, s);
                same = 0;
            }
            rows += m_rows;
        }
    }
    CHECK(same);
    for (uint32_t s = 0; s < E_SEQS; s++)
        rb_kvcache_deinit(&alone[s]), rb_kvcache_deinit(&multi[s]);
    free(want);
    free(got);
    rb_forward_deinit(&f);
    rb_threadpool_destroy(pool);
}

static int no_at_layer_2(void *ctx, uint32_t layer)
{
    (*(int *)ctx)++;
    return layer == 2;
}

/* A gate that says no stops the whole pass. */
static void engine_gate_test(rb_model *m)
{
    rb_error err;
    rb_threadpool *pool = NULL;
    rb_forward f;
    rb_kvcache kv[2];
    CHECK_EQ_INT(rb_threadpool_create(1, &pool, &err), RB_OK);
    CHECK_EQ_INT(rb_forward_init(&f, m, N_CTX, 4, pool, &err), RB_OK);
    float *logits = malloc(2 * f.hp.n_vocab * sizeof *logits);
    int asked = 0;
    const int32_t t[2] = {5, 6};
    for (int s = 0; s < 2; s++) {
        CHECK_EQ_INT(rb_kvcache_init(&kv[s], f.hp.n_layers, f.hp.n_head_kv, f.hp.head_dim_k,
                                     f.hp.head_dim_v, N_CTX, RB_KV_PAGE_TOKENS, &err), RB_OK);
        CHECK_EQ_INT(rb_kvcache_reserve(&kv[s], 1, &err), RB_OK);
    }
    rb_forward_seq seqs[2] = {
        {.kv = &kv[0], .tokens = &t[0], .n = 1},
        {.kv = &kv[1], .tokens = &t[1], .n = 1, .layer_gate = no_at_layer_2,
         .layer_gate_ctx = &asked}};
    CHECK_EQ_INT(rb_forward_multi(&f, seqs, 2, logits), -1);
    CHECK_EQ_INT(asked, 3); /* layers 0, 1, 2 */
    for (int s = 0; s < 2; s++)
        rb_kvcache_deinit(&kv[s]);
    free(logits);
    rb_forward_deinit(&f);
    rb_threadpool_destroy(pool);
}

/* ---- sessions ----------------------------------------------------------------- */

#define S_SEQS 4
#define S_STEPS 24

static rb_session *new_session(rb_model *m, rb_kv_type kv, uint32_t n_batch, int n_threads)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = N_CTX;
    p.n_batch = n_batch;
    p.n_threads = n_threads;
    p.kv_type_k = kv;
    p.kv_type_v = kv;
    static rb_experimental_params x;
    x = rb_experimental_default_params();
    x.decode_bytes_per_s = 1e9;
    x.storage_bytes_per_s = 1e9;
    p.experimental = &x;
    rb_session *s = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    return s;
}

static uint32_t argmax(const float *x, size_t n)
{
    uint32_t b = 0;
    for (uint32_t i = 1; i < n; i++)
        if (x[i] > x[b])
            b = i;
    return b;
}

/* Four sessions with prompts of 2, 60, 250 (its decode crosses the page
 * at 256) and 17 tokens decoded greedily together for S_STEPS steps, the
 * same four fed alone beside them: equal logits every step. Session 2 is
 * trimmed to the tiers at step 10 (its pass restores through its gate);
 * session 3 has n_batch 2, so the pass runs in groups of 2. */
static void session_test(rb_model *m, rb_kv_type kv)
{
    static const uint32_t prompt[S_SEQS] = {2, 60, 250, 17};
    rb_session *multi[S_SEQS], *alone[S_SEQS];
    int32_t buf[256];
    for (uint32_t s = 0; s < S_SEQS; s++) {
        multi[s] = new_session(m, kv, s == 3 ? 2 : 64, 2);
        alone[s] = new_session(m, kv, 64, 2);
        if (!multi[s] || !alone[s])
            return;
        for (uint32_t i = 0; i < prompt[s]; i++)
            buf[i] = token_at(s, i);
        CHECK_EQ_INT(rb_session_feed(multi[s], buf, prompt[s], NULL), RB_OK);
        CHECK_EQ_INT(rb_session_feed(alone[s], buf, prompt[s], NULL), RB_OK);
    }
    const size_t V = rb_session_n_vocab(multi[0]);
    int same = 1;
    for (uint32_t step = 0; step < S_STEPS; step++) {
        int32_t next[S_SEQS];
        for (uint32_t s = 0; s < S_SEQS; s++)
            next[s] = (int32_t)argmax(rb_session_get_logits(alone[s]), V);
        if (step == 10) {
            uint64_t freed = 0;
            CHECK_EQ_INT(rb_session_trim(multi[2], 0, RB_TRIM_MODERATE, &freed), RB_OK);
            CHECK(freed > 0);
        }
        rb_error err = {0};
        CHECK_EQ_INT(rb_session_decode_multi(multi, next, S_SEQS, &err), RB_OK);
        for (uint32_t s = 0; s < S_SEQS; s++) {
            CHECK_EQ_INT(rb_session_feed(alone[s], &next[s], 1, NULL), RB_OK);
            CHECK_EQ_U64(rb_session_n_tokens(multi[s]), prompt[s] + step + 1);
            if (memcmp(rb_session_get_logits(multi[s]), rb_session_get_logits(alone[s]),
                       V * sizeof(float)) != 0 ||
                memcmp(rb_session_get_tokens(multi[s]), rb_session_get_tokens(alone[s]),
                       rb_session_n_tokens(alone[s]) * sizeof(int32_t)) != 0) {
                if (same)
                    fprintf(stderr, "session: kv %s, step %u, session %u differs\n",
                            rb_kv_type_name(kv), step, s);
                same = 0;
            }
        }
    }
    CHECK(same);
    rb_session_stats st;
    rb_session_get_stats(multi[2], &st);
    CHECK_EQ_INT(st.n_kv_pages[RB_TIER_STORED] + st.n_kv_pages[RB_TIER_COMPRESSED], 0);
    for (uint32_t s = 0; s < S_SEQS; s++) {
        rb_session_destroy(multi[s]);
        rb_session_destroy(alone[s]);
    }
}

/* Sessions in one memory pool decoded together while another thread trims
 * the pool again and again: the trims stop the shared pass at layer
 * boundaries (the session served goes on alone, the others retry alone),
 * and every step's logits still equal those of sessions never trimmed. */
typedef struct trimmer {
    rb_pool *pool;
    atomic_int stop;
    int n_trims;
} trimmer;

static void *trim_loop(void *arg)
{
    trimmer *t = arg;
    while (!atomic_load(&t->stop)) {
        uint64_t freed = 0;
        rb_pool_trim(t->pool, 0, t->n_trims % 2 ? RB_TRIM_MODERATE : RB_TRIM_BACKGROUND, &freed);
        t->n_trims++;
        nanosleep(&(struct timespec){0, 3000000}, NULL);
    }
    return NULL;
}

#define P_STEPS 16

static void pool_test(rb_model *m)
{
    static const uint32_t prompt[S_SEQS] = {70, 5, 33, 120};
    rb_session *ref[S_SEQS], *ss[S_SEQS];
    int32_t buf[128], toks[P_STEPS][S_SEQS];
    const size_t V = N_VOCAB;
    float *want = malloc((size_t)P_STEPS * S_SEQS * V * sizeof *want);
    rb_error err;
    rb_pool *pool = NULL;
    CHECK_EQ_INT(rb_pool_create(m, 0, &pool, &err), RB_OK);
    if (!pool)
        return;
    for (uint32_t s = 0; s < S_SEQS; s++) {
        ref[s] = new_session(m, RB_KV_F16, 64, 2);
        rb_session_params p = rb_session_default_params();
        p.n_ctx = N_CTX;
        p.n_threads = 2;
        p.pool = pool;
        ss[s] = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &ss[s], &err), RB_OK);
        if (!ref[s] || !ss[s])
            return;
        for (uint32_t i = 0; i < prompt[s]; i++)
            buf[i] = token_at(s + 4, i);
        CHECK_EQ_INT(rb_session_feed(ref[s], buf, prompt[s], NULL), RB_OK);
        CHECK_EQ_INT(rb_session_feed(ss[s], buf, prompt[s], NULL), RB_OK);
    }
    /* the references first, alone (nothing trims them) */
    for (uint32_t step = 0; step < P_STEPS; step++)
        for (uint32_t s = 0; s < S_SEQS; s++) {
            toks[step][s] = (int32_t)argmax(rb_session_get_logits(ref[s]), V);
            CHECK_EQ_INT(rb_session_feed(ref[s], &toks[step][s], 1, NULL), RB_OK);
            memcpy(want + ((size_t)step * S_SEQS + s) * V, rb_session_get_logits(ref[s]),
                   V * sizeof *want);
        }
    for (uint32_t s = 0; s < S_SEQS; s++)
        rb_session_destroy(ref[s]);
    trimmer t = {.pool = pool};
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, trim_loop, &t), 0);
    int same = 1;
    for (uint32_t step = 0; step < P_STEPS; step++) {
        CHECK_EQ_INT(rb_session_decode_multi(ss, toks[step], S_SEQS, &err), RB_OK);
        for (uint32_t s = 0; s < S_SEQS; s++)
            if (memcmp(rb_session_get_logits(ss[s]), want + ((size_t)step * S_SEQS + s) * V,
                       V * sizeof *want) != 0) {
                if (same)
                    fprintf(stderr, "pool: step %u, session %u differs\n", step, s);
                same = 0;
            }
    }
    atomic_store(&t.stop, 1);
    pthread_join(th, NULL);
    CHECK(same);
    CHECK(t.n_trims > 0);
    for (uint32_t s = 0; s < S_SEQS; s++) {
        CHECK_EQ_U64(rb_session_n_tokens(ss[s]), prompt[s] + P_STEPS);
        rb_session_destroy(ss[s]);
    }
    rb_pool_destroy(pool);
    free(want);
}

static void error_test(rb_model *m, rb_model *other)
{
    rb_session *a = new_session(m, RB_KV_F16, 64, 2), *b = new_session(m, RB_KV_F16, 64, 2);
    rb_session *c = new_session(other, RB_KV_F16, 64, 2), *d = new_session(m, RB_KV_F16, 64, 1);
    if (!a || !b || !c || !d)
        return;
    const int32_t t0[1] = {3};
    CHECK_EQ_INT(rb_session_feed(a, t0, 1, NULL), RB_OK);
    rb_error err = {0};
    int32_t toks[2] = {4, 5};
    rb_session *twice[2] = {a, a}, *mixed[2] = {a, c}, *threads[2] = {a, d}, *ok[2] = {a, b};
    rb_session *null_one[2] = {a, NULL};
    CHECK_EQ_INT(rb_session_decode_multi(twice, toks, 2, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "same session") != NULL);
    CHECK_EQ_INT(rb_session_decode_multi(mixed, toks, 2, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "one model") != NULL);
    CHECK_EQ_INT(rb_session_decode_multi(threads, toks, 2, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "threads") != NULL);
    CHECK_EQ_INT(rb_session_decode_multi(null_one, toks, 2, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "session 1 is NULL") != NULL);
    CHECK_EQ_INT(rb_session_decode_multi(NULL, toks, 2, &err), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_session_decode_multi(ok, NULL, 2, &err), RB_E_INVALID_ARG);
    /* a token outside the vocabulary: named, and no session changed */
    int32_t bad[2] = {4, N_VOCAB};
    CHECK_EQ_INT(rb_session_decode_multi(ok, bad, 2, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "session 1") != NULL && strstr(err.message, "vocabulary"));
    CHECK_EQ_U64(rb_session_n_tokens(a), 1);
    CHECK_EQ_U64(rb_session_n_tokens(b), 0);
    /* a full context: RB_E_BUDGET, no session changed */
    int32_t fill[N_CTX];
    for (uint32_t i = 0; i < N_CTX; i++)
        fill[i] = token_at(7, i);
    CHECK_EQ_INT(rb_session_feed(b, fill, N_CTX, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_decode_multi(ok, toks, 2, &err), RB_E_BUDGET);
    CHECK(strstr(err.message, "session 1") != NULL);
    CHECK_EQ_U64(rb_session_n_tokens(a), 1);
    CHECK_EQ_U64(rb_session_n_tokens(b), N_CTX);
    /* n == 0 does nothing; then a good call still works */
    CHECK_EQ_INT(rb_session_decode_multi(ok, toks, 0, &err), RB_OK);
    CHECK_EQ_INT(rb_session_rewind(b, 0), RB_OK);
    CHECK_EQ_INT(rb_session_decode_multi(ok, toks, 2, &err), RB_OK);
    CHECK_EQ_U64(rb_session_n_tokens(a), 2);
    CHECK_EQ_U64(rb_session_n_tokens(b), 1);
    rb_session_destroy(a);
    rb_session_destroy(b);
    rb_session_destroy(c);
    rb_session_destroy(d);
}

int main(void)
{
    char q8[512], q4[512];
    make_model(q8, sizeof q8, "q8_0.gguf", "q8_0", 21);
    make_model(q4, sizeof q4, "q4_0.gguf", "q4_0", 22);
    rb_model *m8 = open_model(q8), *m4 = open_model(q4);
    if (!m8 || !m4)
        return check_report();
    engine_test(m8, RB_TYPE_F16);
    engine_test(m4, RB_TYPE_F16);
    engine_test(m4, RB_TYPE_Q8_0);
    engine_test(m8, RB_TYPE_Q4_0);
    engine_gate_test(m8);
    session_test(m4, RB_KV_F16);
    session_test(m8, RB_KV_Q8_0);
    session_test(m4, RB_KV_Q4_0);
    pool_test(m8);
    error_test(m4, m8);
    rb_model_close(m8);
    rb_model_close(m4);
    remove(q8);
    remove(q4);
    return check_report();
}
