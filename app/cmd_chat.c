/*
 * cmd_chat.c - `rebound chat`: an interactive multi-turn chat on one
 * session, with llama.cpp's flag names. Uses only the public API
 * (include/rebound.h), with the library's built-in chat templates.
 *
 * Does: read a line from stdin (prompt "> " on stderr when stdin is a
 * terminal, none from a pipe), feed only the new turn's tokens (the
 * session keeps the earlier turns' KV), stream the reply to stdout until
 * an end-of-generation token or -n tokens, close the reply as the template
 * does, and answer /stats, /trim, /reset, /quit. When the context is full:
 * a message, or with --ctx-shift the oldest turns are dropped
 * (rb_session_shift: the kept turns move down to the end of the system
 * prompt, their keys rotated in place; re-fed for a model that cannot
 * shift; for llama2, mistral and gemma the first kept turn loses its
 * opening, which the system block opened).
 * --session FILE: the conversation (tokens, KV pages, turn boundaries,
 * sampler state) is saved after every turn and resumed on the next start;
 * the stored system prompt stays through /reset, and a different -sys
 * given on resume is said (the next /reset applies it).
 * Ctrl-C (SIGINT): during a reply, stops it there and keeps the turn (the
 * reply so far is closed and saved); while the message is read in, drops
 * the message; at the prompt, or a second time before the prompt, quits
 * (the saved turns stay). -r TEXT stops a reply at TEXT (e.g. "\nUser:"
 * for the plain template).
 * On a terminal (stderr): a line while the model loads and a percentage
 * while a long message is read in; nothing of it when stderr is piped.
 * Line editing and history with libedit when the build found it
 * (REBOUND_HAVE_LIBEDIT) and stdin is a terminal; plain lines otherwise.
 *
 * Output contract: stdout holds the replies, each followed by one newline,
 * and nothing else; everything else (template choice, command answers,
 * context messages, --verbose lines) goes to stderr.
 *
 * The context, in token positions:
 *
 *   0      n_system_tokens   turn_starts[0]   turn_starts[1]        n_tokens
 *   | BOS + system block      | user 1 + reply 1 | user 2 + reply 2 ... |
 *   (never shifted out)         (dropped oldest first by --ctx-shift)
 *
 * Memory: the model, session, sampler and one token buffer that grows to
 * the largest piece tokenized; a reply's detokenizer lives for the reply.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef REBOUND_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "cli.h"
#include "rebound.h"

#define CMD "chat"

/* SIGINTs since the last prompt: 1 stops the reply (or the message's
 * prefill), 2 quits. Written by the handler, read by the loops; the
 * prompt sets it back to 0. */
static volatile sig_atomic_t g_interrupts;

static void on_sigint(int sig)
{
    (void)sig;
    if (++g_interrupts >= 2) { /* the second: quit as SIGINT does */
        signal(SIGINT, SIG_DFL);
        raise(SIGINT);
    }
}

/*
 * Where the turns lie in the session's tokens: what a context shift needs
 * to cut at turn boundaries. This (with the tokens and the sampler state)
 * is what a session file must keep for a restored chat to shift correctly.
 */
struct chat_history {
    size_t n_system_tokens; /* BOS + system block: kept by every shift */
    size_t *turn_starts;    /* position of each user turn still in the context */
    size_t n_turns;
    size_t cap_turns;
};

struct chat {
    rb_model *model;
    rb_session *session;
    rb_sampler *sampler;
    rb_chat_template tmpl;
    const char *system;       /* NULL or "": none */
    int32_t bos;              /* fed first when the model asks for it, else -1 */
    int ctx_shift;
    unsigned save_flags;      /* RB_SAVE_ON_REQUEST, and RB_SAVE_WAIT with --wait */
    int is_saved;             /* the session file exists with a state of this chat */
    int warned_pressure;      /* the storage tier's failure was told */
    int verbose;
    int64_t n_predict;        /* -1: until end of generation */
    size_t n_reply_end_tokens;/* room kept free so a reply can always be closed */
    struct chat_history hist;
    const char *session_path; /* --session: saved after every turn */
    rb_sampler_state saved_state;
    int has_saved_state;
    struct {
        char *ptr;
        size_t len, cap;
    } text;                   /* the piece being rendered */
    int32_t *tokens;          /* the piece tokenized; also the shift's copy */
    size_t cap_tokens;
    char *piece;              /* one detokenizer push */
    size_t n_turns_total;     /* turns since start, for --verbose */
    int keep_stored_system;   /* resumed: /reset keeps the file's system block */
    int is_tty;               /* stderr is a terminal: progress lines */
    int in_prefill;           /* the message is being fed: Ctrl-C aborts it */
    int progress_shown;       /* a progress line is open on stderr */
    rb_cli_stops stops;       /* -r */
    int ignore_eos;           /* --ignore-eos */
    rb_cli_eog eog;
    int color;                /* --color: the user's input in green */
};

/* The session's progress callback: a percentage while a long message is
 * read in (terminal only), and Ctrl-C stops that feed. */
static int chat_progress(void *ctx, rb_progress_phase phase, uint64_t done, uint64_t total)
{
    struct chat *c = ctx;
    if (!c->in_prefill)
        return 0;
    if (c->is_tty && phase == RB_PROGRESS_FEED && total > 0 && c->in_prefill > 1) {
        fprintf(stderr, "\rrebound chat: reading the message: %3d%%",
                (int)(done * 100 / total));
        c->progress_shown = 1;
    }
    return g_interrupts != 0;
}

static void progress_clear(struct chat *c)
{
    if (c->progress_shown)
        fputs("\r\033[K", stderr);
    c->progress_shown = 0;
}

static int save_chat(struct chat *c);

/* Renders one piece of the conversation into c->text. 0, or -1 (out of
 * memory, printed). */
static int render(struct chat *c, rb_chat_piece piece, const char *s, unsigned flags)
{
    for (;;) {
        size_t n = 0;
        if (rb_chat_render_piece(c->tmpl, piece, s, flags, c->text.ptr, c->text.cap, &n) !=
            RB_OK) {
            rb_cli_fail(CMD, "out of memory", NULL);
            return -1;
        }
        if (n < c->text.cap) {
            c->text.len = n;
            return 0;
        }
        char *p = realloc(c->text.ptr, n + 1);
        if (!p) {
            rb_cli_fail(CMD, "out of memory", NULL);
            return -1;
        }
        c->text.ptr = p, c->text.cap = n + 1;
    }
}

static unsigned turn_flags(int is_first_turn, int has_system)
{
    return (is_first_turn ? RB_CHAT_FIRST_TURN : 0u) | (has_system ? RB_CHAT_HAS_SYSTEM : 0u);
}

/* 1 when a non-empty system block was fed after the BOS. */
static int has_system(const struct chat *c)
{
    return c->hist.n_system_tokens > (c->bos >= 0 ? 1u : 0u);
}

/* Result of making room in the context. */
enum room { ROOM_OK = 0, ROOM_FULL = 1, ROOM_ERROR = 2 };

static int grow_tokens(struct chat *c, size_t n)
{
    if (n <= c->cap_tokens)
        return 0;
    int32_t *t = realloc(c->tokens, n * sizeof *t);
    if (!t)
        return -1;
    c->tokens = t, c->cap_tokens = n;
    return 0;
}

/* Tokenizes text into c->tokens (after BOS when with_bos and the model
 * asks for it), with special-token parsing so that the template's markers
 * become their ids. Returns the count, or -1 after printing the error. */
static long tokenize_piece(struct chat *c, const char *text, size_t len, int with_bos)
{
    size_t lead = with_bos && c->bos >= 0 ? 1 : 0, n = 0;
    /* first try: most pieces take fewer tokens than bytes; else the
       tokenizer says how many it needs */
    if (grow_tokens(c, len + lead + 8))
        goto nomem;
    rb_status st = RB_OK;
    if (len) {
        st = rb_model_tokenize(c->model, text, len, 0, 1, c->tokens + lead,
                               c->cap_tokens - lead, &n);
        if (st == RB_E_INVALID_ARG && n > c->cap_tokens - lead) {
            if (grow_tokens(c, n + lead))
                goto nomem;
            st = rb_model_tokenize(c->model, text, len, 0, 1, c->tokens + lead,
                                   c->cap_tokens - lead, &n);
        }
    }
    if (st != RB_OK) {
        rb_cli_fail(CMD, rb_model_errmsg(c->model), NULL);
        return -1;
    }
    if (lead)
        c->tokens[0] = c->bos;
    return (long)(lead + n);
nomem:
    rb_cli_fail(CMD, "out of memory", NULL);
    return -1;
}

static int push_turn_start(struct chat_history *h, size_t pos)
{
    if (h->n_turns == h->cap_turns) {
        size_t cap = h->cap_turns ? 2 * h->cap_turns : 16;
        size_t *t = realloc(h->turn_starts, cap * sizeof *t);
        if (!t)
            return -1;
        h->turn_starts = t, h->cap_turns = cap;
    }
    h->turn_starts[h->n_turns++] = pos;
    return 0;
}

/*
 * Drops the oldest turns so that `need` more tokens fit, keeping the system
 * prompt and the newest n_locked turns (the turn being answered). It drops
 * the fewest whole turns that leave the space after the system prompt at
 * most half full (as llama.cpp's shift halves it), so a long reply does not
 * pay a re-feed for every token; when no choice gets there, all the turns
 * it may drop. The kept tokens are re-fed: rb_session_rewind forgets
 * everything from a position on, and positions must stay contiguous for
 * RoPE.
 */
static enum room shift_context(struct chat *c, size_t need, size_t n_locked)
{
    struct chat_history *h = &c->hist;
    size_t n = rb_session_n_tokens(c->session), n_ctx = rb_session_n_ctx(c->session);
    size_t sys = h->n_system_tokens, target = sys + (n_ctx - sys) / 2;
    size_t n_drop = 0;
    for (size_t k = 1; k + n_locked <= h->n_turns; k++) {
        size_t cut = k < h->n_turns ? h->turn_starts[k] : n;
        size_t new_len = sys + (n - cut);
        if (new_len + need > n_ctx)
            continue;
        n_drop = k;
        if (new_len + need <= target)
            break;
    }
    if (n_drop == 0)
        return ROOM_FULL;
    size_t cut = n_drop < h->n_turns ? h->turn_starts[n_drop] : n;
    if (cut < sys || cut > n) { /* load_chat checked the record: never */
        rb_cli_fail(CMD, "the turn list does not match the context", NULL);
        return ROOM_ERROR;
    }
    /* llama2: the system block opened the first [INST]; the first kept
       turn, now right after it, must not open another. Each turn was
       tokenized alone, so its tokens start with the prefix's; the
       prefix's trailing space is left out, as tokenizers join it to the
       next word (which then reads as a first turn's would). */
    size_t n_skip = 0;
    const char *skip = rb_chat_template_first_user_skip(c->tmpl);
    if (skip && n_drop < h->n_turns && has_system(c)) {
        int32_t prefix[16];
        size_t skip_len = strlen(skip);
        while (skip_len > 0 && skip[skip_len - 1] == ' ')
            skip_len--;
        long n_prefix = tokenize_piece(c, skip, skip_len, 0);
        if (n_prefix < 0)
            return ROOM_ERROR;
        if ((size_t)n_prefix <= sizeof prefix / sizeof prefix[0] && (size_t)n_prefix <= n - cut) {
            memcpy(prefix, c->tokens, (size_t)n_prefix * sizeof *prefix);
            if (!memcmp(prefix, rb_session_get_tokens(c->session) + cut,
                        (size_t)n_prefix * sizeof *prefix))
                n_skip = (size_t)n_prefix;
        }
    }
    size_t n_keep = n - cut - n_skip;
    /* the library's shift: the kept turns' keys rotated in place (no
       recompute); a model that cannot shift (sliding-window layers) has
       them fed again */
    rb_status st = rb_session_shift(c->session, sys, cut + n_skip - sys);
    fprintf(stderr, "rebound chat: context full (%zu of %zu tokens): dropped the %zu oldest "
            "turn%s (%zu tokens), %s %zu%s\n", n, n_ctx, n_drop, n_drop == 1 ? "" : "s",
            cut - sys, st == RB_E_UNSUPPORTED ? "re-feeding" : "shifting", n_keep,
            n_skip ? " (the first kept turn continues the system block)" : "");
    if (st == RB_E_UNSUPPORTED) {
        if (grow_tokens(c, n_keep + 1)) {
            rb_cli_fail(CMD, "out of memory", NULL);
            return ROOM_ERROR;
        }
        memcpy(c->tokens, rb_session_get_tokens(c->session) + cut + n_skip,
               n_keep * sizeof *c->tokens);
        if (rb_session_rewind(c->session, sys) != RB_OK ||
            (n_keep && rb_session_feed(c->session, c->tokens, n_keep, NULL) != RB_OK))
            st = RB_E_IO;
        else
            st = RB_OK;
    }
    if (st != RB_OK) {
        rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
        return ROOM_ERROR;
    }
    size_t moved = cut + n_skip - sys;
    for (size_t i = n_drop; i < h->n_turns; i++)
        h->turn_starts[i - n_drop] = h->turn_starts[i] - (i == n_drop ? cut - sys : moved);
    h->n_turns -= n_drop;
    return ROOM_OK;
}

/* Makes room for `need` more tokens: at once when they fit, by a shift
 * when --ctx-shift allows, else ROOM_FULL. */
static enum room make_room(struct chat *c, size_t need, size_t n_locked)
{
    if (rb_session_n_tokens(c->session) + need <= rb_session_n_ctx(c->session))
        return ROOM_OK;
    return c->ctx_shift ? shift_context(c, need, n_locked) : ROOM_FULL;
}

static void explain_full(const struct chat *c, const char *what)
{
    fprintf(stderr, "rebound chat: context full (%zu of %" PRIu32 " tokens used%s): %s\n",
            rb_session_n_tokens(c->session), rb_session_n_ctx(c->session),
            c->ctx_shift ? ", no earlier turn left to drop" : "", what);
    if (c->ctx_shift)
        fprintf(stderr, "hint: -c sets a larger context, -n caps the reply length\n");
    else
        fprintf(stderr, "hint: /reset starts the conversation over; --ctx-shift drops the "
                "oldest turns instead; -c sets a larger context\n");
}

/* Feeds c->tokens[0..n); prints the error and returns -1 on failure. */
static int feed(struct chat *c, size_t n)
{
    if (n && rb_session_feed(c->session, c->tokens, n, NULL) != RB_OK) {
        rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
        return -1;
    }
    return 0;
}

/* Starts (or restarts) the conversation: an empty context, then BOS and
 * the system block. Returns 0, or 1 after printing the error. */
static int chat_begin(struct chat *c)
{
    if (rb_session_rewind(c->session, 0) != RB_OK)
        return rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
    c->hist.n_turns = 0;
    c->hist.n_system_tokens = 0;
    if (render(c, RB_CHAT_PIECE_SYSTEM, c->system, 0))
        return 1;
    long n = tokenize_piece(c, c->text.ptr ? c->text.ptr : "", c->text.len, 1);
    if (n < 0)
        return 1;
    /* the system prompt must leave room for at least a short turn */
    if ((size_t)n + c->n_reply_end_tokens + 16 > rb_session_n_ctx(c->session)) {
        char msg[160];
        snprintf(msg, sizeof msg, "the system prompt has %ld tokens but the context holds %"
                 PRIu32, n, rb_session_n_ctx(c->session));
        return rb_cli_fail(CMD, msg, "raise -c or shorten --system");
    }
    if (feed(c, (size_t)n))
        return 1;
    c->hist.n_system_tokens = (size_t)n;
    return 0;
}

/* Feeds the template's reply end; the room for it was kept free. */
static int close_reply(struct chat *c)
{
    /* room first: a shift would reuse c->tokens */
    enum room r = make_room(c, c->n_reply_end_tokens, 1);
    if (r != ROOM_OK)
        return r == ROOM_ERROR ? 1 : rb_cli_fail(CMD, "no room left to close the reply", NULL);
    if (render(c, RB_CHAT_PIECE_REPLY_END, NULL, 0))
        return 1;
    long n = tokenize_piece(c, c->text.ptr, c->text.len, 0);
    return n < 0 || feed(c, (size_t)n);
}

/*
 * One turn: feed the user's message wrapped by the template, stream the
 * reply, close it. Returns 0 (also when the context was full and the turn
 * was refused: the chat goes on), or 1 on an error that ends the chat.
 */
static int chat_turn(struct chat *c, const char *message)
{
    if (render(c, RB_CHAT_PIECE_USER, message, turn_flags(c->hist.n_turns == 0, has_system(c))))
        return 1;
    long n_in = tokenize_piece(c, c->text.ptr, c->text.len, 0);
    if (n_in < 0)
        return 1;
    /* room for the message, one reply token and the reply's end */
    size_t need = (size_t)n_in + 1 + c->n_reply_end_tokens;
    enum room r = make_room(c, need, 0);
    if (r == ROOM_ERROR)
        return 1;
    if (r == ROOM_FULL) {
        char what[128];
        snprintf(what, sizeof what, "this message needs %zu more tokens (with room to reply)",
                 need);
        explain_full(c, what);
        return 0;
    }
    /* render and tokenize again: a shift reuses c->tokens, and when it
       dropped every turn this one is now the first (llama2 renders that
       one differently) */
    if (render(c, RB_CHAT_PIECE_USER, message, turn_flags(c->hist.n_turns == 0, has_system(c))))
        return 1;
    n_in = tokenize_piece(c, c->text.ptr, c->text.len, 0);
    if (n_in < 0)
        return 1;
    size_t turn_start = rb_session_n_tokens(c->session);
    if (push_turn_start(&c->hist, turn_start))
        return rb_cli_fail(CMD, "out of memory", NULL);
    /* 2: show the percentage (a long message), 1: only listen for Ctrl-C */
    c->in_prefill = n_in >= 64 ? 2 : 1;
    rb_status fst = rb_session_feed(c->session, c->tokens, (size_t)n_in, NULL);
    c->in_prefill = 0;
    progress_clear(c);
    if (fst == RB_E_ABORTED) { /* Ctrl-C while it was read in: forget it */
        c->hist.n_turns--;
        if (rb_session_rewind(c->session, turn_start) != RB_OK)
            return rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
        fprintf(stderr, "rebound chat: interrupted while reading the message: it was "
                "dropped (Ctrl-C again quits)\n");
        return 0;
    }
    if (fst != RB_OK)
        return rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
    c->n_turns_total++;

    rb_error err;
    rb_detokenizer *detok = NULL;
    if (rb_detokenizer_create(c->model, &detok, &err) != RB_OK)
        return rb_cli_fail(CMD, err.message, NULL);
    size_t cap = rb_detokenizer_max_bytes(detok);
    const char *stop = "limit";
    int64_t n_out = 0;
    double t0 = rb_cli_now_s();
    int rc = 0;
    rb_cli_stops_reset(&c->stops);
    while (c->n_predict < 0 || n_out < c->n_predict) {
        if (g_interrupts) {
            stop = "interrupted";
            break;
        }
        int32_t next;
        const float *logits = rb_session_get_logits(c->session);
        if (c->ignore_eos)
            logits = rb_cli_eog_mask(&c->eog, logits);
        if (rb_sampler_sample(c->sampler, logits, rb_session_get_tokens(c->session),
                              rb_session_n_tokens(c->session), &next) != RB_OK) {
            rc = rb_cli_fail(CMD, rb_sampler_errmsg(c->sampler), NULL);
            break;
        }
        if (rb_model_token_is_eog(c->model, next)) {
            stop = "end";
            break;
        }
        /* the token is fed before the next is sampled, and the reply's end
           must still fit after it */
        r = make_room(c, 1 + c->n_reply_end_tokens, 1);
        if (r != ROOM_OK) {
            stop = "context full";
            rc = r == ROOM_ERROR;
            break;
        }
        size_t k = 0;
        if (rb_detokenizer_push(detok, next, c->piece, cap, &k) != RB_OK)
            fprintf(stderr, "rebound chat: %s\n", rb_detokenizer_errmsg(detok));
        fwrite(c->piece, 1, k, stdout);
        fflush(stdout);
        n_out++;
        if (rb_session_feed(c->session, &next, 1, NULL) != RB_OK) {
            rc = rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
            break;
        }
        if (rb_cli_stops_push(&c->stops, c->piece, k)) {
            stop = "reverse prompt";
            break;
        }
    }
    size_t k = 0;
    if (rb_detokenizer_flush(detok, c->piece, cap, &k) != RB_OK)
        fprintf(stderr, "rebound chat: %s\n", rb_detokenizer_errmsg(detok));
    fwrite(c->piece, 1, k, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    rb_detokenizer_destroy(detok);
    double dt = rb_cli_now_s() - t0;
    if (rc)
        return rc;
    if (!strcmp(stop, "context full"))
        explain_full(c, "the reply was cut");
    if (!strcmp(stop, "interrupted"))
        fprintf(stderr, "rebound chat: reply stopped (Ctrl-C); the turn is kept (Ctrl-C again "
                "quits)\n");
    if (close_reply(c))
        return 1;
    rb_cli_warn_pressure("chat", c->session, &c->warned_pressure);
    /* the turn is complete: --session saves it (tokens, the last page,
       the turn boundaries, the sampler) */
    if (save_chat(c))
        return 1;
    if (c->verbose)
        fprintf(stderr, "rebound chat: turn %zu: %ld tokens in, %" PRId64 " out (%s), "
                "%.2f tok/s; context %zu/%" PRIu32 "\n", c->n_turns_total, n_in, n_out, stop,
                dt > 0 ? (double)n_out / dt : 0.0, rb_session_n_tokens(c->session),
                rb_session_n_ctx(c->session));
    return 0;
}

static void show_stats(const struct chat *c)
{
    rb_session_stats st;
    fprintf(stderr, "context: %zu of %" PRIu32 " tokens (system %zu, turns kept %zu)\n",
            rb_session_n_tokens(c->session), rb_session_n_ctx(c->session),
            c->hist.n_system_tokens, c->hist.n_turns);
    if (rb_session_get_stats(c->session, &st) == RB_OK)
        rb_cli_print_stats(stderr, &st);
    else
        fprintf(stderr, "rebound chat: stats: %s\n", rb_session_errmsg(c->session));
}

static void trim(struct chat *c, const char *arg)
{
    static const struct { const char *name; rb_trim_level level; } levels[] = {
        {"background", RB_TRIM_BACKGROUND},
        {"moderate", RB_TRIM_MODERATE},
        {"complete", RB_TRIM_COMPLETE},
    };
    rb_trim_level level = RB_TRIM_BYTES;
    uint64_t bytes = 0;
    int known = 0;
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
        if (!strcmp(arg, levels[i].name))
            level = levels[i].level, known = 1;
    if (!known && (rb_cli_parse_u64(arg, &bytes) || bytes == 0)) {
        fprintf(stderr, "rebound chat: /trim needs background, moderate, complete or a byte "
                "count (K/M/G), not '%s'\n", arg);
        return;
    }
    uint64_t freed = 0;
    rb_status st = rb_session_trim(c->session, bytes, level, &freed);
    char a[32], b[32];
    rb_session_stats stats;
    if (st != RB_OK)
        fprintf(stderr, "rebound chat: /trim %s: %s (%s); freed %s so far, the chat goes on\n",
                arg, rb_session_errmsg(c->session), rb_status_name(st),
                rb_cli_bytes(freed, a, sizeof a));
    else if (rb_session_get_stats(c->session, &stats) == RB_OK)
        fprintf(stderr, "trimmed (%s): freed %s; %s now in RAM; the next turn restores it\n",
                arg, rb_cli_bytes(freed, a, sizeof a), rb_cli_bytes(stats.total_bytes, b, sizeof b));
}

/* Handles a /command; returns 0 to go on, 1 to quit, -1 on a fatal error. */
static int command(struct chat *c, char *line)
{
    char *arg = line + strcspn(line, " \t");
    if (*arg)
        *arg++ = 0;
    arg += strspn(arg, " \t");
    if (!strcmp(line, "/quit") || !strcmp(line, "/exit"))
        return 1;
    if (!strcmp(line, "/stats")) {
        show_stats(c);
    } else if (!strcmp(line, "/trim")) {
        trim(c, *arg ? arg : "moderate");
    } else if (!strcmp(line, "/reset")) {
        if (c->keep_stored_system) {
            /* a resumed chat: its system block (BOS + system prompt, never
               shifted out) stays where it is; the turns go */
            if (rb_session_rewind(c->session, c->hist.n_system_tokens) != RB_OK) {
                rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
                return -1;
            }
            c->hist.n_turns = 0;
            if (save_chat(c))
                return -1;
        } else if (chat_begin(c) || save_chat(c)) {
            return -1;
        }

        fprintf(stderr, "conversation reset (context %zu tokens)\n", rb_session_n_tokens(c->session));
    } else if (!strcmp(line, "/help")) {
        fprintf(stderr, "/stats, /trim background|moderate|complete|BYTES, /reset, /quit\n");
    } else {
        fprintf(stderr, "rebound chat: unknown command '%s' (/help lists them)\n", line);
    }
    return 0;
}

/*
 * The session of the chat: today a new one. --session FILE will open the
 * saved conversation here (and create the file when absent), restoring the
 * tokens and chat_history, and skip chat_begin; the sampler is created
 * after this call, so its saved state goes back with rb_sampler_set_state.
 */
/*
 * The session file's blob for a chat: "RBCH" | u32 version 1 | u64
 * n_system_tokens | u64 n_turns | u64 turn_starts[n_turns] | the sampler
 * state (rb_sampler_state, host order). Everything else (the tokens, the
 * KV) is the session file's own.
 */
static int save_chat(struct chat *c)
{
    if (!c->session_path)
        return 0;
    size_t n = 24 + 8 * c->hist.n_turns + sizeof(rb_sampler_state);
    uint8_t *b = malloc(n), *q = b;
    if (!b)
        return rb_cli_fail(CMD, "out of memory", NULL);
    uint32_t ver = 1;
    uint64_t ns = c->hist.n_system_tokens, nt = c->hist.n_turns;
    memcpy(q, "RBCH", 4), q += 4;
    memcpy(q, &ver, 4), q += 4;
    memcpy(q, &ns, 8), q += 8;
    memcpy(q, &nt, 8), q += 8;
    for (size_t i = 0; i < c->hist.n_turns; i++, q += 8) {
        uint64_t v = c->hist.turn_starts[i];
        memcpy(q, &v, 8);
    }
    rb_sampler_state st;
    if (c->sampler)
        rb_sampler_get_state(c->sampler, &st);
    else
        memset(&st, 0, sizeof st);
    memcpy(q, &st, sizeof st);
    rb_status rs = rb_session_set_blob(c->session, b, n);
    free(b);
    /* the tokens and this record in one state: feeds do not commit, so a
       kill leaves the previous turn's state or this one */
    if (rs == RB_OK)
        rs = rb_session_save(c->session, c->session_path, c->save_flags);
    if (rs != RB_OK && !c->is_saved) /* the file is not there: nothing to resume */
        return rb_cli_fail(CMD, rb_session_errmsg(c->session), NULL);
    if (rs != RB_OK) /* a full disk: the chat goes on in RAM */
        fprintf(stderr, "rebound chat: warning: the conversation was not saved: %s\n",
                rb_session_errmsg(c->session));
    c->is_saved |= rs == RB_OK;
    return 0;
}

/* Restores the turn boundaries and, once the sampler exists, its state. */
static int load_chat(struct chat *c, rb_sampler_state *st, int *has_state)
{
    size_t n = 0;
    const uint8_t *b = rb_session_get_blob(c->session, &n);
    *has_state = 0;
    uint64_t ns, nt;
    if (n < 24 || memcmp(b, "RBCH", 4) != 0)
        return -1;
    memcpy(&ns, b + 8, 8);
    memcpy(&nt, b + 16, 8);
    size_t n_tok = rb_session_n_tokens(c->session);
    if (nt > (n - 24) / 8 || ns > n_tok) {
        fprintf(stderr, "rebound chat: the chat record claims %" PRIu64 " system tokens and %"
                PRIu64 " turns; the file holds %zu tokens\n", ns, nt, n_tok);
        return -1;
    }
    c->hist.n_system_tokens = (size_t)ns;
    c->hist.n_turns = 0;
    /* each turn starts after the system prompt and the turn before it,
       inside the tokens: what a context shift cuts at */
    uint64_t prev = ns;
    for (uint64_t i = 0; i < nt; i++) {
        uint64_t v;
        memcpy(&v, b + 24 + 8 * i, 8);
        if (v < prev || (i > 0 && v == prev) || v >= n_tok) {
            fprintf(stderr, "rebound chat: the chat record's turn %" PRIu64 " starts at %"
                    PRIu64 ", outside (%" PRIu64 ", %zu): the record does not match the "
                    "tokens\n", i + 1, v, prev, n_tok);
            return -1;
        }
        prev = v;
        if (push_turn_start(&c->hist, (size_t)v))
            return -1;
    }
    if (n >= 24 + 8 * nt + sizeof *st) {
        memcpy(st, b + 24 + 8 * nt, sizeof *st);
        *has_state = 1;
    }
    return 0;
}

static int open_session(struct chat *c, const char *session_path, const rb_session_params *p)
{
    rb_error err;
    c->session_path = session_path;
    if (session_path && access(session_path, F_OK) == 0) {
        rb_session_params op = *p;
        op.file_flags = c->save_flags;
        if (rb_session_open_saved(c->model, &op, session_path, &c->session, &err) != RB_OK)
            return rb_cli_fail(CMD, err.message, err.status == RB_E_UNSUPPORTED
                               ? "give the -c (n_ctx) the conversation was saved with" : NULL);
        c->is_saved = 1;
        rb_cli_warn_recovery("chat", c->session);
        if (load_chat(c, &c->saved_state, &c->has_saved_state) != 0)
            return rb_cli_fail(CMD, "the session file holds no usable chat record (was it "
                               "saved by `rebound run`?)", session_path);
        if (!rb_cli_quiet)
            fprintf(stderr, "rebound chat: resumed %s: %zu tokens, %zu turns\n", session_path,
                    rb_session_n_tokens(c->session), c->hist.n_turns);
        c->keep_stored_system = 1;
        if (c->system) { /* -sys given again: the same as the stored one? */
            if (render(c, RB_CHAT_PIECE_SYSTEM, c->system, 0))
                return 1;
            long n = tokenize_piece(c, c->text.ptr ? c->text.ptr : "", c->text.len, 1);
            if (n < 0)
                return 1;
            if ((size_t)n != c->hist.n_system_tokens ||
                memcmp(c->tokens, rb_session_get_tokens(c->session),
                       (size_t)n * sizeof *c->tokens) != 0) {
                fprintf(stderr, "rebound chat: note: -sys differs from the system prompt stored "
                        "in %s (%zu tokens); the conversation goes on with the stored one, "
                        "/reset starts over with the new one\n", session_path,
                        c->hist.n_system_tokens);
                c->keep_stored_system = 0;
            }
        }
        return 0;
    }
    if (rb_session_create(c->model, p, &c->session, &err) != RB_OK)
        return rb_cli_fail(CMD, err.message, NULL);
    c->keep_stored_system = 0;
    if (chat_begin(c))
        return 1;
    return save_chat(c);
}

/* Chooses the template (named, or detected) and says which and why. */
static int choose_template(struct chat *c, const char *name)
{
    rb_chat_template_info info;
    if (rb_chat_template_choose(c->model, name, &info) != RB_OK)
        return rb_cli_fail(CMD, "cannot choose a chat template", NULL);
    c->tmpl = info.tmpl;
    if (rb_cli_quiet)
        return 0;
    fprintf(stderr, "rebound chat: template %s (%s)", info.name, name ? "--template" : info.reason);
    if (info.first_line[0])
        fprintf(stderr, "; tokenizer.chat_template not recognised, its first line: '%s'",
                info.first_line);
    if (info.marker && info.marker_token >= 0)
        fprintf(stderr, "; %s is special token %" PRId32, info.marker, info.marker_token);
    else if (info.marker)
        fprintf(stderr, "; note: %s is not a special token of this vocabulary, it is fed "
                "as plain text", info.marker);
    fputc('\n', stderr);
    return 0;
}

/* One line of stdin without its line end into *line; -1 at end of input
 * (or a Ctrl-C: g_interrupts says). edit: through libedit (a terminal),
 * with the prompt and history. */
static long read_line(char **line, size_t *cap, int edit, int color)
{
    ssize_t n;
#ifdef REBOUND_HAVE_LIBEDIT
    if (edit) {
        /* \001 \002: readline's marks around what takes no columns */
        char *r = readline(color ? "\001\033[32m\002> " : "> ");
        if (!r || g_interrupts) {
            free(r);
            return -1;
        }
        n = (ssize_t)strlen(r);
        if ((size_t)n + 1 > *cap) {
            char *b = realloc(*line, (size_t)n + 1);
            if (!b) {
                free(r);
                return -1;
            }
            *line = b, *cap = (size_t)n + 1;
        }
        memcpy(*line, r, (size_t)n + 1);
        free(r);
        if (color)
            fputs("\033[0m", stderr);
        if (n > 0)
            add_history(*line);
        return (long)n;
    }
#else
    (void)edit;
#endif
    n = getline(line, cap, stdin);
    if (color)
        fputs("\033[0m", stderr);
    if (n < 0)
        return -1;
    while (n > 0 && ((*line)[n - 1] == '\n' || (*line)[n - 1] == '\r'))
        (*line)[--n] = 0;
    return (long)n;
}

int rb_cmd_chat(int argc, char **argv)
{
    const char *model_path = NULL, *template_name = NULL, *session_path = NULL;
    const char *system = NULL, *system_file = NULL;
    int64_t n_predict = -1;
    rb_sampler_params sp = rb_sampler_default_params();
    rb_session_params p = rb_session_default_params();
    int use_mmap = 0, ctx_shift = 0, verbose = 0, cnv = 1, seed_given = 0, wait = 0, do_fsync = 0;
    int ignore_eos = 0, color = 0, no_display = 0, interactive_flag = 0;
    rb_cli_stops stops = {0};
    char template_help[256];
    snprintf(template_help, sizeof template_help,
             "chat format: %s\n(default: from the file's tokenizer.chat_template, else from its\n"
             "vocabulary, architecture and name)", rb_chat_template_names());
    const rb_opt opts[] = {
        {"-m|--model", RB_OPT_STR, "FILE", "GGUF model", &model_path, 0, 0, NULL, NULL},
        {"-sys|--system-prompt|--system", RB_OPT_STR, "TEXT",
         "system prompt, fed once at the start (and after /reset)", &system, 0, 0, NULL, NULL},
        {"-sysf|--system-prompt-file", RB_OPT_STR, "FILE",
         "the system prompt from a file (one final newline dropped)", &system_file, 0, 0, NULL,
         NULL},
        {"--chat-template|--template", RB_OPT_STR, "NAME", template_help, &template_name, 0, 0,
         NULL, NULL},
        {"-n|--n-predict|--predict", RB_OPT_I64, "N",
         "most tokens per reply (default -1: until the model ends it)", &n_predict, -1, 9.2e18,
         NULL, NULL},
        {"--ctx-shift|--context-shift", RB_OPT_FLAG, NULL,
         "when the context is full, drop the oldest turns (keeping the system\n"
         "prompt) instead of stopping", &ctx_shift, 0, 0, NULL, NULL},
        {"--session", RB_OPT_STR, "FILE",
         "keep the conversation in FILE: resumed when it exists, saved after\n"
         "every turn (a kill loses at most the turn in progress)", &session_path, 0, 0, NULL,
         NULL},
        {"--wait", RB_OPT_FLAG, NULL,
         "a --session FILE another process is writing: wait for it (default:\n"
         "refuse, naming that process)", &wait, 0, 0, NULL, NULL},
        {"--fsync", RB_OPT_FLAG, NULL,
         "fdatasync --session FILE at each save, and its directory when the file\n"
         "is renamed: a power cut too loses no saved turn (default: a kill\n"
         "cannot lose what was written; the OS flushes it later)", &do_fsync, 0, 0, NULL,
         NULL},
        {"-cnv|--conversation", RB_OPT_FLAG, NULL,
         "conversation mode: what chat always does (plain completion: `rebound run`)", &cnv, 0,
         0, NULL, NULL},
        {"--mmap", RB_OPT_FLAG, NULL, "map the model file instead of reading it", &use_mmap, 0, 0,
         NULL, NULL},
        {"--no-mmap", RB_OPT_FLAG_OFF, NULL, "read the model file into RAM (the default)",
         &use_mmap, 0, 0, NULL, NULL},
        {"-v|--verbose", RB_OPT_FLAG, NULL,
         "one line per turn on stderr: tokens in and out, speed, context", &verbose, 0, 0, NULL,
         NULL},
        {"-i|--interactive|-if|--interactive-first", RB_OPT_FLAG, NULL,
         "interactive: what chat always is (llama.cpp's -i)", &interactive_flag, 0, 0, NULL,
         NULL},
        RB_CLI_SESSION_OPTS(&p),
        RB_CLI_SAMPLER_OPTS(&sp, &seed_given),
        RB_CLI_LLAMA_OPTS(&stops, &ignore_eos, &color, &no_display, &rb_cli_quiet),
        RB_CLI_GPU_OPTS,
        {0},
    };
    const rb_cli_cmd cmd = {
        CMD, "-m MODEL [options]   (one message per line on stdin)",
        "An interactive chat on one session with the model's chat template and\n"
        "llama.cpp's flag names (llama-cli). stdout: the replies, one line each;\n"
        "everything else goes to stderr.",
        opts,
        "commands (a line that starts with /):\n"
        "  /stats                  memory by category and tier, and the context used\n"
        "  /trim [LEVEL]           give memory back: background, moderate (default),\n"
        "                          complete, or BYTES (K/M/G); the next turn restores it\n"
        "  /reset                  forget the conversation (the system prompt stays)\n"
        "  /quit                   end (so does end of input)\n"
        "Ctrl-C stops a reply (the turn is kept); at the prompt, or twice, it quits.\n",
        NULL, 0, NULL, NULL,
    };
    int rc0 = rb_cli_parse(&cmd, argc, argv);
    if (rc0 >= 0)
        return rc0;
    (void)cnv, (void)interactive_flag, (void)no_display; /* chat never prints the prompt */
    if (!model_path)
        return rb_cli_usage_error(CMD, "no model given (-m MODEL)",
                                  "rebound make-model --shape stories260k -o m.gguf");
    if (system && system_file)
        return rb_cli_usage_error(CMD, "give one of -sys TEXT and -sysf FILE", NULL);
    /* a bad name is the user's typo: say so before loading anything */
    if (template_name && rb_chat_template_from_name(template_name) < 0) {
        char msg[160], hint[96];
        snprintf(msg, sizeof msg, "unknown --chat-template '%s'", template_name);
        snprintf(hint, sizeof hint, "known templates: %s", rb_chat_template_names());
        return rb_cli_usage_error(CMD, msg, hint);
    }
    char *system_buf = NULL;
    if (system_file && !(system = system_buf = rb_cli_read_text(system_file))) {
        char msg[600];
        snprintf(msg, sizeof msg, "cannot read the system prompt from '%s': %s", system_file,
                 strerror(errno));
        return rb_cli_fail(CMD, msg, NULL);
    }
    rb_cli_seed(CMD, &sp.seed, seed_given);

    struct chat c = {0};
    c.system = system;
    c.ctx_shift = ctx_shift;
    c.save_flags = RB_SAVE_ON_REQUEST | (wait ? RB_SAVE_WAIT : 0) |
                   (do_fsync ? RB_SAVE_FSYNC : 0);
    c.verbose = verbose;
    c.n_predict = n_predict;
    c.bos = -1;
    c.stops = stops;
    c.ignore_eos = ignore_eos;
    c.is_tty = isatty(STDERR_FILENO) && !rb_cli_quiet;
    c.color = color && isatty(STDIN_FILENO) && isatty(STDERR_FILENO);
    p.progress = chat_progress;
    p.progress_ctx = &c;
    /* Ctrl-C: no SA_RESTART, so that a read at the prompt returns */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    double t_load = rb_cli_now_s();
    if (c.is_tty) { /* the weights are read when the session is made */
        struct stat stt;
        if (stat(model_path, &stt) == 0)
            fprintf(stderr, "rebound chat: loading %s (%.0f MiB)...", model_path,
                    (double)stt.st_size / (1 << 20));
        c.progress_shown = 1;
    }
    rb_error err;
    rb_model_params mp = rb_model_default_params();
    mp.use_mmap = use_mmap;
    if (rb_model_open(model_path, &mp, &c.model, &err) != RB_OK) {
        progress_clear(&c);
        free(system_buf);
        return rb_cli_fail(CMD, err.message, NULL);
    }
    rb_cli_warn_ctx("chat", c.model, p.n_ctx);

    char *line = NULL;
    size_t line_cap = 0;
    int rc = 1;
    if (choose_template(&c, template_name))
        goto done;
    {
        /* BOS when the model asks for it: what add_special puts before an
           empty text (EOS, if it also asks for that, belongs to no turn) */
        int32_t probe[4];
        size_t n = 0;
        int32_t bos = rb_model_token_bos(c.model);
        if (bos >= 0 && rb_model_tokenize(c.model, "", 0, 1, 0, probe, 4, &n) == RB_OK &&
            n >= 1 && probe[0] == bos)
            c.bos = bos;
        if (render(&c, RB_CHAT_PIECE_REPLY_END, NULL, 0))
            goto done;
        long n_end = tokenize_piece(&c, c.text.ptr, c.text.len, 0);
        if (n_end < 0)
            goto done;
        c.n_reply_end_tokens = (size_t)n_end;
    }
    if (open_session(&c, session_path, &p)) {
        progress_clear(&c);
        goto done;
    }
    if (c.is_tty) {
        progress_clear(&c);
        fprintf(stderr, "rebound chat: loaded in %.1f s\n", rb_cli_now_s() - t_load);
    }
    if (ignore_eos && rb_cli_eog_init(&c.eog, c.model, rb_session_n_vocab(c.session))) {
        rb_cli_fail(CMD, "out of memory", NULL);
        goto done;
    }
    if (rb_sampler_create(&sp, rb_session_n_vocab(c.session), &c.sampler, &err) != RB_OK) {
        rb_cli_fail(CMD, err.message, NULL);
        goto done;
    }
    if (c.has_saved_state) /* sampling goes on where it stopped */
        rb_sampler_set_state(c.sampler, &c.saved_state);
    {
        rb_detokenizer *d = NULL;
        if (rb_detokenizer_create(c.model, &d, &err) != RB_OK) {
            rb_cli_fail(CMD, err.message, NULL);
            goto done;
        }
        c.piece = malloc(rb_detokenizer_max_bytes(d));
        rb_detokenizer_destroy(d);
        if (!c.piece) {
            rb_cli_fail(CMD, "out of memory", NULL);
            goto done;
        }
    }
    int interactive = isatty(STDIN_FILENO), edit = 0;
#ifdef REBOUND_HAVE_LIBEDIT
    if (interactive) {
        edit = 1;
        rl_readline_name = "rebound";
        rl_outstream = stderr; /* stdout holds the replies only */
    }
#endif
    if (interactive)
        fprintf(stderr, "rebound chat: context %" PRIu32 " tokens; /help lists the commands, "
                "/quit or end of input ends\n", rb_session_n_ctx(c.session));
    for (;;) {
        g_interrupts = 0;
        if (interactive && !edit) {
            fputs(c.color ? "\033[32m> " : "> ", stderr);
            fflush(stderr);
        }
        long n = read_line(&line, &line_cap, edit, c.color);
        if (n < 0) {
            if (c.color) /* the terminal's colours back */
                fputs("\033[0m", stderr);
            if (interactive) /* so the shell's prompt starts on its own line */
                fputc('\n', stderr);
            if (g_interrupts) /* Ctrl-C at the prompt: quit, as /quit does */
                clearerr(stdin);
            break;
        }
        if (n == 0)
            continue;
        if (line[0] == '/') {
            int r = command(&c, line);
            if (r < 0)
                goto done;
            if (r > 0)
                break;
            continue;
        }
        if (chat_turn(&c, line))
            goto done;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) { /* a full disk, a closed stdout */
        char msg[128];
        snprintf(msg, sizeof msg, "writing the replies to stdout: %s", strerror(errno));
        rb_cli_fail(CMD, msg, NULL);
        goto done;
    }
    if (ferror(stdin)) {
        char msg[128];
        snprintf(msg, sizeof msg, "reading stdin: %s", strerror(errno));
        rb_cli_fail(CMD, msg, NULL);
        goto done;
    }
    rc = 0;
done:
    rb_cli_eog_free(&c.eog);
    free(system_buf);
    free(line);
    free(c.tokens);
    free(c.piece);
    free(c.hist.turn_starts);
    free(c.text.ptr);
    rb_sampler_destroy(c.sampler);
    rb_session_destroy(c.session);
    rb_model_close(c.model);
    return rc;
}
