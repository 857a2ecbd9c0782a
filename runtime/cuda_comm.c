/*
 * cuda_comm.c — the CUDA backend's collectives: the small ones outside
 * steps (agreement, barriers, gathers for checkpoints and the trace), and
 * the step's all-gathers and reduce-scatters, each on its own stream,
 * ordered against compute by events.
 *
 * Streams. Kernels and cuBLASLt products run on the compute stream
 * (fsdrt_cuda_stream, which the emitted program's launchers use as
 * FSD_STREAM); all-gathers on the gather stream, reduce-scatters on the reduce stream. They are ordered
 * by events only: a collective is issued after its stream waits on an event
 * recorded on the compute stream (so it sees every gradient written and
 * every update of the master shards), and fsdrt_wait_* make the compute
 * stream wait on the event recorded after it. Nothing in a step waits on
 * the host; the one host wait per step is in bk_update, after the optimizer
 * is queued, for the loss and norm of the log line. tests/cuda/no_host_sync.py
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
 */
#include "cuda_internal.h"
#include "half.h"

#include <stdlib.h>
#include <string.h>

/* Orders collective stream `comm` after everything queued on the compute
 * stream so far (FSDP2's all-gather stream waits on the current stream the
 * same way). */
static void fence(FsdRun *r, cudaStream_t comm)
{
    CUDA_CHECK(r, cudaEventRecord(r->bk->fence, r->bk->compute));
    CUDA_CHECK(r, cudaStreamWaitEvent(comm, r->bk->fence, 0));
}

/* ── small collectives, over NCCL on the compute stream (outside steps) ── */

/* v[0, n) of `size`-byte elements, reduced with op across ranks in place. */
void cuda_allreduce_small(FsdRun *r, void *v, int64_t n, ncclDataType_t type, int64_t size,
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
        cuda_stream_wait_host(r, bk->compute, "a small all-reduce");
        memcpy(h, bk->h_small, (size_t)(k * size));
    }
}

bool bk_agree(FsdRun *r)
{
    Backend *bk = r->bk;
    int first = r->err[0] ? r->rank : r->world;
    cuda_allreduce_small(r, &first, 1, ncclInt32, sizeof first, ncclMin);
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
    cuda_stream_wait_host(r, bk->compute, "agreeing on an error");
    memcpy(r->err, bk->h_small, ERR_MAX);
    r->err[ERR_MAX - 1] = 0;
    return true;
}

void bk_barrier(FsdRun *r)
{
    int v = 0;
    cuda_allreduce_small(r, &v, 1, ncclInt32, sizeof v, ncclSum);
}

void bk_allreduce_sum(FsdRun *r, double *v, int n)
{
    cuda_allreduce_small(r, v, n, ncclFloat64, sizeof *v, ncclSum);
}

void bk_gather_shards(FsdRun *r, int g, real *dst)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    if (r->replica > 0)   /* replica 0's shard group holds the same shards */
        return;
    const int64_t bytes = G->padded * (int64_t)sizeof(real);
    /* its own allocation, not the pool's: outside the step, and with bf16
     * act twice the size of the pool's parameter buffers, which it would
     * otherwise join for good */
    real *all = bk_alloc(r, bytes);
    if (!all)   /* the other ranks are in the all-gather: end them too */
        cuda_failed(r, __FILE__, __LINE__, "cudaMalloc", "out of GPU memory gathering a group's shards");
    const real *mine = G->master;
    if (bk->offload) {   /* a host shard: gathered from its slice, in place */
        CUDA_CHECK(r, cudaMemcpyAsync(all + G->lo, G->master, (size_t)G->shard * sizeof(real),
                                      cudaMemcpyHostToDevice, bk->compute));
        mine = all + G->lo;
    }
    NCCL_CHECK(r, ncclAllGather(mine, all, (size_t)G->shard, ncclFloat32, bk->shard,
                                bk->compute));
    if (r->rank == 0)
        CUDA_CHECK(r, cudaMemcpyAsync(dst, all, (size_t)bytes, cudaMemcpyDeviceToHost, bk->compute));
    cuda_stream_wait_host(r, bk->compute, "gathering a group's shards");
    bk_free(r, all, bytes);
}

bool bk_gather_bytes(FsdRun *r, const char *buf, int64_t n, char **out, int64_t *outn)
{
    Backend *bk = r->bk;
    *out = NULL;
    *outn = 0;
    int64_t *len = calloc((size_t)r->world, sizeof *len);
    int ok = len != NULL;
    cuda_allreduce_small(r, &ok, 1, ncclInt32, sizeof ok, ncclMin);
    if (!ok) {
        free(len);
        return false;
    }
    len[r->rank] = n;
    cuda_allreduce_small(r, len, r->world, ncclInt64, sizeof *len, ncclSum);
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
    cuda_allreduce_small(r, &ok, 1, ncclInt32, sizeof ok, ncclMin);
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
        cuda_stream_wait_host(r, bk->compute, "gathering the trace");
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
 * its part of h_act, at its first all-gather of a step (cuda_mem.c's offload
 * section says why that is the one time it may be written). */
static void stage_bf16(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    GroupComm *c = &bk->gc[g];
    const Group *G = &r->groups[g];
    if (c->staged_step == r->step)
        return;
    const float *master = G->master;
    uint16_t *staged = bk->h_act + c->h_act_at;
#pragma omp parallel for schedule(static) if (G->shard >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < G->shard; i++)
        staged[i] = bf16_from_float(master[i]);
    c->staged_step = r->step;
}

void bk_all_gather(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    GroupComm *c = &bk->gc[g];
    const FsdDtype dt = group_param_dtype(r, g);
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
        c->traced_gather[0] = cuda_mark_on(r, bk->gather);
        shard32 = own;
    } else {
        fence(r, bk->gather);
        c->traced_gather[0] = cuda_mark_on(r, bk->gather);
        if (bf16_act)
            CUDA_CHECK(r, cu_narrow(own, G->master, G->shard, 1, bk->gather));
        else if (dt == FSD_FP32)
            CUDA_CHECK(r, cudaMemcpyAsync(own, G->master, (size_t)G->shard * sizeof(real),
                                          cudaMemcpyDeviceToDevice, bk->gather));
    }
    if (bf16_act || dt == FSD_FP32) {   /* in place: the buffer holds what is gathered */
        NCCL_CHECK(r, ncclAllGather(own, G->params, (size_t)G->shard,
                                    bf16_act ? ncclBfloat16 : ncclFloat32, bk->shard, bk->gather));
    } else {
        const int bf16 = dt == FSD_BF16;
        CUDA_CHECK(r, cu_narrow(bk->wire_ag + G->lo, shard32, G->shard, bf16, bk->gather));
        NCCL_CHECK(r, ncclAllGather(bk->wire_ag + G->lo, bk->wire_ag, (size_t)G->shard,
                                    wire_type(dt), bk->shard, bk->gather));
        CUDA_CHECK(r, cu_widen(G->params, bk->wire_ag, G->padded, bf16, bk->gather));
    }
    CUDA_CHECK(r, cudaEventRecord(c->gathered, bk->gather));
    c->traced_gather[1] = cuda_mark_on(r, bk->gather);
}

void bk_wait_gather(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    GroupComm *c = &bk->gc[g];
    CUDA_CHECK(r, cudaStreamWaitEvent(bk->compute, c->gathered, 0));
}

/* ── partial resharding ──
 * The copy is the gathered buffer's own values, so the gather from it
 * rebuilds exactly what the all-gather from the shards made. It is act:
 * with fp32 act and a 16-bit gather dtype the wire carries fp32, twice
 * what the counters (the plan's bytes) say (docs/design.md#partial-resharding). */

void bk_keep_partial(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    const int64_t n = G->padded / G->part_ranks;
    /* on the compute stream, after the last forward read of the buffer */
    CUDA_CHECK(r, cudaMemcpyAsync(G->kept, (char *)G->params + G->part_lo * act_bytes(r),
                                  (size_t)(n * act_bytes(r)), cudaMemcpyDeviceToDevice,
                                  bk->compute));
}

void bk_gather_partial(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    GroupComm *c = &bk->gc[g];
    /* after the copy and after compute's last use of the pool buffer */
    fence(r, bk->gather);
    c->traced_gather[0] = cuda_mark_on(r, bk->gather);
    NCCL_CHECK(r, ncclAllGather(G->kept, G->params, (size_t)(G->padded / G->part_ranks),
                                act_bf16(r) ? ncclBfloat16 : ncclFloat32, bk->partial[G->part],
                                bk->gather));
    CUDA_CHECK(r, cudaEventRecord(c->gathered, bk->gather));
    c->traced_gather[1] = cuda_mark_on(r, bk->gather);
}

/* ── gradients: reduce-scatter ── */

void bk_alloc_grads(FsdRun *r, int g)
{
    Group *G = &r->groups[g];
    CUDA_CHECK(r, cudaMemsetAsync(G->grads, 0, (size_t)unsharded_bytes(r, G), r->bk->compute));
}

/* HSDP: the reduce-scatter's averaged slice averaged again across the
 * replicas, in place, on the reduce stream behind it: the mean over all W
 * ranks, before anything adds it into a shard. */
static void replica_avg(FsdRun *r, void *slice, int64_t n, ncclDataType_t type)
{
    Backend *bk = r->bk;
    if (r->replicas > 1)
        NCCL_CHECK(r, ncclAllReduce(slice, slice, (size_t)n, type, ncclAvg, bk->replica,
                                    bk->reduce));
}

/* The replica all-reduce was queued by bk_reduce_scatter on the reduce
 * stream, between the reduce-scatter and the accumulation that must see
 * it; the wait on `reduced` covers it. Nothing is left to do here. */
void bk_all_reduce(FsdRun *r, int g) { (void)r, (void)g; }

void bk_reduce_scatter(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    Group *G = &r->groups[g];
    GroupComm *c = &bk->gc[g];
    const FsdDtype dt = group_reduce_dtype(r, g);
    /* where the averaged slice is added: the grad shard, or with offload the
     * device accumulator (NULL with grad_accum 1 and fp32 act: the slice is
     * copied out as it is, from the unsharded gradient buffer) */
    float *sum = bk->offload ? c->acc : G->grad;
    const bool copy_out = bk->offload && ++c->reduces == r->cfg.grad_accum;
    fence(r, bk->reduce);
    c->traced_reduce[0] = cuda_mark_on(r, bk->reduce);
    if (act_bf16(r)) {
        uint16_t *grads = G->grads;
        if (dt == FSD_FP32) {   /* widened into the fp32 reduce buffer, reduced there */
            CUDA_CHECK(r, cu_widen(bk->reduce32, grads, G->padded, 1, bk->reduce));
            NCCL_CHECK(r, ncclReduceScatter(bk->reduce32, bk->reduce32 + G->lo, (size_t)G->shard,
                                            ncclFloat32, ncclAvg, bk->shard, bk->reduce));
            replica_avg(r, bk->reduce32 + G->lo, G->shard, ncclFloat32);
            CUDA_CHECK(r, cu_accum(sum, bk->reduce32 + G->lo, G->shard, bk->reduce));
        } else {
            NCCL_CHECK(r, ncclReduceScatter(grads, grads + G->lo, (size_t)G->shard, ncclBfloat16,
                                            ncclAvg, bk->shard, bk->reduce));
            replica_avg(r, grads + G->lo, G->shard, ncclBfloat16);
            CUDA_CHECK(r, cu_accum_widen(sum, grads + G->lo, G->shard, 1, bk->reduce));
        }
    } else if (dt == FSD_FP32) {
        float *grads = G->grads;
        NCCL_CHECK(r, ncclReduceScatter(grads, grads + G->lo, (size_t)G->shard, ncclFloat32,
                                        ncclAvg, bk->shard, bk->reduce));
        replica_avg(r, grads + G->lo, G->shard, ncclFloat32);
        if (sum)
            CUDA_CHECK(r, cu_accum(sum, grads + G->lo, G->shard, bk->reduce));
    } else {
        float *grads = G->grads;
        const int bf16 = dt == FSD_BF16;
        CUDA_CHECK(r, cu_narrow(bk->wire_rs, grads, G->padded, bf16, bk->reduce));
        NCCL_CHECK(r, ncclReduceScatter(bk->wire_rs, bk->wire_rs + G->lo, (size_t)G->shard,
                                        wire_type(dt), ncclAvg, bk->shard, bk->reduce));
        replica_avg(r, bk->wire_rs + G->lo, G->shard, wire_type(dt));
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
        c->traced_reduce[1] = cuda_mark_on(r, bk->d2h);
    } else {
        CUDA_CHECK(r, cudaEventRecord(c->reduced, bk->reduce));
        c->traced_reduce[1] = cuda_mark_on(r, bk->reduce);
    }
}

void bk_wait_reduce(FsdRun *r, int g)
{
    Backend *bk = r->bk;
    GroupComm *c = &bk->gc[g];
    CUDA_CHECK(r, cudaStreamWaitEvent(bk->compute, c->reduced, 0));
}

