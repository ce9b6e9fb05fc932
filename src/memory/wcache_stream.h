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
 * Threads: acquire/rows run on the forward pass's thread; one I/O worker
 * reads; everything else between feeds. One mutex guards the policy and
 * all block and unit state (fetches are cheap; reads run unlocked).
 * A streaming cache owns the model's weight buffer: one session per model.
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

/* The weight bytes a budget must hold at least (same rule as create). */
uint64_t rb_wcache_stream_min_budget(const rb_wcache_stream *ws);

/* Ensures the blocks of tokens[0..n)'s embedding rows are resident (reads
 * them on this thread). 0, or -1 after an I/O error (message: see
 * rb_wcache_stream_error). Thread: the forward pass's. */
int rb_wcache_stream_rows(rb_wcache_stream *ws, const int32_t *tokens, uint32_t n);
/* Blocks until unit u (0..n_layers-1 a layer, n_layers the output) is
 * resident and held; lets go of the unit held before and lets the worker
 * read ahead. 0, or -1 after an I/O error. Thread: the forward pass's. */
int rb_wcache_stream_acquire(rb_wcache_stream *ws, uint32_t unit);

/* Between feeds: a new weight budget (KV grew or shrank under a memory
 * budget: a long chat gives up loop bytes to KV). Shrinking drops blocks
 * in the policy's eviction order (class: the stream, then the loop
 * prefix's end, the hot set last). RB_E_BUDGET below the minimum (nothing
 * changes). */
rb_status rb_wcache_stream_set_budget(rb_wcache_stream *ws, uint64_t bytes, rb_error *err);
/* Between feeds: drops every cached block (a trim to "complete"); they
 * stream back on use. Returns the bytes freed. */
uint64_t rb_wcache_stream_drop(rb_wcache_stream *ws);

void rb_wcache_stream_get_stats(const rb_wcache_stream *ws, rb_wcache_stream_stats *out);
/* The I/O error that made acquire/rows fail (copied into err), or RB_OK. */
rb_status rb_wcache_stream_error(const rb_wcache_stream *ws, rb_error *err);

#endif
