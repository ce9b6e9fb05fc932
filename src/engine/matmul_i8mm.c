/*
 * matmul_i8mm.c - the NEON kernels of matmul_neon.c built a third time
 * with -march=armv8.2-a+dotprod+i8mm (CMakeLists.txt): the dotprod kernels,
 * and Q4_0 / Q8_0 prefill tiles whose int8 products are SMMLA 2 x 2 blocks
 * (the same exact integers, folded in the same float steps: the dotprod
 * tier's bits). cpu.c runs them where HWCAP2 says the CPU has i8mm.
 */
#define RB_NEON_DOTPROD_BUILD 1
#define RB_NEON_I8MM_BUILD 1
#include "matmul_neon.c"
