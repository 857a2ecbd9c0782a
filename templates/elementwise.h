/*
 * elementwise.h — `+` and `*` with suffix broadcasting, the Linear bias,
 * and the gradient plumbing autodiff creates (reduce_to, copy). Needs
 * portable.h.
 *
 * Broadcasting is by suffix, as the front end allows it: an operand b of
 * nb elements against a of n elements (n a multiple of nb) is repeated
 * over a's leading dimensions, b[i mod nb]. Its gradient sums over them:
 * column j of the view [n/nb, nb]. Those sums are column reductions
 * (portable.h's sum shape): deterministic, no atomics.
 *
 * On the GPU the same-shape kernels, copy, bias_add and the column sums
 * have 16-byte vector versions (X_v, portable.h's FSD_VEC), taken when the
 * pointers are 16-byte aligned and the sizes multiples of FSD_VEC; they give
 * the scalar kernels' bits.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

/* the column sum of reduce_to and bias_bwd, dst[j] (+)= Σ_r src[r·C + j]:
 * rows [r0, r1) into s[j − j0] (one output) */
DEVICE void reduce_to_sum(int64_t r0, int64_t r1, int64_t j0, int64_t j1, real *s, int64_t ls,
                          const act *src, int64_t C)
{
    (void)ls;
    for (int64_t r = r0; r < r1; r++)
        FSD_SIMD
        for (int64_t j = j0; j < j1; j++)
            s[j - j0] += fsd_wide(src[r * C + j]);
}

#ifdef FSD_VEC
/* the same, FSD_VEC columns from j0 into s[k] (a vector item, portable.h):
 * FSD_COL_BATCH rows loaded, then added in row order */
DEVICE void reduce_to_v_sum(int64_t r0, int64_t r1, int64_t j0, real *s, const act *src,
                            int64_t C)
{
    int64_t r = r0;
    for (; r + FSD_COL_BATCH <= r1; r += FSD_COL_BATCH) {
        fsd_vec v[FSD_COL_BATCH];
        FSD_VEC_UNROLL for (int q = 0; q < FSD_COL_BATCH; q++)
            v[q] = fsd_vload(src + (r + q) * C + j0);
        FSD_VEC_UNROLL for (int q = 0; q < FSD_COL_BATCH; q++)
            FSD_VEC_FOR(k)
                s[k] += fsd_wide(v[q].a[k]);
    }
    for (; r < r1; r++) {
        fsd_vec v = fsd_vload(src + r * C + j0);
        FSD_VEC_FOR(k)
            s[k] += fsd_wide(v.a[k]);
    }
}
#endif

#if defined(__CUDACC__) || defined(FSD_WARP_EMULATION)
/* The GPU's column sums (portable.h): pass 1's item i, one column of a
 * chunk (reduce_to), or FSD_VEC of them (reduce_to_v), then pass 2. */
DEVICE void reduce_to_elem(int64_t i, fsd_col_plan p, const act *src, int64_t C)
{
    const fsd_col_item it = fsd_col_item_of(p, i, 1);
    real s[FSD_COL_OUTS] = {0};
    reduce_to_sum(it.r0, it.r1, it.j0, it.j0 + 1, s, 1, src, C);
    fsd_col_item_end(p, it.c, it.j0, s);
}
FSD_ELEM_KERNEL(reduce_to, (fsd_col_plan p, const act *src, int64_t C), (p, src, C))

#ifdef FSD_VEC
DEVICE void reduce_to_v_elem(int64_t i, fsd_col_plan p, const act *src, int64_t C)
{
    const fsd_col_item it = fsd_col_item_of(p, i, FSD_VEC);
    real s[FSD_COL_OUTS * FSD_VEC];
    FSD_VEC_UNROLL for (int k = 0; k < FSD_COL_OUTS * FSD_VEC; k++)
        s[k] = 0;
    reduce_to_v_sum(it.r0, it.r1, it.j0, s, src, C);
    fsd_col_vitem_end(p, it, s);
}
FSD_ELEM_KERNEL(reduce_to_v, (fsd_col_plan p, const act *src, int64_t C), (p, src, C))
#endif

/* dst[j] (+)= Σ_r src[r·C + j] over [rows, C]: the vector items where src's
 * rows are 16-byte aligned */
RUNNER void reduce_to_sums(act *dst, bool acc, const act *src, int64_t rows, int64_t C)
{
    const fsd_col_plan p = fsd_col_plan_of(rows, C, acc, dst, NULL);
    if (FSD_VEC_WHEN(C % FSD_VEC == 0 && fsd_al16(src)))
        FSD_RUN_VEC_ELEMS(reduce_to_v, p.chunks * C, (p, src, C));
    else
        FSD_RUN_ELEMS(reduce_to, p.chunks * C, (p, src, C));
    fsd_col_finish(p);
}
#else
/* The CPU's: a span of columns a worker (portable.h, fsd_col_span). */
RUNNER void reduce_to_sums(act *dst, bool acc, const act *src, int64_t rows, int64_t C)
{
    const int64_t span = fsd_col_span(C), spans = (C + span - 1) / span;
#pragma omp parallel for schedule(static) if (rows * C >= FSD_PAR_MIN_ELEMS)
    for (int64_t t = 0; t < spans; t++) {
        const int64_t j0 = t * span, j1 = j0 + span < C ? j0 + span : C;
        real s[FSD_COL_SPAN] = {0};
        reduce_to_sum(0, rows, j0, j1, s, FSD_COL_SPAN, src, C);
        fsd_col_store(j0, j1, &dst, 1, acc, s, FSD_COL_SPAN);
    }
}
#endif

/* ── add ── */

DEVICE void add_fwd_elem(int64_t i, act *y, const act *a, const act *b, int64_t nb)
{
    y[i] = fsd_narrow(fsd_wide(a[i]) + fsd_wide(b[i % nb]));
}
FSD_ELEM_KERNEL(add_fwd, (act *y, const act *a, const act *b, int64_t nb), (y, a, b, nb))

/* the same shape (nb = n): no division per element */
DEVICE void add_same_elem(int64_t i, act *y, const act *a, const act *b)
{
    y[i] = fsd_narrow(fsd_wide(a[i]) + fsd_wide(b[i]));
}
FSD_ELEM_KERNEL(add_same, (act *y, const act *a, const act *b), (y, a, b))

#ifdef FSD_VEC
/* elements [v·FSD_VEC, (v + 1)·FSD_VEC) through add_same_elem */
DEVICE void add_same_v_elem(int64_t v, act *y, const act *a, const act *b)
{
    const int64_t i = v * FSD_VEC;
    fsd_vec va = fsd_vload(a + i), vb = fsd_vload(b + i), vy = fsd_vzero();
    FSD_VEC_FOR(k)
        add_same_elem(k, vy.a, va.a, vb.a);
    fsd_vstore(y + i, vy);
}
FSD_ELEM_KERNEL(add_same_v, (act *y, const act *a, const act *b), (y, a, b))
#endif

/* one row: y[r, :] = x[r, :] + b, lanes strided over the columns: the
 * Linear bias's (bias_add_fwd), and add_fwd's broadcast on the CPU */
DEVICE void bias_add_row(int64_t row, int lane, int lanes, act *y, const act *x, const act *b,
                         int64_t C)
{
    FSD_SIMD
    for (int64_t j = lane; j < C; j += lanes)
        y[row * C + j] = fsd_narrow(fsd_wide(x[row * C + j]) + fsd_wide(b[j]));
}
FSD_ROW_KERNEL(bias_add, (act *y, const act *x, const act *b, int64_t C), (y, x, b, C))

/* On the CPU a broadcast b (nb < n) runs by rows of nb elements, b read
 * in step: the element kernels' i mod nb is an integer division per
 * element, and stops the vectoriser (GPT's position add, 32k elements,
 * took 70 us of tiny's 6.6 ms step). The GPU keeps a thread per element
 * there: its row kernels give each row one warp, too few for B rows of
 * T·C. */
#if !defined(__CUDACC__) && !defined(FSD_WARP_EMULATION)
#define FSD_BCAST_ROWS 1
DEVICE void mul_rows_row(int64_t r, int lane, int lanes, act *y, const act *a, const act *b,
                         int64_t nb)
{
    FSD_SIMD
    for (int64_t j = lane; j < nb; j += lanes)
        y[r * nb + j] = fsd_narrow(fsd_wide(a[r * nb + j]) * fsd_wide(b[j]));
}
FSD_ROW_KERNEL(mul_rows, (act *y, const act *a, const act *b, int64_t nb), (y, a, b, nb))
DEVICE void mul_bwd_a_rows_row(int64_t r, int lane, int lanes, act *da, bool acc,
                               const act *dy, const act *b, int64_t nb)
{
    FSD_SIMD
    for (int64_t j = lane; j < nb; j += lanes)
        fsd_store(&da[r * nb + j], fsd_wide(dy[r * nb + j]) * fsd_wide(b[j]), acc);
}
FSD_ROW_KERNEL(mul_bwd_a_rows, (act *da, bool acc, const act *dy, const act *b, int64_t nb),
               (da, acc, dy, b, nb))
#endif

/* add_fwd: y[i] = a[i] + b[i mod nb]; y, a [n], b [nb], n a multiple of
 * nb. y may be a (in place). Its backward is copy (or a pass-through) for
 * a, and reduce_to for a broadcast b. */
LAUNCHER void add_fwd(act *y, const act *a, const act *b, int64_t n, int64_t nb)
{
    FSD_REQUIRE("add_fwd", y && a && b);
    FSD_REQUIRE("add_fwd", n > 0 && nb > 0 && n % nb == 0);
    if (nb == n && FSD_VEC_WHEN(n % FSD_VEC == 0 && fsd_al16(y) && fsd_al16(a) && fsd_al16(b)))
        FSD_RUN_VEC_ELEMS(add_same_v, n, (y, a, b));
    else if (nb == n)
        FSD_RUN_ELEMS(add_same, n, (y, a, b));
    else
#ifdef FSD_BCAST_ROWS
        FSD_RUN_ROWS(bias_add, n / nb, nb, (y, a, b, nb));
#else
        FSD_RUN_ELEMS(add_fwd, n, (y, a, b, nb));
#endif
}

/* ── mul ── */

DEVICE void mul_fwd_elem(int64_t i, act *y, const act *a, const act *b, int64_t nb)
{
    y[i] = fsd_narrow(fsd_wide(a[i]) * fsd_wide(b[i % nb]));
}
FSD_ELEM_KERNEL(mul_fwd, (act *y, const act *a, const act *b, int64_t nb), (y, a, b, nb))

DEVICE void mul_same_elem(int64_t i, act *y, const act *a, const act *b)
{
    y[i] = fsd_narrow(fsd_wide(a[i]) * fsd_wide(b[i]));
}
FSD_ELEM_KERNEL(mul_same, (act *y, const act *a, const act *b), (y, a, b))

#ifdef FSD_VEC
DEVICE void mul_same_v_elem(int64_t v, act *y, const act *a, const act *b)
{
    const int64_t i = v * FSD_VEC;
    fsd_vec va = fsd_vload(a + i), vb = fsd_vload(b + i), vy = fsd_vzero();
    FSD_VEC_FOR(k)
        mul_same_elem(k, vy.a, va.a, vb.a);
    fsd_vstore(y + i, vy);
}
FSD_ELEM_KERNEL(mul_same_v, (act *y, const act *a, const act *b), (y, a, b))
#endif

/* mul_fwd: y[i] = a[i] · b[i mod nb]; y, a [n], b [nb], n a multiple of
 * nb. y may be a. */
LAUNCHER void mul_fwd(act *y, const act *a, const act *b, int64_t n, int64_t nb)
{
    FSD_REQUIRE("mul_fwd", y && a && b);
    FSD_REQUIRE("mul_fwd", n > 0 && nb > 0 && n % nb == 0);
    if (nb == n && FSD_VEC_WHEN(n % FSD_VEC == 0 && fsd_al16(y) && fsd_al16(a) && fsd_al16(b)))
        FSD_RUN_VEC_ELEMS(mul_same_v, n, (y, a, b));
    else if (nb == n)
        FSD_RUN_ELEMS(mul_same, n, (y, a, b));
    else
#ifdef FSD_BCAST_ROWS
        FSD_RUN_ROWS(mul_rows, n / nb, nb, (y, a, b, nb));
#else
        FSD_RUN_ELEMS(mul_fwd, n, (y, a, b, nb));
#endif
}

DEVICE void mul_bwd_a_elem(int64_t i, act *da, bool acc, const act *dy, const act *b,
                           int64_t nb)
{
    fsd_store(&da[i], fsd_wide(dy[i]) * fsd_wide(b[i % nb]), acc);
}
FSD_ELEM_KERNEL(mul_bwd_a, (act *da, bool acc, const act *dy, const act *b, int64_t nb),
                (da, acc, dy, b, nb))

DEVICE void mul_bwd_a_same_elem(int64_t i, act *da, bool acc, const act *dy, const act *b)
{
    fsd_store(&da[i], fsd_wide(dy[i]) * fsd_wide(b[i]), acc);
}
FSD_ELEM_KERNEL(mul_bwd_a_same, (act *da, bool acc, const act *dy, const act *b),
                (da, acc, dy, b))

#ifdef FSD_VEC
DEVICE void mul_bwd_a_same_v_elem(int64_t v, act *da, bool acc, const act *dy, const act *b)
{
    const int64_t i = v * FSD_VEC;
    fsd_vec vdy = fsd_vload(dy + i), vb = fsd_vload(b + i), vda = fsd_vload_acc(da + i, acc);
    FSD_VEC_FOR(k)
        mul_bwd_a_same_elem(k, vda.a, acc, vdy.a, vb.a);
    fsd_vstore(da + i, vda);
}
FSD_ELEM_KERNEL(mul_bwd_a_same_v, (act *da, bool acc, const act *dy, const act *b),
                (da, acc, dy, b))
#endif

/* db[j] (+)= Σ_r dy[r·nb + j] · a[r·nb + j]: rows [r0, r1) into s[j − j0] */
DEVICE void mul_bwd_b_sum(int64_t r0, int64_t r1, int64_t j0, int64_t j1, real *s, int64_t ls,
                          const act *dy, const act *a, int64_t nb)
{
    (void)ls;
    for (int64_t r = r0; r < r1; r++)
        FSD_SIMD
        for (int64_t j = j0; j < j1; j++)
            s[j - j0] += fsd_wide(dy[r * nb + j]) * fsd_wide(a[r * nb + j]);
}

#ifdef FSD_VEC
DEVICE void mul_bwd_b_v_sum(int64_t r0, int64_t r1, int64_t j0, real *s, const act *dy,
                            const act *a, int64_t nb)
{
    const int nq = FSD_COL_BATCH / 2;
    int64_t r = r0;
    for (; r + nq <= r1; r += nq) {
        fsd_vec vd[FSD_COL_BATCH / 2], va[FSD_COL_BATCH / 2];
        FSD_VEC_UNROLL for (int q = 0; q < nq; q++) {
            vd[q] = fsd_vload(dy + (r + q) * nb + j0);
            va[q] = fsd_vload(a + (r + q) * nb + j0);
        }
        FSD_VEC_UNROLL for (int q = 0; q < nq; q++)
            FSD_VEC_FOR(k)
                s[k] += fsd_wide(vd[q].a[k]) * fsd_wide(va[q].a[k]);
    }
    for (; r < r1; r++) {
        fsd_vec vd = fsd_vload(dy + r * nb + j0), va = fsd_vload(a + r * nb + j0);
        FSD_VEC_FOR(k)
            s[k] += fsd_wide(vd.a[k]) * fsd_wide(va.a[k]);
    }
}
#endif

#if defined(__CUDACC__) || defined(FSD_WARP_EMULATION)
/* The GPU's column sums of db, as reduce_to's */
DEVICE void mul_bwd_b_elem(int64_t i, fsd_col_plan p, const act *dy, const act *a, int64_t nb)
{
    const fsd_col_item it = fsd_col_item_of(p, i, 1);
    real s[FSD_COL_OUTS] = {0};
    mul_bwd_b_sum(it.r0, it.r1, it.j0, it.j0 + 1, s, 1, dy, a, nb);
    fsd_col_item_end(p, it.c, it.j0, s);
}
FSD_ELEM_KERNEL(mul_bwd_b, (fsd_col_plan p, const act *dy, const act *a, int64_t nb),
                (p, dy, a, nb))

#ifdef FSD_VEC
DEVICE void mul_bwd_b_v_elem(int64_t i, fsd_col_plan p, const act *dy, const act *a, int64_t nb)
{
    const fsd_col_item it = fsd_col_item_of(p, i, FSD_VEC);
    real s[FSD_COL_OUTS * FSD_VEC];
    FSD_VEC_UNROLL for (int k = 0; k < FSD_COL_OUTS * FSD_VEC; k++)
        s[k] = 0;
    mul_bwd_b_v_sum(it.r0, it.r1, it.j0, s, dy, a, nb);
    fsd_col_vitem_end(p, it, s);
}
FSD_ELEM_KERNEL(mul_bwd_b_v, (fsd_col_plan p, const act *dy, const act *a, int64_t nb),
                (p, dy, a, nb))
#endif

/* db[j] (+)= Σ_r dy[r·nb + j] · a[r·nb + j] over [rows, nb] */
RUNNER void mul_bwd_b_sums(act *db, bool acc, const act *dy, const act *a, int64_t rows,
                           int64_t nb)
{
    const fsd_col_plan p = fsd_col_plan_of(rows, nb, acc, db, NULL);
    if (FSD_VEC_WHEN(nb % FSD_VEC == 0 && fsd_al16(dy) && fsd_al16(a)))
        FSD_RUN_VEC_ELEMS(mul_bwd_b_v, p.chunks * nb, (p, dy, a, nb));
    else
        FSD_RUN_ELEMS(mul_bwd_b, p.chunks * nb, (p, dy, a, nb));
    fsd_col_finish(p);
}
#else
RUNNER void mul_bwd_b_sums(act *db, bool acc, const act *dy, const act *a, int64_t rows,
                           int64_t nb)
{
    const int64_t span = fsd_col_span(nb), spans = (nb + span - 1) / span;
#pragma omp parallel for schedule(static) if (rows * nb >= FSD_PAR_MIN_ELEMS)
    for (int64_t t = 0; t < spans; t++) {
        const int64_t j0 = t * span, j1 = j0 + span < nb ? j0 + span : nb;
        real s[FSD_COL_SPAN] = {0};
        mul_bwd_b_sum(0, rows, j0, j1, s, FSD_COL_SPAN, dy, a, nb);
        fsd_col_store(j0, j1, &db, 1, acc, s, FSD_COL_SPAN);
    }
}
#endif

/* mul_bwd: the backward of y = a · b (b broadcast as in mul_fwd):
 *   da[i] (+)= dy[i] · b[i mod nb]            da, dy, a [n]
 *   db[j] (+)= Σ_{i mod nb = j} dy[i] · a[i]  db, b [nb]
 * db is computed first, so da may be dy (in place). */
LAUNCHER void mul_bwd(act *da, bool acc_a, act *db, bool acc_b, const act *dy,
                      const act *a, const act *b, int64_t n, int64_t nb)
{
    FSD_REQUIRE("mul_bwd", da && db && dy && a && b);
    FSD_REQUIRE("mul_bwd", n > 0 && nb > 0 && n % nb == 0);
    FSD_REQUIRE("mul_bwd", db != dy && db != a && da != db);
    mul_bwd_b_sums(db, acc_b, dy, a, n / nb, nb);
    if (nb == n &&
        FSD_VEC_WHEN(n % FSD_VEC == 0 && fsd_al16(da) && fsd_al16(dy) && fsd_al16(b)))
        FSD_RUN_VEC_ELEMS(mul_bwd_a_same_v, n, (da, acc_a, dy, b));
    else if (nb == n)
        FSD_RUN_ELEMS(mul_bwd_a_same, n, (da, acc_a, dy, b));
    else
#ifdef FSD_BCAST_ROWS
        FSD_RUN_ROWS(mul_bwd_a_rows, n / nb, nb, (da, acc_a, dy, b, nb));
#else
        FSD_RUN_ELEMS(mul_bwd_a, n, (da, acc_a, dy, b, nb));
#endif
}

/* ── the Linear bias ── */

#ifdef FSD_VEC
/* the same, each lane on FSD_VEC columns at a time */
DEVICE void bias_add_v_row(int64_t row, int lane, int lanes, act *y, const act *x, const act *b,
                           int64_t C)
{
    FSD_VEC_LANES(j, C, lane, lanes) {
        fsd_vec vx = fsd_vload(x + row * C + j), vb = fsd_vload(b + j), vy = fsd_vzero();
        FSD_VEC_FOR(k)
            vy.a[k] = fsd_narrow(fsd_wide(vx.a[k]) + fsd_wide(vb.a[k]));
        fsd_vstore(y + row * C + j, vy);
    }
}
FSD_ROW_KERNEL(bias_add_v, (act *y, const act *x, const act *b, int64_t C), (y, x, b, C))
#endif

/* bias_add_fwd: y[r, j] = x[r, j] + b[j]; y, x [rows, C], b [C]. y may
 * be x. */
LAUNCHER void bias_add_fwd(act *y, const act *x, const act *b, int64_t rows, int64_t C)
{
    FSD_REQUIRE("bias_add_fwd", y && x && b);
    FSD_REQUIRE("bias_add_fwd", rows > 0 && C > 0);
    if (FSD_VEC_WHEN(C % FSD_VEC == 0 && fsd_al16(y) && fsd_al16(x) && fsd_al16(b)))
        FSD_RUN_VEC_ROWS(bias_add_v, rows, C, (y, x, b, C));
    else
        FSD_RUN_ROWS(bias_add, rows, C, (y, x, b, C));
}

/* bias_bwd: db[j] += Σ_r dy[r, j]; always accumulates (a parameter
 * gradient). db [C], dy [rows, C]. */
LAUNCHER void bias_bwd(act *db, const act *dy, int64_t rows, int64_t C)
{
    FSD_REQUIRE("bias_bwd", db && dy);
    FSD_REQUIRE("bias_bwd", rows > 0 && C > 0);
    reduce_to_sums(db, true, dy, rows, C);
}

/* ── gradient plumbing ── */

/* reduce_to: dst[j] (+)= Σ_{i mod n_dst = j} src[i]; src [n_src], dst
 * [n_dst], n_src a multiple of n_dst. The gradient of add_fwd's broadcast
 * operand. */
LAUNCHER void reduce_to(act *dst, bool acc, const act *src, int64_t n_src, int64_t n_dst)
{
    FSD_REQUIRE("reduce_to", dst && src && dst != src);
    FSD_REQUIRE("reduce_to", n_src > 0 && n_dst > 0 && n_src % n_dst == 0);
    reduce_to_sums(dst, acc, src, n_src / n_dst, n_dst);
}

DEVICE void copy_elem(int64_t i, act *dst, bool acc, const act *src)
{
    fsd_store(&dst[i], fsd_wide(src[i]), acc);
}
FSD_ELEM_KERNEL(copy, (act *dst, bool acc, const act *src), (dst, acc, src))

#ifdef FSD_VEC
DEVICE void copy_v_elem(int64_t v, act *dst, bool acc, const act *src)
{
    const int64_t i = v * FSD_VEC;
    fsd_vec vs = fsd_vload(src + i), vd = fsd_vload_acc(dst + i, acc);
    FSD_VEC_FOR(k)
        copy_elem(k, vd.a, acc, vs.a);
    fsd_vstore(dst + i, vd);
}
FSD_ELEM_KERNEL(copy_v, (act *dst, bool acc, const act *src), (dst, acc, src))
#endif

/* copy: dst[i] (+)= src[i]; dst, src [n]. A gradient passed on to a value
 * whose gradient buffer is already taken. */
LAUNCHER void copy(act *dst, bool acc, const act *src, int64_t n)
{
    FSD_REQUIRE("copy", dst && src && n > 0);
    if (FSD_VEC_WHEN(n % FSD_VEC == 0 && fsd_al16(dst) && fsd_al16(src)))
        FSD_RUN_VEC_ELEMS(copy_v, n, (dst, acc, src));
    else
        FSD_RUN_ELEMS(copy, n, (dst, acc, src));
}
