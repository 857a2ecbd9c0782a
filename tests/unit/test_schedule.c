/*
 * test_schedule.c — the schedule verifier, held to account both ways.
 *
 * 1. Every example, under every combination of reshard policy (after
 *    forward, and after backward), prefetch depth 0-2, both accumulation
 *    modes, both mixed-precision policies and one or three micro-batches,
 *    yields a schedule the verifier accepts.
 *    Each combination is built with the model's recomputation as written,
 *    then with `recompute = full` and `selective` shard-wide. Each one's
 *    forward-only schedule (evaluation's) verifies too, and its memory plan
 *    peaks no higher than the step's.
 * 2. Mutations: deleting any single event of a valid schedule, moving a
 *    reshard before an op that still reads the group, moving a gradient write
 *    after its group's reduce-scatter, and issuing a wait before its
 *    collective must each be caught, with reshard_after_backward true and
 *    false; and a schedule that reshards after every backward is refused
 *    when reshard_after_backward is false. In the forward-only schedule,
 *    every single deletion, and every reshard moved before a read, is
 *    caught too.
 * 3. Recomputation (`recompute = full`, or the file's own settings): moving
 *    a recompute op before the backward all-gather wait of the group whose
 *    parameters it reads, or after the first op that reads what it writes,
 *    must each be caught, and so must deleting any one of them.
 *
 * Usage: test_schedule FILE.fsd...   Prints one line per check and a final
 * "N passed, N failed".
 */
#include "unit.h"

#include <stdlib.h>
#include <string.h>

static Schedule *build(Model *m)
{
    Graph *g = lower_model(m);
    autodiff(g);
    if (ir_verify(g, stderr))
        return NULL;
    /* recomputation as main applies it */
    Recompute *rc = recompute_units(m, g);
    plan_recompute(rc);
    g = recompute_apply(g, rc);
    if (ir_verify(g, stderr))
        return NULL;
    /* the step main plans for --world 8 */
    SimCluster cluster = sim_default_cluster(8);
    Diag d;
    diag_init(&d, m->prog->src, stderr);
    Plan *p = plan_choose(m, g, &cluster, &d);
    return p ? p->sched : NULL;
}

static Schedule *copy_without(Schedule *s, int drop)
{
    Schedule *c = arena_alloc(sizeof *c);
    *c = *s;
    c->ev = arena_alloc(sizeof(Event) * (size_t)s->nev);
    int n = 0;
    for (int i = 0; i < s->nev; i++)
        if (i != drop)
            c->ev[n++] = s->ev[i];
    c->nev = n;
    return c;
}

static Schedule *copy_moved(Schedule *s, int from, int to)
{
    Schedule *c = copy_without(s, from);
    Event e = s->ev[from];
    if (to > from)
        to--;
    memmove(&c->ev[to + 1], &c->ev[to], sizeof(Event) * (size_t)(c->nev - to));
    c->ev[to] = e;
    c->nev++;
    return c;
}

static bool reads_group(const Event *e, int group)
{
    if (e->kind != EV_COMPUTE)
        return false;
    for (int i = 0; i < e->op->nin; i++)
        if (e->op->in[i]->kind == TK_PARAM && e->op->in[i]->param->group == group)
            return true;
    return false;
}

static bool writes_group(const Event *e, int group)
{
    if (e->kind != EV_COMPUTE)
        return false;
    for (int i = 0; i < e->op->nout; i++)
        if (e->op->out[i]->kind == TK_PGRAD && e->op->out[i]->param->group == group)
            return true;
    return false;
}

static void combinations(const char *path)
{
    Model *m = load(path);
    int total = 0, bad = 0, eval_bad = 0, eval_over = 0;
    const char *first_bad = NULL;
    RecomputeSpec written = m->shard.recompute;
    static const char *const rc_names[] = {"as written", "full", "selective"};
    for (int rcm = 0; rcm <= 2; rcm++)
    for (int rab = 0; rab <= 1; rab++)
        for (int reshard = 0; reshard <= 1; reshard++)
            for (int pf = 0; pf <= 2; pf++)
                for (int accum = 0; accum <= 1; accum++)
                    for (int bf16 = 0; bf16 <= 1; bf16++)
                        for (int k = 1; k <= 3; k += 2) {
                            m->shard.recompute = written;
                            if (rcm)
                                m->shard.recompute.kind = rcm == 1 ? RC_FULL : RC_SELECTIVE;
                            m->shard.reshard_after_forward = reshard;
                            m->shard.reshard_after_backward = rab;
                            m->shard.prefetch_forward = m->shard.prefetch_backward = pf;
                            m->shard.accumulate_unsharded = accum;
                            m->shard.param_dtype = bf16 ? DTYPE_BF16 : DTYPE_FP32;
                            m->train.grad_accum = k;
                            Schedule *s = build(m);
                            total++;
                            /* evaluation's forward: verified, and within
                             * the step's memory at the world planned for */
                            Schedule *ev = s ? schedule_build_eval(s->plan) : NULL;
                            if (!ev || schedule_verify(ev, stderr))
                                eval_bad++;
                            else {
                                MemPlan *a = memplan_build(ev, 8), *b = memplan_build(s, 8);
                                eval_over += a->peak > b->peak || a->freed_peak > b->freed_peak;
                            }
                            if (!s || schedule_verify(s, stderr)) {
                                bad++;
                                if (!first_bad)
                                    first_bad = arena_printf("recompute %s reshard=%d "
                                                             "after-backward=%d prefetch=%d "
                                                             "accum=%d bf16=%d micro-batches=%d",
                                                             rc_names[rcm], reshard, rab, pf,
                                                             accum, bf16, k);
                            }
                        }
    m->shard.recompute = written;
    char what[512];
    snprintf(what, sizeof what, "%s: %d policy combinations verify%s%s", path, total,
             first_bad ? "; first failure: " : "", first_bad ? first_bad : "");
    check(bad == 0, what);
    snprintf(what, sizeof what, "%s: evaluation's forward verifies in all %d (%d do not) and "
                                "needs no more memory than the step (%d need more)",
             path, total, eval_bad, eval_over);
    check(eval_bad == 0 && eval_over == 0, what);
}

/* Evaluation's forward-only schedule: every single deletion, and every
 * reshard moved before a read of its group, is caught. */
static void eval_mutations(const char *path)
{
    Model *m = load(path);
    m->shard.reshard_after_forward = -1;
    Schedule *step = build(m);
    Schedule *s = step ? schedule_build_eval(step->plan) : NULL;
    check(s && schedule_verify(s, NULL) == 0, arena_printf("%s: evaluation's schedule verifies",
                                                           path));
    if (!s)
        return;
    int missed = 0, tried = 0, caught = 0;
    for (int i = 0; i < s->nev; i++)
        missed += schedule_verify(copy_without(s, i), NULL) == 0;
    for (int i = 0; i < s->nev; i++) {
        if (s->ev[i].kind != EV_RESHARD)
            continue;
        int j = i - 1;
        while (j >= 0 && !reads_group(&s->ev[j], s->ev[i].group))
            j--;
        if (j < 0)
            continue;
        tried++;
        caught += schedule_verify(copy_moved(s, i, j), NULL) > 0;
    }
    check(missed == 0 && tried > 0 && caught == tried,
          arena_printf("%s: evaluation's schedule: each of %d single-event deletions caught "
                       "(missed %d), %d early reshards caught of %d",
                       path, s->nev, missed, caught, tried));
    /* and a schedule of the step is not a forward-only one */
    Schedule *fake = copy_without(step, -1);
    fake->forward_only = true;
    check(schedule_verify(fake, NULL) > 0,
          arena_printf("%s: a step's schedule marked forward-only is refused", path));
}

static void mutations(const char *path, bool rab)
{
    Model *m = load(path);
    m->shard.reshard_after_forward = -1;
    m->shard.reshard_after_backward = rab;
    m->shard.accumulate_unsharded = !rab;
    m->train.grad_accum = 2;
    Schedule *s = build(m);
    char what[512];
    if (!rab)
        path = arena_printf("%s (reshard_after_backward = false)", path);
    check(s && schedule_verify(s, NULL) == 0, arena_printf("%s: base schedule verifies", path));

    /* every single deletion */
    int missed = 0, first_missed = -1;
    for (int i = 0; i < s->nev; i++)
        if (schedule_verify(copy_without(s, i), NULL) == 0) {
            missed++;
            if (first_missed < 0)
                first_missed = i;
        }
    snprintf(what, sizeof what, "%s: each of %d single-event deletions is caught (missed %d, "
                                "first at event %d)",
             path, s->nev, missed, first_missed);
    check(missed == 0, what);

    /* a reshard moved before the last op reading its group */
    int tried = 0, caught = 0;
    for (int i = 0; i < s->nev; i++) {
        if (s->ev[i].kind != EV_RESHARD)
            continue;
        int j = i - 1;
        while (j >= 0 && !reads_group(&s->ev[j], s->ev[i].group))
            j--;
        if (j < 0)
            continue;
        tried++;
        caught += schedule_verify(copy_moved(s, i, j), NULL) > 0;
    }
    snprintf(what, sizeof what, "%s: %d early reshards caught of %d", path, caught, tried);
    check(tried > 0 && caught == tried, what);

    /* a gradient write moved after its group's reduce-scatter */
    tried = caught = 0;
    for (int i = 0; i < s->nev; i++) {
        if (s->ev[i].kind != EV_REDUCE_SCATTER)
            continue;
        int j = i - 1;
        while (j >= 0 && !writes_group(&s->ev[j], s->ev[i].group))
            j--;
        if (j < 0)
            continue;
        tried++;
        caught += schedule_verify(copy_moved(s, j, i + 1), NULL) > 0;
    }
    snprintf(what, sizeof what, "%s: %d late gradient writes caught of %d", path, caught, tried);
    check(tried > 0 && caught == tried, what);

    /* a wait moved before its collective */
    tried = caught = 0;
    for (int i = 0; i < s->nev; i++) {
        EventKind want = s->ev[i].kind == EV_WAIT_GATHER   ? EV_ALL_GATHER
                         : s->ev[i].kind == EV_WAIT_REDUCE ? EV_REDUCE_SCATTER
                                                           : EV_COUNT;
        if (want == EV_COUNT)
            continue;
        int j = i - 1;
        while (j >= 0 && !(s->ev[j].kind == want && s->ev[j].group == s->ev[i].group))
            j--;
        if (j < 0)
            continue;
        tried++;
        caught += schedule_verify(copy_moved(s, i, j), NULL) > 0;
    }
    snprintf(what, sizeof what, "%s: %d waits before their collective caught of %d", path, caught,
             tried);
    check(tried > 0 && caught == tried, what);

    /* HSDP: a replica all-reduce moved before its reduce-scatter */
    if (m->shard.replicate > 1) {
        tried = caught = 0;
        for (int i = 0; i < s->nev; i++) {
            if (s->ev[i].kind != EV_ALL_REDUCE)
                continue;
            int j = i - 1;
            while (j >= 0 && !(s->ev[j].kind == EV_REDUCE_SCATTER && s->ev[j].group == s->ev[i].group))
                j--;
            if (j < 0)
                continue;
            tried++;
            caught += schedule_verify(copy_moved(s, i, j), NULL) > 0;
        }
        snprintf(what, sizeof what, "%s: %d replica all-reduces before their reduce-scatter "
                                    "caught of %d", path, caught, tried);
        check(tried > 0 && caught == tried, what);
    }
}

static bool reads_output_of(const Event *e, const OpNode *op)
{
    if (e->kind != EV_COMPUTE)
        return false;
    for (int i = 0; i < e->op->nin; i++)
        for (int k = 0; k < op->nout; k++)
            if (e->op->in[i] == op->out[k])
                return true;
    return false;
}

/* Recompute ops out of place: before the backward wait of a group whose
 * parameters they read, after the first op reading what they write, or
 * gone. The units recompute fully unless the file says otherwise. */
static void recompute_mutations(const char *path)
{
    Model *m = load(path);
    if (!m->shard.recompute.written)
        m->shard.recompute = (RecomputeSpec){.kind = RC_FULL, .written = true};
    m->train.grad_accum = 2;
    Schedule *s = build(m);
    int nrc = 0;
    for (int i = 0; s && i < s->nev; i++)
        nrc += s->ev[i].kind == EV_COMPUTE && s->ev[i].op->recompute;
    check(s && nrc > 0 && schedule_verify(s, NULL) == 0,
          arena_printf("%s, recomputing: the schedule verifies, with %d recompute events", path,
                       nrc));
    if (!s || !nrc)
        return;
    int early = 0, early_caught = 0, late = 0, late_caught = 0, gone = 0;
    for (int i = 0; i < s->nev; i++) {
        const Event *r = &s->ev[i];
        if (r->kind != EV_COMPUTE || !r->op->recompute)
            continue;
        /* before the wait of the group it reads, when that group reshards
         * after forward (one kept after forward has no wait in backward) */
        int g = r->op->group;
        if (g >= 0 && op_reads_params(r->op) && m->groups[g]->reshard) {
            int j = i - 1;
            while (j >= 0 && !(s->ev[j].kind == EV_WAIT_GATHER && s->ev[j].group == g))
                j--;
            if (j >= 0 && s->ev[j].phase == PH_BACKWARD && s->ev[j].micro == r->micro) {
                early++;
                early_caught += schedule_verify(copy_moved(s, i, j), NULL) > 0;
            }
        }
        /* after the first op reading its outputs */
        int j = i + 1;
        while (j < s->nev && !reads_output_of(&s->ev[j], r->op))
            j++;
        if (j < s->nev) {
            late++;
            late_caught += schedule_verify(copy_moved(s, i, j + 1), NULL) > 0;
        }
        gone += schedule_verify(copy_without(s, i), NULL) > 0;
    }
    check(early > 0 && early_caught == early,
          arena_printf("%s: %d recompute ops moved before their group's backward wait caught of "
                       "%d",
                       path, early_caught, early));
    check(late > 0 && late_caught == late,
          arena_printf("%s: %d recompute ops moved after their first reader caught of %d", path,
                       late_caught, late));
    check(gone == nrc, arena_printf("%s: %d deleted recompute ops caught of %d", path, gone, nrc));
}

/* A schedule built to reshard after every backward, checked as if the model
 * said reshard_after_backward = false: the verifier must see that it does
 * not keep the groups gathered. */
static void kept_gathered(const char *path)
{
    Model *m = load(path);
    m->shard.reshard_after_backward = true;
    m->shard.accumulate_unsharded = true;
    m->train.grad_accum = 3;
    Schedule *s = build(m);
    m->shard.reshard_after_backward = false;
    int bad = s ? schedule_verify(s, NULL) : 0;
    check(bad > 0, arena_printf("%s: resharding after each backward is refused with "
                                "reshard_after_backward = false (%d complaints)",
                                path, bad));
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        combinations(argv[i]);
        mutations(argv[i], true);
        mutations(argv[i], false);
        kept_gathered(argv[i]);
        recompute_mutations(argv[i]);
        eval_mutations(argv[i]);
        arena_reset();
    }
    return unit_report();
}
