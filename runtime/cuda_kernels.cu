/*
 * cuda_kernels.cu — the CUDA backend's own kernels: the loops over shard
 * elements that cpu.c runs as OpenMP loops (casts to and from the 16-bit
 * formats, accumulating a reduce-scatter into the grad shard, the
 * gradient norm, clipping, AdamW and SGD), each one fused pass over a flat
 * shard. The cuda_*.c files launch them through the C launchers declared in
 * cuda.h.
 *
 * Numerics follow cpu.c term by term (the same float expressions, scalars
 * computed in double on the host), so the two backends differ only by
 * rounding order and nvcc's fused multiply-adds. The gradient norm is
 * deterministic: a fixed number of blocks for a shard size, each reducing
 * in a fixed order, then one block over the partial sums; no atomics.
 */
#include "cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define THREADS 256
#define MAX_BLOCKS 4096
#define SUMSQ_BLOCKS 1024

static unsigned blocks_for(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    return (unsigned)(b < 1 ? 1 : b > MAX_BLOCKS ? MAX_BLOCKS : b);
}

/* kernel<<<grid, block, 0, s>>>(args): a macro so that tests/cudasim can
 * build this file for its simulated device, where a launch is a queued
 * call (tests/cudasim/kernel.h). */
#ifndef LAUNCH
#define LAUNCH(kernel, grid, block, s, ...) kernel<<<(grid), (block), 0, (s)>>>(__VA_ARGS__)
#endif

#define GRID_STRIDE(i, n)                                                      \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

/* ── 16-bit wire formats ── */

static __device__ __forceinline__ uint16_t narrow1(float x, int bf16)
{
    return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(x)) : __half_as_ushort(__float2half_rn(x));
}

static __device__ __forceinline__ float widen1(uint16_t h, int bf16)
{
    return bf16 ? __bfloat162float(__ushort_as_bfloat16(h)) : __half2float(__ushort_as_half(h));
}

static __global__ void narrow_kernel(uint16_t *dst, const float *src, int64_t n, int bf16)
{
    GRID_STRIDE(i, n) dst[i] = narrow1(src[i], bf16);
}

static __global__ void widen_kernel(float *dst, const uint16_t *src, int64_t n, int bf16)
{
    GRID_STRIDE(i, n) dst[i] = widen1(src[i], bf16);
}

static __global__ void accum_kernel(float *dst, const float *src, int64_t n)
{
    GRID_STRIDE(i, n) dst[i] += src[i];
}

static __global__ void accum_widen_kernel(float *dst, const uint16_t *src, int64_t n, int bf16)
{
    GRID_STRIDE(i, n) dst[i] += widen1(src[i], bf16);
}

extern "C" cudaError_t cu_narrow(uint16_t *dst, const float *src, int64_t n, int bf16, cudaStream_t s)
{
    LAUNCH(narrow_kernel, blocks_for(n), THREADS, s, dst, src, n, bf16);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_widen(float *dst, const uint16_t *src, int64_t n, int bf16, cudaStream_t s)
{
    LAUNCH(widen_kernel, blocks_for(n), THREADS, s, dst, src, n, bf16);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_accum(float *dst, const float *src, int64_t n, cudaStream_t s)
{
    LAUNCH(accum_kernel, blocks_for(n), THREADS, s, dst, src, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_accum_widen(float *dst, const uint16_t *src, int64_t n, int bf16,
                                      cudaStream_t s)
{
    LAUNCH(accum_widen_kernel, blocks_for(n), THREADS, s, dst, src, n, bf16);
    return cudaGetLastError();
}

/* ── the loss ── */

static __global__ void loss_add_kernel(double *acc, const float *loss) { acc[0] += (double)loss[0]; }

extern "C" cudaError_t cu_loss_add(double *acc, const float *loss, cudaStream_t s)
{
    LAUNCH(loss_add_kernel, 1, 1, s, acc, loss);
    return cudaGetLastError();
}

/* ── the gradient norm ── */

/* Sum over the block in a fixed tree order; every thread of the block
 * calls it. */
static __device__ double block_sum(double v)
{
    __shared__ double part[THREADS];
    part[threadIdx.x] = v;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if ((int)threadIdx.x < k)
            part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    double s = part[0];
    __syncthreads();
    return s;
}

static __global__ void sumsq_partial_kernel(const float *x, int64_t n, double *partials)
{
    double s = 0;
    GRID_STRIDE(i, n) s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = s;
}

static __global__ void sumsq_finish_kernel(double *stats, const double *partials, int np,
                                           double *acc, double host_loss)
{
    double s = 0;
    for (int i = threadIdx.x; i < np; i += THREADS)
        s += partials[i];
    s = block_sum(s);
    if (threadIdx.x == 0) {
        stats[0] = acc[0] + host_loss;
        stats[1] = s;
        acc[0] = 0;
    }
}

extern "C" int cu_sumsq_blocks(int64_t n)
{
    int64_t b = (n + THREADS - 1) / THREADS;
    return (int)(b < 1 ? 1 : b > SUMSQ_BLOCKS ? SUMSQ_BLOCKS : b);
}

extern "C" cudaError_t cu_sumsq_partial(const float *x, int64_t n, double *partials, cudaStream_t s)
{
    LAUNCH(sumsq_partial_kernel, cu_sumsq_blocks(n), THREADS, s, x, n, partials);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_sumsq_finish(double *stats, const double *partials, int np, double *acc,
                                       double host_loss, cudaStream_t s)
{
    LAUNCH(sumsq_finish_kernel, 1, THREADS, s, stats, partials, np, acc, host_loss);
    return cudaGetLastError();
}

/* internal.h's update_coef, on the device: the all-reduced loss and Σ g²
 * never travel to the host before the optimizer has run. A non-finite one
 * gives SKIP_COEF (internal.h's UPDATE_SKIP): the optimizer kernels then
 * only zero the gradients. */
#define SKIP_COEF (-1.0)
static __global__ void clip_kernel(double *stats, double clip)
{
    double norm = sqrt(stats[1]);
    if (!isfinite(stats[0]) || !isfinite(stats[1]))
        stats[2] = SKIP_COEF;
    else
        stats[2] = clip > 0 && clip / (norm + 1e-6) < 1 ? clip / (norm + 1e-6) : 1;
}

extern "C" cudaError_t cu_clip(double *stats, double clip, cudaStream_t s)
{
    LAUNCH(clip_kernel, 1, 1, s, stats, clip);
    return cudaGetLastError();
}

/* ── the optimizer ── */

/* Whether element i lies in a segment that takes weight decay: segments
 * cover the shard end to end in order, so a binary search over their ends. */
static __device__ __forceinline__ bool decays(const CudaSeg *seg, int nseg, int64_t i)
{
    int lo = 0, hi = nseg - 1;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (seg[mid].end <= i)
            lo = mid + 1;
        else
            hi = mid;
    }
    return nseg > 0 && seg[lo].decay;
}

/* cpu.c's adamw(), with the clip coefficient and the zeroing of the
 * gradient fused in. */
static __global__ void adamw_kernel(float *p, float *g, float *m, float *v, int64_t n,
                                    const CudaSeg *seg, int nseg, const double *coef_dev,
                                    CudaAdamW a)
{
    if (*coef_dev == SKIP_COEF) {
        GRID_STRIDE(i, n) g[i] = 0;
        return;
    }
    const float k = (float)*coef_dev;
    GRID_STRIDE(i, n) {
        float gi = g[i] * k;
        float pi = p[i] * (decays(seg, nseg, i) ? a.decay : 1.0f);
        float mi = m[i] + a.w1 * (gi - m[i]);
        float vi = a.b2 * v[i] + a.w2 * gi * gi;
        pi -= a.step * mi / (sqrtf(vi) / a.bc2_sqrt + a.eps);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        g[i] = 0;
    }
}

/* cpu.c's sgd(), likewise. */
static __global__ void sgd_kernel(float *p, float *g, float *b, int64_t n, const CudaSeg *seg,
                                  int nseg, const double *coef_dev, float wd, float mu, float lr,
                                  int nesterov)
{
    if (*coef_dev == SKIP_COEF) {
        GRID_STRIDE(i, n) g[i] = 0;
        return;
    }
    const float k = (float)*coef_dev;
    GRID_STRIDE(i, n) {
        float d = g[i] * k + (decays(seg, nseg, i) ? wd : 0.0f) * p[i];
        if (b) {
            b[i] = mu * b[i] + d;
            d = nesterov ? d + mu * b[i] : b[i];
        }
        p[i] -= lr * d;
        g[i] = 0;
    }
}

extern "C" cudaError_t cu_adamw(float *p, float *g, float *m, float *v, int64_t n,
                                const CudaSeg *seg, int nseg, const double *coef_dev, CudaAdamW a,
                                cudaStream_t s)
{
    LAUNCH(adamw_kernel, blocks_for(n), THREADS, s, p, g, m, v, n, seg, nseg, coef_dev, a);
    return cudaGetLastError();
}

extern "C" cudaError_t cu_sgd(float *p, float *g, float *b, int64_t n, const CudaSeg *seg, int nseg,
                              const double *coef_dev, float wd, float mu, float lr, int nesterov,
                              cudaStream_t s)
{
    LAUNCH(sgd_kernel, blocks_for(n), THREADS, s, p, g, b, n, seg, nseg, coef_dev, wd, mu, lr,
           nesterov);
    return cudaGetLastError();
}

/* ── a product with K = 0 ── */

/* C's elements as float, and a float stored as C holds it (bf16: rounded
 * to nearest even) */
static __device__ __forceinline__ float load1(const float *p) { return *p; }
static __device__ __forceinline__ float load1(const __nv_bfloat16 *p)
{
    return __bfloat162float(*p);
}
static __device__ __forceinline__ void store1(float *p, float v) { *p = v; }
static __device__ __forceinline__ void store1(__nv_bfloat16 *p, float v)
{
    *p = __float2bfloat16_rn(v);
}

template <typename T>
static __global__ void scale_kernel(T *C, int64_t M, int64_t N, int64_t ldc, float beta)
{
    GRID_STRIDE(i, M * N) {
        T *c = &C[(i / N) * ldc + i % N];
        store1(c, beta == 0 ? 0.0f : beta * load1(c));
    }
}

extern "C" cudaError_t cu_scale(void *C, int64_t M, int64_t N, int64_t ldc, float beta, int bf16,
                                cudaStream_t s)
{
    if (bf16)
        LAUNCH(scale_kernel, blocks_for(M * N), THREADS, s, (__nv_bfloat16 *)C, M, N, ldc, beta);
    else
        LAUNCH(scale_kernel, blocks_for(M * N), THREADS, s, (float *)C, M, N, ldc, beta);
    return cudaGetLastError();
}
