/*
 * memplan.c — each rank's memory over one training step: what stays
 * resident, which unsharded buffers every schedule event leaves live, where
 * each activation sits in one arena placed by liveness, and the peak with
 * its breakdown (docs/design.md#memory-plan). It chooses nothing: the
 * planner (planner.c) calls memplan_build for the step it settled on, and
 * under `memory_budget` for each candidate policy it weighs; --dump-memory
 * and the "live" column of --dump-schedule read the result. Memory depends
 * on the world size, so this is where `--world` matters; the schedule
 * itself does not.
 *
 * What one rank holds, in bytes (W ranks, micro-batch B, shard_g and
 * padded_g the plan's per-group sizes for W):
 *   resident     the fp32 master shards Σ_g shard_g·4, as much again for the
 *                sharded fp32 gradients, and the optimizer's state: 2× that
 *                for AdamW (m and v), 1× for SGD with momentum, none for
 *                plain SGD. With `offload = cpu` all three live in host
 *                memory (FSDP2's CPUOffloadPolicy) and not on the device.
 *   unsharded    padded_g·sizeof(param dtype) from group g's all_gather to
 *   parameters   its reshard. The all-gather is in place: each rank casts its
 *                shard into its own slice of this buffer, so there is no
 *                separate send buffer.
 *   unsharded    padded_g·sizeof(reduce dtype) from alloc_grads to
 *   gradients    free_grads; the reduce-scatter is in place too.
 *   activations  every activation and activation gradient of the graph,
 *                live from the op that first writes it to the last op that
 *                reads or writes it, in one micro-batch's op order (forward,
 *                then backward). Nothing carries over between micro-batches.
 *   workspace    the scratch one op needs while it runs (op_workspace).
 * Not counted: the token inputs (idx, targets, positions: int32, a few
 * B·T·4 bytes) and the libraries' own state (CUDA context, NCCL buffers).
 *
 * The peak is what the trainer allocates at most, which is what its
 * counters measure (mem_peak_bytes): the runtime allocates the activation
 * arena once, at start-up, and holds it whole for the run, so after every
 * event the rank holds resident + unsharded buffers + the whole arena (+
 * the op's workspace). The lower "peak, activations freed as they die"
 * counts only the activations live at each op instead of the arena; it is
 * printed beside the peak, with what an allocator would have to do to
 * reach it.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define GIB ((double)(1 << 30))

/* Every tensor carved out of the activation arena starts at a multiple of
 * 256 bytes, cudaMalloc's own alignment, so it is as aligned as a buffer
 * allocated alone (vector loads, cuBLASLt's 16-byte minimum and better). */
#define ACT_ALIGN_BYTES 256

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Scratch an op needs while it runs, beyond its inputs and outputs: what
 * the kernels of templates/ and the runtime really allocate, which today is
 * nothing (tests/e2e/ holds the runtime's measured peak to this plan):
 *
 *   op                    bytes  why
 *   attention             0      templates/attention.h: on the GPU one
 *                                block per tile of query rows, K and V
 *                                tiles in shared memory, an online softmax
 *                                (running max and sum) with the output in
 *                                registers; the probabilities are never
 *                                stored in device memory
 *   attention_bwd         0      p is recomputed tile by tile from q, k and
 *                                the saved lse, in two kernels (dq by query
 *                                tile, dk and dv by key tile), D = dO·O per
 *                                query tile, all in shared memory and
 *                                registers, so there is no B·H·T·T buffer
 *                                and no workspace either. (The CPU
 *                                build's blocked path mallocs, per
 *                                thread while it runs, copies of a head's
 *                                K and V and one block of scores, about
 *                                (2·T + 64)·hd + 64·T reals, twice that in
 *                                the backward: host memory the GPU plan
 *                                does not have.)
 *   matmul, matmul_dx/dw  0      cuBLASLt's workspace is one fixed buffer
 *                                the runtime has not sized yet (llm.c uses
 *                                32 MiB), so it is not counted
 *   cross_entropy(_bwd)   0      one pass per row with a running max and
 *                                sum; lse is an output, not scratch
 *   every other op        0      elementwise, or one row at a time (the
 *                                CPU's layernorm_bwd and rmsnorm_bwd
 *                                malloc ⌈rows/64⌉ rows of column
 *                                partials while they run, host memory
 *                                as above)
 *
 * A kernel that does need scratch (a FlashAttention with split-K partials,
 * say) returns its bytes here, and the runtime allocates exactly that. */
static int64_t op_workspace(const OpNode *op, int64_t B)
{
    (void)op, (void)B;
    return 0;
}

/* fp32 states the optimizer keeps per parameter. */
static int optim_states(const TrainConfig *t)
{
    if (t->optimizer == OPT_ADAMW)
        return 2;   /* first and second moments */
    return t->momentum > 0 ? 1 : 0;
}

static bool in_arena(const Tensor *t) { return t->kind == TK_ACT || t->kind == TK_AGRAD; }

/* ── activations: live ranges and placement ── */

typedef struct ActRange {
    Tensor *t;
    int first, last;     /* ops that first write and last touch it */
    int64_t size;        /* bytes the arena reserves: tensor_bytes rounded up */
    int64_t offset;
} ActRange;

static int by_size_desc(const void *a, const void *b)
{
    const ActRange *x = *(ActRange *const *)a, *y = *(ActRange *const *)b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    if (x->first != y->first)
        return x->first - y->first;
    return x->t->id - y->t->id;
}

/* Greedy by size, first fit (TensorFlow Lite's arena planner; Pisarchyk and
 * Lee, "Efficient Memory Management for Deep Neural Net Inference", 2020):
 * the largest tensors are placed first, each at the lowest offset where it
 * overlaps no already placed tensor whose live range overlaps its own.
 * Returns the arena's size. */
static int64_t place(ActRange **order, int n)
{
    qsort(order, (size_t)n, sizeof *order, by_size_desc);
    ActRange **placed = arena_alloc(sizeof *placed * (size_t)(n + 1));   /* by offset */
    int nplaced = 0;
    int64_t arena = 0;
    for (int i = 0; i < n; i++) {
        ActRange *t = order[i];
        int64_t off = 0;
        for (int k = 0; k < nplaced; k++) {
            const ActRange *p = placed[k];
            if (p->first > t->last || t->first > p->last)
                continue;                  /* never live at the same time */
            if (p->offset >= off + t->size)
                break;                     /* the gap below p holds t; later ones start higher */
            if (p->offset + p->size > off)
                off = p->offset + p->size;
        }
        t->offset = off;
        int j = nplaced++;
        while (j > 0 && placed[j - 1]->offset > off) {
            placed[j] = placed[j - 1];
            j--;
        }
        placed[j] = t;
        if (off + t->size > arena)
            arena = off + t->size;
    }
    return arena;
}

/* Live ranges of the arena's tensors, their placement, the live bytes at
 * each op, and the lower bound no placement can beat. */
static void plan_activations(MemPlan *mp, Graph *g, int64_t B)
{
    int *first = arena_alloc(sizeof(int) * (size_t)g->ntensors);
    int *last = arena_alloc(sizeof(int) * (size_t)g->ntensors);
    for (int i = 0; i < g->ntensors; i++)
        first[i] = last[i] = -1;
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        for (int k = 0; k < op->nout; k++) {
            Tensor *t = op->out[k];
            if (first[t->id] < 0)
                first[t->id] = i;
            last[t->id] = i;
        }
        for (int k = 0; k < op->nin; k++)
            last[op->in[k]->id] = i;
    }

    mp->act = arena_alloc(sizeof(ActRange) * (size_t)(g->ntensors + 1));
    ActRange **order = arena_alloc(sizeof(ActRange *) * (size_t)(g->ntensors + 1));
    /* live bytes by op, from a difference array: + at first, − after last */
    int64_t *delta = arena_alloc(sizeof(int64_t) * (size_t)(g->nops + 1));
    mp->act_offset = arena_alloc(sizeof(int64_t) * (size_t)(g->ntensors + 1));
    for (int i = 0; i < g->ntensors; i++) {
        Tensor *t = g->tensors[i];
        mp->act_offset[i] = -1;
        if (!in_arena(t) || first[i] < 0)
            continue;      /* not an activation, or never written */
        int64_t bytes = tensor_bytes(t, B);
        ActRange *l = &mp->act[mp->nact];
        *l = (ActRange){t, first[i], last[i], round_up(bytes, ACT_ALIGN_BYTES), 0};
        order[mp->nact++] = l;
        delta[first[i]] += bytes;
        delta[last[i] + 1] -= bytes;
    }
    mp->act_arena = place(order, mp->nact);
    for (int i = 0; i < mp->nact; i++)
        mp->act_offset[mp->act[i].t->id] = mp->act[i].offset;

    mp->act_live_at = arena_alloc(sizeof(int64_t) * (size_t)(g->nops + 1));
    mp->act_lower_bound_op = -1;
    int64_t live = 0;
    for (int i = 0; i < g->nops; i++) {
        live += delta[i];
        mp->act_live_at[i] = live;
        if (live > mp->act_lower_bound) {
            mp->act_lower_bound = live;
            mp->act_lower_bound_op = i;
        }
        int64_t ws = op_workspace(g->ops[i], B);
        if (ws > mp->workspace) {
            mp->workspace = ws;
            mp->workspace_op = i;
        }
    }
}

/* ── the step, event by event ── */

/* Each group in its own dtypes (ShardGroup.param_dtype, reduce_dtype):
 * the shard section's unless its fully_shard line sets them. */
static int64_t param_buffer_bytes(const MemPlan *mp, const ShardGroup *sg)
{
    return plan_padded_numel(sg, mp->world) * dtype_bytes(sg->param_dtype);
}

/* The dtype the backward writes a group's unsharded gradients in: the
 * compute dtype when that is bf16 (FSDP2's param-dtype gradients), else
 * the group's reduce dtype (an fp32 backward's gradients are rounded to it
 * in place). */
static DType grad_dtype(const Model *m, DType reduce)
{
    return compute_dtype(m) == DTYPE_BF16 ? DTYPE_BF16 : reduce;
}

static int64_t grad_buffer_bytes(const MemPlan *mp, const ShardGroup *sg)
{
    Model *m = mp->sched->plan->m;
    return plan_padded_numel(sg, mp->world) * dtype_bytes(grad_dtype(m, sg->reduce_dtype));
}

/* Whether a group's bf16 gradients are reduced in a wider dtype: widened
 * into a buffer of that dtype first, which lives from the reduce_scatter
 * to its wait. */
static bool widens(const Model *m, DType reduce)
{
    return dtype_bytes(reduce) > dtype_bytes(grad_dtype(m, reduce));
}

static int64_t reduce_buffer_bytes(const MemPlan *mp, const ShardGroup *sg)
{
    Model *m = mp->sched->plan->m;
    if (!widens(m, sg->reduce_dtype))
        return 0;
    return plan_padded_numel(sg, mp->world) * dtype_bytes(sg->reduce_dtype);
}

/* reshard_after_forward = N: the copy forward keeps, 1/N of the padded
 * buffer in the all-gather dtype (docs/design.md#partial-resharding) */
static int64_t partial_copy_bytes(const MemPlan *mp, const ShardGroup *sg)
{
    return sg->reshard_ranks >= 2
               ? plan_padded_numel(sg, mp->world) / sg->reshard_ranks * dtype_bytes(sg->param_dtype)
               : 0;
}

/* Replays the events: unsharded buffers come and go with their events;
 * the arena is held whole at every event, as the runtime allocates it;
 * workspace counts during a compute event only. Beside that, the bytes
 * with activations freed as they die: those live at the last compute op
 * so far in this micro-batch (none before its first op) instead of the
 * arena. Buffer states are flags, not counts, so a malformed schedule (the
 * verifier's business) cannot drive them negative. A partial copy
 * (keep_partial) is held from forward to the wait of the gather_partial
 * that reads it, and counts with the unsharded parameters.
 *
 * A pattern's micro-batch 1 is replayed once for all its repetitions:
 * what is live after an event depends on the buffer flags and the
 * micro-batch's own ops alone, and schedule_verify holds micro-batch 1 to
 * leaving every flag as it found it, so each repetition leaves the same
 * bytes live after each event as the first. The step's peak and every
 * maximum below are therefore the pattern's (tests/unit/test_pattern.c
 * holds them to the full expansion's). */
static void replay(MemPlan *mp)
{
    Schedule *s = mp->sched;
    Model *m = s->plan->m;
    int G = m->ngroups;
    bool *gathered = arena_alloc((size_t)G + 1), *grads = arena_alloc((size_t)G + 1);
    bool *reducing = arena_alloc((size_t)G + 1);
    bool *kept = arena_alloc((size_t)G + 1), *reading = arena_alloc((size_t)G + 1);
    int64_t params = 0, grad = 0, act = 0, copies = 0;
    int micro = -2;
    mp->live_after = arena_alloc(sizeof(int64_t) * (size_t)(s->nev + 1));
    mp->peak = mp->freed_peak = -1;
    mp->peak_event = mp->freed_peak_event = mp->max_params_event = mp->max_grads_event = -1;
    for (int i = 0; i < s->nev; i++) {
        const Event *e = &s->ev[i];
        int64_t ws = 0;
        if (e->micro != micro) {
            micro = e->micro;
            act = 0;
        }
        switch (e->kind) {
        case EV_ALL_GATHER:
        case EV_GATHER_PARTIAL:
            if (!gathered[e->group]) {
                gathered[e->group] = true;
                params += param_buffer_bytes(mp, m->groups[e->group]);
            }
            reading[e->group] = e->kind == EV_GATHER_PARTIAL && kept[e->group];
            break;
        case EV_KEEP_PARTIAL:
            if (!kept[e->group]) {
                kept[e->group] = true;
                params += partial_copy_bytes(mp, m->groups[e->group]);
                copies += partial_copy_bytes(mp, m->groups[e->group]);
            }
            break;
        case EV_WAIT_GATHER:
            if (reading[e->group]) {
                reading[e->group] = kept[e->group] = false;
                params -= partial_copy_bytes(mp, m->groups[e->group]);
                copies -= partial_copy_bytes(mp, m->groups[e->group]);
            }
            break;
        case EV_RESHARD:
            if (gathered[e->group]) {
                gathered[e->group] = false;
                params -= param_buffer_bytes(mp, m->groups[e->group]);
            }
            break;
        case EV_ALLOC_GRADS:
            if (!grads[e->group]) {
                grads[e->group] = true;
                grad += grad_buffer_bytes(mp, m->groups[e->group]);
            }
            break;
        case EV_FREE_GRADS:
            if (grads[e->group]) {
                grads[e->group] = false;
                grad -= grad_buffer_bytes(mp, m->groups[e->group]);
            }
            break;
        case EV_REDUCE_SCATTER:
            if (!reducing[e->group]) {
                reducing[e->group] = true;
                grad += reduce_buffer_bytes(mp, m->groups[e->group]);
            }
            break;
        case EV_WAIT_REDUCE:
            if (reducing[e->group]) {
                reducing[e->group] = false;
                grad -= reduce_buffer_bytes(mp, m->groups[e->group]);
            }
            break;
        case EV_COMPUTE:
            act = mp->act_live_at[e->op->index];
            ws = op_workspace(e->op, mp->batch);
            break;
        default:
            break;
        }
        int64_t live = mp->resident + params + grad + mp->act_arena + ws;
        int64_t freed = mp->resident + params + grad + act + ws;
        mp->live_after[i] = live;
        if (params > mp->max_unsharded_params) {
            mp->max_unsharded_params = params;
            mp->max_params_event = i;
        }
        if (grad > mp->max_unsharded_grads) {
            mp->max_unsharded_grads = grad;
            mp->max_grads_event = i;
        }
        if (params + grad > mp->max_unsharded)
            mp->max_unsharded = params + grad;
        if (live > mp->peak) {
            mp->peak = live;
            mp->peak_event = i;
            mp->peak_unsharded_params = params;
            mp->peak_partial_copies = copies;
            mp->peak_unsharded_grads = grad;
            mp->peak_workspace = ws;
        }
        if (freed > mp->freed_peak) {
            mp->freed_peak = freed;
            mp->freed_peak_event = i;
            mp->freed_peak_acts = act;
        }
    }
}

MemPlan *memplan_build(Schedule *s, int64_t world)
{
    Plan *p = s->plan;
    Model *m = p->m;
    MemPlan *mp = arena_alloc(sizeof *mp);
    mp->sched = s;
    mp->world = world;
    mp->batch = p->micro_batch;
    for (int i = 0; i < m->ngroups; i++)
        mp->shard_numel += plan_shard_numel(m->groups[i], world);
    mp->param_shards = mp->shard_numel * 4;
    mp->grad_shards = mp->shard_numel * 4;
    mp->optim_state = optim_states(&m->train) * mp->param_shards;
    mp->offload = m->shard.offload_cpu;
    mp->resident = mp->offload ? 0 : mp->param_shards + mp->grad_shards + mp->optim_state;
    mp->workspace_op = -1;
    plan_activations(mp, p->g, mp->batch);
    replay(mp);
    return mp;
}

/* ── verifier ──
 * The placement is what the runtime will trust blindly: no two activations
 * live at the same op may share a byte, and every one lies inside the
 * arena. And the replay must add up: live bytes never fall below the
 * resident state, and the peak is the largest of them. */
int memplan_verify(MemPlan *mp, FILE *err)
{
    int bad = 0;
#define BAD(...)                                    \
    do {                                            \
        bad++;                                      \
        if (err) {                                  \
            fputs("memplan verify: ", err);         \
            fprintf(err, __VA_ARGS__);              \
            fputc('\n', err);                       \
        }                                           \
    } while (0)
    for (int i = 0; i < mp->nact; i++) {
        const ActRange *a = &mp->act[i];
        if (a->offset < 0 || a->offset % ACT_ALIGN_BYTES || a->offset + a->size > mp->act_arena)
            BAD("%s at offset %" PRId64 " (%" PRId64 " bytes) is misaligned or outside the "
                "arena of %" PRId64 " bytes",
                a->t->name, a->offset, a->size, mp->act_arena);
        for (int j = i + 1; j < mp->nact; j++) {
            const ActRange *b = &mp->act[j];
            bool together = a->first <= b->last && b->first <= a->last;
            bool shared = a->offset < b->offset + b->size && b->offset < a->offset + a->size;
            if (together && shared)
                BAD("%s (ops %d-%d) and %s (ops %d-%d) are live together and overlap in the "
                    "arena",
                    a->t->name, a->first, a->last, b->t->name, b->first, b->last);
        }
    }
    if (mp->act_arena < mp->act_lower_bound)
        BAD("the arena (%" PRId64 " bytes) is below the lower bound (%" PRId64 ")",
            mp->act_arena, mp->act_lower_bound);
    for (int i = 0; i < mp->sched->nev; i++) {
        if (mp->live_after[i] < mp->resident + mp->act_arena || mp->live_after[i] > mp->peak)
            BAD("event %d: %" PRId64 " bytes live, outside [resident + arena %" PRId64
                ", peak %" PRId64 "]",
                i, mp->live_after[i], mp->resident + mp->act_arena, mp->peak);
    }
    /* the largest of each part, together, bound the peak from above;
     * freeing activations as they die never needs more */
    int64_t bound = mp->resident + mp->max_unsharded + mp->act_arena + mp->workspace;
    if (mp->peak > bound || mp->freed_peak > mp->peak)
        BAD("peak %" PRId64 " above resident + largest unsharded + arena + workspace %" PRId64
            ", or below the peak with activations freed as they die %" PRId64,
            mp->peak, bound, mp->freed_peak);
#undef BAD
    return bad;
}

/* ── --dump-memory ── */

static const char *const phase_names[] = {"forward", "backward", "optimizer"};

static const char *event_desc(const MemPlan *mp, int i)
{
    const Schedule *s = mp->sched;
    const Event *e = &s->ev[i];
    Model *m = s->plan->m;
    const char *when = e->micro >= 0
                           ? arena_printf("%s, micro-batch %d", phase_names[e->phase], e->micro)
                           : phase_names[e->phase];
    if (schedule_runs(s, e) > 1)
        when = arena_printf("%s, micro-batch 1, standing for 1 to %d", phase_names[e->phase],
                            s->micro_batches - 2);
    const char *what;
    if (e->op)
        what = arena_printf("compute op %d %s%s%s", e->op->index, op_name(e->op->kind),
                            e->op->layer && e->op->layer->path[0] ? " " : "",
                            e->op->layer ? e->op->layer->path : "");
    else if (e->group >= 0)
        what = arena_printf("%s %s", event_name(e->kind), m->groups[e->group]->name);
    else
        what = event_name(e->kind);
    return arena_printf("event %d (%s): %s", i, when, what);
}

static void row(FILE *out, const char *label, int64_t bytes, const char *note)
{
    fprintf(out, "  %-40s %20s %11.4f%s%s\n", label, fmt_count(bytes), (double)bytes / GIB,
            note ? "  " : "", note ? note : "");
}

static int by_bytes_desc(const void *a, const void *b)
{
    const ActRange *x = *(ActRange *const *)a, *y = *(ActRange *const *)b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    return x->t->id - y->t->id;
}

/* ── --dump-memory, one part at a time ── */

/* What each part of the dump reads: the plan and its dtype names. */
typedef struct DumpCtx {
    FILE *out;
    const MemPlan *mp;
    Plan *p;
    Model *m;
    ShardConfig *c;
    const char *pdt, *rdt, *adt, *gdt;   /* param, reduce, activation, gradient dtypes
                                            (the shard section's) */
    bool widen;                          /* some group's gradients widened for the
                                            reduce-scatter */
    bool own;                            /* some group has dtypes of its own */
    int nstates;                         /* fp32 optimizer states per parameter */
} DumpCtx;

/* The headline: world, batch, dtypes, optimizer, policy, budget. */
static void dump_settings(const DumpCtx *x)
{
    FILE *out = x->out;
    const MemPlan *mp = x->mp;
    Model *m = x->m;
    Plan *p = x->p;
    ShardConfig *c = x->c;
    Schedule *s = mp->sched;
    fprintf(out, "memory plan %s for world %" PRId64 " (bytes per rank)\n", m->name, mp->world);
    fprintf(out, "  micro-batch B = %" PRId64 ", %d micro-batch%s per step\n", mp->batch,
            s->micro_batches, s->micro_batches == 1 ? "" : "es");
    fprintf(out, "  dtypes: master parameters, gradient shards and optimizer state fp32; "
                 "all-gather %s; reduce-scatter %s; activations %s%s\n",
            x->pdt, x->rdt, x->adt, compute_dtype(m) != DTYPE_FP32 ? " (statistics fp32)" : "");
    /* listed only when some group differs, so other plans' dumps keep their form */
    for (int i = 0; x->own && i < m->ngroups; i++) {
        ShardGroup *sg = m->groups[i];
        if (sg->param_dtype != c->param_dtype || sg->reduce_dtype != c->reduce_dtype)
            fprintf(out, "  group %s: all-gather %s; reduce-scatter %s (its fully_shard line)\n",
                    sg->name, dtype_name(sg->param_dtype), dtype_name(sg->reduce_dtype));
    }
    fprintf(out, "  optimizer: %s\n",
            m->train.optimizer == OPT_ADAMW ? "adamw (2 fp32 states per parameter: m, v)"
            : x->nstates ? "sgd with momentum (1 fp32 state per parameter)"
                         : "sgd without momentum (no state)");
    bool any_reshard = false;
    for (int i = 0; i < m->ngroups; i++)
        any_reshard |= m->groups[i]->reshard;
    fprintf(out, "  policy: %s; prefetch forward %d, backward %d\n",
            any_reshard ? "groups but the root reshard after forward"
                        : "every group keeps its parameters after forward",
            p->prefetch_fwd, p->prefetch_bwd);
    for (int i = 0; i < m->ngroups; i++)   /* partial resharding, only where written */
        if (m->groups[i]->reshard_ranks >= 2)
            fprintf(out, "  group %s: reshard_after_forward = %" PRId64 " (keeps %s bytes, 1/%"
                         PRId64 " of its padded buffer, from forward to backward's "
                         "gather_partial)\n",
                    m->groups[i]->name, m->groups[i]->reshard_ranks,
                    fmt_count(partial_copy_bytes(mp, m->groups[i])), m->groups[i]->reshard_ranks);
    fprintf(out, "  offload: %s\n",
            mp->offload ? "cpu (sharded parameters, gradients and optimizer state live in "
                          "host memory and are not counted in the peak)"
                        : "none");
    if (!c->memory_budget_bytes) {
        fputs("  memory_budget: none\n", out);
    } else {
        fprintf(out, "  memory_budget: %s (%s bytes); policies from least resharding to "
                     "most%s, the fastest simulated step that fits is used:\n",
                fmt_size(c->memory_budget_bytes), fmt_count(c->memory_budget_bytes),
                plan_tried_partial(p) ? ", then partial resharding to N ranks (after full "
                                        "resharding, which a tie goes to: it holds less)"
                                      : "");
        plan_dump_policies(out, p);
    }
}

/* What the rank holds at the peak, by kind; then the lower peak with
 * activations freed as they die, and what it would take to reach it. */
static void dump_peak(const DumpCtx *x)
{
    FILE *out = x->out;
    const MemPlan *mp = x->mp;
    fputs("\nbreakdown at the peak (what the trainer allocates)       bytes         GiB\n", out);
    const char *host = mp->offload ? "(host)" : NULL;
    row(out, "sharded parameters (fp32)", mp->param_shards, host);
    row(out, "sharded gradients (fp32)", mp->grad_shards, host);
    row(out, arena_printf("optimizer state (%d x fp32)", x->nstates), mp->optim_state, host);
    bool partial = false;
    for (int i = 0; i < x->p->m->ngroups; i++)
        partial |= x->p->m->groups[i]->reshard_ranks >= 2;
    if (!partial) {
        row(out, arena_printf("unsharded parameters (%s)", x->pdt), mp->peak_unsharded_params,
            NULL);
    } else {   /* only with partial resharding, so other dumps keep their form */
        row(out, arena_printf("unsharded parameters (%s)", x->pdt),
            mp->peak_unsharded_params - mp->peak_partial_copies, NULL);
        row(out, "partial copies (1/N)", mp->peak_partial_copies, "reshard_after_forward = N");
    }
    row(out,
        x->widen ? arena_printf("unsharded gradients (%s+%s reduce)", x->gdt,
                                dtype_name(DTYPE_FP32))
                 : arena_printf("unsharded gradients (%s)", x->gdt),
        mp->peak_unsharded_grads, NULL);
    row(out, "activation arena", mp->act_arena, "allocated once, held whole");
    row(out, "workspace", mp->peak_workspace, NULL);
    row(out, "peak", mp->peak, "the trainer's mem_peak_bytes");
    fprintf(out, "\n  the peak is after %s,\n  where the unsharded buffers are largest\n",
            event_desc(mp, mp->peak_event));
    fputc('\n', out);
    row(out, "peak, activations freed as they die", mp->freed_peak,
        arena_printf("%s lower, after event %d", fmt_count(mp->peak - mp->freed_peak),
                     mp->freed_peak_event));
    fprintf(out, "    the activations live after event %d are %s bytes of the arena's %s; only\n"
                 "    an allocator that hands out each activation when it is first written and "
                 "takes it back\n"
                 "    after its last use, from one pool with the unsharded buffers and without "
                 "fragmentation,\n"
                 "    would reach it: the trainer allocates the arena once and holds it whole\n",
            mp->freed_peak_event, fmt_count(mp->freed_peak_acts), fmt_count(mp->act_arena));
}

/* The largest of each kind over the whole step, each at its own event. */
static void dump_whole_step(const DumpCtx *x)
{
    FILE *out = x->out;
    const MemPlan *mp = x->mp;
    Graph *g = x->p->g;
    fputs("\nover the whole step\n", out);
    row(out, "largest unsharded parameters", mp->max_unsharded_params,
        mp->max_params_event >= 0 ? arena_printf("at event %d", mp->max_params_event) : NULL);
    row(out, "largest unsharded gradients", mp->max_unsharded_grads,
        mp->max_grads_event >= 0 ? arena_printf("at event %d", mp->max_grads_event) : NULL);
    row(out, "largest unsharded, both together", mp->max_unsharded, NULL);
    row(out, "activation arena, as placed", mp->act_arena,
        arena_printf("%d tensors, each at a multiple of %d bytes", mp->nact, ACT_ALIGN_BYTES));
    row(out, "activation lower bound", mp->act_lower_bound,
        mp->act_lower_bound_op >= 0
            ? arena_printf("live at op %d; the arena is %.1f%% above it", mp->act_lower_bound_op,
                           mp->act_lower_bound
                               ? 100.0 * (double)(mp->act_arena - mp->act_lower_bound) /
                                     (double)mp->act_lower_bound
                               : 0.0)
            : NULL);
    row(out, "largest workspace", mp->workspace,
        mp->workspace_op >= 0 ? arena_printf("op %d %s", mp->workspace_op,
                                             op_name(g->ops[mp->workspace_op]->kind))
                              : NULL);
}

/* Each group's flat, padded and shard sizes at this world. */
static void dump_groups(const DumpCtx *x)
{
    FILE *out = x->out;
    const MemPlan *mp = x->mp;
    Model *m = x->m;
    Plan *p = x->p;
    fputs("\ngroups (padded = flat rounded up to a multiple of W; shard = padded / W)\n", out);
    fprintf(out, "  %-5s %-20s %15s %15s %13s %17s %17s\n", "group", "name", "flat", "padded",
            "shard", arena_printf("params %s", x->pdt), arena_printf("grads %s", x->gdt));
    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = p->fwd_order[i];
        fprintf(out, "  %-5d %-20s %15s %15s %13s %17s %17s\n", sg->index, sg->name,
                fmt_count(sg->flat_numel), fmt_count(plan_padded_numel(sg, mp->world)),
                fmt_count(plan_shard_numel(sg, mp->world)),
                fmt_count(param_buffer_bytes(mp, sg)), fmt_count(grad_buffer_bytes(mp, sg)));
    }
}

/* The ten largest activation tensors and where they sit. */
static void dump_largest_tensors(const DumpCtx *x)
{
    FILE *out = x->out;
    const MemPlan *mp = x->mp;
    int ntop = mp->nact < 10 ? mp->nact : 10;
    ActRange **top = arena_alloc(sizeof(ActRange *) * (size_t)(mp->nact + 1));
    for (int i = 0; i < mp->nact; i++)
        top[i] = &mp->act[i];
    qsort(top, (size_t)mp->nact, sizeof *top, by_bytes_desc);
    fprintf(out, "\nlargest activation tensors (%d of %d in the arena)\n", ntop, mp->nact);
    fprintf(out, "  %15s %15s %11s  %-24s %s\n", "bytes", "offset", "ops", "shape", "name");
    for (int i = 0; i < ntop; i++) {
        const ActRange *l = top[i];
        fprintf(out, "  %15s %15s %5d-%-5d  %-24s %s\n", fmt_count(tensor_bytes(l->t, mp->batch)),
                fmt_count(l->offset), l->first, l->last, tensor_type(l->t), l->t->name);
    }
}

/* How each figure above is computed. */
static void dump_formulas(const DumpCtx *x)
{
    FILE *out = x->out;
    const MemPlan *mp = x->mp;
    Model *m = x->m;
    ShardConfig *c = x->c;
    fputs("\nformulas\n", out);
    fprintf(out, "  sharded parameters = sum of shards x 4 = %s x 4\n", fmt_count(mp->shard_numel));
    fputs("  sharded gradients  = the same\n", out);
    fprintf(out, "  optimizer state    = %d x sharded parameters\n", x->nstates);
    fprintf(out, "  unsharded parameters of a group = padded x %d (%s), from its all_gather "
                 "to its reshard\n",
            dtype_bytes(c->param_dtype), x->pdt);
    fprintf(out, "  unsharded gradients of a group  = padded x %d (%s), from its alloc_grads "
                 "to its free_grads\n",
            dtype_bytes(grad_dtype(m, c->reduce_dtype)), x->gdt);
    if (x->widen)
        fprintf(out, "    + padded x %d (%s), the %s gradients widened for the reduce-scatter, "
                     "from its\n"
                     "    reduce_scatter to its wait_reduce\n",
                dtype_bytes(DTYPE_FP32), dtype_name(DTYPE_FP32), x->gdt);
    if (x->own)
        fputs("    (a group with dtypes of its own, listed at the top, in those: the "
              "all-gather\n    dtype for its parameters, its reduce dtype for its gradients)\n",
              out);
    fputs("  activation arena = the placement's size: every activation and activation "
          "gradient\n    at its offset, allocated at start-up and held for the whole run\n",
          out);
    fputs("  workspace during a compute event: 0 for every op (attention keeps no B*H*T*T\n"
          "    probabilities: an online softmax forward, p recomputed in backward)\n",
          out);
    fprintf(out, "  live after an event = %sunsharded parameters\n"
                 "    + unsharded gradients + activation arena + workspace; the peak is its "
                 "largest\n",
            mp->offload ? "" : "sharded parameters + gradients + optimizer state + ");
    fputs("  with activations freed as they die: the same with, instead of the arena, the\n"
          "    activations and their gradients live at the last compute op so far in its\n"
          "    micro-batch (first write <= op <= last use; none before a micro-batch's first op)\n",
          out);
}

void memplan_dump(FILE *out, MemPlan *mp)
{
    Plan *p = mp->sched->plan;
    Model *m = p->m;
    ShardConfig *c = &m->shard;
    bool widen = false, own = false;
    for (int i = 0; i < m->ngroups; i++) {
        widen |= widens(m, m->groups[i]->reduce_dtype);
        own |= m->groups[i]->param_dtype != c->param_dtype ||
               m->groups[i]->reduce_dtype != c->reduce_dtype;
    }
    DumpCtx x = {out, mp, p, m, c, dtype_name(c->param_dtype), dtype_name(c->reduce_dtype),
                 dtype_name(compute_dtype(m)), dtype_name(grad_dtype(m, c->reduce_dtype)),
                 widen, own, optim_states(&m->train)};
    dump_settings(&x);
    dump_peak(&x);
    dump_whole_step(&x);
    dump_groups(&x);
    dump_largest_tensors(&x);
    dump_formulas(&x);
}
