/*
 * tokenizer.c - vocabulary loading, encoding (SentencePiece BPE and GPT-2
 * byte-level BPE), pieces, detokenization and the streaming detokenizer.
 * The word splits of byte-level BPE live in tokenizer_pre.c.
 *
 * It reproduces llama.cpp's llama-vocab.cpp (the reference for every id in
 * tests/test_tokenizer.c); where llama.cpp's behaviour is odd it is kept and
 * said so. It does not do chat templates or sampling.
 *
 * Memory (all from malloc at create, freed by destroy; nothing global):
 *
 *   arena      token texts back to back, then "extra" strings: merge halves
 *              and merge results that are not vocabulary tokens (GPT-2 BPE
 *              works on strings; interning them lets merges work on ids)
 *   text_off   [n_strings + 1] offsets into arena (ids >= n_vocab: extras)
 *   pieces     what each token decodes to (llama.cpp's token_to_piece
 *              cache, special = true), piece_off [n_vocab + 1]
 *   attr       [n_vocab] RB_TOKEN_ATTR_* bits;  scores [n_vocab] (SPM)
 *   str_ht     open-addressing hash, string -> id (power of two, <= 50% full)
 *   merge_ht   open-addressing hash, (left id, right id) -> (rank, result id)
 *   specials   ids of CONTROL/USER_DEFINED/UNKNOWN tokens, longest text
 *              first (ties by id), for the special-token partition
 *
 * A 152k-token vocabulary with 152k merges takes ~15 MB here, half of it
 * merge_ht (2^19 slots of 16 bytes); it loads in ~27 ms (create only,
 * measured in tests/test_tokenizer.c on the 2-core AVX2 dev machine).
 *
 * Invariants: every string in arena is distinct (duplicates are refused at
 * load, as llama.cpp refuses them); every merge's halves and result have an
 * id; ids < n_vocab are tokens.
 *
 * Encoding allocates its scratch per call (symbols, heap, code points), so a
 * tokenizer is shared read-only between threads.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status.h"
#include "tokenizer.h"
#include "unicode_tables.h"

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER_DEFINED = 4,
       TT_UNUSED = 5, TT_BYTE = 6 };

typedef struct merge_slot {
    uint64_t key;    /* (left << 32) | right, UINT64_MAX when empty */
    int32_t rank;
    int32_t result;  /* id of left+right */
} merge_slot;

struct rb_tokenizer {
    rb_tokenizer_kind kind;
    rb_pretok pretok;
    uint32_t n_vocab;
    uint32_t n_strings;      /* n_vocab + extras */

    char *arena;
    size_t arena_len, arena_cap;
    uint32_t *text_off;      /* [n_strings + 1] */
    size_t text_off_cap;

    char *pieces;
    uint32_t *piece_off;     /* [n_vocab + 1] */
    size_t max_piece;

    float *scores;
    uint8_t *attr;

    int32_t *str_ht;         /* ids, -1 empty */
    uint64_t str_mask;

    merge_slot *merge_ht;
    uint64_t merge_mask;

    int32_t *specials;
    uint32_t n_specials;

    int32_t byte_sym[256];    /* BPE: id of the byte's GPT-2 character */
    int32_t byte_single[256]; /* BPE: token of the one-byte string, or -1 */
    int32_t spm_byte[256];    /* SPM: token of <0xXX> (or the byte itself) */
    unsigned char bmap[256][2]; /* GPT-2 bytes_to_unicode, UTF-8 */
    uint8_t bmap_len[256];
    int16_t byte_of_cp[0x144]; /* inverse of bmap by code point, -1 if none */

    int32_t bos, eos, eot, eom, unk, pad, nl;
    int add_bos, add_eos, add_space_prefix, ignore_merges, clean_spaces;
};

/* ------------------------------------------------------------------------ */
/* hashing                                                                   */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a: tokens are short */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t hash_pair(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ (key >> 31);
}

/* memmem, which C11 lacks: the first occurrence of needle in hay, or NULL. */
static const char *find_bytes(const char *hay, size_t n, const char *needle,
                              size_t m)
{
    if (m == 0 || m > n)
        return m == 0 ? hay : NULL;
    const char *end = hay + (n - m);
    for (const char *p = hay; p <= end;) {
        p = memchr(p, needle[0], (size_t)(end - p) + 1);
        if (!p)
            return NULL;
        if (memcmp(p, needle, m) == 0)
            return p;
        p++;
    }
    return NULL;
}

static inline const char *str_at(const rb_tokenizer *t, int32_t id, size_t *len)
{
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->arena + t->text_off[id];
}

/* Id of the string s[0..n) (vocabulary or extra), or -1. */
static int32_t str_find(const rb_tokenizer *t, const char *s, size_t n)
{
    for (uint64_t i = hash_bytes(s, n) & t->str_mask;; i = (i + 1) & t->str_mask) {
        int32_t id = t->str_ht[i];
        if (id < 0)
            return -1;
        size_t len;
        const char *p = str_at(t, id, &len);
        if (len == n && memcmp(p, s, n) == 0)
            return id;
    }
}

static void str_insert_id(rb_tokenizer *t, const char *s, size_t n, int32_t id)
{
    uint64_t i = hash_bytes(s, n) & t->str_mask;
    while (t->str_ht[i] >= 0)
        i = (i + 1) & t->str_mask;
    t->str_ht[i] = id;
}

static rb_status grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return RB_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q)
        return RB_E_NOMEM;
    *p = q;
    *cap = c;
    return RB_OK;
}

/* Rebuilds str_ht for capacity >= 2 * n (all strings re-inserted). */
static rb_status str_rehash(rb_tokenizer *t, uint64_t n)
{
    uint64_t size = 1024;
    while (size < 2 * n)
        size *= 2;
    int32_t *ht = malloc(size * sizeof *ht);
    if (!ht)
        return RB_E_NOMEM;
    memset(ht, 0xff, size * sizeof *ht);
    free(t->str_ht);
    t->str_ht = ht;
    t->str_mask = size - 1;
    for (uint32_t id = 0; id < t->n_strings; id++) {
        size_t len;
        const char *s = str_at(t, id, &len);
        str_insert_id(t, s, len, (int32_t)id);
    }
    return RB_OK;
}

/* Id of s[0..n), adding it as an extra string when absent; -1 on NOMEM. */
static int32_t str_intern(rb_tokenizer *t, const char *s, size_t n)
{
    int32_t id = str_find(t, s, n);
    if (id >= 0)
        return id;
    if ((uint64_t)(t->n_strings + 1) * 2 > t->str_mask + 1 &&
        str_rehash(t, (uint64_t)t->n_strings * 2 + 2) != RB_OK)
        return -1;
    if (t->n_strings >= INT32_MAX - 1 ||
        grow((void **)&t->arena, &t->arena_cap, t->arena_len + n, 1) != RB_OK ||
        grow((void **)&t->text_off, &t->text_off_cap, (size_t)t->n_strings + 2,
             sizeof *t->text_off) != RB_OK)
        return -1;
    /* s may point into arena: memmove after the grow would be wrong, so
     * the caller never passes arena memory (see merge loading). */
    memcpy(t->arena + t->arena_len, s, n);
    t->arena_len += n;
    id = (int32_t)t->n_strings++;
    t->text_off[t->n_strings] = (uint32_t)t->arena_len;
    str_insert_id(t, s, n, id);
    return id;
}

static const merge_slot *merge_find(const rb_tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint64_t i = hash_pair(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const merge_slot *m = &t->merge_ht[i];
        if (m->key == key)
            return m;
        if (m->key == UINT64_MAX)
            return NULL;
    }
}

/* ------------------------------------------------------------------------ */
/* GPT-2 byte mapping                                                         */

/* bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68
 * to U+0100.. in byte order. */
static void init_byte_map(rb_tokenizer *t)
{
    uint32_t next = 256;
    for (int c = 0; c < 0x144; c++)
        t->byte_of_cp[c] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) ||
                        (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : next++;
        t->bmap_len[b] = (uint8_t)rb_utf8_encode(cp, t->bmap[b]);
        t->byte_of_cp[cp] = (int16_t)b;
    }
}

/* Inverse of the byte map for one code point; -1 when it is not an image.
 * The images are U+0021..U+00FF (minus the 34 non-printable ones) and
 * U+0100..U+0143. */
static int byte_of_cp(const rb_tokenizer *t, uint32_t cp)
{
    return cp < 0x144 ? t->byte_of_cp[cp] : -1;
}

/* ------------------------------------------------------------------------ */
/* growable byte / id buffers used while encoding and decoding                */

typedef struct bytebuf {
    char *p;
    size_t n, cap;
    int oom;
} bytebuf;

static void bb_put(bytebuf *b, const void *s, size_t n)
{
    if (b->oom)
        return;
    if (grow((void **)&b->p, &b->cap, b->n + n + 1, 1) != RB_OK) {
        b->oom = 1;
        return;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

typedef struct idbuf {
    int32_t *p;
    size_t n, cap;
    int oom;
} idbuf;

static void ib_push(idbuf *b, int32_t id)
{
    if (b->oom)
        return;
    if (grow((void **)&b->p, &b->cap, b->n + 1, sizeof *b->p) != RB_OK) {
        b->oom = 1;
        return;
    }
    b->p[b->n++] = id;
}

/* ------------------------------------------------------------------------ */
/* pieces (llama.cpp's token_to_piece, special = true)                        */

/* Appends token id's piece to out. */
static void make_piece(const rb_tokenizer *t, int32_t id, bytebuf *out)
{
    size_t len;
    const char *s = str_at(t, id, &len);
    unsigned a = t->attr[id];
    if (a & (RB_TOKEN_ATTR_UNKNOWN | RB_TOKEN_ATTR_CONTROL | RB_TOKEN_ATTR_USER_DEFINED)) {
        bb_put(out, s, len);
        return;
    }
    if (a & RB_TOKEN_ATTR_NORMAL) {
        if (t->kind == RB_TOKENIZER_SPM) { /* U+2581 -> ' ' */
            for (size_t i = 0; i < len;) {
                if (i + 3 <= len && memcmp(s + i, "\xe2\x96\x81", 3) == 0) {
                    bb_put(out, " ", 1);
                    i += 3;
                } else {
                    bb_put(out, s + i, 1);
                    i++;
                }
            }
        } else { /* llama_decode_text: each character back to its byte */
            for (size_t i = 0; i < len;) {
                uint32_t cp = rb_utf8_decode_lenient((const unsigned char *)s, len, &i);
                int b = byte_of_cp(t, cp);
                if (b >= 0) {
                    unsigned char c = (unsigned char)b;
                    bb_put(out, &c, 1);
                } else { /* llama.cpp writes this marker; kept verbatim */
                    unsigned char u[4];
                    size_t un = rb_utf8_encode(cp, u);
                    char hex[16];
                    bb_put(out, "[UNK_BYTE_0x", 12);
                    for (size_t k = 0; k < un; k++) {
                        snprintf(hex, sizeof hex, "%02x", u[k]);
                        bb_put(out, hex, 2);
                    }
                    bb_put(out, s, len);
                    bb_put(out, "]", 1);
                }
            }
        }
        return;
    }
    if (a & RB_TOKEN_ATTR_BYTE) { /* "<0xXX>": llama.cpp reads text[3..5) */
        if (len >= 5) {
            char hex[3] = { s[3], s[4], 0 };
            unsigned char c = (unsigned char)strtol(hex, NULL, 16);
            bb_put(out, &c, 1);
        }
        return;
    }
    /* UNUSED / UNDEFINED: nothing */
}

/* ------------------------------------------------------------------------ */
/* loading                                                                    */

static int streq(rb_gguf_str s, const char *c)
{
    return rb_gguf_str_eq(s, c);
}

/* Reads an optional token-id key into *id. UINT32_MAX / -1 mean "none".
 * strict: an id >= n_vocab is an error (else it is ignored, as llama.cpp
 * ignores it with a warning). */
static rb_status read_id(const rb_gguf *g, const char *key, uint32_t n_vocab,
                         int strict, int32_t *id, rb_error *err)
{
    const rb_gguf_kv *kv = rb_gguf_find_kv(g, key);
    if (!kv)
        return RB_OK;
    int64_t v;
    switch (kv->value.type) {
    case RB_GGUF_U8: case RB_GGUF_U16: case RB_GGUF_U32: case RB_GGUF_U64:
        v = kv->value.v.u64 == UINT32_MAX || kv->value.v.u64 > INT64_MAX
                ? -1 : (int64_t)kv->value.v.u64;
        break;
    case RB_GGUF_I8: case RB_GGUF_I16: case RB_GGUF_I32: case RB_GGUF_I64:
        v = kv->value.v.i64;
        break;
    default:
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' has type %s, "
                            "expected an integer", key,
                            rb_gguf_type_name(kv->value.type));
    }
    if (v < 0) {
        *id = RB_TOKEN_NULL;
        return RB_OK;
    }
    if ((uint64_t)v >= n_vocab) {
        if (strict)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' = %lld is "
                                "out of range (n_vocab %u)", key, (long long)v,
                                n_vocab);
        return RB_OK;
    }
    *id = (int32_t)v;
    return RB_OK;
}

static rb_status read_bool(const rb_gguf *g, const char *key, int *out,
                           rb_error *err)
{
    int v;
    rb_status st = rb_gguf_get_bool(g, key, &v);
    if (st == RB_E_NOT_FOUND)
        return RB_OK;
    if (st != RB_OK)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' is not a bool", key);
    *out = v;
    return RB_OK;
}

/* Whether text is one of llama.cpp's end-of-generation token texts. */
static int is_eog_text(const char *s, size_t n)
{
    static const char *const k[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",
        "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
        "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strlen(k[i]) == n && memcmp(k[i], s, n) == 0)
            return 1;
    return 0;
}

/* llama.cpp's EOT auto-detection list (a subset of the EOG texts). */
static int is_eot_text(const char *s, size_t n)
{
    static const char *const k[] = {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
        "<end_of_utterance>",
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strlen(k[i]) == n && memcmp(k[i], s, n) == 0)
            return 1;
    return 0;
}

/* FIM pad / repo / file-sep texts: llama.cpp puts them in the EOG set. */
static int is_fim_eog_text(const char *s, size_t n)
{
    static const char *const k[] = {
        "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
        "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
        "<|file_sep|>",
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strlen(k[i]) == n && memcmp(k[i], s, n) == 0)
            return 1;
    return 0;
}

/* FIM prefix/suffix/middle texts: llama.cpp forces them to CONTROL. */
static int is_fim_text(const char *s, size_t n)
{
    static const char *const k[] = {
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>",
        "\xe2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "begin\xef\xbd\x9c>",
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>",
        "\xe2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "hole\xef\xbd\x9c>",
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>",
        "\xe2\x96\x81<MID>", "<|code_middle|>", "<|middle|>",
        "<\xef\xbd\x9c" "fim\xe2\x96\x81" "end\xef\xbd\x9c>",
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strlen(k[i]) == n && memcmp(k[i], s, n) == 0)
            return 1;
    return 0;
}

/* (text length, id) of a special token, for sorting: longest first, then
 * by id (llama.cpp's std::sort leaves ties unordered; ids make it stable) */
typedef struct special_key {
    uint32_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b)
{
    const special_key *x = a, *y = b;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static rb_status load_merges(rb_tokenizer *t, const rb_gguf *g, rb_error *err)
{
    const char *key = "tokenizer.ggml.merges";
    rb_gguf_array a;
    rb_status st = rb_gguf_get_array(g, key, UINT32_MAX, &a);
    if (st == RB_E_NOT_FOUND)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' is missing "
                            "(required by tokenizer.ggml.model 'gpt2')", key);
    if (st != RB_OK || a.type != RB_GGUF_STRING)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' is not an array "
                            "of strings", key);
    if (a.n >= (1u << 24)) /* ranks become float priorities (exact < 2^24) */
        return rb_error_set(err, RB_E_UNSUPPORTED, "tokenizer: '%s' has %llu "
                            "merges (at most 16777215)", key,
                            (unsigned long long)a.n);
    uint64_t size = 1024;
    while (size < 2 * a.n + 2)
        size *= 2;
    t->merge_ht = malloc(size * sizeof *t->merge_ht);
    if (!t->merge_ht)
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    for (uint64_t i = 0; i < size; i++)
        t->merge_ht[i].key = UINT64_MAX;
    t->merge_mask = size - 1;

    char *tmp = NULL; /* halves and their concatenation, outside the arena */
    size_t tmp_cap = 0;
    for (uint64_t r = 0; r < a.n; r++) {
        rb_gguf_value v;
        if (rb_gguf_array_get(&a, r, &v) != RB_OK || v.type != RB_GGUF_STRING) {
            free(tmp);
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: %s[%llu] is not "
                                "a string", key, (unsigned long long)r);
        }
        const char *s = v.v.str.ptr;
        size_t n = (size_t)v.v.str.len;
        /* llama.cpp: word.find(' ', 1) */
        const char *sp = n > 1 ? memchr(s + 1, ' ', n - 1) : NULL;
        if (!sp) {
            free(tmp);
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: %s[%llu] '%.*s' "
                                "has no space between its two halves", key,
                                (unsigned long long)r, (int)(n > 64 ? 64 : n), s);
        }
        size_t nl = (size_t)(sp - s), nr = n - nl - 1;
        if (grow((void **)&tmp, &tmp_cap, n, 1) != RB_OK) {
            free(tmp);
            return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
        }
        int32_t left = str_intern(t, s, nl);
        int32_t right = left < 0 ? -1 : str_intern(t, sp + 1, nr);
        memcpy(tmp, s, nl);
        memcpy(tmp + nl, sp + 1, nr);
        int32_t res = right < 0 ? -1 : str_intern(t, tmp, nl + nr);
        if (res < 0) {
            free(tmp);
            return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
        }
        uint64_t k = ((uint64_t)(uint32_t)left << 32) | (uint32_t)right;
        uint64_t i = hash_pair(k) & t->merge_mask;
        while (t->merge_ht[i].key != UINT64_MAX && t->merge_ht[i].key != k)
            i = (i + 1) & t->merge_mask;
        if (t->merge_ht[i].key == UINT64_MAX) { /* first rank wins (emplace) */
            t->merge_ht[i].key = k;
            t->merge_ht[i].rank = (int32_t)r;
            t->merge_ht[i].result = res;
        }
    }
    free(tmp);
    return RB_OK;
}

static rb_status encode_vec(const rb_tokenizer *t, const char *text, size_t len,
                            int add_special, int parse_special, idbuf *out);

static rb_status create_body(rb_tokenizer *t, const rb_gguf *g, rb_error *err)
{
    rb_status st;
    rb_gguf_str model;
    st = rb_gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (st == RB_E_NOT_FOUND)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.model' is missing");
    if (st != RB_OK)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.model' is not a string");
    if (streq(model, "llama")) {
        t->kind = RB_TOKENIZER_SPM;
        t->bos = 1, t->eos = 2, t->unk = 0;
        t->add_space_prefix = 1, t->add_bos = 1;
    } else if (streq(model, "gpt2")) {
        t->kind = RB_TOKENIZER_BPE;
        t->bos = 11, t->eos = 11; /* llama.cpp's defaults for gpt2 */
        t->clean_spaces = 1;
        rb_gguf_str pre = { NULL, 0 };
        const rb_gguf_kv *kv = rb_gguf_find_kv(g, "tokenizer.ggml.pre");
        if (kv && kv->value.type != RB_GGUF_STRING)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.pre' is not a string");
        if (kv)
            pre = kv->value.v.str;
        int add_bos = -1;
        if (rb_pretok_from_name(pre.ptr, (size_t)pre.len, &t->pretok,
                                &t->ignore_merges, &add_bos, &t->clean_spaces) != RB_OK)
            return rb_error_set(err, RB_E_UNSUPPORTED, "tokenizer: pre-tokenizer "
                                "'tokenizer.ggml.pre' = '%.*s' is not supported",
                                (int)(pre.len > 64 ? 64 : pre.len), pre.ptr);
        if (add_bos >= 0)
            t->add_bos = add_bos;
    } else {
        return rb_error_set(err, RB_E_UNSUPPORTED, "tokenizer: 'tokenizer.ggml.model' "
                            "= '%.*s' is not supported (llama, gpt2 are)",
                            (int)(model.len > 64 ? 64 : model.len), model.ptr);
    }
    if ((st = read_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err)))
        return st;

    /* tokens */
    const char *tk = "tokenizer.ggml.tokens";
    rb_gguf_array toks;
    st = rb_gguf_get_array(g, tk, UINT32_MAX, &toks);
    if (st == RB_E_NOT_FOUND)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' is missing", tk);
    if (st != RB_OK || toks.type != RB_GGUF_STRING)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' is not an array of strings", tk);
    if (toks.n == 0 || toks.n >= INT32_MAX / 2)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' has %llu tokens",
                            tk, (unsigned long long)toks.n);
    uint32_t n = (uint32_t)toks.n;
    t->n_vocab = n;

    /* scores (f32 or i32), token types (i32) */
    rb_gguf_array scores = { 0 }, types = { 0 };
    int has_scores = 0, has_types = 0;
    st = rb_gguf_get_array(g, "tokenizer.ggml.scores", UINT32_MAX, &scores);
    if (st == RB_OK) {
        if (scores.type != RB_GGUF_F32 && scores.type != RB_GGUF_I32)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.scores' "
                                "is an array of %s (f32 or i32 expected)",
                                rb_gguf_type_name(scores.type));
        if (scores.n < n)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.scores' "
                                "has %llu entries for %u tokens",
                                (unsigned long long)scores.n, n);
        has_scores = 1;
    } else if (st != RB_E_NOT_FOUND) {
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.scores' is not an array");
    }
    st = rb_gguf_get_array(g, "tokenizer.ggml.token_type", UINT32_MAX, &types);
    if (st == RB_OK) {
        if (types.type != RB_GGUF_I32)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.token_type' "
                                "is an array of %s (i32 expected)",
                                rb_gguf_type_name(types.type));
        if (types.n < n)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.token_type' "
                                "has %llu entries for %u tokens",
                                (unsigned long long)types.n, n);
        has_types = 1;
    } else if (st != RB_E_NOT_FOUND) {
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.token_type' is not an array");
    }

    /* texts into the arena; an empty token becomes "[EMPTY_<id>]" as in
     * llama.cpp */
    size_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        rb_gguf_value v;
        if (rb_gguf_array_get(&toks, i, &v) != RB_OK)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: %s[%u] unreadable", tk, i);
        total += v.v.str.len ? (size_t)v.v.str.len : 20;
    }
    if (total >= UINT32_MAX / 2)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' holds %zu bytes", tk, total);
    if (grow((void **)&t->arena, &t->arena_cap, total + 1, 1) ||
        grow((void **)&t->text_off, &t->text_off_cap, (size_t)n + 1, sizeof *t->text_off))
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    t->scores = calloc(n, sizeof *t->scores);
    t->attr = calloc(n, 1);
    if (!t->scores || !t->attr)
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    t->text_off[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        rb_gguf_value v;
        rb_gguf_array_get(&toks, i, &v);
        if (v.v.str.len == 0) {
            int k = snprintf(t->arena + t->arena_len, 20, "[EMPTY_%u]", i);
            t->arena_len += (size_t)k;
        } else {
            memcpy(t->arena + t->arena_len, v.v.str.ptr, (size_t)v.v.str.len);
            t->arena_len += (size_t)v.v.str.len;
        }
        t->text_off[i + 1] = (uint32_t)t->arena_len;
        if (has_scores) {
            rb_gguf_array_get(&scores, i, &v);
            t->scores[i] = scores.type == RB_GGUF_F32 ? (float)v.v.f64 : (float)v.v.i64;
        }
        unsigned a = RB_TOKEN_ATTR_NORMAL;
        if (has_types) {
            rb_gguf_array_get(&types, i, &v);
            switch (v.v.i64) {
            case TT_NORMAL: a = RB_TOKEN_ATTR_NORMAL; break;
            case TT_UNKNOWN: a = RB_TOKEN_ATTR_UNKNOWN; break;
            case TT_CONTROL: a = RB_TOKEN_ATTR_CONTROL; break;
            case TT_USER_DEFINED: a = RB_TOKEN_ATTR_USER_DEFINED; break;
            case TT_UNUSED: a = RB_TOKEN_ATTR_UNUSED; break;
            case TT_BYTE: a = RB_TOKEN_ATTR_BYTE; break;
            default: a = 0; break; /* UNDEFINED */
            }
        }
        t->attr[i] = (uint8_t)a;
    }
    t->n_strings = n;
    if ((st = str_rehash(t, n)) != RB_OK)
        return rb_error_set(err, st, "tokenizer: out of memory");
    /* duplicates: str_rehash inserted every id; each must find itself */
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        const char *s = str_at(t, (int32_t)i, &len);
        int32_t j = str_find(t, s, len);
        if (j != (int32_t)i)
            return rb_error_set(err, RB_E_FORMAT, "tokenizer: '%s' has the token "
                                "'%.*s' twice (ids %d and %u)", tk,
                                (int)(len > 64 ? 64 : len), s, j, i);
    }

    if (t->kind == RB_TOKENIZER_BPE && (st = load_merges(t, g, err)) != RB_OK)
        return st;

    /* special ids and add_bos/add_eos */
    static const struct { const char *key; size_t off; int strict; } ids[] = {
        { "tokenizer.ggml.bos_token_id", offsetof(rb_tokenizer, bos), 1 },
        { "tokenizer.ggml.eos_token_id", offsetof(rb_tokenizer, eos), 1 },
        { "tokenizer.ggml.eot_token_id", offsetof(rb_tokenizer, eot), 1 },
        { "tokenizer.ggml.eom_token_id", offsetof(rb_tokenizer, eom), 1 },
        { "tokenizer.ggml.unknown_token_id", offsetof(rb_tokenizer, unk), 1 },
        { "tokenizer.ggml.padding_token_id", offsetof(rb_tokenizer, pad), 0 },
    };
    if ((uint32_t)t->bos >= n) t->bos = RB_TOKEN_NULL; /* defaults out of range */
    if ((uint32_t)t->eos >= n) t->eos = RB_TOKEN_NULL;
    if ((uint32_t)t->unk >= n) t->unk = RB_TOKEN_NULL;
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        int32_t *id = (int32_t *)((char *)t + ids[i].off);
        if ((st = read_id(g, ids[i].key, n, ids[i].strict, id, err)) != RB_OK)
            return st;
    }
    int32_t fim[3] = { RB_TOKEN_NULL, RB_TOKEN_NULL, RB_TOKEN_NULL };
    static const char *const fim_keys[3] = { "tokenizer.ggml.fim_pad_token_id",
        "tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id" };
    for (int i = 0; i < 3; i++)
        if ((st = read_id(g, fim_keys[i], n, 0, &fim[i], err)) != RB_OK)
            return st;
    if ((st = read_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err)) ||
        (st = read_bool(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err)))
        return st;
    if (t->add_bos && t->bos == RB_TOKEN_NULL)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.add_bos_token' "
                            "is true but there is no 'tokenizer.ggml.bos_token_id'");
    if (t->add_eos && t->eos == RB_TOKEN_NULL)
        return rb_error_set(err, RB_E_FORMAT, "tokenizer: 'tokenizer.ggml.add_eos_token' "
                            "is true but there is no 'tokenizer.ggml.eos_token_id'");

    /* end-of-generation set and forced CONTROL types (by token text, as
     * llama.cpp does); eot = the lowest-id EOT-looking token when unset */
    int32_t eot_auto = RB_TOKEN_NULL;
    for (uint32_t i = 0; i < n; i++) {
        size_t len;
        const char *s = str_at(t, (int32_t)i, &len);
        /* every listed text starts with '<', '[', '_' or U+2581 */
        unsigned c0 = (unsigned char)s[0];
        if (len <= 40 && (c0 == '<' || c0 == '[' || c0 == '_' || c0 == 0xE2)) {
            int eot = is_eot_text(s, len);
            int eog = is_eog_text(s, len) || is_fim_eog_text(s, len);
            if (eot && eot_auto == RB_TOKEN_NULL)
                eot_auto = (int32_t)i;
            if (eot || eog || is_fim_text(s, len))
                t->attr[i] |= RB_TOKEN_ATTR_CONTROL;
            if (eog)
                t->attr[i] |= RB_TOKEN_ATTR_EOG;
            if (len == 10 && memcmp(s, "<|eom_id|>", 10) == 0 && t->eom == RB_TOKEN_NULL)
                t->eom = (int32_t)i;
        }
        if ((t->attr[i] & RB_TOKEN_ATTR_CONTROL) && find_bytes(s, len, "unused", 6))
            t->attr[i] |= RB_TOKEN_ATTR_UNUSED;
    }
    if (t->eot == RB_TOKEN_NULL)
        t->eot = eot_auto;
    int32_t eog_ids[6] = { t->eos, t->eot, t->eom, fim[0], fim[1], fim[2] };
    for (int i = 0; i < 6; i++)
        if (eog_ids[i] != RB_TOKEN_NULL)
            t->attr[eog_ids[i]] |= RB_TOKEN_ATTR_EOG;

    /* special tokens, longest text first */
    uint32_t n_sp = 0;
    for (uint32_t i = 0; i < n; i++)
        n_sp += (t->attr[i] & (RB_TOKEN_ATTR_CONTROL | RB_TOKEN_ATTR_USER_DEFINED |
                               RB_TOKEN_ATTR_UNKNOWN)) != 0;
    special_key *keys = malloc((n_sp ? n_sp : 1) * sizeof *keys);
    t->specials = malloc((n_sp ? n_sp : 1) * sizeof *t->specials);
    if (!keys || !t->specials) {
        free(keys);
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    }
    for (uint32_t i = 0; i < n; i++) {
        if (t->attr[i] & (RB_TOKEN_ATTR_CONTROL | RB_TOKEN_ATTR_USER_DEFINED |
                          RB_TOKEN_ATTR_UNKNOWN)) {
            size_t len;
            str_at(t, (int32_t)i, &len);
            keys[t->n_specials++] = (special_key){ (uint32_t)len, (int32_t)i };
        }
    }
    qsort(keys, t->n_specials, sizeof *keys, cmp_special);
    for (uint32_t i = 0; i < t->n_specials; i++)
        t->specials[i] = keys[i].id;
    free(keys);

    /* byte tables */
    init_byte_map(t);
    for (int b = 0; b < 256; b++) {
        char one = (char)b;
        if (t->kind == RB_TOKENIZER_BPE) {
            int32_t id = str_intern(t, (const char *)t->bmap[b], t->bmap_len[b]);
            if (id < 0)
                return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
            t->byte_sym[b] = id;
            id = str_find(t, &one, 1);
            t->byte_single[b] = id >= 0 && (uint32_t)id < n ? id : -1;
        } else {
            char hex[8];
            snprintf(hex, sizeof hex, "<0x%02X>", b);
            int32_t id = str_find(t, hex, 6);
            if (id < 0)
                id = str_find(t, &one, 1);
            t->spm_byte[b] = id >= 0 ? id : t->unk;
        }
    }

    /* pieces */
    bytebuf pb = { 0 };
    t->piece_off = malloc(((size_t)n + 1) * sizeof *t->piece_off);
    if (!t->piece_off)
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    t->piece_off[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t before = pb.n;
        make_piece(t, (int32_t)i, &pb);
        if (pb.n - before > t->max_piece)
            t->max_piece = pb.n - before;
        if (pb.n >= UINT32_MAX / 2)
            pb.oom = 1;
        t->piece_off[i + 1] = (uint32_t)pb.n;
    }
    if (pb.oom) {
        free(pb.p);
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    }
    t->pieces = pb.p ? pb.p : malloc(1);

    /* newline token: SPM's byte token, else the first token of "\n" */
    t->nl = RB_TOKEN_NULL;
    if (t->kind == RB_TOKENIZER_SPM) {
        t->nl = t->spm_byte['\n'];
    } else {
        idbuf ib = { 0 };
        if (encode_vec(t, "\n", 1, 0, 0, &ib) == RB_OK && ib.n > 0)
            t->nl = ib.p[0];
        free(ib.p);
    }
    return RB_OK;
}

rb_status rb_tokenizer_create(const rb_gguf *g, rb_tokenizer **out, rb_error *err)
{
    if (!g || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "tokenizer: NULL argument");
    rb_tokenizer *t = calloc(1, sizeof *t);
    if (!t)
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = t->nl = RB_TOKEN_NULL;
    rb_status st = create_body(t, g, err);
    if (st != RB_OK) {
        rb_tokenizer_destroy(t);
        return st;
    }
    *out = t;
    return RB_OK;
}

void rb_tokenizer_destroy(rb_tokenizer *t)
{
    if (!t)
        return;
    free(t->arena);
    free(t->text_off);
    free(t->pieces);
    free(t->piece_off);
    free(t->scores);
    free(t->attr);
    free(t->str_ht);
    free(t->merge_ht);
    free(t->specials);
    free(t);
}

/* ------------------------------------------------------------------------ */
/* the merge loop shared by SPM and BPE                                       */

typedef struct sym {
    int32_t prev, next;
    uint32_t start, n;   /* bytes of the (escaped / word) text */
    int32_t id;          /* BPE: string id of the symbol's text */
} sym;

/* A candidate merge of symbols left and right. Priority: higher score
 * first (SPM: the merged token's score; BPE: -rank), then smaller left, as
 * llama.cpp's llm_bigram_spm / llm_bigram_bpe comparators. */
typedef struct bigram {
    float score;
    int32_t left, right;
    uint32_t size;       /* SPM: bytes of left+right when queued */
    uint32_t rn;         /* BPE: bytes of right when queued */
    int32_t result;      /* BPE: id of left+right */
} bigram;

typedef struct heap {
    bigram *a;
    size_t n, cap;
    int oom;
} heap;

static inline int better(const bigram *x, const bigram *y)
{
    return x->score > y->score || (x->score == y->score && x->left < y->left);
}

static void heap_push(heap *h, bigram b)
{
    if (h->oom)
        return;
    if (grow((void **)&h->a, &h->cap, h->n + 1, sizeof *h->a) != RB_OK) {
        h->oom = 1;
        return;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!better(&b, &h->a[p]))
            break;
        h->a[i] = h->a[p];
        i = p;
    }
    h->a[i] = b;
}

static bigram heap_pop(heap *h)
{
    bigram top = h->a[0];
    bigram last = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && better(&h->a[c + 1], &h->a[c]))
            c++;
        if (!better(&h->a[c], &last))
            break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n)
        h->a[i] = last;
    return top;
}

/* Scratch reused across fragments and words of one encode call. */
typedef struct scratch {
    sym *syms;
    size_t syms_cap;
    heap h;
    bytebuf text;        /* SPM escaped text / BPE word bytes */
    bytebuf mapped;      /* BPE: the word through the byte map */
    uint32_t *cps;
    uint8_t *fl;
    uint32_t *lens, *tmp;
    size_t cps_cap;
    int oom;
} scratch;

static int scratch_syms(scratch *s, size_t n)
{
    if (grow((void **)&s->syms, &s->syms_cap, n ? n : 1, sizeof *s->syms) != RB_OK)
        s->oom = 1;
    return !s->oom;
}

static void scratch_free(scratch *s)
{
    free(s->syms);
    free(s->h.a);
    free(s->text.p);
    free(s->mapped.p);
    free(s->cps);
    free(s->fl);
    free(s->lens);
    free(s->tmp);
}

/* ------------------------------------------------------------------------ */
/* SPM (llm_tokenizer_spm_session)                                           */

static void spm_try_bigram(const rb_tokenizer *t, scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const sym *a = &s->syms[l], *b = &s->syms[r];
    int32_t id = str_find(t, s->text.p + a->start, a->n + b->n);
    if (id < 0 || (uint32_t)id >= t->n_vocab)
        return;
    bigram bg = { t->scores[id], l, r, a->n + b->n, 0, id };
    heap_push(&s->h, bg);
}

/* Tokenizes one escaped fragment held in s->text. */
static void spm_fragment(const rb_tokenizer *t, scratch *s, idbuf *out)
{
    const char *p = s->text.p;
    size_t n = s->text.n;
    static const uint8_t len_of_hi[16] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4 };
    if (!scratch_syms(s, n))
        return;
    int32_t k = 0;
    for (size_t off = 0; off < n; k++) {
        size_t len = len_of_hi[(unsigned char)p[off] >> 4];
        if (len > n - off)
            len = n - off;
        s->syms[k] = (sym){ k - 1, off + len == n ? -1 : k + 1, (uint32_t)off,
                            (uint32_t)len, -1 };
        off += len;
    }
    s->h.n = 0;
    for (int32_t i = 1; i < k; i++)
        spm_try_bigram(t, s, i - 1, i);
    while (s->h.n > 0 && !s->h.oom) {
        bigram bg = heap_pop(&s->h);
        sym *l = &s->syms[bg.left], *r = &s->syms[bg.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size)
            continue; /* stale: one side merged since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->syms[r->next].prev = bg.left;
        spm_try_bigram(t, s, l->prev, bg.left);
        spm_try_bigram(t, s, bg.left, l->next);
    }
    if (s->h.oom) {
        s->oom = 1;
        return;
    }
    /* resegment: a merged symbol is always a token (merges only form
     * vocabulary strings), so llama.cpp's rev_merge path never triggers;
     * a single character outside the vocabulary becomes byte tokens */
    for (int32_t i = 0; i != -1 && k > 0; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        int32_t id = str_find(t, p + y->start, y->n);
        if (id >= 0 && (uint32_t)id < t->n_vocab) {
            ib_push(out, id);
        } else {
            for (uint32_t j = 0; j < y->n; j++) {
                int32_t b = t->spm_byte[(unsigned char)p[y->start + j]];
                if (b >= 0)
                    ib_push(out, b);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* byte-level BPE (llm_tokenizer_bpe_session)                                */

static void bpe_add_bigram(const rb_tokenizer *t, scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const merge_slot *m = merge_find(t, s->syms[l].id, s->syms[r].id);
    if (!m)
        return;
    bigram bg = { -(float)m->rank, l, r, s->syms[l].n + s->syms[r].n,
                  s->syms[r].n, m->result };
    heap_push(&s->h, bg);
}

/* Merges one word (its UTF-8 bytes in w[0..n)) and appends its tokens. */
static void bpe_word(const rb_tokenizer *t, scratch *s, const unsigned char *w,
                     size_t n, idbuf *out)
{
    if (t->ignore_merges) { /* the whole word when it is a token */
        s->mapped.n = 0;
        for (size_t i = 0; i < n; i++)
            bb_put(&s->mapped, t->bmap[w[i]], t->bmap_len[w[i]]);
        if (s->mapped.oom) {
            s->oom = 1;
            return;
        }
        int32_t id = str_find(t, s->mapped.p, s->mapped.n);
        if (id >= 0 && (uint32_t)id < t->n_vocab) {
            ib_push(out, id);
            return;
        }
    }
    if (!scratch_syms(s, n))
        return;
    /* one symbol per byte: each byte is one GPT-2 character */
    for (size_t i = 0; i < n; i++)
        s->syms[i] = (sym){ (int32_t)i - 1, i + 1 == n ? -1 : (int32_t)i + 1,
                            (uint32_t)i, 1, t->byte_sym[w[i]] };
    s->h.n = 0;
    for (size_t i = 1; i < n; i++)
        bpe_add_bigram(t, s, (int32_t)i - 1, (int32_t)i);
    while (s->h.n > 0 && !s->h.oom) {
        bigram bg = heap_pop(&s->h);
        sym *l = &s->syms[bg.left], *r = &s->syms[bg.right];
        /* llama.cpp compares left+right text with the queued text; with
         * fixed starts that is: both alive and the same lengths */
        if (l->n == 0 || r->n == 0 || l->n + r->n != bg.size || r->n != bg.rn)
            continue;
        l->n += r->n;
        l->id = bg.result;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->syms[r->next].prev = bg.left;
        bpe_add_bigram(t, s, l->prev, bg.left);
        bpe_add_bigram(t, s, bg.left, l->next);
    }
    if (s->h.oom) {
        s->oom = 1;
        return;
    }
    for (int32_t i = 0; i != -1; i = s->syms[i].next) {
        const sym *y = &s->syms[i];
        if ((uint32_t)y->id < t->n_vocab) {
            ib_push(out, y->id);
            continue;
        }
        /* not a token: llama.cpp looks up each byte of the mapped text as
         * a one-byte token and drops the ones that are not */
        for (uint32_t j = 0; j < y->n; j++) {
            unsigned char b = w[y->start + j];
            for (int q = 0; q < t->bmap_len[b]; q++) {
                int32_t id = t->byte_single[t->bmap[b][q]];
                if (id >= 0)
                    ib_push(out, id);
            }
        }
    }
}

static void bpe_fragment(const rb_tokenizer *t, scratch *s, const char *text,
                         size_t len, idbuf *out)
{
    /* 1. code points (llama.cpp's lenient decoding) and their flags */
    if (len > s->cps_cap) {
        free(s->cps); free(s->fl); free(s->lens); free(s->tmp);
        s->cps = malloc(len * sizeof *s->cps);
        s->fl = malloc(len);
        s->lens = malloc(len * sizeof *s->lens);
        s->tmp = malloc(len * sizeof *s->tmp);
        s->cps_cap = len;
        if (!s->cps || !s->fl || !s->lens || !s->tmp) {
            s->cps_cap = 0;
            s->oom = 1;
            return;
        }
    }
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp = rb_utf8_decode_lenient((const unsigned char *)text, len, &i);
        s->cps[n] = cp;
        s->fl[n] = (uint8_t)rb_ucd_flags(cp);
        n++;
    }
    /* 2. words */
    size_t n_words = rb_pretok_split(t->pretok, s->cps, s->fl, n, s->lens, s->tmp);
    /* 3. each word's bytes (re-encoded from code points, as llama.cpp does:
     *    an invalid byte has become U+FFFD) through BPE */
    size_t c = 0;
    for (size_t wi = 0; wi < n_words && !s->oom; wi++) {
        s->text.n = 0;
        for (uint32_t k = 0; k < s->lens[wi]; k++, c++) {
            unsigned char u[4];
            bb_put(&s->text, u, rb_utf8_encode(s->cps[c], u));
        }
        if (s->text.oom) {
            s->oom = 1;
            return;
        }
        bpe_word(t, s, (const unsigned char *)s->text.p, s->text.n, out);
    }
}

/* ------------------------------------------------------------------------ */
/* special-token partition and encode                                        */

typedef struct frag {
    int32_t id;        /* token, or -1 for raw text */
    size_t off, len;   /* raw text: bytes of the input */
} frag;

/* llama.cpp's tokenizer_st_partition: for each special token, longest
 * first, every occurrence in every raw fragment becomes a token fragment. */
static rb_status partition(const rb_tokenizer *t, const char *text, size_t len,
                           int parse_special, frag **out, size_t *n_out)
{
    size_t n = 1, cap = 16;
    frag *f = malloc(cap * sizeof *f), *g = NULL;
    size_t gcap = 0;
    if (!f)
        return RB_E_NOMEM;
    f[0] = (frag){ -1, 0, len };
    for (uint32_t si = 0; si < t->n_specials; si++) {
        int32_t id = t->specials[si];
        if (!parse_special && (t->attr[id] & (RB_TOKEN_ATTR_CONTROL | RB_TOKEN_ATTR_UNKNOWN)))
            continue; /* user-defined tokens are always split out */
        size_t slen;
        const char *st = str_at(t, id, &slen);
        size_t gn = 0;
        int found = 0;
        for (size_t i = 0; i < n; i++) {
            if (f[i].id >= 0 || !find_bytes(text + f[i].off, f[i].len, st, slen)) {
                if (grow((void **)&g, &gcap, gn + 1, sizeof *g)) goto oom;
                g[gn++] = f[i];
                continue;
            }
            found = 1;
            size_t off = f[i].off, end = f[i].off + f[i].len;
            for (;;) {
                const char *m = find_bytes(text + off, end - off, st, slen);
                if (!m)
                    break;
                size_t mo = (size_t)(m - text);
                if (grow((void **)&g, &gcap, gn + 2, sizeof *g)) goto oom;
                if (mo > off)
                    g[gn++] = (frag){ -1, off, mo - off };
                g[gn++] = (frag){ id, mo, slen };
                off = mo + slen;
            }
            if (off < end) {
                if (grow((void **)&g, &gcap, gn + 1, sizeof *g)) goto oom;
                g[gn++] = (frag){ -1, off, end - off };
            }
        }
        if (found) {
            frag *x = f;
            f = g, g = x;
            size_t c = cap;
            cap = gcap, gcap = c;
            n = gn;
        }
    }
    free(g);
    *out = f;
    *n_out = n;
    return RB_OK;
oom:
    free(f);
    free(g);
    return RB_E_NOMEM;
}

static rb_status encode_vec(const rb_tokenizer *t, const char *text, size_t len,
                            int add_special, int parse_special, idbuf *out)
{
    frag *fr = NULL;
    size_t n_fr = 0;
    if (len > 0 && partition(t, text, len, parse_special, &fr, &n_fr) != RB_OK)
        return RB_E_NOMEM;
    scratch s = { 0 };
    if (add_special && t->add_bos)
        ib_push(out, t->bos);
    int prev_special = 1; /* SPM: a space goes before the first fragment and
                             after each special token */
    for (size_t i = 0; i < n_fr && !s.oom; i++) {
        if (fr[i].id >= 0) {
            ib_push(out, fr[i].id);
            prev_special = 1;
            continue;
        }
        if (t->kind == RB_TOKENIZER_SPM) {
            s.text.n = 0;
            if (t->add_space_prefix && prev_special)
                bb_put(&s.text, "\xe2\x96\x81", 3);
            const char *p = text + fr[i].off;
            for (size_t k = 0; k < fr[i].len; k++) {
                if (p[k] == ' ')
                    bb_put(&s.text, "\xe2\x96\x81", 3);
                else
                    bb_put(&s.text, p + k, 1);
            }
            if (s.text.oom)
                s.oom = 1;
            else
                spm_fragment(t, &s, out);
        } else {
            bpe_fragment(t, &s, text + fr[i].off, fr[i].len, out);
        }
        prev_special = 0;
    }
    if (add_special && t->add_eos)
        ib_push(out, t->eos);
    int oom = s.oom || out->oom;
    scratch_free(&s);
    free(fr);
    return oom ? RB_E_NOMEM : RB_OK;
}

rb_status rb_tokenizer_encode(const rb_tokenizer *t, const char *text,
                              size_t len, int add_special, int parse_special,
                              int32_t *tokens, size_t n_max, size_t *n_out,
                              rb_error *err)
{
    if (!t || (!text && len) || (!tokens && n_max) || !n_out)
        return rb_error_set(err, RB_E_INVALID_ARG, "tokenizer: NULL argument");
    idbuf ib = { 0 };
    if (encode_vec(t, text, len, add_special, parse_special, &ib) != RB_OK) {
        free(ib.p);
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    }
    *n_out = ib.n;
    if (ib.n > n_max) {
        free(ib.p);
        return rb_error_set(err, RB_E_INVALID_ARG, "tokenizer: the text needs "
                            "%zu tokens, the buffer holds %zu", *n_out, n_max);
    }
    if (ib.n)
        memcpy(tokens, ib.p, ib.n * sizeof *tokens);
    free(ib.p);
    return RB_OK;
}

/* ------------------------------------------------------------------------ */
/* pieces and decoding                                                        */

static inline const char *piece_at(const rb_tokenizer *t, int32_t id, size_t *len)
{
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->pieces + t->piece_off[id];
}

int rb_tokenizer_piece(const rb_tokenizer *t, int32_t id, char *buf, size_t n)
{
    if (!rb_tokenizer_is_valid(t, id))
        return -1;
    size_t len;
    const char *p = piece_at(t, id, &len);
    if (len <= n && len > 0)
        memcpy(buf, p, len);
    return (int)len;
}

size_t rb_tokenizer_max_piece_bytes(const rb_tokenizer *t)
{
    return t->max_piece;
}

/* Piece of id as llama_token_to_piece(special = unparse, lstrip). */
static const char *piece_for(const rb_tokenizer *t, int32_t id, int unparse,
                             int lstrip, size_t *len)
{
    if (!unparse && (t->attr[id] & (RB_TOKEN_ATTR_UNKNOWN | RB_TOKEN_ATTR_CONTROL))) {
        *len = 0;
        return "";
    }
    const char *p = piece_at(t, id, len);
    if (lstrip && *len > 0 && p[0] == ' ') {
        p++;
        (*len)--;
    }
    return p;
}

/* llama_detokenize's clean_spaces passes, in place; returns the new length. */
static size_t clean_spaces(char *x, size_t n)
{
    /* " ?" " !" " ." " ," lose the space */
    size_t m = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char c = x[i];
        if (x[i - 1] == ' ' && (c == '?' || c == '!' || c == '.' || c == ','))
            m--;
        x[m++] = c;
    }
    /* " ' " -> "'" (llama.cpp reads x[i-1] after the in-place write; kept) */
    n = m;
    m = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char c = x[i];
        if (c == '\'' && i + 1 < n && x[i - 1] == ' ' && x[i + 1] == ' ') {
            m--;
            x[++i] = '\0';
        }
        x[m++] = c;
    }
    /* " 's" " 'm" " 're" " 've" lose the space */
    n = m;
    m = n ? 1 : 0;
    for (size_t i = 1; i < n; i++) {
        char c = x[i];
        if (x[i - 1] == ' ' && c == '\'' && i + 1 < n) {
            char c1 = x[i + 1];
            if (c1 == 's' || c1 == 'm')
                m--;
            else if (i + 2 < n && ((c1 == 'r' && x[i + 2] == 'e') ||
                                   (c1 == 'v' && x[i + 2] == 'e')))
                m--;
        }
        x[m++] = c;
    }
    return m;
}

rb_status rb_tokenizer_decode(const rb_tokenizer *t, const int32_t *tokens,
                              size_t n, int flags, char *buf, size_t n_buf,
                              size_t *n_out, rb_error *err)
{
    if (!t || (!tokens && n) || (!buf && n_buf) || !n_out)
        return rb_error_set(err, RB_E_INVALID_ARG, "tokenizer: NULL argument");
    rb_status st = rb_tokenizer_validate(t, tokens, n, err);
    if (st != RB_OK)
        return st;
    int remove_space = t->add_space_prefix;
    if ((flags & RB_DECODE_REMOVE_SPECIAL) && t->add_bos && n > 0 && tokens[0] == t->bos) {
        remove_space = 0; /* llama.cpp: no strip after a removed BOS */
        tokens++;
        n--;
    }
    if ((flags & RB_DECODE_REMOVE_SPECIAL) && t->add_eos && n > 0 && tokens[n - 1] == t->eos)
        n--;
    bytebuf b = { 0 };
    for (size_t i = 0; i < n; i++) {
        size_t len;
        const char *p = piece_for(t, tokens[i], flags & RB_DECODE_UNPARSE_SPECIAL,
                                  remove_space, &len);
        remove_space = 0;
        bb_put(&b, p, len);
    }
    if (b.oom) {
        free(b.p);
        return rb_error_set(err, RB_E_NOMEM, "tokenizer: out of memory");
    }
    size_t m = b.n;
    if (t->clean_spaces && m)
        m = clean_spaces(b.p, m);
    *n_out = m;
    if (m > n_buf) {
        free(b.p);
        return rb_error_set(err, RB_E_INVALID_ARG, "tokenizer: the text needs %zu "
                            "bytes, the buffer holds %zu", m, n_buf);
    }
    if (m)
        memcpy(buf, b.p, m);
    free(b.p);
    return RB_OK;
}

/* ------------------------------------------------------------------------ */
/* getters                                                                   */

rb_tokenizer_kind rb_tokenizer_get_kind(const rb_tokenizer *t) { return t->kind; }
rb_pretok rb_tokenizer_get_pretok(const rb_tokenizer *t) { return t->pretok; }
uint32_t rb_tokenizer_n_vocab(const rb_tokenizer *t) { return t->n_vocab; }
int32_t rb_tokenizer_bos(const rb_tokenizer *t) { return t->bos; }
int32_t rb_tokenizer_eos(const rb_tokenizer *t) { return t->eos; }
int32_t rb_tokenizer_eot(const rb_tokenizer *t) { return t->eot; }
int32_t rb_tokenizer_unk(const rb_tokenizer *t) { return t->unk; }
int32_t rb_tokenizer_nl(const rb_tokenizer *t) { return t->nl; }
int rb_tokenizer_adds_bos(const rb_tokenizer *t) { return t->add_bos; }
int rb_tokenizer_adds_eos(const rb_tokenizer *t) { return t->add_eos; }
int rb_tokenizer_adds_space_prefix(const rb_tokenizer *t) { return t->add_space_prefix; }

int rb_tokenizer_is_valid(const rb_tokenizer *t, int32_t id)
{
    return t && id >= 0 && (uint32_t)id < t->n_vocab;
}

int rb_tokenizer_is_eog(const rb_tokenizer *t, int32_t id)
{
    return rb_tokenizer_is_valid(t, id) && (t->attr[id] & RB_TOKEN_ATTR_EOG) != 0;
}

uint32_t rb_tokenizer_attr(const rb_tokenizer *t, int32_t id)
{
    return rb_tokenizer_is_valid(t, id) ? t->attr[id] : 0;
}

rb_status rb_tokenizer_validate(const rb_tokenizer *t, const int32_t *tokens,
                                size_t n, rb_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (!rb_tokenizer_is_valid(t, tokens[i]))
            return rb_error_set(err, RB_E_INVALID_ARG, "tokenizer: token #%zu = %d "
                                "is out of range (n_vocab %u)", i, (int)tokens[i],
                                t ? t->n_vocab : 0);
    return RB_OK;
}

const char *rb_tokenizer_text(const rb_tokenizer *t, int32_t id, size_t *len)
{
    if (!rb_tokenizer_is_valid(t, id))
        return NULL;
    return str_at(t, id, len);
}

int32_t rb_tokenizer_find(const rb_tokenizer *t, const char *s, size_t len)
{
    int32_t id = str_find(t, s, len);
    return id >= 0 && (uint32_t)id < t->n_vocab ? id : RB_TOKEN_NULL;
}

/* ------------------------------------------------------------------------ */
/* streaming detokenizer                                                      */

size_t rb_detok_out_bytes(const rb_tokenizer *t)
{
    /* every input byte (4 pending + the piece) becomes at most 3 bytes */
    return 3 * (t->max_piece + 4);
}

void rb_detok_init(rb_detok *d, const rb_tokenizer *t, int flags)
{
    memset(d, 0, sizeof *d);
    d->tok = t;
    d->flags = flags;
}

/* Length of the valid UTF-8 prefix decision at x[0..n): returns the length
 * of a complete valid character, 0 when more bytes are needed, or -k when
 * the first k bytes are an invalid (maximal) subpart. */
static int utf8_step(const unsigned char *x, size_t n)
{
    unsigned b = x[0];
    if (b < 0x80)
        return 1;
    int need;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (b >= 0xC2 && b <= 0xDF) need = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        need = 3;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 4;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else
        return -1;
    for (int k = 1; k < need; k++) {
        if ((size_t)k >= n)
            return 0;
        unsigned c = x[k];
        if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF))
            return -k;
    }
    return need;
}

rb_status rb_detok_push(rb_detok *d, int32_t id, char *out, size_t n_out_max,
                        size_t *n_written)
{
    const rb_tokenizer *t = d->tok;
    if (!rb_tokenizer_is_valid(t, id) || n_out_max < rb_detok_out_bytes(t))
        return RB_E_INVALID_ARG;
    size_t len;
    const char *p = piece_for(t, id, d->flags & RB_DECODE_UNPARSE_SPECIAL, 0, &len);
    /* counts pieces that carry text: a BOS renders as nothing, and the
       space to strip belongs to the first word after it */
    if (len > 0) {
        if (d->n_pushed == 0 && (d->flags & RB_DECODE_STRIP_LEADING_SPACE) && p[0] == ' ') {
            p++;
            len--;
        }
        d->n_pushed++;
    }
    /* work on pending + piece; x holds at most 4 + a few bytes at a time */
    size_t w = 0, i = 0, total = d->n_pending + len;
    unsigned char x[4];
#define BYTE_AT(k) ((k) < d->n_pending ? d->pending[(k)] : (unsigned char)p[(k) - d->n_pending])
    while (i < total) {
        size_t avail = total - i < 4 ? total - i : 4;
        for (size_t k = 0; k < avail; k++)
            x[k] = BYTE_AT(i + k);
        int r = utf8_step(x, avail);
        if (r > 0) {
            memcpy(out + w, x, (size_t)r);
            w += (size_t)r;
            i += (size_t)r;
        } else if (r < 0) {
            memcpy(out + w, "\xef\xbf\xbd", 3);
            w += 3;
            i += (size_t)(-r);
        } else { /* unfinished: keep for the next token */
            unsigned char keep[4];
            for (size_t k = 0; k < avail; k++)
                keep[k] = x[k];
            memcpy(d->pending, keep, avail);
            d->n_pending = (uint32_t)avail;
            *n_written = w;
            return RB_OK;
        }
    }
#undef BYTE_AT
    d->n_pending = 0;
    *n_written = w;
    return RB_OK;
}

size_t rb_detok_flush(rb_detok *d, char *out, size_t n_out_max)
{
    size_t w = 0;
    if (d->n_pending > 0 && n_out_max >= 3) {
        memcpy(out, "\xef\xbf\xbd", 3);
        w = 3;
    }
    d->n_pending = 0;
    d->n_pushed = 0;
    return w;
}
