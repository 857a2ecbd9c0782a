/*
 * recompute.c — activation recomputation (activation checkpointing): a
 * graph pass after autodiff and before fusion.
 *
 *   lower_model → autodiff → recompute_units, plan_recompute,
 *   recompute_apply → fuse → plan_choose ...
 *
 * A unit is an instance of a non-root fully_shard target (blocks.3), or
 * under fully_shard auto an element of a layer array; its forward ops are
 * those whose scope (OpNode.scope) lies in its subtree and in no deeper
 * unit's. Each unit has a mode (docs/design.md#activation-recomputation):
 *
 *   none       backward reads the values forward wrote, as autodiff left it;
 *   full       the unit keeps only its inputs: every value its forward ops
 *              write is written again in backward by a copy of the op that
 *              wrote it (a recompute op), and backward reads the copies;
 *   selective  the same, but the outputs of the matrix products and of
 *              attention, the expensive ops, are kept: only the cheap ops
 *              (norms, activations, residual adds, rope, lookups) run again.
 *
 * What runs again is what backward needs, and what that needs in turn,
 * back to values the unit keeps: its inputs, the parameters (gathered
 * again by the schedule, which sees the recompute ops read them), and in
 * selective mode the products. A value one unit recomputes is never read by
 * another unit's recompute ops: those read it as forward wrote it, so it is
 * kept (a block's output, which the next block reads again when it is
 * recomputed). The loss, and cross_entropy, which adds to the step's loss
 * as it runs, are never run again.
 *
 * A unit's recompute ops go, in forward order, just before the first
 * backward op that reads one of the values they write: normally the unit's
 * own first backward op; earlier when an op after the unit (relu after a
 * Linear, the final norm after the last block) reads its output in its own
 * backward. Forward values no backward op reads any more stop being saved:
 * their live ranges end in forward, and the memory plan, which places
 * activations by liveness, shrinks by itself.
 *
 * The copies run the same kernels on the same inputs as forward did (and
 * fsdpc has no random op, no dropout, whose copy would need forward's seed),
 * so a recomputed program computes the same bits as one without
 * recomputation. Why before fusion: on the unfused graph every op belongs
 * to one unit, where fusion makes one op of the residual add ending block i
 * and the norm starting block i+1, and of a product and its gelu, which
 * selective mode treats apart. fuse() then fuses forward as before and the
 * recompute ops' pairs alike (docs/compiler.md#recomputation).
 *
 * The pass is a function of the graph and the units' modes and leaves its
 * input graph as it was (Graph.base), so the planner can set other modes
 * and make the graph again.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <string.h>

/* ── layer → unit ──
 * An open-addressing table keyed by the Layer pointer: a model may have
 * 100,000 blocks, and every op looks up its unit. */
typedef struct UnitMap {
    const void **key;
    int *val;
    uint32_t mask;
} UnitMap;

static uint32_t ptr_hash(const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (uint32_t)x;
}

static UnitMap map_new(int n)
{
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)n + 1)
        cap *= 2;
    UnitMap mp = {arena_alloc(sizeof(void *) * cap), arena_alloc(sizeof(int) * cap), cap - 1};
    return mp;
}

/* The slot of key: where it is, or the empty slot where it goes. */
static uint32_t map_slot(const UnitMap *mp, const void *key)
{
    uint32_t i = ptr_hash(key) & mp->mask;
    while (mp->key[i] && mp->key[i] != key)
        i = (i + 1) & mp->mask;
    return i;
}

/* The unit an op of the forward belongs to: the nearest unit among its
 * scope and the scope's ancestors; -1 for none (the root's own ops). */
static int unit_of(const UnitMap *mp, const Layer *scope)
{
    for (const Layer *L = scope; L; L = L->parent)
        if (L->recompute) {
            uint32_t s = map_slot(mp, L);
            return mp->key[s] ? mp->val[s] : -1;
        }
    return -1;
}

const char *recompute_mode_name(RecomputeKind k)
{
    static const char *const names[] = {"none", "full", "selective", "every", "auto"};
    return names[k];
}

/* ── the units ── */

Recompute *recompute_units(Model *m, const Graph *g)
{
    Recompute *rc = arena_alloc(sizeof *rc);
    rc->asked = m->shard.recompute.written;
    /* units in the order forward first runs one of their ops; a unit
     * forward never runs has nothing to recompute and is left out */
    int cap = 16;
    rc->units = arena_alloc(sizeof(RecomputeUnit) * (size_t)cap);
    UnitMap mp = map_new(g->nfwd);
    for (int i = 0; i < g->nfwd; i++) {
        const Layer *L = g->ops[i]->scope;
        while (L && !L->recompute)
            L = L->parent;
        if (!L)
            continue;
        uint32_t s = map_slot(&mp, L);
        if (mp.key[s])
            continue;
        if (rc->nunits == cap) {
            RecomputeUnit *u = arena_alloc(sizeof(RecomputeUnit) * (size_t)cap * 2);
            memcpy(u, rc->units, sizeof(RecomputeUnit) * (size_t)cap);
            rc->units = u;
            cap *= 2;
        }
        mp.key[s] = L;
        mp.val[s] = rc->nunits;
        rc->units[rc->nunits] = (RecomputeUnit){.layer = (Layer *)L, .spec = L->recompute,
                                                .index = rc->nunits};
        rc->asked |= L->recompute->per_target;
        rc->nunits++;
    }
    /* every(k) counts the units its setting covers (one line's, or all that
     * follow the shard section's), in forward order: torchtitan's ac_freq */
    UnitMap count = map_new(rc->nunits);
    for (int i = 0; i < rc->nunits; i++) {
        RecomputeUnit *u = &rc->units[i];
        uint32_t s = map_slot(&count, u->spec);
        if (!count.key[s]) {
            count.key[s] = u->spec;
            count.val[s] = 0;
        }
        u->nth = count.val[s]++;
        switch (u->spec->kind) {
        case RC_EVERY: u->mode = u->nth % u->spec->every == 0 ? RC_FULL : RC_NONE; break;
        default: u->mode = u->spec->kind; break;   /* RC_AUTO waits for the planner */
        }
    }
    return rc;
}

/* ── the transformation ── */

/* A copy of g: every tensor and op a new object with the same id and
 * index, so the copy can be rewritten while g stays as it was. */
static Graph *copy_graph(const Graph *g)
{
    Graph *c = arena_alloc(sizeof *c);
    *c = *g;
    c->tensors_cap = g->ntensors + 1;
    c->tensors = arena_alloc(sizeof(Tensor *) * (size_t)c->tensors_cap);
    for (int i = 0; i < g->ntensors; i++) {
        c->tensors[i] = arena_alloc(sizeof(Tensor));
        *c->tensors[i] = *g->tensors[i];
    }
    c->ops_cap = g->nops + 1;
    c->ops = arena_alloc(sizeof(OpNode *) * (size_t)c->ops_cap);
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = arena_alloc(sizeof *op);
        *op = *g->ops[i];
        for (int k = 0; k < op->nin; k++)
            op->in[k] = c->tensors[op->in[k]->id];
        for (int k = 0; k < op->nout; k++)
            op->out[k] = c->tensors[op->out[k]->id];
        c->ops[i] = op;
    }
    for (int i = 0; i < g->ntensors; i++) {
        Tensor *t = c->tensors[i];
        if (t->producer)
            t->producer = c->ops[t->producer->index];
        if (t->recompute_of)
            t->recompute_of = c->tensors[t->recompute_of->id];
    }
    int np = g->m->nparams;
    c->param_t = arena_alloc(sizeof(Tensor *) * (size_t)(np + 1));
    c->pgrad_t = arena_alloc(sizeof(Tensor *) * (size_t)(np + 1));
    for (int i = 0; i < np; i++) {
        c->param_t[i] = g->param_t[i] ? c->tensors[g->param_t[i]->id] : NULL;
        c->pgrad_t[i] = g->pgrad_t[i] ? c->tensors[g->pgrad_t[i]->id] : NULL;
    }
    c->idx = c->tensors[g->idx->id];
    c->targets = c->tensors[g->targets->id];
    c->positions = c->tensors[g->positions->id];
    c->loss = c->tensors[g->loss->id];
    return c;
}

/* The ops selective mode keeps the outputs of: the matrix products and
 * attention, whose FLOPs are the step's (torchtitan's selective op policy
 * saves mm and the attention kernels alike). */
static bool expensive(OpKind k)
{
    return k == OP_MATMUL || k == OP_MATMUL_BIAS || k == OP_MATMUL_BIAS_GELU ||
           k == OP_ATTENTION;
}

/* Whether running op again changes nothing but its outputs: every forward
 * op but cross_entropy, whose call adds the loss to the step's. */
static bool repeatable(const OpNode *op) { return op->kind != OP_CROSS_ENTROPY; }

typedef struct RC {
    Graph *g;                /* the copy being rewritten */
    Recompute *rc;
    RecomputeUnit **cand;    /* by tensor id: the unit that may recompute it */
    bool *needed;            /* by tensor id: recomputed (a recompute op writes it) */
    bool *cloned;            /* by op index (forward): a recompute op copies it */
    bool *read_bwd;          /* by tensor id: some backward op reads it */
} RC;

/* Which values are recomputed and which forward ops are copied: what
 * backward reads of each unit's candidates, and what their ops read of
 * them in turn. A candidate another unit's copies read is kept instead
 * (they read forward's), and the round starts again; keeping a value only
 * removes copies, which read nothing new, so the rounds end (after two:
 * the first finds every such value, the second the copies without them).
 * Returns whether anything is recomputed. */
static bool choose_copies(RC *x)
{
    Graph *g = x->g;
    int *work = arena_alloc(sizeof(int) * (size_t)(g->ntensors + 1));
    bool changed, any;
    do {
        changed = any = false;
        memset(x->needed, 0, (size_t)g->ntensors);
        memset(x->cloned, 0, (size_t)g->nfwd);
        int n = 0;
        for (int t = 0; t < g->ntensors; t++)
            if (x->cand[t] && x->read_bwd[t]) {
                x->needed[t] = true;
                work[n++] = t;
            }
        while (n > 0) {
            Tensor *t = g->tensors[work[--n]];
            RecomputeUnit *unit = x->cand[t->id];
            OpNode *op = t->producer;
            if (!unit || x->cloned[op->index])
                continue;   /* kept since it was found needed: the next round redoes it */
            x->cloned[op->index] = any = true;
            for (int k = 0; k < op->nin; k++) {
                Tensor *u = op->in[k];
                if (x->cand[u->id] == unit) {
                    if (!x->needed[u->id]) {
                        x->needed[u->id] = true;
                        work[n++] = u->id;
                    }
                } else if (x->cand[u->id]) {
                    x->cand[u->id] = NULL;   /* another unit's copies read it: kept */
                    changed = true;
                }
            }
        }
    } while (changed);
    return any;
}

Graph *recompute_apply(const Graph *base, Recompute *rc)
{
    Graph *g = copy_graph(base);
    g->rc = rc;
    g->base = base;
    int nt = g->ntensors, nf = g->nfwd, nb = g->nops - nf;
    RC x = {g, rc, arena_alloc(sizeof(RecomputeUnit *) * (size_t)(nt + 1)),
            arena_alloc((size_t)nt + 1), arena_alloc((size_t)nf + 1), arena_alloc((size_t)nt + 1)};

    /* each forward op's unit, and what a unit that recomputes may drop: the
     * values its ops write, but the loss, what cannot run again and, in
     * selective mode, the products' outputs */
    UnitMap mp = map_new(rc->nunits);
    for (int i = 0; i < rc->nunits; i++) {
        RecomputeUnit *u = &rc->units[i];
        if (u->mode == RC_AUTO || u->mode == RC_EVERY)
            fsd_unreachable();   /* plan_recompute chooses before the graph is made */
        uint32_t s = map_slot(&mp, u->layer);
        mp.key[s] = u->layer;
        mp.val[s] = i;
        u->saved = u->dropped = NULL;
        u->nsaved = u->ndropped = 0;
    }
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        int ui = unit_of(&mp, op->scope);
        op->unit = ui >= 0 ? &rc->units[ui] : NULL;
        if (i >= nf || !op->unit || op->unit->mode == RC_NONE || !repeatable(op) ||
            (op->unit->mode == RC_SELECTIVE && expensive(op->kind)))
            continue;
        for (int k = 0; k < op->nout; k++)
            if (op->out[k]->kind == TK_ACT && op->out[k] != g->loss &&
                op->out[k]->producer == op)
                x.cand[op->out[k]->id] = op->unit;
    }
    for (int i = nf; i < g->nops; i++)
        for (int k = 0; k < g->ops[i]->nin; k++)
            x.read_bwd[g->ops[i]->in[k]->id] = true;
    bool any = choose_copies(&x);

    /* where each unit's copies go: before the first backward op reading
     * a value they write */
    int *at = arena_alloc(sizeof(int) * (size_t)(rc->nunits + 1));
    for (int i = 0; i < rc->nunits; i++)
        at[i] = -1;
    for (int i = nf; i < g->nops && any; i++) {
        OpNode *op = g->ops[i];
        for (int k = 0; k < op->nin; k++) {
            Tensor *t = op->in[k];
            if (x.needed[t->id] && at[x.cand[t->id]->index] < 0)
                at[x.cand[t->id]->index] = i;
        }
    }

    /* the new op list: forward as it was; before backward op i, the copies
     * of the units placed there (in unit order, each in forward order),
     * then op i reading the copies */
    int nclones = 0;
    for (int i = 0; i < nf; i++)
        nclones += x.cloned[i];
    OpNode **ops = arena_alloc(sizeof(OpNode *) * (size_t)(g->nops + nclones + 1));
    Tensor **copy = arena_alloc(sizeof(Tensor *) * (size_t)(nt + 1));
    int n = 0;
    for (int i = 0; i < nf; i++)
        ops[n++] = g->ops[i];
    /* lists, as linked lists of indices: the units placed before each
     * backward op, in unit (forward) order; each unit's copied ops, in
     * forward order */
    int *first_at = arena_alloc(sizeof(int) * (size_t)(nb + 1));
    int *next_unit = arena_alloc(sizeof(int) * (size_t)(rc->nunits + 1));
    int *first_op = arena_alloc(sizeof(int) * (size_t)(rc->nunits + 1));
    int *next_op = arena_alloc(sizeof(int) * (size_t)(nf + 1));
    for (int i = 0; i <= nb; i++)
        first_at[i] = -1;
    for (int u = rc->nunits - 1; u >= 0; u--) {
        first_op[u] = -1;
        if (at[u] >= 0) {
            next_unit[u] = first_at[at[u] - nf];
            first_at[at[u] - nf] = u;
        }
    }
    for (int f = nf - 1; f >= 0; f--)
        if (x.cloned[f]) {
            next_op[f] = first_op[g->ops[f]->unit->index];
            first_op[g->ops[f]->unit->index] = f;
        }
    for (int i = nf; i < base->nops; i++) {
        for (int u = first_at[i - nf]; u >= 0; u = next_unit[u]) {
            for (int f = first_op[u]; f >= 0; f = next_op[f]) {
                OpNode *src = g->ops[f];
                OpNode *c = arena_alloc(sizeof *c);
                *c = *src;
                c->backward = c->recompute = true;
                c->nin = c->nout = 0;
                for (int k = 0; k < src->nin; k++) {
                    Tensor *t = src->in[k];
                    ir_in(c, x.needed[t->id] ? copy[t->id] : t);
                }
                for (int k = 0; k < src->nout; k++) {
                    Tensor *t = src->out[k];
                    Tensor *y = ir_tensor(g, TK_ACT, arena_printf("%s.rc", t->name), t->dtype,
                                          t->rank, t->dim);
                    y->store = t->store;
                    y->stat = t->stat;
                    y->recompute_of = t;
                    ir_out(c, y, false);
                    if (x.needed[t->id])
                        copy[t->id] = y;
                }
                ops[n++] = c;
            }
        }
        OpNode *op = g->ops[i];
        for (int k = 0; k < op->nin; k++)
            if (x.needed[op->in[k]->id])
                op->in[k] = copy[op->in[k]->id];
        ops[n++] = op;
    }
    for (int i = 0; i < n; i++)
        ops[i]->index = i;
    g->ops = ops;
    g->nops = g->ops_cap = n;

    /* saved: the forward values backward reads now, the copies' inputs among them */
    for (int t = 0; t < nt; t++)
        if (g->tensors[t]->kind == TK_ACT)
            g->tensors[t]->saved = false;
    for (int i = nf; i < n; i++)
        for (int k = 0; k < g->ops[i]->nin; k++) {
            Tensor *t = g->ops[i]->in[k];
            if (t->kind == TK_ACT && !t->recompute_of)
                t->saved = true;
        }
    /* for the dumps: each unit's forward values that backward read before,
     * saved or dropped now; counted, then listed */
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < rc->nunits && pass == 1; i++) {
            RecomputeUnit *u = &rc->units[i];
            u->saved = arena_alloc(sizeof(Tensor *) * (size_t)(u->nsaved + 1));
            u->dropped = arena_alloc(sizeof(Tensor *) * (size_t)(u->ndropped + 1));
            u->nsaved = u->ndropped = 0;
        }
        for (int t = 0; t < nt; t++) {
            Tensor *tt = g->tensors[t];
            OpNode *p = tt->producer;
            if (tt->kind != TK_ACT || !p || p->backward || !p->unit || !base->tensors[t]->saved)
                continue;
            RecomputeUnit *u = p->unit;
            if (tt->saved && pass)
                u->saved[u->nsaved] = tt;
            else if (pass)
                u->dropped[u->ndropped] = tt;
            *(tt->saved ? &u->nsaved : &u->ndropped) += 1;
        }
    }
    return g;
}

/* ── dumps ── */

static bool any_unit(const Graph *g)
{
    return g->rc && g->rc->asked && g->rc->nunits > 0;
}

/* Where a unit's mode comes from: "full (shard section, line 28)",
 * "every(2): number 1 of the units it covers (fully_shard, line 26)". */
static const char *setting_desc(const Graph *g, const RecomputeUnit *u)
{
    const RecomputeSpec *sp = u->spec;
    if (!sp->written)
        return "none (the default)";
    int line, col;
    loc_line_col(g->m->prog->src, sp->loc.begin, &line, &col);
    const char *where = arena_printf("%s, line %d", sp->per_target ? "fully_shard" : "shard section",
                                     line);
    if (sp->kind == RC_EVERY)
        return arena_printf("every(%" PRId64 "): number %d of the units it covers (%s)", sp->every,
                            u->nth, where);
    if (u->auto_chosen)
        return arena_printf(g->rc->ntries ? "auto: the budget search's choice (%s)"
                                          : "auto: none, no memory_budget to fit (%s)",
                            where);
    return arena_printf("%s (%s)", model_recompute_name(sp), where);
}

void recompute_dump_plan(FILE *out, const Graph *g, int64_t batch)
{
    if (!any_unit(g))
        return;
    const Recompute *rc = g->rc;
    double fwd = 0, again = 0;
    for (int i = 0; i < g->nops; i++) {
        if (!g->ops[i]->backward)
            fwd += op_flops(g->ops[i], batch);
        else if (g->ops[i]->recompute)
            again += op_flops(g->ops[i], batch);
    }
    fprintf(out, "\nrecomputation units in forward order (FLOPs per micro-batch of %" PRId64
                 "): recompute ops run\n  %.4g FLOPs again, %.1f%% of forward's\n",
            batch, again, fwd > 0 ? 100 * again / fwd : 0.0);
    /* each unit's recompute ops as they run, fused ones as one */
    int *nops = arena_alloc(sizeof(int) * (size_t)(rc->nunits + 1));
    double *flops = arena_alloc(sizeof(double) * (size_t)(rc->nunits + 1));
    for (int i = 0; i < g->nops; i++)
        if (g->ops[i]->recompute) {
            nops[g->ops[i]->unit->index]++;
            flops[g->ops[i]->unit->index] += op_flops(g->ops[i], batch);
        }
    fprintf(out, "  %-5s %-24s %-10s %5s %12s  %s\n", "unit", "layer", "mode", "ops", "FLOPs again",
            "setting");
    for (int i = 0; i < rc->nunits; i++) {
        const RecomputeUnit *u = &rc->units[i];
        fprintf(out, "  %-5d %-24s %-10s %5d %12.4g  %s\n", u->index, u->layer->path,
                recompute_mode_name(u->mode), nops[i], flops[i], setting_desc(g, u));
    }
    if (!rc->ntries)
        return;
    fprintf(out, "\nrecompute = auto under memory_budget %s: the assignments weighed, each "
                 "planned and simulated\n  %-44s %12s %14s\n",
            fmt_size(g->m->shard.memory_budget_bytes), "auto units", "step (ms)", "peak");
    for (int i = 0; i < rc->ntries; i++) {
        const RecomputeTry *t = &rc->tries[i];
        if (t->fits)
            fprintf(out, "  %-44s %12.3f %14s%s\n", t->what, 1e3 * t->step_s,
                    fmt_size(t->peak), t->chosen ? "  <- chosen: the fastest that fits" : "");
        else
            fprintf(out, "  %-44s %12s %14s%s\n", t->what, "-", "does not fit",
                    t->chosen ? "  <- the leanest, reported" : "");
    }
}

static int64_t sum_bytes(Tensor **ts, int n, int64_t batch)
{
    int64_t b = 0;
    for (int i = 0; i < n; i++)
        b += tensor_bytes(ts[i], batch);
    return b;
}

void recompute_dump_memory(FILE *out, const Graph *g, int64_t batch)
{
    if (!any_unit(g))
        return;
    const Recompute *rc = g->rc;
    fprintf(out, "\nrecomputation: each unit's forward values that backward reads, at B = %" PRId64
                 " (bytes)\n",
            batch);
    fprintf(out, "  %-5s %-24s %-10s %16s %16s %16s\n", "unit", "layer", "mode", "saved",
            "recomputed", "without");
    int64_t tot[2] = {0, 0};
    for (int i = 0; i < rc->nunits; i++) {
        const RecomputeUnit *u = &rc->units[i];
        int64_t s = sum_bytes(u->saved, u->nsaved, batch);
        int64_t d = sum_bytes(u->dropped, u->ndropped, batch);
        tot[0] += s;
        tot[1] += d;
        fprintf(out, "  %-5d %-24s %-10s %16s %16s %16s\n", u->index, u->layer->path,
                recompute_mode_name(u->mode), fmt_count(s), fmt_count(d), fmt_count(s + d));
    }
    fprintf(out, "  %-40s %16s %16s %16s\n", "all units", fmt_count(tot[0]), fmt_count(tot[1]),
            fmt_count(tot[0] + tot[1]));
    fputs("  saved: kept from forward to backward; recomputed: dropped after forward and written\n"
          "  again in backward by recompute ops, live from there to their last reader; without:\n"
          "  what the unit would save without recomputation\n",
          out);
}
