/*
 * ops_dotprod.c - ops_neon.c's quantized-K attention scores built a second
 * time with -march=armv8.2-a+dotprod (CMakeLists.txt): the sums of four
 * int8 products are one SDOT each, the same exact integers. cpu.c's
 * dotprod tier runs them.
 */
#define RB_OPS_DOTPROD_BUILD 1
#include "ops_neon.c"
