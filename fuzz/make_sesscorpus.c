/*
 * make_sesscorpus.c - writes fuzz_sessfile's seeds: real session files of
 * the fuzz model (fuzz/sess_model.h), in the compact form, each twice (for
 * the file layer and for the session layer). Usage: make_sesscorpus DIR.
 *   run      a prompt of 300 tokens saved, 20 more committed after feeds
 *   chat     two turns saved on request, each with a chat record blob
 *   rewound  300 tokens, rewound to 100, 60 more: garbage pages behind
 *   trimmed  saved, trimmed complete, fed and saved again
 *   spilled  under a memory budget: pages spilled to storage, then saved
 * Built with the fuzz targets (-DREBOUND_FUZZ=ON).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sess_model.h"

static int n_failed;

static void check(rb_status st, const char *what)
{
    if (st != RB_OK) {
        fprintf(stderr, "make_sesscorpus: %s: %s\n", what, rb_status_name(st));
        n_failed++;
    }
}

static size_t used(const uint8_t *p, size_t n) /* without trailing zeros */
{
    while (n && !p[n - 1])
        n--;
    return n;
}

/* Reads path and writes it to DIR/NAME (file layer) and DIR/NAME-session. */
static void deflate_file(const char *path, const char *dir, const char *name)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "make_sesscorpus: %s: %s\n", path, strerror(errno));
        n_failed++;
        return;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)size);
    if (!b || fread(b, 1, (size_t)size, f) != (size_t)size) {
        fclose(f);
        free(b);
        n_failed++;
        return;
    }
    fclose(f);
    const uint64_t area = fuzz_sess_cat_area();
    const uint64_t where[4] = {0, FUZZ_SESS_A, 2 * FUZZ_SESS_A, 2 * FUZZ_SESS_A + area};
    const uint64_t room[4] = {FUZZ_SESS_A, FUZZ_SESS_A, area, area};
    uint8_t *c = malloc((size_t)size + 9);
    if (!c) {
        free(b);
        n_failed++;
        return;
    }
    size_t cn = 1;
    for (int i = 0; i < 4; i++) {
        size_t k = 0;
        if ((uint64_t)size > where[i]) {
            uint64_t avail = (uint64_t)size - where[i];
            k = used(b + where[i], (size_t)(avail < room[i] ? avail : room[i]));
        }
        if (k > 65535)
            k = 65535;
        c[cn++] = (uint8_t)(k & 255);
        c[cn++] = (uint8_t)(k >> 8);
        memcpy(c + cn, b + where[i], k);
        cn += k;
    }
    uint64_t data0 = 2 * FUZZ_SESS_A + 2 * area;
    if ((uint64_t)size > data0) {
        memcpy(c + cn, b + data0, (size_t)((uint64_t)size - data0));
        cn += (size_t)((uint64_t)size - data0);
    }
    for (int layer = 0; layer < 2; layer++) {
        char out[1024];
        snprintf(out, sizeof out, "%s/%s%s", dir, name, layer ? "-session" : "");
        /* the session copy: bits 1, 2 and the gate of the rest */
        c[0] = layer ? (uint8_t)(6 | fuzz_sess_gate(c + 1, cn - 1) << 3) : 0;
        FILE *o = fopen(out, "wb");
        if (!o || fwrite(c, 1, cn, o) != cn) {
            if (o)
                fclose(o);
            n_failed++;
            continue;
        }
        if (fclose(o) != 0)
            n_failed++;
    }
    free(c);
    free(b);
}

static void feed_n(rb_session *s, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        int32_t t = (int32_t)((seed + 7 * i) % 300);
        check(rb_session_feed(s, &t, 1, NULL), "feed");
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_sesscorpus DIR\n");
        return 2;
    }
    const char *dir = argv[1];
    char mpath[1024], path[1024];
    snprintf(path, sizeof path, "%s/../make-sesscorpus.rbs", dir);
    const char *tmp = getenv("REBOUND_FUZZ_DIR")        ? getenv("REBOUND_FUZZ_DIR")
                      : access("/dev/shm", W_OK) == 0 ? "/dev/shm"
                      : getenv("TMPDIR")              ? getenv("TMPDIR")
                                                      : "/tmp";
    snprintf(mpath, sizeof mpath, "%s/rebound-fuzz-sess-model.gguf", tmp);
    rb_model *m = fuzz_sess_model(mpath);
    if (!m)
        return 1;
    rb_error err;
    rb_session *s = NULL;
    rb_session_params p = fuzz_sess_params();

    remove(path);
    check(rb_session_create(m, &p, &s, &err), "create");
    feed_n(s, 300, 1);
    check(rb_session_save(s, path, 0), "save run");
    feed_n(s, 20, 5);
    rb_session_destroy(s);
    deflate_file(path, dir, "run");

    remove(path);
    check(rb_session_create(m, &p, &s, &err), "create");
    feed_n(s, 30, 2);
    uint8_t rec[24 + 8 + 64] = "RBCH";
    uint32_t ver = 1;
    uint64_t ns = 1, nt = 1, t0 = 1;
    memcpy(rec + 4, &ver, 4);
    memcpy(rec + 8, &ns, 8);
    memcpy(rec + 16, &nt, 8);
    memcpy(rec + 24, &t0, 8);
    check(rb_session_set_blob(s, rec, sizeof rec), "blob");
    check(rb_session_save(s, path, RB_SAVE_ON_REQUEST), "save chat");
    feed_n(s, 30, 3);
    nt = 2;
    uint64_t t1 = 30;
    memcpy(rec + 16, &nt, 8);
    memcpy(rec + 32, &t1, 8);
    check(rb_session_set_blob(s, rec, sizeof rec), "blob");
    check(rb_session_save(s, path, RB_SAVE_ON_REQUEST), "save chat");
    rb_session_destroy(s);
    deflate_file(path, dir, "chat");

    remove(path);
    check(rb_session_create(m, &p, &s, &err), "create");
    feed_n(s, 300, 4);
    check(rb_session_save(s, path, 0), "save");
    check(rb_session_rewind(s, 100), "rewind");
    feed_n(s, 60, 6);
    check(rb_session_save(s, path, 0), "save rewound");
    rb_session_destroy(s);
    deflate_file(path, dir, "rewound");

    remove(path);
    check(rb_session_create(m, &p, &s, &err), "create");
    feed_n(s, 280, 8);
    check(rb_session_save(s, path, 0), "save");
    check(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), "trim");
    feed_n(s, 5, 9);
    check(rb_session_save(s, path, 0), "save trimmed");
    rb_session_destroy(s);
    deflate_file(path, dir, "trimmed");

    remove(path);
    p.budget_bytes = 1; /* below anything: every feed trims what it can */
    p.spill_dir = tmp;
    if (rb_session_create(m, &p, &s, &err) == RB_OK) {
        feed_n(s, 300, 10);
        check(rb_session_save(s, path, 0), "save spilled");
        rb_session_destroy(s);
        deflate_file(path, dir, "spilled");
    } else { /* a budget below the least that works: a modest one */
        p.budget_bytes = 0;
        check(rb_session_create(m, &p, &s, &err), "create");
        feed_n(s, 300, 10);
        check(rb_session_trim(s, 0, RB_TRIM_MODERATE, NULL), "trim");
        check(rb_session_save(s, path, 0), "save spilled");
        rb_session_destroy(s);
        deflate_file(path, dir, "spilled");
    }
    remove(path);
    rb_model_close(m);
    if (n_failed)
        fprintf(stderr, "make_sesscorpus: %d failures\n", n_failed);
    return n_failed != 0;
}
