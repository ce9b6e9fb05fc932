/* cli.h - the rebound command's subcommands and the helpers they share. */
#ifndef RB_CLI_H
#define RB_CLI_H

#include <stdint.h>

#include "rebound.h"

int rb_cmd_info(int argc, char **argv);
int rb_cmd_make_model(int argc, char **argv);
int rb_cmd_quantize(int argc, char **argv);
int rb_cmd_run(int argc, char **argv);
int rb_cmd_chat(int argc, char **argv);
int rb_cmd_bench(int argc, char **argv);
/* bench --weights-budget ...: decode under a weight budget (cmd_bench_stream.c) */
int rb_cmd_bench_stream(int argc, char **argv);
int rb_cmd_switch(int argc, char **argv);
int rb_cmd_demo(int argc, char **argv);
int rb_cmd_trace(int argc, char **argv);
int rb_cmd_classify(int argc, char **argv);
int rb_cmd_sim(int argc, char **argv);
int rb_cmd_plan(int argc, char **argv);
int rb_cmd_kvquality(int argc, char **argv);

/* --trace FILE of run/bench (cmd_trace.c): opens a trace writer on path and
 * attaches it to model (file recorded as model_path); detach closes it.
 * Both print their error and return 1 on failure, else 0. */
struct rb_trace_writer;
int rb_cli_trace_attach(const char *cmd, rb_model *model, const char *model_path,
                        const char *path, struct rb_trace_writer **out);
int rb_cli_trace_detach(const char *cmd, struct rb_trace_writer *w);

/* Reads a trace file (tools/analysis/trace.h), prints its malformed lines as warnings
 * with their line numbers, and expands it to 4 KiB block accesses; prints
 * the error and returns 1 when nothing usable is left (cmd_trace.c). */
struct rb_trace;
struct rb_block_stream;
int rb_cli_load_trace(const char *cmd, const char *path, struct rb_trace *t,
                      struct rb_block_stream *s);

/* CLOCK_MONOTONIC in seconds (main.c). */
double rb_cli_now_s(void);

/* Prints "rebound <cmd>: error: <msg>" (and "hint: <hint>" when given) to
 * stderr; returns the exit status for errors (1). */
int rb_cli_fail(const char *cmd, const char *msg, const char *hint);

/* Parses an unsigned integer with an optional K/M/G suffix (powers of
 * 1024); 0 on success, -1 when not a number or out of range. */
int rb_cli_parse_u64(const char *s, uint64_t *out);

/* A session's memory by category and tier, and its last restore
 * (cli_stats.c). */
#include <stdio.h>
void rb_cli_print_stats(FILE *f, const rb_session_stats *stats);
/* cli_opts.c. "pipelined|eager|recompute" and "lossless|q8|lz4|zstd";
 * -1 when unknown. */
int rb_cli_parse_restore(const char *s);
int rb_cli_parse_ram_codec(const char *s);
/* The flags run and chat share: each returns 1 when o is one of its flags
 * (v is its value: the caller skips it; *bad is set when v is not valid),
 * 0 otherwise. session: -c -b -t --device --spill-dir --mem-budget
 * --restore --ram-codec into p; sampler: --temp --top-k --top-p --min-p
 * --repeat-penalty --repeat-last-n --seed into sp. */
int rb_cli_session_opt(const char *o, const char *v, rb_session_params *p, int *bad);
int rb_cli_sampler_opt(const char *o, const char *v, rb_sampler_params *sp, int *bad);
/* Warns on stderr when n_ctx exceeds the model's trained context. */
void rb_cli_warn_ctx(const char *cmd, rb_model *model, uint32_t n_ctx);

/* "1.23 GiB" style, into buf. */
const char *rb_cli_bytes(uint64_t bytes, char *buf, int size);

/* Thousands-grouped decimal ("1,171,200"), into buf. */
const char *rb_cli_grouped(uint64_t v, char *buf, int size);

#endif
