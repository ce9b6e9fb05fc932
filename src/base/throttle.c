/*
 * throttle.c - a shared token bucket plus per-I/O latency that makes the
 * host's storage behave like a device profile (model and contract in
 * throttle.h).
 *
 * Does: keep one virtual clock per emulated device (free_ns: when its
 * transfer queue drains), reserve each I/O's bytes on it under a mutex, and
 * sleep the calling thread outside the mutex until the I/O's modelled
 * completion. Does not: perform I/O, know files or segments, or model
 * queue-depth effects beyond "latencies overlap, bandwidth is shared".
 *
 * State, for bw > 0 (time runs left to right; T = an I/O's start):
 *
 *    T - burst/bw          T              free_ns (after)   done
 *        |<-- bank -->|     |                  |              |
 *   -----+------------+-----+------------------+--------------+-->
 *        begin = max(free_ns (before), T - burst/bw)
 *        free_ns = begin + bytes/bw;  done = max(T, free_ns) + latency
 *
 * Invariants: free_ns never moves backward (begin >= the old free_ns); a
 * request never starts more than burst/bw before its own start time, so
 * an idle device banks at most burst bytes; counters only grow.
 * Memory: none; the struct is in caller storage.
 */
#include "throttle.h"

#include <errno.h>
#include <math.h>
#include <time.h>

#include "status.h"

int64_t rb_throttle_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double rb_throttle_now_s(void) { return (double)rb_throttle_now_ns() * 1e-9; }

/* Sleeps until the absolute monotonic time until_ns; absolute so that an
 * interruption (EINTR) resumes toward the same deadline, never later. */
static void sleep_until_ns(int64_t until_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(until_ns / 1000000000),
                          .tv_nsec = (long)(until_ns % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static int is_nonneg_finite(double x) { return x >= 0.0 && isfinite(x); }

rb_status rb_throttle_init_burst(rb_throttle *t, double bw_bytes_per_s, double latency_s,
                                 double burst_bytes, rb_error *err)
{
    if (!is_nonneg_finite(bw_bytes_per_s))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "throttle: bandwidth %g bytes/s: must be 0 (unlimited) or > 0 "
                            "and finite", bw_bytes_per_s);
    if (!is_nonneg_finite(latency_s))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "throttle: latency %g s: must be >= 0 and finite", latency_s);
    if (!is_nonneg_finite(burst_bytes))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "throttle: burst %g bytes: must be >= 0 and finite", burst_bytes);
    int rc = pthread_mutex_init(&t->mu, NULL);
    if (rc != 0)
        return rb_error_set(err, RB_E_NOMEM, "throttle: pthread_mutex_init: error %d", rc);
    t->bw_bytes_per_s = bw_bytes_per_s;
    t->latency_s = latency_s;
    t->burst_bytes = burst_bytes;
    t->is_throttled = bw_bytes_per_s > 0.0 || latency_s > 0.0;
    t->free_ns = 0; /* far in the past: the device starts idle */
    atomic_init(&t->n_bytes, 0);
    atomic_init(&t->n_ios, 0);
    atomic_init(&t->sleep_ns, 0);
    return RB_OK;
}

rb_status rb_throttle_init(rb_throttle *t, double bw_bytes_per_s, double latency_s,
                           rb_error *err)
{
    return rb_throttle_init_burst(t, bw_bytes_per_s, latency_s, 0.0, err);
}

void rb_throttle_deinit(rb_throttle *t) { pthread_mutex_destroy(&t->mu); }

double rb_throttle_io_since(rb_throttle *t, uint64_t bytes, int64_t start_ns)
{
    atomic_fetch_add_explicit(&t->n_bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&t->n_ios, 1, memory_order_relaxed);
    if (!t->is_throttled)
        return 0.0;

    int64_t done_ns = start_ns;
    if (t->bw_bytes_per_s > 0.0) {
        /* ns as doubles: 2^53 ns is 104 days of uptime before rounding
         * reaches 1 ns, far below any sleep we could notice. */
        int64_t xfer_ns = (int64_t)((double)bytes / t->bw_bytes_per_s * 1e9);
        int64_t bank_ns = (int64_t)(t->burst_bytes / t->bw_bytes_per_s * 1e9);
        pthread_mutex_lock(&t->mu);
        int64_t begin = t->free_ns > start_ns - bank_ns ? t->free_ns : start_ns - bank_ns;
        t->free_ns = begin + xfer_ns;
        if (t->free_ns > done_ns)
            done_ns = t->free_ns;
        pthread_mutex_unlock(&t->mu);
    }
    done_ns += (int64_t)(t->latency_s * 1e9);

    int64_t now_ns = rb_throttle_now_ns();
    if (done_ns <= now_ns)
        return 0.0; /* the real I/O already took at least the modelled time */
    sleep_until_ns(done_ns);
    /* Count the time asked for, not the oversleep: the counter reports what
     * the model added, which is what a caller compares against real I/O. */
    atomic_fetch_add_explicit(&t->sleep_ns, (uint64_t)(done_ns - now_ns),
                              memory_order_relaxed);
    return (double)(done_ns - now_ns) * 1e-9;
}

double rb_throttle_io(rb_throttle *t, uint64_t bytes)
{
    /* unthrottled: skip the clock read as well */
    return rb_throttle_io_since(t, bytes, t->is_throttled ? rb_throttle_now_ns() : 0);
}

void rb_throttle_get_stats(const rb_throttle *t, rb_throttle_stats *out)
{
    /* atomic_load wants a non-const object in C11 (clang insists); the
     * loads do not modify it. */
    rb_throttle *m = (rb_throttle *)t;
    out->n_bytes = atomic_load_explicit(&m->n_bytes, memory_order_relaxed);
    out->n_ios = atomic_load_explicit(&m->n_ios, memory_order_relaxed);
    out->sleep_s = (double)atomic_load_explicit(&m->sleep_ns, memory_order_relaxed) * 1e-9;
}
