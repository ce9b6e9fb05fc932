/*
 * classify_offline.h - offline block labels and the `rebound classify`
 * report, computed from a whole trace's block stream (trace.h). The class
 * rules are stated in classify.h, beside the online Algorithm 1 that the
 * runtime's weight streaming uses.
 */
#ifndef RB_CLASSIFY_OFFLINE_H
#define RB_CLASSIFY_OFFLINE_H

#include <stddef.h>
#include <stdint.h>

#include "classify.h"
#include "rebound.h"
#include "trace.h"

/* Offline labels of every key into cls[n_keys] (RB_CLASS_*). RB_E_NOMEM. */
rb_status rb_classify_offline(const rb_block_stream *s, uint8_t *cls, rb_error *err);

/* What `rebound classify` prints, computed from a stream. */
typedef struct rb_classify_report {
    /* distinct bytes per class (index RB_CLASS_*), offline and online (the
       class each block has at its last access) */
    uint64_t offline_bytes[4], online_bytes[4];
    /* accesses per class as Algorithm 1 labelled them at the time */
    uint64_t online_accesses[4];
    /* per file: distinct bytes per offline class; n_files entries */
    uint64_t (*file_bytes)[4];
    uint32_t n_files;
    /* loop length per token: distinct LOOP (offline) bytes each token span
       touches; min / mean / max over spans, and the number of spans */
    uint64_t loop_min, loop_max;
    double loop_mean;
    size_t n_tokens;
    uint64_t loop_bytes;   /* distinct LOOP bytes of the whole trace */
    uint8_t *cls;          /* [n_keys] offline labels, kept for callers */
} rb_classify_report;

rb_status rb_classify_run(const rb_block_stream *s, rb_classify_report *out, rb_error *err);
void rb_classify_report_free(rb_classify_report *r);

#endif
