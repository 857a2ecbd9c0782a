/*
 * cuda_internal.h — what the CUDA backend's host files share, and nothing
 * else includes: the Backend behind internal.h's FsdRun, the checks every
 * CUDA, NCCL, cuBLASLt and MPI call goes through, and the few functions one
 * of these files calls in another. The backend is NCCL between ranks,
 * cuBLASLt for matrix products, three CUDA streams; its kernels (casts, the
 * gradient norm, AdamW, SGD) are in cuda_kernels.cu, and the host files are
 * C like the rest of the runtime and drive them through cuda.h. One concern
 * a file:
 *
 *   cuda_err.c    errors (the checks' reports, bk_abort) and the host's
 *                 waits for the GPU, which watch NCCL and time out
 *   cuda_boot.c   start-up over MPI or FSD_NCCL_ID_FILE, the device, the
 *                 streams, NCCL; shutdown (bk_start, bk_stop)
 *   cuda_mem.c    counted device buffers, the unsharded-buffer pool sized at
 *                 start-up (bk_ready), `offload = cpu`'s pinned shards,
 *                 copies to and from the host
 *   cuda_comm.c   the collectives: small ones outside steps, the step's
 *                 all-gathers and reduce-scatters on their own streams
 *   cuda_gemm.c   cuBLASLt products: a plan per shape, FSD_GEMM_BENCH
 *   cuda_step.c   the step's inputs, the trace's clock, and the update
 */
#ifndef FSDRT_CUDA_INTERNAL_H
#define FSDRT_CUDA_INTERNAL_H

#include "cuda.h"
#include "internal.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#ifdef FSD_FLOAT64
#error "the CUDA backend computes in float32; the float64 build is the CPU backend's (BACKEND=cpu64)"
#endif

/* 1: MPI launches and bootstraps the job when it can (the default); 0: a
 * build without MPI (the Makefile's MPI=0), started alone or through
 * FSD_NCCL_ID_FILE. */
#ifndef FSD_MPI
#define FSD_MPI 1
#endif
#if FSD_MPI
#include <mpi.h>
#endif

/* Small collectives (agreement, barriers, the trace's lengths) stage
 * through buffers this size. */
#define SMALL_BYTES 8192
/* cuBLASLt's workspace, allocated at start-up and handed to every
 * product, so none allocates one. */
#define BLAS_WORKSPACE_BYTES (32 << 20)

/* One product shape's cuBLASLt set-up, made on its first call and kept for
 * the run (fsdrt_gemm, fsdrt_gemm_bias, fsdrt_gemm_bias_gelu): the
 * descriptor, the layouts and the algorithm the heuristic chose, so a step
 * never asks the heuristic again and every call of a shape runs the same
 * algorithm. */
typedef struct GemmPlan {
    bool bf16;                       /* the model's act: bf16 operands, else fp32 */
    bool transA, transB;
    cublasLtEpilogue_t epilogue;     /* DEFAULT, BIAS or GELU_AUX_BIAS */
    int64_t M, N, K, lda, ldb, ldc;
    uint32_t align;                  /* bytes A, B and C are aligned to, 16..256 */
    uint32_t bias_align, aux_align;  /* the bias's and aux's (0: none): the heuristic
                                      * reads them from their addresses */
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;  /* cuBLASLt's A (our B), B (our A), C = D */
    cublasLtMatmulAlgo_t algo;
} GemmPlan;

typedef struct Pooled {
    void *p;
    int64_t cap;
    bool out;
} Pooled;

/* A group's collectives in flight (common.c keeps which are). */
typedef struct GroupComm {
    cudaEvent_t gathered, reduced;   /* recorded after the collective and its cast */
    /* offload = cpu: the master shard's copy in (h2d), the reduce-scatter's
     * end (the copy out waits on it), the reduce-scatters of this step, and
     * the device accumulator of the gradient (grad_accum > 1 only) */
    cudaEvent_t copied_in, scattered;
    int64_t reduces;
    float *acc;
    /* offload with bf16 act: this group's part of h_act (elements), and the
     * step its master shard was last narrowed into it (-1: never) */
    int64_t h_act_at, staged_step;
    /* --trace-out: the marks around the last all-gather's and
     * reduce-scatter's work on their streams (cuda_mark_on), or -1 */
    int traced_gather[2], traced_reduce[2];
} GroupComm;

struct Backend {
    /* bootstrap */
    bool mpi;                /* MPI runs the job: the unique id went over it */
    bool started_mpi;        /* MPI_Init was ours, so MPI_Finalize is too */
    const char *id_file;     /* FSD_NCCL_ID_FILE; rank 0 removes it at the end */
    bool wrote_id_file;
    double timeout_s;        /* FSD_NCCL_TIMEOUT */

    /* the device */
    int device;
    bool have_device;
    cudaStream_t compute, gather, reduce;
    cudaEvent_t fence, host_ev, stats_ev;
    ncclComm_t comm;
    bool have_comm;
    /* HSDP's mesh (bk_mesh, ncclCommSplit of comm): the shard group, this
     * replica's ranks (comm itself without replicate), and the replica
     * group, the ranks at this shard_rank of every replica */
    ncclComm_t shard, replica;
    bool have_mesh;
    cublasLtHandle_t lt;
    bool have_lt, tf32;
    void *blas_ws;
    GemmPlan *plans;                 /* one per product shape seen */
    int nplans, plans_cap;
    /* --trace-out: events marking slices' ends on their streams, made as
     * needed, timed against trace_ref, recorded at r->t0 (trace_ref_us) */
    cudaEvent_t *marks;
    int nmarks, marks_cap;
    cudaEvent_t trace_ref;
    double trace_ref_us;

    /* what the device holds (bk_memory): cudaMemGetInfo's figures when the
     * context was made, and the runtime's device buffers the counters leave
     * out (the pools' capacity; the rest but cuBLASLt's workspace in own) */
    size_t mem_free_at_start, mem_total;
    int64_t pool_bytes, own_bytes;

    /* buffers */
    Pooled *pool;
    int npool, pool_cap;
    bool pool_sized, pool_warned;
    GroupComm *gc;
    uint16_t *wire_ag, *wire_rs;     /* fp32 act: 16-bit wire buffers, largest group's size */
    int64_t wire_ag_bytes, wire_rs_bytes;
    float *reduce32;                 /* bf16 act, reduce = fp32: the reduce buffer, likewise */
    CudaSeg *seg;                    /* every group's segments, end to end */
    int *seg_at;                     /* group g's first segment */
    int32_t *d_idx, *d_targets, *d_positions;
    int32_t *h_stage;                /* pinned: each micro-batch's idx, targets */
    double *d_stats;                 /* loss, Σ g², clip coefficient, loss so far */
    double *h_stats;                 /* pinned */
    double *d_partials;              /* the norm's per-block sums */
    char *d_small, *h_small;         /* small collectives (h_small pinned) */

    /* offload = cpu (bk_ready): shard state in pinned host memory, master
     * shards copied in on h2d, reduced gradients copied out on d2h */
    bool offload;
    cudaStream_t h2d, d2h;
    int64_t acc_bytes;               /* device accumulators, counted */
    uint16_t *h_act;                 /* bf16 act: every master shard narrowed, pinned */
};

/* ── cuda_err.c: errors and host waits ── */

/* Reports `call` at file:line as failed for `why`, then ends the job
 * (bk_abort). */
_Noreturn void cuda_failed(FsdRun *r, const char *file, int line, const char *call,
                            const char *why);
/* The same for an NCCL result, with NCCL's last error message. */
_Noreturn void cuda_nccl_failed(FsdRun *r, const char *file, int line, const char *call,
                                 ncclResult_t e);
/* Waits until the GPU has passed `ev`, watching NCCL; a failure or the
 * timeout (FSD_NCCL_TIMEOUT) ends the run. The only host waits of the
 * backend are this and cuda_stream_wait_host. */
void cuda_host_wait(FsdRun *r, cudaEvent_t ev, const char *what);
/* Waits until stream s has done everything queued on it so far. */
void cuda_stream_wait_host(FsdRun *r, cudaStream_t s, const char *what);

#define CUDA_CHECK(r, call)                                                \
    do {                                                                   \
        cudaError_t e_ = (call);                                           \
        if (e_ != cudaSuccess)                                             \
            cuda_failed((r), __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

#define NCCL_CHECK(r, call)                                  \
    do {                                                     \
        ncclResult_t e_ = (call);                            \
        if (e_ != ncclSuccess)                               \
            cuda_nccl_failed((r), __FILE__, __LINE__, #call, e_); \
    } while (0)

#define BLAS_CHECK(r, call)                                                   \
    do {                                                                      \
        cublasStatus_t e_ = (call);                                           \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                      \
            cuda_failed((r), __FILE__, __LINE__, #call, cublasLtGetStatusString(e_)); \
    } while (0)

/* At shutdown a failure is reported with its call site, but there is
 * nothing left to undo: the rest of the shutdown goes on. */
#define BLAS_NOTE(r, call)                                                             \
    do {                                                                               \
        cublasStatus_t e_ = (call);                                                    \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                               \
            fprintf(stderr, "train: rank %d: %s:%d: %s failed: %s\n", (r)->rank, __FILE__, \
                    __LINE__, #call, cublasLtGetStatusString(e_));                     \
    } while (0)

#define CUDA_NOTE(r, call)                                                             \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess)                                                         \
            fprintf(stderr, "train: rank %d: %s:%d: %s failed: %s\n", (r)->rank, __FILE__, \
                    __LINE__, #call, cudaGetErrorString(e_));                          \
    } while (0)

#if FSD_MPI
#define MPI_CHECK(r, call)                                                    \
    do {                                                                      \
        int e_ = (call);                                                      \
        if (e_ != MPI_SUCCESS) {                                              \
            char why_[MPI_MAX_ERROR_STRING];                                  \
            int n_ = 0;                                                       \
            if (MPI_Error_string(e_, why_, &n_) != MPI_SUCCESS)               \
                snprintf(why_, sizeof why_, "error %d", e_);                  \
            cuda_failed((r), __FILE__, __LINE__, #call, why_);                     \
        }                                                                     \
    } while (0)
#endif

/* ── cuda_mem.c: buffers and offload ── */

/* offload = cpu's streams, events and accumulators; at shutdown, after
 * bk_stop has drained the other streams. */
void cuda_offload_stop(FsdRun *r);

/* ── cuda_comm.c: collectives ── */

/* v[0, n) of `size`-byte elements, reduced with op across ranks in place,
 * over NCCL on the compute stream (a host wait: outside steps, or after the
 * step's own). */
void cuda_allreduce_small(FsdRun *r, void *v, int64_t n, ncclDataType_t type, int64_t size,
                          ncclRedOp_t op);

/* ── cuda_gemm.c: cuBLASLt products ── */

/* Descriptors and layouts of every plan; at shutdown. */
void cuda_gemm_plans_free(FsdRun *r);
/* FSD_GEMM_BENCH: rank 0 times every product shape the run planned (at
 * shutdown, the streams drained). */
void cuda_gemm_bench(FsdRun *r);

/* ── cuda_step.c: inputs, the trace's clock, the update ── */

/* A timed event recorded on stream s: its index, or -1 with no trace. */
int cuda_mark_on(FsdRun *r, cudaStream_t s);

#endif
