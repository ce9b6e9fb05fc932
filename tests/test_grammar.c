/*
 * test_grammar.c - the grammar module: GBNF parse errors (named with line
 * and column), acceptance of strings, the trie walk's masks against brute
 * force over a random vocabulary, the JSON Schema converter over a dozen
 * kinds of schema (and its refusals), and seeded generation at temperature
 * 1 from a random-weight model under each schema: every output must parse
 * and validate. Fixed seeds throughout.
 */
#include <math.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "grammar.h"
#include "json.h"
#include "testlib.h"

static rb_grammar *compile(const char *text, rb_error *err)
{
    rb_grammar *g = NULL;
    rb_status st = rb_grammar_create_vocab(text, strlen(text), NULL, NULL, NULL, NULL, 0, &g, err);
    return st == RB_OK ? g : NULL;
}

/* 1 when the grammar accepts all of s and is complete after it. */
static int matches(const char *grammar, const char *s)
{
    rb_error err;
    rb_grammar *g = compile(grammar, &err);
    if (!g) {
        fprintf(stderr, "compile failed: %s\n", err.message);
        return -1;
    }
    int ok = rb_grammar_accept_bytes(g, s, strlen(s)) == RB_OK && rb_grammar_is_complete(g);
    rb_grammar_destroy(g);
    return ok;
}

static void test_parse_errors(void)
{
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"root ::= foo", "line 1, column 10: rule 'foo' is used but never defined"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
        {"root ::= \"abc", "unterminated string literal"},
        {"root ::= [a-", "unterminated character class"},
        {"root ::= [z-a]", "reversed"},
        {"root ::= (\"a\"", "expected ')'"},
        {"root ::= * \"a\"", "line 1, column 10: '*' has no item before it"},
        {"root ::= \"a\"{3,1}", "maximum is below the minimum"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"\\x4\"", "needs 2 hex digits"},
        {"root = \"a\"", "line 1, column 6: expected '::='"},
        {"root ::= root \"a\"", "left-recursive"},
        {"root ::= x\nx ::= \"\"? root", "left-recursive"},
        {"root ::= (\"\")*", "left-recursive"},
        {"a ::= \"x\"", "no rule named 'root'"},
        {"root ::= \"a\" b ::= \"c\"", "a new rule starts on a new line"},
        {"root ::= \"a\"{99999}", "repetition count over"},
        {"\n\n  root ::= \"a\" )", "line 3, column 16: unexpected ')'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rb_error err = {0};
        rb_grammar *g = compile(bad[i].text, &err);
        CHECK(g == NULL);
        if (!strstr(err.message, bad[i].want))
            fprintf(stderr, "grammar %zu: '%s' lacks '%s'\n", i, err.message, bad[i].want);
        CHECK(strstr(err.message, bad[i].want) != NULL);
        rb_grammar_destroy(g);
    }
}

static void test_accept(void)
{
    const char *num = "root ::= \"-\"? [0-9]+ (\".\" [0-9]{1,3})?";
    CHECK_EQ_INT(matches(num, "-12.5"), 1);
    CHECK_EQ_INT(matches(num, "12.5555"), 0);
    CHECK_EQ_INT(matches(num, "12."), 0);
    CHECK_EQ_INT(matches(num, "7"), 1);
    const char *alt = "root ::= greet \" \" name   # comment\n"
                      "greet ::= \"hi\" | \"hello\"\n"
                      "  | \"hey\"\n"
                      "name ::= [A-Z] [a-z]*";
    CHECK_EQ_INT(matches(alt, "hey Bob"), 1);
    CHECK_EQ_INT(matches(alt, "hello X"), 1);
    CHECK_EQ_INT(matches(alt, "hello x"), 0);
    /* negation and Unicode: a class outside ASCII is compiled to UTF-8 bytes */
    const char *uni = "root ::= [^a-z\\x00-\\x1F]{2} [α-ω] .";
    CHECK_EQ_INT(matches(uni, "AZβ€"), 1);
    CHECK_EQ_INT(matches(uni, "é😀γx"), 1);
    CHECK_EQ_INT(matches(uni, "aZβx"), 0);
    CHECK_EQ_INT(matches(uni, "AZax"), 0);
    /* a UTF-8 sequence may not stop half way through: "\xCE" alone is not complete */
    CHECK_EQ_INT(matches(uni, "AZ\xCE"), 0);
    /* repetition bounds */
    const char *rep = "root ::= (\"ab\"){2,3} \"c\"{0,2} \"d\"{2}";
    CHECK_EQ_INT(matches(rep, "ababdd"), 1);
    CHECK_EQ_INT(matches(rep, "abababccdd"), 1);
    CHECK_EQ_INT(matches(rep, "abdd"), 0);
    CHECK_EQ_INT(matches(rep, "ababababdd"), 0);
    CHECK_EQ_INT(matches(rep, "ababcccdd"), 0);
    /* nested recursion (not left): balanced parentheses */
    const char *par = "root ::= p\np ::= \"(\" p* \")\"";
    CHECK_EQ_INT(matches(par, "(()(()))"), 1);
    CHECK_EQ_INT(matches(par, "(()"), 0);

    /* accept leaves the state unchanged on a refused byte */
    rb_error err;
    rb_grammar *g = compile("root ::= \"ab\" | \"ac\"", &err);
    CHECK(g != NULL);
    if (g) {
        CHECK_EQ_INT(rb_grammar_accept_bytes(g, "a", 1), RB_OK);
        CHECK_EQ_INT(rb_grammar_is_complete(g), 0);
        CHECK_EQ_INT(rb_grammar_accept_bytes(g, "d", 1), RB_E_INVALID_ARG);
        CHECK(strstr(rb_grammar_errmsg(g), "not allowed") != NULL);
        CHECK_EQ_INT(rb_grammar_accept_bytes(g, "c", 1), RB_OK);
        CHECK_EQ_INT(rb_grammar_is_complete(g), 1);
        CHECK_EQ_INT(rb_grammar_can_continue(g), 0);
        CHECK_EQ_INT(rb_grammar_reset(g), RB_OK);
        CHECK_EQ_INT(rb_grammar_is_complete(g), 0);
        rb_grammar_destroy(g);
    }
}

/* ---- a tiny JSON Schema validator for the subset the converter covers ---- */

static size_t n_codepoints(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

static int validate(const rb_json *v, const rb_json *s, const rb_json *root, int depth);

static int validate_type(const rb_json *v, const char *t)
{
    if (!strcmp(t, "object"))
        return v->type == RB_JSON_OBJECT;
    if (!strcmp(t, "array"))
        return v->type == RB_JSON_ARRAY;
    if (!strcmp(t, "string"))
        return v->type == RB_JSON_STRING;
    if (!strcmp(t, "number"))
        return v->type == RB_JSON_NUMBER;
    if (!strcmp(t, "integer"))
        return v->type == RB_JSON_NUMBER && v->number == floor(v->number);
    if (!strcmp(t, "boolean"))
        return v->type == RB_JSON_BOOL;
    if (!strcmp(t, "null"))
        return v->type == RB_JSON_NULL;
    return 0;
}

static int validate(const rb_json *v, const rb_json *s, const rb_json *root, int depth)
{
    if (depth > 60)
        return 0;
    if (s->type == RB_JSON_BOOL)
        return s->is_true;
    const rb_json *k;
    if ((k = rb_json_get(s, "$ref"))) {
        const char *r = k->str;
        const rb_json *t = !strcmp(r, "#") ? root
                           : !strncmp(r, "#/$defs/", 8)
                               ? rb_json_get(rb_json_get(root, "$defs"), r + 8)
                               : rb_json_get(rb_json_get(root, "definitions"), r + 14);
        return t && validate(v, t, root, depth + 1);
    }
    if ((k = rb_json_get(s, "const")) && !rb_json_equal(v, k))
        return 0;
    if ((k = rb_json_get(s, "enum"))) {
        int any = 0;
        for (size_t i = 0; i < k->n; i++)
            any |= rb_json_equal(v, k->items[i]);
        if (!any)
            return 0;
    }
    if ((k = rb_json_get(s, "anyOf")) || (k = rb_json_get(s, "oneOf"))) {
        int n = 0;
        for (size_t i = 0; i < k->n; i++)
            n += validate(v, k->items[i], root, depth + 1);
        if (n == 0 || (rb_json_get(s, "oneOf") && n != 1))
            return 0;
    }
    if ((k = rb_json_get(s, "type"))) {
        int ok = 0;
        if (k->type == RB_JSON_STRING)
            ok = validate_type(v, k->str);
        for (size_t i = 0; k->type == RB_JSON_ARRAY && i < k->n; i++)
            ok |= validate_type(v, k->items[i]->str);
        if (!ok)
            return 0;
    }
    if (v->type == RB_JSON_NUMBER) {
        if ((k = rb_json_get(s, "minimum")) && v->number < k->number)
            return 0;
        if ((k = rb_json_get(s, "maximum")) && v->number > k->number)
            return 0;
        if ((k = rb_json_get(s, "exclusiveMinimum")) && v->number <= k->number)
            return 0;
        if ((k = rb_json_get(s, "exclusiveMaximum")) && v->number >= k->number)
            return 0;
    }
    if (v->type == RB_JSON_STRING) {
        size_t n = n_codepoints(v->str, v->str_len);
        if ((k = rb_json_get(s, "minLength")) && n < (size_t)k->number)
            return 0;
        if ((k = rb_json_get(s, "maxLength")) && n > (size_t)k->number)
            return 0;
        if ((k = rb_json_get(s, "pattern"))) {
            regex_t re;
            if (regcomp(&re, k->str, REG_EXTENDED | REG_NOSUB) != 0)
                return 0;
            int ok = strlen(v->str) == v->str_len && regexec(&re, v->str, 0, NULL, 0) == 0;
            regfree(&re);
            if (!ok)
                return 0;
        }
    }
    if (v->type == RB_JSON_ARRAY) {
        if ((k = rb_json_get(s, "minItems")) && v->n < (size_t)k->number)
            return 0;
        if ((k = rb_json_get(s, "maxItems")) && v->n > (size_t)k->number)
            return 0;
        if ((k = rb_json_get(s, "items")))
            for (size_t i = 0; i < v->n; i++)
                if (!validate(v->items[i], k, root, depth + 1))
                    return 0;
    }
    if (v->type == RB_JSON_OBJECT) {
        const rb_json *props = rb_json_get(s, "properties");
        const rb_json *addl = rb_json_get(s, "additionalProperties");
        if ((k = rb_json_get(s, "required")))
            for (size_t i = 0; i < k->n; i++)
                if (!rb_json_get(v, k->items[i]->str))
                    return 0;
        for (size_t i = 0; i < v->n; i++) {
            const rb_json *ps = props ? rb_json_get(props, v->keys[i]) : NULL;
            if (ps) {
                if (!validate(v->items[i], ps, root, depth + 1))
                    return 0;
            } else if (addl) {
                if (!validate(v->items[i], addl, root, depth + 1))
                    return 0;
            }
        }
    }
    return 1;
}

/* ---- the schemas ---------------------------------------------------------- */

static const char *const SCHEMAS[] = {
    /* 0 object, required + optional, additionalProperties false */
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},\"nick\":{\"type\":\"string\","
    "\"maxLength\":5}},\"required\":[\"name\",\"age\"],\"additionalProperties\":false}",
    /* 1 string enum */
    "{\"type\":\"string\",\"enum\":[\"red\",\"green\",\"blue\",\"a \\\"quoted\\\" one\"]}",
    /* 2 const of an object */
    "{\"const\":{\"kind\":\"fixed\",\"n\":[1,2,3]}}",
    /* 3 integer with exclusive bounds, negative */
    "{\"type\":\"integer\",\"exclusiveMinimum\":-1234,\"exclusiveMaximum\":57}",
    /* 4 number with bounds (comes out as an integer in them) */
    "{\"type\":\"number\",\"minimum\":-2.5,\"maximum\":1000}",
    /* 5 array with minItems/maxItems of booleans */
    "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":2,\"maxItems\":4}",
    /* 6 nested objects, all optional */
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"object\",\"properties\":{\"b\":"
    "{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"null\"}}}}},\"z\":{\"type\":"
    "\"boolean\"}}}",
    /* 7 anyOf */
    "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":10,\"maximum\":20},{\"type\":\"string\","
    "\"enum\":[\"none\"]},{\"type\":\"null\"}]}",
    /* 8 $ref / $defs, recursive */
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":9},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
    "\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"],\"additionalProperties\":false}},"
    "\"$ref\":\"#/$defs/node\"}",
    /* 9 string pattern */
    "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-[0-9]{3,4}(x|yz)?$\"}",
    /* 10 type list, minLength */
    "{\"type\":[\"string\",\"integer\"],\"minLength\":2,\"maxLength\":4}",
    /* 11 OpenAI-style tool parameters */
    "{\"type\":\"object\",\"properties\":{\"location\":{\"type\":\"string\",\"maxLength\":20,"
    "\"description\":\"city\"},\"unit\":{\"type\":\"string\",\"enum\":[\"celsius\","
    "\"fahrenheit\"]},\"days\":{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":1,"
    "\"maximum\":7},\"maxItems\":3}},\"required\":[\"location\",\"unit\",\"days\"],"
    "\"additionalProperties\":false}",
    /* 12 array of numbers, no bounds */
    "{\"type\":\"array\",\"items\":{\"type\":\"number\"},\"maxItems\":3}",
};
#define N_SCHEMAS (sizeof SCHEMAS / sizeof SCHEMAS[0])

/* Examples that must be accepted (exactly) by schema i's grammar. */
static const struct {
    int schema;
    const char *text;
    int ok;
} EXAMPLES[] = {
    {0, "{\"name\":\"Al\",\"age\":150}", 1},
    {0, "{ \"name\" : \"Al\" , \"age\" : 0 , \"nick\" : \"x\" }", 1},
    {0, "{\"name\":\"Al\",\"age\":151}", 0},
    {0, "{\"age\":3,\"name\":\"Al\"}", 0}, /* the declared order only */
    {0, "{\"name\":\"Al\"}", 0},
    {1, "\"green\"", 1},
    {1, "\"a \\\"quoted\\\" one\"", 1},
    {1, "\"pink\"", 0},
    {2, "{\"kind\":\"fixed\",\"n\":[1,2,3]}", 1},
    {3, "-1233", 1},
    {3, "56", 1},
    {3, "-1234", 0},
    {3, "57", 0},
    {3, "0", 1},
    {3, "-0", 0},
    {4, "-2", 1},
    {4, "1000", 1},
    {4, "-3", 0},
    {5, "[true,false]", 1},
    {5, "[true]", 0},
    {5, "[true,true,true,true,true]", 0},
    {6, "{}", 1},
    {6, "{\"z\":true}", 1},
    {6, "{\"a\":{\"b\":{\"c\":null}},\"z\":false}", 1},
    {7, "15", 1},
    {7, "21", 0},
    {7, "null", 1},
    {8, "{\"v\":1,\"kids\":[{\"v\":2},{\"v\":3,\"kids\":[]}]}", 1},
    {8, "{\"v\":10}", 0},
    {9, "\"AB-123\"", 1},
    {9, "\"AB-1234yz\"", 1},
    {9, "\"AB-12\"", 0},
    {10, "\"abcd\"", 1},
    {10, "\"a\"", 0},
    {10, "-42", 1},
    {11, "{\"location\":\"Paris\",\"unit\":\"celsius\",\"days\":[1,7]}", 1},
    {12, "[1.5e3,-0.25,7]", 1},
};

static void test_schemas(void)
{
    for (size_t i = 0; i < N_SCHEMAS; i++) {
        char *text = NULL;
        size_t n = 0;
        rb_error err = {0};
        rb_status st = rb_json_schema_to_grammar(SCHEMAS[i], strlen(SCHEMAS[i]), &text, &n, &err);
        if (st != RB_OK)
            fprintf(stderr, "schema %zu: %s\n", i, err.message);
        CHECK_EQ_INT(st, RB_OK);
        if (st != RB_OK)
            continue;
        rb_grammar *g = NULL;
        st = rb_grammar_create_vocab(text, n, NULL, NULL, NULL, NULL, 0, &g, &err);
        if (st != RB_OK)
            fprintf(stderr, "schema %zu grammar: %s\n%s\n", i, err.message, text);
        CHECK_EQ_INT(st, RB_OK);
        for (size_t e = 0; g && e < sizeof EXAMPLES / sizeof EXAMPLES[0]; e++) {
            if (EXAMPLES[e].schema != (int)i)
                continue;
            rb_grammar_reset(g);
            const char *t = EXAMPLES[e].text;
            int ok = rb_grammar_accept_bytes(g, t, strlen(t)) == RB_OK && rb_grammar_is_complete(g);
            if (ok != EXAMPLES[e].ok)
                fprintf(stderr, "schema %zu: '%s' accepted %d, want %d\n", i, t, ok,
                        EXAMPLES[e].ok);
            CHECK_EQ_INT(ok, EXAMPLES[e].ok);
        }
        rb_grammar_destroy(g);
        free(text);
    }
    /* json_object mode: any object */
    char *text = NULL;
    size_t n = 0;
    CHECK_EQ_INT(rb_json_schema_to_grammar(NULL, 0, &text, &n, NULL), RB_OK);
    CHECK_EQ_INT(matches(text, "{\"a\":[1,{\"b\":null}],\"c\":\"\\u00e9\"}"), 1);
    CHECK_EQ_INT(matches(text, "[1]"), 0);
    free(text);

    static const struct {
        const char *schema, *want;
    } bad[] = {
        {"{\"type\":\"object\",\"patternProperties\":{}}", "at '/': keyword 'patternProperties'"},
        {"{\"properties\":{\"a\":{\"type\":\"strin\"}}}", "at '/properties/a': type \"strin\""},
        {"{\"$ref\":\"#/$defs/nope\"}", "names no definition"},
        {"{\"$ref\":\"http://x\"}", "only #"},
        {"{\"allOf\":[{},{}]}", "'allOf' with more than one"},
        {"{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", "no integer lies between"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems is below minItems"},
        {"{\"type\":\"string\",\"pattern\":\"(?=a)\"}", "'(?'"},
        {"{\"type\":", "json: unexpected end of input"},
        {"{\"required\":[\"x\"],\"properties\":{}}", "required property 'x'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rb_error err = {0};
        text = NULL;
        rb_status st = rb_json_schema_to_grammar(bad[i].schema, strlen(bad[i].schema), &text, &n,
                                                 &err);
        CHECK(st != RB_OK);
        if (!strstr(err.message, bad[i].want))
            fprintf(stderr, "bad schema %zu: '%s' lacks '%s'\n", i, err.message, bad[i].want);
        CHECK(strstr(err.message, bad[i].want) != NULL);
        CHECK(text == NULL);
    }
}

/* ---- masks against brute force over a random vocabulary ----------------- */

static void test_masks(void)
{
    enum { V = 3000 };
    static const char *const frag[] = {"{", "}", "[", "]", "\"", ":", ",", " ", "\n", "true",
                                       "false", "null", "-", ".", "e", "\\", "u", "a", "Z", "é",
                                       "0", "1", "9", "name", "age", "\"name\"", "\":", "\",",
                                       "celsius", "\xCE", "\xB2", "\xF0\x9F", "\x98\x80"};
    size_t nf = sizeof frag / sizeof frag[0];
    char **pieces = calloc(V, sizeof *pieces);
    size_t *lens = calloc(V, sizeof *lens);
    uint8_t *eog = calloc(V, 1);
    rb_test_rng r = rb_test_rng_seed(7);
    for (int i = 0; i < V; i++) {
        char buf[64];
        size_t n = 0;
        if (i < 256) {
            buf[n++] = (char)i; /* every byte, so every text can be spelled */
        } else if (i == 256) {
            eog[i] = 1; /* an end-of-generation token with no text */
        } else {
            int parts = 1 + (int)rb_test_rng_below(&r, 4);
            for (int k = 0; k < parts; k++) {
                const char *f = frag[rb_test_rng_below(&r, (uint32_t)nf)];
                size_t fl = strlen(f);
                if (n + fl < sizeof buf) {
                    memcpy(buf + n, f, fl);
                    n += fl;
                }
            }
        }
        pieces[i] = malloc(n + 1);
        memcpy(pieces[i], buf, n);
        lens[i] = n;
    }
    uint8_t brute[(V + 7) / 8];
    int n_steps = 0, n_mismatch = 0;
    for (size_t si = 0; si < N_SCHEMAS; si++) {
        char *text = NULL;
        size_t tn = 0;
        if (rb_json_schema_to_grammar(SCHEMAS[si], strlen(SCHEMAS[si]), &text, &tn, NULL) != RB_OK)
            continue;
        rb_grammar *g = NULL;
        rb_error err;
        rb_status st = rb_grammar_create_vocab(text, tn, NULL, (const char *const *)pieces, lens,
                                               eog, V, &g, &err);
        CHECK_EQ_INT(st, RB_OK);
        free(text);
        if (st != RB_OK)
            continue;
        for (int step = 0; step < 40; step++) {
            const uint8_t *mask = NULL;
            size_t n_allowed = 0;
            CHECK_EQ_INT(rb_grammar_mask(g, &mask, &n_allowed), RB_OK);
            CHECK_EQ_INT(rb_grammar_mask_brute(g, brute), RB_OK);
            n_steps++;
            if (memcmp(mask, brute, sizeof brute) != 0) {
                n_mismatch++;
                break;
            }
            size_t cnt = 0;
            for (int t = 0; t < V; t++)
                cnt += brute[t >> 3] >> (t & 7) & 1;
            CHECK_EQ_U64(cnt, n_allowed);
            if (n_allowed == 0 || (brute[256 >> 3] >> (256 & 7) & 1))
                break; /* complete: stop like a sampler drawing EOG would */
            /* the k-th allowed token */
            uint32_t k = rb_test_rng_below(&r, (uint32_t)n_allowed);
            int t = 0;
            for (;; t++)
                if ((brute[t >> 3] >> (t & 7) & 1) && k-- == 0)
                    break;
            CHECK_EQ_INT(rb_grammar_accept(g, t), RB_OK);
        }
        rb_grammar_destroy(g);
    }
    printf("masks: %d states compared with brute force, %d mismatches\n", n_steps, n_mismatch);
    CHECK_EQ_INT(n_mismatch, 0);
    CHECK(n_steps > 100);
    for (int i = 0; i < V; i++)
        free(pieces[i]);
    free(pieces);
    free(lens);
    free(eog);
}

/* ---- generation from a random-weight model -------------------------------- */

static void test_generate(void)
{
    char path[512];
    rb_test_tmp_path(path, sizeof path, "test_grammar", "model.gguf");
    rb_test_model_spec spec = {.shape = "tiny", .n_ctx = 4096, .seed = 11};
    if (rb_test_make_model(path, &spec) != RB_OK) {
        CHECK(0);
        return;
    }
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    if (!m)
        return;
    rb_session_params sp = rb_session_default_params();
    sp.n_ctx = 4096;
    sp.n_threads = 1;
    int n_samples = 0, n_valid = 0, n_tokens = 0;
    double t_mask = 0;
    size_t cap = 1 << 16;
    char *out = malloc(cap);
    for (size_t si = 0; si < N_SCHEMAS; si++) {
        rb_json_doc sdoc;
        CHECK_EQ_INT(rb_json_parse(SCHEMAS[si], strlen(SCHEMAS[si]), &sdoc, &err), RB_OK);
        rb_grammar *g = NULL;
        rb_status st = rb_grammar_from_json_schema(m, SCHEMAS[si], strlen(SCHEMAS[si]), &g, &err);
        if (st != RB_OK)
            fprintf(stderr, "schema %zu: %s\n", si, err.message);
        CHECK_EQ_INT(st, RB_OK);
        for (int seed = 0; g && seed < 16; seed++) {
            rb_session *s = NULL;
            CHECK_EQ_INT(rb_session_create(m, &sp, &s, &err), RB_OK);
            rb_sampler_params pp = rb_sampler_default_params();
            pp.temp = 1.0f;
            pp.top_k = 0;
            pp.top_p = 1.0f;
            pp.min_p = 0.0f;
            pp.seed = (uint64_t)seed * 1000 + si;
            rb_sampler *smp = NULL;
            CHECK_EQ_INT(rb_sampler_create(&pp, rb_session_n_vocab(s), &smp, &err), RB_OK);
            CHECK_EQ_INT(rb_grammar_reset(g), RB_OK);
            CHECK_EQ_INT(rb_sampler_set_grammar(smp, g), RB_OK);
            rb_detokenizer *d = NULL;
            CHECK_EQ_INT(rb_detokenizer_create(m, &d, &err), RB_OK);
            int32_t tok = rb_model_token_bos(m);
            CHECK_EQ_INT(rb_session_feed(s, &tok, 1, NULL), RB_OK);
            size_t n_out = 0;
            int done = 0;
            for (int i = 0; i < 3500 && !done; i++) {
                if (!rb_grammar_can_continue(g)) {
                    done = 1;
                    break;
                }
                struct timespec a, b;
                clock_gettime(CLOCK_MONOTONIC, &a);
                st = rb_sampler_sample(smp, rb_session_get_logits(s), NULL, 0, &tok);
                clock_gettime(CLOCK_MONOTONIC, &b);
                t_mask += (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
                if (st != RB_OK) {
                    fprintf(stderr, "sample: %s\n", rb_sampler_errmsg(smp));
                    break;
                }
                n_tokens++;
                if (rb_model_token_is_eog(m, tok)) {
                    done = 1;
                    break;
                }
                size_t k = 0;
                if (n_out + rb_detokenizer_max_bytes(d) >= cap)
                    break;
                CHECK_EQ_INT(rb_detokenizer_push(d, tok, out + n_out, cap - n_out, &k), RB_OK);
                n_out += k;
                if (rb_session_feed(s, &tok, 1, NULL) != RB_OK)
                    break;
            }
            size_t k = 0;
            rb_detokenizer_flush(d, out + n_out, cap - n_out, &k);
            n_out += k;
            n_samples++;
            rb_json_doc doc;
            int ok = done && rb_json_parse(out, n_out, &doc, &err) == RB_OK;
            if (ok) {
                ok = validate(doc.root, sdoc.root, sdoc.root, 0);
                rb_json_free(&doc);
            }
            n_valid += ok;
            if (!ok)
                fprintf(stderr, "schema %zu seed %d: invalid (done %d): %.*s\n", si, seed, done,
                        (int)(n_out > 300 ? 300 : n_out), out);
            else if (seed == 0)
                printf("schema %zu: %.*s\n", si, (int)(n_out > 160 ? 160 : n_out), out);
            rb_detokenizer_destroy(d);
            rb_sampler_destroy(smp);
            rb_session_destroy(s);
        }
        rb_grammar_stats gs;
        if (g) {
            rb_grammar_get_stats(g, &gs);
            printf("schema %zu: %llu trie walks, %llu cache hits, %llu trie nodes visited\n", si,
                   (unsigned long long)gs.n_walks, (unsigned long long)gs.n_cache_hits,
                   (unsigned long long)gs.n_trie_visits);
        }
        rb_grammar_destroy(g);
        rb_json_free(&sdoc);
    }
    free(out);

    /* embeddings: unit length, the same whatever the batch and whatever the
       session held before, different for different text */
    {
        rb_model_info info;
        CHECK_EQ_INT(rb_model_get_info(m, &info), RB_OK);
        uint32_t E = info.n_embd;
        float *e1 = malloc(sizeof *e1 * E), *e2 = malloc(sizeof *e2 * E), *e3 = malloc(sizeof *e3 * E);
        int32_t toks[40];
        for (int i = 0; i < 40; i++)
            toks[i] = 3 + (i * 37) % 400;
        rb_session *s = NULL;
        rb_session_params bp = sp;
        bp.n_batch = 7;
        CHECK_EQ_INT(rb_session_create(m, &sp, &s, &err), RB_OK);
        CHECK_EQ_INT(rb_session_embed(s, toks, 40, e1, E), RB_OK);
        CHECK_EQ_INT(rb_session_n_tokens(s), 40);
        CHECK_EQ_INT(rb_session_embed(s, toks, 40, e1, E + 1), RB_E_INVALID_ARG);
        CHECK_CONTAINS(rb_session_errmsg(s), "n_embd");
        rb_session_destroy(s);
        s = NULL;
        CHECK_EQ_INT(rb_session_create(m, &bp, &s, &err), RB_OK);
        CHECK_EQ_INT(rb_session_feed(s, toks + 5, 9, NULL), RB_OK);
        CHECK_EQ_INT(rb_session_embed(s, toks, 40, e2, E), RB_OK);
        CHECK_EQ_INT(rb_session_embed(s, toks, 20, e3, E), RB_OK);
        rb_session_destroy(s);
        double norm = 0, diff = 0, d13 = 0;
        for (uint32_t j = 0; j < E; j++) {
            norm += (double)e1[j] * e1[j];
            diff = fmax(diff, fabs((double)e1[j] - e2[j]));
            d13 = fmax(d13, fabs((double)e1[j] - e3[j]));
        }
        CHECK_NEAR(norm, 1.0, 1e-5);
        CHECK(diff < 1e-5);
        CHECK(d13 > 1e-3);
        free(e1);
        free(e2);
        free(e3);
    }
    printf("generation: %d/%d samples parse and validate over %zu schemas; %d tokens, %.3f ms "
           "per sample call (mask + draw + advance)\n", n_valid, n_samples, N_SCHEMAS, n_tokens,
           n_tokens ? 1e3 * t_mask / n_tokens : 0.0);
    CHECK(n_samples >= 200);
    CHECK_EQ_INT(n_valid, n_samples);
    rb_model_close(m);
}

/* ---- sampler extras: logit_bias, penalties, logprobs ------------------------ */

static void test_sampler_extras(void)
{
    enum { V = 50 };
    float row[V];
    for (int i = 0; i < V; i++)
        row[i] = (float)(i % 7) * 0.3f;
    rb_sampler_params p = rb_sampler_default_params();
    p.temp = 0;
    rb_sampler *s = NULL;
    CHECK_EQ_INT(rb_sampler_create(&p, V, &s, NULL), RB_OK);
    int32_t t = -1;
    CHECK_EQ_INT(rb_sampler_sample(s, row, NULL, 0, &t), RB_OK);
    CHECK_EQ_INT(t, 6); /* lowest id of the max */
    int32_t ids[2] = {3, 6};
    float bias[2] = {100.0f, -100.0f};
    CHECK_EQ_INT(rb_sampler_set_logit_bias(s, ids, bias, 2), RB_OK);
    CHECK_EQ_INT(rb_sampler_sample(s, row, NULL, 0, &t), RB_OK);
    CHECK_EQ_INT(t, 3);
    ids[0] = V;
    CHECK_EQ_INT(rb_sampler_set_logit_bias(s, ids, bias, 2), RB_E_INVALID_ARG);
    CHECK(strstr(rb_sampler_errmsg(s), "outside the vocabulary") != NULL);
    CHECK_EQ_INT(rb_sampler_set_logit_bias(s, NULL, NULL, 0), RB_OK);
    CHECK_EQ_INT(rb_sampler_sample(s, row, NULL, 0, &t), RB_OK);
    CHECK_EQ_INT(t, 6);
    CHECK_EQ_INT(rb_sampler_get_logprobs(s, NULL, NULL, 0, &(size_t){0}), RB_E_INVALID_ARG);
    rb_sampler_destroy(s);

    /* frequency: 6 seen three times at 0.25 each loses 0.75 > 0.3; presence: 13 seen once */
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    p.repeat_last_n = -1;
    p.is_logprobs = 1;
    p.n_top_logprobs = 3;
    CHECK_EQ_INT(rb_sampler_create(&p, V, &s, NULL), RB_OK);
    int32_t hist[4] = {6, 6, 6, 13};
    CHECK_EQ_INT(rb_sampler_sample(s, row, hist, 4, &t), RB_OK);
    CHECK_EQ_INT(t, 20); /* 6 and 13 fell; 20 is the next id with the max */
    rb_sampler_logprob chosen, top[5];
    size_t n_top = 0;
    CHECK_EQ_INT(rb_sampler_get_logprobs(s, &chosen, top, 5, &n_top), RB_OK);
    CHECK_EQ_U64(n_top, 3);
    CHECK_EQ_INT(chosen.id, 20);
    CHECK_EQ_INT(top[0].id, 20);
    CHECK_EQ_INT(top[1].id, 27);
    /* the reference: softmax of the penalized row */
    double z = 0;
    for (int i = 0; i < V; i++) {
        double l = row[i] - (i == 6 ? 0.75 + 0.5 : i == 13 ? 0.25 + 0.5 : 0);
        z += exp(l);
    }
    CHECK_NEAR(chosen.logprob, row[20] - log(z), 1e-5);
    CHECK_NEAR(top[1].logprob, chosen.logprob, 1e-6);
    rb_sampler_destroy(s);
    p.n_top_logprobs = 21;
    rb_error err;
    CHECK_EQ_INT(rb_sampler_create(&p, V, &s, &err), RB_E_INVALID_ARG);
    CHECK(strstr(err.message, "n_top_logprobs") != NULL);
}

int main(void)
{
    test_parse_errors();
    test_accept();
    test_schemas();
    test_masks();
    test_sampler_extras();
    test_generate();
    return check_report();
}
