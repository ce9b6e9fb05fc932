/*
 * sim.h - replay a block stream (trace.h) against a policy (policy.h) at
 * one cache size, and report what the cache would have done: hit ratio,
 * bytes read from storage per token, and the modelled per-token I/O time
 * under a device profile (profile.h), with misses merged into requests.
 *
 * Request model: consecutive misses of consecutive blocks (in access order
 * and in the file) form one read request, up to the profile's request
 * size; each request costs latency + bytes / bandwidth, serially. This is
 * what a weight cache that reads ranges does, not 4 KiB reads.
 *
 * Does not: parse traces (trace.c) or print (the CLI does).
 */
#ifndef RB_SIM_H
#define RB_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "profile.h"
#include "trace.h"

typedef struct rb_sim_params {
    rb_profile profile;
    uint32_t window;            /* class: streaming window blocks (0: default) */
    const uint8_t *labels;      /* class: offline labels (NULL: Algorithm 1 online) */
    const uint64_t *next_use;   /* opt: rb_sim_next_use of the same stream */
} rb_sim_params;

typedef struct rb_sim_result {
    char policy[16];
    uint64_t cache_bytes;
    uint32_t capacity;          /* blocks */
    uint64_t accesses, hits, bypass;
    double hit_ratio;           /* hits / accesses, all accesses */
    uint64_t tok_accesses, tok_hits;
    double tok_hit_ratio;       /* over the accesses inside token spans */
    double bytes_per_token;     /* storage bytes read per token span */
    double requests_per_token;  /* merged read requests per token span */
    double io_s_per_token;      /* modelled I/O time per token span */
    double replay_s;            /* wall time of the replay */
    size_t state_bytes;         /* the policy's metadata */
} rb_sim_result;

/* next[i] = index of the next access to key[i], UINT64_MAX if none.
 * Memory: n u64 (caller frees) plus n_keys u64 while it runs. RB_E_NOMEM. */
rb_status rb_sim_next_use(const rb_block_stream *s, uint64_t **out, rb_error *err);

/* One replay. Errors: those of rb_policy_create (unknown policy, opt
 * without next_use), RB_E_INVALID_ARG (cache below one block). */
rb_status rb_sim_run(const rb_block_stream *s, const char *policy, uint64_t cache_bytes,
                     const rb_sim_params *p, rb_sim_result *out, rb_error *err);

/*
 * Writes an SVG line plot of hit ratio (y, tok_hit_ratio when use_tok) vs
 * cache size (x, MiB) with one line per policy, results grouped by policy
 * in the order given. RB_E_IO.
 */
rb_status rb_sim_write_svg(const char *path, const char *title, const rb_sim_result *r,
                           size_t n, int use_tok, rb_error *err);

#endif
