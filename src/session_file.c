/*
 * session_file.c - binds a session to its session file (sessfile.h): the
 * public rb_session_save / rb_session_open_saved / blob, and the commit
 * after each feed.
 *
 * What a commit writes: the pages that filled up since the last one (they
 * never change again), the tokens and the blob; an explicit save also the
 * partly filled last page. Each full page written is then known to the
 * residency manager as saved: a later trim drops it from RAM without
 * writing anything, and a restore reads it from this file.
 *
 * A cold open reads only the catalog and the model's non-layer tensors;
 * every layer's weights and every saved page are left for the first feed's
 * restore plan (layer order, pipelined with compute). Positions the file
 * does not cover (the unsaved tail, a page that fails its checksum later)
 * are recomputed from the tokens by the feed.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvcodec.h"
#include "residency.h"
#include "sessfile.h"
#include "session_internal.h"
#include "status.h"

#define MAX_BLOB (256u << 10)

/* the throttle's clock (CLOCK_MONOTONIC), in seconds */
static double now_s(void) { return (double)rb_throttle_now_ns() * 1e-9; }

/* The model's identity: a hash of its header (metadata and tensor index:
 * every tensor's type, shape and place) and of the first 64 bytes of every
 * tensor's data - two files with the same header but other weights (two
 * fine-tunes converted alike) differ there. */
#define FP_SAMPLE 64
static rb_status model_fingerprint(const rb_model *m, uint64_t *out, rb_error *err)
{
    const rb_gguf *g = rb_model_gguf(m);
    uint64_t n = rb_gguf_data_offset(g), nt = rb_gguf_n_tensors(g);
    const char *path = rb_model_path(m);
    uint8_t *buf = malloc(n + nt * FP_SAMPLE + 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    rb_status st = RB_OK;
    if (!buf || fd < 0)
        st = rb_error_set(err, buf ? RB_E_IO : RB_E_NOMEM, "session: cannot read the header of "
                          "'%s' for its fingerprint: %s", path, strerror(errno));
    else if (rb_os_read_full(rb_os_default(), fd, buf, (size_t)n, 0, NULL, NULL) != RB_OK)
        st = rb_error_set(err, RB_E_IO, "session: cannot read the header of '%s'", path);
    for (uint64_t i = 0; st == RB_OK && i < nt; i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        uint8_t *dst = buf + n + i * FP_SAMPLE;
        memset(dst, 0, FP_SAMPLE);
        size_t k = t->n_bytes < FP_SAMPLE ? (size_t)t->n_bytes : FP_SAMPLE;
        rb_status rst = rb_os_read_full(rb_os_default(), fd, dst, k, t->file_offset, NULL, NULL);
        if (rst != RB_OK && rst != RB_E_SHORT_READ)
            st = rb_error_set(err, RB_E_IO, "session: cannot read '%s' for its fingerprint",
                              path);
    }
    if (st == RB_OK)
        *out = rb_kvcodec_hash64(buf, (size_t)(n + nt * FP_SAMPLE)) ^ n;
    if (fd >= 0)
        close(fd);
    free(buf);
    return st;
}

static void geometry(const rb_session *s, rb_sessfile_geom *g)
{
    memset(g, 0, sizeof *g);
    g->n_layers = s->kv.n_layers;
    g->n_kv_heads = s->kv.n_kv_heads;
    g->head_dim_k = s->kv.head_dim_k;
    g->head_dim_v = s->kv.head_dim_v;
    g->page_tokens = s->kv.page_tokens;
    g->pages_per_layer = s->kv.pages_per_layer;
    g->page_bytes = s->kv.page_bytes;
    g->page_alloc = rb_kvcache_page_alloc_bytes(&s->kv);
    g->max_blob = MAX_BLOB;
}

static int read_saved(void *ctx, uint32_t layer, uint32_t page, void *buf, rb_error *err)
{
    return rb_sessfile_read_page(ctx, layer, page, buf, err) == RB_OK ? 0 : -1;
}

/* Tells the residency manager which full pages the file now holds. */
static void mark_saved_pages(rb_session *s)
{
    for (uint32_t l = 0; l < s->kv.n_layers; l++)
        for (uint32_t p = 0; p < s->kv.n_pages_reserved; p++)
            if (rb_sessfile_page_tokens(s->file, l, p) == s->kv.page_tokens)
                rb_residency_mark_saved(s->res, l, p, 1);
}

static rb_status commit(rb_session *s, int with_tail)
{
    double t0 = now_s();
    uint32_t written = 0;
    rb_error err = {0};
    /* every token; pages whose positions are not computed yet have no slot */
    rb_status st = rb_sessfile_commit(s->file, s->tokens, s->n_tokens, (void *const *)s->kv.pages,
                                      with_tail, s->blob, s->blob_n, s->file_fsync, &written,
                                      &err);
    s->file_commit_s += now_s() - t0;
    s->file_status = st;
    if (st != RB_OK) {
        snprintf(s->file_note, sizeof s->file_note, "%s", err.message);
        return rb_error_set(&s->err, st, "%s", err.message);
    }
    s->file_commits++;
    s->file_pages_written += written;
    mark_saved_pages(s);
    return RB_OK;
}

static void close_file(rb_session *s)
{
    if (s->res)
        rb_residency_set_saved_source(s->res, NULL, NULL);
    rb_sessfile_close(s->file);
    s->file = NULL;
    free(s->file_path);
    s->file_path = NULL;
}

rb_status rb_session_save(rb_session *s, const char *path, unsigned flags)
{
    if (!s || !path)
        return RB_E_INVALID_ARG;
    const int fsync = (flags & RB_SAVE_FSYNC) != 0;
    if ((flags & RB_SAVE_SNAPSHOT) || !s->file || strcmp(path, s->file_path) != 0) {
        uint64_t fp;
        rb_status st = model_fingerprint(s->model, &fp, &s->err);
        if (st != RB_OK)
            return st;
        rb_sessfile_geom g;
        geometry(s, &g);
        rb_sessfile *f = NULL;
        rb_error err;
        if ((st = rb_sessfile_create(path, fp, &g, NULL, s->throttle, &f, &err)) != RB_OK)
            return rb_error_set(&s->err, st, "%s", err.message);
        if (flags & RB_SAVE_SNAPSHOT) {
            /* resident pages only: a copy of an evicted page would need it
               back first; its positions are recomputed by the opener */
            st = rb_sessfile_commit(f, s->tokens, s->n_tokens, (void *const *)s->kv.pages, 1,
                                    s->blob, s->blob_n, fsync, NULL, &err);
            rb_sessfile_close(f);
            return st == RB_OK ? RB_OK : rb_error_set(&s->err, st, "%s", err.message);
        }
        char *p = strdup(path);
        if (!p) {
            rb_sessfile_close(f);
            return rb_error_set(&s->err, RB_E_NOMEM, "session: out of memory");
        }
        close_file(s);
        s->file = f;
        s->file_path = p;
        rb_residency_set_saved_source(s->res, read_saved, f);
    }
    s->file_fsync = fsync;
    return commit(s, 1);
}

rb_status rb_session_open_saved(rb_model *model, const rb_session_params *params,
                                const char *path, rb_session **out, rb_error *err)
{
    if (!model || !path || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model, path and out are required");
    if (access(path, F_OK) != 0)
        return rb_error_set(err, RB_E_NOT_FOUND, "session file: '%s' does not exist", path);
    rb_session *s = NULL;
    rb_status st = rb_session_create_impl(model, params, 1, &s, err);
    if (st != RB_OK)
        return st;
    uint64_t fp;
    rb_sessfile_geom g;
    geometry(s, &g);
    rb_sessfile *f = NULL;
    if ((st = model_fingerprint(model, &fp, err)) != RB_OK ||
        (st = rb_sessfile_open(path, fp, &g, NULL, s->throttle, &f, err)) != RB_OK) {
        rb_session_destroy(s);
        return st;
    }
    size_t n = rb_sessfile_n_tokens(f);
    const int32_t *toks = rb_sessfile_tokens(f);
    for (size_t i = 0; i < n; i++)
        if (toks[i] < 0 || (uint32_t)toks[i] >= s->fwd.hp.n_vocab) {
            rb_sessfile_close(f);
            rb_session_destroy(s);
            return rb_error_set(err, RB_E_FORMAT, "session file: '%s': token %zu is %" PRId32
                                ", outside the vocabulary", path, i, toks[i]);
        }
    memcpy(s->tokens, toks, n * sizeof *toks);
    s->n_tokens = n;
    size_t bn;
    const void *b = rb_sessfile_blob(f, &bn);
    if (bn && (s->blob = malloc(bn))) {
        memcpy(s->blob, b, bn);
        s->blob_n = bn;
    }
    /* The positions the file covers: page by page, every layer must hold
       all of the page's positions below n. */
    const uint32_t P = s->kv.page_tokens;
    size_t covered = 0;
    uint32_t pages = 0;
    while (covered < n) {
        uint32_t need = n - covered >= P ? P : (uint32_t)(n - covered);
        int all = 1;
        for (uint32_t l = 0; l < s->kv.n_layers && all; l++)
            all = rb_sessfile_page_tokens(f, l, pages) >= need;
        if (!all)
            break;
        covered += need;
        pages++;
    }
    for (uint32_t l = 0; l < s->kv.n_layers; l++)
        for (uint32_t p = 0; p < pages; p++)
            rb_residency_adopt_saved(s->res, l, p, rb_sessfile_page_tokens(f, l, p) == P);
    s->kv.n_pages_reserved = pages;
    rb_residency_set_pages(s->res, pages);
    s->n_kv_valid = covered;
    s->file = f;
    s->file_path = strdup(path);
    rb_residency_set_saved_source(s->res, read_saved, f);
    *out = s;
    return RB_OK;
}

void rb_session_file_after_feed(rb_session *s)
{
    if (s->file)
        commit(s, 0); /* a failure is in the stats and the errmsg, not the feed */
}

void rb_session_file_rewound(rb_session *s)
{
    if (s->file)
        rb_sessfile_truncate(s->file, s->n_tokens);
}

void rb_session_file_close(rb_session *s)
{
    close_file(s);
    free(s->blob);
    s->blob = NULL;
    s->blob_n = 0;
}

rb_status rb_session_set_blob(rb_session *s, const void *data, size_t n)
{
    if (!s || (n && !data))
        return RB_E_INVALID_ARG;
    if (n > MAX_BLOB)
        return rb_error_set(&s->err, RB_E_INVALID_ARG, "session: blob of %zu bytes exceeds %u",
                            n, MAX_BLOB);
    uint8_t *b = n ? malloc(n) : NULL;
    if (n && !b)
        return rb_error_set(&s->err, RB_E_NOMEM, "session: out of memory");
    if (n)
        memcpy(b, data, n);
    free(s->blob);
    s->blob = b;
    s->blob_n = n;
    return RB_OK;
}

const void *rb_session_get_blob(const rb_session *s, size_t *n)
{
    *n = s ? s->blob_n : 0;
    return s ? s->blob : NULL;
}
