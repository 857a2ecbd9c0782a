/*
 * act.h — activations, elementwise over n elements: gelu (the tanh
 * approximation GPT-2 uses), relu, silu, and swiglu y = silu(g)·u (Llama's
 * MLP). Forward outputs are overwritten; the backward's input gradients
 * accumulate when their acc flag says so. In place (y == x, dx == dy) is
 * safe: each element is read before it is written. Needs portable.h.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

#define FSD_GELU_K 0.7978845608028654   /* √(2/π) */
#define FSD_GELU_C 0.044715

DEVICE real fsd_sigmoid(real x) { return 1 / (1 + fsd_exp(-x)); }

/* ── gelu: y = ½x(1 + tanh(√(2/π)(x + 0.044715x³))) ──
 *
 * Computed as x·σ(2u), u = √(2/π)(x + 0.044715x³): ½(1 + tanh u) = σ(2u)
 * exactly, and one exp costs a fraction of a tanh (glibc's tanhf is about
 * 7x its expf); σ has no cancellation where tanh u nears −1. */

DEVICE void gelu_fwd_elem(int64_t i, act *y, const act *x)
{
    real v = fsd_wide(x[i]);
    real u = (real)FSD_GELU_K * (v + (real)FSD_GELU_C * v * v * v);
    y[i] = fsd_narrow(v / (1 + fsd_exp(-2 * u)));
}
FSD_ELEM_KERNEL(gelu_fwd, (act *y, const act *x), (y, x))

/* gelu_fwd: y [n] = gelu(x [n]). */
LAUNCHER void gelu_fwd(act *y, const act *x, int64_t n)
{
    FSD_REQUIRE("gelu_fwd", y && x && n > 0);
    FSD_RUN_ELEMS(gelu_fwd, n, (y, x));
}

/* dy/dx = ½(1 + tanh u) + ½x(1 − tanh²u)·u', u' = √(2/π)(1 + 3·0.044715x²);
 * with s = σ(2u) = ½(1 + tanh u), ½(1 − tanh²u) = 2s(1 − s):
 * dy/dx = s + 2x·s(1 − s)·u' */
DEVICE void gelu_bwd_elem(int64_t i, act *dx, bool acc, const act *dy, const act *x)
{
    real v = fsd_wide(x[i]);
    real u = (real)FSD_GELU_K * (v + (real)FSD_GELU_C * v * v * v);
    real s = 1 / (1 + fsd_exp(-2 * u));
    real du = (real)FSD_GELU_K * (1 + 3 * (real)FSD_GELU_C * v * v);
    real grad = s + 2 * v * s * (1 - s) * du;
    fsd_store(&dx[i], fsd_wide(dy[i]) * grad, acc);
}
FSD_ELEM_KERNEL(gelu_bwd, (act *dx, bool acc, const act *dy, const act *x), (dx, acc, dy, x))

/* gelu_bwd: dx [n] (+)= dy [n] · gelu'(x [n]). */
LAUNCHER void gelu_bwd(act *dx, bool acc, const act *dy, const act *x, int64_t n)
{
    FSD_REQUIRE("gelu_bwd", dx && dy && x && n > 0);
    FSD_RUN_ELEMS(gelu_bwd, n, (dx, acc, dy, x));
}

/* ── relu: y = max(x, 0); relu'(0) = 0, as PyTorch ── */

DEVICE void relu_fwd_elem(int64_t i, act *y, const act *x)
{
    real v = fsd_wide(x[i]);
    y[i] = fsd_narrow(v > 0 ? v : 0);
}
FSD_ELEM_KERNEL(relu_fwd, (act *y, const act *x), (y, x))

/* relu_fwd: y [n] = max(x [n], 0). */
LAUNCHER void relu_fwd(act *y, const act *x, int64_t n)
{
    FSD_REQUIRE("relu_fwd", y && x && n > 0);
    FSD_RUN_ELEMS(relu_fwd, n, (y, x));
}

DEVICE void relu_bwd_elem(int64_t i, act *dx, bool acc, const act *dy, const act *x)
{
    fsd_store(&dx[i], fsd_wide(x[i]) > 0 ? fsd_wide(dy[i]) : 0, acc);
}
FSD_ELEM_KERNEL(relu_bwd, (act *dx, bool acc, const act *dy, const act *x), (dx, acc, dy, x))

/* relu_bwd: dx [n] (+)= x > 0 ? dy : 0. */
LAUNCHER void relu_bwd(act *dx, bool acc, const act *dy, const act *x, int64_t n)
{
    FSD_REQUIRE("relu_bwd", dx && dy && x && n > 0);
    FSD_RUN_ELEMS(relu_bwd, n, (dx, acc, dy, x));
}

/* ── silu: y = x·σ(x) ── */

DEVICE void silu_fwd_elem(int64_t i, act *y, const act *x)
{
    real v = fsd_wide(x[i]);
    y[i] = fsd_narrow(v * fsd_sigmoid(v));
}
FSD_ELEM_KERNEL(silu_fwd, (act *y, const act *x), (y, x))

/* silu_fwd: y [n] = x·σ(x). */
LAUNCHER void silu_fwd(act *y, const act *x, int64_t n)
{
    FSD_REQUIRE("silu_fwd", y && x && n > 0);
    FSD_RUN_ELEMS(silu_fwd, n, (y, x));
}

/* silu'(x) = σ(x)·(1 + x·(1 − σ(x))) */
DEVICE real fsd_silu_grad(real x)
{
    real sg = fsd_sigmoid(x);
    return sg * (1 + x * (1 - sg));
}

DEVICE void silu_bwd_elem(int64_t i, act *dx, bool acc, const act *dy, const act *x)
{
    fsd_store(&dx[i], fsd_wide(dy[i]) * fsd_silu_grad(fsd_wide(x[i])), acc);
}
FSD_ELEM_KERNEL(silu_bwd, (act *dx, bool acc, const act *dy, const act *x), (dx, acc, dy, x))

/* silu_bwd: dx [n] (+)= dy · silu'(x). */
LAUNCHER void silu_bwd(act *dx, bool acc, const act *dy, const act *x, int64_t n)
{
    FSD_REQUIRE("silu_bwd", dx && dy && x && n > 0);
    FSD_RUN_ELEMS(silu_bwd, n, (dx, acc, dy, x));
}

/* ── swiglu: y = silu(g)·u ── */

DEVICE void swiglu_fwd_elem(int64_t i, act *y, const act *g, const act *u)
{
    real gv = fsd_wide(g[i]);
    y[i] = fsd_narrow(gv * fsd_sigmoid(gv) * fsd_wide(u[i]));
}
FSD_ELEM_KERNEL(swiglu_fwd, (act *y, const act *g, const act *u), (y, g, u))

/* swiglu_fwd: y [n] = silu(g [n]) · u [n]. */
LAUNCHER void swiglu_fwd(act *y, const act *g, const act *u, int64_t n)
{
    FSD_REQUIRE("swiglu_fwd", y && g && u && n > 0);
    FSD_RUN_ELEMS(swiglu_fwd, n, (y, g, u));
}

DEVICE void swiglu_bwd_elem(int64_t i, act *dg, bool acc_g, act *du, bool acc_u,
                            const act *dy, const act *g, const act *u)
{
    /* read all before writing: dg may alias dy */
    real d = fsd_wide(dy[i]), gv = fsd_wide(g[i]), uv = fsd_wide(u[i]);
    fsd_store(&dg[i], d * uv * fsd_silu_grad(gv), acc_g);
    fsd_store(&du[i], d * gv * fsd_sigmoid(gv), acc_u);
}
FSD_ELEM_KERNEL(swiglu_bwd,
                (act *dg, bool acc_g, act *du, bool acc_u, const act *dy, const act *g,
                 const act *u),
                (dg, acc_g, du, acc_u, dy, g, u))

/* swiglu_bwd: dg [n] (+)= dy · u · silu'(g);  du [n] (+)= dy · silu(g). */
LAUNCHER void swiglu_bwd(act *dg, bool acc_g, act *du, bool acc_u, const act *dy,
                         const act *g, const act *u, int64_t n)
{
    FSD_REQUIRE("swiglu_bwd", dg && du && dy && g && u && n > 0);
    FSD_REQUIRE("swiglu_bwd", dg != du);
    FSD_RUN_ELEMS(swiglu_bwd, n, (dg, acc_g, du, acc_u, dy, g, u));
}
