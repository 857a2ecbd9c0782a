/*
 * blasbench.c — checks and times runtime/blas.c against one library
 * (tools/blas.sh builds it once per library: `make blas-bench`, and the
 * checks in make test).
 *
 *     blasbench LIB check    products of every transpose, alpha and beta,
 *                            leading dimension and size class against a
 *                            float64 reference, on the calling thread and
 *                            from inside an OpenMP loop; exit 1 on a miss
 *     blasbench LIB time     one thread: the bench models' products
 *                            (forward, dx, dw of each Linear) and the
 *                            attention kernel's block products, best of 5
 *                            timings with hot caches; one line per model
 *
 * LIB only names the library in the output: which one runs is how this
 * program was built (FSD_BLAS_DNNL, FSD_BLAS_MKL, or OpenBLAS's cblas).
 */
#include "fsdrt.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float *floats(int64_t n)
{
    float *p = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    if (!p) {
        fprintf(stderr, "blasbench: out of memory (%lld floats)\n", (long long)n);
        exit(2);
    }
    return p;
}

/* deterministic values in [-1, 1) */
static void fill(float *p, int64_t n, uint32_t seed)
{
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / (float)(1u << 23) - 1.0f;
    }
}

/* ── check ── */

static int misses;

/* One product against float64: C = alpha·op(A)·op(B) + beta·C with
 * leading dimensions pad wider than the rows; beta 0 must not read C
 * (it holds NaN). Returns the largest error relative to sum |terms|. */
static double check_one(bool ta, bool tb, int M, int N, int K, float alpha, float beta, int pad)
{
    int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    int64_t na = (int64_t)(ta ? K : M) * lda, nb = (int64_t)(tb ? N : K) * ldb,
            nc = (int64_t)M * ldc;
    float *A = floats(na), *B = floats(nb), *C = floats(nc), *C0 = floats(nc);
    fill(A, na, 1u + (uint32_t)M);
    fill(B, nb, 7u + (uint32_t)N);
    fill(C0, nc, 13u + (uint32_t)K);
    if (beta == 0)
        for (int64_t i = 0; i < nc; i++)
            C0[i] = NAN;
    memcpy(C, C0, sizeof(float) * (size_t)nc);
    fsdrt_blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(int64_t)k * lda + i] : A[(int64_t)i * lda + k];
                double b = tb ? B[(int64_t)j * ldb + k] : B[(int64_t)k * ldb + j];
                s += a * b;
                mag += fabs(a * b);
            }
            double want = alpha * s, scale = fabs(alpha) * mag;
            if (beta != 0) {
                want += beta * C0[(int64_t)i * ldc + j];
                scale += fabs(beta * C0[(int64_t)i * ldc + j]);
            }
            double err = fabs(C[(int64_t)i * ldc + j] - want) / (scale > 0 ? scale : 1);
            if (!(err <= worst))
                worst = isnan(err) ? INFINITY : err;
        }
    /* the padding between rows of C is not written */
    for (int i = 0; i < M; i++)
        for (int j = N; j < ldc; j++)
            if (memcmp(&C[(int64_t)i * ldc + j], &C0[(int64_t)i * ldc + j], sizeof(float)))
                worst = INFINITY;
    free(A);
    free(B);
    free(C);
    free(C0);
    return worst;
}

static void check(const char *lib)
{
    static const int sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {64, 128, 64}, {128, 64, 257},
                                   {200, 33, 96}};
    static const float ab[][2] = {{1, 0}, {0.5f, 1}, {-2, 0.25f}};
    const int threads = omp_get_max_threads();
    int n = 0;
    double worst = 0;
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
        for (int t = 0; t < 4; t++)
            for (size_t k = 0; k < sizeof ab / sizeof *ab; k++) {
                double e = check_one(t & 1, t & 2, sizes[s][0], sizes[s][1], sizes[s][2],
                                     ab[k][0], ab[k][1], (int)(s % 3));
                worst = e > worst ? e : worst;
                if (!(e < 1e-5)) {
                    printf("FAIL blas %s: %dx%dx%d %c%c alpha %g beta %g: error %.2e\n", lib,
                           sizes[s][0], sizes[s][1], sizes[s][2], t & 1 ? 'T' : 'N',
                           t & 2 ? 'T' : 'N', ab[k][0], ab[k][1], e);
                    misses++;
                }
                n++;
            }
    if (worst < 1e-5)
        printf("ok blas %s (%s): %d products against float64, largest error %.1e\n", lib,
               fsdrt_blas_name(), n, worst);

    /* from inside an OpenMP loop, as the attention kernel calls it, and the
     * thread count the calls so far left behind */
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int i = 0; i < 8; i++)
        bad += !(check_one(i & 1, i & 2, 64 + i, 48, 80, 1, i & 4 ? 1 : 0, 1) < 1e-5);
    if (bad || omp_get_max_threads() != threads) {
        printf("FAIL blas %s: products inside an OpenMP loop: %d wrong, threads %d -> %d\n", lib,
               bad, threads, omp_get_max_threads());
        misses++;
    } else
        printf("ok blas %s: products inside an OpenMP loop, %d threads left as they were\n", lib,
               threads);
}

/* ── time ── */

/* seconds of the fastest of 5 timings of >= 20 ms each */
static double best_time(bool ta, bool tb, int M, int N, int K, const float *A, const float *B,
                        float *C)
{
    int lda = ta ? M : K, ldb = tb ? K : N;
    fsdrt_blas_gemm(ta, tb, M, N, K, 1, A, lda, B, ldb, 0, C, N);
    double best = INFINITY;
    for (int rep = 0; rep < 5; rep++) {
        int it = 0;
        double t0 = now(), t;
        do {
            fsdrt_blas_gemm(ta, tb, M, N, K, 1, A, lda, B, ldb, 0, C, N);
            it++;
        } while ((t = now() - t0) < 0.02);
        best = t / it < best ? t / it : best;
    }
    return best;
}

/* the bench models (bench/bench.py): rows of a step's batch, width, vocab */
static const struct {
    const char *name;
    int rows, dim, vocab, seq, hd;
} models[] = {
    {"tiny", 512, 64, 256, 64, 16},
    {"gpt4x256", 1024, 256, 512, 128, 64},
    {"gpt6x384", 2048, 384, 256, 256, 64},
    {"gpt2_124m", 256, 768, 50304, 64, 64},
};

static void time_all(const char *lib)
{
    for (size_t m = 0; m < sizeof models / sizeof *models; m++) {
        const int R = models[m].rows, d = models[m].dim, T = models[m].seq, hd = models[m].hd;
        /* Linear in → out: qkv, proj, fc, fc2, head */
        const int io[][2] = {{d, 3 * d}, {d, d}, {d, 4 * d}, {4 * d, d}, {d, models[m].vocab}};
        int64_t most = 0;
        for (int s = 0; s < 5; s++) {
            int64_t x = (int64_t)(R > io[s][1] ? R : io[s][1]) * (io[s][0] > R ? io[s][0] : R);
            most = x > most ? x : most;
        }
        float *A = floats(most), *B = floats(most), *C = floats(most);
        fill(A, most, 3);
        fill(B, most, 5);
        double secs = 0, flops = 0, attn_secs = 0, attn_flops = 0;
        for (int s = 0; s < 5; s++) {
            const int in = io[s][0], out = io[s][1];
            /* forward X·Wᵀ, dX = dY·W, dW = dYᵀ·X */
            secs += best_time(false, true, R, out, in, A, B, C) +
                    best_time(false, false, R, in, out, A, B, C) +
                    best_time(true, false, out, in, R, A, B, C);
            flops += 3 * 2.0 * R * in * out;
        }
        /* the attention kernel's blocks (templates/attention_cpu.h): 64 query
         * rows against T keys of one head: S = Q·Kᵀ (Kᵀ copied), O = P·V,
         * dP = dO·Vᵀ (Vᵀ copied), dK = dSᵀ·Q */
        const int qb = 64 < T ? 64 : T;
        attn_secs = best_time(false, false, qb, T, hd, A, B, C) +
                    best_time(false, false, qb, hd, T, A, B, C) +
                    best_time(false, false, qb, T, hd, A, B, C) +
                    best_time(true, false, T, hd, qb, A, B, C);
        attn_flops = 4 * 2.0 * qb * T * hd;
        printf("blas %-8s %-10s products %9.3f ms %6.1f GFLOP/s   attention blocks %7.3f ms %6.1f "
               "GFLOP/s\n",
               lib, models[m].name, 1e3 * secs, flops / secs * 1e-9, 1e3 * attn_secs,
               attn_flops / attn_secs * 1e-9);
        fflush(stdout);
        free(A);
        free(B);
        free(C);
    }
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "check") && strcmp(argv[2], "time"))) {
        fprintf(stderr, "usage: blasbench LIB check|time\n");
        return 2;
    }
    fsdrt_blas_single_thread();
    check(argv[1]);
    if (!strcmp(argv[2], "time") && !misses)
        time_all(argv[1]);
    return misses ? 1 : 0;
}
