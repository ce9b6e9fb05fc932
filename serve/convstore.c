/*
 * convstore.c - the conversations of `rebound serve` (convstore.h): a flat array
 * of sv_conv, searched linearly (the limits keep it to --max-conversations,
 * 64 by default), each with a copy of its tokens as last saved so that a
 * request without an id finds the conversation it continues by its
 * longest shared prefix; their sessions, opened from the files of the
 * --sessions folder when a request returns, closed (the file keeps them)
 * or deleted with their file when a limit says so, least recently used
 * first by the store's clock.
 *
 * Invariants: a busy conversation (a request is active on it) is never
 * closed or deleted; a conversation without a file and without a session
 * exists only between sv_store_add and its first sv_store_open; the files
 * change only in sv_store_commit (RB_SAVE_ON_REQUEST), so a kill -9 leaves
 * the previous turn or this one; the folder is locked (flock on the
 * folder itself) for the process's life. A remembered reply (sv_reply)
 * always matches its owner's session tokens at the last commit: the
 * tokens and the prefix hash are checked again at every commit and what
 * no longer matches is forgotten.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "convstore.h"


int sv_random(void *buf, size_t n)
{
    unsigned char *p = buf;
    while (n) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        p += k, n -= (size_t)k;
    }
    if (!n)
        return 0;
    FILE *f = fopen("/dev/urandom", "rb");
    size_t got = f ? fread(p, 1, n, f) : 0;
    if (f)
        fclose(f);
    return got == n ? 0 : -1;
}

void sv_store_init(sv_store *st, const sv_config *cfg, const rb_session_params *sp,
                   rb_model *model, rb_pool *pool, sv_metrics *metrics)
{
    memset(st, 0, sizeof *st);
    st->cfg = cfg;
    st->sp = *sp;
    st->model = model;
    st->pool = pool;
    st->metrics = metrics;
    st->lock_fd = -1;
    pthread_mutex_init(&st->replies.mu, NULL);
}

static void replies_drop(sv_store *st, const sv_conv *c);

void sv_store_deinit(sv_store *st)
{
    while (st->n_convs)
        sv_store_remove(st, st->convs[st->n_convs - 1]);
    free(st->convs);
    rb_session_destroy(st->spare);
    if (st->lock_fd >= 0)
        close(st->lock_fd);
    free(st->replies.v);
    pthread_mutex_destroy(&st->replies.mu);
    memset(st, 0, sizeof *st);
    st->lock_fd = -1;
}

/* ---- ids ------------------------------------------------------------------ */

int sv_id_is_valid(const char *id)
{
    size_t n = 0;
    for (; id[n]; n++) {
        char ch = id[n];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '-' || ch == '_'))
            return 0;
        if (n >= SV_ID_MAX)
            return 0;
    }
    return n > 0;
}

void sv_store_new_id(char *id)
{
    uint64_t r[2] = {0, 0};
    if (sv_random(r, sizeof r) != 0) { /* no random source at all: still unique here */
        static const uint64_t k = 0x9e3779b97f4a7c15ull;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r[0] = (uint64_t)ts.tv_nsec * k ^ (uint64_t)ts.tv_sec;
        r[1] = (uint64_t)getpid() * k ^ (uint64_t)(uintptr_t)id;
    }
    snprintf(id, SV_ID_MAX + 1, "c%016" PRIx64 "%016" PRIx64, r[0], r[1]);
}

void sv_store_path(const sv_store *st, const char *ns, const char *id, char *buf, size_t n)
{
    snprintf(buf, n, "%s/%s%s%s.rbs", st->cfg->sessions_dir, ns, ns[0] ? "/" : "", id);
}

/* ---- lookup --------------------------------------------------------------- */

sv_conv *sv_store_find(sv_store *st, const char *ns, const char *id)
{
    for (size_t i = 0; i < st->n_convs; i++)
        if (!strcmp(st->convs[i]->id, id) && !strcmp(st->convs[i]->ns, ns))
            return st->convs[i];
    return NULL;
}

sv_conv *sv_store_add(sv_store *st, const char *ns, const char *id)
{
    if (sv_grow((void **)&st->convs, &st->cap_convs, st->n_convs + 1, sizeof *st->convs))
        return NULL;
    sv_conv *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    snprintf(c->id, sizeof c->id, "%s", id);
    snprintf(c->ns, sizeof c->ns, "%s", ns);
    c->last_used = ++st->clock;
    st->convs[st->n_convs++] = c;
    return c;
}

void sv_store_remove(sv_store *st, sv_conv *c)
{
    for (size_t i = 0; i < st->n_convs; i++)
        if (st->convs[i] == c) {
            st->convs[i] = st->convs[--st->n_convs];
            break;
        }
    replies_drop(st, c);
    rb_session_destroy(c->session);
    free(c->tokens);
    free(c);
}

size_t sv_common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb)
{
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i])
        i++;
    return i;
}

sv_conv *sv_store_match(sv_store *st, const char *ns, const int32_t *toks, size_t n,
                        size_t *shared)
{
    sv_conv *c = NULL;
    size_t best = 0;
    for (size_t i = 0; i < st->n_convs; i++) {
        sv_conv *x = st->convs[i];
        if (x->is_busy || x->n_tokens == 0 || strcmp(x->ns, ns))
            continue;
        size_t k = sv_common_prefix(x->tokens, x->n_tokens, toks, n);
        /* of equals, one in RAM: a fork shares its pages, where a closed
           one's file would be read whole */
        const int is_open = x->session && !x->is_dropped;
        if (2 * k >= x->n_tokens && k &&
            (k > best || (k == best && is_open && !(c->session && !c->is_dropped))))
            best = k, c = x;
    }
    *shared = best;
    return c;
}

void sv_store_forget(sv_store *st, sv_conv *c)
{
    sv_store_remove(st, c);
}

void sv_store_touch(sv_store *st, sv_conv *c)
{
    c->last_used = ++st->clock;
}

/* ---- replies --------------------------------------------------------------- */

uint64_t sv_tokens_hash(const int32_t *toks, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = (uint32_t)toks[i];
        for (int b = 0; b < 4; b++, v >>= 8)
            h = (h ^ (v & 0xff)) * 0x100000001b3ull;
    }
    return h;
}

static void reply_free(sv_reply *e)
{
    free(e->toks);
    free(e->text);
}

/* Forgets entry i of the table (under mu). */
static void replies_erase(sv_replies *rp, size_t i)
{
    reply_free(&rp->v[i]);
    rp->v[i] = rp->v[--rp->n];
}

/* Forgets every reply of c. */
static void replies_drop(sv_store *st, const sv_conv *c)
{
    sv_replies *rp = &st->replies;
    pthread_mutex_lock(&rp->mu);
    for (size_t i = rp->n; i-- > 0;)
        if (rp->v[i].owner == c)
            replies_erase(rp, i);
    pthread_mutex_unlock(&rp->mu);
}

/* Adds a reply of c (tokens toks[0..n), copied) to the table. */
static int replies_put(sv_store *st, const sv_conv *c, size_t at, uint64_t prefix_hash,
                       const int32_t *toks, size_t n, size_t n_end, const char *text, size_t len)
{
    sv_reply e;
    memset(&e, 0, sizeof e);
    e.owner = c;
    snprintf(e.ns, sizeof e.ns, "%s", c->ns);
    snprintf(e.id, sizeof e.id, "%s", c->id);
    e.at = at, e.prefix_hash = prefix_hash, e.n = n, e.n_end = n_end, e.len = len;
    e.toks = malloc(n * sizeof *e.toks);
    e.text = malloc(len + 1);
    if (!e.toks || !e.text) {
        reply_free(&e);
        return -1;
    }
    memcpy(e.toks, toks, n * sizeof *e.toks);
    memcpy(e.text, text, len);
    e.text[len] = 0;
    sv_replies *rp = &st->replies;
    pthread_mutex_lock(&rp->mu);
    int rc = sv_grow((void **)&rp->v, &rp->cap, rp->n + 1, sizeof *rp->v);
    if (rc == 0) {
        e.seq = ++rp->seq;
        rp->v[rp->n++] = e;
    }
    pthread_mutex_unlock(&rp->mu);
    if (rc)
        reply_free(&e);
    return rc ? -1 : 0;
}

int sv_store_add_reply(sv_store *st, sv_conv *c, size_t at, size_t n_end, const char *text,
                       size_t len)
{
    size_t n_tok = rb_session_n_tokens(c->session);
    if (!len || at >= n_tok || n_end >= n_tok - at)
        return 0;
    const int32_t *t = rb_session_get_tokens(c->session);
    /* a reply at the same place replaces the one that was there (the same
       turn again: the commit's check would forget it anyway) */
    sv_replies *rp = &st->replies;
    pthread_mutex_lock(&rp->mu);
    for (size_t i = rp->n; i-- > 0;)
        if (rp->v[i].owner == c && rp->v[i].at + rp->v[i].n > at)
            replies_erase(rp, i);
    pthread_mutex_unlock(&rp->mu);
    return replies_put(st, c, at, sv_tokens_hash(t, at), t + at, n_tok - at, n_end, text, len);
}

void sv_store_inherit_replies(sv_store *st, const sv_conv *from, sv_conv *to, size_t shared)
{
    sv_replies *rp = &st->replies;
    /* the scheduler is the only writer: reading without the lock is safe;
       replies_put takes it (and may move rp->v: indices, not pointers) */
    size_t n = rp->n;
    for (size_t i = 0; i < n; i++) {
        const sv_reply *e = &rp->v[i];
        if (e->owner != from || e->at + e->n > shared)
            continue;
        sv_reply x = *e; /* its pointers stay valid: only this thread frees them */
        if (replies_put(st, to, x.at, x.prefix_hash, x.toks, x.n, x.n_end, x.text, x.len))
            return;
    }
}

int sv_replies_has_text(const sv_replies *rp, const char *ns, const char *text, size_t len)
{
    /* the lock is not part of the table's value: a lookup is logically const */
    pthread_mutex_t *mu = (pthread_mutex_t *)&rp->mu;
    int found = 0;
    pthread_mutex_lock(mu);
    for (size_t i = 0; i < rp->n && !found; i++)
        found = rp->v[i].len == len && !strcmp(rp->v[i].ns, ns) &&
                !memcmp(rp->v[i].text, text, len);
    pthread_mutex_unlock(mu);
    return found;
}

int sv_replies_find(const sv_replies *rp, const char *ns, const char *id, size_t at,
                    uint64_t prefix_hash, const char *text, size_t len, int32_t **toks,
                    size_t *n, size_t *n_end)
{
    pthread_mutex_t *mu = (pthread_mutex_t *)&rp->mu;
    const sv_reply *best = NULL;
    int rc = 0;
    pthread_mutex_lock(mu);
    for (size_t i = 0; i < rp->n; i++) {
        const sv_reply *e = &rp->v[i];
        if (e->at != at || e->prefix_hash != prefix_hash || e->len != len ||
            strcmp(e->ns, ns) || memcmp(e->text, text, len))
            continue;
        int named = id[0] && !strcmp(e->id, id);
        int best_named = best && id[0] && !strcmp(best->id, id);
        if (!best || named > best_named || (named == best_named && e->seq > best->seq))
            best = e;
    }
    if (best) {
        if ((*toks = malloc(best->n * sizeof **toks))) {
            memcpy(*toks, best->toks, best->n * sizeof **toks);
            *n = best->n, *n_end = best->n_end;
            rc = 1;
        } else {
            rc = -1;
        }
    }
    pthread_mutex_unlock(mu);
    return rc;
}

/* The session blob that keeps c's replies: "RBSR", u32 version 1, u32
 * count, then per reply u64 at, u64 n, u64 n_end, u64 text bytes, the
 * text; the tokens are the session's own (at..at+n). Newest replies first;
 * what does not fit in the blob's 256 KiB is left out. */
#define SV_BLOB_MAX (256u << 10)
static void replies_to_blob(sv_store *st, sv_conv *c)
{
    sv_replies *rp = &st->replies;
    size_t size = 12, count = 0;
    uint8_t *b = malloc(SV_BLOB_MAX);
    if (!b)
        return;
    memcpy(b, "RBSR", 4);
    uint64_t last = UINT64_MAX;
    for (;;) { /* newest first: the newest not yet written */
        const sv_reply *e = NULL;
        for (size_t i = 0; i < rp->n; i++)
            if (rp->v[i].owner == c && rp->v[i].seq < last && (!e || rp->v[i].seq > e->seq))
                e = &rp->v[i];
        if (!e || size + 32 + e->len > SV_BLOB_MAX)
            break;
        uint64_t h[4] = {e->at, e->n, e->n_end, e->len};
        memcpy(b + size, h, sizeof h);
        memcpy(b + size + 32, e->text, e->len);
        size += 32 + e->len;
        count++;
        last = e->seq;
    }
    uint32_t v[2] = {1, (uint32_t)count};
    memcpy(b + 4, v, sizeof v);
    if (rb_session_set_blob(c->session, b, size) != RB_OK)
        sv_log("warning: conversation %s: its replies are not saved: %s", c->id,
               rb_session_errmsg(c->session));
    free(b);
}

/* c's replies from its session's blob (a file just opened), checked
 * against its tokens; where its last reply began into c->n_prompt_end. */
static void replies_from_blob(sv_store *st, sv_conv *c)
{
    size_t size = 0;
    const uint8_t *b = rb_session_get_blob(c->session, &size);
    uint32_t v[2];
    if (!b || size < 12 || memcmp(b, "RBSR", 4))
        return;
    memcpy(v, b + 4, sizeof v);
    if (v[0] != 1)
        return;
    size_t off = 12, newest = 0;
    int any = 0;
    for (uint32_t k = 0; k < v[1]; k++) {
        uint64_t h[4];
        if (size - off < sizeof h)
            break;
        memcpy(h, b + off, sizeof h);
        off += sizeof h;
        if (h[3] > size - off || h[0] >= c->n_tokens || h[1] > c->n_tokens - h[0] ||
            h[2] >= h[1])
            break;
        replies_put(st, c, h[0], sv_tokens_hash(c->tokens, h[0]), c->tokens + h[0], h[1], h[2],
                    (const char *)b + off, h[3]);
        off += h[3];
        if (!any || h[0] > newest)
            newest = h[0];
        any = 1;
    }
    if (any)
        c->n_prompt_end = newest;
}

/* Forgets c's replies that its session does not hold as they were. */
static void replies_check(sv_store *st, sv_conv *c)
{
    sv_replies *rp = &st->replies;
    size_t n_tok = rb_session_n_tokens(c->session);
    const int32_t *t = rb_session_get_tokens(c->session);
    pthread_mutex_lock(&rp->mu);
    for (size_t i = rp->n; i-- > 0;) {
        const sv_reply *e = &rp->v[i];
        if (e->owner == c &&
            (e->at + e->n > n_tok || memcmp(e->toks, t + e->at, e->n * sizeof *t) ||
             sv_tokens_hash(t, e->at) != e->prefix_hash))
            replies_erase(rp, i);
    }
    pthread_mutex_unlock(&rp->mu);
}

/* ---- sessions ------------------------------------------------------------- */

static int copy_tokens(sv_conv *c)
{
    size_t n = rb_session_n_tokens(c->session);
    if (sv_grow((void **)&c->tokens, &c->cap, n, sizeof *c->tokens))
        return -1;
    if (n)
        memcpy(c->tokens, rb_session_get_tokens(c->session), n * sizeof *c->tokens);
    c->n_tokens = n;
    return 0;
}

static uint64_t file_size(const char *path)
{
    struct stat s;
    return stat(path, &s) == 0 ? (uint64_t)s.st_size : 0;
}

/* c's bytes on storage: its file's, and its prefix file's (path.base). */
static void note_file(sv_conv *c, const char *path)
{
    char base[4200];
    struct stat s;
    c->file_bytes = file_size(path);
    snprintf(base, sizeof base, "%s.base", path);
    int has = stat(base, &s) == 0;
    c->base_ino = has ? (uint64_t)s.st_ino : 0;
    c->base_bytes = has ? (uint64_t)s.st_size : 0;
}

/* The prefix files that the conversations of ns (NULL: all) link to, each
 * counted once (past 256 distinct ones, each time: a limit errs on the
 * safe side). */
static uint64_t prefix_bytes(const sv_store *st, const char *ns)
{
    enum { MAX_SEEN = 256 };
    uint64_t seen[MAX_SEEN], bytes = 0;
    size_t n_seen = 0;
    for (size_t i = 0; i < st->n_convs; i++) {
        const sv_conv *c = st->convs[i];
        if (!c->base_ino || (ns && strcmp(c->ns, ns)))
            continue;
        size_t k = 0;
        while (k < n_seen && seen[k] != c->base_ino)
            k++;
        if (k < n_seen)
            continue;
        if (n_seen < MAX_SEEN)
            seen[n_seen++] = c->base_ino;
        bytes += c->base_bytes;
    }
    return bytes;
}

static size_t n_open(const sv_store *st)
{
    size_t n = 0;
    for (size_t i = 0; i < st->n_convs; i++)
        n += st->convs[i]->session != NULL;
    return n;
}

/* The least recently used conversation that no request uses; with
 * open_only, among those with a session in RAM. */
static sv_conv *lru_idle(sv_store *st, int open_only, const sv_conv *except, const char *ns)
{
    sv_conv *best = NULL;
    for (size_t i = 0; i < st->n_convs; i++) {
        sv_conv *c = st->convs[i];
        if (c->is_busy || c == except || (open_only && !c->session) || (ns && strcmp(c->ns, ns)))
            continue;
        if (!best || c->last_used < best->last_used)
            best = c;
    }
    return best;
}

/* Closes an idle conversation's session: its file keeps it; without a
 * --sessions folder the conversation is forgotten. */
static void conv_close(sv_store *st, sv_conv *c, const char *why)
{
    if (!c->has_file) {
        sv_log("conversation %s%s%s forgotten (%s; no --sessions folder)", c->ns,
               c->ns[0] ? "/" : "", c->id, why);
        char ns[SV_NS_MAX + 1];
        snprintf(ns, sizeof ns, "%s", c->ns);
        sv_store_remove(st, c);
        sv_metrics_add(st->metrics, ns, conv_evicted, 1);
        return;
    }
    sv_log("conversation %s%s%s closed (%s; its file keeps it)", c->ns, c->ns[0] ? "/" : "",
           c->id, why);
    rb_session_destroy(c->session);
    c->session = NULL;
    sv_metrics_add(st->metrics, NULL, conv_closed, 1);
}

/* Deletes a conversation and its file. */
static void conv_delete(sv_store *st, sv_conv *c, const char *why)
{
    char path[4096], ns[SV_NS_MAX + 1];
    sv_log("conversation %s%s%s deleted (%s)", c->ns, c->ns[0] ? "/" : "", c->id, why);
    rb_session_destroy(c->session);
    c->session = NULL;
    if (c->has_file) {
        sv_store_path(st, c->ns, c->id, path, sizeof path);
        rb_error e;
        if (rb_session_remove_file(path, &e) != RB_OK) /* its prefix link too */
            sv_log("warning: %s", e.message);
    }
    snprintf(ns, sizeof ns, "%s", c->ns);
    sv_store_remove(st, c);
    sv_metrics_add(st->metrics, ns, conv_evicted, 1);
}

/* Publishes the memory and conversation gauges for /metrics. */
static void snapshot(sv_store *st)
{
    sv_mem_snapshot m = {0};
    sv_ns_counts *per = calloc(st->n_convs ? st->n_convs : 1, sizeof *per);
    size_t n_per = 0;
    for (size_t i = 0; i < st->n_convs; i++) {
        sv_conv *c = st->convs[i];
        m.n_conv_total++;
        m.n_conv_stored += c->has_file;
        m.disk_bytes += c->file_bytes;
        if (per) {
            size_t k = 0;
            while (k < n_per && strcmp(per[k].name, c->ns))
                k++;
            if (k == n_per)
                snprintf(per[n_per++].name, sizeof per[k].name, "%s", c->ns);
            per[k].v.mem.n_conv_total++;
            per[k].v.mem.n_conv_stored += c->has_file;
            per[k].v.mem.n_conv_open += c->session != NULL;
            per[k].v.mem.disk_bytes += c->file_bytes;
        }
        if (!c->session)
            continue;
        m.n_conv_open++;
        rb_session_stats s;
        if (rb_session_get_stats(c->session, &s) != RB_OK)
            continue;
        m.kv_resident_bytes += s.kv_raw_bytes;
        m.kv_compressed_bytes += s.kv_compressed_bytes;
        m.kv_stored_bytes += s.kv_stored_bytes;
        m.kv_dropped_bytes += s.kv_dropped_bytes;
        m.scratch_bytes += s.scratch_bytes;
        m.other_bytes += s.other_bytes;
    }
    m.disk_bytes += prefix_bytes(st, NULL);
    for (size_t k = 0; per && k < n_per; k++)
        per[k].v.mem.disk_bytes += prefix_bytes(st, per[k].name);
    rb_pool_stats ps;
    if (st->pool && rb_pool_get_stats(st->pool, &ps) == RB_OK) {
        m.weights_bytes = ps.weights_bytes; /* the model's, counted once */
        m.pool_total_bytes = ps.total_bytes;
        m.pool_over_bytes = ps.over_bytes;
        m.pool_trimmed_bytes = ps.trimmed_bytes;
        m.pool_weights_released_bytes = ps.weights_released_bytes;
        m.pool_shared_kv_bytes = ps.shared_kv_bytes;
        m.pool_n_prefetches = ps.n_prefetches;
        m.pool_prefetch_granted_bytes = ps.prefetch_granted_bytes;
        m.pool_prefetch_trimmed_bytes = ps.prefetch_trimmed_bytes;
        m.pool_leveled_trims = ps.n_leveled_trims;
        m.pool_level_line_bytes = ps.level_line_bytes;
        m.pool_shared_trims = ps.n_shared_trims;
    }
    sv_metrics_set_mem(st->metrics, &m, per, n_per);
    free(per);
}

int sv_store_close_session(sv_store *st, const rb_session *session)
{
    for (size_t i = 0; i < st->n_convs; i++) {
        sv_conv *c = st->convs[i];
        if (c->session != session)
            continue;
        if (c->is_busy)
            return 0;
        conv_close(st, c, "the pool's budget or --max-open");
        return 1;
    }
    return 0;
}

void sv_store_enforce(sv_store *st)
{
    const sv_config *cfg = st->cfg;
    sv_conv *c;
    /* with a pool, the scheduler closed what rb_pool_next_to_close named;
       a store without one (tests, no model) keeps --max-open itself */
    while (!st->pool && n_open(st) > cfg->max_open && (c = lru_idle(st, 1, NULL, NULL)))
        conv_close(st, c, "more than --max-open sessions");
    /* the count and disk limits: per namespace, each over its own */
    for (size_t i = 0; i < st->n_convs; i++) {
        char ns[SV_NS_MAX + 1];
        snprintf(ns, sizeof ns, "%s", st->convs[i]->ns);
        for (;;) {
            uint64_t n = 0, bytes = 0;
            for (size_t j = 0; j < st->n_convs; j++)
                if (!strcmp(st->convs[j]->ns, ns))
                    n++, bytes += st->convs[j]->file_bytes;
            bytes += prefix_bytes(st, ns);
            int over_n = n > cfg->max_conversations;
            int over_b = cfg->sessions_dir && cfg->max_disk_bytes && bytes > cfg->max_disk_bytes;
            if (!over_n && !over_b)
                break;
            if (!(c = lru_idle(st, 0, NULL, ns)))
                break;
            conv_delete(st, c, over_n ? "more than --max-conversations" : "over --max-disk");
        }
    }
    snapshot(st);
}

/* Where an open session's KV is: the lowest tier holding any of it. */
static sv_restore kv_place(rb_session *ss)
{
    rb_session_stats s;
    if (rb_session_get_stats(ss, &s) != RB_OK)
        return SV_RESTORE_RESIDENT;
    if (s.kv_dropped_bytes)
        return SV_RESTORE_RECOMPUTED;
    if (s.kv_stored_bytes)
        return SV_RESTORE_STORED;
    return s.kv_compressed_bytes ? SV_RESTORE_COMPRESSED : SV_RESTORE_RESIDENT;
}

/* A file reopened after a crash or damage: the session says what it
 * recovered; logged once, on the server's log. */
static void warn_recovery(const rb_session *ss)
{
    rb_session_stats s;
    if (rb_session_get_stats(ss, &s) != RB_OK || !s.file_recovery)
        return;
    if (s.file_lost_tokens)
        sv_log("warning: %s: %" PRIu64 " tokens lost", s.file_recovery, s.file_lost_tokens);
    else
        sv_log("warning: %s", s.file_recovery);
}

/* Opens c's file at path beside the open conversation of c's namespace
 * whose tokens share the longest prefix with c's (at least 64 tokens):
 * those pages are shared with it, not read (the library checks their bits
 * against the file). Without one, or without a pool, a plain open. */
static rb_status open_beside_peer(const sv_store *st, const sv_conv *c, const char *path,
                                  const rb_session_params *p, rb_session **out, rb_error *e)
{
    const sv_conv *peer = NULL;
    size_t best = 63;
    for (size_t i = 0; st->pool && i < st->n_convs; i++) {
        const sv_conv *o = st->convs[i];
        if (o == c || !o->session || o->is_dropped || strcmp(o->ns, c->ns))
            continue;
        size_t n = sv_common_prefix(o->tokens, o->n_tokens, c->tokens, c->n_tokens);
        if (n > best)
            peer = o, best = n;
    }
    return peer ? rb_session_open_saved_sharing(st->model, p, path, peer->session, out, e)
                : rb_session_open_saved(st->model, p, path, out, e);
}

rb_status sv_store_open(sv_store *st, sv_conv *c, sv_restore *kind, char *err, size_t err_n)
{
    const sv_config *cfg = st->cfg;
    if (c->session) {
        *kind = c->is_from_file ? SV_RESTORE_FILE
                : c->is_dropped ? SV_RESTORE_RECOMPUTED : kv_place(c->session);
        c->is_from_file = 0;
        sv_metrics_add(st->metrics, c->ns, restores[*kind], 1);
        return RB_OK;
    }
    /* room first: at most max_open sessions with this one. With a pool its
       step names them (background sessions only: busy ones are
       foreground; max_open - 1 = 0 would mean no limit to it); the loop
       after it keeps the count when the pool named another session than
       a conversation's (the embeddings'), or without a pool */
    sv_conv *old;
    rb_session *ss;
    while (st->pool && cfg->max_open > 1 &&
           (ss = rb_pool_next_to_close(st->pool, cfg->max_open - 1)) &&
           sv_store_close_session(st, ss))
        ;
    while (n_open(st) >= cfg->max_open && (old = lru_idle(st, 1, c, NULL)))
        conv_close(st, old, "more than --max-open sessions");
    rb_error e;
    if (c->has_file && !cfg->baseline_recompute) {
        char path[4096];
        sv_store_path(st, c->ns, c->id, path, sizeof path);
        rb_session_params p = st->sp;
        p.file_flags = RB_SAVE_ON_REQUEST;
        p.kv_page_tokens = 0; /* a file keeps the page size it was saved with */
        /* beside an open chat of the same system prompt, say */
        rb_status s = open_beside_peer(st, c, path, &p, &c->session, &e);
        if (s != RB_OK) {
            /* the log has the path; the client's message never does */
            sv_log("warning: conversation %s%s%s: its session file %s cannot be opened (%s); "
                   "the conversation starts again from the request", c->ns, c->ns[0] ? "/" : "",
                   c->id, path, e.message);
            snprintf(err, err_n, "conversation %s: its session file cannot be opened", c->id);
            c->session = NULL;
            return s;
        }
        warn_recovery(c->session);
        *kind = SV_RESTORE_FILE;
        sv_metrics_add(st->metrics, c->ns, restores[*kind], 1);
        return RB_OK;
    }
    if (st->spare) {
        c->session = st->spare;
        st->spare = NULL;
    } else if (rb_session_create(st->model, &st->sp, &c->session, &e) != RB_OK) {
        snprintf(err, err_n, "%s", e.message);
        return e.status;
    }
    *kind = c->n_tokens ? SV_RESTORE_RECOMPUTED : SV_RESTORE_NEW;
    sv_metrics_add(st->metrics, c->ns, restores[*kind], 1);
    return RB_OK;
}

/* DIR/NS, created when missing (mode 0700). */
static int mkdir_ns(const sv_store *st, const char *ns)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", st->cfg->sessions_dir, ns);
    return mkdir(dir, 0700) == 0 || errno == EEXIST ? 0 : -1;
}

rb_session *sv_store_take(sv_store *st, sv_conv *from, size_t shared, int *from_file)
{
    rb_session *ss = NULL;
    *from_file = 0;
    if (from->session && !from->is_dropped) {
        /* open: the fork shares its pages and from keeps its session (the
           store matched from in the request's namespace only) */
        size_t n = rb_session_n_tokens(from->session);
        if (shared < n)
            n = shared;
        /* room for one more open session (--max-open), never from's */
        sv_conv *old;
        while (n_open(st) >= st->cfg->max_open && (old = lru_idle(st, 1, from, NULL)))
            conv_close(st, old, "more than --max-open sessions");
        if (n <= from->n_tokens && n_open(st) < st->cfg->max_open &&
            memcmp(rb_session_get_tokens(from->session), from->tokens, n * sizeof(int32_t)) == 0) {
            rb_session_params p = st->sp;
            p.file_flags = RB_SAVE_ON_REQUEST;
            p.kv_page_tokens = 0; /* the source's */
            rb_error e;
            if (rb_session_fork(from->session, n, &p, &ss, &e) == RB_OK)
                return ss;
            sv_log("warning: conversation %s: a fork of its session failed (%s); the fork takes "
                   "it instead", from->id, e.message);
        }
    }
    if (from->session && !from->is_dropped) {
        ss = from->session;
        from->session = NULL;
    } else if (from->has_file && !st->cfg->baseline_recompute) {
        char path[4096];
        sv_store_path(st, from->ns, from->id, path, sizeof path);
        rb_session_params p = st->sp;
        p.file_flags = RB_SAVE_ON_REQUEST;
        p.kv_page_tokens = 0; /* a file keeps the page size it was saved with */
        rb_error e;
        /* beside an open peer: the shared pages make the fork's file link
           the prefix file too */
        if (open_beside_peer(st, from, path, &p, &ss, &e) != RB_OK) {
            sv_log("warning: conversation %s%s%s: its session file %s cannot be opened (%s); "
                   "a fork of it computes its prefix again", from->ns, from->ns[0] ? "/" : "",
                   from->id, path, e.message);
            return NULL;
        }
        *from_file = 1;
    }
    /* from's file must not change: the fork's saves go to its own */
    if (ss && rb_session_unbind(ss) != RB_OK) {
        sv_log("warning: conversation %s: %s; a fork of it computes its prefix again", from->id,
               rb_session_errmsg(ss));
        rb_session_destroy(ss);
        return NULL;
    }
    return ss;
}

void sv_store_commit(sv_store *st, sv_conv *c)
{
    rb_session *ss = c->session;
    replies_check(st, c);
    if (st->cfg->sessions_dir) {
        replies_to_blob(st, c);
        char path[4096];
        sv_store_path(st, c->ns, c->id, path, sizeof path);
        struct stat sb;
        if (c->has_file && stat(path, &sb) != 0 && errno == ENOENT)
            sv_log("warning: conversation %s%s%s: its session file %s was deleted; a new one "
                   "is written", c->ns, c->ns[0] ? "/" : "", c->id, path);
        if (c->ns[0] && mkdir_ns(st, c->ns) != 0)
            sv_log("warning: cannot create the folder of namespace %s: %s", c->ns, strerror(errno));
        if (rb_session_save(ss, path, RB_SAVE_ON_REQUEST) == RB_OK) {
            c->has_file = 1;
            note_file(c, path);
        } else {
            sv_log("warning: conversation %s was not saved: %s", c->id, rb_session_errmsg(ss));
        }
    }
    if (copy_tokens(c) != 0)
        c->n_tokens = 0; /* out of memory: not found by prefix, still by id */
    /* the baseline keeps the tokens (the prefix index, the file) and
       frees the KV: the next turn computes the conversation again */
    if (st->cfg->baseline_recompute && c->n_tokens && rb_session_rewind(ss, 0) == RB_OK)
        c->is_dropped = 1;
}

/* ---- the folder ----------------------------------------------------------- */

/* The folder is locked for the process's life by a lock on the folder
 * itself (flock on its descriptor): deleting or replacing a file inside
 * cannot let a second server in. DIR/.lock only says who holds it. */
static int lock_dir(sv_store *st)
{
    const char *dir = st->cfg->sessions_dir;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        sv_log("error: cannot create --sessions %s: %s", dir, strerror(errno));
        return 1;
    }
    st->lock_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (st->lock_fd < 0) {
        sv_log("error: cannot open --sessions %s: %s", dir, strerror(errno));
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/.lock", dir);
    if (flock(st->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        int pf = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = pf >= 0 ? read(pf, pid, sizeof pid - 1) : -1;
        if (pf >= 0)
            close(pf);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        sv_log("error: another rebound serve%s%s%s uses --sessions %s", pid[0] ? " (pid " : "",
               pid, pid[0] ? ")" : "", dir);
        if (pid[0])
            fprintf(stderr, "hint: stop it, or give this one another folder\n");
        return 1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    int pf = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (pf < 0 || write(pf, pid, (size_t)n) != n)
        sv_log("warning: cannot write the pid into %s", path);
    if (pf >= 0)
        close(pf);
    return 0;
}

typedef struct found_file {
    char ns[SV_NS_MAX + 1];
    char id[SV_ID_MAX + 1];
    time_t mtime;
} found_file;

/* The session files of namespace ns (DIR, or DIR/NS) appended to *found;
 * with ns "", the namespaces' folders too. 0, or -1 out of memory. */
static int list_files(sv_store *st, const char *ns, found_file **found, size_t *n_found,
                      size_t *cap)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s%s", st->cfg->sessions_dir, ns[0] ? "/" : "", ns);
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (!ns[0] && de->d_name[0] != '.' && sv_ns_is_valid(de->d_name)) {
            char sub[4400];
            struct stat s;
            snprintf(sub, sizeof sub, "%s/%s", dir, de->d_name);
            if (lstat(sub, &s) == 0 && S_ISDIR(s.st_mode)) {
                rc = list_files(st, de->d_name, found, n_found, cap);
                continue;
            }
        }
        if (len < 5 || len - 4 > SV_ID_MAX || strcmp(de->d_name + len - 4, ".rbs") != 0)
            continue;
        char id[SV_ID_MAX + 1];
        memcpy(id, de->d_name, len - 4);
        id[len - 4] = 0;
        if (!sv_id_is_valid(id))
            continue;
        char path[4096];
        sv_store_path(st, ns, id, path, sizeof path);
        struct stat s;
        if (lstat(path, &s) != 0 || !S_ISREG(s.st_mode))
            continue;
        if (sv_grow((void **)found, cap, *n_found + 1, sizeof **found)) {
            rc = -1;
            break;
        }
        found_file *f = &(*found)[(*n_found)++];
        snprintf(f->ns, sizeof f->ns, "%s", ns);
        snprintf(f->id, sizeof f->id, "%s", id);
        f->mtime = s.st_mtime;
    }
    closedir(d);
    return rc;
}

/* Each valid file of the folder (and of its namespaces' folders) becomes
 * a closed conversation (its tokens read by opening it; closed again),
 * oldest first so that the clock orders them by last use. */
static int scan(sv_store *st)
{
    const char *dir = st->cfg->sessions_dir;
    DIR *d = opendir(dir);
    if (!d) {
        sv_log("error: cannot open --sessions %s: %s", dir, strerror(errno));
        return 1;
    }
    closedir(d);
    size_t n_ok = 0, n_bad = 0;
    found_file *found = NULL;
    size_t n_found = 0, cap = 0;
    if (list_files(st, "", &found, &n_found, &cap)) {
        free(found);
        return 1;
    }
    for (size_t i = 1; i < n_found; i++)
        for (size_t j = i; j > 0 && found[j - 1].mtime > found[j].mtime; j--) {
            found_file t = found[j];
            found[j] = found[j - 1], found[j - 1] = t;
        }
    for (size_t i = 0; i < n_found; i++) {
        char path[4096];
        sv_store_path(st, found[i].ns, found[i].id, path, sizeof path);
        rb_session_params p = st->sp;
        p.file_flags = RB_SAVE_ON_REQUEST;
        p.kv_page_tokens = 0; /* a file keeps the page size it was saved with */
        rb_session *ss = NULL;
        rb_error e;
        if (rb_session_open_saved(st->model, &p, path, &ss, &e) != RB_OK) {
            sv_log("warning: %s is not resumed (left as it is): %s", path, e.message);
            n_bad++;
            continue;
        }
        sv_conv *c = sv_store_add(st, found[i].ns, found[i].id);
        if (!c) {
            rb_session_destroy(ss);
            free(found);
            return 1;
        }
        c->has_file = 1;
        note_file(c, path);
        c->session = ss;
        int rc = copy_tokens(c);
        c->n_prompt_end = c->n_tokens;
        if (rc == 0)
            replies_from_blob(st, c);
        c->session = NULL;
        rb_session_destroy(ss);
        if (rc) {
            free(found);
            return 1;
        }
        n_ok++;
    }
    free(found);
    sv_log("%zu conversation%s resumable from %s%s", n_ok, n_ok == 1 ? "" : "s", dir,
           n_bad ? " (some files skipped: above)" : "");
    return 0;
}

int sv_store_load(sv_store *st)
{
    if (!st->cfg->sessions_dir)
        return 0;
    return lock_dir(st) || scan(st);
}
