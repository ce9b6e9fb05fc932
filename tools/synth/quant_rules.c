/*
 * quant_rules.c - per-tensor type choice (the rules are listed in
 * quant_rules.h, after llama.cpp's llama_tensor_get_type).
 *
 * Only the branches that the file kinds in kinds[] can reach are here; the
 * i-quant, Q2/Q3 and Q5_K_S branches of llama-quantize are not, because
 * rebound does not write those kinds (q5_k is uniform, not Q5_K_S).
 */
#include <string.h>
#include <strings.h>

#include "model.h"
#include "quant.h"
#include "quant_rules.h"

static const rb_file_kind kinds[] = {
    {"f32", RB_FTYPE_ALL_F32, RB_TYPE_F32, 0},
    {"f16", RB_FTYPE_MOSTLY_F16, RB_TYPE_F16, 0},
    {"bf16", RB_FTYPE_MOSTLY_BF16, RB_TYPE_BF16, 0},
    {"q8_0", RB_FTYPE_MOSTLY_Q8_0, RB_TYPE_Q8_0, 0},
    {"q4_0", RB_FTYPE_MOSTLY_Q4_0, RB_TYPE_Q4_0, 0},
    {"q4_1", RB_FTYPE_MOSTLY_Q4_1, RB_TYPE_Q4_1, 0},
    {"q4_k", RB_FTYPE_MOSTLY_Q4_K_S, RB_TYPE_Q4_K, 0},
    {"q4_k_m", RB_FTYPE_MOSTLY_Q4_K_M, RB_TYPE_Q4_K, 1},
    {"q5_k", RB_FTYPE_MOSTLY_Q5_K_S, RB_TYPE_Q5_K, 0},
    {"q5_k_m", RB_FTYPE_MOSTLY_Q5_K_M, RB_TYPE_Q5_K, 1},
    {"q6_k", RB_FTYPE_MOSTLY_Q6_K, RB_TYPE_Q6_K, 0},
};

const rb_file_kind *rb_file_kind_find(const char *name)
{
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (strcasecmp(kinds[i].name, name) == 0)
            return &kinds[i];
    return NULL;
}

const char *rb_file_kind_names(void) { return "f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q4_k_m, q5_k, q5_k_m, q6_k"; }

/* llama.cpp's use_more_bits: first and last eighth, every third between. */
static int use_more_bits(int64_t i, int64_t n)
{
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* llama-quantize's fallback for a row length the type's block does not divide. */
static uint32_t fallback_type(uint32_t type)
{
    switch (type) {
    case RB_TYPE_Q4_K: return RB_TYPE_Q5_0;
    case RB_TYPE_Q5_K: return RB_TYPE_Q5_1;
    case RB_TYPE_Q6_K: return RB_TYPE_Q8_0;
    default: return RB_TYPE_F16;
    }
}

rb_tensor_type_choice rb_quant_rules_choose(const rb_file_kind *kind,
                                            const char *name, uint32_t n_dims,
                                            const uint64_t *dims,
                                            uint32_t n_layers, int has_output)
{
    rb_tensor_type_choice c = {RB_TYPE_F32, RB_TYPE_F32, 0};
    /* norms and other vectors are never quantized */
    if (n_dims < 2 || ends_with(name, "_norm.weight"))
        return c;
    uint32_t t = kind->base_type;
    const rb_type_traits *base = rb_type_get_traits(t);
    int is_output = strcmp(name, "output.weight") == 0 ||
                    (!has_output && strcmp(name, "token_embd.weight") == 0);
    if (base->is_quantized) {
        if (is_output) {
            if (dims[0] % base->block_elems != 0)
                t = RB_TYPE_Q8_0;
            else if (t != RB_TYPE_Q8_0)
                t = RB_TYPE_Q6_K;
        } else if (kind->is_q4_k_m && (strstr(name, "attn_v.weight") || strstr(name, "ffn_down"))) {
            int64_t layer = rb_tensor_layer(name);
            if (layer >= 0 && use_more_bits(layer, n_layers))
                t = RB_TYPE_Q6_K;
        }
    }
    c.wanted = t;
    c.type = t;
    while (dims[0] % rb_type_get_traits(c.type)->block_elems != 0) {
        c.type = fallback_type(c.type);
        c.is_fallback = 1;
    }
    return c;
}
