/*
 * profile.c - the built-in device profiles (contract in profile.h).
 *
 * Where the numbers come from:
 *  - watch: eMMC-class storage, ~100 MiB/s sustained reads; a model app
 *    gets about 64 MiB of page cache (Kim, Lee, Bahn 2025, the smartwatch
 *    platform); 4 MiB hot set (tokenizer, metadata, indexes: "under 4 MB").
 *  - phone: UFS 4.0, >= 1 GB/s (1000 MiB/s here); the pool is 512 MiB to
 *    1 GiB on an 8 GB phone, of which the paper gives the loop 256-512 MiB:
 *    half the pool is assumed to go to the hot set and the KV cache when no
 *    context length is given (reserve_fraction 0.5).
 *  - host: an NVMe-class disk used as is (no throttle); 2000 MiB/s is only
 *    the planning figure, measure it for real numbers.
 * Per-request latency and request size are typical of each class (eMMC
 * ~200 us and 512 KiB requests, UFS ~80 us, NVMe ~50 us and 1 MiB); they
 * matter only for the merged-request I/O time model in sim.c.
 *
 * Does not measure anything: the host profile's bandwidth is a default.
 * Memory: none; the table is static and immutable.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "profile.h"
#include "status.h"

static const rb_profile profiles[] = {
    {"watch", "eMMC", 100.0 * RB_MIB, 200e-6, 512 << 10, 64 * RB_MIB, 64 * RB_MIB,
     4 * RB_MIB, 0.0, 0.1, 1},
    {"phone", "UFS 4.0", 1000.0 * RB_MIB, 80e-6, 512 << 10, 512 * RB_MIB, 1 * RB_GIB,
     4 * RB_MIB, 0.5, 0.1, 1},
    {"host", "NVMe (as is)", 2000.0 * RB_MIB, 50e-6, 1 << 20, 1 * RB_GIB, 1 * RB_GIB,
     4 * RB_MIB, 0.0, 0.1, 0},
    {"custom", "user-defined", 1000.0 * RB_MIB, 80e-6, 512 << 10, 512 * RB_MIB,
     512 * RB_MIB, 4 * RB_MIB, 0.0, 0.1, 1},
};

int rb_profile_count(void) { return (int)(sizeof profiles / sizeof profiles[0]); }

const rb_profile *rb_profile_at(int i)
{
    return i >= 0 && i < rb_profile_count() ? &profiles[i] : NULL;
}

rb_status rb_profile_get(const char *name, rb_profile *out, rb_error *err)
{
    for (int i = 0; name && i < rb_profile_count(); i++)
        if (strcmp(profiles[i].name, name) == 0) {
            *out = profiles[i];
            return RB_OK;
        }
    return rb_error_set(err, RB_E_NOT_FOUND,
                        "profile: unknown device '%s' (watch, phone, host, custom)",
                        name ? name : "(null)");
}

rb_status rb_profile_check(const rb_profile *p, rb_error *err)
{
    if (!(p->bw_bytes_per_s > 0.0) || !isfinite(p->bw_bytes_per_s))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "profile '%s': bandwidth %g B/s must be positive", p->name,
                            p->bw_bytes_per_s);
    if (!(p->latency_s >= 0.0) || !isfinite(p->latency_s))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "profile '%s': latency %g s must be zero or positive", p->name,
                            p->latency_s);
    if (p->request_bytes < 4096)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "profile '%s': request size %llu B is below one 4 KiB block",
                            p->name, (unsigned long long)p->request_bytes);
    if (!(p->fetch_s > 0.0) || !isfinite(p->fetch_s))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "profile '%s': fetch time per token %g s must be positive",
                            p->name, p->fetch_s);
    if (!(p->reserve_fraction >= 0.0 && p->reserve_fraction < 1.0))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "profile '%s': reserve fraction %g must be in [0, 1)", p->name,
                            p->reserve_fraction);
    return RB_OK;
}

double rb_profile_read_s(const rb_profile *p, uint64_t n_requests, uint64_t bytes)
{
    return (double)n_requests * p->latency_s + (double)bytes / p->bw_bytes_per_s;
}
