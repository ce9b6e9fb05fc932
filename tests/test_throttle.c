/*
 * test_throttle.c - the storage throttle: bandwidth, latency, shared
 * bucket, max(real, modelled), burst, unthrottled cost, bad parameters.
 *
 * Timing checks are sleeps, so their bands are wide: the lower bound is
 * the model (a sleep never ends early), the upper bound allows a loaded
 * 2-core machine and sanitizers (x2.5 + 60 ms).
 */
#include <pthread.h>

#include "check.h"
#include "throttle.h"

#define MIB (1u << 20)

static double now_s(void) { return (double)rb_throttle_now_ns() * 1e-9; }

#define CHECK_TIME(t, model)                                                   \
    do {                                                                       \
        CHECK((t) >= (model) * 0.97);                                          \
        CHECK((t) <= (model) * 2.5 + 0.060);                                   \
        fprintf(stderr, "  %-40s %7.1f ms (model %.1f ms)\n", #t, (t) * 1e3,   \
                (model) * 1e3);                                                \
    } while (0)

static void test_bandwidth(void)
{
    rb_throttle t;
    CHECK_EQ_INT(rb_throttle_init(&t, 100.0 * MIB, 0.0, NULL), RB_OK);
    double t0 = now_s();
    double slept = rb_throttle_io(&t, 8 * MIB);
    double one_8mib = now_s() - t0;
    CHECK_TIME(one_8mib, 0.080);
    CHECK_NEAR(slept, 0.080, 0.005);

    /* the same bytes in 64 pieces cost the same: bandwidth, no latency */
    t0 = now_s();
    for (int i = 0; i < 64; i++)
        rb_throttle_io(&t, 128 << 10);
    double pieces_8mib = now_s() - t0;
    CHECK_TIME(pieces_8mib, 0.080);

    rb_throttle_stats st;
    rb_throttle_get_stats(&t, &st);
    CHECK_EQ_U64(st.n_bytes, 16 * MIB);
    CHECK_EQ_U64(st.n_ios, 65);
    CHECK(st.sleep_s >= 0.120 && st.sleep_s <= 0.161); /* oversleeps shorten later sleeps */
    rb_throttle_deinit(&t);
}

static void test_latency(void)
{
    rb_throttle t;
    /* latency only: 20 I/Os x 2 ms, bytes free */
    CHECK_EQ_INT(rb_throttle_init(&t, 0.0, 0.002, NULL), RB_OK);
    double t0 = now_s();
    for (int i = 0; i < 20; i++)
        rb_throttle_io(&t, 1 * MIB);
    double latency_only = now_s() - t0;
    CHECK_TIME(latency_only, 0.040);
    rb_throttle_deinit(&t);

    /* both: n x latency + bytes / bw, as rb_profile_read_s() models it */
    CHECK_EQ_INT(rb_throttle_init(&t, 400.0 * MIB, 0.001, NULL), RB_OK);
    t0 = now_s();
    for (int i = 0; i < 10; i++)
        rb_throttle_io(&t, 2 * MIB);
    double latency_plus_bw = now_s() - t0;
    CHECK_TIME(latency_plus_bw, 10 * 0.001 + 20.0 / 400.0);
    rb_throttle_deinit(&t);
}

typedef struct worker_arg {
    rb_throttle *t;
    int n;
    uint64_t bytes;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *a = p;
    for (int i = 0; i < a->n; i++)
        rb_throttle_io(a->t, a->bytes);
    return NULL;
}

/* Two threads each moving 4 MiB at 100 MiB/s: shared bandwidth means the
 * pair takes ~80 ms, not the ~40 ms of two independent devices. */
static void test_shared(void)
{
    rb_throttle t;
    CHECK_EQ_INT(rb_throttle_init(&t, 100.0 * MIB, 0.0, NULL), RB_OK);
    worker_arg a = {&t, 32, 128 << 10};
    pthread_t th[2];
    double t0 = now_s();
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(pthread_create(&th[i], NULL, worker, &a), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double two_threads_8mib = now_s() - t0;
    CHECK_TIME(two_threads_8mib, 0.080);
    rb_throttle_stats st;
    rb_throttle_get_stats(&t, &st);
    CHECK_EQ_U64(st.n_bytes, 8 * MIB);
    CHECK_EQ_U64(st.n_ios, 64);
    rb_throttle_deinit(&t);

    /* latency is per I/O and overlaps between threads (a command queue):
     * 2 threads x 10 I/Os x 4 ms take ~40 ms, not 80 */
    CHECK_EQ_INT(rb_throttle_init(&t, 0.0, 0.004, NULL), RB_OK);
    worker_arg b = {&t, 10, 0};
    t0 = now_s();
    for (int i = 0; i < 2; i++)
        CHECK_EQ_INT(pthread_create(&th[i], NULL, worker, &b), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    double two_threads_latency = now_s() - t0;
    CHECK_TIME(two_threads_latency, 0.040);
    rb_throttle_deinit(&t);
}

/* Applied after the real I/O: an I/O that already took longer than the
 * model sleeps no more; one that took less sleeps the difference. */
static void test_max_real_modelled(void)
{
    rb_throttle t;
    CHECK_EQ_INT(rb_throttle_init(&t, 100.0 * MIB, 0.0, NULL), RB_OK);
    int64_t start = rb_throttle_now_ns() - 50 * 1000000ll; /* "real I/O took 50 ms" */
    double slept = rb_throttle_io_since(&t, 4 * MIB, start); /* model 40 ms */
    CHECK(slept == 0.0);
    rb_throttle_deinit(&t);

    /* a fresh device: on the old one this I/O would queue behind the first
     * (modelled busy until 10 ms ago) */
    CHECK_EQ_INT(rb_throttle_init(&t, 100.0 * MIB, 0.0, NULL), RB_OK);
    start = rb_throttle_now_ns() - 20 * 1000000ll; /* real 20 ms, model 40 ms */
    double t0 = now_s();
    slept = rb_throttle_io_since(&t, 4 * MIB, start);
    double rest = now_s() - t0;
    CHECK_TIME(rest, 0.020);
    CHECK_NEAR(slept, 0.020, 0.003);
    rb_throttle_deinit(&t);
}

/* A bucket of 1 MiB: after idling, 1 MiB passes at once; the next 1 MiB
 * waits its 10 ms. */
static void test_burst(void)
{
    rb_throttle t;
    CHECK_EQ_INT(rb_throttle_init_burst(&t, 100.0 * MIB, 0.0, 1.0 * MIB, NULL), RB_OK);
    double t0 = now_s();
    rb_throttle_io(&t, 1 * MIB);
    double banked = now_s() - t0;
    CHECK(banked < 0.005);
    t0 = now_s();
    rb_throttle_io(&t, 1 * MIB);
    double after_bank = now_s() - t0;
    CHECK_TIME(after_bank, 0.010);
    rb_throttle_deinit(&t);

    /* burst 0 (the default): an idle device banks nothing */
    CHECK_EQ_INT(rb_throttle_init(&t, 100.0 * MIB, 0.0, NULL), RB_OK);
    t0 = now_s();
    rb_throttle_io(&t, 1 * MIB);
    double no_bank = now_s() - t0;
    CHECK_TIME(no_bank, 0.010);
    rb_throttle_deinit(&t);
}

static void test_unthrottled(void)
{
    rb_throttle t;
    CHECK_EQ_INT(rb_throttle_init(&t, 0.0, 0.0, NULL), RB_OK);
    CHECK_EQ_INT(t.is_throttled, 0);
    double t0 = now_s();
    for (int i = 0; i < 200000; i++)
        rb_throttle_io(&t, 4096);
    double dt = now_s() - t0;
    fprintf(stderr, "  unthrottled: %.1f ns per call\n", dt / 200000 * 1e9);
    CHECK(dt < 0.2); /* ~10 ns per call unsanitized; generous for TSan */
    rb_throttle_stats st;
    rb_throttle_get_stats(&t, &st);
    CHECK_EQ_U64(st.n_ios, 200000);
    CHECK_EQ_U64(st.n_bytes, 200000ull * 4096);
    CHECK(st.sleep_s == 0.0);
    rb_throttle_deinit(&t);
}

static void test_bad_params(void)
{
    rb_throttle t;
    rb_error err = {0};
    CHECK_EQ_INT(rb_throttle_init(&t, -1.0, 0.0, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "bandwidth -1");
    CHECK_EQ_INT(rb_throttle_init(&t, NAN, 0.0, &err), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_throttle_init(&t, INFINITY, 0.0, &err), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_throttle_init(&t, 1e6, -0.001, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "latency -0.001");
    CHECK_EQ_INT(rb_throttle_init_burst(&t, 1e6, 0.0, -5.0, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "burst -5");
}

int main(void)
{
    test_bandwidth();
    test_latency();
    test_shared();
    test_max_real_modelled();
    test_burst();
    test_unthrottled();
    test_bad_params();
    return check_report();
}
