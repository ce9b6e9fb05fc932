/*
 * convstore.h - the conversations of `rebound serve`: their ids, the token
 * copies the prefix lookup searches, their sessions (open in RAM or
 * closed into their session files in the --sessions folder) and the
 * limits on them (open sessions, --mem-budget, count, disk bytes).
 *
 * Namespaces: every conversation belongs to one (an API key's name, a
 * Unix peer's "uid<N>", or "" when there are neither). Lookups by id and
 * by prefix see only the caller's namespace, so an id of another
 * namespace is an unknown id; the count and disk limits hold per
 * namespace and evict only inside it; files live in DIR/NS/ID.rbs
 * (DIR/ID.rbs for ""), so two namespaces' files cannot collide.
 * Ids are 128 random bits (getrandom).
 *
 * Threads: a store belongs to the scheduler thread alone (after
 * sv_store_init on the starting thread); it calls the library (sessions,
 * the pool) and touches the folder. The metrics it counts into are locked.
 * The one exception: its replies' table (below), which the connection
 * threads read under the table's mu.
 *
 * Replies (sv_replies): each conversation remembers, for every reply of
 * the model still in its tokens, the text the client was sent (after stop
 * strings) and the tokens its session holds for it (the generated ones,
 * then the template's closing when it was fed), so that a request that
 * sends that text back byte for byte gets those tokens instead of the
 * text's own tokenization (the scheduler's chat rendering splices them in
 * where its tokens so far equal the tokens before the reply: same
 * position, same prefix hash). They are kept in the session file's blob
 * ("RBSR"), so they survive a restart. The table is the one thing of the
 * store other threads read: written by the scheduler thread under its mu,
 * read by the connection threads under it (sv_replies_find); the scheduler
 * reads it without the lock (it is the only writer). A lookup sees only
 * the caller's namespace.
 *
 * Memory: one sv_conv per conversation with a copy of its tokens (4 bytes
 * a token), the array of them, the session of each open conversation, and
 * one spare session for the next new conversation; per remembered reply
 * its text and its tokens (about 8 bytes a token).
 */
#ifndef RB_SERVE_CONVSTORE_H
#define RB_SERVE_CONVSTORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "metrics.h"

#define SV_ID_MAX 64      /* conversation ids: [A-Za-z0-9_-]{1,64} */

typedef struct sv_conv {
    char ns[SV_NS_MAX + 1];   /* its namespace */
    char id[SV_ID_MAX + 1];
    int32_t *tokens;          /* the conversation's tokens as last saved */
    size_t n_tokens, cap;
    size_t n_prompt_end;      /* tokens before its last reply (the last request's
                                 prompt); a file's whole length after a restart */
    rb_session *session;      /* NULL: closed (its file holds it) */
    int is_busy;              /* an active request uses it */
    int has_file;
    uint64_t file_bytes;
    uint64_t base_ino, base_bytes; /* the prefix file its file links to
                                 (FILE.base, rb_session_remove_file): its
                                 inode and size; 0: none */
    uint64_t last_used;       /* the store's clock: larger is newer */
    int is_dropped;           /* --baseline recompute: its session was
                                 rewound to nothing after its last request */
    int is_from_file;         /* its session was just read from a file
                                 (sv_store_take): the next open says "file" */
} sv_conv;

/* One remembered reply: text[0..len) was sent for toks[0..n), which a
 * conversation's session holds from position at on, after tokens whose
 * sv_tokens_hash is prefix_hash; its last n_end tokens are the template's
 * closing of the reply. */
typedef struct sv_reply {
    const sv_conv *owner;     /* identity only: never dereferenced off the scheduler */
    char ns[SV_NS_MAX + 1];
    char id[SV_ID_MAX + 1];   /* the owner's id, for a request that names it */
    size_t at;
    uint64_t prefix_hash;
    int32_t *toks;
    size_t n, n_end;
    char *text;
    size_t len;
    uint64_t seq;             /* larger is newer */
} sv_reply;

typedef struct sv_replies {
    pthread_mutex_t mu;       /* guards v, n, cap, seq and every entry */
    sv_reply *v;
    size_t n, cap;
    uint64_t seq;
} sv_replies;

typedef struct sv_store {
    const sv_config *cfg;     /* borrowed; sessions_dir NULL: RAM only */
    rb_session_params sp;     /* the conversations' sessions' (pool, n_ctx) */
    rb_model *model;          /* borrowed; NULL: no sessions (unit tests) */
    rb_pool *pool;            /* borrowed; NULL: no --mem-budget check */
    sv_metrics *metrics;      /* borrowed */
    sv_conv **convs;
    size_t n_convs, cap_convs;
    uint64_t clock;
    rb_session *spare;        /* a fresh session for the next new conversation */
    int lock_fd;              /* the --sessions folder's lock; -1: none */
    sv_replies replies;       /* the replies' tokens (any thread, under its mu) */
} sv_store;

/* Caller storage: cfg, model, pool and metrics are borrowed for the
 * store's life (model and pool may be NULL: a store of ids and tokens
 * only); sp the sessions' parameters. Always succeeds. */
void sv_store_init(sv_store *st, const sv_config *cfg, const rb_session_params *sp,
                   rb_model *model, rb_pool *pool, sv_metrics *metrics);
/* Closes every session (their files stay) and frees everything. */
void sv_store_deinit(sv_store *st);

/* Locks the --sessions folder (created if missing) for this process, then
 * makes each valid session file in it a closed conversation (tokens and
 * remembered replies read by opening it; where its last reply began is the
 * newest reply's start, else the file's end). 0, or 1 after logging why. */
int sv_store_load(sv_store *st);

/* ---- ids ---- */

/* 1 when id is 1..SV_ID_MAX characters of [A-Za-z0-9_-]. */
int sv_id_is_valid(const char *id);
/* n bytes from the OS's random source (getrandom; /dev/urandom when it
 * is missing). 0, or -1 when neither answers. */
int sv_random(void *buf, size_t n);
/* A new id ("c" and 32 hex digits: 128 random bits) into
 * id[SV_ID_MAX + 1]. */
void sv_store_new_id(char *id);
/* The conversation's file, DIR/NS/ID.rbs (DIR/ID.rbs for ns ""), into buf. */
void sv_store_path(const sv_store *st, const char *ns, const char *id, char *buf, size_t n);

/* ---- lookup ---- */

/* The conversation ns/id, or NULL. */
sv_conv *sv_store_find(sv_store *st, const char *ns, const char *id);
/* A new closed conversation ns/id (not in the store); NULL: no memory. */
sv_conv *sv_store_add(sv_store *st, const char *ns, const char *id);
/* Forgets c (closes its session; its file stays). */
void sv_store_remove(sv_store *st, sv_conv *c);
/* The idle conversation of ns whose tokens share the longest prefix with
 * toks[0..n), when that prefix covers at least half of its tokens; NULL
 * when none does. *shared: the prefix's length. */
sv_conv *sv_store_match(sv_store *st, const char *ns, const int32_t *toks, size_t n,
                        size_t *shared);
/* Length of the common prefix of a and b. */
size_t sv_common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb);

/* ---- sessions ---- */

/* Opens c's session: the open one, reopened from its file, or a new one;
 * *kind says which (and where the open one's KV is). Makes room first
 * (--max-open). With the recompute baseline a file is not reopened. On
 * failure err says why (no path: it goes to the client) and c stays
 * closed; RB_E_IO/RB_E_FORMAT/RB_E_CORRUPT... from a file that is missing
 * or damaged (the server's log has the path, once). */
rb_status sv_store_open(sv_store *st, sv_conv *c, sv_restore *kind, char *err, size_t err_n);
/* For a fork of from at `shared` tokens: a session with from's state,
 * bound to no file. from's open session is forked (rb_session_fork: the
 * fork shares from's KV pages up to shared, and from keeps its session);
 * when that fails, it is taken (from then closed); a closed from's file is
 * read into a new one (*from_file set). NULL when from has neither (or the
 * file cannot be read: the fork computes the prefix again). from keeps its
 * tokens and its file as they are. */
rb_session *sv_store_take(sv_store *st, sv_conv *from, size_t shared, int *from_file);
/* After a request: c's replies that its session no longer holds as they
 * were forgotten, the rest written into the session's blob; c's session
 * saved to its file (with --sessions) and its tokens copied for the prefix
 * lookup; the baseline rewinds it. */
void sv_store_commit(sv_store *st, sv_conv *c);
/* Forgets c and leaves its file as it is (a damaged file: the next start
 * says so again and skips it). */
void sv_store_forget(sv_store *st, sv_conv *c);
/* Marks c used now (the least recently used goes first). */
void sv_store_touch(sv_store *st, sv_conv *c);

/* Closes the conversation whose open session is `session` (its file keeps
 * it): what the pool named with rb_pool_next_to_close. 0 when no idle
 * conversation has that session (a busy one, or not a conversation's). */
int sv_store_close_session(sv_store *st, const rb_session *session);

/* ---- replies (sv_replies: see the top) ---- */

/* FNV-1a over the tokens' 4-byte values. */
uint64_t sv_tokens_hash(const int32_t *toks, size_t n);
/* After a chat reply (scheduler thread, before sv_store_commit): c's
 * session holds the reply's tokens from at to its end, the last n_end of
 * them the template's closing; text[0..len) is what the client was sent.
 * An empty text or reply is not kept. 0, or -1 out of memory (nothing
 * kept). */
int sv_store_add_reply(sv_store *st, sv_conv *c, size_t at, size_t n_end, const char *text,
                       size_t len);
/* A fork: to gets from's replies that lie within from's first shared
 * tokens (scheduler thread). */
void sv_store_inherit_replies(sv_store *st, const sv_conv *from, sv_conv *to, size_t shared);
/* Any thread: 1 when a conversation of ns remembers a reply of exactly
 * text[0..len), else 0. */
int sv_replies_has_text(const sv_replies *rp, const char *ns, const char *text, size_t len);
/* Any thread: the tokens of a reply of ns whose text is text[0..len) and
 * that its session holds from position at on after tokens of hash
 * prefix_hash; one of conversation id (when id is not "") first, else
 * the newest. 1 with *toks (malloc'ed, the caller frees), *n and *n_end
 * (the closing's count among them); 0 when none; -1 out of memory. */
int sv_replies_find(const sv_replies *rp, const char *ns, const char *id, size_t at,
                    uint64_t prefix_hash, const char *text, size_t len, int32_t **toks,
                    size_t *n, size_t *n_end);

/* Keeps the stored conversations' limits (count, bytes: per namespace,
 * deleting inside it, least recently used first; only idle conversations)
 * and, for a store without a pool, max_open; publishes the memory gauges.
 * With a pool, the open sessions' limits (--max-open, --mem-budget) are
 * the pool's step: the caller closes what rb_pool_next_to_close names
 * (sv_store_close_session) first. */
void sv_store_enforce(sv_store *st);

#endif
