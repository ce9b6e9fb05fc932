/*
 * json_schema.c - JSON Schema to GBNF: the grammar text whose root matches
 * compact-ish JSON (bounded whitespace) that validates against the schema.
 * rb_grammar_from_json_schema compiles it.
 *
 * Does not: validate (the tests do), generate every valid document (only
 * valid ones: the declared properties in the schema's order, no extra keys;
 * a number with bounds comes out as an integer within them), or accept a
 * keyword it cannot honour: those are RB_E_UNSUPPORTED naming the keyword
 * and its JSON pointer. Annotations (title, description, default, examples,
 * $schema, $id, $comment, strict, and formats other than date and uuid) are
 * ignored, as validators ignore them.
 *
 * An object's properties come in the schema's order, each optional one
 * free to be left out, with commas right: rule f<i> is "nothing written
 * yet, at property i" (kv_j t<j+1> for each j >= i reachable by skipping
 * only optional properties, or "" when the rest are all optional), rule
 * t<i> the same after something was written (each kv_j preceded by ",").
 *
 * Output layout: one rule per schema node (r1, r2, ...), one per $ref'd
 * definition (d1, ...; emitted once, so recursive schemas work), and the
 * shared primitives (ws, string, char, number, integer, value, ...), all
 * into one growable buffer.
 *
 * Memory: the parsed schema (json.c) and the output buffer, both freed
 * before returning (the buffer is handed to the caller on success).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json.h"
#include "status.h"

#define RB_JS_MAX_DEPTH 64
#define RB_JS_MAX_DIGITS 15 /* integers stay below 10^16, exact in a double */

typedef struct sbuf {
    char *s;
    size_t n, cap;
    int is_oom;
} sbuf;

typedef struct jref {
    const char *ref;
    char name[16];
} jref;

typedef struct conv {
    sbuf out;
    const rb_json *root;
    jref *refs;
    size_t n_refs, cap_refs;
    unsigned n_rules, n_defs;
    rb_error *err;
    rb_status st;
    int depth;
} conv;

__attribute__((format(printf, 2, 3))) static void put(sbuf *b, const char *fmt, ...)
{
    if (b->is_oom)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->is_oom = 1;
            return;
        }
        if (b->s && b->n + (size_t)n < b->cap) {
            b->n += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + (size_t)n + 1)
            cap *= 2;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->is_oom = 1;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

__attribute__((format(printf, 3, 4))) static int unsupported(conv *c, const char *path,
                                                             const char *fmt, ...)
{
    if (c->st != RB_OK)
        return 0;
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    c->st = RB_E_UNSUPPORTED;
    rb_error_set(c->err, RB_E_UNSUPPORTED, "json schema: at '%s': %s", path[0] ? path : "/",
                 what);
    return 0;
}

/* Appends a GBNF string literal of bytes s[0..n). */
static void put_lit(sbuf *b, const char *s, size_t n)
{
    put(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            put(b, "\\%c", c);
        else if (c == '\n')
            put(b, "\\n");
        else if (c < 0x20 || c == 0x7F)
            put(b, "\\x%02X", c);
        else
            put(b, "%c", c);
    }
    put(b, "\"");
}

/* Appends v as compact JSON into b. */
static void put_json(sbuf *b, const rb_json *v)
{
    switch (v->type) {
    case RB_JSON_NULL: put(b, "null"); break;
    case RB_JSON_BOOL: put(b, v->is_true ? "true" : "false"); break;
    case RB_JSON_NUMBER: put(b, "%.*s", (int)v->raw_len, v->raw); break;
    case RB_JSON_STRING:
        put(b, "\"");
        for (size_t i = 0; i < v->str_len; i++) {
            unsigned char c = (unsigned char)v->str[i];
            if (c == '"' || c == '\\')
                put(b, "\\%c", c);
            else if (c == '\n')
                put(b, "\\n");
            else if (c < 0x20)
                put(b, "\\u%04x", c);
            else
                put(b, "%c", c);
        }
        put(b, "\"");
        break;
    case RB_JSON_ARRAY:
        put(b, "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                put(b, ",");
            put_json(b, v->items[i]);
        }
        put(b, "]");
        break;
    case RB_JSON_OBJECT:
        put(b, "{");
        for (size_t i = 0; i < v->n; i++) {
            rb_json k = {.type = RB_JSON_STRING, .str = v->keys[i], .str_len = v->key_lens[i]};
            if (i)
                put(b, ",");
            put_json(b, &k);
            put(b, ":");
            put_json(b, v->items[i]);
        }
        put(b, "}");
        break;
    }
}

/* A GBNF literal matching exactly the compact JSON of v. */
static void put_json_lit(sbuf *b, const rb_json *v)
{
    sbuf t = {0};
    put_json(&t, v);
    if (t.is_oom)
        b->is_oom = 1;
    else
        put_lit(b, t.s, t.n);
    free(t.s);
}

static const char PRIMITIVES[] =
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,4}\n"
    "string ::= \"\\\"\" char* \"\\\"\"\n"
    "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CefEF] hex{3} | "
    "[dD] [0-7] hex{2}))\n"
    "hex ::= [0-9a-fA-F]\n"
    "integer ::= \"-\"? (\"0\" | [1-9] [0-9]{0,14})\n"
    "number ::= integer (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?\n"
    "boolean ::= \"true\" | \"false\"\n"
    "null ::= \"null\"\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws (string ws \":\" ws value ws (\",\" ws string ws \":\" ws value ws)*)? "
    "\"}\"\n"
    "array ::= \"[\" ws (value ws (\",\" ws value ws)*)? \"]\"\n"
    "date ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" "
    "[01])\n"
    "uuid ::= hex{8} \"-\" hex{4} \"-\" hex{4} \"-\" hex{4} \"-\" hex{12}\n";

/* ---- integer ranges ------------------------------------------------------- */

/* Same-length digit strings a <= b: an expression for every number between. */
static void range_same_len(sbuf *b, const char *a, const char *z, size_t n)
{
    if (n == 0)
        return;
    if (a[0] == z[0]) {
        put(b, "\"%c\"", a[0]);
        if (n > 1) {
            put(b, " ");
            range_same_len(b, a + 1, z + 1, n - 1);
        }
        return;
    }
    char nines[RB_JS_MAX_DIGITS + 2], zeros[RB_JS_MAX_DIGITS + 2];
    memset(nines, '9', n);
    memset(zeros, '0', n);
    put(b, "(\"%c\"", a[0]);
    if (n > 1) {
        put(b, " ");
        range_same_len(b, a + 1, nines, n - 1);
    }
    if (a[0] + 1 <= z[0] - 1) {
        put(b, " | [%c-%c]", a[0] + 1, z[0] - 1);
        if (n > 1)
            put(b, " [0-9]{%zu}", n - 1);
    }
    put(b, " | \"%c\"", z[0]);
    if (n > 1) {
        put(b, " ");
        range_same_len(b, zeros, z + 1, n - 1);
    }
    put(b, ")");
}

static uint64_t pow10u(int e)
{
    uint64_t v = 1;
    while (e-- > 0)
        v *= 10;
    return v;
}

/* Alternatives for lo <= x <= hi, 0 <= lo <= hi < 10^15; hi = UINT64_MAX:
 * no upper bound (up to 15 digits). Appends " | "-joined parts. */
static void range_nonneg(sbuf *b, uint64_t lo, uint64_t hi, int *first)
{
    int bounded = hi != UINT64_MAX;
    for (int len = 1; len <= RB_JS_MAX_DIGITS; len++) {
        uint64_t l0 = len == 1 ? 0 : pow10u(len - 1), h0 = pow10u(len) - 1;
        uint64_t l = lo > l0 ? lo : l0, h = bounded && hi < h0 ? hi : h0;
        if (l > h)
            continue;
        char as[24], zs[24];
        snprintf(as, sizeof as, "%llu", (unsigned long long)l);
        snprintf(zs, sizeof zs, "%llu", (unsigned long long)h);
        put(b, *first ? "(" : " | (");
        *first = 0;
        range_same_len(b, as, zs, (size_t)len);
        put(b, ")");
    }
}

/* An expression for the integers in [lo, hi] (has_lo/has_hi: bounded). */
static int put_int_range(conv *c, const char *path, int has_lo, double lo, int has_hi, double hi)
{
    const double lim = 1e15 - 1;
    if ((has_lo && lo > lim) || (has_hi && hi < -lim))
        return unsupported(c, path, "bounds beyond 10^15 are not supported");
    if (has_lo && lo < -lim)
        has_lo = 0;
    if (has_hi && hi > lim)
        has_hi = 0;
    if (has_lo && has_hi && lo > hi)
        return unsupported(c, path, "no integer lies between the bounds %.17g and %.17g", lo, hi);
    sbuf *b = &c->out;
    int first = 1;
    put(b, "(");
    /* x >= 0 */
    if (!has_hi || hi >= 0)
        range_nonneg(b, has_lo && lo > 0 ? (uint64_t)lo : 0, has_hi ? (uint64_t)hi : UINT64_MAX,
                     &first);
    /* x < 0: "-" and the magnitude in [max(1, -hi), -lo] */
    if (!has_lo || lo < 0) {
        uint64_t mlo = has_hi && hi < 0 ? (uint64_t)-hi : 1;
        uint64_t mhi = has_lo ? (uint64_t)-lo : UINT64_MAX;
        put(b, first ? "\"-\" (" : " | \"-\" (");
        int f2 = 1;
        first = 0;
        range_nonneg(b, mlo, mhi, &f2);
        put(b, ")");
    }
    put(b, ")");
    return 1;
}

/* ---- patterns (a regular expression subset) -------------------------------- */

typedef struct rx {
    const char *s;
    size_t n, i;
    conv *c;
    const char *path;
} rx;

static int rx_alt(rx *r, sbuf *b, int depth);

/* A JSON-safe GBNF piece for one literal code point given as UTF-8 bytes. */
static void rx_put_char(sbuf *b, const char *s, size_t n)
{
    if (n == 1 && (s[0] == '"' || s[0] == '\\')) {
        put(b, "\"\\\\\\%c\"", s[0]);
        return;
    }
    put_lit(b, s, n);
}

static size_t u8len(unsigned char c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

static int rx_class(rx *r, sbuf *b)
{
    /* [ already consumed; copy into a GBNF class, \d \w \s expanded; a
     * negated class also excludes what JSON must escape */
    int neg = r->i < r->n && r->s[r->i] == '^';
    if (neg)
        r->i++;
    put(b, neg ? "[^\"\\\\\\x00-\\x1F" : "[");
    int any = 0;
    while (r->i < r->n && (r->s[r->i] != ']' || (!any && !neg && 0))) {
        char ch = r->s[r->i];
        if (ch == '\\') {
            if (r->i + 1 >= r->n)
                return unsupported(r->c, r->path, "pattern ends inside a class");
            char e = r->s[r->i + 1];
            r->i += 2;
            if (e == 'd')
                put(b, "0-9");
            else if (e == 'w')
                put(b, "a-zA-Z0-9_");
            else if (e == 's')
                put(b, " \\t\\n\\r");
            else if (e == 'n')
                put(b, "\\n");
            else if (e == 't')
                put(b, "\\t");
            else if (e == '"' || e == '\\')
                return unsupported(r->c, r->path, "pattern class with '%c' is not supported", e);
            else if (strchr(".-^[]()|*+?{}/$", e))
                put(b, "\\%c", e);
            else
                return unsupported(r->c, r->path, "pattern escape '\\%c' is not supported", e);
        } else if (ch == '"' || (unsigned char)ch < 0x20) {
            return unsupported(r->c, r->path,
                               "pattern class with a quote or control character is not supported");
        } else if (ch == '[') {
            return unsupported(r->c, r->path, "nested classes in a pattern are not supported");
        } else {
            size_t k = u8len((unsigned char)ch);
            put(b, "%.*s", (int)k, r->s + r->i);
            r->i += k;
        }
        any = 1;
    }
    if (r->i >= r->n)
        return unsupported(r->c, r->path, "pattern has an unterminated class");
    r->i++;
    put(b, "]");
    return 1;
}

static int rx_atom(rx *r, sbuf *b, int depth)
{
    char ch = r->s[r->i];
    if (ch == '(') {
        r->i++;
        if (r->i + 1 < r->n && r->s[r->i] == '?' && r->s[r->i + 1] == ':')
            r->i += 2;
        else if (r->i < r->n && r->s[r->i] == '?')
            return unsupported(r->c, r->path, "pattern group '(?' other than '(?:'");
        put(b, "(");
        if (!rx_alt(r, b, depth + 1))
            return 0;
        if (r->i >= r->n || r->s[r->i] != ')')
            return unsupported(r->c, r->path, "pattern has an unclosed group");
        r->i++;
        put(b, ")");
        return 1;
    }
    if (ch == '[') {
        r->i++;
        return rx_class(r, b);
    }
    if (ch == '.') {
        r->i++;
        put(b, "[^\"\\\\\\x00-\\x1F]");
        return 1;
    }
    if (ch == '\\') {
        if (r->i + 1 >= r->n)
            return unsupported(r->c, r->path, "pattern ends with '\\'");
        char e = r->s[r->i + 1];
        r->i += 2;
        switch (e) {
        case 'd': put(b, "[0-9]"); return 1;
        case 'w': put(b, "[a-zA-Z0-9_]"); return 1;
        case 's': put(b, "(\" \" | \"\\\\t\" | \"\\\\n\")"); return 1;
        case 'D': put(b, "[^0-9\"\\\\\\x00-\\x1F]"); return 1;
        case 'W': put(b, "[^a-zA-Z0-9_\"\\\\\\x00-\\x1F]"); return 1;
        default:
            if (strchr(".-^[]()|*+?{}/$\\\"", e)) {
                rx_put_char(b, &e, 1);
                return 1;
            }
            return unsupported(r->c, r->path, "pattern escape '\\%c' is not supported", e);
        }
    }
    if (strchr("*+?{", ch))
        return unsupported(r->c, r->path, "pattern quantifier '%c' without an item", ch);
    if ((unsigned char)ch < 0x20)
        return unsupported(r->c, r->path, "pattern has a control character");
    size_t k = u8len((unsigned char)ch);
    if (r->i + k > r->n)
        k = r->n - r->i;
    rx_put_char(b, r->s + r->i, k);
    r->i += k;
    return 1;
}

static int rx_seq(rx *r, sbuf *b, int depth)
{
    int any = 0;
    while (r->i < r->n && r->s[r->i] != '|' && r->s[r->i] != ')') {
        if (r->s[r->i] == '^' && r->i == 0) {
            r->i++;
            continue;
        }
        if (r->s[r->i] == '$' && r->i + 1 == r->n) {
            r->i++;
            continue;
        }
        if (r->s[r->i] == '^' || r->s[r->i] == '$')
            return unsupported(r->c, r->path, "pattern anchors inside the pattern");
        if (any)
            put(b, " ");
        if (!rx_atom(r, b, depth))
            return 0;
        any = 1;
        while (r->i < r->n && strchr("*+?{", r->s[r->i])) {
            char q = r->s[r->i++];
            if (q == '{') {
                size_t s = r->i;
                while (r->i < r->n && r->s[r->i] != '}')
                    r->i++;
                if (r->i >= r->n)
                    return unsupported(r->c, r->path, "pattern quantifier '{' not closed");
                put(b, "{%.*s}", (int)(r->i - s), r->s + s);
                r->i++;
            } else {
                put(b, "%c", q);
            }
            if (r->i < r->n && r->s[r->i] == '?')
                r->i++; /* lazy: the same language */
        }
    }
    if (!any)
        put(b, "\"\"");
    return 1;
}

static int rx_alt(rx *r, sbuf *b, int depth)
{
    if (depth > 32)
        return unsupported(r->c, r->path, "pattern nested deeper than 32 groups");
    if (!rx_seq(r, b, depth))
        return 0;
    while (r->i < r->n && r->s[r->i] == '|') {
        r->i++;
        put(b, " | ");
        if (!rx_seq(r, b, depth))
            return 0;
    }
    return 1;
}

/* ---- schema nodes ------------------------------------------------------------ */

static int gen(conv *c, const rb_json *s, const char *path, char *name);

static const char *const IGNORED[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "strict",
    "format", "$defs", "definitions", "readOnly", "writeOnly", "deprecated", "name", NULL};

static const char *const HANDLED[] = {
    "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems",
    "enum", "const", "pattern", "minLength", "maxLength", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "nullable",
    NULL};

static int check_keywords(conv *c, const rb_json *s, const char *path)
{
    for (size_t i = 0; i < s->n; i++) {
        int known = 0;
        for (const char *const *k = IGNORED; *k && !known; k++)
            known = strlen(*k) == s->key_lens[i] && memcmp(*k, s->keys[i], s->key_lens[i]) == 0;
        for (const char *const *k = HANDLED; *k && !known; k++)
            known = strlen(*k) == s->key_lens[i] && memcmp(*k, s->keys[i], s->key_lens[i]) == 0;
        if (!known)
            return unsupported(c, path, "keyword '%.*s' is not supported",
                               (int)s->key_lens[i], s->keys[i]);
    }
    return 1;
}

static int get_count(conv *c, const rb_json *s, const char *key, const char *path, long *out)
{
    const rb_json *v = rb_json_get(s, key);
    if (!v)
        return 1;
    if (v->type != RB_JSON_NUMBER || !v->is_integer || v->number < 0 || v->number > 100000)
        return unsupported(c, path, "'%s' must be an integer in [0, 100000]", key);
    *out = (long)v->number;
    return 1;
}

static void new_rule(conv *c, char *name)
{
    snprintf(name, 16, "r%u", ++c->n_rules);
}

/* The rule for a $ref, emitted once. */
static int gen_ref(conv *c, const rb_json *s, const char *path, char *name)
{
    const rb_json *ref = rb_json_get(s, "$ref");
    if (ref->type != RB_JSON_STRING)
        return unsupported(c, path, "'$ref' must be a string");
    for (size_t i = 0; i < c->n_refs; i++)
        if (strcmp(c->refs[i].ref, ref->str) == 0) {
            memcpy(name, c->refs[i].name, 16);
            return 1;
        }
    const rb_json *target = NULL;
    if (strcmp(ref->str, "#") == 0) {
        target = c->root;
    } else if (strncmp(ref->str, "#/$defs/", 8) == 0) {
        target = rb_json_get(rb_json_get(c->root, "$defs"), ref->str + 8);
    } else if (strncmp(ref->str, "#/definitions/", 14) == 0) {
        target = rb_json_get(rb_json_get(c->root, "definitions"), ref->str + 14);
    } else {
        return unsupported(c, path, "'$ref' \"%s\": only #, #/$defs/<name> and "
                                    "#/definitions/<name> are supported", ref->str);
    }
    if (!target)
        return unsupported(c, path, "'$ref' \"%s\" names no definition", ref->str);
    if (c->n_refs == c->cap_refs) {
        size_t cap = c->cap_refs ? 2 * c->cap_refs : 8;
        jref *r = realloc(c->refs, cap * sizeof *r);
        if (!r) {
            c->out.is_oom = 1;
            return 0;
        }
        c->refs = r;
        c->cap_refs = cap;
    }
    jref *r = &c->refs[c->n_refs++];
    r->ref = ref->str;
    snprintf(r->name, sizeof r->name, "d%u", ++c->n_defs);
    memcpy(name, r->name, 16);
    char inner[16];
    if (!gen(c, target, ref->str + 1, inner))
        return 0;
    put(&c->out, "%s ::= %s\n", name, inner);
    return 1;
}

static int gen_object(conv *c, const rb_json *s, const char *path, char *name)
{
    const rb_json *props = rb_json_get(s, "properties");
    const rb_json *req = rb_json_get(s, "required");
    const rb_json *addl = rb_json_get(s, "additionalProperties");
    if (props && props->type != RB_JSON_OBJECT)
        return unsupported(c, path, "'properties' must be an object");
    if (req && req->type != RB_JSON_ARRAY)
        return unsupported(c, path, "'required' must be an array");
    size_t n = props ? props->n : 0;
    if (req)
        for (size_t j = 0; j < req->n; j++) {
            if (req->items[j]->type != RB_JSON_STRING)
                return unsupported(c, path, "'required' holds a non-string");
            size_t i;
            for (i = 0; i < n; i++)
                if (props->key_lens[i] == req->items[j]->str_len &&
                    memcmp(props->keys[i], req->items[j]->str, props->key_lens[i]) == 0)
                    break;
            if (i == n)
                return unsupported(c, path, "required property '%s' is not in 'properties'",
                                   req->items[j]->str);
        }
    if (n == 0) {
        if (addl && addl->type == RB_JSON_OBJECT) {
            char v[16];
            char sub[512];
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            if (!gen(c, addl, sub, v))
                return 0;
            new_rule(c, name);
            put(&c->out,
                "%s ::= \"{\" ws (string ws \":\" ws %s ws (\",\" ws string ws \":\" ws %s ws)*)? "
                "\"}\"\n", name, v, v);
            return 1;
        }
        if (addl && addl->type == RB_JSON_BOOL && !addl->is_true) {
            new_rule(c, name);
            put(&c->out, "%s ::= \"{\" ws \"}\"\n", name);
            return 1;
        }
        strcpy(name, "object");
        return 1;
    }
    if (n > 256)
        return unsupported(c, path, "over 256 properties");
    /* kv rules, then first_i / rest_i chains (see the file comment) */
    char (*kv)[16] = calloc(n, 16);
    uint8_t *is_req = calloc(n, 1);
    if (!kv || !is_req) {
        free(kv);
        free(is_req);
        c->out.is_oom = 1;
        return 0;
    }
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        rb_json key = {.type = RB_JSON_STRING, .str = props->keys[i], .str_len = props->key_lens[i]};
        for (size_t j = 0; req && j < req->n; j++)
            if (req->items[j]->str_len == key.str_len &&
                memcmp(req->items[j]->str, key.str, key.str_len) == 0)
                is_req[i] = 1;
        char sub[512], v[16];
        snprintf(sub, sizeof sub, "%s/properties/%.*s", path, (int)key.str_len, key.str);
        ok = gen(c, props->items[i], sub, v);
        if (!ok)
            break;
        new_rule(c, kv[i]);
        put(&c->out, "%s ::= ", kv[i]);
        put_json_lit(&c->out, &key);
        put(&c->out, " ws \":\" ws %s ws\n", v);
    }
    if (ok) {
        unsigned base = c->n_rules;
        c->n_rules += (unsigned)(2 * n + 2);
        /* f<i>: nothing emitted yet, at property i; t<i>: something emitted */
        for (size_t i = 0; i <= n; i++) {
            for (int rest = 0; rest < 2; rest++) {
                put(&c->out, "r%u ::= ", base + 1 + (unsigned)(2 * i) + (unsigned)rest);
                int alts = 0;
                for (size_t j = i; j < n; j++) {
                    put(&c->out, "%s%s%s r%u", alts++ ? " | " : "", rest ? "\",\" ws " : "",
                        kv[j], base + 1 + (unsigned)(2 * (j + 1)) + 1);
                    if (is_req[j])
                        break;
                }
                size_t j = i;
                while (j < n && !is_req[j])
                    j++;
                if (j == n)
                    put(&c->out, "%s\"\"", alts ? " | " : "");
                put(&c->out, "\n");
            }
        }
        new_rule(c, name);
        put(&c->out, "%s ::= \"{\" ws r%u \"}\"\n", name, base + 1);
    }
    free(kv);
    free(is_req);
    return ok;
}

static int gen_typed(conv *c, const rb_json *s, const char *type, const char *path, char *name)
{
    sbuf *b = &c->out;
    if (strcmp(type, "object") == 0)
        return gen_object(c, s, path, name);
    if (strcmp(type, "null") == 0 || strcmp(type, "boolean") == 0) {
        strcpy(name, type);
        return 1;
    }
    if (strcmp(type, "string") == 0) {
        const rb_json *pat = rb_json_get(s, "pattern"), *fmt = rb_json_get(s, "format");
        long min = 0, max = -1;
        if (!get_count(c, s, "minLength", path, &min) || !get_count(c, s, "maxLength", path, &max))
            return 0;
        if (max >= 0 && max < min)
            return unsupported(c, path, "maxLength is below minLength");
        if (pat) {
            if (pat->type != RB_JSON_STRING)
                return unsupported(c, path, "'pattern' must be a string");
            if (min > 0 || max >= 0)
                return unsupported(c, path, "'pattern' with minLength/maxLength");
            new_rule(c, name);
            put(b, "%s ::= \"\\\"\" (", name);
            rx r = {pat->str, pat->str_len, 0, c, path};
            if (!rx_alt(&r, b, 0))
                return 0;
            if (r.i < r.n)
                return unsupported(c, path, "pattern has an unmatched ')'");
            put(b, ") \"\\\"\"\n");
            return 1;
        }
        if (fmt && fmt->type == RB_JSON_STRING && min == 0 && max < 0 &&
            (strcmp(fmt->str, "date") == 0 || strcmp(fmt->str, "uuid") == 0)) {
            new_rule(c, name);
            put(b, "%s ::= \"\\\"\" %s \"\\\"\"\n", name, fmt->str);
            return 1;
        }
        if (min == 0 && max < 0) {
            strcpy(name, "string");
            return 1;
        }
        new_rule(c, name);
        if (max < 0)
            put(b, "%s ::= \"\\\"\" char{%ld,} \"\\\"\"\n", name, min);
        else
            put(b, "%s ::= \"\\\"\" char{%ld,%ld} \"\\\"\"\n", name, min, max);
        return 1;
    }
    if (strcmp(type, "integer") == 0 || strcmp(type, "number") == 0) {
        const rb_json *k[4] = {rb_json_get(s, "minimum"), rb_json_get(s, "exclusiveMinimum"),
                               rb_json_get(s, "maximum"), rb_json_get(s, "exclusiveMaximum")};
        for (int i = 0; i < 4; i++)
            if (k[i] && k[i]->type != RB_JSON_NUMBER)
                return unsupported(c, path, "a numeric bound is not a number");
        int has_lo = 0, has_hi = 0;
        double lo = 0, hi = 0;
        if (k[0]) {
            has_lo = 1;
            lo = ceil(k[0]->number);
        }
        if (k[1]) {
            double v = floor(k[1]->number) + 1;
            lo = has_lo && lo > v ? lo : v;
            has_lo = 1;
        }
        if (k[2]) {
            has_hi = 1;
            hi = floor(k[2]->number);
        }
        if (k[3]) {
            double v = ceil(k[3]->number) - 1;
            hi = has_hi && hi < v ? hi : v;
            has_hi = 1;
        }
        if (!has_lo && !has_hi) {
            strcpy(name, type);
            return 1;
        }
        new_rule(c, name);
        put(b, "%s ::= ", name);
        if (!put_int_range(c, path, has_lo, lo, has_hi, hi))
            return 0;
        put(b, "\n");
        return 1;
    }
    if (strcmp(type, "array") == 0) {
        const rb_json *items = rb_json_get(s, "items");
        long min = 0, max = -1;
        if (!get_count(c, s, "minItems", path, &min) || !get_count(c, s, "maxItems", path, &max))
            return 0;
        if (max >= 0 && max < min)
            return unsupported(c, path, "maxItems is below minItems");
        if (min > 1000 || max > 1000)
            return unsupported(c, path, "minItems/maxItems over 1000");
        char v[16] = "value";
        if (items) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/items", path);
            if (!gen(c, items, sub, v))
                return 0;
        }
        new_rule(c, name);
        if (max == 0) {
            put(b, "%s ::= \"[\" ws \"]\"\n", name);
        } else {
            /* item (, item){min-1, max-1}; optional as a whole when min is 0 */
            long rmin = min > 0 ? min - 1 : 0, rmax = max < 0 ? -1 : max - 1;
            put(b, "%s ::= \"[\" ws %s%s ws (\",\" ws %s ws)", name, min == 0 ? "(" : "", v, v);
            if (rmax < 0)
                put(b, "{%ld,}", rmin);
            else
                put(b, "{%ld,%ld}", rmin, rmax);
            put(b, "%s \"]\"\n", min == 0 ? ")?" : "");
        }
        return 1;
    }
    return unsupported(c, path, "type \"%s\" is not a JSON Schema type", type);
}

static int gen(conv *c, const rb_json *s, const char *path, char *name)
{
    if (c->st != RB_OK || c->out.is_oom)
        return 0;
    if (++c->depth > RB_JS_MAX_DEPTH)
        return unsupported(c, path, "schema nested deeper than %d", RB_JS_MAX_DEPTH);
    int ok = 0;
    sbuf *b = &c->out;
    if (s->type == RB_JSON_BOOL) {
        if (!s->is_true) {
            ok = unsupported(c, path, "schema 'false' admits no value");
        } else {
            strcpy(name, "value");
            ok = 1;
        }
        goto out;
    }
    if (s->type != RB_JSON_OBJECT) {
        ok = unsupported(c, path, "a schema must be an object or a boolean");
        goto out;
    }
    if (!check_keywords(c, s, path))
        goto out;
    const rb_json *v;
    if ((v = rb_json_get(s, "$ref"))) {
        ok = gen_ref(c, s, path, name);
        goto out;
    }
    if ((v = rb_json_get(s, "const"))) {
        new_rule(c, name);
        put(b, "%s ::= ", name);
        put_json_lit(b, v);
        put(b, "\n");
        ok = 1;
        goto out;
    }
    if ((v = rb_json_get(s, "enum"))) {
        if (v->type != RB_JSON_ARRAY || v->n == 0) {
            ok = unsupported(c, path, "'enum' must be a non-empty array");
            goto out;
        }
        new_rule(c, name);
        put(b, "%s ::= ", name);
        for (size_t i = 0; i < v->n; i++) {
            if (i)
                put(b, " | ");
            put_json_lit(b, v->items[i]);
        }
        put(b, "\n");
        ok = 1;
        goto out;
    }
    const char *comb = rb_json_get(s, "anyOf") ? "anyOf" : rb_json_get(s, "oneOf") ? "oneOf"
                       : rb_json_get(s, "allOf") ? "allOf" : NULL;
    if (comb) {
        v = rb_json_get(s, comb);
        if (v->type != RB_JSON_ARRAY || v->n == 0) {
            ok = unsupported(c, path, "'%s' must be a non-empty array", comb);
            goto out;
        }
        if (strcmp(comb, "allOf") == 0 && v->n != 1) {
            ok = unsupported(c, path, "'allOf' with more than one schema");
            goto out;
        }
        char (*names)[16] = calloc(v->n, 16);
        if (!names) {
            b->is_oom = 1;
            goto out;
        }
        ok = 1;
        for (size_t i = 0; i < v->n && ok; i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, comb, i);
            ok = gen(c, v->items[i], sub, names[i]);
        }
        if (ok) {
            new_rule(c, name);
            put(b, "%s ::= ", name);
            for (size_t i = 0; i < v->n; i++)
                put(b, "%s%s", i ? " | " : "", names[i]);
            put(b, "\n");
        }
        free(names);
        goto out;
    }
    v = rb_json_get(s, "type");
    const rb_json *nullable = rb_json_get(s, "nullable");
    int is_nullable = nullable && nullable->type == RB_JSON_BOOL && nullable->is_true;
    if (v && v->type == RB_JSON_ARRAY) {
        if (v->n == 0) {
            ok = unsupported(c, path, "'type' is an empty array");
            goto out;
        }
        char (*names)[16] = calloc(v->n, 16);
        if (!names) {
            b->is_oom = 1;
            goto out;
        }
        ok = 1;
        for (size_t i = 0; i < v->n && ok; i++) {
            if (v->items[i]->type != RB_JSON_STRING)
                ok = unsupported(c, path, "'type' holds a non-string");
            else
                ok = gen_typed(c, s, v->items[i]->str, path, names[i]);
        }
        if (ok) {
            new_rule(c, name);
            put(b, "%s ::= ", name);
            for (size_t i = 0; i < v->n; i++)
                put(b, "%s%s", i ? " | " : "", names[i]);
            put(b, "%s\n", is_nullable ? " | null" : "");
        }
        free(names);
        goto out;
    }
    const char *type = NULL;
    if (v) {
        if (v->type != RB_JSON_STRING) {
            ok = unsupported(c, path, "'type' must be a string or an array of strings");
            goto out;
        }
        type = v->str;
    } else if (rb_json_get(s, "properties") || rb_json_get(s, "additionalProperties")) {
        type = "object";
    } else if (rb_json_get(s, "items")) {
        type = "array";
    }
    if (!type) {
        strcpy(name, "value");
        ok = 1;
        goto out;
    }
    if (is_nullable) {
        char inner[16];
        ok = gen_typed(c, s, type, path, inner);
        if (ok) {
            new_rule(c, name);
            put(b, "%s ::= %s | null\n", name, inner);
        }
        goto out;
    }
    ok = gen_typed(c, s, type, path, name);
out:
    c->depth--;
    return ok && c->st == RB_OK && !b->is_oom;
}

rb_status rb_json_schema_to_grammar(const char *schema, size_t len, char **out, size_t *out_len,
                                    rb_error *err)
{
    if (!out || !out_len || (!schema && len))
        return rb_error_set(err, RB_E_INVALID_ARG, "json schema: schema, out or out_len is NULL");
    conv c = {.err = err, .st = RB_OK};
    rb_json_doc doc = {0};
    char name[16] = "object";
    if (schema && len) {
        rb_status st = rb_json_parse(schema, len, &doc, err);
        if (st != RB_OK)
            return st;
        c.root = doc.root;
        gen(&c, doc.root, "", name);
    }
    if (c.st == RB_OK)
        put(&c.out, "root ::= %s\n%s", name, PRIMITIVES);
    rb_json_free(&doc);
    free(c.refs);
    if (c.st == RB_OK && c.out.is_oom) {
        c.st = RB_E_NOMEM;
        rb_error_set(err, RB_E_NOMEM, "json schema: out of memory");
    }
    if (c.st != RB_OK) {
        free(c.out.s);
        return c.st;
    }
    /* A pattern's classes and counts pass through to the grammar: one the
     * GBNF parser refuses (a reversed range, a bad count) is named here. */
    rb_grammar *g = NULL;
    rb_error gerr;
    rb_status st = rb_grammar_create_vocab(c.out.s, c.out.n, "root", NULL, NULL, NULL, 0, &g,
                                           &gerr);
    rb_grammar_destroy(g);
    if (st != RB_OK) {
        free(c.out.s);
        return rb_error_set(err, st == RB_E_NOMEM ? st : RB_E_UNSUPPORTED,
                            "json schema: a 'pattern' the converter cannot express (%.400s)",
                            gerr.message);
    }
    *out = c.out.s;
    *out_len = c.out.n;
    return RB_OK;
}
