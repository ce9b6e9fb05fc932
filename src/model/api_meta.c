/*
 * api_meta.c - the public read access to a model's GGUF metadata strings
 * (rb_model_get_meta_str), for callers that need a key rb_model_info does not
 * carry, such as the chat template text.
 *
 * Does not copy or validate the text (it is any bytes the file holds; the
 * GGUF reader already checked that it lies inside the header) and does not
 * expose numbers or arrays: those that matter are in rb_model_info.
 */
#include <stdint.h>

#include "gguf.h"
#include "model.h"
#include "rebound.h"

rb_status rb_model_get_meta_str(const rb_model *model, const char *key, const char **out,
                                size_t *len)
{
    if (!model || !key || !out || !len)
        return RB_E_INVALID_ARG;
    rb_gguf_str s;
    rb_status st = rb_gguf_get_str(rb_model_gguf(model), key, &s);
    if (st != RB_OK)
        return st;
#if SIZE_MAX < UINT64_MAX
    if (s.len > SIZE_MAX) /* the header is in RAM, so this cannot happen; kept for the cast */
        return RB_E_FORMAT;
#endif
    *out = s.ptr;
    *len = (size_t)s.len;
    return RB_OK;
}
