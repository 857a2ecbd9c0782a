/*
 * mma.h — warp-level bf16 matrix products on tensor cores, for the
 * attention kernels of programs that store their tensors in bf16
 * (templates/attention.h).
 *
 * One operation: D = A·B + C on a 16×16 A, a 16×8 B and a 16×8 C/D, the
 * PTX instruction mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32
 * (sm_80 and later): bf16 operands, products summed in fp32. The 32 lanes
 * of a warp each hold a share of every matrix in registers (a "fragment");
 * the layout is the PTX ISA's ("Matrix fragments for mma.m16n8k16 with
 * floating point type"), with g = lane / 4 and t = lane % 4:
 *
 *   A (fsd_fa, 4 × 32 bits, 8 bf16): x0 = A[g][2t, 2t+1], x1 = A[g+8][2t, 2t+1],
 *                                    x2 = A[g][2t+8, 2t+9], x3 = A[g+8][2t+8, 2t+9]
 *   B (fsd_fb, 2 × 32 bits, 4 bf16): x0 = B[2t, 2t+1][g], x1 = B[2t+8, 2t+9][g]
 *   C (fsd_fc, 4 floats):            x0, x1 = C[g][2t, 2t+1], x2, x3 = C[g+8][2t, 2t+1]
 *
 * a pair of bf16 in one 32-bit register with the lower-indexed element in
 * the low 16 bits. So C's row g is spread over the 4 lanes 4g..4g+3 (a
 * "quad"): a reduction along a row of C is two xor shuffles (fsd_quad_*).
 *
 * The loaders read tiles of bf16 in shared memory with ldmatrix (sm_75 and
 * later): ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 loads four 8×8
 * matrices of 16-bit elements in one instruction, lanes 8m..8m + 7
 * giving the addresses of the 8 rows of matrix m (16 bytes each, which
 * must be 16-byte aligned: the tile's address and its row stride ld a
 * multiple of 8 elements). Lane i receives a register of each matrix m in
 * turn: without .trans elements 2(i%4), 2(i%4) + 1 of row i/4, the layout
 * of a row-major fragment above; with .trans the same of the transposed
 * matrix (elements i/4 of rows 2(i%4), 2(i%4) + 1). So one instruction
 * fills an A fragment, or two B fragments (columns 0-7 and 8-15 of a 16×16
 * B), where scalar loads would take 4 (32-bit) to 8 (16-bit, where a pair
 * runs down a column).
 *
 * Two implementations with one layout: inline PTX on the GPU (mma, shuffles,
 * ldmatrix, cvt; bf16 tensor cores start at sm_80, and below it fsd_mma
 * traps), and in the tests' warp emulation (tests/kernels/warp_emulation.h)
 * collectives over the block's OpenMP team: each lane writes its fragments
 * (or, for ldmatrix, its row address) to shared slots, a barrier, each
 * lane computes its own D elements (fp32, k in order) or gathers its
 * registers from the slots by the layouts above, another barrier. The
 * emulation's barriers span the block, so every thread of a block must
 * make the same sequence of fsd_mma, loader and fsd_quad_* calls: uniform
 * control flow, which mma.sync and ldmatrix need of a warp anyway.
 */
#ifndef FSD_MMA_H
#define FSD_MMA_H
#ifndef FSD_PORTABLE_H
#include "portable.h"
#endif
/* Only for bf16 tensors on the GPU or its emulation: elsewhere (fsdpc
 * pastes this file into every train.cu that has attention) it defines
 * nothing. FSD_MMA says the primitives are there. */
#if defined(FSD_ACT_IS_BF16) && (defined(__CUDACC__) || defined(FSD_BLOCK_EMULATION))
#define FSD_MMA 1

typedef struct { uint32_t x[4]; } fsd_fa;   /* A: 16x16 bf16, row-major, 8 elements a lane */
typedef struct { uint32_t x[2]; } fsd_fb;   /* B: 16x8 bf16 ("col"), 4 elements a lane */
typedef struct { float x[4]; } fsd_fc;      /* C, D: 16x8 fp32, 4 elements a lane */

/* Where C element i (0..3) of a lane sits in its 16x8 tile. */
DEVICE int fsd_fc_row(int lane, int i) { return lane / 4 + 8 * (i / 2); }
DEVICE int fsd_fc_col(int lane, int i) { return 2 * (lane % 4) + i % 2; }

DEVICE fsd_fc fsd_fc_zero(void)
{
    fsd_fc c;
    for (int i = 0; i < 4; i++)
        c.x[i] = 0;
    return c;
}

/* Two bf16 as one register: lo in the low half. */
DEVICE uint32_t fsd_bf16_pair(fsd_bf16 lo, fsd_bf16 hi)
{
    return (uint32_t)lo.bits | (uint32_t)hi.bits << 16;
}

/* ldmatrix .x4 (trans: .x4.trans) over the calling warp: row is this
 * lane's row address (lanes 8m..8m + 7: the rows of matrix m), r[m] its
 * register of matrix m. */
#ifdef FSD_BLOCK_EMULATION
DEVICE void fsd_ldsm_x4(uint32_t r[4], const fsd_bf16 *row, bool trans)
{
    fsd_emu_ldmatrix(r, row, trans);
}
#else
DEVICE void fsd_ldsm_x4(uint32_t r[4], const fsd_bf16 *row, bool trans)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
    const uint32_t at = (uint32_t)__cvta_generic_to_shared(row);
    /* volatile: the tile is written by plain stores before a barrier,
     * which the compiler must not move this load above */
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(at));
#else
    (void)r, (void)row, (void)trans;
    fsd_trap();   /* no ldmatrix before sm_75 */
#endif
}
#endif

/* A[i][k] = s[i·ld + k], i, k < 16: matrices (rows 0-7, columns 0-7),
 * (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) are x0..x3 */
DEVICE fsd_fa fsd_load_a(const fsd_bf16 *s, int ld, int lane)
{
    const int m = lane / 8;
    fsd_fa a;
    fsd_ldsm_x4(a.x, s + (lane % 8 + 8 * (m % 2)) * ld + 8 * (m / 2), false);
    return a;
}

/* B[k][n] = s[n·ld + k], k < 16, n < 16, as two fragments: b[0] columns
 * n 0-7, b[1] columns 8-15. B's columns are rows of s (K's rows for
 * S = Q·Kᵀ); matrices (rows 0-7, columns 0-7), (0-7, 8-15), (8-15, 0-7),
 * (8-15, 8-15) are b[0].x0, b[0].x1, b[1].x0, b[1].x1. */
DEVICE void fsd_load_b2(fsd_fb b[2], const fsd_bf16 *s, int ld, int lane)
{
    const int m = lane / 8;
    uint32_t r[4];
    fsd_ldsm_x4(r, s + (lane % 8 + 8 * (m / 2)) * ld + 8 * (m % 2), false);
    b[0].x[0] = r[0], b[0].x[1] = r[1], b[1].x[0] = r[2], b[1].x[1] = r[3];
}

/* B[k][n] = s[k·ld + n], k < 16, n < 16, as two fragments: b[0] columns
 * n 0-7, b[1] columns 8-15. B's rows are rows of s (V's rows for
 * O = P·V): a pair of a B register runs down a column of s, which
 * .trans gathers; matrices (rows 0-7, columns 0-7), (8-15, 0-7),
 * (0-7, 8-15), (8-15, 8-15) are b[0].x0, b[0].x1, b[1].x0, b[1].x1. */
DEVICE void fsd_load_b2_t(fsd_fb b[2], const fsd_bf16 *s, int ld, int lane)
{
    const int m = lane / 8;
    uint32_t r[4];
    fsd_ldsm_x4(r, s + (lane % 8 + 8 * (m % 2)) * ld + 8 * (m / 2), true);
    b[0].x[0] = r[0], b[0].x[1] = r[1], b[1].x[0] = r[2], b[1].x[1] = r[3];
}

/* Two floats rounded to bf16 (to nearest even), lo in the low half. */
DEVICE uint32_t fsd_pack_bf16(float lo, float hi)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    uint32_t r;
    /* cvt.rn.bf16x2.f32 d, a, b puts a in the upper half */
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return fsd_bf16_pair(fsd_narrow(lo), fsd_narrow(hi));
#endif
}

/* A 16x16 result held as two C tiles, lo (columns 0-7) and hi (columns
 * 8-15), rounded to bf16 as an A operand: the C and A layouts agree on
 * which lane holds which element, so no data moves between lanes
 * (FlashAttention-2 feeds P to P·V so). */
DEVICE fsd_fa fsd_fa_from_fc(fsd_fc lo, fsd_fc hi)
{
    fsd_fa a;
    a.x[0] = fsd_pack_bf16(lo.x[0], lo.x[1]);
    a.x[1] = fsd_pack_bf16(lo.x[2], lo.x[3]);
    a.x[2] = fsd_pack_bf16(hi.x[0], hi.x[1]);
    a.x[3] = fsd_pack_bf16(hi.x[2], hi.x[3]);
    return a;
}

#ifdef FSD_BLOCK_EMULATION
/* the collectives of tests/kernels/warp_emulation.h */
DEVICE void fsd_mma(fsd_fc *d, fsd_fa a, fsd_fb b) { fsd_emu_mma(d->x, a.x, b.x); }
DEVICE float fsd_quad_max(float v) { return fsd_emu_quad(v, true); }
DEVICE float fsd_quad_sum(float v) { return fsd_emu_quad(v, false); }
#else
/* d += a·b */
DEVICE void fsd_mma(fsd_fc *d, fsd_fa a, fsd_fb b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d->x[0]), "+f"(d->x[1]), "+f"(d->x[2]), "+f"(d->x[3])
        : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
#else
    (void)d, (void)a, (void)b;
    fsd_trap();   /* no bf16 tensor cores before sm_80 */
#endif
}

/* Over the quad of lanes that share a row of C: xor 1, then xor 2; every
 * lane ends with the same bits (each step combines a pair in both orders). */
DEVICE float fsd_quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
DEVICE float fsd_quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
#endif

#endif /* bf16 on the GPU or its emulation */
#endif /* FSD_MMA_H */
