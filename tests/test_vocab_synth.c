/*
 * test_vocab_synth.c - checks the synthetic SPM and GPT-2 BPE vocabularies:
 * exact sizes, distinct non-empty UTF-8 tokens, specials and byte tokens at
 * their ids with their types, SPM prefix closure and score order, BPE merge
 * consistency (every "A B" joins two lower-id tokens into token 256 + i),
 * determinism, a few fixed spot checks, and argument errors. Prints the
 * build time of the two large sizes (informational, never a failure).
 */
#if !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE)
#define _POSIX_C_SOURCE 199309L
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "vocab_synth.h"

#define SPM_SPACE "\xe2\x96\x81"
#define BPE_SPACE "\xc4\xa0"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Strict UTF-8: no overlongs, no surrogates, nothing above U+10FFFF. */
static int is_utf8(const char *str)
{
    const unsigned char *s = (const unsigned char *)str;
    while (*s) {
        uint32_t c = *s, cp;
        int n;
        if (c < 0x80) { s++; continue; }
        if (c >= 0xc2 && c <= 0xdf) { n = 1; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { n = 2; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { n = 3; cp = c & 0x07; }
        else return 0;
        for (int i = 1; i <= n; i++) {
            if ((s[i] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i] & 0x3f);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff)
            return 0;
        s += n + 1;
    }
    return 1;
}

/* A sorted index of token strings for distinctness and lookups. */
typedef struct {
    const char *s;
    uint32_t id;
} entry;

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->s, ((const entry *)b)->s);
}

typedef struct {
    entry *e;
    uint32_t n;
} index_t;

/* Builds the index; returns the number of adjacent duplicates. */
static uint32_t index_build(index_t *ix, const rb_vocab_synth *v)
{
    ix->n = v->n_tokens;
    ix->e = malloc((size_t)v->n_tokens * sizeof(entry));
    if (!ix->e) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        ix->e[i].s = v->tokens[i];
        ix->e[i].id = i;
    }
    qsort(ix->e, ix->n, sizeof(entry), entry_cmp);
    uint32_t dups = 0;
    for (uint32_t i = 1; i < ix->n; i++)
        if (strcmp(ix->e[i - 1].s, ix->e[i].s) == 0)
            dups++;
    return dups;
}

static uint32_t index_find(const index_t *ix, const char *s)
{
    entry key = { s, 0 };
    const entry *e = bsearch(&key, ix->e, ix->n, sizeof(entry), entry_cmp);
    return e ? e->id : RB_TOKEN_NONE;
}

/* Checks shared by both styles: no empty or invalid token, no duplicate.
 * Counts failures instead of checking per token so a bad build prints a
 * few lines, not thousands. */
static void check_common(const rb_vocab_synth *v, index_t *ix)
{
    uint32_t empty = 0, bad_utf8 = 0;
    for (uint32_t i = 0; i < v->n_tokens; i++) {
        if (!v->tokens[i] || !v->tokens[i][0]) {
            empty++;
            continue;
        }
        if (!is_utf8(v->tokens[i]))
            bad_utf8++;
    }
    CHECK_EQ_INT(empty, 0);
    CHECK_EQ_INT(bad_utf8, 0);
    CHECK_EQ_INT(index_build(ix, v), 0);
}

static int same_vocab(const rb_vocab_synth *a, const rb_vocab_synth *b)
{
    if (a->n_tokens != b->n_tokens || a->n_merges != b->n_merges ||
        a->bos_id != b->bos_id || a->eos_id != b->eos_id ||
        a->unk_id != b->unk_id || a->pad_id != b->pad_id ||
        a->add_bos != b->add_bos || (!a->scores) != (!b->scores))
        return 0;
    for (uint32_t i = 0; i < a->n_tokens; i++) {
        if (strcmp(a->tokens[i], b->tokens[i]) != 0 ||
            a->token_types[i] != b->token_types[i])
            return 0;
        if (a->scores && a->scores[i] != b->scores[i])
            return 0;
    }
    for (uint32_t i = 0; i < a->n_merges; i++)
        if (strcmp(a->merges[i], b->merges[i]) != 0)
            return 0;
    return 1;
}

/* ---- SPM ------------------------------------------------------------------ */

static void check_spm(uint32_t n_vocab)
{
    rb_vocab_synth v;
    double t0 = now_s();
    rb_status st = rb_vocab_synth_spm(n_vocab, &v);
    double dt = now_s() - t0;
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK)
        return;
    if (n_vocab >= 32000)
        fprintf(stderr, "spm n_vocab=%u: %.1f ms\n", n_vocab, dt * 1e3);

    CHECK_EQ_INT(v.n_tokens, n_vocab);
    CHECK_STR_EQ(v.model, "llama");
    CHECK(v.pre == NULL);
    CHECK(v.merges == NULL);
    CHECK_EQ_INT(v.n_merges, 0);
    CHECK(v.scores != NULL);
    CHECK_EQ_U64(v.bos_id, 1);
    CHECK_EQ_U64(v.eos_id, 2);
    CHECK_EQ_U64(v.unk_id, 0);
    CHECK_EQ_U64(v.pad_id, RB_TOKEN_NONE);
    CHECK_EQ_INT(v.add_bos, 1);

    CHECK_STR_EQ(v.tokens[0], "<unk>");
    CHECK_STR_EQ(v.tokens[1], "<s>");
    CHECK_STR_EQ(v.tokens[2], "</s>");
    CHECK_EQ_INT(v.token_types[0], RB_TOKEN_TYPE_UNKNOWN);
    CHECK_EQ_INT(v.token_types[1], RB_TOKEN_TYPE_CONTROL);
    CHECK_EQ_INT(v.token_types[2], RB_TOKEN_TYPE_CONTROL);
    uint32_t bad_bytes = 0, bad_types = 0, bad_scores = 0;
    for (uint32_t c = 0; c < 256; c++) {
        char want[8];
        snprintf(want, sizeof(want), "<0x%02X>", c);
        if (strcmp(v.tokens[3 + c], want) != 0 ||
            v.token_types[3 + c] != RB_TOKEN_TYPE_BYTE)
            bad_bytes++;
    }
    CHECK_EQ_INT(bad_bytes, 0);
    for (uint32_t i = 0; i < 259; i++)
        if (v.scores[i] != 0.0f)
            bad_scores++;
    CHECK_STR_EQ(v.tokens[259], SPM_SPACE);
    for (uint32_t i = 259; i < n_vocab; i++) {
        if (v.token_types[i] != RB_TOKEN_TYPE_NORMAL)
            bad_types++;
        if (i > 259 && !(v.scores[i] < v.scores[i - 1]))
            bad_scores++;
    }
    CHECK_EQ_INT(bad_types, 0);
    CHECK_EQ_INT(bad_scores, 0);

    index_t ix;
    check_common(&v, &ix);

    /* Prefix closure: every character prefix of a normal piece is a normal
     * piece with a lower id. */
    uint32_t missing = 0;
    for (uint32_t i = 259; i < n_vocab; i++) {
        const char *s = v.tokens[i];
        size_t n = strlen(s);
        char buf[512];
        if (n >= sizeof(buf)) {
            missing++;
            continue;
        }
        for (size_t k = 1; k < n; k++) {
            if (((unsigned char)s[k] & 0xc0) == 0x80)
                continue; /* not a character boundary */
            memcpy(buf, s, k);
            buf[k] = '\0';
            uint32_t id = index_find(&ix, buf);
            if (id == RB_TOKEN_NONE || id < 259 || id >= i) {
                if (missing++ < 5)
                    fprintf(stderr, "spm %u: prefix \"%s\" of \"%s\" -> %u\n",
                            n_vocab, buf, s, id);
            }
        }
    }
    CHECK_EQ_INT(missing, 0);

    /* Spot checks: single characters come first, words when there is room. */
    if (n_vocab >= 512) {
        CHECK_STR_EQ(v.tokens[260], "a");
        CHECK(index_find(&ix, "z") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, "Z") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, "9") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, ".") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, SPM_SPACE "the") != RB_TOKEN_NONE);
    }
    if (n_vocab >= 32000) {
        CHECK(index_find(&ix, SPM_SPACE "people") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, "people") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, SPM_SPACE "The") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, "\xc3\xa9") != RB_TOKEN_NONE); /* e acute */
        CHECK(index_find(&ix, "<0x0A>") == 3 + 10);
    }
    free(ix.e);

    rb_vocab_synth w;
    CHECK_EQ_INT(rb_vocab_synth_spm(n_vocab, &w), RB_OK);
    CHECK(same_vocab(&v, &w));
    rb_vocab_synth_free(&w);

    rb_vocab_synth_free(&v);
    CHECK(v.tokens == NULL && v.scores == NULL && v.token_types == NULL);
    CHECK_EQ_INT(v.n_tokens, 0);
}

/* ---- BPE ------------------------------------------------------------------ */

/* GPT-2 bytes_to_unicode, written out independently of the library: returns
 * the code point of byte-level token id (0..255). */
static uint32_t gpt2_symbol(uint32_t id)
{
    uint32_t bs[256], n = 0;
    for (uint32_t c = '!'; c <= '~'; c++) bs[n++] = c;
    for (uint32_t c = 0xa1; c <= 0xac; c++) bs[n++] = c;
    for (uint32_t c = 0xae; c <= 0xff; c++) bs[n++] = c;
    if (id < n)
        return bs[id];
    return 0x100 + (id - n);
}

static void utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = '\0';
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = '\0';
    }
}

static void check_bpe(uint32_t n_vocab)
{
    rb_vocab_synth v;
    double t0 = now_s();
    rb_status st = rb_vocab_synth_bpe(n_vocab, &v);
    double dt = now_s() - t0;
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK)
        return;
    if (n_vocab >= 50000)
        fprintf(stderr, "bpe n_vocab=%u: %.1f ms\n", n_vocab, dt * 1e3);

    CHECK_EQ_INT(v.n_tokens, n_vocab);
    CHECK_EQ_INT(v.n_merges, n_vocab - 256 - 3);
    CHECK_STR_EQ(v.model, "gpt2");
    CHECK_STR_EQ(v.pre, "qwen2");
    CHECK(v.scores == NULL);
    CHECK(v.merges != NULL);
    CHECK_EQ_U64(v.bos_id, n_vocab - 3);
    CHECK_EQ_U64(v.eos_id, n_vocab - 3);
    CHECK_EQ_U64(v.unk_id, RB_TOKEN_NONE);
    CHECK_EQ_U64(v.pad_id, RB_TOKEN_NONE);
    CHECK_EQ_INT(v.add_bos, 0);

    CHECK_STR_EQ(v.tokens[n_vocab - 3], "<|endoftext|>");
    CHECK_STR_EQ(v.tokens[n_vocab - 2], "<|im_start|>");
    CHECK_STR_EQ(v.tokens[n_vocab - 1], "<|im_end|>");
    for (uint32_t i = n_vocab - 3; i < n_vocab; i++)
        CHECK_EQ_INT(v.token_types[i], RB_TOKEN_TYPE_CONTROL);
    uint32_t bad_sym = 0, bad_types = 0;
    for (uint32_t i = 0; i < 256; i++) {
        char want[4];
        utf8_encode(gpt2_symbol(i), want);
        if (strcmp(v.tokens[i], want) != 0)
            bad_sym++;
    }
    CHECK_EQ_INT(bad_sym, 0);
    for (uint32_t i = 0; i < n_vocab - 3; i++)
        if (v.token_types[i] != RB_TOKEN_TYPE_NORMAL)
            bad_types++;
    CHECK_EQ_INT(bad_types, 0);
    CHECK_STR_EQ(v.tokens[0], "!");
    CHECK_STR_EQ(v.tokens[220], BPE_SPACE);    /* byte 0x20 */
    CHECK_STR_EQ(v.tokens[198], "\xc4\x8a");   /* byte 0x0A, C with dot */
    CHECK_STR_EQ(v.tokens[187], "\xc3\xbf");   /* byte 0xFF, last printable */
    CHECK_STR_EQ(v.tokens[188], "\xc4\x80");   /* byte 0x00 -> U+0100 */

    index_t ix;
    check_common(&v, &ix);

    /* Merges: "A B" with A, B tokens of lower id, A+B = token 256+i. */
    uint32_t bad_merges = 0;
    for (uint32_t i = 0; i < v.n_merges; i++) {
        const char *m = v.merges[i];
        const char *sp = strchr(m, ' ');
        char a[512], b[512], ab[1024];
        if (!sp || sp == m || !sp[1] || strchr(sp + 1, ' ') ||
            (size_t)(sp - m) >= sizeof(a) || strlen(sp + 1) >= sizeof(b)) {
            bad_merges++;
            continue;
        }
        memcpy(a, m, (size_t)(sp - m));
        a[sp - m] = '\0';
        strcpy(b, sp + 1);
        uint32_t ia = index_find(&ix, a), ib = index_find(&ix, b);
        snprintf(ab, sizeof(ab), "%s%s", a, b);
        if (ia == RB_TOKEN_NONE || ib == RB_TOKEN_NONE || ia >= 256 + i ||
            ib >= 256 + i || strcmp(ab, v.tokens[256 + i]) != 0) {
            if (bad_merges++ < 5)
                fprintf(stderr, "bpe %u: merge %u \"%s\" -> \"%s\"\n",
                        n_vocab, i, m, v.tokens[256 + i]);
        }
    }
    CHECK_EQ_INT(bad_merges, 0);
    CHECK_STR_EQ(v.merges[0], BPE_SPACE " t");
    CHECK_STR_EQ(v.tokens[256], BPE_SPACE "t");

    if (n_vocab >= 50257) {
        uint32_t the = index_find(&ix, BPE_SPACE "the");
        CHECK(the != RB_TOKEN_NONE);
        if (the != RB_TOKEN_NONE)
            CHECK_STR_EQ(v.merges[the - 256], BPE_SPACE "th e");
        CHECK(index_find(&ix, "the") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, BPE_SPACE "people") != RB_TOKEN_NONE);
        CHECK(index_find(&ix, BPE_SPACE BPE_SPACE) != RB_TOKEN_NONE);
        CHECK(index_find(&ix, "\xc4\x8a\xc4\x8a") != RB_TOKEN_NONE);
        /* U+00E9 is bytes C3 A9 -> symbols U+00C3 U+00A9 */
        CHECK(index_find(&ix, "\xc3\x83\xc2\xa9") != RB_TOKEN_NONE);
    }
    free(ix.e);

    rb_vocab_synth w;
    CHECK_EQ_INT(rb_vocab_synth_bpe(n_vocab, &w), RB_OK);
    CHECK(same_vocab(&v, &w));
    rb_vocab_synth_free(&w);

    rb_vocab_synth_free(&v);
    CHECK(v.tokens == NULL && v.merges == NULL && v.token_types == NULL);
    CHECK_EQ_INT(v.n_merges, 0);
}

/* A smaller vocabulary is the prefix of a larger one (BPE: before the three
 * control tokens), so models of different sizes share their tokens. */
static void check_prefix_stable(void)
{
    rb_vocab_synth s, l;
    CHECK_EQ_INT(rb_vocab_synth_spm(512, &s), RB_OK);
    CHECK_EQ_INT(rb_vocab_synth_spm(32000, &l), RB_OK);
    uint32_t diff = 0;
    for (uint32_t i = 0; i < s.n_tokens && i < l.n_tokens; i++)
        if (strcmp(s.tokens[i], l.tokens[i]) != 0 || s.scores[i] != l.scores[i])
            diff++;
    CHECK_EQ_INT(diff, 0);
    rb_vocab_synth_free(&s);
    rb_vocab_synth_free(&l);

    CHECK_EQ_INT(rb_vocab_synth_bpe(1000, &s), RB_OK);
    CHECK_EQ_INT(rb_vocab_synth_bpe(50257, &l), RB_OK);
    diff = 0;
    for (uint32_t i = 0; i + 3 < s.n_tokens; i++)
        if (strcmp(s.tokens[i], l.tokens[i]) != 0)
            diff++;
    for (uint32_t i = 0; i < s.n_merges; i++)
        if (strcmp(s.merges[i], l.merges[i]) != 0)
            diff++;
    CHECK_EQ_INT(diff, 0);
    rb_vocab_synth_free(&s);
    rb_vocab_synth_free(&l);
}

static void check_errors(void)
{
    rb_vocab_synth v;
    memset(&v, 0xab, sizeof(v));
    CHECK_EQ_INT(rb_vocab_synth_spm(259, &v), RB_E_INVALID_ARG);
    CHECK(v.tokens == NULL && v.n_tokens == 0 && v.scores == NULL);
    memset(&v, 0xab, sizeof(v));
    CHECK_EQ_INT(rb_vocab_synth_bpe(259, &v), RB_E_INVALID_ARG);
    CHECK(v.tokens == NULL && v.n_tokens == 0 && v.merges == NULL);
    CHECK_EQ_INT(rb_vocab_synth_spm(0, &v), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_vocab_synth_bpe(0, &v), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_vocab_synth_spm(32000, NULL), RB_E_INVALID_ARG);
    CHECK_EQ_INT(rb_vocab_synth_bpe(32000, NULL), RB_E_INVALID_ARG);
    rb_vocab_synth_free(&v); /* zeroed: a no-op */
    rb_vocab_synth_free(NULL);
}

int main(void)
{
    static const uint32_t spm_sizes[] = { 260, 261, 512, 32000 };
    static const uint32_t bpe_sizes[] = { 260, 261, 512, 50257, 151936 };
    for (size_t i = 0; i < sizeof(spm_sizes) / sizeof(spm_sizes[0]); i++)
        check_spm(spm_sizes[i]);
    for (size_t i = 0; i < sizeof(bpe_sizes) / sizeof(bpe_sizes[0]); i++)
        check_bpe(bpe_sizes[i]);
    check_prefix_stable();
    check_errors();
    return check_report();
}
