/*
 * metrics.h - the counters and gauges of `rebound serve` (what /metrics
 * shows) and the Prometheus text of them.
 *
 * Namespaces: every count of a request or a conversation is kept twice,
 * for the process (sv_metrics.v) and for the request's namespace (an entry
 * of sv_metrics.ns, created on first use, at most SV_NS_COUNT_MAX; later
 * namespaces share the last entry, named "~other"). /metrics shows a
 * caller its namespace's entry when there are namespaces, else the
 * process's (sv_metrics_get).
 *
 * Threads: one sv_metrics per server, written by the connection threads
 * (requests by endpoint and status, in flight) and the scheduler (tokens,
 * restores, TTFT, the memory gauges); every access holds its mu. Readers
 * take a copy (sv_metrics_get) and format that.
 */
#ifndef RB_SERVE_METRICS_H
#define RB_SERVE_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h"

#define SV_NS_COUNT_MAX 256

/* The HTTP endpoints, as /metrics counts them. */
typedef enum sv_endpoint {
    SV_EP_CHAT, SV_EP_COMPLETIONS, SV_EP_MODELS, SV_EP_HEALTH, SV_EP_METRICS, SV_EP_TOKENIZE,
    SV_EP_DETOKENIZE, SV_EP_APPLY_TEMPLATE, SV_EP_EMBEDDINGS, SV_EP_INPUT_TOKENS, SV_EP_OTHER, SV_EP_COUNT
} sv_endpoint;

/* Where a request found its conversation's KV when it was admitted (the
 * X-Rebound-Restore header): all of it in RAM, some in the compressed RAM
 * tier (none on storage), some on storage, a session reopened from its
 * file, a new conversation, or KV to compute again from the tokens (the
 * baseline, or pages a trim dropped). */
typedef enum sv_restore {
    SV_RESTORE_RESIDENT = 0,
    SV_RESTORE_COMPRESSED,
    SV_RESTORE_STORED,
    SV_RESTORE_FILE,
    SV_RESTORE_NEW,
    SV_RESTORE_RECOMPUTED,
    SV_RESTORE_COUNT
} sv_restore;
/* "resident", "compressed", "stored", "file", "new", "recomputed" (static) */
const char *sv_restore_name(sv_restore k);

/* What the store holds, for /metrics (convstore.c). */
typedef struct sv_mem_snapshot {
    uint64_t weights_bytes;
    uint64_t kv_resident_bytes, kv_compressed_bytes, kv_stored_bytes, kv_dropped_bytes;
    uint64_t scratch_bytes, other_bytes;
    uint64_t n_conv_open, n_conv_stored, n_conv_total;
    uint64_t disk_bytes;
    uint64_t pool_total_bytes, pool_over_bytes;   /* rb_pool_stats */
    uint64_t pool_trimmed_bytes, pool_weights_released_bytes;
    uint64_t pool_shared_kv_bytes; /* KV pages forks share, counted once */
    uint64_t pool_n_prefetches;    /* restores begun ahead of a feed */
    uint64_t pool_prefetch_granted_bytes, pool_prefetch_trimmed_bytes;
    uint64_t pool_leveled_trims, pool_level_line_bytes;
    uint64_t pool_shared_trims;    /* budget trims that took shared pages */
} sv_mem_snapshot;

#define SV_TTFT_BUCKETS 10

/* The scheduler's step times as it measures them (the process's gauges,
 * sv_metrics_set_steps): its estimates of prefill seconds per prompt token
 * and of one decode step, the last prefill chunk it chose, and the
 * longest gap between two decode steps while streams were decoding. */
typedef struct sv_step_gauges {
    double prefill_s_per_token, decode_step_s;
    uint64_t chunk_last_tokens;
    double decode_gap_max_s;
} sv_step_gauges;

typedef struct sv_counts {
    uint64_t requests[SV_EP_COUNT][5];  /* endpoint x status class (2xx..5xx, other) */
    uint64_t in_flight;
    uint64_t tokens_prompt, tokens_cached, tokens_completion;
    uint64_t restores[SV_RESTORE_COUNT];
    uint64_t conv_evicted, conv_closed, cancelled;
    uint64_t decode_passes_single;  /* decode steps of one stream */
    uint64_t decode_passes_multi;   /* of several streams in one forward pass */
    /* prefill passes (the scheduler's chunk choice, scheduler.c): alone (no
       stream waiting: up to n_batch tokens) or shared (cut to fit
       --max-stall-ms while streams wait), and their tokens */
    uint64_t prefill_chunks_alone, prefill_chunks_shared;
    uint64_t prefill_tokens_alone, prefill_tokens_shared;
    sv_step_gauges steps;
    uint64_t ttft_count, ttft_bucket[SV_TTFT_BUCKETS];
    double ttft_sum_s;
    sv_mem_snapshot mem;
} sv_counts;

typedef struct sv_ns_counts {
    char name[SV_NS_MAX + 1];
    sv_counts v;
} sv_ns_counts;

typedef struct sv_metrics {
    pthread_mutex_t mu;
    sv_counts v;                    /* the process's; under mu */
    sv_ns_counts *ns;               /* per namespace; under mu */
    size_t n_ns;
} sv_metrics;

void sv_metrics_init(sv_metrics *m);
void sv_metrics_deinit(sv_metrics *m);
/* The counter `field` of sv_counts += v, for the process and for the
 * namespace ns (NULL: the process only), under m->mu. */
#define sv_metrics_add(m, ns, field, v) \
    sv_metrics_add_at((m), (ns), offsetof(sv_counts, field), (v))
void sv_metrics_add_at(sv_metrics *m, const char *ns, size_t offset, uint64_t v);
/* One request of ns (NULL: none known yet) answered with status at ep. */
void sv_metrics_count_request(sv_metrics *m, const char *ns, sv_endpoint ep, unsigned status);
void sv_metrics_record_ttft(sv_metrics *m, const char *ns, double ttft_s);
/* The process's memory gauges, and per namespace its conversations
 * (n_conv_open, n_conv_stored, n_conv_total, disk_bytes of each entry of
 * per_ns, n of them). */
void sv_metrics_set_mem(sv_metrics *m, const sv_mem_snapshot *mem, const sv_ns_counts *per_ns,
                        size_t n);
/* The scheduler's step gauges (the process's). */
void sv_metrics_set_steps(sv_metrics *m, const sv_step_gauges *g);
/* A copy of the counts, taken under mu: the process's (ns NULL) or the
 * namespace's (all zero when it has none yet). */
void sv_metrics_get(sv_metrics *m, const char *ns, sv_counts *out);
/* The Prometheus text exposition of c into f (mem_budget: --mem-budget).
 * with_process 0 leaves out what is the process's, not a namespace's: in
 * flight, decode passes, prefill chunks and step times, memory and pool
 * gauges. */
void sv_metrics_write(const sv_counts *c, int with_process, uint64_t mem_budget_bytes, FILE *f);

#endif
