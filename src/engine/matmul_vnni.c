/*
 * matmul_vnni.c - the AVX2 kernels of matmul_avx2.c built a second time
 * with -mavx512vl -mavx512vnni, so that their u8 x s8 and s16 x s16 integer
 * dot products are one vpdpbusd / vpdpwssd each (ymm registers, EVEX
 * encoding) instead of vpmaddubsw + vpmaddwd + vpaddd. The integers, and so
 * every float after them, are the avx2 build's: the vnni tier keeps bit
 * parity with llama.cpp's golden files.
 */
#define RB_AVX2_VNNI 1
#include "matmul_avx2.c"
