/*
 * kvcodec.c - the KV codec's frame: header, checksum, validation and
 * dispatch to the payload coders (kvcodec_lossless.c and _dec.c: bit-exact;
 * kvcodec_quant.c: 8/4/2-bit groups), plus the entropy bound the lossless
 * coder is measured against.
 *
 * Does: write and check the 48-byte header drawn in kvcodec.h; hash the
 * decoded page (rb_kvcodec_hash64: a _ref, an AVX2 and a NEON form); choose
 * STORE when lossless coding would not shrink a page. Does not: decide
 * which pages to compress or when (the residency manager does), allocate,
 * or keep any state between calls; code q8_0 KV pages (the KV cache holds
 * f16 only so far: a q8_0 page would need its own codec id).
 *
 * Invariants: a frame that decodes without error reproduces exactly the
 * page whose hash its header carries; decode never reads past src_size or
 * writes past dst_elems, whatever the bytes (fuzz/fuzz_kvcodec.c).
 * Memory: none of its own; everything lives in the caller's buffers and a
 * few hundred bytes of stack.
 */
#include "kvcodec.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "kvcodec_internal.h"
#include "status.h"

#include "cpu.h"
static const char MAGIC[4] = {'R', 'B', 'K', 'V'};

/* ---- names and dims ------------------------------------------------------ */

static const char *const NAMES[RB_KVCODEC_COUNT] = {"store", "lossless", "q8", "q4", "q2"};

const char *rb_kvcodec_name(rb_kvcodec_id codec)
{
    return (unsigned)codec < RB_KVCODEC_COUNT ? NAMES[codec] : "?";
}

int rb_kvcodec_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < RB_KVCODEC_COUNT; i++)
        if (!strcmp(name, NAMES[i]))
            return i;
    if (!strcmp(name, "8bit"))
        return RB_KVCODEC_Q8;
    if (!strcmp(name, "4bit"))
        return RB_KVCODEC_Q4;
    if (!strcmp(name, "2bit"))
        return RB_KVCODEC_Q2;
    return -1;
}

static int codec_bits(rb_kvcodec_id codec)
{
    return codec == RB_KVCODEC_Q8 ? 8 : codec == RB_KVCODEC_Q4 ? 4 : codec == RB_KVCODEC_Q2 ? 2 : 0;
}

rb_status rb_kvcodec_check_dims(const rb_kvcodec_dims *d, rb_error *err)
{
    if (!d)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: dims is NULL");
    const struct { const char *name; uint32_t v, max; } f[4] = {
        {"n_tokens", d->n_tokens, 65536},
        {"n_kv_heads", d->n_kv_heads, 65536},
        {"head_dim_k", d->head_dim_k, RB_KVCODEC_MAX_HEAD_DIM},
        {"head_dim_v", d->head_dim_v, RB_KVCODEC_MAX_HEAD_DIM},
    };
    for (int i = 0; i < 4; i++)
        if (f[i].v < 1 || f[i].v > f[i].max)
            return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: %s is %" PRIu32
                                ", outside [1, %" PRIu32 "]", f[i].name, f[i].v, f[i].max);
    uint64_t n = (uint64_t)d->n_tokens * d->n_kv_heads * (d->head_dim_k + d->head_dim_v);
    if (n > (UINT64_C(1) << 32))
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: a page of %" PRIu64
                            " values exceeds the limit of 2^32", n);
    return RB_OK;
}

uint64_t rb_kvcodec_page_elems(const rb_kvcodec_dims *d)
{
    if (rb_kvcodec_check_dims(d, NULL) != RB_OK)
        return 0;
    return (uint64_t)d->n_tokens * d->n_kv_heads * (d->head_dim_k + d->head_dim_v);
}

uint64_t rb_kvcodec_page_bytes(const rb_kvcodec_dims *d) { return 2 * rb_kvcodec_page_elems(d); }

uint64_t rb_kvcodec_bound(const rb_kvcodec_dims *d, rb_kvcodec_id codec)
{
    uint64_t page = rb_kvcodec_page_bytes(d);
    if (!page || (unsigned)codec >= RB_KVCODEC_COUNT)
        return 0;
    if (codec_bits(codec))
        return RB_KVCODEC_HEADER_BYTES + rb_kvcodec_quant_payload_bytes(d, codec_bits(codec));
    /* LOSSLESS falls back to STORE rather than exceed the page */
    return RB_KVCODEC_HEADER_BYTES + page;
}

/* ---- hash ----------------------------------------------------------------- */

/* Stripe keys (16 stripes x 4 lanes), lane seeds, final keys: splitmix64
 * outputs, fixed forever (they define the checksum). */
const uint64_t rb_kvcodec_hash_keys[72] RB_KV_ALIGN32 = {
    0x3a8e4a10143dd5b5ull, 0x5091ab7149b101a7ull, 0xf6f057a8bd376b20ull, 0x304ecd0a09353634ull,
    0xf1ae3624472d1954ull, 0x59b485e8a0c553ceull, 0x9b90e0d82a508696ull, 0xa05ef05b5b238d37ull,
    0x653320331b15080bull, 0xc300e6a4757932a4ull, 0xdbe7e99b2e21311dull, 0xcb9cffc3bda37d67ull,
    0x458343ad54024771ull, 0x42d46f33d4a8c99cull, 0xee4fab5f8d8b79b5ull, 0xb3241489503c0db4ull,
    0xbb8248e6b700e751ull, 0x1df8fa8c70593ee5ull, 0x195c41865df16dc2ull, 0xf12813b526e7d77dull,
    0x83e5fd8ade31f046ull, 0x42b09d228939380full, 0x9ae84a9065d4cab6ull, 0x403c31f42e2287eeull,
    0xbbaa05c19b8fbe7dull, 0xf901c78121a31da5ull, 0xf24ddc0b8c016dd8ull, 0x6aa2b0472a6132f9ull,
    0x2e4f253b533ef307ull, 0x1294efcbb4cfa58bull, 0xc014398caad9e9efull, 0x1a67ecf47085c123ull,
    0x57fe538b04a10293ull, 0x30017e5c87dcdf28ull, 0x770dfa0af10138d6ull, 0xc1f0da02e2b6bc2aull,
    0x4d334c8ef935f1daull, 0x1dee47409e8bb226ull, 0xd8d2a45a94757a87ull, 0x3d891538c3a4abc5ull,
    0x40bba4683c7b0949ull, 0x2891bd126fed49d8ull, 0x7d6db35d8ea2e8afull, 0x1b738c9bb7399b81ull,
    0xb56402593db8ba22ull, 0x7b1b306f89a4e2b6ull, 0xd7bb90952cae60dbull, 0x524ec3fdf29391d5ull,
    0x1a676a3e45968b7bull, 0xb70fc5eebd5d7319ull, 0x14f2bf01077c7436ull, 0xd1589151650b6e94ull,
    0x5a31edddf4ec3013ull, 0xb71f1334512a9d6dull, 0x3816fb0888f5e3ccull, 0xd84c6f4215990630ull,
    0xe3d4d83234d810b6ull, 0xbeca22cf4f61fbc6ull, 0x144a101804d89c9eull, 0x38911e529faacc16ull,
    0x0ed7f1d6ff3be6e7ull, 0xeb583c3cbeaeb44aull, 0xd05fc0ad986eafbdull, 0x30823e3bf692c3baull,
    0x0f27656841bbf6b0ull, 0x68d39356a3be841bull, 0x601ea1abeba24247ull, 0x7628b636abb443a5ull,
    0x4c4f9bb0f491449aull, 0xcf83177b91b7c662ull, 0x1d5725650dcdf65bull, 0x838d481aca20e0e0ull,
};
#define KEYS rb_kvcodec_hash_keys
#define SEEDS (KEYS + 64)
#define FINAL (KEYS + 68)
#define SCRAMBLE_PRIME 0x9E3779B1u

/* Every 16th stripe: fold high bits down and multiply, so that stripes
 * reordered across 512-byte blocks change the result (the plain sums of
 * the accumulate step are order-blind). */
static inline uint64_t scramble1(uint64_t a, uint64_t key)
{
    a ^= a >> 47;
    a ^= key;
    return a * SCRAMBLE_PRIME;
}

void rb_kvcodec_hash_stripes_ref(uint64_t acc[4], uint64_t first, const uint8_t *p, size_t count)
{
    for (size_t i = 0; i < count; i++, p += 32) {
        const uint64_t idx = first + i, *k = KEYS + (idx & 15) * 4;
        uint64_t w[4], add[4];
        for (int l = 0; l < 4; l++)
            w[l] = rb_kv_load64(p + 8 * l);
        for (int l = 0; l < 4; l++) {
            uint64_t x = w[l] ^ k[l];
            add[l] = (x & 0xffffffffu) * (x >> 32) + w[l ^ 1];
        }
        for (int l = 0; l < 4; l++)
            acc[l] += add[l];
        if ((idx & 15) == 15)
            for (int l = 0; l < 4; l++)
                acc[l] = scramble1(acc[l], SEEDS[l]);
    }
}


void rb_kvcodec_hash_init(rb_kvcodec_hash *h)
{
    memset(h, 0, sizeof *h);
    for (int l = 0; l < 4; l++)
        h->acc[l] = SEEDS[l];
}

void rb_kvcodec_hash_update_k(rb_kvcodec_hash *h, const void *data, size_t n,
                              const rb_kvcodec_kernels *k)
{
    const uint8_t *p = data;
    h->total_bytes += n;
    if (h->buf_len) {
        size_t take = 32 - h->buf_len < n ? 32 - h->buf_len : n;
        memcpy(h->buf + h->buf_len, p, take);
        h->buf_len += (uint32_t)take;
        p += take, n -= take;
        if (h->buf_len < 32)
            return;
        k->hash_stripes(h->acc, h->n_stripes++, h->buf, 1);
        h->buf_len = 0;
    }
    size_t full = n / 32;
    if (full) {
        k->hash_stripes(h->acc, h->n_stripes, p, full);
        h->n_stripes += full;
    }
    memcpy(h->buf, p + full * 32, n - full * 32);
    h->buf_len = (uint32_t)(n - full * 32);
}

void rb_kvcodec_hash_update(rb_kvcodec_hash *h, const void *data, size_t n)
{
    rb_kvcodec_hash_update_k(h, data, n, rb_kvcodec_kernels_get());
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t rb_kvcodec_hash_final(const rb_kvcodec_hash *h)
{
    uint64_t acc[4];
    memcpy(acc, h->acc, sizeof acc);
    if (h->buf_len) { /* the tail as one zero-padded stripe; the length tells it apart */
        uint8_t last[32] = {0};
        memcpy(last, h->buf, h->buf_len);
        rb_kvcodec_hash_stripes_ref(acc, h->n_stripes, last, 1);
    }
    uint64_t r = h->total_bytes * 0x9E3779B97F4A7C15ull;
    for (int l = 0; l < 4; l++) {
        r ^= mix64(acc[l] + FINAL[l]);
        r = (r << 27 | r >> 37) * 0x94d049bb133111ebull;
    }
    return mix64(r);
}

uint64_t rb_kvcodec_hash64(const void *data, size_t n)
{
    rb_kvcodec_hash h;
    rb_kvcodec_hash_init(&h);
    rb_kvcodec_hash_update(&h, data, n);
    return rb_kvcodec_hash_final(&h);
}

/* ---- kernel sets -------------------------------------------------------------- */

const rb_kvcodec_kernels rb_kvcodec_kernels_ref = {
    rb_kvcodec_hash_stripes_ref, rb_kvcodec_dequant_ref, rb_kvcodec_merge_ref,
    rb_kvcodec_quant_encode, rb_kvcodec_quant_decode, rb_kvcodec_lossless_decode,
};

const rb_kvcodec_kernels *rb_kvcodec_kernels_get(void)
{
#if defined(__x86_64__)
    const int tier = rb_cpu_tier();
    if (tier == RB_CPU_TIER_AVX512)
        return &rb_kvcodec_kernels_avx512;
    if (tier >= RB_CPU_TIER_AVX2 && tier <= RB_CPU_TIER_VNNI)
        return &rb_kvcodec_kernels_avx2;
#elif defined(__aarch64__)
    const int tier = rb_cpu_tier();
    if (tier >= RB_CPU_TIER_NEON && tier <= RB_CPU_TIER_I8MM)
        return &rb_kvcodec_kernels_neon;
#endif
    return &rb_kvcodec_kernels_ref;
}

/* ---- frame ---------------------------------------------------------------------- */

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t rd64(const uint8_t *p) { return rd32(p) | (uint64_t)rd32(p + 4) << 32; }

static void write_header(uint8_t *h, rb_kvcodec_id codec, const rb_kvcodec_dims *d,
                         uint64_t payload, uint64_t checksum)
{
    memset(h, 0, RB_KVCODEC_HEADER_BYTES);
    memcpy(h, MAGIC, 4);
    h[4] = RB_KVCODEC_VERSION;
    h[5] = (uint8_t)codec;
    wr32(h + 8, d->n_tokens);
    wr32(h + 12, d->n_kv_heads);
    wr32(h + 16, d->head_dim_k);
    wr32(h + 20, d->head_dim_v);
    wr64(h + 24, payload);
    wr64(h + 32, checksum);
    wr32(h + 40, (uint32_t)rb_kvcodec_hash64(h, 40));
}

static rb_status encode_k(const rb_kvcodec_dims *d, rb_kvcodec_id codec, const rb_f16 *page,
                          void *dst, size_t dst_size, size_t *out_bytes, rb_error *err,
                          const rb_kvcodec_kernels *k)
{
    rb_status st = rb_kvcodec_check_dims(d, err);
    if (st != RB_OK)
        return st;
    if ((unsigned)codec >= RB_KVCODEC_COUNT)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: unknown codec %d", (int)codec);
    if (!page || !dst || !out_bytes)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: page, dst and out_bytes are required");
    const uint64_t page_bytes = rb_kvcodec_page_bytes(d);
    uint8_t *out = dst;
    const size_t room = dst_size > RB_KVCODEC_HEADER_BYTES ? dst_size - RB_KVCODEC_HEADER_BYTES : 0;
    const int bits = codec_bits(codec);
    uint64_t payload, checksum;
    if (bits) {
        payload = rb_kvcodec_quant_payload_bytes(d, bits);
        if (dst_size < RB_KVCODEC_HEADER_BYTES || payload > room)
            return rb_error_set(err, RB_E_BUDGET, "kvcodec: destination of %zu bytes is smaller "
                                "than the %s frame of %" PRIu64 " bytes", dst_size,
                                rb_kvcodec_name(codec), RB_KVCODEC_HEADER_BYTES + payload);
        rb_kvcodec_hash h;
        rb_kvcodec_hash_init(&h);
        st = k->quant_encode(d, bits, page, out + RB_KVCODEC_HEADER_BYTES, &h, k, err);
        if (st != RB_OK)
            return st;
        checksum = rb_kvcodec_hash_final(&h);
    } else {
        payload = 0;
        if (codec == RB_KVCODEC_LOSSLESS && room > 0)
            payload = rb_kvcodec_lossless_encode(d, page, out + RB_KVCODEC_HEADER_BYTES,
                                                 room < page_bytes ? room : (size_t)page_bytes);
        if (payload == 0) { /* STORE asked for, or lossless would not shrink the page */
            if (room < page_bytes)
                return rb_error_set(err, RB_E_BUDGET, "kvcodec: destination of %zu bytes is "
                                    "smaller than the frame (up to %" PRIu64 " bytes: "
                                    "rb_kvcodec_bound)", dst_size,
                                    RB_KVCODEC_HEADER_BYTES + page_bytes);
            codec = RB_KVCODEC_STORE;
            payload = page_bytes;
            memcpy(out + RB_KVCODEC_HEADER_BYTES, page, page_bytes);
        }
        rb_kvcodec_hash h;
        rb_kvcodec_hash_init(&h);
        rb_kvcodec_hash_update_k(&h, page, page_bytes, k);
        checksum = rb_kvcodec_hash_final(&h);
    }
    write_header(out, codec, d, payload, checksum);
    *out_bytes = (size_t)(RB_KVCODEC_HEADER_BYTES + payload);
    return RB_OK;
}

rb_status rb_kvcodec_encode(const rb_kvcodec_dims *d, rb_kvcodec_id codec, const rb_f16 *page,
                            void *dst, size_t dst_size, size_t *out_bytes, rb_error *err)
{
    return encode_k(d, codec, page, dst, dst_size, out_bytes, err, rb_kvcodec_kernels_get());
}

rb_status rb_kvcodec_encode_ref(const rb_kvcodec_dims *d, rb_kvcodec_id codec, const rb_f16 *page,
                                void *dst, size_t dst_size, size_t *out_bytes, rb_error *err)
{
    return encode_k(d, codec, page, dst, dst_size, out_bytes, err, &rb_kvcodec_kernels_ref);
}

/* Steps 1-4 of decoding: the header alone. */
static rb_status parse_header(const uint8_t *src, size_t src_size, rb_kvcodec_frame_info *fi,
                              rb_error *err)
{
    if (!src)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: src is NULL");
    /* 1. the header is there and is ours */
    if (src_size < RB_KVCODEC_HEADER_BYTES)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: frame truncated: %zu bytes, the header "
                            "alone is %d", src_size, RB_KVCODEC_HEADER_BYTES);
    if (memcmp(src, MAGIC, 4) != 0)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: not a KV frame: magic %02x %02x %02x %02x,"
                            " expected \"RBKV\"", src[0], src[1], src[2], src[3]);
    uint32_t check = (uint32_t)rb_kvcodec_hash64(src, 40);
    if (rd32(src + 40) != check)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: header check mismatch (0x%08" PRIx32
                            " stored, 0x%08" PRIx32 " computed): the header is corrupt",
                            rd32(src + 40), check);
    /* 2. a version and fields this build knows */
    if (src[4] != RB_KVCODEC_VERSION)
        return rb_error_set(err, src[4] > RB_KVCODEC_VERSION ? RB_E_UNSUPPORTED : RB_E_FORMAT,
                            "kvcodec: frame version %u, this build reads version %d", src[4],
                            RB_KVCODEC_VERSION);
    if (src[6] || src[7] || rd32(src + 44))
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: reserved header fields are not zero");
    if (src[5] >= RB_KVCODEC_COUNT)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: unknown codec %u", src[5]);
    rb_kvcodec_frame_info f;
    f.codec = (rb_kvcodec_id)src[5];
    f.dims.n_tokens = rd32(src + 8);
    f.dims.n_kv_heads = rd32(src + 12);
    f.dims.head_dim_k = rd32(src + 16);
    f.dims.head_dim_v = rd32(src + 20);
    f.payload_bytes = rd64(src + 24);
    f.checksum = rd64(src + 32);
    /* 3. dims within the limits */
    rb_error derr;
    if (rb_kvcodec_check_dims(&f.dims, &derr) != RB_OK)
        return rb_error_set(err, RB_E_FORMAT, "%s (in the frame header)", derr.message);
    /* 4. the payload is all there */
    if (f.payload_bytes > src_size - RB_KVCODEC_HEADER_BYTES)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: frame truncated: header + payload is %"
                            PRIu64 " bytes, only %zu given", f.payload_bytes +
                            RB_KVCODEC_HEADER_BYTES, src_size);
    f.frame_bytes = f.payload_bytes + RB_KVCODEC_HEADER_BYTES;
    *fi = f;
    return RB_OK;
}

rb_status rb_kvcodec_frame_info_get(const void *src, size_t src_size, rb_kvcodec_frame_info *out,
                                    rb_error *err)
{
    rb_kvcodec_frame_info f;
    rb_status st = parse_header(src, src_size, &f, err);
    if (st == RB_OK && out)
        *out = f;
    return st;
}

static rb_status decode_k(const rb_kvcodec_dims *d, const void *src_v, size_t src_size,
                          rb_f16 *page, size_t dst_elems, rb_error *err,
                          const rb_kvcodec_kernels *k)
{
    const uint8_t *src = src_v;
    rb_status st = rb_kvcodec_check_dims(d, err);
    if (st != RB_OK)
        return st;
    const uint64_t n = rb_kvcodec_page_elems(d);
    if (!page || dst_elems < n)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: destination holds %zu values, the "
                            "page has %" PRIu64, page ? dst_elems : 0, n);
    rb_kvcodec_frame_info f;
    if ((st = parse_header(src, src_size, &f, err)) != RB_OK)
        return st;
    /* 5. the frame is for this page's geometry */
    if (memcmp(&f.dims, d, sizeof *d) != 0)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: frame is for %" PRIu32 " tokens x %"
                            PRIu32 " heads x %" PRIu32 "/%" PRIu32 " dims, the page is %" PRIu32
                            " x %" PRIu32 " x %" PRIu32 "/%" PRIu32, f.dims.n_tokens,
                            f.dims.n_kv_heads, f.dims.head_dim_k, f.dims.head_dim_v, d->n_tokens,
                            d->n_kv_heads, d->head_dim_k, d->head_dim_v);
    /* 6. the payload, decoded by its codec, hashed on the way */
    const uint8_t *payload = src + RB_KVCODEC_HEADER_BYTES;
    rb_kvcodec_hash h;
    rb_kvcodec_hash_init(&h);
    const int bits = codec_bits(f.codec);
    if (f.codec == RB_KVCODEC_STORE) {
        if (f.payload_bytes != 2 * n)
            return rb_error_set(err, RB_E_FORMAT, "kvcodec: store payload of %" PRIu64 " bytes, "
                                "the page has %" PRIu64, f.payload_bytes, 2 * n);
        memcpy(page, payload, 2 * n);
        rb_kvcodec_hash_update_k(&h, page, 2 * n, k);
    } else if (bits) {
        uint64_t want = rb_kvcodec_quant_payload_bytes(d, bits);
        if (f.payload_bytes != want)
            return rb_error_set(err, RB_E_FORMAT, "kvcodec: %s payload of %" PRIu64 " bytes, "
                                "this page's is %" PRIu64, rb_kvcodec_name(f.codec),
                                f.payload_bytes, want);
        k->quant_decode(d, bits, payload, page, &h, k);
    } else {
        st = k->lossless_decode(d, payload, (size_t)f.payload_bytes, page, &h, k, err);
        if (st != RB_OK)
            return st;
    }
    /* 7. what came out is what went in */
    uint64_t got = rb_kvcodec_hash_final(&h);
    if (got != f.checksum)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: checksum mismatch: the frame says 0x%016"
                            PRIx64 ", the decoded %s page hashes to 0x%016" PRIx64, f.checksum,
                            rb_kvcodec_name(f.codec), got);
    return RB_OK;
}

rb_status rb_kvcodec_decode(const rb_kvcodec_dims *d, const void *src, size_t src_size,
                            rb_f16 *page, size_t dst_elems, rb_error *err)
{
    return decode_k(d, src, src_size, page, dst_elems, err, rb_kvcodec_kernels_get());
}

rb_status rb_kvcodec_decode_ref(const rb_kvcodec_dims *d, const void *src, size_t src_size,
                                rb_f16 *page, size_t dst_elems, rb_error *err)
{
    return decode_k(d, src, src_size, page, dst_elems, err, &rb_kvcodec_kernels_ref);
}

/* ---- entropy bound ------------------------------------------------------------ */

/* Sum over channels (h, c) of one half (K or V) of count x H(sign+exponent). */
static double half_entropy_bits(const rb_f16 *half, uint32_t n_heads, uint32_t n_tokens,
                                uint32_t dim)
{
    double bits = 0;
    for (uint32_t h = 0; h < n_heads; h++) {
        const rb_f16 *head = half + (size_t)h * n_tokens * dim;
        for (uint32_t c = 0; c < dim; c++) {
            uint32_t hist[64] = {0};
            for (uint32_t t = 0; t < n_tokens; t++)
                hist[head[(size_t)t * dim + c] >> 10]++;
            for (int s = 0; s < 64; s++)
                if (hist[s])
                    bits -= hist[s] * log2((double)hist[s] / n_tokens);
        }
    }
    return bits;
}

rb_status rb_kvcodec_entropy(const rb_kvcodec_dims *d, const rb_f16 *page,
                             rb_kvcodec_entropy_info *out, rb_error *err)
{
    rb_status st = rb_kvcodec_check_dims(d, err);
    if (st != RB_OK)
        return st;
    if (!page || !out)
        return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: page and out are required");
    const uint64_t n = rb_kvcodec_page_elems(d);
    const size_t k_elems = (size_t)d->n_kv_heads * d->n_tokens * d->head_dim_k;
    rb_kvcodec_entropy_info e;
    e.n_values = n;
    e.sign_exp_bits = half_entropy_bits(page, d->n_kv_heads, d->n_tokens, d->head_dim_k) +
                      half_entropy_bits(page + k_elems, d->n_kv_heads, d->n_tokens, d->head_dim_v);
    e.mantissa_bits = 10.0 * (double)n;
    e.bound_bytes = (e.sign_exp_bits + e.mantissa_bits) / 8;
    e.bound_ratio = (double)(2 * n) / e.bound_bytes;
    *out = e;
    return RB_OK;
}
