/*
 * sessfile.c - the session file (format and commit protocol in sessfile.h).
 *
 * Memory: the in-RAM catalog (tokens up to the context's capacity, the page
 * table, the blob), one 4 KiB superblock buffer; nothing per page.
 * Invariant: `cat` and `sb` describe the committed state, except between
 * the writes of a commit; on failure a commit restores them.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvcodec.h"
#include "sessfile.h"
#include "status.h"

#define SF_A 4096u
#define SF_MAGIC "RBSESS01"

typedef struct sf_entry {
    uint64_t off;    /* 0: not saved */
    uint64_t hash;
    uint32_t tokens; /* positions of the page it holds */
} sf_entry;

typedef struct sf_super {
    uint64_t seq, fingerprint;
    uint32_t n_layers, n_kv_heads, head_dim_k, head_dim_v, page_tokens, pages_per_layer;
    uint64_t page_bytes, cat_area;
    uint32_t active;
    uint64_t cat_bytes, cat_hash, data_end;
} sf_super;

struct rb_sessfile {
    const rb_os *os;
    rb_throttle *throttle;
    int fd;          /* buffered: superblocks and catalogs */
    int fd_direct;   /* O_DIRECT for page records (or fd when refused) */
    rb_sessfile_geom g;
    sf_super sb;
    uint64_t cap_tokens;
    int32_t *tokens;
    size_t n_tokens;
    sf_entry *pages;  /* [n_layers][pages_per_layer] */
    uint8_t *blob;
    size_t blob_n;
    uint8_t *buf;     /* catalog serialisation, cat_area bytes */
    char path[512];
};

static void put32(uint8_t **p, uint32_t v) { memcpy(*p, &v, 4); *p += 4; }
static void put64(uint8_t **p, uint64_t v) { memcpy(*p, &v, 8); *p += 8; }
static uint32_t get32(const uint8_t **p) { uint32_t v; memcpy(&v, *p, 4); *p += 4; return v; }
static uint64_t get64(const uint8_t **p) { uint64_t v; memcpy(&v, *p, 8); *p += 8; return v; }

static uint64_t cat_area_bytes(const rb_sessfile_geom *g)
{
    uint64_t cap = (uint64_t)g->pages_per_layer * g->page_tokens;
    uint64_t n = 8 + 4 * cap + 24ull * g->n_layers * g->pages_per_layer + 4 + g->max_blob;
    return (n + SF_A - 1) / SF_A * SF_A;
}

static size_t sb_encode(const sf_super *s, uint8_t *out)
{
    memset(out, 0, SF_A);
    uint8_t *p = out;
    memcpy(p, SF_MAGIC, 8);
    p += 8;
    put64(&p, s->seq);
    put64(&p, s->fingerprint);
    put32(&p, s->n_layers);
    put32(&p, s->n_kv_heads);
    put32(&p, s->head_dim_k);
    put32(&p, s->head_dim_v);
    put32(&p, s->page_tokens);
    put32(&p, s->pages_per_layer);
    put64(&p, s->page_bytes);
    put64(&p, s->cat_area);
    put32(&p, s->active);
    put32(&p, 0);
    put64(&p, s->cat_bytes);
    put64(&p, s->cat_hash);
    put64(&p, s->data_end);
    uint64_t h = rb_kvcodec_hash64(out, (size_t)(p - out));
    put64(&p, h);
    return SF_A;
}

static int sb_decode(const uint8_t *in, sf_super *s)
{
    if (memcmp(in, SF_MAGIC, 8) != 0)
        return -1;
    const uint8_t *p = in + 8;
    s->seq = get64(&p);
    s->fingerprint = get64(&p);
    s->n_layers = get32(&p);
    s->n_kv_heads = get32(&p);
    s->head_dim_k = get32(&p);
    s->head_dim_v = get32(&p);
    s->page_tokens = get32(&p);
    s->pages_per_layer = get32(&p);
    s->page_bytes = get64(&p);
    s->cat_area = get64(&p);
    s->active = get32(&p);
    (void)get32(&p);
    s->cat_bytes = get64(&p);
    s->cat_hash = get64(&p);
    s->data_end = get64(&p);
    uint64_t h = rb_kvcodec_hash64(in, (size_t)(p - in));
    return get64(&p) == h ? 0 : -2;
}

static size_t n_entries(const rb_sessfile *f)
{
    return (size_t)f->g.n_layers * f->g.pages_per_layer;
}

static rb_sessfile *alloc_handle(const char *path, const rb_sessfile_geom *g, const rb_os *os,
                                 rb_throttle *throttle)
{
    rb_sessfile *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->os = os ? os : rb_os_default();
    f->throttle = throttle;
    f->fd = f->fd_direct = -1;
    f->g = *g;
    f->cap_tokens = (uint64_t)g->pages_per_layer * g->page_tokens;
    f->tokens = malloc((f->cap_tokens ? f->cap_tokens : 1) * sizeof *f->tokens);
    f->pages = calloc(n_entries(f) ? n_entries(f) : 1, sizeof *f->pages);
    f->blob = malloc(g->max_blob ? g->max_blob : 1);
    f->buf = aligned_alloc(SF_A, cat_area_bytes(g));
    snprintf(f->path, sizeof f->path, "%s", path);
    if (!f->tokens || !f->pages || !f->blob || !f->buf) {
        rb_sessfile_close(f);
        return NULL;
    }
    return f;
}

static void open_direct(rb_sessfile *f, int flags)
{
    f->fd_direct = f->os->open(f->path, flags | O_DIRECT | O_CLOEXEC, 0600);
    if (f->fd_direct < 0) /* e.g. a file system without O_DIRECT: buffered */
        f->fd_direct = f->fd;
}

rb_status rb_sessfile_create(const char *path, uint64_t fingerprint, const rb_sessfile_geom *g,
                             const rb_os *os, rb_throttle *throttle, rb_sessfile **out,
                             rb_error *err)
{
    rb_sessfile *f = alloc_handle(path, g, os, throttle);
    if (!f)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    /* written under another name and renamed over path: a file at path is
       never truncated, since a session may map its pages (a cold restore:
       rb_sessfile_map_page) and a cut file under a mapping is SIGBUS */
    char tmp[sizeof f->path + 8];
    snprintf(tmp, sizeof tmp, "%s.new", f->path);
    f->fd = f->os->open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        int e = errno;
        rb_sessfile_close(f);
        return rb_error_set(err, RB_E_IO, "session file: cannot create '%s': %s", tmp,
                            strerror(e));
    }
    sf_super *s = &f->sb;
    s->seq = 0;
    s->fingerprint = fingerprint;
    s->n_layers = g->n_layers;
    s->n_kv_heads = g->n_kv_heads;
    s->head_dim_k = g->head_dim_k;
    s->head_dim_v = g->head_dim_v;
    s->page_tokens = g->page_tokens;
    s->pages_per_layer = g->pages_per_layer;
    s->page_bytes = g->page_bytes;
    s->cat_area = cat_area_bytes(g);
    s->active = 1; /* the first commit writes area 0 */
    s->data_end = 2ull * SF_A + 2 * s->cat_area;
    /* an empty, valid state at once: a file is never left unreadable */
    rb_status st = rb_sessfile_commit(f, NULL, 0, NULL, 0, NULL, 0, 0, NULL, err);
    if (st == RB_OK && f->os->rename(tmp, path) != 0) {
        int e = errno;
        st = rb_error_set(err, RB_E_IO, "session file: cannot rename '%s' to '%s': %s", tmp,
                          path, strerror(e));
    }
    if (st != RB_OK) {
        rb_sessfile_close(f);
        unlink(tmp);
        return st;
    }
    open_direct(f, O_RDWR);
    *out = f;
    return RB_OK;
}

/* Loads the catalog s points to; 0 or -1 (bad). */
static int load_catalog(rb_sessfile *f, const sf_super *s, uint64_t file_size)
{
    uint64_t area_off = 2ull * SF_A + (uint64_t)s->active * s->cat_area;
    /* the catalog must be whole; pages past the end of a cut file are
       only lost pages (their reads fail and they are recomputed) */
    if (s->cat_bytes > s->cat_area || area_off + s->cat_bytes > file_size)
        return -1;
    if (rb_os_read_full(f->os, f->fd, f->buf, (size_t)s->cat_bytes, area_off, NULL, NULL) !=
        RB_OK)
        return -1;
    if (rb_kvcodec_hash64(f->buf, (size_t)s->cat_bytes) != s->cat_hash)
        return -1;
    const uint8_t *p = f->buf, *end = f->buf + s->cat_bytes;
    if (end - p < 8)
        return -1;
    uint64_t n = get64(&p);
    if (n > f->cap_tokens || (uint64_t)(end - p) < 4 * n + 24ull * n_entries(f) + 4)
        return -1;
    memcpy(f->tokens, p, 4 * n);
    p += 4 * n;
    f->n_tokens = (size_t)n;
    for (size_t i = 0; i < n_entries(f); i++) {
        f->pages[i].off = get64(&p);
        f->pages[i].hash = get64(&p);
        f->pages[i].tokens = get32(&p);
        (void)get32(&p);
        if (f->pages[i].off && (f->pages[i].off + f->g.page_alloc > s->data_end ||
                                f->pages[i].tokens > f->g.page_tokens))
            return -1;
    }
    uint32_t bn = get32(&p);
    if (bn > f->g.max_blob || (uint64_t)(end - p) < bn)
        return -1;
    memcpy(f->blob, p, bn);
    f->blob_n = bn;
    return 0;
}

rb_status rb_sessfile_check_model(const rb_sessfile *f, uint64_t fingerprint, rb_error *err)
{
    if (f->sb.fingerprint == fingerprint)
        return RB_OK;
    return rb_error_set(err, RB_E_INVALID_ARG, "session file: '%s' was written for another "
                        "model (fingerprint %016" PRIx64 ", this model %016" PRIx64 ")",
                        f->path, f->sb.fingerprint, fingerprint);
}

rb_status rb_sessfile_open(const char *path, const uint64_t *fingerprint,
                           const rb_sessfile_geom *g, const rb_os *os, rb_throttle *throttle,
                           rb_sessfile **out, rb_error *err)
{
    rb_sessfile *f = alloc_handle(path, g, os, throttle);
    if (!f)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    f->fd = f->os->open(path, O_RDWR | O_CLOEXEC, 0);
    if (f->fd < 0) {
        int e = errno;
        rb_sessfile_close(f);
        return rb_error_set(err, e == ENOENT ? RB_E_NOT_FOUND : RB_E_IO,
                            "session file: cannot open '%s': %s", path, strerror(e));
    }
    uint64_t size = 0;
    f->os->fstat_size(f->fd, &size);
    sf_super cand[2];
    int ok[2] = {0, 0};
    uint8_t *sbuf = f->buf;
    for (int i = 0; i < 2; i++)
        if (size >= (uint64_t)(i + 1) * SF_A &&
            rb_os_read_full(f->os, f->fd, sbuf, SF_A, (uint64_t)i * SF_A, NULL, NULL) == RB_OK)
            ok[i] = sb_decode(sbuf, &cand[i]) == 0;
    if (!ok[0] && !ok[1]) {
        rb_sessfile_close(f);
        return rb_error_set(err, RB_E_FORMAT, "session file: '%s' is not a rebound session "
                            "file, or both of its superblocks are damaged (%" PRIu64 " bytes)",
                            path, size);
    }
    /* newest first; a damaged newest state falls back to the other */
    int order[2] = {0, 1};
    if (ok[1] && (!ok[0] || cand[1].seq > cand[0].seq)) {
        order[0] = 1;
        order[1] = 0;
    }
    for (int k = 0; k < 2; k++) {
        const sf_super *s = &cand[order[k]];
        if (!ok[order[k]])
            continue;
        if (fingerprint && s->fingerprint != *fingerprint) {
            rb_sessfile_close(f);
            return rb_error_set(err, RB_E_INVALID_ARG, "session file: '%s' was written for "
                                "another model (fingerprint %016" PRIx64 ", this model %016"
                                PRIx64 ")", path, s->fingerprint, *fingerprint);
        }
        if (s->n_layers != g->n_layers || s->n_kv_heads != g->n_kv_heads ||
            s->head_dim_k != g->head_dim_k || s->head_dim_v != g->head_dim_v ||
            s->page_tokens != g->page_tokens || s->page_bytes != g->page_bytes ||
            s->pages_per_layer > g->pages_per_layer || s->cat_area != cat_area_bytes(g)) {
            rb_sessfile_close(f);
            return rb_error_set(err, RB_E_UNSUPPORTED, "session file: '%s' holds a context of "
                                "%" PRIu32 " pages of %" PRIu32 " tokens; this session has %"
                                PRIu32 " (open it with the same context length)", path,
                                s->pages_per_layer, s->page_tokens, g->pages_per_layer);
        }
        if (load_catalog(f, s, size) == 0) {
            f->sb = *s;
            open_direct(f, O_RDWR);
            /* mapped pages are read from storage, not from a copy an
               earlier process left in the page cache */
            posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
            *out = f;
            return RB_OK;
        }
    }
    rb_sessfile_close(f);
    return rb_error_set(err, RB_E_FORMAT, "session file: '%s': the catalog of every state is "
                        "damaged or cut short (%" PRIu64 " bytes)", path, size);
}

void rb_sessfile_close(rb_sessfile *f)
{
    if (!f)
        return;
    if (f->fd_direct >= 0 && f->fd_direct != f->fd)
        f->os->close(f->fd_direct);
    if (f->fd >= 0)
        f->os->close(f->fd);
    free(f->tokens);
    free(f->pages);
    free(f->blob);
    free(f->buf);
    free(f);
}

size_t rb_sessfile_n_tokens(const rb_sessfile *f) { return f->n_tokens; }
const int32_t *rb_sessfile_tokens(const rb_sessfile *f) { return f->tokens; }

const void *rb_sessfile_blob(const rb_sessfile *f, size_t *n)
{
    *n = f->blob_n;
    return f->blob;
}

uint32_t rb_sessfile_page_tokens(const rb_sessfile *f, uint32_t layer, uint32_t page)
{
    if (layer >= f->g.n_layers || page >= f->g.pages_per_layer)
        return 0;
    const sf_entry *e = &f->pages[(size_t)layer * f->g.pages_per_layer + page];
    return e->off ? e->tokens : 0;
}

/* Brings a saved page's record into buf: buf becomes a private mapping
 * of it, faulted in (map), or the record is read into buf. RB_OK,
 * RB_E_SHORT_READ, RB_E_IO with *en; RB_E_NOMEM (no buffer left). */
static rb_status page_in(rb_sessfile *f, const sf_entry *e, void *buf, int map, int *en)
{
    if (!map)
        return rb_os_read_full(f->os, f->fd_direct, buf, f->g.page_alloc, e->off, NULL, en);
    if (mmap(buf, f->g.page_alloc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, f->fd,
             (off_t)e->off) != MAP_FAILED)
        return rb_os_populate_read(buf, f->g.page_alloc, en);
    /* MAP_FIXED may have unmapped buf already: anonymous memory again */
    if (mmap(buf, f->g.page_alloc, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
             -1, 0) == MAP_FAILED)
        return RB_E_NOMEM;
    return page_in(f, e, buf, 0, en);
}

/* rb_sessfile_read_page and _map_page: the record in, through the
 * throttle, then its checksum. */
static rb_status get_page(rb_sessfile *f, uint32_t layer, uint32_t page, void *buf, int map,
                          rb_error *err)
{
    if (!rb_sessfile_page_tokens(f, layer, page))
        return rb_error_set(err, RB_E_NOT_FOUND, "session file: layer %" PRIu32 " page %" PRIu32
                            " is not saved", layer, page);
    const sf_entry *e = &f->pages[(size_t)layer * f->g.pages_per_layer + page];
    int64_t t0 = rb_throttle_now_ns();
    int en = 0;
    rb_status st = page_in(f, e, buf, map, &en);
    if (st == RB_E_NOMEM)
        return rb_error_set(err, st, "session file: no memory for layer %" PRIu32 " page %"
                            PRIu32, layer, page);
    if (st != RB_OK)
        return rb_error_set(err, st, "session file: '%s': reading layer %" PRIu32 " page %"
                            PRIu32 " at %" PRIu64 ": %s", f->path, layer, page, e->off,
                            st == RB_E_SHORT_READ ? "the file ends first" : strerror(en));
    if (f->throttle)
        rb_throttle_io_since(f->throttle, f->g.page_alloc, t0);
    if (rb_kvcodec_hash64(buf, f->g.page_bytes) != e->hash)
        return rb_error_set(err, RB_E_FORMAT, "session file: '%s': layer %" PRIu32 " page %"
                            PRIu32 " fails its checksum", f->path, layer, page);
    return RB_OK;
}

rb_status rb_sessfile_read_page(rb_sessfile *f, uint32_t layer, uint32_t page, void *buf,
                                rb_error *err)
{
    return get_page(f, layer, page, buf, 0, err);
}

rb_status rb_sessfile_map_page(rb_sessfile *f, uint32_t layer, uint32_t page, void *buf,
                               rb_error *err)
{
    /* an injected rb_os reads through its own pread: keep it in the path */
    int map = f->os == rb_os_default() && f->g.page_alloc % SF_A == 0 &&
              (uintptr_t)buf % SF_A == 0;
    return get_page(f, layer, page, buf, map, err);
}

void rb_sessfile_drop_cached(rb_sessfile *f, uint32_t layer, uint32_t page)
{
    const sf_entry *e = &f->pages[(size_t)layer * f->g.pages_per_layer + page];
    if (e->off)
        posix_fadvise(f->fd, (off_t)e->off, (off_t)f->g.page_alloc, POSIX_FADV_DONTNEED);
}

void rb_sessfile_truncate(rb_sessfile *f, size_t n_tokens)
{
    for (uint32_t l = 0; l < f->g.n_layers; l++)
        for (uint32_t p = 0; p < f->g.pages_per_layer; p++) {
            sf_entry *e = &f->pages[(size_t)l * f->g.pages_per_layer + p];
            if (e->off && (uint64_t)p * f->g.page_tokens + e->tokens > n_tokens)
                memset(e, 0, sizeof *e);
        }
    if (f->n_tokens > n_tokens)
        f->n_tokens = n_tokens;
}

static rb_status write_all(rb_sessfile *f, int fd, const void *p, size_t n, uint64_t off,
                           rb_error *err, const char *what)
{
    int en = 0;
    if (rb_os_write_full(f->os, fd, p, n, off, &en) != RB_OK)
        return rb_error_set(err, RB_E_IO, "session file: '%s': writing %s (%zu bytes at %"
                            PRIu64 "): %s", f->path, what, n, off, strerror(en));
    return RB_OK;
}

static const void *slot_get(void *ctx, uint32_t layer, uint32_t page)
{
    const rb_sessfile_slot_table *t = ctx;
    return t->slots[(size_t)layer * t->pages_per_layer + page];
}

static void slot_put(void *ctx, uint32_t layer, uint32_t page)
{
    (void)ctx, (void)layer, (void)page;
}

rb_sessfile_source rb_sessfile_slots(const rb_sessfile_slot_table *t)
{
    rb_sessfile_source s = {slot_get, slot_put, (void *)t};
    return s;
}

rb_status rb_sessfile_commit(rb_sessfile *f, const int32_t *tokens, size_t n_tokens,
                             const rb_sessfile_source *src, int with_tail, const void *blob,
                             size_t blob_n, int do_fsync, uint32_t *pages_written,
                             rb_error *err)
{
    if (n_tokens > f->cap_tokens || blob_n > f->g.max_blob)
        return rb_error_set(err, RB_E_INVALID_ARG, "session file: %zu tokens / %zu blob bytes "
                            "exceed its room (%" PRIu64 " / %" PRIu32 ")", n_tokens, blob_n,
                            f->cap_tokens, f->g.max_blob);
    /* keep the committed state to fall back on */
    sf_super old_sb = f->sb;
    sf_entry *old_pages = malloc(n_entries(f) * sizeof *old_pages + 1);
    if (!old_pages)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    memcpy(old_pages, f->pages, n_entries(f) * sizeof *old_pages);
    rb_status st = RB_OK;
    uint32_t written = 0;
    const uint32_t P = f->g.page_tokens;

    /* 1. pages holding more than their saved copy (data region, appended) */
    for (uint32_t l = 0; src && l < f->g.n_layers && st == RB_OK; l++)
        for (uint32_t p = 0; p < f->g.pages_per_layer; p++) {
            uint64_t first = (uint64_t)p * P;
            if (first >= n_tokens)
                break;
            uint32_t held = n_tokens - first >= P ? P : (uint32_t)(n_tokens - first);
            size_t i = (size_t)l * f->g.pages_per_layer + p;
            if ((held < P && !with_tail) || f->pages[i].tokens >= held)
                continue;
            const void *buf = src->get(src->ctx, l, p);
            if (!buf)
                continue;
            int64_t t0 = rb_throttle_now_ns();
            st = write_all(f, f->fd_direct, buf, f->g.page_alloc, f->sb.data_end, err,
                           "a KV page");
            if (st == RB_OK) {
                if (f->throttle)
                    rb_throttle_io_since(f->throttle, f->g.page_alloc, t0);
                f->pages[i].off = f->sb.data_end;
                f->pages[i].hash = rb_kvcodec_hash64(buf, f->g.page_bytes);
                f->pages[i].tokens = held;
                f->sb.data_end += f->g.page_alloc;
                written++;
            }
            src->put(src->ctx, l, p);
            if (st != RB_OK)
                break;
        }
    /* pages of positions beyond the new end (a rewind) are dropped */
    for (size_t i = 0; st == RB_OK && i < n_entries(f); i++) {
        uint64_t first = (uint64_t)(i % f->g.pages_per_layer) * P;
        if (f->pages[i].off && first + f->pages[i].tokens > n_tokens)
            memset(&f->pages[i], 0, sizeof f->pages[i]);
    }
    if (st == RB_OK && do_fsync && fdatasync(f->fd_direct) != 0)
        st = rb_error_set(err, RB_E_IO, "session file: '%s': fdatasync: %s", f->path,
                          strerror(errno));

    /* 2. the catalog, into the area the current superblock does not use */
    if (st == RB_OK) {
        uint8_t *p = f->buf;
        put64(&p, n_tokens);
        if (n_tokens)
            memcpy(p, tokens, 4 * n_tokens);
        p += 4 * n_tokens;
        for (size_t i = 0; i < n_entries(f); i++) {
            put64(&p, f->pages[i].off);
            put64(&p, f->pages[i].hash);
            put32(&p, f->pages[i].tokens);
            put32(&p, 0);
        }
        put32(&p, (uint32_t)blob_n);
        if (blob_n)
            memcpy(p, blob, blob_n);
        p += blob_n;
        f->sb.cat_bytes = (uint64_t)(p - f->buf);
        f->sb.cat_hash = rb_kvcodec_hash64(f->buf, (size_t)f->sb.cat_bytes);
        f->sb.active = 1 - old_sb.active;
        uint64_t area = 2ull * SF_A + (uint64_t)f->sb.active * f->sb.cat_area;
        st = write_all(f, f->fd, f->buf, (size_t)f->sb.cat_bytes, area, err, "the catalog");
    }
    if (st == RB_OK && do_fsync && fdatasync(f->fd) != 0)
        st = rb_error_set(err, RB_E_IO, "session file: '%s': fdatasync: %s", f->path,
                          strerror(errno));

    /* 3. the superblock that makes it the state */
    if (st == RB_OK) {
        f->sb.seq = old_sb.seq + 1;
        uint8_t *sbuf = f->buf;
        sb_encode(&f->sb, sbuf);
        st = write_all(f, f->fd, sbuf, SF_A, (f->sb.seq % 2) * SF_A, err, "the superblock");
        if (st == RB_OK && do_fsync && fdatasync(f->fd) != 0)
            st = rb_error_set(err, RB_E_IO, "session file: '%s': fdatasync: %s", f->path,
                              strerror(errno));
    }
    if (st != RB_OK) {
        f->sb = old_sb;
        /* only the entries this commit changed: a restore may be reading
           the others (rb_sessfile_read_page) */
        for (size_t i = 0; i < n_entries(f); i++)
            if (f->pages[i].off != old_pages[i].off || f->pages[i].tokens != old_pages[i].tokens)
                f->pages[i] = old_pages[i];
    } else {
        if (n_tokens && tokens != f->tokens)
            memcpy(f->tokens, tokens, 4 * n_tokens);
        f->n_tokens = n_tokens;
        if (blob_n && blob != f->blob)
            memcpy(f->blob, blob, blob_n);
        f->blob_n = blob_n;
    }
    free(old_pages);
    if (pages_written)
        *pages_written = written;
    return st;
}
