/*
 * test_kernels.c — numerical tests of the kernel templates (templates/),
 * on the CPU backend. tests/kernels/run.sh builds it three ways:
 *
 *   -DFSD_FLOAT64  every backward kernel against central finite differences
 *                  of its forward, along random directions (relative error
 *                  under 1e-6), plus everything below at tight tolerances;
 *   float          the forward kernels against reference formulas computed
 *                  here in double, with float tolerances;
 *   -DFSD_ACT_BF16 float math on bf16 tensors (`act`, runtime/fsdrt.h):
 *                  inputs drawn and rounded to bf16, the formulas computed
 *                  from the rounded inputs, bf16 tolerances (below).
 *
 * Tensors are `act` buffers, statistics (mean, rstd, lse, the loss) `real`
 * ones, as the kernels take them; the checks read both as double (wide).
 * Every build also checks the output-accumulation contract (acc false never
 * reads the output; acc true and parameter gradients add to it), that
 * column reductions and the loss do not depend on the thread count, and
 * that launchers refuse bad arguments. With -DFSD_WARP_EMULATION the row
 * kernels run with 32 lanes, as on the GPU, and the block kernels (the
 * GPU's tiled attention) as teams of 128 threads (warp_emulation.h); the
 * tiled attention is then checked against float64 formulas at ragged tile
 * shapes, and through finite differences. With bf16 act there too, the
 * tensor-core primitives (mma.h, their fragments emulated as collectives
 * of the warp) and the attention kernels built on them are checked the
 * same way against float64 formulas. In the emulation builds (and on the
 * GPU) every 16-byte vector kernel (portable.h's FSD_VEC) runs against its
 * scalar kernel on the same inputs: aligned buffers take the vector path,
 * misaligned and ragged ones the scalar path, and the emulation's count of
 * vector launches says which ran. The same file compiles with nvcc
 * (managed memory, a sync after every launch), so a GPU machine can run it
 * too; run.sh uses that as the CUDA compile check.
 *
 * One line per check; the last line is "N passed, N failed".
 */
#define _POSIX_C_SOURCE 200809L
#include "portable.h"
#include "embed.h"
#include "norm.h"
#include "rope.h"
#include "attention.h"
#include "act.h"
#include "elementwise.h"
#include "cross_entropy.h"

#include <float.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef FSD_FLOAT64
#define PRECISION "float64"
#define REF_TOL 1e-12   /* kernel vs reference formula, relative to the reference's scale */
#define ACC_TOL 1e-12   /* acc: new − old vs the overwriting result */
#elif defined(FSD_ACT_IS_BF16)
#define PRECISION "bf16"
/* bf16 keeps 8 significant bits: rounding a stored output once moves it by
 * at most half an ulp, 2^-8 of its value (2^-9 on average), so at most
 * 2^-8 of the reference's scale. The float arithmetic before it adds
 * ~1e-6, and reductions (the norms' gradients, column sums, the softmax
 * sums) accumulate in float and round once. REF_TOL allows two such
 * roundings: the output's and, where a kernel reads a tensor an earlier
 * kernel rounded (attention's backward reads out), one more. ACC_TOL: the
 * acc-false result v is rounded (2^-8 of the scale), the acc-true one is
 * old + v rounded (up to twice the scale, so 2·2^-8): 3·2^-8, and float
 * arithmetic besides. */
#define REF_TOL 0x1p-7
#define ACC_TOL 0x1p-6
#else
#define PRECISION "float32"
#define REF_TOL 2e-6
#define ACC_TOL 2e-6
#endif
#define FD_TOL 1e-6
#define FD_EPS 1e-5
#define FD_DIRS 3

static int npass, nfail;

static void report(bool ok, double err, double tol, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void report(bool ok, double err, double tol, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    va_end(ap);
    if (err >= 0)
        printf(": max rel err %.2e (tol %.0e)", err, tol);
    printf("\n");
    if (ok)
        npass++;
    else
        nfail++;
}

static void check_err(double err, double tol, const char *what, const char *name)
{
    report(err <= tol, err, tol, "%s %s", what, name);
}

/* ── memory (managed under CUDA) and random numbers ── */

#ifdef __CUDACC__
#define SYNC() cudaDeviceSynchronize()
#else
#define SYNC() ((void)0)
#endif

static void *allocs[4096];
static int nallocs;

static void *alloc_bytes(size_t n)
{
    void *p;
#ifdef __CUDACC__
    if (cudaMallocManaged(&p, n, cudaMemAttachGlobal) != cudaSuccess)
        p = NULL;
#else
    p = malloc(n);
#endif
    if (!p || nallocs == (int)(sizeof allocs / sizeof allocs[0])) {
        fprintf(stderr, "test_kernels: out of memory\n");
        exit(2);
    }
    return allocs[nallocs++] = p;
}

static void free_all(void)
{
    for (int i = 0; i < nallocs; i++) {
#ifdef __CUDACC__
        cudaFree(allocs[i]);
#else
        free(allocs[i]);
#endif
    }
    nallocs = 0;
}

static act *new_act(int64_t n) { return (act *)alloc_bytes(sizeof(act) * (size_t)n); }
static real *new_real(int64_t n) { return (real *)alloc_bytes(sizeof(real) * (size_t)n); }
static double *new_double(int64_t n) { return (double *)alloc_bytes(sizeof(double) * (size_t)n); }

/* A stored tensor's value, and a value rounded to what act holds: the
 * checks compute in double from what the kernels read. */
static double wide(act v) { return (double)fsd_wide(v); }
static act narrow(double x) { return fsd_narrow((real)x); }

static uint64_t rng = 0x2545f4914f6cdd1dull;

static double urand(void)   /* splitmix64 → [0, 1) */
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static double uniform(double lo, double hi) { return lo + (hi - lo) * urand(); }

/* n values uniform in [lo, hi), rounded to act */
static act *rand_act(int64_t n, double lo, double hi)
{
    act *x = new_act(n);
    for (int64_t i = 0; i < n; i++)
        x[i] = narrow(uniform(lo, hi));
    return x;
}

/* |x| in [0.05, 1]: away from relu's kink */
static act *rand_away_from_zero(int64_t n)
{
    act *x = new_act(n);
    for (int64_t i = 0; i < n; i++)
        x[i] = narrow(uniform(0.05, 1.0) * (urand() < 0.5 ? -1 : 1));
    return x;
}

static int32_t *rand_idx(int64_t n, int64_t bound)
{
    int32_t *idx = (int32_t *)alloc_bytes(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        idx[i] = (int32_t)(urand() * (double)bound);
    return idx;
}

/* One element of an error relative to the reference's scale: num (the
 * largest |got − want|) and den (the largest |want|) so far. NaN counts as
 * infinitely wrong. */
static void err_add(double *num, double *den, double got, double want)
{
    double d = fabs(got - want);
    if (!(d <= *num))
        *num = d == d ? d : INFINITY;
    *den = fmax(*den, fabs(want));
}

static bool same_bits(const act *a, const act *b, int64_t n)
{
    return memcmp(a, b, sizeof(act) * (size_t)n) == 0;
}

/* max |a − ref| / max |ref|, for a tensor and for a statistic */
static double err_vs(const act *a, const double *ref, int64_t n)
{
    double num = 0, den = 1e-300;
    for (int64_t i = 0; i < n; i++)
        err_add(&num, &den, wide(a[i]), ref[i]);
    return num / den;
}
static double err_vs_stat(const real *a, const double *ref, int64_t n)
{
    double num = 0, den = 1e-300;
    for (int64_t i = 0; i < n; i++)
        err_add(&num, &den, (double)a[i], ref[i]);
    return num / den;
}

/* ═══════════════ backward kernels: acc contract and finite differences ═══════════════ */

/* One kernel pair at one shape. The harness differentiates the scalar
 * L = Σ r·y, with y the forward's (first) output and r random, with
 * respect to each variable: the backward gets dy = r. */
typedef struct Var {
    const char *name;
    act *x, *dx;
    int64_t n;
    bool param;      /* a parameter gradient: always accumulates */
} Var;

typedef struct Case Case;
struct Case {
    char name[256];
    Var v[3];
    int nv;
    act *y, *r;      /* the differentiated output and dL/dy */
    int64_t ny;
    bool acc;        /* for the backward's activation gradients */
    void (*fwd)(Case *);
    void (*bwd)(Case *);
    /* what fwd and bwd need */
    int64_t B, T, H, KV, hd, rows, C, n, nb, V;
    bool causal;
    real eps, theta;
    real *s1, *s2;   /* saved statistics: mean/rstd, lse; the loss */
    int32_t *idx;
};

static Case *new_case(const char *name)
{
    Case *c = (Case *)alloc_bytes(sizeof(Case));
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    return c;
}

static void add_var(Case *c, const char *name, act *x, int64_t n, bool param)
{
    Var *v = &c->v[c->nv++];
    v->name = name;
    v->x = x;
    v->n = n;
    v->param = param;
    v->dx = new_act(n);
}

static void set_out(Case *c, act *y, int64_t ny)
{
    c->y = y;
    c->ny = ny;
    c->r = rand_act(ny, -1, 1);
}

#ifdef FSD_FLOAT64
static double loss_of(Case *c)
{
    c->fwd(c);
    SYNC();
    double L = 0;
    for (int64_t i = 0; i < c->ny; i++)
        L += wide(c->r[i]) * wide(c->y[i]);
    return L;
}
#endif

static void run_case(Case *c)
{
    double *G[3], *P[3];
    c->fwd(c);
    SYNC();

    /* 1. acc false: activation gradients must not read their output (NaN
     * there would show); parameter gradients add to zeros. */
    for (int k = 0; k < c->nv; k++)
        for (int64_t i = 0; i < c->v[k].n; i++)
            c->v[k].dx[i] = narrow(c->v[k].param ? 0 : NAN);
    c->acc = false;
    c->bwd(c);
    SYNC();
    bool finite = true;
    for (int k = 0; k < c->nv; k++) {
        G[k] = new_double(c->v[k].n);
        P[k] = new_double(c->v[k].n);
        for (int64_t i = 0; i < c->v[k].n; i++) {
            G[k][i] = wide(c->v[k].dx[i]);
            finite = finite && G[k][i] == G[k][i] && fabs(G[k][i]) < INFINITY;
        }
    }
    report(finite, -1, 0, "overwrite %s: acc false ignores the output's old value", c->name);

    /* 2. on random old values: acc true adds to them, acc false replaces
     * them, parameter gradients add either way */
    double worst = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int k = 0; k < c->nv; k++)
            for (int64_t i = 0; i < c->v[k].n; i++) {
                c->v[k].dx[i] = narrow(uniform(-1, 1));
                P[k][i] = wide(c->v[k].dx[i]);
            }
        c->acc = pass == 1;
        c->bwd(c);
        SYNC();
        for (int k = 0; k < c->nv; k++) {
            double num = 0, den = 1e-300;
            for (int64_t i = 0; i < c->v[k].n; i++) {
                double want = (c->acc || c->v[k].param ? P[k][i] : 0) + G[k][i];
                num = fmax(num, fabs(wide(c->v[k].dx[i]) - want));
                den = fmax(den, fmax(fabs(G[k][i]), fabs(P[k][i])));
            }
            worst = fmax(worst, num / den);
        }
    }
    check_err(worst, ACC_TOL, "accumulate", c->name);

#ifdef FSD_FLOAT64
    /* 3. central differences of L along random directions, per variable
     * (float64 only: act is real there) */
    for (int k = 0; k < c->nv; k++) {
        Var *v = &c->v[k];
        act *x0 = new_act(v->n);
        double *u = new_double(v->n), err = 0;
        memcpy(x0, v->x, sizeof(act) * (size_t)v->n);
        for (int dir = 0; dir < FD_DIRS; dir++) {
            double an = 0;
            for (int64_t i = 0; i < v->n; i++) {
                u[i] = uniform(-1, 1);
                an += G[k][i] * u[i];
            }
            for (int64_t i = 0; i < v->n; i++)
                v->x[i] = x0[i] + FD_EPS * u[i];
            double Lp = loss_of(c);
            for (int64_t i = 0; i < v->n; i++)
                v->x[i] = x0[i] - FD_EPS * u[i];
            double Lm = loss_of(c);
            memcpy(v->x, x0, sizeof(act) * (size_t)v->n);
            double fd = (Lp - Lm) / (2 * FD_EPS);
            /* A central difference cannot resolve a derivative below the
             * rounding of L over 2·FD_EPS: that much is zero to it. Where
             * the true derivative is zero (causal attention at T = 1: the
             * one key's weight is 1 whatever q and k are), the analytic
             * one is float64 rounding (~1e-17) whose size depends on the
             * BLAS's summation order; relative to 0 it would read as 100%. */
            double resolution = 1e3 * DBL_EPSILON * fmax(1, fmax(fabs(Lp), fabs(Lm))) / FD_EPS;
            err = fmax(err, fabs(fd - an) / fmax(fmax(fabs(fd), fabs(an)), resolution));
        }
        report(err <= FD_TOL, err, FD_TOL, "finite-diff %s d%s", c->name, v->name);
    }
    c->fwd(c);   /* the saved statistics of the unperturbed point */
    SYNC();
#endif
}

/* ── the pairs ── */

static void embed_case_fwd(Case *c) { embed_fwd(c->y, c->v[0].x, c->idx, c->n, c->C, c->V); }
static void embed_case_bwd(Case *c) { embed_bwd(c->v[0].dx, c->r, c->idx, c->n, c->C, c->V); }

static void case_embed(int64_t N, int64_t V, int64_t C)
{
    char name[256];
    snprintf(name, sizeof name, "embed N=%ld V=%ld C=%ld", (long)N, (long)V, (long)C);
    Case *c = new_case(name);
    c->n = N, c->V = V, c->C = C;
    c->idx = rand_idx(N, V);   /* N > V: tokens repeat, their gradients add */
    add_var(c, "W", rand_act(V * C, -1, 1), V * C, true);
    set_out(c, new_act(N * C), N * C);
    c->fwd = embed_case_fwd;
    c->bwd = embed_case_bwd;
    run_case(c);
}

static void ln_case_fwd(Case *c)
{
    layernorm_fwd(c->y, c->s1, c->s2, c->v[0].x, c->v[1].x, c->v[2].x, c->rows, c->C, c->eps);
}
static void ln_case_bwd(Case *c)
{
    layernorm_bwd(c->v[0].dx, c->acc, c->v[1].dx, c->v[2].dx, c->r, c->v[0].x, c->v[1].x, c->s1,
                  c->s2, c->rows, c->C);
}

/* LayerNorm(dim, bias = false): the same launchers, b and db NULL */
static void ln_nobias_case_fwd(Case *c)
{
    layernorm_fwd(c->y, c->s1, c->s2, c->v[0].x, c->v[1].x, NULL, c->rows, c->C, c->eps);
}
static void ln_nobias_case_bwd(Case *c)
{
    layernorm_bwd(c->v[0].dx, c->acc, c->v[1].dx, NULL, c->r, c->v[0].x, c->v[1].x, c->s1, c->s2,
                  c->rows, c->C);
}

static void case_layernorm(int64_t rows, int64_t C, bool bias)
{
    char name[256];
    snprintf(name, sizeof name, "layernorm%s rows=%ld C=%ld", bias ? "" : " (no bias)",
             (long)rows, (long)C);
    Case *c = new_case(name);
    c->rows = rows, c->C = C, c->eps = (real)1e-5;
    add_var(c, "x", rand_act(rows * C, -2, 3), rows * C, false);
    add_var(c, "w", rand_act(C, 0.5, 1.5), C, true);
    if (bias)
        add_var(c, "b", rand_act(C, -0.5, 0.5), C, true);
    c->s1 = new_real(rows);
    c->s2 = new_real(rows);
    set_out(c, new_act(rows * C), rows * C);
    c->fwd = bias ? ln_case_fwd : ln_nobias_case_fwd;
    c->bwd = bias ? ln_case_bwd : ln_nobias_case_bwd;
    run_case(c);
}

static void rms_case_fwd(Case *c)
{
    rmsnorm_fwd(c->y, c->s1, c->v[0].x, c->v[1].x, c->rows, c->C, c->eps);
}
static void rms_case_bwd(Case *c)
{
    rmsnorm_bwd(c->v[0].dx, c->acc, c->v[1].dx, c->r, c->v[0].x, c->v[1].x, c->s1, c->rows, c->C);
}

static void case_rmsnorm(int64_t rows, int64_t C)
{
    char name[256];
    snprintf(name, sizeof name, "rmsnorm rows=%ld C=%ld", (long)rows, (long)C);
    Case *c = new_case(name);
    c->rows = rows, c->C = C, c->eps = (real)1e-6;
    add_var(c, "x", rand_act(rows * C, -2, 2), rows * C, false);
    add_var(c, "w", rand_act(C, 0.5, 1.5), C, true);
    c->s1 = new_real(rows);
    set_out(c, new_act(rows * C), rows * C);
    c->fwd = rms_case_fwd;
    c->bwd = rms_case_bwd;
    run_case(c);
}

static void rope_case_fwd(Case *c)
{
    rope_fwd(c->y, c->v[0].x, c->B, c->T, c->H, c->hd, c->theta);
}
static void rope_case_bwd(Case *c)
{
    rope_bwd(c->v[0].dx, c->acc, c->r, c->B, c->T, c->H, c->hd, c->theta);
}

static void case_rope(int64_t B, int64_t T, int64_t H, int64_t hd, double theta)
{
    char name[256];
    snprintf(name, sizeof name, "rope B=%ld T=%ld H=%ld hd=%ld theta=%g", (long)B, (long)T,
             (long)H, (long)hd, theta);
    Case *c = new_case(name);
    c->B = B, c->T = T, c->H = H, c->hd = hd, c->theta = (real)theta;
    int64_t n = B * T * H * hd;
    add_var(c, "x", rand_act(n, -1, 1), n, false);
    set_out(c, new_act(n), n);
    c->fwd = rope_case_fwd;
    c->bwd = rope_case_bwd;
    run_case(c);
}

static void attn_case_fwd(Case *c)
{
    attention_fwd(c->y, c->s1, c->v[0].x, c->v[1].x, c->v[2].x, c->B, c->T, c->H, c->KV, c->hd,
                  c->causal);
}
static void attn_case_bwd(Case *c)
{
    attention_bwd(c->v[0].dx, c->acc, c->v[1].dx, c->acc, c->v[2].dx, c->acc, c->r, c->v[0].x,
                  c->v[1].x, c->v[2].x, c->y, c->s1, c->B, c->T, c->H, c->KV, c->hd, c->causal);
}

static void case_attention(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    char name[256];
    snprintf(name, sizeof name, "attention B=%ld T=%ld H=%ld KV=%ld hd=%ld %s", (long)B, (long)T,
             (long)H, (long)KV, (long)hd, causal ? "causal" : "non-causal");
    Case *c = new_case(name);
    c->B = B, c->T = T, c->H = H, c->KV = KV, c->hd = hd, c->causal = causal;
    int64_t nq = B * T * H * hd, nk = B * T * KV * hd;
    add_var(c, "q", rand_act(nq, -1.5, 1.5), nq, false);
    add_var(c, "k", rand_act(nk, -1.5, 1.5), nk, false);
    add_var(c, "v", rand_act(nk, -1, 1), nk, false);
    c->s1 = new_real(B * H * T);
    set_out(c, new_act(nq), nq);
    c->fwd = attn_case_fwd;
    c->bwd = attn_case_bwd;
    run_case(c);
}

static void gelu_case_fwd(Case *c) { gelu_fwd(c->y, c->v[0].x, c->n); }
static void gelu_case_bwd(Case *c) { gelu_bwd(c->v[0].dx, c->acc, c->r, c->v[0].x, c->n); }
static void relu_case_fwd(Case *c) { relu_fwd(c->y, c->v[0].x, c->n); }
static void relu_case_bwd(Case *c) { relu_bwd(c->v[0].dx, c->acc, c->r, c->v[0].x, c->n); }
static void silu_case_fwd(Case *c) { silu_fwd(c->y, c->v[0].x, c->n); }
static void silu_case_bwd(Case *c) { silu_bwd(c->v[0].dx, c->acc, c->r, c->v[0].x, c->n); }

static void case_unary(const char *op, int64_t n, void (*fwd)(Case *), void (*bwd)(Case *))
{
    char name[256];
    snprintf(name, sizeof name, "%s n=%ld", op, (long)n);
    Case *c = new_case(name);
    c->n = n;
    add_var(c, "x", strcmp(op, "relu") == 0 ? rand_away_from_zero(n) : rand_act(n, -4, 4), n,
            false);
    set_out(c, new_act(n), n);
    c->fwd = fwd;
    c->bwd = bwd;
    run_case(c);
}

static void swiglu_case_fwd(Case *c) { swiglu_fwd(c->y, c->v[0].x, c->v[1].x, c->n); }
static void swiglu_case_bwd(Case *c)
{
    swiglu_bwd(c->v[0].dx, c->acc, c->v[1].dx, c->acc, c->r, c->v[0].x, c->v[1].x, c->n);
}

static void case_swiglu(int64_t n)
{
    char name[256];
    snprintf(name, sizeof name, "swiglu n=%ld", (long)n);
    Case *c = new_case(name);
    c->n = n;
    add_var(c, "g", rand_act(n, -4, 4), n, false);
    add_var(c, "u", rand_act(n, -2, 2), n, false);
    set_out(c, new_act(n), n);
    c->fwd = swiglu_case_fwd;
    c->bwd = swiglu_case_bwd;
    run_case(c);
}

/* add's backward is what autodiff emits for it: a copy for a, and for b
 * reduce_to when it broadcasts, a copy otherwise */
static void add_case_fwd(Case *c) { add_fwd(c->y, c->v[0].x, c->v[1].x, c->n, c->nb); }
static void add_case_bwd(Case *c)
{
    copy(c->v[0].dx, c->acc, c->r, c->n);
    if (c->nb < c->n)
        reduce_to(c->v[1].dx, c->acc, c->r, c->n, c->nb);
    else
        copy(c->v[1].dx, c->acc, c->r, c->n);
}
static void mul_case_fwd(Case *c) { mul_fwd(c->y, c->v[0].x, c->v[1].x, c->n, c->nb); }
static void mul_case_bwd(Case *c)
{
    mul_bwd(c->v[0].dx, c->acc, c->v[1].dx, c->acc, c->r, c->v[0].x, c->v[1].x, c->n, c->nb);
}

static void case_binary(const char *op, int64_t n, int64_t nb, void (*fwd)(Case *),
                        void (*bwd)(Case *))
{
    char name[256];
    snprintf(name, sizeof name, "%s n=%ld nb=%ld (%s)", op, (long)n, (long)nb,
             nb < n ? "broadcast b" : "same shape");
    Case *c = new_case(name);
    c->n = n, c->nb = nb;
    add_var(c, "a", rand_act(n, -2, 2), n, false);
    add_var(c, "b", rand_act(nb, -2, 2), nb, false);
    set_out(c, new_act(n), n);
    c->fwd = fwd;
    c->bwd = bwd;
    run_case(c);
}

static void bias_case_fwd(Case *c) { bias_add_fwd(c->y, c->v[0].x, c->v[1].x, c->rows, c->C); }
static void bias_case_bwd(Case *c)
{
    copy(c->v[0].dx, c->acc, c->r, c->rows * c->C);
    bias_bwd(c->v[1].dx, c->r, c->rows, c->C);
}

static void case_bias(int64_t rows, int64_t C)
{
    char name[256];
    snprintf(name, sizeof name, "bias_add rows=%ld C=%ld", (long)rows, (long)C);
    Case *c = new_case(name);
    c->rows = rows, c->C = C;
    add_var(c, "x", rand_act(rows * C, -2, 2), rows * C, false);
    add_var(c, "b", rand_act(C, -1, 1), C, true);
    set_out(c, new_act(rows * C), rows * C);
    c->fwd = bias_case_fwd;
    c->bwd = bias_case_bwd;
    run_case(c);
}

/* The loss is a statistic (real, in s2); the harness differentiates an
 * act output, so the forward copies it there (exactly where finite
 * differences run: act is real in the float64 build). */
static void ce_case_fwd(Case *c)
{
    cross_entropy_fwd(c->s2, c->s1, c->v[0].x, c->idx, c->rows, c->V);
    SYNC();
    c->y[0] = fsd_narrow(c->s2[0]);
}
static void ce_case_bwd(Case *c)
{
    /* dL/dlogits = r · d(mean loss)/dlogits: scale r/rows */
    cross_entropy_bwd(c->v[0].dx, c->acc, c->v[0].x, c->idx, c->s1, c->rows, c->V,
                      fsd_wide(c->r[0]) / (real)c->rows);
}

static void case_cross_entropy(int64_t rows, int64_t V)
{
    char name[256];
    snprintf(name, sizeof name, "cross_entropy rows=%ld V=%ld", (long)rows, (long)V);
    Case *c = new_case(name);
    c->rows = rows, c->V = V;
    c->idx = rand_idx(rows, V);
    add_var(c, "logits", rand_act(rows * V, -3, 3), rows * V, false);
    c->s1 = new_real(rows);
    c->s2 = new_real(1);
    set_out(c, new_act(1), 1);
    c->fwd = ce_case_fwd;
    c->bwd = ce_case_bwd;
    run_case(c);
}

static void backward_checks(void)
{
    case_embed(12, 7, 5);
    case_embed(40, 11, 130);   /* columns past one CPU tile */
    case_layernorm(3, 5, true);
    case_layernorm(7, 130, true);
    case_layernorm(150, 9, true);   /* several row chunks (CPU and GPU), a ragged last */
    case_layernorm(7, 130, false);
    case_layernorm(150, 9, false);
    case_rmsnorm(3, 5);
    case_rmsnorm(7, 130);
    case_rmsnorm(150, 9);
    case_rope(2, 5, 4, 6, 10000);
    case_rope(1, 9, 2, 8, 500000);
    case_attention(2, 5, 4, 2, 6, true);    /* GQA */
    case_attention(2, 5, 4, 2, 6, false);
    case_attention(1, 4, 3, 3, 4, true);    /* multi-head */
    case_attention(2, 3, 4, 1, 5, false);   /* multi-query, odd head dim */
    case_attention(1, 1, 2, 1, 3, true);    /* one position */
#ifdef FSD_ATTENTION_BLAS
    case_attention(1, 150, 2, 1, 4, true);  /* several query blocks, a ragged last */
    case_attention(2, 70, 4, 2, 3, false);
#endif
#ifdef FSD_BLOCK_EMULATION
    /* the tiled kernels: tiles of 32 (forward) and 16 (backward) rows,
     * ragged, at head dims a lane holds 1, 3 and 4 elements of */
    case_attention(1, 20, 2, 1, 16, true);
    case_attention(1, 35, 4, 2, 80, false);
    case_attention(1, 17, 2, 2, 128, true);
    case_attention(1, 3, 2, 1, FSD_ATTN_HD_MAX + 2, true);   /* past the tiles: the row kernels */
#endif
    case_unary("gelu", 15, gelu_case_fwd, gelu_case_bwd);
    case_unary("relu", 15, relu_case_fwd, relu_case_bwd);
    case_unary("silu", 15, silu_case_fwd, silu_case_bwd);
    case_swiglu(15);
    case_binary("add", 15, 5, add_case_fwd, add_case_bwd);
    case_binary("add", 15, 15, add_case_fwd, add_case_bwd);
    case_binary("add", 390, 130, add_case_fwd, add_case_bwd);
    case_binary("add", 1350, 9, add_case_fwd, add_case_bwd);   /* 150 rows: the GPU's chunks */
    case_binary("mul", 15, 5, mul_case_fwd, mul_case_bwd);
    case_binary("mul", 15, 15, mul_case_fwd, mul_case_bwd);
    case_binary("mul", 390, 130, mul_case_fwd, mul_case_bwd);
    case_binary("mul", 1350, 9, mul_case_fwd, mul_case_bwd);
    case_bias(3, 5);
    case_bias(4, 130);
    case_bias(150, 9);   /* the GPU's column sums in chunks, a ragged last */
    case_cross_entropy(3, 5);
    case_cross_entropy(6, 130);
#ifndef FSD_FLOAT64
    printf("skip finite-difference checks: they need the float64 build (-DFSD_FLOAT64)\n");
#endif
}

/* ═══════════════ forward kernels against reference formulas ═══════════════ */

static void ref_embed(void)
{
    int64_t N = 9, V = 6, C = 5;
    int32_t *idx = rand_idx(N, V);
    act *W = rand_act(V * C, -1, 1), *y = new_act(N * C);
    double *ref = new_double(N * C);
    embed_fwd(y, W, idx, N, C, V);
    SYNC();
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++)
            ref[i * C + j] = wide(W[idx[i] * C + j]);
    check_err(err_vs(y, ref, N * C), 0, "reference", "embed_fwd: rows of W");

    /* embed_bwd: the scatter-add, by rows */
    act *dW = rand_act(V * C, -1, 1), *dy = rand_act(N * C, -1, 1);
    for (int64_t i = 0; i < V * C; i++)
        ref[i] = wide(dW[i]);
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++)
            ref[idx[i] * C + j] += wide(dy[i * C + j]);
    embed_bwd(dW, dy, idx, N, C, V);
    SYNC();
    check_err(err_vs(dW, ref, V * C), REF_TOL, "reference", "embed_bwd: dW[idx[i]] += dy[i]");
}

/* embed_bwd rounds each element of dW once, however often its token
 * occurs. Token 1 fills all but two positions, each adding k·2^-12 (k in
 * 1..15) to a row in [1, 2], under half a bf16 ulp there (2^-8): rounded
 * at each addition the row would never move. Every partial sum is a
 * multiple of 2^-12 under 2, exact in float in any order, so the reference,
 * old + the sum computed in double and rounded once to act, is the bits
 * the kernel must give in every build. Tokens 0 and 2 occur once, token 3
 * never (its row stays as it was); C passes one pass of columns
 * (FSD_EMBED_COLS: the GPU's, or the CPU's). */
static void embed_rounds_once(void)
{
    const int64_t N = 300, V = 4, C = FSD_EMBED_COLS + 3;
    int32_t *idx = (int32_t *)alloc_bytes(sizeof(int32_t) * (size_t)N);
    act *dW = new_act(V * C), *want = new_act(V * C), *dy = new_act(N * C);
    double *sum = new_double(V * C);
    for (int64_t i = 0; i < N; i++)
        idx[i] = i == 7 ? 2 : i == 150 ? 0 : 1;
    for (int64_t i = 0; i < V * C; i++) {
        dW[i] = narrow(uniform(1, 2));
        sum[i] = 0;
    }
    for (int64_t i = 0; i < N; i++)
        for (int64_t j = 0; j < C; j++) {
            dy[i * C + j] = narrow((1 + floor(urand() * 15)) * 0x1p-12);
            sum[idx[i] * C + j] += wide(dy[i * C + j]);
        }
    double err = 0;
    for (int64_t i = 0; i < V * C; i++)
        want[i] = narrow(wide(dW[i]) + sum[i]);
    embed_bwd(dW, dy, idx, N, C, V);
    SYNC();
    for (int64_t i = 0; i < V * C; i++)
        err = fmax(err, fabs(wide(dW[i]) - wide(want[i])) / fabs(wide(want[i])));
    report(same_bits(dW, want, V * C), err, 0,
           "embed_bwd rounds once per token: 298 repeats of 2^-12-sized rows, C=%ld", (long)C);
}

static void ref_norms(int64_t rows, int64_t C)
{
    char name[256];
    act *x = rand_act(rows * C, -2, 3), *w = rand_act(C, 0.5, 1.5), *b = rand_act(C, -1, 1);
    act *y = new_act(rows * C);
    real *mean = new_real(rows), *rstd = new_real(rows);
    double *ry = new_double(rows * C), *rm = new_double(rows), *rr = new_double(rows);
    double eps = 1e-5;

    layernorm_fwd(y, mean, rstd, x, w, b, rows, C, (real)eps);
    SYNC();
    for (int64_t r = 0; r < rows; r++) {   /* torch.nn.LayerNorm: biased variance */
        double s = 0, s2 = 0;
        for (int64_t j = 0; j < C; j++)
            s += wide(x[r * C + j]);
        rm[r] = s / (double)C;
        for (int64_t j = 0; j < C; j++)
            s2 += (wide(x[r * C + j]) - rm[r]) * (wide(x[r * C + j]) - rm[r]);
        rr[r] = 1 / sqrt(s2 / (double)C + eps);
        for (int64_t j = 0; j < C; j++)
            ry[r * C + j] = (wide(x[r * C + j]) - rm[r]) * rr[r] * wide(w[j]) + wide(b[j]);
    }
    double e = fmax(err_vs(y, ry, rows * C),
                    fmax(err_vs_stat(mean, rm, rows), err_vs_stat(rstd, rr, rows)));
    snprintf(name, sizeof name, "layernorm_fwd rows=%ld C=%ld: y, mean, rstd", (long)rows, (long)C);
    check_err(e, REF_TOL, "reference", name);

    /* no bias (b NULL): torch.nn.LayerNorm(bias=False), y without the + b */
    layernorm_fwd(y, mean, rstd, x, w, NULL, rows, C, (real)eps);
    SYNC();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < C; j++)
            ry[r * C + j] = (wide(x[r * C + j]) - rm[r]) * rr[r] * wide(w[j]);
    e = fmax(err_vs(y, ry, rows * C), fmax(err_vs_stat(mean, rm, rows), err_vs_stat(rstd, rr, rows)));
    snprintf(name, sizeof name, "layernorm_fwd rows=%ld C=%ld, no bias: y, mean, rstd", (long)rows,
             (long)C);
    check_err(e, REF_TOL, "reference", name);

    eps = 1e-6;
    rmsnorm_fwd(y, rstd, x, w, rows, C, (real)eps);
    SYNC();
    for (int64_t r = 0; r < rows; r++) {
        double s2 = 0;
        for (int64_t j = 0; j < C; j++)
            s2 += wide(x[r * C + j]) * wide(x[r * C + j]);
        rr[r] = 1 / sqrt(s2 / (double)C + eps);
        for (int64_t j = 0; j < C; j++)
            ry[r * C + j] = wide(x[r * C + j]) * rr[r] * wide(w[j]);
    }
    e = fmax(err_vs(y, ry, rows * C), err_vs_stat(rstd, rr, rows));
    snprintf(name, sizeof name, "rmsnorm_fwd rows=%ld C=%ld: y, rstd", (long)rows, (long)C);
    check_err(e, REF_TOL, "reference", name);
}

/* The fused residual add + norm (compiler/fuse.c) against add_fwd then the
 * plain norm: the same bits in sum and in every output, in every build (the
 * norm normalises the rounded sum an unfused norm reads back). */
static void ref_fused_norms(int64_t rows, int64_t C)
{
    int64_t n = rows * C;
    act *a = rand_act(n, -2, 3), *b = rand_act(n, -1, 1), *w = rand_act(C, 0.5, 1.5);
    act *bias = rand_act(C, -1, 1);
    act *sum0 = new_act(n), *y0 = new_act(n), *sum1 = new_act(n), *y1 = new_act(n);
    real *m0 = new_real(rows), *r0 = new_real(rows), *m1 = new_real(rows), *r1 = new_real(rows);

    add_fwd(sum0, a, b, n, n);
    layernorm_fwd(y0, m0, r0, sum0, w, bias, rows, C, (real)1e-5);
    add_layernorm_fwd(sum1, y1, m1, r1, a, b, w, bias, rows, C, (real)1e-5);
    SYNC();
    report(same_bits(sum0, sum1, n) && same_bits(y0, y1, n) &&
               memcmp(m0, m1, sizeof(real) * (size_t)rows) == 0 &&
               memcmp(r0, r1, sizeof(real) * (size_t)rows) == 0,
           -1, 0, "add_layernorm_fwd rows=%ld C=%ld: the bits of add_fwd then layernorm_fwd",
           (long)rows, (long)C);

    add_fwd(sum0, a, b, n, n);
    layernorm_fwd(y0, m0, r0, sum0, w, NULL, rows, C, (real)1e-5);
    add_layernorm_fwd(sum1, y1, m1, r1, a, b, w, NULL, rows, C, (real)1e-5);
    SYNC();
    report(same_bits(sum0, sum1, n) && same_bits(y0, y1, n) &&
               memcmp(m0, m1, sizeof(real) * (size_t)rows) == 0 &&
               memcmp(r0, r1, sizeof(real) * (size_t)rows) == 0,
           -1, 0, "add_layernorm_fwd rows=%ld C=%ld, no bias: the bits of add_fwd then "
           "layernorm_fwd", (long)rows, (long)C);

    add_fwd(sum0, a, b, n, n);
    rmsnorm_fwd(y0, r0, sum0, w, rows, C, (real)1e-6);
    add_rmsnorm_fwd(sum1, y1, r1, a, b, w, rows, C, (real)1e-6);
    SYNC();
    report(same_bits(sum0, sum1, n) && same_bits(y0, y1, n) &&
               memcmp(r0, r1, sizeof(real) * (size_t)rows) == 0,
           -1, 0, "add_rmsnorm_fwd rows=%ld C=%ld: the bits of add_fwd then rmsnorm_fwd",
           (long)rows, (long)C);
}

/* Hugging Face's apply_rotary_pos_emb: cos and sin of cat(freqs, freqs),
 * q·cos + rotate_half(q)·sin with rotate_half(x) = cat(−x2, x1). */
static void ref_rope(int64_t B, int64_t T, int64_t H, int64_t hd, double theta)
{
    char name[256];
    int64_t n = B * T * H * hd, half = hd / 2;
    act *x = rand_act(n, -1, 1), *y = new_act(n);
    double *ref = new_double(n);
    rope_fwd(y, x, B, T, H, hd, (real)theta);
    SYNC();
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++) {
                const act *xr = x + ((b * T + t) * H + h) * hd;
                for (int64_t j = 0; j < hd; j++) {
                    double inv_freq = 1.0 / pow(theta, (double)(2 * (j % half)) / (double)hd);
                    double ang = (double)t * inv_freq;
                    double rot = j < half ? -wide(xr[j + half]) : wide(xr[j - half]);
                    ref[((b * T + t) * H + h) * hd + j] = wide(xr[j]) * cos(ang) + rot * sin(ang);
                }
            }
    snprintf(name, sizeof name, "rope_fwd B=%ld T=%ld H=%ld hd=%ld theta=%g: rotate half",
             (long)B, (long)T, (long)H, (long)hd, theta);
    check_err(err_vs(y, ref, n), REF_TOL, "reference", name);
}

/* softmax(Q Kᵀ / √hd + mask) V per (b, h) in float64, with K and V repeated
 * over the query heads of each group (HF repeat_kv), into ro, and lse =
 * log Σ exp(scores) into rl. */
static void ref_attention_fwd(double *ro, double *rl, const act *q, const act *k, const act *v,
                              int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    double *S = new_double(T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t g = h * KV / H, n = causal ? t + 1 : T;
                double m = -INFINITY, sum = 0;
                for (int64_t s = 0; s < n; s++) {
                    double z = 0;
                    for (int64_t d = 0; d < hd; d++)
                        z += wide(q[((b * T + t) * H + h) * hd + d]) *
                             wide(k[((b * T + s) * KV + g) * hd + d]);
                    m = fmax(m, S[s] = z / sqrt((double)hd));
                }
                for (int64_t s = 0; s < n; s++)
                    sum += S[s] = exp(S[s] - m);
                rl[(b * H + h) * T + t] = m + log(sum);
                for (int64_t d = 0; d < hd; d++) {
                    double o = 0;
                    for (int64_t s = 0; s < n; s++)
                        o += S[s] / sum * wide(v[((b * T + s) * KV + g) * hd + d]);
                    ro[((b * T + t) * H + h) * hd + d] = o;
                }
            }
}

/* attention_fwd (whichever kernels its launcher picks) against the naive
 * float64 formulas. */
static void ref_attention(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    char name[256];
    int64_t nq = B * T * H * hd, nk = B * T * KV * hd;
    act *q = rand_act(nq, -1.5, 1.5), *k = rand_act(nk, -1.5, 1.5), *v = rand_act(nk, -1, 1);
    act *out = new_act(nq);
    real *lse = new_real(B * H * T);
    double *ro = new_double(nq), *rl = new_double(B * H * T);
    attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, causal);
    SYNC();
    ref_attention_fwd(ro, rl, q, k, v, B, T, H, KV, hd, causal);
    snprintf(name, sizeof name,
             "attention_fwd B=%ld T=%ld H=%ld KV=%ld hd=%ld %s: naive softmax(QK^T)V, lse",
             (long)B, (long)T, (long)H, (long)KV, (long)hd, causal ? "causal" : "non-causal");
    check_err(fmax(err_vs(out, ro, nq), err_vs_stat(lse, rl, B * H * T)), REF_TOL, "reference",
              name);
}

#ifdef FSD_ATTN_HD_MAX
/* dq, dk, dv of attention in float64 from the formulas (attention.h), for
 * the loss Σ dout·out, D from the exact output; overwritten. */
static void ref_attention_bwd(double *dq, double *dk, double *dv, const act *dout, const act *q,
                              const act *k, const act *v, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t hd, bool causal)
{
    double scale = 1 / sqrt((double)hd), *p = new_double(T), *o = new_double(hd);
    memset(dq, 0, sizeof(double) * (size_t)(B * T * H * hd));
    memset(dk, 0, sizeof(double) * (size_t)(B * T * KV * hd));
    memset(dv, 0, sizeof(double) * (size_t)(B * T * KV * hd));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++) {
                int64_t g = h * KV / H, n = causal ? t + 1 : T;
                const act *qr = q + ((b * T + t) * H + h) * hd, *dor = dout + ((b * T + t) * H + h) * hd;
                double m = -INFINITY, sum = 0, D = 0;
                for (int64_t s = 0; s < n; s++) {
                    double z = 0;
                    for (int64_t d = 0; d < hd; d++)
                        z += wide(qr[d]) * wide(k[((b * T + s) * KV + g) * hd + d]);
                    p[s] = z * scale;
                    m = fmax(m, p[s]);
                }
                for (int64_t s = 0; s < n; s++)
                    sum += p[s] = exp(p[s] - m);
                memset(o, 0, sizeof(double) * (size_t)hd);
                for (int64_t s = 0; s < n; s++) {
                    p[s] /= sum;
                    for (int64_t d = 0; d < hd; d++)
                        o[d] += p[s] * wide(v[((b * T + s) * KV + g) * hd + d]);
                }
                for (int64_t d = 0; d < hd; d++)
                    D += wide(dor[d]) * o[d];
                for (int64_t s = 0; s < n; s++) {
                    const act *kr = k + ((b * T + s) * KV + g) * hd, *vr = v + ((b * T + s) * KV + g) * hd;
                    double dp = 0;
                    for (int64_t d = 0; d < hd; d++)
                        dp += wide(dor[d]) * wide(vr[d]);
                    double ds = p[s] * (dp - D) * scale;
                    for (int64_t d = 0; d < hd; d++) {
                        dq[((b * T + t) * H + h) * hd + d] += ds * wide(kr[d]);
                        dk[((b * T + s) * KV + g) * hd + d] += ds * wide(qr[d]);
                        dv[((b * T + s) * KV + g) * hd + d] += p[s] * wide(dor[d]);
                    }
                }
            }
}

/* The GPU's tiled kernels (what the launchers run for hd up to
 * FSD_ATTN_HD_MAX): out and lse against the naive float64 formulas; dq,
 * dk, dv against ref_attention_bwd, with acc false (over NaN) and acc true
 * (over random values); with `rows`, also against the row kernels they
 * replace, started directly (slow in the warp emulation: small shapes). */
static void tiled_vs_ref(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal,
                         bool rows)
{
    char name[320];
    int64_t nq = B * T * H * hd, nk = B * T * KV * hd, nl = B * H * T;
    act *q = rand_act(nq, -1.5, 1.5), *k = rand_act(nk, -1.5, 1.5), *v = rand_act(nk, -1, 1);
    act *dout = rand_act(nq, -1, 1), *out = new_act(nq);
    real *lse = new_real(nl);
    double *ro = new_double(nq), *rl = new_double(nl);
    attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, causal);
    SYNC();
    ref_attention_fwd(ro, rl, q, k, v, B, T, H, KV, hd, causal);
    double ef = fmax(err_vs(out, ro, nq), err_vs_stat(lse, rl, nl)), eb = 0, er = 0;

    int64_t n[3] = {nq, nk, nk};
    act *gt[3], *gr[3];
    double *ref[3], *old[3];
    for (int i = 0; i < 3; i++) {
        gt[i] = new_act(n[i]), gr[i] = new_act(n[i]);
        ref[i] = new_double(n[i]), old[i] = new_double(n[i]);
    }
    ref_attention_bwd(ref[0], ref[1], ref[2], dout, q, k, v, B, T, H, KV, hd, causal);
    for (int pass = 0; pass < 2; pass++) {
        bool acc = pass == 1;
        for (int i = 0; i < 3; i++)
            for (int64_t j = 0; j < n[i]; j++) {
                gt[i][j] = gr[i][j] = narrow(acc ? uniform(-1, 1) : NAN);
                old[i][j] = acc ? wide(gt[i][j]) : 0;
            }
        attention_bwd(gt[0], acc, gt[1], acc, gt[2], acc, dout, q, k, v, out, lse, B, T, H, KV,
                      hd, causal);
        if (rows) {
            FSD_RUN_ROWS(attention_bwd_dq, B * H * T, T * hd,
                         (gr[0], acc, dout, q, k, v, out, lse, T, H, KV, hd, causal));
            FSD_RUN_ROWS(attention_bwd_dkv, B * KV * T, T * hd,
                         (gr[1], acc, gr[2], acc, dout, q, k, v, out, lse, T, H, KV, hd, causal));
        }
        SYNC();
        /* relative to the largest of the three: at T = 1, dq and dk are 0
         * up to rounding (p = 1, dp = D) */
        double num = 0, den = 1e-300, rnum = 0, rden = 1e-300;
        for (int i = 0; i < 3; i++)
            for (int64_t j = 0; j < n[i]; j++) {
                err_add(&num, &den, wide(gt[i][j]), old[i][j] + ref[i][j]);
                if (rows)
                    err_add(&rnum, &rden, wide(gt[i][j]), wide(gr[i][j]));
            }
        eb = fmax(eb, num / den);
        er = fmax(er, rnum / rden);
    }
    snprintf(name, sizeof name,
             "attention B=%ld T=%ld H=%ld KV=%ld hd=%ld %s: tiled kernels vs float64 formulas "
             "(out, lse %.1e; dq, dk, dv with acc false and true %.1e)%s",
             (long)B, (long)T, (long)H, (long)KV, (long)hd, causal ? "causal" : "non-causal", ef,
             eb, rows ? " and vs the row kernels" : "");
    check_err(fmax(fmax(ef, eb), er), REF_TOL, "tiled", name);
}
#endif

#ifdef FSD_MMA
/* ═══════════════ tensor-core primitives (templates/mma.h) ═══════════════ */

#define MMA_LD 24                 /* the staged tiles' row stride: not 16, so ld is used */
#define MMA_TILE (16 * MMA_LD)    /* bf16 elements of one staged tile */

/* A fragment register by the mma layout (mma.h), from scalar loads: the
 * elements p[0] and p[step], the first in the low half */
DEVICE uint32_t mma_ref_pair(const fsd_bf16 *p, int step)
{
    return (uint32_t)p[0].bits | (uint32_t)p[step].bits << 16;
}

/* One block; warp w takes its own operands (so a warp that read another
 * warp's fragments would show): A [16][16], Bn [16][16] (B[k][n] =
 * Bn[n][k], fsd_load_b2), Bk [16][16] (B[k][n] = Bk[k][n], fsd_load_b2_t),
 * C [16][16], staged in shared memory with row stride MMA_LD. Writes
 * D1 = C + A·B through fsd_load_b2 and D2 = C + A·B through fsd_load_b2_t
 * ([16][16] each: both fragments of each load), D3 = R·B through
 * fsd_load_b2's first fragment, R = [D1 D2] (columns 0-7 of each) rounded
 * to bf16 by fsd_fa_from_fc ([16][8]); the quad max and sum of x[tid] for
 * every thread; and the count of the thread's fragment registers from the
 * ldmatrix loaders that differ from scalar loads by the mma fragment
 * layout (mma_ref_pair): the loaders' own layout checked bit for bit. */
#define MMA_OUT (2 * 256 + 128)   /* out's floats a warp: D1, D2, D3 */
DEVICE void mma_prims_block(int64_t blk, int tid, real *smem, real *out, const act *a,
                            const act *bn, const act *bk, const real *c, const real *x)
{
    const int w = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    fsd_bf16 *sa = (fsd_bf16 *)smem + w * 3 * MMA_TILE, *sbn = sa + MMA_TILE;
    fsd_bf16 *sbk = sbn + MMA_TILE;
    (void)blk;
    for (int i = lane; i < 256; i += 32) {
        sa[i / 16 * MMA_LD + i % 16] = a[w * 256 + i];
        sbn[i / 16 * MMA_LD + i % 16] = bn[w * 256 + i];
        sbk[i / 16 * MMA_LD + i % 16] = bk[w * 256 + i];
    }
    fsd_block_sync();
    fsd_fc c0[2];
    for (int f = 0; f < 2; f++)
        for (int i = 0; i < 4; i++)
            c0[f].x[i] = c[w * 256 + fsd_fc_row(lane, i) * 16 + 8 * f + fsd_fc_col(lane, i)];
    const fsd_fa fa = fsd_load_a(sa, MMA_LD, lane);
    fsd_fb bn2[2], bk2[2];
    fsd_load_b2(bn2, sbn, MMA_LD, lane);
    fsd_load_b2_t(bk2, sbk, MMA_LD, lane);
    int bad = 0;
    for (int r = 0; r < 4; r++)
        bad += fa.x[r] != mma_ref_pair(sa + (g + 8 * (r % 2)) * MMA_LD + 2 * t + 8 * (r / 2), 1);
    for (int f = 0; f < 2; f++)
        for (int r = 0; r < 2; r++) {
            bad += bn2[f].x[r] != mma_ref_pair(sbn + (8 * f + g) * MMA_LD + 2 * t + 8 * r, 1);
            bad += bk2[f].x[r] !=
                   mma_ref_pair(sbk + (2 * t + 8 * r) * MMA_LD + 8 * f + g, MMA_LD);
        }
    fsd_fc d1[2] = {c0[0], c0[1]}, d2[2] = {c0[0], c0[1]}, d3 = fsd_fc_zero();
    for (int f = 0; f < 2; f++) {
        fsd_mma(&d1[f], fa, bn2[f]);
        fsd_mma(&d2[f], fa, bk2[f]);
    }
    fsd_mma(&d3, fsd_fa_from_fc(d1[0], d2[0]), bn2[0]);
    real *o = out + w * MMA_OUT;
    for (int i = 0; i < 4; i++) {
        const int at = fsd_fc_row(lane, i) * 16 + fsd_fc_col(lane, i);
        for (int f = 0; f < 2; f++)
            o[at + 8 * f] = d1[f].x[i], o[256 + at + 8 * f] = d2[f].x[i];
        o[512 + fsd_fc_row(lane, i) * 8 + fsd_fc_col(lane, i)] = d3.x[i];
    }
    out[4 * MMA_OUT + tid] = fsd_quad_max(x[tid]);
    out[4 * MMA_OUT + FSD_BLOCK + tid] = fsd_quad_sum(x[tid]);
    out[4 * MMA_OUT + 2 * FSD_BLOCK + tid] = (real)bad;
}
FSD_BLOCK_KERNEL(mma_prims, 4 * 3 * MMA_TILE / 2,
                 (real *out, const act *a, const act *bn, const act *bk, const real *c,
                  const real *x),
                 (out, a, bn, bk, c, x))

/* mma.h's primitives against products formed here in double from the same
 * bf16 operands. The products of two bf16 are exact in fp32, so D differs
 * from the double sum only by fp32 rounding of 17 terms (16 products and
 * C, each under 1.5 in magnitude): a few 1e-7 of the scale; tolerance
 * 1e-5, where a fragment in the wrong place is off by the scale itself.
 * D3's reference rounds the kernel's own D1, D2 to bf16 (portable.h's
 * rounding: the GPU's cvt.rn.bf16x2 rounds the same), so it checks where
 * fsd_fa_from_fc puts each element, not the rounding. The loaders'
 * registers equal the scalar loads' exactly. The quad reductions: the max
 * exactly, the sum of 4 floats to fp32 rounding. */
static void mma_primitives(void)
{
    act *a = rand_act(4 * 256, -1, 1), *bn = rand_act(4 * 256, -1, 1);
    act *bk = rand_act(4 * 256, -1, 1);
    real *c = new_real(4 * 256), *x = new_real(FSD_BLOCK);
    real *out = new_real(4 * MMA_OUT + 3 * FSD_BLOCK);
    for (int i = 0; i < 4 * 256; i++)
        c[i] = (real)uniform(-1, 1);
    for (int i = 0; i < FSD_BLOCK; i++)
        x[i] = (real)uniform(-4, 4);
    FSD_RUN_BLOCKS(mma_prims, 1, (out, a, bn, bk, c, x));
    SYNC();
    double e[3] = {0, 0, 0}, num[3] = {0, 0, 0}, den[3] = {1e-300, 1e-300, 1e-300};
    for (int w = 0; w < 4; w++)
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 16; n++) {
                const real *o = out + w * MMA_OUT;
                double d1 = c[w * 256 + r * 16 + n], d2 = d1, d3 = 0;
                for (int kk = 0; kk < 16; kk++) {
                    const double av = wide(a[w * 256 + r * 16 + kk]);
                    d1 += av * wide(bn[w * 256 + n * 16 + kk]);
                    d2 += av * wide(bk[w * 256 + kk * 16 + n]);
                    if (n < 8) {
                        const real rv = kk < 8 ? o[r * 16 + kk] : o[256 + r * 16 + kk - 8];
                        d3 += wide(narrow(rv)) * wide(bn[w * 256 + n * 16 + kk]);
                    }
                }
                err_add(&num[0], &den[0], o[r * 16 + n], d1);
                err_add(&num[1], &den[1], o[256 + r * 16 + n], d2);
                if (n < 8)
                    err_add(&num[2], &den[2], o[512 + r * 8 + n], d3);
            }
    for (int i = 0; i < 3; i++)
        e[i] = num[i] / den[i];
    double bad = 0;
    for (int t = 0; t < FSD_BLOCK; t++)
        bad += out[4 * MMA_OUT + 2 * FSD_BLOCK + t];
    report(bad == 0, bad, 0,
           "mma: ldmatrix loaders (fsd_load_a, fsd_load_b2, fsd_load_b2_t) give the scalar "
           "loads' fragments, 4 warps");
    check_err(e[0], 1e-5, "mma", "fsd_mma with fsd_load_a, fsd_load_b2: C + A·B, 4 warps");
    check_err(e[1], 1e-5, "mma", "fsd_mma with fsd_load_a, fsd_load_b2_t: C + A·B, 4 warps");
    check_err(e[2], 1e-5, "mma", "fsd_fa_from_fc: two C tiles rounded to bf16 as an A operand");
    double qmax = 0, qnum = 0, qden = 1e-300;
    for (int t = 0; t < FSD_BLOCK; t++) {
        const int q0 = t / 4 * 4;
        double m = x[q0], sum = 0;
        for (int i = 0; i < 4; i++) {
            m = fmax(m, x[q0 + i]);
            sum += x[q0 + i];
        }
        qmax = fmax(qmax, fabs(out[4 * MMA_OUT + t] - m));
        err_add(&qnum, &qden, out[4 * MMA_OUT + FSD_BLOCK + t], sum);
    }
    report(qmax == 0, -1, 0, "mma: fsd_quad_max is the max over each quad of lanes (4q..4q+3)");
    check_err(qnum / qden, 1e-6, "mma", "fsd_quad_sum: the sum over each quad of lanes");
}

/* attn_mma_load_tile (attention_mma.h) into a tile, copied out row by row
 * [MB][hd]: rows r0.. of src, ld apart, zeros from T on */
DEVICE void mma_tile_block(int64_t blk, int tid, real *smem, act *out, const act *src, int64_t ld,
                           int64_t r0, int64_t T, int hd)
{
    act *tile = (act *)smem;
    (void)blk;
    attn_mma_load_tile(tile, src, ld, r0, T, hd, tid);
    fsd_block_sync();
    for (int i = tid; i < FSD_ATTN_MB * hd; i += FSD_BLOCK)
        out[i] = tile[i / hd * FSD_ATTN_MLD + i % hd];
}
FSD_BLOCK_KERNEL(mma_tile,
                 (FSD_ATTN_MB * FSD_ATTN_MLD * (int)sizeof(act) + (int)sizeof(real) - 1) /
                     (int)sizeof(real),
                 (act *out, const act *src, int64_t ld, int64_t r0, int64_t T, int hd),
                 (out, src, ld, r0, T, hd))

/* The tile loads' two paths, bit for bit: 16-byte vectors from a source
 * whose rows start 16-byte aligned, pairs from one 4 bytes off (the
 * buffer's start plus 2 elements), each with a tile past T (zeros). */
static void mma_load_tile_paths(void)
{
    const int hd = 32;
    const int64_t ld = 3 * hd, r0 = FSD_ATTN_MB, T = FSD_ATTN_MB + 37;
    act *src = rand_act((r0 + FSD_ATTN_MB) * ld + 8, -1, 1), *out = new_act(FSD_ATTN_MB * hd);
    for (int off = 0; off <= 2; off += 2) {
        FSD_RUN_BLOCKS(mma_tile, 1, (out, src + off, ld, r0, T, hd));
        SYNC();
        int64_t bad = 0;
        for (int r = 0; r < FSD_ATTN_MB; r++)
            for (int c = 0; c < hd; c++) {
                const uint16_t want = r0 + r < T ? src[off + (r0 + r) * ld + c].bits : 0;
                bad += out[r * hd + c].bits != want;
            }
        report(bad == 0, (double)bad, 0,
               "mma: attn_mma_load_tile %s, rows past T zero (elements wrong)",
               off == 0 ? "in 16-byte vectors (aligned rows)" : "in pairs (rows 4 bytes off 16)");
    }
}

/* The tensor-core forward (attention_mma.h, attention_fwd_mma) through the
 * launcher, which takes it for head dims that are multiples of 16, and the
 * tiled kernel it replaces there, started directly (bf16 programs with
 * other head dims still run it): out and lse against the float64 formulas
 * (ref_attention_fwd) from the same bf16 q, k, v, scores up to `amp`²·√hd
 * (amp 4: peaked rows, whose running max moves from tile to tile).
 * Tolerance REF_TOL, 2^-7 of the largest reference value: out's one
 * rounding moves it by at most 2^-8 of the scale; the mma kernel's own
 * departure from fp32, P rounded to bf16 before O += P·V (l stays the sum
 * of the fp32 p), moves each term p·v by at most 2^-9 of itself with
 * errors of either sign, about √n·2^-9 of a term over n keys, so well
 * under 2^-8 of a row's value; lse is fp32 throughout (about 1e-6). A
 * wrong fragment index errs by the scale itself, or reads padding (NaN). */
static void mma_fwd_vs_ref(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal,
                           double amp)
{
    char name[320];
    int64_t nq = B * T * H * hd, nk = B * T * KV * hd, nl = B * H * T;
    act *q = rand_act(nq, -amp, amp), *k = rand_act(nk, -amp, amp), *v = rand_act(nk, -1, 1);
    act *out = new_act(nq), *out_t = new_act(nq);
    real *lse = new_real(nl), *lse_t = new_real(nl);
    double *ro = new_double(nq), *rl = new_double(nl);
    for (int64_t i = 0; i < nq; i++)
        out[i] = out_t[i] = narrow(NAN);   /* rows a kernel left unwritten show */
    attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, causal);
    FSD_RUN_BLOCKS(attention_fwd_tiled, B * H * ((T + FSD_ATTN_BR - 1) / FSD_ATTN_BR),
                   (out_t, lse_t, q, k, v, T, H, KV, hd, causal));
    SYNC();
    ref_attention_fwd(ro, rl, q, k, v, B, T, H, KV, hd, causal);
    double em = fmax(err_vs(out, ro, nq), err_vs_stat(lse, rl, nl));
    double et = fmax(err_vs(out_t, ro, nq), err_vs_stat(lse_t, rl, nl));
    snprintf(name, sizeof name,
             "attention_fwd B=%ld T=%ld H=%ld KV=%ld hd=%ld %s, |q|, |k| < %g: out and lse of the "
             "tensor-core kernel (the launcher's choice) %.1e, of the tiled kernel %.1e, vs float64 "
             "formulas",
             (long)B, (long)T, (long)H, (long)KV, (long)hd, causal ? "causal" : "non-causal", amp,
             em, et);
    check_err(fmax(em, et), REF_TOL, "mma", name);
}
#endif

#ifdef FSD_MMA
/* The tensor-core backward (attention_mma.h, attention_bwd_dq_mma and
 * attention_bwd_dkv_mma), started directly, against ref_attention_bwd:
 * dq, dk, dv with acc false (over NaN) and acc true (over random values);
 * then the launcher, which must pick these kernels for the shape (the
 * same bits). out and lse come from attention_fwd, whichever kernel it
 * runs.
 * Tolerance 2^-7 of the largest reference value, REF_TOL's two bf16
 * roundings (the output's, and out's, which D = dO·O reads). The kernels'
 * own departure from fp32 arithmetic, P and dS rounded to bf16 before
 * dV += Pᵀ·dO, dK += dSᵀ·Q and dQ += dS·K (FlashAttention-2's operands),
 * moves each term by at most 2^-9 of itself, with errors of either sign
 * that grow like √n over a sum of n terms, not n: small beside the
 * output's rounding. Measured: 1.8e-3 to 4.7e-3 at these shapes (the
 * draws move as tests are added), 4.3e-3 at T = 512 (2^-7 = 7.8e-3), 1.0
 * to 1.4 times what the fp32 tiled kernels err by on the same inputs
 * (the output's rounding dominates); a wrong fragment index (a C
 * element's row taken for its column, or the transposed B loader swapped
 * for the plain one) erred by 0.2 to 10, or read the padding (NaN). */
static void mma_bwd_vs_ref(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    char name[320];
    int64_t nq = B * T * H * hd, nk = B * T * KV * hd, nl = B * H * T;
    act *q = rand_act(nq, -1.5, 1.5), *k = rand_act(nk, -1.5, 1.5), *v = rand_act(nk, -1, 1);
    act *dout = rand_act(nq, -1, 1), *out = new_act(nq);
    real *lse = new_real(nl);
    attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, causal);
    SYNC();
    int64_t n[3] = {nq, nk, nk};
    act *gm[3], *gl[3];
    double *ref[3], *old[3];
    for (int i = 0; i < 3; i++) {
        gm[i] = new_act(n[i]), gl[i] = new_act(n[i]);
        ref[i] = new_double(n[i]), old[i] = new_double(n[i]);
    }
    ref_attention_bwd(ref[0], ref[1], ref[2], dout, q, k, v, B, T, H, KV, hd, causal);
    const int64_t nt = (T + FSD_ATTN_MB - 1) / FSD_ATTN_MB;
    double err = 0;
    bool same = true;
    for (int pass = 0; pass < 2; pass++) {
        bool acc = pass == 1;
        for (int i = 0; i < 3; i++)
            for (int64_t j = 0; j < n[i]; j++) {
                gm[i][j] = gl[i][j] = narrow(acc ? uniform(-1, 1) : NAN);
                old[i][j] = acc ? wide(gm[i][j]) : 0;
            }
        FSD_RUN_BLOCKS(attention_bwd_dq_mma, B * H * nt,
                       (gm[0], acc, dout, q, k, v, out, lse, B, T, H, KV, hd, causal));
        FSD_RUN_BLOCKS(attention_bwd_dkv_mma, B * KV * nt,
                       (gm[1], acc, gm[2], acc, dout, q, k, v, out, lse, T, H, KV, hd, causal));
        if (!acc)   /* the emulation is slow: the launcher once */
            attention_bwd(gl[0], acc, gl[1], acc, gl[2], acc, dout, q, k, v, out, lse, B, T, H,
                          KV, hd, causal);
        SYNC();
        /* relative to the largest of the three: at T = 1, dq and dk are 0
         * up to rounding (p = 1, dp = D) */
        double num = 0, den = 1e-300;
        for (int i = 0; i < 3; i++) {
            for (int64_t j = 0; j < n[i]; j++)
                err_add(&num, &den, wide(gm[i][j]), old[i][j] + ref[i][j]);
            same = same && (acc || same_bits(gm[i], gl[i], n[i]));
        }
        err = fmax(err, num / den);
    }
    snprintf(name, sizeof name,
             "attention_bwd B=%ld T=%ld H=%ld KV=%ld hd=%ld %s: tensor-core kernels vs float64 "
             "formulas (dq, dk, dv with acc false and true)%s",
             (long)B, (long)T, (long)H, (long)KV, (long)hd, causal ? "causal" : "non-causal",
             same ? ", the launcher's choice" : ", NOT what the launcher ran");
    report(same && err <= 0x1p-7, err, 0x1p-7, "mma %s", name);
}
#endif

static double gelu_tanh(double x)
{
    return 0.5 * x * (1 + tanh(0.7978845608028654 /* √(2/π) */ * (x + 0.044715 * x * x * x)));
}
static double silu_ref(double x) { return x / (1 + exp(-x)); }

static void ref_activations(void)
{
    int64_t n = 1001;
    act *x = rand_act(n, -6, 6), *u = rand_act(n, -2, 2), *y = new_act(n);
    double *ref = new_double(n);

    /* values of torch.nn.functional.gelu(x, approximate="tanh"), at inputs
     * every act holds exactly */
    x[0] = narrow(1), x[1] = narrow(-0.5), x[2] = narrow(2);
    gelu_fwd(y, x, n);
    SYNC();
    for (int64_t i = 0; i < n; i++)
        ref[i] = gelu_tanh(wide(x[i]));
    ref[0] = 0.8411919906082768, ref[1] = -0.15428599017485606, ref[2] = 1.954597694087775;
    check_err(err_vs(y, ref, n), REF_TOL, "reference", "gelu_fwd: tanh approximation (GPT-2)");

    relu_fwd(y, x, n);
    SYNC();
    for (int64_t i = 0; i < n; i++)
        ref[i] = wide(x[i]) > 0 ? wide(x[i]) : 0;
    check_err(err_vs(y, ref, n), 0, "reference", "relu_fwd");

    silu_fwd(y, x, n);
    SYNC();
    for (int64_t i = 0; i < n; i++)
        ref[i] = silu_ref(wide(x[i]));
    check_err(err_vs(y, ref, n), REF_TOL, "reference", "silu_fwd: x * sigmoid(x)");

    swiglu_fwd(y, x, u, n);
    SYNC();
    for (int64_t i = 0; i < n; i++)
        ref[i] = silu_ref(wide(x[i])) * wide(u[i]);
    check_err(err_vs(y, ref, n), REF_TOL, "reference", "swiglu_fwd: silu(g) * u");

    /* in place, as act.h allows */
    act *z = new_act(n);
    memcpy(z, x, sizeof(act) * (size_t)n);
    gelu_fwd(z, z, n);
    SYNC();
    for (int64_t i = 0; i < n; i++)
        ref[i] = gelu_tanh(wide(x[i]));
    check_err(err_vs(z, ref, n), REF_TOL, "reference", "gelu_fwd in place (y == x)");
}

static void ref_elementwise(void)
{
    int64_t rows = 3, C = 5, n = rows * C;
    act *a = rand_act(n, -2, 2), *b = rand_act(C, -2, 2), *y = new_act(n);
    double *ref = new_double(n);

    add_fwd(y, a, b, n, C);
    SYNC();
    for (int64_t i = 0; i < n; i++)
        ref[i] = wide(a[i]) + wide(b[i % C]);
    check_err(err_vs(y, ref, n), REF_TOL, "reference", "add_fwd n=15 nb=5: a[i] + b[i mod nb]");

    mul_fwd(y, a, b, n, C);
    SYNC();
    for (int64_t i = 0; i < n; i++)
        ref[i] = wide(a[i]) * wide(b[i % C]);
    check_err(err_vs(y, ref, n), REF_TOL, "reference", "mul_fwd n=15 nb=5: a[i] * b[i mod nb]");

    bias_add_fwd(y, a, b, rows, C);
    SYNC();
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < C; j++)
            ref[r * C + j] = wide(a[r * C + j]) + wide(b[j]);
    check_err(err_vs(y, ref, n), REF_TOL, "reference", "bias_add_fwd rows=3 C=5");

    act *d = rand_act(C, -1, 1);
    double rd[5];
    for (int64_t j = 0; j < C; j++) {
        rd[j] = wide(d[j]);
        for (int64_t r = 0; r < rows; r++)
            rd[j] += wide(a[r * C + j]);
    }
    reduce_to(d, true, a, n, C);
    SYNC();
    check_err(err_vs(d, rd, C), REF_TOL, "reference", "reduce_to n_src=15 n_dst=5, acc");
}

static void ref_cross_entropy(int64_t rows, int64_t V, double offset)
{
    char name[256];
    act *x = rand_act(rows * V, offset - 4, offset + 4);
    real *lse = new_real(rows), *loss = new_real(1);
    int32_t *tg = rand_idx(rows, V);
    double *rl = new_double(rows), rloss = 0;
    cross_entropy_fwd(loss, lse, x, tg, rows, V);
    SYNC();
    /* loss = −mean log_softmax(x)[target], log_softmax = x − max − log Σ exp(x − max) */
    for (int64_t r = 0; r < rows; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++)
            m = fmax(m, wide(x[r * V + j]));
        for (int64_t j = 0; j < V; j++)
            s += exp(wide(x[r * V + j]) - m);
        rl[r] = m + log(s);
        rloss -= (wide(x[r * V + tg[r]]) - m - log(s)) / (double)rows;
    }
    /* the loss is lse − logit, a difference of numbers as large as the
     * logits: its rounding error is relative to their size, not its own */
    double e = fmax(err_vs_stat(lse, rl, rows),
                    fabs((double)loss[0] - rloss) / fmax(fabs(rloss), fabs(offset) + 4));
    snprintf(name, sizeof name, "cross_entropy_fwd rows=%ld V=%ld logits around %g: loss, lse",
             (long)rows, (long)V, offset);
    check_err(e, REF_TOL, "reference", name);

    /* the backward in place (dlogits == logits), as its launcher allows:
     * the bits it writes into a buffer of its own */
    act *d = new_act(rows * V), *xd = new_act(rows * V);
    memcpy(xd, x, sizeof(act) * (size_t)(rows * V));
    cross_entropy_bwd(d, false, x, tg, lse, rows, V, (real)0.5);
    cross_entropy_bwd(xd, false, xd, tg, lse, rows, V, (real)0.5);
    SYNC();
    report(memcmp(d, xd, sizeof(act) * (size_t)(rows * V)) == 0, -1, 0,
           "cross_entropy_bwd rows=%ld V=%ld in place (dlogits == logits): the same bits",
           (long)rows, (long)V);
}

static void forward_checks(void)
{
    ref_embed();
    embed_rounds_once();
    ref_norms(3, 5);
    ref_norms(17, 300);
    ref_fused_norms(3, 5);
    ref_fused_norms(17, 384);
    ref_rope(2, 5, 4, 6, 10000);
    ref_rope(1, 64, 2, 16, 500000);
    ref_attention(2, 5, 4, 2, 6, true);
    ref_attention(2, 5, 4, 2, 6, false);
    ref_attention(1, 7, 4, 1, 8, true);
    ref_attention(1, 6, 3, 3, 5, false);
#ifdef FSD_ATTENTION_BLAS
    ref_attention(2, 150, 4, 2, 8, true);   /* several query blocks, a ragged last */
    ref_attention(1, 130, 2, 2, 16, false);
#endif
#ifdef FSD_BLOCK_EMULATION
    ref_attention(1, 9, 2, 1, FSD_ATTN_HD_MAX + 2, true);   /* past the tiles: the row kernels */
#endif
#ifdef FSD_ATTN_HD_MAX
    /* ragged tiles (32 forward, 16 backward), head dims of 1 to 4 elements a lane */
    tiled_vs_ref(1, 1, 2, 1, 16, true, true);
    tiled_vs_ref(2, 7, 4, 2, 32, false, true);
    tiled_vs_ref(1, 33, 2, 1, 16, false, true);
    tiled_vs_ref(2, 64, 2, 1, 16, true, false);    /* whole tiles */
    tiled_vs_ref(1, 70, 4, 2, 64, true, false);    /* GQA */
    tiled_vs_ref(1, 130, 2, 1, 80, true, false);   /* multi-query */
    tiled_vs_ref(1, 130, 2, 2, 128, false, false);
    tiled_vs_ref(1, 70, 3, 3, 128, true, false);
#endif
#ifdef FSD_MMA
    /* the tensor-core backward: ragged last tiles (64 rows), GQA, head
     * dims of 1 to 8 k slices */
    mma_bwd_vs_ref(1, 1, 2, 1, 16, true);
    mma_bwd_vs_ref(2, 17, 4, 2, 32, false);
    mma_bwd_vs_ref(2, 100, 2, 1, 64, true);
    mma_bwd_vs_ref(1, 100, 2, 1, 16, false);
    mma_bwd_vs_ref(1, 64, 2, 2, 48, true);   /* a whole tile */
    if (FSD_ATTN_HD_MAX >= 128) {
        mma_bwd_vs_ref(1, 17, 2, 2, 128, false);
        mma_bwd_vs_ref(1, 70, 2, 1, 128, true);
    }
#endif
#ifdef FSD_MMA
    mma_primitives();
    mma_load_tile_paths();
    /* the tensor-core forward: ragged last tiles (64 rows, 64 keys), GQA,
     * head dims of 1 to 8 k slices */
    mma_fwd_vs_ref(1, 1, 2, 1, 16, true, 1.5);
    mma_fwd_vs_ref(2, 17, 4, 2, 32, false, 1.5);
    mma_fwd_vs_ref(1, 100, 4, 2, 64, true, 1.5);
    mma_fwd_vs_ref(1, 100, 2, 1, 16, false, 1.5);
    mma_fwd_vs_ref(1, 64, 3, 3, 48, true, 1.5);   /* a whole tile */
    mma_fwd_vs_ref(1, 150, 2, 1, 64, false, 4);   /* peaked rows, three key tiles */
    mma_fwd_vs_ref(1, 150, 2, 2, 32, true, 4);
    if (FSD_ATTN_HD_MAX >= 128) {
        mma_fwd_vs_ref(1, 17, 2, 2, 128, false, 1.5);
        mma_fwd_vs_ref(1, 130, 4, 1, 128, true, 1.5);
    }
#endif
    ref_activations();
    ref_elementwise();
    ref_cross_entropy(3, 5, 0);
    ref_cross_entropy(9, 257, 0);
    ref_cross_entropy(4, 11, 1000);   /* exp would overflow without the max */
}

#ifdef FSD_ACT_IS_BF16
/* portable.h's rounding, which every bf16 check above relies on: to
 * nearest, ties to even, as torch's .to(torch.bfloat16) and the GPU's
 * __float2bfloat16_rn; 2 bytes a value. */
static void bf16_rounding(void)
{
    const float in[] = {1 + 0x1p-8f, 1 + 3 * 0x1p-8f, -(1 + 0x1p-9f), 0x1.ff8p0f, 0x1.fffffep127f,
                        -0.0f, INFINITY};
    const float want[] = {1, 1 + 0x1p-6f, -1, 2, INFINITY, -0.0f, INFINITY};
    bool ok = sizeof(act) == 2 && fsd_wide(fsd_narrow(NAN)) != fsd_wide(fsd_narrow(NAN));
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        float got = fsd_wide(fsd_narrow(in[i]));
        ok = ok && memcmp(&got, &want[i], sizeof got) == 0;
    }
    report(ok, -1, 0, "bf16 act: 2 bytes, rounded to nearest even, NaN and infinities kept");
}
#endif

/* ═══════════════ the GPU's 16-byte vector kernels (portable.h, FSD_VEC) ═══════════════ */

#ifdef FSD_VEC
/* Each launcher that has a vector kernel runs on the same inputs three
 * ways: every buffer 16-byte aligned and the sizes multiples of FSD_VEC (the
 * vector kernel), the same buffers one element past an aligned address (the
 * scalar kernel), and, where a kernel has a count of its own, that count
 * one less (ragged: the scalar kernel). The emulation counts the vector
 * launches (warp_emulation.h), so each check also says which path ran; on
 * the GPU it cannot, and the checks compare the results alone. Elementwise
 * kernels, bias_add, embed_fwd, cross_entropy_bwd and the column sums must
 * give the scalar kernels' bits; the norms' and the log-sum-exp's row sums
 * add in another order (FSD_VEC_LANES), so theirs agree to REF_TOL. Sizes
 * leave the 32 lanes' last pass ragged and, for the column sums, give
 * several chunks of rows. */

#ifdef FSD_WARP_EMULATION
static long vec_launches(void) { return fsd_emu_vec_launches; }
#else
static long vec_launches(void) { return -1; }   /* not counted on the GPU */
#endif

/* a copy of x [n]: 16-byte aligned (at 0), or one element past (at 1) */
static act *copy_at(const act *x, int64_t n, int at)
{
    act *p = new_act(n + 1) + at;
    memcpy(p, x, sizeof(act) * (size_t)n);
    return p;
}

/* the launches counted since `from`, against `want` (-1: not counted) */
static bool launched(long from, long want)
{
    long now = vec_launches();
    return now < 0 || now - from == want;
}

static const char *paths_note(void)
{
    return vec_launches() < 0 ? " (paths not counted on the GPU)" : "";
}

/* err of a against b relative to b's scale, as err_vs */
static double err_between(const act *a, const act *b, int64_t n)
{
    double num = 0, den = 1e-300;
    for (int64_t i = 0; i < n; i++)
        err_add(&num, &den, wide(a[i]), wide(b[i]));
    return num / den;
}

/* One vector-vs-scalar check's line: the paths (vector launches counted
 * for the aligned run, none for the others) and the outputs, the same bits
 * when `bits`, else within REF_TOL. `ragged`: a ragged run was made too. */
static void vec_report(const char *what, bool ragged, bool paths, bool bits, bool same, double err)
{
    const char *runs = ragged ? "misaligned and ragged runs" : "a misaligned run";
    if (bits)
        report(paths && same, -1, 0, "vector %s: the scalar kernel's bits (%s scalar)%s", what,
               runs, paths_note());
    else
        report(paths && err <= REF_TOL, err, REF_TOL, "vector %s: the scalar kernel's results "
               "(%s scalar)%s", what, runs, paths_note());
}

typedef void (*UnaryFwd)(act *, const act *, int64_t);
typedef void (*UnaryBwd)(act *, bool, const act *, const act *, int64_t);

/* an activation's forward and backward (acc false and true) */
static void vec_unary(const char *op, UnaryFwd fwd, UnaryBwd bwd, int64_t n)
{
    char what[128];
    act *x = rand_act(n, -4, 4), *dy = rand_act(n, -1, 1), *old = rand_act(n, -1, 1);
    act *xa = copy_at(x, n, 0), *xm = copy_at(x, n, 1), *dya = copy_at(dy, n, 0);
    act *dym = copy_at(dy, n, 1);
    act *ya = new_act(n), *ym = new_act(n + 1) + 1, *yr = new_act(n);
    long c0 = vec_launches();
    fwd(ya, xa, n);
    bool paths = launched(c0, 1);
    c0 = vec_launches();
    fwd(ym, xm, n);
    fwd(yr, xa, n - 1);
    SYNC();
    paths = paths && launched(c0, 0);
    bool same = same_bits(ya, ym, n) && same_bits(ya, yr, n - 1);
    snprintf(what, sizeof what, "%s_fwd n=%ld", op, (long)n);
    vec_report(what, true, paths, true, same, 0);

    paths = true, same = true;
    for (int acc = 0; acc < 2; acc++) {
        act *da = copy_at(old, n, 0), *dm = copy_at(old, n, 1), *dr = copy_at(old, n, 0);
        c0 = vec_launches();
        bwd(da, acc, dya, xa, n);
        paths = paths && launched(c0, 1);
        c0 = vec_launches();
        bwd(dm, acc, dym, xm, n);
        bwd(dr, acc, dya, xa, n - 1);
        SYNC();
        paths = paths && launched(c0, 0);
        same = same && same_bits(da, dm, n) && same_bits(da, dr, n - 1);
    }
    snprintf(what, sizeof what, "%s_bwd n=%ld, acc false and true", op, (long)n);
    vec_report(what, true, paths, true, same, 0);
}

/* add, mul and their same-shape backward pieces, copy, swiglu */
static void vec_binary(int64_t n)
{
    char what[128];
    act *a = rand_act(n, -2, 2), *b = rand_act(n, -2, 2), *old = rand_act(n, -1, 1);
    act *aa = copy_at(a, n, 0), *am = copy_at(a, n, 1), *ba = copy_at(b, n, 0);
    act *bm = copy_at(b, n, 1);
    for (int op = 0; op < 2; op++) {
        act *ya = new_act(n), *ym = new_act(n + 1) + 1, *yr = new_act(n);
        void (*f)(act *, const act *, const act *, int64_t, int64_t) = op ? mul_fwd : add_fwd;
        long c0 = vec_launches();
        f(ya, aa, ba, n, n);
        bool paths = launched(c0, 1);
        c0 = vec_launches();
        f(ym, am, bm, n, n);
        f(yr, aa, ba, n - 1, n - 1);
        SYNC();
        paths = paths && launched(c0, 0);
        snprintf(what, sizeof what, "%s_fwd n=nb=%ld", op ? "mul" : "add", (long)n);
        vec_report(what, true, paths, true, same_bits(ya, ym, n) && same_bits(ya, yr, n - 1), 0);
    }

    /* copy and mul_bwd's da (same shape; its db is one row of column sums),
     * acc false and true */
    bool paths = true, same = true;
    for (int acc = 0; acc < 2; acc++) {
        act *ca = copy_at(old, n, 0), *cm = copy_at(old, n, 1), *cr = copy_at(old, n, 0);
        long c0 = vec_launches();
        copy(ca, acc, aa, n);
        paths = paths && launched(c0, 1);
        c0 = vec_launches();
        copy(cm, acc, am, n);
        copy(cr, acc, aa, n - 1);
        SYNC();
        paths = paths && launched(c0, 0);
        same = same && same_bits(ca, cm, n) && same_bits(ca, cr, n - 1);
    }
    snprintf(what, sizeof what, "copy n=%ld, acc false and true", (long)n);
    vec_report(what, true, paths, true, same, 0);

    paths = true, same = true;
    for (int acc = 0; acc < 2; acc++) {
        act *da = copy_at(old, n, 0), *dm = copy_at(old, n, 1), *dr = copy_at(old, n, 0);
        act *dba = copy_at(old, n, 0), *dbm = copy_at(old, n, 1), *dbr = copy_at(old, n, 0);
        long c0 = vec_launches();
        mul_bwd(da, acc, dba, acc, ba, aa, aa, n, n);   /* dy = b */
        paths = paths && launched(c0, 2);
        c0 = vec_launches();
        mul_bwd(dm, acc, dbm, acc, bm, am, am, n, n);
        mul_bwd(dr, acc, dbr, acc, ba, aa, aa, n - 1, n - 1);
        SYNC();
        paths = paths && launched(c0, 0);
        same = same && same_bits(da, dm, n) && same_bits(da, dr, n - 1) &&
               same_bits(dba, dbm, n) && same_bits(dba, dbr, n - 1);
    }
    snprintf(what, sizeof what, "mul_bwd n=nb=%ld: da, db, acc false and true", (long)n);
    vec_report(what, true, paths, true, same, 0);

    /* swiglu: two inputs, and two outputs in the backward */
    act *ya = new_act(n), *ym = new_act(n + 1) + 1, *yr = new_act(n);
    long c0 = vec_launches();
    swiglu_fwd(ya, aa, ba, n);
    paths = launched(c0, 1);
    c0 = vec_launches();
    swiglu_fwd(ym, am, bm, n);
    swiglu_fwd(yr, aa, ba, n - 1);
    SYNC();
    paths = paths && launched(c0, 0);
    snprintf(what, sizeof what, "swiglu_fwd n=%ld", (long)n);
    vec_report(what, true, paths, true, same_bits(ya, ym, n) && same_bits(ya, yr, n - 1), 0);
    paths = true, same = true;
    for (int acc = 0; acc < 2; acc++) {
        act *dga = copy_at(old, n, 0), *dgm = copy_at(old, n, 1), *dgr = copy_at(old, n, 0);
        act *dua = copy_at(b, n, 0), *dum = copy_at(b, n, 1), *dur = copy_at(b, n, 0);
        c0 = vec_launches();
        swiglu_bwd(dga, acc, dua, !acc, ba, aa, ba, n);
        paths = paths && launched(c0, 1);
        c0 = vec_launches();
        swiglu_bwd(dgm, acc, dum, !acc, bm, am, bm, n);
        swiglu_bwd(dgr, acc, dur, !acc, ba, aa, ba, n - 1);
        SYNC();
        paths = paths && launched(c0, 0);
        same = same && same_bits(dga, dgm, n) && same_bits(dga, dgr, n - 1) &&
               same_bits(dua, dum, n) && same_bits(dua, dur, n - 1);
    }
    snprintf(what, sizeof what, "swiglu_bwd n=%ld: dg, du, acc false and true", (long)n);
    vec_report(what, true, paths, true, same, 0);
}

/* bias_add (rows), bias_bwd, reduce_to and mul_bwd's db (column sums in
 * chunks of rows) at [rows, C] */
static void vec_bias(int64_t rows, int64_t C)
{
    char what[128];
    int64_t n = rows * C;
    act *x = rand_act(n, -2, 2), *b = rand_act(C, -1, 1), *old = rand_act(C, -1, 1);
    act *xa = copy_at(x, n, 0), *xm = copy_at(x, n, 1), *ba = copy_at(b, C, 0);
    act *bm = copy_at(b, C, 1);
    act *ya = new_act(n), *ym = new_act(n + 1) + 1, *yr = new_act(n);
    long c0 = vec_launches();
    bias_add_fwd(ya, xa, ba, rows, C);
    bool paths = launched(c0, 1);
    c0 = vec_launches();
    bias_add_fwd(ym, xm, bm, rows, C);
    bias_add_fwd(yr, xa, ba, rows * C / (C - 1), C - 1);   /* ragged rows of C − 1 */
    SYNC();
    paths = paths && launched(c0, 0);
    bool same = same_bits(ya, ym, n);
    for (int64_t i = 0; i < rows * C / (C - 1) * (C - 1); i++) {   /* yr against x + b */
        act want = narrow(wide(xa[i]) + wide(ba[i % (C - 1)]));
        same = same && memcmp(&yr[i], &want, sizeof want) == 0;
    }
    snprintf(what, sizeof what, "bias_add_fwd rows=%ld C=%ld", (long)rows, (long)C);
    vec_report(what, true, paths, true, same, 0);

    /* bias_bwd (accumulates), reduce_to (acc false and true), mul_bwd's db:
     * the vector sums give the scalar ones' bits (the same order) */
    act *da = copy_at(old, C, 0), *dm = copy_at(old, C, 1);
    c0 = vec_launches();
    bias_bwd(da, xa, rows, C);
    paths = launched(c0, 1);
    c0 = vec_launches();
    bias_bwd(dm, xm, rows, C);
    SYNC();
    paths = paths && launched(c0, 0);
    snprintf(what, sizeof what, "bias_bwd rows=%ld C=%ld", (long)rows, (long)C);
    vec_report(what, false, paths, true, same_bits(da, dm, C), 0);

    paths = true, same = true;
    for (int acc = 0; acc < 2; acc++) {
        act *ra = copy_at(old, C, 0), *rm = copy_at(old, C, 1);
        c0 = vec_launches();
        reduce_to(ra, acc, xa, n, C);
        paths = paths && launched(c0, 1);
        c0 = vec_launches();
        reduce_to(rm, acc, xm, n, C);
        SYNC();
        paths = paths && launched(c0, 0);
        same = same && same_bits(ra, rm, C);
    }
    snprintf(what, sizeof what, "reduce_to n_src=%ld n_dst=%ld, acc false and true", (long)n,
             (long)C);
    vec_report(what, false, paths, true, same, 0);

    /* mul_bwd with b broadcast: db vector column sums, da the broadcast kernel */
    act *dy = rand_act(n, -1, 1), *dya = copy_at(dy, n, 0), *dym = copy_at(dy, n, 1);
    act *dxa = new_act(n), *dxm = new_act(n + 1) + 1;
    act *dba = copy_at(old, C, 0), *dbm = copy_at(old, C, 1);
    c0 = vec_launches();
    mul_bwd(dxa, false, dba, true, dya, xa, ba, n, C);
    paths = launched(c0, 1);
    c0 = vec_launches();
    mul_bwd(dxm, false, dbm, true, dym, xm, bm, n, C);
    SYNC();
    paths = paths && launched(c0, 0);
    snprintf(what, sizeof what, "mul_bwd n=%ld nb=%ld: db", (long)n, (long)C);
    vec_report(what, false, paths, true, same_bits(dba, dbm, C) && same_bits(dxa, dxm, n), 0);
}

/* the largest |a − b| / max |b| of two statistics */
static double err_stats(const real *a, const real *b, int64_t n)
{
    double num = 0, den = 1e-300;
    for (int64_t i = 0; i < n; i++)
        err_add(&num, &den, (double)a[i], (double)b[i]);
    return num / den;
}

/* layernorm (with and without a bias) and rmsnorm, forward and backward
 * (acc false and true), and the fused forwards with a and b misaligned (the
 * vector norm, a and b read element by element): the unfused programs' bits */
static void vec_norms(int64_t rows, int64_t C)
{
    char what[160];
    int64_t n = rows * C;
    act *x = rand_act(n, -2, 3), *w = rand_act(C, 0.5, 1.5), *b = rand_act(C, -1, 1);
    act *dy = rand_act(n, -1, 1), *old = rand_act(n, -1, 1), *oldp = rand_act(C, -1, 1);
    act *xa = copy_at(x, n, 0), *xm = copy_at(x, n, 1), *wa = copy_at(w, C, 0);
    act *wm = copy_at(w, C, 1), *ba = copy_at(b, C, 0), *bm = copy_at(b, C, 1);
    act *dya = copy_at(dy, n, 0), *dym = copy_at(dy, n, 1);
    act *ya = new_act(n), *ym = new_act(n + 1) + 1;
    real *ma = new_real(rows), *ra = new_real(rows), *mm = new_real(rows), *rm = new_real(rows);

    for (int kind = 0; kind < 3; kind++) {   /* layernorm, without its bias, rmsnorm */
        const bool rms = kind == 2, bias = kind == 0;
        const char *op = rms ? "rmsnorm" : "layernorm", *nb = rms || bias ? "" : ", no bias";
        long c0 = vec_launches();
        if (rms)
            rmsnorm_fwd(ya, ra, xa, wa, rows, C, (real)1e-6);
        else
            layernorm_fwd(ya, ma, ra, xa, wa, bias ? ba : NULL, rows, C, (real)1e-5);
        bool paths = launched(c0, 1);
        c0 = vec_launches();
        if (rms)
            rmsnorm_fwd(ym, rm, xm, wm, rows, C, (real)1e-6);
        else
            layernorm_fwd(ym, mm, rm, xm, wm, bias ? bm : NULL, rows, C, (real)1e-5);
        SYNC();
        paths = paths && launched(c0, 0);
        double e = fmax(err_between(ya, ym, n), err_stats(ra, rm, rows));
        if (!rms)
            e = fmax(e, err_stats(ma, mm, rows));
        snprintf(what, sizeof what, "%s_fwd rows=%ld C=%ld%s: y and statistics", op, (long)rows,
                 (long)C, nb);
        vec_report(what, false, paths, false, true, e);

        /* the backward from the same statistics: dx to REF_TOL (its row
         * sums), the parameter gradients' column sums bit for bit */
        paths = true;
        e = 0;
        bool same = true;
        for (int acc = 0; acc < 2; acc++) {
            act *dxa = copy_at(old, n, 0), *dxm = copy_at(old, n, 1);
            act *dwa = copy_at(oldp, C, 0), *dwm = copy_at(oldp, C, 1);
            act *dba = copy_at(oldp, C, 0), *dbm = copy_at(oldp, C, 1);
            c0 = vec_launches();
            if (rms)
                rmsnorm_bwd(dxa, acc, dwa, dya, xa, wa, ra, rows, C);
            else
                layernorm_bwd(dxa, acc, dwa, bias ? dba : NULL, dya, xa, wa, ma, ra, rows, C);
            paths = paths && launched(c0, 2);
            c0 = vec_launches();
            if (rms)
                rmsnorm_bwd(dxm, acc, dwm, dym, xm, wm, ra, rows, C);
            else
                layernorm_bwd(dxm, acc, dwm, bias ? dbm : NULL, dym, xm, wm, ma, ra, rows, C);
            SYNC();
            paths = paths && launched(c0, 0);
            e = fmax(e, err_between(dxa, dxm, n));
            same = same && same_bits(dwa, dwm, C) && same_bits(dba, dbm, C);
        }
        snprintf(what, sizeof what, "%s_bwd rows=%ld C=%ld%s, acc false and true: dx", op,
                 (long)rows, (long)C, nb);
        vec_report(what, false, paths, false, true, e);
        snprintf(what, sizeof what, "%s_bwd rows=%ld C=%ld%s: %s", op, (long)rows, (long)C, nb,
                 bias ? "dw, db" : "dw");
        vec_report(what, false, paths, true, same, 0);
    }

    /* fused, a and b misaligned: the vector norm on the stored sum, as the
     * unfused norm on it takes */
    act *bb = rand_act(n, -1, 1), *bbm = copy_at(bb, n, 1);
    act *s0 = new_act(n), *s1 = new_act(n), *y0 = new_act(n), *y1 = new_act(n);
    real *m0 = new_real(rows), *r0 = new_real(rows), *m1 = new_real(rows), *r1 = new_real(rows);
    add_fwd(s0, xm, bbm, n, n);
    layernorm_fwd(y0, m0, r0, s0, wa, ba, rows, C, (real)1e-5);
    long c0 = vec_launches();
    add_layernorm_fwd(s1, y1, m1, r1, xm, bbm, wa, ba, rows, C, (real)1e-5);
    SYNC();
    bool paths = launched(c0, 1);
    bool same = same_bits(s0, s1, n) && same_bits(y0, y1, n) &&
                memcmp(m0, m1, sizeof(real) * (size_t)rows) == 0 &&
                memcmp(r0, r1, sizeof(real) * (size_t)rows) == 0;
    add_fwd(s0, xm, bbm, n, n);
    layernorm_fwd(y0, m0, r0, s0, wa, NULL, rows, C, (real)1e-5);
    c0 = vec_launches();
    add_layernorm_fwd(s1, y1, m1, r1, xm, bbm, wa, NULL, rows, C, (real)1e-5);
    SYNC();
    paths = paths && launched(c0, 1);
    same = same && same_bits(s0, s1, n) && same_bits(y0, y1, n) &&
           memcmp(m0, m1, sizeof(real) * (size_t)rows) == 0 &&
           memcmp(r0, r1, sizeof(real) * (size_t)rows) == 0;
    add_fwd(s0, xm, bbm, n, n);
    rmsnorm_fwd(y0, r0, s0, wa, rows, C, (real)1e-6);
    c0 = vec_launches();
    add_rmsnorm_fwd(s1, y1, r1, xm, bbm, wa, rows, C, (real)1e-6);
    SYNC();
    paths = paths && launched(c0, 1);
    same = same && same_bits(s0, s1, n) && same_bits(y0, y1, n) &&
           memcmp(r0, r1, sizeof(real) * (size_t)rows) == 0;
    report(paths && same, -1, 0, "vector add_layernorm_fwd (with and without a bias), "
           "add_rmsnorm_fwd rows=%ld C=%ld, a and b misaligned: the bits of add_fwd then the "
           "norm%s", (long)rows, (long)C, paths_note());
}

/* cross entropy: the log-sum-exp to REF_TOL, the backward (acc false and
 * true, targets at both ends of a vector) bit for bit from the same lse */
static void vec_cross_entropy(int64_t rows, int64_t V)
{
    char what[128];
    int64_t n = rows * V;
    act *x = rand_act(n, -3, 3), *old = rand_act(n, -1, 1);
    act *xa = copy_at(x, n, 0), *xm = copy_at(x, n, 1);
    int32_t *tg = rand_idx(rows, V);
    tg[0] = 0, tg[1] = (int32_t)(V - 1), tg[2] = FSD_VEC - 1, tg[3] = FSD_VEC;
    real *la = new_real(rows), *lm = new_real(rows), *loss = new_real(2);
    long c0 = vec_launches();
    cross_entropy_fwd(loss, la, xa, tg, rows, V);
    bool paths = launched(c0, 1);
    c0 = vec_launches();
    cross_entropy_fwd(loss + 1, lm, xm, tg, rows, V);
    SYNC();
    paths = paths && launched(c0, 0);
    snprintf(what, sizeof what, "cross_entropy_fwd rows=%ld V=%ld: lse, loss", (long)rows, (long)V);
    vec_report(what, false, paths, false, true,
               fmax(err_stats(la, lm, rows), err_stats(loss, loss + 1, 1)));

    paths = true;
    bool same = true;
    for (int acc = 0; acc < 2; acc++) {
        act *da = copy_at(old, n, 0), *dm = copy_at(old, n, 1);
        c0 = vec_launches();
        cross_entropy_bwd(da, acc, xa, tg, la, rows, V, (real)0.25);
        paths = paths && launched(c0, 1);
        c0 = vec_launches();
        cross_entropy_bwd(dm, acc, xm, tg, la, rows, V, (real)0.25);
        SYNC();
        paths = paths && launched(c0, 0);
        same = same && same_bits(da, dm, n);
    }
    snprintf(what, sizeof what, "cross_entropy_bwd rows=%ld V=%ld, acc false and true", (long)rows,
             (long)V);
    vec_report(what, false, paths, true, same, 0);
}

static void vec_embed(int64_t N, int64_t V, int64_t C)
{
    char what[128];
    act *W = rand_act(V * C, -1, 1), *Wa = copy_at(W, V * C, 0), *Wm = copy_at(W, V * C, 1);
    int32_t *idx = rand_idx(N, V);
    act *oa = new_act(N * C), *om = new_act(N * C + 1) + 1;
    long c0 = vec_launches();
    embed_fwd(oa, Wa, idx, N, C, V);
    bool paths = launched(c0, 1);
    c0 = vec_launches();
    embed_fwd(om, Wm, idx, N, C, V);
    SYNC();
    paths = paths && launched(c0, 0);
    snprintf(what, sizeof what, "embed_fwd N=%ld V=%ld C=%ld", (long)N, (long)V, (long)C);
    vec_report(what, false, paths, true, same_bits(oa, om, N * C), 0);
}

static void vector_checks(void)
{
    /* rows of 45 vectors: the 32 lanes' second pass ragged; 201 vectors
     * elementwise */
    const int64_t C = 45 * FSD_VEC;
    vec_unary("gelu", gelu_fwd, gelu_bwd, 201 * FSD_VEC);
    vec_unary("relu", relu_fwd, relu_bwd, 201 * FSD_VEC);
    vec_unary("silu", silu_fwd, silu_bwd, 201 * FSD_VEC);
    vec_binary(201 * FSD_VEC);
    vec_bias(150, C);   /* 150 rows: the column sums in chunks, a ragged last */
    vec_bias(3, 2 * FSD_VEC);
    vec_norms(150, C);
    vec_norms(5, 3 * FSD_VEC);   /* fewer vectors than lanes */
    vec_cross_entropy(6, C);
    vec_embed(9, 6, C);
}
#endif

/* ═══════════════ determinism: the thread count does not matter ═══════════════ */

#if defined(_OPENMP) && !defined(__CUDACC__)

static void determinism_checks(void)
{
    int64_t N = 64, V = 5, C = 130, rows = 64;
    int32_t *idx = rand_idx(N, V);
    act *dy = rand_act(N * C, -1, 1), *x = rand_act(rows * C, -1, 1);
    act *w = rand_act(C, 0.5, 1.5), *bb = rand_act(C, -1, 1), *y = new_act(rows * C);
    real *mean = new_real(rows), *rstd = new_real(rows);
    layernorm_fwd(y, mean, rstd, x, w, bb, rows, C, (real)1e-5);
    int64_t B = 2, T = 16, H = 4, KV = 2, hd = 8, nq = B * T * H * hd, nk = B * T * KV * hd;
    act *q = rand_act(nq, -1, 1), *k = rand_act(nk, -1, 1), *v = rand_act(nk, -1, 1);
    act *o = new_act(nq), *dout = rand_act(nq, -1, 1);
    real *lse = new_real(B * H * T);
    attention_fwd(o, lse, q, k, v, B, T, H, KV, hd, true);
    int32_t *tg = rand_idx(rows, C);

    act *res[2][8];
    int threads[2] = {1, 7};
    for (int p = 0; p < 2; p++) {
        omp_set_num_threads(threads[p]);
        act **R = res[p];
        R[0] = new_act(V * C);
        memset(R[0], 0, sizeof(act) * (size_t)(V * C));   /* all bits 0: +0 in any act */
        embed_bwd(R[0], dy, idx, N, C, V);
        R[1] = new_act(C);
        memset(R[1], 0, sizeof(act) * (size_t)C);
        bias_bwd(R[1], dy, rows, C);
        R[2] = new_act(rows * C), R[3] = new_act(C), R[4] = new_act(C);
        memset(R[3], 0, sizeof(act) * (size_t)C);
        memset(R[4], 0, sizeof(act) * (size_t)C);
        layernorm_bwd(R[2], false, R[3], R[4], dy, x, w, mean, rstd, rows, C);
        R[5] = new_act(nq), R[6] = new_act(nk), R[7] = new_act(nk);
        attention_bwd(R[5], false, R[6], false, R[7], false, dout, q, k, v, o, lse, B, T, H, KV,
                      hd, true);
    }
    real *loss[2];
    for (int p = 0; p < 2; p++) {
        omp_set_num_threads(threads[p]);
        loss[p] = new_real(1);
        cross_entropy_fwd(loss[p], new_real(rows), x, tg, rows, C);
    }
    omp_set_num_threads(omp_get_num_procs());
    report(same_bits(res[0][0], res[1][0], V * C), -1, 0,
           "deterministic embed_bwd: 1 and 7 threads give the same bits");
    report(same_bits(res[0][1], res[1][1], C), -1, 0, "deterministic bias_bwd: 1 and 7 threads");
    report(same_bits(res[0][3], res[1][3], C) && same_bits(res[0][4], res[1][4], C), -1, 0,
           "deterministic layernorm_bwd dw, db: 1 and 7 threads");
    report(same_bits(res[0][5], res[1][5], nq) && same_bits(res[0][6], res[1][6], nk) &&
               same_bits(res[0][7], res[1][7], nk),
           -1, 0, "deterministic attention_bwd dq, dk, dv: 1 and 7 threads");
    report(memcmp(loss[0], loss[1], sizeof(real)) == 0, -1, 0,
           "deterministic cross_entropy_fwd loss: 1 and 7 threads");
}
#endif

/* ═══════════════ launchers refuse bad arguments ═══════════════ */

#ifndef __CUDACC__
/* Runs f in a child; expects it to abort with `want` on stderr. */
static void expect_abort(const char *what, void (*f)(void), const char *want)
{
    int fds[2];
    char buf[512] = {0};
    fflush(stdout);
    if (pipe(fds) != 0) {
        report(false, -1, 0, "refuses %s: pipe failed", what);
        return;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        f();
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t k;
    while (got + 1 < sizeof buf && (k = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)k;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    bool ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(buf, want);
    report(ok, -1, 0, "refuses %s (\"%s\")", what, want);
    if (!ok)
        printf("     got: %s\n", buf);
}

static void bad_token(void)
{
    act W[10] = {0}, out[4] = {0};
    int32_t idx[2] = {1, 5};
    embed_fwd(out, W, idx, 2, 2, 5);
}
static void zero_rows(void)
{
    act b[1] = {0};
    real s[1] = {0};
    layernorm_fwd(b, s, s, b, b, b, 0, 1, (real)1e-5);
}
static void odd_head_dim(void)
{
    act b[1] = {0};
    rope_fwd(b, b, 1, 1, 1, 3, (real)10000);
}
static void bad_broadcast(void)
{
    act b[6] = {0};
    add_fwd(b, b, b, 6, 4);
}
static void null_output(void)
{
    act b[4] = {0};
    real s[2] = {0};
    int32_t t[2] = {0, 1};
    cross_entropy_fwd(NULL, s, b, t, 2, 2);
}

static void argument_checks(void)
{
    expect_abort("a token id out of range", bad_token,
                 "fsdpc kernel embed_fwd: index 5 at position 1 is outside [0, 5)");
    expect_abort("zero rows", zero_rows, "fsdpc kernel layernorm_fwd: need rows > 0");
    expect_abort("an odd rope head dim", odd_head_dim, "fsdpc kernel rope_fwd: need hd % 2 == 0");
    expect_abort("a broadcast that does not divide", bad_broadcast,
                 "fsdpc kernel add_fwd: need n > 0 && nb > 0 && n % nb == 0");
    expect_abort("a null output", null_output, "fsdpc kernel cross_entropy_fwd: need loss &&");
}
#endif

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("kernel tests, %s build\n", PRECISION);
#ifdef FSD_ACT_IS_BF16
    bf16_rounding();
#endif
    backward_checks();
    forward_checks();
#ifdef FSD_VEC
    vector_checks();
#else
    printf("skip vector kernel checks: the CPU build has none (FSD_VEC: the GPU's and the warp "
           "emulation's)\n");
#endif
#if defined(_OPENMP) && !defined(__CUDACC__)
    determinism_checks();
#else
    printf("skip determinism checks: not an OpenMP CPU build\n");
#endif
#ifndef __CUDACC__
    argument_checks();
#endif
    free_all();
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail != 0;
}
