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

int rb_cmd_quantize(int argc, char **argv)
{
    const char *pos[3] = {0};
    int n_pos = 0;
    uint64_t threads = 0;
    char types[512];
    snprintf(types, sizeof types, "TYPE: %s", rb_file_kind_names());
    const rb_opt opts[] = {
        {"-t|--threads", RB_OPT_SIZE, "N", "worker threads (default: all cores)", &threads, 0, 64,
         NULL, NULL},
        {0},
    };
    const rb_cli_cmd cmd = {
        "quantize", "IN.gguf OUT.gguf TYPE [-t THREADS]",
        "An F32/F16/BF16 model to one of rebound's file kinds, with llama-quantize's\n"
        "per-tensor rules.", opts, types, pos, 3, &n_pos, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (n_pos > 3)
        return rb_cli_usage_error("quantize", "too many arguments: needs IN.gguf OUT.gguf TYPE",
                                  NULL);
    if (n_pos != 3)
        return rb_cli_usage_error("quantize", "needs IN.gguf OUT.gguf TYPE", NULL);
    const rb_file_kind *kind = rb_file_kind_find(pos[2]);
    if (!kind)
        return rb_cli_usage_error("quantize", "unknown TYPE", rb_file_kind_names());
    if (strcmp(pos[0], pos[1]) == 0)
        return rb_cli_usage_error("quantize", "input and output are the same file", NULL);
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
