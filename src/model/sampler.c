/*
 * sampler.c - the token sampler: llama.cpp's default chain (penalties,
 * top-k, top-p, min-p, temperature, draw) over one row of logits, with a
 * private xoshiro256** generator whose state can be saved and restored.
 *
 * Does not: allocate per token, keep any history of its own (the caller
 * passes the context's tokens), print, or pick a seed by itself.
 *
 * Memory: one malloc in rb_sampler_create, laid out as
 *
 *   +-------------+---------------------+---------------------+---------+
 *   | rb_sampler  | cand[n_vocab]       | tmp[n_vocab]        | seen    |
 *   | (+ radix    | 8 B each: the row,  | 8 B each: heap of   | n_vocab |
 *   |  histograms)| then the survivors  | top-k, radix buffer | bits    |
 *   +-------------+---------------------+---------------------+---------+
 *
 * about 16 bytes per token (2.4 MB for a 150k vocabulary) plus 25 KB.
 *
 * One call, in data-flow order (the steps are labelled in the code):
 *
 *   1-3 in one pass over the row, into cand in id order:
 *   1. NaN becomes -inf, -0 becomes +0 (so that every path orders equal
 *      logits the same way).
 *   2. Penalties: the window's distinct ids are marked in the `seen`
 *      bitmap first, so each is penalized once; cleared before returning.
 *   3. Drop -inf tokens (probability 0: never drawn, and no cut keeps one
 *      that llama.cpp would drop), note the first max. If the max is +inf,
 *      keep only the +inf tokens, as equals (logit 0). If nothing is left,
 *      fall back to the raw row's argmax.
 *   4. temp <= 0: the argmax, lowest id on ties. Done.
 *   5. top-k: the k best, sorted, by a size-k heap (k <= RB_SELECT_MAX) or
 *      a radix sort of the row.
 *   6. top-p and min-p. Both keep a prefix of the sorted order, so their
 *      composition keeps the shorter prefix. Without top-k the row is not
 *      sorted: min-p first filters it in one pass (logit >= max + log
 *      min_p, typically a few hundred tokens), then top-p sorts only what
 *      it needs: the best RB_TOP_P_CHUNK by heap, and only if their mass
 *      falls short of top_p, a radix sort of the rest. top-p's
 *      normalization is always over the tokens that reached it (the top-k
 *      set, or the whole row), as in llama.cpp.
 *   7. Draw (rb_sampler_sample only): softmax of (logit - max) / temp over
 *      the survivors, one uniform double, a cumulative walk. The weights
 *      overwrite the survivors' logits (sample does not expose them).
 *
 * Cost per token at 150k tokens, measured on a 2-vCPU AMD EPYC VM with
 * gcc 12 -O2, where one expf takes 3.3 ns and qsort of the row 11 ms:
 *   greedy                                   0.17 ms (the one pass)
 *   defaults (top_k 40)                      0.3 ms (the pass plus a 40-heap)
 *   top_k 0, top_p 0.95, peaked row          0.8 ms (Z pass + 256-heap)
 *   top_k 0, top_p 1, min_p 0 (no cut)       0.7 ms (one expf per token)
 *   top_k 0, top_p 0.95, flat row (worst)    2.4 ms: 140k survivors; the
 *       radix sort is 0.6 ms, the rest is three expf passes (z, the
 *       top-p walk, the draw) over the row.
 *
 * Invariants: between calls `seen` is all zero; the xoshiro state is never
 * all zero; equal logits order by ascending id in every path (heap and
 * radix), so results do not depend on which path ran.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "sampler.h"
#include "status.h"

/* Largest k for the heap selection; above it a radix sort of the whole row
 * is cheaper than k-sized heap sifts. */
#define RB_SELECT_MAX 1024
/* First helping of the incremental top-p sort when top-k is off. */
#define RB_TOP_P_CHUNK 256

#define RB_RADIX_BITS 11
#define RB_RADIX_BUCKETS (1u << RB_RADIX_BITS)
#define RB_RADIX_PASSES 3

_Static_assert(sizeof(rb_sampler_state) == 40, "rb_sampler_state is stored as is");
_Static_assert(sizeof(rb_sampler_candidate) == 8, "candidate arrays are 8 B a token");

struct rb_sampler {
    rb_sampler_params params;
    uint32_t n_vocab;
    rb_sampler_state state;
    rb_sampler_candidate *cand;  /* [n_vocab] */
    rb_sampler_candidate *tmp;   /* [n_vocab] */
    uint8_t *seen;               /* [(n_vocab + 7) / 8], zero between calls */
    uint32_t hist[RB_RADIX_PASSES][RB_RADIX_BUCKETS];
    /* The extras, each off (NULL / 0) unless asked for; with all off the
     * chain runs its original pass, bit for bit. */
    rb_grammar *grammar;         /* borrowed (rb_sampler_set_grammar) */
    float *bias;                 /* [n_vocab] logit_bias, or NULL */
    uint32_t *counts;            /* [n_vocab] window counts, zero between calls */
    float *row;                  /* [n_vocab] the adjusted row, for logprobs */
    int is_lp_valid;
    float lp_lse;                /* log-sum-exp of row */
    rb_sampler_logprob lp_chosen;
    rb_sampler_candidate lp_top[RB_SAMPLER_MAX_LOGPROBS];
    size_t n_lp_top;
    char message[RB_ERROR_MESSAGE_MAX];
};

/* ---- PRNG: splitmix64 seeds xoshiro256** (Blackman and Vigna) --------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void rng_seed(rb_sampler_state *st, uint64_t seed)
{
    uint64_t x = seed;
    st->seed = seed;
    for (int i = 0; i < 4; i++)
        st->s[i] = splitmix64(&x);
    /* splitmix64 is a bijection of distinct inputs, so four zeros cannot
     * come out of it. */
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rb_sampler_state *st)
{
    uint64_t *s = st->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(rb_sampler_state *st)
{
    return (double)(rng_next(st) >> 11) * 0x1.0p-53;
}

/* ---- params ------------------------------------------------------------ */

rb_sampler_params rb_sampler_default_params(void)
{
    rb_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temp = 0.8f;
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = RB_SAMPLER_DEFAULT_SEED;
    return p;
}

static rb_status check_params(const rb_sampler_params *p, uint32_t n_vocab, rb_error *err)
{
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: n_vocab = %u is outside [1, %d]", n_vocab, INT32_MAX);
    if (!isfinite(p->temp))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: temp = %g is not a finite number", (double)p->temp);
    if (p->top_k < 0)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: top_k = %d is negative (0 turns top-k off)",
                            (int)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: top_p = %g is outside (0, 1] (1 turns top-p off)",
                            (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: min_p = %g is outside [0, 1] (0 turns min-p off)",
                            (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty)))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: repeat_penalty = %g is not a finite number > 0 "
                            "(1 turns the penalty off)", (double)p->repeat_penalty);
    if (!isfinite(p->presence_penalty) || !isfinite(p->frequency_penalty))
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: presence_penalty = %g or frequency_penalty = %g is not "
                            "a finite number (0 turns it off)", (double)p->presence_penalty,
                            (double)p->frequency_penalty);
    if (p->is_logprobs != 0 && p->is_logprobs != 1)
        return rb_error_set(err, RB_E_INVALID_ARG, "sampler: is_logprobs = %d is not 0 or 1",
                            (int)p->is_logprobs);
    if (p->n_top_logprobs < 0 || p->n_top_logprobs > RB_SAMPLER_MAX_LOGPROBS)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: n_top_logprobs = %d is outside [0, %d]",
                            (int)p->n_top_logprobs, RB_SAMPLER_MAX_LOGPROBS);
    if (p->repeat_last_n < -1)
        return rb_error_set(err, RB_E_INVALID_ARG,
                            "sampler: repeat_last_n = %d is below -1 (-1: whole history)",
                            (int)p->repeat_last_n);
    return RB_OK;
}

/* ---- lifetime ---------------------------------------------------------- */

uint64_t rb_sampler_size_bytes(uint32_t n_vocab)
{
    if (n_vocab == 0 || n_vocab > INT32_MAX)
        return 0;
    return (uint64_t)sizeof(rb_sampler) + 2 * (uint64_t)n_vocab * sizeof(rb_sampler_candidate) +
           ((uint64_t)n_vocab + 7) / 8;
}

rb_status rb_sampler_create(const rb_sampler_params *params, uint32_t n_vocab,
                            rb_sampler **out, rb_error *err)
{
    rb_sampler_params p = params ? *params : rb_sampler_default_params();
    rb_status st = check_params(&p, n_vocab, err);
    if (st != RB_OK)
        return st;
    uint64_t bytes = rb_sampler_size_bytes(n_vocab);
    if (bytes > SIZE_MAX)
        return rb_error_set(err, RB_E_NOMEM, "sampler: %llu bytes exceed the address space",
                            (unsigned long long)bytes);
    rb_sampler *s = malloc((size_t)bytes);
    if (!s)
        return rb_error_set(err, RB_E_NOMEM, "sampler: cannot allocate %llu bytes for %u tokens",
                            (unsigned long long)bytes, n_vocab);
    memset(s, 0, sizeof *s);
    s->params = p;
    s->n_vocab = n_vocab;
    s->cand = (rb_sampler_candidate *)(void *)(s + 1);
    s->tmp = s->cand + n_vocab;
    s->seen = (uint8_t *)(void *)(s->tmp + n_vocab);
    memset(s->seen, 0, ((size_t)n_vocab + 7) / 8);
    rng_seed(&s->state, p.seed);
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
        s->counts = calloc(n_vocab, sizeof *s->counts);
    if (p.is_logprobs)
        s->row = malloc(sizeof *s->row * n_vocab);
    if (((p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) && !s->counts) ||
        (p.is_logprobs && !s->row)) {
        free(s->counts);
        free(s->row);
        free(s);
        return rb_error_set(err, RB_E_NOMEM, "sampler: cannot allocate the penalty counts or "
                                             "the logprobs row for %u tokens", n_vocab);
    }
    *out = s;
    return RB_OK;
}

void rb_sampler_destroy(rb_sampler *s)
{
    if (!s)
        return;
    free(s->bias);
    free(s->counts);
    free(s->row);
    free(s);
}

rb_status rb_sampler_set_grammar(rb_sampler *s, rb_grammar *g)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if (g && rb_grammar_n_vocab(g) != s->n_vocab) {
        snprintf(s->message, sizeof s->message,
                 "sampler: the grammar's vocabulary has %u tokens, the sampler's %u",
                 rb_grammar_n_vocab(g), s->n_vocab);
        return RB_E_INVALID_ARG;
    }
    s->grammar = g;
    return RB_OK;
}

rb_status rb_sampler_set_logit_bias(rb_sampler *s, const int32_t *ids, const float *bias,
                                    size_t n)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if (n && (!ids || !bias)) {
        snprintf(s->message, sizeof s->message, "sampler: logit_bias ids or values are NULL");
        return RB_E_INVALID_ARG;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || (uint32_t)ids[i] >= s->n_vocab) {
            snprintf(s->message, sizeof s->message,
                     "sampler: logit_bias token %d is outside the vocabulary of %u",
                     (int)ids[i], s->n_vocab);
            return RB_E_INVALID_ARG;
        }
        if (!isfinite(bias[i])) {
            snprintf(s->message, sizeof s->message,
                     "sampler: logit_bias of token %d is %g, not a finite number", (int)ids[i],
                     (double)bias[i]);
            return RB_E_INVALID_ARG;
        }
    }
    if (n == 0) {
        free(s->bias);
        s->bias = NULL;
        return RB_OK;
    }
    if (!s->bias) {
        s->bias = malloc(sizeof *s->bias * s->n_vocab);
        if (!s->bias) {
            snprintf(s->message, sizeof s->message,
                     "sampler: cannot allocate logit_bias for %u tokens", s->n_vocab);
            return RB_E_NOMEM;
        }
    }
    memset(s->bias, 0, sizeof *s->bias * s->n_vocab);
    for (size_t i = 0; i < n; i++)
        s->bias[ids[i]] += bias[i];
    return RB_OK;
}

rb_status rb_sampler_get_logprobs(rb_sampler *s, rb_sampler_logprob *chosen,
                                  rb_sampler_logprob *top, size_t n_top_max, size_t *n_top)
{
    if (!s)
        return RB_E_INVALID_ARG;
    if (!s->params.is_logprobs || !s->is_lp_valid) {
        snprintf(s->message, sizeof s->message, "sampler: %s",
                 s->params.is_logprobs ? "no token was sampled yet"
                                       : "logprobs are off (rb_sampler_params.is_logprobs)");
        return RB_E_INVALID_ARG;
    }
    if ((!top && n_top_max) || !n_top) {
        snprintf(s->message, sizeof s->message, "sampler: top or n_top is NULL");
        return RB_E_INVALID_ARG;
    }
    if (chosen)
        *chosen = s->lp_chosen;
    size_t n = s->n_lp_top < n_top_max ? s->n_lp_top : n_top_max;
    for (size_t i = 0; i < n; i++)
        top[i] = (rb_sampler_logprob){s->lp_top[i].id, s->lp_top[i].logit - s->lp_lse};
    *n_top = n;
    return RB_OK;
}

rb_sampler_params rb_sampler_get_params(const rb_sampler *s) { return s->params; }

const char *rb_sampler_errmsg(const rb_sampler *s) { return s->message; }

void rb_sampler_get_state(const rb_sampler *s, rb_sampler_state *out) { *out = s->state; }

rb_status rb_sampler_set_state(rb_sampler *s, const rb_sampler_state *state)
{
    if (!state) {
        snprintf(s->message, sizeof s->message, "sampler: state is NULL");
        return RB_E_INVALID_ARG;
    }
    if ((state->s[0] | state->s[1] | state->s[2] | state->s[3]) == 0) {
        snprintf(s->message, sizeof s->message,
                 "sampler: state (seed %llu) has an all-zero xoshiro state",
                 (unsigned long long)state->seed);
        return RB_E_INVALID_ARG;
    }
    s->state = *state;
    return RB_OK;
}

/* ---- ordering: higher logit first, then lower id ----------------------- */

static int worse(rb_sampler_candidate a, rb_sampler_candidate b)
{
    return a.logit < b.logit || (a.logit == b.logit && a.id > b.id);
}

/* Min-heap on goodness: the root is the worst kept candidate. */
static void sift_down(rb_sampler_candidate *h, size_t n, size_t i)
{
    rb_sampler_candidate x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && worse(h[c + 1], h[c]))
            c++;
        if (!worse(h[c], x))
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

/*
 * dst[0..m) = the m best of src[0..n), best first; 1 <= m <= n. A size-m
 * heap of the best so far: after the first few thousand tokens of a real
 * row almost every token loses to the root in one comparison, so the cost
 * is near one pass over the row, O(n log m) at worst.
 */
static void select_top(const rb_sampler_candidate *src, size_t n, size_t m,
                       rb_sampler_candidate *dst)
{
    memcpy(dst, src, m * sizeof *dst);
    for (size_t i = m / 2; i-- > 0;)
        sift_down(dst, m, i);
    float root = dst[0].logit; /* most tokens fail this one compare */
    for (size_t i = m; i < n; i++) {
        if (src[i].logit < root)
            continue;
        if (worse(dst[0], src[i])) {
            dst[0] = src[i];
            sift_down(dst, m, 0);
            root = dst[0].logit;
        }
    }
    /* Heap sort: each step moves the worst left to the end. */
    for (size_t end = m; end-- > 1;) {
        rb_sampler_candidate t = dst[0];
        dst[0] = dst[end];
        dst[end] = t;
        sift_down(dst, end, 0);
    }
}

/* A key whose ascending unsigned order is descending logit order. */
static uint32_t radix_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u & UINT32_C(0x80000000)) ? ~u : (u | UINT32_C(0x80000000));
    return ~u;
}

/*
 * Sorts a[0..n) best first (LSD radix, 3 passes of 11 bits, stable, so
 * equal logits keep the ascending ids they arrive in). Uses b as the other
 * buffer; returns whichever of a, b holds the result. A pass whose digit
 * is the same for every key is skipped. About 0.5 ms for 150k tokens
 * where qsort takes over 10 ms.
 */
static rb_sampler_candidate *radix_sort(rb_sampler *s, rb_sampler_candidate *a, size_t n,
                                        rb_sampler_candidate *b)
{
    memset(s->hist, 0, sizeof s->hist);
    for (size_t i = 0; i < n; i++) {
        uint32_t k = radix_key(a[i].logit);
        for (int p = 0; p < RB_RADIX_PASSES; p++)
            s->hist[p][(k >> (p * RB_RADIX_BITS)) & (RB_RADIX_BUCKETS - 1)]++;
    }
    for (int p = 0; p < RB_RADIX_PASSES; p++) {
        uint32_t *h = s->hist[p];
        int shift = p * RB_RADIX_BITS;
        if (h[(radix_key(a[0].logit) >> shift) & (RB_RADIX_BUCKETS - 1)] == n)
            continue;
        uint32_t sum = 0;
        for (uint32_t d = 0; d < RB_RADIX_BUCKETS; d++) {
            uint32_t c = h[d];
            h[d] = sum;
            sum += c;
        }
        for (size_t i = 0; i < n; i++) {
            uint32_t d = (radix_key(a[i].logit) >> shift) & (RB_RADIX_BUCKETS - 1);
            b[h[d]++] = a[i];
        }
        rb_sampler_candidate *t = a;
        a = b;
        b = t;
    }
    return a;
}

/* Unnormalized probability at temperature 1; top-p's sum and walk both use
 * exactly this, so the walk reaches the sum. */
static double weight(float logit, float max) { return (double)expf(logit - max); }

/* Length of top-p's prefix of c (sorted), or 0 when c's whole mass stays
 * below top_p of z. llama.cpp: keep up to and including the first token at
 * which the cumulative probability is >= p. */
static size_t top_p_cut(const rb_sampler_candidate *c, size_t n, float max, double z, float p)
{
    double cum = 0.0;
    for (size_t i = 0; i < n; i++) {
        cum += weight(c[i].logit, max);
        if (cum / z >= (double)p)
            return i + 1;
    }
    return 0;
}

/* ---- the chain --------------------------------------------------------- */

/*
 * 1-3 with the extras: the grammar's mask (a token it forbids is dropped as
 * a -inf would be), logit_bias, repeat_penalty, then OpenAI's frequency and
 * presence penalties; the adjusted row kept for logprobs. A separate loop
 * so that the plain pass stays as it was.
 */
static size_t pass_extras(rb_sampler *s, const float *logits, const uint8_t *mask,
                          const int32_t *win, size_t n_win, size_t *arg_out, float *max_out)
{
    const rb_sampler_params *p = &s->params;
    rb_sampler_candidate *cand = s->cand;
    size_t n_vocab = s->n_vocab, n = 0, arg = 0;
    float max = -INFINITY;
    int is_rep = n_win && p->repeat_penalty != 1.0f;
    int is_cnt = n_win && s->counts;
    float *row = s->row;
    if (is_cnt)
        for (size_t i = 0; i < n_win; i++)
            if (win[i] >= 0 && (uint32_t)win[i] < s->n_vocab)
                s->counts[win[i]]++;
    for (size_t i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (isnan(l) || (mask && !(mask[i >> 3] >> (i & 7) & 1))) {
            if (row)
                row[i] = -INFINITY;
            continue;
        }
        if (s->bias)
            l += s->bias[i];
        if (is_rep && (s->seen[i >> 3] & (1u << (i & 7))))
            l = l <= 0.0f ? l * p->repeat_penalty : l / p->repeat_penalty;
        if (is_cnt && s->counts[i])
            l -= (float)s->counts[i] * p->frequency_penalty + p->presence_penalty;
        if (isnan(l))
            l = -INFINITY;
        if (row)
            row[i] = l + 0.0f;
        if (l > -INFINITY) {
            cand[n].id = (int32_t)i;
            cand[n].logit = l + 0.0f;
            if (l > max) {
                max = l;
                arg = n;
            }
            n++;
        }
    }
    if (is_cnt)
        for (size_t i = 0; i < n_win; i++)
            if (win[i] >= 0 && (uint32_t)win[i] < s->n_vocab)
                s->counts[win[i]] = 0;
    *arg_out = arg;
    *max_out = max;
    return n;
}

/* logprobs: the log-sum-exp of the candidates (the finite row) and its
 * best n_top_logprobs, before the chain cuts anything. */
static void note_logprobs(rb_sampler *s, size_t n, float max)
{
    s->is_lp_valid = 0;
    if (!s->params.is_logprobs || n == 0)
        return;
    double z = 0.0;
    if (isfinite(max))
        for (size_t i = 0; i < n; i++)
            z += exp((double)s->cand[i].logit - (double)max);
    s->lp_lse = isfinite(max) ? (float)((double)max + log(z)) : max;
    size_t k = (size_t)s->params.n_top_logprobs < n ? (size_t)s->params.n_top_logprobs : n;
    if (k)
        select_top(s->cand, n, k, s->lp_top);
    s->n_lp_top = k;
    s->is_lp_valid = 1;
}

static size_t run_chain(rb_sampler *s, const float *logits, const int32_t *history,
                        size_t n_history, const uint8_t *mask, rb_sampler_candidate **out,
                        float *out_max)
{
    const rb_sampler_params *p = &s->params;
    rb_sampler_candidate *cand = s->cand;
    size_t n_vocab = s->n_vocab;

    /* 2 (set up). Mark the penalty window's distinct ids in `seen`. */
    const int32_t *win = history;
    size_t n_win = 0;
    int is_extras = mask || s->bias || s->counts || s->row;
    if ((p->repeat_penalty != 1.0f || s->counts) && p->repeat_last_n != 0 && n_history > 0) {
        n_win = p->repeat_last_n < 0 || (size_t)p->repeat_last_n > n_history
                    ? n_history : (size_t)p->repeat_last_n;
        win = history + (n_history - n_win);
        if (p->repeat_penalty != 1.0f)
            for (size_t i = 0; i < n_win; i++)
                if (win[i] >= 0 && (uint32_t)win[i] < s->n_vocab)
                    s->seen[win[i] >> 3] |= (uint8_t)(1u << (win[i] & 7));
    }

    /* 1, 2, 3 in one pass over the row: sanitize, penalize (llama.cpp's
     * repeat_penalty, once per distinct token), drop -inf, find the first
     * max. One pass instead of three: the row is 600 KB at 150k tokens. */
    size_t n = 0, arg = 0;
    float max = -INFINITY;
    if (is_extras)
        n = pass_extras(s, logits, mask, win, n_win, &arg, &max);
    for (size_t i = 0; !is_extras && i < n_vocab; i++) {
        float l = logits[i];
        if (isnan(l))
            continue;
        if (n_win && (s->seen[i >> 3] & (1u << (i & 7))))
            l = l <= 0.0f ? l * p->repeat_penalty : l / p->repeat_penalty;
        if (l > -INFINITY) {
            cand[n].id = (int32_t)i;
            cand[n].logit = l + 0.0f;
            if (l > max) {
                max = l;
                arg = n;
            }
            n++;
        }
    }
    for (size_t i = 0; i < n_win; i++)
        if (win[i] >= 0 && (uint32_t)win[i] < s->n_vocab)
            s->seen[win[i] >> 3] = 0;
    note_logprobs(s, n, max);

    if (n == 0) {
        /* Nothing finite: the raw row's argmax, lowest id, NaN skipped. */
        int32_t best = 0;
        float best_l = NAN;
        for (size_t i = 0; i < n_vocab; i++) {
            if (!isnan(logits[i]) && (isnan(best_l) || logits[i] > best_l)) {
                best_l = logits[i];
                best = (int32_t)i;
            }
        }
        cand[0].id = best;
        cand[0].logit = -INFINITY;
        *out = cand;
        *out_max = -INFINITY;
        return 1;
    }
    if (max == INFINITY) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (cand[i].logit == INFINITY)
                cand[m++] = (rb_sampler_candidate){cand[i].id, 0.0f};
        n = m;
        max = 0.0f;
        arg = 0;
    }
    *out_max = max;

    /* 4. Greedy. cand is in id order, so the first max is the lowest id. */
    if (p->temp <= 0.0f) {
        cand[0] = cand[arg];
        *out = cand;
        return 1;
    }

    /* 5. top-k. */
    rb_sampler_candidate *c = cand;
    int is_sorted = 0;
    if (p->top_k > 0 && (size_t)p->top_k < n) {
        size_t k = (size_t)p->top_k;
        if (k <= RB_SELECT_MAX) {
            select_top(cand, n, k, s->tmp);
            c = s->tmp;
        } else {
            c = radix_sort(s, cand, n, s->tmp);
        }
        n = k;
        is_sorted = 1;
    }

    /* 6. top-p and min-p: the shorter of their two prefixes. */
    int need_p = p->top_p < 1.0f, need_m = p->min_p > 0.0f;
    float min_logit = need_m ? max + logf(p->min_p) : -INFINITY;
    if (is_sorted) {
        if (need_p) {
            double z = 0.0;
            for (size_t i = 0; i < n; i++)
                z += weight(c[i].logit, max);
            size_t cut = top_p_cut(c, n, max, z, p->top_p);
            if (cut)
                n = cut;
        }
        for (size_t i = 1; need_m && i < n; i++) {
            if (c[i].logit < min_logit) {
                n = i;
                break;
            }
        }
    } else if (need_p || need_m) {
        double z = 0.0;
        if (need_p)
            for (size_t i = 0; i < n; i++)
                z += weight(c[i].logit, max);
        if (need_m) {
            size_t m = 0;
            for (size_t i = 0; i < n; i++)
                if (c[i].logit >= min_logit)
                    c[m++] = c[i];
            n = m;
        }
        if (need_p) {
            /* Every weight is <= 1 (the max's), so top-p keeps at least
             * top_p * z tokens: try the first chunk only when that fits. */
            if (n > RB_SELECT_MAX && (double)p->top_p * z <= RB_TOP_P_CHUNK) {
                /* Most of the mass usually sits in the first few hundred. */
                select_top(c, n, RB_TOP_P_CHUNK, s->tmp);
                size_t cut = top_p_cut(s->tmp, RB_TOP_P_CHUNK, max, z, p->top_p);
                if (cut) {
                    *out = s->tmp;
                    return cut;
                }
                c = radix_sort(s, c, n, s->tmp);
            } else if (n > RB_SELECT_MAX) {
                c = radix_sort(s, c, n, s->tmp);
            } else {
                select_top(c, n, n, s->tmp);
                c = s->tmp;
            }
            size_t cut = top_p_cut(c, n, max, z, p->top_p);
            if (cut)
                n = cut;
        }
    }
    *out = c;
    return n;
}

/* The grammar's mask, or NULL without a grammar; an error when the grammar
 * allows no token at all. */
static rb_status grammar_mask(rb_sampler *s, const uint8_t **mask)
{
    *mask = NULL;
    if (!s->grammar)
        return RB_OK;
    size_t n_allowed = 0;
    rb_status st = rb_grammar_mask(s->grammar, mask, &n_allowed);
    if (st != RB_OK) {
        snprintf(s->message, sizeof s->message, "sampler: %s", rb_grammar_errmsg(s->grammar));
        return st;
    }
    if (n_allowed == 0) {
        snprintf(s->message, sizeof s->message,
                 "sampler: the grammar allows no token of the vocabulary here (%s)",
                 rb_grammar_is_complete(s->grammar)
                     ? "it is complete and the model has no end-of-generation token"
                     : "the vocabulary lacks the bytes it needs");
        return RB_E_INVALID_ARG;
    }
    return RB_OK;
}

static int check_args(rb_sampler *s, const float *logits, const int32_t *history,
                      size_t n_history)
{
    if (!s)
        return 0;
    if (!logits) {
        snprintf(s->message, sizeof s->message, "sampler: logits is NULL");
        return 0;
    }
    if (!history && n_history > 0) {
        snprintf(s->message, sizeof s->message,
                 "sampler: history is NULL with n_history = %zu", n_history);
        return 0;
    }
    return 1;
}

rb_status rb_sampler_get_candidates(rb_sampler *s, const float *logits, const int32_t *history,
                                    size_t n_history, const rb_sampler_candidate **out,
                                    size_t *n_out)
{
    if (!check_args(s, logits, history, n_history))
        return RB_E_INVALID_ARG;
    if (!out || !n_out) {
        snprintf(s->message, sizeof s->message, "sampler: out and n_out are required");
        return RB_E_INVALID_ARG;
    }
    const uint8_t *mask = NULL;
    rb_status st = grammar_mask(s, &mask);
    if (st != RB_OK)
        return st;
    rb_sampler_candidate *c;
    float max;
    size_t n = run_chain(s, logits, history, n_history, mask, &c, &max);
    *out = c;
    *n_out = n;
    return RB_OK;
}

/* The chain, then 7. the draw. */
static int32_t sample(rb_sampler *s, const float *logits, const int32_t *history, size_t n_history,
                      const uint8_t *mask)
{
    rb_sampler_candidate *c;
    float max;
    size_t n = run_chain(s, logits, history, n_history, mask, &c, &max);
    if (s->params.temp <= 0.0f)
        return c[0].id;

    /* 7. Draw: one number per call, even when one candidate is left. The
     * weights replace the logits in place, so expf runs once per survivor. */
    double u = rng_uniform(&s->state);
    if (n == 1)
        return c[0].id;
    float temp = s->params.temp;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) {
        c[i].logit = expf((c[i].logit - max) / temp);
        total += (double)c[i].logit;
    }
    double target = u * total, cum = 0.0;
    size_t last = 0;
    for (size_t i = 0; i < n; i++) {
        if (c[i].logit > 0.0f) {
            cum += (double)c[i].logit;
            last = i;
            if (target < cum)
                return c[i].id;
        }
    }
    return c[last].id; /* rounding left target at the very top */
}

rb_status rb_sampler_sample(rb_sampler *s, const float *logits, const int32_t *history,
                            size_t n_history, int32_t *token)
{
    if (!check_args(s, logits, history, n_history))
        return RB_E_INVALID_ARG;
    if (!token) {
        snprintf(s->message, sizeof s->message, "sampler: token is NULL");
        return RB_E_INVALID_ARG;
    }
    const uint8_t *mask = NULL;
    rb_status st = grammar_mask(s, &mask);
    if (st != RB_OK)
        return st;
    int32_t t = sample(s, logits, history, n_history, mask);
    if (s->is_lp_valid)
        s->lp_chosen = (rb_sampler_logprob){t, s->row[t] - s->lp_lse};
    if (s->grammar) {
        st = rb_grammar_accept(s->grammar, t);
        if (st != RB_OK) {
            snprintf(s->message, sizeof s->message, "sampler: %s", rb_grammar_errmsg(s->grammar));
            return st;
        }
    }
    *token = t;
    return RB_OK;
}
