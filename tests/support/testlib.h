/*
 * testlib.h - what the tests share: a seeded random generator, synthetic
 * models of a chosen shape, and scratch paths under the build tree.
 *
 * Built once into the static library rebound_testlib that every test links
 * (tests/CMakeLists.txt). Nothing here checks: a failing helper returns a
 * status and prints why, and the test CHECKs the status (check.h's counters
 * are per test file).
 */
#ifndef RB_TESTLIB_H
#define RB_TESTLIB_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

/* ---- random numbers: splitmix64, one stream per state --------------------- */

typedef struct rb_test_rng {
    uint64_t state;
} rb_test_rng;

static inline rb_test_rng rb_test_rng_seed(uint64_t seed) { return (rb_test_rng){seed}; }
uint64_t rb_test_rng_u64(rb_test_rng *r);
/* Uniform in [0, n); n > 0. */
uint32_t rb_test_rng_below(rb_test_rng *r, uint32_t n);
/* Uniform in [0, 1), and in (0, 1) (safe under log). */
double rb_test_rng_uniform(rb_test_rng *r);
double rb_test_rng_open01(rb_test_rng *r);
/* Standard normal (Box-Muller). */
double rb_test_rng_normal(rb_test_rng *r);

/* ---- synthetic models ------------------------------------------------------- */

/*
 * A synthetic model: the named shape ("tiny" when NULL; its architecture,
 * vocabulary style and norms come with it) with the dimensions given here
 * (0 keeps the shape's), random weights of `kind` ("q8_0" when NULL) from
 * `seed`, written to path by the synth tool (make-model's code). Returns
 * RB_OK, or the writer's status after printing its message.
 */
typedef struct rb_test_model_spec {
    const char *shape;
    uint32_t n_embd, n_layers, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_ctx;
    uint32_t sliding_window;
    int is_tied_output;
    const char *kind;
    uint64_t seed;
} rb_test_model_spec;

rb_status rb_test_make_model(const char *path, const rb_test_model_spec *spec);

/* ---- scratch files ------------------------------------------------------------ */

/* "<REBOUND_TEST_TMP>/<test>_<name>" into buf (the build tree's test folder;
 * each test prefixes its files with its own name). Returns buf. */
const char *rb_test_tmp_path(char *buf, size_t size, const char *test, const char *name);

#endif
