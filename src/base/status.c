/*
 * status.c - the library's version, names of rb_status values, and the one
 * formatting helper that every module uses to leave a message in an
 * rb_error.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rebound.h"
#include "status.h"

const char *rb_version(void) { return REBOUND_VERSION_STRING; }

uint32_t rb_version_number(void)
{
    return (uint32_t)REBOUND_VERSION_MAJOR << 16 | (uint32_t)REBOUND_VERSION_MINOR << 8 |
           (uint32_t)REBOUND_VERSION_PATCH;
}

const char *rb_status_name(rb_status status)
{
    switch (status) {
    case RB_OK: return "RB_OK";
    case RB_E_INVALID_ARG: return "RB_E_INVALID_ARG";
    case RB_E_NOMEM: return "RB_E_NOMEM";
    case RB_E_IO: return "RB_E_IO";
    case RB_E_SHORT_READ: return "RB_E_SHORT_READ";
    case RB_E_FORMAT: return "RB_E_FORMAT";
    case RB_E_UNSUPPORTED: return "RB_E_UNSUPPORTED";
    case RB_E_NOT_FOUND: return "RB_E_NOT_FOUND";
    case RB_E_BUDGET: return "RB_E_BUDGET";
    case RB_E_BUSY: return "RB_E_BUSY";
    case RB_E_ABORTED: return "RB_E_ABORTED";
    }
    return "RB_E_UNKNOWN";
}

rb_status rb_error_set(rb_error *err, rb_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

rb_status rb_params_copy(void *dst, size_t lib_size, const void *src, const char *what,
                         rb_error *err)
{
    size_t n;
    memcpy(&n, src, sizeof n);
    /* a size far past this library's: not a newer header's (structs grow
       by a few fields), but an uninitialised one; never read that far */
    if (n < sizeof n || n > lib_size + 4096)
        return rb_error_set(err, RB_E_INVALID_ARG, "%s: struct_size is %zu: initialise the "
                            "struct with its _default_params() (or _params_init) call first",
                            what, n);
    for (size_t i = lib_size; i < n; i++)
        if (((const unsigned char *)src)[i])
            return rb_error_set(err, RB_E_UNSUPPORTED, "%s: a field at byte %zu is set, which "
                                "this library (%s, %zu bytes) does not know: a newer header than "
                                "the library", what, i, REBOUND_VERSION_STRING, lib_size);
    memcpy(dst, src, n < lib_size ? n : lib_size);
    memcpy(dst, &lib_size, sizeof lib_size);
    return RB_OK;
}

void rb_params_init(void *p, size_t size, const void *d, size_t lib_size)
{
    if (!p || size < sizeof size)
        return;
    memcpy(p, d, size < lib_size ? size : lib_size);
    if (size > lib_size)
        memset((char *)p + lib_size, 0, size - lib_size);
    memcpy(p, &size, sizeof size);
}
