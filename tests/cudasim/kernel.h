/*
 * kernel.h — what runtime/cuda_kernels.cu needs to build as host C++ for
 * cudasim (run.sh: g++ -x c++ -include kernel.h): CUDA's qualifiers as
 * nothing, the built-in indices as globals the launcher sets, and LAUNCH
 * (cuda_kernels.cu's launch macro) as a queued op on the stream.
 *
 * A launch runs its blocks one after another and, in a block, its threads
 * one after another, each to its end: right for the grid-stride kernels,
 * whose threads never meet. A kernel whose threads meet at __syncthreads
 * must be named in device.cc's team_kernels: its threads then run as
 * coroutines that take turns at each barrier, and __syncthreads called by
 * any other kernel stops the run, so a new kernel that synchronises cannot
 * pass unnoticed. __shared__ memory is static: one block runs at a time.
 */
#ifndef CUDASIM_KERNEL_H
#define CUDASIM_KERNEL_H

#include "cuda_runtime_api.h"

#include <functional>
#include <math.h>
#include <stdint.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(n)

struct dim3 {
    unsigned x, y, z;
};
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

void __syncthreads(void);

/* Queues `body` (one thread's run of the kernel, reading the indices) on
 * stream s, for grid x block threads. */
void cudasim_launch(cudaStream_t s, const char *kernel, unsigned grid, unsigned block,
                    std::function<void()> body);

#define LAUNCH(kernel, grid, block, s, ...) \
    cudasim_launch((s), #kernel, (grid), (block), [=] { kernel(__VA_ARGS__); })

#endif
