/*
 * progress.h - a progress line for long CLI jobs: "\r<cmd>: 45% (273 of 606
 * MiB)" on a terminal, nothing when stderr is not a TTY (logs stay clean).
 * Notes (type fallbacks) are printed on their own line either way.
 */
#ifndef RB_CLI_PROGRESS_H
#define RB_CLI_PROGRESS_H

#include <stdint.h>

typedef struct rb_cli_progress {
    const char *cmd;
    int is_tty;
    int last_permille;
    int is_line_open;
} rb_cli_progress;

void rb_cli_progress_init(rb_cli_progress *p, const char *cmd);
void rb_cli_progress_update(void *ctx, uint64_t done_bytes, uint64_t total_bytes);
void rb_cli_progress_note(void *ctx, const char *message);
void rb_cli_progress_done(rb_cli_progress *p);

#endif
