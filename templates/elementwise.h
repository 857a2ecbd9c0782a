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
FSD_COL_SUM_KERNEL(reduce_to, (const act *src, int64_t C), (src, C))

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

/* add_fwd: y[i] = a[i] + b[i mod nb]; y, a [n], b [nb], n a multiple of
 * nb. y may be a (in place). Its backward is copy (or a pass-through) for
 * a, and reduce_to for a broadcast b. */
LAUNCHER void add_fwd(act *y, const act *a, const act *b, int64_t n, int64_t nb)
{
    FSD_REQUIRE("add_fwd", y && a && b);
    FSD_REQUIRE("add_fwd", n > 0 && nb > 0 && n % nb == 0);
    if (nb == n)
        FSD_RUN_ELEMS(add_same, n, (y, a, b));
    else
        FSD_RUN_ELEMS(add_fwd, n, (y, a, b, nb));
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

/* mul_fwd: y[i] = a[i] · b[i mod nb]; y, a [n], b [nb], n a multiple of
 * nb. y may be a. */
LAUNCHER void mul_fwd(act *y, const act *a, const act *b, int64_t n, int64_t nb)
{
    FSD_REQUIRE("mul_fwd", y && a && b);
    FSD_REQUIRE("mul_fwd", n > 0 && nb > 0 && n % nb == 0);
    if (nb == n)
        FSD_RUN_ELEMS(mul_same, n, (y, a, b));
    else
        FSD_RUN_ELEMS(mul_fwd, n, (y, a, b, nb));
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
FSD_COL_SUM_KERNEL(mul_bwd_b, (const act *dy, const act *a, int64_t nb), (dy, a, nb))

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
    FSD_RUN_COL_SUMS(mul_bwd_b, n / nb, nb, acc_b, (db), (dy, a, nb));
    if (nb == n)
        FSD_RUN_ELEMS(mul_bwd_a_same, n, (da, acc_a, dy, b));
    else
        FSD_RUN_ELEMS(mul_bwd_a, n, (da, acc_a, dy, b, nb));
}

/* ── the Linear bias ── */

/* one row: y[r, :] = x[r, :] + b, lanes strided over the columns (no
 * division per element, as add_fwd's broadcast index would take) */
DEVICE void bias_add_row(int64_t row, int lane, int lanes, act *y, const act *x, const act *b,
                         int64_t C)
{
    FSD_SIMD
    for (int64_t j = lane; j < C; j += lanes)
        y[row * C + j] = fsd_narrow(fsd_wide(x[row * C + j]) + fsd_wide(b[j]));
}
FSD_ROW_KERNEL(bias_add, (act *y, const act *x, const act *b, int64_t C), (y, x, b, C))

/* bias_add_fwd: y[r, j] = x[r, j] + b[j]; y, x [rows, C], b [C]. y may
 * be x. */
LAUNCHER void bias_add_fwd(act *y, const act *x, const act *b, int64_t rows, int64_t C)
{
    FSD_REQUIRE("bias_add_fwd", y && x && b);
    FSD_REQUIRE("bias_add_fwd", rows > 0 && C > 0);
    FSD_RUN_ROWS(bias_add, rows, (y, x, b, C));
}

/* bias_bwd: db[j] += Σ_r dy[r, j]; always accumulates (a parameter
 * gradient). db [C], dy [rows, C]. */
LAUNCHER void bias_bwd(act *db, const act *dy, int64_t rows, int64_t C)
{
    FSD_REQUIRE("bias_bwd", db && dy);
    FSD_REQUIRE("bias_bwd", rows > 0 && C > 0);
    FSD_RUN_COL_SUMS(reduce_to, rows, C, true, (db), (dy, C));
}

/* ── gradient plumbing ── */

/* reduce_to: dst[j] (+)= Σ_{i mod n_dst = j} src[i]; src [n_src], dst
 * [n_dst], n_src a multiple of n_dst. The gradient of add_fwd's broadcast
 * operand. */
LAUNCHER void reduce_to(act *dst, bool acc, const act *src, int64_t n_src, int64_t n_dst)
{
    FSD_REQUIRE("reduce_to", dst && src && dst != src);
    FSD_REQUIRE("reduce_to", n_src > 0 && n_dst > 0 && n_src % n_dst == 0);
    FSD_RUN_COL_SUMS(reduce_to, n_src / n_dst, n_dst, acc, (dst), (src, n_dst));
}

DEVICE void copy_elem(int64_t i, act *dst, bool acc, const act *src)
{
    fsd_store(&dst[i], fsd_wide(src[i]), acc);
}
FSD_ELEM_KERNEL(copy, (act *dst, bool acc, const act *src), (dst, acc, src))

/* copy: dst[i] (+)= src[i]; dst, src [n]. A gradient passed on to a value
 * whose gradient buffer is already taken. */
LAUNCHER void copy(act *dst, bool acc, const act *src, int64_t n)
{
    FSD_REQUIRE("copy", dst && src && n > 0);
    FSD_RUN_ELEMS(copy, n, (dst, acc, src));
}
