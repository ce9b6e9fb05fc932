/*
 * grammar.c - GBNF grammars compiled to a byte-level pushdown automaton,
 * and the set of tokens the automaton allows next.
 *
 * Does not: decide which token is drawn (the sampler does, with the mask
 * from here), hold partial UTF-8 characters (character classes become
 * byte-sequence rules when compiled), or allocate per token once its
 * scratch arrays have grown to the grammar's working size.
 *
 * Compiled form. Every rule is a list of alternatives; every alternative is
 * a run of elements in one flat array, closed by END:
 *
 *   elems: | CHARS s | REF r | END | CHARS s | END | REF r | CHARS s | END |
 *            ^ alt 0 of rule 0     ^ alt 1        ^ alt 0 of rule 1
 *
 * CHARS is a set of bytes (a 256-bit map in `sets`; sets 0..255 are the
 * single bytes), REF enters another rule. Groups, repetitions and
 * multi-byte character classes are generated rules (`x*` is
 * `x_star ::= x x_star | ""`, `x{0,3}` nests three optional rules).
 * Compilation rejects left recursion (a rule that can reach itself before
 * consuming a byte), so expanding a state always ends.
 *
 * State. A stack is a chain of nodes {pos, parent}: pos is the next element
 * to match, the parents are where to return after the rule ends. A state is
 * a set of stacks whose tops are all CHARS elements, plus `complete` when
 * some path has matched the whole root rule. A REF followed by END pushes no
 * return node (a tail call), so `x*` loops in constant depth and the states
 * inside a JSON string repeat token after token. Stacks are deduplicated by
 * content.
 *
 * The mask. The vocabulary's byte strings are a trie (children contiguous,
 * tokens ending at a node a contiguous run of the sorted order). A depth-
 * first walk advances the state by each child's byte and descends only
 * while some stack survives; a token is allowed when the state after its
 * last byte is alive. Work is the trie nodes the grammar can reach, not
 * n_vocab x grammar size, and the result is cached by the state's content
 * (a JSON string's body, a number's digits: the same state again).
 *
 * Memory: the compiled grammar, the pieces, the trie and the cache are
 * allocated by rb_grammar_create*; the node arena, state sets and work
 * stacks grow on demand (kept between calls) and are capped (RB_G_MAX_*),
 * past which a state counts as dead and rb_grammar_accept says why. The
 * accepted state's nodes are at the bottom of the arena [1, base); a walk
 * or a trial advance allocates above and drops back to base.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "model.h"
#include "status.h"
#include "tokenizer.h"

#define EK_END 0
#define EK_CHARS 1
#define EK_REF 2

#define RB_G_MAX_ELEMS (1u << 21)
#define RB_G_MAX_RULES (1u << 20)
#define RB_G_MAX_NEST 200
#define RB_G_MAX_REPEAT 10000
#define RB_G_MAX_STACKS 256         /* stacks in one state: their dedup is quadratic; 4096 let a fuzzed grammar of nested repeats take minutes per token */
#define RB_G_MAX_NODES (1u << 24)
#define RB_G_MAX_EXPAND 200000      /* work items in one expansion */
#define RB_G_CACHE_BYTES (8u << 20) /* masks kept */

typedef struct gelem {
    uint32_t kind;
    uint32_t arg;
} gelem;

typedef struct gnode {
    uint32_t pos, parent;
} gnode;

typedef struct tnode {
    uint32_t child0, n_child;
    uint32_t tok0, n_tok; /* into trie_tok */
    uint8_t byte;
} tnode;

typedef struct centry {
    uint64_t hash;
    uint32_t *key;
    uint32_t key_len;
    uint8_t *mask;
    size_t n_allowed;
} centry;

struct rb_grammar {
    /* compiled, immutable */
    gelem *elems;
    uint32_t n_elems;
    uint32_t *alt_start;  /* [n_alts] */
    uint32_t *rule_alt0;  /* [n_rules] */
    uint32_t *rule_nalt;  /* [n_rules] */
    uint64_t (*sets)[4];
    uint32_t n_sets, n_rules, root;

    /* vocabulary */
    uint32_t n_vocab;
    char *piece_bytes;
    size_t *piece_off;    /* [n_vocab + 1] */
    uint8_t *is_eog;      /* [n_vocab] */
    tnode *trie;
    uint32_t *trie_tok;
    uint32_t n_trie;

    /* runtime */
    gnode *nodes;
    uint32_t n_nodes, cap_nodes, base;
    uint32_t *cur;        /* the accepted state's stacks */
    uint32_t n_cur, cap_cur;
    int cur_complete;
    uint32_t *ss;         /* sets being built: ranges of node ids */
    uint32_t n_ss, cap_ss;
    uint32_t *work;       /* expansion work pairs */
    uint32_t cap_work;
    uint32_t *key;        /* serialization scratch */
    uint32_t n_key, cap_key;
    int is_overflow, is_oom;

    uint8_t *mask;        /* [(n_vocab + 7) / 8] */
    size_t mask_bytes;
    centry *cache;
    uint32_t cache_cap, cache_n;
    rb_grammar_stats stats;
    char message[RB_ERROR_MESSAGE_MAX];
};

/* ---- growable arrays ---------------------------------------------------- */

static int grow(void **p, uint32_t *cap, uint32_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    uint64_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    if (c > UINT32_MAX)
        return 0;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q)
        return 0;
    *p = q;
    *cap = (uint32_t)c;
    return 1;
}

/* ======================================================================== */
/* ---- parser ------------------------------------------------------------- */

typedef struct gseq {
    gelem *v;
    uint32_t n, cap;
} gseq;

typedef struct brule {
    char *name;
    gseq *alts;
    uint32_t n_alts, cap_alts;
    int is_defined;
    uint32_t ref_line, ref_col;
    uint32_t def_line;
} brule;

typedef struct gparser {
    const char *s;
    size_t len, pos;
    brule *rules;
    uint32_t n_rules, cap_rules;
    uint64_t (*sets)[4];
    uint32_t n_sets, cap_sets;
    uint64_t n_elems;
    uint32_t any_rule; /* "." compiled once; UINT32_MAX before */
    int depth;
    rb_error *err;
    rb_status st;
} gparser;

static void line_col(const char *s, size_t pos, uint32_t *line, uint32_t *col)
{
    uint32_t l = 1, c = 1;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

__attribute__((format(printf, 2, 3))) static int perr(gparser *p, const char *fmt, ...)
{
    if (p->st != RB_OK)
        return 0;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    uint32_t line, col;
    line_col(p->s, p->pos < p->len ? p->pos : p->len, &line, &col);
    p->st = RB_E_FORMAT;
    rb_error_set(p->err, RB_E_FORMAT, "grammar: line %u, column %u: %s", line, col, what);
    return 0;
}

static int oom(gparser *p)
{
    if (p->st == RB_OK) {
        p->st = RB_E_NOMEM;
        rb_error_set(p->err, RB_E_NOMEM, "grammar: out of memory");
    }
    return 0;
}

static int seq_push(gparser *p, gseq *q, uint32_t kind, uint32_t arg)
{
    if (++p->n_elems > RB_G_MAX_ELEMS)
        return perr(p, "grammar too large (over %u elements after expanding repetitions)",
                    RB_G_MAX_ELEMS);
    if (!grow((void **)&q->v, &q->cap, q->n + 1, sizeof *q->v))
        return oom(p);
    q->v[q->n++] = (gelem){kind, arg};
    return 1;
}

/* A new rule; name copied (a generated one gets "<base>#<n>"). */
static uint32_t rule_new(gparser *p, const char *name, size_t n)
{
    if (p->n_rules >= RB_G_MAX_RULES) {
        perr(p, "grammar has over %u rules", RB_G_MAX_RULES);
        return UINT32_MAX;
    }
    if (!grow((void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof *p->rules)) {
        oom(p);
        return UINT32_MAX;
    }
    brule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->name = malloc(n + 1);
    if (!r->name) {
        oom(p);
        return UINT32_MAX;
    }
    memcpy(r->name, name, n);
    r->name[n] = 0;
    return p->n_rules++;
}

static uint32_t rule_generated(gparser *p, uint32_t parent)
{
    char name[96];
    int n = snprintf(name, sizeof name, "%.60s#%u", parent < p->n_rules ? p->rules[parent].name : "",
                     p->n_rules);
    uint32_t r = rule_new(p, name, (size_t)n);
    if (r != UINT32_MAX)
        p->rules[r].is_defined = 1;
    return r;
}

static uint32_t rule_get(gparser *p, const char *name, size_t n)
{
    for (uint32_t i = 0; i < p->n_rules; i++)
        if (strlen(p->rules[i].name) == n && memcmp(p->rules[i].name, name, n) == 0)
            return i;
    uint32_t r = rule_new(p, name, n);
    if (r != UINT32_MAX) /* name points into the text: its first reference */
        line_col(p->s, (size_t)(name - p->s), &p->rules[r].ref_line, &p->rules[r].ref_col);
    return r;
}

static gseq *alt_new(gparser *p, uint32_t rule)
{
    brule *r = &p->rules[rule];
    if (!grow((void **)&r->alts, &r->cap_alts, r->n_alts + 1, sizeof *r->alts)) {
        oom(p);
        return NULL;
    }
    gseq *q = &r->alts[r->n_alts++];
    memset(q, 0, sizeof *q);
    return q;
}

/* The set's index, interned (sets 0..255 are the single bytes). */
static uint32_t set_intern(gparser *p, const uint64_t m[4])
{
    for (uint32_t i = 256; i < p->n_sets; i++)
        if (memcmp(p->sets[i], m, 32) == 0)
            return i;
    int bits = 0, one = -1;
    for (int b = 0; b < 256; b++)
        if (m[b >> 6] >> (b & 63) & 1) {
            bits++;
            one = b;
        }
    if (bits == 1)
        return (uint32_t)one;
    if (!grow((void **)&p->sets, &p->cap_sets, p->n_sets + 1, sizeof *p->sets)) {
        oom(p);
        return UINT32_MAX;
    }
    memcpy(p->sets[p->n_sets], m, 32);
    return p->n_sets++;
}

static int is_word(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

static void skip_space(gparser *p, int newline_ok)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\r') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n')
                p->pos++;
        } else if (c == '\n' && newline_ok) {
            p->pos++;
        } else {
            break;
        }
    }
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* One character (a code point) of a literal or class, escapes decoded. */
static int parse_char(gparser *p, uint32_t *cp)
{
    if (p->pos >= p->len)
        return perr(p, "unexpected end of grammar");
    unsigned char c = (unsigned char)p->s[p->pos];
    if (c == '\\') {
        p->pos++;
        if (p->pos >= p->len)
            return perr(p, "unexpected end of grammar after '\\'");
        char e = p->s[p->pos++];
        int nd = 0;
        switch (e) {
        case 'n': *cp = '\n'; return 1;
        case 'r': *cp = '\r'; return 1;
        case 't': *cp = '\t'; return 1;
        case '0': *cp = 0; return 1;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': case '/':
        case '.': case '(': case ')': case '|': case '*': case '+': case '?': case '{':
        case '}': case '$':
            *cp = (uint32_t)(unsigned char)e;
            return 1;
        case 'x': nd = 2; break;
        case 'u': nd = 4; break;
        case 'U': nd = 8; break;
        default:
            p->pos--;
            return perr(p, "unknown escape '\\%c'", e);
        }
        uint32_t v = 0;
        for (int i = 0; i < nd; i++) {
            int h = p->pos < p->len ? hexval(p->s[p->pos]) : -1;
            if (h < 0)
                return perr(p, "'\\%c' needs %d hex digits", e, nd);
            v = v << 4 | (uint32_t)h;
            p->pos++;
        }
        if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
            return perr(p, "escape U+%X is not a Unicode scalar value", v);
        *cp = v;
        return 1;
    }
    /* raw UTF-8 */
    uint32_t v;
    size_t k;
    if (c < 0x80) {
        v = c;
        k = 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        v = c & 0x1F;
        k = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        v = c & 0x0F;
        k = 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
        v = c & 0x07;
        k = 4;
    } else {
        return perr(p, "invalid UTF-8 byte 0x%02X", c);
    }
    if (p->len - p->pos < k)
        return perr(p, "truncated UTF-8 character");
    for (size_t i = 1; i < k; i++) {
        unsigned char d = (unsigned char)p->s[p->pos + i];
        if ((d & 0xC0) != 0x80)
            return perr(p, "invalid UTF-8 byte 0x%02X", d);
        v = v << 6 | (d & 0x3F);
    }
    if ((k == 3 && (v < 0x800 || (v >= 0xD800 && v <= 0xDFFF))) ||
        (k == 4 && (v < 0x10000 || v > 0x10FFFF)))
        return perr(p, "invalid UTF-8 character");
    p->pos += k;
    *cp = v;
    return 1;
}

static int utf8_encode(uint32_t cp, uint8_t *o)
{
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Code point ranges to UTF-8 byte-range sequences: each sequence becomes an
 * alternative of `rule` (one-byte ones merged into `ascii`). */
typedef struct cls_out {
    gparser *p;
    uint32_t rule;
    uint64_t ascii[4];
    int n_multi;
} cls_out;

static void set_range(uint64_t m[4], unsigned lo, unsigned hi)
{
    for (unsigned b = lo; b <= hi; b++)
        m[b >> 6] |= (uint64_t)1 << (b & 63);
}

static int utf8_seqs(cls_out *o, uint32_t lo, uint32_t hi)
{
    static const uint32_t lim[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (lo > hi)
        return 1;
    /* split at the surrogates and at the encoded length's boundaries */
    if (lo <= 0xDFFF && hi >= 0xD800) {
        if (lo < 0xD800 && !utf8_seqs(o, lo, 0xD7FF))
            return 0;
        return hi > 0xDFFF ? utf8_seqs(o, 0xE000, hi) : 1;
    }
    for (int i = 0; i < 3; i++)
        if (lo <= lim[i] && hi > lim[i])
            return utf8_seqs(o, lo, lim[i]) && utf8_seqs(o, lim[i] + 1, hi);
    if (hi < 0x80) {
        set_range(o->ascii, lo, hi);
        return 1;
    }
    for (int i = 1; i < 4; i++) {
        uint32_t m = ((uint32_t)1 << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0)
                return utf8_seqs(o, lo, lo | m) && utf8_seqs(o, (lo | m) + 1, hi);
            if ((hi & m) != m)
                return utf8_seqs(o, lo, (hi & ~m) - 1) && utf8_seqs(o, hi & ~m, hi);
        }
    }
    uint8_t a[4], b[4];
    int n = utf8_encode(lo, a);
    utf8_encode(hi, b);
    gseq *q = alt_new(o->p, o->rule);
    if (!q)
        return 0;
    for (int i = 0; i < n; i++) {
        uint64_t m[4] = {0};
        set_range(m, a[i], b[i]);
        uint32_t s = set_intern(o->p, m);
        if (s == UINT32_MAX || !seq_push(o->p, q, EK_CHARS, s))
            return 0;
    }
    o->n_multi++;
    return 1;
}

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

static int cmp_range(const void *a, const void *b)
{
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Pushes one element matching one character of the ranges (negated: of
 * everything else): a CHARS when all are ASCII, else a REF to a generated
 * rule of byte sequences. */
static int push_class(gparser *p, gseq *q, uint32_t cur_rule, cprange *r, uint32_t n,
                      int negate)
{
    if (n)
        qsort(r, n, sizeof *r, cmp_range);
    cls_out o = {.p = p};
    o.rule = rule_generated(p, cur_rule);
    if (o.rule == UINT32_MAX)
        return 0;
    uint32_t next = 0; /* first code point not yet covered (negation) */
    for (uint32_t i = 0; i < n; i++) {
        if (negate) {
            if (r[i].lo > next && !utf8_seqs(&o, next, r[i].lo - 1))
                return 0;
            if (r[i].hi + 1 > next)
                next = r[i].hi + 1;
        } else if (!utf8_seqs(&o, r[i].lo, r[i].hi)) {
            return 0;
        }
    }
    if (negate && next <= 0x10FFFF && !utf8_seqs(&o, next, 0x10FFFF))
        return 0;
    int has_ascii = (o.ascii[0] | o.ascii[1]) != 0;
    if (!has_ascii && !o.n_multi)
        return perr(p, "character class matches nothing");
    if (has_ascii) {
        uint32_t s = set_intern(p, o.ascii);
        if (s == UINT32_MAX)
            return 0;
        if (!o.n_multi) {
            p->rules[o.rule].is_defined = 1; /* left empty and unused */
            gseq *a = alt_new(p, o.rule);  /* give it a body so it stays well-formed */
            return a && seq_push(p, a, EK_CHARS, s) && seq_push(p, q, EK_CHARS, s);
        }
        gseq *a = alt_new(p, o.rule);
        if (!a || !seq_push(p, a, EK_CHARS, s))
            return 0;
    }
    return seq_push(p, q, EK_REF, o.rule);
}

static int parse_class(gparser *p, gseq *q, uint32_t cur_rule)
{
    p->pos++; /* [ */
    int negate = 0;
    if (p->pos < p->len && p->s[p->pos] == '^') {
        negate = 1;
        p->pos++;
    }
    cprange *r = NULL;
    uint32_t n = 0, cap = 0;
    int ok = 1;
    for (;;) {
        if (p->pos >= p->len) {
            ok = perr(p, "unterminated character class");
            break;
        }
        if (p->s[p->pos] == ']') {
            p->pos++;
            break;
        }
        uint32_t lo, hi;
        if (!parse_char(p, &lo)) {
            ok = 0;
            break;
        }
        hi = lo;
        if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            p->pos++;
            if (!parse_char(p, &hi)) {
                ok = 0;
                break;
            }
            if (hi < lo) {
                ok = perr(p, "range U+%X-U+%X is reversed", lo, hi);
                break;
            }
        }
        if (!grow((void **)&r, &cap, n + 1, sizeof *r)) {
            ok = oom(p);
            break;
        }
        r[n++] = (cprange){lo, hi};
    }
    if (ok)
        ok = push_class(p, q, cur_rule, r, n, negate);
    free(r);
    return ok;
}

static int parse_alternates(gparser *p, uint32_t rule, int nested);

/* Replaces q->v[start..n) by the item repeated {min, max} (max < 0: no bound). */
static int repeat(gparser *p, gseq *q, uint32_t cur_rule, uint32_t start, long min, long max)
{
    gelem item;
    uint32_t n_item = q->n - start;
    if (n_item == 1) {
        item = q->v[start];
    } else {
        uint32_t r = rule_generated(p, cur_rule);
        if (r == UINT32_MAX)
            return 0;
        gseq *a = alt_new(p, r);
        if (!a)
            return 0;
        /* q stays valid: only other rules' alternative arrays grew */
        for (uint32_t i = start; i < q->n; i++)
            if (!seq_push(p, a, q->v[i].kind, q->v[i].arg))
                return 0;
        item = (gelem){EK_REF, r};
    }
    q->n = start;
    for (long i = 0; i < min; i++)
        if (!seq_push(p, q, item.kind, item.arg))
            return 0;
    if (max < 0) {
        uint32_t r = rule_generated(p, cur_rule);
        if (r == UINT32_MAX)
            return 0;
        gseq *a = alt_new(p, r);
        if (!a || !seq_push(p, a, item.kind, item.arg) || !seq_push(p, a, EK_REF, r) ||
            !alt_new(p, r))
            return 0;
        return seq_push(p, q, EK_REF, r);
    }
    uint32_t prev = UINT32_MAX;
    for (long i = min; i < max; i++) {
        uint32_t r = rule_generated(p, cur_rule);
        if (r == UINT32_MAX)
            return 0;
        gseq *a = alt_new(p, r);
        if (!a || !seq_push(p, a, item.kind, item.arg) ||
            (prev != UINT32_MAX && !seq_push(p, a, EK_REF, prev)) || !alt_new(p, r))
            return 0;
        prev = r;
    }
    return prev == UINT32_MAX || seq_push(p, q, EK_REF, prev);
}

static int parse_int(gparser *p, long *out)
{
    size_t start = p->pos;
    long v = 0;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        v = v * 10 + (p->s[p->pos] - '0');
        if (v > RB_G_MAX_REPEAT)
            return perr(p, "repetition count over %d", RB_G_MAX_REPEAT);
        p->pos++;
    }
    if (p->pos == start)
        return perr(p, "expected a number");
    *out = v;
    return 1;
}

/* One alternative's items into the alternative `alt_i` of `rule`. */
static int parse_sequence(gparser *p, uint32_t rule, uint32_t alt_i, int nested)
{
#define Q (&p->rules[rule].alts[alt_i]) /* re-read: rules and alts may move */
    long last = -1;
    for (;;) {
        skip_space(p, nested);
        if (p->pos >= p->len)
            return 1;
        char c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            last = Q->n;
            for (;;) {
                if (p->pos >= p->len)
                    return perr(p, "unterminated string literal");
                if (p->s[p->pos] == '"') {
                    p->pos++;
                    break;
                }
                uint32_t cp;
                uint8_t b[4];
                if (!parse_char(p, &cp))
                    return 0;
                int k = utf8_encode(cp, b);
                for (int i = 0; i < k; i++)
                    if (!seq_push(p, Q, EK_CHARS, b[i]))
                        return 0;
            }
        } else if (c == '[') {
            last = Q->n;
            if (!parse_class(p, Q, rule))
                return 0;
        } else if (c == '.') {
            p->pos++;
            last = Q->n;
            if (p->any_rule == UINT32_MAX) {
                cprange r = {0, 0x10FFFF};
                uint32_t before = p->n_rules;
                if (!push_class(p, Q, rule, &r, 1, 0))
                    return 0;
                p->any_rule = before;
            } else if (!seq_push(p, Q, EK_REF, p->any_rule)) {
                return 0;
            }
        } else if (is_word(c)) {
            size_t s = p->pos;
            while (p->pos < p->len && is_word(p->s[p->pos]))
                p->pos++;
            size_t save = p->pos;
            skip_space(p, 0);
            if (p->len - p->pos >= 3 && memcmp(p->s + p->pos, "::=", 3) == 0) {
                p->pos = s;
                return perr(p, "rule '%.*s' starts before the previous rule ended (a new "
                               "rule starts on a new line)", (int)(save - s), p->s + s);
            }
            p->pos = save;
            uint32_t r = rule_get(p, p->s + s, save - s);
            if (r == UINT32_MAX)
                return 0;
            last = Q->n;
            if (!seq_push(p, Q, EK_REF, r))
                return 0;
        } else if (c == '(') {
            p->pos++;
            if (++p->depth > RB_G_MAX_NEST)
                return perr(p, "parentheses nested deeper than %d", RB_G_MAX_NEST);
            uint32_t r = rule_generated(p, rule);
            if (r == UINT32_MAX)
                return 0;
            skip_space(p, 1);
            if (!parse_alternates(p, r, 1))
                return 0;
            skip_space(p, 1);
            if (p->pos >= p->len || p->s[p->pos] != ')')
                return perr(p, "expected ')'");
            p->pos++;
            p->depth--;
            last = Q->n;
            if (!seq_push(p, Q, EK_REF, r))
                return 0;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0)
                return perr(p, "'%c' has no item before it to repeat", c);
            long min = 0, max = -1;
            p->pos++;
            if (c == '+')
                min = 1;
            else if (c == '?')
                max = 1;
            else if (c == '{') {
                skip_space(p, 0);
                if (!parse_int(p, &min))
                    return 0;
                skip_space(p, 0);
                max = min;
                if (p->pos < p->len && p->s[p->pos] == ',') {
                    p->pos++;
                    skip_space(p, 0);
                    max = -1;
                    if (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
                        if (!parse_int(p, &max))
                            return 0;
                        if (max < min)
                            return perr(p, "repetition {%ld,%ld}: the maximum is below the "
                                           "minimum", min, max);
                    }
                    skip_space(p, 0);
                }
                if (p->pos >= p->len || p->s[p->pos] != '}')
                    return perr(p, "expected '}' to close the repetition");
                p->pos++;
            }
            if (!repeat(p, Q, rule, (uint32_t)last, min, max))
                return 0;
        } else {
            return 1;
        }
    }
#undef Q
}

static int parse_alternates(gparser *p, uint32_t rule, int nested)
{
    for (;;) {
        if (!alt_new(p, rule))
            return 0;
        if (!parse_sequence(p, rule, p->rules[rule].n_alts - 1, nested))
            return 0;
        skip_space(p, nested);
        if (p->pos < p->len && p->s[p->pos] == '|') {
            p->pos++;
            skip_space(p, 1);
            continue;
        }
        if (!nested) {
            size_t save = p->pos;
            skip_space(p, 1);
            if (p->pos < p->len && p->s[p->pos] == '|') {
                p->pos++;
                skip_space(p, 1);
                continue;
            }
            p->pos = save;
        }
        return 1;
    }
}

static int parse_grammar(gparser *p)
{
    skip_space(p, 1);
    while (p->pos < p->len) {
        size_t s = p->pos;
        while (p->pos < p->len && is_word(p->s[p->pos]))
            p->pos++;
        if (p->pos == s)
            return perr(p, "expected a rule name");
        size_t e = p->pos;
        skip_space(p, 0);
        if (p->len - p->pos < 3 || memcmp(p->s + p->pos, "::=", 3) != 0)
            return perr(p, "expected '::=' after the rule name '%.*s'", (int)(e - s), p->s + s);
        p->pos += 3;
        uint32_t r = rule_get(p, p->s + s, e - s);
        if (r == UINT32_MAX)
            return 0;
        if (p->rules[r].is_defined) {
            p->pos = s;
            return perr(p, "rule '%s' is defined twice (first on line %u)", p->rules[r].name,
                        p->rules[r].def_line);
        }
        uint32_t col;
        line_col(p->s, s, &p->rules[r].def_line, &col);
        p->rules[r].is_defined = 1;
        skip_space(p, 1);
        if (!parse_alternates(p, r, 0))
            return 0;
        skip_space(p, 0);
        if (p->pos < p->len && p->s[p->pos] != '\n')
            return perr(p, "unexpected '%c'", p->s[p->pos]);
        skip_space(p, 1);
    }
    return 1;
}

/* ---- checks and flattening ------------------------------------------------ */

/* Left recursion: an edge r -> s when s can be entered before r consumed a
 * byte; a cycle means expansion would never end. */
static int check_left_recursion(gparser *p, rb_grammar *g)
{
    uint32_t nr = g->n_rules;
    uint8_t *nullable = calloc(nr ? nr : 1, 1);
    uint8_t *color = calloc(nr ? nr : 1, 1);
    uint32_t *stk = malloc(sizeof *stk * 2 * (nr ? nr : 1));
    int ok = 1;
    if (!nullable || !color || !stk) {
        ok = oom(p);
        goto out;
    }
    for (int changed = 1; changed;) {
        changed = 0;
        for (uint32_t r = 0; r < nr; r++) {
            if (nullable[r])
                continue;
            for (uint32_t a = 0; a < g->rule_nalt[r] && !nullable[r]; a++) {
                uint32_t i = g->alt_start[g->rule_alt0[r] + a];
                while (g->elems[i].kind == EK_REF && nullable[g->elems[i].arg])
                    i++;
                if (g->elems[i].kind == EK_END) {
                    nullable[r] = 1;
                    changed = 1;
                }
            }
        }
    }
    /* iterative DFS; stack of (rule, next edge cursor as elem index) */
    for (uint32_t s0 = 0; s0 < nr && ok; s0++) {
        if (color[s0])
            continue;
        uint32_t sp = 0;
        stk[sp++] = s0;
        stk[sp++] = 0; /* cursor: alternative a, element i packed as "visit index" */
        color[s0] = 1;
        while (sp && ok) {
            uint32_t r = stk[sp - 2], cur = stk[sp - 1];
            /* enumerate the left-reachable refs of r in order; cur counts them */
            uint32_t k = 0, next = UINT32_MAX;
            for (uint32_t a = 0; a < g->rule_nalt[r] && next == UINT32_MAX; a++) {
                uint32_t i = g->alt_start[g->rule_alt0[r] + a];
                for (; g->elems[i].kind == EK_REF; i++) {
                    if (k++ == cur) {
                        next = g->elems[i].arg;
                        break;
                    }
                    if (!nullable[g->elems[i].arg])
                        break;
                }
            }
            if (next == UINT32_MAX) {
                color[r] = 2;
                sp -= 2;
                continue;
            }
            stk[sp - 1] = cur + 1;
            if (color[next] == 1) {
                p->pos = p->len;
                rb_error_set(p->err, RB_E_FORMAT,
                             "grammar: rule '%s' is left-recursive (it can reach itself "
                             "through '%s' before matching a character)",
                             p->rules[next].name, p->rules[r].name);
                p->st = RB_E_FORMAT;
                ok = 0;
            } else if (color[next] == 0) {
                color[next] = 1;
                stk[sp++] = next;
                stk[sp++] = 0;
            }
        }
    }
out:
    free(nullable);
    free(color);
    free(stk);
    return ok;
}

static void free_parser(gparser *p)
{
    for (uint32_t i = 0; i < p->n_rules; i++) {
        for (uint32_t a = 0; a < p->rules[i].n_alts; a++)
            free(p->rules[i].alts[a].v);
        free(p->rules[i].alts);
        free(p->rules[i].name);
    }
    free(p->rules);
    free(p->sets);
}

static int compile(gparser *p, rb_grammar *g, const char *root)
{
    if (!grow((void **)&p->sets, &p->cap_sets, 256, sizeof *p->sets))
        return oom(p);
    memset(p->sets, 0, 256 * sizeof *p->sets);
    for (int b = 0; b < 256; b++)
        p->sets[b][b >> 6] = (uint64_t)1 << (b & 63);
    p->n_sets = 256;
    if (!parse_grammar(p))
        return 0;
    uint32_t ri = UINT32_MAX;
    for (uint32_t i = 0; i < p->n_rules; i++) {
        if (!p->rules[i].is_defined) {
            rb_error_set(p->err, RB_E_FORMAT,
                         "grammar: line %u, column %u: rule '%s' is used but never defined",
                         p->rules[i].ref_line, p->rules[i].ref_col, p->rules[i].name);
            p->st = RB_E_FORMAT;
            return 0;
        }
        if (strcmp(p->rules[i].name, root) == 0)
            ri = i;
    }
    if (ri == UINT32_MAX) {
        p->st = RB_E_FORMAT;
        rb_error_set(p->err, RB_E_FORMAT, "grammar: no rule named '%s' (the start rule)", root);
        return 0;
    }
    uint64_t n_alts = 0, n_elems = 0;
    for (uint32_t i = 0; i < p->n_rules; i++) {
        n_alts += p->rules[i].n_alts;
        for (uint32_t a = 0; a < p->rules[i].n_alts; a++)
            n_elems += p->rules[i].alts[a].n + 1;
    }
    g->n_rules = p->n_rules;
    g->root = ri;
    g->elems = malloc(sizeof *g->elems * (n_elems + 1));
    g->alt_start = malloc(sizeof *g->alt_start * (n_alts + 1));
    g->rule_alt0 = malloc(sizeof *g->rule_alt0 * (p->n_rules + 1));
    g->rule_nalt = malloc(sizeof *g->rule_nalt * (p->n_rules + 1));
    g->sets = malloc(sizeof *g->sets * p->n_sets);
    if (!g->elems || !g->alt_start || !g->rule_alt0 || !g->rule_nalt || !g->sets)
        return oom(p);
    memcpy(g->sets, p->sets, sizeof *g->sets * p->n_sets);
    g->n_sets = p->n_sets;
    uint32_t ai = 0, ei = 0;
    for (uint32_t i = 0; i < p->n_rules; i++) {
        g->rule_alt0[i] = ai;
        g->rule_nalt[i] = p->rules[i].n_alts;
        for (uint32_t a = 0; a < p->rules[i].n_alts; a++) {
            g->alt_start[ai++] = ei;
            gseq *q = &p->rules[i].alts[a];
            if (q->n)
                memcpy(g->elems + ei, q->v, sizeof *q->v * q->n);
            ei += q->n;
            g->elems[ei++] = (gelem){EK_END, 0};
        }
    }
    g->n_elems = ei;
    return check_left_recursion(p, g);
}

/* ======================================================================== */
/* ---- the automaton -------------------------------------------------------- */

static uint32_t node_new(rb_grammar *g, uint32_t pos, uint32_t parent)
{
    if (g->n_nodes >= RB_G_MAX_NODES) {
        g->is_overflow = 1;
        return 0;
    }
    if (!grow((void **)&g->nodes, &g->cap_nodes, g->n_nodes + 1, sizeof *g->nodes)) {
        g->is_oom = 1;
        return 0;
    }
    g->nodes[g->n_nodes] = (gnode){pos, parent};
    return g->n_nodes++;
}

static int chain_equal(const rb_grammar *g, uint32_t a, uint32_t b)
{
    while (a && b) {
        if (a == b)
            return 1;
        if (g->nodes[a].pos != g->nodes[b].pos)
            return 0;
        a = g->nodes[a].parent;
        b = g->nodes[b].parent;
    }
    return a == b;
}

static int ss_push(rb_grammar *g, uint32_t id)
{
    if (!grow((void **)&g->ss, &g->cap_ss, g->n_ss + 1, sizeof *g->ss)) {
        g->is_oom = 1;
        return 0;
    }
    g->ss[g->n_ss++] = id;
    return 1;
}

/*
 * Expands (pos, parent) until every path's top is a CHARS element, adding
 * the new stacks to the set being built at ss[set0..) (deduplicated) and
 * setting *complete when a path ends the root rule.
 */
static void expand(rb_grammar *g, uint32_t pos, uint32_t parent, uint32_t set0, int *complete)
{
    uint32_t n_work = 0, steps = 0;
    if (!grow((void **)&g->work, &g->cap_work, 2, sizeof *g->work)) {
        g->is_oom = 1;
        return;
    }
    g->work[n_work++] = pos;
    g->work[n_work++] = parent;
    while (n_work) {
        if (++steps > RB_G_MAX_EXPAND) {
            g->is_overflow = 1;
            return;
        }
        parent = g->work[--n_work];
        pos = g->work[--n_work];
        gelem e = g->elems[pos];
        if (e.kind == EK_END) {
            if (!parent) {
                *complete = 1;
            } else {
                g->work[n_work++] = g->nodes[parent].pos;
                g->work[n_work++] = g->nodes[parent].parent;
            }
        } else if (e.kind == EK_CHARS) {
            uint32_t i;
            for (i = set0; i < g->n_ss; i++)
                if (g->nodes[g->ss[i]].pos == pos && chain_equal(g, g->nodes[g->ss[i]].parent, parent))
                    break;
            if (i < g->n_ss)
                continue;
            if (g->n_ss - set0 >= RB_G_MAX_STACKS) {
                g->is_overflow = 1;
                return;
            }
            uint32_t id = node_new(g, pos, parent);
            if (!id || !ss_push(g, id))
                return;
        } else {
            uint32_t ret = parent;
            if (g->elems[pos + 1].kind != EK_END) {
                ret = node_new(g, pos + 1, parent);
                if (!ret)
                    return;
            }
            uint32_t r = e.arg, na = g->rule_nalt[r];
            if (!grow((void **)&g->work, &g->cap_work, n_work + 2 * na, sizeof *g->work)) {
                g->is_oom = 1;
                return;
            }
            for (uint32_t a = na; a-- > 0;) {
                g->work[n_work++] = g->alt_start[g->rule_alt0[r] + a];
                g->work[n_work++] = ret;
            }
        }
    }
}

/* The set after byte b from the set ss[b0..e0): appended at ss[e0..). */
static void advance(rb_grammar *g, uint32_t b0, uint32_t e0, uint8_t byte, int *complete)
{
    uint32_t set0 = g->n_ss;
    *complete = 0;
    for (uint32_t i = b0; i < e0; i++) {
        gnode n = g->nodes[g->ss[i]];
        const uint64_t *m = g->sets[g->elems[n.pos].arg];
        if (m[byte >> 6] >> (byte & 63) & 1)
            expand(g, n.pos + 1, n.parent, set0, complete);
    }
}

/* Serializes the set ss[b..e) into g->key: each stack's positions top to
 * bottom, then UINT32_MAX; the complete flag last. */
static int serialize(rb_grammar *g, const uint32_t *ids, uint32_t n, int complete)
{
    g->n_key = 0;
    for (uint32_t i = 0; i < n; i++) {
        for (uint32_t x = ids[i]; x; x = g->nodes[x].parent) {
            if (!grow((void **)&g->key, &g->cap_key, g->n_key + 2, sizeof *g->key))
                return 0;
            g->key[g->n_key++] = g->nodes[x].pos;
        }
        if (!grow((void **)&g->key, &g->cap_key, g->n_key + 2, sizeof *g->key))
            return 0;
        g->key[g->n_key++] = UINT32_MAX;
    }
    if (!grow((void **)&g->key, &g->cap_key, g->n_key + 1, sizeof *g->key))
        return 0;
    g->key[g->n_key++] = (uint32_t)complete;
    return 1;
}

/* Makes the serialized key the accepted state, its nodes at the arena's
 * bottom. */
static int rebuild_from_key(rb_grammar *g)
{
    g->n_nodes = 1;
    g->n_cur = 0;
    uint32_t i = 0;
    while (i + 1 < g->n_key) {
        uint32_t j = i;
        while (g->key[j] != UINT32_MAX)
            j++;
        uint32_t parent = 0;
        for (uint32_t k = j; k-- > i;) {
            parent = node_new(g, g->key[k], parent);
            if (!parent)
                return 0;
        }
        if (!grow((void **)&g->cur, &g->cap_cur, g->n_cur + 1, sizeof *g->cur))
            return 0;
        g->cur[g->n_cur++] = parent;
        i = j + 1;
    }
    g->cur_complete = (int)g->key[g->n_key - 1];
    g->base = g->n_nodes;
    return 1;
}

static rb_status init_state(rb_grammar *g)
{
    g->n_nodes = 1;
    g->n_ss = 0;
    g->is_overflow = g->is_oom = 0;
    int complete = 0;
    uint32_t r = g->root;
    for (uint32_t a = 0; a < g->rule_nalt[r]; a++)
        expand(g, g->alt_start[g->rule_alt0[r] + a], 0, 0, &complete);
    if (g->is_oom || !serialize(g, g->ss, g->n_ss, complete) || !rebuild_from_key(g))
        return RB_E_NOMEM;
    if (g->is_overflow) {
        snprintf(g->message, sizeof g->message,
                 "grammar: the start state has over %u stacks (too ambiguous)", RB_G_MAX_STACKS);
        return RB_E_UNSUPPORTED;
    }
    return RB_OK;
}

/* Copies the accepted state into ss[0..n_cur). */
static int load_cur(rb_grammar *g)
{
    g->n_nodes = g->base;
    g->n_ss = 0;
    g->is_overflow = g->is_oom = 0;
    for (uint32_t i = 0; i < g->n_cur; i++)
        if (!ss_push(g, g->cur[i]))
            return 0;
    return 1;
}

/* Runs bytes from the accepted state; on success the result is at
 * ss[*b..*e) with *complete. Returns 0 when they are not allowed. */
static int run_bytes(rb_grammar *g, const uint8_t *s, size_t n, uint32_t *b, uint32_t *e,
                     int *complete)
{
    if (!load_cur(g))
        return 0;
    uint32_t b0 = 0, e0 = g->n_ss;
    *complete = g->cur_complete;
    for (size_t i = 0; i < n; i++) {
        if (e0 == b0)
            return 0;
        advance(g, b0, e0, s[i], complete);
        if (g->is_overflow || g->is_oom)
            return 0;
        b0 = e0;
        e0 = g->n_ss;
    }
    if (e0 == b0 && !*complete)
        return 0;
    *b = b0;
    *e = e0;
    return 1;
}

rb_status rb_grammar_accept_bytes(rb_grammar *g, const char *bytes, size_t n)
{
    uint32_t b, e;
    int complete;
    if (!g)
        return RB_E_INVALID_ARG;
    if (!run_bytes(g, (const uint8_t *)bytes, n, &b, &e, &complete)) {
        int over = g->is_overflow, no_mem = g->is_oom;
        g->n_nodes = g->base;
        if (no_mem) {
            snprintf(g->message, sizeof g->message, "grammar: out of memory");
            return RB_E_NOMEM;
        }
        if (over)
            snprintf(g->message, sizeof g->message,
                     "grammar: the text makes the grammar too ambiguous (over %u stacks or "
                     "%u expansion steps)", RB_G_MAX_STACKS, RB_G_MAX_EXPAND);
        else
            snprintf(g->message, sizeof g->message,
                     "grammar: %zu bytes (\"%.40s%s\") are not allowed here", n, bytes,
                     n > 40 ? "..." : "");
        return RB_E_INVALID_ARG;
    }
    /* serialize reads the chains above base, then rebuild overwrites */
    if (!serialize(g, g->ss + b, e - b, complete) || !rebuild_from_key(g)) {
        snprintf(g->message, sizeof g->message, "grammar: out of memory");
        return RB_E_NOMEM;
    }
    return RB_OK;
}

/* ======================================================================== */
/* ---- vocabulary, trie, masks ----------------------------------------------- */

/* Token order for the trie: bytes, then length, then id. */
static int tok_less(const rb_grammar *g, uint32_t x, uint32_t y)
{
    size_t lx = g->piece_off[x + 1] - g->piece_off[x], ly = g->piece_off[y + 1] - g->piece_off[y];
    int c = memcmp(g->piece_bytes + g->piece_off[x], g->piece_bytes + g->piece_off[y],
                   lx < ly ? lx : ly);
    if (c)
        return c < 0;
    if (lx != ly)
        return lx < ly;
    return x < y;
}

/* Bottom-up merge sort of a[0..n) with tmp[n] (qsort has no context). */
static void sort_tokens(const rb_grammar *g, uint32_t *a, uint32_t *tmp, uint32_t n)
{
    for (uint32_t w = 1; w < n; w *= 2) {
        for (uint32_t lo = 0; lo < n; lo += 2 * w) {
            uint32_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint32_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = tok_less(g, a[j], a[i]) ? a[j++] : a[i++];
            while (i < mid)
                tmp[k++] = a[i++];
            while (j < hi)
                tmp[k++] = a[j++];
        }
        memcpy(a, tmp, sizeof *a * n);
    }
}

static void build_trie(rb_grammar *g, uint32_t node, uint32_t lo, uint32_t hi, size_t d)
{
    uint32_t i = lo;
    while (i < hi && g->piece_off[g->trie_tok[i] + 1] - g->piece_off[g->trie_tok[i]] == d)
        i++;
    g->trie[node].tok0 = lo;
    g->trie[node].n_tok = i - lo;
    uint32_t n_child = 0;
    for (uint32_t j = i; j < hi;) {
        uint8_t c = (uint8_t)g->piece_bytes[g->piece_off[g->trie_tok[j]] + d];
        while (j < hi && (uint8_t)g->piece_bytes[g->piece_off[g->trie_tok[j]] + d] == c)
            j++;
        n_child++;
    }
    uint32_t c0 = g->n_trie;
    g->trie[node].child0 = c0;
    g->trie[node].n_child = n_child;
    g->n_trie += n_child;
    uint32_t k = 0;
    for (uint32_t j = i; j < hi; k++) {
        uint32_t s = j;
        uint8_t c = (uint8_t)g->piece_bytes[g->piece_off[g->trie_tok[j]] + d];
        while (j < hi && (uint8_t)g->piece_bytes[g->piece_off[g->trie_tok[j]] + d] == c)
            j++;
        g->trie[c0 + k].byte = c;
        build_trie(g, c0 + k, s, j, d + 1);
    }
}

static rb_status set_vocab(rb_grammar *g, const char *const *pieces, const size_t *lens,
                           const uint8_t *is_eog, uint32_t n_vocab, rb_error *err)
{
    g->n_vocab = n_vocab;
    size_t total = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        total += lens[i];
    g->piece_bytes = malloc(total ? total : 1);
    g->piece_off = malloc(sizeof *g->piece_off * ((size_t)n_vocab + 1));
    g->is_eog = calloc(n_vocab ? n_vocab : 1, 1);
    g->trie_tok = malloc(sizeof *g->trie_tok * (n_vocab ? n_vocab : 1));
    g->trie = calloc(total + 1, sizeof *g->trie);
    g->mask_bytes = ((size_t)n_vocab + 7) / 8;
    g->mask = calloc(g->mask_bytes ? g->mask_bytes : 1, 1);
    if (!g->piece_bytes || !g->piece_off || !g->is_eog || !g->trie_tok || !g->trie || !g->mask)
        return rb_error_set(err, RB_E_NOMEM, "grammar: out of memory for %u tokens", n_vocab);
    size_t off = 0;
    for (uint32_t i = 0; i < n_vocab; i++) {
        g->piece_off[i] = off;
        if (lens[i])
            memcpy(g->piece_bytes + off, pieces[i], lens[i]);
        off += lens[i];
        g->is_eog[i] = is_eog ? is_eog[i] != 0 : 0;
        g->trie_tok[i] = i;
    }
    g->piece_off[n_vocab] = off;
    uint32_t *tmp = malloc(sizeof *tmp * (n_vocab ? n_vocab : 1));
    if (!tmp)
        return rb_error_set(err, RB_E_NOMEM, "grammar: out of memory for %u tokens", n_vocab);
    sort_tokens(g, g->trie_tok, tmp, n_vocab);
    free(tmp);
    g->n_trie = 1;
    build_trie(g, 0, 0, n_vocab, 0);
    uint64_t cap = RB_G_CACHE_BYTES / (g->mask_bytes + 64);
    g->cache_cap = (uint32_t)(cap < 8 ? 8 : cap > 4096 ? 4096 : cap);
    g->cache = calloc(g->cache_cap, sizeof *g->cache);
    if (!g->cache)
        return rb_error_set(err, RB_E_NOMEM, "grammar: out of memory for the mask cache");
    return RB_OK;
}

static void walk(rb_grammar *g, uint32_t t, uint32_t b0, uint32_t e0, size_t *n_allowed)
{
    const tnode *tn = &g->trie[t];
    uint32_t c0 = tn->child0, nc = tn->n_child;
    for (uint32_t k = 0; k < nc; k++) {
        const tnode *c = &g->trie[c0 + k];
        uint32_t mark_nodes = g->n_nodes, mark_ss = g->n_ss;
        int complete;
        g->stats.n_trie_visits++;
        advance(g, b0, e0, c->byte, &complete);
        uint32_t b1 = mark_ss, e1 = g->n_ss;
        if (!g->is_overflow && !g->is_oom && (e1 > b1 || complete)) {
            for (uint32_t i = 0; i < c->n_tok; i++) {
                uint32_t tok = g->trie_tok[c->tok0 + i];
                if (!g->is_eog[tok]) {
                    g->mask[tok >> 3] |= (uint8_t)(1u << (tok & 7));
                    (*n_allowed)++;
                }
            }
            if (e1 > b1 && c->n_child)
                walk(g, c0 + k, b1, e1, n_allowed);
        }
        g->is_overflow = 0;
        g->n_nodes = mark_nodes;
        g->n_ss = mark_ss;
    }
}

static uint64_t hash_key(const uint32_t *k, uint32_t n)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (uint32_t i = 0; i < n; i++) {
        h ^= k[i];
        h *= UINT64_C(0x100000001b3);
        h ^= h >> 29;
    }
    return h;
}

static void cache_clear(rb_grammar *g)
{
    for (uint32_t i = 0; i < g->cache_n; i++) {
        free(g->cache[i].key);
        free(g->cache[i].mask);
    }
    g->cache_n = 0;
}

rb_status rb_grammar_mask(rb_grammar *g, const uint8_t **mask, size_t *n_allowed)
{
    if (!g || !mask || !n_allowed)
        return RB_E_INVALID_ARG;
    if (!g->n_vocab) {
        snprintf(g->message, sizeof g->message, "grammar: it has no vocabulary");
        return RB_E_INVALID_ARG;
    }
    if (!serialize(g, g->cur, g->n_cur, g->cur_complete))
        return RB_E_NOMEM;
    uint64_t h = hash_key(g->key, g->n_key);
    for (uint32_t i = 0; i < g->cache_n; i++) {
        centry *c = &g->cache[i];
        if (c->hash == h && c->key_len == g->n_key &&
            memcmp(c->key, g->key, sizeof *g->key * g->n_key) == 0) {
            g->stats.n_cache_hits++;
            *mask = c->mask;
            *n_allowed = c->n_allowed;
            return RB_OK;
        }
    }
    g->stats.n_walks++;
    memset(g->mask, 0, g->mask_bytes);
    size_t n = 0;
    if (!load_cur(g))
        return RB_E_NOMEM;
    walk(g, 0, 0, g->n_ss, &n);
    if (g->is_oom) {
        g->n_nodes = g->base;
        snprintf(g->message, sizeof g->message, "grammar: out of memory");
        return RB_E_NOMEM;
    }
    if (g->cur_complete)
        for (uint32_t t = 0; t < g->n_vocab; t++)
            if (g->is_eog[t]) {
                g->mask[t >> 3] |= (uint8_t)(1u << (t & 7));
                n++;
            }
    g->n_nodes = g->base;
    /* remember it (key is still the state's serialization) */
    if (g->cache_n == g->cache_cap)
        cache_clear(g);
    centry *c = &g->cache[g->cache_n];
    c->key = malloc(sizeof *g->key * g->n_key);
    c->mask = malloc(g->mask_bytes);
    if (c->key && c->mask) {
        memcpy(c->key, g->key, sizeof *g->key * g->n_key);
        memcpy(c->mask, g->mask, g->mask_bytes);
        c->key_len = g->n_key;
        c->hash = h;
        c->n_allowed = n;
        g->cache_n++;
    } else {
        free(c->key);
        free(c->mask);
        c->key = NULL;
        c->mask = NULL;
    }
    *mask = g->mask;
    *n_allowed = n;
    return RB_OK;
}

rb_status rb_grammar_mask_brute(rb_grammar *g, uint8_t *mask)
{
    if (!g || !mask)
        return RB_E_INVALID_ARG;
    memset(mask, 0, g->mask_bytes);
    for (uint32_t t = 0; t < g->n_vocab; t++) {
        size_t n = g->piece_off[t + 1] - g->piece_off[t];
        uint32_t b, e;
        int complete, ok;
        if (g->is_eog[t])
            ok = g->cur_complete;
        else
            ok = n > 0 && run_bytes(g, (const uint8_t *)g->piece_bytes + g->piece_off[t], n, &b,
                                    &e, &complete);
        if (g->is_oom)
            return RB_E_NOMEM;
        if (ok)
            mask[t >> 3] |= (uint8_t)(1u << (t & 7));
        g->n_nodes = g->base;
    }
    return RB_OK;
}

uint32_t rb_grammar_n_vocab(const rb_grammar *g) { return g->n_vocab; }

void rb_grammar_get_stats(const rb_grammar *g, rb_grammar_stats *out) { *out = g->stats; }

/* ======================================================================== */
/* ---- lifetime and the public calls ------------------------------------------ */

void rb_grammar_destroy(rb_grammar *g)
{
    if (!g)
        return;
    free(g->elems);
    free(g->alt_start);
    free(g->rule_alt0);
    free(g->rule_nalt);
    free(g->sets);
    free(g->piece_bytes);
    free(g->piece_off);
    free(g->is_eog);
    free(g->trie);
    free(g->trie_tok);
    free(g->nodes);
    free(g->cur);
    free(g->ss);
    free(g->work);
    free(g->key);
    free(g->mask);
    if (g->cache)
        cache_clear(g);
    free(g->cache);
    free(g);
}

rb_status rb_grammar_create_vocab(const char *text, size_t len, const char *root,
                                  const char *const *pieces, const size_t *lens,
                                  const uint8_t *is_eog, uint32_t n_vocab, rb_grammar **out,
                                  rb_error *err)
{
    if (!out || (!text && len) || (n_vocab && (!pieces || !lens)))
        return rb_error_set(err, RB_E_INVALID_ARG, "grammar: text, out or the vocabulary is NULL");
    rb_grammar *g = calloc(1, sizeof *g);
    if (!g)
        return rb_error_set(err, RB_E_NOMEM, "grammar: out of memory");
    gparser p = {.s = text ? text : "", .len = len, .any_rule = UINT32_MAX, .err = err,
                 .st = RB_OK};
    int ok = compile(&p, g, root ? root : "root");
    free_parser(&p);
    rb_status st = ok ? RB_OK : p.st;
    if (st == RB_OK)
        st = set_vocab(g, pieces, lens, is_eog, n_vocab, err);
    if (st == RB_OK) {
        st = init_state(g);
        if (st != RB_OK)
            rb_error_set(err, st, "%s", st == RB_E_NOMEM ? "grammar: out of memory" : g->message);
    }
    if (st != RB_OK) {
        rb_grammar_destroy(g);
        return st;
    }
    *out = g;
    return RB_OK;
}

rb_status rb_grammar_create(rb_model *model, const char *text, size_t len, const char *root,
                            rb_grammar **out, rb_error *err)
{
    if (!model || !out || (!text && len))
        return rb_error_set(err, RB_E_INVALID_ARG, "grammar: model, text or out is NULL");
    const rb_tokenizer *t = NULL;
    rb_status st = rb_model_tokenizer(model, &t);
    if (st != RB_OK)
        return rb_error_set(err, st, "grammar: %s", rb_model_errmsg(model));
    uint32_t n = rb_tokenizer_n_vocab(t);
    char **pieces = calloc(n ? n : 1, sizeof *pieces);
    size_t *lens = calloc(n ? n : 1, sizeof *lens);
    uint8_t *eog = calloc(n ? n : 1, 1);
    st = pieces && lens && eog ? RB_OK : RB_E_NOMEM;
    for (uint32_t i = 0; i < n && st == RB_OK; i++) {
        size_t k = 0;
        eog[i] = (uint8_t)rb_tokenizer_is_eog(t, (int32_t)i);
        st = rb_model_token_to_piece(model, (int32_t)i, 0, NULL, 0, &k);
        if (st != RB_OK)
            break;
        pieces[i] = malloc(k + 1);
        if (!pieces[i]) {
            st = RB_E_NOMEM;
            break;
        }
        st = rb_model_token_to_piece(model, (int32_t)i, 0, pieces[i], k + 1, &lens[i]);
    }
    if (st == RB_OK)
        st = rb_grammar_create_vocab(text, len, root, (const char *const *)pieces, lens, eog, n,
                                     out, err);
    else
        rb_error_set(err, st, "grammar: cannot read the vocabulary's pieces");
    for (uint32_t i = 0; pieces && i < n; i++)
        free(pieces[i]);
    free(pieces);
    free(lens);
    free(eog);
    return st;
}

rb_status rb_grammar_from_json_schema(rb_model *model, const char *schema, size_t len,
                                      rb_grammar **out, rb_error *err)
{
    char *text = NULL;
    size_t n = 0;
    rb_status st = rb_json_schema_to_grammar(schema, len, &text, &n, err);
    if (st != RB_OK)
        return st;
    st = rb_grammar_create(model, text, n, "root", out, err);
    free(text);
    return st;
}

rb_status rb_grammar_accept(rb_grammar *g, int32_t token)
{
    if (!g)
        return RB_E_INVALID_ARG;
    if (token < 0 || (uint32_t)token >= g->n_vocab) {
        snprintf(g->message, sizeof g->message,
                 "grammar: token %d is outside the vocabulary of %u", (int)token, g->n_vocab);
        return RB_E_INVALID_ARG;
    }
    if (g->is_eog[token]) {
        if (!g->cur_complete) {
            snprintf(g->message, sizeof g->message,
                     "grammar: end-of-generation token %d before the grammar is complete",
                     (int)token);
            return RB_E_INVALID_ARG;
        }
        return RB_OK;
    }
    size_t n = g->piece_off[token + 1] - g->piece_off[token];
    if (n == 0) {
        snprintf(g->message, sizeof g->message,
                 "grammar: token %d has no text, so the grammar cannot take it", (int)token);
        return RB_E_INVALID_ARG;
    }
    rb_status st = rb_grammar_accept_bytes(g, g->piece_bytes + g->piece_off[token], n);
    if (st == RB_E_INVALID_ARG) {
        char m[RB_ERROR_MESSAGE_MAX];
        snprintf(m, sizeof m, "%s", g->message);
        snprintf(g->message, sizeof g->message, "token %d: %.400s", (int)token, m);
    }
    return st;
}

int rb_grammar_is_complete(const rb_grammar *g) { return g && g->cur_complete; }

int rb_grammar_can_continue(const rb_grammar *g) { return g && g->n_cur > 0; }

rb_status rb_grammar_reset(rb_grammar *g)
{
    if (!g)
        return RB_E_INVALID_ARG;
    return init_state(g);
}

const char *rb_grammar_errmsg(const rb_grammar *g) { return g ? g->message : ""; }
