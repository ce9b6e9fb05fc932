/*
 * switch.h - what `rebound switch` measures per strategy, shared by the
 * experiment (cmd_switch.c) and its reports (switch_report.c: the table,
 * JSON and the SVG timeline).
 */
#ifndef RB_SWITCH_H
#define RB_SWITCH_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

typedef struct sw_result {
    char name[24];
    int ran;                 /* 0: skipped, note says why */
    char note[640];
    double ttft_s;           /* feed of the user turn to its first token */
    double trim_s;           /* the trim itself (not part of TTFT) */
    uint64_t freed_bytes;    /* RAM the trim gave back */
    uint64_t held_bytes;     /* RAM the session held after the trim */
    rb_session_stats st;     /* after the turn */
    rb_restore_event *ev;    /* the turn's timeline (malloc'd) */
    size_t n_ev;
    int n_agree, n_compared; /* top-1 of the turn's positions vs warm */
    double max_logit_diff;
    /* --pressure cgroup: what the kernel did and how rebound answered */
    uint64_t n_kernel_events;
    int n_trims, max_trim_level;
    uint64_t hog_bytes;      /* the competing process's memory when it stopped */
    int hog_oom_killed;
    uint64_t cg_failcnt, cg_oom_kills, cg_max_usage;
    /* kill+session: its I/O floor (the bytes a cold restore reads over the
       profile's bandwidth; 0: unthrottled), the disk's own bandwidth
       measured just before and after it, a bare read's of the same files
       just after it (0: not measured), with the floor at the slower of
       profile and disk, and at the slower of profile and bare read */
    uint64_t cold_read_bytes;
    double io_floor_s, disk_bw_before, disk_bw_after, disk_floor_s;
    double bare_bw, bare_floor_s;
    int host_reclaims_memory; /* sw_host_reclaims_free_memory() */
} sw_result;

typedef struct sw_setup {
    const char *model_path;
    const char *model_name;
    const char *device;
    const char *trim_spec;
    const char *pressure;     /* "explicit trim" or what the cgroup mode is */
    int is_cgroup;
    uint32_t n_ctx_tokens;    /* the context before the turn */
    uint32_t n_turn;
    int n_threads;
    double warm_ttft_s;
    double build_s;           /* building the context, or reading it */
    int context_from;         /* 1: read from --context FILE */
    uint64_t kv_bytes;        /* the context's KV in RAM before any trim */
    char machine[160];
    char storage_io[200];
} sw_setup;

/* --pressure cgroup (switch_pressure.c). setup: before the model loads
 * (joins the cgroup, forks n_hogs paused competing processes); -1 with
 * note saying why when not permitted (the caller falls back to the
 * explicit trim). run: releases hog i and trims on the kernel's signals
 * until it holds its memory or is OOM-killed, then stops it; fills r. */
typedef struct sw_pressure sw_pressure;
int sw_pressure_setup(sw_pressure **out, uint64_t limit_bytes, int n_hogs, char *note,
                      size_t note_n);
int sw_pressure_run(sw_pressure *p, int i, rb_session *s, sw_result *r);
void sw_pressure_teardown(sw_pressure *p);

/* Reads up to max_bytes of path past the page cache (O_DIRECT) in
 * n_streams parallel streams of 1 MiB requests, unthrottled; bytes/s, or 0
 * when it cannot (switch_disk.c). */
double sw_disk_read_bw(const char *path, uint64_t max_bytes, int n_streams);
/* Reads the n_files files whole through the page cache, their cached
 * copies dropped first and after, in n_streams parallel streams of 1 MiB
 * requests; bytes/s, or 0 when it cannot (switch_disk.c). */
double sw_bare_read_bw(const char *const *paths, int n_files, int n_streams);

/* 1 when this machine's host takes its free memory back (a virtio balloon
 * with free page reporting, and the guest reporting): every page new to
 * the guest then costs the host a fault, which a cold restore pays for
 * each page it fills (switch_disk.c). */
int sw_host_reclaims_free_memory(void);

/* The table on stdout. */
void sw_print_table(const sw_setup *su, const sw_result *r, int n);
/* JSON with every figure; 0 or -1 (errno set). */
int sw_write_json(const char *path, const sw_setup *su, const sw_result *r, int n);
/* The timeline picture: one panel per strategy, per layer when its restore
 * ran on each path and when its compute ran. 0 or -1 (errno set). */
int sw_write_svg(const char *path, const sw_setup *su, const sw_result *r, int n);

#endif
