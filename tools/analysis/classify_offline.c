/*
 * classify_offline.c - the offline labelling and the `rebound classify`
 * report (classify_offline.h).
 *
 * Offline: two passes over the stream, counters per key (accesses, and
 * re-reads with a sequential neighbour), then one label per key.
 * Memory: two u32 counters per key and a bitmap for the per-token loop
 * length, freed before returning. Nothing global.
 */
#include <stdlib.h>
#include <string.h>

#include "classify_offline.h"
#include "status.h"

rb_status rb_classify_offline(const rb_block_stream *s, uint8_t *cls, rb_error *err)
{
    uint32_t *n_acc = calloc(s->n_keys ? s->n_keys : 1, sizeof *n_acc);
    uint32_t *n_seq = calloc(s->n_keys ? s->n_keys : 1, sizeof *n_seq);
    if (!n_acc || !n_seq) {
        free(n_acc);
        free(n_seq);
        return rb_error_set(err, RB_E_NOMEM, "classify: out of memory");
    }
    for (size_t i = 0; i < s->n; i++) {
        uint32_t k = s->key[i];
        int seq = (i > 0 && s->key[i - 1] + 1 == k) || (i + 1 < s->n && s->key[i + 1] == k + 1);
        if (n_acc[k] < UINT32_MAX) {
            /* only re-reads vote: a hot block's first read is often the
               load scan's, which is sequential */
            if (n_acc[k] > 0)
                n_seq[k] += (uint32_t)seq;
            n_acc[k]++;
        }
    }
    for (uint32_t k = 0; k < s->n_keys; k++) {
        if (n_acc[k] == 0)
            cls[k] = RB_CLASS_NONE;
        else if (n_acc[k] == 1)
            cls[k] = RB_CLASS_SEQ;
        else
            cls[k] = 2ull * n_seq[k] >= n_acc[k] - 1 ? RB_CLASS_LOOP : RB_CLASS_HOT;
    }
    free(n_acc);
    free(n_seq);
    return RB_OK;
}

void rb_classify_report_free(rb_classify_report *r)
{
    free(r->file_bytes);
    free(r->cls);
    memset(r, 0, sizeof *r);
}

rb_status rb_classify_run(const rb_block_stream *s, rb_classify_report *out, rb_error *err)
{
    rb_classify_report r;
    memset(&r, 0, sizeof r);
    const uint64_t B = RB_TRACE_BLOCK;
    r.n_files = s->n_files;
    r.cls = malloc(s->n_keys ? s->n_keys : 1);
    r.file_bytes = calloc(s->n_files + 1, sizeof *r.file_bytes);
    uint32_t *seen = calloc(s->n_keys ? s->n_keys : 1, sizeof *seen); /* span stamp + 1 */
    rb_classify_online on;
    memset(&on, 0, sizeof on);
    rb_status st = RB_OK;
    if (!r.cls || !r.file_bytes || !seen) {
        st = rb_error_set(err, RB_E_NOMEM, "classify: out of memory");
        goto done;
    }
    if ((st = rb_classify_offline(s, r.cls, err)) != RB_OK ||
        (st = rb_classify_online_init(&on, s->n_keys, err)) != RB_OK)
        goto done;
    for (size_t i = 0; i < s->n; i++) {
        int c = rb_classify_online_access(&on, s->key[i]);
        if (c == RB_CLASS_NONE) {
            st = rb_error_set(err, RB_E_NOMEM, "classify: out of memory for runs");
            goto done;
        }
        r.online_accesses[c]++;
    }
    for (uint32_t k = 0; k < s->n_keys; k++) {
        if (r.cls[k] == RB_CLASS_NONE)
            continue;
        r.offline_bytes[r.cls[k]] += B;
        r.online_bytes[rb_classify_online_class(&on, k)] += B;
        uint32_t f = rb_block_stream_file(s, k);
        if (f < s->n_files)
            r.file_bytes[f][r.cls[k]] += B;
    }
    r.loop_bytes = r.offline_bytes[RB_CLASS_LOOP];
    /* loop length per token: distinct LOOP blocks in each span */
    r.loop_min = UINT64_MAX;
    double sum = 0;
    for (size_t t = 0; t < s->n_tok; t++) {
        uint64_t n = 0;
        for (size_t i = s->tok_start[t]; i < s->tok_start[t + 1]; i++) {
            uint32_t k = s->key[i];
            if (r.cls[k] == RB_CLASS_LOOP && seen[k] != (uint32_t)t + 1) {
                seen[k] = (uint32_t)t + 1;
                n++;
            }
        }
        n *= B;
        r.loop_min = n < r.loop_min ? n : r.loop_min;
        r.loop_max = n > r.loop_max ? n : r.loop_max;
        sum += (double)n;
    }
    r.n_tokens = s->n_tok;
    if (s->n_tok == 0)
        r.loop_min = r.loop_max = r.loop_bytes, r.loop_mean = (double)r.loop_bytes;
    else
        r.loop_mean = sum / (double)s->n_tok;
done:
    free(seen);
    rb_classify_online_deinit(&on);
    if (st != RB_OK) {
        rb_classify_report_free(&r);
        return st;
    }
    *out = r;
    return RB_OK;
}
