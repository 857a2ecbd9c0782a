/*
 * half.h — 16-bit floats in software: bf16 and IEEE fp16 to and from
 * float, rounding to nearest even. The CPU backend emulates the GPU's
 * 16-bit all-gathers and reductions with them (cpu.c); being static inline
 * they are also what tests/runtime/test_half.c checks at every rounding
 * midpoint against the compiler's own _Float16.
 */
#ifndef FSDRT_HALF_H
#define FSDRT_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* float → bf16, rounding to nearest even; NaN stays NaN. */
static inline uint16_t bf16_from_float(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float float_from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float → IEEE half, rounding to nearest even, with subnormals, overflow
 * to infinity and NaN kept. */
static inline uint16_t fp16_from_float(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u)
        return (uint16_t)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0));
    if (ax >= 0x477ff000u)          /* ≥ 65520 rounds to infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000u) {         /* below 2^-14: a half subnormal, in units of 2^-24 */
        float a;
        memcpy(&a, &ax, 4);
        return (uint16_t)(sign | (uint16_t)lrintf(a * 16777216.0f));
    }
    uint32_t y = ax - (112u << 23);   /* rebias the exponent from 127 to 15 */
    y += 0xfffu + ((y >> 13) & 1);
    return (uint16_t)(sign | (y >> 13));
}

static inline float float_from_fp16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    if (e == 0) {
        float f = ldexpf((float)mant, -24);
        return sign ? -f : f;
    }
    if (e == 31)
        u = sign | 0x7f800000u | (mant << 13);
    else
        u = sign | ((e + 112) << 23) | (mant << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
