/*
 * zram.c - lz4 / zstd frames for the zram baseline (zram.h).
 *
 * lz4 at its default (fast) setting and zstd at level 1 are what zRAM and
 * zswap use on phones. Both are optional: this file compiles to stubs that
 * say "not built" when the libraries were not found (REBOUND_HAVE_LZ4,
 * REBOUND_HAVE_ZSTD from CMake).
 */
#include <inttypes.h>
#include <string.h>

#include "kvcodec.h"
#include "status.h"
#include "zram.h"

#ifdef REBOUND_HAVE_LZ4
#include <lz4.h>
#endif
#ifdef REBOUND_HAVE_ZSTD
#include <zstd.h>
#endif

static const char MAGIC[4] = {'R', 'B', 'Z', 'R'};

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

int rb_zram_available(rb_zram_codec codec)
{
#ifdef REBOUND_HAVE_LZ4
    if (codec == RB_ZRAM_LZ4)
        return 1;
#endif
#ifdef REBOUND_HAVE_ZSTD
    if (codec == RB_ZRAM_ZSTD)
        return 1;
#endif
    (void)codec;
    return 0;
}

size_t rb_zram_bound(rb_zram_codec codec, size_t n)
{
#ifdef REBOUND_HAVE_LZ4
    if (codec == RB_ZRAM_LZ4 && n <= (size_t)LZ4_MAX_INPUT_SIZE)
        return RB_ZRAM_HEADER_BYTES + (size_t)LZ4_compressBound((int)n);
#endif
#ifdef REBOUND_HAVE_ZSTD
    if (codec == RB_ZRAM_ZSTD)
        return RB_ZRAM_HEADER_BYTES + ZSTD_compressBound(n);
#endif
    (void)codec;
    (void)n;
    return 0;
}

rb_status rb_zram_encode(rb_zram_codec codec, const void *src, size_t n, void *dst,
                         size_t dst_size, size_t *out_bytes, rb_error *err)
{
    if (!rb_zram_available(codec))
        return rb_error_set(err, RB_E_UNSUPPORTED, "zram: %s is not part of this build "
                            "(install liblz4-dev / libzstd-dev and reconfigure)",
                            codec == RB_ZRAM_LZ4 ? "lz4" : "zstd");
    if (dst_size < rb_zram_bound(codec, n))
        return rb_error_set(err, RB_E_BUDGET, "zram: destination of %zu bytes is below the "
                            "bound %zu", dst_size, rb_zram_bound(codec, n));
    uint8_t *h = dst;
    size_t payload = 0;
#ifdef REBOUND_HAVE_LZ4
    if (codec == RB_ZRAM_LZ4) {
        int k = LZ4_compress_default(src, (char *)h + RB_ZRAM_HEADER_BYTES, (int)n,
                                     (int)(dst_size - RB_ZRAM_HEADER_BYTES));
        if (k <= 0)
            return rb_error_set(err, RB_E_IO, "zram: lz4 failed on %zu bytes", n);
        payload = (size_t)k;
    }
#endif
#ifdef REBOUND_HAVE_ZSTD
    if (codec == RB_ZRAM_ZSTD) {
        size_t k = ZSTD_compress(h + RB_ZRAM_HEADER_BYTES, dst_size - RB_ZRAM_HEADER_BYTES, src,
                                 n, 1);
        if (ZSTD_isError(k))
            return rb_error_set(err, RB_E_IO, "zram: zstd failed: %s", ZSTD_getErrorName(k));
        payload = k;
    }
#endif
    memcpy(h, MAGIC, 4);
    h[4] = (uint8_t)codec;
    h[5] = codec == RB_ZRAM_ZSTD ? 1 : 0;
    h[6] = h[7] = 0;
    put64(h + 8, n);
    put64(h + 16, payload);
    put64(h + 24, rb_kvcodec_hash64(src, n));
    *out_bytes = RB_ZRAM_HEADER_BYTES + payload;
    return RB_OK;
}

rb_status rb_zram_decode(const void *src, size_t src_size, void *dst, size_t dst_size,
                         rb_error *err)
{
    const uint8_t *h = src;
    if (src_size < RB_ZRAM_HEADER_BYTES || memcmp(h, MAGIC, 4) != 0)
        return rb_error_set(err, RB_E_FORMAT, "zram: not a zram frame (%zu bytes)", src_size);
    uint64_t raw = get64(h + 8), payload = get64(h + 16);
    if (raw != dst_size)
        return rb_error_set(err, RB_E_FORMAT, "zram: frame holds %" PRIu64 " bytes, the page "
                            "is %zu", raw, dst_size);
    if (payload > src_size - RB_ZRAM_HEADER_BYTES)
        return rb_error_set(err, RB_E_FORMAT, "zram: frame truncated: payload %" PRIu64
                            " bytes, %zu present", payload, src_size - RB_ZRAM_HEADER_BYTES);
    rb_zram_codec codec = (rb_zram_codec)h[4];
    if (!rb_zram_available(codec))
        return rb_error_set(err, codec == RB_ZRAM_LZ4 || codec == RB_ZRAM_ZSTD
                                     ? RB_E_UNSUPPORTED : RB_E_FORMAT,
                            "zram: codec %d is unknown or not built", (int)codec);
    size_t got = 0;
#ifdef REBOUND_HAVE_LZ4
    if (codec == RB_ZRAM_LZ4) {
        int k = LZ4_decompress_safe((const char *)h + RB_ZRAM_HEADER_BYTES, dst, (int)payload,
                                    (int)dst_size);
        got = k < 0 ? 0 : (size_t)k;
    }
#endif
#ifdef REBOUND_HAVE_ZSTD
    if (codec == RB_ZRAM_ZSTD) {
        size_t k = ZSTD_decompress(dst, dst_size, h + RB_ZRAM_HEADER_BYTES, payload);
        got = ZSTD_isError(k) ? 0 : k;
    }
#endif
    if (got != dst_size)
        return rb_error_set(err, RB_E_FORMAT, "zram: payload does not decompress to %zu bytes",
                            dst_size);
    if (rb_kvcodec_hash64(dst, dst_size) != get64(h + 24))
        return rb_error_set(err, RB_E_FORMAT, "zram: checksum mismatch after decompression");
    return RB_OK;
}
