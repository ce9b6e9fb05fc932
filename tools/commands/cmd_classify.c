/*
 * cmd_classify.c - `rebound classify TRACE`: every block of a trace labelled
 * SEQ, HOT or LOOP, online (Algorithm 1, as a cache would see it) and
 * offline (from the whole trace); bytes per class and per file, the loop
 * length N per token, the hot set's files, and the metadata cost.
 * A tool subcommand: uses the internal headers of trace and classify.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "classify_offline.h"
#include "cli.h"
#include "trace.h"

int rb_cmd_classify(int argc, char **argv)
{
    const char *path = NULL;
    int n_pos = 0;
    const rb_opt opts[] = {{0}};
    const rb_cli_cmd cmd = {
        "classify", "TRACE",
        "Every block of TRACE (from `rebound trace` or `rebound run --trace`; the\n"
        "format: tools/analysis/trace.h) labelled SEQ, HOT or LOOP, online (Algorithm 1)\n"
        "and offline.",
        opts, NULL, &path, 1, &n_pos, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (n_pos > 1)
        return rb_cli_usage_error("classify", "give one trace", NULL);
    if (!path)
        return rb_cli_usage_error("classify", "no trace given", NULL);
    rb_trace t;
    rb_block_stream s;
    if (rb_cli_load_trace("classify", path, &t, &s))
        return 1;
    rb_classify_report r;
    rb_error err;
    if (rb_classify_run(&s, &r, &err) != RB_OK) {
        rb_block_stream_free(&s);
        rb_trace_free(&t);
        return rb_cli_fail("classify", err.message, NULL);
    }
    char b1[32], b2[32], b3[32];
    printf("trace %s: %zu records, %" PRIu32 " files, %zu block accesses (4 KiB), %zu token spans\n",
           path, t.n_recs, t.n_files, s.n, s.n_tok);
    printf("\n| class | bytes (offline) | bytes (Algorithm 1, class at last access) | "
           "accesses (Algorithm 1, at the time) |\n|---|---|---|---|\n");
    for (int c = RB_CLASS_SEQ; c <= RB_CLASS_LOOP; c++)
        printf("| %s | %s | %s | %" PRIu64 " |\n", rb_class_name(c),
               rb_cli_bytes(r.offline_bytes[c], b1, sizeof b1),
               rb_cli_bytes(r.online_bytes[c], b2, sizeof b2), r.online_accesses[c]);
    printf("\nper file (offline labels):\n| file | SEQ | HOT | LOOP |\n|---|---|---|---|\n");
    for (uint32_t f = 0; f < r.n_files; f++) {
        char b4[32];
        if (!r.file_bytes[f][1] && !r.file_bytes[f][2] && !r.file_bytes[f][3])
            continue;
        printf("| %s | %s | %s | %s |\n", t.files[f].path,
               rb_cli_bytes(r.file_bytes[f][1], b1, sizeof b1),
               rb_cli_bytes(r.file_bytes[f][2], b2, sizeof b2),
               rb_cli_bytes(r.file_bytes[f][3], b4, sizeof b4));
    }
    printf("\nloop length N per token: ");
    if (r.n_tokens)
        printf("min %s, mean %s, max %s over %zu token spans\n",
               rb_cli_bytes(r.loop_min, b1, sizeof b1),
               rb_cli_bytes((uint64_t)r.loop_mean, b2, sizeof b2),
               rb_cli_bytes(r.loop_max, b3, sizeof b3), r.n_tokens);
    else
        printf("%s (no token marks in this trace: all LOOP blocks)\n",
               rb_cli_bytes(r.loop_bytes, b1, sizeof b1));
    printf("hot set: %s", rb_cli_bytes(r.offline_bytes[RB_CLASS_HOT], b1, sizeof b1));
    int any = 0;
    for (uint32_t f = 0; f < r.n_files; f++)
        if (r.file_bytes[f][RB_CLASS_HOT]) {
            printf("%s%s (%s)", any ? ", " : " in ", t.files[f].path,
                   rb_cli_bytes(r.file_bytes[f][RB_CLASS_HOT], b2, sizeof b2));
            any = 1;
        }
    printf("\n");
    uint64_t blocks = 0;
    for (int c = 1; c < 4; c++)
        blocks += r.offline_bytes[c] / RB_TRACE_BLOCK;
    printf("\nmetadata: Algorithm 1 keeps 4 B per block (run id) + 9 B per live run: at most %s for these %"
           PRIu64 " blocks; a cache keeps 8 B per cached 4 KiB block (two u32 links): %s per "
           "512 MiB (the paper: about 1 MB per 512 MB)\n",
           rb_cli_bytes(rb_classify_online_bytes((uint32_t)blocks), b1, sizeof b1), blocks,
           rb_cli_bytes((512ull << 20) / 4096 * 8, b2, sizeof b2));
    rb_classify_report_free(&r);
    rb_block_stream_free(&s);
    rb_trace_free(&t);
    return 0;
}
