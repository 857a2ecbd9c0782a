/*
 * plan.c — the sharding plan: each group's flat layout, the order groups are
 * used in, and the policies that decide when they are gathered and freed.
 *
 * Layout (docs/design.md#flat-layout): a group's parameters lie end to end in one flat
 * buffer, each starting at a multiple of PARAM_ALIGN_ELEMS; the buffer is
 * padded to a multiple of the world size so that rank r owns the contiguous
 * slice [r·S, (r+1)·S). The all-gather then writes every rank's slice
 * straight into the unsharded buffer, which *is* the parameters: no copy-in
 * or copy-out. Offsets do not depend on the world size; only the padding
 * does, and it is computed at start-up, so one program runs on any world.
 *
 * Reshard policy (FSDP2's defaults): non-root groups free their unsharded
 * parameters after forward and gather them again in backward; the root keeps
 * them, since backward starts with the root's head and loss.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <string.h>

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Under replicate = R each replica's S = W / R ranks hold a whole copy, so
 * padding and shards are per S; main.c and the trainer refuse a world R
 * does not divide before anything is planned for it. */
static int64_t shard_ranks(const ShardGroup *sg, int64_t world)
{
    int64_t R = sg->replicate > 1 ? sg->replicate : 1;
    return world % R == 0 ? world / R : world;
}

int64_t plan_shard_world(const Model *m, int64_t world)
{
    int64_t R = m->shard.replicate > 1 ? m->shard.replicate : 1;
    return world % R == 0 ? world / R : world;
}

int64_t plan_padded_numel(const ShardGroup *sg, int64_t world)
{
    return round_up(sg->flat_numel, shard_ranks(sg, world));
}

int64_t plan_shard_numel(const ShardGroup *sg, int64_t world)
{
    return plan_padded_numel(sg, world) / shard_ranks(sg, world);
}

Plan *plan_build(Model *m, Graph *g)
{
    Plan *p = arena_alloc(sizeof *p);
    p->m = m;
    p->g = g;
    p->prefetch_fwd = m->shard.prefetch_forward;
    p->prefetch_bwd = m->shard.prefetch_backward;
    p->accum = m->shard.accumulate_unsharded ? ACCUM_UNSHARDED : ACCUM_SHARDED;
    p->micro_batches = (int)m->train.grad_accum;
    p->micro_batch = m->train.micro_batch;

    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = m->groups[i];
        int64_t off = 0;
        for (int j = 0; j < sg->nparams; j++) {
            off = round_up(off, PARAM_ALIGN_ELEMS);
            sg->params[j]->offset = off;
            off += sg->params[j]->numel;
        }
        sg->flat_numel = round_up(off, PARAM_ALIGN_ELEMS);
        sg->reshard = m->shard.reshard_after_forward != 0 && !sg->is_root;
        sg->replicate = m->shard.replicate;
        sg->fwd_order = -1;
    }

    /* groups in the order forward first uses them; groups it never uses
     * (only unused layers) come last and are never gathered */
    p->fwd_order = arena_alloc(sizeof(ShardGroup *) * (size_t)(m->ngroups + 1));
    int n = 0;
    for (int i = 0; i < g->nfwd; i++) {
        int gi = g->ops[i]->group;
        if (gi >= 0 && m->groups[gi]->fwd_order < 0) {
            m->groups[gi]->fwd_order = n;
            p->fwd_order[n++] = m->groups[gi];
        }
    }
    p->nused = n;
    for (int i = 0; i < m->ngroups; i++)
        if (m->groups[i]->fwd_order < 0) {
            m->groups[i]->fwd_order = n;
            p->fwd_order[n++] = m->groups[i];
        }
    return p;
}

void plan_dump(FILE *out, Plan *p, int64_t world)
{
    Model *m = p->m;
    ShardConfig *c = &m->shard;
    fprintf(out, "plan %s for world %" PRId64 "\n", m->name, world);
    fprintf(out, "  micro-batch %" PRId64 " x %d micro-batches per step\n", p->micro_batch,
            p->micro_batches);
    fprintf(out, "  gradient accumulation: %s\n",
            p->accum == ACCUM_SHARDED
                ? "sharded (reduce-scatter every micro-batch, accumulate shards)"
                : "unsharded (keep full gradients, reduce-scatter on the last micro-batch)");
    fprintf(out, "  prefetch: forward %d, backward %d groups ahead\n", p->prefetch_fwd,
            p->prefetch_bwd);
    fprintf(out, "  mixed precision: all-gather %s, reduce-scatter %s, master weights fp32\n",
            dtype_name(c->param_dtype), dtype_name(c->reduce_dtype));
    fprintf(out, "  offload: %s\n", c->offload_cpu ? "cpu" : "none");
    /* the mesh, only under HSDP, so that other plans' dumps keep their form */
    if (c->replicate > 1) {
        int64_t S = plan_shard_world(m, world);
        fprintf(out, "  mesh: replicate %" PRId64 " x shard %" PRId64 " (HSDP): replica r is "
                     "ranks r*%" PRId64 " .. r*%" PRId64 "+%" PRId64 "; each group is sharded "
                     "over its replica's %" PRId64 " ranks, and its reduced gradient shard is "
                     "all-reduced across the %" PRId64 " replicas (ranks %" PRId64 " apart)\n",
                c->replicate, S, S, S, S - 1, S, c->replicate, S);
    }
    /* shown only when off its default, so other plans' dumps keep their form */
    if (!c->reshard_after_backward)
        fputs("  reshard after backward: no (groups stay gathered from their first all-gather "
              "until the last micro-batch's backward)\n", out);
    fprintf(out, "  alignment: every parameter starts at a multiple of %d elements\n",
            PARAM_ALIGN_ELEMS);
    if (m->groups_auto) {
        fprintf(out, "  groups: fully_shard auto(bucket = %s), the simulator's choice of bucket "
                     "size up to that target:\n",
                fmt_size(m->shard.auto_bucket_bytes));
        plan_dump_buckets(out, p);
    }
    fputs("\ngroups in forward order\n", out);
    fprintf(out, "  %-5s %-24s %14s %14s %14s %12s  %s\n", "group", "name", "params", "padded",
            "shard/rank", "gather/rank", "reshard");
    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = p->fwd_order[i];
        int64_t shard = plan_shard_numel(sg, world);
        /* a group's own dtypes, where its fully_shard line sets them off
         * the shard section's (docs/design.md#per-target-mixed-precision) */
        bool own = sg->param_dtype != c->param_dtype || sg->reduce_dtype != c->reduce_dtype;
        fprintf(out, "  %-5d %-24s %14s %14s %14s %12s  %s%s%s\n", sg->index, sg->name,
                fmt_count(sg->numel), fmt_count(plan_padded_numel(sg, world)), fmt_count(shard),
                fmt_size((plan_padded_numel(sg, world) - shard) * dtype_bytes(sg->param_dtype)),
                sg->reshard ? (c->reshard_after_backward ? "after forward"
                                                         : "after forward, the last backward")
                : c->reshard_after_backward ? "after backward"
                                            : "after the last backward",
                i >= p->nused ? " (unused in forward: never gathered)" : "",
                own ? arena_printf("; all-gather %s, reduce-scatter %s",
                                   dtype_name(sg->param_dtype), dtype_name(sg->reduce_dtype))
                    : "");
    }
    fputs("\nlayout (offsets in elements; the same for every world size)\n", out);
    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = m->groups[i];
        int64_t padded = plan_padded_numel(sg, world), shard = plan_shard_numel(sg, world);
        fprintf(out, "  group %d %s: %s elements, padded to %s; %s owns [r*%" PRId64
                     ", (r+1)*%" PRId64 ")\n",
                sg->index, sg->name, fmt_count(sg->flat_numel), fmt_count(padded),
                c->replicate > 1 ? "rank r of each replica" : "rank r", shard, shard);
        for (int j = 0; j < sg->nparams; j++) {
            Param *pa = sg->params[j];
            int64_t first = pa->offset / shard, last = (pa->offset + pa->numel - 1) / shard;
            char shape[64];
            if (pa->rank == 2)
                snprintf(shape, sizeof shape, "[%" PRId64 ", %" PRId64 "]", pa->shape[0],
                         pa->shape[1]);
            else
                snprintf(shape, sizeof shape, "[%" PRId64 "]", pa->shape[0]);
            fprintf(out, "    %12" PRId64 " %12" PRId64 "  %-16s %-36s ranks %" PRId64, pa->offset,
                    pa->numel, shape, pa->name, first);
            if (last != first)
                fprintf(out, "-%" PRId64, last);
            fputc('\n', out);
        }
    }
}
