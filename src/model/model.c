/*
 * model.c - the public rb_model handle: a validated GGUF file plus its
 * hyperparameters and per-layer byte counts.
 *
 * Does: open (through gguf.c), read hyperparameters with llama.cpp's key
 * names and defaults, account bytes per layer and per category. Does not:
 * load weights (the engine will, through the weight cache), or decide
 * whether the architecture can run.
 *
 * Memory: the rb_model, the gguf reader it owns, and one array of per-layer
 * byte counts (n_layers entries).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"
#include "os.h"
#include "quant.h"
#include "status.h"
#include "tokenizer.h"

struct rb_model {
    rb_gguf *gguf;
    rb_hparams hp;
    char name[128];
    uint64_t *layer_bytes;  /* n_layers entries */
    uint64_t other_bytes;
    uint64_t total_bytes;
    int is_tied_output;
    uint8_t *data;          /* the data section, when read (not mapped) */
    void *data_alloc;       /* the allocation data points into */
    void *data_map;         /* or: the private file mapping it points into */
    size_t data_map_len;
    int data_map_guard;     /* its SIGBUS guard (rb_os_guard_add) */
    int is_sigbus_guard;    /* rb_model_params.sigbus_guard: may map the file */
    rb_progress_fn progress;  /* rb_model_params.progress: loads (any thread
                                 that loads, under the load's own lock) */
    void *progress_ctx;
    int own_fd;             /* rb_model_open_fd: its duplicate (path names
                               it as /proc/self/fd/N); -1 */
    char *path;             /* as given to rb_model_open */
    rb_weights_load load;   /* what the last load of the buffer read (its
                               contents after a lazy load are the weight
                               cache's to track: wcache.c, never here) */
    int n_weight_users;     /* sessions computing from the buffer as loaded */
    int is_streamed;        /* sessions streaming from the buffer (they share
                               one stream: weights_stream) */
    rb_tokenizer *tokenizer; /* built on first use */
    rb_model_observer obs;  /* copied from the caller; all NULL: none */
    int is_observed;        /* obs has a member set */
    rb_error err;           /* last failure on this handle */
    pthread_mutex_t mu;     /* the weight buffer's setup, claims, the owner
                               below and the tokenizer's first build */
    void *weights_owner;    /* the memory manager's object over the buffer */
    void *weights_stream;   /* the stream every streaming session shares
                               (memory/wcache_stream.c creates and destroys it) */
    void (*weights_owner_destroy)(void *);
};

static rb_status key_u32(const rb_gguf *g, const char *arch, const char *suffix,
                         int required, uint32_t dflt, uint32_t *out, rb_error *err)
{
    char key[RB_ARCH_NAME_MAX + 64];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    rb_status st = rb_gguf_get_u32(g, key, out);
    if (st == RB_E_NOT_FOUND && !required) {
        *out = dflt;
        return RB_OK;
    }
    if (st == RB_E_NOT_FOUND)
        return rb_error_set(err, RB_E_UNSUPPORTED,
                            "model: required key '%s' is missing", key);
    if (st == RB_E_FORMAT) {
        /* some models store per-layer counts as arrays: accept a uniform one */
        rb_gguf_array a;
        if (rb_gguf_get_array(g, key, UINT32_MAX, &a) == RB_OK && a.n > 0) {
            rb_gguf_value first, v;
            rb_gguf_array_get(&a, 0, &first);
            for (uint64_t i = 1; i < a.n; i++) {
                rb_gguf_array_get(&a, i, &v);
                if (v.v.u64 != first.v.u64)
                    return rb_error_set(err, RB_E_UNSUPPORTED,
                        "model: key '%s' varies per layer (%" PRIu64 " then %" PRIu64 ")",
                        key, first.v.u64, v.v.u64);
            }
            if ((a.type == RB_GGUF_U32 || a.type == RB_GGUF_I32) && first.v.u64 <= UINT32_MAX) {
                *out = (uint32_t)first.v.u64;
                return RB_OK;
            }
        }
        return rb_error_set(err, RB_E_FORMAT,
                            "model: key '%s' is not an unsigned 32-bit integer", key);
    }
    return st;
}

static rb_status key_f32(const rb_gguf *g, const char *arch, const char *suffix,
                         float dflt, float *out, rb_error *err)
{
    char key[RB_ARCH_NAME_MAX + 64];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    rb_status st = rb_gguf_get_f32(g, key, out);
    if (st == RB_E_NOT_FOUND) {
        *out = dflt;
        return RB_OK;
    }
    if (st != RB_OK)
        return rb_error_set(err, RB_E_FORMAT, "model: key '%s' is not a float", key);
    return RB_OK;
}

/* Gemma 3's keys, as llama.cpp's loader reads them: a sliding window when
 * the key is present and nonzero, with a period of 6 layers (the last of
 * each period global) unless sliding_window_pattern says otherwise (a
 * scalar; llama.cpp ignores an array there), local layers at rope base
 * 10000 unless rope.freq_base_swa, Q scaled by 1/sqrt(head_dim) (by
 * 1/sqrt(n_embd / n_head) for the 62-layer 27B), an optional final logit
 * softcap. */
static rb_status read_gemma3(const rb_gguf *g, rb_hparams *hp, rb_error *err)
{
    const char *a = hp->arch;
    rb_status st;
    if ((st = key_u32(g, a, "attention.sliding_window", 0, 0, &hp->n_swa, err)) ||
        (st = key_f32(g, a, "rope.freq_base_swa", 10000.0f, &hp->rope_freq_base_swa, err)) ||
        (st = key_f32(g, a, "final_logit_softcapping", 0.0f, &hp->final_logit_softcap, err)))
        return st;
    hp->swa_pattern = 6;
    char key[RB_ARCH_NAME_MAX + 64];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    uint32_t pattern;
    if (rb_gguf_get_u32(g, key, &pattern) == RB_OK)
        hp->swa_pattern = pattern;
    if (hp->final_logit_softcap < 0.0f || !isfinite(hp->final_logit_softcap))
        return rb_error_set(err, RB_E_FORMAT, "model: %s.final_logit_softcapping %g is not usable",
                            a, (double)hp->final_logit_softcap);
    if (hp->n_swa > 0 &&
        (!(hp->rope_freq_base_swa > 0.0f) || !isfinite(hp->rope_freq_base_swa)))
        return rb_error_set(err, RB_E_FORMAT,
                            "model: %s.rope.freq_base_swa %g is not a positive finite number", a,
                            (double)hp->rope_freq_base_swa);
    float dim = hp->n_layers == 62 ? (float)(hp->n_embd / hp->n_head) : (float)hp->head_dim_k;
    hp->attn_scale = 1.0f / sqrtf(dim);
    return RB_OK;
}

int rb_hparams_layer_is_swa(const rb_hparams *hp, uint32_t l)
{
    if (hp->n_swa == 0)
        return 0;
    return hp->swa_pattern == 0 || l % hp->swa_pattern < hp->swa_pattern - 1;
}

rb_status rb_hparams_read(const rb_gguf *g, rb_hparams *out, rb_error *err)
{
    rb_hparams hp;
    memset(&hp, 0, sizeof hp);
    rb_gguf_str arch;
    rb_status st = rb_gguf_get_str(g, "general.architecture", &arch);
    if (st == RB_E_NOT_FOUND)
        return rb_error_set(err, RB_E_UNSUPPORTED,
                            "model: required key 'general.architecture' is missing");
    if (st != RB_OK || arch.len == 0 || arch.len >= RB_ARCH_NAME_MAX ||
        memchr(arch.ptr, 0, arch.len))
        return rb_error_set(err, RB_E_FORMAT,
                            "model: 'general.architecture' is not a short string");
    memcpy(hp.arch, arch.ptr, arch.len);
    const char *a = hp.arch;
    if ((st = key_u32(g, a, "block_count", 1, 0, &hp.n_layers, err)) ||
        (st = key_u32(g, a, "embedding_length", 1, 0, &hp.n_embd, err)) ||
        (st = key_u32(g, a, "attention.head_count", 1, 0, &hp.n_head, err)) ||
        (st = key_u32(g, a, "feed_forward_length", 0, 0, &hp.n_ff, err)) ||
        (st = key_u32(g, a, "context_length", 0, 0, &hp.n_ctx_train, err)))
        return st;
    if (hp.n_layers == 0 || hp.n_embd == 0 || hp.n_head == 0)
        return rb_error_set(err, RB_E_FORMAT,
            "model: %s.block_count %" PRIu32 ", embedding_length %" PRIu32
            ", head_count %" PRIu32 ": none may be zero", a, hp.n_layers, hp.n_embd, hp.n_head);
    if ((st = key_u32(g, a, "attention.head_count_kv", 0, hp.n_head, &hp.n_head_kv, err)) ||
        (st = key_u32(g, a, "attention.key_length", 0, hp.n_embd / hp.n_head, &hp.head_dim_k, err)))
        return st;
    if ((st = key_u32(g, a, "attention.value_length", 0, hp.head_dim_k, &hp.head_dim_v, err)) ||
        (st = key_u32(g, a, "rope.dimension_count", 0, hp.head_dim_k, &hp.n_rot, err)) ||
        (st = key_f32(g, a, "rope.freq_base", 10000.0f, &hp.rope_freq_base, err)) ||
        (st = key_f32(g, a, "attention.layer_norm_rms_epsilon", 1e-5f, &hp.rms_eps, err)))
        return st;
    /* both divide (rope: theta = pos / base^(2i/d); rmsnorm: 1/sqrt(mean + eps)):
       NaN, an infinity or a non-positive value makes every logit NaN */
    if (!(hp.rope_freq_base > 0.0f && hp.rope_freq_base < INFINITY) ||
        !(hp.rms_eps > 0.0f && hp.rms_eps < INFINITY))
        return rb_error_set(err, RB_E_FORMAT,
            "model: %s.rope.freq_base %g and %s.attention.layer_norm_rms_epsilon %g must be "
            "finite and positive", a, (double)hp.rope_freq_base, a, (double)hp.rms_eps);
    if (hp.n_head_kv == 0 || hp.n_head % hp.n_head_kv != 0)
        return rb_error_set(err, RB_E_FORMAT,
            "model: %s.attention.head_count_kv %" PRIu32 " does not divide head_count %" PRIu32,
            a, hp.n_head_kv, hp.n_head);
    if (hp.head_dim_k == 0 || hp.n_rot > hp.head_dim_k)
        return rb_error_set(err, RB_E_FORMAT,
            "model: head dim %" PRIu32 " and rope dims %" PRIu32 " are inconsistent",
            hp.head_dim_k, hp.n_rot);
    if (strcmp(a, "gemma3") == 0 && (st = read_gemma3(g, &hp, err)) != RB_OK)
        return st;
    /* vocabulary: the explicit key, else the tokens array, else the embedding */
    char key[RB_ARCH_NAME_MAX + 32];
    snprintf(key, sizeof key, "%s.vocab_size", a);
    rb_gguf_array tokens;
    const rb_gguf_tensor *embd = rb_gguf_find_tensor(g, "token_embd.weight");
    if (rb_gguf_get_u32(g, key, &hp.n_vocab) != RB_OK) {
        if (rb_gguf_get_array(g, "tokenizer.ggml.tokens", RB_GGUF_STRING, &tokens) == RB_OK &&
            tokens.n <= UINT32_MAX)
            hp.n_vocab = (uint32_t)tokens.n;
        else if (embd && embd->n_dims >= 2 && embd->dims[1] <= UINT32_MAX)
            hp.n_vocab = (uint32_t)embd->dims[1];
    }
    *out = hp;
    return RB_OK;
}

uint64_t rb_hparams_kv_bytes_per_token(const rb_hparams *hp)
{
    return (uint64_t)hp->n_layers * hp->n_head_kv * (hp->head_dim_k + hp->head_dim_v) * 2;
}

uint64_t rb_hparams_kv_bytes(const rb_hparams *hp, uint64_t n_tokens)
{
    const uint64_t layer = (uint64_t)hp->n_head_kv * (hp->head_dim_k + hp->head_dim_v) * 2;
    uint64_t sum = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        sum += layer * (rb_hparams_layer_is_swa(hp, l) && hp->n_swa < n_tokens ? hp->n_swa
                                                                                : n_tokens);
    return sum;
}

uint64_t rb_model_kv_bytes(const rb_model *m, uint64_t n_tokens)
{
    return m ? rb_hparams_kv_bytes(&m->hp, n_tokens) : 0;
}

int64_t rb_tensor_layer(const char *name)
{
    if (strncmp(name, "blk.", 4) != 0)
        return -1;
    const char *p = name + 4;
    int64_t n = 0;
    if (*p < '0' || *p > '9')
        return -1;
    while (*p >= '0' && *p <= '9') {
        n = n * 10 + (*p - '0');
        if (n > INT32_MAX)
            return -1;
        p++;
    }
    return *p == '.' ? n : -1;
}

static rb_model_params model_defaults(void)
{
    rb_model_params p;
    memset(&p, 0, sizeof p);
    p.struct_size = sizeof p;
    p.sigbus_guard = 1;
    return p;
}

void rb_model_params_init(rb_model_params *params, size_t struct_size)
{
    rb_model_params d = model_defaults();
    rb_params_init(params, struct_size, &d, sizeof d);
}

static rb_status model_open(const char *path, int fd, const rb_model_params *params,
                            rb_model **out, rb_error *err);

rb_status rb_model_open(const char *path, const rb_model_params *params,
                        rb_model **out, rb_error *err)
{
    if (!path || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "model: path and out are required");
    return model_open(path, -1, params, out, err);
}

rb_status rb_model_open_fd(int fd, const rb_model_params *params, rb_model **out,
                           rb_error *err)
{
    if (fd < 0 || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "model: a file descriptor (%d) and out are "
                            "required", fd);
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0)
        return rb_error_set(err, errno == EBADF ? RB_E_INVALID_ARG : RB_E_IO,
                            "model: file descriptor %d: %s", fd, strerror(errno));
    char path[48];
    snprintf(path, sizeof path, "/proc/self/fd/%d", own);
    rb_status st = model_open(path, own, params, out, err);
    if (st != RB_OK)
        close(own);
    return st;
}

/* path: the file (for an fd, its /proc/self/fd name, which re-opens it
 * wherever the library opens the model file again); fd: ours, or -1. */
static rb_status model_open(const char *path, int fd, const rb_model_params *params,
                            rb_model **out, rb_error *err)
{
    rb_model_params p = model_defaults();
    if (params) {
        rb_status pst = rb_params_copy(&p, sizeof p, params, "rb_model_params", err);
        if (pst != RB_OK)
            return pst;
    }
    rb_model *m = calloc(1, sizeof *m);
    if (!m)
        return rb_error_set(err, RB_E_NOMEM, "model: out of memory");
    pthread_mutex_init(&m->mu, NULL);
    m->own_fd = -1;
    m->is_sigbus_guard = p.sigbus_guard != 0;
    m->progress = p.progress;
    m->progress_ctx = p.progress_ctx;
    rb_status st = fd >= 0 ? rb_gguf_open_fd(fd, path, p.use_mmap ? RB_GGUF_MMAP : 0, NULL,
                                             &m->gguf, err)
                           : rb_gguf_open(path, p.use_mmap ? RB_GGUF_MMAP : 0, NULL, &m->gguf,
                                          err);
    if (st != RB_OK)
        goto fail;
    if (!(m->path = strdup(path))) {
        st = rb_error_set(err, RB_E_NOMEM, "model: out of memory");
        goto fail;
    }
    if ((st = rb_hparams_read(m->gguf, &m->hp, err)) != RB_OK) {
        if (err) {
            char msg[RB_ERROR_MESSAGE_MAX];
            snprintf(msg, sizeof msg, "%s", err->message);
            rb_error_set(err, st, "%s: %s", path, msg);
        }
        goto fail;
    }
    rb_gguf_str name;
    if (rb_gguf_get_str(m->gguf, "general.name", &name) == RB_OK) {
        size_t n = name.len < sizeof m->name - 1 ? (size_t)name.len : sizeof m->name - 1;
        memcpy(m->name, name.ptr, n);
        m->name[n] = 0;
    }
    m->layer_bytes = calloc(m->hp.n_layers, sizeof *m->layer_bytes);
    if (!m->layer_bytes) {
        st = rb_error_set(err, RB_E_NOMEM, "model: out of memory");
        goto fail;
    }
    for (uint64_t i = 0; i < rb_gguf_n_tensors(m->gguf); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(m->gguf, i);
        int64_t layer = rb_tensor_layer(t->name);
        m->total_bytes += t->n_bytes;
        if (layer >= 0 && layer < m->hp.n_layers)
            m->layer_bytes[layer] += t->n_bytes;
        else
            m->other_bytes += t->n_bytes;
    }
    m->is_tied_output = rb_gguf_find_tensor(m->gguf, "output.weight") == NULL;
    m->own_fd = fd; /* closed with the model from now on */
    *out = m;
    return RB_OK;
fail:
    rb_model_close(m);
    return st;
}

static void drop_weights_owner(rb_model *m)
{
    if (m->weights_owner && m->weights_owner_destroy)
        m->weights_owner_destroy(m->weights_owner);
    m->weights_owner = NULL;
    m->weights_owner_destroy = NULL;
}

void rb_model_lock(rb_model *m) { pthread_mutex_lock(&m->mu); }
void rb_model_unlock(rb_model *m) { pthread_mutex_unlock(&m->mu); }
void *rb_model_weights_owner(const rb_model *m) { return m->weights_owner; }

void rb_model_set_weights_owner(rb_model *m, void *obj, void (*destroy)(void *))
{
    drop_weights_owner(m);
    m->weights_owner = obj;
    m->weights_owner_destroy = destroy;
}

void rb_model_close(rb_model *model)
{
    if (!model)
        return;
    drop_weights_owner(model);
    pthread_mutex_destroy(&model->mu);
    rb_gguf_close(model->gguf);
    free(model->layer_bytes);
    free(model->data_alloc);
    if (model->data_map) {
        rb_os_guard_remove(model->data_map_guard);
        munmap(model->data_map, model->data_map_len);
    }
    free(model->path);
    rb_tokenizer_destroy(model->tokenizer);
    if (model->own_fd >= 0)
        close(model->own_fd);
    free(model);
}

const char *rb_model_errmsg(const rb_model *model)
{
    return model && model->err.status ? model->err.message : "";
}

rb_status rb_model_get_info_sized(const rb_model *m, rb_model_info *out, size_t out_size)
{
    if (!m || !out || !out_size)
        return RB_E_INVALID_ARG;
    rb_model_info info;
    memset(&info, 0, sizeof info);
    info.architecture = m->hp.arch;
    info.name = m->name;
    info.gguf_version = rb_gguf_version(m->gguf);
    info.n_layers = m->hp.n_layers;
    info.n_embd = m->hp.n_embd;
    info.n_head = m->hp.n_head;
    info.n_head_kv = m->hp.n_head_kv;
    info.head_dim = m->hp.head_dim_k;
    info.n_ff = m->hp.n_ff;
    info.n_vocab = m->hp.n_vocab;
    info.n_ctx_train = m->hp.n_ctx_train;
    info.n_rot = m->hp.n_rot;
    info.rope_freq_base = m->hp.rope_freq_base;
    info.rms_eps = m->hp.rms_eps;
    info.is_tied_output = m->is_tied_output;
    info.n_tensors = rb_gguf_n_tensors(m->gguf);
    info.file_bytes = rb_gguf_file_size(m->gguf);
    info.tensor_data_bytes = m->total_bytes;
    info.other_weight_bytes = m->other_bytes;
    info.layer_weight_bytes = m->total_bytes - m->other_bytes;
    info.kv_bytes_per_token = rb_hparams_kv_bytes_per_token(&m->hp);
    info.sliding_window = m->hp.n_swa;
    for (uint32_t l = 0; l < m->hp.n_layers; l++)
        info.n_layers_swa += (uint32_t)rb_hparams_layer_is_swa(&m->hp, l);
    /* the caller's struct may be an older, shorter one: fill what it has */
    memcpy(out, &info, out_size < sizeof info ? out_size : sizeof info);
    return RB_OK;
}

uint64_t rb_model_get_layer_bytes(const rb_model *m, uint32_t layer)
{
    return m && layer < m->hp.n_layers ? m->layer_bytes[layer] : 0;
}

rb_status rb_model_get_tensor_info(rb_model *m, uint64_t index, rb_tensor_info *out)
{
    if (!m || !out)
        return RB_E_INVALID_ARG;
    const rb_gguf_tensor *t = rb_gguf_tensor_at(m->gguf, index);
    if (!t) {
        return rb_error_set(&m->err, RB_E_INVALID_ARG,
                            "model: tensor index %" PRIu64 " out of range (%" PRIu64 " tensors)",
                            index, rb_gguf_n_tensors(m->gguf));
    }
    rb_tensor_info ti;
    memset(&ti, 0, sizeof ti);
    ti.name = t->name;
    ti.type_name = rb_type_name(t->type);
    ti.n_dims = t->n_dims;
    for (int d = 0; d < 4; d++)
        ti.dims[d] = t->dims[d];
    ti.n_bytes = t->n_bytes;
    ti.file_offset = t->file_offset;
    *out = ti;
    return RB_OK;
}

const rb_gguf *rb_model_gguf(const rb_model *model) { return model->gguf; }
const rb_hparams *rb_model_hparams(const rb_model *model) { return &model->hp; }

static rb_status rb_model_load_weights_impl(rb_model *m, int skip_layers, int as_map);

static rb_status populate_tensor(rb_model *m, const rb_gguf_tensor *t)
{
    int e = 0;
    rb_status st = rb_os_populate_read(m->data + t->offset, (size_t)t->n_bytes, &e);
    if (st != RB_OK)
        return rb_error_set(&m->err, st, "model: reading tensor '%s' of %s: %s", t->name,
                            m->path, st == RB_E_SHORT_READ ? "file ended" : strerror(e));
    return RB_OK;
}

/* A lazily loaded model's weight buffer is the file itself, mapped private
 * (file offset X at map + X): a cold restore then reads its weights into
 * the page cache, the pages compute reads, where a read into anonymous
 * memory first has the kernel zero every page and pin it (on this kind of
 * VM, whose free memory goes back to the host, that was 40% of a cold
 * restore's CPU time: 0.35-0.40 s of system time per 600 MiB against
 * 0.01-0.03 s this way). The cached copy of the data section is dropped
 * first so that the restore really reads storage. Returns 0 when the
 * mapping cannot be made (the caller allocates instead). */
static int map_data_private(rb_model *m)
{
    uint64_t size = rb_gguf_file_size(m->gguf), start = rb_gguf_data_offset(m->gguf);
    if (size > SIZE_MAX || !m->is_sigbus_guard) /* no guard wanted: no mapping */
        return 0;
    int fd = open(m->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    off_t end = lseek(fd, 0, SEEK_END); /* the file the header was read from */
    void *p = MAP_FAILED;
    if (end >= 0 && (uint64_t)end == size) /* nothing writes weights: read-only */
        p = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p != MAP_FAILED) {
        posix_fadvise(fd, (off_t)start, (off_t)(size - start), POSIX_FADV_DONTNEED);
        /* the mapping's reads use this file's readahead: twice the window */
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    close(fd); /* the mapping holds the file */
    if (p == MAP_FAILED)
        return 0;
    /* a file cut under the mapping is an error of the next forward
       (rb_model_check_mapping), not SIGBUS; no guard, no mapping */
    if ((m->data_map_guard = rb_os_guard_add(p, (size_t)size)) < 0) {
        munmap(p, (size_t)size);
        return 0;
    }
    m->data_map = p;
    m->data_map_len = (size_t)size;
    m->data = (uint8_t *)p + start;
    return 1;
}

int rb_model_weights_file_mapped(const rb_model *m) { return m->data_map != NULL; }

rb_status rb_model_check_mapping(const rb_model *m, rb_error *err)
{
    if (!m->data_map || !rb_os_guard_hit(m->data_map_guard))
        return RB_OK;
    struct stat st;
    char now[48] = "gone";
    if (stat(m->path, &st) == 0)
        snprintf(now, sizeof now, "%" PRIu64 " bytes", (uint64_t)st.st_size);
    return rb_error_set(err, RB_E_IO, "model: '%s' was cut short while its weights were read "
                        "from it (now %s, %zu when opened); the weights are gone, open the "
                        "model again", m->path, now, m->data_map_len);
}

/* Reads the tensors of the data section into m->data: all of them, or
 * none: (skip_layers 1) a cold restore, whose weight cache reads the bytes
 * outside the layers at session open and the blk.* ones layer by layer
 * while the first layers compute, both from storage (O_DIRECT, through the
 * device throttle: the embeddings are weight bytes read like the others),
 * or (2) weight streaming, which reads blocks on use. */
static rb_status load_tensors(rb_model *m, int skip_layers)
{
    m->load = skip_layers == 2 ? RB_WEIGHTS_RESERVED
              : skip_layers == 1 ? RB_WEIGHTS_LAZY : RB_WEIGHTS_READ;
    if (skip_layers)
        return RB_OK;
    /* all of it is read now: huge pages (the weight cache turns them off
       for a layer it gives back). Decode reads every weight once per
       token, and with 4 KiB pages a core streamed Q4_0 rows at 11-13 GB/s
       where 2 MiB pages gave 16-20 (Zen 4, one thread) */
    if (!m->data_map && m->data_alloc)
        rb_os_advise_huge(m->data_alloc, rb_gguf_file_size(m->gguf) - rb_gguf_data_offset(m->gguf) +
                                             (size_t)(m->data - (uint8_t *)m->data_alloc), 1);
    uint64_t done_bytes = 0, total_bytes = m->total_bytes;
    for (uint64_t i = 0; i < rb_gguf_n_tensors(m->gguf); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(m->gguf, i);
        if (m->obs.on_read)
            m->obs.on_read(m->obs.ctx, t->file_offset, t->n_bytes);
        if (m->progress)
            (void)m->progress(m->progress_ctx, RB_PROGRESS_LOAD, done_bytes, total_bytes);
        done_bytes += t->n_bytes;
        /* a mapping holds the file's own pages: fault them in, no copy */
        rb_status st = m->data_map ? populate_tensor(m, t)
                                   : rb_gguf_read(m->gguf, t, 0, m->data + t->offset,
                                                  t->n_bytes, &m->err);
        if (st != RB_OK) {
            m->load = RB_WEIGHTS_RESERVED; /* partly read: read it all again next time */
            return st;
        }
    }
    if (m->progress)
        (void)m->progress(m->progress_ctx, RB_PROGRESS_LOAD, total_bytes, total_bytes);
    return RB_OK;
}

rb_status rb_model_load_weights_lazy(rb_model *m)
{
    if (m->data && m->load == RB_WEIGHTS_RESERVED) /* reserved for streaming before */
        return load_tensors(m, 1);
    if (m->data || rb_gguf_n_tensors(m->gguf) == 0)
        return RB_OK;
    if (rb_gguf_tensor_data(m->gguf, rb_gguf_tensor_at(m->gguf, 0)))
        return RB_OK; /* mapped: the page cache loads it on use */
    return rb_model_load_weights_impl(m, 1, 1);
}

rb_weights_load rb_model_weights_load(const rb_model *m)
{
    return m->data ? m->load : RB_WEIGHTS_NONE;
}

uint64_t rb_model_loaded_bytes(const rb_model *m)
{
    if (!m->data || m->load == RB_WEIGHTS_RESERVED || m->data_map)
        return 0;
    return rb_gguf_file_size(m->gguf) - rb_gguf_data_offset(m->gguf);
}

rb_status rb_model_reserve_weights(rb_model *m, int as_file_mapping)
{
    if (m->data_map && !as_file_mapping && m->n_weight_users == 0) {
        /* streaming gives pages back and expects them to read as zero
           until it reads them again: anonymous memory, not the file's */
        rb_os_guard_remove(m->data_map_guard);
        munmap(m->data_map, m->data_map_len);
        m->data_map = NULL;
        m->data = NULL;
        drop_weights_owner(m); /* it worked on the old buffer */
    }
    if (m->data || rb_gguf_n_tensors(m->gguf) == 0)
        return RB_OK;
    if (rb_gguf_tensor_data(m->gguf, rb_gguf_tensor_at(m->gguf, 0)))
        return RB_OK; /* mapped */
    return rb_model_load_weights_impl(m, 2, as_file_mapping);
}

int rb_model_is_mapped(const rb_model *m)
{
    return rb_gguf_n_tensors(m->gguf) > 0 &&
           rb_gguf_tensor_data(m->gguf, rb_gguf_tensor_at(m->gguf, 0)) != NULL;
}

uint64_t rb_model_drop_mapped_pages(rb_model *m)
{
    if (!rb_model_is_mapped(m))
        return 0;
    const rb_gguf_tensor *t0 = rb_gguf_tensor_at(m->gguf, 0);
    const uint8_t *data = (const uint8_t *)rb_gguf_tensor_data(m->gguf, t0) - t0->offset;
    uint64_t n = rb_gguf_file_size(m->gguf) - rb_gguf_data_offset(m->gguf);
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)data + page - 1) / page * page;
    uintptr_t b = ((uintptr_t)data + (uintptr_t)n) / page * page;
    if (b <= a)
        return 0;
    /* what the process holds of the mapping now: that is what goes */
    size_t n_pages = (b - a) / page;
    unsigned char *vec = malloc(n_pages);
    uint64_t resident = 0;
    if (vec && mincore((void *)a, b - a, vec) == 0)
        for (size_t i = 0; i < n_pages; i++)
            resident += vec[i] & 1;
    free(vec);
    madvise((void *)a, b - a, MADV_DONTNEED);
    return resident * page;
}

rb_status rb_model_claim_weights(rb_model *m, int is_streaming, rb_error *err)
{
    if (is_streaming ? m->n_weight_users > 0 : m->is_streamed > 0)
        return rb_error_set(err, RB_E_INVALID_ARG, "model: %s: %d session(s) %s; a session "
                            "%s cannot share the weight buffer with them (the streamed buffer "
                            "holds only the blocks the stream has read): give every session "
                            "of the model a weights budget, or none", m->path,
                            is_streaming ? m->n_weight_users : m->is_streamed,
                            is_streaming ? "compute from its weights fully resident"
                                         : "stream its weights under a budget",
                            is_streaming ? "that streams" : "without a weights budget");
    if (is_streaming) {
        if (m->is_streamed++ == 0)
            drop_weights_owner(m); /* the stream gives pages back on its own */
    } else
        m->n_weight_users++;
    return RB_OK;
}

void rb_model_unclaim_weights(rb_model *m, int is_streaming)
{
    if (is_streaming) {
        if (m->is_streamed > 0)
            m->is_streamed--;
    } else if (m->n_weight_users > 0)
        m->n_weight_users--;
}

void *rb_model_weights_stream(const rb_model *m) { return m->weights_stream; }

void rb_model_set_weights_stream(rb_model *m, void *stream) { m->weights_stream = stream; }

void rb_model_set_weights_unread(rb_model *m)
{
    if (m->data)
        m->load = RB_WEIGHTS_RESERVED;
}

rb_status rb_model_load_weights(rb_model *m)
{
    if (m->data && m->load != RB_WEIGHTS_READ) /* lazy or reserved before */
        return load_tensors(m, 0);
    if (m->data || rb_gguf_n_tensors(m->gguf) == 0)
        return RB_OK;
    return rb_model_load_weights_impl(m, 0, 0);
}

static rb_status rb_model_load_weights_impl(rb_model *m, int skip_layers, int as_map)
{
    const rb_gguf_tensor *first = rb_gguf_tensor_at(m->gguf, 0);
    if (rb_gguf_tensor_data(m->gguf, first))
        return RB_OK; /* mapped */
    uint64_t start = rb_gguf_data_offset(m->gguf);
    uint64_t n = rb_gguf_file_size(m->gguf) - start;
    if (m->obs.on_load)
        m->obs.on_load(m->obs.ctx);
    /* observed: read tensor by tensor, so that the observer sees each read */
    if (as_map && !m->is_observed && map_data_private(m))
        return load_tensors(m, skip_layers);
    /* placed so that address - file offset is a multiple of 4 KiB: every
       RAM page then holds one file block, which lets the weight cache give
       a layer's pages back and re-read them with O_DIRECT in place */
    const uint64_t page = 4096, shift = start % page;
    m->data_alloc = rb_os_aligned_alloc(page, (shift + n + page - 1) / page * page);
    if (!m->data_alloc)
        return rb_error_set(&m->err, RB_E_NOMEM,
                            "model: out of memory for %" PRIu64 " bytes of weights", n);
    m->data = (uint8_t *)m->data_alloc + shift;
    /* read tensor by tensor: the reader checks every range against the file */
    rb_status st = load_tensors(m, skip_layers);
    if (st != RB_OK) {
        free(m->data_alloc);
        m->data_alloc = NULL;
        m->data = NULL;
    }
    return st;
}

const void *rb_model_tensor_data(const rb_model *m, const rb_gguf_tensor *t)
{
    const void *p = rb_gguf_tensor_data(m->gguf, t);
    if (p)
        return p;
    return m->data ? m->data + t->offset : NULL;
}

rb_status rb_model_tokenizer(rb_model *m, const rb_tokenizer **out)
{
    rb_status st = RB_OK;
    pthread_mutex_lock(&m->mu);
    if (!m->tokenizer)
        st = rb_tokenizer_create(m->gguf, &m->tokenizer, &m->err);
    *out = m->tokenizer;
    pthread_mutex_unlock(&m->mu);
    return st;
}

rb_error *rb_model_error(rb_model *m) { return &m->err; }

void rb_model_set_error(rb_model *m, const rb_error *e)
{
    pthread_mutex_lock(&m->mu);
    m->err = *e;
    pthread_mutex_unlock(&m->mu);
}

void rb_model_set_observer(rb_model *m, const rb_model_observer *obs)
{
    static const rb_model_observer none = {0};
    m->obs = obs ? *obs : none;
    m->is_observed = m->obs.on_read || m->obs.on_load || m->obs.on_forward_begin ||
                     m->obs.on_forward_layer || m->obs.on_forward_end;
}

const rb_model_observer *rb_model_get_observer(const rb_model *m)
{
    return m->is_observed ? &m->obs : NULL;
}

const char *rb_model_path(const rb_model *m) { return m->path; }
