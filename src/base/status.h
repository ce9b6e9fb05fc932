/* status.h - internal helper to fill an rb_error. */
#ifndef RB_STATUS_H
#define RB_STATUS_H

#include "rebound.h"

/* Formats a message into err (when not NULL) and returns status, so that a
 * failure path reads `return rb_error_set(err, RB_E_FORMAT, "...", ...);`. */
rb_status rb_error_set(rb_error *err, rb_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
