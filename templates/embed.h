/*
 * embed.h — token and position embeddings (Embedding layer; design
 * section 9: weight [V, C]). Needs portable.h.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

/* embed_fwd: out[i, :] = W[idx[i], :] for i in [0, N).
 *   out [N, C], W [V, C], idx [N] with every idx[i] in [0, V). */
DEVICE void embed_fwd_row(int64_t i, int lane, int lanes, act *out, const act *W,
                          const int32_t *idx, int64_t C, int64_t V)
{
    int64_t t = idx[i];
    if (t < 0 || t >= V)
        fsd_trap();
    FSD_SIMD
    for (int64_t j = lane; j < C; j += lanes)
        out[i * C + j] = W[t * C + j];   /* a copy of the stored value: nothing to round */
}
FSD_ROW_KERNEL(embed_fwd, (act *out, const act *W, const int32_t *idx, int64_t C, int64_t V),
               (out, W, idx, C, V))

#ifdef FSD_VEC
/* the same by 16-byte vectors (portable.h's FSD_VEC): C a multiple of
 * FSD_VEC, out and W 16-byte aligned; a copy either way */
DEVICE void embed_fwd_v_row(int64_t i, int lane, int lanes, act *out, const act *W,
                            const int32_t *idx, int64_t C, int64_t V)
{
    int64_t t = idx[i];
    if (t < 0 || t >= V)
        fsd_trap();
    FSD_VEC_LANES(j, C, lane, lanes)
        fsd_vstore(out + i * C + j, fsd_vload(W + t * C + j));
}
FSD_ROW_KERNEL(embed_fwd_v, (act *out, const act *W, const int32_t *idx, int64_t C, int64_t V),
               (out, W, idx, C, V))
#endif

LAUNCHER void embed_fwd(act *out, const act *W, const int32_t *idx, int64_t N, int64_t C,
                        int64_t V)
{
    FSD_REQUIRE("embed_fwd", out && W && idx);
    FSD_REQUIRE("embed_fwd", N > 0 && C > 0 && V > 0);
    fsd_check_indices("embed_fwd", idx, N, V);
    if (FSD_VEC_WHEN(C % FSD_VEC == 0 && fsd_al16(out) && fsd_al16(W)))
        FSD_RUN_VEC_ROWS(embed_fwd_v, N, C, (out, W, idx, C, V));
    else
        FSD_RUN_ROWS(embed_fwd, N, C, (out, W, idx, C, V));
}

/* embed_bwd: dW[t, :] += Σ dout[i, :] over the positions i with idx[i] = t,
 * for every token t in idx; always accumulates (a parameter gradient; a
 * tied head adds to it too). dW [V, C], dout [N, C], idx [N].
 *
 * Each token's rows are summed in `real`, in position order, and added to
 * its row of dW once: with bf16 act one rounding per element, however
 * often the token occurs, as PyTorch's GPU embedding backward does (it
 * sorts the positions by token and sums each token's run). Grouping by
 * token without scratch (the memory plan gives kernels no workspace,
 * compiler/memplan.c): a row per position i, and the row owning token t's
 * row of dW is t's first position. Every position looks back through idx
 * for an earlier one holding its token and stops at the first it finds;
 * the first position of t finds none, walks idx from itself to the end and
 * adds every row holding t. No atomics, one order, whatever the threads.
 *
 * Cost: each position scans back to its token's previous occurrence, and
 * each token's first position on to the end, once per FSD_EMBED_COLS
 * columns: about N² index compares at most (every token distinct), fewer
 * the more tokens repeat, whatever V; vectorised on the CPU, 32 lanes at a
 * time on the GPU, and idx (4N bytes) stays in cache. dout is read once.
 * One warp adds a token's rows one after another: on the GPU a token that
 * fills the batch costs N dependent row loads. */

/* The CPU's one lane scans FSD_EMBED_SCAN positions at a step (a
 * vectorised compare); the GPU's lanes one each, 32 adjacent positions a
 * step, coalesced. FSD_EMBED_K: the columns one lane sums in a pass, its
 * s[] in registers on the GPU (FSD_EMBED_COLS = 1,024 columns a warp), on
 * the stack on the CPU (2,048 reals: one pass up to that width). */
#if defined(__CUDACC__) || defined(FSD_WARP_EMULATION)
#define FSD_EMBED_SCAN 1
#define FSD_EMBED_K 32
/* k over this lane's kn columns of a pass: a loop to the constant
 * FSD_EMBED_K, unrolled, with a guard, so s[] is indexed by constants and
 * stays in registers (an array indexed at run time goes to local memory) */
#ifdef __CUDACC__
#define FSD_EMBED_UNROLL _Pragma("unroll")
#else
#define FSD_EMBED_UNROLL
#endif
#define FSD_EMBED_FOR_K(k, kn) \
    FSD_EMBED_UNROLL for (int k = 0; k < FSD_EMBED_K; k++) if (k < (kn))
#else
#define FSD_EMBED_SCAN 64
#define FSD_EMBED_K 2048
/* contiguous columns: a loop the compiler vectorises */
#define FSD_EMBED_FOR_K(k, kn) FSD_SIMD for (int k = 0; k < (kn); k++)
#endif
#define FSD_EMBED_COLS (FSD_WARP * FSD_EMBED_K)

/* Whether token t is at a position in [a, b) ∩ [c0, c0 + lanes·SCAN), the
 * lanes' step at c0; the warp's answer, the same in every lane. */
DEVICE bool embed_step_has(const int32_t *idx, int64_t c0, int64_t a, int64_t b, int32_t t,
                           int lane)
{
    int hit = 0;
    int64_t lo = c0 + (int64_t)lane * FSD_EMBED_SCAN, hi = lo + FSD_EMBED_SCAN;
    if (lo >= a && hi <= b) {
        for (int s = 0; s < FSD_EMBED_SCAN; s++)   /* a constant count: vectorised */
            hit |= idx[lo + s] == t;
    } else {
        for (int64_t p = lo > a ? lo : a; p < (hi < b ? hi : b); p++)
            hit |= idx[p] == t;
    }
    return fsd_warp_max((real)hit) > 0;
}

DEVICE void embed_bwd_row(int64_t i, int lane, int lanes, act *dW, const act *dout,
                          const int32_t *idx, int64_t N, int64_t C, int64_t V)
{
    const int32_t t = idx[i];
    const int64_t step = (int64_t)lanes * FSD_EMBED_SCAN;
    if (t < 0 || t >= V)
        fsd_trap();
    /* an earlier position holding t owns t's row: nothing to do here */
    for (int64_t c1 = i; c1 > 0; c1 -= step)
        if (embed_step_has(idx, c1 - step, 0, i, t, lane))
            return;   /* the whole warp: embed_step_has is the warp's */

    for (int64_t j0 = 0; j0 < C; j0 += FSD_EMBED_COLS) {
        /* this lane's columns j0 + lane + k·lanes, k < kn */
        const int64_t left = C - j0 - lane;
        const int kn = left <= 0 ? 0
                       : left >= (int64_t)FSD_EMBED_K * lanes ? FSD_EMBED_K
                                                               : (int)((left + lanes - 1) / lanes);
        const int64_t jl = j0 + lane;
        real s[FSD_EMBED_K];
        FSD_EMBED_FOR_K(k, kn)
            s[k] = 0;
        for (int64_t c0 = i; c0 < N; c0 += step) {
            if (!embed_step_has(idx, c0, i, N, t, lane))
                continue;
            const int64_t c1 = c0 + step < N ? c0 + step : N;
            for (int64_t p = c0; p < c1; p++) {   /* every lane, in order */
                if (idx[p] != t)
                    continue;
                const act *row = dout + p * C + jl;
                FSD_EMBED_FOR_K(k, kn)
                    s[k] += fsd_wide(row[(int64_t)k * lanes]);
            }
        }
        act *out = dW + (int64_t)t * C + jl;
        FSD_EMBED_FOR_K(k, kn)
            fsd_store(&out[(int64_t)k * lanes], s[k], true);
    }
}
FSD_ROW_KERNEL(embed_bwd,
               (act *dW, const act *dout, const int32_t *idx, int64_t N, int64_t C, int64_t V),
               (dW, dout, idx, N, C, V))

LAUNCHER void embed_bwd(act *dW, const act *dout, const int32_t *idx, int64_t N,
                        int64_t C, int64_t V)
{
    FSD_REQUIRE("embed_bwd", dW && dout && idx);
    FSD_REQUIRE("embed_bwd", N > 0 && C > 0 && V > 0);
    fsd_check_indices("embed_bwd", idx, N, V);
    FSD_RUN_ROWS(embed_bwd, N, C, (dW, dout, idx, N, C, V));
}
