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
 * its partial rows in fsd_col_part, its sums' order).
 *
 * Block kernels (portable.h's fifth shape) run the same way, one block at
 * a time as a team of FSD_BLOCK threads: fsd_block_sync() is an OpenMP
 * barrier, the block's shared memory one buffer the team shares, filled
 * with NaN before each block (the GPU's shared memory holds garbage, so a
 * read before a write shows), and a warp reduction combines the 32 slots of
 * the caller's warp, tid / 32. The barriers span the whole team, so here
 * every warp of a block must make the same number of warp reductions, which
 * the GPU does not need; the attention kernels do.
 */
#ifndef FSD_WARP_EMULATION_H
#define FSD_WARP_EMULATION_H

#include <omp.h>

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
#define FSD_COL_SUM_KERNEL(name, params, args)
/* the kernel's shared memory size, for FSD_RUN_BLOCKS */
#define FSD_BLOCK_KERNEL(name, smem_reals, params, args) \
    static inline int64_t name##_smem_reals(void) { return (smem_reals); }

#define FSD_RUN_ROWS(name, rows, args)                                          \
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
/* a column reduction's pass 1: its work items, each the GPU thread's */
#define FSD_RUN_COL_ITEMS(name, n, plan, args)                                  \
    do {                                                                        \
        const int64_t fsd_n_ = (n);                                             \
        _Pragma("omp parallel for schedule(static)")                            \
        for (int64_t fsd_i_ = 0; fsd_i_ < fsd_n_; fsd_i_++)                     \
            FSD_COL_SUM_ITEM(name, fsd_i_, plan, args);                         \
    } while (0)
#define FSD_RUN_COLS(name, cols, args)                                          \
    do {                                                                        \
        const int64_t fsd_cols_ = (cols);                                       \
        _Pragma("omp parallel for schedule(static)")                            \
        for (int64_t fsd_j_ = 0; fsd_j_ < fsd_cols_; fsd_j_++)                  \
            name##_cols(fsd_j_, fsd_j_ + 1, FSD_UNPAREN args);                  \
    } while (0)

#endif
