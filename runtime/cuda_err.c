/*
 * cuda_err.c — the CUDA backend's errors and host waits: how a failed call
 * is reported and the job ended, and the only place the host waits for the
 * GPU.
 *
 * Errors. Every CUDA, NCCL, cuBLASLt and MPI call is checked and reported as
 * `train: rank R: file:line: call failed: why`, then the communicator is
 * aborted and the job ended (MPI_Abort where MPI runs it). Host waits poll
 * the event and ncclCommGetAsyncError, and give up after FSD_NCCL_TIMEOUT
 * seconds (default 600) with a message, so a rank that died or hangs ends
 * every other rank instead of leaving them waiting forever.
 */
#include "cuda_internal.h"

#include <time.h>
#include <unistd.h>

/* ── errors ── */

_Noreturn void bk_abort(FsdRun *r)
{
    fflush(stdout);
    fflush(stderr);
    Backend *bk = r->bk;
    if (bk && bk->have_mesh) {   /* HSDP's split communicators, the same way */
        bk->have_mesh = false;
        ncclCommAbort(bk->shard);
        ncclCommAbort(bk->replica);
    }
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

_Noreturn void cuda_failed(FsdRun *r, const char *file, int line, const char *call,
                                  const char *why)
{
    fprintf(stderr, "train: rank %d: %s:%d: %s failed: %s\n", r->rank, file, line, call, why);
    bk_abort(r);
}

_Noreturn void cuda_nccl_failed(FsdRun *r, const char *file, int line, const char *call,
                                       ncclResult_t e)
{
    char why[512];
    const char *last = ncclGetLastError(r->bk && r->bk->have_comm ? r->bk->comm : NULL);
    snprintf(why, sizeof why, "%s%s%s", ncclGetErrorString(e), last && *last ? ": " : "",
             last ? last : "");
    cuda_failed(r, file, line, call, why);
}

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
void cuda_host_wait(FsdRun *r, cudaEvent_t ev, const char *what)
{
    Backend *bk = r->bk;
    const double t0 = rt_now();
    /* --collective-timeout, once the flags are read, else FSD_NCCL_TIMEOUT */
    const double limit = r->collective_timeout_s >= 0 ? r->collective_timeout_s : bk->timeout_s;
    for (long spins = 0;; spins++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess)
            return;
        if (e != cudaErrorNotReady)
            cuda_failed(r, __FILE__, __LINE__, what, cudaGetErrorString(e));
        if (bk->have_comm) {
            ncclResult_t async = ncclSuccess;
            NCCL_CHECK(r, ncclCommGetAsyncError(bk->comm, &async));
            /* HSDP: the step's collectives run on the split communicators */
            if (bk->have_mesh && (async == ncclSuccess || async == ncclInProgress))
                NCCL_CHECK(r, ncclCommGetAsyncError(bk->shard, &async));
            if (bk->have_mesh && (async == ncclSuccess || async == ncclInProgress))
                NCCL_CHECK(r, ncclCommGetAsyncError(bk->replica, &async));
            if (async != ncclSuccess && async != ncclInProgress)
                cuda_nccl_failed(r, __FILE__, __LINE__, what, async);
        }
        if (limit > 0 && rt_now() - t0 > limit) {
            fprintf(stderr,
                    "train: rank %d: %s did not complete within %.0f s (%s): a rank "
                    "has stopped or the network is stuck; aborting NCCL and ending the run\n",
                    r->rank, what, limit,
                    r->collective_timeout_s >= 0 ? "--collective-timeout" : "FSD_NCCL_TIMEOUT");
            bk_abort(r);
        }
        pause_briefly(spins);
    }
}

/* Waits until stream s has done everything queued on it so far. */
void cuda_stream_wait_host(FsdRun *r, cudaStream_t s, const char *what)
{
    CUDA_CHECK(r, cudaEventRecord(r->bk->host_ev, s));
    cuda_host_wait(r, r->bk->host_ev, what);
}

