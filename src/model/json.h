/*
 * json.h - a small, strict JSON (RFC 8259) reader for the grammar module's
 * JSON Schemas and for the tests that validate generated JSON.
 *
 * Strict: one value and only whitespace around it; no comments, trailing
 * commas, single quotes, NaN/Infinity, leading zeros or unescaped control
 * characters; \u escapes must pair surrogates. Nesting is capped at
 * RB_JSON_MAX_DEPTH. Errors name the byte offset, line and column.
 *
 * Memory: the whole tree (nodes, decoded strings, child arrays) lives in
 * one rb_json_doc and is freed by rb_json_free; nodes point into it.
 */
#ifndef RB_JSON_H
#define RB_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

#define RB_JSON_MAX_DEPTH 64

typedef enum rb_json_type {
    RB_JSON_NULL = 0,
    RB_JSON_BOOL,
    RB_JSON_NUMBER,
    RB_JSON_STRING,
    RB_JSON_ARRAY,
    RB_JSON_OBJECT
} rb_json_type;

typedef struct rb_json rb_json;
struct rb_json {
    rb_json_type type;
    int is_true;            /* BOOL */
    int is_integer;         /* NUMBER written without fraction or exponent */
    double number;          /* NUMBER */
    const char *str;        /* STRING: decoded UTF-8, NUL-terminated (may hold NULs) */
    size_t str_len;
    const char *raw;        /* NUMBER: its text as written (not terminated) */
    size_t raw_len;
    size_t n;               /* ARRAY / OBJECT: number of items or members */
    rb_json **items;        /* ARRAY: [n]; OBJECT: the values [n] */
    const char **keys;      /* OBJECT: [n] decoded keys */
    size_t *key_lens;       /* OBJECT: [n] */
};

typedef struct rb_json_doc {
    rb_json *root;
    void *blocks;           /* the arena's block list */
} rb_json_doc;

/* Parses text[0..len). On success doc->root is the value. Errors:
 * RB_E_FORMAT (the message names offset, line, column and what is wrong),
 * RB_E_NOMEM. On failure doc holds nothing to free. */
rb_status rb_json_parse(const char *text, size_t len, rb_json_doc *doc, rb_error *err);
void rb_json_free(rb_json_doc *doc);

/* The member named key of an object, or NULL (also when obj is not one). */
const rb_json *rb_json_get(const rb_json *obj, const char *key);

/* 1 when a and b are equal JSON values (numbers by value, objects as sets
 * of members). */
int rb_json_equal(const rb_json *a, const rb_json *b);

#endif
