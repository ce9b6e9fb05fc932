/*
 * test_window.c - sliding-window layers (gemma3) in a session: the pages
 * older than the window are released as the context grows (RAM, every
 * tier, the session file), and every logit stays bit-identical to a
 * forward pass over a cache that kept everything: feeding in batches,
 * after trims whose spilled pages then fall out of the window, after a
 * rewind behind the window (recomputed from 0), and after a save and a
 * cold open.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "forward.h"
#include "rebound_experimental.h"
#include "session_debug.h"
#include "testlib.h"

#define N_CTX 1024
#define N_TOK 760    /* 3 pages of 256, the last one partly filled */
#define WINDOW 40    /* position 759's window starts at 720: pages 0, 1 are out */
#define N_LAYERS 6   /* layers 0-4 slide, layer 5 is global */

static char model_path[512];
static int32_t toks[N_TOK];
static float *want; /* [N_TOK][V]: the reference, nothing released */
static size_t V;

static void make_model(void)
{
    rb_test_tmp_path(model_path, sizeof model_path, "test_window", "m.gguf");
    CHECK_EQ_INT(rb_test_make_model(model_path, &(rb_test_model_spec){
                                                    .shape = "gemma3-270m", .n_embd = 128,
                                                    .n_layers = N_LAYERS, .n_head = 4,
                                                    .n_head_kv = 1, .head_dim = 32, .n_ff = 256,
                                                    .n_vocab = 512, .n_ctx = N_CTX,
                                                    .sliding_window = WINDOW, .seed = 11}),
                 RB_OK);
}

/* Every position's logits from the forward pass over a cache that keeps
 * every page, one token at a time. */
static void reference(rb_model *m)
{
    rb_error err;
    rb_forward f;
    rb_kvcache kv;
    rb_threadpool *pool = NULL;
    CHECK_EQ_INT(rb_threadpool_create(2, &pool, &err), RB_OK);
    CHECK_EQ_INT(rb_forward_init(&f, m, N_CTX, 1, pool, &err), RB_OK);
    const rb_hparams *hp = &f.hp;
    CHECK_EQ_INT(hp->n_swa, WINDOW);
    CHECK_EQ_INT(rb_hparams_layer_is_swa(hp, 4), 1);
    CHECK_EQ_INT(rb_hparams_layer_is_swa(hp, 5), 0);
    CHECK_EQ_INT(rb_kvcache_init(&kv, hp->n_layers, hp->n_head_kv, hp->head_dim_k,
                                 hp->head_dim_v, N_CTX, RB_KV_PAGE_TOKENS, &err), RB_OK);
    CHECK_EQ_INT(rb_kvcache_reserve(&kv, N_TOK, &err), RB_OK);
    V = hp->n_vocab;
    want = malloc((size_t)N_TOK * V * sizeof *want);
    for (uint32_t t = 0; t < N_TOK; t++)
        CHECK_EQ_INT(rb_forward_batch(&f, &kv, &toks[t], 1, t, want + t * V, 1), 0);
    rb_kvcache_deinit(&kv);
    rb_forward_deinit(&f);
    rb_threadpool_destroy(pool);
}

static rb_session *open_session(rb_model *m, uint32_t n_batch)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = N_CTX;
    p.n_batch = n_batch;
    p.n_threads = 2;
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

/* Feeds toks[from, to) and checks each position's logits. */
static int feed_check(rb_session *s, size_t from, size_t to)
{
    float *got = malloc((to - from) * V * sizeof *got);
    CHECK_EQ_INT(rb_session_feed(s, toks + from, to - from, got), RB_OK);
    int same = memcmp(got, want + from * V, (to - from) * V * sizeof *got) == 0;
    free(got);
    return same;
}

/* Pages held in any tier, and the released pages' slots being empty. */
static uint32_t pages_held(const rb_session *s)
{
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    return st.n_kv_pages[RB_TIER_RESIDENT] + st.n_kv_pages[RB_TIER_COMPRESSED] +
           st.n_kv_pages[RB_TIER_STORED] + st.n_kv_pages[RB_TIER_DROPPED];
}

/* 1 global layer x 3 pages + 5 sliding layers x 1 page (page 2) */
#define PAGES_AT_END (3 + 5)

static void batches_test(rb_model *m)
{
    rb_session *s = open_session(m, 64);
    if (!s)
        return;
    /* the window passes page 0 at position 295 (295 - 39 = 256) */
    CHECK(feed_check(s, 0, 290));
    CHECK_EQ_INT(pages_held(s), 6 * 2);
    CHECK(feed_check(s, 290, 300));
    CHECK_EQ_INT(pages_held(s), 6 * 2 - 5);
    CHECK(rb_session_kvcache(s)->pages[0] == NULL && rb_session_kvcache(s)->pages[rb_session_kvcache(s)->pages_per_layer * 5] != NULL);
    CHECK(feed_check(s, 300, N_TOK));
    CHECK_EQ_INT(pages_held(s), PAGES_AT_END);
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    CHECK_EQ_INT(st.kv_raw_bytes, PAGES_AT_END * rb_kvcache_page_alloc_bytes(rb_session_kvcache(s)));
    rb_session_destroy(s);
}

/* Trimmed to the tiers, then the window passes the spilled pages: they
 * are dropped from the tiers, never restored. */
static void trim_test(rb_model *m)
{
    rb_session *s = open_session(m, 32);
    if (!s)
        return;
    CHECK(feed_check(s, 0, 500));
    uint64_t freed = 0;
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, &freed), RB_OK);
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    CHECK_EQ_INT(st.kv_raw_bytes, 0);
    CHECK(st.n_kv_pages[RB_TIER_STORED] + st.n_kv_pages[RB_TIER_COMPRESSED] > 0);
    CHECK(feed_check(s, 500, N_TOK));
    CHECK_EQ_INT(pages_held(s), PAGES_AT_END);
    rb_session_get_stats(s, &st);
    CHECK_EQ_INT(st.n_kv_pages[RB_TIER_STORED] + st.n_kv_pages[RB_TIER_COMPRESSED], 0);
    /* a trim now moves only live pages */
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, &freed), RB_OK);
    CHECK_EQ_INT(pages_held(s), PAGES_AT_END);
    CHECK_EQ_INT(rb_session_rewind(s, N_TOK - 1), RB_OK);
    CHECK(feed_check(s, N_TOK - 1, N_TOK));
    rb_session_destroy(s);
}

/* A rewind behind the window: the released pages are needed again, so the
 * next feed recomputes from 0 (and says so); one inside it keeps all. */
static void rewind_test(rb_model *m)
{
    rb_session *s = open_session(m, 128);
    if (!s)
        return;
    CHECK(feed_check(s, 0, N_TOK));
    CHECK_EQ_INT(rb_session_rewind(s, 740), RB_OK); /* window from 701: page 2 */
    CHECK(feed_check(s, 740, 750));
    CHECK_EQ_INT(rb_session_debug_recomputed_tokens(s), 0);
    CHECK_EQ_INT(rb_session_rewind(s, 300), RB_OK); /* window from 261: page 1 */
    CHECK(feed_check(s, 300, 310));
    CHECK_EQ_INT(rb_session_debug_recomputed_tokens(s), 300);
    CHECK(feed_check(s, 310, N_TOK));
    CHECK_EQ_INT(pages_held(s), PAGES_AT_END);
    rb_session_destroy(s);
}

/* Saved and opened cold: the released pages are neither in the file nor
 * wanted from it; the context goes on exactly. */
static void save_test(rb_model *m)
{
    char path[600];
    snprintf(path, sizeof path, "%s/window.rbs", REBOUND_TEST_TMP);
    unlink(path);
    rb_session *s = open_session(m, 64);
    if (!s)
        return;
    CHECK(feed_check(s, 0, 700));
    CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
    rb_session_destroy(s);
    rb_session_params p = rb_session_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    rb_error err;
    rb_session *o = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &o, &err), RB_OK);
    if (!o)
        return;
    CHECK(feed_check(o, 700, N_TOK));
    /* nothing recomputed: the file lacks the sliding layers' pages 0 and 1
       (released before the save) and the open does not ask for them */
    CHECK_EQ_INT(rb_session_debug_recomputed_tokens(o), 0);
    CHECK_EQ_INT(pages_held(o), PAGES_AT_END);
    rb_session_destroy(o);
    unlink(path);
}

int main(void)
{
    make_model();
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return check_report();
    CHECK_EQ_INT(rb_model_load_weights(m), RB_OK);
    uint64_t seed = 99;
    for (int i = 0; i < N_TOK; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(3 + (seed >> 33) % 500);
    }
    reference(m);
    rb_model_info mi;
    rb_model_get_info(m, &mi);
    CHECK_EQ_INT(mi.n_layers_swa, 5);
    CHECK_EQ_INT(rb_model_kv_bytes(m, 1000), mi.kv_bytes_per_token / 6 * (1000 + 5 * WINDOW));
    batches_test(m);
    trim_test(m);
    rewind_test(m);
    save_test(m);
    free(want);
    rb_model_close(m);
    return check_report();
}
