/*
 * test_shift.c - rb_session_shift, the context shift that rotates the kept
 * keys instead of recomputing them: against a reference computed here the
 * same way (the forward pass over a cache whose rows the test moves and
 * rotates itself), bit for bit, for an f16 and a q8_0 cache, with the
 * pages evicted to both tiers before the shift, and saved to a session
 * file after it; how far it lands from a recompute of the kept tokens;
 * the errors (beyond the tokens, a sliding-window model).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "forward.h"
#include "rebound_experimental.h"
#include "session_debug.h"
#include "testlib.h"

#define N_CTX 1024
#define N_FED 700     /* before the shift: 3 pages */
#define N_KEEP 40
#define N_DISCARD 330 /* the kept ones from 370 move to 40 */
#define N_AFTER 6

static char model_path[512];
static int32_t toks[N_FED + N_AFTER];
static size_t V;

static void make_model(const char *arch, const char *file)
{
    rb_test_tmp_path(model_path, sizeof model_path, "test_shift", file);
    CHECK_EQ_INT(rb_test_make_model(model_path, &(rb_test_model_spec){
                                                    .shape = strcmp(arch, "gemma3") ? "tiny"
                                                                                    : "gemma3-270m",
                                                    .n_embd = 128, .n_layers = 3, .n_head = 4,
                                                    .n_head_kv = 2, .head_dim = 32, .n_ff = 256,
                                                    .n_vocab = 512, .n_ctx = N_CTX, .seed = 5}),
                 RB_OK);
}

/* The reference: the forward pass over a cache the test shifts itself. */
static float *reference(rb_model *m, uint32_t kv_type)
{
    rb_error err;
    rb_forward f;
    rb_kvcache kv;
    rb_threadpool *pool = NULL;
    CHECK_EQ_INT(rb_threadpool_create(2, &pool, &err), RB_OK);
    CHECK_EQ_INT(rb_forward_init(&f, m, N_CTX, 128, pool, &err), RB_OK);
    const rb_hparams *hp = &f.hp;
    CHECK_EQ_INT(rb_kvcache_init_typed(&kv, hp->n_layers, hp->n_head_kv, hp->head_dim_k,
                                       hp->head_dim_v, N_CTX, RB_KV_PAGE_TOKENS, kv_type,
                                       RB_TYPE_F16, &err), RB_OK);
    CHECK_EQ_INT(rb_kvcache_reserve(&kv, N_FED, &err), RB_OK);
    V = hp->n_vocab;
    float *scratch = malloc(128 * V * sizeof *scratch), *want = malloc(N_AFTER * V * sizeof *want);
    for (uint32_t t = 0; t < N_FED; t += 100)
        rb_forward_batch(&f, &kv, toks + t, 100, t, scratch, 1);
    /* move rows [N_KEEP + N_DISCARD, N_FED) to N_KEEP.., K rotated by
       -N_DISCARD as a float row, then rounded / quantized back */
    float k[64];
    for (uint32_t l = 0; l < hp->n_layers; l++)
        for (uint32_t h = 0; h < hp->n_head_kv; h++)
            for (uint32_t p = N_KEEP + N_DISCARD; p < N_FED; p++) {
                uint32_t q = p - N_DISCARD;
                rb_type_get_traits(kv_type)->dequantize_row(rb_kvcache_k_row(&kv, l, h, p), k,
                                                            hp->head_dim_k);
                rb_rope_apply(&f.rope, k, 1, (int)hp->head_dim_k, -N_DISCARD);
                rb_forward_store_row(kv_type, k, rb_kvcache_k_row(&kv, l, h, q), hp->head_dim_k);
                memcpy(rb_kvcache_v_row(&kv, l, h, q), rb_kvcache_v_row(&kv, l, h, p), kv.row_v);
            }
    for (uint32_t i = 0; i < N_AFTER; i++)
        rb_forward_batch(&f, &kv, toks + N_FED + i, 1, N_FED - N_DISCARD + i, want + i * V, 1);
    free(scratch);
    rb_kvcache_deinit(&kv);
    rb_forward_deinit(&f);
    rb_threadpool_destroy(pool);
    return want;
}

static rb_session *open_session(rb_model *m, rb_kv_type kt)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = N_CTX;
    p.n_threads = 2;
    p.kv_type_k = kt;
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

/* Feeds, (trims), shifts, (saves and reopens), feeds N_AFTER; 1 when every
 * logit equals want. */
static int shifted(rb_model *m, rb_kv_type kt, const float *want, int trim, int save)
{
    rb_session *s = open_session(m, kt);
    if (!s)
        return 0;
    CHECK_EQ_INT(rb_session_feed(s, toks, N_FED, NULL), RB_OK);
    const float *before = rb_session_get_logits(s);
    float last = before ? before[7] : NAN;
    if (trim)
        CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    char path[600];
    snprintf(path, sizeof path, "%s/shift.rbs", REBOUND_TEST_TMP);
    if (save) {
        unlink(path);
        CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
    }
    CHECK_EQ_INT(rb_session_shift(s, N_KEEP, N_DISCARD), RB_OK);
    CHECK_EQ_INT(rb_session_n_tokens(s), N_FED - N_DISCARD);
    CHECK(rb_session_get_tokens(s)[N_KEEP] == toks[N_KEEP + N_DISCARD]);
    const float *after = rb_session_get_logits(s);
    CHECK(after && after[7] == last); /* the last logits continue the context */
    if (save) {
        CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
        rb_session_destroy(s);
        rb_session_params p = rb_session_default_params();
        p.n_ctx = N_CTX;
        p.n_threads = 2;
        p.kv_type_k = kt;
        rb_error err;
        s = NULL;
        CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_OK);
        if (!s)
            return 0;
        CHECK_EQ_INT(rb_session_n_tokens(s), N_FED - N_DISCARD);
    }
    float *got = malloc(N_AFTER * V * sizeof *got);
    for (int i = 0; i < N_AFTER; i++)
        CHECK_EQ_INT(rb_session_feed(s, toks + N_FED + i, 1, got + i * V), RB_OK);
    CHECK_EQ_INT(rb_session_debug_recomputed_tokens(s), 0);
    int same = memcmp(got, want, N_AFTER * V * sizeof *got) == 0;
    free(got);
    rb_session_destroy(s);
    unlink(path);
    return same;
}

int main(void)
{
    uint64_t seed = 7;
    for (int i = 0; i < N_FED + N_AFTER; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(3 + (seed >> 33) % 500);
    }
    make_model("llama", "shift.gguf");
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return check_report();
    CHECK_EQ_INT(rb_model_load_weights(m), RB_OK);
    const rb_kv_type types[2] = {RB_KV_F16, RB_KV_Q8_0};
    for (int k = 0; k < 2; k++) {
        float *want = reference(m, k ? RB_TYPE_Q8_0 : RB_TYPE_F16);
        CHECK(shifted(m, types[k], want, 0, 0));
        CHECK(shifted(m, types[k], want, 1, 0)); /* from the tiers */
        CHECK(shifted(m, types[k], want, 0, 1)); /* through a session file */
        free(want);
    }
    /* against a recompute of the kept tokens: not equal (their K/V saw
       the discarded ones; the rotation rounds), only reported */
    {
        float *want = reference(m, RB_TYPE_F16);
        rb_session *s = open_session(m, RB_KV_F16);
        int32_t kept[N_FED - N_DISCARD + N_AFTER];
        memcpy(kept, toks, N_KEEP * sizeof *kept);
        memcpy(kept + N_KEEP, toks + N_KEEP + N_DISCARD,
               (N_FED - N_KEEP - N_DISCARD + N_AFTER) * sizeof *kept);
        float *got = malloc((N_FED - N_DISCARD + N_AFTER) * V * sizeof *got);
        if (s)
            CHECK_EQ_INT(rb_session_feed(s, kept, N_FED - N_DISCARD + N_AFTER, got), RB_OK);
        double max_d = 0;
        const float *g = got + (size_t)(N_FED - N_DISCARD) * V;
        for (size_t i = 0; i < N_AFTER * V; i++)
            max_d = fmax(max_d, fabs((double)g[i] - want[i]));
        printf("shift vs recompute of the kept tokens: max |logit difference| %.3g\n", max_d);
        CHECK(max_d > 0 && isfinite(max_d));
        free(got);
        free(want);
        rb_session_destroy(s);
    }
    /* errors */
    {
        rb_session *s = open_session(m, RB_KV_F16);
        if (s) {
            CHECK_EQ_INT(rb_session_feed(s, toks, 10, NULL), RB_OK);
            CHECK_EQ_INT(rb_session_shift(s, 4, 7), RB_E_INVALID_ARG);
            CHECK_EQ_INT(rb_session_shift(s, 11, 0), RB_E_INVALID_ARG);
            CHECK_EQ_INT(rb_session_shift(s, 4, 0), RB_OK);
            CHECK_EQ_INT(rb_session_shift(s, 4, 6), RB_OK); /* everything after the kept */
            CHECK_EQ_INT(rb_session_n_tokens(s), 4);
            CHECK_EQ_INT(rb_session_feed(s, toks + 10, 1, NULL), RB_OK);
            rb_session_destroy(s);
        }
        CHECK_EQ_INT(rb_session_shift(NULL, 0, 1), RB_E_INVALID_ARG);
    }
    rb_model_close(m);
    make_model("gemma3", "shift-gemma3.gguf");
    m = NULL;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (m) {
        rb_session *s = open_session(m, RB_KV_F16);
        if (s) {
            CHECK_EQ_INT(rb_session_feed(s, toks, 10, NULL), RB_OK);
            CHECK_EQ_INT(rb_session_shift(s, 2, 4), RB_E_UNSUPPORTED);
            CHECK(strstr(rb_session_errmsg(s), "sliding-window") != NULL);
            rb_session_destroy(s);
        }
        rb_model_close(m);
    }
    return check_report();
}
