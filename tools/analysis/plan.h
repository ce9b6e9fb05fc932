/*
 * plan.h - the capacity model of Kim, Lee and Bahn (2025) with the hot set
 * and the KV cache drawing on the same pool:
 *
 *   pool = hot set + KV share + loop cache L
 *   per token the loop (N bytes) is either cached or read within T:
 *       S >= max(0, N - BW * T)          S: pinned loop bytes
 *   so the largest loop a device carries at the token rate 1/T is
 *       N_max = L + BW * T
 *   and a model with loop N meets the rate iff max(0, N - BW*T) <= L.
 *   I/O-bound token rate with S = min(N, L) pinned:
 *       1 / ((N - S) / BW + ceil((N - S) / request) * latency)
 *
 * Reproduces the paper's figures with the built-in profiles: watch 64 MiB
 * - 4 MiB hot = 60 MiB + 100 MiB/s x 0.1 s = 70 MiB; phone 512 MiB - 1 GiB
 * pool, half of it for the loop, + 1000 MiB/s x 0.1 s = 356-612 MiB.
 */
#ifndef RB_PLAN_H
#define RB_PLAN_H

#include <stdint.h>

#include "profile.h"

typedef struct rb_plan_input {
    rb_profile profile;
    uint64_t pool_bytes;        /* the page cache the OS gives the model app */
    uint64_t hot_bytes;         /* hot set */
    int has_kv;                 /* 0: the profile's reserve_fraction stands for hot + KV */
    uint64_t kv_bytes;          /* KV share at the given context */
    uint64_t loop_bytes;        /* N per token; 0 = no model given */
    double tps;                 /* target tokens/s (> 0): T = 1 / tps */
    double bytes_per_param;     /* for the parameter count a loop size means */
} rb_plan_input;

typedef struct rb_plan {
    uint64_t pool_bytes, hot_bytes, kv_bytes, reserve_bytes; /* reserve = hot + KV */
    uint64_t loop_cache_bytes;  /* L = pool - reserve */
    double fetch_s;             /* T */
    uint64_t stream_bytes;      /* BW * T */
    uint64_t max_loop_bytes;    /* L + BW * T */
    double max_params;          /* max_loop_bytes / bytes_per_param */
    /* with a loop (loop_bytes > 0): */
    uint64_t loop_bytes;
    uint64_t s_needed_bytes;    /* max(0, N - BW*T) */
    uint64_t s_pinned_bytes;    /* min(N, L) */
    int meets_rate;
    double io_tok_s;            /* I/O-bound tokens/s (0 when nothing is read: infinite) */
    /* accounting: per-block metadata to manage the pool at 4 KiB */
    uint64_t pool_blocks;
    uint64_t meta_bytes;        /* pool_blocks * 8 (two u32 links per block) */
} rb_plan;

/*
 * Errors (RB_E_INVALID_ARG or RB_E_BUDGET, message names the values):
 * bandwidth <= 0 or not finite; latency < 0; tps <= 0; pool 0; pool
 * smaller than the hot set; hot set + KV larger than the pool.
 */
rb_status rb_plan_compute(const rb_plan_input *in, rb_plan *out, rb_error *err);

/* Bytes per parameter of a quantization name ("q4_0", "int4", "q8_0",
 * "f16", ...); 0 when unknown. */
double rb_plan_bytes_per_param(const char *quant);

#endif
