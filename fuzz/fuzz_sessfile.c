/*
 * fuzz_sessfile.c - libFuzzer target for session files (src/sessfile.c,
 * the open path of src/session_file.c, and `rebound chat`'s use of them).
 *
 * Each input (compact form: fuzz/sess_model.h) is written out as a session
 * file of the small synthetic model and opened:
 *   - through the file layer: rb_sessfile_open with the model's geometry
 *     and vocabulary; when it opens, every saved page is read, and a commit
 *     of one more token (every page in RAM written) is opened again and
 *     must hold what was committed;
 *   - or (control bits 1 and 2) as a session, rb_session_open_saved, and when it
 *     opens, one token is fed and the stats read.
 * Built with REBOUND_FUZZ (-DREBOUND_FUZZ=ON), sessfile.c skips its
 * checksums, so mutated fields reach the checks behind them. A broken
 * invariant calls __builtin_trap().
 *
 * Seeds: make_sesscorpus (fuzz/make_sesscorpus.c) writes real files (a run,
 * a chat, a rewound and recommitted one, a trimmed one, a spilled one) in
 * this form. Build and run: fuzz/README.md.
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sess_model.h"
#include "sessfile.h"
#include "session_internal.h"

static rb_model *model;
static rb_sessfile_geom geom;
static char file_path[256], model_path[256], dir_path[256];

static void remove_file(void)
{
    unlink(file_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* in memory where there is a tmpfs: a commit's O_DIRECT writes to a
       disk made it ~30 inputs/s */
    const char *tmp = getenv("REBOUND_FUZZ_DIR")        ? getenv("REBOUND_FUZZ_DIR")
                      : access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                      : getenv("TMPDIR")              ? getenv("TMPDIR")
                                                      : "/tmp";
    /* one model for every run (deterministic; written atomically): a
       session's open reads it again for its fingerprint */
    snprintf(dir_path, sizeof dir_path, "%s", tmp);
    snprintf(model_path, sizeof model_path, "%s/rebound-fuzz-sess-model.gguf", tmp);
    snprintf(file_path, sizeof file_path, "%s/rebound-fuzz-sess-%ld.rbs", tmp, (long)getpid());
    model = fuzz_sess_model(model_path);
    if (!model)
        abort();
    atexit(remove_file);
    /* the geometry a session of this model has */
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = fuzz_sess_params();
    if (rb_session_create(model, &p, &s, &err) != RB_OK)
        abort();
    geom.n_layers = s->kv.n_layers;
    geom.n_kv_heads = s->kv.n_kv_heads;
    geom.head_dim_k = s->kv.head_dim_k;
    geom.head_dim_v = s->kv.head_dim_v;
    geom.page_tokens = s->kv.page_tokens;
    geom.pages_per_layer = s->kv.pages_per_layer;
    geom.page_bytes = s->kv.page_bytes;
    geom.page_alloc = rb_kvcache_page_alloc_bytes(&s->kv);
    geom.max_blob = FUZZ_SESS_MAX_BLOB;
    geom.n_ctx = s->kv.n_ctx;
    geom.n_vocab = rb_session_n_vocab(s);
    rb_session_destroy(s);
    return 0;
}

/* Writes the input out as the file it stands for; 0, or -1 (I/O). */
static int inflate(const uint8_t *d, size_t n, int raw)
{
    int fd = open(file_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    int rc = 0;
    if (raw) {
        rc = n && pwrite(fd, d, n, 0) != (ssize_t)n ? -1 : 0;
    } else {
        const uint64_t area = fuzz_sess_cat_area();
        const uint64_t where[4] = {0, FUZZ_SESS_A, 2 * FUZZ_SESS_A, 2 * FUZZ_SESS_A + area};
        const uint64_t room[4] = {FUZZ_SESS_A, FUZZ_SESS_A, area, area};
        size_t at = 0;
        for (int i = 0; i < 4 && rc == 0; i++) {
            if (n - at < 2)
                break;
            size_t k = (size_t)d[at] | (size_t)d[at + 1] << 8;
            at += 2;
            if (k > n - at)
                k = n - at;
            size_t w = k < room[i] ? k : (size_t)room[i];
            if (w && pwrite(fd, d + at, w, (off_t)where[i]) != (ssize_t)w)
                rc = -1;
            at += k;
        }
        uint64_t data0 = 2 * FUZZ_SESS_A + 2 * area;
        if (rc == 0 && ftruncate(fd, (off_t)data0) != 0)
            rc = -1;
        if (rc == 0 && n > at && pwrite(fd, d + at, n - at, (off_t)data0) != (ssize_t)(n - at))
            rc = -1;
    }
    close(fd);
    return rc;
}

static void file_layer(void)
{
    rb_sessfile *f = NULL;
    rb_error err;
    if (rb_sessfile_open(file_path, NULL, &geom, NULL, NULL, &f, &err) != RB_OK)
        return;
    size_t n = rb_sessfile_n_tokens(f);
    const int32_t *t = rb_sessfile_tokens(f);
    if (n > geom.n_ctx)
        __builtin_trap();
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= geom.n_vocab)
            __builtin_trap();
    size_t bn;
    rb_sessfile_blob(f, &bn);
    if (bn > geom.max_blob)
        __builtin_trap();
    const size_t n_slots = (size_t)geom.n_layers * geom.pages_per_layer;
    void **slots = calloc(n_slots, sizeof *slots);
    for (size_t i = 0; slots && i < n_slots; i++) {
        slots[i] = aligned_alloc(4096, geom.page_alloc);
        if (!slots[i])
            break;
        memset(slots[i], (int)i, geom.page_alloc);
        uint32_t l = (uint32_t)(i / geom.pages_per_layer), p = (uint32_t)(i % geom.pages_per_layer);
        uint32_t held = rb_sessfile_page_tokens(f, l, p);
        if (held > geom.page_tokens)
            __builtin_trap();
        if (held)
            (void)rb_sessfile_read_page(f, l, p, slots[i], &err);
    }
    /* one more token, every page written: the file must hold it after */
    int32_t *toks = malloc((n + 1) * sizeof *toks);
    if (toks && n < geom.n_ctx) {
        memcpy(toks, t, n * sizeof *toks);
        toks[n] = 1;
        rb_sessfile_slot_table tab = {slots, geom.pages_per_layer};
        rb_sessfile_source src = rb_sessfile_slots(&tab);
        rb_status st = rb_sessfile_commit(f, toks, n + 1, &src, 1, "fz", 2, 0, NULL, &err);
        rb_sessfile_close(f);
        f = NULL;
        if (st == RB_OK) {
            if (rb_sessfile_open(file_path, NULL, &geom, NULL, NULL, &f, &err) != RB_OK ||
                rb_sessfile_n_tokens(f) != n + 1 ||
                memcmp(rb_sessfile_tokens(f), toks, (n + 1) * sizeof *toks) != 0)
                __builtin_trap();
            void *buf = aligned_alloc(4096, geom.page_alloc);
            for (size_t i = 0; buf && i < n_slots; i++) {
                uint32_t l = (uint32_t)(i / geom.pages_per_layer);
                uint32_t p = (uint32_t)(i % geom.pages_per_layer);
                if (rb_sessfile_page_tokens(f, l, p) &&
                    rb_sessfile_read_page(f, l, p, buf, &err) == RB_OK &&
                    memcmp(buf, slots[i], geom.page_bytes) != 0)
                    __builtin_trap(); /* a page written now reads back as written */
            }
            free(buf);
        }
    }
    free(toks);
    rb_sessfile_close(f);
    for (size_t i = 0; slots && i < n_slots; i++)
        free(slots[i]);
    free(slots);
}

static void session_layer(void)
{
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = fuzz_sess_params();
    p.spill_dir = dir_path; /* its spill file in memory too: $TMPDIR was a disk */
    if (rb_session_open_saved(model, &p, file_path, &s, &err) != RB_OK)
        return;
    if (rb_session_n_tokens(s) > rb_session_n_ctx(s))
        __builtin_trap();
    /* positions without saved K/V are recomputed by the feed, each over
       all before it: up to 512 of them made a session input cost ~100 file
       inputs (three quarters of the fuzzer's time in attention, no file
       byte in it). A rewind first keeps that to 8 (its own path too). */
    size_t valid = s->n_kv_valid < rb_session_n_tokens(s) ? s->n_kv_valid
                                                          : rb_session_n_tokens(s);
    if (rb_session_n_tokens(s) > valid + 8 && rb_session_rewind(s, valid + 8) != RB_OK)
        __builtin_trap();
    int32_t t = 2;
    size_t n = rb_session_n_tokens(s);
    /* a full disk or a damaged page is not this input's fault: only a
       token that does not fit may be refused */
    rb_status st_feed = rb_session_feed(s, &t, 1, NULL);
    if (st_feed == RB_OK && rb_session_n_tokens(s) != n + 1)
        __builtin_trap();
    rb_session_stats st;
    (void)rb_session_get_stats(s, &st);
    rb_session_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (inflate(data + 1, size - 1, data[0] & 1) != 0)
        return 0;
    if ((data[0] & 6) == 6) /* a session costs ~20 file-layer inputs: 1 in 4 */
        session_layer();
    else
        file_layer();
    return 0;
}
