/*
 * norm.h — LayerNorm and RMSNorm over the last dimension, forward and
 * backward, with PyTorch's semantics: biased variance, eps inside the
 * square root. The forward saves per-row statistics (mean and rstd, or
 * rstd) that the backward reads instead of recomputing them. The fused
 * forwards add_layernorm_fwd and add_rmsnorm_fwd (compiler/fuse.c) form the
 * residual sum a + b of a row first and normalise it in the same kernel.
 * Needs portable.h.
 *
 * On the GPU every row kernel here, and the parameter gradients' column
 * sums, have 16-byte vector versions (X_v, portable.h's FSD_VEC), taken when
 * C is a multiple of FSD_VEC and the row tensors and w, b are 16-byte
 * aligned. Their elementwise parts and column sums are the scalar kernels'
 * operations; their row sums (mean, variance, the backward's two) add the
 * lanes' shares in another fixed order (FSD_VEC_LANES), so the statistics
 * and what depends on them may differ from the scalar kernels' in the last
 * bits, the same for every launch of a shape. A fused norm takes the vector
 * path exactly when the plain norm would on its sum (a and b need not be
 * aligned: they are then read element by element), so fused and unfused
 * keep giving the same bits.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

/* ── the fused residual add ── */

/* sum[r, :] = a[r, :] + b[r, :], rounded to act as add_fwd rounds it, for a
 * fused norm to normalise next: the norm then reads the stored (rounded)
 * sum, exactly what an unfused norm reads back after add_fwd, so fused and
 * unfused give the same bits in every build. Each lane reads back only the
 * elements it stored itself (the norms' loops stride by lane alike), so no
 * synchronisation is needed, and the re-reads hit the cache the stores just
 * filled: the sum is not read from memory again, as a separate norm kernel
 * would. */
DEVICE void add_norm_row(int64_t r, int lane, int lanes, act *sum, const act *a, const act *b,
                         int64_t C)
{
    FSD_SIMD
    for (int64_t j = lane; j < C; j += lanes)
        sum[r * C + j] = fsd_narrow(fsd_wide(a[r * C + j]) + fsd_wide(b[r * C + j]));
}

#ifdef FSD_VEC
/* add_norm_row by vectors, in the lanes' vectors that the vector norms read
 * back; a and b by vectors when ab_vec (both aligned), else element by
 * element */
DEVICE void add_norm_v_row(int64_t r, int lane, int lanes, act *sum, const act *a, const act *b,
                           int64_t C, bool ab_vec)
{
    FSD_VEC_LANES(j, C, lane, lanes) {
        const int64_t i = r * C + j;
        fsd_vec va, vb, vs = fsd_vzero();
        if (ab_vec) {
            va = fsd_vload(a + i);
            vb = fsd_vload(b + i);
        } else {
            FSD_VEC_FOR(k) {
                va.a[k] = a[i + k];
                vb.a[k] = b[i + k];
            }
        }
        FSD_VEC_FOR(k)
            vs.a[k] = fsd_narrow(fsd_wide(va.a[k]) + fsd_wide(vb.a[k]));
        fsd_vstore(sum + i, vs);
    }
}
#endif

/* ── LayerNorm ── */

/* layernorm_fwd: per row r of x [rows, C]:
 *   mean[r] = Σ_j x[r,j] / C
 *   rstd[r] = 1 / sqrt(Σ_j (x[r,j] − mean[r])² / C + eps)
 *   y[r,j]  = (x[r,j] − mean[r]) · rstd[r] · w[j] + b[j]
 *   y [rows, C], mean [rows], rstd [rows], w [C], b [C]; b NULL: no bias
 *   (LayerNorm(dim, bias = false): the + b[j] is left out, not added as 0,
 *   and every launcher below takes NULL for b, add_layernorm_fwd's bias
 *   and layernorm_bwd's db alike). */
DEVICE void layernorm_fwd_row(int64_t r, int lane, int lanes, act *y, real *mean, real *rstd,
                              const act *x, const act *w, const act *b, int64_t C, real eps)
{
    const act *xr = x + r * C;
    real s, v;
    FSD_LANE_SUM(s, j, C, lane, lanes, fsd_wide(xr[j]));
    real m = fsd_warp_sum(s) / (real)C;
    /* two passes: no cancellation when |mean| >> std */
    FSD_LANE_SUM(v, j, C, lane, lanes, (fsd_wide(xr[j]) - m) * (fsd_wide(xr[j]) - m));
    real rs = 1 / fsd_sqrt(fsd_warp_sum(v) / (real)C + eps);
    /* one loop each way, so the CPU's vectorised loop holds no branch */
    if (b) {
        FSD_SIMD
        for (int64_t j = lane; j < C; j += lanes)
            y[r * C + j] =
                fsd_narrow((fsd_wide(xr[j]) - m) * rs * fsd_wide(w[j]) + fsd_wide(b[j]));
    } else {
        FSD_SIMD
        for (int64_t j = lane; j < C; j += lanes)
            y[r * C + j] = fsd_narrow((fsd_wide(xr[j]) - m) * rs * fsd_wide(w[j]));
    }
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}
FSD_ROW_KERNEL(layernorm_fwd,
               (act *y, real *mean, real *rstd, const act *x, const act *w, const act *b,
                int64_t C, real eps),
               (y, mean, rstd, x, w, b, C, eps))

#ifdef FSD_VEC
DEVICE void layernorm_fwd_v_row(int64_t r, int lane, int lanes, act *y, real *mean, real *rstd,
                                const act *x, const act *w, const act *b, int64_t C, real eps)
{
    const act *xr = x + r * C;
    real s = 0, v = 0;
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vx = fsd_vload(xr + j);
        FSD_VEC_FOR(k)
            s += fsd_wide(vx.a[k]);
    }
    real m = fsd_warp_sum(s) / (real)C;
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vx = fsd_vload(xr + j);
        FSD_VEC_FOR(k)
            v += (fsd_wide(vx.a[k]) - m) * (fsd_wide(vx.a[k]) - m);
    }
    real rs = 1 / fsd_sqrt(fsd_warp_sum(v) / (real)C + eps);
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vx = fsd_vload(xr + j), vw = fsd_vload(w + j), vy = fsd_vzero();
        if (b) {
            fsd_vec vb = fsd_vload(b + j);
            FSD_VEC_FOR(k)
                vy.a[k] = fsd_narrow((fsd_wide(vx.a[k]) - m) * rs * fsd_wide(vw.a[k]) +
                                     fsd_wide(vb.a[k]));
        } else {
            FSD_VEC_FOR(k)
                vy.a[k] = fsd_narrow((fsd_wide(vx.a[k]) - m) * rs * fsd_wide(vw.a[k]));
        }
        fsd_vstore(y + r * C + j, vy);
    }
    if (lane == 0) {
        mean[r] = m;
        rstd[r] = rs;
    }
}
FSD_ROW_KERNEL(layernorm_fwd_v,
               (act *y, real *mean, real *rstd, const act *x, const act *w, const act *b,
                int64_t C, real eps),
               (y, mean, rstd, x, w, b, C, eps))
#endif

/* whether a norm's rows [rows, C] x and y and its parameters w, b fit the
 * vector kernels (a NULL b is aligned) */
#define FSD_NORM_VEC(C, x, y, w, b) \
    FSD_VEC_WHEN((C) % FSD_VEC == 0 && fsd_al16(x) && fsd_al16(y) && fsd_al16(w) && fsd_al16(b))

LAUNCHER void layernorm_fwd(act *y, real *mean, real *rstd, const act *x, const act *w,
                            const act *b, int64_t rows, int64_t C, real eps)
{
    FSD_REQUIRE("layernorm_fwd", y && mean && rstd && x && w);
    FSD_REQUIRE("layernorm_fwd", rows > 0 && C > 0 && eps >= 0);
    if (FSD_NORM_VEC(C, x, y, w, b))
        FSD_RUN_VEC_ROWS(layernorm_fwd_v, rows, C, (y, mean, rstd, x, w, b, C, eps));
    else
        FSD_RUN_ROWS(layernorm_fwd, rows, C, (y, mean, rstd, x, w, b, C, eps));
}

/* add_layernorm_fwd: sum = a + b, then layernorm_fwd of sum (y, mean, rstd):
 * the residual add and the norm that reads it, in one pass over the row.
 * sum, a, b [rows, C]; the rest as layernorm_fwd (bias NULL: none). */
DEVICE void add_layernorm_fwd_row(int64_t r, int lane, int lanes, act *sum, act *y, real *mean,
                                  real *rstd, const act *a, const act *b, const act *w,
                                  const act *bias, int64_t C, real eps)
{
    add_norm_row(r, lane, lanes, sum, a, b, C);
    layernorm_fwd_row(r, lane, lanes, y, mean, rstd, sum, w, bias, C, eps);
}
FSD_ROW_KERNEL(add_layernorm_fwd,
               (act *sum, act *y, real *mean, real *rstd, const act *a, const act *b,
                const act *w, const act *bias, int64_t C, real eps),
               (sum, y, mean, rstd, a, b, w, bias, C, eps))

#ifdef FSD_VEC
DEVICE void add_layernorm_fwd_v_row(int64_t r, int lane, int lanes, act *sum, act *y, real *mean,
                                    real *rstd, const act *a, const act *b, const act *w,
                                    const act *bias, int64_t C, real eps, bool ab_vec)
{
    add_norm_v_row(r, lane, lanes, sum, a, b, C, ab_vec);
    layernorm_fwd_v_row(r, lane, lanes, y, mean, rstd, sum, w, bias, C, eps);
}
FSD_ROW_KERNEL(add_layernorm_fwd_v,
               (act *sum, act *y, real *mean, real *rstd, const act *a, const act *b,
                const act *w, const act *bias, int64_t C, real eps, bool ab_vec),
               (sum, y, mean, rstd, a, b, w, bias, C, eps, ab_vec))
#endif

LAUNCHER void add_layernorm_fwd(act *sum, act *y, real *mean, real *rstd, const act *a,
                                const act *b, const act *w, const act *bias, int64_t rows,
                                int64_t C, real eps)
{
    FSD_REQUIRE("add_layernorm_fwd", sum && y && mean && rstd && a && b && w);
    FSD_REQUIRE("add_layernorm_fwd", rows > 0 && C > 0 && eps >= 0);
    if (FSD_NORM_VEC(C, sum, y, w, bias))
        FSD_RUN_VEC_ROWS(add_layernorm_fwd_v, rows, C,
                         (sum, y, mean, rstd, a, b, w, bias, C, eps, fsd_al16(a) && fsd_al16(b)));
    else
        FSD_RUN_ROWS(add_layernorm_fwd, rows, C, (sum, y, mean, rstd, a, b, w, bias, C, eps));
}

/* layernorm_bwd: with x̂ = (x − mean) · rstd and g = dy · w,
 *   dx[r,j] (+)= rstd[r] · (g[r,j] − Σ_k g[r,k] / C − x̂[r,j] · Σ_k g[r,k] x̂[r,k] / C)
 *   dw[j]   +=  Σ_r dy[r,j] · x̂[r,j]
 *   db[j]   +=  Σ_r dy[r,j]
 * dx accumulates when acc; dw and db always accumulate (parameter
 * gradients). dx, dy, x [rows, C]; dw, db, w [C]; mean, rstd [rows]. db
 * NULL: the norm has no bias (the bias does not enter dx or dw, so the rest
 * is the same). */
DEVICE void layernorm_bwd_row(int64_t r, int lane, int lanes, act *dx, bool acc, const act *dy,
                              const act *x, const act *w, const real *mean, const real *rstd,
                              int64_t C)
{
    const act *dyr = dy + r * C, *xr = x + r * C;
    real m = mean[r], rs = rstd[r], sg, sgx;
    FSD_LANE_SUM(sg, j, C, lane, lanes, fsd_wide(dyr[j]) * fsd_wide(w[j]));
    FSD_LANE_SUM(sgx, j, C, lane, lanes,
                 fsd_wide(dyr[j]) * fsd_wide(w[j]) * (fsd_wide(xr[j]) - m) * rs);
    sg = fsd_warp_sum(sg) / (real)C;
    sgx = fsd_warp_sum(sgx) / (real)C;
    FSD_SIMD
    for (int64_t j = lane; j < C; j += lanes)
        fsd_store(&dx[r * C + j],
                  rs * (fsd_wide(dyr[j]) * fsd_wide(w[j]) - sg - (fsd_wide(xr[j]) - m) * rs * sgx),
                  acc);
}
FSD_ROW_KERNEL(layernorm_bwd,
               (act *dx, bool acc, const act *dy, const act *x, const act *w,
                const real *mean, const real *rstd, int64_t C),
               (dx, acc, dy, x, w, mean, rstd, C))

#ifdef FSD_VEC
DEVICE void layernorm_bwd_v_row(int64_t r, int lane, int lanes, act *dx, bool acc, const act *dy,
                                const act *x, const act *w, const real *mean, const real *rstd,
                                int64_t C)
{
    const act *dyr = dy + r * C, *xr = x + r * C;
    real m = mean[r], rs = rstd[r], sg = 0, sgx = 0;
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vd = fsd_vload(dyr + j), vx = fsd_vload(xr + j), vw = fsd_vload(w + j);
        FSD_VEC_FOR(k) {
            sg += fsd_wide(vd.a[k]) * fsd_wide(vw.a[k]);
            sgx += fsd_wide(vd.a[k]) * fsd_wide(vw.a[k]) * (fsd_wide(vx.a[k]) - m) * rs;
        }
    }
    sg = fsd_warp_sum(sg) / (real)C;
    sgx = fsd_warp_sum(sgx) / (real)C;
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vd = fsd_vload(dyr + j), vx = fsd_vload(xr + j), vw = fsd_vload(w + j);
        fsd_vec vdx = fsd_vload_acc(dx + r * C + j, acc);
        FSD_VEC_FOR(k)
            fsd_store(&vdx.a[k],
                      rs * (fsd_wide(vd.a[k]) * fsd_wide(vw.a[k]) - sg -
                            (fsd_wide(vx.a[k]) - m) * rs * sgx),
                      acc);
        fsd_vstore(dx + r * C + j, vdx);
    }
}
FSD_ROW_KERNEL(layernorm_bwd_v,
               (act *dx, bool acc, const act *dy, const act *x, const act *w,
                const real *mean, const real *rstd, int64_t C),
               (dx, acc, dy, x, w, mean, rstd, C))
#endif

/* the parameter gradients' column sums over rows [r0, r1), columns
 * [j0, j1): dw's into s[j − j0], db's into s[ls + j − j0] (portable.h's sum
 * shape; the CPU's chunks call it a row at a time) */
DEVICE void layernorm_bwd_params_sum(int64_t r0, int64_t r1, int64_t j0, int64_t j1, real *s,
                                     int64_t ls, const act *dy, const act *x, const real *mean,
                                     const real *rstd, int64_t C)
{
    for (int64_t r = r0; r < r1; r++) {
        real m = mean[r], rs = rstd[r];
        FSD_SIMD
        for (int64_t j = j0; j < j1; j++) {
            real d = fsd_wide(dy[r * C + j]);
            s[j - j0] += d * (fsd_wide(x[r * C + j]) - m) * rs;
            s[ls + j - j0] += d;
        }
    }
}

#ifdef FSD_VEC
/* the same over FSD_VEC columns from j0 (a vector item, portable.h): dw's
 * into s[k], db's into s[FSD_VEC + k] */
DEVICE void layernorm_bwd_params_v_sum(int64_t r0, int64_t r1, int64_t j0, real *s,
                                       const act *dy, const act *x, const real *mean,
                                       const real *rstd, int64_t C)
{
    const int nq = FSD_COL_BATCH / 2;
    int64_t r = r0;
    for (; r + nq <= r1; r += nq) {   /* nq rows loaded, then added in order */
        fsd_vec vd[FSD_COL_BATCH / 2], vx[FSD_COL_BATCH / 2];
        real m[FSD_COL_BATCH / 2], rs[FSD_COL_BATCH / 2];
        FSD_VEC_UNROLL for (int q = 0; q < nq; q++) {
            m[q] = mean[r + q], rs[q] = rstd[r + q];
            vd[q] = fsd_vload(dy + (r + q) * C + j0);
            vx[q] = fsd_vload(x + (r + q) * C + j0);
        }
        FSD_VEC_UNROLL for (int q = 0; q < nq; q++)
            FSD_VEC_FOR(k) {
                real d = fsd_wide(vd[q].a[k]);
                s[k] += d * (fsd_wide(vx[q].a[k]) - m[q]) * rs[q];
                s[FSD_VEC + k] += d;
            }
    }
    for (; r < r1; r++) {
        real m = mean[r], rs = rstd[r];
        fsd_vec vd = fsd_vload(dy + r * C + j0), vx = fsd_vload(x + r * C + j0);
        FSD_VEC_FOR(k) {
            real d = fsd_wide(vd.a[k]);
            s[k] += d * (fsd_wide(vx.a[k]) - m) * rs;
            s[FSD_VEC + k] += d;
        }
    }
}
#endif

#if defined(__CUDACC__) || defined(FSD_WARP_EMULATION)
/* The GPU's column sums of dw and db (portable.h): pass 1's item i, one
 * column of a chunk, or FSD_VEC of them (_v), then pass 2. */
DEVICE void layernorm_bwd_params_elem(int64_t i, fsd_col_plan p, const act *dy, const act *x,
                                      const real *mean, const real *rstd, int64_t C)
{
    const fsd_col_item it = fsd_col_item_of(p, i, 1);
    real s[FSD_COL_OUTS] = {0};
    layernorm_bwd_params_sum(it.r0, it.r1, it.j0, it.j0 + 1, s, 1, dy, x, mean, rstd, C);
    fsd_col_item_end(p, it.c, it.j0, s);
}
FSD_ELEM_KERNEL(layernorm_bwd_params,
                (fsd_col_plan p, const act *dy, const act *x, const real *mean,
                 const real *rstd, int64_t C),
                (p, dy, x, mean, rstd, C))

#ifdef FSD_VEC
DEVICE void layernorm_bwd_params_v_elem(int64_t i, fsd_col_plan p, const act *dy, const act *x,
                                        const real *mean, const real *rstd, int64_t C)
{
    const fsd_col_item it = fsd_col_item_of(p, i, FSD_VEC);
    real s[FSD_COL_OUTS * FSD_VEC];
    FSD_VEC_UNROLL for (int k = 0; k < FSD_COL_OUTS * FSD_VEC; k++)
        s[k] = 0;
    layernorm_bwd_params_v_sum(it.r0, it.r1, it.j0, s, dy, x, mean, rstd, C);
    fsd_col_vitem_end(p, it, s);
}
FSD_ELEM_KERNEL(layernorm_bwd_params_v,
                (fsd_col_plan p, const act *dy, const act *x, const real *mean,
                 const real *rstd, int64_t C),
                (p, dy, x, mean, rstd, C))
#endif

/* dw[j] += Σ_r dy·x̂, db[j] += Σ_r dy over [rows, C] (db NULL: none; the
 * plan then stores one output); vec: the vector items (the launcher's
 * choice, the rows' kernel's) */
RUNNER void layernorm_bwd_params_sums(bool vec, act *dw, act *db, const act *dy, const act *x,
                                      const real *mean, const real *rstd, int64_t rows,
                                      int64_t C)
{
    const fsd_col_plan p = fsd_col_plan_of(rows, C, true, dw, db);
    if (vec)
        FSD_RUN_VEC_ELEMS(layernorm_bwd_params_v, p.chunks * C, (p, dy, x, mean, rstd, C));
    else
        FSD_RUN_ELEMS(layernorm_bwd_params, p.chunks * C, (p, dy, x, mean, rstd, C));
    fsd_col_finish(p);
}
#endif

#if !defined(__CUDACC__) && !defined(FSD_WARP_EMULATION)
/* The CPU's backward in one pass over dy and x instead of two (the rows,
 * then the column sums): chunks of FSD_NORM_CHUNK rows, each summing its
 * rows' dw and db contributions in row order into its own partial row of
 * `part` [chunks, 2C] while the rows are in cache, then each column sums the
 * partials in chunk order. The chunks depend on rows alone, so the result
 * does not depend on the thread count. */
#define FSD_NORM_CHUNK 64

static inline real *fsd_norm_scratch(const char *kernel, int64_t n)
{
    real *p = (real *)malloc(sizeof(real) * (size_t)n);
    if (!p)
        fsd_kernel_fail(kernel, "out of memory for the column partials");
    return p;
}

DEVICE void layernorm_bwd_chunk(int64_t c, real *part, act *dx, bool acc, const act *dy,
                                const act *x, const act *w, const real *mean, const real *rstd,
                                int64_t rows, int64_t C)
{
    real *pw = part + c * 2 * C;   /* dw's partial row, then db's */
    int64_t r1 = (c + 1) * FSD_NORM_CHUNK < rows ? (c + 1) * FSD_NORM_CHUNK : rows;
    FSD_SIMD
    for (int64_t j = 0; j < 2 * C; j++)
        pw[j] = 0;
    for (int64_t r = c * FSD_NORM_CHUNK; r < r1; r++) {
        layernorm_bwd_params_sum(r, r + 1, 0, C, pw, C, dy, x, mean, rstd, C);
        layernorm_bwd_row(r, 0, 1, dx, acc, dy, x, w, mean, rstd, C);
    }
}

#endif

LAUNCHER void layernorm_bwd(act *dx, bool acc, act *dw, act *db, const act *dy, const act *x,
                            const act *w, const real *mean, const real *rstd, int64_t rows,
                            int64_t C)
{
    FSD_REQUIRE("layernorm_bwd", dx && dw && dy && x && w && mean && rstd);
    FSD_REQUIRE("layernorm_bwd", rows > 0 && C > 0);
#ifdef FSD_NORM_CHUNK
    const int64_t chunks = (rows + FSD_NORM_CHUNK - 1) / FSD_NORM_CHUNK;
    const int64_t tiles = (C + FSD_COL_TILE - 1) / FSD_COL_TILE;
    real *part = fsd_norm_scratch("layernorm_bwd", chunks * 2 * C);
#pragma omp parallel if (rows * C >= FSD_PAR_MIN_ELEMS)   /* small ops on one thread */
    {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++)
            layernorm_bwd_chunk(c, part, dx, acc, dy, x, w, mean, rstd, rows, C);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            int64_t j0 = t * FSD_COL_TILE, j1 = j0 + FSD_COL_TILE < C ? j0 + FSD_COL_TILE : C;
            fsd_col_sum_real(j0, j1, dw, true, part, chunks, 2 * C);
            if (db)
                fsd_col_sum_real(j0, j1, db, true, part + C, chunks, 2 * C);
        }
    }
    free(part);
#else
    if (FSD_NORM_VEC(C, x, dx, w, dy)) {
        FSD_RUN_VEC_ROWS(layernorm_bwd_v, rows, C, (dx, acc, dy, x, w, mean, rstd, C));
        layernorm_bwd_params_sums(true, dw, db, dy, x, mean, rstd, rows, C);
    } else {
        FSD_RUN_ROWS(layernorm_bwd, rows, C, (dx, acc, dy, x, w, mean, rstd, C));
        layernorm_bwd_params_sums(false, dw, db, dy, x, mean, rstd, rows, C);
    }
#endif
}

/* ── RMSNorm ── */

/* rmsnorm_fwd: per row r of x [rows, C]:
 *   rstd[r] = 1 / sqrt(Σ_j x[r,j]² / C + eps)
 *   y[r,j]  = x[r,j] · rstd[r] · w[j]
 *   y [rows, C], rstd [rows], w [C]. (PyTorch's nn.RMSNorm; Llama's.) */
DEVICE void rmsnorm_fwd_row(int64_t r, int lane, int lanes, act *y, real *rstd, const act *x,
                            const act *w, int64_t C, real eps)
{
    const act *xr = x + r * C;
    real s;
    FSD_LANE_SUM(s, j, C, lane, lanes, fsd_wide(xr[j]) * fsd_wide(xr[j]));
    real rs = 1 / fsd_sqrt(fsd_warp_sum(s) / (real)C + eps);
    FSD_SIMD
    for (int64_t j = lane; j < C; j += lanes)
        y[r * C + j] = fsd_narrow(fsd_wide(xr[j]) * rs * fsd_wide(w[j]));
    if (lane == 0)
        rstd[r] = rs;
}
FSD_ROW_KERNEL(rmsnorm_fwd, (act *y, real *rstd, const act *x, const act *w, int64_t C, real eps),
               (y, rstd, x, w, C, eps))

#ifdef FSD_VEC
DEVICE void rmsnorm_fwd_v_row(int64_t r, int lane, int lanes, act *y, real *rstd, const act *x,
                              const act *w, int64_t C, real eps)
{
    const act *xr = x + r * C;
    real s = 0;
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vx = fsd_vload(xr + j);
        FSD_VEC_FOR(k)
            s += fsd_wide(vx.a[k]) * fsd_wide(vx.a[k]);
    }
    real rs = 1 / fsd_sqrt(fsd_warp_sum(s) / (real)C + eps);
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vx = fsd_vload(xr + j), vw = fsd_vload(w + j), vy = fsd_vzero();
        FSD_VEC_FOR(k)
            vy.a[k] = fsd_narrow(fsd_wide(vx.a[k]) * rs * fsd_wide(vw.a[k]));
        fsd_vstore(y + r * C + j, vy);
    }
    if (lane == 0)
        rstd[r] = rs;
}
FSD_ROW_KERNEL(rmsnorm_fwd_v,
               (act *y, real *rstd, const act *x, const act *w, int64_t C, real eps),
               (y, rstd, x, w, C, eps))
#endif

LAUNCHER void rmsnorm_fwd(act *y, real *rstd, const act *x, const act *w, int64_t rows,
                          int64_t C, real eps)
{
    FSD_REQUIRE("rmsnorm_fwd", y && rstd && x && w);
    FSD_REQUIRE("rmsnorm_fwd", rows > 0 && C > 0 && eps >= 0);
    if (FSD_NORM_VEC(C, x, y, w, w))
        FSD_RUN_VEC_ROWS(rmsnorm_fwd_v, rows, C, (y, rstd, x, w, C, eps));
    else
        FSD_RUN_ROWS(rmsnorm_fwd, rows, C, (y, rstd, x, w, C, eps));
}

/* add_rmsnorm_fwd: sum = a + b, then rmsnorm_fwd of sum (y, rstd), as
 * add_layernorm_fwd. sum, a, b [rows, C]; the rest as rmsnorm_fwd. */
DEVICE void add_rmsnorm_fwd_row(int64_t r, int lane, int lanes, act *sum, act *y, real *rstd,
                                const act *a, const act *b, const act *w, int64_t C, real eps)
{
    add_norm_row(r, lane, lanes, sum, a, b, C);
    rmsnorm_fwd_row(r, lane, lanes, y, rstd, sum, w, C, eps);
}
FSD_ROW_KERNEL(add_rmsnorm_fwd,
               (act *sum, act *y, real *rstd, const act *a, const act *b, const act *w,
                int64_t C, real eps),
               (sum, y, rstd, a, b, w, C, eps))

#ifdef FSD_VEC
DEVICE void add_rmsnorm_fwd_v_row(int64_t r, int lane, int lanes, act *sum, act *y, real *rstd,
                                  const act *a, const act *b, const act *w, int64_t C, real eps,
                                  bool ab_vec)
{
    add_norm_v_row(r, lane, lanes, sum, a, b, C, ab_vec);
    rmsnorm_fwd_v_row(r, lane, lanes, y, rstd, sum, w, C, eps);
}
FSD_ROW_KERNEL(add_rmsnorm_fwd_v,
               (act *sum, act *y, real *rstd, const act *a, const act *b, const act *w,
                int64_t C, real eps, bool ab_vec),
               (sum, y, rstd, a, b, w, C, eps, ab_vec))
#endif

LAUNCHER void add_rmsnorm_fwd(act *sum, act *y, real *rstd, const act *a, const act *b,
                              const act *w, int64_t rows, int64_t C, real eps)
{
    FSD_REQUIRE("add_rmsnorm_fwd", sum && y && rstd && a && b && w);
    FSD_REQUIRE("add_rmsnorm_fwd", rows > 0 && C > 0 && eps >= 0);
    if (FSD_NORM_VEC(C, sum, y, w, w))
        FSD_RUN_VEC_ROWS(add_rmsnorm_fwd_v, rows, C,
                         (sum, y, rstd, a, b, w, C, eps, fsd_al16(a) && fsd_al16(b)));
    else
        FSD_RUN_ROWS(add_rmsnorm_fwd, rows, C, (sum, y, rstd, a, b, w, C, eps));
}

/* rmsnorm_bwd: with x̂ = x · rstd and g = dy · w,
 *   dx[r,j] (+)= rstd[r] · (g[r,j] − x̂[r,j] · Σ_k g[r,k] x̂[r,k] / C)
 *   dw[j]   +=  Σ_r dy[r,j] · x̂[r,j]
 * dx accumulates when acc; dw always accumulates. dx, dy, x [rows, C];
 * dw, w [C]; rstd [rows]. */
DEVICE void rmsnorm_bwd_row(int64_t r, int lane, int lanes, act *dx, bool acc, const act *dy,
                            const act *x, const act *w, const real *rstd, int64_t C)
{
    const act *dyr = dy + r * C, *xr = x + r * C;
    real rs = rstd[r], sgx;
    FSD_LANE_SUM(sgx, j, C, lane, lanes, fsd_wide(dyr[j]) * fsd_wide(w[j]) * fsd_wide(xr[j]) * rs);
    sgx = fsd_warp_sum(sgx) / (real)C;
    FSD_SIMD
    for (int64_t j = lane; j < C; j += lanes)
        fsd_store(&dx[r * C + j],
                  rs * (fsd_wide(dyr[j]) * fsd_wide(w[j]) - fsd_wide(xr[j]) * rs * sgx), acc);
}
FSD_ROW_KERNEL(rmsnorm_bwd,
               (act *dx, bool acc, const act *dy, const act *x, const act *w, const real *rstd,
                int64_t C),
               (dx, acc, dy, x, w, rstd, C))

#ifdef FSD_VEC
DEVICE void rmsnorm_bwd_v_row(int64_t r, int lane, int lanes, act *dx, bool acc, const act *dy,
                              const act *x, const act *w, const real *rstd, int64_t C)
{
    const act *dyr = dy + r * C, *xr = x + r * C;
    real rs = rstd[r], sgx = 0;
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vd = fsd_vload(dyr + j), vx = fsd_vload(xr + j), vw = fsd_vload(w + j);
        FSD_VEC_FOR(k)
            sgx += fsd_wide(vd.a[k]) * fsd_wide(vw.a[k]) * fsd_wide(vx.a[k]) * rs;
    }
    sgx = fsd_warp_sum(sgx) / (real)C;
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vd = fsd_vload(dyr + j), vx = fsd_vload(xr + j), vw = fsd_vload(w + j);
        fsd_vec vdx = fsd_vload_acc(dx + r * C + j, acc);
        FSD_VEC_FOR(k)
            fsd_store(&vdx.a[k],
                      rs * (fsd_wide(vd.a[k]) * fsd_wide(vw.a[k]) - fsd_wide(vx.a[k]) * rs * sgx),
                      acc);
        fsd_vstore(dx + r * C + j, vdx);
    }
}
FSD_ROW_KERNEL(rmsnorm_bwd_v,
               (act *dx, bool acc, const act *dy, const act *x, const act *w, const real *rstd,
                int64_t C),
               (dx, acc, dy, x, w, rstd, C))
#endif

/* dw's column sums over rows [r0, r1), columns [j0, j1), into s[j − j0],
 * as layernorm_bwd_params_sum */
DEVICE void rmsnorm_bwd_params_sum(int64_t r0, int64_t r1, int64_t j0, int64_t j1, real *s,
                                   int64_t ls, const act *dy, const act *x, const real *rstd,
                                   int64_t C)
{
    (void)ls;
    for (int64_t r = r0; r < r1; r++) {
        real rs = rstd[r];
        FSD_SIMD
        for (int64_t j = j0; j < j1; j++)
            s[j - j0] += fsd_wide(dy[r * C + j]) * fsd_wide(x[r * C + j]) * rs;
    }
}

#ifdef FSD_VEC
DEVICE void rmsnorm_bwd_params_v_sum(int64_t r0, int64_t r1, int64_t j0, real *s, const act *dy,
                                     const act *x, const real *rstd, int64_t C)
{
    const int nq = FSD_COL_BATCH / 2;
    int64_t r = r0;
    for (; r + nq <= r1; r += nq) {   /* nq rows loaded, then added in order */
        fsd_vec vd[FSD_COL_BATCH / 2], vx[FSD_COL_BATCH / 2];
        real rs[FSD_COL_BATCH / 2];
        FSD_VEC_UNROLL for (int q = 0; q < nq; q++) {
            rs[q] = rstd[r + q];
            vd[q] = fsd_vload(dy + (r + q) * C + j0);
            vx[q] = fsd_vload(x + (r + q) * C + j0);
        }
        FSD_VEC_UNROLL for (int q = 0; q < nq; q++)
            FSD_VEC_FOR(k)
                s[k] += fsd_wide(vd[q].a[k]) * fsd_wide(vx[q].a[k]) * rs[q];
    }
    for (; r < r1; r++) {
        real rs = rstd[r];
        fsd_vec vd = fsd_vload(dy + r * C + j0), vx = fsd_vload(x + r * C + j0);
        FSD_VEC_FOR(k)
            s[k] += fsd_wide(vd.a[k]) * fsd_wide(vx.a[k]) * rs;
    }
}
#endif

#if defined(__CUDACC__) || defined(FSD_WARP_EMULATION)
/* The GPU's column sums of dw, as layernorm_bwd's */
DEVICE void rmsnorm_bwd_params_elem(int64_t i, fsd_col_plan p, const act *dy, const act *x,
                                    const real *rstd, int64_t C)
{
    const fsd_col_item it = fsd_col_item_of(p, i, 1);
    real s[FSD_COL_OUTS] = {0};
    rmsnorm_bwd_params_sum(it.r0, it.r1, it.j0, it.j0 + 1, s, 1, dy, x, rstd, C);
    fsd_col_item_end(p, it.c, it.j0, s);
}
FSD_ELEM_KERNEL(rmsnorm_bwd_params,
                (fsd_col_plan p, const act *dy, const act *x, const real *rstd, int64_t C),
                (p, dy, x, rstd, C))

#ifdef FSD_VEC
DEVICE void rmsnorm_bwd_params_v_elem(int64_t i, fsd_col_plan p, const act *dy, const act *x,
                                      const real *rstd, int64_t C)
{
    const fsd_col_item it = fsd_col_item_of(p, i, FSD_VEC);
    real s[FSD_COL_OUTS * FSD_VEC];
    FSD_VEC_UNROLL for (int k = 0; k < FSD_COL_OUTS * FSD_VEC; k++)
        s[k] = 0;
    rmsnorm_bwd_params_v_sum(it.r0, it.r1, it.j0, s, dy, x, rstd, C);
    fsd_col_vitem_end(p, it, s);
}
FSD_ELEM_KERNEL(rmsnorm_bwd_params_v,
                (fsd_col_plan p, const act *dy, const act *x, const real *rstd, int64_t C),
                (p, dy, x, rstd, C))
#endif

RUNNER void rmsnorm_bwd_params_sums(bool vec, act *dw, const act *dy, const act *x,
                                    const real *rstd, int64_t rows, int64_t C)
{
    const fsd_col_plan p = fsd_col_plan_of(rows, C, true, dw, NULL);
    if (vec)
        FSD_RUN_VEC_ELEMS(rmsnorm_bwd_params_v, p.chunks * C, (p, dy, x, rstd, C));
    else
        FSD_RUN_ELEMS(rmsnorm_bwd_params, p.chunks * C, (p, dy, x, rstd, C));
    fsd_col_finish(p);
}
#endif

#ifdef FSD_NORM_CHUNK
/* the CPU's one pass, as layernorm_bwd_chunk: part [chunks, C] */
DEVICE void rmsnorm_bwd_chunk(int64_t c, real *part, act *dx, bool acc, const act *dy,
                              const act *x, const act *w, const real *rstd, int64_t rows,
                              int64_t C)
{
    real *pw = part + c * C;
    int64_t r1 = (c + 1) * FSD_NORM_CHUNK < rows ? (c + 1) * FSD_NORM_CHUNK : rows;
    FSD_SIMD
    for (int64_t j = 0; j < C; j++)
        pw[j] = 0;
    for (int64_t r = c * FSD_NORM_CHUNK; r < r1; r++) {
        rmsnorm_bwd_params_sum(r, r + 1, 0, C, pw, C, dy, x, rstd, C);
        rmsnorm_bwd_row(r, 0, 1, dx, acc, dy, x, w, rstd, C);
    }
}
#endif

LAUNCHER void rmsnorm_bwd(act *dx, bool acc, act *dw, const act *dy, const act *x,
                          const act *w, const real *rstd, int64_t rows, int64_t C)
{
    FSD_REQUIRE("rmsnorm_bwd", dx && dw && dy && x && w && rstd);
    FSD_REQUIRE("rmsnorm_bwd", rows > 0 && C > 0);
#ifdef FSD_NORM_CHUNK
    const int64_t chunks = (rows + FSD_NORM_CHUNK - 1) / FSD_NORM_CHUNK;
    const int64_t tiles = (C + FSD_COL_TILE - 1) / FSD_COL_TILE;
    real *part = fsd_norm_scratch("rmsnorm_bwd", chunks * C);
#pragma omp parallel if (rows * C >= FSD_PAR_MIN_ELEMS)   /* small ops on one thread */
    {
#pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++)
            rmsnorm_bwd_chunk(c, part, dx, acc, dy, x, w, rstd, rows, C);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tiles; t++) {
            int64_t j0 = t * FSD_COL_TILE, j1 = j0 + FSD_COL_TILE < C ? j0 + FSD_COL_TILE : C;
            fsd_col_sum_real(j0, j1, dw, true, part, chunks, C);
        }
    }
    free(part);
#else
    if (FSD_NORM_VEC(C, x, dx, w, dy)) {
        FSD_RUN_VEC_ROWS(rmsnorm_bwd_v, rows, C, (dx, acc, dy, x, w, rstd, C));
        rmsnorm_bwd_params_sums(true, dw, dy, x, rstd, rows, C);
    } else {
        FSD_RUN_ROWS(rmsnorm_bwd, rows, C, (dx, acc, dy, x, w, rstd, C));
        rmsnorm_bwd_params_sums(false, dw, dy, x, rstd, rows, C);
    }
#endif
}
