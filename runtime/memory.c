/*
 * memory.c — the memory plan's peak for the run that starts: the world it
 * runs at, its micro-batch and its grad_accum, whatever fsdpc planned for
 * (docs/runtime.md#memory-at-start-up).
 *
 * fsdpc plans memory at its `--world`, but a trainer runs at any world
 * size: shards are sized at start-up, so is every unsharded buffer, and the
 * arena is placed for the micro-batch the flags give. The peak is the
 * memory plan's (docs/design.md#memory-plan), computed again here from the
 * program's own tables:
 *
 *   resident   Σ_g shard_g(W) × bytes(real) × (2 + optimizer states), the
 *              master, gradient and optimizer-state shards (none with
 *              `offload = cpu`), shard_g(W) = ⌈flat_g / W⌉;
 *   unsharded  the most unsharded bytes the step holds at once: the
 *              model's buffer events (buf_one, or buf_three's first, middle
 *              and last micro-batches as grad_accum arranges them) replayed
 *              with padded_g(W) = W × shard_g(W) elements a buffer, at the
 *              sizes common.c counts (parameters in the group's param
 *              dtype, gradients in grads_dtype, the fp32 reduce buffer from a
 *              reduce-scatter to its wait);
 *   arena      the activation arena placed for this micro-batch
 *              (fsdrt_place_arena, as allocate places it).
 *
 * Their sum is what the counters reach (mem_peak_bytes) on the CPU build,
 * exactly; tests/e2e holds them equal at worlds 1 to 4. The constants are
 * the emitted program's: flat sizes, arena tensors, buffer events, and the
 * world, peak and memory_budget fsdpc fitted the plan at. With a budget a
 * run whose peak at its own world exceeds it is refused before anything is
 * allocated, with the numbers and what would fit. This file computes and
 * reports; common.c decides when (fsdrt_init).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }

/* fp32 states the optimizer keeps per parameter (2 AdamW, 1 SGD momentum). */
static int optim_states(const FsdRun *r)
{
    return r->cfg.optimizer == FSD_ADAMW ? 2 : r->cfg.momentum != 0 ? 1 : 0;
}

/* The activation arena at micro-batch B: the same bytes allocate places,
 * the same placement; -1 when out of memory. */
int64_t mem_arena_bytes(const FsdRun *r, int64_t B)
{
    const FsdModel *m = r->m;
    const int n = m->nacts;
    int64_t *bytes = malloc(sizeof *bytes * (size_t)(n + 1));
    int64_t *offset = malloc(sizeof *offset * (size_t)(n + 1));
    int *first = malloc(sizeof *first * (size_t)(n + 1)), *last = malloc(sizeof *last * (size_t)(n + 1));
    int64_t arena = -1;
    if (bytes && offset && first && last) {
        for (int i = 0; i < n; i++) {
            bytes[i] = act_tensor_bytes(r, i, B);
            first[i] = m->acts[i].first;
            last[i] = m->acts[i].last;
        }
        arena = fsdrt_place_arena(n, bytes, first, last, FSDRT_ARENA_ALIGN, offset);
    }
    free(bytes), free(offset), free(first), free(last);
    return arena;
}

/* Which unsharded buffers are out: replay's state between events. */
typedef struct Held {
    bool *params, *grads, *reducing;
    int64_t now, most;
} Held;

/* One micro-batch's buffer events (`which` of the table) through h, each
 * buffer at its size for padded[g] elements; `counted` sizes parameters and
 * gradients as the backend counts them (bk_unsharded_count), else by the
 * plan's dtypes. */
static void replay_micro(FsdRun *r, const FsdBufEvent *ev, int n, int which,
                         const int64_t *padded, bool counted, Held *h)
{
    for (int i = 0; i < n; i++) {
        if (ev[i].micro != which || ev[i].group < 0 || ev[i].group >= r->m->ngroups)
            continue;
        const int g = ev[i].group;
        const FsdDtype pdt = group_param_dtype(r, g), gdt = grads_dtype(r, g);
        const int64_t pb = counted ? bk_unsharded_count(r, padded[g], pdt) : padded[g] * dtype_bytes(pdt);
        const int64_t gb = counted ? bk_unsharded_count(r, padded[g], gdt) : padded[g] * dtype_bytes(gdt);
        const int64_t rb = reduce_buffer_bytes(r, g, padded[g]);
        bool *flag = NULL;
        int64_t bytes = 0;
        bool on = false;
        switch (ev[i].op) {
        case FSD_BUF_GATHER: flag = &h->params[g], bytes = pb, on = true; break;
        case FSD_BUF_RESHARD: flag = &h->params[g], bytes = pb; break;
        case FSD_BUF_ALLOC_GRADS: flag = &h->grads[g], bytes = gb, on = true; break;
        case FSD_BUF_FREE_GRADS: flag = &h->grads[g], bytes = gb; break;
        case FSD_BUF_REDUCE: flag = &h->reducing[g], bytes = rb, on = true; break;
        case FSD_BUF_WAIT_REDUCE: flag = &h->reducing[g], bytes = rb; break;
        }
        if (!flag || *flag == on)
            continue;   /* gathered again: the same buffer (common.c) */
        *flag = on;
        h->now += on ? bytes : -bytes;
        if (h->now > h->most)
            h->most = h->now;
    }
}

/* The most unsharded bytes a step of this run's grad_accum holds at once,
 * at world W. A middle micro-batch that leaves the buffers as it found
 * them would do the same again, so the replay moves on to the last. */
static int64_t most_unsharded(FsdRun *r, int64_t W, bool counted)
{
    const FsdModel *m = r->m;
    const int G = m->ngroups;
    const int64_t k = r->cfg.grad_accum;
    int64_t *padded = malloc(sizeof *padded * (size_t)(G + 1));
    bool *flags = calloc(3 * (size_t)G + 3, 1), *before = malloc(3 * (size_t)G + 3);
    if (!padded || !flags || !before) {
        free(padded), free(flags), free(before);
        return -1;
    }
    W = shard_world_of(r, W);   /* HSDP: padded per shard group */
    for (int g = 0; g < G; g++)
        padded[g] = ceil_div(m->groups[g].flat_numel, W) * W;
    Held h = {flags, flags + G + 1, flags + 2 * G + 2, 0, 0};
    if (k == 1) {
        replay_micro(r, m->buf_one, m->nbuf_one, 0, padded, counted, &h);
    } else {
        replay_micro(r, m->buf_three, m->nbuf_three, 0, padded, counted, &h);
        for (int64_t mb = 1; mb < k - 1; mb++) {
            memcpy(before, flags, 3 * (size_t)G + 3);
            replay_micro(r, m->buf_three, m->nbuf_three, 1, padded, counted, &h);
            if (memcmp(before, flags, 3 * (size_t)G + 3) == 0)
                break;
        }
        replay_micro(r, m->buf_three, m->nbuf_three, 2, padded, counted, &h);
    }
    free(padded), free(flags), free(before);
    return h.most;
}

/* Shards and optimizer state at world W: what allocate counts. */
static int64_t resident_bytes(const FsdRun *r, int64_t W)
{
    if (r->m->offload_cpu)
        return 0;
    int64_t shards = 0;
    W = shard_world_of(r, W);   /* HSDP: shards of the shard group */
    for (int g = 0; g < r->m->ngroups; g++)
        shards += ceil_div(r->m->groups[g].flat_numel, W);
    return shards * (int64_t)sizeof(real) * (2 + optim_states(r));
}

/* The plan's peak at world W with an arena of `arena` bytes; -1 when out
 * of memory. */
static int64_t plan_peak_at(FsdRun *r, int64_t W, int64_t arena)
{
    const int64_t unsharded = most_unsharded(r, W, false);
    return unsharded < 0 ? -1 : resident_bytes(r, W) + unsharded + arena;
}

/* The same with its parts, and what this backend's counters reach. */
static MemPeak peak_at(FsdRun *r, int64_t W, int64_t arena)
{
    MemPeak p = {.resident = resident_bytes(r, W),
                 .unsharded = most_unsharded(r, W, false),
                 .arena = arena,
                 .unsharded_counted = most_unsharded(r, W, true)};
    p.peak = p.resident + p.unsharded + p.arena;
    p.counted = p.resident + p.unsharded_counted + p.arena + bk_counted_extra(r, W);
    return p;
}

/* "4.21 MiB" */
static const char *size_str(char *buf, size_t n, int64_t bytes)
{
    if (bytes >= (int64_t)1 << 30)
        snprintf(buf, n, "%.2f GiB", (double)bytes / (1 << 30));
    else if (bytes >= (int64_t)1 << 20)
        snprintf(buf, n, "%.2f MiB", (double)bytes / (1 << 20));
    else
        snprintf(buf, n, "%.2f KiB", (double)bytes / (1 << 10));
    return buf;
}

/* A world larger than `from` where the plan fits the budget at this
 * micro-batch, the first found; 0 when none up to the smallest group's
 * elements (no world may exceed them) or 65536. */
static int64_t world_that_fits(FsdRun *r, int64_t from, int64_t arena, int64_t budget)
{
    int64_t most = 65536;
    for (int g = 0; g < r->m->ngroups; g++)
        if (r->m->groups[g].flat_numel < most)
            most = r->m->groups[g].flat_numel;
    if (arena > budget)
        return 0;   /* the arena alone does not fit, whatever the world */
    for (int64_t W = from + 1; W <= most; W++) {
        const int64_t peak = plan_peak_at(r, W, arena);
        if (peak >= 0 && peak <= budget)
            return W;
    }
    return 0;
}

/* The largest micro-batch below B where the plan fits at world W; 0: none. */
static int64_t batch_that_fits(FsdRun *r, int64_t W, int64_t B, int64_t budget)
{
    const int64_t state = resident_bytes(r, W) + most_unsharded(r, W, false);
    for (int64_t b = B - 1; b >= 1; b--) {
        const int64_t arena = mem_arena_bytes(r, b);
        if (arena >= 0 && state + arena <= budget)
            return b;
    }
    return 0;
}

void mem_plan_run(FsdRun *r)
{
    const FsdModel *m = r->m;
    const int64_t arena = mem_arena_bytes(r, r->cfg.micro_batch);
    if (arena < 0) {
        rt_fail(r, "out of memory placing the activation arena");
        return;
    }
    r->mem = peak_at(r, r->world, arena);
    if (r->mem.unsharded < 0 || r->mem.unsharded_counted < 0) {
        rt_fail(r, "out of memory replaying the step's buffer events");
        return;
    }
    /* the budget is the step's: --steps 0 --export runs no step; and the
     * float64 build, which checks gradients, holds every real in twice the
     * plan's bytes */
    const int64_t budget = m->memory_budget_bytes;
    if (!budget || r->mem.peak <= budget || (r->cfg.steps == 0 && !r->grad_check) ||
        sizeof(real) != sizeof(float))
        return;
    char a[32], b[32], c[32], what[320] = "";
    const int64_t W = world_that_fits(r, r->world, arena, budget);
    const int64_t B = batch_that_fits(r, r->world, r->cfg.micro_batch, budget);
    size_t k = 0;
    if (W)
        k += (size_t)snprintf(what + k, sizeof what - k,
                              "run on %lld ranks (the fewest above %d where it fits)", (long long)W,
                              r->world);
    if (B)
        k += (size_t)snprintf(what + k, sizeof what - k, "%s--micro-batch %lld%s",
                              k ? ", or with " : "run with ", (long long)B,
                              B > 1 ? " or less" : "");
    if (m->plan_world != r->world)
        k += (size_t)snprintf(what + k, sizeof what - k,
                              "%splan for this world with fsdpc --world %d (the planner then "
                              "picks a policy that fits, or says why none does)",
                              k ? ", or " : "", r->world);
    if (!k)
        snprintf(what, sizeof what, "raise memory_budget, or shard over more ranks");
    rt_fail(r,
            "at world %d each rank would peak at %lld bytes (%s: shards and optimizer state %lld, "
            "unsharded buffers at most %lld, activation arena %lld at micro-batch %lld), above "
            "this program's memory_budget of %lld bytes (%s), which fsdpc fitted at world %lld "
            "(peak %lld bytes there, %s); %s",
            r->world, (long long)r->mem.peak, size_str(a, sizeof a, r->mem.peak),
            (long long)r->mem.resident, (long long)r->mem.unsharded, (long long)r->mem.arena,
            (long long)r->cfg.micro_batch, (long long)budget, size_str(b, sizeof b, budget),
            (long long)m->plan_world, (long long)m->plan_peak_bytes,
            size_str(c, sizeof c, m->plan_peak_bytes), what);
}

void mem_report(FsdRun *r)
{
    const FsdModel *m = r->m;
    char a[32], b[32], c[32];
    printf("memory: %lld bytes per rank at world %d (%s: shards and optimizer state %lld, "
           "unsharded buffers at most %lld, activation arena %lld)",
           (long long)r->mem.peak, r->world, size_str(a, sizeof a, r->mem.peak),
           (long long)r->mem.resident, (long long)r->mem.unsharded, (long long)r->mem.arena);
    if (m->memory_budget_bytes)
        printf("; memory_budget %lld (%s), fitted by fsdpc at world %lld (peak %lld there, %s)",
               (long long)m->memory_budget_bytes, size_str(b, sizeof b, m->memory_budget_bytes),
               (long long)m->plan_world, (long long)m->plan_peak_bytes,
               size_str(c, sizeof c, m->plan_peak_bytes));
    printf("\n");
    BkMemory d;
    if (!bk_memory(r, &d))
        return;
    /* the device: what the counters will reach, and what they leave out */
    printf("device memory: the counters will peak at %lld bytes: the plan's %lld and %lld the "
           "backend counts beyond it (%s)\n",
           (long long)r->mem.counted, (long long)r->mem.peak,
           (long long)(r->mem.counted - r->mem.peak), d.extra_what);
    printf("device memory: outside the counters start-up allocated %lld bytes: unsharded-buffer "
           "pools %lld (the step takes at most %lld of them at once), cuBLASLt's workspace "
           "%lld, inputs and tables %lld\n",
           (long long)d.outside, (long long)d.pools, (long long)r->mem.unsharded_counted,
           (long long)d.workspace, (long long)(d.outside - d.pools - d.workspace));
    printf("device memory: GPU %d (%s): %lld bytes in use when this process's context was made "
           "(the context, and other processes), %lld after start-up (cudaMemGetInfo): the "
           "runtime's buffers %lld, NCCL's, cuBLASLt's and the kernels' static data %lld; "
           "steps allocate no buffers\n",
           d.device, size_str(a, sizeof a, d.total), (long long)d.used_at_start,
           (long long)d.used_now, (long long)d.ours,
           (long long)(d.used_now - d.used_at_start - d.ours));
}
