/*
 * test_sessfile.c - sessions that survive the process: a session saved and
 * opened again (cold: weights and KV read by the first feed) gives logits
 * bit-identical to one that never left RAM; feeds after a save are
 * committed; kill -9 at random instants always leaves a file that opens
 * with every acknowledged token; a flipped bit or a cut file is recomputed
 * from the tokens; a session for another model is refused; a full disk
 * keeps the previous state.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "convert.h"
#include "sessfile.h"
#include "synth.h"

#define N_PROMPT 600
#define V 512

static char model_path[512], other_path[512], sess_path[512];
static int32_t prompt[N_PROMPT + 64];

static void make_model(const char *path, uint64_t seed)
{
    rb_synth_shape s = *rb_synth_shape_find("tiny");
    s.name = "custom";
    s.n_embd = 128;
    s.n_layers = 3;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.n_ff = 256;
    s.n_vocab = V;
    s.n_ctx = 1024;
    rb_synth_params sp = {s, rb_file_kind_find("q8_0"), seed, 2};
    rb_error err;
    CHECK_EQ_INT(rb_synth_write(path, &sp, NULL, &err), RB_OK);
}

static rb_session_params params(void)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = 1024;
    p.n_threads = 2;
    return p;
}

static int same_logits(rb_session *a, const float *want)
{
    const float *l = rb_session_logits(a);
    return l && memcmp(l, want, V * sizeof(float)) == 0;
}

static void flip_byte(const char *path, long off)
{
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL);
    if (!f)
        return;
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}

static long file_size(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

/* The reference: prompt, then one token; its logits. */
static void reference(rb_model *m, int32_t next, float *out)
{
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = params();
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
    memcpy(out, rb_session_logits(s), V * sizeof(float));
    rb_session_destroy(s);
}

static void copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb"), *b = fopen(to, "wb");
    CHECK(a && b);
    char buf[1 << 16];
    size_t k;
    while (a && b && (k = fread(buf, 1, sizeof buf, a)) > 0)
        CHECK(fwrite(buf, 1, k, b) == k);
    if (a)
        fclose(a);
    if (b)
        fclose(b);
}

/* Opens a copy of the saved session (a feed commits into the file it was
 * opened from), feeds next; compares with want. */
static void reopen_and_check(rb_model *m, size_t want_tokens, int32_t next, const float *want,
                             uint64_t *damaged)
{
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = params();
    char copy[600];
    snprintf(copy, sizeof copy, "%s.copy", sess_path);
    copy_file(sess_path, copy);
    rb_status st = rb_session_open_saved(m, &p, copy, &s, &err);
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK) {
        fprintf(stderr, "open_saved: %s\n", err.message);
        return;
    }
    CHECK_EQ_INT(rb_session_n_tokens(s), want_tokens);
    CHECK(memcmp(rb_session_tokens(s), prompt, want_tokens * sizeof(int32_t)) == 0);
    CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
    CHECK(same_logits(s, want));
    rb_session_stats st2;
    rb_session_get_stats(s, &st2);
    if (damaged)
        *damaged = st2.n_spill_damaged;
    rb_session_destroy(s);
}

/* kill -9 while the child feeds and commits, 20 times */
static void kill_loop(rb_model *m)
{
    (void)m;
    int worst = 1 << 30;
    for (int iter = 0; iter < 20; iter++) {
        int fds[2];
        CHECK(pipe(fds) == 0);
        pid_t pid = fork();
        if (pid == 0) {
            close(fds[0]);
            rb_model *cm = NULL;
            rb_error err;
            rb_session *s = NULL;
            rb_session_params p = params();
            p.n_threads = 1;
            if (rb_model_open(model_path, NULL, &cm, &err) != RB_OK ||
                rb_session_create(cm, &p, &s, &err) != RB_OK ||
                rb_session_feed(s, prompt, 250, NULL) != RB_OK ||
                rb_session_save(s, sess_path, 0) != RB_OK)
                _exit(2);
            uint32_t n = 250;
            if (write(fds[1], &n, sizeof n) != sizeof n)
                _exit(3);
            for (; n < N_PROMPT + 60; n++) {
                if (rb_session_feed(s, &prompt[n], 1, NULL) != RB_OK)
                    _exit(4);
                uint32_t ack = n + 1; /* fed and committed */
                if (write(fds[1], &ack, sizeof ack) != sizeof ack)
                    _exit(5);
            }
            _exit(0);
        }
        close(fds[1]);
        /* let it run to somewhere between its first save and its end */
        uint32_t acked = 0, v;
        int target = 250 + (int)((unsigned)(iter * 7919) % 400);
        while (read(fds[0], &v, sizeof v) == sizeof v) {
            acked = v;
            if ((int)acked >= target)
                break;
        }
        struct timespec ts = {0, (long)((iter * 1237) % 3000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        while (read(fds[0], &v, sizeof v) == sizeof v)
            acked = v; /* acks written before the kill */
        close(fds[0]);
        int status;
        waitpid(pid, &status, 0);
        if (acked == 0)
            continue;
        rb_model *m2 = NULL;
        rb_error err;
        rb_session *s = NULL;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_model_open(model_path, NULL, &m2, &err), RB_OK);
        rb_status st = rb_session_open_saved(m2, &p, sess_path, &s, &err);
        CHECK_EQ_INT(st, RB_OK);
        if (st == RB_OK) {
            size_t n = rb_session_n_tokens(s);
            CHECK(n >= acked);            /* nothing acknowledged is lost */
            CHECK(n <= acked + 1);        /* and nothing invented */
            CHECK(memcmp(rb_session_tokens(s), prompt, n * sizeof(int32_t)) == 0);
            int32_t t = 7;
            CHECK_EQ_INT(rb_session_feed(s, &t, 1, NULL), RB_OK);
            if ((int)(n - acked) < worst)
                worst = (int)(n - acked);
            rb_session_destroy(s);
        } else {
            fprintf(stderr, "iteration %d: %s\n", iter, err.message);
        }
        rb_model_close(m2);
    }
    printf("kill -9 x20: every reopen had all acknowledged tokens\n");
}

/* a full disk during a commit: the previous state stays */
static int fail_writes;
static ssize_t failing_pwrite(int fd, const void *b, size_t n, off_t off)
{
    if (fail_writes) {
        errno = ENOSPC;
        return -1;
    }
    return pwrite(fd, b, n, off);
}

static void full_disk(void)
{
    rb_os os = *rb_os_default();
    os.pwrite = failing_pwrite;
    rb_sessfile_geom g = {2, 1, 8, 8, 16, 4, 2 * 16 * 16 * 2, 4096, 64};
    rb_sessfile *f = NULL;
    rb_error err;
    char path[600];
    snprintf(path, sizeof path, "%s.unit", sess_path);
    CHECK_EQ_INT(rb_sessfile_create(path, 42, &g, &os, NULL, &f, &err), RB_OK);
    if (!f)
        return;
    void *pages[8] = {0};
    for (int i = 0; i < 8; i++) {
        pages[i] = aligned_alloc(4096, 4096);
        memset(pages[i], i + 1, 4096);
    }
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = i;
    rb_sessfile_slot_table tab = {pages, 4};
    rb_sessfile_source src = rb_sessfile_slots(&tab);
    CHECK_EQ_INT(rb_sessfile_commit(f, toks, 20, &src, 1, "ab", 2, 0, NULL, &err), RB_OK);
    fail_writes = 1;
    CHECK_EQ_INT(rb_sessfile_commit(f, toks, 40, &src, 1, "abcd", 4, 0, NULL, &err), RB_E_IO);
    CHECK(strstr(err.message, "No space left") != NULL);
    fail_writes = 0;
    rb_sessfile_close(f);
    CHECK_EQ_INT(rb_sessfile_open(path, 42, &g, NULL, NULL, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 20);
        size_t bn;
        rb_sessfile_blob(f, &bn);
        CHECK_EQ_INT(bn, 2);
        void *buf = aligned_alloc(4096, 4096);
        CHECK_EQ_INT(rb_sessfile_read_page(f, 1, 0, buf, &err), RB_OK);
        CHECK(memcmp(buf, pages[4], 32) == 0);
        free(buf);
        rb_sessfile_close(f);
    }
    CHECK_EQ_INT(rb_sessfile_open(path, 43, &g, NULL, NULL, &f, &err), RB_E_INVALID_ARG);
    for (int i = 0; i < 8; i++)
        free(pages[i]);
    unlink(path);
}

int main(void)
{
    snprintf(model_path, sizeof model_path, "%s/sessfile.gguf", REBOUND_TEST_TMP);
    snprintf(other_path, sizeof other_path, "%s/sessfile-other.gguf", REBOUND_TEST_TMP);
    snprintf(sess_path, sizeof sess_path, "%s/sessfile.session", REBOUND_TEST_TMP);
    make_model(model_path, 3);
    make_model(other_path, 4);
    uint64_t r = 99;
    for (int i = 0; i < N_PROMPT + 64; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((r >> 33) % V);
    }
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return check_report();
    float want[V], want2[V];
    reference(m, 11, want);

    /* 1. save after the prompt (last page partly filled), reopen cold */
    {
        rb_session *s = NULL;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
        CHECK_EQ_INT(rb_session_feed(s, prompt, N_PROMPT, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_set_blob(s, "sampler+history", 15), RB_OK);
        CHECK_EQ_INT(rb_session_save(s, sess_path, RB_SAVE_FSYNC), RB_OK);
        rb_session_destroy(s);
    }
    rb_model *cold = NULL;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &cold, &err), RB_OK);
    reopen_and_check(cold, N_PROMPT, 11, want, NULL);
    {
        rb_session *s = NULL;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_open_saved(cold, &p, sess_path, &s, &err), RB_OK);
        size_t bn = 0;
        const void *b = s ? rb_session_get_blob(s, &bn) : NULL;
        CHECK(bn == 15 && b && memcmp(b, "sampler+history", 15) == 0);
        rb_session_destroy(s);
    }
    rb_model_close(cold);

    /* 2. feeds after a save are committed (auto): 40 more tokens, crossing
          a page boundary; the tail is recomputed on open */
    {
        rb_session *s = NULL;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_open_saved(m, &p, sess_path, &s, &err), RB_OK);
        for (int i = 0; s && i < 40; i++)
            CHECK_EQ_INT(rb_session_feed(s, &prompt[N_PROMPT + i], 1, NULL), RB_OK);
        rb_session_destroy(s);
        /* reference for 640 tokens + 11 */
        rb_session *r2 = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &r2, &err), RB_OK);
        CHECK_EQ_INT(rb_session_feed(r2, prompt, N_PROMPT + 40, NULL), RB_OK);
        int32_t t = 11;
        CHECK_EQ_INT(rb_session_feed(r2, &t, 1, NULL), RB_OK);
        memcpy(want2, rb_session_logits(r2), sizeof want2);
        rb_session_destroy(r2);
        reopen_and_check(m, N_PROMPT + 40, 11, want2, NULL);
    }

    /* 3. a flipped bit in a page: recomputed from the tokens, same logits */
    {
        long size = file_size(sess_path);
        /* records are appended layer by layer: the last one is layer 2's
           partly filled page (88 tokens: not used, the open recomputes
           that page); the one before is its page 1 (64 KiB), in use */
        flip_byte(sess_path, size - 65536 - 3000);
        uint64_t damaged = 0;
        reopen_and_check(m, N_PROMPT + 40, 11, want2, &damaged);
        CHECK(damaged > 0);
        printf("bit flip: %llu pages recomputed\n", (unsigned long long)damaged);
    }

    /* 4. a file cut inside its pages: the lost part recomputed */
    {
        long size = file_size(sess_path);
        CHECK(truncate(sess_path, size - 5000) == 0);
        reopen_and_check(m, N_PROMPT + 40, 11, want2, NULL);
    }

    /* 5. another model is refused; not a session file; missing */
    {
        rb_model *o = NULL;
        CHECK_EQ_INT(rb_model_open(other_path, NULL, &o, &err), RB_OK);
        rb_session *s = NULL;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_open_saved(o, &p, sess_path, &s, &err), RB_E_INVALID_ARG);
        CHECK(strstr(err.message, "another model") != NULL);
        CHECK_EQ_INT(rb_session_open_saved(m, &p, model_path, &s, &err), RB_E_FORMAT);
        CHECK(strstr(err.message, "not a rebound session file") != NULL);
        CHECK_EQ_INT(rb_session_open_saved(m, &p, "/nonexistent.session", &s, &err),
                     RB_E_NOT_FOUND);
        p.n_ctx = 512;
        CHECK_EQ_INT(rb_session_open_saved(m, &p, sess_path, &s, &err), RB_E_UNSUPPORTED);
        rb_model_close(o);
    }

    /* 6. the newest superblock damaged: the previous state opens */
    {
        rb_session *s = NULL;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_open_saved(m, &p, sess_path, &s, &err), RB_OK);
        int32_t t = 5;
        CHECK_EQ_INT(rb_session_feed(s, &t, 1, NULL), RB_OK); /* commit: N+41 tokens */
        rb_session_destroy(s);
        /* both slots: flip the one holding the higher sequence (try slot 0,
           then 1: the open must give N+40 or N+41 tokens, never fail) */
        flip_byte(sess_path, 100);
        s = NULL;
        CHECK_EQ_INT(rb_session_open_saved(m, &p, sess_path, &s, &err), RB_OK);
        if (s) {
            size_t n = rb_session_n_tokens(s);
            CHECK(n == N_PROMPT + 40 || n == N_PROMPT + 41);
            rb_session_destroy(s);
        }
    }

    full_disk();
    kill_loop(m);

    rb_model_close(m);
    unlink(sess_path);
    unlink(model_path);
    unlink(other_path);
    return check_report();
}
