# lib.sh — the GPU check's one set of checks, sourced by tests/gpu/run.sh
# (everything on one machine) and by a pack's run.sh (tests/gpu/device.sh,
# on a GPU machine that has neither MPI nor OpenBLAS nor bison): the
# counters, running a trainer, the comparisons of --log files, and
# gpu_checks, sections 2-8 of tests/gpu/run.sh's header. Bash and POSIX awk
# only (mawk does), no python: a GPU machine may have none.
#
# gpu_checks reads (set by the caller):
#   OUT         where the GPU runs' logs go;
#   REF         the CPU side, made beforehand: tiny_cpu.jsonl,
#               tiny_bf16_cpu.jsonl, tiny_offload_cpu.jsonl (50 steps at
#               seed 1337), gpt2.memory and tiny_offload.memory (fsdpc
#               --dump-memory --world 1), gpt2.sim (fsdpc --sim h200:gpus=1);
#   DATA        tiny.bin and gpt2.bin (fsdata synth);
#   CUDA_BUILD  MODEL/train and MODEL/train.cu for tiny, gpt2, tiny_offload
#               and tiny_bf16;
#   GPU_LAUNCH  mpirun: the fp32, bf16 and offload runs of sections 2, 2b and
#               6 start under `mpirun -np 1` (NCCL bootstrapped over MPI);
#               anything else: alone (no bootstrap at all, world 1);
#   GPT2_STEPS  GPT-2's steps (section 4);
# and expects the kernel tests built as $OUT/test_kernels_{fp32,bf16,bf16_hd64}
# (kernel_test_build) and the kernel timings as $OUT/kernel_bench
# (kernel_bench_build), their build logs beside them.

fails=0
ok() { echo "ok   $1"; }
bad() {
    fails=$((fails + 1))
    echo "FAIL $1"
    [ -n "${2:-}" ] && [ -f "$2" ] && sed 's/^/     /' "$2" | tail -30
    return 0
}

# jsonl_compare A.jsonl B.jsonl KEY TOL [FIRST_TOL]: the largest relative
# difference of KEY between two --log files, step by step, as one line.
# Fails when the step counts differ, a value is missing or null (a
# diverged run logs null), or a step differs by more than TOL (FIRST_TOL
# for the first step); the line then names the first three such steps.
jsonl_compare() {
    awk -v fa="$1" -v fb="$2" -v key="$3" -v tol="$4" -v first_tol="${5:-$4}" '
    function field(line, k,    v) {
        if (!match(line, "\"" k "\": *[^,}]*"))
            return "missing"
        v = substr(line, RSTART, RLENGTH)
        sub(/^"[^"]*": */, "", v)
        return v
    }
    function number(v) { return v ~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ }
    function abs(x) { return x < 0 ? -x : x }
    BEGIN {
        na = 0
        while ((getline line < fa) > 0)
            if (line ~ /[^ \t]/) a[na++] = line
        close(fa)   # so that a file compared with itself is read again
        nb = 0
        while ((getline line < fb) > 0)
            if (line ~ /[^ \t]/) b[nb++] = line
        close(fb)
        if (na != nb || na == 0) {
            printf "%d steps against %d\n", na, nb
            exit 1
        }
        worst = 0; at = field(a[0], "step"); nbad = 0; why = ""
        for (i = 0; i < na; i++) {
            s = field(a[i], "step"); u = field(a[i], key); v = field(b[i], key)
            if (!number(u) || !number(v)) {
                if (++nbad <= 3) why = why "; step " s ": " u " vs " v
                continue
            }
            u += 0; v += 0
            m = abs(u) > abs(v) ? abs(u) : abs(v)
            rel = abs(u - v) / (m > 1e-30 ? m : 1e-30)
            if (rel > (i == 0 ? first_tol : tol) && ++nbad <= 3)
                why = why sprintf("; step %s: %.9g vs %.9g (relative %.2e)", s, u, v, rel)
            if (rel > worst) { worst = rel; at = s }
        }
        printf "%s: largest relative difference %.2e at step %s over %d steps%s\n", key, worst, at, na, why
        exit (nbad > 0 ? 1 : 0)
    }'
}

# jsonl_max FILE KEY: KEY's largest value over a --log file (%.0f: byte
# counts pass 2^31, which some awks' %d clamps).
jsonl_max() {
    awk -v key="$2" '
    match($0, "\"" key "\": *-?[0-9.eE+-]+") {
        v = substr($0, RSTART, RLENGTH); sub(/^"[^"]*": */, "", v); v += 0
        if (!seen || v > best) best = v
        seen = 1
    }
    END { if (seen) printf "%.0f\n", best; else exit 1 }' "$1"
}

# trace_check FILE [STEPS]: a --trace-out file of a GPU run (or a cudasim
# one), read as the trainer writes it (one event a line): rank 0 has at least
# one op, all-gather and reduce-scatter; no duration is negative; and each
# rank's compute stream's ops are in order, none starting before the one
# before it ended (0.5 us of rounding), as the device runs them. Prints rank
# 0's figures and op kinds (an op's name to its first space) that took the
# most time, in ms a step over STEPS steps (default 1), and how busy its ops
# kept the compute stream.
# That busy share is printed, never held to a bound: it is wall-clock time
# in proportion, which a loaded machine changes (cudasim's device threads
# share the cores with whatever else runs; a world-2 run once showed 48.0%
# against a bound of 50%). Only what cannot depend on the load is asserted:
# which events there are, their order, and that they do not overlap.
trace_check() {
    awk -v steps="${2:-1}" '
    /"ph":"X"/ {
        match($0, /"pid":[0-9]+/); pid = substr($0, RSTART + 6, RLENGTH - 6) + 0
        match($0, /"tid":[0-9]+/); tid = substr($0, RSTART + 6, RLENGTH - 6) + 0
        match($0, /"ts":-?[0-9.]+/); ts = substr($0, RSTART + 5, RLENGTH - 5) + 0
        match($0, /"dur":-?[0-9.]+/); dur = substr($0, RSTART + 6, RLENGTH - 6) + 0
        if (dur < 0) { printf "     trace: a negative duration: %s\n", $0; bad = 1 }
        if (tid == 0 && ops[pid]++ && ts < end[pid] - 0.5) {
            printf "     trace: rank %d: ops overlap at ts %.3f\n", pid, ts; bad = 1
        }
        if (tid == 0) end[pid] = ts + dur
        if (pid != 0) next
        n[tid]++
        if (tid == 0) {
            if (n[0] == 1) first = ts
            end0 = ts + dur; busy += dur
            match($0, /"name":"[^" ]*/); kind = substr($0, RSTART + 8, RLENGTH - 8)
            if (!(kind in by)) kinds[++nk] = kind
            by[kind] += dur; calls[kind]++
        }
    }
    END {
        span = end0 - first
        printf "     trace: %d ops, %d all-gathers, %d reduce-scatters; ops busy %.1f%% of %.1f ms\n",
               n[0], n[1], n[2], (span > 0 ? 100 * busy / span : 0), span / 1000
        for (shown = 0; shown < 12 && shown < nk; shown++) {   # the largest first
            top = ""
            for (i = 1; i <= nk; i++)
                if (!(kinds[i] in done) && (top == "" || by[kinds[i]] > by[top])) top = kinds[i]
            done[top] = 1
            printf "     trace: %-22s %8.2f ms a step, %5d calls\n", top, by[top] / 1000 / steps,
                   calls[top] / steps
        }
        if (!n[0]) { print "     trace: rank 0 has no op"; bad = 1 }
        if (!n[1]) { print "     trace: rank 0 has no all-gather"; bad = 1 }
        if (!n[2]) { print "     trace: rank 0 has no reduce-scatter"; bad = 1 }
        exit bad
    }' "$1"
}

# plan_figure FILE LABEL FIELD: a byte count from fsdpc --dump-memory, the
# first line starting "  LABEL", field FIELD, without its commas.
plan_figure() {
    awk -v label="$2" -v f="$3" 'index($0, "  " label) == 1 { gsub(",", "", $f); print $f; exit }' "$1"
}

# gpt2_report LOG FLOPS_PER_SEQ PLAN_PEAK SMI_PEAK SMI_BASE SIM: GPT-2's
# speed, MFU and memory against the plan and the simulator, printed; fails
# unless every loss is finite, the first is within 0.5 of ln(50257) and the
# counted peak is the plan's peak to the byte (a bf16 policy: the device
# counts nothing beyond the plan; docs/cuda.md#memory-beyond-the-plan).
gpt2_report() {
    awk -v flops_seq="$2" -v plan="$3" -v smi_peak="$4" -v smi_base="$5" -v sim="$6" '
    function field(line, k,    v) {
        if (!match(line, "\"" k "\": *[^,}]*")) return "missing"
        v = substr(line, RSTART, RLENGTH); sub(/^"[^"]*": */, "", v); return v
    }
    function median(x, n,    i, j, t) {
        for (i = 1; i < n; i++)
            for (j = i; j > 0 && x[j - 1] > x[j]; j--) { t = x[j]; x[j] = x[j - 1]; x[j - 1] = t }
        return n % 2 ? x[(n - 1) / 2] : (x[n / 2 - 1] + x[n / 2]) / 2
    }
    { row[n++] = $0 }
    END {
        if (n == 0) { print "     gpt2: no steps logged"; exit 1 }
        T = 1024; flops_tok = flops_seq / T
        first = n > 8 ? 5 : 1                  # steady steps: past the warm-up
        if (first >= n) first = 0
        k = 0
        for (i = first; i < n; i++) {
            tok[k] = field(row[i], "tokens_per_s") + 0; ms[k] = field(row[i], "step_ms") + 0; k++
        }
        tok_s = median(tok, k); step_ms = median(ms, k)
        bf16 = 989.5e12                        # H100/H200 SXM dense bf16 peak, as compiler/sim.c
        peak = 0; good = 1
        for (i = 0; i < n; i++) {
            p = field(row[i], "mem_peak_bytes") + 0; if (p > peak) peak = p
            l = field(row[i], "loss")
            if (l !~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/) good = 0
            loss[i] = l
        }
        sim_mfu = "?"
        while ((getline line < sim) > 0)
            if (sim_mfu == "?" && match(line, /MFU[^0-9]*[0-9.]+[ \t]*%/)) {
                s = substr(line, RSTART, RLENGTH); sub(/^MFU[^0-9]*/, "", s); sub(/[ \t]*%$/, "", s)
                sim_mfu = s "%"
            }
        printf "     gpt2: %d steps; median %.0f tokens/s, %.1f ms a step (steps %s-%s)\n", n, tok_s,
               step_ms, field(row[first], "step"), field(row[n - 1], "step")
        printf "     MFU %.1f%% of bf16 dense peak (gpt2 computes in bf16); the simulator predicts MFU %s on an H200\n",
               100 * tok_s * flops_tok / bf16, sim_mfu
        ratio = plan > 0 ? peak / plan : 0
        # (no comparison inside a printf: there ">" redirects)
        smi = "not measured (no nvidia-smi)"
        if (smi_peak > 0)
            smi = sprintf("%.2f GiB over the idle %.2f GiB (CUDA context, cuBLAS, NCCL included)",
                          (smi_peak - smi_base) / 1024, smi_base / 1024)
        printf "     memory: counted peak %.2f GiB against the plan'"'"'s %.2f GiB (%.2fx); nvidia-smi peak %s\n",
               peak / 2^30, plan / 2^30, ratio, smi
        ln_v = log(50257)
        printf "     losses %s … %s (ln 50257 = %.4f)\n", loss[0], loss[n - 1], ln_v
        d = loss[0] - ln_v
        if (!good || d > 0.5 || d < -0.5 || peak != plan) exit 1
    }' "$1"
}

# run NAME [FSD_VAR=VALUE...] PROGRAM ARGS...: runs a program (at most
# 300 s) with those variables set, its stdout and stderr into $OUT/NAME.log; a
# failure is a FAIL line with the log's tail.
run() {
    local name=$1 st
    shift
    local envs=()
    while [ $# -gt 0 ] && [[ $1 =~ ^FSD_[A-Z0-9_]*= ]]; do
        envs+=("$1")
        shift
    done
    timeout 300 env ${envs[@]+"${envs[@]}"} "$@" >"$OUT/$name.log" 2>&1
    st=$?
    [ $st = 0 ] && return 0
    bad "$name: ${envs[*]+${envs[*]} }$* (status $st)" "$OUT/$name.log"
    return 1
}

# run_cuda NAME [FSD_VAR=VALUE...] TRAINER ARGS...: a CUDA trainer at world 1,
# under `mpirun -np 1` when GPU_LAUNCH=mpirun (the variables passed on with
# -x), else alone.
run_cuda() {
    local name=$1
    shift
    local envs=() xs=()
    while [ $# -gt 0 ] && [[ $1 =~ ^FSD_[A-Z0-9_]*= ]]; do
        envs+=("$1")
        xs+=(-x "${1%%=*}")
        shift
    done
    if [ "${GPU_LAUNCH:-}" = mpirun ]; then
        local mpi=(mpirun --oversubscribe -np 1)
        [ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
        run "$name" ${envs[@]+"${envs[@]}"} "${mpi[@]}" ${xs[@]+"${xs[@]}"} "$@"
    else
        run "$name" ${envs[@]+"${envs[@]}"} "$@"
    fi
}

# check_compare LABEL A B KEY TOL [FIRST_TOL]: one ok/FAIL line for a jsonl_compare.
check_compare() {
    local label=$1 msg
    shift
    if msg=$(jsonl_compare "$@"); then
        ok "$label: $msg"
    else
        bad "$label: $msg"
    fi
}

# kernel_test_build ROOT ARCH PREC: tests/kernels/test_kernels.c (under ROOT,
# beside ROOT/runtime and ROOT/templates) built with nvcc into
# $OUT/test_kernels_PREC, fp32 or with bf16 act (-DFSD_ACT_BF16: tensors
# stored as bf16, references from the rounded inputs), or bf16_hd64: bf16
# with the attention tiles of FSD_ATTN_HD_MAX 64, the size fsdpc emits for
# models whose heads are 64 wide or less (GPT-2). FSD_STREAM=0: the
# test has no runtime, so kernels launch on the default stream.
kernel_test_build() {
    local root=$1 arch=$2 prec=$3 flags=()
    case $prec in
    bf16) flags=(-DFSD_ACT_BF16) ;;
    bf16_hd64) flags=(-DFSD_ACT_BF16 -DFSD_ATTN_HD_MAX=64) ;;
    esac
    rm -f "$OUT/test_kernels_$prec"
    "${NVCC:-nvcc}" -x cu -O2 -arch="$arch" -DFSD_STREAM=0 ${flags[@]+"${flags[@]}"} -I"$root/runtime" \
        -I"$root/templates" "$root/tests/kernels/test_kernels.c" -o "$OUT/test_kernels_$prec" \
        >"$OUT/kernels_build_$prec.log" 2>&1
}

# kernel_bench_build ROOT ARCH: tests/gpu/kernel_bench.cu (under ROOT, beside
# ROOT/runtime and ROOT/templates) built with nvcc into $OUT/kernel_bench,
# bf16 act, as GPT-2's program computes
kernel_bench_build() {
    local root=$1 arch=$2
    rm -f "$OUT/kernel_bench"
    "${NVCC:-nvcc}" -O2 -arch="$arch" -DFSD_ACT_BF16 -I"$root/runtime" -I"$root/templates" \
        "$root/tests/gpu/kernel_bench.cu" -o "$OUT/kernel_bench" >"$OUT/kernel_bench_build.log" 2>&1
}

# ── sections 2-8 ──
gpu_checks() {
    local tiny=(--steps 50 --seed 1337 --data "$DATA/tiny.bin" --quiet)

    # ── 2. tiny: the CPU build against the GPU build ──
    run_cuda tiny_gpu_fp32 FSD_TF32=0 "$CUDA_BUILD/tiny/train" "${tiny[@]}" --log "$OUT/tiny_gpu_fp32.jsonl"
    rm -f "$OUT/nccl-id"
    run tiny_gpu_tf32 FSD_NCCL_ID_FILE="$OUT/nccl-id" "$CUDA_BUILD/tiny/train" "${tiny[@]}" \
        --log "$OUT/tiny_gpu_tf32.jsonl"
    local how="NCCL over MPI"
    [ "${GPU_LAUNCH:-}" = mpirun ] || how="world 1 without a bootstrap"
    if [ -s "$REF/tiny_cpu.jsonl" ] && [ -s "$OUT/tiny_gpu_fp32.jsonl" ]; then
        local spec
        for spec in "loss 1e-3 1e-5" "grad_norm 1e-2" "comm_bytes 0" "mem_peak_bytes 0"; do
            # shellcheck disable=SC2086
            check_compare "tiny, CPU vs GPU (fp32 products, $how)" "$REF/tiny_cpu.jsonl" \
                "$OUT/tiny_gpu_fp32.jsonl" $spec
        done
    fi
    if [ -s "$REF/tiny_cpu.jsonl" ] && [ -s "$OUT/tiny_gpu_tf32.jsonl" ]; then
        check_compare "tiny, CPU vs GPU (TF32 products, NCCL id through a file)" "$REF/tiny_cpu.jsonl" \
            "$OUT/tiny_gpu_tf32.jsonl" loss 3e-2
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
    run_cuda tiny_bf16_gpu "$CUDA_BUILD/tiny_bf16/train" "${tiny[@]}" --log "$OUT/tiny_bf16_gpu.jsonl"
    if [ -s "$REF/tiny_bf16_cpu.jsonl" ] && [ -s "$OUT/tiny_bf16_gpu.jsonl" ]; then
        check_compare "tiny_bf16, CPU vs GPU (bf16 compute)" "$REF/tiny_bf16_cpu.jsonl" \
            "$OUT/tiny_bf16_gpu.jsonl" loss 1e-2 1e-4
        check_compare "tiny_bf16, CPU vs GPU (bf16 compute)" "$REF/tiny_bf16_cpu.jsonl" \
            "$OUT/tiny_bf16_gpu.jsonl" grad_norm 5e-2
    fi

    # ── 3. tiny on the GPU: checkpoint, resume, export ──
    resume_check "tiny on the GPU" "$CUDA_BUILD/tiny/train" tiny

    # ── 4. GPT-2 124M ──
    local smi="" base=0 smi_peak=0
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >"$OUT/smi.txt" 2>/dev/null &
        smi=$!
        base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -n 1)
    fi
    # FSD_GEMM_BENCH: after the steps, each product shape timed (docs/cuda.md)
    run gpt2 FSD_GEMM_BENCH=1 "$CUDA_BUILD/gpt2/train" --steps "$GPT2_STEPS" --data "$DATA/gpt2.bin" \
        --log "$OUT/gpt2.jsonl"
    if [ -n "$smi" ]; then
        kill "$smi" 2>/dev/null
        wait "$smi" 2>/dev/null
        smi_peak=$(sort -n "$OUT/smi.txt" | tail -n 1)
    fi
    if [ -s "$OUT/gpt2.jsonl" ]; then
        local flops plan_peak
        flops=$(sed -n 's/^ *\([0-9.e+]*\),  \/\* flops_per_sample \*\//\1/p' "$CUDA_BUILD/gpt2/train.cu")
        plan_peak=$(plan_figure "$REF/gpt2.memory" "peak " 2)
        if gpt2_report "$OUT/gpt2.jsonl" "${flops:-0}" "${plan_peak:-0}" "${smi_peak:-0}" "${base:-0}" \
                "$REF/gpt2.sim"; then
            ok "gpt2: $GPT2_STEPS steps on the GPU: losses finite and the first near ln(50257); counted peak the plan's, to the byte"
        else
            bad "gpt2: $GPT2_STEPS steps: a loss, or the memory peak against the plan, is off" "$OUT/gpt2.log"
        fi
        # what the device holds beyond the plan, to read nvidia-smi's figure against
        grep -E '^(memory|device memory):' "$OUT/gpt2.log" | sed 's/^/     /'
        sed -n '/^FSD_GEMM_BENCH/,$p' "$OUT/gpt2.log" | head -n 40 | sed 's/^/     /'
    fi

    # ── 4b. GPT-2's trace: the device's times ──
    if run gpt2_trace "$CUDA_BUILD/gpt2/train" --steps 3 --data "$DATA/gpt2.bin" \
            --trace-out "$OUT/gpt2_trace.json"; then
        if trace_check "$OUT/gpt2_trace.json" 3; then
            ok "gpt2: --trace-out has the GPU's times: ops, all-gathers and reduce-scatters, the ops in order"
        else
            bad "gpt2: --trace-out: ops overlap, or a slice is missing or negative" \
                "$OUT/gpt2_trace.json"
        fi
    fi

    # ── 6. offload = cpu: tiny with its shards on the host ──
    run_cuda tiny_offload_gpu FSD_TF32=0 "$CUDA_BUILD/tiny_offload/train" "${tiny[@]}" \
        --log "$OUT/tiny_offload_gpu.jsonl"
    if [ -s "$REF/tiny_offload_cpu.jsonl" ] && [ -s "$OUT/tiny_offload_gpu.jsonl" ]; then
        for spec in "loss 1e-3 1e-5" "grad_norm 1e-2" "comm_bytes 0"; do
            # shellcheck disable=SC2086
            check_compare "tiny, offload = cpu, CPU vs GPU (fp32 products)" "$REF/tiny_offload_cpu.jsonl" \
                "$OUT/tiny_offload_gpu.jsonl" $spec
        done
        local acc p_gpu p_cpu p_dev=0
        acc=$(plan_figure "$REF/tiny_offload.memory" "sharded gradients" 4)
        p_gpu=$(jsonl_max "$OUT/tiny_offload_gpu.jsonl" mem_peak_bytes)
        p_cpu=$(jsonl_max "$REF/tiny_offload_cpu.jsonl" mem_peak_bytes)
        [ -s "$OUT/tiny_gpu_fp32.jsonl" ] && p_dev=$(jsonl_max "$OUT/tiny_gpu_fp32.jsonl" mem_peak_bytes)
        if [ -n "$acc" ] && [ -n "$p_gpu" ] && [ -n "$p_cpu" ] && [ "$p_gpu" = $((p_cpu + acc)) ] &&
                [ "$p_gpu" -lt "$p_dev" ]; then
            ok "tiny, offload = cpu: counted device peak $p_gpu bytes = the CPU build's $p_cpu + accumulators $acc, below $p_dev without offload"
        else
            bad "tiny, offload = cpu: counted device peak ${p_gpu:-?} bytes; want the CPU build's ${p_cpu:-?} + accumulators ${acc:-?}, below $p_dev without offload"
        fi
    fi
    resume_check "tiny, offload = cpu" "$CUDA_BUILD/tiny_offload/train" tiny_offload

    # ── 7. the kernel tests on this GPU ──
    # tests/kernels/test_kernels.c built with nvcc runs every launcher on the
    # device (managed memory) against its float64 references and finite
    # differences: the tiled attention kernels included, which the CPU checks
    # only through the block emulation. Built three times
    # (kernel_test_build): fp32, bf16 act, bf16 act with GPT-2's 64-wide
    # attention tiles.
    local prec
    for prec in fp32 bf16 bf16_hd64; do
        if [ ! -x "$OUT/test_kernels_$prec" ]; then
            bad "nvcc tests/kernels/test_kernels.c for this GPU ($prec)" "$OUT/kernels_build_$prec.log"
        elif timeout 300 "$OUT/test_kernels_$prec" >"$OUT/kernels_$prec.log" 2>&1; then
            ok "kernel tests on the GPU ($prec): $(tail -n 1 "$OUT/kernels_$prec.log")"
        else
            bad "kernel tests on the GPU ($prec, status $?)" "$OUT/kernels_$prec.log"
        fi
    done

    # ── 8. the kernel timings: scalar against 16-byte vector kernels ──
    # Printed for a person to read (docs/cuda.md); speed fails nothing. A
    # CUDA error, or two paths whose outputs must be the same bits and are
    # not, fails.
    if [ ! -x "$OUT/kernel_bench" ]; then
        bad "nvcc tests/gpu/kernel_bench.cu for this GPU" "$OUT/kernel_bench_build.log"
    elif timeout 300 "$OUT/kernel_bench" >"$OUT/kernel_bench.log" 2>&1; then
        ok "kernel timings, scalar against vector kernels (bf16, GPT-2's shapes; $OUT/kernel_bench.log):"
        sed 's/^/     /' "$OUT/kernel_bench.log"
    else
        bad "kernel timings (status $?): a CUDA error, or paths that must agree differ" \
            "$OUT/kernel_bench.log"
    fi

    # ── 5. no step allocated ──
    if grep -l "did not foresee" "$OUT"/*.log >"$OUT/notes.txt" 2>/dev/null; then
        bad "a step allocated an unsharded buffer the start-up replay missed:" "$OUT/notes.txt"
    else
        ok "no step allocated device memory (no pool note in any run)"
    fi
}

# resume_check LABEL EXE TAG: 20 straight steps against 10 steps, a
# checkpoint, and 10 more resumed from it: the last 10 losses to 1e-6 and
# the exported weights byte for byte (bk_to_host / bk_from_host, the pools
# across a restart).
resume_check() {
    local label=$1 exe=$2 tag=$3 msg
    local ck=(--seed 1337 --data "$DATA/tiny.bin" --quiet)
    rm -rf "$OUT/ckpt_$tag" "$OUT/ckpt_${tag}_resumed"
    if run "${tag}_straight" "$exe" "${ck[@]}" --steps 20 --log "$OUT/${tag}_straight.jsonl" \
            --export "$OUT/${tag}_straight.safetensors" &&
        run "${tag}_first10" "$exe" "${ck[@]}" --steps 20 --ckpt-every 10 \
            --ckpt-dir "$OUT/ckpt_$tag" --log "$OUT/${tag}_first.jsonl" &&
        run "${tag}_resumed" "$exe" "${ck[@]}" --steps 20 --resume "$OUT/ckpt_$tag/step_000010" \
            --ckpt-dir "$OUT/ckpt_${tag}_resumed" --log "$OUT/${tag}_resumed.jsonl" \
            --export "$OUT/${tag}_resumed.safetensors"; then
        tail -n 10 "$OUT/${tag}_straight.jsonl" >"$OUT/${tag}_straight_last10.jsonl"
        if msg=$(jsonl_compare "$OUT/${tag}_straight_last10.jsonl" "$OUT/${tag}_resumed.jsonl" loss 1e-6) &&
                cmp -s "$OUT/${tag}_straight.safetensors" "$OUT/${tag}_resumed.safetensors"; then
            ok "$label: 10 steps, checkpoint, resume, 10 steps = 20 straight ($msg; exported weights identical)"
        else
            bad "$label: resume from step 10 differs from 20 straight steps: $msg"
        fi
    fi
}

# cpu_reference FSDPC CPU_BUILD MODEL...: the CPU side of the checks into
# $REF for those of tiny, gpt2, tiny_offload and tiny_bf16 named, from the
# CPU trainers CPU_BUILD/MODEL/train and $DATA: their 50-step runs at the
# seed the GPU runs use, and fsdpc's memory plans and simulation (gpt2 has
# no CPU run here, only those). Its runs count like checks (a failure is a
# FAIL).
cpu_reference() {
    local fsdpc=$1 cpu=$2 m
    shift 2
    local tiny=(--steps 50 --seed 1337 --data "$DATA/tiny.bin" --quiet)
    for m in "$@"; do
        case $m in
        tiny | tiny_bf16 | tiny_offload)
            OUT=$REF run "${m}_cpu" "$cpu/$m/train" "${tiny[@]}" --log "$REF/${m}_cpu.jsonl" ;;
        esac
        case $m in
        gpt2)
            "$fsdpc" examples/gpt2.fsd --dump-memory --world 1 >"$REF/gpt2.memory" 2>&1 ||
                bad "fsdpc examples/gpt2.fsd --dump-memory --world 1" "$REF/gpt2.memory"
            "$fsdpc" examples/gpt2.fsd --sim h200:gpus=1 >"$REF/gpt2.sim" 2>&1 ||
                bad "fsdpc examples/gpt2.fsd --sim h200:gpus=1" "$REF/gpt2.sim" ;;
        tiny_offload)
            "$fsdpc" tests/cuda/tiny_offload.fsd --dump-memory --world 1 >"$REF/tiny_offload.memory" 2>&1 ||
                bad "fsdpc tests/cuda/tiny_offload.fsd --dump-memory --world 1" "$REF/tiny_offload.memory" ;;
        esac
    done
}
