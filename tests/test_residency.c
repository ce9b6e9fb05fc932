/*
 * test_residency.c - the memory manager through a real session on a
 * generated model: after any sequence of trims (both tiers, weights too)
 * the next tokens' logits are bit-identical to a session that never
 * evicted; eager and recompute modes too; a spill that fails its checksum,
 * vanishes or cannot be written is survived with the same logits; the
 * accounts move as the tiers do.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "kvcache.h"
#include "quant.h"
#include "rebound_experimental.h"
#include "residency.h"
#include "residency_split.h"
#include "session_debug.h"
#include "store.h"
#include "testlib.h"

#define N_PROMPT 700 /* 3 pages of 256: the last one partly filled */
#define N_STEPS 6

static char model_path[512];

static rb_test_rng rng = {12345};
static uint32_t rnd(uint32_t n) { return rb_test_rng_below(&rng, n); }

static void make_model(void)
{
    rb_test_tmp_path(model_path, sizeof model_path, "test_residency", "m.gguf");
    CHECK_EQ_INT(rb_test_make_model(model_path, &(rb_test_model_spec){
                                                    .n_embd = 128, .n_layers = 4, .n_head = 4,
                                                    .n_head_kv = 2, .n_ff = 256, .n_vocab = 512,
                                                    .n_ctx = 1024, .seed = 7}),
                 RB_OK);
}

/*
 * The manager through its own interface, no session: a table of KV page
 * slots with known contents, a spill store, no weight cache. Trims by
 * level and by bytes, restores in layer order (the workers run, this
 * thread waits layer by layer as the forward pass would), and every page
 * comes back byte-equal; recompute mode reports the first position to
 * recompute; a forget frees the pages from there on.
 */
static void unit_test(void)
{
    enum { L = 4, P = 4 };
    rb_residency_kv kv = {.n_layers = L, .pages_per_layer = P,
                          .dims = {.n_tokens = 64, .n_kv_heads = 2, .head_dim_k = 64,
                                   .head_dim_v = 64}};
    kv.page_bytes = (size_t)rb_kvcodec_page_bytes(&kv.dims);
    /* the KV cache owns the slots: every page allocated, as a feed would */
    rb_kvcache cache;
    rb_error kerr;
    CHECK_EQ_INT(rb_kvcache_init(&cache, L, 2, 64, 64, P * 64, 64, &kerr), RB_OK);
    CHECK_EQ_INT(rb_kvcache_reserve(&cache, P * 64, &kerr), RB_OK);
    CHECK_EQ_INT(cache.page_bytes, kv.page_bytes);
    void **slots = (void **)cache.pages;
    uint8_t *want = malloc((size_t)L * P * kv.page_bytes);
    kv.cache = &cache;
    rb_test_rng r = rb_test_rng_seed(99);
    for (uint32_t i = 0; i < L * P; i++) {
        rb_f16 *h = slots[i];
        for (size_t k = 0; k < kv.page_bytes / 2; k++) /* K/V-like values: narrow exponents */
            h[k] = rb_fp32_to_fp16((float)rb_test_rng_normal(&r) * 0.5f);
        memcpy(want + (size_t)i * kv.page_bytes, slots[i], kv.page_bytes);
    }
    rb_store_params sp = rb_store_default_params();
    sp.dir = REBOUND_TEST_TMP;
    rb_store *store = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_store_open(&sp, &store, &err), RB_OK);
    rb_residency_params rp = {.restore = RB_RESTORE_PIPELINED,
                              .ram_codec = RB_RAM_CODEC_LOSSLESS,
                              .decode_bytes_per_s = 1e9, .storage_bytes_per_s = 1e9};
    rb_residency *res = NULL;
    CHECK_EQ_INT(rb_residency_create(&rp, &kv, store, NULL, &res, &err), RB_OK);
    if (!res || !store) {
        free(want);
        return;
    }
    rb_residency_set_pages(res, P);

    const rb_trim_level levels[] = {RB_TRIM_MODERATE, RB_TRIM_COMPLETE, RB_TRIM_BYTES};
    for (int t = 0; t < 3; t++) {
        uint64_t freed = 0;
        CHECK_EQ_INT(rb_residency_trim(res, 3 * kv.page_bytes, levels[t], &freed, &err), RB_OK);
        CHECK(freed > 0);
        int n_out = 0, early_out = 0;
        for (uint32_t i = 0; i < L * P; i++) {
            n_out += slots[i] == NULL;
            early_out += slots[i] == NULL && i / P < L / 2;
        }
        if (levels[t] == RB_TRIM_MODERATE) /* the last half of the layers, all of it */
            CHECK(n_out == L * P / 2 && early_out == 0);
        if (levels[t] == RB_TRIM_COMPLETE)
            CHECK_EQ_INT(n_out, L * P);
        if (levels[t] == RB_TRIM_BYTES) /* last layers first */
            CHECK(n_out >= 1 && early_out == 0 && slots[L * P - 1] == NULL);
        rb_session_stats st;
        memset(&st, 0, sizeof st);
        rb_residency_stats(res, &st);
        CHECK_EQ_U64(st.n_kv_pages[RB_TIER_RESIDENT], (uint64_t)(L * P - n_out));

        uint32_t recompute_from = 0, damaged_from = 0;
        CHECK_EQ_INT(rb_residency_begin_restore(res, &recompute_from, &err), RB_OK);
        CHECK_EQ_U64(recompute_from, UINT32_MAX);
        for (uint32_t l = 0; l < L; l++)
            CHECK_EQ_INT(rb_residency_wait_layer(res, l), 0);
        rb_residency_compute_done(res);
        CHECK_EQ_INT(rb_residency_end_restore(res, &damaged_from, &err), RB_OK);
        CHECK_EQ_U64(damaged_from, UINT32_MAX);
        int same_bytes = 1;
        for (uint32_t i = 0; i < L * P; i++)
            same_bytes &= slots[i] && !memcmp(slots[i], want + (size_t)i * kv.page_bytes,
                                              kv.page_bytes);
        CHECK(same_bytes);
    }

    /* recompute: the dropped pages' first position comes back to the caller */
    CHECK_EQ_INT(rb_residency_set_mode(res, RB_RESTORE_RECOMPUTE, RB_RAM_CODEC_LOSSLESS, &err),
                 RB_OK);
    CHECK_EQ_INT(rb_residency_trim(res, 0, RB_TRIM_BACKGROUND, NULL, &err), RB_OK);
    CHECK(slots[L * P - 1] == NULL && slots[0] != NULL);
    uint32_t recompute_from = 0, damaged_from = 0;
    CHECK_EQ_INT(rb_residency_begin_restore(res, &recompute_from, &err), RB_OK);
    CHECK_EQ_U64(recompute_from, 0); /* every page of the last layer: from position 0 */
    rb_residency_forget_from(res, 0);
    CHECK_EQ_INT(rb_residency_end_restore(res, &damaged_from, &err), RB_OK);
    int all_freed = 1;
    for (uint32_t i = 0; i < L * P; i++)
        all_freed &= slots[i] == NULL;
    CHECK(all_freed);

    rb_residency_destroy(res);
    rb_store_close(store);
    rb_kvcache_deinit(&cache);
    free(want);
}

static rb_session *open_session_kv(rb_model *m, rb_restore_mode mode, rb_ram_codec codec,
                                   rb_kv_type kv_k, rb_kv_type kv_v)
{
    rb_session_params p = rb_session_default_params();
    p.kv_type_k = kv_k;
    p.kv_type_v = kv_v;
    p.n_ctx = 1024;
    p.n_threads = 2;
    p.restore = mode;
    p.ram_codec = codec;
    /* equal D and R: the split sends about half of the pages each way */
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

static rb_session *open_session(rb_model *m, rb_restore_mode mode, rb_ram_codec codec)
{
    return open_session_kv(m, mode, codec, RB_KV_F16, RB_KV_F16);
}

/* prompt, then N_STEPS single tokens; logits of each step into out */
typedef void (*between_fn)(rb_session *s, int step);

static void run(rb_session *s, const int32_t *prompt, const int32_t *steps, float *out,
                between_fn between)
{
    size_t V = rb_session_n_vocab(s);
    CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
    for (int i = 0; i < N_STEPS; i++) {
        if (between)
            between(s, i);
        rb_status st = rb_session_feed(s, &steps[i], 1, NULL);
        CHECK_EQ_INT(st, RB_OK);
        if (st != RB_OK)
            fprintf(stderr, "feed: %s\n", rb_session_errmsg(s));
        const float *l = rb_session_get_logits(s);
        if (l)
            memcpy(out + (size_t)i * V, l, V * sizeof(float));
    }
}

static void trim_random(rb_session *s, int step)
{
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    uint64_t freed = 0;
    rb_trim_level level = (rb_trim_level)rnd(4);
    if (step == N_STEPS - 1)
        level = RB_TRIM_COMPLETE;
    uint64_t bytes = level == RB_TRIM_BYTES ? 1 + rnd((uint32_t)(st.kv_raw_bytes + 1)) : 0;
    CHECK_EQ_INT(rb_session_trim(s, bytes, level, &freed), RB_OK);
    rb_session_stats after;
    rb_session_get_stats(s, &after);
    if (level == RB_TRIM_BYTES && after.kv_raw_bytes > 0)
        CHECK(freed >= bytes || after.weights_evicted_bytes > 0);
    CHECK(after.total_bytes <= st.total_bytes);
    if (level == RB_TRIM_COMPLETE) {
        CHECK_EQ_INT(after.kv_raw_bytes, 0);
        CHECK(after.weights_evicted_bytes > 0);
        CHECK(after.n_kv_pages[RB_TIER_STORED] > 0);
        CHECK(after.n_kv_pages[RB_TIER_COMPRESSED] > 0);
    }
}

/* Every other step a complete trim; the tiers' share of the pages is
 * printed (a quantized cache's pages go to both as bytes). */
static void trim_complete_odd(rb_session *s, int step)
{
    if (step % 2 == 0)
        return;
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    CHECK_EQ_INT(st.kv_raw_bytes, 0);
    CHECK(st.n_kv_pages[RB_TIER_STORED] + st.n_kv_pages[RB_TIER_COMPRESSED] > 0);
    if (st.kv_compressed_raw_bytes)
        printf("  step %d: %u pages compressed (lossless %.3fx over the quantized bytes), %u "
               "stored\n", step, st.n_kv_pages[RB_TIER_COMPRESSED],
               (double)st.kv_compressed_raw_bytes / (double)st.kv_compressed_bytes,
               st.n_kv_pages[RB_TIER_STORED]);
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* ---- fault injection: a store whose reads flip a bit, or whose writes
 *      find the disk full, swapped in for the session's own ------------- */

static int fault_flip_reads, fault_enospc;

static ssize_t faulty_pread(int fd, void *buf, size_t n, off_t off)
{
    ssize_t r = pread(fd, buf, n, off);
    if (fault_flip_reads && r > 0)
        ((unsigned char *)buf)[r / 2] ^= 0x10;
    return r;
}

static ssize_t faulty_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (fault_enospc) {
        errno = ENOSPC;
        return -1;
    }
    return pwrite(fd, buf, n, off);
}

static rb_os faulty_os;

static void swap_store(rb_session *s)
{
    faulty_os = *rb_os_default();
    faulty_os.pread = faulty_pread;
    faulty_os.pwrite = faulty_pwrite;
    rb_store_params sp = rb_store_default_params();
    sp.os = &faulty_os;
    rb_store *st = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_store_open(&sp, &st, &err), RB_OK);
    /* nothing is spilled yet; the residency manager keeps the store it was
       created with, so it is rebuilt over the faulty one */
    rb_residency_params rp = {RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS, 1e9, 1e9, 0, 0, NULL};
    CHECK_EQ_INT(rb_session_debug_swap_store(s, st, &rp, &err), RB_OK);
}

static void trim_moderate(rb_session *s, int step)
{
    if (step == 2)
        CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_MODERATE, NULL), RB_OK);
}

static void trim_then_lose_one(rb_session *s, int step)
{
    if (step != 2)
        return;
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_MODERATE, NULL), RB_OK);
    /* a spill copy disappears behind the manager's back */
    for (uint64_t id = 0; id < (uint64_t)rb_session_kvcache(s)->n_layers * rb_session_kvcache(s)->pages_per_layer; id++)
        if (rb_store_has(rb_session_debug_store(s), id)) {
            rb_store_drop(rb_session_debug_store(s), id);
            break;
        }
}

/* The split rule (residency_split.h) on its own: 4 layers x 10 pages of
 * 1 MB, trim order (last layer first). */
static void split_test(void)
{
    rb_split_page pg[40];
    uint32_t n = 0;
    for (uint32_t l = 4; l-- > 0;)
        for (int i = 0; i < 10; i++)
            pg[n++] = (rb_split_page){l, 0, 0};
    rb_split_params p = {.R = 1e9, .D = 3e9, .page_bytes = 1e6, .frame_frac = 0.8,
                         .n_layers = 4};
    /* compute per layer unknown: the paths finish together, D/(D+R) = 3/4
       of the pages decoded */
    uint64_t freed = rb_split_assign(&p, pg, n);
    int stored = 0;
    for (uint32_t i = 0; i < n; i++)
        stored += pg[i].to_store;
    CHECK(stored >= 9 && stored <= 11);
    CHECK_EQ_INT(freed, (uint64_t)(stored * 1e6 + (40 - stored) * 0.2e6 + 0.5));
    /* a forward pass slow enough that storage is in time for every layer
       (layer 0's deadline is 0, so its pages still split): the rest stored */
    p.layer_compute_s = 0.05;
    rb_split_assign(&p, pg, n);
    int late = 0;
    for (uint32_t i = 0; i < n; i++)
        late += pg[i].layer > 0 && !pg[i].to_store;
    CHECK_EQ_INT(late, 0);
    /* a fast one (5 ms a layer, a page takes storage 1 ms): storage keeps
       layer 1's first pages, and the later layers' pages it cannot deliver
       in time are decoded */
    p.layer_compute_s = 0.005;
    rb_split_assign(&p, pg, n);
    int l1_stored = 0, l3_decoded = 0;
    for (uint32_t i = 0; i < n; i++) {
        l1_stored += pg[i].layer == 1 && pg[i].to_store;
        l3_decoded += pg[i].layer == 3 && !pg[i].to_store;
    }
    CHECK(l1_stored > 0);
    CHECK(l3_decoded > 0);
    /* released weights read first take storage's time: layer 1 misses */
    double w[4] = {0.2e9, 0.2e9, 0, 0};
    p.weights_bytes = w;
    p.layer_compute_s = 0.05;
    rb_split_assign(&p, pg, n);
    int l1_late = 0;
    for (uint32_t i = 0; i < n; i++)
        l1_late += pg[i].layer == 1 && !pg[i].to_store;
    CHECK(l1_late > 0);
    /* a page already saved is stored whatever the clock says */
    p.weights_bytes = NULL;
    p.layer_compute_s = 0;
    for (uint32_t i = 0; i < n; i++)
        pg[i].saved = 1;
    rb_split_assign(&p, pg, n);
    stored = 0;
    for (uint32_t i = 0; i < n; i++)
        stored += pg[i].to_store;
    CHECK_EQ_INT(stored, 40);
}

/* A full page restored from the spill keeps its copy there: the next trim
 * moves it without a write. A rewind into a page drops that page's copy
 * (its positions are written again): the logits stay exact. */
static uint64_t spill_written(rb_session *s)
{
    rb_store_stats st;
    rb_store_get_stats(rb_session_debug_store(s), &st);
    return st.written_bytes;
}

/* A copy of s's last logits (512 floats; NULL when there are none). */
static float *last_logits(rb_session *s)
{
    const float *l = rb_session_get_logits(s);
    float *c = l ? malloc(512 * sizeof(float)) : NULL;
    if (c)
        memcpy(c, l, 512 * sizeof(float));
    return c;
}

/* ref's last logits against got (512 floats, may be NULL); destroys ref
 * and frees got. */
static void check_ref_logits(rb_session *ref, float *got)
{
    float *want = last_logits(ref);
    CHECK(got && want && same(got, want, 512));
    rb_session_destroy(ref);
    free(got);
    free(want);
}

static void spill_reuse_test(rb_model *m, const int32_t *prompt)
{
    rb_session *s = open_session(m, RB_RESTORE_EAGER, RB_RAM_CODEC_LOSSLESS);
    if (!s || !rb_session_debug_store(s)) {
        rb_session_destroy(s);
        return;
    }
    int32_t a = 7, b = 9, c = 13, other[64];
    for (int i = 0; i < 64; i++)
        other[i] = (int32_t)((i * 37 + 5) % 512);
    CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    uint64_t w1 = spill_written(s);
    CHECK_EQ_INT(rb_session_feed(s, &a, 1, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    uint64_t w2 = spill_written(s) - w1;
    /* 3 pages a layer: the 2 full ones move without a write, the last is
       written again (it holds the new token) */
    CHECK(w1 > 0 && w2 > 0 && w2 * 2 < w1);
    CHECK_EQ_INT(rb_session_feed(s, &b, 1, NULL), RB_OK);
    /* into page 1 (full, its copy kept), and write it again differently */
    CHECK_EQ_INT(rb_session_rewind(s, 480), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, other, 64, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, &c, 1, NULL), RB_OK);
    float *got = last_logits(s);
    rb_session_destroy(s);
    rb_session *ref = open_session(m, RB_RESTORE_EAGER, RB_RAM_CODEC_LOSSLESS);
    CHECK_EQ_INT(rb_session_feed(ref, prompt, 480, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(ref, other, 64, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(ref, &c, 1, NULL), RB_OK);
    check_ref_logits(ref, got);
}

/* With a session file, an explicit save leaves every page's copy there,
 * the partly filled last one too: a trim then writes nothing to the spill.
 * A feed writes into that last page, so the next trim writes it again
 * (the file's copy is older) until the next save. Logits stay exact. */
static void saved_last_page_test(rb_model *m, const int32_t *prompt)
{
    rb_session *s = open_session(m, RB_RESTORE_EAGER, RB_RAM_CODEC_LOSSLESS);
    if (!s || !rb_session_debug_store(s)) {
        rb_session_destroy(s);
        return;
    }
    char path[600];
    snprintf(path, sizeof path, "%s.saved-last", model_path);
    unlink(path);
    int32_t toks[N_PROMPT + 3];
    memcpy(toks, prompt, sizeof(int32_t) * N_PROMPT);
    toks[N_PROMPT] = 7, toks[N_PROMPT + 1] = 9, toks[N_PROMPT + 2] = 13;
    CHECK_EQ_INT(rb_session_feed(s, toks, N_PROMPT, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, RB_SAVE_ON_REQUEST), RB_OK);
    const uint64_t w0 = spill_written(s);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    const uint64_t w_saved = spill_written(s) - w0;
    CHECK_EQ_U64(w_saved, 0); /* the last page is in the file too */
    CHECK_EQ_INT(rb_session_feed(s, &toks[N_PROMPT], 1, NULL), RB_OK); /* into it */
    const uint64_t w1 = spill_written(s);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    const uint64_t w_fed = spill_written(s) - w1;
    rb_session_stats st;
    rb_session_get_stats(s, &st);
    /* only the last page of each layer: a third of what is stored */
    CHECK(w_fed > 0 && w_fed * 2 < st.kv_stored_bytes);
    CHECK_EQ_INT(rb_session_feed(s, &toks[N_PROMPT + 1], 1, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, RB_SAVE_ON_REQUEST), RB_OK);
    const uint64_t w2 = spill_written(s);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    CHECK_EQ_U64(spill_written(s) - w2, 0); /* saved again: nothing written */
    CHECK_EQ_INT(rb_session_feed(s, &toks[N_PROMPT + 2], 1, NULL), RB_OK);
    float *got = last_logits(s);
    rb_session_destroy(s);
    unlink(path);
    rb_session *ref = open_session(m, RB_RESTORE_EAGER, RB_RAM_CODEC_LOSSLESS);
    CHECK_EQ_INT(rb_session_feed(ref, toks, N_PROMPT + 3, NULL), RB_OK);
    check_ref_logits(ref, got);
    printf("saved last page: trims after a save wrote %llu B; after a feed into it %llu B "
           "(the last pages); logits exact\n", (unsigned long long)w_saved,
           (unsigned long long)w_fed);
}

int main(void)
{
    split_test();
    unit_test();
    make_model();
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return check_report();
    int32_t prompt[N_PROMPT], steps[N_STEPS];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = (int32_t)rnd(512);
    for (int i = 0; i < N_STEPS; i++)
        steps[i] = (int32_t)rnd(512);
    const size_t V = 512, n_out = (size_t)N_STEPS * V;
    float *want = calloc(n_out, sizeof(float)), *got = calloc(n_out, sizeof(float));

    rb_session *ref = open_session(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS);
    run(ref, prompt, steps, want, NULL);
    rb_session_destroy(ref);
    spill_reuse_test(m, prompt);
    saved_last_page_test(m, prompt);

    /* 1. random trims, pipelined, lossless: bit-identical, 3 seeds */
    for (int seed = 0; seed < 3; seed++) {
        rng = rb_test_rng_seed(1000 + (uint64_t)seed);
        rb_session *s = open_session(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS);
        memset(got, 0, n_out * sizeof(float));
        run(s, prompt, steps, got, trim_random);
        CHECK(same(got, want, n_out));
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        printf("pipelined seed %d: restored io %.1f ms (%llu B), decode %.1f ms (%llu B), "
               "waited %.1f ms; spill: %s\n", seed, st.restore_io_s * 1e3,
               (unsigned long long)st.restore_bytes_io, st.restore_decode_s * 1e3,
               (unsigned long long)st.restore_bytes_decoded, st.restore_wait_s * 1e3,
               st.storage_io);
        rb_session_destroy(s);
    }

    /* 2. eager and recompute: the same logits */
    rb_restore_mode modes[] = {RB_RESTORE_EAGER, RB_RESTORE_RECOMPUTE};
    for (int i = 0; i < 2; i++) {
        rb_session *s = open_session(m, modes[i], RB_RAM_CODEC_LOSSLESS);
        memset(got, 0, n_out * sizeof(float));
        run(s, prompt, steps, got, trim_moderate);
        CHECK(same(got, want, n_out));
        if (modes[i] == RB_RESTORE_RECOMPUTE) {
            rb_session_stats st;
            rb_session_get_stats(s, &st);
            CHECK_EQ_INT(st.restore_recomputed_tokens, 0); /* the last feed had none */
        }
        rb_session_destroy(s);
    }

    /* 3. q8 RAM tier: runs, and the logits stay close (lossy) */
    {
        rb_session *s = open_session(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_Q8);
        run(s, prompt, steps, got, trim_moderate);
        double max_d = 0;
        for (size_t i = 0; i < n_out; i++) {
            double d = got[i] > want[i] ? got[i] - want[i] : want[i] - got[i];
            max_d = d > max_d ? d : max_d;
        }
        printf("q8 RAM tier: max |logit difference| %.3g\n", max_d);
        CHECK(max_d < 0.5);
        rb_session_destroy(s);
    }

    /* 4. faults: bit flips on every spill read, a vanished spill, a full
     *    disk: the same logits, and the stats count them */
    {
        rb_session *s = open_session(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS);
        swap_store(s);
        fault_flip_reads = 1;
        run(s, prompt, steps, got, trim_moderate);
        fault_flip_reads = 0;
        CHECK(same(got, want, n_out));
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        CHECK(st.n_spill_damaged > 0);
        printf("checksum faults: %llu pages recomputed\n", (unsigned long long)st.n_spill_damaged);
        rb_session_destroy(s);
    }
    {
        rb_session *s = open_session(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS);
        run(s, prompt, steps, got, trim_then_lose_one);
        CHECK(same(got, want, n_out));
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        CHECK(st.n_spill_damaged > 0);
        rb_session_destroy(s);
    }
    {
        rb_session *s = open_session(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS);
        swap_store(s);
        fault_enospc = 1;
        run(s, prompt, steps, got, trim_moderate);
        fault_enospc = 0;
        CHECK(same(got, want, n_out));
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        CHECK(st.n_disk_full > 0);
        /* trimmed again and again with the disk still full */
        fault_enospc = 1;
        for (int i = 0; i < 8; i++) {
            CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
            CHECK_EQ_INT(rb_session_feed(s, &steps[i % 4], 1, NULL), RB_OK);
        }
        fault_enospc = 0;
        rb_session_get_stats(s, &st);
        /* each page counted once, however often a trim retried it */
        uint64_t n_pages = 0;
        for (int t = 0; t < RB_TIER_COUNT; t++)
            n_pages += st.n_kv_pages[t];
        CHECK(st.n_disk_full <= n_pages);
        printf("full disk: %llu of %llu pages kept in RAM\n",
               (unsigned long long)st.n_disk_full, (unsigned long long)n_pages);
        rb_session_destroy(s);
    }

    /* 5. rewind and replay a turn after a trim: same logits; the timeline
     *    shows both restore paths and the compute of every layer */
    {
        rb_session *s = open_session(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS);
        CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_feed(s, steps, 1, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_rewind(s, N_PROMPT), RB_OK);
        CHECK_EQ_INT(rb_session_n_tokens(s), N_PROMPT);
        CHECK(rb_session_get_logits(s) == NULL);
        CHECK_EQ_INT(rb_session_rewind(s, N_PROMPT + 1), RB_E_INVALID_ARG);
        CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_feed(s, steps, 1, NULL), RB_OK);
        const float *l = rb_session_get_logits(s);
        CHECK(l && same(l, want, V));
        rb_restore_event ev[512];
        size_t n_ev = rb_session_restore_events(s, ev, 512);
        int seen[4] = {0}, bad = 0;
        for (size_t i = 0; i < n_ev && i < 512; i++) {
            seen[ev[i].kind]++;
            bad += !(ev[i].start_s >= 0 && ev[i].end_s >= ev[i].start_s);
        }
        CHECK(seen[RB_EVENT_RESTORE_IO] > 0);
        CHECK(seen[RB_EVENT_RESTORE_DECODE] > 0);
        CHECK_EQ_INT(seen[RB_EVENT_COMPUTE], 4); /* one span per layer */
        CHECK_EQ_INT(bad, 0);
        CHECK_EQ_INT(rb_session_set_restore(s, (rb_restore_mode)9, RB_RAM_CODEC_Q8),
                     RB_E_INVALID_ARG);
        CHECK_EQ_INT(rb_session_set_restore(s, RB_RESTORE_EAGER, RB_RAM_CODEC_Q8), RB_OK);
        rb_session_destroy(s);
    }

    /* 7. a quantized KV cache (q8_0 K, q4_0 V): 52 bytes per head and
     *    position instead of 128; its pages go through both tiers as bytes
     *    and come back bit-exact, a session file too; the q8 RAM codec
     *    (which re-quantizes f16 values) is refused for it */
    {
        float *want_q = calloc(n_out, sizeof(float));
        rb_session *s = open_session_kv(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS,
                                        RB_KV_Q8_0, RB_KV_Q4_0);
        if (s) {
            CHECK_EQ_INT(rb_session_kvcache(s)->page_bytes, 2u * 256 * (34 + 18));
            run(s, prompt, steps, want_q, NULL);
            rb_session_destroy(s);
        }
        for (int seed = 0; seed < 2; seed++) {
            rng = rb_test_rng_seed(2000 + (uint64_t)seed);
            s = open_session_kv(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS, RB_KV_Q8_0,
                                RB_KV_Q4_0);
            if (!s)
                break;
            memset(got, 0, n_out * sizeof(float));
            run(s, prompt, steps, got, seed ? trim_complete_odd : trim_moderate);
            CHECK(same(got, want_q, n_out));
            rb_session_destroy(s);
        }
        /* saved after the prompt, opened cold: the first step's logits */
        char path[600];
        snprintf(path, sizeof path, "%s/residency_kvq.rbs", REBOUND_TEST_TMP);
        unlink(path);
        s = open_session_kv(m, RB_RESTORE_PIPELINED, RB_RAM_CODEC_LOSSLESS, RB_KV_Q8_0,
                            RB_KV_Q4_0);
        if (s) {
            CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
            CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
            CHECK_EQ_INT(rb_session_set_restore(s, RB_RESTORE_PIPELINED, RB_RAM_CODEC_Q8),
                         RB_E_INVALID_ARG);
            rb_session_destroy(s);
            rb_session_params p = rb_session_default_params();
            p.n_ctx = 1024;
            p.n_threads = 2;
            p.kv_type_k = RB_KV_Q8_0;
            p.kv_type_v = RB_KV_Q4_0;
            rb_session *o = NULL;
            CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &o, &err), RB_OK);
            if (o) {
                CHECK_EQ_INT(rb_session_feed(o, steps, 1, NULL), RB_OK);
                const float *l = rb_session_get_logits(o);
                CHECK(l && same(l, want_q, V));
                CHECK_EQ_INT(rb_session_debug_recomputed_tokens(o), 0);
                rb_session_destroy(o);
            }
            /* an f16 session cannot read the q8_0/q4_0 pages */
            p.kv_type_k = p.kv_type_v = RB_KV_F16;
            o = NULL;
            CHECK(rb_session_open_saved(m, &p, path, &o, &err) != RB_OK);
            rb_session_destroy(o);
            unlink(path);
        }
        rb_session_params p = rb_session_default_params();
        p.kv_type_k = RB_KV_Q8_0;
        p.ram_codec = RB_RAM_CODEC_Q8;
        s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
        CHECK(strstr(err.message, "q8 RAM codec") != NULL);
        p.ram_codec = RB_RAM_CODEC_LOSSLESS;
        p.kv_type_v = (rb_kv_type)9;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
        CHECK_STR_EQ(rb_kv_type_name(RB_KV_Q4_0), "q4_0");
        CHECK_EQ_INT(rb_kv_type_from_name("q8_0"), RB_KV_Q8_0);
        CHECK_EQ_INT(rb_kv_type_from_name("q5_0"), -1);
        free(want_q);
    }

    /* 6. bad arguments */
    {
        rb_session_params p = rb_session_default_params();
        p.restore = (rb_restore_mode)7;
        rb_session *s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
        CHECK(strstr(err.message, "restore mode") != NULL);
        p = rb_session_default_params();
        rb_experimental_params toaster = rb_experimental_default_params();
        toaster.device = "toaster";
        p.experimental = &toaster;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_NOT_FOUND);
        p = rb_session_default_params();
        p.spill_dir = "/nonexistent/dir";
        CHECK(rb_session_create(m, &p, &s, &err) != RB_OK);
        CHECK(strstr(err.message, "/nonexistent/dir") != NULL);
    }

    free(want);
    free(got);
    rb_model_close(m);
    unlink(model_path);
    return check_report();
}
