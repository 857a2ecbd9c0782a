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
 * deterministic.
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

static inline void attention_check(const char *kernel, int64_t B, int64_t T, int64_t H,
                                   int64_t KV, int64_t hd)
{
    FSD_REQUIRE(kernel, B > 0 && T > 0 && H > 0 && KV > 0 && hd > 0);
    FSD_REQUIRE(kernel, KV <= H && H % KV == 0);
}

/* attention_fwd: out and lse as above; both overwritten. */
LAUNCHER void attention_fwd(real *out, real *lse, const real *q, const real *k,
                            const real *v, int64_t B, int64_t T, int64_t H, int64_t KV,
                            int64_t hd, bool causal)
{
    FSD_REQUIRE("attention_fwd", out && lse && q && k && v);
    attention_check("attention_fwd", B, T, H, KV, hd);
    FSD_RUN_ROWS(attention_fwd, B * H * T, (out, lse, q, k, v, T, H, KV, hd, causal));
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
    FSD_RUN_ROWS(attention_bwd_dq, B * H * T,
                 (dq, acc_q, dout, q, k, v, out, lse, T, H, KV, hd, causal));
    FSD_RUN_ROWS(attention_bwd_dkv, B * KV * T,
                 (dk, acc_k, dv, acc_v, dout, q, k, v, out, lse, T, H, KV, hd, causal));
}
