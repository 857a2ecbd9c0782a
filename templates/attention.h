/*
 * attention.h — scaled dot-product attention, causal or not, with
 * grouped-query heads (docs/design.md#layer-semantics). Needs portable.h.
 *
 * Layouts (the outputs of the q, k, v Linears, heads side by side):
 *   q, out [B, T, H·hd]     k, v [B, T, KV·hd]     lse [B, H, T]
 * Query head h reads kv head g(h) = ⌊h·KV/H⌋ (Hugging Face's repeat_kv).
 * For query row (b, h, t), with keys s ≤ t when causal, all s otherwise:
 *   z_s = scale · q[b,t,h,:] · k[b,s,g,:],  scale = 1/√hd
 *   lse[b,h,t] = log Σ_s exp(z_s),  p_s = exp(z_s − lse)
 *   out[b,t,h,:] = Σ_s p_s · v[b,s,g,:]
 * q, k, v, out and their gradients are `act` (bf16 when the program
 * stores its tensors so: runtime/fsdrt.h); lse, a statistic, is `real`.
 * Every version widens what it loads (fsd_wide), computes in real, and
 * stores each output element once (fsd_narrow, fsd_store), so a bf16
 * output is rounded once; D = dout·out in the backward is formed from the
 * out that was stored, as a reference on the stored tensors sees it.
 *
 * Four files, one per kind of machine. This one holds the shared reference
 * (the portable row kernels, below) and the launchers, which pick a
 * version in plain C:
 *   attention.h      the row kernels; the launchers
 *   attention_gpu.h  the GPU's tiled block kernels (fp32 FMAs)
 *   attention_mma.h  the GPU's tensor-core kernels (bf16 act, mma.h)
 *   attention_cpu.h  the CPU's blocked version through BLAS
 * fsdpc pastes them into train.cu in the order mma.h, attention_gpu.h,
 * attention_mma.h, attention_cpu.h, attention.h (compiler/emit.c); included
 * alone (tests/kernels), attention.h includes the others itself.
 *
 * The portable row kernels: one work item per query row in the forward (an
 * online softmax over the keys), lanes strided over the head dimension.
 * The backward recomputes p from q, k and lse, in two passes that each own
 * what they write: dq by query row, dk and dv by key row (b, g, s), so
 * nothing is accumulated by two workers and the result is deterministic.
 * Each sums its outputs in registers, FSD_ATTN_ROW_NJ elements per lane
 * (256 per row on every backend), and stores them once: no scratch memory;
 * a head dim past 256 takes a pass per 256 elements, each recomputing the
 * scores. The GPU runs them for head dims past FSD_ATTN_HD_MAX only.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif
#ifndef FSD_ATTENTION_GPU_H
#include "attention_gpu.h"
#endif
#ifndef FSD_ATTENTION_MMA_H
#include "attention_mma.h"
#endif
#ifndef FSD_ATTENTION_CPU_H
#include "attention_cpu.h"
#endif

/* a · b over hd elements, summed over the lanes */
DEVICE real attn_dot(int lane, int lanes, const act *a, const act *b, int64_t hd)
{
    real s = 0;
    for (int64_t d = lane; d < hd; d += lanes)
        s += fsd_wide(a[d]) * fsd_wide(b[d]);
    return fsd_warp_sum(s);
}

/* The row kernels sum their outputs in registers and store each element
 * once: a pass covers head-dim elements [d0, d0 + 256), a lane holding
 * d0 + lane + lanes·j for j < FSD_ATTN_ROW_NJ (8 on the GPU, whose row
 * kernels serve head dims past 128; the CPU's one lane holds all 256). */
#define FSD_ATTN_ROW_NJ (256 / FSD_WARP)

/* Element j of a lane's share of the pass from d0 (past the row when ≥ hd) */
DEVICE int64_t attn_row_elem(int64_t d0, int lane, int lanes, int j)
{
    return d0 + lane + (int64_t)lanes * j;
}

/* The j a lane walks in the pass from d0: all FSD_ATTN_ROW_NJ on the GPU,
 * where a constant count keeps the sums in registers (elements past hd are
 * skipped inside the loops); on the CPU only those below hd, which its one
 * lane would otherwise walk 256 of for a head dim of 64. */
DEVICE int attn_row_nj(int64_t d0, int64_t hd)
{
#if FSD_WARP == 1
    return hd - d0 < FSD_ATTN_ROW_NJ ? (int)(hd - d0) : FSD_ATTN_ROW_NJ;
#else
    (void)d0, (void)hd;
    return FSD_ATTN_ROW_NJ;
#endif
}

/* A lane's sums for a gradient row r start from its old values, widened,
 * when acc (the contributions then follow one at a time, as they always
 * did, and the sum is rounded once, when stored), else from 0. */
DEVICE void attn_row_start(real *a, bool acc, const act *r, int64_t d0, int lane, int lanes,
                           int64_t hd)
{
    for (int j = 0, nj = attn_row_nj(d0, hd); j < nj; j++) {
        const int64_t d = attn_row_elem(d0, lane, lanes, j);
        a[j] = acc && d < hd ? fsd_wide(r[d]) : 0;
    }
}

/* Stores a lane's sums into row r, each rounded once. */
DEVICE void attn_row_store(act *r, const real *a, int64_t d0, int lane, int lanes, int64_t hd)
{
    for (int j = 0, nj = attn_row_nj(d0, hd); j < nj; j++) {
        const int64_t d = attn_row_elem(d0, lane, lanes, j);
        if (d < hd)
            r[d] = fsd_narrow(a[j]);
    }
}

/* Forward of query row `row` = (b·H + h)·T + t, the lse index. */
DEVICE void attention_fwd_row(int64_t row, int lane, int lanes, act *out, real *lse,
                              const act *q, const act *k, const act *v, int64_t T, int64_t H,
                              int64_t KV, int64_t hd, bool causal)
{
    int64_t t = row % T, h = (row / T) % H, b = row / (T * H), g = h * KV / H;
    const act *qr = q + (b * T + t) * H * hd + h * hd;
    act *o = out + (b * T + t) * H * hd + h * hd;
    real scale = 1 / fsd_sqrt((real)hd);
    int64_t nkeys = causal ? t + 1 : T;
    for (int64_t d0 = 0; d0 < hd; d0 += (int64_t)lanes * FSD_ATTN_ROW_NJ) {
        const int nj = attn_row_nj(d0, hd);
        /* online softmax: m is the running max, l the running Σ exp(z − m),
         * acc the running Σ exp(z − m) · v of this lane's elements */
        real m = -INFINITY, l = 0, acc[FSD_ATTN_ROW_NJ];
        for (int j = 0; j < nj; j++)
            acc[j] = 0;
        for (int64_t s = 0; s < nkeys; s++) {
            const act *kr = k + (b * T + s) * KV * hd + g * hd;
            const act *vr = v + (b * T + s) * KV * hd + g * hd;
            real z = attn_dot(lane, lanes, qr, kr, hd) * scale;
            /* one exp per key: rescale only when the max grows (every lane
             * holds the same z, so the branch does not diverge) */
            real corr = 1, p = 1;
            if (z > m) {
                corr = fsd_exp(m - z);   /* 0 on the first key: m = −∞ */
                m = z;
            } else {
                p = fsd_exp(z - m);
            }
            l = l * corr + p;
            for (int j = 0; j < nj; j++) {
                const int64_t d = attn_row_elem(d0, lane, lanes, j);
                if (d < hd)
                    acc[j] = acc[j] * corr + p * fsd_wide(vr[d]);
            }
        }
        for (int j = 0; j < nj; j++)
            acc[j] /= l;
        attn_row_store(o, acc, d0, lane, lanes, hd);
        if (d0 == 0 && lane == 0)
            lse[row] = m + fsd_log(l);
    }
}
FSD_ROW_KERNEL(attention_fwd,
               (act *out, real *lse, const act *q, const act *k, const act *v, int64_t T,
                int64_t H, int64_t KV, int64_t hd, bool causal),
               (out, lse, q, k, v, T, H, KV, hd, causal))


static inline void attention_check(const char *kernel, int64_t B, int64_t T, int64_t H,
                                   int64_t KV, int64_t hd)
{
    FSD_REQUIRE(kernel, B > 0 && T > 0 && H > 0 && KV > 0 && hd > 0);
    FSD_REQUIRE(kernel, KV <= H && H % KV == 0);
    FSD_REQUIRE(kernel, H * hd <= INT32_MAX && T <= INT32_MAX);   /* BLAS sizes are int */
}

/* attention_fwd: out and lse as above; both overwritten. */
LAUNCHER void attention_fwd(act *out, real *lse, const act *q, const act *k,
                            const act *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                            int64_t hd, bool causal)
{
    FSD_REQUIRE("attention_fwd", out && lse && q && k && v);
    attention_check("attention_fwd", B, T, H, KV, hd);
#ifdef FSD_ATTENTION_BLAS
    attention_fwd_blas(out, lse, q, k, v, B, T, H, KV, hd, causal);
#else
#ifdef FSD_MMA
    /* bf16: tensor cores, for the head dims their 16-wide fragments tile;
     * the tiles load 16-byte vectors where a head's rows are 16-byte
     * aligned, else pairs of elements, so 4-byte aligned tensors */
    if (hd % 16 == 0 && hd <= FSD_ATTN_HD_MAX &&
        ((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 4 == 0) {
        FSD_RUN_BLOCKS(attention_fwd_mma, B * H * ((T + FSD_ATTN_MB - 1) / FSD_ATTN_MB),
                       (out, lse, q, k, v, T, H, KV, hd, causal));
        return;
    }
#endif
#ifdef FSD_ATTN_HD_MAX
    if (hd <= FSD_ATTN_HD_MAX) {
        FSD_RUN_BLOCKS(attention_fwd_tiled, B * H * ((T + FSD_ATTN_BR - 1) / FSD_ATTN_BR),
                       (out, lse, q, k, v, T, H, KV, hd, causal));
        return;
    }
#endif
    /* the CPU with FSD_ATTENTION_PORTABLE; the GPU past FSD_ATTN_HD_MAX */
    FSD_RUN_ROWS(attention_fwd, B * H * T, T * hd, (out, lse, q, k, v, T, H, KV, hd, causal));
#endif
}

/* dq of query row `row` = (b·H + h)·T + t:
 *   D = do · o,  dp_s = do · v_s,  ds_s = p_s · (dp_s − D)
 *   dq (+)= scale · Σ_s ds_s · k_s
 * summed in registers (each lane owns its elements) and stored once. */
DEVICE void attention_bwd_dq_row(int64_t row, int lane, int lanes, act *dq, bool acc,
                                 const act *dout, const act *q, const act *k, const act *v,
                                 const act *out, const real *lse, int64_t T, int64_t H,
                                 int64_t KV, int64_t hd, bool causal)
{
    int64_t t = row % T, h = (row / T) % H, b = row / (T * H), g = h * KV / H;
    int64_t at = (b * T + t) * H * hd + h * hd;
    const act *qr = q + at, *dor = dout + at;
    act *dqr = dq + at;
    real scale = 1 / fsd_sqrt((real)hd), L = lse[row];
    real D = attn_dot(lane, lanes, dor, out + at, hd);
    int64_t nkeys = causal ? t + 1 : T;
    for (int64_t d0 = 0; d0 < hd; d0 += (int64_t)lanes * FSD_ATTN_ROW_NJ) {
        const int nj = attn_row_nj(d0, hd);
        real a[FSD_ATTN_ROW_NJ];
        attn_row_start(a, acc, dqr, d0, lane, lanes, hd);
        for (int64_t s = 0; s < nkeys; s++) {
            const act *kr = k + (b * T + s) * KV * hd + g * hd;
            const act *vr = v + (b * T + s) * KV * hd + g * hd;
            real p = fsd_exp(attn_dot(lane, lanes, qr, kr, hd) * scale - L);
            real ds = p * (attn_dot(lane, lanes, dor, vr, hd) - D) * scale;
            for (int j = 0; j < nj; j++) {
                const int64_t d = attn_row_elem(d0, lane, lanes, j);
                if (d < hd)
                    a[j] += ds * fsd_wide(kr[d]);
            }
        }
        attn_row_store(dqr, a, d0, lane, lanes, hd);
    }
}
FSD_ROW_KERNEL(attention_bwd_dq,
               (act *dq, bool acc, const act *dout, const act *q, const act *k, const act *v,
                const act *out, const real *lse, int64_t T, int64_t H, int64_t KV, int64_t hd,
                bool causal),
               (dq, acc, dout, q, k, v, out, lse, T, H, KV, hd, causal))

/* dk and dv of key row `row` = (b·KV + g)·T + s, over every query head h
 * with g(h) = g and every query t that sees key s:
 *   dv_s (+)= Σ p · do_t,   dk_s (+)= scale · Σ ds · q_t
 * D = do_t · o_t is recomputed per pair: no scratch memory. */
DEVICE void attention_bwd_dkv_row(int64_t row, int lane, int lanes, act *dk, bool acc_k,
                                  act *dv, bool acc_v, const act *dout, const act *q,
                                  const act *k, const act *v, const act *out, const real *lse,
                                  int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    int64_t s = row % T, g = (row / T) % KV, b = row / (T * KV);
    int64_t at = (b * T + s) * KV * hd + g * hd;
    const act *kr = k + at, *vr = v + at;
    act *dkr = dk + at, *dvr = dv + at;
    real scale = 1 / fsd_sqrt((real)hd);
    for (int64_t d0 = 0; d0 < hd; d0 += (int64_t)lanes * FSD_ATTN_ROW_NJ) {
        const int nj = attn_row_nj(d0, hd);
        real ak[FSD_ATTN_ROW_NJ], av[FSD_ATTN_ROW_NJ];
        attn_row_start(ak, acc_k, dkr, d0, lane, lanes, hd);
        attn_row_start(av, acc_v, dvr, d0, lane, lanes, hd);
        for (int64_t h = 0; h < H; h++) {
            if (h * KV / H != g)
                continue;
            for (int64_t t = causal ? s : 0; t < T; t++) {
                int64_t qt = (b * T + t) * H * hd + h * hd;
                const act *qr = q + qt, *dor = dout + qt;
                real p = fsd_exp(attn_dot(lane, lanes, qr, kr, hd) * scale -
                                 lse[(b * H + h) * T + t]);
                real D = attn_dot(lane, lanes, dor, out + qt, hd);
                real ds = p * (attn_dot(lane, lanes, dor, vr, hd) - D) * scale;
                for (int j = 0; j < nj; j++) {
                    const int64_t d = attn_row_elem(d0, lane, lanes, j);
                    if (d < hd) {
                        av[j] += p * fsd_wide(dor[d]);
                        ak[j] += ds * fsd_wide(qr[d]);
                    }
                }
            }
        }
        attn_row_store(dkr, ak, d0, lane, lanes, hd);
        attn_row_store(dvr, av, d0, lane, lanes, hd);
    }
}
FSD_ROW_KERNEL(attention_bwd_dkv,
               (act *dk, bool acc_k, act *dv, bool acc_v, const act *dout, const act *q,
                const act *k, const act *v, const act *out, const real *lse, int64_t T,
                int64_t H, int64_t KV, int64_t hd, bool causal),
               (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal))

/* attention_bwd: from dout [B, T, H·hd] and the forward's q, k, v, out and
 * lse, writes (acc_*: adds to)
 *   dq [B, T, H·hd],  dk, dv [B, T, KV·hd]
 * with p_s = exp(z_s − lse), ds_s = p_s · (dout·v_s − dout·out):
 *   dq = scale · Σ_s ds_s k_s,  dk_s = scale · Σ ds_s q,  dv_s = Σ p_s dout.
 * With acc, the row kernels add contributions to the existing values one
 * key (or query) at a time, the tiled kernels add each finished sum once:
 * equal up to rounding. Either way the sum is formed in real and stored
 * (rounded, when act is bf16) once. */
LAUNCHER void attention_bwd(act *dq, bool acc_q, act *dk, bool acc_k, act *dv,
                            bool acc_v, const act *dout, const act *q, const act *k,
                            const act *v, const act *out, const real *lse, int64_t B,
                            int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    FSD_REQUIRE("attention_bwd", dq && dk && dv && dout && q && k && v && out && lse);
    attention_check("attention_bwd", B, T, H, KV, hd);
#ifdef FSD_ATTENTION_BLAS
    attention_bwd_blas(dq, acc_q, dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, B, T, H, KV, hd,
                       causal);
#else
#ifdef FSD_ATTN_HD_MAX
#ifdef FSD_MMA
    /* tensor cores for bf16 head dims the fragments tile (multiples of 16);
     * the tile loads take 16-byte vectors where a head's rows are 16-byte
     * aligned, else pairs of elements, so 4-byte aligned tensors */
    if (hd % 16 == 0 && hd <= FSD_ATTN_HD_MAX &&
        ((uintptr_t)dout | (uintptr_t)q | (uintptr_t)k | (uintptr_t)v) % 4 == 0) {
        const int64_t nt = (T + FSD_ATTN_MB - 1) / FSD_ATTN_MB;
        FSD_RUN_BLOCKS(attention_bwd_dq_mma, B * H * nt,
                       (dq, acc_q, dout, q, k, v, out, lse, B, T, H, KV, hd, causal));
        FSD_RUN_BLOCKS(attention_bwd_dkv_mma, B * KV * nt,
                       (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal));
        return;
    }
#endif
    if (hd <= FSD_ATTN_HD_MAX) {
        const int64_t nt = (T + FSD_ATTN_BT - 1) / FSD_ATTN_BT;
        FSD_RUN_BLOCKS(attention_bwd_dq_tiled, B * H * nt,
                       (dq, acc_q, dout, q, k, v, out, lse, T, H, KV, hd, causal));
        FSD_RUN_BLOCKS(attention_bwd_dkv_tiled, B * KV * nt,
                       (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal));
        return;
    }
#endif
    /* the CPU with FSD_ATTENTION_PORTABLE; the GPU past FSD_ATTN_HD_MAX */
    FSD_RUN_ROWS(attention_bwd_dq, B * H * T, T * hd,
                 (dq, acc_q, dout, q, k, v, out, lse, T, H, KV, hd, causal));
    FSD_RUN_ROWS(attention_bwd_dkv, B * KV * T, T * hd,
                 (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal));
#endif
}
