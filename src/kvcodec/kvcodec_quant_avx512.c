/*
 * kvcodec_quant_avx512.c - the lossy KV decoder of kvcodec_quant.c built a
 * third time, with the avx512 set's flags, for that set: each row is
 * dequantized and absorbed into the page checksum from the registers
 * (rb_kvcodec_dequant_absorb_avx512) instead of a tile dequantized and
 * then hashed from L1. The same code otherwise, the same pages and hash;
 * the encoder stays the avx2 build's (kvcodec_quant_avx2.c).
 */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RB_KV_QUANT_AVX2 1   /* the one-definition parts are the baseline build's */
#define RB_KV_QUANT_AVX512 1 /* the fused decode rows */
#define RB_KV_QUANT_NO_ENCODE 1
#define rb_kvcodec_quant_decode rb_kvcodec_quant_decode_avx512
#include "kvcodec_quant.c"
#else
typedef int rb_kvcodec_quant_avx512_unused; /* ISO C: a translation unit is not empty */
#endif
