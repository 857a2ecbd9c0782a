/*
 * test_gemm.c — the CPU backend's products against a double-precision
 * reference: fsdrt_gemm_bias (C = op(A)·op(B) + bias) on one thread, split
 * into row slabs and into column slabs over two OpenMP threads (each slab
 * fills its own part of C with the bias, so a wrong offset into the bias
 * shows), both transposes, an empty product (C is the bias) and a C whose
 * leading dimension is wider than N (the columns past N stay untouched);
 * and fsdrt_gemm with alpha and beta over the same splits.
 *
 * Then the same for a model whose act is bf16: A, B, C and the bias hold
 * bf16 values and C must be the exact product rounded to bf16 once, so
 * within half a bf16 ulp of the double reference (plus fp32's rounding of
 * the sum); a product rounded twice (the bias or beta·C added after a first
 * rounding) is off by up to a whole ulp and fails. A product large enough
 * to be widened in several blocks of rows checks the blocks' offsets.
 *
 * The products use nothing of the run but its model's act dtype, the
 * backend's scratch and, when their arguments are wrong, its error path, so
 * a zeroed FsdRun with the backend started (MPI alone, one process) stands
 * in for a started one. Prints run.sh-style lines and "N passed, N failed".
 */
#include "fsdrt.h"
#include "half.h"
#include "internal.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pass, fail;

/* A deterministic value in [-1, 1). */
static float val(uint32_t *s)
{
    *s = *s * 1664525u + 1013904223u;
    return (float)(*s >> 8) / (float)(1u << 23) - 1.0f;
}

static void *alloc_or_die(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_gemm: out of memory\n");
        exit(1);
    }
    return p;
}

/* n values in [-1, 1), rounded to bf16 when the case stores bf16 (so the
 * reference multiplies exactly what the product reads). */
static float *filled(int64_t n, uint32_t seed, bool bf16)
{
    float *p = alloc_or_die(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        p[i] = val(&seed);
        if (bf16)
            p[i] = float_from_bf16(bf16_from_float(p[i]));
    }
    return p;
}

/* v as the product stores it: floats, or bf16 bits. */
static void *stored(const float *v, int64_t n, bool bf16)
{
    void *p = alloc_or_die((bf16 ? 2 : sizeof(float)) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        if (bf16)
            ((uint16_t *)p)[i] = bf16_from_float(v[i]);
        else
            ((float *)p)[i] = v[i];
    }
    return p;
}

static double load(const void *p, int64_t i, bool bf16)
{
    return bf16 ? float_from_bf16(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Half a bf16 ulp at magnitude x: bf16 keeps 8 significant bits. */
static double bf16_half_ulp(double x)
{
    int e;
    frexp(x, &e);
    return x == 0 ? 0 : ldexp(1, e - 9);
}

/* exact in bf16 as in float */
#define SENTINEL 12288.0f

static const FsdModel fp32_model = {.name = "fp32", .act_dtype = FSD_FP32};
static const FsdModel bf16_model = {.name = "bf16", .act_dtype = FSD_BF16};

/* One case: C[M, N] (ldc = N + pad) = alpha·op(A)·op(B) + (bias ? bias :
 * beta·C), in the act dtype bf16 or fp32, checked element by element
 * against the same sum in double: within float rounding of Σ|a·b| for
 * fp32, and within half a bf16 ulp more for bf16; the pad columns must keep
 * SENTINEL. */
static void run_case(FsdRun *r, bool bf16, const char *what, int threads, bool transA,
                     bool transB, int64_t M, int64_t N, int64_t K, bool with_bias, float alpha,
                     float beta, int64_t pad)
{
    omp_set_num_threads(threads);
    r->m = bf16 ? &bf16_model : &fp32_model;
    int64_t lda = transA ? M : K, ldb = transB ? K : N, ldc = N + pad;
    int64_t na = (transA ? K : M) * lda + 1, nb = (transB ? N : K) * ldb + 1;
    float *A = filled(na, 11, bf16), *B = filled(nb, 23, bf16), *bias = filled(N, 37, bf16);
    float *C0 = filled(M * ldc, 41, bf16);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = N; j < ldc; j++)
            C0[i * ldc + j] = SENTINEL;
    void *sA = stored(A, na, bf16), *sB = stored(B, nb, bf16), *sbias = stored(bias, N, bf16);
    void *C = stored(C0, M * ldc, bf16);
    if (with_bias)
        fsdrt_gemm_bias(r, transA, transB, M, N, K, sA, lda, sB, ldb, sbias, C, ldc);
    else
        fsdrt_gemm(r, transA, transB, M, N, K, alpha, sA, lda, sB, ldb, beta, C, ldc);
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
            if (bf16)
                tol += bf16_half_ulp(fabs(want) + tol);
            double err = fabs(load(C, i * ldc + j, bf16) - want) / tol;
            worst = err > worst ? err : worst;
        }
        for (int64_t j = N; j < ldc; j++)
            pad_kept &= load(C, i * ldc + j, bf16) == SENTINEL;
    }
    bool ok = worst <= 1 && pad_kept;
    printf("%s gemm: %s%s: %s M %lld N %lld K %lld on %d thread%s, trans %d%d%s (worst error %.2f "
           "of tolerance%s)\n",
           ok ? "ok  " : "FAIL", bf16 ? "bf16, " : "", what,
           with_bias ? "C = op(A)·op(B) + bias" : "C = a·op(A)·op(B) + b·C", (long long)M,
           (long long)N, (long long)K, threads, threads == 1 ? "" : "s", transA, transB,
           pad ? ", ldc past N" : "", worst, pad_kept ? "" : "; a column past N was written");
    ok ? pass++ : fail++;
    free(A), free(B), free(bias), free(C0), free(sA), free(sB), free(sbias), free(C);
}

int main(int argc, char **argv)
{
    FsdRun *r = calloc(1, sizeof *r);
    if (!r)
        return 1;
    r->m = &fp32_model;
    if (!bk_start(r, &argc, &argv)) {
        fprintf(stderr, "test_gemm: %s\n", r->err);
        return 1;
    }
    /* the split happens from 4e6 multiply-adds on (cpu.c's GEMM_SPLIT_MIN):
     * rows when C has as many rows as columns, columns when it has few */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        run_case(r, bf16, "one BLAS call", 1, false, true, 24, 40, 32, true, 1, 0, 3);
        run_case(r, bf16, "row slabs", 2, false, true, 300, 128, 160, true, 1, 0, 5);
        run_case(r, bf16, "column slabs", 2, false, true, 8, 1000, 600, true, 1, 0, 0);
        run_case(r, bf16, "column slabs, uneven", 2, false, true, 7, 1001, 640, true, 1, 0, 2);
        run_case(r, bf16, "transposed operands", 2, true, false, 260, 130, 150, true, 1, 0, 1);
        run_case(r, bf16, "empty product", 2, false, true, 5, 9, 0, true, 1, 0, 2);
        run_case(r, bf16, "accumulating product, row slabs", 2, false, false, 300, 128, 160, false,
                 0.5f, 2.0f, 3);
        run_case(r, bf16, "accumulating product, column slabs", 2, true, false, 8, 1000, 600,
                 false, 1, 1, 0);
        run_case(r, bf16, "empty accumulating product", 1, true, false, 6, 10, 0, false, 1, 0.5f,
                 1);
    }
    /* cpu.c widens bf16 operands 2^22 elements of op(A) and C at a time:
     * 521 rows here, so three blocks, the last short */
    run_case(r, true, "blocks of rows", 2, true, false, 1100, 8000, 16, true, 1, 0, 1);
    run_case(r, true, "accumulating, blocks of rows", 2, false, true, 1100, 8000, 16, false, 0.5f,
             -1.0f, 0);
    printf("%d passed, %d failed\n", pass, fail);
    bk_stop(r);
    free(r);
    return fail != 0;
}
