/*
 * cuda_bf16.h — __nv_bfloat16 for cudasim: the conversions
 * runtime/cuda_kernels.cu uses, on the host, rounding to nearest even as
 * the GPU's __float2bfloat16_rn does (through runtime/half.h).
 */
#ifndef CUDASIM_CUDA_BF16_H
#define CUDASIM_CUDA_BF16_H

#include "half.h"

struct __nv_bfloat16 {
    uint16_t bits;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {bf16_from_float(x)}; }
static inline float __bfloat162float(__nv_bfloat16 h) { return float_from_bf16(h.bits); }
static inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
static inline __nv_bfloat16 __ushort_as_bfloat16(uint16_t u) { return {u}; }

#endif
