/*
 * serve.h - the face of serve/, the library rebound_serve: an
 * OpenAI-compatible HTTP service over one model, many conversations (see
 * config.h for the files inside and their direction, docs/ARCHITECTURE.md
 * for its threads). The CLI's `rebound serve` fills an sv_config from its
 * options and calls sv_serve_run.
 */
#ifndef RB_SERVE_SERVE_H
#define RB_SERVE_SERVE_H

#include "config.h"

/* Runs the service until SIGINT or SIGTERM: opens the model, starts the
 * scheduler and the HTTP daemon, waits for the signal (blocked in every
 * thread of the service), then ends the running requests (their
 * conversations saved) and stops. cfg is borrowed for the call. 0 after
 * a signal; 1 after logging why it could not start. Call it from a
 * process's main thread, once at a time (it blocks SIGINT and SIGTERM in
 * the calling thread and ignores SIGPIPE). */
int sv_serve_run(const sv_config *cfg);

#endif
