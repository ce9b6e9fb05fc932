/*
 * wcache_stream.h - the weight cache's streaming mode: run a
 * model whose weights do not fit the memory it is given, at the speed the
 * capacity model predicts (plan.h: S >= max(0, N - BW*T)).
 *
 * The model's weight buffer (model.c) is an address range with the file's
 * data section at the same relative offsets; in this mode nothing of it is
 * read up front (the load-time scan is not cached) and only the blocks the
 * cache holds have RAM behind them. A block is `block_bytes` of the file
 * (64 KiB by default) at the same address the forward pass already points
 * to, so the forward pass's weight pointers never change and a streamed
 * block is no extra copy:
 *
 *      file : |hdr| embd | blk.0 ........ | blk.1 ........ | ... | output |
 *      keys :      k0 k1 .. | ........... | ............... |     | ...... |
 *      RAM  :      (rows    | pinned loop prefix S -------->| stream window:
 *                   as used)                                  read per token,
 *                                                             dropped after)
 *
 * Units: the forward pass reads weights in a fixed order, one unit at a
 * time: layer 0, 1, ..., n_layers-1, then the output unit (output_norm and
 * the output matrix, which is token_embd for a tied model). Before each it
 * calls rb_wcache_stream_acquire(unit); an I/O worker reads the next units
 * ahead (prefetch) while the current one computes. The embedding rows of
 * the tokens fed are fetched by rb_wcache_stream_rows before layer 0.
 *
 * Which blocks stay: the replacement policy (policy.h, the same method
 * table the simulator runs), driven with the labels the model's layout
 * gives (classify.h): small tensors (norms, biases, rope factors) and the
 * embedding rows are HOT, every block of a unit is LOOP. With `class` the
 * hot set is pinned first, then the first LOOP blocks read (the loop
 * prefix S, layer 0 first) while the pinned area has room; the remaining
 * N - S bytes stream through the window every token. With `lru` (what the
 * page cache does) a loop larger than the cache misses on every block.
 *
 * Budget: capacity = budget / block_bytes blocks. The window is what two
 * consecutive units need (the one computing and the one being read); the
 * minimum budget is the hot set plus one unit (then reads do not overlap
 * compute). Blocks the compute is using, or the worker has read ahead, are
 * held (the policy's in-use pins) and are never victims.
 *
 * Sharing: one stream per model, shared by every streaming session of it
 * (rb_wcache_stream_join / _leave, under the model's lock: the first join
 * creates it and sets it on the model, the last leave destroys it; a
 * session without a weights budget is refused while any streams, model.c).
 * Its budget: the largest of its users' weights budgets (join, leave);
 * under a memory budget, the share the pool leaves as computed by the
 * session about to feed (_request: it sees every session's bytes as they
 * are now). Its RAM is counted once, by its oldest user (_counts_for), in
 * that user's pool; the others' shares do not count it as another's.
 *
 * Passes: a forward pass walks units 0..n_layers in order and holds one at
 * a time, so the unit state above is one pass's. Passes of several
 * sessions (two threads, or one thread alternating) take turns: the pass
 * lock is taken by the first acquire or rows of a thread and held until
 * that thread calls rb_wcache_stream_pass_end (after the forward pass
 * returns); another thread's acquire, rows, set_budget or drop waits for
 * it. So one pass never lets go of (or drops) a unit another computes
 * with, the minimum budget stays the hot set + one unit, and the I/O
 * worker's read-ahead runs on from one pass into the next (unit n_layers
 * is followed by unit 0 of whichever pass comes next). Streaming is I/O
 * bound: a pass spends most of its time waiting for reads, which a second
 * concurrent pass could not make faster (the device is one), so turns cost
 * little (docs/benchmarks.md measures it). A multi-sequence pass (one
 * thread, several sessions' rows) acquires each unit once: a second
 * acquire of the unit held is a no-op, and rows of several sequences
 * accumulate until the first acquire.
 *
 * Threads: acquire/rows run on the forward pass's thread (holding the
 * pass); one I/O worker reads; everything else between passes. One mutex
 * guards the policy and all block and unit state (fetches are cheap; reads
 * run unlocked); pass_mu guards the pass owner and the users' list.
 * Lock order: pass (the lock as held across calls), then mu.
 */
#ifndef RB_WCACHE_STREAM_H
#define RB_WCACHE_STREAM_H

#include <stdint.h>

#include "model.h"
#include "os.h"
#include "rebound.h"
#include "throttle.h"

typedef struct rb_wcache_stream rb_wcache_stream;

typedef struct rb_wcache_stream_params {
    uint64_t budget_bytes;   /* weight bytes the cache may hold (> 0) */
    const char *policy;      /* "class" (NULL: class) or any runtime policy of
                                policy.h: lru, fifo, clock, 2q, arc, lirs, mru */
    uint32_t block_bytes;    /* 0: 64 KiB, or less (down to 4 KiB) so that a
                                layer spans at least 16 blocks; else a
                                multiple of 4 KiB */
    uint32_t max_request_bytes; /* reads merged up to this; 0: 1 MiB */
    uint64_t *min_budget_out;   /* optional: receives the minimum budget (also
                                   when create fails with RB_E_BUDGET) */
    int takes_throttle;         /* join: the stream owns the throttle from the
                                   call on (deinit + free with the stream, or at
                                   once when the stream exists already or the
                                   call fails): a stream outlives the session
                                   that created it */
} rb_wcache_stream_params;

typedef struct rb_wcache_stream_stats {
    const char *policy;
    uint64_t budget_bytes;       /* capacity in bytes (blocks x block size) */
    uint64_t min_budget_bytes;   /* hot set + the largest unit */
    uint64_t block_bytes;
    uint64_t loop_bytes;         /* N: bytes of all units (read per token) */
    uint64_t hot_bytes;          /* small tensors' blocks (pinned first) */
    uint64_t window_bytes;       /* stream window the plan keeps */
    uint64_t pinned_loop_bytes;  /* S the plan expects (class); resident LOOP
                                    blocks now for other policies */
    uint64_t resident_bytes;     /* RAM held by cached blocks now */
    uint64_t max_resident_bytes; /* the most it held */
    uint64_t read_bytes;         /* from storage, since creation */
    uint64_t n_reads;            /* read requests */
    uint64_t n_hits, n_misses;   /* block fetches */
    uint64_t n_passes;           /* output units acquired (tokens computed, in decode) */
    uint64_t n_rebalances;       /* budget changes (KV growth) */
    uint64_t budget_given_up_bytes; /* initial budget - current (KV took it) */
    double io_s;                 /* the worker's time in reads (throttle incl.) */
    double wait_s;               /* the forward pass blocked on a unit */
    double room_wait_s;          /* the worker waited for a frame (window full) */
    double idle_s;               /* the worker had nothing to read ahead */
    const char *io_mode;         /* "O_DIRECT" or the fallback */
    uint32_t n_users;            /* sessions sharing the stream */
    uint64_t n_pass_waits;       /* passes that waited for another session's */
    double pass_wait_s;          /* the time they waited */
} rb_wcache_stream_stats;

/*
 * Over a model whose weight buffer is allocated (rb_model_reserve_weights)
 * and not mapped. Drops whatever of the buffer is resident, marks the
 * model's weights unread (a later non-streaming session reads them again),
 * reads the small non-layer tensors every unit needs (rope factors), and
 * starts the I/O worker.
 * Errors: RB_E_BUDGET when the budget is below the minimum (the message
 * gives the minimum that would work), RB_E_NOT_FOUND (unknown policy, or
 * one that needs the future: opt), RB_E_INVALID_ARG, RB_E_UNSUPPORTED
 * (mapped model), RB_E_IO / RB_E_NOMEM.
 */
rb_status rb_wcache_stream_create(rb_model *model, const char *path, const rb_os *os,
                                  rb_throttle *throttle,
                                  const rb_wcache_stream_params *p,
                                  rb_wcache_stream **out, rb_error *err);
void rb_wcache_stream_destroy(rb_wcache_stream *ws);

/* The model's shared stream for session `who` (any unique pointer): the
 * first join creates it (p as for create) and sets it on the model
 * (rb_model_set_weights_stream); later joins share it, its budget grown
 * to p->budget_bytes if that is larger (RB_E_BUDGET below its minimum,
 * which *p->min_budget_out receives). Caller holds the model's lock. */
rb_status rb_wcache_stream_join(rb_model *model, const char *path, const rb_os *os,
                                rb_throttle *throttle, const rb_wcache_stream_params *p,
                                const void *who, rb_wcache_stream **out, rb_error *err);
/* `who` stops using the stream; the last user destroys it (and clears the
 * model's pointer); else the budget follows the largest request left
 * (waits for a pass in flight). Caller holds the model's lock. */
void rb_wcache_stream_leave(rb_model *model, rb_wcache_stream *ws, const void *who);
/* Before `who`'s feed under a memory budget: the share its pool leaves
 * the weights now; the stream takes it (the latest view of the pool).
 * RB_E_BUDGET below the minimum. Any thread (waits for another thread's
 * pass). */
rb_status rb_wcache_stream_request(rb_wcache_stream *ws, const void *who, uint64_t bytes,
                                   rb_error *err);
/* 1 when `who` is the user whose accounts count the stream's RAM (the
 * oldest one), 0 for the others: a pool counts the shared blocks once. */
int rb_wcache_stream_counts_for(const rb_wcache_stream *ws, const void *who);
/* The calling thread's pass is over (after the forward pass returned, also
 * when a gate stopped it): rows it still holds go, and another thread's
 * pass may start. A no-op when this thread holds no pass. begin: takes the
 * pass explicitly (acquire and rows take it themselves). */
void rb_wcache_stream_pass_begin(rb_wcache_stream *ws);
void rb_wcache_stream_pass_end(rb_wcache_stream *ws);
/* The capacity in blocks now. */
uint32_t rb_wcache_stream_capacity_blocks(const rb_wcache_stream *ws);

/* The weight bytes a budget must hold at least (same rule as create). */
uint64_t rb_wcache_stream_min_budget(const rb_wcache_stream *ws);

/* Ensures the blocks of tokens[0..n)'s embedding rows are resident (reads
 * them on this thread) and held until the pass's first acquire (several
 * calls in one pass add up). Takes the pass. 0, or -1 after an I/O error
 * (message: see rb_wcache_stream_error). Thread: the forward pass's. */
int rb_wcache_stream_rows(rb_wcache_stream *ws, const int32_t *tokens, uint32_t n);
/* Blocks until unit u (0..n_layers-1 a layer, n_layers the output) is
 * resident and held; lets go of the unit held before and lets the worker
 * read ahead (the unit held already: nothing). Takes the pass (waits for
 * another thread's). 0, or -1 after an I/O error. Thread: the forward
 * pass's. */
int rb_wcache_stream_acquire(rb_wcache_stream *ws, uint32_t unit);

/* Between passes (waits for another thread's pass): a new weight budget (KV grew or shrank under a memory
 * budget: a long chat gives up loop bytes to KV). Shrinking drops blocks
 * in the policy's eviction order (class: the stream, then the loop
 * prefix's end, the hot set last). RB_E_BUDGET below the minimum (nothing
 * changes). */
rb_status rb_wcache_stream_set_budget(rb_wcache_stream *ws, uint64_t bytes, rb_error *err);
/* Between passes (waits for another thread's pass): drops every cached block (a trim to "complete"); they
 * stream back on use. Returns the bytes freed. */
uint64_t rb_wcache_stream_drop(rb_wcache_stream *ws);

void rb_wcache_stream_get_stats(const rb_wcache_stream *ws, rb_wcache_stream_stats *out);
/* The I/O error that made acquire/rows fail (copied into err), or RB_OK. */
rb_status rb_wcache_stream_error(const rb_wcache_stream *ws, rb_error *err);

#endif
