/*
 * fuzz_grammar.c - libFuzzer target for the grammar module's parsers
 * (src/model/grammar.c, json_schema.c, json.c).
 *
 * Input: one control byte, then text. Control byte >= 0xF0: the text is a
 * model's reply for the chat templates' tool-call reader
 * (rb_chat_parse_tool_calls, family (byte & 15) % RB_CHAT_TEMPLATE_COUNT):
 * every call read must have JSON-object arguments, and the calls written
 * back in that family's form (rb_chat_format_tool_calls) must read back as
 * the same names and arguments. Else control byte % 3: 0 the text is a
 * GBNF grammar; 1 a JSON Schema (converted, then the GBNF compiled: a
 * schema the converter accepts must give a grammar that compiles); 2 JSON
 * for the reader alone. A grammar that compiles is run over a fixed
 * 300-token vocabulary (every byte, an end-of-generation token, and
 * multi-byte pieces) for a few steps, with invariants that trap:
 *   - the trie walk's mask equals the brute-force mask;
 *   - a token the mask allows is accepted, and one it forbids is refused.
 *
 * Build and run: see fuzz/README.md (target fuzz_grammar, seeds in
 * fuzz/corpus_grammar/).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json.h"
#include "rebound.h"

enum { V = 300 };

static char *pieces[V];
static size_t lens[V];
static uint8_t eog[V];

static void init_vocab(void)
{
    static const char *const multi[] = {"{\"", "\":", "\",", "true", "null", "\\u", "ab", "é",
                                        "\xF0\x9F\x98\x80", "  ", "12", "-1", "\"}", "]}"};
    if (pieces[0])
        return;
    for (int i = 0; i < V; i++) {
        char buf[8];
        size_t n = 0;
        if (i < 256)
            buf[n++] = (char)i;
        else if (i == 256)
            eog[i] = 1;
        else {
            const char *m = multi[(i - 257) % (sizeof multi / sizeof multi[0])];
            n = strlen(m);
            memcpy(buf, m, n);
            if (i - 257 >= (int)(sizeof multi / sizeof multi[0]))
                buf[n++] = (char)('a' + i % 26);
        }
        pieces[i] = malloc(n + 1);
        memcpy(pieces[i], buf, n);
        lens[i] = n;
    }
}

static void drive(rb_grammar *g, const uint8_t *steer, size_t n_steer)
{
    static uint8_t brute[(V + 7) / 8];
    for (int step = 0; step < 4; step++) {
        const uint8_t *mask;
        size_t n_allowed;
        if (rb_grammar_mask(g, &mask, &n_allowed) != RB_OK ||
            rb_grammar_mask_brute(g, brute) != RB_OK)
            return; /* out of memory or a limit: reported, nothing to check */
        if (memcmp(mask, brute, sizeof brute) != 0)
            __builtin_trap();
        if (n_allowed == 0)
            return;
        uint32_t pick = n_steer ? steer[step % n_steer] : 0;
        int allowed = -1, refused = -1;
        for (int t = 0; t < V; t++) {
            int bit = brute[t >> 3] >> (t & 7) & 1;
            if (!bit && refused < 0 && !eog[t] && lens[t])
                refused = t;
            if (bit && (allowed < 0 || pick-- > 0))
                allowed = t;
        }
        if (refused >= 0 && rb_grammar_accept(g, refused) != RB_E_INVALID_ARG)
            __builtin_trap();
        if (eog[allowed])
            return;
        if (rb_grammar_accept(g, allowed) != RB_OK)
            __builtin_trap();
    }
}

/* The tool-call reader's invariants (see the file's comment). */
static void tool_calls(rb_chat_template t, const char *text, size_t n)
{
    rb_chat_tool_calls c;
    if (rb_chat_parse_tool_calls(t, text, n, &c) != RB_OK)
        return;
    /* the calls as a JSON array of {"name", "arguments"} */
    size_t cap = 16;
    for (size_t i = 0; i < c.n; i++)
        cap += strlen(c.calls[i].name) * 6 + strlen(c.calls[i].arguments) + 32;
    char *arr = malloc(cap), *q = arr;
    q += sprintf(q, "[");
    for (size_t i = 0; i < c.n; i++) {
        rb_json_doc d;
        rb_error e;
        if (rb_json_parse(c.calls[i].arguments, strlen(c.calls[i].arguments), &d, &e) != RB_OK ||
            d.root->type != RB_JSON_OBJECT)
            __builtin_trap();
        rb_json_free(&d);
        q += sprintf(q, "%s{\"name\":\"", i ? "," : "");
        for (const unsigned char *p = (const unsigned char *)c.calls[i].name; *p; p++)
            q += *p == '"' || *p == '\\' ? sprintf(q, "\\%c", *p)
                 : *p < 0x20       ? sprintf(q, "\\u%04x", *p)
                                   : sprintf(q, "%c", *p);
        q += sprintf(q, "\",\"arguments\":%s}", c.calls[i].arguments);
    }
    sprintf(q, "]");
    size_t len = 0;
    if (c.n && strlen(arr) == (size_t)(q + 1 - arr) &&
        rb_chat_format_tool_calls(t, arr, NULL, 0, &len) == RB_OK) {
        char *back = malloc(len + 1);
        rb_chat_tool_calls c2;
        if (rb_chat_format_tool_calls(t, arr, back, len + 1, &len) != RB_OK ||
            rb_chat_parse_tool_calls(t, back, len, &c2) != RB_OK)
            __builtin_trap();
        if (c2.n != c.n)
            __builtin_trap();
        for (size_t i = 0; i < c.n; i++)
            if (strcmp(c.calls[i].name, c2.calls[i].name) ||
                strcmp(c.calls[i].arguments, c2.calls[i].arguments))
                __builtin_trap();
        rb_chat_tool_calls_free(&c2);
        free(back);
    }
    free(arr);
    rb_chat_tool_calls_free(&c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    init_vocab();
    if (data[0] >= 0xF0) {
        tool_calls((rb_chat_template)((data[0] & 15) % RB_CHAT_TEMPLATE_COUNT),
                   (const char *)data + 1, size - 1);
        return 0;
    }
    int mode = data[0] % 3;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    rb_error err;
    if (mode == 2) {
        rb_json_doc doc;
        if (rb_json_parse(text, n, &doc, &err) == RB_OK)
            rb_json_free(&doc);
        return 0;
    }
    char *gbnf = NULL;
    size_t gn = n;
    if (mode == 1) {
        if (rb_json_schema_to_grammar(text, n, &gbnf, &gn, &err) != RB_OK)
            return 0;
        text = gbnf;
    }
    rb_grammar *g = NULL;
    rb_status st = rb_grammar_create_vocab(text, gn, NULL, (const char *const *)pieces, lens, eog,
                                           V, &g, &err);
    if (mode == 1 && st != RB_OK && st != RB_E_NOMEM && st != RB_E_UNSUPPORTED)
        __builtin_trap(); /* the converter wrote a grammar that does not compile */
    if (st == RB_OK) {
        drive(g, data, size > 8 ? 8 : size);
        rb_grammar_destroy(g);
    }
    free(gbnf);
    return 0;
}
