/*
 * cpu.c — the runtime's CPU backend: MPI between ranks, BLAS (blas.c) for
 * matrix products, OpenMP for the loops over shards.
 *
 * It is how the emitted schedule is tested without a GPU, so it follows the
 * GPU's numerics where they matter: parameters are all-gathered in the
 * `param` dtype, and gradients are rounded to the `reduce` dtype before and
 * after the reduce-scatter. With bf16 act (fsdrt.h) the unsharded buffers
 * are bf16 as on the GPU: each rank narrows its master shard into its slice
 * and the 2-byte values are gathered in place; the bf16 gradients are
 * widened into an fp32 buffer to be summed (MPI has no bf16 sum). With fp32
 * act a 16-bit param dtype travels as 2-byte values that are widened into
 * the fp32 unsharded buffer, so kernels see exactly the rounded weights a
 * GPU would. Products of bf16 matrices widen them into float scratch for
 * BLAS and round C once (fsdrt_gemm). Collectives are MPI's nonblocking ones, issued
 * where the schedule issues them and completed at its waits; without an
 * asynchronous progress thread they mostly move data inside the wait, which
 * costs time but not correctness.
 *
 * Both collectives work in place, as the memory plan assumes: the
 * all-gather's send buffer is this rank's slice of the unsharded buffer,
 * and the reduce-scatter leaves this rank's summed slice at the start of the
 * unsharded gradient buffer, from where the wait adds it, divided by the
 * world size, into the fp32 gradient shard.
 */
#include "half.h"
#include "internal.h"

#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef FSD_FLOAT64
#define MPI_REAL_T MPI_DOUBLE
#else
#define MPI_REAL_T MPI_FLOAT
#endif

/* OpenMP's spin before its idle threads sleep (tune_spin): ~25 us */
#define FSD_GOMP_SPINCOUNT "1000"

typedef struct Pooled {
    void *p;
    int64_t cap;
    bool out;
} Pooled;

/* A group's collectives in flight (common.c keeps which are). */
typedef struct GroupComm {
    MPI_Request gather, reduce;
    uint16_t *wire;          /* fp32 act: 2-byte all-gather buffer while gathering */
    real *wide;              /* bf16 act: the gradients widened, while reducing */
    bool all_reduced;        /* HSDP: `reduce` is now the replica all-reduce */
} GroupComm;

/* bf16 products: float copies of the operands for BLAS (fsdrt_gemm),
 * grown to the largest product's need and kept for the run. Host memory
 * outside the memory plan, like the attention kernel's scratch: the plan
 * counts what a GPU holds, and cuBLASLt reads bf16 directly. */
typedef struct GemmScratch {
    real *p;
    int64_t n;               /* elements */
} GemmScratch;

struct Backend {
    MPI_Comm comm;           /* the runtime's own copy of the world */
    bool have_comm;
    /* HSDP's mesh (bk_mesh): the shard group (this replica's ranks) and the
     * replica group (every replica's rank at this shard_rank); without
     * replicate, shard is comm and there is no replica group */
    MPI_Comm shard, replica;
    bool have_mesh;
    /* partial resharding (bk_mesh): N consecutive ranks, per FsdRun's partial_n */
    MPI_Comm partial[FSD_MAX_PARTIAL];
    int npartial;
    bool started_mpi;        /* MPI_Init was ours, so MPI_Finalize is too */
    Pooled *pool;
    int npool, pool_cap;
    GroupComm *gc;
    GemmScratch scratch;
    double timeout_s;        /* FSD_COLLECTIVE_TIMEOUT, or 600; --collective-timeout overrides */
};

/* ── errors ── */

static _Noreturn void mpi_failed(FsdRun *r, const char *file, int line, const char *call, int err)
{
    char why[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(err, why, &n) != MPI_SUCCESS)
        snprintf(why, sizeof why, "error %d", err);
    fprintf(stderr, "train: rank %d: %s:%d: %s failed: %s\n", r->rank, file, line, call, why);
    bk_abort(r);
}

#define MPI_CHECK(r, call)                                   \
    do {                                                     \
        int e_ = (call);                                     \
        if (e_ != MPI_SUCCESS)                               \
            mpi_failed((r), __FILE__, __LINE__, #call, e_);  \
    } while (0)

/* MPI counts are ints; the model's shapes are not. */
static int count_of(FsdRun *r, int64_t n, const char *what)
{
    if (n < 0 || n > INT_MAX)
        RT_BUG(r, "%s has %lld elements, more than an MPI count holds", what, (long long)n);
    return (int)n;
}

/* ── waiting for a collective ──
 *
 * Every collective is nonblocking and completed here, so that no wait is
 * forever: a rank that has stopped (SIGSTOP, a hung file system, a dead
 * node MPI has not noticed) would otherwise leave the others in MPI_Wait
 * for good, each spinning on a core. A wait polls MPI_Test, which also
 * moves the data along (there is no progress thread); for its first
 * SPIN_S it polls without pause, as MPI_Wait would, so the waits of a
 * healthy step (short, or moving data all along) cost what they did.
 * After that it sleeps between polls, growing to POLL_MAX_S, so that a
 * rank waiting on a slow one leaves the core to it. After the timeout
 * (--collective-timeout, FSD_COLLECTIVE_TIMEOUT, 600 s; 0: never) it says
 * what it waited for and ends the job, as the CUDA backend does for NCCL. */
#define SPIN_S 0.005
#define POLL_MAX_S 0.001
#define STALL_S 0.5

static double timeout_of(const FsdRun *r)
{
    return r->collective_timeout_s >= 0 ? r->collective_timeout_s : r->bk->timeout_s;
}

/* Where the run is, for the message: a step, start-up, or the end. */
static void run_place(const FsdRun *r, char *buf, size_t n)
{
    if (r->in_step)
        snprintf(buf, n, "in step %lld", (long long)r->step);
    else if (r->evaluating)
        snprintf(buf, n, "in the evaluation after step %lld", (long long)r->step);
    else if (r->done)
        snprintf(buf, n, "after the last step");
    else if (r->t0 == 0)
        snprintf(buf, n, "at start-up");
    else
        snprintf(buf, n, "before step %lld", (long long)r->step);
}

static _Noreturn void timed_out(FsdRun *r, const char *what, int g, double waited)
{
    char where[64], group[160] = "";
    run_place(r, where, sizeof where);
    if (g >= 0)
        snprintf(group, sizeof group, " of group %s", r->m->groups[g].name);
    fprintf(stderr,
            "train: rank %d: the %s%s %s did not complete within %.0f s (--collective-timeout): "
            "another rank has stopped, died or is stuck; aborting the job\n",
            r->rank, what, group, where, waited);
    bk_abort(r);
}

/* Completes *req, the collective `what` (of group g, or -1). */
static void wait_for(FsdRun *r, MPI_Request *req, const char *what, int g)
{
    int done = 0;
    MPI_CHECK(r, MPI_Test(req, &done, MPI_STATUS_IGNORE));
    if (done)
        return;
    const double limit = timeout_of(r);
    double waited = 0, last = rt_now(), pause = 1e-5;
    for (;;) {
        MPI_CHECK(r, MPI_Test(req, &done, MPI_STATUS_IGNORE));
        if (done)
            return;
        /* time this process did not run (stopped, or a long way behind on
         * a busy machine) counts at most STALL_S between two polls: the
         * timeout measures the others' silence, not its own */
        const double now = rt_now();
        waited += now - last < STALL_S ? now - last : STALL_S;
        last = now;
        if (limit > 0 && waited > limit)
            timed_out(r, what, g, waited);
        if (waited > SPIN_S) {
            struct timespec ts = {0, (long)(pause * 1e9)};
            nanosleep(&ts, NULL);
            pause = pause * 2 < POLL_MAX_S ? pause * 2 : POLL_MAX_S;
        }
    }
}

/* The blocking collectives the runtime needs outside the step's schedule,
 * each issued nonblocking and completed by wait_for. */
static void allreduce(FsdRun *r, const void *send, void *recv, int n, MPI_Datatype t, MPI_Op op,
                      const char *what)
{
    MPI_Request q;
    MPI_CHECK(r, MPI_Iallreduce(send, recv, n, t, op, r->bk->comm, &q));
    wait_for(r, &q, what, -1);
}

static void bcast(FsdRun *r, void *buf, int n, MPI_Datatype t, int root, const char *what)
{
    MPI_Request q;
    MPI_CHECK(r, MPI_Ibcast(buf, n, t, root, r->bk->comm, &q));
    wait_for(r, &q, what, -1);
}

_Noreturn void bk_abort(FsdRun *r)
{
    fflush(stdout);
    fflush(stderr);
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down)
        MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* ── start-up ── */

/* A launcher that started several processes which MPI does not see as one
 * job (torchrun, or srun with an MPI built without Slurm's PMI) would make
 * each of them train alone; refuse that rather than train W copies. */
static void check_launcher(FsdRun *r)
{
    static const char *const vars[] = {"WORLD_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
        const char *v = getenv(vars[i]);
        long n = v ? strtol(v, NULL, 10) : 0;
        if (n > r->world && r->world == 1) {
            rt_fail(r,
                    "%s=%s, but MPI started this process alone: the CPU backend's ranks "
                    "must be started by mpirun (or srun with Slurm's PMI support)",
                    vars[i], v);
            return;
        }
    }
}

/* OpenMP defaults to every core for every rank; with several ranks on one
 * node that oversubscribes the cores many times over, so unless the user
 * chose (OMP_NUM_THREADS) each rank takes its share. BLAS runs on one
 * thread, always (blas.c): its own pool of threads would spin against OpenMP's
 * (each pool's idle threads busy-wait for a while after their work, on the
 * cores the other pool needs next), and the attention kernel's CPU path
 * calls BLAS from inside OpenMP loops. fsdrt_gemm splits a large product
 * over the OpenMP threads itself (docs/performance.md). */
static void set_threads(FsdRun *r)
{
    fsdrt_blas_single_thread();
    if (getenv("OMP_NUM_THREADS"))
        return;
    int n = omp_get_num_procs() / (r->local_world > 0 ? r->local_world : 1);
    if (n < 1)
        n = 1;
    omp_set_num_threads(n);
}

/* How long OpenMP's idle threads spin before they sleep. The emitted step
 * opens a parallel region per op (~215 a step for bench/gpt4x256.fsd), and
 * between two regions libgomp's threads spin, by default for 300,000
 * iterations of `pause` (about 7 ms on this project's VM) before they sleep
 * on a futex. On a machine with other work that spinning costs the team
 * twice: a spinning thread holds a core that a descheduled team-mate, or
 * the other process, needs; and while it spins the scheduler sees that core
 * busy, so it does not move the thread doing the serial part between two
 * regions off the core it shares with the other process. 1,000 spins
 * (~25 us) still hand a region to a thread that is about to start the next
 * one (the serial gap between two ops is a few us) and then sleep. Measured
 * (docs/performance.md#loaded-machine), gpt4x256 at 2 threads with a busy
 * loop on one core: steps of 400-900 ms at the default and at 10,000 spins
 * against 290-400 ms at 1,000, 100 or passive waiting, which were no
 * slower than the default with no busy loop. GOMP_SPINCOUNT is GCC's
 * libgomp's and read only when it loads, so it is set here, before a
 * restart; a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is respected. Returns
 * whether it set it. */
static bool tune_spin(void)
{
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT"))
        return false;
    return setenv("GOMP_SPINCOUNT", FSD_GOMP_SPINCOUNT, 1) == 0;
}

/* Settings that libraries read only when they load (fsdrt_blas_tune_core,
 * tune_spin): when one had to change, the trainer starts itself again,
 * once, before MPI starts (the same process to mpirun), in the environment
 * it set; the restarted program finds them set and goes on. If the exec
 * fails it carries on with what the libraries chose. */
static void restart_tuned(char **argv)
{
#if defined(__linux__)
    if (!argv || !argv[0])
        return;
    bool core = fsdrt_blas_tune_core();
    bool spin = tune_spin();
    if (!core && !spin)
        return;
    execv("/proc/self/exe", argv);
    if (core)
        unsetenv("OPENBLAS_CORETYPE");
    if (spin)
        unsetenv("GOMP_SPINCOUNT");
#else
    (void)argv;
#endif
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
    int up = 0;
    MPI_Initialized(&up);
    if (!up) {
        restart_tuned(*argv);   /* may start this program again, before MPI */
        /* MPI_Init works alone (a singleton) as well as under mpirun and
         * srun; only the main thread calls MPI, OpenMP's threads never do */
        int provided = 0;
        int e = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        if (e != MPI_SUCCESS) {
            rt_fail(r, "cannot start MPI (MPI_Init_thread failed with error %d); the CPU "
                       "backend needs a working MPI, even for one process",
                    e);
            return false;
        }
        bk->started_mpi = true;
    }
    MPI_CHECK(r, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
    MPI_CHECK(r, MPI_Comm_dup(MPI_COMM_WORLD, &bk->comm));
    bk->have_comm = true;
    MPI_CHECK(r, MPI_Comm_set_errhandler(bk->comm, MPI_ERRORS_RETURN));
    MPI_CHECK(r, MPI_Comm_rank(bk->comm, &r->rank));
    MPI_CHECK(r, MPI_Comm_size(bk->comm, &r->world));
    /* the local rank is the rank among processes sharing this node's
     * memory, whatever launcher set the environment */
    MPI_Comm node;
    MPI_CHECK(r, MPI_Comm_split_type(bk->comm, MPI_COMM_TYPE_SHARED, r->rank, MPI_INFO_NULL, &node));
    MPI_CHECK(r, MPI_Comm_rank(node, &r->local_rank));
    MPI_CHECK(r, MPI_Comm_size(node, &r->local_world));
    MPI_CHECK(r, MPI_Comm_free(&node));
    bk->gc = calloc((size_t)r->m->ngroups + 1, sizeof *bk->gc);
    if (!bk->gc) {
        rt_fail(r, "out of memory starting the runtime");
        return true;
    }
    check_launcher(r);
    set_threads(r);
    bk->timeout_s = 600;
    const char *t = getenv("FSD_COLLECTIVE_TIMEOUT");
    if (t && *t) {
        char *end;
        double x = strtod(t, &end);
        if (*end || !isfinite(x) || x < 0)
            rt_fail(r, "FSD_COLLECTIVE_TIMEOUT=%s is not a number of seconds of 0 or more", t);
        else
            bk->timeout_s = x;
    }
    return true;
}

void bk_stop(FsdRun *r)
{
    Backend *bk = r->bk;
    if (!bk)
        return;
    for (int i = 0; i < bk->npool; i++)
        free(bk->pool[i].p);
    free(bk->pool);
    free(bk->gc);
    free(bk->scratch.p);
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (up && !down) {
        /* shutting down: a failure is reported, but there is nothing to undo */
        int e = bk->have_comm ? MPI_Comm_free(&bk->comm) : MPI_SUCCESS;
        if (e == MPI_SUCCESS && bk->have_mesh) {
            e = MPI_Comm_free(&bk->shard);
            if (e == MPI_SUCCESS)
                e = MPI_Comm_free(&bk->replica);
        }
        for (int i = 0; i < bk->npartial && e == MPI_SUCCESS; i++)
            e = MPI_Comm_free(&bk->partial[i]);
        if (e == MPI_SUCCESS && bk->started_mpi)
            e = MPI_Finalize();
        if (e != MPI_SUCCESS)
            fprintf(stderr, "train: rank %d: %s:%d: shutting down MPI failed (error %d)\n",
                    r->rank, __FILE__, __LINE__, e);
    }
    free(bk);
    r->bk = NULL;
}

/* ── small collectives ── */

void bk_mesh(FsdRun *r)
{
    Backend *bk = r->bk;
    bk->shard = bk->comm;
    /* partial resharding: N consecutive world ranks, which lie inside one
     * shard group as N divides S (docs/design.md#partial-resharding) */
    for (int i = 0; i < r->npartial; i++) {
        MPI_CHECK(r, MPI_Comm_split(bk->comm, (int)(r->rank / r->partial_n[i]), r->rank,
                                    &bk->partial[i]));
        bk->npartial = i + 1;
        MPI_CHECK(r, MPI_Comm_set_errhandler(bk->partial[i], MPI_ERRORS_RETURN));
    }
    if (r->replicas <= 1)
        return;
    /* colour: which replica (consecutive ranks) or which shard position;
     * key: the world rank, so ranks keep their order in each */
    MPI_CHECK(r, MPI_Comm_split(bk->comm, r->replica, r->rank, &bk->shard));
    MPI_CHECK(r, MPI_Comm_split(bk->comm, r->shard_rank, r->rank, &bk->replica));
    bk->have_mesh = true;
    MPI_CHECK(r, MPI_Comm_set_errhandler(bk->shard, MPI_ERRORS_RETURN));
    MPI_CHECK(r, MPI_Comm_set_errhandler(bk->replica, MPI_ERRORS_RETURN));
}

bool bk_agree(FsdRun *r)
{
    int mine = r->err[0] ? r->rank : r->world, first = r->world;
    allreduce(r, &mine, &first, 1, MPI_INT, MPI_MIN, "all-reduce agreeing on errors");
    if (first == r->world)
        return false;
    bcast(r, r->err, ERR_MAX, MPI_CHAR, first, "broadcast of an error");
    r->err[ERR_MAX - 1] = 0;
    return true;
}

void bk_barrier(FsdRun *r)
{
    MPI_Request q;
    MPI_CHECK(r, MPI_Ibarrier(r->bk->comm, &q));
    wait_for(r, &q, "barrier", -1);
}

void bk_allreduce_sum(FsdRun *r, double *v, int n)
{
    allreduce(r, MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, "all-reduce");
}

void bk_gather_shards(FsdRun *r, int g, real *dst)
{
    Group *G = &r->groups[g];
    if (r->replica > 0)   /* replica 0 holds the same shards */
        return;
    int n = count_of(r, G->shard, "a shard");
    MPI_Request q;
    MPI_CHECK(r, MPI_Igather(G->master, n, MPI_REAL_T, dst, n, MPI_REAL_T, 0, r->bk->shard, &q));
    wait_for(r, &q, "gather of the shards on rank 0", g);
}

bool bk_gather_bytes(FsdRun *r, const char *buf, int64_t n, char **out, int64_t *outn)
{
    *out = NULL;
    *outn = 0;
    long long mine = n, *all = NULL;
    int *counts = NULL, *displs = NULL;
    bool ok = true;
    if (r->rank == 0) {
        all = malloc(sizeof *all * (size_t)r->world);
        counts = malloc(sizeof *counts * (size_t)r->world);
        displs = malloc(sizeof *displs * (size_t)r->world);
        ok = all && counts && displs;
    }
    /* every rank learns whether rank 0 could take part, so none waits in
     * a gather rank 0 never joins */
    int ok0 = ok;
    bcast(r, &ok0, 1, MPI_INT, 0, "broadcast of rank 0's readiness");
    if (!ok0) {
        free(all), free(counts), free(displs);
        return false;
    }
    MPI_Request q;
    MPI_CHECK(r, MPI_Igather(&mine, 1, MPI_LONG_LONG, all, 1, MPI_LONG_LONG, 0, r->bk->comm, &q));
    wait_for(r, &q, "gather of byte counts on rank 0", -1);
    int64_t total = 0;
    if (r->rank == 0) {
        for (int i = 0; i < r->world; i++) {
            if (total + all[i] > INT_MAX)
                ok = false;
            counts[i] = ok ? (int)all[i] : 0;
            displs[i] = ok ? (int)total : 0;
            total += all[i];
        }
        if (ok && !(*out = malloc((size_t)total + 1)))
            ok = false;
        if (!ok)
            for (int i = 0; i < r->world; i++)
                counts[i] = displs[i] = 0;
    }
    int sent = count_of(r, n, "a rank's trace");
    ok0 = ok;
    bcast(r, &ok0, 1, MPI_INT, 0, "broadcast of rank 0's readiness");
    if (!ok0)
        sent = 0;
    MPI_CHECK(r, MPI_Igatherv(buf, sent, MPI_CHAR, *out, counts, displs, MPI_CHAR, 0, r->bk->comm, &q));
    wait_for(r, &q, "gather of bytes on rank 0", -1);
    free(all), free(counts), free(displs);
    if (!ok0) {
        free(*out);
        *out = NULL;
        return false;
    }
    *outn = r->rank == 0 ? total : 0;
    return true;
}

/* ── buffers ── */

/* FSDRT_ARENA_ALIGN (256 bytes, cudaMalloc's alignment): every buffer, and
 * every tensor carved from the arena, is as aligned as on the GPU. */
static void *aligned(int64_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, FSDRT_ARENA_ALIGN, (size_t)(bytes > 0 ? bytes : 64)) != 0)
        return NULL;
    return p;
}

void *bk_alloc(FsdRun *r, int64_t bytes)
{
    void *p = aligned(bytes);
    if (!p)
        return NULL;
    memset(p, 0, (size_t)(bytes > 0 ? bytes : 64));
    rt_count(r, bytes);
    return p;
}

void bk_free(FsdRun *r, void *p, int64_t bytes)
{
    if (!p)
        return;
    free(p);
    rt_count(r, -bytes);
}

/* `offload = cpu` asks for shard state in host memory, off the accelerator;
 * here every buffer is host memory already, so the shards stay where they
 * always are and only the counters change: offloaded state is left out of
 * them, as the memory plan leaves it out of the device peak
 * (fsdpc --dump-memory), so the CPU build's figures stay the plan's and
 * equal the CUDA build's. The numbers trained are the same either way. */
void *bk_alloc_shard(FsdRun *r, int64_t bytes)
{
    if (!r->m->offload_cpu)
        return bk_alloc(r, bytes);
    void *p = aligned(bytes);
    if (p)
        memset(p, 0, (size_t)(bytes > 0 ? bytes : 64));
    return p;
}

void bk_free_shard(FsdRun *r, void *p, int64_t bytes)
{
    if (!r->m->offload_cpu)
        bk_free(r, p, bytes);
    else
        free(p);
}

/* Unsharded buffers come and go many times a step; the pool mallocs each
 * size once and hands the smallest free buffer that fits, so the system
 * allocator is never called on the hot path after the first step. */
void *bk_pool_get(FsdRun *r, int64_t bytes, int64_t count)
{
    Backend *bk = r->bk;
    int best = -1;
    for (int i = 0; i < bk->npool; i++)
        if (!bk->pool[i].out && bk->pool[i].cap >= bytes &&
            (best < 0 || bk->pool[i].cap < bk->pool[best].cap))
            best = i;
    if (best < 0) {
        if (bk->npool == bk->pool_cap) {
            int cap = bk->pool_cap ? 2 * bk->pool_cap : 16;
            Pooled *np = realloc(bk->pool, sizeof *np * (size_t)cap);
            if (!np)
                goto oom;
            bk->pool = np;
            bk->pool_cap = cap;
        }
        void *p = aligned(bytes);
        if (!p)
            goto oom;
        bk->pool[bk->npool] = (Pooled){p, bytes, false};
        best = bk->npool++;
    }
    bk->pool[best].out = true;
    rt_count(r, count);
    return bk->pool[best].p;
oom:
    fprintf(stderr, "train: rank %d: out of memory allocating an unsharded buffer of %lld bytes\n",
            r->rank, (long long)bytes);
    bk_abort(r);
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

/* ── 16-bit floats, emulated ── */

static uint16_t narrow(FsdDtype dt, real x)
{
    return dt == FSD_BF16 ? bf16_from_float((float)x) : fp16_from_float((float)x);
}

static real widen(FsdDtype dt, uint16_t h)
{
    return dt == FSD_BF16 ? float_from_bf16(h) : float_from_fp16(h);
}

/* The elementwise loops below run on the calling thread below
 * FSD_PAR_MIN_ELEMS elements (runtime/fsdrt.h): for a small group a region
 * costs more than it saves. */

/* x rounded to what dtype dt holds */
static void round_to(FsdDtype dt, real *x, int64_t n)
{
    if (dt == FSD_FP32)
        return;
#pragma omp parallel for schedule(static) if (n >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++)
        x[i] = widen(dt, narrow(dt, x[i]));
}

/* ── parameters: all-gather ── */

/* With fp32 act the 2-byte buffer of a 16-bit param dtype is what a GPU
 * would hold and the fp32 copy the kernels read is the emulation's, so an
 * unsharded buffer counts as its dtype; with bf16 act it is the buffer. */
int64_t bk_unsharded_count(FsdRun *r, int64_t n, FsdDtype dt) { return n * dtype_bytes(dt); }

void bk_all_gather(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    GroupComm *c = &r->bk->gc[g];
    FsdDtype dt = group_param_dtype(r, g);
    int n = count_of(r, G->shard, "a shard");
    if (dt == FSD_FP32) {
        memcpy((real *)G->params + G->lo, G->master, (size_t)G->shard * sizeof(real));
        MPI_CHECK(r, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, G->params, n, MPI_REAL_T,
                                    r->bk->shard, &c->gather));
        return;
    }
    /* 2-byte values gathered in place: into the bf16 unsharded buffer
     * itself, or for fp32 act into a wire buffer the wait widens (not
     * counted: the fp32 buffer stands for it) */
    uint16_t *all = act_bf16(r) ? G->params : (c->wire = bk_pool_get(r, G->padded * 2, 0));
    uint16_t *own = all + G->lo;
#pragma omp parallel for schedule(static) if (G->shard >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < G->shard; i++)
        own[i] = narrow(dt, G->master[i]);
    MPI_CHECK(r, MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, n, MPI_UINT16_T,
                                r->bk->shard, &c->gather));
}

void bk_wait_gather(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    GroupComm *c = &r->bk->gc[g];
    wait_for(r, &c->gather, "all-gather", g);
    if (c->wire) {
        FsdDtype dt = group_param_dtype(r, g);
        real *params = G->params;
#pragma omp parallel for schedule(static) if (G->padded >= FSD_PAR_MIN_ELEMS)
        for (int64_t i = 0; i < G->padded; i++)
            params[i] = widen(dt, c->wire[i]);
        bk_pool_put(r, c->wire, 0);
        c->wire = NULL;
    }
}

/* ── partial resharding ──
 * The copy is the gathered buffer's own values (act: already rounded to
 * the gather dtype), so the gather from it rebuilds exactly what the
 * all-gather from the shards made. The fp32-act build stands for a GPU
 * holding the copy in the 16-bit gather dtype: common.c counts its bytes
 * so, and MPI moves the fp32 values. */

void bk_keep_partial(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    const int64_t n = G->padded / G->part_ranks;
    memcpy(G->kept, (char *)G->params + G->part_lo * act_bytes(r), (size_t)(n * act_bytes(r)));
}

void bk_gather_partial(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    GroupComm *c = &r->bk->gc[g];
    int n = count_of(r, G->padded / G->part_ranks, "a partial copy");
    MPI_Datatype t = act_bf16(r) ? MPI_UINT16_T : MPI_REAL_T;
    MPI_CHECK(r, MPI_Iallgather(G->kept, n, t, G->params, n, t, r->bk->partial[G->part],
                                &c->gather));
}

/* ── gradients: reduce-scatter ── */

void bk_alloc_grads(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    memset(G->grads, 0, (size_t)unsharded_bytes(r, G));
}

/* bf16/fp16 reduction, emulated: every rank's values are rounded to the
 * dtype, summed in fp32 (MPI has no 16-bit float sum) and the sum rounded
 * again in the wait; a GPU ring rounds after every hop, so the two agree to
 * the dtype's precision, not bit for bit. With bf16 act the gradients are
 * bf16 already and are widened into an fp32 buffer to be summed: for
 * reduce = fp32 that buffer is the plan's reduce buffer (common.c counts
 * it), for reduce = bf16 the emulation's (the GPU reduces the bf16 buffer
 * in place). */
void bk_reduce_scatter(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    GroupComm *c = &r->bk->gc[g];
    real *sum = G->grads;
    if (act_bf16(r)) {
        const uint16_t *grads = G->grads;
        sum = c->wide = bk_pool_get(r, G->padded * (int64_t)sizeof(real), 0);
#pragma omp parallel for schedule(static) if (G->padded >= FSD_PAR_MIN_ELEMS)
        for (int64_t i = 0; i < G->padded; i++)
            sum[i] = float_from_bf16(grads[i]);
    } else
        round_to(group_reduce_dtype(r, g), sum, G->padded);
    MPI_CHECK(r, MPI_Ireduce_scatter_block(MPI_IN_PLACE, sum, count_of(r, G->shard, "a shard"),
                                           MPI_REAL_T, MPI_SUM, r->bk->shard, &c->reduce));
}

/* shard += sum / world: averaged over ranks, accumulated over
 * micro-batches. Elementwise, so the AVX-512 and AVX2 versions (as
 * optim.c's loops have) give the scalar loop's bits; at one rank, x / 1 is
 * x and the division is left out. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void accumulate_shard(real *shard, const real *sum, int64_t n, int world)
{
    if (world == 1) {
#pragma omp parallel for simd schedule(static) if (parallel : n >= FSD_PAR_MIN_ELEMS)
        for (int64_t i = 0; i < n; i++)
            shard[i] += sum[i];
        return;
    }
    const real w = (real)world;
#pragma omp parallel for simd schedule(static) if (parallel : n >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++)
        shard[i] += sum[i] / w;
}

/* HSDP: the shard group's sum, at the start of the buffer reduced, summed
 * again across the replicas in place. MPI moves a nonblocking collective
 * only inside MPI calls, so the reduce-scatter is completed here and the
 * all-reduce started; bk_wait_reduce waits for it. The sum is rounded to
 * the reduce dtype first, as the GPU's reduce-scatter leaves it. */
void bk_all_reduce(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    GroupComm *c = &r->bk->gc[g];
    wait_for(r, &c->reduce, "reduce-scatter", g);
    real *sum = c->wide ? c->wide : G->grads;
    round_to(group_reduce_dtype(r, g), sum, G->shard);
    MPI_CHECK(r, MPI_Iallreduce(MPI_IN_PLACE, sum, count_of(r, G->shard, "a shard"), MPI_REAL_T,
                                MPI_SUM, r->bk->replica, &c->reduce));
    c->all_reduced = true;
}

/* The summed slice is at the start of the buffer reduced (MPI_IN_PLACE). */
void bk_wait_reduce(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    GroupComm *c = &r->bk->gc[g];
    wait_for(r, &c->reduce, c->all_reduced ? "replica all-reduce" : "reduce-scatter", g);
    c->all_reduced = false;
    real *sum = c->wide ? c->wide : G->grads, *shard = G->grad;
    round_to(group_reduce_dtype(r, g), sum, G->shard);
    accumulate_shard(shard, sum, G->shard, r->world);
    if (c->wide) {
        bk_pool_put(r, c->wide, 0);
        c->wide = NULL;
    }
}

/* ── compute ── */

/* Below this many multiply-adds a product runs on one thread: splitting
 * it costs more than it saves. */
#define GEMM_SPLIT_MIN FSD_PAR_MIN_MACS   /* runtime/fsdrt.h */

/* C[m, n] = beta·C (beta 0: 0, C unread): a product with K = 0. */
static void scale_rows(real *C, int64_t m, int64_t n, int64_t ldc, real beta)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            C[i * ldc + j] = beta == 0 ? 0 : beta * C[i * ldc + j];
}

/* C[m, n] = bias[j] in every row: what fsdrt_gemm_bias's product adds to. */
static void fill_bias(real *C, int64_t m, int64_t n, int64_t ldc, const real *bias)
{
    for (int64_t i = 0; i < m; i++)
        memcpy(C + i * ldc, bias, sizeof(real) * (size_t)n);
}

/* BLAS is single-threaded (set_threads): a product worth splitting is cut
 * into one slab per OpenMP thread, of rows of C (columns when C has few
 * rows), each a BLAS call of its own. Every slab repacks the operand it
 * shares, which costs little for slabs this large. With a bias, each slab
 * first fills its own part of C on its own thread, so the fill is split
 * like the product, and multiplies into it with beta 1. */
static void gemm_slabs(bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                       const real *A, int64_t lda, const real *B, int64_t ldb, real beta, real *C,
                       int64_t ldc, const real *bias)
{
    int nt = omp_get_max_threads();
    if (nt > 1 && (double)M * (double)N * (double)K >= GEMM_SPLIT_MIN) {
        bool rows = M >= N || M >= 128 * (int64_t)nt;
        int64_t total = rows ? M : N, per = (total + nt - 1) / nt;
#pragma omp parallel for schedule(static)
        for (int t = 0; t < nt; t++) {
            int64_t lo = t * per, n = total - lo < per ? total - lo : per;
            if (n <= 0)
                continue;
            const real *a = rows ? (transA ? A + lo : A + lo * lda) : A;
            const real *b = rows ? B : (transB ? B + lo * ldb : B + lo);
            real *c = rows ? C + lo * ldc : C + lo;
            if (bias)
                fill_bias(c, rows ? n : M, rows ? N : n, ldc, rows ? bias : bias + lo);
            fsdrt_blas_gemm(transA, transB, rows ? n : M, rows ? N : n, K, alpha, a, lda, b, ldb, beta,
                      c, ldc);
        }
        return;
    }
    if (bias)
        fill_bias(C, M, N, ldc, bias);
    fsdrt_blas_gemm(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* A product of fp32 operands, the empty one (K = 0) included, which BLAS
 * refuses (lda = 0): C = beta·C, or the bias. With a bias, beta is 1. */
static void product(bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                    const real *A, int64_t lda, const real *B, int64_t ldb, real beta, real *C,
                    int64_t ldc, const real *bias)
{
    if (K > 0)
        gemm_slabs(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
    else if (bias)
        fill_bias(C, M, N, ldc, bias);
    else
        scale_rows(C, M, N, ldc, beta);
}

/* ── bf16 products ──
 *
 * The BLAS libraries have no bf16 product that sums in fp32 the way cuBLASLt does, so
 * the operands are widened (exactly) into float scratch and multiplied with
 * the same sgemm as fp32 act; C is widened first when beta reads it, the
 * bias is filled in float, and each element of C is rounded to bf16 once,
 * with the bits of templates/portable.h's fsd_narrow. op(B) is widened
 * whole, op(A) and C a block of rows at a time, so the scratch stays a few
 * tens of MiB whatever M is (a [B·T, vocab] product in one piece would take
 * gigabytes). */

/* Floats of op(A) and C one block of rows may widen. */
#define BF16_BLOCK_ELEMS ((int64_t)1 << 22)

/* At least n elements of scratch, kept for later products. */
static real *scratch(FsdRun *r, int64_t n)
{
    GemmScratch *s = &r->bk->scratch;
    if (n > s->n) {
        real *p = realloc(s->p, sizeof(real) * (size_t)n);
        if (!p) {
            fprintf(stderr, "train: rank %d: out of memory widening a bf16 product (%lld bytes)\n",
                    r->rank, (long long)(sizeof(real) * (size_t)n));
            bk_abort(r);
        }
        s->p = p;
        s->n = n;
    }
    return s->p;
}

/* dst[i·n + j] = src[i·ld + j] widened from bf16, i < m, j < n. */
static void widen_rows(real *dst, const uint16_t *src, int64_t m, int64_t n, int64_t ld)
{
#pragma omp parallel for schedule(static) if (m * n >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            dst[i * n + j] = float_from_bf16(src[i * ld + j]);
}

/* fsdrt_gemm (bias NULL) and fsdrt_gemm_bias (alpha 1, beta 1) on bf16. */
static void gemm_bf16(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                      real alpha, const uint16_t *A, int64_t lda, const uint16_t *B, int64_t ldb,
                      real beta, uint16_t *C, int64_t ldc, const uint16_t *bias)
{
    int64_t rows = BF16_BLOCK_ELEMS / (K + N);
    rows = rows < 1 ? 1 : rows > M ? M : rows;
    real *b = scratch(r, K * N + rows * (K + N) + N);
    real *a = b + K * N, *c = a + rows * K, *bias_w = c + rows * N;
    widen_rows(b, B, transB ? N : K, transB ? K : N, ldb);
    if (bias)
        widen_rows(bias_w, bias, 1, N, N);
    for (int64_t i0 = 0; i0 < M; i0 += rows) {
        const int64_t m = M - i0 < rows ? M - i0 : rows;
        /* op(A)'s rows i0 … i0 + m: rows of A, or columns of the stored Aᵀ */
        if (transA)
            widen_rows(a, A + i0, K, m, lda);
        else
            widen_rows(a, A + i0 * lda, m, K, lda);
        if (!bias && beta != 0)
            widen_rows(c, C + i0 * ldc, m, N, ldc);
        product(transA, transB, m, N, K, alpha, a, transA ? m : K, b, transB ? K : N, beta, c, N,
                bias ? bias_w : NULL);
#pragma omp parallel for schedule(static) if (m * N >= FSD_PAR_MIN_ELEMS)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < N; j++)
                C[(i0 + i) * ldc + j] = bf16_from_float((float)c[i * N + j]);
    }
}

/* ── products ── */

void fsdrt_gemm(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                const void *A, int64_t lda, const void *B, int64_t ldb, real beta, void *C,
                int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm", transA, transB, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0)
        return;
    if (act_bf16(r))
        gemm_bf16(r, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
    else
        product(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

/* The bias is written into C first and BLAS adds the product to it (beta
 * 1): one pass over C that replaces BLAS's own zeroing of C for beta 0,
 * where a separate bias kernel would read and write C again. */
void fsdrt_gemm_bias(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                     const void *A, int64_t lda, const void *B, int64_t ldb, const void *bias,
                     void *C, int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm_bias", transA, transB, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0)
        return;
    if (!bias)
        RT_BUG(r, "fsdrt_gemm_bias: no bias for a [%lld, %lld] product", (long long)M,
               (long long)N);
    if (act_bf16(r))
        gemm_bf16(r, transA, transB, M, N, K, 1, A, lda, B, ldb, 1, C, ldc, bias);
    else
        product(transA, transB, M, N, K, 1, A, lda, B, ldb, 1, C, ldc, bias);
}

/* BLAS has no epilogue: pre alone, and the emitted code's gelu_fwd
 * (the template an unfused program runs) writes y. */
bool fsdrt_gemm_bias_gelu(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                          const void *A, int64_t lda, const void *B, int64_t ldb,
                          const void *bias, void *pre, void *y, int64_t ldc)
{
    fsdrt_gemm_bias(r, transA, transB, M, N, K, A, lda, B, ldb, bias, pre, ldc);
    return false;
}

/* ── the step's update: optim.c's loops, on the shards where they are ── */

void bk_update(FsdRun *r, double lr, int64_t t, double v[2])
{
    v[0] = r->loss_sum;
    v[1] = optim_grad_sumsq(r);
    allreduce(r, MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_SUM, "all-reduce of the loss and gradient norm");
    optim_step(r, lr, update_coef(r->cfg.grad_clip, v[0], v[1]), t);
}

/* ── host memory throughout: what the CUDA backend copies, this one shares ── */

void bk_ready(FsdRun *r) { (void)r; }

/* Every buffer the counters count is the plan's (the emulation's own, as
 * an fp32 copy of a bf16 gather, are not counted: docs/runtime.md#counters),
 * and there is no device to report. */
int64_t bk_counted_extra(FsdRun *r, int64_t world)
{
    (void)r, (void)world;
    return 0;
}
bool bk_memory(FsdRun *r, BkMemory *d)
{
    (void)r, (void)d;
    return false;
}

/* The host does the work: the trace's host times are its times. */
void bk_trace_start(FsdRun *r) { (void)r; }
int bk_trace_mark(FsdRun *r) { (void)r; return -1; }
void bk_trace_collective(FsdRun *r, int g, int tid, int mark[2])
{
    (void)r, (void)g, (void)tid;
    mark[0] = mark[1] = -1;
}
bool bk_trace_us(FsdRun *r, int mark, double *us)
{
    (void)r, (void)mark, (void)us;
    return false;
}
void bk_inputs(FsdRun *r, int micro) { (void)r, (void)micro; }

void bk_to_host(FsdRun *r, void *dst, const void *src, int64_t bytes)
{
    (void)r;
    if (dst != src && bytes > 0)
        memcpy(dst, src, (size_t)bytes);
}

void bk_from_host(FsdRun *r, void *dst, const void *src, int64_t bytes)
{
    bk_to_host(r, dst, src, bytes);
}

const int32_t *fsdrt_idx(const FsdRun *r) { return r->idx; }
const int32_t *fsdrt_targets(const FsdRun *r) { return r->targets; }
const int32_t *fsdrt_positions(const FsdRun *r) { return r->positions; }

void fsdrt_add_loss_tensor(FsdRun *r, const real *loss) { r->loss_sum += (double)loss[0]; }
