/*
 * cuda.c — the runtime's CUDA backend, host side: NCCL between ranks,
 * cuBLASLt for matrix products, three CUDA streams. Its kernels (casts, the
 * gradient norm, AdamW, SGD) are in cuda_kernels.cu; this file is C like
 * the rest of the runtime and drives them through cuda.h.
 *
 * Start-up. The local rank (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID,
 * LOCAL_RANK, MPI_LOCALRANKID; else MPI's shared-memory split) picks the
 * device. NCCL's unique id goes from rank 0 to the others over MPI
 * (MPI_Bcast), or, with FSD_NCCL_ID_FILE set, through a file on a shared
 * file system (rank 0 writes it, the others poll for it; rank and world then
 * come from RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_PROCID/SLURM_NTASKS or
 * PMI_*). Once NCCL is up every collective of the runtime goes through it,
 * so both bootstraps run the same code afterwards.
 *
 * Without MPI (FSD_MPI=0, `make ... MPI=0`: no mpi.h, no libmpi) the file
 * is the only bootstrap: a job of several ranks needs FSD_NCCL_ID_FILE, and
 * one process alone needs nothing (rank 0 makes the id and keeps it). Such a
 * build refuses to start under mpirun without the id file, and at world > 1
 * without it, rather than train as ranks that do not know of each other.
 * MPI's other jobs here already have NCCL paths (the agreement before NCCL
 * exists is the id-file launch's, the offload update's sums go over NCCL,
 * an abort ends the others through ncclCommAbort and their timeouts).
 *
 * Streams. Kernels and cuBLASLt products run on the compute stream
 * (fsdrt_cuda_stream, which the emitted program's launchers use as
 * FSD_STREAM); all-gathers on the gather stream, reduce-scatters on the reduce stream. They are ordered
 * by events only: a collective is issued after its stream waits on an event
 * recorded on the compute stream (so it sees every gradient written and
 * every update of the master shards), and fsdrt_wait_* make the compute
 * stream wait on the event recorded after it. Nothing in a step waits on
 * the host; the one host wait per step is in bk_update, after the optimizer
 * is queued, for the loss and norm of the log line. tests/cuda/no_host_sync.sh
 * checks that statically. Both collective streams use one communicator:
 * NCCL then runs the all-gathers and reduce-scatters one after another
 * (as PyTorch's single process group does), each overlapping compute.
 *
 * Collectives work in place, as the memory plan assumes. An all-gather
 * writes this rank's shard at its offset in the unsharded buffer and
 * gathers around it (sendbuff = recvbuff + rank·count); a reduce-scatter
 * averages (ncclAvg) into this rank's slice of the unsharded gradients, and
 * the same stream adds that slice into the fp32 gradient shard.
 *
 * Mixed precision (docs/cuda.md). With bf16 act (fsdrt.h: a policy with
 * param = bf16) every unsharded buffer is bf16: the all-gather narrows the
 * fp32 master shard into this rank's slice of the bf16 parameter buffer and
 * gathers in place; the bf16 gradients are reduce-scattered in place
 * (reduce = bf16), or widened into one fp32 reduce buffer and reduced there
 * (reduce = fp32), and the averaged slice is widened into the fp32 grad
 * shard; products are bf16 cuBLASLt products summed in fp32. With fp32 act
 * (param = fp32 or fp16) a 16-bit param dtype travels as 16 bits (the
 * shard is narrowed into a wire buffer, gathered, and widened into an fp32
 * unsharded buffer on the gather stream), a 16-bit reduce dtype is reduced
 * as 16 bits, and kernels and products compute in fp32 (matmuls on TF32
 * tensor cores unless FSD_TF32=0): the unsharded parameter buffers are then
 * twice the plan's size, and the counters say so.
 *
 * Offload (`offload = cpu`): shards and optimizer state are pinned host
 * memory, copied in before each all-gather and out after each
 * reduce-scatter on streams of their own, and the update runs on the host
 * (optim.c) after the step's one planned host wait; see the offload
 * section below bk_ready.
 *
 * Buffers. Unsharded buffers come from a pool of device buffers that
 * bk_ready fills at start-up by replaying the step's buffer events (the
 * model's buf_one / buf_three tables) through the pool's own best fit, so a
 * step never calls cudaMalloc or cudaFree. A buffer handed back is reused
 * safely without per-buffer events: it goes back while only the compute
 * stream can still touch it (after its gather was waited for, or after its
 * reduce-scatter was), and whoever takes it next is ordered after the
 * compute stream by the fence before its collective, or is the compute
 * stream itself.
 *
 * Errors. Every CUDA, NCCL, cuBLASLt and MPI call is checked and reported as
 * `train: rank R: file:line: call failed: why`, then the communicator is
 * aborted and the job ended (MPI_Abort where MPI runs it). Host waits poll
 * the event and ncclCommGetAsyncError, and give up after FSD_NCCL_TIMEOUT
 * seconds (default 600) with a message, so a rank that died or hangs ends
 * every other rank instead of leaving them waiting forever.
 */
#include "cuda.h"
#include "half.h"
#include "internal.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
     * reduce-scatter's work on their streams (mark_on), or -1 */
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

/* The compute stream, for launchers that have no FsdRun at hand (one run
 * per process); 0, the legacy stream, until bk_start has created it. */
static cudaStream_t compute_stream;

cudaStream_t fsdrt_cuda_stream(void) { return compute_stream; }

/* ── errors ── */

_Noreturn void bk_abort(FsdRun *r)
{
    fflush(stdout);
    fflush(stderr);
    Backend *bk = r->bk;
    if (bk && bk->have_comm) {
        /* NCCL kernels waiting for peers end; other ranks' NCCL sees them gone */
        bk->have_comm = false;
        ncclCommAbort(bk->comm);
    }
#if FSD_MPI
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down)
        MPI_Abort(MPI_COMM_WORLD, 1);
#endif
    /* not exit(): atexit handlers could wait on a device that is stuck */
    _exit(1);
}

static _Noreturn void failed(FsdRun *r, const char *file, int line, const char *call,
                             const char *why)
{
    fprintf(stderr, "train: rank %d: %s:%d: %s failed: %s\n", r->rank, file, line, call, why);
    bk_abort(r);
}

static _Noreturn void nccl_failed(FsdRun *r, const char *file, int line, const char *call,
                                  ncclResult_t e)
{
    char why[512];
    const char *last = ncclGetLastError(r->bk && r->bk->have_comm ? r->bk->comm : NULL);
    snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(e), last && *last ? ": " : "",
             last ? last : "");
    failed(r, file, line, call, why);
}

#define CUDA_CHECK(r, call)                                                \
    do {                                                                   \
        cudaError_t e_ = (call);                                           \
        if (e_ != cudaSuccess)                                             \
            failed((r), __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    } while (0)

#define NCCL_CHECK(r, call)                                  \
    do {                                                     \
        ncclResult_t e_ = (call);                            \
        if (e_ != ncclSuccess)                               \
            nccl_failed((r), __FILE__, __LINE__, #call, e_); \
    } while (0)

#define BLAS_CHECK(r, call)                                                   \
    do {                                                                      \
        cublasStatus_t e_ = (call);                                           \
        if (e_ != CUBLAS_STATUS_SUCCESS)                                      \
            failed((r), __FILE__, __LINE__, #call, cublasLtGetStatusString(e_)); \
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

static void gemm_plans_free(FsdRun *r);
static void gemm_bench(FsdRun *r);

#if FSD_MPI
#define MPI_CHECK(r, call)                                                    \
    do {                                                                      \
        int e_ = (call);                                                      \
        if (e_ != MPI_SUCCESS) {                                              \
            char why_[MPI_MAX_ERROR_STRING];                                  \
            int n_ = 0;                                                       \
            if (MPI_Error_string(e_, why_, &n_) != MPI_SUCCESS)               \
                snprintf(why_, sizeof why_, "error %d", e_);                  \
            failed((r), __FILE__, __LINE__, #call, why_);                     \
        }                                                                     \
    } while (0)
#endif

/* ── host waits: the only place the host waits for the GPU ── */

static void pause_briefly(long spins)
{
    if (spins < 200)
        return;   /* the first checks spin: most waits are short */
    struct timespec ts = {0, spins < 2000 ? 20000 : 200000};
    nanosleep(&ts, NULL);
}

/* Waits until the GPU has passed `ev`, watching NCCL while it does: an
 * asynchronous NCCL error, or no completion within the timeout, aborts the
 * communicator and ends the run with a message, so that no rank waits
 * forever on one that has stopped. */
static void host_wait(FsdRun *r, cudaEvent_t ev, const char *what)
{
    Backend *bk = r->bk;
    const double t0 = rt_now();
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            failed(r, __FILE__, __LINE__, what, cudaGetErrorString(e));
        if (bk->have_comm) {
            ncclResult_t async = ncclSuccess;
            NCCL_CHECK(r, ncclCommGetAsyncError(bk->comm, &async));
            if (async != ncclSuccess && async != ncclInProgress)
                nccl_failed(r, __FILE__, __LINE__, what, async);
        }
        if (rt_now() - t0 > bk->timeout_s) {
            fprintf(stderr,
                    "train: rank %d: %s did not complete within %.0f s (FSD_NCCL_TIMEOUT): a rank "
                    "has stopped or the network is stuck; aborting NCCL and ending the run\n",
                    r->rank, what, bk->timeout_s);
            bk_abort(r);
        }
        pause_briefly(spins);
    }
}

/* Waits until stream s has done everything queued on it so far. */
static void stream_wait_host(FsdRun *r, cudaStream_t s, const char *what)
{
    CUDA_CHECK(r, cudaEventRecord(r->bk->host_ev, s));
    host_wait(r, r->bk->host_ev, what);
}

/* Orders collective stream `comm` after everything queued on the compute
 * stream so far (FSDP2's all-gather stream waits on the current stream the
 * same way). */
static void fence(FsdRun *r, cudaStream_t comm)
{
    CUDA_CHECK(r, cudaEventRecord(r->bk->fence, r->bk->compute));
    CUDA_CHECK(r, cudaStreamWaitEvent(comm, r->bk->fence, 0));
}

/* ── the trace's clock ──
 *
 * The host only queues the work, so with --trace-out each slice's ends are
 * events recorded on the stream that runs it: an op's on the compute
 * stream (fsdrt_trace_begin/end), a collective's around its work on its
 * own stream. At the end their times are read against trace_ref, an event
 * the idle device ran at r->t0. No host waits in the step: events are
 * made and recorded there, read after the last one. */
void bk_trace_start(FsdRun *r)
{
    Backend *bk = r->bk;
    cudaStream_t ss[] = {bk->compute, bk->gather, bk->reduce, bk->h2d, bk->d2h};
    for (size_t i = 0; i < sizeof ss / sizeof *ss; i++)
        if (ss[i])
            stream_wait_host(r, ss[i], "starting the trace");
    CUDA_CHECK(r, cudaEventCreate(&bk->trace_ref));
    CUDA_CHECK(r, cudaEventRecord(bk->trace_ref, bk->compute));
    CUDA_CHECK(r, cudaEventSynchronize(bk->trace_ref));
    bk->trace_ref_us = (rt_now() - r->t0) * 1e6;
}

/* A timed event recorded on stream s: its index, or -1 with no trace */
static int mark_on(FsdRun *r, cudaStream_t s)
{
    Backend *bk = r->bk;
    if (!bk->trace_ref)
        return -1;
    if (bk->nmarks == bk->marks_cap) {
        int cap = bk->marks_cap ? 2 * bk->marks_cap : 4096;
        cudaEvent_t *grown = realloc(bk->marks, sizeof *grown * (size_t)cap);
        if (!grown)
            return -1;   /* a trace short of memory loses its device times, not the run */
        bk->marks = grown;
        bk->marks_cap = cap;
    }
    CUDA_CHECK(r, cudaEventCreate(&bk->marks[bk->nmarks]));
    CUDA_CHECK(r, cudaEventRecord(bk->marks[bk->nmarks], s));
    return bk->nmarks++;
}

int bk_trace_mark(FsdRun *r) { return mark_on(r, r->bk->compute); }

void bk_trace_collective(FsdRun *r, int g, int tid, int mark[2])
{
    const GroupComm *c = &r->bk->gc[g];
    const int *m = tid == 1 ? c->traced_gather : c->traced_reduce;
    mark[0] = m[0];
    mark[1] = m[1];
}

bool bk_trace_us(FsdRun *r, int mark, double *us)
{
    Backend *bk = r->bk;
    if (mark < 0 || mark >= bk->nmarks)
        return false;
    float ms = 0;
    CUDA_CHECK(r, cudaEventSynchronize(bk->marks[mark]));
    CUDA_CHECK(r, cudaEventElapsedTime(&ms, bk->trace_ref, bk->marks[mark]));
    *us = bk->trace_ref_us + 1e3 * (double)ms;
    return true;
}

/* ── start-up ── */

static bool env_long(const char *name, long *out)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return false;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*end || errno || x < 0)
        return false;
    *out = x;
    return true;
}

/* Rank and world of a job MPI does not run (FSD_NCCL_ID_FILE): the first
 * launcher's variables found; none at all is one process. */
static bool ranks_from_env(FsdRun *r)
{
    static const char *const vars[][2] = {{"RANK", "WORLD_SIZE"},
                                          {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                                          {"SLURM_PROCID", "SLURM_NTASKS"},
                                          {"PMI_RANK", "PMI_SIZE"}};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        long rank, world;
        if (!env_long(vars[i][0], &rank) || !env_long(vars[i][1], &world))
            continue;
        if (world < 1 || world > INT_MAX || rank >= world) {
            rt_fail(r, "%s=%ld and %s=%ld do not describe a rank of a job", vars[i][0], rank,
                    vars[i][1], world);
            return false;
        }
        r->rank = (int)rank;
        r->world = (int)world;
        return true;
    }
    return true;
}

/* The local rank from the launcher's variables (mpirun, srun, torchrun,
 * MPICH's hydra), with the number of local ranks when it says. */
static bool local_from_env(int *local, int *local_world)
{
    static const char *const vars[][2] = {{"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                                          {"SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
                                          {"LOCAL_RANK", "LOCAL_WORLD_SIZE"},
                                          {"MPI_LOCALRANKID", "MPI_LOCALNRANKS"}};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        long l, n;
        if (!env_long(vars[i][0], &l) || l > INT_MAX)
            continue;
        *local = (int)l;
        if (env_long(vars[i][1], &n) && n > l && n <= INT_MAX)
            *local_world = (int)n;
        else if (*local_world <= l)
            *local_world = (int)l + 1;
        return true;
    }
    return false;
}

#if FSD_MPI
/* MPI's start, rank and world, as the CPU backend's; the node split gives
 * the local rank where no launcher variable does. */
static bool start_mpi(FsdRun *r, int *argc, char ***argv)
{
    Backend *bk = r->bk;
    int up = 0;
    MPI_Initialized(&up);
    if (!up) {
        int provided = 0;
        if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
            rt_fail(r, "cannot start MPI (MPI_Init_thread failed); launch with mpirun or srun, or "
                       "set FSD_NCCL_ID_FILE to bootstrap NCCL through a shared file instead");
            return false;
        }
        bk->started_mpi = true;
    }
    bk->mpi = true;
    MPI_CHECK(r, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(r, MPI_Comm_rank(MPI_COMM_WORLD, &r->rank));
    MPI_CHECK(r, MPI_Comm_size(MPI_COMM_WORLD, &r->world));
    MPI_Comm node;
    MPI_CHECK(r, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL, &node));
    MPI_CHECK(r, MPI_Comm_rank(node, &r->local_rank));
    MPI_CHECK(r, MPI_Comm_size(node, &r->local_world));
    MPI_CHECK(r, MPI_Comm_free(&node));
    /* torchrun, or srun with an MPI built without Slurm's PMI, starts
     * processes MPI sees as separate jobs of one: they would each train
     * alone */
    static const char *const vars[] = {"WORLD_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        long n;
        if (r->world == 1 && env_long(vars[i], &n) && n > 1) {
            rt_fail(r, "%s=%ld, but MPI started this process alone: launch the ranks with mpirun "
                       "(or srun with Slurm's PMI support), or set FSD_NCCL_ID_FILE to a path on a "
                       "shared file system to bootstrap NCCL without MPI (docs/cuda.md)",
                    vars[i], n);
            return false;
        }
    }
    return true;
}
#else
/* Without MPI and without FSD_NCCL_ID_FILE only a process alone can start:
 * its NCCL id never has to leave it. Ranks of a larger job would each make
 * their own id and wait in NCCL's start for peers that never join it, and
 * mpirun's ranks expect an MPI bootstrap this build does not have, so both
 * are refused with what to do instead. */
static bool start_alone(FsdRun *r)
{
    static const char *const mpirun_vars[] = {"OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID"};
    for (size_t i = 0; i < sizeof mpirun_vars / sizeof *mpirun_vars; i++) {
        if (getenv(mpirun_vars[i])) {
            rt_fail(r, "started by mpirun (%s is set), but this trainer was built without MPI "
                       "(MPI=0): give the job FSD_NCCL_ID_FILE, a path on a file system every node "
                       "shares (mpirun -x FSD_NCCL_ID_FILE=PATH ...), or build it with MPI=1 "
                       "(docs/cuda.md)",
                    mpirun_vars[i]);
            return false;
        }
    }
    if (!ranks_from_env(r))
        return false;
    if (r->world > 1) {
        rt_fail(r, "rank %d of %d: this trainer was built without MPI (MPI=0), so a job of several "
                   "ranks bootstraps NCCL through a file: set FSD_NCCL_ID_FILE to a path on a file "
                   "system every node shares (docs/cuda.md)",
                r->rank, r->world);
        return false;
    }
    local_from_env(&r->local_rank, &r->local_world);
    return true;
}
#endif

static bool pick_device(FsdRun *r)
{
    Backend *bk = r->bk;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1) {
        rt_fail(r, "rank %d: no CUDA device: %s", r->rank,
                e != cudaSuccess ? cudaGetErrorString(e) : "none visible (CUDA_VISIBLE_DEVICES?)");
        return false;
    }
    if (r->local_rank < n)
        bk->device = r->local_rank;
    else if (n == 1)
        bk->device = 0;   /* each process sees its own GPU (srun --gpus-per-task, say) */
    else {
        rt_fail(r, "rank %d is local rank %d on its node, which has %d GPUs: start at most %d ranks "
                   "per node",
                r->rank, r->local_rank, n, n);
        return false;
    }
    if ((e = cudaSetDevice(bk->device)) != cudaSuccess) {
        rt_fail(r, "rank %d: cannot use GPU %d: %s", r->rank, bk->device, cudaGetErrorString(e));
        return false;
    }
    /* bf16 compute runs its products and attention on bf16 tensor cores
     * (cuBLASLt, mma.h): sm_80 and later. Say so here rather than trap in
     * the first attention kernel. */
    int major = 0, minor = 0;
    if (act_bf16(r) &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, bk->device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, bk->device) == cudaSuccess &&
        major < 8) {
        rt_fail(r, "rank %d: GPU %d is sm_%d%d; %s computes in bf16 (mixed_precision param = bf16), "
                   "which needs sm_80 or later",
                r->rank, bk->device, major, minor, r->m->name);
        return false;
    }
    bk->have_device = true;
    return true;
}

/* Every rank learns whether any failed before NCCL exists, over MPI, so
 * none waits in NCCL's start for one that has given up. */
static bool agree_before_nccl(FsdRun *r)
{
#if FSD_MPI
    if (r->bk->mpi) {
        int mine = r->err[0] ? r->rank : r->world, first = r->world;
        MPI_CHECK(r, MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
        if (first == r->world)
            return true;
        MPI_CHECK(r, MPI_Bcast(r->err, ERR_MAX, MPI_CHAR, first, MPI_COMM_WORLD));
        r->err[ERR_MAX - 1] = 0;
        return false;
    }
#endif
    return !r->err[0];   /* the others time out in NCCL's start, with a message */
}

/* FSD_NCCL_ID_FILE: rank 0 writes the id under a temporary name and
 * renames it, so a reader sees all of it or nothing; the others poll. A
 * file left by an earlier run would hand them a stale id, so rank 0
 * refuses to start over one. */
static bool id_through_file(FsdRun *r, ncclUniqueId *id)
{
    Backend *bk = r->bk;
    const char *path = bk->id_file;
    if (r->rank == 0) {
        if (access(path, F_OK) == 0) {
            rt_fail(r, "FSD_NCCL_ID_FILE %s exists: it is left from an earlier run, and the other "
                       "ranks would read its stale id; remove it, or use a path unique to this job "
                       "(e.g. $HOME/nccl-id.$SLURM_JOB_ID)",
                    path);
            return false;
        }
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
        FILE *f = fopen(tmp, "wb");
        bool ok = f && fwrite(id, sizeof *id, 1, f) == 1;
        ok = f && fclose(f) == 0 && ok;
        if (!ok || rename(tmp, path) != 0) {
            rt_fail(r, "cannot write FSD_NCCL_ID_FILE %s: %s", path, strerror(errno));
            remove(tmp);
            return false;
        }
        bk->wrote_id_file = true;
        return true;
    }
    const double t0 = rt_now();
    for (long spins = 0;; spins++) {
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1)
                return true;
        }
        if (rt_now() - t0 > bk->timeout_s) {
            rt_fail(r, "rank %d: FSD_NCCL_ID_FILE %s did not appear within %.0f s "
                       "(FSD_NCCL_TIMEOUT): is rank 0 running, and is the path on a file system "
                       "every node shares?",
                    r->rank, path, bk->timeout_s);
            return false;
        }
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
        (void)spins;
    }
}

/* ncclCommInitRank blocks until every rank has joined; a watchdog thread
 * ends the process if that takes longer than the timeout (the main thread
 * cannot: it is inside NCCL). */
typedef struct Watchdog {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    double timeout_s;
    int rank;
} Watchdog;

static void *watchdog(void *arg)
{
    Watchdog *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)w->timeout_s;
    pthread_mutex_lock(&w->mu);
    int e = 0;
    while (!w->done && e != ETIMEDOUT)
        e = pthread_cond_timedwait(&w->cv, &w->mu, &until);
    bool done = w->done;
    pthread_mutex_unlock(&w->mu);
    if (!done) {
        fprintf(stderr,
                "train: rank %d: NCCL's start did not complete within %.0f s (FSD_NCCL_TIMEOUT): "
                "not every rank joined (a rank failed before it, or the ranks were given "
                "different ids)\n",
                w->rank, w->timeout_s);
        fflush(stderr);
        _exit(1);
    }
    return NULL;
}

static void start_nccl(FsdRun *r, const ncclUniqueId *id)
{
    Backend *bk = r->bk;
    Watchdog w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, bk->timeout_s, r->rank};
    pthread_t t;
    bool watching = pthread_create(&t, NULL, watchdog, &w) == 0;
    NCCL_CHECK(r, ncclCommInitRank(&bk->comm, r->world, *id, r->rank));
    bk->have_comm = true;
    if (watching) {
        pthread_mutex_lock(&w.mu);
        w.done = true;
        pthread_cond_signal(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(t, NULL);
    }
}

bool bk_start(FsdRun *r, int *argc, char ***argv)
{
    r->rank = 0;
    r->world = r->local_world = 1;
    r->local_rank = 0;
    Backend *bk = calloc(1, sizeof *bk);
    if (!bk) {
        rt_fail(r, "out of memory starting the runtime");
        return false;
    }
    r->bk = bk;
    long t;
    bk->timeout_s = env_long("FSD_NCCL_TIMEOUT", &t) && t > 0 ? (double)t : 600;
    const char *tf32 = getenv("FSD_TF32");
    bk->tf32 = !(tf32 && strcmp(tf32, "0") == 0);
    const char *id_file = getenv("FSD_NCCL_ID_FILE");
    if (id_file && *id_file) {
        bk->id_file = id_file;
        if (!ranks_from_env(r))
            return false;
        r->local_world = r->world == 1 ? 1 : 0;
        if (!local_from_env(&r->local_rank, &r->local_world) && r->world > 1) {
            rt_fail(r, "rank %d: no local rank in the environment (LOCAL_RANK, SLURM_LOCALID, "
                       "OMPI_COMM_WORLD_LOCAL_RANK): it picks this process's GPU",
                    r->rank);
            return false;
        }
        if (r->local_world < 1)
            r->local_world = 1;
    } else {
#if FSD_MPI
        if (!start_mpi(r, argc, argv))
            return false;
        local_from_env(&r->local_rank, &r->local_world);
#else
        if (!start_alone(r))
            return false;
#endif
    }
    if (!r->err[0])
        pick_device(r);
    if (!agree_before_nccl(r))
        return false;

    /* the device: collective streams first in line, so a gather is not held
     * behind queued compute */
    int least = 0, greatest = 0;
    CUDA_CHECK(r, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(r, cudaStreamCreateWithPriority(&bk->compute, cudaStreamNonBlocking, least));
    CUDA_CHECK(r, cudaStreamCreateWithPriority(&bk->gather, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(r, cudaStreamCreateWithPriority(&bk->reduce, cudaStreamNonBlocking, greatest));
    compute_stream = bk->compute;
    CUDA_CHECK(r, cudaEventCreateWithFlags(&bk->fence, cudaEventDisableTiming));
    CUDA_CHECK(r, cudaEventCreateWithFlags(&bk->host_ev, cudaEventDisableTiming));
    CUDA_CHECK(r, cudaEventCreateWithFlags(&bk->stats_ev, cudaEventDisableTiming));
    bk->gc = calloc((size_t)r->m->ngroups + 1, sizeof *bk->gc);
    if (!bk->gc)
        failed(r, __FILE__, __LINE__, "calloc", "out of memory");
    for (int g = 0; g < r->m->ngroups; g++) {
        CUDA_CHECK(r, cudaEventCreateWithFlags(&bk->gc[g].gathered, cudaEventDisableTiming));
        CUDA_CHECK(r, cudaEventCreateWithFlags(&bk->gc[g].reduced, cudaEventDisableTiming));
        for (int k = 0; k < 2; k++)
            bk->gc[g].traced_gather[k] = bk->gc[g].traced_reduce[k] = -1;
    }
    BLAS_CHECK(r, cublasLtCreate(&bk->lt));
    bk->have_lt = true;
    CUDA_CHECK(r, cudaMalloc(&bk->blas_ws, BLAS_WORKSPACE_BYTES));
    CUDA_CHECK(r, cudaMalloc((void **)&bk->d_small, SMALL_BYTES));
    CUDA_CHECK(r, cudaMallocHost((void **)&bk->h_small, SMALL_BYTES));

    /* NCCL */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (r->rank == 0)
        NCCL_CHECK(r, ncclGetUniqueId(&id));
#if FSD_MPI
    if (bk->mpi)
        MPI_CHECK(r, MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD));
#endif
    /* neither: a process alone (FSD_MPI=0), which keeps its own id */
    if (bk->id_file && !id_through_file(r, &id))
        return false;
    start_nccl(r, &id);
    return true;
}

static void offload_stop(FsdRun *r);

void bk_stop(FsdRun *r)
{
    Backend *bk = r->bk;
    if (!bk)
        return;
    if (bk->have_device && bk->compute) {
        /* nothing is queued at a normal end; after an error, this drains
         * what is (under the timeout) before the buffers go */
        stream_wait_host(r, bk->gather, "shutting down");
        stream_wait_host(r, bk->reduce, "shutting down");
        stream_wait_host(r, bk->compute, "shutting down");
    }
    if (r->status == 0 && getenv("FSD_GEMM_BENCH") && bk->nplans)
        gemm_bench(r);
    offload_stop(r);
    /* shutting down: failures are reported, but there is nothing to undo */
    for (int i = 0; i < bk->npool; i++)
        CUDA_NOTE(r, cudaFree(bk->pool[i].p));
    free(bk->pool);
    void *dev[] = {bk->wire_ag, bk->wire_rs, bk->reduce32, bk->seg, bk->d_idx, bk->d_targets,
                   bk->d_positions, bk->d_stats, bk->d_partials, bk->d_small, bk->blas_ws};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i])
            CUDA_NOTE(r, cudaFree(dev[i]));
    rt_count(r, -(bk->wire_ag_bytes + bk->wire_rs_bytes));
    void *pinned[] = {bk->h_stage, bk->h_stats, bk->h_small};
    for (size_t i = 0; i < sizeof pinned / sizeof *pinned; i++)
        if (pinned[i])
            CUDA_NOTE(r, cudaFreeHost(pinned[i]));
    free(bk->seg_at);
    gemm_plans_free(r);
    if (bk->have_lt) {
        bk->have_lt = false;
        BLAS_NOTE(r, cublasLtDestroy(bk->lt));
    }
    if (bk->have_comm) {
        bk->have_comm = false;
        ncclResult_t e = ncclCommFinalize(bk->comm);
        if (e == ncclSuccess)
            e = ncclCommDestroy(bk->comm);
        else
            ncclCommAbort(bk->comm);
        if (e != ncclSuccess)
            fprintf(stderr, "train: rank %d: %s:%d: shutting down NCCL failed: %s\n", r->rank,
                    __FILE__, __LINE__, ncclGetErrorString(e));
    }
    if (bk->gc) {
        for (int g = 0; g < r->m->ngroups; g++) {
            if (bk->gc[g].gathered)
                CUDA_NOTE(r, cudaEventDestroy(bk->gc[g].gathered));
            if (bk->gc[g].reduced)
                CUDA_NOTE(r, cudaEventDestroy(bk->gc[g].reduced));
        }
        free(bk->gc);
    }
    for (int i = 0; i < bk->nmarks; i++)
        CUDA_NOTE(r, cudaEventDestroy(bk->marks[i]));
    free(bk->marks);
    cudaEvent_t evs[] = {bk->fence, bk->host_ev, bk->stats_ev, bk->trace_ref};
    for (size_t i = 0; i < sizeof evs / sizeof *evs; i++)
        if (evs[i])
            CUDA_NOTE(r, cudaEventDestroy(evs[i]));
    cudaStream_t ss[] = {bk->compute, bk->gather, bk->reduce};
    for (size_t i = 0; i < sizeof ss / sizeof *ss; i++)
        if (ss[i])
            CUDA_NOTE(r, cudaStreamDestroy(ss[i]));
    compute_stream = 0;
    if (bk->wrote_id_file)
        remove(bk->id_file);
#if FSD_MPI
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down && bk->started_mpi && MPI_Finalize() != MPI_SUCCESS)
        fprintf(stderr, "train: rank %d: %s:%d: shutting down MPI failed\n", r->rank, __FILE__,
                __LINE__);
#endif
    free(bk);
    r->bk = NULL;
}

/* ── small collectives, over NCCL on the compute stream (outside steps) ── */

/* v[0, n) of `size`-byte elements, reduced with op across ranks in place. */
static void allreduce_small(FsdRun *r, void *v, int64_t n, ncclDataType_t type, int64_t size,
                            ncclRedOp_t op)
{
    Backend *bk = r->bk;
    const int64_t per = SMALL_BYTES / size;
    for (int64_t at = 0; at < n; at += per) {
        int64_t k = n - at < per ? n - at : per;
        char *h = (char *)v + at * size;
        memcpy(bk->h_small, h, (size_t)(k * size));
        CUDA_CHECK(r, cudaMemcpyAsync(bk->d_small, bk->h_small, (size_t)(k * size),
                                      cudaMemcpyHostToDevice, bk->compute));
        NCCL_CHECK(r, ncclAllReduce(bk->d_small, bk->d_small, (size_t)k, type, op, bk->comm,
                                    bk->compute));
        CUDA_CHECK(r, cudaMemcpyAsync(bk->h_small, bk->d_small, (size_t)(k * size),
                                      cudaMemcpyDeviceToHost, bk->compute));
        stream_wait_host(r, bk->compute, "a small all-reduce");
        memcpy(h, bk->h_small, (size_t)(k * size));
    }
}

bool bk_agree(FsdRun *r)
{
    Backend *bk = r->bk;
    int first = r->err[0] ? r->rank : r->world;
    allreduce_small(r, &first, 1, ncclInt32, sizeof first, ncclMin);
    if (first == r->world)
        return false;
    if (r->rank == first)
        memcpy(bk->h_small, r->err, ERR_MAX);
    CUDA_CHECK(r, cudaMemcpyAsync(bk->d_small, bk->h_small, ERR_MAX, cudaMemcpyHostToDevice,
                                  bk->compute));
    NCCL_CHECK(r, ncclBroadcast(bk->d_small, bk->d_small, ERR_MAX, ncclChar, first, bk->comm,
                                bk->compute));
    CUDA_CHECK(r, cudaMemcpyAsync(bk->h_small, bk->d_small, ERR_MAX, cudaMemcpyDeviceToHost,
                                  bk->compute));
    stream_wait_host(r, bk->compute, "agreeing on an error");
    memcpy(r->err, bk->h_small, ERR_MAX);
    r->err[ERR_MAX - 1] = 0;
    return true;
}

void bk_barrier(FsdRun *r)
{
    int v = 0;
    allreduce_small(r, &v, 1, ncclInt32, sizeof v, ncclSum);
}

void bk_allreduce_sum(FsdRun *r, double *v, int n)
{
    allreduce_small(r, v, n, ncclFloat64, sizeof *v, ncclSum);
}

void bk_gather_shards(FsdRun *r, int g, real *dst)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    const int64_t bytes = G->padded * (int64_t)sizeof(real);
    /* its own allocation, not the pool's: outside the step, and with bf16
     * act twice the size of the pool's parameter buffers, which it would
     * otherwise join for good */
    real *all = bk_alloc(r, bytes);
    if (!all)   /* the other ranks are in the all-gather: end them too */
        failed(r, __FILE__, __LINE__, "cudaMalloc", "out of GPU memory gathering a group's shards");
    const real *mine = G->master;
    if (bk->offload) {   /* a host shard: gathered from its slice, in place */
        CUDA_CHECK(r, cudaMemcpyAsync(all + G->lo, G->master, (size_t)G->shard * sizeof(real),
                                      cudaMemcpyHostToDevice, bk->compute));
        mine = all + G->lo;
    }
    NCCL_CHECK(r, ncclAllGather(mine, all, (size_t)G->shard, ncclFloat32, bk->comm,
                                bk->compute));
    if (r->rank == 0)
        CUDA_CHECK(r, cudaMemcpyAsync(dst, all, (size_t)bytes, cudaMemcpyDeviceToHost, bk->compute));
    stream_wait_host(r, bk->compute, "gathering a group's shards");
    bk_free(r, all, bytes);
}

bool bk_gather_bytes(FsdRun *r, const char *buf, int64_t n, char **out, int64_t *outn)
{
    Backend *bk = r->bk;
    *out = NULL;
    *outn = 0;
    int64_t *len = calloc((size_t)r->world, sizeof *len);
    int ok = len != NULL;
    allreduce_small(r, &ok, 1, ncclInt32, sizeof ok, ncclMin);
    if (!ok) {
        free(len);
        return false;
    }
    len[r->rank] = n;
    allreduce_small(r, len, r->world, ncclInt64, sizeof *len, ncclSum);
    int64_t total = 0;
    for (int i = 0; i < r->world; i++)
        total += len[i];
    char *mine = NULL, *all = NULL;
    ok = cudaMalloc((void **)&mine, (size_t)(n > 0 ? n : 1)) == cudaSuccess;
    if (ok && r->rank == 0)
        ok = cudaMalloc((void **)&all, (size_t)(total > 0 ? total : 1)) == cudaSuccess &&
             (*out = malloc((size_t)total + 1)) != NULL;
    if (!ok)
        cudaGetLastError();   /* an allocation failure is not sticky: reported below */
    allreduce_small(r, &ok, 1, ncclInt32, sizeof ok, ncclMin);
    if (ok) {
        if (n > 0)
            CUDA_CHECK(r, cudaMemcpyAsync(mine, buf, (size_t)n, cudaMemcpyHostToDevice, bk->compute));
        NCCL_CHECK(r, ncclGroupStart());
        if (r->rank != 0 && n > 0)
            NCCL_CHECK(r, ncclSend(mine, (size_t)n, ncclChar, 0, bk->comm, bk->compute));
        int64_t at = len[0];
        for (int i = 1; r->rank == 0 && i < r->world; at += len[i++])
            if (len[i] > 0)
                NCCL_CHECK(r, ncclRecv(all + at, (size_t)len[i], ncclChar, i, bk->comm, bk->compute));
        NCCL_CHECK(r, ncclGroupEnd());
        if (r->rank == 0 && total > 0) {
            if (n > 0)
                CUDA_CHECK(r, cudaMemcpyAsync(all, mine, (size_t)n, cudaMemcpyDeviceToDevice, bk->compute));
            CUDA_CHECK(r, cudaMemcpyAsync(*out, all, (size_t)total, cudaMemcpyDeviceToHost, bk->compute));
        }
        stream_wait_host(r, bk->compute, "gathering the trace");
        *outn = r->rank == 0 ? total : 0;
    } else {
        free(*out);
        *out = NULL;
    }
    if (mine)
        CUDA_CHECK(r, cudaFree(mine));
    if (all)
        CUDA_CHECK(r, cudaFree(all));
    free(len);
    return ok;
}

/* ── buffers ── */

void *bk_alloc(FsdRun *r, int64_t bytes)
{
    void *p = NULL;
    size_t n = (size_t)(bytes > 0 ? bytes : FSDRT_ARENA_ALIGN);
    if (cudaMalloc(&p, n) != cudaSuccess) {
        cudaGetLastError();   /* out of memory is not sticky; the caller says what for */
        return NULL;
    }
    CUDA_CHECK(r, cudaMemsetAsync(p, 0, n, r->bk->compute));
    rt_count(r, bytes);
    return p;
}

void bk_free(FsdRun *r, void *p, int64_t bytes)
{
    if (!p)
        return;
    CUDA_CHECK(r, cudaFree(p));
    rt_count(r, -bytes);
}

/* offload = cpu: pinned host memory, which the copies in and out of a step
 * need to be asynchronous, and which the plan does not count on the device
 * (docs/cuda.md); bk_ready has not run yet, so the model says. */
void *bk_alloc_shard(FsdRun *r, int64_t bytes)
{
    if (!r->m->offload_cpu)
        return bk_alloc(r, bytes);
    void *p = NULL;
    size_t n = (size_t)(bytes > 0 ? bytes : FSDRT_ARENA_ALIGN);
    if (cudaHostAlloc(&p, n, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();   /* not sticky; the caller says what for */
        return NULL;
    }
    memset(p, 0, n);
    return p;
}

void bk_free_shard(FsdRun *r, void *p, int64_t bytes)
{
    if (!r->m->offload_cpu)
        bk_free(r, p, bytes);
    else if (p)
        CUDA_CHECK(r, cudaFreeHost(p));
}

/* A new pool buffer. At start-up this is how the pool is sized; inside a
 * step it means the start-up replay missed a buffer the schedule needs (a
 * bug worth a note: cudaMalloc may synchronise the device), and it still
 * works. */
static int pool_grow(FsdRun *r, int64_t bytes)
{
    Backend *bk = r->bk;
    if (bk->pool_sized && r->in_step && !bk->pool_warned) {
        bk->pool_warned = true;
        fprintf(stderr,
                "train: rank %d: note: step %lld allocated an unsharded buffer of %lld bytes that "
                "the start-up replay of the schedule's buffer events did not foresee\n",
                r->rank, (long long)r->step, (long long)bytes);
    }
    if (bk->npool == bk->pool_cap) {
        int cap = bk->pool_cap ? 2 * bk->pool_cap : 16;
        Pooled *np = realloc(bk->pool, sizeof *np * (size_t)cap);
        if (!np)
            failed(r, __FILE__, __LINE__, "realloc", "out of memory");
        bk->pool = np;
        bk->pool_cap = cap;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (size_t)(bytes > 0 ? bytes : FSDRT_ARENA_ALIGN));
    if (e != cudaSuccess) {
        fprintf(stderr,
                "train: rank %d: out of GPU memory allocating an unsharded buffer of %lld bytes (%s); "
                "fsdpc --dump-memory shows the plan: a smaller --micro-batch, more ranks or "
                "reshard_after_forward = true need less\n",
                r->rank, (long long)bytes, cudaGetErrorString(e));
        bk_abort(r);
    }
    bk->pool[bk->npool] = (Pooled){p, bytes, false};
    return bk->npool++;
}

/* The smallest free buffer that fits, as cpu.c's pool chooses. */
void *bk_pool_get(FsdRun *r, int64_t bytes, int64_t count)
{
    Backend *bk = r->bk;
    int best = -1;
    for (int i = 0; i < bk->npool; i++)
        if (!bk->pool[i].out && bk->pool[i].cap >= bytes &&
            (best < 0 || bk->pool[i].cap < bk->pool[best].cap))
            best = i;
    if (best < 0)
        best = pool_grow(r, bytes);
    bk->pool[best].out = true;
    rt_count(r, count);
    return bk->pool[best].p;
}

void bk_pool_put(FsdRun *r, void *p, int64_t count)
{
    Backend *bk = r->bk;
    for (int i = 0; i < bk->npool; i++)
        if (bk->pool[i].p == p && bk->pool[i].out) {
            bk->pool[i].out = false;
            rt_count(r, -count);
            return;
        }
    RT_BUG(r, "a buffer returned to the pool did not come from it");
}

/* Replays the step's buffer events through the pool (FsdModel's buf_one,
 * or buf_three's first, middle and last micro-batches arranged as this
 * run's grad_accum arranges them), so that the pool holds what a step takes
 * before the first one runs. A step starts with every buffer back in the
 * pool, and makes the same requests in the same order, so best fit then
 * chooses exactly as here. */
static void size_pools(FsdRun *r)
{
    const FsdModel *m = r->m;
    const int64_t k = r->cfg.grad_accum;
    void **params = calloc((size_t)m->ngroups + 1, sizeof *params);
    void **grads = calloc((size_t)m->ngroups + 1, sizeof *grads);
    if (!params || !grads)
        failed(r, __FILE__, __LINE__, "calloc", "out of memory");
    /* past a few middle micro-batches the pool's state repeats */
    const int64_t micros = k > 8 ? 8 : k;
    for (int64_t mb = 0; mb < micros; mb++) {
        const FsdBufEvent *ev = k == 1 ? m->buf_one : m->buf_three;
        const int n = k == 1 ? m->nbuf_one : m->nbuf_three;
        const int which = k == 1 ? 0 : mb == 0 ? 0 : mb == micros - 1 ? 2 : 1;
        for (int i = 0; i < n; i++) {
            if (ev[i].micro != which || ev[i].group < 0)
                continue;
            const int g = ev[i].group;
            if (g >= m->ngroups)
                RT_BUG(r, "buffer event %d names group %d of %d", i, g, m->ngroups);
            const int64_t bytes = unsharded_bytes(r, &r->groups[g]);   /* as common.c asks */
            switch (ev[i].op) {
            case FSD_BUF_GATHER:
                if (!params[g])
                    params[g] = bk_pool_get(r, bytes, 0);
                break;
            case FSD_BUF_RESHARD:
                if (params[g])
                    bk_pool_put(r, params[g], 0);
                params[g] = NULL;
                break;
            case FSD_BUF_ALLOC_GRADS:
                if (!grads[g])
                    grads[g] = bk_pool_get(r, bytes, 0);
                break;
            case FSD_BUF_FREE_GRADS:
                if (grads[g])
                    bk_pool_put(r, grads[g], 0);
                grads[g] = NULL;
                break;
            }
        }
    }
    for (int g = 0; g < m->ngroups; g++) {
        if (params[g])
            bk_pool_put(r, params[g], 0);
        if (grads[g])
            bk_pool_put(r, grads[g], 0);
    }
    free(params);
    free(grads);
    r->bk->pool_sized = true;
}

/* Device memory bk_ready allocates for the run: counted when it is one of
 * the plan's buffers (the wire buffers), not when it is the plan's inputs
 * or a few bytes of bookkeeping. */
static void *device(FsdRun *r, int64_t bytes, bool counted)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (size_t)(bytes > 0 ? bytes : FSDRT_ARENA_ALIGN));
    if (e != cudaSuccess) {
        cudaGetLastError();
        rt_fail(r, "out of GPU memory allocating %lld bytes at start-up", (long long)bytes);
        return NULL;
    }
    CUDA_CHECK(r, cudaMemsetAsync(p, 0, (size_t)(bytes > 0 ? bytes : FSDRT_ARENA_ALIGN), r->bk->compute));
    if (counted)
        rt_count(r, bytes);
    return p;
}

/* ── offload = cpu ──
 *
 * Master, gradient and optimizer-state shards are pinned host memory
 * (bk_alloc_shard); the optimizer and the gradient norm run on the host
 * (optim.c, OpenMP), in bk_update after its one host wait. In a step:
 *
 * - an all-gather copies this rank's master shard in on the h2d stream,
 *   into its slice of the unsharded buffer, and the gather stream waits on
 *   that copy. With fp32 act the fp32 shard is copied, and a 16-bit param
 *   dtype is narrowed on the device from there into the wire buffer, as
 *   without offload: the fp32 buffer is the staging. With bf16 act the
 *   slice holds only bf16, so the host narrows the shard into a pinned
 *   bf16 copy (h_act) and that is copied in: half the bytes over PCIe of
 *   copying fp32 into a device staging buffer and narrowing there, and no
 *   device buffer outside the plan. The host narrows a group once a step,
 *   at its first all-gather (stage_bf16): the masters change only in the
 *   update between steps, whose host wait has seen every copy out of h_act
 *   done, so no copy in flight ever reads what the host rewrites;
 * - a reduce-scatter leaves this rank's averaged fp32 slice on the device
 *   (widened there for a 16-bit reduce dtype); with grad_accum 1 and fp32
 *   act the d2h stream copies that slice straight into the pinned gradient
 *   shard; with more micro-batches, or bf16 act (whose slice is bf16, no
 *   room for fp32), it is added into a device accumulator, and only the
 *   group's last reduce-scatter of the step copies the accumulator out
 *   (and zeroes it). One copy a step, not one a micro-batch (FSDP2's
 *   offload copies every reduce-scatter out), and no host work in the
 *   step but bf16 act's narrowing, at the price of a device gradient shard
 *   per group with an accumulator (counted).
 *
 * The compute stream waits on the copy out (through the group's `reduced`
 * event) before its unsharded gradients go back to the pool, so the pool
 * never hands out a buffer a copy still reads. */

static void offload_start(FsdRun *r)
{
    Backend *bk = r->bk;
    int least = 0, greatest = 0;
    int64_t staged = 0;   /* bf16 act: h_act's elements so far */
    bk->offload = true;
    CUDA_CHECK(r, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(r, cudaStreamCreateWithPriority(&bk->h2d, cudaStreamNonBlocking, greatest));
    CUDA_CHECK(r, cudaStreamCreateWithPriority(&bk->d2h, cudaStreamNonBlocking, greatest));
    for (int g = 0; g < r->m->ngroups; g++) {
        GroupComm *c = &bk->gc[g];
        CUDA_CHECK(r, cudaEventCreateWithFlags(&c->copied_in, cudaEventDisableTiming));
        CUDA_CHECK(r, cudaEventCreateWithFlags(&c->scattered, cudaEventDisableTiming));
        if (r->cfg.grad_accum > 1 || act_bf16(r)) {
            const int64_t bytes = r->groups[g].shard * (int64_t)sizeof(real);
            c->acc = device(r, bytes, true);
            bk->acc_bytes += c->acc ? bytes : 0;
        }
        c->h_act_at = staged;
        c->staged_step = -1;
        staged += r->groups[g].shard;
    }
    if (act_bf16(r) && cudaMallocHost((void **)&bk->h_act, (size_t)(2 * staged)) != cudaSuccess) {
        cudaGetLastError();
        bk->h_act = NULL;
        rt_fail(r, "out of pinned host memory for the bf16 copies of the master shards "
                   "(%lld bytes)",
                (long long)(2 * staged));
    }
}

/* At shutdown, after bk_stop has drained the other streams. */
static void offload_stop(FsdRun *r)
{
    Backend *bk = r->bk;
    if (!bk->offload)
        return;
    if (bk->h2d)
        stream_wait_host(r, bk->h2d, "shutting down");
    if (bk->d2h)
        stream_wait_host(r, bk->d2h, "shutting down");
    for (int g = 0; bk->gc && g < r->m->ngroups; g++) {
        GroupComm *c = &bk->gc[g];
        if (c->acc)
            CUDA_NOTE(r, cudaFree(c->acc));
        if (c->copied_in)
            CUDA_NOTE(r, cudaEventDestroy(c->copied_in));
        if (c->scattered)
            CUDA_NOTE(r, cudaEventDestroy(c->scattered));
    }
    rt_count(r, -bk->acc_bytes);
    if (bk->h_act)
        CUDA_NOTE(r, cudaFreeHost(bk->h_act));
    if (bk->h2d)
        CUDA_NOTE(r, cudaStreamDestroy(bk->h2d));
    if (bk->d2h)
        CUDA_NOTE(r, cudaStreamDestroy(bk->d2h));
}

void bk_ready(FsdRun *r)
{
    const FsdModel *m = r->m;
    Backend *bk = r->bk;
    if (m->offload_cpu)
        offload_start(r);

    /* inputs: device buffers the kernels read, and pinned staging for every
     * micro-batch of a step (no slot is rewritten before the step's host
     * wait, so copies from them never race the loader) */
    const int64_t T = m->seq, BT = r->cfg.micro_batch * T;
    bk->d_idx = device(r, BT * 4, false);
    bk->d_targets = device(r, BT * 4, false);
    bk->d_positions = device(r, T * 4, false);
    cudaError_t e = cudaMallocHost((void **)&bk->h_stage, (size_t)(2 * BT * 4 * r->cfg.grad_accum));
    if (e != cudaSuccess) {
        cudaGetLastError();
        bk->h_stage = NULL;
        rt_fail(r, "out of pinned host memory for %lld micro-batches of tokens",
                (long long)r->cfg.grad_accum);
    }
    CUDA_CHECK(r, cudaMallocHost((void **)&bk->h_stats, 4 * sizeof(double)));
    bk->d_stats = device(r, 4 * sizeof(double), false);

    /* every group's segments, and room for the norm's partial sums */
    int nseg = 0, npart = 0;
    bk->seg_at = calloc((size_t)m->ngroups + 1, sizeof *bk->seg_at);
    for (int g = 0; g < m->ngroups; g++) {
        if (bk->seg_at)
            bk->seg_at[g] = nseg;
        nseg += r->groups[g].nseg;
        npart += cu_sumsq_blocks(r->groups[g].shard);
    }
    CudaSeg *seg = calloc((size_t)nseg + 1, sizeof *seg);
    if (!seg || !bk->seg_at) {
        free(seg);
        rt_fail(r, "out of memory");
        return;
    }
    for (int g = 0, at = 0; g < m->ngroups; g++)
        for (int k = 0; k < r->groups[g].nseg; k++, at++) {
            const Segment *s = &r->groups[g].seg[k];
            seg[at] = (CudaSeg){s->begin, s->end, s->decay, 0};
        }
    bk->seg = device(r, (int64_t)sizeof *seg * (nseg + 1), false);
    bk->d_partials = device(r, (int64_t)sizeof(double) * npart, false);

    /* fp32 act: 16-bit wire buffers, one per direction, the largest group's
     * size; its stream uses it for one collective at a time. bf16 act
     * gathers in the unsharded buffers themselves and reduces bf16 in
     * place, but an fp32 reduce widens the gradients into one fp32 buffer
     * used the same way; it is not counted here: common.c counts a padded ×
     * 4 buffer for each reduce-scatter while it runs, as the plan does */
    int64_t most = 0;
    for (int g = 0; g < m->ngroups; g++)
        if (r->groups[g].padded > most)
            most = r->groups[g].padded;
    if (act_bf16(r)) {
        if (m->reduce_dtype == FSD_FP32)
            bk->reduce32 = device(r, 4 * most, false);
    } else if (m->param_dtype != FSD_FP32) {
        bk->wire_ag_bytes = 2 * most;
        bk->wire_ag = device(r, bk->wire_ag_bytes, true);
    }
    if (!act_bf16(r) && m->reduce_dtype != FSD_FP32) {
        bk->wire_rs_bytes = 2 * most;
        bk->wire_rs = device(r, bk->wire_rs_bytes, true);
    }
    if (r->err[0]) {
        free(seg);
        return;
    }
    if (bk->seg)
        CUDA_CHECK(r, cudaMemcpyAsync(bk->seg, seg, sizeof *seg * (size_t)nseg, cudaMemcpyHostToDevice,
                                      bk->compute));
    CUDA_CHECK(r, cudaMemcpyAsync(bk->d_positions, r->positions, (size_t)(T * 4),
                                  cudaMemcpyHostToDevice, bk->compute));
    size_pools(r);
    stream_wait_host(r, bk->compute, "start-up");
    free(seg);
}

/* Whether p is device memory; with offload = cpu the shard state that
 * checkpoints, --export and --init-from reach is host memory. */
static bool on_device(FsdRun *r, const void *p)
{
    struct cudaPointerAttributes a;
    CUDA_CHECK(r, cudaPointerGetAttributes(&a, p));
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* Outside a step, host to host: bk_update's host wait has seen every copy
 * of the last step done, and the next copies in are not issued yet. */
static bool host_copy(FsdRun *r, void *dst, const void *src, int64_t bytes)
{
    if (!r->bk->offload || on_device(r, dst) || on_device(r, src))
        return false;
    if (dst != src)
        memcpy(dst, src, (size_t)bytes);
    return true;
}

void bk_to_host(FsdRun *r, void *dst, const void *src, int64_t bytes)
{
    if (bytes <= 0 || host_copy(r, dst, src, bytes))
        return;
    CUDA_CHECK(r, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, r->bk->compute));
    stream_wait_host(r, r->bk->compute, "a copy to the host");
}

void bk_from_host(FsdRun *r, void *dst, const void *src, int64_t bytes)
{
    if (bytes <= 0 || host_copy(r, dst, src, bytes))
        return;
    CUDA_CHECK(r, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, r->bk->compute));
    stream_wait_host(r, r->bk->compute, "a copy from the host");
}

/* ── the step's inputs ── */

void bk_inputs(FsdRun *r, int micro)
{
    Backend *bk = r->bk;
    const int64_t BT = r->cfg.micro_batch * r->m->seq, at = (int64_t)micro * 2 * BT;
    const size_t bytes = (size_t)BT * sizeof(int32_t);
    /* through pinned memory: a copy from pageable memory may synchronise */
    memcpy(bk->h_stage + at, r->idx, bytes);
    memcpy(bk->h_stage + at + BT, r->targets, bytes);
    CUDA_CHECK(r, cudaMemcpyAsync(bk->d_idx, bk->h_stage + at, bytes, cudaMemcpyHostToDevice,
                                  bk->compute));
    CUDA_CHECK(r, cudaMemcpyAsync(bk->d_targets, bk->h_stage + at + BT, bytes,
                                  cudaMemcpyHostToDevice, bk->compute));
}

const int32_t *fsdrt_idx(const FsdRun *r) { return r->bk->d_idx; }
const int32_t *fsdrt_targets(const FsdRun *r) { return r->bk->d_targets; }
const int32_t *fsdrt_positions(const FsdRun *r) { return r->bk->d_positions; }

void fsdrt_add_loss_tensor(FsdRun *r, const real *loss)
{
    CUDA_CHECK(r, cu_loss_add(r->bk->d_stats + 3, loss, r->bk->compute));
}

/* ── parameters: all-gather ── */

static ncclDataType_t wire_type(FsdDtype dt) { return dt == FSD_BF16 ? ncclBfloat16 : ncclFloat16; }

/* Unsharded buffers are act on the device: bf16 with bf16 act; with fp32
 * act fp32 whatever the wire's dtype (the 16-bit wire buffers are
 * bk_ready's, counted there). */
int64_t bk_unsharded_count(FsdRun *r, int64_t n, FsdDtype dt)
{
    return n * act_bytes(r);
}

/* offload with bf16 act: group g's master shard narrowed on the host into
 * its part of h_act, at its first all-gather of a step (the offload section
 * above says why that is the one time it may be written). */
static void stage_bf16(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    GroupComm *c = &bk->gc[g];
    const Group *G = &r->groups[g];
    if (c->staged_step == r->step)
        return;
    const float *master = G->master;
    uint16_t *staged = bk->h_act + c->h_act_at;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < G->shard; i++)
        staged[i] = bf16_from_float(master[i]);
    c->staged_step = r->step;
}

void bk_all_gather(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    GroupComm *c = &bk->gc[g];
    const FsdDtype dt = r->m->param_dtype;
    const bool bf16_act = act_bf16(r);
    /* this rank's slice of the unsharded buffer: its shard goes there, and
     * the gather fills the rest around it */
    void *own = (char *)G->params + G->lo * act_bytes(r);
    const float *shard32 = G->master;   /* fp32 act: where the fp32 shard is on the device */
    if (bk->offload) {
        /* the host's master shard comes in on its own stream (ordered after
         * the compute stream, which may still read the buffer's last
         * contents); the gather waits on the copy */
        fence(r, bk->h2d);
        if (bf16_act) {
            stage_bf16(r, g);
            CUDA_CHECK(r, cudaMemcpyAsync(own, bk->h_act + c->h_act_at, (size_t)G->shard * 2,
                                          cudaMemcpyHostToDevice, bk->h2d));
        } else
            CUDA_CHECK(r, cudaMemcpyAsync(own, G->master, (size_t)G->shard * sizeof(real),
                                          cudaMemcpyHostToDevice, bk->h2d));
        CUDA_CHECK(r, cudaEventRecord(c->copied_in, bk->h2d));
        CUDA_CHECK(r, cudaStreamWaitEvent(bk->gather, c->copied_in, 0));
        c->traced_gather[0] = mark_on(r, bk->gather);
        shard32 = own;
    } else {
        fence(r, bk->gather);
        c->traced_gather[0] = mark_on(r, bk->gather);
        if (bf16_act)
            CUDA_CHECK(r, cu_narrow(own, G->master, G->shard, 1, bk->gather));
        else if (dt == FSD_FP32)
            CUDA_CHECK(r, cudaMemcpyAsync(own, G->master, (size_t)G->shard * sizeof(real),
                                          cudaMemcpyDeviceToDevice, bk->gather));
    }
    if (bf16_act || dt == FSD_FP32) {   /* in place: the buffer holds what is gathered */
        NCCL_CHECK(r, ncclAllGather(own, G->params, (size_t)G->shard,
                                    bf16_act ? ncclBfloat16 : ncclFloat32, bk->comm, bk->gather));
    } else {
        const int bf16 = dt == FSD_BF16;
        CUDA_CHECK(r, cu_narrow(bk->wire_ag + G->lo, shard32, G->shard, bf16, bk->gather));
        NCCL_CHECK(r, ncclAllGather(bk->wire_ag + G->lo, bk->wire_ag, (size_t)G->shard,
                                    wire_type(dt), bk->comm, bk->gather));
        CUDA_CHECK(r, cu_widen(G->params, bk->wire_ag, G->padded, bf16, bk->gather));
    }
    CUDA_CHECK(r, cudaEventRecord(c->gathered, bk->gather));
    c->traced_gather[1] = mark_on(r, bk->gather);
}

void bk_wait_gather(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    GroupComm *c = &bk->gc[g];
    CUDA_CHECK(r, cudaStreamWaitEvent(bk->compute, c->gathered, 0));
}

/* ── gradients: reduce-scatter ── */

void bk_alloc_grads(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    CUDA_CHECK(r, cudaMemsetAsync(G->grads, 0, (size_t)unsharded_bytes(r, G), r->bk->compute));
}

void bk_reduce_scatter(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    GroupComm *c = &bk->gc[g];
    const FsdDtype dt = r->m->reduce_dtype;
    /* where the averaged slice is added: the grad shard, or with offload the
     * device accumulator (NULL with grad_accum 1 and fp32 act: the slice is
     * copied out as it is, from the unsharded gradient buffer) */
    float *sum = bk->offload ? c->acc : G->grad;
    const bool copy_out = bk->offload && ++c->reduces == r->cfg.grad_accum;
    fence(r, bk->reduce);
    c->traced_reduce[0] = mark_on(r, bk->reduce);
    if (act_bf16(r)) {
        uint16_t *grads = G->grads;
        if (dt == FSD_FP32) {   /* widened into the fp32 reduce buffer, reduced there */
            CUDA_CHECK(r, cu_widen(bk->reduce32, grads, G->padded, 1, bk->reduce));
            NCCL_CHECK(r, ncclReduceScatter(bk->reduce32, bk->reduce32 + G->lo, (size_t)G->shard,
                                            ncclFloat32, ncclAvg, bk->comm, bk->reduce));
            CUDA_CHECK(r, cu_accum(sum, bk->reduce32 + G->lo, G->shard, bk->reduce));
        } else {
            NCCL_CHECK(r, ncclReduceScatter(grads, grads + G->lo, (size_t)G->shard, ncclBfloat16,
                                            ncclAvg, bk->comm, bk->reduce));
            CUDA_CHECK(r, cu_accum_widen(sum, grads + G->lo, G->shard, 1, bk->reduce));
        }
    } else if (dt == FSD_FP32) {
        float *grads = G->grads;
        NCCL_CHECK(r, ncclReduceScatter(grads, grads + G->lo, (size_t)G->shard, ncclFloat32,
                                        ncclAvg, bk->comm, bk->reduce));
        if (sum)
            CUDA_CHECK(r, cu_accum(sum, grads + G->lo, G->shard, bk->reduce));
    } else {
        float *grads = G->grads;
        const int bf16 = dt == FSD_BF16;
        CUDA_CHECK(r, cu_narrow(bk->wire_rs, grads, G->padded, bf16, bk->reduce));
        NCCL_CHECK(r, ncclReduceScatter(bk->wire_rs, bk->wire_rs + G->lo, (size_t)G->shard,
                                        wire_type(dt), ncclAvg, bk->comm, bk->reduce));
        if (sum)
            CUDA_CHECK(r, cu_accum_widen(sum, bk->wire_rs + G->lo, G->shard, bf16, bk->reduce));
        else   /* fp32 for the host, in the slice the 16-bit values came from */
            CUDA_CHECK(r, cu_widen(grads + G->lo, bk->wire_rs + G->lo, G->shard, bf16, bk->reduce));
    }
    if (copy_out) {
        /* the step's gradient of this group, out to the pinned grad shard on
         * its own stream; `reduced` then follows the copy (and the
         * accumulator's zeroing), so the compute stream's wait covers both */
        const float *from = sum ? sum : (const float *)G->grads + G->lo;
        CUDA_CHECK(r, cudaEventRecord(c->scattered, bk->reduce));
        CUDA_CHECK(r, cudaStreamWaitEvent(bk->d2h, c->scattered, 0));
        CUDA_CHECK(r, cudaMemcpyAsync(G->grad, from, (size_t)G->shard * sizeof(real),
                                      cudaMemcpyDeviceToHost, bk->d2h));
        if (sum)
            CUDA_CHECK(r, cudaMemsetAsync(sum, 0, (size_t)G->shard * sizeof(real), bk->d2h));
        CUDA_CHECK(r, cudaEventRecord(c->reduced, bk->d2h));
        c->traced_reduce[1] = mark_on(r, bk->d2h);
    } else {
        CUDA_CHECK(r, cudaEventRecord(c->reduced, bk->reduce));
        c->traced_reduce[1] = mark_on(r, bk->reduce);
    }
}

void bk_wait_reduce(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    GroupComm *c = &bk->gc[g];
    CUDA_CHECK(r, cudaStreamWaitEvent(bk->compute, c->reduced, 0));
}

/* ── compute ── */

/* Row-major C = α·op(A)·op(B) + β·C is column-major Cᵀ = α·op(B)ᵀ·op(A)ᵀ +
 * β·Cᵀ with the same buffers: cuBLASLt gets B as its A and A as its B, the
 * dimensions swapped (its m = N, n = M). Operands are the model's act.
 * fp32: fp32 in and out, fp32 accumulation; inputs rounded to TF32 on the
 * tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32, as PyTorch's allow_tf32 and
 * llm.c's fp32 build) unless FSD_TF32=0 asks for full fp32 products. bf16:
 * A, B, C, D and the bias bf16, products summed in fp32
 * (CUBLAS_COMPUTE_32F, scalars fp32) and D rounded once, as PyTorch's bf16
 * matmuls and llm.c's bf16 build. A bias, in Cᵀ's
 * terms, is one value per row of its N rows: cuBLASLt's EPILOGUE_BIAS
 * vector, whose length is D's row count and which it broadcasts over D's
 * columns (our rows).
 *
 * Everything but cublasLtMatmul itself happens on a shape's first call and
 * is host-only (descriptors, layouts, the heuristic's choice): nothing
 * waits for the device, and a step after the first only looks its shapes
 * up. The plan's key holds the alignment of the operands' addresses (A, B
 * and C's least, the bias's and aux's each: the heuristic reads those two
 * from the pointers it is shown, so a plan is only used with ones aligned
 * as those were), since the heuristic may choose kernels that need more
 * than the 64 bytes a parameter's start guarantees (plan.c aligns them to
 * 16 elements). That alignment comes from offsets the model's tables fix,
 * inside buffers cudaMalloc aligns to 256 bytes, so a product gets the
 * same plan, and the same algorithm, at every step of every run. */
static uint32_t addr_align(const void *p)
{
    uint32_t a = 256;
    while (a > 4 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

/* The heuristic's first n choices for plan p's layouts under descriptor
 * desc (the plan's own, or FSD_GEMM_BENCH's variant of it), for operands
 * aligned to p->align bytes and the run's workspace; how many it found. */
static int gemm_candidates(FsdRun *r, const GemmPlan *p, cublasLtMatmulDesc_t desc,
                           cublasLtMatmulHeuristicResult_t *out, int n)
{
    cublasLtMatmulPreference_t pref;
    BLAS_CHECK(r, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = BLAS_WORKSPACE_BYTES;
    BLAS_CHECK(r, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++)
        BLAS_CHECK(r, cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &p->align,
                                                           sizeof p->align));
    int found = 0;
    BLAS_CHECK(r, cublasLtMatmulAlgoGetHeuristic(r->bk->lt, desc, p->a, p->b, p->c, p->c, pref, n,
                                                 out, &found));
    BLAS_CHECK(r, cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

static GemmPlan *gemm_plan(FsdRun *r, bool bf16, bool transA, bool transB, int64_t M, int64_t N,
                           int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                           cublasLtEpilogue_t epilogue, const void *bias, void *aux,
                           const uint32_t align[3])
{
    Backend *bk = r->bk;
    for (int i = 0; i < bk->nplans; i++) {
        GemmPlan *p = &bk->plans[i];
        if (p->bf16 == bf16 && p->transA == transA && p->transB == transB &&
            p->epilogue == epilogue &&
            p->M == M && p->N == N && p->K == K && p->lda == lda && p->ldb == ldb &&
            p->ldc == ldc && p->align == align[0] && p->bias_align == align[1] &&
            p->aux_align == align[2])
            return p;
    }
    if (bk->nplans == bk->plans_cap) {
        int cap = bk->plans_cap ? 2 * bk->plans_cap : 16;
        GemmPlan *grown = realloc(bk->plans, sizeof *grown * (size_t)cap);
        if (!grown)
            failed(r, __FILE__, __LINE__, "realloc", "out of memory");
        bk->plans = grown;
        bk->plans_cap = cap;
    }
    GemmPlan *p = &bk->plans[bk->nplans++];   /* counted now: bk_stop frees what was made */
    *p = (GemmPlan){bf16, transA, transB, epilogue, M, N, K, lda, ldb, ldc,
                    align[0], align[1], align[2]};
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        bk->tf32 && !bf16 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    BLAS_CHECK(r, cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    cublasOperation_t opa = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                 sizeof opa));
    BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                 sizeof opb));
    if (bias) {
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epilogue, sizeof epilogue));
        /* the heuristic reads the bias's alignment from its address */
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof bias));
        /* a bf16 bias: D's type is the default, said so that it is not a guess */
        const int32_t bias_type = CUDA_R_16BF;
        if (bf16)
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                              sizeof bias_type));
    }
    if (aux) {
        /* GELU_AUX_BIAS: D = gelu(AB + bias), and AB + bias itself to aux,
         * laid out as D (the heuristic reads aux's alignment from its
         * address, as the bias's); bf16 aux said so, as the bias */
        const int64_t aux_ld = ldc;
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
        const int32_t aux_type = CUDA_R_16BF;
        if (bf16)
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                              sizeof aux_type));
    }
    /* column-major layouts of the stored matrices: op(B)ᵀ is [N, K], op(A)ᵀ [K, M] */
    BLAS_CHECK(r, cublasLtMatrixLayoutCreate(&p->a, type, (uint64_t)(transB ? K : N),
                                             (uint64_t)(transB ? N : K), ldb));
    BLAS_CHECK(r, cublasLtMatrixLayoutCreate(&p->b, type, (uint64_t)(transA ? M : K),
                                             (uint64_t)(transA ? K : M), lda));
    BLAS_CHECK(r, cublasLtMatrixLayoutCreate(&p->c, type, (uint64_t)N, (uint64_t)M, ldc));

    cublasLtMatmulHeuristicResult_t best;
    int found = gemm_candidates(r, p, p->desc, &best, 1);
    if (found < 1 || best.state != CUBLAS_STATUS_SUCCESS) {
        char why[256];
        snprintf(why, sizeof why,
                 "no algorithm for %s C[%lld, %lld] = %sop(A)·op(B)%s%s with K %lld, trans %d%d, "
                 "lda %lld ldb %lld ldc %lld, A, B and C aligned to %u bytes, a %d MiB "
                 "workspace",
                 bf16 ? "bf16" : "fp32", (long long)M, (long long)N, aux ? "gelu(" : "",
                 bias ? " + bias" : "", aux ? ") and its input" : "",
                 (long long)K, transA, transB,
                 (long long)lda, (long long)ldb, (long long)ldc, align[0],
                 BLAS_WORKSPACE_BYTES >> 20);
        failed(r, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", why);
    }
    p->algo = best.algo;
    return p;
}

/* Descriptors and layouts of every plan; at shutdown. */
static void gemm_plans_free(FsdRun *r)
{
    Backend *bk = r->bk;
    for (int i = 0; i < bk->nplans; i++) {
        GemmPlan *p = &bk->plans[i];
        if (p->desc)
            BLAS_NOTE(r, cublasLtMatmulDescDestroy(p->desc));
        cublasLtMatrixLayout_t ls[] = {p->a, p->b, p->c};
        for (size_t k = 0; k < sizeof ls / sizeof *ls; k++)
            if (ls[k])
                BLAS_NOTE(r, cublasLtMatrixLayoutDestroy(ls[k]));
    }
    free(bk->plans);
    bk->plans = NULL;
    bk->nplans = bk->plans_cap = 0;
}

/* One product on the compute stream, through its shape's plan: with a
 * bias, EPILOGUE_BIAS; with aux as well, GELU_AUX_BIAS (C = gelu(product +
 * bias), aux = product + bias). */
static void lt_matmul(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                      float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                      float beta, void *C, int64_t ldc, const void *bias, void *aux)
{
    Backend *bk = r->bk;
    /* A, B and C's least alignment, the bias's, aux's (0: none) */
    uint32_t align[3] = {256, bias ? addr_align(bias) : 0, aux ? addr_align(aux) : 0};
    const void *abc[3] = {A, B, C};
    for (int i = 0; i < 3; i++) {
        const uint32_t ai = addr_align(abc[i]);
        align[0] = ai < align[0] ? ai : align[0];
    }
    for (int i = 0; i < 3; i++)
        if (align[i] && align[i] < 16)
            RT_BUG(r, "a [%lld, %lld] product's operand is aligned to %u bytes; the runtime hands "
                      "out buffers aligned to at least 16", (long long)M, (long long)N, align[i]);
    cublasLtEpilogue_t epilogue = aux    ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                  : bias ? CUBLASLT_EPILOGUE_BIAS
                                         : CUBLASLT_EPILOGUE_DEFAULT;
    GemmPlan *p = gemm_plan(r, act_bf16(r), transA, transB, M, N, K, lda, ldb, ldc, epilogue,
                            bias, aux, align);
    /* this call's bias and aux: host-side state of the descriptor, read at launch */
    if (bias)
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof bias));
    if (aux)
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    BLAS_CHECK(r, cublasLtMatmul(bk->lt, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->c, C,
                                 p->c, &p->algo, bk->blas_ws, BLAS_WORKSPACE_BYTES, bk->compute));
}

/* FSD_GEMM_BENCH=1: at the end of a run that went well, rank 0 times
 * every product shape the run planned, on fresh buffers aligned as the
 * run's operands were: the plan's algorithm, the heuristic's next choices
 * for the same descriptor, and for a bias product the same product with no
 * epilogue. One table on stderr; the run's results are already written,
 * and the host waits here are outside any step. It says whether the
 * heuristic's first choice, or an epilogue, costs time at the model's
 * shapes (docs/cuda.md). */
#define GEMM_BENCH_ALGOS 8
#define GEMM_BENCH_CALLS 20

/* ms a call of plan p's product with algorithm algo under desc, or -1 if
 * cuBLASLt refuses to run it */
static double gemm_bench_time(FsdRun *r, const GemmPlan *p, cublasLtMatmulDesc_t desc,
                              const cublasLtMatmulAlgo_t *algo, void *const buf[5])
{
    Backend *bk = r->bk;
    const float alpha = 1, beta = 0;
    cudaEvent_t ev[2];
    for (int i = 0; i < 2; i++)
        CUDA_CHECK(r, cudaEventCreate(&ev[i]));
    double ms = -1;
    for (int i = 0; i < 3 + GEMM_BENCH_CALLS; i++) {
        if (i == 3)
            CUDA_CHECK(r, cudaEventRecord(ev[0], bk->compute));
        if (cublasLtMatmul(bk->lt, desc, &alpha, buf[1], p->a, buf[0], p->b, &beta, buf[2], p->c,
                           buf[2], p->c, algo, bk->blas_ws, BLAS_WORKSPACE_BYTES,
                           bk->compute) != CUBLAS_STATUS_SUCCESS)
            goto out;
    }
    CUDA_CHECK(r, cudaEventRecord(ev[1], bk->compute));
    CUDA_CHECK(r, cudaEventSynchronize(ev[1]));
    float t;
    CUDA_CHECK(r, cudaEventElapsedTime(&t, ev[0], ev[1]));
    ms = t / GEMM_BENCH_CALLS;
out:
    for (int i = 0; i < 2; i++)
        CUDA_CHECK(r, cudaEventDestroy(ev[i]));
    return ms;
}

static void gemm_bench(FsdRun *r)
{
    Backend *bk = r->bk;
    if (r->rank != 0)
        return;   /* bk_stop has drained the streams */
    fprintf(stderr, "FSD_GEMM_BENCH: every product shape of the run, %d calls after 3; "
                    "TFLOP/s = 2MNK / time\n"
                    "%8s %7s %7s %2s %-13s %5s | %9s %7s | %-12s %7s | %s\n",
            GEMM_BENCH_CALLS, "M", "N", "K", "tt", "epilogue", "align", "plan ms", "TFLOP/s",
            "best of 8", "TFLOP/s", "no epilogue TFLOP/s");
    const int64_t elem = act_bytes(r);
    for (int i = 0; i < bk->nplans; i++) {
        GemmPlan *p = &bk->plans[i];
        /* A, B, C, bias, aux as stored (row-major, leading dimensions of
         * the run's), each starting as many bytes past a 256-byte boundary
         * as it is aligned to in the plan, unless that is 256 */
        const int64_t rows[5] = {p->transA ? p->K : p->M, p->transB ? p->N : p->K, p->M, 1,
                                 p->M};
        const int64_t lds[5] = {p->lda, p->ldb, p->ldc, p->N, p->ldc};
        const bool used[5] = {true, true, true, p->epilogue != CUBLASLT_EPILOGUE_DEFAULT,
                              p->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
        void *base[5] = {NULL}, *buf[5] = {NULL};
        const uint32_t al[5] = {p->align, p->align, p->align, p->bias_align, p->aux_align};
        for (int k = 0; k < 5; k++)
            if (used[k]) {
                const size_t skew = al[k] % 256;
                const size_t bytes = (size_t)(rows[k] * lds[k] * elem) + skew;
                CUDA_CHECK(r, cudaMalloc(&base[k], bytes));
                CUDA_CHECK(r, cudaMemsetAsync(base[k], 0x3c, bytes, bk->compute));   /* ~0.0115 */
                buf[k] = (char *)base[k] + skew;
            }
        if (used[3])
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &buf[3], sizeof buf[3]));
        if (used[4])
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &buf[4],
                              sizeof buf[4]));
        const double flop = 2.0 * (double)p->M * (double)p->N * (double)p->K;
        const double ms = gemm_bench_time(r, p, p->desc, &p->algo, buf);
        cublasLtMatmulHeuristicResult_t cand[GEMM_BENCH_ALGOS];
        const int n = gemm_candidates(r, p, p->desc, cand, GEMM_BENCH_ALGOS);
        double best = -1;
        int best_i = -1;
        for (int c = 0; c < n; c++) {
            const double t = cand[c].state == CUBLAS_STATUS_SUCCESS
                                 ? gemm_bench_time(r, p, p->desc, &cand[c].algo, buf)
                                 : -1;
            if (t > 0 && (best < 0 || t < best))
                best = t, best_i = c;
        }
        /* the plain product: the plan's descriptor less its epilogue */
        double plain = -1;
        if (used[3]) {
            const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &none, sizeof none));
            cublasLtMatmulHeuristicResult_t first;
            if (gemm_candidates(r, p, p->desc, &first, 1) == 1 &&
                first.state == CUBLAS_STATUS_SUCCESS)
                plain = gemm_bench_time(r, p, p->desc, &first.algo, buf);
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &p->epilogue, sizeof p->epilogue));
        }
        const char *epi = p->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "gelu_aux_bias"
                          : p->epilogue == CUBLASLT_EPILOGUE_BIAS        ? "bias"
                                                                         : "none";
        char best_s[16] = "-", best_f[16] = "-", plain_f[16] = "-";
        if (best > 0) {
            snprintf(best_s, sizeof best_s, "#%d %.3f", best_i, best);
            snprintf(best_f, sizeof best_f, "%.0f", flop / best * 1e-9);
        }
        if (plain > 0)
            snprintf(plain_f, sizeof plain_f, "%.0f", flop / plain * 1e-9);
        fprintf(stderr, "%8lld %7lld %7lld %d%d %-13s %5u | %9.3f %7.0f | %-12s %7s | %s\n",
                (long long)p->M, (long long)p->N, (long long)p->K, p->transA, p->transB, epi,
                p->align, ms, ms > 0 ? flop / ms * 1e-9 : 0.0, best_s, best_f, plain_f);
        for (int k = 0; k < 5; k++)
            if (base[k])
                CUDA_CHECK(r, cudaFree(base[k]));
    }
}

void fsdrt_gemm(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                const void *A, int64_t lda, const void *B, int64_t ldb, real beta, void *C,
                int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm", transA, transB, M, N, K, lda, ldb, ldc);
    Backend *bk = r->bk;
    if (M == 0 || N == 0)
        return;
    if (K == 0) {   /* cuBLASLt wants leading dimensions of at least 1; C = β·C */
        CUDA_CHECK(r, cu_scale(C, M, N, ldc, beta, act_bf16(r), bk->compute));
        return;
    }
    lt_matmul(r, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL);
}

void fsdrt_gemm_bias(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                     const void *A, int64_t lda, const void *B, int64_t ldb, const void *bias,
                     void *C, int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm_bias", transA, transB, M, N, K, lda, ldb, ldc);
    Backend *bk = r->bk;
    if (M == 0 || N == 0)
        return;
    if (!bias)
        RT_BUG(r, "fsdrt_gemm_bias: no bias for a [%lld, %lld] product", (long long)M,
               (long long)N);
    if (K == 0) {   /* an empty product: C is the bias in every row, copied in doubling runs */
        const size_t elem = (size_t)act_bytes(r);
        const size_t row = elem * (size_t)N, pitch = elem * (size_t)ldc;
        CUDA_CHECK(r, cudaMemcpyAsync(C, bias, row, cudaMemcpyDeviceToDevice, bk->compute));
        for (int64_t have = 1; have < M; have *= 2) {
            int64_t n = have < M - have ? have : M - have;
            CUDA_CHECK(r, cudaMemcpy2DAsync((char *)C + (size_t)have * pitch, pitch, C, pitch, row,
                                            (size_t)n, cudaMemcpyDeviceToDevice, bk->compute));
        }
        return;
    }
    lt_matmul(r, transA, transB, M, N, K, 1, A, lda, B, ldb, 0, C, ldc, bias, NULL);
}

/* cuBLASLt's GELU epilogue is the tanh approximation (what PyTorch's
 * _addmm_activation relies on for gelu(approximate='tanh')), GPT-2's gelu and
 * templates/act.h's, evaluated by its own code: y agrees with gelu_fwd of pre
 * to rounding, not bit for bit, and in bf16 it is gelu of the fp32 sum, not
 * of pre rounded to bf16. An aux leading dimension that is not a multiple of
 * 8 (cuBLASLt's requirement) and an empty product take the unfused path. */
bool fsdrt_gemm_bias_gelu(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                          const void *A, int64_t lda, const void *B, int64_t ldb,
                          const void *bias, void *pre, void *y, int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm_bias_gelu", transA, transB, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0 || K == 0 || ldc % 8 != 0) {
        fsdrt_gemm_bias(r, transA, transB, M, N, K, A, lda, B, ldb, bias, pre, ldc);
        return false;
    }
    if (!bias || !pre)
        RT_BUG(r, "fsdrt_gemm_bias_gelu: no %s for a [%lld, %lld] product",
               bias ? "pre-activation" : "bias", (long long)M, (long long)N);
    lt_matmul(r, transA, transB, M, N, K, 1, A, lda, B, ldb, 0, y, ldc, bias, pre);
    return true;
}

/* ── the step's update ── */

/* offload = cpu: the step's one host wait comes first, for everything the
 * step queued (the compute stream has waited on every copy out, through
 * fsdrt_wait_reduce, and on every gather, whose copies in it follows), and
 * the device's share of the loss; then Σ g² and the optimizer on the pinned
 * shards (optim.c, the CPU backend's loops), and the loss and norm summed
 * over ranks on the host: MPI when it runs the job, else NCCL on a few
 * bytes of device memory, which waits again but on a device with nothing
 * left to do. The next step's all-gathers copy the updated shards in. */
static void host_update(FsdRun *r, double lr, int64_t t, double v[2])
{
    Backend *bk = r->bk;
    CUDA_CHECK(r, cudaMemcpyAsync(bk->h_stats + 3, bk->d_stats + 3, sizeof(double),
                                  cudaMemcpyDeviceToHost, bk->compute));
    CUDA_CHECK(r, cudaMemsetAsync(bk->d_stats + 3, 0, sizeof(double), bk->compute));
    CUDA_CHECK(r, cudaEventRecord(bk->stats_ev, bk->compute));
    host_wait(r, bk->stats_ev, "the step");
    for (int g = 0; g < r->m->ngroups; g++) {
        if (bk->gc[g].reduces != r->cfg.grad_accum)
            RT_BUG(r, "group %s was reduce-scattered %lld times in a step of %lld micro-batches; "
                      "offload copies its gradient out at the last",
                   r->m->groups[g].name, (long long)bk->gc[g].reduces,
                   (long long)r->cfg.grad_accum);
        bk->gc[g].reduces = 0;
    }
    v[0] = r->loss_sum + bk->h_stats[3];
    v[1] = optim_grad_sumsq(r);
    if (r->world > 1 && bk->mpi) {   /* never without MPI (FSD_MPI=0) */
#if FSD_MPI
        MPI_CHECK(r, MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
#endif
    } else if (r->world > 1) {
        allreduce_small(r, v, 2, ncclFloat64, sizeof *v, ncclSum);
    }
    optim_step(r, lr, clip_coef(r->cfg.grad_clip, sqrt(v[1])), t);
}

void bk_update(FsdRun *r, double lr, int64_t t, double v[2])
{
    if (r->m->offload_cpu) {
        host_update(r, lr, t, v);
        return;
    }
    Backend *bk = r->bk;
    const FsdTrainConfig *c = &r->cfg;
    const cudaStream_t s = bk->compute;
    /* Σ g² and the loss, all-reduced, then the clip coefficient: on the
     * device, so the optimizer is queued behind them without a wait */
    int at = 0;
    for (int g = 0; g < r->m->ngroups; g++) {
        const Group *G = &r->groups[g];
        CUDA_CHECK(r, cu_sumsq_partial(G->grad, G->shard, bk->d_partials + at, s));
        at += cu_sumsq_blocks(G->shard);
    }
    CUDA_CHECK(r, cu_sumsq_finish(bk->d_stats, bk->d_partials, at, bk->d_stats + 3, r->loss_sum, s));
    NCCL_CHECK(r, ncclAllReduce(bk->d_stats, bk->d_stats, 2, ncclFloat64, ncclSum, bk->comm, s));
    CUDA_CHECK(r, cu_clip(bk->d_stats, c->grad_clip, s));
    const double *coef = bk->d_stats + 2;
    /* cpu.c's scalars, computed the same way in double */
    if (c->optimizer == FSD_ADAMW) {
        const CudaAdamW a = {
            .decay = c->weight_decay != 0 ? (float)(1 - lr * c->weight_decay) : 1,
            .w1 = (float)(1 - c->beta1),
            .b2 = (float)c->beta2,
            .w2 = (float)(1 - c->beta2),
            .step = (float)(lr / (1 - pow(c->beta1, (double)t))),
            .bc2_sqrt = (float)sqrt(1 - pow(c->beta2, (double)t)),
            .eps = (float)c->eps,
        };
        for (int g = 0; g < r->m->ngroups; g++) {
            Group *G = &r->groups[g];
            CUDA_CHECK(r, cu_adamw(G->master, G->grad, G->m, G->v, G->shard, bk->seg + bk->seg_at[g],
                                   G->nseg, coef, a, s));
        }
    } else {
        for (int g = 0; g < r->m->ngroups; g++) {
            Group *G = &r->groups[g];
            CUDA_CHECK(r, cu_sgd(G->master, G->grad, G->m, G->shard, bk->seg + bk->seg_at[g], G->nseg,
                                 coef, (float)c->weight_decay, (float)c->momentum, (float)lr,
                                 c->nesterov, s));
        }
    }
    CUDA_CHECK(r, cudaMemcpyAsync(bk->h_stats, bk->d_stats, 2 * sizeof(double),
                                  cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(r, cudaEventRecord(bk->stats_ev, s));
    /* the step's one host wait, with the optimizer already queued: the log
     * line needs the loss and the norm, and the next step's loader reuses
     * the pinned input slots this step's copies read */
    host_wait(r, bk->stats_ev, "the step");
    v[0] = bk->h_stats[0];
    v[1] = bk->h_stats[1];
}
