/*
 * cgroup.h - a memory cgroup of our own: made with a hard limit, processes
 * attached to it, its counters read, and removed again. This is how
 * `rebound switch --pressure cgroup` makes the kernel itself take memory
 * away: the competing process (memhog.h) runs inside a limited cgroup, the
 * kernel reclaims and OOM-kills there, and pressure.h turns the kernel's
 * signals into trim requests.
 *
 * Where: cgroup v1 (a hierarchy mounted with the "memory" controller, e.g.
 * /sys/fs/cgroup/memory/<name>) when there is one; else cgroup v2 (the
 * cgroup2 mount whose root lists "memory" in cgroup.controllers). Our cgroups
 * are always direct children of the hierarchy's root, named
 * "rebound-<pid>-<n>[-<label>]" (pid of the creating process, n a
 * per-process counter, label the caller's) so that two processes, or two
 * cgroups of one process, never collide, and so that one left behind by a
 * crash can be recognised as ours and stale.
 *
 * Needs: root (or write access to the hierarchy's root); on v1 the kernel's
 * CONFIG_MEMCG_V1. rb_cgroup_probe() says whether it is possible before
 * anything is made.
 *
 * Threads: a handle is used by one thread at a time; different handles are
 * independent. Nothing here keeps global state except the name counter
 * (atomic).
 *
 * Errors: messages start with "cgroup: " and name the file and errno's text.
 */
#ifndef RB_CGROUP_H
#define RB_CGROUP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rebound.h"

typedef enum rb_cgroup_version {
    RB_CGROUP_NONE = 0,  /* no usable memory cgroup here */
    RB_CGROUP_V1 = 1,    /* legacy hierarchy with the memory controller */
    RB_CGROUP_V2 = 2     /* unified hierarchy, memory controller available */
} rb_cgroup_version;

typedef struct rb_cgroup rb_cgroup;

/* Counters of one cgroup, read at one moment (not atomically together). */
typedef struct rb_cgroup_stats {
    uint64_t usage_bytes;      /* v1 memory.usage_in_bytes (the kernel's
                                  doc calls it fuzzy: per-CPU charge batches),
                                  v2 memory.current */
    uint64_t max_usage_bytes;  /* v1 memory.max_usage_in_bytes, v2 memory.peak
                                  (0 when the kernel has no memory.peak) */
    uint64_t limit_bytes;      /* the limit in force (kernel-rounded) */
    uint64_t failcnt;          /* charges that hit the limit: v1
                                  memory.failcnt + memory.memsw.failcnt (a
                                  charge fails on one of the two), v2
                                  memory.events "max" */
    uint64_t n_oom_kills;      /* processes the kernel OOM-killed in here */
    int is_oom_kills_known;    /* 0: this kernel does not count OOM kills
                                  per cgroup (v1 before 4.13) */
    const char *oom_kills_source;  /* static: "memory.oom_control oom_kill",
                                      "memory.events oom_kill" or "unknown" */
    int is_under_oom;          /* v1 memory.oom_control under_oom (v2: 0) */
    uint64_t cache_bytes;      /* page cache: v1 memory.stat cache, v2 file */
    uint64_t rss_bytes;        /* anonymous: v1 memory.stat rss, v2 anon */
    uint64_t pgmajfault;       /* memory.stat pgmajfault (major faults) */
    uint64_t n_file_refaults;  /* memory.stat workingset_refault_file: file
                                  pages faulted back soon after the kernel
                                  evicted them (thrashing); 0 when absent */
} rb_cgroup_stats;

/*
 * Says whether a memory cgroup can be made here, without leaving anything
 * behind: finds the hierarchy, then really makes and removes a probe
 * directory (only that proves the right to; access() does not know about
 * read-only bind mounts or a missing controller). On v2 it enables the
 * memory controller for the root's children when it is not yet (as
 * rb_cgroup_create would; systemd machines have it on already).
 * `why` (may be NULL, n bytes, always NUL-terminated) receives one line: on
 * success where ("cgroup v1 memory controller at /sys/fs/cgroup/memory"), on
 * failure why not ("no memory cgroup hierarchy mounted (no cgroup v1
 * 'memory' or cgroup2 in /proc/mounts)", "mkdir
 * /sys/fs/cgroup/memory/rebound-12-probe: Permission denied (need root and
 * a writable cgroup hierarchy)").
 * Returns the version that rb_cgroup_create would use, or RB_CGROUP_NONE.
 */
rb_cgroup_version rb_cgroup_probe(char *why, size_t n);

/*
 * Makes a new memory cgroup limited to limit_bytes (RAM; on v1, when the
 * machine has swap, the memory+swap limit is set to the same so that swap
 * cannot dodge it; on v2 memory.swap.max is set to 0). The directory is named
 * "rebound-<pid>-<n>-<label>" (or "rebound-<pid>-<n>" when label is NULL or
 * ""): unique per process whatever the label. label: 1-32 characters of
 * [A-Za-z0-9_.-] (it becomes part of a path). First removes stale cgroups of
 * ours: empty "rebound-<pid>-..." whose pid is no longer alive (a crash
 * leaves them).
 * limit_bytes: at least 1 MiB, at most the machine's RAM (MemTotal); the
 * kernel rounds it down to a page.
 * Errors: RB_E_INVALID_ARG (limit out of range, bad label, out NULL),
 * RB_E_UNSUPPORTED (no memory cgroup hierarchy), RB_E_IO (mkdir or a
 * control file refused; nothing is left behind), RB_E_NOMEM.
 */
rb_status rb_cgroup_create(const char *label, uint64_t limit_bytes, rb_cgroup **out,
                           rb_error *err);

/*
 * Moves process `pid` (all its threads; 0 = the calling process) into the
 * cgroup. Its cgroup of origin is remembered, so that rb_cgroup_destroy can
 * put it back there. Memory it already has stays charged where it was (v1
 * move_charge_at_immigrate is left at 0); what it allocates from now on is
 * charged here. Errors: RB_E_INVALID_ARG (pid < 0, cg NULL), RB_E_IO (the
 * write to cgroup.procs failed: ESRCH = no such process).
 */
rb_status rb_cgroup_attach(rb_cgroup *cg, pid_t pid, rb_error *err);

/* Reads the counters. Errors: RB_E_IO naming the file; *out unchanged. */
rb_status rb_cgroup_stats_read(const rb_cgroup *cg, rb_cgroup_stats *out, rb_error *err);

/*
 * Whether process `pid` (0 = self) is in this cgroup now (/proc/<pid>/cgroup).
 * Returns 1 yes, 0 no, -1 the file cannot be read.
 */
int rb_cgroup_contains(const rb_cgroup *cg, pid_t pid);

/*
 * Moves every process still inside back out (those attached through
 * rb_cgroup_attach to where they came from, others to the hierarchy's root),
 * removes the directory (retrying briefly: the kernel frees a cgroup whose
 * last task just exited asynchronously) and frees the handle, whatever
 * happened. cg NULL is a no-op. Errors: RB_E_IO when the directory could not
 * be removed (message names it; a later rb_cgroup_create removes it once its
 * owner is dead).
 */
rb_status rb_cgroup_destroy(rb_cgroup *cg, rb_error *err);

/* The cgroup's directory ("/sys/fs/cgroup/memory/rebound-123-0-switch"), its
 * name ("rebound-123-0-switch") and version. Valid until rb_cgroup_destroy. */
const char *rb_cgroup_path(const rb_cgroup *cg);
const char *rb_cgroup_name(const rb_cgroup *cg);
rb_cgroup_version rb_cgroup_get_version(const rb_cgroup *cg);

#endif
