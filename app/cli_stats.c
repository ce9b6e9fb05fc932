/*
 * cli_stats.c - prints a session's memory by category and tier
 * (rb_session_stats) for `run --stats`, `switch` and `chat`'s /stats.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

void rb_cli_print_stats(FILE *f, const rb_session_stats *s)
{
    char a[32], b[32], c[32], d[32];
    fprintf(f, "memory: %s in RAM", rb_cli_bytes(s->total_bytes, a, sizeof a));
    if (s->budget_bytes)
        fprintf(f, " (budget %s)", rb_cli_bytes(s->budget_bytes, b, sizeof b));
    fprintf(f, "\n  weights      %s resident, %s evicted (%" PRIu32 " layers, in the model file)\n",
            rb_cli_bytes(s->weights_bytes, a, sizeof a),
            rb_cli_bytes(s->weights_evicted_bytes, b, sizeof b), s->n_layers_weights_evicted);
    if (s->weights_streaming) {
        char e[32], g[32];
        fprintf(f, "  weights stream (%s): budget %s (min %s), loop N %s per token, pinned "
                "S %s, window %s, most held %s\n", s->weights_policy,
                rb_cli_bytes(s->weights_budget_bytes, a, sizeof a),
                rb_cli_bytes(s->weights_min_budget_bytes, b, sizeof b),
                rb_cli_bytes(s->weights_loop_bytes, c, sizeof c),
                rb_cli_bytes(s->weights_pinned_loop_bytes, d, sizeof d),
                rb_cli_bytes(s->weights_window_bytes, e, sizeof e),
                rb_cli_bytes(s->weights_max_resident_bytes, g, sizeof g));
        double per = s->weights_passes ? (double)s->weights_read_bytes / s->weights_passes : 0;
        fprintf(f, "    read %s in %" PRIu64 " requests over %" PRIu64 " passes (%s per pass), "
                "hits %" PRIu64 " misses %" PRIu64 ", reading %.1f ms, forward pass waited "
                "%.1f ms\n", rb_cli_bytes(s->weights_read_bytes, a, sizeof a), s->weights_reads,
                s->weights_passes, rb_cli_bytes((uint64_t)per, b, sizeof b), s->weights_hits,
                s->weights_misses, s->weights_io_s * 1e3, s->weights_wait_s * 1e3);
        if (s->weights_rebalances)
            fprintf(f, "    re-balanced %" PRIu64 " times for KV: the weights gave up %s of "
                    "cache (the loop prefix shrinks, more streams per token)\n",
                    s->weights_rebalances, rb_cli_bytes(s->weights_given_up_bytes, a, sizeof a));
    }
    fprintf(f, "  KV raw       %s (%" PRIu32 " pages)\n", rb_cli_bytes(s->kv_raw_bytes, a, sizeof a),
            s->n_kv_pages[RB_TIER_RESIDENT]);
    fprintf(f, "  KV compressed %s holding %s (%" PRIu32 " pages)\n",
            rb_cli_bytes(s->kv_compressed_bytes, a, sizeof a),
            rb_cli_bytes(s->kv_compressed_raw_bytes, b, sizeof b),
            s->n_kv_pages[RB_TIER_COMPRESSED]);
    fprintf(f, "  KV stored    %s on storage (%" PRIu32 " pages; %s)\n",
            rb_cli_bytes(s->kv_stored_bytes, a, sizeof a), s->n_kv_pages[RB_TIER_STORED],
            s->storage_io ? s->storage_io : "-");
    fprintf(f, "  KV dropped   %s (%" PRIu32 " pages, recomputed from the tokens)\n",
            rb_cli_bytes(s->kv_dropped_bytes, a, sizeof a), s->n_kv_pages[RB_TIER_DROPPED]);
    fprintf(f, "  scratch      %s; other %s\n", rb_cli_bytes(s->scratch_bytes, a, sizeof a),
            rb_cli_bytes(s->other_bytes, b, sizeof b));
    if (s->restore_bytes_io || s->restore_bytes_decoded || s->restore_recomputed_tokens)
        fprintf(f, "  last restore: storage %s in %.1f ms, decode %s in %.1f ms, forward pass "
                "waited %.1f ms, %" PRIu32 " tokens recomputed\n",
                rb_cli_bytes(s->restore_bytes_io, c, sizeof c), s->restore_io_s * 1e3,
                rb_cli_bytes(s->restore_bytes_decoded, d, sizeof d), s->restore_decode_s * 1e3,
                s->restore_wait_s * 1e3, s->restore_recomputed_tokens);
    if (s->decode_bytes_per_s > 0 || s->storage_bytes_per_s > 0)
        fprintf(f, "  tier split by decode %.2f GB/s vs storage %.2f GB/s\n",
                s->decode_bytes_per_s / 1e9, s->storage_bytes_per_s / 1e9);
    if (s->file_commits)
        fprintf(f, "  session file: %" PRIu64 " commits, %" PRIu64 " pages written, %.1f ms "
                "committing%s\n", s->file_commits, s->file_pages_written,
                s->file_commit_s * 1e3,
                s->file_status != RB_OK ? " (the last one failed: not saved since)" : "");
    if (s->n_disk_full || s->n_spill_damaged)
        fprintf(f, "  %" PRIu64 " pages kept in RAM (disk full), %" PRIu64 " spilled pages "
                "damaged and recomputed; %.2f MiB over the budget\n", s->n_disk_full,
                s->n_spill_damaged, (double)s->budget_over_bytes / (1024.0 * 1024.0));
}
