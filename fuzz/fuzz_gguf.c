/*
 * fuzz_gguf.c - libFuzzer target for the GGUF reader (src/format/gguf.c).
 *
 * Each input is opened twice: with rb_gguf_open_memory, and with
 * rb_gguf_open through an rb_os table whose pread serves the same bytes
 * (the path real files take: first read, grow, restart). Both must agree
 * on the status and, on success, on every count, offset and tensor byte.
 * A successful open is then walked completely: every kv (typed getters,
 * find_kv of its key, every array element through rb_gguf_array_get,
 * recursing into nested arrays with a depth bound and a visit budget,
 * every string byte), every tensor (find_tensor of its name, its placement
 * rechecked here, its first and last bytes read both ways). A broken
 * invariant traps, so libFuzzer records the input.
 *
 * Build and run: see fuzz/README.md.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"

#define FUZZ_FD 3
#define FUZZ_VISIT_BUDGET (1u << 16) /* array elements visited per input */

/* The input currently served by the memory-backed rb_os. The table has no
 * context pointer; libFuzzer runs one input at a time. */
static const uint8_t *fuzz_data;
static size_t fuzz_size;

static int mem_open(const char *path, int flags, int mode)
{
    (void)path, (void)flags, (void)mode;
    return FUZZ_FD;
}

static int mem_close(int fd) { return fd == FUZZ_FD ? 0 : -1; }

static ssize_t mem_pread(int fd, void *buf, size_t n, off_t off)
{
    if (fd != FUZZ_FD || off < 0) {
        errno = EBADF;
        return -1;
    }
    if ((uint64_t)off >= fuzz_size)
        return 0;
    size_t k = fuzz_size - (size_t)off < n ? fuzz_size - (size_t)off : n;
    memcpy(buf, fuzz_data + off, k);
    return (ssize_t)k;
}

static ssize_t mem_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    (void)fd, (void)buf, (void)n, (void)off;
    errno = EROFS;
    return -1;
}

static int mem_fstat_size(int fd, uint64_t *size)
{
    (void)fd;
    *size = fuzz_size;
    return 0;
}

static int mem_fsync(int fd) { (void)fd; return 0; }
static int mem_rename(const char *a, const char *b) { (void)a, (void)b; errno = EROFS; return -1; }
static int mem_unlink(const char *p) { (void)p; errno = EROFS; return -1; }
static void *mem_mmap_ro(int fd, size_t n) { (void)fd, (void)n; errno = ENODEV; return NULL; }
static int mem_munmap(void *p, size_t n) { (void)p, (void)n; return 0; }

static const rb_os mem_os = {
    .open = mem_open, .close = mem_close, .pread = mem_pread, .pwrite = mem_pwrite,
    .fstat_size = mem_fstat_size, .fsync = mem_fsync, .rename = mem_rename,
    .unlink = mem_unlink, .mmap_ro = mem_mmap_ro, .munmap = mem_munmap,
};

#define REQUIRE(cond)              \
    do {                           \
        if (!(cond))               \
            __builtin_trap();      \
    } while (0)

static volatile uint64_t sink; /* keeps the walks' reads alive */

/* The bytes [p, p+n) lie inside the input. */
static void require_inside(const void *p, uint64_t n, const uint8_t *data, size_t size)
{
    const uint8_t *b = p;
    REQUIRE(b >= data && (uint64_t)(b - data) <= size && n <= size - (uint64_t)(b - data));
}

static void walk_value(const rb_gguf_value *v, int depth, uint64_t *budget,
                       const uint8_t *data, size_t size);

static void walk_array(const rb_gguf_array *a, int depth, uint64_t *budget,
                       const uint8_t *data, size_t size)
{
    REQUIRE(a->type < RB_GGUF_TYPE_COUNT);
    REQUIRE(depth < RB_GGUF_MAX_ARRAY_DEPTH);
    rb_gguf_value e;
    REQUIRE(rb_gguf_array_get(a, a->n, &e) == RB_E_INVALID_ARG);
    for (uint64_t i = 0; i < a->n && *budget > 0; i++, (*budget)--) {
        REQUIRE(rb_gguf_array_get(a, i, &e) == RB_OK);
        REQUIRE(e.type == a->type);
        walk_value(&e, depth + 1, budget, data, size);
    }
}

static void walk_value(const rb_gguf_value *v, int depth, uint64_t *budget,
                       const uint8_t *data, size_t size)
{
    uint64_t sum = 0;
    switch (v->type) {
    case RB_GGUF_STRING:
        require_inside(v->v.str.ptr, v->v.str.len, data, size);
        for (uint64_t k = 0; k < v->v.str.len; k++)
            sum += (uint8_t)v->v.str.ptr[k];
        break;
    case RB_GGUF_ARRAY:
        walk_array(&v->v.arr, depth, budget, data, size);
        break;
    case RB_GGUF_BOOL:
        REQUIRE(v->v.u64 <= 1);
        break;
    default:
        REQUIRE(v->type < RB_GGUF_TYPE_COUNT);
        sum = v->v.u64;
        break;
    }
    sink += sum;
}

static void walk_kvs(const rb_gguf *g, const uint8_t *data, size_t size)
{
    uint64_t budget = FUZZ_VISIT_BUDGET;
    REQUIRE(rb_gguf_kv_at(g, rb_gguf_n_kv(g)) == NULL);
    for (uint64_t i = 0; i < rb_gguf_n_kv(g); i++) {
        const rb_gguf_kv *kv = rb_gguf_kv_at(g, i);
        REQUIRE(kv && kv->key && kv->key[0]);
        REQUIRE(rb_gguf_find_kv(g, kv->key) == kv);
        require_inside(kv->raw, kv->raw_len, data, size);
        REQUIRE(kv->raw_len >= 4 && memcmp(kv->raw, &kv->value.type, 4) == 0);
        walk_value(&kv->value, 0, &budget, data, size);

        uint32_t u32;
        uint64_t u64;
        float f;
        int b;
        rb_gguf_str s;
        rb_gguf_array a;
        rb_status s32 = rb_gguf_get_u32(g, kv->key, &u32);
        rb_status s64 = rb_gguf_get_u64(g, kv->key, &u64);
        REQUIRE(s32 == RB_OK || s32 == RB_E_FORMAT);
        REQUIRE(s64 == RB_OK || s64 == RB_E_FORMAT);
        if (s32 == RB_OK)
            REQUIRE(s64 == RB_OK && u64 == u32);
        rb_status sf = rb_gguf_get_f32(g, kv->key, &f);
        rb_status sb = rb_gguf_get_bool(g, kv->key, &b);
        rb_status ss = rb_gguf_get_str(g, kv->key, &s);
        rb_status sa = rb_gguf_get_array(g, kv->key, UINT32_MAX, &a);
        REQUIRE((sf == RB_OK) == (kv->value.type == RB_GGUF_F32 || kv->value.type == RB_GGUF_F64));
        REQUIRE((sb == RB_OK) == (kv->value.type == RB_GGUF_BOOL));
        REQUIRE((ss == RB_OK) == (kv->value.type == RB_GGUF_STRING));
        REQUIRE((sa == RB_OK) == (kv->value.type == RB_GGUF_ARRAY));
        if (sa == RB_OK)
            REQUIRE(rb_gguf_get_array(g, kv->key, a.type, &a) == RB_OK);
    }
    REQUIRE(rb_gguf_find_kv(g, "") == NULL);
}

static void walk_tensors(const rb_gguf *g, const rb_gguf *gp, const uint8_t *data, size_t size)
{
    uint32_t align = rb_gguf_alignment(g);
    REQUIRE(align && (align & (align - 1)) == 0);
    REQUIRE(rb_gguf_data_offset(g) % align == 0);
    REQUIRE(rb_gguf_header_bytes(g) <= rb_gguf_data_offset(g));
    REQUIRE(rb_gguf_tensor_at(g, rb_gguf_n_tensors(g)) == NULL);
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        REQUIRE(t->name && t->name[0] && strlen(t->name) <= RB_GGUF_MAX_NAME);
        REQUIRE(rb_gguf_find_tensor(g, t->name) == t);
        REQUIRE(t->n_dims >= 1 && t->n_dims <= RB_GGUF_MAX_DIMS);
        uint64_t rows = 1;
        for (uint32_t d = 1; d < RB_GGUF_MAX_DIMS; d++) {
            REQUIRE(t->dims[d] >= 1);
            REQUIRE(rows <= UINT64_MAX / t->dims[d]);
            rows *= t->dims[d];
        }
        uint64_t row = rb_type_row_bytes(t->type, t->dims[0]);
        REQUIRE(row != 0 && rows <= UINT64_MAX / row && row * rows == t->n_bytes);
        REQUIRE(t->offset % align == 0);
        REQUIRE(t->file_offset == rb_gguf_data_offset(g) + t->offset);
        REQUIRE(t->file_offset <= size && t->n_bytes <= size - t->file_offset);

        /* first and last bytes: by pointer, by rb_gguf_read, and by pread */
        const uint8_t *p = rb_gguf_tensor_data(g, t);
        REQUIRE(p == data + t->file_offset);
        uint8_t a[16], b[16];
        uint64_t n = t->n_bytes < sizeof a ? t->n_bytes : sizeof a;
        rb_error err;
        for (int end = 0; end < 2; end++) {
            uint64_t off = end ? t->n_bytes - n : 0;
            REQUIRE(rb_gguf_read(g, t, off, a, n, &err) == RB_OK);
            REQUIRE(memcmp(a, p + off, n) == 0);
            if (gp) {
                const rb_gguf_tensor *tp = rb_gguf_find_tensor(gp, t->name);
                REQUIRE(tp && tp->file_offset == t->file_offset && tp->n_bytes == t->n_bytes);
                REQUIRE(rb_gguf_read(gp, tp, off, b, n, &err) == RB_OK);
                REQUIRE(memcmp(a, b, n) == 0);
            }
        }
        REQUIRE(rb_gguf_read(g, t, t->n_bytes, a, 1, &err) == RB_E_INVALID_ARG);
    }
    /* tensors are disjoint: checked by the reader, rechecked pairwise for
     * small counts */
    uint64_t nt = rb_gguf_n_tensors(g);
    for (uint64_t i = 0; i < nt && nt <= 64; i++)
        for (uint64_t j = i + 1; j < nt; j++) {
            const rb_gguf_tensor *x = rb_gguf_tensor_at(g, i), *y = rb_gguf_tensor_at(g, j);
            REQUIRE(x->offset + x->n_bytes <= y->offset || y->offset + y->n_bytes <= x->offset);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rb_gguf *g = NULL, *gp = NULL;
    rb_error err, errp;
    rb_status st = rb_gguf_open_memory(data, size, &g, &err);

    fuzz_data = data;
    fuzz_size = size;
    rb_status stp = rb_gguf_open("fuzz-input", 0, &mem_os, &gp, &errp);
    REQUIRE(st == stp);

    if (st != RB_OK) {
        REQUIRE(g == NULL && gp == NULL);
        REQUIRE(err.status == st && err.message[0] != 0);
        REQUIRE(st == RB_E_FORMAT || st == RB_E_UNSUPPORTED || st == RB_E_NOMEM);
        /* the pread open adds the path before the same message */
        if (strlen(err.message) < 400)
            REQUIRE(strstr(errp.message, err.message) != NULL);
        return 0;
    }
    REQUIRE(rb_gguf_file_size(g) == size);
    REQUIRE(rb_gguf_n_kv(g) == rb_gguf_n_kv(gp));
    REQUIRE(rb_gguf_n_tensors(g) == rb_gguf_n_tensors(gp));
    REQUIRE(rb_gguf_data_offset(g) == rb_gguf_data_offset(gp));
    REQUIRE(rb_gguf_version(g) == 2 || rb_gguf_version(g) == 3);
    walk_kvs(g, data, size);
    walk_tensors(g, gp, data, size);
    rb_gguf_close(g);
    rb_gguf_close(gp);
    return 0;
}
