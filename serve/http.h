/*
 * http.h - the HTTP side of `rebound serve`: libmicrohttpd's daemon on a
 * TCP address (loopback by default) or a Unix socket, its connection
 * threads (one per connection), routing, the API key, the body, server-
 * sent events, /metrics.
 *
 * Threads: sv_http_start and sv_http_stop on the thread that runs the
 * service; the handlers on libmicrohttpd's connection threads, each with
 * its connection's state (the context pointer) and the server's sv_http
 * (the callbacks' closure), whose counters are under its mu.
 */
#ifndef RB_SERVE_HTTP_H
#define RB_SERVE_HTTP_H

#include "config.h"
#include "metrics.h"
#include "scheduler.h"

typedef struct sv_http sv_http;

/* Listens (cfg->host and port, or cfg->unix_path) and serves requests
 * into sched (borrowed, like cfg and metrics, until sv_http_stop). NULL
 * after logging why. */
sv_http *sv_http_start(const sv_config *cfg, sv_sched *sched, sv_metrics *metrics);
/* Stops the daemon (joins its threads; the scheduler must have been
 * stopped first so that no handler waits for it), closes and unlinks the
 * Unix socket, frees. NULL: no-op. */
void sv_http_stop(sv_http *h);

#endif
