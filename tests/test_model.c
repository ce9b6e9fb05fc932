/*
 * test_model.c - hyperparameters and byte accounting of rb_model, against
 * the reference models' README figures and hand-made metadata.
 */
#include <stdlib.h>
#include <unistd.h>

#include "check.h"
#include "gguf_write.h"
#include "model.h"
#include "quant.h"

static void test_stories260k(void)
{
    const char *path = REBOUND_MODELS_DIR "/stories260K.gguf";
    if (access(path, R_OK) != 0) {
        printf("skip stories260K: %s is absent\n", path);
        return;
    }
    for (int use_mmap = 0; use_mmap <= 1; use_mmap++) {
        rb_model_params p = rb_model_default_params();
        p.use_mmap = use_mmap;
        rb_model *m = NULL;
        rb_error err;
        CHECK_EQ_INT(rb_model_open(path, &p, &m, &err), RB_OK);
        if (!m)
            return;
        rb_model_info mi;
        CHECK_EQ_INT(rb_model_get_info(m, &mi), RB_OK);
        /* the figures of shared/models/README.md */
        CHECK_STR_EQ(mi.architecture, "llama");
        CHECK_EQ_U64(mi.n_tensors, 48);
        CHECK_EQ_U64(mi.tensor_data_bytes, 1171200);
        CHECK_EQ_U64(rb_model_get_layer_bytes(m, 0), 181760);
        CHECK_EQ_U64(rb_model_get_layer_bytes(m, 4), 181760);
        CHECK_EQ_U64(rb_model_get_layer_bytes(m, 5), 0);
        CHECK_EQ_U64(mi.layer_weight_bytes, 908800);
        CHECK_EQ_U64(mi.kv_bytes_per_token, 640);
        CHECK_EQ_U64(mi.kv_bytes_per_token * 512, 327680);
        CHECK_EQ_INT(mi.n_layers, 5);
        CHECK_EQ_INT(mi.n_embd, 64);
        CHECK_EQ_INT(mi.n_head, 8);
        CHECK_EQ_INT(mi.n_head_kv, 4);
        CHECK_EQ_INT(mi.head_dim, 8);
        CHECK_EQ_INT(mi.n_ff, 172);
        CHECK_EQ_INT(mi.n_vocab, 512);
        CHECK_EQ_INT(mi.n_ctx_train, 128);
        CHECK_EQ_INT(mi.n_rot, 8);
        CHECK_NEAR(mi.rms_eps, 1e-5, 1e-9);
        CHECK_NEAR(mi.rope_freq_base, 10000.0, 0);
        CHECK(!mi.is_tied_output);
        rb_tensor_info ti;
        CHECK_EQ_INT(rb_model_get_tensor_info(m, 0, &ti), RB_OK);
        CHECK_STR_EQ(ti.name, "token_embd.weight");
        CHECK_STR_EQ(ti.type_name, "F32");
        CHECK_EQ_U64(ti.dims[0], 64);
        CHECK_EQ_U64(ti.dims[1], 512);
        CHECK_EQ_INT(rb_model_get_tensor_info(m, 48, &ti), RB_E_INVALID_ARG);
        CHECK_CONTAINS(rb_model_errmsg(m), "out of range");
        rb_model_close(m);
    }
    /* qwen3: explicit key_length makes the head dim 64 (not 256 / 8 = 32) */
    rb_model *m = NULL;
    rb_error err;
    if (rb_model_open(REBOUND_MODELS_DIR "/parity-qwen3-Q8_0.gguf", NULL, &m, &err) == RB_OK) {
        rb_model_info mi;
        rb_model_get_info(m, &mi);
        CHECK_STR_EQ(mi.architecture, "qwen3");
        CHECK_EQ_INT(mi.head_dim, 64);
        CHECK_EQ_INT(mi.n_vocab, 50257);
        CHECK(mi.is_tied_output);
        CHECK_EQ_U64(mi.kv_bytes_per_token, 2ull * 2 * 2 * 64 * 2);
        rb_model_close(m);
    }
}

/* Writes a metadata-only model file with the given u32 keys. */
static void write_meta(const char *path, const char *arch, const char *const *keys,
                       const uint32_t *vals, int n)
{
    rb_gguf_writer *w = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
    if (!w)
        return;
    if (arch)
        rb_gguf_writer_set_str(w, "general.architecture", arch);
    for (int i = 0; i < n; i++)
        rb_gguf_writer_set_u32(w, keys[i], vals[i]);
    uint64_t dims[2] = {32, 4};
    rb_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", RB_TYPE_F32, 2, dims);
    rb_gguf_writer_begin_data(w);
    float zeros[128] = {0};
    rb_gguf_writer_write(w, zeros, sizeof zeros);
    CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_OK);
    rb_gguf_writer_destroy(w);
}

static void expect_open_error(const char *path, rb_status st, const char *needle)
{
    rb_model *m = NULL;
    rb_error err = {0};
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), st);
    CHECK(m == NULL);
    CHECK_CONTAINS(err.message, needle);
    rb_model_close(m);
}

static void test_hparams_errors(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/model-meta.gguf", REBOUND_TEST_TMP);
    const char *k[] = {"mamba.block_count", "mamba.embedding_length", "mamba.attention.head_count"};
    uint32_t v[] = {2, 32, 4};
    /* an architecture rebound cannot run still describes itself */
    write_meta(path, "mamba", k, v, 3);
    rb_model *m = NULL;
    rb_error err;
    CHECK_EQ_INT(rb_model_open(path, NULL, &m, &err), RB_OK);
    if (m) {
        rb_model_info mi;
        rb_model_get_info(m, &mi);
        CHECK_STR_EQ(mi.architecture, "mamba");
        CHECK_EQ_INT(mi.n_head_kv, 4); /* defaults to head_count */
        CHECK_EQ_INT(mi.head_dim, 8);
        CHECK_EQ_U64(rb_model_get_layer_bytes(m, 0), 32 * 4 * 4);
        rb_model_close(m);
    }
    write_meta(path, NULL, k, v, 3);
    expect_open_error(path, RB_E_UNSUPPORTED, "'general.architecture' is missing");
    write_meta(path, "mamba", k, v, 2);
    expect_open_error(path, RB_E_UNSUPPORTED, "'mamba.attention.head_count' is missing");
    const char *k2[] = {"llama.block_count", "llama.embedding_length",
                        "llama.attention.head_count", "llama.attention.head_count_kv"};
    uint32_t v2[] = {2, 32, 4, 3};
    write_meta(path, "llama", k2, v2, 4);
    expect_open_error(path, RB_E_FORMAT, "head_count_kv 3 does not divide head_count 4");
    uint32_t v3[] = {0, 32, 4, 4};
    write_meta(path, "llama", k2, v3, 4);
    expect_open_error(path, RB_E_FORMAT, "none may be zero");
    /* a rope base or rms eps that is NaN, infinite or not positive makes
       every logit NaN: refused at open */
    const float bad_f[] = {0.0f, -1.0f, NAN, INFINITY};
    for (int b = 0; b < 8; b++) {
        rb_gguf_writer *w = NULL;
        CHECK_EQ_INT(rb_gguf_writer_create(path, 0, NULL, &w, &err), RB_OK);
        if (!w)
            break;
        rb_gguf_writer_set_str(w, "general.architecture", "llama");
        uint32_t v4[] = {2, 32, 4, 4};
        for (int i = 0; i < 4; i++)
            rb_gguf_writer_set_u32(w, k2[i], v4[i]);
        rb_gguf_writer_set_f32(w, b < 4 ? "llama.rope.freq_base"
                                        : "llama.attention.layer_norm_rms_epsilon", bad_f[b % 4]);
        uint64_t dims[2] = {32, 4};
        rb_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", RB_TYPE_F32, 2, dims);
        rb_gguf_writer_begin_data(w);
        float zeros[128] = {0};
        rb_gguf_writer_write(w, zeros, sizeof zeros);
        CHECK_EQ_INT(rb_gguf_writer_finish(w), RB_OK);
        rb_gguf_writer_destroy(w);
        expect_open_error(path, RB_E_FORMAT, "must be finite and positive");
    }
    expect_open_error("/nonexistent/model.gguf", RB_E_NOT_FOUND, "No such file");
    unlink(path);
}

static void test_tensor_layer(void)
{
    CHECK_EQ_INT(rb_tensor_layer("blk.0.attn_q.weight"), 0);
    CHECK_EQ_INT(rb_tensor_layer("blk.31.ffn_up.weight"), 31);
    CHECK_EQ_INT(rb_tensor_layer("token_embd.weight"), -1);
    CHECK_EQ_INT(rb_tensor_layer("blk.x.attn"), -1);
    CHECK_EQ_INT(rb_tensor_layer("blk.12"), -1);
    CHECK_EQ_INT(rb_tensor_layer("blk.99999999999.a"), -1);
}

int main(void)
{
    test_stories260k();
    test_hparams_errors();
    test_tensor_layer();
    return check_report();
}
