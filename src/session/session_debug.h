/*
 * session_debug.h - the few inside views of an rb_session that tools,
 * tests, benchmarks and fuzzers need and the public API (rebound.h) does
 * not give: the KV cache (rebound kvquality round-trips every resident
 * page through the KV codec; bench_kv captures real KV pages), the spill
 * store and the residency manager (fault tests), and the storage worker's
 * counters. Nothing outside src/session/ sees struct rb_session: these
 * calls are the whole of what they may touch.
 *
 * Touching the KV cache between feeds is allowed as long as the pages'
 * geometry is kept: the forward pass reads K/V only through the page
 * table. A page restored from the spill keeps its copy there
 * (residency.c), so a tool that rewrites a page's contents after a restore
 * must rewind past it first (the tools here never trim).
 *
 * Threads: like the public calls, one thread at a time per session, and
 * never during a call on it (a feed, a save).
 */
#ifndef RB_SESSION_DEBUG_H
#define RB_SESSION_DEBUG_H

#include <stddef.h>
#include <stdint.h>

#include "kvcache.h"
#include "rebound.h"
#include "residency.h"
#include "session_writer.h"
#include "store.h"

struct rb_os;

/* The session's KV cache (pages resident for positions [0, n_tokens)). */
rb_kvcache *rb_session_kvcache(rb_session *s);

/* Positions whose K/V exists in some tier (<= rb_session_n_tokens; less
 * after an open from a file that did not hold every page). */
size_t rb_session_debug_kv_valid(const rb_session *s);
/* Positions the last feed recomputed (evicted, dropped or not saved). */
uint32_t rb_session_debug_recomputed_tokens(const rb_session *s);

/* Takes the session as a public call does (waits for one running on
 * another thread), and lets it go (serving the trims posted meanwhile):
 * a test holds it to make another thread's rb_session_trim post. */
void rb_session_debug_hold(rb_session *s);
void rb_session_debug_release(rb_session *s);

/* The memory wiring's parts (NULL when the session has none). */
rb_residency *rb_session_debug_residency(rb_session *s);
rb_store *rb_session_debug_store(rb_session *s);
/* Replaces the spill store with `store` (taken over) and rebuilds the
 * residency manager over it with params rp, before anything was trimmed
 * (fault tests swap in a store whose syscalls fail). On failure the
 * session has no residency manager (and must not be fed again; every
 * trim fails: test_session_trim uses that), and `store` is the session's,
 * closed when it is destroyed. */
rb_status rb_session_debug_swap_store(rb_session *s, rb_store *store,
                                      const rb_residency_params *rp, rb_error *err);

/* The session file's syscalls from the next bind on (NULL: the default);
 * os must outlive the binding. Tests slow or fail them. */
void rb_session_debug_set_file_os(rb_session *s, const struct rb_os *os);
/* Tokens of the state the file holds (what a kill -9 leaves). */
size_t rb_session_debug_file_tokens_committed(const rb_session *s);
/* Waits until the storage worker committed what it was handed (no-op
 * without one). */
void rb_session_debug_wait_writer(rb_session *s);
/* The storage worker's counters (zeros when none runs), and the feeds'
 * hand-over cost: their count, total and longest (seconds). */
void rb_session_debug_writer_stats(rb_session *s, rb_session_writer_stats *out);
void rb_session_debug_handover(const rb_session *s, uint64_t *n, double *total_s,
                               double *max_s);

#endif
