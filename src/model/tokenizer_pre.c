/*
 * tokenizer_pre.c - the pre-tokenizers of byte-level BPE vocabularies: the
 * regex splits llama.cpp applies before BPE merges, written out by hand (no
 * regex engine), over code points.
 *
 * What it does: given code points and their Unicode flags, produce word
 * lengths. llama.cpp runs a list of regexes one after the other, each one
 * splitting every segment the previous produced; text a regex does not match
 * also becomes a segment. Two of its patterns (gpt2, llama3) have
 * hand-written matchers in unicode.cpp; the others go through std::regex on
 * a text where each code point is collapsed to one byte standing for its
 * category. Both are reproduced here as plain scanners with the same
 * results: a scanner sees only its segment (a look-ahead at the segment end
 * sees "end of text"), alternatives are tried in pattern order, first match
 * wins (ECMAScript/PCRE semantics, not longest match).
 *
 * What it does not do: UTF-8 decoding and the GPT-2 byte mapping
 * (tokenizer.c does both); pre-tokenizers other than those of rb_pretok.
 *
 * Memory: none; callers pass the output and scratch arrays (n entries each:
 * a word is never empty, so there are at most n words).
 */
#include <string.h>

#include "tokenizer.h"
#include "unicode_tables.h"

enum {
    L = RB_UCD_LETTER,
    N = RB_UCD_NUMBER,
    S = RB_UCD_SPACE,
    PRESENT = 0x80, /* the position is inside the segment */
};

/* One segment [b, e) being split; words are appended to out[*k]. */
typedef struct seg {
    const uint32_t *cps;
    const uint8_t *fl;
    size_t b, e;
    size_t prev; /* end of the last word emitted */
    uint32_t *out;
    size_t *k;
} seg;

/* Flags of position p, with PRESENT; 0 past the segment (llama.cpp's
 * OUT_OF_RANGE / empty flags). */
static inline unsigned flx(const seg *s, size_t p)
{
    return p < s->e ? (unsigned)(s->fl[p] | PRESENT) : 0u;
}

static inline void emit(seg *s, size_t end)
{
    if (end > s->prev)
        s->out[(*s->k)++] = (uint32_t)(end - s->prev);
    s->prev = end;
}

static inline uint32_t ascii_lower(uint32_t c)
{
    /* llama.cpp's unicode_tolower; only the contraction letters matter and
     * no non-ASCII code point lowercases to one of them (checked against
     * Python 3.11's str.lower over all code points). */
    return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d (case-insensitive when fold): the end, or 0. */
static size_t contraction(const seg *s, size_t pos, int fold)
{
    if (s->cps[pos] != '\'' || pos + 1 >= s->e)
        return 0;
    uint32_t c1 = s->cps[pos + 1];
    if (fold)
        c1 = ascii_lower(c1);
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        return pos + 2;
    if (pos + 2 < s->e) {
        uint32_t c2 = s->cps[pos + 2];
        if (fold)
            c2 = ascii_lower(c2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||
            (c1 == 'l' && c2 == 'l'))
            return pos + 3;
    }
    return 0;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void split_gpt2(seg *s)
{
    for (size_t pos = s->b; pos < s->e;) {
        uint32_t c = s->cps[pos];
        unsigned f = flx(s, pos);
        size_t end = contraction(s, pos, 0);
        if (end) {
            emit(s, pos = end);
            continue;
        }
        unsigned f2 = c == ' ' ? flx(s, pos + 1) : f;
        if (f2 & (L | N)) { /* ' ?\p{L}+' or ' ?\p{N}+' */
            unsigned cls = f2 & L ? L : N;
            pos += c == ' ';
            while (flx(s, pos) & cls)
                pos++;
            emit(s, pos);
            continue;
        }
        if (f2 && !(f2 & (S | L | N))) { /* ' ?[^\s\p{L}\p{N}]+' */
            pos += c == ' ';
            while (flx(s, pos) && !(flx(s, pos) & (S | L | N)))
                pos++;
            emit(s, pos);
            continue;
        }
        size_t n_ws = 0;
        while (flx(s, pos + n_ws) & S)
            n_ws++;
        if (n_ws > 1 && pos + n_ws < s->e) { /* '\s+(?!\S)': all but the last */
            emit(s, pos += n_ws - 1);
            continue;
        }
        if (n_ws > 0) { /* '\s+' */
            emit(s, pos += n_ws);
            continue;
        }
        emit(s, ++pos); /* no alternative matched: one code point */
    }
}

/*
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * max_digits 3 is llama3's pattern, 1 is qwen2's (\p{N}).
 */
static void split_llama3(seg *s, size_t max_digits)
{
    for (size_t pos = s->b; pos < s->e;) {
        uint32_t c = s->cps[pos];
        unsigned f = flx(s, pos);
        size_t end = contraction(s, pos, 1);
        if (end) {
            emit(s, pos = end);
            continue;
        }
        /* '[^\r\n\p{L}\p{N}]?\p{L}+' */
        if (c != '\r' && c != '\n' && !(f & N) && ((f & L) || (flx(s, pos + 1) & L))) {
            pos++;
            while (flx(s, pos) & L)
                pos++;
            emit(s, pos);
            continue;
        }
        if (f & N) { /* '\p{N}{1,max_digits}', repeated over a run */
            size_t ini = pos;
            while (flx(s, pos) & N) {
                if (++pos - ini >= max_digits) {
                    emit(s, pos);
                    ini = pos;
                }
            }
            emit(s, pos);
            continue;
        }
        /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' (f, not f2, guards it: a lone
         * trailing space comes out as " ", as '\s+' would give) */
        unsigned f2 = c == ' ' ? flx(s, pos + 1) : f;
        if (f && !(f2 & (S | L | N))) {
            pos += c == ' ';
            while (flx(s, pos) && !(flx(s, pos) & (S | L | N)))
                pos++;
            while (pos < s->e && (s->cps[pos] == '\r' || s->cps[pos] == '\n'))
                pos++;
            emit(s, pos);
            continue;
        }
        size_t n_ws = 0, last_rn = 0;
        while (flx(s, pos + n_ws) & S) {
            uint32_t c2 = s->cps[pos + n_ws];
            if (c2 == '\r' || c2 == '\n')
                last_rn = pos + n_ws + 1;
            n_ws++;
        }
        if (last_rn) { /* '\s*[\r\n]+': through the last line break */
            emit(s, pos = last_rn);
            continue;
        }
        if (n_ws > 1 && pos + n_ws < s->e) {
            emit(s, pos += n_ws - 1);
            continue;
        }
        if (n_ws > 0) {
            emit(s, pos += n_ws);
            continue;
        }
        emit(s, ++pos);
    }
}

/* Membership of `[\p{P}\$\+<=>\^~\|]` in llama.cpp's collapsed form: ASCII
 * by its fixed list (note: no backtick), the rest by category P. */
static int is_default_punct(uint32_t c, unsigned fl)
{
    if (c < 128)
        return c != 0 && strchr("!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|", (int)c) != NULL;
    return (fl & RB_UCD_PUNCT) && !(fl & S);
}

/* A single-class regex over a segment: runs (or single code points when
 * !runs) of code points in the class become words, and so do the gaps. */
enum { CLS_NUMBER, CLS_PUNCT };

static void split_class(seg *s, int cls, int runs)
{
    for (size_t pos = s->b; pos < s->e;) {
        size_t p = pos;
        int in = cls == CLS_NUMBER ? (s->fl[p] & N) != 0
                                   : is_default_punct(s->cps[p], s->fl[p]);
        if (!in) {
            pos++;
            continue;
        }
        emit(s, p); /* the gap before the match */
        pos++;
        while (runs && pos < s->e &&
               (cls == CLS_NUMBER ? (s->fl[pos] & N) != 0
                                  : is_default_punct(s->cps[pos], s->fl[pos])))
            pos++;
        emit(s, pos);
    }
    emit(s, s->e);
}

/* [0-9][0-9][0-9]: leftmost non-overlapping groups of three ASCII digits. */
static void split_digit3(seg *s)
{
    for (size_t pos = s->b; pos < s->e;) {
        if (pos + 3 <= s->e && s->cps[pos] - '0' < 10 &&
            s->cps[pos + 1] - '0' < 10 && s->cps[pos + 2] - '0' < 10) {
            emit(s, pos);
            emit(s, pos += 3);
        } else {
            pos++;
        }
    }
    emit(s, s->e);
}

enum { ST_GPT2, ST_LLAMA3, ST_QWEN2, ST_EACH_NUMBER, ST_NUMBER_RUNS,
       ST_PUNCT_RUNS, ST_DIGIT3 };

/* Applies one stage to every segment of in (n_in lengths), writing out. */
static size_t run_stage(int stage, const uint32_t *cps, const uint8_t *fl,
                        const uint32_t *in, size_t n_in, uint32_t *out)
{
    size_t k = 0, b = 0;
    for (size_t i = 0; i < n_in; i++) {
        seg s = { cps, fl, b, b + in[i], b, out, &k };
        switch (stage) {
        case ST_GPT2: split_gpt2(&s); break;
        case ST_LLAMA3: split_llama3(&s, 3); break;
        case ST_QWEN2: split_llama3(&s, 1); break;
        case ST_EACH_NUMBER: split_class(&s, CLS_NUMBER, 0); break;
        case ST_NUMBER_RUNS: split_class(&s, CLS_NUMBER, 1); break;
        case ST_PUNCT_RUNS: split_class(&s, CLS_PUNCT, 1); break;
        case ST_DIGIT3: split_digit3(&s); break;
        }
        b += in[i];
    }
    return k;
}

size_t rb_pretok_split(rb_pretok kind, const uint32_t *cps, const uint8_t *fl,
                       size_t n, uint32_t *lens, uint32_t *tmp)
{
    static const int chains[][5] = {
        [RB_PRETOK_DEFAULT] = { ST_PUNCT_RUNS, ST_GPT2, ST_NUMBER_RUNS, ST_DIGIT3, -1 },
        [RB_PRETOK_GPT2] = { ST_GPT2, -1 },
        [RB_PRETOK_LLAMA3] = { ST_LLAMA3, -1 },
        [RB_PRETOK_QWEN2] = { ST_QWEN2, -1 },
        [RB_PRETOK_SMOLLM] = { ST_EACH_NUMBER, ST_GPT2, -1 },
    };
    if (n == 0)
        return 0;
    const int *chain = chains[kind];
    size_t n_stages = 0;
    while (chain[n_stages] >= 0)
        n_stages++;
    /* ping-pong so that the last stage writes lens */
    uint32_t *bufs[2] = { lens, tmp };
    int cur = (n_stages % 2 == 0) ? 0 : 1; /* buffer holding the input */
    bufs[cur][0] = (uint32_t)n;
    size_t n_words = 1;
    for (size_t i = 0; i < n_stages; i++) {
        n_words = run_stage(chain[i], cps, fl, bufs[cur], n_words, bufs[cur ^ 1]);
        cur ^= 1;
    }
    return n_words;
}

typedef struct pre_name {
    const char *name;
    rb_pretok kind;
    signed char ignore_merges, add_bos, clean_spaces;
} pre_name;

/* llama.cpp's llama_vocab::impl::load: tokenizer.ggml.pre values whose
 * pattern is one of ours, with the flags it sets (clean_spaces defaults to
 * 1 for BPE; add_bos -1 = left to the default/metadata). */
static const pre_name k_pre_names[] = {
    { "default", RB_PRETOK_DEFAULT, 0, -1, 1 },
    { "llama3", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "llama-v3", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "llama-bpe", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "falcon3", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "falcon-h1", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "pixtral", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "midm-2.0", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "lfm2", RB_PRETOK_LLAMA3, 1, 1, 1 },
    { "dbrx", RB_PRETOK_LLAMA3, 0, -1, 1 },
    { "smaug-bpe", RB_PRETOK_LLAMA3, 0, -1, 1 },
    { "gpt-2", RB_PRETOK_GPT2, 0, -1, 1 },
    { "phi-2", RB_PRETOK_GPT2, 0, -1, 1 },
    { "gigachat", RB_PRETOK_GPT2, 0, -1, 1 },
    { "a.x-4.0", RB_PRETOK_GPT2, 0, -1, 1 },
    { "mellum", RB_PRETOK_GPT2, 0, -1, 1 },
    { "mpt", RB_PRETOK_GPT2, 0, -1, 1 },
    { "olmo", RB_PRETOK_GPT2, 0, -1, 1 },
    { "jais", RB_PRETOK_GPT2, 0, -1, 1 },
    { "exaone4", RB_PRETOK_GPT2, 0, -1, 1 },
    { "trillion", RB_PRETOK_GPT2, 0, -1, 0 },
    { "granite-docling", RB_PRETOK_GPT2, 0, -1, 0 },
    { "qwen2", RB_PRETOK_QWEN2, 0, -1, 0 },
    { "deepseek-r1-qwen", RB_PRETOK_QWEN2, 0, -1, 0 },
    { "kormo", RB_PRETOK_QWEN2, 0, -1, 0 },
    { "f2llmv2", RB_PRETOK_QWEN2, 0, -1, 0 },
    { "megrez", RB_PRETOK_QWEN2, 0, -1, 1 },
    { "stablelm2", RB_PRETOK_QWEN2, 0, -1, 1 },
    { "hunyuan", RB_PRETOK_QWEN2, 0, -1, 0 },
    { "solar-open", RB_PRETOK_QWEN2, 0, -1, 0 },
    { "grok-2", RB_PRETOK_QWEN2, 0, -1, 0 },
    { "smollm", RB_PRETOK_SMOLLM, 0, -1, 0 },
    { "starcoder", RB_PRETOK_SMOLLM, 0, -1, 1 },
    { "refact", RB_PRETOK_SMOLLM, 0, -1, 1 },
    { "command-r", RB_PRETOK_SMOLLM, 0, -1, 0 },
    { "codeshell", RB_PRETOK_SMOLLM, 0, -1, 1 },
    { "exaone", RB_PRETOK_SMOLLM, 0, -1, 1 },
    { "minerva-7b", RB_PRETOK_SMOLLM, 0, -1, 1 },
    { "mellum2", RB_PRETOK_SMOLLM, 0, -1, 1 },
};

rb_status rb_pretok_from_name(const char *name, size_t len, rb_pretok *kind,
                              int *ignore_merges, int *add_bos,
                              int *clean_spaces)
{
    if (name == NULL || len == 0) {
        name = "default"; /* llama.cpp: missing pre -> 'default' (warns) */
        len = 7;
    }
    for (size_t i = 0; i < sizeof k_pre_names / sizeof k_pre_names[0]; i++) {
        const pre_name *p = &k_pre_names[i];
        if (strlen(p->name) == len && memcmp(p->name, name, len) == 0) {
            *kind = p->kind;
            *ignore_merges = p->ignore_merges;
            *add_bos = p->add_bos;
            *clean_spaces = p->clean_spaces;
            return RB_OK;
        }
    }
    return RB_E_UNSUPPORTED;
}
