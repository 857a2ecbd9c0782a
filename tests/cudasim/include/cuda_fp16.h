/*
 * cuda_fp16.h — __half for cudasim: the conversions
 * runtime/cuda_kernels.cu uses, on the host, rounding to nearest even as
 * the GPU's __float2half_rn does (through runtime/half.h).
 */
#ifndef CUDASIM_CUDA_FP16_H
#define CUDASIM_CUDA_FP16_H

#include "half.h"

struct __half {
    uint16_t bits;
};

static inline __half __float2half_rn(float x) { return {fp16_from_float(x)}; }
static inline float __half2float(__half h) { return float_from_fp16(h.bits); }
static inline uint16_t __half_as_ushort(__half h) { return h.bits; }
static inline __half __ushort_as_half(uint16_t u) { return {u}; }

#endif
