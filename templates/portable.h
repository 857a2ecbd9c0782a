/*
 * portable.h — the layer that lets one kernel source serve both backends.
 *
 * fsdpc pastes the kernel templates the model uses into train.cu after
 * `#include "fsdrt.h"` and this file; the same text then builds with nvcc
 * (CUDA) and with a C compiler (CPU backend, OpenMP). Every kernel is
 * written once, as a DEVICE body that does one unit of work, in one of
 * four shapes (docs/design.md#kernels):
 *
 *   row     NAME_row(row, lane, lanes, ...): one row, with loops strided by
 *           lane over its columns and fsd_warp_sum / fsd_warp_max to
 *           combine the lanes. The GPU runs one warp (32 lanes) per row;
 *           the CPU runs each row as a "warp" of one lane, where the
 *           reductions are the identity, on an OpenMP thread.
 *   elem    NAME_elem(i, ...): one element; a grid-stride loop on the GPU,
 *           an OpenMP loop on the CPU.
 *   cols    NAME_cols(j0, j1, ...): columns [j0, j1), each walked over all
 *           rows by one worker: one column per GPU thread, tiles of
 *           FSD_COL_TILE columns per CPU iteration (so a thread walks rows
 *           with unit-stride inner loops). The second pass of the column
 *           sums below.
 *   sum     NAME_sum(r0, r1, j0, j1, s, ls, ...): a column reduction's
 *           body: adds rows [r0, r1) of columns [j0, j1) of each of its
 *           outputs k (at most FSD_COL_OUTS) into real s[k·ls + j − j0],
 *           each column in row order. Each backend runs it from a plain
 *           function of its own, NAME_sums (RUNNER), which stores the sums
 *           with fsd_store; the launcher calls NAME_sums whatever the
 *           backend. The CPU's sums all rows of a span of up to
 *           FSD_COL_SPAN columns and stores them (fsd_col_span,
 *           fsd_col_store). The GPU's splits the rows into chunks
 *           (fsd_col_plan_of): pass 1, an elem kernel NAME with a thread per
 *           (chunk, column) (fsd_col_item_of, fsd_col_item_end), writes the
 *           chunk's sums to partial rows in fsd_col_part; pass 2
 *           (fsd_col_finish), a thread per column and output, adds the
 *           chunks in order and stores (one thread per column walking all
 *           rows is latency-bound). Either way each column is summed in a
 *           fixed order that depends on the sizes alone: not on the thread
 *           count, and no atomics are needed; the GPU's order differs from
 *           the CPU's.
 *
 * A fifth shape is the GPU's alone (and its emulation in the tests, with
 * FSD_BLOCK_EMULATION): the CPU build has none, so a family that uses it
 * keeps a CPU path of its own (attention.h):
 *
 *   block   NAME_block(blk, tid, smem, ...): tile blk, done together by
 *           the FSD_BLOCK threads of a block, which share `smem` (static
 *           __shared__ memory) and meet at fsd_block_sync();
 *           FSD_BLOCK_KERNEL + FSD_RUN_BLOCKS.
 *
 * FSD_ROW_KERNEL / FSD_ELEM_KERNEL / FSD_COL_KERNEL write the __global__
 * wrapper of a body under CUDA (nothing on the CPU); FSD_RUN_ROWS /
 * FSD_RUN_ELEMS / FSD_RUN_COLS, used in the launchers, start it: a launch
 * (checked) on the GPU, an OpenMP loop calling the body on the CPU. Rows
 * and columns come with the elements each touches (FSD_RUN_ROWS(name,
 * rows, width, args), FSD_RUN_COLS(name, cols, height, args)): the CPU runs
 * a loop on the calling thread when rows × width (cols × height, or an elem
 * loop's count) is below FSD_PAR_MIN_ELEMS (runtime/fsdrt.h,
 * docs/performance.md#small-ops-on-one-thread); the GPU ignores it. A body
 * must not return early on some lanes only: every lane of a warp reaches
 * every warp reduction.
 *
 * On the GPU (and in its emulation) the kernels whose layout allows it
 * have a second version X_v beside X that loads and stores 16 bytes a
 * thread (FSD_VEC elements: "16-byte vectors" below); a launcher takes it
 * when its pointers are 16-byte aligned and its counts multiples of
 * FSD_VEC (FSD_VEC_WHEN), through FSD_RUN_VEC_ELEMS or FSD_RUN_VEC_ROWS (a
 * column reduction's pass 1 is an elem kernel too: fsd_col_vitem_end).
 *
 * Launchers (one per kernel, named after the op in compiler/ops.def) take
 * plain pointers and int64_t sizes, check them, and abort through
 * fsd_kernel_fail on a violated assumption: that is a bug of the emitter,
 * not a user error. On CUDA they launch on FSD_STREAM (default: stream 0),
 * which the program may define before this file.
 */
#ifndef FSD_PORTABLE_H
#define FSD_PORTABLE_H

#ifndef FSDRT_H
#include "fsdrt.h"   /* real: float, or double with -DFSD_FLOAT64 */
#endif

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#ifndef __CUDACC_RTC__   /* NVRTC (fsdpc --verify) has no C library */
#include <string.h>   /* memcpy: bit casts the vectoriser understands, and the CUDA host's */
#endif

/* Splices a parenthesised list: FSD_UNPAREN (a, b) is a, b. */
#define FSD_UNPAREN(...) __VA_ARGS__

/* ── math on `real` ── */
#ifdef FSD_FLOAT64
#define fsd_exp exp
#define fsd_log log
#define fsd_sqrt sqrt
#define fsd_tanh tanh
#define fsd_pow pow
#define fsd_cos cos
#define fsd_sin sin
#define fsd_fmax fmax
#else
#define fsd_exp expf
#define fsd_log logf
#define fsd_sqrt sqrtf
#define fsd_tanh tanhf
#define fsd_pow powf
#define fsd_cos cosf
#define fsd_sin sinf
#define fsd_fmax fmaxf
#endif

/* A launcher: host code, static (train.cu holds each family once), marked
 * unused because a family's other launchers often are (nvcc warns). */
#define LAUNCHER static inline __attribute__((unused))
/* A launcher's helper that starts kernels (a column reduction's NAME_sums):
 * host code compiled as a launcher is, so that on the CPU its OpenMP region
 * is vectorised for each instruction set (LAUNCHER's target_clones, below),
 * and fsdpc --verify follows a launcher's call to it (compiler/verify.c). */
#define RUNNER LAUNCHER

/* A launcher's assumption did not hold: says which and stops. */
static inline void fsd_kernel_fail(const char *kernel, const char *what)
{
    fprintf(stderr, "fsdpc kernel %s: %s\n", kernel, what);
    fflush(stderr);
    abort();
}

/* FSD_REQUIRE(kernel, cond): a launcher's argument check. */
#define FSD_REQUIRE(kernel, cond)                     \
    do {                                              \
        if (!(cond))                                  \
            fsd_kernel_fail(kernel, "need " #cond);   \
    } while (0)

#ifdef __CUDACC__
/* ════════════════════════════ CUDA ════════════════════════════ */

#define DEVICE __device__ inline
#define FSD_WARP 32
#define FSD_COL_TILE 1        /* one column per thread: coalesced row walks */
#define FSD_ROW_THREADS 128   /* 4 warps, 4 rows per block */
#define FSD_ELEM_THREADS 256
#ifndef FSD_STREAM
#define FSD_STREAM 0
#endif

/* Sum and max over the 32 lanes of a warp. The xor butterfly leaves the
 * same bits in every lane (each step adds a pair in both orders, and
 * addition commutes exactly), so lanes agree on what they branch on. */
DEVICE real fsd_warp_sum(real v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
DEVICE double fsd_warp_sum_f64(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
DEVICE real fsd_warp_max(real v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fsd_fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* A device-side check failed (an index out of range): the launch fails
 * and the next checked CUDA call reports it. */
DEVICE void fsd_trap(void) { __trap(); }

/* Blocks for `work` items at `per_block` a block; grid-stride loops take
 * what a capped grid leaves. */
static inline unsigned fsd_blocks(int64_t work, int64_t per_block)
{
    int64_t b = (work + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : b > 65536 ? 65536 : b);
}

static inline void fsd_launch_check(const char *kernel)
{
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        fsd_kernel_fail(kernel, cudaGetErrorString(err));
}

#define FSD_ROW_KERNEL(name, params, args)                                           \
    static __global__ void name##_kernel(int64_t fsd_rows_, FSD_UNPAREN params)       \
    {                                                                                \
        int fsd_lane_ = (int)(threadIdx.x % FSD_WARP);                               \
        int64_t fsd_warp_ = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / FSD_WARP; \
        int64_t fsd_warps_ = (int64_t)gridDim.x * blockDim.x / FSD_WARP;             \
        for (int64_t fsd_row_ = fsd_warp_; fsd_row_ < fsd_rows_; fsd_row_ += fsd_warps_) \
            name##_row(fsd_row_, fsd_lane_, FSD_WARP, FSD_UNPAREN args);             \
    }
#define FSD_RUN_ROWS(name, rows, width, args)                                          \
    do {                                                                               \
        const int64_t fsd_rows_ = (rows);                                              \
        name##_kernel<<<fsd_blocks(fsd_rows_, FSD_ROW_THREADS / FSD_WARP),             \
                        FSD_ROW_THREADS, 0, FSD_STREAM>>>(fsd_rows_, FSD_UNPAREN args); \
        fsd_launch_check(#name);                                                       \
    } while (0)

#define FSD_ELEM_KERNEL(name, params, args)                                          \
    static __global__ void name##_kernel(int64_t fsd_n_, FSD_UNPAREN params)          \
    {                                                                                \
        int64_t fsd_stride_ = (int64_t)gridDim.x * blockDim.x;                       \
        for (int64_t fsd_i_ = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;        \
             fsd_i_ < fsd_n_; fsd_i_ += fsd_stride_)                                 \
            name##_elem(fsd_i_, FSD_UNPAREN args);                                   \
    }
#define FSD_RUN_ELEMS(name, n, args)                                                   \
    do {                                                                               \
        const int64_t fsd_n_ = (n);                                                    \
        name##_kernel<<<fsd_blocks(fsd_n_, FSD_ELEM_THREADS), FSD_ELEM_THREADS, 0,     \
                        FSD_STREAM>>>(fsd_n_, FSD_UNPAREN args);                       \
        fsd_launch_check(#name);                                                       \
    } while (0)

#define FSD_COL_KERNEL(name, params, args)                                           \
    static __global__ void name##_kernel(int64_t fsd_cols_, FSD_UNPAREN params)       \
    {                                                                                \
        int64_t fsd_stride_ = (int64_t)gridDim.x * blockDim.x;                       \
        for (int64_t fsd_j_ = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;        \
             fsd_j_ < fsd_cols_; fsd_j_ += fsd_stride_)                              \
            name##_cols(fsd_j_, fsd_j_ + 1, FSD_UNPAREN args);                       \
    }
#define FSD_RUN_COLS(name, cols, height, args)                                         \
    do {                                                                               \
        const int64_t fsd_cols_ = (cols);                                              \
        name##_kernel<<<fsd_blocks(fsd_cols_, FSD_ELEM_THREADS), FSD_ELEM_THREADS, 0,  \
                        FSD_STREAM>>>(fsd_cols_, FSD_UNPAREN args);                    \
        fsd_launch_check(#name);                                                       \
    } while (0)

/* Block kernels: NAME_block(blk, tid, smem, ...) is one tile of work done
 * together by the FSD_BLOCK threads of a block (tid in [0, FSD_BLOCK)),
 * which share `smem`, SMEM reals of static __shared__ memory, and meet at
 * fsd_block_sync(). Warp w = tid / 32 of the block still combines its
 * lanes (tid % 32) with fsd_warp_sum / fsd_warp_max. The grid strides over
 * the blocks; the wrapper syncs between two, so a body may leave its
 * shared memory in any state. Every thread must reach every fsd_block_sync
 * (and, for the emulation, every warp reduction). */
#define FSD_BLOCK 128
DEVICE void fsd_block_sync(void) { __syncthreads(); }
#define FSD_BLOCK_KERNEL(name, smem_reals, params, args)                             \
    static __global__ void __launch_bounds__(FSD_BLOCK)                               \
        name##_kernel(int64_t fsd_nblk_, FSD_UNPAREN params)                          \
    {                                                                                \
        __shared__ __align__(16) real fsd_smem_[smem_reals];   /* for ldmatrix */    \
        for (int64_t fsd_blk_ = blockIdx.x; fsd_blk_ < fsd_nblk_; fsd_blk_ += gridDim.x) { \
            name##_block(fsd_blk_, (int)threadIdx.x, fsd_smem_, FSD_UNPAREN args);    \
            __syncthreads();                                                         \
        }                                                                            \
    }
#define FSD_RUN_BLOCKS(name, blocks, args)                                             \
    do {                                                                               \
        const int64_t fsd_nblk_ = (blocks);                                            \
        name##_kernel<<<fsd_blocks(fsd_nblk_, 1), FSD_BLOCK, 0, FSD_STREAM>>>(         \
            fsd_nblk_, FSD_UNPAREN args);                                              \
        fsd_launch_check(#name);                                                       \
    } while (0)

#ifdef __CUDACC_RTC__
/* fsdpc --verify compiles the kernels alone with NVRTC (compiler/verify.c):
 * device code only, where -default-device makes the launchers device
 * functions that are never called, and a launch inside one would be a
 * device-side launch. There a launcher only evaluates its size. */
#undef FSD_RUN_ROWS
#undef FSD_RUN_ELEMS
#undef FSD_RUN_COLS
#undef FSD_RUN_BLOCKS
#define FSD_RUN_ROWS(name, rows, width, args) ((void)(rows))
#define FSD_RUN_ELEMS(name, n, args) ((void)(n))
#define FSD_RUN_COLS(name, cols, height, args) ((void)(cols))
#define FSD_RUN_BLOCKS(name, blocks, args) ((void)(blocks))
#endif

#elif defined(FSD_WARP_EMULATION)
/* Tests only: the CPU runs row kernels as 32 lanes in lockstep and block
 * kernels as teams of FSD_BLOCK threads, to check the GPU's lane and block
 * logic without a GPU (tests/kernels/warp_emulation.h). */
#include "warp_emulation.h"

#else
/* ═══════════════════════ CPU (OpenMP) ═══════════════════════ */

/* always_inline: a body is compiled into each of the launcher's versions
 * (LAUNCHER below); left out of line, GCC compiles it once, for SSE2 */
#define DEVICE static inline __attribute__((always_inline))
#define FSD_WARP 1
#define FSD_COL_TILE 64       /* columns per work item: unit-stride inner loops */

DEVICE real fsd_warp_sum(real v) { return v; }
DEVICE double fsd_warp_sum_f64(double v) { return v; }
DEVICE real fsd_warp_max(real v) { return v; }
/* Launchers check indices on the host first, so this does not happen. */
DEVICE void fsd_trap(void) { abort(); }

/* FSD_SIMD before a loop whose iterations are independent (no reduction
 * variable: a sum over the loop stays a scalar loop, so its order, and
 * every result bit, is the same however the compiler vectorises): the
 * compiler vectorises it even at -O2. Elementwise kernels get it through
 * FSD_RUN_ELEMS. On the GPU it is nothing. */
#define FSD_SIMD _Pragma("omp simd")

/* FSD_LANE_SUM(s, j, n, lane, lanes, EXPR): s = this lane's share of the
 * sum of EXPR (an expression in j) over j in [0, n), for the row kernels to
 * combine with fsd_warp_sum. On the CPU (one lane) in 8 partial sums, j
 * mod 8 apart, added up in a fixed order at the end: 8 independent chains
 * the compiler vectorises, where one running sum waits on every add. The
 * order depends on n alone: not on threads, nor on the vector width.
 * FSD_LANE_MAX likewise (a max is exact in any order). */
#define FSD_LANE_ACC 8
#define FSD_LANE_SUM(s, j, n, lane, lanes, EXPR)                                     \
    do {                                                                             \
        real fsd_p_[FSD_LANE_ACC] = {0};                                             \
        const int64_t fsd_n_ = (n);                                                  \
        int64_t fsd_j0_ = 0;                                                         \
        for (; fsd_j0_ + FSD_LANE_ACC <= fsd_n_; fsd_j0_ += FSD_LANE_ACC)            \
            for (int fsd_k_ = 0; fsd_k_ < FSD_LANE_ACC; fsd_k_++) {                  \
                const int64_t j = fsd_j0_ + fsd_k_;                                  \
                fsd_p_[fsd_k_] += (EXPR);                                            \
            }                                                                        \
        for (int64_t j = fsd_j0_; j < fsd_n_; j++)                                   \
            fsd_p_[j - fsd_j0_] += (EXPR);                                           \
        (void)(lane), (void)(lanes);                                                 \
        s = ((fsd_p_[0] + fsd_p_[1]) + (fsd_p_[2] + fsd_p_[3])) +                    \
            ((fsd_p_[4] + fsd_p_[5]) + (fsd_p_[6] + fsd_p_[7]));                     \
    } while (0)
#define FSD_LANE_MAX(s, j, n, lane, lanes, EXPR)                                     \
    do {                                                                             \
        real fsd_p_[FSD_LANE_ACC];                                                   \
        const int64_t fsd_n_ = (n);                                                  \
        int64_t fsd_j0_ = 0;                                                         \
        for (int fsd_k_ = 0; fsd_k_ < FSD_LANE_ACC; fsd_k_++)                        \
            fsd_p_[fsd_k_] = -INFINITY;                                              \
        for (; fsd_j0_ + FSD_LANE_ACC <= fsd_n_; fsd_j0_ += FSD_LANE_ACC)            \
            for (int fsd_k_ = 0; fsd_k_ < FSD_LANE_ACC; fsd_k_++) {                  \
                const int64_t j = fsd_j0_ + fsd_k_;                                  \
                const real fsd_v_ = (EXPR);                                          \
                fsd_p_[fsd_k_] = fsd_v_ > fsd_p_[fsd_k_] ? fsd_v_ : fsd_p_[fsd_k_];  \
            }                                                                        \
        for (int64_t j = fsd_j0_; j < fsd_n_; j++) {                                 \
            const real fsd_v_ = (EXPR);                                              \
            fsd_p_[0] = fsd_v_ > fsd_p_[0] ? fsd_v_ : fsd_p_[0];                     \
        }                                                                            \
        (void)(lane), (void)(lanes);                                                 \
        s = fsd_p_[0];                                                               \
        for (int fsd_k_ = 1; fsd_k_ < FSD_LANE_ACC; fsd_k_++)                        \
            s = fsd_p_[fsd_k_] > s ? fsd_p_[fsd_k_] : s;                             \
    } while (0)

/* x86-64 with GCC: every launcher is compiled three times, for AVX-512,
 * AVX2 and the baseline (SSE2), and the dynamic loader picks the one the
 * CPU runs (an ifunc), so one binary uses the widest vectors the machine
 * has. Each lane computes what the scalar code would, with the same
 * operations (no FMA contraction under -std=c11), so all three give the
 * same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__)
#undef LAUNCHER
#define LAUNCHER static __attribute__((unused, target_clones("avx512f", "avx2", "default")))
#endif

#ifndef FSD_FLOAT64
/* e^x in float, written so that loops calling it vectorise (a call to
 * libm's expf stops the vectoriser, and costs a vectorised loop about 2x
 * at SSE2 width, more with wider vectors): Cephes' expf, x = n·ln2 + r
 * with |r| ≤ ln2/2 and e^r a degree-7 polynomial, 2^n written into the
 * exponent bits. Relative error under 1.4 ulp (against a double exp, every
 * 7th float from −87.3 to 88.3). Out of range without branches or float
 * comparisons (under the default -ftrapping-math a float compare stops the
 * vectoriser): x below −87.34 gives 0 (libm gives denormals down to −103),
 * above 88.376 +inf, NaN stays NaN. The float64 build keeps libm's exp. */
static inline float fsd_expf(float x)
{
    const int32_t hi = 0x42b0c0a4;   /* 88.37625: round(x / ln2) ≤ 127 */
    const int32_t lo = 0x42aeac50;   /* 87.3365447504019 */
    int32_t ix, it, iy, e;
    memcpy(&ix, &x, sizeof ix);
    int32_t ax = ix & 0x7fffffff, neg = -(int32_t)((uint32_t)ix >> 31);
    int32_t out = -(int32_t)(ax > (hi ^ ((hi ^ lo) & neg)));   /* all ones: out of range */
    it = ix & ~out;
    float t, sc, y;
    memcpy(&t, &it, sizeof t);
    float n = (t * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   /* round(t / ln2) */
    float r = t - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1;
    e = ((int32_t)n + 127) << 23;
    memcpy(&sc, &e, sizeof sc);
    y = p * sc;
    memcpy(&iy, &y, sizeof iy);
    int32_t nan = -(int32_t)(ax > 0x7f800000);
    int32_t special = (~neg & 0x7f800000) | (nan & 0x7fc00000);   /* +inf, 0 or NaN */
    iy = (iy & ~out) | (special & out);
    memcpy(&y, &iy, sizeof y);
    return y;
}
#undef fsd_exp
#define fsd_exp fsd_expf
#endif

/* No wrapper on the CPU: the launcher's loop calls the body. */
#define FSD_ROW_KERNEL(name, params, args)
#define FSD_ELEM_KERNEL(name, params, args)
#define FSD_COL_KERNEL(name, params, args)

/* The launchers' loops: a static schedule over the threads, or the calling
 * thread alone when the work is small (fsd_par_: FSD_PAR_MIN_ELEMS,
 * runtime/fsdrt.h). A row's `width` and a column's `height` are the
 * elements it touches, the work measure; `parallel:` keeps FSD_RUN_ELEMS's
 * simd when the region runs on one thread. */
#define FSD_RUN_ROWS(name, rows, width, args)                                 \
    do {                                                                      \
        const int64_t fsd_rows_ = (rows);                                     \
        const bool fsd_par_ = fsd_rows_ * (int64_t)(width) >= FSD_PAR_MIN_ELEMS; \
        (void)fsd_par_;                                                       \
        _Pragma("omp parallel for schedule(static) if (fsd_par_)")            \
        for (int64_t fsd_row_ = 0; fsd_row_ < fsd_rows_; fsd_row_++)          \
            name##_row(fsd_row_, 0, 1, FSD_UNPAREN args);                     \
    } while (0)
#define FSD_RUN_ELEMS(name, n, args)                                          \
    do {                                                                      \
        const int64_t fsd_n_ = (n);                                           \
        const bool fsd_par_ = fsd_n_ >= FSD_PAR_MIN_ELEMS;                    \
        (void)fsd_par_;                                                       \
        _Pragma("omp parallel for simd schedule(static) if (parallel : fsd_par_)") \
        for (int64_t fsd_i_ = 0; fsd_i_ < fsd_n_; fsd_i_++)                   \
            name##_elem(fsd_i_, FSD_UNPAREN args);                            \
    } while (0)
#define FSD_RUN_COLS(name, cols, height, args)                                           \
    do {                                                                                 \
        const int64_t fsd_cols_ = (cols);                                                \
        const int64_t fsd_tiles_ = (fsd_cols_ + FSD_COL_TILE - 1) / FSD_COL_TILE;        \
        const bool fsd_par_ = fsd_cols_ * (int64_t)(height) >= FSD_PAR_MIN_ELEMS;        \
        (void)fsd_par_;                                                                  \
        _Pragma("omp parallel for schedule(static) if (fsd_par_)")                       \
        for (int64_t fsd_t_ = 0; fsd_t_ < fsd_tiles_; fsd_t_++) {                        \
            int64_t fsd_j0_ = fsd_t_ * FSD_COL_TILE, fsd_j1_ = fsd_j0_ + FSD_COL_TILE;   \
            name##_cols(fsd_j0_, fsd_j1_ < fsd_cols_ ? fsd_j1_ : fsd_cols_, FSD_UNPAREN args); \
        }                                                                                \
    } while (0)
/* A column reduction in one pass (a family's NAME_sums on the CPU): each
 * worker takes a span of columns, at most FSD_COL_SPAN wide (fsd_col_span:
 * the columns split evenly over the threads, in whole cache lines, when
 * narrower), sums it over all rows with NAME_sum, whole rows of the span
 * streaming through the cache, then stores it (fsd_col_store). Each
 * column is summed in row order from 0, whatever the span. */
#ifdef _OPENMP
#include <omp.h>
#endif
#define FSD_COL_SPAN 2048
DEVICE int64_t fsd_col_span(int64_t cols)
{
    const int64_t line = 64 / (int64_t)sizeof(real);
    int64_t nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    int64_t span = (cols + nt - 1) / nt;
    span = (span + line - 1) / line * line;
    return span < FSD_COL_SPAN ? span : FSD_COL_SPAN;
}

#endif

#ifndef FSD_SIMD
#define FSD_SIMD   /* the GPU, and the warp emulation: lanes are the vectors */
/* the GPU's lanes: each sums its strided share in order */
#define FSD_LANE_SUM(s, j, n, lane, lanes, EXPR)                 \
    do {                                                         \
        s = 0;                                                   \
        for (int64_t j = (lane); j < (n); j += (lanes))          \
            s += (EXPR);                                         \
    } while (0)
#define FSD_LANE_MAX(s, j, n, lane, lanes, EXPR)                 \
    do {                                                         \
        s = -INFINITY;                                           \
        for (int64_t j = (lane); j < (n); j += (lanes))          \
            s = fsd_fmax(s, (EXPR));                             \
    } while (0)
#endif

/* ── act: the stored tensors (runtime/fsdrt.h) ──
 * fsd_wide(v) is a stored value as `real`, fsd_narrow(x) a real rounded
 * to what act holds: for bf16, the upper half of the float's bits, rounded
 * to nearest even (NaN stays NaN), exactly what the runtime's bf16 rounding
 * (runtime/half.h) and the GPU's __float2bfloat16_rn do; otherwise both
 * are the identity. Kernels load through fsd_wide, compute in real and
 * store through fsd_narrow or fsd_store. Under CUDA they are host
 * functions too (FSD_CONVERT): host code that fills or reads act buffers
 * (the kernel tests) rounds the same way. */
#ifdef __CUDACC__
#define FSD_CONVERT __host__ __device__ inline
#else
#define FSD_CONVERT DEVICE
#endif
#ifdef FSD_ACT_IS_BF16
FSD_CONVERT float fsd_bits_float(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}
FSD_CONVERT uint32_t fsd_float_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
FSD_CONVERT real fsd_wide(act v) { return fsd_bits_float((uint32_t)v.bits << 16); }
FSD_CONVERT act fsd_narrow(real x)
{
    uint32_t u = fsd_float_bits(x);
    act h;
    if ((u & 0x7fffffffu) > 0x7f800000u)
        h.bits = (uint16_t)((u >> 16) | 0x40);
    else
        h.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
    return h;
}
#else
FSD_CONVERT real fsd_wide(act v) { return v; }
FSD_CONVERT act fsd_narrow(real x) { return x; }
#endif

/* Stores a kernel result: gradients either overwrite their output or add
 * to it (autodiff's `acc`: a later contribution to the same gradient).
 * With acc false the old value is never used, so it may be garbage (NaN).
 * The CPU loads it anyway and clears its bits when acc is false, 0 + v:
 * no branch, so the loop around vectorises (a conditional load would stop
 * it: about 7x slower in bf16). The one difference: v = −0 is stored as
 * +0. With bf16 act the sum is formed in float and rounded once. */
#if !defined(__CUDACC__) && !defined(FSD_WARP_EMULATION)
#if defined(FSD_ACT_IS_BF16)
typedef uint16_t fsd_act_bits;   /* an act's bits */
#elif defined(FSD_FLOAT64)
typedef uint64_t fsd_act_bits;
#else
typedef uint32_t fsd_act_bits;
#endif
DEVICE void fsd_store(act *p, real v, bool acc)
{
    fsd_act_bits bits, keep = (fsd_act_bits)((fsd_act_bits)0 - (fsd_act_bits)acc);
    act old = *p;
    memcpy(&bits, &old, sizeof bits);
    bits &= keep;
    memcpy(&old, &bits, sizeof old);
    *p = fsd_narrow(fsd_wide(old) + v);
}
#else
DEVICE void fsd_store(act *p, real v, bool acc) { *p = fsd_narrow(acc ? fsd_wide(*p) + v : v); }
#endif

/* ── 16-byte vectors: the GPU's wide loads and stores ──
 * A GPU thread that loads one 2-byte bf16 per instruction moves a warp's
 * 64 bytes at a time, and a kernel of such loads runs far below the memory's
 * bandwidth; one 16-byte access per thread moves 512. fsd_vec is FSD_VEC
 * consecutive act values (8 bf16, 4 float, 2 double) loaded and stored as
 * one 16-byte access (fsd_vload, fsd_vstore: a uint4 through the pointer,
 * which must be 16-byte aligned). Kernels with such bodies are named X_v,
 * beside their scalar X, and work in units of FSD_VEC elements; each element
 * is computed with the scalar body's operations (elementwise bodies call
 * the scalar one on the vector's elements), so the results are its bits,
 * except the row sums' order (below). A launcher takes X_v when
 * FSD_VEC_WHEN(cond) holds: cond says the counts are multiples of FSD_VEC
 * and every pointer the vector body loads or stores is 16-byte aligned
 * (fsd_al16); else the scalar X, which stays.
 *
 * The CPU build has none of it: FSD_VEC_WHEN is false there, its cond and
 * the X_v launch are not compiled, and no X_v body exists. Its loops are
 * vectorised already (FSD_SIMD, FSD_RUN_ELEMS's omp simd) from the scalar
 * bodies; keeping them keeps its bits and its speed. The warp emulation
 * runs the GPU's choice and bodies, and stops on a misaligned vector access
 * as the GPU would fault. */
#if defined(__CUDACC__) || defined(FSD_WARP_EMULATION)
#define FSD_VEC ((int)(16 / sizeof(act)))
#ifdef __CUDACC__
#define FSD_VEC_UNROLL _Pragma("unroll")
#define FSD_UNROLL4 _Pragma("unroll 4")
typedef union {
    uint4 u;
    act a[16 / sizeof(act)];
} fsd_vec;
DEVICE fsd_vec fsd_vload(const act *p)
{
    fsd_vec v;
    v.u = *(const uint4 *)p;
    return v;
}
/* __stwb: a plain (write-back) 16-byte store. nvcc compiled the assignment
 * `*(uint4 *)p = v.u` of a value just loaded as a copy at act's alignment,
 * four 4-byte stores (embed_fwd_v's PTX). */
DEVICE void fsd_vstore(act *p, fsd_vec v) { __stwb((uint4 *)p, v.u); }
DEVICE fsd_vec fsd_vzero(void)
{
    fsd_vec v;
    v.u.x = v.u.y = v.u.z = v.u.w = 0;
    return v;
}
#define FSD_VEC_LAUNCHED() ((void)0)
#else
#define FSD_VEC_UNROLL
#define FSD_UNROLL4
typedef union {
    unsigned char b[16];
    act a[16 / sizeof(act)];
} fsd_vec;
static inline void fsd_emu_vec_check(const act *p)
{
    if ((uintptr_t)p % 16 != 0) {
        fprintf(stderr, "warp emulation: 16-byte vector access at %p, not 16-byte aligned\n",
                (const void *)p);
        abort();
    }
}
DEVICE fsd_vec fsd_vload(const act *p)
{
    fsd_vec v;
    fsd_emu_vec_check(p);
    memcpy(&v, p, sizeof v);
    return v;
}
DEVICE void fsd_vstore(act *p, fsd_vec v)
{
    fsd_emu_vec_check(p);
    memcpy(p, &v, sizeof v);
}
DEVICE fsd_vec fsd_vzero(void)
{
    fsd_vec v;
    memset(&v, 0, sizeof v);
    return v;
}
/* the tests count the vector launches, to know which path ran */
static long fsd_emu_vec_launches;
#define FSD_VEC_LAUNCHED() ((void)fsd_emu_vec_launches++)
#endif
/* k over a vector's elements, unrolled on the GPU so that the union's
 * elements are indexed by constants and stay in registers */
#define FSD_VEC_FOR(k) FSD_VEC_UNROLL for (int k = 0; k < FSD_VEC; k++)
/* FSD_UNROLL4 before a loop whose loads do not depend on each other (its
 * sums' order stays): unrolled 4 times on the GPU, so that a thread has 4
 * loads in flight; rolled, each add waits for its load before the next load
 * issues, and a thread keeps one 16-byte load in flight (ptxas keeps the
 * loads of an unrolled loop two at a time, as its SASS shows: the vector
 * column sums load their batches of rows explicitly, FSD_COL_BATCH).
 *
 * A row kernel's lane loop over a row of n elements (n a multiple of
 * FSD_VEC) by vectors: j is the first element of vectors lane, lane + lanes,
 * .... A vector row kernel's sums over its lanes (fsd_warp_sum) add each
 * lane's vectors in that order, a vector's elements in order: a fixed order
 * that depends on n alone, but not the scalar kernel's (lane l there adds
 * elements l, l + 32, ...), so their sums may differ in the last bits. */
#define FSD_VEC_LANES(j, n, lane, lanes)                                  \
    FSD_UNROLL4 for (int64_t j = (int64_t)(lane) * FSD_VEC; j < (n);      \
                     j += (int64_t)(lanes) * FSD_VEC)
/* The 16-byte loads a vector column sum's thread (NAME_sum, below) makes
 * before it adds them: FSD_COL_BATCH rows of one tensor, half as many of
 * two. Its chunks of rows are the scalar pass's (fsd_col_chunk_rows), for
 * the same order, so it runs an eighth of the scalar pass's threads (bf16):
 * each must keep several loads in flight to keep the bytes in flight up. */
#define FSD_COL_BATCH 8
/* an output's old values when acc (fsd_store's), else zeros never read */
DEVICE fsd_vec fsd_vload_acc(const act *p, bool acc) { return acc ? fsd_vload(p) : fsd_vzero(); }
static inline bool fsd_al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

#define FSD_VEC_WHEN(cond) (cond)
/* an elementwise X_v over n elements: n / FSD_VEC work items */
#define FSD_RUN_VEC_ELEMS(name, n, args)                   \
    do {                                                   \
        FSD_VEC_LAUNCHED();                                \
        FSD_RUN_ELEMS(name, (n) / FSD_VEC, args);          \
    } while (0)
#define FSD_RUN_VEC_ROWS(name, rows, width, args)          \
    do {                                                   \
        FSD_VEC_LAUNCHED();                                \
        FSD_RUN_ROWS(name, rows, width, args);             \
    } while (0)
#else
#define FSD_VEC_WHEN(cond) false
#define FSD_RUN_VEC_ELEMS(name, n, args) ((void)0)
#define FSD_RUN_VEC_ROWS(name, rows, width, args) ((void)0)
#endif

/* ── column reductions (the sum shape) ── */

/* the most outputs a column reduction has: layernorm_bwd's dw and db */
#define FSD_COL_OUTS 2

/* dst[j] (+)= Σ_r src[r·ld + j] for j in [j0, j1), rows summed in order:
 * the partial rows of a column reduction's chunks (the CPU's norms, the
 * GPU's second pass). */
DEVICE void fsd_col_sum_real(int64_t j0, int64_t j1, act *dst, bool acc, const real *src,
                             int64_t rows, int64_t ld)
{
    real s[FSD_COL_TILE];
    for (int64_t j = j0; j < j1; j++)
        s[j - j0] = 0;
    for (int64_t r = 0; r < rows; r++)
        FSD_SIMD
        for (int64_t j = j0; j < j1; j++)
            s[j - j0] += src[r * ld + j];
    for (int64_t j = j0; j < j1; j++)
        fsd_store(&dst[j], s[j - j0], acc);
}

#if defined(__CUDACC__) || defined(FSD_WARP_EMULATION)
/* The GPU's two passes (and the emulation's, which runs the same code on
 * the CPU). The partial rows live in fsd_col_part, a fixed array of
 * FSD_COL_PARTS reals: 4 MiB of device memory (8 MiB in the float64 build)
 * outside the memory plan (compiler/memplan.c) and the runtime's memory
 * counters, like cuBLASLt's workspace. No allocation in the step, nothing
 * for the launcher to be given; one buffer serves every reduction, since
 * the kernels run in order on one stream (FSD_STREAM) and each reduction's
 * second pass has read its partials before the next one's first pass
 * starts. */
#define FSD_COL_PARTS (1 << 20)
#define FSD_COL_CHUNK_MIN 64
#ifdef __CUDACC__
static __device__ real fsd_col_part[FSD_COL_PARTS];
#else
static real fsd_col_part[FSD_COL_PARTS];
#endif

/* One column reduction's launch: its rows ([rows, cols]) in chunks of
 * `chunk` rows (the last one ragged), its outputs and their acc. */
typedef struct {
    int64_t rows, cols, chunk, chunks;
    act *out[FSD_COL_OUTS];
    int nout;
    bool acc;
} fsd_col_plan;

/* Rows per chunk: about √rows, so that pass 1's threads (each walks a
 * chunk's rows) and pass 2's (each walks the chunks' partials) have walks
 * about as long: 2·√rows loads in a row instead of rows (182 instead of
 * 8192 at GPT-2's 8 × 1024 rows), with chunks·cols threads in pass 1. At
 * least FSD_COL_CHUNK_MIN rows, so that the partials (4 bytes, written and
 * read once: 8 bytes per chunk and column) stay under 1/16 of what pass 1
 * reads (at least 64 rows of 2-byte inputs) and the second launch pays
 * off. More where chunks·nout·cols partials would not fit in fsd_col_part.
 * All rows (one chunk: one pass, stored directly) when rows are that few or
 * not even two chunks fit (the columns alone are then plenty of threads). */
static inline int64_t fsd_col_chunk_rows(int64_t rows, int64_t cols, int nout)
{
    const int64_t fit = FSD_COL_PARTS / (nout * cols);   /* chunks the scratch holds */
    if (fit < 2)
        return rows;
    int64_t chunk = (int64_t)ceil(sqrt((double)rows));
    if (chunk < FSD_COL_CHUNK_MIN)
        chunk = FSD_COL_CHUNK_MIN;
    if (chunk < (rows + fit - 1) / fit)
        chunk = (rows + fit - 1) / fit;
    return chunk < rows ? chunk : rows;
}

/* The end of pass 1's work item (chunk c, column j) with the sums s[k]:
 * with one chunk they are the results, stored; else chunk c's partials,
 * row c·nout + k of fsd_col_part ([chunks·nout, cols]). The loop's bounds
 * are constants, so that s and p.out are indexed by constants alone: an
 * array indexed at run time goes to (slow) local memory on the GPU. */
DEVICE void fsd_col_item_end(fsd_col_plan p, int64_t c, int64_t j, const real *s)
{
    for (int k = 0; k < FSD_COL_OUTS; k++) {
        if (k >= p.nout)
            break;
        if (p.chunks == 1)
            fsd_store(&p.out[k][j], s[k], p.acc);
        else
            fsd_col_part[(c * p.nout + k) * p.cols + j] = s[k];
    }
}

/* p.out[k], through constant indices (as above) */
DEVICE act *fsd_col_out(fsd_col_plan p, int64_t k)
{
    act *out = p.out[0];
    for (int i = 1; i < FSD_COL_OUTS; i++)
        if (i == k)
            out = p.out[i];
    return out;
}

/* Pass 1's work item i (a thread of the elem kernel NAME, which the
 * family's NAME_sums starts over chunks · cols / per items): columns
 * [j0, j0 + per) of chunk c, rows [r0, r1). Items of one column (per 1)
 * or of FSD_VEC adjacent ones (a vector NAME_sum, one 16-byte load a row);
 * consecutive threads take consecutive columns (or 16-byte groups) of a
 * chunk, so each row's loads coalesce. A column's rows are added in the
 * same order either way and end in the same partial or output, so the
 * scalar and vector items give the same bits. */
typedef struct {
    int64_t c, r0, r1, j0;
} fsd_col_item;
DEVICE fsd_col_item fsd_col_item_of(fsd_col_plan p, int64_t i, int per)
{
    const int64_t groups = p.cols / per;
    fsd_col_item it;
    it.c = i / groups;
    it.j0 = (i - it.c * groups) * per;
    it.r0 = it.c * p.chunk;
    it.r1 = it.r0 + p.chunk < p.rows ? it.r0 + p.chunk : p.rows;
    return it;
}

#ifdef FSD_VEC
/* The end of a vector item: output k's column j0 + c, summed in
 * s[k·FSD_VEC + c], each ended as a scalar item's (fsd_col_item_end). */
DEVICE void fsd_col_vitem_end(fsd_col_plan p, fsd_col_item it, const real *s)
{
    FSD_VEC_FOR(k) {
        real one[FSD_COL_OUTS];
        FSD_VEC_UNROLL for (int o = 0; o < FSD_COL_OUTS; o++)
            one[o] = s[o * FSD_VEC + k];
        fsd_col_item_end(p, it.c, it.j0 + k, one);
    }
}
#endif

/* Pass 2: column J of the partials' view [chunks, nout·cols] is output
 * k = J / cols, column J mod cols: its chunks added in order, stored. */
DEVICE void fsd_col_parts_cols(int64_t j0, int64_t j1, fsd_col_plan p)
{
    for (int64_t jj = j0; jj < j1; jj++) {
        const int64_t k = jj / p.cols, j = jj - k * p.cols;
        fsd_col_sum_real(j, j + 1, fsd_col_out(p, k), p.acc, fsd_col_part + k * p.cols, p.chunks,
                         p.nout * p.cols);
    }
}
FSD_COL_KERNEL(fsd_col_parts, (fsd_col_plan p), (p))

/* The plan of a column reduction over [rows, cols] into out0 (and out1,
 * when not NULL), each (+)= its column sums. */
static inline fsd_col_plan fsd_col_plan_of(int64_t rows, int64_t cols, bool acc, act *out0,
                                           act *out1)
{
    fsd_col_plan p;
    p.rows = rows;
    p.cols = cols;
    p.acc = acc;
    p.nout = out1 ? 2 : 1;
    p.out[0] = out0;
    p.out[1] = out1;
    p.chunk = fsd_col_chunk_rows(rows, cols, p.nout);
    p.chunks = (rows + p.chunk - 1) / p.chunk;
    return p;
}

/* Pass 2, after a reduction's pass 1: the chunks' partials added in order
 * and stored; nothing when there was one chunk (pass 1 stored). */
static inline void fsd_col_finish(fsd_col_plan p)
{
    if (p.chunks > 1)
        FSD_RUN_COLS(fsd_col_parts, p.nout * p.cols, p.chunks, (p));
}

#else
/* out[k][j] (+)= s[k·ls + j − j0] for the nout outputs k and j in [j0, j1):
 * the CPU's column sums (NAME_sum's) stored. */
DEVICE void fsd_col_store(int64_t j0, int64_t j1, act *const *out, int nout, bool acc,
                          const real *s, int64_t ls)
{
    for (int k = 0; k < nout; k++)
        for (int64_t j = j0; j < j1; j++)
            fsd_store(&out[k][j], s[k * ls + j - j0], acc);
}
#endif

/* Host-side check that every index in idx[0, n) lies in [0, bound): token
 * ids and targets. The GPU cannot read device memory here; its kernels
 * trap instead. */
static inline void fsd_check_indices(const char *kernel, const int32_t *idx, int64_t n,
                                     int64_t bound)
{
#ifndef __CUDACC__
    for (int64_t i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= bound) {
            char msg[160];
            snprintf(msg, sizeof msg, "index %ld at position %ld is outside [0, %ld)",
                     (long)idx[i], (long)i, (long)bound);
            fsd_kernel_fail(kernel, msg);
        }
#else
    (void)kernel, (void)idx, (void)n, (void)bound;
#endif
}

#endif /* FSD_PORTABLE_H */
