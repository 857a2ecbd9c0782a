/*
 * test_nccl.cc — checks cudasim's NCCL (nccl.cc) on its own, with the
 * simulated device (device.cc) under it, at any rank count:
 *
 *   mpicxx -std=c++17 -O2 -Wall -Wextra -I tests/cudasim/include -I tests/cudasim \
 *       tests/cudasim/test_nccl.cc tests/cudasim/nccl.cc tests/cudasim/device.cc -o t
 *   mpirun --allow-run-as-root --oversubscribe -np 3 ./t          # all must pass
 *   mpirun ... -np 3 ./t fail NAME     # must stop: exit 3, "cudasim: rank R: ..."
 *
 * `./t` runs the collectives as cuda_comm.c uses them (all-gather in place,
 * reduce-scatter sum and avg in fp32 and bf16, all-reduce in fp64 and
 * int32/int64, broadcast of chars, a grouped gather to rank 0 of
 * different lengths) on lazy streams, and checks the results against
 * sums made here in rank order; that a collective reads its operands when
 * its stream runs it, not when queued; the async-error switch; and fp16's
 * conversions against the compiler's _Float16. `./t fail NAME` makes one
 * call the real NCCL would reject (or hang on); `./t list` names them.
 */
#include "nccl.h"
#include "sim.h"

#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

static int rank, world, failures;
static ncclComm_t comm;
static cudaStream_t s1, s2;

#define CHECK(cond, ...)                                          \
    do {                                                          \
        if (!(cond)) {                                            \
            fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                         \
            fprintf(stderr, "\n");                                \
            failures++;                                           \
        }                                                         \
    } while (0)

#define NCCL(call) CHECK((call) == ncclSuccess, "%s failed", #call)

template <typename T> static T *dev(size_t n)
{
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(T) > 0 ? n * sizeof(T) : 1) != cudaSuccess) {
        fprintf(stderr, "rank %d: cudaMalloc failed\n", rank);
        exit(1);
    }
    return (T *)p;
}

static void sync(cudaStream_t s) { CHECK(cudaStreamSynchronize(s) == cudaSuccess, "sync"); }

/* bf16, rounding to nearest even (no NaN here): the expected values. */
static uint16_t bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static float unbf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* A value each rank holds at element i: not exact in bf16 sums, so the
 * rounding shows. */
static float val(int r, size_t i) { return 1.0f + 0.0078125f * (float)((r * 37 + (int)i * 11) % 97) + (float)r / 3.0f; }

static void all_gather_in_place(void)
{
    const size_t n = 5;
    float *all = dev<float>(n * world);
    for (size_t i = 0; i < n; i++)
        all[rank * n + i] = val(rank, i);
    NCCL(ncclAllGather(all + rank * n, all, n, ncclFloat32, comm, s1));
    sync(s1);
    for (int r = 0; r < world; r++)
        for (size_t i = 0; i < n; i++)
            CHECK(all[r * n + i] == val(r, i), "all-gather: [%d][%zu] = %g, want %g", r, i,
                  all[r * n + i], val(r, i));
    cudaFree(all);
}

static void reduce_scatter(ncclDataType_t t, ncclRedOp_t op)
{
    const size_t n = 7;
    const bool b = t == ncclBfloat16;
    void *buf = b ? (void *)dev<uint16_t>(n * world) : (void *)dev<float>(n * world);
    for (size_t i = 0; i < n * world; i++) {
        float v = val(rank, i);
        if (b)
            ((uint16_t *)buf)[i] = bf16(v);
        else
            ((float *)buf)[i] = v;
    }
    /* in place: this rank's slice */
    char *mine = (char *)buf + rank * n * (b ? 2 : 4);
    NCCL(ncclReduceScatter(buf, mine, n, t, op, comm, s2));
    sync(s2);
    for (size_t i = 0; i < n; i++) {
        size_t at = rank * n + i;
        float sum = 0;
        for (int r = 0; r < world; r++)
            sum += b ? unbf16(bf16(val(r, at))) : val(r, at);
        if (op == ncclAvg)
            sum /= (float)world;
        float got = b ? unbf16(((uint16_t *)mine)[i]) : ((float *)mine)[i];
        float want = b ? unbf16(bf16(sum)) : sum;
        CHECK(got == want, "reduce-scatter %s op %d: [%zu] = %.9g, want %.9g", b ? "bf16" : "fp32",
              (int)op, i, got, want);
    }
    cudaFree(buf);
}

static void all_reduce(void)
{
    const size_t n = 3;
    double *d = dev<double>(n);
    for (size_t i = 0; i < n; i++)
        d[i] = 0.1 * (rank + 1) + (double)i;
    NCCL(ncclAllReduce(d, d, n, ncclFloat64, ncclSum, comm, s1));
    sync(s1);
    for (size_t i = 0; i < n; i++) {
        double want = 0;
        for (int r = 0; r < world; r++)
            want += 0.1 * (r + 1) + (double)i;
        CHECK(d[i] == want, "all-reduce fp64: [%zu] = %.17g, want %.17g", i, d[i], want);
    }
    /* integers, out of place: min of ranks, and int64 sum and avg */
    int32_t *a = dev<int32_t>(1), *m = dev<int32_t>(1);
    *a = rank == world - 1 ? -5 : rank;
    NCCL(ncclAllReduce(a, m, 1, ncclInt32, ncclMin, comm, s1));
    int64_t *l = dev<int64_t>(2);
    l[0] = l[1] = (int64_t)rank + 1;
    NCCL(ncclAllReduce(l, l, 1, ncclInt64, ncclSum, comm, s1));
    NCCL(ncclAllReduce(l + 1, l + 1, 1, ncclInt64, ncclAvg, comm, s1));
    sync(s1);
    CHECK(*m == (world > 1 ? -5 : -5), "all-reduce int32 min: %d", *m);
    CHECK(l[0] == (int64_t)world * (world + 1) / 2, "all-reduce int64 sum: %lld", (long long)l[0]);
    CHECK(l[1] == (int64_t)world * (world + 1) / 2 / world, "all-reduce int64 avg: %lld",
          (long long)l[1]);
    cudaFree(d);
    cudaFree(a);
    cudaFree(m);
    cudaFree(l);
}

static void broadcast(void)
{
    const int root = world - 1;
    char *c = dev<char>(32);
    snprintf(c, 32, "from rank %d", rank);
    NCCL(ncclBroadcast(c, c, 32, ncclChar, root, comm, s1));
    sync(s1);
    char want[32];
    snprintf(want, 32, "from rank %d", root);
    CHECK(!strcmp(c, want), "broadcast: \"%s\", want \"%s\"", c, want);
    cudaFree(c);
}

/* bk_gather_bytes' pattern: every rank but 0 sends its bytes, rank 0
 * receives each into place; a rank with nothing to send sends nothing. */
static void gather_to_0(void)
{
    std::string all, mine(rank == 1 ? 0 : 3 + 2 * rank, (char)('a' + rank));
    std::vector<int64_t> len(world);
    for (int r = 0; r < world; r++) {
        len[r] = r == 1 ? 0 : 3 + 2 * r;
        all += std::string((size_t)len[r], (char)('a' + r));
    }
    char *d_mine = dev<char>(mine.size()), *d_all = dev<char>(all.size());
    memcpy(d_mine, mine.data(), mine.size());
    NCCL(ncclGroupStart());
    if (rank != 0 && !mine.empty())
        NCCL(ncclSend(d_mine, mine.size(), ncclChar, 0, comm, s2));
    int64_t at = len[0];
    for (int r = 1; rank == 0 && r < world; at += len[r++])
        if (len[r] > 0)
            NCCL(ncclRecv(d_all + at, (size_t)len[r], ncclChar, r, comm, s2));
    NCCL(ncclGroupEnd());
    sync(s2);
    if (rank == 0) {
        memcpy(d_all, d_mine, mine.size());
        CHECK(!memcmp(d_all, all.data(), all.size()), "gather to 0: \"%.*s\", want \"%s\"",
              (int)all.size(), d_all, all.c_str());
    }
    cudaFree(d_mine);
    cudaFree(d_all);
}

/* A collective reads sendbuff when its stream runs it: a write after the
 * call but before the stream runs is what it sends (lazy streams only). */
static void reads_when_run(void)
{
    const char *mode = getenv("FSD_CUDASIM");
    if (mode && !strcmp(mode, "eager"))
        return;   /* eager streams run it as it is queued */
    float *all = dev<float>(world);
    all[rank] = -1;
    NCCL(ncclAllGather(all + rank, all, 1, ncclFloat32, comm, s1));
    all[rank] = (float)rank;   /* lazy s1 has not run it yet */
    sync(s1);
    for (int r = 0; r < world; r++)
        CHECK(all[r] == (float)r, "lazy all-gather: [%d] = %g, want %d", r, all[r], r);
    cudaFree(all);
}

static void async_error(void)
{
    ncclResult_t a = ncclInternalError;
    NCCL(ncclCommGetAsyncError(comm, &a));
    CHECK(a == ncclSuccess, "async error %d without the switch", (int)a);
    CHECK(!*ncclGetLastError(comm), "last error \"%s\" without one", ncclGetLastError(comm));
    setenv("FSD_CUDASIM_NCCL_ASYNC_ERROR", "1", 1);
    NCCL(ncclCommGetAsyncError(comm, &a));
    CHECK(a == ncclSystemError, "async error %d with the switch", (int)a);
    CHECK(*ncclGetLastError(NULL), "no last error with the switch");
    unsetenv("FSD_CUDASIM_NCCL_ASYNC_ERROR");
    CHECK(!strcmp(ncclGetErrorString(ncclSystemError),
                  "unhandled system error (run with NCCL_DEBUG=INFO for details)"),
          "error string");
}

/* fp16, against the compiler's _Float16: every half value goes through
 * the fake's widening and narrowing unchanged (max with -inf on the other
 * ranks), and sums and averages of halves round once, to nearest even, as
 * _Float16's narrowing of the float result does. */
static void fp16_all_reduce(void)
{
#ifdef __FLT16_MAX__
    const size_t n = 65536;
    uint16_t *h = dev<uint16_t>(n), *o = dev<uint16_t>(n);
    for (size_t i = 0; i < n; i++)
        h[i] = rank == 0 ? (uint16_t)i : 0xfc00;   /* -inf */
    NCCL(ncclAllReduce(h, o, n, ncclFloat16, ncclMax, comm, s1));
    sync(s1);
    for (size_t i = 0; i < n; i++) {
        bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
        if (nan)
            CHECK((o[i] & 0x7c00) == 0x7c00 && (o[i] & 0x3ff), "fp16 max: NaN %zx became %x", i, o[i]);
        else
            CHECK(o[i] == (uint16_t)i, "fp16 max: %zx became %x", i, o[i]);
    }
    /* sums: rank r holds (i * 2654435761 + r * 40503) halves, finite */
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(i * 2654435761u + (unsigned)rank * 40503u);
        if ((v & 0x7c00) == 0x7c00)
            v &= 0xbfff;   /* no inf or NaN */
        h[i] = v;
    }
    NCCL(ncclAllReduce(h, o, n, ncclFloat16, ncclSum, comm, s1));
    sync(s1);
    for (size_t i = 0; i < n; i++) {
        float sum = 0;   /* from rank 0's value on: a lone -0 stays -0 */
        for (int r = 0; r < world; r++) {
            uint16_t v = (uint16_t)(i * 2654435761u + (unsigned)r * 40503u);
            if ((v & 0x7c00) == 0x7c00)
                v &= 0xbfff;
            _Float16 x;
            memcpy(&x, &v, 2);
            sum = r == 0 ? (float)x : sum + (float)x;
        }
        _Float16 want = (_Float16)sum;
        uint16_t w;
        memcpy(&w, &want, 2);
        CHECK(o[i] == w, "fp16 sum [%zu]: %x, want %x (%.9g)", i, o[i], w, sum);
    }
    /* averages: rank 0 holds every finite half, the others zeros, so the
     * result is x / world rounded once, often into the subnormals */
    for (size_t i = 0; i < n; i++)
        h[i] = rank == 0 && (i & 0x7c00) != 0x7c00 ? (uint16_t)i : 0;
    NCCL(ncclAllReduce(h, o, n, ncclFloat16, ncclAvg, comm, s1));
    sync(s1);
    for (size_t i = 0; i < n; i++) {
        if ((i & 0x7c00) == 0x7c00)
            continue;
        uint16_t v = (uint16_t)i, w;
        _Float16 x;
        memcpy(&x, &v, 2);
        float sum = (float)x;
        for (int r = 1; r < world; r++)
            sum += 0.0f;   /* the others' zeros: -0 + 0 is +0 */
        _Float16 want = (_Float16)(sum / (float)world);
        memcpy(&w, &want, 2);
        CHECK(o[i] == w, "fp16 avg [%zx]: %x, want %x", i, o[i], w);
    }
    cudaFree(h);
    cudaFree(o);
#else
    if (rank == 0)
        printf("fp16 check skipped: the compiler has no _Float16\n");
#endif
}

/* bf16 rounding at ties: rank 0 holds 1, the others 2^-8 · k, so sums sit
 * on and beside bf16's midpoints. */
static void bf16_ties(void)
{
    const size_t n = 64;
    uint16_t *h = dev<uint16_t>(n);
    for (size_t i = 0; i < n; i++)
        h[i] = bf16(rank == 0 ? 1.0f : ldexpf((float)(i + 1), -9 - (int)(i % 8)));
    NCCL(ncclAllReduce(h, h, n, ncclBfloat16, ncclSum, comm, s1));
    sync(s1);
    for (size_t i = 0; i < n; i++) {
        float sum = 1.0f;
        for (int r = 1; r < world; r++)
            sum += ldexpf((float)(i + 1), -9 - (int)(i % 8));
        CHECK(h[i] == bf16(sum), "bf16 sum [%zu]: %x, want %x", i, h[i], bf16(sum));
    }
    cudaFree(h);
}

/* ── calls that must fail ── */

static void fail(const char *name)
{
    float *d = dev<float>(4 * world);
    static float host[64];
    if (!strcmp(name, "inplace-offset"))   /* all-gather in place at another rank's slice */
        ncclAllGather(d + ((rank + 1) % world) * 4, d, 4, ncclFloat32, comm, s1);
    else if (!strcmp(name, "rs-offset"))
        ncclReduceScatter(d, d + 1, 4, ncclFloat32, ncclSum, comm, s1);
    else if (!strcmp(name, "host-memory"))
        ncclAllReduce(host, host, 4, ncclFloat32, ncclSum, comm, s1);
    else if (!strcmp(name, "too-long"))    /* recvbuff one element past its allocation's end */
        ncclAllGather(d, dev<float>(4 * world) + 1, 4, ncclFloat32, comm, s1);
    else if (!strcmp(name, "misaligned"))
        ncclAllReduce((char *)d + 2, (char *)d + 2, 2, ncclFloat32, ncclSum, comm, s1);
    else if (!strcmp(name, "datatype"))
        ncclAllReduce(d, d, 4, (ncclDataType_t)42, ncclSum, comm, s1);
    else if (!strcmp(name, "op"))
        ncclAllReduce(d, d, 4, ncclFloat32, (ncclRedOp_t)7, comm, s1);
    else if (!strcmp(name, "root"))
        ncclBroadcast(d, d, 4, ncclFloat32, world, comm, s1);
    else if (!strcmp(name, "peer"))
        ncclSend(d, 4, ncclFloat32, -1, comm, s1);
    else if (!strcmp(name, "count-mismatch")) {   /* rank 0 reduces one element more */
        ncclAllReduce(d, d, rank == 0 ? 4 : 3, ncclFloat32, ncclSum, comm, s1);
        sync(s1);
    } else if (!strcmp(name, "order")) {   /* rank 0's streams run two collectives the other way */
        ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s1);
        ncclAllReduce(d + 1, d + 1, 1, ncclFloat32, ncclMax, comm, s2);
        sync(rank == 0 ? s2 : s1);
        sync(rank == 0 ? s1 : s2);
    } else if (!strcmp(name, "recv-size")) {   /* rank 0 expects more than rank 1 sends */
        ncclGroupStart();
        if (rank == 1)
            ncclSend(d, 2, ncclFloat32, 0, comm, s1);
        if (rank == 0)
            ncclRecv(d, 3, ncclFloat32, 1, comm, s1);
        ncclGroupEnd();
        sync(s1);
    } else if (!strcmp(name, "recv-short")) {   /* rank 1 sends more than rank 0 expects */
        ncclGroupStart();
        if (rank == 1)
            ncclSend(d, 3, ncclFloat32, 0, comm, s1);
        if (rank == 0)
            ncclRecv(d, 2, ncclFloat32, 1, comm, s1);
        ncclGroupEnd();
        sync(s1);
    } else if (!strcmp(name, "self-send"))   /* a send to oneself, alone */
        ncclSend(d, 1, ncclFloat32, rank, comm, s1);
    else if (!strcmp(name, "pending")) {   /* finalize with an all-reduce still queued */
        ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s1);
        ncclCommFinalize(comm);
    } else if (!strcmp(name, "after-destroy")) {
        ncclCommFinalize(comm);
        ncclCommDestroy(comm);
        ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, comm, s1);
    } else {
        fprintf(stderr, "unknown failure case %s\n", name);
        exit(2);
    }
    /* a rank the case does not stop waits here for one it does: the
     * barrier completes only if no rank stopped */
    MPI_Barrier(MPI_COMM_WORLD);
    fprintf(stderr, "rank %d: %s was not caught\n", rank, name);
    exit(1);
}

/* Start-up failures: the comm is made inside. */
static bool fail_start(const char *name)
{
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (!strcmp(name, "wrong-world")) {
        ncclGetUniqueId(&id);
        MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
        ncclCommInitRank(&comm, world + 1, id, rank);
    } else if (!strcmp(name, "different-ids")) {   /* every rank makes its own */
        ncclGetUniqueId(&id);
        ncclCommInitRank(&comm, world, id, rank);
    } else if (!strcmp(name, "zero-id"))   /* the id never sent */
        ncclCommInitRank(&comm, world, id, rank);
    else
        return false;
    fprintf(stderr, "rank %d: %s was not caught\n", rank, name);
    exit(1);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc > 1 && !strcmp(argv[1], "list")) {
        if (rank == 0)
            printf("inplace-offset rs-offset host-memory too-long misaligned datatype op root peer "
                   "count-mismatch order recv-size recv-short self-send pending after-destroy wrong-world "
                   "different-ids zero-id\n");
        MPI_Finalize();
        return 0;
    }
    if (argc > 2 && !strcmp(argv[1], "fail"))
        fail_start(argv[2]);

    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0)
        NCCL(ncclGetUniqueId(&id));
    MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
    NCCL(ncclCommInitRank(&comm, world, id, rank));
    cudaStreamCreateWithPriority(&s1, cudaStreamNonBlocking, 0);
    cudaStreamCreateWithPriority(&s2, cudaStreamNonBlocking, 0);

    if (argc > 2 && !strcmp(argv[1], "fail"))
        fail(argv[2]);

    all_gather_in_place();
    reduce_scatter(ncclFloat32, ncclSum);
    reduce_scatter(ncclFloat32, ncclAvg);
    reduce_scatter(ncclBfloat16, ncclSum);
    reduce_scatter(ncclBfloat16, ncclAvg);
    all_reduce();
    broadcast();
    gather_to_0();
    reads_when_run();
    fp16_all_reduce();
    bf16_ties();
    async_error();

    NCCL(ncclCommFinalize(comm));
    NCCL(ncclCommDestroy(comm));
    cudaStreamDestroy(s1);
    cudaStreamDestroy(s2);
    int bad = 0;
    MPI_Allreduce(&failures, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("test_nccl: %d ranks: %s (%d failed checks)\n", world, bad ? "FAILED" : "ok", bad);
    MPI_Finalize();
    return bad ? 1 : 0;
}
