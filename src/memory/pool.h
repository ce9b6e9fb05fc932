/*
 * pool.h - the memory pool: one budget over a model's weights and the KV,
 * scratch and tables of every session of that model that joined it, with
 * the accounts and the order in which memory is taken back.
 *
 * The pool knows members, bytes, priorities and recency; it does not know
 * sessions (a member's handle is only returned, by rb_pool_next_to_close).
 * A member (a session, session_memory.c) joins with its residency manager
 * (residency.h: the memory-layer object that owns its KV tiers) and
 * publishes the bytes it holds after each change, from the memory
 * modules' own numbers. The pool trims a member's KV by calling its
 * residency (rb_residency_pool_trim) and releases the weights through the
 * model's weight cache (wcache.h, rb_wcache_release_last): every call
 * goes down, none back into the session (docs/ARCHITECTURE.md, the
 * budget's path).
 *
 * The order (rb_pool_enforce): background members before foreground ones,
 * each class leveled (pool.c, trim_leveled: the fullest give first, down to
 * one line) and then least recently used first for what a held member
 * could not give, the member that asks last (it is the most
 * recently used); within a member its last layers first, to storage
 * (residency.c: a budget trim frees whole pages, compressed ones too);
 * the pages several members share (a common prompt's) only after every
 * member's own KV, since their RAM leaves with the last holder and every
 * holder would read them back; the weights last, last layer first, a
 * layer a forward pass computes skipped. A member's residency held by
 * another thread (a session operation in progress: rb_residency_hold) is
 * not trimmed at once: the residency records the request, which that
 * thread serves at its layer gate, before its next batch, or before it
 * lets go; the pool goes on with the next member.
 *
 * Threads: every function may be called from any thread. The member list,
 * priorities, recency and counters change under the pool's mutex; a
 * member's published bytes are atomic (read without it; the pool lowers
 * them by what a trim it ran freed, while nobody holds the member). The
 * mutex is held while members are trimmed, so a member cannot leave while
 * it is being trimmed. Lock order: the pool's mutex, then a member
 * residency's; a residency never calls the pool, and a session never
 * calls the pool while its residency is being trimmed (rb_residency_hold
 * waits for that trim without holding any pool lock).
 */
#ifndef RB_POOL_H
#define RB_POOL_H

#include <stdint.h>

#include "model.h"
#include "rebound.h"
#include "residency.h"
#include "wcache.h"

typedef struct rb_pool_member rb_pool_member;

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
/* The account of the KV pages the pool's members share (kvcache.h): the
 * pool counts them once, in its total; a cache that shares takes a
 * reference of it (rb_kvcache_share_slot), so it outlives the pool if it
 * must. */
rb_kvshare *rb_pool_kvshare(rb_pool *pool);

/* res: the member's residency manager, which the pool trims (borrowed:
 * it must outlive the membership, rb_pool_leave first; NULL: nothing of
 * the member is trimmed). handle: what rb_pool_next_to_close returns for
 * this member (the app's rb_session). Errors: RB_E_NOMEM. */
rb_status rb_pool_join(rb_pool *pool, rb_residency *res, rb_priority priority,
                       rb_session *handle, rb_pool_member **out, rb_error *err);
void rb_pool_leave(rb_pool_member *m);
/* The member's residency manager was replaced (session_debug.h's store
 * swap): the pool trims the new one (NULL while there is none). */
void rb_pool_member_set_residency(rb_pool_member *m, rb_residency *res);
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
 * With extra (and not self_too) the others' trims hand the page buffers
 * they free to self's residency for its restore (rb_residency_open_spare).
 * Returns the bytes still over the budget afterwards (0: within).
 */
uint64_t rb_pool_enforce(rb_pool *pool, rb_pool_member *self, uint64_t extra, int self_too,
                         int weights_too);

/*
 * Restoring ahead of time (a prefetch, session_memory.c). grant: self
 * (whose session holds it, its bytes just published) asks for `want`
 * bytes; the pool grants what its budget has free, and for a foreground
 * session (trim_background) first makes room: the other members' open
 * prefetches stop, then background members are trimmed, leveled as above
 * (never a foreground one), their freed page buffers going to self's
 * prefetch (rb_residency_open_spare). The grant is reserved in the
 * total at once. set_prefetch: the bytes the member's prefetch planned
 * (its reservation from now on; 0: none, or the prefetch ended and the
 * session published what it holds). Any trim of the pool stops every open
 * prefetch of an idle member first (pool.c, cancel_prefetches).
 */
uint64_t rb_pool_grant_prefetch(rb_pool *pool, rb_pool_member *self, uint64_t want,
                                int trim_background);
void rb_pool_member_set_prefetch(rb_pool_member *m, uint64_t planned);
/* rb_pool_prefetch_next's choice: the handles of the members with
 * something to restore and no open prefetch, most likely to return next
 * first (feeds / (1 + the others' feeds since its last)), at most max. */
uint32_t rb_pool_prefetch_candidates(rb_pool *pool, rb_session **out, uint32_t max);

/* The pool's budget in bytes (0: none; rb_pool_set_budget's last value;
 * the stats' budget_bytes). Any thread. */
uint64_t rb_pool_budget(const rb_pool *pool);
/* What the pool counts besides self's bytes: the weights it counts, its
 * base and the other members' bytes (a streaming member's weights share
 * is the budget less this, its run state and its KV). */
uint64_t rb_pool_others_bytes(rb_pool *pool, const rb_pool_member *self);

#endif
