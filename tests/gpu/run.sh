#!/usr/bin/env bash
# run.sh — the CUDA build on a GPU machine: everything it needs is the
# repository, the CUDA toolkit with NCCL, MPI and OpenBLAS (for the CPU
# build it is compared with), and one GPU. Under 5 minutes on an H100/H200.
#
#   1. builds the CUDA trainers for examples/tiny.fsd and examples/gpt2.fsd
#      (for this GPU's architecture only) and the CPU trainer for tiny;
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
#      the fp32 run bootstraps NCCL over MPI (mpirun -np 1), the TF32 run
#      through FSD_NCCL_ID_FILE;
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
#      every loss finite, the counted peak within [0.9, 1.3] of the plan
#      (bf16 compute: its buffers are the plan's; the margin is for the
#      runtime's own buffers the plan leaves out, docs/cuda.md);
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
#   7. tests/kernels/test_kernels.c built with nvcc for this GPU (fp32 and
#      bf16 act) and run:
#      every kernel (the tiled attention included) against its float64
#      references and finite differences, on the device.
#
# Prints one line per check and exits non-zero on any failure. Outputs
# (logs, data) stay in build/gpu-test for a look afterwards.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
OUT=${GPU_TEST_OUT:-build/gpu-test}
GPT2_STEPS=${GPT2_STEPS:-20}
mkdir -p "$OUT"
fails=0
ok()  { echo "ok   $1"; }
bad() { fails=$((fails + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/     /' "$2" | tail -30; }
t0=$(date +%s)

if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu/run.sh needs a GPU: nvidia-smi -L finds none (tests/cuda/run.sh checks the build without one)"
    exit 2
fi
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
ARCH=sm_$cap
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "GPU: $gpu ($ARCH); $(nvcc --version | tail -n 1)"
MPIRUN=(mpirun --oversubscribe -np 1)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)

# ── 1. builds ──
build() {
    if $MAKE --no-print-directory "$@" >"$OUT/build.log" 2>&1; then
        ok "make $*"
    else
        bad "make $*" "$OUT/build.log"
        exit 1
    fi
}
build all
build trainer FSD=examples/tiny.fsd BACKEND=cuda ARCH=$ARCH
build trainer FSD=examples/gpt2.fsd BACKEND=cuda ARCH=$ARCH
build trainer FSD=examples/tiny.fsd BACKEND=cpu
build trainer FSD=tests/cuda/tiny_offload.fsd BACKEND=cuda ARCH=$ARCH
build trainer FSD=tests/cuda/tiny_offload.fsd BACKEND=cpu
build trainer FSD=tests/cuda/tiny_bf16.fsd BACKEND=cuda ARCH=$ARCH
build trainer FSD=tests/cuda/tiny_bf16.fsd BACKEND=cpu
build/fsdata synth "$OUT/tiny.bin" --tokens 200000 --seed 1 --vocab 256 >/dev/null
build/fsdata synth "$OUT/gpt2.bin" --tokens $((GPT2_STEPS * 32 * 1025 + 200000)) --seed 1 --vocab 50257 >/dev/null

# run NAME CMD...: runs a trainer, its stdout and stderr into $OUT/NAME.log
run() {
    local name=$1
    shift
    if timeout 300 "$@" >"$OUT/$name.log" 2>&1; then
        return 0
    fi
    bad "$name: $* (status $?)" "$OUT/$name.log"
    return 1
}

# compare A.jsonl B.jsonl KEY TOL [FIRST_TOL]: max relative difference of KEY over steps
compare() {
    python3 - "$@" <<'EOF'
import json, math, sys
a, b, key, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
first_tol = float(sys.argv[5]) if len(sys.argv) > 5 else tol
ra = [json.loads(l) for l in open(a)]
rb = [json.loads(l) for l in open(b)]
if len(ra) != len(rb) or not ra:
    print(f"{len(ra)} steps against {len(rb)}")
    sys.exit(1)
worst, at, bad = 0.0, 0, []
for x, y in zip(ra, rb):
    u, v = x[key], y[key]
    if u is None or v is None or not math.isfinite(u) or not math.isfinite(v):
        bad.append(f"step {x['step']}: {u} vs {v}")
        continue
    rel = abs(u - v) / max(abs(u), abs(v), 1e-30)
    if rel > (first_tol if x["step"] == ra[0]["step"] else tol):
        bad.append(f"step {x['step']}: {u:.9g} vs {v:.9g} (relative {rel:.2e})")
    if rel > worst:
        worst, at = rel, x["step"]
print(f"{key}: largest relative difference {worst:.2e} at step {at} over {len(ra)} steps"
      + ("; " + "; ".join(bad[:3]) if bad else ""))
sys.exit(1 if bad else 0)
EOF
}

# ── 2. tiny: the CPU build against the GPU build ──
tiny=(--steps 50 --seed 1337 --data "$OUT/tiny.bin" --quiet)
run tiny_cpu build/tiny/cpu/train "${tiny[@]}" --log "$OUT/tiny_cpu.jsonl"
run tiny_gpu_fp32 env FSD_TF32=0 "${MPIRUN[@]}" -x FSD_TF32 build/tiny/cuda/train "${tiny[@]}" \
    --log "$OUT/tiny_gpu_fp32.jsonl"
rm -f "$OUT/nccl-id"
run tiny_gpu_tf32 env FSD_NCCL_ID_FILE="$OUT/nccl-id" build/tiny/cuda/train "${tiny[@]}" --log "$OUT/tiny_gpu_tf32.jsonl"
if [ -s "$OUT/tiny_cpu.jsonl" ] && [ -s "$OUT/tiny_gpu_fp32.jsonl" ]; then
    for spec in "loss 1e-3 1e-5" "grad_norm 1e-2" "comm_bytes 0" "mem_peak_bytes 0"; do
        set -- $spec
        if msg=$(compare "$OUT/tiny_cpu.jsonl" "$OUT/tiny_gpu_fp32.jsonl" "$@"); then
            ok "tiny, CPU vs GPU (fp32 products): $msg"
        else
            bad "tiny, CPU vs GPU (fp32 products): $msg"
        fi
    done
fi
if [ -s "$OUT/tiny_cpu.jsonl" ] && [ -s "$OUT/tiny_gpu_tf32.jsonl" ]; then
    if msg=$(compare "$OUT/tiny_cpu.jsonl" "$OUT/tiny_gpu_tf32.jsonl" loss 3e-2); then
        ok "tiny, CPU vs GPU (TF32 products, NCCL id through a file): $msg"
    else
        bad "tiny, CPU vs GPU (TF32 products, NCCL id through a file): $msg"
    fi
    [ -e "$OUT/nccl-id" ] && bad "FSD_NCCL_ID_FILE $OUT/nccl-id was not removed at the end"
fi

# ── 2b. tiny in bf16 compute: the CPU build against the GPU build ──
# Both store every tensor as bf16 with the same rounding (templates/portable.h's
# fsd_narrow is the GPU's round-to-nearest-even) and accumulate in fp32, in
# different orders: a sum near a rounding midpoint now and then rounds the
# other way, one bf16 ulp (2^-8 relative) in one element. Bounds: the step-0
# loss within 1e-4 relative (the forward alone, where such flips average out
# over 16,384 targets: tests/oracle measured 4e-6 between two summation orders
# of the same bf16 model), every loss within 1e-2 and grad norm within 5e-2
# over 50 steps (ten times fp32's, for AdamW amplifying the flips). They catch
# a broken bf16 path on the GPU (a misread layout in cuBLASLt, a kernel
# reading bf16 bits as float); whether the bf16 numerics are right is
# tests/oracle's job on the CPU build, which this run must then agree with.
run tiny_bf16_cpu build/tiny_bf16/cpu/train "${tiny[@]}" --log "$OUT/tiny_bf16_cpu.jsonl"
run tiny_bf16_gpu "${MPIRUN[@]}" build/tiny_bf16/cuda/train "${tiny[@]}" --log "$OUT/tiny_bf16_gpu.jsonl"
if [ -s "$OUT/tiny_bf16_cpu.jsonl" ] && [ -s "$OUT/tiny_bf16_gpu.jsonl" ]; then
    for check in "loss 1e-2 1e-4" "grad_norm 5e-2"; do
        # shellcheck disable=SC2086
        set -- $check
        if msg=$(compare "$OUT/tiny_bf16_cpu.jsonl" "$OUT/tiny_bf16_gpu.jsonl" "$@"); then
            ok "tiny_bf16, CPU vs GPU (bf16 compute): $msg"
        else
            bad "tiny_bf16, CPU vs GPU (bf16 compute): $msg"
        fi
    done
fi

# ── 3. tiny on the GPU: checkpoint, resume, export ──
# resume_check LABEL EXE TAG: 20 straight steps against 10 steps, a
# checkpoint, and 10 more resumed from it: the last 10 losses to 1e-6 and
# the exported weights byte for byte (bk_to_host / bk_from_host, the pools
# across a restart).
ck=(--seed 1337 --data "$OUT/tiny.bin" --quiet)
resume_check() {
    local label=$1 exe=$2 tag=$3 msg
    rm -rf "$OUT/ckpt_$tag" "$OUT/ckpt_${tag}_resumed"
    if run "${tag}_straight" "$exe" "${ck[@]}" --steps 20 --log "$OUT/${tag}_straight.jsonl" \
            --export "$OUT/${tag}_straight.safetensors" &&
        run "${tag}_first10" "$exe" "${ck[@]}" --steps 20 --ckpt-every 10 \
            --ckpt-dir "$OUT/ckpt_$tag" --log "$OUT/${tag}_first.jsonl" &&
        run "${tag}_resumed" "$exe" "${ck[@]}" --steps 20 --resume "$OUT/ckpt_$tag/step_000010" \
            --ckpt-dir "$OUT/ckpt_${tag}_resumed" --log "$OUT/${tag}_resumed.jsonl" \
            --export "$OUT/${tag}_resumed.safetensors"; then
        tail -n 10 "$OUT/${tag}_straight.jsonl" >"$OUT/${tag}_straight_last10.jsonl"
        if msg=$(compare "$OUT/${tag}_straight_last10.jsonl" "$OUT/${tag}_resumed.jsonl" loss 1e-6) &&
                cmp -s "$OUT/${tag}_straight.safetensors" "$OUT/${tag}_resumed.safetensors"; then
            ok "$label: 10 steps, checkpoint, resume, 10 steps = 20 straight ($msg; exported weights identical)"
        else
            bad "$label: resume from step 10 differs from 20 straight steps: $msg"
        fi
    fi
}
resume_check "tiny on the GPU" build/tiny/cuda/train tiny

# ── 4. GPT-2 124M ──
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/smi.txt" 2>/dev/null &
smi=$!
base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1)
run gpt2 build/gpt2/cuda/train --steps "$GPT2_STEPS" --data "$OUT/gpt2.bin" --log "$OUT/gpt2.jsonl"
kill $smi 2>/dev/null
wait $smi 2>/dev/null
build/fsdpc examples/gpt2.fsd --dump-memory --world 1 >"$OUT/gpt2.memory" 2>&1
build/fsdpc examples/gpt2.fsd --sim h200:gpus=1 >"$OUT/gpt2.sim" 2>&1
if [ -s "$OUT/gpt2.jsonl" ]; then
    flops=$(sed -n 's/^ *\([0-9.e+]*\),  \/\* flops_per_sample \*\//\1/p' build/gpt2/cuda/train.cu)
    plan_peak=$(awk '/^  peak / {gsub(",", "", $2); print $2; exit}' "$OUT/gpt2.memory")
    smi_peak=$(sort -n "$OUT/smi.txt" | tail -n 1)
    python3 - "$OUT/gpt2.jsonl" "$flops" "$plan_peak" "${smi_peak:-0}" "${base:-0}" "$OUT/gpt2.sim" <<'EOF'
import json, math, re, statistics, sys
log, flops_per_seq, plan_peak, smi_peak, smi_base, sim = sys.argv[1:7]
rows = [json.loads(l) for l in open(log)]
T = 1024
flops_tok = float(flops_per_seq) / T
steady = rows[5:] if len(rows) > 8 else rows[1:]
tok_s = statistics.median(r["tokens_per_s"] for r in steady)
step_ms = statistics.median(r["step_ms"] for r in steady)
bf16 = 989.5e12                          # H100/H200 SXM dense bf16 peak, as compiler/sim.c
peak = max(r["mem_peak_bytes"] for r in rows)
plan = int(plan_peak)
text = open(sim).read()
m = re.search(r"MFU\D*([\d.]+)\s*%", text)
sim_mfu = m.group(1) + "%" if m else "?"
print(f"     gpt2: {len(rows)} steps; median {tok_s:,.0f} tokens/s, {step_ms:.1f} ms a step "
      f"(steps {steady[0]['step']}-{steady[-1]['step']})")
print(f"     MFU {100 * tok_s * flops_tok / bf16:.1f}% of bf16 dense peak (gpt2 computes in bf16); "
      f"the simulator predicts MFU {sim_mfu} on an H200")
print(f"     memory: counted peak {peak / 2**30:.2f} GiB against the plan's {plan / 2**30:.2f} GiB "
      f"({peak / plan:.2f}x); nvidia-smi peak {(int(smi_peak) - int(smi_base)) / 1024:.2f} GiB over "
      f"the idle {int(smi_base) / 1024:.2f} GiB (CUDA context, cuBLAS, NCCL included)")
losses = [r["loss"] for r in rows]
ok = all(x is not None and math.isfinite(x) for x in losses)
ok = ok and abs(losses[0] - math.log(50257)) < 0.5
ok = ok and 0.9 <= peak / plan <= 1.3
print(f"     losses {losses[0]:.4f} … {losses[-1]:.4f} (ln 50257 = {math.log(50257):.4f})")
sys.exit(0 if ok else 1)
EOF
    if [ $? = 0 ]; then
        ok "gpt2: $GPT2_STEPS steps on the GPU: losses finite and the first near ln(50257); counted peak within [0.9, 1.3] of the plan"
    else
        bad "gpt2: $GPT2_STEPS steps: a loss, or the memory peak against the plan, is off" "$OUT/gpt2.log"
    fi
fi

# ── 6. offload = cpu: tiny with its shards on the host ──
off=(--steps 50 --seed 1337 --data "$OUT/tiny.bin" --quiet)
run tiny_offload_cpu build/tiny_offload/cpu/train "${off[@]}" --log "$OUT/tiny_offload_cpu.jsonl"
run tiny_offload_gpu env FSD_TF32=0 "${MPIRUN[@]}" -x FSD_TF32 build/tiny_offload/cuda/train "${off[@]}" \
    --log "$OUT/tiny_offload_gpu.jsonl"
if [ -s "$OUT/tiny_offload_cpu.jsonl" ] && [ -s "$OUT/tiny_offload_gpu.jsonl" ]; then
    for spec in "loss 1e-3 1e-5" "grad_norm 1e-2" "comm_bytes 0"; do
        set -- $spec
        if msg=$(compare "$OUT/tiny_offload_cpu.jsonl" "$OUT/tiny_offload_gpu.jsonl" "$@"); then
            ok "tiny, offload = cpu, CPU vs GPU (fp32 products): $msg"
        else
            bad "tiny, offload = cpu, CPU vs GPU (fp32 products): $msg"
        fi
    done
    build/fsdpc tests/cuda/tiny_offload.fsd --dump-memory --world 1 >"$OUT/tiny_offload.memory" 2>&1
    acc=$(awk '/^  sharded gradients/ {gsub(",", "", $4); print $4; exit}' "$OUT/tiny_offload.memory")
    peak() { python3 -c "import json,sys; print(max(json.loads(l)['mem_peak_bytes'] for l in open(sys.argv[1])))" "$1"; }
    p_gpu=$(peak "$OUT/tiny_offload_gpu.jsonl")
    p_cpu=$(peak "$OUT/tiny_offload_cpu.jsonl")
    p_dev=$( [ -s "$OUT/tiny_gpu_fp32.jsonl" ] && peak "$OUT/tiny_gpu_fp32.jsonl" || echo 0)
    if [ -n "$acc" ] && [ "$p_gpu" = $((p_cpu + acc)) ] && [ "$p_gpu" -lt "$p_dev" ]; then
        ok "tiny, offload = cpu: counted device peak $p_gpu bytes = the CPU build's $p_cpu + accumulators $acc, below $p_dev without offload"
    else
        bad "tiny, offload = cpu: counted device peak $p_gpu bytes; want the CPU build's $p_cpu + accumulators ${acc:-?}, below $p_dev without offload"
    fi
fi
resume_check "tiny, offload = cpu" build/tiny_offload/cuda/train tiny_offload

# ── 7. the kernel tests on this GPU ──
# tests/kernels/test_kernels.c built with nvcc runs every launcher on the
# device (managed memory) against its float64 references and finite
# differences: the tiled attention kernels included, which the CPU checks
# only through the block emulation.
# Built twice: fp32, and with bf16 act (-DFSD_ACT_BF16: tensors stored as
# bf16, references from the rounded inputs). FSD_STREAM=0: the test has no
# runtime, so kernels launch on the default stream.
for prec in fp32 bf16; do
    flags=()
    [ $prec = bf16 ] && flags=(-DFSD_ACT_BF16)
    if nvcc -x cu -O2 -arch="$ARCH" -DFSD_STREAM=0 "${flags[@]}" -Iruntime -Itemplates \
            tests/kernels/test_kernels.c -o "$OUT/test_kernels_$prec" >"$OUT/kernels_build_$prec.log" 2>&1; then
        if timeout 300 "$OUT/test_kernels_$prec" >"$OUT/kernels_$prec.log" 2>&1; then
            ok "kernel tests on the GPU ($prec): $(tail -n 1 "$OUT/kernels_$prec.log")"
        else
            bad "kernel tests on the GPU ($prec, status $?)" "$OUT/kernels_$prec.log"
        fi
    else
        bad "nvcc tests/kernels/test_kernels.c for $ARCH ($prec)" "$OUT/kernels_build_$prec.log"
    fi
done

# ── 5. no step allocated ──
if grep -l "did not foresee" "$OUT"/*.log >"$OUT/notes.txt" 2>/dev/null; then
    bad "a step allocated an unsharded buffer the start-up replay missed:" "$OUT/notes.txt"
else
    ok "no step allocated device memory (no pool note in any run)"
fi

echo "tests/gpu/run.sh: $fails failed, $(($(date +%s) - t0)) s; logs in $OUT"
[ $fails = 0 ]
