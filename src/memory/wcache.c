/*
 * wcache.c - release and reload of a layer's weight bytes (wcache.h).
 *
 * Layout: the model's weight buffer holds the file's data section at the
 * same relative offsets (model.c), so file offset X lives at address
 * base + X (base = data - data_offset). A layer's tensors (blk.L.*) are
 * one contiguous file range in every GGUF writer we know of; the range is
 * [min offset, max end) over them, so a layer whose tensors are scattered
 * still releases correctly (it may also cover bytes of other tensors in
 * between, which are then re-read with it: never wrong, only slower).
 *
 *      file:  | header | ... blk.L.* ....................... | blk.L+1 ...
 *      RAM:   base + X  ------------------------------------
 *                        ^ page_lo (rounded up)   page_hi ^ (rounded down)
 *                        [-------- released / reloaded -------]
 *
 * Memory: two arrays of n_layers ranges and flags. The reload fd is the
 * model file opened a second time, with O_DIRECT when the filesystem
 * takes it and the buffer lines up with the file's blocks (model.c places
 * it so); otherwise buffered reads after fadvise(DONTNEED), which the
 * mode string says. A cold restore's buffer is the file's private mapping
 * (rb_model_weights_file_mapped): a read is then a populate of the range
 * (the page cache reads storage, and its pages are what compute reads),
 * a release MADV_DONTNEED plus fadvise(DONTNEED) (the page cache's copy
 * goes too, so the reload reads storage again).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "os.h"
#include "status.h"
#include "wcache.h"

#define WC_PAGE 4096u
#define WC_CHUNK (1u << 20) /* one read request: the phone profile's size; 4 MiB reads are no faster here (the disk gives ~1 GB/s either way) */

struct rb_wcache {
    const rb_os *os;
    const rb_model *model;   /* its gguf (the ranges of the rest) */
    int fd;
    int is_direct;
    int is_mapped;           /* the buffer is the file's private mapping */
    uintptr_t base;          /* address of file offset 0 */
    uint32_t n_layers;
    uint64_t *lo, *hi;       /* [n_layers] page-aligned file range released */
    uint64_t *tlo, *thi;     /* [n_layers] the layer's whole file range */
    _Atomic uint8_t *resident; /* written under mu; read without it by stats */
    /* under mu: a layer being read (others wait for it, cv), and the
       forward passes computing it now (a release skips it) */
    uint8_t *loading;
    uint32_t *in_use;
    /* under mu: the weight buffer's read state after the model's load,
       kept here only (model.h: the model records what its load read and
       nothing after): resident[] above for each layer, and */
    int is_marked_unread;    /* a cold start marked the layers (once per cache) */
    enum { WC_REST_READ, WC_REST_UNREAD, WC_REST_LOADING } rest; /* the bytes
                                outside the layers; UNREAD from a lazy load */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t total_bytes;    /* all weight bytes (the data section) */
    char *path;
};

rb_status rb_wcache_create(const rb_model *model, const char *path, const rb_os *os,
                           rb_wcache **out, rb_error *err)
{
    const rb_gguf *g = rb_model_gguf(model);
    const rb_hparams *hp = rb_model_hparams(model);
    if (!path || rb_gguf_n_tensors(g) == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "wcache: a model file with tensors is needed");
    const rb_gguf_tensor *t0 = rb_gguf_tensor_at(g, 0);
    if (rb_gguf_tensor_data(g, t0))
        return rb_error_set(err, RB_E_UNSUPPORTED, "wcache: %s is memory-mapped: its weight "
                            "pages belong to the page cache, rebound cannot release them "
                            "(open the model without mmap)", path);
    const uint8_t *d0 = rb_model_tensor_data(model, t0);
    if (!d0)
        return rb_error_set(err, RB_E_INVALID_ARG, "wcache: the model's weights are not loaded");
    rb_wcache *w = calloc(1, sizeof *w);
    if (!w)
        return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    w->os = os ? os : rb_os_default();
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->model = model;
    w->rest = rb_model_weights_load(model) == RB_WEIGHTS_LAZY ? WC_REST_UNREAD : WC_REST_READ;
    w->fd = -1;
    w->n_layers = hp->n_layers;
    w->base = (uintptr_t)d0 - (uintptr_t)t0->file_offset;
    w->total_bytes = rb_gguf_file_size(g) - rb_gguf_data_offset(g);
    w->lo = calloc(w->n_layers ? w->n_layers : 1, sizeof *w->lo);
    w->hi = calloc(w->n_layers ? w->n_layers : 1, sizeof *w->hi);
    w->resident = calloc(w->n_layers ? w->n_layers : 1, 1);
    w->tlo = calloc(w->n_layers ? w->n_layers : 1, sizeof *w->tlo);
    w->thi = calloc(w->n_layers ? w->n_layers : 1, sizeof *w->thi);
    w->loading = calloc(w->n_layers ? w->n_layers : 1, 1);
    w->in_use = calloc(w->n_layers ? w->n_layers : 1, sizeof *w->in_use);
    w->path = strdup(path);
    if (!w->lo || !w->hi || !w->resident || !w->path || !w->tlo || !w->thi || !w->loading ||
        !w->in_use) {
        rb_wcache_destroy(w);
        return rb_error_set(err, RB_E_NOMEM, "wcache: out of memory");
    }
    for (uint32_t l = 0; l < w->n_layers; l++) {
        w->lo[l] = UINT64_MAX;
        w->resident[l] = 1;
    }
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        int64_t tl = rb_tensor_layer(t->name);
        if (tl < 0 || tl >= w->n_layers)
            continue;
        uint32_t l = (uint32_t)tl;
        if (t->file_offset < w->lo[l])
            w->lo[l] = t->file_offset;
        if (t->file_offset + t->n_bytes > w->hi[l])
            w->hi[l] = t->file_offset + t->n_bytes;
    }
    for (uint32_t l = 0; l < w->n_layers; l++) {
        if (w->lo[l] == UINT64_MAX) { /* a layer without tensors: nothing to release */
            w->lo[l] = w->hi[l] = 0;
            continue;
        }
        w->tlo[l] = w->lo[l];
        w->thi[l] = w->hi[l];
        /* whole pages of RAM inside the range */
        uintptr_t a = (w->base + w->lo[l] + WC_PAGE - 1) / WC_PAGE * WC_PAGE;
        uintptr_t b = (w->base + w->hi[l]) / WC_PAGE * WC_PAGE;
        w->lo[l] = a - w->base;
        w->hi[l] = b > a ? b - w->base : w->lo[l];
    }
    /* A file whose writer put another tensor (the embeddings, another
       layer's) inside a layer's range: releasing it would take bytes that
       are read outside that layer. Such a layer is never released. */
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        int64_t tl = rb_tensor_layer(t->name);
        for (uint32_t l = 0; l < w->n_layers; l++)
            if (tl != (int64_t)l && t->file_offset < w->hi[l] &&
                t->file_offset + t->n_bytes > w->lo[l])
                w->hi[l] = w->lo[l];
    }
    /* O_DIRECT needs file offsets on block boundaries where RAM has pages */
    w->is_mapped = rb_model_weights_file_mapped(model);
    if (w->base % WC_PAGE == 0 && !w->is_mapped)
        w->fd = w->os->open(path, O_RDONLY | O_DIRECT | O_CLOEXEC, 0);
    w->is_direct = w->fd >= 0;
    if (w->fd < 0)
        w->fd = w->os->open(path, O_RDONLY | O_CLOEXEC, 0);
    if (w->fd < 0) {
        int e = errno;
        rb_wcache_destroy(w);
        return rb_error_set(err, RB_E_IO, "wcache: cannot reopen %s: %s", path, strerror(e));
    }
    *out = w;
    return RB_OK;
}

void rb_wcache_destroy(rb_wcache *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        w->os->close(w->fd);
    free(w->lo);
    free(w->hi);
    free(w->tlo);
    free(w->thi);
    free((void *)w->resident);
    free(w->loading);
    free(w->in_use);
    free(w->path);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

uint32_t rb_wcache_n_layers(const rb_wcache *w) { return w->n_layers; }

uint64_t rb_wcache_layer_bytes(const rb_wcache *w, uint32_t layer)
{
    return layer < w->n_layers ? w->hi[layer] - w->lo[layer] : 0;
}

int rb_wcache_is_resident(const rb_wcache *w, uint32_t layer)
{
    return layer < w->n_layers && w->resident[layer];
}

uint64_t rb_wcache_total_bytes(const rb_wcache *w) { return w->total_bytes; }

uint64_t rb_wcache_resident_bytes(const rb_wcache *w)
{
    uint64_t b = w->total_bytes;
    for (uint32_t l = 0; l < w->n_layers; l++)
        if (!w->resident[l])
            b -= w->hi[l] - w->lo[l];
    return b;
}

/* Brings n bytes of the file at off into place through w->fd: a populate
 * of the mapping, or a read. */
static rb_status read_chunk(rb_wcache *w, uint64_t off, size_t n, int *err_no)
{
    if (w->is_mapped)
        return rb_os_populate_read((const void *)(w->base + off), n, err_no);
    return rb_os_read_full(w->os, w->fd, (void *)(w->base + off), n, off, NULL, err_no);
}

/* Reads [a, b) of the file into place, buffered (any alignment). */
static rb_status read_span(rb_wcache *w, uint64_t a, uint64_t b, rb_error *err)
{
    if (b <= a)
        return RB_OK;
    if (w->is_mapped) {
        int e = 0;
        rb_status st = read_chunk(w, a, (size_t)(b - a), &e);
        if (st != RB_OK)
            return rb_error_set(err, st, "wcache: reading %s at %" PRIu64 ": %s", w->path, a,
                                st == RB_E_SHORT_READ ? "file ended" : strerror(e));
        return RB_OK;
    }
    int fd = w->os->open(w->path, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return rb_error_set(err, RB_E_IO, "wcache: cannot reopen %s: %s", w->path,
                            strerror(errno));
    int e = 0;
    rb_status st = rb_os_read_full(w->os, fd, (void *)(w->base + a), (size_t)(b - a), a, NULL, &e);
    w->os->close(fd);
    if (st != RB_OK)
        return rb_error_set(err, st, "wcache: reading %s at %" PRIu64 ": %s", w->path, a,
                            st == RB_E_SHORT_READ ? "file ended" : strerror(e));
    return RB_OK;
}

/* Requests in flight while the bytes outside the layers are read at
 * session open: as many as the restore that follows keeps (residency.c's
 * I/O workers and its decode worker), so the device's per-I/O latency
 * overlaps there too; the throttle shares the bandwidth among them. */
#define WC_REST_STREAMS 3

typedef struct span_read {
    rb_wcache *w;
    rb_throttle *throttle;
    uint64_t pa, pb;            /* whole pages, O_DIRECT */
    _Atomic uint64_t next;      /* next chunk's offset to claim */
    pthread_mutex_t mu;         /* guards the first failure below */
    rb_status st;
    int e;
    uint64_t fail_off;
} span_read;

static void *span_reader(void *arg)
{
    span_read *j = arg;
    rb_wcache *w = j->w;
    for (;;) {
        /* relaxed: the offset only partitions the work; the joins order the
           bytes before anyone reads them */
        uint64_t off = atomic_fetch_add_explicit(&j->next, WC_CHUNK, memory_order_relaxed);
        if (off >= j->pb)
            return NULL;
        size_t n = j->pb - off < WC_CHUNK ? (size_t)(j->pb - off) : WC_CHUNK;
        int64_t t0 = rb_throttle_now_ns();
        int e = 0;
        rb_status st = read_chunk(w, off, n, &e);
        if (st != RB_OK) {
            pthread_mutex_lock(&j->mu);
            if (j->st == RB_OK) {
                j->st = st;
                j->e = e;
                j->fail_off = off;
            }
            pthread_mutex_unlock(&j->mu);
            atomic_store_explicit(&j->next, j->pb, memory_order_relaxed); /* stop all */
            return NULL;
        }
        if (j->throttle)
            rb_throttle_io_since(j->throttle, n, t0);
    }
}

/* Reads [a, b) of the file into place from storage: the whole pages with
 * O_DIRECT in WC_CHUNK requests, WC_REST_STREAMS in flight, through the
 * throttle (as a layer's reload), the partial pages at either end
 * buffered. */
static rb_status read_span_direct(rb_wcache *w, uint64_t a, uint64_t b, rb_throttle *th,
                                  rb_error *err)
{
    int paged = w->is_direct || w->is_mapped;
    uint64_t pa = paged ? (a + WC_PAGE - 1) / WC_PAGE * WC_PAGE : b;
    uint64_t pb = paged ? b / WC_PAGE * WC_PAGE : b;
    if (pb <= pa)
        return read_span(w, a, b, err);
    rb_status st = read_span(w, a, pa, err);
    if (st != RB_OK)
        return st;
    span_read j = {.w = w, .throttle = th, .pa = pa, .pb = pb, .st = RB_OK};
    atomic_init(&j.next, pa);
    pthread_mutex_init(&j.mu, NULL);
    pthread_t tid[WC_REST_STREAMS - 1];
    int n_th = 0;
    uint64_t n_chunks = (pb - pa + WC_CHUNK - 1) / WC_CHUNK;
    while (n_th < WC_REST_STREAMS - 1 && (uint64_t)n_th + 1 < n_chunks &&
           pthread_create(&tid[n_th], NULL, span_reader, &j) == 0)
        n_th++; /* fewer threads if one cannot start: only slower */
    span_reader(&j);
    for (int i = 0; i < n_th; i++)
        pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&j.mu);
    if (j.st != RB_OK)
        return rb_error_set(err, j.st, "wcache: reading %s at offset %" PRIu64 ": %s", w->path,
                            j.fail_off, j.st == RB_E_SHORT_READ ? "file ended"
                                                                : strerror(j.e));
    return read_span(w, pb, b, err);
}

/* The lazily loaded model's bytes outside every layer's range (the gaps
 * between the data section's start, the layers' ranges and its end): the
 * embeddings and output matrix, the norms. */
static rb_status read_rest(rb_wcache *w, rb_throttle *th, rb_error *err)
{
    const rb_gguf *g = rb_model_gguf(w->model);
    uint64_t at = rb_gguf_data_offset(g), end = rb_gguf_file_size(g);
    while (at < end) {
        /* the next layer range at or after `at` (layers are few: a scan) */
        uint64_t lo = end, hi = end;
        for (uint32_t l = 0; l < w->n_layers; l++)
            if (w->thi[l] > w->tlo[l] && w->thi[l] > at && w->tlo[l] < lo) {
                lo = w->tlo[l] > at ? w->tlo[l] : at;
                hi = w->thi[l];
            }
        rb_status st = read_span_direct(w, at, lo, th, err);
        if (st != RB_OK)
            return st;
        at = hi;
    }
    return RB_OK;
}

rb_status rb_wcache_read_rest(rb_wcache *w, rb_throttle *throttle, rb_error *err)
{
    /* sessions opened at once from files: one reads, the others wait */
    pthread_mutex_lock(&w->mu);
    while (w->rest == WC_REST_LOADING)
        pthread_cond_wait(&w->cv, &w->mu);
    if (w->rest == WC_REST_READ) {
        pthread_mutex_unlock(&w->mu);
        return RB_OK;
    }
    w->rest = WC_REST_LOADING;
    pthread_mutex_unlock(&w->mu);
    rb_status st = read_rest(w, throttle, err);
    pthread_mutex_lock(&w->mu);
    w->rest = st == RB_OK ? WC_REST_READ : WC_REST_UNREAD; /* a failure: the next caller retries */
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return st;
}

rb_status rb_wcache_mark_unread(rb_wcache *w, rb_error *err)
{
    rb_status st = RB_OK;
    pthread_mutex_lock(&w->mu);
    if (w->is_marked_unread) { /* another session's cold start did: its
                                  restore reads the layers, or has */
        pthread_mutex_unlock(&w->mu);
        return RB_OK;
    }
    w->is_marked_unread = 1;
    for (uint32_t l = 0; l < w->n_layers && st == RB_OK; l++) {
        /* the bytes a layer shares with its neighbours' pages (and a whole
           layer that cannot be released) are read now: a few KiB */
        if (w->hi[l] == w->lo[l])
            st = read_span(w, w->tlo[l], w->thi[l], err);
        else if (w->is_mapped)
            st = RB_OK; /* the reload populates the whole range: a fault here
                           would read around it, several MiB, at open */
        else if ((st = read_span(w, w->tlo[l], w->lo[l], err)) == RB_OK)
            st = read_span(w, w->hi[l], w->thi[l], err);
        if (st == RB_OK)
            w->resident[l] = w->hi[l] == w->lo[l];
    }
    pthread_mutex_unlock(&w->mu);
    return st;
}

/* The file's mapping: unmapping a page never loses a byte (a later touch
 * faults the file's page back), so the layer's whole range goes, the pages
 * it shares with its neighbours too. The page cache keeps a folio while a
 * page of it is mapped, and fadvise drops only folios wholly inside its
 * range, and readahead's folios (up to MiBs) straddle layer boundaries:
 * the range dropped is the run of released layers around this one, so a
 * folio shared with a released neighbour goes as well. */
static void release_mapped(rb_wcache *w, uint32_t layer)
{
    uint64_t lo = w->tlo[layer] / WC_PAGE * WC_PAGE;
    uint64_t hi = (w->thi[layer] + WC_PAGE - 1) / WC_PAGE * WC_PAGE;
    madvise((void *)(w->base + lo), hi - lo, MADV_DONTNEED);
    uint32_t a = layer, b = layer;
    while (a > 0 && !w->resident[a - 1] && w->thi[a - 1] > w->tlo[a - 1])
        a--;
    while (b + 1 < w->n_layers && !w->resident[b + 1] && w->thi[b + 1] > w->tlo[b + 1])
        b++;
    lo = w->tlo[a] / WC_PAGE * WC_PAGE;
    hi = (w->thi[b] + WC_PAGE - 1) / WC_PAGE * WC_PAGE;
    posix_fadvise(w->fd, (off_t)lo, (off_t)(hi - lo), POSIX_FADV_DONTNEED);
}

int rb_wcache_release(rb_wcache *w, uint32_t layer)
{
    if (layer >= w->n_layers || w->hi[layer] == w->lo[layer])
        return 0;
    pthread_mutex_lock(&w->mu);
    int released = w->resident[layer] && !w->loading[layer] && w->in_use[layer] == 0;
    if (released) {
        w->resident[layer] = 0;
        if (w->is_mapped) {
            release_mapped(w, layer);
        } else {
            uint64_t n = w->hi[layer] - w->lo[layer];
            /* anonymous memory: the pages go back to the OS and read as
               zero until the reload writes them; the addresses stay valid.
               Small pages from now on: a huge page faulted in by a
               neighbour's reload could fill this part and overshoot the
               budget, and a reload into huge pages waits for the kernel to
               zero (and here, in a VM, often to find) each 2 MiB: touching
               600 MiB took 0.24-5.5 s in huge pages, 0.8-1.2 s in small */
            rb_os_advise_huge((void *)(w->base + w->lo[layer]), n, 0);
            madvise((void *)(w->base + w->lo[layer]), n, MADV_DONTNEED);
            if (!w->is_direct) /* so that the buffered reload reads the device */
                posix_fadvise(w->fd, (off_t)w->lo[layer], (off_t)n, POSIX_FADV_DONTNEED);
        }
    }
    pthread_mutex_unlock(&w->mu);
    return released;
}

uint64_t rb_wcache_release_last(rb_wcache *w, uint64_t need)
{
    uint64_t freed = 0;
    for (uint32_t l = w->n_layers; l-- > 0 && freed < need;)
        if (rb_wcache_release(w, l)) /* a layer a forward pass computes stays */
            freed += rb_wcache_layer_bytes(w, l);
    return freed;
}

/* Reads a released layer's bytes into place; called without mu, by the
 * one thread that set loading[layer]. */
static rb_status read_layer(rb_wcache *w, uint32_t layer, rb_throttle *th, rb_error *err)
{
    /* a mapping's reload covers the pages the layer shares with its
       neighbours too (populating a page that is there costs nothing) */
    uint64_t lo = w->is_mapped ? w->tlo[layer] : w->lo[layer];
    uint64_t hi = w->is_mapped ? w->thi[layer] : w->hi[layer];
    for (uint64_t off = lo; off < hi;) {
        size_t n = hi - off < WC_CHUNK ? (size_t)(hi - off) : WC_CHUNK;
        int64_t t0 = rb_throttle_now_ns();
        int e = 0;
        rb_status st = read_chunk(w, off, n, &e);
        if (st != RB_OK)
            return rb_error_set(err, st, "wcache: reloading layer %" PRIu32 " of %s at offset "
                                "%" PRIu64 ": %s", layer, w->path, off,
                                st == RB_E_SHORT_READ ? "file ended" : strerror(e));
        if (th)
            rb_throttle_io_since(th, n, t0);
        off += n;
    }
    return RB_OK;
}

/* Makes the layer resident (mu held; may drop it while reading): waits for
 * another thread's read of it, or reads it itself. */
static rb_status ensure_resident(rb_wcache *w, uint32_t layer, rb_throttle *th, rb_error *err)
{
    while (w->loading[layer])
        pthread_cond_wait(&w->cv, &w->mu);
    if (w->resident[layer])
        return RB_OK;
    w->loading[layer] = 1;
    pthread_mutex_unlock(&w->mu);
    rb_status st = read_layer(w, layer, th, err);
    pthread_mutex_lock(&w->mu);
    w->loading[layer] = 0;
    if (st == RB_OK)
        w->resident[layer] = 1;
    pthread_cond_broadcast(&w->cv);
    return st;
}

rb_status rb_wcache_reload(rb_wcache *w, uint32_t layer, rb_throttle *throttle, rb_error *err)
{
    if (layer >= w->n_layers || w->resident[layer])
        return RB_OK;
    pthread_mutex_lock(&w->mu);
    rb_status st = ensure_resident(w, layer, throttle, err);
    pthread_mutex_unlock(&w->mu);
    return st;
}

rb_status rb_wcache_use(rb_wcache *w, uint32_t layer, rb_throttle *throttle, rb_error *err)
{
    if (layer >= w->n_layers)
        return RB_OK;
    pthread_mutex_lock(&w->mu);
    rb_status st = ensure_resident(w, layer, throttle, err);
    if (st == RB_OK)
        w->in_use[layer]++;
    pthread_mutex_unlock(&w->mu);
    return st;
}

void rb_wcache_unuse(rb_wcache *w, uint32_t layer)
{
    if (layer >= w->n_layers)
        return;
    pthread_mutex_lock(&w->mu);
    if (w->in_use[layer] > 0)
        w->in_use[layer]--;
    pthread_mutex_unlock(&w->mu);
}

static void destroy_owner(void *w) { rb_wcache_destroy(w); }

rb_status rb_wcache_shared(rb_model *model, rb_wcache **out, rb_error *err)
{
    rb_wcache *w = rb_model_weights_owner(model);
    if (!w) {
        rb_status st = rb_wcache_create(model, rb_model_path(model), NULL, &w, err);
        if (st != RB_OK)
            return st;
        rb_model_set_weights_owner(model, w, destroy_owner);
    }
    *out = w;
    return RB_OK;
}

const char *rb_wcache_io_mode(const rb_wcache *w)
{
    return w->is_mapped   ? "page cache (mapped, fadvise(DONTNEED) on release)"
           : w->is_direct ? "O_DIRECT"
                          : "buffered + fadvise(DONTNEED)";
}
