/*
 * pressure.c - the pressure monitor and PSI reader (contract in pressure.h).
 *
 * Does: arm PSI triggers and, on cgroup v1, memory.pressure_level and
 * memory.oom_control eventfds for one cgroup; wait on all of them plus a
 * wake-up eventfd in one thread; fold each wake-up into at most one event
 * per source (the highest level), drop repeats within min_interval_ms that
 * do not escalate, and hand the rest to the callback. Does not:
 * trim anything, keep a history of events (the callback does what it
 * wants), rearm triggers (the kernel keeps them armed as long as the fd
 * is open), or read the counters that explain an event (cgroup.h and
 * rb_pressure_psi_read do).
 *
 * Kernel protocols used:
 *   PSI trigger   open <file> O_RDWR, write "<some|full> <stall us> <window
 *                 us>" (with its NUL); poll() then reports POLLPRI each time
 *                 the stall within a moving window crosses the threshold, at
 *                 most once per window; POLLERR once the trigger is gone (v2
 *                 cgroup removed). One trigger per open file.
 *   v1 event      efd = eventfd(); cfd = open(memory.pressure_level or
 *                 memory.oom_control); write "<efd> <cfd> [<level>]" to the
 *                 cgroup's cgroup.event_control. The kernel adds 1 to efd's
 *                 counter per notification; a listener on level L is
 *                 notified for every level >= L, so one "critical" moment
 *                 bumps all three of ours (hence the folding). cfd may be
 *                 closed once registered. Closing efd unregisters; removing
 *                 the cgroup signals every efd once more (not a pressure
 *                 event: recognised by the cgroup directory being gone).
 *
 * Layout: watch[] holds every armed descriptor with its source and level;
 * pollfd index i+1 is watch[i], index 0 is the wake-up eventfd.
 *
 * Invariants: watch[], info (but its counts) and params are written only
 * before the thread starts; afterwards the thread alone reads them, and
 * the counts are atomics. A watch found dead (POLLERR, cgroup gone) is
 * skipped from then on (its pollfd's fd is set to -1) and its descriptor
 * closed at destroy, like the others.
 *
 * Memory: the monitor (heap, ~2 KiB) and its thread's stack; nothing per
 * event (the event passed to the callback lives on the thread's stack).
 */
#include "pressure.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "status.h"

#define PR_MAX_WATCH 8                 /* 3 PSI + 3 v1 levels + 1 v1 OOM */
#define PR_WINDOW_MIN_US 500000u       /* the kernel's PSI window range */
#define PR_WINDOW_MAX_US 10000000u
#define PR_UNPRIV_WINDOW_US 2000000u   /* without CAP_SYS_RESOURCE: multiples */

static const char *const pr_source_names[RB_PRESSURE_N_SOURCES] = {
    "psi", "v1 pressure_level", "v1 oom_control"
};

typedef struct pr_watch {
    int fd;
    rb_pressure_source source;
    rb_pressure_level level;
    int is_eventfd;            /* 1: read the counter; 0: PSI (POLLPRI) */
    char detail[48];
} pr_watch;

struct rb_pressure_monitor {
    rb_pressure_params params;
    char cg_path[512];         /* "" without a cgroup; for the removal check */
    int wake_fd;               /* eventfd: stop writes 1 */
    pr_watch watch[PR_MAX_WATCH];
    int n_watch;
    pthread_t thread;
    int is_running;            /* thread created and not yet joined */
    rb_pressure_info info;     /* counts: use n_events below */
    atomic_ullong n_events[RB_PRESSURE_N_SOURCES];
    atomic_ullong n_suppressed[RB_PRESSURE_N_SOURCES];
    /* the thread's own: the last event delivered per source (debounce) */
    rb_pressure_level last_level[RB_PRESSURE_N_SOURCES];
    uint64_t last_ns[RB_PRESSURE_N_SOURCES];
};

static uint64_t pr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Appends "; "-separated text to info.notes (truncating quietly). */
static void pr_note(rb_pressure_monitor *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void pr_note(rb_pressure_monitor *m, const char *fmt, ...)
{
    char *notes = m->info.notes;
    size_t len = strlen(notes);
    if (len + 3 >= sizeof m->info.notes) return;
    if (len) {
        strcpy(notes + len, "; ");
        len += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(notes + len, sizeof m->info.notes - len, fmt, ap);
    va_end(ap);
}

rb_pressure_params rb_pressure_params_default(void)
{
    rb_pressure_params p;
    memset(&p, 0, sizeof p);
    p.psi_window_us = 2000000;
    p.psi_low_some_us = 100000;
    p.psi_medium_some_us = 200000;
    p.psi_critical_full_us = 200000;
    p.min_interval_ms = 100;
    return p;
}

rb_trim_level rb_pressure_trim_level(rb_pressure_level level)
{
    switch (level) {
    case RB_PRESSURE_LOW: return RB_TRIM_BACKGROUND;
    case RB_PRESSURE_MEDIUM: return RB_TRIM_MODERATE;
    case RB_PRESSURE_CRITICAL: return RB_TRIM_COMPLETE;
    }
    return RB_TRIM_BACKGROUND;
}

const char *rb_pressure_level_name(rb_pressure_level level)
{
    switch (level) {
    case RB_PRESSURE_LOW: return "low";
    case RB_PRESSURE_MEDIUM: return "medium";
    case RB_PRESSURE_CRITICAL: return "critical";
    }
    return "?";
}

/* ---- arming ---------------------------------------------------------- */

/* Writes one PSI trigger on a fresh descriptor. Returns the fd, or -errno. */
static int pr_psi_open(const char *path, const char *kind, uint32_t stall_us, uint32_t win_us)
{
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -errno;
    char buf[64];
    int len = snprintf(buf, sizeof buf, "%s %" PRIu32 " %" PRIu32, kind, stall_us, win_us);
    if (write(fd, buf, (size_t)len + 1) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

static void pr_add(rb_pressure_monitor *m, int fd, rb_pressure_source src,
                   rb_pressure_level level, int is_eventfd, const char *detail)
{
    pr_watch *w = &m->watch[m->n_watch++];
    w->fd = fd;
    w->source = src;
    w->level = level;
    w->is_eventfd = is_eventfd;
    snprintf(w->detail, sizeof w->detail, "%s", detail);
    m->info.is_armed[src] = 1;
}

/* Arms the requested PSI triggers. The first trigger tells whether the
 * kernel wants a 2 s multiple (EINVAL on another window when the process
 * lacks CAP_SYS_RESOURCE, kernels 6.5+); then the window is raised and the
 * thresholds scaled so that the same fraction of time is asked for. */
static void pr_arm_psi(rb_pressure_monitor *m)
{
    const rb_pressure_params *p = &m->params;
    if (p->cgroup_dir && p->cgroup_is_v2)
        snprintf(m->info.psi_path, sizeof m->info.psi_path, "%s/memory.pressure",
                 p->cgroup_dir);
    else
        snprintf(m->info.psi_path, sizeof m->info.psi_path, "/proc/pressure/memory");
    struct {
        const char *kind;
        uint32_t stall_us;
        rb_pressure_level level;
    } trig[3] = {
        { "some", p->psi_low_some_us, RB_PRESSURE_LOW },
        { "some", p->psi_medium_some_us, RB_PRESSURE_MEDIUM },
        { "full", p->psi_critical_full_us, RB_PRESSURE_CRITICAL },
    };
    uint32_t win = p->psi_window_us;
    double scale = 1.0;
    for (int i = 0; i < 3; i++) {
        if (!trig[i].stall_us) continue;
        uint32_t stall = (uint32_t)(trig[i].stall_us * scale);
        int fd = pr_psi_open(m->info.psi_path, trig[i].kind, stall, win);
        if (fd == -EINVAL && win % PR_UNPRIV_WINDOW_US != 0) {
            uint32_t raised = (win / PR_UNPRIV_WINDOW_US + 1) * PR_UNPRIV_WINDOW_US;
            if (raised > PR_WINDOW_MAX_US) raised = PR_WINDOW_MAX_US;
            scale = (double)raised / win;
            stall = (uint32_t)(trig[i].stall_us * scale);
            fd = pr_psi_open(m->info.psi_path, trig[i].kind, stall, raised);
            if (fd >= 0) {
                pr_note(m, "PSI window raised from %" PRIu32 " to %" PRIu32 " us, thresholds "
                        "x%.2f (kernel takes only multiples of 2 s without "
                        "CAP_SYS_RESOURCE)", win, raised, scale);
                win = raised;
            }
        }
        if (fd < 0) {
            int e = -fd;
            pr_note(m, "no PSI trigger '%s %" PRIu32 " %" PRIu32 "' on %s: %s%s", trig[i].kind,
                    stall, win, m->info.psi_path, strerror(e),
                    e == ENOENT ? " (kernel without CONFIG_PSI)"
                    : e == EOPNOTSUPP ? " (PSI disabled: boot with psi=1)" : "");
            if (e == ENOENT || e == EOPNOTSUPP || e == EACCES || e == EPERM) break;
            continue;
        }
        char detail[48];
        snprintf(detail, sizeof detail, "%s %" PRIu32 "us/%" PRIu32 "us", trig[i].kind, stall,
                 win);
        pr_add(m, fd, RB_PRESSURE_SOURCE_PSI, trig[i].level, 0, detail);
    }
    m->info.psi_window_us = win;
}

/* Registers one v1 eventfd on `file` with `args` ("low", or "" for OOM).
 * Returns the eventfd or -errno; *what names the step that failed. */
static int pr_v1_register(const char *cg_path, const char *file, const char *args,
                          const char **what)
{
    char cpath[600], epath[600], line[96];
    snprintf(cpath, sizeof cpath, "%s/%s", cg_path, file);
    snprintf(epath, sizeof epath, "%s/cgroup.event_control", cg_path);
    int cfd = open(cpath, O_RDONLY | O_CLOEXEC);
    if (cfd < 0) {
        *what = "open";
        return -errno;
    }
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd < 0) {
        int e = errno;
        close(cfd);
        *what = "eventfd";
        return -e;
    }
    int len = snprintf(line, sizeof line, "%d %d%s%s", efd, cfd, args[0] ? " " : "", args);
    int wfd = open(epath, O_WRONLY | O_CLOEXEC);
    int e = 0;
    if (wfd < 0) e = errno;
    else if (write(wfd, line, (size_t)len) < 0) e = errno;
    if (wfd >= 0) close(wfd);
    close(cfd);  /* the registration holds what it needs */
    if (e) {
        close(efd);
        *what = "write cgroup.event_control for";
        return -e;
    }
    return efd;
}

static void pr_arm_v1(rb_pressure_monitor *m)
{
    const rb_pressure_params *p = &m->params;
    const char *what = "";
    if (!p->is_no_v1_level) {
        static const char *const names[3] = { "low", "medium", "critical" };
        for (int i = 0; i < 3; i++) {
            int fd = pr_v1_register(m->cg_path, "memory.pressure_level", names[i], &what);
            if (fd < 0) {
                pr_note(m, "no v1 pressure_level '%s': %s %s/memory.pressure_level: %s",
                        names[i], what, m->cg_path, strerror(-fd));
                break;
            }
            pr_add(m, fd, RB_PRESSURE_SOURCE_V1_LEVEL, (rb_pressure_level)(i + 1), 1, names[i]);
        }
    }
    if (!p->is_no_v1_oom) {
        int fd = pr_v1_register(m->cg_path, "memory.oom_control", "", &what);
        if (fd < 0)
            pr_note(m, "no v1 oom_control: %s %s/memory.oom_control: %s", what, m->cg_path,
                    strerror(-fd));
        else
            pr_add(m, fd, RB_PRESSURE_SOURCE_V1_OOM, RB_PRESSURE_CRITICAL, 1, "under_oom");
    }
}

/* ---- the thread ---------------------------------------------------------- */

static void *pr_thread(void *arg)
{
    rb_pressure_monitor *m = arg;
    struct pollfd pfd[PR_MAX_WATCH + 1];
    pfd[0].fd = m->wake_fd;
    pfd[0].events = POLLIN;
    for (int i = 0; i < m->n_watch; i++) {
        pfd[i + 1].fd = m->watch[i].fd;
        pfd[i + 1].events = m->watch[i].is_eventfd ? POLLIN : POLLPRI;
    }
    for (;;) {
        for (int i = 0; i <= m->n_watch; i++) pfd[i].revents = 0;
        int r = poll(pfd, (nfds_t)m->n_watch + 1, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            break;  /* EFAULT/ENOMEM: nothing sensible left to wait on */
        }
        uint64_t now = pr_now_ns();
        if (pfd[0].revents) break;
        rb_pressure_event best[RB_PRESSURE_N_SOURCES];
        memset(best, 0, sizeof best);
        int cg_gone = -1;  /* checked once per wake-up, only when needed */
        for (int i = 0; i < m->n_watch; i++) {
            short rev = pfd[i + 1].revents;
            if (!rev) continue;
            pr_watch *w = &m->watch[i];
            uint64_t n = 1;
            if (w->is_eventfd) {
                if (read(w->fd, &n, sizeof n) != (ssize_t)sizeof n) continue;
                if (cg_gone < 0) {
                    struct stat st;
                    cg_gone = stat(m->cg_path, &st) != 0;
                }
                if (cg_gone) {  /* the removal notification, not pressure */
                    pfd[i + 1].fd = -1;
                    continue;
                }
            } else {
                if (rev & (POLLERR | POLLNVAL | POLLHUP)) {  /* trigger gone */
                    pfd[i + 1].fd = -1;
                    continue;
                }
                if (!(rev & POLLPRI)) continue;
            }
            rb_pressure_event *b = &best[w->source];
            b->n_signals += n;
            if (w->level > b->level) {
                b->level = w->level;
                b->detail = w->detail;
            }
        }
        uint64_t min_gap_ns = (uint64_t)m->params.min_interval_ms * 1000000u;
        for (int s = 0; s < RB_PRESSURE_N_SOURCES; s++) {
            if (!best[s].level) continue;
            if (m->last_ns[s] && best[s].level <= m->last_level[s] &&
                now - m->last_ns[s] < min_gap_ns) {
                atomic_fetch_add_explicit(&m->n_suppressed[s], 1, memory_order_relaxed);
                continue;
            }
            m->last_level[s] = best[s].level;
            m->last_ns[s] = now;
            best[s].source = (rb_pressure_source)s;
            best[s].source_name = pr_source_names[s];
            best[s].time_ns = now;
            atomic_fetch_add_explicit(&m->n_events[s], 1, memory_order_relaxed);
            m->params.on_event(m->params.ctx, &best[s]);
        }
    }
    return NULL;
}

/* ---- start / stop ------------------------------------------------------- */

static void pr_close_all(rb_pressure_monitor *m)
{
    for (int i = 0; i < m->n_watch; i++) close(m->watch[i].fd);
    m->n_watch = 0;
    if (m->wake_fd >= 0) close(m->wake_fd);
    m->wake_fd = -1;
}

rb_status rb_pressure_monitor_start(const rb_pressure_params *p, rb_pressure_monitor **out,
                                    rb_error *err)
{
    if (!p || !out || !p->on_event)
        return rb_error_set(err, RB_E_INVALID_ARG, "pressure: params, out or on_event is NULL");
    if (!p->is_no_psi) {
        if (p->psi_window_us < PR_WINDOW_MIN_US || p->psi_window_us > PR_WINDOW_MAX_US)
            return rb_error_set(err, RB_E_INVALID_ARG, "pressure: PSI window %" PRIu32 " us "
                                "outside [%u, %u]", p->psi_window_us, PR_WINDOW_MIN_US,
                                PR_WINDOW_MAX_US);
        uint32_t t[3] = { p->psi_low_some_us, p->psi_medium_some_us, p->psi_critical_full_us };
        for (int i = 0; i < 3; i++)
            if (t[i] > p->psi_window_us)
                return rb_error_set(err, RB_E_INVALID_ARG, "pressure: PSI threshold %" PRIu32
                                    " us exceeds the window %" PRIu32 " us", t[i],
                                    p->psi_window_us);
    }
    rb_pressure_monitor *m = calloc(1, sizeof *m);
    if (!m) return rb_error_set(err, RB_E_NOMEM, "pressure: out of memory");
    m->params = *p;
    for (int s = 0; s < RB_PRESSURE_N_SOURCES; s++) {
        atomic_init(&m->n_events[s], 0);
        atomic_init(&m->n_suppressed[s], 0);
    }
    if (p->cgroup_dir) snprintf(m->cg_path, sizeof m->cg_path, "%s", p->cgroup_dir);
    m->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (m->wake_fd < 0) {
        int e = errno;
        free(m);
        return rb_error_set(err, RB_E_IO, "pressure: eventfd: %s", strerror(e));
    }
    if (!p->is_no_psi) pr_arm_psi(m);
    if (p->cgroup_dir && !p->cgroup_is_v2) pr_arm_v1(m);
    else if (p->cgroup_dir && (!p->is_no_v1_level || !p->is_no_v1_oom))
        pr_note(m, "cgroup v2: no pressure_level/oom_control notifications (PSI covers it)");
    if (m->n_watch == 0) {
        rb_status st = rb_error_set(err, RB_E_UNSUPPORTED, "pressure: no source could be "
                                    "armed: %s",
                                    m->info.notes[0] ? m->info.notes : "none requested");
        pr_close_all(m);
        free(m);
        return st;
    }
    /* The thread takes no signals: they belong to the application. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&m->thread, NULL, pr_thread, m);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e) {
        pr_close_all(m);
        free(m);
        return rb_error_set(err, RB_E_IO, "pressure: pthread_create: %s", strerror(e));
    }
    m->is_running = 1;
    *out = m;
    return RB_OK;
}

rb_status rb_pressure_monitor_stop(rb_pressure_monitor *m, rb_error *err)
{
    if (!m) return rb_error_set(err, RB_E_INVALID_ARG, "pressure: stop of NULL");
    if (!m->is_running) return rb_error_set(err, RB_E_INVALID_ARG, "pressure: already stopped");
    uint64_t one = 1;
    ssize_t w;
    do {
        w = write(m->wake_fd, &one, sizeof one);
    } while (w < 0 && errno == EINTR);
    pthread_join(m->thread, NULL);
    m->is_running = 0;
    return RB_OK;
}

void rb_pressure_monitor_info(const rb_pressure_monitor *m, rb_pressure_info *out)
{
    if (!m || !out) return;
    *out = m->info;
    for (int s = 0; s < RB_PRESSURE_N_SOURCES; s++) {
        out->n_events[s] = atomic_load_explicit(&m->n_events[s], memory_order_relaxed);
        out->n_suppressed[s] = atomic_load_explicit(&m->n_suppressed[s], memory_order_relaxed);
    }
}

void rb_pressure_monitor_destroy(rb_pressure_monitor *m)
{
    if (!m) return;
    if (m->is_running) rb_pressure_monitor_stop(m, NULL);
    pr_close_all(m);
    free(m);
}

/* ---- PSI reader --------------------------------------------------------- */

rb_status rb_pressure_psi_read(const char *cgroup_dir, int cgroup_is_v2, rb_psi *out,
                               rb_error *err)
{
    if (!out) return rb_error_set(err, RB_E_INVALID_ARG, "pressure: out is NULL");
    char path[600];
    if (cgroup_dir && cgroup_is_v2)
        snprintf(path, sizeof path, "%s/memory.pressure", cgroup_dir);
    else
        snprintf(path, sizeof path, "/proc/pressure/memory");
    FILE *f = fopen(path, "re");
    if (!f) {
        int e = errno;
        return rb_error_set(err, e == ENOENT ? RB_E_UNSUPPORTED : RB_E_IO,
                            "pressure: open %s: %s%s", path, strerror(e),
                            e == ENOENT ? " (kernel without PSI)" : "");
    }
    rb_psi r;
    memset(&r, 0, sizeof r);
    int has_some = 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        char kind[8];
        double a10, a60, a300;
        unsigned long long total;
        if (sscanf(line, "%7s avg10=%lf avg60=%lf avg300=%lf total=%llu", kind, &a10, &a60,
                   &a300, &total) != 5)
            continue;
        if (strcmp(kind, "some") == 0) {
            r.some_avg10 = a10, r.some_avg60 = a60, r.some_avg300 = a300;
            r.some_total_us = total;
            has_some = 1;
        } else if (strcmp(kind, "full") == 0) {
            r.full_avg10 = a10, r.full_avg60 = a60, r.full_avg300 = a300;
            r.full_total_us = total;
            r.has_full = 1;
        }
    }
    int read_err = ferror(f) ? errno : 0;
    fclose(f);
    if (read_err)
        return rb_error_set(err, read_err == EOPNOTSUPP ? RB_E_UNSUPPORTED : RB_E_IO,
                            "pressure: read %s: %s%s", path, strerror(read_err),
                            read_err == EOPNOTSUPP ? " (PSI disabled: boot with psi=1)" : "");
    if (!has_some)
        return rb_error_set(err, RB_E_FORMAT, "pressure: %s has no 'some avg10=... total=...' "
                            "line", path);
    *out = r;
    return RB_OK;
}

int rb_pressure_own_cgroup(char *dir, size_t size, int *is_v2)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return -1;
    char line[1024], v1[1024] = "", v2[1024] = "";
    int has_v1 = 0, has_v2 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *a = strchr(line, ':'), *b = a ? strchr(a + 1, ':') : NULL;
        if (!a || !b)
            continue;
        *b = 0;
        const char *ctrl = a + 1, *path = b + 1;
        if (strncmp(line, "0", 2) == 0 && *ctrl == 0) {
            has_v2 = 1;
            snprintf(v2, sizeof v2, "%s", path);
        }
        for (char *c = (char *)ctrl; c && *c;) { /* "memory" or "cpu,memory" */
            size_t n = strcspn(c, ",");
            if (n == 6 && strncmp(c, "memory", 6) == 0) {
                has_v1 = 1;
                snprintf(v1, sizeof v1, "%s", path);
            }
            c = c[n] ? c + n + 1 : NULL;
        }
    }
    fclose(f);
    struct stat st;
    char p[1200];
    if (has_v1) {
        snprintf(p, sizeof p, "/sys/fs/cgroup/memory%s", v1);
        if (stat(p, &st) == 0 && (size_t)snprintf(dir, size, "%s", p) < size) {
            *is_v2 = 0;
            return 0;
        }
    }
    if (has_v2) {
        snprintf(p, sizeof p, "/sys/fs/cgroup%s/memory.pressure", v2);
        if (stat(p, &st) == 0 && (size_t)snprintf(dir, size, "/sys/fs/cgroup%s", v2) < size) {
            *is_v2 = 1;
            return 0;
        }
    }
    return -1;
}
