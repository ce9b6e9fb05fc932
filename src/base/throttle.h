/*
 * throttle.h - emulates a device's storage speed on a faster host: a token
 * bucket that refills at bw bytes/s plus a fixed latency per I/O. Every
 * storage read and write that should "feel like the phone" calls
 * rb_throttle_io_since() after the real I/O, and the calling thread sleeps
 * until the modelled device would have finished.
 *
 * The model, per I/O of n bytes issued at time T (one mutex-guarded clock,
 * free_ns, the time at which the device's transfer queue drains):
 *
 *     begin    = max(free_ns, T - burst/bw)    the bucket never holds more
 *                                              than burst bytes of credit
 *     free_ns  = begin + n / bw                 the bytes use the bandwidth
 *     done     = max(T, free_ns) + latency      then the fixed access cost
 *
 * - Bandwidth is shared: several threads share one bucket, so two threads
 *   reading at once each get about half (the device has one bus).
 * - Latency is per I/O and does not consume bandwidth: one thread doing
 *   serial I/Os pays n_ios * latency + bytes / bw, the same as
 *   rb_profile_read_s() (profile.h); concurrent I/Os overlap their latencies
 *   as a device with a command queue does.
 * - Burst: rb_throttle_init() sets burst 0, "one request": a request may
 *   start as soon as the queue is drained, but an idle device does not bank
 *   bandwidth, because a flash device's transfer rate does not rise after a
 *   pause. rb_throttle_init_burst() sets a real bucket (e.g. 1 MiB), for
 *   devices with a fast write buffer.
 *
 * Applied AFTER the real I/O, from the real I/O's start time: the emulated
 * time of one I/O is max(real, modelled), not real + modelled. Why: on this
 * host the real I/O is the device being emulated's stand-in, not an extra
 * cost; adding it would make every profile slower by the host disk's
 * speed, and the host's own slowness (a cold disk, contention) would be
 * counted twice whenever the modelled device is slower still. If the host
 * is slower than the model, the model cannot speed it up: max() says so.
 * (rb_throttle_io() is the "issued now" form, for callers with no real I/O
 * and for tests: it sleeps the whole modelled time.)
 *
 * Unthrottled (bw 0 and latency 0, the "host" profile): counters only, two
 * relaxed atomic adds, no clock read, no lock, no sleep.
 *
 * Threads: rb_throttle_io*() and rb_throttle_get_stats() may be called from
 * any number of threads at once. init/deinit must not race with anything.
 * Memory: caller storage (rb_throttle is a plain struct); nothing is
 * allocated.
 */
#ifndef RB_THROTTLE_H
#define RB_THROTTLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "rebound.h"

typedef struct rb_throttle {
    /* set by init, read-only afterwards (no lock needed) */
    double bw_bytes_per_s;   /* 0: no bandwidth limit */
    double latency_s;        /* fixed cost per I/O, >= 0 */
    double burst_bytes;      /* bucket capacity; 0 = one request */
    int is_throttled;        /* bw > 0 || latency > 0 */

    pthread_mutex_t mu;      /* guards free_ns (only used when bw > 0) */
    int64_t free_ns;         /* mu: CLOCK_MONOTONIC ns at which queued
                                transfers drain */

    /* counters: relaxed atomics, exact totals, no ordering implied */
    _Atomic uint64_t n_bytes;
    _Atomic uint64_t n_ios;
    _Atomic uint64_t sleep_ns; /* summed over threads (can exceed wall time) */
} rb_throttle;

typedef struct rb_throttle_stats {
    uint64_t n_bytes;        /* bytes passed to rb_throttle_io*() */
    uint64_t n_ios;          /* calls */
    double sleep_s;          /* total time threads slept in the throttle */
} rb_throttle_stats;

/*
 * Initialises t in caller storage with burst 0 ("one request", see above).
 * bw_bytes_per_s: 0 = no bandwidth limit, else > 0 and finite.
 * latency_s: >= 0 and finite (0 = none). bw 0 and latency 0 = unthrottled.
 * Errors: RB_E_INVALID_ARG (message names the parameter and value; t is
 * then left uninitialised: do not deinit it).
 */
rb_status rb_throttle_init(rb_throttle *t, double bw_bytes_per_s, double latency_s,
                           rb_error *err);

/* The same with a bucket of burst_bytes (>= 0, finite) of credit that an
 * idle device accumulates. Ignored when bw is 0. */
rb_status rb_throttle_init_burst(rb_throttle *t, double bw_bytes_per_s, double latency_s,
                                 double burst_bytes, rb_error *err);

/* Releases the mutex. t must be idle (no thread inside rb_throttle_io*). */
void rb_throttle_deinit(rb_throttle *t);

/* Current CLOCK_MONOTONIC time in ns: take it just before a real I/O and
 * pass it to rb_throttle_io_since(). */
int64_t rb_throttle_now_ns(void);
/* The same clock in seconds: what the session's timings are kept in. */
double rb_throttle_now_s(void);

/*
 * Accounts one I/O of `bytes` that started at start_ns (rb_throttle_now_ns()
 * taken before the real I/O) and blocks the calling thread
 * (clock_nanosleep, CLOCK_MONOTONIC, absolute) until the modelled device
 * would have completed it; returns at once when the real I/O already took
 * as long. Returns the seconds this call slept (0 when unthrottled).
 * Call it only for I/Os that succeeded: a failed I/O moved no bytes.
 */
double rb_throttle_io_since(rb_throttle *t, uint64_t bytes, int64_t start_ns);

/* rb_throttle_io_since(t, bytes, rb_throttle_now_ns()): the whole modelled
 * time, for callers that have no real I/O to overlap with. */
double rb_throttle_io(rb_throttle *t, uint64_t bytes);

/* A consistent-enough snapshot of the counters (each one exact; they are
 * read one after the other, so a concurrent I/O may show in one only). */
void rb_throttle_get_stats(const rb_throttle *t, rb_throttle_stats *out);

#endif /* RB_THROTTLE_H */
