/*
 * session_tool.c - a helper of tests/cli/cli_session.sh (not a test): puts
 * a chat record of the caller's choosing into a session file through the
 * public API, so that the CLI can be tried on a record whose checksums are
 * valid but whose turns are not (what a crafted file holds).
 *
 *   session_tool chat-record MODEL FILE N_CTX N_SYSTEM [TURN_START...]
 *   session_tool tokens MODEL FILE N_CTX
 *
 * tokens prints a session file's tokens (decimal, one line, space
 * separated): what cli_serve_reuse.sh feeds a fresh session with.
 *
 * The record's layout is `rebound chat`'s (app/cmd_chat.c, save_chat).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rebound.h"

int main(int argc, char **argv)
{
    int is_tokens = argc == 5 && !strcmp(argv[1], "tokens");
    if (!is_tokens && (argc < 6 || strcmp(argv[1], "chat-record") != 0)) {
        fprintf(stderr, "usage: %s chat-record MODEL FILE N_CTX N_SYSTEM [TURN_START...]\n"
                "       %s tokens MODEL FILE N_CTX\n", argv[0], argv[0]);
        return 2;
    }
    rb_error err;
    rb_model *m = NULL;
    if (rb_model_open(argv[2], NULL, &m, &err) != RB_OK) {
        fprintf(stderr, "session_tool: %s\n", err.message);
        return 1;
    }
    rb_session_params p = rb_session_default_params();
    p.n_ctx = (uint32_t)strtoul(argv[4], NULL, 10);
    rb_session *s = NULL;
    if (rb_session_open_saved(m, &p, argv[3], &s, &err) != RB_OK) {
        fprintf(stderr, "session_tool: %s\n", err.message);
        rb_model_close(m);
        return 1;
    }
    if (is_tokens) {
        const int32_t *t = rb_session_get_tokens(s);
        for (size_t i = 0; i < rb_session_n_tokens(s); i++)
            printf("%s%d", i ? " " : "", (int)t[i]);
        printf("\n");
        rb_session_destroy(s);
        rb_model_close(m);
        return 0;
    }
    uint64_t nt = (uint64_t)(argc - 6), ns = strtoull(argv[5], NULL, 10);
    size_t n = 24 + 8 * nt + sizeof(rb_sampler_state);
    uint8_t *b = calloc(1, n);
    uint32_t ver = 1;
    memcpy(b, "RBCH", 4);
    memcpy(b + 4, &ver, 4);
    memcpy(b + 8, &ns, 8);
    memcpy(b + 16, &nt, 8);
    for (uint64_t i = 0; i < nt; i++) {
        uint64_t v = strtoull(argv[6 + i], NULL, 10);
        memcpy(b + 24 + 8 * i, &v, 8);
    }
    int rc = rb_session_set_blob(s, b, n) != RB_OK || rb_session_save(s, argv[3], 0) != RB_OK;
    if (rc)
        fprintf(stderr, "session_tool: %s\n", rb_session_errmsg(s));
    free(b);
    rb_session_destroy(s);
    rb_model_close(m);
    return rc;
}
