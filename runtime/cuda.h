/*
 * cuda.h — between the CUDA backend's host half (cuda_*.c, C like the rest
 * of the runtime) and its kernels (cuda_kernels.cu): the loops over shard
 * elements that on the CPU are OpenMP loops in cpu.c. Nothing else includes
 * it; the emitted program's kernels are the templates', not these.
 *
 * Every launcher enqueues on the stream it is given and returns the launch's
 * status (cudaGetLastError), which the cuda_*.c files check with its call
 * site. All of them are asynchronous: none waits for the GPU.
 */
#ifndef FSDRT_CUDA_H
#define FSDRT_CUDA_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A run of a shard that does (decay 1) or does not take weight decay: the
 * device copy of internal.h's Segment, with a layout both compilers agree
 * on. */
typedef struct CudaSeg {
    int64_t begin, end;
    int32_t decay, pad;
} CudaSeg;

/* 16-bit formats (the wire's, and bf16 act's unsharded buffers), rounded
 * to nearest even as runtime/half.h rounds on the CPU. bf16: 1 for
 * bfloat16, 0 for IEEE half. */
cudaError_t cu_narrow(uint16_t *dst, const float *src, int64_t n, int bf16, cudaStream_t s);
cudaError_t cu_widen(float *dst, const uint16_t *src, int64_t n, int bf16, cudaStream_t s);
/* dst[i] += src[i]: a reduce-scatter's average into the grad shard. */
cudaError_t cu_accum(float *dst, const float *src, int64_t n, cudaStream_t s);
cudaError_t cu_accum_widen(float *dst, const uint16_t *src, int64_t n, int bf16, cudaStream_t s);

/* acc[0] += loss[0], in double: one micro-batch's loss, on the device. */
cudaError_t cu_loss_add(double *acc, const float *loss, cudaStream_t s);

/* Σ x² in double, deterministically: cu_sumsq_blocks(n) partial sums (a
 * function of n alone), each block reducing in a fixed order, then one block
 * over all partials. */
int cu_sumsq_blocks(int64_t n);
cudaError_t cu_sumsq_partial(const float *x, int64_t n, double *partials, cudaStream_t s);
/* stats[0] = acc[0] + host_loss, acc[0] = 0; stats[1] = Σ partials[0, np). */
cudaError_t cu_sumsq_finish(double *stats, const double *partials, int np, double *acc,
                            double host_loss, cudaStream_t s);
/* stats[2] = update_coef(clip, stats[0], stats[1]) (internal.h), after the
 * all-reduce: clip_coef(clip, √stats[1]), or -1 (UPDATE_SKIP) when the loss
 * or Σ g² is not finite. */
cudaError_t cu_clip(double *stats, double clip, cudaStream_t s);

/* One fused pass over a group's shard: g ← g·coef (coef = *coef_dev),
 * PyTorch's AdamW as cpu.c writes it, then g ← 0 (coef −1: only g ← 0). decay is applied where
 * the element's segment takes weight decay. */
typedef struct CudaAdamW {
    float decay;             /* 1 − lr·wd */
    float w1, b2, w2;        /* 1 − β1, β2, 1 − β2 */
    float step;              /* lr / (1 − β1^t) */
    float bc2_sqrt;          /* √(1 − β2^t) */
    float eps;
} CudaAdamW;
cudaError_t cu_adamw(float *p, float *g, float *m, float *v, int64_t n, const CudaSeg *seg,
                     int nseg, const double *coef_dev, CudaAdamW a, cudaStream_t s);
/* The same for torch.optim.SGD (momentum buffer b, NULL without momentum). */
cudaError_t cu_sgd(float *p, float *g, float *b, int64_t n, const CudaSeg *seg, int nseg,
                   const double *coef_dev, float wd, float mu, float lr, int nesterov,
                   cudaStream_t s);

/* C[i, j] = beta·C[i, j] (beta 0: 0) for i < M, j < N: a product with K =
 * 0. C is float, or with bf16 1 bf16 (computed in float, rounded once). */
cudaError_t cu_scale(void *C, int64_t M, int64_t N, int64_t ldc, float beta, int bf16,
                     cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
