/*
 * gguf_write.h - writer of GGUF v3 files (the layout is drawn in gguf.h).
 *
 * Use: create; set metadata and declare tensors (any order, any number of
 * calls); begin_data writes the header and index; then write every
 * tensor's bytes in declaration order (in as many pieces as convenient:
 * padding between tensors is inserted by the writer); finish. The file is
 * written to "<path>.tmp" and renamed over path by finish, so a crash or a
 * failure never leaves a half-written file under the final name.
 *
 * Errors are sticky: after a failure every call returns the same status and
 * rb_gguf_writer_errmsg says what happened (a full disk is RB_E_IO with
 * "No space left on device"). destroy without finish removes the .tmp file.
 *
 * Memory: metadata values are copied into the writer (token arrays of a
 * 150k vocabulary are a few MiB); tensor data is streamed through a 1 MiB
 * buffer, never held whole.
 */
#ifndef RB_GGUF_WRITE_H
#define RB_GGUF_WRITE_H

#include <stdint.h>

#include "gguf.h"
#include "os.h"
#include "rebound.h"

typedef struct rb_gguf_writer rb_gguf_writer;

/* alignment: 0 for the default 32; others are written as general.alignment. */
rb_status rb_gguf_writer_create(const char *path, uint32_t alignment,
                                const rb_os *os, rb_gguf_writer **out,
                                rb_error *err);
void rb_gguf_writer_destroy(rb_gguf_writer *w);
const char *rb_gguf_writer_errmsg(const rb_gguf_writer *w);

/* Metadata. Setting a key twice replaces the value in place (keeps its
 * position). Keys must be non-empty C strings. */
rb_status rb_gguf_writer_set_u32(rb_gguf_writer *w, const char *key, uint32_t v);
rb_status rb_gguf_writer_set_i32(rb_gguf_writer *w, const char *key, int32_t v);
rb_status rb_gguf_writer_set_u64(rb_gguf_writer *w, const char *key, uint64_t v);
rb_status rb_gguf_writer_set_f32(rb_gguf_writer *w, const char *key, float v);
rb_status rb_gguf_writer_set_bool(rb_gguf_writer *w, const char *key, int v);
rb_status rb_gguf_writer_set_str(rb_gguf_writer *w, const char *key, const char *s);
/* An array of fixed-size scalars (elem_type not STRING/ARRAY), n elements
 * stored little-endian at elems. */
rb_status rb_gguf_writer_set_array(rb_gguf_writer *w, const char *key,
                                   uint32_t elem_type, uint64_t n, const void *elems);
rb_status rb_gguf_writer_set_str_array(rb_gguf_writer *w, const char *key,
                                       uint64_t n, const char *const *strs);
/* A value copied verbatim from a reader (type u32 + encoded value). */
rb_status rb_gguf_writer_set_raw(rb_gguf_writer *w, const char *key,
                                 const uint8_t *raw, uint64_t raw_len);
/* Removes a key if present. */
void rb_gguf_writer_remove(rb_gguf_writer *w, const char *key);

/* Declares a tensor: dims[0] is the row length; it must be a multiple of
 * the type's block. Names must be unique and at most 63 bytes. */
rb_status rb_gguf_writer_add_tensor(rb_gguf_writer *w, const char *name,
                                    uint32_t type, uint32_t n_dims,
                                    const uint64_t *dims);

/* Writes header, metadata and the tensor index; then data may follow. */
rb_status rb_gguf_writer_begin_data(rb_gguf_writer *w);

/* Appends n bytes of tensor data (the current tensor's, then the next's). */
rb_status rb_gguf_writer_write(rb_gguf_writer *w, const void *data, uint64_t n);

/* Index of the tensor whose bytes are expected next; n_tensors when done. */
uint64_t rb_gguf_writer_next_tensor(const rb_gguf_writer *w);

/* Checks that every tensor got all its bytes, flushes, fsyncs, renames. */
rb_status rb_gguf_writer_finish(rb_gguf_writer *w);

/* Bytes of the finished file (valid after finish). */
uint64_t rb_gguf_writer_file_bytes(const rb_gguf_writer *w);

#endif /* RB_GGUF_WRITE_H */
