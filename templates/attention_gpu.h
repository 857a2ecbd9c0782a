/*
 * attention_gpu.h — attention on the GPU: the tiled block kernels (fp32
 * FMAs, FlashAttention-style), part of the attention family (attention.h,
 * whose launchers start them). Needs portable.h. The warp emulation of the
 * tests (tests/kernels) runs them on the CPU; the CPU build compiles
 * nothing here.
 *
 * Blocks of 128 threads on tiles of queries and keys staged in shared
 * memory, an online softmax, fp32 FMAs; the backward in two deterministic
 * kernels (dk and dv by key tile, dq by query tile), no atomics.
 */
#ifndef FSD_ATTENTION_GPU_H
#define FSD_ATTENTION_GPU_H
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

#if defined(__CUDACC__) || defined(FSD_BLOCK_EMULATION)
/* ── the GPU path: tiles in shared memory, FlashAttention-style ──
 *
 * Block kernels (portable.h): one block of FSD_BLOCK = 128 threads per
 * tile, its operands widened into shared memory, plain fp32 FMAs (no tensor
 * cores, no mma). Head dims up to FSD_ATTN_HD_MAX; the launchers run the
 * row kernels (attention.h) for larger ones.
 *
 * Forward: a block per (b, h, tile of 32 query rows), 8 rows per warp. It
 * walks the key tiles of 32 keys, up to the diagonal when causal (tiles
 * wholly above it are skipped), one key per lane: S = scale·Q·Kᵀ for the
 * tile from Q and K in shared memory, the mask, an online softmax (the row
 * max by fsd_warp_max; running max m, per-lane partial sums of
 * exp(z − m), the output accumulator rescaled when m grows), P through
 * shared memory, then O += P·V with each lane owning head-dim elements
 * lane + 32j in registers. K and V take turns in one buffer (both would
 * not fit 48 KiB at hd 128). out and lse are written as the row kernel
 * writes them.
 *
 * Backward, deterministic without atomics (FlashAttention-2 adds dq with
 * atomics): two kernels on tiles of 16 queries × 16 keys, P recomputed
 * from q, k and lse, D = dO·O recomputed per query tile (a 1/64 share of
 * the tile's work, and no buffer for it):
 *   dk, dv  a block per (b, kv head g, 16 keys): every query head of g and
 *           every query tile that sees the keys, in that order, summing
 *           dK += dSᵀ·Q and dV += Pᵀ·dO in registers (warp w owns keys
 *           4w..4w+3, lane the head-dim elements lane + 32j);
 *   dq      a block per (b, h, 16 queries): every key tile up to the
 *           diagonal, dQ += dS·K in registers.
 * with dS = P∘(dP − D), dP = dO·Vᵀ, scale applied once at the end. Each
 * output element is summed by one thread in a fixed order, then stored
 * once (fsd_store: acc adds the finished sum). Shared memory and registers
 * only: no workspace (compiler/memplan.c).
 */
#ifndef FSD_ATTN_HD_MAX
#if defined(__CUDACC__) && defined(FSD_FLOAT64)
#define FSD_ATTN_HD_MAX 64    /* doubles: hd 128 tiles would pass 48 KiB of shared memory */
#else
#define FSD_ATTN_HD_MAX 128
#endif
#endif
#define FSD_ATTN_NJ (FSD_ATTN_HD_MAX / 32)    /* head-dim elements per lane */
#define FSD_ATTN_LD (FSD_ATTN_HD_MAX + 1)     /* tile row stride: a lane per row, no bank conflicts */
#define FSD_ATTN_WARPS (FSD_BLOCK / 32)
#define FSD_ATTN_BR 32                        /* forward: query rows per block */
#define FSD_ATTN_BC 32                        /* forward: keys per tile, one per lane */
#define FSD_ATTN_RW (FSD_ATTN_BR / FSD_ATTN_WARPS)   /* forward: rows per warp */
#define FSD_ATTN_BT 16                        /* backward: queries and keys per tile */
#define FSD_ATTN_KW (FSD_ATTN_BT / FSD_ATTN_WARPS)   /* backward: rows (or keys) per warp */
#define FSD_ATTN_PL (FSD_ATTN_BT + 1)         /* backward: row stride of P and dS */
#define FSD_ATTN_FWD_SMEM \
    ((FSD_ATTN_BR + FSD_ATTN_BC) * FSD_ATTN_LD + FSD_ATTN_BR * (FSD_ATTN_BC + 1))
#define FSD_ATTN_BWD_SMEM \
    (4 * FSD_ATTN_BT * FSD_ATTN_LD + 2 * FSD_ATTN_BT * FSD_ATTN_PL + 2 * FSD_ATTN_BT)

/* Rows [r0, r0 + n) of a matrix with row stride ld (hd columns) into a
 * shared tile, widened, zeros for rows past T; all threads of the block,
 * coalesced. */
DEVICE void attn_load_tile(real *dst, const act *src, int64_t ld, int64_t r0, int n, int64_t T,
                           int64_t hd, int tid)
{
    const int w = (int)hd;
    for (int i = tid; i < n * w; i += FSD_BLOCK) {
        int r = i / w, d = i % w;
        dst[r * FSD_ATTN_LD + d] = r0 + r < T ? fsd_wide(src[(r0 + r) * ld + d]) : 0;
    }
}

/* Forward of tile blk = (b·H + h)·⌈T/32⌉ + query tile. */
DEVICE void attention_fwd_tiled_block(int64_t blk, int tid, real *smem, act *out, real *lse,
                                      const act *q, const act *k, const act *v, int64_t T,
                                      int64_t H, int64_t KV, int64_t hd, bool causal)
{
    const int64_t nqt = (T + FSD_ATTN_BR - 1) / FSD_ATTN_BR;
    const int64_t q0 = blk % nqt * FSD_ATTN_BR, h = blk / nqt % H, b = blk / (nqt * H);
    const int64_t g = h * KV / H, ldq = H * hd, ldk = KV * hd;
    const int lane = tid % 32, w = tid / 32;
    real *sQ = smem, *sKV = smem + FSD_ATTN_BR * FSD_ATTN_LD;
    real *sP = sKV + FSD_ATTN_BC * FSD_ATTN_LD;   /* [BR][BC + 1] */
    const act *K = k + b * T * ldk + g * hd, *V = v + b * T * ldk + g * hd;
    const real scale = 1 / fsd_sqrt((real)hd);
    real m[FSD_ATTN_RW], lp[FSD_ATTN_RW], acc[FSD_ATTN_RW][FSD_ATTN_NJ];
    for (int r = 0; r < FSD_ATTN_RW; r++) {
        m[r] = -INFINITY, lp[r] = 0;
        for (int j = 0; j < FSD_ATTN_NJ; j++)
            acc[r][j] = 0;
    }
    attn_load_tile(sQ, q + b * T * ldq + h * hd, ldq, q0, FSD_ATTN_BR, T, hd, tid);
    /* every tile walked has a key each row sees (its first), so m is
     * finite after the first tile, rows past T included */
    const int64_t kend = causal && q0 + FSD_ATTN_BR < T ? q0 + FSD_ATTN_BR : T;
    for (int64_t k0 = 0; k0 < kend; k0 += FSD_ATTN_BC) {
        fsd_block_sync();   /* Q is in; the last tile's V has been read */
        attn_load_tile(sKV, K, ldk, k0, FSD_ATTN_BC, T, hd, tid);
        fsd_block_sync();
        real z[FSD_ATTN_RW];
        for (int r = 0; r < FSD_ATTN_RW; r++)
            z[r] = 0;
        for (int d = 0; d < (int)hd; d++) {
            const real kd = sKV[lane * FSD_ATTN_LD + d];
            for (int r = 0; r < FSD_ATTN_RW; r++)
                z[r] += sQ[(w * FSD_ATTN_RW + r) * FSD_ATTN_LD + d] * kd;
        }
        const int64_t s = k0 + lane;
        for (int r = 0; r < FSD_ATTN_RW; r++) {
            const int64_t t = q0 + w * FSD_ATTN_RW + r;
            const real zr = s < T && (!causal || s <= t) ? z[r] * scale : -INFINITY;
            /* every lane gets the same max: m, corr agree across the warp */
            const real mnew = fsd_fmax(m[r], fsd_warp_max(zr));
            const real corr = fsd_exp(m[r] - mnew), p = fsd_exp(zr - mnew);   /* 0 when masked */
            m[r] = mnew;
            lp[r] = lp[r] * corr + p;
            for (int j = 0; j < FSD_ATTN_NJ; j++)
                acc[r][j] *= corr;
            sP[(w * FSD_ATTN_RW + r) * (FSD_ATTN_BC + 1) + lane] = p;
        }
        fsd_block_sync();   /* every warp is done with K: V takes its place */
        attn_load_tile(sKV, V, ldk, k0, FSD_ATTN_BC, T, hd, tid);
        fsd_block_sync();
        const int nc = T - k0 < FSD_ATTN_BC ? (int)(T - k0) : FSD_ATTN_BC;
        for (int c = 0; c < nc; c++) {
            real vj[FSD_ATTN_NJ];
            for (int j = 0; j < FSD_ATTN_NJ; j++)
                vj[j] = lane + 32 * j < hd ? sKV[c * FSD_ATTN_LD + lane + 32 * j] : 0;
            for (int r = 0; r < FSD_ATTN_RW; r++) {
                const real p = sP[(w * FSD_ATTN_RW + r) * (FSD_ATTN_BC + 1) + c];
                for (int j = 0; j < FSD_ATTN_NJ; j++)
                    acc[r][j] += p * vj[j];
            }
        }
    }
    for (int r = 0; r < FSD_ATTN_RW; r++) {
        const real l = fsd_warp_sum(lp[r]);
        const int64_t t = q0 + w * FSD_ATTN_RW + r;
        if (t < T) {
            act *o = out + (b * T + t) * ldq + h * hd;
            for (int j = 0; j < FSD_ATTN_NJ; j++)
                if (lane + 32 * j < hd)
                    o[lane + 32 * j] = fsd_narrow(acc[r][j] / l);
            if (lane == 0)
                lse[(b * H + h) * T + t] = m[r] + fsd_log(l);
        }
    }
}
FSD_BLOCK_KERNEL(attention_fwd_tiled, FSD_ATTN_FWD_SMEM,
                 (act *out, real *lse, const act *q, const act *k, const act *v, int64_t T,
                  int64_t H, int64_t KV, int64_t hd, bool causal),
                 (out, lse, q, k, v, T, H, KV, hd, causal))

/* The backward's shared memory: Q, dO, K, V tiles [BT][LD], P and dS
 * [BT][BT + 1], lse and D of the query rows. */
typedef struct AttnBwdTiles {
    real *Q, *dO, *K, *V, *P, *dS, *L, *D;
} AttnBwdTiles;

DEVICE AttnBwdTiles attn_bwd_tiles(real *smem)
{
    AttnBwdTiles s;
    s.Q = smem;
    s.dO = s.Q + FSD_ATTN_BT * FSD_ATTN_LD;
    s.K = s.dO + FSD_ATTN_BT * FSD_ATTN_LD;
    s.V = s.K + FSD_ATTN_BT * FSD_ATTN_LD;
    s.P = s.V + FSD_ATTN_BT * FSD_ATTN_LD;
    s.dS = s.P + FSD_ATTN_BT * FSD_ATTN_PL;
    s.L = s.dS + FSD_ATTN_BT * FSD_ATTN_PL;
    s.D = s.L + FSD_ATTN_BT;
    return s;
}

/* Loads the Q and dO tiles of query rows [q0, q0 + BT) of head h, then
 * their lse and D = dO·O (0 past T), O as stored: warp w takes rows w,
 * w + 4, ... */
DEVICE void attn_bwd_load_queries(AttnBwdTiles s, int tid, const act *dout, const act *q,
                                  const act *out, const real *lse, int64_t b, int64_t h,
                                  int64_t q0, int64_t T, int64_t H, int64_t hd)
{
    const int64_t ldq = H * hd, at = b * T * ldq + h * hd;
    const int lane = tid % 32;
    attn_load_tile(s.Q, q + at, ldq, q0, FSD_ATTN_BT, T, hd, tid);
    attn_load_tile(s.dO, dout + at, ldq, q0, FSD_ATTN_BT, T, hd, tid);
    fsd_block_sync();
    for (int i = tid / 32; i < FSD_ATTN_BT; i += FSD_ATTN_WARPS) {
        const int64_t t = q0 + i;
        real D = 0;
        if (t < T)
            for (int d = lane; d < (int)hd; d += 32)
                D += s.dO[i * FSD_ATTN_LD + d] * fsd_wide(out[at + t * ldq + d]);
        D = fsd_warp_sum(D);
        if (lane == 0) {
            s.D[i] = D;
            s.L[i] = t < T ? lse[(b * H + h) * T + t] : 0;
        }
    }
}

/* P and dS = P∘(dO·V − D) of the tile, queries [q0, q0 + BT) × keys
 * [k0, k0 + BT): two pairs per thread, each a full dot product from the
 * shared tiles; 0 where masked or past T. */
DEVICE void attn_bwd_tile_ds(AttnBwdTiles s, int tid, int64_t q0, int64_t k0, int64_t T,
                             int64_t hd, bool causal, real scale)
{
    for (int e = 0; e < FSD_ATTN_BT * FSD_ATTN_BT / FSD_BLOCK; e++) {
        const int i = tid / FSD_ATTN_BT + e * (FSD_BLOCK / FSD_ATTN_BT), c = tid % FSD_ATTN_BT;
        const int64_t t = q0 + i, key = k0 + c;
        real zq = 0, zd = 0;
        for (int d = 0; d < (int)hd; d++) {
            zq += s.Q[i * FSD_ATTN_LD + d] * s.K[c * FSD_ATTN_LD + d];
            zd += s.dO[i * FSD_ATTN_LD + d] * s.V[c * FSD_ATTN_LD + d];
        }
        const real p = t < T && key < T && (!causal || key <= t) ? fsd_exp(zq * scale - s.L[i]) : 0;
        s.P[i * FSD_ATTN_PL + c] = p;
        s.dS[i * FSD_ATTN_PL + c] = p * (zd - s.D[i]);
    }
}

/* Stores what a warp summed for rows r0 + r, r < FSD_ATTN_KW, of a tile
 * (each lane elements lane + 32j), times scale, into those rows of x below
 * T, ld apart: each element once. */
DEVICE void attn_bwd_store(act *x, int64_t ld, int64_t r0, int64_t T, int64_t hd, int lane,
                           real a[FSD_ATTN_KW][FSD_ATTN_NJ], real scale, bool acc)
{
    for (int r = 0; r < FSD_ATTN_KW; r++)
        if (r0 + r < T)
            for (int j = 0; j < FSD_ATTN_NJ; j++)
                if (lane + 32 * j < hd)
                    fsd_store(x + (r0 + r) * ld + lane + 32 * j, a[r][j] * scale, acc);
}

/* dk and dv of tile blk = (b·KV + g)·⌈T/16⌉ + key tile. */
DEVICE void attention_bwd_dkv_tiled_block(int64_t blk, int tid, real *smem, act *dk, bool acc_k,
                                          act *dv, bool acc_v, const act *dout, const act *q,
                                          const act *k, const act *v, const act *out,
                                          const real *lse, int64_t T, int64_t H, int64_t KV,
                                          int64_t hd, bool causal)
{
    const int64_t nt = (T + FSD_ATTN_BT - 1) / FSD_ATTN_BT;
    const int64_t k0 = blk % nt * FSD_ATTN_BT, g = blk / nt % KV, b = blk / (nt * KV);
    const int64_t ldk = KV * hd, per = H / KV;
    const int lane = tid % 32, w = tid / 32;
    const real scale = 1 / fsd_sqrt((real)hd);
    AttnBwdTiles s = attn_bwd_tiles(smem);
    attn_load_tile(s.K, k + b * T * ldk + g * hd, ldk, k0, FSD_ATTN_BT, T, hd, tid);
    attn_load_tile(s.V, v + b * T * ldk + g * hd, ldk, k0, FSD_ATTN_BT, T, hd, tid);
    real ak[FSD_ATTN_KW][FSD_ATTN_NJ], av[FSD_ATTN_KW][FSD_ATTN_NJ];
    for (int r = 0; r < FSD_ATTN_KW; r++)
        for (int j = 0; j < FSD_ATTN_NJ; j++)
            ak[r][j] = av[r][j] = 0;
    for (int64_t h = g * per; h < (g + 1) * per; h++)   /* the heads with h·KV/H = g */
        for (int64_t q0 = causal ? k0 : 0; q0 < T; q0 += FSD_ATTN_BT) {
            fsd_block_sync();   /* the last tile's Q, dO, P, dS have been read */
            attn_bwd_load_queries(s, tid, dout, q, out, lse, b, h, q0, T, H, hd);
            fsd_block_sync();
            attn_bwd_tile_ds(s, tid, q0, k0, T, hd, causal, scale);
            fsd_block_sync();
            for (int i = 0; i < FSD_ATTN_BT; i++) {
                real qj[FSD_ATTN_NJ], oj[FSD_ATTN_NJ];
                for (int j = 0; j < FSD_ATTN_NJ; j++) {
                    const int d = lane + 32 * j;
                    qj[j] = d < hd ? s.Q[i * FSD_ATTN_LD + d] : 0;
                    oj[j] = d < hd ? s.dO[i * FSD_ATTN_LD + d] : 0;
                }
                for (int r = 0; r < FSD_ATTN_KW; r++) {
                    const int c = w * FSD_ATTN_KW + r;
                    const real p = s.P[i * FSD_ATTN_PL + c], ds = s.dS[i * FSD_ATTN_PL + c];
                    for (int j = 0; j < FSD_ATTN_NJ; j++) {
                        av[r][j] += p * oj[j];
                        ak[r][j] += ds * qj[j];
                    }
                }
            }
        }
    const int64_t at = b * T * ldk + g * hd, key0 = k0 + w * FSD_ATTN_KW;
    attn_bwd_store(dk + at, ldk, key0, T, hd, lane, ak, scale, acc_k);
    attn_bwd_store(dv + at, ldk, key0, T, hd, lane, av, 1, acc_v);
}
FSD_BLOCK_KERNEL(attention_bwd_dkv_tiled, FSD_ATTN_BWD_SMEM,
                 (act *dk, bool acc_k, act *dv, bool acc_v, const act *dout, const act *q,
                  const act *k, const act *v, const act *out, const real *lse, int64_t T,
                  int64_t H, int64_t KV, int64_t hd, bool causal),
                 (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal))

/* dq of tile blk = (b·H + h)·⌈T/16⌉ + query tile. */
DEVICE void attention_bwd_dq_tiled_block(int64_t blk, int tid, real *smem, act *dq, bool acc,
                                         const act *dout, const act *q, const act *k,
                                         const act *v, const act *out, const real *lse,
                                         int64_t T, int64_t H, int64_t KV, int64_t hd,
                                         bool causal)
{
    const int64_t nt = (T + FSD_ATTN_BT - 1) / FSD_ATTN_BT;
    const int64_t q0 = blk % nt * FSD_ATTN_BT, h = blk / nt % H, b = blk / (nt * H);
    const int64_t g = h * KV / H, ldq = H * hd, ldk = KV * hd;
    const int lane = tid % 32, w = tid / 32;
    const real scale = 1 / fsd_sqrt((real)hd);
    AttnBwdTiles s = attn_bwd_tiles(smem);
    real aq[FSD_ATTN_KW][FSD_ATTN_NJ];
    for (int r = 0; r < FSD_ATTN_KW; r++)
        for (int j = 0; j < FSD_ATTN_NJ; j++)
            aq[r][j] = 0;
    attn_bwd_load_queries(s, tid, dout, q, out, lse, b, h, q0, T, H, hd);
    const int64_t kend = causal && q0 + FSD_ATTN_BT < T ? q0 + FSD_ATTN_BT : T;
    for (int64_t k0 = 0; k0 < kend; k0 += FSD_ATTN_BT) {
        fsd_block_sync();   /* lse and D are in; the last tile's K and dS have been read */
        attn_load_tile(s.K, k + b * T * ldk + g * hd, ldk, k0, FSD_ATTN_BT, T, hd, tid);
        attn_load_tile(s.V, v + b * T * ldk + g * hd, ldk, k0, FSD_ATTN_BT, T, hd, tid);
        fsd_block_sync();
        attn_bwd_tile_ds(s, tid, q0, k0, T, hd, causal, scale);
        fsd_block_sync();
        for (int c = 0; c < FSD_ATTN_BT; c++) {
            real kj[FSD_ATTN_NJ];
            for (int j = 0; j < FSD_ATTN_NJ; j++)
                kj[j] = lane + 32 * j < hd ? s.K[c * FSD_ATTN_LD + lane + 32 * j] : 0;
            for (int r = 0; r < FSD_ATTN_KW; r++) {
                const real ds = s.dS[(w * FSD_ATTN_KW + r) * FSD_ATTN_PL + c];
                for (int j = 0; j < FSD_ATTN_NJ; j++)
                    aq[r][j] += ds * kj[j];
            }
        }
    }
    attn_bwd_store(dq + b * T * ldq + h * hd, ldq, q0 + w * FSD_ATTN_KW, T, hd, lane, aq, scale,
                   acc);
}
FSD_BLOCK_KERNEL(attention_bwd_dq_tiled, FSD_ATTN_BWD_SMEM,
                 (act *dq, bool acc, const act *dout, const act *q, const act *k,
                  const act *v, const act *out, const real *lse, int64_t T, int64_t H,
                  int64_t KV, int64_t hd, bool causal),
                 (dq, acc, dout, q, k, v, out, lse, T, H, KV, hd, causal))
#endif
#endif /* FSD_ATTENTION_GPU_H */
