/*
 * kvcodec_quant_avx2.c - the lossy KV coders of kvcodec_quant.c built a
 * second time with the avx2 set's flags: their group statistics, rounding
 * and packing are scalar loops that the compiler vectorises with AVX2 and
 * F16C (the baseline build encoded q8 at 0.3 GB/s against 0.47 with
 * -march=native, and decoded 8% slower: its per-row f16 scales). The same
 * code and the same frames; kvcodec_avx2.c's kernel set points at it.
 */
#if defined(__AVX2__) && defined(__F16C__)
#define RB_KV_QUANT_AVX2 1
#define rb_kvcodec_quant_encode rb_kvcodec_quant_encode_avx2
#define rb_kvcodec_quant_decode rb_kvcodec_quant_decode_avx2
#include "kvcodec_quant.c"
#else
typedef int rb_kvcodec_quant_avx2_unused; /* ISO C: a translation unit is not empty */
#endif
