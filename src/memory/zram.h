/*
 * zram.h - the general-purpose compressors zRAM uses (lz4, zstd), wrapped
 * as a RAM tier for KV pages: the `zram` baseline of `rebound switch`
 * (what a phone gives an app today: its pages compressed by the kernel
 * with a codec that knows nothing of fp16).
 *
 * Frame (little-endian): "RBZR" | u8 codec | u8 level | u16 0 |
 * u64 raw bytes | u64 payload bytes | u64 hash64 of the raw bytes | payload.
 *
 * Built only when liblz4 / libzstd are found at configure time; otherwise
 * every call returns RB_E_UNSUPPORTED saying so. Pure functions on caller
 * buffers; thread-safe (zstd contexts are per call).
 */
#ifndef RB_ZRAM_H
#define RB_ZRAM_H

#include <stddef.h>
#include <stdint.h>

#include "rebound.h"

#define RB_ZRAM_HEADER_BYTES 32

typedef enum rb_zram_codec { RB_ZRAM_LZ4 = 1, RB_ZRAM_ZSTD = 2 } rb_zram_codec;

/* 1 when this build has the codec. */
int rb_zram_available(rb_zram_codec codec);
/* Largest frame for n raw bytes (0 when the codec is not built). */
size_t rb_zram_bound(rb_zram_codec codec, size_t n);

/* Compresses src (n bytes) into dst; *out_bytes the frame size.
 * RB_E_UNSUPPORTED (not built), RB_E_BUDGET (dst too small), RB_E_IO (the
 * library failed: its message). */
rb_status rb_zram_encode(rb_zram_codec codec, const void *src, size_t n, void *dst,
                         size_t dst_size, size_t *out_bytes, rb_error *err);

/* Decompresses a frame into dst (exactly dst_size raw bytes expected) and
 * checks the hash. RB_E_FORMAT names the problem (magic, sizes, checksum). */
rb_status rb_zram_decode(const void *src, size_t src_size, void *dst, size_t dst_size,
                         rb_error *err);

#endif
