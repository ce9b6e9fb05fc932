/*
 * status.c - the library's version, names of rb_status values, and the one
 * formatting helper that every module uses to leave a message in an
 * rb_error.
 */
#include <stdarg.h>
#include <stdio.h>

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
