/*
 * kvcodec_lossless_dec_avx2.c - the lossless decoder of
 * kvcodec_lossless_dec.c built a second time for the x86 vector tiers
 * (-mavx2 -mfma -mf16c -mbmi -mbmi2 -mlzcnt: its bit reader and table
 * fills are scalar code that the compiler schedules better with BMI2's
 * shifts; the baseline build decoded 20% slower on Zen 4). The same code,
 * the same pages; kvcodec_avx2.c's kernel set points at it.
 */
#if defined(__AVX2__) && defined(__BMI2__)
#define RB_KV_LOSSLESS_DEC_AVX2 1
#define rb_kvcodec_lossless_decode rb_kvcodec_lossless_decode_avx2
#include "kvcodec_lossless_dec.c"
#else
typedef int rb_kvcodec_lossless_dec_avx2_unused; /* ISO C: a translation unit is not empty */
#endif
