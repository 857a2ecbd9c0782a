/*
 * eval.c — evaluation: the mean loss over the first K sequences of the
 * validation file (--val-data), after every N-th step's update and after
 * the last (--eval-every N, --eval-sequences K; the train section's
 * eval(every = N, sequences = K)). docs/runtime.md#evaluation is the
 * user's description.
 *
 * The forward is the emitted program's own: FsdModel's eval runs one
 * micro-batch of B sequences through the step's forward schedule — the same
 * all-gathers, prefetches, kernels and reshards after forward — then
 * reshards every group still gathered, and hands each sequence's mean loss
 * (the cross-entropy kernel run on that sequence's rows) to
 * fsdrt_eval_loss_tensor. No gradient buffer, reduce-scatter or optimizer
 * runs, and the arena and unsharded buffers are the step's: evaluation
 * holds at every point what the step's forward holds there or less, so the
 * memory plan's peak covers it.
 *
 * The split, and why the result is the same at any world size, bit for
 * bit: the K sequences are cut into chunks of B consecutive ones (chunk c is
 * sequences c·B … c·B + B − 1; the last may be short), a cut that depends
 * on B alone. Chunk c runs on rank c mod W, in round ⌊c / W⌋; every rank
 * runs every round (the gathers are collective), a rank without a chunk in
 * the last round, or the part of a short chunk beyond K, runs on padding
 * sequences whose losses are dropped. So each sequence's loss is computed
 * by the same kernels on the same B-sequence batch whatever W is, and the
 * kernels are deterministic (templates/README.md). After each round the
 * W·B losses are summed over ranks, each slot being non-zero on one rank
 * only (x + 0 = x exactly, in any order of summation), and every rank adds
 * them into one double, in sequence order. The total is a left fold over
 * sequences 0 … K − 1, the same for every W; its mean is val_loss. Another
 * micro-batch B cuts other chunks, and products of another shape may round
 * differently in the last bits.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void eval_open(FsdRun *r)
{
    const FsdTrainConfig *c = &r->cfg;
    /* --eval-sequences alone would be ignored: the train section's
     * eval(sequences = K) cannot come without `every`, so a K other than
     * the section's is the flag's, asking for an evaluation nothing runs */
    if (c->eval_every <= 0 && c->eval_sequences > 0 &&
        c->eval_sequences != r->m->train.eval_sequences) {
        rt_fail(r, "--eval-sequences %lld asks for an evaluation, but none runs: add "
                   "--eval-every N (evaluate after every N-th step and the last) and --val-data, "
                   "or leave --eval-sequences out",
                (long long)c->eval_sequences);
        return;
    }
    if (c->eval_every <= 0 || c->steps == 0 || r->grad_check)
        return;   /* no step to evaluate after */
    if (!c->val_data) {
        rt_fail(r, "evaluation (--eval-every %lld, or the train section's eval(every = ...)) "
                   "needs validation data: pass --val-data FILE (model %s's train section names "
                   "none), or --eval-every 0",
                (long long)c->eval_every, r->m->name);
        return;
    }
    if (!r->m->eval) {
        rt_fail(r, "--eval-every: this trainer has no evaluation pass (its program was generated "
                   "without one): regenerate it with this fsdpc");
        return;
    }
    const TokenData *f = &r->val;
    if (!f->ready)
        return;   /* data_open failed: its error is the one reported */
    if (c->eval_sequences > f->nseq) {
        rt_fail(r, "validation %s %s holds %lld whole sequences of %lld tokens (%lld tokens), "
                   "fewer than the %lld that --eval-sequences (or the train section's "
                   "eval(sequences = ...)) asks for: pass at most %lld, or %s",
                f->nfiles == 1 ? "file" : "data", f->pattern, (long long)f->nseq,
                (long long)r->m->seq + 1, (long long)f->ntok, (long long)c->eval_sequences,
                (long long)f->nseq, f->nfiles == 1 ? "a longer file" : "more shards");
        return;
    }
    r->eval_k = c->eval_sequences > 0 ? c->eval_sequences : f->nseq;
    r->eval_loss = calloc((size_t)(r->world * c->micro_batch), sizeof *r->eval_loss);
    if (!r->eval_loss)
        rt_fail(r, "out of memory for evaluation's %lld losses",
                (long long)(r->world * c->micro_batch));
}

void eval_free(FsdRun *r)
{
    free(r->eval_loss);
    r->eval_loss = NULL;
    r->eval_k = 0;
}

void fsdrt_eval_loss_tensor(FsdRun *r, int64_t seq, const real *loss)
{
    const int64_t B = r->cfg.micro_batch;
    if (!r->evaluating || seq < 0 || seq >= B)
        RT_BUG(r, "fsdrt_eval_loss_tensor(%lld) outside evaluation's micro-batch of %lld "
                  "sequences",
               (long long)seq, (long long)B);
    /* read on every sequence, padding too: on the GPU the copy waits for
     * the kernels, so the next round's inputs may overwrite the staging
     * buffer this round's copy read */
    real v;
    bk_to_host(r, &v, loss, (int64_t)sizeof v);
    if (r->eval_first >= 0 && r->eval_first + seq < r->eval_k)
        r->eval_loss[(int64_t)r->rank * B + seq] = (double)v;
}

/* One evaluation (collective): the mean loss over sequences 0 … K − 1. */
static double eval_run(FsdRun *r)
{
    const int64_t B = r->cfg.micro_batch, W = r->world, K = r->eval_k;
    const int64_t chunks = (K + B - 1) / B, rounds = (chunks + W - 1) / W;
    double sum = 0;
    r->evaluating = true;
    for (int64_t i = 0; i < rounds; i++) {
        const int64_t chunk = i * W + r->rank, base = i * W * B;
        memset(r->eval_loss, 0, sizeof *r->eval_loss * (size_t)(W * B));
        /* a rank past the last chunk runs chunk 0's sequences, dropped */
        r->eval_first = chunk < chunks ? chunk * B : -1;
        data_load_val(r, chunk < chunks ? chunk * B : 0);
        bk_inputs(r, 0);
        r->m->eval(r);
        bk_allreduce_sum(r, r->eval_loss, (int)(W * B));
        for (int64_t j = base; j < base + W * B && j < K; j++)
            sum += r->eval_loss[j - base];
    }
    r->evaluating = false;
    return sum / (double)K;
}

bool eval_after_step(FsdRun *r, double *loss, double *ms)
{
    const int64_t N = r->cfg.eval_every, done = r->step + 1;
    if (r->eval_k == 0 || !(done % N == 0 || done == r->cfg.steps))
        return false;
    const double t0 = rt_now();
    *loss = eval_run(r);
    *ms = (rt_now() - t0) * 1e3;
    return true;
}

void eval_describe(char *buf, size_t n, bool json, double loss, double ms)
{
    if (!json)
        snprintf(buf, n, " | val_loss %.6f (%.1f ms)", loss, ms);
    else if (isfinite(loss))   /* every digit: runs are compared bit for bit */
        snprintf(buf, n, ", \"val_loss\": %.17g, \"eval_ms\": %.3f", loss, ms);
    else   /* JSON has no NaN */
        snprintf(buf, n, ", \"val_loss\": null, \"eval_ms\": %.3f", ms);
}
