/*
 * test_gemm.c — the CPU backend's products against a double-precision
 * reference: fsdrt_gemm_bias (C = op(A)·op(B) + bias) on one thread, split
 * into row slabs and into column slabs over two OpenMP threads (each slab
 * fills its own part of C with the bias, so a wrong offset into the bias
 * shows), both transposes, an empty product (C is the bias) and a C whose
 * leading dimension is wider than N (the columns past N stay untouched);
 * and fsdrt_gemm with alpha and beta over the same splits.
 *
 * The products never touch the run unless their arguments are wrong (then
 * they report through it), so a zeroed FsdRun stands in for a started one.
 * Prints run.sh-style lines and "N passed, N failed".
 */
#include "fsdrt.h"
#include "internal.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static int pass, fail;

/* A deterministic value in [-1, 1). */
static float val(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / (float)(1u << 23) - 1.0f;
}

static float *filled(int64_t n, uint32_t seed)
{
    float *p = malloc(sizeof(float) * (size_t)n);
    if (!p) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++)
        p[i] = val(&seed);
    return p;
}

#define SENTINEL 12345.0f

/* One case: C[M, N] (ldc = N + pad) = alpha·op(A)·op(B) + (bias ? bias :
 * beta·C), checked element by element against the same sum in double,
 * within float rounding of Σ|a·b|; the pad columns must keep SENTINEL. */
static void run_case(FsdRun *r, const char *what, int threads, bool transA, bool transB,
                     int64_t M, int64_t N, int64_t K, bool with_bias, float alpha, float beta,
                     int64_t pad)
{
    omp_set_num_threads(threads);
    int64_t lda = transA ? M : K, ldb = transB ? K : N, ldc = N + pad;
    float *A = filled((transA ? K : M) * lda + 1, 11), *B = filled((transB ? N : K) * ldb + 1, 23);
    float *bias = filled(N, 37), *C = filled(M * ldc, 41), *C0 = malloc(sizeof(float) * (size_t)(M * ldc));
    if (!C0)
        exit(1);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++)
            C[i * ldc + j] = SENTINEL;
    for (int64_t i = 0; i < M * ldc; i++)
        C0[i] = C[i];
    if (with_bias)
        fsdrt_gemm_bias(r, transA, transB, M, N, K, A, lda, B, ldb, bias, C, ldc);
    else
        fsdrt_gemm(r, transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    double worst = 0;
    bool pad_kept = true;
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double a = transA ? A[k * lda + i] : A[i * lda + k];
                double b = transB ? B[j * ldb + k] : B[k * ldb + j];
                s += a * b;
                mag += fabs(a * b);
            }
            double want = with_bias ? s + bias[j] : alpha * s + beta * (double)C0[i * ldc + j];
            double tol = 1e-6 * (mag + 1) * (with_bias ? 1 : fabs(alpha) + fabs(beta));
            double err = fabs((double)C[i * ldc + j] - want) / tol;
            worst = err > worst ? err : worst;
        }
        for (int64_t j = N; j < ldc; j++)
            pad_kept &= C[i * ldc + j] == SENTINEL;
    }
    bool ok = worst <= 1 && pad_kept;
    printf("%s gemm: %s: %s M %lld N %lld K %lld on %d thread%s, trans %d%d%s (worst error %.2f of "
           "tolerance%s)\n",
           ok ? "ok  " : "FAIL", what, with_bias ? "C = op(A)·op(B) + bias" : "C = a·op(A)·op(B) + b·C",
           (long long)M, (long long)N, (long long)K, threads, threads == 1 ? "" : "s", transA,
           transB, pad ? ", ldc past N" : "", worst, pad_kept ? "" : "; a column past N was written");
    ok ? pass++ : fail++;
    free(A), free(B), free(bias), free(C), free(C0);
}

int main(void)
{
    FsdRun *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    /* the split happens from 4e6 multiply-adds on (cpu.c's GEMM_SPLIT_MIN):
     * rows when C has as many rows as columns, columns when it has few */
    run_case(r, "one BLAS call", 1, false, true, 24, 40, 32, true, 1, 0, 3);
    run_case(r, "row slabs", 2, false, true, 300, 128, 160, true, 1, 0, 5);
    run_case(r, "column slabs", 2, false, true, 8, 1000, 600, true, 1, 0, 0);
    run_case(r, "column slabs, uneven", 2, false, true, 7, 1001, 640, true, 1, 0, 2);
    run_case(r, "transposed operands", 2, true, false, 260, 130, 150, true, 1, 0, 1);
    run_case(r, "empty product", 2, false, true, 5, 9, 0, true, 1, 0, 2);
    run_case(r, "accumulating product, row slabs", 2, false, false, 300, 128, 160, false, 0.5f,
             2.0f, 3);
    run_case(r, "accumulating product, column slabs", 2, true, false, 8, 1000, 600, false, 1,
             1, 0);
    printf("%d passed, %d failed\n", pass, fail);
    free(r);
    return fail != 0;
}
