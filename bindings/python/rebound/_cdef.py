"""The C declarations of include/rebound.h (and rebound_experimental.h)
that the binding calls, for cffi's ABI mode. Enums are ints (their C
size). The structs' layouts must be the header's: tests/test_layout.py
compiles a C program that prints the header's sizeof and offsetof of every
field declared here and compares them with cffi's.

The params structs a program fills come in two forms, and the functions
that take them take `const void *`: rebound 0.2's (rb_model_params and
rb_session_params without a size, filled by the exported
rb_*_default_params), and the versioned form of 0.3 on (`_v3`: struct_size
first, filled by rb_*_params_init with this binding's sizeof, so that the
library reads only the fields declared here and a newer library gives the
rest their defaults). _lib.PARAMS says which the loaded library has."""

CDEF = r"""
typedef int rb_status;
typedef int rb_tier;
typedef int rb_restore_mode;
typedef int rb_ram_codec;
typedef int rb_kv_type;
typedef int rb_priority;
typedef int rb_progress_phase;
typedef int rb_trim_level;
typedef int rb_event_kind;
typedef int rb_chat_template;

const char *rb_version(void);
uint32_t rb_version_number(void);
const char *rb_status_name(rb_status status);

typedef struct rb_error {
    rb_status status;
    char message[512];
} rb_error;

typedef struct rb_model rb_model;
typedef struct rb_session rb_session;
typedef struct rb_pool rb_pool;
typedef struct rb_sampler rb_sampler;
typedef struct rb_detokenizer rb_detokenizer;

typedef int (*rb_progress_fn)(void *ctx, rb_progress_phase phase, uint64_t done, uint64_t total);

typedef struct rb_model_params_v2 {
    int use_mmap;
} rb_model_params_v2;
typedef struct rb_model_params_v3 {
    size_t struct_size;
    int use_mmap;
    int sigbus_guard;
    rb_progress_fn progress;
    void *progress_ctx;
} rb_model_params_v3;
rb_model_params_v2 rb_model_default_params(void);           /* 0.2 */
void rb_model_params_init(void *params, size_t struct_size); /* 0.3 on */
rb_status rb_model_open(const char *path, const void *params, rb_model **out, rb_error *err);
void rb_model_close(rb_model *model);
const char *rb_model_errmsg(const rb_model *model);

typedef struct rb_model_info {
    const char *architecture;
    const char *name;
    uint32_t gguf_version;
    uint32_t n_layers;
    uint32_t n_embd;
    uint32_t n_head;
    uint32_t n_head_kv;
    uint32_t head_dim;
    uint32_t n_ff;
    uint32_t n_vocab;
    uint32_t n_ctx_train;
    uint32_t n_rot;
    float rope_freq_base;
    float rms_eps;
    int is_tied_output;
    uint64_t n_tensors;
    uint64_t file_bytes;
    uint64_t tensor_data_bytes;
    uint64_t layer_weight_bytes;
    uint64_t other_weight_bytes;
    uint64_t kv_bytes_per_token;
    uint32_t sliding_window;
    uint32_t n_layers_swa;
} rb_model_info;
rb_status rb_model_get_info_sized(const rb_model *model, rb_model_info *out, size_t out_size);
uint64_t rb_model_kv_bytes(const rb_model *model, uint64_t n_tokens);
rb_status rb_model_get_meta_str(const rb_model *model, const char *key, const char **out, size_t *len);
uint64_t rb_model_get_layer_bytes(const rb_model *model, uint32_t layer);

typedef struct rb_tensor_info {
    const char *name;
    const char *type_name;
    uint32_t n_dims;
    uint64_t dims[4];
    uint64_t n_bytes;
    uint64_t file_offset;
} rb_tensor_info;
rb_status rb_model_get_tensor_info(rb_model *model, uint64_t index, rb_tensor_info *out);

const char *rb_kv_type_name(rb_kv_type t);
int rb_kv_type_from_name(const char *name);

struct rb_experimental_params;
typedef struct rb_session_params_v2 {
    uint32_t n_ctx;
    uint32_t n_batch;
    int n_threads;
    rb_restore_mode restore;
    rb_ram_codec ram_codec;
    const char *spill_dir;
    uint64_t budget_bytes;
    uint64_t weights_budget_bytes;
    const char *weights_policy;
    const struct rb_experimental_params *experimental;
    unsigned file_flags;
    rb_kv_type kv_type_k, kv_type_v;
    rb_pool *pool;
    rb_priority priority;
    rb_progress_fn progress;
    void *progress_ctx;
} rb_session_params_v2;
typedef struct rb_session_params_v3 {
    size_t struct_size;
    uint32_t n_ctx;
    uint32_t n_batch;
    int n_threads;
    rb_restore_mode restore;
    rb_ram_codec ram_codec;
    const char *spill_dir;
    uint64_t budget_bytes;
    uint64_t weights_budget_bytes;
    const char *weights_policy;
    const struct rb_experimental_params *experimental;
    unsigned file_flags;
    rb_kv_type kv_type_k, kv_type_v;
    rb_pool *pool;
    rb_priority priority;
    rb_progress_fn progress;
    void *progress_ctx;
    int exact_attention;
    uint32_t kv_page_tokens;
} rb_session_params_v3;
rb_session_params_v2 rb_session_default_params(void);            /* 0.2 */
void rb_session_params_init(void *params, size_t struct_size);   /* 0.3 on */

rb_status rb_session_create(rb_model *model, const void *params, rb_session **out, rb_error *err);
void rb_session_destroy(rb_session *session);
const char *rb_session_errmsg(const rb_session *session);
rb_status rb_session_feed(rb_session *session, const int32_t *tokens, size_t n, float *logits);
const float *rb_session_get_logits(const rb_session *session);
size_t rb_session_n_tokens(const rb_session *session);
const int32_t *rb_session_get_tokens(const rb_session *session);
uint32_t rb_session_n_ctx(const rb_session *session);
uint32_t rb_session_n_vocab(const rb_session *session);
rb_status rb_session_trim(rb_session *session, uint64_t bytes, rb_trim_level level, uint64_t *freed_out);
void rb_session_abort(rb_session *session);
rb_status rb_session_set_priority(rb_session *session, rb_priority priority);
rb_status rb_session_prefetch(rb_session *session, uint64_t *planned_bytes);

rb_status rb_pool_create(rb_model *model, uint64_t budget_bytes, rb_pool **out, rb_error *err);
void rb_pool_destroy(rb_pool *pool);
rb_status rb_pool_set_budget(rb_pool *pool, uint64_t budget_bytes);
rb_status rb_pool_count_process(rb_pool *pool);
rb_status rb_pool_trim(rb_pool *pool, uint64_t bytes, rb_trim_level level, uint64_t *freed_out);
rb_status rb_pool_prefetch_next(rb_pool *pool, rb_session **picked, uint64_t *planned_bytes);

typedef struct rb_pool_stats {
    uint64_t budget_bytes;
    uint64_t total_bytes;
    uint64_t weights_bytes;
    uint64_t weights_total_bytes;
    uint64_t sessions_bytes;
    uint64_t over_bytes;
    uint32_t n_sessions, n_background;
    uint64_t n_enforcements;
    uint64_t n_trims_posted;
    uint64_t trimmed_bytes;
    uint64_t weights_released_bytes;
    uint64_t n_pressure_events[3];
    uint64_t base_bytes;
    char pressure_source[256];
    uint64_t shared_kv_bytes;
    uint64_t n_shared_kv_pages;
    uint64_t n_prefetches;
    uint64_t prefetch_granted_bytes;
    uint64_t prefetch_trimmed_bytes;
    uint64_t n_leveled_trims;
    uint64_t level_line_bytes;
    uint64_t n_shared_trims;
} rb_pool_stats;
rb_status rb_pool_get_stats_sized(const rb_pool *pool, rb_pool_stats *out, size_t out_size);

typedef struct rb_pool_pressure_params {
    const char *cgroup_dir;
    int is_system_wide;
    uint32_t window_ms;
    uint32_t low_some_ms, medium_some_ms, critical_full_ms;
} rb_pool_pressure_params;
rb_status rb_pool_watch_pressure(rb_pool *pool, const rb_pool_pressure_params *p, rb_error *err);
void rb_pool_unwatch_pressure(rb_pool *pool);

typedef struct rb_session_stats {
    uint64_t weights_bytes;
    uint64_t weights_evicted_bytes;
    uint64_t kv_raw_bytes;
    uint64_t kv_compressed_bytes;
    uint64_t kv_compressed_raw_bytes;
    uint64_t kv_stored_bytes;
    uint64_t kv_dropped_bytes;
    uint64_t scratch_bytes;
    uint64_t other_bytes;
    uint64_t total_bytes;
    uint64_t budget_bytes;
    uint32_t n_kv_pages[4];
    uint32_t n_layers_weights_evicted;
    uint64_t n_disk_full;
    uint64_t n_spill_damaged;
    double decode_bytes_per_s;
    double storage_bytes_per_s;
    const char *storage_io;
    double restore_io_s;
    double restore_decode_s;
    double restore_wait_s;
    double restore_total_s;
    uint64_t restore_bytes_io;
    uint64_t restore_bytes_decoded;
    uint32_t restore_recomputed_tokens;
    uint64_t file_commits;
    uint64_t file_pages_written;
    double file_commit_s;
    rb_status file_status;
    int weights_streaming;
    const char *weights_policy;
    uint64_t weights_budget_bytes;
    uint64_t weights_min_budget_bytes;
    uint64_t weights_loop_bytes;
    uint64_t weights_pinned_loop_bytes;
    uint64_t weights_window_bytes;
    uint64_t weights_max_resident_bytes;
    uint64_t weights_read_bytes;
    uint64_t weights_reads;
    uint64_t weights_hits, weights_misses;
    uint64_t weights_passes;
    uint64_t weights_rebalances;
    uint64_t weights_given_up_bytes;
    double weights_io_s;
    double weights_wait_s;
    double weights_room_wait_s;
    double weights_idle_s;
    double device_bytes_per_s;
    const char *file_recovery;
    uint64_t file_lost_tokens;
    uint64_t budget_over_bytes;
    uint64_t trim_failures;
    rb_status trim_status;
    uint64_t n_prefetches;
    uint64_t prefetch_pages;
    uint64_t prefetch_bytes;
    uint64_t n_prefetch_cancelled;
    uint32_t prefetch_pending;
    double room_s;
    uint64_t restore_spare_pages;
    uint64_t file_prefix_pages;
} rb_session_stats;
rb_status rb_session_get_stats_sized(const rb_session *session, rb_session_stats *out, size_t out_size);

rb_status rb_session_set_restore(rb_session *session, rb_restore_mode mode, rb_ram_codec codec);
rb_status rb_session_rewind(rb_session *session, size_t n_tokens);
rb_status rb_session_shift(rb_session *session, size_t n_keep, size_t n_discard);
rb_status rb_session_fork(rb_session *src, size_t n_tokens, const void *params,
                          rb_session **out, rb_error *err);
rb_status rb_session_save(rb_session *session, const char *path, unsigned flags);
rb_status rb_session_open_saved(rb_model *model, const void *params, const char *path, rb_session **out, rb_error *err);
rb_status rb_session_unbind(rb_session *session);
rb_status rb_session_set_blob(rb_session *session, const void *data, size_t n);
const void *rb_session_get_blob(const rb_session *session, size_t *n);

typedef struct rb_restore_event {
    rb_event_kind kind;
    uint32_t layer;
    double start_s;
    double end_s;
} rb_restore_event;
size_t rb_session_restore_events(const rb_session *session, rb_restore_event *out, size_t max);

rb_status rb_model_tokenize(rb_model *model, const char *text, size_t len, int add_special, int parse_special, int32_t *tokens, size_t n_max, size_t *n_out);
int32_t rb_model_token_bos(rb_model *model);
int32_t rb_model_token_eos(rb_model *model);
int rb_model_token_is_eog(rb_model *model, int32_t token);
rb_status rb_model_token_to_piece(rb_model *model, int32_t token, int special, char *buf, size_t size, size_t *out_len);

rb_status rb_detokenizer_create_flags(rb_model *model, unsigned flags, rb_detokenizer **out, rb_error *err);
void rb_detokenizer_destroy(rb_detokenizer *d);
size_t rb_detokenizer_max_bytes(const rb_detokenizer *d);
rb_status rb_detokenizer_push(rb_detokenizer *d, int32_t token, char *out, size_t out_size, size_t *n_out);
rb_status rb_detokenizer_flush(rb_detokenizer *d, char *out, size_t out_size, size_t *n_out);
const char *rb_detokenizer_errmsg(const rb_detokenizer *d);

typedef struct rb_chat_message {
    const char *role;
    const char *content;
} rb_chat_message;
rb_status rb_chat_apply_template(rb_model *model, const char *tmpl, const rb_chat_message *msgs, size_t n_msgs, int add_assistant, char *buf, size_t size, size_t *out_len);
const char *rb_chat_template_names(void);

typedef struct rb_sampler_params {
    float temp;
    int32_t top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    int32_t repeat_last_n;
    uint64_t seed;
    float presence_penalty;
    float frequency_penalty;
    int32_t is_logprobs;
    int32_t n_top_logprobs;
} rb_sampler_params;
rb_sampler_params rb_sampler_default_params(void);
typedef struct rb_sampler_state {
    uint64_t seed;
    uint64_t s[4];
} rb_sampler_state;
typedef struct rb_sampler_candidate {
    int32_t id;
    float logit;
} rb_sampler_candidate;
rb_status rb_sampler_create(const rb_sampler_params *params, uint32_t n_vocab, rb_sampler **out, rb_error *err);
void rb_sampler_destroy(rb_sampler *s);
rb_status rb_sampler_sample(rb_sampler *s, const float *logits, const int32_t *history, size_t n_history, int32_t *token);
rb_status rb_sampler_get_candidates(rb_sampler *s, const float *logits, const int32_t *history, size_t n_history, const rb_sampler_candidate **out, size_t *n_out);
void rb_sampler_get_state(const rb_sampler *s, rb_sampler_state *out);
rb_status rb_sampler_set_state(rb_sampler *s, const rb_sampler_state *state);
const char *rb_sampler_errmsg(const rb_sampler *s);

size_t rb_cpu_describe(char *buf, size_t size);

/* rebound_experimental.h */
typedef struct rb_experimental_params {
    const char *device;
    double decode_bytes_per_s;
    double storage_bytes_per_s;
} rb_experimental_params;
rb_experimental_params rb_experimental_default_params(void);
rb_status rb_session_decode_multi(rb_session **sessions, const int32_t *tokens, size_t n, rb_error *err);
"""

# the structs whose layout tests/test_layout.py checks against the header,
# as (cffi's name, the header's name); "{params}" is _lib.PARAMS
STRUCTS = [
    ("rb_error", "rb_error"), ("rb_model_params_{params}", "rb_model_params"),
    ("rb_model_info", "rb_model_info"), ("rb_tensor_info", "rb_tensor_info"),
    ("rb_session_params_{params}", "rb_session_params"), ("rb_pool_stats", "rb_pool_stats"),
    ("rb_pool_pressure_params", "rb_pool_pressure_params"),
    ("rb_session_stats", "rb_session_stats"), ("rb_restore_event", "rb_restore_event"),
    ("rb_chat_message", "rb_chat_message"), ("rb_sampler_params", "rb_sampler_params"),
    ("rb_sampler_state", "rb_sampler_state"), ("rb_sampler_candidate", "rb_sampler_candidate"),
    ("rb_experimental_params", "rb_experimental_params"),
]
