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

LAUNCHER void embed_fwd(act *out, const act *W, const int32_t *idx, int64_t N, int64_t C,
                        int64_t V)
{
    FSD_REQUIRE("embed_fwd", out && W && idx);
    FSD_REQUIRE("embed_fwd", N > 0 && C > 0 && V > 0);
    fsd_check_indices("embed_fwd", idx, N, V);
    FSD_RUN_ROWS(embed_fwd, N, (out, W, idx, C, V));
}

/* embed_bwd: dW[idx[i], :] += dout[i, :] for i in [0, N); always
 * accumulates (a parameter gradient; a tied head adds to it too).
 *   dW [V, C], dout [N, C], idx [N].
 * Column-parallel: each column j is summed over i in order by one worker,
 * so repeated tokens need no atomics and the sum is deterministic. With
 * bf16 act each position's addition is rounded: a token seen k times gets
 * k roundings. Rounding once per token would need the positions grouped
 * by token, scratch the GPU has no room for (the memory plan gives
 * kernels no workspace). */
DEVICE void embed_bwd_cols(int64_t j0, int64_t j1, act *dW, const act *dout,
                           const int32_t *idx, int64_t N, int64_t C, int64_t V)
{
    for (int64_t i = 0; i < N; i++) {
        int64_t t = idx[i];
        if (t < 0 || t >= V)
            fsd_trap();
        FSD_SIMD
        for (int64_t j = j0; j < j1; j++)
            fsd_store(&dW[t * C + j], fsd_wide(dout[i * C + j]), true);
    }
}
FSD_COL_KERNEL(embed_bwd,
               (act *dW, const act *dout, const int32_t *idx, int64_t N, int64_t C, int64_t V),
               (dW, dout, idx, N, C, V))

LAUNCHER void embed_bwd(act *dW, const act *dout, const int32_t *idx, int64_t N,
                        int64_t C, int64_t V)
{
    FSD_REQUIRE("embed_bwd", dW && dout && idx);
    FSD_REQUIRE("embed_bwd", N > 0 && C > 0 && V > 0);
    fsd_check_indices("embed_bwd", idx, N, V);
    FSD_RUN_COLS(embed_bwd, C, (dW, dout, idx, N, C, V));
}
