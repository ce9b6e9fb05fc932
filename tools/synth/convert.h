/*
 * convert.h - streaming float rows through a quantizer into a GGUF writer,
 * and `rebound quantize` built on it.
 *
 * Both `rebound make-model` (rows from a generator) and `rebound quantize`
 * (rows dequantized from another file) produce tensors the same way: a
 * chunk of rows at a time (at most ~8 MiB of floats), split across worker
 * threads that each produce and quantize their rows, then written in order.
 * Output is byte-identical for any thread count: each row depends only on
 * its own index.
 */
#ifndef RB_CONVERT_H
#define RB_CONVERT_H

#include <stdint.h>

#include "gguf_write.h"
#include "quant_rules.h"
#include "rebound.h"

/*
 * Fills dst with rows [row0, row0 + n_rows) of a tensor, row_len floats
 * each. Called from several threads at once for disjoint rows.
 */
typedef rb_status (*rb_row_source_fn)(void *ctx, uint64_t row0, uint64_t n_rows,
                                      uint64_t row_len, float *dst, rb_error *err);

/* Progress and notes for a long conversion; any field may be NULL. */
typedef struct rb_convert_hooks {
    void (*progress)(void *ctx, uint64_t done_bytes, uint64_t total_bytes);
    void (*note)(void *ctx, const char *message); /* e.g. a type fallback */
    void *ctx;
    uint64_t total_bytes;  /* of the whole file, for progress */
    uint64_t done_bytes;   /* running count, updated by rb_convert_tensor */
} rb_convert_hooks;

/*
 * Writes one tensor's data: n_rows rows of row_len elements as `type`
 * (which must have a quantizer). The writer must be expecting this tensor.
 */
rb_status rb_convert_tensor(rb_gguf_writer *w, uint32_t type, uint64_t row_len,
                            uint64_t n_rows, rb_row_source_fn source, void *ctx,
                            int n_threads, rb_convert_hooks *hooks, rb_error *err);

/*
 * Declares one tensor of a file of `kind` in w: picks its type with
 * llama-quantize's rules (quant_rules.h), reports a fallback through
 * hooks->note, adds it to the writer and to hooks->total_bytes (when hooks
 * is not NULL). Returns the type its data must be written as. Used by
 * make-model and quantize, so both print and count the same way.
 */
uint32_t rb_convert_declare(rb_gguf_writer *w, const rb_file_kind *kind, const char *name,
                            uint32_t n_dims, const uint64_t *dims, uint32_t n_layers,
                            int has_output, rb_convert_hooks *hooks);

/*
 * `rebound quantize`: reads an F32/F16/BF16 GGUF model and writes it as
 * `kind` with llama-quantize's per-tensor rules; metadata is copied
 * verbatim except general.file_type and general.quantization_version.
 * Errors: those of the reader and writer; RB_E_UNSUPPORTED when the input
 * holds tensors already quantized (requantizing loses accuracy).
 */
rb_status rb_quantize_file(const char *in_path, const char *out_path,
                           const rb_file_kind *kind, int n_threads,
                           rb_convert_hooks *hooks, rb_error *err);

#endif /* RB_CONVERT_H */
