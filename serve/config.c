/*
 * config.c - serve's log line, clock and namespace names (config.h). No state: a line is
 * formatted into a local buffer and written with one fputs, which stdio
 * locks, so that concurrent lines never interleave.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "config.h"

void sv_log(const char *fmt, ...)
{
    char line[1024];
    int n = snprintf(line, sizeof line, "rebound serve: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = 0;
    while (line[len])
        len++;
    line[len] = '\n';
    line[len + 1] = 0;
    fputs(line, stderr);
}

double sv_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int sv_ns_is_valid(const char *ns)
{
    size_t n = 0;
    for (; ns[n]; n++) {
        char ch = ns[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_') || n >= SV_NS_MAX)
            return 0;
    }
    return 1;
}

int sv_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -1;
    *p = q, *cap = c;
    return 0;
}
