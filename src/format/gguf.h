/*
 * gguf.h - reader of GGUF model files (versions 2 and 3, little-endian).
 *
 * The file format (all integers little-endian):
 *
 *   offset 0   magic      "GGUF" (bytes 47 47 55 46)
 *              version    u32 (2 or 3; 1 used 32-bit counts and is refused)
 *              n_tensors  u64
 *              n_kv       u64
 *              kv[n_kv]   key: string; value_type: u32; value
 *              tensor_info[n_tensors]
 *                         name: string; n_dims: u32 (1..4);
 *                         dims: u64[n_dims] (dims[0] = row length);
 *                         type: u32 (ggml type id); offset: u64 (relative
 *                         to the data section, a multiple of the alignment)
 *              padding to `general.alignment` (u32 key, default 32)
 *   data       tensor bytes, each tensor at data_offset + its offset
 *
 *   string = u64 length + bytes (no NUL); value types: 0 u8, 1 i8, 2 u16,
 *   3 i16, 4 u32, 5 i32, 6 f32, 7 bool (1 byte), 8 string, 9 array
 *   (u32 element type, u64 count, elements; arrays may nest), 10 u64,
 *   11 i64, 12 f64.
 *
 * Opening reads the header and index only, and validates every count,
 * length, type, offset and size against the file before trusting it: a
 * truncated or hostile file gets RB_E_FORMAT (or RB_E_SHORT_READ,
 * RB_E_UNSUPPORTED) and a message naming the field, the value and the file
 * offset. Memory stays proportional to the file: the header buffer is at
 * most the file, and each index entry (kv ~80 B, tensor ~112 B) stands for
 * at least 14 or 33 bytes of file, so the index is at most ~6x the file's
 * header bytes, whatever the counts claim. Tensor data is reached by
 * offset (rb_gguf_read) or, when opened with RB_GGUF_MMAP, by pointer.
 *
 * Memory: one buffer holding the file's header bytes (strings and arrays
 * point into it, so values cost no copies), one array of kv entries, one of
 * tensor entries, one arena of NUL-terminated keys and tensor names, and an
 * index of element offsets for each top-level string array (tokens, merges).
 * All pointers returned live until rb_gguf_close.
 *
 * Threads: after open, every function is read-only and may be called from
 * several threads at once.
 */
#ifndef RB_GGUF_H
#define RB_GGUF_H

#include <stdint.h>

#include "os.h"
#include "rebound.h"

#define RB_GGUF_MAGIC "GGUF"
#define RB_GGUF_DEFAULT_ALIGNMENT 32
#define RB_GGUF_MAX_DIMS 4
#define RB_GGUF_MAX_NAME 63       /* ggml's GGML_MAX_NAME is 64 with the NUL */
#define RB_GGUF_MAX_ARRAY_DEPTH 8 /* nesting deeper than this is refused */

typedef enum rb_gguf_type {
    RB_GGUF_U8 = 0,
    RB_GGUF_I8 = 1,
    RB_GGUF_U16 = 2,
    RB_GGUF_I16 = 3,
    RB_GGUF_U32 = 4,
    RB_GGUF_I32 = 5,
    RB_GGUF_F32 = 6,
    RB_GGUF_BOOL = 7,
    RB_GGUF_STRING = 8,
    RB_GGUF_ARRAY = 9,
    RB_GGUF_U64 = 10,
    RB_GGUF_I64 = 11,
    RB_GGUF_F64 = 12,
    RB_GGUF_TYPE_COUNT
} rb_gguf_type;

/* A string inside the file: not NUL-terminated, may hold any bytes. */
typedef struct rb_gguf_str {
    const char *ptr;
    uint64_t len;
} rb_gguf_str;

/* An array inside the file. Elements are reached with rb_gguf_array_get. */
typedef struct rb_gguf_array {
    uint32_t type;          /* element type (rb_gguf_type) */
    uint64_t n;             /* element count */
    const uint8_t *data;    /* first element's bytes */
    const uint64_t *index;  /* for string/array elements: offset of each
                               element from data; NULL for fixed-size ones
                               and for nested arrays (then walked) */
} rb_gguf_array;

typedef struct rb_gguf_value {
    uint32_t type; /* rb_gguf_type */
    union {
        uint64_t u64; /* U8, U16, U32, U64, BOOL (0/1) */
        int64_t i64;  /* I8, I16, I32, I64 */
        double f64;   /* F32, F64 */
        rb_gguf_str str;
        rb_gguf_array arr;
    } v;
} rb_gguf_value;

typedef struct rb_gguf_kv {
    const char *key;         /* NUL-terminated */
    rb_gguf_value value;
    uint64_t file_offset;    /* offset of the key in the file */
    const uint8_t *raw;      /* value_type u32 + value, as in the file */
    uint64_t raw_len;
} rb_gguf_kv;

typedef struct rb_gguf_tensor {
    const char *name;        /* NUL-terminated, unique */
    uint32_t type;           /* ggml type id (rb_type) */
    uint32_t n_dims;
    uint64_t dims[RB_GGUF_MAX_DIMS]; /* unused dims are 1 */
    uint64_t n_elems;
    uint64_t n_bytes;
    uint64_t offset;         /* relative to the data section */
    uint64_t file_offset;    /* absolute: data_offset + offset */
    uint64_t info_offset;    /* where the tensor info starts in the file */
} rb_gguf_tensor;

typedef struct rb_gguf rb_gguf;

enum { RB_GGUF_MMAP = 1 }; /* open flag: map the file read-only */

/*
 * Opens and validates a GGUF file. os may be NULL (the real system calls).
 * Errors: RB_E_IO (open/stat/read/mmap failed: message has strerror),
 * RB_E_SHORT_READ (file shrank while reading), RB_E_FORMAT (malformed:
 * message names field, value, offset), RB_E_UNSUPPORTED (version 1, a big-
 * endian file, an unknown tensor type), RB_E_NOMEM.
 * On success *out owns the open file descriptor.
 */
rb_status rb_gguf_open(const char *path, int flags, const rb_os *os,
                       rb_gguf **out, rb_error *err);

/*
 * The same validation over a buffer in memory (the fuzz target uses it).
 * The buffer must outlive the handle; tensor data is reached by pointer.
 */
/* rb_gguf_open of the file open at fd (read from offset 0, the whole
 * file): the handle keeps a duplicate of fd (closed by rb_gguf_close); the
 * caller keeps fd and may close it at once. name: the file in messages. */
rb_status rb_gguf_open_fd(int fd, const char *name, int flags, const rb_os *os,
                          rb_gguf **out, rb_error *err);
rb_status rb_gguf_open_memory(const void *data, uint64_t size, rb_gguf **out,
                              rb_error *err);

void rb_gguf_close(rb_gguf *g);

uint32_t rb_gguf_version(const rb_gguf *g);
uint64_t rb_gguf_file_size(const rb_gguf *g);
uint32_t rb_gguf_alignment(const rb_gguf *g);
uint64_t rb_gguf_data_offset(const rb_gguf *g);
uint64_t rb_gguf_header_bytes(const rb_gguf *g); /* bytes before data_offset */

uint64_t rb_gguf_n_kv(const rb_gguf *g);
const rb_gguf_kv *rb_gguf_kv_at(const rb_gguf *g, uint64_t i);
/* The kv with this key, or NULL. */
const rb_gguf_kv *rb_gguf_find_kv(const rb_gguf *g, const char *key);

uint64_t rb_gguf_n_tensors(const rb_gguf *g);
const rb_gguf_tensor *rb_gguf_tensor_at(const rb_gguf *g, uint64_t i);
/* The tensor with this name, or NULL (binary search over sorted names). */
const rb_gguf_tensor *rb_gguf_find_tensor(const rb_gguf *g, const char *name);

/*
 * Element i of an array (validated at open). For fixed-size elements this
 * is O(1); strings of a top-level array are O(1) through the index; nested
 * arrays walk. Returns RB_E_INVALID_ARG when i >= a->n.
 */
rb_status rb_gguf_array_get(const rb_gguf_array *a, uint64_t i,
                            rb_gguf_value *out);

/*
 * Typed getters for scalar metadata: RB_OK; RB_E_NOT_FOUND when absent;
 * RB_E_FORMAT when present with a type that does not convert (integers
 * convert between widths when the value fits; floats from F32/F64).
 */
rb_status rb_gguf_get_u32(const rb_gguf *g, const char *key, uint32_t *out);
rb_status rb_gguf_get_u64(const rb_gguf *g, const char *key, uint64_t *out);
rb_status rb_gguf_get_f32(const rb_gguf *g, const char *key, float *out);
rb_status rb_gguf_get_bool(const rb_gguf *g, const char *key, int *out);
rb_status rb_gguf_get_str(const rb_gguf *g, const char *key, rb_gguf_str *out);
/* An array kv, optionally of one element type (pass UINT32_MAX for any). */
rb_status rb_gguf_get_array(const rb_gguf *g, const char *key,
                            uint32_t elem_type, rb_gguf_array *out);

/* 1 when s equals the C string c. */
int rb_gguf_str_eq(rb_gguf_str s, const char *c);

/* Name of a metadata value type ("u32", "array"), "?" when unknown. */
const char *rb_gguf_type_name(uint32_t type);

/*
 * Reads len bytes of tensor t starting at byte off within it into dst.
 * Errors: RB_E_INVALID_ARG (range outside the tensor), RB_E_IO,
 * RB_E_SHORT_READ (the file shrank since open). The message is in err.
 */
rb_status rb_gguf_read(const rb_gguf *g, const rb_gguf_tensor *t, uint64_t off,
                       void *dst, uint64_t len, rb_error *err);

/* Pointer to tensor data when opened with RB_GGUF_MMAP or from memory;
 * NULL otherwise. Valid until rb_gguf_close. */
const void *rb_gguf_tensor_data(const rb_gguf *g, const rb_gguf_tensor *t);

#endif /* RB_GGUF_H */
