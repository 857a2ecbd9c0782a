/*
 * cuda_step.c — what the CUDA backend does for the step besides
 * collectives and products: the micro-batch's tokens copied in, the
 * device's share of the loss, the trace's clock (marks on the streams that
 * run each slice), and the update at the step's end, whose one host wait is
 * the step's only one.
 */
#include "cuda_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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
            cuda_stream_wait_host(r, ss[i], "starting the trace");
    CUDA_CHECK(r, cudaEventCreate(&bk->trace_ref));
    CUDA_CHECK(r, cudaEventRecord(bk->trace_ref, bk->compute));
    CUDA_CHECK(r, cudaEventSynchronize(bk->trace_ref));
    bk->trace_ref_us = (rt_now() - r->t0) * 1e6;
}

/* A timed event recorded on stream s: its index, or -1 with no trace */
int cuda_mark_on(FsdRun *r, cudaStream_t s)
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

int bk_trace_mark(FsdRun *r) { return cuda_mark_on(r, r->bk->compute); }

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
    cuda_host_wait(r, bk->stats_ev, "the step");
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
        cuda_allreduce_small(r, v, 2, ncclFloat64, sizeof *v, ncclSum);
    }
    optim_step(r, lr, update_coef(r->cfg.grad_clip, v[0], v[1]), t);
    /* the masters changed: an all-gather before the next step (an
     * evaluation's, eval.c) must stage them again, not reuse this step's */
    for (int g = 0; g < r->m->ngroups; g++)
        bk->gc[g].staged_step = -1;
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
    /* Σ g² and the loss, all-reduced, then the clip coefficient (or
     * UPDATE_SKIP for a non-finite step): on the device, so the optimizer
     * is queued behind them without a wait */
    int at = 0;
    for (int g = 0; g < r->m->ngroups; g++) {
        const Group *G = &r->groups[g];
        CUDA_CHECK(r, cu_sumsq_partial(G->grad, G->shard, bk->d_partials + at, s));
        at += cu_sumsq_blocks(G->shard);
    }
    /* HSDP: only replica 0's Σ g² counts (optim.c's optim_grad_sumsq) */
    CUDA_CHECK(r, cu_sumsq_finish(bk->d_stats, bk->d_partials, r->replica > 0 ? 0 : at,
                                  bk->d_stats + 3, r->loss_sum, s));
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
    cuda_host_wait(r, bk->stats_ev, "the step");
    v[0] = bk->h_stats[0];
    v[1] = bk->h_stats[1];
}

