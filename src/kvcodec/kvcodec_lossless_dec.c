/*
 * kvcodec_lossless_dec.c - the decoder of the bit-exact KV codec: the
 * payload format, the contexts and why the numbers are what they are are
 * described at the top of kvcodec_lossless.c (the encoder).
 *
 * Steps per head (after the payload's version byte): 1. per chunk of 128
 * channels (CLUSTERED) read its K <= 32 descriptors and build their
 * decode tables (128 entries, runs in canonical order), then every
 * channel's code index and the lengths of its 8 streams (version 2: of
 * a stream per channel); 2. decode the symbol streams 8
 * in lockstep (8 adjacent channels, each slot holding a copy of its
 * channel's table, copied only when the slot's code changes; version 3:
 * stream j carries channels j, j + 8, ... one after another; or the 8
 * interleaved streams of a SHARED head, one table), each symbol's table
 * entry stored at its output position; 3. merge the mantissa bits under
 * the top 6 bits and hash the region (AVX2 kernel beside its _ref).
 * Measured (version 2, bench_kv, medians, wall / thread CPU time):
 * qwen3-0.6b shape 2.09 / 2.19 GB/s (perf: symbol loop ~60%, merge +
 * hash ~28%, tables ~10%), stories260K 1.84 / 1.92 GB/s (loop ~50%,
 * tables ~17%, merge ~17%: its heads are 1024 values). Every length and count comes from the frame:
 * each is checked against the payload's end before use (a chunk's stream
 * lengths summed before any stream is read, code indices against K), and
 * reads past a stream are bounded by the payload (never past it).
 */
#include <inttypes.h>
#include <string.h>

#include "kvcodec_internal.h"
#include "status.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#endif

#define MAXLEN RB_KVLL_MAXLEN
#define ROUND (56 / MAXLEN) /* symbols per round: 57 bits from one load */
#define NSYM RB_KVLL_NSYM
/* Heads of SCRATCH_MIN..SCRATCH values have their symbols decoded apart
 * from the page (64 KiB of stack: a qwen3-0.6b head of 256 tokens x 128
 * dims). Smaller heads stay in place: their region is cache-friendly
 * already, and with the scratch stories260K's 2 KiB heads decoded ~1.5%
 * slower (thread CPU time, 64 MiB of pages). */
#define SCRATCH 32768
#define SCRATCH_MIN 8192
#define bit_width rb_kvll_bit_width
enum { MODE_CLUSTERED = RB_KVLL_CLUSTERED, MODE_SHARED = RB_KVLL_SHARED };
#define CHUNK RB_KVLL_CHUNK
#define KMAX RB_KVLL_KMAX

/* ---- decoder: tables and headers ------------------------------------------------ */

/* Every table has 2^7 entries, whatever the code's longest length: the
 * peek is then a constant shift, and filling 128 entries is ~8-20 vector
 * stores, ~0.1 store per symbol of a 256-token channel. */
typedef struct dtable {
    uint16_t e[(1 << MAXLEN) + 16]; /* symbol << 10 | length; 16 slack for run fills */
} dtable;

/* Bounds-checked LSB-first reader for descriptors. */
typedef struct hdrrd {
    const uint8_t *p, *end;
    uint64_t acc;
    unsigned n;
    int overrun;
} hdrrd;

static void get_slow(hdrrd *r, unsigned nb)
{
    while (r->n < nb) {
        if (r->p < r->end)
            r->acc |= (uint64_t)*r->p++ << r->n;
        else
            r->overrun = 1;
        r->n += 8;
    }
}

/* Makes nb <= 56 bits available. */
static inline void get_slow_or_fill(hdrrd *r, unsigned nb)
{
    if (r->n < nb) {
        if (r->end - r->p >= 8) {
            r->acc |= rb_kv_load64(r->p) << r->n;
            r->p += (63 - r->n) >> 3;
            r->n |= 56;
        } else {
            get_slow(r, nb);
        }
    }
}

/* nb <= 32 bits. Whole 8-byte refills while the payload lasts (the
 * bytes read ahead are given back by hdr_end). */
static inline uint32_t get(hdrrd *r, unsigned nb)
{
    if (r->n < nb) {
        if (r->end - r->p >= 8) {
            r->acc |= rb_kv_load64(r->p) << r->n;
            r->p += (63 - r->n) >> 3;
            r->n |= 56;
        } else {
            get_slow(r, nb);
        }
    }
    uint32_t v = (uint32_t)(r->acc & ((1ull << nb) - 1));
    r->acc >>= nb;
    r->n -= nb;
    return v;
}

/* Where the byte-aligned record read so far ends. */
static inline const uint8_t *hdr_end(const hdrrd *r) { return r->p - r->n / 8; }

/* Fills n >= 1 entries with v, in blocks of 8: may write up to 7 entries
 * past the run, which the next run (or the slack) absorbs. */
static inline void fill_run(uint16_t *e, uint32_t n, uint16_t v)
{
#if defined(__SSE2__)
    const __m128i x = _mm_set1_epi16((short)v);
    for (uint32_t i = 0; i < n; i += 8)
        _mm_storeu_si128((__m128i *)(e + i), x);
#elif defined(__aarch64__) && defined(__ARM_NEON)
    const uint16x8_t x = vdupq_n_u16(v);
    for (uint32_t i = 0; i < n; i += 8)
        vst1q_u16(e + i, x);
#else
    for (uint32_t i = 0; i < n; i++)
        e[i] = v;
#endif
}

/* The 128 entries the decode loops read (not the slack), inline: a
 * memcpy call per slot was 3% of stories260K's decode. */
static inline void copy_table(dtable *d, const dtable *s)
{
    memcpy(d->e, s->e, sizeof d->e[0] << MAXLEN);
}

/* Reads a descriptor and builds its table; NULL on success, else a static
 * reason. Canonical MSB-first codes: the codes of length l, in symbol
 * order, follow those of length l - 1, so with a 7-bit peek each symbol
 * owns one run of 2^(7 - l) consecutive entries. */
static const char *read_desc(hdrrd *r, dtable *t, int *single)
{
    *single = 0;
    if (get(r, 1)) {
        fill_run(t->e, 1u << MAXLEN, (uint16_t)(get(r, 6) << 10)); /* 0 bits a symbol */
        *single = 1;
        return r->overrun ? "descriptor truncated" : NULL;
    }
    const uint32_t head = get(r, 12), signs = head & 3, lo = head >> 2 & 31, cnt = (head >> 7) + 1;
    if (!signs)
        return "code with no sign present";
    if (lo + cnt > 32)
        return "exponent range beyond 31";
    /* symbols bucketed by length; the 8 bucket counts packed 8 bits each in
     * one register, so that a field does not wait on the previous field's
     * count store (perf put a quarter of this function's samples there;
     * whole-decode speed moved within the machine's noise, +-5%) */
    uint8_t bucket[MAXLEN + 1][NSYM];
    uint64_t nb = 0;
    for (uint32_t sg = 0; sg < 2; sg++) {
        if (!(signs >> sg & 1))
            continue;
        /* the lengths in batches of up to 18 (54 bits: one refill) */
        for (uint32_t e = lo; e < lo + cnt;) {
            const uint32_t k = lo + cnt - e < 18 ? lo + cnt - e : 18;
            get_slow_or_fill(r, 3 * k);
            uint64_t a = r->acc;
            for (uint32_t i = 0; i < k; i++, e++, a >>= 3) {
                const uint32_t l = (uint32_t)(a & 7); /* <= 7 = MAXLEN */
                bucket[l][nb >> (8 * l) & 255] = (uint8_t)(sg << 5 | e);
                nb += 1ull << (8 * l);
            }
            r->acc = a;
            r->n -= 3 * k;
        }
    }
    if (r->overrun)
        return "descriptor truncated";
    uint32_t kraft = 0;
    for (uint32_t l = 1; l <= MAXLEN; l++)
        kraft += (uint32_t)(nb >> (8 * l) & 255) << (MAXLEN - l);
    if (kraft != (1u << MAXLEN)) /* (complete with lengths >= 1: 2 symbols or more) */
        return "code lengths do not form a complete prefix code";
    /* runs in table order: a run may spill past its end (fill_run), the
     * next run overwrites the spill */
    uint32_t pos = 0;
    for (uint32_t l = 1; l <= MAXLEN; l++)
        for (uint32_t i = 0, n_l = (uint32_t)(nb >> (8 * l) & 255); i < n_l; i++) {
            fill_run(t->e + pos, 1u << (MAXLEN - l), (uint16_t)(bucket[l][i] << 10 | l));
            pos += 1u << (MAXLEN - l);
        }
    return NULL;
}

/* A CLUSTERED chunk's code count and its K codes' descriptors (either
 * version); NULL or what is wrong. */
static const char *read_codes(hdrrd *r, dtable *ctab, int *single, uint32_t *k)
{
    const char *why = NULL;
    *k = get(r, 5) + 1;
    for (uint32_t i = 0; i < *k && !why; i++)
        why = read_desc(r, &ctab[i], &single[i]);
    return why;
}

/* ---- decoder: streams ----------------------------------------------------------- */

/* Stream reading, by rounds of at most 8 symbols (8 x 7 bits fit the 57
 * bits one unaligned 8-byte load gives at any bit offset). A round loads
 * the big-endian word at the stream's bit position pos, shifts out the
 * pos % 8 bits already used, and marks the end of the loaded bits with a
 * 1 (a sentinel at the bottom: it costs the word's last bit, never needed).
 * Each symbol then shifts the word left by its length; after the round the
 * sentinel's position is how far the round went, so no counter is kept
 * per symbol. The stream's position is the whole state. */
typedef struct bstream {
    const uint8_t *base;
    uint64_t pos; /* bits consumed */
} bstream;

static inline uint64_t word_fast(const bstream *s)
{
    return (__builtin_bswap64(rb_kv_load64(s->base + (s->pos >> 3))) | 1) << (s->pos & 7);
}

/* Near the payload's end: the bytes that exist, zeros after them. */
static inline uint64_t word_safe(const bstream *s, const uint8_t *end)
{
    const uint8_t *a = s->base + (s->pos >> 3);
    uint8_t tmp[8] = {0};
    if (a < end)
        memcpy(tmp, a, (size_t)(end - a) < 8 ? (size_t)(end - a) : 8);
    return (__builtin_bswap64(rb_kv_load64(tmp)) | 1) << (s->pos & 7);
}

static inline void advance(bstream *s, uint64_t w)
{
    s->pos = (s->pos & ~(uint64_t)7) + (uint64_t)__builtin_ctzll(w);
}

/* One symbol: the entry's low 6 bits are its length, which is all a
 * 64-bit shift looks at; the stored value keeps them (the merge pass
 * masks them off), saving two operations per symbol. */
#define DECODE1(w, t, o)                   \
    do {                                   \
        uint32_t e_ = (t)->e[(w) >> peek_shift]; \
        (w) <<= e_ & 63;                   \
        (o) = (rb_f16)e_;                  \
    } while (0)

/* The peek shift (64 - MAXLEN) as a value the compiler cannot see, so that
 * it shifts with shrx (three operands) instead of copying the word and
 * shifting by an immediate: one operation less per symbol (~10% of the
 * loop, measured). */
#if defined(__GNUC__)
#define PEEK_SHIFT_DECL                 \
    unsigned peek_shift = 64 - MAXLEN;  \
    __asm__("" : "+r"(peek_shift))
#else
#define PEEK_SHIFT_DECL const unsigned peek_shift = 64 - MAXLEN
#endif

/* Rounds from now on that cannot load past end (a round moves <= 7 bytes:
 * 56 bits). */
static inline size_t safe_rounds(const bstream *s, const uint8_t *end)
{
    const uint8_t *a = s->base + (s->pos >> 3);
    return a + 8 <= end ? (size_t)(end - a - 8) / 7 + 1 : 0;
}

static void decode_1(bstream *s, const dtable *t, rb_f16 *o, size_t n, size_t stride,
                     const uint8_t *end)
{
    PEEK_SHIFT_DECL;
    for (size_t i = 0; i < n; i += ROUND) {
        uint64_t w = safe_rounds(s, end) ? word_fast(s) : word_safe(s, end);
        size_t m = n - i < ROUND ? n - i : ROUND;
        for (size_t k = 0; k < m; k++, o += stride)
            DECODE1(w, t, *o);
        advance(s, w);
    }
}

/* Eight streams in lockstep, n symbols each, stream j writing o[i *
 * stride + j] with table tab[j * ts]: eight dependency chains keep the
 * core near its issue width. CLUSTERED: eight adjacent channels, ts 1
 * (the tables are one array, so that one register addresses all eight);
 * SHARED: the head's values in row order, stride 8, ts 0. */
static inline __attribute__((always_inline)) void decode_8(bstream *s, const dtable *tab,
                                                           const int ts, rb_f16 *o, size_t n,
                                                           size_t stride, const uint8_t *end)
{
    size_t done = 0, x = 0;
    PEEK_SHIFT_DECL;
    while (done + ROUND <= n) {
        size_t r = (n - done) / ROUND;
        for (int j = 0; j < 8; j++) {
            size_t rj = safe_rounds(&s[j], end);
            r = rj < r ? rj : r;
        }
        if (r == 0)
            break;
        for (size_t k0 = 0; k0 < r; k0++) {
            uint64_t w0 = word_fast(&s[0]), w1 = word_fast(&s[1]);
            uint64_t w2 = word_fast(&s[2]), w3 = word_fast(&s[3]);
            uint64_t w4 = word_fast(&s[4]), w5 = word_fast(&s[5]);
            uint64_t w6 = word_fast(&s[6]), w7 = word_fast(&s[7]);
            for (int k = 0; k < ROUND; k++, x += stride) {
                DECODE1(w0, &tab[0 * ts], o[x]);
                DECODE1(w1, &tab[1 * ts], o[x + 1]);
                DECODE1(w2, &tab[2 * ts], o[x + 2]);
                DECODE1(w3, &tab[3 * ts], o[x + 3]);
                DECODE1(w4, &tab[4 * ts], o[x + 4]);
                DECODE1(w5, &tab[5 * ts], o[x + 5]);
                DECODE1(w6, &tab[6 * ts], o[x + 6]);
                DECODE1(w7, &tab[7 * ts], o[x + 7]);
            }
            advance(&s[0], w0), advance(&s[1], w1), advance(&s[2], w2), advance(&s[3], w3);
            advance(&s[4], w4), advance(&s[5], w5), advance(&s[6], w6), advance(&s[7], w7);
        }
        done += ROUND * r;
    }
    /* the last n % ROUND symbols of each stream, still in lockstep when no
     * stream is near the payload's end (P = 71: 7 of every 71 symbols,
     * which decode_1 took one stream at a time) */
    if (done < n && n - done < ROUND) {
        int ok = 1;
        for (int j = 0; j < 8; j++)
            ok &= safe_rounds(&s[j], end) > 0;
        if (ok) {
            const size_t m = n - done;
            uint64_t w0 = word_fast(&s[0]), w1 = word_fast(&s[1]);
            uint64_t w2 = word_fast(&s[2]), w3 = word_fast(&s[3]);
            uint64_t w4 = word_fast(&s[4]), w5 = word_fast(&s[5]);
            uint64_t w6 = word_fast(&s[6]), w7 = word_fast(&s[7]);
            for (size_t k = 0; k < m; k++, x += stride) {
                DECODE1(w0, &tab[0 * ts], o[x]);
                DECODE1(w1, &tab[1 * ts], o[x + 1]);
                DECODE1(w2, &tab[2 * ts], o[x + 2]);
                DECODE1(w3, &tab[3 * ts], o[x + 3]);
                DECODE1(w4, &tab[4 * ts], o[x + 4]);
                DECODE1(w5, &tab[5 * ts], o[x + 5]);
                DECODE1(w6, &tab[6 * ts], o[x + 6]);
                DECODE1(w7, &tab[7 * ts], o[x + 7]);
            }
            advance(&s[0], w0), advance(&s[1], w1), advance(&s[2], w2), advance(&s[3], w3);
            advance(&s[4], w4), advance(&s[5], w5), advance(&s[6], w6), advance(&s[7], w7);
            done = n;
        }
    }
    for (int j = 0; done < n && j < 8; j++)
        decode_1(&s[j], &tab[j * ts], o + x + j, n - done, stride, end);
}

#if defined(__GNUC__) && !defined(__clang__)
/* gcc's SLP vectorizer gathers the eight 16-bit results into a vector
 * register (inserts and moves between register files) before one store:
 * slower than eight plain stores (measured ~15% of the loop). */
#define NO_SLP __attribute__((optimize("no-tree-slp-vectorize")))
#else
#define NO_SLP
#endif
static NO_SLP __attribute__((noinline)) void decode_8ch(bstream *s, const dtable *tab, rb_f16 *o,
                                                        size_t n, size_t stride,
                                                        const uint8_t *end)
{
    decode_8(s, tab, 1, o, n, stride, end);
}

static NO_SLP __attribute__((noinline)) void decode_8sh(bstream *s, const dtable *tab, rb_f16 *o,
                                                        size_t n, const uint8_t *end)
{
    decode_8(s, tab, 0, o, n, 8, end);
}

static void start_stream(bstream *s, const uint8_t *p)
{
    s->base = p;
    s->pos = 0;
}

static uint64_t consumed_bits(const bstream *s) { return s->pos; }

/* ---- decoder: mantissa merge ------------------------------------------------------ */


#ifndef RB_KV_LOSSLESS_DEC_AVX2 /* one definition: the baseline build's */
void rb_kvcodec_merge_ref(rb_f16 *out, const rb_f16 *top, const uint8_t *lo8, const uint8_t *hi2,
                          size_t n, rb_kvcodec_hash *h)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (rb_f16)((top[i] & 0xfc00) | rb_kv_hi2_at(hi2, n, i) << 8 | lo8[i]);
    rb_kvcodec_hash_update_k(h, out, 2 * n, &rb_kvcodec_kernels_ref);
}
#endif


/* ---- decoder ---------------------------------------------------------------------- */

static rb_status bad(rb_error *err, const char *half, uint32_t h, const char *what)
{
    return rb_error_set(err, RB_E_FORMAT, "kvcodec: lossless %s head %" PRIu32 ": %s", half, h,
                        what);
}

/* Channels idx[0..m) of a CLUSTERED chunk (m <= 8) from streams r[0..m),
 * into o, o + 1, ...: each slot j a copy of its channel's code table
 * (copied only when the slot's code changes), then 8 in lockstep or, for
 * a last group under 8, one at a time. */
static void decode_group(bstream *r, dtable *tabs, int *slot, const dtable *ctab,
                         const uint8_t *idx, int m, rb_f16 *o, size_t n, size_t stride,
                         const uint8_t *end)
{
    for (int j = 0; j < m; j++)
        if (slot[j] != idx[j]) {
            copy_table(&tabs[j], &ctab[idx[j]]);
            slot[j] = idx[j];
        }
    if (m == 8) {
        decode_8ch(r, tabs, o, n, stride, end);
        return;
    }
    for (int j = 0; j < m; j++)
        decode_1(&r[j], &tabs[j], o + j, n, stride, end);
}

/* Reads a stream length field and checks that the stream fits. */
static const char *stream_len(hdrrd *r, unsigned w, uint64_t nsym, uint64_t *len)
{
    *len = get(r, w);
    if (r->overrun)
        return "descriptor truncated";
    if (*len > nsym)
        return "stream longer than its symbols can take";
    return NULL;
}

static rb_status check_streams(const bstream *r, const uint64_t *len, int ns, rb_error *err,
                               const char *half, uint32_t h)
{
    for (int j = 0; j < ns; j++) {
        uint64_t used = (consumed_bits(&r[j]) + 7) / 8;
        if (used != len[j])
            return rb_error_set(err, RB_E_FORMAT, "kvcodec: lossless %s head %" PRIu32 ": stream "
                                "%d decodes to %" PRIu64 " bytes, its length field says %" PRIu64,
                                half, h, j, used, len[j]);
    }
    return RB_OK;
}

rb_status rb_kvcodec_lossless_decode(const rb_kvcodec_dims *d, const uint8_t *src, size_t size,
                                     rb_f16 *page, rb_kvcodec_hash *hash,
                                     const rb_kvcodec_kernels *k, rb_error *err)
{
    const uint32_t P = d->n_tokens;
    const uint8_t *p = src, *end = src + size;
    rb_f16 *x = page;
    dtable tabs[8], ctab[KMAX]; /* the decode slots; a chunk's codes */
    int slot[8] = {-1, -1, -1, -1, -1, -1, -1, -1}; /* the code in each slot */
    /* the symbol entries of a head of SCRATCH_MIN..SCRATCH values land
     * here, not in the page: the page's first touch is then the merge's
     * sequential stores instead of the symbol loops' strided ones, which
     * waited on the destination's cache misses (qwen3-0.6b shape, 64 KiB
     * heads, 64 MiB of pages, thread CPU time, bench_kv -r 5: 1.69-1.72
     * -> 1.84-1.91 GB/s) */
    rb_f16 top[SCRATCH] RB_KV_ALIGN32;
    const char *why;
    if (p >= end || *p < RB_KVLL_VERSION_MIN || *p > RB_KVLL_VERSION)
        return rb_error_set(err, p < end && *p > RB_KVLL_VERSION ? RB_E_UNSUPPORTED : RB_E_FORMAT,
                            "kvcodec: lossless payload version %d, this build reads versions "
                            "%d to %d (payloads before version 2 had no version byte)",
                            p < end ? *p : -1, RB_KVLL_VERSION_MIN, RB_KVLL_VERSION);
    const int version = *p++;
    for (int half = 0; half < 2; half++) {
        const uint32_t hd = half ? d->head_dim_v : d->head_dim_k;
        const char *hn = half ? "V" : "K";
        const size_t n = (size_t)P * hd;
        rb_f16 *const y = n >= SCRATCH_MIN && n <= SCRATCH ? top : NULL; /* else in place */
        for (uint32_t h = 0; h < d->n_kv_heads; h++, x += n) {
            rb_f16 *const t = y ? y : x;
            if (p >= end)
                return bad(err, hn, h, "payload truncated before the head");
            const int mode = *p++;
            if (mode == MODE_CLUSTERED && version >= 3) {
                for (uint32_t c0 = 0; c0 < hd; c0 += CHUNK) {
                    const uint32_t nc = hd - c0 < CHUNK ? hd - c0 : CHUNK;
                    const uint32_t ns = nc < 8 ? nc : 8;
                    const unsigned w = bit_width(rb_kvll_stream_max_bytes(nc, 0, P));
                    /* 1. the chunk's codes, its channels' code indices, its
                     * streams' lengths */
                    hdrrd hr = {p, end, 0, 0, 0};
                    int single[KMAX];
                    uint32_t K;
                    if ((why = read_codes(&hr, ctab, single, &K)))
                        return bad(err, hn, h, why);
                    const unsigned wk = bit_width(K - 1);
                    uint8_t idx[CHUNK];
                    for (uint32_t c = 0; c < nc; c++) {
                        idx[c] = (uint8_t)get(&hr, wk);
                        if (idx[c] >= K)
                            return bad(err, hn, h, "channel names a code beyond the chunk's");
                    }
                    uint64_t len[8], sum = 0;
                    for (uint32_t j = 0; j < ns; j++) {
                        if ((why = stream_len(&hr, w, rb_kvll_stream_max_bytes(nc, j, P),
                                              &len[j])))
                            return bad(err, hn, h, why);
                        sum += len[j];
                    }
                    if (hr.overrun)
                        return bad(err, hn, h, "descriptor truncated");
                    p = hdr_end(&hr);
                    if (sum > (size_t)(end - p))
                        return bad(err, hn, h, "streams run past the payload");
                    bstream r[8];
                    for (uint32_t j = 0; j < ns; j++) {
                        start_stream(&r[j], p);
                        p += len[j];
                    }
                    /* 2. eight channels at a time, stream j going on with
                     * channel c + j where channel c + j - 8 ended; each slot
                     * a copy of its channel's table (copied only when the
                     * slot's code changes) */
                    for (uint32_t c = 0; c < nc; c += 8)
                        decode_group(r, tabs, slot, ctab, idx + c,
                                     nc - c < 8 ? (int)(nc - c) : 8, t + c0 + c, P, hd, end);
                    rb_status st = check_streams(r, len, (int)ns, err, hn, h);
                    if (st != RB_OK)
                        return st;
                    for (int j = 0; j < 8; j++)
                        slot[j] = -1; /* the next chunk's tables are new */
                }
            } else if (mode == MODE_CLUSTERED) { /* version 2: a stream per channel */
                const unsigned w = bit_width(P);
                for (uint32_t c0 = 0; c0 < hd; c0 += CHUNK) {
                    const uint32_t nc = hd - c0 < CHUNK ? hd - c0 : CHUNK;
                    /* 1. the chunk's codes, and its channels' fields */
                    hdrrd hr = {p, end, 0, 0, 0};
                    int single[KMAX];
                    uint32_t K;
                    if ((why = read_codes(&hr, ctab, single, &K)))
                        return bad(err, hn, h, why);
                    const unsigned wk = bit_width(K - 1);
                    uint8_t idx[CHUNK];
                    uint32_t len[CHUNK];
                    uint64_t sum = 0;
                    for (uint32_t c = 0; c < nc; c++) {
                        uint64_t l = 0;
                        idx[c] = (uint8_t)get(&hr, wk);
                        if (idx[c] >= K)
                            return bad(err, hn, h, "channel names a code beyond the chunk's");
                        if (!single[idx[c]] && (why = stream_len(&hr, w, P, &l)))
                            return bad(err, hn, h, why);
                        if (hr.overrun)
                            return bad(err, hn, h, "descriptor truncated");
                        len[c] = (uint32_t)l;
                        sum += l;
                    }
                    p = hdr_end(&hr);
                    if (sum > (size_t)(end - p))
                        return bad(err, hn, h, "streams run past the payload");
                    /* 2. eight channels at a time, each with a copy of its
                     * code's table (copied only when the slot's code changes) */
                    for (uint32_t c = 0; c < nc; c += 8) {
                        const int ns = nc - c < 8 ? (int)(nc - c) : 8;
                        bstream r[8];
                        uint64_t l8[8];
                        for (int j = 0; j < ns; j++) {
                            start_stream(&r[j], p);
                            l8[j] = len[c + j];
                            p += len[c + j];
                        }
                        decode_group(r, tabs, slot, ctab, idx + c, ns, t + c0 + c, P, hd, end);
                        rb_status st = check_streams(r, l8, ns, err, hn, h);
                        if (st != RB_OK)
                            return st;
                    }
                    for (int j = 0; j < 8; j++)
                        slot[j] = -1; /* the next chunk's tables are new */
                }
            } else if (mode == MODE_SHARED && n >= 8) {
                /* one code, 8 streams: stream j holds values j, j + 8, ... */
                hdrrd hr = {p, end, 0, 0, 0};
                int single;
                uint64_t len[8] = {0}, sum = 0;
                if ((why = read_desc(&hr, &ctab[0], &single)))
                    return bad(err, hn, h, why);
                const unsigned w = bit_width((n + 7) / 8);
                for (int j = 0; j < 8 && !single; j++) {
                    if ((why = stream_len(&hr, w, (n + 7) / 8, &len[j])))
                        return bad(err, hn, h, why);
                    sum += len[j];
                }
                p = hdr_end(&hr);
                if (sum > (size_t)(end - p))
                    return bad(err, hn, h, "streams run past the payload");
                bstream r[8];
                for (int j = 0; j < 8; j++) {
                    start_stream(&r[j], p);
                    p += len[j];
                }
                decode_8sh(r, &ctab[0], t, n / 8, end);
                for (size_t j = 0; j < n % 8; j++)
                    decode_1(&r[j], &ctab[0], t + n / 8 * 8 + j, 1, 1, end);
                rb_status st = check_streams(r, len, 8, err, hn, h);
                if (st != RB_OK)
                    return st;
            } else {
                return bad(err, hn, h, "unknown context mode");
            }
            const size_t mant = n + (n + 3) / 4;
            if (mant > (size_t)(end - p))
                return bad(err, hn, h, "mantissa bytes run past the payload");
            k->merge(x, t, p, p + n, n, hash);
            p += mant;
        }
    }
    if (p != end)
        return rb_error_set(err, RB_E_FORMAT, "kvcodec: lossless payload has %zu bytes after "
                            "its last head", (size_t)(end - p));
    return RB_OK;
}
