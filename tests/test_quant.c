/*
 * test_quant.c - the type traits table, fp16/bf16 conversions and the
 * reference quantizers of src/base/quant.c.
 *
 * Three kinds of evidence:
 *   1. exact facts: block sizes of every type, row_bytes edge cases, all
 *      65536 halves round-tripping through f32, known f16/bf16 encodings;
 *   2. layout pinned by hand: Q4_K, Q5_K and Q6_K blocks built byte by byte
 *      in this file from the layout description, their expected values
 *      computed per element index (independent of the dequantizers' loop
 *      structure), plus byte checks on Q4_0/Q5_0 packing;
 *   3. quality and agreement: round-trip RMS on fixed-seed N(0,1) data
 *      against named bounds, idempotence of Q8_0/Q4_0, and (when the
 *      reference models are present) dequantizing llama.cpp's own Q4_K, Q6_K,
 *      Q4_0 and Q8_0 tensors against the F16 file of the same weights.
 */
#include "quant.h"

#include <stdlib.h>

#include "check.h"
#include "testlib.h"

/* ---- fixed-seed N(0,1) ---------------------------------------------------- */

static rb_test_rng rng;

static void fill_normal(float *x, int n, uint64_t seed)
{
    rng = rb_test_rng_seed(seed);
    for (int i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(rb_test_rng_open01(&rng)));
        double t = 2.0 * 3.14159265358979323846 * rb_test_rng_open01(&rng);
        x[i] = (float)(r * cos(t));
        if (i + 1 < n)
            x[i + 1] = (float)(r * sin(t));
    }
}

static double rms_diff(const float *a, const float *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / (double)n);
}

/* ---- traits --------------------------------------------------------------- */

static void test_traits(void)
{
    static const struct {
        uint32_t id;
        const char *name;
        uint32_t elems, bytes;
    } want[] = {
        {RB_TYPE_F32, "F32", 1, 4},         {RB_TYPE_F16, "F16", 1, 2},
        {RB_TYPE_BF16, "BF16", 1, 2},       {RB_TYPE_Q4_0, "Q4_0", 32, 18},
        {RB_TYPE_Q4_1, "Q4_1", 32, 20},     {RB_TYPE_Q5_0, "Q5_0", 32, 22},
        {RB_TYPE_Q5_1, "Q5_1", 32, 24},     {RB_TYPE_Q8_0, "Q8_0", 32, 34},
        {RB_TYPE_Q8_1, "Q8_1", 32, 36},     {RB_TYPE_Q2_K, "Q2_K", 256, 84},
        {RB_TYPE_Q3_K, "Q3_K", 256, 110},   {RB_TYPE_Q4_K, "Q4_K", 256, 144},
        {RB_TYPE_Q5_K, "Q5_K", 256, 176},   {RB_TYPE_Q6_K, "Q6_K", 256, 210},
        {RB_TYPE_Q8_K, "Q8_K", 256, 292},   {RB_TYPE_IQ4_NL, "IQ4_NL", 32, 18},
        {RB_TYPE_IQ4_XS, "IQ4_XS", 256, 136}, {RB_TYPE_I8, "I8", 1, 1},
        {RB_TYPE_I16, "I16", 1, 2},         {RB_TYPE_I32, "I32", 1, 4},
        {RB_TYPE_I64, "I64", 1, 8},         {RB_TYPE_F64, "F64", 1, 8},
    };
    int n_known = 0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const rb_type_traits *t = rb_type_get_traits(want[i].id);
        CHECK(t != NULL);
        if (!t)
            continue;
        CHECK_STR_EQ(t->name, want[i].name);
        CHECK_EQ_INT(t->block_elems, want[i].elems);
        CHECK_EQ_INT(t->block_bytes, want[i].bytes);
        CHECK_STR_EQ(rb_type_name(want[i].id), want[i].name);
        CHECK_EQ_INT(rb_type_from_name(want[i].name), want[i].id);
        CHECK_EQ_INT(t->is_quantized, want[i].elems > 1);
    }
    for (uint32_t id = 0; id < 64; id++)
        n_known += rb_type_get_traits(id) != NULL;
    CHECK_EQ_INT(n_known, (int)(sizeof want / sizeof want[0]));

    static const uint32_t holes[] = {4, 5, 16, 17, 18, 19, 21, 22, 29, 31, 32,
                                     39, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof holes / sizeof holes[0]; i++) {
        CHECK(rb_type_get_traits(holes[i]) == NULL);
        CHECK_STR_EQ(rb_type_name(holes[i]), "unknown");
    }

    CHECK_EQ_INT(rb_type_from_name("q4_k"), RB_TYPE_Q4_K);
    CHECK_EQ_INT(rb_type_from_name("Q4_k"), RB_TYPE_Q4_K);
    CHECK_EQ_INT(rb_type_from_name("f16"), RB_TYPE_F16);
    CHECK_EQ_INT(rb_type_from_name("bf16"), RB_TYPE_BF16);
    CHECK_EQ_INT(rb_type_from_name("iq4_xs"), RB_TYPE_IQ4_XS);
    CHECK_EQ_INT(rb_type_from_name("Q4"), -1);
    CHECK_EQ_INT(rb_type_from_name("Q4_0x"), -1);
    CHECK_EQ_INT(rb_type_from_name(""), -1);
    CHECK_EQ_INT(rb_type_from_name("unknown"), -1);
    CHECK_EQ_INT(rb_type_from_name(NULL), -1);

    /* function pointers: what rebound can write and read */
    static const uint32_t rw[] = {RB_TYPE_F32, RB_TYPE_F16, RB_TYPE_BF16,
                                  RB_TYPE_Q4_0, RB_TYPE_Q4_1, RB_TYPE_Q5_0,
                                  RB_TYPE_Q5_1, RB_TYPE_Q8_0, RB_TYPE_Q4_K,
                                  RB_TYPE_Q5_K, RB_TYPE_Q6_K};
    for (size_t i = 0; i < sizeof rw / sizeof rw[0]; i++) {
        CHECK(rb_type_get_traits(rw[i])->quantize_row != NULL);
        CHECK(rb_type_get_traits(rw[i])->dequantize_row != NULL);
    }
    CHECK(rb_type_get_traits(RB_TYPE_Q5_K)->quantize_row == rb_quantize_row_q5_K_ref);
    CHECK(rb_type_get_traits(RB_TYPE_Q5_K)->dequantize_row == rb_dequantize_row_q5_K);
    CHECK(rb_type_get_traits(RB_TYPE_Q4_K)->dequantize_row == rb_dequantize_row_q4_K);
    CHECK(rb_type_get_traits(RB_TYPE_Q6_K)->quantize_row == rb_quantize_row_q6_K_ref);
    CHECK(rb_type_get_traits(RB_TYPE_Q2_K)->dequantize_row == NULL);
    CHECK(rb_type_get_traits(RB_TYPE_I32)->dequantize_row == NULL);
}

static void test_row_bytes(void)
{
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_F32, 0), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_F32, 7), 28);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_F16, 4096), 8192);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_0, 4096), 128 * 18);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_0, 4095), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_0, 16), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q8_0, 32), 34);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_K, 256), 144);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_K, 128), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q6_K, 2048), 8 * 210);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q6_K, 2048 + 32), 0);
    CHECK_EQ_U64(rb_type_row_bytes(4, 32), 0);
    CHECK_EQ_U64(rb_type_row_bytes(UINT32_MAX, 32), 0);
    /* large n: exact where it fits, 0 where the product would overflow */
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_I8, UINT64_MAX), UINT64_MAX);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_F16, 1ull << 62), 1ull << 63);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_F32, 1ull << 62), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_F64, 1ull << 62), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_0, 1ull << 62), (1ull << 57) * 18);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q8_K, 1ull << 62), (1ull << 54) * 292);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_0, UINT64_MAX - 31),
                 ((1ull << 59) - 1) * 18); /* 18/32 < 1: never overflows */
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q8_1, UINT64_MAX - 31), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q8_K, UINT64_MAX - 255), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_I16, 1ull << 63), 0);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_K, 1ull << 56),
                 (1ull << 48) * 144);
    CHECK_EQ_U64(rb_type_row_bytes(RB_TYPE_Q4_0, (1ull << 62) + 16), 0);
}

/* ---- fp16 / bf16 ----------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_fp16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = rb_fp16_to_fp32((rb_f16)h);
        int is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        if (is_nan) {
            if (!isnan(f) || !isnan(rb_fp16_to_fp32(rb_fp32_to_fp16(f))))
                bad++;
        } else if (rb_fp32_to_fp16(f) != h) {
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);

    /* the inline conversions (F16C, FCVT, or the baseline's bit
     * manipulation) against the _soft ones: every half, and floats of every
     * exponent, sign and payload (a 4093-step sweep of the bit patterns) */
    bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = rb_fp16_to_fp32((rb_f16)h), b = rb_fp16_to_fp32_soft((rb_f16)h);
        bad += memcmp(&a, &b, sizeof a) != 0;
    }
    for (uint64_t u = 0; u < (UINT64_C(1) << 32); u += 4093) {
        const float f = bits_f32((uint32_t)u);
        bad += rb_fp32_to_fp16(f) != rb_fp32_to_fp16_soft(f);
    }
    CHECK_EQ_INT(bad, 0);

    /* values against an independent formula: (-1)^s 2^(e-15) (1 + m/1024) */
    bad = 0;
    for (uint32_t h = 0; h < 0x7c00; h++) {
        int e = (int)(h >> 10), m = (int)(h & 0x3ff);
        double v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp(m, -24);
        if ((double)rb_fp16_to_fp32((rb_f16)h) != v ||
            (double)rb_fp16_to_fp32((rb_f16)(h | 0x8000)) != -v)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);

    CHECK_EQ_INT(rb_fp32_to_fp16(1.0f), 0x3c00);
    CHECK_EQ_INT(rb_fp32_to_fp16(-2.0f), 0xc000);
    CHECK_EQ_INT(rb_fp32_to_fp16(0.0f), 0x0000);
    CHECK_EQ_INT(rb_fp32_to_fp16(-0.0f), 0x8000);
    CHECK_EQ_INT(rb_fp32_to_fp16(65504.0f), 0x7bff);
    CHECK_EQ_INT(rb_fp32_to_fp16(65519.0f), 0x7bff);   /* below the tie */
    CHECK_EQ_INT(rb_fp32_to_fp16(65520.0f), 0x7c00);   /* tie -> even -> Inf */
    CHECK_EQ_INT(rb_fp32_to_fp16(1e10f), 0x7c00);
    CHECK_EQ_INT(rb_fp32_to_fp16(-1e10f), 0xfc00);
    CHECK_EQ_INT(rb_fp32_to_fp16(INFINITY), 0x7c00);
    CHECK_EQ_INT(rb_fp32_to_fp16(-INFINITY), 0xfc00);
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1p-24f), 0x0001);   /* smallest subnormal */
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1p-25f), 0x0000);   /* tie -> even zero */
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1.000002p-25f), 0x0001);
    CHECK_EQ_INT(rb_fp32_to_fp16(0x3p-25f), 0x0002);   /* 1.5 ulp -> even 2 */
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1p-30f), 0x0000);
    CHECK_EQ_INT(rb_fp32_to_fp16(-0x1p-24f), 0x8001);
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1p-14f), 0x0400);   /* smallest normal */
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1.ffcp-15f), 0x0400); /* tie: up into it */
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1.ff8p-15f), 0x03ff); /* largest subnormal */
    CHECK_EQ_INT(rb_fp32_to_fp16(0x1.ff4p-15f), 0x03fe); /* tie -> even */
    CHECK_EQ_INT(rb_fp32_to_fp16(1.0f + 0x1p-11f), 0x3c00); /* tie -> even */
    CHECK_EQ_INT(rb_fp32_to_fp16(1.0f + 0x3p-11f), 0x3c02); /* tie -> even up */
    CHECK_EQ_INT(rb_fp32_to_fp16(bits_f32(0x3f801001u)), 0x3c01); /* > tie */
    CHECK_EQ_INT(rb_fp32_to_fp16(0.1f), 0x2e66);
    CHECK_EQ_INT(rb_fp32_to_fp16(3.14159265f), 0x4248);
    CHECK(isnan(rb_fp16_to_fp32(rb_fp32_to_fp16(NAN))));
    CHECK_EQ_INT(rb_fp32_to_fp16(bits_f32(0x7f800001u)) & 0x7e00, 0x7e00);
    CHECK_NEAR(rb_fp16_to_fp32(0x3c00), 1.0, 0);
    CHECK_NEAR(rb_fp16_to_fp32(0x7bff), 65504.0, 0);
    CHECK_NEAR(rb_fp16_to_fp32(0x0001), 0x1p-24, 0);
    CHECK(isinf(rb_fp16_to_fp32(0x7c00)) && rb_fp16_to_fp32(0x7c00) > 0);
    CHECK(isinf(rb_fp16_to_fp32(0xfc00)) && rb_fp16_to_fp32(0xfc00) < 0);
    CHECK(isnan(rb_fp16_to_fp32(0x7e00)));
}

static void test_bf16(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = rb_bf16_to_fp32((rb_bf16)h);
        if (f32_bits(f) != (h << 16))
            bad++;
        int is_nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
        rb_bf16 back = rb_fp32_to_bf16(f);
        if (is_nan ? !(isnan(rb_bf16_to_fp32(back)) && (back & 0x40))
                   : back != h)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(rb_fp32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(rb_fp32_to_bf16(-2.0f), 0xc000);
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0x3f808000u)), 0x3f80); /* tie even */
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0x3f818000u)), 0x3f82); /* tie even */
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0x3f808001u)), 0x3f81);
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0x7f7fffffu)), 0x7f80); /* -> Inf */
    CHECK_EQ_INT(rb_fp32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0x00000001u)), 0x0000);
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0x00018000u)), 0x0002); /* subnormal */
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0x7f800001u)), 0x7fc0); /* sNaN quiet */
    CHECK_EQ_INT(rb_fp32_to_bf16(bits_f32(0xffc00000u)), 0xffc0);
}

/* ---- quantizer round trips -------------------------------------------------- */

#define N_RT 4096

typedef struct {
    uint32_t type;
    double max_rms; /* bound on the round-trip RMS for N(0,1) input */
} rt_case;

static void test_round_trips(void)
{
    static const rt_case cases[] = {
        {RB_TYPE_F32, 0.0},     {RB_TYPE_F16, 5e-4},   {RB_TYPE_BF16, 4e-3},
        {RB_TYPE_Q8_0, 0.01},   {RB_TYPE_Q6_K, 0.03},  {RB_TYPE_Q5_0, 0.06},
        {RB_TYPE_Q5_1, 0.06},   {RB_TYPE_Q4_K, 0.11},  {RB_TYPE_Q4_0, 0.13},
        {RB_TYPE_Q4_1, 0.13},   {RB_TYPE_Q5_K, 0.05},
    };
    static float x[N_RT], y[N_RT];
    static uint8_t q[N_RT * 4 + 64], q2[N_RT * 4 + 64];
    fill_normal(x, N_RT, 42);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const rb_type_traits *t = rb_type_get_traits(cases[c].type);
        uint64_t nb = rb_type_row_bytes(cases[c].type, N_RT);
        CHECK(nb > 0 && nb <= sizeof q);
        memset(q, 0xa5, sizeof q);
        t->quantize_row(x, q, N_RT);
        CHECK_EQ_INT(q[nb], 0xa5); /* wrote exactly row_bytes */
        t->dequantize_row(q, y, N_RT);
        double rms = rms_diff(x, y, N_RT);
        fprintf(stderr, "  round trip %-5s rms %.5f (bound %.3g)\n", t->name,
                rms, cases[c].max_rms);
        CHECK(rms <= cases[c].max_rms);

        /* deterministic: the same input gives the same bytes */
        t->quantize_row(x, q2, N_RT);
        CHECK(memcmp(q, q2, nb) == 0);

        /* all-zero input dequantizes to all zeros */
        static float z[N_RT];
        memset(z, 0, sizeof z);
        t->quantize_row(z, q2, N_RT);
        for (int i = 0; i < N_RT; i++)
            y[i] = 1.0f;
        t->dequantize_row(q2, y, N_RT);
        int nonzero = 0;
        for (int i = 0; i < N_RT; i++)
            nonzero += y[i] != 0.0f;
        CHECK_EQ_INT(nonzero, 0);
    }

    /* scaled inputs: the error scales with the data (x 1e-3 and x 100) */
    static const float scales[] = {1e-3f, 100.0f};
    for (size_t s = 0; s < 2; s++) {
        static float xs[N_RT];
        for (int i = 0; i < N_RT; i++)
            xs[i] = x[i] * scales[s];
        rb_quantize_row_q4_K_ref(xs, q, N_RT);
        rb_dequantize_row_q4_K(q, y, N_RT);
        CHECK(rms_diff(xs, y, N_RT) <= 0.11 * scales[s]);
        rb_quantize_row_q6_K_ref(xs, q, N_RT);
        rb_dequantize_row_q6_K(q, y, N_RT);
        CHECK(rms_diff(xs, y, N_RT) <= 0.03 * scales[s]);
    }

    /* blocks of one sign and constant blocks stay well represented */
    static float xp[N_RT];
    for (int i = 0; i < N_RT; i++)
        xp[i] = (i / 256) % 2 ? fabsf(x[i]) + 1.0f : -0.5f;
    rb_quantize_row_q4_K_ref(xp, q, N_RT);
    rb_dequantize_row_q4_K(q, y, N_RT);
    CHECK(rms_diff(xp, y, N_RT) <= 0.11);
    rb_quantize_row_q6_K_ref(xp, q, N_RT);
    rb_dequantize_row_q6_K(q, y, N_RT);
    CHECK(rms_diff(xp, y, N_RT) <= 0.03);
}

/* quantize(dequantize(quantize(x))) == quantize(x), byte for byte */
static void test_idempotence(void)
{
    static const uint32_t types[] = {RB_TYPE_Q8_0, RB_TYPE_Q4_0};
    static float x[N_RT], y[N_RT];
    static uint8_t q1[N_RT * 2], q2[N_RT * 2];
    fill_normal(x, N_RT, 7);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const rb_type_traits *t = rb_type_get_traits(types[i]);
        uint64_t nb = rb_type_row_bytes(types[i], N_RT);
        t->quantize_row(x, q1, N_RT);
        t->dequantize_row(q1, y, N_RT);
        t->quantize_row(y, q2, N_RT);
        CHECK(memcmp(q1, q2, nb) == 0);
    }
}

/* ---- hand-built blocks ------------------------------------------------------ */

static void test_q4_0_q5_0_bytes(void)
{
    /* Q4_0 with x = 0.25 * (q - 8) and q = i % 16: the max-abs value is
     * -2.0 (q = 0), so d = -2 / -8 = 0.25 exactly and every code is exact. */
    float x[32], y[32];
    rb_block_q4_0 b4;
    for (int i = 0; i < 32; i++)
        x[i] = 0.25f * (float)((i % 16) - 8);
    rb_quantize_row_q4_0_ref(x, &b4, 32);
    CHECK_EQ_INT(b4.d, 0x3400); /* 0.25 */
    for (int j = 0; j < 16; j++)
        CHECK_EQ_INT(b4.qs[j], (j % 16) | ((j % 16) << 4));
    rb_dequantize_row_q4_0(&b4, y, 32);
    CHECK(memcmp(x, y, sizeof x) == 0);

    /* Q5_0: x = 0.5 * (q - 16), q = 31 - i, max-abs -8 at i = 31 (q = 0):
     * d = 0.5; element i's code 31 - i; bit 4 set for i < 16. */
    rb_block_q5_0 b5;
    for (int i = 0; i < 32; i++)
        x[i] = 0.5f * (float)((31 - i) - 16);
    rb_quantize_row_q5_0_ref(x, &b5, 32);
    CHECK_EQ_INT(b5.d, 0x3800);
    CHECK_EQ_INT(b5.qh[0], 0xff);
    CHECK_EQ_INT(b5.qh[1], 0xff);
    CHECK_EQ_INT(b5.qh[2], 0x00);
    CHECK_EQ_INT(b5.qh[3], 0x00);
    for (int j = 0; j < 16; j++)
        CHECK_EQ_INT(b5.qs[j], ((31 - j) & 15) | (((31 - j - 16) & 15) << 4));
    rb_dequantize_row_q5_0(&b5, y, 32);
    CHECK(memcmp(x, y, sizeof x) == 0);

    /* Q8_0: d = 127/127 = 1 */
    rb_block_q8_0 b8;
    for (int i = 0; i < 32; i++)
        x[i] = (float)(i * 8 - 127 + (i == 31 ? 6 : 0)); /* -127 .. 127 */
    rb_quantize_row_q8_0_ref(x, &b8, 32);
    CHECK_EQ_INT(b8.d, 0x3c00);
    for (int i = 0; i < 32; i++)
        CHECK_EQ_INT(b8.qs[i], (int)x[i]);
}

/* Pack 8 six-bit scales and mins as the layout comment of quant.c says. */
static void pack_k4_scales(uint8_t out[12], const int sc[8], const int m[8])
{
    for (int j = 0; j < 4; j++) {
        out[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
        out[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
        out[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
}

static void test_k_layouts(void)
{
    static const int sc[8] = {1, 2, 3, 4, 17, 33, 50, 63};
    static const int mn[8] = {0, 5, 10, 15, 20, 40, 60, 63};
    float y[256];

    /* Q4_K: element i = 64g + 32h + l has nibble h of qs[32g + l] */
    rb_block_q4_K b4;
    b4.d = 0x3c00;    /* 1.0 */
    b4.dmin = 0x3800; /* 0.5 */
    pack_k4_scales(b4.scales, sc, mn);
    memset(b4.qs, 0, sizeof b4.qs);
    for (int i = 0; i < 256; i++) {
        int q = (i * 7 + 3) % 16;
        int g = i / 64, h = (i / 32) % 2, l = i % 32;
        b4.qs[32 * g + l] |= (uint8_t)(q << (4 * h));
    }
    rb_dequantize_row_q4_K(&b4, y, 256);
    int bad = 0;
    for (int i = 0; i < 256; i++) {
        int q = (i * 7 + 3) % 16;
        float want = 1.0f * (float)(sc[i / 32] * q) - 0.5f * (float)mn[i / 32];
        bad += y[i] != want;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_NEAR(y[0], 1 * 3 - 0.0, 0);            /* sub 0, q 3 */
    CHECK_NEAR(y[255], 63 * ((255 * 7 + 3) % 16) - 31.5, 0);

    /* Q5_K: same plus bit 4 of element 64g + 32h + l in bit 2g + h of qh[l] */
    rb_block_q5_K b5;
    b5.d = 0x3800;    /* 0.5 */
    b5.dmin = 0x3c00; /* 1.0 */
    pack_k4_scales(b5.scales, sc, mn);
    memset(b5.qs, 0, sizeof b5.qs);
    memset(b5.qh, 0, sizeof b5.qh);
    for (int i = 0; i < 256; i++) {
        int q = (i * 11 + 5) % 32;
        int g = i / 64, h = (i / 32) % 2, l = i % 32;
        b5.qs[32 * g + l] |= (uint8_t)((q & 15) << (4 * h));
        b5.qh[l] |= (uint8_t)((q >> 4) << (2 * g + h));
    }
    rb_dequantize_row_q5_K(&b5, y, 256);
    bad = 0;
    for (int i = 0; i < 256; i++) {
        int q = (i * 11 + 5) % 32;
        float want = 0.5f * (float)(sc[i / 32] * q) - 1.0f * (float)mn[i / 32];
        bad += y[i] != want;
    }
    CHECK_EQ_INT(bad, 0);

    /* Q6_K: element i = 128h + 32k + l: low nibble in ql[64h + l + 32(k&1)]
     * (high nibble when k >= 2), high 2 bits in qh[32h + l] bits 2k..2k+1,
     * scale scales[i / 16], value d * scale * (q - 32). */
    rb_block_q6_K b6;
    b6.d = 0x3400; /* 0.25 */
    for (int j = 0; j < 16; j++)
        b6.scales[j] = (int8_t)(j % 2 ? -(j * 8) : j * 8 + 1); /* -120 .. 113 */
    b6.scales[15] = -128;
    memset(b6.ql, 0, sizeof b6.ql);
    memset(b6.qh, 0, sizeof b6.qh);
    for (int i = 0; i < 256; i++) {
        int q = (i * 5 + 1) % 64;
        int h = i / 128, k = (i % 128) / 32, l = i % 32;
        b6.ql[64 * h + l + 32 * (k & 1)] |= (uint8_t)((q & 15) << (k >= 2 ? 4 : 0));
        b6.qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * k));
    }
    rb_dequantize_row_q6_K(&b6, y, 256);
    bad = 0;
    for (int i = 0; i < 256; i++) {
        int q = (i * 5 + 1) % 64;
        float want = 0.25f * (float)(b6.scales[i / 16] * (q - 32));
        bad += y[i] != want;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_NEAR(y[255], 0.25 * -128 * (((255 * 5 + 1) % 64) - 32), 0);

    /* and our quantizers write the layout our hand packing reads: a block
     * whose values are exactly representable comes back exactly */
    float x[256];
    for (int i = 0; i < 256; i++)
        x[i] = 0.25f * (float)(b6.scales[i / 16] * (((i * 5 + 1) % 64) - 32));
    rb_block_q6_K r6;
    rb_quantize_row_q6_K_ref(x, &r6, 256);
    rb_dequantize_row_q6_K(&r6, y, 256);
    CHECK(rms_diff(x, y, 256) < 1e-3 * 16);
}

/* ---- cross-check against llama.cpp's files ---------------------------------- */

#ifdef REBOUND_MODELS_DIR

typedef struct {
    const uint8_t *p;
    size_t n, off;
    int ok;
} gcur;

static uint64_t g_rd(gcur *c, size_t nbytes)
{
    uint64_t v = 0;
    if (!c->ok || nbytes > c->n - c->off) {
        c->ok = 0;
        return 0;
    }
    for (size_t i = 0; i < nbytes; i++)
        v |= (uint64_t)c->p[c->off + i] << (8 * i);
    c->off += nbytes;
    return v;
}

static void g_skip(gcur *c, uint64_t nbytes)
{
    if (!c->ok || nbytes > c->n - c->off)
        c->ok = 0;
    else
        c->off += (size_t)nbytes;
}

static size_t g_scalar_size(uint32_t type)
{
    static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    return type < sizeof sz / sizeof sz[0] ? sz[type] : 0;
}

static void g_skip_value(gcur *c, uint32_t type, int depth)
{
    if (type == 8) {
        g_skip(c, g_rd(c, 8));
    } else if (type == 9 && depth == 0) {
        uint32_t et = (uint32_t)g_rd(c, 4);
        uint64_t count = g_rd(c, 8);
        if (et == 8 || et == 9) {
            for (uint64_t i = 0; i < count && c->ok; i++)
                g_skip_value(c, et, depth + 1);
        } else if (g_scalar_size(et) && count <= (c->n - c->off) / g_scalar_size(et)) {
            g_skip(c, count * g_scalar_size(et));
        } else {
            c->ok = 0;
        }
    } else if (g_scalar_size(type)) {
        g_skip(c, g_scalar_size(type));
    } else {
        c->ok = 0;
    }
}

typedef struct {
    char name[96];
    uint32_t n_dims, type;
    uint64_t dims[4], offset;
} gtensor;

typedef struct {
    uint8_t *buf;
    size_t size, data_off;
    uint64_t n_tensors;
    gtensor *t;
} gfile;

static void gfile_free(gfile *g)
{
    free(g->buf);
    free(g->t);
    memset(g, 0, sizeof *g);
}

static int gfile_load(gfile *g, const char *path)
{
    memset(g, 0, sizeof *g);
    FILE *f = fopen(path, "rb");
    if (!f)
        return 0;
    if (fseek(f, 0, SEEK_END) != 0)
        goto fail_file;
    long sz = ftell(f);
    if (sz <= 0 || fseek(f, 0, SEEK_SET) != 0)
        goto fail_file;
    g->size = (size_t)sz;
    g->buf = malloc(g->size);
    if (!g->buf || fread(g->buf, 1, g->size, f) != g->size)
        goto fail_file;
    fclose(f);

    gcur c = {g->buf, g->size, 0, 1};
    if (g_rd(&c, 4) != 0x46554747u /* "GGUF" */ || g_rd(&c, 4) != 3)
        goto fail;
    g->n_tensors = g_rd(&c, 8);
    uint64_t n_kv = g_rd(&c, 8);
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv && c.ok; i++) {
        uint64_t klen = g_rd(&c, 8);
        size_t kpos = c.off;
        g_skip(&c, klen);
        uint32_t type = (uint32_t)g_rd(&c, 4);
        if (c.ok && type == 4 && klen == 17 &&
            memcmp(g->buf + kpos, "general.alignment", 17) == 0) {
            alignment = g_rd(&c, 4);
            continue;
        }
        g_skip_value(&c, type, 0);
    }
    if (!c.ok || g->n_tensors > 100000 || alignment == 0)
        goto fail;
    g->t = calloc((size_t)g->n_tensors + 1, sizeof *g->t);
    if (!g->t)
        goto fail;
    for (uint64_t i = 0; i < g->n_tensors && c.ok; i++) {
        gtensor *t = &g->t[i];
        uint64_t nlen = g_rd(&c, 8);
        if (nlen >= sizeof t->name || nlen > c.n - c.off) {
            c.ok = 0;
            break;
        }
        memcpy(t->name, g->buf + c.off, (size_t)nlen);
        g_skip(&c, nlen);
        t->n_dims = (uint32_t)g_rd(&c, 4);
        if (t->n_dims > 4) {
            c.ok = 0;
            break;
        }
        for (uint32_t d = 0; d < 4; d++)
            t->dims[d] = d < t->n_dims ? g_rd(&c, 8) : 1;
        t->type = (uint32_t)g_rd(&c, 4);
        t->offset = g_rd(&c, 8);
    }
    if (!c.ok)
        goto fail;
    g->data_off = (size_t)((c.off + alignment - 1) / alignment * alignment);
    return 1;
fail_file:
    fclose(f);
fail:
    gfile_free(g);
    return 0;
}

static const gtensor *gfile_find(const gfile *g, const char *name)
{
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        if (strcmp(g->t[i].name, name) == 0)
            return &g->t[i];
    }
    return NULL;
}

/* Dequantizes the first n_rows rows of a tensor into out; 0 on failure. */
static int gfile_rows(const gfile *g, const gtensor *t, uint64_t n_rows, float *out)
{
    const rb_type_traits *tr = rb_type_get_traits(t->type);
    if (!tr || !tr->dequantize_row || n_rows > t->dims[1])
        return 0;
    uint64_t row_bytes = rb_type_row_bytes(t->type, t->dims[0]);
    if (row_bytes == 0 || t->offset > g->size - g->data_off ||
        row_bytes * n_rows > g->size - g->data_off - t->offset)
        return 0;
    const uint8_t *p = g->buf + g->data_off + t->offset;
    for (uint64_t r = 0; r < n_rows; r++)
        tr->dequantize_row(p + r * row_bytes, out + r * t->dims[0], (int64_t)t->dims[0]);
    return 1;
}

typedef struct {
    const char *file;   /* quantized file, under REBOUND_MODELS_DIR */
    const char *tensor;
    uint32_t type;      /* the type llama-quantize chose for it */
    uint64_t max_rows;
    double max_mad;     /* bound on mean |quantized - F16| */
} parity_case;

static void compare_tensor(const gfile *f16, const gfile *gq, const char *file,
                           const char *name, uint32_t want_type,
                           uint64_t max_rows, double max_mad)
{
    const gtensor *a = gfile_find(f16, name), *b = gfile_find(gq, name);
    CHECK(a != NULL && b != NULL);
    if (!a || !b)
        return;
    CHECK_EQ_INT(a->type, RB_TYPE_F16);
    if (want_type != UINT32_MAX)
        CHECK_STR_EQ(rb_type_name(b->type), rb_type_name(want_type));
    CHECK(a->dims[0] == b->dims[0] && a->dims[1] == b->dims[1]);
    uint64_t rows = a->dims[1] < max_rows ? a->dims[1] : max_rows;
    uint64_t n = rows * a->dims[0];
    float *ya = malloc(n * sizeof *ya), *yb = malloc(n * sizeof *yb);
    CHECK(ya && yb);
    if (ya && yb && gfile_rows(f16, a, rows, ya) && gfile_rows(gq, b, rows, yb)) {
        double mad = 0, ss = 0, mx = 0;
        for (uint64_t i = 0; i < n; i++) {
            double e = fabs((double)ya[i] - yb[i]);
            mad += e;
            mx = e > mx ? e : mx;
            ss += (double)ya[i] * ya[i];
        }
        mad /= (double)n;
        fprintf(stderr, "  %-18s %-24s %-5s %6" PRIu64 " x %-5" PRIu64
                " mean|d| %.6f max|d| %.5f (ref rms %.4f, bound %.3g)\n",
                file, name, rb_type_name(b->type), rows, a->dims[0], mad, mx,
                sqrt(ss / (double)n), max_mad);
        CHECK(mad <= max_mad);
        CHECK(sqrt(ss / (double)n) > 0.05); /* the reference is not all zero */
    } else {
        CHECK(!"could not read tensor rows");
    }
    free(ya);
    free(yb);
}

/*
 * Quantizes the F16 weights of a tensor with our quantizer and compares with
 * llama-quantize's bytes for the same tensor. llama-quantize worked from the
 * f32 originals, not from this F16 file, so byte identity is not expected
 * even where the arithmetic is ggml's (Q4_0, Q8_0): codes then differ only
 * at rounding ties (by 1) and d by at most 1 fp16 ulp, which is checked.
 * For every type the mean error of ours against F16 is printed beside
 * llama.cpp's and must not be worse by more than 5%.
 */
static void requantize_tensor(const gfile *f16, const gfile *gq, const char *name)
{
    const gtensor *a = gfile_find(f16, name), *b = gfile_find(gq, name);
    CHECK(a != NULL && b != NULL);
    if (!a || !b)
        return;
    const rb_type_traits *tr = rb_type_get_traits(b->type);
    uint64_t n = a->dims[0] * a->dims[1];
    uint64_t nb = rb_type_row_bytes(b->type, n);
    float *x = malloc(n * sizeof *x), *yo = malloc(n * sizeof *yo);
    float *yr = malloc(n * sizeof *yr);
    uint8_t *q = malloc(nb);
    if (x && yo && yr && q && tr && tr->quantize_row &&
        gfile_rows(f16, a, a->dims[1], x) && gfile_rows(gq, b, b->dims[1], yr)) {
        tr->quantize_row(x, q, (int64_t)n);
        tr->dequantize_row(q, yo, (int64_t)n);
        const uint8_t *ref = gq->buf + gq->data_off + b->offset;
        uint64_t diff = 0;
        for (uint64_t i = 0; i < nb; i++)
            diff += q[i] != ref[i];
        double mad_ours = 0, mad_ref = 0;
        for (uint64_t i = 0; i < n; i++) {
            mad_ours += fabs((double)yo[i] - x[i]);
            mad_ref += fabs((double)yr[i] - x[i]);
        }
        mad_ours /= (double)n;
        mad_ref /= (double)n;
        fprintf(stderr, "  requantize %-22s %-5s: mean|d| ours %.6f llama.cpp "
                "%.6f; %" PRIu64 " of %" PRIu64 " bytes differ\n", name,
                tr->name, mad_ours, mad_ref, diff, nb);
        CHECK(mad_ours <= 1.05 * mad_ref);

        int far = 0; /* d more than 1 ulp apart, or a code more than 1 */
        if (b->type == RB_TYPE_Q8_0) {
            const rb_block_q8_0 *o = (const void *)q, *r = (const void *)ref;
            for (uint64_t i = 0; i < n / 32; i++) {
                far += abs((int)o[i].d - (int)r[i].d) > 1;
                for (int j = 0; j < 32; j++)
                    far += abs(o[i].qs[j] - r[i].qs[j]) > 1;
            }
            CHECK_EQ_INT(far, 0);
        } else if (b->type == RB_TYPE_Q4_0) {
            /* A block whose f16 values hold +v and -v as the extremes is a
             * tie that the f32 originals broke the other way: d flips sign
             * and every code mirrors. Allowed, but must stay rare. */
            const rb_block_q4_0 *o = (const void *)q, *r = (const void *)ref;
            int flips = 0;
            for (uint64_t i = 0; i < n / 32; i++) {
                if ((o[i].d ^ r[i].d) & 0x8000) {
                    flips++;
                    far += abs((o[i].d & 0x7fff) - (r[i].d & 0x7fff)) > 1;
                    continue;
                }
                far += abs((int)o[i].d - (int)r[i].d) > 1;
                for (int j = 0; j < 16; j++) {
                    far += abs((o[i].qs[j] & 15) - (r[i].qs[j] & 15)) > 1;
                    far += abs((o[i].qs[j] >> 4) - (r[i].qs[j] >> 4)) > 1;
                }
            }
            CHECK_EQ_INT(far, 0);
            CHECK((uint64_t)flips <= n / 32 / 100);
        }
    } else {
        CHECK(!"could not requantize tensor");
    }
    free(x);
    free(yo);
    free(yr);
    free(q);
}

static int test_llama_files(void)
{
    static const char *const dir = REBOUND_MODELS_DIR;
    char path[1024];
    snprintf(path, sizeof path, "%s/parity-Q4_K_M.gguf", dir);
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        fprintf(stderr, "skip llama.cpp cross-check: %s not found\n", path);
        return 0;
    }
    fclose(probe);

    gfile f16;
    snprintf(path, sizeof path, "%s/parity-F16.gguf", dir);
    CHECK(gfile_load(&f16, path));
    if (!f16.buf)
        return 1;

    static const parity_case cases[] = {
        {"parity-Q4_K_M.gguf", "blk.0.ffn_gate.weight", RB_TYPE_Q4_K, 768, 0.01},
        {"parity-Q4_K_M.gguf", "blk.1.attn_q.weight", RB_TYPE_Q4_K, 256, 0.01},
        {"parity-Q4_K_M.gguf", "token_embd.weight", RB_TYPE_Q6_K, 512, 0.003},
        {"parity-Q4_0.gguf", "token_embd.weight", RB_TYPE_Q6_K, 512, 0.003},
        {"parity-Q4_0.gguf", "blk.0.attn_q.weight", RB_TYPE_Q4_0, 256, 0.01},
        {"parity-Q4_0.gguf", "blk.1.ffn_up.weight", RB_TYPE_Q4_0, 768, 0.01},
        {"parity-Q8_0.gguf", "blk.0.attn_q.weight", RB_TYPE_Q8_0, 256, 0.001},
        {"parity-Q8_0.gguf", "blk.1.ffn_down.weight", RB_TYPE_Q8_0, 256, 0.001},
    };
    const char *loaded = NULL;
    gfile gq = {0};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (!loaded || strcmp(loaded, cases[i].file) != 0) {
            gfile_free(&gq);
            snprintf(path, sizeof path, "%s/%s", dir, cases[i].file);
            CHECK(gfile_load(&gq, path));
            loaded = cases[i].file;
        }
        if (gq.buf)
            compare_tensor(&f16, &gq, cases[i].file, cases[i].tensor,
                           cases[i].type, cases[i].max_rows, cases[i].max_mad);
    }

    static const struct {
        const char *file, *tensor;
    } requant[] = {
        {"parity-Q8_0.gguf", "blk.0.attn_k.weight"},     /* Q8_0 */
        {"parity-Q8_0.gguf", "blk.1.ffn_up.weight"},
        {"parity-Q4_0.gguf", "blk.0.attn_k.weight"},     /* Q4_0 */
        {"parity-Q4_0.gguf", "blk.1.ffn_gate.weight"},
        {"parity-Q4_K_M.gguf", "blk.0.attn_k.weight"},   /* Q4_K */
        {"parity-Q4_K_M.gguf", "blk.0.ffn_down.weight"},
        {"parity-Q4_K_M.gguf", "blk.1.ffn_down.weight"}, /* Q6_K */
        {"parity-Q4_K_M.gguf", "token_embd.weight"},
    };
    for (size_t i = 0; i < sizeof requant / sizeof requant[0]; i++) {
        if (!loaded || strcmp(loaded, requant[i].file) != 0) {
            gfile_free(&gq);
            snprintf(path, sizeof path, "%s/%s", dir, requant[i].file);
            CHECK(gfile_load(&gq, path));
            loaded = requant[i].file;
        }
        if (gq.buf)
            requantize_tensor(&f16, &gq, requant[i].tensor);
    }

    /* every other 2-D tensor of the Q4_K_M file whose type we can read */
    gfile_free(&gq);
    snprintf(path, sizeof path, "%s/parity-Q4_K_M.gguf", dir);
    CHECK(gfile_load(&gq, path));
    for (uint64_t i = 0; gq.buf && i < gq.n_tensors; i++) {
        const gtensor *t = &gq.t[i];
        double bound = t->type == RB_TYPE_Q4_K ? 0.01
                     : t->type == RB_TYPE_Q5_K ? 0.006
                     : t->type == RB_TYPE_Q6_K ? 0.003 : -1;
        if (t->n_dims == 2 && bound > 0)
            compare_tensor(&f16, &gq, "parity-Q4_K_M.gguf", t->name,
                           UINT32_MAX, 256, bound);
    }
    gfile_free(&gq);
    gfile_free(&f16);
    return 1;
}
#endif

int main(void)
{
    test_traits();
    test_row_bytes();
    test_fp16();
    test_bf16();
    test_q4_0_q5_0_bytes();
    test_k_layouts();
    test_round_trips();
    test_idempotence();
#ifdef REBOUND_MODELS_DIR
    test_llama_files();
#endif
    return check_report();
}
