/*
 * planner.c — every choice fsdpc makes about how a program is sharded, in
 * one place: plan_choose. The front end has already applied what the user
 * decided (the groups of explicit `fully_shard` lines, the shard section's
 * policies); what is left to choose is chosen here, in this order:
 *
 *   0. the mesh: under `replicate = auto` each candidate R is planned by
 *      the steps below and simulated, and the fastest that fits wins
 *      (choose_replicate, the outermost loop);
 *   1. groups: `fully_shard auto(bucket = N)` packs leaf layers into
 *      buckets; the bucket size is searched through the simulator (sim.c)
 *      from N down, and the fastest predicted step wins;
 *   2. policy: under `memory_budget`, the reshard policy (partial
 *      resharding's N among them when the shard group spans nodes) and
 *      prefetch depth the shard section left open are searched through the
 *      memory planner (memplan.c) and, among those whose peak fits, the
 *      simulator: the fastest predicted step wins (what the section wrote
 *      stays as written);
 *   3. the step's schedule (schedule.c) and its memory plan for the world
 *      the dumps and the simulator are asked about.
 *
 * Every alternative weighed is recorded in Plan.tries, with what it was
 * predicted to cost and whether it was chosen: --dump-plan lists the bucket
 * sizes, --dump-memory the policies. The passes it calls stay free of
 * choices: plan.c lays groups out, schedule.c orders events, memplan.c
 * counts bytes, sim.c predicts time.
 *
 * One choice comes before the graph it plans: each recomputation unit's
 * mode (plan_recompute), which recompute_apply turns into recompute ops
 * before fusion (docs/compiler.md#the-planning-entry-point).
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <string.h>

/* Whether a predicted step of a seconds is faster than one of b: by more
 * than the rounding of two replays of the same work (a relative 1e-9), so
 * that candidates the simulator times alike count as a tie, which the
 * searches below give to the earlier candidate. */
static bool faster(double a, double b)
{
    return a < b * (1 - 1e-9);
}

static PlanTry *add_try(Plan *p, PlanTry t)
{
    if (p->ntries == p->cap_tries) {
        int cap = p->cap_tries ? 2 * p->cap_tries : 16;
        PlanTry *n = arena_alloc(sizeof *n * (size_t)cap);
        if (p->ntries)
            memcpy(n, p->tries, sizeof *n * (size_t)p->ntries);
        p->tries = n;
        p->cap_tries = cap;
    }
    p->tries[p->ntries] = t;
    return &p->tries[p->ntries++];
}

/* ── fully_shard auto: which layers share a group ──
 * In the spirit of SimpleFSDP's auto-bucketing. Leaf layers are taken in the
 * order the forward first reads them and packed into consecutive buckets of
 * at most N bytes in the all-gather dtype (a layer larger than N gets a
 * bucket of its own): consecutive layers in one bucket are gathered once,
 * just before they run. A parameter read by two layers (a tied weight) never
 * straddles groups: it goes to the root group, with parameters forward never
 * reads and those an op reads together with it (a tied Linear's bias). */

typedef struct Readers {
    Layer **reader;     /* by parameter index: the layer that reads it first */
    bool *pinned;       /* by parameter index: kept in the root group */
    Param **order;      /* parameters in the order forward first reads them */
    int norder;
} Readers;

static Readers find_readers(Model *m, Graph *g)
{
    int np = m->nparams;
    Readers r = {arena_alloc(sizeof(Layer *) * (size_t)np), arena_alloc((size_t)np),
                 arena_alloc(sizeof(Param *) * (size_t)np), 0};
    for (int i = 0; i < g->nfwd; i++) {
        OpNode *op = g->ops[i];
        for (int k = 0; k < op->nin; k++) {
            if (op->in[k]->kind != TK_PARAM)
                continue;
            Param *p = op->in[k]->param;
            if (!r.reader[p->index]) {
                r.reader[p->index] = op->layer;
                r.order[r.norder++] = p;
            } else if (r.reader[p->index] != op->layer) {
                r.pinned[p->index] = true;
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
                any |= op->in[k]->kind == TK_PARAM && r.pinned[op->in[k]->param->index];
            for (int k = 0; k < op->nin && any; k++)
                if (op->in[k]->kind == TK_PARAM && !r.pinned[op->in[k]->param->index]) {
                    r.pinned[op->in[k]->param->index] = true;
                    more = true;
                }
        }
    }
    return r;
}

static ShardGroup *new_group(Model *m, int index, const char *name)
{
    ShardGroup *sg = arena_alloc(sizeof *sg);
    sg->index = index;
    sg->name = name;
    sg->loc = m->loc;
    sg->params = arena_alloc(sizeof(Param *) * (size_t)m->nparams);
    /* no fully_shard line of its own: the shard section's dtypes */
    sg->param_dtype = m->shard.param_dtype;
    sg->reduce_dtype = m->shard.reduce_dtype;
    sg->output_dtype = m->shard.output_dtype;
    return sg;
}

/* Packs the unpinned parameters, a whole leaf layer at a time, into
 * buckets of at most `bucket` bytes; marks each placed parameter's group
 * -2. Returns the number of groups made in groups[]. */
static int pack_buckets(Model *m, const Readers *r, int64_t bucket, ShardGroup **groups)
{
    int64_t bytes_per = dtype_bytes(m->shard.param_dtype);
    int ng = 0;
    ShardGroup *cur = NULL;
    int64_t cur_bytes = 0;
    for (int i = 0; i < r->norder; i++) {
        Param *p = r->order[i];
        if (r->pinned[p->index] || p->group == -2)
            continue;
        /* the whole leaf layer: its parameters read by it alone */
        Layer *leaf = r->reader[p->index];
        int64_t lbytes = 0;
        for (int j = i; j < r->norder; j++)
            if (r->reader[r->order[j]->index] == leaf && !r->pinned[r->order[j]->index])
                lbytes += r->order[j]->numel * bytes_per;
        if (!cur || (cur_bytes > 0 && cur_bytes + lbytes > bucket)) {
            cur = new_group(m, ng, arena_printf("auto.%d", ng));
            groups[ng++] = cur;
            cur_bytes = 0;
        }
        for (int j = i; j < r->norder; j++) {
            Param *q = r->order[j];
            if (r->reader[q->index] == leaf && !r->pinned[q->index] && q->group != -2) {
                cur->params[cur->nparams++] = q;
                cur->numel += q->numel;
                cur_bytes += q->numel * bytes_per;
                q->group = -2;   /* placed */
            }
        }
    }
    return ng;
}

/* Replaces the model's groups with auto groups for this bucket size, and
 * points every op at the group of the parameters it reads or writes. */
static void auto_groups(Model *m, Graph *g, int64_t bucket)
{
    Readers r = find_readers(m, g);
    ShardGroup **groups = arena_alloc(sizeof(ShardGroup *) * (size_t)(m->nparams + 1));
    int ng = pack_buckets(m, &r, bucket, groups);
    ShardGroup *root = new_group(m, ng, "root");
    root->is_root = true;
    groups[ng++] = root;
    for (int i = 0; i < m->nparams; i++) {
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
    m->groups_auto = true;
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

/* ── the bucket size, through the simulator ──
 * Smaller buckets start computing sooner and overlap better; larger ones pay
 * the per-collective latency fewer times. The user's size is the upper bound
 * (it bounds the unsharded memory); sizes N, N/2, N/4, ... down to 1 MiB, at
 * most 8 of them, are each planned and simulated on the cluster, and the
 * fastest is kept (the larger on a tie: fewer collectives). Each is
 * simulated as the step's pattern of micro-batches, exact for any
 * grad_accum at the cost of three (docs/compiler.md#the-micro-batch-pattern). */
enum { MAX_BUCKET_TRIES = 8 };

static Plan *choose_buckets(Model *m, Graph *g, const SimCluster *c)
{
    int64_t target = m->shard.auto_bucket_bytes;
    PlanTry tried[MAX_BUCKET_TRIES];
    int n = 0, best = 0;
    for (int64_t bucket = target;
         n < MAX_BUCKET_TRIES && (n == 0 || bucket >= ((int64_t)1 << 20)); bucket /= 2) {
        auto_groups(m, g, bucket);
        Plan *p = plan_build(m, g);
        Sim *sim = sim_run(schedule_build(p, p->micro_batches), c);
        tried[n] = (PlanTry){.kind = TRY_BUCKET, .bucket = bucket, .ngroups = m->ngroups,
                             .step_s = sim->step_s};
        if (sim->step_s < tried[best].step_s)
            best = n;
        n++;
    }
    tried[best].chosen = true;
    auto_groups(m, g, tried[best].bucket);
    Plan *p = plan_build(m, g);
    for (int i = 0; i < n; i++)
        add_try(p, tried[i]);
    return p;
}

/* ── memory_budget: the fastest policy that fits ──
 * What the shard section wrote is fixed: `reshard_after_forward` and each
 * `prefetch` argument given are kept in every candidate, and the search
 * varies only what was left open. When nothing fits under them, the error
 * says so with the numbers, and names a policy that would fit if the
 * setting were changed. */

/* ── memory_budget: partial resharding's candidates ──
 * reshard_after_forward = N (docs/design.md#partial-resharding) sits
 * between keeping the parameters and resharding them fully: after forward
 * each group keeps a copy sharded over N ranks (1/N of it per rank), and
 * backward gathers within those N. It pays when the shard group spans
 * nodes: with N the GPUs of a node, backward's all-gathers stay on NVLink
 * instead of crossing the network, on a communicator of their own instead
 * of waiting behind the reduce-scatters on the shard group's, for a copy of
 * 1/N per group held from forward to backward. So the search tries N = the GPUs per node when the
 * shard group S is more than one node and a whole number of them, and
 * N = half a node beside it (gathers over fewer ranks for twice the copy);
 * within a node (S <= GPUs per node) every gather is on NVLink already,
 * and N is not tried. FSDP2 leaves this N to the user; here the memory
 * planner and the simulator weigh it like the other policies. */
enum { MAX_PARTIAL = 2 };

static int partial_candidates(const Model *m, const SimCluster *cl, int64_t out[MAX_PARTIAL])
{
    int64_t g = cl->gpus_per_node, S = plan_shard_world(m, cl->world);
    int n = 0;
    if (g < 2 || S <= g || S % g != 0)
        return 0;
    out[n++] = g;
    if (g % 2 == 0 && g / 2 >= 2)
        out[n++] = g / 2;
    return n;
}

/* Every group without a setting of its own that reshards after forward
 * keeps a copy over N ranks (N >= 2), or reshards fully (N = 0): the
 * candidate's N, which replaces the shard section's (a written N is the
 * candidate's N when the section wrote it). */
static void apply_partial(Model *m, int64_t N)
{
    for (int i = 0; i < m->ngroups; i++) {
        ShardGroup *sg = m->groups[i];
        if (!sg->reshard_own && sg->reshard)
            sg->reshard_ranks = N;
    }
}

/* "true", "false", "8": a reshard_after_forward's value */
static const char *reshard_value(bool reshard, int64_t ranks)
{
    return ranks >= 2 ? arena_printf("%" PRId64, ranks) : reshard ? "true" : "false";
}

/* Whether t is one of partial_candidates', not a written N */
static bool planner_partial(const PlanTry *t)
{
    return t->kind == TRY_POLICY && t->reshard_ranks >= 2 && !t->fixed_reshard;
}

bool plan_tried_partial(const Plan *p)
{
    for (int i = 0; i < p->ntries; i++)
        if (planner_partial(&p->tries[i]))
            return true;
    return false;
}

static void apply_policy(Plan *p, const PlanTry *t)
{
    Model *m = p->m;
    p->prefetch_fwd = t->prefetch_fwd;
    p->prefetch_bwd = t->prefetch_bwd;
    plan_apply_reshard(m, t->reshard);
    apply_partial(m, t->reshard_ranks);
}

/* "reshard after forward (as written), prefetch 1", for the dump's table:
 * the parts the shard section fixed are marked */
static const char *policy_str(const PlanTry *t)
{
    const char *what = arena_printf(
        "%s%s%s", t->reshard ? "reshard after forward" : "keep parameters after forward",
        t->reshard_ranks >= 2 ? arena_printf(" to %" PRId64 " ranks", t->reshard_ranks) : "",
        t->fixed_reshard ? " (as written)" : "");
    if (t->prefetch_fwd == t->prefetch_bwd && t->fixed_fwd == t->fixed_bwd)
        return arena_printf("%s, prefetch %d%s", what, t->prefetch_fwd,
                            t->fixed_fwd ? " (as written)" : "");
    return arena_printf("%s, prefetch forward %d%s, backward %d%s", what, t->prefetch_fwd,
                        t->fixed_fwd ? " (as written)" : "", t->prefetch_bwd,
                        t->fixed_bwd ? " (as written)" : "");
}

/* "resharding after forward and prefetching 0 groups ahead", for messages */
static const char *policy_phrase(const PlanTry *t)
{
    const char *what = t->reshard_ranks >= 2
                           ? arena_printf("resharding to %" PRId64 " ranks", t->reshard_ranks)
                           : t->reshard ? "resharding" : "keeping parameters";
    if (t->prefetch_fwd == t->prefetch_bwd)
        return arena_printf("%s after forward and prefetching %d group%s ahead", what,
                            t->prefetch_fwd, t->prefetch_fwd == 1 ? "" : "s");
    return arena_printf("%s after forward and prefetching %d groups ahead in forward and %d "
                        "in backward",
                        what, t->prefetch_fwd, t->prefetch_bwd);
}

/* "each rank peaks at 3.08 MiB (sharded parameters ..., workspace 0 B)" */
static const char *peak_phrase(const MemPlan *mp)
{
    return arena_printf("each rank peaks at %s (sharded parameters %s, gradients %s, optimizer "
                        "state %s%s, unsharded parameters %s, unsharded gradients %s, "
                        "activation arena %s, workspace %s)",
                        fmt_size(mp->peak), fmt_size(mp->param_shards),
                        fmt_size(mp->grad_shards), fmt_size(mp->optim_state),
                        mp->offload ? " (on the host)" : "",
                        fmt_size(mp->peak_unsharded_params), fmt_size(mp->peak_unsharded_grads),
                        fmt_size(mp->act_arena), fmt_size(mp->peak_workspace));
}

static const char *const ADVICE =
    "raise the budget, shard over more ranks (--world), or lower micro_batch";

/* The written settings a candidate t changes, with where they are:
 * "`reshard_after_forward = true` (written false at f.fsd:3:3)" */
static const char *changes(Diag *d, const ShardConfig *c, const PlanTry *t)
{
    const char *s = "";
    bool written = c->reshard_after_forward != 0;
    int64_t written_ranks = written ? c->reshard_ranks : 0;
    if (c->reshard_after_forward >= 0 &&
        (t->reshard != written || t->reshard_ranks != written_ranks))
        s = arena_printf("`reshard_after_forward = %s` (written %s at %s)",
                         reshard_value(t->reshard, t->reshard_ranks),
                         reshard_value(written, written_ranks),
                         diag_where(d, c->reshard_after_forward_loc));
    const char *name[2] = {"forward", "backward"};
    const int want[2] = {t->prefetch_fwd, t->prefetch_bwd};
    const int have[2] = {c->prefetch_forward, c->prefetch_backward};
    const bool set[2] = {c->prefetch_forward_set, c->prefetch_backward_set};
    const Loc at[2] = {c->prefetch_forward_loc, c->prefetch_backward_loc};
    for (int k = 0; k < 2; k++)
        if (set[k] && want[k] != have[k])
            s = arena_printf("%s%s`prefetch(%s = %d)` (written %d at %s)", s, *s ? " and " : "",
                             name[k], want[k], have[k], diag_where(d, at[k]));
    return s;
}

static void report_no_fit(Diag *d, const ShardConfig *c, const PlanTry *lean,
                          const MemPlan *mp)
{
    diag_error(d, c->memory_budget_loc,
               "memory_budget %s is less than the leanest plan needs on %" PRId64
               " ranks: %s, %s; %s",
               fmt_size(c->memory_budget_bytes), mp->world, policy_phrase(lean), peak_phrase(mp),
               ADVICE);
}

/* Nothing fits under the settings the shard section wrote. `lean` is the
 * smallest peak under them; `alt`, when not NULL, the fastest candidate
 * that fits once a written setting changes. */
static void report_fixed_no_fit(Diag *d, const ShardConfig *c, const PlanTry *lean,
                                const MemPlan *mp, const PlanTry *alt, const MemPlan *alt_mp)
{
    const char *other =
        alt ? arena_printf("%s would fit (%s, each rank peaks at %s): change it, or %s",
                           changes(d, c, alt), policy_phrase(alt), fmt_size(alt_mp->peak),
                           ADVICE)
            : arena_printf("no policy fits with them changed either: %s", ADVICE);
    diag_error(d, c->memory_budget_loc,
               "memory_budget %s cannot be met on %" PRId64 " ranks under the settings written "
               "in `shard`, which the planner keeps: the leanest plan under them is %s, and %s; "
               "%s",
               fmt_size(c->memory_budget_bytes), mp->world, policy_phrase(lean), peak_phrase(mp),
               other);
}

/* The candidates, fastest to leanest:
 *   1. keep every group's parameters after forward (reshard false), with the
 *      configured prefetch: backward gathers nothing again, so one
 *      all-gather per group and micro-batch instead of two; it holds every
 *      group unsharded at the end of forward, where prefetching changes
 *      nothing, so it is tried at one depth.
 *   2-4. reshard after forward (FSDP2's default), prefetching 2, 1, then 0
 *      groups ahead: each prefetched group is one more unsharded buffer in
 *      flight, and each one less exposes more of the all-gathers' latency.
 *   5-.  partial resharding to each N of partial_candidates (a node's GPUs,
 *      then half a node), prefetching 2, 1, then 0 groups ahead: listed
 *      after full resharding, though they reshard less, so that a tie with
 *      it goes to full resharding, which holds less and needs no
 *      sub-communicator; N = a node before half a node for the same reason.
 * The root keeps its parameters in all of them, as FSDP2 does: backward
 * starts with the root's head. With `fixed`, a candidate takes the written
 * settings (a written prefetch replaces the candidate's depth, a written
 * reshard_after_forward drops the candidates of the other kinds, partial
 * resharding's included, and gives its N to those it keeps) and duplicates
 * go; returns the number written to out. */
enum { NPOLICIES = 4, MAX_POLICIES = NPOLICIES + 3 * MAX_PARTIAL };

static int candidates(const ShardConfig *c, bool fixed, const int64_t *partial, int npartial,
                      PlanTry *out)
{
    PlanTry all[MAX_POLICIES] = {
        {.kind = TRY_POLICY, .reshard = false, .prefetch_fwd = c->prefetch_forward,
         .prefetch_bwd = c->prefetch_backward},
        {.kind = TRY_POLICY, .reshard = true, .prefetch_fwd = 2, .prefetch_bwd = 2},
        {.kind = TRY_POLICY, .reshard = true, .prefetch_fwd = 1, .prefetch_bwd = 1},
        {.kind = TRY_POLICY, .reshard = true, .prefetch_fwd = 0, .prefetch_bwd = 0},
    };
    int nall = NPOLICIES;
    for (int i = 0; i < npartial; i++)
        for (int depth = 2; depth >= 0; depth--)
            all[nall++] = (PlanTry){.kind = TRY_POLICY, .reshard = true,
                                    .reshard_ranks = partial[i], .prefetch_fwd = depth,
                                    .prefetch_bwd = depth};
    int n = 0;
    for (int k = 0; k < nall; k++) {
        PlanTry t = all[k];
        if (fixed) {
            t.fixed_reshard = c->reshard_after_forward >= 0;
            t.fixed_fwd = c->prefetch_forward_set;
            t.fixed_bwd = c->prefetch_backward_set;
            if (t.fixed_reshard && (t.reshard != (c->reshard_after_forward != 0) ||
                                    t.reshard_ranks >= 2))
                continue;
            if (t.fixed_reshard && t.reshard)
                t.reshard_ranks = c->reshard_ranks;
            if (t.fixed_fwd)
                t.prefetch_fwd = c->prefetch_forward;
            if (t.fixed_bwd)
                t.prefetch_bwd = c->prefetch_backward;
        }
        bool dup = false;
        for (int j = 0; j < n; j++)
            dup |= out[j].reshard == t.reshard && out[j].reshard_ranks == t.reshard_ranks &&
                   out[j].prefetch_fwd == t.prefetch_fwd && out[j].prefetch_bwd == t.prefetch_bwd;
        if (!dup)
            out[n++] = t;
    }
    return n;
}

static MemPlan *plan_policy(Plan *p, const PlanTry *t, int64_t world)
{
    apply_policy(p, t);
    return memplan_build(schedule_build(p, p->micro_batches), world);
}

/* Without a budget, the shard section's policy. With one, the candidates
 * under the written settings, each memory-planned; of those whose peak fits,
 * the fastest step the simulator predicts on cl wins, the earlier candidate
 * on a tie (less resharding, deeper prefetch; full resharding before
 * partial).
 * Every candidate is planned (a schedule and a memory plan are cheap) so
 * --dump-memory can show what each would need. "Fits" means the peak — what
 * the trainer allocates at most, the arena held whole
 * (docs/design.md#memory-plan) — is within the budget. Returns false, with
 * the error reported at the memory_budget setting, when none fits. */
static bool choose_policy(Plan *p, const SimCluster *cl, Diag *d)
{
    int64_t world = cl->world;
    ShardConfig *c = &p->m->shard;
    int64_t budget = c->memory_budget_bytes;
    if (!budget) {
        p->sched = schedule_build(p, p->micro_batches);
        p->mem = memplan_build(p->sched, world);
        return true;
    }
    int64_t partial[MAX_PARTIAL];
    int npartial = partial_candidates(p->m, cl, partial);
    PlanTry mine[MAX_POLICIES];
    int n = candidates(c, true, partial, npartial, mine);
    MemPlan *lean = NULL;
    PlanTry *chosen = NULL, *lean_try = NULL;
    for (int k = 0; k < n; k++) {
        MemPlan *mp = plan_policy(p, &mine[k], world);
        PlanTry *t = add_try(p, mine[k]);
        t->peak = mp->peak;
        /* a tie: the later, leaner by design, but for partial resharding's
         * candidates, listed late though their copies only add */
        if (!lean || mp->peak < lean->peak || (mp->peak == lean->peak && !planner_partial(t)))
            lean = mp, lean_try = &mine[k];
        if (mp->peak <= budget) {
            t->step_s = sim_run(mp->sched, cl)->step_s;
            if (!chosen || faster(t->step_s, chosen->step_s)) {
                chosen = t;
                p->mem = mp;
            }
        }
    }
    if (!chosen) {
        bool any_fixed = mine[0].fixed_reshard || mine[0].fixed_fwd || mine[0].fixed_bwd;
        if (!any_fixed) {
            report_no_fit(d, c, lean_try, lean);
            return false;
        }
        /* would one fit with a written setting changed? */
        PlanTry open[MAX_POLICIES];
        int no = candidates(c, false, partial, npartial, open);
        for (int k = 0; k < no; k++) {
            MemPlan *mp = plan_policy(p, &open[k], world);
            if (mp->peak <= budget) {
                report_fixed_no_fit(d, c, lean_try, lean, &open[k], mp);
                return false;
            }
        }
        report_fixed_no_fit(d, c, lean_try, lean, NULL, NULL);
        return false;
    }
    chosen->chosen = true;
    apply_policy(p, chosen);
    p->sched = p->mem->sched;
    return true;
}

/* ── recomputation: each unit's mode ──
 * What the .fsd asks is taken as written (every(k) was resolved per unit by
 * recompute_units); `auto` asks the planner. Without memory_budget an
 * auto unit recomputes nothing (plan_recompute): nothing asks for the
 * memory, and recomputing costs time. Under a budget, plan_recompute_search
 * weighs a ladder of modes for the auto units, each planned in full. */

/* Sets every auto unit's mode from the candidate's rule, by the unit's
 * place among the auto units (0, 1, ...): `every` 0 gives them all `mode`;
 * every = k gives full to numbers 0, k, 2k, ... and `rest` to the others. */
typedef struct {
    const char *what;
    RecomputeKind mode, rest;
    int every;
} AutoRule;

static void apply_rule(Recompute *rc, const AutoRule *r)
{
    int nth = 0;
    for (int i = 0; i < rc->nunits; i++) {
        RecomputeUnit *u = &rc->units[i];
        if (!u->auto_unit)
            continue;
        u->mode = r->every ? (nth % r->every == 0 ? RC_FULL : r->rest) : r->mode;
        u->auto_chosen = true;
        nth++;
    }
}

/* One candidate planned as the compile will plan it: transformed, fused,
 * grouped and fitted (errors counted, not printed), then simulated. */
static void weigh(Model *m, const Graph *base, Recompute *rc, bool fuse_ops,
                  const SimCluster *c, RecomputeTry *t)
{
    Graph *g = recompute_apply(base, rc);
    if (fuse_ops)
        fuse(g);
    Diag quiet;
    diag_init(&quiet, m->prog->src, NULL);
    Plan *p = plan_choose(m, g, c, &quiet);
    if (!p || quiet.errors) {
        t->fits = false;
        return;
    }
    t->fits = true;
    t->peak = p->mem->peak;
    t->step_s = sim_run(p->sched, c)->step_s;
}

bool plan_recompute_search(Model *m, const Graph *base, Recompute *rc, bool fuse_ops,
                           const SimCluster *c)
{
    int nauto = 0;
    for (int i = 0; i < rc->nunits; i++)
        if (rc->units[i].mode == RC_AUTO) {
            rc->units[i].auto_unit = true;
            nauto++;
        }
    if (!nauto || !m->shard.memory_budget_bytes)
        return false;
    /* from least recomputed to most: the FLOPs spent again grow down the
     * list and the activations kept shrink */
    static const AutoRule rules[] = {
        {"none", RC_NONE, RC_NONE, 0},
        {"selective", RC_SELECTIVE, RC_NONE, 0},
        {"full on every 4th, none on the rest", RC_NONE, RC_NONE, 4},
        {"full on every 2nd, none on the rest", RC_NONE, RC_NONE, 2},
        {"full on every 2nd, selective on the rest", RC_NONE, RC_SELECTIVE, 2},
        {"full", RC_FULL, RC_NONE, 0},
    };
    enum { NRULES = sizeof rules / sizeof *rules };
    rc->tries = arena_alloc(sizeof(RecomputeTry) * NRULES);
    rc->ntries = 0;
    int best = -1;
    for (int k = 0; k < NRULES; k++) {
        RecomputeTry *t = &rc->tries[rc->ntries++];
        t->what = rules[k].what;
        apply_rule(rc, &rules[k]);
        weigh(m, base, rc, fuse_ops, c, t);
        /* the fastest that fits; a tie goes to the one recomputing less */
        if (t->fits && (best < 0 || faster(t->step_s, rc->tries[best].step_s)))
            best = k;
    }
    /* none fits: the leanest (the last), so the planner's error reports
     * its peak and the policy it tried */
    int pick = best >= 0 ? best : NRULES - 1;
    rc->tries[pick].chosen = true;
    apply_rule(rc, &rules[pick]);
    return true;
}

void plan_recompute(Recompute *rc)
{
    for (int i = 0; i < rc->nunits; i++) {
        RecomputeUnit *u = &rc->units[i];
        if (u->mode == RC_AUTO) {
            u->mode = RC_NONE;
            u->auto_chosen = true;
        }
    }
}

/* Every choice but the mesh's, for the replicate = R the model holds. */
static Plan *plan_for_mesh(Model *m, Graph *g, const SimCluster *c, Diag *d)
{
    Plan *p = m->shard.auto_bucket_bytes ? choose_buckets(m, g, c) : plan_build(m, g);
    if (choose_policy(p, c, d))
        return p;
    /* the graph is recompute = auto's leanest assignment: say so */
    if (g->rc && g->rc->ntries)
        diag_error(d, m->shard.memory_budget_loc,
                   "that plan recomputes every `recompute = auto` unit in full, the leanest of "
                   "the %d assignments weighed (--dump-plan lists them when one fits)",
                   g->rc->ntries);
    return NULL;
}

/* ── replicate = auto: the mesh ──
 * HSDP (docs/design.md#hsdp) trades memory for traffic: a shard group of
 * S = W / R ranks holds 1/S of every group, not 1/W, but its all-gathers and
 * reduce-scatters stay on S ranks (NVLink when S is a node), and only the
 * gradient shards cross replicas. Which R is fastest depends on the model,
 * the batch and the network, so each candidate is planned in full (bucket,
 * policy and, through plan_recompute_search's calls, recomputation searches
 * as for a written R) and simulated on the cluster.
 *
 * The candidates are those FSDP2's HSDP is used with: R = 1 (plain FSDP),
 * and every R whose shard group is a whole number of nodes, S = k x the
 * GPUs per node for each k dividing the number of nodes (a 2-D DeviceMesh
 * of (nodes / k, k x gpus)). At most a handful: 2 nodes give R = 1, 2;
 * 8 nodes R = 1, 2, 4, 8. Shard groups within a node (S < gpus per node)
 * would put the replica all-reduce on NVLink beside the shard group's
 * traffic and shard the state over fewer ranks than a node gives for the
 * same links; they are left out. A world that is not whole nodes gives
 * R = 1 alone. A mesh whose shard group some reshard_after_forward = N
 * does not divide is left out too (docs/design.md#partial-resharding). */
enum { MAX_MESH_TRIES = 16 };

/* Whether every reshard_after_forward = N of the model divides S. */
static bool reshard_divides(const Model *m, int64_t S)
{
    if (m->shard.reshard_ranks >= 2 && S % m->shard.reshard_ranks != 0)
        return false;
    for (int i = 0; i < m->ngroups; i++) {
        const ReshardSpec *rs = m->groups[i]->reshard_own;
        if (rs && rs->ranks >= 2 && S % rs->ranks != 0)
            return false;
    }
    return true;
}

static int mesh_candidates(const Model *m, const SimCluster *c, int64_t out[MAX_MESH_TRIES])
{
    int n = 0;
    out[n++] = 1;
    int64_t g = c->gpus_per_node;
    if (g < 1 || c->world % g != 0)
        return n;
    int64_t nodes = c->world / g;
    /* k = nodes is S = W, R = 1: already there */
    for (int64_t k = nodes - 1; k >= 1 && n < MAX_MESH_TRIES; k--)
        if (nodes % k == 0 && reshard_divides(m, k * g))
            out[n++] = nodes / k;
    return n;
}

/* Plans and simulates the model under replicate = R, errors counted, not
 * printed; the plan, or NULL when no policy fits memory_budget. */
static Plan *weigh_mesh(Model *m, Graph *g, const SimCluster *c, int64_t R, MeshTry *t)
{
    m->shard.replicate = R;
    Diag quiet;
    diag_init(&quiet, m->prog->src, NULL);
    Plan *p = plan_for_mesh(m, g, c, &quiet);
    *t = (MeshTry){.replicate = R, .shard = c->world / R};
    if (!p || quiet.errors)
        return NULL;
    Sim *sim = sim_run(p->sched, c);
    t->planned = true;
    t->step_s = sim->step_s;
    t->exposed_s = sim->exposed_s;
    t->tokens_per_s_gpu = sim->tokens_per_s_gpu;
    t->peak = p->mem->peak;
    return p;
}

/* The fastest candidate that fits the limit: memory_budget when written,
 * else the GPU's HBM (without a budget nothing else bounds the choice, and
 * a larger R always costs memory). A tie goes to the smaller R, which holds
 * less. When none fits, R = 1, the leanest, planned again with errors
 * reported: its own budget error says what it needs. */
static Plan *choose_replicate(Model *m, Graph *g, const SimCluster *c, Diag *d)
{
    int64_t cand[MAX_MESH_TRIES];
    int n = mesh_candidates(m, c, cand);
    MeshChoice *mc = arena_alloc(sizeof *mc);
    *mc = (MeshChoice){.tries = arena_alloc(sizeof(MeshTry) * (size_t)n), .ntries = n,
                       .world = c->world, .nodes = c->nodes, .gpus_per_node = c->gpus_per_node,
                       .gpu = sim_gpu_label(c)};
    mc->limit_is_budget = m->shard.memory_budget_bytes > 0;
    mc->limit = mc->limit_is_budget ? m->shard.memory_budget_bytes : c->hbm_bytes;
    int best = -1;
    for (int k = 0; k < n; k++) {
        MeshTry *t = &mc->tries[k];
        weigh_mesh(m, g, c, cand[k], t);
        t->fits = t->planned && t->peak <= mc->limit;
        if (t->fits && (best < 0 || faster(t->step_s, mc->tries[best].step_s)))
            best = k;
    }
    mc->none_fits = best < 0;
    int pick = best >= 0 ? best : 0;
    mc->tries[pick].chosen = true;
    m->shard.replicate = cand[pick];
    Plan *p = plan_for_mesh(m, g, c, d);
    if (p)
        p->mesh = mc;
    else if (n > 1)
        diag_error(d, m->shard.replicate_loc,
                   "`replicate = auto` weighed %d meshes on %" PRId64 " ranks and none fits; "
                   "that error is for replicate = 1, which holds the least",
                   n, c->world);
    return p;
}

Plan *plan_choose(Model *m, Graph *g, const SimCluster *c, Diag *d)
{
    return m->shard.replicate_auto ? choose_replicate(m, g, c, d) : plan_for_mesh(m, g, c, d);
}

/* ── the alternatives, for the dumps ── */

void plan_dump_buckets(FILE *out, const Plan *p)
{
    for (int i = 0; i < p->ntries; i++) {
        const PlanTry *t = &p->tries[i];
        if (t->kind == TRY_BUCKET)
            fprintf(out, "    bucket %10s: %3d groups, predicted step %.3f ms%s\n",
                    fmt_size(t->bucket), t->ngroups, t->step_s * 1e3,
                    t->chosen ? "  <- chosen" : "");
    }
}

void plan_dump_policies(FILE *out, const Plan *p)
{
    int64_t budget = p->m->shard.memory_budget_bytes;
    int width = 44;   /* wider when settings as written are marked */
    int count = 0;
    for (int i = 0; i < p->ntries; i++)
        if (p->tries[i].kind == TRY_POLICY) {
            count++;
            if ((int)strlen(policy_str(&p->tries[i])) > width)
                width = (int)strlen(policy_str(&p->tries[i]));
        }
    int digits = count >= 10 ? 2 : 1;   /* partial resharding's make ten */
    for (int i = 0, k = 0; i < p->ntries; i++) {
        const PlanTry *t = &p->tries[i];
        if (t->kind == TRY_POLICY)
            fprintf(out, "    %*d. %-*s peak %20s  %s%s\n", digits, ++k, width, policy_str(t),
                    fmt_count(t->peak),
                    t->peak <= budget ? arena_printf("fits, step %.3f ms", 1e3 * t->step_s)
                                      : "too big",
                    t->chosen ? "  <- chosen" : "");
    }
}

void plan_dump_mesh(FILE *out, const Plan *p)
{
    const MeshChoice *mc = p->mesh;
    if (!mc)
        return;
    fprintf(out, "  mesh: replicate = auto, the simulator's choice on %" PRId64 " node%s x %" PRId64
                 " %s (world %" PRId64 "): R = 1 and each R whose shard group is whole nodes, "
                 "the fastest whose peak fits %s %s:\n",
            mc->nodes, mc->nodes == 1 ? "" : "s", mc->gpus_per_node, mc->gpu, mc->world,
            mc->limit_is_budget ? "memory_budget" : "the GPU's HBM of", fmt_size(mc->limit));
    if (mc->world_assumed)
        fprintf(out, "    (no --world or --sim: planned for the default world of %" PRId64
                     "; give the world the trainer will run at, or --sim its cluster)\n",
                mc->world);
    const MeshTry *chosen = NULL;
    for (int i = 0; i < mc->ntries; i++) {
        const MeshTry *t = &mc->tries[i];
        if (t->chosen)
            chosen = t;
        if (!t->planned) {
            fprintf(out, "    replicate %3" PRId64 " x shard %4" PRId64
                         ": no reshard policy or prefetch depth fits memory_budget%s\n",
                    t->replicate, t->shard, t->chosen ? "  <- chosen (the leanest)" : "");
            continue;
        }
        fprintf(out, "    replicate %3" PRId64 " x shard %4" PRId64 ": step %10.3f ms, exposed "
                     "comm %9.3f ms, %8.0f tokens/s per GPU, peak %10s  %s%s\n",
                t->replicate, t->shard, 1e3 * t->step_s, 1e3 * t->exposed_s, t->tokens_per_s_gpu,
                fmt_size(t->peak), t->fits ? "fits" : "too big",
                t->chosen ? (mc->none_fits ? "  <- chosen (the leanest)" : "  <- chosen") : "");
    }
    if (mc->none_fits) {
        fprintf(out, "    none fits: replicate 1 holds the least (shards of 1/%" PRId64 ")\n",
                mc->world);
        return;
    }
    /* why: against the runner-up, or alone */
    const MeshTry *next = NULL;
    for (int i = 0; i < mc->ntries; i++) {
        const MeshTry *t = &mc->tries[i];
        if (t != chosen && t->fits && (!next || t->step_s < next->step_s))
            next = t;
    }
    if (mc->ntries == 1)
        fprintf(out, "    replicate 1: the only candidate (no shard group of whole nodes but "
                     "the world)\n");
    else if (!next)
        fprintf(out, "    replicate %" PRId64 ": the only candidate that fits\n",
                chosen->replicate);
    else if (!faster(chosen->step_s, next->step_s))
        fprintf(out, "    replicate %" PRId64 ": as fast as replicate %" PRId64
                     " and holds less (a tie goes to the smaller R)\n",
                chosen->replicate, next->replicate);
    else
        fprintf(out, "    replicate %" PRId64 ": the fastest that fits, %.3f ms (%.1f%%) a step "
                     "ahead of replicate %" PRId64 "\n",
                chosen->replicate, 1e3 * (next->step_s - chosen->step_s),
                100 * (next->step_s - chosen->step_s) / next->step_s, next->replicate);
    for (int i = 0; i < mc->ntries; i++) {
        const MeshTry *t = &mc->tries[i];
        if (t->planned && !t->fits && t->step_s < chosen->step_s)
            fprintf(out, "    replicate %" PRId64 " would be faster but peaks at %s, over %s\n",
                    t->replicate, fmt_size(t->peak), fmt_size(mc->limit));
    }
}
