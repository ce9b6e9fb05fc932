/*
 * test_sim.c - the simulator: exact counts and merged-request I/O time on a
 * hand-made trace, the next-use index, class within 5% of OPT on a
 * synthetic model app's trace at every cache size from 10% to 100% of the
 * loop, the SVG plot, and bad parameters.
 */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "sim.h"
#include "trace.h"

static rb_sim_params params(void)
{
    rb_sim_params sp;
    memset(&sp, 0, sizeof sp);
    rb_error err;
    CHECK(rb_profile_get("custom", &sp.profile, &err) == RB_OK);
    sp.profile.bw_bytes_per_s = 1 << 20; /* 1 MiB/s */
    sp.profile.latency_s = 1e-3;
    sp.profile.request_bytes = 16384;    /* 4 blocks */
    return sp;
}

static void hand_made(void)
{
    rb_trace t;
    rb_trace_init(&t);
    rb_error err;
    uint32_t f;
    CHECK(rb_trace_add_file(&t, "m.bin", 65536, &f, &err) == RB_OK);
    for (int tok = 0; tok < 2; tok++) {
        rb_trace_rec r = {0, 0, 32768, tok, f, RB_PHASE_DECODE}; /* blocks 0..7 */
        CHECK(rb_trace_add(&t, &r, &err) == RB_OK);
    }
    rb_block_stream s;
    CHECK(rb_block_stream_build(&t, &s, &err) == RB_OK);
    CHECK_EQ_INT(s.n, 16);
    CHECK_EQ_INT(s.n_tok, 2);
    rb_sim_params sp = params();
    rb_sim_result r;
    /* one block of cache: LRU misses all 16; per token 8 blocks in 2
       requests of 4: 2 x 1 ms + 32 KiB at 1 MiB/s */
    CHECK(rb_sim_run(&s, "lru", 4096, &sp, &r, &err) == RB_OK);
    CHECK_EQ_U64(r.hits, 0);
    CHECK_NEAR(r.bytes_per_token, 32768, 0);
    CHECK_NEAR(r.requests_per_token, 2, 0);
    CHECK_NEAR(r.io_s_per_token, 2e-3 + 32768.0 / (1 << 20), 1e-12);
    /* eight blocks: the second token hits everything */
    CHECK(rb_sim_run(&s, "lru", 32768, &sp, &r, &err) == RB_OK);
    CHECK_EQ_U64(r.hits, 8);
    CHECK_NEAR(r.hit_ratio, 0.5, 0);
    CHECK_NEAR(r.tok_hit_ratio, 0.5, 0);
    CHECK_NEAR(r.bytes_per_token, 16384, 0);
    CHECK_NEAR(r.requests_per_token, 1, 0);
    /* seven blocks, MRU: block 7 of token 0 replaces 6 (the newest); token
       1 hits 0..5, misses 6 (replacing 5, now the newest) and hits 7: one
       request; OPT also keeps 7 (used before 6's replacement is needed) */
    CHECK(rb_sim_run(&s, "mru", 7 * 4096, &sp, &r, &err) == RB_OK);
    CHECK_EQ_U64(r.hits, 7);
    CHECK_NEAR(r.requests_per_token, (2 + 1) / 2.0, 0);
    uint64_t *next = NULL;
    CHECK(rb_sim_next_use(&s, &next, &err) == RB_OK);
    CHECK_EQ_U64(next[0], 8);
    CHECK_EQ_U64(next[7], 15);
    CHECK_EQ_U64(next[8], UINT64_MAX);
    sp.next_use = next;
    CHECK(rb_sim_run(&s, "opt", 7 * 4096, &sp, &r, &err) == RB_OK);
    CHECK_EQ_U64(r.hits, 7);
    /* bad parameters */
    CHECK_EQ_INT(rb_sim_run(&s, "lru", 100, &sp, &r, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "below one 4096-byte block");
    CHECK_EQ_INT(rb_sim_run(&s, "nope", 4096, &sp, &r, &err), RB_E_NOT_FOUND);
    sp.next_use = NULL;
    CHECK_EQ_INT(rb_sim_run(&s, "opt", 4096, &sp, &r, &err), RB_E_INVALID_ARG);
    free(next);
    rb_block_stream_free(&s);
    rb_trace_free(&t);
}

static void class_vs_opt(void)
{
    rb_trace t;
    rb_trace_init(&t);
    rb_error err;
    const uint64_t loop = 32u << 20;
    CHECK(rb_trace_synth(&t, loop, 1u << 20, 8, 3, &err) == RB_OK);
    rb_block_stream s;
    CHECK(rb_block_stream_build(&t, &s, &err) == RB_OK);
    rb_sim_params sp = params();
    uint64_t *next = NULL;
    CHECK(rb_sim_next_use(&s, &next, &err) == RB_OK);
    sp.next_use = next;
    rb_sim_result res[2 * 10];
    for (int pct = 10; pct <= 100; pct += 10) {
        uint64_t c = loop * (uint64_t)pct / 100;
        rb_sim_result rc, ro, rl;
        CHECK(rb_sim_run(&s, "class", c, &sp, &rc, &err) == RB_OK);
        CHECK(rb_sim_run(&s, "opt", c, &sp, &ro, &err) == RB_OK);
        CHECK(rb_sim_run(&s, "lru", c, &sp, &rl, &err) == RB_OK);
        if (ro.hit_ratio - rc.hit_ratio > 0.05 || ro.tok_hit_ratio - rc.tok_hit_ratio > 0.05)
            fprintf(stderr, "%d%%: class %.4f opt %.4f\n", pct, rc.tok_hit_ratio, ro.tok_hit_ratio);
        CHECK(ro.hit_ratio - rc.hit_ratio <= 0.05);
        CHECK(ro.tok_hit_ratio - rc.tok_hit_ratio <= 0.05);
        CHECK(rc.hit_ratio <= ro.hit_ratio + 1e-12);
        /* LRU thrashes on the loop until it fits */
        if (pct < 100)
            CHECK(rl.tok_hit_ratio < 0.01);
        /* class reads at most what LRU reads, in no more time */
        CHECK(rc.bytes_per_token <= rl.bytes_per_token);
        CHECK(rc.io_s_per_token <= rl.io_s_per_token);
        res[(pct / 10) - 1] = rc;
        res[10 + (pct / 10) - 1] = ro;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/sim-plot.svg", REBOUND_TEST_TMP);
    CHECK(rb_sim_write_svg(path, "class <vs> opt & co", res, 20, 1, &err) == RB_OK);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = 0;
        fclose(f);
        CHECK_CONTAINS(buf, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
        CHECK_CONTAINS(buf, "class &lt;vs&gt; opt &amp; co");
        CHECK_CONTAINS(buf, ">class</text>");
        CHECK_CONTAINS(buf, ">opt</text>");
        CHECK_CONTAINS(buf, "</svg>");
        int lines = 0;
        for (const char *p = buf; (p = strstr(p, "<polyline")) != NULL; p++)
            lines++;
        CHECK_EQ_INT(lines, 2);
    }
    free(next);
    rb_block_stream_free(&s);
    rb_trace_free(&t);
}

int main(void)
{
    hand_made();
    class_vs_opt();
    return check_report();
}
