/*
 * convert.c - rows -> quantizer -> writer, in parallel chunks; and the
 * quantize command (contract in convert.h).
 *
 * Threads: a chunk is split into n_threads contiguous row ranges; each
 * worker owns a float scratch for its range and quantizes into its slice of
 * the chunk's output buffer; the main thread joins and writes the chunk.
 * Fork-join per chunk costs ~50 us of thread creation against ~10 ms of
 * work per 8 MiB chunk, so no persistent pool is needed here.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "status.h"

#define CHUNK_FLOATS (2u << 20) /* 8 MiB of floats per chunk */
#define MAX_THREADS 64

typedef struct chunk_job {
    rb_row_source_fn source;
    void *ctx;
    rb_quantize_row_fn quantize;
    uint64_t row_len, row_bytes;
    uint64_t row0, n_rows;
    uint8_t *out;          /* this job's slice of the chunk output */
    float *scratch;
    rb_status status;
    rb_error err;
} chunk_job;

static void *run_job(void *arg)
{
    chunk_job *j = arg;
    j->status = j->source(j->ctx, j->row0, j->n_rows, j->row_len, j->scratch, &j->err);
    if (j->status != RB_OK)
        return NULL;
    for (uint64_t r = 0; r < j->n_rows; r++)
        j->quantize(j->scratch + r * j->row_len, j->out + r * j->row_bytes,
                    (int64_t)j->row_len);
    return NULL;
}

rb_status rb_convert_tensor(rb_gguf_writer *w, uint32_t type, uint64_t row_len,
                            uint64_t n_rows, rb_row_source_fn source, void *ctx,
                            int n_threads, rb_convert_hooks *hooks, rb_error *err)
{
    const rb_type_traits *tt = rb_type_get_traits(type);
    uint64_t row_bytes = rb_type_row_bytes(type, row_len);
    if (!tt || !tt->quantize_row || row_bytes == 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "convert: cannot write %" PRIu64 "-element rows as %s",
                            row_len, rb_type_name(type));
    if (n_threads < 1)
        n_threads = 1;
    if (n_threads > MAX_THREADS)
        n_threads = MAX_THREADS;
    uint64_t chunk_rows = CHUNK_FLOATS / row_len;
    if (chunk_rows == 0)
        chunk_rows = 1;
    if (chunk_rows > n_rows)
        chunk_rows = n_rows;
    uint8_t *out = malloc(chunk_rows * row_bytes);
    float *scratch = malloc(chunk_rows * row_len * sizeof(float));
    rb_status st = RB_OK;
    if (!out || !scratch) {
        st = rb_error_set(err, RB_E_NOMEM, "convert: out of memory for a %" PRIu64
                          "-row chunk", chunk_rows);
        goto done;
    }
    for (uint64_t row0 = 0; row0 < n_rows; row0 += chunk_rows) {
        uint64_t n = n_rows - row0 < chunk_rows ? n_rows - row0 : chunk_rows;
        int nt = (uint64_t)n_threads < n ? n_threads : (int)n;
        chunk_job jobs[MAX_THREADS];
        pthread_t tids[MAX_THREADS];
        int started[MAX_THREADS] = {0};
        uint64_t per = (n + (uint64_t)nt - 1) / (uint64_t)nt, r = 0;
        for (int i = 0; i < nt; i++) {
            uint64_t k = n - r < per ? n - r : per;
            jobs[i] = (chunk_job){source, ctx, tt->quantize_row, row_len, row_bytes,
                                  row0 + r, k, out + r * row_bytes,
                                  scratch + r * row_len, RB_OK, {0}};
            r += k;
        }
        for (int i = 1; i < nt; i++)
            started[i] = pthread_create(&tids[i], NULL, run_job, &jobs[i]) == 0;
        run_job(&jobs[0]);
        for (int i = 1; i < nt; i++) {
            if (started[i])
                pthread_join(tids[i], NULL);
            else
                run_job(&jobs[i]); /* no thread to be had: do it here */
        }
        for (int i = 0; i < nt; i++)
            if (jobs[i].status != RB_OK) {
                if (err)
                    *err = jobs[i].err;
                st = jobs[i].status;
                goto done;
            }
        if ((st = rb_gguf_writer_write(w, out, n * row_bytes)) != RB_OK) {
            rb_error_set(err, st, "%s", rb_gguf_writer_errmsg(w));
            goto done;
        }
        if (hooks) {
            hooks->done_bytes += n * row_bytes;
            if (hooks->progress)
                hooks->progress(hooks->ctx, hooks->done_bytes, hooks->total_bytes);
        }
    }
done:
    free(out);
    free(scratch);
    return st;
}

/* ---- rebound quantize ---------------------------------------------------- */

typedef struct file_source {
    const rb_gguf *g;
    const rb_gguf_tensor *t;
    rb_dequantize_row_fn dequantize;
    uint64_t src_row_bytes;
} file_source;

static rb_status read_rows(void *ctx, uint64_t row0, uint64_t n_rows,
                           uint64_t row_len, float *dst, rb_error *err)
{
    const file_source *s = ctx;
    uint64_t n = n_rows * s->src_row_bytes;
    uint8_t *raw = malloc(n ? n : 1);
    if (!raw)
        return rb_error_set(err, RB_E_NOMEM, "quantize: out of memory reading '%s'",
                            s->t->name);
    rb_status st = rb_gguf_read(s->g, s->t, row0 * s->src_row_bytes, raw, n, err);
    for (uint64_t r = 0; st == RB_OK && r < n_rows; r++)
        s->dequantize(raw + r * s->src_row_bytes, dst + r * row_len, (int64_t)row_len);
    free(raw);
    return st;
}

static void note(rb_convert_hooks *hooks, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));


static void note(rb_convert_hooks *hooks, const char *fmt, ...)
{
    if (!hooks || !hooks->note)
        return;
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    hooks->note(hooks->ctx, msg);
}

uint32_t rb_convert_declare(rb_gguf_writer *w, const rb_file_kind *kind, const char *name,
                            uint32_t n_dims, const uint64_t *dims, uint32_t n_layers,
                            int has_output, rb_convert_hooks *hooks)
{
    rb_tensor_type_choice c = rb_quant_rules_choose(kind, name, n_dims, dims, n_layers,
                                                    has_output);
    if (c.is_fallback)
        note(hooks, "%s: row length %" PRIu64 " is not a multiple of %s's block: "
             "written as %s", name, dims[0], rb_type_name(c.wanted), rb_type_name(c.type));
    rb_gguf_writer_add_tensor(w, name, c.type, n_dims, dims);
    if (hooks) {
        uint64_t rows = 1;
        for (uint32_t d = 1; d < n_dims; d++)
            rows *= dims[d];
        hooks->total_bytes += rb_type_row_bytes(c.type, dims[0]) * rows;
    }
    return c.type;
}

rb_status rb_quantize_file(const char *in_path, const char *out_path,
                           const rb_file_kind *kind, int n_threads,
                           rb_convert_hooks *hooks, rb_error *err)
{
    rb_gguf *g = NULL;
    rb_gguf_writer *w = NULL;
    rb_hparams hp;
    rb_status st = rb_gguf_open(in_path, 0, NULL, &g, err);
    if (st != RB_OK)
        return st;
    if ((st = rb_hparams_read(g, &hp, err)) != RB_OK)
        goto done;
    uint64_t n_tensors = rb_gguf_n_tensors(g);
    for (uint64_t i = 0; i < n_tensors; i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        if (t->type != RB_TYPE_F32 && t->type != RB_TYPE_F16 && t->type != RB_TYPE_BF16) {
            st = rb_error_set(err, RB_E_UNSUPPORTED,
                "quantize: '%s': tensor '%s' is already %s; give an F32, F16 or BF16 "
                "model (requantizing loses accuracy)", in_path, t->name,
                rb_type_name(t->type));
            goto done;
        }
    }
    if ((st = rb_gguf_writer_create(out_path, rb_gguf_alignment(g), NULL, &w, err)) != RB_OK)
        goto done;
    for (uint64_t i = 0; i < rb_gguf_n_kv(g); i++) {
        const rb_gguf_kv *kv = rb_gguf_kv_at(g, i);
        if (strcmp(kv->key, "general.alignment") == 0)
            continue; /* the writer writes it from its own setting */
        rb_gguf_writer_set_raw(w, kv->key, kv->raw, kv->raw_len);
    }
    rb_gguf_writer_set_u32(w, "general.file_type", kind->ftype);
    if (rb_type_get_traits(kind->base_type)->is_quantized)
        rb_gguf_writer_set_u32(w, "general.quantization_version", 2);
    else
        rb_gguf_writer_remove(w, "general.quantization_version");
    int has_output = rb_gguf_find_tensor(g, "output.weight") != NULL;
    uint32_t *types = calloc(n_tensors ? n_tensors : 1, sizeof *types);
    if (!types) {
        st = rb_error_set(err, RB_E_NOMEM, "quantize: out of memory");
        goto done;
    }
    if (hooks)
        hooks->total_bytes = hooks->done_bytes = 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        types[i] = rb_convert_declare(w, kind, t->name, t->n_dims, t->dims, hp.n_layers,
                                      has_output, hooks);
    }
    if ((st = rb_gguf_writer_begin_data(w)) != RB_OK) {
        rb_error_set(err, st, "%s", rb_gguf_writer_errmsg(w));
        free(types);
        goto done;
    }
    for (uint64_t i = 0; st == RB_OK && i < n_tensors; i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        file_source src = {g, t, rb_type_get_traits(t->type)->dequantize_row,
                           rb_type_row_bytes(t->type, t->dims[0])};
        st = rb_convert_tensor(w, types[i], t->dims[0], t->n_elems / t->dims[0],
                               read_rows, &src, n_threads, hooks, err);
    }
    free(types);
    if (st == RB_OK && (st = rb_gguf_writer_finish(w)) != RB_OK)
        rb_error_set(err, st, "%s", rb_gguf_writer_errmsg(w));
done:
    rb_gguf_writer_destroy(w);
    rb_gguf_close(g);
    return st;
}
