/*
 * trace_strace.h - import `strace -f -tt -e trace=openat,read,pread64,lseek,
 * mmap,close` output of any program into an rb_trace (trace.h).
 */
#ifndef RB_TRACE_STRACE_H
#define RB_TRACE_STRACE_H

#include "trace.h"

typedef struct rb_strace_stats {
    uint64_t n_opens, n_reads, n_preads, n_lseeks, n_closes;
    uint64_t n_mmaps;        /* mmap calls of traced files: faults not visible */
    uint64_t n_ignored;      /* calls on descriptors not opened in the log, failed calls */
} rb_strace_stats;

/*
 * Reads the log at path and appends one record per successful read/pread64
 * on a file opened in the log (phase "other", token -1; time relative to
 * the first timestamp). only: when not NULL, keep only files whose path
 * contains it. Malformed lines go to diag with their line numbers and are
 * skipped; RB_E_FORMAT only when no line parses as a system call or no read
 * remains. RB_E_IO, RB_E_NOMEM. *out must be initialized (rb_trace_init).
 */
rb_status rb_trace_import_strace(const char *path, const char *only, rb_trace *out,
                                 rb_trace_diag *diag, rb_strace_stats *stats, rb_error *err);

#endif
