/*
 * test_session_trim.c - the promises of rb_session_trim from another
 * thread (include/rebound.h): a failed trim never changes what
 * rb_session_errmsg returns to the thread using the session; a trim
 * posted while the session is held returns the status it failed with
 * when served (it was dropped: RB_OK); every failed trim is counted in
 * the stats (trim_failures, trim_status).
 *
 * How a trim is made to fail: session_debug.h rebuilds the residency
 * manager over a new store with a RAM codec it refuses, which leaves the
 * session without one ("session: no memory manager" from every trim);
 * the session is not fed after that.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "rebound.h"
#include "session_debug.h"
#include "testlib.h"

static char model_path[512];

typedef struct trimmer {
    rb_session *s;
    rb_status st;
    char msg[RB_ERROR_MESSAGE_MAX];
} trimmer;

static void *trim_thread(void *arg)
{
    trimmer *t = arg;
    t->st = rb_session_trim(t->s, 0, RB_TRIM_MODERATE, NULL);
    snprintf(t->msg, sizeof t->msg, "%s", rb_session_errmsg(t->s));
    return NULL;
}

int main(void)
{
    rb_test_tmp_path(model_path, sizeof model_path, "test_session_trim", "m.gguf");
    CHECK_EQ_INT(rb_test_make_model(model_path, &(rb_test_model_spec){
                                                    .n_embd = 128, .n_layers = 4, .n_head = 4,
                                                    .n_head_kv = 2, .n_ff = 256, .n_vocab = 512,
                                                    .n_ctx = 1024, .seed = 7}),
                 RB_OK);
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return check_report();
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 1024;
    p.n_threads = 1;
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s) {
        rb_model_close(m);
        return check_report();
    }
    int32_t toks[300];
    for (int i = 0; i < 300; i++)
        toks[i] = (i * 37 + 11) % 512;
    CHECK_EQ_INT(rb_session_feed(s, toks, 300, NULL), RB_OK);
    /* a trim that succeeds leaves no message and no failure */
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_MODERATE, NULL), RB_OK);
    rb_session_stats st;
    CHECK_EQ_INT(rb_session_get_stats(s, &st), RB_OK);
    CHECK_EQ_INT(st.trim_failures, 0);

    /* this thread's failed call: its message */
    int32_t bad = 100000;
    CHECK_EQ_INT(rb_session_feed(s, &bad, 1, NULL), RB_E_INVALID_ARG);
    char mine[RB_ERROR_MESSAGE_MAX];
    snprintf(mine, sizeof mine, "%s", rb_session_errmsg(s));
    CHECK_CONTAINS(mine, "outside the vocabulary");

    /* from here every trim fails */
    rb_store_params sp = rb_store_default_params();
    sp.dir = REBOUND_TEST_TMP;
    rb_store *store = NULL;
    CHECK_EQ_INT(rb_store_open(&sp, &store, &err), RB_OK);
    rb_residency_params rp = {.restore = RB_RESTORE_PIPELINED, .ram_codec = (rb_ram_codec)99,
                              .decode_bytes_per_s = 1e9, .storage_bytes_per_s = 1e9};
    CHECK(rb_session_debug_swap_store(s, store, &rp, &err) != RB_OK);
    CHECK(rb_session_debug_residency(s) == NULL);

    /* 1. another thread trims the idle session: its status and message
       are its own; this thread's message stays */
    trimmer t = {.s = s};
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, trim_thread, &t), 0);
    pthread_join(th, NULL);
    CHECK_EQ_INT(t.st, RB_E_INVALID_ARG);
    CHECK_CONTAINS(t.msg, "no memory manager");
    CHECK_STR_EQ(rb_session_errmsg(s), mine);

    /* 2. the session is held (as by a feed): the other thread's trim is
       posted, and served when this thread lets go; the poster gets the
       failure, this thread keeps its message */
    rb_session_debug_hold(s);
    memset(&t, 0, sizeof t);
    t.s = s;
    CHECK_EQ_INT(pthread_create(&th, NULL, trim_thread, &t), 0);
    /* the trim is posted and waits (it keeps trying to take the session) */
    nanosleep(&(struct timespec){0, 200 * 1000000L}, NULL);
    rb_session_debug_release(s); /* serves it */
    pthread_join(th, NULL);
    CHECK_EQ_INT(t.st, RB_E_INVALID_ARG);
    CHECK_CONTAINS(t.msg, "no memory manager");
    CHECK_STR_EQ(rb_session_errmsg(s), mine);

    /* 3. the pool's trims have no caller: counted in the stats */
    CHECK_EQ_INT(rb_session_get_stats(s, &st), RB_OK);
    CHECK_EQ_INT(st.trim_failures, 2);
    CHECK_EQ_INT(st.trim_status, RB_E_INVALID_ARG);

    /* this thread's own next call takes the session: its message again */
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_MODERATE, NULL), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_session_errmsg(s), "no memory manager");
    CHECK_EQ_INT(rb_session_feed(s, &bad, 1, NULL), RB_E_INVALID_ARG);
    CHECK_STR_EQ(rb_session_errmsg(s), mine);

    rb_session_destroy(s);
    rb_model_close(m);
    return check_report();
}
