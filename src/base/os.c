/*
 * os.c - the real system-call table and the full-read/full-write loops.
 *
 * Does: wraps POSIX calls so that each is one replaceable entry (see os.h),
 * and turns short transfers and EINTR into whole transfers or a distinct
 * status; guards file mappings against SIGBUS (a process-wide handler,
 * installed by the first guard: rebound.h, rb_model_params.sigbus_guard).
 * Does not: buffer, cache, or decide policy; callers own that. The fault
 * injection hook (rb_os_fault_point) exists only in test builds.
 */
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "os.h"

static int os_open(const char *path, int flags, int mode)
{
    return open(path, flags | O_CLOEXEC, (mode_t)mode);
}

static int os_fstat_size(int fd, uint64_t *size_out)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -1;
    if (!S_ISREG(st.st_mode)) {
        errno = EISDIR; /* a directory or device is never a model file */
        if (!S_ISDIR(st.st_mode))
            errno = EINVAL;
        return -1;
    }
    *size_out = (uint64_t)st.st_size;
    return 0;
}

static void *os_mmap_ro(int fd, size_t n)
{
    void *p = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

static const rb_os rb_os_posix = {
    .open = os_open,
    .close = close,
    .pread = pread,
    .pwrite = pwrite,
    .fstat_size = os_fstat_size,
    .fsync = fsync,
    .rename = rename,
    .unlink = unlink,
    .mmap_ro = os_mmap_ro,
    .munmap = munmap,
};

const rb_os *rb_os_default(void) { return &rb_os_posix; }

rb_status rb_os_read_full(const rb_os *os, int fd, void *buf, size_t n,
                          uint64_t off, size_t *got, int *err_no)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = os->pread(fd, (char *)buf + done, n - done,
                              (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (err_no)
                *err_no = errno;
            if (got)
                *got = done;
            return RB_E_IO;
        }
        if (r == 0) {
            memset((char *)buf + done, 0, n - done);
            if (got)
                *got = done;
            return RB_E_SHORT_READ;
        }
        done += (size_t)r;
    }
    if (got)
        *got = done;
    return RB_OK;
}

#ifdef REBOUND_FAULT_INJECTION
/* Fault points left before the kill: -2 not read yet, -1 off. A test
   build's hook (os.h), set once from the environment. */
static _Atomic long fault_left = -2;

void rb_os_fault_point(void)
{
    long v = atomic_load_explicit(&fault_left, memory_order_relaxed);
    if (v == -1)
        return;
    if (v == -2) {
        const char *e = getenv("REBOUND_FAULT_KILL_AT");
        long n = e && *e ? atol(e) : 0;
        long expect = -2;
        atomic_compare_exchange_strong(&fault_left, &expect, n > 0 ? n : -1);
        if (n <= 0)
            return;
    }
    if (atomic_fetch_sub(&fault_left, 1) == 1)
        raise(SIGKILL);
}
#endif /* REBOUND_FAULT_INJECTION */

rb_status rb_os_write_full(const rb_os *os, int fd, const void *buf, size_t n,
                           uint64_t off, int *err_no)
{
    rb_os_fault_point();
    size_t done = 0;
    while (done < n) {
        ssize_t r = os->pwrite(fd, (const char *)buf + done, n - done,
                               (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (err_no)
                *err_no = errno;
            return RB_E_IO;
        }
        if (r == 0) { /* no progress and no error: treat as a full device */
            if (err_no)
                *err_no = ENOSPC;
            return RB_E_IO;
        }
        done += (size_t)r;
    }
    return RB_OK;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif

rb_status rb_os_populate_read(const void *addr, size_t n, int *err_no)
{
    uintptr_t a = (uintptr_t)addr / 4096 * 4096, b = ((uintptr_t)addr + n + 4095) / 4096 * 4096;
    if (b <= a)
        return RB_OK;
    if (madvise((void *)a, b - a, MADV_POPULATE_READ) == 0)
        return RB_OK;
    if (errno == EFAULT) /* past the end of the file */
        return RB_E_SHORT_READ;
    if (errno != EINVAL) {
        if (err_no)
            *err_no = errno;
        return RB_E_IO;
    }
    volatile const uint8_t *p = (const uint8_t *)a; /* an older kernel */
    uint8_t sink = 0;
    for (uintptr_t o = 0; o < b - a; o += 4096)
        sink ^= p[o];
    (void)sink;
    return RB_OK;
}

/* The guards: process-wide because the SIGBUS handler is (the only
   process-wide state of os.c; rb_model_params.sigbus_guard in rebound.h).
   A slot is claimed by its `used` flag, then
   published by storing lo last; the handler reads lo first (acquire). */
static struct {
    _Atomic int used, hit;
    _Atomic uintptr_t lo, hi;
} guards[RB_OS_N_GUARDS];
static struct sigaction guard_prev; /* the action before ours, set once */
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static int guard_installed;
static uintptr_t guard_page = 4096;

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < RB_OS_N_GUARDS; i++) {
        uintptr_t lo = atomic_load_explicit(&guards[i].lo, memory_order_acquire);
        if (!lo || a < lo || a >= atomic_load_explicit(&guards[i].hi, memory_order_relaxed))
            continue;
        /* mmap is not on POSIX's list of async-signal-safe calls, but it is
           one system call on Linux, and this is how a fault is undone */
        void *pg = (void *)(a / guard_page * guard_page);
        if (mmap(pg, guard_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0) == MAP_FAILED)
            break;
        atomic_store_explicit(&guards[i].hit, 1, memory_order_relaxed);
        return;
    }
    /* not ours: whoever handled SIGBUS before, or the default (the fault
       repeats on return and kills the process as it would have) */
    if ((guard_prev.sa_flags & SA_SIGINFO) && guard_prev.sa_sigaction) {
        guard_prev.sa_sigaction(sig, si, uc);
        return;
    }
    if (!(guard_prev.sa_flags & SA_SIGINFO) && guard_prev.sa_handler != SIG_DFL &&
        guard_prev.sa_handler != SIG_IGN) {
        guard_prev.sa_handler(sig);
        return;
    }
    signal(SIGBUS, SIG_DFL);
    if (si->si_code <= 0) /* sent, not a fault: it does not repeat */
        raise(SIGBUS);
}

static void guard_install(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    if (ps > 0)
        guard_page = (uintptr_t)ps;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    guard_installed = sigaction(SIGBUS, &sa, &guard_prev) == 0;
}

int rb_os_guard_add(const void *p, size_t n)
{
    pthread_once(&guard_once, guard_install);
    if (!guard_installed || !p || n == 0)
        return -1;
    for (int i = 0; i < RB_OS_N_GUARDS; i++) {
        int expect = 0;
        if (!atomic_compare_exchange_strong(&guards[i].used, &expect, 1))
            continue;
        atomic_store(&guards[i].hit, 0);
        atomic_store(&guards[i].hi, (uintptr_t)p + n);
        atomic_store_explicit(&guards[i].lo, (uintptr_t)p, memory_order_release);
        return i;
    }
    return -1;
}

int rb_os_guard_hit(int id)
{
    return id >= 0 && id < RB_OS_N_GUARDS &&
           atomic_load_explicit(&guards[id].hit, memory_order_relaxed);
}

void rb_os_guard_remove(int id)
{
    if (id < 0 || id >= RB_OS_N_GUARDS)
        return;
    atomic_store(&guards[id].lo, 0);
    atomic_store(&guards[id].hi, 0);
    atomic_store(&guards[id].used, 0);
}

void *rb_os_aligned_alloc(size_t align, size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, align, n ? n : 1) != 0)
        return NULL;
    return p;
}

void rb_os_trim_heap(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

void rb_os_advise_huge(void *p, size_t n, int on)
{
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t a = (uintptr_t)p, b = a + n;
    if (on) {
        a = (a + huge - 1) & ~(huge - 1);
        b &= ~(huge - 1);
    } else { /* a huge page needs its 2 MiB in one mapping of the kind:
                  the split at the range's pages is enough */
        const uintptr_t page = 4096;
        a &= ~(page - 1);
        b = (b + page - 1) & ~(page - 1);
    }
    if (b > a)
        (void)madvise((void *)a, b - a, on ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
    (void)p, (void)n, (void)on;
#endif
}
