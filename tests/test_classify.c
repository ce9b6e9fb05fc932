/*
 * test_classify.c - Algorithm 1 step by step on a hand-made sequence, the
 * offline labels, and the report on a synthetic model app's trace (load
 * scan + hot set + loop): the loop length per token and the hot set's file.
 */
#include <stdlib.h>

#include "check.h"
#include "classify_offline.h"
#include "trace.h"

static void online(void)
{
    rb_classify_online c;
    rb_error err;
    CHECK(rb_classify_online_init(&c, 64, &err) == RB_OK);
    struct {
        uint32_t key;
        int want;
    } steps[] = {
        {10, RB_CLASS_HOT},  /* first access: a HOT run {10} */
        {11, RB_CLASS_SEQ},  /* follows 10: joins its run, which grows: SEQ */
        {12, RB_CLASS_SEQ},
        {12, RB_CLASS_SEQ},  /* the same block again right away: one access */
        {5, RB_CLASS_HOT},   /* first access elsewhere */
        {10, RB_CLASS_LOOP}, /* a scanned block comes back: LOOP run {10} */
        {11, RB_CLASS_LOOP}, /* follows 10: joins the LOOP run */
        {5, RB_CLASS_HOT},   /* a HOT block read again stays HOT */
        {30, RB_CLASS_HOT},
        {5, RB_CLASS_HOT},
        {12, RB_CLASS_LOOP}, /* 12 was SEQ, not after 11 now: a new LOOP run */
        {13, RB_CLASS_LOOP}, /* first access, but after 12: joins 12's LOOP run */
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        int got = rb_classify_online_access(&c, steps[i].key);
        if (got != steps[i].want)
            fprintf(stderr, "step %zu (key %u)\n", i, steps[i].key);
        CHECK_EQ_INT(got, steps[i].want);
    }
    CHECK_EQ_INT(rb_classify_online_class(&c, 10), RB_CLASS_LOOP);
    CHECK_EQ_INT(rb_classify_online_class(&c, 30), RB_CLASS_HOT);
    CHECK_EQ_INT(rb_classify_online_class(&c, 40), RB_CLASS_NONE);
    rb_classify_online_deinit(&c);

    /* a runtime decodes for hours: 1000 passes over a loop of 8 "tensors"
       each starting a new LOOP run must not grow the run table (recycled) */
    CHECK(rb_classify_online_init(&c, 1024, &err) == RB_OK);
    for (int pass = 0; pass < 1000; pass++)
        for (uint32_t t = 0; t < 8; t++)
            for (uint32_t b = 0; b < 100; b++)
                rb_classify_online_access(&c, t * 110 + b);
    CHECK(c.n_runs <= 16);
    CHECK_EQ_INT(rb_classify_online_class(&c, 0), RB_CLASS_LOOP);
    CHECK_EQ_INT(rb_classify_online_class(&c, 799), RB_CLASS_LOOP);
    uint32_t members = 0;
    for (uint32_t r = 0; r < c.n_runs; r++)
        members += c.run_n[r];
    CHECK_EQ_INT(members, 800);
    rb_classify_online_deinit(&c);
}

static void offline_and_report(void)
{
    rb_trace t;
    rb_trace_init(&t);
    rb_error err;
    /* 4 MiB of loop, 64 KiB hot set, 5 tokens */
    CHECK(rb_trace_synth(&t, 4 << 20, 64 << 10, 5, 7, &err) == RB_OK);
    rb_block_stream s;
    CHECK(rb_block_stream_build(&t, &s, &err) == RB_OK);
    CHECK_EQ_INT(s.n_tok, 5);
    rb_classify_report r;
    CHECK(rb_classify_run(&s, &r, &err) == RB_OK);
    /* every weight block is LOOP; every token reads all of them */
    CHECK(r.offline_bytes[RB_CLASS_LOOP] >= 4u << 20);
    CHECK(r.loop_min >= 4u << 20);
    CHECK(r.loop_max <= (4u << 20) + (24u << 12));
    /* the hot set: the randomly re-read tokenizer and index blocks */
    CHECK(r.offline_bytes[RB_CLASS_HOT] > 0);
    CHECK(r.file_bytes[1][RB_CLASS_HOT] > 0); /* synthetic-tokenizer.bin */
    /* blocks read once (at load) are SEQ */
    CHECK(r.offline_bytes[RB_CLASS_SEQ] > 0);
    CHECK_EQ_U64(r.offline_bytes[1] + r.offline_bytes[2] + r.offline_bytes[3],
                 r.online_bytes[1] + r.online_bytes[2] + r.online_bytes[3]);
    /* Algorithm 1 sees the load scan as SEQ, the per-token reads as LOOP */
    CHECK(r.online_accesses[RB_CLASS_LOOP] > 4 * ((4u << 20) / 4096));
    /* the load reads 1056 blocks (4 MiB + 64 KiB twice); each file's first
       block starts a HOT run before its second one makes the run SEQ */
    CHECK_EQ_U64(r.online_accesses[RB_CLASS_SEQ], 1056 - 2);
    CHECK_EQ_U64(r.online_accesses[RB_CLASS_HOT], 2);
    rb_classify_report_free(&r);
    rb_block_stream_free(&s);
    rb_trace_free(&t);

    /* offline rule on a hand-made stream: read once = SEQ; re-read inside
       sequential stretches = LOOP; re-read alone = HOT */
    uint32_t keys[] = {1, 2, 3, 1, 2, 3, 7, 9, 7, 5};
    rb_block_stream hs = {0};
    hs.key = keys;
    hs.n = sizeof keys / sizeof keys[0];
    hs.n_keys = 16;
    uint8_t cls[16];
    CHECK(rb_classify_offline(&hs, cls, &err) == RB_OK);
    CHECK_EQ_INT(cls[1], RB_CLASS_LOOP);
    CHECK_EQ_INT(cls[3], RB_CLASS_LOOP);
    CHECK_EQ_INT(cls[7], RB_CLASS_HOT);
    CHECK_EQ_INT(cls[9], RB_CLASS_SEQ);
    CHECK_EQ_INT(cls[5], RB_CLASS_SEQ);
    CHECK_EQ_INT(cls[0], RB_CLASS_NONE);
}

int main(void)
{
    online();
    offline_and_report();
    return check_report();
}
