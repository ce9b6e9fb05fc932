/*
 * vocab_synth.c - deterministic synthetic tokenizer vocabularies (SPM and
 * GPT-2 byte-level BPE) for `rebound make-model`.
 *
 * What it does: builds, for a given n_vocab, exactly n_vocab distinct token
 * strings with their llama.cpp token types, plus SPM scores or BPE merges,
 * in the shapes llama.cpp's loader expects (see vocab_synth.h). The same
 * n_vocab always gives the same vocabulary, and a smaller n_vocab gives a
 * prefix of a larger one (tokens are appended in one fixed order and the
 * build just stops when full; the BPE control tokens come after that prefix).
 *
 * What it does not do: learn from a corpus, tokenize, or write GGUF. The
 * vocabularies only need to be well-formed and to cut English text into
 * plausible pieces, so that tokenizer code paths and model shapes can be
 * exercised without shipping a real tokenizer.
 *
 * Build order (both styles):
 *   1. the fixed head: SPM <unk> <s> </s> and <0x00>..<0xFF>; BPE the 256
 *      byte-level symbols in bytes_to_unicode order;
 *   2. seed pieces: SPM single characters; then, in both styles, a built-in
 *      list of common English words, each with and without a leading space
 *      (SPM U+2581, BPE 'G'+dot U+0120), grown one character at a time so
 *      every prefix exists first (SPM) or every token is the merge of the
 *      previous prefix and one symbol (BPE);
 *   3. fill: breadth-first prefix extension, in id order, of every piece
 *      that is letters (optionally after the space mark) by one lowercase
 *      letter in English frequency order, skipping strings already present;
 *      this never runs dry because extensions are longer than what they
 *      extend;
 *   4. BPE only: <|endoftext|>, <|im_start|>, <|im_end|> as the last three.
 *
 * Invariants: token strings are non-empty, valid UTF-8 and pairwise
 * distinct (one open-addressing hash set of ids checks every candidate);
 * SPM pieces are prefix-closed by character; BPE merges[i] = "A B" with A
 * and B tokens of lower id than 256 + i whose concatenation is token 256+i.
 *
 * Memory: a builder owns a growing string pool (all token strings, NUL
 * separated), per-token arrays sized n_vocab up front, and a hash table of
 * 2..4 x n_vocab uint32 slots. On success the strings are copied into one
 * block laid out as
 *
 *      [ char *tokens[n] | "tok0\0tok1\0..." ]
 *
 * (the same for merges), so rb_vocab_synth_free frees tokens, merges,
 * scores and token_types with four free() calls. For n_vocab = 151936 the
 * builder peaks near 12 MB and the result keeps about 5 MB (tokens 2.2 MB,
 * merges 2.3 MB). All memory comes from malloc/realloc; nothing global.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vocab_synth.h"

#define VS_SPACE_SPM "\xe2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK */
#define VS_SPACE_BPE "\xc4\xa0"     /* U+0120, GPT-2's symbol for 0x20 */
#define VS_EMPTY UINT32_MAX         /* a free hash slot */
#define VS_MAX_PIECE_BYTES 256      /* candidates longer than this are skipped */

/* Common English words, most frequent first, then frequent word pieces.
 * Duplicates (and pieces already made as prefixes) are skipped. */
static const char *const vs_words[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he",
    "was", "for", "on", "are", "with", "as", "I", "his", "they", "be", "at",
    "one", "have", "this", "from", "or", "had", "by", "not", "word", "but",
    "what", "some", "we", "can", "out", "other", "were", "all", "there",
    "when", "up", "use", "your", "how", "said", "an", "each", "she", "which",
    "do", "their", "time", "if", "will", "way", "about", "many", "then",
    "them", "write", "would", "like", "so", "these", "her", "long", "make",
    "thing", "see", "him", "two", "has", "look", "more", "day", "could", "go",
    "come", "did", "number", "sound", "no", "most", "people", "my", "over",
    "know", "water", "than", "call", "first", "who", "may", "down", "side",
    "been", "now", "find", "any", "new", "work", "part", "take", "get",
    "place", "made", "live", "where", "after", "back", "little", "only",
    "round", "man", "year", "came", "show", "every", "good", "me", "give",
    "our", "under", "name", "very", "through", "just", "form", "sentence",
    "great", "think", "say", "help", "low", "line", "differ", "turn",
    "cause", "much", "mean", "before", "move", "right", "boy", "old", "too",
    "same", "tell", "does", "set", "three", "want", "air", "well", "also",
    "play", "small", "end", "put", "home", "read", "hand", "port", "large",
    "spell", "add", "even", "land", "here", "must", "big", "high", "such",
    "follow", "act", "why", "ask", "men", "change", "went", "light", "kind",
    "off", "need", "house", "picture", "try", "us", "again", "animal",
    "point", "mother", "world", "near", "build", "self", "earth", "father",
    "head", "stand", "own", "page", "should", "country", "found", "answer",
    "school", "grow", "study", "still", "learn", "plant", "cover", "food",
    "sun", "four", "between", "state", "keep", "eye", "never", "last", "let",
    "thought", "city", "tree", "cross", "farm", "hard", "start", "might",
    "story", "saw", "far", "sea", "draw", "left", "late", "run", "while",
    "press", "close", "night", "real", "life", "few", "north", "open",
    "seem", "together", "next", "white", "children", "begin", "got", "walk",
    "example", "ease", "paper", "group", "always", "music", "those", "both",
    "mark", "often", "letter", "until", "mile", "river", "car", "feet",
    "care", "second", "book", "carry", "took", "science", "eat", "room",
    "friend", "began", "idea", "fish", "mountain", "stop", "once", "base",
    "hear", "horse", "cut", "sure", "watch", "color", "face", "wood", "main",
    "enough", "plain", "girl", "usual", "young", "ready", "above", "ever",
    "red", "list", "though", "feel", "talk", "bird", "soon", "body", "dog",
    "family", "direct", "pose", "leave", "song", "measure", "door",
    "product", "black", "short", "numeral", "class", "wind", "question",
    "happen", "complete", "ship", "area", "half", "rock", "order", "fire",
    "south", "problem", "piece", "told", "knew", "pass", "since", "top",
    "whole", "king", "space", "heard", "best", "hour", "better", "true",
    "during", "hundred", "five", "remember", "step", "early", "hold", "west",
    "ground", "interest", "reach", "fast", "verb", "sing", "listen", "six",
    "table", "travel", "less", "morning", "ten", "simple", "several",
    "vowel", "toward", "war", "lay", "against", "pattern", "slow", "center",
    "love", "person", "money", "serve", "appear", "road", "map", "rain",
    "rule", "govern", "pull", "cold", "notice", "voice", "unit", "power",
    "town", "fine", "certain", "fly", "fall", "lead", "cry", "dark",
    "machine", "note", "wait", "plan", "figure", "star", "box", "noun",
    "field", "rest", "correct", "able", "pound", "done", "beauty", "drive",
    "stood", "contain", "front", "teach", "week", "final", "gave", "green",
    "oh", "quick", "develop", "ocean", "warm", "free", "minute", "strong",
    "special", "mind", "behind", "clear", "tail", "produce", "fact",
    "model", "memory", "token", "hello", "once", "upon", "Hello", "The",
    "It", "In", "This", "We", "He", "She", "They", "A", "What", "And", "But",
    "ing", "ed", "er", "es", "ly", "tion", "ment", "ness", "able", "ity",
    "al", "ous", "ive", "est", "ful", "less", "re", "un", "st", "nd", "th",
    "ch", "sh", "ll", "ss", "ck", "qu", "ph", "wh", "gh", "ng",
};

/* BPE-only seeds, as raw bytes: whitespace runs (code indentation). */
static const char *const vs_ws_runs[] = {
    "  ", "    ", "        ", "\n\n", "\t\t",
};

/* Common non-ASCII characters (curly quotes, dashes, ellipsis, accented
 * letters), as UTF-8: single SPM pieces, multi-symbol BPE merges. */
static const char *const vs_chars[] = {
    "\xe2\x80\x99", "\xe2\x80\x9c", "\xe2\x80\x9d", "\xe2\x80\x94",
    "\xe2\x80\x93", "\xe2\x80\xa6", "\xc3\xa9", "\xc3\xa8", "\xc3\xa0",
    "\xc3\xa7", "\xc3\xb6", "\xc3\xbc", "\xc3\xa4", "\xc3\xb1", "\xc3\x9f",
};

/* Fill letters in English frequency order (ETAOIN SHRDLU ...). */
static const char vs_fill_letters[] = "etaoinshrdlcumwfgypbvkjxqz";

/* ---- builder ------------------------------------------------------------ */

typedef struct vs_builder {
    uint32_t n_cap;        /* tokens allocated for (= n_vocab) */
    uint32_t n;            /* tokens made so far, ids 0..n-1 */
    char *pool;            /* token strings, each NUL-terminated */
    size_t pool_len, pool_cap;
    size_t *off;           /* [n_cap] offset of token i in pool */
    uint32_t *len;         /* [n_cap] byte length of token i */
    int32_t *types;        /* [n_cap] RB_TOKEN_TYPE_* */
    float *scores;         /* [n_cap] SPM scores, or NULL */
    uint32_t *merge_l;     /* [n_cap] BPE: left/right ids of the merge that */
    uint32_t *merge_r;     /*   made token 256+i, or NULL for SPM */
    uint32_t n_merges;
    uint32_t *slots;       /* hash set of token ids, VS_EMPTY when free */
    size_t slot_mask;      /* slot count - 1 (a power of two) */
} vs_builder;

static uint64_t vs_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u; /* FNV-1a, then a splitmix64 finish */
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3u;
    }
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9u;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebu;
    h ^= h >> 31;
    return h;
}

static void vs_builder_free(vs_builder *b)
{
    free(b->pool);
    free(b->off);
    free(b->len);
    free(b->types);
    free(b->scores);
    free(b->merge_l);
    free(b->merge_r);
    free(b->slots);
    memset(b, 0, sizeof(*b));
}

/* malloc(n * each + extra), or NULL when that overflows size_t (only
 * possible with a 32-bit size_t). */
static void *vs_malloc(size_t n, size_t each, size_t extra)
{
    if (n > (SIZE_MAX - extra) / each)
        return NULL;
    return malloc(n * each + extra);
}

static rb_status vs_builder_init(vs_builder *b, uint32_t n_vocab, int is_bpe)
{
    memset(b, 0, sizeof(*b));
    b->n_cap = n_vocab;
    size_t n_slots = 1024; /* >= 2 * n_vocab: load factor <= 1/2 */
    while (n_slots / 2 < n_vocab) {
        if (n_slots > SIZE_MAX / 2 / sizeof(uint32_t))
            return RB_E_NOMEM;
        n_slots *= 2;
    }
    b->slot_mask = n_slots - 1;
    /* 8 bytes a token: measured means with the NUL are 6.8 (SPM 32000) and
     * 6.4 (BPE 151936), so the pool rarely regrows. */
    b->pool_cap = 4096;
    while (b->pool_cap / 8 < n_vocab && b->pool_cap <= SIZE_MAX / 2)
        b->pool_cap *= 2;
    b->pool = malloc(b->pool_cap);
    b->off = vs_malloc(n_vocab, sizeof(*b->off), 0);
    b->len = vs_malloc(n_vocab, sizeof(*b->len), 0);
    b->types = vs_malloc(n_vocab, sizeof(*b->types), 0);
    b->slots = vs_malloc(n_slots, sizeof(*b->slots), 0);
    if (is_bpe) {
        b->merge_l = vs_malloc(n_vocab, sizeof(*b->merge_l), 0);
        b->merge_r = vs_malloc(n_vocab, sizeof(*b->merge_r), 0);
    } else {
        b->scores = vs_malloc(n_vocab, sizeof(*b->scores), 0);
    }
    if (!b->pool || !b->off || !b->len || !b->types || !b->slots ||
        (is_bpe ? !b->merge_l || !b->merge_r : !b->scores)) {
        vs_builder_free(b);
        return RB_E_NOMEM;
    }
    memset(b->slots, 0xff, n_slots * sizeof(*b->slots)); /* all VS_EMPTY */
    return RB_OK;
}

/* The slot that holds s, or the free slot where s would go. */
static size_t vs_slot(const vs_builder *b, const char *s, size_t n)
{
    size_t i = (size_t)vs_hash(s, n) & b->slot_mask;
    for (;;) {
        uint32_t id = b->slots[i];
        if (id == VS_EMPTY ||
            (b->len[id] == n && memcmp(b->pool + b->off[id], s, n) == 0))
            return i;
        i = (i + 1) & b->slot_mask; /* load <= 1/2: probes stay short */
    }
}

static uint32_t vs_find(const vs_builder *b, const char *s, size_t n)
{
    return b->slots[vs_slot(b, s, n)];
}

/* Appends s as token b->n. The caller checked there is room and that s is
 * absent. */
static rb_status vs_add(vs_builder *b, const char *s, size_t n, int32_t type)
{
    if (b->pool_len + n + 1 > b->pool_cap) {
        size_t cap = b->pool_cap * 2;
        if (cap < b->pool_cap) /* never on 64-bit; keeps 32-bit honest */
            return RB_E_NOMEM;
        char *p = realloc(b->pool, cap);
        if (!p)
            return RB_E_NOMEM;
        b->pool = p;
        b->pool_cap = cap;
    }
    size_t slot = vs_slot(b, s, n);
    uint32_t id = b->n++;
    memcpy(b->pool + b->pool_len, s, n);
    b->pool[b->pool_len + n] = '\0';
    b->off[id] = b->pool_len;
    b->len[id] = (uint32_t)n;
    b->types[id] = type;
    b->pool_len += n + 1;
    b->slots[slot] = id;
    return RB_OK;
}

static const char *vs_str(const vs_builder *b, uint32_t id)
{
    return b->pool + b->off[id];
}

/* Byte length of the UTF-8 character starting at s[0] (inputs here are
 * valid UTF-8; continuation bytes are skipped). */
static size_t vs_char_len(const char *s, size_t n)
{
    size_t k = 1;
    while (k < n && ((unsigned char)s[k] & 0xc0) == 0x80)
        k++;
    return k;
}

/* True when s is ASCII letters, optionally after the space mark sp. */
static int vs_is_wordish(const char *s, size_t n, const char *sp)
{
    size_t sp_len = strlen(sp);
    if (n >= sp_len && memcmp(s, sp, sp_len) == 0) {
        s += sp_len;
        n -= sp_len;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            return 0;
    }
    return 1;
}

/* Builds the rb_vocab_synth from a full builder; the builder keeps only
 * what was not handed over. */
static rb_status vs_finish(vs_builder *b, rb_vocab_synth *out)
{
    size_t ptrs = (size_t)b->n * sizeof(char *); /* fits: off[] did */
    char **tokens = vs_malloc(b->n, sizeof(char *), b->pool_len);
    if (!tokens)
        return RB_E_NOMEM;
    char *strs = (char *)tokens + ptrs;
    memcpy(strs, b->pool, b->pool_len);
    for (uint32_t i = 0; i < b->n; i++)
        tokens[i] = strs + b->off[i];

    char **merges = NULL;
    if (b->merge_l && b->n_merges > 0) {
        size_t bytes = 0;
        for (uint32_t i = 0; i < b->n_merges; i++) {
            size_t m = (size_t)b->len[b->merge_l[i]] + b->len[b->merge_r[i]];
            if (bytes > SIZE_MAX - m - 2) { /* 32-bit size_t only */
                free(tokens);
                return RB_E_NOMEM;
            }
            bytes += m + 2;
        }
        size_t mptrs = (size_t)b->n_merges * sizeof(char *);
        merges = vs_malloc(b->n_merges, sizeof(char *), bytes);
        if (!merges) {
            free(tokens);
            return RB_E_NOMEM;
        }
        char *p = (char *)merges + mptrs;
        for (uint32_t i = 0; i < b->n_merges; i++) {
            uint32_t l = b->merge_l[i], r = b->merge_r[i];
            merges[i] = p;
            memcpy(p, vs_str(b, l), b->len[l]);
            p += b->len[l];
            *p++ = ' ';
            memcpy(p, vs_str(b, r), b->len[r]);
            p += b->len[r];
            *p++ = '\0';
        }
    }

    out->n_tokens = b->n;
    out->tokens = tokens;
    out->scores = b->scores;
    out->token_types = b->types;
    out->n_merges = merges ? b->n_merges : 0;
    out->merges = merges;
    b->scores = NULL;
    b->types = NULL;
    return RB_OK;
}

/* ---- SentencePiece style ------------------------------------------------ */

/* Adds the piece s (and first every prefix of it, by character) with
 * decreasing scores, until the vocabulary is full. */
static rb_status vs_spm_piece(vs_builder *b, const char *s, size_t n,
                              uint32_t first_normal)
{
    for (size_t k = vs_char_len(s, n); ; k += vs_char_len(s + k, n - k)) {
        if (b->n == b->n_cap)
            return RB_OK;
        if (vs_find(b, s, k) == VS_EMPTY) {
            b->scores[b->n] = -(float)(b->n - first_normal);
            rb_status st = vs_add(b, s, k, RB_TOKEN_TYPE_NORMAL);
            if (st != RB_OK)
                return st;
        }
        if (k >= n)
            return RB_OK;
    }
}

static rb_status vs_spm_build(vs_builder *b)
{
    static const char *const specials[3] = { "<unk>", "<s>", "</s>" };
    static const int32_t special_types[3] = {
        RB_TOKEN_TYPE_UNKNOWN, RB_TOKEN_TYPE_CONTROL, RB_TOKEN_TYPE_CONTROL,
    };
    static const char hex[] = "0123456789ABCDEF";
    rb_status st;
    char buf[VS_MAX_PIECE_BYTES + 8];

    /* 1. the fixed head: specials and byte-fallback tokens, score 0. */
    for (int i = 0; i < 3; i++) {
        b->scores[b->n] = 0.0f;
        if ((st = vs_add(b, specials[i], strlen(specials[i]),
                         special_types[i])) != RB_OK)
            return st;
    }
    for (int c = 0; c < 256; c++) {
        char tok[7] = { '<', '0', 'x', hex[c >> 4], hex[c & 15], '>', '\0' };
        b->scores[b->n] = 0.0f;
        if ((st = vs_add(b, tok, 6, RB_TOKEN_TYPE_BYTE)) != RB_OK)
            return st;
    }
    uint32_t first = b->n;

    /* 2a. single characters: space mark, letters, digits, punctuation,
     * then a few common non-ASCII characters. */
    if ((st = vs_spm_piece(b, VS_SPACE_SPM, 3, first)) != RB_OK)
        return st;
    static const char *const ranges[] = { "az", "AZ", "09" };
    for (int r = 0; r < 3; r++)
        for (int c = ranges[r][0]; c <= ranges[r][1]; c++) {
            buf[0] = (char)c;
            if ((st = vs_spm_piece(b, buf, 1, first)) != RB_OK)
                return st;
        }
    for (int c = '!'; c <= '~'; c++) {
        buf[0] = (char)c;
        if ((st = vs_spm_piece(b, buf, 1, first)) != RB_OK)
            return st;
    }
    for (size_t i = 0; i < sizeof(vs_chars) / sizeof(vs_chars[0]); i++)
        if ((st = vs_spm_piece(b, vs_chars[i], strlen(vs_chars[i]),
                               first)) != RB_OK)
            return st;

    /* 2b. words, "\u2581word" then "word"; prefixes come first. */
    for (size_t i = 0; i < sizeof(vs_words) / sizeof(vs_words[0]); i++) {
        size_t n = strlen(vs_words[i]);
        memcpy(buf, VS_SPACE_SPM, 3);
        memcpy(buf + 3, vs_words[i], n);
        if ((st = vs_spm_piece(b, buf, n + 3, first)) != RB_OK ||
            (st = vs_spm_piece(b, vs_words[i], n, first)) != RB_OK)
            return st;
    }

    /* 3. fill: extend word-like pieces, in id order, by one letter. */
    for (uint32_t q = first; b->n < b->n_cap; q++) {
        /* q < b->n always: each pass over a piece of length L that adds
         * nothing leaves longer pieces queued, so the queue never empties
         * before the vocabulary is full. */
        size_t n = b->len[q];
        if (n + 1 > VS_MAX_PIECE_BYTES ||
            !vs_is_wordish(vs_str(b, q), n, VS_SPACE_SPM))
            continue;
        memcpy(buf, vs_str(b, q), n);
        for (const char *c = vs_fill_letters; *c && b->n < b->n_cap; c++) {
            buf[n] = *c;
            if (vs_find(b, buf, n + 1) != VS_EMPTY)
                continue;
            b->scores[b->n] = -(float)(b->n - first);
            if ((st = vs_add(b, buf, n + 1, RB_TOKEN_TYPE_NORMAL)) != RB_OK)
                return st;
        }
    }
    return RB_OK;
}

/* Runs one builder style into *out; on failure *out is left zeroed. */
static rb_status vs_build(uint32_t n_vocab, int is_bpe,
                          rb_status (*build)(vs_builder *), rb_vocab_synth *out)
{
    if (!out)
        return RB_E_INVALID_ARG;
    memset(out, 0, sizeof(*out));
    if (n_vocab < 260)
        return RB_E_INVALID_ARG;

    vs_builder b;
    rb_status st = vs_builder_init(&b, n_vocab, is_bpe);
    if (st != RB_OK)
        return st;
    if ((st = build(&b)) == RB_OK)
        st = vs_finish(&b, out);
    vs_builder_free(&b);
    if (st != RB_OK)
        memset(out, 0, sizeof(*out));
    return st;
}

rb_status rb_vocab_synth_spm(uint32_t n_vocab, rb_vocab_synth *out)
{
    rb_status st = vs_build(n_vocab, 0, vs_spm_build, out);
    if (st != RB_OK)
        return st;
    out->model = "llama";
    out->pre = NULL;
    out->bos_id = 1;
    out->eos_id = 2;
    out->unk_id = 0;
    out->pad_id = RB_TOKEN_NONE;
    out->add_bos = 1;
    return RB_OK;
}

/* ---- GPT-2 byte-level BPE ----------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable bytes '!'..'~', 0xA1..0xAC and
 * 0xAE..0xFF stand for themselves and come first (ids 0..187); every other
 * byte, in byte order, becomes U+0100 + k (ids 188..255). Fills cp[byte]
 * and id[byte]. */
static void vs_byte_symbols(uint32_t cp[256], uint32_t id[256])
{
    uint32_t next = 0;
    for (uint32_t c = 0; c < 256; c++)
        if ((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) || c >= 0xae) {
            cp[c] = c;
            id[c] = next++;
        }
    uint32_t k = 0;
    for (uint32_t c = 0; c < 256; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xa1 && c <= 0xac) ||
              c >= 0xae)) {
            cp[c] = 0x100 + k++;
            id[c] = next++;
        }
}

/* Makes token (a, b) = str(a) + str(b) with the next merge rank. */
static rb_status vs_bpe_merge(vs_builder *b, uint32_t l, uint32_t r,
                              const char *s, size_t n)
{
    b->merge_l[b->n_merges] = l;
    b->merge_r[b->n_merges] = r;
    rb_status st = vs_add(b, s, n, RB_TOKEN_TYPE_NORMAL);
    if (st == RB_OK)
        b->n_merges++;
    return st;
}

/* Builds the byte string raw left to right: prefix of k symbols merged with
 * symbol k+1, for every k, skipping merges whose result already exists. */
static rb_status vs_bpe_word(vs_builder *b, const uint32_t byte_id[256],
                             const char *raw, uint32_t limit)
{
    char buf[VS_MAX_PIECE_BYTES + 8];
    size_t n = 0;
    uint32_t cur = VS_EMPTY;
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
        uint32_t sym = byte_id[*p];
        size_t sl = b->len[sym];
        if (n + sl > VS_MAX_PIECE_BYTES)
            return RB_OK;
        memcpy(buf + n, vs_str(b, sym), sl);
        n += sl;
        if (cur == VS_EMPTY) {
            cur = sym;
            continue;
        }
        uint32_t id = vs_find(b, buf, n);
        if (id == VS_EMPTY) {
            if (b->n >= limit)
                return RB_OK;
            id = b->n;
            rb_status st = vs_bpe_merge(b, cur, sym, buf, n);
            if (st != RB_OK)
                return st;
        }
        cur = id;
    }
    return RB_OK;
}

static rb_status vs_bpe_build(vs_builder *b)
{
    static const char *const controls[3] = {
        "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    };
    uint32_t cp[256], byte_id[256];
    char buf[VS_MAX_PIECE_BYTES + 8];
    uint32_t limit = b->n_cap - 3;
    rb_status st;

    /* 1. the 256 byte-level symbols, UTF-8 encoded, in id order. */
    vs_byte_symbols(cp, byte_id);
    uint32_t by_id[256];
    for (uint32_t c = 0; c < 256; c++)
        by_id[byte_id[c]] = c;
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t u = cp[by_id[i]];
        char s[2];
        size_t n = 1;
        if (u < 0x80) {
            s[0] = (char)u;
        } else {
            s[0] = (char)(0xc0 | (u >> 6));
            s[1] = (char)(0x80 | (u & 0x3f));
            n = 2;
        }
        if ((st = vs_add(b, s, n, RB_TOKEN_TYPE_NORMAL)) != RB_OK)
            return st;
    }

    /* 2. words " word" then "word", then whitespace runs and multi-byte
     * characters, each by left-to-right merges. */
    for (size_t i = 0; i < sizeof(vs_words) / sizeof(vs_words[0]); i++) {
        size_t n = strlen(vs_words[i]);
        buf[0] = ' ';
        memcpy(buf + 1, vs_words[i], n + 1);
        if ((st = vs_bpe_word(b, byte_id, buf, limit)) != RB_OK ||
            (st = vs_bpe_word(b, byte_id, vs_words[i], limit)) != RB_OK)
            return st;
    }
    for (size_t i = 0; i < sizeof(vs_ws_runs) / sizeof(vs_ws_runs[0]); i++)
        if ((st = vs_bpe_word(b, byte_id, vs_ws_runs[i], limit)) != RB_OK)
            return st;
    for (size_t i = 0; i < sizeof(vs_chars) / sizeof(vs_chars[0]); i++)
        if ((st = vs_bpe_word(b, byte_id, vs_chars[i], limit)) != RB_OK)
            return st;

    /* 3. fill: extend the space symbol, the letters (frequency order), then
     * every word-like merged token in id order, by one letter. */
    uint32_t seeds[27];
    seeds[0] = byte_id[' '];
    for (int i = 0; i < 26; i++)
        seeds[i + 1] = byte_id[(unsigned char)vs_fill_letters[i]];
    for (uint32_t q = 0; b->n < limit; q++) {
        uint32_t t = q < 27 ? seeds[q] : 256 + (q - 27); /* < b->n, as SPM */
        size_t n = b->len[t];
        if (n + 1 > VS_MAX_PIECE_BYTES ||
            !vs_is_wordish(vs_str(b, t), n, VS_SPACE_BPE))
            continue;
        memcpy(buf, vs_str(b, t), n);
        for (const char *c = vs_fill_letters; *c && b->n < limit; c++) {
            buf[n] = *c;
            if (vs_find(b, buf, n + 1) != VS_EMPTY)
                continue;
            st = vs_bpe_merge(b, t, byte_id[(unsigned char)*c], buf, n + 1);
            if (st != RB_OK)
                return st;
        }
    }

    /* 4. control tokens last. */
    for (int i = 0; i < 3; i++)
        if ((st = vs_add(b, controls[i], strlen(controls[i]),
                         RB_TOKEN_TYPE_CONTROL)) != RB_OK)
            return st;
    return RB_OK;
}

rb_status rb_vocab_synth_bpe(uint32_t n_vocab, rb_vocab_synth *out)
{
    rb_status st = vs_build(n_vocab, 1, vs_bpe_build, out);
    if (st != RB_OK)
        return st;
    out->model = "gpt2";
    out->pre = "qwen2";
    out->bos_id = n_vocab - 3;
    out->eos_id = n_vocab - 3;
    out->unk_id = RB_TOKEN_NONE;
    out->pad_id = RB_TOKEN_NONE;
    out->add_bos = 0;
    return RB_OK;
}

void rb_vocab_synth_free(rb_vocab_synth *v)
{
    if (!v)
        return;
    free(v->tokens); /* the strings share the pointer array's block */
    free(v->merges);
    free(v->scores);
    free(v->token_types);
    memset(v, 0, sizeof(*v));
}
