/*
 * attention_mma.h — attention on tensor cores (bf16 act, sm_80 and later):
 * the block kernels on mma.h's primitives, part of the attention family
 * (attention.h, whose launchers start them). Needs portable.h, mma.h and
 * attention_gpu.h (the tile sizes); defines nothing unless mma.h does
 * (FSD_MMA: bf16 act, on the GPU or in its emulation).
 *
 * With bf16 act the GPU runs these instead of the tiled kernels (mma.h:
 * mma.sync m16n8k16, bf16 operands, fp32 sums; sm_80 and later), for
 * head dims that are multiples of 16 up to FSD_ATTN_HD_MAX: tiles of 64
 * rows, 16 a warp, FlashAttention-2's structure. The forward takes a
 * block per query tile with Q in each warp's registers and runs the
 * online softmax on the products' fragments; the backward keeps the two
 * deterministic kernels, dk and dv by key tile with K and V in each
 * warp's registers, dq by query tile with Q and dO there. Both round P
 * (and the backward dS) to bf16 as the products' operands. Tiles come
 * from global memory in 16-byte vectors where the rows allow, and the
 * products' operands from shared memory by ldmatrix (one instruction an
 * A fragment or two B fragments). Other head dims, and fp32 programs,
 * keep the tiled kernels.
 */
#ifndef FSD_ATTENTION_MMA_H
#define FSD_ATTENTION_MMA_H
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif
/* bf16 programs take the tensor-core kernels (mma.h, FSD_MMA) */
#if defined(FSD_ACT_IS_BF16) && !defined(FSD_MMA_H)
#include "mma.h"
#endif
#ifndef FSD_ATTENTION_GPU_H
#include "attention_gpu.h"
#endif

#if defined(__CUDACC__) || defined(FSD_BLOCK_EMULATION)
#ifdef FSD_MMA
/* ── the backward on tensor cores (bf16 act, sm_80+) ──
 *
 * The same two deterministic kernels as the tiled backward (attention_gpu.h), with
 * the products on tensor cores (mma.h: m16n8k16, bf16 operands, fp32
 * sums), FlashAttention-2's backward without its atomics. Tiles of
 * FSD_ATTN_MB = 64 rows, 16 a warp, staged in shared memory as stored
 * (bf16, rows FSD_ATTN_MLD apart: 16 bytes of padding put the 8 rows an
 * ldmatrix phase reads in different banks, and keep every row 16-byte
 * aligned, as ldmatrix and the vector tile loads need), zeros past T:
 *   dk, dv  a block per (b, kv head g, 64 keys); warp w holds its 16 keys'
 *           K and V rows as A fragments (registers) and, for every query
 *           head of g and every query tile that sees the keys, 16 queries
 *           at a time: Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, Pᵀ = exp(scale·Sᵀ − lse),
 *           dSᵀ = Pᵀ∘(dPᵀ − D), then dV += Pᵀ·dO and dK += dSᵀ·Q with Pᵀ
 *           and dSᵀ rounded to bf16 as A operands (fsd_fa_from_fc);
 *   dq      a block per (b, h, 64 queries); warp w holds its 16 queries'
 *           Q and dO rows as A fragments, walks the key tiles up to the
 *           diagonal 16 keys at a time: S = Q·Kᵀ, dP = dO·Vᵀ, P, dS, then
 *           dQ += dS·K.
 * D = dO·O (O as stored) and lse·log₂e of a query tile go through shared
 * memory; the exponential is exp2 of scale·log₂e·s − lse·log₂e (one FMA
 * and the GPU's ex2). Each warp sums its dK, dV (or dQ) rows in C
 * fragments over the whole walk, in a fixed order, and stores each element
 * once, scale applied then. P and dS are rounded to bf16 before their
 * products, as FlashAttention-2 rounds them: the one departure from the
 * fp32 arithmetic of the other versions (tests/kernels bounds it). Every
 * thread of a block makes the same mma calls (mma.h); chunks of 16 wholly
 * past T are skipped by the whole block, a warp's chunk wholly above the
 * causal diagonal is not (it computes zeros). K, V (or Q, dO) take hd/16
 * A fragments each and the sums hd/8 C fragments each: 96 registers at hd
 * 64 before the chunk's scores.
 */
#define FSD_ATTN_MB 64                        /* mma kernels: rows a block, 16 a warp */
#define FSD_ATTN_MLD (FSD_ATTN_HD_MAX + 8)    /* mma kernels: bf16 tile row stride */
#define FSD_ATTN_MK (FSD_ATTN_HD_MAX / 16)    /* A fragments of a head row (k slices) */
#define FSD_ATTN_MN (FSD_ATTN_HD_MAX / 8)     /* C fragments of a head row (n slices) */
#define FSD_ATTN_LOG2E 1.4426950408889634f
/* two bf16 tiles [MB][MLD] and lse·log₂e, D of the query rows */
#define FSD_ATTN_MMA_BWD_SMEM \
    ((2 * FSD_ATTN_MB * FSD_ATTN_MLD * (int)sizeof(act) + 2 * FSD_ATTN_MB * (int)sizeof(float)) / \
     (int)sizeof(real))
#ifdef __CUDACC__
#define FSD_ATTN_UNROLL _Pragma("unroll")
/* the tile loads (attn_mma_load_tile): unrolled, more loads in flight,
 * 7 % off the backward at GPT-2's shape on an H200; by 2 only at head
 * dims over 64, where the full unroll spilled the dk, dv kernel (nvcc,
 * sm_90) */
#if FSD_ATTN_HD_MAX <= 64
#define FSD_ATTN_TILE_UNROLL _Pragma("unroll")
#else
#define FSD_ATTN_TILE_UNROLL _Pragma("unroll 2")
#endif
#else
#define FSD_ATTN_UNROLL
#define FSD_ATTN_TILE_UNROLL
#endif

typedef struct AttnMmaTiles {
    act *X, *Y;      /* [MB][MLD]: Q and dO (dk, dv), K and V (dq) */
    float *L, *D;    /* [MB]: lse·log₂e and dO·O of the query rows */
} AttnMmaTiles;

DEVICE AttnMmaTiles attn_mma_tiles(real *smem)
{
    AttnMmaTiles s;
    s.X = (act *)smem;
    s.Y = s.X + FSD_ATTN_MB * FSD_ATTN_MLD;
    s.L = (float *)(s.Y + FSD_ATTN_MB * FSD_ATTN_MLD);
    s.D = s.L + FSD_ATTN_MB;
    return s;
}

/* Rows [r0, r0 + MB) of a head (rows ld apart, hd wide) into a bf16 tile,
 * as stored (the products take bf16), zeros past T: all threads,
 * coalesced, 8 elements (16 bytes, one vector load and store) each time
 * where every source row starts 16-byte aligned (the tile's rows do:
 * FSD_ATTN_MLD is a multiple of 8), else a pair (32 bits). */
DEVICE void attn_mma_load_tile(act *dst, const act *src, int64_t ld, int64_t r0, int64_t T,
                               int hd, int tid)
{
    if (hd % 8 == 0 && ld % 8 == 0 && (uintptr_t)src % 16 == 0) {
        const int vecs = hd / 8;
        FSD_ATTN_TILE_UNROLL
        for (int i = tid; i < FSD_ATTN_MB * vecs; i += FSD_BLOCK) {
            const int r = i / vecs, c = 8 * (i % vecs);
            act *d = dst + r * FSD_ATTN_MLD + c;
            const act *s = src + (r0 + r) * ld + c;
#ifdef __CUDA_ARCH__
            *(uint4 *)d = r0 + r < T ? *(const uint4 *)s : make_uint4(0, 0, 0, 0);
#else
            /* what would be a misaligned vector access on the GPU fails here */
            if ((uintptr_t)d % 16 != 0 || (uintptr_t)s % 16 != 0)
                fsd_trap();
            for (int e = 0; e < 8; e++)
                d[e].bits = r0 + r < T ? s[e].bits : 0;
#endif
        }
        return;
    }
    const int pairs = hd / 2;
    for (int i = tid; i < FSD_ATTN_MB * pairs; i += FSD_BLOCK) {
        const int r = i / pairs, c = 2 * (i % pairs);
        act *d = dst + r * FSD_ATTN_MLD + c;
        const act *s = src + (r0 + r) * ld + c;
#ifdef __CUDA_ARCH__
        *(uint32_t *)d = r0 + r < T ? *(const uint32_t *)s : 0;
#else
        d[0].bits = r0 + r < T ? s[0].bits : 0;
        d[1].bits = r0 + r < T ? s[1].bits : 0;
#endif
    }
}

/* lse·log₂e and D = dO·O of query rows [q0, q0 + MB) of head h (0 past T),
 * dO from its tile, O as stored: a quad of lanes a row (rows tid/4 and
 * tid/4 + 32), lane p of the quad the pairs 2p, 2p + 1 of every 8
 * elements, summed over the quad by fsd_quad_sum (two shuffles, where a
 * warp a row would take five a row). */
DEVICE void attn_mma_query_stats(AttnMmaTiles s, const act *sdO, const act *out,
                                 const real *lse, int64_t b, int64_t h, int64_t q0, int64_t T,
                                 int64_t H, int hd, int tid)
{
    const int64_t ldq = H * hd, at = b * T * ldq + h * hd;
    const int part = tid % 4;
    for (int r = 0; r < FSD_ATTN_MB; r += FSD_BLOCK / 4) {
        const int i = r + tid / 4;
        const int64_t t = q0 + i;
        real D = 0;
        if (t < T) {
            const act *o = out + at + t * ldq, *d = sdO + i * FSD_ATTN_MLD;
            for (int c = 2 * part; c < hd; c += 8)
                D += fsd_wide(d[c]) * fsd_wide(o[c]) + fsd_wide(d[c + 1]) * fsd_wide(o[c + 1]);
        }
        D = fsd_quad_sum(D);
        if (part == 0) {
            s.D[i] = D;
            s.L[i] = t < T ? lse[(b * H + h) * T + t] * FSD_ATTN_LOG2E : 0;
        }
    }
}

/* The scores of 16 rows (the warp's A fragments a[], hd/16 of them) with
 * 16 rows of a tile (B from the tile's rows r, r + 8): two C fragments */
DEVICE void attn_mma_scores(fsd_fc c[2], const fsd_fa a[FSD_ATTN_MK], const act *tile, int hd,
                            int lane)
{
    c[0] = c[1] = fsd_fc_zero();
    FSD_ATTN_UNROLL
    for (int kk = 0; kk < FSD_ATTN_MK; kk++)
        if (16 * kk < hd) {
            fsd_fb b[2];
            fsd_load_b2(b, tile + 16 * kk, FSD_ATTN_MLD, lane);
            fsd_mma(&c[0], a[kk], b[0]);
            fsd_mma(&c[1], a[kk], b[1]);
        }
}

/* acc[j] += a · rows [0, 16) of a tile, head-dim columns [8j, 8j + 8):
 * two j a load (hd a multiple of 16) */
DEVICE void attn_mma_apply(fsd_fc acc[FSD_ATTN_MN], fsd_fa a, const act *tile, int hd, int lane)
{
    FSD_ATTN_UNROLL
    for (int j = 0; j < FSD_ATTN_MN; j += 2)
        if (8 * j < hd) {
            fsd_fb b[2];
            fsd_load_b2_t(b, tile + 8 * j, FSD_ATTN_MLD, lane);
            fsd_mma(&acc[j], a, b[0]);
            fsd_mma(&acc[j + 1], a, b[1]);
        }
}

/* Stores a warp's sums for rows r0 + (0..15) of x (below T, ld apart),
 * times scale: each element once. */
DEVICE void attn_mma_store(act *x, int64_t ld, int64_t r0, int64_t T, int hd, int lane,
                           const fsd_fc a[FSD_ATTN_MN], real scale, bool acc)
{
    FSD_ATTN_UNROLL
    for (int j = 0; j < FSD_ATTN_MN; j++)
        if (8 * j < hd)
            for (int i = 0; i < 4; i++) {
                const int64_t r = r0 + fsd_fc_row(lane, i);
                if (r < T)
                    fsd_store(x + r * ld + 8 * j + fsd_fc_col(lane, i), a[j].x[i] * scale, acc);
            }
}

/* dk and dv of tile blk = (b·KV + g)·⌈T/64⌉ + key tile: when causal, a
 * head's tiles from the one that walks the most query tiles (the first)
 * to the one that walks the fewest, so the grid ends on short blocks. */
DEVICE void attention_bwd_dkv_mma_block(int64_t blk, int tid, real *smem, act *dk, bool acc_k,
                                        act *dv, bool acc_v, const act *dout, const act *q,
                                        const act *k, const act *v, const act *out,
                                        const real *lse, int64_t T, int64_t H, int64_t KV,
                                        int64_t hd, bool causal)
{
    const int64_t nt = (T + FSD_ATTN_MB - 1) / FSD_ATTN_MB;
    const int64_t k0 = blk % nt * FSD_ATTN_MB, g = blk / nt % KV, b = blk / (nt * KV);
    const int64_t ldq = H * hd, ldk = KV * hd, per = H / KV;
    const int lane = tid % 32, w = tid / 32, n = (int)hd;
    const real scale = 1 / fsd_sqrt((real)hd), sl = scale * FSD_ATTN_LOG2E;
    const int64_t kw = k0 + 16 * w;   /* the warp's first key */
    AttnMmaTiles s = attn_mma_tiles(smem);
    /* the block's K and V through shared memory into the warps' A fragments */
    attn_mma_load_tile(s.X, k + b * T * ldk + g * hd, ldk, k0, T, n, tid);
    attn_mma_load_tile(s.Y, v + b * T * ldk + g * hd, ldk, k0, T, n, tid);
    fsd_block_sync();
    fsd_fa fk[FSD_ATTN_MK], fv[FSD_ATTN_MK];
    FSD_ATTN_UNROLL
    for (int kk = 0; kk < FSD_ATTN_MK; kk++)
        if (16 * kk < n) {
            fk[kk] = fsd_load_a(s.X + 16 * w * FSD_ATTN_MLD + 16 * kk, FSD_ATTN_MLD, lane);
            fv[kk] = fsd_load_a(s.Y + 16 * w * FSD_ATTN_MLD + 16 * kk, FSD_ATTN_MLD, lane);
        }
    fsd_fc adk[FSD_ATTN_MN], adv[FSD_ATTN_MN];
    FSD_ATTN_UNROLL
    for (int j = 0; j < FSD_ATTN_MN; j++)
        adk[j] = adv[j] = fsd_fc_zero();
    for (int64_t h = g * per; h < (g + 1) * per; h++)   /* the heads with h·KV/H = g */
        for (int64_t q0 = causal ? k0 : 0; q0 < T; q0 += FSD_ATTN_MB) {
            fsd_block_sync();   /* K and V (or the last tile's Q, dO, L, D) have been read */
            const int64_t at = b * T * ldq + h * hd;
            attn_mma_load_tile(s.X, q + at, ldq, q0, T, n, tid);
            attn_mma_load_tile(s.Y, dout + at, ldq, q0, T, n, tid);
            fsd_block_sync();
            attn_mma_query_stats(s, s.Y, out, lse, b, h, q0, T, H, n, tid);
            fsd_block_sync();
            for (int c = 0; c < FSD_ATTN_MB / 16 && q0 + 16 * c < T; c++) {
                /* Sᵀ and dPᵀ: the warp's 16 keys × queries q0 + 16c + (0..15) */
                fsd_fc st[2], dpt[2];
                attn_mma_scores(st, fk, s.X + 16 * c * FSD_ATTN_MLD, n, lane);
                attn_mma_scores(dpt, fv, s.Y + 16 * c * FSD_ATTN_MLD, n, lane);
                for (int f = 0; f < 2; f++)
                    for (int i = 0; i < 4; i++) {
                        const int qi = 16 * c + 8 * f + fsd_fc_col(lane, i);
                        const int64_t key = kw + fsd_fc_row(lane, i), t = q0 + qi;
                        const real p = key < T && t < T && (!causal || key <= t)
                                           ? exp2f(st[f].x[i] * sl - s.L[qi])
                                           : 0;
                        st[f].x[i] = p;
                        dpt[f].x[i] = p * (dpt[f].x[i] - s.D[qi]);
                    }
                attn_mma_apply(adv, fsd_fa_from_fc(st[0], st[1]), s.Y + 16 * c * FSD_ATTN_MLD,
                               n, lane);
                attn_mma_apply(adk, fsd_fa_from_fc(dpt[0], dpt[1]), s.X + 16 * c * FSD_ATTN_MLD,
                               n, lane);
            }
        }
    const int64_t at = b * T * ldk + g * hd;
    attn_mma_store(dk + at, ldk, kw, T, n, lane, adk, scale, acc_k);
    attn_mma_store(dv + at, ldk, kw, T, n, lane, adv, 1, acc_v);
}
FSD_BLOCK_KERNEL(attention_bwd_dkv_mma, FSD_ATTN_MMA_BWD_SMEM,
                 (act *dk, bool acc_k, act *dv, bool acc_v, const act *dout, const act *q,
                  const act *k, const act *v, const act *out, const real *lse, int64_t T,
                  int64_t H, int64_t KV, int64_t hd, bool causal),
                 (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal))

/* dq of tile blk = (⌈T/64⌉ − 1 − query tile)·B·H + b·H + h: the last
 * query tiles, which walk the most key tiles when causal, first. */
DEVICE void attention_bwd_dq_mma_block(int64_t blk, int tid, real *smem, act *dq, bool acc,
                                       const act *dout, const act *q, const act *k,
                                       const act *v, const act *out, const real *lse, int64_t B,
                                       int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    const int64_t nt = (T + FSD_ATTN_MB - 1) / FSD_ATTN_MB;
    const int64_t q0 = (nt - 1 - blk / (B * H)) * FSD_ATTN_MB, h = blk % H, b = blk / H % B;
    const int64_t g = h * KV / H, ldq = H * hd, ldk = KV * hd;
    const int lane = tid % 32, w = tid / 32, n = (int)hd;
    const real scale = 1 / fsd_sqrt((real)hd), sl = scale * FSD_ATTN_LOG2E;
    const int64_t tw = q0 + 16 * w;   /* the warp's first query */
    AttnMmaTiles s = attn_mma_tiles(smem);
    /* the block's Q and dO into the warps' A fragments, lse and D of the
     * lane's rows into registers */
    attn_mma_load_tile(s.X, q + b * T * ldq + h * hd, ldq, q0, T, n, tid);
    attn_mma_load_tile(s.Y, dout + b * T * ldq + h * hd, ldq, q0, T, n, tid);
    fsd_block_sync();
    attn_mma_query_stats(s, s.Y, out, lse, b, h, q0, T, H, n, tid);
    fsd_block_sync();
    fsd_fa fq[FSD_ATTN_MK], fo[FSD_ATTN_MK];
    FSD_ATTN_UNROLL
    for (int kk = 0; kk < FSD_ATTN_MK; kk++)
        if (16 * kk < n) {
            fq[kk] = fsd_load_a(s.X + 16 * w * FSD_ATTN_MLD + 16 * kk, FSD_ATTN_MLD, lane);
            fo[kk] = fsd_load_a(s.Y + 16 * w * FSD_ATTN_MLD + 16 * kk, FSD_ATTN_MLD, lane);
        }
    real L[4], D[4];
    for (int i = 0; i < 4; i++) {
        L[i] = s.L[16 * w + fsd_fc_row(lane, i)];
        D[i] = s.D[16 * w + fsd_fc_row(lane, i)];
    }
    fsd_fc adq[FSD_ATTN_MN];
    FSD_ATTN_UNROLL
    for (int j = 0; j < FSD_ATTN_MN; j++)
        adq[j] = fsd_fc_zero();
    const int64_t kend = causal && q0 + FSD_ATTN_MB < T ? q0 + FSD_ATTN_MB : T;
    const act *K = k + b * T * ldk + g * hd, *V = v + b * T * ldk + g * hd;
    for (int64_t k0 = 0; k0 < kend; k0 += FSD_ATTN_MB) {
        fsd_block_sync();   /* Q and dO (or the last tile's K and V) have been read */
        attn_mma_load_tile(s.X, K, ldk, k0, T, n, tid);
        attn_mma_load_tile(s.Y, V, ldk, k0, T, n, tid);
        fsd_block_sync();
        for (int c = 0; c < FSD_ATTN_MB / 16 && k0 + 16 * c < kend; c++) {
            /* S and dP: the warp's 16 queries × keys k0 + 16c + (0..15) */
            fsd_fc st[2], dp[2];
            attn_mma_scores(st, fq, s.X + 16 * c * FSD_ATTN_MLD, n, lane);
            attn_mma_scores(dp, fo, s.Y + 16 * c * FSD_ATTN_MLD, n, lane);
            for (int f = 0; f < 2; f++)
                for (int i = 0; i < 4; i++) {
                    const int64_t t = tw + fsd_fc_row(lane, i);
                    const int64_t key = k0 + 16 * c + 8 * f + fsd_fc_col(lane, i);
                    const real p = key < T && t < T && (!causal || key <= t)
                                       ? exp2f(st[f].x[i] * sl - L[i])
                                       : 0;
                    dp[f].x[i] = p * (dp[f].x[i] - D[i]);
                }
            attn_mma_apply(adq, fsd_fa_from_fc(dp[0], dp[1]), s.X + 16 * c * FSD_ATTN_MLD, n,
                           lane);
        }
    }
    attn_mma_store(dq + b * T * ldq + h * hd, ldq, tw, T, n, lane, adq, scale, acc);
}
FSD_BLOCK_KERNEL(attention_bwd_dq_mma, FSD_ATTN_MMA_BWD_SMEM,
                 (act *dq, bool acc, const act *dout, const act *q, const act *k,
                  const act *v, const act *out, const real *lse, int64_t B, int64_t T,
                  int64_t H, int64_t KV, int64_t hd, bool causal),
                 (dq, acc, dout, q, k, v, out, lse, B, T, H, KV, hd, causal))
#endif /* FSD_MMA */

#ifdef FSD_MMA
/* ── the forward on tensor cores (bf16 act, sm_80+) ──
 *
 * FlashAttention-2's forward, with the backward's tiles and helpers
 * (above): a block per (b, h, 64 query rows), warp w rows 16w..16w + 15
 * with their Q as A fragments (registers; through shared memory once).
 * The block walks the key tiles of 64, up to the diagonal when causal,
 * K and V staged in shared memory as stored (bf16, zeros past T):
 *   S = Q·Kᵀ         four chunks of 16 keys (attn_mma_scores);
 *   mask, softmax    on the C fragments, where a lane holds two rows (g
 *                    and g + 8) of its warp: the row max over the tile by
 *                    fsd_quad_max over the quad of lanes that share the
 *                    row, the running max m (base 2: scores times
 *                    scale·log₂e, one multiply, and exp2, the GPU's ex2),
 *                    O and the lane's share of the row sum l rescaled by
 *                    2^(m_old − m) when m grows;
 *   O += P·V         P rounded to bf16 as A fragments (fsd_fa_from_fc,
 *                    FlashAttention-2's register reuse), attn_mma_apply;
 *                    chunks wholly past the block's last key skipped by
 *                    the whole block.
 * l is summed from the fp32 p (over the quad at the end); P's rounding for
 * its product is the one departure from the fp32 arithmetic of the tiled
 * kernel (tests/kernels bounds it). out = O / l, rounded once, and
 * lse = m·ln 2 + log l, as the other versions write them. Shared memory:
 * the K and V tiles (Q goes through K's), 34 KiB at FSD_ATTN_HD_MAX 128
 * and 18 KiB at 64. */
#define FSD_ATTN_MMA_FWD_SMEM (2 * FSD_ATTN_MB * FSD_ATTN_MLD * (int)sizeof(act) / (int)sizeof(real))
#define FSD_ATTN_LN2 0.6931471805599453f

/* Forward of tile blk = (b·H + h)·⌈T/64⌉ + query tile. */
DEVICE void attention_fwd_mma_block(int64_t blk, int tid, real *smem, act *out, real *lse,
                                    const act *q, const act *k, const act *v, int64_t T,
                                    int64_t H, int64_t KV, int64_t hd, bool causal)
{
    const int64_t nt = (T + FSD_ATTN_MB - 1) / FSD_ATTN_MB;
    const int64_t q0 = blk % nt * FSD_ATTN_MB, h = blk / nt % H, b = blk / (nt * H);
    const int64_t g = h * KV / H, ldq = H * hd, ldk = KV * hd;
    const int lane = tid % 32, w = tid / 32, n = (int)hd;
    const real sl = FSD_ATTN_LOG2E / fsd_sqrt((real)hd);   /* scale·log₂e */
    const int64_t tw = q0 + 16 * w;   /* the warp's first query */
    act *sK = (act *)smem, *sV = sK + FSD_ATTN_MB * FSD_ATTN_MLD;
    attn_mma_load_tile(sK, q + b * T * ldq + h * hd, ldq, q0, T, n, tid);
    fsd_block_sync();
    fsd_fa fq[FSD_ATTN_MK];
    FSD_ATTN_UNROLL
    for (int kk = 0; kk < FSD_ATTN_MK; kk++)
        if (16 * kk < n)
            fq[kk] = fsd_load_a(sK + 16 * w * FSD_ATTN_MLD + 16 * kk, FSD_ATTN_MLD, lane);
    /* the lane's rows tw + g and tw + g + 8 (fragment elements i / 2 = 0, 1):
     * running max (base 2) and the lane's share of the sum */
    real m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
    fsd_fc o[FSD_ATTN_MN];
    FSD_ATTN_UNROLL
    for (int j = 0; j < FSD_ATTN_MN; j++)
        o[j] = fsd_fc_zero();
    /* the first tile holds key 0, which every row sees (rows past T too):
     * m is finite from then on, and 2^(m_old − m) is 0 the first time */
    const int64_t kend = causal && q0 + FSD_ATTN_MB < T ? q0 + FSD_ATTN_MB : T;
    const act *K = k + b * T * ldk + g * hd, *V = v + b * T * ldk + g * hd;
    for (int64_t k0 = 0; k0 < kend; k0 += FSD_ATTN_MB) {
        /* chunks of 16 keys holding a key below kend: the same in every warp */
        const int nc = kend - k0 >= FSD_ATTN_MB ? FSD_ATTN_MB / 16 : (int)(kend - k0 + 15) / 16;
        fsd_block_sync();   /* Q (or the last tile's K and V) has been read */
        attn_mma_load_tile(sK, K, ldk, k0, T, n, tid);
        attn_mma_load_tile(sV, V, ldk, k0, T, n, tid);
        fsd_block_sync();
        /* the mask in 32-bit offsets into the tile: key k0 + kc is seen by
         * query tw + qr when kc < kn, and when causal kc ≤ diag + qr */
        const int kn = T - k0 < FSD_ATTN_MB ? (int)(T - k0) : FSD_ATTN_MB;
        const int diag = !causal ? FSD_ATTN_MB : tw - k0 < FSD_ATTN_MB ? (int)(tw - k0) : FSD_ATTN_MB;
        fsd_fc st[FSD_ATTN_MB / 16][2];
        real mx[2] = {-INFINITY, -INFINITY};
        FSD_ATTN_UNROLL
        for (int c = 0; c < FSD_ATTN_MB / 16; c++) {
            /* all four chunks (zeros past T, masked): skipping those past
             * kend here costs a register spill at hd 128 on sm_90 */
            attn_mma_scores(st[c], fq, sK + 16 * c * FSD_ATTN_MLD, n, lane);
            FSD_ATTN_UNROLL
            for (int f = 0; f < 2; f++)
                FSD_ATTN_UNROLL
                for (int i = 0; i < 4; i++) {
                    const int kc = 16 * c + 8 * f + fsd_fc_col(lane, i);
                    const real z =
                        kc < kn && kc <= diag + fsd_fc_row(lane, i) ? st[c][f].x[i] * sl : -INFINITY;
                    st[c][f].x[i] = z;
                    mx[i / 2] = fsd_fmax(mx[i / 2], z);
                }
        }
        real corr[2];
        FSD_ATTN_UNROLL
        for (int r = 0; r < 2; r++) {
            const real mnew = fsd_fmax(m[r], fsd_quad_max(mx[r]));
            corr[r] = exp2f(m[r] - mnew);
            m[r] = mnew;
            l[r] *= corr[r];
        }
        FSD_ATTN_UNROLL
        for (int j = 0; j < FSD_ATTN_MN; j++)
            FSD_ATTN_UNROLL
            for (int i = 0; i < 4; i++)
                o[j].x[i] *= corr[i / 2];
        FSD_ATTN_UNROLL
        for (int c = 0; c < FSD_ATTN_MB / 16; c++) {
            if (c >= nc)
                break;
            FSD_ATTN_UNROLL
            for (int f = 0; f < 2; f++)
                FSD_ATTN_UNROLL
                for (int i = 0; i < 4; i++) {
                    const real p = exp2f(st[c][f].x[i] - m[i / 2]);   /* 0 where masked */
                    st[c][f].x[i] = p;
                    l[i / 2] += p;
                }
            attn_mma_apply(o, fsd_fa_from_fc(st[c][0], st[c][1]), sV + 16 * c * FSD_ATTN_MLD, n,
                           lane);
        }
    }
    real inv[2];
    FSD_ATTN_UNROLL
    for (int r = 0; r < 2; r++) {
        l[r] = fsd_quad_sum(l[r]);
        inv[r] = 1 / l[r];
    }
    act *O = out + b * T * ldq + h * hd;
    FSD_ATTN_UNROLL
    for (int j = 0; j < FSD_ATTN_MN; j++) {
        if (8 * j >= n)
            break;
        FSD_ATTN_UNROLL
        for (int i = 0; i < 4; i++) {
            const int64_t t = tw + fsd_fc_row(lane, i);
            if (t < T)
                O[t * ldq + 8 * j + fsd_fc_col(lane, i)] = fsd_narrow(o[j].x[i] * inv[i / 2]);
        }
    }
    FSD_ATTN_UNROLL
    for (int r = 0; r < 2; r++) {
        const int64_t t = tw + lane / 4 + 8 * r;
        if (lane % 4 == 0 && t < T)
            lse[(b * H + h) * T + t] = m[r] * FSD_ATTN_LN2 + fsd_log(l[r]);
    }
}
FSD_BLOCK_KERNEL(attention_fwd_mma, FSD_ATTN_MMA_FWD_SMEM,
                 (act *out, real *lse, const act *q, const act *k, const act *v, int64_t T,
                  int64_t H, int64_t KV, int64_t hd, bool causal),
                 (out, lse, q, k, v, T, H, KV, hd, causal))
#endif /* FSD_MMA */
#endif
#endif /* FSD_ATTENTION_MMA_H */
