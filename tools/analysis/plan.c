/*
 * plan.c - the capacity model (formulas in plan.h).
 *
 * Pure arithmetic over a profile and a few sizes: no I/O, no allocation.
 * Everything is checked before use, so an impossible input (zero
 * bandwidth, a pool smaller than the hot set) is an error that names the
 * numbers, never a negative cache.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "plan.h"
#include "status.h"

double rb_plan_bytes_per_param(const char *q)
{
    static const struct {
        const char *name;
        double bpp;
    } t[] = {
        {"int4", 0.5},  {"q4_0", 18.0 / 32}, {"q4_k", 144.0 / 256}, {"q4_k_m", 0.6},
        {"q5_0", 22.0 / 32}, {"q6_k", 210.0 / 256}, {"int8", 1.0}, {"q8_0", 34.0 / 32},
        {"f16", 2.0}, {"bf16", 2.0}, {"f32", 4.0},
    };
    for (size_t i = 0; q && i < sizeof t / sizeof t[0]; i++)
        if (strcmp(t[i].name, q) == 0)
            return t[i].bpp;
    return 0.0;
}

rb_status rb_plan_compute(const rb_plan_input *in, rb_plan *out, rb_error *err)
{
    const rb_profile *pf = &in->profile;
    if (!(pf->bw_bytes_per_s > 0.0) || !isfinite(pf->bw_bytes_per_s))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "plan: bandwidth %g MiB/s is impossible; it must be positive",
                            pf->bw_bytes_per_s / RB_MIB);
    if (!(pf->latency_s >= 0.0) || !isfinite(pf->latency_s))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "plan: latency %g s is impossible; it must be zero or positive",
                            pf->latency_s);
    if (!(in->tps > 0.0) || !isfinite(in->tps))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "plan: token rate %g tok/s must be positive", in->tps);
    if (in->pool_bytes == 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "plan: the cache pool is 0 bytes");
    if (in->pool_bytes < in->hot_bytes)
        return rb_error_set(err, RB_E_BUDGET,
                            "plan: cache pool %.1f MiB is smaller than the hot set %.1f MiB "
                            "(tokenizer, metadata, indexes must stay cached)",
                            (double)in->pool_bytes / RB_MIB, (double)in->hot_bytes / RB_MIB);
    rb_plan p;
    memset(&p, 0, sizeof p);
    p.pool_bytes = in->pool_bytes;
    p.hot_bytes = in->hot_bytes;
    if (in->has_kv) {
        p.kv_bytes = in->kv_bytes;
        if (in->kv_bytes > in->pool_bytes - in->hot_bytes)
            return rb_error_set(err, RB_E_BUDGET,
                                "plan: hot set %.1f MiB + KV cache %.1f MiB exceed the pool "
                                "%.1f MiB: no room is left for any weight",
                                (double)in->hot_bytes / RB_MIB, (double)in->kv_bytes / RB_MIB,
                                (double)in->pool_bytes / RB_MIB);
        p.reserve_bytes = in->hot_bytes + in->kv_bytes;
    } else {
        uint64_t r = (uint64_t)((double)in->pool_bytes * pf->reserve_fraction);
        p.reserve_bytes = r > in->hot_bytes ? r : in->hot_bytes;
        p.kv_bytes = p.reserve_bytes - in->hot_bytes;
    }
    p.loop_cache_bytes = in->pool_bytes - p.reserve_bytes;
    p.fetch_s = 1.0 / in->tps;
    p.stream_bytes = (uint64_t)llround(pf->bw_bytes_per_s * p.fetch_s);
    p.max_loop_bytes = p.loop_cache_bytes + p.stream_bytes;
    p.max_params = in->bytes_per_param > 0 ? (double)p.max_loop_bytes / in->bytes_per_param : 0;
    p.pool_blocks = in->pool_bytes / 4096;
    p.meta_bytes = p.pool_blocks * 8;
    if (in->loop_bytes) {
        uint64_t n = in->loop_bytes;
        p.loop_bytes = n;
        p.s_needed_bytes = n > p.stream_bytes ? n - p.stream_bytes : 0;
        p.s_pinned_bytes = n < p.loop_cache_bytes ? n : p.loop_cache_bytes;
        p.meets_rate = p.s_needed_bytes <= p.loop_cache_bytes;
        uint64_t rd = n - p.s_pinned_bytes;
        if (rd) {
            double req = ceil((double)rd / (double)pf->request_bytes);
            p.io_tok_s = 1.0 / ((double)rd / pf->bw_bytes_per_s + req * pf->latency_s);
        }
    }
    *out = p;
    return RB_OK;
}
