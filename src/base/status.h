/* status.h - internal helper to fill an rb_error. */
#ifndef RB_STATUS_H
#define RB_STATUS_H

#include "rebound.h"

/* Formats a message into err (when not NULL) and returns status, so that a
 * failure path reads `return rb_error_set(err, RB_E_FORMAT, "...", ...);`. */
rb_status rb_error_set(rb_error *err, rb_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A versioned params struct (rebound.h: its first member is size_t
 * struct_size, the sizeof the caller was compiled with). dst holds this
 * library's defaults, lib_size bytes; the caller's first min(struct_size,
 * lib_size) bytes are copied over them (a shorter, older struct keeps the
 * defaults of the fields it lacks) and dst's struct_size becomes lib_size.
 * RB_OK; RB_E_INVALID_ARG (struct_size below sizeof(size_t) or over
 * lib_size + 4096: not set by the _default_params / _params_init call); RB_E_UNSUPPORTED (a longer,
 * newer struct with a field this library does not know set non-zero).
 * what names the struct in the message ("rb_model_params"). */
rb_status rb_params_copy(void *dst, size_t lib_size, const void *src, const char *what,
                         rb_error *err);

/* Fills p (the caller's size bytes, size >= sizeof(size_t)) with the
 * defaults d of lib_size bytes: zero beyond lib_size; p's struct_size =
 * size. For the _params_init functions. */
void rb_params_init(void *p, size_t size, const void *d, size_t lib_size);

#endif
