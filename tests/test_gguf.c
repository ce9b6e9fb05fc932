/*
 * test_gguf.c - the GGUF reader (src/format/gguf.c) and writer (src/format/gguf_write.c).
 *
 * Four parts:
 *   1. broken files: a table of hostile files, each a small valid file built
 *      byte by byte in this file with one field corrupted; each must be
 *      refused with its expected status and a message naming the field and
 *      value, through rb_gguf_open_memory, rb_gguf_open (pread) and
 *      rb_gguf_open (mmap). Then every prefix of the valid file, and every
 *      byte of it overwritten with a few values, must open or fail cleanly
 *      (the buffers are exact-size heap copies, so ASan sees any over-read).
 *   2. round trips through the writer: every metadata type, nested arrays,
 *      strings with NUL bytes, six tensor types at alignment 64, compared
 *      byte for byte with an encoding made independently here; a header
 *      larger than the reader's first 1 MiB read; typed getters; lookups;
 *      writer misuse.
 *   3. the reference models in REBOUND_MODELS_DIR (skipped when absent).
 *   4. faults through a replaced rb_os table: the Nth pread fails, reads
 *      come back 1 byte at a time or after EINTR, the file shrinks, pwrite
 *      hits ENOSPC, fsync and rename fail. Descriptor counts are checked
 *      here; leaks are the sanitizer build's job.
 *
 * Files go to REBOUND_TEST_TMP and are removed at the end.
 */
#include "gguf.h"
#include "gguf_write.h"
#include "quant.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "testlib.h"

#ifndef REBOUND_TEST_TMP
#define REBOUND_TEST_TMP "."
#endif
#ifndef REBOUND_MODELS_DIR
#define REBOUND_MODELS_DIR "../shared/models"
#endif

static char tmp_path_buf[4][1024];

/* A path under REBOUND_TEST_TMP; slot picks one of four static buffers. */
static const char *tmp_path(int slot, const char *name)
{
    return rb_test_tmp_path(tmp_path_buf[slot], sizeof tmp_path_buf[slot], "test_gguf", name);
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

static uint8_t *read_whole(const char *path, size_t *n_out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
    if (b && n > 0 && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *n_out = (size_t)n;
    return b;
}

/* ---- byte builder ------------------------------------------------------- */

typedef struct bytes {
    uint8_t *p;
    size_t n, cap;
} bytes;

static void b_put(bytes *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np)
            abort();
        b->p = np;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void b_u8(bytes *b, uint8_t v) { b_put(b, &v, 1); }
static void b_u16(bytes *b, uint16_t v) { b_put(b, &v, 2); }
static void b_u32(bytes *b, uint32_t v) { b_put(b, &v, 4); }
static void b_u64(bytes *b, uint64_t v) { b_put(b, &v, 8); }
static void b_str(bytes *b, const char *s, size_t n) { b_u64(b, n); b_put(b, s, n); }
static void b_cstr(bytes *b, const char *s) { b_str(b, s, strlen(s)); }
static void b_free(bytes *b) { free(b->p); *b = (bytes){0}; }

static void patch_u32(bytes *b, size_t at, uint32_t v) { memcpy(b->p + at, &v, 4); }
static void patch_u64(bytes *b, size_t at, uint64_t v) { memcpy(b->p + at, &v, 8); }

/* ---- part 1: broken files ----------------------------------------------- */

#define SPEC_MAX_KV 8
#define SPEC_MAX_T 4

typedef struct kv_spec {
    char key[128];
    size_t key_len;
    uint8_t raw[512]; /* value type u32 + value */
    size_t raw_len;
} kv_spec;

typedef struct tensor_spec {
    char name[128];
    size_t name_len;
    uint32_t n_dims;
    uint64_t dims[6];
    uint32_t type;
    uint64_t offset;
    int is_offset_set;  /* else laid out after the previous tensor */
} tensor_spec;

typedef struct file_spec {
    char magic[4];
    uint32_t version;
    uint64_t n_tensors, n_kv; /* as written; set from the lists by default */
    int n_kv_items, n_t;
    kv_spec kv[SPEC_MAX_KV];
    tensor_spec t[SPEC_MAX_T];
    uint32_t alignment;       /* of the layout the builder makes */
} file_spec;

/* Where the builder put things, for corruptions and truncations. */
typedef struct marks {
    size_t kv[SPEC_MAX_KV];       /* key length field */
    size_t kv_value[SPEC_MAX_KV]; /* value type field */
    size_t tinfo[SPEC_MAX_T];     /* name length field */
    size_t data;                  /* data section */
    uint64_t t_offset[SPEC_MAX_T];
} marks;

static void kv_raw(kv_spec *kv, const char *key, const bytes *raw)
{
    kv->key_len = strlen(key);
    memcpy(kv->key, key, kv->key_len);
    if (raw->n > sizeof kv->raw)
        abort();
    memcpy(kv->raw, raw->p, raw->n);
    kv->raw_len = raw->n;
}

static void kv_u32(kv_spec *kv, const char *key, uint32_t v)
{
    bytes r = {0};
    b_u32(&r, RB_GGUF_U32);
    b_u32(&r, v);
    kv_raw(kv, key, &r);
    b_free(&r);
}

static void kv_u64(kv_spec *kv, const char *key, uint64_t v)
{
    bytes r = {0};
    b_u32(&r, RB_GGUF_U64);
    b_u64(&r, v);
    kv_raw(kv, key, &r);
    b_free(&r);
}

/* depth levels of array<array<...array<u8>{}...>>, each holding one. */
static void kv_nested(kv_spec *kv, const char *key, int depth)
{
    bytes r = {0};
    b_u32(&r, RB_GGUF_ARRAY);
    for (int d = 0; d < depth; d++) {
        b_u32(&r, d + 1 < depth ? RB_GGUF_ARRAY : RB_GGUF_U8);
        b_u64(&r, d + 1 < depth ? 1 : 0);
    }
    kv_raw(kv, key, &r);
    b_free(&r);
}

static void tensor(tensor_spec *t, const char *name, uint32_t type, uint32_t n_dims,
                   uint64_t d0, uint64_t d1)
{
    memset(t, 0, sizeof *t);
    t->name_len = strlen(name);
    memcpy(t->name, name, t->name_len);
    t->type = type;
    t->n_dims = n_dims;
    t->dims[0] = d0;
    t->dims[1] = d1;
    for (int d = 2; d < 6; d++)
        t->dims[d] = 1;
}

static uint64_t spec_tensor_bytes(const tensor_spec *t)
{
    uint64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims && d < 6; d++)
        rows *= t->dims[d];
    uint64_t row = rb_type_row_bytes(t->type, t->dims[0]);
    if (t->n_dims == 0 || row == 0 || rows == 0 || row > 4096 || rows > 4096)
        return 32; /* a broken shape: any small size will do */
    return row * rows;
}

/*
 * The valid base file: five kvs (string, i32 array, string array, f32, u32),
 * three tensors
 *   a F32 [8, 2]   64 bytes at 0x00
 *   b Q4_0 [32, 2] 36 bytes at 0x40
 *   c F16 [16]     32 bytes at 0x80, ending exactly at the end of the file.
 */
static void base_spec(file_spec *s)
{
    memset(s, 0, sizeof *s);
    memcpy(s->magic, "GGUF", 4);
    s->version = 3;
    s->alignment = 32;
    bytes r = {0};
    b_u32(&r, RB_GGUF_STRING);
    b_cstr(&r, "llama");
    kv_raw(&s->kv[0], "general.architecture", &r);
    r.n = 0;
    b_u32(&r, RB_GGUF_ARRAY);
    b_u32(&r, RB_GGUF_I32);
    b_u64(&r, 3);
    b_u32(&r, 1);
    b_u32(&r, 2);
    b_u32(&r, 3);
    kv_raw(&s->kv[1], "test.i32s", &r);
    r.n = 0;
    b_u32(&r, RB_GGUF_ARRAY);
    b_u32(&r, RB_GGUF_STRING);
    b_u64(&r, 2);
    b_cstr(&r, "a");
    b_cstr(&r, "bc");
    kv_raw(&s->kv[2], "test.strs", &r);
    r.n = 0;
    b_u32(&r, RB_GGUF_F32);
    float half = 0.5f;
    b_put(&r, &half, 4);
    kv_raw(&s->kv[3], "test.f32", &r);
    b_free(&r);
    /* last, so that a cut inside it leaves enough bytes for the counts */
    kv_u32(&s->kv[4], "test.u32", 7);
    s->n_kv_items = 5;
    tensor(&s->t[0], "a", RB_TYPE_F32, 2, 8, 2);
    tensor(&s->t[1], "b", RB_TYPE_Q4_0, 2, 32, 2);
    tensor(&s->t[2], "c", RB_TYPE_F16, 1, 16, 1);
    s->n_t = 3;
    s->n_tensors = UINT64_MAX; /* UINT64_MAX: the list's count */
    s->n_kv = UINT64_MAX;
}

static void build(const file_spec *s, bytes *f, marks *m)
{
    memset(m, 0, sizeof *m);
    f->n = 0;
    b_put(f, s->magic, 4);
    b_u32(f, s->version);
    b_u64(f, s->n_tensors == UINT64_MAX ? (uint64_t)s->n_t : s->n_tensors);
    b_u64(f, s->n_kv == UINT64_MAX ? (uint64_t)s->n_kv_items : s->n_kv);
    for (int i = 0; i < s->n_kv_items; i++) {
        m->kv[i] = f->n;
        b_str(f, s->kv[i].key, s->kv[i].key_len);
        m->kv_value[i] = f->n;
        b_put(f, s->kv[i].raw, s->kv[i].raw_len);
    }
    uint64_t next = 0, data_end = 0;
    for (int i = 0; i < s->n_t; i++) {
        const tensor_spec *t = &s->t[i];
        uint64_t off = t->is_offset_set ? t->offset : next;
        uint64_t nb = spec_tensor_bytes(t);
        m->t_offset[i] = off;
        if (off < (1u << 20) && off + nb > data_end)
            data_end = off + nb;
        next = (off + nb + s->alignment - 1) / s->alignment * s->alignment;
        m->tinfo[i] = f->n;
        b_str(f, t->name, t->name_len);
        b_u32(f, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims && d < 6; d++)
            b_u64(f, t->dims[d]);
        b_u32(f, t->type);
        b_u64(f, off);
    }
    while (f->n % s->alignment)
        b_u8(f, 0);
    m->data = f->n;
    for (uint64_t i = 0; i < data_end; i++)
        b_u8(f, (uint8_t)(i * 7 + 3));
}

/* Touches every value and tensor of an open file; returns a checksum so the
 * reads are not optimized away. Used on files that merely must not crash. */
static uint64_t walk_value(const rb_gguf_value *v, int depth, uint64_t *budget);

static uint64_t walk_array(const rb_gguf_array *a, int depth, uint64_t *budget)
{
    uint64_t sum = a->n;
    for (uint64_t i = 0; i < a->n && *budget > 0; i++, (*budget)--) {
        rb_gguf_value e;
        if (rb_gguf_array_get(a, i, &e) != RB_OK)
            return sum + 1;
        sum += walk_value(&e, depth + 1, budget);
    }
    return sum;
}

static uint64_t walk_value(const rb_gguf_value *v, int depth, uint64_t *budget)
{
    uint64_t sum = v->type;
    if (v->type == RB_GGUF_STRING) {
        for (uint64_t k = 0; k < v->v.str.len; k++)
            sum += (uint8_t)v->v.str.ptr[k];
    } else if (v->type == RB_GGUF_ARRAY) {
        if (depth <= RB_GGUF_MAX_ARRAY_DEPTH)
            sum += walk_array(&v->v.arr, depth, budget);
    } else {
        sum += v->v.u64;
    }
    return sum;
}

static uint64_t walk_all(const rb_gguf *g)
{
    uint64_t sum = 0, budget = 1u << 16;
    for (uint64_t i = 0; i < rb_gguf_n_kv(g); i++) {
        const rb_gguf_kv *kv = rb_gguf_kv_at(g, i);
        sum += walk_value(&kv->value, 0, &budget) + kv->raw_len;
        CHECK(rb_gguf_find_kv(g, kv->key) == kv);
        uint32_t u32;
        uint64_t u64;
        float f;
        int b;
        rb_gguf_str s;
        rb_gguf_array a;
        sum += (uint64_t)rb_gguf_get_u32(g, kv->key, &u32) + rb_gguf_get_u64(g, kv->key, &u64) +
               rb_gguf_get_f32(g, kv->key, &f) + rb_gguf_get_bool(g, kv->key, &b) +
               rb_gguf_get_str(g, kv->key, &s) + rb_gguf_get_array(g, kv->key, UINT32_MAX, &a);
    }
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        CHECK(rb_gguf_find_tensor(g, t->name) == t);
        CHECK(t->file_offset + t->n_bytes <= rb_gguf_file_size(g));
        const uint8_t *d = rb_gguf_tensor_data(g, t);
        if (d)
            sum += d[0] + d[t->n_bytes - 1];
    }
    return sum;
}

typedef struct bad_case {
    const char *name;
    void (*edit)(file_spec *s);                 /* on the spec, or NULL */
    void (*post)(bytes *f, const marks *m);     /* on the bytes, or NULL */
    rb_status status;
    const char *msg;   /* the message must contain this (NULL for RB_OK) */
    const char *msg2;  /* and this, when not NULL */
} bad_case;

/* The edits, one per case. */
static void e_magic(file_spec *s) { memcpy(s->magic, "GGUX", 4); }
static void e_version1(file_spec *s) { s->version = 1; }
static void e_version7(file_spec *s) { s->version = 7; }
static void e_big_endian(file_spec *s) { s->version = 0x03000000u; }
static void e_version2(file_spec *s) { s->version = 2; }
static void e_n_tensors_absurd(file_spec *s) { s->n_tensors = 1ull << 60; }
static void e_n_kv_absurd(file_spec *s) { s->n_kv = 1ull << 60; }
static void e_n_kv_max(file_spec *s) { s->n_kv = UINT64_MAX - 1; }
static void e_nested_9(file_spec *s) { kv_nested(&s->kv[2], "test.nested", 9); }
static void e_nested_8(file_spec *s) { kv_nested(&s->kv[2], "test.nested", 8); }
static void e_empty_key(file_spec *s) { s->kv[1].key_len = 0; }
static void e_nul_key(file_spec *s) { memcpy(s->kv[1].key, "te\0st", 5); s->kv[1].key_len = 5; }
static void e_dup_key(file_spec *s) { memcpy(s->kv[2].key, "test.u32", 9); s->kv[2].key_len = 8; }
static void e_align_u64(file_spec *s) { kv_u64(&s->kv[s->n_kv_items++], "general.alignment", 32); }
static void e_align_0(file_spec *s) { kv_u32(&s->kv[s->n_kv_items++], "general.alignment", 0); }
static void e_align_48(file_spec *s) { kv_u32(&s->kv[s->n_kv_items++], "general.alignment", 48); }
static void e_align_64(file_spec *s) { kv_u32(&s->kv[s->n_kv_items++], "general.alignment", 64); s->alignment = 64; }
static void e_ndims_0(file_spec *s) { s->t[1].n_dims = 0; }
static void e_ndims_5(file_spec *s) { s->t[1].n_dims = 5; }
static void e_ndims_4(file_spec *s) { s->t[0].n_dims = 4; s->t[0].dims[2] = 1; s->t[0].dims[3] = 1; }
static void e_dim_0(file_spec *s) { s->t[1].dims[1] = 0; }
static void e_dims_overflow(file_spec *s) { s->t[0].dims[0] = 1ull << 32; s->t[0].dims[1] = 1ull << 31; }
static void e_bytes_overflow(file_spec *s) { s->t[0].n_dims = 1; s->t[0].dims[0] = 1ull << 62; }
static void e_type_99(file_spec *s) { s->t[1].type = 99; }
static void e_type_4(file_spec *s) { s->t[1].type = 4; }
static void e_row_33(file_spec *s) { s->t[1].dims[0] = 33; }
static void e_misaligned(file_spec *s) { s->t[1].offset = 0x44; s->t[1].is_offset_set = 1; }
static void e_beyond(file_spec *s) { s->t[2].offset = 0x100000; s->t[2].is_offset_set = 1; }
static void e_offset_wrap(file_spec *s) { s->t[2].offset = UINT64_MAX - 31; s->t[2].is_offset_set = 1; }
static void e_overlap(file_spec *s) { s->t[1].offset = 0x20; s->t[1].is_offset_set = 1; }
static void e_dup_tensor(file_spec *s) { s->t[2].name[0] = 'b'; }
static void e_long_name(file_spec *s) { memset(s->t[1].name, 'n', 64); s->t[1].name_len = 64; }
static void e_name_63(file_spec *s) { memset(s->t[1].name, 'n', 63); s->t[1].name_len = 63; }
static void e_empty_name(file_spec *s) { s->t[1].name_len = 0; }
static void e_nul_name(file_spec *s) { memcpy(s->t[1].name, "b\0", 2); s->t[1].name_len = 2; }
static void e_no_tensors(file_spec *s) { s->n_t = 0; s->n_kv_items = 0; }

/* The byte-level corruptions, one per case. */
static void p_empty(bytes *f, const marks *m) { (void)m; f->n = 0; }
static void p_three(bytes *f, const marks *m) { (void)m; f->n = 3; }
static void p_cut_n_tensors(bytes *f, const marks *m) { (void)m; f->n = 12; }
static void p_cut_n_kv(bytes *f, const marks *m) { (void)m; f->n = 20; }
/* kv #4 is "test.u32": cut after 3 of its 8 key bytes */
static void p_cut_key(bytes *f, const marks *m) { f->n = m->kv[4] + 8 + 3; }
/* cut after 2 of the u32 value's 4 bytes */
static void p_cut_value(bytes *f, const marks *m) { f->n = m->kv_value[4] + 4 + 2; }
/* tensor #1 is "b": cut 3 bytes into dims[0] */
static void p_cut_tinfo(bytes *f, const marks *m) { f->n = m->tinfo[1] + 8 + 1 + 4 + 3; }
static void p_cut_data(bytes *f, const marks *m) { f->n = m->data + 0x80 + 10; }
static void p_key_len(bytes *f, const marks *m) { patch_u64(f, m->kv[1], 1ull << 40); }
static void p_value_len(bytes *f, const marks *m) { patch_u64(f, m->kv_value[0] + 4, 1ull << 40); }
static void p_fixed_count(bytes *f, const marks *m) { patch_u64(f, m->kv_value[1] + 8, 1000000000); }
static void p_str_count(bytes *f, const marks *m) { patch_u64(f, m->kv_value[2] + 8, 1000000000); }
static void p_str_elem_len(bytes *f, const marks *m) { patch_u64(f, m->kv_value[2] + 16, 1ull << 40); }
static void p_value_type(bytes *f, const marks *m) { patch_u32(f, m->kv_value[4], 13); }
static void p_elem_type(bytes *f, const marks *m) { patch_u32(f, m->kv_value[1] + 4, 13); }
static void p_name_len(bytes *f, const marks *m) { patch_u64(f, m->tinfo[1], UINT64_MAX); }

static const bad_case bad_cases[] = {
    {"empty file", NULL, p_empty, RB_E_FORMAT, "file is 0 bytes: too small for the magic", NULL},
    {"3-byte file", NULL, p_three, RB_E_FORMAT, "file is 3 bytes", NULL},
    {"bad magic", e_magic, NULL, RB_E_FORMAT, "bad magic 0x58554747 at offset 0", "not a GGUF file"},
    {"version 1", e_version1, NULL, RB_E_UNSUPPORTED, "version 1 at offset 4 is obsolete", NULL},
    {"version 7", e_version7, NULL, RB_E_UNSUPPORTED, "unknown version 7 at offset 4", NULL},
    {"big-endian version", e_big_endian, NULL, RB_E_UNSUPPORTED, "version field 0x03000000", "big-endian"},
    {"truncated in n_tensors", NULL, p_cut_n_tensors, RB_E_FORMAT, "n_tensors: truncated: needs 8 bytes at offset 0x8", NULL},
    {"truncated in n_kv", NULL, p_cut_n_kv, RB_E_FORMAT, "n_kv: truncated: needs 8 bytes at offset 0x10", "has 4 left"},
    {"truncated in a key", NULL, p_cut_key, RB_E_FORMAT, "kv #4: key: string length 8", "exceeds the 3 bytes left"},
    {"truncated in a value", NULL, p_cut_value, RB_E_FORMAT, "kv #4 'test.u32': value: truncated: needs 4 bytes", "has 2 left"},
    {"truncated in a tensor info", NULL, p_cut_tinfo, RB_E_FORMAT, "tensor #1 'b': dims: truncated: needs 8 bytes", "has 3 left"},
    {"truncated in the tensor data", NULL, p_cut_data, RB_E_FORMAT, "tensor #2 'c': data [0x80, +32)", "ends beyond the file size"},
    {"n_tensors 2^60", e_n_tensors_absurd, NULL, RB_E_FORMAT, "n_tensors 1152921504606846976 at offset 0x8", "cannot hold that many tensor infos"},
    {"n_kv 2^60", e_n_kv_absurd, NULL, RB_E_FORMAT, "n_kv 1152921504606846976 at offset 0x10", "cannot hold that many key-value pairs"},
    {"n_kv 2^64-2", e_n_kv_max, NULL, RB_E_FORMAT, "n_kv 18446744073709551614", NULL},
    {"key length beyond the file", NULL, p_key_len, RB_E_FORMAT, "kv #1: key: string length 1099511627776", "exceeds the"},
    {"string value length beyond the file", NULL, p_value_len, RB_E_FORMAT, "kv #0 'general.architecture': string value: string length 1099511627776", NULL},
    {"string element length beyond the file", NULL, p_str_elem_len, RB_E_FORMAT, "kv #2 'test.strs': string value: string length 1099511627776", NULL},
    {"fixed-size array count beyond the file", NULL, p_fixed_count, RB_E_FORMAT, "kv #1 'test.i32s': array count 1000000000", "elements of type i32 need at least 4 bytes each"},
    {"string array count beyond the file", NULL, p_str_count, RB_E_FORMAT, "kv #2 'test.strs': array count 1000000000", "elements of type string need at least 8 bytes each"},
    {"arrays nested 9 deep", e_nested_9, NULL, RB_E_FORMAT, "kv #2 'test.nested': arrays nested deeper than 8", NULL},
    {"unknown value type 13", NULL, p_value_type, RB_E_FORMAT, "kv #4 'test.u32': unknown value type 13", NULL},
    {"unknown array element type 13", NULL, p_elem_type, RB_E_FORMAT, "kv #1 'test.i32s': unknown array element type 13", NULL},
    {"empty key", e_empty_key, NULL, RB_E_FORMAT, "kv #1 '': key at offset", "is empty or holds a NUL byte"},
    {"key with a NUL byte", e_nul_key, NULL, RB_E_FORMAT, "kv #1 'te", "is empty or holds a NUL byte"},
    {"duplicate key", e_dup_key, NULL, RB_E_FORMAT, "duplicate key name 'test.u32' (entries #2 and #4)", NULL},
    {"general.alignment of type u64", e_align_u64, NULL, RB_E_FORMAT, "kv 'general.alignment'", "type u64, expected u32"},
    {"general.alignment 0", e_align_0, NULL, RB_E_FORMAT, "kv 'general.alignment'", "value 0 is not a power of two"},
    {"general.alignment 48", e_align_48, NULL, RB_E_FORMAT, "kv 'general.alignment'", "value 48 is not a power of two"},
    {"tensor n_dims 0", e_ndims_0, NULL, RB_E_FORMAT, "tensor #1 'b': n_dims 0 at offset", "is not in 1..4"},
    {"tensor n_dims 5", e_ndims_5, NULL, RB_E_FORMAT, "tensor #1 'b': n_dims 5 at offset", "is not in 1..4"},
    {"tensor dim of 0", e_dim_0, NULL, RB_E_FORMAT, "tensor #1 'b': dims[1] = 0 at offset", NULL},
    {"dims product overflows int64", e_dims_overflow, NULL, RB_E_FORMAT, "tensor #0 'a': dims[1] = 2147483648", "overflow int64"},
    {"byte size overflows uint64", e_bytes_overflow, NULL, RB_E_FORMAT, "tensor #0 'a': byte size of 4611686018427387904 F32 blocks overflows", NULL},
    {"unknown tensor type 99", e_type_99, NULL, RB_E_UNSUPPORTED, "tensor #1 'b': unknown tensor type 99", NULL},
    {"removed tensor type 4", e_type_4, NULL, RB_E_UNSUPPORTED, "tensor #1 'b': unknown tensor type 4", NULL},
    {"Q4_0 row of 33", e_row_33, NULL, RB_E_FORMAT, "tensor #1 'b': row length 33 is not a multiple of Q4_0's block of 32", NULL},
    {"misaligned tensor offset", e_misaligned, NULL, RB_E_FORMAT, "tensor #1 'b': offset 0x44", "is not a multiple of the alignment 32"},
    {"tensor data beyond the file", e_beyond, NULL, RB_E_FORMAT, "tensor #2 'c': data [0x100000, +32)", "ends beyond the file size"},
    {"offset + size wraps 2^64", e_offset_wrap, NULL, RB_E_FORMAT, "tensor #2 'c': data [0xffffffffffffffe0, +32)", "ends beyond the file size"},
    {"overlapping tensors", e_overlap, NULL, RB_E_FORMAT, "tensor 'a' data [0x0, 0x40) overlaps tensor 'b' at 0x20", NULL},
    {"duplicate tensor names", e_dup_tensor, NULL, RB_E_FORMAT, "duplicate tensor name 'b' (entries #1 and #2)", NULL},
    {"tensor name of 64 bytes", e_long_name, NULL, RB_E_FORMAT, "has length 64 (must be 1..63 bytes without NUL)", NULL},
    {"empty tensor name", e_empty_name, NULL, RB_E_FORMAT, "tensor #1 '': name at offset", "has length 0"},
    {"tensor name with a NUL byte", e_nul_name, NULL, RB_E_FORMAT, "tensor #1 'b': name at offset", "has length 2"},
    {"tensor name length 2^64-1", NULL, p_name_len, RB_E_FORMAT, "tensor #1: name: string length 18446744073709551615", NULL},
    /* just barely valid */
    {"valid: data ends exactly at EOF", NULL, NULL, RB_OK, NULL, NULL},
    {"valid: version 2", e_version2, NULL, RB_OK, NULL, NULL},
    {"valid: arrays nested 8 deep", e_nested_8, NULL, RB_OK, NULL, NULL},
    {"valid: general.alignment 64", e_align_64, NULL, RB_OK, NULL, NULL},
    {"valid: tensor name of 63 bytes", e_name_63, NULL, RB_OK, NULL, NULL},
    {"valid: n_dims 4", e_ndims_4, NULL, RB_OK, NULL, NULL},
    {"valid: no kv and no tensor", e_no_tensors, NULL, RB_OK, NULL, NULL},
};

static void check_result(const bad_case *c, const char *how, rb_status st,
                         const rb_error *err, rb_gguf *g, const rb_gguf *sentinel,
                         uint64_t n_kv, uint64_t n_tensors)
{
    if (st != c->status)
        fprintf(stderr, "case '%s' via %s: status %s, message: %s\n", c->name, how,
                rb_status_name(st), st ? err->message : "");
    CHECK_EQ_INT(st, c->status);
    if (st != RB_OK) {
        CHECK(g == sentinel); /* out unchanged on failure */
        CHECK_EQ_INT(err->status, st);
        if (c->msg)
            CHECK_CONTAINS(err->message, c->msg);
        if (c->msg2)
            CHECK_CONTAINS(err->message, c->msg2);
    } else {
        CHECK_EQ_U64(rb_gguf_n_kv(g), n_kv);
        CHECK_EQ_U64(rb_gguf_n_tensors(g), n_tensors);
        walk_all(g);
        rb_gguf_close(g);
    }
}

static void test_broken_files(void)
{
    static max_align_t sentinel_obj;
    rb_gguf *sentinel = (rb_gguf *)(void *)&sentinel_obj;
    const char *path = tmp_path(0, "broken.gguf");
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        file_spec s;
        marks m;
        bytes f = {0};
        base_spec(&s);
        if (c->edit)
            c->edit(&s);
        build(&s, &f, &m);
        if (c->post)
            c->post(&f, &m);
        uint64_t n_kv = (uint64_t)s.n_kv_items, n_tensors = (uint64_t)s.n_t;

        /* an exact-size heap copy, so that ASan flags any over-read */
        uint8_t *mem = malloc(f.n ? f.n : 1);
        if (f.n)
            memcpy(mem, f.p, f.n);
        rb_error err = {0};
        rb_gguf *g = sentinel;
        rb_status st = rb_gguf_open_memory(f.n ? mem : NULL, f.n, &g, &err);
        check_result(c, "memory", st, &err, g, sentinel, n_kv, n_tensors);

        CHECK_EQ_INT(write_file(path, f.p, f.n), 0);
        for (int mode = 0; mode < 2; mode++) {
            err = (rb_error){0};
            g = sentinel;
            st = rb_gguf_open(path, mode ? RB_GGUF_MMAP : 0, NULL, &g, &err);
            check_result(c, mode ? "mmap" : "pread", st, &err, g, sentinel, n_kv, n_tensors);
            if (st != RB_OK)
                CHECK_CONTAINS(err.message, path); /* the file is named */
        }
        free(mem);
        b_free(&f);
    }
    unlink(path);
}

/* Every prefix of the valid file fails cleanly; every byte overwritten with
 * a few values opens or fails cleanly. */
static void test_prefixes_and_byte_flips(void)
{
    file_spec s;
    marks m;
    bytes f = {0};
    base_spec(&s);
    build(&s, &f, &m);
    for (size_t n = 0; n < f.n; n++) {
        uint8_t *mem = malloc(n ? n : 1);
        memcpy(mem, f.p, n);
        rb_error err = {0};
        rb_gguf *g = NULL;
        rb_status st = rb_gguf_open_memory(mem, n, &g, &err);
        CHECK_EQ_INT(st, RB_E_FORMAT);
        CHECK(g == NULL);
        CHECK(err.message[0] != 0);
        if (st == RB_OK)
            rb_gguf_close(g);
        free(mem);
    }
    static const uint8_t values[] = {0x00, 0xff, 0x80, 0x7f};
    int n_ok = 0, n_fail = 0;
    for (size_t at = 0; at < f.n; at++) {
        for (size_t v = 0; v < sizeof values + 1; v++) {
            uint8_t *mem = malloc(f.n);
            memcpy(mem, f.p, f.n);
            mem[at] = v < sizeof values ? values[v] : (uint8_t)(mem[at] ^ 1);
            rb_error err = {0};
            rb_gguf *g = NULL;
            rb_status st = rb_gguf_open_memory(mem, f.n, &g, &err);
            if (st == RB_OK) {
                n_ok++;
                walk_all(g);
                rb_gguf_close(g);
            } else {
                n_fail++;
                CHECK(g == NULL);
                CHECK(err.message[0] != 0);
                CHECK(st == RB_E_FORMAT || st == RB_E_UNSUPPORTED);
            }
            free(mem);
        }
    }
    CHECK(n_ok > 0 && n_fail > 0);
    b_free(&f);
}

/* ---- part 2: round trips through the writer ------------------------------ */

/* An expected kv: the key and the exact bytes (type + value) the file must
 * hold, encoded here independently of the writer. */
typedef struct expect_kv {
    const char *key;
    bytes raw;
} expect_kv;

#define RT_MAX_KV 48
static expect_kv rt_kv[RT_MAX_KV];
static int rt_n_kv;

static bytes *rt_add(const char *key)
{
    rt_kv[rt_n_kv].key = key;
    rt_kv[rt_n_kv].raw = (bytes){0};
    return &rt_kv[rt_n_kv++].raw;
}

static void rt_scalar(const char *key, uint32_t type, const void *v, size_t size)
{
    bytes *r = rt_add(key);
    b_u32(r, type);
    b_put(r, v, size);
}

static void rt_array(const char *key, uint32_t et, uint64_t n, const void *elems, size_t size)
{
    bytes *r = rt_add(key);
    b_u32(r, RB_GGUF_ARRAY);
    b_u32(r, et);
    b_u64(r, n);
    b_put(r, elems, n * size);
}

/* Fixed-size test arrays, one per scalar type. */
static const uint8_t a_u8[] = {0, 1, 255};
static const int8_t a_i8[] = {-128, 0, 127};
static const uint16_t a_u16[] = {0, 65535, 7};
static const int16_t a_i16[] = {-32768, 32767, 0};
static const uint32_t a_u32[] = {0, UINT32_MAX, 123};
static const int32_t a_i32[] = {INT32_MIN, INT32_MAX, -1};
static const float a_f32[] = {1.5f, -0.0f, 1e30f};
static const uint8_t a_bool[] = {1, 0, 1};
static const uint64_t a_u64[] = {0, UINT64_MAX, 42};
static const int64_t a_i64[] = {INT64_MIN, INT64_MAX, -7};
static const double a_f64[] = {0.1, -1e300, 2.0};

typedef struct fixed_array {
    const char *key;
    uint32_t type;
    const void *elems;
    size_t size;
} fixed_array;

static const fixed_array fixed_arrays[] = {
    {"rt.arr.u8", RB_GGUF_U8, a_u8, 1},     {"rt.arr.i8", RB_GGUF_I8, a_i8, 1},
    {"rt.arr.u16", RB_GGUF_U16, a_u16, 2},  {"rt.arr.i16", RB_GGUF_I16, a_i16, 2},
    {"rt.arr.u32", RB_GGUF_U32, a_u32, 4},  {"rt.arr.i32", RB_GGUF_I32, a_i32, 4},
    {"rt.arr.f32", RB_GGUF_F32, a_f32, 4},  {"rt.arr.bool", RB_GGUF_BOOL, a_bool, 1},
    {"rt.arr.u64", RB_GGUF_U64, a_u64, 8},  {"rt.arr.i64", RB_GGUF_I64, a_i64, 8},
    {"rt.arr.f64", RB_GGUF_F64, a_f64, 8},
};

/* Element i of a C array, as the reader should decode it. */
static int elem_matches(uint32_t type, const void *elems, uint64_t i, const rb_gguf_value *v)
{
    if (v->type != type)
        return 0;
    switch (type) {
    case RB_GGUF_U8: return v->v.u64 == ((const uint8_t *)elems)[i];
    case RB_GGUF_I8: return v->v.i64 == ((const int8_t *)elems)[i];
    case RB_GGUF_U16: return v->v.u64 == ((const uint16_t *)elems)[i];
    case RB_GGUF_I16: return v->v.i64 == ((const int16_t *)elems)[i];
    case RB_GGUF_U32: return v->v.u64 == ((const uint32_t *)elems)[i];
    case RB_GGUF_I32: return v->v.i64 == ((const int32_t *)elems)[i];
    case RB_GGUF_F32: return memcmp(&(float){(float)v->v.f64}, &((const float *)elems)[i], 4) == 0;
    case RB_GGUF_BOOL: return v->v.u64 == (((const uint8_t *)elems)[i] != 0);
    case RB_GGUF_U64: return v->v.u64 == ((const uint64_t *)elems)[i];
    case RB_GGUF_I64: return v->v.i64 == ((const int64_t *)elems)[i];
    case RB_GGUF_F64: return memcmp(&v->v.f64, &((const double *)elems)[i], 8) == 0;
    }
    return 0;
}

static const char *const str_elems[] = {"first", "", "third", ""};

/* Strings with embedded NUL bytes: (bytes, length). */
static const struct { const char *s; size_t n; } nul_strs[] = {
    {"a\0b", 3}, {"\0", 1}, {"", 0}, {"xyz", 3},
};

typedef struct rt_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t dims[4];
} rt_tensor;

static const rt_tensor rt_tensors[] = {
    {"t.f32", RB_TYPE_F32, 2, {32, 3, 1, 1}},
    {"t.f16", RB_TYPE_F16, 2, {64, 2, 1, 1}},
    {"t.q4_0", RB_TYPE_Q4_0, 2, {64, 2, 1, 1}},
    {"t.q8_0", RB_TYPE_Q8_0, 2, {32, 4, 1, 1}},
    {"t.q4_K", RB_TYPE_Q4_K, 2, {256, 2, 1, 1}},
    {"t.q6_K", RB_TYPE_Q6_K, 1, {256, 1, 1, 1}},
    {"t.4d", RB_TYPE_F32, 4, {2, 3, 4, 5}},
};
#define RT_N_TENSORS (sizeof rt_tensors / sizeof rt_tensors[0])

static uint64_t rt_tensor_bytes(const rt_tensor *t)
{
    return rb_type_row_bytes(t->type, t->dims[0]) * t->dims[1] * t->dims[2] * t->dims[3];
}

static uint8_t rt_byte(size_t tensor, uint64_t j) { return (uint8_t)(j * 31 + tensor * 17 + 1); }

/* Builds the expected kvs and writes the round-trip file; the writer gets
 * most values through its typed setters and the rest through set_raw. */
static void write_round_trip(const char *path)
{
    unlink(path); /* a leftover from an interrupted run */
    rt_n_kv = 0;
    rb_gguf_writer *w = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_gguf_writer_create(path, 64, NULL, &w, &err), RB_OK);
    if (!w)
        return;
    uint32_t align = 64;
    rt_scalar("general.alignment", RB_GGUF_U32, &align, 4); /* the writer adds it first */

    uint8_t u8 = 250;
    int8_t i8 = -100;
    uint16_t u16 = 65000;
    int16_t i16 = -30000;
    uint32_t u32 = 4000000000u;
    int32_t i32 = -2000000000;
    float f32 = 3.25f;
    uint8_t bt = 1, bf = 0;
    uint64_t u64 = (1ull << 63) + 5;
    int64_t i64 = -(1ll << 62);
    double f64 = 2.718281828459045;
    rt_scalar("rt.u8", RB_GGUF_U8, &u8, 1);
    rt_scalar("rt.i8", RB_GGUF_I8, &i8, 1);
    rt_scalar("rt.u16", RB_GGUF_U16, &u16, 2);
    rt_scalar("rt.i16", RB_GGUF_I16, &i16, 2);
    rt_scalar("rt.u32", RB_GGUF_U32, &u32, 4);
    rt_scalar("rt.i32", RB_GGUF_I32, &i32, 4);
    rt_scalar("rt.f32", RB_GGUF_F32, &f32, 4);
    rt_scalar("rt.bool", RB_GGUF_BOOL, &bt, 1);
    rt_scalar("rt.bool0", RB_GGUF_BOOL, &bf, 1);
    rt_scalar("rt.u64", RB_GGUF_U64, &u64, 8);
    rt_scalar("rt.i64", RB_GGUF_I64, &i64, 8);
    rt_scalar("rt.f64", RB_GGUF_F64, &f64, 8);
    bytes *r = rt_add("rt.str");
    b_u32(r, RB_GGUF_STRING);
    b_cstr(r, "hello, gguf");
    r = rt_add("rt.str.empty");
    b_u32(r, RB_GGUF_STRING);
    b_cstr(r, "");
    for (size_t i = 0; i < sizeof fixed_arrays / sizeof fixed_arrays[0]; i++)
        rt_array(fixed_arrays[i].key, fixed_arrays[i].type, 3, fixed_arrays[i].elems,
                 fixed_arrays[i].size);
    rt_array("rt.arr.empty", RB_GGUF_U32, 0, NULL, 4);
    r = rt_add("rt.arr.str");
    b_u32(r, RB_GGUF_ARRAY);
    b_u32(r, RB_GGUF_STRING);
    b_u64(r, 4);
    for (int i = 0; i < 4; i++)
        b_cstr(r, str_elems[i]);
    r = rt_add("rt.arr.str.empty");
    b_u32(r, RB_GGUF_ARRAY);
    b_u32(r, RB_GGUF_STRING);
    b_u64(r, 0);
    r = rt_add("rt.arr.strnul");
    b_u32(r, RB_GGUF_ARRAY);
    b_u32(r, RB_GGUF_STRING);
    b_u64(r, 4);
    for (int i = 0; i < 4; i++)
        b_str(r, nul_strs[i].s, nul_strs[i].n);
    /* [ u16{1,2,3}, string{"x",""}, array{ i8{-1,2} }, f32{} ] */
    r = rt_add("rt.arr.nested");
    b_u32(r, RB_GGUF_ARRAY);
    b_u32(r, RB_GGUF_ARRAY);
    b_u64(r, 4);
    b_u32(r, RB_GGUF_U16);
    b_u64(r, 3);
    b_u16(r, 1);
    b_u16(r, 2);
    b_u16(r, 3);
    b_u32(r, RB_GGUF_STRING);
    b_u64(r, 2);
    b_cstr(r, "x");
    b_cstr(r, "");
    b_u32(r, RB_GGUF_ARRAY);
    b_u64(r, 1);
    b_u32(r, RB_GGUF_I8);
    b_u64(r, 2);
    b_u8(r, 0xff);
    b_u8(r, 2);
    b_u32(r, RB_GGUF_F32);
    b_u64(r, 0);

    /* the writer: typed setters where it has them */
    CHECK_EQ_INT(rb_gguf_writer_set_u32(w, "rt.u32", u32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_i32(w, "rt.i32", i32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_f32(w, "rt.f32", f32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_bool(w, "rt.bool", 7), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_bool(w, "rt.bool0", 0), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_u64(w, "rt.u64", u64), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_str(w, "rt.str", "replaced below"), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_str(w, "rt.str.empty", ""), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_str(w, "rt.removed", "gone"), RB_OK);
    for (size_t i = 0; i < sizeof fixed_arrays / sizeof fixed_arrays[0]; i++)
        CHECK_EQ_INT(rb_gguf_writer_set_array(w, fixed_arrays[i].key, fixed_arrays[i].type, 3,
                                              fixed_arrays[i].elems), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_array(w, "rt.arr.empty", RB_GGUF_U32, 0, NULL), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_str_array(w, "rt.arr.str", 4, str_elems), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_str_array(w, "rt.arr.str.empty", 0, NULL), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_array(w, "rt.bad", RB_GGUF_STRING, 1, "x"), RB_E_INVALID_ARG);
    /* that failure is sticky; start over with a fresh writer */
    CHECK_EQ_INT(rb_gguf_writer_set_u32(w, "rt.after", 1), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "element type string is not a fixed-size scalar");
    rb_gguf_writer_destroy(w);
    CHECK(!file_exists(path));

    w = NULL;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 64, NULL, &w, &err), RB_OK);
    if (!w)
        return;
    /* in rt_kv order; scalars without a setter go through set_raw */
    for (int i = 1; i < rt_n_kv; i++) {
        const char *k = rt_kv[i].key;
        rb_status st;
        if (!strcmp(k, "rt.u32"))
            st = rb_gguf_writer_set_u32(w, k, u32);
        else if (!strcmp(k, "rt.i32"))
            st = rb_gguf_writer_set_i32(w, k, i32);
        else if (!strcmp(k, "rt.f32"))
            st = rb_gguf_writer_set_f32(w, k, f32);
        else if (!strcmp(k, "rt.bool"))
            st = rb_gguf_writer_set_bool(w, k, 7);
        else if (!strcmp(k, "rt.bool0"))
            st = rb_gguf_writer_set_bool(w, k, 0);
        else if (!strcmp(k, "rt.u64"))
            st = rb_gguf_writer_set_u64(w, k, u64);
        else if (!strcmp(k, "rt.str"))
            st = rb_gguf_writer_set_str(w, k, "replaced below");
        else if (!strcmp(k, "rt.str.empty"))
            st = rb_gguf_writer_set_str(w, k, "");
        else if (!strcmp(k, "rt.arr.str"))
            st = rb_gguf_writer_set_str_array(w, k, 4, str_elems);
        else if (!strcmp(k, "rt.arr.str.empty"))
            st = rb_gguf_writer_set_str_array(w, k, 0, NULL);
        else if (!strcmp(k, "rt.arr.empty"))
            st = rb_gguf_writer_set_array(w, k, RB_GGUF_U32, 0, NULL);
        else if (!strncmp(k, "rt.arr.", 7) && strcmp(k, "rt.arr.strnul") && strcmp(k, "rt.arr.nested"))
            st = rb_gguf_writer_set_array(w, k, rt_kv[i].raw.p[4], 3, rt_kv[i].raw.p + 16);
        else
            st = rb_gguf_writer_set_raw(w, k, rt_kv[i].raw.p, rt_kv[i].raw.n);
        CHECK_EQ_INT(st, RB_OK);
    }
    CHECK_EQ_INT(rb_gguf_writer_set_str(w, "rt.removed", "gone"), RB_OK);
    rb_gguf_writer_remove(w, "rt.removed");
    CHECK_EQ_INT(rb_gguf_writer_set_str(w, "rt.str", "hello, gguf"), RB_OK); /* replaces in place */

    uint64_t total = 0;
    for (size_t i = 0; i < RT_N_TENSORS; i++) {
        const rt_tensor *t = &rt_tensors[i];
        CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->dims), RB_OK);
        total += rt_tensor_bytes(t);
    }
    /* all tensor bytes as one stream, in 13-byte pieces across tensors */
    uint8_t *stream = malloc(total);
    uint64_t at = 0;
    for (size_t i = 0; i < RT_N_TENSORS; i++)
        for (uint64_t j = 0; j < rt_tensor_bytes(&rt_tensors[i]); j++)
            stream[at++] = rt_byte(i, j);
    CHECK_EQ_INT(rb_gguf_writer_begin_data(w), RB_OK);
    for (at = 0; at < total; at += 13) {
        uint64_t n = total - at < 13 ? total - at : 13;
        CHECK_EQ_INT(rb_gguf_writer_write(w, stream + at, n), RB_OK);
    }
    CHECK_EQ_U64(rb_gguf_writer_next_tensor(w), RT_N_TENSORS);
    CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_OK);
    rb_gguf_writer_destroy(w);
    free(stream);
    CHECK(file_exists(path));
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(!file_exists(tmp));
}

/* Every value and tensor of the round-trip file, in one open mode. */
static void check_round_trip(const rb_gguf *g, const char *how)
{
    fprintf(stderr, "  round trip via %s\n", how);
    CHECK_EQ_INT(rb_gguf_version(g), 3);
    CHECK_EQ_INT(rb_gguf_alignment(g), 64);
    CHECK_EQ_U64(rb_gguf_data_offset(g) % 64, 0);
    CHECK(rb_gguf_header_bytes(g) <= rb_gguf_data_offset(g));
    CHECK(rb_gguf_data_offset(g) - rb_gguf_header_bytes(g) < 64);
    CHECK_EQ_U64(rb_gguf_n_kv(g), (uint64_t)rt_n_kv);
    CHECK(rb_gguf_find_kv(g, "rt.removed") == NULL);
    /* kvs in the order written, byte-identical values */
    for (int i = 0; i < rt_n_kv && (uint64_t)i < rb_gguf_n_kv(g); i++) {
        const rb_gguf_kv *kv = rb_gguf_kv_at(g, (uint64_t)i);
        CHECK_STR_EQ(kv->key, rt_kv[i].key);
        CHECK_EQ_U64(kv->raw_len, rt_kv[i].raw.n);
        CHECK(kv->raw_len == rt_kv[i].raw.n && memcmp(kv->raw, rt_kv[i].raw.p, kv->raw_len) == 0);
        CHECK(rb_gguf_find_kv(g, rt_kv[i].key) == kv);
        CHECK_EQ_INT(kv->value.type, rt_kv[i].raw.p[0]);
    }
    CHECK(rb_gguf_kv_at(g, rb_gguf_n_kv(g)) == NULL);

    /* decoded scalars */
    const rb_gguf_kv *kv;
    if ((kv = rb_gguf_find_kv(g, "rt.u8")) != NULL) CHECK_EQ_U64(kv->value.v.u64, 250);
    if ((kv = rb_gguf_find_kv(g, "rt.i8")) != NULL) CHECK_EQ_INT(kv->value.v.i64, -100);
    if ((kv = rb_gguf_find_kv(g, "rt.u16")) != NULL) CHECK_EQ_U64(kv->value.v.u64, 65000);
    if ((kv = rb_gguf_find_kv(g, "rt.i16")) != NULL) CHECK_EQ_INT(kv->value.v.i64, -30000);
    if ((kv = rb_gguf_find_kv(g, "rt.u32")) != NULL) CHECK_EQ_U64(kv->value.v.u64, 4000000000u);
    if ((kv = rb_gguf_find_kv(g, "rt.i32")) != NULL) CHECK_EQ_INT(kv->value.v.i64, -2000000000);
    if ((kv = rb_gguf_find_kv(g, "rt.f32")) != NULL) CHECK(kv->value.v.f64 == 3.25);
    if ((kv = rb_gguf_find_kv(g, "rt.bool")) != NULL) CHECK_EQ_U64(kv->value.v.u64, 1);
    if ((kv = rb_gguf_find_kv(g, "rt.bool0")) != NULL) CHECK_EQ_U64(kv->value.v.u64, 0);
    if ((kv = rb_gguf_find_kv(g, "rt.u64")) != NULL) CHECK_EQ_U64(kv->value.v.u64, (1ull << 63) + 5);
    if ((kv = rb_gguf_find_kv(g, "rt.i64")) != NULL) CHECK(kv->value.v.i64 == -(1ll << 62));
    if ((kv = rb_gguf_find_kv(g, "rt.f64")) != NULL) CHECK(kv->value.v.f64 == 2.718281828459045);
    if ((kv = rb_gguf_find_kv(g, "rt.str")) != NULL) CHECK(rb_gguf_str_eq(kv->value.v.str, "hello, gguf"));
    if ((kv = rb_gguf_find_kv(g, "rt.str.empty")) != NULL) CHECK_EQ_U64(kv->value.v.str.len, 0);

    /* arrays, element by element */
    for (size_t i = 0; i < sizeof fixed_arrays / sizeof fixed_arrays[0]; i++) {
        const fixed_array *fa = &fixed_arrays[i];
        rb_gguf_array a;
        CHECK_EQ_INT(rb_gguf_get_array(g, fa->key, fa->type, &a), RB_OK);
        CHECK_EQ_U64(a.n, 3);
        CHECK(a.index == NULL);
        for (uint64_t e = 0; e < a.n && e < 3; e++) {
            rb_gguf_value v;
            CHECK_EQ_INT(rb_gguf_array_get(&a, e, &v), RB_OK);
            if (!elem_matches(fa->type, fa->elems, e, &v))
                fprintf(stderr, "  %s[%" PRIu64 "] differs\n", fa->key, e);
            CHECK(elem_matches(fa->type, fa->elems, e, &v));
        }
        rb_gguf_value v = {.type = 99};
        CHECK_EQ_INT(rb_gguf_array_get(&a, 3, &v), RB_E_INVALID_ARG);
        CHECK_EQ_INT(rb_gguf_array_get(&a, UINT64_MAX, &v), RB_E_INVALID_ARG);
        CHECK_EQ_INT(v.type, 99); /* unchanged */
    }
    rb_gguf_array a;
    rb_gguf_value v;
    CHECK_EQ_INT(rb_gguf_get_array(g, "rt.arr.empty", RB_GGUF_U32, &a), RB_OK);
    CHECK_EQ_U64(a.n, 0);
    CHECK_EQ_INT(rb_gguf_array_get(&a, 0, &v), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_gguf_get_array(g, "rt.arr.str.empty", RB_GGUF_STRING, &a), RB_OK);
    CHECK_EQ_U64(a.n, 0);
    CHECK_EQ_INT(rb_gguf_get_array(g, "rt.arr.str", RB_GGUF_STRING, &a), RB_OK);
    CHECK_EQ_U64(a.n, 4);
    CHECK(a.index != NULL); /* top-level string arrays are indexed */
    for (uint64_t e = 0; e < 4 && e < a.n; e++) {
        CHECK_EQ_INT(rb_gguf_array_get(&a, e, &v), RB_OK);
        CHECK_EQ_INT(v.type, RB_GGUF_STRING);
        CHECK(rb_gguf_str_eq(v.v.str, str_elems[e]));
    }
    CHECK_EQ_INT(rb_gguf_array_get(&a, 4, &v), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_gguf_get_array(g, "rt.arr.strnul", RB_GGUF_STRING, &a), RB_OK);
    CHECK_EQ_U64(a.n, 4);
    for (uint64_t e = 0; e < 4 && e < a.n; e++) {
        CHECK_EQ_INT(rb_gguf_array_get(&a, e, &v), RB_OK);
        CHECK_EQ_U64(v.v.str.len, nul_strs[e].n);
        CHECK(v.v.str.len == nul_strs[e].n && memcmp(v.v.str.ptr, nul_strs[e].s, nul_strs[e].n) == 0);
    }
    /* the nested array, walked at each level */
    CHECK_EQ_INT(rb_gguf_get_array(g, "rt.arr.nested", RB_GGUF_ARRAY, &a), RB_OK);
    CHECK_EQ_INT(rb_gguf_get_array(g, "rt.arr.nested", RB_GGUF_STRING, &a), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_array(g, "rt.arr.nested", UINT32_MAX, &a), RB_OK);
    CHECK_EQ_U64(a.n, 4);
    if (a.n == 4) {
        rb_gguf_value e0, e1, e2, e3, x;
        CHECK_EQ_INT(rb_gguf_array_get(&a, 0, &e0), RB_OK);
        CHECK_EQ_INT(rb_gguf_array_get(&a, 1, &e1), RB_OK);
        CHECK_EQ_INT(rb_gguf_array_get(&a, 2, &e2), RB_OK);
        CHECK_EQ_INT(rb_gguf_array_get(&a, 3, &e3), RB_OK);
        CHECK_EQ_INT(e0.type, RB_GGUF_ARRAY);
        CHECK_EQ_INT(e0.v.arr.type, RB_GGUF_U16);
        CHECK_EQ_U64(e0.v.arr.n, 3);
        CHECK_EQ_INT(rb_gguf_array_get(&e0.v.arr, 2, &x), RB_OK);
        CHECK_EQ_U64(x.v.u64, 3);
        CHECK_EQ_INT(e1.v.arr.type, RB_GGUF_STRING);
        CHECK_EQ_U64(e1.v.arr.n, 2);
        CHECK(e1.v.arr.index == NULL); /* nested: walked */
        CHECK_EQ_INT(rb_gguf_array_get(&e1.v.arr, 0, &x), RB_OK);
        CHECK(rb_gguf_str_eq(x.v.str, "x"));
        CHECK_EQ_INT(rb_gguf_array_get(&e1.v.arr, 1, &x), RB_OK);
        CHECK(rb_gguf_str_eq(x.v.str, ""));
        CHECK_EQ_INT(rb_gguf_array_get(&e1.v.arr, 2, &x), RB_E_INVALID_ARG);
        CHECK_EQ_INT(e2.v.arr.type, RB_GGUF_ARRAY);
        CHECK_EQ_U64(e2.v.arr.n, 1);
        rb_gguf_value inner;
        CHECK_EQ_INT(rb_gguf_array_get(&e2.v.arr, 0, &inner), RB_OK);
        CHECK_EQ_INT(inner.v.arr.type, RB_GGUF_I8);
        CHECK_EQ_U64(inner.v.arr.n, 2);
        CHECK_EQ_INT(rb_gguf_array_get(&inner.v.arr, 0, &x), RB_OK);
        CHECK_EQ_INT(x.v.i64, -1);
        CHECK_EQ_INT(rb_gguf_array_get(&inner.v.arr, 1, &x), RB_OK);
        CHECK_EQ_INT(x.v.i64, 2);
        CHECK_EQ_INT(e3.v.arr.type, RB_GGUF_F32);
        CHECK_EQ_U64(e3.v.arr.n, 0);
    }

    /* tensors: order, shape, placement, bytes */
    CHECK_EQ_U64(rb_gguf_n_tensors(g), RT_N_TENSORS);
    uint64_t prev_end = 0;
    for (size_t i = 0; i < RT_N_TENSORS && i < rb_gguf_n_tensors(g); i++) {
        const rt_tensor *e = &rt_tensors[i];
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        CHECK_STR_EQ(t->name, e->name);
        CHECK(rb_gguf_find_tensor(g, e->name) == t);
        CHECK_EQ_INT(t->type, e->type);
        CHECK_EQ_INT(t->n_dims, e->n_dims);
        for (int d = 0; d < 4; d++)
            CHECK_EQ_U64(t->dims[d], e->dims[d]);
        CHECK_EQ_U64(t->n_elems, e->dims[0] * e->dims[1] * e->dims[2] * e->dims[3]);
        CHECK_EQ_U64(t->n_bytes, rt_tensor_bytes(e));
        CHECK_EQ_U64(t->offset % 64, 0);
        CHECK(t->offset >= prev_end);
        prev_end = t->offset + t->n_bytes;
        CHECK_EQ_U64(t->file_offset, rb_gguf_data_offset(g) + t->offset);
        uint8_t *want = malloc(t->n_bytes), *got = malloc(t->n_bytes);
        for (uint64_t j = 0; j < t->n_bytes; j++)
            want[j] = rt_byte(i, j);
        rb_error err = {0};
        memset(got, 0, t->n_bytes);
        CHECK_EQ_INT(rb_gguf_read(g, t, 0, got, t->n_bytes, &err), RB_OK);
        CHECK(memcmp(got, want, t->n_bytes) == 0);
        memset(got, 0, t->n_bytes);
        CHECK_EQ_INT(rb_gguf_read(g, t, 5, got, 11, &err), RB_OK);
        CHECK(memcmp(got, want + 5, 11) == 0);
        CHECK_EQ_INT(rb_gguf_read(g, t, t->n_bytes, got, 0, &err), RB_OK);
        CHECK_EQ_INT(rb_gguf_read(g, t, t->n_bytes, got, 1, &err), RB_E_INVALID_ARG);
        CHECK_CONTAINS(err.message, "outside tensor");
        CHECK_EQ_INT(rb_gguf_read(g, t, 0, got, t->n_bytes + 1, &err), RB_E_INVALID_ARG);
        CHECK_EQ_INT(rb_gguf_read(g, t, UINT64_MAX, got, 2, &err), RB_E_INVALID_ARG);
        CHECK_EQ_INT(rb_gguf_read(g, t, 1, got, UINT64_MAX, &err), RB_E_INVALID_ARG);
        const uint8_t *p = rb_gguf_tensor_data(g, t);
        if (strcmp(how, "pread") == 0)
            CHECK(p == NULL);
        else
            CHECK(p && memcmp(p, want, t->n_bytes) == 0);
        free(want);
        free(got);
    }
    CHECK(rb_gguf_tensor_at(g, RT_N_TENSORS) == NULL);
    CHECK(rb_gguf_find_tensor(g, "t.absent") == NULL);
    CHECK(rb_gguf_find_tensor(g, "") == NULL);
    CHECK(rb_gguf_find_tensor(g, "t.f3") == NULL);
    CHECK(rb_gguf_find_kv(g, "rt.absent") == NULL);
    CHECK(rb_gguf_find_kv(g, "") == NULL);
    CHECK(rb_gguf_find_kv(g, "zzz") == NULL);
    CHECK(rb_gguf_find_kv(g, "a") == NULL);
}

static void test_round_trip(void)
{
    const char *path = tmp_path(0, "roundtrip.gguf");
    write_round_trip(path);
    rb_gguf *g = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_gguf_open(path, 0, NULL, &g, &err), RB_OK);
    if (g) {
        check_round_trip(g, "pread");
        rb_gguf_close(g);
    }
    g = NULL;
    CHECK_EQ_INT(rb_gguf_open(path, RB_GGUF_MMAP, NULL, &g, &err), RB_OK);
    if (g) {
        check_round_trip(g, "mmap");
        rb_gguf_close(g);
    }
    size_t n = 0;
    uint8_t *mem = read_whole(path, &n);
    CHECK(mem != NULL);
    g = NULL;
    CHECK_EQ_INT(rb_gguf_open_memory(mem, n, &g, &err), RB_OK);
    if (g) {
        check_round_trip(g, "memory");
        CHECK_EQ_U64(rb_gguf_file_size(g), n);
        rb_gguf_close(g);
    }
    free(mem);
    for (int i = 0; i < rt_n_kv; i++)
        b_free(&rt_kv[i].raw);
    /* the file stays for the fault tests */
}

/* A header larger than the reader's first 1 MiB read: 300k strings. */
#define BIG_N_STRINGS 300000

static void big_token(char *buf, size_t n, uint32_t i) { snprintf(buf, n, "w%" PRIu32, i); }

static void write_big_header(const char *path)
{
    char *text = malloc((size_t)BIG_N_STRINGS * 12);
    const char **strs = malloc(BIG_N_STRINGS * sizeof *strs);
    for (uint32_t i = 0; i < BIG_N_STRINGS; i++) {
        strs[i] = text + (size_t)i * 12;
        big_token(text + (size_t)i * 12, 12, i);
    }
    rb_gguf_writer *w = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    if (w) {
        CHECK_EQ_INT(rb_gguf_writer_set_str(w, "general.architecture", "llama"), RB_OK);
        CHECK_EQ_INT(rb_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", BIG_N_STRINGS, strs), RB_OK);
        CHECK_EQ_INT(rb_gguf_writer_set_u32(w, "after.tokens", 77), RB_OK);
        uint64_t dims[2] = {32, 2};
        CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "t", RB_TYPE_F32, 2, dims), RB_OK);
        CHECK_EQ_INT(rb_gguf_writer_begin_data(w), RB_OK);
        float x[64];
        for (int i = 0; i < 64; i++)
            x[i] = (float)i * 0.5f;
        CHECK_EQ_INT(rb_gguf_writer_write(w, x, sizeof x), RB_OK);
        CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_OK);
        rb_gguf_writer_destroy(w);
    }
    free(strs);
    free(text);
}

static void check_big_header(const rb_gguf *g)
{
    CHECK(rb_gguf_header_bytes(g) > (2u << 20)); /* at least two restarts */
    rb_gguf_array a;
    CHECK_EQ_INT(rb_gguf_get_array(g, "tokenizer.ggml.tokens", RB_GGUF_STRING, &a), RB_OK);
    CHECK_EQ_U64(a.n, BIG_N_STRINGS);
    int n_bad = 0;
    char want[16];
    for (uint32_t i = 0; i < a.n && i < BIG_N_STRINGS; i++) {
        rb_gguf_value v;
        big_token(want, sizeof want, i);
        if (rb_gguf_array_get(&a, i, &v) != RB_OK || !rb_gguf_str_eq(v.v.str, want))
            n_bad++;
    }
    CHECK_EQ_INT(n_bad, 0);
    uint32_t u;
    CHECK_EQ_INT(rb_gguf_get_u32(g, "after.tokens", &u), RB_OK);
    CHECK_EQ_INT(u, 77);
    const rb_gguf_tensor *t = rb_gguf_find_tensor(g, "t");
    CHECK(t != NULL);
    if (t) {
        float x[64];
        rb_error err = {0};
        CHECK_EQ_INT(rb_gguf_read(g, t, 0, x, sizeof x, &err), RB_OK);
        CHECK(x[63] == 31.5f);
        CHECK_EQ_U64(t->file_offset + t->n_bytes, rb_gguf_file_size(g));
    }
}

static void test_big_header(void)
{
    const char *path = tmp_path(1, "bigheader.gguf");
    write_big_header(path);
    for (int mode = 0; mode < 2; mode++) {
        rb_gguf *g = NULL;
        rb_error err = {0};
        CHECK_EQ_INT(rb_gguf_open(path, mode ? RB_GGUF_MMAP : 0, NULL, &g, &err), RB_OK);
        if (g) {
            check_big_header(g);
            rb_gguf_close(g);
        }
    }
    /* the file stays for the fault tests */
}

static void test_typed_getters(void)
{
    const char *path = tmp_path(0, "getters.gguf");
    rb_gguf_writer *w = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    if (!w)
        return;
    uint8_t u8raw[5] = {RB_GGUF_U8, 0, 0, 0, 200};
    uint8_t i8raw[5] = {RB_GGUF_I8, 0, 0, 0, 0xfb}; /* -5 */
    uint8_t f64raw[12] = {RB_GGUF_F64};
    double f64 = 0.25;
    memcpy(f64raw + 4, &f64, 8);
    uint8_t i64raw[12] = {RB_GGUF_I64};
    int64_t i64 = -1;
    memcpy(i64raw + 4, &i64, 8);
    rb_gguf_writer_set_raw(w, "g.u8", u8raw, sizeof u8raw);
    rb_gguf_writer_set_raw(w, "g.i8neg", i8raw, sizeof i8raw);
    rb_gguf_writer_set_raw(w, "g.f64", f64raw, sizeof f64raw);
    rb_gguf_writer_set_raw(w, "g.i64neg", i64raw, sizeof i64raw);
    rb_gguf_writer_set_i32(w, "g.i32", 5);
    rb_gguf_writer_set_i32(w, "g.i32neg", -5);
    rb_gguf_writer_set_u64(w, "g.u64max32", UINT32_MAX);
    rb_gguf_writer_set_u64(w, "g.u64big", 1ull << 40);
    rb_gguf_writer_set_f32(w, "g.f32", 1.5f);
    rb_gguf_writer_set_bool(w, "g.bool", 1);
    rb_gguf_writer_set_str(w, "g.str", "text");
    rb_gguf_writer_set_array(w, "g.arr", RB_GGUF_U32, 2, (uint32_t[]){1, 2});
    CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_OK);
    rb_gguf_writer_destroy(w);

    rb_gguf *g = NULL;
    CHECK_EQ_INT(rb_gguf_open(path, 0, NULL, &g, &err), RB_OK);
    if (!g)
        return;
    uint32_t u32 = 1234;
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.u8", &u32), RB_OK);
    CHECK_EQ_INT(u32, 200);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.i32", &u32), RB_OK);
    CHECK_EQ_INT(u32, 5);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.u64max32", &u32), RB_OK);
    CHECK_EQ_U64(u32, UINT32_MAX);
    u32 = 1234;
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.i32neg", &u32), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.i8neg", &u32), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.u64big", &u32), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.f32", &u32), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.str", &u32), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.bool", &u32), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.arr", &u32), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u32(g, "g.absent", &u32), RB_E_NOT_FOUND);
    CHECK_EQ_INT(u32, 1234); /* unchanged by every failure */
    uint64_t u64 = 99;
    CHECK_EQ_INT(rb_gguf_get_u64(g, "g.u64big", &u64), RB_OK);
    CHECK_EQ_U64(u64, 1ull << 40);
    CHECK_EQ_INT(rb_gguf_get_u64(g, "g.u8", &u64), RB_OK);
    CHECK_EQ_U64(u64, 200);
    u64 = 99;
    CHECK_EQ_INT(rb_gguf_get_u64(g, "g.i64neg", &u64), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u64(g, "g.f64", &u64), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_u64(g, "g.absent", &u64), RB_E_NOT_FOUND);
    CHECK_EQ_U64(u64, 99);
    float f = 9.f;
    CHECK_EQ_INT(rb_gguf_get_f32(g, "g.f32", &f), RB_OK);
    CHECK(f == 1.5f);
    CHECK_EQ_INT(rb_gguf_get_f32(g, "g.f64", &f), RB_OK);
    CHECK(f == 0.25f);
    f = 9.f;
    CHECK_EQ_INT(rb_gguf_get_f32(g, "g.i32", &f), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_f32(g, "g.absent", &f), RB_E_NOT_FOUND);
    CHECK(f == 9.f);
    int b = 7;
    CHECK_EQ_INT(rb_gguf_get_bool(g, "g.bool", &b), RB_OK);
    CHECK_EQ_INT(b, 1);
    b = 7;
    CHECK_EQ_INT(rb_gguf_get_bool(g, "g.u8", &b), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_bool(g, "g.absent", &b), RB_E_NOT_FOUND);
    CHECK_EQ_INT(b, 7);
    rb_gguf_str s = {0};
    CHECK_EQ_INT(rb_gguf_get_str(g, "g.str", &s), RB_OK);
    CHECK(rb_gguf_str_eq(s, "text"));
    CHECK(!rb_gguf_str_eq(s, "tex"));
    CHECK(!rb_gguf_str_eq(s, "texts"));
    CHECK_EQ_INT(rb_gguf_get_str(g, "g.arr", &s), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_str(g, "g.absent", &s), RB_E_NOT_FOUND);
    rb_gguf_array a = {0};
    CHECK_EQ_INT(rb_gguf_get_array(g, "g.arr", RB_GGUF_U32, &a), RB_OK);
    CHECK_EQ_U64(a.n, 2);
    CHECK_EQ_INT(rb_gguf_get_array(g, "g.arr", RB_GGUF_I32, &a), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_array(g, "g.str", UINT32_MAX, &a), RB_E_FORMAT);
    CHECK_EQ_INT(rb_gguf_get_array(g, "g.absent", UINT32_MAX, &a), RB_E_NOT_FOUND);
    CHECK_STR_EQ(rb_gguf_type_name(RB_GGUF_U32), "u32");
    CHECK_STR_EQ(rb_gguf_type_name(RB_GGUF_ARRAY), "array");
    CHECK_STR_EQ(rb_gguf_type_name(13), "?");
    CHECK_STR_EQ(rb_gguf_type_name(UINT32_MAX), "?");
    rb_gguf_close(g);
    unlink(path);
}

static void test_writer_errors(void)
{
    const char *path = tmp_path(0, "writer_err.gguf");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    rb_gguf_writer *w = NULL;
    rb_error err = {0};
    uint64_t d32[2] = {32, 2}, d33[1] = {33}, d_zero[2] = {32, 0};
    uint64_t d_elems[2] = {32, 1ull << 58}, d_bytes[2] = {32, (1ull << 57) + 1};

    /* argument errors at create */
    CHECK_EQ_INT(rb_gguf_writer_create(path, 48, NULL, &w, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "alignment 48 is not a power of two");
    CHECK(w == NULL);
    CHECK_EQ_INT(rb_gguf_writer_create("/nonexistent-dir/x.gguf", 0, NULL, &w, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "No such file or directory");

    /* duplicate tensor: sticky, and nothing remains */
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    CHECK(file_exists(tmp));
    CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "x", RB_TYPE_F32, 2, d32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "x", RB_TYPE_F16, 2, d32), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "duplicate tensor 'x'");
    CHECK_EQ_INT(rb_gguf_writer_set_u32(w, "k", 1), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "duplicate tensor 'x'");
    rb_gguf_writer_destroy(w);
    CHECK(!file_exists(path));
    CHECK(!file_exists(tmp));

    /* bad row length, bad n_dims, unknown type, bad names, empty key */
    struct {
        const char *name;
        uint32_t type, n_dims;
        const uint64_t *dims;
        const char *msg;
    } bad_tensors[] = {
        {"q", RB_TYPE_Q4_0, 1, d33, "row length 33 is not a multiple of Q4_0's block of 32"},
        {"q", RB_TYPE_F32, 0, d32, "n_dims 0"},
        {"q", RB_TYPE_F32, 5, d32, "n_dims 5"},
        {"q", 4, 1, d32, "unknown type 4"},
        {"q", RB_TYPE_F32, 2, d_zero, "tensor 'q': dims[1] = 0 is zero"},
        {"q", RB_TYPE_F32, 2, d_elems, "dims[1] = 288230376151711744 is zero or makes the element count overflow int64"},
        {"q", RB_TYPE_F32, 2, d_bytes, "tensor 'q': byte size overflows"},
        {"", RB_TYPE_F32, 1, d32, "must be 1..63 bytes"},
        {"0123456789012345678901234567890123456789012345678901234567890123", RB_TYPE_F32, 1, d32,
         "must be 1..63 bytes"},
    };
    for (size_t i = 0; i < sizeof bad_tensors / sizeof bad_tensors[0]; i++) {
        w = NULL;
        CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
        if (!w)
            continue;
        CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, bad_tensors[i].name, bad_tensors[i].type,
                                               bad_tensors[i].n_dims, bad_tensors[i].dims),
                     RB_E_INVALID_ARG);
        CHECK_CONTAINS(rb_gguf_writer_errmsg(w), bad_tensors[i].msg);
        CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_E_INVALID_ARG);
        rb_gguf_writer_destroy(w);
        CHECK(!file_exists(path));
        CHECK(!file_exists(tmp));
    }
    w = NULL;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_u32(w, "", 1), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "empty key");
    rb_gguf_writer_destroy(w);

    /* too many bytes */
    w = NULL;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "x", RB_TYPE_F32, 2, d32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_write(w, "abc", 3), RB_E_INVALID_ARG); /* before begin_data */
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "before begin_data");
    rb_gguf_writer_destroy(w);
    w = NULL;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "x", RB_TYPE_F32, 2, d32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_begin_data(w), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_u32(w, "late", 1), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "set after begin_data");
    rb_gguf_writer_destroy(w);
    w = NULL;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "x", RB_TYPE_F32, 2, d32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_begin_data(w), RB_OK);
    uint8_t data[300] = {0};
    CHECK_EQ_INT(rb_gguf_writer_write(w, data, 256), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_write(w, data, 1), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "1 bytes written beyond the last tensor");
    CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_E_INVALID_ARG);
    CHECK(!file_exists(path));
    rb_gguf_writer_destroy(w);
    CHECK(!file_exists(tmp));

    /* too few bytes */
    w = NULL;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "x", RB_TYPE_F32, 2, d32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_add_tensor(w, "y", RB_TYPE_F32, 2, d32), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_begin_data(w), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_write(w, data, 266), RB_OK);
    CHECK_EQ_U64(rb_gguf_writer_next_tensor(w), 1);
    CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "tensor 'y' got 10 of its 256 bytes");
    CHECK(!file_exists(path));
    CHECK(file_exists(tmp));
    rb_gguf_writer_destroy(w);
    CHECK(!file_exists(path));
    CHECK(!file_exists(tmp));

    /* no tensors at all: a valid file of metadata only */
    w = NULL;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_set_str(w, "general.architecture", "none"), RB_OK);
    CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_OK);
    CHECK_STR_EQ(rb_gguf_writer_errmsg(w), "");
    rb_gguf_writer_destroy(w);
    rb_gguf *g = NULL;
    CHECK_EQ_INT(rb_gguf_open(path, 0, NULL, &g, &err), RB_OK);
    if (g) {
        CHECK_EQ_U64(rb_gguf_n_tensors(g), 0);
        CHECK_EQ_U64(rb_gguf_n_kv(g), 1);
        rb_gguf_close(g);
    }
    unlink(path);

    /* reader argument errors */
    g = NULL;
    CHECK_EQ_INT(rb_gguf_open(NULL, 0, NULL, &g, &err), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_gguf_open_memory(NULL, 5, &g, &err), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_gguf_open(tmp_path(0, "does-not-exist.gguf"), 0, NULL, &g, &err), RB_E_NOT_FOUND);
    CHECK_CONTAINS(err.message, "No such file or directory");
    CHECK_EQ_INT(rb_gguf_open(REBOUND_TEST_TMP, 0, NULL, &g, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "Is a directory");
    CHECK(g == NULL);
    rb_gguf_close(NULL);
}

/* ---- part 3: reference files -------------------------------------------- */

static int open_model(const char *name, int flags, rb_gguf **g)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", REBOUND_MODELS_DIR, name);
    rb_error err = {0};
    *g = NULL;
    rb_status st = rb_gguf_open(path, flags, NULL, g, &err);
    if (st != RB_OK)
        fprintf(stderr, "%s: %s\n", name, err.message);
    CHECK_EQ_INT(st, RB_OK);
    return st == RB_OK;
}

/* The same bytes through rb_gguf_read (pread) and the mapping. */
static void check_pread_equals_mmap(const rb_gguf *gp, const rb_gguf *gm)
{
    CHECK_EQ_U64(rb_gguf_n_tensors(gp), rb_gguf_n_tensors(gm));
    CHECK_EQ_U64(rb_gguf_data_offset(gp), rb_gguf_data_offset(gm));
    int n_bad = 0;
    for (uint64_t i = 0; i < rb_gguf_n_tensors(gp) && i < rb_gguf_n_tensors(gm); i++) {
        const rb_gguf_tensor *tp = rb_gguf_tensor_at(gp, i), *tm = rb_gguf_tensor_at(gm, i);
        uint64_t n = tp->n_bytes < 65536 ? tp->n_bytes : 65536; /* first 64 KiB */
        uint8_t *buf = malloc(n);
        rb_error err = {0};
        if (strcmp(tp->name, tm->name) != 0 || tp->file_offset != tm->file_offset ||
            rb_gguf_read(gp, tp, tp->n_bytes - n, buf, n, &err) != RB_OK ||
            memcmp(buf, (const uint8_t *)rb_gguf_tensor_data(gm, tm) + tm->n_bytes - n, n) != 0)
            n_bad++;
        free(buf);
    }
    CHECK_EQ_INT(n_bad, 0);
}

static void check_token(const rb_gguf *g, const char *key, uint64_t n, uint64_t i, const char *want)
{
    rb_gguf_array a;
    rb_gguf_value v;
    CHECK_EQ_INT(rb_gguf_get_array(g, key, RB_GGUF_STRING, &a), RB_OK);
    CHECK_EQ_U64(a.n, n);
    CHECK_EQ_INT(rb_gguf_array_get(&a, i, &v), RB_OK);
    CHECK(rb_gguf_str_eq(v.v.str, want));
}

static void test_reference_models(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/stories260K.gguf", REBOUND_MODELS_DIR);
    if (!file_exists(path)) {
        printf("skip: reference models not found in %s\n", REBOUND_MODELS_DIR);
        return;
    }
    rb_gguf *g[2] = {NULL, NULL};
    /* stories260K: 48 F32 tensors, 19 kvs, 512 tokens */
    if (open_model("stories260K.gguf", 0, &g[0]) && open_model("stories260K.gguf", RB_GGUF_MMAP, &g[1])) {
        for (int m = 0; m < 2; m++) {
            CHECK_EQ_U64(rb_gguf_n_tensors(g[m]), 48);
            CHECK_EQ_U64(rb_gguf_n_kv(g[m]), 19);
            CHECK_EQ_INT(rb_gguf_version(g[m]), 3);
            CHECK_EQ_INT(rb_gguf_alignment(g[m]), 32);
            CHECK_EQ_U64(rb_gguf_header_bytes(g[m]), 14152);
            CHECK_EQ_U64(rb_gguf_data_offset(g[m]), 14176);
            CHECK_EQ_U64(rb_gguf_file_size(g[m]), 1185376);
            check_token(g[m], "tokenizer.ggml.tokens", 512, 0, "<unk>");
            check_token(g[m], "tokenizer.ggml.tokens", 512, 2, "</s>");
            uint32_t u;
            float f;
            CHECK_EQ_INT(rb_gguf_get_u32(g[m], "llama.block_count", &u), RB_OK);
            CHECK_EQ_INT(u, 5);
            CHECK_EQ_INT(rb_gguf_get_u32(g[m], "tokenizer.ggml.padding_token_id", &u), RB_OK);
            CHECK_EQ_U64(u, UINT32_MAX);
            CHECK_EQ_INT(rb_gguf_get_f32(g[m], "llama.attention.layer_norm_rms_epsilon", &f), RB_OK);
            CHECK_NEAR(f, 1e-5, 1e-9);
            const rb_gguf_tensor *t = rb_gguf_find_tensor(g[m], "token_embd.weight");
            CHECK(t != NULL);
            if (t) {
                CHECK_EQ_INT(t->type, RB_TYPE_F32);
                CHECK_EQ_U64(t->dims[0], 64);
                CHECK_EQ_U64(t->dims[1], 512);
                CHECK_EQ_U64(t->offset, 0);
                CHECK_EQ_U64(t->n_bytes, 64 * 512 * 4);
            }
            t = rb_gguf_find_tensor(g[m], "blk.4.ffn_norm.weight");
            CHECK(t != NULL);
            if (t)
                CHECK_EQ_U64(t->file_offset + t->n_bytes, 1185376);
        }
        check_pread_equals_mmap(g[0], g[1]);
    }
    rb_gguf_close(g[0]);
    rb_gguf_close(g[1]);
    g[0] = g[1] = NULL;

    /* qwen3: a 1.7 MiB header (the pread open restarts), 50000 merges */
    if (open_model("parity-qwen3-Q8_0.gguf", 0, &g[0]) &&
        open_model("parity-qwen3-Q8_0.gguf", RB_GGUF_MMAP, &g[1])) {
        for (int m = 0; m < 2; m++) {
            CHECK_EQ_U64(rb_gguf_n_tensors(g[m]), 24);
            CHECK_EQ_U64(rb_gguf_n_kv(g[m]), 22);
            CHECK_EQ_U64(rb_gguf_data_offset(g[m]), 1768480);
            check_token(g[m], "tokenizer.ggml.merges", 50000, 2, "h e");
            check_token(g[m], "tokenizer.ggml.tokens", 50257, 0, "!");
            int b = 1;
            CHECK_EQ_INT(rb_gguf_get_bool(g[m], "tokenizer.ggml.add_bos_token", &b), RB_OK);
            CHECK_EQ_INT(b, 0);
            const rb_gguf_tensor *t = rb_gguf_find_tensor(g[m], "token_embd.weight");
            CHECK(t != NULL);
            if (t) {
                CHECK_EQ_INT(t->type, RB_TYPE_Q8_0);
                CHECK_EQ_U64(t->n_bytes, 50257ull * 8 * 34);
            }
            CHECK(rb_gguf_find_tensor(g[m], "output.weight") == NULL);
        }
        check_pread_equals_mmap(g[0], g[1]);
    }
    rb_gguf_close(g[0]);
    rb_gguf_close(g[1]);
    g[0] = g[1] = NULL;

    /* the llama parity files: 32000 tokens; token_embd's type per file */
    static const struct { const char *file; uint32_t embd_type; } parity[] = {
        {"parity-F16.gguf", RB_TYPE_F16},
        {"parity-Q8_0.gguf", RB_TYPE_Q8_0},
        {"parity-Q4_0.gguf", RB_TYPE_Q6_K},
        {"parity-Q4_K_M.gguf", RB_TYPE_Q6_K},
    };
    for (size_t i = 0; i < sizeof parity / sizeof parity[0]; i++) {
        if (open_model(parity[i].file, 0, &g[0]) && open_model(parity[i].file, RB_GGUF_MMAP, &g[1])) {
            for (int m = 0; m < 2; m++) {
                check_token(g[m], "tokenizer.ggml.tokens", 32000, 1, "<s>");
                const rb_gguf_tensor *t = rb_gguf_find_tensor(g[m], "token_embd.weight");
                CHECK(t != NULL);
                if (t)
                    CHECK_EQ_INT(t->type, parity[i].embd_type);
                uint64_t end = 0;
                for (uint64_t k = 0; k < rb_gguf_n_tensors(g[m]); k++) {
                    const rb_gguf_tensor *tk = rb_gguf_tensor_at(g[m], k);
                    if (tk->file_offset + tk->n_bytes > end)
                        end = tk->file_offset + tk->n_bytes;
                }
                CHECK(end <= rb_gguf_file_size(g[m]));
                CHECK(rb_gguf_file_size(g[m]) - end < 32);
            }
            check_pread_equals_mmap(g[0], g[1]);
        }
        rb_gguf_close(g[0]);
        rb_gguf_close(g[1]);
        g[0] = g[1] = NULL;
    }
}

/* ---- part 4: faults through the rb_os table ------------------------------ */

/* The table has no context pointer, so the knobs live here. */
static struct fault_state {
    int pread_fail_at;     /* fail the Nth pread with EIO (1-based; 0 never) */
    int n_pread;
    size_t pread_max;      /* short reads: at most this many bytes (0: any) */
    int is_eintr;          /* every call fails with EINTR once first */
    int is_eintr_pending;
    uint64_t shrink_at;    /* pread sees the file end here */
    int pwrite_fail_at;    /* fail the Nth pwrite with ENOSPC */
    int n_pwrite;
    size_t pwrite_max;     /* short writes */
    int is_fsync_fail, is_rename_fail, is_mmap_fail, is_fstat_fail;
    int n_open, n_close, n_unlink;
} fault;

static void fault_reset(void)
{
    memset(&fault, 0, sizeof fault);
    fault.shrink_at = UINT64_MAX;
}

static int f_open(const char *path, int flags, int mode)
{
    int fd = rb_os_default()->open(path, flags, mode);
    if (fd >= 0)
        fault.n_open++;
    return fd;
}

static int f_close(int fd)
{
    fault.n_close++;
    return rb_os_default()->close(fd);
}

static ssize_t f_pread(int fd, void *buf, size_t n, off_t off)
{
    if (fault.is_eintr) {
        fault.is_eintr_pending = !fault.is_eintr_pending;
        if (fault.is_eintr_pending) {
            errno = EINTR;
            return -1;
        }
    }
    if (++fault.n_pread == fault.pread_fail_at) {
        errno = EIO;
        return -1;
    }
    if (fault.pread_max && n > fault.pread_max)
        n = fault.pread_max;
    if ((uint64_t)off >= fault.shrink_at)
        return 0;
    if ((uint64_t)off + n > fault.shrink_at)
        n = (size_t)(fault.shrink_at - (uint64_t)off);
    return rb_os_default()->pread(fd, buf, n, off);
}

static ssize_t f_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (fault.is_eintr) {
        fault.is_eintr_pending = !fault.is_eintr_pending;
        if (fault.is_eintr_pending) {
            errno = EINTR;
            return -1;
        }
    }
    if (++fault.n_pwrite == fault.pwrite_fail_at) {
        errno = ENOSPC;
        return -1;
    }
    if (fault.pwrite_max && n > fault.pwrite_max)
        n = fault.pwrite_max;
    return rb_os_default()->pwrite(fd, buf, n, off);
}

static int f_fstat_size(int fd, uint64_t *size)
{
    if (fault.is_fstat_fail) {
        errno = EACCES;
        return -1;
    }
    return rb_os_default()->fstat_size(fd, size);
}

static int f_fsync(int fd)
{
    if (fault.is_fsync_fail) {
        errno = EIO;
        return -1;
    }
    return rb_os_default()->fsync(fd);
}

static int f_rename(const char *from, const char *to)
{
    if (fault.is_rename_fail) {
        errno = EXDEV;
        return -1;
    }
    return rb_os_default()->rename(from, to);
}

static int f_unlink(const char *path)
{
    fault.n_unlink++;
    return rb_os_default()->unlink(path);
}

static void *f_mmap_ro(int fd, size_t n)
{
    if (fault.is_mmap_fail) {
        errno = ENOMEM;
        return NULL;
    }
    return rb_os_default()->mmap_ro(fd, n);
}

static int f_munmap(void *p, size_t n) { return rb_os_default()->munmap(p, n); }

static const rb_os fault_os = {
    .open = f_open, .close = f_close, .pread = f_pread, .pwrite = f_pwrite,
    .fstat_size = f_fstat_size, .fsync = f_fsync, .rename = f_rename,
    .unlink = f_unlink, .mmap_ro = f_mmap_ro, .munmap = f_munmap,
};

/* a and b hold the same metadata and tensors (b opened the normal way). */
static void check_same(const rb_gguf *a, const rb_gguf *b)
{
    CHECK_EQ_U64(rb_gguf_n_kv(a), rb_gguf_n_kv(b));
    CHECK_EQ_U64(rb_gguf_n_tensors(a), rb_gguf_n_tensors(b));
    CHECK_EQ_U64(rb_gguf_data_offset(a), rb_gguf_data_offset(b));
    int n_bad = 0;
    for (uint64_t i = 0; i < rb_gguf_n_kv(a) && i < rb_gguf_n_kv(b); i++) {
        const rb_gguf_kv *x = rb_gguf_kv_at(a, i), *y = rb_gguf_kv_at(b, i);
        if (strcmp(x->key, y->key) || x->raw_len != y->raw_len ||
            memcmp(x->raw, y->raw, x->raw_len) || x->file_offset != y->file_offset)
            n_bad++;
    }
    for (uint64_t i = 0; i < rb_gguf_n_tensors(a) && i < rb_gguf_n_tensors(b); i++) {
        const rb_gguf_tensor *x = rb_gguf_tensor_at(a, i), *y = rb_gguf_tensor_at(b, i);
        if (strcmp(x->name, y->name) || x->type != y->type || x->n_bytes != y->n_bytes ||
            x->file_offset != y->file_offset || memcmp(x->dims, y->dims, sizeof x->dims))
            n_bad++;
        uint8_t *bx = malloc(x->n_bytes), *by = malloc(y->n_bytes);
        rb_error err = {0};
        if (rb_gguf_read(a, x, 0, bx, x->n_bytes, &err) != RB_OK ||
            rb_gguf_read(b, y, 0, by, y->n_bytes, &err) != RB_OK ||
            memcmp(bx, by, x->n_bytes) != 0)
            n_bad++;
        free(bx);
        free(by);
    }
    CHECK_EQ_INT(n_bad, 0);
}

/* Fails the 1st, 2nd, ... pread until open succeeds: each failure is a
 * clean RB_E_IO naming the errno and closing the descriptor. */
static void fail_nth_pread(const char *path, size_t pread_max)
{
    int n_failed = 0;
    for (int n = 1; n < 10000; n++) {
        fault_reset();
        fault.pread_fail_at = n;
        fault.pread_max = pread_max;
        rb_gguf *g = NULL;
        rb_error err = {0};
        rb_status st = rb_gguf_open(path, 0, &fault_os, &g, &err);
        CHECK_EQ_INT(fault.n_open, 1);
        if (st == RB_OK) {
            CHECK(fault.n_pread < n); /* every pread happened before the Nth */
            rb_gguf_close(g);
            CHECK_EQ_INT(fault.n_close, 1);
            break;
        }
        n_failed++;
        CHECK_EQ_INT(st, RB_E_IO);
        if (st != RB_E_IO)
            break;
        CHECK_CONTAINS(err.message, strerror(EIO));
        CHECK_CONTAINS(err.message, path);
        CHECK(g == NULL);
        CHECK_EQ_INT(fault.n_close, 1);
    }
    CHECK(n_failed >= 1);
}

static void test_read_faults(void)
{
    const char *small = tmp_path(0, "roundtrip.gguf"); /* from test_round_trip */
    const char *big = tmp_path(1, "bigheader.gguf");   /* from test_big_header */
    fail_nth_pread(small, 0);
    fail_nth_pread(big, 0);
    fail_nth_pread(big, 256 * 1024);

    rb_gguf *ref = NULL, *g = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_gguf_open(small, 0, NULL, &ref, &err), RB_OK);

    /* 1-byte reads, and EINTR before every call: identical results */
    fault_reset();
    fault.pread_max = 1;
    fault.is_eintr = 1;
    CHECK_EQ_INT(rb_gguf_open(small, 0, &fault_os, &g, &err), RB_OK);
    if (g && ref) {
        CHECK(fault.n_pread > 1000);
        check_same(g, ref);
        rb_gguf_close(g);
    }
    fault_reset();
    fault.pread_max = 4093;
    fault.is_eintr = 1;
    g = NULL;
    CHECK_EQ_INT(rb_gguf_open(big, 0, &fault_os, &g, &err), RB_OK);
    if (g) {
        rb_gguf *big_ref = NULL;
        CHECK_EQ_INT(rb_gguf_open(big, RB_GGUF_MMAP, NULL, &big_ref, &err), RB_OK);
        if (big_ref)
            check_same(g, big_ref);
        check_big_header(g);
        rb_gguf_close(big_ref);
        rb_gguf_close(g);
    }

    /* a failed read of tensor data after open */
    fault_reset();
    g = NULL;
    CHECK_EQ_INT(rb_gguf_open(small, 0, &fault_os, &g, &err), RB_OK);
    if (g) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, 0);
        uint8_t buf[64];
        fault.pread_fail_at = fault.n_pread + 1;
        CHECK_EQ_INT(rb_gguf_read(g, t, 0, buf, sizeof buf, &err), RB_E_IO);
        CHECK_CONTAINS(err.message, "tensor 't.f32': read at 0x");
        CHECK_CONTAINS(err.message, strerror(EIO));
        CHECK_EQ_INT(rb_gguf_read(g, t, 0, buf, sizeof buf, &err), RB_OK); /* not sticky */
        /* the file shrinks under the tensor data */
        fault.shrink_at = t->file_offset + 10;
        memset(buf, 0xaa, sizeof buf);
        CHECK_EQ_INT(rb_gguf_read(g, t, 0, buf, sizeof buf, &err), RB_E_SHORT_READ);
        CHECK_CONTAINS(err.message, "file ended after 10 of 64 bytes");
        CHECK(buf[10] == 0 && buf[63] == 0); /* the rest zero-filled */
        rb_gguf_close(g);
    }

    /* the file shrinks while opening: small file (one read) and big one
     * (the shrink hits the second, growing read) */
    fault_reset();
    fault.shrink_at = 100;
    g = NULL;
    CHECK_EQ_INT(rb_gguf_open(small, 0, &fault_os, &g, &err), RB_E_SHORT_READ);
    CHECK_CONTAINS(err.message, "file shrank while opening");
    CHECK_EQ_INT(fault.n_close, 1);
    fault_reset();
    fault.shrink_at = 1536 * 1024;
    CHECK_EQ_INT(rb_gguf_open(big, 0, &fault_os, &g, &err), RB_E_SHORT_READ);
    CHECK_CONTAINS(err.message, "file ended at 1572864 bytes while reading its header");
    CHECK_EQ_INT(fault.n_close, 1);
    CHECK(g == NULL);

    /* open, stat and mmap failures */
    fault_reset();
    fault.is_fstat_fail = 1;
    CHECK_EQ_INT(rb_gguf_open(small, 0, &fault_os, &g, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "cannot stat");
    CHECK_CONTAINS(err.message, strerror(EACCES));
    CHECK_EQ_INT(fault.n_close, 1);
    fault_reset();
    fault.is_mmap_fail = 1;
    CHECK_EQ_INT(rb_gguf_open(small, RB_GGUF_MMAP, &fault_os, &g, &err), RB_E_IO);
    CHECK_CONTAINS(err.message, "cannot map");
    CHECK_CONTAINS(err.message, strerror(ENOMEM));
    CHECK_EQ_INT(fault.n_close, 1);
    CHECK(g == NULL);
    rb_gguf_close(ref);
}

/* Writes a file with a 3 MiB tensor (several 1 MiB flushes) through the
 * fault table; returns the first failing status and checks stickiness. */
static rb_status write_through_faults(const char *path, rb_gguf_writer **out)
{
    rb_gguf_writer *w = NULL;
    rb_error err = {0};
    rb_status st = rb_gguf_writer_create(path, 0, &fault_os, &w, &err);
    CHECK_EQ_INT(st, RB_OK);
    *out = w;
    if (!w)
        return st;
    rb_status first = RB_OK;
#define STEP(call)                                                            \
    do {                                                                      \
        rb_status s_ = (call);                                                \
        if (first != RB_OK)                                                   \
            CHECK_EQ_INT(s_, first); /* sticky */                            \
        else                                                                  \
            first = s_;                                                       \
    } while (0)
    static float x[1024];
    for (int i = 0; i < 1024; i++)
        x[i] = (float)i;
    uint64_t dims[2] = {1024, 768}, small[1] = {32};
    STEP(rb_gguf_writer_set_str(w, "general.architecture", "llama"));
    STEP(rb_gguf_writer_add_tensor(w, "big", RB_TYPE_F32, 2, dims));
    STEP(rb_gguf_writer_add_tensor(w, "small", RB_TYPE_F32, 1, small));
    STEP(rb_gguf_writer_begin_data(w));
    for (int r = 0; r < 768 + 1; r++)
        STEP(rb_gguf_writer_write(w, x, r < 768 ? sizeof x : 32 * sizeof(float)));
    STEP(rb_gguf_writer_finish(w));
    if (first != RB_OK) {
        STEP(rb_gguf_writer_set_u32(w, "after", 1));
        STEP(rb_gguf_writer_finish(w));
    }
#undef STEP
    return first;
}

static void test_write_faults(void)
{
    const char *path = tmp_path(0, "writefault.gguf");
    const char *ref_path = tmp_path(1, "writefault_ref.gguf");
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    /* the reference file, written normally */
    fault_reset();
    rb_gguf_writer *w = NULL;
    CHECK_EQ_INT(write_through_faults(ref_path, &w), RB_OK);
    rb_gguf_writer_destroy(w);
    size_t ref_n = 0;
    uint8_t *ref = read_whole(ref_path, &ref_n);
    CHECK(ref != NULL && ref_n > (3u << 20));

    /* ENOSPC on the 1st, 2nd, ... pwrite */
    int n_failed = 0;
    for (int n = 1; n < 100; n++) {
        fault_reset();
        fault.pwrite_fail_at = n;
        w = NULL;
        rb_status st = write_through_faults(path, &w);
        if (st == RB_OK) {
            CHECK(fault.n_pwrite < n);
            rb_gguf_writer_destroy(w);
            break;
        }
        n_failed++;
        CHECK_EQ_INT(st, RB_E_IO);
        CHECK_CONTAINS(rb_gguf_writer_errmsg(w), "No space left on device");
        CHECK_CONTAINS(rb_gguf_writer_errmsg(w), ".tmp");
        CHECK(!file_exists(path));
        CHECK(file_exists(tmp));
        rb_gguf_writer_destroy(w);
        CHECK(!file_exists(tmp));
        CHECK_EQ_INT(fault.n_unlink, 1);
        CHECK_EQ_INT(fault.n_open, fault.n_close);
    }
    CHECK(n_failed >= 4); /* header + 3 MiB of data: at least 4 flushes */
    CHECK(file_exists(path));
    unlink(path);

    /* short writes and EINTR: the same bytes as the reference */
    fault_reset();
    fault.pwrite_max = 100000;
    fault.is_eintr = 1;
    w = NULL;
    CHECK_EQ_INT(write_through_faults(path, &w), RB_OK);
    rb_gguf_writer_destroy(w);
    size_t n = 0;
    uint8_t *got = read_whole(path, &n);
    CHECK(got && ref && n == ref_n && memcmp(got, ref, n) == 0);
    free(got);
    unlink(path);

    /* fsync and rename failures: finish fails, nothing under the final name */
    for (int which = 0; which < 2; which++) {
        fault_reset();
        fault.is_fsync_fail = which == 0;
        fault.is_rename_fail = which == 1;
        w = NULL;
        CHECK_EQ_INT(write_through_faults(path, &w), RB_E_IO);
        CHECK_CONTAINS(rb_gguf_writer_errmsg(w), which == 0 ? "fsync" : "rename");
        CHECK_CONTAINS(rb_gguf_writer_errmsg(w), strerror(which == 0 ? EIO : EXDEV));
        rb_gguf_writer_destroy(w);
        CHECK(!file_exists(path));
        CHECK(!file_exists(tmp));
    }
    free(ref);
    unlink(ref_path);
}

int main(void)
{
    test_broken_files();
    test_prefixes_and_byte_flips();
    test_round_trip();
    test_big_header();
    test_typed_getters();
    test_writer_errors();
    test_reference_models();
    test_read_faults();
    test_write_faults();
    unlink(tmp_path(0, "roundtrip.gguf"));
    unlink(tmp_path(1, "bigheader.gguf"));
    return check_report();
}
