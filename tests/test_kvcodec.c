/*
 * test_kvcodec.c - the KV codec (src/kvcodec*.c): frames, checksum, the
 * lossless and the lossy codecs, every bad-frame case, kernels against
 * their _ref.
 *
 * Evidence:
 *   1. hand-computed facts: frame bounds for a tinyllama-shaped page, the
 *      entropy bound of a 4-token page worked out on paper, the Q8 group
 *      of a known ramp;
 *   2. round trips: lossless bit-exact on all 65536 halves (Inf, NaN,
 *      subnormals, -0) and on structured pages (per-channel scales as in
 *      real keys) for many geometries incl. odd head dims, 1 token and
 *      heads of more than one 128-channel cluster chunk;
 *      lossy within each group's step / 2 (+ the f16 rounding of the
 *      output);
 *   3. agreement: the dispatched kernels (AVX2 on x86-64, NEON on aarch64,
 *      where the CPU runs them: under qemu-user in CI) give the same
 *      frames, pages and hashes as the _ref kernels;
 *   4. bad input: truncation at every length, each header field, checksum,
 *      other dims, payload sizes, the lossless payload version, and 3000
 *      random corruptions, decoded
 *      between guard zones that must stay untouched;
 *   5. a frame of lossless payload version 2 written by the encoder before
 *      version 3 (test_kvcodec_v2.h) still decodes, on every tier.
 */
#include "cpu.h"
#include "kvcodec.h"

#include <stdlib.h>

#include "check.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double rng_normal(void)
{
    double u = ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
    double v = ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* A page that looks like real KV: K channels with their own scale (a few
 * outliers, ~x20) and sign bias, V per-token scales; in f16. */
static void fill_structured(const rb_kvcodec_dims *d, rb_f16 *page)
{
    size_t i = 0;
    for (uint32_t h = 0; h < d->n_kv_heads; h++) {
        float scale[RB_KVCODEC_MAX_HEAD_DIM], bias[RB_KVCODEC_MAX_HEAD_DIM];
        for (uint32_t c = 0; c < d->head_dim_k; c++) {
            scale[c] = (float)(0.5 + (rng_next() % 16 == 0 ? 20.0 : 2.0) * (rng_next() % 1000) / 1000.0);
            bias[c] = (float)(rng_normal() * scale[c]);
        }
        for (uint32_t t = 0; t < d->n_tokens; t++)
            for (uint32_t c = 0; c < d->head_dim_k; c++)
                page[i++] = rb_fp32_to_fp16(bias[c] + scale[c] * (float)rng_normal());
    }
    for (uint32_t h = 0; h < d->n_kv_heads; h++)
        for (uint32_t t = 0; t < d->n_tokens; t++) {
            float s = (float)(0.05 + (rng_next() % 1000) / 1000.0);
            for (uint32_t c = 0; c < d->head_dim_v; c++)
                page[i++] = rb_fp32_to_fp16(s * (float)rng_normal());
        }
}

static rb_kvcodec_dims dims4(uint32_t p, uint32_t h, uint32_t k, uint32_t v)
{
    rb_kvcodec_dims d = {p, h, k, v};
    return d;
}

/* ---- 1. facts ------------------------------------------------------------------ */

static void test_names_and_bounds(void)
{
    CHECK_STR_EQ(rb_kvcodec_name(RB_KVCODEC_Q8), "q8");
    CHECK_EQ_INT(rb_kvcodec_from_name("lossless"), RB_KVCODEC_LOSSLESS);
    CHECK_EQ_INT(rb_kvcodec_from_name("4bit"), RB_KVCODEC_Q4);
    CHECK_EQ_INT(rb_kvcodec_from_name("zstd"), -1);

    /* tinyllama page: 256 tokens x 4 heads x 64/64 dims = 256 KiB */
    rb_kvcodec_dims d = dims4(256, 4, 64, 64);
    CHECK_EQ_U64(rb_kvcodec_page_bytes(&d), 262144);
    /* Q8 K per head: 4 blocks x (64 mins + 64 steps) x 2 B + 256 rows x 64 B
     * = 1024 + 16384; V per head: 256 rows x (4 + 64) = 17408; x 4 heads */
    CHECK_EQ_U64(rb_kvcodec_bound(&d, RB_KVCODEC_Q8), 48 + 4 * (17408 + 17408));
    /* Q4: K 1024 + 256 x 32; V 256 x (4 + 32) */
    CHECK_EQ_U64(rb_kvcodec_bound(&d, RB_KVCODEC_Q4), 48 + 4 * (1024 + 8192 + 9216));
    CHECK_EQ_U64(rb_kvcodec_bound(&d, RB_KVCODEC_Q2), 48 + 4 * (1024 + 4096 + 5120));
    CHECK_EQ_U64(rb_kvcodec_bound(&d, RB_KVCODEC_LOSSLESS), 48 + 262144);
    CHECK_EQ_U64(rb_kvcodec_bound(&d, RB_KVCODEC_STORE), 48 + 262144);
    double q8_ratio = 262144.0 / (double)rb_kvcodec_bound(&d, RB_KVCODEC_Q8);
    double q4_ratio = 262144.0 / (double)rb_kvcodec_bound(&d, RB_KVCODEC_Q4);
    CHECK(q8_ratio >= 1.88); /* the codec's targets, met by the layout itself */
    CHECK(q4_ratio >= 3.5);
    /* odd dims: 4-bit row of 67 = 2 chunks of 32 (32 B) + 3 values (2 B) */
    rb_kvcodec_dims o = dims4(1, 1, 67, 67);
    CHECK_EQ_U64(rb_kvcodec_bound(&o, RB_KVCODEC_Q4), 48 + (4 * 67 + 34) + (2 * 4 + 34));

    rb_error err;
    rb_kvcodec_dims bad = dims4(0, 4, 64, 64);
    CHECK_EQ_INT(rb_kvcodec_check_dims(&bad, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "n_tokens is 0");
    bad = dims4(256, 4, 2000, 64);
    CHECK_EQ_INT(rb_kvcodec_check_dims(&bad, &err), RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "head_dim_k");
    CHECK_EQ_U64(rb_kvcodec_bound(&bad, RB_KVCODEC_Q8), 0);
    CHECK_EQ_U64(rb_kvcodec_bound(&d, (rb_kvcodec_id)9), 0);
}

static void test_entropy_hand(void)
{
    /* 4 tokens, 1 head, 1 K and 1 V channel. K: 1.0, 1.5 (same sign and
     * exponent: 0x3c00, 0x3e00 -> symbol 15), -2.0, -3.0 (0xc000, 0xc200 ->
     * symbol 48): two symbols twice each, H = 1 bit -> 4 bits. V: all 0.5
     * (symbol 14): H = 0. Bound = 4 + 8 x 10 = 84 bits = 10.5 bytes for a
     * 16-byte page: ratio 16 / 10.5. */
    rb_kvcodec_dims d = dims4(4, 1, 1, 1);
    rb_f16 page[8] = {0x3c00, 0x3e00, 0xc000, 0xc200, 0x3800, 0x3800, 0x3800, 0x3800};
    rb_kvcodec_entropy_info e;
    CHECK_EQ_INT(rb_kvcodec_entropy(&d, page, &e, NULL), RB_OK);
    CHECK_EQ_U64(e.n_values, 8);
    CHECK_NEAR(e.sign_exp_bits, 4.0, 1e-12);
    CHECK_NEAR(e.mantissa_bits, 80.0, 1e-12);
    CHECK_NEAR(e.bound_bytes, 10.5, 1e-12);
    CHECK_NEAR(e.bound_ratio, 16.0 / 10.5, 1e-12);
    /* a uniform channel over 4 symbols costs 2 bits a value */
    rb_f16 p2[8] = {0x3c00, 0x4000, 0x4400, 0x4800, 0, 0, 0, 0};
    CHECK_EQ_INT(rb_kvcodec_entropy(&d, p2, &e, NULL), RB_OK);
    CHECK_NEAR(e.sign_exp_bits, 8.0, 1e-12);
}

/* ---- hash ------------------------------------------------------------------------ */

/* The vector kernels of this build (kvcodec.h) and the tier that runs them */
#if defined(__x86_64__)
#define KV_VEC(name) name##_avx2
#define KV_VEC_TIER RB_CPU_TIER_AVX2
/* and the avx512 ones (kvcodec_avx512.c), checked the same way */
#define KV_VEC512(name) name##_avx512
#elif defined(__aarch64__)
#define KV_VEC(name) name##_neon
#define KV_VEC_TIER RB_CPU_TIER_NEON
#endif

static void test_hash(void)
{
    enum { N = 5000 };
    uint8_t *buf = malloc(N);
    for (int i = 0; i < N; i++)
        buf[i] = (uint8_t)rng_next();
    const uint64_t whole = rb_kvcodec_hash64(buf, N);
    /* split anywhere, in any number of pieces: same value */
    for (int trial = 0; trial < 50; trial++) {
        rb_kvcodec_hash h;
        rb_kvcodec_hash_init(&h);
        size_t at = 0;
        while (at < N) {
            size_t k = rng_next() % 700;
            k = k > N - at ? N - at : k;
            rb_kvcodec_hash_update(&h, buf + at, k);
            at += k;
        }
        CHECK_EQ_U64(rb_kvcodec_hash_final(&h), whole);
    }
    /* every length from 0 to 200 differs from its neighbours, one bit flips it */
    for (size_t n = 1; n <= 200; n++)
        CHECK(rb_kvcodec_hash64(buf, n) != rb_kvcodec_hash64(buf, n - 1));
    buf[4321] ^= 0x10;
    CHECK(rb_kvcodec_hash64(buf, N) != whole);
    buf[4321] ^= 0x10;
    /* two 512-byte blocks swapped: order matters */
    uint8_t *sw = malloc(N);
    memcpy(sw, buf, N);
    memcpy(sw, buf + 512, 512);
    memcpy(sw + 512, buf, 512);
    CHECK(rb_kvcodec_hash64(sw, N) != whole);
    /* two stripes swapped inside a block */
    memcpy(sw, buf, N);
    memcpy(sw, buf + 64, 32);
    memcpy(sw + 64, buf, 32);
    CHECK(rb_kvcodec_hash64(sw, N) != whole);
#ifdef KV_VEC
    for (uint64_t first = 0; first < 40 && rb_cpu_tier_available(KV_VEC_TIER); first += 7) {
        uint64_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
        rb_kvcodec_hash_stripes_ref(a, first, buf, N / 32);
        KV_VEC(rb_kvcodec_hash_stripes)(b, first, buf, N / 32);
        CHECK(!memcmp(a, b, sizeof a));
    }
#endif
#ifdef KV_VEC512
    /* every start parity and count parity, scrambles inside and at the ends */
    for (uint64_t first = 0; first < 40 && rb_cpu_tier_available(RB_CPU_TIER_AVX512); first++)
        for (size_t count = 0; count <= N / 32; count += 1 + count / 3) {
            uint64_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4};
            rb_kvcodec_hash_stripes_ref(a, first, buf, count);
            KV_VEC512(rb_kvcodec_hash_stripes)(b, first, buf, count);
            CHECK(!memcmp(a, b, sizeof a));
        }
#endif
    free(sw);
    free(buf);
}

/* ---- kernels against _ref ------------------------------------------------------------ */

typedef void (*dequant_fn)(const uint8_t *, size_t, int, const float *, const float *, int,
                           rb_f16 *);
typedef void (*merge_fn)(rb_f16 *, const rb_f16 *, const uint8_t *, const uint8_t *, size_t,
                         rb_kvcodec_hash *);

/* One tier's dequant and merge against _ref: every payload width, both
 * group layouts, sizes 1..N (odd ones, tails), the hash in and out of
 * step with the merge. */
static void kernels_agree(const char *name, dequant_fn dequant, merge_fn merge)
{
    enum { N = 300 };
    uint8_t q[N];
    float m[N], s[N];
    rb_f16 a[N], b[N];
    int bad = 0;
    for (int trial = 0; trial < 600; trial++) {
        size_t n = trial < 300 ? (size_t)trial + 1 : 1 + rng_next() % N;
        int bits = trial % 3 == 0 ? 8 : trial % 3 == 1 ? 4 : 2;
        int per_elem = (int)(rng_next() & 1);
        for (int i = 0; i < N; i++) {
            q[i] = (uint8_t)rng_next();
            m[i] = (float)rng_normal() * 4;
            s[i] = (float)fabs(rng_normal()) * 0.1f;
        }
        rb_kvcodec_dequant_ref(q, n, bits, m, s, per_elem, a);
        dequant(q, n, bits, m, s, per_elem, b);
        bad += memcmp(a, b, n * sizeof *a) != 0;
    }
    CHECK_EQ_INT(bad, 0);
    if (bad)
        fprintf(stderr, "  %s dequant differs from _ref in %d trials\n", name, bad);
    bad = 0;
    for (int trial = 0; trial < 400; trial++) {
        size_t n = trial < 200 ? (size_t)trial + 1 : 1 + rng_next() % N;
        uint8_t lo[N], hi[N];
        for (int i = 0; i < N; i++) {
            lo[i] = (uint8_t)rng_next();
            hi[i] = (uint8_t)rng_next();
            a[i] = b[i] = (rb_f16)(rng_next() & 0xfc00);
        }
        rb_kvcodec_hash ha, hb;
        rb_kvcodec_hash_init(&ha);
        rb_kvcodec_hash_init(&hb);
        /* the hash mid-stripe (the vector merges cannot absorb in
         * registers), one stripe in (odd: the avx512 merge's pairs do not
         * line up), or at the start */
        const size_t pre = trial % 3 == 0 ? 0 : trial % 3 == 1 ? 5 : 32;
        rb_kvcodec_hash_update(&ha, lo, pre);
        rb_kvcodec_hash_update(&hb, lo, pre);
        /* in place, or from a separate buffer of entries (the decoder's
         * scratch) whose low 10 bits must be ignored */
        rb_f16 top[N];
        for (int i = 0; i < N; i++)
            top[i] = (rb_f16)(a[i] | (rng_next() & 0x3ff));
        const int apart = trial % 4 >= 2;
        rb_kvcodec_merge_ref(a, apart ? top : a, lo, hi, n, &ha);
        merge(b, apart ? top : b, lo, hi, n, &hb);
        bad += memcmp(a, b, n * sizeof *a) != 0 ||
               rb_kvcodec_hash_final(&ha) != rb_kvcodec_hash_final(&hb);
    }
    CHECK_EQ_INT(bad, 0);
    if (bad)
        fprintf(stderr, "  %s merge differs from _ref in %d trials\n", name, bad);
}

static void test_kernels_agree(void)
{
#ifdef KV_VEC
    if (!rb_cpu_tier_available(KV_VEC_TIER)) {
        printf("note: this CPU cannot run the %s kernels; kernel agreement not tested\n",
               rb_cpu_tier_name(KV_VEC_TIER));
        return;
    }
    kernels_agree(rb_cpu_tier_name(KV_VEC_TIER), KV_VEC(rb_kvcodec_dequant),
                  KV_VEC(rb_kvcodec_merge));
#else
    printf("note: no vector kernels in this build; kernel agreement not tested\n");
#endif
#ifdef KV_VEC512
    if (!rb_cpu_tier_available(RB_CPU_TIER_AVX512)) {
        printf("note: this CPU cannot run the avx512 kernels; their agreement not tested\n");
        return;
    }
    kernels_agree("avx512", KV_VEC512(rb_kvcodec_dequant), KV_VEC512(rb_kvcodec_merge));
    /* the fused dequant + hash: rows of 32..320 values (multiples of 32:
     * from the registers; others: the two-step fallback), the hash at an
     * even, odd or mid stripe */
    int bad = 0;
    for (int trial = 0; trial < 300; trial++) {
        enum { M = 320 };
        uint8_t q[M];
        float m[M], s[M];
        rb_f16 a[M], b[M];
        const size_t n = trial % 5 == 4 ? 1 + rng_next() % M : 32 * (1 + rng_next() % 10);
        const int bits = trial % 3 == 0 ? 8 : trial % 3 == 1 ? 4 : 2, per_elem = trial & 1;
        for (int i = 0; i < M; i++) {
            q[i] = (uint8_t)rng_next();
            m[i] = (float)rng_normal() * 4;
            s[i] = (float)fabs(rng_normal()) * 0.1f;
        }
        rb_kvcodec_hash ha, hb;
        rb_kvcodec_hash_init(&ha);
        rb_kvcodec_hash_init(&hb);
        const size_t pre = (size_t)(trial / 3 % 4) * 32 + (trial % 7 == 0 ? 5 : 0);
        rb_kvcodec_hash_update(&ha, q, pre);
        rb_kvcodec_hash_update(&hb, q, pre);
        for (int rep = 0; rep < 3; rep++) { /* several rows: the state carries over */
            rb_kvcodec_dequant_ref(q, n, bits, m, s, per_elem, a);
            rb_kvcodec_hash_update(&ha, a, 2 * n);
            KV_VEC512(rb_kvcodec_dequant_absorb)(q, n, bits, m, s, per_elem, b, &hb);
            bad += memcmp(a, b, n * sizeof *a) != 0;
        }
        bad += rb_kvcodec_hash_final(&ha) != rb_kvcodec_hash_final(&hb);
    }
    CHECK_EQ_INT(bad, 0);
    if (bad)
        fprintf(stderr, "  avx512 dequant_absorb differs from _ref in %d rows or hashes\n", bad);
#endif
}

/* ---- 2. round trips ------------------------------------------------------------------ */

/* Encodes with both kernel sets (frames must be identical), decodes with
 * both (pages identical); returns the frame size, the page in out. */
static size_t round_trip(const rb_kvcodec_dims *d, rb_kvcodec_id codec, const rb_f16 *page,
                         rb_f16 *out, rb_kvcodec_id *used)
{
    const size_t cap = (size_t)rb_kvcodec_bound(d, codec), n = (size_t)rb_kvcodec_page_elems(d);
    uint8_t *f1 = malloc(cap), *f2 = malloc(cap);
    rb_f16 *o2 = malloc(2 * n);
    size_t n1 = 0, n2 = 0;
    rb_error err;
    rb_status st = rb_kvcodec_encode(d, codec, page, f1, cap, &n1, &err);
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK)
        fprintf(stderr, "  %s\n", err.message);
    CHECK_EQ_INT(rb_kvcodec_encode_ref(d, codec, page, f2, cap, &n2, NULL), RB_OK);
    CHECK_EQ_U64(n1, n2);
    CHECK(n1 == n2 && !memcmp(f1, f2, n1));
    st = rb_kvcodec_decode(d, f1, n1, out, n, &err);
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK)
        fprintf(stderr, "  %s\n", err.message);
    CHECK_EQ_INT(rb_kvcodec_decode_ref(d, f1, n1, o2, n, NULL), RB_OK);
    CHECK(!memcmp(out, o2, 2 * n));
    rb_kvcodec_frame_info fi;
    CHECK_EQ_INT(rb_kvcodec_frame_info_get(f1, n1, &fi, NULL), RB_OK);
    CHECK_EQ_U64(fi.frame_bytes, n1);
    if (used)
        *used = fi.codec;
    free(f1);
    free(f2);
    free(o2);
    return n1;
}

static void test_lossless(void)
{
    /* every half, Inf, NaN, subnormals and -0 included, in a shuffled order
     * (random: incompressible, so the frame falls back to STORE) */
    rb_kvcodec_dims d = dims4(256, 2, 64, 64);
    size_t n = (size_t)rb_kvcodec_page_elems(&d);
    CHECK_EQ_U64(n, 65536);
    rb_f16 *page = malloc(2 * n), *out = malloc(2 * n);
    for (size_t i = 0; i < n; i++)
        page[i] = (rb_f16)i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = rng_next() % (i + 1);
        rb_f16 t = page[i];
        page[i] = page[j];
        page[j] = t;
    }
    rb_kvcodec_id used;
    round_trip(&d, RB_KVCODEC_LOSSLESS, page, out, &used);
    CHECK(!memcmp(page, out, 2 * n));
    CHECK_EQ_INT(used, RB_KVCODEC_STORE);
    /* the same halves in order: each channel then sees a narrow exponent
     * range, so it compresses and still round-trips */
    for (size_t i = 0; i < n; i++)
        page[i] = (rb_f16)i;
    size_t sz = round_trip(&d, RB_KVCODEC_LOSSLESS, page, out, &used);
    CHECK(!memcmp(page, out, 2 * n));
    CHECK_EQ_INT(used, RB_KVCODEC_LOSSLESS);
    CHECK(sz < 2 * n);
    /* special values sprinkled into a structured page */
    fill_structured(&d, page);
    const rb_f16 specials[] = {0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x0001, 0x8001, 0x03ff, 0x8000, 0};
    for (int i = 0; i < 200; i++)
        page[rng_next() % n] = specials[i % 9];
    round_trip(&d, RB_KVCODEC_LOSSLESS, page, out, &used);
    CHECK(!memcmp(page, out, 2 * n));
    CHECK_EQ_INT(used, RB_KVCODEC_LOSSLESS);
    free(page);
    free(out);

    /* geometries: odd head dims (not a multiple of 4: single-stream
     * channels), 1 token, more tokens than a page, constant pages; 71
     * tokens: the stream decoders' last partial round of 7 symbols) */
    const uint32_t geo[][4] = {{256, 4, 64, 64}, {1, 1, 1, 1},   {7, 3, 5, 3},
                               {300, 2, 67, 130}, {128, 4, 8, 8}, {64, 1, 128, 128},
                               {3, 1, 1, 2},   {40, 1, 300, 8}, {256, 1, 128, 9},
                               {71, 2, 128, 128}};
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
        rb_kvcodec_dims dg = dims4(geo[g][0], geo[g][1], geo[g][2], geo[g][3]);
        size_t ng = (size_t)rb_kvcodec_page_elems(&dg);
        rb_f16 *p = malloc(2 * ng), *o = malloc(2 * ng);
        for (int kind = 0; kind < 3; kind++) {
            if (kind == 0)
                fill_structured(&dg, p);
            for (size_t i = 0; kind == 1 && i < ng; i++)
                p[i] = 0x3c00; /* constant: every context is a single symbol */
            for (size_t i = 0; kind == 2 && i < ng; i++) /* two symbols per channel */
                p[i] = (rb_f16)((rng_next() & 1 ? 0x3c00 : 0xbc00) | (rng_next() & 0x3ff));
            round_trip(&dg, RB_KVCODEC_LOSSLESS, p, o, NULL);
            CHECK(!memcmp(p, o, 2 * ng));
        }
        free(p);
        free(o);
    }
}

/* Each decoded value within its group's step / 2, plus the f16 rounding of
 * the output (half an ulp of it) and a little float slack; 4 and 2-bit
 * groups may clip up to 2/32 of their range at each end (kvcodec_quant.c),
 * which widens their bound by that much. */
static void test_lossy(void)
{
    const uint32_t geo[][4] = {{256, 4, 64, 64}, {100, 2, 67, 130}, {1, 1, 8, 8}, {128, 4, 8, 8}};
    const rb_kvcodec_id codecs[] = {RB_KVCODEC_Q8, RB_KVCODEC_Q4, RB_KVCODEC_Q2};
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
        rb_kvcodec_dims d = dims4(geo[g][0], geo[g][1], geo[g][2], geo[g][3]);
        const size_t n = (size_t)rb_kvcodec_page_elems(&d), P = d.n_tokens;
        rb_f16 *page = malloc(2 * n), *out = malloc(2 * n);
        fill_structured(&d, page);
        for (int c = 0; c < 3; c++) {
            const int qmax = c == 0 ? 255 : c == 1 ? 15 : 3;
            const float clip = qmax == 255 ? 0 : 2 * 2.0f / 32 * 1.001f; /* x2: the bound is on step/2 */
            size_t sz = round_trip(&d, codecs[c], page, out, NULL);
            CHECK_EQ_U64(sz, rb_kvcodec_bound(&d, codecs[c]));
            int bad_k = 0, bad_v = 0;
            /* K: group = one channel over a 64-token block */
            for (uint32_t h = 0; h < d.n_kv_heads; h++)
                for (uint32_t c0 = 0; c0 < d.head_dim_k; c0++)
                    for (size_t t0 = 0; t0 < P; t0 += 64) {
                        float lo = INFINITY, hi = -INFINITY;
                        size_t t1 = t0 + 64 < P ? t0 + 64 : P;
                        for (size_t t = t0; t < t1; t++) {
                            float x = rb_fp16_to_fp32(page[(h * P + t) * d.head_dim_k + c0]);
                            lo = fminf(lo, x), hi = fmaxf(hi, x);
                        }
                        float step = (hi - lo) / qmax * 1.001f + clip * (hi - lo);
                        for (size_t t = t0; t < t1; t++) {
                            size_t i = (h * P + t) * d.head_dim_k + c0;
                            float x = rb_fp16_to_fp32(page[i]), y = rb_fp16_to_fp32(out[i]);
                            if (!(fabsf(x - y) <= step / 2 + fabsf(y) / 2048 + 1e-7f))
                                bad_k++;
                        }
                    }
            /* V: group = 64 values along one token's row */
            const rb_f16 *pv = page + d.n_kv_heads * P * d.head_dim_k;
            const rb_f16 *ov = out + d.n_kv_heads * P * d.head_dim_k;
            for (size_t r = 0; r < d.n_kv_heads * P; r++)
                for (uint32_t c0 = 0; c0 < d.head_dim_v; c0 += 64) {
                    uint32_t c1 = c0 + 64 < d.head_dim_v ? c0 + 64 : d.head_dim_v;
                    float lo = INFINITY, hi = -INFINITY;
                    for (uint32_t c1_ = c0; c1_ < c1; c1_++) {
                        float x = rb_fp16_to_fp32(pv[r * d.head_dim_v + c1_]);
                        lo = fminf(lo, x), hi = fmaxf(hi, x);
                    }
                    float step = (hi - lo) / qmax * 1.001f + clip * (hi - lo);
                    for (uint32_t cc = c0; cc < c1; cc++) {
                        float x = rb_fp16_to_fp32(pv[r * d.head_dim_v + cc]);
                        float y = rb_fp16_to_fp32(ov[r * d.head_dim_v + cc]);
                        if (!(fabsf(x - y) <= step / 2 + fabsf(y) / 2048 + 1e-7f))
                            bad_v++;
                    }
                }
            CHECK_EQ_INT(bad_k, 0);
            CHECK_EQ_INT(bad_v, 0);
        }
        free(page);
        free(out);
    }

    /* a known ramp: one V group of 64 values 0..63 with step 0.25: Q8's
     * step is 15.75 / 255 rounded up to f16, and the ends are exact */
    rb_kvcodec_dims d = dims4(1, 1, 1, 64);
    rb_f16 page[65], out[65];
    page[0] = 0;
    for (int i = 0; i < 64; i++)
        page[1 + i] = rb_fp32_to_fp16(0.25f * i);
    round_trip(&d, RB_KVCODEC_Q8, page, out, NULL);
    CHECK_EQ_INT(out[1], page[1]);
    CHECK_NEAR(rb_fp16_to_fp32(out[64]), 15.75, 15.75 / 255);
    /* a group at the top of the f16 range does not overflow to Inf */
    for (int i = 0; i < 64; i++)
        page[1 + i] = rb_fp32_to_fp16(i % 2 ? 65504.0f : -65504.0f);
    round_trip(&d, RB_KVCODEC_Q4, page, out, NULL);
    for (int i = 0; i < 64; i++)
        CHECK((out[1 + i] & 0x7c00) != 0x7c00);

    /* Inf and NaN are refused, naming where */
    rb_kvcodec_dims d2 = dims4(4, 1, 2, 2);
    rb_f16 p2[16] = {0};
    p2[5] = 0x7e00; /* K head 0, token 2, channel 1 */
    uint8_t frame[512];
    size_t nb = 0;
    rb_error err;
    CHECK_EQ_INT(rb_kvcodec_encode(&d2, RB_KVCODEC_Q8, p2, frame, sizeof frame, &nb, &err),
                 RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "K head 0 position 2 channel 1 is NaN");
    p2[5] = 0;
    p2[13] = 0xfc00;
    CHECK_EQ_INT(rb_kvcodec_encode(&d2, RB_KVCODEC_Q4, p2, frame, sizeof frame, &nb, &err),
                 RB_E_INVALID_ARG);
    CHECK_CONTAINS(err.message, "V head 0 position 2 channel 1 is Inf");
    CHECK_EQ_INT(rb_kvcodec_encode(&d2, RB_KVCODEC_LOSSLESS, p2, frame, sizeof frame, &nb, &err),
                 RB_OK);
}

/* ---- 4. bad frames ---------------------------------------------------------------------- */

static void reseal(uint8_t *f)
{
    uint32_t c = (uint32_t)rb_kvcodec_hash64(f, 40);
    for (int i = 0; i < 4; i++)
        f[40 + i] = (uint8_t)(c >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

#define GUARD 64
static rb_status guarded_decode_to(const rb_kvcodec_dims *d, const uint8_t *src, size_t n,
                                   rb_error *err, rb_f16 *copy);
#define guarded_decode(d, src, n, err) guarded_decode_to(d, src, n, err, NULL)

/* Decodes src into a page between two guard zones; the zones must come
 * back untouched whatever the result. */
static rb_status guarded_decode_to(const rb_kvcodec_dims *d, const uint8_t *src, size_t n,
                                   rb_error *err, rb_f16 *copy)
{
    const size_t elems = (size_t)rb_kvcodec_page_elems(d);
    uint8_t *buf = malloc(2 * elems + 2 * GUARD);
    memset(buf, 0xa5, 2 * elems + 2 * GUARD);
    /* an exact-size copy of the input, so ASan sees any read past it */
    uint8_t *in = malloc(n ? n : 1);
    memcpy(in, src, n);
    rb_status st = rb_kvcodec_decode(d, in, n, (rb_f16 *)(buf + GUARD), elems, err);
    int intact = 1;
    for (size_t i = 0; i < GUARD; i++)
        intact &= buf[i] == 0xa5 && buf[GUARD + 2 * elems + i] == 0xa5;
    CHECK(intact);
    if (copy)
        memcpy(copy, buf + GUARD, 2 * elems);
    free(in);
    free(buf);
    return st;
}

static void test_bad_frames(void)
{
    rb_kvcodec_dims d = dims4(70, 2, 12, 8);
    const size_t n = (size_t)rb_kvcodec_page_elems(&d);
    rb_f16 *page = malloc(2 * n), *out = malloc(2 * n);
    fill_structured(&d, page);
    rb_error err;
    const rb_kvcodec_id codecs[] = {RB_KVCODEC_LOSSLESS, RB_KVCODEC_Q8, RB_KVCODEC_Q4,
                                    RB_KVCODEC_STORE};
    for (int ci = 0; ci < 4; ci++) {
        const size_t cap = (size_t)rb_kvcodec_bound(&d, codecs[ci]);
        uint8_t *f = malloc(cap), *g = malloc(cap + 16);
        size_t fn = 0;
        CHECK_EQ_INT(rb_kvcodec_encode(&d, codecs[ci], page, f, cap, &fn, &err), RB_OK);
        rb_f16 *good = malloc(2 * n);
        CHECK_EQ_INT(guarded_decode_to(&d, f, fn, &err, good), RB_OK);

        /* truncated at every length */
        int all_fail = 1;
        for (size_t k = 0; k < fn; k++)
            all_fail &= guarded_decode(&d, f, k, &err) == RB_E_FORMAT;
        CHECK(all_fail);
        guarded_decode(&d, f, 20, &err);
        CHECK_CONTAINS(err.message, "frame truncated: 20 bytes");
        guarded_decode(&d, f, fn - 1, &err);
        CHECK_CONTAINS(err.message, "frame truncated");

        /* trailing bytes are allowed (frames in larger slots) */
        memcpy(g, f, fn);
        memset(g + fn, 0x77, 16);
        CHECK_EQ_INT(guarded_decode(&d, g, fn + 16, &err), RB_OK);

        /* magic; a corrupt header byte; version; codec; flags */
        memcpy(g, f, fn);
        g[0] = 'X';
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "not a KV frame");
        memcpy(g, f, fn);
        g[13] ^= 1;
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "header check mismatch");
        memcpy(g, f, fn);
        g[4] = 2;
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_UNSUPPORTED);
        CHECK_CONTAINS(err.message, "frame version 2");
        memcpy(g, f, fn);
        g[5] = 9;
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "unknown codec 9");
        memcpy(g, f, fn);
        g[6] = 1;
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "reserved");
        /* another codec id on the same payload */
        memcpy(g, f, fn);
        g[5] = (uint8_t)(codecs[ci] == RB_KVCODEC_Q8 ? RB_KVCODEC_Q4 : RB_KVCODEC_Q8);
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "payload of");

        /* a frame of other dims: decoded against this page's dims */
        rb_kvcodec_dims other = dims4(70, 2, 12, 9);
        CHECK_EQ_INT(rb_kvcodec_decode(&other, f, fn, out, n + 200, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "frame is for 70 tokens x 2 heads x 12/8 dims, the page is "
                                    "70 x 2 x 12/9");
        /* header dims out of the limits */
        memcpy(g, f, fn);
        g[8] = g[9] = g[10] = g[11] = 0;
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "n_tokens is 0");
        /* payload length beyond the bytes given, and a huge one */
        memcpy(g, f, fn);
        put64(g + 24, fn);
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "frame truncated");
        put64(g + 24, UINT64_MAX);
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);

        /* wrong checksum: the stored value, then a flipped payload byte */
        memcpy(g, f, fn);
        g[33] ^= 0x40;
        reseal(g);
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "checksum mismatch");
        memcpy(g, f, fn);
        g[fn - 3] ^= 0x01; /* the last bytes are mantissas / quants: decodes, wrongly */
        CHECK_EQ_INT(guarded_decode(&d, g, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "checksum mismatch");

        /* destination too small; NULL */
        CHECK_EQ_INT(rb_kvcodec_decode(&d, f, fn, out, n - 1, &err), RB_E_INVALID_ARG);
        CHECK_EQ_INT(rb_kvcodec_decode(&d, NULL, fn, out, n, &err), RB_E_INVALID_ARG);

        /* random corruption: 1-4 bytes anywhere in the payload, or a byte
         * in the header resealed; must fail (or decode to the same page:
         * a flipped padding bit) and never write outside */
        int wrong_ok = 0;
        for (int trial = 0; trial < 750; trial++) {
            memcpy(g, f, fn);
            int nflip = 1 + (int)(rng_next() % 4);
            for (int k = 0; k < nflip; k++) {
                size_t at = 48 + rng_next() % (fn - 48);
                g[at] ^= (uint8_t)(1 + rng_next() % 255);
            }
            if (trial % 5 == 0) {
                g[8 + rng_next() % 32] ^= (uint8_t)(1 + rng_next() % 255);
                reseal(g);
            }
            if (guarded_decode_to(&d, g, fn, &err, out) == RB_OK && memcmp(out, good, 2 * n))
                wrong_ok++;
        }
        CHECK_EQ_INT(wrong_ok, 0);
        free(good);
        free(f);
        free(g);
    }

    /* the lossless payload's version byte: payloads before version 2 began
     * with a head's mode byte (0 or 1), later versions are unsupported */
    {
        const size_t cap = (size_t)rb_kvcodec_bound(&d, RB_KVCODEC_LOSSLESS);
        uint8_t *f = malloc(cap);
        size_t fn = 0;
        CHECK_EQ_INT(rb_kvcodec_encode(&d, RB_KVCODEC_LOSSLESS, page, f, cap, &fn, &err), RB_OK);
        CHECK_EQ_INT(f[RB_KVCODEC_HEADER_BYTES], 3);
        f[RB_KVCODEC_HEADER_BYTES] = 0;
        CHECK_EQ_INT(guarded_decode(&d, f, fn, &err), RB_E_FORMAT);
        CHECK_CONTAINS(err.message, "lossless payload version 0, this build reads versions 2 to 3");
        f[RB_KVCODEC_HEADER_BYTES] = 4;
        CHECK_EQ_INT(guarded_decode(&d, f, fn, &err), RB_E_UNSUPPORTED);
        CHECK_CONTAINS(err.message, "lossless payload version 4");
        /* a version 3 payload read as version 2 (a stream per channel)
         * fails: the two CLUSTERED layouts are told apart by this byte */
        f[RB_KVCODEC_HEADER_BYTES] = 2;
        CHECK_EQ_INT(guarded_decode(&d, f, fn, &err), RB_E_FORMAT);
        free(f);
    }

    /* encode: destination too small */
    uint8_t small[100];
    size_t fn = 0;
    CHECK_EQ_INT(rb_kvcodec_encode(&d, RB_KVCODEC_Q8, page, small, sizeof small, &fn, &err),
                 RB_E_BUDGET);
    CHECK_CONTAINS(err.message, "destination of 100 bytes");
    CHECK_EQ_INT(rb_kvcodec_encode(&d, RB_KVCODEC_LOSSLESS, page, small, sizeof small, &fn, &err),
                 RB_E_BUDGET);
    CHECK_EQ_U64(fn, 0);
    CHECK_EQ_INT(rb_kvcodec_encode(&d, (rb_kvcodec_id)7, page, small, sizeof small, &fn, &err),
                 RB_E_INVALID_ARG);
    free(page);
    free(out);
}

/* ---- 5. frames of older payload versions ----------------------------------------- */

#include "test_kvcodec_v2.h"

/* The page of test_kvcodec_v2.h: an LCG's bits as sign, exponent and
 * mantissa (no floating point: the same bits on every platform); K
 * channel c's exponents in [6 + 7c mod 13, + c mod 4], V's in [12, 15]. */
static void kvcodec_v2_page(rb_f16 *p, size_t n, uint32_t P, uint32_t hk)
{
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        const uint32_t r = s >> 8;
        uint32_t e;
        if (i < (size_t)P * hk) {
            const uint32_t c = (uint32_t)(i % hk);
            e = 6 + (c * 7) % 13 + (r >> 12) % (1 + c % 4);
        } else {
            e = 12 + (r >> 12) % 4;
        }
        p[i] = (rb_f16)((r >> 20 & 1) << 15 | e << 10 | (r & 0x3ff));
    }
}

static void test_old_versions(void)
{
    rb_kvcodec_dims d = dims4(24, 1, 44, 16);
    const size_t n = (size_t)rb_kvcodec_page_elems(&d), fn = sizeof kvcodec_v2_frame;
    rb_f16 *page = malloc(2 * n), *out = malloc(2 * n), *o2 = malloc(2 * n);
    rb_error err;
    kvcodec_v2_page(page, n, d.n_tokens, d.head_dim_k);
    CHECK_EQ_INT(kvcodec_v2_frame[RB_KVCODEC_HEADER_BYTES], 2);
    CHECK_EQ_INT(kvcodec_v2_frame[RB_KVCODEC_HEADER_BYTES + 1], 0); /* K: CLUSTERED */
    rb_status st = rb_kvcodec_decode(&d, kvcodec_v2_frame, fn, out, n, &err);
    CHECK_EQ_INT(st, RB_OK);
    if (st != RB_OK)
        fprintf(stderr, "  %s\n", err.message);
    CHECK(!memcmp(page, out, 2 * n));
    CHECK_EQ_INT(rb_kvcodec_decode_ref(&d, kvcodec_v2_frame, fn, o2, n, NULL), RB_OK);
    CHECK(!memcmp(page, o2, 2 * n));
    /* today's encoder writes version 3 for the same page, also CLUSTERED
     * for K, and smaller (no length field or padding per channel) */
    const size_t cap = (size_t)rb_kvcodec_bound(&d, RB_KVCODEC_LOSSLESS);
    uint8_t *f = malloc(cap);
    size_t n3 = 0;
    CHECK_EQ_INT(rb_kvcodec_encode(&d, RB_KVCODEC_LOSSLESS, page, f, cap, &n3, NULL), RB_OK);
    CHECK_EQ_INT(f[RB_KVCODEC_HEADER_BYTES], 3);
    CHECK_EQ_INT(f[RB_KVCODEC_HEADER_BYTES + 1], 0);
    CHECK(n3 < fn);
    /* the old frame truncated at every length, and with one byte changed
     * anywhere in its payload: an error, never a wrong page accepted */
    uint8_t *g = malloc(fn);
    int all_fail = 1, wrong_ok = 0;
    for (size_t k = 0; k < fn; k++)
        all_fail &= guarded_decode(&d, kvcodec_v2_frame, k, &err) == RB_E_FORMAT;
    CHECK(all_fail);
    for (size_t k = RB_KVCODEC_HEADER_BYTES; k < fn; k++) {
        memcpy(g, kvcodec_v2_frame, fn);
        g[k] ^= (uint8_t)(1u << (k % 8));
        if (guarded_decode_to(&d, g, fn, &err, out) == RB_OK && memcmp(page, out, 2 * n))
            wrong_ok++;
    }
    CHECK_EQ_INT(wrong_ok, 0);
    free(g);
    free(f);
    free(page);
    free(out);
    free(o2);
}

int main(void)
{
    test_names_and_bounds();
    test_entropy_hand();
    test_hash();
    test_kernels_agree();
    /* the round trips check the dispatched set against _ref: run them under
     * every vector tier this CPU has (x86: avx512 and avx2 sets) */
    const int best = rb_cpu_tier();
    for (int tier = best; tier >= 0; tier--) {
        if (tier != best && !(tier == RB_CPU_TIER_AVX2 && rb_cpu_tier_available(tier)))
            continue;
        rb_cpu_set_tier(tier);
        printf("round trips with the %s kernels\n", rb_cpu_tier_name(tier));
        test_lossless();
        test_lossy();
        test_bad_frames();
        test_old_versions();
    }
    rb_cpu_set_tier(best);
    return check_report();
}
