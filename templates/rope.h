/*
 * rope.h — rotary position embeddings with the "rotate half" convention
 * of Hugging Face's Llama (docs/design.md#layer-semantics). Needs portable.h.
 *
 * x is [B, T, H·hd]: row r = (b·T + t)·H + h holds head h at position t.
 * Within a row, element i pairs with i + hd/2 for i < hd/2, and the pair
 * turns by angle t · inv_freq_i, inv_freq_i = theta^(−2i/hd):
 *   y[i]        = x[i] · cos − x[i + hd/2] · sin
 *   y[i + hd/2] = x[i + hd/2] · cos + x[i] · sin
 * which is HF's x·cos + rotate_half(x)·sin. The backward is the transpose,
 * a turn by −angle. Positions are 0..T−1 (the `positions` input).
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

/* Turns each pair of one row by sign · angle; sign −1 is the backward.
 * In place (y == x) is safe: a lane reads its pair before writing it. */
DEVICE void rope_row(int64_t r, int lane, int lanes, act *y, bool acc, const act *x, int64_t T,
                     int64_t H, int64_t hd, real theta, real sign)
{
    int64_t half = hd / 2;
    real pos = (real)((r / H) % T);
    for (int64_t i = lane; i < half; i += lanes) {
        real inv_freq = fsd_pow(theta, -(real)(2 * i) / (real)hd);
        real a = pos * inv_freq, c = fsd_cos(a), s = sign * fsd_sin(a);
        real x1 = fsd_wide(x[r * hd + i]), x2 = fsd_wide(x[r * hd + i + half]);
        fsd_store(&y[r * hd + i], x1 * c - x2 * s, acc);
        fsd_store(&y[r * hd + i + half], x2 * c + x1 * s, acc);
    }
}
FSD_ROW_KERNEL(rope, (act *y, bool acc, const act *x, int64_t T, int64_t H, int64_t hd,
                      real theta, real sign),
               (y, acc, x, T, H, hd, theta, sign))

static inline void rope_check(const char *kernel, const void *y, const void *x, int64_t B,
                              int64_t T, int64_t H, int64_t hd, real theta)
{
    FSD_REQUIRE(kernel, y && x);
    FSD_REQUIRE(kernel, B > 0 && T > 0 && H > 0 && hd > 0);
    FSD_REQUIRE(kernel, hd % 2 == 0);
    FSD_REQUIRE(kernel, theta > 0);
}

/* rope_fwd: y = rotate(x) as above. y, x [B, T, H·hd]; hd even. */
LAUNCHER void rope_fwd(act *y, const act *x, int64_t B, int64_t T, int64_t H, int64_t hd,
                       real theta)
{
    rope_check("rope_fwd", y, x, B, T, H, hd, theta);
    FSD_RUN_ROWS(rope, B * T * H, hd, (y, false, x, T, H, hd, theta, (real)1));
}

/* rope_bwd: dx (+)= rotate(dy) by −angle. dx, dy [B, T, H·hd]. */
LAUNCHER void rope_bwd(act *dx, bool acc, const act *dy, int64_t B, int64_t T, int64_t H,
                       int64_t hd, real theta)
{
    rope_check("rope_bwd", dx, dy, B, T, H, hd, theta);
    FSD_RUN_ROWS(rope, B * T * H, hd, (dx, acc, dy, T, H, hd, theta, (real)-1));
}
