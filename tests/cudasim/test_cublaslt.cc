/*
 * test_cublaslt.cc — unit test of cudasim's cuBLASLt (cublaslt.cc): its
 * products against a naive double reference (all four transpose
 * combinations, fp32 and bf16, β = 0 with NaN in D and β = 1 in place,
 * BIAS and GELU_AUX_BIAS with leading dimensions past the rows, TF32
 * rounding, bf16 rounding to nearest even), and that the calls the real
 * library would refuse, or run wrongly, stop the process (sim_fail) with
 * a message that says so.
 *
 * Built with device.cc, the simulated device (make build/cudasim/test_cublaslt).
 * Prints one line per check; exits 1 if any failed.
 */
#include "check.h"
#include "cublasLt.h"
#include "sim.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <random>
#include <string>
#include <vector>


/* ── helpers ── */

#define LT(call)                                                                  \
    do {                                                                          \
        cublasStatus_t s_ = (call);                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                        \
            printf("FAIL: %s: %s\n", #call, cublasLtGetStatusString(s_));          \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static void *dev(size_t bytes)
{
    void *p;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
        printf("FAIL: cudaMalloc(%zu)\n", bytes);
        exit(1);
    }
    return p;
}

static float bf16_round(float f)   /* reference rounding: to nearest even, via double */
{
    if (f == 0 || !isfinite(f))
        return f;
    int e;
    double m = frexp((double)f, &e);           /* f = m·2^e, 0.5 ≤ |m| < 1 */
    double q = nearbyint(ldexp(m, 8));         /* 8 significant bits, ties to even */
    return (float)ldexp(q, e - 8);
}

static float tf32_round(float f)   /* 11 significant bits, ties away from zero */
{
    if (f == 0 || !isfinite(f))
        return f;
    int e;
    double m = frexp((double)f, &e);
    return (float)ldexp(round(ldexp(m, 11)), e - 11);
}

static uint16_t to_bf16_bits(float f)   /* f already representable in bf16 */
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)(u >> 16);
}

static float from_bf16_bits(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A column-major matrix held on the host as floats (already representable
 * in its type) and copied to "device" memory in its type. */
struct Mat {
    cudaDataType_t type;
    int64_t rows, cols, ld;
    std::vector<float> h;   /* ld * cols */
    void *d = nullptr;

    Mat(cudaDataType_t t, int64_t r, int64_t c, int64_t l) : type(t), rows(r), cols(c), ld(l)
    {
        h.assign((size_t)(ld * cols), 0.0f);
        d = dev(bytes());
    }
    size_t elem() const { return type == CUDA_R_32F ? 4 : 2; }
    size_t bytes() const { return h.size() * elem(); }
    float &at(int64_t i, int64_t j) { return h[(size_t)(i + j * ld)]; }
    void fill(std::mt19937 &g, float fill_pad)
    {
        std::uniform_real_distribution<float> u(-1, 1);
        for (int64_t j = 0; j < cols; j++)
            for (int64_t i = 0; i < ld; i++) {
                float v = i < rows ? u(g) : fill_pad;
                at(i, j) = type == CUDA_R_16BF ? bf16_round(v) : v;
            }
    }
    void upload()
    {
        if (type == CUDA_R_32F)
            memcpy(d, h.data(), bytes());
        else
            for (size_t i = 0; i < h.size(); i++)
                ((uint16_t *)d)[i] = to_bf16_bits(h[i]);
    }
    float dget(size_t i) const
    {
        if (type == CUDA_R_32F)
            return ((const float *)d)[i];
        return from_bf16_bits(((const uint16_t *)d)[i]);
    }
    float dat(int64_t i, int64_t j) const { return dget((size_t)(i + j * ld)); }
    cublasLtMatrixLayout_t layout() const
    {
        cublasLtMatrixLayout_t l;
        LT(cublasLtMatrixLayoutCreate(&l, type, (uint64_t)rows, (uint64_t)cols, ld));
        return l;
    }
};

static cublasLtHandle_t lt;
static void *ws;
static const uint64_t WS_BYTES = 1 << 20;

/* The heuristic's first choice for desc and the layouts, operands promised
 * `align` bytes. */
static cublasLtMatmulAlgo_t choose(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                   cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                   uint32_t align, int want = 1, int *found_out = nullptr)
{
    cublasLtMatmulPreference_t pref;
    LT(cublasLtMatmulPreferenceCreate(&pref));
    uint64_t wsb = WS_BYTES;
    LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                            sizeof wsb));
    const cublasLtMatmulPreferenceAttributes_t at[] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (auto x : at)
        LT(cublasLtMatmulPreferenceSetAttribute(pref, x, &align, sizeof align));
    cublasLtMatmulHeuristicResult_t res[8];
    int found = 0;
    LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, c, c, pref, want, res, &found));
    LT(cublasLtMatmulPreferenceDestroy(pref));
    if (found_out)
        *found_out = found;
    if (found < 1 || res[0].state != CUBLAS_STATUS_SUCCESS) {
        printf("FAIL: no algorithm\n");
        exit(1);
    }
    return res[0].algo;
}

/* One product D = α·op(A)·op(B) + β·C (C == D) with an epilogue, checked
 * against a double reference; returns the worst error over the tolerance. */
struct Case {
    cudaDataType_t type;
    cublasComputeType_t compute;
    bool ta, tb;
    int64_t m, n, k;
    float alpha, beta;
    cublasLtEpilogue_t epi;
    int64_t pad;   /* ld = rows + pad for every matrix (and aux) */
};

static void run_case(const Case &c, std::mt19937 &g)
{
    const int64_t ar = c.ta ? c.k : c.m, ac = c.ta ? c.m : c.k;
    const int64_t br = c.tb ? c.n : c.k, bc = c.tb ? c.k : c.n;
    Mat A(c.type, ar, ac, ar + c.pad), B(c.type, br, bc, br + c.pad);
    /* aux's ld is 8 past D's, so a mix-up of the two shows */
    Mat D(c.type, c.m, c.n, c.m + c.pad), aux(c.type, c.m, c.n, c.m + c.pad + 8);
    Mat bias(c.type, c.m, 1, c.m);
    const float sentinel = 12345.0f;   /* in the padding, which nothing may write */
    A.fill(g, NAN);
    B.fill(g, NAN);
    bias.fill(g, 0);
    D.fill(g, sentinel);
    if (c.beta == 0)   /* β = 0: C is not read, NaN must not leak */
        for (int64_t j = 0; j < c.n; j++)
            for (int64_t i = 0; i < c.m; i++)
                D.at(i, j) = NAN;
    aux.fill(g, sentinel);
    A.upload();
    B.upload();
    D.upload();
    aux.upload();
    bias.upload();
    const std::vector<float> C0 = D.h;

    cublasLtMatmulDesc_t desc;
    LT(cublasLtMatmulDescCreate(&desc, c.compute, CUDA_R_32F));
    const cublasOperation_t opa = c.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opb = c.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa));
    LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb));
    if (c.epi != CUBLASLT_EPILOGUE_DEFAULT) {
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &c.epi,
                                          sizeof c.epi));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.d,
                                          sizeof bias.d));
        const int32_t t = c.type;
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t, sizeof t));
    }
    if (c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux.d,
                                          sizeof aux.d));
        LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux.ld,
                                          sizeof aux.ld));
    }
    cublasLtMatrixLayout_t la = A.layout(), lb = B.layout(), lc = D.layout();
    cublasLtMatmulAlgo_t algo = choose(desc, la, lb, lc, 16);
    LT(cublasLtMatmul(lt, desc, &c.alpha, A.d, la, B.d, lb, &c.beta, D.d, lc, D.d, lc, &algo, ws,
                      WS_BYTES, (cudaStream_t)0));

    /* the reference, in double, from the stored (and TF32-rounded) inputs */
    const bool tf32 = c.compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    double worst = 0;
    int bad_pad = 0, nans = 0;
    for (int64_t j = 0; j < c.n; j++)
        for (int64_t i = 0; i < c.m; i++) {
            double s = 0, sabs = 0;
            for (int64_t kk = 0; kk < c.k; kk++) {
                double a = c.ta ? A.at(kk, i) : A.at(i, kk);
                double b = c.tb ? B.at(j, kk) : B.at(kk, j);
                if (tf32)
                    a = tf32_round((float)a), b = tf32_round((float)b);
                s += a * b;
                sabs += fabs(a * b);
            }
            double x = c.alpha * s, xabs = fabs(c.alpha) * sabs;
            if (c.beta != 0) {
                x += c.beta * (double)C0[(size_t)(i + j * D.ld)];
                xabs += fabs(c.beta * (double)C0[(size_t)(i + j * D.ld)]);
            }
            if (c.epi != CUBLASLT_EPILOGUE_DEFAULT) {
                x += bias.at(i, 0);
                xabs += fabs(bias.at(i, 0));
            }
            /* fp32 sums: a few ulps of the terms' magnitude; a bf16 store: half an ulp */
            const double sum_tol = 4e-7 * (double)(c.k + 4) * xabs + 1e-30;
            const double store_tol = c.type == CUDA_R_16BF ? 1.0 / 256 : 1.2e-7;
            double y = x;
            if (c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                const double pre = aux.dat(i, j);
                worst = fmax(worst, fabs(pre - x) / (sum_tol + store_tol * fabs(x)));
                y = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
                /* gelu's slope is below 1.13: the sum's error passes on scaled */
                worst = fmax(worst, fabs(D.dat(i, j) - y) /
                                        (1.13 * sum_tol + store_tol * fabs(y) + 1e-6 * fabs(y)));
            } else {
                worst = fmax(worst, fabs(D.dat(i, j) - y) / (sum_tol + store_tol * fabs(y)));
            }
            nans += isnan(D.dat(i, j));
        }
    for (int64_t j = 0; j < c.n; j++)
        for (int64_t i = c.m; i < aux.ld; i++) {   /* the sentinel as its type holds it */
            bad_pad += i < D.ld && D.dat(i, j) != D.at(i, j);
            bad_pad += aux.dat(i, j) != aux.at(i, j);
        }
    const char *epi = c.epi == CUBLASLT_EPILOGUE_BIAS            ? "bias"
                      : c.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? "gelu_aux_bias"
                                                                 : "none";
    check(worst <= 1 && bad_pad == 0 && nans == 0,
          "%s %s %c%c m %lld n %lld k %lld alpha %g beta %g%s epilogue %s pad %lld: worst error "
          "%.3f of tolerance, %d padding elements written, %d NaN",
          c.type == CUDA_R_16BF ? "bf16" : "fp32", tf32 ? "tf32" : "32F", c.ta ? 'T' : 'N',
          c.tb ? 'T' : 'N', (long long)c.m, (long long)c.n, (long long)c.k, c.alpha, c.beta,
          c.beta != 0 ? " (in place)" : " (NaN in C)", epi, (long long)c.pad, worst, bad_pad,
          nans);
    LT(cublasLtMatrixLayoutDestroy(la));
    LT(cublasLtMatrixLayoutDestroy(lb));
    LT(cublasLtMatrixLayoutDestroy(lc));
    LT(cublasLtMatmulDescDestroy(desc));
    for (Mat *mat : {&A, &B, &D, &aux, &bias})
        cudaFree(mat->d);
}

/* TF32 on chosen values: 1 + 2⁻¹² rounds to 1, 1 + 2⁻¹¹ (a tie) away to
 * 1 + 2⁻¹⁰, 1 + 3·2⁻¹² up to 1 + 2⁻¹⁰; CUBLAS_COMPUTE_32F keeps them. */
static void tf32_exact()
{
    const float xs[3] = {1 + ldexpf(1, -12), 1 + ldexpf(1, -11), 1 + 3 * ldexpf(1, -12)};
    const float want_tf32[3] = {1, 1 + ldexpf(1, -10), 1 + ldexpf(1, -10)};
    for (int t = 0; t < 2; t++) {
        const cublasComputeType_t compute = t ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        float *a = (float *)dev(3 * sizeof(float)), *b = (float *)dev(sizeof(float)),
              *d = (float *)dev(3 * sizeof(float));
        memcpy(a, xs, sizeof xs);
        *b = 1;
        cublasLtMatmulDesc_t desc;
        LT(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F));
        cublasLtMatrixLayout_t la, lb, ld;
        LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 3, 1, 3));
        LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 1, 1, 1));
        LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, 3, 1, 3));
        cublasLtMatmulAlgo_t algo = choose(desc, la, lb, ld, 4);
        const float one = 1, zero = 0;
        LT(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, &algo, ws, WS_BYTES,
                          (cudaStream_t)0));
        bool ok = true;
        for (int i = 0; i < 3; i++)
            ok &= d[i] == (t ? want_tf32[i] : xs[i]);
        check(ok, "%s on 1+2^-12, 1+2^-11, 1+3*2^-12: %.9g %.9g %.9g", t ? "FAST_TF32" : "32F",
              d[0], d[1], d[2]);
        LT(cublasLtMatrixLayoutDestroy(la));
        LT(cublasLtMatrixLayoutDestroy(lb));
        LT(cublasLtMatrixLayoutDestroy(ld));
        LT(cublasLtMatmulDescDestroy(desc));
        cudaFree(a), cudaFree(b), cudaFree(d);
    }
}

/* bf16 stores round to nearest even: 1 + 2⁻⁸ (a tie) to 1, 1 + 2⁻⁷ + 2⁻⁸
 * (a tie) to 1 + 2⁻⁶, 1 + 2⁻⁸ + 2⁻¹⁶ up to 1 + 2⁻⁷; the sums are exact in
 * fp32, so only the store rounds. */
static void bf16_exact()
{
    const float a_h[3][3] = {{1, ldexpf(1, -8), 0},
                             {1 + ldexpf(1, -7), ldexpf(1, -8), 0},
                             {1, ldexpf(1, -8), ldexpf(1, -16)}};
    const float want[3] = {1, 1 + ldexpf(1, -6), 1 + ldexpf(1, -7)};
    /* A is 3 × 3 (row i: the terms of sum i), B 3 × 1 of ones, D 3 × 1 */
    uint16_t *a = (uint16_t *)dev(9 * 2), *b = (uint16_t *)dev(3 * 2), *d = (uint16_t *)dev(3 * 2);
    for (int i = 0; i < 3; i++)
        for (int kk = 0; kk < 3; kk++)
            a[i + 3 * kk] = to_bf16_bits(a_h[i][kk]);
    for (int kk = 0; kk < 3; kk++)
        b[kk] = to_bf16_bits(1);
    cublasLtMatmulDesc_t desc;
    LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasLtMatrixLayout_t la, lb, ld;
    LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, 3, 3, 3));
    LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, 3, 1, 3));
    LT(cublasLtMatrixLayoutCreate(&ld, CUDA_R_16BF, 3, 1, 3));
    cublasLtMatmulAlgo_t algo = choose(desc, la, lb, ld, 2);
    const float one = 1, zero = 0;
    LT(cublasLtMatmul(lt, desc, &one, a, la, b, lb, &zero, d, ld, d, ld, &algo, ws, WS_BYTES,
                      (cudaStream_t)0));
    bool ok = true;
    for (int i = 0; i < 3; i++)
        ok &= from_bf16_bits(d[i]) == want[i];
    check(ok, "bf16 stores of 1+2^-8, 1+2^-7+2^-8, 1+2^-8+2^-16: %.9g %.9g %.9g (want 1 %.9g %.9g)",
          from_bf16_bits(d[0]), from_bf16_bits(d[1]), from_bf16_bits(d[2]), want[1], want[2]);
    LT(cublasLtMatrixLayoutDestroy(la));
    LT(cublasLtMatrixLayoutDestroy(lb));
    LT(cublasLtMatrixLayoutDestroy(ld));
    LT(cublasLtMatmulDescDestroy(desc));
    cudaFree(a), cudaFree(b), cudaFree(d);
}


/* A small fp32 product set up for the refusals: A 8×8, B 8×8, D 8×8, all
 * from 256-byte-aligned blocks with room for an offset. */
struct Small {
    float *a, *b, *d;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t l;
    Small()
    {
        a = (float *)dev(80 * sizeof(float));
        b = (float *)dev(80 * sizeof(float));
        d = (float *)dev(80 * sizeof(float));
        LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 8, 8, 8));
    }
    void run(const cublasLtMatmulAlgo_t *algo, const void *A, const void *B, void *D,
             cublasLtMatrixLayout_t la = nullptr)
    {
        const float one = 1, zero = 0;
        LT(cublasLtMatmul(lt, desc, &one, A, la ? la : l, B, l, &zero, D, l, D, l, algo, ws,
                          WS_BYTES, (cudaStream_t)0));
    }
};

static void refusals()
{
    expect_fail("an A aligned to 8 bytes against a 16-byte algorithm",
                "is aligned to 8 bytes, but the algorithm was chosen", [] {
                    Small s;
                    cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
                    s.run(&algo, s.a + 2, s.b, s.d);   /* 8 bytes past a 256-byte start */
                });
    expect_fail("a D aligned to 4 bytes against a 16-byte algorithm",
                "is aligned to 4 bytes, but the algorithm was chosen", [] {
                    Small s;
                    cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
                    s.run(&algo, s.a, s.b, s.d + 1);
                });
    /* the control: the same offset against an algorithm chosen for it */
    expect_fail("nothing when the 8-byte A was promised (control; exits 3 on purpose)",
                "control done", [] {
                    Small s;
                    cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 8);
                    s.run(&algo, s.a + 2, s.b, s.d);
                    sim_fail("control done");
                });
    expect_fail("host memory as B", "B", [] {
        Small s;
        cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
        static float host[64] __attribute__((aligned(256)));
        s.run(&algo, s.a, host, s.d);
    });
    expect_fail("an A that runs past its allocation", "A", [] {
        Small s;
        cublasLtMatrixLayout_t big;
        LT(cublasLtMatrixLayoutCreate(&big, CUDA_R_32F, 8, 8, 16));   /* 120 elements > 80 */
        cublasLtMatmulAlgo_t algo = choose(s.desc, big, s.l, s.l, 16);
        s.run(&algo, s.a, s.b, s.d, big);
    });
    expect_fail("op(A) and op(B) that do not make D", "which do not make D", [] {
        Small s;
        cublasLtMatrixLayout_t la;
        LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 8, 4, 8));
        cublasLtMatmulAlgo_t algo = choose(s.desc, la, s.l, s.l, 16);
        (void)algo;
    });
    expect_fail("ld < rows", "leading dimension 4 for 8 rows", [] {
        cublasLtMatrixLayout_t l;
        LT(cublasLtMatrixLayoutCreate(&l, CUDA_R_32F, 8, 8, 4));
    });
    expect_fail("an unknown epilogue value", "EPILOGUE 3", [] {
        Small s;
        const uint32_t e = 3;
        LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
    });
    expect_fail("an attribute of the wrong size", "TRANSA takes 4 bytes, not 8", [] {
        Small s;
        const int64_t t = CUBLAS_OP_T;
        LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    });
    expect_fail("an algorithm chosen without the epilogue", "the algorithm was chosen for epilogue",
                [] {
                    Small s;
                    cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
                    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
                    float *bias = (float *)dev(8 * sizeof(float));
                    LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e,
                                                      sizeof e));
                    LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof bias));
                    s.run(&algo, s.a, s.b, s.d);
                });
    expect_fail("a bias less aligned than the one the heuristic saw",
                "read from the descriptor's pointer when it chose", [] {
                    Small s;
                    const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
                    float *bias = (float *)dev(16 * sizeof(float));   /* 256-byte aligned */
                    LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e,
                                                      sizeof e));
                    LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof bias));
                    cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
                    float *later = bias + 4;   /* 16 bytes in */
                    LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &later, sizeof later));
                    s.run(&algo, s.a, s.b, s.d);
                });
    expect_fail("an algorithm not from the heuristic", "not returned by", [] {
        Small s;
        cublasLtMatmulAlgo_t algo;
        memset(&algo, 0, sizeof algo);
        s.run(&algo, s.a, s.b, s.d);
    });
    expect_fail("D overlapping A", "D (", [] {
        Small s;
        cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
        s.run(&algo, s.a, s.b, s.a + 4);
    });
    expect_fail("a bf16 GELU aux ld that is not a multiple of 8", "EPILOGUE_AUX_LD is 12", [] {
        Small s;
        const cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
        const int64_t ld = 12;
        float *bias = (float *)dev(8 * sizeof(float)), *aux = (float *)dev(96 * sizeof(float));
        LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e));
        LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                          sizeof bias));
        LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                          sizeof aux));
        LT(cublasLtMatmulDescSetAttribute(s.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                          sizeof ld));
        choose(s.desc, s.l, s.l, s.l, 16);
    });
    expect_fail("a destroyed layout", "is not a live matrix layout", [] {
        Small s;
        cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
        LT(cublasLtMatrixLayoutDestroy(s.l));
        s.run(&algo, s.a, s.b, s.d);
    });
    expect_fail("a B freed before the call", "B", [] {
        Small s;
        cublasLtMatmulAlgo_t algo = choose(s.desc, s.l, s.l, s.l, 16);
        cudaFree(s.b);
        s.run(&algo, s.a, s.b, s.d);
    });
}

int main()
{
    LT(cublasLtCreate(&lt));
    ws = dev(WS_BYTES);
    /* first, before this process starts OpenMP's threads, which a fork's
     * child would not have */
    refusals();
    std::mt19937 g(1234);
    const cudaDataType_t types[] = {CUDA_R_32F, CUDA_R_16BF};
    for (cudaDataType_t t : types)
        for (int tt = 0; tt < 4; tt++)
            for (int in_place = 0; in_place < 2; in_place++) {
                Case c = {t, CUBLAS_COMPUTE_32F, (tt & 2) != 0, (tt & 1) != 0, 37, 29, 53,
                          in_place ? 0.5f : 1.0f, in_place ? 1.0f : 0.0f,
                          CUBLASLT_EPILOGUE_DEFAULT, in_place ? 3 : 0};
                run_case(c, g);
            }
    for (cudaDataType_t t : types)
        for (int tt = 0; tt < 4; tt += 3) {
            Case bias = {t, CUBLAS_COMPUTE_32F, tt != 0, tt != 0, 40, 24, 96, 1, 0,
                         CUBLASLT_EPILOGUE_BIAS, 5};
            run_case(bias, g);
            Case gelu = {t, CUBLAS_COMPUTE_32F, tt != 0, tt == 0, 40, 24, 96, 1, 0,
                         CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 8};   /* ld 48: a multiple of 8 */
            run_case(gelu, g);
        }
    /* TF32 against the reference's own rounding, and on chosen values */
    for (int tt = 0; tt < 4; tt++) {
        Case c = {CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, (tt & 2) != 0, (tt & 1) != 0, 33, 31,
                  70, 1, 1, CUBLASLT_EPILOGUE_DEFAULT, 1};
        run_case(c, g);
    }
    tf32_exact();
    bf16_exact();
    /* a larger one, to time */
    Case big = {CUDA_R_16BF, CUBLAS_COMPUTE_32F, false, true, 128, 768, 768, 1, 0,
                CUBLASLT_EPILOGUE_GELU_AUX_BIAS, 0};
    run_case(big, g);

    /* the heuristic returns at most what was asked for, distinct algorithms */
    {
        Small s;
        cublasLtMatmulPreference_t pref;
        LT(cublasLtMatmulPreferenceCreate(&pref));
        cublasLtMatmulHeuristicResult_t res[8];
        int found = 0;
        LT(cublasLtMatmulAlgoGetHeuristic(lt, s.desc, s.l, s.l, s.l, s.l, pref, 8, res, &found));
        bool distinct = found >= 2 && memcmp(&res[0].algo, &res[1].algo, sizeof res[0].algo) != 0;
        int one = 0;
        LT(cublasLtMatmulAlgoGetHeuristic(lt, s.desc, s.l, s.l, s.l, s.l, pref, 1, res, &one));
        check(found >= 1 && found <= 8 && distinct && one == 1,
              "heuristic: %d results for 8 asked (distinct: %d), %d for 1", found, distinct, one);
        LT(cublasLtMatmulPreferenceDestroy(pref));
    }
    LT(cublasLtDestroy(lt));
    printf("%d of %d checks failed\n", failures, checks);
    return failures ? 1 : 0;
}
