/*
 * json.c - the strict JSON reader of json.h: recursive descent over a byte
 * range, every node, string and child array allocated from one arena of
 * blocks owned by the rb_json_doc.
 *
 * Does not: keep the input, accept anything RFC 8259 rejects, recurse
 * deeper than RB_JSON_MAX_DEPTH (so a hostile input cannot overflow the C
 * stack).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "status.h"

typedef struct jblock {
    struct jblock *next;
    size_t used, size;
    max_align_t data[];
} jblock;

typedef struct jparser {
    const char *s;
    size_t len, pos;
    jblock *blocks;
    rb_error *err;
    rb_status st;
} jparser;

static void *jalloc(jparser *p, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    jblock *b = p->blocks;
    if (!b || b->size - b->used < n) {
        size_t size = n > 16384 ? n : 16384;
        b = malloc(sizeof *b + size);
        if (!b)
            return NULL;
        b->next = p->blocks;
        b->used = 0;
        b->size = size;
        p->blocks = b;
    }
    void *r = (char *)b->data + b->used;
    b->used += n;
    memset(r, 0, n);
    return r;
}

static int fail(jparser *p, rb_status st, const char *what)
{
    if (p->st != RB_OK)
        return 0;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < p->pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    p->st = st;
    rb_error_set(p->err, st, "json: %s at offset %zu (line %zu, column %zu)", what, p->pos,
                 line, col);
    return 0;
}

static void skip_ws(jparser *p)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        p->pos++;
    }
}

static int hex4(jparser *p, uint32_t *out)
{
    if (p->len - p->pos < 4)
        return fail(p, RB_E_FORMAT, "\\u escape needs 4 hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return fail(p, RB_E_FORMAT, "\\u escape needs 4 hex digits");
    }
    *out = v;
    return 1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of a valid UTF-8 sequence at s[0..n), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t k;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        k = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < k)
        return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return k;
}

/* A string at p->pos (on its opening quote). */
static int parse_string(jparser *p, const char **out, size_t *out_len)
{
    p->pos++;
    /* The decoded text is never longer than the source. */
    size_t start = p->pos, end = start;
    while (end < p->len && p->s[end] != '"') {
        if (p->s[end] == '\\')
            end++;
        end++;
    }
    char *o = jalloc(p, (end > p->len ? p->len : end) - start + 1);
    if (!o)
        return fail(p, RB_E_NOMEM, "out of memory");
    size_t n = 0;
    for (;;) {
        if (p->pos >= p->len)
            return fail(p, RB_E_FORMAT, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20)
            return fail(p, RB_E_FORMAT, "control character in a string");
        if (c != '\\') {
            size_t k = utf8_len((const unsigned char *)p->s + p->pos, p->len - p->pos);
            if (!k)
                return fail(p, RB_E_FORMAT, "invalid UTF-8 in a string");
            memcpy(o + n, p->s + p->pos, k);
            n += k;
            p->pos += k;
            continue;
        }
        p->pos++;
        if (p->pos >= p->len)
            return fail(p, RB_E_FORMAT, "unterminated string");
        char e = p->s[p->pos++];
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            uint32_t cp;
            if (!hex4(p, &cp))
                return 0;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return fail(p, RB_E_FORMAT, "lone low surrogate in \\u escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                    return fail(p, RB_E_FORMAT, "high surrogate without a low one");
                p->pos += 2;
                if (!hex4(p, &lo))
                    return 0;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return fail(p, RB_E_FORMAT, "high surrogate without a low one");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            n += put_utf8(o + n, cp);
            break;
        }
        default:
            p->pos--;
            return fail(p, RB_E_FORMAT, "invalid escape in a string");
        }
    }
    o[n] = 0;
    *out = o;
    *out_len = n;
    return 1;
}

static int parse_number(jparser *p, rb_json *v)
{
    size_t start = p->pos;
    const char *s = p->s;
    int is_int = 1;
    if (p->pos < p->len && s[p->pos] == '-')
        p->pos++;
    if (p->pos >= p->len || !(s[p->pos] >= '0' && s[p->pos] <= '9'))
        return fail(p, RB_E_FORMAT, "a number needs a digit");
    if (s[p->pos] == '0') {
        p->pos++;
        if (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            return fail(p, RB_E_FORMAT, "leading zero in a number");
    } else {
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
    }
    if (p->pos < p->len && s[p->pos] == '.') {
        is_int = 0;
        p->pos++;
        if (p->pos >= p->len || !(s[p->pos] >= '0' && s[p->pos] <= '9'))
            return fail(p, RB_E_FORMAT, "a fraction needs a digit");
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        is_int = 0;
        p->pos++;
        if (p->pos < p->len && (s[p->pos] == '+' || s[p->pos] == '-'))
            p->pos++;
        if (p->pos >= p->len || !(s[p->pos] >= '0' && s[p->pos] <= '9'))
            return fail(p, RB_E_FORMAT, "an exponent needs a digit");
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9')
            p->pos++;
    }
    char buf[64];
    size_t n = p->pos - start;
    if (n < sizeof buf) {
        memcpy(buf, s + start, n);
        buf[n] = 0;
        v->number = strtod(buf, NULL);
    } else {
        char *t = jalloc(p, n + 1);
        if (!t)
            return fail(p, RB_E_NOMEM, "out of memory");
        memcpy(t, s + start, n);
        v->number = strtod(t, NULL);
    }
    v->type = RB_JSON_NUMBER;
    v->is_integer = is_int;
    v->raw = s + start;
    v->raw_len = n;
    return 1;
}

static int match_word(jparser *p, const char *w)
{
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0)
        return fail(p, RB_E_FORMAT, "unexpected character");
    p->pos += n;
    return 1;
}

/* Items gathered on the C stack in chunks, then copied to the arena. */
typedef struct jlist {
    rb_json **items;
    const char **keys;
    size_t *key_lens;
    size_t n, cap;
} jlist;

static int jlist_push(jparser *p, jlist *l, rb_json *v, const char *key, size_t key_len)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 8;
        rb_json **items = jalloc(p, cap * sizeof *items);
        const char **keys = jalloc(p, cap * sizeof *keys);
        size_t *lens = jalloc(p, cap * sizeof *lens);
        if (!items || !keys || !lens)
            return fail(p, RB_E_NOMEM, "out of memory");
        if (l->n) {
            memcpy(items, l->items, l->n * sizeof *items);
            memcpy(keys, l->keys, l->n * sizeof *keys);
            memcpy(lens, l->key_lens, l->n * sizeof *lens);
        }
        l->items = items;
        l->keys = keys;
        l->key_lens = lens;
        l->cap = cap;
    }
    l->items[l->n] = v;
    l->keys[l->n] = key;
    l->key_lens[l->n] = key_len;
    l->n++;
    return 1;
}

static rb_json *parse_value(jparser *p, int depth)
{
    skip_ws(p);
    if (p->pos >= p->len) {
        fail(p, RB_E_FORMAT, "unexpected end of input");
        return NULL;
    }
    if (depth > RB_JSON_MAX_DEPTH) {
        fail(p, RB_E_FORMAT, "nesting deeper than 64");
        return NULL;
    }
    rb_json *v = jalloc(p, sizeof *v);
    if (!v) {
        fail(p, RB_E_NOMEM, "out of memory");
        return NULL;
    }
    char c = p->s[p->pos];
    if (c == '{' || c == '[') {
        int is_obj = c == '{';
        char close = is_obj ? '}' : ']';
        jlist l = {0};
        p->pos++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == close) {
            p->pos++;
        } else {
            for (;;) {
                const char *key = NULL;
                size_t key_len = 0;
                if (is_obj) {
                    skip_ws(p);
                    if (p->pos >= p->len || p->s[p->pos] != '"') {
                        fail(p, RB_E_FORMAT, "expected a string key");
                        return NULL;
                    }
                    if (!parse_string(p, &key, &key_len))
                        return NULL;
                    skip_ws(p);
                    if (p->pos >= p->len || p->s[p->pos] != ':') {
                        fail(p, RB_E_FORMAT, "expected ':' after a key");
                        return NULL;
                    }
                    p->pos++;
                }
                rb_json *item = parse_value(p, depth + 1);
                if (!item || !jlist_push(p, &l, item, key, key_len))
                    return NULL;
                skip_ws(p);
                if (p->pos < p->len && p->s[p->pos] == ',') {
                    p->pos++;
                    continue;
                }
                if (p->pos < p->len && p->s[p->pos] == close) {
                    p->pos++;
                    break;
                }
                fail(p, RB_E_FORMAT, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
                return NULL;
            }
        }
        v->type = is_obj ? RB_JSON_OBJECT : RB_JSON_ARRAY;
        v->n = l.n;
        v->items = l.items;
        if (is_obj) {
            v->keys = l.keys;
            v->key_lens = l.key_lens;
        }
        return v;
    }
    if (c == '"') {
        v->type = RB_JSON_STRING;
        return parse_string(p, &v->str, &v->str_len) ? v : NULL;
    }
    if (c == '-' || (c >= '0' && c <= '9'))
        return parse_number(p, v) ? v : NULL;
    if (c == 't' || c == 'f') {
        v->type = RB_JSON_BOOL;
        v->is_true = c == 't';
        return match_word(p, c == 't' ? "true" : "false") ? v : NULL;
    }
    if (c == 'n') {
        v->type = RB_JSON_NULL;
        return match_word(p, "null") ? v : NULL;
    }
    fail(p, RB_E_FORMAT, "unexpected character");
    return NULL;
}

static void free_blocks(jblock *b)
{
    while (b) {
        jblock *next = b->next;
        free(b);
        b = next;
    }
}

rb_status rb_json_parse(const char *text, size_t len, rb_json_doc *doc, rb_error *err)
{
    if (!doc || (!text && len))
        return rb_error_set(err, RB_E_INVALID_ARG, "json: text or doc is NULL");
    jparser p = {.s = text ? text : "", .len = len, .err = err, .st = RB_OK};
    rb_json *root = parse_value(&p, 0);
    if (root) {
        skip_ws(&p);
        if (p.pos != p.len)
            fail(&p, RB_E_FORMAT, "text after the value");
    }
    if (p.st != RB_OK) {
        free_blocks(p.blocks);
        return p.st;
    }
    doc->root = root;
    doc->blocks = p.blocks;
    return RB_OK;
}

void rb_json_free(rb_json_doc *doc)
{
    if (!doc)
        return;
    free_blocks(doc->blocks);
    doc->blocks = NULL;
    doc->root = NULL;
}

const rb_json *rb_json_get(const rb_json *obj, const char *key)
{
    if (!obj || obj->type != RB_JSON_OBJECT)
        return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < obj->n; i++)
        if (obj->key_lens[i] == n && memcmp(obj->keys[i], key, n) == 0)
            return obj->items[i];
    return NULL;
}

int rb_json_equal(const rb_json *a, const rb_json *b)
{
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case RB_JSON_NULL: return 1;
    case RB_JSON_BOOL: return a->is_true == b->is_true;
    case RB_JSON_NUMBER: return a->number == b->number;
    case RB_JSON_STRING:
        return a->str_len == b->str_len && memcmp(a->str, b->str, a->str_len) == 0;
    case RB_JSON_ARRAY:
        if (a->n != b->n)
            return 0;
        for (size_t i = 0; i < a->n; i++)
            if (!rb_json_equal(a->items[i], b->items[i]))
                return 0;
        return 1;
    case RB_JSON_OBJECT:
        if (a->n != b->n)
            return 0;
        for (size_t i = 0; i < a->n; i++) {
            size_t j;
            for (j = 0; j < b->n; j++)
                if (a->key_lens[i] == b->key_lens[j] &&
                    memcmp(a->keys[i], b->keys[j], a->key_lens[i]) == 0)
                    break;
            if (j == b->n || !rb_json_equal(a->items[i], b->items[j]))
                return 0;
        }
        return 1;
    }
    return 0;
}
