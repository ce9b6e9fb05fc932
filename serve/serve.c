/*
 * serve.c - runs `rebound serve` (serve.h): the model, the metrics, the
 * scheduler (scheduler.c) and the HTTP side (http.c), in that order, and stops
 * them in the reverse order after SIGINT or SIGTERM. The objects live on
 * this function's stack and are passed down; nothing is global.
 */
#include <signal.h>
#include <stdio.h>

#include "http.h"
#include "serve.h"

int sv_serve_run(const sv_config *cfg)
{
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = cfg->use_mmap;
    rb_model *model = NULL;
    if (rb_model_open(cfg->model_path, &mp, &model, &err) != RB_OK) {
        sv_log("error: %s", err.message);
        return 1;
    }
    rb_model_info mi;
    rb_model_get_info(model, &mi);
    if (cfg->sp.n_ctx > mi.n_ctx_train && mi.n_ctx_train > 0)
        sv_log("warning: context %u exceeds the model's trained context %u; quality may degrade",
               (unsigned)cfg->sp.n_ctx, (unsigned)mi.n_ctx_train);
    sv_metrics metrics;
    sv_metrics_init(&metrics);

    /* the signals that stop the server go to this thread alone (sigwait);
       the threads started below inherit the mask */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 1;
    sv_http *http = NULL;
    sv_sched *sched = sv_sched_start(cfg, model, &metrics);
    if (!sched)
        goto done;
    if (!(http = sv_http_start(cfg, sched, &metrics)))
        goto done;
    if (!cfg->sessions_dir)
        sv_log("note: no --sessions folder: conversations live in RAM only and end with the "
               "server");
    int sig = 0;
    sigwait(&sigs, &sig);
    sv_log("%s: stopping (running requests end; conversations are saved)",
           sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
done:
    /* the scheduler first: it ends the waiting handlers, so that the
       daemon's connection threads can be joined */
    sv_sched_stop(sched);
    sv_http_stop(http);
    sv_sched_free(sched);
    sv_metrics_deinit(&metrics);
    rb_model_close(model);
    return rc;
}
