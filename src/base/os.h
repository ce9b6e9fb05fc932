/*
 * os.h - the system-call table. Every file operation rebound makes goes
 * through an rb_os, so that tests can swap in a table that fails the Nth
 * pread, returns short reads or EINTR, and check that nothing leaks and the
 * state stays consistent (the shape of sqlite's os_unix.c aSyscall[]).
 *
 * rb_os_default() is the real one. The table is immutable; a module keeps a
 * pointer to the table it was opened with.
 */
#ifndef RB_OS_H
#define RB_OS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rebound.h"

typedef struct rb_os {
    int (*open)(const char *path, int flags, int mode);
    int (*close)(int fd);
    ssize_t (*pread)(int fd, void *buf, size_t n, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t n, off_t off);
    int (*fstat_size)(int fd, uint64_t *size_out);
    int (*fsync)(int fd);
    int (*rename)(const char *from, const char *to);
    int (*unlink)(const char *path);
    void *(*mmap_ro)(int fd, size_t n);  /* NULL on failure (errno set) */
    int (*munmap)(void *p, size_t n);
} rb_os;

const rb_os *rb_os_default(void);

/*
 * Reads exactly n bytes at off, retrying EINTR and short reads.
 * Returns RB_OK; RB_E_SHORT_READ if the file ends first (the rest of buf is
 * zero-filled, *got says how much was read); RB_E_IO with *err_no set.
 * got and err_no may be NULL.
 */
rb_status rb_os_read_full(const rb_os *os, int fd, void *buf, size_t n,
                          uint64_t off, size_t *got, int *err_no);

/* Writes exactly n bytes at off, retrying EINTR and short writes.
 * RB_OK or RB_E_IO with *err_no set (ENOSPC for a full disk). */
rb_status rb_os_write_full(const rb_os *os, int fd, const void *buf, size_t n,
                           uint64_t off, int *err_no);

/* Faults [addr, addr + n) of a file mapping in, reading what the page
 * cache lacks from storage (MADV_POPULATE_READ, Linux 5.14; before it, a
 * read per page, which raises SIGBUS if the file was cut under the
 * mapping). RB_OK; RB_E_SHORT_READ when the file ends under the range;
 * RB_E_IO with *err_no set. err_no may be NULL. */
rb_status rb_os_populate_read(const void *addr, size_t n, int *err_no);

/* A fault-injection point before each write, sync and rename of a
 * session or spill file (rb_os_write_full calls it; the session file's
 * fsyncs and renames call it too). Only in test builds: os.c and
 * sessfile.c compiled with REBOUND_FAULT_INJECTION (tests/CMakeLists.txt
 * links such copies into the test-only CLI rebound_faults); there, with
 * REBOUND_FAULT_KILL_AT=N in the environment, the N-th point raises
 * SIGKILL (kill-anywhere tests). The library and the CLI that are
 * installed never read the variable: the point compiles to nothing. */
#ifdef REBOUND_FAULT_INJECTION
void rb_os_fault_point(void);
#else
static inline void rb_os_fault_point(void) {}
#endif
/* Gives the heap's free pages back to the OS (glibc: malloc_trim), after
 * many small blocks were freed at once (a restore's compressed frames), so
 * that what the accounts freed leaves the process's RSS. No-op elsewhere. */
void rb_os_trim_heap(void);

/* Transparent huge pages for anonymous memory that holds weights (Linux
 * MADV_HUGEPAGE / MADV_NOHUGEPAGE; no-op elsewhere or when the kernel has
 * them off). on: the 2 MiB pages wholly inside [p, p + n) may be huge, so
 * a decode's reads of a layer cost a TLB entry per 2 MiB instead of per 4
 * KiB. off: no huge page may be made again over any part of the range
 * (call it before giving the range back: a huge page faulted in later by a
 * neighbour would fill the given-back part and overshoot the budget). */
void rb_os_advise_huge(void *p, size_t n, int on);

/* align-aligned memory of n bytes, freed with free(); NULL when out of
 * memory or align is not a power of two times sizeof(void *). n need not
 * be a multiple of align. posix_memalign, not C11's aligned_alloc: bionic
 * declares aligned_alloc only from Android API 28, and the library builds
 * for API 24 (README, "Android"). */
void *rb_os_aligned_alloc(size_t align, size_t n);

/*
 * Guarded file mappings. A file cut under a mapping of it raises SIGBUS
 * when a page past the new end is touched, in whatever code touches it.
 * rb_os_guard_add registers [p, p + n) (at most RB_OS_N_GUARDS at once in
 * the process; the first call installs a SIGBUS handler, chained to the
 * one before it for addresses outside every guard). A fault inside a
 * guard maps a zero page over the faulting page, marks the guard and
 * returns: the code goes on reading zeros, and its owner asks
 * rb_os_guard_hit after the work to turn the damage into an error naming
 * the file. Returns the guard's id, or -1 (no slot left, or the handler
 * could not be installed: the caller then does not map). Any thread.
 */
#define RB_OS_N_GUARDS 16
int rb_os_guard_add(const void *p, size_t n);
/* Whether a fault hit guard id since it was added (sticky). */
int rb_os_guard_hit(int id);
/* Frees the slot (before the range is unmapped). id -1: nothing. */
void rb_os_guard_remove(int id);

#endif /* RB_OS_H */
