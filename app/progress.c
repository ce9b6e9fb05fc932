/* progress.c - see progress.h. */
#include <stdio.h>
#include <unistd.h>

#include "progress.h"

void rb_cli_progress_init(rb_cli_progress *p, const char *cmd)
{
    p->cmd = cmd;
    p->is_tty = isatty(2);
    p->last_permille = -1;
    p->is_line_open = 0;
}

void rb_cli_progress_update(void *ctx, uint64_t done, uint64_t total)
{
    rb_cli_progress *p = ctx;
    if (!p->is_tty || total == 0)
        return;
    int permille = (int)(done * 1000 / total);
    if (permille == p->last_permille)
        return;
    p->last_permille = permille;
    fprintf(stderr, "\r%s: %5.1f%% (%.0f of %.0f MiB)", p->cmd, permille / 10.0,
            (double)done / (1 << 20), (double)total / (1 << 20));
    p->is_line_open = 1;
}

void rb_cli_progress_note(void *ctx, const char *message)
{
    rb_cli_progress *p = ctx;
    if (p->is_line_open)
        fputc('\n', stderr);
    p->is_line_open = 0;
    fprintf(stderr, "%s: note: %s\n", p->cmd, message);
}

void rb_cli_progress_done(rb_cli_progress *p)
{
    if (p->is_line_open)
        fputc('\n', stderr);
    p->is_line_open = 0;
}
