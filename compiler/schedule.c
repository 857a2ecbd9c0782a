/*
 * schedule.c — one training step as a list of events on three streams, and
 * the verifier every schedule passes before anything uses it.
 *
 * The schedule is the single source the emitter walks: compute ops in graph
 * order on the compute stream; all-gathers on their own stream, issued
 * ahead of use by `prefetch` groups; reduce-scatters on a third stream,
 * issued as soon as a group's last gradient is written. Waits are the only
 * points where compute depends on communication (docs/design.md#schedule-rules).
 *
 * Per micro-batch:
 *   forward   before the first op reading group g: issue the all-gather of g
 *             (if not yet issued) and of the next prefetch.forward groups,
 *             then wait for g; after the last forward op reading g, free its
 *             unsharded parameters if g reshards after forward.
 *   backward  the same with prefetch.backward, in backward order; gradient
 *             buffers are allocated (zeroed) before a group's first gradient
 *             write; after its last parameter read the group is resharded,
 *             after its last gradient write its reduce-scatter is issued
 *             (every micro-batch when accumulating sharded, the last one when
 *             accumulating unsharded). One reduce-scatter stays in flight:
 *             issuing the next waits the previous and frees its buffer, as
 *             FSDP2 does in its next post-backward. Under replicate = R
 *             each reduce-scatter is followed at once by the all-reduce
 *             of its shard across the R replicas (docs/design.md#hsdp).
 *   with reshard_after_backward = false, nothing is resharded at the end of
 *             a micro-batch but the last: the next one finds its groups
 *             gathered (forward still reshards the groups that reshard
 *             after forward, as FSDP2 does).
 * After the last micro-batch: the global gradient norm, then the optimizer
 * on each group's shard.
 *
 * A step of n micro-batches is written as a pattern, first, middle and
 * last, the middle standing for micro-batches 1 .. n-2 (Schedule.repeat),
 * so nothing downstream grows with grad_accum
 * (docs/compiler.md#the-micro-batch-pattern); schedule_build_full writes
 * every micro-batch, for the tests.
 * Evaluation's schedule (schedule_build_eval) is the forward of a step of
 * one micro-batch, then a reshard of every group still gathered: nothing of
 * backward or the update.
 */
#include "fsdpc.h"

#include <inttypes.h>
#include <string.h>

static const struct {
    const char *name;
    StreamId stream;
} event_table[] = {
#define EV(e, name, stream) {name, stream},
    EVENT_LIST(EV)
#undef EV
};

const char *event_name(EventKind k) { return event_table[k].name; }
StreamId event_stream(EventKind k) { return event_table[k].stream; }

static void emit(Schedule *s, EventKind kind, Phase ph, int micro, int group, OpNode *op)
{
    if (s->nev == s->cap) {
        int cap = s->cap ? s->cap * 2 : 256;
        Event *ev = arena_alloc(sizeof(Event) * (size_t)cap);
        if (s->nev)
            memcpy(ev, s->ev, sizeof(Event) * (size_t)s->nev);
        s->ev = ev;
        s->cap = cap;
    }
    s->ev[s->nev++] = (Event){kind, ph, micro, group, op};
}

bool op_reads_params(const OpNode *op)
{
    for (int i = 0; i < op->nin; i++)
        if (op->in[i]->kind == TK_PARAM)
            return true;
    return false;
}

bool op_writes_grads(const OpNode *op)
{
    for (int i = 0; i < op->nout; i++)
        if (op->out[i]->kind == TK_PGRAD)
            return true;
    return false;
}

typedef struct Builder {
    Schedule *s;
    Plan *p;
    int ngroups;
    bool *issued, *gathered, *grads, *reduced;
    int pending_rs;             /* group whose reduce-scatter is in flight, or -1 */
} Builder;

/* Before op `at` reads group g: issues g's all-gather if it is not gathered
 * or in flight, then prefetches: makes sure the all-gathers of the next
 * `ahead` groups that ops at..end-1 of this phase will read (and that are
 * not gathered) are in flight; then waits for g. */
static void gather(Builder *b, Phase ph, int micro, int g, int at, int end, int ahead)
{
    Graph *gr = b->p->g;
    if (!b->issued[g] && !b->gathered[g]) {
        emit(b->s, EV_ALL_GATHER, ph, micro, g, NULL);
        b->issued[g] = true;
    }
    int *next = arena_alloc(sizeof(int) * (size_t)(ahead + 1)), n = 0;
    for (int i = at; i < end && n < ahead; i++) {
        OpNode *op = gr->ops[i];
        int h = op->group;
        bool dup = false;
        for (int k = 0; k < n; k++)
            dup |= next[k] == h;
        if (h < 0 || h == g || dup || !op_reads_params(op) || b->gathered[h])
            continue;
        next[n++] = h;
        if (!b->issued[h]) {
            emit(b->s, EV_ALL_GATHER, ph, micro, h, NULL);
            b->issued[h] = true;
        }
    }
    if (!b->gathered[g]) {
        emit(b->s, EV_WAIT_GATHER, ph, micro, g, NULL);
        b->issued[g] = false;
        b->gathered[g] = true;
    }
}

static void finish_reduce(Builder *b, int micro)
{
    if (b->pending_rs < 0)
        return;
    emit(b->s, EV_WAIT_REDUCE, PH_BACKWARD, micro, b->pending_rs, NULL);
    emit(b->s, EV_FREE_GRADS, PH_BACKWARD, micro, b->pending_rs, NULL);
    b->grads[b->pending_rs] = false;
    b->pending_rs = -1;
}

/* Each group's last parameter read in forward and in backward, and its
 * last gradient write: op indices, or -1. */
typedef struct LastUse {
    int *fwd, *read, *write;
} LastUse;

static LastUse last_uses(Plan *p)
{
    Graph *g = p->g;
    int G = p->m->ngroups;
    LastUse u = {arena_alloc(sizeof(int) * (size_t)G), arena_alloc(sizeof(int) * (size_t)G),
                 arena_alloc(sizeof(int) * (size_t)G)};
    for (int i = 0; i < G; i++)
        u.fwd[i] = u.read[i] = u.write[i] = -1;
    for (int i = 0; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        if (op->group < 0)
            continue;
        if (op_reads_params(op)) {
            if (!op->backward)
                u.fwd[op->group] = i;
            else
                u.read[op->group] = i;
        }
        if (op_writes_grads(op))
            u.write[op->group] = i;
    }
    return u;
}

/* The forward ops of micro-batch `micro` with their gathers and reshards;
 * `keep`: the next micro-batch finds its groups gathered (below). */
static void forward(Builder *b, int micro, const LastUse *u, bool keep)
{
    Plan *p = b->p;
    Graph *g = p->g;
    Model *m = p->m;
    for (int i = 0; i < g->nfwd; i++) {
        OpNode *op = g->ops[i];
        if (op->group >= 0 && op_reads_params(op))
            gather(b, PH_FORWARD, micro, op->group, i, g->nfwd, p->prefetch_fwd);
        emit(b->s, EV_COMPUTE, PH_FORWARD, micro, -1, op);
        /* free after the last forward read when the group reshards, or when
         * backward never reads its parameters (embeddings) and the next
         * micro-batch does not find them gathered */
        if (op->group >= 0 && u->fwd[op->group] == i &&
            (m->groups[op->group]->reshard || (u->read[op->group] < 0 && !keep))) {
            emit(b->s, EV_RESHARD, PH_FORWARD, micro, op->group, NULL);
            b->gathered[op->group] = false;
        }
    }
}

static void micro_batch(Builder *b, int micro)
{
    Plan *p = b->p;
    Graph *g = p->g;
    Model *m = p->m;
    bool last_micro = micro == b->s->micro_batches - 1;
    bool reduce_now = p->accum == ACCUM_SHARDED || last_micro;
    /* reshard_after_backward = false (FSDP2's set_reshard_after_backward):
     * a group's last read of a micro-batch other than the last frees
     * nothing, so the next micro-batch finds it gathered and issues no
     * all-gather for it. reshard_after_forward still applies in forward, as
     * in FSDP2's post-forward: such a group skips only its forward
     * all-gather of the later micro-batches, the root (kept after forward)
     * is gathered once per step. */
    bool keep = !m->shard.reshard_after_backward && !last_micro;
    LastUse u = last_uses(p);
    forward(b, micro, &u, keep);
    for (int i = g->nfwd; i < g->nops; i++) {
        OpNode *op = g->ops[i];
        int gi = op->group;
        if (gi >= 0 && op_reads_params(op))
            gather(b, PH_BACKWARD, micro, gi, i, g->nops, p->prefetch_bwd);
        if (gi >= 0 && op_writes_grads(op) && !b->grads[gi]) {
            emit(b->s, EV_ALLOC_GRADS, PH_BACKWARD, micro, gi, NULL);
            b->grads[gi] = true;
        }
        emit(b->s, EV_COMPUTE, PH_BACKWARD, micro, -1, op);
        if (gi < 0)
            continue;
        if (u.read[gi] == i && !keep) {
            emit(b->s, EV_RESHARD, PH_BACKWARD, micro, gi, NULL);
            b->gathered[gi] = false;
        }
        if (u.write[gi] == i && reduce_now) {
            emit(b->s, EV_REDUCE_SCATTER, PH_BACKWARD, micro, gi, NULL);
            /* HSDP (FSDP2's 2-D mesh): the shard the reduce-scatter leaves
             * is all-reduced across the replicas, issued at once on the
             * same stream, so its wait is the reduce-scatter's */
            if (m->shard.replicate > 1)
                emit(b->s, EV_ALL_REDUCE, PH_BACKWARD, micro, gi, NULL);
            int prev = b->pending_rs;
            b->pending_rs = gi;
            if (prev >= 0) {
                emit(b->s, EV_WAIT_REDUCE, PH_BACKWARD, micro, prev, NULL);
                emit(b->s, EV_FREE_GRADS, PH_BACKWARD, micro, prev, NULL);
                b->grads[prev] = false;
            }
        }
    }
    finish_reduce(b, micro);
}

static Builder builder(Schedule *s, Plan *p)
{
    size_t G = (size_t)p->m->ngroups;
    return (Builder){s, p, (int)G, arena_alloc(G), arena_alloc(G), arena_alloc(G),
                     arena_alloc(G), -1};
}

/* Writes micro-batches `micros` (step indices, ascending) of a step of
 * n, then the optimizer phase. The builder's state carries from one
 * micro-batch to the next as the step would carry it; skipping the
 * micro-batches between the middle and the last is sound because the
 * middle leaves the state it found (schedule_verify checks it). */
static Schedule *build(Plan *p, int n, const int *micros, int nmicros, int repeat)
{
    Schedule *s = arena_alloc(sizeof *s);
    s->plan = p;
    s->micro_batches = n;
    s->repeat = repeat;
    Builder b = builder(s, p);
    for (int k = 0; k < nmicros; k++)
        micro_batch(&b, micros[k]);
    emit(s, EV_GRAD_NORM, PH_OPTIMIZER, -1, -1, NULL);
    for (int gi = 0; gi < p->m->ngroups; gi++)
        emit(s, EV_OPTIMIZER, PH_OPTIMIZER, -1, p->fwd_order[gi]->index, NULL);
    return s;
}

/* The pattern: micro-batches are alike but for the first (nothing is
 * gathered or allocated yet) and the last (it reduce-scatters what
 * accumulated unsharded, and reshards what reshard_after_backward = false
 * kept). Every micro-batch ends with nothing in flight (each all-gather is
 * waited in the phase that issued it, finish_reduce waits the last
 * reduce-scatter), and its end state depends on the policies and on
 * whether it is the last, not on the state it found, so micro-batches
 * 1 .. n-2 all start from the state micro-batch 0 leaves and run the same
 * events; the last starts from it too. So n = 1 is [only], n = 2
 * [first, last], n >= 3 [first, middle x (n - 2), last]. */
Schedule *schedule_build(Plan *p, int micro_batches)
{
    int n = micro_batches;
    if (n <= 3) {
        int micros[3] = {0, 1, 2};
        return build(p, n, micros, n, 1);
    }
    int micros[3] = {0, 1, n - 1};
    return build(p, n, micros, 3, n - 2);
}

Schedule *schedule_build_full(Plan *p, int micro_batches)
{
    int *micros = arena_alloc(sizeof(int) * (size_t)micro_batches);
    for (int k = 0; k < micro_batches; k++)
        micros[k] = k;
    return build(p, micro_batches, micros, micro_batches, 1);
}

/* Evaluation's micro-batch (docs/runtime.md#evaluation): the forward of a
 * step of one micro-batch, event for event — the same all-gathers,
 * prefetches, waits and reshards after forward — and then a reshard of
 * every group still gathered (those kept for backward: the root, or any
 * group with reshard_after_forward = false), in forward order. Its events
 * are the step's up to the end of its forward, and reshards after, so what
 * it holds at each event is what the step holds there or less: the step's
 * memory plan covers it. */
Schedule *schedule_build_eval(Plan *p)
{
    Schedule *s = arena_alloc(sizeof *s);
    s->plan = p;
    s->micro_batches = 1;
    s->repeat = 1;
    s->forward_only = true;
    Builder b = builder(s, p);
    LastUse u = last_uses(p);
    forward(&b, 0, &u, false);
    for (int k = 0; k < p->m->ngroups; k++) {
        int gi = p->fwd_order[k]->index;
        if (b.gathered[gi])
            emit(s, EV_RESHARD, PH_FORWARD, 0, gi, NULL);
        b.gathered[gi] = false;
    }
    return s;
}

/* ── verifier ──
 * Replays the events with each group's state and checks the rules that make
 * a schedule correct on every rank:
 *   - a parameter is read only while its group is gathered: all-gather
 *     issued and waited, not resharded since;
 *   - a gradient is written only into an allocated buffer whose
 *     reduce-scatter has not been issued yet in this micro-batch;
 *   - a reduce-scatter is issued only after every op writing that group's
 *     gradients in this micro-batch has run, once per micro-batch when
 *     accumulating sharded and once per step otherwise;
 *   - with reshard_after_backward = false, backward reshards nothing
 *     before the last micro-batch;
 *   - under replicate = R > 1 each reduce-scatter is followed by its
 *     replica all-reduce before it is waited for; without it there is none;
 *   - every collective is waited exactly once; every buffer is freed exactly
 *     once and only when it is live; nothing is in flight or live at the end;
 *   - the optimizer runs once per group, after the gradient norm, which runs
 *     after every reduce-scatter was waited;
 *   - the micro-batches come in order, 0 to n - 1, or in a pattern 0, 1 and
 *     n - 1, where micro-batch 1 stands for 1 .. n - 2: then it must leave
 *     every group's state (gathered, gradients allocated, reduce-scatters
 *     in flight) as it found it, so that each repetition replays alike and
 *     checking one checks them all; its reduce-scatters count n - 2 times;
 *   - a recompute op (recompute.c) runs in backward, after the backward
 *     all-gather of each group whose parameters it reads was waited for
 *     (when the group reshards after forward; one that keeps its
 *     parameters is gathered still), and before every op that reads what
 *     it writes.
 *   - a forward-only schedule (schedule_build_eval's) runs every forward op
 *     once and nothing else: no backward op, no gradient buffer, no
 *     reduce-scatter, norm or optimizer.
 * The events name no rank and no data-dependent branch exists, so every
 * rank issues the same collectives in the same order. */
int schedule_verify(Schedule *s, FILE *err)
{
    Plan *p = s->plan;
    Graph *g = p->g;
    Model *m = p->m;
    int G = m->ngroups, bad = 0;
    enum { SHARDED, GATHERING, GATHERED };
    int *pstate = arena_alloc(sizeof(int) * (size_t)G);
    bool *grads = arena_alloc((size_t)G), *rs_flight = arena_alloc((size_t)G);
    bool *rs_done = arena_alloc((size_t)G);   /* this micro-batch's reduce-scatter issued */
    bool *ar_flight = arena_alloc((size_t)G); /* its replica all-reduce issued, not waited */
    int *writes_left = arena_alloc(sizeof(int) * (size_t)G), *writes_total = arena_alloc(sizeof(int) * (size_t)G);
    int *rs_count = arena_alloc(sizeof(int) * (size_t)G), *opt_count = arena_alloc(sizeof(int) * (size_t)G);
    bool *ran = arena_alloc((size_t)g->nops);
    /* the state micro-batch 1 found, to hold its end to when it repeats */
    int *pstate_in = arena_alloc(sizeof(int) * (size_t)G);
    bool *grads_in = arena_alloc((size_t)G), *rs_flight_in = arena_alloc((size_t)G);
    bool *bwd_waited = arena_alloc((size_t)G);   /* backward all-gather waited, this micro-batch */
    bool norm_done = false;
    int micro = -2, want_micro = 0;
    int n = s->micro_batches;
    if (s->repeat != 1 && !(n >= 4 && s->repeat == n - 2)) {
        bad++;
        if (err)
            fprintf(err, "schedule verify: micro-batch 1 repeats %d times in a step of %d; "
                         "expected 1, or n - 2 with n >= 4\n",
                    s->repeat, n);
    }
    for (int i = 0; i < g->nops; i++)
        if (g->ops[i]->group >= 0 && op_writes_grads(g->ops[i]))
            writes_total[g->ops[i]->group]++;

#define BAD(...)                                                                  \
    do {                                                                          \
        bad++;                                                                    \
        if (err) {                                                                \
            fprintf(err, "schedule verify: event %d (%s", i, event_name(e->kind)); \
            if (e->group >= 0)                                                    \
                fprintf(err, " %s", m->groups[e->group]->name);                   \
            if (e->op)                                                            \
                fprintf(err, " op %d %s", e->op->index, op_name(e->op->kind));    \
            fprintf(err, "): ");                                                  \
            fprintf(err, __VA_ARGS__);                                            \
            fputc('\n', err);                                                     \
        }                                                                         \
    } while (0)

    for (int i = 0; i < s->nev; i++) {
        Event *e = &s->ev[i];
        if (e->micro != micro) {
            /* a new micro-batch: every op runs again, every reduce-scatter may be issued again */
            if (micro >= 0)
                for (int k = 0; k < g->nops; k++)
                    if (!ran[k]) {
                        bad++;
                        if (err)
                            fprintf(err, "schedule verify: micro-batch %d never runs op %d (%s)\n",
                                    micro, k, op_name(g->ops[k]->kind));
                    }
            if (micro == 1 && s->repeat > 1)
                for (int k = 0; k < G; k++)
                    if (pstate[k] != pstate_in[k] || grads[k] != grads_in[k] ||
                        rs_flight[k] != rs_flight_in[k])
                        BAD("micro-batch 1 repeats %d times but leaves group %s otherwise "
                            "than it found it",
                            s->repeat, m->groups[k]->name);
            if (e->micro >= 0 && e->micro != want_micro)
                BAD("micro-batch %d follows micro-batch %d; expected %d", e->micro, micro,
                    want_micro);
            if (e->micro < 0 && want_micro != n)
                BAD("the optimizer phase follows micro-batch %d of %d", micro, n);
            micro = e->micro;
            want_micro = micro < 0 ? n : micro == 1 ? 1 + s->repeat : micro + 1;
            if (micro == 1) {
                memcpy(pstate_in, pstate, sizeof(int) * (size_t)G);
                memcpy(grads_in, grads, (size_t)G);
                memcpy(rs_flight_in, rs_flight, (size_t)G);
            }
            memset(ran, 0, (size_t)g->nops);
            for (int k = 0; k < G; k++) {
                rs_done[k] = false;
                bwd_waited[k] = false;
                writes_left[k] = writes_total[k];
            }
        }
        int gi = e->group;
        if (s->forward_only && e->kind != EV_ALL_GATHER && e->kind != EV_WAIT_GATHER &&
            e->kind != EV_RESHARD && e->kind != EV_COMPUTE)
            BAD("a forward-only schedule has no gradients and no optimizer");
        switch (e->kind) {
        case EV_ALL_GATHER:
            if (pstate[gi] != SHARDED)
                BAD("the group is already %s", pstate[gi] == GATHERING ? "being gathered"
                                                                       : "gathered");
            pstate[gi] = GATHERING;
            break;
        case EV_WAIT_GATHER:
            if (pstate[gi] != GATHERING)
                BAD("no all-gather of this group is in flight");
            pstate[gi] = GATHERED;
            bwd_waited[gi] |= e->phase == PH_BACKWARD;
            break;
        case EV_RESHARD:
            if (pstate[gi] != GATHERED)
                BAD("frees parameters that are not gathered (freed twice, or in flight)");
            if (!m->shard.reshard_after_backward && e->phase == PH_BACKWARD &&
                micro != s->micro_batches - 1)
                BAD("reshards before the last micro-batch with reshard_after_backward = false");
            pstate[gi] = SHARDED;
            break;
        case EV_COMPUTE: {
            OpNode *op = e->op;
            if (ran[op->index])
                BAD("runs twice in one micro-batch");
            if (s->forward_only && op->backward)
                BAD("a backward op in a forward-only schedule");
            for (int k = 0; k < op->nin; k++) {
                Tensor *t = op->in[k];
                if (t->producer && !ran[t->producer->index] && t->kind != TK_PGRAD)
                    BAD("reads %s before %sop %d writes it", t->name,
                        t->producer->recompute ? "the recompute " : "", t->producer->index);
                if (t->kind == TK_PARAM && pstate[t->param->group] != GATHERED)
                    BAD("reads %s while group %s is not gathered", t->name,
                        m->groups[t->param->group]->name);
                if (op->recompute && t->kind == TK_PARAM && m->groups[t->param->group]->reshard &&
                    !bwd_waited[t->param->group])
                    BAD("recomputes before the backward all-gather of group %s is waited for",
                        m->groups[t->param->group]->name);
            }
            if (op->recompute && e->phase != PH_BACKWARD)
                BAD("is a recompute op outside backward");
            for (int k = 0; k < op->nout; k++) {
                Tensor *t = op->out[k];
                if (t->kind != TK_PGRAD)
                    continue;
                int h = t->param->group;
                if (!grads[h])
                    BAD("writes %s with no gradient buffer allocated", t->name);
                if (rs_done[h] || rs_flight[h])
                    BAD("writes %s after its group's reduce-scatter was issued", t->name);
            }
            if (op->group >= 0 && op_writes_grads(op))
                writes_left[op->group]--;
            ran[op->index] = true;
            break;
        }
        case EV_ALLOC_GRADS:
            if (grads[gi])
                BAD("allocates a gradient buffer that is already live");
            grads[gi] = true;
            break;
        case EV_REDUCE_SCATTER:
            if (!grads[gi])
                BAD("reduce-scatters a gradient buffer that is not allocated");
            if (writes_left[gi] > 0)
                BAD("issued before %d gradient write%s of this micro-batch", writes_left[gi],
                    writes_left[gi] == 1 ? "" : "s");
            if (rs_flight[gi] || rs_done[gi])
                BAD("issued twice");
            if (p->accum == ACCUM_UNSHARDED && micro != s->micro_batches - 1)
                BAD("issued before the last micro-batch while accumulating unsharded");
            rs_flight[gi] = true;
            rs_done[gi] = true;
            rs_count[gi] += (int)schedule_runs(s, e);
            break;
        case EV_ALL_REDUCE:
            if (m->shard.replicate <= 1)
                BAD("a replica all-reduce without replicate");
            if (!rs_flight[gi])
                BAD("no reduce-scatter of this group is in flight to all-reduce");
            if (ar_flight[gi])
                BAD("issued twice");
            ar_flight[gi] = true;
            break;
        case EV_WAIT_REDUCE:
            if (!rs_flight[gi])
                BAD("no reduce-scatter of this group is in flight");
            if (m->shard.replicate > 1 && !ar_flight[gi])
                BAD("waits before the replica all-reduce of this group is issued");
            rs_flight[gi] = false;
            ar_flight[gi] = false;
            break;
        case EV_FREE_GRADS:
            if (!grads[gi])
                BAD("frees a gradient buffer that is not live");
            if (rs_flight[gi])
                BAD("frees the gradient buffer while its reduce-scatter is in flight");
            if (!rs_done[gi])
                BAD("frees gradients that were never reduce-scattered");
            grads[gi] = false;
            break;
        case EV_GRAD_NORM:
            for (int k = 0; k < G; k++)
                if (rs_flight[k] || grads[k])
                    BAD("group %s still has gradients in flight or unreduced",
                        m->groups[k]->name);
            norm_done = true;
            break;
        case EV_OPTIMIZER:
            if (!norm_done)
                BAD("runs before the gradient norm");
            opt_count[gi]++;
            break;
        case EV_COUNT:
            fsd_unreachable();
        }
    }
    int i = s->nev;
    Event end = {EV_OPTIMIZER, PH_OPTIMIZER, -1, -1, NULL}, *e = &end;
    if (s->forward_only) {
        for (int k = 0; k < g->nfwd; k++)
            if (!ran[k])
                BAD("the forward never runs op %d (%s)", k, op_name(g->ops[k]->kind));
        for (int k = 0; k < G; k++)
            if (pstate[k] != SHARDED)
                BAD("group %s still holds unsharded parameters at the end", m->groups[k]->name);
        return bad;
    }
    for (int k = 0; k < G; k++) {
        ShardGroup *sg = m->groups[k];
        int want_rs = writes_total[k] == 0 ? 0
                      : p->accum == ACCUM_SHARDED ? s->micro_batches
                                                  : 1;
        if (pstate[k] != SHARDED)
            BAD("group %s still holds unsharded parameters at the end", sg->name);
        if (grads[k] || rs_flight[k])
            BAD("group %s still holds gradients at the end", sg->name);
        if (rs_count[k] != want_rs)
            BAD("group %s is reduce-scattered %d times; expected %d", sg->name, rs_count[k],
                want_rs);
        if (opt_count[k] != 1)
            BAD("the optimizer runs %d times on group %s", opt_count[k], sg->name);
    }
#undef BAD
    return bad;
}

/* ── dumps ── */

int64_t event_comm_bytes(const Schedule *s, const Event *e, int64_t world)
{
    Model *m = s->plan->m;
    if (e->kind != EV_ALL_GATHER && e->kind != EV_REDUCE_SCATTER && e->kind != EV_ALL_REDUCE)
        return 0;
    /* a ring all-gather or reduce-scatter moves (S-1)/S of the padded
     * buffer through every rank of the shard group of S; a ring all-reduce
     * across R replicas 2(R-1)/R of the shard (nccl-tests' busBw
     * convention, docs/performance.md) */
    ShardGroup *sg = m->groups[e->group];
    int64_t padded = plan_padded_numel(sg, world), shard = plan_shard_numel(sg, world);
    if (e->kind == EV_ALL_REDUCE) {
        int64_t R = m->shard.replicate;
        return 2 * (R - 1) * shard / R * dtype_bytes(sg->reduce_dtype);
    }
    DType dt = e->kind == EV_ALL_GATHER ? sg->param_dtype : sg->reduce_dtype;
    return (padded - shard) * dtype_bytes(dt);
}

const char *event_mesh_dim(const Schedule *s, const Event *e)
{
    (void)s;
    switch (e->kind) {
    case EV_ALL_GATHER:
    case EV_REDUCE_SCATTER:
        return "shard";
    case EV_ALL_REDUCE:
        return "replicate";
    default:
        return NULL;
    }
}

static const char *const phase_names[] = {"forward", "backward", "optimizer"};
static const char *const stream_names[] = {"compute", "gather", "reduce"};

static const char *event_what(const Schedule *s, const Event *e)
{
    if (e->op) {
        const OpNode *op = e->op;
        return arena_printf("%d %s%s %s", op->index, op->recompute ? "recompute " : "",
                            op_name(op->kind),
                            op->layer && op->layer->path[0] ? op->layer->path : "");
    }
    return "";
}

void schedule_dump(FILE *out, Schedule *s, int64_t world, MemPlan *mp)
{
    Plan *p = s->plan;
    Model *m = p->m;
    int64_t total[3] = {0, 0, 0}, per_step = 0;
    for (int i = 0; i < s->nev; i++) {
        Event *e = &s->ev[i];
        if (e->kind == EV_ALL_GATHER || e->kind == EV_REDUCE_SCATTER || e->kind == EV_ALL_REDUCE)
            total[e->kind == EV_ALL_GATHER ? 0 : e->kind == EV_REDUCE_SCATTER ? 1 : 2] +=
                event_comm_bytes(s, e, world) * schedule_runs(s, e);
        per_step += schedule_runs(s, e);
    }
    if (s->repeat == 1)
        fprintf(out, "schedule %s for world %" PRId64 ": %d events, %d micro-batch%s of %" PRId64
                     "\n",
                m->name, world, s->nev, s->micro_batches, s->micro_batches == 1 ? "" : "es",
                p->micro_batch);
    else
        fprintf(out, "schedule %s for world %" PRId64 ": %d events written for %" PRId64
                     " a step, %d micro-batches of %" PRId64 "\n"
                     "  micro-batches 1 to %d run the same events: written once, as "
                     "micro-batch 1 (x %d)\n",
                m->name, world, s->nev, per_step, s->micro_batches, p->micro_batch,
                s->micro_batches - 2, s->repeat);
    fprintf(out, "  per rank per step: all-gather %s bytes, reduce-scatter %s bytes\n",
            fmt_count(total[0]), fmt_count(total[1]));
    /* the mesh, only under HSDP, so that other schedules' dumps keep their form */
    if (m->shard.replicate > 1)
        fprintf(out, "  mesh: replicate %" PRId64 " x shard %" PRId64 " (replica r = ranks r*%"
                     PRId64 " .. r*%" PRId64 "+%" PRId64 "); all-gathers and reduce-scatters "
                     "over shard, replica all-reduce %s bytes over replicate\n",
                m->shard.replicate, plan_shard_world(m, world), plan_shard_world(m, world),
                plan_shard_world(m, world), plan_shard_world(m, world) - 1, fmt_count(total[2]));
    if (!m->shard.reshard_after_backward)
        fputs("  reshard_after_backward = false: groups stay gathered between micro-batches\n",
              out);
    fprintf(out, "\n%6s  %-9s %3s  %-8s %-15s %-18s %-40s %14s%s\n", "#", "phase", "mb", "stream",
            "event", "group", "op", "bytes/rank", mp ? "   live bytes" : "");
    for (int i = 0; i < s->nev; i++) {
        Event *e = &s->ev[i];
        if (s->repeat > 1 && e->micro >= 0 && (i == 0 || s->ev[i - 1].micro != e->micro))
            fprintf(out, "%6s  %s\n", "",
                    e->micro == 0   ? "micro-batch 0, the first"
                    : e->micro == 1 ? arena_printf("micro-batch 1, run x %d: micro-batches 1 "
                                                   "to %d, alike",
                                                   s->repeat, s->micro_batches - 2)
                                    : arena_printf("micro-batch %d, the last", e->micro));
        fprintf(out, "%6d  %-9s ", i, phase_names[e->phase]);
        if (e->micro >= 0)
            fprintf(out, "%3d", e->micro);
        else
            fputs("  -", out);
        fprintf(out, "  %-8s %-15s %-18s %-40s %14s", stream_names[event_stream(e->kind)],
                event_name(e->kind), e->group >= 0 ? m->groups[e->group]->name : "-",
                event_what(s, e), fmt_count(event_comm_bytes(s, e, world)));
        if (mp)
            fprintf(out, " %14s", fmt_count(mp->live_after[i]));
        fputc('\n', out);
    }
}

void schedule_dump_json(FILE *out, Schedule *s, int64_t world, MemPlan *mp)
{
    Plan *p = s->plan;
    Model *m = p->m;
    fprintf(out, "{\"model\": \"%s\", \"world\": %" PRId64 ", \"micro_batches\": %d, "
                 "\"micro_batch\": %" PRId64 ", \"repeat\": %d,\n \"groups\": [",
            m->name, world, s->micro_batches, p->micro_batch, s->repeat);
    for (int i = 0; i < m->ngroups; i++)
        fprintf(out, "%s\"%s\"", i ? ", " : "", m->groups[i]->name);
    fputs("],\n \"events\": [\n", out);
    for (int i = 0; i < s->nev; i++) {
        Event *e = &s->ev[i];
        fprintf(out, "  {\"i\": %d, \"phase\": \"%s\", \"micro\": %d, \"stream\": \"%s\", "
                     "\"event\": \"%s\", \"group\": ",
                i, phase_names[e->phase], e->micro, stream_names[event_stream(e->kind)],
                event_name(e->kind));
        if (e->group >= 0)
            fprintf(out, "\"%s\"", m->groups[e->group]->name);
        else
            fputs("null", out);
        if (e->op)
            fprintf(out, ", \"op\": %d, \"op_kind\": \"%s\", \"layer\": \"%s\"%s", e->op->index,
                    op_name(e->op->kind), e->op->layer ? e->op->layer->path : "",
                    e->op->recompute ? ", \"recompute\": true" : "");
        fprintf(out, ", \"bytes\": %" PRId64 ", \"runs\": %" PRId64,
                event_comm_bytes(s, e, world), schedule_runs(s, e));
        if (m->shard.replicate > 1 && event_mesh_dim(s, e))
            fprintf(out, ", \"mesh\": \"%s\"", event_mesh_dim(s, e));
        if (mp)
            fprintf(out, ", \"live\": %" PRId64, mp->live_after[i]);
        fprintf(out, "}%s\n", i + 1 < s->nev ? "," : "");
    }
    fputs(" ]\n}\n", out);
}
