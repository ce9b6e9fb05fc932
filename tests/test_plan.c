/*
 * test_plan.c - the capacity model reproduces the paper's figures (watch
 * ~70 MB of loop, phone 356-612 MB, 1B int4 + 256 MB KV over a 512 MB
 * pool), the device profiles are consistent, and impossible parameters
 * get a clear error.
 */
#include <math.h>

#include "check.h"
#include "plan.h"
#include "profile.h"

static rb_plan_input input(const char *device)
{
    rb_plan_input in = {0};
    rb_error err;
    CHECK(rb_profile_get(device, &in.profile, &err) == RB_OK);
    in.pool_bytes = in.profile.pool_bytes;
    in.hot_bytes = in.profile.hot_bytes;
    in.tps = 10;
    in.bytes_per_param = rb_plan_bytes_per_param("int4");
    return in;
}

int main(void)
{
    rb_error err;
    rb_plan p;

    /* watch: 64 MB pool - 4 MB hot set = 60 MB, + 100 MB/s x 0.1 s = 70 MB */
    rb_plan_input in = input("watch");
    CHECK(rb_plan_compute(&in, &p, &err) == RB_OK);
    CHECK_EQ_U64(p.loop_cache_bytes, 60 * RB_MIB);
    CHECK_EQ_U64(p.stream_bytes, 10 * RB_MIB);
    CHECK_EQ_U64(p.max_loop_bytes, 70 * RB_MIB);
    CHECK_NEAR(p.max_params, 70.0 * RB_MIB / 0.5, 1);
    /* per-block metadata: 8 B per 4 KiB block: 1 MiB per 512 MiB */
    CHECK_EQ_U64(p.meta_bytes, 64 * RB_MIB / 4096 * 8);

    /* phone: pools 512 MB and 1 GB, half for the loop, + 1 GB/s x 0.1 s */
    in = input("phone");
    CHECK(rb_plan_compute(&in, &p, &err) == RB_OK);
    CHECK_EQ_U64(p.loop_cache_bytes, 256 * RB_MIB);
    CHECK_EQ_U64(p.max_loop_bytes, 356 * RB_MIB);
    CHECK_EQ_U64(p.meta_bytes, 1 * RB_MIB);
    in.pool_bytes = in.profile.pool_max_bytes;
    CHECK(rb_plan_compute(&in, &p, &err) == RB_OK);
    CHECK_EQ_U64(p.max_loop_bytes, 612 * RB_MIB);

    /* 1B int4 (0.5 GB) + 256 MB KV = 0.75 GB over a 512 MB pool: the KV
       squeezes the loop cache to 252 MB; S needed 400 MB: too slow */
    in = input("phone");
    in.pool_bytes = 512 * RB_MIB;
    in.has_kv = 1;
    in.kv_bytes = 256 * RB_MIB;
    in.loop_bytes = 500 * RB_MIB;
    CHECK(rb_plan_compute(&in, &p, &err) == RB_OK);
    CHECK_EQ_U64(p.loop_cache_bytes, 252 * RB_MIB);
    CHECK_EQ_U64(p.s_needed_bytes, 400 * RB_MIB);
    CHECK_EQ_U64(p.s_pinned_bytes, 252 * RB_MIB);
    CHECK(!p.meets_rate);
    /* I/O bound: 248 MB per token at 1000 MiB/s plus 496 requests of 80 us */
    CHECK_NEAR(p.io_tok_s, 1.0 / (248.0 / 1000.0 + 496 * 80e-6), 1e-9);
    /* the same model without KV pressure fits */
    in.kv_bytes = 0;
    CHECK(rb_plan_compute(&in, &p, &err) == RB_OK);
    CHECK(p.meets_rate);
    /* a loop that fits entirely reads nothing */
    in.loop_bytes = 100 * RB_MIB;
    CHECK(rb_plan_compute(&in, &p, &err) == RB_OK);
    CHECK_EQ_U64(p.s_needed_bytes, 0);
    CHECK_EQ_U64(p.io_tok_s, 0);

    /* impossible parameters */
    in = input("phone");
    in.profile.bw_bytes_per_s = 0;
    CHECK_EQ_INT(rb_plan_compute(&in, &p, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "bandwidth 0 MiB/s is impossible");
    in.profile.bw_bytes_per_s = -5.0 * RB_MIB;
    CHECK_EQ_INT(rb_plan_compute(&in, &p, &err), RB_E_INVALID_ARG);
    in = input("phone");
    in.pool_bytes = 2 * RB_MIB;
    CHECK_EQ_INT(rb_plan_compute(&in, &p, &err), RB_E_BUDGET);
    CHECK_CONTAINS(err.message, "smaller than the hot set 4.0 MiB");
    in = input("phone");
    in.has_kv = 1;
    in.kv_bytes = 600 * RB_MIB;
    CHECK_EQ_INT(rb_plan_compute(&in, &p, &err), RB_E_BUDGET);
    CHECK_CONTAINS(err.message, "exceed the pool");
    in = input("phone");
    in.tps = 0;
    CHECK_EQ_INT(rb_plan_compute(&in, &p, &err), RB_E_INVALID_ARG);
    in = input("phone");
    in.pool_bytes = 0;
    CHECK_EQ_INT(rb_plan_compute(&in, &p, &err), RB_E_INVALID_ARG);

    /* profiles: one table, every built-in one valid; unknown names listed */
    for (int i = 0; i < rb_profile_count(); i++)
        CHECK(rb_profile_check(rb_profile_at(i), &err) == RB_OK);
    rb_profile pf;
    CHECK_EQ_INT(rb_profile_get("toaster", &pf, &err), RB_E_NOT_FOUND);
    CHECK_CONTAINS(err.message, "watch, phone, host, custom");
    CHECK(rb_profile_get("phone", &pf, &err) == RB_OK);
    pf.request_bytes = 512;
    CHECK_EQ_INT(rb_profile_check(&pf, &err), RB_E_INVALID_ARG);
    CHECK(rb_profile_get("watch", &pf, &err) == RB_OK);
    CHECK_NEAR(rb_profile_read_s(&pf, 2, 100 * RB_MIB), 1.0 + 2 * 200e-6, 1e-12);
    CHECK(rb_plan_bytes_per_param("q8_0") > 1.0);
    CHECK(rb_plan_bytes_per_param("q3_zz") == 0.0);
    return check_report();
}
