/*
 * attention_cpu.h — attention on the CPU: query blocks through BLAS
 * (FSD_ATTENTION_BLAS), part of the attention family (attention.h, whose
 * launchers call attention_fwd_blas and attention_bwd_blas). Needs
 * portable.h; compiles nothing on the GPU, in the warp emulation or with
 * FSD_ATTENTION_PORTABLE.
 *
 * The CPU build uses a blocked version (FSD_ATTENTION_BLAS):
 * one scalar lane per query row leaves a CPU core's vector units idle and,
 * in the backward, recomputes every probability twice. Blocks of
 * FSD_ATTN_QB query rows go through BLAS (fsdrt_blas_gemm, the runtime's
 * library, what fsdrt_gemm calls too) as small matrix products: S = scale·Q·Kᵀ over the
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
#ifndef FSD_ATTENTION_CPU_H
#define FSD_ATTENTION_CPU_H
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

#if !defined(__CUDACC__) && !defined(FSD_WARP_EMULATION) && !defined(FSD_ATTENTION_PORTABLE)
/* ── the CPU path: query blocks through BLAS ── */
#define FSD_ATTENTION_BLAS 1
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
        fsdrt_blas_gemm(false, false, m, kc, hd, alpha, A, hd, BT + k0, ldb, 0, S + k0, lds);
    }
}

/* C [m, hd] (+)= P [m, nk] · X [nk, hd], the slabs summed in key order */
FSD_ATTN_INLINE void fsd_attn_apply(int64_t m, int64_t nk, int64_t hd, const real *P, int64_t ldp,
                                    const real *X, bool acc, real *C, int64_t ldc)
{
    for (int64_t k0 = 0; k0 < nk; k0 += FSD_ATTN_KC) {
        int64_t kc = nk - k0 < FSD_ATTN_KC ? nk - k0 : FSD_ATTN_KC;
        fsdrt_blas_gemm(false, false, m, hd, kc, 1, P + k0, ldp, X + k0 * hd, hd,
                      acc || k0 > 0 ? 1 : 0, C, ldc);
    }
}

/* C [nk, hd] += Pᵀ · X, P [m, nk], X [m, hd] */
FSD_ATTN_INLINE void fsd_attn_apply_t(int64_t m, int64_t nk, int64_t hd, const real *P,
                                      int64_t ldp, const real *X, real *C)
{
    for (int64_t k0 = 0; k0 < nk; k0 += FSD_ATTN_KC) {
        int64_t kc = nk - k0 < FSD_ATTN_KC ? nk - k0 : FSD_ATTN_KC;
        fsdrt_blas_gemm(true, false, kc, hd, m, 1, P + k0, ldp, X, hd, 1, C + k0 * hd, hd);
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

/* How far a causal row's exponentials run: its n visible keys rounded up
 * to whole cache lines of reals (at most nk, the scores the block's
 * product formed). A loop to n ends in up to 15 scalar iterations of the
 * exponential, which cost tiny's (T 64) forward 13 %; past n the values
 * are masked keys' scores, finite or not, and the zeros written after
 * replace them, so the visible keys get the same bits either way. */
FSD_ATTN_INLINE int64_t fsd_attn_whole(int64_t n, int64_t nk)
{
    const int64_t line = 64 / (int64_t)sizeof(real);
    int64_t w = (n + line - 1) / line * line;
    return w < nk ? w : nk;
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
            const int64_t w = fsd_attn_whole(n, nk);
            FSD_SIMD
            for (int64_t s = 0; s < w; s++)
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
    /* small ops on one thread: B·H·T²·hd multiply-adds (QKᵀ and PV, causal
     * or not) against FSD_PAR_MIN_MACS (runtime/fsdrt.h) */
#pragma omp parallel if (B * H * T * T * hd >= FSD_PAR_MIN_MACS)
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
                const int64_t w = fsd_attn_whole(n, nk);
                FSD_SIMD
                for (int64_t s = 0; s < w; s++) {
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
    /* on one thread below FSD_PAR_MIN_MACS, as the forward */
#pragma omp parallel if (B * H * T * T * hd >= FSD_PAR_MIN_MACS)
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
#endif /* FSD_ATTENTION_CPU_H */
