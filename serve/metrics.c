/*
 * metrics.c - the counters of `rebound serve` under one mutex, and their
 * Prometheus text (version 0.0.4). Memory: none beyond the struct.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

static const char *const ep_names[SV_EP_COUNT] = {"chat_completions", "completions", "models",
                                                  "health", "metrics", "tokenize", "detokenize",
                                                  "apply_template", "embeddings", "input_tokens",
                                                  "other"};
static const double ttft_le[SV_TTFT_BUCKETS] = {0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};

const char *sv_restore_name(sv_restore k)
{
    static const char *const names[] = {"resident", "compressed", "stored",
                                        "file",     "new",        "recomputed"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

void sv_metrics_init(sv_metrics *m)
{
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void sv_metrics_deinit(sv_metrics *m)
{
    free(m->ns);
    pthread_mutex_destroy(&m->mu);
}

/* ns's entry, created if new (under mu); NULL for ns NULL or no memory */
static sv_counts *ns_entry(sv_metrics *m, const char *ns)
{
    if (!ns)
        return NULL;
    for (size_t i = 0; i < m->n_ns; i++)
        if (!strcmp(m->ns[i].name, ns))
            return &m->ns[i].v;
    if (m->n_ns == SV_NS_COUNT_MAX)
        return &m->ns[m->n_ns - 1].v;
    if (m->n_ns % 16 == 0) {
        sv_ns_counts *q = realloc(m->ns, (m->n_ns + 16) * sizeof *q);
        if (!q)
            return NULL;
        m->ns = q;
    }
    sv_ns_counts *e = &m->ns[m->n_ns++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", m->n_ns == SV_NS_COUNT_MAX ? "~other" : ns);
    return &e->v;
}

void sv_metrics_add_at(sv_metrics *m, const char *ns, size_t offset, uint64_t v)
{
    pthread_mutex_lock(&m->mu);
    *(uint64_t *)((char *)&m->v + offset) += v;
    sv_counts *e = ns_entry(m, ns);
    if (e)
        *(uint64_t *)((char *)e + offset) += v;
    pthread_mutex_unlock(&m->mu);
}

void sv_metrics_count_request(sv_metrics *m, const char *ns, sv_endpoint ep, unsigned status)
{
    int cls = status >= 200 && status < 600 ? (int)(status / 100) - 2 : 4;
    if (cls < 0)
        cls = 4;
    pthread_mutex_lock(&m->mu);
    m->v.requests[ep][cls]++;
    sv_counts *e = ns_entry(m, ns);
    if (e)
        e->requests[ep][cls]++;
    pthread_mutex_unlock(&m->mu);
}

static void ttft_add(sv_counts *c, double ttft_s)
{
    c->ttft_count++;
    c->ttft_sum_s += ttft_s;
    for (int i = 0; i < SV_TTFT_BUCKETS; i++)
        if (ttft_s <= ttft_le[i])
            c->ttft_bucket[i]++;
}

void sv_metrics_record_ttft(sv_metrics *m, const char *ns, double ttft_s)
{
    pthread_mutex_lock(&m->mu);
    ttft_add(&m->v, ttft_s);
    sv_counts *e = ns_entry(m, ns);
    if (e)
        ttft_add(e, ttft_s);
    pthread_mutex_unlock(&m->mu);
}

void sv_metrics_set_mem(sv_metrics *m, const sv_mem_snapshot *mem, const sv_ns_counts *per_ns,
                        size_t n)
{
    pthread_mutex_lock(&m->mu);
    m->v.mem = *mem;
    for (size_t i = 0; i < m->n_ns; i++) {
        sv_mem_snapshot *d = &m->ns[i].v.mem;
        d->n_conv_open = d->n_conv_stored = d->n_conv_total = d->disk_bytes = 0;
    }
    for (size_t i = 0; i < n; i++) {
        sv_counts *e = ns_entry(m, per_ns[i].name);
        if (!e)
            continue;
        e->mem.n_conv_open += per_ns[i].v.mem.n_conv_open;
        e->mem.n_conv_stored += per_ns[i].v.mem.n_conv_stored;
        e->mem.n_conv_total += per_ns[i].v.mem.n_conv_total;
        e->mem.disk_bytes += per_ns[i].v.mem.disk_bytes;
    }
    pthread_mutex_unlock(&m->mu);
}

void sv_metrics_set_steps(sv_metrics *m, const sv_step_gauges *g)
{
    pthread_mutex_lock(&m->mu);
    m->v.steps = *g;
    pthread_mutex_unlock(&m->mu);
}

void sv_metrics_get(sv_metrics *m, const char *ns, sv_counts *out)
{
    pthread_mutex_lock(&m->mu);
    if (!ns) {
        *out = m->v;
    } else {
        memset(out, 0, sizeof *out);
        for (size_t i = 0; i < m->n_ns; i++)
            if (!strcmp(m->ns[i].name, ns))
                *out = m->ns[i].v;
    }
    pthread_mutex_unlock(&m->mu);
}

void sv_metrics_write(const sv_counts *m, int with_process, uint64_t mem_budget_bytes, FILE *f)
{
    static const char *const cls[] = {"2xx", "3xx", "4xx", "5xx", "other"};
    fprintf(f, "# HELP rebound_requests_total HTTP requests answered, by endpoint and status class.\n"
               "# TYPE rebound_requests_total counter\n");
    for (int e = 0; e < SV_EP_COUNT; e++)
        for (int k = 0; k < 5; k++)
            fprintf(f, "rebound_requests_total{endpoint=\"%s\",code=\"%s\"} %" PRIu64 "\n",
                    ep_names[e], cls[k], m->requests[e][k]);
    if (with_process) {
        fprintf(f, "# HELP rebound_requests_in_flight Generation requests queued or running.\n"
                   "# TYPE rebound_requests_in_flight gauge\nrebound_requests_in_flight %" PRIu64 "\n",
                m->in_flight);
    }
    fprintf(f, "# HELP rebound_requests_cancelled_total Requests whose client left before the end.\n"
               "# TYPE rebound_requests_cancelled_total counter\n"
               "rebound_requests_cancelled_total %" PRIu64 "\n", m->cancelled);
    fprintf(f, "# HELP rebound_tokens_total Tokens: prompt (all), cached (of the prompt, not "
               "computed again), completion.\n# TYPE rebound_tokens_total counter\n"
               "rebound_tokens_total{kind=\"prompt\"} %" PRIu64 "\n"
               "rebound_tokens_total{kind=\"cached\"} %" PRIu64 "\n"
               "rebound_tokens_total{kind=\"completion\"} %" PRIu64 "\n",
            m->tokens_prompt, m->tokens_cached, m->tokens_completion);
    if (with_process) {
        fprintf(f, "# HELP rebound_decode_passes_total Decode steps: forward passes of one "
                   "stream, and of several concurrent streams in one pass.\n"
                   "# TYPE rebound_decode_passes_total counter\n"
                   "rebound_decode_passes_total{streams=\"1\"} %" PRIu64 "\n"
                   "rebound_decode_passes_total{streams=\"several\"} %" PRIu64 "\n",
                m->decode_passes_single, m->decode_passes_multi);
        fprintf(f, "# HELP rebound_prefill_chunks_total Prefill passes: alone (no stream "
                   "waiting for a token: up to -b tokens), shared (cut to keep the waiting "
                   "streams' gap under --max-stall-ms).\n"
                   "# TYPE rebound_prefill_chunks_total counter\n"
                   "rebound_prefill_chunks_total{mode=\"alone\"} %" PRIu64 "\n"
                   "rebound_prefill_chunks_total{mode=\"shared\"} %" PRIu64 "\n"
                   "# HELP rebound_prefill_chunk_tokens_total Prompt tokens of those passes.\n"
                   "# TYPE rebound_prefill_chunk_tokens_total counter\n"
                   "rebound_prefill_chunk_tokens_total{mode=\"alone\"} %" PRIu64 "\n"
                   "rebound_prefill_chunk_tokens_total{mode=\"shared\"} %" PRIu64 "\n"
                   "# HELP rebound_prefill_chunk_last_tokens The last prefill chunk chosen.\n"
                   "# TYPE rebound_prefill_chunk_last_tokens gauge\n"
                   "rebound_prefill_chunk_last_tokens %" PRIu64 "\n",
                m->prefill_chunks_alone, m->prefill_chunks_shared, m->prefill_tokens_alone,
                m->prefill_tokens_shared, m->steps.chunk_last_tokens);
        fprintf(f, "# HELP rebound_step_seconds The scheduler's estimates from its last steps: "
                   "prefill seconds per prompt token, one decode step of all streams.\n"
                   "# TYPE rebound_step_seconds gauge\n"
                   "rebound_step_seconds{kind=\"prefill_per_token\"} %.6g\n"
                   "rebound_step_seconds{kind=\"decode\"} %.6g\n"
                   "# HELP rebound_decode_gap_max_seconds The longest time between two decode "
                   "steps while streams were decoding (since the start).\n"
                   "# TYPE rebound_decode_gap_max_seconds gauge\n"
                   "rebound_decode_gap_max_seconds %.6f\n",
                m->steps.prefill_s_per_token, m->steps.decode_step_s, m->steps.decode_gap_max_s);
    }
    fprintf(f, "# HELP rebound_conversation_restores_total Where a request found its "
               "conversation's KV: resident (all in RAM), compressed (some in the compressed "
               "RAM tier), stored (some on storage), file (reopened from its session file), "
               "new, recomputed (computed again from its tokens).\n"
               "# TYPE rebound_conversation_restores_total counter\n");
    for (int k = SV_RESTORE_RESIDENT; k <= SV_RESTORE_RECOMPUTED; k++)
        fprintf(f, "rebound_conversation_restores_total{path=\"%s\"} %" PRIu64 "\n",
                sv_restore_name((sv_restore)k), m->restores[k]);
    fprintf(f, "# HELP rebound_conversations Conversations by where they are: open (a session "
               "in RAM), stored (a session file), total.\n# TYPE rebound_conversations gauge\n"
               "rebound_conversations{state=\"open\"} %" PRIu64 "\n"
               "rebound_conversations{state=\"stored\"} %" PRIu64 "\n"
               "rebound_conversations{state=\"total\"} %" PRIu64 "\n",
            m->mem.n_conv_open, m->mem.n_conv_stored, m->mem.n_conv_total);
    fprintf(f, "# HELP rebound_conversations_deleted_total Conversations deleted to keep the "
               "count and disk limits, oldest first.\n"
               "# TYPE rebound_conversations_deleted_total counter\n"
               "rebound_conversations_deleted_total %" PRIu64 "\n", m->conv_evicted);
    if (with_process)
        fprintf(f, "# HELP rebound_conversations_closed_total Idle sessions closed (kept in "
                   "their file) for --max-open or --mem-budget.\n"
                   "# TYPE rebound_conversations_closed_total counter\n"
                   "rebound_conversations_closed_total %" PRIu64 "\n", m->conv_closed);
    if (with_process) {
        fprintf(f, "# HELP rebound_memory_bytes Memory of the open sessions by kind and tier "
                   "(weights counted once: the model's one buffer).\n"
                   "# TYPE rebound_memory_bytes gauge\n"
                   "rebound_memory_bytes{kind=\"weights\",tier=\"resident\"} %" PRIu64 "\n"
                   "rebound_memory_bytes{kind=\"kv\",tier=\"resident\"} %" PRIu64 "\n"
                   "rebound_memory_bytes{kind=\"kv\",tier=\"compressed\"} %" PRIu64 "\n"
                   "rebound_memory_bytes{kind=\"kv\",tier=\"stored\"} %" PRIu64 "\n"
                   "rebound_memory_bytes{kind=\"kv\",tier=\"dropped\"} %" PRIu64 "\n"
                   "rebound_memory_bytes{kind=\"scratch\",tier=\"resident\"} %" PRIu64 "\n"
                   "rebound_memory_bytes{kind=\"other\",tier=\"resident\"} %" PRIu64 "\n",
                m->mem.weights_bytes, m->mem.kv_resident_bytes, m->mem.kv_compressed_bytes,
                m->mem.kv_stored_bytes, m->mem.kv_dropped_bytes, m->mem.scratch_bytes, m->mem.other_bytes);
        fprintf(f, "# HELP rebound_pool_bytes The memory pool (one budget over the weights and "
                   "every session): total as it counts, over the budget after its last check, "
                   "taken from sessions, weights released (the last two since the start), the KV "
                   "pages forked conversations share (counted once; in total).\n"
                   "# TYPE rebound_pool_bytes gauge\n"
                   "rebound_pool_bytes{what=\"total\"} %" PRIu64 "\n"
                   "rebound_pool_bytes{what=\"over\"} %" PRIu64 "\n"
                   "rebound_pool_bytes{what=\"trimmed\"} %" PRIu64 "\n"
                   "rebound_pool_bytes{what=\"weights_released\"} %" PRIu64 "\n"
                   "rebound_pool_bytes{what=\"shared_kv\"} %" PRIu64 "\n",
                m->mem.pool_total_bytes, m->mem.pool_over_bytes, m->mem.pool_trimmed_bytes,
                m->mem.pool_weights_released_bytes, m->mem.pool_shared_kv_bytes);
        fprintf(f, "# HELP rebound_pool_prefetches_total Restores the pool began ahead of a "
                   "feed: a conversation admitted (its restore starts before its prompt is "
                   "fed) or, while the server is idle, the one most likely to return next.\n"
                   "# TYPE rebound_pool_prefetches_total counter\n"
                   "rebound_pool_prefetches_total %" PRIu64 "\n"
                   "# HELP rebound_pool_prefetch_bytes_total What those restores were granted, "
                   "and what idle background conversations gave up for an admitted one's.\n"
                   "# TYPE rebound_pool_prefetch_bytes_total counter\n"
                   "rebound_pool_prefetch_bytes_total{what=\"granted\"} %" PRIu64 "\n"
                   "rebound_pool_prefetch_bytes_total{what=\"trimmed\"} %" PRIu64 "\n",
                m->mem.pool_n_prefetches, m->mem.pool_prefetch_granted_bytes,
                m->mem.pool_prefetch_trimmed_bytes);
        fprintf(f, "# HELP rebound_pool_leveled_trims_total Budget trims that took room from "
                   "the idle conversations leveled: the ones holding the most KV gave first, "
                   "down to one line.\n"
                   "# TYPE rebound_pool_leveled_trims_total counter\n"
                   "rebound_pool_leveled_trims_total %" PRIu64 "\n"
                   "# HELP rebound_pool_level_line_bytes The KV in RAM each trimmed "
                   "conversation kept at the last leveled trim (its first layers).\n"
                   "# TYPE rebound_pool_level_line_bytes gauge\n"
                   "rebound_pool_level_line_bytes %" PRIu64 "\n"
                   "# HELP rebound_pool_shared_trims_total Budget trims that had to take KV "
                   "pages conversations share (a common prompt's): those go after every "
                   "conversation's own KV.\n"
                   "# TYPE rebound_pool_shared_trims_total counter\n"
                   "rebound_pool_shared_trims_total %" PRIu64 "\n",
                m->mem.pool_leveled_trims, m->mem.pool_level_line_bytes,
                m->mem.pool_shared_trims);
    }
    if (with_process)
        fprintf(f, "# HELP rebound_memory_budget_bytes --mem-budget (0: none).\n"
                   "# TYPE rebound_memory_budget_bytes gauge\nrebound_memory_budget_bytes %"
                   PRIu64 "\n", mem_budget_bytes);
    fprintf(f, "# HELP rebound_sessions_disk_bytes Bytes of the conversations' session files "
               "and of the prefix files they link to (each once).\n"
               "# TYPE rebound_sessions_disk_bytes gauge\nrebound_sessions_disk_bytes %" PRIu64 "\n",
            m->mem.disk_bytes);
    fprintf(f, "# HELP rebound_ttft_seconds Time from a request's arrival to its first "
               "token.\n# TYPE rebound_ttft_seconds histogram\n");
    for (int i = 0; i < SV_TTFT_BUCKETS; i++)
        fprintf(f, "rebound_ttft_seconds_bucket{le=\"%g\"} %" PRIu64 "\n", ttft_le[i], m->ttft_bucket[i]);
    fprintf(f, "rebound_ttft_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n"
               "rebound_ttft_seconds_sum %.6f\nrebound_ttft_seconds_count %" PRIu64 "\n",
            m->ttft_count, m->ttft_sum_s, m->ttft_count);
}
