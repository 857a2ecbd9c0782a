/*
 * cuda_mem.c — the CUDA backend's memory: counted device buffers, the pool
 * of unsharded buffers that bk_ready sizes at start-up, `offload = cpu`'s
 * pinned host shards, and copies between backend memory and the host
 * outside a step.
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
 * Offload (`offload = cpu`): shards and optimizer state are pinned host
 * memory, copied in before each all-gather and out after each
 * reduce-scatter on streams of their own, and the update runs on the host
 * (optim.c) after the step's one planned host wait; see the offload
 * section below.
 */
#include "cuda_internal.h"

#include <stdlib.h>
#include <string.h>

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
            cuda_failed(r, __FILE__, __LINE__, "realloc", "out of memory");
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
    bk->pool_bytes += bytes > 0 ? bytes : FSDRT_ARENA_ALIGN;
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
        cuda_failed(r, __FILE__, __LINE__, "calloc", "out of memory");
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
            case FSD_BUF_REDUCE:
            case FSD_BUF_WAIT_REDUCE:
                break;   /* the reduce buffer is one, allocated in bk_ready */
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
    else
        r->bk->own_bytes += bytes > 0 ? bytes : FSDRT_ARENA_ALIGN;
    return p;
}

/* The largest padded size at world W among the groups that gather
 * (by_reduce false) or reduce (true) in a 16-bit dtype (fp32 false) or in
 * fp32 (true), from the model's flat sizes (bk_counted_extra needs it
 * before the groups are sized): the wire and reduce buffers one direction
 * shares are sized for the groups that use them, as each group has its own
 * dtypes (FsdGroupInfo); 0 when no group does. */
static int64_t largest_padded_in(const FsdRun *r, int64_t W, bool by_reduce, bool fp32)
{
    int64_t most = 0;
    W = shard_world_of(r, W);   /* HSDP: padded per shard group */
    for (int g = 0; g < r->m->ngroups; g++) {
        const FsdDtype dt = by_reduce ? group_reduce_dtype(r, g) : group_param_dtype(r, g);
        const int64_t padded = (r->m->groups[g].flat_numel + W - 1) / W * W;
        if ((dt == FSD_FP32) == fp32 && padded > most)
            most = padded;
    }
    return most;
}

/* Whether offload keeps a device accumulator per group (offload_start). */
static bool offload_accumulates(const FsdRun *r)
{
    return r->m->offload_cpu && (r->cfg.grad_accum > 1 || act_bf16(r));
}

int64_t bk_counted_extra(FsdRun *r, int64_t world)
{
    const FsdModel *m = r->m;
    int64_t extra = 0;
    if (!act_bf16(r)) {
        extra += 2 * largest_padded_in(r, world, false, false);   /* wire_ag */
        extra += 2 * largest_padded_in(r, world, true, false);    /* wire_rs */
    }
    if (offload_accumulates(r))
        for (int g = 0; g < m->ngroups; g++)
            extra += (m->groups[g].flat_numel + world - 1) / world * (int64_t)sizeof(real);
    return extra;
}

bool bk_memory(FsdRun *r, BkMemory *d)
{
    Backend *bk = r->bk;
    size_t free_now = 0, total = 0;
    if (cudaMemGetInfo(&free_now, &total) != cudaSuccess) {
        cudaGetLastError();
        free_now = total = 0;
    }
    *d = (BkMemory){.device = bk->device,
                    .total = (int64_t)bk->mem_total,
                    .used_at_start = (int64_t)(bk->mem_total - bk->mem_free_at_start),
                    .used_now = (int64_t)(total - free_now),
                    .pools = bk->pool_bytes,
                    .workspace = BLAS_WORKSPACE_BYTES};
    d->outside = bk->pool_bytes + BLAS_WORKSPACE_BYTES + bk->own_bytes;
    d->ours = r->counters.alloc_bytes + d->outside;
    size_t k = 0;
    const size_t n = sizeof d->extra_what;
    if (bk->wire_ag_bytes || bk->wire_rs_bytes)
        k += (size_t)snprintf(d->extra_what + k, n - k, "16-bit wire buffers %lld",
                              (long long)(bk->wire_ag_bytes + bk->wire_rs_bytes));
    if (bk->acc_bytes && k < n)
        k += (size_t)snprintf(d->extra_what + k, n - k, "%soffload's device accumulators %lld",
                              k ? ", " : "", (long long)bk->acc_bytes);
    if (!act_bf16(r) && largest_padded_in(r, r->world, false, false) && k < n)
        k += (size_t)snprintf(d->extra_what + k, n - k,
                              "%sunsharded parameters in fp32, gathered in 16 bits", k ? ", " : "");
    if (!act_bf16(r) && largest_padded_in(r, r->world, true, false) && k < n)
        k += (size_t)snprintf(d->extra_what + k, n - k,
                              "%sunsharded gradients in fp32, reduced in 16 bits", k ? ", " : "");
    if (!k)
        snprintf(d->extra_what, n, "none");
    return true;
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
 *   done, so no copy in flight ever reads what the host rewrites (the
 *   update clears the mark, so an evaluation after it, eval.c, stages the
 *   new masters; its loss reads wait for its copies before the next step's);
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
        if (offload_accumulates(r)) {
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
void cuda_offload_stop(FsdRun *r)
{
    Backend *bk = r->bk;
    if (!bk->offload)
        return;
    if (bk->h2d)
        cuda_stream_wait_host(r, bk->h2d, "shutting down");
    if (bk->d2h)
        cuda_stream_wait_host(r, bk->d2h, "shutting down");
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
    const int64_t gather16 = largest_padded_in(r, r->world, false, false),
                  reduce16 = largest_padded_in(r, r->world, true, false),
                  reduce32 = largest_padded_in(r, r->world, true, true);
    if (act_bf16(r)) {
        if (reduce32)
            bk->reduce32 = device(r, 4 * reduce32, false);
    } else if (gather16) {
        bk->wire_ag_bytes = 2 * gather16;
        bk->wire_ag = device(r, bk->wire_ag_bytes, true);
    }
    if (!act_bf16(r) && reduce16) {
        bk->wire_rs_bytes = 2 * reduce16;
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
    cuda_stream_wait_host(r, bk->compute, "start-up");
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
    cuda_stream_wait_host(r, r->bk->compute, "a copy to the host");
}

void bk_from_host(FsdRun *r, void *dst, const void *src, int64_t bytes)
{
    if (bytes <= 0 || host_copy(r, dst, src, bytes))
        return;
    CUDA_CHECK(r, cudaMemcpyAsync(dst, src, (size_t)bytes, cudaMemcpyDefault, r->bk->compute));
    cuda_stream_wait_host(r, r->bk->compute, "a copy from the host");
}

