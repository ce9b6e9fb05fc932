/*
 * cpu.h - what the CPU can run, found once at run time, and the kernel
 * tier chosen from it.
 *
 * One build per architecture: the kernels of each instruction-set level
 * live in their own files compiled with that level's flags
 * (matmul_avx2.c, matmul_vnni.c, matmul_avx512.c, ops_avx2.c, kvcodec_avx2.c,
 * kvcodec_lossless_dec_avx2.c, kvcodec_quant_avx2.c, kvcodec_avx512.c,
 * kvcodec_quant_avx512.c; on aarch64 matmul_neon.c and its dotprod and
 * i8mm builds, ops_neon.c and its dotprod build, kvcodec_neon.c), and
 * everything else is
 * compiled for the architecture's baseline. The tier picks which of them
 * run:
 *
 *   x86-64   ref      scalar _ref kernels (any x86-64)
 *            avx2     AVX2 + FMA + F16C + BMI1/2 + LZCNT (x86-64-v3: Haswell,
 *                     Zen 1 and later)
 *            vnni     the AVX2 kernels with vpdpbusd (AVX512-VL + VNNI):
 *                     the same integers and float order as avx2
 *            avx512   512-bit kernels (AVX-512 F/BW/VL/VNNI) where written,
 *                     the vnni ones elsewhere
 *   aarch64  ref, neon (the floor), dotprod (the SDOT extension), i8mm
 *            (dotprod + the SMMLA int8 matrix multiply: its Q4_0 / Q8_0
 *            prefill tiles, the dotprod kernels elsewhere; the same bits
 *            as dotprod)
 *
 * Detection: cpuid leaves 1 and 7 and xgetbv (the OS must save ymm, and for
 * the avx512 tiers opmask and zmm state); getauxval(AT_HWCAP) on aarch64.
 * The environment variable REBOUND_CPU (one of the names above) caps the
 * tier at a lower one; a tier the CPU lacks, or an unknown name, leaves the
 * best tier and is reported in rb_cpu_info.note.
 *
 * Threads: rb_cpu_get / rb_cpu_tier are safe from any thread (the first
 * call detects, under pthread_once). rb_cpu_set_tier is for tests and
 * benchmarks that compare tiers: call it while no forward pass runs.
 */
#ifndef RB_CPU_H
#define RB_CPU_H

#include <stdint.h>

enum {
    RB_CPU_TIER_REF = 0,
    RB_CPU_TIER_AVX2,
    RB_CPU_TIER_VNNI,
    RB_CPU_TIER_AVX512,
    RB_CPU_TIER_NEON,
    RB_CPU_TIER_DOTPROD,
    RB_CPU_TIER_I8MM,
    RB_CPU_TIER_COUNT
};

/* feature bits of rb_cpu_info.features */
enum {
    RB_CPU_AVX2 = 1u << 0,
    RB_CPU_FMA = 1u << 1,
    RB_CPU_F16C = 1u << 2,
    RB_CPU_AVX512F = 1u << 3,
    RB_CPU_AVX512BW = 1u << 4,
    RB_CPU_AVX512VL = 1u << 5,
    RB_CPU_AVX512DQ = 1u << 6,
    RB_CPU_AVX512VNNI = 1u << 7,
    RB_CPU_AVX512BF16 = 1u << 8,
    RB_CPU_AVXVNNI = 1u << 9,
    RB_CPU_AVX512VBMI = 1u << 10,
    RB_CPU_OS_YMM = 1u << 11,   /* the OS saves ymm state (XCR0 bits 1, 2) */
    RB_CPU_OS_ZMM = 1u << 12,   /* ... and opmask + zmm state (bits 5, 6, 7) */
    RB_CPU_BMI1 = 1u << 13,
    RB_CPU_BMI2 = 1u << 14,
    RB_CPU_LZCNT = 1u << 15,
    RB_CPU_NEON = 1u << 16,
    RB_CPU_DOTPROD = 1u << 17,
    RB_CPU_I8MM = 1u << 18,
    RB_CPU_FP16 = 1u << 19,     /* half-precision arithmetic (asimdhp) */
    RB_CPU_SVE = 1u << 20,
};

typedef struct rb_cpu_info {
    uint32_t features;    /* RB_CPU_* bits found */
    int best_tier;        /* the highest tier this build can run here */
    int tier;             /* the tier chosen at start (best_tier, or lower by
                             REBOUND_CPU); rb_cpu_tier() is the one in use */
    char brand[64];       /* x86: cpuid brand string; else "" */
    char note[160];       /* why REBOUND_CPU was not followed, or "" */
} rb_cpu_info;

/* The detected CPU (static storage, valid for the process). */
const rb_cpu_info *rb_cpu_get(void);

/* The tier in use. */
int rb_cpu_tier(void);

/* 1 when this build has the tier's kernels and the CPU can run them. */
int rb_cpu_tier_available(int tier);

/* Uses tier (which must be available) from now on; returns the previous
 * tier. Tests and benchmarks only, with no forward pass running. */
int rb_cpu_set_tier(int tier);

/* "ref", "avx2", "vnni", "avx512", "neon", "dotprod", "i8mm"; -1 / NULL if
 * unknown */
const char *rb_cpu_tier_name(int tier);
int rb_cpu_tier_from_name(const char *name);

/* Writes the feature names found, space-separated, into buf. */
void rb_cpu_features_str(uint32_t features, char *buf, int size);

#endif
