/*
 * classify.h - label model-file blocks SEQ, HOT or LOOP.
 *
 * Online: the paper's Algorithm 1 (Kim, Lee, Bahn 2025), one access at a
 * time, usable inside a cache policy. Blocks live in runs of consecutive
 * blocks ("block sequences"); each run has one class:
 *   - an access to B right after an access to B-1 adds B to B-1's run; a
 *     HOT run that grows this way becomes SEQ;
 *   - otherwise, an access to a block whose run is SEQ or LOOP starts a new
 *     LOOP run {B} (the block comes back: the weight loop);
 *   - otherwise, a first access starts a new HOT run {B};
 *   - a block of a HOT run accessed again stays HOT (the hot set);
 *   - an access to the block accessed just before changes nothing: two
 *     consecutive requests that share a 4 KiB block (one tensor ends where
 *     the next begins) are one access at this granularity, not a re-use.
 *     (Without this, every tensor of a load scan looked like a new LOOP.)
 *
 * Offline: labels from the whole trace, which sees the future: a block read
 * once is SEQ (a scan: keeping it is useless); a block read again is LOOP
 * when at least half of its re-reads are part of sequential stretches (B-1
 * just before or B+1 just after), else HOT (small random re-reads:
 * tokenizer, metadata, embedding rows). The first read does not vote: for
 * a hot block it is usually the load scan's.
 */
#ifndef RB_CLASSIFY_H
#define RB_CLASSIFY_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

typedef enum rb_block_class {
    RB_CLASS_NONE = 0,   /* never accessed */
    RB_CLASS_SEQ = 1,
    RB_CLASS_HOT = 2,
    RB_CLASS_LOOP = 3,
} rb_block_class;

const char *rb_class_name(int cls);

/*
 * Algorithm 1's state over keys [0, n_keys). Memory: one run id per key
 * (4 B), and per run a class byte and a member count (5 B). A run whose
 * last block leaves it is recycled, so live runs never exceed the blocks
 * seen and the state stays bounded however long a runtime decodes (a
 * token starts ~200 new LOOP runs on a 22-layer model).
 */
typedef struct rb_classify_online {
    uint32_t n_keys;
    uint32_t *run_of;      /* [n_keys] run of each block, UINT32_MAX = none */
    uint8_t *run_class;    /* [cap_runs] class of each run */
    uint32_t *run_n;       /* [cap_runs] blocks in each run; 0 = free */
    uint32_t *free_runs;   /* [cap_runs] stack of recycled run ids */
    uint32_t n_runs, cap_runs, n_free;
    uint32_t prev;         /* previous key accessed, UINT32_MAX at start */
} rb_classify_online;

rb_status rb_classify_online_init(rb_classify_online *c, uint32_t n_keys, rb_error *err);
void rb_classify_online_deinit(rb_classify_online *c);
/* Feeds one access; returns the block's class after it (RB_CLASS_*), or
 * RB_CLASS_NONE if the run table could not grow (out of memory). */
int rb_classify_online_access(rb_classify_online *c, uint32_t key);
static inline int rb_classify_online_class(const rb_classify_online *c, uint32_t key)
{
    uint32_t r = c->run_of[key];
    return r == UINT32_MAX ? RB_CLASS_NONE : c->run_class[r];
}
/* Bytes of metadata Algorithm 1 costs for n_keys blocks, at most (one
 * live run per block). */
size_t rb_classify_online_bytes(uint32_t n_keys);

#endif
