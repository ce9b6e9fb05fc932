/*
 * memhog.h - the competing app: a separate process that grows its anonymous
 * memory step by step and touches every page, like a camera or a game
 * opening while rebound holds a long context. Placed in a limited cgroup
 * (cgroup.h) it makes the kernel reclaim and, past the limit, OOM-kill; its
 * oom_score_adj is 1000 so that, of the two, the kernel kills the hog and
 * not rebound.
 *
 * The process: fork() of the caller; the child does only async-signal-safe
 * calls plus mmap/memset (so forking from a multi-threaded parent is safe:
 * no malloc, no stdio, no locks in the child), waits until the parent has
 * put it in its cgroup, then allocates. It dies with the parent
 * (PR_SET_PDEATHSIG), and is killed with SIGKILL by rb_memhog_stop.
 * fork() copies the caller's page tables, not its memory, but it makes
 * every private page the caller has at that moment copy-on-write for as
 * long as the hog lives: each such page the caller then writes is copied
 * (a page fault, 4 KiB more RAM). For a clean experiment, start the hog
 * paused (is_paused) before the model and the KV cache are allocated, and
 * rb_memhog_release it when the "user switches apps".
 *
 * Typical use (rebound switch --pressure cgroup):
 *   rb_cgroup_probe -> RB_CGROUP_NONE: say why, fall back to explicit trim
 *   rb_cgroup_create(label, limit)        the "phone" the two apps share
 *   [rb_cgroup_attach(cg, 0)]             rebound too, BEFORE it allocates
 *                                         (charges do not move on attach)
 *   rb_memhog_start(is_paused, cgroup)    before the model is loaded
 *   rb_pressure_monitor_start(cgroup, on_event = set an atomic flag)
 *   ... load, build the context ...
 *   rb_memhog_release                     the user opens the camera
 *   main thread: flag -> rb_session_trim(rb_pressure_trim_level(level))
 *   rb_memhog_wait / rb_memhog_stop; rb_cgroup_stats_read (what the kernel
 *   did); rb_pressure_monitor_destroy; rb_cgroup_destroy (moves rebound
 *   back where it was)
 *
 * Progress: the child publishes the bytes it has touched in a MAP_SHARED
 * page mapped before fork; the parent reads it (rb_memhog_bytes) at any time,
 * and it is still readable after the child died, which is how "bytes it
 * reached" is known for an OOM-killed hog.
 *
 * Threads: a handle is used by one thread at a time. The caller must not
 * reap the child itself (waitpid(-1) or SIGCHLD = SIG_IGN elsewhere in the
 * process would steal its exit status; then is_oom_killed stays 0 and the
 * result says so).
 *
 * Errors: messages start with "memhog: ".
 */
#ifndef RB_MEMHOG_H
#define RB_MEMHOG_H

#include <stdint.h>
#include <sys/types.h>

#include "cgroup.h"
#include "rebound.h"

typedef struct rb_memhog rb_memhog;

typedef struct rb_memhog_params {
    uint64_t bytes;         /* how much to allocate and touch in all (> 0) */
    uint64_t step_bytes;    /* per step (0 = all at once); rounded up to a page */
    uint32_t step_ms;       /* pause after each step (0 = none) */
    rb_cgroup *cgroup;      /* joined before the first allocation; NULL = stay
                               in the caller's cgroup (then no kernel limit
                               applies but the machine's). Borrowed. */
    int is_paused;          /* nonzero: fork and attach now, allocate only
                               after rb_memhog_release (see above) */
    int is_keep_oom_score;  /* nonzero: leave oom_score_adj as inherited
                               (default: 1000, the first to be killed) */
    uint64_t file_bytes;    /* before the anonymous growth, write this many
                               bytes to an unlinked file and fdatasync them:
                               clean page cache charged to the hog, which the
                               kernel can reclaim (an app's media files);
                               0 = none. Freed when the hog dies. */
    int is_file_loop;       /* nonzero (needs file_bytes): once the anonymous
                               bytes are held, map the file and read a byte
                               of every page, pass after pass, until stopped:
                               a model's weight loop larger than the cache.
                               Under a limit below file + anonymous bytes the
                               kernel thrashes (refaults), which is what PSI
                               measures as memory stall. */
    const char *file_dir;   /* where that file is made (not tmpfs: tmpfs
                               pages are not reclaimable without swap);
                               NULL = $TMPDIR, else /tmp. Used in start only. */
} rb_memhog_params;

typedef enum rb_memhog_state {
    RB_MEMHOG_PAUSED = -1,  /* started with is_paused, not yet released */
    RB_MEMHOG_GROWING = 0,  /* still allocating (a wait timed out) */
    RB_MEMHOG_HOLDING = 1,  /* reached `bytes`, holds them until stopped */
    RB_MEMHOG_EXITED = 2    /* dead (OOM-killed, or it failed to allocate) */
} rb_memhog_state;

typedef struct rb_memhog_result {
    pid_t pid;
    uint64_t bytes_reached;   /* bytes touched when it stopped or died */
    int is_oom_killed;        /* died of a SIGKILL we did not send: the
                                 kernel's OOM killer (nobody else here
                                 SIGKILLs it) */
    int is_reached;           /* it had touched all `bytes` */
    int is_stopped_by_us;     /* alive until rb_memhog_stop killed it */
    int exit_signal;          /* the signal it died of (0: exited) */
    int exit_code;            /* its exit code when it exited: 2 mmap
                                 failed, 3 oom_score_adj failed, 4 the file
                                 write failed (ENOSPC...), 5 the file's mmap */
    uint64_t n_file_passes;   /* full passes over the file (is_file_loop) */
    uint64_t ran_ns;          /* from the go (start, or release when paused)
                                 to its death as first seen by the parent
                                 (within ~2 ms) or to stop */
} rb_memhog_result;

/*
 * Forks the hog and, when p->cgroup is set, attaches it there before it
 * allocates anything. *out receives the handle (free with
 * rb_memhog_destroy). Errors: RB_E_INVALID_ARG (bytes 0, out NULL),
 * RB_E_IO (socketpair, mmap, the file or fork failed; cgroup attach
 * failed: then the child is killed and reaped, nothing is left),
 * RB_E_NOMEM.
 */
rb_status rb_memhog_start(const rb_memhog_params *p, rb_memhog **out, rb_error *err);

/* Lets a hog started with is_paused allocate (its clock starts now).
 * Errors: RB_E_INVALID_ARG when h is NULL or it was released already (or
 * was never paused). */
rb_status rb_memhog_release(rb_memhog *h, rb_error *err);

/* Bytes the hog has touched so far (also after it died). */
uint64_t rb_memhog_bytes(const rb_memhog *h);

/* Full passes over its file so far (is_file_loop; also after it died). */
uint64_t rb_memhog_file_passes(const rb_memhog *h);

/* The child's pid (still valid as a number after it is reaped). */
pid_t rb_memhog_pid(const rb_memhog *h);

/*
 * Waits up to timeout_ms until the hog holds all its bytes or is dead,
 * polling every ~2 ms (death is noticed with waitpid(WNOHANG), which also
 * reaps it and keeps its status for rb_memhog_stop). Returns the state
 * then: GROWING means the timeout passed; PAUSED comes back at once (a
 * paused hog has nothing to wait for). Never fails.
 */
rb_memhog_state rb_memhog_wait(rb_memhog *h, uint32_t timeout_ms);

/*
 * Kills the hog (SIGKILL) unless it is already dead (a paused one is
 * released with no go and dies without allocating), reaps it and fills
 * *out (may be NULL). Errors: RB_E_INVALID_ARG when h is NULL or it was
 * stopped already (out unchanged), RB_E_IO when waitpid fails (the child
 * was reaped by someone else: the result then has no exit status).
 */
rb_status rb_memhog_stop(rb_memhog *h, rb_memhog_result *out, rb_error *err);

/* Stops the hog if needed and frees the handle. NULL is a no-op. */
void rb_memhog_destroy(rb_memhog *h);

#endif
