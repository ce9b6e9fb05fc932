/*
 * main.c - the `rebound` command: one binary, one subcommand per job.
 * The CLI is where messages are printed; the library never prints.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "rebound.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"run", rb_cmd_run, "generate text from a prompt (llama.cpp's flags)"},
    {"chat", rb_cmd_chat, "interactive multi-turn chat with the model's chat template"},
#ifdef REBOUND_HAVE_SERVE
    {"serve", rb_cmd_serve, "an OpenAI-compatible HTTP service: many conversations, one model"},
#endif
    {"bench", rb_cmd_bench, "prompt-processing and generation speed, as llama-bench"},
    {"demo", rb_cmd_demo, "the app-switch demo on a model it makes itself (or -m MODEL)"},
    {"switch", rb_cmd_switch, "the app-switch experiment: TTFT after memory is taken, per strategy"},
#ifdef REBOUND_HAVE_BENCH_SERVE
    {"bench-serve", rb_cmd_bench_serve, "TTFT of K conversations' returns on an OpenAI-compatible server"},
#endif
    {"bench-pool", rb_cmd_bench_pool, "K conversations under one memory pool: TTFT of each return"},
    {"info", rb_cmd_info, "describe a GGUF model: shape, tensor types, weight and KV bytes"},
    {"make-model", rb_cmd_make_model, "write a synthetic GGUF model of a named or custom shape"},
    {"quantize", rb_cmd_quantize, "quantize an F32/F16/BF16 GGUF model"},
    {"trace", rb_cmd_trace, "record a run's model-file I/O, or import an strace log"},
    {"classify", rb_cmd_classify, "label a trace's blocks SEQ / HOT / LOOP (Algorithm 1)"},
    {"sim", rb_cmd_sim, "replay a trace against cache policies over cache sizes"},
    {"plan", rb_cmd_plan, "capacity model: pinned loop S, hot set and KV share of a pool"},
    {"kvquality", rb_cmd_kvquality, "KV codec quality: logits after a KV round trip vs uncompressed"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: rebound <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`rebound <command> --help` (or `rebound help <command>`) shows a command's "
            "options.\nexit status: 0 success, 1 failure, 2 usage error (unknown command or "
            "option, bad value)\n");
}

double rb_cli_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void rb_cli_cpu_name(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        char *p = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && p) {
            p++;
            while (*p == ' ')
                p++;
            p[strcspn(p, "\n")] = 0;
            snprintf(buf, n, "%s", p);
            break;
        }
    }
    fclose(f);
}

int rb_cli_fail(const char *cmd, const char *msg, const char *hint)
{
    fprintf(stderr, "rebound %s: error: %s\n", cmd, msg);
    if (hint)
        fprintf(stderr, "hint: %s\n", hint);
    return 1;
}

const char *rb_cli_bytes(uint64_t bytes, char *buf, int size)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, (size_t)size, "%.2f GiB", (double)bytes / (1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, (size_t)size, "%.2f MiB", (double)bytes / (1ull << 20));
    else if (bytes >= (1ull << 10))
        snprintf(buf, (size_t)size, "%.2f KiB", (double)bytes / (1ull << 10));
    else
        snprintf(buf, (size_t)size, "%" PRIu64 " B", bytes);
    return buf;
}

const char *rb_cli_grouped(uint64_t v, char *buf, int size)
{
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%" PRIu64, v), j = 0;
    for (int i = 0; i < n && j < size - 1; i++) {
        if (i > 0 && (n - i) % 3 == 0 && j < size - 2)
            buf[j++] = ',';
        buf[j++] = digits[i];
    }
    buf[j] = 0;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("rebound %d.%d.%d\n", REBOUND_VERSION_MAJOR, REBOUND_VERSION_MINOR,
               REBOUND_VERSION_PATCH);
        return 0;
    }
    const char *name = argv[1];
    int is_help = strcmp(name, "help") == 0;
    if (is_help && (argc == 2 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (is_help)
        name = argv[2];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) != 0)
            continue;
        if (is_help) { /* `rebound help run` is `rebound run --help` */
            char *args[] = {(char *)commands[i].name, "--help", NULL};
            return commands[i].run(2, args);
        }
        return commands[i].run(argc - 1, argv + 1);
    }
#ifndef REBOUND_HAVE_SERVE
    if (!strcmp(name, "serve"))
        return rb_cli_fail("serve", "this rebound was built without serve: libmicrohttpd and "
                           "jansson were not found when cmake ran",
                           "scripts/deps.sh installs them (Debian: libmicrohttpd-dev "
                           "libjansson-dev), then run cmake -B build again");
#endif
#ifndef REBOUND_HAVE_BENCH_SERVE
    if (!strcmp(name, "bench-serve"))
        return rb_cli_fail("bench-serve", "this rebound was built without bench-serve: libcurl "
                           "and jansson were not found when cmake ran",
                           "scripts/deps.sh installs them (Debian: libcurl4-openssl-dev "
                           "libjansson-dev), then run cmake -B build again");
#endif
    fprintf(stderr, "rebound: unknown command '%s'\n\n", name);
    usage(stderr);
    return 2;
}
