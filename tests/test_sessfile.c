/*
 * test_sessfile.c - sessions that survive the process: a session saved and
 * opened again (cold: weights and KV read by the first feed) gives logits
 * bit-identical to one that never left RAM; feeds after a save are
 * committed; kill -9 at random instants always leaves a file that opens
 * with every acknowledged token; a flipped bit or a cut file is recomputed
 * from the tokens; a session for another model is refused; a full disk
 * keeps the previous state. Commits run behind the feeds on the storage
 * worker: trims and rewinds racing them leave a file that reopens right,
 * and a full disk behind them is reported while the session goes on.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "rebound_experimental.h"
#include "kvcodec.h"
#include "model.h"
#include "residency.h"
#include "sessfile.h"
#include "session_debug.h"
#include "session_writer.h"
#include "testlib.h"

#if defined(__SANITIZE_THREAD__)
#define RB_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RB_TEST_TSAN 1
#endif
#endif

#define N_PROMPT 600
#define V 512

static char model_path[512], other_path[512], sess_path[512];
static int32_t prompt[N_PROMPT + 64];

/* A 3-layer q8_0 model of the given width. */
static void make_model_sized(const char *path, uint64_t seed, uint32_t n_embd, uint32_t n_head,
                             uint32_t n_ff)
{
    CHECK_EQ_INT(rb_test_make_model(path, &(rb_test_model_spec){
                                              .n_embd = n_embd, .n_layers = 3, .n_head = n_head,
                                              .n_head_kv = 2, .n_ff = n_ff, .n_vocab = V,
                                              .n_ctx = 1024, .seed = seed}),
                 RB_OK);
}

static void make_model(const char *path, uint64_t seed)
{
    make_model_sized(path, seed, 128, 4, 256);
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
    const float *l = rb_session_get_logits(a);
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
    memcpy(out, rb_session_get_logits(s), V * sizeof(float));
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
    CHECK(memcmp(rb_session_get_tokens(s), prompt, want_tokens * sizeof(int32_t)) == 0);
    CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
    CHECK(same_logits(s, want));
    rb_session_stats st2;
    rb_session_get_stats(s, &st2);
    if (damaged)
        *damaged = st2.n_spill_damaged;
    rb_session_destroy(s);
}

static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    for (int ca = 0, cb = 0; same && ca != EOF; same = ca == cb) {
        ca = fgetc(fa);
        cb = fgetc(fb);
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

/* Pages of [p, p + n) in the page cache (mincore of a file mapping). */
static size_t cached_pages(const uint8_t *p, size_t n)
{
    uintptr_t a = (uintptr_t)p / 4096 * 4096, b = ((uintptr_t)p + n) / 4096 * 4096;
    size_t k = b > a ? (b - a) / 4096 : 0, cached = 0;
    unsigned char *vec = malloc(k ? k : 1);
    CHECK(vec && mincore((void *)a, b - a, vec) == 0);
    for (size_t i = 0; vec && i < k; i++) {
        cached += vec[i] & 1;
    }
    free(vec);
    return cached;
}

/* A cold open maps the model file (model.h), under a SIGBUS guard: the
 * logits are exact, a complete trim takes the layers' pages out of the
 * page cache as well (else nothing was given back), the next feed reads
 * them again; the file cut under the session then is an error of the next
 * feed naming it, the tokens unchanged (SIGBUS without the guard). A model
 * of 4 MiB layers: readahead's folios are smaller than a layer there (the
 * page cache drops a folio only whole, model.h). */
/* The SIGBUS guard is the model's choice (rb_model_params.sigbus_guard),
 * checked in a new process (this program run again with "sigbus-child")
 * so that the handler state starts fresh. Off: the weights are read, never
 * mapped, no handler is installed, and the logits are the same; on (the
 * default): the weights file is mapped and the handler installed; an app's
 * handler installed before it is the one it chains to (a SIGBUS sent to
 * the process reaches it). Each open is of a copy of the session file. */
static volatile sig_atomic_t g_app_sigbus;
static void app_sigbus(int sig) { (void)sig; g_app_sigbus++; }

static void copy_file(const char *from, const char *to);

static void sigbus_child(void)
{
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return;
    float want[V];
    reference(m, 11, want); /* an allocated load: neither maps nor guards */
    rb_model_close(m);
    /* the action before any guard: SIG_DFL, or a sanitizer's handler */
    struct sigaction cur, initial;
    CHECK(sigaction(SIGBUS, NULL, &initial) == 0);
    char copy[600];
    snprintf(copy, sizeof copy, "%s.sigbus", sess_path);
    for (int guard = 0; guard <= 1; guard++) {
        rb_model_params mp = rb_model_default_params();
        CHECK_EQ_INT(mp.sigbus_guard, 1);
        mp.sigbus_guard = guard;
        if (guard) { /* the app's own handler first */
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sa.sa_handler = app_sigbus;
            sigemptyset(&sa.sa_mask);
            CHECK(sigaction(SIGBUS, &sa, NULL) == 0);
        }
        copy_file(sess_path, copy);
        m = NULL;
        CHECK_EQ_INT(rb_model_open(model_path, &mp, &m, &err), RB_OK);
        rb_session *s = NULL;
        rb_session_params p = params();
        p.restore = RB_RESTORE_EAGER;
        CHECK_EQ_INT(rb_session_open_saved(m, &p, copy, &s, &err), RB_OK);
        int32_t next = 11;
        CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
        CHECK(same_logits(s, want));
        CHECK_EQ_INT(rb_model_weights_file_mapped(m), guard);
        CHECK(sigaction(SIGBUS, NULL, &cur) == 0);
        if (!guard) { /* nothing installed */
            CHECK(cur.sa_flags == initial.sa_flags && cur.sa_handler == initial.sa_handler);
        } else { /* the library's, over the app's */
            CHECK((cur.sa_flags & SA_SIGINFO) && cur.sa_handler != app_sigbus);
            CHECK(raise(SIGBUS) == 0);        /* not a fault in a guard: the app's */
            CHECK_EQ_INT(g_app_sigbus, 1);
        }
        rb_session_destroy(s);
        rb_model_close(m);
    }
    unlink(copy);
}

static void sigbus_guard_test(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "test_sessfile", "sigbus-child", (char *)NULL);
        _exit(127);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* A reopened session has no logits until rb_session_compute_logits, which
 * gives those of the last token bit for bit as a session that never left
 * RAM has them, the tokens unchanged; a session with no token: refused. */
static void reopen_logits_test(rb_model *m)
{
    rb_error err;
    rb_session_params p = params();
    rb_session *r = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &r, &err), RB_OK);
    if (!r)
        return;
    CHECK_EQ_INT(rb_session_compute_logits(r), RB_E_INVALID_ARG);
    CHECK_CONTAINS(rb_session_errmsg(r), "no token");
    CHECK_EQ_INT(rb_session_feed(r, prompt, N_PROMPT, NULL), RB_OK);
    float want[V];
    memcpy(want, rb_session_get_logits(r), sizeof want);
    CHECK_EQ_INT(rb_session_compute_logits(r), RB_OK); /* has them: nothing */
    CHECK(same_logits(r, want));
    rb_session_destroy(r);
    char copy[600];
    snprintf(copy, sizeof copy, "%s.logits", sess_path);
    copy_file(sess_path, copy);
    rb_session *s = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, copy, &s, &err), RB_OK);
    if (s) {
        CHECK(rb_session_get_logits(s) == NULL);
        CHECK_EQ_INT(rb_session_compute_logits(s), RB_OK);
        CHECK_EQ_INT(rb_session_n_tokens(s), N_PROMPT);
        CHECK(same_logits(s, want));
        rb_session_destroy(s);
    }
    /* the same from a model opened by file descriptor (closed at once): a
       cold reopen maps the weights through the model's own duplicate */
    int fd = open(model_path, O_RDONLY);
    rb_model *fm = NULL;
    CHECK_EQ_INT(rb_model_open_fd(fd, NULL, &fm, &err), RB_OK);
    close(fd);
    copy_file(sess_path, copy);
    s = NULL;
    if (fm && rb_session_open_saved(fm, &p, copy, &s, &err) == RB_OK) {
        CHECK_EQ_INT(rb_session_compute_logits(s), RB_OK);
        CHECK(same_logits(s, want));
        CHECK(rb_model_weights_file_mapped(fm));
        rb_session_destroy(s);
    } else {
        CHECK(0 && "open_saved with the fd-opened model");
    }
    rb_model_close(fm);
    /* a session file by descriptor (read only, the descriptor closed by the
       caller at once): the same tokens and logits, the file unchanged by
       the open and by feeds after it (the session is bound to no file) */
    copy_file(sess_path, copy);
    char orig[620];
    snprintf(orig, sizeof orig, "%s.orig", copy);
    copy_file(copy, orig);
    fd = open(copy, O_RDONLY);
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved_fd(m, &p, fd, &s, &err), RB_OK);
    close(fd);
    if (s) {
        CHECK_EQ_INT(rb_session_n_tokens(s), N_PROMPT);
        size_t bn = 0;
        CHECK(rb_session_get_blob(s, &bn) && bn == 15);
        CHECK_EQ_INT(rb_session_compute_logits(s), RB_OK);
        CHECK(same_logits(s, want));
        int32_t t = 11;
        CHECK_EQ_INT(rb_session_feed(s, &t, 1, NULL), RB_OK);
        rb_session_stats st;
        CHECK_EQ_INT(rb_session_get_stats(s, &st), RB_OK);
        CHECK(st.file_recovery == NULL);
        CHECK_EQ_U64(st.file_commits, 0);
        rb_session_destroy(s);
    }
    CHECK(same_file(copy, orig));
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved_fd(m, &p, -1, &s, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "file descriptor");
    unlink(orig);
    unlink(copy);
}

static void mapped_weights_test(void)
{
    char path[600], sess[600];
    snprintf(path, sizeof path, "%s/sessfile-mapped.gguf", REBOUND_TEST_TMP);
    snprintf(sess, sizeof sess, "%s/sessfile-mapped.session", REBOUND_TEST_TMP);
    make_model_sized(path, 5, 512, 8, 2048);
    rb_error err;
    rb_model *warm = NULL, *cold = NULL;
    CHECK_EQ_INT(rb_model_open(path, NULL, &warm, &err), RB_OK);
    CHECK_EQ_INT(rb_model_open(path, NULL, &cold, &err), RB_OK);
    rb_session *s = NULL;
    rb_session_params p = params();
    float want[V];
    int32_t next = 11;
    if (warm && rb_session_create(warm, &p, &s, &err) == RB_OK) {
        CHECK_EQ_INT(rb_session_feed(s, prompt, 256, NULL), RB_OK); /* whole pages */
        CHECK_EQ_INT(rb_session_save(s, sess, 0), RB_OK);
        rb_session_destroy(s); /* before a feed: it would commit to the file */
        s = NULL;
    }
    if (warm && rb_session_create(warm, &p, &s, &err) == RB_OK) {
        CHECK_EQ_INT(rb_session_feed(s, prompt, 256, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
        memcpy(want, rb_session_get_logits(s), sizeof want);
        rb_session_destroy(s);
        s = NULL;
        CHECK(!rb_model_weights_file_mapped(warm)); /* loaded: allocated */
    }
    rb_model_close(warm);
    /* eager: nothing is read before the feed (a pipelined open begins its
       restore at once, open_restore_test), so the page cache can be
       looked at in between */
    p.restore = RB_RESTORE_EAGER;
    rb_experimental_params phone = rb_experimental_default_params();
    phone.device = "phone"; /* 1000 MiB/s and 80 us an I/O, no burst */
    p.experimental = &phone;
    if (!cold || rb_session_open_saved(cold, &p, sess, &s, &err) != RB_OK) {
        CHECK(0 && "open_saved of the mapped-weights model");
        rb_model_close(cold);
        return;
    }
    CHECK(rb_model_weights_file_mapped(cold));
    /* the session file's records: read into the pages (never mapped, so
       that a file cut under the session is a read error, not SIGBUS),
       none of it in the page cache before nor after the trim */
    int sfd = open(sess, O_RDONLY);
    struct stat sst;
    off_t sess_n = sfd >= 0 && fstat(sfd, &sst) == 0 ? sst.st_size : 0;
    CHECK(sess_n > 0);
    const uint8_t *smap = sfd >= 0 && sess_n > 0 ? mmap(NULL, (size_t)sess_n, PROT_READ,
                                                        MAP_SHARED, sfd, 0) : MAP_FAILED;
    CHECK(smap != MAP_FAILED);
    if (sfd >= 0)
        close(sfd);
    /* the records: the last n_layers pages of the file (one save) */
    size_t rec_n = (size_t)rb_session_kvcache(s)->n_layers * rb_kvcache_page_alloc_bytes(rb_session_kvcache(s));
    const uint8_t *rec = smap != MAP_FAILED && (size_t)sess_n > rec_n ? smap + sess_n - rec_n
                                                                       : NULL;
    CHECK(rec != NULL);
    if (rec)
        CHECK_EQ_INT(cached_pages(rec, rec_n), 0);
    const rb_gguf_tensor *t = rb_gguf_find_tensor(rb_model_gguf(cold), "blk.1.ffn_down.weight");
    CHECK(t != NULL);
    const uint8_t *w = t ? rb_model_tensor_data(cold, t) : NULL;
    CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
    CHECK(same_logits(s, want));
    /* the split's R is what the storage path delivered (>= 4 MiB read):
       below the profile's, which the per-I/O latency alone keeps it under */
    rb_session_stats rst;
    rb_session_get_stats(s, &rst);
    CHECK(rst.storage_bytes_per_s > 0 && rst.storage_bytes_per_s < 1000.0 * 1048576);
    if (w)
        CHECK_EQ_INT(cached_pages(w, (size_t)t->n_bytes), (t->n_bytes + 4095) / 4096);
    CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    if (w)
        CHECK_EQ_INT(cached_pages(w, (size_t)t->n_bytes), 0);
    if (rec)
        CHECK_EQ_INT(cached_pages(rec, rec_n), 0);
    if (smap != MAP_FAILED)
        munmap((void *)smap, (size_t)sess_n);
    CHECK_EQ_INT(rb_session_rewind(s, 256), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
    CHECK(same_logits(s, want));
#ifndef RB_TEST_TSAN /* it takes the guard's zero page for a racing write */
    CHECK(truncate(path, 4096) == 0);
    CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_E_IO);
    CHECK(strstr(rb_session_errmsg(s), "sessfile-mapped.gguf' was cut short") != NULL);
    CHECK_EQ_INT(rb_session_n_tokens(s), 257);
#endif
    rb_session_destroy(s);
    rb_model_close(cold);
    remove(path);
    remove(sess);
}

/*
 * The restore begins at open (rb_session_open_saved): its first reads
 * complete before any feed. Whatever comes before the first feed settles
 * it - a trim or a rewind drops what has not started, a save waits for
 * all of it, a close drops it - and the logits stay exact.
 */
static void open_restore_test(const float *want)
{
    char copy[600], saved[600];
    snprintf(copy, sizeof copy, "%s.early", sess_path);
    snprintf(saved, sizeof saved, "%s.early-saved", sess_path);
    rb_error err;
    for (int step = 0; step < 4; step++) {
        copy_file(sess_path, copy);
        rb_model *m = NULL; /* cold: the layers' weights are in the restore too */
        CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
        rb_session *s = NULL;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_open_saved(m, &p, copy, &s, &err), RB_OK);
        if (!s) {
            rb_model_close(m);
            return;
        }
        int32_t next = 11;
        if (step == 0) { /* begun at open: events before any feed */
            rb_restore_event ev[4];
            size_t n = 0;
            for (int i = 0; i < 2000 && n == 0; i++) {
                n = rb_session_restore_events(s, ev, 4);
                if (n == 0)
                    usleep(1000);
            }
            CHECK(n > 0);
        } else if (step == 1) { /* dropped in flight, then trimmed */
            CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
        } else if (step == 2) { /* dropped in flight, then rewound */
            CHECK_EQ_INT(rb_session_rewind(s, N_PROMPT - 100), RB_OK);
            CHECK_EQ_INT(rb_session_feed(s, prompt + N_PROMPT - 100, 100, NULL), RB_OK);
        } else { /* waited for, saved elsewhere, reopened from there */
            CHECK_EQ_INT(rb_session_save(s, saved, 0), RB_OK);
            rb_session_destroy(s);
            s = NULL;
            CHECK_EQ_INT(rb_session_open_saved(m, &p, saved, &s, &err), RB_OK);
        }
        if (s) {
            CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
            CHECK(same_logits(s, want));
        }
        rb_session_destroy(s);
        rb_model_close(m);
    }
    unlink(copy);
    unlink(saved);
}

/* rb_session_unbind on a session just opened: every page comes back from
 * the file (a damaged one is recomputed), later feeds and trims leave the
 * file as it was, and the logits stay exact. */
static void unbind_test(rb_model *m, const float *want)
{
    char copy[600], pristine[600];
    snprintf(copy, sizeof copy, "%s.unbind", sess_path);
    snprintf(pristine, sizeof pristine, "%s.pristine", sess_path);
    copy_file(sess_path, pristine);
    for (int damaged = 0; damaged < 2; damaged++) {
        copy_file(pristine, copy);
        if (damaged) /* in the last record: layer 2's last page (88 tokens) */
            flip_byte(copy, file_size(copy) - 3000);
        copy_file(copy, pristine); /* the state unbind must leave */
        rb_session *s = NULL;
        rb_error err;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_open_saved(m, &p, copy, &s, &err), RB_OK);
        if (!s)
            return;
        CHECK_EQ_INT(rb_session_unbind(s), RB_OK);
        CHECK_EQ_INT(rb_session_unbind(s), RB_OK); /* nothing bound: nothing to do */
        int32_t next = 11;
        CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
        CHECK(same_logits(s, want));
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        if (damaged) /* the page was recomputed by the feed */
            CHECK(st.restore_recomputed_tokens > 0);
        /* a trim now goes to the spill, not to the file */
        CHECK_EQ_INT(rb_session_rewind(s, N_PROMPT), RB_OK);
        CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
        CHECK(same_logits(s, want));
        rb_session_destroy(s);
        CHECK(same_file(copy, pristine));
    }
    unlink(copy);
    unlink(pristine);
}

/*
 * kill -9 while the child feeds and its storage worker commits behind it.
 * A token is acknowledged once a commit holding it completed (the
 * session's file_tokens_committed): the child reports, after each feed,
 * the tokens fed (FED | n) and the tokens committed. Every reopen must
 * hold all acknowledged tokens and at most the ones fed (+1: a feed whose
 * report the kill cut off). Odd iterations throttle the storage to the
 * watch profile (a page write takes ~1 ms) so that kills land inside
 * commits, even ones inside the host's page cache writes.
 */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define KILL_ITERS 12 /* ~3 s an iteration under a sanitizer */
#else
#define KILL_ITERS 60
#endif
#define FED 0x80000000u
static void kill_loop(rb_model *m)
{
    (void)m;
    int n_beyond = 0, n_mid = 0;
    for (int iter = 0; iter < KILL_ITERS; iter++) {
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
            rb_experimental_params watch = rb_experimental_default_params();
            watch.device = "watch";
            if (iter % 2)
                p.experimental = &watch;
            if (rb_model_open(model_path, NULL, &cm, &err) != RB_OK ||
                rb_session_create(cm, &p, &s, &err) != RB_OK ||
                rb_session_feed(s, prompt, 250, NULL) != RB_OK ||
                rb_session_save(s, sess_path, 0) != RB_OK) /* synchronous */
                _exit(2);
            uint32_t n = 250, acked = 250;
            if (write(fds[1], &n, sizeof n) != sizeof n)
                _exit(3);
            for (; n < N_PROMPT + 60; n++) {
                if (rb_session_feed(s, &prompt[n], 1, NULL) != RB_OK)
                    _exit(4);
                uint32_t msg[2] = {FED | (n + 1), (uint32_t)rb_session_debug_file_tokens_committed(s)};
                if (write(fds[1], msg, sizeof msg) != sizeof msg)
                    _exit(5);
                acked = msg[1];
            }
            (void)acked;
            _exit(0);
        }
        close(fds[1]);
        /* let it run to somewhere between its first save and its end */
        uint32_t acked = 0, fed = 0, v;
        int target = 250 + (int)((unsigned)(iter * 7919) % 400);
        while (read(fds[0], &v, sizeof v) == sizeof v) {
            if (v & FED)
                fed = v & ~FED;
            else if (v > acked)
                acked = v;
            if ((int)fed >= target)
                break;
        }
        struct timespec ts = {0, (long)((iter * 1237) % 3000) * 1000};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        while (read(fds[0], &v, sizeof v) == sizeof v) { /* reports written before the kill */
            if (v & FED)
                fed = v & ~FED;
            else if (v > acked)
                acked = v;
        }
        close(fds[0]);
        int status;
        waitpid(pid, &status, 0);
        if (acked == 0)
            continue;
        if (fed < acked)
            fed = acked;
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
            CHECK(n <= fed + 1);          /* and nothing invented */
            if (n < acked || n > fed + 1)
                fprintf(stderr, "iteration %d: %zu tokens, acknowledged %u, fed %u\n", iter, n,
                        acked, fed);
            CHECK(memcmp(rb_session_get_tokens(s), prompt, n * sizeof(int32_t)) == 0);
            int32_t t = 7;
            CHECK_EQ_INT(rb_session_feed(s, &t, 1, NULL), RB_OK);
            n_beyond += n > acked;
            n_mid += n < fed;
            rb_session_destroy(s);
        } else {
            fprintf(stderr, "iteration %d: %s\n", iter, err.message);
        }
        rb_model_close(m2);
    }
    printf("kill -9 x%d: every reopen had all acknowledged tokens (%d held more: a commit "
           "done but not yet reported; %d fewer than fed: commits still behind)\n",
           KILL_ITERS, n_beyond, n_mid);
}

/* A token sequence of the race test: fresh tokens after each rewind, so a
 * stale page in the file would show in the logits. */
static rb_test_rng rng = {12345};
static int32_t next_token(void) { return (int32_t)rb_test_rng_below(&rng, V); }

/* Logits of a session fed toks[0..n) in one go, into want. */
static void reference_logits(rb_model *m, const int32_t *toks, size_t n, float *want)
{
    rb_error err;
    rb_session *r = NULL;
    rb_session_params p = params();
    CHECK_EQ_INT(rb_session_create(m, &p, &r, &err), RB_OK);
    if (!r)
        return;
    CHECK_EQ_INT(rb_session_feed(r, toks, n, NULL), RB_OK);
    memcpy(want, rb_session_get_logits(r), V * sizeof(float));
    rb_session_destroy(r);
}

/* Saves s to path (on request, as serve does), destroys it and returns the
 * session reopened from the file (NULL after a failed check). */
static rb_session *save_reopen(rb_model *m, rb_session *s, const char *path)
{
    rb_error err;
    rb_session_params p = params();
    p.file_flags = RB_SAVE_ON_REQUEST;
    CHECK_EQ_INT(rb_session_save(s, path, RB_SAVE_ON_REQUEST), RB_OK);
    rb_session_destroy(s);
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_OK);
    return s;
}

/*
 * A rewind into a page the session file holds (a client that edits the
 * last reply of a reopened conversation). The page the cut falls in keeps
 * its record for the positions before the cut: after a reopen, the feed
 * restores it from the file instead of recomputing it (before: the record
 * was forgotten and up to a page of positions recomputed). Its positions
 * after the cut are written again, so no copy of it is identical any more:
 * a complete trim writes it (before the fix to the saved flag the trim
 * dropped it as saved, and the restore read the file's stale positions).
 * Every logit equals a session that computed the same tokens in one feed.
 */
static void reopen_rewind_test(rb_model *m)
{
    rb_error err;
    char path[600];
    snprintf(path, sizeof path, "%s.reopen-rewind", sess_path);
    static int32_t toks[N_PROMPT + 64];
    float want[V];
    rb_session_params p = params();
    p.file_flags = RB_SAVE_ON_REQUEST; /* as serve opens: feeds do not commit */
    /* cut 0: inside the partly filled last page; cut 1: inside a full page */
    const size_t fed[2] = {300, 512}, cut[2] = {280, 500};
    for (int c = 0; c < 2; c++) {
        unlink(path);
        rb_session *s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
        if (!s)
            return;
        memcpy(toks, prompt, fed[c] * sizeof *toks);
        CHECK_EQ_INT(rb_session_feed(s, toks, fed[c], NULL), RB_OK);
        if (!(s = save_reopen(m, s, path)))
            return;
        CHECK_EQ_INT(rb_session_rewind(s, cut[c]), RB_OK);
        size_t n = cut[c];
        for (int i = 0; i < 20; i++)
            toks[n + i] = next_token();
        CHECK_EQ_INT(rb_session_feed(s, &toks[n], 20, NULL), RB_OK);
        n += 20;
        CHECK_EQ_INT(rb_session_debug_recomputed_tokens(s), 0);
        reference_logits(m, toks, n, want);
        CHECK(same_logits(s, want));
        /* every page out, then one more token: the cut page comes back as
           the session wrote it */
        CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
        toks[n] = next_token();
        CHECK_EQ_INT(rb_session_feed(s, &toks[n], 1, NULL), RB_OK);
        n++;
        reference_logits(m, toks, n, want);
        CHECK(same_logits(s, want));
        /* saved and reopened: the same tokens, and the next logits */
        if (!(s = save_reopen(m, s, path)))
            return;
        CHECK_EQ_INT(rb_session_n_tokens(s), n);
        CHECK(memcmp(rb_session_get_tokens(s), toks, n * sizeof *toks) == 0);
        toks[n] = next_token();
        CHECK_EQ_INT(rb_session_feed(s, &toks[n], 1, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_debug_recomputed_tokens(s), 0);
        reference_logits(m, toks, n + 1, want);
        CHECK(same_logits(s, want));
        rb_session_destroy(s);
    }
    unlink(path);
    printf("rewind into a saved page after a reopen: restored, not recomputed; a trim "
           "writes the page the cut fell in; logits exact (2 cuts)\n");
}

/* A slow disk for the race test: every page record (64 KiB) takes 10 ms
 * to write, so that a commit is still writing when the test acts. While
 * the test holds the gate, the storage worker's page writes wait in it
 * (at most 10 s) instead: the worker then holds its page pinned for as
 * long as the test needs, whatever the machine's speed. */
static pthread_t race_thread;
static atomic_int gate_closed, in_gate;
static ssize_t slow_pwrite(int fd, const void *b, size_t n, off_t off)
{
    if (n >= 65536) {
        struct timespec ts = {0, 10000000};
        if (atomic_load(&gate_closed) && !pthread_equal(pthread_self(), race_thread)) {
            atomic_fetch_add(&in_gate, 1);
            ts.tv_nsec = 1000000;
            for (int i = 0; i < 10000 && atomic_load(&gate_closed); i++)
                nanosleep(&ts, NULL);
            atomic_fetch_sub(&in_gate, 1);
        } else {
            nanosleep(&ts, NULL);
        }
    }
    return pwrite(fd, b, n, off);
}

/* Returns 1 once the storage worker waits in the gate with a page pinned,
 * 0 if it wrote no page within 2 s (a commit after a trim may have only
 * its state to write). */
static int wait_in_gate(void)
{
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < 2000 && !atomic_load(&in_gate); i++)
        nanosleep(&ts, NULL);
    return atomic_load(&in_gate) > 0;
}

/* Returns once the storage worker has taken the commit handed over last. */
static void wait_commit_started(rb_session *s)
{
    for (int i = 0; i < 40000; i++) {
        rb_session_writer_stats ws;
        rb_session_debug_writer_stats(s, &ws);
        if (ws.n_started + ws.n_coalesced >= ws.n_submitted)
            return;
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

/*
 * 7. Write-behind racing the session. Each round feeds past a page's end
 * (its commit writes a page per layer, 10 ms each on a slow disk), waits
 * until the storage worker is writing layer 0's new page, then races it:
 * a trim by level (waits for that page's unpin; the later layers' pages
 * are trimmed before the worker reaches them, so it skips them), a trim by
 * bytes (skips the pinned page, never waits), or a rewind into that page
 * (the forget waits for the unpin; the worker's later pins are refused);
 * then single-token feeds restore from the file, the spill and the RAM
 * tier while the worker still writes. The file, reopened, holds exactly
 * the session's tokens, and its next logits are bit-identical to a session
 * that computed those tokens in one go.
 */
static void race_test(rb_model *m)
{
    enum { CAP = 1000, P = 256 };
    static int32_t truth[CAP];
    size_t n = 0;
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = params();
    char path[600];
    race_thread = pthread_self();
    snprintf(path, sizeof path, "%s.race", sess_path);
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s)
        return;
    rb_os slow = *rb_os_default();
    slow.pwrite = slow_pwrite;
    rb_session_debug_set_file_os(s, &slow);
    for (; n < 10; n++)
        truth[n] = next_token();
    CHECK_EQ_INT(rb_session_feed(s, truth, n, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
    int n_trims = 0, n_rewinds = 0, n_gated = 0;
    for (int iter = 0; iter < 12; iter++) {
        /* past the current page's end: that page is full, its commit writes it */
        size_t k = P - n % P + (size_t)(next_token() % 60);
        if (n + k + 8 > CAP - 10)
            k = 1;
        for (size_t i = 0; i < k; i++)
            truth[n + i] = next_token();
        if (iter % 3 == 1)
            atomic_store(&gate_closed, 1);
        CHECK_EQ_INT(rb_session_feed(s, truth + n, k, NULL), RB_OK);
        n += k;
        wait_commit_started(s);
        switch (iter % 3) {
        case 0:
            CHECK_EQ_INT(rb_session_trim(s, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
            n_trims++;
            break;
        case 1:
            /* the worker holds its page pinned in the gate: the trim by
               bytes skips that page and returns without waiting for it */
            if (wait_in_gate()) {
                n_gated++;
                CHECK_EQ_INT(rb_session_trim(s, 64u << 20, RB_TRIM_BYTES, NULL), RB_OK);
                CHECK(atomic_load(&in_gate) > 0); /* it did not wait for the page */
            } else {
                CHECK_EQ_INT(rb_session_trim(s, 64u << 20, RB_TRIM_BYTES, NULL), RB_OK);
            }
            atomic_store(&gate_closed, 0);
            n_trims++;
            break;
        default: {
            /* into the page being written: its positions are recomputed */
            size_t full = n / P * P, to = full - P + 1 + (size_t)(next_token() % 200);
            CHECK_EQ_INT(rb_session_rewind(s, to), RB_OK);
            n = to;
            n_rewinds++;
            break;
        }
        }
        /* single tokens: restores run while the commit still writes */
        for (int i = 0; i < 4; i++) {
            truth[n] = next_token();
            CHECK_EQ_INT(rb_session_feed(s, &truth[n], 1, NULL), RB_OK);
            n++;
        }
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        CHECK_EQ_INT(st.file_status, RB_OK);
    }
    rb_session_writer_stats ws;
    rb_session_debug_writer_stats(s, &ws);
    uint64_t waits = 0, skips = 0, stale = 0;
    rb_residency_pin_counts(rb_session_debug_residency(s), &waits, &skips, &stale);
    uint64_t n_handover;
    double handover_s, handover_max_s;
    rb_session_debug_handover(s, &n_handover, &handover_s, &handover_max_s);
    printf("write-behind race: %d trims, %d rewinds, %zu tokens; %llu commits handed over, "
           "%llu while one ran, %llu coalesced, %llu found the worker's mutex taken; "
           "hand-over %.1f us mean, %.1f us max; a commit %.2f ms mean; a trim or forget "
           "waited for the page being written %llu times, a trim by bytes skipped it %llu "
           "times (%d trims by bytes with the worker held at a page), %llu pins refused after a forget\n", n_trims, n_rewinds, n,
           (unsigned long long)ws.n_submitted, (unsigned long long)ws.n_overlapped,
           (unsigned long long)ws.n_coalesced, (unsigned long long)ws.n_contended,
           handover_s / (double)n_handover * 1e6, handover_max_s * 1e6,
           ws.run_s / (double)(ws.n_run + !ws.n_run) * 1e3, (unsigned long long)waits,
           (unsigned long long)skips, n_gated, (unsigned long long)stale);
    CHECK(ws.n_overlapped > 0); /* feeds went on while commits ran */
    CHECK(waits > 0);           /* the rewinds' forgets, at least */
    CHECK(stale > 0);
    CHECK(n_gated > 0);
    CHECK(skips > 0); /* the trims by bytes, at the gated page */
    CHECK_EQ_INT(ws.n_failed, 0);
    rb_session_destroy(s); /* the pending commit runs */

    /* the reference: the same tokens in one feed, then 11 */
    float want[V];
    int32_t next = 11;
    rb_session *r = NULL;
    rb_session_params rp = params();
    CHECK_EQ_INT(rb_session_create(m, &rp, &r, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(r, truth, n, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(r, &next, 1, NULL), RB_OK);
    memcpy(want, rb_session_get_logits(r), sizeof want);
    rb_session_destroy(r);

    rb_model *cold = NULL;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &cold, &err), RB_OK);
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved(cold, &rp, path, &s, &err), RB_OK);
    if (s) {
        CHECK_EQ_INT(rb_session_n_tokens(s), n);
        CHECK(memcmp(rb_session_get_tokens(s), truth, n * sizeof(int32_t)) == 0);
        CHECK_EQ_INT(rb_session_feed(s, &next, 1, NULL), RB_OK);
        CHECK(same_logits(s, want));
        rb_session_stats st;
        rb_session_get_stats(s, &st);
        CHECK_EQ_INT(st.n_spill_damaged, 0);
        /* the file held every full page: only the tail was recomputed */
        CHECK(st.restore_recomputed_tokens < P);
        rb_session_destroy(s);
    }
    rb_model_close(cold);
    unlink(path);
}

/*
 * 8. A full disk under write-behind (in a child: RLIMIT_FSIZE at the
 * file's size makes every append fail with EFBIG): the background commit's
 * failure shows in the stats and the session's message, the session goes
 * on with the right logits, and the file keeps its previous state.
 */
static void full_disk_behind(rb_model *m)
{
    char path[600];
    snprintf(path, sizeof path, "%s.full", sess_path);
    float want[V];
    int32_t next = 11;
    {
        rb_session *r = NULL;
        rb_error err;
        rb_session_params p = params();
        CHECK_EQ_INT(rb_session_create(m, &p, &r, &err), RB_OK);
        CHECK_EQ_INT(rb_session_feed(r, prompt, 300, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_feed(r, &next, 1, NULL), RB_OK);
        memcpy(want, rb_session_get_logits(r), sizeof want);
        rb_session_destroy(r);
    }
    pid_t pid = fork();
    if (pid == 0) {
        rb_session *s = NULL;
        rb_error err;
        rb_session_params p = params();
        if (rb_session_create(m, &p, &s, &err) != RB_OK || rb_session_feed(s, prompt, 100, NULL)
            != RB_OK || rb_session_save(s, path, 0) != RB_OK)
            _exit(2);
        long size = file_size(path);
        struct rlimit lim = {(rlim_t)size, (rlim_t)size};
        signal(SIGXFSZ, SIG_IGN);
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0)
            _exit(3);
        /* crosses page 0's end: its commit must append pages, and fails */
        if (rb_session_feed(s, prompt + 100, 200, NULL) != RB_OK)
            _exit(4);
        rb_session_stats st;
        for (int i = 0; i < 2000; i++) { /* the worker reports within ~2 s */
            rb_session_get_stats(s, &st);
            if (st.file_status != RB_OK)
                break;
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (st.file_status == RB_OK)
            _exit(5);
        if (rb_session_feed(s, &next, 1, NULL) != RB_OK) /* the session goes on */
            _exit(6);
        if (!strstr(rb_session_errmsg(s), "File too large"))
            _exit(7);
        if (!same_logits(s, want))
            _exit(8);
        if (rb_session_save(s, path, 0) == RB_OK) /* explicit: the error is returned */
            _exit(9);
        rb_session_destroy(s);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
    rb_session *s = NULL;
    rb_error err;
    rb_session_params p = params();
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_OK);
    if (s) {
        CHECK_EQ_INT(rb_session_n_tokens(s), 100); /* the previous state */
        rb_session_destroy(s);
    }
    unlink(path);
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
    rb_sessfile_geom g = {2, 1, 8, 8, 16, 4, 2 * 16 * 16 * 2, 4096, 64, 0, 0, 0};
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
    uint64_t fp42 = 42, fp43 = 43;
    CHECK_EQ_INT(rb_sessfile_open(path, &fp42, &g, NULL, NULL, &f, &err), RB_OK);
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
    CHECK_EQ_INT(rb_sessfile_open(path, &fp43, &g, NULL, NULL, &f, &err), RB_E_INVALID_ARG);
    /* the model checked after the open (a cold start) */
    CHECK_EQ_INT(rb_sessfile_open(path, NULL, &g, NULL, NULL, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_check_model(f, 42, &err), RB_OK);
        CHECK_EQ_INT(rb_sessfile_check_model(f, 43, &err), RB_E_INVALID_ARG);
        CHECK(strstr(err.message, "another model") != NULL);
        rb_sessfile_close(f);
    }
    for (int i = 0; i < 8; i++)
        free(pages[i]);
    unlink(path);
}

/* ---- crafted files: every field checked before use ------------------- */

#define SB_ACTIVE 64
#define SB_CAT_BYTES 72
#define SB_CAT_HASH 80
#define SB_DATA_END 88
#define SB_HASH 96

static const rb_sessfile_geom unit_geom = {2, 1, 8, 8, 16, 4, 2 * 16 * 16 * 2, 4096, 64,
                                           64, 100, 0};

static void pread_at(const char *path, void *buf, size_t n, long off)
{
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0 && pread(fd, buf, n, off) == (ssize_t)n);
    if (fd >= 0)
        close(fd);
}

static void pwrite_at(const char *path, const void *buf, size_t n, long off)
{
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && pwrite(fd, buf, n, off) == (ssize_t)n);
    if (fd >= 0)
        close(fd);
}

/* The slot of the newest superblock, read into sb (4 KiB). */
static int newest_sb(const char *path, uint8_t *sb)
{
    uint8_t a[4096], b[4096];
    pread_at(path, a, 4096, 0);
    pread_at(path, b, 4096, 4096);
    uint64_t sa, sbq;
    memcpy(&sa, a + 8, 8);
    memcpy(&sbq, b + 8, 8);
    int slot = sbq > sa;
    memcpy(sb, slot ? b : a, 4096);
    return slot;
}

/* Sets a field of the newest superblock and its checksum: a crafted file
 * that no checksum catches. */
static void craft_sb(const char *path, size_t field, uint64_t v, size_t width)
{
    uint8_t sb[4096];
    int slot = newest_sb(path, sb);
    memcpy(sb + field, &v, width);
    uint64_t h = rb_kvcodec_hash64(sb, SB_HASH);
    memcpy(sb + SB_HASH, &h, 8);
    pwrite_at(path, sb, 4096, slot * 4096L);
}

/* Writes n bytes at off into the newest catalog; rehash: its checksum and
 * the superblock's follow (crafted), else the catalog is plainly damaged. */
static void craft_cat(const char *path, size_t off, const void *bytes, size_t n, int rehash)
{
    uint8_t sb[4096];
    int slot = newest_sb(path, sb);
    uint32_t active;
    uint64_t area, cat_bytes;
    memcpy(&active, sb + SB_ACTIVE, 4);
    memcpy(&area, sb + 56, 8);
    memcpy(&cat_bytes, sb + SB_CAT_BYTES, 8);
    uint8_t *cat = malloc(cat_bytes);
    long cat_off = 8192 + (long)(active * area);
    pread_at(path, cat, cat_bytes, cat_off);
    memcpy(cat + off, bytes, n);
    pwrite_at(path, cat, cat_bytes, cat_off);
    if (rehash) {
        uint64_t h = rb_kvcodec_hash64(cat, cat_bytes);
        memcpy(sb + SB_CAT_HASH, &h, 8);
        h = rb_kvcodec_hash64(sb, SB_HASH);
        memcpy(sb + SB_HASH, &h, 8);
        pwrite_at(path, sb, 4096, slot * 4096L);
    }
    free(cat);
}

/* A unit file of two states: 20 tokens (seq 2), then 40 (seq 3). */
static void make_unit(const char *path)
{
    rb_sessfile *f = NULL;
    rb_error err;
    unlink(path);
    CHECK_EQ_INT(rb_sessfile_create(path, 42, &unit_geom, NULL, NULL, &f, &err), RB_OK);
    if (!f)
        return;
    void *pages[8];
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
    CHECK_EQ_INT(rb_sessfile_commit(f, toks, 40, &src, 1, "abcd", 4, 0, NULL, &err), RB_OK);
    rb_sessfile_close(f);
    for (int i = 0; i < 8; i++)
        free(pages[i]);
}

static rb_status open_unit(const char *path, rb_sessfile **f, rb_error *err)
{
    *f = NULL;
    return rb_sessfile_open(path, NULL, &unit_geom, NULL, NULL, f, err);
}

/* rb_sessfile_read_pages: a layer's pages whose records lie side by side
 * in one request (a request per such run), the same bytes as one by one;
 * a page not saved refused (nothing read) or, a damaged page, an error
 * naming it. make_unit's
 * second commit appends layer 0's pages 1 and 2 side by side; its page 0
 * is the first commit's. */
static void read_pages_test(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s.runs", sess_path);
    make_unit(path);
    rb_sessfile *f = NULL;
    rb_error err;
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (!f)
        return;
    void *one[2], *run[3];
    for (int i = 0; i < 2; i++)
        one[i] = aligned_alloc(4096, 4096);
    for (int i = 0; i < 3; i++) {
        run[i] = aligned_alloc(4096, 4096);
        memset(run[i], 0xee, 4096);
    }
    CHECK_EQ_INT(rb_sessfile_read_pages(f, 0, 1, 2, run, &err), RB_OK);
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(rb_sessfile_read_page(f, 0, 1 + (uint32_t)i, one[i], &err), RB_OK);
        CHECK(memcmp(one[i], run[i], unit_geom.page_bytes) == 0);
        CHECK(((unsigned char *)run[i])[0] == 2 + i); /* make_unit's page p holds p + 1 */
    }
    /* not side by side (page 0 is the first commit's): a request per run,
       the same bytes */
    memset(run[0], 0xee, 4096);
    CHECK_EQ_INT(rb_sessfile_read_pages(f, 0, 0, 3, run, &err), RB_OK);
    CHECK(((unsigned char *)run[0])[0] == 1 && ((unsigned char *)run[2])[0] == 3);
    /* past the layer, a page not saved, none: refused, nothing read */
    memset(run[0], 0xee, 4096);
    CHECK_EQ_INT(rb_sessfile_read_pages(f, 0, 2, 3, run, &err), RB_E_UNSUPPORTED);
    CHECK(((unsigned char *)run[0])[0] == 0xee);
    CHECK_EQ_INT(rb_sessfile_read_pages(f, 0, 3, 1, run, &err), RB_E_UNSUPPORTED);
    CHECK_EQ_INT(rb_sessfile_read_pages(f, 2, 0, 1, run, &err), RB_E_UNSUPPORTED);
    CHECK_EQ_INT(rb_sessfile_read_pages(f, 0, 1, 0, run, &err), RB_E_UNSUPPORTED);
    rb_sessfile_close(f);
    /* layer 0's page 2 damaged: the run fails naming it */
    FILE *fp = fopen(path, "rb");
    long off = -1;
    unsigned char blk[4096];
    for (long o = 0; fp && fread(blk, 1, sizeof blk, fp) == sizeof blk; o += 4096)
        if (blk[0] == 3 && blk[unit_geom.page_bytes - 1] == 3 && off < 0)
            off = o;
    if (fp)
        fclose(fp);
    CHECK(off > 0);
    if (off > 0)
        flip_byte(path, off + 100);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_read_pages(f, 0, 1, 2, run, &err), RB_E_FORMAT);
        CHECK(strstr(err.message, "layer 0 page 2 fails its checksum") != NULL);
        CHECK_EQ_INT(rb_sessfile_read_page(f, 0, 1, one[0], &err), RB_OK);
        rb_sessfile_close(f);
    }
    for (int i = 0; i < 2; i++)
        free(one[i]);
    for (int i = 0; i < 3; i++)
        free(run[i]);
    unlink(path);
    printf("read_pages: side by side in one request, the same bytes; else refused or the "
           "damaged page named\n");
}

static void crafted_test(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s.crafted", sess_path);
    rb_sessfile *f = NULL;
    rb_error err;
    uint64_t lost = 0;

    /* an active catalog area of 2: the older state, said so */
    make_unit(path);
    craft_sb(path, SB_ACTIVE, 2, 4);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 20);
        const char *why = rb_sessfile_recovery(f, NULL);
        CHECK(why && strstr(why, "catalog area 2"));
        rb_sessfile_close(f);
    }

    /* a data end of 1 TiB: the next commit appends at the file's end */
    make_unit(path);
    craft_sb(path, SB_DATA_END, 1ull << 40, 8);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 40);
        void *pg = aligned_alloc(4096, 4096);
        memset(pg, 7, 4096);
        void *slots[8] = {pg, pg, pg, pg, pg, pg, pg, pg};
        rb_sessfile_slot_table tab = {slots, 4};
        rb_sessfile_source src = rb_sessfile_slots(&tab);
        int32_t toks[48] = {0};
        CHECK_EQ_INT(rb_sessfile_commit(f, toks, 48, &src, 1, NULL, 0, 0, NULL, &err), RB_OK);
        rb_sessfile_close(f);
        free(pg);
        CHECK(file_size(path) < (1L << 20));
    }

    /* a sequence number at its end (found by fuzz_sessfile): a commit
       wrapped it to 0, so the next open chose the state before the commit
       (an acknowledged commit lost); now refused, the state kept */
    make_unit(path);
    craft_sb(path, 8, UINT64_MAX, 8);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 40);
        int32_t toks[48] = {0};
        CHECK_EQ_INT(rb_sessfile_commit(f, toks, 48, NULL, 0, NULL, 0, 0, NULL, &err),
                     RB_E_FORMAT);
        CHECK(strstr(err.message, "sequence number is 18446744073709551615"));
        rb_sessfile_close(f);
        CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
        if (f) {
            CHECK_EQ_INT(rb_sessfile_n_tokens(f), 40);
            rb_sessfile_close(f);
        }
    }

    /* a superblock in the slot its sequence number does not write (found
       by fuzz_sessfile): the next commit would overwrite the state it
       opened from, and a kill in that write leave none; now it counts as
       damaged and the other state opens, said so */
    make_unit(path);
    {
        uint8_t sb[4096];
        int slot = newest_sb(path, sb);
        uint64_t seq;
        memcpy(&seq, sb + 8, 8);
        CHECK_EQ_INT((int)(seq % 2), slot);
        craft_sb(path, 8, seq + 1, 8);
    }
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 20);
        const char *why = rb_sessfile_recovery(f, NULL);
        CHECK(why && strstr(why, "superblock"));
        rb_sessfile_close(f);
    }

    /* a token outside the vocabulary (checksums valid): named, no state */
    make_unit(path);
    int32_t bad = 150;
    craft_cat(path, 8 + 4 * 3, &bad, 4, 1);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_E_FORMAT);
    CHECK(strstr(err.message, "token 3 is 150, outside the model's vocabulary of 100"));

    /* more tokens than this session's context: the -c that opens it */
    make_unit(path);
    rb_sessfile_geom g = unit_geom;
    g.n_ctx = 30;
    CHECK_EQ_INT(rb_sessfile_open(path, NULL, &g, NULL, NULL, &f, &err), RB_E_UNSUPPORTED);
    CHECK(strstr(err.message, "holds 40 tokens, saved with n_ctx 64") &&
          strstr(err.message, "open it with n_ctx 64"));

    /* a page record beyond the data end, one beyond the tokens: damaged
       (the older state opens, and says why) */
    make_unit(path);
    uint64_t far = 1ull << 40;
    craft_cat(path, 8 + 4 * 40, &far, 8, 1);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 20);
        const char *why = rb_sessfile_recovery(f, &lost);
        CHECK(why && strstr(why, "layer 0 page 0"));
        CHECK_EQ_INT(lost, 20);
        rb_sessfile_close(f);
    }
    make_unit(path);
    uint8_t entry[24];
    pread_at(path, entry, 8, 0); /* any nonzero offset: checked below */
    uint64_t off0;
    {
        uint8_t sb[4096];
        newest_sb(path, sb);
        uint32_t active;
        uint64_t area;
        memcpy(&active, sb + SB_ACTIVE, 4);
        memcpy(&area, sb + 56, 8);
        uint8_t cat[8 + 4 * 40 + 24];
        pread_at(path, cat, sizeof cat, 8192 + (long)(active * area));
        memcpy(&off0, cat + 8 + 4 * 40, 8);
        memcpy(entry, cat + 8 + 4 * 40, 24);
    }
    uint32_t held = 16;
    memcpy(entry + 16, &held, 4);
    craft_cat(path, 8 + 4 * 40 + 24 * 3, entry, 24, 1); /* layer 0 page 3: tokens 48.. */
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 20);
        rb_sessfile_close(f);
    }

    /* a catalog damaged (no crafting): the older state, with what was lost */
    make_unit(path);
    craft_cat(path, 8 + 4 * 30, &bad, 4, 0);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 20);
        const char *why = rb_sessfile_recovery(f, &lost);
        CHECK(why && strstr(why, "fails its checksum"));
        CHECK_EQ_INT(lost, 20);
        rb_sessfile_close(f);
    }
    /* both catalog areas unusable: an error saying what */
    make_unit(path);
    craft_sb(path, SB_ACTIVE, 2, 4);
    {
        uint8_t sb[4096];
        int slot = newest_sb(path, sb);
        uint8_t other[4096];
        pread_at(path, other, 4096, (1 - slot) * 4096L);
        uint32_t two = 2;
        memcpy(other + SB_ACTIVE, &two, 4);
        uint64_t h = rb_kvcodec_hash64(other, SB_HASH);
        memcpy(other + SB_HASH, &h, 8);
        pwrite_at(path, other, 4096, (1 - slot) * 4096L);
    }
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_E_FORMAT);
    CHECK(strstr(err.message, "no readable state") && strstr(err.message, "catalog area 2"));
    unlink(path);
}

/* ---- files and paths --------------------------------------------------- */

static void files_test(void)
{
    rb_sessfile *f = NULL, *f2 = NULL;
    rb_error err;
    int32_t toks[40];
    for (int i = 0; i < 40; i++)
        toks[i] = i;
    char path[700];
    snprintf(path, sizeof path, "%s.files", sess_path);
    unlink(path);

    /* created atomically: nothing at path until the first real state */
    CHECK_EQ_INT(rb_sessfile_create(path, 42, &unit_geom, NULL, NULL, &f, &err), RB_OK);
    CHECK(access(path, F_OK) != 0);
    /* a second creator of the same new file: the first to commit wins,
       the other is told (never a mix of the two) */
    CHECK_EQ_INT(rb_sessfile_create(path, 42, &unit_geom, NULL, NULL, &f2, &err), RB_OK);
    if (f && f2) {
        CHECK_EQ_INT(rb_sessfile_commit(f2, toks, 7, NULL, 0, "b", 1, 0, NULL, &err), RB_OK);
        CHECK_EQ_INT(rb_sessfile_commit(f, toks, 5, NULL, 0, "a", 1, 0, NULL, &err), RB_E_BUSY);
        CHECK(strstr(err.message, "another process created it meanwhile"));
    }
    rb_sessfile_close(f);
    rb_sessfile_close(f2);
    struct stat st;
    CHECK(stat(path, &st) == 0 && (st.st_mode & 0777) == 0600);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 7);
        /* one writer at a time, in this process too */
        CHECK_EQ_INT(open_unit(path, &f2, &err), RB_E_BUSY);
        char pid[32];
        snprintf(pid, sizeof pid, "process %ld", (long)getpid());
        CHECK(strstr(err.message, pid) != NULL);
        CHECK_EQ_INT(rb_sessfile_create(path, 42, &unit_geom, NULL, NULL, &f2, &err),
                     RB_E_BUSY);
        rb_sessfile_close(f);
    }

    /* another process holds it: named; killed, its lock is gone */
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    pid_t child = fork();
    if (child == 0) {
        rb_sessfile *cf = NULL;
        rb_error cerr;
        char c = rb_sessfile_open(path, NULL, &unit_geom, NULL, NULL, &cf, &cerr) == RB_OK;
        if (write(pfd[1], &c, 1) != 1)
            _exit(1);
        sleep(30);
        _exit(0);
    }
    char ok = 0;
    CHECK(read(pfd[0], &ok, 1) == 1 && ok == 1);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_E_BUSY);
    char who[48];
    snprintf(who, sizeof who, "in use by process %ld", (long)child);
    CHECK(strstr(err.message, who) != NULL);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    rb_sessfile_close(f);
    /* with wait: the open waits until the holder ends */
    child = fork();
    if (child == 0) {
        rb_sessfile *cf = NULL;
        rb_error cerr;
        char c = rb_sessfile_open(path, NULL, &unit_geom, NULL, NULL, &cf, &cerr) == RB_OK;
        if (write(pfd[1], &c, 1) != 1)
            _exit(1);
        usleep(300000);
        _exit(0);
    }
    CHECK(read(pfd[0], &ok, 1) == 1 && ok == 1);
    rb_sessfile_geom gw = unit_geom;
    gw.is_lock_wait = 1;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_EQ_INT(rb_sessfile_open(path, NULL, &gw, NULL, NULL, &f, &err), RB_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    CHECK((t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec) > 0.1);
    rb_sessfile_close(f);
    waitpid(child, NULL, 0);
    close(pfd[0]);
    close(pfd[1]);

    /* a link that leads nowhere is refused and left as it is; a link to a
       file is followed (the link stays a link) */
    char link_path[720], target[720];
    snprintf(link_path, sizeof link_path, "%s.link", path);
    snprintf(target, sizeof target, "%s.missing", path);
    unlink(link_path);
    CHECK(symlink(target, link_path) == 0);
    CHECK_EQ_INT(rb_sessfile_create(link_path, 42, &unit_geom, NULL, NULL, &f, &err), RB_E_IO);
    CHECK(strstr(err.message, "symbolic link that leads nowhere") != NULL);
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
    unlink(link_path);
    CHECK(symlink(link_path, link_path) == 0); /* a loop */
    CHECK_EQ_INT(rb_sessfile_create(link_path, 42, &unit_geom, NULL, NULL, &f, &err), RB_E_IO);
    unlink(link_path);
    CHECK(symlink(path, link_path) == 0);
    CHECK_EQ_INT(rb_sessfile_create(link_path, 42, &unit_geom, NULL, NULL, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_commit(f, toks, 9, NULL, 0, NULL, 0, 0, NULL, &err), RB_OK);
        rb_sessfile_close(f);
    }
    CHECK(lstat(link_path, &st) == 0 && S_ISLNK(st.st_mode));
    CHECK_EQ_INT(open_unit(path, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_sessfile_n_tokens(f), 9);
        rb_sessfile_close(f);
    }
    unlink(link_path);
    unlink(path);

    /* long paths: A of 511 characters and B = A + ".2" are two files */
    char dir[800], a[800], b[810];
    snprintf(dir, sizeof dir, "%s/", REBOUND_TEST_TMP);
    while (strlen(dir) < 400) {
        strcat(dir, "dddddddddddddddddddddddddddddddddddddddddddddddddd");
        mkdir(dir, 0700);
        strcat(dir, "/");
    }
    snprintf(a, sizeof a, "%s", dir);
    while (strlen(a) < 511)
        strcat(a, "a");
    snprintf(b, sizeof b, "%s.2", a);
    for (int k = 0; k < 2; k++) {
        const char *p = k ? b : a;
        unlink(p);
        CHECK_EQ_INT(rb_sessfile_create(p, 42, &unit_geom, NULL, NULL, &f, &err), RB_OK);
        if (f) {
            CHECK_EQ_INT(rb_sessfile_commit(f, toks, 10 + k, NULL, 0, NULL, 0, 0, NULL, &err),
                         RB_OK);
            rb_sessfile_close(f);
        }
    }
    for (int k = 0; k < 2; k++) {
        CHECK_EQ_INT(open_unit(k ? b : a, &f, &err), RB_OK);
        if (f) {
            CHECK_EQ_INT(rb_sessfile_n_tokens(f), 10 + k);
            rb_sessfile_close(f);
        }
        unlink(k ? b : a);
    }
}

/* ---- a session and a file that do not fit ----------------------------- */

static void mismatch_test(rb_model *m)
{
    rb_error err;
    char path[600];
    snprintf(path, sizeof path, "%s.mismatch", sess_path);
    unlink(path);
    /* saved at -c 512 with 400 tokens, opened at -c 300 (the same number
       of pages): an error naming the -c, never a write past the tokens */
    rb_session *s = NULL;
    rb_session_params p = params();
    p.n_ctx = 512;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, prompt, 400, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
    rb_session_destroy(s);
    p.n_ctx = 300;
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_E_UNSUPPORTED);
    CHECK(strstr(err.message, "holds 400 tokens, saved with n_ctx 512") &&
          strstr(err.message, "open it with n_ctx 512"));
    rb_session_destroy(s);

    /* a token outside the vocabulary (checksums valid): its value named */
    int32_t bad = 9999;
    craft_cat(path, 8 + 4 * 17, &bad, 4, 1);
    p.n_ctx = 512;
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_E_FORMAT);
    CHECK(strstr(err.message, "token 17 is 9999") != NULL);
    rb_session_destroy(s);

    /* a model of other dimensions: said as that */
    char dims_path[600];
    snprintf(dims_path, sizeof dims_path, "%s/sessfile-dims.gguf", REBOUND_TEST_TMP);
    make_model_sized(dims_path, 5, 128, 2, 256);
    rb_model *o = NULL;
    CHECK_EQ_INT(rb_model_open(dims_path, NULL, &o, &err), RB_OK);
    s = NULL;
    p = params();
    CHECK_EQ_INT(rb_session_open_saved(o, &p, sess_path, &s, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "written for another model: 3 layers, 2 KV heads, head dims "
                              "32/32") != NULL);
    rb_session_destroy(s);
    rb_model_close(o);
    unlink(dims_path);

    /* a damaged newest state: the stats and the message say what was lost */
    unlink(path);
    s = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, prompt, 100, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, RB_SAVE_ON_REQUEST), RB_OK);
    CHECK_EQ_INT(rb_session_feed(s, prompt + 100, 6, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, RB_SAVE_ON_REQUEST), RB_OK);
    rb_session_destroy(s);
    craft_cat(path, 8 + 4 * 50, &bad, 4, 0);
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_OK);
    if (s) {
        rb_session_stats st;
        CHECK_EQ_INT(rb_session_get_stats(s, &st), RB_OK);
        CHECK_EQ_INT(rb_session_n_tokens(s), 100);
        CHECK(st.file_recovery && strstr(st.file_recovery, "newest state"));
        CHECK_EQ_INT(st.file_lost_tokens, 6);
        rb_session_destroy(s);
    }
    unlink(path);
}

/* Saves that rewrite the last page (a chat's turns) leave garbage; the file
 * reclaims it, staying within about twice its live pages, and reopens
 * with the same logits. */
static void garbage_test(rb_model *m)
{
    rb_error err;
    char path[600], target[620];
    snprintf(path, sizeof path, "%s.garbage", sess_path);
    snprintf(target, sizeof target, "%s.target", path);
    unlink(path);
    unlink(target);
    /* through a link: the compactions replace its target, never the link */
    FILE *tf = fopen(target, "wb");
    CHECK(tf != NULL);
    if (tf)
        fclose(tf);
    CHECK(symlink(target, path) == 0);
    rb_session *s = NULL;
    rb_session_params p = params();
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s)
        return;
    const long page = (long)rb_kvcache_page_alloc_bytes(rb_session_kvcache(s));
    CHECK_EQ_INT(rb_session_feed(s, prompt, 300, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
    long first = file_size(path), most = first; /* 3 layers x 2 pages */
    for (int i = 0; i < 30; i++) {
        CHECK_EQ_INT(rb_session_feed(s, &prompt[300 + i], 1, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
        long now = file_size(path);
        most = now > most ? now : most;
    }
    rb_session_destroy(s);
    /* without reclaiming: 90 more pages (3 per save) */
    CHECK(most <= first + 16 * page);
    struct stat lst;
    CHECK(lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode));
    printf("garbage: 30 saves grew the file by at most %ld pages (3 rewritten per save)\n",
           (most - first) / page);
    float want[V];
    rb_session *r = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &r, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(r, prompt, 330, NULL), RB_OK);
    int32_t t = 11;
    CHECK_EQ_INT(rb_session_feed(r, &t, 1, NULL), RB_OK);
    memcpy(want, rb_session_get_logits(r), sizeof want);
    rb_session_destroy(r);
    s = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_OK);
    if (s) {
        CHECK_EQ_INT(rb_session_n_tokens(s), 330);
        CHECK_EQ_INT(rb_session_feed(s, &t, 1, NULL), RB_OK);
        CHECK(same_logits(s, want));
        rb_session_destroy(s);
    }
    unlink(path);
    unlink(target);
}

/* Commits behind the feeds (no save after the first) reclaim garbage too:
 * 12 rounds of a rewind by 100 tokens and 100 fed again rewrite a full
 * page per layer each (36 pages of garbage without a compaction); the
 * file's data stays within twice its live pages, and it reopens with every
 * token and the logits of a session that never left RAM. */
static void rewind_garbage_test(rb_model *m)
{
    rb_error err;
    char path[600];
    snprintf(path, sizeof path, "%s.rewinds", sess_path);
    unlink(path);
    rb_session *s = NULL;
    rb_session_params p = params();
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s)
        return;
    const long page = (long)rb_kvcache_page_alloc_bytes(rb_session_kvcache(s));
    const long n_layers = (long)rb_session_kvcache(s)->n_layers, pt = (long)rb_session_kvcache(s)->page_tokens;
    CHECK_EQ_INT(rb_session_feed(s, prompt, 300, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
    /* the catalog areas and the 300 tokens' pages (the last partly filled) */
    const long first = file_size(path), live = n_layers * ((300 + pt - 1) / pt) * page;
    long most = first;
    for (int i = 0; i < 12; i++) {
        CHECK_EQ_INT(rb_session_rewind(s, 200), RB_OK);
        CHECK_EQ_INT(rb_session_feed(s, &prompt[200], 100, NULL), RB_OK);
        rb_session_debug_wait_writer(s); /* the commit behind the feed */
        long now = file_size(path);
        most = now > most ? now : most;
    }
    rb_session_destroy(s);
    CHECK(most <= first + live + n_layers * page);
    printf("rewind garbage: 12 rounds grew the file by at most %ld pages (%ld live; 36 "
           "rewritten)\n", (most - first) / page, live / page);
    int32_t t = 11;
    float want[V];
    rb_session *r = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &r, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(r, prompt, 300, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(r, &t, 1, NULL), RB_OK);
    memcpy(want, rb_session_get_logits(r), sizeof want);
    rb_session_destroy(r);
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_OK);
    if (s) {
        CHECK_EQ_INT(rb_session_n_tokens(s), 300);
        CHECK_EQ_INT(rb_session_feed(s, &t, 1, NULL), RB_OK);
        CHECK(same_logits(s, want));
        rb_session_destroy(s);
    }
    unlink(path);
}

/* Clean turns and reopens, with compactions among them (a chat resumed
 * turn after turn): every open finds both superblocks whole and reports
 * no recovery. A compaction that wrote one superblock slot of the file it
 * renames over the old one made the next open say "superblock 0 is
 * damaged" on a healthy file (issue 27). */
static void clean_reopen_test(rb_model *m)
{
    rb_error err;
    char path[600];
    snprintf(path, sizeof path, "%s.clean", sess_path);
    unlink(path);
    rb_session *s = NULL;
    rb_session_params p = params();
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s)
        return;
    CHECK_EQ_INT(rb_session_feed(s, prompt, 300, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
    rb_session_destroy(s);
    struct stat st0;
    CHECK(stat(path, &st0) == 0);
    int n_rewrites = 0, n_warned = 0;
    const int n_rounds = 24;
    for (int i = 0; i <= n_rounds; i++) {
        s = NULL;
        CHECK_EQ_INT(rb_session_open_saved(m, &p, path, &s, &err), RB_OK);
        if (!s)
            break;
        rb_session_stats ss;
        CHECK_EQ_INT(rb_session_get_stats(s, &ss), RB_OK);
        if (ss.file_recovery || ss.file_lost_tokens) {
            if (!n_warned++)
                printf("clean reopen %d: file_recovery \"%s\"\n", i,
                       ss.file_recovery ? ss.file_recovery : "");
        }
        CHECK_EQ_INT(rb_session_n_tokens(s), 300 + i);
        if (i < n_rounds) { /* one turn: a token, saved at the exit as chat does */
            CHECK_EQ_INT(rb_session_feed(s, &prompt[300 + i], 1, NULL), RB_OK);
            CHECK_EQ_INT(rb_session_save(s, path, 0), RB_OK);
        }
        rb_session_destroy(s); /* a clean exit */
        struct stat st1;
        CHECK(stat(path, &st1) == 0);
        if (st1.st_ino != st0.st_ino) /* a compaction renamed a new file over it */
            n_rewrites++;
        st0 = st1;
    }
    CHECK_EQ_INT(n_warned, 0);
    CHECK(n_rewrites >= 2);
    printf("clean reopens: %d rounds, %d compactions, %d opens reported a recovery\n", n_rounds,
           n_rewrites, n_warned);
    unlink(path);
}

int main(int argc, char **argv)
{
    snprintf(model_path, sizeof model_path, "%s/sessfile.gguf", REBOUND_TEST_TMP);
    snprintf(other_path, sizeof other_path, "%s/sessfile-other.gguf", REBOUND_TEST_TMP);
    snprintf(sess_path, sizeof sess_path, "%s/sessfile.session", REBOUND_TEST_TMP);
    uint64_t r = 99;
    for (int i = 0; i < N_PROMPT + 64; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((r >> 33) % V);
    }
    if (argc > 1 && strcmp(argv[1], "sigbus-child") == 0) { /* sigbus_guard_test */
        sigbus_child();
        return check_report();
    }
    make_model(model_path, 3);
    make_model(other_path, 4);
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
    sigbus_guard_test();
    reopen_logits_test(m);
    mapped_weights_test();
    open_restore_test(want);
    unbind_test(m, want);

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
        memcpy(want2, rb_session_get_logits(r2), sizeof want2);
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
    crafted_test();
    read_pages_test();
    files_test();
    mismatch_test(m);
    garbage_test(m);
    clean_reopen_test(m);
    rewind_garbage_test(m);
    reopen_rewind_test(m);
    full_disk_behind(m);
    race_test(m);
    kill_loop(m);

    rb_model_close(m);
    unlink(sess_path);
    unlink(model_path);
    unlink(other_path);
    return check_report();
}
