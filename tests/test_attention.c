/*
 * test_attention.c - the f16 attention loops give the bits of ggml's
 * order, spelled out here independently: q.k as ggml_vec_dot_f16 sums it
 * (32-element steps in 4 x 8 fused lanes, a fixed reduction tree, the tail
 * in double), V as f16(fma(v, s, acc)); the 8-position score equals eight
 * single scores. Quantized K rows (q8_0, q4_0 against a q8_0 query): the
 * dispatched kernel equals the scalar reference bit for bit, and a q8_0
 * score is close to the float dot of the dequantized rows. SwiGLU: on the
 * vector tiers the first n - n % 8 values of a row take ggml's vector exp
 * (spelled out here in scalar fmaf steps), the rest libm's expf; on the
 * ref tier every value libm's. All of it on every tier this build has and
 * this CPU runs (x86-64: ref, avx2, vnni, avx512; aarch64: ref, neon,
 * dotprod - under qemu-user in CI).
 */
#include <math.h>
#include <stdlib.h>

#include "attention.h"
#include "check.h"
#include "cpu.h"
#include "ops.h"
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

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float f32_from(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* e^x as ggml's AVX2 / NEON SiLU computes it (ARM optimized-routines'
 * expf), one lane: fnmadd(a, b, c) is fmaf(-a, b, c) */
static float ggml_vexpf(float x)
{
    const float shift = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, shift);
    const float n = z - shift;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = f32_bits(z) << 23;
    const float scale = f32_from(e + f32_bits(1.0f));
    const float b2 = b * b;
    const float c45 = fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f);
    const float c23 = fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f);
    const float poly = fmaf(fmaf(c45, b2, c23), b2, 0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f))
        return fmaf(poly, scale, scale);
    const uint32_t neg = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = f32_from(neg + 0x7f000000u), s2 = f32_from(e - neg);
    if (fabsf(n) > 192.0f)
        return s1 * s1;
    return fmaf(s2, poly, s2) * s1;
}

static int is_vector_tier(int tier)
{
    return tier != RB_CPU_TIER_REF;
}

static void check_swiglu(rb_test_rng *seed)
{
    enum { N = 4003 };
    float gate[N], up[N], want[N];
    const int vec = is_vector_tier(rb_cpu_tier());
    for (int trial = 0; trial < 6; trial++) {
        const int64_t n = trial == 0 ? 7 : trial == 1 ? 8 : N - trial;
        for (int64_t i = 0; i < n; i++) {
            /* mostly ordinary, some past the exp's split (|x| > 87) and
               saturation (|x| > 133) points */
            const double r = rb_test_rng_uniform(seed);
            gate[i] = r < 0.1 ? (float)(rb_test_rng_uniform(seed) * 400.0 - 200.0) : frand(seed) * 3;
            up[i] = frand(seed);
        }
        const int64_t nv = vec ? n - n % 8 : 0;
        for (int64_t i = 0; i < n; i++) {
            const float g = gate[i];
            const float e = i < nv ? ggml_vexpf(0.0f - g) : expf(-g);
            want[i] = g / (1.0f + e) * up[i];
        }
        rb_swiglu(gate, up, n);
        int bad = 0;
        for (int64_t i = 0; i < n; i++)
            bad += memcmp(&gate[i], &want[i], 4) != 0;
        CHECK_EQ_INT(bad, 0);
    }
}

static void check_tier(rb_test_rng *rng)
{
    rb_test_rng seed = *rng;
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
    /* a block of 8 positions == the same steps one call at a time (the
       avx512 tier's block runs its own kernel for dims 64, 128, 256) */
    {
        static const int bdims[] = {8, 32, 64, 96, 128, 256};
        for (size_t d = 0; d < sizeof bdims / sizeof bdims[0]; d++) {
            const int n = bdims[d];
            const int64_t stride = n + 8;
            static rb_f16 q[256], k[8 * 264], v[8 * 264], acc[256], ref[256];
            for (int i = 0; i < n; i++)
                q[i] = rb_fp32_to_fp16(frand(&seed) * 0.02f); /* scores of order 1 */
            for (int i = 0; i < 8 * 264; i++) {
                k[i] = rb_fp32_to_fp16(frand(&seed));
                v[i] = rb_fp32_to_fp16(frand(&seed));
            }
            for (int i = 0; i < n; i++)
                acc[i] = ref[i] = 0;
            float m = -INFINITY, sum = 0.0f, rm = -INFINITY, rsum = 0.0f;
            const float kq = 0.125f;
            for (int blk = 0; blk < 4; blk++) {
                rb_attn_block8_f16(q, k, v, stride, n, kq, acc, &m, &sum);
                for (int l = 0; l < 8; l++) {
                    const float s = rb_attn_dot_f16(q, k + l * stride, n) * kq;
                    float ms = 1.0f, vs = 1.0f;
                    if (s > rm) {
                        const float old = rm;
                        rm = s;
                        ms = expf(old - rm);
                        rb_attn_scale_f16(ref, ms, n);
                    } else {
                        vs = expf(s - rm);
                    }
                    rb_attn_mad_f16(ref, v + l * stride, vs, n);
                    rsum = fmaf(rsum, ms, vs);
                }
                /* the next block's K rows: some scores above the max */
                for (int i = 0; i < 8 * 264; i++)
                    k[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(k[i]) * (blk % 2 ? 0.5f : 1.7f));
            }
            CHECK(memcmp(acc, ref, (size_t)n * sizeof *acc) == 0);
            CHECK(memcmp(&m, &rm, sizeof m) == 0);
            CHECK(memcmp(&sum, &rsum, sizeof sum) == 0);
        }
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
    /* q8_0 values of -128 (a K page may hold them) and full-range bytes */
    {
        rb_block_q8_0 kq8[4], qq[4];
        for (int b = 0; b < 4; b++) {
            kq8[b].d = rb_fp32_to_fp16(0.01f * (float)(b + 1));
            qq[b].d = rb_fp32_to_fp16(0.02f);
            for (int i = 0; i < 32; i++) {
                kq8[b].qs[i] = (int8_t)(i % 5 == 0 ? -128 : (int)(rb_test_rng_uniform(&seed) * 255) - 127);
                qq[b].qs[i] = (int8_t)(i % 7 == 0 ? -127 : (int)(rb_test_rng_uniform(&seed) * 255) - 127);
            }
        }
        float a = rb_attn_dot_q8_0(kq8, qq, 128), b = rb_attn_dot_q8_0_ref(kq8, qq, 128);
        CHECK(memcmp(&a, &b, sizeof a) == 0);
    }
    check_swiglu(&seed);
    *rng = seed;
}

int main(void)
{
    rb_test_rng seed = rb_test_rng_seed(42);
    const int tier0 = rb_cpu_tier();
    int ran = 0;
    for (int tier = 0; tier < RB_CPU_TIER_COUNT; tier++) {
        if (!rb_cpu_tier_available(tier))
            continue;
        rb_cpu_set_tier(tier);
        const int before = check_failures;
        check_tier(&seed);
        printf("tier %s: %s\n", rb_cpu_tier_name(tier), check_failures == before ? "ok" : "FAILED");
        ran++;
    }
    rb_cpu_set_tier(tier0);
    CHECK(ran >= 1);
    return check_report();
}
