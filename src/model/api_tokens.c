/*
 * api_tokens.c - the public token functions (rb_model_tokenize, special
 * ids, the streaming rb_detokenizer) over the internal tokenizer module.
 *
 * The tokenizer is built from the model's GGUF metadata on first use and
 * owned by the model (model.c frees it), so models that are only inspected
 * (`rebound info`) never pay for a 150k-token vocabulary.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "rebound.h"
#include "status.h"
#include "tokenizer.h"

struct rb_detokenizer {
    rb_detok state;
    size_t buf_size; /* rb_detok_out_bytes: one push's worst case */
    rb_error err;   /* the last failed call's */
};

/* Several threads may tokenize with one model at once (rebound.h): the
 * tokenizer is read-only once built (rb_model_tokenizer builds it under
 * the model's lock), encoding allocates its own scratch, and a failure's
 * message is written into the model's under that lock. */
rb_status rb_model_tokenize(rb_model *model, const char *text, size_t len, int add_special,
                            int parse_special, int32_t *tokens, size_t n_max, size_t *n_out)
{
    const rb_tokenizer *t = NULL;
    rb_status st = rb_model_tokenizer(model, &t);
    if (st != RB_OK)
        return st;
    rb_error e = {0};
    st = rb_tokenizer_encode(t, text, len, add_special, parse_special, tokens, n_max, n_out, &e);
    if (st != RB_OK)
        rb_model_set_error(model, &e);
    return st;
}

int32_t rb_model_token_bos(rb_model *model)
{
    const rb_tokenizer *t = NULL;
    return rb_model_tokenizer(model, &t) == RB_OK ? rb_tokenizer_bos(t) : -1;
}

int32_t rb_model_token_eos(rb_model *model)
{
    const rb_tokenizer *t = NULL;
    return rb_model_tokenizer(model, &t) == RB_OK ? rb_tokenizer_eos(t) : -1;
}

int rb_model_token_is_eog(rb_model *model, int32_t token)
{
    const rb_tokenizer *t = NULL;
    return rb_model_tokenizer(model, &t) == RB_OK && rb_tokenizer_is_eog(t, token);
}

rb_status rb_model_token_to_piece(rb_model *model, int32_t token, int special, char *buf,
                                  size_t size, size_t *out_len)
{
    const rb_tokenizer *t = NULL;
    if (!model || !out_len || (!buf && size))
        return RB_E_INVALID_ARG;
    rb_status st = rb_model_tokenizer(model, &t);
    if (st != RB_OK)
        return st;
    if (!rb_tokenizer_is_valid(t, token))
        return rb_error_set(rb_model_error(model), RB_E_INVALID_ARG,
                            "token %" PRId32 " is outside the vocabulary of %" PRIu32, token,
                            rb_tokenizer_n_vocab(t));
    /* llama.cpp's special=false: control and unknown tokens are not text */
    if (!special && (rb_tokenizer_attr(t, token) &
                     (RB_TOKEN_ATTR_CONTROL | RB_TOKEN_ATTR_UNKNOWN))) {
        *out_len = 0;
        if (size)
            buf[0] = 0;
        return RB_OK;
    }
    int n = rb_tokenizer_piece(t, token, NULL, 0);
    if (n < 0)
        return RB_E_INVALID_ARG;
    *out_len = (size_t)n;
    if ((size_t)n < size) {
        rb_tokenizer_piece(t, token, buf, size);
        buf[n] = 0;
    } else if (size) { /* a prefix, as snprintf */
        char *tmp = malloc((size_t)n + 1);
        if (!tmp)
            return RB_E_NOMEM;
        rb_tokenizer_piece(t, token, tmp, (size_t)n + 1);
        memcpy(buf, tmp, size - 1);
        buf[size - 1] = 0;
        free(tmp);
    }
    return RB_OK;
}

rb_status rb_detokenizer_create(rb_model *model, rb_detokenizer **out, rb_error *err)
{
    return rb_detokenizer_create_flags(model, 0, out, err);
}

rb_status rb_detokenizer_create_flags(rb_model *model, unsigned flags_in, rb_detokenizer **out,
                                      rb_error *err)
{
    const rb_tokenizer *t = NULL;
    if (flags_in & ~RB_DETOKENIZER_CONTINUATION)
        return rb_error_set(err, RB_E_INVALID_ARG, "detokenizer: unknown flags 0x%x",
                            flags_in & ~RB_DETOKENIZER_CONTINUATION);
    rb_status st = rb_model_tokenizer(model, &t);
    if (st != RB_OK)
        return rb_error_set(err, st, "%s", rb_model_errmsg(model));
    rb_detokenizer *d = calloc(1, sizeof *d);
    if (!d)
        return rb_error_set(err, RB_E_NOMEM, "detokenizer: out of memory");
    d->buf_size = rb_detok_out_bytes(t);
    /* only SentencePiece with add_space_prefix adds a space before the
       first word; a GPT-2 BPE prompt's leading space is the user's own, and
       so is a continuation's */
    int flags = RB_DECODE_REMOVE_SPECIAL;
    if (rb_tokenizer_get_kind(t) == RB_TOKENIZER_SPM && rb_tokenizer_adds_space_prefix(t) &&
        !(flags_in & RB_DETOKENIZER_CONTINUATION))
        flags |= RB_DECODE_STRIP_LEADING_SPACE;
    rb_detok_init(&d->state, t, flags);
    *out = d;
    return RB_OK;
}

void rb_detokenizer_destroy(rb_detokenizer *d)
{
    free(d);
}

size_t rb_detokenizer_max_bytes(const rb_detokenizer *d) { return d->buf_size; }

/* The caller's buffer must hold a push's worst case: a piece is never cut. */
static rb_status check_out(rb_detokenizer *d, const char *out, size_t out_size,
                           const size_t *n_out)
{
    if (!out || !n_out)
        return rb_error_set(&d->err, RB_E_INVALID_ARG, "detokenizer: out and n_out are required");
    if (out_size < d->buf_size)
        return rb_error_set(&d->err, RB_E_INVALID_ARG,
                            "detokenizer: out_size %zu is below rb_detokenizer_max_bytes (%zu)",
                            out_size, d->buf_size);
    return RB_OK;
}

rb_status rb_detokenizer_push(rb_detokenizer *d, int32_t token, char *out, size_t out_size,
                              size_t *n_out)
{
    if (!d)
        return RB_E_INVALID_ARG;
    rb_status st = check_out(d, out, out_size, n_out);
    if (st != RB_OK)
        return st;
    size_t n = 0;
    if (rb_detok_push(&d->state, token, out, out_size, &n) != RB_OK)
        return rb_error_set(&d->err, RB_E_INVALID_ARG,
                            "detokenizer: token %" PRId32 " is not in the vocabulary", token);
    *n_out = n;
    return RB_OK;
}

rb_status rb_detokenizer_flush(rb_detokenizer *d, char *out, size_t out_size, size_t *n_out)
{
    if (!d)
        return RB_E_INVALID_ARG;
    rb_status st = check_out(d, out, out_size, n_out);
    if (st != RB_OK)
        return st;
    *n_out = rb_detok_flush(&d->state, out, out_size);
    return RB_OK;
}

const char *rb_detokenizer_errmsg(const rb_detokenizer *d)
{
    return d && d->err.status ? d->err.message : "";
}
