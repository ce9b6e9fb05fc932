/*
 * test_attention.c - the f16 attention loops: the 8-position score and the
 * vectorised V accumulation give the same bits as the sequential scalar
 * forms that reproduce llama.cpp's logits.
 */
#include <stdlib.h>

#include "attention.h"
#include "check.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((int64_t)(*s >> 11) % 2000001 - 1000000) / 250000.0f;
}

int main(void)
{
    uint64_t seed = 42;
    int dims[] = {8, 32, 64, 128, 6, 34};
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
            float want = 0.0f;
            for (int i = 0; i < n; i++) /* the sequential sum, spelled out */
                want += rb_fp16_to_fp32(q[i]) * rb_fp16_to_fp32(k[l * stride + i]);
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
                ref[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(ref[i]) + rb_fp16_to_fp32(v[i]) * s);
            rb_attn_scale_f16(acc, 0.999f, n);
            for (int i = 0; i < n; i++)
                ref[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(ref[i]) * 0.999f);
        }
        CHECK(memcmp(acc, ref, (size_t)n * sizeof *acc) == 0);
    }
    return check_report();
}
