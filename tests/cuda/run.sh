#!/usr/bin/env bash
# run.sh — the CUDA build, checked without a GPU (part of `make test`):
#
#   1. make runtime-cuda builds build/runtime/libfsdrt_cuda.a (nvcc for
#      sm_80 and sm_90, the host half with mpicc) without a warning;
#   2. every example's train.cu compiles with nvcc for sm_80 and sm_90 in one
#      fatbinary (make trainer BACKEND=cuda) without a warning, links against
#      NCCL, cuBLASLt, the CUDA runtime and MPI, and holds code for
#      both architectures (cuobjdump);
#   3. the same train.cu still builds with the C compiler against the CPU
#      runtime (the CPU suites run it);
#   4. fsdpc --verify passes on every example (NVRTC, both architectures),
#      reports a broken template against its file and .fsd line, and says
#      clearly when NVRTC cannot be loaded; fsdpc does not link NVRTC;
#   5. no_host_sync.py: no host synchronisation between a step's first
#      all-gather and the optimizer, in every emitted program and the CUDA
#      runtime's step path, and it catches one planted there; with
#      `offload = cpu` (tests/cuda/tiny_offload.fsd, built and checked like
#      the examples in 2-4) exactly one host wait, first in the offload
#      update, and it catches a second one, a sync on the copy-out path and
#      the offload update reached without the model's offload setting;
#   6. without a GPU, the CUDA trainer stops with a clear message;
#   7. without MPI (MPI=0, for sm_90 only: 2 covers the architectures):
#      make runtime-cuda and a tiny trainer build without a warning, and the trainer neither loads libmpi nor holds an
#      MPI symbol; started under mpirun without FSD_NCCL_ID_FILE, or at
#      world 2 without it, it stops saying so;
#   8. tests/gpu/run.sh --pack for tiny and GPT-2 (CPU reference, emitted
#      train.cu, runtime sources, build flags), copied to a temporary
#      directory and built there by the pack's own run.sh --build-only
#      (nvcc for sm_90, MPI=0): the trainer builds from the pack alone and
#      loads no MPI; and tests/gpu/lib.sh's comparisons, fed two CPU logs of
#      the same run, pass, and fail on one with losses 1.5x the tolerance
#      off, a missing step or a null loss (0.5x passes), and GPT-2's report
#      fails on a memory peak off the plan.
#
# Without nvcc (a machine without the CUDA toolkit) it prints a skip line
# saying why. Like the other suites: one line per check, then
# "N passed, N failed". The nvcc compiles run two at a time.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
NVCC=${NVCC:-nvcc}
FSDPC=${FSDPC:-build/fsdpc}
JOBS=${CUDA_TEST_JOBS:-2}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

# a log with a warning in it (nvcc's, or the host compiler's)
warned() { grep -qiE '(^|[^a-z_])warning' "$1"; }

if ! command -v "$NVCC" >/dev/null 2>&1; then
    echo "skip cuda: $NVCC not found: the CUDA build checks need the CUDA toolkit (nvcc, NCCL, cuBLASLt)"
    echo "0 passed, 0 failed"
    exit 0
fi
cuda_home=$(dirname "$(dirname "$(readlink -f "$(command -v "$NVCC")")")")
if ! printf '#include <nccl.h>\n' | "$NVCC" -x cu -E - -o /dev/null >/dev/null 2>&1; then
    echo "skip cuda: nccl.h not found beside $cuda_home: the CUDA runtime needs NCCL (set NCCL_HOME)"
    echo "0 passed, 0 failed"
    exit 0
fi
ARCH=sm_80,sm_90
# the examples, and tiny with `offload = cpu` (the CUDA backend's offload path)
examples=(examples/*.fsd tests/cuda/tiny_offload.fsd)

# ── 1. the runtime library (and fsdpc, before the parallel builds below) ──
if $MAKE --no-print-directory build/fsdpc >"$TMP/fsdpc.log" 2>&1 &&
        $MAKE --no-print-directory runtime-cuda ARCH=$ARCH >"$TMP/rt.log" 2>&1; then
    if warned "$TMP/rt.log"; then
        bad "cuda: make runtime-cuda builds build/runtime/libfsdrt_cuda.a, but with warnings" "$TMP/rt.log"
    else
        ok "cuda: make runtime-cuda builds build/runtime/libfsdrt_cuda.a ($ARCH) without warnings"
    fi
else
    cat "$TMP/fsdpc.log" "$TMP/rt.log" >"$TMP/both.log" 2>/dev/null
    bad "cuda: make build/fsdpc runtime-cuda" "$TMP/both.log"
    echo "$pass passed, $fail failed"
    exit 1
fi
# the CPU library, for 3 (the CPU suites build it too; nothing to do then)
cpu_lib=yes
$MAKE --no-print-directory runtime >"$TMP/cpu-rt.log" 2>&1 || cpu_lib=no

# The GPU architectures a binary holds code (cubins) for: cuobjdump's list
# when the toolkit has it, else read from the .nv_fatbin section directly
# (fatbin header: magic 0xBA55ED50, header size at 6, size at 8; each entry:
# kind at 0, 2 for a cubin, header size at 4, size at 8, arch at 28).
fatbin_archs() {
    if command -v cuobjdump >/dev/null 2>&1; then
        cuobjdump --list-elf "$1" 2>&1 | grep -o 'sm_[0-9]*' | sort -u
        return
    fi
    objcopy -O binary --only-section=.nv_fatbin "$1" "$1.fatbin" 2>/dev/null
    python3 - "$1.fatbin" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
off, archs = 0, set()
while off + 16 <= len(d):
    magic, _, hsz, size = struct.unpack_from("<IHHQ", d, off)
    if magic != 0xBA55ED50:
        off += 8
        continue
    p, end = off + hsz, off + hsz + size
    while p + 32 <= end:
        kind, _, ehsz, esize = struct.unpack_from("<HHIQ", d, p)
        if kind == 2:
            archs.add("sm_%d" % struct.unpack_from("<I", d, p + 28)[0])
        p += ehsz + esize
    off = end
print("\n".join(sorted(archs)))
PY
    rm -f "$1.fatbin"
}

# ── 2-4: per example, in the background, JOBS at a time ──
# Each job writes $TMP/<model>.<check>.{st,log}; results are printed in order below.
check_example() {
    local fsd=$1 model
    model=$(basename "$fsd" .fsd)
    local dir=build/$model/cuda
    # 2. nvcc, both architectures in one fatbinary, and the link
    $MAKE --no-print-directory trainer FSD="$fsd" BACKEND=cuda ARCH=$ARCH \
        >"$TMP/$model.nvcc.log" 2>&1
    echo $? >"$TMP/$model.nvcc.st"
    if [ -x "$dir/train" ]; then
        { fatbin_archs "$dir/train"; ldd "$dir/train" 2>&1; } >"$TMP/$model.elf.log"
    fi
    # 3. the same file through the C compiler, against the CPU runtime
    if [ $cpu_lib = yes ]; then
        mpicc -x c -std=c11 -O1 -fopenmp -Wall -Wextra -Wno-unused-parameter -Iruntime \
            "$dir/train.cu" -x none build/runtime/libfsdrt_cpu.a $($MAKE -s --no-print-directory rt-libs) \
            -o "$TMP/$model.cpu-train" >"$TMP/$model.cc.log" 2>&1
        echo $? >"$TMP/$model.cc.st"
    fi
    # 4. NVRTC
    "$FSDPC" "$fsd" --verify --arch $ARCH >"$TMP/$model.verify.log" 2>&1
    echo $? >"$TMP/$model.verify.st"
}
running=0
for fsd in "${examples[@]}"; do
    check_example "$fsd" &
    running=$((running + 1))
    if [ $running -ge "$JOBS" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

for fsd in "${examples[@]}"; do
    model=$(basename "$fsd" .fsd)
    dir=build/$model/cuda
    if [ "$(cat "$TMP/$model.nvcc.st")" != 0 ]; then
        bad "cuda: $model: nvcc -x cu train.cu for $ARCH, linked with NCCL, cuBLASLt, cudart, MPI" "$TMP/$model.nvcc.log"
    elif warned "$TMP/$model.nvcc.log"; then
        bad "cuda: $model: nvcc compiles train.cu, but with warnings" "$TMP/$model.nvcc.log"
    else
        ok "cuda: $model: train.cu compiles with nvcc for $ARCH without warnings and links"
        missing=""
        for lib in libnccl libcublasLt libcudart libmpi; do
            grep -q "$lib\.so" "$TMP/$model.elf.log" || missing="$missing $lib"
        done
        for a in sm_80 sm_90; do
            grep -q "$a" "$TMP/$model.elf.log" || missing="$missing code-for-$a"
        done
        if [ -z "$missing" ]; then
            ok "cuda: $model: the trainer holds sm_80 and sm_90 code and loads NCCL, cuBLASLt, cudart, MPI"
        else
            bad "cuda: $model: the trainer lacks:$missing" "$TMP/$model.elf.log"
        fi
    fi
    if [ $cpu_lib = no ]; then
        bad "cuda: $model: the CPU runtime did not build, so train.cu's C build is unchecked" "$TMP/cpu-rt.log"
    elif [ "$(cat "$TMP/$model.cc.st")" != 0 ] || warned "$TMP/$model.cc.log"; then
        bad "cuda: $model: the same train.cu with the C compiler (mpicc -x c)" "$TMP/$model.cc.log"
    else
        ok "cuda: $model: the same train.cu builds with the C compiler against the CPU runtime"
    fi
    if [ "$(cat "$TMP/$model.verify.st")" = 0 ] && grep -q ' 0 failed' "$TMP/$model.verify.log"; then
        ok "cuda: $model: fsdpc --verify: $(tail -n 1 "$TMP/$model.verify.log" | sed 's/^verify: //')"
    else
        bad "cuda: $model: fsdpc --verify --arch $ARCH" "$TMP/$model.verify.log"
    fi
done

# ── 4, continued: a broken template is reported against its file and line ──
# fsdpc again, its objects as built, with act.h's gelu broken at a known line.
mkdir -p "$TMP/templates"
cp templates/*.h "$TMP/templates/"
line=$(grep -n 'DEVICE void gelu_fwd_elem' "$TMP/templates/act.h" | cut -d: -f1)
line=$((line + 2))
sed -i "${line}s/^.*\$/    real v = undefined_in_act_h;/" "$TMP/templates/act.h"
if tools/embed_templates.sh $(ls "$TMP"/templates/*.h | sort) >"$TMP/templates.c" 2>"$TMP/broken.log" &&
        ${CC:-cc} -std=c11 -c "$TMP/templates.c" -o "$TMP/templates.o" 2>>"$TMP/broken.log" &&
        ${CC:-cc} -o "$TMP/fsdpc-broken" $(ls build/obj/*.o | grep -v '/templates\.o$') \
            "$TMP/templates.o" -lm -ldl 2>>"$TMP/broken.log"; then
    "$TMP/fsdpc-broken" examples/tiny.fsd --verify --arch sm_90 >"$TMP/broken.log" 2>&1
    st=$?
    if [ $st = 1 ] && grep -q "templates/act.h:$line: error: .*undefined_in_act_h" "$TMP/broken.log" &&
            grep -q 'templates/act.h .*FAILED' "$TMP/broken.log" &&
            grep -q 'used by examples/tiny.fsd:[0-9]* (\(matmul_bias_\)\?gelu ' "$TMP/broken.log"; then
        ok "cuda: --verify reports a broken kernel at templates/act.h:$line and the .fsd line using it"
    else
        bad "cuda: --verify on a broken act.h (status $st)" "$TMP/broken.log"
    fi
else
    bad "cuda: cannot build fsdpc with a broken template" "$TMP/broken.log"
fi

# ── 4, continued: NVRTC only when asked ──
if FSDPC_NVRTC=/nonexistent/libnvrtc.so "$FSDPC" examples/tiny.fsd --verify >"$TMP/nonvrtc.out" 2>"$TMP/nonvrtc.log"; then
    bad "cuda: --verify without NVRTC should fail" "$TMP/nonvrtc.log"
elif grep -q 'FSDPC_NVRTC' "$TMP/nonvrtc.log" && grep -q 'NVRTC' "$TMP/nonvrtc.log"; then
    ok "cuda: --verify without NVRTC fails, saying what to install or set"
else
    bad "cuda: --verify without NVRTC: unclear message" "$TMP/nonvrtc.log"
fi
if ldd "$FSDPC" | grep -q nvrtc; then
    bad "cuda: $FSDPC links libnvrtc; it must load it only for --verify" <(ldd "$FSDPC")
else
    ok "cuda: fsdpc does not link NVRTC (dlopen at --verify only)"
fi

# ── 5. no host synchronisation in the step ──
trains=()
for fsd in "${examples[@]}"; do
    f=build/$(basename "$fsd" .fsd)/cuda/train.cu
    [ -f "$f" ] && trains+=("$f")
done
if python3 tests/cuda/no_host_sync.py "${trains[@]}" >"$TMP/sync.log" 2>&1 &&
        grep -q 'offload = cpu (1 program(s)): one host wait' "$TMP/sync.log"; then
    ok "cuda: $(tail -n 1 "$TMP/sync.log")"
else
    bad "cuda: host synchronisation in the step (tests/cuda/no_host_sync.py)" "$TMP/sync.log"
fi
# ... and it sees one planted behind fsdrt_wait_gather (common.c) in its
# backend hook, an MPI call in fsdrt_end_step's idle check, and a host wait
# before the optimizer
cp -r runtime "$TMP/rt"
python3 - "$TMP/rt" <<'EOF'
import os, sys
d = sys.argv[1]
names = ("cuda_comm.c", "cuda_step.c", "common.c")
comm, step, common = (open(os.path.join(d, n)).read() for n in names)
a = "    CUDA_CHECK(r, cudaStreamWaitEvent(bk->compute, c->gathered, 0));\n"
b = "    const double *coef = bk->d_stats + 2;\n"
c = "        const Group *G = &r->groups[g];\n        const char *what = "
assert comm.count(a) == 1 and step.count(b) == 1 and common.count(c) == 1, "anchors moved: update tests/cuda/run.sh"
comm = comm.replace(a, a + "    CUDA_CHECK(r, cudaStreamSynchronize(bk->compute));\n")
step = step.replace(b, b + "    cuda_stream_wait_host(r, s, \"planted\");\n")
common = common.replace(c, "        MPI_Barrier(MPI_COMM_WORLD);\n" + c)
for n, text in zip(names, (comm, step, common)):
    open(os.path.join(d, n), "w").write(text)
EOF
python3 tests/cuda/no_host_sync.py --runtime "$TMP/rt" "${trains[0]}" >"$TMP/planted.log" 2>&1
st=$?
if [ $st = 1 ] && grep -q 'fsdrt_wait_gather → bk_wait_gather) calls cudaStreamSynchronize' "$TMP/planted.log" &&
        grep -q 'check_idle (fsdrt_end_step, before the optimizer) calls MPI_Barrier' "$TMP/planted.log" &&
        grep -q 'bk_update waits on the host before its optimizer' "$TMP/planted.log"; then
    ok "cuda: no_host_sync.py catches a planted cudaStreamSynchronize behind fsdrt_wait_gather, an MPI call in the end-of-step check and an early host wait"
else
    bad "cuda: no_host_sync.py missed a planted synchronisation (status $st)" "$TMP/planted.log"
fi

# ... and, with offload, a second host wait in the offload update and a sync
# on the copy-out path; then the offload update reached without its guard
off_train=build/tiny_offload/cuda/train.cu
rm -rf "$TMP/rt"
cp -r runtime "$TMP/rt"
cp -r runtime "$TMP/rt_unguarded"
python3 - "$TMP/rt" "$TMP/rt_unguarded" <<'EOF'
import os, sys
planted, unguarded = sys.argv[1], sys.argv[2]
step = open(os.path.join(planted, "cuda_step.c")).read()
comm = open(os.path.join(planted, "cuda_comm.c")).read()
a = "    CUDA_CHECK(r, cudaMemcpyAsync(bk->h_stats + 3, bk->d_stats + 3, sizeof(double),\n"
b = ("        CUDA_CHECK(r, cudaMemcpyAsync(G->grad, from, (size_t)G->shard * sizeof(real),\n"
     "                                      cudaMemcpyDeviceToHost, bk->d2h));\n")
c = "    if (r->m->offload_cpu) {\n        host_update(r, lr, t, v);\n"
assert step.count(a) == 1 and comm.count(b) == 1 and step.count(c) == 1, "anchors moved: update tests/cuda/run.sh"
open(os.path.join(planted, "cuda_step.c"), "w").write(
    step.replace(a, "    cuda_stream_wait_host(r, bk->compute, \"planted\");\n" + a))
open(os.path.join(planted, "cuda_comm.c"), "w").write(
    comm.replace(b, b + "        CUDA_CHECK(r, cudaStreamSynchronize(bk->d2h));\n"))
open(os.path.join(unguarded, "cuda_step.c"), "w").write(
    step.replace(c, c.replace("r->m->offload_cpu", "r->m->offload_cpu || r->world > 0")))
EOF
python3 tests/cuda/no_host_sync.py --runtime "$TMP/rt" "$off_train" >"$TMP/planted_off.log" 2>&1
st=$?
python3 tests/cuda/no_host_sync.py --runtime "$TMP/rt_unguarded" "$off_train" >"$TMP/unguarded.log" 2>&1
st2=$?
if [ $st = 1 ] && grep -q 'host_update (the offload update) holds 2 host waits' "$TMP/planted_off.log" &&
        grep -q 'fsdrt_reduce_scatter → bk_reduce_scatter) calls cudaStreamSynchronize' "$TMP/planted_off.log" &&
        [ $st2 = 1 ] && grep -q 'host_update (bk_update, before the optimizer) calls cuda_host_wait' "$TMP/unguarded.log"; then
    ok "cuda: no_host_sync.py with offload catches a second host wait, a sync on the copy out, and an unguarded offload update"
else
    cat "$TMP/planted_off.log" "$TMP/unguarded.log" >"$TMP/off_both.log" 2>/dev/null
    bad "cuda: no_host_sync.py missed a planted offload synchronisation (status $st, $st2)" "$TMP/off_both.log"
fi

# ── 6. no GPU here: a clear message, not a crash ──
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "skip cuda: the no-GPU start-up message: this machine has a GPU (tests/gpu/run.sh runs it)"
elif [ -x build/tiny/cuda/train ]; then
    FSD_NCCL_ID_FILE="$TMP/nccl-id" timeout 60 build/tiny/cuda/train --steps 1 >"$TMP/nogpu.log" 2>&1
    st=$?
    if [ $st = 1 ] && grep -q '^train: rank 0: no CUDA device' "$TMP/nogpu.log"; then
        ok "cuda: without a GPU the trainer stops with: $(head -n 1 "$TMP/nogpu.log")"
    else
        bad "cuda: the trainer without a GPU (status $st)" "$TMP/nogpu.log"
    fi
fi

# ── 7. without MPI ──
nompi=$TMP/nompi_tiny
if $MAKE --no-print-directory runtime-cuda MPI=0 ARCH=sm_90 >"$TMP/nompi_rt.log" 2>&1 &&
        $MAKE --no-print-directory trainer FSD=examples/tiny.fsd BACKEND=cuda ARCH=sm_90 MPI=0 \
            TRAINER="$nompi" >"$TMP/nompi.log" 2>&1; then
    cat "$TMP/nompi_rt.log" >>"$TMP/nompi.log"
    if warned "$TMP/nompi.log"; then
        bad "cuda: MPI=0: the runtime and tiny's trainer build, but with warnings" "$TMP/nompi.log"
    else
        ok "cuda: MPI=0: make runtime-cuda and a tiny trainer build without MPI and without warnings"
    fi
    { ldd "$nompi/train"; nm "$nompi/train"; nm -D "$nompi/train"; } >"$TMP/nompi.syms" 2>&1
    if grep -qE 'libmpi|[^A-Za-z_]P?MPI_[A-Z]|ompi_' "$TMP/nompi.syms"; then
        grep -E 'libmpi|MPI_|ompi_' "$TMP/nompi.syms" | head -n 20 >"$TMP/nompi.found"
        bad "cuda: MPI=0: the trainer still loads or references MPI" "$TMP/nompi.found"
    elif grep -q 'libnccl' "$TMP/nompi.syms"; then
        ok "cuda: MPI=0: the trainer loads no libmpi and holds no MPI symbol (ldd, nm)"
    else
        bad "cuda: MPI=0: ldd shows no libnccl: the check saw no trainer" "$TMP/nompi.syms"
    fi
    # both refusals come before the device is looked for, so no GPU is needed
    OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 FSD_NCCL_ID_FILE="" timeout 60 "$nompi/train" --steps 1 \
        >"$TMP/nompi_mpirun.log" 2>&1
    st1=$?
    RANK=1 WORLD_SIZE=2 FSD_NCCL_ID_FILE="" timeout 60 "$nompi/train" --steps 1 >"$TMP/nompi_w2.log" 2>&1
    st2=$?
    if [ $st1 = 1 ] && grep -q 'started by mpirun (OMPI_COMM_WORLD_SIZE is set), but this trainer was built without MPI' "$TMP/nompi_mpirun.log" &&
            [ $st2 = 1 ] && grep -q 'rank 1 of 2: this trainer was built without MPI (MPI=0).*FSD_NCCL_ID_FILE' "$TMP/nompi_w2.log"; then
        ok "cuda: MPI=0: under mpirun, or at world 2, without FSD_NCCL_ID_FILE the trainer stops saying so"
    else
        cat "$TMP/nompi_mpirun.log" "$TMP/nompi_w2.log" >"$TMP/nompi_both.log"
        bad "cuda: MPI=0: the refusals without FSD_NCCL_ID_FILE (status $st1, $st2)" "$TMP/nompi_both.log"
    fi
else
    cat "$TMP/nompi_rt.log" "$TMP/nompi.log" >"$TMP/nompi_both.log" 2>/dev/null
    bad "cuda: MPI=0: make runtime-cuda / make trainer BACKEND=cuda MPI=0" "$TMP/nompi_both.log"
fi

# ── 8. a pack for a GPU machine without MPI, built from the pack alone ──
if GPU_TEST_OUT="$TMP/gpu" MAKE=$MAKE tests/gpu/run.sh --pack "$TMP/pack" tiny gpt2 >"$TMP/pack.log" 2>&1; then
    ok "cuda: tests/gpu/run.sh --pack (tiny, gpt2): $(tail -n 1 "$TMP/pack.log" | cut -d';' -f1)"
    carried=$(mktemp -d)
    cp -r "$TMP/pack/." "$carried/"
    cp "$TMP/pack/ref/tiny_cpu.jsonl" "$TMP/pack/data/tiny.bin" "$TMP/gpu/"   # for the comparisons below
    rm -rf "$TMP/pack"   # nothing of it outside the copy
    if (cd / && bash "$carried/run.sh" --build-only sm_90 tiny) >"$TMP/carried.log" 2>&1 &&
            [ -x "$carried/models/tiny/train" ]; then
        ldd "$carried/models/tiny/train" >"$TMP/carried.ldd" 2>&1
        if grep -q libmpi "$TMP/carried.ldd" || ! grep -q libnccl "$TMP/carried.ldd"; then
            bad "cuda: the pack's trainer loads libmpi, or no NCCL" "$TMP/carried.ldd"
        else
            ok "cuda: the pack, copied elsewhere, builds tiny's trainer with nvcc for sm_90, MPI=0, from itself: $(grep -c '^ok' "$TMP/carried.log") builds"
        fi
    else
        bad "cuda: bash PACK/run.sh --build-only sm_90 tiny" "$TMP/carried.log"
    fi
    rm -rf "$carried"
else
    bad "cuda: tests/gpu/run.sh --pack DIR tiny gpt2" "$TMP/pack.log"
fi

# ... and the comparisons both GPU modes use, on two CPU logs of one run:
# the pack's tiny reference and the same command again
ref=$TMP/gpu/tiny_cpu.jsonl
if [ -s "$ref" ] && "$TMP/gpu/cpu/tiny/train" --steps 50 --seed 1337 --data "$TMP/gpu/tiny.bin" --quiet \
        --log "$TMP/gpu/again.jsonl" --trace-out "$TMP/gpu/again_trace.json" >"$TMP/again.log" 2>&1; then
    (
        . tests/gpu/lib.sh
        scale() {   # every loss times $1
            awk -v f="$1" '{ if (match($0, /"loss": [0-9.eE+-]+/)) {
                v = substr($0, RSTART + 8, RLENGTH - 8) * f
                $0 = substr($0, 1, RSTART - 1) "\"loss\": " sprintf("%.9g", v) substr($0, RSTART + RLENGTH) }
                print }' "$2"
        }
        scale 1.0015 "$ref" >"$TMP/gpu/off.jsonl"
        scale 1.0005 "$ref" >"$TMP/gpu/near.jsonl"
        head -n 49 "$ref" >"$TMP/gpu/short.jsonl"
        sed '7s/"loss": [0-9.eE+-]*/"loss": null/' "$ref" >"$TMP/gpu/null.jsonl"
        wrong=0
        # expect pass|fail WHAT COMMAND...: one line each into cmp.log
        expect() {
            local want=$1 what=$2 got=pass
            shift 2
            "$@" >>"$TMP/cmp.log" 2>&1 || got=fail
            echo "$got (want $want): $what" >>"$TMP/cmp.log"
            [ $got = "$want" ] || wrong=$((wrong + 1))
        }
        for spec in "loss 1e-3 1e-5" "grad_norm 1e-2" "comm_bytes 0" "mem_peak_bytes 0"; do
            # shellcheck disable=SC2086
            expect pass "the same run twice, $spec" jsonl_compare "$ref" "$TMP/gpu/again.jsonl" $spec
        done
        expect pass "losses 0.5x the tolerance off" jsonl_compare "$ref" "$TMP/gpu/near.jsonl" loss 1e-3
        expect fail "losses 1.5x the tolerance off" jsonl_compare "$ref" "$TMP/gpu/off.jsonl" loss 1e-3
        expect fail "a step missing" jsonl_compare "$ref" "$TMP/gpu/short.jsonl" loss 1
        expect fail "a null loss" jsonl_compare "$ref" "$TMP/gpu/null.jsonl" loss 1
        # GPT-2's report on a made-up log: losses from ln(50257) down, the
        # counted peak GPT-2's plan at world 1 (fsdpc --dump-memory), which
        # the report holds it to exactly: one byte off, or the plan's old
        # peak with activations freed as they die (1.03x below), fails
        awk '{ sub(/"loss": [0-9.]+/, "\"loss\": " (10.9 - NR * 0.01));
               sub(/"mem_peak_bytes": [0-9]+/, "\"mem_peak_bytes\": 6366506496"); print }' "$ref" \
            >"$TMP/gpu/gpt2.jsonl"
        expect pass "GPT-2's report, the counted peak the plan's" \
            gpt2_report "$TMP/gpu/gpt2.jsonl" 829360668672 6366506496 0 0 /dev/null
        expect fail "GPT-2's report, the counted peak a byte above the plan's" \
            gpt2_report "$TMP/gpu/gpt2.jsonl" 829360668672 6366506495 0 0 /dev/null
        expect fail "GPT-2's report, the counted peak 1.03x the plan's" \
            gpt2_report "$TMP/gpu/gpt2.jsonl" 829360668672 6180469248 0 0 /dev/null
        # the trace check (section 4b) on the CPU run's trace, and on broken copies
        tr=$TMP/gpu/again_trace.json
        expect pass "a 1-rank trace" trace_check "$tr" 50
        awk '/"cat":"compute"/ && ++k == 1 { sub(/"dur":[0-9.]+/, "\"dur\":-1") } 1' "$tr" >"$TMP/gpu/neg.json"
        expect fail "a negative duration" trace_check "$TMP/gpu/neg.json"
        awk '/"cat":"compute"/ && ++k == 3 { sub(/"ts":[0-9.]+/, "\"ts\":0") } 1' "$tr" >"$TMP/gpu/overlap.json"
        expect fail "an op starting before the one before it ended" trace_check "$TMP/gpu/overlap.json"
        grep -v '"reduce_scatter ' "$tr" >"$TMP/gpu/norsc.json"
        expect fail "no reduce-scatter" trace_check "$TMP/gpu/norsc.json"
        grep -v '"all_gather ' "$tr" >"$TMP/gpu/noag.json"
        expect fail "no all-gather" trace_check "$TMP/gpu/noag.json"
        [ $wrong = 0 ]
    )
    st=$?
    if [ $st = 0 ]; then
        ok "cuda: tests/gpu/lib.sh: two CPU logs of one run compare equal; losses 1.5x the tolerance off, a missing step and a null loss fail, 0.5x passes; GPT-2's report passes the plan's peak and fails one a byte or 1.03x off; the trace check passes the run's trace and fails a negative duration, overlapping ops, no reduce-scatter, no all-gather"
    else
        bad "cuda: tests/gpu/lib.sh's comparisons on CPU logs" "$TMP/cmp.log"
    fi
else
    bad "cuda: the pack's tiny CPU reference, run again for tests/gpu/lib.sh's comparisons" "$TMP/again.log"
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
