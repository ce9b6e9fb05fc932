/*
 * cpu.c - CPU feature detection and the kernel tier (contract in cpu.h).
 *
 * Compiled for the architecture's baseline (no -mavx*): it must run on any
 * x86-64 or aarch64 to say what the CPU lacks. State: one rb_cpu_info,
 * filled once under pthread_once; the tier in use is an atomic int beside
 * it (read by every kernel dispatch, written by rb_cpu_set_tier).
 */
#include "cpu.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define RB_CPU_X86 1
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define RB_CPU_ARM64 1
#endif

static rb_cpu_info g_info;
static atomic_int g_tier = -1; /* -1 until detect() has run */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static const char *const tier_names[RB_CPU_TIER_COUNT] = {
    [RB_CPU_TIER_REF] = "ref",       [RB_CPU_TIER_AVX2] = "avx2",
    [RB_CPU_TIER_VNNI] = "vnni",     [RB_CPU_TIER_AVX512] = "avx512",
    [RB_CPU_TIER_NEON] = "neon",     [RB_CPU_TIER_DOTPROD] = "dotprod",
    [RB_CPU_TIER_I8MM] = "i8mm",
};

const char *rb_cpu_tier_name(int tier)
{
    return tier >= 0 && tier < RB_CPU_TIER_COUNT ? tier_names[tier] : NULL;
}

int rb_cpu_tier_from_name(const char *name)
{
    for (int t = 0; name && t < RB_CPU_TIER_COUNT; t++)
        if (strcmp(name, tier_names[t]) == 0)
            return t;
    return -1;
}

#ifdef RB_CPU_X86
static uint32_t detect_x86(char brand[64])
{
    unsigned a, b, c, d;
    uint32_t f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const int has_osxsave = (c >> 27) & 1, has_avx = (c >> 28) & 1;
    if (c & (1u << 12)) f |= RB_CPU_FMA;
    if (c & (1u << 29)) f |= RB_CPU_F16C;
    uint64_t xcr0 = 0;
    if (has_osxsave) {
        uint32_t lo, hi;
        __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
        xcr0 = ((uint64_t)hi << 32) | lo;
    }
    if (has_avx && (xcr0 & 0x6) == 0x6) f |= RB_CPU_OS_YMM;
    if ((xcr0 & 0xe6) == 0xe6) f |= RB_CPU_OS_ZMM;
    if (__get_cpuid_max(0, NULL) >= 7) {
        __cpuid_count(7, 0, a, b, c, d);
        if (b & (1u << 3)) f |= RB_CPU_BMI1;
        if (b & (1u << 5)) f |= RB_CPU_AVX2;
        if (b & (1u << 8)) f |= RB_CPU_BMI2;
        if (b & (1u << 16)) f |= RB_CPU_AVX512F;
        if (b & (1u << 17)) f |= RB_CPU_AVX512DQ;
        if (b & (1u << 30)) f |= RB_CPU_AVX512BW;
        if (b & (1u << 31)) f |= RB_CPU_AVX512VL;
        if (c & (1u << 1)) f |= RB_CPU_AVX512VBMI;
        if (c & (1u << 11)) f |= RB_CPU_AVX512VNNI;
        const unsigned max7 = a;
        if (max7 >= 1) {
            __cpuid_count(7, 1, a, b, c, d);
            if (a & (1u << 4)) f |= RB_CPU_AVXVNNI;
            if (a & (1u << 5)) f |= RB_CPU_AVX512BF16;
        }
    }
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000001u) {
        __cpuid(0x80000001u, a, b, c, d);
        if (c & (1u << 5)) f |= RB_CPU_LZCNT;
    }
    memset(brand, 0, 64);
    if ((unsigned)__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        uint32_t r[12];
        for (unsigned i = 0; i < 3; i++)
            __cpuid(0x80000002u + i, r[4 * i], r[4 * i + 1], r[4 * i + 2], r[4 * i + 3]);
        memcpy(brand, r, 48);
        /* trim the padding spaces some vendors put around it */
        char *s = brand;
        while (*s == ' ')
            s++;
        memmove(brand, s, strlen(s) + 1);
        for (size_t n = strlen(brand); n > 0 && brand[n - 1] == ' '; n--)
            brand[n - 1] = '\0';
    }
    return f;
}

static int best_tier_x86(uint32_t f)
{
    const uint32_t avx2 = RB_CPU_AVX2 | RB_CPU_FMA | RB_CPU_F16C | RB_CPU_BMI1 | RB_CPU_BMI2 |
                          RB_CPU_LZCNT | RB_CPU_OS_YMM;
    const uint32_t avx512 = avx2 | RB_CPU_AVX512F | RB_CPU_AVX512BW | RB_CPU_AVX512VL |
                            RB_CPU_AVX512DQ | RB_CPU_AVX512VNNI | RB_CPU_OS_ZMM;
    if ((f & avx512) == avx512)
        return RB_CPU_TIER_AVX512;
    if ((f & avx2) == avx2)
        return RB_CPU_TIER_AVX2;
    return RB_CPU_TIER_REF;
}
#endif

#ifdef RB_CPU_ARM64
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP_SVE
#define HWCAP_SVE (1 << 22)
#endif
#ifndef HWCAP2_I8MM
#define HWCAP2_I8MM (1 << 13)
#endif
static uint32_t detect_arm64(void)
{
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    uint32_t f = 0;
    if (hw & HWCAP_ASIMD) f |= RB_CPU_NEON;
    if (hw & HWCAP_ASIMDDP) f |= RB_CPU_DOTPROD;
    if (hw & HWCAP_ASIMDHP) f |= RB_CPU_FP16;
    if (hw & HWCAP_SVE) f |= RB_CPU_SVE;
    if (hw2 & HWCAP2_I8MM) f |= RB_CPU_I8MM;
    return f;
}
#endif

int rb_cpu_tier_available(int tier)
{
    const rb_cpu_info *ci = rb_cpu_get();
    if (tier == RB_CPU_TIER_REF)
        return 1;
#ifdef RB_CPU_X86
    return tier >= RB_CPU_TIER_AVX2 && tier <= RB_CPU_TIER_AVX512 && tier <= ci->best_tier;
#elif defined(RB_CPU_ARM64)
    return tier >= RB_CPU_TIER_NEON && tier <= RB_CPU_TIER_I8MM && tier <= ci->best_tier;
#else
    (void)ci;
    return 0;
#endif
}

static void detect(void)
{
    rb_cpu_info *ci = &g_info;
    ci->best_tier = RB_CPU_TIER_REF;
#ifdef RB_CPU_X86
    ci->features = detect_x86(ci->brand);
    ci->best_tier = best_tier_x86(ci->features);
#elif defined(RB_CPU_ARM64)
    ci->features = detect_arm64();
    if (ci->features & RB_CPU_NEON) {
        ci->best_tier = ci->features & RB_CPU_DOTPROD ? RB_CPU_TIER_DOTPROD : RB_CPU_TIER_NEON;
        if ((ci->features & (RB_CPU_DOTPROD | RB_CPU_I8MM)) == (RB_CPU_DOTPROD | RB_CPU_I8MM))
            ci->best_tier = RB_CPU_TIER_I8MM;
    }
#endif
    ci->tier = ci->best_tier;
    const char *env = getenv("REBOUND_CPU");
    if (env && *env) {
        const int want = rb_cpu_tier_from_name(env);
        if (want < 0)
            snprintf(ci->note, sizeof ci->note,
                     "REBOUND_CPU=%.40s is not a tier (ref avx2 vnni avx512 neon dotprod i8mm): "
                     "using %s",
                     env, tier_names[ci->tier]);
        else if (want != RB_CPU_TIER_REF &&
                 !(want <= ci->best_tier &&
                   (ci->best_tier >= RB_CPU_TIER_NEON) == (want >= RB_CPU_TIER_NEON)))
            snprintf(ci->note, sizeof ci->note,
                     "REBOUND_CPU=%s: this CPU or build cannot run it: using %s", env,
                     tier_names[ci->tier]);
        else
            ci->tier = want;
    }
    atomic_store_explicit(&g_tier, ci->tier, memory_order_release);
}

const rb_cpu_info *rb_cpu_get(void)
{
    pthread_once(&g_once, detect);
    return &g_info;
}

int rb_cpu_tier(void)
{
    /* every kernel dispatch asks: after the first call one relaxed load (the
     * tier is a plain value; the kernels it selects are code, not data) */
    const int t = atomic_load_explicit(&g_tier, memory_order_relaxed);
    if (t >= 0)
        return t;
    pthread_once(&g_once, detect);
    return atomic_load_explicit(&g_tier, memory_order_acquire);
}

int rb_cpu_set_tier(int tier)
{
    pthread_once(&g_once, detect);
    if (!rb_cpu_tier_available(tier))
        return rb_cpu_tier();
    return atomic_exchange_explicit(&g_tier, tier, memory_order_acq_rel);
}

void rb_cpu_features_str(uint32_t f, char *buf, int size)
{
    static const struct { uint32_t bit; const char *name; } names[] = {
        {RB_CPU_AVX2, "avx2"}, {RB_CPU_FMA, "fma"}, {RB_CPU_F16C, "f16c"},
        {RB_CPU_BMI1, "bmi1"}, {RB_CPU_BMI2, "bmi2"}, {RB_CPU_LZCNT, "lzcnt"},
        {RB_CPU_AVX512F, "avx512f"}, {RB_CPU_AVX512BW, "avx512bw"},
        {RB_CPU_AVX512VL, "avx512vl"}, {RB_CPU_AVX512DQ, "avx512dq"},
        {RB_CPU_AVX512VNNI, "avx512vnni"}, {RB_CPU_AVX512BF16, "avx512bf16"},
        {RB_CPU_AVX512VBMI, "avx512vbmi"}, {RB_CPU_AVXVNNI, "avxvnni"},
        {RB_CPU_OS_YMM, "os-ymm"}, {RB_CPU_OS_ZMM, "os-zmm"},
        {RB_CPU_NEON, "neon"}, {RB_CPU_DOTPROD, "dotprod"}, {RB_CPU_I8MM, "i8mm"},
        {RB_CPU_FP16, "fp16"}, {RB_CPU_SVE, "sve"},
    };
    int at = 0;
    if (size > 0)
        buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(f & names[i].bit) || at >= size)
            continue;
        int k = snprintf(buf + at, (size_t)(size - at), "%s%s", at ? " " : "", names[i].name);
        if (k < 0)
            break;
        at += k;
    }
}
