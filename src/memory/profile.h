/*
 * profile.h - device profiles: the storage a model's weights are read from
 * and the page-cache pool the OS gives a model app. One definition for all
 * of rebound: the simulator's I/O-time model (sim.c), the capacity planner
 * (plan.c) and the weight cache's throttle and sizing (wcache_stream.c)
 * all read the same numbers.
 *
 * Units: bytes and seconds. Sizes are binary (1 MiB = 2^20 B) and so are
 * bandwidths (MiB/s), so that the paper's arithmetic (Kim, Lee, Bahn 2025:
 * "60 MB + 100 MB/s x 0.1 s = 70 MB") comes out exactly, not 69.5.
 *
 * Threads: the built-in table is immutable; rb_profile values are plain
 * data, copied by value.
 */
#ifndef RB_PROFILE_H
#define RB_PROFILE_H

#include <stdint.h>

#include "rebound.h"

#define RB_MIB (1ull << 20)
#define RB_GIB (1ull << 30)

typedef struct rb_profile {
    char name[16];               /* "watch", "phone", "host", "custom" */
    const char *storage;         /* "eMMC 5.1", ... (static string) */
    double bw_bytes_per_s;       /* sustained read bandwidth, > 0 */
    double latency_s;            /* fixed cost per read request, >= 0 */
    uint64_t request_bytes;      /* largest merged read request, >= 4 KiB */
    uint64_t pool_bytes;         /* page cache the OS gives a model app */
    uint64_t pool_max_bytes;     /* upper end of that range (= pool_bytes if one value) */
    uint64_t hot_bytes;          /* hot set reserve: tokenizer, metadata, indexes */
    double reserve_fraction;     /* share of the pool assumed taken by the hot set
                                    and KV when no context is given (0..1) */
    double fetch_s;              /* T: allowed weight fetch time per token */
    int is_throttled;            /* 1: emulate this storage; 0: the host as is */
} rb_profile;

/* Number of built-in profiles and the i-th one (NULL past the end). */
int rb_profile_count(void);
const rb_profile *rb_profile_at(int i);

/*
 * The built-in profile with this name, copied into *out. "custom" is the
 * phone's numbers, meant to be overridden field by field.
 * Errors: RB_E_NOT_FOUND (message lists the known names).
 */
rb_status rb_profile_get(const char *name, rb_profile *out, rb_error *err);

/* Checks a (possibly user-edited) profile: bandwidth > 0 and finite,
 * latency >= 0, request >= 4 KiB, fetch time > 0. RB_E_INVALID_ARG names
 * the field and its value. */
rb_status rb_profile_check(const rb_profile *p, rb_error *err);

/*
 * Modelled time to read n_requests requests totalling bytes:
 * n_requests * latency + bytes / bandwidth (requests are serial: the
 * pessimistic queue depth of 1 a decode step sees between layers).
 */
double rb_profile_read_s(const rb_profile *p, uint64_t n_requests, uint64_t bytes);

#endif /* RB_PROFILE_H */
