/*
 * test_store.c - the spill file: round trips (aligned and unaligned buffers
 * and lengths, many ids, replace, drop and slot reuse), checksums, faults
 * injected through the rb_os table (ENOSPC on the Nth pwrite, EIO, bit
 * flips, a short file, EINTR, O_DIRECT refused, unlink refused), two
 * threads at once, and the throttle. Prints the io mode the store gets in
 * /tmp, in the build dir and in /dev/shm.
 *
 * Every fault case checks that the store stays consistent: the segments
 * written before the fault still read back, and no descriptor leaks.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "store.h"

#ifndef REBOUND_TEST_TMP
#define REBOUND_TEST_TMP "."
#endif

#define KIB 1024u
#define MIB (1024u * 1024u)

/* ---- the fault table ------------------------------------------------------ */

/* The table has no context pointer, so the knobs live here; only the
 * single-threaded tests use it. */
static struct fault_state {
    int pwrite_fail_at;      /* the Nth pwrite fails with ENOSPC (1-based; 0 never) */
    int n_pwrite;
    int pread_fail_at;       /* the Nth pread fails with EIO */
    int pread_flip_at;       /* the Nth pread returns its bytes with bit 0 of byte 17 flipped */
    int n_pread;
    uint64_t shrink_at;      /* pread sees the file end here */
    int is_eintr;            /* every pread/pwrite fails with EINTR once first */
    int is_eintr_pending;
    int is_direct_refused;   /* open with O_DIRECT fails with EINVAL */
    int is_unlink_fail;
    int n_open, n_close, n_unlink;
    int last_fd;
    char last_path[4096];
} fault;

static void fault_reset(void)
{
    memset(&fault, 0, sizeof fault);
    fault.shrink_at = UINT64_MAX;
    fault.last_fd = -1;
}

static int f_open(const char *path, int flags, int mode)
{
    if (fault.is_direct_refused && (flags & O_DIRECT)) {
        errno = EINVAL;
        return -1;
    }
    int fd = rb_os_default()->open(path, flags, mode);
    if (fd >= 0) {
        fault.n_open++;
        fault.last_fd = fd;
        snprintf(fault.last_path, sizeof fault.last_path, "%s", path);
    }
    return fd;
}

static int f_close(int fd)
{
    fault.n_close++;
    return rb_os_default()->close(fd);
}

static int eintr_once(void)
{
    if (!fault.is_eintr)
        return 0;
    fault.is_eintr_pending = !fault.is_eintr_pending;
    if (fault.is_eintr_pending)
        errno = EINTR;
    return fault.is_eintr_pending;
}

static ssize_t f_pread(int fd, void *buf, size_t n, off_t off)
{
    if (eintr_once())
        return -1;
    fault.n_pread++;
    if (fault.n_pread == fault.pread_fail_at) {
        errno = EIO;
        return -1;
    }
    if ((uint64_t)off >= fault.shrink_at)
        return 0;
    if ((uint64_t)off + n > fault.shrink_at)
        n = (size_t)(fault.shrink_at - (uint64_t)off);
    ssize_t r = rb_os_default()->pread(fd, buf, n, off);
    if (r > 17 && fault.n_pread == fault.pread_flip_at)
        ((unsigned char *)buf)[17] ^= 1;
    return r;
}

static ssize_t f_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (eintr_once())
        return -1;
    if (++fault.n_pwrite == fault.pwrite_fail_at) {
        errno = ENOSPC;
        return -1;
    }
    return rb_os_default()->pwrite(fd, buf, n, off);
}

static int f_unlink(const char *path)
{
    fault.n_unlink++;
    if (fault.is_unlink_fail) {
        errno = EPERM;
        return -1;
    }
    return rb_os_default()->unlink(path);
}

static rb_os fault_os;

static void fault_os_init(void)
{
    fault_os = *rb_os_default();
    fault_os.open = f_open;
    fault_os.close = f_close;
    fault_os.pread = f_pread;
    fault_os.pwrite = f_pwrite;
    fault_os.unlink = f_unlink;
}

/* ---- helpers -------------------------------------------------------------- */

/* Bytes that differ per id and position (xorshift64). */
static void fill(void *p, size_t n, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b[i] = (unsigned char)x;
    }
}

static int matches(const void *p, size_t n, uint64_t seed)
{
    unsigned char *want = malloc(n ? n : 1);
    fill(want, n, seed);
    int ok = memcmp(p, want, n) == 0;
    free(want);
    return ok;
}

/* A 4096-aligned buffer of n bytes (+ misalign, so that p + misalign is
 * what the store sees). */
static unsigned char *abuf(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, n + 4096) != 0)
        abort();
    return p;
}

static rb_store *open_store(const char *dir, const rb_os *os, double bw, double lat)
{
    rb_store_params p = rb_store_default_params();
    p.dir = dir;
    p.os = os;
    p.bw_bytes_per_s = bw;
    p.latency_s = lat;
    rb_store *s = NULL;
    rb_error err = {0};
    rb_status st = rb_store_open(&p, &s, &err);
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK) {
        fprintf(stderr, "open: %s\n", err.message);
        exit(1);
    }
    return s;
}

/* Puts [seed-filled bytes of len at buf + misalign] as id. */
static rb_status put_pattern(rb_store *s, uint64_t id, size_t len, size_t misalign,
                             uint64_t seed, rb_error *err)
{
    unsigned char *b = abuf(len + misalign);
    fill(b + misalign, len, seed);
    rb_status st = rb_store_put(s, id, b + misalign, len, err);
    free(b);
    return st;
}

/* Gets id into a buffer at misalign and checks its bytes. */
static rb_status get_check(rb_store *s, uint64_t id, size_t len, size_t misalign,
                           uint64_t seed, rb_error *err)
{
    unsigned char *b = abuf(len + misalign);
    memset(b, 0xee, len + misalign);
    rb_status st = rb_store_get(s, id, b + misalign, len, err);
    if (st == RB_OK && !matches(b + misalign, len, seed)) {
        fprintf(stderr, "segment 0x%" PRIx64 " (len %zu, misalign %zu): wrong bytes\n", id,
                len, misalign);
        st = RB_E_FORMAT;
    }
    free(b);
    return st;
}

/* Spill files of this process left in dir (there must be none). */
static int count_leftovers(const char *dir)
{
    char prefix[64];
    snprintf(prefix, sizeof prefix, "rebound-spill-%ld-", (long)getpid());
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* ---- tests ---------------------------------------------------------------- */

/* Pages of the file at fd that sit in the page cache (mincore on a
 * mapping of it), or -1 when that cannot be measured. */
static long resident_pages(int fd, size_t n)
{
    void *p = rb_os_default()->mmap_ro(fd, n);
    if (!p)
        return -1;
    long page = sysconf(_SC_PAGESIZE), count = 0;
    size_t n_pages = (n + (size_t)page - 1) / (size_t)page;
    unsigned char *vec = malloc(n_pages);
    if (mincore(p, n, vec) != 0)
        count = -1;
    for (size_t i = 0; count >= 0 && i < n_pages; i++)
        count += vec[i] & 1;
    free(vec);
    rb_os_default()->munmap(p, n);
    return count;
}

/* The point of the bypass: after a put and after a get, none of the
 * segment's pages stay in the page cache, in both modes, so that the next
 * get reads the device and the spill really frees memory. */
static void test_no_page_cache(const char *dir, int is_no_direct)
{
    fault_reset();
    rb_store_params p = rb_store_default_params();
    p.dir = dir;
    p.os = &fault_os;
    p.is_no_direct = is_no_direct;
    rb_store *s = NULL;
    CHECK_EQ_INT(rb_store_open(&p, &s, NULL), RB_OK);
    if (!s)
        return;
    rb_error err = {0};
    CHECK_EQ_INT(put_pattern(s, 1, 1 * MIB, 0, 1, &err), RB_OK);
    CHECK_EQ_INT(put_pattern(s, 2, 100000, 1, 2, &err), RB_OK);
    long after_put = resident_pages(fault.last_fd, 2 * MIB);
    CHECK_EQ_INT(get_check(s, 1, 1 * MIB, 0, 1, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 2, 100000, 1, 2, &err), RB_OK);
    long after_get = resident_pages(fault.last_fd, 2 * MIB);
    fprintf(stderr, "  %s: resident pages of 1.1 MiB spilled: %ld after put, %ld after get\n",
            rb_store_io_mode(s), after_put, after_get);
    if (after_put >= 0) {
        CHECK_EQ_INT(after_put, 0);
        CHECK_EQ_INT(after_get, 0);
    }
    rb_store_close(s);
}

static void test_modes(void)
{
    const char *dirs[] = {"/tmp", REBOUND_TEST_TMP, "/dev/shm"};
    for (int i = 0; i < 3; i++) {
        struct stat st;
        if (stat(dirs[i], &st) != 0)
            continue;
        rb_store *s = open_store(dirs[i], NULL, 0, 0);
        fprintf(stderr, "  io mode in %s: %s (align %zu)\n", dirs[i], rb_store_io_mode(s),
                rb_store_align(s));
        CHECK(strlen(rb_store_io_mode(s)) > 0);
        CHECK_EQ_INT(count_leftovers(dirs[i]), 0); /* unlinked at open */
        rb_error err = {0};
        CHECK_EQ_INT(put_pattern(s, 1, 10000, 0, 1, &err), RB_OK);
        CHECK_EQ_INT(get_check(s, 1, 10000, 3, 1, &err), RB_OK);
        rb_store_close(s);
    }

    /* NULL params: $TMPDIR, else /tmp */
    rb_store *s = NULL;
    CHECK_EQ_INT(rb_store_open(NULL, &s, NULL), RB_OK);
    if (s) {
        fprintf(stderr, "  io mode by default: %s\n", rb_store_io_mode(s));
        rb_store_close(s);
    }

    /* buffered on request */
    rb_store_params p = rb_store_default_params();
    p.dir = REBOUND_TEST_TMP;
    p.is_no_direct = 1;
    CHECK_EQ_INT(rb_store_open(&p, &s, NULL), RB_OK);
    CHECK_CONTAINS(rb_store_io_mode(s), "buffered + fadvise(DONTNEED) (O_DIRECT not tried");
    CHECK_EQ_INT(rb_store_is_direct(s), 0);
    rb_error err = {0};
    CHECK_EQ_INT(put_pattern(s, 7, 5000, 1, 7, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 7, 5000, 0, 7, &err), RB_OK);
    rb_store_close(s);
}

/* Every mix of aligned/unaligned buffer and length, in and out, including
 * empty, one byte, and more than the 1 MiB bounce buffer. */
static void test_round_trips(const char *dir, const rb_os *os)
{
    rb_store *s = open_store(dir, os, 0, 0);
    static const size_t lens[] = {0, 1, 4095, 4096, 4097, 3 * 4096 + 100, 256 * KIB,
                                  MIB, MIB + 1, 3 * MIB + 7};
    static const size_t mis[] = {0, 1, 8, 512};
    const size_t n_lens = sizeof lens / sizeof lens[0], n_mis = sizeof mis / sizeof mis[0];
    rb_error err = {0};
    uint64_t id = 0x100;
    for (size_t i = 0; i < n_lens; i++)
        for (size_t j = 0; j < n_mis; j++, id++) {
            rb_status st = put_pattern(s, id, lens[i], mis[j], id, &err);
            CHECK_EQ_INT(st, RB_OK);
            if (st != RB_OK)
                fprintf(stderr, "  put: %s\n", err.message);
        }
    id = 0x100;
    for (size_t i = 0; i < n_lens; i++)
        for (size_t j = 0; j < n_mis; j++, id++) {
            /* read into a differently aligned buffer than it was written from */
            rb_status st = get_check(s, id, lens[i], mis[(j + 1) % n_mis], id, &err);
            CHECK_EQ_INT(st, RB_OK);
            if (st != RB_OK)
                fprintf(stderr, "  get: %s\n", err.message);
            size_t len = 99;
            CHECK_EQ_INT(rb_store_len(s, id, &len), RB_OK);
            CHECK_EQ_U64(len, lens[i]);
        }
    rb_store_stats st;
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_segments, n_lens * n_mis);
    CHECK_EQ_U64(st.n_puts, n_lens * n_mis);
    CHECK_EQ_U64(st.n_gets, n_lens * n_mis);
    if (rb_store_is_direct(s)) {
        /* the copy-free path: aligned buffer and whole-unit length put
         * and got with no bounce. */
        rb_store_stats before = st;
        CHECK_EQ_INT(put_pattern(s, 0x1, 256 * KIB, 0, 1, &err), RB_OK);
        CHECK_EQ_INT(get_check(s, 0x1, 256 * KIB, 0, 1, &err), RB_OK);
        rb_store_get_stats(s, &st);
        CHECK_EQ_U64(st.n_bounced, before.n_bounced);
        CHECK_EQ_INT(get_check(s, 0x1, 256 * KIB, 1, 1, &err), RB_OK);
        rb_store_get_stats(s, &st);
        CHECK_EQ_U64(st.n_bounced, before.n_bounced + 1);
    }
    rb_store_close(s);
}

/* 2000 ids of varied sizes, got back in a shuffled order. */
static void test_many_ids(const char *dir)
{
    rb_store *s = open_store(dir, NULL, 0, 0);
    enum { N = 2000 };
    rb_error err = {0};
    uint64_t held = 0;
    int failures = 0;
    for (uint64_t i = 0; i < N; i++) {
        uint64_t id = i << 32 | (i * 7); /* layer << 32 | page, the likely key shape */
        size_t len = (size_t)(i % 5 == 0 ? 8192 : 100 + (i * 37) % 9000);
        failures += put_pattern(s, id, len, i % 3, id, &err) != RB_OK;
        held += len;
    }
    CHECK_EQ_INT(failures, 0);
    for (uint64_t k = 0; k < N; k++) {
        uint64_t i = (k * 769) % N; /* 769 is prime to 2000: a permutation */
        uint64_t id = i << 32 | (i * 7);
        size_t len = (size_t)(i % 5 == 0 ? 8192 : 100 + (i * 37) % 9000);
        failures += get_check(s, id, len, (i + 1) % 3, id, &err) != RB_OK;
        failures += !rb_store_has(s, id);
    }
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(rb_store_has(s, 12345), 0);
    rb_store_stats st;
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_segments, N);
    CHECK_EQ_U64(st.held_bytes, held);

    /* drop every other one; the rest stay readable (backward-shift
     * deletion kept every probe chain intact) */
    for (uint64_t i = 0; i < N; i += 2)
        rb_store_drop(s, i << 32 | (i * 7));
    rb_store_drop(s, 0xdeadbeef); /* unknown: ignored */
    for (uint64_t i = 0; i < N; i++) {
        uint64_t id = i << 32 | (i * 7);
        size_t len = (size_t)(i % 5 == 0 ? 8192 : 100 + (i * 37) % 9000);
        if (i % 2 == 0) {
            failures += rb_store_has(s, id);
            failures += get_check(s, id, len, 0, id, &err) != RB_E_NOT_FOUND;
        } else {
            failures += get_check(s, id, len, 0, id, &err) != RB_OK;
        }
    }
    CHECK_EQ_INT(failures, 0);
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_segments, N / 2);
    rb_store_close(s);
}

static void test_replace(const char *dir)
{
    rb_store *s = open_store(dir, NULL, 0, 0);
    rb_error err = {0};
    CHECK_EQ_INT(put_pattern(s, 42, 64 * KIB, 0, 1, &err), RB_OK);
    CHECK_EQ_INT(put_pattern(s, 42, 10000, 5, 2, &err), RB_OK); /* other size, unaligned */
    CHECK_EQ_INT(get_check(s, 42, 10000, 0, 2, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 42, 64 * KIB, 0, 1, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "segment 0x000000000000002a: holds 10000 bytes, asked for 65536");
    CHECK_EQ_INT(put_pattern(s, 42, 64 * KIB, 0, 3, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 42, 64 * KIB, 0, 3, &err), RB_OK);
    rb_store_stats st;
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_segments, 1);
    CHECK_EQ_U64(st.held_bytes, 64 * KIB);
    CHECK_EQ_U64(st.slot_bytes, 64 * KIB);
    rb_store_close(s);
}

/* The KV pattern: 64 pages of one size held, trims drop half, restores
 * and new pages put half back, 100 rounds. Freed slots are reused, so the
 * file stays at the peak of what is held (plus the one slot that a replace
 * needs while old and new copies coexist). */
static void test_slot_reuse(const char *dir)
{
    fault_reset();
    rb_store *s = open_store(dir, &fault_os, 0, 0);
    enum { N = 64, PAGE = 64 * KIB };
    rb_error err = {0};
    int failures = 0;
    uint64_t next_id = 0;
    uint64_t live[N];
    for (int i = 0; i < N; i++) {
        live[i] = next_id++;
        failures += put_pattern(s, live[i], PAGE, 0, live[i], &err) != RB_OK;
    }
    for (int round = 0; round < 100; round++) {
        for (int i = round % 2; i < N; i += 2) {
            rb_store_drop(s, live[i]);
            live[i] = next_id++;
        }
        for (int i = round % 2; i < N; i += 2)
            failures += put_pattern(s, live[i], PAGE, 0, live[i], &err) != RB_OK;
        /* and a replace of a held one */
        failures += put_pattern(s, live[(round + 1) % 2], PAGE, 0, live[(round + 1) % 2],
                                &err) != RB_OK;
    }
    for (int i = 0; i < N; i++)
        failures += get_check(s, live[i], PAGE, 0, live[i], &err) != RB_OK;
    CHECK_EQ_INT(failures, 0);
    rb_store_stats st;
    rb_store_get_stats(s, &st);
    fprintf(stderr, "  slot reuse: %" PRIu64 " puts of 64 KiB, file %" PRIu64
            " KiB, held %" PRIu64 " KiB, free %" PRIu64 " KiB\n",
            st.n_puts, st.file_bytes / KIB, st.held_bytes / KIB, st.free_bytes / KIB);
    CHECK_EQ_U64(st.n_puts, N + 100 * (N / 2 + 1));
    CHECK(st.file_bytes <= (uint64_t)(N + 1) * PAGE);
    CHECK_EQ_U64(st.held_bytes, (uint64_t)N * PAGE);
    uint64_t real_size = 0;
    CHECK_EQ_INT(rb_os_default()->fstat_size(fault.last_fd, &real_size), 0);
    CHECK(real_size <= (uint64_t)(N + 1) * PAGE);
    /* a different size class does not take these slots but does not break
     * them either */
    CHECK_EQ_INT(put_pattern(s, 0xabc, 3 * PAGE, 0, 0xabc, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 0xabc, 3 * PAGE, 0, 0xabc, &err), RB_OK);
    rb_store_close(s);
    CHECK_EQ_INT(fault.n_open, fault.n_close);
}

/* A bit flipped on the way in (the device returned bad bytes) and a byte
 * changed in the file itself: both fail the checksum, naming the segment. */
static void test_checksum(const char *dir)
{
    fault_reset();
    rb_store *s = open_store(dir, &fault_os, 0, 0);
    rb_error err = {0};
    CHECK_EQ_INT(put_pattern(s, 0x51, 20000, 0, 0x51, &err), RB_OK); /* offset 0 */
    CHECK_EQ_INT(put_pattern(s, 0x52, 8192, 0, 0x52, &err), RB_OK);
    fault.pread_flip_at = fault.n_pread + 1;
    CHECK_EQ_INT(get_check(s, 0x51, 20000, 0, 0x51, &err), RB_E_FORMAT);
    CHECK_CONTAINS(err.message, "store: segment 0x0000000000000051: checksum mismatch (stored 0x");
    CHECK_CONTAINS(err.message, ", read 0x");
    fprintf(stderr, "  %s\n", err.message);
    /* the flip was in flight only: the next read is good */
    CHECK_EQ_INT(get_check(s, 0x51, 20000, 1, 0x51, &err), RB_OK);

    /* corrupt the file through a second descriptor (it is unlinked: reach
     * it through /proc); a buffered write then an O_DIRECT read is
     * coherent: the kernel writes the dirty range back before the read. */
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fault.last_fd);
    int fd2 = open(proc, O_RDWR);
    if (fd2 < 0) {
        fprintf(stderr, "  (no /proc: file corruption case skipped)\n");
    } else {
        unsigned char c;
        CHECK_EQ_INT(pread(fd2, &c, 1, 12345), 1);
        c ^= 0x80;
        CHECK_EQ_INT(pwrite(fd2, &c, 1, 12345), 1);
        CHECK_EQ_INT(fdatasync(fd2), 0);
        close(fd2);
        CHECK_EQ_INT(get_check(s, 0x51, 20000, 0, 0x51, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "segment 0x0000000000000051: checksum mismatch");
        CHECK_EQ_INT(get_check(s, 0x52, 8192, 0, 0x52, &err), RB_OK); /* its neighbour */
        /* a good copy replaces the bad one */
        CHECK_EQ_INT(put_pattern(s, 0x51, 20000, 0, 0x51, &err), RB_OK);
        CHECK_EQ_INT(get_check(s, 0x51, 20000, 0, 0x51, &err), RB_OK);
    }
    rb_store_stats st;
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_checksum_errors, fd2 < 0 ? 1 : 2);
    rb_store_close(s);
    CHECK_EQ_INT(fault.n_open, fault.n_close);
}

/* A full disk on the Nth pwrite: RB_E_IO naming the segment; an absent id
 * stays absent, a replaced id keeps its earlier copy, others are intact. */
static void test_enospc(const char *dir)
{
    fault_reset();
    rb_store *s = open_store(dir, &fault_os, 0, 0);
    rb_error err = {0};
    CHECK_EQ_INT(put_pattern(s, 0xa1, 64 * KIB, 0, 0xa1, &err), RB_OK);
    CHECK_EQ_INT(put_pattern(s, 0xa2, 5000, 3, 0xa2, &err), RB_OK);

    fault.pwrite_fail_at = fault.n_pwrite + 1;
    CHECK_EQ_INT(put_pattern(s, 0xc3, 64 * KIB, 0, 0xc3, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "store: segment 0x00000000000000c3: write of");
    CHECK_CONTAINS(err.message, "No space left on device");
    fprintf(stderr, "  %s\n", err.message);
    CHECK_EQ_INT(rb_store_has(s, 0xc3), 0);
    CHECK_EQ_INT(get_check(s, 0xc3, 64 * KIB, 0, 0xc3, &err), RB_E_NOT_FOUND);

    /* a replace that fails keeps the earlier copy */
    fault.pwrite_fail_at = fault.n_pwrite + 1;
    CHECK_EQ_INT(put_pattern(s, 0xa1, 64 * KIB, 0, 0xbad, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "segment 0x00000000000000a1");
    CHECK_EQ_INT(get_check(s, 0xa1, 64 * KIB, 0, 0xa1, &err), RB_OK);

    /* a bounced put (3 MiB, unaligned: 3 chunks) failing on its 2nd chunk */
    fault.pwrite_fail_at = fault.n_pwrite + 2;
    CHECK_EQ_INT(put_pattern(s, 0xa2, 3 * MIB, 1, 0xbad, &err), RB_E_IO);
    CHECK_EQ_INT(get_check(s, 0xa2, 5000, 0, 0xa2, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 0xa1, 64 * KIB, 0, 0xa1, &err), RB_OK);

    rb_store_stats st;
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_segments, 2);
    CHECK_EQ_U64(st.n_io_errors, 3);
    CHECK_EQ_U64(st.held_bytes, 64 * KIB + 5000);
    /* the failed slots went back: once the disk has room, the same puts
     * succeed without growing the file past what they need */
    uint64_t file_before = st.file_bytes;
    CHECK_EQ_INT(put_pattern(s, 0xc3, 64 * KIB, 0, 0xc3, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 0xc3, 64 * KIB, 0, 0xc3, &err), RB_OK);
    rb_store_get_stats(s, &st);
    CHECK(st.file_bytes <= file_before + 64 * KIB);
    rb_store_close(s);
    CHECK_EQ_INT(fault.n_open, fault.n_close);
}

/* EIO on read, a file that ends inside a segment, EINTR everywhere, an
 * unknown id. */
static void test_read_faults(const char *dir)
{
    fault_reset();
    rb_store *s = open_store(dir, &fault_os, 0, 0);
    rb_error err = {0};
    CHECK_EQ_INT(put_pattern(s, 0xe1, 16 * KIB, 0, 0xe1, &err), RB_OK); /* offset 0 */
    CHECK_EQ_INT(put_pattern(s, 0xe2, 4096, 0, 0xe2, &err), RB_OK);

    fault.pread_fail_at = fault.n_pread + 1;
    CHECK_EQ_INT(get_check(s, 0xe1, 16 * KIB, 0, 0xe1, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "store: segment 0x00000000000000e1: read of 16384 bytes at offset 0");
    CHECK_CONTAINS(err.message, "Input/output error");
    fprintf(stderr, "  %s\n", err.message);
    CHECK_EQ_INT(get_check(s, 0xe1, 16 * KIB, 0, 0xe1, &err), RB_OK);

    /* the bounced path fails the same way */
    fault.pread_fail_at = fault.n_pread + 1;
    CHECK_EQ_INT(get_check(s, 0xe1, 16 * KIB, 1, 0xe1, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "Input/output error");

    fault.shrink_at = 8192;
    CHECK_EQ_INT(get_check(s, 0xe1, 16 * KIB, 0, 0xe1, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "store: segment 0x00000000000000e1: spill file");
    CHECK_CONTAINS(err.message, "ends at offset 8192");
    fprintf(stderr, "  %s\n", err.message);
    CHECK_EQ_INT(get_check(s, 0xe2, 4096, 0, 0xe2, &err), RB_E_IO); /* wholly past the end */
    fault.shrink_at = UINT64_MAX;

    fault.is_eintr = 1;
    CHECK_EQ_INT(put_pattern(s, 0xe3, 100000, 1, 0xe3, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 0xe3, 100000, 0, 0xe3, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 0xe1, 16 * KIB, 0, 0xe1, &err), RB_OK);
    fault.is_eintr = 0;

    CHECK_EQ_INT(get_check(s, 0x404, 10, 0, 0x404, &err), RB_E_NOT_FOUND);
    CHECK_CONTAINS(err.message, "store: segment 0x0000000000000404: not in the spill file");
    size_t len = 7;
    CHECK_EQ_INT(rb_store_len(s, 0x404, &len), RB_E_NOT_FOUND);
    CHECK_EQ_U64(len, 7);
    CHECK_EQ_INT(rb_store_put(s, 0x405, NULL, 10, &err), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_store_get(s, 0xe2, NULL, 4096, &err), RB_E_INVALID_ARG);

    rb_store_stats st;
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_io_errors, 4);
    rb_store_close(s);
    CHECK_EQ_INT(fault.n_open, fault.n_close);
}

/* O_DIRECT refused at open (as on a file system without it): buffered +
 * fadvise, said so, everything still works. Also open failures. */
static void test_open_faults(const char *dir)
{
    fault_reset();
    fault.is_direct_refused = 1;
    rb_store *s = open_store(dir, &fault_os, 0, 0);
    fprintf(stderr, "  io mode with O_DIRECT refused: %s\n", rb_store_io_mode(s));
    CHECK_CONTAINS(rb_store_io_mode(s), "buffered + fadvise(DONTNEED) (O_DIRECT refused by ");
    CHECK_CONTAINS(rb_store_io_mode(s), ": Invalid argument)");
    CHECK_EQ_INT(rb_store_is_direct(s), 0);
    CHECK_EQ_U64(rb_store_align(s), 1);
    rb_store_close(s);
    test_round_trips(dir, &fault_os);
    CHECK_EQ_INT(fault.n_open, fault.n_close);
    CHECK_EQ_INT(count_leftovers(dir), 0);

    /* a directory that does not exist */
    fault_reset();
    rb_store_params p = rb_store_default_params();
    p.dir = "/nonexistent/rebound-test";
    p.os = &fault_os;
    rb_error err = {0};
    s = (rb_store *)&err; /* unchanged on failure */
    CHECK_EQ_INT(rb_store_open(&p, &s, &err), RB_E_IO);
    CHECK(s == (rb_store *)&err);
    CHECK_CONTAINS(err.message, "store: cannot create spill file '/nonexistent/rebound-test/rebound-spill-");
    CHECK_CONTAINS(err.message, "No such file or directory");
    fprintf(stderr, "  %s\n", err.message);

    /* unlink refused: an error, no descriptor leaked; the file that
     * remains is named */
    fault_reset();
    fault.is_unlink_fail = 1;
    p.dir = dir;
    CHECK_EQ_INT(rb_store_open(&p, &s, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "cannot unlink spill file");
    CHECK_CONTAINS(err.message, fault.last_path);
    CHECK_EQ_INT(fault.n_open, fault.n_close);
    CHECK_EQ_INT(unlink(fault.last_path), 0);

    /* bad throttle parameters */
    p.os = NULL;
    p.bw_bytes_per_s = -1;
    CHECK_EQ_INT(rb_store_open(&p, &s, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "throttle: bandwidth -1");
    CHECK_EQ_INT(count_leftovers(dir), 0);
}

/* Puts and gets are charged to the throttle: 4 MiB out and back at
 * 100 MiB/s take at least ~80 ms; a shared throttle sees both stores'
 * bytes. */
static void test_throttled(const char *dir)
{
    rb_store *s = open_store(dir, NULL, 100.0 * MIB, 0.0005);
    rb_error err = {0};
    double t0 = (double)rb_throttle_now_ns() * 1e-9;
    CHECK_EQ_INT(put_pattern(s, 1, 2 * MIB, 0, 1, &err), RB_OK);
    CHECK_EQ_INT(put_pattern(s, 2, 2 * MIB, 0, 2, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 1, 2 * MIB, 0, 1, &err), RB_OK);
    CHECK_EQ_INT(get_check(s, 2, 2 * MIB, 0, 2, &err), RB_OK);
    double dt = (double)rb_throttle_now_ns() * 1e-9 - t0;
    fprintf(stderr, "  8 MiB through a 100 MiB/s + 0.5 ms store: %.1f ms (model 82 ms)\n",
            dt * 1e3);
    CHECK(dt >= 0.080);
    rb_store_stats st;
    rb_store_get_stats(s, &st);
    /* no more delay than the model asks: bounded by what the throttle slept,
       not by the wall clock, which a sanitizer on a busy host stretches (a
       TSan run here took 468 ms for the 82 the model asks) */
    CHECK(st.throttle.sleep_s < 0.2);
    CHECK_EQ_U64(st.throttle.n_bytes, 8 * MIB);
    CHECK_EQ_U64(st.throttle.n_ios, 4);
    CHECK(st.throttle.sleep_s > 0.0);
    CHECK(st.io_s >= 0.080);
    rb_store_close(s);

    rb_throttle dev;
    CHECK_EQ_INT(rb_throttle_init(&dev, 0.0, 0.0, NULL), RB_OK);
    rb_store_params p = rb_store_default_params();
    p.dir = dir;
    p.throttle = &dev;
    rb_store *a = NULL, *b = NULL;
    CHECK_EQ_INT(rb_store_open(&p, &a, NULL), RB_OK);
    CHECK_EQ_INT(rb_store_open(&p, &b, NULL), RB_OK);
    CHECK_EQ_INT(put_pattern(a, 1, 4096, 0, 1, &err), RB_OK);
    CHECK_EQ_INT(put_pattern(b, 1, 8192, 0, 1, &err), RB_OK);
    rb_throttle_stats ts;
    rb_throttle_get_stats(&dev, &ts);
    CHECK_EQ_U64(ts.n_bytes, 12288);
    rb_store_close(a);
    rb_store_close(b);
    rb_throttle_deinit(&dev);
}

/* Two threads at once (an I/O worker restoring while the main thread
 * trims): each its own ids, sizes that hit both the direct and the bounce
 * paths, drops that free slots the other thread may reuse. */
typedef struct conc_arg {
    rb_store *s;
    uint64_t base;
    int failures;
} conc_arg;

static void *conc_worker(void *p)
{
    conc_arg *a = p;
    rb_error err = {0};
    for (uint64_t i = 0; i < 300; i++) {
        uint64_t id = a->base + i;
        size_t len = i % 3 == 0 ? 32 * KIB : 1000 + (size_t)(i * 131) % 40000;
        size_t mis = i % 4 == 0 ? 1 : 0;
        if (put_pattern(a->s, id, len, mis, id, &err) != RB_OK) {
            fprintf(stderr, "  put 0x%" PRIx64 ": %s\n", id, err.message);
            a->failures++;
        }
        if (get_check(a->s, id, len, (mis + 1) % 2, id, &err) != RB_OK) {
            fprintf(stderr, "  get 0x%" PRIx64 ": %s\n", id, err.message);
            a->failures++;
        }
        if (i % 2 == 1)
            rb_store_drop(a->s, id - 1);
        a->failures += !rb_store_has(a->s, id);
    }
    return NULL;
}

static void test_concurrent(const char *dir)
{
    rb_store *s = open_store(dir, NULL, 0, 0);
    conc_arg args[2] = {{s, 1ull << 40, 0}, {s, 2ull << 40, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(pthread_create(&th[i], NULL, conc_worker, &args[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_EQ_INT(args[0].failures, 0);
    CHECK_EQ_INT(args[1].failures, 0);
    rb_store_stats st;
    rb_store_get_stats(s, &st);
    CHECK_EQ_U64(st.n_segments, 300);
    CHECK_EQ_U64(st.n_puts, 600);
    CHECK_EQ_U64(st.n_gets, 600);
    rb_error err = {0};
    int failures = 0;
    for (int t = 0; t < 2; t++)
        for (uint64_t i = 1; i < 300; i += 2) {
            uint64_t id = args[t].base + i;
            size_t len = i % 3 == 0 ? 32 * KIB : 1000 + (size_t)(i * 131) % 40000;
            failures += get_check(s, id, len, 0, id, &err) != RB_OK;
        }
    CHECK_EQ_INT(failures, 0);
    rb_store_close(s);
}

int main(void)
{
    fault_os_init();
    const char *dir = REBOUND_TEST_TMP;
    test_modes();
    test_no_page_cache(dir, 0);
    test_no_page_cache(dir, 1);
    test_round_trips(dir, NULL);
    test_round_trips("/tmp", NULL);
    test_many_ids(dir);
    test_replace(dir);
    test_slot_reuse(dir);
    test_checksum(dir);
    test_enospc(dir);
    test_read_faults(dir);
    test_open_faults(dir);
    test_throttled(dir);
    test_concurrent(dir);
    CHECK_EQ_INT(count_leftovers(dir), 0);
    CHECK_EQ_INT(count_leftovers("/tmp"), 0);
    return check_report();
}
