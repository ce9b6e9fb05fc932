/*
 * make_corpus.c - writes the fuzzer's seed files (a few hundred bytes to a
 * few KB each) with the GGUF writer, so the seeds cover every metadata
 * type, nested arrays, non-default alignment, both versions and several
 * tensor types without being large. Usage: make_corpus <dir>.
 *
 * Build (from the repository root, after a normal build):
 *   cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc fuzz/make_corpus.c \
 *      build/librebound_static.a -lm -lpthread -o build/make_corpus
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_write.h"
#include "quant.h"

static int n_failed;

static void check(rb_status st, const char *what)
{
    if (st != RB_OK) {
        fprintf(stderr, "make_corpus: %s: %s\n", what, rb_status_name(st));
        n_failed++;
    }
}

/* A raw value: type u32 followed by the bytes in buf[0, *n). */
static void put(uint8_t *buf, size_t *n, const void *p, size_t k)
{
    memcpy(buf + *n, p, k);
    *n += k;
}

static void put_u32(uint8_t *buf, size_t *n, uint32_t v) { put(buf, n, &v, 4); }
static void put_u64(uint8_t *buf, size_t *n, uint64_t v) { put(buf, n, &v, 8); }

static void put_str(uint8_t *buf, size_t *n, const char *s, size_t len)
{
    put_u64(buf, n, len);
    put(buf, n, s, len);
}

/* array<array>: [u16{1,2}, string{"x", "a\0b"}, array{i8{-1}}, f32{}] */
static void set_nested(rb_gguf_writer *w)
{
    uint8_t b[256];
    size_t n = 0;
    put_u32(b, &n, RB_GGUF_ARRAY);
    put_u32(b, &n, RB_GGUF_ARRAY);
    put_u64(b, &n, 4);
    put_u32(b, &n, RB_GGUF_U16);
    put_u64(b, &n, 2);
    uint16_t h[2] = {1, 2};
    put(b, &n, h, sizeof h);
    put_u32(b, &n, RB_GGUF_STRING);
    put_u64(b, &n, 2);
    put_str(b, &n, "x", 1);
    put_str(b, &n, "a\0b", 3);
    put_u32(b, &n, RB_GGUF_ARRAY);
    put_u64(b, &n, 1);
    put_u32(b, &n, RB_GGUF_I8);
    put_u64(b, &n, 1);
    int8_t m1 = -1;
    put(b, &n, &m1, 1);
    put_u32(b, &n, RB_GGUF_F32);
    put_u64(b, &n, 0);
    check(rb_gguf_writer_set_raw(w, "test.nested", b, n), "nested");
}

/* depth levels of array<array<...array<u8>{7}...>> */
static void set_deep(rb_gguf_writer *w, int depth)
{
    uint8_t b[256];
    size_t n = 0;
    put_u32(b, &n, RB_GGUF_ARRAY);
    for (int d = 0; d < depth; d++) {
        put_u32(b, &n, d + 1 < depth ? RB_GGUF_ARRAY : RB_GGUF_U8);
        put_u64(b, &n, 1);
    }
    uint8_t seven = 7;
    put(b, &n, &seven, 1);
    check(rb_gguf_writer_set_raw(w, "test.deep", b, n), "deep");
}

static void scalar_raw(rb_gguf_writer *w, const char *key, uint32_t type, const void *v, size_t k)
{
    uint8_t b[16];
    size_t n = 0;
    put_u32(b, &n, type);
    put(b, &n, v, k);
    check(rb_gguf_writer_set_raw(w, key, b, n), key);
}

/* Writes tensors of the given types, each [row, 1], with patterned bytes. */
static void add_tensors(rb_gguf_writer *w, int n, const uint32_t *types, const uint64_t *rows)
{
    char name[32];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "blk.%d.weight", i);
        uint64_t dims[2] = {rows[i], 1};
        check(rb_gguf_writer_add_tensor(w, name, types[i], 2, dims), name);
    }
    check(rb_gguf_writer_begin_data(w), "begin_data");
    for (int i = 0; i < n; i++) {
        uint64_t nb = rb_type_row_bytes(types[i], rows[i]);
        uint8_t *d = malloc(nb);
        for (uint64_t j = 0; j < nb; j++)
            d[j] = (uint8_t)(j * 13 + i);
        check(rb_gguf_writer_write(w, d, nb), "write");
        free(d);
    }
}

static rb_gguf_writer *start(const char *dir, const char *name, uint32_t alignment, char *path)
{
    snprintf(path, 1024, "%s/%s", dir, name);
    rb_gguf_writer *w = NULL;
    rb_error err = {0};
    if (rb_gguf_writer_create(path, alignment, NULL, &w, &err) != RB_OK) {
        fprintf(stderr, "make_corpus: %s\n", err.message);
        exit(1);
    }
    return w;
}

static void finish(rb_gguf_writer *w)
{
    check(rb_gguf_writer_finish(w), rb_gguf_writer_errmsg(w));
    rb_gguf_writer_destroy(w);
}

/* Rewrites the version field of a finished file. */
static void set_version(const char *path, uint32_t version)
{
    FILE *f = fopen(path, "r+b");
    if (!f || fseek(f, 4, SEEK_SET) != 0 || fwrite(&version, 4, 1, f) != 1)
        n_failed++;
    if (f)
        fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus <dir>\n");
        return 2;
    }
    const char *dir = argv[1];
    char path[1024];
    static const char *const strs[] = {"<unk>", "a", "", "bc"};

    /* basic: a string, scalars, a string array, a nested array, 2 tensors */
    rb_gguf_writer *w = start(dir, "basic.gguf", 0, path);
    rb_gguf_writer_set_str(w, "general.architecture", "llama");
    rb_gguf_writer_set_u32(w, "llama.block_count", 2);
    rb_gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.f);
    rb_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 1);
    rb_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", 4, strs);
    rb_gguf_writer_set_array(w, "tokenizer.ggml.token_type", RB_GGUF_I32, 4,
                             (int32_t[]){2, 1, 1, 1});
    set_nested(w);
    add_tensors(w, 2, (uint32_t[]){RB_TYPE_F32, RB_TYPE_Q8_0}, (uint64_t[]){32, 32});
    finish(w);

    /* the same, as version 2 */
    w = start(dir, "basic-v2.gguf", 0, path);
    rb_gguf_writer_set_str(w, "general.architecture", "llama");
    rb_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", 3, strs);
    add_tensors(w, 2, (uint32_t[]){RB_TYPE_F16, RB_TYPE_Q4_0}, (uint64_t[]){32, 32});
    finish(w);
    set_version(path, 2);

    /* alignment 64, three tensors */
    w = start(dir, "align64.gguf", 64, path);
    rb_gguf_writer_set_u64(w, "test.u64", 1ull << 40);
    add_tensors(w, 3, (uint32_t[]){RB_TYPE_Q4_0, RB_TYPE_F16, RB_TYPE_Q5_1},
                (uint64_t[]){64, 32, 32});
    finish(w);

    /* K-quants: one super-block each */
    w = start(dir, "kquants.gguf", 0, path);
    rb_gguf_writer_set_str(w, "general.architecture", "qwen3");
    add_tensors(w, 2, (uint32_t[]){RB_TYPE_Q4_K, RB_TYPE_Q6_K}, (uint64_t[]){256, 256});
    finish(w);

    /* every scalar type and an array of each */
    w = start(dir, "types.gguf", 0, path);
    uint8_t u8 = 200;
    int8_t i8 = -3;
    uint16_t u16 = 60000;
    int16_t i16 = -20000;
    int64_t i64 = -5;
    double f64 = 0.5;
    scalar_raw(w, "t.u8", RB_GGUF_U8, &u8, 1);
    scalar_raw(w, "t.i8", RB_GGUF_I8, &i8, 1);
    scalar_raw(w, "t.u16", RB_GGUF_U16, &u16, 2);
    scalar_raw(w, "t.i16", RB_GGUF_I16, &i16, 2);
    rb_gguf_writer_set_u32(w, "t.u32", 7);
    rb_gguf_writer_set_i32(w, "t.i32", -7);
    rb_gguf_writer_set_f32(w, "t.f32", 1.25f);
    rb_gguf_writer_set_bool(w, "t.bool", 0);
    rb_gguf_writer_set_str(w, "t.str", "");
    rb_gguf_writer_set_u64(w, "t.u64", 9);
    scalar_raw(w, "t.i64", RB_GGUF_I64, &i64, 8);
    scalar_raw(w, "t.f64", RB_GGUF_F64, &f64, 8);
    static const uint32_t fixed[] = {RB_GGUF_U8, RB_GGUF_I8, RB_GGUF_U16, RB_GGUF_I16,
                                     RB_GGUF_U32, RB_GGUF_I32, RB_GGUF_F32, RB_GGUF_BOOL,
                                     RB_GGUF_U64, RB_GGUF_I64, RB_GGUF_F64};
    static const uint8_t elems[16] = {1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "a.%s", rb_gguf_type_name(fixed[i]));
        rb_gguf_writer_set_array(w, key, fixed[i], 2, elems);
    }
    rb_gguf_writer_set_array(w, "a.empty", RB_GGUF_U32, 0, NULL);
    rb_gguf_writer_set_str_array(w, "a.strs.empty", 0, NULL);
    add_tensors(w, 1, (uint32_t[]){RB_TYPE_F32}, (uint64_t[]){8});
    finish(w);

    /* arrays nested to the limit (8 levels) */
    w = start(dir, "deep.gguf", 0, path);
    set_deep(w, 8);
    add_tensors(w, 1, (uint32_t[]){RB_TYPE_I8}, (uint64_t[]){32});
    finish(w);

    /* nothing but the header */
    w = start(dir, "empty.gguf", 0, path);
    finish(w);

    return n_failed ? 1 : 0;
}
