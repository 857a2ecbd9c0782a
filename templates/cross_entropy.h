/*
 * cross_entropy.h — the loss: softmax cross-entropy of logits against
 * integer targets, averaged over rows (PyTorch's F.cross_entropy with
 * reduction "mean", no ignored index). Needs portable.h.
 *
 * The forward saves the log-sum-exp of every row; the backward reads it
 * to form the softmax without another pass for the max and the sum. The
 * mean is a sum in a fixed order (one worker, in double), so the loss
 * does not depend on the thread count or the launch shape.
 *
 * On the GPU the rows' kernels have 16-byte vector versions (X_v, portable.h's
 * FSD_VEC), taken when V is a multiple of FSD_VEC and the logits (and
 * dlogits) 16-byte aligned: the backward gives the scalar kernel's bits; the
 * forward's log-sum-exp adds the lanes' shares in another fixed order
 * (FSD_VEC_LANES), so lse may differ from the scalar kernel's in the last
 * bits.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

/* lse[r] = log Σ_j exp(logits[r, j]), with the max taken out first. */
DEVICE void cross_entropy_lse_row(int64_t r, int lane, int lanes, real *lse, const act *logits,
                                  int64_t V)
{
    const act *x = logits + r * V;
    real m, s;
    FSD_LANE_MAX(m, j, V, lane, lanes, fsd_wide(x[j]));
    m = fsd_warp_max(m);
    FSD_LANE_SUM(s, j, V, lane, lanes, fsd_exp(fsd_wide(x[j]) - m));
    s = fsd_warp_sum(s);
    if (lane == 0)
        lse[r] = m + fsd_log(s);
}
FSD_ROW_KERNEL(cross_entropy_lse, (real *lse, const act *logits, int64_t V), (lse, logits, V))

#ifdef FSD_VEC
DEVICE void cross_entropy_lse_v_row(int64_t r, int lane, int lanes, real *lse, const act *logits,
                                    int64_t V)
{
    const act *x = logits + r * V;
    real m = -INFINITY, s = 0;
    FSD_VEC_LANES(j, V, lane, lanes) {
        fsd_vec vx = fsd_vload(x + j);
        FSD_VEC_FOR(k)
            m = fsd_fmax(m, fsd_wide(vx.a[k]));
    }
    m = fsd_warp_max(m);
    FSD_VEC_LANES(j, V, lane, lanes) {
        fsd_vec vx = fsd_vload(x + j);
        FSD_VEC_FOR(k)
            s += fsd_exp(fsd_wide(vx.a[k]) - m);
    }
    s = fsd_warp_sum(s);
    if (lane == 0)
        lse[r] = m + fsd_log(s);
}
FSD_ROW_KERNEL(cross_entropy_lse_v, (real *lse, const act *logits, int64_t V), (lse, logits, V))
#endif

/* loss[0] = Σ_r (lse[r] − logits[r, targets[r]]) / rows: one work item,
 * its lanes strided over rows. */
DEVICE void cross_entropy_mean_row(int64_t row, int lane, int lanes, real *loss, const real *lse,
                                   const act *logits, const int32_t *targets, int64_t rows,
                                   int64_t V)
{
    double s = 0;
    for (int64_t r = lane; r < rows; r += lanes) {
        int64_t t = targets[r];
        if (t < 0 || t >= V)
            fsd_trap();
        s += (double)lse[r] - (double)fsd_wide(logits[r * V + t]);
    }
    s = fsd_warp_sum_f64(s);
    if (lane == 0)
        loss[row] = (real)(s / (double)rows);
}
FSD_ROW_KERNEL(cross_entropy_mean,
               (real *loss, const real *lse, const act *logits, const int32_t *targets,
                int64_t rows, int64_t V),
               (loss, lse, logits, targets, rows, V))

/* cross_entropy_fwd: for logits [rows, V] and targets [rows] (each in
 * [0, V)):
 *   lse[r]  = log Σ_j exp(logits[r, j])                       lse [rows]
 *   loss[0] = (1/rows) Σ_r (lse[r] − logits[r, targets[r]])   loss [1]
 * Both overwritten. */
LAUNCHER void cross_entropy_fwd(real *loss, real *lse, const act *logits,
                                const int32_t *targets, int64_t rows, int64_t V)
{
    FSD_REQUIRE("cross_entropy_fwd", loss && lse && logits && targets);
    FSD_REQUIRE("cross_entropy_fwd", rows > 0 && V > 0);
    fsd_check_indices("cross_entropy_fwd", targets, rows, V);
    if (FSD_VEC_WHEN(V % FSD_VEC == 0 && fsd_al16(logits)))
        FSD_RUN_VEC_ROWS(cross_entropy_lse_v, rows, V, (lse, logits, V));
    else
        FSD_RUN_ROWS(cross_entropy_lse, rows, V, (lse, logits, V));
    /* one row, nothing to share: width 0 keeps the CPU from opening a region */
    FSD_RUN_ROWS(cross_entropy_mean, 1, 0, (loss, lse, logits, targets, rows, V));
}

DEVICE void cross_entropy_bwd_row(int64_t r, int lane, int lanes, act *dlogits, bool acc,
                                  const act *logits, const int32_t *targets, const real *lse,
                                  int64_t V, real scale)
{
    int64_t t = targets[r];
    if (t < 0 || t >= V)
        fsd_trap();
    real L = lse[r];
    act *d = dlogits + r * V;
    const act *x = logits + r * V;
    /* p·scale everywhere, then the target's (p − 1)·scale rewritten by the
     * lane that owns it: the same results, and a loop without the one-hot
     * compare vectorises. The target's value is formed first, from its
     * logit and old value, which the loop overwrites in place. */
    real v = (fsd_exp(fsd_wide(x[t]) - L) - 1) * scale;
    real d_t = acc ? fsd_wide(d[t]) + v : v;
    FSD_SIMD
    for (int64_t j = lane; j < V; j += lanes)
        fsd_store(&d[j], fsd_exp(fsd_wide(x[j]) - L) * scale, acc);
    if (t % lanes == lane)
        d[t] = fsd_narrow(d_t);
}
FSD_ROW_KERNEL(cross_entropy_bwd,
               (act *dlogits, bool acc, const act *logits, const int32_t *targets,
                const real *lse, int64_t V, real scale),
               (dlogits, acc, logits, targets, lse, V, scale))

#ifdef FSD_VEC
/* the same by vectors; the target's element is rewritten by the lane whose
 * vector holds it, after that vector's store */
DEVICE void cross_entropy_bwd_v_row(int64_t r, int lane, int lanes, act *dlogits, bool acc,
                                    const act *logits, const int32_t *targets, const real *lse,
                                    int64_t V, real scale)
{
    int64_t t = targets[r];
    if (t < 0 || t >= V)
        fsd_trap();
    real L = lse[r];
    act *d = dlogits + r * V;
    const act *x = logits + r * V;
    real v = (fsd_exp(fsd_wide(x[t]) - L) - 1) * scale;
    real d_t = acc ? fsd_wide(d[t]) + v : v;
    FSD_VEC_LANES(j, V, lane, lanes) {
        fsd_vec vx = fsd_vload(x + j), vd = fsd_vload_acc(d + j, acc);
        FSD_VEC_FOR(k)
            fsd_store(&vd.a[k], fsd_exp(fsd_wide(vx.a[k]) - L) * scale, acc);
        fsd_vstore(d + j, vd);
    }
    if (t / FSD_VEC % lanes == lane)
        d[t] = fsd_narrow(d_t);
}
FSD_ROW_KERNEL(cross_entropy_bwd_v,
               (act *dlogits, bool acc, const act *logits, const int32_t *targets,
                const real *lse, int64_t V, real scale),
               (dlogits, acc, logits, targets, lse, V, scale))
#endif

/* cross_entropy_bwd: dlogits[r, j] (+)= (softmax(logits[r])_j − [j = targets[r]]) · scale
 * with the softmax exp(logits − lse). dlogits, logits [rows, V]; targets,
 * lse [rows]. scale is d(total loss)/d(loss of one row), e.g.
 * fsdrt_loss_scale: 1/(B·T·grad_accum). dlogits may be logits (in place). */
LAUNCHER void cross_entropy_bwd(act *dlogits, bool acc, const act *logits,
                                const int32_t *targets, const real *lse, int64_t rows,
                                int64_t V, real scale)
{
    FSD_REQUIRE("cross_entropy_bwd", dlogits && logits && targets && lse);
    FSD_REQUIRE("cross_entropy_bwd", rows > 0 && V > 0);
    fsd_check_indices("cross_entropy_bwd", targets, rows, V);
    if (FSD_VEC_WHEN(V % FSD_VEC == 0 && fsd_al16(dlogits) && fsd_al16(logits)))
        FSD_RUN_VEC_ROWS(cross_entropy_bwd_v, rows, V, (dlogits, acc, logits, targets, lse, V, scale));
    else
        FSD_RUN_ROWS(cross_entropy_bwd, rows, V, (dlogits, acc, logits, targets, lse, V, scale));
}
