/*
 * test_serve_store.c - serve/convstore: conversation ids, the prefix
 * lookup (the longest shared prefix that covers at least half of a stored
 * conversation; busy ones skipped), the least-recently-used order of the
 * limits (count, disk bytes; busy conversations never go; a deleted
 * conversation's file is unlinked). A store without a model: no sessions.
 */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "convstore.h"

static sv_config base_cfg(void)
{
    sv_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.max_conversations = 64;
    cfg.max_open = 4;
    return cfg;
}

static sv_conv *add_tokens(sv_store *st, const char *id, const int32_t *t, size_t n)
{
    sv_conv *c = sv_store_add(st, "", id);
    CHECK(c != NULL);
    c->tokens = malloc(n * sizeof *t);
    memcpy(c->tokens, t, n * sizeof *t);
    c->n_tokens = c->cap = n;
    return c;
}

static void test_ids(void)
{
    CHECK(!sv_id_is_valid(""));
    CHECK(sv_id_is_valid("a"));
    CHECK(sv_id_is_valid("A-z_09"));
    CHECK(!sv_id_is_valid("a/b"));
    CHECK(!sv_id_is_valid("../x"));
    CHECK(!sv_id_is_valid("a.rbs"));
    char id[SV_ID_MAX + 2];
    memset(id, 'x', SV_ID_MAX);
    id[SV_ID_MAX] = 0;
    CHECK(sv_id_is_valid(id));
    id[SV_ID_MAX] = 'x', id[SV_ID_MAX + 1] = 0;
    CHECK(!sv_id_is_valid(id));

    sv_config cfg = base_cfg();
    rb_session_params sp = rb_session_default_params();
    sv_metrics m;
    sv_metrics_init(&m);
    sv_store st;
    sv_store_init(&st, &cfg, &sp, NULL, NULL, &m);
    /* new ids are valid, distinct, and never an id in use */
    char prev[SV_ID_MAX + 1] = "";
    int n_dup = 0, n_bad = 0;
    for (int i = 0; i < 200; i++) {
        char nid[SV_ID_MAX + 1];
        sv_store_new_id(nid);
        n_bad += strlen(nid) != 33; /* "c" and 128 bits in hex */
        n_bad += !sv_id_is_valid(nid);
        n_dup += sv_store_find(&st, "", nid) != NULL || !strcmp(nid, prev);
        CHECK(sv_store_add(&st, "", nid) != NULL);
        snprintf(prev, sizeof prev, "%s", nid);
    }
    CHECK_EQ_INT(n_bad, 0);
    CHECK_EQ_INT(n_dup, 0);
    CHECK_EQ_U64(st.n_convs, 200);
    sv_conv *c = sv_store_find(&st, "", prev);
    CHECK(c != NULL && !strcmp(c->id, prev));
    sv_store_remove(&st, c);
    CHECK(sv_store_find(&st, "", prev) == NULL);
    CHECK_EQ_U64(st.n_convs, 199);
    sv_store_deinit(&st);
    sv_metrics_deinit(&m);
}

static void test_match(void)
{
    sv_config cfg = base_cfg();
    rb_session_params sp = rb_session_default_params();
    sv_metrics m;
    sv_metrics_init(&m);
    sv_store st;
    sv_store_init(&st, &cfg, &sp, NULL, NULL, &m);
    const int32_t a[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    const int32_t b[] = {1, 2, 3, 4, 50, 51, 52, 53};
    sv_conv *ca = add_tokens(&st, "a", a, 10), *cb = add_tokens(&st, "b", b, 8);
    size_t k = 0;
    const int32_t qa[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    const int32_t qb[] = {1, 2, 3, 4, 50, 51, 99};
    const int32_t qhalf[] = {1, 2, 3, 4, 5, 99};     /* 5 of a's 10: exactly half */
    const int32_t qless[] = {1, 2, 3, 4, 98};        /* 4 of 10 and 4 of 8 */
    CHECK(sv_store_match(&st, "", qa, 11, &k) == ca);
    CHECK_EQ_U64(k, 10);
    CHECK(sv_store_match(&st, "", qb, 7, &k) == cb);
    CHECK_EQ_U64(k, 6);
    CHECK(sv_store_match(&st, "", qhalf, 6, &k) == ca);
    CHECK(sv_store_match(&st, "", qless, 5, &k) == cb); /* 4 of 8 is half of b */
    cb->n_tokens = 9; /* 4 of 9: less than half */
    cb->tokens = realloc(cb->tokens, 9 * sizeof *cb->tokens);
    cb->tokens[8] = 54;
    CHECK(sv_store_match(&st, "", qless, 5, &k) == NULL);
    /* equal prefixes: the one in RAM (its pages shared by a fork, where a
       closed one's file would be read) */
    const int32_t c1[] = {1, 2, 3, 4, 70, 71}, c2[] = {1, 2, 3, 4, 80, 81};
    const int32_t q12[] = {1, 2, 3, 4, 99};
    sv_conv *x1 = add_tokens(&st, "x1", c1, 6), *x2 = add_tokens(&st, "x2", c2, 6);
    CHECK(sv_store_match(&st, "", q12, 5, &k) == x1);
    x2->session = (rb_session *)&k; /* only compared with NULL here */
    CHECK(sv_store_match(&st, "", q12, 5, &k) == x2);
    CHECK_EQ_U64(k, 4);
    x2->session = NULL;
    sv_store_remove(&st, x1);
    sv_store_remove(&st, x2);
    ca->is_busy = 1; /* a conversation a request uses is not matched */
    CHECK(sv_store_match(&st, "", qa, 11, &k) == NULL);
    CHECK_EQ_U64(sv_common_prefix(a, 10, qa, 11), 10);
    CHECK_EQ_U64(sv_common_prefix(a, 10, b, 8), 4);
    CHECK_EQ_U64(sv_common_prefix(a, 0, b, 8), 0);
    sv_store_deinit(&st);
    sv_metrics_deinit(&m);
}

/* the count limit without a folder: the least recently used idle ones go */
static void test_limit_count(void)
{
    sv_config cfg = base_cfg();
    cfg.max_conversations = 3;
    rb_session_params sp = rb_session_default_params();
    sv_metrics m;
    sv_metrics_init(&m);
    sv_store st;
    sv_store_init(&st, &cfg, &sp, NULL, NULL, &m);
    const char *ids[] = {"c0", "c1", "c2", "c3", "c4"};
    for (int i = 0; i < 5; i++)
        CHECK(sv_store_add(&st, "", ids[i]) != NULL);
    sv_store_touch(&st, sv_store_find(&st, "", "c0")); /* c0 now the newest */
    sv_store_find(&st, "", "c1")->is_busy = 1;          /* never goes */
    sv_store_enforce(&st);
    CHECK_EQ_U64(st.n_convs, 3);
    CHECK(sv_store_find(&st, "", "c0") != NULL);
    CHECK(sv_store_find(&st, "", "c1") != NULL);
    CHECK(sv_store_find(&st, "", "c2") == NULL);
    CHECK(sv_store_find(&st, "", "c3") == NULL);
    CHECK(sv_store_find(&st, "", "c4") != NULL);
    CHECK_EQ_U64(m.v.conv_evicted, 2);
    CHECK_EQ_U64(m.v.mem.n_conv_total, 3);
    sv_store_deinit(&st);
    sv_metrics_deinit(&m);
}

/* the disk limit with a folder: the oldest files are deleted until the
 * rest fit */
static void test_limit_disk(void)
{
    char dir[] = "/tmp/rb_serve_store_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    sv_config cfg = base_cfg();
    cfg.sessions_dir = dir;
    cfg.max_disk_bytes = 250;
    rb_session_params sp = rb_session_default_params();
    sv_metrics m;
    sv_metrics_init(&m);
    sv_store st;
    sv_store_init(&st, &cfg, &sp, NULL, NULL, &m);
    char path[4096];
    const char *ids[] = {"d0", "d1", "d2", "d3"};
    for (int i = 0; i < 4; i++) {
        sv_conv *c = sv_store_add(&st, "", ids[i]);
        sv_store_path(&st, "", ids[i], path, sizeof path);
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        fputs("x", f);
        fclose(f);
        c->has_file = 1;
        c->file_bytes = 100;
    }
    sv_store_path(&st, "", "d0", path, sizeof path);
    CHECK(!strcmp(path + strlen(dir), "/d0.rbs"));
    sv_store_enforce(&st); /* 400 bytes > 250: d0 and d1 go */
    CHECK_EQ_U64(st.n_convs, 2);
    CHECK(sv_store_find(&st, "", "d0") == NULL && sv_store_find(&st, "", "d1") == NULL);
    CHECK(access(path, F_OK) != 0);
    sv_store_path(&st, "", "d2", path, sizeof path);
    CHECK(access(path, F_OK) == 0);
    CHECK_EQ_U64(m.v.mem.disk_bytes, 200);
    CHECK_EQ_U64(m.v.mem.n_conv_stored, 2);
    for (int i = 2; i < 4; i++) {
        sv_store_path(&st, "", ids[i], path, sizeof path);
        unlink(path);
    }
    sv_store_deinit(&st);
    sv_metrics_deinit(&m);
    rmdir(dir);
}

/* namespaces: an id or a prefix of another namespace is unknown; the
 * count limit evicts inside the namespace only; paths apart */
static void test_namespaces(void)
{
    sv_config cfg = base_cfg();
    cfg.max_conversations = 2;
    cfg.sessions_dir = "/srv";
    rb_session_params sp = rb_session_default_params();
    sv_metrics m;
    sv_metrics_init(&m);
    sv_store st;
    sv_store_init(&st, &cfg, &sp, NULL, NULL, &m);
    const int32_t secret[] = {1, 2, 3, 4, 5, 6, 7, 8};
    sv_conv *a = sv_store_add(&st, "alice", "shared-id");
    a->tokens = malloc(sizeof secret);
    memcpy(a->tokens, secret, sizeof secret);
    a->n_tokens = a->cap = 8;
    size_t k = 99;
    CHECK(sv_store_find(&st, "alice", "shared-id") == a);
    CHECK(sv_store_find(&st, "bob", "shared-id") == NULL);
    CHECK(sv_store_match(&st, "bob", secret, 8, &k) == NULL);
    CHECK_EQ_U64(k, 0);
    CHECK(sv_store_match(&st, "alice", secret, 8, &k) == a);
    char pa[256], pb[256], p0[256];
    sv_store_path(&st, "alice", "x", pa, sizeof pa);
    sv_store_path(&st, "bob", "x", pb, sizeof pb);
    sv_store_path(&st, "", "x", p0, sizeof p0);
    CHECK(!strcmp(pa, "/srv/alice/x.rbs"));
    CHECK(!strcmp(pb, "/srv/bob/x.rbs"));
    CHECK(!strcmp(p0, "/srv/x.rbs"));
    /* bob fills his quota many times over: alice's conversation stays */
    for (int i = 0; i < 10; i++) {
        char id[16];
        snprintf(id, sizeof id, "b%d", i);
        CHECK(sv_store_add(&st, "bob", id) != NULL);
        sv_store_enforce(&st);
    }
    CHECK(sv_store_find(&st, "alice", "shared-id") == a);
    CHECK(sv_store_find(&st, "bob", "b9") != NULL && sv_store_find(&st, "bob", "b8") != NULL);
    CHECK(sv_store_find(&st, "bob", "b7") == NULL);
    CHECK_EQ_U64(st.n_convs, 3);
    sv_counts ca, cb;
    sv_metrics_get(&m, "alice", &ca);
    sv_metrics_get(&m, "bob", &cb);
    CHECK_EQ_U64(ca.conv_evicted, 0);
    CHECK_EQ_U64(cb.conv_evicted, 8);
    CHECK_EQ_U64(ca.mem.n_conv_total, 1);
    CHECK_EQ_U64(cb.mem.n_conv_total, 2);
    CHECK(sv_ns_is_valid("") && sv_ns_is_valid("uid1000") && !sv_ns_is_valid("a/b"));
    sv_store_deinit(&st);
    sv_metrics_deinit(&m);
}

int main(void)
{
    test_namespaces();
    test_ids();
    test_match();
    test_limit_count();
    test_limit_disk();
    return check_report();
}
