/*
 * fuzz_kvcodec.c - libFuzzer target for the KV codec's decoder
 * (src/kvcodec/kvcodec*.c).
 *
 * Input: one control byte, then a frame. Random bytes almost never carry a
 * valid header check, which would leave the payload decoders unexplored,
 * so control bit 0 "reseals" the header first: magic, version and reserved
 * fields set, dims folded into small ranges (tokens 1-128, heads 1-4, head
 * dims 1-80: heads of 8192 values or more take the lossless decoder's
 * scratch path), codec folded into the known ids, the header check recomputed;
 * bit 1 also sets payload_bytes to the bytes actually given. The frame is
 * then decoded against its own dims (or fixed ones when the header does not
 * parse) from an exact-size copy into an exact-size page, so ASan sees any
 * access outside either. Invariants that trap (libFuzzer records the
 * input):
 *   - a frame that decodes is re-encoded with its codec; for LOSSLESS and
 *     STORE the new frame must decode to the same page (bit-exact);
 *   - the _ref decoder agrees with the dispatched one: same status, and on
 *     success the same page.
 *
 * Build and run: see fuzz/README.md (target fuzz_kvcodec, seeds in
 * fuzz/corpus_kvcodec/).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvcodec.h"

static void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void reseal(uint8_t *f, size_t size, int set_payload)
{
    memcpy(f, "RBKV", 4);
    f[4] = RB_KVCODEC_VERSION;
    f[5] = (uint8_t)(f[5] % RB_KVCODEC_COUNT);
    f[6] = f[7] = 0;
    wr32(f + 8, 1 + rd32(f + 8) % 128);
    wr32(f + 12, 1 + rd32(f + 12) % 4);
    wr32(f + 16, 1 + rd32(f + 16) % 80);
    wr32(f + 20, 1 + rd32(f + 20) % 80);
    if (set_payload) {
        uint64_t n = size - RB_KVCODEC_HEADER_BYTES;
        for (int i = 0; i < 8; i++)
            f[24 + i] = (uint8_t)(n >> (8 * i));
    }
    memset(f + 44, 0, 4);
    wr32(f + 40, (uint32_t)rb_kvcodec_hash64(f, 40));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t ctl = data[0];
    data++, size--;
    uint8_t *frame = malloc(size ? size : 1);
    if (!frame)
        return 0;
    memcpy(frame, data, size);
    if ((ctl & 1) && size >= RB_KVCODEC_HEADER_BYTES)
        reseal(frame, size, ctl & 2);

    rb_kvcodec_dims d = {64, 2, 16, 16};
    rb_kvcodec_frame_info fi;
    if (rb_kvcodec_frame_info_get(frame, size, &fi, NULL) == RB_OK &&
        rb_kvcodec_page_elems(&fi.dims) <= (1u << 20))
        d = fi.dims;
    const size_t n = (size_t)rb_kvcodec_page_elems(&d);
    rb_f16 *page = malloc(2 * n), *page_ref = malloc(2 * n);
    if (!page || !page_ref)
        goto done;
    rb_error err;
    rb_status st = rb_kvcodec_decode(&d, frame, size, page, n, &err);
    rb_status st_ref = rb_kvcodec_decode_ref(&d, frame, size, page_ref, n, NULL);
    if (st != st_ref || (st == RB_OK && memcmp(page, page_ref, 2 * n)))
        __builtin_trap();
    if (st == RB_OK && (fi.codec == RB_KVCODEC_LOSSLESS || fi.codec == RB_KVCODEC_STORE)) {
        size_t cap = (size_t)rb_kvcodec_bound(&d, RB_KVCODEC_LOSSLESS), fn = 0;
        uint8_t *again = malloc(cap);
        if (again) {
            if (rb_kvcodec_encode(&d, RB_KVCODEC_LOSSLESS, page, again, cap, &fn, &err) != RB_OK ||
                rb_kvcodec_decode(&d, again, fn, page_ref, n, &err) != RB_OK ||
                memcmp(page, page_ref, 2 * n))
                __builtin_trap();
            free(again);
        }
    }
done:
    free(page);
    free(page_ref);
    free(frame);
    return 0;
}
