/*
 * warp_emulation.h — a test-only backend for the kernel templates: the CPU
 * runs every row kernel the way the GPU does, with a warp of 32 lanes, so
 * the lane-strided loops, the warp reductions and the lane-0 stores are
 * exercised on machines without a GPU. portable.h includes it in place of
 * its CPU section when FSD_WARP_EMULATION is defined (tests/kernels/run.sh
 * builds test_kernels.c that way).
 *
 * Each row runs as an OpenMP team of 32 threads, one per lane; a warp
 * reduction is a barrier, a store to a shared slot, a barrier, and every
 * lane summing the slots in lane order (so all lanes agree, as with the
 * GPU's xor butterfly). Rows run one after another. A body that skipped a
 * reduction on some lanes would hang here, as it would break on the GPU:
 * run.sh runs this build under a timeout. Elementwise kernels run as on
 * the CPU; column kernels take one column per call, as on the GPU.
 */
#ifndef FSD_WARP_EMULATION_H
#define FSD_WARP_EMULATION_H

#include <omp.h>

#define DEVICE static inline
#define FSD_WARP 32
#define FSD_COL_TILE 1

static double fsd_emu_slot[FSD_WARP];

static inline double fsd_emu_reduce(double v, bool max)
{
    int lane = omp_get_thread_num();
#pragma omp barrier
    fsd_emu_slot[lane] = v;   /* the barrier above: everyone has read the last reduction */
#pragma omp barrier
    double s = fsd_emu_slot[0];
    for (int i = 1; i < FSD_WARP; i++)
        s = max ? fmax(s, fsd_emu_slot[i]) : s + fsd_emu_slot[i];
    return s;
}

DEVICE real fsd_warp_sum(real v) { return (real)fsd_emu_reduce(v, false); }
DEVICE double fsd_warp_sum_f64(double v) { return fsd_emu_reduce(v, false); }
DEVICE real fsd_warp_max(real v) { return (real)fsd_emu_reduce(v, true); }
DEVICE void fsd_trap(void) { abort(); }

static inline void fsd_emu_team_check(void)
{
    if (omp_get_num_threads() != FSD_WARP) {
        fprintf(stderr, "warp emulation: got a team of %d threads, not %d\n",
                omp_get_num_threads(), FSD_WARP);
        abort();
    }
}

#define FSD_ROW_KERNEL(name, params, args)
#define FSD_ELEM_KERNEL(name, params, args)
#define FSD_COL_KERNEL(name, params, args)

#define FSD_RUN_ROWS(name, rows, args)                                          \
    do {                                                                        \
        const int64_t fsd_rows_ = (rows);                                       \
        omp_set_dynamic(0);                                                     \
        for (int64_t fsd_row_ = 0; fsd_row_ < fsd_rows_; fsd_row_++) {          \
            _Pragma("omp parallel num_threads(32)")                             \
            {                                                                   \
                fsd_emu_team_check();                                           \
                name##_row(fsd_row_, omp_get_thread_num(), FSD_WARP,            \
                           FSD_UNPAREN args);                                   \
            }                                                                   \
        }                                                                       \
    } while (0)
#define FSD_RUN_ELEMS(name, n, args)                                            \
    do {                                                                        \
        const int64_t fsd_n_ = (n);                                             \
        for (int64_t fsd_i_ = 0; fsd_i_ < fsd_n_; fsd_i_++)                     \
            name##_elem(fsd_i_, FSD_UNPAREN args);                              \
    } while (0)
#define FSD_RUN_COLS(name, cols, args)                                          \
    do {                                                                        \
        const int64_t fsd_cols_ = (cols);                                       \
        _Pragma("omp parallel for schedule(static)")                            \
        for (int64_t fsd_j_ = 0; fsd_j_ < fsd_cols_; fsd_j_++)                  \
            name##_cols(fsd_j_, fsd_j_ + 1, FSD_UNPAREN args);                  \
    } while (0)

#endif
