#!/usr/bin/env bash
# run.sh — the GPU half of tests/gpu/run.sh, run from a pack: `tests/gpu/run.sh
# --pack DIR` wrote this directory on a machine with the whole toolchain
# (this file is tests/gpu/device.sh there), with the CPU references already
# run. On the GPU machine:
#
#   bash DIR/run.sh                          build for this GPU, run checks 2-8
#   bash DIR/run.sh --build-only sm_XX [WHAT...]
#        only the builds, for sm_XX, no GPU needed; WHAT is any of the models
#        packed (tiny, gpt2, tiny_offload, tiny_bf16) and kernels (default:
#        all of them)
#
# Needs bash, coreutils, awk, a C compiler (cc, or CC), nvcc, NCCL and
# cuBLASLt; nvidia-smi if there (the architecture then comes from it, and
# GPT-2's device memory is sampled). No make, MPI, OpenBLAS or python: the
# runtime is built here without MPI (the Makefile's MPI=0, with the flags
# `make cuda-build-vars` wrote into build-vars.sh), the trainers start alone
# or through FSD_NCCL_ID_FILE, and the comparisons are lib.sh's, the same
# functions tests/gpu/run.sh calls in its one-command mode.
#
# NCCL, cuBLASLt and the CUDA runtime are looked for in NCCL_HOME
# (include/, lib/ or lib64/) when set, then beside nvcc (CUDA_HOME: its
# lib64, lib and targets/*/lib),
# in the loader's cache (ldconfig -p), in /usr/lib/x86_64-linux-gnu,
# /usr/lib64 and /usr/local/lib, and last in Python's NVIDIA wheels
# (site-packages/nvidia/*/lib of the python3 on PATH, which is not run);
# the directories found go into the trainers' rpath. Without nccl.h anywhere, the pack's copy (include/, from
# the packing machine) is used, and said so.
#
# Prints one line per build and check, and exits non-zero on any failure.
# Logs stay in DIR/out (GPU_TEST_OUT).
set -u
cd "$(dirname "$0")" || exit 2
PACK=$(pwd)
. ./lib.sh
. ./build-vars.sh

OUT=${GPU_TEST_OUT:-$PACK/out}
NVCC=${NVCC:-nvcc}
CC=${CC:-$(command -v cc || command -v gcc || echo cc)}
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$OUT/obj"
t0=$(date +%s)

build_only=no
read -r -a what <<<"${PACK_MODELS:-} kernels"
if [ "${1:-}" = --build-only ]; then
    if [[ ! ${2:-} =~ ^sm_[0-9]+a?$ ]]; then
        echo "usage: bash run.sh [--build-only sm_XX [tiny|gpt2|tiny_offload|tiny_bf16|kernels]...]" >&2
        exit 2
    fi
    build_only=yes
    ARCH=$2
    shift 2
    [ $# -gt 0 ] && what=("$@")
elif [ $# -gt 0 ]; then
    echo "usage: bash run.sh [--build-only sm_XX [tiny|gpt2|tiny_offload|tiny_bf16|kernels]...]" >&2
    exit 2
fi

if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "$NVCC not found: put the CUDA toolkit's bin on PATH (or set NVCC)"
    exit 2
fi
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")}

# ── the GPU and its architecture ──
if [ $build_only = no ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
        gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    else
        # no nvidia-smi: the CUDA runtime says, through a small program
        printf '%s\n' '#include <cstdio>' '#include <cuda_runtime_api.h>' \
            'int main() { cudaDeviceProp p; if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) return 1;' \
            '  std::printf("%d%d %s\n", p.major, p.minor, p.name); return 0; }' >"$OUT/probe.cu"
        info=""
        "$NVCC" "$OUT/probe.cu" -o "$OUT/probe" >"$OUT/probe.log" 2>&1 && info=$("$OUT/probe" 2>>"$OUT/probe.log")
        if [ -z "$info" ]; then
            echo "run.sh needs a GPU: neither nvidia-smi nor the CUDA runtime finds one"
            sed 's/^/     /' "$OUT/probe.log" | tail -5
            exit 2
        fi
        cap=${info%% *}
        gpu=${info#* }
    fi
    ARCH=sm_$cap
    if [ "${PACK_MODELS:-}" != "tiny gpt2 tiny_offload tiny_bf16" ]; then
        echo "this pack holds only ${PACK_MODELS:-no models} (packed for a build check): the checks need all four; pack again with tests/gpu/run.sh --pack DIR"
        exit 2
    fi
    echo "GPU: $gpu ($ARCH); $("$NVCC" --version | tail -n 1); pack: $(head -n 1 PACKED 2>/dev/null)"
fi
GENCODE="-gencode arch=compute_${ARCH#sm_},code=$ARCH"

# ── NCCL, cuBLASLt, the CUDA runtime ──
# lib_in NAME DIR...: "DIR FILE" for the first DIR holding NAME.so (or, without
# it, NAME.so.N: a machine with the library but not its development link)
lib_in() {
    local name=$1 d f
    shift
    for d in "$@"; do
        [ -d "$d" ] || continue
        if [ -e "$d/$name.so" ]; then
            echo "$d $name.so"
            return 0
        fi
        f=$(cd "$d" && ls "$name".so.* 2>/dev/null | sort -V | tail -n 1)
        if [ -n "$f" ]; then
            echo "$d $f"
            return 0
        fi
    done
    return 1
}
ldcache_dirs() {
    local ldc
    ldc=$(command -v ldconfig || echo /sbin/ldconfig)
    "$ldc" -p 2>/dev/null | awk -v n="$1" '$1 ~ "^" n "\\.so" { sub("/[^/]*$", "", $NF); print $NF }' |
        awk '!seen[$0]++'
}
# Python's NVIDIA wheels (nvidia-nccl-cu13, say, beside PyTorch) keep their
# libraries in site-packages/nvidia/*/lib, NCCL's header in ../include: the
# python3 on PATH names its prefix (it is not run), and the system's
# site-packages follow. Searched last.
WHEEL_DIRS=()
py_prefix=""
command -v python3 >/dev/null 2>&1 && py_prefix=$(dirname "$(dirname "$(command -v python3)")")
for d in ${py_prefix:+"$py_prefix"/lib/python3*/site-packages/nvidia/*/lib} \
        /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib; do
    [ -d "$d" ] && WHEEL_DIRS+=("$d")
done
# find_lib NAME: link flags for NAME (-L and -l, or the versioned file by
# name) and an rpath for its directory, appended to LIBS; 1 when not found
LIBS=()
LIB_DIRS=()
find_lib() {
    local name=$1 found dir file
    local dirs=()
    [ -n "${NCCL_HOME:-}" ] && dirs+=("$NCCL_HOME/lib" "$NCCL_HOME/lib64")
    dirs+=("$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME"/targets/*/lib)
    while read -r d; do dirs+=("$d"); done < <(ldcache_dirs "$name")
    dirs+=(/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/lib /usr/lib ${WHEEL_DIRS[@]+"${WHEEL_DIRS[@]}"})
    found=$(lib_in "$name" "${dirs[@]}") || return 1
    dir=${found% *}
    file=${found#* }
    if [ "$file" = "$name.so" ]; then
        LIBS+=(-L"$dir" -l"${name#lib}")
    else
        LIBS+=(-L"$dir" -l:"$file")
    fi
    LIBS+=(-Xlinker -rpath -Xlinker "$dir")
    LIB_DIRS+=("$name: $dir/$file")
}
if ! find_lib libnccl; then
    bad "NCCL: no libnccl.so in NCCL_HOME, beside nvcc ($CUDA_HOME), in ldconfig -p or the usual directories: set NCCL_HOME"
    exit 1
fi
if ! find_lib libcublasLt; then
    bad "cuBLASLt: no libcublasLt.so beside nvcc ($CUDA_HOME), in ldconfig -p or the usual directories"
    exit 1
fi
# the CUDA runtime, linked as the Makefile does (shared), with its directory in the rpath
find_lib libcudart || LIBS+=(-lcudart)
# nccl.h: NCCL_HOME's, nvcc's own search, beside the library, the system's, else the pack's
INC=(-I"$CUDA_HOME/include")
for d in "$CUDA_HOME"/targets/*/include; do [ -d "$d" ] && INC+=(-I"$d"); done
nccl_inc=""
for d in ${NCCL_HOME:+"$NCCL_HOME/include"} "$CUDA_HOME/include" "$CUDA_HOME"/targets/*/include \
        "$(dirname "${LIB_DIRS[0]#libnccl: }")/../include" /usr/include /usr/local/include; do
    if [ -e "$d/nccl.h" ]; then
        nccl_inc=$d
        break
    fi
done
if [ -z "$nccl_inc" ]; then
    nccl_inc=$PACK/include
    echo "note: no nccl.h on this machine: building with the pack's ($(sed -n 3p PACKED 2>/dev/null))"
fi
INC+=(-I"$nccl_inc")
echo "${LIB_DIRS[*]}; nccl.h in $nccl_inc"

# ── 1. builds: the runtime without MPI, the trainers, the kernel tests ──
# one line each; the compiles run JOBS at a time
wants() { local w; for w in "${what[@]}"; do [ "$w" = "$1" ] && return 0; done; return 1; }
throttle() { while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done; }
objs=()
for src in $CU_SRCS; do
    o=$OUT/obj/${src%.c}.o
    objs+=("$o")
    throttle
    # shellcheck disable=SC2086
    { $CC $CU_CFLAGS "${INC[@]}" -c "runtime/$src" -o "$o" >"$OUT/obj/${src%.c}.log" 2>&1; echo $? >"$o.st"; } &
done
objs+=("$OUT/obj/cuda_kernels.o")
# shellcheck disable=SC2086
{ "$NVCC" $NVCC_BASE $GENCODE "${INC[@]}" -c runtime/cuda_kernels.cu -o "$OUT/obj/cuda_kernels.o" \
    >"$OUT/obj/cuda_kernels.log" 2>&1; echo $? >"$OUT/obj/cuda_kernels.o.st"; } &
wait
rt_ok=yes
for o in "${objs[@]}"; do
    if [ "$(cat "$o.st" 2>/dev/null)" != 0 ]; then
        rt_ok=no
        bad "build the runtime without MPI: $(basename "${o%.o}")" "${o%.o}.log"
    fi
done
[ $rt_ok = yes ] && ok "build the CUDA runtime without MPI for $ARCH (${#objs[@]} objects)"

CUDA_BUILD=$PACK/models
for m in tiny gpt2 tiny_offload tiny_bf16; do
    wants $m || continue
    rm -f "$CUDA_BUILD/$m/train"
    [ $rt_ok = yes ] || continue
    throttle
    # shellcheck disable=SC2086
    "$NVCC" $NVCC_BASE $GENCODE -Iruntime "$CUDA_BUILD/$m/train.cu" "${objs[@]}" "${LIBS[@]}" \
        $CU_SYSLIBS -o "$CUDA_BUILD/$m/train" >"$OUT/build_$m.log" 2>&1 &
done
if wants kernels; then
    for prec in fp32 bf16 bf16_hd64; do
        throttle
        kernel_test_build "$PACK" "$ARCH" $prec &
    done
    throttle
    kernel_bench_build "$PACK" "$ARCH" &
fi
wait
for m in tiny gpt2 tiny_offload tiny_bf16; do
    wants $m || continue
    if [ -x "$CUDA_BUILD/$m/train" ]; then
        ok "nvcc models/$m/train.cu for $ARCH, MPI=0"
    else
        bad "nvcc models/$m/train.cu for $ARCH, MPI=0" "$OUT/build_$m.log"
    fi
done
if wants kernels; then
    for prec in fp32 bf16 bf16_hd64; do
        if [ -x "$OUT/test_kernels_$prec" ]; then
            ok "nvcc tests/kernels/test_kernels.c for $ARCH ($prec)"
        else
            bad "nvcc tests/kernels/test_kernels.c for $ARCH ($prec)" "$OUT/kernels_build_$prec.log"
        fi
    done
    if [ -x "$OUT/kernel_bench" ]; then
        ok "nvcc tests/gpu/kernel_bench.cu for $ARCH (bf16)"
    else
        bad "nvcc tests/gpu/kernel_bench.cu for $ARCH (bf16)" "$OUT/kernel_bench_build.log"
    fi
fi

if [ $build_only = yes ]; then
    echo "run.sh --build-only: $fails failed, $(($(date +%s) - t0)) s; logs in $OUT"
    [ $fails = 0 ]
    exit
fi
if [ $fails != 0 ]; then
    echo "run.sh: $fails failed in the builds; logs in $OUT"
    exit 1
fi

# ── 2-8: the checks, against the CPU references carried in ref/ ──
REF=$PACK/ref
DATA=$PACK/data
GPU_LAUNCH=alone
gpu_checks

echo "run.sh: $fails failed, $(($(date +%s) - t0)) s; logs in $OUT"
[ $fails = 0 ]
