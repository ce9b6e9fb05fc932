/*
 * fuzz_sessfile.c - libFuzzer target for session files (src/sessfile.c,
 * the open path of src/session_file.c, and `rebound chat`'s use of them).
 *
 * Each input (compact form: fuzz/sess_model.h) stands for a session file
 * of the small synthetic model and is opened:
 *   - through the file layer: rb_sessfile_open with the model's geometry
 *     and vocabulary; when it opens, every saved page is read, and a commit
 *     of one more token (every page in RAM written) is opened again and
 *     must hold what was committed;
 *     then a compaction, opened again, must hold the same tokens and pages;
 *     neither may write past the data end the open found plus every page;
 *   - or (control bits 1 and 2, and one input in 32 of those: see
 *     is_session) as a session, rb_session_open_saved, and when it opens,
 *     one token is fed and the stats read.
 * Built with REBOUND_FUZZ (-DREBOUND_FUZZ=ON), sessfile.c skips its
 * checksums, so mutated fields reach the checks behind them. A broken
 * invariant calls __builtin_trap().
 *
 * Speed. The file layer's bytes live in memory: its rb_os serves pread,
 * pwrite and the size from buffers (mf_*), so an input costs no file
 * write, truncate or page-cache work. What sessfile.c asks of the system
 * itself (the path's lstat and stat, the OFD lock, the directory scan for
 * strays, fadvise) still runs on real, empty files of the same names in a
 * private directory, so locking and naming are the real ones. O_DIRECT
 * descriptors are numbers of this table only (no kernel file), and their
 * transfers must be aligned as O_DIRECT requires. A session costs ~15
 * file-layer inputs (creating and joining its restore and commit threads,
 * the model's fingerprint, a feed; measured under ASan): one input in 32
 * of the session kind runs one, picked by a hash of the input, so that
 * mutants of a session input do not all run as sessions.
 *
 * Seeds: make_sesscorpus (fuzz/make_sesscorpus.c) writes real files (a run,
 * a chat, a rewound and recommitted one, a trimmed one, a spilled one) in
 * this form. Build and run: fuzz/README.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sess_model.h"
#include "sessfile.h"
#include "session_debug.h"

#define REQUIRE(cond)         \
    do {                      \
        if (!(cond))          \
            __builtin_trap(); \
    } while (0)

static rb_model *model;
static rb_sessfile_geom geom;
static char dir_path[200], model_path[256], file_path[256], sess_path[256];
static uint64_t data0; /* where the page records begin */

/* ---- the file layer's files, in memory ------------------------------------ */

/* A file's bytes: b[0, n) the file, b[n, cap) zero; dirty[i]: page i of
 * MF_PAGE bytes may hold nonzero bytes (what mf_reset clears). A file is
 * an inode: named (at file_path, or at the compaction's temporary name)
 * and open (real descriptors in fd_ino, O_DIRECT ones in direct_ino). */
/* the harness's own loops and table are no coverage points */
#define NOCOV __attribute__((no_sanitize("coverage")))
#define MF_PAGE 4096u
#define N_INODES 3
#define N_FDS 1024
#define N_DIRECT 8
#define FD_DIRECT0 (1 << 29) /* above any real descriptor */

typedef struct mfile {
    uint8_t *b, *dirty;
    uint64_t n;
    size_t cap;
    int names, fds;
} mfile;

static mfile inodes[N_INODES];
/* where a write of the library may end (0: anywhere): set for a commit */
static uint64_t write_bound;
static int main_ino = -1, tmp_ino = -1; /* the inodes at file_path, tmp_path */
static char tmp_path[300];
static signed char fd_ino[N_FDS], direct_ino[N_DIRECT];

NOCOV static void mf_reset(mfile *m)
{
    for (size_t i = 0; i < m->cap / MF_PAGE; i++)
        if (m->dirty[i]) {
            memset(m->b + i * MF_PAGE, 0, MF_PAGE);
            m->dirty[i] = 0;
        }
    m->n = 0;
}

/* Room for end bytes (the new ones zero). 0, or -1 (ENOSPC: beyond what
 * any file of this model may grow to, by far). */
NOCOV static int mf_reserve(mfile *m, uint64_t end)
{
    if (end > (128u << 20)) {
        errno = ENOSPC;
        return -1;
    }
    if (end > m->cap) {
        size_t cap = (end + (1u << 20)) / MF_PAGE * MF_PAGE;
        uint8_t *b = realloc(m->b, cap), *d = b ? realloc(m->dirty, cap / MF_PAGE) : NULL;
        if (!b || !d)
            abort();
        memset(b + m->cap, 0, cap - m->cap);
        memset(d + m->cap / MF_PAGE, 0, (cap - m->cap) / MF_PAGE);
        m->b = b;
        m->dirty = d;
        m->cap = cap;
    }
    return 0;
}

/* 0, or -1 (ENOSPC). */
NOCOV static int mf_write(mfile *m, const void *p, size_t len, uint64_t off)
{
    if (!len)
        return 0;
    if (len > (64u << 20) || mf_reserve(m, off + len) != 0)
        return -1;
    size_t end = (size_t)off + len;
    memcpy(m->b + off, p, len);
    memset(m->dirty + off / MF_PAGE, 1, (end - 1) / MF_PAGE - off / MF_PAGE + 1);
    if (end > m->n)
        m->n = end;
    return 0;
}

NOCOV static int ino_new(void)
{
    for (int i = 0; i < N_INODES; i++)
        if (!inodes[i].names && !inodes[i].fds) {
            mf_reset(&inodes[i]);
            inodes[i].names = 1;
            return i;
        }
    abort(); /* more files than a session file and its compaction's */
}

NOCOV static mfile *ino_of(int fd, int *direct)
{
    *direct = fd >= FD_DIRECT0 && fd < FD_DIRECT0 + N_DIRECT;
    int i = *direct ? direct_ino[fd - FD_DIRECT0] : fd >= 0 && fd < N_FDS ? fd_ino[fd] : -1;
    return i >= 0 ? &inodes[i] : NULL;
}

NOCOV static int mem_open(const char *path, int flags, int mode)
{
    int ino = !strcmp(path, file_path)                   ? main_ino
              : tmp_ino >= 0 && !strcmp(path, tmp_path) ? tmp_ino
                                                         : -1;
    int created = 0;
    if (flags & O_CREAT) { /* a compaction's new file */
        if (ino >= 0 || tmp_ino >= 0 || strlen(path) >= sizeof tmp_path) {
            errno = EEXIST;
            return -1;
        }
        snprintf(tmp_path, sizeof tmp_path, "%s", path);
        ino = tmp_ino = ino_new();
        created = 1;
    }
    if (ino < 0) { /* strays are never here: nothing else exists */
        errno = ENOENT;
        return -1;
    }
    if (flags & O_DIRECT) {
        for (int k = 0; k < N_DIRECT; k++)
            if (direct_ino[k] < 0) {
                direct_ino[k] = (signed char)ino;
                inodes[ino].fds++;
                return FD_DIRECT0 + k;
            }
        abort();
    }
    int fd = open(path, flags, mode); /* the real name: locks and stat */
    if (fd < 0 || fd >= N_FDS) {
        if (fd >= 0)
            close(fd);
        if (created) {
            inodes[ino].names = 0;
            tmp_ino = -1;
        }
        return -1;
    }
    fd_ino[fd] = (signed char)ino;
    inodes[ino].fds++;
    return fd;
}

NOCOV static int mem_close(int fd)
{
    int direct;
    mfile *m = ino_of(fd, &direct);
    if (!m) {
        errno = EBADF;
        return -1;
    }
    m->fds--;
    if (direct) {
        direct_ino[fd - FD_DIRECT0] = -1;
        return 0;
    }
    fd_ino[fd] = -1;
    return close(fd);
}

/* O_DIRECT: buffer, offset and length on the logical block (512 bytes) */
NOCOV static void check_direct(int direct, const void *buf, size_t n, off_t off)
{
    REQUIRE(!direct || ((uintptr_t)buf % 512 == 0 && n % 512 == 0 && off % 512 == 0));
}

NOCOV static ssize_t mem_pread(int fd, void *buf, size_t n, off_t off)
{
    int direct;
    mfile *m = ino_of(fd, &direct);
    if (!m || off < 0) {
        errno = m ? EINVAL : EBADF;
        return -1;
    }
    check_direct(direct, buf, n, off);
    if ((uint64_t)off >= m->n)
        return 0;
    size_t k = m->n - (uint64_t)off < n ? (size_t)(m->n - (uint64_t)off) : n;
    memcpy(buf, m->b + off, k);
    return (ssize_t)k;
}

NOCOV static ssize_t mem_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    int direct;
    mfile *m = ino_of(fd, &direct);
    if (!m || off < 0) {
        errno = m ? EINVAL : EBADF;
        return -1;
    }
    check_direct(direct, buf, n, off);
    REQUIRE(!write_bound || ((uint64_t)off <= write_bound && n <= write_bound - (uint64_t)off));
    return mf_write(m, buf, n, (uint64_t)off) == 0 ? (ssize_t)n : -1;
}

NOCOV static int mem_fstat_size(int fd, uint64_t *size)
{
    int direct;
    mfile *m = ino_of(fd, &direct);
    if (!m) {
        errno = EBADF;
        return -1;
    }
    *size = m->n;
    return 0;
}

static int mem_fsync(int fd) { (void)fd; return 0; }

NOCOV static void unname(int ino)
{
    if (ino >= 0)
        inodes[ino].names--;
}

NOCOV static int mem_rename(const char *from, const char *to)
{
    if (tmp_ino < 0 || strcmp(from, tmp_path) || strcmp(to, file_path)) {
        errno = ENOENT;
        return -1;
    }
    if (rename(from, to) != 0)
        return -1;
    unname(main_ino);
    main_ino = tmp_ino;
    tmp_ino = -1;
    return 0;
}

NOCOV static int mem_unlink(const char *path)
{
    if (tmp_ino < 0 || strcmp(path, tmp_path)) {
        errno = ENOENT;
        return -1;
    }
    unlink(path);
    unname(tmp_ino);
    tmp_ino = -1;
    return 0;
}

static void *mem_mmap_ro(int fd, size_t n) { (void)fd, (void)n; errno = ENODEV; return NULL; }
static int mem_munmap(void *p, size_t n) { (void)p, (void)n; return 0; }

static const rb_os mem_os = {
    .open = mem_open, .close = mem_close, .pread = mem_pread, .pwrite = mem_pwrite,
    .fstat_size = mem_fstat_size, .fsync = mem_fsync, .rename = mem_rename,
    .unlink = mem_unlink, .mmap_ro = mem_mmap_ro, .munmap = mem_munmap,
};

/* ---- setup ----------------------------------------------------------------- */

static void remove_files(void)
{
    unlink(file_path);
    unlink(sess_path);
    unlink(model_path);
    rmdir(dir_path); /* a spill file left by a crash keeps it: harmless */
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    /* in memory where there is a tmpfs (the session layer writes real
       files: a commit's O_DIRECT writes to a disk made it ~30 inputs/s);
       a directory of this process's own, so the stray scan of every open
       reads two names */
    const char *tmp = getenv("REBOUND_FUZZ_DIR")        ? getenv("REBOUND_FUZZ_DIR")
                      : access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                      : getenv("TMPDIR")              ? getenv("TMPDIR")
                                                      : "/tmp";
    snprintf(dir_path, sizeof dir_path, "%.150s/rebound-fuzz-XXXXXX", tmp);
    if (!mkdtemp(dir_path))
        abort();
    snprintf(model_path, sizeof model_path, "%s/model.gguf", dir_path);
    snprintf(file_path, sizeof file_path, "%s/file.rbs", dir_path);
    snprintf(sess_path, sizeof sess_path, "%s/session.rbs", dir_path);
    atexit(remove_files);
    model = fuzz_sess_model(model_path);
    if (!model)
        abort();
    int fd = open(file_path, O_RDWR | O_CREAT | O_TRUNC, 0600); /* its name, locks */
    if (fd < 0)
        abort();
    close(fd);
    memset(fd_ino, -1, sizeof fd_ino);
    memset(direct_ino, -1, sizeof direct_ino);
    main_ino = ino_new();
    /* the geometry a session of this model has */
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = fuzz_sess_params();
    if (rb_session_create(model, &p, &s, &err) != RB_OK)
        abort();
    geom.n_layers = rb_session_kvcache(s)->n_layers;
    geom.n_kv_heads = rb_session_kvcache(s)->n_kv_heads;
    geom.head_dim_k = rb_session_kvcache(s)->head_dim_k;
    geom.head_dim_v = rb_session_kvcache(s)->head_dim_v;
    geom.page_tokens = rb_session_kvcache(s)->page_tokens;
    geom.pages_per_layer = rb_session_kvcache(s)->pages_per_layer;
    geom.page_bytes = rb_session_kvcache(s)->page_bytes;
    geom.page_alloc = rb_kvcache_page_alloc_bytes(rb_session_kvcache(s));
    geom.max_blob = FUZZ_SESS_MAX_BLOB;
    geom.n_ctx = rb_session_kvcache(s)->n_ctx;
    geom.n_vocab = rb_session_n_vocab(s);
    rb_session_destroy(s);
    data0 = 2 * FUZZ_SESS_A + 2 * fuzz_sess_cat_area();
    return 0;
}

/* Lays the input out as the file it stands for, in the main inode. */
NOCOV static void inflate(const uint8_t *d, size_t n, int raw)
{
    mfile *m = &inodes[main_ino];
    mf_reset(m);
    if (raw) {
        if (mf_write(m, d, n, 0) != 0)
            abort();
        return;
    }
    const uint64_t area = fuzz_sess_cat_area();
    const uint64_t where[4] = {0, FUZZ_SESS_A, 2 * FUZZ_SESS_A, 2 * FUZZ_SESS_A + area};
    const uint64_t room[4] = {FUZZ_SESS_A, FUZZ_SESS_A, area, area};
    size_t at = 0;
    for (int i = 0; i < 4 && n - at >= 2; i++) {
        size_t k = (size_t)d[at] | (size_t)d[at + 1] << 8;
        at += 2;
        if (k > n - at)
            k = n - at;
        size_t w = k < room[i] ? k : (size_t)room[i];
        if (mf_write(m, d + at, w, where[i]) != 0)
            abort();
        at += k;
    }
    if (m->n < data0 && mf_reserve(m, data0) == 0)
        m->n = data0; /* the catalog areas' room: zeros */
    if (mf_write(m, d + at, n - at, data0) != 0)
        abort();
}

/* ---- the file layer -------------------------------------------------------- */

static void *slots[64], *page_buf;
static int32_t toks[FUZZ_SESS_CTX + 1];

static size_t n_slots(void) { return (size_t)geom.n_layers * geom.pages_per_layer; }

/* Opens the file again: it holds toks[0, n) and, for every page that
 * held[i] tokens before, that many again, with slots[i]'s bytes. */
static void check_reopen(size_t n, const uint32_t *held)
{
    rb_sessfile *f = NULL;
    rb_error err;
    REQUIRE(rb_sessfile_open(file_path, NULL, &geom, &mem_os, NULL, &f, &err) == RB_OK);
    REQUIRE(rb_sessfile_n_tokens(f) == n);
    REQUIRE(memcmp(rb_sessfile_tokens(f), toks, n * sizeof *toks) == 0);
    for (size_t i = 0; i < n_slots(); i++) {
        uint32_t l = (uint32_t)(i / geom.pages_per_layer), p = (uint32_t)(i % geom.pages_per_layer);
        REQUIRE(rb_sessfile_page_tokens(f, l, p) == held[i]);
        if (held[i] && rb_sessfile_read_page(f, l, p, page_buf, &err) == RB_OK)
            REQUIRE(memcmp(page_buf, slots[i], geom.page_bytes) == 0);
    }
    rb_sessfile_close(f);
}

static void file_layer(void)
{
    rb_sessfile *f = NULL;
    rb_error err;
    if (rb_sessfile_open(file_path, NULL, &geom, &mem_os, NULL, &f, &err) != RB_OK)
        return;
    const uint64_t size0 = inodes[main_ino].n;
    size_t n = rb_sessfile_n_tokens(f);
    const int32_t *t = rb_sessfile_tokens(f);
    REQUIRE(n <= geom.n_ctx);
    for (size_t i = 0; i < n; i++)
        REQUIRE(t[i] >= 0 && (uint32_t)t[i] < geom.n_vocab);
    size_t bn;
    rb_sessfile_blob(f, &bn);
    REQUIRE(bn <= geom.max_blob);
    uint32_t held[64] = {0};
    for (size_t i = 0; i < n_slots(); i++) {
        memset(slots[i], (int)i, geom.page_alloc);
        uint32_t l = (uint32_t)(i / geom.pages_per_layer), p = (uint32_t)(i % geom.pages_per_layer);
        uint32_t k = rb_sessfile_page_tokens(f, l, p);
        REQUIRE(k <= geom.page_tokens);
        if (k)
            (void)rb_sessfile_read_page(f, l, p, slots[i], &err);
    }
    if (n >= geom.n_ctx) {
        rb_sessfile_close(f);
        return;
    }
    /* one more token, every page written: the file must hold it after */
    memcpy(toks, t, n * sizeof *toks);
    toks[n] = 1;
    rb_sessfile_slot_table tab = {slots, geom.pages_per_layer};
    rb_sessfile_source src = rb_sessfile_slots(&tab);
    /* a commit appends at most every page, from the data end the open
       found (at most the file's end); it writes nowhere beyond */
    uint64_t end0 = (size0 + FUZZ_SESS_A - 1) / FUZZ_SESS_A * FUZZ_SESS_A;
    write_bound = (end0 > data0 ? end0 : data0) + n_slots() * geom.page_alloc;
    rb_status st = rb_sessfile_commit(f, toks, n + 1, &src, 1, "fz", 2, 0, NULL, &err);
    for (size_t i = 0; i < n_slots(); i++)
        held[i] = rb_sessfile_page_tokens(f, (uint32_t)(i / geom.pages_per_layer),
                                          (uint32_t)(i % geom.pages_per_layer));
    /* a compaction (when there is garbage) keeps the state and the pages,
       within the same bound; the reopen checks the file as it then is */
    if (st == RB_OK)
        (void)rb_sessfile_compact(f, 0, &err);
    write_bound = 0;
    rb_sessfile_close(f);
    if (st == RB_OK)
        check_reopen(n + 1, held);
}

/* ---- the session layer ----------------------------------------------------- */

/* The main inode's bytes written to sess_path. 0, or -1 (I/O). */
NOCOV static int write_session_file(void)
{
    const mfile *m = &inodes[main_ino];
    int fd = open(sess_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -1;
    int rc = ftruncate(fd, (off_t)m->n);
    for (size_t i = 0; rc == 0 && i < m->cap / MF_PAGE && i * MF_PAGE < m->n; i++) {
        size_t k = m->n - i * MF_PAGE < MF_PAGE ? (size_t)(m->n - i * MF_PAGE) : MF_PAGE;
        if (m->dirty[i] && pwrite(fd, m->b + i * MF_PAGE, k, (off_t)(i * MF_PAGE)) != (ssize_t)k)
            rc = -1;
    }
    close(fd);
    return rc;
}

static void session_layer(void)
{
    if (write_session_file() != 0)
        return;
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = fuzz_sess_params();
    p.spill_dir = dir_path; /* its spill file in memory too: $TMPDIR was a disk */
    if (rb_session_open_saved(model, &p, sess_path, &s, &err) != RB_OK)
        return;
    REQUIRE(rb_session_n_tokens(s) <= rb_session_n_ctx(s));
    /* positions without saved K/V are recomputed by the feed, each over
       all before it: up to 512 of them made a session input cost ~100 file
       inputs (three quarters of the fuzzer's time in attention, no file
       byte in it). A rewind first keeps that to 8 (its own path too). */
    size_t valid = rb_session_debug_kv_valid(s) < rb_session_n_tokens(s) ? rb_session_debug_kv_valid(s)
                                                          : rb_session_n_tokens(s);
    if (rb_session_n_tokens(s) > valid + 8)
        REQUIRE(rb_session_rewind(s, valid + 8) == RB_OK);
    int32_t t = 2;
    size_t n = rb_session_n_tokens(s);
    /* a full disk or a damaged page is not this input's fault: only a
       token that does not fit may be refused */
    rb_status st_feed = rb_session_feed(s, &t, 1, NULL);
    if (st_feed == RB_OK)
        REQUIRE(rb_session_n_tokens(s) == n + 1);
    rb_session_stats st;
    (void)rb_session_get_stats(s, &st);
    rb_session_destroy(s);
}

/* Whether an input of the session kind runs as a session: its gate (a
 * hash of the bytes after the control byte) must equal the control byte's
 * bits 3-7 (make_sesscorpus sets them so for its seeds), so that one
 * mutant in 32 of a session input runs as one, the rest as file inputs. */
static int is_session(const uint8_t *data, size_t size)
{
    if ((data[0] & 6) != 6)
        return 0;
    return fuzz_sess_gate(data + 1, size - 1) == data[0] >> 3;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (!slots[0]) {
        REQUIRE(n_slots() <= sizeof slots / sizeof *slots);
        for (size_t i = 0; i < n_slots(); i++)
            if (!(slots[i] = aligned_alloc(4096, geom.page_alloc)))
                abort();
        if (!(page_buf = aligned_alloc(4096, geom.page_alloc)))
            abort();
    }
    inflate(data + 1, size - 1, data[0] & 1);
    if (is_session(data, size))
        session_layer();
    else
        file_layer();
    /* every descriptor closed, the temporary file of a compaction gone */
    for (int i = 0; i < N_INODES; i++)
        REQUIRE(inodes[i].fds == 0);
    REQUIRE(tmp_ino < 0 && inodes[main_ino].names == 1);
    return 0;
}
