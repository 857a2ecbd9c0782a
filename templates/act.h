/*
 * act.h — activations, elementwise over n elements: gelu (the tanh
 * approximation GPT-2 uses), relu, silu, and swiglu y = silu(g)·u (Llama's
 * MLP). Forward outputs are overwritten; the backward's input gradients
 * accumulate when their acc flag says so. In place (y == x, dx == dy) is
 * safe: each element is read before it is written. Needs portable.h.
 *
 * On the GPU each kernel has a 16-byte vector version (X_v, portable.h's
 * FSD_VEC) that calls the scalar body on a vector's elements: the same bits,
 * taken when n is a multiple of FSD_VEC and every pointer 16-byte aligned.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

#ifdef FSD_VEC
/* The vector versions of the two shapes here: X_v_elem(v, ...) runs X_elem
 * on elements [v·FSD_VEC, (v + 1)·FSD_VEC), every input (and an acc output's
 * old values) loaded before anything is stored, so in place stays safe. */
#define FSD_ACT_FWD_V(name)                                                  \
    DEVICE void name##_v_elem(int64_t v, act *y, const act *x)               \
    {                                                                        \
        const int64_t i = v * FSD_VEC;                                       \
        fsd_vec vx = fsd_vload(x + i), vy = fsd_vzero();                     \
        FSD_VEC_FOR(k)                                                       \
            name##_elem(k, vy.a, vx.a);                                      \
        fsd_vstore(y + i, vy);                                               \
    }                                                                        \
    FSD_ELEM_KERNEL(name##_v, (act *y, const act *x), (y, x))
#define FSD_ACT_BWD_V(name)                                                  \
    DEVICE void name##_v_elem(int64_t v, act *dx, bool acc, const act *dy,   \
                              const act *x)                                  \
    {                                                                        \
        const int64_t i = v * FSD_VEC;                                       \
        fsd_vec vdy = fsd_vload(dy + i), vx = fsd_vload(x + i);              \
        fsd_vec vdx = fsd_vload_acc(dx + i, acc);                            \
        FSD_VEC_FOR(k)                                                       \
            name##_elem(k, vdx.a, acc, vdy.a, vx.a);                         \
        fsd_vstore(dx + i, vdx);                                             \
    }                                                                        \
    FSD_ELEM_KERNEL(name##_v, (act *dx, bool acc, const act *dy, const act *x), (dx, acc, dy, x))
#else
#define FSD_ACT_FWD_V(name)
#define FSD_ACT_BWD_V(name)
#endif
/* whether the vector version fits: n a multiple of FSD_VEC, p, q, r aligned */
#define FSD_ACT_VEC(n, p, q, r) \
    FSD_VEC_WHEN((n) % FSD_VEC == 0 && fsd_al16(p) && fsd_al16(q) && fsd_al16(r))

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
FSD_ACT_FWD_V(gelu_fwd)

/* gelu_fwd: y [n] = gelu(x [n]). */
LAUNCHER void gelu_fwd(act *y, const act *x, int64_t n)
{
    FSD_REQUIRE("gelu_fwd", y && x && n > 0);
    if (FSD_ACT_VEC(n, y, x, x))
        FSD_RUN_VEC_ELEMS(gelu_fwd_v, n, (y, x));
    else
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
FSD_ACT_BWD_V(gelu_bwd)

/* gelu_bwd: dx [n] (+)= dy [n] · gelu'(x [n]). */
LAUNCHER void gelu_bwd(act *dx, bool acc, const act *dy, const act *x, int64_t n)
{
    FSD_REQUIRE("gelu_bwd", dx && dy && x && n > 0);
    if (FSD_ACT_VEC(n, dx, dy, x))
        FSD_RUN_VEC_ELEMS(gelu_bwd_v, n, (dx, acc, dy, x));
    else
        FSD_RUN_ELEMS(gelu_bwd, n, (dx, acc, dy, x));
}

/* ── relu: y = max(x, 0); relu'(0) = 0, as PyTorch ── */

DEVICE void relu_fwd_elem(int64_t i, act *y, const act *x)
{
    real v = fsd_wide(x[i]);
    y[i] = fsd_narrow(v > 0 ? v : 0);
}
FSD_ELEM_KERNEL(relu_fwd, (act *y, const act *x), (y, x))
FSD_ACT_FWD_V(relu_fwd)

/* relu_fwd: y [n] = max(x [n], 0). */
LAUNCHER void relu_fwd(act *y, const act *x, int64_t n)
{
    FSD_REQUIRE("relu_fwd", y && x && n > 0);
    if (FSD_ACT_VEC(n, y, x, x))
        FSD_RUN_VEC_ELEMS(relu_fwd_v, n, (y, x));
    else
        FSD_RUN_ELEMS(relu_fwd, n, (y, x));
}

DEVICE void relu_bwd_elem(int64_t i, act *dx, bool acc, const act *dy, const act *x)
{
    fsd_store(&dx[i], fsd_wide(x[i]) > 0 ? fsd_wide(dy[i]) : 0, acc);
}
FSD_ELEM_KERNEL(relu_bwd, (act *dx, bool acc, const act *dy, const act *x), (dx, acc, dy, x))
FSD_ACT_BWD_V(relu_bwd)

/* relu_bwd: dx [n] (+)= x > 0 ? dy : 0. */
LAUNCHER void relu_bwd(act *dx, bool acc, const act *dy, const act *x, int64_t n)
{
    FSD_REQUIRE("relu_bwd", dx && dy && x && n > 0);
    if (FSD_ACT_VEC(n, dx, dy, x))
        FSD_RUN_VEC_ELEMS(relu_bwd_v, n, (dx, acc, dy, x));
    else
        FSD_RUN_ELEMS(relu_bwd, n, (dx, acc, dy, x));
}

/* ── silu: y = x·σ(x) ── */

DEVICE void silu_fwd_elem(int64_t i, act *y, const act *x)
{
    real v = fsd_wide(x[i]);
    y[i] = fsd_narrow(v * fsd_sigmoid(v));
}
FSD_ELEM_KERNEL(silu_fwd, (act *y, const act *x), (y, x))
FSD_ACT_FWD_V(silu_fwd)

/* silu_fwd: y [n] = x·σ(x). */
LAUNCHER void silu_fwd(act *y, const act *x, int64_t n)
{
    FSD_REQUIRE("silu_fwd", y && x && n > 0);
    if (FSD_ACT_VEC(n, y, x, x))
        FSD_RUN_VEC_ELEMS(silu_fwd_v, n, (y, x));
    else
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
FSD_ACT_BWD_V(silu_bwd)

/* silu_bwd: dx [n] (+)= dy · silu'(x). */
LAUNCHER void silu_bwd(act *dx, bool acc, const act *dy, const act *x, int64_t n)
{
    FSD_REQUIRE("silu_bwd", dx && dy && x && n > 0);
    if (FSD_ACT_VEC(n, dx, dy, x))
        FSD_RUN_VEC_ELEMS(silu_bwd_v, n, (dx, acc, dy, x));
    else
        FSD_RUN_ELEMS(silu_bwd, n, (dx, acc, dy, x));
}

/* ── swiglu: y = silu(g)·u ── */

DEVICE void swiglu_fwd_elem(int64_t i, act *y, const act *g, const act *u)
{
    real gv = fsd_wide(g[i]);
    y[i] = fsd_narrow(gv * fsd_sigmoid(gv) * fsd_wide(u[i]));
}
FSD_ELEM_KERNEL(swiglu_fwd, (act *y, const act *g, const act *u), (y, g, u))

#ifdef FSD_VEC
DEVICE void swiglu_fwd_v_elem(int64_t v, act *y, const act *g, const act *u)
{
    const int64_t i = v * FSD_VEC;
    fsd_vec vg = fsd_vload(g + i), vu = fsd_vload(u + i), vy = fsd_vzero();
    FSD_VEC_FOR(k)
        swiglu_fwd_elem(k, vy.a, vg.a, vu.a);
    fsd_vstore(y + i, vy);
}
FSD_ELEM_KERNEL(swiglu_fwd_v, (act *y, const act *g, const act *u), (y, g, u))
#endif

/* swiglu_fwd: y [n] = silu(g [n]) · u [n]. */
LAUNCHER void swiglu_fwd(act *y, const act *g, const act *u, int64_t n)
{
    FSD_REQUIRE("swiglu_fwd", y && g && u && n > 0);
    if (FSD_ACT_VEC(n, y, g, u))
        FSD_RUN_VEC_ELEMS(swiglu_fwd_v, n, (y, g, u));
    else
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

#ifdef FSD_VEC
DEVICE void swiglu_bwd_v_elem(int64_t v, act *dg, bool acc_g, act *du, bool acc_u,
                              const act *dy, const act *g, const act *u)
{
    const int64_t i = v * FSD_VEC;
    fsd_vec vdy = fsd_vload(dy + i), vg = fsd_vload(g + i), vu = fsd_vload(u + i);
    fsd_vec vdg = fsd_vload_acc(dg + i, acc_g), vdu = fsd_vload_acc(du + i, acc_u);
    FSD_VEC_FOR(k)
        swiglu_bwd_elem(k, vdg.a, acc_g, vdu.a, acc_u, vdy.a, vg.a, vu.a);
    fsd_vstore(dg + i, vdg);
    fsd_vstore(du + i, vdu);
}
FSD_ELEM_KERNEL(swiglu_bwd_v,
                (act *dg, bool acc_g, act *du, bool acc_u, const act *dy, const act *g,
                 const act *u),
                (dg, acc_g, du, acc_u, dy, g, u))
#endif

/* swiglu_bwd: dg [n] (+)= dy · u · silu'(g);  du [n] (+)= dy · silu(g). */
LAUNCHER void swiglu_bwd(act *dg, bool acc_g, act *du, bool acc_u, const act *dy,
                         const act *g, const act *u, int64_t n)
{
    FSD_REQUIRE("swiglu_bwd", dg && du && dy && g && u && n > 0);
    FSD_REQUIRE("swiglu_bwd", dg != du);
    if (FSD_ACT_VEC(n, dg, dy, g) && FSD_VEC_WHEN(fsd_al16(du) && fsd_al16(u)))
        FSD_RUN_VEC_ELEMS(swiglu_bwd_v, n, (dg, acc_g, du, acc_u, dy, g, u));
    else
        FSD_RUN_ELEMS(swiglu_bwd, n, (dg, acc_g, du, acc_u, dy, g, u));
}
