/*
 * pool.h - the memory pool: one budget over a model's weights and the KV,
 * scratch and tables of every session of that model that joined it, with
 * the accounts and the order in which memory is taken back.
 *
 * The pool knows members, bytes, priorities and recency; it does not know
 * sessions (a member's handle is only returned, by rb_pool_next_to_close).
 * A member (a session, session_memory.c) publishes the bytes it holds
 * after each change, from the memory modules' own numbers, and gives the
 * pool a trim function - the one call that still goes up, out of the
 * memory module (docs/ARCHITECTURE.md, the budget's path); the weights are
 * the model's weight cache (wcache.h), shared by all members, released by
 * rb_wcache_release_last.
 *
 * The order (rb_pool_enforce): background members before foreground ones,
 * least recently used first, the member that asks last (it is the most
 * recently used); within a member its last layers first, to storage
 * (residency.c: a budget trim frees whole pages, compressed ones too);
 * the weights last, last layer first, a layer a forward pass computes
 * skipped. A member busy on another thread cannot be trimmed at once: its
 * trim function posts the request, which that thread serves at its next
 * layer boundary; the pool goes on with the next member.
 *
 * Threads: every function may be called from any thread. The member list,
 * priorities, recency and counters change under the pool's mutex; a
 * member's published bytes are atomic (read without it). The mutex is held
 * while members are trimmed, so a member cannot leave while it is being
 * trimmed; a member's trim function must not call back into the pool and
 * must not wait for a thread that may be waiting for the pool (it takes
 * the session only if it is free).
 */
#ifndef RB_POOL_H
#define RB_POOL_H

#include <stdint.h>

#include "model.h"
#include "rebound.h"
#include "wcache.h"

typedef struct rb_pool_member rb_pool_member;

/* Frees up to `bytes` (RB_TRIM_BYTES) or what `level` names of the
 * member's own memory - its KV, never the model's weights, which the pool
 * releases itself - and returns the bytes freed now (0 when the member is
 * busy on another thread and the request was posted instead). Called with
 * the pool's mutex held, from any thread (the member's own included). */
typedef uint64_t (*rb_pool_trim_fn)(void *ctx, uint64_t bytes, rb_trim_level level);

/* rb_pool_create (rebound.h) for a session's own pool, without the
 * checks of the public call. Members hold a reference: the pool is freed
 * when its owner destroyed it and its last member left. */
rb_status rb_pool_create_impl(rb_model *model, uint64_t budget_bytes, rb_pool **out,
                              rb_error *err);
/* The weights' bytes the pool counts: the model's weight cache when the
 * weights are loaded into RAM (NULL: a mapped or streamed model; then
 * fixed_bytes, which may be 0 when a member counts them itself). */
void rb_pool_set_weights(rb_pool *pool, rb_wcache *weights, uint64_t fixed_bytes);
rb_model *rb_pool_model(const rb_pool *pool);

/* handle: what rb_pool_next_to_close returns for this member (the app's
 * rb_session). */
rb_status rb_pool_join(rb_pool *pool, void *ctx, rb_pool_trim_fn trim, rb_priority priority,
                       rb_session *handle, rb_pool_member **out, rb_error *err);
void rb_pool_leave(rb_pool_member *m);
/* The member's bytes now (KV in RAM in any form, scratch, tables; and a
 * streaming member's block cache). */
void rb_pool_member_set_bytes(rb_pool_member *m, uint64_t bytes);
/* The member was used now (a feed): it becomes the most recently used. */
void rb_pool_member_touch(rb_pool_member *m);
void rb_pool_member_set_priority(rb_pool_member *m, rb_priority priority);
rb_priority rb_pool_member_priority(const rb_pool_member *m);

/*
 * Brings the pool within its budget, counting `extra` more bytes that
 * `self` is about to take (its next feed's growth; 0 after a feed). self
 * (may be NULL) is trimmed last among the members, and only when
 * self_too; the weights go after every member's KV when weights_too.
 * Returns the bytes still over the budget afterwards (0: within).
 */
uint64_t rb_pool_enforce(rb_pool *pool, rb_pool_member *self, uint64_t extra, int self_too,
                         int weights_too);

/* The pool's budget in bytes (0: none; rb_pool_set_budget's last value;
 * the stats' budget_bytes). Any thread. */
uint64_t rb_pool_budget(const rb_pool *pool);
/* What the pool counts besides self's bytes: the weights it counts, its
 * base and the other members' bytes (a streaming member's weights share
 * is the budget less this, its run state and its KV). */
uint64_t rb_pool_others_bytes(rb_pool *pool, const rb_pool_member *self);

#endif
