/*
 * test_tokenizer.c - the tokenizer against llama.cpp's own ids.
 *
 *   1. golden cases: every line of the three tokenizer-cases TSV files
 *      (stories260K's 512-token SPM vocab, the Llama 2 32000-token SPM
 *      vocab, the GPT-2 50257-token BPE vocab) and every one of llama.cpp's
 *      GPT-2 vocab test vectors (gpt2-vocab-tests.inp/.out); decoding the
 *      golden greedy token streams gives greedy.txt
 *   2. pre-tokenizer splits (gpt2, llama3, qwen2, smollm, default) on
 *      English, CJK, emoji, code and whitespace runs, expected splits worked
 *      out by hand from the published patterns
 *   3. round trips and the streaming detokenizer (never invalid UTF-8)
 *   4. synthetic vocabularies (vocab_synth) and hand-made ones written as
 *      GGUF files: round trips, special tokens, ignore_merges, EOG
 *   5. bad metadata: each error names its key
 *   6. timing: 10 KB encodes and a 152k-token vocabulary load
 *
 * The reference parts skip with a message when REBOUND_MODELS_DIR is absent.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "gguf.h"
#include "gguf_write.h"
#include "rebound.h"
#include "testlib.h"
#include "tokenizer.h"
#include "unicode_tables.h"
#include "vocab_synth.h"

#ifndef REBOUND_MODELS_DIR
#define REBOUND_MODELS_DIR "../shared/models"
#endif
#ifndef REBOUND_TEST_TMP
#define REBOUND_TEST_TMP "/tmp"
#endif

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)len + 1);
    if (p && fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p) {
        p[len] = 0;
        *n = (size_t)len;
    }
    return p;
}

static rb_tokenizer *open_tok(const char *path)
{
    rb_gguf *g;
    rb_error err = { 0 };
    rb_tokenizer *t = NULL;
    if (rb_gguf_open(path, 0, NULL, &g, &err) != RB_OK) {
        fprintf(stderr, "open %s: %s\n", path, err.message);
        return NULL;
    }
    if (rb_tokenizer_create(g, &t, &err) != RB_OK)
        fprintf(stderr, "tokenizer %s: %s\n", path, err.message);
    rb_gguf_close(g);
    return t;
}

/* Encodes and prints ids space-separated into out (for comparisons). */
static size_t encode(const rb_tokenizer *t, const char *s, size_t n, int add,
                     int parse, int32_t *ids, size_t max)
{
    size_t n_out = 0;
    rb_error err = { 0 };
    rb_status st = rb_tokenizer_encode(t, s, n, add, parse, ids, max, &n_out, &err);
    if (st != RB_OK) {
        fprintf(stderr, "encode: %s\n", err.message);
        return 0;
    }
    return n_out;
}

static void ids_str(const int32_t *ids, size_t n, char *out, size_t cap)
{
    size_t w = 0;
    out[0] = 0;
    for (size_t i = 0; i < n && w + 16 < cap; i++)
        w += (size_t)snprintf(out + w, cap - w, "%s%d", i ? " " : "", (int)ids[i]);
}

/* C-unescapes s (\n \t \r \" \\ \xHH) into o; returns the length. */
static size_t unescape(const char *s, char *o)
{
    size_t n = 0;
    while (*s) {
        if (*s != '\\') {
            o[n++] = *s++;
            continue;
        }
        s++;
        switch (*s) {
        case 'n': o[n++] = '\n'; s++; break;
        case 't': o[n++] = '\t'; s++; break;
        case 'r': o[n++] = '\r'; s++; break;
        case 'x': {
            unsigned v = 0;
            sscanf(s + 1, "%2x", &v);
            o[n++] = (char)v;
            s += 3;
            break;
        }
        default: o[n++] = *s++; break;
        }
    }
    return n;
}

/* ---- 1. golden cases ---------------------------------------------------- */

static int run_tsv(const char *model, const char *tsv)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", REBOUND_MODELS_DIR, model);
    rb_tokenizer *t = open_tok(path);
    CHECK(t != NULL);
    snprintf(path, sizeof path, "%s/%s", REBOUND_MODELS_DIR, tsv);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (!t || !f) {
        rb_tokenizer_destroy(t);
        if (f)
            fclose(f);
        return 0;
    }
    char line[8192], in[8192], got[16384];
    int32_t ids[4096];
    int pass = 0, total = 0;
    int header_bos = -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '#') {
            header_bos = strstr(line, "add_bos=true") != NULL;
            continue;
        }
        char *tab = strchr(line, '\t');
        if (!tab)
            continue;
        *tab = 0;
        size_t n = unescape(line, in);
        size_t nt = encode(t, in, n, 1, 1, ids, 4096);
        ids_str(ids, nt, got, sizeof got);
        total++;
        if (strcmp(got, tab + 1) == 0) {
            pass++;
        } else {
            fprintf(stderr, "%s: '%s'\n  got      %s\n  expected %s\n", tsv, line,
                    got, tab + 1);
        }
        check_count++;
        if (strcmp(got, tab + 1) != 0)
            check_failures++;
    }
    fclose(f);
    /* the header's "with BOS (add_bos=true)" holds for the SPM files; the
     * GPT-2 vocab says add_bos_token = false, which llama.cpp obeys */
    if (header_bos == 1)
        CHECK(rb_tokenizer_get_kind(t) == RB_TOKENIZER_BPE || rb_tokenizer_adds_bos(t));
    printf("  %s: %d/%d cases\n", tsv, pass, total);
    rb_tokenizer_destroy(t);
    return pass;
}

static void test_gpt2_vocab_vectors(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/parity-qwen3-Q8_0.gguf", REBOUND_MODELS_DIR);
    rb_tokenizer *t = open_tok(path);
    size_t n_inp, n_out;
    snprintf(path, sizeof path, "%s/golden/parity-qwen3/gpt2-vocab-tests.inp", REBOUND_MODELS_DIR);
    char *inp = read_file(path, &n_inp);
    snprintf(path, sizeof path, "%s/golden/parity-qwen3/gpt2-vocab-tests.out", REBOUND_MODELS_DIR);
    char *out = read_file(path, &n_out);
    CHECK(t && inp && out);
    if (!t || !inp || !out)
        goto done;
    /* llama.cpp's test-tokenizer-0 framing: inputs end at each
     * "\n__ggml_vocab_test__\n"; .out has one line of ids per input */
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t sep_len = strlen(sep), pos = 0;
    char *line = out, got[65536];
    int32_t *ids = malloc(65536 * sizeof *ids);
    int pass = 0, total = 0;
    for (;;) {
        char *hit = strstr(inp + pos, sep);
        if (!hit)
            break;
        size_t len = (size_t)(hit - (inp + pos));
        char *nl = strchr(line, '\n');
        CHECK(nl != NULL);
        if (!nl)
            break;
        *nl = 0;
        const char *exp = line[0] == ' ' ? line + 1 : line;
        size_t nt = encode(t, inp + pos, len, 0, 1, ids, 65536);
        ids_str(ids, nt, got, sizeof got);
        total++;
        check_count++;
        if (strcmp(got, exp) == 0) {
            pass++;
        } else {
            check_failures++;
            fprintf(stderr, "gpt2 vector #%d '%.*s'\n  got      %s\n  expected %s\n",
                    total, (int)len, inp + pos, got, exp);
        }
        line = nl + 1;
        pos = (size_t)(hit - inp) + sep_len;
    }
    CHECK_EQ_INT(total, 46);
    printf("  gpt2-vocab-tests: %d/%d vectors\n", pass, total);
    free(ids);
done:
    free(inp);
    free(out);
    rb_tokenizer_destroy(t);
}

/* Decoding the golden greedy streams gives greedy.txt (prompt + pieces). */
static void test_golden_decode(const char *model, const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", REBOUND_MODELS_DIR, model);
    rb_tokenizer *t = open_tok(path);
    size_t n_tok, n_txt;
    snprintf(path, sizeof path, "%s/golden/%s/greedy.tokens", REBOUND_MODELS_DIR, dir);
    char *toks = read_file(path, &n_tok);
    snprintf(path, sizeof path, "%s/golden/%s/greedy.txt", REBOUND_MODELS_DIR, dir);
    char *txt = read_file(path, &n_txt);
    CHECK(t && toks && txt);
    if (t && toks && txt) {
        int32_t ids[4096];
        size_t n = 0;
        for (char *p = toks; *p && n < 4096;) {
            char *e;
            long v = strtol(p, &e, 10);
            if (e == p)
                break;
            ids[n++] = (int32_t)v;
            p = e;
        }
        /* the text llama.cpp prints: the prompt, then each piece; the same
         * as streaming every token with the leading space stripped */
        char *buf = malloc(1 << 16);
        size_t w = 0, k;
        size_t first = rb_tokenizer_adds_bos(t) && ids[0] == rb_tokenizer_bos(t) ? 1 : 0;
        rb_detok d;
        rb_detok_init(&d, t, RB_DECODE_STRIP_LEADING_SPACE);
        char *chunk = malloc(rb_detok_out_bytes(t));
        for (size_t i = first; i < n; i++) {
            CHECK(rb_detok_push(&d, ids[i], chunk, rb_detok_out_bytes(t), &k) == RB_OK);
            memcpy(buf + w, chunk, k);
            w += k;
        }
        w += rb_detok_flush(&d, buf + w, 3);
        buf[w] = 0;
        CHECK_STR_EQ(buf, txt);
        /* llama_detokenize(remove_special) keeps the space after a BOS
           (the space prefix's; a vocabulary without it has none) */
        size_t m = 0;
        CHECK(rb_tokenizer_decode(t, ids, n, RB_DECODE_REMOVE_SPECIAL, buf, 1 << 16, &m,
                                  NULL) == RB_OK);
        buf[m] = 0;
        CHECK_STR_EQ(buf + (first && txt[0] != ' ' && buf[0] == ' ' ? 1 : 0), txt);
        free(chunk);
        free(buf);
        /* EOG */
        CHECK(rb_tokenizer_is_eog(t, rb_tokenizer_eos(t)));
        CHECK(!rb_tokenizer_is_eog(t, ids[first]));
    }
    free(toks);
    free(txt);
    rb_tokenizer_destroy(t);
}

/* ---- 2. pre-tokenizer splits -------------------------------------------- */

/* Splits s with kind and joins the words with '|'. */
static const char *split(rb_pretok kind, const char *s)
{
    static char out[4096];
    size_t len = strlen(s), n = 0;
    uint32_t cps[1024] = { 0 }, lens[1024], tmp[1024];
    uint8_t fl[1024] = { 0 };
    for (size_t i = 0; i < len;) {
        cps[n] = rb_utf8_decode_lenient((const unsigned char *)s, len, &i);
        fl[n] = (uint8_t)rb_ucd_flags(cps[n]);
        n++;
    }
    size_t nw = rb_pretok_split(kind, cps, fl, n, lens, tmp);
    size_t w = 0, c = 0;
    for (size_t i = 0; i < nw; i++) {
        if (i)
            out[w++] = '|';
        for (uint32_t k = 0; k < lens[i]; k++)
            w += rb_utf8_encode(cps[c++], (unsigned char *)out + w);
    }
    out[w] = 0;
    CHECK_EQ_U64(c, n); /* words cover the text */
    return out;
}

static void test_splits(void)
{
    /* gpt-2 */
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "Hello world"), "Hello| world");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "  Hello"), " | Hello");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "I've 12345 apples!!"), "I|'ve| 12345| apples|!!");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "I'M HERE'LL"), "I|'|M| HERE|'|LL");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "a\n\nb"), "a|\n|\n|b");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "x   "), "x|   ");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e and \xc3\xa9mojis \xf0\x9f\x99\x82"),
                 "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e| and| \xc3\xa9mojis| \xf0\x9f\x99\x82");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "def f(x):\n    return x+1"),
                 "def| f|(|x|):|\n   | return| x|+|1");
    CHECK_STR_EQ(split(RB_PRETOK_GPT2, "a \xc2\xa0" "b"), "a| |\xc2\xa0|b");
    /* llama3 */
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "Hello World's 1234567 ok"),
                 "Hello| World|'s| |123|456|7| ok");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "I'M HERE'LL"), "I|'M| HERE|'LL");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "a\n\n  b"), "a|\n\n| | b");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "foo!!\n\nbar"), "foo|!!\n\n|bar");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "\tHello"), "\tHello");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c" "123"),
                 "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c|123");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "I \xf0\x9f\x98\x80\xf0\x9f\x98\x80 you"),
                 "I| \xf0\x9f\x98\x80\xf0\x9f\x98\x80| you");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "def f(x):\n    return x+1"),
                 "def| f|(x|):\n|   | return| x|+|1");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "a \xc2\xa0" "b"), "a| |\xc2\xa0" "b");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "end  "), "end|  ");
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, "x \r\n\r\ny"), "x| \r\n\r\n|y");
    /* qwen2: the llama3 pattern with single digits */
    CHECK_STR_EQ(split(RB_PRETOK_QWEN2, "1234567"), "1|2|3|4|5|6|7");
    CHECK_STR_EQ(split(RB_PRETOK_QWEN2, "Hello 2024!"), "Hello| |2|0|2|4|!");
    CHECK_STR_EQ(split(RB_PRETOK_QWEN2, "We'RE \xe6\x97\xa5\xe6\x9c\xac" "1"),
                 "We|'RE| \xe6\x97\xa5\xe6\x9c\xac|1");
    CHECK_STR_EQ(split(RB_PRETOK_QWEN2, "  \n\tx"), "  \n|\tx");
    /* smollm: \p{N} first, then gpt-2 inside each piece */
    CHECK_STR_EQ(split(RB_PRETOK_SMOLLM, "abc123 def"), "abc|1|2|3| def");
    CHECK_STR_EQ(split(RB_PRETOK_SMOLLM, "x 12"), "x| |1|2");
    /* llama.cpp's default chain */
    CHECK_STR_EQ(split(RB_PRETOK_DEFAULT, "Hello, world! 12345"),
                 "Hello|,| world|!| |123|45");
    /* empty input */
    CHECK_STR_EQ(split(RB_PRETOK_LLAMA3, ""), "");
    /* names */
    rb_pretok k;
    int im, ab, cs;
    CHECK(rb_pretok_from_name("llama-bpe", 9, &k, &im, &ab, &cs) == RB_OK &&
          k == RB_PRETOK_LLAMA3 && im == 1 && ab == 1);
    CHECK(rb_pretok_from_name("qwen2", 5, &k, &im, &ab, &cs) == RB_OK &&
          k == RB_PRETOK_QWEN2 && cs == 0);
    CHECK(rb_pretok_from_name("smollm", 6, &k, &im, &ab, &cs) == RB_OK &&
          k == RB_PRETOK_SMOLLM);
    CHECK(rb_pretok_from_name(NULL, 0, &k, &im, &ab, &cs) == RB_OK &&
          k == RB_PRETOK_DEFAULT);
    CHECK(rb_pretok_from_name("nope", 4, &k, &im, &ab, &cs) == RB_E_UNSUPPORTED);
    /* Unicode table spot checks */
    CHECK(rb_ucd_flags('a') == RB_UCD_LETTER);
    CHECK(rb_ucd_flags(0x4E2D) == RB_UCD_LETTER);  /* 中 */
    CHECK(rb_ucd_flags(0x0663) == RB_UCD_NUMBER);  /* Arabic-Indic 3 */
    CHECK(rb_ucd_flags(0x2167) == RB_UCD_NUMBER);  /* Roman numeral 8 (Nl) */
    CHECK(rb_ucd_flags(0x3000) == RB_UCD_SPACE);
    CHECK(rb_ucd_flags(0x1F600) == RB_UCD_SYMBOL);
    CHECK(rb_ucd_flags(0x0301) == RB_UCD_MARK);
    CHECK(rb_ucd_flags(0x1C) == 0);                /* not White_Space */
    CHECK(rb_ucd_flags(0x110000) == 0);
}

/* ---- 3. round trips and streaming --------------------------------------- */

static int valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned b = s[i];
        size_t need = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2
                    : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
        if (!need || i + need > n)
            return 0;
        uint32_t cp = need == 1 ? b : b & (0x7fu >> need);
        for (size_t k = 1; k < need; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return 0;
            cp = (cp << 6) | (s[i + k] & 0x3f);
        }
        static const uint32_t min_cp[5] = { 0, 0, 0x80, 0x800, 0x10000 };
        if (cp < min_cp[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += need;
    }
    return 1;
}

static const char *const k_texts[] = {
    "Once upon a time",
    "Hello world! 123",
    "  leading spaces and\ttabs\nnewline",
    "Lily's mom said, \"Let's go to the park.\"",
    "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e and \xc3\xa9mojis \xf0\x9f\x99\x82",
    "\xe4\xbd\xa0\xe5\xa5\xbd\xef\xbc\x8c\xe4\xb8\x96\xe7\x95\x8c\xef\xbc\x81 "
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 "
        "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
    "int main(void) {\n    return 0; // \xe2\x9c\x85\n}\n",
    "a",
    "\n\n\n",
    "   ",
    "x  y   z    ",
    "\xf0\x9f\x98\x80\xf0\x9f\x98\x81\xf0\x9f\x98\x82\xf0\x9f\xa4\xa3 \xe1\x9e\x80\xe1\x9e\xb6",
    "3.14159 + 2,718 = ?? ...",
};

/* Streams ids through rb_detok one by one; every chunk must be valid
 * UTF-8; returns the concatenation (static buffer). */
static const char *stream(const rb_tokenizer *t, const int32_t *ids, size_t n,
                          int flags, size_t *len)
{
    static char buf[1 << 16];
    size_t w = 0, k = 0;
    char *chunk = malloc(rb_detok_out_bytes(t));
    rb_detok d;
    rb_detok_init(&d, t, flags);
    int all_valid = 1;
    for (size_t i = 0; i < n; i++) {
        if (rb_detok_push(&d, ids[i], chunk, rb_detok_out_bytes(t), &k) != RB_OK) {
            all_valid = 0;
            continue;
        }
        all_valid &= valid_utf8((unsigned char *)chunk, k);
        memcpy(buf + w, chunk, k);
        w += k;
    }
    k = rb_detok_flush(&d, chunk, 3);
    all_valid &= valid_utf8((unsigned char *)chunk, k);
    memcpy(buf + w, chunk, k);
    w += k;
    buf[w] = 0;
    CHECK(all_valid);
    free(chunk);
    *len = w;
    return buf;
}

/* encode -> pieces and encode -> stream give the text back exactly (SPM:
 * with the prefixed space stripped). */
static void round_trips(const rb_tokenizer *t, const char *name)
{
    int32_t ids[4096];
    int ok = 0, total = 0;
    for (size_t i = 0; i < sizeof k_texts / sizeof k_texts[0]; i++) {
        const char *s = k_texts[i];
        size_t n = strlen(s);
        size_t nt = encode(t, s, n, 0, 0, ids, 4096);
        /* pieces */
        char joined[8192];
        size_t w = 0;
        for (size_t k = 0; k < nt; k++) {
            int len = rb_tokenizer_piece(t, ids[k], joined + w, sizeof joined - w);
            CHECK(len >= 0);
            w += (size_t)len;
        }
        const char *back = joined;
        if (rb_tokenizer_get_kind(t) == RB_TOKENIZER_SPM && w > 0 && joined[0] == ' ')
            back++, w--;
        total++;
        int same = w == n && memcmp(back, s, n) == 0;
        ok += same;
        if (!same)
            fprintf(stderr, "%s: round trip of '%s' gave '%.*s'\n", name, s, (int)w, back);
        CHECK(same);
        /* streaming, one token at a time */
        size_t sl;
        int spm = rb_tokenizer_get_kind(t) == RB_TOKENIZER_SPM;
        const char *st = stream(t, ids, nt, spm ? RB_DECODE_STRIP_LEADING_SPACE : 0, &sl);
        if (!(sl == n && memcmp(st, s, n) == 0))
            fprintf(stderr, "%s: streaming '%s' gave '%.*s'\n", name, s, (int)sl, st);
        CHECK(sl == n && memcmp(st, s, n) == 0);
    }
    printf("  %s: %d/%d round trips\n", name, ok, total);
}

/* Streams invalid and split sequences: output stays valid UTF-8. */
static void test_detok_invalid(const rb_tokenizer *t)
{
    /* find byte tokens by piece */
    int32_t byte_tok[256];
    for (int b = 0; b < 256; b++)
        byte_tok[b] = RB_TOKEN_NULL;
    for (uint32_t id = 0; id < rb_tokenizer_n_vocab(t); id++) {
        char p[8];
        if (rb_tokenizer_piece(t, (int32_t)id, p, sizeof p) == 1 &&
            byte_tok[(unsigned char)p[0]] == RB_TOKEN_NULL)
            byte_tok[(unsigned char)p[0]] = (int32_t)id;
    }
    /* F0 9F 99 82 (🙂) split, then a stray C3 followed by 'a', then a lone E6 */
    const unsigned char seq[] = { 0xF0, 0x9F, 0x99, 0x82, 0xC3, 'a', 0xE6 };
    int32_t ids[8];
    size_t n = 0;
    for (size_t i = 0; i < sizeof seq; i++)
        if (byte_tok[seq[i]] != RB_TOKEN_NULL)
            ids[n++] = byte_tok[seq[i]];
    if (n != sizeof seq) {
        printf("  (vocab lacks byte tokens: invalid-UTF-8 stream test skipped)\n");
        return;
    }
    size_t len;
    const char *s = stream(t, ids, n, 0, &len);
    CHECK(valid_utf8((const unsigned char *)s, len));
    CHECK(len == 4 + 3 + 1 + 3 &&
          memcmp(s, "\xf0\x9f\x99\x82\xef\xbf\xbd" "a\xef\xbf\xbd", len) == 0);
}

/* ---- 4. synthetic and hand-made vocabularies ----------------------------- */

typedef struct vspec {
    const char *model, *pre;
    uint32_t n;
    const char *const *tokens;
    const float *scores;
    const int32_t *types;
    uint32_t n_merges;
    const char *const *merges;
    int64_t bos, eos, unk;     /* < 0: key not written */
    int add_bos;               /* -1: not written */
    /* corruptions */
    int scores_short, types_u8, no_tokens, no_model;
} vspec;

static rb_status build(const vspec *v, rb_tokenizer **out, rb_error *err)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/test_tokenizer_%d.gguf", REBOUND_TEST_TMP, (int)getpid());
    rb_gguf_writer *w;
    rb_error werr;
    if (rb_gguf_writer_create(path, 0, NULL, &w, &werr) != RB_OK) {
        fprintf(stderr, "writer: %s\n", werr.message);
        return RB_E_IO;
    }
    rb_gguf_writer_set_str(w, "general.architecture", "llama");
    if (!v->no_model)
        rb_gguf_writer_set_str(w, "tokenizer.ggml.model", v->model);
    if (v->pre)
        rb_gguf_writer_set_str(w, "tokenizer.ggml.pre", v->pre);
    if (!v->no_tokens)
        rb_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", v->n, v->tokens);
    if (v->scores)
        rb_gguf_writer_set_array(w, "tokenizer.ggml.scores", RB_GGUF_F32,
                                 v->n - (v->scores_short ? 1 : 0), v->scores);
    if (v->types) {
        if (v->types_u8) {
            uint8_t *u = calloc(v->n, 1);
            rb_gguf_writer_set_array(w, "tokenizer.ggml.token_type", RB_GGUF_U8, v->n, u);
            free(u);
        } else {
            rb_gguf_writer_set_array(w, "tokenizer.ggml.token_type", RB_GGUF_I32, v->n, v->types);
        }
    }
    if (v->merges)
        rb_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", v->n_merges, v->merges);
    if (v->bos >= 0)
        rb_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
    if (v->eos >= 0)
        rb_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
    if (v->unk >= 0)
        rb_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk);
    if (v->add_bos >= 0)
        rb_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", v->add_bos);
    rb_status st = rb_gguf_writer_begin_data(w);
    if (st == RB_OK)
        st = rb_gguf_writer_finish(w);
    rb_gguf_writer_destroy(w);
    if (st != RB_OK)
        return st;
    rb_gguf *g;
    if ((st = rb_gguf_open(path, 0, NULL, &g, err)) != RB_OK)
        return st;
    st = rb_tokenizer_create(g, out, err);
    rb_gguf_close(g);
    unlink(path);
    return st;
}

static rb_status build_synth(const rb_vocab_synth *s, const char *pre, rb_tokenizer **out,
                             rb_error *err)
{
    vspec v = { s->model, pre ? pre : s->pre, s->n_tokens, (const char *const *)s->tokens,
                s->scores, s->token_types, s->n_merges, (const char *const *)s->merges,
                s->bos_id == RB_TOKEN_NONE ? -1 : (int64_t)s->bos_id,
                s->eos_id == RB_TOKEN_NONE ? -1 : (int64_t)s->eos_id,
                s->unk_id == RB_TOKEN_NONE ? -1 : (int64_t)s->unk_id, s->add_bos, 0, 0, 0, 0 };
    return build(&v, out, err);
}

static void test_synthetic(void)
{
    rb_vocab_synth s;
    rb_tokenizer *t = NULL;
    rb_error err = { 0 };
    int32_t ids[4096];

    /* SPM, 4096 tokens with byte fallback */
    CHECK(rb_vocab_synth_spm(4096, &s) == RB_OK);
    CHECK(build_synth(&s, NULL, &t, &err) == RB_OK);
    if (t) {
        CHECK(rb_tokenizer_get_kind(t) == RB_TOKENIZER_SPM);
        CHECK_EQ_INT(rb_tokenizer_n_vocab(t), 4096);
        round_trips(t, "synthetic spm 4096");
        test_detok_invalid(t);
        /* "<s>" is a control token: split out only with parse_special */
        size_t n = encode(t, "<s>hi", 5, 0, 1, ids, 64);
        CHECK(n >= 2 && ids[0] == rb_tokenizer_bos(t));
        n = encode(t, "<s>hi", 5, 0, 0, ids, 64);
        CHECK(n >= 1 && ids[0] != rb_tokenizer_bos(t));
        /* BOS added, and the buffer-too-small contract */
        size_t need = 0;
        CHECK(rb_tokenizer_encode(t, "hello world", 11, 1, 0, NULL, 0, &need, &err) ==
              RB_E_INVALID_ARG);
        CHECK(need >= 2);
        CHECK_CONTAINS(err.message, "needs");
        size_t got = 0;
        CHECK(rb_tokenizer_encode(t, "hello world", 11, 1, 0, ids, need, &got, &err) == RB_OK);
        CHECK_EQ_U64(got, need);
        CHECK_EQ_INT(ids[0], rb_tokenizer_bos(t));
        /* empty text: just BOS (SentencePiece's behaviour) */
        CHECK_EQ_U64(encode(t, "", 0, 1, 0, ids, 8), 1);
        CHECK_EQ_U64(encode(t, "", 0, 0, 0, ids, 8), 0);
        /* decode contract */
        char buf[64];
        size_t m;
        int32_t bad[2] = { 5, 999999 };
        CHECK(rb_tokenizer_decode(t, bad, 2, 0, buf, sizeof buf, &m, &err) == RB_E_INVALID_ARG);
        CHECK_CONTAINS(err.message, "#1");
        CHECK(rb_tokenizer_validate(t, bad, 1, NULL) == RB_OK);
        CHECK(!rb_tokenizer_is_valid(t, -1) && !rb_tokenizer_is_valid(t, 4096));
        CHECK(rb_tokenizer_piece(t, 4096, buf, sizeof buf) == -1);
        CHECK(rb_tokenizer_nl(t) != RB_TOKEN_NULL);
        rb_tokenizer_destroy(t);
        t = NULL;
    }
    rb_vocab_synth_free(&s);

    /* byte-level BPE, qwen2 pre-tokenizer, control tokens at the end */
    CHECK(rb_vocab_synth_bpe(8192, &s) == RB_OK);
    CHECK(build_synth(&s, NULL, &t, &err) == RB_OK);
    if (t) {
        CHECK(rb_tokenizer_get_pretok(t) == RB_PRETOK_QWEN2);
        round_trips(t, "synthetic bpe 8192 (qwen2)");
        int32_t im_start = rb_tokenizer_find(t, "<|im_start|>", 12);
        int32_t im_end = rb_tokenizer_find(t, "<|im_end|>", 10);
        CHECK(im_start >= 0 && im_end >= 0);
        const char *chat = "<|im_start|>user\nhi<|im_end|>";
        size_t n = encode(t, chat, strlen(chat), 0, 1, ids, 64);
        CHECK(n >= 3 && ids[0] == im_start && ids[n - 1] == im_end);
        n = encode(t, chat, strlen(chat), 0, 0, ids, 64);
        CHECK(n > 3 && ids[0] != im_start);
        CHECK(rb_tokenizer_is_eog(t, im_end));
        CHECK(!rb_tokenizer_is_eog(t, im_start));
        CHECK(rb_tokenizer_is_eog(t, rb_tokenizer_find(t, "<|endoftext|>", 13)));
        CHECK(rb_tokenizer_attr(t, im_end) & RB_TOKEN_ATTR_CONTROL);
        /* decode: control tokens are dropped unless unparsed */
        char buf[256];
        size_t m;
        n = encode(t, chat, strlen(chat), 0, 1, ids, 64);
        CHECK(rb_tokenizer_decode(t, ids, n, 0, buf, sizeof buf, &m, NULL) == RB_OK);
        CHECK(m == 7 && memcmp(buf, "user\nhi", 7) == 0);
        CHECK(rb_tokenizer_decode(t, ids, n, RB_DECODE_UNPARSE_SPECIAL, buf, sizeof buf, &m,
                                  NULL) == RB_OK);
        CHECK(m == strlen(chat) && memcmp(buf, chat, m) == 0);
        rb_tokenizer_destroy(t);
        t = NULL;
    }
    /* the same vocabulary under the other pre-tokenizers */
    const char *pres[] = { "llama-bpe", "gpt-2", "smollm", "default" };
    for (int i = 0; i < 4; i++) {
        CHECK(build_synth(&s, pres[i], &t, &err) == RB_OK);
        if (t) {
            char name[64];
            snprintf(name, sizeof name, "synthetic bpe 8192 (%s)", pres[i]);
            round_trips(t, name);
            rb_tokenizer_destroy(t);
            t = NULL;
        }
    }
    rb_vocab_synth_free(&s);

    /* hand-made BPE: merges order, ignore_merges (llama3) */
    {
        /* bytes 'a' 'b' 'c' as themselves; merges "b c" (rank 0), "a b"
         * (rank 1), "a bc" (rank 2); token "abc" exists but "ab c" is no
         * merge. gpt-2: "abc" -> b+c first -> "a" "bc" -> "abc" via rank 2. */
        const char *toks[] = { "a", "b", "c", "bc", "ab", "abc", "d", "<|endoftext|>" };
        const int32_t types[] = { 1, 1, 1, 1, 1, 1, 1, 3 };
        const char *merges[] = { "b c", "a b", "a bc" };
        vspec v = { "gpt2", "gpt-2", 8, toks, NULL, types, 3, merges, 7, 7, -1, 0, 0, 0, 0, 0 };
        CHECK(build(&v, &t, &err) == RB_OK);
        if (t) {
            size_t n = encode(t, "abc", 3, 0, 0, ids, 8);
            CHECK(n == 1 && ids[0] == 5);
            n = encode(t, "abd", 3, 0, 0, ids, 8); /* "ab" + "d" */
            CHECK(n == 2 && ids[0] == 4 && ids[1] == 6);
            n = encode(t, "e", 1, 0, 0, ids, 8); /* not in vocab: dropped */
            CHECK_EQ_U64(n, 0);
            rb_tokenizer_destroy(t);
            t = NULL;
        }
        /* without "a bc", gpt-2 ends at "a" "bc"; llama3 (ignore_merges)
         * takes the whole word "abc" because it is a token */
        vspec v2 = v;
        v2.n_merges = 2;
        CHECK(build(&v2, &t, &err) == RB_OK);
        if (t) {
            size_t n = encode(t, "abc", 3, 0, 0, ids, 8);
            CHECK(n == 2 && ids[0] == 0 && ids[1] == 3);
            rb_tokenizer_destroy(t);
            t = NULL;
        }
        v2.pre = "llama-bpe";
        v2.add_bos = -1; /* llama3 defaults add_bos to true */
        CHECK(build(&v2, &t, &err) == RB_OK);
        if (t) {
            size_t n = encode(t, "abc", 3, 1, 0, ids, 8);
            CHECK(n == 2 && ids[0] == 7 && ids[1] == 5);
            CHECK(rb_tokenizer_adds_bos(t));
            rb_tokenizer_destroy(t);
            t = NULL;
        }
    }

    /* hand-made SPM: score order, user-defined tokens, byte fallback */
    {
        const char *toks[] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b",
                               "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "<0x0A>",
                               "[X]", "c" };
        const float scores[] = { 0, 0, 0, -1, -1, -1, -5, -2, -3, 0, 0, -1 };
        const int32_t types[] = { 2, 3, 3, 1, 1, 1, 1, 1, 1, 6, 4, 1 };
        vspec v = { "llama", NULL, 12, toks, scores, types, 0, NULL, -1, -1, -1, -1,
                    0, 0, 0, 0 };
        CHECK(build(&v, &t, &err) == RB_OK);
        if (t) {
            /* "▁ab": "ab" (-2) beats "▁a" (-5), then "▁ab" (-3) */
            size_t n = encode(t, "ab", 2, 1, 0, ids, 8);
            CHECK(n == 2 && ids[0] == 1 && ids[1] == 8);
            /* user-defined "[X]" is split out even without parse_special,
             * and the text after it gets its own leading space */
            n = encode(t, "a[X]b", 5, 0, 0, ids, 8);
            CHECK(n == 4 && ids[0] == 6 && ids[1] == 10 && ids[2] == 3 && ids[3] == 5);
            /* "\n" -> <0x0A>; "é" has no byte tokens: both bytes -> <unk> */
            n = encode(t, "\n\xc3\xa9", 3, 0, 0, ids, 8);
            CHECK(n == 4 && ids[0] == 3 && ids[1] == 9 && ids[2] == 0 && ids[3] == 0);
            char buf[8];
            CHECK(rb_tokenizer_piece(t, 9, buf, sizeof buf) == 1 && buf[0] == '\n');
            CHECK(rb_tokenizer_piece(t, 6, buf, sizeof buf) == 2 && memcmp(buf, " a", 2) == 0);
            CHECK(rb_tokenizer_piece(t, 6, buf, 1) == 2); /* too small: length only */
            CHECK(rb_tokenizer_is_eog(t, 2) && !rb_tokenizer_is_eog(t, 1));
            /* llama_detokenize: strip the prefix space when there is no BOS */
            int32_t q[2] = { 6, 5 };
            size_t m;
            CHECK(rb_tokenizer_decode(t, q, 2, 0, buf, sizeof buf, &m, NULL) == RB_OK);
            CHECK(m == 2 && memcmp(buf, "ab", 2) == 0);
            rb_tokenizer_destroy(t);
            t = NULL;
        }
    }
}

/* ---- 5. bad metadata ------------------------------------------------------ */

static void expect_error(const vspec *v, rb_status want, const char *needle)
{
    rb_tokenizer *t = NULL;
    rb_error err = { 0 };
    rb_status st = build(v, &t, &err);
    CHECK_EQ_INT(st, want);
    CHECK(t == NULL);
    CHECK_CONTAINS(err.message, needle);
    rb_tokenizer_destroy(t);
}

static void test_bad_metadata(void)
{
    const char *toks[] = { "<unk>", "<s>", "</s>", "a", "b", "ab" };
    const float scores[] = { 0, 0, 0, -1, -1, -2 };
    const int32_t types[] = { 2, 3, 3, 1, 1, 1 };
    vspec ok = { "llama", NULL, 6, toks, scores, types, 0, NULL, 1, 2, 0, -1, 0, 0, 0, 0 };
    rb_tokenizer *t = NULL;
    CHECK(build(&ok, &t, NULL) == RB_OK);
    rb_tokenizer_destroy(t);

    vspec v = ok;
    v.no_tokens = 1;
    expect_error(&v, RB_E_FORMAT, "tokenizer.ggml.tokens");
    v = ok;
    v.no_model = 1;
    expect_error(&v, RB_E_FORMAT, "tokenizer.ggml.model");
    v = ok;
    v.model = "t5";
    expect_error(&v, RB_E_UNSUPPORTED, "tokenizer.ggml.model");
    v = ok;
    v.scores_short = 1;
    expect_error(&v, RB_E_FORMAT, "tokenizer.ggml.scores");
    v = ok;
    v.types_u8 = 1;
    expect_error(&v, RB_E_FORMAT, "tokenizer.ggml.token_type");
    v = ok;
    v.bos = 6;
    expect_error(&v, RB_E_FORMAT, "tokenizer.ggml.bos_token_id");
    v = ok;
    v.eos = 1000;
    expect_error(&v, RB_E_FORMAT, "tokenizer.ggml.eos_token_id");
    v = ok;
    const char *dup[] = { "<unk>", "<s>", "</s>", "a", "b", "a" };
    v.tokens = dup;
    expect_error(&v, RB_E_FORMAT, "twice");

    const int32_t btypes[] = { 1, 1, 1, 1, 1, 1 };
    const char *bad_merge[] = { "a b", "ab" };
    vspec b = { "gpt2", "gpt-2", 6, toks, NULL, btypes, 2, bad_merge, 2, 2, -1, 0, 0, 0, 0, 0 };
    expect_error(&b, RB_E_FORMAT, "tokenizer.ggml.merges[1]");
    b.merges = NULL;
    b.n_merges = 0;
    expect_error(&b, RB_E_FORMAT, "tokenizer.ggml.merges");
    b.merges = bad_merge;
    b.n_merges = 1;
    b.pre = "no-such-pre";
    expect_error(&b, RB_E_UNSUPPORTED, "tokenizer.ggml.pre");
    b.pre = "gpt-2";
    b.add_bos = 1;
    b.bos = -1; /* default 11 is out of range -> none */
    expect_error(&b, RB_E_FORMAT, "add_bos_token");

    rb_error err;
    CHECK(rb_tokenizer_create(NULL, &t, &err) == RB_E_INVALID_ARG);
}

/* ---- 6. timing ------------------------------------------------------------ */

static void time_encode(const rb_tokenizer *t, const char *name)
{
    static const char para[] =
        "The robot walked into the old library and looked at the shelves. "
        "It had never seen so many books! \"Where do I start?\" it asked, "
        "scanning titles from 1984 to 2024. The librarian's cat, Mr. Whiskers, "
        "yawned.\n\n";
    char *text = malloc(10240 + sizeof para);
    size_t n = 0;
    while (n + sizeof para - 1 <= 10240) {
        memcpy(text + n, para, sizeof para - 1);
        n += sizeof para - 1;
    }
    int32_t *ids = malloc(n * sizeof *ids);
    size_t nt = 0;
    double best = 1e9;
    for (int r = 0; r < 5; r++) {
        double t0 = now_ms();
        rb_tokenizer_encode(t, text, n, 1, 1, ids, n, &nt, NULL);
        double dt = now_ms() - t0;
        if (dt < best)
            best = dt;
    }
    printf("  encode %zu bytes -> %zu tokens (%s): %.2f ms\n", n, nt, name, best);
    CHECK(nt > 1000);
    CHECK(best < 100.0); /* target < 10 ms; loose for sanitizer builds */
    free(ids);
    free(text);
}

static void test_timing_large_vocab(void)
{
    rb_vocab_synth s;
    rb_tokenizer *t = NULL;
    CHECK(rb_vocab_synth_bpe(152000, &s) == RB_OK);
    char path[1024];
    snprintf(path, sizeof path, "%s/test_tokenizer_big_%d.gguf", REBOUND_TEST_TMP, (int)getpid());
    rb_gguf_writer *w;
    CHECK(rb_gguf_writer_create(path, 0, NULL, &w, NULL) == RB_OK);
    rb_gguf_writer_set_str(w, "tokenizer.ggml.model", s.model);
    rb_gguf_writer_set_str(w, "tokenizer.ggml.pre", s.pre);
    rb_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", s.n_tokens,
                                 (const char *const *)s.tokens);
    rb_gguf_writer_set_array(w, "tokenizer.ggml.token_type", RB_GGUF_I32, s.n_tokens,
                             s.token_types);
    rb_gguf_writer_set_str_array(w, "tokenizer.ggml.merges", s.n_merges,
                                 (const char *const *)s.merges);
    rb_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", s.eos_id);
    rb_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", s.bos_id);
    CHECK(rb_gguf_writer_begin_data(w) == RB_OK && rb_gguf_writer_finish(w) == RB_OK);
    rb_gguf_writer_destroy(w);
    rb_gguf *g;
    CHECK(rb_gguf_open(path, 0, NULL, &g, NULL) == RB_OK);
    double best = 1e9;
    for (int r = 0; r < 3; r++) {
        double t0 = now_ms();
        rb_status st = rb_tokenizer_create(g, &t, NULL);
        double dt = now_ms() - t0;
        CHECK(st == RB_OK);
        if (dt < best)
            best = dt;
        if (r < 2)
            rb_tokenizer_destroy(t);
    }
    rb_gguf_close(g);
    unlink(path);
    printf("  load %u tokens + %u merges: %.1f ms\n", s.n_tokens, s.n_merges, best);
    CHECK(best < 500.0); /* target < 50 ms; loose for sanitizer builds */
    if (t) {
        time_encode(t, "synthetic bpe 152000");
        rb_tokenizer_destroy(t);
    }
    rb_vocab_synth_free(&s);
}

/* The public piece and detokenizer functions on synthetic models: the
 * first piece's space dropped for an add_space_prefix vocabulary, kept for
 * a continuation and for a vocabulary without the prefix (gemma3's). */
static char *detok_all(rb_model *m, unsigned flags, const int32_t *ids, size_t n)
{
    rb_detokenizer *d = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_detokenizer_create_flags(m, flags, &d, &err), RB_OK);
    if (!d)
        return NULL;
    size_t cap = rb_detokenizer_max_bytes(d), w = 0;
    char *out = malloc(n * cap + cap + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(rb_detokenizer_push(d, ids[i], out + w, cap, &k), RB_OK);
        w += k;
    }
    CHECK_EQ_INT(rb_detokenizer_flush(d, out + w, cap, &k), RB_OK);
    w += k;
    out[w] = 0;
    rb_detokenizer_destroy(d);
    return out;
}

static void test_public_pieces(void)
{
    const char *shapes[] = {"tiny", "gemma3-270m"};
    for (int k = 0; k < 2; k++) {
        char path[600];
        snprintf(path, sizeof path, "%s/tok_public_%d.gguf", REBOUND_TEST_TMP, k);
        CHECK_EQ_INT(rb_test_make_model(path, &(rb_test_model_spec){
                                                  .shape = shapes[k], .n_embd = 64, .n_layers = 1,
                                                  .n_head = 2, .n_head_kv = 1, .head_dim = 32,
                                                  .n_ff = 64, .n_vocab = 400, .n_ctx = 64,
                                                  .kind = "f32", .seed = 1}),
                     RB_OK);
        rb_error err;
        rb_model *m = NULL;
        CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
        if (!m)
            continue;
        int32_t ids[64];
        size_t n = 0;
        const char *text = k == 0 ? "Hello world" : " Hello world";
        CHECK_EQ_INT(rb_model_tokenize(m, text, strlen(text), 1, 0, ids, 64, &n), RB_OK);
        CHECK(n >= 2 && ids[0] == rb_model_token_bos(m));
        /* pieces: BOS is "" unless special; the rest joins to the text
           with the space prefix's (or the user's) space */
        char buf[64], all[256] = "";
        size_t len = 0;
        CHECK_EQ_INT(rb_model_token_to_piece(m, ids[0], 0, buf, sizeof buf, &len), RB_OK);
        CHECK_EQ_INT(len, 0);
        CHECK_EQ_INT(rb_model_token_to_piece(m, ids[0], 1, buf, sizeof buf, &len), RB_OK);
        CHECK_STR_EQ(buf, "<s>");
        CHECK_EQ_INT(rb_model_token_to_piece(m, ids[0], 1, NULL, 0, &len), RB_OK);
        CHECK_EQ_INT(len, 3);
        CHECK_EQ_INT(rb_model_token_to_piece(m, ids[0], 1, buf, 2, &len), RB_OK);
        CHECK_STR_EQ(buf, "<");
        for (size_t i = 1; i < n; i++) {
            CHECK_EQ_INT(rb_model_token_to_piece(m, ids[i], 0, buf, sizeof buf, &len), RB_OK);
            strncat(all, buf, sizeof all - strlen(all) - 1);
        }
        CHECK_STR_EQ(all, " Hello world");
        CHECK_EQ_INT(rb_model_token_to_piece(m, 400, 0, buf, sizeof buf, &len), RB_E_INVALID_ARG);
        CHECK_EQ_INT(rb_model_token_to_piece(m, -1, 0, buf, sizeof buf, &len), RB_E_INVALID_ARG);
        /* the detokenizer: a text's first space is the prefix's (dropped)
           only with add_space_prefix; a continuation keeps it */
        char *d0 = detok_all(m, 0, ids, n), *d1 = detok_all(m, RB_DETOKENIZER_CONTINUATION, ids, n);
        CHECK_STR_EQ(d0, k == 0 ? "Hello world" : " Hello world");
        CHECK_STR_EQ(d1, " Hello world");
        free(d0);
        free(d1);
        rb_detokenizer *d = NULL;
        CHECK_EQ_INT(rb_detokenizer_create_flags(m, 8, &d, &err), RB_E_INVALID_ARG);
        CHECK(d == NULL);
        rb_model_close(m);
        remove(path);
    }
}

int main(void)
{
    printf("public pieces and detokenizer\n");
    test_public_pieces();
    printf("splits\n");
    test_splits();
    printf("synthetic vocabularies\n");
    test_synthetic();
    printf("bad metadata\n");
    test_bad_metadata();
    printf("timing\n");
    test_timing_large_vocab();

    char probe[1024];
    snprintf(probe, sizeof probe, "%s/stories260K.gguf", REBOUND_MODELS_DIR);
    if (access(probe, R_OK) != 0) {
        printf("reference models not found in %s: golden tokenizer cases skipped\n",
               REBOUND_MODELS_DIR);
        return check_report();
    }
    printf("golden cases (llama.cpp ids)\n");
    run_tsv("stories260K.gguf", "golden/stories260K/tokenizer-cases.tsv");
    run_tsv("parity-Q8_0.gguf", "golden/parity/tokenizer-cases-llama-spm.tsv");
    run_tsv("parity-qwen3-Q8_0.gguf", "golden/parity-qwen3/tokenizer-cases-gpt2.tsv");
    run_tsv("parity-gemma3-Q8_0.gguf", "golden/parity-gemma3/tokenizer-cases-spm-no-space-prefix.tsv");
    test_gpt2_vocab_vectors();
    test_golden_decode("stories260K.gguf", "stories260K");
    test_golden_decode("parity-Q8_0.gguf", "parity/Q8_0");
    test_golden_decode("parity-qwen3-Q8_0.gguf", "parity-qwen3");
    test_golden_decode("parity-gemma3-Q8_0.gguf", "parity-gemma3");

    const char *models[] = { "stories260K.gguf", "parity-Q8_0.gguf", "parity-qwen3-Q8_0.gguf" };
    for (int i = 0; i < 3; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", REBOUND_MODELS_DIR, models[i]);
        double t0 = now_ms();
        rb_tokenizer *t = open_tok(path);
        double dt = now_ms() - t0;
        CHECK(t != NULL);
        if (!t)
            continue;
        printf("  %s: open + load %.1f ms\n", models[i], dt);
        int32_t ids[64];
        char buf[256];
        size_t m, n;
        if (rb_tokenizer_get_kind(t) == RB_TOKENIZER_SPM) {
            /* "<s>" in the text: BOS only with parse_special; the text
             * after it gets the prefix space again */
            n = encode(t, "<s>Hi", 5, 0, 1, ids, 64);
            CHECK(n >= 2 && ids[0] == 1);
            int len = rb_tokenizer_piece(t, ids[1], buf, sizeof buf);
            CHECK(len >= 1 && buf[0] == ' ');
            n = encode(t, "<s>Hi", 5, 0, 0, ids, 64);
            CHECK(n >= 2 && ids[0] != 1);
        } else {
            /* llama_detokenize's clean_spaces for the gpt-2 pre-tokenizer */
            const char *s = "a , b ' c it 's";
            n = encode(t, s, strlen(s), 0, 0, ids, 64);
            CHECK(rb_tokenizer_decode(t, ids, n, 0, buf, sizeof buf, &m, NULL) == RB_OK);
            CHECK(m == 11 && memcmp(buf, "a, b'c it's", 11) == 0);
            n = encode(t, "<|endoftext|>", 13, 0, 1, ids, 64);
            CHECK(n == 1 && ids[0] == 50256 && rb_tokenizer_is_eog(t, ids[0]));
            CHECK_EQ_INT(rb_tokenizer_nl(t), 198);
        }
        round_trips(t, models[i]);
        test_detok_invalid(t);
        time_encode(t, models[i]);
        rb_tokenizer_destroy(t);
    }
    return check_report();
}
