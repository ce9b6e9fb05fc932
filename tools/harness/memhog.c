/*
 * memhog.c - the competing memory hog process (contract in memhog.h).
 *
 * Does: fork a child that sets its oom_score_adj to 1000 and, once
 * released by the parent, maps `bytes` of anonymous memory and writes every
 * byte of it step by step, publishing its progress, then sleeps holding it
 * (optionally it first fills an unlinked file, for reclaimable page cache,
 * and loops over that file at the end); kill, reap and report it. Does not: exec anything, touch files besides
 * /proc/self/oom_score_adj and that one, free memory early, survive the thread
 * that started it (PR_SET_PDEATHSIG fires when that thread ends: start hogs
 * from a thread that outlives them, e.g. the main thread).
 *
 * Start handshake (why a gate: the child must be in the cgroup before its
 * first page is charged, and the parent can only attach it once it exists):
 *
 *   parent                               child
 *   mmap shared page, socketpair
 *   fork ------------------------------> prctl(PDEATHSIG), oom_score_adj=1000
 *                                        read(gate) blocks
 *   attach pid to the cgroup
 *   [is_paused: return; later release:]
 *   send 1 byte, close -----------------> read returns 1 (0: parent gave up,
 *                                          _exit(0) without allocating)
 *                                        close other fds
 *                                        [write + fdatasync the file]
 *                                        mmap; per 1 MiB: memset, publish
 *                                        per step: nanosleep(step_ms)
 *                                        state = HOLDING; pause() forever
 *                                        (or, is_file_loop: read the mapped
 *                                        file page by page, pass after pass)
 *
 * The gate is a socketpair, not a pipe, so that the parent's send can use
 * MSG_NOSIGNAL: a child killed before reading must not SIGPIPE the parent.
 *
 * Child rules: after fork only async-signal-safe calls (read, write, open,
 * close, dup2, fdatasync, nanosleep, pause, _exit, getppid) plus prctl,
 * close_range, mmap and memset,
 * which take no user-space locks; no malloc, no stdio, no errno-to-text.
 * That is what makes fork from a multi-threaded parent (the pressure
 * monitor's thread, the engine's workers) safe.
 *
 * Invariants: h->shared is mapped for the handle's whole life; h->gate_fd
 * is open exactly while the hog is paused (started, not yet released nor
 * stopped); once
 * h->is_reaped is set, h->wait_status and h->death_ns are final; once
 * h->is_stopped is set, rb_memhog_stop refuses.
 *
 * Memory: the handle (heap) and one shared 4 KiB page (mmap, MAP_SHARED,
 * inherited by the child). The hog's own memory (anonymous pages, and the
 * file's page cache) lives in the child only and goes when it dies.
 */
#include "memhog.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "status.h"

/* The shared page's counters are read across processes: they must be
 * lock-free atomics (an address-based lock would not be shared). */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "int atomics must be lock-free");

#define HOG_CHUNK_BYTES (1u << 20)  /* progress granularity */
#define HOG_PAGE_BYTES 4096u

enum { HOG_WAITING = 0, HOG_GROWING = 1, HOG_HOLDING = 2 };

typedef struct hog_shared {
    atomic_ullong touched_bytes;  /* written by the child only */
    atomic_int state;             /* HOG_*; written by the child only */
    atomic_ullong file_passes;    /* written by the child only */
} hog_shared;

struct rb_memhog {
    rb_memhog_params params;
    pid_t pid;
    hog_shared *shared;      /* MAP_SHARED page */
    int gate_fd;             /* parent's end of the gate until the go */
    uint64_t start_ns;       /* CLOCK_MONOTONIC at the go */
    uint64_t death_ns;       /* when first seen dead, or when we killed it */
    int wait_status;         /* from waitpid, valid when is_reaped && has_status */
    int is_reaped, has_status, is_killed_by_us, is_stopped;
};

static uint64_t hog_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void hog_sleep_ms(uint32_t ms)
{
    struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ---- the child ------------------------------------------------------- */

/* The file's contents: pages of the program image, so that writing the
 * file charges nothing but the file's own page cache to the hog. */
static const unsigned char hog_file_block[64 * 1024] = { 1 };

/* Runs in the forked child; never returns. Exit codes: 0 released without
 * a go (parent gave up), 1 parent gone, 2 mmap failed, 3 oom_score_adj,
 * 4 the file, 5 the file's mmap. */

static void hog_child(const rb_memhog_params *p, hog_shared *sh, int gate, int file_fd,
                      pid_t parent)
{
    /* Die with the parent: a hog must never outlive the experiment. The
     * getppid check closes the race of a parent that died before prctl. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    /* First thing, so that even a paused hog is the OOM killer's choice. */
    if (!p->is_keep_oom_score) {
        int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, "1000", 4) != 4) _exit(3);
        close(fd);
    }
    char c;
    ssize_t r;
    do {
        r = read(gate, &c, 1);
    } while (r < 0 && errno == EINTR);
    if (r != 1) _exit(0);
    close(gate);
    if (file_fd >= 0 && file_fd != 3) {
        if (dup2(file_fd, 3) < 0) _exit(4);
        file_fd = 3;
    }
#ifdef SYS_close_range
    /* Keep 0-2 and the file, drop inherited descriptors (PSI trigger fds,
     * eventfds, the parent's files): a trigger lives as long as any copy of
     * its fd. */
    syscall(SYS_close_range, file_fd >= 0 ? 4u : 3u, ~0u, 0u);
#endif
    if (file_fd >= 0) {
        for (uint64_t done = 0; done < p->file_bytes;) {
            uint64_t len = p->file_bytes - done < sizeof hog_file_block
                               ? p->file_bytes - done : sizeof hog_file_block;
            ssize_t w = write(file_fd, hog_file_block, (size_t)len);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) _exit(4);
            done += (uint64_t)w;
        }
        /* clean pages are reclaimed by dropping them; dirty ones would
         * first need writeback, which memcg v1 reclaim barely does */
        if (fdatasync(file_fd) != 0) _exit(4);
    }
    uint64_t total = (p->bytes + HOG_PAGE_BYTES - 1) / HOG_PAGE_BYTES * HOG_PAGE_BYTES;
    uint64_t step = p->step_bytes ? (p->step_bytes + HOG_PAGE_BYTES - 1) / HOG_PAGE_BYTES *
                                        HOG_PAGE_BYTES
                                  : total;
    /* NORESERVE: the point is to be charged page by page as we touch, not
     * refused up front by the overcommit heuristic. */
    unsigned char *base = mmap(NULL, (size_t)total, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) _exit(2);
    atomic_store_explicit(&sh->state, HOG_GROWING, memory_order_release);
    for (uint64_t off = 0; off < total;) {
        uint64_t step_end = off + step < total ? off + step : total;
        while (off < step_end) {
            uint64_t len = step_end - off < HOG_CHUNK_BYTES ? step_end - off : HOG_CHUNK_BYTES;
            /* a non-zero byte per chunk: every page becomes a real private
             * page (a read would map the shared zero page, charging nothing) */
            memset(base + off, (int)((off >> 20) | 1) & 0xff, (size_t)len);
            off += len;
            atomic_store_explicit(&sh->touched_bytes, off, memory_order_release);
        }
        if (p->step_ms && off < total) hog_sleep_ms(p->step_ms);
    }
    atomic_store_explicit(&sh->state, HOG_HOLDING, memory_order_release);
    if (p->is_file_loop && file_fd >= 0 && p->file_bytes) {
        /* Mapped, not read(): a mapped page that is referenced again gets
         * activated, so when it is evicted and faulted back it counts as a
         * workingset refault, i.e. thrashing, i.e. PSI memory stall (a
         * pread loop reads each page once per pass and never stalls:
         * measured, 0 us of PSI for a 256 MiB file under a 32 MiB limit). */
        const volatile unsigned char *map = mmap(NULL, (size_t)p->file_bytes, PROT_READ,
                                                 MAP_SHARED, file_fd, 0);
        if (map == MAP_FAILED) _exit(5);
        for (;;) {
            /* a volatile read is a side effect: the compiler keeps each one */
            for (uint64_t off = 0; off < p->file_bytes; off += HOG_PAGE_BYTES) (void)map[off];
            atomic_fetch_add_explicit(&sh->file_passes, 1, memory_order_release);
        }
    }
    for (;;) pause();
}

/* ---- the parent -------------------------------------------------------- */

/* Non-blocking (block = 0) or blocking reap; records status and time. */
static void hog_reap(rb_memhog *h, int block)
{
    if (h->is_reaped) return;
    int status = 0;
    pid_t r;
    do {
        r = waitpid(h->pid, &status, block ? 0 : WNOHANG);
    } while (r < 0 && errno == EINTR);
    if (r == 0) return;  /* alive */
    h->is_reaped = 1;
    if (!h->death_ns) h->death_ns = hog_now_ns();
    if (r == h->pid) {
        h->wait_status = status;
        h->has_status = 1;
    }
}

/* An unlinked file for the hog's page cache: O_TMPFILE where the file
 * system has it, else mkstemp + unlink. */
static rb_status hog_open_file(const char *dir, int *fd_out, rb_error *err)
{
    if (!dir || !dir[0]) dir = getenv("TMPDIR");
    if (!dir || !dir[0]) dir = "/tmp";
    int fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        char tmpl[4096];
        int n = snprintf(tmpl, sizeof tmpl, "%s/rebound-memhog-XXXXXX", dir);
        if (n < 0 || (size_t)n >= sizeof tmpl)
            return rb_error_set(err, RB_E_INVALID_ARG, "memhog: file_dir too long");
        fd = mkostemp(tmpl, O_CLOEXEC);
        if (fd < 0)
            return rb_error_set(err, RB_E_IO, "memhog: temporary file in %s: %s", dir,
                                strerror(errno));
        unlink(tmpl);
    }
    *fd_out = fd;
    return RB_OK;
}

/* Lets the child allocate. A send that fails means the child died before
 * the go (killed from outside); wait/stop report it like any other death. */
static void hog_go(rb_memhog *h)
{
    h->start_ns = hog_now_ns();
    ssize_t w;
    do {
        w = send(h->gate_fd, "g", 1, MSG_NOSIGNAL);
    } while (w < 0 && errno == EINTR);
    close(h->gate_fd);
    h->gate_fd = -1;
}

rb_status rb_memhog_start(const rb_memhog_params *p, rb_memhog **out, rb_error *err)
{
    if (!p || !out) return rb_error_set(err, RB_E_INVALID_ARG, "memhog: params or out is NULL");
    if (p->bytes == 0) return rb_error_set(err, RB_E_INVALID_ARG, "memhog: bytes is 0");
    if (p->is_file_loop && !p->file_bytes)
        return rb_error_set(err, RB_E_INVALID_ARG, "memhog: is_file_loop without file_bytes");
    if (p->bytes > (uint64_t)SIZE_MAX / 2)
        return rb_error_set(err, RB_E_INVALID_ARG, "memhog: bytes %llu too large",
                            (unsigned long long)p->bytes);
    rb_memhog *h = calloc(1, sizeof *h);
    if (!h) return rb_error_set(err, RB_E_NOMEM, "memhog: out of memory");
    h->params = *p;
    h->shared = mmap(NULL, HOG_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    if (h->shared == MAP_FAILED) {
        int e = errno;
        free(h);
        return rb_error_set(err, RB_E_IO, "memhog: mmap of the shared page: %s", strerror(e));
    }
    atomic_init(&h->shared->touched_bytes, 0);
    atomic_init(&h->shared->state, HOG_WAITING);
    atomic_init(&h->shared->file_passes, 0);
    int gate[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, gate) != 0) {
        int e = errno;
        munmap(h->shared, HOG_PAGE_BYTES);
        free(h);
        return rb_error_set(err, RB_E_IO, "memhog: socketpair: %s", strerror(e));
    }
    int file_fd = -1;
    if (p->file_bytes) {
        rb_status st = hog_open_file(p->file_dir, &file_fd, err);
        if (st != RB_OK) {
            close(gate[0]);
            close(gate[1]);
            munmap(h->shared, HOG_PAGE_BYTES);
            free(h);
            return st;
        }
    }
    pid_t parent = getpid();
    h->start_ns = hog_now_ns();  /* until the go */
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(gate[0]);
        close(gate[1]);
        if (file_fd >= 0) close(file_fd);
        munmap(h->shared, HOG_PAGE_BYTES);
        free(h);
        return rb_error_set(err, RB_E_IO, "memhog: fork: %s", strerror(e));
    }
    if (pid == 0) {
        close(gate[1]);
        hog_child(&h->params, h->shared, gate[0], file_fd, parent);
    }
    close(gate[0]);
    if (file_fd >= 0) close(file_fd);  /* the child's copy keeps the file */
    h->pid = pid;
    if (p->cgroup) {
        rb_status st = rb_cgroup_attach(p->cgroup, pid, err);
        if (st != RB_OK) {
            close(gate[1]);  /* the child reads 0 and leaves without allocating */
            kill(pid, SIGKILL);
            hog_reap(h, 1);
            munmap(h->shared, HOG_PAGE_BYTES);
            free(h);
            return st;
        }
    }
    h->gate_fd = gate[1];
    if (!p->is_paused) hog_go(h);
    *out = h;
    return RB_OK;
}

rb_status rb_memhog_release(rb_memhog *h, rb_error *err)
{
    if (!h) return rb_error_set(err, RB_E_INVALID_ARG, "memhog: release of NULL");
    if (h->gate_fd < 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "memhog: pid %ld already released",
                            (long)h->pid);
    hog_go(h);
    return RB_OK;
}

uint64_t rb_memhog_bytes(const rb_memhog *h)
{
    return h ? atomic_load_explicit(&h->shared->touched_bytes, memory_order_acquire) : 0;
}

uint64_t rb_memhog_file_passes(const rb_memhog *h)
{
    return h ? atomic_load_explicit(&h->shared->file_passes, memory_order_acquire) : 0;
}

pid_t rb_memhog_pid(const rb_memhog *h) { return h ? h->pid : 0; }

rb_memhog_state rb_memhog_wait(rb_memhog *h, uint32_t timeout_ms)
{
    if (!h) return RB_MEMHOG_EXITED;
    uint64_t deadline = hog_now_ns() + (uint64_t)timeout_ms * 1000000u;
    for (;;) {
        hog_reap(h, 0);
        if (h->is_reaped) return RB_MEMHOG_EXITED;
        if (h->gate_fd >= 0) return RB_MEMHOG_PAUSED;
        if (atomic_load_explicit(&h->shared->state, memory_order_acquire) == HOG_HOLDING)
            return RB_MEMHOG_HOLDING;
        if (hog_now_ns() >= deadline) return RB_MEMHOG_GROWING;
        hog_sleep_ms(2);
    }
}

rb_status rb_memhog_stop(rb_memhog *h, rb_memhog_result *out, rb_error *err)
{
    if (!h) return rb_error_set(err, RB_E_INVALID_ARG, "memhog: stop of NULL");
    if (h->is_stopped)
        return rb_error_set(err, RB_E_INVALID_ARG, "memhog: pid %ld already stopped",
                            (long)h->pid);
    h->is_stopped = 1;
    if (h->gate_fd >= 0) {  /* never released: it dies without allocating */
        close(h->gate_fd);
        h->gate_fd = -1;
    }
    /* Seen dead first? Then whatever killed it was not us. A kill by the
     * OOM killer landing between this check and our kill() is counted as
     * ours: the cgroup's oom_kill counter is the authority for that. */
    hog_reap(h, 0);
    if (!h->is_reaped) {
        h->death_ns = hog_now_ns();
        if (kill(h->pid, SIGKILL) == 0) h->is_killed_by_us = 1;
        hog_reap(h, 1);
    }
    if (!h->has_status)
        return rb_error_set(err, RB_E_IO, "memhog: waitpid %ld: %s (reaped elsewhere?)",
                            (long)h->pid, strerror(ECHILD));
    if (out) {
        rb_memhog_result r;
        memset(&r, 0, sizeof r);
        r.pid = h->pid;
        r.bytes_reached = rb_memhog_bytes(h);
        r.is_reached = atomic_load_explicit(&h->shared->state, memory_order_acquire) ==
                       HOG_HOLDING;
        r.is_stopped_by_us = h->is_killed_by_us;
        if (WIFSIGNALED(h->wait_status)) r.exit_signal = WTERMSIG(h->wait_status);
        if (WIFEXITED(h->wait_status)) r.exit_code = WEXITSTATUS(h->wait_status);
        r.is_oom_killed = !h->is_killed_by_us && r.exit_signal == SIGKILL;
        r.ran_ns = h->death_ns - h->start_ns;
        r.n_file_passes = rb_memhog_file_passes(h);
        *out = r;
    }
    return RB_OK;
}

void rb_memhog_destroy(rb_memhog *h)
{
    if (!h) return;
    if (!h->is_stopped) rb_memhog_stop(h, NULL, NULL);
    munmap(h->shared, HOG_PAGE_BYTES);
    free(h);
}
