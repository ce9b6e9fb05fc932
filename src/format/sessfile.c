/*
 * sessfile.c - the session file (format and commit protocol in sessfile.h).
 *
 * Memory: the in-RAM catalog (tokens up to the context's capacity, the page
 * table, the blob as large as it is), one buffer for the superblock and the
 * catalog's serialisation (grown to what the catalog holds, never to its
 * area's room of a 256 KiB blob); nothing per page.
 * Invariant: `cat` and `sb` describe the committed state, except between
 * the writes of a commit; on failure a commit restores them.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvcodec.h"
#include "sessfile.h"
#include "os.h"
#include "status.h"

#define SF_A 4096u
#define SF_MAGIC "RBSESS01"
#define SF_BASE_MAGIC "RBPF"
#define SF_BASE_SUFFIX ".base"
#define SF_PREFIX_NAME ".rbprefix-"
#define SF_MAX_RUN 64 /* pages in one read request (rb_sessfile_read_pages) */

/* A fuzzing build skips the checksums, so that mutated files reach the
   checks behind them (never in a normal build); it does not even compute
   them (the bytes were just read into the buffer the hash would read). */
#ifdef REBOUND_FUZZ
#define HASH_OK(stored, computed) ((void)(stored), (void)sizeof(computed), 1)
#else
#define HASH_OK(stored, computed) ((stored) == (computed))
#endif

/* Whose lock: the holder also locks the byte at SF_LOCK_PID + its pid, so
   that another process can name it (an OFD lock reports no pid). */
#define SF_LOCK_PID (1ll << 62)

typedef struct sf_entry {
    uint64_t off;    /* 0: not saved */
    uint64_t hash;
    uint32_t tokens; /* positions of the page it holds */
    uint32_t in_base; /* the record is the prefix file's (off is there) */
} sf_entry;

typedef struct sf_super {
    uint64_t seq, fingerprint;
    uint32_t n_layers, n_kv_heads, head_dim_k, head_dim_v, page_tokens, pages_per_layer;
    uint64_t page_bytes, cat_area;
    uint32_t active, n_ctx;
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
    size_t blob_n, blob_cap;
    uint8_t *buf;     /* superblock and catalog serialisation, buf_cap bytes:
                         grown to what a catalog needs, not its area's room */
    size_t buf_cap;
    char *path;       /* the file (a symbolic link's target) */
    char *tmp_path;   /* a new file not yet published at path: its name */
    int publish_pending;  /* the next commit publishes tmp_path at path */
    int replace_fd;   /* the file at path a publish replaces (locked), or -1 */
    uint64_t lost_tokens;     /* the open fell back: tokens of the newer state */
    char recovery[320];       /* the open fell back: why ("" when not) */
    uint64_t n_compactions;   /* rb_sessfile_compact rewrites */
    /* The prefix file (path.base, read only) that in_base entries lie in,
       and the tokens it holds; NULL: none. Set by a commit (under the
       lock's write side) or the open, closed with the handle. */
    rb_sessfile *base;
    uint32_t base_tokens;
    /* Readers of the page table from other threads (rb_sessfile_read_page,
       _page_tokens) hold it shared; a compaction, which moves every record
       to another file, holds it exclusive while it swaps the table and the
       descriptors. A commit's own entry writes need no lock (see sessfile.h). */
    pthread_rwlock_t lock;
    int has_lock;
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
    put32(&p, s->n_ctx);
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
    s->n_ctx = get32(&p);
    s->cat_bytes = get64(&p);
    s->cat_hash = get64(&p);
    s->data_end = get64(&p);
    uint64_t h = rb_kvcodec_hash64(in, (size_t)(p - in));
    return HASH_OK(get64(&p), h) ? 0 : -2;
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
    if (pthread_rwlock_init(&f->lock, NULL) != 0) {
        free(f);
        return NULL;
    }
    f->has_lock = 1;
    f->fd = f->fd_direct = f->replace_fd = -1;
    f->g = *g;
    f->cap_tokens = (uint64_t)g->pages_per_layer * g->page_tokens;
    f->tokens = malloc((f->cap_tokens ? f->cap_tokens : 1) * sizeof *f->tokens);
    f->pages = calloc(n_entries(f) ? n_entries(f) : 1, sizeof *f->pages);
    f->blob_cap = 64; /* both grow on use: the room (a 256 KiB blob) is rarely used */
    f->blob = malloc(f->blob_cap);
    f->buf_cap = SF_A;
    f->buf = rb_os_aligned_alloc(SF_A, f->buf_cap);
    f->path = strdup(path);
    if (!f->tokens || !f->pages || !f->blob || !f->buf || !f->path) {
        rb_sessfile_close(f);
        return NULL;
    }
    return f;
}

/* Grows buf (keeping nothing) or blob (keeping its bytes) to n bytes.
 * 0, or -1 when out of memory (nothing changed). */
static int reserve_buf(rb_sessfile *f, uint64_t n)
{
    if (n <= f->buf_cap)
        return 0;
    size_t cap = (size_t)((n + SF_A - 1) / SF_A * SF_A);
    uint8_t *b = rb_os_aligned_alloc(SF_A, cap);
    if (!b)
        return -1;
    free(f->buf);
    f->buf = b;
    f->buf_cap = cap;
    return 0;
}

static int reserve_blob(rb_sessfile *f, size_t n)
{
    if (n <= f->blob_cap)
        return 0;
    uint8_t *b = realloc(f->blob, n);
    if (!b)
        return -1;
    f->blob = b;
    f->blob_cap = n;
    return 0;
}

static void open_direct(rb_sessfile *f, const char *path, int flags)
{
    f->fd_direct = f->os->open(path, flags | O_DIRECT | O_CLOEXEC, 0600);
    if (f->fd_direct < 0) /* e.g. a file system without O_DIRECT: buffered */
        f->fd_direct = f->fd;
}

/* Takes the file's writer lock on fd (an OFD lock: it belongs to this open
 * file, dies with it, and a dead holder never blocks), waiting for it when
 * wait. RB_OK; RB_E_BUSY naming the holder's pid; RB_E_IO. */
static rb_status take_lock(int fd, const char *path, int wait, rb_error *err)
{
    struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
    int rc;
    while ((rc = fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &l)) != 0 && errno == EINTR)
        ;
    if (rc == 0) {
        struct flock me = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                           .l_start = SF_LOCK_PID + getpid(), .l_len = 1};
        (void)fcntl(fd, F_OFD_SETLK, &me); /* only to be named: best effort */
        return RB_OK;
    }
    if (errno != EAGAIN && errno != EACCES)
        return rb_error_set(err, RB_E_IO, "session file: cannot lock '%s': %s", path,
                            strerror(errno));
    struct flock q = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = SF_LOCK_PID,
                      .l_len = 1ll << 32};
    long pid = 0;
    if (fcntl(fd, F_OFD_GETLK, &q) == 0 && q.l_type != F_UNLCK)
        pid = (long)(q.l_start - SF_LOCK_PID);
    char who[48] = "another process";
    if (pid > 0)
        snprintf(who, sizeof who, "process %ld", pid);
    return rb_error_set(err, RB_E_BUSY, "session file: '%s' is in use by %s (one writer at a "
                        "time: wait for it to end, or open it with RB_SAVE_WAIT in the file flags)", path, who);
}

/* Opens path and takes its lock. A file replaced at path while this waited
 * (a new file renamed over it) is opened again: the lock is on what path
 * names. -1 with *err set. */
static int open_locked(const rb_os *os, const char *path, int flags, int wait, rb_error *err)
{
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = os->open(path, flags | O_CLOEXEC, 0);
        if (fd < 0) {
            int e = errno;
            rb_error_set(err, e == ENOENT ? RB_E_NOT_FOUND : RB_E_IO,
                         "session file: cannot open '%s': %s", path, strerror(e));
            return -1;
        }
        if (take_lock(fd, path, wait, err) != RB_OK) {
            os->close(fd);
            return -1;
        }
        struct stat a, b;
        if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            return fd;
        os->close(fd);
    }
    rb_error_set(err, RB_E_BUSY, "session file: '%s' keeps being replaced by another process",
                 path);
    return -1;
}

/* Whether name is base + ".new-PID-K" (a new file or a compaction's, not
 * yet renamed over base); its PID in *pid. */
static int stray_pid(const char *name, const char *base, long *pid)
{
    size_t n = strlen(base);
    if (strncmp(name, base, n) != 0 || strncmp(name + n, ".new-", 5) != 0)
        return 0;
    const char *p = name + n + 5;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || *end != '-' || v <= 0 || errno)
        return 0;
    p = end + 1;
    (void)strtol(p, &end, 10);
    if (end == p || *end)
        return 0;
    *pid = v;
    return 1;
}

/* Removes what a process killed before its rename left beside path:
 * path.new-PID-K whose PID is no process (never one of a live process,
 * nor this one's: another handle may be writing it), and whose lock no
 * one holds (a child that inherited the file keeps it). Best effort: a
 * stray that cannot be removed stays, harmless. Returns how many went. */
static unsigned remove_strays(const rb_os *os, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    size_t dn = slash ? (size_t)(slash - path) + 1 : 0;
    char *dir = malloc(dn + 2);
    if (!dir)
        return 0;
    memcpy(dir, path, dn);
    strcpy(dir + dn, dn ? "" : ".");
    DIR *d = opendir(dir);
    unsigned n = 0;
    struct dirent *ent;
    while (d && (ent = readdir(d)) != NULL) {
        long pid = 0;
        if (!stray_pid(ent->d_name, base, &pid) || pid == (long)getpid() ||
            kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        size_t fn = dn + strlen(ent->d_name) + 1;
        char *full = malloc(fn);
        if (!full)
            break;
        snprintf(full, fn, "%.*s%s", (int)dn, path, ent->d_name);
        int fd = os->open(full, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
        struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
        if (fd >= 0 && fcntl(fd, F_OFD_SETLK, &l) == 0 && os->unlink(full) == 0)
            n++;
        if (fd >= 0)
            os->close(fd);
        free(full);
    }
    if (d)
        closedir(d);
    free(dir);
    return n;
}

/* The file a session path names: itself, or a symbolic link's target (a
 * link is followed, never replaced); a link to nothing or a loop is
 * refused. *out is malloc'd. */
static rb_status resolve_path(const char *path, char **out, rb_error *err)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno != ENOENT)
            return rb_error_set(err, RB_E_IO, "session file: '%s': %s", path, strerror(errno));
        *out = strdup(path);
    } else if (S_ISLNK(st.st_mode)) {
        *out = realpath(path, NULL);
        if (!*out) {
            int e = errno;
            return rb_error_set(err, e == ENOMEM ? RB_E_NOMEM : RB_E_IO,
                                "session file: '%s' is a symbolic link that leads nowhere (%s); "
                                "refusing to replace it: remove the link or give a real file",
                                path, strerror(e));
        }
        if (stat(*out, &st) == 0 && !S_ISREG(st.st_mode)) {
            free(*out);
            return rb_error_set(err, RB_E_IO, "session file: '%s' is a link to something that "
                                "is not a regular file", path);
        }
    } else if (!S_ISREG(st.st_mode)) {
        return rb_error_set(err, RB_E_IO, "session file: '%s' exists and is not a regular "
                            "file", path);
    } else {
        *out = strdup(path);
    }
    return *out ? RB_OK : rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
}

rb_status rb_sessfile_create(const char *path, uint64_t fingerprint, const rb_sessfile_geom *g,
                             const rb_os *os, rb_throttle *throttle, rb_sessfile **out,
                             rb_error *err)
{
    char *target = NULL;
    rb_status st = resolve_path(path, &target, err);
    if (st != RB_OK)
        return st;
    rb_sessfile *f = alloc_handle(target, g, os, throttle);
    size_t tn = strlen(target) + 32;
    char *tmp = malloc(tn);
    free(target);
    if (!f || !tmp) {
        free(tmp);
        rb_sessfile_close(f);
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    }
    /* A file at path stays until the new one is renamed over it (a kill
       meanwhile leaves the old state whole). It is locked meanwhile: a
       file another process writes is never replaced. */
    if (access(f->path, F_OK) == 0 &&
        (f->replace_fd = open_locked(f->os, f->path, O_RDWR, g->is_lock_wait, err)) < 0) {
        free(tmp);
        rb_sessfile_close(f);
        return err->status;
    }
    remove_strays(f->os, f->path);
    /* The new file, under a name of this process's own, appears at path
       only with its first real state (the first commit after this one). */
    for (int k = 0; k < 100; k++) { /* a name no other handle uses */
        snprintf(tmp, tn, "%s.new-%ld-%d", f->path, (long)getpid(), k);
        f->fd = f->os->open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (f->fd >= 0 || errno != EEXIST)
            break;
    }
    if (f->fd < 0) {
        int e = errno;
        rb_sessfile_close(f);
        st = rb_error_set(err, e == ENAMETOOLONG ? RB_E_INVALID_ARG : RB_E_IO,
                          "session file: cannot create '%s': %s", tmp, strerror(e));
        free(tmp);
        return st;
    }
    f->tmp_path = tmp;
    if ((st = take_lock(f->fd, tmp, 0, err)) != RB_OK) {
        rb_sessfile_close(f);
        return st;
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
    s->n_ctx = g->n_ctx;
    s->active = 1; /* the first commit writes area 0 */
    s->data_end = 2ull * SF_A + 2 * s->cat_area;
    /* an empty, valid state at once: the file is never unreadable */
    if ((st = rb_sessfile_commit(f, NULL, 0, NULL, 0, NULL, 0, 0, NULL, err)) != RB_OK) {
        rb_sessfile_close(f);
        return st;
    }
    f->publish_pending = 1;
    open_direct(f, tmp, O_RDWR);
    *out = f;
    return RB_OK;
}

static char *with_suffix(const char *path, const char *suffix);

/* fsync of the directory holding path (a rename or link in it survives a
 * power cut); a fault point. Best effort: the data itself is synced. */
static void sync_dir(const char *path)
{
    char *dir = strdup(path);
    char *slash = dir ? strrchr(dir, '/') : NULL;
    int dfd = -1;
    if (dir) {
        if (slash)
            *(slash == dir ? slash + 1 : slash) = 0;
        dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    if (dfd >= 0) {
        rb_os_fault_point();
        fsync(dfd);
        close(dfd);
    }
    free(dir);
}

/* Makes the new file the one at path: renamed over the file it replaces,
 * or linked where none is (so that a file another process created
 * meanwhile is never replaced: RB_E_BUSY). */
static rb_status publish(rb_sessfile *f, int do_fsync, rb_error *err)
{
    rb_os_fault_point(); /* a kill with the new file whole, not yet at path */
    if (f->replace_fd >= 0) {
        if (f->os->rename(f->tmp_path, f->path) != 0)
            return rb_error_set(err, RB_E_IO, "session file: cannot rename '%s' to '%s': %s",
                                f->tmp_path, f->path, strerror(errno));
        f->os->close(f->replace_fd);
        f->replace_fd = -1;
    } else {
        if (link(f->tmp_path, f->path) != 0) {
            int e = errno;
            return rb_error_set(err, e == EEXIST ? RB_E_BUSY : RB_E_IO, "session file: cannot "
                                "create '%s': %s", f->path, e == EEXIST ? "another process "
                                "created it meanwhile" : strerror(e));
        }
        f->os->unlink(f->tmp_path);
    }
    if (do_fsync) /* the name too survives a power cut */
        sync_dir(f->path);
    free(f->tmp_path);
    f->tmp_path = NULL;
    f->publish_pending = 0;
    if (!f->base) { /* the replaced file's link to its prefix file goes with it */
        char *b = with_suffix(f->path, SF_BASE_SUFFIX);
        if (b)
            unlink(b);
        free(b);
    }
    return RB_OK;
}

/* Loads the catalog s points to. 0; -1 damaged (*why says what, *claimed
 * the token count it claims, unverified); -2 a mismatch with this session
 * that no other state can cure (err set). */
static int load_catalog(rb_sessfile *f, const sf_super *s, uint64_t file_size, char *why,
                        size_t why_n, uint64_t *claimed, rb_error *err)
{
    const uint64_t data0 = 2ull * SF_A + 2 * s->cat_area;
    uint64_t area_off = 2ull * SF_A + (uint64_t)s->active * s->cat_area;
    *claimed = 0;
    if (s->active > 1 || s->cat_bytes < 12 || s->cat_bytes > s->cat_area) {
        snprintf(why, why_n, "its superblock names catalog area %" PRIu32 " of %" PRIu64
                 " bytes (2 areas of %" PRIu64 ")", s->active, s->cat_bytes, s->cat_area);
        return -1;
    }
    /* a data end beyond the file is a file cut short: the pages past its
       end are lost (recomputed), and appends go on at its end */
    if (s->data_end < data0 || s->data_end % SF_A) {
        snprintf(why, why_n, "its data end %" PRIu64 " lies before the data (%" PRIu64
                 ") or off its 4 KiB grid", s->data_end, data0);
        return -1;
    }
    /* the catalog must be whole; pages past the end of a cut file are
       only lost pages (their reads fail and they are recomputed) */
    if (reserve_buf(f, s->cat_bytes) != 0) {
        snprintf(why, why_n, "no memory for its catalog of %" PRIu64 " bytes", s->cat_bytes);
        return -1;
    }
    if (area_off + s->cat_bytes > file_size ||
        rb_os_read_full(f->os, f->fd, f->buf, (size_t)s->cat_bytes, area_off, NULL, NULL) !=
            RB_OK) {
        snprintf(why, why_n, "its catalog [%" PRIu64 ", +%" PRIu64 ") is cut short", area_off,
                 s->cat_bytes);
        return -1;
    }
    const uint8_t *p = f->buf, *end = f->buf + s->cat_bytes;
    uint64_t n, last_in_base = 0;
    size_t n_in_base = 0;
    memcpy(&n, p, 8);
    *claimed = n;
    if (!HASH_OK(rb_kvcodec_hash64(f->buf, (size_t)s->cat_bytes), s->cat_hash)) {
        snprintf(why, why_n, "its catalog fails its checksum");
        return -1;
    }
    n = get64(&p);
    if (n > f->cap_tokens || (uint64_t)(end - p) < 4 * n + 24ull * n_entries(f) + 4) {
        snprintf(why, why_n, "its catalog claims %" PRIu64 " tokens, more than its %" PRIu64
                 " bytes or its context of %" PRIu64 " hold", n, s->cat_bytes, f->cap_tokens);
        return -1;
    }
    if (f->g.n_ctx && n > f->g.n_ctx) {
        char saved[48] = "";
        if (s->n_ctx)
            snprintf(saved, sizeof saved, ", saved with n_ctx %" PRIu32, s->n_ctx);
        rb_error_set(err, RB_E_UNSUPPORTED, "session file: '%s' holds %" PRIu64 " tokens%s; "
                     "this session's context is %" PRIu32 " tokens: open it with n_ctx %" PRIu64
                     " or more", f->path, n, saved, f->g.n_ctx,
                     s->n_ctx > n ? (uint64_t)s->n_ctx : n);
        return -2;
    }
    memcpy(f->tokens, p, 4 * n);
    p += 4 * n;
    for (uint64_t i = 0; f->g.n_vocab && i < n; i++)
        if (f->tokens[i] < 0 || (uint32_t)f->tokens[i] >= f->g.n_vocab) {
            rb_error_set(err, RB_E_FORMAT, "session file: '%s': token %" PRIu64 " is %" PRId32
                         ", outside the model's vocabulary of %" PRIu32, f->path, i,
                         f->tokens[i], f->g.n_vocab);
            return -2;
        }
    f->n_tokens = (size_t)n;
    for (size_t i = 0; i < n_entries(f); i++) {
        sf_entry *e = &f->pages[i];
        e->off = get64(&p);
        e->hash = get64(&p);
        e->tokens = get32(&p);
        e->in_base = get32(&p);
        uint64_t first = (uint64_t)(i % f->g.pages_per_layer) * f->g.page_tokens;
        if (e->in_base) { /* resolved against the prefix file by the open */
            if (e->in_base != 1 || e->off || !e->tokens || e->tokens > f->g.page_tokens ||
                first + e->tokens > n) {
                snprintf(why, why_n, "its catalog entry of layer %zu page %zu (flags %" PRIu32
                         ", offset %" PRIu64 ", %" PRIu32 " tokens) is not a prefix file's "
                         "page", i / f->g.pages_per_layer, i % f->g.pages_per_layer,
                         e->in_base, e->off, e->tokens);
                return -1;
            }
            n_in_base++;
            last_in_base = first + f->g.page_tokens;
            continue;
        }
        if (!e->off) {
            e->tokens = 0;
            continue;
        }
        if (e->off < data0 || e->off % SF_A || e->off > s->data_end ||
            s->data_end - e->off < f->g.page_alloc || !e->tokens ||
            e->tokens > f->g.page_tokens || first + e->tokens > n) {
            snprintf(why, why_n, "its catalog entry of layer %zu page %zu (offset %" PRIu64
                     ", %" PRIu32 " tokens) lies outside the data [%" PRIu64 ", %" PRIu64
                     ") or the %" PRIu64 " tokens", i / f->g.pages_per_layer,
                     i % f->g.pages_per_layer, e->off, e->tokens, data0, s->data_end, n);
            return -1;
        }
        if (e->off + f->g.page_alloc > file_size)
            memset(e, 0, sizeof *e);
    }
    uint32_t bn = get32(&p);
    if (bn > f->g.max_blob || (uint64_t)(end - p) < bn) {
        snprintf(why, why_n, "its catalog's blob of %" PRIu32 " bytes exceeds its room",
                 bn);
        return -1;
    }
    if (reserve_blob(f, bn) != 0) {
        snprintf(why, why_n, "no memory for its blob of %" PRIu32 " bytes", bn);
        return -1;
    }
    memcpy(f->blob, p, bn);
    f->blob_n = bn;
    p += bn;
    /* after the blob, when the file names a prefix file: its magic and
       the tokens it holds */
    f->base_tokens = 0;
    if (end - p >= 8 && !memcmp(p, SF_BASE_MAGIC, 4)) {
        p += 4;
        f->base_tokens = get32(&p);
    }
    if (n_in_base && (!f->base_tokens || f->base_tokens % f->g.page_tokens ||
                      f->base_tokens > n || last_in_base > f->base_tokens)) {
        snprintf(why, why_n, "its catalog has %zu pages in a prefix file of %" PRIu32
                 " tokens (of its %" PRIu64 ")", n_in_base, f->base_tokens, n);
        return -1;
    }
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

/* A state whose shape is not this session's: what differs, said as such.
 * RB_OK when it fits. */
static rb_status check_shape(const rb_sessfile *f, const sf_super *s, rb_error *err)
{
    const rb_sessfile_geom *g = &f->g;
    if (s->page_tokens != g->page_tokens && s->n_layers == g->n_layers &&
        s->n_kv_heads == g->n_kv_heads && s->head_dim_k == g->head_dim_k &&
        s->head_dim_v == g->head_dim_v)
        return rb_error_set(err, RB_E_INVALID_ARG, "session file: '%s' holds KV pages of %" PRIu32
                            " tokens; this session's are %" PRIu32 " (kv_page_tokens): open it "
                            "with kv_page_tokens %" PRIu32, f->path, s->page_tokens,
                            g->page_tokens, s->page_tokens);
    if (s->n_layers != g->n_layers || s->n_kv_heads != g->n_kv_heads ||
        s->head_dim_k != g->head_dim_k || s->head_dim_v != g->head_dim_v ||
        s->page_tokens != g->page_tokens || s->page_bytes != g->page_bytes)
        return rb_error_set(err, RB_E_INVALID_ARG, "session file: '%s' was written for another "
                            "model: %" PRIu32 " layers, %" PRIu32 " KV heads, head dims %" PRIu32
                            "/%" PRIu32 ", pages of %" PRIu32 " tokens; this model has %" PRIu32
                            ", %" PRIu32 ", %" PRIu32 "/%" PRIu32 ", %" PRIu32, f->path,
                            s->n_layers, s->n_kv_heads, s->head_dim_k, s->head_dim_v,
                            s->page_tokens, g->n_layers, g->n_kv_heads, g->head_dim_k,
                            g->head_dim_v, g->page_tokens);
    if (s->pages_per_layer != g->pages_per_layer || s->cat_area != cat_area_bytes(g)) {
        char saved[64];
        if (s->n_ctx)
            snprintf(saved, sizeof saved, "n_ctx %" PRIu32, s->n_ctx);
        else
            snprintf(saved, sizeof saved, "an n_ctx in (%" PRIu64 ", %" PRIu64 "]",
                     (uint64_t)(s->pages_per_layer ? s->pages_per_layer - 1 : 0) *
                         s->page_tokens, (uint64_t)s->pages_per_layer * s->page_tokens);
        return rb_error_set(err, RB_E_UNSUPPORTED, "session file: '%s' was saved with %s "
                            "(%" PRIu32 " pages of %" PRIu32 " tokens per layer); this session "
                            "has n_ctx %" PRIu32 " (%" PRIu32 " page%s): open it with %s", f->path,
                            saved, s->pages_per_layer, s->page_tokens, g->n_ctx,
                            g->pages_per_layer, g->pages_per_layer == 1 ? "" : "s", saved);
    }
    return RB_OK;
}

/* Both superblocks of the file at fd, read through buf (SF_A bytes): ok[i]
 * when slot i reads back whole. A commit writes seq n at slot n % 2: one
 * found elsewhere (crafted) would have the next commit overwrite the state
 * it opened from, and a kill in that write leave none. Returns the newest
 * whole one's slot, or -1. */
static int read_supers(const rb_os *os, int fd, uint8_t *buf, sf_super cand[2], int ok[2])
{
    for (int i = 0; i < 2; i++)
        ok[i] = rb_os_read_full(os, fd, buf, SF_A, (uint64_t)i * SF_A, NULL, NULL) == RB_OK &&
                sb_decode(buf, &cand[i]) == 0 && cand[i].seq % 2 == (uint64_t)i;
    if (!ok[0] && !ok[1])
        return -1;
    return ok[1] && (!ok[0] || cand[1].seq > cand[0].seq) ? 1 : 0;
}

uint32_t rb_sessfile_peek_page_tokens(const char *path, int fd, const rb_os *os)
{
    os = os ? os : rb_os_default();
    const int own = fd < 0;
    if (own && (fd = os->open(path, O_RDONLY | O_CLOEXEC, 0)) < 0)
        return 0;
    uint8_t buf[SF_A];
    sf_super cand[2];
    int ok[2];
    const int newest = read_supers(os, fd, buf, cand, ok); /* as open_state picks */
    if (own)
        os->close(fd);
    return newest < 0 ? 0 : cand[newest].page_tokens;
}

static rb_status open_state(rb_sessfile *f, const char *path, const uint64_t *fingerprint,
                            int is_read_only, rb_sessfile **out, rb_error *err);

/* path + suffix, malloc'd (NULL: out of memory). */
static char *with_suffix(const char *path, const char *suffix)
{
    size_t n = strlen(path) + strlen(suffix) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s", path, suffix);
    return s;
}

/* The prefix file at path, read only (no lock: it never changes), if it
 * holds exactly tokens [0, nb) of a model of f's fingerprint and geometry;
 * else NULL. */
static rb_sessfile *open_prefix(const rb_sessfile *f, const char *path, const int32_t *tokens,
                                size_t nb)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    rb_sessfile_geom g = f->g;
    g.is_lock_wait = 0;
    rb_sessfile *b = NULL;
    rb_error e;
    if (rb_sessfile_open_fd(fd, path, &f->sb.fingerprint, &g, f->os, f->throttle, &b, &e) ==
        RB_OK && (b->n_tokens != nb || memcmp(b->tokens, tokens, 4 * nb) != 0 || b->base)) {
        rb_sessfile_close(b);
        b = NULL;
    }
    close(fd);
    if (b) /* its pages are read as the file's own: past the page cache */
        open_direct(b, path, O_RDONLY);
    return b;
}

/* The open's side of a file that names a prefix file: opens path.base and
 * points each of the catalog's prefix entries at the record there, when
 * that record is whole and has the entry's checksum. Entries it cannot
 * point (no such file, other tokens, another page) are lost pages,
 * recomputed from the tokens like the pages of a file cut short; the
 * recovery note says how many. A read-only open (a descriptor: no name to
 * find the prefix file by) loses them all. */
static void resolve_base(rb_sessfile *f, int is_read_only)
{
    if (!f->base_tokens)
        return;
    char *bpath = is_read_only ? NULL : with_suffix(f->path, SF_BASE_SUFFIX);
    rb_sessfile *b = bpath ? open_prefix(f, bpath, f->tokens, f->base_tokens) : NULL;
    size_t lost = 0;
    for (size_t i = 0; i < n_entries(f); i++) {
        sf_entry *e = &f->pages[i];
        if (!e->in_base)
            continue;
        const sf_entry *be = b ? &b->pages[i] : NULL;
        if (be && be->off && !be->in_base && be->tokens == f->g.page_tokens &&
            be->hash == e->hash) {
            e->off = be->off;
        } else {
            memset(e, 0, sizeof *e);
            lost++;
        }
    }
    if (b)
        f->base = b;
    else
        f->base_tokens = 0;
    if (lost && !f->recovery[0])
        snprintf(f->recovery, sizeof f->recovery, "%zu pages of its prefix file '%s' are "
                 "missing or differ: their positions are computed again", lost,
                 bpath ? bpath : "(a descriptor has none)");
    free(bpath);
}

rb_status rb_sessfile_open(const char *path, const uint64_t *fingerprint,
                           const rb_sessfile_geom *g, const rb_os *os, rb_throttle *throttle,
                           rb_sessfile **out, rb_error *err)
{
    /* a link's target: a compaction renames a new file over it, never
       over the link */
    char *target = NULL;
    rb_status rst = resolve_path(path, &target, err);
    if (rst != RB_OK)
        return rst == RB_E_IO && access(path, F_OK) != 0
                   ? rb_error_set(err, RB_E_NOT_FOUND, "session file: cannot open '%s': %s",
                                  path, strerror(ENOENT))
                   : rst;
    rb_sessfile *f = alloc_handle(target, g, os, throttle);
    free(target);
    if (!f)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    f->fd = open_locked(f->os, f->path, O_RDWR, g->is_lock_wait, err);
    if (f->fd < 0) {
        rb_sessfile_close(f);
        return err->status;
    }
    remove_strays(f->os, f->path); /* the writer now: what a killed one left */
    return open_state(f, path, fingerprint, 0, out, err);
}

rb_status rb_sessfile_open_fd(int fd, const char *name, const uint64_t *fingerprint,
                              const rb_sessfile_geom *g, const rb_os *os, rb_throttle *throttle,
                              rb_sessfile **out, rb_error *err)
{
    rb_sessfile *f = alloc_handle(name, g, os, throttle);
    if (!f)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* its own: the caller keeps fd */
    if (f->fd < 0) {
        int e = errno;
        rb_sessfile_close(f);
        return rb_error_set(err, e == EBADF ? RB_E_INVALID_ARG : RB_E_IO, "session file: %s: "
                            "%s", name, strerror(e));
    }
    return open_state(f, name, fingerprint, 1, out, err);
}

/* The rest of an open, f->fd open: the newest readable state. is_read_only:
 * a descriptor the caller gave (pages read through it, never written). */
static rb_status open_state(rb_sessfile *f, const char *path, const uint64_t *fingerprint,
                            int is_read_only, rb_sessfile **out, rb_error *err)
{
    uint64_t size = 0;
    if (f->os->fstat_size(f->fd, &size) != 0) {
        int e = errno;
        rb_sessfile_close(f);
        return rb_error_set(err, RB_E_IO, "session file: '%s': %s", path, strerror(e));
    }
    sf_super cand[2];
    int ok[2];
    const int newest = read_supers(f->os, f->fd, f->buf, cand, ok);
    if (newest < 0) {
        rb_sessfile_close(f);
        return rb_error_set(err, RB_E_FORMAT, "session file: '%s' is not a rebound session "
                            "file, or both of its superblocks are damaged (%" PRIu64 " bytes)",
                            path, size);
    }
    /* newest first; a damaged newest state falls back to the other */
    const int order[2] = {newest, 1 - newest};
    char why[2][256] = {"", ""};
    uint64_t claimed[2] = {0, 0};
    if (!ok[order[1]]) /* one superblock damaged: which state it held is unknown */
        snprintf(why[1], sizeof why[1], "superblock %d is damaged", order[1]);
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
        rb_status st = check_shape(f, s, err);
        int rc = st != RB_OK ? -2
                             : load_catalog(f, s, size, why[k], sizeof why[k], &claimed[k], err);
        if (rc == -2) {
            rb_sessfile_close(f);
            return err->status;
        }
        if (rc == 0) {
            f->sb = *s;
            if (f->sb.data_end > size) { /* cut short: appends at its end */
                uint64_t end = (size + SF_A - 1) / SF_A * SF_A;
                uint64_t data0 = 2ull * SF_A + 2 * s->cat_area;
                f->sb.data_end = end > data0 ? end : data0;
            }
            if (k == 1) { /* fell back: say what was lost */
                f->lost_tokens = claimed[0] > f->n_tokens && claimed[0] <= f->cap_tokens
                                     ? claimed[0] - f->n_tokens : 0;
                /* a note: cut to the buffer if the reason is long (the
                   return value checked: gcc warns of the cut otherwise) */
                if (snprintf(f->recovery, sizeof f->recovery, "the newest state (#%" PRIu64
                             ") is damaged: %s; opened the one before it (#%" PRIu64
                             ", %zu tokens)", cand[order[0]].seq, why[0], s->seq,
                             f->n_tokens) < 0)
                    f->recovery[0] = '\0';
            } else if (why[1][0]) {
                snprintf(f->recovery, sizeof f->recovery, "%s (the state opened, #%" PRIu64
                         ", is the newest readable one)", why[1], s->seq);
            }
            if (is_read_only)
                f->fd_direct = f->fd;
            else
                open_direct(f, f->path, O_RDWR);
            resolve_base(f, is_read_only);
            /* mapped pages are read from storage, not from a copy an
               earlier process left in the page cache */
            posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
            *out = f;
            return RB_OK;
        }
    }
    rb_sessfile_close(f);
    int k0 = ok[order[0]] ? 0 : 1;
    return rb_error_set(err, RB_E_FORMAT, "session file: '%s' (%" PRIu64 " bytes) has no "
                        "readable state: %s%s%s", path, size, why[k0][0] ? why[k0] : "damaged",
                        k0 == 0 && why[1][0] ? "; the older: " : "",
                        k0 == 0 && why[1][0] ? why[1] : "");
}

const char *rb_sessfile_recovery(const rb_sessfile *f, uint64_t *lost_tokens)
{
    if (lost_tokens)
        *lost_tokens = f->lost_tokens;
    return f->recovery[0] ? f->recovery : NULL;
}

void rb_sessfile_close(rb_sessfile *f)
{
    if (!f)
        return;
    if (f->fd_direct >= 0 && f->fd_direct != f->fd)
        f->os->close(f->fd_direct);
    if (f->fd >= 0)
        f->os->close(f->fd);
    if (f->replace_fd >= 0)
        f->os->close(f->replace_fd);
    if (f->tmp_path) /* never published: nothing at path changed */
        f->os->unlink(f->tmp_path);
    free(f->tmp_path);
    rb_sessfile_close(f->base);
    free(f->path);
    free(f->tokens);
    free(f->pages);
    free(f->blob);
    free(f->buf);
    if (f->has_lock)
        pthread_rwlock_destroy(&f->lock);
    free(f);
}

size_t rb_sessfile_n_tokens(const rb_sessfile *f) { return f->n_tokens; }
const int32_t *rb_sessfile_tokens(const rb_sessfile *f) { return f->tokens; }

const void *rb_sessfile_blob(const rb_sessfile *f, size_t *n)
{
    *n = f->blob_n;
    return f->blob;
}

static uint32_t page_tokens(const rb_sessfile *f, uint32_t layer, uint32_t page)
{
    if (layer >= f->g.n_layers || page >= f->g.pages_per_layer)
        return 0;
    const sf_entry *e = &f->pages[(size_t)layer * f->g.pages_per_layer + page];
    return e->off ? e->tokens : 0;
}

uint64_t rb_sessfile_page_hash(const rb_sessfile *f, uint32_t layer, uint32_t page)
{
    rb_sessfile *w = (rb_sessfile *)f; /* the lock is not the state */
    pthread_rwlock_rdlock(&w->lock);
    uint64_t h = page_tokens(f, layer, page)
                     ? f->pages[(size_t)layer * f->g.pages_per_layer + page].hash : 0;
    pthread_rwlock_unlock(&w->lock);
    return h;
}

uint32_t rb_sessfile_page_tokens(const rb_sessfile *f, uint32_t layer, uint32_t page)
{
    rb_sessfile *w = (rb_sessfile *)f; /* the lock is not the state */
    pthread_rwlock_rdlock(&w->lock);
    uint32_t n = page_tokens(f, layer, page);
    pthread_rwlock_unlock(&w->lock);
    return n;
}

/* rb_sessfile_read_page: the record in, through the throttle, then its
 * checksum. */
static rb_status get_page(rb_sessfile *f, uint32_t layer, uint32_t page, void *buf,
                          rb_error *err)
{
    if (!page_tokens(f, layer, page))
        return rb_error_set(err, RB_E_NOT_FOUND, "session file: layer %" PRIu32 " page %" PRIu32
                            " is not saved", layer, page);
    const sf_entry *e = &f->pages[(size_t)layer * f->g.pages_per_layer + page];
    const rb_sessfile *in = e->in_base ? f->base : f; /* the file holding the record */
    int64_t t0 = rb_throttle_now_ns();
    int en = 0;
    rb_status st = rb_os_read_full(f->os, in->fd_direct, buf, f->g.page_alloc, e->off, NULL,
                                   &en);
    if (st != RB_OK)
        return rb_error_set(err, st, "session file: '%s': reading layer %" PRIu32 " page %"
                            PRIu32 " at %" PRIu64 ": %s", in->path, layer, page, e->off,
                            st == RB_E_SHORT_READ ? "the file ends first" : strerror(en));
    if (f->throttle)
        rb_throttle_io_since(f->throttle, f->g.page_alloc, t0);
    if (!HASH_OK(rb_kvcodec_hash64(buf, f->g.page_bytes), e->hash))
        return rb_error_set(err, RB_E_FORMAT, "session file: '%s': layer %" PRIu32 " page %"
                            PRIu32 " fails its checksum", in->path, layer, page);
    return RB_OK;
}

/* One preadv of n pages whose records lie side by side in one file. */
static rb_status read_run(rb_sessfile *f, const sf_entry *e, void *const *bufs, uint32_t n,
                          uint32_t layer, uint32_t page0, rb_error *err)
{
    struct iovec iov[SF_MAX_RUN];
    for (uint32_t i = 0; i < n; i++)
        iov[i] = (struct iovec){bufs[i], f->g.page_alloc};
    const rb_sessfile *in = e[0].in_base ? f->base : f;
    const size_t want = (size_t)n * f->g.page_alloc;
    int64_t t0 = rb_throttle_now_ns();
    ssize_t got;
    do
        got = preadv(in->fd_direct, iov, (int)n, (off_t)e[0].off);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)want) /* a short or failed read: page by page says which */
        return rb_error_set(err, RB_E_IO, "session file: '%s': reading %" PRIu32 " pages of "
                            "layer %" PRIu32 " from page %" PRIu32 ": %s", in->path, n, layer,
                            page0, got < 0 ? strerror(errno) : "the file ends first");
    if (f->throttle)
        rb_throttle_io_since(f->throttle, want, t0);
    for (uint32_t i = 0; i < n; i++)
        if (!HASH_OK(rb_kvcodec_hash64(bufs[i], f->g.page_bytes), e[i].hash))
            return rb_error_set(err, RB_E_FORMAT, "session file: '%s': layer %" PRIu32 " page %"
                                PRIu32 " fails its checksum", in->path, layer, page0 + i);
    return RB_OK;
}

rb_status rb_sessfile_read_pages(rb_sessfile *f, uint32_t layer, uint32_t page0, uint32_t n,
                                 void *const *bufs, rb_error *err)
{
    if (n == 0 || n > SF_MAX_RUN || f->os != rb_os_default() || layer >= f->g.n_layers ||
        page0 >= f->g.pages_per_layer || n > f->g.pages_per_layer - page0)
        return RB_E_UNSUPPORTED;
    pthread_rwlock_rdlock(&f->lock);
    const sf_entry *e = &f->pages[(size_t)layer * f->g.pages_per_layer + page0];
    rb_status st = RB_OK;
    for (uint32_t i = 0; i < n && st == RB_OK; i++)
        if (!page_tokens(f, layer, page0 + i))
            st = RB_E_UNSUPPORTED;
    /* a request per run of records side by side in one file (a prefix
       file's pages, then the file's own) */
    for (uint32_t i = 0, j; i < n && st == RB_OK; i = j) {
        for (j = i + 1; j < n && e[j].in_base == e[i].in_base &&
                        e[j].off == e[j - 1].off + f->g.page_alloc; j++)
            ;
        st = read_run(f, e + i, bufs + i, j - i, layer, page0 + i, err);
    }
    pthread_rwlock_unlock(&f->lock);
    return st;
}

rb_status rb_sessfile_read_page(rb_sessfile *f, uint32_t layer, uint32_t page, void *buf,
                                rb_error *err)
{
    pthread_rwlock_rdlock(&f->lock);
    rb_status st = get_page(f, layer, page, buf, err);
    pthread_rwlock_unlock(&f->lock);
    return st;
}

void rb_sessfile_truncate(rb_sessfile *f, size_t n_tokens)
{
    for (uint32_t l = 0; l < f->g.n_layers; l++)
        for (uint32_t p = 0; p < f->g.pages_per_layer; p++) {
            sf_entry *e = &f->pages[(size_t)l * f->g.pages_per_layer + p];
            uint64_t first = (uint64_t)p * f->g.page_tokens;
            if (!e->off || first + e->tokens <= n_tokens)
                continue;
            if (first < n_tokens)
                /* the page the cut falls in keeps its record for the
                   positions before the cut (a record is a whole page under
                   its checksum; the positions after it are not read) */
                e->tokens = (uint32_t)(n_tokens - first);
            else
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

static int sync_data(int fd)
{
    rb_os_fault_point();
    return fdatasync(fd);
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

/* Writes the catalog of tokens, f->pages and blob into the area the
 * current superblock does not use, then the superblock (seq + 1) that
 * makes it the state; f->sb becomes it (the caller restores it on error). */
static rb_status write_state(rb_sessfile *f, const int32_t *tokens, size_t n_tokens,
                             const void *blob, size_t blob_n, int do_fsync, rb_error *err)
{
    const uint32_t old_active = f->sb.active;
    const uint64_t old_seq = f->sb.seq;
    rb_status st = RB_OK;
    if (old_seq == UINT64_MAX) /* a crafted file: seq + 1 would be 0, and lose to it */
        return rb_error_set(err, RB_E_FORMAT, "session file: '%s': its sequence number is %"
                            PRIu64 ", the last there is: it takes no more commits (save the "
                            "session to a new file)", f->path, old_seq);
    if (reserve_buf(f, 8 + 4ull * n_tokens + 24ull * n_entries(f) + 4 + blob_n + 8) != 0)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory for the catalog");
    {
        uint8_t *p = f->buf;
        put64(&p, n_tokens);
        if (n_tokens)
            memcpy(p, tokens, 4 * n_tokens);
        p += 4 * n_tokens;
        for (size_t i = 0; i < n_entries(f); i++) {
            /* a prefix file's record: its offset is found there again */
            put64(&p, f->pages[i].in_base ? 0 : f->pages[i].off);
            put64(&p, f->pages[i].hash);
            put32(&p, f->pages[i].tokens);
            put32(&p, f->pages[i].in_base);
        }
        put32(&p, (uint32_t)blob_n);
        if (blob_n)
            memcpy(p, blob, blob_n);
        p += blob_n;
        if (f->base) {
            memcpy(p, SF_BASE_MAGIC, 4);
            p += 4;
            put32(&p, f->base_tokens);
        }
        f->sb.cat_bytes = (uint64_t)(p - f->buf);
        f->sb.cat_hash = rb_kvcodec_hash64(f->buf, (size_t)f->sb.cat_bytes);
        f->sb.active = 1 - old_active;
        uint64_t area = 2ull * SF_A + (uint64_t)f->sb.active * f->sb.cat_area;
        st = write_all(f, f->fd, f->buf, (size_t)f->sb.cat_bytes, area, err, "the catalog");
    }
    if (st == RB_OK && do_fsync && sync_data(f->fd) != 0)
        st = rb_error_set(err, RB_E_IO, "session file: '%s': fdatasync: %s", f->path,
                          strerror(errno));

    /* 3. the superblock that makes it the state */
    if (st == RB_OK) {
        f->sb.seq = old_seq + 1;
        uint8_t *sbuf = f->buf;
        sb_encode(&f->sb, sbuf);
        st = write_all(f, f->fd, sbuf, SF_A, (f->sb.seq % 2) * SF_A, err, "the superblock");
        if (st == RB_OK && do_fsync && sync_data(f->fd) != 0)
            st = rb_error_set(err, RB_E_IO, "session file: '%s': fdatasync: %s", f->path,
                              strerror(errno));
    }
    return st;
}

/* RB_OK, or RB_E_IO when the file no longer holds the committed state
 * (another program cut it under the session): a commit on it would leave
 * a catalog pointing into a hole, so it is said instead. */
static rb_status check_not_cut(rb_sessfile *f, rb_error *err)
{
    if (f->sb.seq == 0)
        return RB_OK; /* nothing committed yet */
    uint64_t need = 2ull * SF_A + (uint64_t)f->sb.active * f->sb.cat_area + f->sb.cat_bytes;
    for (size_t i = 0; i < n_entries(f); i++)
        if (f->pages[i].off && !f->pages[i].in_base && f->pages[i].off + f->g.page_alloc > need)
            need = f->pages[i].off + f->g.page_alloc;
    uint64_t size = 0;
    if (f->os->fstat_size(f->fd, &size) != 0)
        return rb_error_set(err, RB_E_IO, "session file: '%s': %s", f->path, strerror(errno));
    if (size < need)
        return rb_error_set(err, RB_E_IO, "session file: '%s' was cut short under the running "
                            "session (%" PRIu64 " bytes, its saved state needs %" PRIu64 "); "
                            "nothing more is written to it", f->path, size, need);
    return RB_OK;
}

rb_status rb_sessfile_commit(rb_sessfile *f, const int32_t *tokens, size_t n_tokens,
                             const rb_sessfile_source *src, int with_tail, const void *blob,
                             size_t blob_n, int do_fsync, uint32_t *pages_written,
                             rb_error *err)
{
    return rb_sessfile_commit_shared(f, tokens, n_tokens, 0, src, with_tail, blob, blob_n,
                                     do_fsync, pages_written, err);
}

/* The prefix file's name for tokens [0, nb) of f's model and geometry, in
 * f's folder (malloc'd; NULL: out of memory): a key hashed from them. */
static char *prefix_name(const rb_sessfile *f, const int32_t *tokens, size_t nb)
{
    uint64_t id[9] = {f->sb.fingerprint, f->g.n_layers, f->g.n_kv_heads, f->g.head_dim_k,
                      f->g.head_dim_v, f->g.page_tokens, f->g.page_bytes, nb,
                      rb_kvcodec_hash64(tokens, 4 * nb)};
    const uint64_t key = rb_kvcodec_hash64(id, sizeof id);
    const char *slash = strrchr(f->path, '/');
    size_t dn = slash ? (size_t)(slash - f->path) + 1 : 0;
    size_t n = dn + sizeof SF_PREFIX_NAME + 40;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%.*s%s%016" PRIx64 "-%zu", (int)dn, f->path, SF_PREFIX_NAME, key, nb);
    return s;
}

/* A commit's first step when the caller says that the first nb tokens'
 * pages are shared with other sessions (rb_sessfile_commit_shared): points
 * f's entries of those pages at the records of the prefix file of these
 * tokens, found in f's folder or written there now, which path.base links
 * to. Only while f has no prefix file and has saved none of those pages
 * (a fork's first commit), and only for the pages whose checksum is the
 * prefix file's (an existing one is checked against the source's buffers:
 * the same tokens computed in another batch split may hold other bits).
 * 1: attached (f->base set); 0: nothing changed, the commit writes the
 * pages itself. Never an error: a failure here costs only the sharing. */
static int attach_base(rb_sessfile *f, const int32_t *tokens, size_t nb,
                       const rb_sessfile_source *src, int do_fsync)
{
    const uint32_t P = f->g.page_tokens, ppl = f->g.pages_per_layer;
    nb -= nb % P;
    const size_t np = nb / P;
    /* worth a file of its own: at least twice what a prefix file adds on
       storage (two superblocks and a catalog, 12-16 KiB: its catalog
       areas' room is a hole) */
    if (f->base || !src || !np || (uint64_t)np * f->g.n_layers * f->g.page_alloc < 8 * SF_A)
        return 0;
    for (uint32_t l = 0; l < f->g.n_layers; l++)
        for (size_t p = 0; p < np; p++)
            if (f->pages[(size_t)l * ppl + p].off)
                return 0;
    char *cpath = prefix_name(f, tokens, nb);
    char *bpath = with_suffix(f->path, SF_BASE_SUFFIX);
    rb_sessfile *b = NULL, *w = NULL; /* w: the one written here, its hashes ours */
    if (cpath && bpath && !(b = open_prefix(f, cpath, tokens, nb))) {
        /* none yet: written from this session's buffers; another writer
           that published one meanwhile wins (RB_E_BUSY), and that one is
           checked like any found */
        rb_sessfile_geom g = f->g;
        g.is_lock_wait = 0;
        rb_error e;
        if (rb_sessfile_create(cpath, f->sb.fingerprint, &g, f->os, f->throttle, &w, &e) ==
                RB_OK &&
            rb_sessfile_commit(w, tokens, nb, src, 0, NULL, 0, do_fsync, NULL, &e) != RB_OK) {
            rb_sessfile_close(w);
            w = NULL;
        }
        b = open_prefix(f, cpath, tokens, nb);
    }
    /* path.base: a hard link, so that the prefix file lives as long as a
       file names it (the link count is its reference count) */
    struct stat bs, cs;
    if (b && (unlink(bpath) == 0 || errno == ENOENT) && link(cpath, bpath) == 0 &&
        stat(bpath, &bs) == 0 && fstat(b->fd, &cs) == 0 && bs.st_ino == cs.st_ino &&
        bs.st_dev == cs.st_dev) {
        if (do_fsync)
            sync_dir(bpath);
    } else if (b) { /* the name was taken over meanwhile: not that file */
        unlink(bpath);
        rb_sessfile_close(b);
        b = NULL;
    }
    size_t n_set = 0;
    for (uint32_t l = 0; b && l < f->g.n_layers; l++)
        for (size_t p = 0; p < np; p++) {
            const size_t i = (size_t)l * ppl + p;
            const sf_entry *be = &b->pages[i];
            if (!be->off || be->tokens != P)
                continue;
            if (w) { /* written from this session's buffers: the same record? */
                if (w->pages[i].off != be->off || w->pages[i].hash != be->hash)
                    continue;
            } else { /* the bits must be this session's */
                const void *buf = src->get(src->ctx, l, (uint32_t)p);
                if (!buf)
                    continue;
                uint64_t h = rb_kvcodec_hash64(buf, f->g.page_bytes);
                src->put(src->ctx, l, (uint32_t)p);
                if (h != be->hash)
                    continue;
            }
            f->pages[i] = (sf_entry){be->off, be->hash, P, 1};
            n_set++;
        }
    if (b && !n_set) {
        unlink(bpath);
        rb_sessfile_close(b);
        b = NULL;
    }
    if (b) {
        pthread_rwlock_wrlock(&f->lock);
        f->base = b;
        f->base_tokens = (uint32_t)nb;
        pthread_rwlock_unlock(&f->lock);
    }
    rb_sessfile_close(w);
    free(cpath);
    free(bpath);
    return b != NULL;
}

rb_status rb_sessfile_commit_shared(rb_sessfile *f, const int32_t *tokens, size_t n_tokens,
                                    size_t n_shared, const rb_sessfile_source *src,
                                    int with_tail, const void *blob, size_t blob_n,
                                    int do_fsync, uint32_t *pages_written, rb_error *err)
{
    rb_status cut = check_not_cut(f, err);
    if (cut != RB_OK)
        return cut;
    if (n_tokens > f->cap_tokens || blob_n > f->g.max_blob)
        return rb_error_set(err, RB_E_INVALID_ARG, "session file: %zu tokens / %zu blob bytes "
                            "exceed its room (%" PRIu64 " / %" PRIu32 ")", n_tokens, blob_n,
                            f->cap_tokens, f->g.max_blob);
    if (reserve_blob(f, blob_n) != 0) /* here: nothing may fail after the state is written */
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory for the blob");
    /* keep the committed state to fall back on */
    sf_super old_sb = f->sb;
    sf_entry *old_pages = malloc(n_entries(f) * sizeof *old_pages + 1);
    if (!old_pages)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    memcpy(old_pages, f->pages, n_entries(f) * sizeof *old_pages);
    rb_status st = RB_OK;
    uint32_t written = 0;
    const uint32_t P = f->g.page_tokens;

    /* 0. the pages others share, in the prefix file of their tokens */
    const int attached =
        n_shared ? attach_base(f, tokens, n_shared < n_tokens ? n_shared : n_tokens, src,
                               do_fsync) : 0;

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
                f->pages[i].in_base = 0;
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
    if (st == RB_OK && do_fsync && sync_data(f->fd_direct) != 0)
        st = rb_error_set(err, RB_E_IO, "session file: '%s': fdatasync: %s", f->path,
                          strerror(errno));

    /* 2, 3. the catalog and the superblock that makes it the state */
    if (st == RB_OK)
        st = write_state(f, tokens, n_tokens, blob, blob_n, do_fsync, err);
    /* 4. a new file appears at its path with its first state after the
       empty one */
    if (st == RB_OK && f->publish_pending)
        st = publish(f, do_fsync, err);
    if (st != RB_OK) {
        f->sb = old_sb;
        /* only the entries this commit changed: a restore may be reading
           the others (rb_sessfile_read_page) */
        for (size_t i = 0; i < n_entries(f); i++)
            if (f->pages[i].off != old_pages[i].off ||
                f->pages[i].tokens != old_pages[i].tokens ||
                f->pages[i].in_base != old_pages[i].in_base)
                f->pages[i] = old_pages[i];
        if (attached) { /* no state names it */
            pthread_rwlock_wrlock(&f->lock);
            rb_sessfile_close(f->base);
            f->base = NULL;
            f->base_tokens = 0;
            pthread_rwlock_unlock(&f->lock);
        }
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

rb_status rb_sessfile_compact(rb_sessfile *f, int do_fsync, rb_error *err)
{
    const uint64_t data0 = 2ull * SF_A + 2 * f->sb.cat_area;
    uint64_t live = 0;
    for (size_t i = 0; i < n_entries(f); i++)
        live += f->pages[i].off && !f->pages[i].in_base ? f->g.page_alloc : 0;
    /* garbage up to the live bytes (at least a save's rewrite, a page per
       layer) is kept: a compaction then copies at most as much as was
       appended since, so the rewrites at most double what is written */
    uint64_t one_save = (uint64_t)f->g.n_layers * f->g.page_alloc;
    uint64_t keep = live + (live > one_save ? live : one_save);
    if (f->tmp_path || f->sb.data_end - data0 <= keep)
        return RB_OK;
    size_t tn = strlen(f->path) + 32;
    char *tmp = malloc(tn);
    sf_entry *pages = malloc(n_entries(f) * sizeof *pages + 1);
    uint8_t *page = rb_os_aligned_alloc(SF_A, f->g.page_alloc);
    int fd = -1;
    rb_status st = RB_OK;
    if (!tmp || !pages || !page) {
        st = rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
        goto out;
    }
    for (int k = 0; k < 100; k++) {
        snprintf(tmp, tn, "%s.new-%ld-%d", f->path, (long)getpid(), k);
        fd = f->os->open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            break;
    }
    if (fd < 0) {
        st = rb_error_set(err, RB_E_IO, "session file: cannot create '%s': %s", tmp,
                          strerror(errno));
        goto out;
    }
    if ((st = take_lock(fd, tmp, 0, err)) != RB_OK)
        goto out;
    /* 1. the live records, packed from the data start on */
    memcpy(pages, f->pages, n_entries(f) * sizeof *pages);
    uint64_t end = data0;
    for (size_t i = 0; i < n_entries(f) && st == RB_OK; i++) {
        if (!pages[i].off || pages[i].in_base) /* the prefix file's stay there */
            continue;
        int en = 0;
        rb_status rst = rb_os_read_full(f->os, f->fd, page, f->g.page_alloc, pages[i].off,
                                        NULL, &en);
        if (rst == RB_E_SHORT_READ) { /* cut short: the page is lost, not the file */
            memset(&pages[i], 0, sizeof pages[i]);
            continue;
        }
        if (rst != RB_OK) {
            st = rb_error_set(err, RB_E_IO, "session file: '%s': reading a page to compact: "
                              "%s", f->path, strerror(en));
            break;
        }
        if ((st = write_all(f, fd, page, f->g.page_alloc, end, err, "a compacted page")) !=
            RB_OK)
            break;
        pages[i].off = end;
        end += f->g.page_alloc;
    }
    if (st == RB_OK && do_fsync && sync_data(fd) != 0)
        st = rb_error_set(err, RB_E_IO, "session file: '%s': fdatasync: %s", tmp,
                          strerror(errno));
    /* 2. the committed state over them, in the new file */
    if (st == RB_OK) {
        pthread_rwlock_wrlock(&f->lock); /* until the descriptors are the new file's */
        sf_super old_sb = f->sb;
        sf_entry *old_pages = f->pages;
        int old_fd = f->fd;
        f->fd = fd;
        f->pages = pages;
        f->sb.data_end = end;
        /* both superblock slots, as a file that took commits has them: the
           state under its old number (seq - 1, catalog in the area the old
           file used), then under seq + 1 in the other area, the one the
           next commit keeps; with one slot blank the next open would report
           a damaged superblock on a healthy file. The first write needs no
           sync of its own: the second's syncs the whole file. */
        f->sb.seq = old_sb.seq - 1;
        f->sb.active = 1 - old_sb.active;
        st = write_state(f, f->tokens, f->n_tokens, f->blob, f->blob_n, 0, err);
        if (st == RB_OK)
            st = write_state(f, f->tokens, f->n_tokens, f->blob, f->blob_n, do_fsync, err);
        /* 3. renamed over the file */
        if (st == RB_OK)
            rb_os_fault_point(); /* a kill with both files whole */
        if (st == RB_OK && f->os->rename(tmp, f->path) != 0)
            st = rb_error_set(err, RB_E_IO, "session file: cannot rename '%s' to '%s': %s",
                              tmp, f->path, strerror(errno));
        if (st == RB_OK && do_fsync)
            sync_dir(f->path);
        if (st != RB_OK) {
            f->fd = old_fd;
            f->pages = old_pages;
            f->sb = old_sb;
            pthread_rwlock_unlock(&f->lock);
            goto out;
        }
        if (f->fd_direct >= 0 && f->fd_direct != old_fd)
            f->os->close(f->fd_direct);
        f->os->close(old_fd);
        fd = -1;
        pages = old_pages; /* freed below */
        open_direct(f, f->path, O_RDWR);
        f->n_compactions++;
        pthread_rwlock_unlock(&f->lock);
    }
out:
    if (fd >= 0) {
        f->os->close(fd);
        f->os->unlink(tmp);
    }
    free(tmp);
    free(pages);
    free(page);
    return st;
}

size_t rb_sessfile_base_pages(const rb_sessfile *f)
{
    size_t n = 0;
    for (size_t i = 0; i < n_entries(f); i++)
        n += f->pages[i].in_base && f->pages[i].off;
    return n;
}

/* In the folder of path: each prefix file no other name links to, and
 * each X.base whose X is gone while a prefix file of the folder is its
 * inode (never another program's file). Best effort. */
static void sweep_prefixes(const char *path)
{
    const char *slash = strrchr(path, '/');
    char dir[4096]; /* with its '/', so that names join to it */
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path + 1), path);
    else
        snprintf(dir, sizeof dir, "./");
    DIR *d = opendir(dir);
    if (!d)
        return;
    enum { MAX_PREFIX = 64 };
    ino_t inos[MAX_PREFIX];
    size_t n_ino = 0;
    struct dirent *de;
    char p[4400];
    /* 1. prefix files: the unlinked ones go, the others' inodes are kept */
    while ((de = readdir(d))) {
        struct stat s;
        if (strncmp(de->d_name, SF_PREFIX_NAME, sizeof SF_PREFIX_NAME - 1) != 0 ||
            strstr(de->d_name, ".new-")) /* one being written */
            continue;
        snprintf(p, sizeof p, "%s%s", dir, de->d_name);
        if (lstat(p, &s) != 0 || !S_ISREG(s.st_mode))
            continue;
        if (s.st_nlink == 1)
            unlink(p);
        else if (n_ino < MAX_PREFIX)
            inos[n_ino++] = s.st_ino;
    }
    /* 2. links whose file is gone */
    rewinddir(d);
    while (n_ino && (de = readdir(d))) {
        size_t len = strlen(de->d_name), sn = sizeof SF_BASE_SUFFIX - 1;
        struct stat s;
        if (len <= sn || strcmp(de->d_name + len - sn, SF_BASE_SUFFIX) != 0)
            continue;
        snprintf(p, sizeof p, "%s%.*s", dir, (int)(len - sn), de->d_name);
        if (access(p, F_OK) == 0 || errno != ENOENT)
            continue;
        snprintf(p, sizeof p, "%s%s", dir, de->d_name);
        if (lstat(p, &s) != 0 || !S_ISREG(s.st_mode))
            continue;
        for (size_t k = 0; k < n_ino; k++)
            if (inos[k] == s.st_ino) {
                unlink(p);
                break;
            }
    }
    closedir(d);
}

rb_status rb_sessfile_remove(const char *path, rb_error *err)
{
    char *bpath = with_suffix(path, SF_BASE_SUFFIX);
    if (!bpath)
        return rb_error_set(err, RB_E_NOMEM, "session file: out of memory");
    rb_status st = RB_OK;
    if (unlink(path) != 0 && errno != ENOENT)
        st = rb_error_set(err, RB_E_IO, "session file: cannot remove '%s': %s", path,
                          strerror(errno));
    else if (unlink(bpath) != 0 && errno != ENOENT)
        st = rb_error_set(err, RB_E_IO, "session file: cannot remove '%s': %s", bpath,
                          strerror(errno));
    if (st == RB_OK) /* and what a kill left there */
        sweep_prefixes(path);
    free(bpath);
    return st;
}
