/*
 * grammar.h - constrained sampling: a GBNF grammar compiled to a byte-level
 * pushdown automaton, the set of vocabulary tokens it allows next (walked
 * over a token trie, cached by automaton state), and the JSON Schema to
 * GBNF converter. The public face (rb_grammar_*) is in include/rebound.h;
 * this header adds what the sampler, the tests and the fuzz target use
 * without a model.
 *
 * The grammar text (llama.cpp's GBNF):
 *
 *   rule-name ::= alternatives        # a comment
 *   alternatives: sequence ( "|" sequence )*
 *   sequence: items; an item is "literal" | [char class] | [^negated] |
 *             . (any character) | rule-name | ( alternatives ), each
 *             optionally followed by *, +, ?, {m}, {m,}, {m,n}
 *   escapes in literals and classes: \n \r \t \\ \" \] \[ \- \^ \xHH
 *             \uHHHH \UHHHHHHHH
 *
 * A rule ends at the end of its line unless the line ends inside brackets
 * or parentheses, or the next line starts with "|". Characters are Unicode
 * code points matched as their UTF-8 bytes; classes are compiled to byte
 * sequences, so the automaton never holds a partial character.
 */
#ifndef RB_GRAMMAR_H
#define RB_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

/* Compiles a grammar with a vocabulary given as byte strings (pieces[i] of
 * lens[i] bytes; is_eog[i] nonzero for the tokens that end generation).
 * n_vocab 0 builds a grammar without a vocabulary: accept_bytes and
 * is_complete work, masks do not. root NULL means "root". Errors as
 * rb_grammar_create. */
rb_status rb_grammar_create_vocab(const char *text, size_t len, const char *root,
                                  const char *const *pieces, const size_t *lens,
                                  const uint8_t *is_eog, uint32_t n_vocab, rb_grammar **out,
                                  rb_error *err);

/* Advances by bytes (not tokens). RB_E_INVALID_ARG when the grammar does
 * not allow them (the grammar is unchanged). */
rb_status rb_grammar_accept_bytes(rb_grammar *g, const char *bytes, size_t n);

/* The tokens allowed next as a bitmap of (n_vocab + 7) / 8 bytes, bit i of
 * byte i / 8 for token i; valid until the next call on g. Computed by the
 * trie walk, or taken from the cache of recent states. */
rb_status rb_grammar_mask(rb_grammar *g, const uint8_t **mask, size_t *n_allowed);

/* The same set computed by brute force: every token's bytes run through
 * the automaton one by one (for the tests). mask has (n_vocab + 7) / 8
 * bytes. */
rb_status rb_grammar_mask_brute(rb_grammar *g, uint8_t *mask);

uint32_t rb_grammar_n_vocab(const rb_grammar *g);

/* Counters: masks computed by walking the trie, masks from the cache,
 * trie nodes visited. */
typedef struct rb_grammar_stats {
    uint64_t n_walks, n_cache_hits, n_trie_visits;
} rb_grammar_stats;
void rb_grammar_get_stats(const rb_grammar *g, rb_grammar_stats *out);

/* The JSON Schema converter is json_schema.c: rb_json_schema_to_grammar
 * (rebound.h). */

#endif
