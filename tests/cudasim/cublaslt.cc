/*
 * cublaslt.cc — cudasim's cuBLASLt: the matrix products runtime/cuda_gemm.c asks
 * cuBLASLt for, computed on the host, queued on the caller's stream like the
 * real library's kernels (sim.h's sim_enqueue). A checker as much as a fake:
 * every call the real library would refuse, and every use its kernels could
 * silently get wrong, stops the run through sim_fail with the call's name
 * and what is wrong.
 *
 * What it computes (cublasLtMatmul): D = α·op(A)·op(B) + β·C, column-major,
 * op per the descriptor's TRANSA/TRANSB, then the epilogue: BIAS adds
 * bias[i] to row i of D; GELU_AUX_BIAS adds the bias, stores that sum to the
 * aux matrix (ld EPILOGUE_AUX_LD) and D = gelu of it, the tanh approximation
 * ½x(1 + tanh(√(2/π)(x + 0.044715x³))), the same gelu as templates/act.h and
 * GPT-2's. A, B, C, D are fp32 or bf16 (bf16 widened exactly, results
 * rounded to nearest even once, on store); products are summed in fp32, as
 * on the device; α and β are host floats (pointer mode HOST, scale type
 * 32F). CUBLAS_COMPUTE_32F_FAST_TF32 rounds A's and B's elements to TF32 (10
 * mantissa bits, to nearest with ties away from zero, as the tensor cores'
 * cvt.rna.tf32.f32) before multiplying; CUBLAS_COMPUTE_32F uses them as
 * they are. With β = 0, C is not read (it may hold NaN); C == D (in place)
 * is allowed: each element of C is read just before its D is written.
 *
 * What it checks, on top of every handle being live and every enum value
 * known: the shapes of op(A) (m × k), op(B) (k × n), C and D (m × n) agree;
 * ld ≥ rows; the data types are a combination cuBLASLt runs; every operand
 * is device memory over its whole extent (ld·(cols − 1) + rows elements),
 * when the call is made and again when the product runs (a buffer freed
 * while the product is queued is a fault on the device); outputs overlap no
 * input (C == D excepted); the algorithm came from
 * cublasLtMatmulAlgoGetHeuristic for the same epilogue, compute type and
 * data types, and the pointers are as aligned as that heuristic call was
 * told they would be (its preference's MIN_ALIGNMENT_*_BYTES; the bias's and
 * aux's alignment read from the descriptor's pointers, as the real heuristic
 * does): a kernel chosen for 16-byte operands may silently misbehave on
 * 8-byte ones. The choice is recorded in the algorithm's opaque data, which
 * is copied by value like the real one's.
 *
 * The descriptor's attributes, α and β are read when cublasLtMatmul is
 * called (runtime/cuda_gemm.c changes the bias and aux pointers between calls);
 * the operands' memory when the product runs on its stream.
 *
 * Build: C++17 with -fopenmp (the product's loops are OpenMP parallel
 * over D's columns, the k loop an OpenMP simd reduction).
 */
#include "cublasLt.h"
#include "half.h"   /* runtime/half.h: bf16, to nearest even */
#include "sim.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <map>
#include <mutex>
#include <vector>

/* The structs behind the header's handles. */
struct cublasLtContext {
    int unused;
};

struct cublasLtMatmulDescSim {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t transa, transb;        /* CUBLAS_OP_N or CUBLAS_OP_T */
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type;             /* -1: D's type */
    void *aux;
    int64_t aux_ld;
    int32_t aux_type;              /* -1: D's type */
};

struct cublasLtMatrixLayoutSim {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};

struct cublasLtMatmulPreferenceSim {
    uint64_t max_workspace;
    uint32_t align[4];             /* MIN_ALIGNMENT_{A,B,C,D}_BYTES */
};

namespace {

/* ── live handles ── */

enum Kind { K_HANDLE, K_DESC, K_LAYOUT, K_PREF };
const char *const kind_name[] = {"cuBLASLt handle", "matmul descriptor", "matrix layout",
                                 "matmul preference"};

std::mutex live_mu;
std::map<const void *, Kind> live;

void born(const void *p, Kind k)
{
    std::lock_guard<std::mutex> g(live_mu);
    live[p] = k;
}

/* Fails unless p is a live object of kind k; `what` names the argument. */
void need_live(const void *p, Kind k, const char *call, const char *what)
{
    std::lock_guard<std::mutex> g(live_mu);
    auto it = live.find(p);
    if (!p || it == live.end())
        sim_fail("%s: %s (%p) is not a live %s (never created, or destroyed)", call, what, p,
                 kind_name[k]);
    if (it->second != k)
        sim_fail("%s: %s (%p) is a %s, not a %s", call, what, p, kind_name[it->second],
                 kind_name[k]);
}

void died(const void *p, Kind k, const char *call)
{
    need_live(p, k, call, "the argument");
    std::lock_guard<std::mutex> g(live_mu);
    live.erase(p);
}

/* ── types ── */

const char *type_name(int32_t t)
{
    switch (t) {
    case CUDA_R_32F: return "CUDA_R_32F";
    case CUDA_R_16BF: return "CUDA_R_16BF";
    case CUDA_R_16F: return "CUDA_R_16F";
    case CUDA_R_64F: return "CUDA_R_64F";
    case -1: return "unset";
    default: return "an unknown cudaDataType";
    }
}

size_t elem_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

/* fp32 to TF32 (10 mantissa bits), to nearest, ties away from zero */
float round_tf32(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) != 0x7f800000u) {   /* finite */
        u += 0x1000u;
        u &= 0xffffe000u;
    }
    memcpy(&f, &u, sizeof f);
    return f;
}

float load(const void *p, cudaDataType_t t, size_t i)
{
    return t == CUDA_R_32F ? ((const float *)p)[i] : float_from_bf16(((const uint16_t *)p)[i]);
}

void store(void *p, cudaDataType_t t, size_t i, float v)
{
    if (t == CUDA_R_32F)
        ((float *)p)[i] = v;
    else
        ((uint16_t *)p)[i] = bf16_from_float(v);
}

const char *epilogue_name(uint32_t e)
{
    switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    default: return "another epilogue";
    }
}

/* the largest power of two (up to 4096) p is a multiple of; NULL: 4096 */
uint32_t addr_align(const void *p)
{
    uint32_t a = 4096;
    while (a > 1 && (uintptr_t)p % a)
        a /= 2;
    return a;
}

/* ── the problem a descriptor and four layouts describe ── */

struct Problem {
    int64_t m, n, k;
    bool ta, tb, tf32;
    cudaDataType_t ab_type, cd_type;
    int64_t lda, ldb, ldc, ldd;
    uint32_t epilogue;
    cudaDataType_t bias_type, aux_type;
    int64_t aux_ld;
    cublasComputeType_t compute;
};

/* Checks that desc and the layouts make one product cuBLASLt runs (and
 * cudasim simulates), and says which. */
Problem check_problem(const char *call, const cublasLtMatmulDescSim *d,
                      const cublasLtMatrixLayoutSim *A, const cublasLtMatrixLayoutSim *B,
                      const cublasLtMatrixLayoutSim *C, const cublasLtMatrixLayoutSim *D)
{
    Problem p;
    p.compute = d->compute;
    p.tf32 = d->compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    p.ta = d->transa == CUBLAS_OP_T;
    p.tb = d->transb == CUBLAS_OP_T;
    if (A->type != B->type)
        sim_fail("%s: A is %s but B is %s; cuBLASLt wants one type for both", call,
                 type_name(A->type), type_name(B->type));
    if (C->type != D->type)
        sim_fail("%s: C is %s but D is %s; cuBLASLt wants one type for both", call,
                 type_name(C->type), type_name(D->type));
    p.ab_type = A->type;
    p.cd_type = D->type;
    if (p.ab_type == CUDA_R_32F && p.cd_type != CUDA_R_32F)
        sim_fail("%s: fp32 A and B with %s C and D is not a combination cuBLASLt runs", call,
                 type_name(p.cd_type));
    if (p.tf32 && p.ab_type != CUDA_R_32F)
        sim_fail("%s: CUBLAS_COMPUTE_32F_FAST_TF32 takes fp32 A and B, not %s", call,
                 type_name(p.ab_type));

    /* D is m × n; op(A) m × k; op(B) k × n; C as D */
    p.m = (int64_t)D->rows;
    p.n = (int64_t)D->cols;
    const int64_t ar = (int64_t)A->rows, ac = (int64_t)A->cols;
    const int64_t br = (int64_t)B->rows, bc = (int64_t)B->cols;
    const int64_t am = p.ta ? ac : ar, ak = p.ta ? ar : ac;
    const int64_t bk = p.tb ? bc : br, bn = p.tb ? br : bc;
    p.k = ak;
    if (C->rows != D->rows || C->cols != D->cols)
        sim_fail("%s: C is %llu x %llu but D is %llu x %llu", call, (unsigned long long)C->rows,
                 (unsigned long long)C->cols, (unsigned long long)D->rows,
                 (unsigned long long)D->cols);
    if (am != p.m || bn != p.n || bk != p.k)
        sim_fail("%s: op(A) is %lld x %lld (A %llu x %llu, trans %c) and op(B) %lld x %lld "
                 "(B %llu x %llu, trans %c), which do not make D %lld x %lld",
                 call, (long long)am, (long long)ak, (unsigned long long)A->rows,
                 (unsigned long long)A->cols, p.ta ? 'T' : 'N', (long long)bk, (long long)bn,
                 (unsigned long long)B->rows, (unsigned long long)B->cols, p.tb ? 'T' : 'N',
                 (long long)p.m, (long long)p.n);
    p.lda = A->ld;
    p.ldb = B->ld;
    p.ldc = C->ld;
    p.ldd = D->ld;

    p.epilogue = d->epilogue;
    p.bias_type = d->bias_type == -1 ? p.cd_type : (cudaDataType_t)d->bias_type;
    p.aux_type = d->aux_type == -1 ? p.cd_type : (cudaDataType_t)d->aux_type;
    p.aux_ld = d->aux_ld;
    if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT && p.bias_type != p.cd_type)
        sim_fail("%s: the bias is %s but D is %s; cuBLASLt's bias has D's type", call,
                 type_name(p.bias_type), type_name(p.cd_type));
    if (p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        if (p.aux_type != p.cd_type)
            sim_fail("%s: the GELU aux matrix is %s but D is %s; cuBLASLt's has D's type", call,
                     type_name(p.aux_type), type_name(p.cd_type));
        if (p.aux_ld < p.m || p.aux_ld % 8 != 0)
            sim_fail("%s: EPILOGUE_AUX_LD is %lld; GELU_AUX_BIAS wants a multiple of 8 no less "
                     "than D's %lld rows", call, (long long)p.aux_ld, (long long)p.m);
    }
    return p;
}

/* ── the heuristic's choice, in cublasLtMatmulAlgo_t's opaque data ──
 *
 * data[0] a mark, [1] the algorithm's number, [2] the epilogue, [3] the
 * compute type and the four data types, [4] the alignments A, B, C, D were
 * promised (16 bits each), [5] the bias's and aux's, [6] the preference's
 * workspace limit, [7] a checksum of the rest. */
const uint64_t ALGO_MARK = 0x6375646173696d4cull;   /* "cudasimL" */
const int ALGOS = 3;                                 /* the fake algorithms offered */

uint64_t algo_sum(const cublasLtMatmulAlgo_t *a)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 7; i++)
        h = (h ^ a->data[i]) * 1099511628211ull;
    return h;
}

uint64_t types_word(const Problem &p)
{
    return (uint64_t)p.compute | (uint64_t)p.ab_type << 16 | (uint64_t)p.cd_type << 32;
}

struct AlgoRecord {
    int id;
    uint32_t epilogue;
    uint64_t types;
    uint32_t align[6];   /* A, B, C, D, bias, aux */
    uint64_t max_workspace;
};

cublasLtMatmulAlgo_t algo_make(const AlgoRecord &r)
{
    cublasLtMatmulAlgo_t a;
    a.data[0] = ALGO_MARK;
    a.data[1] = (uint64_t)r.id;
    a.data[2] = r.epilogue;
    a.data[3] = r.types;
    a.data[4] = (uint64_t)r.align[0] | (uint64_t)r.align[1] << 16 | (uint64_t)r.align[2] << 32 |
                (uint64_t)r.align[3] << 48;
    a.data[5] = (uint64_t)r.align[4] | (uint64_t)r.align[5] << 16;
    a.data[6] = r.max_workspace;
    a.data[7] = algo_sum(&a);
    return a;
}

AlgoRecord algo_read(const cublasLtMatmulAlgo_t *a, const char *call)
{
    if (!a)
        sim_fail("%s: no algorithm (NULL); runtime/cuda_gemm.c passes the heuristic's choice", call);
    if (a->data[0] != ALGO_MARK || a->data[7] != algo_sum(a))
        sim_fail("%s: the algorithm was not returned by cublasLtMatmulAlgoGetHeuristic (or was "
                 "changed since)", call);
    AlgoRecord r;
    r.id = (int)a->data[1];
    r.epilogue = (uint32_t)a->data[2];
    r.types = a->data[3];
    for (int i = 0; i < 4; i++)
        r.align[i] = (uint32_t)(a->data[4] >> (16 * i)) & 0xffff;
    r.align[4] = (uint32_t)a->data[5] & 0xffff;
    r.align[5] = (uint32_t)(a->data[5] >> 16) & 0xffff;
    r.max_workspace = a->data[6];
    return r;
}

/* ── the product, on the host ── */

struct Matmul {
    Problem p;
    float alpha, beta;
    const void *A, *B, *C, *bias;
    void *D, *aux;
};

size_t extent(int64_t ld, int64_t rows, int64_t cols)   /* elements */
{
    return (size_t)(ld * (cols - 1) + rows);
}

/* The operands' device memory, checked when the call is made and again
 * when the product runs. */
void need_operands(const Matmul &mm, const char *when)
{
    const Problem &p = mm.p;
    char what[96];
    const size_t ab = elem_bytes(p.ab_type), cd = elem_bytes(p.cd_type);
    snprintf(what, sizeof what, "cublasLtMatmul (%s): A", when);
    sim_need_device(mm.A, extent(p.lda, p.ta ? p.k : p.m, p.ta ? p.m : p.k) * ab, what);
    snprintf(what, sizeof what, "cublasLtMatmul (%s): B", when);
    sim_need_device(mm.B, extent(p.ldb, p.tb ? p.n : p.k, p.tb ? p.k : p.n) * ab, what);
    if (mm.beta != 0) {
        snprintf(what, sizeof what, "cublasLtMatmul (%s): C (beta != 0)", when);
        sim_need_device(mm.C, extent(p.ldc, p.m, p.n) * cd, what);
    }
    snprintf(what, sizeof what, "cublasLtMatmul (%s): D", when);
    sim_need_device(mm.D, extent(p.ldd, p.m, p.n) * cd, what);
    if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        snprintf(what, sizeof what, "cublasLtMatmul (%s): the bias (%lld elements)", when,
                 (long long)p.m);
        sim_need_device(mm.bias, (size_t)p.m * elem_bytes(p.bias_type), what);
    }
    if (p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
        snprintf(what, sizeof what, "cublasLtMatmul (%s): the GELU aux matrix", when);
        sim_need_device(mm.aux, extent(p.aux_ld, p.m, p.n) * elem_bytes(p.aux_type), what);
    }
}

float gelu(float x)
{
    const float k = 0.7978845608028654f, c = 0.044715f;   /* √(2/π) */
    return 0.5f * x * (1.0f + tanhf(k * (x + c * x * x * x)));
}

void run_matmul(const Matmul &mm)
{
    need_operands(mm, "when it ran");
    const Problem &p = mm.p;
    const int64_t m = p.m, n = p.n, k = p.k;
    /* op(A) as m rows of k, op(B) as n columns of k, both widened (and
     * TF32-rounded) floats, so the k loop reads contiguous memory */
    std::vector<float> a((size_t)(m * k)), b((size_t)(n * k));
#pragma omp parallel for schedule(static)
    for (int64_t kk = 0; kk < k; kk++)
        for (int64_t i = 0; i < m; i++) {
            const int64_t at = p.ta ? kk + i * p.lda : i + kk * p.lda;   /* op(A)(i, kk) */
            const float v = load(mm.A, p.ab_type, (size_t)at);
            a[(size_t)(i * k + kk)] = p.tf32 ? round_tf32(v) : v;
        }
#pragma omp parallel for schedule(static)
    for (int64_t kk = 0; kk < k; kk++)
        for (int64_t j = 0; j < n; j++) {
            const int64_t at = p.tb ? j + kk * p.ldb : kk + j * p.ldb;   /* op(B)(kk, j) */
            const float v = load(mm.B, p.ab_type, (size_t)at);
            b[(size_t)(j * k + kk)] = p.tf32 ? round_tf32(v) : v;
        }
    const float *ap = a.data(), *bp = b.data();
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; j++) {
        const float *bj = bp + j * k;
        for (int64_t i = 0; i < m; i++) {
            const float *ai = ap + i * k;
            float acc = 0;
#pragma omp simd reduction(+ : acc)
            for (int64_t kk = 0; kk < k; kk++)
                acc += ai[kk] * bj[kk];
            float x = mm.alpha * acc;
            if (mm.beta != 0)   /* β = 0: C is not read */
                x += mm.beta * load(mm.C, p.cd_type, (size_t)(i + j * p.ldc));
            if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
                x += load(mm.bias, p.bias_type, (size_t)i);
            if (p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                store(mm.aux, p.aux_type, (size_t)(i + j * p.aux_ld), x);
                x = gelu(x);
            }
            store(mm.D, p.cd_type, (size_t)(i + j * p.ldd), x);
        }
    }
}

/* [p, p + bytes) and [q, q + qbytes) share a byte */
bool overlap(const void *p, size_t bytes, const void *q, size_t qbytes)
{
    const uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return p && q && a < b + qbytes && b < a + bytes;
}

/* An output that overlaps an input is a race between the device's threads
 * (C == D with D's layout excepted: cuBLASLt's in-place product). */
void check_overlaps(const Matmul &mm)
{
    const Problem &p = mm.p;
    const size_t ab = elem_bytes(p.ab_type), cd = elem_bytes(p.cd_type);
    struct Span {
        const char *name;
        const void *p;
        size_t bytes;
    };
    const Span in[] = {
        {"A", mm.A, extent(p.lda, p.ta ? p.k : p.m, p.ta ? p.m : p.k) * ab},
        {"B", mm.B, extent(p.ldb, p.tb ? p.n : p.k, p.tb ? p.k : p.n) * ab},
        {"C", mm.beta != 0 ? mm.C : nullptr, extent(p.ldc, p.m, p.n) * cd},
        {"the bias", p.epilogue != CUBLASLT_EPILOGUE_DEFAULT ? mm.bias : nullptr,
         (size_t)p.m * elem_bytes(p.bias_type)},
    };
    const Span out[] = {
        {"D", mm.D, extent(p.ldd, p.m, p.n) * cd},
        {"the GELU aux matrix", p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? mm.aux : nullptr,
         extent(p.aux_ld, p.m, p.n) * elem_bytes(p.aux_type)},
    };
    for (const Span &o : out)
        for (const Span &i : in) {
            if (&o == &out[0] && &i == &in[2] && mm.C == mm.D && p.ldc == p.ldd)
                continue;   /* in place */
            if (overlap(o.p, o.bytes, i.p, i.bytes))
                sim_fail("cublasLtMatmul: %s (%p, %zu bytes) overlaps %s (%p, %zu bytes)%s",
                         o.name, o.p, o.bytes, i.name, i.p, i.bytes,
                         &i == &in[2] && mm.C == mm.D
                             ? "; in place needs C's leading dimension to be D's"
                             : "");
        }
    if (overlap(out[0].p, out[0].bytes, out[1].p, out[1].bytes))
        sim_fail("cublasLtMatmul: D and the GELU aux matrix overlap");
}

bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

template <typename T>
T attr_value(const void *buf, size_t size, const char *call, const char *attr)
{
    if (!buf)
        sim_fail("%s: %s: no value (NULL buffer)", call, attr);
    if (size != sizeof(T))
        sim_fail("%s: %s takes %zu bytes, not %zu", call, attr, sizeof(T), size);
    T v;
    memcpy(&v, buf, sizeof v);
    return v;
}

} // namespace

/* ── the API ── */

extern "C" {

const char *cublasLtGetStatusString(cublasStatus_t status)
{
    switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "<unrecognized cublasStatus_t>";
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *lightHandle)
{
    if (!lightHandle)
        sim_fail("cublasLtCreate: NULL handle pointer");
    *lightHandle = new cublasLtContext();
    born(*lightHandle, K_HANDLE);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle)
{
    died(lightHandle, K_HANDLE, "cublasLtDestroy");
    delete lightHandle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType)
{
    const char *call = "cublasLtMatmulDescCreate";
    if (!matmulDesc)
        sim_fail("%s: NULL descriptor pointer", call);
    if (computeType != CUBLAS_COMPUTE_32F && computeType != CUBLAS_COMPUTE_32F_FAST_TF32)
        sim_fail("%s: compute type %d is not one cudasim simulates (CUBLAS_COMPUTE_32F, "
                 "CUBLAS_COMPUTE_32F_FAST_TF32)", call, (int)computeType);
    if (scaleType != CUDA_R_32F)
        sim_fail("%s: scale type %s with a 32F compute type; cuBLASLt wants CUDA_R_32F", call,
                 type_name(scaleType));
    cublasLtMatmulDescSim *d = new cublasLtMatmulDescSim();
    d->compute = computeType;
    d->scale = scaleType;
    d->transa = d->transb = CUBLAS_OP_N;
    d->epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    d->bias = nullptr;
    d->bias_type = -1;
    d->aux = nullptr;
    d->aux_ld = 0;
    d->aux_type = -1;
    *matmulDesc = d;
    born(d, K_DESC);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc)
{
    died(matmulDesc, K_DESC, "cublasLtMatmulDescDestroy");
    delete matmulDesc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sizeInBytes)
{
    const char *call = "cublasLtMatmulDescSetAttribute";
    need_live(matmulDesc, K_DESC, call, "the descriptor");
    cublasLtMatmulDescSim *d = matmulDesc;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE: {
        int32_t v = attr_value<int32_t>(buf, sizeInBytes, call, "COMPUTE_TYPE");
        if (v != CUBLAS_COMPUTE_32F && v != CUBLAS_COMPUTE_32F_FAST_TF32)
            sim_fail("%s: COMPUTE_TYPE %d is not one cudasim simulates", call, (int)v);
        d->compute = (cublasComputeType_t)v;
        break;
    }
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE: {
        int32_t v = attr_value<int32_t>(buf, sizeInBytes, call, "SCALE_TYPE");
        if (v != CUDA_R_32F)
            sim_fail("%s: SCALE_TYPE %s; cuBLASLt wants CUDA_R_32F with a 32F compute type",
                     call, type_name(v));
        d->scale = CUDA_R_32F;
        break;
    }
    case CUBLASLT_MATMUL_DESC_POINTER_MODE: {
        int32_t v = attr_value<int32_t>(buf, sizeInBytes, call, "POINTER_MODE");
        if (v != CUBLASLT_POINTER_MODE_HOST)
            sim_fail("%s: POINTER_MODE %d: cudasim simulates only CUBLASLT_POINTER_MODE_HOST",
                     call, (int)v);
        break;
    }
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        const char *name = attr == CUBLASLT_MATMUL_DESC_TRANSA ? "TRANSA" : "TRANSB";
        int32_t v = attr_value<int32_t>(buf, sizeInBytes, call, name);
        if (v != CUBLAS_OP_N && v != CUBLAS_OP_T)
            sim_fail("%s: %s %d: not CUBLAS_OP_N or CUBLAS_OP_T", call, name, (int)v);
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->transa : d->transb) = v;
        break;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        uint32_t v = attr_value<uint32_t>(buf, sizeInBytes, call, "EPILOGUE");
        if (v != CUBLASLT_EPILOGUE_DEFAULT && v != CUBLASLT_EPILOGUE_BIAS &&
            v != CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
            sim_fail("%s: EPILOGUE %u: cudasim simulates DEFAULT, BIAS and GELU_AUX_BIAS", call,
                     (unsigned)v);
        d->epilogue = v;
        break;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        d->bias = attr_value<const void *>(buf, sizeInBytes, call, "BIAS_POINTER");
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
        d->aux = attr_value<void *>(buf, sizeInBytes, call, "EPILOGUE_AUX_POINTER");
        break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
        d->aux_ld = attr_value<int64_t>(buf, sizeInBytes, call, "EPILOGUE_AUX_LD");
        break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE: {
        const bool bias = attr == CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE;
        const char *name = bias ? "BIAS_DATA_TYPE" : "EPILOGUE_AUX_DATA_TYPE";
        int32_t v = attr_value<int32_t>(buf, sizeInBytes, call, name);
        if (v != -1 && v != CUDA_R_32F && v != CUDA_R_16BF)
            sim_fail("%s: %s %d (%s): cudasim simulates CUDA_R_32F and CUDA_R_16BF", call, name,
                     (int)v, type_name(v));
        (bias ? d->bias_type : d->aux_type) = v;
        break;
    }
    default:
        sim_fail("%s: attribute %d is not one cudasim simulates (see cublaslt.cc)", call,
                 (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld)
{
    const char *call = "cublasLtMatrixLayoutCreate";
    if (!matLayout)
        sim_fail("%s: NULL layout pointer", call);
    if (type != CUDA_R_32F && type != CUDA_R_16BF)
        sim_fail("%s: type %d (%s): cudasim simulates CUDA_R_32F and CUDA_R_16BF", call,
                 (int)type, type_name(type));
    if (rows == 0 || cols == 0 || rows > (uint64_t)INT64_MAX / 2 || cols > (uint64_t)INT64_MAX / 2)
        sim_fail("%s: a %llu x %llu matrix; cudasim wants at least one row and column", call,
                 (unsigned long long)rows, (unsigned long long)cols);
    if (ld < 1 || (uint64_t)ld < rows)
        sim_fail("%s: leading dimension %lld for %llu rows (column-major: ld >= rows, >= 1)",
                 call, (long long)ld, (unsigned long long)rows);
    cublasLtMatrixLayoutSim *l = new cublasLtMatrixLayoutSim();
    l->type = type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    *matLayout = l;
    born(l, K_LAYOUT);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout)
{
    died(matLayout, K_LAYOUT, "cublasLtMatrixLayoutDestroy");
    delete matLayout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        sim_fail("cublasLtMatmulPreferenceCreate: NULL preference pointer");
    cublasLtMatmulPreferenceSim *p = new cublasLtMatmulPreferenceSim();
    p->max_workspace = 0;   /* the documented defaults */
    for (uint32_t &a : p->align)
        a = 256;
    *pref = p;
    born(p, K_PREF);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    died(pref, K_PREF, "cublasLtMatmulPreferenceDestroy");
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void *buf, size_t sizeInBytes)
{
    const char *call = "cublasLtMatmulPreferenceSetAttribute";
    need_live(pref, K_PREF, call, "the preference");
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
        pref->max_workspace = attr_value<uint64_t>(buf, sizeInBytes, call, "MAX_WORKSPACE_BYTES");
        break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: {
        const int i = attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES;
        const uint32_t v = attr_value<uint32_t>(buf, sizeInBytes, call, "MIN_ALIGNMENT_*_BYTES");
        if (!is_pow2(v) || v > 4096)
            sim_fail("%s: MIN_ALIGNMENT_%c_BYTES %u is not a power of two up to 4096", call,
                     "ABCD"[i], (unsigned)v);
        pref->align[i] = v;
        break;
    }
    default:
        sim_fail("%s: attribute %d is not one cudasim simulates (see cublaslt.cc)", call,
                 (int)attr);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t lightHandle,
                                              cublasLtMatmulDesc_t operationDesc,
                                              cublasLtMatrixLayout_t Adesc,
                                              cublasLtMatrixLayout_t Bdesc,
                                              cublasLtMatrixLayout_t Cdesc,
                                              cublasLtMatrixLayout_t Ddesc,
                                              cublasLtMatmulPreference_t preference,
                                              int requestedAlgoCount,
                                              cublasLtMatmulHeuristicResult_t heuristicResultsArray[],
                                              int *returnAlgoCount)
{
    const char *call = "cublasLtMatmulAlgoGetHeuristic";
    need_live(lightHandle, K_HANDLE, call, "the handle");
    need_live(operationDesc, K_DESC, call, "operationDesc");
    need_live(Adesc, K_LAYOUT, call, "Adesc");
    need_live(Bdesc, K_LAYOUT, call, "Bdesc");
    need_live(Cdesc, K_LAYOUT, call, "Cdesc");
    need_live(Ddesc, K_LAYOUT, call, "Ddesc");
    need_live(preference, K_PREF, call, "preference");
    if (requestedAlgoCount < 1 || !heuristicResultsArray || !returnAlgoCount)
        sim_fail("%s: %d results asked for, into %p, count to %p", call, requestedAlgoCount,
                 (void *)heuristicResultsArray, (void *)returnAlgoCount);
    const Problem p = check_problem(call, operationDesc, Adesc, Bdesc, Cdesc, Ddesc);
    AlgoRecord r;
    r.epilogue = p.epilogue;
    r.types = types_word(p);
    for (int i = 0; i < 4; i++)
        r.align[i] = preference->align[i];
    /* the bias's and aux's alignment: read from the descriptor's pointers
     * (as cuBLASLt's heuristic does), counted up to 256 bytes as the
     * preference's defaults */
    const void *bias = p.epilogue != CUBLASLT_EPILOGUE_DEFAULT ? operationDesc->bias : nullptr;
    const void *aux = p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? operationDesc->aux : nullptr;
    r.align[4] = bias ? (addr_align(bias) < 256 ? addr_align(bias) : 256) : 1;
    r.align[5] = aux ? (addr_align(aux) < 256 ? addr_align(aux) : 256) : 1;
    r.max_workspace = preference->max_workspace;
    const int n = requestedAlgoCount < ALGOS ? requestedAlgoCount : ALGOS;
    for (int i = 0; i < n; i++) {
        cublasLtMatmulHeuristicResult_t *h = &heuristicResultsArray[i];
        memset(h, 0, sizeof *h);
        r.id = i;
        h->algo = algo_make(r);
        h->workspaceSize = 0;
        h->state = CUBLAS_STATUS_SUCCESS;
        h->wavesCount = 1.0f;
    }
    *returnAlgoCount = n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                              const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                              void *workspace, size_t workspaceSizeInBytes, cudaStream_t stream)
{
    const char *call = "cublasLtMatmul";
    need_live(lightHandle, K_HANDLE, call, "the handle");
    need_live(computeDesc, K_DESC, call, "computeDesc");
    need_live(Adesc, K_LAYOUT, call, "Adesc");
    need_live(Bdesc, K_LAYOUT, call, "Bdesc");
    need_live(Cdesc, K_LAYOUT, call, "Cdesc");
    need_live(Ddesc, K_LAYOUT, call, "Ddesc");
    Matmul mm;
    mm.p = check_problem(call, computeDesc, Adesc, Bdesc, Cdesc, Ddesc);
    const Problem &p = mm.p;
    const AlgoRecord r = algo_read(algo, call);
    if (r.epilogue != p.epilogue || r.types != types_word(p))
        sim_fail("%s: the algorithm was chosen for epilogue %s, compute type %d, A/B %s, C/D %s; "
                 "this call is epilogue %s, compute type %d, A/B %s, C/D %s", call,
                 epilogue_name(r.epilogue), (int)(r.types & 0xffff),
                 type_name((int32_t)(r.types >> 16 & 0xffff)),
                 type_name((int32_t)(r.types >> 32 & 0xffff)), epilogue_name(p.epilogue),
                 (int)p.compute, type_name(p.ab_type), type_name(p.cd_type));

    /* α and β: host floats, read now (pointer mode HOST) */
    if (!alpha || !beta)
        sim_fail("%s: alpha (%p) or beta (%p) is NULL", call, alpha, beta);
    if (sim_kind(alpha) == SIM_DEVICE || sim_kind(beta) == SIM_DEVICE)
        sim_fail("%s: alpha (%p) or beta (%p) is device memory, but the pointer mode is HOST",
                 call, alpha, beta);
    memcpy(&mm.alpha, alpha, sizeof mm.alpha);
    memcpy(&mm.beta, beta, sizeof mm.beta);
    mm.A = A;
    mm.B = B;
    mm.C = C;
    mm.D = D;
    mm.bias = computeDesc->bias;
    mm.aux = computeDesc->aux;
    if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !mm.bias)
        sim_fail("%s: epilogue %s with no BIAS_POINTER", call, epilogue_name(p.epilogue));
    if (p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS && !mm.aux)
        sim_fail("%s: epilogue GELU_AUX_BIAS with no EPILOGUE_AUX_POINTER", call);
    need_operands(mm, "when called");
    check_overlaps(mm);

    /* every pointer as aligned as the heuristic was told; at least to its
     * element */
    const struct {
        const char *name;
        const void *ptr;
        uint32_t promised;
        size_t elem;
    } al[] = {
        {"A", A, r.align[0], elem_bytes(p.ab_type)},
        {"B", B, r.align[1], elem_bytes(p.ab_type)},
        {"C", mm.beta != 0 ? C : nullptr, r.align[2], elem_bytes(p.cd_type)},
        {"D", D, r.align[3], elem_bytes(p.cd_type)},
        {"the bias", p.epilogue != CUBLASLT_EPILOGUE_DEFAULT ? mm.bias : nullptr, r.align[4],
         elem_bytes(p.bias_type)},
        {"the GELU aux matrix", p.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? mm.aux : nullptr,
         r.align[5], elem_bytes(p.aux_type)},
    };
    for (const auto &x : al) {
        if (!x.ptr)
            continue;
        const uint32_t have = addr_align(x.ptr);
        if (have < x.elem)
            sim_fail("%s: %s (%p) is not aligned to its %zu-byte elements", call, x.name, x.ptr,
                     x.elem);
        if (have < x.promised)
            sim_fail("%s: %s (%p) is aligned to %u bytes, but the algorithm was chosen "
                     "(cublasLtMatmulAlgoGetHeuristic) for %s aligned to %u (%s); its kernel "
                     "may misread it", call, x.name, x.ptr, (unsigned)have, x.name,
                     (unsigned)x.promised,
                     &x - al < 4 ? "the preference's MIN_ALIGNMENT"
                                 : "read from the descriptor's pointer when it chose");
    }

    /* the workspace: the algorithms need none, but what is handed over must
     * be device memory; cudasim also holds the call to the size the
     * heuristic was told (stricter than cuBLASLt, which takes more) */
    if (workspaceSizeInBytes > r.max_workspace)
        sim_fail("%s: a %zu-byte workspace, but the heuristic chose the algorithm for at most "
                 "%llu (MAX_WORKSPACE_BYTES)", call, workspaceSizeInBytes,
                 (unsigned long long)r.max_workspace);
    if (workspaceSizeInBytes)
        sim_need_device(workspace, workspaceSizeInBytes, "cublasLtMatmul: the workspace");

    sim_enqueue(stream, "cublasLtMatmul", [mm]() { run_matmul(mm); });
    return CUBLAS_STATUS_SUCCESS;
}

} // extern "C"
