/*
 * cmd_serve.c - `rebound serve`: the options of the HTTP service into an
 * sv_config, checked before anything loads, then serve/'s sv_serve_run
 * (the module: serve/serve.h). Built only with libmicrohttpd and jansson.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "serve.h"

#define CMD "serve"

static int opt_api_key(void *dest, const char *v, char *why, size_t why_n)
{
    if (!*v || strlen(v) > 1024) {
        snprintf(why, why_n, "a key of 1 to 1024 characters");
        return -1;
    }
    *(const char **)dest = v;
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
    uint64_t max_body = 4u << 20, mem_budget = 0, max_disk = 0;
    uint32_t max_conv = 64, max_open = 4, parallel = 4, max_queue = 64, max_conn = 64;
    int64_t n_predict = -1;
    cfg->sp = rb_session_default_params();
    cfg->sampler = rb_sampler_default_params();
    const char *api_key = NULL;
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
        {"--api-key", RB_OPT_CALL, "KEY", "require Authorization: Bearer KEY on /v1/* (compared "
         "in constant time)", &api_key, 0, 0, opt_api_key, NULL},
        {"--max-body", RB_OPT_SIZE, "BYTES", "largest request body (K/M/G; default 4M): 413 beyond",
         &max_body, 1, 1e12, NULL, NULL},
        {"--max-connections", RB_OPT_U32, "N", "connections served at once (default 64); a few "
         "more hear 503,\nthe rest are refused", &max_conn, 1, 4096, NULL, NULL},
        {"-np|--parallel", RB_OPT_U32, "N", "requests computed at once (default 4): their decode "
         "steps run\nas one forward pass, their prompts in chunks between the steps", &parallel, 1, 256, NULL, NULL},
        {"--max-queue", RB_OPT_U32, "N", "requests waiting beyond those (default 64): 429 beyond",
         &max_queue, 0, 1e6, NULL, NULL},
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
        {"--chat-template|--template", RB_OPT_STR, "NAME", "chat format (default: the model's)",
         &cfg->chat_template, 0, 0, NULL, NULL},
        {"-n|--n-predict", RB_OPT_I64, "N", "default max_tokens (default -1: until the model "
         "ends or the context is full)", &n_predict, -1, 9.2e18, NULL, NULL},
        {"--mmap", RB_OPT_FLAG, NULL, "map the model file instead of reading it", &use_mmap, 0, 0,
         NULL, NULL},
        {NULL, RB_OPT_SECTION, NULL, "each conversation's session:", NULL, 0, 0, NULL, NULL},
        {"-c|--ctx-size", RB_OPT_U32, "N", "context length (default: the model's trained context)",
         &cfg->sp.n_ctx, 0, 0, NULL, NULL},
        {"-b|--batch-size", RB_OPT_CALL, "N", "prefill chunk (default 128): a long prompt is "
         "computed in\nchunks between the other requests' tokens", &cfg->sp.n_batch, 0, 0,
         rb_cli_opt_batch, NULL},
        {"-t|--threads", RB_OPT_INT, "N", "threads (default: all cores)", &cfg->sp.n_threads, 0,
         256, NULL, NULL},
        {"--device", RB_OPT_CALL, "D", "storage profile for the memory manager: phone, watch, host",
         &cfg->sp, 0, 0, rb_cli_opt_device, NULL},
        {"-ctk|--cache-type-k", RB_OPT_CALL, "T", "KV cache type of K: f16 (default), q8_0, q4_0",
         &cfg->sp.kv_type_k, 0, 0, rb_cli_opt_kv_type, NULL},
        {"-ctv|--cache-type-v", RB_OPT_CALL, "T", "the same for V", &cfg->sp.kv_type_v, 0, 0,
         rb_cli_opt_kv_type, NULL},
        {"--spill-dir", RB_OPT_STR, "DIR", "where evicted KV goes on storage (default $TMPDIR or "
         "/tmp)", &cfg->sp.spill_dir, 0, 0, NULL, NULL},
        RB_CLI_SAMPLER_OPTS(&cfg->sampler, &seed_given),
        {0},
    };
    const rb_cli_cmd cmd = {
        CMD, "-m MODEL [options]",
        "An OpenAI-compatible HTTP service on one model: POST /v1/chat/completions\n"
        "and /v1/completions (stream as server-sent events), GET /v1/models,\n"
        "/health and /metrics (Prometheus). A request continues the stored\n"
        "conversation that shares the longest token prefix with it (or the one its\n"
        "\"conversation_id\" names): only new tokens are computed. The sampling\n"
        "options are the defaults of requests that do not set them.",
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
    cfg->has_seed = seed_given; /* else each request without a seed gets a random one */
    const char *base = strrchr(cfg->model_path, '/');
    cfg->model_name = alias ? alias : base ? base + 1 : cfg->model_path;

    cfg->host = host;
    cfg->port = port;
    cfg->unix_path = unix_path;
    cfg->api_key = api_key;
    cfg->max_body = max_body;
    cfg->max_conn = max_conn;
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
