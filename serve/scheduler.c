/*
 * scheduler.c - the compute side of `rebound serve` (scheduler.h): one thread that
 * owns the model and the conversation store, and runs the requests the
 * connection threads queue.
 *
 * Does: on the connection threads, before a request is queued
 * (sv_sched_prepare), its tokens: a chat rendered with the template and
 * tokenized so that only the template's own markers are control tokens,
 * checked against the context; on its own thread: map a request to a
 * conversation of its namespace (admit: an explicit id, else the stored
 * conversation it extends, else a fork of the one it shares the longest
 * prefix with), rewind the conversation to the shared prefix and feed
 * only the rest; give each free slot to the namespace with the fewest
 * requests running, then the one served least recently; run
 * the active requests in rounds (sched_main): a prefill chunk of each
 * request still in its prompt (step_prefill), then one decode step of all
 * the others in one forward pass (decode_all:
 * rb_session_decode_multi reads the weights once per step for every
 * stream, and each stream's logits are the bits of decoding it alone, so
 * its greedy reply does not depend on the others); publish each request's
 * text as it is decoded (holding back what may be the start of a stop
 * string); close a chat reply as the template does and commit the
 * conversation to the store (its session file: RB_SAVE_ON_REQUEST); put
 * every session in one memory pool (rb_pool, --mem-budget) with the
 * conversation being served in the foreground and the idle ones in the
 * background, so the pool takes the idle ones' KV first; let the store
 * keep its limits after every request; tell each request where its
 * conversation's KV was when it was admitted (sv_restore).
 *
 * The prefill chunk (prefill_chunk) fits the moment: with no stream
 * decoding, a prompt goes in passes of n_batch (-b) tokens, one pass for a
 * prompt that fits; while streams decode (they wait for their next token
 * through the whole round), each chunk is cut so that a round stays
 * within --max-stall-ms: (max_stall - decode step) / requests in their
 * prompt / seconds per prompt token, at least CHUNK_MIN tokens (the prompt
 * progresses however slow the steps are) and at most n_batch. Both times
 * are estimates from the last steps (an EWMA of each prefill chunk's
 * seconds per token and of each decode step), so the chunk follows the
 * model, the machine's load and the context's depth; /metrics shows
 * them, the chunks and the longest gap between decode steps.
 * Does not: batch prefill chunks of several requests together, or a prefill
 * chunk with the others' decode step.
 *
 * Memory: one sampler and detokenizer per active request, the reply text
 * of each active request, the request's tokens while in its prompt, the
 * step arrays (parallel entries each); the store's (convstore.h).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rebound.h"
#include "scheduler.h"

enum { PHASE_PREFILL = 0, PHASE_DECODE = 1 };
#define SV_TURNS_MAX 64
typedef struct sv_active {
    sv_request *req;
    sv_conv *conv;
    int32_t *todo;            /* prompt tokens still to feed: todo[i_todo..n_todo) */
    size_t n_todo, i_todo;
    rb_sampler *sampler;
    rb_grammar *grammar;      /* response_format or a required tool call; NULL: free text */
    rb_detokenizer *detok;
    char *text;               /* the whole reply so far */
    size_t len, cap, published;
    int64_t n_gen;
    int phase;
    int has_ttft;
    int is_stopped;           /* a stop string ended the text */
    /* where the time goes: sv_timings, filled in by finish */
    double t_admit, t_admitted, t_first;
    sv_timings tm;
    uint64_t prefetch0;       /* its session's prefetch_bytes before admission */
    uint64_t fed_round;       /* the round of its last prefill chunk */
} sv_active;

struct sv_sched {
    const sv_config *cfg;     /* borrowed */
    rb_model *model;          /* borrowed */
    sv_metrics *metrics;      /* borrowed */
    pthread_t thread;
    int has_thread;

    /* the queue: under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    sv_request *head, *tail;
    uint32_t n_in_flight;     /* queued or active: submit to finish */
    int is_stopping;

    /* everything below: the scheduler thread's alone */
    rb_chat_template tmpl;
    int32_t bos;              /* fed first when the model asks for it, else -1 */
    int32_t *reply_end;       /* the template's reply end, tokenized */
    size_t n_reply_end;
    char reply_end_text[256]; /* and as text (immutable after start: any thread) */
    size_t n_reply_end_text;
    rb_pool *pool;            /* one budget over the weights and every session */
    int idle_prefetched;      /* this idle spell's rb_pool_prefetch_next is done
                                 (the scheduler's own) */
    sv_store store;           /* the conversations */
    sv_active *active;        /* parallel slots */
    uint32_t n_active;
    /* decode_all's step over the active requests (parallel entries each) */
    sv_active **step_act;
    rb_session **step_sess;
    int32_t *step_tok;
    size_t *step_have;        /* each session's tokens before the step */
    int is_multi_warned;
    uint32_t n_ctx, n_batch;
    /* the prefill chunk's choice (prefill_chunk), from the last steps */
    double est_prefill_s_tok; /* seconds per prompt token; 0: none measured yet */
    double est_decode_s;      /* one decode step of all the streams; 0: none yet */
    double t_decoded;         /* the end of the last decode step; 0: no stream decoded then */
    uint64_t round;           /* sched_main's rounds: one prefill chunk a request a round */
    sv_step_gauges gauges;    /* what /metrics shows of them */
    char *piece;              /* one detokenizer push */
    size_t max_piece;
    rb_session *embed_session; /* /v1/embeddings' (created at the first) */
    struct { char ns[SV_NS_MAX + 1]; uint64_t turn; } turns[SV_TURNS_MAX];
    uint64_t n_turns;         /* the fair turns' clock (under mu, in sched_main) */
};

/* ---- small helpers -------------------------------------------------------- */


static int tokenize(const sv_sched *s, const char *text, size_t len, int add_special, int32_t **out,
                    size_t *n_out, size_t lead)
{
    size_t cap = len + lead + 8, n = 0;
    int32_t *t = malloc(cap * sizeof *t);
    if (!t)
        return -1;
    rb_status st = RB_OK;
    if (len || add_special) {
        st = rb_model_tokenize(s->model, text, len, add_special, 1, t + lead, cap - lead, &n);
        if (st == RB_E_INVALID_ARG && n > cap - lead) {
            cap = n + lead;
            int32_t *u = realloc(t, cap * sizeof *t);
            if (!u) {
                free(t);
                return -1;
            }
            t = u;
            st = rb_model_tokenize(s->model, text, len, add_special, 1, t + lead, cap - lead,
                                   &n);
        }
    }
    if (st != RB_OK) {
        free(t);
        return -1;
    }
    *out = t, *n_out = n + lead;
    return 0;
}

/* text[0..len) into tokens appended to *v (parse_special: the tokenizer's
 * special-token text is a control token; 0: text). 0, or -1. Any thread:
 * rb_model_tokenize may run on several at once (rebound.h). */
static int tok_append(rb_model *model, const char *text, size_t len, int add_special,
                      int parse_special, int32_t **v, size_t *n, size_t *cap, size_t limit)
{
    if (!len && !add_special)
        return 0;
    /* room for what fits the context at most: a longer text is refused
       without holding an array for all of it */
    size_t room = 4 * len + 16 < limit + 16 ? 4 * len + 16 : limit + 16, got = 0;
    if (sv_grow((void **)v, cap, *n + room, sizeof **v))
        return -1;
    rb_status st = rb_model_tokenize(model, text, len, add_special, parse_special, *v + *n,
                                     *cap - *n, &got);
    if (st == RB_E_INVALID_ARG && got > *cap - *n && got > limit)
        return -2;
    if (st == RB_E_INVALID_ARG && got > *cap - *n) {
        if (sv_grow((void **)v, cap, *n + got, sizeof **v))
            return -1;
        st = rb_model_tokenize(model, text, len, add_special, parse_special, *v + *n, *cap - *n,
                               &got);
    }
    if (st != RB_OK)
        return -1;
    *n += got;
    return 0;
}

/* A control token's place in the rendered text: bytes [off, off + len). */
typedef struct ctl_span {
    size_t off, len;
    int32_t id;
} ctl_span;

/* The control tokens the template's own text [off, off + len) of R
 * holds, appended to *spans (found by tokenizing it with special parsing
 * and locating each control token's text). 0, or -1. */
static int template_controls(rb_model *model, const char *R, size_t off, size_t len,
                             ctl_span **spans, size_t *n, size_t *cap)
{
    int32_t *t = NULL;
    size_t nt = 0, ct = 0, at = off;
    if (tok_append(model, R + off, len, 0, 1, &t, &nt, &ct, (size_t)-1 / 8)) {
        free(t);
        return -1;
    }
    for (size_t i = 0; i < nt; i++) {
        char piece[256];
        size_t plain = 0, special = 0;
        if (rb_model_token_to_piece(model, t[i], 0, NULL, 0, &plain) != RB_OK ||
            rb_model_token_to_piece(model, t[i], 1, piece, sizeof piece, &special) != RB_OK ||
            plain != 0 || special == 0 || special >= sizeof piece)
            continue;
        const char *p = memmem(R + at, off + len - at, piece, special);
        if (!p)
            continue;
        if (sv_grow((void **)spans, cap, *n + 1, sizeof **spans)) {
            free(t);
            return -1;
        }
        (*spans)[(*n)++] = (ctl_span){(size_t)(p - R), special, t[i]};
        at = (size_t)(p - R) + special;
    }
    free(t);
    return 0;
}

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r';
}

/*
 * A chat's tokens with its messages' content as text: the template's own
 * markers are control tokens, the same text inside a message is not.
 *
 * The conversation is rendered twice: as it is (R), and with each
 * non-empty content replaced by a placeholder "\x01<i>\x02" (P). P's text
 * between placeholders is the template's; walking P and R together places
 * each content in R (as given, or trimmed where the template trims it:
 * the candidate whose end is followed by the template's next text). The
 * control tokens of the template's text (template_controls) split R into
 * runs, each tokenized as text: the same fragments the tokenizer makes of
 * R with special parsing when the content holds no special-token text, so
 * ordinary requests keep the tokens (and the stored conversations' prefixes)
 * they always had. -1 (msg) when the two renderings cannot be aligned.
 *
 * The model's own tokens: an assistant message whose content is, byte for
 * byte, a reply a conversation of r's namespace remembers (convstore.h,
 * sv_replies) where the tokens so far are the ones before that reply (same
 * count, same hash) becomes the tokens that conversation's session holds
 * for it (the generated ones, and the template's closing when it was fed
 * and the rendering closes the message with the same text), whatever the
 * text would tokenize into; the rendering goes on after them as a new run.
 * A content that no conversation remembers is tokenized as above.
 */
static int chat_tokens(const sv_sched *s, const sv_request *r, int32_t **out, size_t *n_out,
                       char *msg, size_t msg_n)
{
    rb_chat_message *pm = calloc(r->n_msgs ? r->n_msgs : 1, sizeof *pm);
    char (*ph)[24] = calloc(r->n_msgs ? r->n_msgs : 1, sizeof *ph);
    /* each content's place in R; is_own: a remembered reply's text */
    size_t *cs = calloc(r->n_msgs ? r->n_msgs : 1, sizeof *cs);
    size_t *ce = calloc(r->n_msgs ? r->n_msgs : 1, sizeof *ce);
    char *is_own = calloc(r->n_msgs ? r->n_msgs : 1, 1);
    int32_t *own = NULL;
    char *R = NULL, *P = NULL;
    int32_t *v = NULL;
    ctl_span *spans = NULL;
    size_t n = 0, cap = 0, n_sp = 0, cap_sp = 0, lr = 0, lp = 0;
    int rc = -1;
    if (!pm || !ph || !cs || !ce || !is_own)
        goto nomem;
    for (size_t i = 0; i < r->n_msgs; i++) {
        snprintf(ph[i], sizeof ph[i], "\x01%zu\x02", i);
        pm[i].role = r->msgs[i].role;
        pm[i].content = r->msgs[i].content[0] ? ph[i] : "";
    }
    /* the tool list and the assistant's calls are the template's text (its
       markers may be control tokens); messages' contents stay text */
    rb_chat_tools tl = {r->tools_text, (const char *const *)r->msg_calls};
    if (rb_chat_render_tools(s->tmpl, r->msgs, r->n_msgs, &tl, 1, NULL, 0, &lr) != RB_OK ||
        rb_chat_render_tools(s->tmpl, pm, r->n_msgs, &tl, 1, NULL, 0, &lp) != RB_OK ||
        !(R = malloc(lr + 1)) || !(P = malloc(lp + 1)) ||
        rb_chat_render_tools(s->tmpl, r->msgs, r->n_msgs, &tl, 1, R, lr + 1, &lr) != RB_OK ||
        rb_chat_render_tools(s->tmpl, pm, r->n_msgs, &tl, 1, P, lp + 1, &lp) != RB_OK) {
        snprintf(msg, msg_n, "the messages cannot be rendered with the chat template");
        goto done;
    }
    /* walk P: template text (controls allowed) and placeholders (content) */
    size_t ip = 0, ir = 0;
    while (ip <= lp) {
        const char *q = memchr(P + ip, '\x01', lp - ip);
        size_t seg = q ? (size_t)(q - P) - ip : lp - ip;
        if (ir + seg > lr || memcmp(R + ir, P + ip, seg)) {
            snprintf(msg, msg_n, "the chat template's rendering cannot be aligned");
            goto done;
        }
        if (template_controls(s->model, R, ir, seg, &spans, &n_sp, &cap_sp))
            goto nomem;
        ip += seg, ir += seg;
        if (!q)
            break;
        char *end = NULL;
        size_t i = strtoul(P + ip + 1, &end, 10);
        if (!end || *end != '\x02' || i >= r->n_msgs) {
            snprintf(msg, msg_n, "the chat template's rendering cannot be aligned");
            goto done;
        }
        ip = (size_t)(end - P) + 1;
        /* the template's text after this content, up to the next placeholder */
        const char *q2 = memchr(P + ip, '\x01', lp - ip);
        size_t next = q2 ? (size_t)(q2 - P) - ip : lp - ip;
        const char *c = r->msgs[i].content;
        size_t cl = strlen(c), b = 0, e = cl, k;
        while (b < e && is_ws(c[b]))
            b++;
        while (e > b && is_ws(c[e - 1]))
            e--;
        const size_t cand[2][2] = {{0, cl}, {b, e}};
        for (k = 0; k < 2; k++) {
            size_t len = cand[k][1] - cand[k][0];
            if (ir + len + next <= lr && !memcmp(R + ir, c + cand[k][0], len) &&
                !memcmp(R + ir + len, P + ip, next))
                break;
        }
        if (k == 2) {
            snprintf(msg, msg_n, "the chat template's rendering cannot be aligned");
            goto done;
        }
        cs[i] = ir;
        ir += cand[k][1] - cand[k][0];
        ce[i] = ir;
        is_own[i] = !strcmp(r->msgs[i].role, "assistant") &&
                    sv_replies_has_text(&s->store.replies, r->ns, c, cl);
    }
    if (ir != lr) {
        snprintf(msg, msg_n, "the chat template's rendering cannot be aligned");
        goto done;
    }
    if (s->bos >= 0) {
        if (sv_grow((void **)&v, &cap, 1, sizeof *v))
            goto nomem;
        v[n++] = s->bos;
    }
    size_t at = 0, m = 0, j = 0;
    for (;;) {
        size_t stop = j < n_sp ? spans[j].off : lr;
        /* a remembered reply before the next control token: the text up to
           it, then its own tokens in place of its text (and closing) */
        while (m < r->n_msgs && (!is_own[m] || cs[m] < at))
            m++;
        if (m < r->n_msgs && cs[m] < stop) {
            size_t n0 = n, n_own = 0, n_end = 0;
            int rt = tok_append(s->model, R + at, cs[m] - at, 0, 0, &v, &n, &cap, s->n_ctx);
            if (rt == -2 || n > s->n_ctx)
                goto too_long;
            if (rt)
                goto nomem;
            const char *c = r->msgs[m].content;
            int f = sv_replies_find(&s->store.replies, r->ns, r->conv_id, n,
                                    sv_tokens_hash(v, n), c, strlen(c), &own, &n_own, &n_end);
            if (f < 0)
                goto nomem;
            if (f == 0) { /* not after the tokens it came after: text as usual */
                n = n0;
                m++;
                continue;
            }
            size_t skip = ce[m];
            if (n_end && skip + s->n_reply_end_text <= lr &&
                !memcmp(R + skip, s->reply_end_text, s->n_reply_end_text))
                skip += s->n_reply_end_text; /* the closing too: the session's */
            else
                n_own -= n_end;
            if (n + n_own > s->n_ctx)
                goto too_long;
            if (sv_grow((void **)&v, &cap, n + n_own, sizeof *v))
                goto nomem;
            memcpy(v + n, own, n_own * sizeof *v);
            n += n_own;
            free(own);
            own = NULL;
            at = skip;
            while (j < n_sp && spans[j].off < at)
                j++;
            m++;
            continue;
        }
        int rt = tok_append(s->model, R + at, stop - at, 0, 0, &v, &n, &cap, s->n_ctx);
        if (rt == -2 || n > s->n_ctx)
            goto too_long;
        if (rt)
            goto nomem;
        if (j == n_sp)
            break;
        if (sv_grow((void **)&v, &cap, n + 1, sizeof *v))
            goto nomem;
        v[n++] = spans[j].id;
        at = spans[j].off + spans[j].len;
        j++;
    }
    *out = v, *n_out = n;
    v = NULL;
    rc = 0;
    goto done;
too_long:
    *out = v, *n_out = s->n_ctx + 1; /* the caller says so */
    v = NULL;
    rc = 0;
    goto done;
nomem:
    snprintf(msg, msg_n, "out of memory while tokenizing");
done:
    free(v);
    free(own);
    free(cs);
    free(ce);
    free(is_own);
    free(spans);
    free(R);
    free(P);
    free(pm);
    free(ph);
    return rc;
}

sv_err sv_sched_prepare(const sv_sched *s, sv_request *r, char *msg, size_t msg_n)
{
    int32_t *toks = NULL;
    size_t n = 0, cap = 0;
    /* a text longer than the context's tokens can hold is refused before
       it is tokenized */
    size_t bytes = r->prompt ? strlen(r->prompt) : 0;
    for (size_t i = 0; i < r->n_msgs; i++)
        bytes += strlen(r->msgs[i].content);
    size_t most = (size_t)s->n_ctx * (s->max_piece ? s->max_piece : 64);
    if (bytes > most) {
        snprintf(msg, msg_n, "the prompt has %zu bytes of text; the context holds %" PRIu32
                 " tokens, at most %zu bytes", bytes, s->n_ctx, most);
        return SV_ERR_INVALID;
    }
    if (r->kind == SV_COMPLETION) {
        int rt = tok_append(s->model, r->prompt, strlen(r->prompt), 1,
                            s->cfg->completions_special, &toks, &n, &cap, s->n_ctx);
        if (rt == -2) {
            n = s->n_ctx + 1; /* too long: said below */
        } else if (rt) {
            free(toks);
            snprintf(msg, msg_n, "the prompt cannot be tokenized");
            return SV_ERR_INVALID;
        }
    } else if (chat_tokens(s, r, &toks, &n, msg, msg_n)) {
        return SV_ERR_INVALID;
    }
    size_t reserve = 1 + (r->kind == SV_CHAT ? s->n_reply_end : 0);
    if (n == 0 || n + reserve > s->n_ctx) {
        free(toks);
        if (n > s->n_ctx)
            snprintf(msg, msg_n, "the prompt has more than %" PRIu32 " tokens; the context holds "
                     "%" PRIu32 " (with room for one reply token%s)", s->n_ctx, s->n_ctx,
                     r->kind == SV_CHAT ? " and the reply's end" : "");
        else
            snprintf(msg, msg_n, "the prompt has %zu tokens; the context holds %" PRIu32
                     " (with room for one reply token%s)", n, s->n_ctx,
                     r->kind == SV_CHAT ? " and the reply's end" : "");
        return SV_ERR_INVALID;
    }
    r->toks = toks;
    r->n_toks = n;
    if (!r->has_seed && !s->cfg->has_seed) {
        uint64_t seed = 0;
        sv_random(&seed, sizeof seed);
        r->sp.seed = seed & 0xffffffffu;
    }
    r->t_prepared = sv_now_s();
    return SV_ERR_NONE;
}

size_t sv_sched_max_body(const sv_sched *s)
{
    /* a token of text is at most max_piece bytes, each at most 6 bytes of
       JSON (\u0000); the rest of a request is small */
    return (size_t)s->n_ctx * (s->max_piece ? s->max_piece : 64) * 6 + 65536;
}

sv_err sv_sched_prepare_utility(const sv_sched *s, sv_request *r, char *msg, size_t msg_n)
{
    rb_model_info mi;
    if (rb_model_get_info(s->model, &mi) != RB_OK) {
        snprintf(msg, msg_n, "the model's info cannot be read");
        return SV_ERR_SERVER;
    }
    /* token ids given by the client are checked against the vocabulary */
    for (size_t i = 0; i < r->n_inputs; i++)
        for (size_t k = 0; k < r->inputs[i].n_toks; k++)
            if (r->inputs[i].toks[k] < 0 || (uint32_t)r->inputs[i].toks[k] >= mi.n_vocab) {
                snprintf(msg, msg_n, "token %d (input %zu, position %zu) is outside the "
                         "vocabulary of %u", (int)r->inputs[i].toks[k], i, k, mi.n_vocab);
                return SV_ERR_INVALID;
            }
    if (r->kind == SV_INPUT_TOKENS) { /* the chat request's prompt, as it would be fed */
        int32_t *toks = NULL;
        size_t n = 0;
        if (chat_tokens(s, r, &toks, &n, msg, msg_n))
            return SV_ERR_INVALID;
        free(toks);
        r->n_prompt = n;
        return SV_ERR_NONE;
    }
    if (r->kind == SV_TOKENIZE) {
        int32_t *toks = NULL;
        size_t n = 0;
        const char *t = r->inputs[0].text;
        if (tokenize(s, t, strlen(t), r->add_special, &toks, &n, 0) != 0) {
            snprintf(msg, msg_n, "the text cannot be tokenized");
            return SV_ERR_INVALID;
        }
        r->res_toks = toks;
        r->n_res_toks = n;
        if (r->with_pieces) {
            r->res_pieces = calloc(n ? n : 1, sizeof *r->res_pieces);
            r->res_lens = calloc(n ? n : 1, sizeof *r->res_lens);
            if (!r->res_pieces || !r->res_lens) {
                snprintf(msg, msg_n, "out of memory");
                return SV_ERR_UNAVAILABLE;
            }
            for (size_t i = 0; i < n; i++) {
                size_t k = 0;
                rb_model_token_to_piece(s->model, toks[i], 1, NULL, 0, &k);
                if (!(r->res_pieces[i] = malloc(k + 1))) {
                    snprintf(msg, msg_n, "out of memory");
                    return SV_ERR_UNAVAILABLE;
                }
                rb_model_token_to_piece(s->model, toks[i], 1, r->res_pieces[i], k + 1,
                                        &r->res_lens[i]);
            }
        }
        return SV_ERR_NONE;
    }
    if (r->kind != SV_EMBED)
        return SV_ERR_NONE;
    /* each text input into its tokens (BOS first), 1 to n_ctx of them; a
       longer text is refused without an array for all of it */
    for (size_t i = 0; i < r->n_inputs; i++) {
        sv_input *in = &r->inputs[i];
        if (in->text) {
            int32_t *v = NULL;
            size_t n = 0, cap = 0;
            int rt = tok_append(s->model, in->text, strlen(in->text), 1, 1, &v, &n, &cap,
                                s->n_ctx);
            if (rt == -1) {
                free(v);
                snprintf(msg, msg_n, "input %zu cannot be tokenized", i);
                return SV_ERR_INVALID;
            }
            if (rt == -2)
                n = s->n_ctx + 1;
            free(in->toks);
            in->toks = v;
            in->n_toks = n > s->n_ctx ? 0 : n;
            if (n > s->n_ctx) {
                snprintf(msg, msg_n, "input %zu has more than %" PRIu32 " tokens; it must have "
                         "1 to %" PRIu32, i, s->n_ctx, s->n_ctx);
                return SV_ERR_INVALID;
            }
        }
        if (in->n_toks == 0 || in->n_toks > s->n_ctx) {
            snprintf(msg, msg_n, "input %zu has %zu tokens; it must have 1 to %" PRIu32, i,
                     in->n_toks, s->n_ctx);
            return SV_ERR_INVALID;
        }
    }
    return SV_ERR_NONE;
}

/* The scheduler lets go of a request it took from the queue. */
static void sched_release(sv_sched *s, sv_request *r)
{
    pthread_mutex_lock(&s->mu);
    s->n_in_flight--;
    pthread_mutex_unlock(&s->mu);
    sv_request_release(r);
}


/* ---- the request's shared side ------------------------------------------- */

static void req_publish(sv_request *r, const char *p, size_t n)
{
    pthread_mutex_lock(&r->mu);
    if (n && r->out_len + n + 1 > r->out_cap) {
        size_t c = r->out_cap ? r->out_cap : 256;
        while (c < r->out_len + n + 1)
            c *= 2;
        char *q = realloc(r->out, c);
        if (q)
            r->out = q, r->out_cap = c;
        else
            n = 0; /* dropped: the request ends with an error below */
    }
    if (n) {
        memcpy(r->out + r->out_len, p, n);
        r->out_len += n;
        r->out[r->out_len] = 0;
    }
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int req_is_cancelled(sv_request *r)
{
    pthread_mutex_lock(&r->mu);
    int c = r->is_cancelled;
    pthread_mutex_unlock(&r->mu);
    return c;
}

/* Ends r with an error (before or after it started). */
static void req_fail(sv_request *r, sv_err e, const char *fmt, ...)
{
    pthread_mutex_lock(&r->mu);
    r->err = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->errmsg, sizeof r->errmsg, fmt, ap);
    va_end(ap);
    r->is_done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* ---- one request --------------------------------------------------------- */

static void active_free(sv_active *a)
{
    free(a->todo);
    free(a->text);
    rb_sampler_destroy(a->sampler);
    rb_grammar_destroy(a->grammar);
    rb_detokenizer_destroy(a->detok);
    memset(a, 0, sizeof *a);
}

/*
 * Admits r into slot a: its conversation (in r's namespace only), the
 * rewind to the shared prefix, the sampler. Returns 0, or -1 after ending
 * r with its error.
 *
 * The conversation: the one r names (an id unknown in r's namespace,
 * whether or not another namespace has it, starts a new one of that id);
 * else the stored one whose tokens share the longest prefix with r's when
 * that prefix covers at least half of them. r continues it when r holds
 * all of its tokens, or goes on past its last prompt (n_prompt_end) and
 * differs only inside the last reply (the client re-rendered the server's
 * reply); when r differs before (another chat with the same start, a guess
 * at the stored text) or is the same prompt again, r forks: a new
 * conversation forks the stored one's open session (rb_session_fork: it
 * shares the KV pages of the prefix, and the stored one keeps its session,
 * its tokens and its file); a closed one's file is read into the new
 * conversation's session (the stored one is reopened from the file, or
 * computed again from its tokens, when it returns). A conversation whose file is missing or damaged is forgotten
 * (logged once) and r starts a new one from its full text.
 */
static int admit(sv_sched *s, sv_request *r, sv_active *a)
{
    int32_t *toks = r->toks;
    size_t n = r->n_toks;
    r->toks = NULL; /* the slot owns them now */
    memset(a, 0, sizeof *a);
    a->req = r;
    a->t_admit = sv_now_s();
    sv_conv *c = NULL, *from = NULL;
    size_t shared = 0;
    if (r->conv_id[0]) {
        c = sv_store_find(&s->store, r->ns, r->conv_id);
        if (!c && !(c = sv_store_add(&s->store, r->ns, r->conv_id)))
            goto nomem;
    } else if ((from = sv_store_match(&s->store, r->ns, toks, n, &shared)) &&
               (shared == from->n_tokens ||
                (shared >= from->n_prompt_end && n > from->n_prompt_end))) {
        /* r holds all of it, or goes on past its last prompt and differs
           only inside the reply the server gave last (a client sends that
           reply back re-rendered): the same chat */
        c = from, from = NULL;
    }
    if (!c) {
        char id[SV_ID_MAX + 1];
        sv_store_new_id(id);
        if (!(c = sv_store_add(&s->store, r->ns, id)))
            goto nomem;
        if (from) {
            /* the fork starts from the stored one's state: its KV up to
               the shared prefix is reused (the rewind below) */
            c->session = sv_store_take(&s->store, from, shared, &c->is_from_file);
            sv_store_inherit_replies(&s->store, from, c, shared);
            sv_log("conversation %s forked from %s at token %zu of %zu%s", id, from->id, shared,
                   from->n_tokens, from->session ? " (its KV pages shared)" : "");
        }
    }
    char err[600];
    sv_restore kind = SV_RESTORE_NEW;
    rb_status st = sv_store_open(&s->store, c, &kind, err, sizeof err);
    if (st != RB_OK && st != RB_E_NOMEM && c->has_file) {
        /* its file is missing or damaged: the conversation starts again
           from this request's text, as a new one of the same id */
        char id[SV_ID_MAX + 1];
        snprintf(id, sizeof id, "%s", c->id);
        sv_store_forget(&s->store, c);
        if (!(c = sv_store_add(&s->store, r->ns, id)))
            goto nomem;
        st = sv_store_open(&s->store, c, &kind, err, sizeof err);
    }
    if (st != RB_OK) {
        free(toks);
        req_fail(r, st == RB_E_NOMEM ? SV_ERR_UNAVAILABLE : SV_ERR_SERVER, "%s", err);
        if (!c->has_file && !c->session && !c->n_tokens)
            sv_store_remove(&s->store, c);
        return -1;
    }
    c->is_busy = 1;
    c->is_dropped = 0;
    sv_store_touch(&s->store, c);
    a->conv = c;
    /* the conversation being served is the pool's foreground: its restore
       begins now (what it brings before the prefill takes over is counted
       apart, restore_prefetched_bytes) */
    rb_session_stats st0;
    a->prefetch0 = rb_session_get_stats(c->session, &st0) == RB_OK ? st0.prefetch_bytes : 0;
    rb_session_set_priority(c->session, RB_PRIORITY_FOREGROUND);
    /* only what the conversation does not hold yet is computed; at least
       one token is fed so that its logits are this request's */
    size_t have = rb_session_n_tokens(c->session);
    size_t k = sv_common_prefix(rb_session_get_tokens(c->session), have, toks, n);
    if (k == n)
        k = n - 1;
    if (k < have && rb_session_rewind(c->session, k) != RB_OK) {
        req_fail(r, SV_ERR_SERVER, "%s", rb_session_errmsg(c->session));
        free(toks);
        c->is_busy = 0;
        a->conv = NULL;
        return -1;
    }
    a->todo = toks;
    a->n_todo = n;
    a->i_todo = k;
    c->n_prompt_end = n;
    rb_error e;
    if (rb_sampler_create(&r->sp, rb_session_n_vocab(c->session), &a->sampler, &e) != RB_OK) {
        req_fail(r, SV_ERR_INVALID, "%s", e.message);
        c->is_busy = 0;
        active_free(a);
        return -1;
    }
    /* the reply's grammar: a JSON Schema, any object, or tool calls under
       the call schema (in the chat template's form of calls) */
    if (r->format != SV_FMT_TEXT || r->tools == SV_TOOLS_REQUIRED) {
        rb_status gst;
        if (r->tools == SV_TOOLS_REQUIRED) {
            char *g = NULL;
            size_t gn = 0;
            gst = rb_json_schema_to_grammar(r->tool_schema, strlen(r->tool_schema), &g, &gn, &e);
            if (gst == RB_OK) {
                /* the converter's root is the call; tcroot the tagged calls
                   around it */
                const char *more = r->parallel_tool_calls ? "{0,3}" : "{0,0}";
                size_t cap = gn + 256;
                char *t = malloc(cap);
                if (!t) {
                    gst = RB_E_NOMEM;
                    snprintf(e.message, sizeof e.message, "out of memory");
                } else {
                    /* in the template's form: mistral's [TOOL_CALLS] list,
                       llama 3.1's bare objects, else <tool_call> tags */
                    if (s->tmpl == RB_CHAT_TEMPLATE_MISTRAL)
                        snprintf(t, cap, "%s\ntcroot ::= \"[TOOL_CALLS][\" root (\", \" root)%s "
                                 "\"]\"\n", g, more);
                    else if (s->tmpl == RB_CHAT_TEMPLATE_LLAMA3)
                        snprintf(t, cap, "%s\ntcroot ::= root (\"; \" root)%s\n", g, more);
                    else
                        snprintf(t, cap, "%s\ntcroot ::= tc (\"\\n\" tc)%s\n"
                                 "tc ::= \"<tool_call>\\n\" root \"\\n</tool_call>\"\n", g,
                                 more);
                    gst = rb_grammar_create(s->model, t, strlen(t), "tcroot", &a->grammar, &e);
                }
                free(t);
            }
            free(g);
        } else {
            gst = rb_grammar_from_json_schema(s->model, r->format == SV_FMT_JSON_SCHEMA ? r->schema
                                              : NULL, r->format == SV_FMT_JSON_SCHEMA
                                              ? strlen(r->schema) : 0, &a->grammar, &e);
        }
        if (gst == RB_OK)
            gst = rb_sampler_set_grammar(a->sampler, a->grammar);
        if (gst != RB_OK) {
            req_fail(r, gst == RB_E_NOMEM ? SV_ERR_UNAVAILABLE : SV_ERR_INVALID, "%s%s",
                     r->tools == SV_TOOLS_REQUIRED ? "tools: " : "response_format: ", e.message);
            c->is_busy = 0;
            active_free(a);
            return -1;
        }
    }
    if (r->n_bias &&
        rb_sampler_set_logit_bias(a->sampler, r->bias_ids, r->bias_vals, r->n_bias) != RB_OK) {
        req_fail(r, SV_ERR_INVALID, "logit_bias: %s", rb_sampler_errmsg(a->sampler));
        c->is_busy = 0;
        active_free(a);
        return -1;
    }
    unsigned flags = r->kind == SV_COMPLETION ? RB_DETOKENIZER_CONTINUATION : 0;
    if (rb_detokenizer_create_flags(s->model, flags, &a->detok, &e) != RB_OK) {
        req_fail(r, SV_ERR_SERVER, "%s", e.message);
        c->is_busy = 0;
        active_free(a);
        return -1;
    }
    pthread_mutex_lock(&r->mu);
    r->n_prompt = n;
    r->n_cached = k;
    snprintf(r->conv_out, sizeof r->conv_out, "%s", c->id);
    r->restore = sv_restore_name(kind);
    r->is_started = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    rb_session_stats ws;
    if (rb_session_get_stats(c->session, &ws) == RB_OK)
        a->tm.weights_wait_s = -ws.weights_wait_s; /* finish adds the end's */
    a->t_admitted = sv_now_s();
    sv_metrics_add(s->metrics, r->ns, tokens_prompt, n);
    sv_metrics_add(s->metrics, r->ns, tokens_cached, k);
    return 0;
nomem:
    free(toks);
    req_fail(r, SV_ERR_UNAVAILABLE, "out of memory");
    return -1;
}

/* The first stop string in text[0..len), its offset; len when none. */
static size_t find_stop(const sv_request *r, const char *text, size_t len)
{
    size_t best = len;
    for (int i = 0; i < r->n_stop; i++) {
        size_t m = strlen(r->stop[i]);
        for (size_t j = 0; m && j + m <= len && j < best; j++)
            if (!memcmp(text + j, r->stop[i], m)) {
                best = j;
                break;
            }
    }
    return best;
}

/* Publishes a->text up to end, never cutting a UTF-8 character. */
static void publish_upto(sv_active *a, size_t end)
{
    while (end > a->published && end < a->len && ((unsigned char)a->text[end] & 0xC0) == 0x80)
        end--;
    if (end > a->published) {
        req_publish(a->req, a->text + a->published, end - a->published);
        a->published = end;
    }
}

/* Appends a piece; 1 when a stop string is now complete (the text is cut
 * before it), else 0; -1 out of memory. */
static int append_text(sv_active *a, const char *p, size_t n)
{
    sv_request *r = a->req;
    if (sv_grow((void **)&a->text, &a->cap, a->len + n + 1, 1))
        return -1;
    memcpy(a->text + a->len, p, n);
    a->len += n;
    size_t at = find_stop(r, a->text, a->len);
    if (at < a->len) {
        a->len = at;
        a->is_stopped = 1;
        publish_upto(a, at);
        return 1;
    }
    size_t hold = 0;
    for (int i = 0; i < r->n_stop; i++) {
        size_t m = strlen(r->stop[i]);
        if (m - 1 > hold)
            hold = m - 1;
    }
    publish_upto(a, a->len > hold ? a->len - hold : 0);
    return 0;
}

/*
 * The budget's last step, the pool's (rb_pool_next_to_close): while the
 * pool counts more than --mem-budget, or holds more than --max-open
 * sessions (the embeddings' session counts as one more), it names its least
 * recently used background session, and that session is closed: a
 * conversation's (its file keeps it), or the embeddings' (made again at
 * the next /v1/embeddings). Busy conversations are foreground, so they are
 * never named. Then the store keeps its count and disk limits.
 */
static void close_idle(sv_sched *s)
{
    rb_session *ss;
    uint32_t max = s->cfg->max_open + (s->embed_session ? 1 : 0);
    while (s->store.pool && (ss = rb_pool_next_to_close(s->store.pool, max))) {
        if (ss == s->embed_session) {
            rb_session_destroy(ss);
            s->embed_session = NULL;
            max--;
            continue;
        }
        if (!sv_store_close_session(&s->store, ss))
            break;
    }
    sv_store_enforce(&s->store);
}


/* Ends the active request: the rest of the reply published, a chat reply
 * closed as the template does, the conversation saved and handed back.
 * e: SV_ERR_NONE, or the error the request ends with (msg). */
static void finish(sv_sched *s, sv_active *a, const char *reason, sv_err e, const char *msg)
{
    sv_request *r = a->req;
    sv_conv *c = a->conv;
    rb_session *ss = c->session;
    if (a->detok && a->phase == PHASE_DECODE) {
        /* an unfinished character comes out as U+FFFD; not after a stop
           string (the text ends before it) */
        size_t k = 0;
        if (!a->is_stopped &&
            rb_detokenizer_flush(a->detok, s->piece, s->max_piece, &k) == RB_OK && k)
            append_text(a, s->piece, k);
        publish_upto(a, a->len);
    }
    /* a chat reply is closed as the template closes it, so that the next
       turn's rendering shares this conversation's tokens */
    size_t n_end = 0;
    if (r->kind == SV_CHAT && a->phase == PHASE_DECODE && s->n_reply_end &&
        rb_session_n_tokens(ss) + s->n_reply_end <= s->n_ctx) {
        if (rb_session_feed(ss, s->reply_end, s->n_reply_end, NULL) == RB_OK)
            n_end = s->n_reply_end;
        else
            sv_log("warning: conversation %s: closing the reply: %s", c->id,
                   rb_session_errmsg(ss));
    }
    /* the reply's text as the client got it, and the tokens the session
       holds for it: a next turn that sends the text back gets them */
    if (r->kind == SV_CHAT && a->phase == PHASE_DECODE && e == SV_ERR_NONE &&
        sv_store_add_reply(&s->store, c, c->n_prompt_end, n_end, a->text, a->len) != 0)
        sv_log("warning: conversation %s: its reply's tokens are not kept (out of memory)",
               c->id);
    sv_store_commit(&s->store, c);
    rb_session_set_priority(ss, RB_PRIORITY_BACKGROUND);
    c->is_busy = 0;
    sv_store_touch(&s->store, c);
    /* the bounds hold when the client sees the reply end */
    close_idle(s);
    double now = sv_now_s();
    sv_timings *tm = &a->tm;
    rb_session_stats st;
    if (rb_session_get_stats(ss, &st) == RB_OK)
        tm->weights_wait_s += st.weights_wait_s;
    tm->prepare_s = r->t_prepared - r->t_arrival;
    tm->queue_s = a->t_admit - r->t_prepared;
    tm->open_s = a->t_admitted - a->t_admit;
    tm->has_first = a->has_ttft;
    tm->prefill_s = (a->has_ttft ? a->t_first : now) - a->t_admitted;
    tm->decode_s = a->has_ttft ? now - a->t_first : 0;
    pthread_mutex_lock(&r->mu);
    r->tm = *tm;
    r->finish_reason = reason;
    r->n_completion = (size_t)a->n_gen;
    if (e != SV_ERR_NONE) {
        r->err = e;
        snprintf(r->errmsg, sizeof r->errmsg, "%s", msg ? msg : "internal error");
    }
    r->is_done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    sv_metrics_add(s->metrics, r->ns, tokens_completion, (uint64_t)a->n_gen);
    if (reason && !strcmp(reason, "cancelled"))
        sv_metrics_add(s->metrics, r->ns, cancelled, 1);
    sv_log("%s conversation %s: %zu prompt tokens (%zu cached), %" PRId64 " generated, %s%s%s; "
           "first token after %.3f s = prepare %.3f + queue %.3f + open %.3f + prefill %.3f "
           "(restore: %.1f MiB brought at admission; in the prefill room made in %.3f s, "
           "%.1f MiB read in %.3f s, %.1f MiB decoded in %.3f s, waited %.3f s)",
           r->kind == SV_CHAT ? "chat" : "completion", r->conv_out, r->n_prompt, r->n_cached, a->n_gen,
           reason ? reason : "error", e != SV_ERR_NONE ? ": " : "", e != SV_ERR_NONE ? msg : "",
           tm->prepare_s + tm->queue_s + tm->open_s + tm->prefill_s, tm->prepare_s, tm->queue_s,
           tm->open_s, tm->prefill_s, (double)tm->restore_bytes_prefetched / 1048576.0,
           tm->room_s,
           (double)tm->restore_bytes_io / 1048576.0, tm->restore_io_s,
           (double)tm->restore_bytes_decoded / 1048576.0, tm->restore_decode_s,
           tm->restore_wait_s);
    sched_release(s, r);
    active_free(a);
}

/* The restore of the feed just done (the stats hold the last feed's: zeros
 * when it restored nothing), added to tm. */
static void add_restore(sv_timings *tm, const rb_session_stats *a)
{
    tm->restore_io_s += a->restore_io_s;
    tm->restore_decode_s += a->restore_decode_s;
    tm->restore_wait_s += a->restore_wait_s;
    tm->restore_span_s += a->restore_total_s;
    tm->room_s += a->room_s;
    tm->restore_bytes_io += a->restore_bytes_io;
    tm->restore_bytes_decoded += a->restore_bytes_decoded;
    tm->restore_recomputed += a->restore_recomputed_tokens;
}

#define CHUNK_MIN 32     /* the least tokens of a shared prefill chunk */
#define STEP_EWMA 0.3    /* the weight of the newest step time in the estimates */

/*
 * The size of a's next prefill chunk (the rule of the file-opening
 * comment): with no stream decoding, the rest of its prompt up to n_batch
 * (*is_shared 0); else (*is_shared 1) the tokens that fit the stall
 * budget, --max-stall-ms less one decode step, split between the requests
 * in their prompt, at the estimated seconds per prompt token; at least
 * CHUNK_MIN (at most n_batch) so that the prompt progresses however slow
 * a step is; CHUNK_MIN until a prefill has been measured.
 */
static size_t prefill_chunk(const sv_sched *s, const sv_active *a, int *is_shared)
{
    size_t left = a->n_todo - a->i_todo, n = s->n_batch;
    uint32_t n_decoding = 0, n_prefill = 0;
    for (uint32_t j = 0; j < s->cfg->parallel; j++) {
        if (s->active[j].req && s->active[j].phase == PHASE_DECODE)
            n_decoding++;
        else if (s->active[j].req)
            n_prefill++;
    }
    *is_shared = n_decoding > 0;
    if (n_decoding) {
        double stall = (s->cfg->max_stall_ms ? s->cfg->max_stall_ms : 200) / 1000.0;
        double per = (stall - s->est_decode_s) / (n_prefill ? n_prefill : 1);
        double fit = s->est_prefill_s_tok > 0 && per > 0 ? per / s->est_prefill_s_tok : 0;
        n = fit < CHUNK_MIN ? CHUNK_MIN : fit < s->n_batch ? (size_t)fit : s->n_batch;
        if (n > s->n_batch)
            n = s->n_batch;
    }
    return n < left ? n : left;
}

/* est += STEP_EWMA * w * (x - est); x itself when there is none yet. */
static void ewma(double *est, double x, double w)
{
    *est = *est > 0 ? *est + STEP_EWMA * w * (x - *est) : x;
}

/* One prefill step of an active request: a chunk of its prompt tokens
 * (prefill_chunk; the decode steps are decode_all's), timed for the
 * estimate of seconds per prompt token. */
static void step_prefill(sv_sched *s, sv_active *a)
{
    sv_request *r = a->req;
    rb_session *ss = a->conv->session;
    if (req_is_cancelled(r)) {
        finish(s, a, "cancelled", SV_ERR_NONE, NULL);
        return;
    }
    int is_shared = 0;
    size_t n = prefill_chunk(s, a, &is_shared);
    double t0 = sv_now_s();
    if (rb_session_feed(ss, a->todo + a->i_todo, n, NULL) != RB_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rb_session_errmsg(ss));
        finish(s, a, NULL, SV_ERR_SERVER, msg);
        return;
    }
    /* a chunk below CHUNK_MIN (a prompt's end) counts for less: its
       per-token time is mostly the pass's fixed cost */
    ewma(&s->est_prefill_s_tok, (sv_now_s() - t0) / (double)n,
         n < CHUNK_MIN ? (double)n / CHUNK_MIN : 1.0);
    rb_session_stats after;
    if (rb_session_get_stats(ss, &after) == RB_OK) {
        add_restore(&a->tm, &after);
        a->tm.restore_bytes_prefetched = after.prefetch_bytes > a->prefetch0
                                             ? after.prefetch_bytes - a->prefetch0 : 0;
    }
    a->fed_round = s->round;
    if (is_shared) {
        sv_metrics_add(s->metrics, NULL, prefill_chunks_shared, 1);
        sv_metrics_add(s->metrics, NULL, prefill_tokens_shared, n);
    } else {
        sv_metrics_add(s->metrics, NULL, prefill_chunks_alone, 1);
        sv_metrics_add(s->metrics, NULL, prefill_tokens_alone, n);
    }
    s->gauges.prefill_s_per_token = s->est_prefill_s_tok;
    s->gauges.chunk_last_tokens = n;
    sv_metrics_set_steps(s->metrics, &s->gauges);
    a->i_todo += n;
    if (a->i_todo == a->n_todo) {
        a->phase = PHASE_DECODE;
        free(a->todo);
        a->todo = NULL;
    }
}

static void lp_text(sv_sched *s, int32_t id, sv_lp_token *t)
{
    size_t k = 0;
    char buf[256];
    t->n_text = 0;
    if (rb_model_token_to_piece(s->model, id, 0, buf, sizeof buf, &k) == RB_OK) {
        if (k > SV_LP_TOKEN_MAX)
            k = SV_LP_TOKEN_MAX;
        memcpy(t->text, buf, k);
        t->n_text = (uint8_t)k;
    }
}

/* The sampled token's log-probability and alternatives into r->lps. */
static int record_logprob(sv_sched *s, sv_active *a, int32_t id)
{
    rb_sampler_logprob chosen, top[RB_SAMPLER_MAX_LOGPROBS];
    size_t n_top = 0;
    if (rb_sampler_get_logprobs(a->sampler, &chosen, top, RB_SAMPLER_MAX_LOGPROBS, &n_top) != RB_OK)
        return 0; /* nothing drawn from a finite row: no entry */
    sv_logprob lp;
    memset(&lp, 0, sizeof lp);
    lp_text(s, id, &lp.tok);
    lp.tok.logprob = chosen.logprob;
    lp.n_top = (uint8_t)n_top;
    for (size_t i = 0; i < n_top; i++) {
        lp_text(s, top[i].id, &lp.top[i]);
        lp.top[i].logprob = top[i].logprob;
    }
    sv_request *r = a->req;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    if (r->n_lps == r->cap_lps) {
        size_t cap = r->cap_lps ? 2 * r->cap_lps : 64;
        sv_logprob *q = realloc(r->lps, cap * sizeof *q);
        if (q)
            r->lps = q, r->cap_lps = cap;
        else
            rc = -1;
    }
    if (rc == 0)
        r->lps[r->n_lps++] = lp;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

/* A decode step's first half: the request's next token sampled from its
 * session's logits and published. Returns 1 with *next when that token is
 * to be computed (the request goes on), 0 when the request has ended. */
static int decode_pick(sv_sched *s, sv_active *a, int32_t *next)
{
    sv_request *r = a->req;
    rb_session *ss = a->conv->session;
    if (req_is_cancelled(r)) {
        finish(s, a, "cancelled", SV_ERR_NONE, NULL);
        return 0;
    }
    if (rb_sampler_sample(a->sampler, rb_session_get_logits(ss), rb_session_get_tokens(ss),
                          rb_session_n_tokens(ss), next) != RB_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rb_sampler_errmsg(a->sampler));
        finish(s, a, NULL, SV_ERR_SERVER, msg);
        return 0;
    }
    if (!a->has_ttft) {
        a->has_ttft = 1;
        a->t_first = sv_now_s();
        sv_metrics_record_ttft(s->metrics, r->ns, a->t_first - r->t_arrival);
    }
    if (r->sp.is_logprobs && record_logprob(s, a, *next) != 0) {
        finish(s, a, NULL, SV_ERR_SERVER, "out of memory");
        return 0;
    }
    if (rb_model_token_is_eog(s->model, *next)) {
        finish(s, a, "stop", SV_ERR_NONE, NULL);
        return 0;
    }
    size_t k = 0;
    if (rb_detokenizer_push(a->detok, *next, s->piece, s->max_piece, &k) != RB_OK)
        k = 0;
    a->n_gen++;
    int stop = append_text(a, s->piece, k);
    if (stop < 0) {
        finish(s, a, NULL, SV_ERR_SERVER, "out of memory");
        return 0;
    }
    if (stop || (a->grammar && !rb_grammar_can_continue(a->grammar))) {
        /* a stop string, or the grammar is complete and nothing can follow */
        finish(s, a, "stop", SV_ERR_NONE, NULL);
        return 0;
    }
    size_t reserve = r->kind == SV_CHAT ? s->n_reply_end : 0;
    if (rb_session_n_tokens(ss) + 1 + reserve > s->n_ctx) {
        finish(s, a, "length", SV_ERR_NONE, NULL);
        return 0;
    }
    return 1;
}

/*
 * One decode step of every active request past its prompt: each samples
 * its next token (decode_pick), then the tokens of all of them are
 * computed in one forward pass (rb_session_decode_multi: each weight read
 * once for every stream, each session's logits the bits of a feed alone).
 * When the pass refuses the set (a session streaming its weights under a
 * budget) or fails, every session it did not advance is fed alone, so one
 * conversation's error (its own rb_session_feed's) ends only its request.
 */
static void decode_all(sv_sched *s)
{
    double t0 = sv_now_s();
    size_t n = 0;
    for (uint32_t j = 0; j < s->cfg->parallel; j++) {
        sv_active *a = &s->active[j];
        if (!a->req || a->phase != PHASE_DECODE || !decode_pick(s, a, &s->step_tok[n]))
            continue;
        s->step_act[n] = a;
        s->step_sess[n] = a->conv->session;
        s->step_have[n] = rb_session_n_tokens(a->conv->session);
        n++;
    }
    if (n == 0) {
        s->t_decoded = 0; /* no stream waits: the next step starts a new gap count */
        return;
    }
    rb_status st = RB_E_INVALID_ARG;
    if (n > 1) {
        rb_error e;
        st = rb_session_decode_multi(s->step_sess, s->step_tok, n, &e);
        if (st != RB_OK && !s->is_multi_warned) {
            s->is_multi_warned = 1;
            sv_log("warning: %zu decode steps in one pass failed (%s); those sessions step "
                   "alone (said once)", n, e.message);
        }
    }
    if (n > 1 && st == RB_OK)
        sv_metrics_add(s->metrics, NULL, decode_passes_multi, 1);
    else
        sv_metrics_add(s->metrics, NULL, decode_passes_single, 1);
    for (size_t i = 0; i < n; i++) {
        sv_active *a = s->step_act[i];
        rb_session *ss = s->step_sess[i];
        if (rb_session_n_tokens(ss) != s->step_have[i] + 1 &&
            rb_session_feed(ss, &s->step_tok[i], 1, NULL) != RB_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", rb_session_errmsg(ss));
            finish(s, a, NULL, SV_ERR_SERVER, msg);
            continue;
        }
        if (a->req->max_tokens >= 0 && a->n_gen >= a->req->max_tokens)
            finish(s, a, "length", SV_ERR_NONE, NULL);
    }
    double t1 = sv_now_s();
    ewma(&s->est_decode_s, t1 - t0, 1.0);
    if (s->t_decoded > 0 && t1 - s->t_decoded > s->gauges.decode_gap_max_s)
        s->gauges.decode_gap_max_s = t1 - s->t_decoded;
    /* the next gap counts from here while a stream goes on decoding (not
       across an idle wait after the last one ended) */
    s->t_decoded = 0;
    for (uint32_t j = 0; j < s->cfg->parallel; j++)
        if (s->active[j].req && s->active[j].phase == PHASE_DECODE)
            s->t_decoded = t1;
    s->gauges.decode_step_s = s->est_decode_s;
    sv_metrics_set_steps(s->metrics, &s->gauges);
}

/* 1 when a request for this id is active (or about to be, in taken) */
static int id_busy(sv_sched *s, const sv_request *r, sv_request **taken, int n_taken)
{
    sv_conv *c = sv_store_find(&s->store, r->ns, r->conv_id);
    if (c && c->is_busy)
        return 1;
    for (int i = 0; i < n_taken; i++)
        if (!strcmp(taken[i]->conv_id, r->conv_id) && !strcmp(taken[i]->ns, r->ns))
            return 1;
    return 0;
}

/* ---- the utilities: tokenize, detokenize, apply-template, embeddings ---- */

/* Ends r: its result is in place (the text, if any, in text[0..n)). */
static void utility_done(sv_request *r, const char *text, size_t n)
{
    pthread_mutex_lock(&r->mu);
    if (text) {
        free(r->out);
        r->out = malloc(n + 1);
        if (r->out) {
            memcpy(r->out, text, n);
            r->out[n] = 0;
            r->out_len = n;
            r->out_cap = n + 1;
        } else {
            r->err = SV_ERR_UNAVAILABLE;
            snprintf(r->errmsg, sizeof r->errmsg, "out of memory");
        }
    }
    r->is_started = 1;
    r->is_done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/*
 * A utility request, answered at once: the tokens of a text (made on the
 * connection thread already: sv_sched_prepare_utility), the text of
 * tokens, the chat template's rendering, or the embeddings of each input
 * (on a session of their own, rewound for each: no conversation of any
 * namespace is read or evicted by it; the inputs' tokens made on the
 * connection thread).
 * The results go into r; oai.c writes them as JSON.
 */
static void run_utility(sv_sched *s, sv_request *r)
{
    rb_model_info mi;
    if (rb_model_get_info(s->model, &mi) != RB_OK) {
        req_fail(r, SV_ERR_SERVER, "the model's info cannot be read");
        return;
    }
    if (r->kind == SV_TOKENIZE) { /* done by sv_sched_prepare_utility */
        utility_done(r, NULL, 0);
        return;
    }
    if (r->kind == SV_DETOKENIZE) {
        size_t cap = 64, len = 0;
        char *text = malloc(cap);
        for (size_t i = 0; text && i < r->inputs[0].n_toks; i++) {
            size_t k = 0;
            rb_model_token_to_piece(s->model, r->inputs[0].toks[i], 0, NULL, 0, &k);
            if (len + k + 1 > cap) {
                while (len + k + 1 > cap)
                    cap *= 2;
                char *q = realloc(text, cap);
                if (!q) {
                    free(text);
                    text = NULL;
                    break;
                }
                text = q;
            }
            rb_model_token_to_piece(s->model, r->inputs[0].toks[i], 0, text + len, cap - len, &k);
            len += k;
        }
        if (!text)
            req_fail(r, SV_ERR_UNAVAILABLE, "out of memory");
        else
            utility_done(r, text, len);
        free(text);
        return;
    }
    if (r->kind == SV_INPUT_TOKENS) { /* counted by sv_sched_prepare_utility */
        utility_done(r, "", 0);
        return;
    }
    if (r->kind == SV_APPLY_TEMPLATE) {
        size_t len = 0;
        char *text = NULL;
        rb_chat_tools tl = {r->tools_text, (const char *const *)r->msg_calls};
        if (rb_chat_render_tools(s->tmpl, r->msgs, r->n_msgs, &tl, 1, NULL, 0, &len) == RB_OK &&
            (text = malloc(len + 1)) &&
            rb_chat_render_tools(s->tmpl, r->msgs, r->n_msgs, &tl, 1, text, len + 1, &len) ==
                RB_OK)
            utility_done(r, text, len);
        else
            req_fail(r, SV_ERR_INVALID, "the messages cannot be rendered");
        free(text);
        return;
    }
    /* SV_EMBED */
    rb_error e;
    if (!s->embed_session) {
        rb_session_params p = s->store.sp;
        if (rb_session_create(s->model, &p, &s->embed_session, &e) != RB_OK) {
            req_fail(r, SV_ERR_UNAVAILABLE, "embeddings: %s", e.message);
            return;
        }
        rb_session_set_priority(s->embed_session, RB_PRIORITY_BACKGROUND);
    }
    float *vecs = malloc(sizeof *vecs * mi.n_embd * (r->n_inputs ? r->n_inputs : 1));
    if (!vecs) {
        req_fail(r, SV_ERR_UNAVAILABLE, "out of memory");
        return;
    }
    size_t n_tokens = 0;
    for (size_t i = 0; i < r->n_inputs; i++) {
        size_t n = r->inputs[i].n_toks; /* 1..n_ctx: sv_sched_prepare_utility */
        rb_status st = rb_session_embed(s->embed_session, r->inputs[i].toks, n,
                                        vecs + i * mi.n_embd, mi.n_embd);
        if (st != RB_OK) {
            req_fail(r, SV_ERR_SERVER, "embeddings: %s", rb_session_errmsg(s->embed_session));
            free(vecs);
            return;
        }
        n_tokens += n;
    }
    r->res_vecs = vecs;
    r->res_dim = mi.n_embd;
    r->res_n_tokens = n_tokens;
    utility_done(r, NULL, 0);
}

/* When namespace ns last got a slot (the scheduler's turn counter; 0:
 * never). A small table: namespaces beyond its size share the oldest
 * entry's place. */
static uint64_t ns_last_turn(const sv_sched *s, const char *ns)
{
    for (size_t i = 0; i < SV_TURNS_MAX; i++)
        if (s->turns[i].turn && !strcmp(s->turns[i].ns, ns))
            return s->turns[i].turn;
    return 0;
}

static void ns_take_turn(sv_sched *s, const char *ns)
{
    size_t at = 0;
    for (size_t i = 0; i < SV_TURNS_MAX; i++) {
        if (s->turns[i].turn && !strcmp(s->turns[i].ns, ns)) {
            at = i;
            break;
        }
        if (s->turns[i].turn < s->turns[at].turn)
            at = i;
    }
    snprintf(s->turns[at].ns, sizeof s->turns[at].ns, "%s", ns);
    s->turns[at].turn = ++s->n_turns;
}

/* Requests of namespace ns active now or taken in this round. */
static int ns_load(const sv_sched *s, const char *ns, sv_request **taken, int n_taken)
{
    int k = 0;
    for (uint32_t j = 0; j < s->cfg->parallel; j++)
        k += s->active[j].req && !strcmp(s->active[j].req->ns, ns);
    for (int i = 0; i < n_taken; i++)
        k += !strcmp(taken[i]->ns, ns);
    return k;
}

static void *sched_main(void *arg)
{
    sv_sched *s = arg;
    const uint32_t P = s->cfg->parallel;
    sv_request **taken = calloc(P, sizeof *taken);
    for (;;) {
        int n_taken = 0;
        s->round++;
        pthread_mutex_lock(&s->mu);
        if (!s->is_stopping && s->n_active == 0 && !s->head && s->store.pool && !s->idle_prefetched) {
            /* idle: the free budget restores the conversation most likely
               to return next (never trimming anything); a request that
               comes meanwhile takes its room back */
            pthread_mutex_unlock(&s->mu);
            rb_pool_prefetch_next(s->store.pool, NULL, NULL);
            s->idle_prefetched = 1;
            pthread_mutex_lock(&s->mu);
        }
        while (!s->is_stopping && s->n_active == 0 && !s->head)
            pthread_cond_wait(&s->cv, &s->mu);
        s->idle_prefetched = 0;
        if (s->is_stopping) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        /* fair turns between namespaces: each free slot goes to the
           oldest request of the namespace with the fewest requests
           running, then of the one that got a slot least recently; a
           conversation serves one request at a time, so one for a busy id
           waits */
        while (taken && s->n_active + (uint32_t)n_taken < P) {
            sv_request *best = NULL, *best_prev = NULL, *prev = NULL;
            int best_load = 0;
            uint64_t best_turn = 0;
            for (sv_request *r = s->head; r; prev = r, r = r->next) {
                if (r->conv_id[0] && id_busy(s, r, taken, n_taken))
                    continue;
                int load = ns_load(s, r->ns, taken, n_taken);
                uint64_t turn = ns_last_turn(s, r->ns);
                if (!best || load < best_load || (load == best_load && turn < best_turn))
                    best = r, best_prev = prev, best_load = load, best_turn = turn;
            }
            if (!best)
                break;
            if (best_prev)
                best_prev->next = best->next;
            else
                s->head = best->next;
            if (s->tail == best)
                s->tail = best_prev;
            best->next = NULL;
            ns_take_turn(s, best->ns);
            taken[n_taken++] = best;
        }
        pthread_mutex_unlock(&s->mu);
        for (int i = 0; i < n_taken; i++) {
            sv_active *a = NULL;
            for (uint32_t j = 0; j < P && !a; j++)
                if (!s->active[j].req)
                    a = &s->active[j];
            if (req_is_cancelled(taken[i])) {
                req_fail(taken[i], SV_ERR_INVALID, "the client closed the connection");
                sched_release(s, taken[i]);
                continue;
            }
            if (taken[i]->kind >= SV_TOKENIZE) {
                run_utility(s, taken[i]);
                sched_release(s, taken[i]);
                continue;
            }
            if (admit(s, taken[i], a) != 0) {
                a->req = NULL; /* the slot stays free */
                sched_release(s, taken[i]);
                continue;
            }
            s->n_active++;
            /* its first chunk at once: a session reopened from its file
               restores within this feed, before any other session computes */
            step_prefill(s, a);
            if (!a->req)
                s->n_active--;
        }
        /* a round: one prefill chunk of each request still in its prompt
           (those admitted above had theirs; prefill_chunk cuts it to fit
           the others' streams), then one decode step of all the others */
        for (uint32_t j = 0; j < P; j++)
            if (s->active[j].req && s->active[j].phase == PHASE_PREFILL &&
                s->active[j].fed_round != s->round)
                step_prefill(s, &s->active[j]);
        decode_all(s);
        s->n_active = 0;
        for (uint32_t j = 0; j < P; j++)
            s->n_active += s->active[j].req != NULL;
    }
    for (uint32_t j = 0; j < P; j++)
        if (s->active[j].req)
            finish(s, &s->active[j], "cancelled", SV_ERR_UNAVAILABLE, "the server is stopping");
    pthread_mutex_lock(&s->mu);
    sv_request *r = s->head;
    s->head = s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    while (r) {
        sv_request *nx = r->next;
        req_fail(r, SV_ERR_UNAVAILABLE, "the server is stopping");
        sched_release(s, r);
        r = nx;
    }
    free(taken);
    return NULL;
}

sv_err sv_sched_submit(sv_sched *s, sv_request *r)
{
    sv_err e = SV_ERR_NONE;
    pthread_mutex_lock(&s->mu);
    if (s->is_stopping)
        e = SV_ERR_UNAVAILABLE;
    else if (s->n_in_flight >= s->cfg->parallel + s->cfg->max_queue)
        e = SV_ERR_BUSY;
    if (e == SV_ERR_NONE) {
        pthread_mutex_lock(&r->mu);
        r->refs++;
        pthread_mutex_unlock(&r->mu);
        r->next = NULL;
        if (s->tail)
            s->tail->next = r;
        else
            s->head = r;
        s->tail = r;
        s->n_in_flight++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return e;
}

sv_request *sv_request_new(void)
{
    sv_request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->refs = 1;
    r->t_arrival = sv_now_s();
    return r;
}

void sv_request_release(sv_request *r)
{
    pthread_mutex_lock(&r->mu);
    int last = --r->refs == 0;
    pthread_mutex_unlock(&r->mu);
    if (!last)
        return;
    for (size_t i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
        if (r->msg_calls)
            free(r->msg_calls[i]);
    }
    free(r->msgs);
    free(r->msg_calls);
    free(r->prompt);
    free(r->schema);
    free(r->tools_text);
    free(r->tool_schema);
    free(r->bias_ids);
    free(r->bias_vals);
    free(r->lps);
    for (size_t i = 0; i < r->n_inputs; i++) {
        free(r->inputs[i].text);
        free(r->inputs[i].toks);
    }
    free(r->inputs);
    for (size_t i = 0; r->res_pieces && i < r->n_res_toks; i++)
        free(r->res_pieces[i]);
    free(r->res_pieces);
    free(r->res_lens);
    free(r->res_toks);
    free(r->res_vecs);
    free(r->toks);
    for (int i = 0; i < r->n_stop; i++)
        free(r->stop[i]);
    free(r->out);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---- start and stop ------------------------------------------------------ */

/* Logs "error: msg" (and a hint line) at the start; NULL for the caller. */
static sv_sched *start_fail(sv_sched *s, const char *msg, const char *hint)
{
    sv_log("error: %s", msg);
    if (hint)
        fprintf(stderr, "hint: %s\n", hint);
    sv_sched_free(s);
    return NULL;
}

sv_sched *sv_sched_start(const sv_config *cfg, rb_model *model, sv_metrics *metrics)
{
    sv_sched *s = calloc(1, sizeof *s);
    if (!s)
        return start_fail(NULL, "out of memory", NULL);
    s->cfg = cfg;
    s->model = model;
    s->metrics = metrics;
    s->bos = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    rb_session_params sp = cfg->sp;
    sv_store_init(&s->store, cfg, &sp, model, NULL, metrics);

    rb_chat_template_info info;
    if (rb_chat_template_choose(model, cfg->chat_template, &info) != RB_OK)
        return start_fail(s, "cannot choose a chat template", NULL);
    s->tmpl = info.tmpl;
    sv_log("chat template %s (%s)", info.name, cfg->chat_template ? "--chat-template" : info.reason);
    if (info.is_fallback)
        sv_log("note: %s; chat requests use the plain fallback (User: ... Assistant:); "
               "--chat-template NAME picks one of %s",
               info.first_line[0] ? "the model's tokenizer.chat_template is not one rebound knows"
                                  : "the model names no chat template",
               rb_chat_template_names());
    if (info.first_line[0])
        sv_log("note: its first line: '%s'", info.first_line);
    {
        int32_t probe[4];
        size_t n = 0;
        int32_t bos = rb_model_token_bos(model);
        if (bos >= 0 && rb_model_tokenize(model, "", 0, 1, 0, probe, 4, &n) == RB_OK && n >= 1 &&
            probe[0] == bos)
            s->bos = bos;
        size_t len = 0;
        char end[256];
        if (rb_chat_render_piece(s->tmpl, RB_CHAT_PIECE_REPLY_END, NULL, 0, end, sizeof end,
                                 &len) != RB_OK || len >= sizeof end ||
            tokenize(s, end, len, 0, &s->reply_end, &s->n_reply_end, 0) != 0)
            return start_fail(s, "cannot tokenize the template's reply end",
                              rb_model_errmsg(model));
        memcpy(s->reply_end_text, end, len);
        s->n_reply_end_text = len;
    }
    rb_error e;
    if (rb_pool_create(model, cfg->mem_budget_bytes, &s->pool, &e) != RB_OK)
        return start_fail(s, e.message, NULL);
    sp.pool = s->pool;
    sp.budget_bytes = 0;
    sp.priority = RB_PRIORITY_BACKGROUND;
    /* the first session loads the weights: an unsupported model fails here */
    rb_session *first = NULL;
    if (rb_session_create(model, &sp, &first, &e) != RB_OK)
        return start_fail(s, e.message, NULL);
    s->n_ctx = rb_session_n_ctx(first);
    sp.n_ctx = s->n_ctx; /* the files are saved and reopened with it */
    sv_store_init(&s->store, cfg, &sp, model, s->pool, metrics);
    s->store.spare = first;
    if (cfg->watch_pressure) {
        if (rb_pool_watch_pressure(s->pool, NULL, &e) != RB_OK)
            return start_fail(s, e.message, "serve runs without --pressure there");
        rb_pool_stats ps;
        rb_pool_get_stats(s->pool, &ps);
        sv_log("the pool trims on memory pressure from %s", ps.pressure_source);
    }
    s->n_batch = sp.n_batch ? sp.n_batch : 128;
    {
        rb_detokenizer *d = NULL;
        if (rb_detokenizer_create(model, &d, &e) != RB_OK)
            return start_fail(s, e.message, NULL);
        s->max_piece = rb_detokenizer_max_bytes(d);
        rb_detokenizer_destroy(d);
        if (!(s->piece = malloc(s->max_piece)))
            return start_fail(s, "out of memory", NULL);
    }
    if (cfg->baseline_recompute)
        sv_log("baseline: an idle conversation keeps no KV; a returning one is computed again");
    if (sv_store_load(&s->store)) {
        sv_sched_free(s);
        return NULL;
    }
    close_idle(s);
    s->active = calloc(cfg->parallel, sizeof *s->active);
    s->step_act = calloc(cfg->parallel, sizeof *s->step_act);
    s->step_sess = calloc(cfg->parallel, sizeof *s->step_sess);
    s->step_tok = calloc(cfg->parallel, sizeof *s->step_tok);
    s->step_have = calloc(cfg->parallel, sizeof *s->step_have);
    if (!s->active || !s->step_act || !s->step_sess || !s->step_tok || !s->step_have)
        return start_fail(s, "out of memory", NULL);
    if (pthread_create(&s->thread, NULL, sched_main, s) != 0)
        return start_fail(s, "cannot start the scheduler thread", NULL);
    s->has_thread = 1;
    return s;
}

uint32_t sv_sched_n_ctx(const sv_sched *s)
{
    return s->n_ctx;
}

void sv_sched_stop(sv_sched *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->is_stopping = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (s->has_thread)
        pthread_join(s->thread, NULL);
    s->has_thread = 0;
}

void sv_sched_free(sv_sched *s)
{
    if (!s)
        return;
    sv_sched_stop(s);
    sv_store_deinit(&s->store);
    rb_session_destroy(s->embed_session);
    rb_pool_destroy(s->pool);
    free(s->active);
    free(s->step_act);
    free(s->step_sess);
    free(s->step_tok);
    free(s->step_have);
    free(s->reply_end);
    free(s->piece);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
