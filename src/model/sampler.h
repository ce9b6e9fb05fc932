/*
 * sampler.h - picks the next token from a row of logits, with llama.cpp's
 * default sampler chain and parameters (named after its CLI flags:
 * --repeat-penalty and --repeat-last-n are penalty_repeat and
 * penalty_last_n in its common_params_sampling):
 *
 *     penalties -> top_k -> top_p -> min_p -> temp -> draw
 *
 *   penalties  each distinct token among the last repeat_last_n tokens of
 *              the history has its logit divided by repeat_penalty when the
 *              logit is > 0, multiplied by it otherwise (once per token,
 *              however often it occurs). 1.0 is off.
 *   top_k      keeps the k largest logits (0: off).
 *   top_p      keeps the shortest prefix of the sorted candidates whose
 *              probability (softmax of the logits so far, temperature 1)
 *              sums to >= top_p; the token that crosses is kept (1.0: off).
 *   min_p      keeps the tokens whose logit >= max + log(min_p), i.e. whose
 *              probability is >= min_p times the best one's (0: off).
 *   temp       divides the logits; temp <= 0 is greedy: the largest
 *              penalized logit, the lowest id on ties, and no random draw.
 *   draw       one uniform number from the sampler's own xoshiro256**
 *              generator picks a token from the softmax of what is left.
 *
 * Ties between equal logits are broken toward the lower id everywhere, so
 * the result is a function of (params, logits, history, PRNG state) alone.
 * Every call with temp > 0 draws exactly one number, whatever the logits:
 * after N such calls the PRNG state depends only on the seed and N.
 *
 * Not here: llama.cpp's frequency/presence penalties, DRY, typical-p, XTC,
 * mirostat and grammars.
 */
#ifndef RB_SAMPLER_H
#define RB_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

/* The sampler API is public: its declarations live in include/rebound.h. */

#endif /* RB_SAMPLER_H */
