/*
 * gguf.c - GGUF reader: validates a file's header and tensor index and
 * serves metadata and tensor bytes by offset. The format is drawn in gguf.h.
 *
 * Does: parse, validate, look up. Does not: interpret metadata (model.c
 * does), convert tensor types (quant.c), cache tensor data (wcache, later).
 *
 * How a file is read, and why:
 *   The header's length is only known after parsing it, and values point
 *   into it, so the reader keeps the file's first bytes in one buffer and
 *   parses from that buffer. It starts with min(file, 1 MiB); when the
 *   parser runs off the end of the buffer (but not of the file) it asks for
 *   more, the buffer grows (at least doubling, at most to the file size)
 *   and the parse starts again. Restarting keeps every pointer the parse
 *   hands out valid without fix-ups, and costs little: headers are a few
 *   MiB at most (151k-token vocabularies), parsing is linear, and doubling
 *   bounds the restarts to log2(header / 1 MiB).
 *
 * Hostile input: every count and length is checked against the bytes left
 * in the file *before* anything is allocated for it, with the cheapest
 * possible encoding of the thing counted (a string is at least 8 bytes, a
 * tensor info at least 33), so memory stays a small multiple of the file's
 * size (gguf.h gives the bound) whatever the counts claim, and no
 * loop runs longer than the file is long. Array nesting is limited to
 * RB_GGUF_MAX_ARRAY_DEPTH so recursion is bounded. All arithmetic on file
 * values is 64-bit with explicit overflow checks.
 *
 * Memory (owned by rb_gguf, freed by rb_gguf_close):
 *   hdr      file bytes [0, hdr_len): strings and arrays point here
 *            (in memory mode and mmap mode the caller's / mapped bytes)
 *   kvs      n_kv entries, file order;    kv_sorted: indices by key
 *   tensors  n_tensors entries, file order; tensor_sorted: indices by name
 *   names    arena of NUL-terminated keys and tensor names
 *   indices  per top-level string/array array: element offsets
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "quant.h"
#include "status.h"

#define GGUF_INITIAL_READ (1u << 20)
#define GGUF_MIN_KV_BYTES 14     /* key len 8 + key 1 + type 4 + value 1 */
#define GGUF_MIN_TENSOR_BYTES 33 /* len 8 + name 1 + n_dims 4 + dim 8 + type 4 + offset 8 */

struct rb_gguf {
    const rb_os *os;
    int fd;                  /* -1 in memory mode */
    uint64_t file_size;
    const uint8_t *base;     /* whole file when mapped or in memory, else NULL */
    int is_mapped;
    uint8_t *hdr_owned;      /* the header buffer when read by pread */
    const uint8_t *hdr;
    uint64_t hdr_len;

    uint32_t version;
    uint32_t alignment;
    uint64_t header_bytes;   /* where the parse ended, before padding */
    uint64_t data_offset;

    uint64_t n_kv;
    rb_gguf_kv *kvs;
    uint64_t *kv_sorted;
    uint64_t n_tensors;
    rb_gguf_tensor *tensors;
    uint64_t *tensor_sorted;
    char *names;
};

/* ---- the parser ---------------------------------------------------------- */

enum { PARSE_MORE = -1 }; /* internal: the buffer ended before the file did */

typedef struct parser {
    rb_gguf *g;
    const uint8_t *buf;
    uint64_t len;       /* bytes of the file in buf */
    uint64_t pos;
    uint64_t need;      /* on PARSE_MORE: bytes wanted */
    rb_error *err;
    char what[192];     /* the item being parsed, for messages */
} parser;

static uint64_t left(const parser *p) { return p->g->file_size - p->pos; }

/* Makes bytes [pos, pos+n) available, or explains why they are not. */
static int take(parser *p, uint64_t n, const char *field)
{
    if (n > left(p))
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s%s%s: truncated: needs %" PRIu64 " bytes at offset 0x%" PRIx64
            " but the file has %" PRIu64 " left (file size %" PRIu64 ")",
            p->what, p->what[0] ? ": " : "", field, n, p->pos, left(p),
            p->g->file_size);
    if (p->pos + n > p->len) {
        p->need = p->pos + n;
        return PARSE_MORE;
    }
    return 0;
}

static uint32_t load_u32(const uint8_t *b) { uint32_t v; memcpy(&v, b, 4); return v; }
static uint64_t load_u64(const uint8_t *b) { uint64_t v; memcpy(&v, b, 8); return v; }

static int read_u32(parser *p, uint32_t *v, const char *field)
{
    int rc = take(p, 4, field);
    if (rc)
        return rc;
    *v = load_u32(p->buf + p->pos);
    p->pos += 4;
    return 0;
}

static int read_u64(parser *p, uint64_t *v, const char *field)
{
    int rc = take(p, 8, field);
    if (rc)
        return rc;
    *v = load_u64(p->buf + p->pos);
    p->pos += 8;
    return 0;
}

/* A string: its u64 length is checked against the file before use. */
static int read_str(parser *p, rb_gguf_str *s, const char *field)
{
    uint64_t at = p->pos, n;
    int rc = read_u64(p, &n, field);
    if (rc)
        return rc;
    if (n > left(p))
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s%s%s: string length %" PRIu64 " at offset 0x%" PRIx64
            " exceeds the %" PRIu64 " bytes left in the file",
            p->what, p->what[0] ? ": " : "", field, n, at, left(p));
    if ((rc = take(p, n, field)) != 0)
        return rc;
    s->ptr = (const char *)p->buf + p->pos;
    s->len = n;
    p->pos += n;
    return 0;
}

static const uint8_t scalar_size[RB_GGUF_TYPE_COUNT] = {
    [RB_GGUF_U8] = 1, [RB_GGUF_I8] = 1, [RB_GGUF_U16] = 2, [RB_GGUF_I16] = 2,
    [RB_GGUF_U32] = 4, [RB_GGUF_I32] = 4, [RB_GGUF_F32] = 4, [RB_GGUF_BOOL] = 1,
    [RB_GGUF_U64] = 8, [RB_GGUF_I64] = 8, [RB_GGUF_F64] = 8,
};

const char *rb_gguf_type_name(uint32_t type)
{
    static const char *const names[RB_GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string",
        "array", "u64", "i64", "f64",
    };
    return type < RB_GGUF_TYPE_COUNT ? names[type] : "?";
}

/* Decodes a fixed-size scalar at b (already bounds-checked). */
static void decode_scalar(uint32_t type, const uint8_t *b, rb_gguf_value *out)
{
    out->type = type;
    switch (type) {
    case RB_GGUF_U8: out->v.u64 = b[0]; break;
    case RB_GGUF_BOOL: out->v.u64 = b[0] != 0; break;
    case RB_GGUF_I8: out->v.i64 = (int8_t)b[0]; break;
    case RB_GGUF_U16: { uint16_t x; memcpy(&x, b, 2); out->v.u64 = x; break; }
    case RB_GGUF_I16: { int16_t x; memcpy(&x, b, 2); out->v.i64 = x; break; }
    case RB_GGUF_U32: out->v.u64 = load_u32(b); break;
    case RB_GGUF_I32: { int32_t x; memcpy(&x, b, 4); out->v.i64 = x; break; }
    case RB_GGUF_F32: { float x; memcpy(&x, b, 4); out->v.f64 = x; break; }
    case RB_GGUF_U64: out->v.u64 = load_u64(b); break;
    case RB_GGUF_I64: { int64_t x; memcpy(&x, b, 8); out->v.i64 = x; break; }
    case RB_GGUF_F64: { double x; memcpy(&x, b, 8); out->v.f64 = x; break; }
    default: break;
    }
}

static int parse_value(parser *p, uint32_t type, int depth, rb_gguf_value *out,
                       uint64_t **index_out);

/*
 * An array: element type, count, elements. The count is checked against
 * the bytes left with each element's smallest encoding before anything
 * loops or allocates. index_out (top level only) receives an offset per
 * string or array element so that token i is found in O(1).
 */
static int parse_array(parser *p, int depth, rb_gguf_array *a, uint64_t **index_out)
{
    uint64_t at = p->pos;
    uint32_t et;
    uint64_t n;
    int rc;
    if ((rc = read_u32(p, &et, "array element type")) != 0 ||
        (rc = read_u64(p, &n, "array count")) != 0)
        return rc;
    if (et >= RB_GGUF_TYPE_COUNT)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: unknown array element type %" PRIu32 " at offset 0x%" PRIx64,
            p->what, et, at);
    if (et == RB_GGUF_ARRAY && depth + 1 >= RB_GGUF_MAX_ARRAY_DEPTH)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: arrays nested deeper than %d at offset 0x%" PRIx64,
            p->what, RB_GGUF_MAX_ARRAY_DEPTH, at);
    uint64_t min_elem = et == RB_GGUF_STRING ? 8 : et == RB_GGUF_ARRAY ? 12 : scalar_size[et];
    if (n > left(p) / min_elem)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: array count %" PRIu64 " at offset 0x%" PRIx64
            ": %" PRIu64 " elements of type %s need at least %" PRIu64
            " bytes each, but the file has %" PRIu64 " left",
            p->what, n, at + 4, n, rb_gguf_type_name(et), min_elem, left(p));
    a->type = et;
    a->n = n;
    a->data = p->buf + p->pos;
    a->index = NULL;
    if (et != RB_GGUF_STRING && et != RB_GGUF_ARRAY) {
        if ((rc = take(p, n * min_elem, "array elements")) != 0)
            return rc;
        a->data = p->buf + p->pos;
        p->pos += n * min_elem;
        return 0;
    }
    uint64_t *index = NULL;
    if (index_out && n > 0) {
        index = malloc(n * sizeof *index); /* n <= file size / 8 */
        if (!index)
            return rb_error_set(p->err, RB_E_NOMEM,
                "gguf: %s: out of memory for an index of %" PRIu64 " elements",
                p->what, n);
    }
    uint64_t start = p->pos;
    for (uint64_t i = 0; i < n; i++) {
        rb_gguf_value elem;
        if (index)
            index[i] = p->pos - start;
        rc = parse_value(p, et, depth + 1, &elem, NULL);
        if (rc) {
            free(index);
            return rc;
        }
    }
    /* data may have moved past a restart; it is recomputed from start */
    a->data = p->buf + start;
    a->index = index;
    if (index_out)
        *index_out = index;
    return 0;
}

static int parse_value(parser *p, uint32_t type, int depth, rb_gguf_value *out,
                       uint64_t **index_out)
{
    int rc;
    out->type = type;
    if (type == RB_GGUF_STRING)
        return read_str(p, &out->v.str, "string value");
    if (type == RB_GGUF_ARRAY)
        return parse_array(p, depth, &out->v.arr, index_out);
    if (type >= RB_GGUF_TYPE_COUNT)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: unknown value type %" PRIu32 " at offset 0x%" PRIx64,
            p->what, type, p->pos - 4);
    if ((rc = take(p, scalar_size[type], "value")) != 0)
        return rc;
    decode_scalar(type, p->buf + p->pos, out);
    p->pos += scalar_size[type];
    return 0;
}

static void describe(parser *p, const char *kind, uint64_t i, rb_gguf_str name)
{
    int n = name.len > 96 ? 96 : (int)name.len;
    snprintf(p->what, sizeof p->what, "%s #%" PRIu64 " '%.*s%s'", kind, i, n,
             name.ptr ? name.ptr : "", name.len > 96 ? "..." : "");
}

static int parse_kv(parser *p, uint64_t i, rb_gguf_kv *kv)
{
    rb_gguf_str key = {0};
    uint32_t type;
    int rc;
    kv->file_offset = p->pos;
    snprintf(p->what, sizeof p->what, "kv #%" PRIu64, i);
    if ((rc = read_str(p, &key, "key")) != 0)
        return rc;
    describe(p, "kv", i, key);
    if (key.len == 0 || memchr(key.ptr, 0, key.len))
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: key at offset 0x%" PRIx64 " is empty or holds a NUL byte",
            p->what, kv->file_offset);
    uint64_t type_at = p->pos;
    if ((rc = read_u32(p, &type, "value type")) != 0)
        return rc;
    uint64_t *index = NULL;
    if ((rc = parse_value(p, type, 0, &kv->value, &index)) != 0)
        return rc;
    kv->raw = p->buf + type_at;
    kv->raw_len = p->pos - type_at;
    return 0;
}

static int check_alignment_kv(parser *p, const rb_gguf_kv *kv)
{
    if (kv->value.type != RB_GGUF_U32)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: kv 'general.alignment' at offset 0x%" PRIx64
            ": type %s, expected u32", kv->file_offset,
            rb_gguf_type_name(kv->value.type));
    uint64_t a = kv->value.v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: kv 'general.alignment' at offset 0x%" PRIx64
            ": value %" PRIu64 " is not a power of two", kv->file_offset, a);
    p->g->alignment = (uint32_t)a;
    return 0;
}

static int parse_tensor_info(parser *p, uint64_t i, rb_gguf_tensor *t)
{
    rb_gguf_str name = {0};
    int rc;
    t->info_offset = p->pos;
    snprintf(p->what, sizeof p->what, "tensor #%" PRIu64, i);
    if ((rc = read_str(p, &name, "name")) != 0)
        return rc;
    describe(p, "tensor", i, name);
    if (name.len == 0 || name.len > RB_GGUF_MAX_NAME || memchr(name.ptr, 0, name.len))
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: name at offset 0x%" PRIx64 " has length %" PRIu64
            " (must be 1..%d bytes without NUL)", p->what, t->info_offset,
            name.len, RB_GGUF_MAX_NAME);
    uint64_t dims_at = p->pos;
    if ((rc = read_u32(p, &t->n_dims, "n_dims")) != 0)
        return rc;
    if (t->n_dims < 1 || t->n_dims > RB_GGUF_MAX_DIMS)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: n_dims %" PRIu32 " at offset 0x%" PRIx64 " is not in 1..%d",
            p->what, t->n_dims, dims_at, RB_GGUF_MAX_DIMS);
    uint64_t n_elems = 1;
    for (uint32_t d = 0; d < RB_GGUF_MAX_DIMS; d++)
        t->dims[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t at = p->pos;
        if ((rc = read_u64(p, &t->dims[d], "dims")) != 0)
            return rc;
        /* ggml counts elements in int64_t: the product must fit there */
        if (t->dims[d] == 0 || t->dims[d] > (uint64_t)INT64_MAX / n_elems)
            return rb_error_set(p->err, RB_E_FORMAT,
                "gguf: %s: dims[%" PRIu32 "] = %" PRIu64 " at offset 0x%" PRIx64
                " is zero or makes the element count overflow int64",
                p->what, d, t->dims[d], at);
        n_elems *= t->dims[d];
    }
    t->n_elems = n_elems;
    uint64_t type_at = p->pos;
    if ((rc = read_u32(p, &t->type, "type")) != 0)
        return rc;
    const rb_type_traits *tt = rb_type_get_traits(t->type);
    if (!tt)
        return rb_error_set(p->err, RB_E_UNSUPPORTED,
            "gguf: %s: unknown tensor type %" PRIu32 " at offset 0x%" PRIx64,
            p->what, t->type, type_at);
    if (t->dims[0] % tt->block_elems != 0)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: row length %" PRIu64 " is not a multiple of %s's block of %"
            PRIu32 " elements", p->what, t->dims[0], tt->name, tt->block_elems);
    uint64_t blocks = n_elems / tt->block_elems;
    if (blocks > UINT64_MAX / tt->block_bytes)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: %s: byte size of %" PRIu64 " %s blocks overflows", p->what,
            blocks, tt->name);
    t->n_bytes = blocks * tt->block_bytes;
    return read_u64(p, &t->offset, "offset");
}

/* Checks that need the data section's position, once the index is read. */
static int check_tensor_placement(parser *p, rb_gguf_tensor *t, uint64_t i)
{
    rb_gguf *g = p->g;
    if (t->offset % g->alignment != 0)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: tensor #%" PRIu64 " '%s': offset 0x%" PRIx64
            " (info at 0x%" PRIx64 ") is not a multiple of the alignment %" PRIu32,
            i, t->name, t->offset, t->info_offset, g->alignment);
    if (t->offset > g->file_size || g->data_offset > g->file_size - t->offset ||
        t->n_bytes > g->file_size - g->data_offset - t->offset)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: tensor #%" PRIu64 " '%s': data [0x%" PRIx64 ", +%" PRIu64
            ") at data offset 0x%" PRIx64 " ends beyond the file size 0x%" PRIx64,
            i, t->name, t->offset, t->n_bytes, g->data_offset, g->file_size);
    t->file_offset = g->data_offset + t->offset;
    return 0;
}

/* qsort has no context argument: sort (key, index) pairs instead. */
typedef struct sort_entry {
    const char *key;
    uint64_t off;
    uint64_t index;
} sort_entry;

static int by_key(const void *a, const void *b)
{
    return strcmp(((const sort_entry *)a)->key, ((const sort_entry *)b)->key);
}

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const sort_entry *)a)->off, y = ((const sort_entry *)b)->off;
    return x < y ? -1 : x > y;
}

/* Sorts n entries by key, rejects duplicates, and stores the order in *out. */
static int sort_names(parser *p, sort_entry *e, uint64_t n, const char *kind,
                      uint64_t **out)
{
    qsort(e, n, sizeof *e, by_key);
    for (uint64_t i = 1; i < n; i++)
        if (strcmp(e[i - 1].key, e[i].key) == 0)
            return rb_error_set(p->err, RB_E_FORMAT,
                "gguf: duplicate %s name '%s' (entries #%" PRIu64 " and #%" PRIu64 ")",
                kind, e[i].key, e[i - 1].index < e[i].index ? e[i - 1].index : e[i].index,
                e[i - 1].index < e[i].index ? e[i].index : e[i - 1].index);
    uint64_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order)
        return rb_error_set(p->err, RB_E_NOMEM, "gguf: out of memory sorting %ss", kind);
    for (uint64_t i = 0; i < n; i++)
        order[i] = e[i].index;
    *out = order;
    return 0;
}

static int check_overlaps(parser *p, sort_entry *e)
{
    rb_gguf *g = p->g;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        e[i].off = g->tensors[i].offset;
        e[i].index = i;
        e[i].key = g->tensors[i].name;
    }
    qsort(e, g->n_tensors, sizeof *e, by_offset);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        const rb_gguf_tensor *a = &g->tensors[e[i - 1].index];
        const rb_gguf_tensor *b = &g->tensors[e[i].index];
        if (a->offset + a->n_bytes > b->offset)
            return rb_error_set(p->err, RB_E_FORMAT,
                "gguf: tensor '%s' data [0x%" PRIx64 ", 0x%" PRIx64
                ") overlaps tensor '%s' at 0x%" PRIx64, a->name, a->offset,
                a->offset + a->n_bytes, b->name, b->offset);
    }
    return 0;
}

/* Copies keys and tensor names into one arena of C strings. */
static int build_names(parser *p)
{
    rb_gguf *g = p->g;
    uint64_t total = 0;
    for (uint64_t i = 0; i < g->n_kv; i++)
        total += load_u64(p->buf + g->kvs[i].file_offset) + 1;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        total += load_u64(p->buf + g->tensors[i].info_offset) + 1;
    g->names = malloc(total ? total : 1);
    if (!g->names)
        return rb_error_set(p->err, RB_E_NOMEM, "gguf: out of memory for names");
    char *w = g->names;
    for (uint64_t i = 0; i < g->n_kv + g->n_tensors; i++) {
        int is_kv = i < g->n_kv;
        uint64_t at = is_kv ? g->kvs[i].file_offset : g->tensors[i - g->n_kv].info_offset;
        uint64_t n = load_u64(p->buf + at);
        memcpy(w, p->buf + at + 8, n);
        w[n] = 0;
        if (is_kv)
            g->kvs[i].key = w;
        else
            g->tensors[i - g->n_kv].name = w;
        w += n + 1;
    }
    return 0;
}

static void free_parse(rb_gguf *g)
{
    for (uint64_t i = 0; g->kvs && i < g->n_kv; i++)
        if (g->kvs[i].value.type == RB_GGUF_ARRAY)
            free((void *)g->kvs[i].value.v.arr.index);
    free(g->kvs);
    free(g->kv_sorted);
    free(g->tensors);
    free(g->tensor_sorted);
    free(g->names);
    g->kvs = NULL;
    g->kv_sorted = NULL;
    g->tensors = NULL;
    g->tensor_sorted = NULL;
    g->names = NULL;
    g->n_kv = g->n_tensors = 0;
}

static int parse_header(parser *p)
{
    rb_gguf *g = p->g;
    uint32_t magic, version;
    uint64_t n_tensors, n_kv;
    int rc;
    p->what[0] = 0;
    if (g->file_size < 4)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: file is %" PRIu64 " bytes: too small for the magic", g->file_size);
    if ((rc = read_u32(p, &magic, "magic")) != 0)
        return rc;
    if (memcmp(p->buf, RB_GGUF_MAGIC, 4) != 0)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: bad magic 0x%08" PRIx32 " at offset 0 (expected \"GGUF\"): "
            "not a GGUF file", magic);
    if ((rc = read_u32(p, &version, "version")) != 0)
        return rc;
    if (version == 0x02000000u || version == 0x03000000u)
        return rb_error_set(p->err, RB_E_UNSUPPORTED,
            "gguf: version field 0x%08" PRIx32 " at offset 4: a big-endian GGUF "
            "file; only little-endian files are supported", version);
    if (version == 1)
        return rb_error_set(p->err, RB_E_UNSUPPORTED,
            "gguf: version 1 at offset 4 is obsolete (32-bit counts); "
            "re-convert the model with a current converter");
    if (version != 2 && version != 3)
        return rb_error_set(p->err, RB_E_UNSUPPORTED,
            "gguf: unknown version %" PRIu32 " at offset 4 (supported: 2, 3)", version);
    g->version = version;
    if ((rc = read_u64(p, &n_tensors, "n_tensors")) != 0 ||
        (rc = read_u64(p, &n_kv, "n_kv")) != 0)
        return rc;
    if (n_tensors > left(p) / GGUF_MIN_TENSOR_BYTES)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: n_tensors %" PRIu64 " at offset 0x8: the %" PRIu64
            " bytes left in the file cannot hold that many tensor infos",
            n_tensors, left(p));
    if (n_kv > left(p) / GGUF_MIN_KV_BYTES)
        return rb_error_set(p->err, RB_E_FORMAT,
            "gguf: n_kv %" PRIu64 " at offset 0x10: the %" PRIu64
            " bytes left in the file cannot hold that many key-value pairs",
            n_kv, left(p));

    g->kvs = calloc(n_kv ? n_kv : 1, sizeof *g->kvs);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    if (!g->kvs || !g->tensors)
        return rb_error_set(p->err, RB_E_NOMEM, "gguf: out of memory for the index");
    g->alignment = RB_GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        if ((rc = parse_kv(p, i, &g->kvs[i])) != 0)
            return rc;
        g->n_kv = i + 1; /* counts kvs whose index needs freeing */
    }
    for (uint64_t i = 0; i < n_tensors; i++)
        if ((rc = parse_tensor_info(p, i, &g->tensors[i])) != 0)
            return rc;
    g->n_tensors = n_tensors;
    p->what[0] = 0;
    if ((rc = build_names(p)) != 0)
        return rc;

    sort_entry *e = malloc((n_kv > n_tensors ? n_kv : n_tensors) * sizeof *e + 1);
    if (!e)
        return rb_error_set(p->err, RB_E_NOMEM, "gguf: out of memory sorting names");
    for (uint64_t i = 0; i < n_kv; i++)
        e[i] = (sort_entry){g->kvs[i].key, 0, i};
    rc = sort_names(p, e, n_kv, "key", &g->kv_sorted);
    for (uint64_t i = 0; !rc && i < n_tensors; i++)
        e[i] = (sort_entry){g->tensors[i].name, 0, i};
    if (!rc)
        rc = sort_names(p, e, n_tensors, "tensor", &g->tensor_sorted);
    if (!rc) {
        const rb_gguf_kv *al = rb_gguf_find_kv(g, "general.alignment");
        if (al)
            rc = check_alignment_kv(p, al);
    }
    if (!rc) {
        g->header_bytes = p->pos;
        g->data_offset = (p->pos + g->alignment - 1) / g->alignment * g->alignment;
        for (uint64_t i = 0; !rc && i < n_tensors; i++)
            rc = check_tensor_placement(p, &g->tensors[i], i);
    }
    if (!rc)
        rc = check_overlaps(p, e);
    free(e);
    return rc;
}

/* ---- open / close -------------------------------------------------------- */

static rb_gguf *gguf_new(const rb_os *os)
{
    rb_gguf *g = calloc(1, sizeof *g);
    if (g) {
        g->os = os ? os : rb_os_default();
        g->fd = -1;
    }
    return g;
}

/* Parses from g->hdr, growing it from the file (restarting) as needed. */
static rb_status parse_growing(rb_gguf *g, rb_error *err)
{
    uint64_t want = g->hdr_len;
    for (;;) {
        if (!g->base && want > g->hdr_len) {
            uint8_t *nb = realloc(g->hdr_owned, want);
            if (!nb)
                return rb_error_set(err, RB_E_NOMEM,
                    "gguf: out of memory for a %" PRIu64 "-byte header", want);
            g->hdr_owned = nb;
            g->hdr = nb;
            int e = 0;
            size_t got = 0;
            rb_status st = rb_os_read_full(g->os, g->fd, nb + g->hdr_len,
                                           want - g->hdr_len, g->hdr_len, &got, &e);
            if (st == RB_E_SHORT_READ)
                return rb_error_set(err, st,
                    "gguf: file ended at %" PRIu64 " bytes while reading its header "
                    "(it was %" PRIu64 " bytes when opened)", g->hdr_len + got,
                    g->file_size);
            if (st != RB_OK)
                return rb_error_set(err, st, "gguf: read of the header failed: %s",
                                    strerror(e));
            g->hdr_len = want;
        }
        parser p = {.g = g, .buf = g->hdr, .len = g->hdr_len, .err = err};
        int rc = parse_header(&p);
        if (rc == 0)
            return RB_OK;
        free_parse(g);
        if (rc != PARSE_MORE)
            return (rb_status)rc;
        want = g->hdr_len * 2 > p.need ? g->hdr_len * 2 : p.need;
        if (want > g->file_size)
            want = g->file_size;
    }
}

static rb_status open_from_fd(rb_gguf *g, const char *path, int flags, rb_gguf **out,
                              rb_error *err);

rb_status rb_gguf_open(const char *path, int flags, const rb_os *os,
                       rb_gguf **out, rb_error *err)
{
    if (!path || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "gguf: path and out are required");
    rb_gguf *g = gguf_new(os);
    if (!g)
        return rb_error_set(err, RB_E_NOMEM, "gguf: out of memory");
    rb_status st;
    g->fd = g->os->open(path, O_RDONLY, 0);
    if (g->fd < 0) {
        st = rb_error_set(err, errno == ENOENT ? RB_E_NOT_FOUND : RB_E_IO,
                          "gguf: cannot open '%s': %s", path, strerror(errno));
        rb_gguf_close(g);
        return st;
    }
    return open_from_fd(g, path, flags, out, err);
}

rb_status rb_gguf_open_fd(int fd, const char *name, int flags, const rb_os *os,
                          rb_gguf **out, rb_error *err)
{
    if (fd < 0 || !name || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "gguf: fd %d, name and out are required",
                            fd);
    rb_gguf *g = gguf_new(os);
    if (!g)
        return rb_error_set(err, RB_E_NOMEM, "gguf: out of memory");
    g->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* its own: the caller keeps fd */
    if (g->fd < 0) {
        rb_status st = rb_error_set(err, errno == EBADF ? RB_E_INVALID_ARG : RB_E_IO,
                                    "gguf: cannot use %s: %s", name, strerror(errno));
        rb_gguf_close(g);
        return st;
    }
    return open_from_fd(g, name, flags, out, err);
}

/* The rest of an open, g->fd open: size, header, index. Frees g on
 * failure. path names the file in messages. */
static rb_status open_from_fd(rb_gguf *g, const char *path, int flags, rb_gguf **out,
                              rb_error *err)
{
    rb_status st;
    if (g->os->fstat_size(g->fd, &g->file_size) != 0) {
        st = rb_error_set(err, RB_E_IO, "gguf: cannot stat '%s': %s", path,
                          strerror(errno));
        goto fail;
    }
    if ((flags & RB_GGUF_MMAP) && g->file_size > 0) {
        void *m = g->os->mmap_ro(g->fd, (size_t)g->file_size);
        if (!m) {
            st = rb_error_set(err, RB_E_IO, "gguf: cannot map '%s': %s", path,
                              strerror(errno));
            goto fail;
        }
        g->base = m;
        g->is_mapped = 1;
        g->hdr = g->base;
        g->hdr_len = g->file_size;
    } else {
        /* first read: 1 MiB or the whole file, then grow on demand */
        uint64_t first = g->file_size < GGUF_INITIAL_READ ? g->file_size : GGUF_INITIAL_READ;
        g->hdr_owned = malloc(first ? first : 1);
        g->hdr = g->hdr_owned;
        if (!g->hdr_owned) {
            st = rb_error_set(err, RB_E_NOMEM, "gguf: out of memory");
            goto fail;
        }
        int e = 0;
        st = rb_os_read_full(g->os, g->fd, g->hdr_owned, first, 0, NULL, &e);
        if (st != RB_OK) {
            rb_error_set(err, st, "gguf: cannot read '%s': %s", path,
                         st == RB_E_SHORT_READ ? "file shrank while opening" : strerror(e));
            goto fail;
        }
        g->hdr_len = first;
    }
    st = parse_growing(g, err);
    if (st != RB_OK) {
        /* prefix the path: the parser's message names the field */
        if (err) {
            char msg[RB_ERROR_MESSAGE_MAX];
            snprintf(msg, sizeof msg, "%s", err->message);
            rb_error_set(err, st, "%s: %s", path, msg);
        }
        goto fail;
    }
    *out = g;
    return RB_OK;
fail:
    rb_gguf_close(g);
    return st;
}

rb_status rb_gguf_open_memory(const void *data, uint64_t size, rb_gguf **out,
                              rb_error *err)
{
    if ((!data && size) || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "gguf: data and out are required");
    rb_gguf *g = gguf_new(NULL);
    if (!g)
        return rb_error_set(err, RB_E_NOMEM, "gguf: out of memory");
    static const uint8_t empty[1];
    g->base = size ? data : empty;
    g->hdr = g->base;
    g->hdr_len = g->file_size = size;
    rb_status st = parse_growing(g, err);
    if (st != RB_OK) {
        rb_gguf_close(g);
        return st;
    }
    *out = g;
    return RB_OK;
}

void rb_gguf_close(rb_gguf *g)
{
    if (!g)
        return;
    free_parse(g);
    if (g->is_mapped)
        g->os->munmap((void *)g->base, (size_t)g->file_size);
    free(g->hdr_owned);
    if (g->fd >= 0)
        g->os->close(g->fd);
    free(g);
}

/* ---- lookups ------------------------------------------------------------- */

uint32_t rb_gguf_version(const rb_gguf *g) { return g->version; }
uint64_t rb_gguf_file_size(const rb_gguf *g) { return g->file_size; }
uint32_t rb_gguf_alignment(const rb_gguf *g) { return g->alignment; }
uint64_t rb_gguf_data_offset(const rb_gguf *g) { return g->data_offset; }
uint64_t rb_gguf_header_bytes(const rb_gguf *g) { return g->header_bytes; }
uint64_t rb_gguf_n_kv(const rb_gguf *g) { return g->n_kv; }
uint64_t rb_gguf_n_tensors(const rb_gguf *g) { return g->n_tensors; }

const rb_gguf_kv *rb_gguf_kv_at(const rb_gguf *g, uint64_t i)
{
    return i < g->n_kv ? &g->kvs[i] : NULL;
}

const rb_gguf_tensor *rb_gguf_tensor_at(const rb_gguf *g, uint64_t i)
{
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

/* Binary search in a sorted order; names come from get(i). */
#define SORTED_FIND(order, n, get, key)                                      \
    do {                                                                     \
        uint64_t lo_ = 0, hi_ = (n);                                         \
        while (lo_ < hi_) {                                                  \
            uint64_t mid_ = lo_ + (hi_ - lo_) / 2;                           \
            int c_ = strcmp(get((order)[mid_]), (key));                      \
            if (c_ == 0)                                                     \
                return (order)[mid_];                                        \
            if (c_ < 0)                                                      \
                lo_ = mid_ + 1;                                              \
            else                                                             \
                hi_ = mid_;                                                  \
        }                                                                    \
        return UINT64_MAX;                                                   \
    } while (0)

static uint64_t find_kv_index(const rb_gguf *g, const char *key)
{
#define KV_KEY(i) g->kvs[i].key
    SORTED_FIND(g->kv_sorted, g->n_kv, KV_KEY, key);
#undef KV_KEY
}

static uint64_t find_tensor_index(const rb_gguf *g, const char *name)
{
#define TENSOR_NAME(i) g->tensors[i].name
    SORTED_FIND(g->tensor_sorted, g->n_tensors, TENSOR_NAME, name);
#undef TENSOR_NAME
}

const rb_gguf_kv *rb_gguf_find_kv(const rb_gguf *g, const char *key)
{
    uint64_t i = find_kv_index(g, key);
    return i == UINT64_MAX ? NULL : &g->kvs[i];
}

const rb_gguf_tensor *rb_gguf_find_tensor(const rb_gguf *g, const char *name)
{
    uint64_t i = find_tensor_index(g, name);
    return i == UINT64_MAX ? NULL : &g->tensors[i];
}

/* Bytes of the element at b (validated at open, so the walk is safe). */
static uint64_t element_bytes(uint32_t type, const uint8_t *b)
{
    if (type == RB_GGUF_STRING)
        return 8 + load_u64(b);
    if (type != RB_GGUF_ARRAY)
        return scalar_size[type];
    uint32_t et = load_u32(b);
    uint64_t n = load_u64(b + 4), total = 12;
    if (et != RB_GGUF_STRING && et != RB_GGUF_ARRAY)
        return total + n * scalar_size[et];
    for (uint64_t i = 0; i < n; i++)
        total += element_bytes(et, b + total);
    return total;
}

rb_status rb_gguf_array_get(const rb_gguf_array *a, uint64_t i, rb_gguf_value *out)
{
    if (i >= a->n)
        return RB_E_INVALID_ARG;
    const uint8_t *b;
    if (a->type != RB_GGUF_STRING && a->type != RB_GGUF_ARRAY) {
        decode_scalar(a->type, a->data + i * scalar_size[a->type], out);
        return RB_OK;
    }
    if (a->index) {
        b = a->data + a->index[i];
    } else {
        b = a->data;
        for (uint64_t k = 0; k < i; k++)
            b += element_bytes(a->type, b);
    }
    out->type = a->type;
    if (a->type == RB_GGUF_STRING) {
        out->v.str.len = load_u64(b);
        out->v.str.ptr = (const char *)b + 8;
    } else {
        out->v.arr.type = load_u32(b);
        out->v.arr.n = load_u64(b + 4);
        out->v.arr.data = b + 12;
        out->v.arr.index = NULL;
    }
    return RB_OK;
}

int rb_gguf_str_eq(rb_gguf_str s, const char *c)
{
    size_t n = strlen(c);
    return s.len == n && memcmp(s.ptr, c, n) == 0;
}

static rb_status get_integer(const rb_gguf *g, const char *key, uint64_t max,
                             uint64_t *out)
{
    const rb_gguf_kv *kv = rb_gguf_find_kv(g, key);
    if (!kv)
        return RB_E_NOT_FOUND;
    const rb_gguf_value *v = &kv->value;
    switch (v->type) {
    case RB_GGUF_U8: case RB_GGUF_U16: case RB_GGUF_U32: case RB_GGUF_U64:
        if (v->v.u64 > max)
            return RB_E_FORMAT;
        *out = v->v.u64;
        return RB_OK;
    case RB_GGUF_I8: case RB_GGUF_I16: case RB_GGUF_I32: case RB_GGUF_I64:
        if (v->v.i64 < 0 || (uint64_t)v->v.i64 > max)
            return RB_E_FORMAT;
        *out = (uint64_t)v->v.i64;
        return RB_OK;
    default:
        return RB_E_FORMAT;
    }
}

rb_status rb_gguf_get_u32(const rb_gguf *g, const char *key, uint32_t *out)
{
    uint64_t v;
    rb_status st = get_integer(g, key, UINT32_MAX, &v);
    if (st == RB_OK)
        *out = (uint32_t)v;
    return st;
}

rb_status rb_gguf_get_u64(const rb_gguf *g, const char *key, uint64_t *out)
{
    return get_integer(g, key, UINT64_MAX, out);
}

rb_status rb_gguf_get_f32(const rb_gguf *g, const char *key, float *out)
{
    const rb_gguf_kv *kv = rb_gguf_find_kv(g, key);
    if (!kv)
        return RB_E_NOT_FOUND;
    if (kv->value.type != RB_GGUF_F32 && kv->value.type != RB_GGUF_F64)
        return RB_E_FORMAT;
    *out = (float)kv->value.v.f64;
    return RB_OK;
}

rb_status rb_gguf_get_bool(const rb_gguf *g, const char *key, int *out)
{
    const rb_gguf_kv *kv = rb_gguf_find_kv(g, key);
    if (!kv)
        return RB_E_NOT_FOUND;
    if (kv->value.type != RB_GGUF_BOOL)
        return RB_E_FORMAT;
    *out = (int)kv->value.v.u64;
    return RB_OK;
}

rb_status rb_gguf_get_str(const rb_gguf *g, const char *key, rb_gguf_str *out)
{
    const rb_gguf_kv *kv = rb_gguf_find_kv(g, key);
    if (!kv)
        return RB_E_NOT_FOUND;
    if (kv->value.type != RB_GGUF_STRING)
        return RB_E_FORMAT;
    *out = kv->value.v.str;
    return RB_OK;
}

rb_status rb_gguf_get_array(const rb_gguf *g, const char *key, uint32_t elem_type,
                            rb_gguf_array *out)
{
    const rb_gguf_kv *kv = rb_gguf_find_kv(g, key);
    if (!kv)
        return RB_E_NOT_FOUND;
    if (kv->value.type != RB_GGUF_ARRAY ||
        (elem_type != UINT32_MAX && kv->value.v.arr.type != elem_type))
        return RB_E_FORMAT;
    *out = kv->value.v.arr;
    return RB_OK;
}

/* ---- tensor data --------------------------------------------------------- */

rb_status rb_gguf_read(const rb_gguf *g, const rb_gguf_tensor *t, uint64_t off,
                       void *dst, uint64_t len, rb_error *err)
{
    if (off > t->n_bytes || len > t->n_bytes - off)
        return rb_error_set(err, RB_E_INVALID_ARG,
            "gguf: read of [%" PRIu64 ", +%" PRIu64 ") outside tensor '%s' (%" PRIu64
            " bytes)", off, len, t->name, t->n_bytes);
    if (g->base) {
        memcpy(dst, g->base + t->file_offset + off, (size_t)len);
        return RB_OK;
    }
    int e = 0;
    size_t got = 0;
    rb_status st = rb_os_read_full(g->os, g->fd, dst, (size_t)len,
                                   t->file_offset + off, &got, &e);
    if (st == RB_E_SHORT_READ)
        return rb_error_set(err, st,
            "gguf: tensor '%s': file ended after %zu of %" PRIu64 " bytes at 0x%"
            PRIx64 " (truncated since open?)", t->name, got, len, t->file_offset + off);
    if (st != RB_OK)
        return rb_error_set(err, st, "gguf: tensor '%s': read at 0x%" PRIx64 " failed: %s",
                            t->name, t->file_offset + off, strerror(e));
    return RB_OK;
}

const void *rb_gguf_tensor_data(const rb_gguf *g, const rb_gguf_tensor *t)
{
    return g->base ? g->base + t->file_offset : NULL;
}
