#!/usr/bin/env bash
# run.sh — PyTorch as the reference (design §8): the CPU trainers of
# examples/tiny.fsd, tiny_llama.fsd and mlp.fsd, and of
# tests/oracle/tiny_variants.fsd (bias-free LayerNorms, q, k and v biases,
# qk_norm, scaled initialisation), train 20 steps on 1, 2 or 3 MPI ranks,
# and oracle.py trains the same model in PyTorch from the same weights on
# the same batches; the losses must agree step by step within 1e-4
# relative (fp32), the gradient norms within 1e-3. Each model's initial
# weights are first held to the initialisation formula (oracle.py init),
# every parameter at its own std.
#
# Two starts per model: the trainer's own initialisation (exported with
# `--steps 0 --export`, loaded by PyTorch), and weights far from it that
# oracle.py writes and both sides load (`--init-from`), where attention is
# sharp, biases and norm weights matter and clipping fires. The far cases
# of tiny and mlp run on 3 ranks (uneven shards) over a short token file,
# so sequence indices wrap around. Last, the float64 build (BACKEND=cpu64)
# from the far weights against float64 PyTorch, within 1e-8 over 10 steps:
# fp32's 1e-4 cannot see a wrong constant (GELU's variant, a norm's eps),
# this can.
#
# bf16 compute: tiny and tiny_llama under mixed_precision(param = bf16,
# reduce = fp32), from the far weights on 2 ranks, against oracle.py's bf16
# model of the same policy (prec=bf16; its bars and their measurements are
# in oracle.py): 20 steps of training, and 10 steps at the starting weights
# (--lr 1e-30 moves no fp32 weight; the 10 steps are cosine's warmup, below
# that rate), each a fresh draw of the bf16 forward and backward, whose mean
# error is what tells bf16 from fp32. That it does is checked too: tiny's
# fp32 trainer, run the same way, must fail the bf16 reference.
#
# Needs MPI and a Python with torch and numpy (Debian's python3-torch and
# python3-numpy, for /usr/bin/python3; tools/setup.sh installs them as
# root); without them it says so and skips. Every case prints one line; the
# last line is "N passed, N failed". About 60 s on 2 cores before
# tiny_variants and the initialisation checks, which add about 20 s of CPU
# time (80 s in all against 60, measured side by side on a loaded machine).
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
FSDPC=${FSDPC:-build/fsdpc}
OUT=build/oracle
SHOW_LINES=30
. tests/lib.sh

need_torch oracle
need_tools "oracle" mpicc mpirun

rm -rf "$OUT"
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# mp W CMD...: CMD on W ranks, with a time limit so a hang is a failure
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }

if ! $MAKE --no-print-directory -s build/fsdata >"$OUT/build.txt" 2>&1; then
    bad "build: make build/fsdata" "$OUT/build.txt"
    done_
fi
LONG=$OUT/long.bin     # 200,000 tokens: no sequence repeats in 20 steps
SHORT=$OUT/short.bin   # 10,000 tokens: 3 ranks wrap around it
build/fsdata synth "$LONG" --tokens 200000 --seed 11 >/dev/null
build/fsdata synth "$SHORT" --tokens 10000 --seed 12 >/dev/null

# case MODEL cpu|cpu64|bf16 WORLD own|far DATA STEPS [LR]: one trainer run
# (with --lr LR when given); appends to CASES what oracle.py needs to hold it
# to PyTorch. The trainer is $OUT/MODEL/KIND/train; bf16 is the CPU trainer
# of $OUT/MODEL/bf16.fsd.
CASES=()
case_() {
    local m=$1 kind=$2 w=$3 start=$4 data=$5 steps=$6 lr=${7:-} d=$OUT/$1
    local run=$d/$kind-$start-w$w${lr:+-lr$lr} init=$d/$start.safetensors from=() rate=()
    local what="$m, $w rank$([ $w = 1 ] || echo s), $([ $start = far ] && echo "far init" || echo "its own init")"
    local train=$d/$kind/train model=$d/model.txt prec=f32
    case $kind in
    cpu64) what="$what, float64" prec=f64 ;;
    bf16)  what="$what, bf16" prec=bf16 model=$d/bf16.txt ;;
    esac
    [ "$start" = far ] && from=(--init-from "$init")
    [ -n "$lr" ] && what="$what, at its starting weights (--lr $lr)" rate=(--lr "$lr")
    if ! mp "$w" "$train" --data "$data" --steps "$steps" --log "$run.log" --quiet \
            "${from[@]}" "${rate[@]}" >"$run.out" 2>&1; then
        bad "$what: the trainer failed" "$run.out"
        return
    fi
    CASES+=(--case "label=$what" "model=$model" "init=$init" "log=$run.log" "world=$w"
            "data=$data" "steps=$steps" "prec=$prec" ${lr:+"lr=$lr"})
}

# bf16_cases MODEL: MODEL's trainer under mixed_precision(param = bf16,
# reduce = fp32), built from a copy of its .fsd, trained from the far
# weights and run at them
bf16_cases() {
    local m=$1 d=$OUT/$1
    sed "s/^shard {/shard {\n  mixed_precision(param = bf16, reduce = fp32)/" examples/$m.fsd >"$d/bf16.fsd"
    if ! $MAKE --no-print-directory -s trainer FSD="$d/bf16.fsd" BACKEND=cpu TRAINER="$d/bf16" \
            >"$d/build-bf16.txt" 2>&1; then
        bad "$m: make trainer FSD=$d/bf16.fsd BACKEND=cpu" "$d/build-bf16.txt"
        return
    fi
    "$FSDPC" "$d/bf16.fsd" --dump-model >"$d/bf16.txt"
    case_ $m bf16 2 far "$LONG" 20
    case_ $m bf16 2 far "$LONG" 10 1e-30
}

for f in examples/tiny.fsd examples/tiny_llama.fsd examples/mlp.fsd tests/oracle/tiny_variants.fsd; do
    m=$(basename "$f" .fsd)
    d=$OUT/$m
    mkdir -p "$d"
    # the trainers go to $d/cpu and $d/cpu64, this suite's own: tests/all.sh
    # runs suites side by side, and another one's `make trainer` of the same
    # model (build/MODEL/cpu) would relink the binary under this one's runs
    if ! { $MAKE --no-print-directory -s trainer FSD=$f BACKEND=cpu TRAINER="$d/cpu" &&
           $MAKE --no-print-directory -s trainer FSD=$f BACKEND=cpu64 TRAINER="$d/cpu64"; } >"$d/build.txt" 2>&1; then
        bad "$m: make trainer FSD=$f BACKEND=cpu (and cpu64)" "$d/build.txt"
        continue
    fi
    "$FSDPC" $f --dump-model >"$d/model.txt"
    # the trainer's initial weights, as PyTorch will load them
    if ! mp 2 "$d/cpu/train" --steps 0 --export "$d/own.safetensors" --quiet >"$d/export.out" 2>&1; then
        bad "$m: --steps 0 --export" "$d/export.out"
        continue
    fi
    if res=$("$PY" tests/oracle/oracle.py init "$d/model.txt" "$d/own.safetensors" 2>&1); then
        ok "$m: the exported initial weights are the initialisation formula's: $res"
    else bad "$m: the exported initial weights against the initialisation formula: $res"; fi
    "$PY" tests/oracle/oracle.py weights "$d/model.txt" "$d/far.safetensors"
    case $m in
    tiny_variants) case_ $m cpu 1 own "$LONG" 20 ;;   # 1 and 2 ranks
    *)             case_ $m cpu 2 own "$LONG" 20 ;;
    esac
    case $m in
    tiny_llama | tiny_variants) case_ $m cpu 2 far "$LONG" 20 ;;
    *)                          case_ $m cpu 3 far "$SHORT" 20 ;;
    esac
    case_ $m cpu64 2 far "$LONG" 10
    case $m in tiny | tiny_llama) bf16_cases $m ;; esac
done

if [ ${#CASES[@]} -gt 0 ]; then
    "$PY" tests/oracle/oracle.py compare "${CASES[@]}" >"$OUT/oracle.txt" 2>&1
    st=$?
    while IFS= read -r line; do
        case "$line" in
        "ok   "*) ok "${line#ok   }" ;;
        "FAIL "*) fail=$((fail + 1)); echo "$line" ;;
        *" passed, "*" failed") ;;
        *) echo "$line" ;;
        esac
    done <"$OUT/oracle.txt"
    grep -q " passed, " "$OUT/oracle.txt" || bad "oracle.py ended without a summary (status $st)" "$OUT/oracle.txt"
fi

# the bf16 reference tells bf16 from fp32: tiny's fp32 trainer at its
# starting weights, as the bf16 case above, must fail it
d=$OUT/tiny
if [ -f "$d/bf16.txt" ] && mp 2 "$d/cpu/train" --data "$LONG" --steps 10 --lr 1e-30 \
        --init-from "$d/far.safetensors" --log "$d/fp32-as-bf16.log" --quiet >"$d/fp32-as-bf16.out" 2>&1; then
    "$PY" tests/oracle/oracle.py compare --case "label=fp32" "model=$d/bf16.txt" \
        "init=$d/far.safetensors" "log=$d/fp32-as-bf16.log" world=2 "data=$LONG" steps=10 \
        prec=bf16 lr=1e-30 >"$d/fp32-as-bf16.txt" 2>&1
    st=$?
    if [ $st = 1 ] && res=$(grep -m1 "^FAIL fp32: 10 steps, " "$d/fp32-as-bf16.txt"); then
        ok "tiny's fp32 trainer fails the bf16 reference: ${res#FAIL fp32: }"
    else bad "tiny's fp32 trainer against the bf16 reference: status $st, expected a failure" "$d/fp32-as-bf16.txt"; fi
else bad "tiny's fp32 trainer at its starting weights (or tiny's bf16 case missing)" "$d/fp32-as-bf16.out"; fi
done_
