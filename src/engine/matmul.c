/*
 * matmul.c - the matrix-vector / matrix-matrix driver over the per-ISA
 * kernel tables of matmul_kernels.h.
 *
 * What it does: maps a weight type to its activation type (llama.cpp's
 * vec_dot_type), converts activation rows, and splits y = W x across the
 * pool's workers. What it does not do: no repacking of the model's weights
 * (rows are read in their GGUF layout; a gemm kernel repacks a panel into
 * the pool's per-worker scratch for the length of one call), no state
 * between calls.
 *
 * Work split (ggml-cpu.c's shape): the output is cut into chunks of
 * chunk_rows weight rows x tok_block tokens, numbered row-chunk-fastest so
 * that consecutive chunks share their activations (kept in L2) while the
 * weights stream. Worker ith takes chunk ith first, then claims the next
 * with an atomic counter that lives in the job (on the caller's stack; the
 * pool's completion protocol orders its initialisation before every worker
 * and every result before rb_matmul returns). A decode step (one token, or
 * a few kernel's step) maps claim k to the (k / nth)-th chunk of part
 * k % nth, each part a contiguous nth-th of the rows: each thread then
 * streams its own rows in order and its prefetches stay in them. Inside a
 * chunk, tiles of
 * tile_rows x tile_toks go through the ISA's tile kernel:
 *   decode  (n_tokens == 1): 4 rows x 1 token, a pure matrix-vector product,
 *           4 independent accumulator chains sharing each activation block
 *           (avx512 Q4_K, Q5_K, Q6_K: two rows per zmm, each half the
 *           256-bit kernel's lanes);
 *   prefill (n_tokens > 1) : 2 rows x 4 tokens, each weight block unpacked
 *           once for 4 tokens, a chunk's rows reused from L1/L2 for every
 *           token of the block.
 * An ISA may also have, per weight type, two whole-panel kernels that run
 * instead of the tiles (matmul_kernels.h):
 *   gemv   (n_tokens == 1): 64-row chunks, each one call (avx512 Q4_0,
 *          Q4_K, Q6_K: four rows at a time, each row's lines prefetched
 *          16 rows ahead);
 *   few    (2 <= n_tokens <= RB_FEW_MAX, one decode step of several
 *          sequences): 64-row chunks x every token, each one call that
 *          loads a weight block once and runs it against every token (the
 *          prefill tiles' 2 x 4 shape had no vector chains at 2 or 3
 *          tokens: 2 streams took more CPU per token than one);
 *   gemm   (n_tokens >= RB_MATMUL_GEMM_MIN_TOKENS): two pool jobs. First
 *          the side tables (each token's block scales as floats and the
 *          integer corrections of the kernel's unsigned weight codes),
 *          tokens split evenly, in the caller's pool scratch slot; then
 *          chunks of RB_GEMM_ROWS rows x every token, each repacked once
 *          into the worker's own scratch slot and run against all tokens
 *          (a worker whose scratch cannot be had runs its chunks' tiles).
 *          No memory is allocated per call once the slots have grown.
 * Determinism: each output element is computed by the same float operations
 * whatever the chunk, tile or thread count (matmul_kernels.h), so results
 * are bit-identical for any n_threads and for decode vs prefill.
 *
 * Chunk sizes (first choice, not yet tuned): 16-row decode chunks (2048
 * rows -> 128 chunks: one atomic claim per ~1-2 us of work keeps two
 * threads balanced when one is briefly descheduled); prefill 16 rows x 64
 * tokens (64 Q8_0 activation rows of 2048 = 136 KiB stay in L2).
 * Measured with bench/bench_matmul.c on the 2-core EPYC VM, 2 threads,
 * weights from DRAM: tinyllama-1.1b Q4_0 matmuls alone run a decode step at
 * ~32 tok/s (~19.5 GB/s) and prefill at ~89 tok/s.
 */
#include "matmul.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>

#include "cpu.h"
#include "matmul_kernels.h"
#include "quant.h"
#include "rebound.h"

#define RB_MATMUL_DECODE_CHUNK_ROWS 16
#define RB_MATMUL_PREFILL_CHUNK_ROWS 16
/* decode chunks of a gemv kernel: a multiple of its 32 rows */
#define RB_MATMUL_GEMV_CHUNK_ROWS 64
#define RB_MATMUL_PREFILL_TOK_BLOCK 64
/* chunks of a few kernel (a step of 2..RB_FEW_MAX sequences): as gemv's */
#define RB_MATMUL_FEW_CHUNK_ROWS 64
/* the ISA's panel kernel (gemm) from this many tokens on: below, its
 * repacking of each panel costs more than the tiles' extra loads */
#define RB_MATMUL_GEMM_MIN_TOKENS 16

#ifdef RB_MATMUL_HAVE_X86
static rb_matmul_isa g_avx512;
static pthread_once_t g_avx512_once = PTHREAD_ONCE_INIT;

static void build_avx512(void)
{
    const rb_matmul_isa *own = &rb_matmul_isa_avx512_own;
    g_avx512 = rb_matmul_isa_vnni;
    g_avx512.name = own->name;
    for (int t = 0; t < RB_TYPE_COUNT; t++) {
        if (own->act[t])
            g_avx512.act[t] = own->act[t];
        if (own->tile[t])
            g_avx512.tile[t] = own->tile[t];
        if (own->gemv[t])
            g_avx512.gemv[t] = own->gemv[t];
        if (own->few[t])
            g_avx512.few[t] = own->few[t];
        if (own->gemm[t]) {
            g_avx512.gemm[t] = own->gemm[t];
            g_avx512.gemm_side[t] = own->gemm_side[t];
            g_avx512.gemm_corr_lanes[t] = own->gemm_corr_lanes[t];
        }
    }
}
#endif

const rb_matmul_isa *rb_matmul_isa_for_tier(int tier)
{
    switch (tier) {
    case RB_CPU_TIER_REF: return &rb_matmul_isa_ref;
#ifdef RB_MATMUL_HAVE_X86
    case RB_CPU_TIER_AVX2: return &rb_matmul_isa_avx2;
    case RB_CPU_TIER_VNNI: return &rb_matmul_isa_vnni;
    case RB_CPU_TIER_AVX512:
        pthread_once(&g_avx512_once, build_avx512);
        return &g_avx512;
#endif
#ifdef RB_MATMUL_HAVE_ARM64
    case RB_CPU_TIER_NEON: return &rb_matmul_isa_neon;
    case RB_CPU_TIER_DOTPROD: return &rb_matmul_isa_dotprod;
    case RB_CPU_TIER_I8MM: return &rb_matmul_isa_i8mm;
#endif
    default: return NULL;
    }
}

const rb_matmul_isa *rb_matmul_isa_best(void)
{
    const rb_matmul_isa *isa = rb_matmul_isa_for_tier(rb_cpu_tier());
    return isa ? isa : &rb_matmul_isa_ref;
}

uint32_t rb_matmul_act_type(uint32_t w_type)
{
    switch (w_type) {
    case RB_TYPE_F32: return RB_TYPE_F32;
    case RB_TYPE_F16: return RB_TYPE_F16;
    case RB_TYPE_BF16: return RB_TYPE_BF16;
    case RB_TYPE_Q4_0:
    case RB_TYPE_Q5_0:
    case RB_TYPE_Q8_0: return RB_TYPE_Q8_0;
    case RB_TYPE_Q4_1:
    case RB_TYPE_Q5_1: return RB_TYPE_Q8_1;
    case RB_TYPE_Q4_K:
    case RB_TYPE_Q5_K:
    case RB_TYPE_Q6_K: return RB_TYPE_Q8_K;
    default: return RB_TYPE_F32; /* unsupported: callers check supports() */
    }
}

int rb_matmul_supports(uint32_t w_type)
{
    return w_type < RB_TYPE_COUNT && rb_matmul_isa_best()->tile[w_type] != NULL;
}

size_t rb_matmul_act_row_bytes(uint32_t w_type, int64_t n_cols)
{
    return (size_t)rb_type_row_bytes(rb_matmul_act_type(w_type), (uint64_t)n_cols);
}

void rb_matmul_quantize_act(uint32_t w_type, const float *x, void *dst, int64_t n_cols)
{
    rb_matmul_isa_best()->act[rb_matmul_act_type(w_type)](x, dst, n_cols);
}

float rb_matmul_vec_dot(uint32_t w_type, const void *w_row, const void *act_row, int64_t n_cols)
{
    float y = 0.0f;
    rb_matmul_isa_best()->tile[w_type](n_cols, w_row, 0, 1, act_row, 0, 1, &y, 1);
    return y;
}

typedef struct rb_matmul_job {
    rb_tile_fn tile;
    const char *w;
    size_t w_row_bytes;
    int64_t n_rows, n_cols;
    const char *act;
    size_t act_stride;
    int64_t n_tokens;
    float *y;
    int64_t y_stride;
    int64_t chunk_rows, tok_block, n_row_chunks, n_chunks;
    int tile_rows, tile_toks;
    rb_gemv_fn gemv; /* decode's row kernel (NULL: tiles) */
    int64_t part_chunks; /* decode, few: row chunks per thread's part (claims below) */
    rb_few_fn few;   /* a step of several sequences' decode (NULL: tiles) */
    /* gemm (the ISA's panel kernel, NULL: tiles): its side tables */
    rb_gemm_fn gemm;
    rb_gemm_side_fn gemm_side;
    rb_threadpool *pool;
    float *side_d;
    int32_t *side_corr;
    int corr_lanes;
    /* next chunk to claim; starts at nth (chunks 0..nth-1 go by thread id) */
    alignas(64) atomic_llong next_chunk;
} rb_matmul_job;

static void rb_matmul_chunk(const rb_matmul_job *job, int64_t c)
{
    if (job->part_chunks) {
        /* claim k goes to part k % nth, its (k / nth)-th chunk: threads
           that claim in turn each walk a contiguous part, so the lines a
           kernel prefetches ahead are its own next rows, not the other
           thread's (which it would pull into its own L2) */
        const int64_t nth = job->n_chunks / job->part_chunks;
        c = (c % nth) * job->part_chunks + c / nth;
        if (c >= job->n_row_chunks)
            return;
    }
    if (job->gemv) {
        const int64_t g0 = c * job->chunk_rows;
        const int64_t g1 = g0 + job->chunk_rows < job->n_rows ? g0 + job->chunk_rows : job->n_rows;
        job->gemv(job->n_cols, job->w + g0 * job->w_row_bytes, job->w_row_bytes, (int)(g1 - g0),
                  job->act, job->y + g0);
        return;
    }
    if (job->few) {
        const int64_t g0 = c * job->chunk_rows;
        const int64_t g1 = g0 + job->chunk_rows < job->n_rows ? g0 + job->chunk_rows : job->n_rows;
        job->few(job->n_cols, job->w + g0 * job->w_row_bytes, job->w_row_bytes, (int)(g1 - g0),
                 job->act, job->act_stride, (int)job->n_tokens, job->y + g0, job->y_stride);
        return;
    }
    const int64_t r0 = (c % job->n_row_chunks) * job->chunk_rows;
    const int64_t t0 = (c / job->n_row_chunks) * job->tok_block;
    const int64_t r1 = r0 + job->chunk_rows < job->n_rows ? r0 + job->chunk_rows : job->n_rows;
    const int64_t t1 = t0 + job->tok_block < job->n_tokens ? t0 + job->tok_block : job->n_tokens;
    for (int64_t t = t0; t < t1; t += job->tile_toks) {
        const int nt = (int)(t1 - t < job->tile_toks ? t1 - t : job->tile_toks);
        for (int64_t r = r0; r < r1; r += job->tile_rows) {
            const int nr = (int)(r1 - r < job->tile_rows ? r1 - r : job->tile_rows);
            job->tile(job->n_cols, job->w + r * job->w_row_bytes, job->w_row_bytes, nr,
                      job->act + t * job->act_stride, job->act_stride, nt,
                      job->y + t * job->y_stride + r, job->y_stride);
        }
    }
}

/* gemm, first job: the side tables, tokens split evenly */
static void rb_matmul_side_task(void *ctx, int ith, int nth)
{
    const rb_matmul_job *job = ctx;
    const int64_t t0 = job->n_tokens * ith / nth, t1 = job->n_tokens * (ith + 1) / nth;
    job->gemm_side(job->act, job->act_stride, job->n_cols, t0, t1, job->side_d, job->side_corr);
}

/* gemm, second job: a chunk is a panel of RB_GEMM_ROWS rows x every token;
 * a worker without scratch memory runs the tiles of its panels instead
 * (the same bits) */
static void rb_matmul_gemm_task(void *ctx, int ith, int nth)
{
    rb_matmul_job *job = ctx;
    (void)nth;
    void *scratch = rb_threadpool_scratch(job->pool, ith, RB_GEMM_SCRATCH(job->n_cols));
    for (int64_t c = ith; c < job->n_chunks;
         c = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed)) {
        const int64_t r0 = c * RB_GEMM_ROWS;
        const int n = (int)(job->n_rows - r0 < RB_GEMM_ROWS ? job->n_rows - r0 : RB_GEMM_ROWS);
        if (scratch) {
            job->gemm(job->n_cols, job->w + r0 * job->w_row_bytes, job->w_row_bytes, n, job->act,
                      job->act_stride, job->n_tokens, job->side_d, job->side_corr, job->y + r0,
                      job->y_stride, scratch);
            continue;
        }
        for (int64_t t = 0; t < job->n_tokens; t += job->tile_toks) {
            const int nt = (int)(job->n_tokens - t < job->tile_toks ? job->n_tokens - t : job->tile_toks);
            for (int64_t r = r0; r < r0 + n; r += job->tile_rows) {
                const int nr = (int)(r0 + n - r < job->tile_rows ? r0 + n - r : job->tile_rows);
                job->tile(job->n_cols, job->w + r * job->w_row_bytes, job->w_row_bytes, nr,
                          job->act + t * job->act_stride, job->act_stride, nt,
                          job->y + t * job->y_stride + r, job->y_stride);
            }
        }
    }
}

static void rb_matmul_task(void *ctx, int ith, int nth)
{
    rb_matmul_job *job = ctx;
    (void)nth;
    /* relaxed: the counter only hands out indices; results are published by
     * the pool's release/acquire completion */
    for (int64_t c = ith; c < job->n_chunks;
         c = atomic_fetch_add_explicit(&job->next_chunk, 1, memory_order_relaxed))
        rb_matmul_chunk(job, c);
}

void rb_matmul(rb_threadpool *pool, uint32_t w_type, const void *w, int64_t n_rows,
               int64_t n_cols, const void *act, size_t act_stride, int64_t n_tokens,
               float *y, int64_t y_stride)
{
    const rb_matmul_isa *isa = rb_matmul_isa_best();
    if (n_rows <= 0 || n_tokens <= 0)
        return;
    rb_matmul_job job = {
        .tile = isa->tile[w_type],
        .w = w,
        .w_row_bytes = (size_t)rb_type_row_bytes(w_type, (uint64_t)n_cols),
        .n_rows = n_rows,
        .n_cols = n_cols,
        .act = act,
        .act_stride = act_stride,
        .n_tokens = n_tokens,
        .y = y,
        .y_stride = y_stride,
    };
    if (n_tokens == 1 && isa->gemv[w_type]) {
        job.gemv = isa->gemv[w_type];
        job.chunk_rows = RB_MATMUL_GEMV_CHUNK_ROWS;
        job.tok_block = 1;
        job.tile_rows = isa->decode_rows;
        job.tile_toks = 1;
    } else if (n_tokens == 1) {
        job.chunk_rows = RB_MATMUL_DECODE_CHUNK_ROWS;
        job.tok_block = 1;
        job.tile_rows = isa->decode_rows;
        job.tile_toks = 1;
    } else if (n_tokens <= RB_FEW_MAX && isa->few[w_type]) {
        job.few = isa->few[w_type];
        job.chunk_rows = RB_MATMUL_FEW_CHUNK_ROWS;
        job.tok_block = n_tokens;
        job.tile_rows = isa->decode_rows;
        job.tile_toks = 1;
    } else {
        job.chunk_rows = RB_MATMUL_PREFILL_CHUNK_ROWS;
        job.tok_block = RB_MATMUL_PREFILL_TOK_BLOCK;
        job.tile_rows = isa->prefill_rows;
        job.tile_toks = isa->prefill_toks;
    }
    job.n_row_chunks = (n_rows + job.chunk_rows - 1) / job.chunk_rows;
    job.n_chunks = job.n_row_chunks * ((n_tokens + job.tok_block - 1) / job.tok_block);
    const int nth = rb_threadpool_n_threads(pool);
    if (n_tokens == 1 || job.few) {
        /* every decode and few split: claims of every part; those past the
         * last chunk do nothing. Measured on qwen3-0.6b, Zen 5, 2 threads:
         * the tiles' decode with chunks claimed in turn (each thread's next
         * chunk 16 rows past the other's, its prefetches landing in the
         * other's rows) ran Q8_0 tg128 at 47 tok/s, with parts at 59 */
        job.part_chunks = (job.n_row_chunks + nth - 1) / nth;
        job.n_chunks = job.part_chunks * nth;
    }
    atomic_init(&job.next_chunk, nth);
    if (n_tokens >= RB_MATMUL_GEMM_MIN_TOKENS && isa->gemm[w_type] && pool) {
        const int64_t nb = n_cols / (int64_t)rb_type_get_traits(rb_matmul_act_type(w_type))->block_elems;
        const size_t n_d = (size_t)(n_tokens * nb);
        const int lanes = isa->gemm_corr_lanes[w_type];
        char *side = rb_threadpool_scratch(pool, nth, n_d * sizeof(float) * (size_t)(1 + lanes));
        if (side) {
            job.gemm = isa->gemm[w_type];
            job.gemm_side = isa->gemm_side[w_type];
            job.pool = pool;
            job.side_corr = (int32_t *)side;
            job.side_d = (float *)(side + n_d * sizeof(int32_t) * (size_t)lanes);
            job.n_chunks = (n_rows + RB_GEMM_ROWS - 1) / RB_GEMM_ROWS;
            rb_threadpool_run(pool, rb_matmul_side_task, &job);
            rb_threadpool_run(pool, rb_matmul_gemm_task, &job);
            return;
        }
    }
    rb_threadpool_run(pool, rb_matmul_task, &job);
}

/* ---- what runs here (rb_cpu_describe, rebound.h) -------------------------- */

RB_API size_t rb_cpu_describe(char *buf, size_t size)
{
    const rb_cpu_info *ci = rb_cpu_get();
    const int tier = rb_cpu_tier();
    const rb_matmul_isa *isa = rb_matmul_isa_best();
    char feat[256], kern[512];
    rb_cpu_features_str(ci->features, feat, sizeof feat);
    static const uint32_t types[] = {RB_TYPE_Q4_0, RB_TYPE_Q8_0, RB_TYPE_Q4_K, RB_TYPE_Q5_K,
                                     RB_TYPE_Q6_K, RB_TYPE_Q5_0, RB_TYPE_Q4_1, RB_TYPE_Q5_1,
                                     RB_TYPE_F16, RB_TYPE_BF16, RB_TYPE_F32};
    size_t at = 0;
    kern[0] = '\0';
    for (size_t i = 0; i < sizeof types / sizeof types[0] && at < sizeof kern; i++) {
        const char *who = isa->name;
#ifdef RB_MATMUL_HAVE_X86
        /* avx512 prefill panels with the vnni tiles for decode: "avx512/vnni" */
        if (tier == RB_CPU_TIER_AVX512 && !rb_matmul_isa_avx512_own.tile[types[i]])
            who = rb_matmul_isa_avx512_own.gemm[types[i]] ? "avx512/vnni" : rb_matmul_isa_vnni.name;
#endif
#ifdef RB_MATMUL_HAVE_ARM64
        /* i8mm has its own Q4_0 / Q8_0 prefill tiles, dotprod's kernels elsewhere */
        if (tier == RB_CPU_TIER_I8MM && types[i] != RB_TYPE_Q4_0 && types[i] != RB_TYPE_Q8_0)
            who = rb_matmul_isa_dotprod.name;
#endif
        int k = snprintf(kern + at, sizeof kern - at, "%s%s=%s", at ? " " : "",
                         rb_type_name(types[i]), who);
        if (k < 0)
            break;
        at += (size_t)k;
    }
    int n = snprintf(buf, size,
                     "cpu: %s\nfeatures: %s\ntier: %s (best here: %s; REBOUND_CPU caps it)\n"
                     "matmul kernels: %s\nattention, kv codec: %s\n%s%s%s",
                     ci->brand[0] ? ci->brand : "unknown", feat[0] ? feat : "(none)",
                     rb_cpu_tier_name(tier), rb_cpu_tier_name(ci->best_tier), kern,
#ifdef RB_MATMUL_HAVE_X86
                     tier == RB_CPU_TIER_AVX512 ? "avx512 (f16 blocks of head dim 64/128/256), avx2"
                     : tier >= RB_CPU_TIER_AVX2 && tier <= RB_CPU_TIER_VNNI ? "avx2" : "ref",
#elif defined(RB_MATMUL_HAVE_ARM64)
                     tier >= RB_CPU_TIER_NEON && tier <= RB_CPU_TIER_I8MM ? "neon" : "ref",
#else
                     "portable",
#endif
                     ci->note[0] ? "note: " : "", ci->note, ci->note[0] ? "\n" : "");
    return n < 0 ? 0 : (size_t)n;
}
