/*
 * blas.c — the matrix-product library behind the CPU backend, in one place.
 *
 * The library is chosen when the runtime is built (the Makefile's BLAS=,
 * docs/performance.md#choosing-the-blas): OpenBLAS (the default, and
 * always the float64 runtime's), oneDNN (FSD_BLAS_DNNL: its dnnl_sgemm;
 * it has no double product, so the float64 runtime keeps OpenBLAS) or MKL
 * (FSD_BLAS_MKL). Everything else in the runtime, and the emitted
 * attention kernel, multiplies through fsdrt_blas_gemm: one call, on the
 * calling thread. The library never starts threads of its own: the
 * runtime splits a large product over its OpenMP threads itself
 * (cpu.c, gemm_slabs), and the attention kernel calls from inside its own
 * OpenMP loops; a library pool beside OpenMP's would spin against it.
 * tools/blasbench.c builds this file alone to time and check each library.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L   /* setenv */
#endif
#include "fsdrt.h"

#include <stdlib.h>
#include <string.h>

#if defined(FSD_BLAS_DNNL) && !defined(FSD_FLOAT64)
#define BLAS_DNNL 1
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#elif defined(FSD_BLAS_MKL)
#define BLAS_MKL 1
#include <mkl.h>
#else
#define BLAS_OPENBLAS 1
#include <cblas.h>
#endif

const char *fsdrt_blas_name(void)
{
#if BLAS_DNNL
    return "oneDNN";
#elif BLAS_MKL
    return "MKL";
#else
    return "OpenBLAS";
#endif
}

/* The library on one thread, before the first product. oneDNN (Debian's
 * is built on OpenMP) takes as many threads as omp_get_max_threads() at
 * each call made outside a parallel region, so fsdrt_blas_gemm lowers that
 * to 1 around its call. */
void fsdrt_blas_single_thread(void)
{
#if BLAS_OPENBLAS
    openblas_set_num_threads(1);
#elif BLAS_MKL
    mkl_set_threading_layer(MKL_THREADING_SEQUENTIAL);
#endif
}

void fsdrt_blas_gemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, real alpha,
                     const real *A, int64_t lda, const real *B, int64_t ldb, real beta, real *C,
                     int64_t ldc)
{
#if BLAS_DNNL
    int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
    if (threads > 1)
        omp_set_num_threads(1);
    dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C,
               ldc);
    if (threads > 1)
        omp_set_num_threads(threads);
#else
#ifdef FSD_FLOAT64
    cblas_dgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
#else
    cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
                (int)M, (int)N, (int)K, alpha, A, (int)lda, B, (int)ldb, beta, C, (int)ldc);
#endif
#endif
}

/* OpenBLAS's DYNAMIC_ARCH builds (Debian's) pick their kernels when the
 * library loads, from the CPU's family and model number. A CPU newer than
 * the library, or a VM that reports an unfamiliar model, falls back to
 * "Prescott": SSE3 kernels, about 10x slower than the AVX-512 ones on an
 * AVX-512 machine (docs/performance.md). OPENBLAS_CORETYPE overrides the
 * choice but is read only at load: when the user has not set it, the
 * library chose a core without AVX2 and the CPU has AVX2 and FMA, it is set
 * to the widest core the CPU runs (and cpu.c's restart_tuned starts the
 * program again). Returns whether it set it. The other libraries choose
 * their kernels at each call. */
bool fsdrt_blas_tune_core(void)
{
#if BLAS_OPENBLAS && defined(__x86_64__) && defined(__linux__)
    static const char *const pre_avx2[] = {
        "Prescott", "Core2",      "Penryn",    "Dunnington", "Nehalem",   "Atom",
        "Katmai",   "Coppermine", "Northwood", "Banias",     "Sandybridge",
        "Barcelona", "Opteron",   "Opteron_SSE3", "Bobcat",
    };
    if (getenv("OPENBLAS_CORETYPE"))
        return false;
    const char *core = openblas_get_corename();
    bool weak = false;
    for (size_t i = 0; core && i < sizeof pre_avx2 / sizeof *pre_avx2; i++)
        weak = weak || strcmp(core, pre_avx2[i]) == 0;
    __builtin_cpu_init();
    if (!weak || !__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return false;
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
    return setenv("OPENBLAS_CORETYPE", avx512 ? "SkylakeX" : "Haswell", 1) == 0;
#else
    return false;
#endif
}
