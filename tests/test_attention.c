/*
 * test_attention.c - the f16 attention loops give the bits of ggml's
 * order, spelled out here independently: q.k as ggml_vec_dot_f16 sums it
 * (32-element steps in 4 x 8 fused lanes, a fixed reduction tree, the tail
 * in double), V as f16(fma(v, s, acc)); the 8-position score equals eight
 * single scores. Quantized K rows (q8_0, q4_0 against a q8_0 query): the
 * dispatched kernel equals the scalar reference bit for bit, and a q8_0
 * score is close to the float dot of the dequantized rows.
 */
#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "check.h"
#include "quant.h"
#include "testlib.h"

/* ggml_vec_dot_f16 on AVX2, element by element */
static float ggml_order_dot(const rb_f16 *x, const rb_f16 *y, int n)
{
    float lane[4][8] = {{0}};
    int np = n / 32 * 32;
    for (int i = 0; i < np; i += 32)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 8; l++)
                lane[j][l] = fmaf(rb_fp16_to_fp32(x[i + 8 * j + l]),
                                  rb_fp16_to_fp32(y[i + 8 * j + l]), lane[j][l]);
    double sum = 0.0;
    if (np) {
        float t[8];
        for (int l = 0; l < 8; l++)
            t[l] = (lane[0][l] + lane[2][l]) + (lane[1][l] + lane[3][l]);
        float h0 = t[0] + t[4], h1 = t[1] + t[5], h2 = t[2] + t[6], h3 = t[3] + t[7];
        sum = (h0 + h1) + (h2 + h3);
    }
    for (int i = np; i < n; i++)
        sum += (double)(rb_fp16_to_fp32(x[i]) * rb_fp16_to_fp32(y[i]));
    return (float)sum;
}

/* Uniform in [-4, 4). */
static float frand(rb_test_rng *r) { return (float)(rb_test_rng_uniform(r) * 8.0 - 4.0); }

int main(void)
{
    rb_test_rng seed = rb_test_rng_seed(42);
    int dims[] = {8, 32, 64, 128, 6, 34, 80, 96};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
        int n = dims[d];
        int64_t stride = n + (d % 2 ? 2 : 0); /* rows packed or with a gap */
        rb_f16 q[256], k[8 * 260], acc[256], ref[256], v[256];
        for (int i = 0; i < n; i++)
            q[i] = rb_fp32_to_fp16(frand(&seed));
        for (int i = 0; i < 8 * 260; i++)
            k[i] = rb_fp32_to_fp16(frand(&seed));
        float out[8];
        rb_attn_dot8_f16(q, k, stride, n, out);
        for (int l = 0; l < 8; l++) {
            float want = ggml_order_dot(k + l * stride, q, n);
            CHECK(out[l] == want);
            CHECK(rb_attn_dot_f16(q, k + l * stride, n) == want);
        }
        for (int i = 0; i < n; i++) {
            acc[i] = ref[i] = rb_fp32_to_fp16(frand(&seed));
            v[i] = rb_fp32_to_fp16(frand(&seed));
        }
        for (int step = 0; step < 50; step++) {
            float s = frand(&seed) * 0.25f;
            rb_attn_mad_f16(acc, v, s, n);
            for (int i = 0; i < n; i++)
                ref[i] = rb_fp32_to_fp16(fmaf(rb_fp16_to_fp32(v[i]), s, rb_fp16_to_fp32(ref[i])));
            rb_attn_scale_f16(acc, 0.999f, n);
            for (int i = 0; i < n; i++)
                ref[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(ref[i]) * 0.999f);
        }
        CHECK(memcmp(acc, ref, (size_t)n * sizeof *acc) == 0);
    }
    /* quantized K: dispatched == _ref, and near the float dot */
    for (int n = 32; n <= 256; n *= 2) {
        float x[256], y[256];
        for (int i = 0; i < n; i++)
            x[i] = frand(&seed), y[i] = frand(&seed);
        rb_block_q8_0 kq8[8], qq[8];
        rb_block_q4_0 kq4[8];
        rb_type_get_traits(RB_TYPE_Q8_0)->quantize_row(x, kq8, n);
        rb_type_get_traits(RB_TYPE_Q4_0)->quantize_row(x, kq4, n);
        rb_type_get_traits(RB_TYPE_Q8_0)->quantize_row(y, qq, n);
        float a = rb_attn_dot_q8_0(kq8, qq, n), b = rb_attn_dot_q8_0_ref(kq8, qq, n);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        a = rb_attn_dot_q4_0(kq4, qq, n), b = rb_attn_dot_q4_0_ref(kq4, qq, n);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
        double exact = 0;
        for (int i = 0; i < n; i++)
            exact += (double)x[i] * y[i];
        CHECK(fabs(rb_attn_dot_q8_0(kq8, qq, n) - exact) < 0.02 * n);
    }
    return check_report();
}
