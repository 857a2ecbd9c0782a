/*
 * cuda_boot.c — the CUDA backend's start and end: which rank this process
 * is, its device, the streams and events, cuBLASLt's handle, NCCL's
 * communicator (bk_start), and everything freed again (bk_stop).
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
 */
#include "cuda_internal.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The compute stream, for launchers that have no FsdRun at hand (one run
 * per process); 0, the legacy stream, until bk_start has created it. */
static cudaStream_t compute_stream;

cudaStream_t fsdrt_cuda_stream(void) { return compute_stream; }

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
    /* what the device has in use now that this process's context exists:
     * the baseline of start-up's report (bk_memory) */
    if (cudaMemGetInfo(&bk->mem_free_at_start, &bk->mem_total) != cudaSuccess) {
        cudaGetLastError();
        bk->mem_free_at_start = bk->mem_total = 0;
    }
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

/* HSDP's sub-communicators, split once from the world's (ncclCommSplit,
 * NCCL 2.18): colour the replica (consecutive ranks) for the shard group,
 * the shard position for the replica group; the world rank as key keeps
 * the order. Collective over every rank. */
void bk_mesh(FsdRun *r)
{
    Backend *bk = r->bk;
    bk->shard = bk->comm;
    if (r->replicas <= 1)
        return;
    NCCL_CHECK(r, ncclCommSplit(bk->comm, r->replica, r->rank, &bk->shard, NULL));
    NCCL_CHECK(r, ncclCommSplit(bk->comm, r->shard_rank, r->rank, &bk->replica, NULL));
    bk->have_mesh = true;
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
        cuda_failed(r, __FILE__, __LINE__, "calloc", "out of memory");
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
    bk->own_bytes += SMALL_BYTES;
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


void bk_stop(FsdRun *r)
{
    Backend *bk = r->bk;
    if (!bk)
        return;
    if (bk->have_device && bk->compute) {
        /* nothing is queued at a normal end; after an error, this drains
         * what is (under the timeout) before the buffers go */
        cuda_stream_wait_host(r, bk->gather, "shutting down");
        cuda_stream_wait_host(r, bk->reduce, "shutting down");
        cuda_stream_wait_host(r, bk->compute, "shutting down");
    }
    if (r->status == 0 && getenv("FSD_GEMM_BENCH") && bk->nplans)
        cuda_gemm_bench(r);
    cuda_offload_stop(r);
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
    cuda_gemm_plans_free(r);
    if (bk->have_lt) {
        bk->have_lt = false;
        BLAS_NOTE(r, cublasLtDestroy(bk->lt));
    }
    if (bk->have_mesh) {   /* the split communicators before their parent */
        bk->have_mesh = false;
        ncclComm_t split[2] = {bk->shard, bk->replica};
        for (int i = 0; i < 2; i++) {
            ncclResult_t e = ncclCommFinalize(split[i]);
            if (e == ncclSuccess)
                e = ncclCommDestroy(split[i]);
            else
                ncclCommAbort(split[i]);
            if (e != ncclSuccess)
                fprintf(stderr, "train: rank %d: %s:%d: shutting down NCCL failed: %s\n", r->rank,
                        __FILE__, __LINE__, ncclGetErrorString(e));
        }
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

