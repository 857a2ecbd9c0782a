/*
 * attention.h — scaled dot-product attention, causal or not, with
 * grouped-query heads (design section 9). Needs portable.h.
 *
 * Layouts (the outputs of the q, k, v Linears, heads side by side):
 *   q, out [B, T, H·hd]     k, v [B, T, KV·hd]     lse [B, H, T]
 * Query head h reads kv head g(h) = ⌊h·KV/H⌋ (Hugging Face's repeat_kv).
 * For query row (b, h, t), with keys s ≤ t when causal, all s otherwise:
 *   z_s = scale · q[b,t,h,:] · k[b,s,g,:],  scale = 1/√hd
 *   lse[b,h,t] = log Σ_s exp(z_s),  p_s = exp(z_s − lse)
 *   out[b,t,h,:] = Σ_s p_s · v[b,s,g,:]
 *
 * A straightforward version, not FlashAttention: one work item per query
 * row in the forward (an online softmax over the keys, accumulating in the
 * output row itself, so no scratch memory), lanes strided over the head
 * dimension. The backward recomputes p from q, k and lse, in two passes
 * that each own what they write: dq by query row, dk and dv by key row
 * (b, g, s), so nothing is accumulated by two workers and the result is
 * deterministic. This is the GPU's kernel (and the one the warp emulation
 * tests).
 *
 * The CPU build uses a blocked version instead (FSD_ATTENTION_BLAS, below):
 * one scalar lane per query row leaves a CPU core's vector units idle and,
 * in the backward, recomputes every probability twice. Blocks of
 * FSD_ATTN_QB query rows go through BLAS (cblas_sgemm/dgemm, what
 * fsdrt_gemm calls too) as small matrix products: S = scale·Q·Kᵀ over the
 * keys the block sees, the softmax row by row, O = P·V; the backward
 * recomputes P once per block and forms dP = dO·Vᵀ, dS = P∘(dP − D),
 * dQ = scale·dS·K, dK += scale·dSᵀ·Q, dV += Pᵀ·dO. Work items are
 * (b, query block, h) in the forward and (b, kv head g) in the backward,
 * where one worker walks every query head of g and every query block in a
 * fixed order, so dK and dV are summed in one order whatever the thread
 * count: deterministic, no atomics. Scratch: FSD_ATTN_QB·T reals (two
 * such in the backward) per thread, malloc'd per launch. Define
 * FSD_ATTENTION_PORTABLE to run the portable kernel on the CPU instead.
 */
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif

/* a · b over hd elements, summed over the lanes */
DEVICE real attn_dot(int lane, int lanes, const real *a, const real *b, int64_t hd)
{
    real s = 0;
    for (int64_t d = lane; d < hd; d += lanes)
        s += a[d] * b[d];
    return fsd_warp_sum(s);
}

/* Forward of query row `row` = (b·H + h)·T + t, the lse index. */
DEVICE void attention_fwd_row(int64_t row, int lane, int lanes, real *out, real *lse,
                              const real *q, const real *k, const real *v, int64_t T, int64_t H,
                              int64_t KV, int64_t hd, bool causal)
{
    int64_t t = row % T, h = (row / T) % H, b = row / (T * H), g = h * KV / H;
    const real *qr = q + (b * T + t) * H * hd + h * hd;
    real *o = out + (b * T + t) * H * hd + h * hd;
    real scale = 1 / fsd_sqrt((real)hd);
    int64_t nkeys = causal ? t + 1 : T;
    for (int64_t d = lane; d < hd; d += lanes)
        o[d] = 0;
    /* online softmax: m is the running max, l the running Σ exp(z − m),
     * o the running Σ exp(z − m) · v */
    real m = -INFINITY, l = 0;
    for (int64_t s = 0; s < nkeys; s++) {
        const real *kr = k + (b * T + s) * KV * hd + g * hd;
        const real *vr = v + (b * T + s) * KV * hd + g * hd;
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
        for (int64_t d = lane; d < hd; d += lanes)
            o[d] = o[d] * corr + p * vr[d];
    }
    for (int64_t d = lane; d < hd; d += lanes)
        o[d] /= l;
    if (lane == 0)
        lse[row] = m + fsd_log(l);
}
FSD_ROW_KERNEL(attention_fwd,
               (real *out, real *lse, const real *q, const real *k, const real *v, int64_t T,
                int64_t H, int64_t KV, int64_t hd, bool causal),
               (out, lse, q, k, v, T, H, KV, hd, causal))

#if !defined(__CUDACC__) && !defined(FSD_WARP_EMULATION) && !defined(FSD_ATTENTION_PORTABLE)
/* ── the CPU path: query blocks through BLAS ── */
#define FSD_ATTENTION_BLAS 1
#include <cblas.h>
#include <string.h>

#ifndef FSD_ATTN_QB
#define FSD_ATTN_QB 64   /* query rows per block: products big enough for BLAS */
#endif

/* C[M, N] = alpha·op(A)·op(B) + beta·C, row-major, one single-threaded
 * call from this worker (beta 0 never reads C) */
static inline void fsd_attn_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, real alpha,
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

static inline real *fsd_attn_scratch(int64_t n)
{
    real *p = (real *)malloc(sizeof(real) * (size_t)n);
    if (!p)
        fsd_kernel_fail("attention", "out of memory for the CPU path's scratch");
    return p;
}

/* Max, sum and dot product of a row, with 8 partial results combined in a
 * fixed order: 8 independent chains instead of one keep the core busy (a
 * single running sum waits on each add), and the order depends on n alone,
 * not on the thread count or the vector width. */
#define FSD_ATTN_ACC 8
static inline real fsd_attn_max(const real *z, int64_t n)
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

static inline real fsd_attn_sum(const real *a, int64_t n)
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

static inline real fsd_attn_dot(const real *a, const real *b, int64_t n)
{
    real p[FSD_ATTN_ACC] = {0};
    int64_t s = 0;
    for (; s + FSD_ATTN_ACC <= n; s += FSD_ATTN_ACC)
        for (int k = 0; k < FSD_ATTN_ACC; k++)
            p[k] += a[s + k] * b[s + k];
    for (; s < n; s++)
        p[0] += a[s] * b[s];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

/* Forward of query rows [q0, q0 + nq) of head h of sequence b; S is
 * scratch of nq·nk reals. Row t sees keys [0, t] (causal) or all T. */
static inline void attention_fwd_block(real *S, real *out, real *lse, const real *q,
                                       const real *k, const real *v, int64_t b, int64_t h,
                                       int64_t q0, int64_t T, int64_t H, int64_t KV, int64_t hd,
                                       bool causal)
{
    int64_t g = h * KV / H, ldq = H * hd, ldk = KV * hd;
    int64_t nq = T - q0 < FSD_ATTN_QB ? T - q0 : FSD_ATTN_QB, nk = causal ? q0 + nq : T;
    const real *Q = q + (b * T + q0) * ldq + h * hd;
    const real *K = k + b * T * ldk + g * hd, *V = v + b * T * ldk + g * hd;
    real scale = 1 / fsd_sqrt((real)hd);
    real inv[FSD_ATTN_QB];
    fsd_attn_gemm(false, true, nq, nk, hd, scale, Q, ldq, K, ldk, 0, S, nk);
    for (int64_t i = 0; i < nq; i++) {
        real *z = S + i * nk;
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
    /* O = P·V with P unnormalised, then each row divided by its sum, as the
     * portable kernel does: nq·hd multiplications rather than nq·nk */
    real *O = out + (b * T + q0) * ldq + h * hd;
    fsd_attn_gemm(false, false, nq, hd, nk, 1, S, nk, V, ldk, 0, O, ldq);
    for (int64_t i = 0; i < nq; i++)
        FSD_SIMD
        for (int64_t d = 0; d < hd; d++)
            O[i * ldq + d] *= inv[i];
}

static inline void attention_fwd_blas(real *out, real *lse, const real *q, const real *k,
                                      const real *v, int64_t B, int64_t T, int64_t H,
                                      int64_t KV, int64_t hd, bool causal)
{
    const int64_t nb = (T + FSD_ATTN_QB - 1) / FSD_ATTN_QB, items = B * nb * H;
#pragma omp parallel
    {
        real *S = fsd_attn_scratch(FSD_ATTN_QB * T);
        /* item = (b, query block, h): later blocks see more keys, so they
         * are handed out dynamically; each writes rows only it owns */
#pragma omp for schedule(dynamic)
        for (int64_t it = 0; it < items; it++)
            attention_fwd_block(S, out, lse, q, k, v, it / (nb * H), it % H,
                                (it / H) % nb * FSD_ATTN_QB, T, H, KV, hd, causal);
        free(S);
    }
}

/* Backward of kv head g of sequence b: every query head h of g, every
 * query block, in order; S and dP are scratch of FSD_ATTN_QB·T reals. */
static inline void attention_bwd_group(real *S, real *dP, real *dq, bool acc_q, real *dk,
                                       bool acc_k, real *dv, bool acc_v, const real *dout,
                                       const real *q, const real *k, const real *v,
                                       const real *out, const real *lse, int64_t b, int64_t g,
                                       int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    int64_t ldq = H * hd, ldk = KV * hd, per = H / KV;
    const real *K = k + b * T * ldk + g * hd, *V = v + b * T * ldk + g * hd;
    real *dK = dk + b * T * ldk + g * hd, *dV = dv + b * T * ldk + g * hd;
    real scale = 1 / fsd_sqrt((real)hd);
    for (int64_t s = 0; s < T; s++) {
        if (!acc_k)
            memset(dK + s * ldk, 0, sizeof(real) * (size_t)hd);
        if (!acc_v)
            memset(dV + s * ldk, 0, sizeof(real) * (size_t)hd);
    }
    for (int64_t h = g * per; h < (g + 1) * per; h++)   /* the heads with h·KV/H = g */
        for (int64_t q0 = 0; q0 < T; q0 += FSD_ATTN_QB) {
            int64_t nq = T - q0 < FSD_ATTN_QB ? T - q0 : FSD_ATTN_QB, nk = causal ? q0 + nq : T;
            int64_t at = (b * T + q0) * ldq + h * hd;
            const real *Q = q + at, *dO = dout + at, *O = out + at;
            /* P = exp(scale·Q·Kᵀ − lse), 0 where masked */
            fsd_attn_gemm(false, true, nq, nk, hd, scale, Q, ldq, K, ldk, 0, S, nk);
            fsd_attn_gemm(false, true, nq, nk, hd, 1, dO, ldq, V, ldk, 0, dP, nk);
            for (int64_t i = 0; i < nq; i++) {
                int64_t t = q0 + i, n = causal ? t + 1 : T;
                real L = lse[(b * H + h) * T + t], D = fsd_attn_dot(dO + i * ldq, O + i * ldq, hd);
                real *p = S + i * nk, *ds = dP + i * nk;
                FSD_SIMD
                for (int64_t s = 0; s < n; s++) {
                    p[s] = fsd_exp(p[s] - L);
                    ds[s] = p[s] * (ds[s] - D) * scale;
                }
                for (int64_t s = n; s < nk; s++)
                    p[s] = ds[s] = 0;
            }
            fsd_attn_gemm(false, false, nq, hd, nk, 1, dP, nk, K, ldk, acc_q ? 1 : 0, dq + at,
                          ldq);
            fsd_attn_gemm(true, false, nk, hd, nq, 1, dP, nk, Q, ldq, 1, dK, ldk);
            fsd_attn_gemm(true, false, nk, hd, nq, 1, S, nk, dO, ldq, 1, dV, ldk);
        }
}

static inline void attention_bwd_blas(real *dq, bool acc_q, real *dk, bool acc_k, real *dv,
                                      bool acc_v, const real *dout, const real *q, const real *k,
                                      const real *v, const real *out, const real *lse, int64_t B,
                                      int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
#pragma omp parallel
    {
        real *S = fsd_attn_scratch(2 * FSD_ATTN_QB * T);
#pragma omp for schedule(static)
        for (int64_t it = 0; it < B * KV; it++)
            attention_bwd_group(S, S + FSD_ATTN_QB * T, dq, acc_q, dk, acc_k, dv, acc_v, dout, q,
                                k, v, out, lse, it / KV, it % KV, T, H, KV, hd, causal);
        free(S);
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
LAUNCHER void attention_fwd(real *out, real *lse, const real *q, const real *k,
                            const real *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                            int64_t hd, bool causal)
{
    FSD_REQUIRE("attention_fwd", out && lse && q && k && v);
    attention_check("attention_fwd", B, T, H, KV, hd);
#ifdef FSD_ATTENTION_BLAS
    attention_fwd_blas(out, lse, q, k, v, B, T, H, KV, hd, causal);
#else
    FSD_RUN_ROWS(attention_fwd, B * H * T, (out, lse, q, k, v, T, H, KV, hd, causal));
#endif
}

/* dq of query row `row` = (b·H + h)·T + t:
 *   D = do · o,  dp_s = do · v_s,  ds_s = p_s · (dp_s − D)
 *   dq (+)= scale · Σ_s ds_s · k_s
 * accumulated in place in the dq row (each lane owns its elements). */
DEVICE void attention_bwd_dq_row(int64_t row, int lane, int lanes, real *dq, bool acc,
                                 const real *dout, const real *q, const real *k, const real *v,
                                 const real *out, const real *lse, int64_t T, int64_t H,
                                 int64_t KV, int64_t hd, bool causal)
{
    int64_t t = row % T, h = (row / T) % H, b = row / (T * H), g = h * KV / H;
    int64_t at = (b * T + t) * H * hd + h * hd;
    const real *qr = q + at, *dor = dout + at;
    real *dqr = dq + at;
    real scale = 1 / fsd_sqrt((real)hd), L = lse[row];
    real D = attn_dot(lane, lanes, dor, out + at, hd);
    int64_t nkeys = causal ? t + 1 : T;
    if (!acc)
        for (int64_t d = lane; d < hd; d += lanes)
            dqr[d] = 0;
    for (int64_t s = 0; s < nkeys; s++) {
        const real *kr = k + (b * T + s) * KV * hd + g * hd;
        const real *vr = v + (b * T + s) * KV * hd + g * hd;
        real p = fsd_exp(attn_dot(lane, lanes, qr, kr, hd) * scale - L);
        real ds = p * (attn_dot(lane, lanes, dor, vr, hd) - D) * scale;
        for (int64_t d = lane; d < hd; d += lanes)
            dqr[d] += ds * kr[d];
    }
}
FSD_ROW_KERNEL(attention_bwd_dq,
               (real *dq, bool acc, const real *dout, const real *q, const real *k, const real *v,
                const real *out, const real *lse, int64_t T, int64_t H, int64_t KV, int64_t hd,
                bool causal),
               (dq, acc, dout, q, k, v, out, lse, T, H, KV, hd, causal))

/* dk and dv of key row `row` = (b·KV + g)·T + s, over every query head h
 * with g(h) = g and every query t that sees key s:
 *   dv_s (+)= Σ p · do_t,   dk_s (+)= scale · Σ ds · q_t
 * D = do_t · o_t is recomputed per pair: no scratch memory. */
DEVICE void attention_bwd_dkv_row(int64_t row, int lane, int lanes, real *dk, bool acc_k,
                                  real *dv, bool acc_v, const real *dout, const real *q,
                                  const real *k, const real *v, const real *out, const real *lse,
                                  int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    int64_t s = row % T, g = (row / T) % KV, b = row / (T * KV);
    int64_t at = (b * T + s) * KV * hd + g * hd;
    const real *kr = k + at, *vr = v + at;
    real *dkr = dk + at, *dvr = dv + at;
    real scale = 1 / fsd_sqrt((real)hd);
    for (int64_t d = lane; d < hd; d += lanes) {
        if (!acc_k)
            dkr[d] = 0;
        if (!acc_v)
            dvr[d] = 0;
    }
    for (int64_t h = 0; h < H; h++) {
        if (h * KV / H != g)
            continue;
        for (int64_t t = causal ? s : 0; t < T; t++) {
            int64_t qt = (b * T + t) * H * hd + h * hd;
            const real *qr = q + qt, *dor = dout + qt;
            real p = fsd_exp(attn_dot(lane, lanes, qr, kr, hd) * scale - lse[(b * H + h) * T + t]);
            real D = attn_dot(lane, lanes, dor, out + qt, hd);
            real ds = p * (attn_dot(lane, lanes, dor, vr, hd) - D) * scale;
            for (int64_t d = lane; d < hd; d += lanes) {
                dvr[d] += p * dor[d];
                dkr[d] += ds * qr[d];
            }
        }
    }
}
FSD_ROW_KERNEL(attention_bwd_dkv,
               (real *dk, bool acc_k, real *dv, bool acc_v, const real *dout, const real *q,
                const real *k, const real *v, const real *out, const real *lse, int64_t T,
                int64_t H, int64_t KV, int64_t hd, bool causal),
               (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal))

/* attention_bwd: from dout [B, T, H·hd] and the forward's q, k, v, out and
 * lse, writes (acc_*: adds to)
 *   dq [B, T, H·hd],  dk, dv [B, T, KV·hd]
 * with p_s = exp(z_s − lse), ds_s = p_s · (dout·v_s − dout·out):
 *   dq = scale · Σ_s ds_s k_s,  dk_s = scale · Σ ds_s q,  dv_s = Σ p_s dout.
 * With acc, contributions are added to the existing values one key (or
 * query) at a time rather than summed first: equal up to rounding. */
LAUNCHER void attention_bwd(real *dq, bool acc_q, real *dk, bool acc_k, real *dv,
                            bool acc_v, const real *dout, const real *q, const real *k,
                            const real *v, const real *out, const real *lse, int64_t B,
                            int64_t T, int64_t H, int64_t KV, int64_t hd, bool causal)
{
    FSD_REQUIRE("attention_bwd", dq && dk && dv && dout && q && k && v && out && lse);
    attention_check("attention_bwd", B, T, H, KV, hd);
#ifdef FSD_ATTENTION_BLAS
    attention_bwd_blas(dq, acc_q, dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, B, T, H, KV, hd,
                       causal);
#else
    FSD_RUN_ROWS(attention_bwd_dq, B * H * T,
                 (dq, acc_q, dout, q, k, v, out, lse, T, H, KV, hd, causal));
    FSD_RUN_ROWS(attention_bwd_dkv, B * KV * T,
                 (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal));
#endif
}
