/*
 * unicode_tables.h - the Unicode facts the tokenizer's pre-tokenizers need:
 * whether a code point is a letter (\p{L}), a number (\p{N}), punctuation
 * (\p{P}), a mark, a symbol, or white space (\s), and llama.cpp's lenient
 * UTF-8 decoding.
 *
 * The category data is one generated table (unicode_tables.c, 2217 ranges,
 * 8.7 KiB, from Python 3.11's unicodedata, Unicode 14). llama.cpp generates
 * its own table from a newer Python; the two differ only on code points
 * assigned after Unicode 14. Read-only; any thread.
 */
#ifndef RB_UNICODE_TABLES_H
#define RB_UNICODE_TABLES_H

#include <stddef.h>
#include <stdint.h>

enum {
    RB_UCD_LETTER = 1,  /* general category L* */
    RB_UCD_NUMBER = 2,  /* N* */
    RB_UCD_PUNCT = 4,   /* P* */
    RB_UCD_SPACE = 8,   /* White_Space property (not a category) */
    RB_UCD_MARK = 16,   /* M* */
    RB_UCD_SYMBOL = 32, /* S* */
};

extern const uint32_t rb_ucd_ranges[];  /* (first << 8) | flags, sorted */
extern const uint32_t rb_ucd_n_ranges;

/* RB_UCD_* flags of a code point; 0 for unassigned, controls, separators
 * that are not white space, and anything above U+10FFFF. */
static inline unsigned rb_ucd_flags(uint32_t cp)
{
    if (cp >= 0x110000u)
        return 0;
    /* last range whose first code point is <= cp (entry 0 starts at 0) */
    uint32_t lo = 0, hi = rb_ucd_n_ranges;
    while (hi - lo > 1) {
        uint32_t mid = (lo + hi) / 2;
        if ((rb_ucd_ranges[mid] >> 8) <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return rb_ucd_ranges[lo] & 0xffu;
}

/*
 * Decodes one code point at s[*i] (n bytes in all) the way llama.cpp's
 * unicode_cpt_from_utf8 does: the lead byte's high bits give the length and
 * the continuation bytes must be 10xxxxxx, but overlong forms and surrogates
 * are accepted as they decode. A byte that starts no valid sequence yields
 * U+FFFD and advances one byte. Requires *i < n.
 */
static inline uint32_t rb_utf8_decode_lenient(const unsigned char *s, size_t n,
                                              size_t *i)
{
    size_t p = *i;
    unsigned b = s[p];
    if (b < 0x80) {
        *i = p + 1;
        return b;
    }
    size_t len = (b & 0x40) == 0 ? 0 : (b & 0x20) == 0 ? 2 : (b & 0x10) == 0 ? 3
               : (b & 0x08) == 0 ? 4 : 0;
    if (len == 0 || p + len > n) {
        *i = p + 1;
        return 0xFFFD;
    }
    uint32_t cp = b & (0xffu >> (len + 1));
    for (size_t k = 1; k < len; k++) {
        if ((s[p + k] & 0xc0) != 0x80) {
            *i = p + 1;
            return 0xFFFD;
        }
        cp = (cp << 6) | (s[p + k] & 0x3fu);
    }
    *i = p + len;
    return cp;
}

/* Encodes cp (<= 0x10FFFF; larger values are written as U+FFFD) into out
 * (4 bytes of room); returns the byte count. */
static inline size_t rb_utf8_encode(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp > 0x10FFFF)
        cp = 0xFFFD;
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

#endif /* RB_UNICODE_TABLES_H */
