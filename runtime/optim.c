/*
 * optim.c — the optimizer and the gradient norm as loops over shards in host
 * memory, with OpenMP: the CPU backend's update, and the CUDA backend's with
 * `offload = cpu` (its shards are then pinned host memory, docs/cuda.md).
 * Both libraries compile this one file with the same flags, so an update
 * on the host gives the same bits whichever backend runs it.
 *
 * The CUDA backend's device kernels (cuda_kernels.cu) follow these loops
 * term by term.
 */
#include "internal.h"

#include <math.h>
#include <string.h>

#ifdef FSD_FLOAT64
#define SQRT sqrt
#else
#define SQRT sqrtf
#endif

/* Every loop here runs on the calling thread below FSD_PAR_MIN_ELEMS elements
 * (runtime/fsdrt.h: a region costs more than such a loop saves); `parallel:`
 * keeps simd on then. */

/* The optimizer's loops are elementwise and memory-bound; on x86-64 with GCC
 * they are compiled for AVX-512, AVX2 and the baseline, the loader picking
 * the one the CPU runs (as templates/portable.h does for the kernels). Each
 * lane does what the scalar code does (no FMA under -std=c11, sqrt and
 * division exactly rounded), so every version gives the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VECTOR_CLONES
#endif

/* Σ x² in double. `simd` lets each thread keep one partial sum per vector
 * lane (a single running sum waits on every add: at 4 cycles an add, the
 * 10.8M gradients of bench/gpt6x384.fsd took ~20 ms a step); the order of
 * the sum, like the threads' partial sums before it, is the compiler's. A
 * shard under FSD_PAR_MIN_ELEMS (runtime/fsdrt.h) is summed on the calling
 * thread, so its sum has the one-thread bits at any thread count; a larger
 * one's bits depend on the thread count, as they always did. */
VECTOR_CLONES
static double sumsq(const real *x, int64_t n)
{
    double s = 0;
#pragma omp parallel for simd schedule(static) reduction(+ : s) if (parallel : n >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

double optim_grad_sumsq(FsdRun *r)
{
    /* HSDP: after the replica all-reduce every replica holds the same
     * shards, so only replica 0's count: the sum over all ranks is then the
     * norm over one shard group, counted once (docs/design.md#hsdp) */
    if (r->replica > 0)
        return 0;
    double s = 0;
    for (int g = 0; g < r->m->ngroups; g++)
        s += sumsq(r->groups[g].grad, r->groups[g].shard);
    return s;
}

/* Both optimizers read each gradient once, already clipped: g·k, with k
 * clip_grad_norm_'s coefficient, or 1 (g·1 is g), the value PyTorch's
 * clipping leaves in the gradient before its optimizer reads it; and zero
 * it where they read it (the segments cover the shard), for the next
 * step's accumulation. One pass over the gradients instead of three
 * (clip, update, zero). */

/* PyTorch's AdamW (torch.optim.AdamW, single-tensor path), term by term:
 *   p ← p·(1 − lr·wd)                     decoupled weight decay
 *   m ← m + (1 − β1)(g − m)               exp_avg.lerp_(grad, 1 − β1)
 *   v ← β2·v + (1 − β2)·g²
 *   p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + eps)
 * with scalars computed in double and applied in `real`, as PyTorch does. */
VECTOR_CLONES
static void adamw(const FsdTrainConfig *c, Group *G, const Segment *s, double lr, int64_t t,
                  real k)
{
    const real decay = s->decay && c->weight_decay != 0 ? (real)(1 - lr * c->weight_decay) : 1;
    const real w1 = (real)(1 - c->beta1), b2 = (real)c->beta2, w2 = (real)(1 - c->beta2);
    const real step = (real)(lr / (1 - pow(c->beta1, (double)t)));
    const real bc2_sqrt = (real)sqrt(1 - pow(c->beta2, (double)t)), eps = (real)c->eps;
    real *p = G->master, *g = G->grad, *m = G->m, *v = G->v;
    /* simd: elementwise, so vectorising changes no result bit */
#pragma omp parallel for simd schedule(static) if (parallel : s->end - s->begin >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = s->begin; i < s->end; i++) {
        const real gi = g[i] * k;
        g[i] = 0;
        p[i] *= decay;
        m[i] += w1 * (gi - m[i]);
        v[i] = b2 * v[i] + w2 * gi * gi;
        p[i] -= step * m[i] / (SQRT(v[i]) / bc2_sqrt + eps);
    }
}

/* torch.optim.SGD without dampening: weight decay into the gradient, then
 * momentum b ← μ·b + g (b starts at zero, so the first step's b is g, as
 * PyTorch's), Nesterov's look-ahead when asked. Without momentum there is
 * no buffer. */
static void sgd(const FsdTrainConfig *c, Group *G, const Segment *s, double lr, real k)
{
    const real wd = s->decay ? (real)c->weight_decay : 0, mu = (real)c->momentum, lr_ = (real)lr;
    const bool nesterov = c->nesterov;
    real *p = G->master, *g = G->grad, *b = G->m;
#pragma omp parallel for schedule(static) if (s->end - s->begin >= FSD_PAR_MIN_ELEMS)
    for (int64_t i = s->begin; i < s->end; i++) {
        real d = g[i] * k + wd * p[i];
        g[i] = 0;
        if (b) {
            b[i] = mu * b[i] + d;
            d = nesterov ? d + mu * b[i] : b[i];
        }
        p[i] -= lr_ * d;
    }
}

void optim_step(FsdRun *r, double lr, double coef, int64_t t)
{
    if (coef == UPDATE_SKIP) {   /* a non-finite step: nothing learnt, nothing kept */
        for (int gi = 0; gi < r->m->ngroups; gi++)
            memset(r->groups[gi].grad, 0, (size_t)r->groups[gi].shard * sizeof(real));
        return;
    }
    /* clip_grad_norm_: every gradient times one coefficient, when below 1 */
    const real k = coef < 1 ? (real)coef : 1;
    for (int gi = 0; gi < r->m->ngroups; gi++) {
        Group *G = &r->groups[gi];
        for (int s = 0; s < G->nseg; s++) {
            if (r->cfg.optimizer == FSD_ADAMW)
                adamw(&r->cfg, G, &G->seg[s], lr, t, k);
            else
                sgd(&r->cfg, G, &G->seg[s], lr, k);
        }
    }
}
