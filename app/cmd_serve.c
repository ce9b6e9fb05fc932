/*
 * cmd_serve.c - `rebound serve`: the options of the HTTP service into an
 * sv_config, checked before anything loads, then serve/'s sv_serve_run
 * (the module: serve/serve.h). Built only with libmicrohttpd and jansson.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "serve.h"

#define CMD "serve"

/* --api-key, --api-keys, --cors: given several times, kept in order */
typedef struct serve_lists {
    sv_key keys[SV_KEYS_MAX];
    size_t n_keys;
    char key_names[SV_KEYS_MAX][16];   /* "key1", ... for --api-key */
    const char *cors[16];
    size_t n_cors;
    char *file_text;                   /* --api-keys' text (keys point into it) */
} serve_lists;

static int add_key(serve_lists *l, const char *key, const char *name, char *why, size_t why_n)
{
    if (!*key || strlen(key) > 1024) {
        snprintf(why, why_n, "a key of 1 to 1024 characters");
        return -1;
    }
    if (!sv_ns_is_valid(name) || !*name) {
        snprintf(why, why_n, "a name of 1 to %d characters of A-Z, a-z, 0-9, '-', '_' ('%.40s')",
                 SV_NS_MAX, name);
        return -1;
    }
    for (size_t i = 0; i < l->n_keys; i++)
        if (!strcmp(l->keys[i].key, key) || !strcmp(l->keys[i].name, name)) {
            snprintf(why, why_n, "the key or the name '%s' is given twice", name);
            return -1;
        }
    if (l->n_keys == SV_KEYS_MAX) {
        snprintf(why, why_n, "at most %d keys", SV_KEYS_MAX);
        return -1;
    }
    l->keys[l->n_keys++] = (sv_key){key, name};
    return 0;
}

static int opt_api_key(void *dest, const char *v, char *why, size_t why_n)
{
    serve_lists *l = dest;
    snprintf(l->key_names[l->n_keys % SV_KEYS_MAX], sizeof l->key_names[0], "key%zu",
             l->n_keys + 1);
    return add_key(l, v, l->key_names[l->n_keys % SV_KEYS_MAX], why, why_n);
}

/* --api-keys FILE: "KEY NAME" lines; blank lines and '#' comments skipped */
static int opt_api_keys(void *dest, const char *v, char *why, size_t why_n)
{
    serve_lists *l = dest;
    FILE *f = fopen(v, "rb");
    if (!f) {
        snprintf(why, why_n, "a readable file of KEY NAME lines (%s)", strerror(errno));
        return -1;
    }
    char *text = NULL;
    size_t n = 0;
    FILE *m = open_memstream(&text, &n);
    char buf[4096];
    size_t k;
    while (m && (k = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, k, m);
    fclose(f);
    if (!m || fclose(m) != 0) {
        free(text);
        snprintf(why, why_n, "a file that fits in memory");
        return -1;
    }
    free(l->file_text);
    l->file_text = text;
    int line = 0;
    for (char *save = NULL, *ln = strtok_r(text, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        line++;
        ln[strcspn(ln, "\r")] = 0;
        char *key = ln + strspn(ln, " \t");
        if (!*key || *key == '#')
            continue;
        char *sp = key + strcspn(key, " \t");
        char *name = sp + strspn(sp, " \t");
        *sp = 0;
        name[strcspn(name, " \t")] = 0;
        char w[160];
        if (!*name) {
            snprintf(why, why_n, "KEY NAME lines: line %d has no NAME", line);
            return -1;
        }
        if (add_key(l, key, name, w, sizeof w)) {
            snprintf(why, why_n, "KEY NAME lines: line %d: %s", line, w);
            return -1;
        }
    }
    return 0;
}

static int opt_cors(void *dest, const char *v, char *why, size_t why_n)
{
    serve_lists *l = dest;
    if (!*v || l->n_cors == sizeof l->cors / sizeof l->cors[0]) {
        snprintf(why, why_n, "an origin such as https://app.example or *; at most %zu",
                 sizeof l->cors / sizeof l->cors[0]);
        return -1;
    }
    l->cors[l->n_cors++] = v;
    return 0;
}

/* --baseline: "recompute" (idle conversations keep no KV) or "none" */
static int opt_baseline(void *dest, const char *v, char *why, size_t why_n)
{
    if (strcmp(v, "recompute") && strcmp(v, "none")) {
        snprintf(why, why_n, "recompute or none");
        return -1;
    }
    *(int *)dest = !strcmp(v, "recompute");
    return 0;
}

int rb_cmd_serve(int argc, char **argv)
{
    sv_config cfg0 = {0};
    sv_config *cfg = &cfg0;
    const char *host = "127.0.0.1", *unix_path = NULL, *alias = NULL;
    int port = 8080, use_mmap = 0, seed_given = 0;
    uint64_t max_body = 1u << 20, mem_budget = 0, max_disk = 0, max_inflight = 32u << 20;
    uint32_t max_conv = 64, max_open = 4, parallel = 4, max_queue = 8, max_conn = 64;
    uint32_t max_stall_ms = 200;
    uint32_t max_per_peer = 16;
    double request_timeout = 10;
    static serve_lists lists; /* the keys stay valid while the service runs */
    int64_t n_predict = -1;
    cfg->sp = rb_session_default_params();
    cfg->sp.n_batch = 512; /* a prompt alone goes in passes of 512 (-b) */
    cfg->sampler = rb_sampler_default_params();
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &cfg->model_path, 0, 0, NULL, NULL},
        {"--alias", RB_OPT_STR, "NAME", "the model's id in /v1/models (default: the file's name)",
         &alias, 0, 0, NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "listening:", NULL, 0, 0, NULL, NULL},
        {"--host", RB_OPT_STR, "ADDR", "IPv4 or IPv6 address to listen on (default 127.0.0.1: "
         "this machine only)", &host, 0, 0, NULL, NULL},
        {"--port", RB_OPT_INT, "N", "TCP port (default 8080; 0: any free port, printed)", &port,
         0, 65535, NULL, NULL},
        {"--unix", RB_OPT_STR, "PATH", "listen on a Unix socket instead (mode 0600)", &unix_path,
         0, 0, NULL, NULL},
        {"--api-key", RB_OPT_CALL, "KEY", "require Authorization: Bearer KEY on /v1/* and "
         "/metrics; each key (repeat\nthe option) is its own namespace, key1, key2, ...: "
         "conversations,\nprefix matching, quotas and /metrics apart (compared in constant "
         "time)", &lists, 0, 0, opt_api_key, NULL},
        {"--api-keys", RB_OPT_CALL, "FILE", "keys from FILE, one 'KEY NAME' a line: the "
         "namespace NAME (in logs\nand /metrics)", &lists, 0, 0, opt_api_keys, NULL},
        {"--cors", RB_OPT_CALL, "ORIGIN", "allow browser pages of ORIGIN (repeat it; * for "
         "any): preflights\nanswered, Access-Control-Allow-Origin sent", &lists, 0, 0, opt_cors,
         NULL},
        {"--max-body", RB_OPT_SIZE, "BYTES", "largest request body (K/M/G; default 1M, and no "
         "more than a prompt\nthat fits the context takes): 413 beyond", &max_body, 1, 1e12,
         NULL, NULL},
        {"--max-inflight", RB_OPT_SIZE, "BYTES", "request bodies held at once (default 32M): "
         "503 + Retry-After beyond", &max_inflight, 1, 1e12, NULL, NULL},
        {"--max-connections", RB_OPT_U32, "N", "connections served at once (default 64); a few "
         "more hear 503,\nthe rest are refused", &max_conn, 1, 4096, NULL, NULL},
        {"--max-connections-per-peer", RB_OPT_U32, "N", "connections of one address (or uid "
         "on --unix) at once (default 16);\nmore are closed at once", &max_per_peer, 1, 4096,
         NULL, NULL},
        {"--request-timeout", RB_OPT_DOUBLE, "S", "a request's head and body must arrive "
         "within S seconds (default 10;\nnot an idle timeout: a trickle is cut too)",
         &request_timeout, 0.1, 3600, NULL, NULL},
        {"-np|--parallel", RB_OPT_U32, "N", "requests computed at once (default 4): their decode "
         "steps run\nas one forward pass, their prompts in chunks between the steps", &parallel, 1, 256, NULL, NULL},
        {"--max-queue", RB_OPT_U32, "N", "requests waiting beyond those (default 8): 429 + "
         "Retry-After beyond",
         &max_queue, 0, 1e6, NULL, NULL},
        {"--max-stall-ms", RB_OPT_U32, "MS", "while streams decode, a prompt is computed in "
         "chunks cut so that\ntheir tokens are at most about MS apart (default 200; chosen "
         "from the\nmeasured step times, at least 32 tokens a chunk); alone, a prompt\ngoes "
         "in passes of -b tokens", &max_stall_ms, 1, 600000, NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "conversations:", NULL, 0, 0, NULL, NULL},
        {"--sessions", RB_OPT_STR, "DIR", "keep every conversation in DIR as a session file: "
         "they survive a\nkill and a restart (default: in RAM only)", &cfg->sessions_dir, 0, 0,
         NULL, NULL},
        {"--max-conversations", RB_OPT_U32, "N", "conversations kept (default 64); the least "
         "recently used are deleted", &max_conv, 1, 1e6, NULL, NULL},
        {"--max-disk", RB_OPT_SIZE, "BYTES", "bytes of session files in all (K/M/G; default: no "
         "limit)", &max_disk, 1, 1e19, NULL, NULL},
        {"--max-open", RB_OPT_U32, "N", "sessions open in RAM at once (default 4; at least "
         "--parallel)", &max_open, 1, 4096, NULL, NULL},
        {"--mem-budget", RB_OPT_SIZE, "BYTES", "the memory pool's budget over the weights and every "
         "open session (K/M/G):\nbeyond it the idle conversations' KV goes first (least "
         "recently used),\nthen weights; idle sessions are closed when that is not enough",
         &mem_budget, 1, 1e19, NULL, NULL},
        {"--pressure", RB_OPT_FLAG, NULL, "trim the pool on the kernel's memory pressure "
         "signals (PSI or the cgroup's\nlevels: low -> the last quarter of the layers' KV, "
         "medium -> half, critical -> all\nand the weights)", &cfg->watch_pressure, 0, 0, NULL,
         NULL},
        {"--baseline", RB_OPT_CALL, "MODE", "recompute: an idle conversation keeps no KV and a "
         "returning one is\ncomputed again from its tokens (what a server without tiers "
         "pays;\nbench-serve compares the two); none (default)", &cfg->baseline_recompute, 0,
         0, opt_baseline, NULL},
        {"--completions-special", RB_OPT_FLAG, NULL, "/v1/completions prompts may hold "
         "special tokens written out (<|im_end|>,\n...): by default a prompt is text, as "
         "chat messages always are", &cfg->completions_special, 0, 0, NULL, NULL},
        {"--chat-template|--template", RB_OPT_STR, "NAME", "chat format (default: the model's)",
         &cfg->chat_template, 0, 0, NULL, NULL},
        {"-n|--n-predict", RB_OPT_I64, "N", "default max_tokens (default -1: until the model "
         "ends or the context is full)", &n_predict, -1, 9.2e18, NULL, NULL},
        {"--mmap", RB_OPT_FLAG, NULL, "map the model file instead of reading it", &use_mmap, 0, 0,
         NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "each conversation's session:", NULL, 0, 0, NULL, NULL},
        {"-c|--ctx-size", RB_OPT_U32, "N", "context length (default: the model's trained context)",
         &cfg->sp.n_ctx, 0, 0, NULL, NULL},
        {"-b|--batch-size", RB_OPT_CALL, "N", "tokens of a prompt in one pass (default 512; "
         "the run state of each\nsession grows with it); while other streams decode, a "
         "prompt goes\nin smaller chunks between their tokens (--max-stall-ms)", &cfg->sp.n_batch, 0, 0,
         rb_cli_opt_batch, NULL},
        {"-t|--threads", RB_OPT_INT, "N", "threads (default: all cores)", &cfg->sp.n_threads, 0,
         256, NULL, NULL},
        RB_CLI_EXACT_ATTENTION_OPT(&cfg->sp),
        {"--device", RB_OPT_CALL, "D", "storage profile for the memory manager: phone, watch, host",
         &cfg->sp, 0, 0, rb_cli_opt_device, NULL},
        {"-ctk|--cache-type-k", RB_OPT_CALL, "T", "KV cache type of K: f16 (default), q8_0, q4_0",
         &cfg->sp.kv_type_k, 0, 0, rb_cli_opt_kv_type, NULL},
        {"-ctv|--cache-type-v", RB_OPT_CALL, "T", "the same for V", &cfg->sp.kv_type_v, 0, 0,
         rb_cli_opt_kv_type, NULL},
        {"--kv-page", RB_OPT_U32, "N", "tokens per KV page: 32 (default), or a multiple of 32 "
         "up to 1024;\nconversations that share a prefix share more of it with small "
         "pages\n(a conversation's files keep the size they were saved with)",
         &cfg->sp.kv_page_tokens, 32, 1024, NULL, NULL},
        {"--spill-dir", RB_OPT_STR, "DIR", "where evicted KV goes on storage (default $TMPDIR or "
         "/tmp)", &cfg->sp.spill_dir, 0, 0, NULL, NULL},
        {"--weights-budget", RB_OPT_SIZE, "BYTES", "RAM for the model's weights (K/M/G): they "
         "stream from the file every\ntoken through one cache that every conversation shares "
         "(the hot set and\na loop prefix stay); with --mem-budget, the pool may give it less",
         &cfg->sp.weights_budget_bytes, 1, 1e19, NULL, NULL},
        RB_CLI_SAMPLER_OPTS(&cfg->sampler, &seed_given),
        {0},
    };
    const rb_cli_cmd cmd = {
        CMD, "-m MODEL [options]",
        "An OpenAI-compatible HTTP service on one model: POST /v1/chat/completions\n"
        "and /v1/completions (stream as server-sent events), GET /v1/models,\n"
        "/health and /metrics (Prometheus). A request continues the stored\n"
        "conversation it extends (or the one its \"conversation_id\" names): only\n"
        "new tokens are computed; one that differs earlier forks a new conversation\n"
        "from the shared prefix. Each API key (or Unix peer uid) is a namespace of\n"
        "its own. The sampling options are the defaults of requests that do not\n"
        "set them.",
        opts,
        "example:\n"
        "  rebound serve -m model.gguf --sessions convs &\n"
        "  curl -s localhost:8080/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "       -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello\"}]}'\n",
        NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (!cfg->model_path)
        return rb_cli_usage_error(CMD, "no model given (-m MODEL)",
                                  "rebound make-model --shape tiny -o m.gguf");
    if (cfg->chat_template && rb_chat_template_from_name(cfg->chat_template) < 0) {
        char msg[160], hint[128];
        snprintf(msg, sizeof msg, "unknown --chat-template '%s'", cfg->chat_template);
        snprintf(hint, sizeof hint, "known templates: %s", rb_chat_template_names());
        return rb_cli_usage_error(CMD, msg, hint);
    }
    if (cfg->sp.kv_page_tokens % 32) {
        char msg[128];
        snprintf(msg, sizeof msg, "--kv-page %" PRIu32 " is not a multiple of 32",
                 cfg->sp.kv_page_tokens);
        return rb_cli_usage_error(CMD, msg, "32 (the default), 64, 128, 256 ... 1024");
    }
    /* the library's default is 256; serve's conversations share prompts
       and come back under a budget, where 32-token pages hold and read
       less (docs/benchmarks.md, the page size under the budget) */
    if (!cfg->sp.kv_page_tokens)
        cfg->sp.kv_page_tokens = 32;
    if (max_open < parallel) {
        char msg[128];
        snprintf(msg, sizeof msg, "--max-open %" PRIu32 " is below --parallel %" PRIu32,
                 max_open, parallel);
        return rb_cli_usage_error(CMD, msg, NULL);
    }
    cfg->n_predict = n_predict;
    cfg->mem_budget_bytes = mem_budget;
    cfg->max_conversations = max_conv;
    cfg->max_disk_bytes = max_disk;
    cfg->max_open = max_open;
    cfg->parallel = parallel;
    cfg->max_queue = max_queue;
    cfg->max_stall_ms = max_stall_ms;
    cfg->has_seed = seed_given; /* else each request without a seed gets a random one */
    const char *base = strrchr(cfg->model_path, '/');
    cfg->model_name = alias ? alias : base ? base + 1 : cfg->model_path;

    cfg->host = host;
    cfg->port = port;
    cfg->unix_path = unix_path;
    cfg->keys = lists.keys;
    cfg->n_keys = lists.n_keys;
    cfg->cors = lists.cors;
    cfg->n_cors = lists.n_cors;
    cfg->max_body = max_body;
    cfg->max_conn = max_conn;
    cfg->max_conn_per_peer = max_per_peer;
    cfg->request_timeout_s = request_timeout;
    cfg->max_inflight_bytes = max_inflight;
    cfg->use_mmap = use_mmap;
    if (!unix_path) {
        unsigned char addr[sizeof(struct in6_addr)];
        if (strchr(host, ':') ? inet_pton(AF_INET6, host, addr) != 1
                              : inet_pton(AF_INET, host, addr) != 1)
            return rb_cli_usage_error(CMD, strchr(host, ':') ? "--host is not an IPv6 address"
                                      : "--host is not an IPv4 address (give a number such as "
                                        "127.0.0.1 or 0.0.0.0)", NULL);
    }
    return sv_serve_run(cfg);
}
