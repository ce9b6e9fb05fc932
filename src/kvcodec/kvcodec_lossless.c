/*
 * kvcodec_lossless.c - the bit-exact KV codec: fp16 split into its 6 sign +
 * exponent bits, entropy-coded with static canonical Huffman codes, and its
 * 10 mantissa bits, stored raw (they are close to uniform: the gain is in
 * sign and exponent, whose distribution is narrow per channel).
 *
 * Contexts. Each head of each half (K, V) is coded in one of two modes,
 * whichever is smaller for that head:
 *   CLUSTERED  the head's channels, in chunks of 128, share up to 32 codes:
 *              each channel's symbols (over the tokens) are one stream,
 *              coded with the code its index names. Keys have per-channel
 *              scales (outlier channels, RoPE pairs), so a code per channel
 *              is their natural model, but at 128-256 symbols a channel the
 *              descriptor and the decoder's table build cost as much as the
 *              code saves: channels that look alike share one.
 *   SHARED     one code for the whole head, 8 streams over its values in
 *              row order (stream j: values j, j + 8, ...): for values,
 *              whose channels look alike, and short pages.
 * (A per-token code for V, as for the lossy layout, was not used: 64
 * symbols cannot pay for a table.)
 *
 * The encoder's clustering (per chunk): agglomerative, every channel its
 * own cluster at first, merging the pair whose merge adds the fewest
 * estimated bits (order-0 entropy + descriptor bits) all the way down;
 * the assignment kept is the cheapest with at most 32 clusters, counting
 * each channel's index bits. Chunks of up to 64 channels consider every
 * pair; wider ones (qwen3's 128) sort the channels by mean exponent and a
 * cluster merges only with one of its next 2 in that order (~6 estimates
 * a merge instead of ~128). Then one pass moves each channel to the code
 * that takes it in the fewest real Huffman bits, the codes rebuilt, kept
 * if that shrinks the chunk.
 *
 * Payload: version byte (3; 2 is still decoded, see below; the payloads
 * before 2 had none and began with a mode byte 0 or 1), then per half (K
 * then V), per head:
 *   mode byte (0 CLUSTERED, 1 SHARED)
 *   CLUSTERED: per chunk of nc = min(128, hd - c0) channels:
 *                [K-1: u(5) | K x desc | per channel: index u(wk) | per
 *                stream j < ns = min(8, nc): its bytes u(w)], byte
 *                aligned, then the ns streams, each byte aligned: stream
 *                j holds channels j, j + 8, j + 16, ... (P symbols each)
 *                back to back, bit after bit; wk = bit width of K - 1,
 *                w = bit width of stream 0's largest size,
 *                ceil(ceil(nc / 8) x P x 7 / 8) (rb_kvll_stream_max_bytes)
 *   (version 2's CLUSTERED: per channel index u(wk), and unless its code
 *   is single, stream bytes u(bit width of P); then a stream per channel,
 *   each byte aligned. At 71-token pages its length fields and padding
 *   were 1.1% of the frame (qwen3-0.6b, bench_kv: per channel 7 bits of
 *   length and 3.5 of padding on ~156 bits of symbols); version 3 keeps
 *   8 of each a chunk: 94.2% -> 95.2% of the entropy bound.)
 *   SHARED:      [desc | 8 x stream bytes: u(w), unless single], aligned,
 *                the 8 streams (w = bit width of ceil(n/8))
 *   lo8[n]       mantissa bits 0-7 of the head's n = P x hd values
 *   hi2[ceil(n/4)] mantissa bits 8-9: per 32 values 8 bytes, byte j holding
 *                values j, j+8, j+16, j+24 at bits 0, 2, 4, 6; the n % 32
 *                left over packed in order (value k at bit 2k)
 * desc (LSB-first bits): single(1); single: symbol(6), no stream; else
 *   signs(2: bit 0 positive present, bit 1 negative), e_lo(5), e_cnt-1(5),
 *   then per present sign, per exponent in [e_lo, e_lo + e_cnt): length(3),
 *   0 = unused, 1..7. (A symbol takes at most 7 bits, so a stream has at
 *   most as many bytes as symbols.)
 * Symbol streams are MSB-first; codes are canonical (by length, then
 * symbol), at most 7 bits long and complete (Kraft sum exactly 1: the
 * decoder checks), so a decode table indexed by the next 7 bits has no
 * invalid entry, and each symbol owns one run of it.
 *
 * Why these numbers: 7-bit codes (8 symbols per 64-bit load, half-size
 * tables), up to 32 clustered codes a chunk (a code per channel cost the
 * decoder 30% in table builds), SHARED's 8 interleaved streams, the
 * encoder's neighbour-only merges for wide chunks: each was measured
 * against its alternatives with bench_kv; the figures and what was tried
 * and dropped are in docs/notes/kvcodec-lossless.md.
 *
 * Decoding (kvcodec_lossless_dec.c): per code a table (entry = symbol <<
 * 10 | length), copied into one of 8 slots for the channels that use it.
 * Streams are decoded 8 in lockstep (CLUSTERED: 8 adjacent channels, each
 * stream going on where its previous channel ended), because one stream is a chain of
 * dependent operations (shift, table load, shift: ~7 cycles a symbol);
 * with four channels it ran at 1.3 GB/s, with eight 1.5 (then 1.9 with
 * the descriptor and shift work trimmed). Each symbol lands as entry in a
 * stack scratch (heads of 8192 to 32768 values; others in the page
 * itself); a second pass keeps its top 6 bits, ORs in the mantissa,
 * writes the page and hashes it from the registers (the page written
 * once, in order: 1.7 -> 1.85-1.9 GB/s on the qwen3-0.6b shape). Profile
 * now (qwen3): symbol loop ~60%, merge + hash ~28%, tables ~10%. Reads
 * may run past a stream's own bytes (never past the payload): each
 * stream's consumed bits must afterwards equal its declared bytes.
 *
 * Memory: stack only (the encoder: ~130 KiB of clustering state, two
 * 128 x 64 histogram sets and a 128 x 128 pair-cost matrix; the decoder:
 * 8 + 32 tables of 144 x 2 bytes and a 64 KiB scratch of symbol entries).
 */
#include <inttypes.h>
#include <string.h>

#include "kvcodec_internal.h"
#include "status.h"


#define MAXLEN RB_KVLL_MAXLEN
#define NSYM RB_KVLL_NSYM
#define bit_width rb_kvll_bit_width
enum { MODE_CLUSTERED = RB_KVLL_CLUSTERED, MODE_SHARED = RB_KVLL_SHARED };
#define CHUNK RB_KVLL_CHUNK
#define KMAX RB_KVLL_KMAX

/* ---- codes ------------------------------------------------------------------ */

typedef struct hcode {
    uint8_t len[NSYM];   /* 0: unused */
    uint16_t code[NSYM]; /* canonical code, MSB first */
    int single;          /* -1, or the one symbol used (no bits) */
} hcode;

/* Huffman lengths limited to MAXLEN with an exactly complete code.
 * hist has at least 2 nonzero entries. Leaves sorted by count (insertion
 * sort: n <= 64, typically ~15), then the two-queue merge (leaves and
 * internal nodes both come out in nondecreasing weight), O(n) after the
 * sort. */
static void build_lengths(const uint32_t *hist, uint8_t *len)
{
    uint64_t w[2 * NSYM];
    int parent[2 * NSYM], leaf[NSYM], nl = 0;
    memset(len, 0, NSYM);
    for (int s = 0; s < NSYM; s++) {
        if (!hist[s])
            continue;
        int i = nl++;
        for (; i > 0 && hist[leaf[i - 1]] > hist[s]; i--)
            leaf[i] = leaf[i - 1];
        leaf[i] = s;
    }
    for (int i = 0; i < nl; i++) {
        w[i] = hist[leaf[i]];
        parent[i] = -1;
    }
    int qa = 0, qb = nl, n = nl; /* next leaf, next internal node, next free */
    while (n < 2 * nl - 1) {
        int pick[2];
        for (int k = 0; k < 2; k++)
            pick[k] = (qa < nl && (qb >= n || w[qa] <= w[qb])) ? qa++ : qb++;
        w[n] = w[pick[0]] + w[pick[1]];
        parent[n] = -1;
        parent[pick[0]] = parent[pick[1]] = n++;
    }
    int over = 0, depth[2 * NSYM];
    depth[n - 1] = 0; /* parents come after their children: one pass down */
    for (int i = n - 2; i >= 0; i--)
        depth[i] = depth[parent[i]] + 1;
    for (int i = 0; i < nl; i++) {
        len[leaf[i]] = (uint8_t)(depth[i] > MAXLEN ? MAXLEN : depth[i]);
        over |= depth[i] > MAXLEN;
    }
    if (!over)
        return;
    /* Kraft in units of 2^-MAXLEN; lengthen the rarest codes below MAXLEN
     * until the sum fits, then shorten the commonest while it still fits,
     * which ends at exactly 2^MAXLEN (every step moves by a power of 2 no
     * larger than the remaining gap). Rare: it takes counts spanning ~2^7. */
    uint32_t kraft = 0;
    for (int s = 0; s < NSYM; s++)
        if (len[s])
            kraft += 1u << (MAXLEN - len[s]);
    /* (leaf is in order of count, then symbol: the rarest first) */
    while (kraft > (1u << MAXLEN)) {
        int i = 0;
        while (len[leaf[i]] >= MAXLEN)
            i++;
        kraft -= 1u << (MAXLEN - len[leaf[i]] - 1);
        len[leaf[i]]++;
    }
    for (int i = nl - 1; i >= 0 && kraft < (1u << MAXLEN);) {
        /* the commonest that still fits (a step only makes it tighter) */
        const int s = leaf[i];
        if (len[s] > 1 && kraft + (1u << (MAXLEN - len[s])) <= (1u << MAXLEN)) {
            kraft += 1u << (MAXLEN - len[s]);
            len[s]--;
        } else {
            i--;
        }
    }
}

/* Canonical codes from lengths: by length, then symbol (the encoder's
 * side; the decoder builds the same order from its length buckets). */
static void assign_codes(hcode *hc)
{
    /* length by length (no indexed increments: clang 14 -O2 with AVX-512
     * vectorized `code[s] = next[len[s]]++` into wrong codes) */
    uint32_t code = 0;
    for (int l = 1; l <= MAXLEN; l++, code <<= 1)
        for (int s = 0; s < NSYM; s++)
            if (hc->len[s] == l)
                hc->code[s] = (uint16_t)code++;
}

/* lengths only (codes == 0) until assign_codes: the refinement compares
 * sizes, and only the kept codes are written */
static void make_lengths(const uint32_t *hist, hcode *hc)
{
    int used = 0, last = 0;
    for (int s = 0; s < NSYM; s++) {
        used += hist[s] != 0;
        last = hist[s] ? s : last;
    }
    memset(hc, 0, sizeof *hc);
    hc->single = used == 1 ? last : -1;
    if (used > 1)
        build_lengths(hist, hc->len);
}

static void make_code(const uint32_t *hist, hcode *hc)
{
    make_lengths(hist, hc);
    if (hc->single < 0)
        assign_codes(hc);
}

static uint64_t code_bits(const hcode *hc, const uint32_t *hist)
{
    uint64_t b = 0;
    for (int s = 0; s < NSYM; s++)
        b += (uint64_t)hist[s] * hc->len[s];
    return b;
}

static void exp_range(const hcode *hc, int *signs, int *lo, int *cnt)
{
    int l = 32, h = -1;
    *signs = 0;
    for (int s = 0; s < NSYM; s++)
        if (hc->len[s]) {
            *signs |= 1 << (s >> 5);
            l = (s & 31) < l ? (s & 31) : l;
            h = (s & 31) > h ? (s & 31) : h;
        }
    *lo = l;
    *cnt = h - l + 1;
}

static unsigned desc_bits(const hcode *hc)
{
    if (hc->single >= 0)
        return 7;
    int signs, lo, cnt;
    exp_range(hc, &signs, &lo, &cnt);
    return 13 + 3u * (unsigned)cnt * (unsigned)((signs & 1) + (signs >> 1));
}

/* ---- bit writer (encoder) ------------------------------------------------------ */

typedef struct bitwr {
    uint8_t *p;
    uint64_t acc;
    unsigned n;
} bitwr;

static inline void put(bitwr *w, uint32_t v, unsigned nb)
{
    w->acc |= (uint64_t)v << w->n;
    w->n += nb;
    while (w->n >= 8) {
        *w->p++ = (uint8_t)w->acc;
        w->acc >>= 8;
        w->n -= 8;
    }
}

static inline void flush(bitwr *w)
{
    if (w->n)
        *w->p++ = (uint8_t)w->acc;
    w->acc = 0;
    w->n = 0;
}

static void put_desc(bitwr *w, const hcode *hc)
{
    if (hc->single >= 0) {
        put(w, 1, 1);
        put(w, (uint32_t)hc->single, 6);
        return;
    }
    int signs, lo, cnt;
    exp_range(hc, &signs, &lo, &cnt);
    put(w, 0, 1);
    put(w, (uint32_t)signs, 2);
    put(w, (uint32_t)lo, 5);
    put(w, (uint32_t)cnt - 1, 5);
    for (int sg = 0; sg < 2; sg++)
        if (signs >> sg & 1)
            for (int e = lo; e < lo + cnt; e++)
                put(w, hc->len[sg << 5 | e], 3);
}

/* ---- encoder --------------------------------------------------------------------- */

/* Estimated bits of a code for hist: its order-0 entropy plus its
 * descriptor (what the clustering minimizes; the final choice uses the
 * real Huffman lengths). */
/* log2 to ~0.005 (a quadratic on the mantissa): estimates only */
static inline float approx_log2(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    const float e = (float)((int)(u >> 23) - 127);
    u = (u & 0x7fffff) | 0x3f800000;
    float m;
    memcpy(&m, &u, 4);
    return e + (-0.34484843f * m + 2.02466578f) * m - 0.67487759f;
}

/* mask: the symbols present (bit s). Branch-free over the 64 counts, so
 * that it vectorizes: the clustering's inner loop (~2 x 128^2 calls a
 * chunk of 128 channels). */
static float est_bits(const uint32_t *hist, uint64_t mask)
{
    uint32_t n = 0;
    float part[8] = {0}; /* 8 lanes: a float sum in order would not vectorize */
    for (int s = 0; s < NSYM; s += 8)
        for (int k = 0; k < 8; k++) {
            const float c = (float)hist[s + k];
            n += hist[s + k];
            part[k] += c * approx_log2(c); /* (0 x finite for c = 0) */
        }
    const float tot = (float)n;
    const float nlogn = ((part[0] + part[1]) + (part[2] + part[3])) +
                        ((part[4] + part[5]) + (part[6] + part[7]));
    if (!(mask & (mask - 1)))
        return 7;
    const uint32_t e = (uint32_t)mask | (uint32_t)(mask >> 32);
    const int signs = ((uint32_t)mask != 0) + ((mask >> 32) != 0);
    const int cnt = 32 - __builtin_clz(e) - __builtin_ctz(e);
    return tot * approx_log2(tot) - nlogn + 13 + 3.0f * (float)(cnt * signs);
}

static float merged_bits(const uint32_t *a, const uint32_t *b, uint64_t mask)
{
    uint32_t m[NSYM];
    for (int s = 0; s < NSYM; s++)
        m[s] = a[s] + b[s];
    return est_bits(m, mask);
}

/* The clustering of one chunk of nc <= 2 x KMAX channels (wider ones:
 * cluster_sorted): cl[c] in [0, K), returns K <= KMAX. Agglomerative: every channel starts as its own
 * cluster; the pair whose merge costs the fewest estimated bits merges,
 * down to one cluster, and the assignment kept is the one with the fewest
 * estimated bits (table index bits included) among those with at most
 * KMAX clusters. Pair costs are kept in a matrix and each cluster keeps
 * its best partner among the later ones: a merge re-estimates only the
 * merged cluster's pairs, ~nc^2 estimates a chunk in all. */
/* A clustering step with k clusters (total estimated bits, label[i] the
 * cluster of the i-th channel in the order ord, NULL: channel order): if
 * k fits and it is the cheapest so far counting the index bits, out
 * receives its labels compacted to 0..k-1 in order of first use. */
static void keep_if_best(double total, int nc, int k, const int *label, const int *ord,
                         uint8_t *out, double *best, int *best_k)
{
    if (k > KMAX)
        return;
    const double t = total + (double)nc * bit_width((uint64_t)k - 1);
    if (*best_k && t >= *best)
        return;
    *best = t;
    *best_k = k;
    int map[CHUNK], next = 0;
    for (int i = 0; i < nc; i++)
        map[i] = -1;
    for (int i = 0; i < nc; i++) {
        if (map[label[i]] < 0)
            map[label[i]] = next++;
        out[ord ? ord[i] : i] = (uint8_t)map[label[i]];
    }
}

typedef struct cluster_ws {
    uint32_t ch[CHUNK][NSYM]; /* channel histograms */
    uint32_t cl[CHUNK][NSYM]; /* cluster histograms (live clusters) */
    float gain[CHUNK][CHUNK]; /* [i][j], i < j: bits a merge of i and j adds */
} cluster_ws;

static int cluster_channels(cluster_ws *ws, int nc, uint8_t *out)
{
    float bits[CHUNK];
    int partner[CHUNK], label[CHUNK], alive[CHUNK];
    uint64_t mask[CHUNK];
    double total = 0;
    for (int i = 0; i < nc; i++) {
        memcpy(ws->cl[i], ws->ch[i], sizeof ws->cl[i]);
        mask[i] = 0;
        for (int s = 0; s < NSYM; s++)
            mask[i] |= (uint64_t)(ws->cl[i][s] != 0) << s;
        bits[i] = est_bits(ws->cl[i], mask[i]);
        total += bits[i];
        label[i] = i;
        alive[i] = 1;
    }
#define PAIR(i, j) (ws->gain[i][j] = merged_bits(ws->cl[i], ws->cl[j], mask[i] | mask[j]) - \
                                     bits[i] - bits[j])
#define RESCAN(i)                                                                 \
    do {                                                                          \
        partner[i] = -1;                                                          \
        for (int j_ = (i) + 1; j_ < nc; j_++)                                     \
            if (alive[j_] && (partner[i] < 0 || ws->gain[i][j_] < ws->gain[i][partner[i]])) \
                partner[i] = j_;                                                  \
    } while (0)
    const int k0 = nc;
    for (int i = 0; i < nc; i++)
        for (int j = i + 1; j < nc; j++)
            if (alive[i] && alive[j])
                PAIR(i, j);
    for (int i = 0; i < nc; i++)
        if (alive[i])
            RESCAN(i);
    double best = 0;
    int best_k = 0;
    for (int k = k0; k >= 1; k--) {
        keep_if_best(total, nc, k, label, NULL, out, &best, &best_k);
        if (k == 1)
            break;
        int a = -1; /* the cheapest merge: a with its partner (a < partner) */
        for (int i = 0; i < nc; i++)
            if (alive[i] && partner[i] >= 0 &&
                (a < 0 || ws->gain[i][partner[i]] < ws->gain[a][partner[a]]))
                a = i;
        const int b = partner[a];
        const float g = ws->gain[a][b];
        for (int s = 0; s < NSYM; s++)
            ws->cl[a][s] += ws->cl[b][s];
        mask[a] |= mask[b];
        total += g;
        bits[a] += bits[b] + g;
        alive[b] = 0;
        for (int c = 0; c < nc; c++)
            if (label[c] == b)
                label[c] = a;
        for (int i = 0; i < nc; i++)
            if (alive[i] && i != a) {
                if (i < a)
                    PAIR(i, a);
                else
                    PAIR(a, i);
            }
        /* partners: rescanned for a and for those that pointed at a or b;
         * the merged a may now be the best for the others before it */
        for (int i = 0; i < nc; i++) {
            if (!alive[i])
                continue;
            if (i == a || partner[i] == a || partner[i] == b)
                RESCAN(i);
            else if (i < a && partner[i] >= 0 && ws->gain[i][a] < ws->gain[i][partner[i]])
                partner[i] = a;
        }
    }
#undef PAIR
#undef RESCAN
    return best_k;
}

/* Wide chunks (more than 2 x KMAX channels): the same agglomeration, but
 * with channels in order of mean exponent (a channel's scale) and a
 * cluster merging only with one of the next WINDOW live clusters in that
 * order: ~(WINDOW + 1) x WINDOW estimates a merge instead of ~nc, the
 * window's pair costs kept. The refinement by real bits then moves the
 * channels the order put in the wrong cluster. (qwen3, its 28 pages:
 * window 1 1.2455 at 4 refinement passes, 2 1.2535, 3 1.2546 at ~15% less
 * speed, 4 1.2554 at half the speed.) */
#define WINDOW 2
/* gain[a]: the cheapest merge of cluster a with one of its next WINDOW
 * (pj[a]); wj/wg keep the window's pairs, reused unless a pair holds chg
 * (the cluster a merge just changed) */
typedef struct window {
    int j[CHUNK][WINDOW];
    float g[CHUNK][WINDOW];
} window;

static void ngain(cluster_ws *ws, int a, int chg, const int *nxt, const uint64_t *mask,
                  const float *bits, float *gain, int *pj, window *wn)
{
    gain[a] = 1e30f;
    int nj[WINDOW], w = 0;
    float ng[WINDOW];
    for (int j = nxt[a]; j >= 0 && w < WINDOW; j = nxt[j], w++) {
        int o = -1;
        if (a != chg && j != chg)
            for (int k = 0; k < WINDOW; k++)
                o = wn->j[a][k] == j ? k : o;
        const float g = o >= 0 ? wn->g[a][o]
                               : merged_bits(ws->cl[a], ws->cl[j], mask[a] | mask[j]) - bits[a] -
                                     bits[j];
        nj[w] = j, ng[w] = g;
        if (g < gain[a])
            gain[a] = g, pj[a] = j;
    }
    for (int k = 0; k < WINDOW; k++) {
        wn->j[a][k] = k < w ? nj[k] : -1;
        wn->g[a][k] = k < w ? ng[k] : 0;
    }
}

static int cluster_sorted(cluster_ws *ws, int nc, uint8_t *out)
{
    int ord[CHUNK], nxt[CHUNK], prv[CHUNK], label[CHUNK], pj[CHUNK];
    float key[CHUNK], bits[CHUNK], gain[CHUNK];
    uint64_t mask[CHUNK];
    double total = 0;
    for (int i = 0; i < nc; i++) {
        uint32_t n = 0, se = 0;
        for (int s = 0; s < NSYM; s++)
            n += ws->ch[i][s], se += ws->ch[i][s] * (uint32_t)(s & 31);
        key[i] = (float)se / (float)n;
        int j = i;
        for (; j > 0 && key[ord[j - 1]] > key[i]; j--)
            ord[j] = ord[j - 1];
        ord[j] = i;
    }
    /* cluster oi: the channel ord[oi] at first; a merge keeps the earlier */
    for (int oi = 0; oi < nc; oi++) {
        const int i = ord[oi];
        memcpy(ws->cl[oi], ws->ch[i], sizeof ws->cl[oi]);
        mask[oi] = 0;
        for (int s = 0; s < NSYM; s++)
            mask[oi] |= (uint64_t)(ws->cl[oi][s] != 0) << s;
        bits[oi] = est_bits(ws->cl[oi], mask[oi]);
        total += bits[oi];
        label[oi] = oi;
        nxt[oi] = oi + 1 < nc ? oi + 1 : -1;
        prv[oi] = oi - 1;
    }
    window wn;
    int chg = -1;
    memset(wn.j, -1, sizeof wn.j[0] * (size_t)nc);
#define NGAIN(a) ngain(ws, a, chg, nxt, mask, bits, gain, pj, &wn)
    for (int oi = 0; oi < nc; oi++)
        NGAIN(oi);
    double best = 0;
    int best_k = 0;
    for (int k = nc; k >= 1; k--) {
        keep_if_best(total, nc, k, label, ord, out, &best, &best_k);
        if (k == 1)
            break;
        int a = 0; /* (the dead and the last have gain 1e30) */
        for (int i = 1; i < nc; i++)
            a = gain[i] < gain[a] ? i : a;
        const int b = pj[a];
        gain[b] = 1e30f;
        for (int s = 0; s < NSYM; s++)
            ws->cl[a][s] += ws->cl[b][s];
        mask[a] |= mask[b];
        total += gain[a];
        bits[a] += bits[b] + gain[a];
        for (int oi = b; oi < nc; oi++)
            label[oi] = label[oi] == b ? a : label[oi];
        const int pb = prv[b];
        chg = a;
        nxt[pb] = nxt[b];
        if (nxt[b] >= 0)
            prv[nxt[b]] = pb;
        for (int i = a, w = 0; i >= 0 && w <= WINDOW; i = prv[i], w++)
            NGAIN(i);
        for (int i = pb, w = 0; i > a && w < WINDOW; i = prv[i], w++)
            NGAIN(i); /* (a and before: done) */
    }
#undef NGAIN
    return best_k;
}

/* Symbol streams are MSB-first (the decoder peeks the top bits, so that a
 * code's table entries form one run: cheap to fill per channel). */
static void put_symbols(bitwr *w, const hcode *hc, const rb_f16 *x, size_t n, size_t stride)
{
    if (hc->single >= 0)
        return;
    uint64_t acc = 0;
    unsigned nb = 0;
    uint8_t *p = w->p;
    for (size_t i = 0; i < n; i++) {
        unsigned s = x[i * stride] >> 10;
        acc = acc << hc->len[s] | hc->code[s];
        nb += hc->len[s];
        if (nb >= 32) {
            nb -= 32;
            uint32_t v = (uint32_t)(acc >> nb);
            p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16);
            p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
            p += 4;
        }
    }
    while (nb >= 8) {
        nb -= 8;
        *p++ = (uint8_t)(acc >> nb);
    }
    if (nb)
        *p++ = (uint8_t)(acc << (8 - nb));
    w->p = p;
}

/* An MSB-first stream being written across several channels: the bits
 * not yet stored are the low n of a. */
typedef struct lane {
    uint8_t *p;
    uint64_t a;
    unsigned n; /* < 32 between symbols */
} lane;

#define LANE_PUT(L, hc_, s_)                                                       \
    do {                                                                           \
        (L).a = (L).a << (hc_)->len[s_] | (hc_)->code[s_];                         \
        (L).n += (hc_)->len[s_];                                                   \
        if ((L).n >= 32) {                                                         \
            (L).n -= 32;                                                           \
            const uint32_t v_ = (uint32_t)((L).a >> (L).n);                        \
            (L).p[0] = (uint8_t)(v_ >> 24), (L).p[1] = (uint8_t)(v_ >> 16);        \
            (L).p[2] = (uint8_t)(v_ >> 8), (L).p[3] = (uint8_t)v_;                 \
            (L).p += 4;                                                            \
        }                                                                          \
    } while (0)

/* Appends channel x (n symbols, stride apart) to the lane; a single
 * code's channel adds nothing (its lengths are 0). */
static void put_symbols_lane(lane *l, const hcode *hc, const rb_f16 *x, size_t n, size_t stride)
{
    lane L = *l;
    for (size_t i = 0; i < n && hc->single < 0; i++) {
        const unsigned s = x[i * stride] >> 10;
        LANE_PUT(L, hc, s);
    }
    *l = L;
}

/* put_symbols_lane for channels x[0..3] (stride apart per token), channel
 * j appended to l[j]: four independent shift chains. */
static void put_symbols4(const hcode *const *hc, const rb_f16 *x, size_t n, size_t stride,
                         lane *l)
{
    lane L0 = l[0], L1 = l[1], L2 = l[2], L3 = l[3];
    for (size_t i = 0; i < n; i++) {
        const rb_f16 *row = x + i * stride;
        const unsigned s0 = row[0] >> 10, s1 = row[1] >> 10, s2 = row[2] >> 10, s3 = row[3] >> 10;
        LANE_PUT(L0, hc[0], s0);
        LANE_PUT(L1, hc[1], s1);
        LANE_PUT(L2, hc[2], s2);
        LANE_PUT(L3, hc[3], s3);
    }
    l[0] = L0, l[1] = L1, l[2] = L2, l[3] = L3;
}
#undef LANE_PUT

/* The lane's last bits, zero-padded to a byte. */
static void lane_flush(lane *l)
{
    while (l->n >= 8) {
        l->n -= 8;
        *l->p++ = (uint8_t)(l->a >> l->n);
    }
    if (l->n)
        *l->p++ = (uint8_t)(l->a << (8 - l->n));
    l->n = 0;
}

/* A chunk's codes for an assignment: builds them, returns its bytes
 * (header and its min(8, nc) streams, each byte-aligned; w: the width of
 * a stream's length field). Clusters left empty are
 * dropped (cl renumbered, *k updated). */
static uint64_t chunk_codes(const cluster_ws *ws, int nc, uint8_t *cl, int *k, hcode *hc,
                            unsigned w)
{
    int map[KMAX], n = 0;
    for (int i = 0; i < *k; i++)
        map[i] = -1;
    for (int c = 0; c < nc; c++) {
        if (map[cl[c]] < 0)
            map[cl[c]] = n++;
        cl[c] = (uint8_t)map[cl[c]];
    }
    *k = n;
    uint32_t h[KMAX][NSYM];
    memset(h, 0, sizeof h);
    for (int c = 0; c < nc; c++)
        for (int s = 0; s < NSYM; s++)
            h[cl[c]][s] += ws->ch[c][s];
    const int ns = nc < 8 ? nc : 8;
    uint64_t hdr = 5 + (uint64_t)ns * w, body = 0, sb[8] = {0};
    for (int i = 0; i < n; i++) {
        make_lengths(h[i], &hc[i]);
        hdr += desc_bits(&hc[i]);
    }
    for (int c = 0; c < nc; c++) {
        hdr += bit_width((uint64_t)n - 1);
        sb[c & 7] += code_bits(&hc[cl[c]], ws->ch[c]);
    }
    for (int j = 0; j < ns; j++)
        body += (sb[j] + 7) / 8;
    return (hdr + 7) / 8 + body;
}

/* Clusters chunk channels c0..c0+nc-1 of the head at x and writes the
 * chunk: header, then the channels' streams. NULL when it would reach
 * end. */
static uint8_t *encode_chunk(const rb_f16 *x, uint32_t P, uint32_t hd, uint32_t c0, int nc,
                             cluster_ws *ws, uint32_t (*total)[NSYM], uint8_t *p, const uint8_t *end)
{
    memset(ws->ch, 0, sizeof ws->ch[0] * (size_t)nc);
    for (uint32_t t = 0; t < P; t++) {
        const rb_f16 *row = x + (size_t)t * hd + c0;
        for (int c = 0; c < nc; c++)
            ws->ch[c][row[c] >> 10]++;
    }
    for (int c = 0; c < nc; c++)
        for (int s = 0; s < NSYM; s++)
            total[(c0 + (uint32_t)c) & 7][s] += ws->ch[c][s];
    const unsigned w = bit_width(rb_kvll_stream_max_bytes((uint32_t)nc, 0, P));
    uint8_t cl[CHUNK], cl2[CHUNK];
    hcode hc[KMAX], hc2[KMAX];
    int k = nc > 2 * KMAX ? cluster_sorted(ws, nc, cl) : cluster_channels(ws, nc, cl);
    uint64_t bytes = chunk_codes(ws, nc, cl, &k, hc, w);
    /* refinement: each channel to the code that takes it in the fewest
     * bits, codes rebuilt, if that shrinks the chunk; one pass (each costs
     * ~12% of the encoder: 4 passes 1.2535 on qwen3's 28 pages, 2 1.2534,
     * 1 1.2531) */
    uint64_t chm[CHUNK];
    for (int c = 0; c < nc; c++) {
        chm[c] = 0;
        for (int s = 0; s < NSYM; s++)
            chm[c] |= (uint64_t)(ws->ch[c][s] != 0) << s;
    }
    for (int it = 0; it < 1; it++) { /* (a loop: a pass more is one edit) */
        int k2 = k;
        uint32_t ln[KMAX][NSYM];
        uint64_t cm[KMAX];
        for (int i = 0; i < k; i++) {
            cm[i] = hc[i].single >= 0 ? 1ull << hc[i].single : 0;
            for (int s = 0; s < NSYM; s++) {
                ln[i][s] = hc[i].len[s];
                cm[i] |= (uint64_t)(hc[i].len[s] != 0) << s;
            }
        }
        for (int c = 0; c < nc; c++) {
            uint32_t bb = UINT32_MAX;
            for (int i = 0; i < k; i++) {
                if (chm[c] & ~cm[i])
                    continue;
                uint32_t b = 0;
                for (int s = 0; s < NSYM; s++)
                    b += ws->ch[c][s] * ln[i][s];
                if (b < bb)
                    bb = b, cl2[c] = (uint8_t)i;
            }
        }
        if (!memcmp(cl, cl2, (size_t)nc))
            break;
        const uint64_t b2 = chunk_codes(ws, nc, cl2, &k2, hc2, w);
        if (b2 >= bytes)
            break;
        bytes = b2, k = k2;
        memcpy(cl, cl2, (size_t)nc);
        memcpy(hc, hc2, sizeof hc[0] * (size_t)k);
    }
    if ((uint64_t)(end - p) <= bytes)
        return NULL;
    for (int i = 0; i < k; i++)
        if (hc[i].single < 0)
            assign_codes(&hc[i]);
    bitwr wr = {p, 0, 0};
    put(&wr, (uint32_t)k - 1, 5);
    for (int i = 0; i < k; i++)
        put_desc(&wr, &hc[i]);
    const unsigned wk = bit_width((uint64_t)k - 1);
    const int ns = nc < 8 ? nc : 8;
    uint64_t sb[8] = {0};
    for (int c = 0; c < nc; c++) {
        put(&wr, cl[c], wk);
        sb[c & 7] += code_bits(&hc[cl[c]], ws->ch[c]);
    }
    for (int j = 0; j < ns; j++)
        put(&wr, (uint32_t)((sb[j] + 7) / 8), w);
    flush(&wr);
    /* stream j: channels j, j + 8, ... one after another, no padding
     * between them (the decoder's eight lockstep chains go on from where
     * the previous channel ended); four streams at a time, each into its
     * own place (their sizes are known): four independent shift chains */
    lane ln4[8];
    for (int j = 0; j < ns; j++) {
        ln4[j] = (lane){wr.p, 0, 0};
        wr.p += (sb[j] + 7) / 8;
    }
    for (int c = 0; c < nc; c += 8) {
        const int m = nc - c < 8 ? nc - c : 8;
        int j = 0;
        for (; j + 4 <= m; j += 4) {
            const hcode *h4[4] = {&hc[cl[c + j]], &hc[cl[c + j + 1]], &hc[cl[c + j + 2]],
                                  &hc[cl[c + j + 3]]};
            put_symbols4(h4, x + c0 + c + j, P, hd, &ln4[j]);
        }
        for (; j < m; j++)
            put_symbols_lane(&ln4[j], &hc[cl[c + j]], x + c0 + c + j, P, hd);
    }
    for (int j = 0; j < ns; j++)
        lane_flush(&ln4[j]);
    return wr.p;
}

static uint8_t *put_mantissas(uint8_t *p, const rb_f16 *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)x[i];
    p += n;
    /* each byte written once from its four values */
    const size_t full = n / 32;
    for (size_t b = 0; b < full; b++) {
        const rb_f16 *v = x + 32 * b;
        for (int j = 0; j < 8; j++)
            p[8 * b + j] = (uint8_t)((v[j] >> 8 & 3) | (v[j + 8] >> 8 & 3) << 2 |
                                     (v[j + 16] >> 8 & 3) << 4 | (v[j + 24] >> 8 & 3) << 6);
    }
    const size_t rest = n - 32 * full;
    for (size_t k = 0; k < (rest + 3) / 4; k++) {
        unsigned byte = 0;
        for (size_t i = 4 * k; i < 4 * k + 4 && i < rest; i++)
            byte |= (unsigned)(x[32 * full + i] >> 8 & 3) << (2 * (i % 4));
        p[8 * full + k] = (uint8_t)byte;
    }
    return p + (n + 3) / 4;
}

/* One head of one half: n = P x hd values at x. Returns the new write
 * position, or NULL when the bytes would reach end. */
static uint8_t *encode_head(const rb_f16 *x, uint32_t P, uint32_t hd, uint8_t *p,
                            const uint8_t *end, cluster_ws *ws)
{
    const size_t n = (size_t)P * hd, mant = n + (n + 3) / 4;
    /* the histograms of channels c mod 8: those of SHARED's 8 streams when
     * hd is a multiple of 8 */
    uint32_t hs[8][NSYM], total[NSYM];
    memset(hs, 0, sizeof hs);
    if ((size_t)(end - p) <= 1 + mant)
        return NULL;
    uint8_t *const start = p;
    /* 1. CLUSTERED, written as it is sized, the head's histogram summed on
     * the way */
    *p++ = MODE_CLUSTERED;
    for (uint32_t c0 = 0; c0 < hd; c0 += CHUNK) {
        const int nc = hd - c0 < CHUNK ? (int)(hd - c0) : CHUNK;
        if (!(p = encode_chunk(x, P, hd, c0, nc, ws, hs, p, end - mant)))
            return NULL;
    }
    const uint64_t clustered = 8 * (uint64_t)(p - start - 1);
    /* 2. SHARED instead when one code in 8 interleaved streams is smaller
     * (short pages, and values whose channels look alike) */
    if (hd % 8) {
        memset(hs, 0, sizeof hs);
        for (size_t i = 0; i < n; i++)
            hs[i & 7][x[i] >> 10]++;
    }
    for (int s = 0; s < NSYM; s++)
        total[s] = hs[0][s] + hs[1][s] + hs[2][s] + hs[3][s] + hs[4][s] + hs[5][s] + hs[6][s] +
                   hs[7][s];
    hcode shared;
    make_code(total, &shared);
    const unsigned wsh = bit_width((n + 7) / 8);
    uint64_t sh = (desc_bits(&shared) + 8 * wsh + 7) / 8;
    for (int j = 0; j < 8; j++)
        sh += (code_bits(&shared, hs[j]) + 7) / 8;
    if (n >= 8 && 8 * sh < clustered) {
        p = start;
        *p++ = MODE_SHARED;
        bitwr w = {p, 0, 0};
        put_desc(&w, &shared);
        for (int j = 0; j < 8 && shared.single < 0; j++)
            put(&w, (uint32_t)((code_bits(&shared, hs[j]) + 7) / 8), wsh);
        flush(&w);
        /* (fewer bytes than the CLUSTERED ones already written here) */
        for (int j = 0; j < 8; j++) {
            put_symbols(&w, &shared, x + j, (n - (size_t)j + 7) / 8, 8);
            flush(&w);
        }
        p = w.p;
    }
    return put_mantissas(p, x, n);
}

size_t rb_kvcodec_lossless_encode(const rb_kvcodec_dims *d, const rb_f16 *page, uint8_t *dst,
                                  size_t cap)
{
    const uint32_t P = d->n_tokens;
    const uint8_t *end = dst + cap;
    uint8_t *p = dst;
    const rb_f16 *x = page;
    cluster_ws ws;
    if (cap <= 1)
        return 0;
    *p++ = RB_KVLL_VERSION;
    for (int half = 0; half < 2; half++) {
        const uint32_t hd = half ? d->head_dim_v : d->head_dim_k;
        for (uint32_t h = 0; h < d->n_kv_heads; h++, x += (size_t)P * hd)
            if (!(p = encode_head(x, P, hd, p, end, &ws)))
                return 0;
    }
    return (size_t)(p - dst);
}
