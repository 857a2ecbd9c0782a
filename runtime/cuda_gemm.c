/*
 * cuda_gemm.c — the CUDA backend's matrix products (fsdrt_gemm,
 * fsdrt_gemm_bias, fsdrt_gemm_bias_gelu) through cuBLASLt: one plan per
 * product shape, made on its first call and kept for the run, and
 * FSD_GEMM_BENCH's timing of every plan at the end of a run.
 */
#include "cuda_internal.h"

#include <stdlib.h>

/* Row-major C = α·op(A)·op(B) + β·C is column-major Cᵀ = α·op(B)ᵀ·op(A)ᵀ +
 * β·Cᵀ with the same buffers: cuBLASLt gets B as its A and A as its B, the
 * dimensions swapped (its m = N, n = M). Operands are the model's act.
 * fp32: fp32 in and out, fp32 accumulation; inputs rounded to TF32 on the
 * tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32, as PyTorch's allow_tf32 and
 * llm.c's fp32 build) unless FSD_TF32=0 asks for full fp32 products. bf16:
 * A, B, C, D and the bias bf16, products summed in fp32
 * (CUBLAS_COMPUTE_32F, scalars fp32) and D rounded once, as PyTorch's bf16
 * matmuls and llm.c's bf16 build. A bias, in Cᵀ's
 * terms, is one value per row of its N rows: cuBLASLt's EPILOGUE_BIAS
 * vector, whose length is D's row count and which it broadcasts over D's
 * columns (our rows).
 *
 * Everything but cublasLtMatmul itself happens on a shape's first call and
 * is host-only (descriptors, layouts, the heuristic's choice): nothing
 * waits for the device, and a step after the first only looks its shapes
 * up. The plan's key holds the alignment of the operands' addresses (A, B
 * and C's least, the bias's and aux's each: the heuristic reads those two
 * from the pointers it is shown, so a plan is only used with ones aligned
 * as those were), since the heuristic may choose kernels that need more
 * than the 64 bytes a parameter's start guarantees (plan.c aligns them to
 * 16 elements). That alignment comes from offsets the model's tables fix,
 * inside buffers cudaMalloc aligns to 256 bytes, so a product gets the
 * same plan, and the same algorithm, at every step of every run. */
static uint32_t addr_align(const void *p)
{
    uint32_t a = 256;
    while (a > 4 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

/* The heuristic's first n choices for plan p's layouts under descriptor
 * desc (the plan's own, or FSD_GEMM_BENCH's variant of it), for operands
 * aligned to p->align bytes and the run's workspace; how many it found. */
static int gemm_candidates(FsdRun *r, const GemmPlan *p, cublasLtMatmulDesc_t desc,
                           cublasLtMatmulHeuristicResult_t *out, int n)
{
    cublasLtMatmulPreference_t pref;
    BLAS_CHECK(r, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = BLAS_WORKSPACE_BYTES;
    BLAS_CHECK(r, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &ws, sizeof ws));
    const cublasLtMatmulPreferenceAttributes_t aligns[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++)
        BLAS_CHECK(r, cublasLtMatmulPreferenceSetAttribute(pref, aligns[i], &p->align,
                                                           sizeof p->align));
    int found = 0;
    BLAS_CHECK(r, cublasLtMatmulAlgoGetHeuristic(r->bk->lt, desc, p->a, p->b, p->c, p->c, pref, n,
                                                 out, &found));
    BLAS_CHECK(r, cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

static GemmPlan *gemm_plan(FsdRun *r, bool bf16, bool transA, bool transB, int64_t M, int64_t N,
                           int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                           cublasLtEpilogue_t epilogue, const void *bias, void *aux,
                           const uint32_t align[3])
{
    Backend *bk = r->bk;
    for (int i = 0; i < bk->nplans; i++) {
        GemmPlan *p = &bk->plans[i];
        if (p->bf16 == bf16 && p->transA == transA && p->transB == transB &&
            p->epilogue == epilogue &&
            p->M == M && p->N == N && p->K == K && p->lda == lda && p->ldb == ldb &&
            p->ldc == ldc && p->align == align[0] && p->bias_align == align[1] &&
            p->aux_align == align[2])
            return p;
    }
    if (bk->nplans == bk->plans_cap) {
        int cap = bk->plans_cap ? 2 * bk->plans_cap : 16;
        GemmPlan *grown = realloc(bk->plans, sizeof *grown * (size_t)cap);
        if (!grown)
            cuda_failed(r, __FILE__, __LINE__, "realloc", "out of memory");
        bk->plans = grown;
        bk->plans_cap = cap;
    }
    GemmPlan *p = &bk->plans[bk->nplans++];   /* counted now: bk_stop frees what was made */
    *p = (GemmPlan){bf16, transA, transB, epilogue, M, N, K, lda, ldb, ldc,
                    align[0], align[1], align[2]};
    const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t compute =
        bk->tf32 && !bf16 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    BLAS_CHECK(r, cublasLtMatmulDescCreate(&p->desc, compute, CUDA_R_32F));
    cublasOperation_t opa = transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                                 sizeof opa));
    BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                                 sizeof opb));
    if (bias) {
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                     &epilogue, sizeof epilogue));
        /* the heuristic reads the bias's alignment from its address */
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof bias));
        /* a bf16 bias: D's type is the default, said so that it is not a guess */
        const int32_t bias_type = CUDA_R_16BF;
        if (bf16)
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                              sizeof bias_type));
    }
    if (aux) {
        /* GELU_AUX_BIAS: D = gelu(AB + bias), and AB + bias itself to aux,
         * laid out as D (the heuristic reads aux's alignment from its
         * address, as the bias's); bf16 aux said so, as the bias */
        const int64_t aux_ld = ldc;
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
        const int32_t aux_type = CUDA_R_16BF;
        if (bf16)
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type,
                              sizeof aux_type));
    }
    /* column-major layouts of the stored matrices: op(B)ᵀ is [N, K], op(A)ᵀ [K, M] */
    BLAS_CHECK(r, cublasLtMatrixLayoutCreate(&p->a, type, (uint64_t)(transB ? K : N),
                                             (uint64_t)(transB ? N : K), ldb));
    BLAS_CHECK(r, cublasLtMatrixLayoutCreate(&p->b, type, (uint64_t)(transA ? M : K),
                                             (uint64_t)(transA ? K : M), lda));
    BLAS_CHECK(r, cublasLtMatrixLayoutCreate(&p->c, type, (uint64_t)N, (uint64_t)M, ldc));

    cublasLtMatmulHeuristicResult_t best;
    int found = gemm_candidates(r, p, p->desc, &best, 1);
    if (found < 1 || best.state != CUBLAS_STATUS_SUCCESS) {
        char why[256];
        snprintf(why, sizeof why,
                 "no algorithm for %s C[%lld, %lld] = %sop(A)·op(B)%s%s with K %lld, trans %d%d, "
                 "lda %lld ldb %lld ldc %lld, A, B and C aligned to %u bytes, a %d MiB "
                 "workspace",
                 bf16 ? "bf16" : "fp32", (long long)M, (long long)N, aux ? "gelu(" : "",
                 bias ? " + bias" : "", aux ? ") and its input" : "",
                 (long long)K, transA, transB,
                 (long long)lda, (long long)ldb, (long long)ldc, align[0],
                 BLAS_WORKSPACE_BYTES >> 20);
        cuda_failed(r, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", why);
    }
    p->algo = best.algo;
    return p;
}

/* Descriptors and layouts of every plan; at shutdown. */
void cuda_gemm_plans_free(FsdRun *r)
{
    Backend *bk = r->bk;
    for (int i = 0; i < bk->nplans; i++) {
        GemmPlan *p = &bk->plans[i];
        if (p->desc)
            BLAS_NOTE(r, cublasLtMatmulDescDestroy(p->desc));
        cublasLtMatrixLayout_t ls[] = {p->a, p->b, p->c};
        for (size_t k = 0; k < sizeof ls / sizeof *ls; k++)
            if (ls[k])
                BLAS_NOTE(r, cublasLtMatrixLayoutDestroy(ls[k]));
    }
    free(bk->plans);
    bk->plans = NULL;
    bk->nplans = bk->plans_cap = 0;
}

/* One product on the compute stream, through its shape's plan: with a
 * bias, EPILOGUE_BIAS; with aux as well, GELU_AUX_BIAS (C = gelu(product +
 * bias), aux = product + bias). */
static void lt_matmul(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                      float alpha, const void *A, int64_t lda, const void *B, int64_t ldb,
                      float beta, void *C, int64_t ldc, const void *bias, void *aux)
{
    Backend *bk = r->bk;
    /* A, B and C's least alignment, the bias's, aux's (0: none) */
    uint32_t align[3] = {256, bias ? addr_align(bias) : 0, aux ? addr_align(aux) : 0};
    const void *abc[3] = {A, B, C};
    for (int i = 0; i < 3; i++) {
        const uint32_t ai = addr_align(abc[i]);
        align[0] = ai < align[0] ? ai : align[0];
    }
    for (int i = 0; i < 3; i++)
        if (align[i] && align[i] < 16)
            RT_BUG(r, "a [%lld, %lld] product's operand is aligned to %u bytes; the runtime hands "
                      "out buffers aligned to at least 16", (long long)M, (long long)N, align[i]);
    cublasLtEpilogue_t epilogue = aux    ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                  : bias ? CUBLASLT_EPILOGUE_BIAS
                                         : CUBLASLT_EPILOGUE_DEFAULT;
    GemmPlan *p = gemm_plan(r, act_bf16(r), transA, transB, M, N, K, lda, ldb, ldc, epilogue,
                            bias, aux, align);
    /* this call's bias and aux: host-side state of the descriptor, read at launch */
    if (bias)
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                     &bias, sizeof bias));
    if (aux)
        BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                          p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux));
    BLAS_CHECK(r, cublasLtMatmul(bk->lt, p->desc, &alpha, B, p->a, A, p->b, &beta, C, p->c, C,
                                 p->c, &p->algo, bk->blas_ws, BLAS_WORKSPACE_BYTES, bk->compute));
}

/* FSD_GEMM_BENCH=1: at the end of a run that went well, rank 0 times
 * every product shape the run planned, on fresh buffers aligned as the
 * run's operands were: the plan's algorithm, the heuristic's next choices
 * for the same descriptor, and for a bias product the same product with no
 * epilogue. One table on stderr; the run's results are already written,
 * and the host waits here are outside any step. It says whether the
 * heuristic's first choice, or an epilogue, costs time at the model's
 * shapes (docs/cuda.md). */
#define GEMM_BENCH_ALGOS 8
#define GEMM_BENCH_CALLS 20

/* ms a call of plan p's product with algorithm algo under desc, or -1 if
 * cuBLASLt refuses to run it */
static double gemm_bench_time(FsdRun *r, const GemmPlan *p, cublasLtMatmulDesc_t desc,
                              const cublasLtMatmulAlgo_t *algo, void *const buf[5])
{
    Backend *bk = r->bk;
    const float alpha = 1, beta = 0;
    cudaEvent_t ev[2];
    for (int i = 0; i < 2; i++)
        CUDA_CHECK(r, cudaEventCreate(&ev[i]));
    double ms = -1;
    for (int i = 0; i < 3 + GEMM_BENCH_CALLS; i++) {
        if (i == 3)
            CUDA_CHECK(r, cudaEventRecord(ev[0], bk->compute));
        if (cublasLtMatmul(bk->lt, desc, &alpha, buf[1], p->a, buf[0], p->b, &beta, buf[2], p->c,
                           buf[2], p->c, algo, bk->blas_ws, BLAS_WORKSPACE_BYTES,
                           bk->compute) != CUBLAS_STATUS_SUCCESS)
            goto out;
    }
    CUDA_CHECK(r, cudaEventRecord(ev[1], bk->compute));
    CUDA_CHECK(r, cudaEventSynchronize(ev[1]));
    float t;
    CUDA_CHECK(r, cudaEventElapsedTime(&t, ev[0], ev[1]));
    ms = t / GEMM_BENCH_CALLS;
out:
    for (int i = 0; i < 2; i++)
        CUDA_CHECK(r, cudaEventDestroy(ev[i]));
    return ms;
}

void cuda_gemm_bench(FsdRun *r)
{
    Backend *bk = r->bk;
    if (r->rank != 0)
        return;   /* bk_stop has drained the streams */
    fprintf(stderr, "FSD_GEMM_BENCH: every product shape of the run, %d calls after 3; "
                    "TFLOP/s = 2MNK / time\n"
                    "%8s %7s %7s %2s %-13s %5s | %9s %7s | %-12s %7s | %s\n",
            GEMM_BENCH_CALLS, "M", "N", "K", "tt", "epilogue", "align", "plan ms", "TFLOP/s",
            "best of 8", "TFLOP/s", "no epilogue TFLOP/s");
    const int64_t elem = act_bytes(r);
    for (int i = 0; i < bk->nplans; i++) {
        GemmPlan *p = &bk->plans[i];
        /* A, B, C, bias, aux as stored (row-major, leading dimensions of
         * the run's), each starting as many bytes past a 256-byte boundary
         * as it is aligned to in the plan, unless that is 256 */
        const int64_t rows[5] = {p->transA ? p->K : p->M, p->transB ? p->N : p->K, p->M, 1,
                                 p->M};
        const int64_t lds[5] = {p->lda, p->ldb, p->ldc, p->N, p->ldc};
        const bool used[5] = {true, true, true, p->epilogue != CUBLASLT_EPILOGUE_DEFAULT,
                              p->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS};
        void *base[5] = {NULL}, *buf[5] = {NULL};
        const uint32_t al[5] = {p->align, p->align, p->align, p->bias_align, p->aux_align};
        for (int k = 0; k < 5; k++)
            if (used[k]) {
                const size_t skew = al[k] % 256;
                const size_t bytes = (size_t)(rows[k] * lds[k] * elem) + skew;
                CUDA_CHECK(r, cudaMalloc(&base[k], bytes));
                CUDA_CHECK(r, cudaMemsetAsync(base[k], 0x3c, bytes, bk->compute));   /* ~0.0115 */
                buf[k] = (char *)base[k] + skew;
            }
        if (used[3])
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &buf[3], sizeof buf[3]));
        if (used[4])
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(
                              p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &buf[4],
                              sizeof buf[4]));
        const double flop = 2.0 * (double)p->M * (double)p->N * (double)p->K;
        const double ms = gemm_bench_time(r, p, p->desc, &p->algo, buf);
        cublasLtMatmulHeuristicResult_t cand[GEMM_BENCH_ALGOS];
        const int n = gemm_candidates(r, p, p->desc, cand, GEMM_BENCH_ALGOS);
        double best = -1;
        int best_i = -1;
        for (int c = 0; c < n; c++) {
            const double t = cand[c].state == CUBLAS_STATUS_SUCCESS
                                 ? gemm_bench_time(r, p, p->desc, &cand[c].algo, buf)
                                 : -1;
            if (t > 0 && (best < 0 || t < best))
                best = t, best_i = c;
        }
        /* the plain product: the plan's descriptor less its epilogue */
        double plain = -1;
        if (used[3]) {
            const cublasLtEpilogue_t none = CUBLASLT_EPILOGUE_DEFAULT;
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &none, sizeof none));
            cublasLtMatmulHeuristicResult_t first;
            if (gemm_candidates(r, p, p->desc, &first, 1) == 1 &&
                first.state == CUBLAS_STATUS_SUCCESS)
                plain = gemm_bench_time(r, p, p->desc, &first.algo, buf);
            BLAS_CHECK(r, cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                         &p->epilogue, sizeof p->epilogue));
        }
        const char *epi = p->epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "gelu_aux_bias"
                          : p->epilogue == CUBLASLT_EPILOGUE_BIAS        ? "bias"
                                                                         : "none";
        char best_s[16] = "-", best_f[16] = "-", plain_f[16] = "-";
        if (best > 0) {
            snprintf(best_s, sizeof best_s, "#%d %.3f", best_i, best);
            snprintf(best_f, sizeof best_f, "%.0f", flop / best * 1e-9);
        }
        if (plain > 0)
            snprintf(plain_f, sizeof plain_f, "%.0f", flop / plain * 1e-9);
        fprintf(stderr, "%8lld %7lld %7lld %d%d %-13s %5u | %9.3f %7.0f | %-12s %7s | %s\n",
                (long long)p->M, (long long)p->N, (long long)p->K, p->transA, p->transB, epi,
                p->align, ms, ms > 0 ? flop / ms * 1e-9 : 0.0, best_s, best_f, plain_f);
        for (int k = 0; k < 5; k++)
            if (base[k])
                CUDA_CHECK(r, cudaFree(base[k]));
    }
}

void fsdrt_gemm(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                const void *A, int64_t lda, const void *B, int64_t ldb, real beta, void *C,
                int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm", transA, transB, M, N, K, lda, ldb, ldc);
    Backend *bk = r->bk;
    if (M == 0 || N == 0)
        return;
    if (K == 0) {   /* cuBLASLt wants leading dimensions of at least 1; C = β·C */
        CUDA_CHECK(r, cu_scale(C, M, N, ldc, beta, act_bf16(r), bk->compute));
        return;
    }
    lt_matmul(r, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL, NULL);
}

void fsdrt_gemm_bias(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                     const void *A, int64_t lda, const void *B, int64_t ldb, const void *bias,
                     void *C, int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm_bias", transA, transB, M, N, K, lda, ldb, ldc);
    Backend *bk = r->bk;
    if (M == 0 || N == 0)
        return;
    if (!bias)
        RT_BUG(r, "fsdrt_gemm_bias: no bias for a [%lld, %lld] product", (long long)M,
               (long long)N);
    if (K == 0) {   /* an empty product: C is the bias in every row, copied in doubling runs */
        const size_t elem = (size_t)act_bytes(r);
        const size_t row = elem * (size_t)N, pitch = elem * (size_t)ldc;
        CUDA_CHECK(r, cudaMemcpyAsync(C, bias, row, cudaMemcpyDeviceToDevice, bk->compute));
        for (int64_t have = 1; have < M; have *= 2) {
            int64_t n = have < M - have ? have : M - have;
            CUDA_CHECK(r, cudaMemcpy2DAsync((char *)C + (size_t)have * pitch, pitch, C, pitch, row,
                                            (size_t)n, cudaMemcpyDeviceToDevice, bk->compute));
        }
        return;
    }
    lt_matmul(r, transA, transB, M, N, K, 1, A, lda, B, ldb, 0, C, ldc, bias, NULL);
}

/* cuBLASLt's GELU epilogue is the tanh approximation (what PyTorch's
 * _addmm_activation relies on for gelu(approximate='tanh')), GPT-2's gelu and
 * templates/act.h's, evaluated by its own code: y agrees with gelu_fwd of pre
 * to rounding, not bit for bit, and in bf16 it is gelu of the fp32 sum, not
 * of pre rounded to bf16. An aux leading dimension that is not a multiple of
 * 8 (cuBLASLt's requirement) and an empty product take the unfused path. */
bool fsdrt_gemm_bias_gelu(FsdRun *r, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                          const void *A, int64_t lda, const void *B, int64_t ldb,
                          const void *bias, void *pre, void *y, int64_t ldc)
{
    rt_check_gemm(r, "fsdrt_gemm_bias_gelu", transA, transB, M, N, K, lda, ldb, ldc);
    if (M == 0 || N == 0 || K == 0 || ldc % 8 != 0) {
        fsdrt_gemm_bias(r, transA, transB, M, N, K, A, lda, B, ldb, bias, pre, ldc);
        return false;
    }
    if (!bias || !pre)
        RT_BUG(r, "fsdrt_gemm_bias_gelu: no %s for a [%lld, %lld] product",
               bias ? "pre-activation" : "bias", (long long)M, (long long)N);
    lt_matmul(r, transA, transB, M, N, K, 1, A, lda, B, ldb, 0, y, ldc, bias, pre);
    return true;
}

