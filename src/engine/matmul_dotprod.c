/*
 * matmul_dotprod.c - the NEON kernels of matmul_neon.c built a second time
 * with -march=armv8.2-a+dotprod (CMakeLists.txt): their int8 dot products
 * are one sdot each. cpu.c runs them where HWCAP says the CPU has it.
 */
#define RB_NEON_DOTPROD_BUILD 1
#include "matmul_neon.c"
