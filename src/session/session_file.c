/*
 * session_file.c - binds a session to its session file (sessfile.h), for
 * session.c's rb_session_save / rb_session_open_saved / unbind / blob: the
 * commit after each feed, an explicit save or snapshot, what an open
 * reads. Its struct and interface are session_file.h; it never calls back
 * into session.c.
 *
 * What a commit writes: the pages that filled up since the last one (they
 * never change again), the tokens and the blob; an explicit save also the
 * partly filled last page. Each full page written is then known to the
 * residency manager as saved: a later trim drops it from RAM without
 * writing anything, and a restore reads it from this file.
 *
 * Write-behind: a feed hands its commit to the storage worker
 * (session_writer.h) and returns; the worker runs one commit at a time and
 * a newer one replaces a commit still pending. What the worker reads while
 * the session goes on, and why it stays valid:
 *   - tokens [0, n): a feed only appends beyond them; a rewind, the only
 *     thing that changes them, waits for the worker (rb_session_file_rewound
 *     runs before the rewind returns, and the file changes at the next
 *     commit anyway);
 *   - the blob: copied when the commit is handed over;
 *   - page buffers: pinned one at a time at the residency manager, which
 *     makes a trim by bytes skip the page (no wait inside a feed's budget
 *     trim) and a trim by level or a forget wait for the unpin; a pin fails
 *     once a forget happened since the commit was handed over (the page is
 *     being recomputed), so that commit writes fewer pages - still a
 *     consistent state, the next commit writes them;
 *   - the session file handle: the worker's alone while a commit runs; an
 *     explicit save, a rewind and close wait for the worker first, and a
 *     restore reads only saved pages, whose entries a commit does not touch.
 * Acknowledged means committed: rb_session_save waits for the worker and
 * commits on the caller's thread (durable on return; fsync on request);
 * file_tokens_committed is the state a kill -9 leaves.
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
#include "session_memory.h"
#include "sessfile.h"
#include "session_file.h"
#include "session_writer.h"
#include "status.h"

#define MAX_BLOB (256u << 10)

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

static void geometry(const rb_session_file *f, rb_sessfile_geom *g)
{
    memset(g, 0, sizeof *g);
    g->n_layers = f->kv->n_layers;
    g->n_kv_heads = f->kv->n_kv_heads;
    g->head_dim_k = f->kv->head_dim_k;
    g->head_dim_v = f->kv->head_dim_v;
    g->page_tokens = f->kv->page_tokens;
    g->pages_per_layer = f->kv->pages_per_layer;
    g->page_bytes = f->kv->page_bytes;
    g->page_alloc = rb_kvcache_page_alloc_bytes(f->kv);
    g->max_blob = MAX_BLOB;
    g->n_ctx = f->kv->n_ctx;
    g->n_vocab = f->n_vocab;
}

/* Saved pages are read, never mapped (may_map ignored): a session file
 * cut by another program is then a read error naming it, and the pages
 * already in RAM stay whole, where a cut under a mapping takes even
 * written private pages with it (SIGBUS on their next touch). */
static int read_saved(void *ctx, uint32_t layer, uint32_t page, void *buf, int may_map,
                      rb_error *err)
{
    (void)may_map;
    return rb_sessfile_read_page(ctx, layer, page, buf, err) == RB_OK ? 0 : -1;
}

/* A run of a layer's saved pages in one request (rb_sessfile_read_pages);
 * -1 when they are not side by side or the read failed: residency then
 * reads them one by one. */
static int read_saved_run(void *ctx, uint32_t layer, uint32_t page0, uint32_t n,
                          void *const *bufs, rb_error *err)
{
    return rb_sessfile_read_pages(ctx, layer, page0, n, bufs, err) == RB_OK ? 0 : -1;
}

/* The pages of a commit, pinned at the residency manager one at a time;
 * put records the ones written, marked saved once the commit succeeded. */
static const void *pin_get(void *ctx, uint32_t layer, uint32_t page)
{
    rb_session_file *f = ctx;
    if (!f->mem->res)
        return f->kv->pages[(size_t)layer * f->kv->pages_per_layer + page];
    return rb_residency_pin(f->mem->res, layer, page, f->epoch);
}

static void pin_put(void *ctx, uint32_t layer, uint32_t page)
{
    rb_session_file *f = ctx;
    if (f->mem->res)
        rb_residency_unpin(f->mem->res, layer, page);
    f->pinned[f->n_pinned++] = layer * f->kv->pages_per_layer + page;
}

/* Runs one commit: on the storage worker, or on the caller once the worker
 * is idle. Only this thread touches f->file and the pinned fields. */
static rb_status run_commit(rb_session_file *f, const rb_commit_job *job, int with_tail,
                            rb_error *err, rb_error *compact_err)
{
    double t0 = rb_throttle_now_s();
    uint32_t written = 0;
    rb_residency *res = f->mem->res;
    f->n_pinned = 0;
    f->epoch = job->epoch;
    rb_sessfile_source src = {pin_get, pin_put, f};
    rb_status st = rb_sessfile_commit_shared(f->file, f->tokens, job->n_tokens, job->n_shared,
                                             &src, with_tail, job->blob, job->blob_n,
                                             job->fsync, &written, err);
    f->commit_s = f->commit_s + (rb_throttle_now_s() - t0); /* one committer at a time */
    f->status = st;
    if (st != RB_OK)
        return st;
    f->commits++;
    f->pages_written += written;
    f->prefix_pages = rb_sessfile_base_pages(f->file);
    f->tokens_committed = job->n_tokens;
    /* a page whose copy is in the file: a trim drops it without a write.
       The last, partly filled one holds the job's last tokens; it stays
       marked until the session writes to it again (job->writes) */
    const uint32_t P = f->kv->page_tokens;
    for (uint32_t i = 0; res && i < f->n_pinned; i++) {
        uint32_t l = f->pinned[i] / f->kv->pages_per_layer;
        uint32_t p = f->pinned[i] % f->kv->pages_per_layer;
        uint32_t t = rb_sessfile_page_tokens(f->file, l, p);
        if (t == P)
            rb_residency_mark_saved(res, l, p, 1, job->epoch, RB_RESIDENCY_FULL);
        else if (t && (uint64_t)p * P + t == job->n_tokens)
            rb_residency_mark_saved(res, l, p, 1, job->epoch, job->writes);
    }
    /* the garbage of rewritten and rewound pages goes once it outgrows the
       live pages, at any commit (restores may read meanwhile: the file
       takes its lock); a failure leaves it for the next commit */
    rb_sessfile_compact(f->file, job->fsync, compact_err);
    return RB_OK;
}

/* A snapshot into another file pins too (the worker may be writing). */
typedef struct snap_pins {
    rb_residency *res;
    uint64_t epoch;
} snap_pins;

static const void *snap_get(void *ctx, uint32_t layer, uint32_t page)
{
    const snap_pins *sp = ctx;
    return rb_residency_pin(sp->res, layer, page, sp->epoch);
}

static void snap_put(void *ctx, uint32_t layer, uint32_t page)
{
    const snap_pins *sp = ctx;
    rb_residency_unpin(sp->res, layer, page);
}

static rb_status worker_commit(void *ctx, const rb_commit_job *job, rb_error *err)
{
    rb_error cerr = {0}; /* the state is committed: the garbage waits */
    return run_commit(ctx, job, 0, err, &cerr);
}

static void note_failure(rb_session_file *f, const rb_error *err)
{
    snprintf(f->note, sizeof f->note, "%s", err->message);
    rb_error_set(f->err, err->status ? err->status : RB_E_IO, "%s", err->message);
}

/* Reports a failure of a background commit (in the stats at once; in the
 * session's message from here). Caller's thread. */
static void take_worker_error(rb_session_file *f)
{
    rb_error err = {0};
    if (f->writer && rb_session_writer_take_error(f->writer, &err))
        note_failure(f, &err);
}

/* Waits until the worker is idle (a pending commit dropped: the caller
 * commits a newer state, or the state changes). */
static void wait_worker(rb_session_file *f, int drop_pending)
{
    if (f->writer) {
        rb_session_writer_wait(f->writer, drop_pending);
        take_worker_error(f);
    }
}

/* The tokens whose pages every layer shares with another session (a
 * fork's prefix, while in RAM), from the first: what a commit may leave to
 * a prefix file. Read on the session's thread, which alone changes the
 * cache's slots and refs. */
static size_t shared_prefix(const rb_session_file *f, size_t n_tokens)
{
    const rb_kvcache *kv = f->kv;
    if (!kv->refs)
        return 0;
    uint32_t np = 0;
    for (; np < kv->pages_per_layer && (size_t)(np + 1) * kv->page_tokens <= n_tokens; np++)
        for (uint32_t l = 0; l < kv->n_layers; l++)
            if (!rb_kvcache_slot_has_others(kv, (size_t)l * kv->pages_per_layer + np))
                return (size_t)np * kv->page_tokens;
    return (size_t)np * kv->page_tokens;
}

static rb_commit_job current_job(rb_session_file *f, size_t n_tokens)
{
    rb_residency *res = f->mem->res;
    rb_commit_job j = {n_tokens, res ? rb_residency_epoch(res) : 0,
                       res ? rb_residency_writes(res) : 0, f->fsync, f->blob, f->blob_n,
                       shared_prefix(f, n_tokens)};
    return j;
}

/* A synchronous commit on the caller's thread. */
static rb_status commit_now(rb_session_file *f, int with_tail, size_t n_tokens)
{
    wait_worker(f, 1);
    rb_error err = {0};
    rb_commit_job job = current_job(f, n_tokens);
    rb_error cerr = {0};
    rb_status st = run_commit(f, &job, with_tail, &err, &cerr);
    if (st == RB_OK && cerr.status != RB_OK)
        snprintf(f->note, sizeof f->note, "saved; the garbage stays: %.400s",
                 cerr.message); /* the state is committed: the save succeeded */
    if (st != RB_OK) {
        note_failure(f, &err);
        return st;
    }
    return RB_OK;
}

void rb_session_file_init(rb_session_file *f, rb_model *model, rb_kvcache *kv,
                          rb_session_mem *mem, const int32_t *tokens, uint32_t n_vocab,
                          rb_error *err)
{
    f->model = model;
    f->kv = kv;
    f->mem = mem;
    f->tokens = tokens;
    f->n_vocab = n_vocab;
    f->err = err;
}

rb_status rb_session_file_bind(rb_session_file *f, rb_sessfile *sf, const char *path,
                               rb_error *err)
{
    char *p = strdup(path);
    /* a page twice at most: checked against a prefix file, then written */
    uint32_t *pinned = malloc((2 * (size_t)f->kv->n_layers * f->kv->pages_per_layer + 1) *
                              sizeof *pinned);
    if (!p || !pinned) {
        free(p);
        free(pinned);
        return rb_error_set(err, RB_E_NOMEM, "session: out of memory");
    }
    wait_worker(f, 1); /* a newer state is committed next, into sf */
    rb_session_file_close(f);
    f->file = sf;
    f->path = p;
    f->pinned = pinned;
    f->tokens_committed = rb_sessfile_n_tokens(sf);
    f->prefix_pages = rb_sessfile_base_pages(sf);
    rb_residency_set_saved_source(f->mem->res, read_saved, NULL, sf);
    rb_residency_set_saved_run_reader(f->mem->res, read_saved_run);
    rb_error werr = {0};
    if (rb_session_writer_create(worker_commit, f, &f->writer, &werr) != RB_OK)
        f->writer = NULL; /* commits run synchronously */
    return RB_OK;
}

void rb_session_file_close(rb_session_file *f)
{
    rb_session_writer_destroy(f->writer); /* the pending commit runs first */
    f->writer = NULL;
    take_worker_error(f);
    free(f->pinned);
    f->pinned = NULL;
    if (f->mem->res)
        rb_residency_set_saved_source(f->mem->res, NULL, NULL, NULL);
    rb_sessfile_close(f->file);
    f->file = NULL;
    free(f->path);
    f->path = NULL;
}

rb_status rb_session_file_save(rb_session_file *f, const char *path, unsigned flags,
                               size_t n_tokens)
{
    const int fsync = (flags & RB_SAVE_FSYNC) != 0;
    rb_residency *res = f->mem->res;
    if ((flags & RB_SAVE_SNAPSHOT) || !f->file || strcmp(path, f->path) != 0) {
        uint64_t fp;
        rb_status st = model_fingerprint(f->model, &fp, f->err);
        if (st != RB_OK)
            return st;
        rb_sessfile_geom g;
        geometry(f, &g);
        g.is_lock_wait = (flags & RB_SAVE_WAIT) != 0;
        rb_sessfile *sf = NULL;
        rb_error err;
        if ((st = rb_sessfile_create(path, fp, &g, f->os, f->mem->throttle, &sf, &err)) !=
            RB_OK)
            return rb_error_set(f->err, st, "%s", err.message);
        if (flags & RB_SAVE_SNAPSHOT) {
            /* resident pages only: a copy of an evicted page would need it
               back first; its positions are recomputed by the opener */
            snap_pins sp = {res, res ? rb_residency_epoch(res) : 0};
            rb_sessfile_slot_table tab = {(void *const *)f->kv->pages, f->kv->pages_per_layer};
            rb_sessfile_source src = rb_sessfile_slots(&tab);
            if (res) /* the storage worker may be reading pages too: pins */
                src = (rb_sessfile_source){snap_get, snap_put, &sp};
            st = rb_sessfile_commit(sf, f->tokens, n_tokens, &src, 1, f->blob, f->blob_n,
                                    fsync, NULL, &err);
            rb_sessfile_close(sf);
            return st == RB_OK ? RB_OK : rb_error_set(f->err, st, "%s", err.message);
        }
        if ((st = rb_session_file_bind(f, sf, path, f->err)) != RB_OK) {
            rb_sessfile_close(sf);
            return st;
        }
    }
    f->fsync = fsync;
    f->on_request = (flags & RB_SAVE_ON_REQUEST) != 0;
    return commit_now(f, 1, n_tokens);
}

/* rb_session_file_open and _open_fd: path names the file, or (fd >= 0)
 * the descriptor in messages. */
static rb_status open_file(rb_session_file *f, const char *path, int fd, unsigned flags,
                           rb_sessfile **out, rb_error *err)
{
    rb_sessfile_geom g;
    geometry(f, &g);
    g.is_lock_wait = (flags & RB_SAVE_WAIT) != 0;
    rb_sessfile *sf = NULL;
    /* the model is checked once the restore reads (rb_session_file_check_model);
       the token ids (against the vocabulary) and their count (against
       n_ctx) here */
    rb_status st = fd >= 0
                       ? rb_sessfile_open_fd(fd, path, NULL, &g, NULL, f->mem->throttle, &sf, err)
                       : rb_sessfile_open(path, NULL, &g, NULL, f->mem->throttle, &sf, err);
    if (st != RB_OK)
        return st;
    size_t n = rb_sessfile_n_tokens(sf);
    if (n > f->kv->n_ctx) { /* rb_sessfile_open checks it: never past the tokens */
        rb_sessfile_close(sf);
        return rb_error_set(err, RB_E_UNSUPPORTED, "session file: '%s' holds %zu tokens, more "
                            "than the context of %" PRIu32, path, n, f->kv->n_ctx);
    }
    const char *why = rb_sessfile_recovery(sf, &f->lost_tokens);
    if (why)
        snprintf(f->recovery, sizeof f->recovery, "session file: '%s': %s", path, why);
    f->fsync = (flags & RB_SAVE_FSYNC) != 0;
    f->on_request = (flags & RB_SAVE_ON_REQUEST) != 0;
    size_t bn;
    const void *b = rb_sessfile_blob(sf, &bn);
    if (bn && (f->blob = malloc(bn))) {
        memcpy(f->blob, b, bn);
        f->blob_n = bn;
    }
    *out = sf;
    return RB_OK;
}

rb_status rb_session_file_open(rb_session_file *f, const char *path, unsigned flags,
                               rb_sessfile **out, rb_error *err)
{
    return open_file(f, path, -1, flags, out, err);
}

rb_status rb_session_file_open_fd(rb_session_file *f, int fd, const char *name, unsigned flags,
                                  rb_sessfile **out, rb_error *err)
{
    return open_file(f, name, fd, flags, out, err);
}

rb_status rb_session_file_check_model(rb_session_file *f, rb_error *err)
{
    uint64_t fp;
    rb_status st = model_fingerprint(f->model, &fp, err);
    return st != RB_OK ? st : rb_sessfile_check_model(f->file, fp, err);
}

void rb_session_file_after_feed(rb_session_file *f, size_t n_tokens)
{
    if (!f->file || f->on_request)
        return;
    double t0 = rb_throttle_now_s();
    take_worker_error(f); /* the previous commit's, if it failed */
    rb_commit_job job = current_job(f, n_tokens);
    if (!f->writer || rb_session_writer_submit(f->writer, &job) != RB_OK) {
        rb_error err = {0}, cerr = {0};
        wait_worker(f, 1);
        if (run_commit(f, &job, 0, &err, &cerr) != RB_OK)
            note_failure(f, &err);
    }
    double dt = rb_throttle_now_s() - t0;
    f->n_handover++;
    f->handover_s += dt;
    if (dt > f->handover_max_s)
        f->handover_max_s = dt;
}

void rb_session_file_rewound(rb_session_file *f, size_t n_tokens)
{
    if (!f->file)
        return;
    wait_worker(f, 1); /* the tokens change; the next feed commits the new state */
    rb_sessfile_truncate(f->file, n_tokens);
}

void rb_session_file_shifted(rb_session_file *f, size_t from)
{
    if (!f->file)
        return;
    wait_worker(f, 1);
    rb_sessfile_truncate(f->file, from);
}

void rb_session_file_deinit(rb_session_file *f)
{
    if (!f->mem) /* never initialised (a session that failed early) */
        return;
    rb_session_file_close(f);
    free(f->blob);
    f->blob = NULL;
    f->blob_n = 0;
}

rb_status rb_session_file_set_blob(rb_session_file *f, const void *data, size_t n)
{
    if (n > MAX_BLOB)
        return rb_error_set(f->err, RB_E_INVALID_ARG, "session: blob of %zu bytes exceeds %u",
                            n, MAX_BLOB);
    uint8_t *b = n ? malloc(n) : NULL;
    if (n && !b)
        return rb_error_set(f->err, RB_E_NOMEM, "session: out of memory");
    if (n)
        memcpy(b, data, n);
    free(f->blob);
    f->blob = b;
    f->blob_n = n;
    return RB_OK;
}

void rb_session_file_fill_stats(const rb_session_file *f, rb_session_stats *out)
{
    out->file_commits = f->commits;
    out->file_pages_written = f->pages_written;
    out->file_prefix_pages = f->prefix_pages;
    out->file_commit_s = f->commit_s;
    out->file_status = f->status;
    out->file_recovery = f->recovery[0] ? f->recovery : NULL;
    out->file_lost_tokens = f->lost_tokens;
}

/* ---- the debug interface (session_debug.h) ------------------------------------- */

void rb_session_file_debug_wait(rb_session_file *f)
{
    if (f->writer)
        rb_session_writer_wait(f->writer, 0);
}

void rb_session_file_debug_writer_stats(rb_session_file *f, rb_session_writer_stats *out)
{
    memset(out, 0, sizeof *out);
    if (f->writer)
        rb_session_writer_get_stats(f->writer, out);
}
