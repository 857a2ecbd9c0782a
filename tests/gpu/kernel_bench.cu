/*
 * kernel_bench.cu — times the GPU's elementwise, row and column-sum kernels
 * (templates/), each scalar kernel against its 16-byte vector version (X_v,
 * portable.h's FSD_VEC), at GPT-2 124M's shapes: B·T = 8192 rows, widths 768
 * and 3072 (the MLP), vocabulary 50304 (cross entropy), bf16 tensors
 * (-DFSD_ACT_BF16). tests/gpu/lib.sh builds it (kernel_bench_build) and
 * runs it as the GPU check's section 8, from the repository or a pack.
 *
 * Each kernel runs 3 times to warm up, then 20 times between two CUDA
 * events on the default stream; a line gives both paths' milliseconds a
 * launch, the bandwidth that makes of the bytes the kernel must read and
 * write (inputs read once, outputs written once, an acc output read too:
 * the least it can move), and the scalar/vector ratio. The two paths'
 * outputs are then compared on the device: elementwise kernels, bias_add,
 * the column sums and cross_entropy_bwd must give the same bits (a
 * difference fails); the norms' outputs and the log-sum-exp may differ in
 * the last bits (their row sums add in another order), which the line says.
 *
 * It calls the kernels' run macros (FSD_RUN_ROWS, FSD_RUN_VEC_ROWS, ...)
 * directly rather than the launchers, which would pick the vector path for
 * these aligned buffers every time. Times are printed, never judged: the
 * exit status is 0 unless a CUDA call fails (the launch checks abort with
 * the call's message) or a bit-for-bit pair differs.
 */
#define FSD_STREAM 0
#include "portable.h"
#include "norm.h"
#include "act.h"
#include "elementwise.h"
#include "cross_entropy.h"

#include <cstdio>
#include <cstdlib>

#ifndef FSD_VEC
#error "kernel_bench.cu needs the CUDA build (FSD_VEC)"
#endif

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) {                                                       \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,          \
                         cudaGetErrorString(e_));                                      \
            std::exit(2);                                                              \
        }                                                                              \
    } while (0)

static const int64_t R = 8192, C = 768, F = 3072, V = 50304;
static const int WARMUP = 3, REPS = 20;

/* act values in [lo, hi) from a hash of the index: no host copy needed */
static __global__ void fill_kernel(act *p, int64_t n, uint32_t seed, float lo, float hi)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = fsd_narrow(lo + (hi - lo) * (float)(h >> 8) * (1.0f / 16777216.0f));
    }
}

/* elements of a and b whose bits differ, into *count */
static __global__ void diff_kernel(const act *a, const act *b, int64_t n,
                                   unsigned long long *count)
{
    unsigned long long c = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const unsigned char *x = (const unsigned char *)&a[i], *y = (const unsigned char *)&b[i];
        bool same = true;
        for (size_t k = 0; k < sizeof(act); k++)
            same = same && x[k] == y[k];
        c += !same;
    }
    if (c)
        atomicAdd(count, c);
}

static act *new_act(int64_t n, uint32_t seed, float lo, float hi)
{
    act *p;
    CHECK(cudaMalloc(&p, sizeof(act) * (size_t)n));
    fill_kernel<<<1024, 256>>>(p, n, seed, lo, hi);
    CHECK(cudaGetLastError());
    return p;
}

static real *new_real(int64_t n, float value)
{
    real *p;
    CHECK(cudaMalloc(&p, sizeof(real) * (size_t)n));
    real *h = (real *)std::malloc(sizeof(real) * (size_t)n);
    if (!h) {
        std::fprintf(stderr, "kernel_bench: out of host memory\n");
        std::exit(2);
    }
    for (int64_t i = 0; i < n; i++)
        h[i] = value;
    CHECK(cudaMemcpy(p, h, sizeof(real) * (size_t)n, cudaMemcpyHostToDevice));
    std::free(h);
    return p;
}

/* One kernel: its two paths (run(vec)), the bytes it must move, and the
 * output compared after a run of each path (out, n; zeroed first when the
 * kernel accumulates into it). */
struct Bench {
    const char *name, *shape;
    double bytes;
    bool bits;   /* the two paths must give the same bits */
    act *out;
    int64_t n;
    bool zero_first;
    void (*run)(bool vec);
};

static act *xf, *yf, *dyf, *dxf, *xc, *yc, *sc, *dyc, *dxc, *wc, *biasc, *dbc, *dwc, *dbf;
static act *logits, *dlogits;
static real *mean, *rstd, *lse;
static int32_t *targets;

static void run_add(bool v)
{
    if (v)
        FSD_RUN_VEC_ELEMS(add_same_v, R * C, (yc, xc, dyc));
    else
        FSD_RUN_ELEMS(add_same, R * C, (yc, xc, dyc));
}
static void run_gelu_fwd(bool v)
{
    if (v)
        FSD_RUN_VEC_ELEMS(gelu_fwd_v, R * F, (yf, xf));
    else
        FSD_RUN_ELEMS(gelu_fwd, R * F, (yf, xf));
}
static void run_gelu_bwd(bool v)
{
    if (v)
        FSD_RUN_VEC_ELEMS(gelu_bwd_v, R * F, (dxf, false, dyf, xf));
    else
        FSD_RUN_ELEMS(gelu_bwd, R * F, (dxf, false, dyf, xf));
}
static void run_copy(bool v)
{
    if (v)
        FSD_RUN_VEC_ELEMS(copy_v, R * C, (dxc, true, dyc));
    else
        FSD_RUN_ELEMS(copy, R * C, (dxc, true, dyc));
}
static void run_bias_add(bool v)
{
    if (v)
        FSD_RUN_VEC_ROWS(bias_add_v, R, F, (yf, xf, dyf, F));
    else
        FSD_RUN_ROWS(bias_add, R, F, (yf, xf, dyf, F));
}
/* a column reduction's two passes (portable.h), pass 1 by the path asked */
static void run_bias_bwd_c(bool v)
{
    const fsd_col_plan p = fsd_col_plan_of(R, C, true, dbc, NULL);
    if (v)
        FSD_RUN_VEC_ELEMS(reduce_to_v, p.chunks * C, (p, dyc, C));
    else
        FSD_RUN_ELEMS(reduce_to, p.chunks * C, (p, dyc, C));
    fsd_col_finish(p);
}
static void run_bias_bwd_f(bool v)
{
    const fsd_col_plan p = fsd_col_plan_of(R, F, true, dbf, NULL);
    if (v)
        FSD_RUN_VEC_ELEMS(reduce_to_v, p.chunks * F, (p, dyf, F));
    else
        FSD_RUN_ELEMS(reduce_to, p.chunks * F, (p, dyf, F));
    fsd_col_finish(p);
}
static void run_ln_fwd(bool v)
{
    if (v)
        FSD_RUN_VEC_ROWS(layernorm_fwd_v, R, C, (yc, mean, rstd, xc, wc, biasc, C, (real)1e-5));
    else
        FSD_RUN_ROWS(layernorm_fwd, R, C, (yc, mean, rstd, xc, wc, biasc, C, (real)1e-5));
}
static void run_add_ln(bool v)
{
    if (v)
        FSD_RUN_VEC_ROWS(add_layernorm_fwd_v, R, C,
                         (sc, yc, mean, rstd, xc, dyc, wc, biasc, C, (real)1e-5, true));
    else
        FSD_RUN_ROWS(add_layernorm_fwd, R, C, (sc, yc, mean, rstd, xc, dyc, wc, biasc, C, (real)1e-5));
}
static void run_ln_bwd(bool v)
{
    if (v) {
        FSD_RUN_VEC_ROWS(layernorm_bwd_v, R, C, (dxc, false, dyc, xc, wc, mean, rstd, C));
        layernorm_bwd_params_sums(true, dwc, dbc, dyc, xc, mean, rstd, R, C);
    } else {
        FSD_RUN_ROWS(layernorm_bwd, R, C, (dxc, false, dyc, xc, wc, mean, rstd, C));
        layernorm_bwd_params_sums(false, dwc, dbc, dyc, xc, mean, rstd, R, C);
    }
}
static void run_ln_params(bool v)
{
    layernorm_bwd_params_sums(v, dwc, dbc, dyc, xc, mean, rstd, R, C);
}
static void run_ce_lse(bool v)
{
    if (v)
        FSD_RUN_VEC_ROWS(cross_entropy_lse_v, R, V, (lse, logits, V));
    else
        FSD_RUN_ROWS(cross_entropy_lse, R, V, (lse, logits, V));
}
static void run_ce_bwd(bool v)
{
    const real scale = (real)(1.0 / (double)R);
    if (v)
        FSD_RUN_VEC_ROWS(cross_entropy_bwd_v, R, V, (dlogits, false, logits, targets, lse, V, scale));
    else
        FSD_RUN_ROWS(cross_entropy_bwd, R, V, (dlogits, false, logits, targets, lse, V, scale));
}

/* milliseconds a launch, over REPS launches after WARMUP */
static float time_ms(void (*run)(bool), bool vec, cudaEvent_t t0, cudaEvent_t t1)
{
    for (int i = 0; i < WARMUP; i++)
        run(vec);
    CHECK(cudaEventRecord(t0, 0));
    for (int i = 0; i < REPS; i++)
        run(vec);
    CHECK(cudaEventRecord(t1, 0));
    CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, t0, t1));
    return ms / REPS;
}

/* the output of one run of one path, in keep */
static void run_once(const Bench &b, bool vec, act *keep)
{
    if (b.zero_first)
        CHECK(cudaMemset(b.out, 0, sizeof(act) * (size_t)b.n));
    b.run(vec);
    CHECK(cudaMemcpy(keep, b.out, sizeof(act) * (size_t)b.n, cudaMemcpyDeviceToDevice));
}

int main(void)
{
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    std::printf("kernel_bench: %s, act %s (%d B), FSD_VEC %d; %d launches after %d, ms a launch\n",
                prop.name, sizeof(act) == 2 ? "bf16" : "float", (int)sizeof(act), FSD_VEC, REPS,
                WARMUP);

    const double A = (double)sizeof(act), RC = (double)R * C, RF = (double)R * F;
    const double RV = (double)R * V, P = (double)sizeof(real);
    xf = new_act(R * F, 1, -3, 3), yf = new_act(R * F, 2, -1, 1);
    dyf = new_act(R * F, 3, -1, 1), dxf = new_act(R * F, 4, -1, 1);
    xc = new_act(R * C, 5, -2, 3), yc = new_act(R * C, 7, -1, 1);
    sc = new_act(R * C, 8, -1, 1), dyc = new_act(R * C, 9, -1, 1), dxc = new_act(R * C, 10, -1, 1);
    wc = new_act(C, 11, 0.5f, 1.5f), biasc = new_act(C, 12, -0.5f, 0.5f);
    dbc = new_act(C, 13, 0, 0), dwc = new_act(C, 14, 0, 0), dbf = new_act(F, 15, 0, 0);
    logits = new_act(R * V, 16, -4, 4), dlogits = new_act(R * V, 17, -1, 1);
    mean = new_real(R, 0.25f), rstd = new_real(R, 0.9f), lse = new_real(R, 11.0f);
    int32_t *ht = (int32_t *)std::malloc(sizeof(int32_t) * (size_t)R);
    if (!ht) {
        std::fprintf(stderr, "kernel_bench: out of host memory\n");
        return 2;
    }
    for (int64_t r = 0; r < R; r++)
        ht[r] = (int32_t)((r * 7919) % V);
    CHECK(cudaMalloc(&targets, sizeof(int32_t) * (size_t)R));
    CHECK(cudaMemcpy(targets, ht, sizeof(int32_t) * (size_t)R, cudaMemcpyHostToDevice));
    std::free(ht);
    /* the statistics the backward kernels read: a forward's */
    run_ln_fwd(false);
    run_ce_lse(false);
    CHECK(cudaDeviceSynchronize());

    /* a column reduction's partials (portable.h, fsd_col_part: written by
     * pass 1, read by pass 2) count too: per output and column of [R, C] */
    const int64_t chunk = fsd_col_chunk_rows(R, C, 2);
    const double part_c = 2.0 * P * (double)((R + chunk - 1) / chunk) * C;
    const Bench benches[] = {
        {"add_same", "8192x768", 3 * A * RC, true, yc, R * C, false, run_add},
        {"gelu_fwd", "8192x3072", 2 * A * RF, true, yf, R * F, false, run_gelu_fwd},
        {"gelu_bwd", "8192x3072", 3 * A * RF, true, dxf, R * F, false, run_gelu_bwd},
        {"copy (acc)", "8192x768", 3 * A * RC, true, dxc, R * C, true, run_copy},
        {"bias_add_fwd", "8192x3072", 2 * A * RF, true, yf, R * F, false, run_bias_add},
        {"bias_bwd", "8192x768", A * RC + part_c, true, dbc, C, true, run_bias_bwd_c},
        {"bias_bwd", "8192x3072", A * RF + 4 * part_c, true, dbf, F, true, run_bias_bwd_f},
        {"layernorm_fwd", "8192x768", 2 * A * RC, false, yc, R * C, false, run_ln_fwd},
        {"add_layernorm_fwd", "8192x768", 4 * A * RC, false, yc, R * C, false, run_add_ln},
        {"layernorm_bwd dx+dw,db", "8192x768", 5 * A * RC + 2 * part_c, false, dxc, R * C, false,
         run_ln_bwd},
        {"layernorm_bwd dw,db", "8192x768", 2 * A * RC + 2 * part_c, true, dwc, C, true,
         run_ln_params},
        {"cross_entropy lse", "8192x50304", A * RV, true, logits, 0, false, run_ce_lse},
        {"cross_entropy_bwd", "8192x50304", 2 * A * RV, true, dlogits, R * V, false, run_ce_bwd},
    };
    const int nb = (int)(sizeof benches / sizeof benches[0]);

    cudaEvent_t t0, t1;
    CHECK(cudaEventCreate(&t0));
    CHECK(cudaEventCreate(&t1));
    act *keep0, *keep1;
    CHECK(cudaMalloc(&keep0, sizeof(act) * (size_t)(R * V)));
    CHECK(cudaMalloc(&keep1, sizeof(act) * (size_t)(R * V)));
    unsigned long long *count;
    CHECK(cudaMalloc(&count, sizeof *count));

    std::printf("%-24s %-11s %10s %8s %10s %8s %8s  %s\n", "kernel", "shape", "scalar ms", "GB/s",
                "vector ms", "GB/s", "speed-up", "outputs");
    int failed = 0;
    for (int i = 0; i < nb; i++) {
        const Bench &b = benches[i];
        float ms_s = time_ms(b.run, false, t0, t1);
        float ms_v = time_ms(b.run, true, t0, t1);
        char cmp[96] = "(lse: statistics, not compared)";
        if (b.n > 0) {
            run_once(b, false, keep0);
            run_once(b, true, keep1);
            CHECK(cudaMemset(count, 0, sizeof *count));
            diff_kernel<<<1024, 256>>>(keep0, keep1, b.n, count);
            CHECK(cudaGetLastError());
            unsigned long long diff = 0;
            CHECK(cudaMemcpy(&diff, count, sizeof diff, cudaMemcpyDeviceToHost));
            if (diff == 0)
                std::snprintf(cmp, sizeof cmp, "same bits");
            else if (b.bits)
                std::snprintf(cmp, sizeof cmp, "DIFFER in %llu of %ld elements (must not)", diff,
                              (long)b.n);
            else
                std::snprintf(cmp, sizeof cmp, "%llu of %ld elements differ (row sums' order)",
                              diff, (long)b.n);
            failed += diff != 0 && b.bits;
        }
        std::printf("%-24s %-11s %10.4f %8.0f %10.4f %8.0f %7.2fx  %s\n", b.name, b.shape, ms_s,
                    b.bytes / (ms_s * 1e6), ms_v, b.bytes / (ms_v * 1e6), ms_s / ms_v, cmp);
    }
    CHECK(cudaDeviceSynchronize());
    std::printf("kernel_bench: %d kernels timed, %d with outputs that differ where they must "
                "not\n", nb, failed);
    return failed ? 1 : 0;
}
