/*
 * pressure.h - the kernel's memory pressure signals, turned into a stream of
 * events rebound can trim on. A monitor thread waits (poll) on:
 *
 *   "psi"                PSI triggers: /proc/pressure/memory (system-wide),
 *                        or the cgroup's memory.pressure on cgroup v2. Up to
 *                        three triggers: "some" stall above a low and a
 *                        medium threshold, "full" stall above a critical one,
 *                        each per window. Fires at most once per window per
 *                        trigger (the kernel's rate limit).
 *   "v1 pressure_level"  cgroup v1 memory.pressure_level of the given cgroup,
 *                        one eventfd per level (low, medium, critical),
 *                        registered through cgroup.event_control. The kernel
 *                        computes it from reclaim efficiency (pages reclaimed
 *                        per page scanned) and forces "critical" when reclaim
 *                        gets desperate (scan priority <= 3).
 *   "v1 oom_control"     cgroup v1 memory.oom_control: the cgroup hit its
 *                        limit with nothing left to reclaim (the OOM killer
 *                        is about to run or has run).
 *
 * Levels, and the trim level the session should answer with (rb_trim_level,
 * rb_pressure_trim_level):
 *
 *   RB_PRESSURE_LOW      v1 "low", PSI some >= low threshold:
 *                        reclaim is working -> RB_TRIM_BACKGROUND (the KV of
 *                        the last quarter of the layers: cheap to restore)
 *   RB_PRESSURE_MEDIUM   v1 "medium", PSI some >= medium threshold:
 *                        tasks are stalling -> RB_TRIM_MODERATE (last half)
 *   RB_PRESSURE_CRITICAL v1 "critical", v1 oom_control, PSI full >=
 *                        critical threshold: the OOM killer is next ->
 *                        RB_TRIM_COMPLETE (all KV and weights; the session
 *                        tokens survive, so nothing is lost)
 *
 * On cgroup v1 there is no per-cgroup PSI: the "psi" source then sees the
 * whole machine's stalls (memcg reclaim stalls of a process in our cgroup
 * count there too, but so do everybody else's).
 *
 * Which source speaks when (measured by tests/test_pressure.c, kernel 6.18,
 * cgroup v1, no swap):
 *   anonymous growth past the limit: the kernel reclaims the page cache in
 *   the cgroup ("v1 pressure_level" low), then, with only anonymous memory
 *   left and no swap, gives up within ~70 ms ("critical", then
 *   "v1 oom_control") and OOM-kills. PSI stays silent: the stall is a few
 *   ms, far below any useful threshold.
 *   file pages looping through a cache that is too small (weights larger
 *   than the page cache left to them): the kernel thrashes, v1 levels repeat
 *   as long as it lasts, and PSI fires after ~0.5-1.5 s (some/full stall
 *   20-30% of the time).
 * So react to all sources: the v1 ones are the early, cgroup-local signal;
 * PSI is the one that also exists on v2 and on phones (Android's lmkd).
 *
 * Threads: the callback runs on the monitor's own thread, one call at a
 * time, never after rb_pressure_monitor_stop returns. It must be quick and
 * must not call into the monitor: set an atomic flag (the switch command
 * does) and trim from the thread that owns the session. The monitor thread
 * blocks all signals (they go to the application's threads).
 *
 * Errors: messages start with "pressure: " and name the file and errno.
 */
#ifndef RB_PRESSURE_H
#define RB_PRESSURE_H

#include <stdint.h>

#include "rebound.h"

typedef struct rb_pressure_monitor rb_pressure_monitor;

typedef enum rb_pressure_level {
    RB_PRESSURE_LOW = 1,
    RB_PRESSURE_MEDIUM = 2,
    RB_PRESSURE_CRITICAL = 3
} rb_pressure_level;

typedef enum rb_pressure_source {
    RB_PRESSURE_SOURCE_PSI = 0,       /* "psi" */
    RB_PRESSURE_SOURCE_V1_LEVEL = 1,  /* "v1 pressure_level" */
    RB_PRESSURE_SOURCE_V1_OOM = 2,    /* "v1 oom_control" */
    RB_PRESSURE_N_SOURCES = 3
} rb_pressure_source;

typedef struct rb_pressure_event {
    rb_pressure_level level;   /* the highest level signalled in this wake-up */
    rb_pressure_source source;
    const char *source_name;   /* static string, see the enum */
    const char *detail;        /* what fired: "some 100000us/2000000us",
                                  "critical"; valid until the monitor is
                                  destroyed */
    uint64_t time_ns;          /* CLOCK_MONOTONIC when the thread woke */
    uint64_t n_signals;        /* kernel notifications folded into this event
                                  (eventfd counts; 1 for PSI) */
} rb_pressure_event;

typedef void (*rb_pressure_callback)(void *ctx, const rb_pressure_event *ev);

typedef struct rb_pressure_params {
    const char *cgroup_dir;    /* whose pressure: a cgroup's directory (copied
                                  at start). It may be removed while the
                                  monitor runs: the kernel's removal
                                  notifications are recognised and not
                                  reported. NULL: system-wide PSI only. */
    int cgroup_is_v2;          /* the directory is a cgroup v2 one (its own
                                  memory.pressure); 0: v1 (memory controller) */
    uint32_t psi_window_us;    /* PSI window: 500000..10000000; without
                                  CAP_SYS_RESOURCE the kernel (6.5+) takes
                                  only multiples of 2 s, and other windows are
                                  raised to one (thresholds scaled alike) */
    uint32_t psi_low_some_us;      /* "some" stall per window for LOW (0 = off) */
    uint32_t psi_medium_some_us;   /* "some" stall per window for MEDIUM (0 = off) */
    uint32_t psi_critical_full_us; /* "full" stall per window for CRITICAL (0 = off) */
    int is_no_psi;             /* nonzero: do not arm PSI triggers */
    int is_no_v1_level;        /* nonzero: no v1 memory.pressure_level */
    int is_no_v1_oom;          /* nonzero: no v1 memory.oom_control */
    uint32_t min_interval_ms;  /* per source, a wake-up at the same or a lower
                                  level than the last event delivered less
                                  than this long ago is not delivered (only
                                  counted in rb_pressure_info.n_suppressed);
                                  a higher level always is, and a lasting
                                  pressure repeats once per interval. The
                                  kernel's v1 notifications come in bursts
                                  (~140 wake-ups in 130 ms measured as a hog
                                  hit its limit). 0 = deliver every wake-up. */
    rb_pressure_callback on_event;  /* required; runs on the monitor thread */
    void *ctx;                 /* passed to on_event */
} rb_pressure_params;

/* What a running (or stopped) monitor watches and has seen. */
typedef struct rb_pressure_info {
    int is_armed[RB_PRESSURE_N_SOURCES];     /* source watched */
    uint64_t n_events[RB_PRESSURE_N_SOURCES]; /* callbacks made, per source */
    uint64_t n_suppressed[RB_PRESSURE_N_SOURCES]; /* wake-ups not delivered
                                                     (min_interval_ms) */
    char psi_path[128];        /* the PSI file triggers were written to */
    uint32_t psi_window_us;    /* the window in force (after any raise) */
    char notes[512];           /* why a requested source is not armed, and
                                  adjustments made ("" when none) */
} rb_pressure_info;

/* Defaults: window 2 s (accepted with or without CAP_SYS_RESOURCE), LOW at
 * some 100 ms (5%), MEDIUM at some 200 ms (10%), CRITICAL at full 200 ms;
 * every source on; min_interval_ms 100; cgroup and callback unset.
 * Thresholds after Android's lmkd (some 70-100 ms per 1 s for its first
 * levels), doubled with the window. */
rb_pressure_params rb_pressure_params_default(void);

/*
 * Arms every requested source that this machine has (in the calling
 * thread, so that errors come back here) and starts the monitor thread.
 * A source that cannot be armed is skipped and noted (rb_pressure_info.notes);
 * it is an error only when none can. *out receives the handle.
 * Errors: RB_E_INVALID_ARG (p, out or on_event NULL, window or a threshold
 * out of range), RB_E_UNSUPPORTED (no source could be armed; the message has
 * each reason), RB_E_IO (eventfd or thread creation), RB_E_NOMEM.
 */
rb_status rb_pressure_monitor_start(const rb_pressure_params *p, rb_pressure_monitor **out,
                                    rb_error *err);

/*
 * Wakes the thread and joins it: no callback runs after this returns. The
 * sources stay registered until rb_pressure_monitor_destroy (info still
 * readable). Errors: RB_E_INVALID_ARG when m is NULL or already stopped.
 */
rb_status rb_pressure_monitor_stop(rb_pressure_monitor *m, rb_error *err);

/* Copies what the monitor watches and the event counts so far. Safe while
 * the thread runs (the counts are atomics). */
void rb_pressure_monitor_info(const rb_pressure_monitor *m, rb_pressure_info *out);

/* Stops the monitor if it runs, closes its descriptors (which unregisters
 * the kernel's triggers) and frees it. NULL is a no-op. */
void rb_pressure_monitor_destroy(rb_pressure_monitor *m);

/* PSI figures of one resource file: percentages of wall time over the last
 * 10/60/300 s, and the total stall in microseconds since boot. */
typedef struct rb_psi {
    double some_avg10, some_avg60, some_avg300;
    uint64_t some_total_us;
    double full_avg10, full_avg60, full_avg300;
    uint64_t full_total_us;
    int has_full;              /* 0: the file has no "full" line */
} rb_psi;

/*
 * Reads memory PSI for reports: the cgroup's memory.pressure on v2, else
 * /proc/pressure/memory (no cgroup, or v1). Errors: RB_E_UNSUPPORTED (no PSI:
 * kernel without CONFIG_PSI or booted psi=0), RB_E_FORMAT, RB_E_IO.
 */
rb_status rb_pressure_psi_read(const char *cgroup_dir, int cgroup_is_v2, rb_psi *out,
                               rb_error *err);

/* This process's own memory cgroup: its directory and version, from
 * /proc/self/cgroup (v2 "0::/path", or v1 "N:memory:/path" under
 * /sys/fs/cgroup/memory). 0, or -1 when there is none to watch. */
int rb_pressure_own_cgroup(char *dir, size_t size, int *is_v2);

/* The session trim level suggested for a pressure level (table above). */
rb_trim_level rb_pressure_trim_level(rb_pressure_level level);

/* "low", "medium", "critical" (or "?"). */
const char *rb_pressure_level_name(rb_pressure_level level);

#endif
