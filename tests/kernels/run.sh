#!/usr/bin/env bash
# run.sh — the kernel templates' tests (templates/, tests/kernels/test_kernels.c):
#
#   1. float64 build: finite-difference gradient checks of every backward
#      kernel, forward kernels against reference formulas, the acc contract,
#      determinism over thread counts, launcher argument checks;
#   2. the same under AddressSanitizer and UBSan;
#   3. float32 build: the same minus finite differences, float tolerances;
#      and the bf16 build (-DFSD_ACT_BF16: bf16 tensors, float math), bf16
#      tolerances;
#   4. float64 again with the GPU's 32-lane warps emulated by OpenMP teams,
#      so the lane logic the CPU's one-lane warps skip is tested too, and
#      its block kernels (the tiled attention) as teams of 128 threads; then
#      float32 and bf16 the same way: the tiled attention at the GPU's
#      precisions; and there the GPU's 16-byte vector kernels (portable.h,
#      FSD_VEC) against the scalar ones, aligned, misaligned and ragged;
#   5. templates/README.md lists every launcher with its exact signature;
#      the templates pasted one after another, as fsdpc emits them into
#      train.cu, compile as C on their own (float32, float64, bf16);
#   6. nvcc -x cu compiles the test (every launcher and kernel): float32
#      for sm_80 and sm_90, float64 for sm_80, bf16 for sm_90, when nvcc is
#      installed; and the GPU check's kernel timings (tests/gpu/kernel_bench.cu,
#      bf16, sm_90).
#
# Called by tests/all.sh (make test); runs on its own too. Every check
# prints one line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

CC=${CC:-cc}
NVCC=${NVCC:-nvcc}
B=build/kernels
mkdir -p "$B"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

SRC=tests/kernels/test_kernels.c
HDRS="portable.h embed.h norm.h rope.h mma.h attention_gpu.h attention_mma.h attention_cpu.h attention.h act.h elementwise.h cross_entropy.h"
CFLAGS="-std=c11 -O2 -Wall -Wextra -Wshadow -Werror -Iruntime -Itemplates"
# The CPU attention path calls BLAS through runtime/blas.c (its default,
# OpenBLAS, here: tools/blas.sh check tests the others); one BLAS thread per
# OpenMP thread, as the CPU runtime runs it.
BLAS_CFLAGS=$(pkg-config --cflags openblas 2>/dev/null)
BLAS_LIBS=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
export OPENBLAS_NUM_THREADS=1
OMP=-fopenmp
if ! printf 'int main(void) { return 0; }\n' | $CC -fopenmp -x c - -o "$TMP/probe" >/dev/null 2>&1; then
    OMP="-Wno-unknown-pragmas"
    echo "note: $CC has no OpenMP (-fopenmp); kernels run on one thread, determinism checks skip"
fi

# build NAME FLAGS...: compiles the test program to $B/NAME
build() {
    local name=$1
    shift
    if $CC $CFLAGS $BLAS_CFLAGS $OMP "$@" -o "$B/$name" "$SRC" runtime/blas.c $BLAS_LIBS -lm >"$TMP/build" 2>&1; then
        return 0
    fi
    bad "kernels $name: build failed ($CC $*)" "$TMP/build"
    return 1
}

# The nvcc compiles take longest: start them now, collect them at the end.
# Both precisions for sm_80; float32, what the GPU build uses, also sm_90;
# bf16 tensors (a bf16 policy's build) for sm_90.
nvcc_pids=""
declare -A nvcc_pid nvcc_arch
nvcc_arch[float32]="sm_80 and sm_90"
nvcc_arch[float64]="sm_80"
nvcc_arch[bf16]="sm_90"
nvcc_arch[bench]="sm_90"
if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "skip kernels: nvcc compile check: $NVCC not found (install the CUDA toolkit to run it)"
else
    "$NVCC" -x cu -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
        -Xcompiler -Wall -Iruntime -Itemplates -c "$SRC" -o "$B/test_cuda_f32.o" \
        >"$TMP/nvcc.float32" 2>&1 &
    nvcc_pid[float32]=$!
    "$NVCC" -x cu -arch=sm_80 -DFSD_FLOAT64 -Xcompiler -Wall -Iruntime -Itemplates -c "$SRC" \
        -o "$B/test_cuda_f64.o" >"$TMP/nvcc.float64" 2>&1 &
    nvcc_pid[float64]=$!
    "$NVCC" -x cu -arch=sm_90 -DFSD_ACT_BF16 -Xcompiler -Wall -Iruntime -Itemplates -c "$SRC" \
        -o "$B/test_cuda_bf16.o" >"$TMP/nvcc.bf16" 2>&1 &
    nvcc_pid[bf16]=$!
    "$NVCC" -arch=sm_90 -DFSD_ACT_BF16 -Xcompiler -Wall -Iruntime -Itemplates \
        -c tests/gpu/kernel_bench.cu -o "$B/kernel_bench.o" >"$TMP/nvcc.bench" 2>&1 &
    nvcc_pid[bench]=$!
    nvcc_pids="${nvcc_pid[float32]} ${nvcc_pid[float64]} ${nvcc_pid[bf16]} ${nvcc_pid[bench]}"
fi

# ── 1. float64: finite differences and references ──
build test_f64 -DFSD_FLOAT64 && suite "kernels f64: " "$B/test_f64"

# ── 2. float64 under ASan and UBSan ──
if build test_san -DFSD_FLOAT64 -O0 -g -fno-omit-frame-pointer \
        -fsanitize=address,undefined -fno-sanitize-recover=all; then
    suite "kernels san: " env ASAN_OPTIONS=detect_leaks=1 "$B/test_san"
fi

# ── 3. float32: references, float tolerances; bf16 tensors, bf16 tolerances ──
build test_f32 && suite "kernels f32: " "$B/test_f32"
build test_bf16 -DFSD_ACT_BF16 && suite "kernels bf16: " "$B/test_bf16"

# ── 4. float64 with 32-lane warps emulated on the CPU ──
# The GPU's lane logic (strided loops, warp reductions, lane-0 stores) on a
# machine without a GPU: tests/kernels/warp_emulation.h. A body that skips a
# reduction on some lanes hangs there, hence the time limit, which is a hang
# guard only: teams of 128 threads meet at a barrier only once the cores
# have run every one of them, so a loaded machine stretches a run far more
# than its CPU time (test_warp32_bf16: 10 s of CPU took 140 s beside the
# other suites, and 120 s ran out once), and WARP_TIMEOUT is well past that.
# Block kernels run as teams of 128 threads the same way (a block barrier
# is an OpenMP barrier): the GPU's tiled attention, against float64
# formulas and finite differences, and in float32 and bf16 against the
# formulas.
WARP_TIMEOUT=${WARP_TIMEOUT:-900}
if [ "$OMP" = -fopenmp ]; then
    build test_warp32 -DFSD_FLOAT64 -DFSD_WARP_EMULATION -Itests/kernels &&
        suite "kernels warp32: " env OMP_WAIT_POLICY=passive timeout $WARP_TIMEOUT "$B/test_warp32"
    build test_warp32_f32 -DFSD_WARP_EMULATION -Itests/kernels &&
        suite "kernels warp32 f32: " env OMP_WAIT_POLICY=passive timeout $WARP_TIMEOUT "$B/test_warp32_f32"
    build test_warp32_bf16 -DFSD_ACT_BF16 -DFSD_WARP_EMULATION -Itests/kernels &&
        suite "kernels warp32 bf16: " env OMP_WAIT_POLICY=passive timeout $WARP_TIMEOUT "$B/test_warp32_bf16"
    # the tiles fsdpc emits for models whose heads are 64 wide or less
    build test_warp32_hd64 -DFSD_ACT_BF16 -DFSD_WARP_EMULATION -DFSD_ATTN_HD_MAX=64 -Itests/kernels &&
        suite "kernels warp32 bf16 hd64: " env OMP_WAIT_POLICY=passive timeout $WARP_TIMEOUT "$B/test_warp32_hd64"
else
    echo "skip kernels warp32: warp emulation needs OpenMP, which $CC lacks"
fi

# ── the README's launcher list matches the headers ──
# One normalised line per signature: `LAUNCHER void f(...)` in templates/*.h,
# `void f(...);` in templates/README.md.
launchers_in_headers() {
    awk '/^LAUNCHER void /{on=1; s=""} on{s=s" "$0} on&&/\)$/{on=0; sub(/^ *LAUNCHER /,"",s);
         gsub(/[ \t]+/," ",s); gsub(/\( /,"(",s); print s}' templates/*.h | sort
}
launchers_in_readme() {
    awk '/^void /{on=1; s=""} on{s=s" "$0} on&&/\);/{on=0; sub(/;.*/,"",s); sub(/^ */,"",s);
         gsub(/[ \t]+/," ",s); gsub(/\( /,"(",s); print s}' templates/README.md | sort
}
launchers_in_headers >"$TMP/h"
launchers_in_readme >"$TMP/r"
if [ -s "$TMP/h" ] && diff -u "$TMP/h" "$TMP/r" >"$TMP/d"; then
    ok "kernels: templates/README.md lists all $(wc -l <"$TMP/h") launchers with their signatures"
else
    bad "kernels: templates/README.md and the headers' launchers differ (- headers, + README)" "$TMP/d"
fi

# ── 5. pasted as in train.cu ──
# emit.c writes `#include "fsdrt.h"`, then portable.h, then the families it
# needs; a family must not need a file beside it.
{
    echo '#include "fsdrt.h"'
    for h in $HDRS; do cat "templates/$h"; done
} >"$B/pasted.c"
for variant in float32: float64:-DFSD_FLOAT64 bf16:-DFSD_ACT_BF16; do
    what=${variant%%:*} prec=${variant#*:}
    if $CC -std=c11 -Wall -Wextra -Wshadow -Werror $OMP $prec -Iruntime $BLAS_CFLAGS -fsyntax-only \
            "$B/pasted.c" >"$TMP/pasted" 2>&1; then
        ok "kernels: templates pasted into one file compile with $CC ($what)"
    else
        bad "kernels: templates pasted into one file ($CC, $what)" "$TMP/pasted"
    fi
done

# ── 6. CUDA compile check (started first, in the background) ──
if [ -n "$nvcc_pids" ]; then
    for what in float32 float64 bf16; do
        if wait "${nvcc_pid[$what]}" && ! grep -q warning "$TMP/nvcc.$what"; then
            ok "kernels: nvcc -x cu compiles every kernel, ${nvcc_arch[$what]} ($what)"
        else
            bad "kernels: nvcc -x cu -c $SRC ($what)" "$TMP/nvcc.$what"
        fi
    done
    if wait "${nvcc_pid[bench]}" && ! grep -q warning "$TMP/nvcc.bench"; then
        ok "kernels: nvcc compiles tests/gpu/kernel_bench.cu, ${nvcc_arch[bench]} (bf16)"
    else
        bad "kernels: nvcc -c tests/gpu/kernel_bench.cu (bf16)" "$TMP/nvcc.bench"
    fi
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
