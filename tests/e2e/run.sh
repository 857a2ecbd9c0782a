#!/usr/bin/env bash
# run.sh — end-to-end tests of the emitted trainer: examples compiled by
# fsdpc, built with `make trainer` against the CPU runtime and run on 1-4
# MPI ranks (docs/design.md#how-it-is-tested):
#
#   1. gradient check: the float64 build's --grad-check on tiny, tiny_llama
#      and mlp, on 1 and 2 ranks, and cases where it must fail;
#   2. world-size invariance: the same global batch G on 1-4 ranks gives the
#      same losses, for both accumulation modes and both reshard policies,
#      and with parameters kept gathered across micro-batches
#      (reshard_after_backward = false: the same losses, fewer all-gathers);
#   3. mixed precision: bf16 all-gathers (and reduce-scatters) stay close to
#      fp32 over 50 steps and move exactly half the bytes;
#   4. the plan holds: the bytes every step moves equal fsdpc's schedule,
#      the measured memory peak its memory plan and the trainer's own
#      prediction for its world (mem_plan_bytes), exactly, and the trace of
#      each run its order of collectives;
#   5. bad input: a clear message and exit 1 on every rank, no hang; a
#      memory_budget fitted at world 4 refused at worlds 1 and 2;
#   6. fusion: tiny, tiny_llama and tiny in bf16, compiled with and without
#      fsdpc --no-fuse, train to the same losses and weights, bit for bit.
#   7. small ops on one thread: tiny trains to the same losses and weights,
#      bit for bit, at 1 and 2 threads and built with every OpenMP region
#      parallel (FSD_PAR_MIN_ELEMS = FSD_PAR_MIN_MACS = 0).
#
# Trainers and the .fsd variants (made with sed) go to build/e2e/. Every
# test prints one line; the last line is "N passed, N failed". Ranks share
# the cores (--oversubscribe) with one thread each, so it runs on 2 cores.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
OUT=build/e2e
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=30
. tests/lib.sh

need_tools "e2e tests" mpicc mpirun python3
t0=$(date +%s)
mkdir -p $OUT
build_base
FSDPC=build/fsdpc
CHECK="python3 tests/e2e/check.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# mp W CMD...: CMD on W ranks, with a time limit so a hang is a failure
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }

# ── the .fsd variants and their trainers ──
# variant NAME SRC SED: $OUT/NAME.fsd is SRC through sed program SED
variant() { sed "$3" "$2" >"$OUT/$1.fsd"; }
shard_set() { echo "s/^shard {/shard {\\n  $1/"; }
variant tiny_sharded_keep examples/tiny.fsd "$(shard_set 'reshard_after_forward = false')"
variant tiny_unsharded examples/tiny.fsd "$(shard_set 'accumulate = unsharded')"
variant tiny_unsharded_keep examples/tiny.fsd "$(shard_set 'accumulate = unsharded\n  reshard_after_forward = false')"
variant tiny_unsharded_rab examples/tiny.fsd "$(shard_set 'accumulate = unsharded\n  reshard_after_backward = false')"
variant tiny_bf16 examples/tiny.fsd "$(shard_set 'mixed_precision(param = bf16, reduce = bf16)')"
variant tiny_bf16_fp32 examples/tiny.fsd "$(shard_set 'mixed_precision(param = bf16, reduce = fp32)')"
variant tiny_reduce_bf16 examples/tiny.fsd "$(shard_set 'mixed_precision(param = fp32, reduce = bf16)')"
variant tiny_offload examples/tiny.fsd "$(shard_set 'offload = cpu')"
# a budget tiny meets at world 4 (3,936,512 bytes a rank) and not at 3
# (4,097,344), compiled with --world 4
variant tiny_budget examples/tiny.fsd "$(shard_set 'memory_budget = 3850KiB')"
# a shard group of 2 parameters: too small for 3 ranks
cat >"$OUT/small_group.fsd" <<'EOF'
model small_group {
  const vocab = 256, dim = 2, seq = 16
  emb  = Embedding(vocab, dim)
  norm = RMSNorm(dim)
  head = Linear(dim, vocab)
  forward(idx, targets) {
    return cross_entropy(head(norm(emb(idx))), targets)
  }
}
shard {
  fully_shard norm
  fully_shard root
}
train {
  optimizer = adamw(lr = 1e-3)
}
EOF

# NAME FSD BACKEND: build/e2e/NAME/train; two builds at a time. FSD may
# carry fsdpc options after commas (make trainer passes them on).
TRAINERS=(
    "tiny examples/tiny.fsd cpu"
    "tiny_sharded_keep $OUT/tiny_sharded_keep.fsd cpu"
    "tiny_unsharded $OUT/tiny_unsharded.fsd cpu"
    "tiny_unsharded_keep $OUT/tiny_unsharded_keep.fsd cpu"
    "tiny_unsharded_rab $OUT/tiny_unsharded_rab.fsd cpu"
    "tiny_bf16 $OUT/tiny_bf16.fsd cpu"
    "tiny_bf16_fp32 $OUT/tiny_bf16_fp32.fsd cpu"
    "small_group $OUT/small_group.fsd cpu"
    "tiny_offload $OUT/tiny_offload.fsd cpu"
    "tiny_budget $OUT/tiny_budget.fsd,--world,4 cpu"
    "tiny64 examples/tiny.fsd cpu64"
    "tiny_llama64 examples/tiny_llama.fsd cpu64"
    "mlp64 examples/mlp.fsd cpu64"
    "tiny_reduce_bf16_64 $OUT/tiny_reduce_bf16.fsd cpu64"
    "tiny_llama examples/tiny_llama.fsd cpu"
    "tiny_nofuse examples/tiny.fsd,--no-fuse cpu"
    "tiny_llama_nofuse examples/tiny_llama.fsd,--no-fuse cpu"
    "tiny_bf16_nofuse $OUT/tiny_bf16.fsd,--no-fuse cpu"
)
build_one() {
    $MAKE --no-print-directory -s trainer FSD="${2//,/ }" BACKEND="$3" TRAINER="$OUT/$1" >"$TMP/build.$1" 2>&1
    echo $? >"$TMP/status.$1"
}
# the first alone: it brings fsdpc and the runtime up to date, so the
# others, two at a time, only compile their train.cu
build_one ${TRAINERS[0]}
i=0
for t in "${TRAINERS[@]:1}"; do
    build_one $t &
    i=$((i + 1))
    [ $((i % 2)) = 0 ] && wait
done
wait
built=0
for t in "${TRAINERS[@]}"; do
    set -- $t
    if [ "$(cat "$TMP/status.$1")" != 0 ] || [ ! -x "$OUT/$1/train" ]; then
        bad "build: make trainer FSD=\"${2//,/ }\" BACKEND=$3" "$TMP/build.$1"
    elif grep -q "warning:" "$TMP/build.$1"; then
        bad "build: $1 has warnings" "$TMP/build.$1"
    else
        built=$((built + 1))
    fi
done
[ $built = ${#TRAINERS[@]} ] || done_
ok "build: ${#TRAINERS[@]} trainers (fp32 and float64) without warnings ($(($(date +%s) - t0)) s)"

D=$TMP/data.bin
build/fsdata synth "$D" --tokens 60000 --seed 3 >/dev/null

# ── 1. gradient check, float64 ──
# Step 0's gradient (micro-batch 2, 2 micro-batches) against central
# differences along 3 random directions, bound 1e-6 relative. mlp's ReLU
# has a kink the differences would straddle at its initial weights (biases
# zero, weights of 0.02: many ReLU inputs lie within reach of the step, and
# the check fails, with errors near 1e-4, below), so it is checked from its
# initial weights with fc1's biases set to ±0.5, which keeps every ReLU
# input clear of zero while the check's steps move it by ~1e-6.
$OUT/mlp64/train --steps 0 --export "$TMP/mlp0.st" --quiet >"$TMP/out" 2>&1 &&
    $CHECK setbias "$TMP/mlp0.st" "$TMP/mlp_bias.st" fc1.bias 0.5 >>"$TMP/out" 2>&1 ||
    bad "grad check: mlp's initial weights" "$TMP/out"
for m in tiny64 tiny_llama64 mlp64; do
    extra=()
    [ $m = mlp64 ] && extra=(--init-from "$TMP/mlp_bias.st")
    for w in 1 2; do
        mp $w $OUT/$m/train --data "$D" --micro-batch 2 --grad-accum 2 --grad-check 3 "${extra[@]}" \
            >"$TMP/gc.$m.$w" 2>&1
        st=$?
        if [ $st = 0 ] && res=$($CHECK gradcheck "$TMP/gc.$m.$w" 3); then
            ok "grad check ${m%64} on $w rank(s): $res"
        else bad "grad check ${m%64} on $w rank(s): status $st" "$TMP/gc.$m.$w"; fi
    done
done
# the same G = 8 sequences on 1 rank (4 micro-batches of 2) and on 2 ranks
mp 1 $OUT/tiny64/train --data "$D" --micro-batch 2 --grad-accum 4 --grad-check 3 >"$TMP/gc.tiny.g8" 2>&1
if [ $? = 0 ] && res=$($CHECK gradsame "$TMP/gc.tiny.g8" "$TMP/gc.tiny64.2" 1e-10); then
    ok "grad check: the gradient of G = 8 sequences on 1 rank = on 2 ranks ($res)"
else bad "grad check: 1 rank vs 2 ranks, same G" "$TMP/gc.tiny.g8"; fi
# where it must fail: a gradient rounded to bf16 by the reduce-scatter...
mp 2 $OUT/tiny_reduce_bf16_64/train --data "$D" --micro-batch 2 --grad-accum 2 --grad-check 3 >"$TMP/gc.bf16" 2>&1
st=$?
if [ $st = 1 ] && grep -q "grad check FAILED: [1-9]" "$TMP/gc.bf16"; then
    ok "grad check fails (exit 1) on a gradient rounded to bf16: $(sed -n 's/.*(largest \(.*\))/largest error \1/p' "$TMP/gc.bf16")"
else bad "grad check of a bf16-rounded gradient: status $st, expected 1" "$TMP/gc.bf16"; fi
# ...a step so wide that truncation error dominates...
mp 1 $OUT/tiny64/train --data "$D" --micro-batch 2 --grad-accum 2 --grad-check 2 --grad-check-eps 1e-3 >"$TMP/gc.eps" 2>&1
st=$?
if [ $st = 1 ] && grep -q "grad check FAILED: [1-9]" "$TMP/gc.eps"; then
    ok "grad check fails (exit 1) with ε = 1e-3: $(sed -n 's/.*(largest \(.*\))/largest error \1/p' "$TMP/gc.eps")"
else bad "grad check with ε = 1e-3: status $st, expected 1" "$TMP/gc.eps"; fi
# ...and ReLU's kinks at mlp's initial weights
mp 1 $OUT/mlp64/train --data "$D" --micro-batch 2 --grad-accum 2 --grad-check 2 >"$TMP/gc.relu" 2>&1
st=$?
if [ $st = 1 ] && grep -q "grad check FAILED: [1-9]" "$TMP/gc.relu"; then
    ok "grad check fails (exit 1) across ReLU kinks (mlp, initial weights): $(sed -n 's/.*(largest \(.*\))/largest error \1/p' "$TMP/gc.relu")"
else bad "grad check across ReLU kinks: status $st, expected 1" "$TMP/gc.relu"; fi

# ── 2 and 4. invariance, bytes, memory and order on 1-4 ranks ──
# G = B × grad_accum × W = 12 sequences whatever W; every policy trains the
# same model. Each run is held to fsdpc's plan for the same W, B and
# grad_accum ($OUT/NAME.wW.fsd: the variant with that train section).
BK=("" "6 2" "3 2" "2 2" "1 3")   # by W: micro-batch, grad_accum
for v in tiny tiny_sharded_keep tiny_unsharded tiny_unsharded_keep tiny_unsharded_rab tiny_offload; do
    src=$OUT/$v.fsd
    [ $v = tiny ] && src=examples/tiny.fsd
    for w in 1 2 3 4; do
        set -- ${BK[$w]}
        b=$1 k=$2 run=$v.w$w
        sed "s/micro_batch *= *[0-9]*/micro_batch = $b/; s/grad_accum *= *[0-9]*/grad_accum = $k/" "$src" >"$OUT/$run.fsd"
        $FSDPC "$OUT/$run.fsd" --world $w --dump-schedule >"$TMP/$run.sched" 2>&1 &&
            $FSDPC "$OUT/$run.fsd" --world $w --dump-schedule=json >"$TMP/$run.json" 2>&1 &&
            $FSDPC "$OUT/$run.fsd" --world $w --dump-memory >"$TMP/$run.mem" 2>&1 ||
            { bad "$run: fsdpc dumps" "$TMP/$run.sched"; continue; }
        mp $w $OUT/$v/train --data "$D" --steps 10 --micro-batch $b --grad-accum $k \
            --log "$TMP/$run.log" --trace-out "$TMP/$run.trace" --quiet >"$TMP/$run.out" 2>&1
        st=$?
        if [ $st != 0 ]; then bad "$v on $w rank(s): status $st" "$TMP/$run.out"; continue; fi
        if [ $w != 1 ] || [ $v != tiny ]; then
            # every run against tiny's (sharded, reshard after forward) on 1 rank
            if res=$($CHECK losses "$TMP/tiny.w1.log" "$TMP/$run.log" 1e-5); then
                ok "invariance $v, $w rank(s) (B $b, grad_accum $k) = tiny on 1 rank: $res"
            else bad "invariance $v, $w rank(s) vs tiny on 1 rank: $res"; fi
        fi
        if res=$($CHECK bytes "$TMP/$run.log" "$TMP/$run.sched" "$TMP/$run.json"); then
            ok "plan bytes $v, $w rank(s): every step $res, as fsdpc --dump-schedule says"
        else bad "plan bytes $v, $w rank(s): $res" "$TMP/$run.sched"; fi
        if res=$($CHECK memory "$TMP/$run.log" "$TMP/$run.mem"); then
            ok "plan memory $v, $w rank(s): $res"
        else bad "plan memory $v, $w rank(s): $res" "$TMP/$run.mem"; fi
        if res=$($CHECK trace "$TMP/$run.trace" "$TMP/$run.json" $w 10); then
            ok "plan order $v, $w rank(s): $res"
        else bad "plan order $v, $w rank(s): $res"; fi
    done
done

# reshard_after_backward = false against true (both accumulating unsharded,
# the same W, B and grad_accum): the same arithmetic in the same order, so
# the same losses bit for bit, and fewer bytes all-gathered every step (the
# plan's, checked above), since later micro-batches find groups gathered
bytes_of() { python3 -c "import json,sys; s=json.loads(open(sys.argv[1]).readline()); print(s['gather_bytes'], s['reduce_bytes'])" "$1" 2>/dev/null; }
for w in 1 2 3 4; do
    if res=$($CHECK losses "$TMP/tiny_unsharded.w$w.log" "$TMP/tiny_unsharded_rab.w$w.log" 0); then
        ok "reshard_after_backward = false, $w rank(s): the same losses as true ($res)"
    else bad "reshard_after_backward = false, $w rank(s): losses differ from true's: $res"; fi
    read -r gt _ <<<"$(bytes_of "$TMP/tiny_unsharded.w$w.log")"
    read -r gf _ <<<"$(bytes_of "$TMP/tiny_unsharded_rab.w$w.log")"
    if [ $w = 1 ] && [ "${gf:-x}" = 0 ] && [ "${gt:-x}" = 0 ]; then
        ok "reshard_after_backward = false, 1 rank: no all-gather bytes either way"
    elif [ -n "${gf:-}" ] && [ -n "${gt:-}" ] && [ "$gf" -lt "$gt" ]; then
        ok "reshard_after_backward = false, $w rank(s): all-gathers $gf bytes a step, fewer than true's $gt"
    else bad "reshard_after_backward = false, $w rank(s): all-gathers ${gf:-?} bytes a step, true ${gt:-?}"; fi
done

# offload = cpu on the CPU backend: the same numbers as without it, bit for
# bit (every buffer is host memory already), and a peak without the
# resident shards, the plan's offload figure (checked above)
for w in 1 2; do
    if res=$($CHECK losses "$TMP/tiny.w$w.log" "$TMP/tiny_offload.w$w.log" 0); then
        ok "offload = cpu on the CPU backend, $w rank(s): the same losses as tiny ($res)"
    else bad "offload = cpu on the CPU backend, $w rank(s): losses differ from tiny's: $res"; fi
done

# ── 3. mixed precision ──
# tiny over 50 steps on 2 ranks (B 2, one micro-batch) in fp32 and under
# mixed_precision(param = bf16): bf16 all-gathers and bf16 compute, with
# reduce-scatters in bf16, then fp32. Measured with bf16 compute (fsdata
# synth --seed 3): the largest relative loss difference from fp32 over the
# 50 steps is 1.4e-4 with reduce = bf16 and 1.2e-4 with reduce = fp32 (the
# loss falls from 5.58 to 4.62), no more than with bf16 on the wire alone
# (1.2e-4 and 1.3e-4): the loss, a mean over 128 targets, averages the
# roundings out. The bound, 1e-3, leaves a margin of 7; and the runs must
# differ by 1e-6 at least, or bf16 was not used. That the arithmetic is
# bf16's, as FSDP2's, is the oracle's check (tests/oracle, prec=bf16).
for v in tiny tiny_bf16 tiny_bf16_fp32; do
    mp 2 $OUT/$v/train --data "$D" --steps 50 --micro-batch 2 --grad-accum 1 --log "$TMP/mp.$v.log" --quiet >"$TMP/mp.$v.out" 2>&1 ||
        bad "mixed precision: $v on 2 ranks" "$TMP/mp.$v.out"
done
read -r g32 r32 <<<"$(bytes_of "$TMP/mp.tiny.log")"
for v in tiny_bf16 tiny_bf16_fp32; do
    if res=$($CHECK losses "$TMP/mp.tiny.log" "$TMP/mp.$v.log" 1e-3 1e-6); then
        ok "mixed precision $v vs fp32 over 50 steps: $res"
    else bad "mixed precision $v vs fp32: $res"; fi
    read -r g16 r16 <<<"$(bytes_of "$TMP/mp.$v.log")"
    want_r=$r32
    [ $v = tiny_bf16 ] && want_r=$((r32 / 2))
    if [ -n "${g16:-}" ] && [ -n "${g32:-}" ] && [ $((g16 * 2)) = "$g32" ] && [ "$r16" = "$want_r" ] && [ "$g32" -gt 0 ]; then
        ok "mixed precision $v: all-gather $g16 bytes a step, half of fp32's $g32; reduce-scatter $r16 (fp32 $r32)"
    else bad "mixed precision $v bytes: gather ${g16:-?} vs fp32 ${g32:-?}, reduce ${r16:-?} vs ${want_r:-?}"; fi
done
# and every run's bytes and memory peak are the plan's for its dtypes (bf16
# activations and unsharded gradients, the fp32 reduce buffer)
for v in tiny tiny_bf16 tiny_bf16_fp32; do
    src=$OUT/$v.fsd
    [ $v = tiny ] && src=examples/tiny.fsd
    sed "s/micro_batch *= *[0-9]*/micro_batch = 2/; s/grad_accum *= *[0-9]*/grad_accum = 1/" "$src" >"$OUT/$v.mp.fsd"
    $FSDPC "$OUT/$v.mp.fsd" --world 2 --dump-schedule >"$TMP/$v.mp.sched" 2>&1
    $FSDPC "$OUT/$v.mp.fsd" --world 2 --dump-schedule=json >"$TMP/$v.mp.json" 2>&1
    $FSDPC "$OUT/$v.mp.fsd" --world 2 --dump-memory >"$TMP/$v.mp.mem" 2>&1
    if res=$($CHECK bytes "$TMP/mp.$v.log" "$TMP/$v.mp.sched" "$TMP/$v.mp.json"); then
        ok "plan bytes $v, 2 ranks: every step $res, as fsdpc --dump-schedule says"
    else bad "plan bytes $v, 2 ranks: $res" "$TMP/$v.mp.sched"; fi
    if res=$($CHECK memory "$TMP/mp.$v.log" "$TMP/$v.mp.mem"); then
        ok "plan memory $v, 2 ranks: $res"
    else bad "plan memory $v, 2 ranks: $res" "$TMP/$v.mp.mem"; fi
done

# ── 5. bad input: a message and exit 1 on every rank, no hang ──
# Each rank runs under a shell that reports its own exit status, and mpirun
# is told not to abort the others when one exits non-zero: so every rank
# must print the message and exit 1 by itself, within the time limit.
# err NAME TRAINER W PATTERN ARGS...
err() {
    local name=$1 train=$2 w=$3 pat=$4
    shift 4
    timeout 60 "${MPIRUN[@]}" --mca orte_abort_on_non_zero_status 0 -np "$w" \
        sh -c '"$0" "$@"; echo "rank exit status $?" >&2' "$train" "$@" >"$TMP/out" 2>"$TMP/err"
    local st=$? n e
    n=$(grep -c -- "^train: $pat" "$TMP/err")
    e=$(grep -c "^rank exit status 1$" "$TMP/err")
    if [ $st = 124 ]; then bad "bad input: $name: hung (killed after 60 s)" "$TMP/err"
    elif [ "$e" = "$w" ] && [ "$n" = "$w" ]; then ok "bad input: $name: message and exit 1 on all $w ranks"
    else bad "bad input: $name: message on $n, exit 1 on $e of $w ranks" "$TMP/err"; fi
}
build/fsdata synth "$TMP/v300.bin" --tokens 5000 --vocab 300 >/dev/null
T=$OUT/tiny/train
err "missing data file" $T 2 "cannot open data file $TMP/nope.bin: No such file or directory" --data "$TMP/nope.bin"
err "token >= vocab" $T 3 "data file $TMP/v300.bin: token [0-9]* at position [0-9]* is not below the model's vocabulary size 256" --data "$TMP/v300.bin"
err "unknown flag" $T 2 "unknown flag --frobnicate (see --help)" --data "$D" --frobnicate
# small_group's norm group holds 2 parameters in 16 elements (parameters
# start at multiples of 16): 3 or 4 ranks are more than its parameters, and
# train (below); 17 are more than its elements, and are refused
err "world larger than a group" $OUT/small_group/train 17 "world size 17 is larger than shard group norm's 16 elements (its parameters, aligned): run on at most 16 ranks" --data "$D"
err "--grad-check in the fp32 build" $T 2 "--grad-check needs the float64 build (make trainer BACKEND=cpu64)" --data "$D" --grad-check 2
err "--grad-check-eps 0" $OUT/tiny64/train 2 "--grad-check-eps: 0 is not a step above 0 and at most 1" --data "$D" --grad-check 2 --grad-check-eps 0
# a memory_budget is the plan's at the world fsdpc fitted it (--world 4):
# at another the trainer predicts its own peak and refuses to start above
# the budget, on every rank, with the numbers and what would fit
B4=$OUT/tiny_budget/train
err "memory_budget at world 1" $B4 1 "at world 1 each rank would peak at 5383424 bytes (5.13 MiB: .*), above this program's memory_budget of 3942400 bytes (3.76 MiB), which fsdpc fitted at world 4 (peak 3936512 bytes there, 3.75 MiB); run on 4 ranks (the fewest above 1 where it fits), or with --micro-batch 1, or plan for this world with fsdpc --world 1 " --data "$D"
err "memory_budget at world 2" $B4 2 "at world 2 each rank would peak at 4418816 bytes .*; run on 4 ranks (the fewest above 2 where it fits), or with --micro-batch 3 or less, or plan for this world with fsdpc --world 2 " --data "$D"
mp 4 $B4 --data "$D" --steps 2 --log "$TMP/budget4.log" >"$TMP/budget4.out" 2>&1
st=$?
$FSDPC "$OUT/tiny_budget.fsd" --world 4 --dump-memory >"$TMP/budget4.mem" 2>&1
if [ $st != 0 ]; then bad "memory_budget at world 4, where fsdpc fitted it: status $st" "$TMP/budget4.out"
elif ! grep -q "^memory: 3936512 bytes per rank at world 4 (.*); memory_budget 3942400 (3.76 MiB), fitted by fsdpc at world 4" "$TMP/budget4.out"; then
    bad "memory_budget at world 4: no start-up line with the peak and the budget" "$TMP/budget4.out"
elif res=$($CHECK memory "$TMP/budget4.log" "$TMP/budget4.mem"); then
    ok "memory_budget at world 4, where fsdpc fitted it: the run starts and says so; $res"
else bad "memory_budget at world 4: $res" "$TMP/budget4.mem"; fi
# a world larger than a group's parameters but not its elements: ranks 1-3
# hold only alignment padding of norm, and the model trains as on 1 rank
mp 1 $OUT/small_group/train --data "$D" --steps 5 --micro-batch 4 --log "$TMP/sg.1.log" --quiet >"$TMP/out" 2>&1 &&
    mp 4 $OUT/small_group/train --data "$D" --steps 5 --micro-batch 1 --log "$TMP/sg.4.log" --quiet >>"$TMP/out" 2>&1
st=$?
if [ $st = 0 ] && res=$($CHECK losses "$TMP/sg.1.log" "$TMP/sg.4.log" 1e-5); then
    ok "small_group on 4 ranks (more than norm's 2 parameters) trains as on 1 rank: $res"
else bad "small_group on 4 ranks vs 1: status $st ${res:-}" "$TMP/out"; fi

# same_training WHAT A B: runs A and B (logs A.log, B.log, exported weights
# A.st, B.st) trained alike: the same losses and weights, bit for bit
same_training() {
    local res
    if ! res=$($CHECK losses "$2.log" "$3.log" 0); then
        bad "$1: losses differ: $res"
    elif ! cmp -s "$2.st" "$3.st"; then
        bad "$1: exported weights differ"
    else ok "$1: the same losses ($res) and weights, bit for bit"; fi
}

# ── 6. fusion: the same training bit for bit ──
# fsdpc fuses add + norm and matmul_bias + gelu (compiler/fuse.c); on the
# CPU the fused norm normalises the rounded sum an unfused one reads back,
# and the product leaves gelu to the same kernel, so a fused trainer must
# train exactly as one built from fsdpc --no-fuse: 5 steps on 2 ranks, the
# same losses and the same exported weights, in fp32 and in bf16.
for v in tiny tiny_llama tiny_bf16; do
    # a call of the fused kernel: one op line, OP("label", add_..._fwd(...))
    fused='^    OP("[^"]*", add_[a-z]*norm_fwd('
    if ! grep -q "$fused" "$OUT/$v/train.cu" || grep -q "$fused" "$OUT/${v}_nofuse/train.cu"; then
        bad "fusion $v: the fused train.cu has no fused norm, or the --no-fuse one has"
        continue
    fi
    for t in $v ${v}_nofuse; do
        mp 2 $OUT/$t/train --data "$D" --steps 5 --micro-batch 2 --grad-accum 2 --log "$TMP/fuse.$t.log" \
            --export "$TMP/fuse.$t.st" --quiet >"$TMP/fuse.$t.out" 2>&1 || bad "fusion: $t on 2 ranks" "$TMP/fuse.$t.out"
    done
    same_training "fusion $v: fused and --no-fuse trainers" "$TMP/fuse.${v}_nofuse" "$TMP/fuse.$v"
done

# ── 7. small ops on one thread: the same training bit for bit ──
# Loops under FSD_PAR_MIN_ELEMS elements (FSD_PAR_MIN_MACS for attention)
# run on the calling thread (runtime/fsdrt.h); they are static schedules
# over independent rows and elements, so where they run must change no bit.
# At micro-batch 8 tiny's elementwise ops (32K-131K elements) and its
# attention (2.1M multiply-adds) are under the defaults and run on one
# thread, its larger products split (runtime/cpu.c); the _allpar build
# (thresholds 0) runs every region on both threads.
if $MAKE --no-print-directory -s trainer FSD=examples/tiny.fsd TRAINER=$OUT/tiny_allpar \
        TRAINER_FLAGS_cpu="-DFSD_PAR_MIN_ELEMS=0 -DFSD_PAR_MIN_MACS=0" >"$TMP/build.allpar" 2>&1; then
    for run in tiny.1 tiny.2 tiny_allpar.2; do
        OMP_NUM_THREADS=${run##*.} mp 1 $OUT/${run%.*}/train --data "$D" --steps 5 --micro-batch 8 \
            --log "$TMP/par.$run.log" --export "$TMP/par.$run.st" --quiet >"$TMP/par.$run.out" 2>&1 ||
            bad "small ops: ${run%.*} at ${run##*.} threads" "$TMP/par.$run.out"
    done
    for run in tiny.2 tiny_allpar.2; do
        same_training "small ops: ${run%.*} at 2 threads and tiny at 1 thread" "$TMP/par.tiny.1" "$TMP/par.$run"
    done
else bad "small ops: make trainer with FSD_PAR_MIN_ELEMS=0 FSD_PAR_MIN_MACS=0" "$TMP/build.allpar"; fi

echo "     (e2e took $(($(date +%s) - t0)) s)" >&2
done_
