/*
 * warp_emulation.h — a test-only backend for the kernel templates: the CPU
 * runs every row kernel the way the GPU does, with a warp of 32 lanes, so
 * the lane-strided loops, the warp reductions and the lane-0 stores are
 * exercised on machines without a GPU. portable.h includes it in place of
 * its CPU section when FSD_WARP_EMULATION is defined (tests/kernels/run.sh
 * builds test_kernels.c that way).
 *
 * Each row runs as an OpenMP team of 32 threads, one per lane; a warp
 * reduction is a store to a shared slot, a barrier, and every lane summing
 * the slots in lane order (so all lanes agree, as with the GPU's xor
 * butterfly). Rows run one after another. A body that skipped a
 * reduction on some lanes would hang here, as it would break on the GPU:
 * run.sh runs this build under a timeout. Elementwise kernels run as on
 * the CPU; column kernels take one column per call, as on the GPU, and
 * column reductions run the GPU's two passes (portable.h: its work items,
 * its partial rows in fsd_col_part, its sums' order). The launchers choose
 * the GPU's 16-byte vector kernels as on the GPU (portable.h, FSD_VEC),
 * whose loads and stores stop the program when misaligned, as the GPU's
 * would fault, and are counted (fsd_emu_vec_launches), so the tests know
 * which path ran.
 *
 * Block kernels (portable.h's fifth shape) run the same way, one block at
 * a time as a team of FSD_BLOCK threads: fsd_block_sync() is an OpenMP
 * barrier, the block's shared memory one buffer the team shares, filled
 * with NaN before each block (the GPU's shared memory holds garbage, so a
 * read before a write shows), and a warp reduction combines the 32 slots of
 * the caller's warp, tid / 32. The barriers span the whole team, so here
 * every warp of a block must make the same number of warp reductions, which
 * the GPU does not need; the attention kernels do.
 *
 * The tensor-core primitives of templates/mma.h run here as collectives
 * too: fsd_emu_mma (an mma.sync of the caller's warp), fsd_emu_ldmatrix
 * (its fragment loads from shared memory) and fsd_emu_quad (the shuffles
 * over a quad of lanes), each through slots and barriers, so every thread
 * of the block must make the same sequence of them, as mma.sync and
 * ldmatrix need of a warp on the GPU.
 */
#ifndef FSD_WARP_EMULATION_H
#define FSD_WARP_EMULATION_H

#include <omp.h>
#include <string.h>

#define DEVICE static inline
#define FSD_WARP 32
#define FSD_COL_TILE 1
#define FSD_BLOCK 128
#define FSD_BLOCK_EMULATION 1

/* Two sets of slots, used by turns, and the turn of each thread (0 when a
 * team starts: FSD_RUN_ROWS / FSD_RUN_BLOCKS set it). */
static double fsd_emu_slot[2][FSD_BLOCK];
static int fsd_emu_turn[FSD_BLOCK];

/* The reduction over the lanes of the calling thread's warp: slots
 * [32·w, 32·w + 32) for thread 32·w + lane of the team. One barrier: a
 * thread writes this turn's set only after the barrier of the previous
 * reduction, which every thread passed after reading the set before. */
static inline double fsd_emu_reduce(double v, bool max)
{
    int tid = omp_get_thread_num(), w0 = tid / FSD_WARP * FSD_WARP;
    double *slot = fsd_emu_slot[fsd_emu_turn[tid]];
    fsd_emu_turn[tid] ^= 1;
    slot[tid] = v;
#pragma omp barrier
    double s = slot[w0];
    for (int i = 1; i < FSD_WARP; i++)
        s = max ? fmax(s, slot[w0 + i]) : s + slot[w0 + i];
    return s;
}

static inline void fsd_block_sync(void)
{
#pragma omp barrier
}

/* The reduction over the quad of lanes 4q..4q+3 of the calling thread (the
 * lanes that share a row of an mma's C: templates/mma.h), through the same
 * slots and turns, combined as the GPU's xor 1 then xor 2 shuffles do:
 * (v0 ∘ v1) ∘ (v2 ∘ v3), the same bits in the four lanes. */
static inline float fsd_emu_quad(float v, bool max)
{
    int tid = omp_get_thread_num(), q0 = tid / 4 * 4;
    double *slot = fsd_emu_slot[fsd_emu_turn[tid]];
    fsd_emu_turn[tid] ^= 1;
    slot[tid] = v;
#pragma omp barrier
    float s0 = (float)slot[q0], s1 = (float)slot[q0 + 1];
    float s2 = (float)slot[q0 + 2], s3 = (float)slot[q0 + 3];
    return max ? fmaxf(fmaxf(s0, s1), fmaxf(s2, s3)) : (s0 + s1) + (s2 + s3);
}

/* mma.sync.m16n8k16 (bf16 in, fp32 out) over the calling thread's warp:
 * each lane leaves its A and B fragments in the slots, a barrier, each
 * lane forms its four D elements from the warp's slots by the PTX
 * fragment layout (mma.h), a barrier before the slots are written again.
 * d += Σ_k A[row][k]·B[k][col] in fp32, k in order (each product of two
 * bf16 is exact in fp32). */
static uint32_t fsd_emu_fa[FSD_BLOCK][4], fsd_emu_fb[FSD_BLOCK][2];

/* element `half` (0: low 16 bits) of a register, as a float */
static inline float fsd_emu_bf16(uint32_t reg, int half)
{
    uint32_t u = (reg >> (16 * half) & 0xffffu) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline void fsd_emu_mma(float d[4], const uint32_t a[4], const uint32_t b[2])
{
    int tid = omp_get_thread_num(), w0 = tid / FSD_WARP * FSD_WARP, lane = tid % FSD_WARP;
    for (int i = 0; i < 4; i++)
        fsd_emu_fa[tid][i] = a[i];
    fsd_emu_fb[tid][0] = b[0], fsd_emu_fb[tid][1] = b[1];
#pragma omp barrier
    for (int i = 0; i < 4; i++) {
        int row = lane / 4 + 8 * (i / 2), col = 2 * (lane % 4) + i % 2;
        float s = d[i];
        for (int k = 0; k < 16; k++) {
            /* A[row][k]: lane (row mod 8)·4 + (k mod 8)/2, register
             * row/8 + 2·(k/8); B[k][col]: lane 4·col + (k mod 8)/2,
             * register k/8; half k mod 2 of either */
            float av = fsd_emu_bf16(fsd_emu_fa[w0 + row % 8 * 4 + k % 8 / 2][row / 8 + 2 * (k / 8)],
                                    k % 2);
            float bv = fsd_emu_bf16(fsd_emu_fb[w0 + col * 4 + k % 8 / 2][k / 8], k % 2);
            s += av * bv;
        }
        d[i] = s;
    }
#pragma omp barrier
}

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 over the calling
 * thread's warp: each lane leaves its row address in a slot (lanes
 * 8m..8m + 7 the rows of matrix m, 8 elements of 16 bits each), a barrier,
 * each lane gathers register m from matrix m by the PTX ISA's layout
 * (without trans: elements 2(lane%4), 2(lane%4) + 1 of row lane/4; with
 * trans: element lane/4 of rows 2(lane%4), 2(lane%4) + 1; the first in the
 * low 16 bits), a barrier. A row address that is not 16-byte aligned, which
 * the GPU rejects, stops the program here. */
static const unsigned char *fsd_emu_row[FSD_BLOCK];

static inline void fsd_emu_ldmatrix(uint32_t r[4], const void *row, bool trans)
{
    int tid = omp_get_thread_num(), w0 = tid / FSD_WARP * FSD_WARP, lane = tid % FSD_WARP;
    if ((uintptr_t)row % 16 != 0) {
        fprintf(stderr, "warp emulation: ldmatrix row address %p (thread %d) not 16-byte aligned\n",
                row, tid);
        abort();
    }
    fsd_emu_row[tid] = (const unsigned char *)row;
#pragma omp barrier
    for (int m = 0; m < 4; m++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            const unsigned char *p =
                trans ? fsd_emu_row[w0 + 8 * m + 2 * (lane % 4) + h] + 2 * (lane / 4)
                      : fsd_emu_row[w0 + 8 * m + lane / 4] + 2 * (2 * (lane % 4) + h);
            memcpy(&e[h], p, sizeof e[h]);
        }
        r[m] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
#pragma omp barrier
}

DEVICE real fsd_warp_sum(real v) { return (real)fsd_emu_reduce(v, false); }
DEVICE double fsd_warp_sum_f64(double v) { return fsd_emu_reduce(v, false); }
DEVICE real fsd_warp_max(real v) { return (real)fsd_emu_reduce(v, true); }
DEVICE void fsd_trap(void) { abort(); }

static inline void fsd_emu_team_check(int want)
{
    if (omp_get_num_threads() != want) {
        fprintf(stderr, "warp emulation: got a team of %d threads, not %d\n",
                omp_get_num_threads(), want);
        abort();
    }
}

#define FSD_ROW_KERNEL(name, params, args)
#define FSD_ELEM_KERNEL(name, params, args)
#define FSD_COL_KERNEL(name, params, args)
/* the kernel's shared memory size, for FSD_RUN_BLOCKS */
#define FSD_BLOCK_KERNEL(name, smem_reals, params, args) \
    static inline int64_t name##_smem_reals(void) { return (smem_reals); }

#define FSD_RUN_ROWS(name, rows, width, args)                                   \
    do {                                                                        \
        const int64_t fsd_rows_ = (rows);                                       \
        omp_set_dynamic(0);                                                     \
        for (int64_t fsd_row_ = 0; fsd_row_ < fsd_rows_; fsd_row_++) {          \
            _Pragma("omp parallel num_threads(32)")                             \
            {                                                                   \
                fsd_emu_team_check(FSD_WARP);                                   \
                fsd_emu_turn[omp_get_thread_num()] = 0;                         \
                name##_row(fsd_row_, omp_get_thread_num(), FSD_WARP,            \
                           FSD_UNPAREN args);                                   \
            }                                                                   \
        }                                                                       \
    } while (0)
#define FSD_RUN_BLOCKS(name, blocks, args)                                      \
    do {                                                                        \
        const int64_t fsd_nblk_ = (blocks), fsd_sm_ = name##_smem_reals();      \
        real *fsd_smem_ = (real *)malloc(sizeof(real) * (size_t)fsd_sm_);       \
        if (!fsd_smem_)                                                         \
            fsd_kernel_fail(#name, "out of memory for the emulated shared memory"); \
        omp_set_dynamic(0);                                                     \
        for (int64_t fsd_blk_ = 0; fsd_blk_ < fsd_nblk_; fsd_blk_++) {          \
            for (int64_t fsd_i_ = 0; fsd_i_ < fsd_sm_; fsd_i_++)                \
                fsd_smem_[fsd_i_] = (real)NAN;                                  \
            _Pragma("omp parallel num_threads(128)")                            \
            {                                                                   \
                fsd_emu_team_check(FSD_BLOCK);                                  \
                fsd_emu_turn[omp_get_thread_num()] = 0;                         \
                name##_block(fsd_blk_, omp_get_thread_num(), fsd_smem_,         \
                             FSD_UNPAREN args);                                 \
            }                                                                   \
        }                                                                       \
        free(fsd_smem_);                                                        \
    } while (0)
#define FSD_RUN_ELEMS(name, n, args)                                            \
    do {                                                                        \
        const int64_t fsd_n_ = (n);                                             \
        for (int64_t fsd_i_ = 0; fsd_i_ < fsd_n_; fsd_i_++)                     \
            name##_elem(fsd_i_, FSD_UNPAREN args);                              \
    } while (0)
#define FSD_RUN_COLS(name, cols, height, args)                                  \
    do {                                                                        \
        const int64_t fsd_cols_ = (cols);                                       \
        _Pragma("omp parallel for schedule(static)")                            \
        for (int64_t fsd_j_ = 0; fsd_j_ < fsd_cols_; fsd_j_++)                  \
            name##_cols(fsd_j_, fsd_j_ + 1, FSD_UNPAREN args);                  \
    } while (0)

#endif
