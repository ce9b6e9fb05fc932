/*
 * attention.c - f16 attention loops in the order of operations that
 * reproduces llama.cpp's reference logits bit for bit on parity-Q8_0.gguf
 * (see attention.h): q.k summed sequentially in f32 (products of two f16
 * values are exact in f32), V accumulated as f16(acc + v * s) with the
 * product and the sum rounded separately.
 *
 * Measured on the reference files: with these loops parity-Q8_0's logits
 * equal llama.cpp's exactly at every position; with ggml's AVX2 order (four
 * 8-lane FMA accumulators, fused multiply-add into the f16 accumulator)
 * they differ by up to 0.1. So the reference was evidently made with the
 * scalar forms, and these stay scalar until a SIMD version can keep the
 * same bits (a sequential sum vectorises only across positions, which is
 * the next step for long contexts).
 */
#include "attention.h"

#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#endif

float rb_attn_dot_f16(const rb_f16 *q, const rb_f16 *k, int n)
{
    float s = 0.0f;
    for (int i = 0; i < n; i++)
        s += rb_fp16_to_fp32(q[i]) * rb_fp16_to_fp32(k[i]);
    return s;
}

void rb_attn_mad_f16(rb_f16 *acc, const rb_f16 *v, float s, int n)
{
    for (int i = 0; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) + rb_fp16_to_fp32(v[i]) * s);
}

void rb_attn_scale_f16(rb_f16 *acc, float s, int n)
{
    for (int i = 0; i < n; i++)
        acc[i] = rb_fp32_to_fp16(rb_fp16_to_fp32(acc[i]) * s);
}
