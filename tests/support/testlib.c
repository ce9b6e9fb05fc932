/*
 * testlib.c - the tests' shared helpers (testlib.h).
 */
#include "testlib.h"

#include <math.h>
#include <stdio.h>

#include "synth.h"

uint64_t rb_test_rng_u64(rb_test_rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint32_t rb_test_rng_below(rb_test_rng *r, uint32_t n)
{
    return (uint32_t)((rb_test_rng_u64(r) >> 32) * n >> 32);
}

double rb_test_rng_uniform(rb_test_rng *r)
{
    return (double)(rb_test_rng_u64(r) >> 11) * 0x1.0p-53;
}

double rb_test_rng_open01(rb_test_rng *r)
{
    return ((double)(rb_test_rng_u64(r) >> 11) + 0.5) * 0x1.0p-53;
}

double rb_test_rng_normal(rb_test_rng *r)
{
    double u1 = rb_test_rng_open01(r), u2 = rb_test_rng_open01(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

rb_status rb_test_make_model(const char *path, const rb_test_model_spec *spec)
{
    const char *shape = spec->shape ? spec->shape : "tiny", *kname = spec->kind ? spec->kind : "q8_0";
    const rb_synth_shape *base = rb_synth_shape_find(shape);
    const rb_file_kind *kind = rb_file_kind_find(kname);
    if (!base || !kind) {
        fprintf(stderr, "testlib: no shape '%s' or kind '%s'\n", shape, kname);
        return RB_E_NOT_FOUND;
    }
    rb_synth_shape s = *base;
    s.name = "custom";
#define KEEP_OR(field) s.field = spec->field ? spec->field : s.field
    KEEP_OR(n_embd);
    KEEP_OR(n_layers);
    KEEP_OR(n_head);
    KEEP_OR(n_head_kv);
    KEEP_OR(head_dim);
    KEEP_OR(sliding_window);
    KEEP_OR(n_ff);
    KEEP_OR(n_vocab);
    KEEP_OR(n_ctx);
#undef KEEP_OR
    s.is_tied_output = spec->is_tied_output;
    rb_synth_params sp = {s, kind, spec->seed, 2};
    rb_error err;
    rb_status st = rb_synth_write(path, &sp, NULL, &err);
    if (st != RB_OK)
        fprintf(stderr, "testlib: writing the model %s: %s\n", path, err.message);
    return st;
}

const char *rb_test_tmp_path(char *buf, size_t size, const char *test, const char *name)
{
    snprintf(buf, size, "%s/%s_%s", REBOUND_TEST_TMP, test, name);
    return buf;
}
