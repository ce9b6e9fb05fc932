/*
 * trace.c - trace records in memory, the text format (trace.h), the live
 * writer a running rebound feeds, and the expansion to block streams.
 *
 * Does: parse leniently (a bad line is counted with its number and
 * skipped), write, record a forward pass's tensor ranges, expand records to
 * 4 KiB block keys. Does not: analyse (classify.c), replay (sim.c), or read
 * strace logs (trace_strace.c).
 *
 * Memory: rb_trace owns two growable arrays (files, records; doubled on
 * demand) and one strdup'd path per file. The writer owns a stdio stream
 * and, once bound to a model, one array of tensor ranges (about 12 per
 * layer) with a per-layer index into it. A block stream owns its arrays,
 * sized from one counting pass over the records.
 *
 * Invariants: every record's file < n_files and length > 0; stream keys
 * < n_keys; tok_start is non-decreasing and ends at n.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "model.h"
#include "status.h"
#include "trace.h"

static const char *phase_names[] = {"load", "prefill", "decode", "other"};

const char *rb_trace_phase_name(int phase)
{
    return phase >= 0 && phase < 4 ? phase_names[phase] : "other";
}

void rb_trace_init(rb_trace *t) { memset(t, 0, sizeof *t); }

void rb_trace_free(rb_trace *t)
{
    for (uint32_t i = 0; i < t->n_files; i++)
        free(t->files[i].path);
    free(t->files);
    free(t->recs);
    memset(t, 0, sizeof *t);
}

rb_status rb_trace_add_file(rb_trace *t, const char *path, uint64_t size, uint32_t *id,
                            rb_error *err)
{
    if (t->n_files == t->cap_files) {
        uint32_t cap = t->cap_files ? t->cap_files * 2 : 4;
        rb_trace_file *nf = realloc(t->files, cap * sizeof *nf);
        if (!nf)
            return rb_error_set(err, RB_E_NOMEM, "trace: out of memory");
        t->files = nf;
        t->cap_files = cap;
    }
    char *p = strdup(path ? path : "?");
    if (!p)
        return rb_error_set(err, RB_E_NOMEM, "trace: out of memory");
    t->files[t->n_files].path = p;
    t->files[t->n_files].size = size;
    *id = t->n_files++;
    return RB_OK;
}

rb_status rb_trace_add(rb_trace *t, const rb_trace_rec *r, rb_error *err)
{
    if (r->file >= t->n_files || r->length == 0 || r->offset + r->length < r->offset)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "trace: record of file %" PRIu32 " [%" PRIu64 ", +%" PRIu64
                            ") is not valid (%" PRIu32 " files)", r->file, r->offset,
                            r->length, t->n_files);
    if (t->n_recs == t->cap_recs) {
        size_t cap = t->cap_recs ? t->cap_recs * 2 : 1024;
        rb_trace_rec *nr = realloc(t->recs, cap * sizeof *nr);
        if (!nr)
            return rb_error_set(err, RB_E_NOMEM, "trace: out of memory for %zu records", cap);
        t->recs = nr;
        t->cap_recs = cap;
    }
    t->recs[t->n_recs++] = *r;
    return RB_OK;
}

void rb_trace_diag_bad(rb_trace_diag *d, uint64_t line, const char *why)
{
    if (!d)
        return;
    if (d->n_bad < RB_TRACE_DIAG_KEEP) {
        d->bad_line[d->n_bad] = line;
        snprintf(d->bad_why[d->n_bad], sizeof d->bad_why[0], "%s", why);
    }
    d->n_bad++;
}

rb_status rb_trace_write(const rb_trace *t, const char *path, const char *note, rb_error *err)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return rb_error_set(err, RB_E_IO, "trace: cannot create '%s': %s", path, strerror(errno));
    fprintf(f, "%s\n# block-bytes %u\n", RB_TRACE_MAGIC, RB_TRACE_BLOCK);
    if (note)
        fprintf(f, "# note %s\n", note);
    for (uint32_t i = 0; i < t->n_files; i++)
        fprintf(f, "F %" PRIu32 " %" PRIu64 " %s\n", i, t->files[i].size, t->files[i].path);
    for (size_t i = 0; i < t->n_recs; i++) {
        const rb_trace_rec *r = &t->recs[i];
        fprintf(f, "A %" PRIu64 " %" PRIu32 " %" PRIu64 " %" PRIu64 " %" PRId64 " %s\n", r->t_ns,
                r->file, r->offset, r->length, r->token, rb_trace_phase_name((int)r->phase));
    }
    int bad = ferror(f);
    if (fclose(f) != 0 || bad)
        return rb_error_set(err, RB_E_IO, "trace: write to '%s' failed: %s", path, strerror(errno));
    return RB_OK;
}

/* ---- reading ---------------------------------------------------------------- */

static int parse_u64(const char **p, uint64_t *out)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    *out = v;
    *p = end;
    return 0;
}

static int parse_i64(const char **p, int64_t *out)
{
    const char *s = *p;
    while (*s == ' ' || *s == '\t')
        s++;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s)
        return -1;
    *out = v;
    *p = end;
    return 0;
}

static int parse_phase(const char *s, uint32_t *out)
{
    while (*s == ' ' || *s == '\t')
        s++;
    for (int i = 0; i < 4; i++) {
        size_t n = strlen(phase_names[i]);
        if (strncmp(s, phase_names[i], n) == 0) {
            const char *e = s + n;
            while (*e == ' ' || *e == '\t' || *e == '\r' || *e == '\n')
                e++;
            if (*e)
                return -1;
            *out = (uint32_t)i;
            return 0;
        }
    }
    return -1;
}

/* Parses one F or A line into t; returns NULL or the reason it is bad. */
static const char *parse_line(rb_trace *t, const char *line, rb_error *err, int *fatal)
{
    const char *p = line + 1;
    if (line[0] == 'F' && (line[1] == ' ' || line[1] == '\t')) {
        uint64_t id, size;
        if (parse_u64(&p, &id) || parse_u64(&p, &size))
            return "F line: expected 'F <file> <size> <path>'";
        while (*p == ' ' || *p == '\t')
            p++;
        size_t n = strcspn(p, "\r\n");
        if (n == 0)
            return "F line: the path is missing";
        if (id != t->n_files)
            return "F line: file ids must be declared in order 0, 1, 2, ...";
        char path[4096];
        if (n >= sizeof path)
            return "F line: path longer than 4095 bytes";
        memcpy(path, p, n);
        path[n] = 0;
        uint32_t got;
        if (rb_trace_add_file(t, path, size, &got, err) != RB_OK) {
            *fatal = 1;
            return "out of memory";
        }
        return NULL;
    }
    if (line[0] == 'A' && (line[1] == ' ' || line[1] == '\t')) {
        rb_trace_rec r;
        uint64_t file;
        if (parse_u64(&p, &r.t_ns) || parse_u64(&p, &file) || parse_u64(&p, &r.offset) ||
            parse_u64(&p, &r.length) || parse_i64(&p, &r.token) || parse_phase(p, &r.phase))
            return "A line: expected 'A <t_ns> <file> <offset> <length> <token> <phase>'";
        if (file >= t->n_files)
            return "A line: file id not declared by an earlier F line";
        if (r.length == 0)
            return "A line: length 0";
        if (r.offset + r.length < r.offset || r.offset + r.length > (1ull << 52))
            return "A line: offset + length beyond 2^52";
        if (r.token < -1)
            return "A line: token below -1";
        r.file = (uint32_t)file;
        if (rb_trace_add(t, &r, err) != RB_OK) {
            *fatal = 1;
            return "out of memory";
        }
        return NULL;
    }
    return "not a comment, F or A line";
}

rb_status rb_trace_read(const char *path, rb_trace *out, rb_trace_diag *diag, rb_error *err)
{
    rb_trace_diag dummy;
    if (!diag)
        diag = &dummy;
    memset(diag, 0, sizeof *diag);
    FILE *f = fopen(path, "r");
    if (!f)
        return rb_error_set(err, RB_E_IO, "trace: cannot open '%s': %s", path, strerror(errno));
    rb_trace t;
    rb_trace_init(&t);
    char line[8192];
    rb_status st = RB_OK;
    int fatal = 0;
    while (fgets(line, sizeof line, f)) {
        diag->n_lines++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            rb_trace_diag_bad(diag, diag->n_lines, "line longer than 8191 bytes");
            int c;
            while ((c = fgetc(f)) != EOF && c != '\n')
                ;
            continue;
        }
        if (diag->n_lines == 1) {
            if (strncmp(line, RB_TRACE_MAGIC, strlen(RB_TRACE_MAGIC)) != 0) {
                st = rb_error_set(err, RB_E_FORMAT,
                                  "trace: '%s' line 1 is not '%s' (not a rebound trace; an strace "
                                  "log goes through `rebound trace --import-strace`)",
                                  path, RB_TRACE_MAGIC);
                break;
            }
            continue;
        }
        if (line[0] == '#' || line[strspn(line, " \t\r\n")] == 0)
            continue;
        const char *why = parse_line(&t, line, err, &fatal);
        if (fatal) {
            st = RB_E_NOMEM;
            break;
        }
        if (why)
            rb_trace_diag_bad(diag, diag->n_lines, why);
        else
            diag->n_parsed++;
    }
    if (st == RB_OK && ferror(f))
        st = rb_error_set(err, RB_E_IO, "trace: read of '%s' failed", path);
    fclose(f);
    if (st == RB_OK && t.n_recs == 0)
        st = rb_error_set(err, RB_E_FORMAT,
                          "trace: '%s' has no access record (%" PRIu64 " lines, %" PRIu64
                          " malformed%s%" PRIu64 ")", path, diag->n_lines, diag->n_bad,
                          diag->n_bad ? ", first at line " : "", diag->n_bad ? diag->bad_line[0] : 0);
    if (st != RB_OK) {
        rb_trace_free(&t);
        return st;
    }
    *out = t;
    return RB_OK;
}

/* ---- the live writer ---------------------------------------------------------- */

typedef struct trange {
    uint64_t offset, length;
} trange;

struct rb_trace_writer {
    FILE *f;
    int failed;
    struct timespec t0;
    uint32_t n_files;
    uint32_t phase;
    int64_t token;
    /* bound model (rb_trace_writer_bind_model) */
    int is_bound;
    uint32_t model_file;
    uint64_t embd_offset, embd_row_bytes, embd_rows;
    trange *ranges;          /* per-layer ranges, then the tail */
    uint32_t *layer_first;   /* [n_layers + 1] index into ranges */
    uint32_t n_layers;
    uint32_t tail_first, n_ranges;
};

rb_status rb_trace_writer_open(const char *path, rb_trace_writer **out, rb_error *err)
{
    rb_trace_writer *w = calloc(1, sizeof *w);
    if (!w)
        return rb_error_set(err, RB_E_NOMEM, "trace: out of memory");
    w->f = fopen(path, "w");
    if (!w->f) {
        free(w);
        return rb_error_set(err, RB_E_IO, "trace: cannot create '%s': %s", path, strerror(errno));
    }
    clock_gettime(CLOCK_MONOTONIC, &w->t0);
    w->token = -1;
    fprintf(w->f, "%s\n# block-bytes %u\n", RB_TRACE_MAGIC, RB_TRACE_BLOCK);
    fprintf(w->f, "# note recorded by rebound: header read at open, load scan, then per batch "
                  "the forward pass's logical accesses to each weight tensor's file range\n");
    fprintf(w->f, "# note mmap mode and the in-RAM mode record the forward pass's logical "
                  "accesses, not page faults\n");
    *out = w;
    return RB_OK;
}

rb_status rb_trace_writer_close(rb_trace_writer *w, rb_error *err)
{
    if (!w)
        return RB_OK;
    int bad = w->failed || ferror(w->f);
    bad |= fclose(w->f) != 0;
    free(w->ranges);
    free(w->layer_first);
    free(w);
    return bad ? rb_error_set(err, RB_E_IO, "trace: writing the trace failed (disk full?)") : RB_OK;
}

uint32_t rb_trace_writer_file(rb_trace_writer *w, const char *path, uint64_t size)
{
    if (fprintf(w->f, "F %" PRIu32 " %" PRIu64 " %s\n", w->n_files, size, path) < 0)
        w->failed = 1;
    return w->n_files++;
}

void rb_trace_writer_phase(rb_trace_writer *w, rb_trace_phase phase, int64_t token)
{
    w->phase = phase;
    w->token = token;
}

void rb_trace_writer_access(rb_trace_writer *w, uint32_t file, uint64_t offset, uint64_t length)
{
    if (length == 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    int64_t dt = (int64_t)(ts.tv_sec - w->t0.tv_sec) * 1000000000 + (ts.tv_nsec - w->t0.tv_nsec);
    if (fprintf(w->f, "A %" PRId64 " %" PRIu32 " %" PRIu64 " %" PRIu64 " %" PRId64 " %s\n",
                dt < 0 ? 0 : dt, file, offset, length, w->token,
                rb_trace_phase_name((int)w->phase)) < 0)
        w->failed = 1;
}

/* The tensors of one llama-family layer, in the order forward.c reads them. */
static const char *layer_tensors[] = {
    "attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
    "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_q_norm.weight", "attn_k_norm.weight",
    "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight",
    "ffn_down.weight",
};
#define N_LAYER_TENSORS (sizeof layer_tensors / sizeof layer_tensors[0])

rb_status rb_trace_writer_bind_model(rb_trace_writer *w, uint32_t file, const rb_gguf *g,
                                     rb_error *err)
{
    uint32_t n_layers = 0;
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        int64_t l = rb_tensor_layer(rb_gguf_tensor_at(g, i)->name);
        if (l >= 0 && l < (1 << 20) && (uint32_t)l + 1 > n_layers)
            n_layers = (uint32_t)l + 1;
    }
    size_t cap = (size_t)n_layers * N_LAYER_TENSORS + 4;
    free(w->ranges);
    free(w->layer_first);
    w->ranges = malloc(cap * sizeof *w->ranges);
    w->layer_first = malloc((n_layers + 1) * sizeof *w->layer_first);
    if (!w->ranges || !w->layer_first)
        return rb_error_set(err, RB_E_NOMEM, "trace: out of memory");
    uint32_t k = 0;
    for (uint32_t l = 0; l < n_layers; l++) {
        w->layer_first[l] = k;
        for (size_t j = 0; j < N_LAYER_TENSORS; j++) {
            char name[96];
            snprintf(name, sizeof name, "blk.%" PRIu32 ".%s", l, layer_tensors[j]);
            const rb_gguf_tensor *t = rb_gguf_find_tensor(g, name);
            if (t && t->n_bytes)
                w->ranges[k++] = (trange){t->file_offset, t->n_bytes};
        }
    }
    w->layer_first[n_layers] = k;
    w->tail_first = k;
    const rb_gguf_tensor *embd = rb_gguf_find_tensor(g, "token_embd.weight");
    const rb_gguf_tensor *out = rb_gguf_find_tensor(g, "output.weight");
    const rb_gguf_tensor *onorm = rb_gguf_find_tensor(g, "output_norm.weight");
    if (onorm)
        w->ranges[k++] = (trange){onorm->file_offset, onorm->n_bytes};
    if (!out)
        out = embd; /* tied output: the logits read the whole embedding table */
    if (out)
        w->ranges[k++] = (trange){out->file_offset, out->n_bytes};
    w->n_ranges = k;
    w->embd_rows = embd && embd->n_dims >= 2 ? embd->dims[1] : 0;
    w->embd_offset = embd ? embd->file_offset : 0;
    w->embd_row_bytes = w->embd_rows ? embd->n_bytes / w->embd_rows : 0;
    w->n_layers = n_layers;
    w->model_file = file;
    w->is_bound = 1;
    return RB_OK;
}

void rb_trace_forward_begin(rb_trace_writer *w, const int32_t *tokens, uint32_t n, uint32_t pos0)
{
    if (!w->is_bound)
        return;
    rb_trace_writer_phase(w, n > 1 || pos0 == 0 ? RB_PHASE_PREFILL : RB_PHASE_DECODE, pos0);
    for (uint32_t t = 0; t < n; t++)
        if (tokens[t] >= 0 && (uint64_t)tokens[t] < w->embd_rows)
            rb_trace_writer_access(w, w->model_file,
                                   w->embd_offset + (uint64_t)tokens[t] * w->embd_row_bytes,
                                   w->embd_row_bytes);
}

void rb_trace_forward_layer(rb_trace_writer *w, uint32_t layer)
{
    if (!w->is_bound || layer >= w->n_layers)
        return;
    for (uint32_t i = w->layer_first[layer]; i < w->layer_first[layer + 1]; i++)
        rb_trace_writer_access(w, w->model_file, w->ranges[i].offset, w->ranges[i].length);
}

void rb_trace_forward_end(rb_trace_writer *w)
{
    if (!w->is_bound)
        return;
    for (uint32_t i = w->tail_first; i < w->n_ranges; i++)
        rb_trace_writer_access(w, w->model_file, w->ranges[i].offset, w->ranges[i].length);
}

static void obs_load(void *ctx) { rb_trace_writer_phase(ctx, RB_PHASE_LOAD, -1); }

static void obs_read(void *ctx, uint64_t offset, uint64_t n)
{
    rb_trace_writer *w = ctx;
    rb_trace_writer_access(w, w->model_file, offset, n);
}

static void obs_begin(void *ctx, const int32_t *tokens, uint32_t n, uint32_t pos0)
{
    rb_trace_forward_begin(ctx, tokens, n, pos0);
}

static void obs_layer(void *ctx, uint32_t layer) { rb_trace_forward_layer(ctx, layer); }
static void obs_end(void *ctx) { rb_trace_forward_end(ctx); }

rb_status rb_trace_writer_attach_model(rb_trace_writer *w, rb_model *m, const char *path)
{
    rb_model_set_observer(m, NULL);
    if (!w)
        return RB_OK;
    const rb_gguf *g = rb_model_gguf(m);
    uint32_t file = rb_trace_writer_file(w, path ? path : "?", rb_gguf_file_size(g));
    rb_status st = rb_trace_writer_bind_model(w, file, g, rb_model_error(m));
    if (st != RB_OK)
        return st;
    /* the header (metadata, tokenizer, tensor index) was read at open */
    rb_trace_writer_phase(w, RB_PHASE_LOAD, -1);
    rb_trace_writer_access(w, file, 0, rb_gguf_data_offset(g));
    const rb_model_observer obs = {w, obs_load, obs_read, obs_begin, obs_layer, obs_end};
    rb_model_set_observer(m, &obs);
    return RB_OK;
}

/* ---- block streams -------------------------------------------------------------- */

void rb_block_stream_free(rb_block_stream *s)
{
    free(s->key);
    free(s->phase);
    free(s->file_base);
    free(s->tok_start);
    free(s->tok_id);
    free(s->tok_phase);
    memset(s, 0, sizeof *s);
}

uint32_t rb_block_stream_file(const rb_block_stream *s, uint32_t key)
{
    if (s->n_files == 0)
        return 0;
    /* binary search: the largest f with base[f] <= key */
    uint32_t lo = 0, hi = s->n_files;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if (s->file_base[mid] <= key)
            lo = mid;
        else
            hi = mid;
    }
    return key < s->file_base[lo + 1] - 1 ? lo : s->n_files;
}

rb_status rb_block_stream_build(const rb_trace *t, rb_block_stream *out, rb_error *err)
{
    rb_block_stream s;
    memset(&s, 0, sizeof s);
    const uint64_t B = RB_TRACE_BLOCK;
    /* 1. per file, the block count: its size, or the largest end seen */
    uint64_t *blocks = calloc(t->n_files + 1, sizeof *blocks);
    if (!blocks)
        return rb_error_set(err, RB_E_NOMEM, "trace: out of memory");
    for (uint32_t f = 0; f < t->n_files; f++)
        blocks[f] = (t->files[f].size + B - 1) / B;
    uint64_t n = 0, n_tok = 0;
    int64_t prev_tok = -2;
    uint32_t prev_phase = UINT32_MAX;
    for (size_t i = 0; i < t->n_recs; i++) {
        const rb_trace_rec *r = &t->recs[i];
        uint64_t last = (r->offset + r->length - 1) / B;
        if (last + 1 > blocks[r->file])
            blocks[r->file] = last + 1;
        n += last - r->offset / B + 1;
        if (r->token >= 0 && (r->token != prev_tok || r->phase != prev_phase))
            n_tok++;
        prev_tok = r->token;
        prev_phase = r->phase;
    }
    uint64_t total = 0;
    for (uint32_t f = 0; f < t->n_files; f++)
        total += blocks[f] + 1;
    if (total >= UINT32_MAX || n >= (1ull << 40)) {
        free(blocks);
        return rb_error_set(err, RB_E_BUDGET,
                            "trace: %" PRIu64 " blocks and %" PRIu64 " accesses exceed the "
                            "simulator's 32-bit keys", total, n);
    }
    s.n = (size_t)n;
    s.n_files = t->n_files;
    s.n_keys = (uint32_t)total;
    s.key = malloc((s.n ? s.n : 1) * sizeof *s.key);
    s.phase = malloc(s.n ? s.n : 1);
    s.file_base = malloc((t->n_files + 1) * sizeof *s.file_base);
    s.tok_start = malloc((n_tok + 1) * sizeof *s.tok_start);
    s.tok_id = malloc((n_tok + 1) * sizeof *s.tok_id);
    s.tok_phase = malloc(n_tok + 1);
    if (!s.key || !s.phase || !s.file_base || !s.tok_start || !s.tok_id || !s.tok_phase) {
        free(blocks);
        rb_block_stream_free(&s);
        return rb_error_set(err, RB_E_NOMEM, "trace: out of memory for %" PRIu64
                            " block accesses", n);
    }
    /* 2. keys: file bases with one separator key after each file */
    uint32_t base = 0;
    for (uint32_t f = 0; f < t->n_files; f++) {
        s.file_base[f] = base;
        base += (uint32_t)blocks[f] + 1;
    }
    s.file_base[t->n_files] = base;
    free(blocks);
    /* 3. expand; open a token span where (token, phase) changes */
    size_t k = 0;
    prev_tok = -2;
    prev_phase = UINT32_MAX;
    for (size_t i = 0; i < t->n_recs; i++) {
        const rb_trace_rec *r = &t->recs[i];
        if (r->token >= 0 && (r->token != prev_tok || r->phase != prev_phase)) {
            s.tok_start[s.n_tok] = k;
            s.tok_id[s.n_tok] = r->token;
            s.tok_phase[s.n_tok] = (uint8_t)r->phase;
            s.n_tok++;
        }
        prev_tok = r->token;
        prev_phase = r->phase;
        uint64_t first = r->offset / B, last = (r->offset + r->length - 1) / B;
        for (uint64_t b = first; b <= last; b++) {
            s.key[k] = s.file_base[r->file] + (uint32_t)b;
            s.phase[k] = (uint8_t)r->phase;
            k++;
        }
    }
    s.tok_start[s.n_tok] = k;
    *out = s;
    return RB_OK;
}

/* ---- synthetic traces ------------------------------------------------------------ */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static rb_status synth_scan(rb_trace *t, uint32_t file, uint64_t off, uint64_t len,
                            uint64_t *clock, int64_t token, uint32_t phase, rb_error *err)
{
    for (uint64_t o = 0; o < len; o += 1u << 20) {
        uint64_t n = len - o < (1u << 20) ? len - o : (1u << 20);
        rb_trace_rec r = {(*clock)++ * 1000, off + o, n, token, file, phase};
        rb_status st = rb_trace_add(t, &r, err);
        if (st != RB_OK)
            return st;
    }
    return RB_OK;
}

rb_status rb_trace_synth(rb_trace *t, uint64_t loop_bytes, uint64_t hot_bytes, uint32_t n_tokens,
                         uint64_t seed, rb_error *err)
{
    if (loop_bytes == 0 || hot_bytes < RB_TRACE_BLOCK)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "trace: synthetic loop %" PRIu64 " B and hot set %" PRIu64
                            " B must be > 0 and >= 4 KiB", loop_bytes, hot_bytes);
    uint32_t fm, ft;
    rb_status st;
    if ((st = rb_trace_add_file(t, "synthetic-model.bin", hot_bytes + loop_bytes, &fm, err)) ||
        (st = rb_trace_add_file(t, "synthetic-tokenizer.bin", hot_bytes, &ft, err)))
        return st;
    uint64_t clock = 0, rng = seed;
    if ((st = synth_scan(t, ft, 0, hot_bytes, &clock, -1, RB_PHASE_LOAD, err)) ||
        (st = synth_scan(t, fm, 0, hot_bytes + loop_bytes, &clock, -1, RB_PHASE_LOAD, err)))
        return st;
    uint64_t hot_blocks = hot_bytes / RB_TRACE_BLOCK;
    for (uint32_t tok = 0; tok < n_tokens; tok++) {
        for (int j = 0; j < 6; j++) {
            uint64_t b = splitmix(&rng) % hot_blocks;
            rb_trace_rec r = {clock++ * 1000, b * RB_TRACE_BLOCK, RB_TRACE_BLOCK, tok,
                              j < 4 ? ft : fm, RB_PHASE_DECODE};
            if ((st = rb_trace_add(t, &r, err)) != RB_OK)
                return st;
        }
        if ((st = synth_scan(t, fm, hot_bytes, loop_bytes, &clock, tok, RB_PHASE_DECODE, err)))
            return st;
    }
    return RB_OK;
}
