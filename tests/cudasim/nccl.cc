/*
 * nccl.cc — cudasim's NCCL: the calls of runtime/cuda_*.c, run over MPI, one
 * process per rank (README.md). Built with mpicxx; the backend reaches it
 * through include/nccl.h.
 *
 * Communicators. ncclCommInitRank starts MPI if nothing has (cuda_boot.c's
 * FSD_NCCL_ID_FILE bootstrap never does; it is then finalized at exit, if
 * every communicator was destroyed and none aborted: a run that failed
 * leaves the job to mpirun), and gives the communicator its own duplicate
 * of MPI_COMM_WORLD. ncclCommSplit (HSDP's shard and replica groups) is
 * MPI_Comm_split of the parent's: the new communicator's rank and size are
 * its own, so the in-place rules below hold for its ranks.
 *
 * Collectives are queued with sim_enqueue on the caller's stream and do
 * their MPI work when the stream runs them, reading their operands then.
 * A reduction gathers every rank's operand (MPI_Allgather for
 * ncclAllReduce, MPI_Alltoall of the slices for ncclReduceScatter) and
 * reduces it locally, element by element over the ranks in rank order: in
 * float for fp32, bf16 and fp16 (the 16-bit values widened, the result
 * rounded to nearest even once), in double for fp64, wrapping for
 * integers; ncclAvg is the sum divided by the rank count (integer division
 * for integers). Deterministic, and the same on every rank. ncclSend and
 * ncclRecv post MPI_Isend/MPI_Irecv when they run; the calls between
 * ncclGroupStart and ncclGroupEnd are queued as one op at ncclGroupEnd and
 * complete together at its end.
 *
 * What it checks — the calls NCCL would reject, and the misuses it would
 * hang or corrupt memory on — each stopping the run with sim_fail:
 *   - start: nranks and rank agree with MPI's world (the bootstrap handed
 *     the right ones), every rank passed the same id (so it travelled from
 *     rank 0 intact), and the id is not all zeros (no ncclGetUniqueId made
 *     it);
 *   - every call: a live communicator (not destroyed, aborted, or used
 *     after ncclCommFinalize), known datatype and reduction op (fp8 is
 *     NCCL's but not cudasim's), root and peer in range;
 *   - buffers: device memory (sim_need_device) for the whole count,
 *     aligned to the element, and either apart or in place as NCCL
 *     defines it (all-gather: sendbuff = recvbuff + rank·count; reduce-
 *     scatter: recvbuff = sendbuff + rank·recvcount; all-reduce and
 *     broadcast: sendbuff = recvbuff);
 *   - when a collective runs: every rank runs the same collective (its
 *     issue number on the communicator, kind, datatype, count, op, root),
 *     so ranks whose streams run the communicator's collectives in
 *     different orders, or that disagree on a count, stop with a message
 *     instead of hanging or mixing up data;
 *   - point to point: a receive gets exactly the bytes it asked for, and
 *     a send to oneself has its receive in the same group;
 *   - finalize and destroy: no op of the communicator still queued (its
 *     buffers may be freed already) and no group left open;
 *   - ordering: an op on a stream other than the compute stream is ordered
 *     after everything queued on the compute stream before it (sim.h's
 *     sim_need_after_compute: runtime/cuda_comm.c's fence).
 * ncclCommGetAsyncError reports ncclSystemError when
 * FSD_CUDASIM_NCCL_ASYNC_ERROR=1, and FSD_CUDASIM_NCCL_HANG=K makes one
 * collective never complete (hung(), below), so a test can check the backend's
 * host waits.
 * Limits of the simulator, also stopped with a message: more than INT_MAX
 * bytes in one operand, and a group whose calls use different streams.
 */
#include "half.h"   /* runtime/half.h: 16-bit floats, to nearest even */
#include "nccl.h"
#include "sim.h"

/* MPI's C API only: the C++ bindings OpenMPI would add warn under -Wextra */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <limits.h>
#include <math.h>
#include <random>
#include <set>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <type_traits>
#include <vector>

struct ncclComm {
    MPI_Comm mpi;
    int rank, nranks;
    uint64_t colls;                  /* collectives issued: the next one's number */
    std::vector<uint64_t> sends, recvs;   /* point-to-point ops issued, per peer: tags */
    long queued;                     /* ops queued on a stream that have not run */
    bool finalized;
    bool aborted;                    /* its queued ops do nothing when they run */
};

static std::set<ncclComm *> live;   /* communicators made and not destroyed or aborted */
static bool started_mpi, any_aborted;
static std::string last_error;       /* ncclGetLastError's text */
static int tag_ub = 32767;           /* MPI's largest tag, at least this */

/* ── datatypes and ops ── */

static const char *type_name(ncclDataType_t t)
{
    static const char *const names[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",
                                        "ncclUint32",  "ncclInt64",   "ncclUint64",
                                        "ncclFloat16", "ncclFloat32", "ncclFloat64",
                                        "ncclBfloat16"};
    return t >= 0 && t <= ncclBfloat16 ? names[t] : "?";
}

static const char *op_name(ncclRedOp_t op)
{
    static const char *const names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
    return op >= 0 && op < ncclNumOps ? names[op] : "?";
}

/* Bytes of one element; fails for a type NCCL does not have, or one
 * cudasim does not run. */
static size_t type_bytes(const char *call, ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8:
        return 1;
    case ncclFloat16:
    case ncclBfloat16:
        return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
        return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
        return 8;
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
        sim_fail("%s: fp8 datatype %d: NCCL has it (sm_90), cudasim does not", call, (int)t);
    default:
        sim_fail("%s: unknown ncclDataType_t %d", call, (int)t);
    }
}

static void need_op(const char *call, ncclRedOp_t op)
{
    if (op < 0 || op >= ncclNumOps)
        sim_fail("%s: unknown ncclRedOp_t %d (cudasim has no custom ops)", call, (int)op);
}

/* ── reductions: out[i] = in[0][i] op in[1][i] op ... (ranks in order) ── */

template <typename T, typename Acc, typename Load, typename Store>
static void fold_float(const void *all, void *out, size_t count, int n, ncclRedOp_t op, Load load,
                       Store store)
{
    const T *in = (const T *)all;
    T *o = (T *)out;
    for (size_t i = 0; i < count; i++) {
        Acc acc = load(in[i]);
        for (int r = 1; r < n; r++) {
            Acc x = load(in[(size_t)r * count + i]);
            switch (op) {
            case ncclSum:
            case ncclAvg: acc += x; break;
            case ncclProd: acc *= x; break;
            case ncclMax: acc = x > acc || isnan(x) ? x : acc; break;   /* NaN wins, as on the GPU */
            case ncclMin: acc = x < acc || isnan(x) ? x : acc; break;
            default: break;
            }
        }
        if (op == ncclAvg)
            acc /= (Acc)n;
        o[i] = store(acc);
    }
}

/* Integers wrap on overflow, as the GPU's do: sums and products in the
 * unsigned type of the same width. */
template <typename T>
static void fold_int(const void *all, void *out, size_t count, int n, ncclRedOp_t op)
{
    typedef typename std::make_unsigned<T>::type U;
    const T *in = (const T *)all;
    T *o = (T *)out;
    for (size_t i = 0; i < count; i++) {
        T acc = in[i];
        for (int r = 1; r < n; r++) {
            T x = in[(size_t)r * count + i];
            switch (op) {
            case ncclSum:
            case ncclAvg: acc = (T)(U)((U)acc + (U)x); break;
            case ncclProd: acc = (T)(U)((U)acc * (U)x); break;
            case ncclMax: acc = x > acc ? x : acc; break;
            case ncclMin: acc = x < acc ? x : acc; break;
            default: break;
            }
        }
        if (op == ncclAvg)
            acc = (T)(acc / (T)n);
        o[i] = acc;
    }
}

static void fold(const void *all, void *out, size_t count, int n, ncclDataType_t t, ncclRedOp_t op)
{
    auto same_f = [](float v) { return v; };
    auto same_d = [](double v) { return v; };
    switch (t) {
    case ncclInt8: fold_int<int8_t>(all, out, count, n, op); break;
    case ncclUint8: fold_int<uint8_t>(all, out, count, n, op); break;
    case ncclInt32: fold_int<int32_t>(all, out, count, n, op); break;
    case ncclUint32: fold_int<uint32_t>(all, out, count, n, op); break;
    case ncclInt64: fold_int<int64_t>(all, out, count, n, op); break;
    case ncclUint64: fold_int<uint64_t>(all, out, count, n, op); break;
    case ncclFloat16:
        fold_float<uint16_t, float>(all, out, count, n, op, float_from_fp16, fp16_from_float);
        break;
    case ncclBfloat16:
        fold_float<uint16_t, float>(all, out, count, n, op, float_from_bf16, bf16_from_float);
        break;
    case ncclFloat32: fold_float<float, float>(all, out, count, n, op, same_f, same_f); break;
    case ncclFloat64: fold_float<double, double>(all, out, count, n, op, same_d, same_d); break;
    default: sim_fail("fold: datatype %d", (int)t);   /* checked when called */
    }
}

/* ── MPI ── */

static void mpi_check(int e, const char *call, const char *mpi_call)
{
    if (e == MPI_SUCCESS)
        return;
    char why[MPI_MAX_ERROR_STRING];
    int n = 0;
    if (MPI_Error_string(e, why, &n) != MPI_SUCCESS)
        snprintf(why, sizeof why, "error %d", e);
    sim_fail("%s: %s failed: %s", call, mpi_call, why);
}

#define MPI_OK(call, mpi_call) mpi_check((mpi_call), (call), #mpi_call)

/* At exit, when the simulator started MPI: finalized only after a clean
 * end. A rank that failed skips it (MPI_Finalize waits for the others),
 * and mpirun ends the job when it sees the rank exit unfinalized. */
static void finalize_mpi(void)
{
    int done = 0;
    MPI_Finalized(&done);
    if (!done && live.empty() && !any_aborted)
        MPI_Finalize();
}

/* ── checks ── */

static ncclComm *need_comm(const char *call, ncclComm_t comm)
{
    if (!comm)
        sim_fail("%s: a null communicator", call);
    if (!live.count(comm))
        sim_fail("%s: communicator %p is not live (never made, destroyed or aborted)", call,
                 (void *)comm);
    if (comm->finalized)
        sim_fail("%s: communicator used after ncclCommFinalize", call);
    return comm;
}

/* `bytes` of elements of `t` at p: device memory, aligned to the element,
 * and within what one MPI call moves. */
static void need_buffer(const char *call, const char *name, const void *p, size_t count,
                        ncclDataType_t t)
{
    size_t esz = type_bytes(call, t);
    if (count > (size_t)INT_MAX / esz)
        sim_fail("%s: %s of %zu elements of %s: over INT_MAX bytes, more than cudasim's MPI "
                 "calls move",
                 call, name, count, type_name(t));
    if ((uintptr_t)p % esz)
        sim_fail("%s: %s %p is not aligned to its %s elements (%zu bytes)", call, name, p,
                 type_name(t), esz);
    if (count) {
        char what[160];
        snprintf(what, sizeof what, "%s's %s (%zu elements of %s)", call, name, count, type_name(t));
        sim_need_device(p, count * esz, what);
    }
}

static bool overlap(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

/* ── collectives ── */

enum Kind { ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, BROADCAST };
static const char *const kind_names[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce",
                                         "ncclBroadcast"};

/* One collective as issued; copied into the op that runs it. */
struct Coll {
    Kind kind;
    ncclComm *comm;
    const char *send;
    char *recv;
    size_t count;              /* NCCL's count: per rank for all-gather and reduce-scatter */
    ncclDataType_t type;
    ncclRedOp_t op;            /* reductions; else ncclSum */
    int root;                  /* broadcast; else 0 */
    uint64_t seq;              /* its number among the communicator's collectives */
};

/* Every rank must be running the same collective now: NCCL would hang or
 * mix data up otherwise. */
static void agree(const Coll &c)
{
    ncclComm *m = c.comm;
    const int64_t mine[6] = {(int64_t)c.seq, c.kind, c.type, c.op, (int64_t)c.count, c.root};
    std::vector<int64_t> all((size_t)m->nranks * 6);
    MPI_OK(kind_names[c.kind], MPI_Allgather(mine, 6, MPI_INT64_T, all.data(), 6, MPI_INT64_T, m->mpi));
    for (int r = 0; r < m->nranks; r++) {
        const int64_t *o = &all[(size_t)r * 6];
        if (!memcmp(o, mine, sizeof mine))
            continue;
        sim_fail("%s #%llu (%zu x %s, %s, root %d) runs while rank %d runs %s #%lld (%lld x %s, "
                 "%s, root %lld): every rank must run the communicator's collectives in the same "
                 "order with the same counts (are its streams run in different orders?)",
                 kind_names[c.kind], (unsigned long long)c.seq, c.count, type_name(c.type),
                 op_name(c.op), c.root, r, o[1] >= 0 && o[1] <= BROADCAST ? kind_names[o[1]] : "?",
                 (long long)o[0], (long long)o[4], type_name((ncclDataType_t)o[2]),
                 op_name((ncclRedOp_t)o[3]), (long long)o[5]);
    }
}

static void run_coll(const Coll &c)
{
    ncclComm *m = c.comm;
    agree(c);
    const char *call = kind_names[c.kind];
    const int n = m->nranks;
    const size_t esz = type_bytes(call, c.type), bytes = c.count * esz;
    const int nb = (int)bytes;   /* checked ≤ INT_MAX when issued */
    std::vector<char> all;
    switch (c.kind) {
    case ALL_GATHER:
        if (c.send == c.recv + (size_t)m->rank * bytes)
            MPI_OK(call, MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, c.recv, nb, MPI_BYTE, m->mpi));
        else
            MPI_OK(call, MPI_Allgather(c.send, nb, MPI_BYTE, c.recv, nb, MPI_BYTE, m->mpi));
        break;
    case REDUCE_SCATTER:
        /* slice r of every rank's sendbuff to rank r */
        all.resize((size_t)n * bytes);
        MPI_OK(call, MPI_Alltoall(c.send, nb, MPI_BYTE, all.data(), nb, MPI_BYTE, m->mpi));
        fold(all.data(), c.recv, c.count, n, c.type, c.op);
        break;
    case ALL_REDUCE:
        all.resize((size_t)n * bytes);
        MPI_OK(call, MPI_Allgather(c.send, nb, MPI_BYTE, all.data(), nb, MPI_BYTE, m->mpi));
        fold(all.data(), c.recv, c.count, n, c.type, c.op);
        break;
    case BROADCAST:
        if (m->rank == c.root && c.send != c.recv && bytes)
            memcpy(c.recv, c.send, bytes);
        MPI_OK(call, MPI_Bcast(c.recv, nb, MPI_BYTE, c.root, m->mpi));
        break;
    }
}

/* ── point to point ── */

struct P2p {
    bool send;
    ncclComm *comm;
    char *buf;
    size_t bytes;
    int peer;
    int tag;   /* the k-th send from a to b meets b's k-th receive from a */
};

/* ── groups ── */

/* A call between ncclGroupStart and ncclGroupEnd, or alone. */
struct Call {
    bool coll;
    Coll c;
    P2p p;
    cudaStream_t stream;
};

static int group_depth;
static std::vector<Call> group;

/* Runs a group's calls in call order: receives and sends posted, the
 * collectives run, then every receive and send completed. */
static void run_group(const std::vector<Call> &calls)
{
    std::vector<MPI_Request> reqs;
    std::vector<const P2p *> posted;
    for (const Call &k : calls) {
        ncclComm *m = k.coll ? k.c.comm : k.p.comm;
        if (m->aborted)
            continue;
        if (k.coll) {
            run_coll(k.c);
            continue;
        }
        const P2p &p = k.p;
        MPI_Request q;
        if (p.send)
            MPI_OK("ncclSend", MPI_Isend(p.buf, (int)p.bytes, MPI_BYTE, p.peer, p.tag, m->mpi, &q));
        else
            MPI_OK("ncclRecv", MPI_Irecv(p.buf, (int)p.bytes, MPI_BYTE, p.peer, p.tag, m->mpi, &q));
        reqs.push_back(q);
        posted.push_back(&p);
    }
    for (size_t i = 0; i < reqs.size(); i++) {
        const P2p &p = *posted[i];
        const char *call = p.send ? "ncclSend" : "ncclRecv";
        MPI_Status st;
        int e = MPI_Wait(&reqs[i], &st);
        if (e != MPI_SUCCESS && !p.send)
            sim_fail("ncclRecv of %zu bytes from rank %d: the matching ncclSend sent more, or the "
                     "receive failed (MPI error %d)",
                     p.bytes, p.peer, e);
        mpi_check(e, call, "MPI_Wait");
        int got = 0;
        if (!p.send && (MPI_Get_count(&st, MPI_BYTE, &got) != MPI_SUCCESS || (size_t)got != p.bytes))
            sim_fail("ncclRecv of %zu bytes from rank %d: the matching ncclSend sent %d", p.bytes,
                     p.peer, got);
    }
}

/* FSD_CUDASIM_NCCL_HANG=K: on rank FSD_CUDASIM_NCCL_HANG_RANK (default 0),
 * the communicator's collective number K (from 0) never completes, as if
 * another rank never joined it, so a test can check that the backend's host
 * waits end the run after FSD_NCCL_TIMEOUT instead of hanging. */
static bool hung(const std::vector<Call> &calls)
{
    const char *k = getenv("FSD_CUDASIM_NCCL_HANG"), *at = getenv("FSD_CUDASIM_NCCL_HANG_RANK");
    if (!k || !*k)
        return false;
    for (const Call &c : calls)
        if (c.coll && c.c.comm->rank == (at && *at ? atoi(at) : 0) &&
            c.c.seq == strtoull(k, NULL, 10))
            return true;
    return false;
}

/* Queues a group's calls (or one call alone) as one op on their stream. */
static void queue_calls(std::vector<Call> calls)
{
    if (calls.empty())
        return;
    const cudaStream_t s = calls[0].stream;
    std::set<ncclComm *> comms;
    int self = 0;   /* sends to this rank itself, less receives from it */
    for (const Call &k : calls) {
        if (k.stream != s)
            sim_fail("ncclGroupEnd: the group's calls use different streams: NCCL allows it, "
                     "cudasim does not");
        ncclComm *m = k.coll ? k.c.comm : k.p.comm;
        comms.insert(m);
        if (!k.coll && k.p.peer == m->rank)
            self += k.p.send ? 1 : -1;
    }
    if (self != 0)
        sim_fail("%s: %d more sends to this rank itself than receives from it in the group: a "
                 "send to oneself needs its receive in the same group, or it hangs",
                 calls.size() > 1 ? "ncclGroupEnd" : calls[0].p.send ? "ncclSend" : "ncclRecv",
                 self);
    for (ncclComm *m : comms)
        m->queued++;
    const char *what = calls.size() > 1 ? "an NCCL group"
                       : calls[0].coll  ? kind_names[calls[0].c.kind]
                       : calls[0].p.send ? "ncclSend"
                                         : "ncclRecv";
    sim_need_after_compute(s, what);   /* cuda_comm.c fences every collective */
    const bool hangs = hung(calls);
    sim_enqueue_until(s, what, [calls, comms, hangs]() {
        bool aborted = false;
        for (ncclComm *m : comms)
            aborted |= m->aborted;
        if (hangs && !aborted)
            return false;   /* never joined: the stream stops here, until an abort */
        run_group(calls);
        for (ncclComm *m : comms)
            m->queued--;
        return true;
    });
}

static void issue(const Call &k)
{
    if (group_depth > 0)
        group.push_back(k);
    else
        queue_calls({k});
}

static ncclResult_t issue_coll(Kind kind, const void *send, void *recv, size_t count,
                               ncclDataType_t type, ncclRedOp_t op, int root, ncclComm *m,
                               cudaStream_t stream)
{
    Call k = {};
    k.coll = true;
    k.c = Coll{kind, m, (const char *)send, (char *)recv, count, type, op, root, m->colls++};
    k.stream = stream;
    issue(k);
    return ncclSuccess;
}

/* ── the API ── */

extern "C" {

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;   /* NCCL keeps one text per process too */
    return last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id)
        sim_fail("ncclGetUniqueId: a null id");
    std::random_device rd;
    for (size_t i = 0; i < sizeof id->internal; i += 4) {
        uint32_t v = rd();
        memcpy(id->internal + i, &v, 4);
    }
    id->internal[0] |= 1;   /* never all zeros: that is the id nobody made */
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    const char *call = "ncclCommInitRank";
    if (!comm)
        sim_fail("%s: a null ncclComm_t pointer", call);
    if (group_depth > 0)
        sim_fail("%s inside a group: NCCL allows it, cudasim does not", call);
    if (nranks < 1 || rank < 0 || rank >= nranks)
        sim_fail("%s: rank %d of %d ranks", call, rank, nranks);
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (down)
        sim_fail("%s: MPI is already finalized", call);
    if (!up) {
        int provided = 0;
        MPI_OK(call, MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided));
        started_mpi = true;
        atexit(finalize_mpi);
    }
    int world = 0, me = 0;
    MPI_OK(call, MPI_Comm_size(MPI_COMM_WORLD, &world));
    MPI_OK(call, MPI_Comm_rank(MPI_COMM_WORLD, &me));
    if (nranks != world || rank != me)
        sim_fail("%s: called as rank %d of %d, but MPI runs this process as rank %d of %d: the "
                 "bootstrap handed NCCL the wrong rank or world",
                 call, rank, nranks, me, world);
    static const char zeros[NCCL_UNIQUE_ID_BYTES] = {0};
    if (!memcmp(id.internal, zeros, sizeof zeros))
        sim_fail("%s: the id is all zeros: no ncclGetUniqueId made it (did it reach this rank?)",
                 call);
    std::vector<char> ids((size_t)world * NCCL_UNIQUE_ID_BYTES);
    MPI_OK(call, MPI_Allgather(id.internal, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, ids.data(),
                               NCCL_UNIQUE_ID_BYTES, MPI_BYTE, MPI_COMM_WORLD));
    for (int r = 0; r < world; r++)
        if (memcmp(&ids[(size_t)r * NCCL_UNIQUE_ID_BYTES], id.internal, NCCL_UNIQUE_ID_BYTES))
            sim_fail("%s: rank %d passed a different id from this rank's: the ranks would wait "
                     "for each other forever",
                     call, r);
    ncclComm *m = new ncclComm();
    m->rank = rank;
    m->nranks = nranks;
    m->sends.assign((size_t)nranks, 0);
    m->recvs.assign((size_t)nranks, 0);
    MPI_OK(call, MPI_Comm_dup(MPI_COMM_WORLD, &m->mpi));
    MPI_OK(call, MPI_Comm_set_errhandler(m->mpi, MPI_ERRORS_RETURN));
    void *ub = NULL;
    int found = 0;
    if (MPI_Comm_get_attr(m->mpi, MPI_TAG_UB, &ub, &found) == MPI_SUCCESS && found)
        tag_ub = *(int *)ub;
    live.insert(m);
    *comm = m;
    return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                           ncclConfig_t *config)
{
    const char *call = "ncclCommSplit";
    ncclComm *m = need_comm(call, comm);
    if (!newcomm)
        sim_fail("%s: a null ncclComm_t pointer", call);
    if (config)
        sim_fail("%s: a config: cudasim takes NULL (the runtime passes none)", call);
    if (group_depth > 0)
        sim_fail("%s inside a group: NCCL allows it, cudasim does not", call);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        sim_fail("%s: color %d is negative and not NCCL_SPLIT_NOCOLOR", call, color);
    /* collective over the parent, as NCCL's: every rank must call it */
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_OK(call, MPI_Comm_split(m->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key,
                                &sub));
    if (sub == MPI_COMM_NULL) {
        *newcomm = NULL;
        return ncclSuccess;
    }
    ncclComm *n = new ncclComm();
    MPI_OK(call, MPI_Comm_rank(sub, &n->rank));
    MPI_OK(call, MPI_Comm_size(sub, &n->nranks));
    n->sends.assign((size_t)n->nranks, 0);
    n->recvs.assign((size_t)n->nranks, 0);
    n->mpi = sub;
    MPI_OK(call, MPI_Comm_set_errhandler(n->mpi, MPI_ERRORS_RETURN));
    live.insert(n);
    *newcomm = n;
    return ncclSuccess;
}

/* Nothing of the communicator may still be queued: the caller frees its
 * buffers next (cuda_boot.c's bk_stop already has), and the ops would never
 * run. */
static void need_idle(const char *call, ncclComm *m)
{
    for (const Call &k : group)
        if ((k.coll ? k.c.comm : k.p.comm) == m)
            sim_fail("%s: a group with calls on the communicator is still open (no ncclGroupEnd)",
                     call);
    if (m->queued)
        sim_fail("%s: %ld of the communicator's ops are still queued on their streams: wait for "
                 "them first",
                 call, m->queued);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    ncclComm *m = need_comm("ncclCommFinalize", comm);
    need_idle("ncclCommFinalize", m);
    m->finalized = true;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    const char *call = "ncclCommDestroy";
    if (!comm || !live.count(comm))
        sim_fail("%s: communicator %p is not live (never made, destroyed or aborted)", call,
                 (void *)comm);
    need_idle(call, comm);
    int down = 0;
    MPI_Finalized(&down);
    if (!down)
        MPI_OK(call, MPI_Comm_free(&comm->mpi));
    live.erase(comm);
    delete comm;
    return ncclSuccess;
}

/* Local and at once, as an abort must be: the MPI communicator is left
 * (freeing it could wait on the other ranks) and the struct too, since
 * ops queued on streams still point at it; they do nothing when run. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;   /* NCCL accepts a null communicator here */
    if (!live.count(comm))
        sim_fail("ncclCommAbort: communicator %p is not live (never made, destroyed or aborted)",
                 (void *)comm);
    comm->aborted = true;
    live.erase(comm);
    any_aborted = true;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    need_comm("ncclCommGetAsyncError", comm);
    if (!asyncError)
        sim_fail("ncclCommGetAsyncError: a null asyncError");
    const char *v = getenv("FSD_CUDASIM_NCCL_ASYNC_ERROR");
    if (v && !strcmp(v, "1")) {
        last_error = "cudasim: a simulated asynchronous NCCL failure (FSD_CUDASIM_NCCL_ASYNC_ERROR=1)";
        *asyncError = ncclSystemError;
    } else
        *asyncError = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    const char *call = "ncclAllGather";
    ncclComm *m = need_comm(call, comm);
    size_t esz = type_bytes(call, datatype);
    need_buffer(call, "sendbuff", sendbuff, sendcount, datatype);
    if (sendcount > (size_t)INT_MAX / esz / (size_t)m->nranks)
        sim_fail("%s: recvbuff of %d x %zu elements: over INT_MAX bytes, more than cudasim's MPI "
                 "calls move", call, m->nranks, sendcount);
    need_buffer(call, "recvbuff", recvbuff, sendcount * (size_t)m->nranks, datatype);
    const size_t bytes = sendcount * esz;
    const char *in_place = (const char *)recvbuff + (size_t)m->rank * bytes;
    if (sendbuff != in_place && overlap(sendbuff, bytes, recvbuff, bytes * (size_t)m->nranks))
        sim_fail("%s: sendbuff overlaps recvbuff at recvbuff + %td bytes; in place it must be "
                 "recvbuff + rank x sendcount elements = recvbuff + %zu bytes",
                 call, (const char *)sendbuff - (const char *)recvbuff, (size_t)m->rank * bytes);
    return issue_coll(ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, m, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    const char *call = "ncclReduceScatter";
    ncclComm *m = need_comm(call, comm);
    size_t esz = type_bytes(call, datatype);
    need_op(call, op);
    need_buffer(call, "recvbuff", recvbuff, recvcount, datatype);
    if (recvcount > (size_t)INT_MAX / esz / (size_t)m->nranks)
        sim_fail("%s: sendbuff of %d x %zu elements: over INT_MAX bytes, more than cudasim's MPI "
                 "calls move", call, m->nranks, recvcount);
    need_buffer(call, "sendbuff", sendbuff, recvcount * (size_t)m->nranks, datatype);
    const size_t bytes = recvcount * esz;
    const char *in_place = (const char *)sendbuff + (size_t)m->rank * bytes;
    if (recvbuff != in_place && overlap(sendbuff, bytes * (size_t)m->nranks, recvbuff, bytes))
        sim_fail("%s: recvbuff overlaps sendbuff at sendbuff + %td bytes; in place it must be "
                 "sendbuff + rank x recvcount elements = sendbuff + %zu bytes",
                 call, (const char *)recvbuff - (const char *)sendbuff, (size_t)m->rank * bytes);
    return issue_coll(REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, m, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    const char *call = "ncclAllReduce";
    ncclComm *m = need_comm(call, comm);
    size_t esz = type_bytes(call, datatype);
    need_op(call, op);
    need_buffer(call, "sendbuff", sendbuff, count, datatype);
    need_buffer(call, "recvbuff", recvbuff, count, datatype);
    if (sendbuff != recvbuff && overlap(sendbuff, count * esz, recvbuff, count * esz))
        sim_fail("%s: sendbuff and recvbuff overlap without being the same (in place)", call);
    return issue_coll(ALL_REDUCE, sendbuff, recvbuff, count, datatype, op, 0, m, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    const char *call = "ncclBroadcast";
    ncclComm *m = need_comm(call, comm);
    size_t esz = type_bytes(call, datatype);
    if (root < 0 || root >= m->nranks)
        sim_fail("%s: root %d of %d ranks", call, root, m->nranks);
    need_buffer(call, "recvbuff", recvbuff, count, datatype);
    if (m->rank == root) {   /* the others' sendbuff is not read */
        need_buffer(call, "sendbuff", sendbuff, count, datatype);
        if (sendbuff != recvbuff && overlap(sendbuff, count * esz, recvbuff, count * esz))
            sim_fail("%s: sendbuff and recvbuff overlap without being the same (in place)", call);
    }
    return issue_coll(BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, m, stream);
}

static ncclResult_t issue_p2p(bool send, const void *buf, size_t count, ncclDataType_t datatype,
                              int peer, ncclComm_t comm, cudaStream_t stream)
{
    const char *call = send ? "ncclSend" : "ncclRecv";
    ncclComm *m = need_comm(call, comm);
    if (peer < 0 || peer >= m->nranks)
        sim_fail("%s: peer %d of %d ranks", call, peer, m->nranks);
    need_buffer(call, send ? "sendbuff" : "recvbuff", buf, count, datatype);
    uint64_t &n = (send ? m->sends : m->recvs)[(size_t)peer];
    Call k = {};
    k.p = P2p{send, m, (char *)buf, count * type_bytes(call, datatype), peer,
              (int)(n++ % ((uint64_t)tag_ub + 1))};
    k.stream = stream;
    issue(k);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return issue_p2p(true, sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream)
{
    return issue_p2p(false, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        sim_fail("ncclGroupEnd without ncclGroupStart");
    if (--group_depth == 0) {
        std::vector<Call> calls;
        calls.swap(group);
        queue_calls(std::move(calls));
    }
    return ncclSuccess;
}

}   /* extern "C" */
