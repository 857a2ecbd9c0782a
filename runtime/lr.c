/*
 * lr.c — the learning-rate schedules: the rate of step s of a run of S
 * steps (S is --steps, or the train section's `steps`, also for a resumed
 * run), for peak rate lr (docs/design.md#learning-rate-schedule has the
 * formulas; tests/eval holds them to torch.optim.lr_scheduler step by
 * step).
 *
 * Every schedule may warm up: W steps rising linearly, lr·(s + 1)/W at
 * step s, so the first step already trains and step W − 1 is at lr. What
 * follows the warmup decays over a progress p from 0 to 1 that reaches 1
 * at step S, one step after the last: the last step runs just above
 * min_lr, not at it, so no step is spent at a rate of min_lr = 0 (the
 * convention of PyTorch's CosineAnnealingLR and LinearLR, whose rate
 * reaches its end at their T_max / total_iters).
 *
 *   constant(W)        lr
 *   cosine(W, m)       m + ½(1 + cos πp)·(lr − m)   p = (s − W)/(S − W)
 *   linear(W, m)       m + (1 − p)·(lr − m)          p = (s − W)/(S − W)
 *   wsd(W, f, m)       lr until step E, then linearly down:
 *                      m + (1 − p)·(lr − m)          p = (s − E)/(S − E)
 *                      with D = max(1, round(f·S)) decay steps, E = max(W, S − D)
 *
 * WSD (warmup, stable, decay) is MiniCPM's schedule, decaying linearly here
 * as torchtitan's WSD does by default. A run shorter than its schedule was
 * written for (a smaller --steps) keeps these formulas: a warmup longer
 * than the run never finishes (the rate rises to the last step), and wsd's
 * decay starts no earlier than the warmup's end.
 */
#include "internal.h"

#include <math.h>

/* wsd's decay steps: the fraction f of S, rounded to the nearest, at least 1
 * and at most S (compiler/model.c checks a section's schedule with the same). */
static int64_t decay_steps(double f, int64_t S)
{
    double d = floor(f * (double)S + 0.5);
    return d < 1 ? 1 : d > (double)S ? S : (int64_t)d;
}

/* From lr at p = 0 down to m at p = 1. */
static double linear_down(double lr, double m, double p) { return m + (1 - p) * (lr - m); }

double lr_at(const FsdTrainConfig *c, int64_t s)
{
    const int64_t S = c->steps, W = c->warmup;
    const double lr = c->lr, m = c->min_lr;
    if (s < W)
        return lr * (double)(s + 1) / (double)W;
    if (c->schedule == FSD_LR_CONSTANT || S <= W)
        return lr;
    const double p = (double)(s - W) / (double)(S - W);
    switch (c->schedule) {
    case FSD_LR_COSINE: {
        const double pi = 3.14159265358979323846;
        return m + 0.5 * (1 + cos(pi * p)) * (lr - m);
    }
    case FSD_LR_LINEAR: return linear_down(lr, m, p);
    case FSD_LR_WSD: {
        const int64_t D = decay_steps(c->decay, S), E = S - D > W ? S - D : W;
        return s < E ? lr : linear_down(lr, m, (double)(s - E) / (double)(S - E));
    }
    case FSD_LR_CONSTANT: break;
    }
    return lr;
}

const char *lr_schedule_name(FsdSchedule k)
{
    switch (k) {
    case FSD_LR_CONSTANT: return "constant";
    case FSD_LR_COSINE: return "cosine";
    case FSD_LR_LINEAR: return "linear";
    case FSD_LR_WSD: return "wsd";
    }
    return "unknown";
}
