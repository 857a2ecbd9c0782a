/*
 * cross_entropy.h — the loss: softmax cross-entropy of logits against
 * integer targets, averaged over rows (PyTorch's F.cross_entropy with
 * reduction "mean", no ignored index). Needs portable.h.
 *
 * The forward saves the log-sum-exp of every row; the backward reads it
 * to form the softmax without another pass for the max and the sum. The
 * mean is a sum in a fixed order (one worker, in double), so the loss
 * does not depend on the thread count or the launch shape.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

/* lse[r] = log Σ_j exp(logits[r, j]), with the max taken out first. */
DEVICE void cross_entropy_lse_row(int64_t r, int lane, int lanes, real *lse, const real *logits,
                                  int64_t V)
{
    const real *x = logits + r * V;
    real m, s;
    FSD_LANE_MAX(m, j, V, lane, lanes, x[j]);
    m = fsd_warp_max(m);
    FSD_LANE_SUM(s, j, V, lane, lanes, fsd_exp(x[j] - m));
    s = fsd_warp_sum(s);
    if (lane == 0)
        lse[r] = m + fsd_log(s);
}
FSD_ROW_KERNEL(cross_entropy_lse, (real *lse, const real *logits, int64_t V), (lse, logits, V))

/* loss[0] = Σ_r (lse[r] − logits[r, targets[r]]) / rows: one work item,
 * its lanes strided over rows. */
DEVICE void cross_entropy_mean_row(int64_t row, int lane, int lanes, real *loss, const real *lse,
                                   const real *logits, const int32_t *targets, int64_t rows,
                                   int64_t V)
{
    double s = 0;
    for (int64_t r = lane; r < rows; r += lanes) {
        int64_t t = targets[r];
        if (t < 0 || t >= V)
            fsd_trap();
        s += (double)lse[r] - (double)logits[r * V + t];
    }
    s = fsd_warp_sum_f64(s);
    if (lane == 0)
        loss[row] = (real)(s / (double)rows);
}
FSD_ROW_KERNEL(cross_entropy_mean,
               (real *loss, const real *lse, const real *logits, const int32_t *targets,
                int64_t rows, int64_t V),
               (loss, lse, logits, targets, rows, V))

/* cross_entropy_fwd: for logits [rows, V] and targets [rows] (each in
 * [0, V)):
 *   lse[r]  = log Σ_j exp(logits[r, j])                       lse [rows]
 *   loss[0] = (1/rows) Σ_r (lse[r] − logits[r, targets[r]])   loss [1]
 * Both overwritten. */
LAUNCHER void cross_entropy_fwd(real *loss, real *lse, const real *logits,
                                const int32_t *targets, int64_t rows, int64_t V)
{
    FSD_REQUIRE("cross_entropy_fwd", loss && lse && logits && targets);
    FSD_REQUIRE("cross_entropy_fwd", rows > 0 && V > 0);
    fsd_check_indices("cross_entropy_fwd", targets, rows, V);
    FSD_RUN_ROWS(cross_entropy_lse, rows, (lse, logits, V));
    FSD_RUN_ROWS(cross_entropy_mean, 1, (loss, lse, logits, targets, rows, V));
}

DEVICE void cross_entropy_bwd_row(int64_t r, int lane, int lanes, real *dlogits, bool acc,
                                  const real *logits, const int32_t *targets, const real *lse,
                                  int64_t V, real scale)
{
    int64_t t = targets[r];
    if (t < 0 || t >= V)
        fsd_trap();
    real L = lse[r], *d = dlogits + r * V;
    const real *x = logits + r * V;
    /* p·scale everywhere, then the target's (p − 1)·scale rewritten by the
     * lane that owns it, from the old value it read first: the same
     * results, and a loop without the one-hot compare vectorises */
    real old_t = d[t];
    FSD_SIMD
    for (int64_t j = lane; j < V; j += lanes)
        fsd_store(&d[j], fsd_exp(x[j] - L) * scale, acc);
    if (t % lanes == lane) {
        real v = (fsd_exp(x[t] - L) - 1) * scale;
        d[t] = acc ? old_t + v : v;
    }
}
FSD_ROW_KERNEL(cross_entropy_bwd,
               (real *dlogits, bool acc, const real *logits, const int32_t *targets,
                const real *lse, int64_t V, real scale),
               (dlogits, acc, logits, targets, lse, V, scale))

/* cross_entropy_bwd: dlogits[r, j] (+)= (softmax(logits[r])_j − [j = targets[r]]) · scale
 * with the softmax exp(logits − lse). dlogits, logits [rows, V]; targets,
 * lse [rows]. scale is d(total loss)/d(loss of one row), e.g.
 * fsdrt_loss_scale: 1/(B·T·grad_accum). dlogits may be logits (in place). */
LAUNCHER void cross_entropy_bwd(real *dlogits, bool acc, const real *logits,
                                const int32_t *targets, const real *lse, int64_t rows,
                                int64_t V, real scale)
{
    FSD_REQUIRE("cross_entropy_bwd", dlogits && logits && targets && lse);
    FSD_REQUIRE("cross_entropy_bwd", rows > 0 && V > 0);
    fsd_check_indices("cross_entropy_bwd", targets, rows, V);
    FSD_RUN_ROWS(cross_entropy_bwd, rows, (dlogits, acc, logits, targets, lse, V, scale));
}
