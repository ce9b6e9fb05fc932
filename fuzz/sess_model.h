/*
 * sess_model.h - what fuzz_sessfile.c and make_sesscorpus.c share: the
 * small synthetic model both open (deterministic: the seeds' fingerprint
 * is the target's), the session parameters, and the compact input form.
 *
 * A session file is mostly room: two catalog areas of C bytes each (C holds
 * a full context's tokens and a 256 KiB blob). The fuzzer sees it compact:
 *
 *   u8 control (bit 0: the rest is a whole file as it is; bits 1 and 2:
 *      open it as a session and feed a token, if bits 3-7 are the gate of
 *      the rest (fuzz_sess_gate); else the file layer alone)
 *   then, unless bit 0: four pieces, each u16 length + bytes: superblock
 *      slot 0, slot 1, catalog area 0, area 1 (each cut to its area), and
 *      the rest: the page records from the data start on
 *
 * and fuzz_inflate writes it out as the file it stands for.
 */
#ifndef RB_FUZZ_SESS_MODEL_H
#define RB_FUZZ_SESS_MODEL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "convert.h"
#include "rebound.h"
#include "rebound_experimental.h"
#include "synth.h"

#define FUZZ_SESS_CTX 512
#define FUZZ_SESS_A 4096u
#define FUZZ_SESS_MAX_BLOB (256u << 10)

/* Writes (once) and opens the model: 2 layers, 1 KV head of 8, vocabulary
 * of 300, F32. NULL on failure (printed). */
static inline rb_model *fuzz_sess_model(const char *path)
{
    if (access(path, F_OK) != 0) {
        rb_synth_shape s = *rb_synth_shape_find("tiny");
        s.name = "custom";
        s.n_embd = 16;
        s.n_layers = 2;
        s.n_head = 2;
        s.n_head_kv = 1;
        s.head_dim = 0;
        s.n_ff = 32;
        s.n_vocab = 300;
        s.n_ctx = FUZZ_SESS_CTX;
        rb_synth_params sp = {s, rb_file_kind_find("f32"), 7, 1};
        rb_error err;
        if (rb_synth_write(path, &sp, NULL, &err) != RB_OK) {
            fprintf(stderr, "fuzz: cannot write the model: %s\n", err.message);
            return NULL;
        }
    }
    rb_model *m = NULL;
    rb_error err;
    if (rb_model_open(path, NULL, &m, &err) != RB_OK) {
        fprintf(stderr, "fuzz: cannot open the model: %s\n", err.message);
        return NULL;
    }
    return m;
}

static inline rb_session_params fuzz_sess_params(void)
{
    /* the tier split's rates given: nothing measured per session */
    static rb_experimental_params x;
    x = rb_experimental_default_params();
    x.decode_bytes_per_s = 1e9;
    x.storage_bytes_per_s = 1e9;
    rb_session_params p = rb_session_default_params();
    p.n_ctx = FUZZ_SESS_CTX;
    p.n_threads = 1;
    p.experimental = &x;
    return p;
}

/* The catalog area C of this model's files (sessfile.c's cat_area_bytes:
 * tokens, 24-byte page entries, blob). */
static inline uint64_t fuzz_sess_cat_area(void)
{
    const uint64_t pages = FUZZ_SESS_CTX / 256, layers = 2;
    uint64_t n = 8 + 4 * (pages * 256) + 24 * layers * pages + 4 + FUZZ_SESS_MAX_BLOB;
    return (n + FUZZ_SESS_A - 1) / FUZZ_SESS_A * FUZZ_SESS_A;
}

/* The session gate of an input (fuzz_sessfile.c's is_session): five
 * bits of a hash of the bytes after its control byte, which any mutation
 * changes. Neither instrumented nor checked: it reads only the input, and
 * its loop would be a coverage point of every input length. */
__attribute__((no_sanitize("address"), no_sanitize("coverage"))) static inline unsigned
fuzz_sess_gate(const uint8_t *p, size_t n)
{
    const uint64_t C = 0x9e3779b97f4a7c15ull;
    uint64_t a[4] = {n, 1, 2, 3};
    size_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++) {
            uint64_t w;
            memcpy(&w, p + i + 8 * k, 8);
            a[k] = (a[k] ^ w) * C;
            a[k] ^= a[k] >> 29;
        }
    uint64_t h = a[0];
    for (int k = 1; k < 4; k++)
        h = (h ^ a[k]) * C;
    for (; i < n; i++)
        h = (h ^ p[i]) * C;
    h ^= h >> 31;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (unsigned)(h >> 59);
}

#endif
