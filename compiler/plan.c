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

int64_t plan_padded_numel(const ShardGroup *sg, int64_t world)
{
    return round_up(sg->flat_numel, world);
}

int64_t plan_shard_numel(const ShardGroup *sg, int64_t world)
{
    return plan_padded_numel(sg, world) / world;
}

/* fully_shard auto(bucket = N): groups chosen by the planner, in the spirit
 * of SimpleFSDP's auto-bucketing. Leaf layers are taken in the order the
 * forward first reads them and packed into consecutive buckets of at most N
 * bytes in the all-gather dtype (a layer larger than N gets a bucket of its
 * own): consecutive layers in one bucket are gathered once, just before
 * they run. A parameter read by two layers (a tied weight) never straddles
 * groups: it goes to the root group, with parameters forward never reads
 * and those an op reads together with it (a tied Linear's bias). */
static void auto_groups(Model *m, Graph *g, int64_t bucket)
{
    int np = m->nparams;
    Layer **reader = arena_alloc(sizeof(Layer *) * (size_t)np);
    bool *pinned = arena_alloc((size_t)np);
    int *first = arena_alloc(sizeof(int) * (size_t)np);
    for (int i = 0; i < np; i++)
        first[i] = -1;
    Param **order = arena_alloc(sizeof(Param *) * (size_t)np);
    int norder = 0;
    for (int i = 0; i < g->nfwd; i++) {
        OpNode *op = g->ops[i];
        for (int k = 0; k < op->nin; k++) {
            if (op->in[k]->kind != TK_PARAM)
                continue;
            Param *p = op->in[k]->param;
            if (!reader[p->index]) {
                reader[p->index] = op->layer;
                order[norder++] = p;
            } else if (reader[p->index] != op->layer) {
                pinned[p->index] = true;
            }
        }
    }
    /* one op reads its parameters from one group (the schedule gathers
     * op->group alone): a tied Linear's bias, read by matmul_bias with the
     * pinned weight, follows the weight to the root */
    for (bool more = true; more;) {
        more = false;
        for (int i = 0; i < g->nfwd; i++) {
            OpNode *op = g->ops[i];
            bool any = false;
            for (int k = 0; k < op->nin; k++)
                any |= op->in[k]->kind == TK_PARAM && pinned[op->in[k]->param->index];
            for (int k = 0; k < op->nin && any; k++)
                if (op->in[k]->kind == TK_PARAM && !pinned[op->in[k]->param->index]) {
                    pinned[op->in[k]->param->index] = true;
                    more = true;
                }
        }
    }
    int64_t bytes_per = dtype_bytes(m->shard.param_dtype);
    ShardGroup **groups = arena_alloc(sizeof(ShardGroup *) * (size_t)(np + 1));
    int ng = 0;
    ShardGroup *cur = NULL;
    int64_t cur_bytes = 0;
    for (int i = 0; i < norder; i++) {
        Param *p = order[i];
        if (pinned[p->index] || p->group == -2)
            continue;
        /* the whole leaf layer: its parameters read by it alone */
        int64_t lbytes = 0;
        for (int j = i; j < norder; j++)
            if (reader[order[j]->index] == reader[p->index] && !pinned[order[j]->index])
                lbytes += order[j]->numel * bytes_per;
        if (!cur || (cur_bytes > 0 && cur_bytes + lbytes > bucket)) {
            cur = arena_alloc(sizeof *cur);
            cur->index = ng;
            cur->name = arena_printf("auto.%d", ng);
            cur->loc = m->loc;
            cur->params = arena_alloc(sizeof(Param *) * (size_t)np);
            groups[ng++] = cur;
            cur_bytes = 0;
        }
        for (int j = i; j < norder; j++) {
            Param *q = order[j];
            if (reader[q->index] == reader[p->index] && !pinned[q->index] && q->group != -2) {
                cur->params[cur->nparams++] = q;
                cur->numel += q->numel;
                cur_bytes += q->numel * bytes_per;
                q->group = -2;   /* placed */
            }
        }
    }
    ShardGroup *root = arena_alloc(sizeof *root);
    root->index = ng;
    root->name = "root";
    root->is_root = true;
    root->loc = m->loc;
    root->params = arena_alloc(sizeof(Param *) * (size_t)np);
    groups[ng++] = root;
    for (int i = 0; i < np; i++) {
        Param *p = m->params[i];
        if (p->group != -2) {
            root->params[root->nparams++] = p;
            root->numel += p->numel;
        }
    }
    /* parameters in declaration order within each group */
    for (int gi = 0; gi < ng; gi++) {
        ShardGroup *sg = groups[gi];
        for (int a = 1; a < sg->nparams; a++)
            for (int b = a; b > 0 && sg->params[b - 1]->index > sg->params[b]->index; b--) {
                Param *t = sg->params[b];
                sg->params[b] = sg->params[b - 1];
                sg->params[b - 1] = t;
            }
        for (int k = 0; k < sg->nparams; k++)
            sg->params[k]->group = gi;
    }
    m->groups = groups;
    m->ngroups = ng;
    /* ops follow their parameters */
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        op->group = -1;
        for (int k = 0; k < op->nin; k++)
            if (op->in[k]->kind == TK_PARAM)
                op->group = op->in[k]->param->group;
        for (int k = 0; k < op->nout; k++)
            if (op->out[k]->kind == TK_PGRAD)
                op->group = op->out[k]->param->group;
    }
}

Plan *plan_build_auto(Model *m, Graph *g, int64_t bucket)
{
    auto_groups(m, g, bucket);
    m->groups_auto = true;
    Plan *p = plan_build(m, g);
    p->auto_bucket = bucket;
    return p;
}

Plan *plan_build(Model *m, Graph *g)
{
    if (m->shard.auto_bucket_bytes && !m->groups_auto) {
        auto_groups(m, g, m->shard.auto_bucket_bytes);
        m->groups_auto = true;
    }
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

static const char *bytes_str(int64_t b)
{
    if (b >= (int64_t)1 << 30)
        return arena_printf("%.2f GiB", (double)b / (1 << 30));
    if (b >= 1 << 20)
        return arena_printf("%.2f MiB", (double)b / (1 << 20));
    if (b >= 1 << 10)
        return arena_printf("%.2f KiB", (double)b / (1 << 10));
    return arena_printf("%" PRId64 " B", b);
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
    /* shown only when off its default, so other plans' dumps keep their form */
    if (!c->reshard_after_backward)
        fputs("  reshard after backward: no (groups stay gathered from their first all-gather "
              "until the last micro-batch's backward)\n", out);
    fprintf(out, "  alignment: every parameter starts at a multiple of %d elements\n",
            PARAM_ALIGN_ELEMS);
    if (p->ntried) {
        fprintf(out, "  groups: fully_shard auto(bucket = %s), the simulator's choice of bucket "
                     "size up to that target:\n",
                bytes_str(m->shard.auto_bucket_bytes));
        for (int i = 0; i < p->ntried; i++)
            fprintf(out, "    bucket %10s: %3d groups, predicted step %.3f ms%s\n",
                    bytes_str(p->tried_bucket[i]), p->tried_groups[i], p->tried_step_s[i] * 1e3,
                    p->tried_bucket[i] == p->auto_bucket ? "  <- chosen" : "");
    }
    fputs("\ngroups in forward order\n", out);
    fprintf(out, "  %-5s %-24s %14s %14s %14s %12s  %s\n", "group", "name", "params", "padded",
            "shard/rank", "gather/rank", "reshard");
    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = p->fwd_order[i];
        int64_t shard = plan_shard_numel(sg, world);
        fprintf(out, "  %-5d %-24s %14s %14s %14s %12s  %s%s\n", sg->index, sg->name,
                fmt_count(sg->numel), fmt_count(plan_padded_numel(sg, world)), fmt_count(shard),
                bytes_str((plan_padded_numel(sg, world) - shard) * dtype_bytes(c->param_dtype)),
                sg->reshard ? (c->reshard_after_backward ? "after forward"
                                                         : "after forward, the last backward")
                : c->reshard_after_backward ? "after backward"
                                            : "after the last backward",
                i >= p->nused ? " (unused in forward: never gathered)" : "");
    }
    fputs("\nlayout (offsets in elements; the same for every world size)\n", out);
    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = m->groups[i];
        int64_t padded = plan_padded_numel(sg, world), shard = plan_shard_numel(sg, world);
        fprintf(out, "  group %d %s: %s elements, padded to %s; rank r owns [r*%" PRId64
                     ", (r+1)*%" PRId64 ")\n",
                sg->index, sg->name, fmt_count(sg->flat_numel), fmt_count(padded), shard, shard);
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
