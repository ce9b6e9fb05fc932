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
#include "sessfile.h"
#include "session_internal.h"
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
    g->n_ctx = s->kv.n_ctx;
    g->n_vocab = s->fwd.hp.n_vocab;
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

/* The pages of a commit, pinned at the residency manager one at a time;
 * put records the ones written, marked saved once the commit succeeded. */
static const void *pin_get(void *ctx, uint32_t layer, uint32_t page)
{
    rb_session *s = ctx;
    if (!s->res)
        return s->kv.pages[(size_t)layer * s->kv.pages_per_layer + page];
    return rb_residency_pin(s->res, layer, page, s->file_epoch);
}

static void pin_put(void *ctx, uint32_t layer, uint32_t page)
{
    rb_session *s = ctx;
    if (s->res)
        rb_residency_unpin(s->res, layer, page);
    s->file_pinned[s->file_n_pinned++] = layer * s->kv.pages_per_layer + page;
}

/* Runs one commit: on the storage worker, or on the caller once the worker
 * is idle. Only this thread touches s->file and the file_pinned fields. */
static rb_status run_commit(rb_session *s, const rb_commit_job *job, int with_tail,
                            rb_error *err, rb_error *compact_err)
{
    double t0 = rb_throttle_now_s();
    uint32_t written = 0;
    s->file_n_pinned = 0;
    s->file_epoch = job->epoch;
    rb_sessfile_source src = {pin_get, pin_put, s};
    rb_status st = rb_sessfile_commit(s->file, s->tokens, job->n_tokens, &src, with_tail,
                                      job->blob, job->blob_n, job->fsync, &written, err);
    s->file_commit_s = s->file_commit_s + (rb_throttle_now_s() - t0); /* one committer at a time */
    s->file_status = st;
    if (st != RB_OK)
        return st;
    s->file_commits++;
    s->file_pages_written += written;
    s->file_tokens_committed = job->n_tokens;
    /* a full page whose copy is in the file: a trim drops it without a write */
    for (uint32_t i = 0; s->res && i < s->file_n_pinned; i++) {
        uint32_t l = s->file_pinned[i] / s->kv.pages_per_layer;
        uint32_t p = s->file_pinned[i] % s->kv.pages_per_layer;
        if (rb_sessfile_page_tokens(s->file, l, p) == s->kv.page_tokens)
            rb_residency_mark_saved(s->res, l, p, 1, job->epoch);
    }
    /* the garbage of rewritten and rewound pages goes once it outgrows the
       live pages, at any commit (restores may read meanwhile: the file
       takes its lock); a failure leaves it for the next commit */
    rb_sessfile_compact(s->file, job->fsync, compact_err);
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

static void note_failure(rb_session *s, const rb_error *err)
{
    snprintf(s->file_note, sizeof s->file_note, "%s", err->message);
    rb_error_set(&s->err, err->status ? err->status : RB_E_IO, "%s", err->message);
}

/* Reports a failure of a background commit (in the stats at once; in the
 * session's message from here). Caller's thread. */
static void take_worker_error(rb_session *s)
{
    rb_error err = {0};
    if (s->file_writer && rb_session_writer_take_error(s->file_writer, &err))
        note_failure(s, &err);
}

/* Waits until the worker is idle (a pending commit dropped: the caller
 * commits a newer state, or the state changes). */
static void wait_worker(rb_session *s, int drop_pending)
{
    if (s->file_writer) {
        rb_session_writer_wait(s->file_writer, drop_pending);
        take_worker_error(s);
    }
}

static rb_commit_job current_job(rb_session *s)
{
    rb_commit_job j = {s->n_tokens, s->res ? rb_residency_epoch(s->res) : 0, s->file_fsync,
                       s->blob, s->blob_n};
    return j;
}

/* A synchronous commit on the caller's thread. */
static rb_status commit_now(rb_session *s, int with_tail)
{
    wait_worker(s, 1);
    rb_error err = {0};
    rb_commit_job job = current_job(s);
    rb_error cerr = {0};
    rb_status st = run_commit(s, &job, with_tail, &err, &cerr);
    if (st == RB_OK && cerr.status != RB_OK)
        snprintf(s->file_note, sizeof s->file_note, "saved; the garbage stays: %.400s",
                 cerr.message); /* the state is committed: the save succeeded */
    if (st != RB_OK) {
        note_failure(s, &err);
        return st;
    }
    return RB_OK;
}

static void close_file(rb_session *s);

/* Binds f in place of the current file (its storage worker starts; without
 * a thread, commits run in the caller as before). On failure nothing
 * changes and f stays the caller's. */
static rb_status bind_file(rb_session *s, rb_sessfile *f, const char *path, rb_error *err)
{
    char *p = strdup(path);
    uint32_t *pinned = malloc(((size_t)s->kv.n_layers * s->kv.pages_per_layer + 1) *
                              sizeof *pinned);
    if (!p || !pinned) {
        free(p);
        free(pinned);
        return rb_error_set(err, RB_E_NOMEM, "session: out of memory");
    }
    wait_worker(s, 1); /* a newer state is committed next, into f */
    close_file(s);
    s->file = f;
    s->file_path = p;
    s->file_pinned = pinned;
    s->file_tokens_committed = rb_sessfile_n_tokens(f);
    rb_residency_set_saved_source(s->res, read_saved, NULL, f);
    rb_error werr = {0};
    if (rb_session_writer_create(worker_commit, s, &s->file_writer, &werr) != RB_OK)
        s->file_writer = NULL; /* commits run synchronously */
    return RB_OK;
}

static void close_file(rb_session *s)
{
    rb_session_settle_restore(s, 0); /* its workers read the file */
    rb_session_writer_destroy(s->file_writer); /* the pending commit runs first */
    s->file_writer = NULL;
    take_worker_error(s);
    free(s->file_pinned);
    s->file_pinned = NULL;
    if (s->res)
        rb_residency_set_saved_source(s->res, NULL, NULL, NULL);
    rb_sessfile_close(s->file);
    s->file = NULL;
    free(s->file_path);
    s->file_path = NULL;
}

static rb_status save_locked(rb_session *s, const char *path, unsigned flags);

rb_status rb_session_save(rb_session *s, const char *path, unsigned flags)
{
    if (!s || !path)
        return RB_E_INVALID_ARG;
    rb_session_enter(s);
    rb_status st = save_locked(s, path, flags);
    rb_session_leave(s);
    return st;
}

static rb_status save_locked(rb_session *s, const char *path, unsigned flags)
{
    rb_session_settle_restore(s, 1); /* a save holds the whole context */
    const int fsync = (flags & RB_SAVE_FSYNC) != 0;
    if ((flags & RB_SAVE_SNAPSHOT) || !s->file || strcmp(path, s->file_path) != 0) {
        uint64_t fp;
        rb_status st = model_fingerprint(s->model, &fp, &s->err);
        if (st != RB_OK)
            return st;
        rb_sessfile_geom g;
        geometry(s, &g);
        g.is_lock_wait = (flags & RB_SAVE_WAIT) != 0;
        rb_sessfile *f = NULL;
        rb_error err;
        if ((st = rb_sessfile_create(path, fp, &g, s->file_os, s->throttle, &f, &err)) != RB_OK)
            return rb_error_set(&s->err, st, "%s", err.message);
        if (flags & RB_SAVE_SNAPSHOT) {
            /* resident pages only: a copy of an evicted page would need it
               back first; its positions are recomputed by the opener */
            snap_pins sp = {s->res, s->res ? rb_residency_epoch(s->res) : 0};
            rb_sessfile_slot_table tab = {(void *const *)s->kv.pages, s->kv.pages_per_layer};
            rb_sessfile_source src = rb_sessfile_slots(&tab);
            if (s->res) /* the storage worker may be reading pages too: pins */
                src = (rb_sessfile_source){snap_get, snap_put, &sp};
            st = rb_sessfile_commit(f, s->tokens, s->n_tokens, &src, 1, s->blob, s->blob_n,
                                    fsync, NULL, &err);
            rb_sessfile_close(f);
            return st == RB_OK ? RB_OK : rb_error_set(&s->err, st, "%s", err.message);
        }
        if ((st = bind_file(s, f, path, &s->err)) != RB_OK) {
            rb_sessfile_close(f);
            return st;
        }
    }
    s->file_fsync = fsync;
    s->file_on_request = (flags & RB_SAVE_ON_REQUEST) != 0;
    return commit_now(s, 1);
}

/* Begins the layers' restore at open, before the first feed asks for it:
 * weights and KV then stream from the start while the model's fingerprint
 * is checked, the rest of the weights read and the caller builds its
 * tokenizer. Only for the plain cold start (pipelined, no budgets): a
 * budget may trim before the feed, eager would block the open. */
static int wants_open_restore(const rb_session *s)
{
    return s->res && s->params.restore == RB_RESTORE_PIPELINED && !s->params.budget_bytes &&
           !s->params.weights_budget_bytes;
}

static rb_status open_saved(rb_model *model, const rb_session_params *params,
                            const char *path, int fd, rb_session **out, rb_error *err);
static rb_status unbind_locked(rb_session *s);

rb_status rb_session_open_saved(rb_model *model, const rb_session_params *params,
                                const char *path, rb_session **out, rb_error *err)
{
    if (!model || !path || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model, path and out are required");
    if (access(path, F_OK) != 0)
        return rb_error_set(err, RB_E_NOT_FOUND, "session file: '%s' does not exist", path);
    return open_saved(model, params, path, -1, out, err);
}

rb_status rb_session_open_saved_fd(rb_model *model, const rb_session_params *params, int fd,
                                   rb_session **out, rb_error *err)
{
    if (!model || fd < 0 || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "session: model, a file descriptor (%d) and "
                            "out are required", fd);
    char name[48];
    snprintf(name, sizeof name, "file descriptor %d", fd);
    return open_saved(model, params, name, fd, out, err);
}

/* path: the file, or (fd >= 0) what names the descriptor in messages; a
 * descriptor's state is read into the session and the file let go. */
static rb_status open_saved(rb_model *model, const rb_session_params *params,
                            const char *path, int fd, rb_session **out, rb_error *err)
{
    rb_session *s = NULL;
    rb_status st = rb_session_create_impl(model, params, 1, &s, err);
    if (st != RB_OK)
        return st;
    rb_sessfile_geom g;
    geometry(s, &g);
    g.is_lock_wait = (s->params.file_flags & RB_SAVE_WAIT) != 0;
    rb_sessfile *f = NULL;
    /* the model is checked below, once the restore reads; the token ids
       (against the vocabulary) and their count (against n_ctx) here */
    if ((st = fd >= 0 ? rb_sessfile_open_fd(fd, path, NULL, &g, NULL, s->throttle, &f, err)
                      : rb_sessfile_open(path, NULL, &g, NULL, s->throttle, &f, err)) != RB_OK) {
        rb_session_destroy(s);
        return st;
    }
    size_t n = rb_sessfile_n_tokens(f);
    if (n > s->kv.n_ctx) { /* rb_sessfile_open checks it: never past s->tokens */
        rb_sessfile_close(f);
        rb_session_destroy(s);
        return rb_error_set(err, RB_E_UNSUPPORTED, "session file: '%s' holds %zu tokens, more "
                            "than the context of %" PRIu32, path, n, s->kv.n_ctx);
    }
    memcpy(s->tokens, rb_sessfile_tokens(f), n * sizeof *s->tokens);
    const char *why = rb_sessfile_recovery(f, &s->file_lost_tokens);
    if (why)
        snprintf(s->file_recovery, sizeof s->file_recovery, "session file: '%s': %s", path,
                 why);
    s->file_fsync = (s->params.file_flags & RB_SAVE_FSYNC) != 0;
    s->file_on_request = (s->params.file_flags & RB_SAVE_ON_REQUEST) != 0;
    s->n_tokens = n;
    size_t bn;
    const void *b = rb_sessfile_blob(f, &bn);
    if (bn && (s->blob = malloc(bn))) {
        memcpy(s->blob, b, bn);
        s->blob_n = bn;
    }
    /* The positions the file covers: page by page, every layer must hold
       all of the page's positions below n, except that a sliding-window
       layer needs no page before the window of position n. */
    const uint32_t P = s->kv.page_tokens;
    size_t covered = 0;
    uint32_t pages = 0;
    while (covered < n) {
        uint32_t need = n - covered >= P ? P : (uint32_t)(n - covered);
        int all = 1;
        for (uint32_t l = 0; l < s->kv.n_layers && all; l++)
            all = rb_sessfile_page_tokens(f, l, pages) >= need ||
                  (s->fwd.layers[l].window && pages < rb_session_window_first_page(s, n));
        if (!all)
            break;
        covered += need;
        pages++;
    }
    /* a recompute from `covered` reads the windows before it: when the
       file lacks one of their pages, everything is recomputed */
    uint32_t first_win = rb_session_window_first_page(s, covered);
    for (uint32_t l = 0; covered < n && l < s->kv.n_layers; l++)
        for (uint32_t p = first_win; s->fwd.layers[l].window && p < covered / P; p++)
            if (rb_sessfile_page_tokens(f, l, p) < P)
                covered = pages = first_win = 0;
    for (uint32_t l = 0; l < s->kv.n_layers; l++)
        for (uint32_t p = s->fwd.layers[l].window ? first_win : 0; p < pages; p++)
            rb_residency_adopt_saved(s->res, l, p, rb_sessfile_page_tokens(f, l, p) == P);
    s->kv.n_pages_reserved = pages;
    rb_residency_set_pages(s->res, pages);
    s->n_kv_valid = covered;
    s->window_dead_pages = s->window_released_pages = first_win; /* never adopted */
    if ((st = bind_file(s, f, path, err)) != RB_OK) {
        rb_sessfile_close(f);
        rb_session_destroy(s);
        return st;
    }
    if (wants_open_restore(s) &&
        rb_residency_begin_restore(s->res, &s->restore_open_from, err) == RB_OK)
        s->restore_open = 1;
    uint64_t fp;
    if ((st = model_fingerprint(model, &fp, err)) != RB_OK ||
        (st = rb_sessfile_check_model(f, fp, err)) != RB_OK ||
        (st = rb_session_memory_read_rest(s, err)) != RB_OK) {
        rb_session_destroy(s); /* drops the restore first */
        return st;
    }
    /* a descriptor: everything it holds read back now, then let go */
    if (fd >= 0 && (st = unbind_locked(s)) != RB_OK) {
        rb_error_set(err, st, "%s", s->err.message);
        rb_session_destroy(s);
        return st;
    }
    rb_session_leave(s); /* held since it was created: the pool may trim it now */
    *out = s;
    return RB_OK;
}

static rb_status unbind_locked(rb_session *s);

rb_status rb_session_unbind(rb_session *s)
{
    if (!s)
        return RB_E_INVALID_ARG;
    rb_session_enter(s);
    rb_status st = unbind_locked(s);
    rb_session_leave(s);
    return st;
}

static rb_status unbind_locked(rb_session *s)
{
    if (!s->file)
        return RB_OK;
    if (s->res) {
        /* a restore without a forward pass: what is only in the file comes
           back (the workers read it; end_restore waits for them), and what
           is damaged or missing becomes positions to recompute, as a feed
           would treat them */
        uint32_t from = UINT32_MAX, damaged = UINT32_MAX;
        rb_status st = RB_OK;
        if (s->restore_open) { /* begun at open */
            from = s->restore_open_from;
            s->restore_open = 0;
        } else if ((st = rb_residency_begin_restore(s->res, &from, &s->err)) != RB_OK) {
            return st;
        }
        if ((st = rb_residency_end_restore(s->res, &damaged, &s->err)) != RB_OK)
            return st;
        if (damaged < from)
            from = damaged;
        if (from < s->n_kv_valid) {
            uint32_t page = from / s->kv.page_tokens;
            rb_residency_forget_from(s->res, page);
            rb_kvcache_truncate(&s->kv, page);
            s->n_kv_valid = (size_t)page * s->kv.page_tokens;
        }
    }
    close_file(s);
    return RB_OK;
}

/* A failure is in the stats and the errmsg, never the feed's. */
void rb_session_file_after_feed(rb_session *s)
{
    if (!s->file || s->file_on_request)
        return;
    double t0 = rb_throttle_now_s();
    take_worker_error(s); /* the previous commit's, if it failed */
    rb_commit_job job = current_job(s);
    if (!s->file_writer || rb_session_writer_submit(s->file_writer, &job) != RB_OK) {
        rb_error err = {0}, cerr = {0};
        wait_worker(s, 1);
        if (run_commit(s, &job, 0, &err, &cerr) != RB_OK)
            note_failure(s, &err);
    }
    double dt = rb_throttle_now_s() - t0;
    s->file_n_handover++;
    s->file_handover_s += dt;
    if (dt > s->file_handover_max_s)
        s->file_handover_max_s = dt;
}

void rb_session_file_rewound(rb_session *s)
{
    if (!s->file)
        return;
    wait_worker(s, 1); /* the tokens change; the next feed commits the new state */
    rb_sessfile_truncate(s->file, s->n_tokens);
}

void rb_session_file_shifted(rb_session *s, size_t from)
{
    if (!s->file)
        return;
    wait_worker(s, 1);
    rb_sessfile_truncate(s->file, from);
}

void rb_session_file_writer_stats(rb_session *s, rb_session_writer_stats *out)
{
    memset(out, 0, sizeof *out);
    if (s->file_writer)
        rb_session_writer_get_stats(s->file_writer, out);
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
