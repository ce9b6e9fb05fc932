/*
 * switch_pressure.c - `rebound switch --pressure cgroup`: real memory
 * pressure from the kernel instead of an explicit trim.
 *
 * rebound and a competing app (a memory hog: another process that grows
 * and touches anonymous memory, like a camera or a game opening) share one
 * memory cgroup whose limit fits rebound alone. When the hog grows, the
 * kernel reclaims and signals pressure (cgroup v1 pressure_level, its OOM
 * notification, PSI); rebound reacts to each signal by trimming at the
 * level it maps to, on the main thread, until the hog holds its memory or
 * the kernel has OOM-killed it (the hog's oom_score_adj is 1000: of the two
 * it is the one to go). Then the user "comes back": the hog is stopped and
 * the turn is measured as in the explicit mode.
 *
 * This harness drives the OS side through the library's cgroup, memhog and
 * pressure modules (src/): the experiment, not the engine, is what uses
 * them, so `switch` reaches past include/rebound.h here and only here.
 *
 * Order matters: rebound joins the cgroup before it allocates (a charge
 * does not move with a process), and the hogs are forked, paused, before
 * the model is loaded (a fork makes the parent's pages copy-on-write).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cgroup.h"
#include "cli.h"
#include "memhog.h"
#include "pressure.h"
#include "switch.h"

#define MAX_HOGS 12

struct sw_pressure {
    rb_cgroup *cg;
    rb_memhog *hogs[MAX_HOGS];
    int n_hogs;
    rb_pressure_monitor *mon;
    uint64_t limit;
    _Atomic int level;       /* the highest level signalled since the last read */
    _Atomic uint64_t n_events;
};

static void on_event(void *ctx, const rb_pressure_event *ev)
{
    /* the monitor's thread: only note it; the main thread trims */
    sw_pressure *p = ctx;
    int cur = atomic_load(&p->level);
    while ((int)ev->level > cur && !atomic_compare_exchange_weak(&p->level, &cur, (int)ev->level))
        ;
    atomic_fetch_add(&p->n_events, 1);
}

int sw_pressure_setup(sw_pressure **out, uint64_t limit_bytes, int n_hogs, char *note,
                      size_t note_n)
{
    char why[256] = "";
    *out = NULL;
    if (rb_cgroup_probe(why, sizeof why) == RB_CGROUP_NONE) {
        snprintf(note, note_n, "cgroup pressure not permitted here (%s): explicit trim instead",
                 why);
        return -1;
    }
    sw_pressure *p = calloc(1, sizeof *p);
    rb_error err = {0};
    if (!p)
        return -1;
    p->limit = limit_bytes;
    if (rb_cgroup_create("switch", limit_bytes, &p->cg, &err) != RB_OK ||
        rb_cgroup_attach(p->cg, 0, &err) != RB_OK) {
        snprintf(note, note_n, "cgroup pressure failed (%s): explicit trim instead", err.message);
        sw_pressure_teardown(p);
        return -1;
    }
    for (int i = 0; i < n_hogs && i < MAX_HOGS; i++) {
        rb_memhog_params hp;
        memset(&hp, 0, sizeof hp);
        hp.bytes = limit_bytes;          /* it wants the whole "phone" */
        hp.step_bytes = 16ull << 20;     /* 16 MiB every 10 ms: 1.6 GB/s, a */
        hp.step_ms = 10;                 /* camera pipeline's appetite */
        hp.cgroup = p->cg;
        hp.is_paused = 1;
        if (rb_memhog_start(&hp, &p->hogs[i], &err) != RB_OK) {
            snprintf(note, note_n, "cannot start the competing process (%s): explicit trim "
                     "instead", err.message);
            sw_pressure_teardown(p);
            return -1;
        }
        p->n_hogs++;
    }
    rb_pressure_params pp = rb_pressure_params_default();
    pp.cgroup_dir = rb_cgroup_path(p->cg);
    pp.cgroup_is_v2 = rb_cgroup_get_version(p->cg) == RB_CGROUP_V2;
    pp.on_event = on_event;
    pp.ctx = p;
    if (rb_pressure_monitor_start(&pp, &p->mon, &err) != RB_OK) {
        snprintf(note, note_n, "cannot watch the kernel's pressure signals (%s): explicit trim "
                 "instead", err.message);
        sw_pressure_teardown(p);
        return -1;
    }
    snprintf(note, note_n, "real pressure: cgroup %s limited to %.0f MiB, a competing process "
             "grows to the limit, rebound trims on the kernel's signals",
             rb_cgroup_name(p->cg), (double)limit_bytes / (1 << 20));
    *out = p;
    return 0;
}

int sw_pressure_run(sw_pressure *p, int i, rb_session *s, sw_result *r)
{
    if (i >= p->n_hogs)
        return -1;
    rb_error err = {0};
    rb_cgroup_stats before;
    rb_cgroup_stats_read(p->cg, &before, &err);
    atomic_store(&p->level, 0);
    uint64_t ev0 = atomic_load(&p->n_events);
    if (rb_memhog_release(p->hogs[i], &err) != RB_OK) {
        snprintf(r->note, sizeof r->note, "%s", err.message);
        return -1;
    }
    /* the user is away: react to every signal until the hog holds its
       memory, is killed, or 20 s pass */
    double t0 = rb_cli_now_s();
    rb_memhog_state state = RB_MEMHOG_GROWING;
    while (rb_cli_now_s() - t0 < 20) {
        int level = atomic_exchange(&p->level, 0);
        if (level > 0) {
            uint64_t freed = 0;
            double ts = rb_cli_now_s();
            rb_trim_level tl = rb_pressure_trim_level((rb_pressure_level)level);
            if (rb_session_trim(s, 0, tl, &freed) == RB_OK) {
                r->freed_bytes += freed;
                r->n_trims++;
                r->trim_s += rb_cli_now_s() - ts;
                if ((int)tl > r->max_trim_level)
                    r->max_trim_level = (int)tl;
            }
        }
        state = rb_memhog_wait(p->hogs[i], 5);
        if (state == RB_MEMHOG_HOLDING || state == RB_MEMHOG_EXITED)
            break;
    }
    rb_memhog_result hr;
    rb_memhog_stop(p->hogs[i], &hr, &err); /* the user comes back */
    rb_cgroup_stats after;
    rb_cgroup_stats_read(p->cg, &after, &err);
    r->n_kernel_events = atomic_load(&p->n_events) - ev0;
    r->hog_bytes = hr.bytes_reached;
    r->hog_oom_killed = hr.is_oom_killed;
    r->cg_failcnt = after.failcnt - before.failcnt;
    r->cg_oom_kills = after.n_oom_kills - before.n_oom_kills;
    r->cg_max_usage = after.max_usage_bytes;
    return 0;
}

void sw_pressure_teardown(sw_pressure *p)
{
    if (!p)
        return;
    rb_error err;
    if (p->mon) {
        rb_pressure_monitor_stop(p->mon, &err);
        rb_pressure_monitor_destroy(p->mon);
    }
    for (int i = 0; i < p->n_hogs; i++) {
        rb_memhog_result hr;
        rb_memhog_stop(p->hogs[i], &hr, &err);
        rb_memhog_destroy(p->hogs[i]);
    }
    if (p->cg)
        rb_cgroup_destroy(p->cg, &err);
    free(p);
}
