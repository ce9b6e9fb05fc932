/*
 * cli_trace.c - `--trace FILE` of `rebound run` and `rebound bench` (and so
 * of `rebound trace -- rebound run|bench`): a trace writer attached to the
 * model as its observer for the run, closed at its end.
 */
#include "cli.h"
#include "model.h"
#include "trace.h"

int rb_cli_trace_attach(const char *cmd, rb_model *model, const char *model_path,
                        const char *path, struct rb_trace_writer **out)
{
    rb_error err;
    rb_trace_writer *w = NULL;
    if (rb_trace_writer_open(path, &w, &err) != RB_OK)
        return rb_cli_fail(cmd, err.message, NULL);
    if (rb_trace_writer_attach_model(w, model, model_path) != RB_OK) {
        rb_trace_writer_close(w, NULL);
        return rb_cli_fail(cmd, rb_model_errmsg(model), NULL);
    }
    *out = w;
    return 0;
}

int rb_cli_trace_detach(const char *cmd, struct rb_trace_writer *w)
{
    rb_error err;
    if (w && rb_trace_writer_close(w, &err) != RB_OK)
        return rb_cli_fail(cmd, err.message, NULL);
    return 0;
}
