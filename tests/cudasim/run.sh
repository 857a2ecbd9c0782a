#!/usr/bin/env bash
# run.sh — the CUDA backend's host code on a simulated device (part of
# `make test`; tests/cudasim/README.md). runtime/cuda_*.c, unchanged, run
# under mpirun against cudasim's CUDA, NCCL (over MPI) and cuBLASLt, with
# the trainer's kernels as the CPU build's loops; its --log files are held
# to the CPU build's, run for run:
#
#   1. make runtime-cudasim builds without a warning; the fakes' own tests
#      (test_cublaslt: products and epilogues against a reference, and the
#      calls cuBLASLt would refuse; test_nccl: the collectives on 3 ranks,
#      and each NCCL misuse it stages stops the run with a message);
#   2. tiny (fp32 products, FSD_TF32=0) at world 1, 2 and 4 with the
#      collective streams run lazily, and at world 2 eagerly
#      (device.cc: the two orders a correct program must not notice):
#      loss, grad norm, bytes moved and the counted memory peak against
#      the CPU build at the same world; the start-up's device memory
#      account: the counters peak where it said, and it names every byte
#      in use (here, in 2b, 4 and 5);
#   2b. tiny with each sharding policy that changes what the backend does
#      (unsharded accumulation, parameters kept gathered, fp32 compute with
#      bf16 or fp16 wire formats), tiny_llama and mlp at world 2, tiny at
#      world 3 (eager), tiny with replicate = 2 (HSDP: the communicators
#      ncclCommSplit makes) at world 4, lazy and eager, tiny with
#      reshard_after_forward = 2 (partial resharding) at world 4; 2c. per-target mixed
#      precision: tiny with its root alone in bf16, tiny_bf16 with its blocks
#      reducing in fp32;
#   3. the proof that 2 can fail: with every cudaStreamWaitEvent dropped
#      (FSD_CUDASIM_DROP_WAITS=1) the lazy run no longer matches; an
#      asynchronous NCCL error ends the run with the backend's message, and so
#      does a collective that never completes, after FSD_NCCL_TIMEOUT;
#   4. tiny_bf16 (bf16 act: bf16 all-gathers and reduce-scatters, bf16
#      products) at world 2, lazy and eager;
#   5. tiny_offload (offload = cpu: pinned shards, copy streams, the host
#      update) at world 2, lazy and eager;
#   6. checkpoints: 10 + 10 steps resumed = 20 straight on cudasim (world
#      1: tiny, tiny_offload, tiny_bf16; an async save at world 2), and
#      across backends, resharded: saved by cudasim at world 2 and
#      resumed by the CPU build at world 1, saved by the CPU build at world
#      1 and resumed by cudasim at world 4, each against the same two runs
#      on the CPU build alone;
#   7. --trace-out at world 2: the device-timed trace (events on the
#      streams) passes tests/gpu/lib.sh's trace_check;
#   8. FSD_GEMM_BENCH=1: the product table after the run lists every
#      planned product shape;
#   9. the build without MPI (MPI=0): NCCL's id through FSD_NCCL_ID_FILE
#      at world 2 under mpirun, against the CPU build;
#  10. each fence and cudaStreamWaitEvent of runtime/cuda_*.c, removed from a
#      copy of its file, makes tiny_offload or tiny fail;
#  11. built with AddressSanitizer (CUDASIM_SAN=1, each cudaMalloc exactly
#      its size): tiny_offload and tiny_bf16 with a checkpoint and a trace,
#      and a resharded resume, without a report;
#  12. evaluation after every step (--eval-every 1): tiny's val_loss the CPU
#      build's to the last bit, and tiny_bf16 with offload = cpu (whose
#      evaluation gathers masters the host update has just changed) within
#      1e-6 of tiny_bf16's.
#
# Like the other suites: one line per check, then "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
OUT=$TMP
. tests/gpu/lib.sh   # run, jsonl_compare, check_compare, trace_check, resume_check
. tests/lib.sh       # the counters, ok, bad, done_ (after: they replace lib.sh's)

STEPS=${CUDASIM_STEPS:-20}
MPI=("${MPIRUN[@]}")

# ── 1. builds ──
if ! $MAKE --no-print-directory build/fsdpc build/fsdata runtime >"$TMP/base.log" 2>&1; then
    bad "cudasim: make build/fsdpc build/fsdata runtime" "$TMP/base.log"
    done_
fi
if ! $MAKE --no-print-directory runtime-cudasim >"$TMP/sim.log" 2>&1; then
    bad "cudasim: make runtime-cudasim" "$TMP/sim.log"
    done_
elif grep -qi 'warning' "$TMP/sim.log"; then
    bad "cudasim: make runtime-cudasim builds, but with warnings" "$TMP/sim.log"
else
    ok "cudasim: make runtime-cudasim builds build/cudasim/libfsdrt_cudasim.a without warnings"
fi

# trainers FSD: its CPU and cudasim trainers, build/<model>/{cpu,cudasim}/train;
# a failure is a FAIL line and status 1
trainers() {
    local m
    m=$(basename "$1" .fsd)
    if ! $MAKE --no-print-directory trainer FSD="$1" BACKEND=cpu >"$TMP/$m.cpu.log" 2>&1; then
        bad "cudasim: make trainer FSD=$1 BACKEND=cpu" "$TMP/$m.cpu.log"
        return 1
    elif ! $MAKE --no-print-directory trainer-cudasim FSD="$1" >"$TMP/$m.sim.log" 2>&1; then
        bad "cudasim: make trainer-cudasim FSD=$1" "$TMP/$m.sim.log"
        return 1
    fi
}
for fsd in examples/tiny.fsd tests/cuda/tiny_bf16.fsd tests/cuda/tiny_offload.fsd; do
    trainers "$fsd"
done
if ! $MAKE --no-print-directory trainer-cudasim FSD=examples/tiny.fsd MPI=0 >"$TMP/nompi.log" 2>&1; then
    bad "cudasim: make trainer-cudasim FSD=examples/tiny.fsd MPI=0" "$TMP/nompi.log"
fi
DATA=$TMP
build/fsdata synth "$DATA/tiny.bin" --tokens 200000 --seed 1 --vocab 256 >/dev/null

# the fakes' own tests
for t in device cublaslt nccl; do
    src=tests/cudasim/test_$t.cc
    [ -f "$src" ] || continue
    if ! $MAKE --no-print-directory build/cudasim/test_$t >"$TMP/test_$t.build" 2>&1; then
        bad "cudasim: make build/cudasim/test_$t" "$TMP/test_$t.build"
        continue
    fi
    np=1
    [ $t = nccl ] && np=3
    if timeout 120 "${MPI[@]}" -np $np build/cudasim/test_$t >"$TMP/test_$t.log" 2>&1; then
        ok "cudasim: test_$t ($(tail -n 1 "$TMP/test_$t.log"))"
    else
        bad "cudasim: test_$t" "$TMP/test_$t.log"
    fi
done

# and every NCCL misuse test_nccl can stage stops the run with cudasim's line
if [ -x build/cudasim/test_nccl ]; then
    caught=0 missed=""
    for c in $(timeout 60 "${MPI[@]}" -np 1 build/cudasim/test_nccl list); do
        timeout 60 "${MPI[@]}" -np 3 build/cudasim/test_nccl fail "$c" >"$TMP/fail_$c.log" 2>&1
        st=$?
        if [ $st != 0 ] && [ $st != 124 ] && grep -q '^cudasim: rank' "$TMP/fail_$c.log" &&
                ! grep -q 'not caught' "$TMP/fail_$c.log"; then
            caught=$((caught + 1))
        else
            missed+=" $c"
        fi
    done
    if [ -z "$missed" ] && [ $caught -ge 10 ]; then
        ok "cudasim: test_nccl: each of $caught NCCL misuses stops the run with a message"
    else
        bad "cudasim: test_nccl: misuses not stopped with a message:${missed:- (only $caught cases)}"
    fi
fi

# sim NAME NP [FSD_VAR=VALUE...] MODEL ARGS...: MODEL's cudasim trainer on
# NP ranks, STEPS steps of tiny.bin at seed 1337, --log $OUT/NAME.jsonl.
sim() {
    local name=$1 np=$2
    shift 2
    local envs=()
    while [[ $1 =~ ^FSD_[A-Z0-9_]*= ]]; do
        envs+=("$1")
        shift
    done
    local model=$1
    shift
    run "$name" ${envs[@]+"${envs[@]}"} "${MPI[@]}" -np "$np" "build/$model/train" \
        --steps "$STEPS" --seed 1337 --data "$DATA/tiny.bin" --log "$OUT/$name.jsonl" "$@"
}
# device_memory NAME: sim NAME's start-up lines (docs/cuda.md#memory-beyond-the-plan):
# the counters peak at the bytes they said they would (the plan's peak at
# this world, and what the backend counts beyond it), and the account of
# the device adds up: the simulated device has no context, and its NCCL and
# cuBLASLt keep their state in host memory, so every byte cudaMemGetInfo
# has in use must be one of the runtime's buffers
device_memory() {
    local name=$1 want got rest
    [ -s "$OUT/$name.jsonl" ] || return 0   # run has reported the failure
    want=$(sed -n 's/^device memory: the counters will peak at \([0-9]*\) bytes: .*(\(.*\))$/\1 \2/p' "$OUT/$name.log")
    rest=$(sed -n 's/^device memory: GPU .* static data \(-*[0-9]*\); .*/\1/p' "$OUT/$name.log")
    got=$(jsonl_max "$OUT/$name.jsonl" mem_peak_bytes)
    if [ -n "$got" ] && [ "${want%% *}" = "$got" ] && [ "$rest" = 0 ]; then
        ok "cudasim: $name: counted peak $got bytes, as predicted at start-up (beyond the plan: ${want#* }); every device byte in use accounted for"
    else
        bad "cudasim: $name: counted peak ${got:-?}, predicted '${want:-?}'; device bytes not accounted for: ${rest:-?}" "$OUT/$name.log"
    fi
}
# cpu NAME NP MODEL ARGS...: the same on the CPU build.
cpu() {
    local name=$1 np=$2 model=$3
    shift 3
    run "$name" "${MPI[@]}" -np "$np" "build/$model/cpu/train" --steps "$STEPS" --seed 1337 \
        --data "$DATA/tiny.bin" --quiet --log "$OUT/$name.jsonl" "$@"
}
# same LABEL CPU SIM SPEC...: one ok/FAIL line per "KEY TOL [FIRST_TOL]".
same() {
    local label=$1 a=$OUT/$2.jsonl b=$OUT/$3.jsonl spec
    shift 3
    [ -s "$a" ] && [ -s "$b" ] || return 0   # run has reported the failure
    for spec in "$@"; do
        # shellcheck disable=SC2086
        check_compare "$label" "$a" "$b" $spec
    done
}
FP32=("loss 1e-4 1e-6" "grad_norm 1e-3" "comm_bytes 0" "mem_peak_bytes 0")

# ── 2. tiny, fp32 ──
for np in 1 2 4; do
    cpu "tiny_cpu_w$np" "$np" tiny
    sim "tiny_sim_w$np" "$np" FSD_TF32=0 tiny/cudasim
    same "cudasim: tiny, world $np, lazy collective streams, vs CPU" "tiny_cpu_w$np" "tiny_sim_w$np" "${FP32[@]}"
    device_memory "tiny_sim_w$np"
done
sim tiny_sim_w2_eager 2 FSD_TF32=0 FSD_CUDASIM=eager tiny/cudasim
same "cudasim: tiny, world 2, eager collective streams, vs CPU" tiny_cpu_w2 tiny_sim_w2_eager "${FP32[@]}"
same "cudasim: tiny, world 2, eager against lazy collective streams, bit for bit" tiny_sim_w2 \
    tiny_sim_w2_eager "loss 0" "grad_norm 0"

# ── 2b. the policies, another model, an odd world ──
# tiny with each sharding policy of tests/e2e that changes what the CUDA
# backend does (sharded or unsharded accumulation, keeping parameters
# gathered, an fp32 model with 16-bit wire formats), tiny_llama (no biases,
# RMSNorm, RoPE, SwiGLU) and mlp, at world 2; tiny at world 3
policy() { sed "s/^shard {/shard {\n  $2/" examples/tiny.fsd >"$OUT/$1.fsd"; }
policy tiny_unsharded 'accumulate = unsharded'
policy tiny_keep 'reshard_after_forward = false'
policy tiny_unsharded_rab 'accumulate = unsharded\n  reshard_after_backward = false'
policy tiny_reduce_bf16 'mixed_precision(param = fp32, reduce = bf16)'
policy tiny_param_fp16 'mixed_precision(param = fp16, reduce = fp16)'
for v in tiny_unsharded tiny_keep tiny_unsharded_rab tiny_reduce_bf16 tiny_param_fp16 \
        tiny_llama mlp; do
    fsd=$OUT/$v.fsd
    [ -f "$fsd" ] || fsd=examples/$v.fsd
    trainers "$fsd" || continue
    cpu "${v}_cpu" 2 "$v"
    sim "${v}_sim" 2 FSD_TF32=0 "$v/cudasim"
    case $v in
    tiny_reduce_bf16 | tiny_param_fp16) ;;
    *)
        same "cudasim: $v, world 2, vs CPU" "${v}_cpu" "${v}_sim" "${FP32[@]}"
        continue ;;
    esac
    # fp32 compute over 16-bit wires: the device holds what the fp32 policy
    # does, plus a 16-bit wire buffer the size of the largest group for each
    # 16-bit direction (docs/cuda.md, Numerics), where the CPU build counts
    # the plan's 16-bit buffers
    same "cudasim: $v, world 2, vs CPU" "${v}_cpu" "${v}_sim" "${FP32[@]:0:3}"
    most=$(build/fsdpc "$OUT/$v.fsd" --dump-plan --world 2 | awk '
        /^groups in forward order/ { on = 1; next }
        on && NF == 0 { exit }
        on && $1 ~ /^[0-9]+$/ { gsub(",", "", $4); if ($4 + 0 > most) most = $4 + 0 }
        END { print most + 0 }')
    dirs=1
    [ $v = tiny_param_fp16 ] && dirs=2
    p_fp32=$(jsonl_max "$OUT/tiny_sim_w2.jsonl" mem_peak_bytes)
    p_sim=$(jsonl_max "$OUT/${v}_sim.jsonl" mem_peak_bytes)
    want=$((${p_fp32:-0} + dirs * 2 * most))
    if [ "$most" -gt 0 ] && [ -n "$p_fp32" ] && [ "${p_sim:-x}" = "$want" ]; then
        ok "cudasim: $v, world 2: counted device peak $p_sim = the fp32 policy's $p_fp32 + $dirs wire buffer(s) of $((2 * most)) bytes"
    else
        bad "cudasim: $v, world 2: counted device peak ${p_sim:-?}; want the fp32 policy's ${p_fp32:-?} + $dirs wire buffer(s) of $((2 * most)) bytes"
    fi
    device_memory "${v}_sim"
done

# ── 2c. per-target mixed precision (docs/design.md#per-target-mixed-precision) ──
# each group on its own path of bk_all_gather and bk_reduce_scatter: an fp32
# program whose root alone gathers and reduces in bf16 (16-bit wire buffers
# sized for the root, not the largest group), and a bf16 program whose
# blocks reduce in fp32 (the fp32 reduce buffer) and whose root reduces
# bf16 in place
sed 's/^  fully_shard root$/  fully_shard root (mixed_precision(param = bf16, reduce = bf16))/' \
    examples/tiny.fsd >"$OUT/tiny_root16.fsd"
sed 's/mixed_precision(param = bf16, reduce = fp32)/mixed_precision(param = bf16, reduce = bf16)/; s/^  fully_shard blocks\[\*\]$/  fully_shard blocks[*] (mixed_precision(reduce = fp32))/' \
    tests/cuda/tiny_bf16.fsd >"$OUT/tiny_bf16_blocks32.fsd"
if ! grep -q 'root (mixed_precision' "$OUT/tiny_root16.fsd" ||
        ! grep -q 'blocks\[\*\] (mixed_precision(reduce = fp32))' "$OUT/tiny_bf16_blocks32.fsd"; then
    bad "cudasim: per-target mixed precision: the fully_shard lines of tiny or tiny_bf16 were not found"
elif trainers "$OUT/tiny_root16.fsd" && trainers "$OUT/tiny_bf16_blocks32.fsd"; then
    cpu tiny_root16_cpu 2 tiny_root16
    sim tiny_root16_sim 2 FSD_TF32=0 tiny_root16/cudasim
    same "cudasim: tiny_root16 (root alone in bf16), world 2, vs CPU" tiny_root16_cpu tiny_root16_sim \
        "${FP32[@]:0:3}"
    root=$(build/fsdpc "$OUT/tiny_root16.fsd" --dump-plan --world 2 | awk '
        /^groups in forward order/ { on = 1; next }
        on && NF == 0 { exit }
        on && $2 == "root" { gsub(",", "", $4); print $4 + 0 }')
    p_fp32=$(jsonl_max "$OUT/tiny_sim_w2.jsonl" mem_peak_bytes)
    p_sim=$(jsonl_max "$OUT/tiny_root16_sim.jsonl" mem_peak_bytes)
    want=$((${p_fp32:-0} + 2 * 2 * ${root:-0}))
    if [ "${root:-0}" -gt 0 ] && [ -n "$p_fp32" ] && [ "${p_sim:-x}" = "$want" ]; then
        ok "cudasim: tiny_root16, world 2: counted device peak $p_sim = the fp32 policy's $p_fp32 + 2 wire buffers of the root's $((2 * root)) bytes"
    else
        bad "cudasim: tiny_root16, world 2: counted device peak ${p_sim:-?}; want the fp32 policy's ${p_fp32:-?} + 2 wire buffers of the root's $((2 * ${root:-0})) bytes"
    fi
    device_memory tiny_root16_sim
    cpu tiny_bf16_blocks32_cpu 2 tiny_bf16_blocks32
    sim tiny_bf16_blocks32_sim 2 tiny_bf16_blocks32/cudasim
    same "cudasim: tiny_bf16_blocks32 (blocks reduce in fp32), world 2, vs CPU" \
        tiny_bf16_blocks32_cpu tiny_bf16_blocks32_sim \
        "loss 1e-2 1e-4" "grad_norm 5e-2" "comm_bytes 0" "mem_peak_bytes 0"
    device_memory tiny_bf16_blocks32_sim
fi

cpu tiny_cpu_w3 3 tiny
sim tiny_sim_w3 3 FSD_TF32=0 FSD_CUDASIM=eager tiny/cudasim
same "cudasim: tiny, world 3, eager, vs CPU" tiny_cpu_w3 tiny_sim_w3 "${FP32[@]}"
# HSDP (replicate = 2) at world 4: the shard and replica communicators
# split from the world's (ncclCommSplit), the replica average behind each
# reduce-scatter; lazy and eager, against the CPU build's MPI_Comm_split
policy tiny_hsdp 'replicate = 2'
if trainers "$OUT/tiny_hsdp.fsd"; then
    cpu tiny_hsdp_cpu 4 tiny_hsdp
    sim tiny_hsdp_sim 4 FSD_TF32=0 tiny_hsdp/cudasim
    same "cudasim: tiny, replicate = 2, world 4, lazy, vs CPU" tiny_hsdp_cpu tiny_hsdp_sim "${FP32[@]}" "replicate_bytes 0"
    sim tiny_hsdp_sim_eager 4 FSD_TF32=0 FSD_CUDASIM=eager tiny_hsdp/cudasim
    same "cudasim: tiny, replicate = 2, world 4, eager, vs CPU" tiny_hsdp_cpu tiny_hsdp_sim_eager "${FP32[@]}"
fi

# partial resharding (reshard_after_forward = 2) at world 4: the copy kept
# on the compute stream, the gather from it over the sub-communicator
# ncclCommSplit makes (docs/design.md#partial-resharding), against the CPU
# build's MPI_Comm_split; reshard_bytes exact
policy tiny_partial 'reshard_after_forward = 2'
if trainers "$OUT/tiny_partial.fsd"; then
    cpu tiny_partial_cpu 4 tiny_partial
    sim tiny_partial_sim 4 FSD_TF32=0 tiny_partial/cudasim
    same "cudasim: tiny, reshard_after_forward = 2, world 4, lazy, vs CPU" tiny_partial_cpu \
        tiny_partial_sim "${FP32[@]}" "reshard_bytes 0"
fi

# ── 3. a missing event wait shows ──
if ! timeout 300 env FSD_TF32=0 FSD_CUDASIM_DROP_WAITS=1 "${MPI[@]}" -np 2 build/tiny/cudasim/train \
        --steps "$STEPS" --seed 1337 --data "$DATA/tiny.bin" --quiet \
        --log "$OUT/tiny_sim_nowait.jsonl" >"$OUT/tiny_sim_nowait.log" 2>&1; then
    ok "cudasim: with every stream wait dropped, tiny at world 2 fails ($(grep -m1 -v '^ *$' "$OUT/tiny_sim_nowait.log" | cut -c1-100))"
elif msg=$(jsonl_compare "$OUT/tiny_cpu_w2.jsonl" "$OUT/tiny_sim_nowait.jsonl" loss 1e-4 1e-6); then
    bad "cudasim: with every stream wait dropped, tiny at world 2 still matches the CPU build ($msg): the lazy streams prove nothing"
else
    ok "cudasim: with every stream wait dropped, tiny at world 2 no longer matches (${msg:0:140})"
fi

# an asynchronous NCCL error ends the run through the backend's check, with its
# message, instead of a hang (it shows at the first host wait that polls)
if timeout 120 env FSD_CUDASIM_NCCL_ASYNC_ERROR=1 "${MPI[@]}" -np 2 build/tiny/cudasim/train \
        --steps 2 --seed 1337 --data "$DATA/tiny.bin" --quiet >"$OUT/async.log" 2>&1; then
    bad "cudasim: an asynchronous NCCL error (FSD_CUDASIM_NCCL_ASYNC_ERROR=1) went unnoticed" "$OUT/async.log"
elif line=$(grep -m1 '^train: rank [0-9]*: .*failed: unhandled system error' "$OUT/async.log"); then
    ok "cudasim: an asynchronous NCCL error ends the run: ${line:0:110}"
else
    bad "cudasim: an asynchronous NCCL error ended the run without the backend's message" "$OUT/async.log"
fi

# a collective that never completes on rank 0 (another rank never joined,
# say) ends every rank after FSD_NCCL_TIMEOUT, with the backend's message.
# The message is the proof: collective number 30 never completes, so only
# the timeout can end the run with it (a hang is ended by `timeout 120`,
# without it). The seconds are only shown: how long the run took is the
# machine's load as much as the timeout's.
start=$SECONDS
if timeout 120 env FSD_NCCL_TIMEOUT=3 FSD_CUDASIM_NCCL_HANG=30 "${MPI[@]}" -np 2 \
        build/tiny/cudasim/train --steps 3 --seed 1337 --data "$DATA/tiny.bin" --quiet \
        >"$OUT/hang.log" 2>&1; then
    bad "cudasim: a collective that never completes went unnoticed" "$OUT/hang.log"
elif line=$(grep -m1 '^train: rank 0: .* did not complete within 3 s (FSD_NCCL_TIMEOUT)' "$OUT/hang.log"); then
    ok "cudasim: a hung collective ends the run after the timeout ($((SECONDS - start)) s): ${line:0:90}"
else
    bad "cudasim: a hung collective did not end the run with the backend's timeout message" "$OUT/hang.log"
fi

# ── 4. bf16 act ──
cpu tiny_bf16_cpu 2 tiny_bf16
for mode in lazy eager; do
    sim "tiny_bf16_sim_$mode" 2 FSD_CUDASIM=$mode tiny_bf16/cudasim
    same "cudasim: tiny_bf16, world 2, $mode, vs CPU" tiny_bf16_cpu "tiny_bf16_sim_$mode" \
        "loss 1e-2 1e-4" "grad_norm 5e-2" "comm_bytes 0" "mem_peak_bytes 0"
done
device_memory tiny_bf16_sim_lazy

# ── 5. offload = cpu ──
# The counted device peak is the CPU build's plus the device accumulators
# of the gradient (docs/cuda.md, offload), the plan's sharded gradients.
cpu tiny_offload_cpu 2 tiny_offload
build/fsdpc tests/cuda/tiny_offload.fsd --dump-memory --world 2 >"$OUT/offload.memory" 2>&1
acc=$(plan_figure "$OUT/offload.memory" "sharded gradients" 4)
for mode in lazy eager; do
    sim "tiny_offload_sim_$mode" 2 FSD_TF32=0 FSD_CUDASIM=$mode tiny_offload/cudasim
    same "cudasim: tiny_offload, world 2, $mode, vs CPU" tiny_offload_cpu "tiny_offload_sim_$mode" \
        "${FP32[@]:0:3}"
    p_cpu=$(jsonl_max "$OUT/tiny_offload_cpu.jsonl" mem_peak_bytes)
    p_sim=$(jsonl_max "$OUT/tiny_offload_sim_$mode.jsonl" mem_peak_bytes)
    if [ -n "$acc" ] && [ -n "$p_cpu" ] && [ "${p_sim:-x}" = $((p_cpu + acc)) ]; then
        ok "cudasim: tiny_offload, world 2, $mode: counted device peak $p_sim = the CPU build's $p_cpu + accumulators $acc"
    else
        bad "cudasim: tiny_offload, world 2, $mode: counted device peak ${p_sim:-?}; want the CPU build's ${p_cpu:-?} + accumulators ${acc:-?}"
    fi
done
device_memory tiny_offload_sim_lazy

# ── 6. checkpoints ──
resume_check "cudasim: tiny, world 1" build/tiny/cudasim/train tiny_sim
resume_check "cudasim: tiny_offload, world 1" build/tiny_offload/cudasim/train tiny_offload_sim
resume_check "cudasim: tiny_bf16, world 1" build/tiny_bf16/cudasim/train tiny_bf16_sim
# across backends and world sizes: 10 steps and a checkpoint on one side,
# resumed to step 20 on the other (resharded where the worlds differ),
# against the same pair of runs on the CPU build alone
pair() {   # pair TAG NP_A EXE_A NP_B EXE_B [SAVE_FLAG...]
    local tag=$1 np_a=$2 exe_a=$3 np_b=$4 exe_b=$5
    shift 5
    rm -rf "$OUT/ck_$tag"
    run "${tag}_first" FSD_TF32=0 "${MPI[@]}" -np "$np_a" "$exe_a" --steps 10 --seed 1337 \
        --data "$DATA/tiny.bin" --quiet --ckpt-every 10 --ckpt-dir "$OUT/ck_$tag" "$@" &&
        run "${tag}_resumed" FSD_TF32=0 "${MPI[@]}" -np "$np_b" "$exe_b" --steps 20 --seed 1337 \
            --data "$DATA/tiny.bin" --quiet --resume "$OUT/ck_$tag/step_000010" \
            --log "$OUT/$tag.jsonl"
}
SIM_EXE=build/tiny/cudasim/train CPU_EXE=build/tiny/cpu/train
pair cpu_2_1 2 $CPU_EXE 1 $CPU_EXE
pair sim_2_1 2 $SIM_EXE 1 $CPU_EXE
same "cudasim: checkpoint saved by cudasim at world 2, resumed by the CPU build at world 1, vs CPU both" \
    cpu_2_1 sim_2_1 "loss 1e-4 1e-6"
# an async save (a host snapshot through bk_to_host, written by a thread)
# at world 2, resumed at world 2: the 20 straight steps' last 10, exactly
pair sim_async 2 $SIM_EXE 2 $SIM_EXE --ckpt-async
tail -n 10 "$OUT/tiny_sim_w2.jsonl" >"$OUT/tiny_sim_w2_last10.jsonl"
same "cudasim: async checkpoint at world 2, resumed, vs 20 straight steps" tiny_sim_w2_last10 \
    sim_async "loss 0" "grad_norm 0"
pair cpu_1_4 1 $CPU_EXE 4 $CPU_EXE
pair sim_1_4 1 $CPU_EXE 4 $SIM_EXE
same "cudasim: checkpoint saved by the CPU build at world 1, resumed by cudasim at world 4, vs CPU both" \
    cpu_1_4 sim_1_4 "loss 1e-4 1e-6"

# ── 7. the device-timed trace ──
if sim tiny_sim_trace 2 FSD_TF32=0 tiny/cudasim --trace-out "$OUT/trace.json"; then
    if trace_check "$OUT/trace.json" "$STEPS" >"$OUT/trace.check"; then
        ok "cudasim: --trace-out at world 2 passes trace_check ($(head -n 1 "$OUT/trace.check" | sed 's/^ *trace: //'))"
    else
        bad "cudasim: --trace-out at world 2 fails trace_check" "$OUT/trace.check"
    fi
fi

# ── 8. the product bench ──
if run tiny_sim_bench FSD_GEMM_BENCH=1 build/tiny/cudasim/train --steps 2 --seed 1337 \
        --data "$DATA/tiny.bin" --quiet; then
    rows=$(grep -cE '^ *[0-9]+ +[0-9]+ +[0-9]+ [01][01] ' "$OUT/tiny_sim_bench.log")
    timed=$(grep -cE '^ *[0-9]+ +[0-9]+ +[0-9]+ [01][01] .*\| #[0-9]' "$OUT/tiny_sim_bench.log")
    tables=$(grep -c 'FSD_GEMM_BENCH:' "$OUT/tiny_sim_bench.log")
    if [ "$tables" = 1 ] && [ "$rows" -ge 3 ] && [ "$rows" = "$timed" ]; then
        ok "cudasim: FSD_GEMM_BENCH=1 prints one table, $rows product shapes, each timed against the heuristic's candidates"
    else
        bad "cudasim: FSD_GEMM_BENCH=1: $tables tables, $rows shapes, $timed with candidates timed" "$OUT/tiny_sim_bench.log"
    fi
fi

# ── 9. without MPI: NCCL's id through a file ──
rm -f "$OUT/nccl-id"
sim tiny_sim_nompi 2 FSD_TF32=0 FSD_NCCL_ID_FILE="$OUT/nccl-id" tiny/cudasim_nompi
same "cudasim: tiny, MPI=0 build, NCCL id through FSD_NCCL_ID_FILE at world 2, vs CPU" \
    tiny_cpu_w2 tiny_sim_nompi "${FP32[@]}"
[ -e "$OUT/nccl-id" ] && bad "cudasim: FSD_NCCL_ID_FILE $OUT/nccl-id was not removed at the end"

# ── 10. every fence and event wait of the CUDA backend is needed ──
# Each in turn is removed from a copy of the runtime/cuda_*.c file that
# holds it (cuda_comm.c, the collectives, holds them all today), and
# tiny_offload and then tiny at world 2, then tiny_partial at world 4 (the
# partial gathers' fences), with lazy collective streams, must fail: stop
# on the fakes' ordering
# check (a collective not ordered after the compute stream), or stop
# otherwise, or no longer match the CPU build.
eval "$($MAKE -s --no-print-directory cudasim-vars)"
mutant() {   # mutant FILE LINE: build/cudasim/mutant/{tiny,tiny_offload,tiny_partial} without FILE's line LINE
    local dir=build/cudasim/mutant m base
    base=$(basename "$1" .c)
    rm -rf $dir
    mkdir -p $dir
    sed "${2}s/.*/    ; \/* removed *\//" "$1" >$dir/$base.c
    # the mutant object comes first, so the library's own is not linked
    # shellcheck disable=SC2086
    mpicc $SIM_CFLAGS -Iruntime -Itests/cudasim/include -c $dir/$base.c -o $dir/$base.o \
        >"$TMP/mutant.log" 2>&1 || return 1
    for m in tiny tiny_offload tiny_partial; do
        # shellcheck disable=SC2086
        mpicc -x c $SIM_CFLAGS -Iruntime "build/$m/cudasim/train.cu" -x none $dir/$base.o \
            build/cudasim/libfsdrt_cudasim.a $SIM_LIBS -o "$dir/$m" >>"$TMP/mutant.log" 2>&1 || return 1
    done
}
caught=() missed=()
for at in $(grep -n 'fence(r, bk->[a-z0-9]*);\|cudaStreamWaitEvent(' runtime/cuda_*.c | cut -d: -f1,2); do
    file=${at%%:*} line=${at#*:} name=$(basename "${at%%:*}"):${at#*:}
    if ! mutant "$file" "$line"; then
        bad "cudasim: $file without line $line does not build" "$TMP/mutant.log"
        continue
    fi
    how=""
    for m in tiny_offload tiny tiny_partial; do
        ref=${m}_cpu np=2
        [ $m = tiny ] && ref=tiny_cpu_w2
        [ $m = tiny_partial ] && np=4   # its copies over 2 of 4 ranks: backward's partial gathers
        if ! timeout 120 env FSD_TF32=0 "${MPI[@]}" -np $np build/cudasim/mutant/$m --steps "$STEPS" \
                --seed 1337 --data "$DATA/tiny.bin" --quiet --log "$OUT/mutant.jsonl" \
                >"$OUT/mutant.log" 2>&1; then
            how="$m stops"
            grep -q 'is ordered after only' "$OUT/mutant.log" && how="$m: not ordered after compute"
        elif ! jsonl_compare "$OUT/$ref.jsonl" "$OUT/mutant.jsonl" loss 1e-4 1e-6 >/dev/null; then
            how="$m: wrong losses"
        fi
        [ -n "$how" ] && break
    done
    if [ -n "$how" ]; then
        caught+=("$name ($how)")
    else
        missed+=("$name: $(sed -n "${line}p" "$file" | sed 's/^ *//')")
    fi
done
if [ ${#missed[@]} = 0 ] && [ ${#caught[@]} -ge 6 ]; then
    ok "cudasim: each of the CUDA backend's ${#caught[@]} fences and event waits, removed, is caught: ${caught[*]}"
else
    bad "cudasim: removing these lines of runtime/cuda_*.c goes unnoticed: ${missed[*]:-none} (caught: ${#caught[@]})"
fi

# ── 11. under AddressSanitizer ──
# Device memory is heap memory here, each cudaMalloc exactly its size: a
# copy, collective, product or kernel past a buffer's end is reported.
# tiny_offload and tiny_bf16 at world 2, 5 steps with a checkpoint and a
# trace, then tiny_offload resumed from it at world 4 (resharded).
san_ok=1
for m in tiny_offload tiny_bf16; do
    fsd=tests/cuda/$m.fsd
    if ! $MAKE --no-print-directory trainer-cudasim FSD=$fsd CUDASIM_SAN=1 >"$TMP/san_$m.build" 2>&1; then
        bad "cudasim: make trainer-cudasim FSD=$fsd CUDASIM_SAN=1" "$TMP/san_$m.build"
        san_ok=0
    fi
done
if [ $san_ok = 1 ]; then
    san_runs=""
    export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:exitcode=86
    rm -rf "$OUT/ck_san"
    for spec in "tiny_offload 2 --steps 5 --ckpt-every 5 --ckpt-dir $OUT/ck_san" \
            "tiny_bf16 2 --steps 5 --trace-out $OUT/san_trace.json" \
            "tiny_offload 4 --steps 8 --resume $OUT/ck_san/step_000005"; do
        # shellcheck disable=SC2086
        set -- $spec
        m=$1 np=$2
        shift 2
        if timeout 300 env FSD_TF32=0 "${MPI[@]}" -np "$np" -x ASAN_OPTIONS \
                "build/$m/cudasim-san/train" --seed 1337 --data "$DATA/tiny.bin" --quiet "$@" \
                >"$OUT/san.log" 2>&1 && ! grep -q 'AddressSanitizer' "$OUT/san.log"; then
            san_runs+="${san_runs:+, }$m at world $np"
        else
            bad "cudasim: AddressSanitizer: $m at world $np $*" "$OUT/san.log"
            san_ok=0
        fi
    done
    unset ASAN_OPTIONS
    [ $san_ok = 1 ] && ok "cudasim: no AddressSanitizer report: $san_runs (checkpoint, trace, resharded resume)"
fi

# ── 12. evaluation ──
# Each sequence's loss is read back from the device between kernels
# (runtime/eval.c); with offload = cpu and bf16 act the all-gathers of an
# evaluation right after the host update must stage the new masters, not
# the step's bf16 copy of the old ones (cuda_step.c), which would put the
# offload run's val_loss one update behind (1.6e-4 away here, with the reset
# removed).
build/fsdata synth "$DATA/val.bin" --tokens 641 --seed 4 >/dev/null
EV=(--steps 3 --val-data "$DATA/val.bin" --eval-every 1 --eval-sequences 10)
sed 's/^  mixed_precision(param = bf16, reduce = fp32)/&\n  offload = cpu/; s/^model tiny_bf16 /model tiny_bf16_offload /' \
    tests/cuda/tiny_bf16.fsd >"$OUT/tiny_bf16_offload.fsd"
if ! $MAKE --no-print-directory trainer-cudasim FSD="$OUT/tiny_bf16_offload.fsd" >"$TMP/bf16_offload.log" 2>&1; then
    bad "cudasim: make trainer-cudasim FSD=tiny_bf16_offload.fsd" "$TMP/bf16_offload.log"
fi
cpu tiny_eval_cpu 2 tiny "${EV[@]}"
sim tiny_eval_sim 2 FSD_TF32=0 tiny/cudasim "${EV[@]}"
same "cudasim: tiny, world 2, evaluation after every step, vs CPU" tiny_eval_cpu tiny_eval_sim "val_loss 1e-6"
sim tiny_bf16_eval_sim 2 tiny_bf16/cudasim "${EV[@]}"
sim tiny_bf16_offload_eval_sim 2 tiny_bf16_offload/cudasim "${EV[@]}"
same "cudasim: tiny_bf16 with offload = cpu against without, evaluation after every step" \
    tiny_bf16_eval_sim tiny_bf16_offload_eval_sim "val_loss 1e-6"

done_
