/*
 * test_fork.c - rb_session_fork: sessions that share KV pages.
 *
 * Exactness: a source fed 700 tokens (2 full pages and a partly filled
 * one) is forked at 0, mid-page, a page boundary, mid-page of the last
 * page and at all of it; both then go on with different tokens, and every
 * state of either is compared bit for bit with a fresh unshared session
 * fed the same tokens (check_same). Each then rewinds below the shared
 * prefix (into a shared page) and feeds; the other must be unaffected.
 * A trim of one holder (its copies to storage) leaves the other exact,
 * and its restore is exact. Forks' session files link one prefix file instead of
 * writing the prefix (prefix_files); reopened, a fork restores exact, and
 * reopened beside another holder of the prefix it shares those pages
 * (rb_session_open_saved_sharing) and reads only its own. The pool's budget takes the holders' own
 * pages before the shared ones (budget_keeps_shared).
 *
 * Accounting: the pool's shared bytes plus every session's own KV bytes
 * equal the distinct page buffers that the caches really hold (counted
 * here from the page tables), before and after rewinds, trims and
 * destroys; 0 shared bytes once every holder let go.
 *
 * Threads (for TSan): a source and two forks are fed on three threads,
 * each rewinding now and then (once into a page the others share), one
 * with a session file whose writer reads its pages behind its feeds, while
 * a fourth trims the pool to storage and back; then each is checked bit
 * for bit against a fresh session.
 */
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "kvcache.h"
#include "rebound_experimental.h"
#include "residency.h"
#include "session_debug.h"
#include "testlib.h"

#define N_CTX 1024
#define N_SRC 700
#define N_MORE 300

static char model_path[512];
static int32_t toks[N_SRC + 3 * N_MORE];
static size_t V;
static uint32_t page_tokens; /* the sessions' kv_page_tokens (0: 256) */

static rb_session_params params(rb_pool *pool)
{
    rb_session_params p = rb_session_default_params();
    p.n_ctx = N_CTX;
    p.kv_page_tokens = page_tokens;
    p.n_threads = 2;
    p.pool = pool;
    static rb_experimental_params x;
    x = rb_experimental_default_params();
    x.decode_bytes_per_s = 1e9;
    x.storage_bytes_per_s = 1e9;
    p.experimental = &x;
    return p;
}

/* s's last logits against a fresh session (a pool of its own) fed s's
 * tokens in one feed: 1 when every bit is equal. */
static int check_same(rb_model *m, rb_session *s, const char *what)
{
    const size_t n = rb_session_n_tokens(s);
    const float *got = rb_session_get_logits(s);
    if (!got || n == 0) {
        fprintf(stderr, "%s: no logits\n", what);
        return 0;
    }
    rb_session_params p = params(NULL);
    p.kv_page_tokens = 0; /* 256: the logits are the same bits at any page size */
    rb_session *f = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_session_create(m, &p, &f, &err), RB_OK);
    if (!f)
        return 0;
    CHECK_EQ_INT(rb_session_feed(f, rb_session_get_tokens(s), n, NULL), RB_OK);
    const float *want = rb_session_get_logits(f);
    int same = want && memcmp(want, got, V * sizeof *got) == 0;
    if (!same)
        fprintf(stderr, "%s: logits differ from a fresh session's (%zu tokens)\n", what, n);
    rb_session_destroy(f);
    return same;
}

static int cmp_ptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* The pool's count of the sessions' KV in RAM (its shared account and each
 * session's own bytes, the numbers the pool sums) against the distinct page
 * buffers in their page tables plus their compressed frames. */
static void check_accounts(rb_pool *pool, rb_session **ss, int k, int line)
{
    size_t cap = 0, n = 0;
    for (int i = 0; i < k; i++) {
        rb_kvcache *kv = rb_session_kvcache(ss[i]);
        cap += (size_t)kv->n_layers * kv->pages_per_layer;
    }
    uintptr_t *ptrs = malloc((cap + 1) * sizeof *ptrs);
    uint64_t own = 0, frames = 0, alloc = 0;
    for (int i = 0; i < k; i++) {
        rb_kvcache *kv = rb_session_kvcache(ss[i]);
        alloc = rb_kvcache_page_alloc_bytes(kv);
        for (size_t id = 0; id < (size_t)kv->n_layers * kv->pages_per_layer; id++)
            if (kv->pages[id])
                ptrs[n++] = (uintptr_t)kv->pages[id];
        rb_residency_bytes b;
        rb_residency_get_bytes(rb_session_debug_residency(ss[i]), &b);
        own += b.kv_ram_bytes;
        rb_session_stats st;
        CHECK_EQ_INT(rb_session_get_stats(ss[i], &st), RB_OK);
        frames += st.kv_compressed_bytes;
    }
    qsort(ptrs, n, sizeof *ptrs, cmp_ptr);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++)
        distinct += i == 0 || ptrs[i] != ptrs[i - 1];
    free(ptrs);
    rb_pool_stats ps;
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    if (ps.shared_kv_bytes + own != distinct * alloc + frames)
        fprintf(stderr, "line %d: accounts: shared %" PRIu64 " + own %" PRIu64 " != %zu "
                "distinct pages x %" PRIu64 " + frames %" PRIu64 "\n", line,
                ps.shared_kv_bytes, own, distinct, alloc, frames);
    CHECK_EQ_U64(ps.shared_kv_bytes + own, distinct * alloc + frames);
    CHECK_EQ_U64(ps.shared_kv_bytes, ps.n_shared_kv_pages * alloc);
}

/* A pool of its own and a source session in it, fed toks[0, N_SRC). */
static rb_session *fed_source(rb_model *m, rb_pool **pool)
{
    rb_error err;
    *pool = NULL;
    CHECK_EQ_INT(rb_pool_create(m, 0, pool, &err), RB_OK);
    rb_session_params p = params(*pool);
    rb_session *src = NULL;
    CHECK_EQ_INT(rb_session_create(m, &p, &src, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(src, toks, N_SRC, NULL), RB_OK);
    return src;
}

/* One fork point: the source and its fork diverge, rewind, trim. */
static void fork_at(rb_model *m, size_t n)
{
    char what[96];
    rb_pool *pool = NULL;
    rb_error err;
    rb_session *src = fed_source(m, &pool), *f = NULL;
    CHECK_EQ_INT(rb_session_fork(src, n, NULL, &f, &err), RB_OK);
    if (!f)
        return;
    rb_session *both[2] = {src, f};
    CHECK_EQ_INT(rb_session_n_tokens(f), n);
    CHECK(memcmp(rb_session_get_tokens(f), toks, n * sizeof *toks) == 0);
    rb_pool_stats ps;
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    const rb_kvcache *kv = rb_session_kvcache(src);
    CHECK_EQ_U64(ps.n_shared_kv_pages, (uint64_t)(n / kv->page_tokens) * kv->n_layers);
    CHECK_EQ_INT(rb_session_debug_kv_valid(f), n); /* nothing to recompute */
    check_accounts(pool, both, 2, __LINE__);
    if (n == N_SRC) {
        snprintf(what, sizeof what, "fork at %zu, as forked", n);
        CHECK(check_same(m, f, what)); /* the source's last logits */
    }
    /* different tokens to each */
    CHECK_EQ_INT(rb_session_feed(f, toks + N_SRC, 37, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_debug_recomputed_tokens(f), 0);
    CHECK_EQ_INT(rb_session_feed(src, toks + N_SRC + N_MORE, 20, NULL), RB_OK);
    snprintf(what, sizeof what, "fork at %zu: the fork", n);
    CHECK(check_same(m, f, what));
    snprintf(what, sizeof what, "fork at %zu: the source", n);
    CHECK(check_same(m, src, what));
    check_accounts(pool, both, 2, __LINE__);
    /* the fork rewinds into a shared page and feeds: the source unaffected */
    if (n > 10) {
        CHECK_EQ_INT(rb_session_rewind(f, n / 2 + 3), RB_OK);
        CHECK_EQ_INT(rb_session_feed(f, toks + N_SRC + 2 * N_MORE, 30, NULL), RB_OK);
        snprintf(what, sizeof what, "fork at %zu: the fork rewound", n);
        CHECK(check_same(m, f, what));
        CHECK_EQ_INT(rb_session_feed(src, toks + N_SRC + N_MORE + 20, 1, NULL), RB_OK);
        snprintf(what, sizeof what, "fork at %zu: the source after the fork's rewind", n);
        CHECK(check_same(m, src, what));
        check_accounts(pool, both, 2, __LINE__);
    }
    /* the source rewinds into the first page and feeds: the fork unaffected */
    CHECK_EQ_INT(rb_session_rewind(src, 100), RB_OK);
    CHECK_EQ_INT(rb_session_feed(src, toks + N_SRC + 2 * N_MORE + 50, 40, NULL), RB_OK);
    snprintf(what, sizeof what, "fork at %zu: the source rewound", n);
    CHECK(check_same(m, src, what));
    CHECK_EQ_INT(rb_session_feed(f, toks + 5, 3, NULL), RB_OK);
    snprintf(what, sizeof what, "fork at %zu: the fork after the source's rewind", n);
    CHECK(check_same(m, f, what));
    check_accounts(pool, both, 2, __LINE__);
    /* a trim of the fork (its copies to its tiers) leaves the source exact */
    CHECK_EQ_INT(rb_session_trim(f, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    check_accounts(pool, both, 2, __LINE__);
    CHECK_EQ_INT(rb_session_feed(src, toks + 9, 2, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(f, toks + 11, 2, NULL), RB_OK);
    snprintf(what, sizeof what, "fork at %zu: the source after a trim", n);
    CHECK(check_same(m, src, what));
    snprintf(what, sizeof what, "fork at %zu: the fork restored", n);
    CHECK(check_same(m, f, what));
    check_accounts(pool, both, 2, __LINE__);
    /* destroy in the other order from the one before */
    rb_session *first = n % 2 ? f : src, *second = n % 2 ? src : f;
    rb_session_destroy(first);
    check_accounts(pool, &second, 1, __LINE__);
    rb_session_destroy(second);
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK_EQ_U64(ps.shared_kv_bytes, 0);
    CHECK_EQ_U64(ps.n_shared_kv_pages, 0);
    rb_pool_destroy(pool);
}

/* A fork keeps sharing after its source is trimmed first: the trimmed
 * prefix is brought back for the fork. And the errors. */
static void fork_trimmed_and_errors(rb_model *m)
{
    rb_pool *pool = NULL;
    rb_error err;
    rb_session *src = fed_source(m, &pool), *f = NULL;
    CHECK_EQ_INT(rb_session_trim(src, 0, RB_TRIM_COMPLETE, NULL), RB_OK);
    /* a fork of the first 300 tokens brings back only the two pages it
       takes: the source's third stays stored */
    rb_session *h = NULL;
    CHECK_EQ_INT(rb_session_fork(src, 300, NULL, &h, &err), RB_OK);
    const rb_kvcache *ks = rb_session_kvcache(src);
    uint32_t back = 0, third = 0;
    for (uint32_t l = 0; l < ks->n_layers; l++) {
        back += ks->pages[(size_t)l * ks->pages_per_layer] != NULL &&
                ks->pages[(size_t)l * ks->pages_per_layer + 1] != NULL;
        third += ks->pages[(size_t)l * ks->pages_per_layer + 2] != NULL;
    }
    CHECK_EQ_INT(back, ks->n_layers);
    CHECK_EQ_INT(third, 0);
    if (h) {
        CHECK_EQ_INT(rb_session_feed(h, toks + N_SRC, 5, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_debug_recomputed_tokens(h), 0);
        CHECK(check_same(m, h, "a fork of a trimmed source's first 300 tokens"));
        rb_session_destroy(h);
    }
    CHECK_EQ_INT(rb_session_fork(src, 600, NULL, &f, &err), RB_OK);
    if (f) {
        CHECK_EQ_INT(rb_session_feed(f, toks + N_SRC, 5, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_debug_recomputed_tokens(f), 0);
        CHECK(check_same(m, f, "fork of a trimmed source"));
        rb_session *both[2] = {src, f};
        check_accounts(pool, both, 2, __LINE__);
    }
    rb_session *g = NULL;
    CHECK_EQ_INT(rb_session_fork(src, N_SRC + 1, NULL, &g, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "holds 700");
    rb_pool *other = NULL;
    CHECK_EQ_INT(rb_pool_create(m, 0, &other, &err), RB_OK);
    rb_session_params q = params(other);
    CHECK_EQ_INT(rb_session_fork(src, 10, &q, &g, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "source's pool");
    q = params(NULL);
    q.n_ctx = 512;
    CHECK_EQ_INT(rb_session_fork(src, 10, &q, &g, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "n_ctx");
    q.n_ctx = 0;
    q.kv_type_k = RB_KV_Q8_0;
    CHECK_EQ_INT(rb_session_fork(src, 10, &q, &g, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "KV types");
    CHECK(g == NULL);
    CHECK_EQ_INT(rb_session_fork(NULL, 0, NULL, &g, &err), RB_E_INVALID_ARG);
    rb_session_destroy(src);
    rb_session_destroy(f);
    rb_pool_destroy(other);
    rb_pool_destroy(pool);
    /* a source with a pool of its own: the fork joins it and outlives src */
    rb_session_params own = params(NULL);
    own.budget_bytes = 1ull << 40;
    src = f = NULL;
    CHECK_EQ_INT(rb_session_create(m, &own, &src, &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(src, toks, 300, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_fork(src, 300, NULL, &f, &err), RB_OK);
    rb_session_destroy(src);
    if (f) {
        CHECK_EQ_INT(rb_session_feed(f, toks + 400, 4, NULL), RB_OK);
        CHECK(check_same(m, f, "a fork whose source (and its pool's owner) is gone"));
        rb_session_destroy(f);
    }
}

/* The budget takes every member's own KV before the pages they share. A
 * feed counts the shared pages it holds as held (no room asked for a
 * fork's prefix). A trim that needs less than the unshared pages leaves
 * every shared page in both caches (letting one go would free no RAM,
 * and both would read it back); two pages more go from both holders
 * alike; a budget below all of it takes them too (counted in
 * n_shared_trims), and both sessions restore exact. */
static void budget_keeps_shared(rb_model *m)
{
    rb_pool *pool = NULL;
    rb_error err;
    rb_session *src = fed_source(m, &pool), *f = NULL;
    CHECK_EQ_INT(rb_session_fork(src, 512, NULL, &f, &err), RB_OK);
    if (!f)
        return;
    CHECK_EQ_INT(rb_session_feed(f, toks + N_SRC, 37, NULL), RB_OK);
    rb_session *both[2] = {src, f};
    const rb_kvcache *ks = rb_session_kvcache(src), *kf = rb_session_kvcache(f);
    const uint32_t ppl = ks->pages_per_layer, n_shared = 512 / ks->page_tokens;
    const uint64_t alloc = rb_kvcache_page_alloc_bytes(ks);
    rb_pool_stats ps;
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK_EQ_U64(ps.n_shared_kv_pages, (uint64_t)n_shared * ks->n_layers);
    /* a feed that needs no new page asks for no room: the pages it
       shares are held already (the pool counts them once) */
    CHECK_EQ_INT(rb_pool_set_budget(pool, ps.total_bytes + alloc), RB_OK);
    CHECK_EQ_INT(rb_session_feed(f, toks + N_SRC + 37, 1, NULL), RB_OK);
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK_EQ_U64(ps.trimmed_bytes, 0);
    /* each holds one own page a layer beyond the shared ones: ask for
       the room of half of those */
    const uint64_t budget = ps.total_bytes - (uint64_t)ks->n_layers * alloc;
    CHECK_EQ_INT(rb_pool_set_budget(pool, budget), RB_OK);
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK(ps.total_bytes <= budget);
    CHECK(ps.trimmed_bytes >= (uint64_t)ks->n_layers * alloc);
    CHECK_EQ_U64(ps.n_shared_trims, 0);
    CHECK_EQ_U64(ps.n_shared_kv_pages, (uint64_t)n_shared * ks->n_layers);
    uint32_t kept = 0;
    for (uint32_t l = 0; l < ks->n_layers; l++)
        for (uint32_t pg = 0; pg < n_shared; pg++) {
            const size_t id = (size_t)l * ppl + pg;
            kept += ks->pages[id] && ks->pages[id] == kf->pages[id] &&
                    rb_kvcache_slot_is_shared(ks, id) && rb_kvcache_slot_is_shared(kf, id);
        }
    CHECK_EQ_INT(kept, n_shared * ks->n_layers);
    check_accounts(pool, both, 2, __LINE__);
    /* two pages more than the own ones left: both holders let go of the
       same two shared pages (their RAM goes), the rest stays shared */
    uint64_t own = 0;
    for (int i = 0; i < 2; i++) {
        rb_residency_bytes rbb;
        rb_residency_get_bytes(rb_session_debug_residency(both[i]), &rbb);
        own += rbb.kv_ram_bytes;
    }
    CHECK_EQ_INT(rb_pool_set_budget(pool, ps.total_bytes - own - 2 * alloc), RB_OK);
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK_EQ_U64(ps.n_shared_trims, 1);
    CHECK_EQ_U64(ps.n_shared_kv_pages, (uint64_t)n_shared * ks->n_layers - 2);
    uint32_t still = 0;
    for (size_t id = 0; id < (size_t)ks->n_layers * ppl; id++)
        still += ks->pages[id] && ks->pages[id] == kf->pages[id];
    CHECK_EQ_U64(still, ps.n_shared_kv_pages);
    check_accounts(pool, both, 2, __LINE__);
    /* below the shared pages: they go too, and with their last holder */
    CHECK_EQ_INT(rb_pool_set_budget(pool, 1), RB_OK);
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK(ps.n_shared_trims >= 1);
    CHECK_EQ_U64(ps.shared_kv_bytes, 0);
    check_accounts(pool, both, 2, __LINE__);
    CHECK_EQ_INT(rb_pool_set_budget(pool, 0), RB_OK);
    CHECK_EQ_INT(rb_session_feed(src, toks + 3, 2, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_feed(f, toks + 7, 2, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_debug_recomputed_tokens(f), 0);
    CHECK(check_same(m, src, "the source after the budget took the shared pages"));
    CHECK(check_same(m, f, "the fork after the budget took the shared pages"));
    printf("budget: %u shared pages kept while the own ones went (trimmed %" PRIu64
           " B); below them, they went too (%" PRIu64 " shared trims)\n",
           kept, (uint64_t)ks->n_layers * alloc, ps.n_shared_trims);
    rb_session_destroy(f);
    rb_session_destroy(src);
    rb_pool_destroy(pool);
}

/* The page references by themselves: a share, a copy-on-write while
 * another holds the page, the page taken back by its last holder, the
 * last holder's free, and the account through all of it. */
static void kvcache_refs(void)
{
    rb_kvcache a, b, c;
    rb_error err;
    CHECK_EQ_INT(rb_kvcache_init(&a, 2, 2, 32, 32, 512, 256, &err), RB_OK);
    CHECK_EQ_INT(rb_kvcache_init(&b, 2, 2, 32, 32, 512, 256, &err), RB_OK);
    CHECK_EQ_INT(rb_kvcache_init(&c, 2, 2, 32, 32, 512, 256, &err), RB_OK);
    CHECK(rb_kvcache_same_layout(&a, &b));
    CHECK_EQ_INT(rb_kvcache_reserve(&a, 512, &err), RB_OK);
    memset(a.pages[0], 7, a.page_bytes);
    rb_kvshare *acct = rb_kvshare_create(), *other = rb_kvshare_create();
    const uint64_t n = rb_kvcache_page_alloc_bytes(&a);
    CHECK_EQ_INT(rb_kvcache_share_slot(&b, &a, 0, acct, &err), RB_OK);
    CHECK_EQ_INT(rb_kvcache_share_slot(&c, &a, 0, acct, &err), RB_OK);
    CHECK(b.pages[0] == a.pages[0] && c.pages[0] == a.pages[0]);
    CHECK_EQ_U64(atomic_load(&acct->bytes), n);
    CHECK_EQ_INT(atomic_load(&a.refs[0]->n), 3);
    CHECK_EQ_INT(rb_kvcache_share_slot(&b, &a, 1, other, &err), RB_E_INVALID_ARG);
    /* b writes: a copy, a and c keep theirs */
    void *shared = a.pages[0];
    CHECK_EQ_INT(rb_kvcache_unshare_slot(&b, 0, &err), RB_OK);
    CHECK(b.pages[0] != shared && !rb_kvcache_slot_is_shared(&b, 0));
    CHECK(memcmp(b.pages[0], shared, a.page_bytes) == 0);
    memset(b.pages[0], 9, 64);
    CHECK(((uint8_t *)a.pages[0])[0] == 7);
    CHECK_EQ_INT(atomic_load(&a.refs[0]->n), 2);
    /* a lets go; c is the last holder: its unshare takes the page itself */
    rb_kvcache_free_slot(&a, 0);
    CHECK_EQ_U64(atomic_load(&acct->bytes), n);
    CHECK_EQ_INT(rb_kvcache_unshare_slot(&c, 0, &err), RB_OK);
    CHECK(c.pages[0] == shared && !rb_kvcache_slot_is_shared(&c, 0));
    CHECK_EQ_U64(atomic_load(&acct->bytes), 0);
    CHECK_EQ_U64(atomic_load(&acct->n_pages), 0);
    /* shared again, then freed by whichever goes last */
    CHECK_EQ_INT(rb_kvcache_share_slot(&a, &c, 0, acct, &err), RB_OK);
    CHECK_EQ_U64(atomic_load(&acct->bytes), n);
    rb_kvcache_deinit(&c);
    CHECK_EQ_U64(atomic_load(&acct->bytes), n);
    CHECK(((uint8_t *)a.pages[0])[0] == 7);
    rb_kvcache_deinit(&a);
    CHECK_EQ_U64(atomic_load(&acct->bytes), 0);
    rb_kvcache_deinit(&b);
    rb_kvshare_release(acct); /* the last reference: the caches let theirs go */
    rb_kvshare_release(other);
}

/* ---- threads ------------------------------------------------------------ */

typedef struct worker {
    rb_session *s;
    const int32_t *toks;
    int n;
    rb_status st;
} worker;

static void *feed_worker(void *arg)
{
    worker *w = arg;
    w->st = RB_OK;
    for (int i = 0; i < w->n && w->st == RB_OK; i++) {
        w->st = rb_session_feed(w->s, w->toks + i * 3, 3, NULL);
        if (w->st == RB_OK && i % 5 == 4) /* back 3 tokens, now and then */
            w->st = rb_session_rewind(w->s, rb_session_n_tokens(w->s) - 3);
        if (w->st == RB_OK && i == 12) /* into a page the others share */
            w->st = rb_session_rewind(w->s, 300);
    }
    return NULL;
}

static _Atomic int stop_trims;

static void *trim_worker(void *arg)
{
    rb_pool *pool = arg;
    while (!stop_trims) {
        rb_pool_trim(pool, 1ull << 40, RB_TRIM_BYTES, NULL);
        rb_pool_trim(pool, 0, RB_TRIM_BACKGROUND, NULL);
    }
    return NULL;
}

static void threads(rb_model *m)
{
    rb_pool *pool = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_pool_create(m, 0, &pool, &err), RB_OK);
    rb_session_params p = params(pool);
    p.n_threads = 1;
    rb_session *ss[3] = {0};
    CHECK_EQ_INT(rb_session_create(m, &p, &ss[0], &err), RB_OK);
    CHECK_EQ_INT(rb_session_feed(ss[0], toks, N_SRC, NULL), RB_OK);
    CHECK_EQ_INT(rb_session_fork(ss[0], 520, &p, &ss[1], &err), RB_OK);
    CHECK_EQ_INT(rb_session_fork(ss[0], 512, &p, &ss[2], &err), RB_OK);
    if (!ss[1] || !ss[2])
        return;
    /* the fork's file writer reads its pages (shared ones too) behind its feeds */
    char path[600];
    snprintf(path, sizeof path, "%s/fork.rbs", REBOUND_TEST_TMP);
    unlink(path);
    CHECK_EQ_INT(rb_session_save(ss[1], path, 0), RB_OK);
    pthread_t th[4];
    worker w[3];
    stop_trims = 0;
    pthread_create(&th[3], NULL, trim_worker, pool);
    for (int i = 0; i < 3; i++) {
        w[i] = (worker){ss[i], toks + N_SRC + i * 100, 25, RB_OK};
        pthread_create(&th[i], NULL, feed_worker, &w[i]);
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    stop_trims = 1;
    pthread_join(th[3], NULL);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(w[i].st, RB_OK);
        char what[48];
        snprintf(what, sizeof what, "threads: session %d", i);
        /* the last feed's logits (a rewind cleared them: feed once more) */
        CHECK_EQ_INT(rb_session_feed(ss[i], toks + 1, 1, NULL), RB_OK);
        CHECK(check_same(m, ss[i], what));
    }
    check_accounts(pool, ss, 3, __LINE__);
    for (int i = 0; i < 3; i++)
        rb_session_destroy(ss[i]);
    rb_pool_stats ps;
    CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
    CHECK_EQ_U64(ps.shared_kv_bytes, 0);
    rb_pool_destroy(pool);
}

/* Prefix files in a folder: the names there and their link counts. */
static int n_prefix_files(const char *dir, nlink_t *links)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, ".rbprefix-", 10)) {
            char p[1200];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
            if (stat(p, &st) == 0 && links)
                *links = st.st_nlink;
            n++;
        }
    if (d)
        closedir(d);
    return n;
}

static uint64_t file_stat(rb_session *s, int prefix)
{
    rb_session_stats st;
    CHECK_EQ_INT(rb_session_get_stats(s, &st), RB_OK);
    return prefix ? st.file_prefix_pages : st.file_pages_written;
}

/* Forks' files share their prefix's pages on storage: the first fork's
 * first commit writes the prefix file and links to it, the second links to
 * the same one and writes only its tail; trimmed to storage and reopened,
 * both come back bit for bit; the prefix file goes with its last link; a
 * file whose prefix file is gone opens with its tokens and recomputes. */
static void prefix_files(rb_model *m)
{
    char dir[512], path[4][600];
    rb_test_tmp_path(dir, sizeof dir, "test_fork", "prefix");
    mkdir(dir, 0700);
    const char *names[4] = {"src", "f1", "f2", "f3"};
    for (int i = 0; i < 4; i++) {
        snprintf(path[i], sizeof path[i], "%s/%s.rbs", dir, names[i]);
        rb_session_remove_file(path[i], NULL);
    }
    rb_pool *pool = NULL;
    rb_error err;
    page_tokens = 64;
    rb_session *src = fed_source(m, &pool), *f[3] = {0};
    CHECK_EQ_INT(rb_session_save(src, path[0], 0), RB_OK);
    CHECK_EQ_U64(file_stat(src, 1), 0); /* nothing shared yet: its own pages */
    CHECK_EQ_INT(n_prefix_files(dir, NULL), 0);
    /* 600 tokens: 9 full pages of 64 shared, 24 tokens of a tenth */
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(rb_session_fork(src, 600, NULL, &f[i], &err), RB_OK);
        if (!f[i])
            goto out;
        CHECK_EQ_INT(rb_session_save(f[i], path[1 + i], RB_SAVE_ON_REQUEST), RB_OK);
        CHECK_EQ_U64(file_stat(f[i], 1), 9 * 3);
        CHECK_EQ_U64(file_stat(f[i], 0), 3); /* the partly filled tenth page */
    }
    nlink_t links = 0;
    CHECK_EQ_INT(n_prefix_files(dir, &links), 1);
    CHECK_EQ_U64(links, 4); /* its name and three forks' links */
    /* the forks go on; everything to storage; each comes back exact */
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(rb_session_feed(f[i], toks + N_SRC + i * N_MORE, 100, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_save(f[i], path[1 + i], RB_SAVE_ON_REQUEST), RB_OK);
    }
    CHECK_EQ_INT(rb_pool_trim(pool, 1ull << 40, RB_TRIM_BYTES, NULL), RB_OK);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(rb_session_feed(f[i], toks + 1, 1, NULL), RB_OK);
        CHECK(check_same(m, f[i], "prefix files: a fork restored from its prefix file"));
    }
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(rb_session_save(f[i], path[1 + i], 0), RB_OK);
        rb_session_destroy(f[i]);
        f[i] = NULL;
    }
    /* reopened: the prefix's pages from the prefix file */
    rb_session_params p = params(pool);
    rb_pool_stats ps;
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path[1], &f[0], &err), RB_OK);
    if (f[0]) {
        CHECK_EQ_U64(file_stat(f[0], 1), 9 * 3);
        CHECK_EQ_INT(rb_session_n_tokens(f[0]), 701);
        CHECK_EQ_INT(rb_session_feed(f[0], toks + 2, 1, NULL), RB_OK);
        rb_session_stats st;
        CHECK_EQ_INT(rb_session_get_stats(f[0], &st), RB_OK);
        CHECK(st.file_recovery == NULL);
        CHECK_EQ_INT(st.restore_recomputed_tokens, 0);
        CHECK(check_same(m, f[0], "prefix files: a fork reopened"));
        /* the second fork reopened beside it, trimmed first: the prefix
           read back once into it, then shared, not read again */
        CHECK_EQ_INT(rb_pool_trim(pool, 1ull << 40, RB_TRIM_BYTES, NULL), RB_OK);
        CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
        const uint64_t shared0 = ps.n_shared_kv_pages;
        CHECK_EQ_INT(rb_session_open_saved_sharing(m, &p, path[2], f[0], &f[1], &err), RB_OK);
        CHECK_EQ_INT(rb_pool_get_stats(pool, &ps), RB_OK);
        CHECK_EQ_U64(ps.n_shared_kv_pages, shared0 + 9 * 3);
        if (f[1]) {
            CHECK_EQ_INT(rb_session_feed(f[1], toks + 3, 1, NULL), RB_OK);
            CHECK_EQ_INT(rb_session_get_stats(f[1], &st), RB_OK);
            CHECK_EQ_INT(st.restore_recomputed_tokens, 0);
            /* it read its own pages only: the tenth and eleventh of 3 layers */
            CHECK(st.restore_bytes_io > 0);
            CHECK(st.restore_bytes_io <= 2 * 3 * rb_kvcache_page_alloc_bytes(rb_session_kvcache(f[1])));
            CHECK(check_same(m, f[1], "prefix files: a fork reopened sharing its prefix"));
            /* a peer in another pool is refused */
            rb_session *g = NULL;
            rb_session_params q = params(NULL);
            rb_pool *other = NULL;
            CHECK_EQ_INT(rb_pool_create(m, 0, &other, &err), RB_OK);
            q.pool = other;
            CHECK_EQ_INT(rb_session_open_saved_sharing(m, &q, path[2], f[0], &g, &err),
                         RB_E_INVALID_ARG);
            CHECK(strstr(err.message, "peer") != NULL);
            rb_pool_destroy(other);
            rb_session_destroy(f[1]);
            f[1] = NULL;
        }
        rb_session_destroy(f[0]);
        f[0] = NULL;
    }
    /* a file that is no fork saved over a fork's takes its link along */
    char base[700];
    snprintf(base, sizeof base, "%s.base", path[2]);
    CHECK_EQ_INT(access(base, F_OK), 0);
    CHECK_EQ_INT(rb_session_save(src, path[2], RB_SAVE_SNAPSHOT), RB_OK);
    CHECK(access(base, F_OK) != 0);
    CHECK_EQ_INT(n_prefix_files(dir, &links), 1);
    CHECK_EQ_U64(links, 3);
    /* removed one by one: the prefix file goes with the last link */
    CHECK_EQ_INT(rb_session_remove_file(path[1], &err), RB_OK);
    CHECK_EQ_INT(n_prefix_files(dir, &links), 1);
    CHECK_EQ_U64(links, 2);
    CHECK_EQ_INT(rb_session_remove_file(path[2], &err), RB_OK);
    CHECK_EQ_INT(n_prefix_files(dir, &links), 1);
    /* f3's link gone (a file copied without it): its tokens open, and the
       prefix's positions are computed again, exact */
    snprintf(base, sizeof base, "%s.base", path[3]);
    CHECK_EQ_INT(unlink(base), 0);
    CHECK_EQ_INT(n_prefix_files(dir, &links), 1);
    CHECK_EQ_U64(links, 1);
    CHECK_EQ_INT(rb_session_open_saved(m, &p, path[3], &f[0], &err), RB_OK);
    if (f[0]) {
        CHECK_EQ_INT(rb_session_n_tokens(f[0]), 701);
        rb_session_stats st;
        CHECK_EQ_INT(rb_session_get_stats(f[0], &st), RB_OK);
        CHECK(st.file_recovery && strstr(st.file_recovery, "prefix file") != NULL);
        CHECK_EQ_U64(st.file_prefix_pages, 0);
        CHECK_EQ_INT(rb_session_feed(f[0], toks + 2, 1, NULL), RB_OK);
        CHECK(check_same(m, f[0], "prefix files: a fork without its prefix file"));
        rb_session_destroy(f[0]);
        f[0] = NULL;
    }
    CHECK_EQ_INT(rb_session_remove_file(path[3], &err), RB_OK);
    CHECK_EQ_INT(n_prefix_files(dir, NULL), 0); /* the unlinked one swept */
    rb_session_destroy(src); /* bound to path[0] until here */
    src = NULL;
    CHECK_EQ_INT(rb_session_remove_file(path[0], &err), RB_OK);
    CHECK_EQ_INT(access(path[0], F_OK) != 0, 1);
    printf("prefix files: 3 forks of a 600-token prefix hold its 27 pages once on storage, "
           "restore and reopen exact, a reopened one shares them with an open one; the prefix "
           "file goes with its last link\n");
out:
    for (int i = 0; i < 3; i++)
        rb_session_destroy(f[i]);
    rb_session_destroy(src);
    rb_pool_destroy(pool);
    page_tokens = 0;
}

/* kv_page_tokens: a bad size, a fork of another size and a session file
 * of another size are errors that name the sizes. */
static void page_size_errors(rb_model *m)
{
    rb_error err;
    rb_session_params p = params(NULL);
    rb_session *s = NULL, *f = NULL;
    p.kv_page_tokens = 100;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "kv_page_tokens 100") != NULL);
    p.kv_page_tokens = 16;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
    p.kv_page_tokens = 2048;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_E_INVALID_ARG);
    p.kv_page_tokens = 64;
    CHECK_EQ_INT(rb_session_create(m, &p, &s, &err), RB_OK);
    if (!s)
        return;
    CHECK_EQ_INT(rb_session_feed(s, toks, 150, NULL), RB_OK);
    rb_session_params q = params(NULL);
    q.kv_page_tokens = 128;
    CHECK_EQ_INT(rb_session_fork(s, 100, &q, &f, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "kv_page_tokens 128 is not the source's 64") != NULL);
    char path[512];
    rb_test_tmp_path(path, sizeof path, "test_fork", "page64.rbs");
    CHECK_EQ_INT(rb_session_save(s, path, RB_SAVE_SNAPSHOT), RB_OK);
    q.kv_page_tokens = 256;
    CHECK_EQ_INT(rb_session_open_saved(m, &q, path, &f, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "pages of 64 tokens; this session's are 256") != NULL);
    for (int i = 0; i < 2; i++) { /* 64, and 0: the file's size */
        q.kv_page_tokens = i ? 0 : 64;
        f = NULL;
        CHECK_EQ_INT(rb_session_open_saved(m, &q, path, &f, &err), RB_OK);
        if (!f)
            continue;
        CHECK_EQ_INT(rb_session_n_tokens(f), 150);
        /* its pages are the file's: a fork at 64 is the source's size */
        rb_session *g = NULL;
        q.kv_page_tokens = 64;
        CHECK_EQ_INT(rb_session_fork(f, 100, &q, &g, &err), RB_OK);
        rb_session_destroy(g);
        rb_session_destroy(f);
    }
    /* a file whose superblocks do not read back: 0 falls to 256, and the
       open names what is wrong */
    FILE *bad = fopen(path, "r+b");
    CHECK(bad != NULL);
    if (bad) {
        char junk[8192];
        memset(junk, 0x5a, sizeof junk);
        CHECK(fwrite(junk, 1, sizeof junk, bad) == sizeof junk);
        fclose(bad);
    }
    q.kv_page_tokens = 0;
    f = NULL;
    CHECK_EQ_INT(rb_session_open_saved(m, &q, path, &f, &err), RB_E_FORMAT);
    CHECK(strstr(err.message, "superblocks are damaged") != NULL);
    rb_session_destroy(f);
    printf("kv_page_tokens: 100 and 2048 refused; a fork and a file of another size refused, "
           "naming both; 0 opens a file at its own size\n");
    rb_session_destroy(s);
}

int main(void)
{
    uint64_t seed = 11;
    for (size_t i = 0; i < sizeof toks / sizeof *toks; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        toks[i] = (int32_t)(3 + (seed >> 33) % 500);
    }
    rb_test_tmp_path(model_path, sizeof model_path, "test_fork", "fork.gguf");
    CHECK_EQ_INT(rb_test_make_model(model_path, &(rb_test_model_spec){
                                                    .shape = "tiny", .n_embd = 128,
                                                    .n_layers = 3, .n_head = 4, .n_head_kv = 2,
                                                    .head_dim = 32, .n_ff = 256, .n_vocab = 512,
                                                    .n_ctx = N_CTX, .seed = 5}),
                 RB_OK);
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(model_path, NULL, &m, &err), RB_OK);
    if (!m)
        return check_report();
    CHECK_EQ_INT(rb_model_load_weights(m), RB_OK);
    V = 512;
    kvcache_refs();
    const size_t points[] = {0, 100, 256, 512, 600, N_SRC};
    for (size_t i = 0; i < sizeof points / sizeof *points; i++)
        fork_at(m, points[i]);
    fork_trimmed_and_errors(m);
    budget_keeps_shared(m);
    /* pages of 32 and 64 tokens: forks share pages of that size, every
       logit the same bits as a 256-token session's */
    const size_t points_small[] = {100, 600, N_SRC};
    for (page_tokens = 32; page_tokens <= 64; page_tokens *= 2)
        for (size_t i = 0; i < sizeof points_small / sizeof *points_small; i++)
            fork_at(m, points_small[i]);
    page_size_errors(m);
    page_tokens = 0;
    prefix_files(m);
    threads(m);
    rb_model_close(m);
    return check_report();
}
