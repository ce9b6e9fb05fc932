/*
 * cmd_quantize.c - `rebound quantize IN.gguf OUT.gguf TYPE`: a user's
 * F32/F16/BF16 model to one of rebound's file kinds, with llama-quantize's
 * per-tensor rules. Tool subcommand: drives the internal convert module.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "convert.h"
#include "progress.h"

static void print_usage(FILE *f)
{
    fprintf(f, "usage: rebound quantize IN.gguf OUT.gguf TYPE [-t THREADS]\n"
               "  TYPE: %s\n", rb_file_kind_names());
}

int rb_cmd_quantize(int argc, char **argv)
{
    const char *pos[3] = {0};
    int n_pos = 0;
    uint64_t threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            print_usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "-t") == 0 || strcmp(argv[i], "--threads") == 0) {
            if (i + 1 >= argc || rb_cli_parse_u64(argv[++i], &threads) != 0 || threads > 64)
                return rb_cli_fail("quantize", "-t needs a thread count (1..64)", NULL);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            print_usage(stderr);
            return rb_cli_fail("quantize", "unknown option", argv[i]);
        } else if (n_pos < 3) {
            pos[n_pos++] = argv[i];
        } else {
            print_usage(stderr);
            return rb_cli_fail("quantize", "too many arguments", NULL);
        }
    }
    if (n_pos != 3) {
        print_usage(stderr);
        return rb_cli_fail("quantize", "needs IN.gguf OUT.gguf TYPE", NULL);
    }
    const rb_file_kind *kind = rb_file_kind_find(pos[2]);
    if (!kind)
        return rb_cli_fail("quantize", "unknown TYPE", rb_file_kind_names());
    if (strcmp(pos[0], pos[1]) == 0)
        return rb_cli_fail("quantize", "input and output are the same file", NULL);
    if (threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (uint64_t)n : 1;
    }
    rb_cli_progress prog;
    rb_cli_progress_init(&prog, "quantize");
    rb_convert_hooks hooks = {rb_cli_progress_update, rb_cli_progress_note, &prog, 0, 0};
    rb_error err;
    rb_status st = rb_quantize_file(pos[0], pos[1], kind, (int)threads, &hooks, &err);
    rb_cli_progress_done(&prog);
    if (st != RB_OK)
        return rb_cli_fail("quantize", err.message, NULL);
    printf("wrote %s (%s)\n", pos[1], kind->name);
    return 0;
}
