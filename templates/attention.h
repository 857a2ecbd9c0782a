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
 * Three versions, one per kind of machine:
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
 *
 * The GPU's tiled kernels (FlashAttention-style, below the row kernels):
 * blocks of 128 threads on tiles of queries and keys staged in shared
 * memory, an online softmax, fp32 FMAs; the backward in two deterministic
 * kernels (dk and dv by key tile, dq by query tile), no atomics. The warp
 * emulation of the tests runs them on the CPU (tests/kernels).
 *
 * With bf16 act the GPU runs tensor-core versions of them instead (mma.h:
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
 *
 * The CPU build uses a blocked version instead (FSD_ATTENTION_BLAS, below):
 * one scalar lane per query row leaves a CPU core's vector units idle and,
 * in the backward, recomputes every probability twice. Blocks of
 * FSD_ATTN_QB query rows go through BLAS (cblas_sgemm/dgemm, what
 * fsdrt_gemm calls too) as small matrix products: S = scale·Q·Kᵀ over the
 * keys the block sees, the softmax row by row, O = P·V; the backward
 * recomputes P once per block and forms dP = dO·Vᵀ, dS = P∘(dP − D),
 * dQ = scale·dS·K, dK += scale·dSᵀ·Q, dV += Pᵀ·dO. The operands of a
 * head are first copied to contiguous rows, K and V also transposed, so
 * that Q·Kᵀ and dO·Vᵀ are plain products (BLAS's small-matrix kernels are
 * slower on rows H·hd apart, and on the transposed form). Work items are
 * (b, h) in the forward (split into ranges of query blocks when there are
 * fewer than two per thread) and (b, kv head g) in the backward, where one
 * worker walks every query head of g and every query block in a fixed
 * order, summing dK and dV in its scratch, so they are summed in one order
 * whatever the thread count: deterministic, no atomics. BLAS works in
 * real: the copies widen act, and with bf16 act a block's O (or dQ) is
 * formed in scratch and rounded into the tensor once, where with act =
 * real BLAS writes it in place. Scratch per thread, in one buffer kept
 * from launch to launch, with t = T rounded up to an odd number of cache
 * lines: (2·T + FSD_ATTN_QB)·hd + (hd + FSD_ATTN_QB)·t reals in the forward,
 * (3·T + 2·FSD_ATTN_QB)·hd + 2·(hd + FSD_ATTN_QB)·t in the backward, and
 * FSD_ATTN_QB·hd more in each with bf16 act; the backward's D = dO·O of
 * every query row, B·H·T reals, is computed first, in memory order. Define FSD_ATTENTION_PORTABLE
 * to run the portable kernel on the CPU instead.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
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

#if defined(__CUDACC__) || defined(FSD_BLOCK_EMULATION)
/* ── the GPU path: tiles in shared memory, FlashAttention-style ──
 *
 * Block kernels (portable.h): one block of FSD_BLOCK = 128 threads per
 * tile, its operands widened into shared memory, plain fp32 FMAs (no tensor
 * cores, no mma). Head dims up to FSD_ATTN_HD_MAX; the launchers run the
 * row kernels above for larger ones.
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
/* bf16 programs take the tensor-core kernels (mma.h, FSD_MMA) */
#if defined(FSD_ACT_IS_BF16) && !defined(FSD_MMA_H)
#include "mma.h"
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

#ifdef FSD_MMA
/* ── the backward on tensor cores (bf16 act, sm_80+) ──
 *
 * The same two deterministic kernels as the tiled backward above, with
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

#if !defined(__CUDACC__) && !defined(FSD_WARP_EMULATION) && !defined(FSD_ATTENTION_PORTABLE)
/* ── the CPU path: query blocks through BLAS ── */
#define FSD_ATTENTION_BLAS 1
#include <cblas.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#ifndef FSD_ATTN_QB
#define FSD_ATTN_QB 64   /* query rows per block: products big enough for BLAS */
#endif

/* The helpers below are inlined into attention_fwd_blas / attention_bwd_blas,
 * which are compiled like the launchers, once per instruction set (portable.h's
 * LAUNCHER): an out-of-line helper, or an OpenMP region outlined from a plain
 * function, would be compiled once, for SSE2, and the softmax loops would run
 * at a quarter of the vector width. */
#define FSD_ATTN_INLINE static inline __attribute__((always_inline, unused))
#define FSD_ATTN_CLONED LAUNCHER   /* not a launcher: the kernel's OpenMP region */

/* C[M, N] = alpha·op(A)·op(B) + beta·C, row-major, one single-threaded
 * call from this worker (beta 0 never reads C) */
FSD_ATTN_INLINE void fsd_attn_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, real alpha,
                                   const real *A, int64_t lda, const real *B, int64_t ldb,
                                   real beta, real *C, int64_t ldc)
{
#ifdef FSD_FLOAT64
    cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
#else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
#endif
}

/* The products below run by slabs of at most FSD_ATTN_KC keys: OpenBLAS
 * (0.3.21, SkylakeX) takes small products through its small-matrix kernels
 * (64·128·64 multiply-adds did, 64·256·64 did not) and larger ones through
 * its general path, which copies its operands first and ran these shapes
 * ~1.4x slower. */
#ifndef FSD_ATTN_KC
#define FSD_ATTN_KC 128
#endif

/* S [m, nk] = alpha·A [m, hd] · BT [hd, nk] (BT's rows ldb apart) */
FSD_ATTN_INLINE void fsd_attn_scores(int64_t m, int64_t nk, int64_t hd, real alpha, const real *A,
                                     const real *BT, int64_t ldb, real *S, int64_t lds)
{
    for (int64_t k0 = 0; k0 < nk; k0 += FSD_ATTN_KC) {
        int64_t kc = nk - k0 < FSD_ATTN_KC ? nk - k0 : FSD_ATTN_KC;
        fsd_attn_gemm(false, false, m, kc, hd, alpha, A, hd, BT + k0, ldb, 0, S + k0, lds);
    }
}

/* C [m, hd] (+)= P [m, nk] · X [nk, hd], the slabs summed in key order */
FSD_ATTN_INLINE void fsd_attn_apply(int64_t m, int64_t nk, int64_t hd, const real *P, int64_t ldp,
                                    const real *X, bool acc, real *C, int64_t ldc)
{
    for (int64_t k0 = 0; k0 < nk; k0 += FSD_ATTN_KC) {
        int64_t kc = nk - k0 < FSD_ATTN_KC ? nk - k0 : FSD_ATTN_KC;
        fsd_attn_gemm(false, false, m, hd, kc, 1, P + k0, ldp, X + k0 * hd, hd,
                      acc || k0 > 0 ? 1 : 0, C, ldc);
    }
}

/* C [nk, hd] += Pᵀ · X, P [m, nk], X [m, hd] */
FSD_ATTN_INLINE void fsd_attn_apply_t(int64_t m, int64_t nk, int64_t hd, const real *P,
                                      int64_t ldp, const real *X, real *C)
{
    for (int64_t k0 = 0; k0 < nk; k0 += FSD_ATTN_KC) {
        int64_t kc = nk - k0 < FSD_ATTN_KC ? nk - k0 : FSD_ATTN_KC;
        fsd_attn_gemm(true, false, kc, hd, m, 1, P + k0, ldp, X, hd, 1, C + k0 * hd, hd);
    }
}

/* The CPU path's scratch: one buffer kept from launch to launch, grown
 * when a launch needs more, cut into one part per thread. A malloc per
 * launch of this size (half a MiB per thread at gpt6x384's shapes) is an
 * mmap, and its pages fault in again every call. Launches run one at a
 * time, on the host thread that runs the kernels. */
static real *fsd_attn_ws;
static int64_t fsd_attn_ws_n;

/* *shared reals for all the threads, then nt parts of *per reals, both
 * rounded up to whole cache lines: thread i's part is at *shared + i·*per */
static inline real *fsd_attn_scratch(int64_t *shared, int64_t *per, int nt)
{
    const int64_t line = 64 / (int64_t)sizeof(real);
    *shared = (*shared + line - 1) / line * line;
    *per = (*per + line - 1) / line * line;
    int64_t n = *shared + *per * nt;
    if (n > fsd_attn_ws_n) {
        free(fsd_attn_ws);
        fsd_attn_ws = (real *)aligned_alloc(64, sizeof(real) * (size_t)n);
        if (!fsd_attn_ws) {
            fsd_attn_ws_n = 0;
            fsd_kernel_fail("attention", "out of memory for the CPU path's scratch");
        }
        fsd_attn_ws_n = n;
    }
    return fsd_attn_ws;
}

FSD_ATTN_INLINE int fsd_attn_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

FSD_ATTN_INLINE int fsd_attn_thread(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* rows [n, hd] of a head, ld apart in q/k/v's layout, into dst [n, hd],
 * widened: BLAS's small-matrix kernels run the products of one head about
 * 1.5x faster on contiguous operands than on rows H·hd apart */
FSD_ATTN_INLINE void fsd_attn_pack(real *dst, const act *src, int64_t n, int64_t ld, int64_t hd)
{
    for (int64_t r = 0; r < n; r++)
        FSD_SIMD
        for (int64_t d = 0; d < hd; d++)
            dst[r * hd + d] = fsd_wide(src[r * ld + d]);
}

/* Packed rows src [n, hd] (fsd_attn_pack's) transposed, dst [hd, ldt]:
 * Q·Kᵀ as Q times a copied Kᵀ is a plain (NN) product, which OpenBLAS's
 * small-matrix kernels run about 1.5x faster than the NT one. From the
 * packed copy, not from the tensor: read a column at a time, the tensor's
 * rows H·hd apart missed the cache on every row, where the packed rows of
 * 16 at a time stay in L1 (and the packing streams whole rows). */
FSD_ATTN_INLINE void fsd_attn_transpose(real *dst, int64_t ldt, const real *src, int64_t n,
                                        int64_t hd)
{
    for (int64_t r0 = 0; r0 < n; r0 += 16) {
        int64_t r1 = r0 + 16 < n ? r0 + 16 : n;
        for (int64_t d = 0; d < hd; d++)
            for (int64_t r = r0; r < r1; r++)
                dst[d * ldt + r] = src[r * hd + d];
    }
}

/* A row stride of at least n reals and an odd number of cache lines, so
 * that the rows of a block fall in different cache sets (a power-of-two
 * stride such as T = 256 puts them all in a few) */
FSD_ATTN_INLINE int64_t fsd_attn_ld(int64_t n)
{
    const int64_t line = 64 / (int64_t)sizeof(real);
    return ((n + line - 1) / line | 1) * line;
}

/* Max, sum and dot product of a row, with 8 partial results combined in a
 * fixed order: 8 independent chains instead of one keep the core busy (a
 * single running sum waits on each add), and the order depends on n alone,
 * not on the thread count or the vector width. */
#define FSD_ATTN_ACC 8
FSD_ATTN_INLINE real fsd_attn_max(const real *z, int64_t n)
{
    real p[FSD_ATTN_ACC];
    int64_t s = 0;
    for (int k = 0; k < FSD_ATTN_ACC; k++)
        p[k] = z[0];
    for (; s + FSD_ATTN_ACC <= n; s += FSD_ATTN_ACC)
        for (int k = 0; k < FSD_ATTN_ACC; k++)
            p[k] = z[s + k] > p[k] ? z[s + k] : p[k];
    for (; s < n; s++)
        p[0] = z[s] > p[0] ? z[s] : p[0];
    real m = p[0];
    for (int k = 1; k < FSD_ATTN_ACC; k++)
        m = p[k] > m ? p[k] : m;
    return m;
}

FSD_ATTN_INLINE real fsd_attn_sum(const real *a, int64_t n)
{
    real p[FSD_ATTN_ACC] = {0};
    int64_t s = 0;
    for (; s + FSD_ATTN_ACC <= n; s += FSD_ATTN_ACC)
        for (int k = 0; k < FSD_ATTN_ACC; k++)
            p[k] += a[s + k];
    for (; s < n; s++)
        p[0] += a[s];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

FSD_ATTN_INLINE real fsd_attn_dot(const real *a, const act *b, int64_t n)
{
    real p[FSD_ATTN_ACC] = {0};
    int64_t s = 0;
    for (; s + FSD_ATTN_ACC <= n; s += FSD_ATTN_ACC)
        for (int k = 0; k < FSD_ATTN_ACC; k++)
            p[k] += a[s + k] * fsd_wide(b[s + k]);
    for (; s < n; s++)
        p[0] += a[s] * fsd_wide(b[s]);
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* BLAS writes real: with act = real a block's O (forward) or dQ
 * (backward) is formed in the tensor itself, as it always was; with bf16
 * act in FSD_ATTN_OUT_ROWS rows of float scratch [rows, hd], then rounded
 * into the tensor once per element. */
#ifdef FSD_ACT_IS_BF16
#define FSD_ATTN_OUT_ROWS FSD_ATTN_QB
#else
#define FSD_ATTN_OUT_ROWS 0
#endif

/* Scratch of one forward worker: Kᵀ of a head [hd, ldt], V [T, hd], Q of
 * a block [FSD_ATTN_QB, hd], scores S [FSD_ATTN_QB, ldt], the block's O
 * [FSD_ATTN_OUT_ROWS, hd], K packed before its transpose [T, hd];
 * ldt = fsd_attn_ld(T). */
#define FSD_ATTN_FWD_SCRATCH(T, hd, ldt) \
    ((hd) * (ldt) + (2 * (T) + FSD_ATTN_QB + FSD_ATTN_OUT_ROWS) * (hd) + FSD_ATTN_QB * (ldt))

/* Forward of query blocks [qb0, qb1) of head h of sequence b, one block at
 * a time. Row t sees keys [0, t] (causal) or all T; a block of rows
 * [q0, q0 + nq) sees keys [0, q0 + nq), so only the diagonal tile computes
 * scores it masks. */
FSD_ATTN_INLINE void attention_fwd_head(real *ws, act *out, real *lse, const act *q,
                                        const act *k, const act *v, int64_t b, int64_t h,
                                        int64_t qb0, int64_t qb1, int64_t T, int64_t H, int64_t KV,
                                        int64_t hd, bool causal)
{
    int64_t g = h * KV / H, ldq = H * hd, ldk = KV * hd;
    int64_t ldt = fsd_attn_ld(T), q1 = qb1 * FSD_ATTN_QB < T ? qb1 * FSD_ATTN_QB : T;
    int64_t keys = causal ? q1 : T;   /* the keys these blocks see */
    real *KT = ws, *Vc = KT + hd * ldt, *Qc = Vc + T * hd, *S = Qc + FSD_ATTN_QB * hd;
    real *Kc = S + FSD_ATTN_QB * ldt + FSD_ATTN_OUT_ROWS * hd;
    real scale = 1 / fsd_sqrt((real)hd);
    fsd_attn_pack(Kc, k + b * T * ldk + g * hd, keys, ldk, hd);
    fsd_attn_transpose(KT, ldt, Kc, keys, hd);
    fsd_attn_pack(Vc, v + b * T * ldk + g * hd, keys, ldk, hd);
    for (int64_t q0 = qb0 * FSD_ATTN_QB; q0 < q1; q0 += FSD_ATTN_QB) {
        int64_t nq = T - q0 < FSD_ATTN_QB ? T - q0 : FSD_ATTN_QB, nk = causal ? q0 + nq : T;
        int64_t lds = fsd_attn_ld(nk);
        real inv[FSD_ATTN_QB];
        fsd_attn_pack(Qc, q + (b * T + q0) * ldq + h * hd, nq, ldq, hd);
        fsd_attn_scores(nq, nk, hd, scale, Qc, KT, ldt, S, lds);
        for (int64_t i = 0; i < nq; i++) {
            real *z = S + i * lds;
            int64_t t = q0 + i, n = causal ? t + 1 : T;
            real m = fsd_attn_max(z, n);
            FSD_SIMD
            for (int64_t s = 0; s < n; s++)
                z[s] = fsd_exp(z[s] - m);
            for (int64_t s = n; s < nk; s++)
                z[s] = 0;
            real l = fsd_attn_sum(z, n);
            inv[i] = 1 / l;
            lse[(b * H + h) * T + t] = m + fsd_log(l);
        }
        /* O = P·V with P unnormalised, then each row divided by its sum, as
         * the portable kernel does: nq·hd multiplications rather than nq·nk;
         * Ob is where BLAS forms O (FSD_ATTN_OUT_ROWS) */
        act *O = out + (b * T + q0) * ldq + h * hd;
#ifdef FSD_ACT_IS_BF16
        real *Ob = S + FSD_ATTN_QB * ldt;
        const int64_t ldo = hd;
#else
        real *Ob = O;
        const int64_t ldo = ldq;
#endif
        fsd_attn_apply(nq, nk, hd, S, lds, Vc, false, Ob, ldo);
        for (int64_t i = 0; i < nq; i++)
            FSD_SIMD
            for (int64_t d = 0; d < hd; d++)
                O[i * ldq + d] = fsd_narrow(Ob[i * ldo + d] * inv[i]);
    }
}

FSD_ATTN_CLONED void attention_fwd_blas(act *out, real *lse, const act *q, const act *k,
                                        const act *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                                        int64_t hd, bool causal)
{
    /* item = (b, h, a range of query blocks), each writing rows only it
     * owns: whole heads (K and V copied once per head) when there are
     * enough of them to keep the threads busy, else each head split into
     * up to nb ranges; later blocks see more keys, so items are handed out
     * dynamically */
    const int64_t nb = (T + FSD_ATTN_QB - 1) / FSD_ATTN_QB;
    int64_t per = nb;
#ifdef _OPENMP
    const int64_t want = 2 * (int64_t)omp_get_max_threads();
    if (B * H < want) {
        int64_t parts = (want + B * H - 1) / (B * H);
        per = (nb + parts - 1) / parts;
    }
#endif
    const int64_t parts = (nb + per - 1) / per;
    int64_t shared = 0, part = FSD_ATTN_FWD_SCRATCH(T, hd, fsd_attn_ld(T));
    real *scratch = fsd_attn_scratch(&shared, &part, fsd_attn_threads());
#pragma omp parallel
    {
        real *ws = scratch + fsd_attn_thread() * part;
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < B * H * parts; it++) {
            int64_t p = it % parts, qb1 = (p + 1) * per < nb ? (p + 1) * per : nb;
            attention_fwd_head(ws, out, lse, q, k, v, it / (H * parts), it / parts % H, p * per,
                               qb1, T, H, KV, hd, causal);
        }
    }
}

/* Scratch of one backward worker: Kᵀ and Vᵀ of a kv head [hd, ldt] each,
 * K, dK, dV [T, hd] each, Q and dO of a block [FSD_ATTN_QB, hd], P and dS
 * [FSD_ATTN_QB, ldt], the block's dQ [FSD_ATTN_OUT_ROWS, hd];
 * ldt = fsd_attn_ld(T). */
#define FSD_ATTN_BWD_SCRATCH(T, hd, ldt)                                              \
    (2 * (hd) * (ldt) + (3 * (T) + 2 * FSD_ATTN_QB + FSD_ATTN_OUT_ROWS) * (hd) +      \
     2 * FSD_ATTN_QB * (ldt))

/* Backward of kv head g of sequence b: every query head h of g, every
 * query block, in order, summing dK and dV in contiguous scratch that is
 * added to (or stored into) dk and dv once at the end. Dd [B, H, T] holds
 * each query row's D = dO·O (attention_bwd_blas). */
FSD_ATTN_INLINE void attention_bwd_group(real *ws, act *dq, bool acc_q, act *dk, bool acc_k,
                                         act *dv, bool acc_v, const act *dout, const act *q,
                                         const act *k, const act *v, const real *Dd,
                                         const real *lse, int64_t b, int64_t g, int64_t T,
                                         int64_t H, int64_t KV, int64_t hd, bool causal)
{
    int64_t ldq = H * hd, ldk = KV * hd, per = H / KV;
    int64_t ldt = fsd_attn_ld(T);
    real *KT = ws, *VT = KT + hd * ldt, *Kc = VT + hd * ldt, *dKc = Kc + T * hd;
    real *dVc = dKc + T * hd, *Qc = dVc + T * hd, *dOc = Qc + FSD_ATTN_QB * hd;
    real *S = dOc + FSD_ATTN_QB * hd, *dP = S + FSD_ATTN_QB * ldt;
    real scale = 1 / fsd_sqrt((real)hd);
    fsd_attn_pack(Kc, k + b * T * ldk + g * hd, T, ldk, hd);
    fsd_attn_transpose(KT, ldt, Kc, T, hd);
    fsd_attn_pack(dVc, v + b * T * ldk + g * hd, T, ldk, hd);   /* V, before dV's sums */
    fsd_attn_transpose(VT, ldt, dVc, T, hd);
    memset(dKc, 0, sizeof(real) * (size_t)(2 * T * hd));   /* dKc and dVc */
    for (int64_t h = g * per; h < (g + 1) * per; h++)   /* the heads with h·KV/H = g */
        for (int64_t q0 = 0; q0 < T; q0 += FSD_ATTN_QB) {
            int64_t nq = T - q0 < FSD_ATTN_QB ? T - q0 : FSD_ATTN_QB, nk = causal ? q0 + nq : T;
            int64_t at = (b * T + q0) * ldq + h * hd, lds = fsd_attn_ld(nk);
            fsd_attn_pack(Qc, q + at, nq, ldq, hd);
            fsd_attn_pack(dOc, dout + at, nq, ldq, hd);
            /* P = exp(scale·Q·Kᵀ − lse), 0 where masked */
            fsd_attn_scores(nq, nk, hd, scale, Qc, KT, ldt, S, lds);
            fsd_attn_scores(nq, nk, hd, 1, dOc, VT, ldt, dP, lds);
            for (int64_t i = 0; i < nq; i++) {
                int64_t t = q0 + i, n = causal ? t + 1 : T;
                real L = lse[(b * H + h) * T + t];
                real D = Dd[(b * H + h) * T + t];
                real *p = S + i * lds, *ds = dP + i * lds;
                FSD_SIMD
                for (int64_t s = 0; s < n; s++) {
                    p[s] = fsd_exp(p[s] - L);
                    ds[s] = p[s] * (ds[s] - D) * scale;
                }
                for (int64_t s = n; s < nk; s++)
                    p[s] = ds[s] = 0;
            }
#ifdef FSD_ACT_IS_BF16
            /* dQ in scratch (FSD_ATTN_OUT_ROWS), rounded once into dq */
            real *dQb = dP + FSD_ATTN_QB * ldt;
            fsd_attn_apply(nq, nk, hd, dP, lds, Kc, false, dQb, hd);
            for (int64_t i = 0; i < nq; i++)
                FSD_SIMD
                for (int64_t d = 0; d < hd; d++)
                    fsd_store(&dq[at + i * ldq + d], dQb[i * hd + d], acc_q);
#else
            fsd_attn_apply(nq, nk, hd, dP, lds, Kc, acc_q, dq + at, ldq);
#endif
            fsd_attn_apply_t(nq, nk, hd, dP, lds, Qc, dKc);
            fsd_attn_apply_t(nq, nk, hd, S, lds, dOc, dVc);
        }
    act *dK = dk + b * T * ldk + g * hd, *dV = dv + b * T * ldk + g * hd;
    for (int64_t s = 0; s < T; s++) {
        FSD_SIMD
        for (int64_t d = 0; d < hd; d++) {
            fsd_store(&dK[s * ldk + d], dKc[s * hd + d], acc_k);
            fsd_store(&dV[s * ldk + d], dVc[s * hd + d], acc_v);
        }
    }
}

FSD_ATTN_CLONED void attention_bwd_blas(act *dq, bool acc_q, act *dk, bool acc_k, act *dv,
                                        bool acc_v, const act *dout, const act *q, const act *k,
                                        const act *v, const act *out, const real *lse, int64_t B,
                                        int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    /* D = dO·O of every query row first, in one pass over dout and out in
     * memory order: read row by row inside a head's blocks, O's rows are
     * H·hd apart and each one a cache miss */
    int64_t shared = B * H * T, part = FSD_ATTN_BWD_SCRATCH(T, hd, fsd_attn_ld(T));
    real *scratch = fsd_attn_scratch(&shared, &part, fsd_attn_threads());
#pragma omp parallel
    {
        real *ws = scratch + shared + fsd_attn_thread() * part, *row = ws;
#pragma omp for schedule(static)
        for (int64_t bt = 0; bt < B * T; bt++)
            for (int64_t h = 0; h < H; h++) {
                const int64_t at = (bt * H + h) * hd;
                FSD_SIMD
                for (int64_t d = 0; d < hd; d++)
                    row[d] = fsd_wide(dout[at + d]);
                scratch[(bt / T * H + h) * T + bt % T] = fsd_attn_dot(row, out + at, hd);
            }
#pragma omp for schedule(static)
        for (int64_t it = 0; it < B * KV; it++)
            attention_bwd_group(ws, dq, acc_q, dk, acc_k, dv, acc_v, dout, q, k, v, scratch, lse,
                                it / KV, it % KV, T, H, KV, hd, causal);
    }
}
#endif

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
    FSD_RUN_ROWS(attention_fwd, B * H * T, (out, lse, q, k, v, T, H, KV, hd, causal));
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
    FSD_RUN_ROWS(attention_bwd_dq, B * H * T,
                 (dq, acc_q, dout, q, k, v, out, lse, T, H, KV, hd, causal));
    FSD_RUN_ROWS(attention_bwd_dkv, B * KV * T,
                 (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal));
#endif
}
