#!/usr/bin/env bash
# run.sh — the CUDA build on a GPU machine, checked against the CPU build.
# Two ways to run it:
#
#   tests/gpu/run.sh             on a machine that has everything: the
#       repository, the CUDA toolkit with NCCL, MPI and OpenBLAS (for the
#       CPU build it is compared with), flex and bison, and one GPU. Under 5
#       minutes on an H100/H200.
#   tests/gpu/run.sh --pack DIR  here, no GPU needed: builds fsdpc and the
#       CPU trainers, makes the data, runs the CPU references (the same runs
#       and seeds as the one-command mode), writes the memory plans and the
#       simulation, emits the four train.cu, and copies them with what a
#       CUDA build needs (runtime/, templates/, tests/kernels/, the MPI=0
#       build's flags from `make cuda-build-vars`, NCCL's header as a
#       fallback) into DIR, with DIR/run.sh (tests/gpu/device.sh). Carry DIR
#       to a GPU machine that has only bash, coreutils, awk, a C compiler,
#       nvcc, NCCL and cuBLASLt (nvidia-smi if there: no MPI, OpenBLAS,
#       bison, make or python needed) and run `bash DIR/run.sh` there: it
#       builds the trainers without MPI (MPI=0) and the kernel tests for
#       that GPU, runs checks 2-8 against the carried references, and prints
#       the same lines. NCCL_HOME points it at an NCCL the search misses.
#
# Both modes run the same checks, tests/gpu/lib.sh's gpu_checks (2-8):
#
#   1. builds the CUDA trainers for tiny, GPT-2, tiny_offload and tiny_bf16
#      (for this GPU's architecture only; with MPI, or from a pack without)
#      and the kernel tests, and the CPU trainers of the three tiny models;
#      the `--pack DIR tiny gpt2` form packs those models alone, enough for
#      `DIR/run.sh --build-only sm_XX` (tests/cuda/run.sh's check), not for
#      the checks;
#   2. tiny, 50 steps, same seed and data, CPU build against GPU build:
#        fp32 products (FSD_TF32=0): the step-0 loss within 1e-5 relative
#        (the forward pass alone: only summation order differs), every
#        step's loss within 1e-3 relative and grad norm within 1e-2 (50
#        steps of AdamW amplify rounding differences; a wrong kernel or a
#        missed gradient is off by far more), bytes moved equal, and the
#        counted memory peak equal (tiny's fp32 policy counts the same
#        buffers on both backends);
#        TF32 products (the default): every loss within 3e-2 relative
#        (TF32 keeps 10 mantissa bits);
#      the fp32 run bootstraps NCCL over MPI (mpirun -np 1; from a pack:
#      alone, world 1 with no bootstrap), the TF32 run through
#      FSD_NCCL_ID_FILE;
#   2b. tests/cuda/tiny_bf16.fsd (tiny computing in bf16), 50 steps, CPU
#      build against GPU build: step-0 loss within 1e-4, losses within 1e-2,
#      grad norms within 5e-2 (bounds explained at the check);
#   3. tiny on the GPU, checkpoint and resume: 10 steps, save, resume, 10
#      more equal 20 straight (losses to 1e-6, exported weights byte for
#      byte): bk_to_host / bk_from_host and the pools across a restart;
#   4. GPT-2 124M, 20 steps on synthetic data (fsdata synth, vocab 50257):
#      tokens/s, MFU and the counted memory peak against the plan
#      (fsdpc --dump-memory --world 1) and the simulator (--sim h200:gpus=1),
#      the device's own peak (nvidia-smi); the step-0 loss near ln(50257),
#      every loss finite, the counted peak the plan's to the byte (bf16
#      compute: its buffers are the plan's, the arena held whole), and the
#      trainer's start-up lines on what the device holds beyond it
#      (docs/cuda.md#memory-beyond-the-plan) beside nvidia-smi's; then,
#      FSD_GEMM_BENCH, every product shape of the run timed (printed, not
#      judged); 4b. 3 steps with --trace-out: the device's times in the
#      trace (ops in order, none overlapping);
#   5. no run printed the pool's "did not foresee" note (a cudaMalloc
#      inside a step);
#   6. `offload = cpu` (tests/cuda/tiny_offload.fsd: tiny with its shards,
#      gradients and optimizer state in pinned host memory, the optimizer on
#      the host): 50 steps against the CPU build at the same seed, held to
#      2's fp32 tolerances (loss, grad norm, bytes moved); the counted peak
#      lower than tiny's without offload, and equal to the CPU build's plus
#      the device gradient accumulators (grad_accum 2: one gradient shard,
#      the plan's "sharded gradients"); a checkpoint after 10 steps resumed
#      to 20 equal to 20 straight, exported weights byte for byte (shards
#      already on the host through bk_to_host / bk_from_host);
#   7. tests/kernels/test_kernels.c built with nvcc for this GPU (fp32, bf16
#      act, and bf16 act with GPT-2's 64-wide attention tiles) and run:
#      every kernel (the tiled and the tensor-core attention included)
#      against its float64 references and finite differences, on the device;
#   8. tests/gpu/kernel_bench.cu: the elementwise, row and column-sum kernels
#      at GPT-2's shapes (bf16), each scalar kernel against its 16-byte
#      vector version: milliseconds, GB/s, the ratio, printed (speed fails
#      nothing); fails on a CUDA error or where the two paths' outputs must
#      be the same bits and are not.
#
# Prints one line per check and exits non-zero on any failure. Outputs
# (logs, data) stay in build/gpu-test (GPU_TEST_OUT) for a look afterwards;
# a pack's in DIR/out.
set -u
PACK=""
PACK_MODELS=(tiny gpt2 tiny_offload tiny_bf16)
usage="usage: tests/gpu/run.sh [--pack DIR [tiny|gpt2|tiny_offload|tiny_bf16]...]"
if [ "${1:-}" = --pack ] && [ -n "${2:-}" ]; then
    PACK=$(realpath -m "$2")
    if [ $# -gt 2 ]; then
        # a pack of some models only: enough for a build check
        # (tests/cuda/run.sh), not for DIR/run.sh's checks
        PACK_MODELS=("${@:3}")
        for m in "${PACK_MODELS[@]}"; do
            case $m in
            tiny | gpt2 | tiny_offload | tiny_bf16) ;;
            *) echo "$usage" >&2; exit 2 ;;
            esac
        done
    fi
    # DIR is emptied first: never a directory that is not an earlier pack
    if [ -e "$PACK" ] && [ ! -e "$PACK/PACKED" ] && [ -n "$(ls -A "$PACK" 2>/dev/null)" ]; then
        echo "tests/gpu/run.sh --pack $2: the directory exists and holds no pack; name a new one" >&2
        exit 2
    fi
elif [ $# -gt 0 ]; then
    echo "$usage" >&2
    exit 2
fi
cd "$(dirname "$0")/../.." || exit 2
. tests/gpu/lib.sh

MAKE=${MAKE:-make}
OUT=${GPU_TEST_OUT:-build/gpu-test}
GPT2_STEPS=${GPT2_STEPS:-20}
mkdir -p "$OUT"
t0=$(date +%s)

# build MAKE-ARGS...: one make, one line; the run stops at a failure
build() {
    if $MAKE --no-print-directory "$@" >"$OUT/build.log" 2>&1; then
        ok "make $*"
    else
        bad "make $*" "$OUT/build.log"
        exit 1
    fi
}

# the models the checks use, by name
ALL_MODELS=(tiny gpt2 tiny_offload tiny_bf16)
fsd_of() {
    case $1 in
    tiny | gpt2) echo "examples/$1.fsd" ;;
    *) echo "tests/cuda/$1.fsd" ;;
    esac
}

# cpu_side MODEL...: fsdpc, the CPU trainers of those models that have a CPU
# reference (two at a time, once fsdpc and the runtime they share are
# built), the data and the reference runs
cpu_side() {
    local m st=0 cpu=()
    build all runtime
    for m in "$@"; do
        [ "$m" = gpt2 ] && continue
        cpu+=("$m")
        rm -f "$OUT/cpu/$m/train"
        $MAKE --no-print-directory trainer FSD="$(fsd_of "$m")" BACKEND=cpu TRAINER="$OUT/cpu/$m" \
            >"$OUT/build_cpu_$m.log" 2>&1 &
        [ "$(jobs -rp | wc -l)" -ge 2 ] && wait -n
    done
    wait
    for m in ${cpu[@]+"${cpu[@]}"}; do
        if [ -x "$OUT/cpu/$m/train" ]; then
            ok "make trainer FSD=$(fsd_of "$m") BACKEND=cpu TRAINER=$OUT/cpu/$m"
        else
            bad "make trainer FSD=$(fsd_of "$m") BACKEND=cpu TRAINER=$OUT/cpu/$m" "$OUT/build_cpu_$m.log"
            st=1
        fi
    done
    [ $st = 0 ] || exit 1
    mkdir -p "$DATA" "$REF"
    build/fsdata synth "$DATA/tiny.bin" --tokens 200000 --seed 1 --vocab 256 >/dev/null
    build/fsdata synth "$DATA/gpt2.bin" --tokens $((GPT2_STEPS * 32 * 1025 + 200000)) --seed 1 \
        --vocab 50257 >/dev/null
    cpu_reference build/fsdpc "$OUT/cpu" "$@"
}

if [ -n "$PACK" ]; then
    # ── --pack DIR: the CPU half here, the GPU half in DIR/run.sh ──
    rm -rf "$PACK"
    mkdir -p "$PACK"/{models,runtime,templates,tests/kernels,include}
    DATA=$PACK/data
    REF=$PACK/ref
    cpu_side "${PACK_MODELS[@]}"
    for m in "${PACK_MODELS[@]}"; do
        mkdir -p "$PACK/models/$m"
        if build/fsdpc "$(fsd_of "$m")" -o "$PACK/models/$m/train.cu" >"$OUT/emit.log" 2>&1; then
            ok "fsdpc $(fsd_of "$m") -o $PACK/models/$m/train.cu"
        else
            bad "fsdpc $(fsd_of "$m")" "$OUT/emit.log"
        fi
    done
    # GPT-2's plan for tools/calibrate.py: each op's FLOPs and bytes, by the
    # names the device run's --trace-out (check 4b, DIR/out/gpt2_trace.json)
    # gives its slices (docs/simulator.md#calibration-files)
    if [[ " ${PACK_MODELS[*]} " == *" gpt2 "* ]]; then
        if build/fsdpc examples/gpt2.fsd --sim h200:gpus=1 --trace "$PACK/gpt2.plan.json" \
                >"$OUT/plan.log" 2>&1; then
            ok "fsdpc examples/gpt2.fsd --sim h200:gpus=1 --trace $PACK/gpt2.plan.json"
        else
            bad "fsdpc examples/gpt2.fsd --trace $PACK/gpt2.plan.json" "$OUT/plan.log"
        fi
    fi
    cp runtime/*.c runtime/*.h runtime/*.cu "$PACK/runtime/"
    cp templates/*.h "$PACK/templates/"
    cp tests/kernels/*.c tests/kernels/*.h "$PACK/tests/kernels/"
    mkdir -p "$PACK/tests/gpu"
    cp tests/gpu/kernel_bench.cu "$PACK/tests/gpu/"
    cp tests/gpu/lib.sh "$PACK/lib.sh"
    cp tests/gpu/device.sh "$PACK/run.sh"
    chmod +x "$PACK/run.sh"
    $MAKE --no-print-directory -s cuda-build-vars MPI=0 >"$PACK/build-vars.sh" ||
        bad "make cuda-build-vars MPI=0" "$PACK/build-vars.sh"
    printf "GPT2_STEPS=%s\nPACK_MODELS='%s'\n" "$GPT2_STEPS" "${PACK_MODELS[*]}" >>"$PACK/build-vars.sh"
    # NCCL's header, for a GPU machine with NCCL's library but not its
    # header (the device script uses it only then, and says so)
    nccl_h=$(printf '#include <nccl.h>\n' | ${NVCC:-nvcc} -x cu -M - 2>/dev/null | tr ' \\' '\n\n' |
             grep '/nccl\.h$' | head -n 1)
    [ -n "$nccl_h" ] && cp "$nccl_h" "$PACK/include/nccl.h"
    {
        echo "packed $(date -u '+%Y-%m-%d %H:%M UTC') from $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with local changes)'); models: ${PACK_MODELS[*]}"
        echo "nvcc here: $(${NVCC:-nvcc} --version 2>/dev/null | tail -n 1)"
        echo "NCCL header: ${nccl_h:-none found}"
    } >"$PACK/PACKED"
    size=$(du -sh "$PACK" | cut -f1)
    next="carry it to the GPU machine and run bash $PACK/run.sh there"
    [ "${PACK_MODELS[*]}" = "${ALL_MODELS[*]}" ] ||
        next="only ${PACK_MODELS[*]}: for bash $PACK/run.sh --build-only sm_XX"
    echo "tests/gpu/run.sh --pack: $fails failed, $(($(date +%s) - t0)) s; $PACK ($size): $next"
    [ $fails = 0 ]
    exit
fi

# ── one command, on a GPU machine that has everything ──
if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu/run.sh needs a GPU: nvidia-smi -L finds none (tests/cuda/run.sh checks the build without one; tests/gpu/run.sh --pack DIR prepares a run elsewhere)"
    exit 2
fi
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
ARCH=sm_$cap
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "GPU: $gpu ($ARCH); $(nvcc --version | tail -n 1)"

# ── 1. builds ──
DATA=$OUT
REF=$OUT
CUDA_BUILD=$OUT/cuda
GPU_LAUNCH=mpirun
cpu_side "${ALL_MODELS[@]}"
for m in "${ALL_MODELS[@]}"; do
    build trainer FSD="$(fsd_of "$m")" BACKEND=cuda ARCH="$ARCH" TRAINER="$CUDA_BUILD/$m"
done
for prec in fp32 bf16 bf16_hd64; do
    kernel_test_build . "$ARCH" $prec
done
kernel_bench_build . "$ARCH"

gpu_checks

echo "tests/gpu/run.sh: $fails failed, $(($(date +%s) - t0)) s; logs in $OUT"
[ $fails = 0 ]
