/*
 * test_pool_close.c - the budget's last step (rb_pool_next_to_close): the
 * pool names the least recently used background session while it holds
 * more sessions than the app's limit or more bytes than its budget, and
 * nothing when within both or when every session is foreground.
 */
#include <stdio.h>

#include "check.h"
#include "rebound.h"
#include "testlib.h"

static char model_path[512];

static rb_session *open_in(rb_model *m, rb_pool *pool, rb_priority prio)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 512;
    p.n_threads = 1;
    p.pool = pool;
    p.priority = prio;
    rb_session *s = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    return s;
}

int main(void)
{
    rb_test_tmp_path(model_path, sizeof model_path, "test_pool_close", "m.gguf");
    CHECK_EQ_INT(rb_test_make_model(model_path, &(rb_test_model_spec){
                                                    .n_embd = 128, .n_layers = 2, .n_head = 4,
                                                    .n_head_kv = 2, .n_ff = 256, .n_vocab = 512,
                                                    .n_ctx = 512, .seed = 3}),
                 RB_OK);
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return check_report();
    rb_pool *pool = NULL;
    CHECK_EQ_INT(rb_pool_create(m, 0, &pool, &err), RB_OK);
    rb_session *a = open_in(m, pool, RB_PRIORITY_FOREGROUND);
    rb_session *b = open_in(m, pool, RB_PRIORITY_BACKGROUND);
    rb_session *c = open_in(m, pool, RB_PRIORITY_BACKGROUND);
    if (!a || !b || !c)
        return check_report();
    int32_t t[4] = {1, 2, 3, 4};
    /* recency: b, then c, then a */
    CHECK_EQ_INT(rb_session_feed(b, t, 4, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(c, t, 4, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(a, t, 4, NULL), RB_OK);

    CHECK(rb_pool_next_to_close(NULL, 1) == NULL);
    CHECK(rb_pool_next_to_close(pool, 0) == NULL); /* no budget, no limit */
    CHECK(rb_pool_next_to_close(pool, 3) == NULL); /* within the limit */
    CHECK(rb_pool_next_to_close(pool, 2) == b);    /* the least recently used background */
    CHECK_EQ_INT(rb_session_feed(b, t, 1, NULL), RB_OK); /* b is used: c is older now */
    CHECK(rb_pool_next_to_close(pool, 2) == c);
    rb_session_destroy(c);
    c = NULL;
    CHECK(rb_pool_next_to_close(pool, 2) == NULL); /* two left */

    /* over the budget: the background one, however few sessions */
    CHECK_EQ_INT(rb_pool_set_budget(pool, 1), RB_OK);
    CHECK(rb_pool_next_to_close(pool, 0) == b);
    CHECK_EQ_INT(rb_session_set_priority(b, RB_PRIORITY_FOREGROUND), RB_OK);
    CHECK(rb_pool_next_to_close(pool, 0) == NULL); /* every session is foreground */
    CHECK_EQ_INT(rb_pool_set_budget(pool, 0), RB_OK);

    rb_session_destroy(a);
    rb_session_destroy(b);
    rb_pool_destroy(pool);
    rb_model_close(m);
    return check_report();
}
