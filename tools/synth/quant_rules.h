/*
 * quant_rules.h - which type each tensor gets in a file of a given kind.
 *
 * The same rules as llama.cpp's llama-quantize (llama_tensor_get_type), for
 * the file kinds rebound writes, so that a `rebound make-model` or `rebound
 * quantize` file reads the same bytes per token as llama.cpp's own:
 *
 *   - 1-D tensors (norms) stay F32;
 *   - the output matrix (output.weight, or token_embd.weight when the output
 *     is tied) becomes Q6_K for quantized kinds other than Q8_0;
 *   - Q4_K_M: attn_v and ffn_down of the layers where use_more_bits(i, n)
 *     (the first and last eighth, and every third in between) become Q6_K;
 *   - a row length that is not a multiple of the chosen type's block falls
 *     back as llama-quantize does: Q4_K -> Q5_0, Q6_K -> Q8_0, and then to
 *     F16 when even that does not divide (llama-quantize refuses such a
 *     tensor for Q4_0/Q8_0; rebound writes it as F16 and says so).
 */
#ifndef RB_QUANT_RULES_H
#define RB_QUANT_RULES_H

#include <stdint.h>

/* llama.cpp's llama_ftype values, as stored in general.file_type. */
typedef enum rb_ftype {
    RB_FTYPE_ALL_F32 = 0,
    RB_FTYPE_MOSTLY_F16 = 1,
    RB_FTYPE_MOSTLY_Q4_0 = 2,
    RB_FTYPE_MOSTLY_Q4_1 = 3,
    RB_FTYPE_MOSTLY_Q8_0 = 7,
    RB_FTYPE_MOSTLY_Q4_K_S = 14,
    RB_FTYPE_MOSTLY_Q4_K_M = 15,
    RB_FTYPE_MOSTLY_Q5_K_S = 16,
    RB_FTYPE_MOSTLY_Q5_K_M = 17,
    RB_FTYPE_MOSTLY_Q6_K = 18,
    RB_FTYPE_MOSTLY_BF16 = 32,
} rb_ftype;

/* A file kind by its name in the CLI: f32 f16 bf16 q8_0 q4_0 q4_1 q4_k
 * q4_k_m q5_k q5_k_m q6_k. q4_k (q5_k) is every matrix in Q4_K (Q5_K),
 * output Q6_K, labelled MOSTLY_Q4_K_S (Q5_K_S); the _m kinds follow
 * llama-quantize's Q4_K_M / Q5_K_M rules (attn_v and ffn_down of the
 * use_more_bits layers in Q6_K). */
typedef struct rb_file_kind {
    const char *name;
    rb_ftype ftype;
    uint32_t base_type;   /* rb_type of most matrices */
    int is_q4_k_m;        /* the _M rules (Q4_K_M and Q5_K_M share them) */
} rb_file_kind;

/* The kind with this name (case-insensitive), or NULL. */
const rb_file_kind *rb_file_kind_find(const char *name);
/* "f32, f16, ..." for messages. */
const char *rb_file_kind_names(void);

typedef struct rb_tensor_type_choice {
    uint32_t type;        /* rb_type to write */
    uint32_t wanted;      /* what the rules chose before any fallback */
    int is_fallback;      /* type != wanted: the row length did not fit */
} rb_tensor_type_choice;

/*
 * The type of one tensor. name is its GGUF name, dims[0] its row length,
 * n_layers the model's block count, has_output whether output.weight exists.
 */
rb_tensor_type_choice rb_quant_rules_choose(const rb_file_kind *kind,
                                            const char *name, uint32_t n_dims,
                                            const uint64_t *dims,
                                            uint32_t n_layers, int has_output);

#endif /* RB_QUANT_RULES_H */
