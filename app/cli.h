/* cli.h - the rebound command's subcommands and the helpers they share. */
#ifndef RB_CLI_H
#define RB_CLI_H

#include <stdint.h>

int rb_cmd_info(int argc, char **argv);
int rb_cmd_make_model(int argc, char **argv);
int rb_cmd_quantize(int argc, char **argv);
int rb_cmd_run(int argc, char **argv);
int rb_cmd_bench(int argc, char **argv);

/* Prints "rebound <cmd>: error: <msg>" (and "hint: <hint>" when given) to
 * stderr; returns the exit status for errors (1). */
int rb_cli_fail(const char *cmd, const char *msg, const char *hint);

/* Parses an unsigned integer with an optional K/M/G suffix (powers of
 * 1024); 0 on success, -1 when not a number or out of range. */
int rb_cli_parse_u64(const char *s, uint64_t *out);

/* "1.23 GiB" style, into buf. */
const char *rb_cli_bytes(uint64_t bytes, char *buf, int size);

/* Thousands-grouped decimal ("1,171,200"), into buf. */
const char *rb_cli_grouped(uint64_t v, char *buf, int size);

#endif
