/*
 * gguf_write.c - GGUF v3 writer (contract in gguf_write.h).
 *
 * Does: serialize metadata and tensor index, stream tensor data with the
 * alignment padding, write to a temporary file and rename it into place.
 * Does not: choose tensor types or produce tensor bytes (synth.c and
 * convert.c do), or read files (gguf.c).
 *
 * Layout of the writer's memory: kvs[] holds each key (C string) and its
 * encoded value (type u32 + value bytes, exactly as they go to the file),
 * so a value copied from a reader stays byte-identical; tensors[] holds
 * names, types, dims and the offsets computed when they are declared; out
 * is the 1 MiB write buffer, flushed at file offset out_at.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_write.h"
#include "quant.h"
#include "status.h"

#define WRITE_BUFFER_BYTES (1u << 20)

typedef struct writer_kv {
    char *key;
    uint8_t *raw;       /* value type u32 + value */
    uint64_t raw_len;
} writer_kv;

typedef struct writer_tensor {
    char name[RB_GGUF_MAX_NAME + 1];
    uint32_t type;
    uint32_t n_dims;
    uint64_t dims[RB_GGUF_MAX_DIMS];
    uint64_t n_bytes;
    uint64_t offset;    /* relative to the data section */
} writer_tensor;

struct rb_gguf_writer {
    const rb_os *os;
    int fd;
    char *path;
    char *tmp_path;
    uint32_t alignment;
    rb_error err;       /* sticky: err.status != RB_OK after a failure */

    writer_kv *kvs;
    uint64_t n_kv, cap_kv;
    writer_tensor *tensors;
    uint64_t n_tensors, cap_tensors;
    uint64_t data_bytes;    /* next tensor offset (aligned) */

    int is_writing;         /* begin_data done */
    int is_finished;
    uint64_t data_offset;
    uint64_t cur_tensor;    /* tensor receiving bytes */
    uint64_t cur_written;   /* bytes of it received */

    uint8_t *out;
    uint64_t out_len;
    uint64_t out_at;        /* file offset of out[0] */
    uint64_t file_bytes;
};

static rb_status fail(rb_gguf_writer *w, rb_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static rb_status fail(rb_gguf_writer *w, rb_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->err.message, sizeof w->err.message, fmt, ap);
    va_end(ap);
    w->err.status = st;
    return st;
}

rb_status rb_gguf_writer_create(const char *path, uint32_t alignment,
                                const rb_os *os, rb_gguf_writer **out,
                                rb_error *err)
{
    if (!path || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "gguf writer: path and out are required");
    if (alignment == 0)
        alignment = RB_GGUF_DEFAULT_ALIGNMENT;
    if ((alignment & (alignment - 1)) != 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "gguf writer: alignment %" PRIu32 " is not a power of two", alignment);
    rb_gguf_writer *w = calloc(1, sizeof *w);
    size_t n = strlen(path);
    if (w) {
        w->path = malloc(n + 1);
        w->tmp_path = malloc(n + 5);
        w->out = malloc(WRITE_BUFFER_BYTES);
    }
    if (!w || !w->path || !w->tmp_path || !w->out) {
        if (w) {
            free(w->path);
            free(w->tmp_path);
            free(w->out);
            free(w);
        }
        return rb_error_set(err, RB_E_NOMEM, "gguf writer: out of memory");
    }
    memcpy(w->path, path, n + 1);
    memcpy(w->tmp_path, path, n);
    memcpy(w->tmp_path + n, ".tmp", 5);
    w->os = os ? os : rb_os_default();
    w->alignment = alignment;
    w->fd = w->os->open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) {
        rb_status st = rb_error_set(err, RB_E_IO, "gguf writer: cannot create '%s': %s",
                                    w->tmp_path, strerror(errno));
        free(w->path);
        free(w->tmp_path);
        free(w->out);
        free(w);
        return st;
    }
    if (alignment != RB_GGUF_DEFAULT_ALIGNMENT)
        rb_gguf_writer_set_u32(w, "general.alignment", alignment);
    *out = w;
    return RB_OK;
}

void rb_gguf_writer_destroy(rb_gguf_writer *w)
{
    if (!w)
        return;
    if (w->fd >= 0) {
        w->os->close(w->fd);
        if (!w->is_finished)
            w->os->unlink(w->tmp_path);
    }
    for (uint64_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].raw);
    }
    free(w->kvs);
    free(w->tensors);
    free(w->out);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

const char *rb_gguf_writer_errmsg(const rb_gguf_writer *w)
{
    return w->err.status ? w->err.message : "";
}

/* ---- metadata ------------------------------------------------------------ */

static writer_kv *find_kv(rb_gguf_writer *w, const char *key)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kvs[i].key, key) == 0)
            return &w->kvs[i];
    return NULL;
}

/* Stores raw (type + value) under key; takes ownership of raw. */
static rb_status put_kv(rb_gguf_writer *w, const char *key, uint8_t *raw, uint64_t raw_len)
{
    if (w->err.status) {
        free(raw);
        return w->err.status;
    }
    if (!raw)
        return fail(w, RB_E_NOMEM, "gguf writer: out of memory for kv '%s'", key);
    if (w->is_writing) {
        free(raw);
        return fail(w, RB_E_INVALID_ARG, "gguf writer: kv '%s' set after begin_data", key);
    }
    if (!key || !key[0]) {
        free(raw);
        return fail(w, RB_E_INVALID_ARG, "gguf writer: empty key");
    }
    writer_kv *kv = find_kv(w, key);
    if (kv) {
        free(kv->raw);
        kv->raw = raw;
        kv->raw_len = raw_len;
        return RB_OK;
    }
    if (w->n_kv == w->cap_kv) {
        uint64_t cap = w->cap_kv ? 2 * w->cap_kv : 32;
        writer_kv *nk = realloc(w->kvs, cap * sizeof *nk);
        if (!nk) {
            free(raw);
            return fail(w, RB_E_NOMEM, "gguf writer: out of memory for kv '%s'", key);
        }
        w->kvs = nk;
        w->cap_kv = cap;
    }
    size_t klen = strlen(key);
    char *k = malloc(klen + 1);
    if (!k) {
        free(raw);
        return fail(w, RB_E_NOMEM, "gguf writer: out of memory for kv '%s'", key);
    }
    memcpy(k, key, klen + 1);
    w->kvs[w->n_kv++] = (writer_kv){k, raw, raw_len};
    return RB_OK;
}

static uint8_t *encode_scalar(uint32_t type, const void *v, size_t size, uint64_t *len)
{
    uint8_t *raw = malloc(4 + size);
    if (raw) {
        memcpy(raw, &type, 4);
        memcpy(raw + 4, v, size);
        *len = 4 + size;
    }
    return raw;
}

#define DEFINE_SETTER(fn, ctype, gtype)                                        \
    rb_status fn(rb_gguf_writer *w, const char *key, ctype v)                  \
    {                                                                          \
        uint64_t len = 0;                                                      \
        uint8_t *raw = encode_scalar(gtype, &v, sizeof v, &len);               \
        return put_kv(w, key, raw, len);                                       \
    }

DEFINE_SETTER(rb_gguf_writer_set_u32, uint32_t, RB_GGUF_U32)
DEFINE_SETTER(rb_gguf_writer_set_i32, int32_t, RB_GGUF_I32)
DEFINE_SETTER(rb_gguf_writer_set_u64, uint64_t, RB_GGUF_U64)
DEFINE_SETTER(rb_gguf_writer_set_f32, float, RB_GGUF_F32)

rb_status rb_gguf_writer_set_bool(rb_gguf_writer *w, const char *key, int v)
{
    uint8_t b = v != 0;
    uint64_t len = 0;
    uint8_t *raw = encode_scalar(RB_GGUF_BOOL, &b, 1, &len);
    return put_kv(w, key, raw, len);
}

rb_status rb_gguf_writer_set_str(rb_gguf_writer *w, const char *key, const char *s)
{
    uint64_t n = strlen(s);
    uint8_t *raw = malloc(12 + n);
    if (raw) {
        uint32_t t = RB_GGUF_STRING;
        memcpy(raw, &t, 4);
        memcpy(raw + 4, &n, 8);
        memcpy(raw + 12, s, n);
    }
    return put_kv(w, key, raw, 12 + n);
}

static uint64_t scalar_bytes(uint32_t type)
{
    switch (type) {
    case RB_GGUF_U8: case RB_GGUF_I8: case RB_GGUF_BOOL: return 1;
    case RB_GGUF_U16: case RB_GGUF_I16: return 2;
    case RB_GGUF_U32: case RB_GGUF_I32: case RB_GGUF_F32: return 4;
    case RB_GGUF_U64: case RB_GGUF_I64: case RB_GGUF_F64: return 8;
    default: return 0;
    }
}

rb_status rb_gguf_writer_set_array(rb_gguf_writer *w, const char *key,
                                   uint32_t elem_type, uint64_t n, const void *elems)
{
    uint64_t es = scalar_bytes(elem_type);
    if (es == 0)
        return w->err.status ? w->err.status
                             : fail(w, RB_E_INVALID_ARG,
                                    "gguf writer: kv '%s': element type %s is not a fixed-size scalar",
                                    key, rb_gguf_type_name(elem_type));
    uint64_t len = 16 + n * es;
    uint8_t *raw = malloc(len);
    if (raw) {
        uint32_t t = RB_GGUF_ARRAY;
        memcpy(raw, &t, 4);
        memcpy(raw + 4, &elem_type, 4);
        memcpy(raw + 8, &n, 8);
        if (n)
            memcpy(raw + 16, elems, n * es);
    }
    return put_kv(w, key, raw, len);
}

rb_status rb_gguf_writer_set_str_array(rb_gguf_writer *w, const char *key,
                                       uint64_t n, const char *const *strs)
{
    uint64_t len = 16;
    for (uint64_t i = 0; i < n; i++)
        len += 8 + strlen(strs[i]);
    uint8_t *raw = malloc(len);
    if (raw) {
        uint32_t t = RB_GGUF_ARRAY, et = RB_GGUF_STRING;
        memcpy(raw, &t, 4);
        memcpy(raw + 4, &et, 4);
        memcpy(raw + 8, &n, 8);
        uint8_t *p = raw + 16;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t sl = strlen(strs[i]);
            memcpy(p, &sl, 8);
            memcpy(p + 8, strs[i], sl);
            p += 8 + sl;
        }
    }
    return put_kv(w, key, raw, len);
}

rb_status rb_gguf_writer_set_raw(rb_gguf_writer *w, const char *key,
                                 const uint8_t *raw, uint64_t raw_len)
{
    uint8_t *copy = malloc(raw_len ? raw_len : 1);
    if (copy)
        memcpy(copy, raw, raw_len);
    return put_kv(w, key, copy, raw_len);
}

void rb_gguf_writer_remove(rb_gguf_writer *w, const char *key)
{
    writer_kv *kv = find_kv(w, key);
    if (!kv || w->is_writing)
        return;
    free(kv->key);
    free(kv->raw);
    uint64_t i = (uint64_t)(kv - w->kvs);
    memmove(kv, kv + 1, (w->n_kv - i - 1) * sizeof *kv);
    w->n_kv--;
}

/* ---- tensors ------------------------------------------------------------- */

rb_status rb_gguf_writer_add_tensor(rb_gguf_writer *w, const char *name,
                                    uint32_t type, uint32_t n_dims,
                                    const uint64_t *dims)
{
    if (w->err.status)
        return w->err.status;
    if (w->is_writing)
        return fail(w, RB_E_INVALID_ARG, "gguf writer: tensor '%s' added after begin_data", name);
    size_t nl = strlen(name);
    if (nl == 0 || nl > RB_GGUF_MAX_NAME)
        return fail(w, RB_E_INVALID_ARG, "gguf writer: tensor name '%s' must be 1..%d bytes",
                    name, RB_GGUF_MAX_NAME);
    if (n_dims < 1 || n_dims > RB_GGUF_MAX_DIMS)
        return fail(w, RB_E_INVALID_ARG, "gguf writer: tensor '%s': n_dims %" PRIu32, name, n_dims);
    const rb_type_traits *tt = rb_type_get_traits(type);
    if (!tt)
        return fail(w, RB_E_INVALID_ARG, "gguf writer: tensor '%s': unknown type %" PRIu32, name, type);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return fail(w, RB_E_INVALID_ARG, "gguf writer: duplicate tensor '%s'", name);
    /* the reader's rule: no zero dim, element count fits int64 */
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (dims[d] == 0 || dims[d] > (uint64_t)INT64_MAX / n_elems)
            return fail(w, RB_E_INVALID_ARG,
                        "gguf writer: tensor '%s': dims[%" PRIu32 "] = %" PRIu64
                        " is zero or makes the element count overflow int64", name, d, dims[d]);
        n_elems *= dims[d];
    }
    uint64_t nrows = n_elems / dims[0];
    uint64_t row = rb_type_row_bytes(type, dims[0]);
    if (row == 0)
        return fail(w, RB_E_INVALID_ARG,
                    "gguf writer: tensor '%s': row length %" PRIu64 " is not a multiple of %s's block of %" PRIu32,
                    name, dims[0], tt->name, tt->block_elems);
    if (nrows > UINT64_MAX / 2 / row || w->data_bytes > UINT64_MAX / 2 - row * nrows)
        return fail(w, RB_E_INVALID_ARG, "gguf writer: tensor '%s': byte size overflows", name);
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? 2 * w->cap_tensors : 64;
        writer_tensor *nt = realloc(w->tensors, cap * sizeof *nt);
        if (!nt)
            return fail(w, RB_E_NOMEM, "gguf writer: out of memory for tensor '%s'", name);
        w->tensors = nt;
        w->cap_tensors = cap;
    }
    writer_tensor *t = &w->tensors[w->n_tensors++];
    memset(t, 0, sizeof *t);
    memcpy(t->name, name, nl + 1);
    t->type = type;
    t->n_dims = n_dims;
    for (uint32_t d = 0; d < n_dims; d++)
        t->dims[d] = dims[d];
    t->n_bytes = row * nrows;
    t->offset = w->data_bytes;
    w->data_bytes += (t->n_bytes + w->alignment - 1) / w->alignment * w->alignment;
    return RB_OK;
}

/* ---- output -------------------------------------------------------------- */

static rb_status flush(rb_gguf_writer *w)
{
    if (w->out_len == 0)
        return RB_OK;
    int e = 0;
    if (rb_os_write_full(w->os, w->fd, w->out, (size_t)w->out_len, w->out_at, &e) != RB_OK)
        return fail(w, RB_E_IO, "gguf writer: write of '%s' at offset %" PRIu64 " failed: %s",
                    w->tmp_path, w->out_at, strerror(e));
    w->out_at += w->out_len;
    w->out_len = 0;
    return RB_OK;
}

static rb_status emit(rb_gguf_writer *w, const void *data, uint64_t n)
{
    const uint8_t *p = data;
    while (n > 0) {
        uint64_t room = WRITE_BUFFER_BYTES - w->out_len;
        uint64_t k = n < room ? n : room;
        if (p)
            memcpy(w->out + w->out_len, p, (size_t)k);
        else
            memset(w->out + w->out_len, 0, (size_t)k); /* padding */
        w->out_len += k;
        n -= k;
        if (p)
            p += k;
        if (w->out_len == WRITE_BUFFER_BYTES && flush(w) != RB_OK)
            return w->err.status;
    }
    return RB_OK;
}

static rb_status emit_u32(rb_gguf_writer *w, uint32_t v) { return emit(w, &v, 4); }
static rb_status emit_u64(rb_gguf_writer *w, uint64_t v) { return emit(w, &v, 8); }

static rb_status emit_str(rb_gguf_writer *w, const char *s)
{
    uint64_t n = strlen(s);
    rb_status st = emit_u64(w, n);
    return st ? st : emit(w, s, n);
}

static uint64_t position(const rb_gguf_writer *w) { return w->out_at + w->out_len; }

rb_status rb_gguf_writer_begin_data(rb_gguf_writer *w)
{
    if (w->err.status)
        return w->err.status;
    if (w->is_writing)
        return fail(w, RB_E_INVALID_ARG, "gguf writer: begin_data called twice");
    w->is_writing = 1;
    emit(w, RB_GGUF_MAGIC, 4);
    emit_u32(w, 3);
    emit_u64(w, w->n_tensors);
    emit_u64(w, w->n_kv);
    for (uint64_t i = 0; i < w->n_kv; i++) {
        emit_str(w, w->kvs[i].key);
        emit(w, w->kvs[i].raw, w->kvs[i].raw_len);
    }
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const writer_tensor *t = &w->tensors[i];
        emit_str(w, t->name);
        emit_u32(w, t->n_dims);
        emit(w, t->dims, 8ull * t->n_dims);
        emit_u32(w, t->type);
        emit_u64(w, t->offset);
    }
    uint64_t pos = position(w);
    w->data_offset = (pos + w->alignment - 1) / w->alignment * w->alignment;
    emit(w, NULL, w->data_offset - pos);
    w->cur_tensor = 0;
    w->cur_written = 0;
    return w->err.status;
}

rb_status rb_gguf_writer_write(rb_gguf_writer *w, const void *data, uint64_t n)
{
    if (w->err.status)
        return w->err.status;
    if (!w->is_writing)
        return fail(w, RB_E_INVALID_ARG, "gguf writer: data written before begin_data");
    const uint8_t *p = data;
    while (n > 0) {
        if (w->cur_tensor >= w->n_tensors)
            return fail(w, RB_E_INVALID_ARG,
                        "gguf writer: %" PRIu64 " bytes written beyond the last tensor", n);
        writer_tensor *t = &w->tensors[w->cur_tensor];
        uint64_t k = t->n_bytes - w->cur_written;
        if (k > n)
            k = n;
        if (emit(w, p, k) != RB_OK)
            return w->err.status;
        p += k;
        n -= k;
        w->cur_written += k;
        if (w->cur_written == t->n_bytes) {
            /* every tensor, the last one too, is padded to the alignment,
               as llama.cpp's writer does */
            uint64_t pad = (w->alignment - t->n_bytes % w->alignment) % w->alignment;
            if (emit(w, NULL, pad) != RB_OK)
                return w->err.status;
            w->cur_tensor++;
            w->cur_written = 0;
        }
    }
    return RB_OK;
}

uint64_t rb_gguf_writer_next_tensor(const rb_gguf_writer *w) { return w->cur_tensor; }

rb_status rb_gguf_writer_finish(rb_gguf_writer *w)
{
    if (w->err.status)
        return w->err.status;
    if (!w->is_writing && rb_gguf_writer_begin_data(w) != RB_OK)
        return w->err.status;
    if (w->cur_tensor < w->n_tensors)
        return fail(w, RB_E_INVALID_ARG,
                    "gguf writer: tensor '%s' got %" PRIu64 " of its %" PRIu64 " bytes",
                    w->tensors[w->cur_tensor].name, w->cur_written,
                    w->tensors[w->cur_tensor].n_bytes);
    if (flush(w) != RB_OK)
        return w->err.status;
    if (w->os->fsync(w->fd) != 0)
        return fail(w, RB_E_IO, "gguf writer: fsync of '%s' failed: %s", w->tmp_path,
                    strerror(errno));
    if (w->os->rename(w->tmp_path, w->path) != 0)
        return fail(w, RB_E_IO, "gguf writer: rename '%s' -> '%s' failed: %s",
                    w->tmp_path, w->path, strerror(errno));
    w->is_finished = 1;
    w->file_bytes = w->out_at;
    return RB_OK;
}

uint64_t rb_gguf_writer_file_bytes(const rb_gguf_writer *w) { return w->file_bytes; }
