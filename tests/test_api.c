/*
 * test_api.c - the public API's conventions (rebound.h): the version, the
 * sized getters (a program built against an older, shorter struct gets
 * only its bytes), the experimental parameters (copied at creation), the
 * status-returning sampler, and the 0.1 names that still compile.
 */
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "rebound.h"
#include "rebound_experimental.h"
#include "testlib.h"

#ifndef REBOUND_PROJECT_VERSION
#define REBOUND_PROJECT_VERSION "?"
#endif

static char model_path[1024];

static void test_version(void)
{
    CHECK_STR_EQ(rb_version(), REBOUND_VERSION_STRING);
    CHECK_STR_EQ(rb_version(), REBOUND_PROJECT_VERSION); /* header == CMake project */
    CHECK_EQ_U64(rb_version_number(), (uint64_t)REBOUND_VERSION_MAJOR << 16 |
                                          REBOUND_VERSION_MINOR << 8 | REBOUND_VERSION_PATCH);
}

static void test_sized_info(rb_model *m)
{
    rb_model_info full;
    CHECK_EQ_INT(rb_model_get_info(m, &full), RB_OK);
    CHECK_EQ_INT(full.n_layers, 3);
    /* an older caller whose struct ended before n_vocab: nothing written past it */
    unsigned char buf[sizeof(rb_model_info) + 16];
    memset(buf, 0xa5, sizeof buf);
    size_t old_size = offsetof(rb_model_info, n_vocab);
    CHECK_EQ_INT(rb_model_get_info_sized(m, (rb_model_info *)(void *)buf, old_size), RB_OK);
    CHECK(memcmp(buf, &full, old_size) == 0);
    int untouched = 1;
    for (size_t i = old_size; i < sizeof buf; i++)
        untouched &= buf[i] == 0xa5;
    CHECK(untouched);
    CHECK_EQ_INT(rb_model_get_info_sized(m, &full, 0), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_model_get_info_sized(NULL, &full, sizeof full), RB_E_INVALID_ARG);
}

/* Counts the feed progress calls it gets, in its own counter. */
static int count_progress(void *ctx, rb_progress_phase phase, uint64_t done, uint64_t total)
{
    (void)done, (void)total;
    if (phase == RB_PROGRESS_FEED)
        ++*(int *)ctx;
    return 0;
}

static void test_session(rb_model *m)
{
    rb_experimental_params x = rb_experimental_default_params();
    CHECK(x.device == NULL && x.decode_bytes_per_s == 0 && x.storage_bytes_per_s == 0);
    x.device = "phone";
    int progress_calls = 0, other_calls = 0;
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 256;
    p.n_threads = 1;
    p.progress = count_progress;
    p.progress_ctx = &progress_calls;
    p.experimental = &x;
    rb_session *s = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s)
        return;
    /* copied at creation: were they read later, these would be seen (p and
       x are used again below, so the compiler keeps these stores) */
    p.progress_ctx = &other_calls;
    x.device = "toaster";
    int32_t toks[8] = {1, 5, 9, 13, 17, 21, 25, 29};
    CHECK_EQ_INT(rb_session_feed(s, toks, 8, NULL), RB_OK);
    /* the callback's context as it was at creation, once per batch */
    CHECK_EQ_INT(progress_calls, 1);
    CHECK_EQ_INT(other_calls, 0);

    rb_session_stats st;
    CHECK_EQ_INT(rb_session_get_stats(s, &st), RB_OK);
    CHECK_NEAR(st.device_bytes_per_s, 1000.0 * 1024 * 1024, 1.0); /* the phone profile */
    CHECK(st.kv_raw_bytes > 0);
    CHECK_EQ_U64(st.total_bytes, st.weights_bytes + st.kv_raw_bytes + st.kv_compressed_bytes +
                                     st.scratch_bytes + st.other_bytes);
    /* an older, shorter struct: only its bytes */
    unsigned char buf[sizeof(rb_session_stats) + 16];
    memset(buf, 0x5a, sizeof buf);
    size_t old_size = offsetof(rb_session_stats, budget_bytes);
    CHECK_EQ_INT(rb_session_get_stats_sized(s, (rb_session_stats *)(void *)buf, old_size), RB_OK);
    CHECK(memcmp(buf, &st, offsetof(rb_session_stats, scratch_bytes)) == 0);
    int untouched = 1;
    for (size_t i = old_size; i < sizeof buf; i++)
        untouched &= buf[i] == 0x5a;
    CHECK(untouched);
    CHECK_EQ_INT(rb_session_get_stats_sized(s, &st, 0), RB_E_INVALID_ARG);

    /* the 0.1 names are the new functions */
    CHECK(rb_session_logits(s) == rb_session_get_logits(s));
    CHECK(rb_session_tokens(s) == rb_session_get_tokens(s));
    CHECK_EQ_U64(rb_model_layer_bytes(m, 0), rb_model_get_layer_bytes(m, 0));

    /* the sampler returns a status; the token through its out-parameter */
    rb_sampler_params sp = rb_sampler_default_params();
    sp.temp = 0;
    rb_sampler *smp = NULL;
    CHECK_EQ_INT(rb_sampler_create(&sp, rb_session_n_vocab(s), &smp, &err), RB_OK);
    if (smp) {
        int32_t tok = -7;
        CHECK_EQ_INT(rb_sampler_sample(smp, rb_session_get_logits(s), NULL, 0, &tok), RB_OK);
        const float *l = rb_session_get_logits(s);
        int32_t best = 0;
        for (uint32_t i = 1; i < rb_session_n_vocab(s); i++)
            if (l[i] > l[best])
                best = (int32_t)i;
        CHECK_EQ_INT(tok, best);
        int32_t before = tok;
        CHECK_EQ_INT(rb_sampler_sample(smp, NULL, NULL, 0, &tok), RB_E_INVALID_ARG);
        CHECK_EQ_INT(tok, before); /* out-parameter unchanged on failure */
        CHECK_CONTAINS(rb_sampler_errmsg(smp), "logits");
        CHECK_EQ_INT(rb_sampler_sample(smp, l, NULL, 0, NULL), RB_E_INVALID_ARG);
        const rb_sampler_candidate *c = NULL;
        size_t n = 0;
        CHECK_EQ_INT(rb_sampler_get_candidates(smp, l, NULL, 0, &c, &n), RB_OK);
        CHECK_EQ_U64(n, 1);
        CHECK(c && c[0].id == best);
        rb_sampler_destroy(smp);
    }
    rb_session_destroy(s);

    /* the detokenizer never cuts a piece: a short buffer is an error and
       consumes nothing */
    rb_detokenizer *d = NULL;
    CHECK_EQ_INT(rb_detokenizer_create(m, &d, &err), RB_OK);
    if (d) {
        size_t cap = rb_detokenizer_max_bytes(d), k = 99;
        char *text = malloc(cap);
        CHECK_EQ_INT(rb_detokenizer_push(d, 300, text, cap - 1, &k), RB_E_INVALID_ARG);
        CHECK_EQ_U64(k, 99);
        CHECK_CONTAINS(rb_detokenizer_errmsg(d), "rb_detokenizer_max_bytes");
        CHECK_EQ_INT(rb_detokenizer_push(d, 1 << 20, text, cap, &k), RB_E_INVALID_ARG);
        CHECK_CONTAINS(rb_detokenizer_errmsg(d), "vocabulary");
        CHECK_EQ_INT(rb_detokenizer_push(d, 300, text, cap, &k), RB_OK);
        CHECK(k > 0);
        CHECK_EQ_INT(rb_detokenizer_flush(d, text, cap, &k), RB_OK);
        free(text);
        rb_detokenizer_destroy(d);
    }

    /* an unknown device is named */
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_NOT_FOUND);
    CHECK_CONTAINS(err.message, "toaster");
}

/* The params structs are versioned by their struct_size: one left unset is
 * refused by name; an older, shorter one is read only as far as it goes
 * (what follows is not read: its fields take their defaults); a newer,
 * longer one is accepted while the fields this library does not know are
 * zero, refused when one is set. */
static int g_late_calls;
static int count_late(void *ctx, rb_progress_phase phase, uint64_t done, uint64_t total)
{
    (void)ctx, (void)phase, (void)done, (void)total;
    g_late_calls++;
    return 0;
}

static void test_versioned_params(rb_model *m)
{
    rb_error err;
    rb_session *s = NULL;
    rb_session_params p = rb_session_default_params();
    CHECK_EQ_U64(p.struct_size, sizeof p);
    CHECK_EQ_INT(p.n_batch, 128);
    p.struct_size = 0;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "rb_session_params: struct_size is 0");
    CHECK(s == NULL);
    p.struct_size = (size_t)1 << 40; /* garbage: refused, never read that far */
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);

    /* older: a program whose struct ended before the progress fields */
    unsigned char buf[sizeof(rb_session_params) + 64];
    memset(buf, 0, sizeof buf);
    rb_session_params *q = (rb_session_params *)(void *)buf;
    rb_session_params_init(q, offsetof(rb_session_params, progress));
    CHECK_EQ_U64(q->struct_size, offsetof(rb_session_params, progress));
    CHECK_EQ_INT(q->n_batch, 128);
    q->n_ctx = 64;
    q->n_threads = 1;
    q->progress = count_late; /* past its end: never read */
    CHECK_EQ_INT(rb_session_create(m, q, &s, &err), RB_OK);
    if (s) {
        int32_t t[2] = {3, 4};
        CHECK_EQ_INT(rb_session_feed(s, t, 2, NULL), RB_OK);
        CHECK_EQ_INT(g_late_calls, 0);
        rb_session_destroy(s);
        s = NULL;
    }

    /* newer: 64 more bytes, zero (accepted), then one set (refused) */
    memset(buf, 0xee, sizeof buf);
    rb_session_params_init(q, sizeof buf);
    CHECK_EQ_U64(q->struct_size, sizeof buf);
    int tail_zero = 1;
    for (size_t i = sizeof(rb_session_params); i < sizeof buf; i++)
        tail_zero &= buf[i] == 0;
    CHECK(tail_zero);
    q->n_ctx = 64;
    q->n_threads = 1;
    CHECK_EQ_INT(rb_session_create(m, q, &s, &err), RB_OK);
    rb_session_destroy(s);
    s = NULL;
    buf[sizeof(rb_session_params) + 5] = 1;
    CHECK_EQ_INT(rb_session_create(m, q, &s, &err), RB_E_UNSUPPORTED);
    CHECK_CONTAINS(err.message, "does not know");

    /* the model's too */
    rb_model_params mp = rb_model_default_params();
    CHECK_EQ_U64(mp.struct_size, sizeof mp);
    CHECK_EQ_INT(mp.sigbus_guard, 1);
    mp.struct_size = 0;
    rb_model *m2 = NULL;
    CHECK_EQ_INT(rb_model_open(model_path, &mp, &m2, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "rb_model_params: struct_size is 0");
    rb_model_params_init(&mp, offsetof(rb_model_params, sigbus_guard)); /* before the guard */
    mp.sigbus_guard = 0; /* past its end: the default (1) holds */
    CHECK_EQ_INT(rb_model_open(model_path, &mp, &m2, &err), RB_OK);
    rb_model_close(m2);
}

/* Progress: a feed reports its own tokens with one total (150 here, in
 * batches of 16), and RB_PROGRESS_RESTORE comes only when a feed brings
 * something back (after a trim), once per layer with total n_layers. */
typedef struct prog_log {
    int n_feed, n_restore, bad_total, not_growing;
    uint64_t feed_total, last_done, restore_total;
} prog_log;

static int log_progress(void *ctx, rb_progress_phase phase, uint64_t done, uint64_t total)
{
    prog_log *g = ctx;
    if (phase == RB_PROGRESS_FEED) {
        if (g->n_feed && (total != g->feed_total || done <= g->last_done))
            g->not_growing++;
        g->n_feed++;
        g->feed_total = total;
        g->last_done = done;
    } else if (phase == RB_PROGRESS_RESTORE) {
        if (g->n_restore && total != g->restore_total)
            g->bad_total++;
        g->n_restore++;
        g->restore_total = total;
    }
    return 0;
}

static void test_progress(rb_model *m)
{
    prog_log g;
    memset(&g, 0, sizeof g);
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 256;
    p.n_batch = 16;
    p.n_threads = 1;
    p.progress = log_progress;
    p.progress_ctx = &g;
    rb_session *s = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s)
        return;
    int32_t toks[150];
    for (int i = 0; i < 150; i++)
        toks[i] = (i * 37 + 11) % 500;
    CHECK_EQ_INT(rb_session_feed(s, toks, 150, NULL), RB_OK);
    CHECK_EQ_INT(g.n_restore, 0); /* nothing was evicted */
    CHECK_EQ_INT(g.n_feed, 10);   /* ceil(150 / 16) batches */
    CHECK_EQ_U64(g.feed_total, 150);
    CHECK_EQ_U64(g.last_done, 150);
    CHECK_EQ_INT(g.not_growing, 0);
    int32_t one = 7;
    CHECK_EQ_INT(rb_session_feed(s, &one, 1, NULL), RB_OK);
    CHECK_EQ_INT(g.n_restore, 0);
    /* evicted: the next feed restores, and says so layer by layer */
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    memset(&g, 0, sizeof g);
    CHECK_EQ_INT(rb_session_feed(s, &one, 1, NULL), RB_OK);
    CHECK_EQ_INT(g.n_restore, 3);
    CHECK_EQ_U64(g.restore_total, 3);
    CHECK_EQ_INT(g.bad_total, 0);
    rb_session_destroy(s);
}

/* A model opened with use_mmap: its weights are the page cache's; every
 * trim level takes the session's KV and is no error (the header once said
 * RB_E_UNSUPPORTED), and the feed after it gives the same logits. */
static void test_trim_mapped(void)
{
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = 1;
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, &mp, &m, &err), RB_OK);
    if (!m)
        return;
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 256;
    p.n_threads = 1;
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = (i * 13 + 5) % 500;
    float want[512];
    rb_session *r = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &r, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(r, toks, 40, NULL), RB_OK);
    memcpy(want, rb_session_get_logits(r), sizeof want);
    rb_session_destroy(r);
    CHECK_EQ_INT(rb_session_feed(s, toks, 39, NULL), RB_OK);
    uint64_t freed = 0;
    CHECK_EQ_INT(rb_session_trim(s, 1ull << 40, RB_TRIM_BYTES, &freed), RB_OK);
    CHECK(freed > 0); /* the KV */
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_MODERATE, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, toks + 39, 1, NULL), RB_OK);
    CHECK(rb_session_get_logits(s) && memcmp(rb_session_get_logits(s), want, sizeof want) == 0);
    rb_session_destroy(s);
    rb_model_close(m);
}

/* The model's load progress: from 0 to the tensor bytes, growing, on the
 * first session's creation. And a model opened from a file descriptor the
 * caller closes at once: the same logits as one opened by path; a bad
 * descriptor is refused by name. */
typedef struct load_log {
    int n, not_growing, other_phase;
    uint64_t first, last, total;
} load_log;

static int log_load(void *ctx, rb_progress_phase phase, uint64_t done, uint64_t total)
{
    load_log *g = ctx;
    if (phase != RB_PROGRESS_LOAD)
        g->other_phase++;
    if (g->n == 0)
        g->first = done;
    else if (done < g->last || total != g->total)
        g->not_growing++;
    g->n++;
    g->last = done;
    g->total = total;
    return 0;
}

static void test_load_progress_and_fd(void)
{
    rb_error err;
    int32_t toks[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    rb_session_params sp = rb_session_default_params();
    sp.n_ctx = 64;
    sp.n_threads = 1;
    float want[512];
    load_log g;
    memset(&g, 0, sizeof g);
    rb_model_params mp = rb_model_default_params();
    mp.progress = log_load;
    mp.progress_ctx = &g;
    rb_model *a = NULL;
    CHECK_EQ_INT(rb_model_open(model_path, &mp, &a, &err), RB_OK);
    if (!a)
        return;
    CHECK_EQ_INT(g.n, 0); /* the open reads no weights */
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(a, &sp, &s, &err), RB_OK);
    rb_model_info info;
    CHECK_EQ_INT(rb_model_get_info(a, &info), RB_OK);
    CHECK(g.n >= 2);
    CHECK_EQ_U64(g.first, 0);
    CHECK_EQ_U64(g.last, g.total);
    CHECK(g.total > 0);
    CHECK_EQ_INT(g.not_growing, 0);
    CHECK_EQ_INT(g.other_phase, 0);
    CHECK_EQ_INT(rb_session_feed(s, toks, 12, NULL), RB_OK);
    memcpy(want, rb_session_get_logits(s), sizeof want);
    rb_session_destroy(s);
    rb_model_close(a);

    int fd = open(model_path, O_RDONLY);
    CHECK(fd >= 0);
    rb_model *b = NULL;
    CHECK_EQ_INT(rb_model_open_fd(fd, NULL, &b, &err), RB_OK);
    close(fd); /* the model keeps its own */
    s = NULL;
    if (b && rb_session_create(b, &sp, &s, &err) == RB_OK) {
        CHECK_EQ_INT(rb_session_feed(s, toks, 12, NULL), RB_OK);
        CHECK(memcmp(rb_session_get_logits(s), want, sizeof want) == 0);
        rb_session_destroy(s);
    } else {
        CHECK(0 && "a session of the fd-opened model");
    }
    rb_model_close(b);
    b = NULL;
    int closed = open(model_path, O_RDONLY); /* a descriptor surely not open: */
    close(closed);                          /* nothing opens between */
    CHECK_EQ_INT(rb_model_open_fd(closed, NULL, &b, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "file descriptor");
    CHECK(b == NULL);
}

int main(void)
{
    test_version();
    rb_test_tmp_path(model_path, sizeof model_path, "test_api", "m.gguf");
    CHECK_EQ_INT(rb_test_make_model(model_path, &(rb_test_model_spec){
                                                    .n_embd = 64, .n_layers = 3, .n_head = 4,
                                                    .n_head_kv = 2, .n_ff = 128, .n_vocab = 512,
                                                    .n_ctx = 512, .seed = 3}),
                 RB_OK);
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (m) {
        test_sized_info(m);
        test_session(m);
        test_versioned_params(m);
        test_progress(m);
        test_trim_mapped();
        test_load_progress_and_fd();
        rb_model_close(m);
    }
    remove(model_path);
    return check_report();
}
