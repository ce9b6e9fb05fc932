/*
 * cmd_trace.c - `rebound trace`: make a block-level trace of model-file I/O
 * (format in tools/analysis/trace.h), three ways:
 *   - of a rebound run: `rebound trace -o FILE -- rebound run|bench ARGS`
 *     runs the command in this process with `--trace FILE` (the same as
 *     passing --trace to run or bench);
 *   - of any other program: `rebound trace -o FILE -- PROGRAM ARGS` runs it
 *     under strace (when installed) and imports the log;
 *   - from a saved log: `rebound trace --import-strace LOG -o FILE`.
 * Also `--synthetic` writes a made-up model app's trace (load scan + hot
 * set + loop) for trying classify and sim without a model.
 * A tool subcommand: it uses the internal headers of trace and model. The
 * --trace of run and bench is cli_trace.c (so that run and bench, which
 * this command runs, do not depend on it).
 */
#include <errno.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "trace.h"
#include "trace_strace.h"

extern char **environ;

/* Prints the skipped lines of a lenient parse. */
static void print_diag(const char *cmd, const char *path, const rb_trace_diag *d)
{
    if (!d->n_bad)
        return;
    for (uint64_t i = 0; i < d->n_bad && i < RB_TRACE_DIAG_KEEP; i++)
        fprintf(stderr, "rebound %s: warning: %s:%" PRIu64 ": %s (skipped)\n", cmd, path,
                d->bad_line[i], d->bad_why[i]);
    if (d->n_bad > RB_TRACE_DIAG_KEEP)
        fprintf(stderr, "rebound %s: warning: ... %" PRIu64 " malformed lines in all\n", cmd,
                d->n_bad);
}

static int import_log(const char *log, const char *only, const char *out)
{
    rb_trace t;
    rb_trace_init(&t);
    rb_trace_diag d;
    rb_strace_stats ss;
    rb_error err;
    rb_status st = rb_trace_import_strace(log, only, &t, &d, &ss, &err);
    print_diag("trace", log, &d);
    if (st != RB_OK) {
        rb_trace_free(&t);
        return rb_cli_fail("trace", err.message, NULL);
    }
    char note[256];
    snprintf(note, sizeof note, "imported from strace log %s; mmap'ed files' page faults are "
             "not visible in strace (%" PRIu64 " mmap calls of traced files)", log, ss.n_mmaps);
    st = rb_trace_write(&t, out, note, &err);
    if (st == RB_OK)
        fprintf(stderr, "rebound trace: %" PRIu64 " lines, %" PRIu64 " opens, %" PRIu64
                " reads, %" PRIu64 " preads, %" PRIu64 " lseeks, %" PRIu64 " mmaps of traced "
                "files (faults not traced); %zu records of %" PRIu32 " files -> %s\n",
                d.n_lines, ss.n_opens, ss.n_reads, ss.n_preads, ss.n_lseeks, ss.n_mmaps,
                t.n_recs, t.n_files, out);
    rb_trace_free(&t);
    return st == RB_OK ? 0 : rb_cli_fail("trace", err.message, NULL);
}

static int is_rebound(const char *argv0)
{
    const char *b = strrchr(argv0, '/');
    b = b ? b + 1 : argv0;
    return strcmp(b, "rebound") == 0;
}

/* Runs argv under strace into a temporary log, then imports it. */
static int trace_program(char **argv, const char *only, const char *out)
{
    char log[4096];
    snprintf(log, sizeof log, "%s.strace", out);
    char *args[64 + 16];
    int n = 0;
    args[n++] = "strace";
    args[n++] = "-f";
    args[n++] = "-tt";
    args[n++] = "-e";
    args[n++] = "trace=open,openat,read,pread64,lseek,mmap,close,dup,dup2,dup3";
    args[n++] = "-o";
    args[n++] = log;
    args[n++] = "--";
    for (int i = 0; argv[i]; i++) {
        if (n >= 64 + 15)
            return rb_cli_fail("trace", "too many arguments for the traced program", NULL);
        args[n++] = argv[i];
    }
    args[n] = NULL;
    pid_t pid;
    int rc = posix_spawnp(&pid, "strace", NULL, NULL, args, environ);
    if (rc != 0)
        return rb_cli_fail("trace", "cannot run strace (is it installed?)",
                           "apt-get install strace, or record with `rebound run --trace FILE`");
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(stderr, "rebound trace: warning: the traced program exited with status %d\n",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    rc = import_log(log, only, out);
    if (rc == 0)
        fprintf(stderr, "rebound trace: the strace log is kept in %s\n", log);
    return rc;
}

static int synthetic(const char *out, uint64_t loop, uint64_t hot, uint64_t tokens, uint64_t seed)
{
    rb_trace t;
    rb_trace_init(&t);
    rb_error err;
    rb_status st = rb_trace_synth(&t, loop, hot, (uint32_t)tokens, seed, &err);
    if (st == RB_OK)
        st = rb_trace_write(&t, out, "synthetic model app: load scan, hot set, weight loop", &err);
    if (st == RB_OK)
        fprintf(stderr, "rebound trace: synthetic trace of %zu records -> %s\n", t.n_recs, out);
    rb_trace_free(&t);
    return st == RB_OK ? 0 : rb_cli_fail("trace", err.message, NULL);
}

int rb_cmd_trace(int argc, char **argv)
{
    const char *out = NULL, *log = NULL, *only = NULL;
    int is_synth = 0, cmd_at = 0;
    uint64_t loop = 64ull << 20, hot = 2ull << 20, tokens = 8, seed = 1;
    const rb_opt opts[] = {
        {"-o|--output", RB_OPT_STR, "FILE", "the trace to write (format: tools/analysis/trace.h)",
         &out, 0, 0, NULL, NULL},
        {"--import-strace", RB_OPT_STR, "LOG",
         "`strace -f -tt -e trace=openat,read,pread64,lseek,mmap,close` output;\n"
         "descriptors are followed to files", &log, 0, 0, NULL, NULL},
        {"--only", RB_OPT_STR, "SUBSTR", "keep only files whose path contains SUBSTR", &only, 0,
         0, NULL, NULL},
        {"--synthetic", RB_OPT_FLAG, NULL,
         "a synthetic model app's trace: load scan, hot set, weight loop", &is_synth, 0, 0, NULL,
         NULL},
        {"--loop", RB_OPT_SIZE, "BYTES", "--synthetic: the weight loop per token (default 64M)",
         &loop, 1, 1e19, NULL, NULL},
        {"--hot", RB_OPT_SIZE, "BYTES", "--synthetic: the hot set (default 2M, at least 4K)", &hot,
         4096, 1e19, NULL, NULL},
        {"--tokens", RB_OPT_SIZE, "N", "--synthetic: tokens (default 8)", &tokens, 0, 100000,
         NULL, NULL},
        {"--seed", RB_OPT_SIZE, "N", "--synthetic: seed (default 1)", &seed, 0, 0, NULL, NULL},
        {0},
    };
    const rb_cli_cmd cli = {
        "trace",
        "-o FILE -- rebound run|bench ARGS...   trace a rebound run\n"
        "-o FILE -- PROGRAM ARGS...             trace any program (strace)\n"
        "--import-strace LOG -o FILE [--only SUBSTR]\n"
        "--synthetic -o FILE [--loop 64M] [--hot 2M] [--tokens 8] [--seed 1]",
        "A rebound run holds its weights in RAM after the load: per token the trace\n"
        "records the weight ranges the forward pass reads (what a weight cache would\n"
        "see), not page faults.",
        opts, NULL, NULL, 0, NULL, &cmd_at,
    };
    int rc0 = rb_cli_parse(&cli, argc, argv);
    if (rc0 >= 0)
        return rc0;
    if (!out)
        return rb_cli_usage_error("trace", "no output given (-o FILE)", NULL);
    if (!!log + is_synth + !!cmd_at != 1)
        return rb_cli_usage_error("trace", "give exactly one of --import-strace LOG, --synthetic, "
                                  "or -- COMMAND ARGS", NULL);
    if (log)
        return import_log(log, only, out);
    if (is_synth)
        return synthetic(out, loop, hot, tokens, seed);
    if (cmd_at >= argc)
        return rb_cli_usage_error("trace", "no command after --", NULL);
    char **cmd = argv + cmd_at;
    int n = argc - cmd_at;
    if (is_rebound(cmd[0]) && n >= 2 && (!strcmp(cmd[1], "run") || !strcmp(cmd[1], "bench"))) {
        /* the same process: argv without "rebound", plus --trace FILE */
        char **args = malloc((size_t)(n + 2) * sizeof *args);
        if (!args)
            return rb_cli_fail("trace", "out of memory", NULL);
        for (int i = 1; i < n; i++)
            args[i - 1] = cmd[i];
        args[n - 1] = "--trace";
        args[n] = (char *)out;
        args[n + 1] = NULL;
        int rc = !strcmp(cmd[1], "run") ? rb_cmd_run(n + 1, args) : rb_cmd_bench(n + 1, args);
        free(args);
        if (rc == 0)
            fprintf(stderr, "rebound trace: trace written to %s\n", out);
        return rc;
    }
    return trace_program(cmd, only, out);
}

int rb_cli_load_trace(const char *cmd, const char *path, rb_trace *t, rb_block_stream *s)
{
    rb_trace_diag d;
    rb_error err;
    rb_status st = rb_trace_read(path, t, &d, &err);
    print_diag(cmd, path, &d);
    if (st != RB_OK)
        return rb_cli_fail(cmd, err.message, st == RB_E_FORMAT && d.n_lines > 0 &&
                           strstr(err.message, "line 1") ?
                           "an strace log: `rebound trace --import-strace LOG -o TRACE` first" : NULL);
    if (rb_block_stream_build(t, s, &err) != RB_OK) {
        rb_trace_free(t);
        return rb_cli_fail(cmd, err.message, NULL);
    }
    return 0;
}
