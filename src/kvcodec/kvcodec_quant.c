/*
 * kvcodec_quant.c - the lossy KV codecs: 8, 4 and 2-bit asymmetric group
 * quantization in the layout KIVI showed works (keys grouped per channel
 * along tokens, values per token along the head dim), with the AVX2
 * dequantizer beside its scalar _ref.
 *
 * A group of up to G = 64 values keeps its min m and step s as f16;
 * q = round((x - m) / s) in [0, 2^bits - 1] and the decoder gives
 * f16(m + s * q). Per 64 values: 8-bit 64 + 4 bytes (ratio 128/68 =
 * 1.882), 4-bit 32 + 4 (3.56), 2-bit 16 + 4 (6.4). m is the group's
 * minimum itself (an f16 value, exact); s is (max - min) / qmax rounded up
 * to f16, so every value is covered and |x - x'| <= s / 2 plus the f16
 * rounding of x'. The 4 and 2-bit encoders may clip a group's range by up
 * to 2/32 at each end when that lowers its squared error (group_params);
 * a clipped value is off by at most that much more. Inf and NaN cannot be
 * quantized: encode refuses them.
 *
 * Payload (all f16 little-endian; hd = head dim, P = tokens):
 *   K: per head, per block of 64 tokens (the last may be shorter, r rows):
 *        mins f16[hd_k] | steps f16[hd_k] | r packed rows of hd_k values
 *   V: per head, per token: (min f16, step f16) per 64-value group of the
 *        row | one packed row of hd_v values
 * Rows are packed in output order, so one kernel call writes one output
 * row and the decoded page streams out sequentially (it is hashed as it
 * goes). Packing of a row of n values in 16-byte chunks of C = 128 / bits
 * values: byte j of a chunk holds values j, j+16, j+32, j+48 at bit
 * offsets 0, bits, 2 bits, 3 bits (as many as fit), so that a vector
 * decoder turns 16 bytes into C values with shifts and masks only. The
 * n % C values past the last full chunk are packed sequentially (value k
 * at bit k x bits).
 *
 * Memory: stack only, at most 8 KB of float group parameters per call.
 */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "kvcodec_internal.h"
#include "status.h"


#define G RB_KVCODEC_GROUP

static size_t row_bytes(size_t n, int bits)
{
    const size_t c = (size_t)(128 / bits);
    return n / c * 16 + ((n % c) * (size_t)bits + 7) / 8;
}

#ifndef RB_KV_QUANT_AVX2 /* one definition: the baseline build's */
uint64_t rb_kvcodec_quant_payload_bytes(const rb_kvcodec_dims *d, int bits)
{
    const uint64_t P = d->n_tokens, blocks = (P + G - 1) / G, groups_v = (d->head_dim_v + G - 1) / G;
    const uint64_t k = blocks * 4 * d->head_dim_k + P * row_bytes(d->head_dim_k, bits);
    const uint64_t v = P * (groups_v * 4 + row_bytes(d->head_dim_v, bits));
    return d->n_kv_heads * (k + v);
}
#endif

/* ---- packing ---------------------------------------------------------------- */

static inline unsigned unpack1(const uint8_t *q, size_t n, int bits, size_t i)
{
    const size_t c = (size_t)(128 / bits), full = n / c;
    const unsigned mask = (1u << bits) - 1;
    if (i < full * c) {
        size_t j = i % c;
        return (q[i / c * 16 + (j & 15)] >> (bits * (int)(j >> 4))) & mask;
    }
    size_t bit = (i - full * c) * (size_t)bits;
    return (q[full * 16 + bit / 8] >> (bit % 8)) & mask;
}

#ifndef RB_KV_QUANT_NO_ENCODE /* the avx512 build: decode only */
static void pack_row(const uint8_t *v, size_t n, int bits, uint8_t *q)
{
    const size_t c = (size_t)(128 / bits), full = n / c;
    memset(q, 0, row_bytes(n, bits));
    for (size_t i = 0; i < n; i++) {
        if (i < full * c) {
            size_t j = i % c;
            q[i / c * 16 + (j & 15)] |= (uint8_t)(v[i] << (bits * (int)(j >> 4)));
        } else {
            size_t bit = (i - full * c) * (size_t)bits;
            q[full * 16 + bit / 8] |= (uint8_t)(v[i] << (bit % 8));
        }
    }
}
#endif

/* ---- dequantization kernels ---------------------------------------------------- */

#ifndef RB_KV_QUANT_AVX2 /* one definition: the baseline build's */
void rb_kvcodec_dequant_tail(const uint8_t *q, size_t n, int bits, const float *m,
                             const float *s, int per_elem, rb_f16 *out, size_t from)
{
    for (size_t i = from; i < n; i++) {
        size_t g = per_elem ? i : i / G;
        out[i] = rb_fp32_to_fp16(m[g] + s[g] * (float)unpack1(q, n, bits, i));
    }
}
#endif

#ifndef RB_KV_QUANT_AVX2 /* one definition: the baseline build's */
void rb_kvcodec_dequant_ref(const uint8_t *q, size_t n, int bits, const float *m, const float *s,
                            int per_elem, rb_f16 *out)
{
    rb_kvcodec_dequant_tail(q, n, bits, m, s, per_elem, out, 0);
}
#endif


#ifndef RB_KV_QUANT_NO_ENCODE /* the avx512 build: decode only */
/* ---- quantization (encode side; scalar: encode speed is not on the
 * restore path) ------------------------------------------------------------------ */

/* Step of a group [lo, hi] (finite, lo <= hi): the f16 at or above
 * (hi - lo) / qmax, lowered if m + qmax * s would leave the f16 range. */
static rb_f16 group_step(float lo, float hi, int qmax)
{
    float want = (hi - lo) / (float)qmax;
    rb_f16 s = rb_fp32_to_fp16(want);
    if (rb_fp16_to_fp32(s) < want)
        s++; /* positive halves: the next bit pattern is the next value */
    while (s > 0 && lo + rb_fp16_to_fp32(s) * (float)qmax > 65504.0f)
        s--;
    return s;
}

static inline uint8_t quant1(float x, float m, float inv, int qmax);

/* The group's min and step. 8-bit: the full range. 4 and 2-bit: the range
 * may be clipped at either end by 0, 1/32 or 2/32 of it, whichever of the
 * 9 choices gives the least squared error over the group (an outlier
 * otherwise stretches a 16-level grid over everything else). On
 * stories260K this took 4-bit top-1 agreement from 96.9% to 98.2% and
 * 2-bit from 83.9% to 86.7% (rebound kvquality, 384 positions); 16
 * choices (0-3/32) gave 98.7% at half the encode speed. */
static void group_params(const float *v, size_t n, float lo, float hi, int qmax, rb_f16 *m16,
                         rb_f16 *s16)
{
    *m16 = rb_fp32_to_fp16(lo);
    *s16 = group_step(lo, hi, qmax);
    if (qmax >= 255 || !(hi > lo))
        return;
    double best = INFINITY;
    const float span = hi - lo;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            float l = lo + span * (float)a / 32, h = hi - span * (float)b / 32;
            rb_f16 mc = rb_fp32_to_fp16(l);
            if (rb_fp16_to_fp32(mc) > l) /* round the min down: l must stay covered */
                mc = (mc & 0x8000) ? (rb_f16)(mc + 1) : (mc ? (rb_f16)(mc - 1) : 0x8001);
            const float mf = rb_fp16_to_fp32(mc);
            rb_f16 sc = group_step(mf, h, qmax);
            const float sf = rb_fp16_to_fp32(sc), inv = sf > 0 ? 1.0f / sf : 0;
            double err = 0;
            for (size_t i = 0; i < n; i++) {
                float y = mf + sf * (float)quant1(v[i], mf, inv, qmax);
                err += (double)(v[i] - y) * (double)(v[i] - y);
            }
            if (err < best) {
                best = err;
                *m16 = mc;
                *s16 = sc;
            }
        }
}

static inline uint8_t quant1(float x, float m, float inv, int qmax)
{
    float t = (x - m) * inv + 0.5f;
    int q = t <= 0 ? 0 : (int)t;
    return (uint8_t)(q > qmax ? qmax : q);
}

static rb_status not_finite(rb_error *err, const char *half, uint32_t h, uint32_t t, uint32_t c,
                            rb_f16 x)
{
    return rb_error_set(err, RB_E_INVALID_ARG, "kvcodec: %s head %" PRIu32 " position %" PRIu32
                        " channel %" PRIu32 " is %s (0x%04x): lossy codecs need finite values; "
                        "keep this page lossless", half, h, t, c, (x & 0x3ff) ? "NaN" : "Inf", x);
}

#define IS_FINITE(x) (((x) & 0x7c00) != 0x7c00)

rb_status rb_kvcodec_quant_encode(const rb_kvcodec_dims *d, int bits, const rb_f16 *page,
                                  uint8_t *dst, rb_kvcodec_hash *hash,
                                  const rb_kvcodec_kernels *k, rb_error *err)
{
    const uint32_t P = d->n_tokens, hk = d->head_dim_k, hv = d->head_dim_v;
    const int qmax = (1 << bits) - 1;
    const size_t rbk = row_bytes(hk, bits), rbv = row_bytes(hv, bits);
    float mf[RB_KVCODEC_MAX_HEAD_DIM], sf[RB_KVCODEC_MAX_HEAD_DIM];
    uint8_t qv[RB_KVCODEC_MAX_HEAD_DIM];
    rb_f16 row[RB_KVCODEC_MAX_HEAD_DIM];
    uint8_t *p = dst;

    /* K: per channel over blocks of 64 tokens */
    for (uint32_t h = 0; h < d->n_kv_heads; h++) {
        const rb_f16 *head = page + (size_t)h * P * hk;
        for (uint32_t t0 = 0; t0 < P; t0 += G) {
            const uint32_t r = P - t0 < G ? P - t0 : G;
            const rb_f16 *blk = head + (size_t)t0 * hk;
            for (uint32_t c = 0; c < hk; c++) {
                float lo = INFINITY, hi = -INFINITY, col[G];
                for (uint32_t t = 0; t < r; t++) {
                    rb_f16 x = blk[(size_t)t * hk + c];
                    if (!IS_FINITE(x))
                        return not_finite(err, "K", h, t0 + t, c, x);
                    float f = col[t] = rb_fp16_to_fp32(x);
                    lo = f < lo ? f : lo;
                    hi = f > hi ? f : hi;
                }
                rb_f16 m16, s16;
                group_params(col, r, lo, hi, qmax, &m16, &s16);
                rb_kv_wr16(p + 2 * c, m16);
                rb_kv_wr16(p + 2 * (hk + c), s16);
                mf[c] = rb_fp16_to_fp32(m16);
                sf[c] = rb_fp16_to_fp32(s16);
            }
            p += 4 * (size_t)hk;
            for (uint32_t t = 0; t < r; t++) {
                const rb_f16 *x = blk + (size_t)t * hk;
                for (uint32_t c = 0; c < hk; c++)
                    qv[c] = quant1(rb_fp16_to_fp32(x[c]), mf[c], sf[c] > 0 ? 1.0f / sf[c] : 0,
                                   qmax);
                pack_row(qv, hk, bits, p);
                k->dequant(p, hk, bits, mf, sf, 1, row);
                rb_kvcodec_hash_update_k(hash, row, 2 * (size_t)hk, k);
                p += rbk;
            }
        }
    }
    /* V: per token over groups of 64 along the row */
    const uint32_t ng = (hv + G - 1) / G;
    const rb_f16 *vhalf = page + (size_t)d->n_kv_heads * P * hk;
    for (uint32_t h = 0; h < d->n_kv_heads; h++) {
        for (uint32_t t = 0; t < P; t++) {
            const rb_f16 *x = vhalf + ((size_t)h * P + t) * hv;
            for (uint32_t g = 0; g < ng; g++) {
                const uint32_t c0 = g * G, c1 = hv - c0 < G ? hv : c0 + G;
                float lo = INFINITY, hi = -INFINITY, grp[G];
                for (uint32_t c = c0; c < c1; c++) {
                    if (!IS_FINITE(x[c]))
                        return not_finite(err, "V", h, t, c, x[c]);
                    float f = grp[c - c0] = rb_fp16_to_fp32(x[c]);
                    lo = f < lo ? f : lo;
                    hi = f > hi ? f : hi;
                }
                rb_f16 m16, s16;
                group_params(grp, c1 - c0, lo, hi, qmax, &m16, &s16);
                rb_kv_wr16(p + 4 * g, m16);
                rb_kv_wr16(p + 4 * g + 2, s16);
                mf[g] = rb_fp16_to_fp32(m16);
                sf[g] = rb_fp16_to_fp32(s16);
                const float inv = sf[g] > 0 ? 1.0f / sf[g] : 0;
                for (uint32_t c = c0; c < c1; c++)
                    qv[c] = quant1(rb_fp16_to_fp32(x[c]), mf[g], inv, qmax);
            }
            p += 4 * (size_t)ng;
            pack_row(qv, hv, bits, p);
            k->dequant(p, hv, bits, mf, sf, 0, row);
            rb_kvcodec_hash_update_k(hash, row, 2 * (size_t)hv, k);
            p += rbv;
        }
    }
    return RB_OK;
}
#endif

void rb_kvcodec_quant_decode(const rb_kvcodec_dims *d, int bits, const uint8_t *src,
                             rb_f16 *page, rb_kvcodec_hash *hash, const rb_kvcodec_kernels *k)
{
    const uint32_t P = d->n_tokens, hk = d->head_dim_k, hv = d->head_dim_v;
    const size_t rbk = row_bytes(hk, bits), rbv = row_bytes(hv, bits);
    float mf[RB_KVCODEC_MAX_HEAD_DIM], sf[RB_KVCODEC_MAX_HEAD_DIM];
    const uint8_t *p = src;
    rb_f16 *out = page;
    for (uint32_t h = 0; h < d->n_kv_heads; h++) {
        for (uint32_t t0 = 0; t0 < P; t0 += G) {
            const uint32_t r = P - t0 < G ? P - t0 : G;
            for (uint32_t c = 0; c < hk; c++) {
                mf[c] = rb_fp16_to_fp32(rb_kv_rd16(p + 2 * c));
                sf[c] = rb_fp16_to_fp32(rb_kv_rd16(p + 2 * (hk + c)));
            }
            p += 4 * (size_t)hk;
#ifdef RB_KV_QUANT_AVX512 /* each row hashed from the registers */
            for (uint32_t t = 0; t < r; t++, p += rbk, out += hk)
                rb_kvcodec_dequant_absorb_avx512(p, hk, bits, mf, sf, 1, out, hash);
            (void)k;
#else
            rb_f16 *tile = out;
            for (uint32_t t = 0; t < r; t++, p += rbk, out += hk)
                k->dequant(p, hk, bits, mf, sf, 1, out);
            /* the tile (<= 64 rows) is still in L1: hash it there */
            rb_kvcodec_hash_update_k(hash, tile, 2 * (size_t)r * hk, k);
#endif
        }
    }
    const uint32_t ng = (hv + G - 1) / G;
    for (uint32_t h = 0; h < d->n_kv_heads; h++) {
        for (uint32_t t0 = 0; t0 < P; t0 += G) {
            const uint32_t r = P - t0 < G ? P - t0 : G;
            rb_f16 *tile = out;
            for (uint32_t t = 0; t < r; t++, out += hv) {
                for (uint32_t g = 0; g < ng; g++) {
                    mf[g] = rb_fp16_to_fp32(rb_kv_rd16(p + 4 * g));
                    sf[g] = rb_fp16_to_fp32(rb_kv_rd16(p + 4 * g + 2));
                }
                p += 4 * (size_t)ng;
#ifdef RB_KV_QUANT_AVX512
                rb_kvcodec_dequant_absorb_avx512(p, hv, bits, mf, sf, 0, out, hash);
#else
                k->dequant(p, hv, bits, mf, sf, 0, out);
#endif
                p += rbv;
            }
#ifdef RB_KV_QUANT_AVX512
            (void)tile;
#else
            rb_kvcodec_hash_update_k(hash, tile, 2 * (size_t)r * hv, k);
#endif
        }
    }
}
