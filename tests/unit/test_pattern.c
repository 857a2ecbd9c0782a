/*
 * test_pattern.c — a step planned as a pattern of micro-batches (first,
 * middle x (n - 2), last: docs/compiler.md#the-micro-batch-pattern)
 * against the same step with every micro-batch written out
 * (schedule_build_full).
 *
 * For each model given, each n in {1, 2, 3, 4, 7, 12} and every policy
 * that changes a micro-batch's events (accumulate sharded or unsharded,
 * reshard_after_backward true or false, prefetch 0-2, reshard_after_forward
 * as FSDP2's default or false, fp32 or bf16 parameters; each policy is
 * planned once, at 8 ranks, and its schedules built for every n):
 *   - both schedules verify, and the pattern is the full expansion with its
 *     middle micro-batches written once: event for event the same kinds,
 *     groups and ops, and as many events a step (each counted
 *     schedule_runs times);
 *   - the memory plan at 8 and 3 ranks: the same bytes live after every
 *     event of the full step as after its event in the pattern, the same
 *     peak and breakdown, at the same event, and the same maxima;
 *   - the collective bytes per step;
 *   - the simulated step on one node of 8 and on two nodes of 8 H100s: the
 *     same step time, compute, exposed communication and busy times within
 *     a relative 1e-12 of the step, the same bytes, and every pattern
 *     event's start and end those of its first run in the full step;
 * then the simulator's steady state where schedule.c gives it nothing to
 * find: with an all-gather of each micro-batch moved into the one before
 * (prefetch across micro-batches), and again with an unwaited all-gather
 * ending the first micro-batch, so the middle's runs differ before they
 * settle, the pattern still replays as the full step; and that the
 * verifier refuses a pattern whose middle micro-batch would be valid once
 * but not repeated, and a repeat count that is not n - 2.
 *
 * Usage: test_pattern FILE.fsd...   Prints one line per check and a final
 * "N passed, N failed".
 */
#include "unit.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The policies under test, one bit each. */
enum { P_RAB, P_UNSHARDED, P_KEEP_AFTER_FWD, P_BF16, NBITS };
enum { NPREFETCH = 3, NPOLICIES = NPREFETCH << NBITS };

static const char *policy_name(int k)
{
    int bits = k / NPREFETCH, pf = k % NPREFETCH;
    return arena_printf("accumulate %s, reshard_after_backward %s, reshard_after_forward %s, "
                        "%s, prefetch %d",
                        bits >> P_UNSHARDED & 1 ? "unsharded" : "sharded",
                        bits >> P_RAB & 1 ? "false" : "true",
                        bits >> P_KEEP_AFTER_FWD & 1 ? "false" : "default",
                        bits >> P_BF16 & 1 ? "bf16" : "fp32", pf);
}

/* The model at `path` planned for a step of n micro-batches under policy
 * k, at 8 ranks (as main plans). */
static Plan *plan_for(const char *path, int k, int n)
{
    Model *m = load(path);
    int bits = k / NPREFETCH, pf = k % NPREFETCH;
    m->shard.reshard_after_backward = !(bits >> P_RAB & 1);
    m->shard.accumulate_unsharded = bits >> P_UNSHARDED & 1;
    m->shard.reshard_after_forward = bits >> P_KEEP_AFTER_FWD & 1 ? 0 : -1;
    m->shard.param_dtype = bits >> P_BF16 & 1 ? DTYPE_BF16 : DTYPE_FP32;
    m->shard.prefetch_forward = m->shard.prefetch_backward = pf;
    m->train.grad_accum = n;
    Graph *g = lower_model(m);
    autodiff(g);
    Recompute *rc = recompute_units(m, g);   /* as main does: a file's recompute ops too */
    plan_recompute(rc);
    g = recompute_apply(g, rc);
    fuse(g);
    if (ir_verify(g, stderr))
        return NULL;
    SimCluster cluster = sim_default_cluster(8);
    Diag d;
    diag_init(&d, m->prog->src, stderr);
    return plan_choose(m, g, &cluster, &d);
}

/* map[j]: the pattern's event that the full step's event j is a run of;
 * -1 in every entry when the two do not correspond event for event. */
static int *correspond(const Schedule *pat, const Schedule *full, const char **why)
{
    int *map = arena_alloc(sizeof(int) * (size_t)(full->nev + 1));
    int n = full->micro_batches, j = 0;
    int64_t runs = 0;
    for (int i = 0; i < pat->nev; i++)
        runs += schedule_runs(pat, &pat->ev[i]);
    *why = NULL;
    if (runs != full->nev)
        *why = arena_printf("the pattern's %d events run %ld times a step; the full step has %d",
                            pat->nev, (long)runs, full->nev);
    for (int i = 0; i < pat->nev && !*why;) {
        int mb = pat->ev[i].micro, end = i;
        while (end < pat->nev && pat->ev[end].micro == mb)
            end++;
        for (int64_t r = 0; r < schedule_runs(pat, &pat->ev[i]) && !*why; r++)
            for (int k = i; k < end && !*why; k++, j++) {
                const Event *a = &pat->ev[k], *b = &full->ev[j];
                int want_micro = mb == 1 ? 1 + (int)r : mb;
                if (a->kind != b->kind || a->group != b->group || a->op != b->op ||
                    a->phase != b->phase || b->micro != want_micro)
                    *why = arena_printf("full event %d (%s, micro-batch %d) is not pattern "
                                        "event %d (%s, micro-batch %d) of n = %d",
                                        j, event_name(b->kind), b->micro, k, event_name(a->kind),
                                        a->micro, n);
                map[j] = k;
            }
        i = end;
    }
    if (*why)
        for (int k = 0; k <= full->nev; k++)
            map[k] = -1;
    return map;
}

static int64_t step_bytes(const Schedule *s, EventKind kind, int64_t world)
{
    int64_t total = 0;
    for (int i = 0; i < s->nev; i++)
        if (s->ev[i].kind == kind)
            total += event_comm_bytes(s, &s->ev[i], world) * schedule_runs(s, &s->ev[i]);
    return total;
}

/* The first difference between the two memory plans, or NULL. */
static const char *memory_differs(MemPlan *pat, MemPlan *full, const int *map)
{
    for (int j = 0; j < full->sched->nev; j++)
        if (full->live_after[j] != pat->live_after[map[j]])
            return arena_printf("%ld bytes live after full event %d, %ld after pattern event %d",
                                (long)full->live_after[j], j, (long)pat->live_after[map[j]],
                                map[j]);
    struct {
        const char *what;
        int64_t a, b;
    } figs[] = {
        {"peak", pat->peak, full->peak},
        {"peak's unsharded parameters", pat->peak_unsharded_params, full->peak_unsharded_params},
        {"peak's unsharded gradients", pat->peak_unsharded_grads, full->peak_unsharded_grads},
        {"peak with activations freed", pat->freed_peak, full->freed_peak},
        {"its activations", pat->freed_peak_acts, full->freed_peak_acts},
        {"peak's workspace", pat->peak_workspace, full->peak_workspace},
        {"largest unsharded parameters", pat->max_unsharded_params, full->max_unsharded_params},
        {"largest unsharded gradients", pat->max_unsharded_grads, full->max_unsharded_grads},
        {"largest unsharded", pat->max_unsharded, full->max_unsharded},
        {"peak event", pat->peak_event, map[full->peak_event]},
        {"freed peak's event", pat->freed_peak_event, map[full->freed_peak_event]},
        {"largest parameters' event", pat->max_params_event,
         full->max_params_event < 0 ? -1 : map[full->max_params_event]},
        {"largest gradients' event", pat->max_grads_event,
         full->max_grads_event < 0 ? -1 : map[full->max_grads_event]},
    };
    for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++)
        if (figs[i].a != figs[i].b)
            return arena_printf("%s: pattern %ld, full %ld", figs[i].what, (long)figs[i].a,
                                (long)figs[i].b);
    return NULL;
}

/* The first difference between the two replays beyond a relative 1e-12 of
 * the step, or NULL; *worst is the largest relative difference of the
 * step time seen so far. */
static const char *time_differs(const Sim *pat, const Sim *full, const int *map, double *worst)
{
    double scale = full->step_s;
    double rel = fabs(pat->step_s - full->step_s) / scale;
    if (rel > *worst)
        *worst = rel;
    struct {
        const char *what;
        double a, b;
    } figs[] = {
        {"step", pat->step_s, full->step_s},
        {"compute", pat->compute_s, full->compute_s},
        {"exposed all-gather", pat->exposed_gather_s, full->exposed_gather_s},
        {"exposed reduce-scatter", pat->exposed_reduce_s, full->exposed_reduce_s},
        {"compute stream busy", pat->busy_s[STREAM_COMPUTE], full->busy_s[STREAM_COMPUTE]},
        {"gather stream busy", pat->busy_s[STREAM_GATHER], full->busy_s[STREAM_GATHER]},
        {"reduce stream busy", pat->busy_s[STREAM_REDUCE], full->busy_s[STREAM_REDUCE]},
        {"matmul", pat->cat_s[0], full->cat_s[0]},
        {"attention", pat->cat_s[1], full->cat_s[1]},
        {"memory-bound ops", pat->cat_s[2], full->cat_s[2]},
        {"optimizer", pat->cat_s[3], full->cat_s[3]},
        {"MFU", pat->mfu * scale, full->mfu * scale},
    };
    for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++)
        if (!(fabs(figs[i].a - figs[i].b) <= 1e-12 * scale))
            return arena_printf("%s: pattern %.17g s, full %.17g s", figs[i].what, figs[i].a,
                                figs[i].b);
    for (int st = 0; st < STREAM_COUNT; st++)
        if (pat->bytes[st] != full->bytes[st])
            return arena_printf("stream %d moves %ld bytes in the pattern, %ld in full", st,
                                (long)pat->bytes[st], (long)full->bytes[st]);
    /* each pattern event at its first run's time in the full step */
    const Schedule *s = full->sched;
    bool *seen = arena_alloc((size_t)pat->sched->nev + 1);
    for (int j = 0; j < s->nev; j++) {
        int i = map[j];
        if (seen[i])
            continue;
        seen[i] = true;
        if (!(fabs(pat->start_s[i] - full->start_s[j]) <= 1e-12 * scale &&
              fabs(pat->end_s[i] - full->end_s[j]) <= 1e-12 * scale))
            return arena_printf("pattern event %d runs %.17g-%.17g s, full event %d %.17g-%.17g s",
                                i, pat->start_s[i], pat->end_s[i], j, full->start_s[j],
                                full->end_s[j]);
    }
    return NULL;
}

/* What a check found over the policies: how many agreed, the first that
 * did not (malloc'd, to outlive arena_reset), and figures to print. */
typedef struct {
    int tried, agreed, pattern_events, full_events, changed, most_runs;
    double worst;
    char *first_bad;
} Tally;

static void count(Tally *t, const char *why, int k)
{
    t->tried++;
    t->agreed += !why;
    if (why && !t->first_bad)
        t->first_bad = strdup(arena_printf("%s: %s", policy_name(k), why));
}

/* "; first difference: ..." or "" */
static const char *first_bad(const Tally *t)
{
    return t->first_bad ? arena_printf("; first difference: %s", t->first_bad) : "";
}

static bool clusters(SimCluster c[2])
{
    char msg[256];
    c[0] = sim_default_cluster(8);
    if (sim_parse_cluster("h100:nodes=2", &c[1], msg, sizeof msg))
        return true;
    check(false, msg);
    return false;
}

/* The pattern of n micro-batches against the full step under plan p: the
 * first difference, or NULL. */
static const char *against_full_n(Plan *p, int n, const SimCluster cl[2], Tally *t)
{
    Schedule *pat = schedule_build(p, n), *full = schedule_build_full(p, n);
    t->pattern_events = pat->nev, t->full_events = full->nev;
    if (schedule_verify(pat, stderr) || schedule_verify(full, stderr))
        return "a schedule does not verify";
    const char *why;
    int *map = correspond(pat, full, &why);
    for (int64_t w = 8; !why && w >= 3; w -= 5) {
        why = memory_differs(memplan_build(pat, w), memplan_build(full, w), map);
        if (!why && (step_bytes(pat, EV_ALL_GATHER, w) != step_bytes(full, EV_ALL_GATHER, w) ||
                     step_bytes(pat, EV_REDUCE_SCATTER, w) != step_bytes(full, EV_REDUCE_SCATTER, w)))
            why = "bytes per step differ";
        if (why)
            why = arena_printf("world %ld: %s", (long)w, why);
    }
    for (int c = 0; c < 2 && !why; c++) {
        why = time_differs(sim_run(pat, &cl[c]), sim_run(full, &cl[c]), map, &t->worst);
        if (why)
            why = arena_printf("on %ld ranks: %s", (long)cl[c].world, why);
    }
    return why;
}

/* Every policy, planned once (for 4 micro-batches: the plan does not
 * depend on n but through fully_shard auto's search, and any plan will
 * do), at each n. */
static void against_full(const char *path)
{
    static const int ns[] = {1, 2, 3, 4, 7, 12};
    enum { NN = sizeof ns / sizeof ns[0] };
    Tally t[NN] = {{0}};
    SimCluster cl[2];
    if (!clusters(cl))
        return;
    for (int k = 0; k < NPOLICIES; k++) {
        Plan *p = plan_for(path, k, 4);
        for (int q = 0; q < NN; q++)
            count(&t[q], p ? against_full_n(p, ns[q], cl, &t[q]) : "does not plan", k);
        arena_reset();
    }
    for (int q = 0; q < NN; q++) {
        check(t[q].agreed == t[q].tried,
              arena_printf("%s, %d micro-batch%s: %d of %d policies plan the pattern (%d events "
                           "written, %d in full) as the full step: events, live bytes, peak, "
                           "bytes, step time (largest relative difference %.1e)%s",
                           path, ns[q], ns[q] == 1 ? "" : "es", t[q].agreed, t[q].tried,
                           t[q].pattern_events, t[q].full_events, t[q].worst, first_bad(&t[q])));
        free(t[q].first_bad);
    }
}

/* A copy of s where every micro-batch after the first has its first
 * all-gather issued by the micro-batch before it, ahead of that one's last
 * compute op: a prefetch across micro-batches, which schedule.c does not
 * do (and the verifier would refuse; the simulator does not ask). Runs of
 * the middle micro-batch then overlap, and the replay finds its steady
 * state with a collective still running when a run ends. With `straggler`
 * the first micro-batch also ends by issuing its first all-gather again,
 * unwaited, so the middle's first run finds the gather stream busy and
 * leaves a state the first run did not find: the steady state comes a run
 * later. */
static Schedule *prefetch_across(const Schedule *s, bool straggler)
{
    int *insert = arena_alloc(sizeof(int) * (size_t)(s->nev + 1));
    bool *moved = arena_alloc((size_t)s->nev + 1);
    for (int i = 0; i < s->nev; i++)
        insert[i] = -1;
    int prev_start = -1;
    for (int i = 0; i < s->nev;) {
        int end = i;
        while (end < s->nev && s->ev[end].micro == s->ev[i].micro)
            end++;
        if (prev_start >= 0 && s->ev[i].micro >= 0) {
            int ag = i, last = i - 1;
            while (ag < end && s->ev[ag].kind != EV_ALL_GATHER)
                ag++;
            while (last > prev_start && s->ev[last].kind != EV_COMPUTE)
                last--;
            if (ag < end && s->ev[last].kind == EV_COMPUTE) {
                moved[ag] = true;
                insert[last] = ag;
            }
        }
        prev_start = s->ev[i].micro >= 0 ? i : -1;
        i = end;
    }
    Schedule *c = arena_alloc(sizeof *c);
    *c = *s;
    c->nev = 0;
    c->ev = arena_alloc(sizeof(Event) * (size_t)(s->nev + 2));
    int first_ag = -1;
    for (int i = 0; i < s->nev; i++) {
        if (first_ag < 0 && s->ev[i].kind == EV_ALL_GATHER)
            first_ag = i;
        if (straggler && first_ag >= 0 && s->ev[i].micro == 1 && s->ev[i - 1].micro == 0)
            c->ev[c->nev++] = s->ev[first_ag];
        if (insert[i] >= 0) {
            c->ev[c->nev] = s->ev[insert[i]];
            c->ev[c->nev++].micro = s->ev[i].micro;
        }
        if (!moved[i])
            c->ev[c->nev++] = s->ev[i];
    }
    return c;
}

/* The simulator's steady state when collectives run across micro-batch
 * boundaries: the pattern with prefetch_across still replays as the full
 * step with prefetch_across, the prefetch changes the step somewhere (else
 * this would test nothing new), and with a straggler the steady state
 * takes more than one run somewhere. */
static void across_boundaries(const char *path)
{
    static const int ns[] = {4, 7, 12};
    Tally t[2] = {{0}};
    SimCluster cl[2];
    if (!clusters(cl))
        return;
    for (int k = 0; k < NPOLICIES; k++) {
        Plan *p = plan_for(path, k, 4);
        for (size_t q = 0; q < sizeof ns / sizeof ns[0]; q++)
            for (int straggler = 0; straggler <= 1; straggler++) {
                int n = ns[q];
                const char *why = p ? NULL : "does not plan";
                for (int c = 0; c < 2 && !why; c++) {
                    Schedule *plain = schedule_build(p, n);
                    Schedule *pat = prefetch_across(plain, straggler);
                    Schedule *full = prefetch_across(schedule_build_full(p, n), straggler);
                    int *map = correspond(pat, full, &why);
                    if (why)
                        break;
                    Sim *sp = sim_run(pat, &cl[c]);
                    why = time_differs(sp, sim_run(full, &cl[c]), map, &t[straggler].worst);
                    t[straggler].changed += sp->step_s != sim_run(plain, &cl[c])->step_s;
                    if (sp->replayed_runs > t[straggler].most_runs)
                        t[straggler].most_runs = sp->replayed_runs;
                    if (why)
                        why = arena_printf("%d micro-batches on %ld ranks: %s", n,
                                           (long)cl[c].world, why);
                }
                count(&t[straggler], why, k);
            }
        arena_reset();
    }
    for (int straggler = 0; straggler <= 1; straggler++) {
        const Tally *x = &t[straggler];
        check(x->agreed == x->tried && x->changed > 0 && (!straggler || x->most_runs > 1),
              arena_printf("%s: with an all-gather prefetched across micro-batches%s, %d of %d "
                           "policies at 4, 7 and 12 micro-batches simulate the pattern as the "
                           "full step (largest relative difference %.1e; the prefetch moved the "
                           "step in %d of %d replays; steady after %d run%s at most)%s",
                           path, straggler ? " and a straggler" : "", x->agreed, x->tried,
                           x->worst, x->changed, 2 * x->tried, x->most_runs,
                           x->most_runs == 1 ? "" : "s", first_bad(x)));
        free(x->first_bad);
    }
}

/* A copy of s with the events that `drop` marks left out. */
static Schedule *without(const Schedule *s, const bool *drop)
{
    Schedule *c = arena_alloc(sizeof *c);
    *c = *s;
    c->ev = arena_alloc(sizeof(Event) * (size_t)(s->nev + 1));
    c->nev = 0;
    for (int i = 0; i < s->nev; i++)
        if (!drop[i])
            c->ev[c->nev++] = s->ev[i];
    return c;
}

/* Micro-batch 1 keeps the root gathered after its backward and the last
 * micro-batch, finding it gathered, issues no all-gather for it: valid
 * when micro-batch 1 runs once (n = 3), not when it repeats (n = 4, where
 * its second run would gather a gathered group). The verifier must say so
 * for the pattern, at micro-batch 1's end. */
static void unrepeatable_middle(const char *path)
{
    int accepted = -1, refused = -1;
    for (int n = 3; n <= 4; n++) {
        Plan *p = plan_for(path, 0, n);   /* sharded, reshard after backward, prefetch 0 */
        Schedule *s = p ? schedule_build(p, n) : NULL;
        if (!s)
            break;
        int root = -1;
        for (int gi = 0; gi < p->m->ngroups; gi++)
            if (p->m->groups[gi]->is_root)
                root = gi;
        bool *drop = arena_alloc((size_t)s->nev + 1);
        int dropped = 0;
        for (int i = 0; i < s->nev; i++) {
            const Event *e = &s->ev[i];
            if (e->group != root)
                continue;
            if ((e->micro == 1 && e->kind == EV_RESHARD && e->phase == PH_BACKWARD) ||
                (e->micro == n - 1 && e->phase == PH_FORWARD &&
                 (e->kind == EV_ALL_GATHER || e->kind == EV_WAIT_GATHER)))
                drop[i] = true, dropped++;
        }
        if (dropped != 3)
            break;
        int complaints = schedule_verify(without(s, drop), NULL);
        if (n == 3)
            accepted = complaints;
        else
            refused = complaints;
    }
    check(accepted == 0 && refused > 0,
          arena_printf("%s: the root kept gathered from micro-batch 1 into the last verifies "
                       "when micro-batch 1 runs once (%d complaints), not when it repeats (%d)",
                       path, accepted, refused));
    arena_reset();
}

/* A pattern's repeat count must be n - 2, and its micro-batches 0, 1 and
 * n - 1 in that order. */
static void malformed_pattern(const char *path)
{
    Plan *p = plan_for(path, 0, 7);
    Schedule *s = p ? schedule_build(p, 7) : NULL;
    int miscounted = -1, misordered = -1;
    if (s && schedule_verify(s, NULL) == 0) {
        Schedule c = *s;
        c.repeat = 4;
        miscounted = schedule_verify(&c, NULL);
        c = *s;
        c.ev = arena_alloc(sizeof(Event) * (size_t)s->nev);
        memcpy(c.ev, s->ev, sizeof(Event) * (size_t)s->nev);
        for (int i = 0; i < c.nev; i++)
            if (c.ev[i].micro == 6)
                c.ev[i].micro = 5;
        misordered = schedule_verify(&c, NULL);
    }
    check(miscounted > 0 && misordered > 0,
          arena_printf("%s: a pattern of 7 micro-batches repeating micro-batch 1 4 times is "
                       "refused (%d complaints), and so is one whose last is numbered 5 (%d)",
                       path, miscounted, misordered));
    arena_reset();
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        against_full(argv[i]);
        across_boundaries(argv[i]);
        unrepeatable_middle(argv[i]);
        malformed_pattern(argv[i]);
    }
    return unit_report();
}
