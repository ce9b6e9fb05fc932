/*
 * trace.h - block-level traces of model-file I/O: the record format, a
 * writer that a running rebound feeds, a reader, and the expansion of a
 * trace into a stream of 4 KiB block accesses for classify.c and sim.c.
 *
 * The trace file (text, one record per line, '#' starts a comment line):
 *
 *   # rebound-trace 1                      first line, required
 *   # block-bytes 4096                     granularity the analysis uses
 *   # note <free text>                     any number of notes
 *   F <file> <size> <path>                 declares file id <file> (0, 1, ...)
 *                                          of <size> bytes (0: unknown); the
 *                                          path runs to the end of the line
 *   A <t_ns> <file> <offset> <length> <token> <phase>
 *                                          one access: <length> bytes at
 *                                          <offset> of file <file>, <t_ns>
 *                                          nanoseconds after the trace began,
 *                                          during token <token> (-1: none)
 *                                          and phase load|prefill|decode|other
 *
 * Example:
 *   # rebound-trace 1
 *   # block-bytes 4096
 *   F 0 640156896 /tmp/tl.gguf
 *   A 0 0 0 6803712 -1 load
 *   A 1200 0 6803712 47104000 -1 load
 *   A 905000000 0 6803712 1152 0 prefill
 *
 * What a trace of rebound itself holds (rb_trace_writer_attach_model):
 *   - the header read at open, recorded when the trace is attached as the
 *     range [0, data offset): metadata, tokenizer, tensor index
 *     (rb_gguf_open in fact reads the first 1 MiB at once, so with a small
 *     header it reads the start of the tensor data twice; an strace of
 *     rebound shows that, this trace does not);
 *   - the load scan of rb_model_load_weights (pread mode: tensor by tensor);
 *   - for every batch of the forward pass, the logical access to each
 *     weight tensor's byte range in the file, in the order the pass uses
 *     them: the embedding rows of the batch's tokens, then per layer the
 *     norms, Q, K, V, O and FFN matrices, then the output norm and matrix.
 *     token = the batch's first position: a prefill batch of n tokens reads
 *     each matrix once, so it is one span; a decode step is its position.
 * rebound holds the weights in RAM after the load, so the per-token records
 * are what a weight cache or the page cache *would* see: mmap mode and the
 * in-RAM mode record the forward pass's logical accesses, not page faults.
 *
 * Threads: a writer is used by one thread at a time (the forward pass calls
 * it from the thread that runs the batch). A trace read into memory is
 * read-only afterwards.
 */
#ifndef RB_TRACE_H
#define RB_TRACE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rebound.h"

#define RB_TRACE_BLOCK 4096u
#define RB_TRACE_MAGIC "# rebound-trace 1"

typedef enum rb_trace_phase {
    RB_PHASE_LOAD = 0,
    RB_PHASE_PREFILL = 1,
    RB_PHASE_DECODE = 2,
    RB_PHASE_OTHER = 3,
} rb_trace_phase;

const char *rb_trace_phase_name(int phase);

typedef struct rb_trace_rec {
    uint64_t t_ns;
    uint64_t offset;
    uint64_t length;     /* > 0 */
    int64_t token;       /* -1: none */
    uint32_t file;       /* < n_files */
    uint32_t phase;      /* rb_trace_phase */
} rb_trace_rec;

typedef struct rb_trace_file {
    char *path;
    uint64_t size;       /* 0: unknown (the reader then uses the largest end seen) */
} rb_trace_file;

/* A trace in memory: files and records, both growable arrays it owns. */
typedef struct rb_trace {
    rb_trace_file *files;
    uint32_t n_files, cap_files;
    rb_trace_rec *recs;
    size_t n_recs, cap_recs;
} rb_trace;

/* Diagnostics of a lenient parse: the first few bad lines are kept verbatim
 * (with their line numbers) for the CLI to print; all are counted. */
#define RB_TRACE_DIAG_KEEP 8
typedef struct rb_trace_diag {
    uint64_t n_lines, n_parsed, n_bad;
    uint64_t bad_line[RB_TRACE_DIAG_KEEP];
    char bad_why[RB_TRACE_DIAG_KEEP][96];
} rb_trace_diag;

void rb_trace_init(rb_trace *t);
void rb_trace_free(rb_trace *t);
/* Adds a file, returns its id in *id. RB_E_NOMEM. */
rb_status rb_trace_add_file(rb_trace *t, const char *path, uint64_t size, uint32_t *id,
                            rb_error *err);
/* Appends a record (file must exist, length > 0). RB_E_NOMEM, RB_E_INVALID_ARG. */
rb_status rb_trace_add(rb_trace *t, const rb_trace_rec *r, rb_error *err);
/* Records a diagnostic line into diag (counts it, keeps the first few). */
void rb_trace_diag_bad(rb_trace_diag *d, uint64_t line, const char *why);

/* Writes t in the format above. RB_E_IO names the path. */
rb_status rb_trace_write(const rb_trace *t, const char *path, const char *note, rb_error *err);

/*
 * Reads a trace file. Malformed lines are counted in *diag (with line
 * numbers) and skipped; the read fails (RB_E_FORMAT) only when no record
 * parses, or when the first line is not the magic. RB_E_IO, RB_E_NOMEM.
 * On failure *out is left empty.
 */
rb_status rb_trace_read(const char *path, rb_trace *out, rb_trace_diag *diag, rb_error *err);

/* ---- the live writer ------------------------------------------------------ */

typedef struct rb_trace_writer rb_trace_writer;
struct rb_gguf;

/* Opens path for writing and writes the header. RB_E_IO, RB_E_NOMEM. */
rb_status rb_trace_writer_open(const char *path, rb_trace_writer **out, rb_error *err);
/* Flushes and closes; RB_E_IO if any write failed. NULL is a no-op. */
rb_status rb_trace_writer_close(rb_trace_writer *w, rb_error *err);
/* Declares a file (writes its F line); returns its id. */
uint32_t rb_trace_writer_file(rb_trace_writer *w, const char *path, uint64_t size);
/* Phase and token that following accesses are tagged with. */
void rb_trace_writer_phase(rb_trace_writer *w, rb_trace_phase phase, int64_t token);
/* One access of length bytes at offset of file, stamped with the time now. */
void rb_trace_writer_access(rb_trace_writer *w, uint32_t file, uint64_t offset, uint64_t length);

/*
 * The forward pass's view: binds the writer to a GGUF file (id from
 * rb_trace_writer_file) and looks up, per layer, the byte ranges of the
 * tensors a llama-family pass reads, in the order it reads them. Then
 * begin (embedding rows of the batch's tokens; phase prefill when n > 1 or
 * at position 0, else decode), layer(l), end (output norm and matrix).
 * RB_E_NOMEM.
 */
rb_status rb_trace_writer_bind_model(rb_trace_writer *w, uint32_t file, const struct rb_gguf *g,
                                     rb_error *err);
void rb_trace_forward_begin(rb_trace_writer *w, const int32_t *tokens, uint32_t n, uint32_t pos0);
void rb_trace_forward_layer(rb_trace_writer *w, uint32_t layer);
void rb_trace_forward_end(rb_trace_writer *w);

/*
 * Attaches the writer to a model as its observer (model.h): declares the
 * model's file (path as given), binds it, records the header read that
 * rb_model_open already made; from then on the model's weight loads and
 * the forward passes of sessions created after this call are recorded.
 * The writer must outlive the model's sessions; rb_model_set_observer(m,
 * NULL) detaches. Errors (RB_E_NOMEM) go to the model's message slot.
 */
struct rb_model;
rb_status rb_trace_writer_attach_model(rb_trace_writer *w, struct rb_model *m, const char *path);

/* ---- block streams ---------------------------------------------------------- */

/*
 * A trace expanded to 4 KiB block accesses, the input of classify and sim.
 * Keys are dense: file f's block b is key file_base[f] + b, and one unused
 * key separates consecutive files, so "block B-1" never crosses a file.
 */
typedef struct rb_block_stream {
    uint32_t *key;          /* [n] block key of each access */
    uint8_t *phase;         /* [n] phase of each access */
    size_t n;
    uint32_t n_keys;        /* keys are < n_keys */
    uint32_t n_files;
    uint32_t *file_base;    /* [n_files + 1]: file f's keys are [base[f], base[f+1] - 1) */
    /* token spans: accesses of token i are [tok_start[i], tok_start[i + 1]) */
    size_t *tok_start;      /* [n_tok + 1] */
    int64_t *tok_id;        /* [n_tok] the token index of the records */
    uint8_t *tok_phase;     /* [n_tok] */
    size_t n_tok;
} rb_block_stream;

/*
 * Expands t: each record covers blocks offset/4096 .. (offset+length-1)/4096.
 * A new token span starts whenever a record's (token, phase) differs from
 * the previous record's and token >= 0. Errors: RB_E_NOMEM, RB_E_BUDGET
 * (more than 2^32 - 2 distinct blocks or 2^40 accesses).
 */
rb_status rb_block_stream_build(const rb_trace *t, rb_block_stream *out, rb_error *err);
void rb_block_stream_free(rb_block_stream *s);
/* File of key k (n_files when k is a separator key). */
uint32_t rb_block_stream_file(const rb_block_stream *s, uint32_t key);

#endif /* RB_TRACE_H */

/* ---- synthetic traces --------------------------------------------------------- */

/*
 * A model app's I/O, made up: file 0 "synthetic-model.bin" of hot_bytes of
 * metadata/index followed by loop_bytes of weights, file 1
 * "synthetic-tokenizer.bin" of hot_bytes. Load: both files scanned in
 * 1 MiB reads. Then per token (decode, token 0..n_tokens-1): 4 random 4 KiB
 * reads of the tokenizer and 2 of the model's index (the hot set), then the
 * weights in file order in 1 MiB reads (the loop). Deterministic in seed.
 * Appends to t (initialized). RB_E_NOMEM, RB_E_INVALID_ARG (sizes 0).
 */
rb_status rb_trace_synth(rb_trace *t, uint64_t loop_bytes, uint64_t hot_bytes, uint32_t n_tokens,
                         uint64_t seed, rb_error *err);
