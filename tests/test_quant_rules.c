/*
 * test_quant_rules.c - per-tensor type choice against llama-quantize's own
 * output: the parity files in ../shared/models were quantized by llama.cpp,
 * so for every tensor in them our rules must pick the type they hold.
 */
#include <stdlib.h>

#include "check.h"
#include "gguf.h"
#include "model.h"
#include "quant.h"
#include "quant_rules.h"

static int check_against_file(const char *file, const char *kind_name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", REBOUND_MODELS_DIR, file);
    rb_gguf *g = NULL;
    rb_error err;
    if (rb_gguf_open(path, 0, NULL, &g, &err) != RB_OK) {
        printf("skip %s: %s\n", file, err.message);
        return 0;
    }
    rb_hparams hp;
    CHECK_EQ_INT(rb_hparams_read(g, &hp, &err), RB_OK);
    const rb_file_kind *kind = rb_file_kind_find(kind_name);
    CHECK(kind != NULL);
    int has_output = rb_gguf_find_tensor(g, "output.weight") != NULL;
    for (uint64_t i = 0; i < rb_gguf_n_tensors(g); i++) {
        const rb_gguf_tensor *t = rb_gguf_tensor_at(g, i);
        rb_tensor_type_choice c = rb_quant_rules_choose(kind, t->name, t->n_dims, t->dims,
                                                        hp.n_layers, has_output);
        if (c.type != t->type)
            fprintf(stderr, "%s: %s: rules chose %s, llama-quantize wrote %s\n", file,
                    t->name, rb_type_name(c.type), rb_type_name(t->type));
        CHECK_EQ_INT(c.type, t->type);
    }
    rb_gguf_close(g);
    return 1;
}

static void test_rules_by_hand(void)
{
    const rb_file_kind *q4_0 = rb_file_kind_find("Q4_0");
    const rb_file_kind *q4km = rb_file_kind_find("q4_k_m");
    const rb_file_kind *q8 = rb_file_kind_find("q8_0");
    const rb_file_kind *f16 = rb_file_kind_find("f16");
    CHECK(q4_0 && q4km && q8 && f16);
    CHECK(rb_file_kind_find("q5_1") == NULL);
    const rb_file_kind *q5km = rb_file_kind_find("Q5_K_M"), *q5k = rb_file_kind_find("q5_k");
    const rb_file_kind *q4_1 = rb_file_kind_find("q4_1");
    CHECK(q5km && q5k && q4_1);
    uint64_t norm[1] = {2048}, mat[2] = {2048, 2048}, odd[2] = {172, 64}, small[2] = {64, 512};
    uint64_t w960[2] = {960, 960};
    /* norms stay F32 whatever the kind */
    CHECK_EQ_INT(rb_quant_rules_choose(q4_0, "blk.0.attn_norm.weight", 1, norm, 22, 1).type, RB_TYPE_F32);
    CHECK_EQ_INT(rb_quant_rules_choose(f16, "output_norm.weight", 1, norm, 22, 1).type, RB_TYPE_F32);
    /* output: Q6_K for Q4_0, stays Q8_0 for Q8_0, tied token_embd counts as output */
    CHECK_EQ_INT(rb_quant_rules_choose(q4_0, "output.weight", 2, mat, 22, 1).type, RB_TYPE_Q6_K);
    CHECK_EQ_INT(rb_quant_rules_choose(q8, "output.weight", 2, mat, 22, 1).type, RB_TYPE_Q8_0);
    CHECK_EQ_INT(rb_quant_rules_choose(q4_0, "token_embd.weight", 2, mat, 22, 0).type, RB_TYPE_Q6_K);
    CHECK_EQ_INT(rb_quant_rules_choose(q4_0, "token_embd.weight", 2, mat, 22, 1).type, RB_TYPE_Q4_0);
    CHECK_EQ_INT(rb_quant_rules_choose(f16, "output.weight", 2, mat, 22, 1).type, RB_TYPE_F16);
    /* Q4_K_M: use_more_bits layers of 22: 0,1 (n/8=2), 4,7,10,13,16, and >= 19 */
    int expect_q6[22] = {1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1};
    for (int l = 0; l < 22; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.ffn_down.weight", l);
        CHECK_EQ_INT(rb_quant_rules_choose(q4km, name, 2, mat, 22, 1).type,
                     expect_q6[l] ? RB_TYPE_Q6_K : RB_TYPE_Q4_K);
        snprintf(name, sizeof name, "blk.%d.attn_q.weight", l);
        CHECK_EQ_INT(rb_quant_rules_choose(q4km, name, 2, mat, 22, 1).type, RB_TYPE_Q4_K);
    }
    /* Q5_K_M: Q4_K_M's layers in Q6_K, the rest Q5_K; q5_k and q4_1 uniform */
    for (int l = 0; l < 22 && q5km && q5k && q4_1; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_v.weight", l);
        CHECK_EQ_INT(rb_quant_rules_choose(q5km, name, 2, mat, 22, 1).type,
                     expect_q6[l] ? RB_TYPE_Q6_K : RB_TYPE_Q5_K);
        CHECK_EQ_INT(rb_quant_rules_choose(q5k, name, 2, mat, 22, 1).type, RB_TYPE_Q5_K);
        CHECK_EQ_INT(rb_quant_rules_choose(q4_1, name, 2, mat, 22, 1).type, RB_TYPE_Q4_1);
        snprintf(name, sizeof name, "blk.%d.ffn_up.weight", l);
        CHECK_EQ_INT(rb_quant_rules_choose(q5km, name, 2, mat, 22, 1).type, RB_TYPE_Q5_K);
    }
    if (q5km && q4_1) {
        CHECK_EQ_INT(rb_quant_rules_choose(q5km, "output.weight", 2, mat, 22, 1).type, RB_TYPE_Q6_K);
        CHECK_EQ_INT(rb_quant_rules_choose(q4_1, "output.weight", 2, mat, 22, 1).type, RB_TYPE_Q6_K);
        CHECK_EQ_INT(rb_quant_rules_choose(q5km, "blk.0.attn_q.weight", 2, small, 5, 1).type,
                     RB_TYPE_Q5_1); /* llama-quantize's fallback for Q5_K */
        CHECK_EQ_INT(rb_file_kind_find("q5_k_m")->ftype, RB_FTYPE_MOSTLY_Q5_K_M);
    }
    /* fallbacks: 172 % 32 != 0 -> F16; 64 % 256 -> Q4_K to Q5_0, Q6_K to Q8_0 */
    rb_tensor_type_choice c = rb_quant_rules_choose(q4_0, "blk.0.ffn_down.weight", 2, odd, 5, 1);
    CHECK_EQ_INT(c.type, RB_TYPE_F16);
    CHECK_EQ_INT(c.wanted, RB_TYPE_Q4_0);
    CHECK(c.is_fallback);
    c = rb_quant_rules_choose(q4km, "blk.0.attn_q.weight", 2, small, 5, 1);
    CHECK_EQ_INT(c.type, RB_TYPE_Q5_0);
    c = rb_quant_rules_choose(q4_0, "output.weight", 2, small, 5, 1);
    CHECK_EQ_INT(c.type, RB_TYPE_Q8_0);
    c = rb_quant_rules_choose(q4km, "token_embd.weight", 2, w960, 32, 0);
    CHECK_EQ_INT(c.type, RB_TYPE_Q8_0);
    CHECK(!rb_quant_rules_choose(q4km, "blk.0.ffn_gate.weight", 2, mat, 5, 1).is_fallback);
}

int main(void)
{
    test_rules_by_hand();
    int n = 0;
    n += check_against_file("parity-Q4_0.gguf", "q4_0");
    n += check_against_file("parity-Q4_K_M.gguf", "q4_k_m");
    n += check_against_file("parity-Q8_0.gguf", "q8_0");
    n += check_against_file("parity-F16.gguf", "f16");
    n += check_against_file("parity-qwen3-Q8_0.gguf", "q8_0");
    printf("compared with %d llama-quantize files\n", n);
    return check_report();
}
