#!/usr/bin/env bash
# run.sh — the CPU runtime's tests: a hand-written trainer (trainer.c) on
# 1 to 4 MPI ranks, checked for world-size invariance, counters, the
# initialisation formula, safetensors round trips, the data order, every
# user error, the schedule bugs the collectives refuse, traces, and built
# with FSD_ACT_BF16 for bf16 compute; unit tests of the arena placement,
# the 16-bit conversions and the BLAS products (fsdrt_gemm,
# fsdrt_gemm_bias, fp32 and bf16); fsdata.
#
# It builds what it needs (`make runtime-tests`). Every test prints one
# line; the last line is "N passed, N failed". Ranks share the cores
# (--oversubscribe) with one OpenMP thread each, so it runs on 2 cores.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=30
. tests/lib.sh

need_tools "runtime tests" mpicc mpirun python3
if ! $MAKE --no-print-directory -s runtime-tests >"$TMP/build" 2>&1; then
    bad "build: make runtime-tests" "$TMP/build"
    done_
fi
if grep -q "warning:" "$TMP/build"; then bad "build: warnings" "$TMP/build"; else ok "build: runtime, trainers, fsdata without warnings"; fi

FSDATA=build/fsdata
TRAIN=build/runtime/trainer
TRAIN64=build/runtime/trainer64
CHECK="python3 tests/runtime/check.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

# mp W CMD...: CMD on W ranks, with a time limit so a hang is a failure
mp() { local w=$1; shift; timeout 60 "${MPIRUN[@]}" -np "$w" "$@"; }

# ── unit tests: the arena placement, 16-bit float conversions, the products ──
for unit in test_arena test_half test_gemm; do
    build/runtime/$unit >"$TMP/unit" 2>&1
    st=$?
    relay "$TMP/unit"
    grep -q " passed, 0 failed$" "$TMP/unit" && [ $st = 0 ] || bad "$unit: status $st" "$TMP/unit"
done

# ── the BLAS libraries: each one here, through runtime/blas.c, against a
# float64 reference (tools/blasbench.c), called from inside an OpenMP loop
# too (so on 2 threads); the library this runtime was built with among them ──
OMP_NUM_THREADS=2 tools/blas.sh check >"$TMP/blas" 2>&1
st=$?
relay "$TMP/blas"
built=$(cut -d' ' -f1 build/runtime/blas.stamp 2>/dev/null)
if [ $st = 0 ] && grep -q "^ok blas $built (" "$TMP/blas"; then
    ok "blas: the runtime's library ($built, build/runtime/blas.stamp) checked"
else bad "blas: tools/blas.sh check (status $st; the runtime's library: '$built')" "$TMP/blas"; fi
if $MAKE -s --no-print-directory runtime BLAS=fastest >"$TMP/blasbad" 2>&1; then
    bad "blas: make runtime BLAS=fastest was accepted" "$TMP/blasbad"
elif grep -q "BLAS=fastest is not one of openblas, dnnl, mkl" "$TMP/blasbad"; then
    ok "blas: make runtime BLAS=fastest refused, naming the choices"
else bad "blas: make runtime BLAS=fastest: message" "$TMP/blasbad"; fi

# ── fsdata ──
D=$TMP/data.bin
$FSDATA synth "$D" --tokens 20000 --vocab 64 --seed 7 >/dev/null
$FSDATA synth "$TMP/again.bin" --tokens 20000 --vocab 64 --seed 7 >/dev/null
$FSDATA synth "$TMP/other.bin" --tokens 20000 --vocab 64 --seed 8 >/dev/null
if cmp -s "$D" "$TMP/again.bin" && ! cmp -s "$D" "$TMP/other.bin"; then
    ok "fsdata synth: deterministic for a seed, different for another"
else bad "fsdata synth: determinism"; fi
$FSDATA info "$D" >"$TMP/info"
if grep -q "magic    20240520" "$TMP/info" && grep -q "version  1 (uint16" "$TMP/info" &&
    grep -q "tokens   20000" "$TMP/info" && grep -q "max id   63" "$TMP/info"; then
    ok "fsdata info: magic, version, token count, max id"
else bad "fsdata info" "$TMP/info"; fi
printf 'hello, fsdpc\n' >"$TMP/hello.txt"
$FSDATA text "$TMP/hello.txt" "$TMP/hello.bin" >/dev/null
$FSDATA info "$TMP/hello.bin" >"$TMP/info"
got=$(python3 -c "import sys; sys.path.insert(0, 'tests/runtime'); import check; print(bytes(check.read_tokens('$TMP/hello.bin')).decode(), end='')")
if [ "$got" = "hello, fsdpc" ] && grep -q "tokens   13" "$TMP/info" && grep -q "max id   115" "$TMP/info"; then
    ok "fsdata text: one token per byte"
else bad "fsdata text: got '$got'" "$TMP/info"; fi
$FSDATA synth "$TMP/big.bin" --tokens 5000 --vocab 70000 >/dev/null
$FSDATA info "$TMP/big.bin" >"$TMP/info"
if grep -q "version  2 (uint32" "$TMP/info"; then ok "fsdata synth: vocab over 65,535 writes version 2"; else bad "fsdata version 2" "$TMP/info"; fi
# the synthetic corpus is learnable: its bigram entropy is far below ln 64
python3 - "$D" >"$TMP/ent" <<'EOF'
import math, sys, collections
sys.path.insert(0, 'tests/runtime'); import check
t = check.read_tokens(sys.argv[1])
pair = collections.Counter(zip(t, t[1:])); first = collections.Counter(t[:-1])
h = -sum(c / (len(t) - 1) * math.log(c / first[a]) for (a, b), c in pair.items())
print("%.3f" % h); sys.exit(0 if h < 0.6 * math.log(64) else 1)
EOF
if [ $? = 0 ]; then ok "fsdata synth: bigram entropy $(cat "$TMP/ent") nats, below ln 64 = 4.159"; else bad "fsdata synth entropy" "$TMP/ent"; fi
fsdata_err() { # NAME PATTERN ARGS...
    local name=$1 pat=$2
    shift 2
    $FSDATA "$@" >"$TMP/out" 2>&1
    local st=$?
    if [ $st = 1 ] && grep -q -- "$pat" "$TMP/out"; then ok "fsdata error: $name"; else bad "fsdata error: $name (status $st)" "$TMP/out"; fi
}
fsdata_err "missing file" "fsdata: cannot read $TMP/nope.bin: No such file" info "$TMP/nope.bin"
fsdata_err "not a token file" "fsdata: $TMP/hello.txt: too short for the 1024-byte header" info "$TMP/hello.txt"
fsdata_err "synth without --tokens" "synth needs --tokens N" synth "$TMP/x.bin"
fsdata_err "unknown command" "unknown command 'frob'" frob

# ── world-size invariance: the same G = B·grad_accum·W on 1, 2, 3, 4 ranks ──
# B = 12/W with 2 micro-batches: G = 24 sequences per step whatever W.
t0=$(date +%s)
for mode in sharded unsharded; do
    [ $mode = unsharded ] && export FSD_TEST_UNSHARDED=1 || unset FSD_TEST_UNSHARDED
    for w in 1 2 3 4; do
        if [ $w = 1 ]; then   # one process without mpirun: MPI's singleton start
            $TRAIN --data "$D" --micro-batch 12 --log "$TMP/$mode.$w.json" --export "$TMP/$mode.$w.st" --quiet >"$TMP/$mode.$w.out" 2>&1
        else
            mp $w $TRAIN --data "$D" --micro-batch $((12 / w)) --log "$TMP/$mode.$w.json" --export "$TMP/$mode.$w.st" --quiet >"$TMP/$mode.$w.out" 2>&1
        fi
        st=$?
        if [ $st != 0 ]; then bad "train $mode on $w ranks: status $st (2: counters differ from their formulas)" "$TMP/$mode.$w.out"; continue; fi
        [ $w = 1 ] && continue
        if $CHECK logs "$TMP/$mode.1.json" "$TMP/$mode.$w.json" 1e-5 >"$TMP/cmp" &&
            $CHECK weights "$TMP/$mode.1.st" "$TMP/$mode.$w.st" 1e-5 >>"$TMP/cmp"; then
            ok "invariance ($mode accumulation): $w ranks = 1 rank, loss and weights over 10 steps (1e-5)"
        else bad "invariance ($mode): $w ranks vs 1" "$TMP/cmp"; fi
    done
done
unset FSD_TEST_UNSHARDED
if $CHECK logs "$TMP/sharded.3.json" "$TMP/unsharded.3.json" 1e-5 >"$TMP/cmp" &&
    $CHECK weights "$TMP/sharded.3.st" "$TMP/unsharded.3.st" 1e-5 >>"$TMP/cmp"; then
    ok "sharded and unsharded accumulation train the same model"
else bad "sharded vs unsharded accumulation" "$TMP/cmp"; fi
if grep -q "counters" "$TMP/sharded.3.out" && grep -q "counters" "$TMP/unsharded.2.out"; then
    ok "counters equal their formulas on every rank (gather, reduce, alloc, peak; both modes, 1-4 ranks)"
else bad "counters line missing" "$TMP/sharded.3.out"; fi
$CHECK lr "$TMP/sharded.2.json" 1e-2 3 1e-3 10 >"$TMP/cmp" && ok "learning rate follows cosine(warmup 3, min_lr 1e-3)" || bad "lr schedule" "$TMP/cmp"

# the log's comm_bytes is each step's share of the counters
python3 - "$TMP/sharded.3.json" "$TMP/sharded.3.out" >"$TMP/cmp" <<'EOF'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1])]
c = open(sys.argv[2]).read().split()
total = int(c[c.index("gather") + 1]) + int(c[c.index("reduce") + 1])
peak = int(c[c.index("peak") + 1])
ok = all(s["comm_bytes"] * len(steps) == total and s["mem_peak_bytes"] == peak for s in steps)
print(steps[0], c); sys.exit(0 if ok else 1)
EOF
[ $? = 0 ] && ok "log: comm_bytes and mem_peak_bytes agree with the counters" || bad "log counters" "$TMP/cmp"

# ── bf16 all-gathers: half the bytes, weights rounded ──
FSD_TEST_BF16=1 mp 2 $TRAIN --data "$D" --micro-batch 6 --log "$TMP/bf16.json" --quiet >"$TMP/bf16.out" 2>&1
st=$?
g32=$(sed -n 's/^counters gather \([0-9]*\).*/\1/p' "$TMP/sharded.2.out")
g16=$(sed -n 's/^counters gather \([0-9]*\).*/\1/p' "$TMP/bf16.out")
if [ $st = 0 ] && [ -n "$g16" ] && [ "$((g16 * 2))" = "$g32" ]; then
    ok "bf16 all-gather moves half the bytes of fp32 ($g16 vs $g32)"
else bad "bf16 gather bytes: status $st, $g16 vs $g32" "$TMP/bf16.out"; fi
if $CHECK logs "$TMP/sharded.2.json" "$TMP/bf16.json" 1e-3 >/dev/null && ! $CHECK logs "$TMP/sharded.2.json" "$TMP/bf16.json" 1e-9 >/dev/null; then
    ok "bf16 weights: the loss moves by rounding only (1e-3 close, not equal)"
else bad "bf16 loss"; fi

FSD_TEST_FP16=1 mp 2 $TRAIN --data "$D" --micro-batch 6 --log "$TMP/fp16.json" --quiet >"$TMP/fp16.out" 2>&1
st=$?
g=$(sed -n 's/^counters gather \([0-9]*\).*/\1/p' "$TMP/fp16.out")
if [ $st = 0 ] && [ "$g" = "$g16" ] && $CHECK logs "$TMP/sharded.2.json" "$TMP/fp16.json" 1e-4 >/dev/null; then
    ok "fp16 all-gather: 2 bytes an element, loss within 1e-4 of fp32"
else bad "fp16 gather: status $st, $g bytes" "$TMP/fp16.out"; fi
FSD_TEST_REDUCE_BF16=1 mp 2 $TRAIN --data "$D" --micro-batch 6 --log "$TMP/rbf16.json" --export "$TMP/rbf16.st" --quiet >"$TMP/rbf16.out" 2>&1
st=$?
r32=$(sed -n 's/^counters .* reduce \([0-9]*\).*/\1/p' "$TMP/sharded.2.out")
r16=$(sed -n 's/^counters .* reduce \([0-9]*\).*/\1/p' "$TMP/rbf16.out")
if [ $st = 0 ] && [ -n "$r16" ] && [ "$((r16 * 2))" = "$r32" ] && $CHECK logs "$TMP/sharded.2.json" "$TMP/rbf16.json" 1e-3 >/dev/null &&
    ! $CHECK weights "$TMP/sharded.2.st" "$TMP/rbf16.st" 0 >/dev/null 2>&1; then
    ok "bf16 reduce-scatter: half the bytes ($r16 vs $r32), loss within 1e-3"
else bad "bf16 reduce: status $st, $r16 vs $r32" "$TMP/rbf16.out"; fi

# ── bf16 compute: trainer.c built with FSD_ACT_BF16 (make runtime-tests
# has no rule for it: built here with the library's flags), as an emitted
# program with param = bf16 runs: bf16 unsharded buffers gathered in place,
# bf16 gradients reduced through an fp32 reduce buffer (reduce = fp32) or in
# bf16. Each run checks its counters against trainer.c's formulas (the
# peak: bf16 parameters and gradients, or the gradients and the 4-byte
# reduce buffers while both reduce-scatters run) and exits 2 if they differ.
TRAIN_BF16=$TMP/trainer_bf16
if mpicc -O2 -g -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Wshadow -Wno-unused-parameter \
        -Wno-missing-field-initializers -fopenmp -fno-math-errno -DFSD_ACT_BF16 -Iruntime \
        $(pkg-config --cflags openblas 2>/dev/null) -o "$TRAIN_BF16" tests/runtime/trainer.c \
        build/runtime/libfsdrt_cpu.a $($MAKE -s --no-print-directory rt-libs) >"$TMP/build_bf16" 2>&1 &&
        ! grep -q "warning:" "$TMP/build_bf16"; then
    ok "build: trainer.c with FSD_ACT_BF16, without warnings"
else bad "build: trainer.c with FSD_ACT_BF16" "$TMP/build_bf16"; fi
$TRAIN_BF16 --data "$D" --micro-batch 12 --log "$TMP/act16.1.json" --quiet >"$TMP/act16.1.out" 2>&1
st1=$?
mp 2 $TRAIN_BF16 --data "$D" --micro-batch 6 --log "$TMP/act16.2.json" --quiet >"$TMP/act16.2.out" 2>&1
st2=$?
mp 3 $TRAIN_BF16 --data "$D" --micro-batch 4 --log "$TMP/act16.3.json" --quiet >"$TMP/act16.3.out" 2>&1
st3=$?
counter() { sed -n "s/^counters .*$1 \([0-9]*\).*/\1/p" "$2"; }
g16=$(counter gather "$TMP/act16.2.out") r16=$(counter reduce "$TMP/act16.2.out")
if [ $st1$st2$st3 = 000 ] && [ -n "$g16" ] && [ "$((g16 * 2))" = "$(counter gather "$TMP/sharded.2.out")" ] &&
    [ "$r16" = "$(counter reduce "$TMP/sharded.2.out")" ]; then
    ok "bf16 compute, reduce fp32: counters equal their formulas on 1-3 ranks; half the gather bytes of fp32 ($g16), the same reduce bytes"
else bad "bf16 compute counters: status $st1 $st2 $st3, gather $g16, reduce $r16" "$TMP/act16.2.out"; fi
if $CHECK logs "$TMP/act16.1.json" "$TMP/act16.3.json" 1e-2 >"$TMP/cmp" &&
    $CHECK logs "$TMP/sharded.2.json" "$TMP/act16.2.json" 1e-2 >>"$TMP/cmp" &&
    ! $CHECK logs "$TMP/sharded.2.json" "$TMP/act16.2.json" 1e-9 >/dev/null 2>&1; then
    ok "bf16 compute: 3 ranks = 1 rank, and fp32's loss and norm, to bf16's precision (1e-2; not equal)"
else bad "bf16 compute: loss and norm" "$TMP/cmp"; fi
FSD_TEST_REDUCE_BF16=1 mp 3 $TRAIN_BF16 --data "$D" --micro-batch 4 --log "$TMP/act16r.json" --quiet >"$TMP/act16r.out" 2>&1
st=$?
r=$(counter reduce "$TMP/act16r.out")
if [ $st = 0 ] && [ -n "$r" ] && [ "$((r * 2))" = "$(counter reduce "$TMP/sharded.3.out")" ] &&
    $CHECK logs "$TMP/act16.3.json" "$TMP/act16r.json" 1e-2 >"$TMP/cmp"; then
    ok "bf16 compute, reduce bf16: in place, half the reduce bytes ($r), counters equal their formulas"
else bad "bf16 compute, reduce bf16: status $st, reduce $r" "$TMP/act16r.out"; fi

# ── data formats and order ──
$CHECK mkdata v2 "$TMP/v2.bin" "$D"
mp 2 $TRAIN --data "$TMP/v2.bin" --micro-batch 6 --log "$TMP/v2.json" --quiet >"$TMP/out" 2>&1
if [ $? = 0 ] && $CHECK logs "$TMP/sharded.2.json" "$TMP/v2.json" 0 >"$TMP/cmp"; then
    ok "version 2 (uint32) token files train exactly as version 1"
else bad "version 2 data" "$TMP/cmp"; fi
python3 -c "import sys; sys.path.insert(0,'tests/runtime'); import check; check.write_tokens('$TMP/small.bin', check.read_tokens('$D')[:400])"
mkdir -p "$TMP/order"
FSD_TEST_ORDER=$TMP/order mp 3 $TRAIN --data "$TMP/small.bin" --steps 3 --quiet >"$TMP/out" 2>&1
if [ $? = 0 ] && $CHECK order "$TMP/small.bin" 2 2 3 3 "$TMP/order" >"$TMP/cmp" 2>&1; then
    ok "data order: rank r, micro-batch m gets sequences s·G + (m·W + r)·B + b, wrapping"
else bad "data order" "$TMP/cmp"; fi

# ── initialisation and safetensors ──
$TRAIN --steps 0 --export "$TMP/init1.st" --quiet >"$TMP/out" 2>&1
mp 3 $TRAIN --steps 0 --export "$TMP/init3.st" --quiet >>"$TMP/out" 2>&1
if cmp -s "$TMP/init1.st" "$TMP/init3.st"; then ok "init: --steps 0 --export on 1 and 3 ranks writes identical files"; else bad "init depends on world" "$TMP/out"; fi
$CHECK init "$TMP/init3.st" 42 >"$TMP/cmp" && ok "init: names, shapes and values follow the documented formula (seed 42)" || bad "init formula" "$TMP/cmp"
mp 2 $TRAIN --steps 0 --seed 7 --export "$TMP/seed7.st" --quiet >/dev/null 2>&1
$CHECK init "$TMP/seed7.st" 7 >"$TMP/cmp" && ! cmp -s "$TMP/seed7.st" "$TMP/init1.st" && ok "init: --seed 7 gives seed 7's values" || bad "init --seed" "$TMP/cmp"
if ! $CHECK weights "$TMP/init1.st" "$TMP/sharded.1.st" 1e-2 >/dev/null; then ok "training changes the weights"; else bad "weights did not change in training"; fi
mp 3 $TRAIN --init-from "$TMP/sharded.2.st" --steps 0 --export "$TMP/back.st" --quiet >"$TMP/out" 2>&1
if [ $? = 0 ] && cmp -s "$TMP/sharded.2.st" "$TMP/back.st"; then
    ok "safetensors: export on 2 ranks, --init-from on 3, export again: identical"
else bad "safetensors round trip" "$TMP/out"; fi
$CHECK mkweights escaped "$TMP/escaped.st" "$TMP/sharded.2.st"
mp 2 $TRAIN --init-from "$TMP/escaped.st" --steps 0 --export "$TMP/back2.st" --quiet >"$TMP/out" 2>&1
if [ $? = 0 ] && cmp -s "$TMP/sharded.2.st" "$TMP/back2.st"; then
    ok "safetensors: names in \\u escapes and a surrogate pair in the metadata read correctly"
else bad "safetensors escapes" "$TMP/out"; fi
# training on from imported weights continues the run: steps 0-4 then 5-9
# equal 0-9 only with optimizer state, which --init-from does not carry, so
# check just that it starts from the imported loss
mp 2 $TRAIN --init-from "$TMP/init1.st" --data "$D" --micro-batch 6 --steps 1 --log "$TMP/from.json" --quiet >/dev/null 2>&1
python3 -c "
import json,sys; a=json.loads(open('$TMP/from.json').readline()); b=json.loads(open('$TMP/sharded.2.json').readline())
sys.exit(0 if abs(a['loss']-b['loss']) <= 1e-6*abs(b['loss']) else 1)" && ok "--init-from the initial weights reproduces step 0's loss" || bad "--init-from loss"

# ── float64 build and SGD ──
$TRAIN64 --data "$D" --micro-batch 12 --log "$TMP/f64.1.json" --export "$TMP/f64.1.st" --quiet >"$TMP/out" 2>&1 &&
    mp 3 $TRAIN64 --data "$D" --micro-batch 4 --log "$TMP/f64.3.json" --export "$TMP/f64.3.st" --quiet >>"$TMP/out" 2>&1
if [ $? = 0 ] && $CHECK logs "$TMP/f64.1.json" "$TMP/f64.3.json" 1e-12 >"$TMP/cmp" && $CHECK weights "$TMP/f64.1.st" "$TMP/f64.3.st" 1e-6 >>"$TMP/cmp"; then
    ok "float64 build: 3 ranks = 1 rank (loss 1e-12; weights exported as F32)"
else bad "float64 invariance" "$TMP/cmp"; cat "$TMP/out" | head -5; fi
FSD_TEST_SGD=1 $TRAIN --data "$D" --micro-batch 12 --log "$TMP/sgd.1.json" --export "$TMP/sgd.1.st" --quiet >"$TMP/out" 2>&1 &&
    FSD_TEST_SGD=1 mp 4 $TRAIN --data "$D" --micro-batch 3 --log "$TMP/sgd.4.json" --export "$TMP/sgd.4.st" --quiet >>"$TMP/out" 2>&1
if [ $? = 0 ] && $CHECK logs "$TMP/sgd.1.json" "$TMP/sgd.4.json" 1e-5 >"$TMP/cmp" && $CHECK weights "$TMP/sgd.1.st" "$TMP/sgd.4.st" 1e-5 >>"$TMP/cmp"; then
    ok "SGD with Nesterov momentum: 4 ranks = 1 rank"
else bad "SGD invariance" "$TMP/cmp"; fi

# ── the trace ──
mp 2 $TRAIN --data "$D" --micro-batch 6 --steps 2 --trace-out "$TMP/trace.json" --quiet >"$TMP/out" 2>&1
if [ $? = 0 ] && $CHECK trace "$TMP/trace.json" 2 >"$TMP/cmp"; then
    ok "--trace-out: a Chrome trace with each rank's ops and collectives"
else bad "trace" "$TMP/cmp"; fi

# ── user errors: the message on every rank, exit 1, no hang ──
# Each rank runs under a shell that reports its own exit status, and mpirun
# is told not to kill the others when one exits non-zero (it would, after a
# second, and hide a rank left waiting in a collective): so every rank must
# print the message and exit 1 by itself, within the time limit.
# err NAME W PATTERN ARGS...  (environment from the caller)
err() {
    local name=$1 w=$2 pat=$3
    shift 3
    timeout 60 "${MPIRUN[@]}" --mca orte_abort_on_non_zero_status 0 -np "$w" \
        sh -c '"$0" "$@"; echo "rank exit status $?" >&2' $TRAIN "$@" >"$TMP/out" 2>"$TMP/err"
    local st=$? n e
    n=$(grep -c -- "^train: $pat" "$TMP/err")
    e=$(grep -c "^rank exit status 1$" "$TMP/err")
    if [ $st = 124 ]; then bad "error $name: hung (killed after 60 s)" "$TMP/err"
    elif [ "$e" = "$w" ] && [ "$n" = "$w" ]; then ok "error $name: message and exit 1 on all $w ranks"
    else bad "error $name: message on $n, exit 1 on $e of $w ranks" "$TMP/err"; fi
}
for k in magic version truncated short; do $CHECK mkdata $k "$TMP/$k.bin" "$D"; done
pos=$($CHECK mkdata token "$TMP/token.bin" "$D")
err "unknown flag" 2 "unknown flag --frobnicate (see --help)" --data "$D" --frobnicate
err "bad value" 2 "--steps: 'ten' is not a whole number from 0 to" --data "$D" --steps ten
err "flag without value" 2 "--data needs a value (FILE|PATTERN)" --data
err "stray argument" 2 "unexpected argument 'data.bin'" data.bin
err "missing data file" 2 "cannot open data file $TMP/nope.bin: No such file or directory" --data "$TMP/nope.bin"
err "no data" 2 "no training data: pass --data FILE" --steps 3
err "wrong magic" 2 "data file $TMP/magic.bin: wrong magic number 12345" --data "$TMP/magic.bin"
err "unknown version" 2 "data file $TMP/version.bin: unknown version 3 (1: uint16 tokens, 2: uint32 tokens)" --data "$TMP/version.bin"
err "truncated data" 2 "data file $TMP/truncated.bin is truncated: its header says 20000 tokens, but it holds 19500" --data "$TMP/truncated.bin"
err "data too short" 2 "data file $TMP/short.bin: 16 tokens is too short for one sequence of 16" --data "$TMP/short.bin"
err "token >= vocab (found by the last rank)" 3 "data file $TMP/token.bin: token 87 at position $pos is not below the model's vocabulary size 64" --data "$TMP/token.bin"
err "bad --val-data" 2 "data file $TMP/magic.bin: wrong magic number" --data "$D" --val-data "$TMP/magic.bin"
err "--eval-every in a program without an evaluation pass" 2 "--eval-every: this trainer has no evaluation pass" --data "$D" --val-data "$D" --eval-every 1
FSD_TEST_TINY=1 err "world larger than a group" 3 "world size 3 is larger than shard group tiny's 2 elements (its parameters, aligned): run on at most 2 ranks" --data "$D"
FSD_TEST_FP16=1 TRAIN=$TRAIN_BF16 err "bf16 compute with fp16 parameters" 2 "model softmax_regression computes in bf16 but gathers its parameters in fp16" --data "$D"
err "unwritable --log" 2 "cannot write --log file /nonexistent/log.json: No such file or directory" --data "$D" --log /nonexistent/log.json
err "unwritable --export" 2 "cannot write --export file /nonexistent/w.st.tmp." --steps 0 --export /nonexistent/w.st
for k in missing shape dtype json hlen truncated; do $CHECK mkweights $k "$TMP/$k.st" "$TMP/sharded.2.st"; done
err "--init-from missing file" 2 "cannot open --init-from $TMP/nope.st: No such file" --steps 0 --init-from "$TMP/nope.st"
err "--init-from missing tensor" 2 "$TMP/missing.st: no tensor \`head.bias\`, a parameter of model softmax_regression" --steps 0 --init-from "$TMP/missing.st"
err "--init-from wrong shape" 2 "$TMP/shape.st: tensor \`tok.weight\` has shape \[8, 64\]; the model's is \[64, 8\]" --steps 0 --init-from "$TMP/shape.st"
err "--init-from wrong dtype" 2 "$TMP/dtype.st: tensor \`scale.weight\` has dtype F64; the dtypes accepted are F32, BF16 and F16" --steps 0 --init-from "$TMP/dtype.st"
err "--init-from bad JSON" 3 "$TMP/json.st: the header is not valid JSON: byte 31 of it: expected a string key" --steps 0 --init-from "$TMP/json.st"
err "--init-from bad header length" 2 "$TMP/hlen.st: bad header length 1099511627776" --steps 0 --init-from "$TMP/hlen.st"
err "--init-from truncated" 2 "$TMP/truncated.st is truncated, or tensor \`head.bias\`'s data_offsets are out of range: \[[0-9]*, 4352\] ends past the data's 4320 bytes" --steps 0 --init-from "$TMP/truncated.st"

# ── schedule bugs: a collective call the schedule could not have made ──
# (FSD_TEST_BUG, trainer.c's break_rule) is refused once for every backend,
# in common.c, with its call site and the job aborted: no hang, no exit 0.
# bug KIND MESSAGE
bug() {
    FSD_TEST_BUG=$1 mp 2 $TRAIN --data "$D" --quiet >"$TMP/bug.out" 2>&1
    local st=$?
    if [ $st = 124 ]; then bad "schedule bug $1: hung (killed after 60 s)" "$TMP/bug.out"
    elif [ $st != 0 ] && grep -qF -- "runtime/common.c:" "$TMP/bug.out" &&
            grep -qF -- "internal error: $2" "$TMP/bug.out"; then
        ok "schedule bug $1: refused, the job aborted"
    else bad "schedule bug $1 (status $st)" "$TMP/bug.out"; fi
}
bug no_group "fsdrt_all_gather: no group 7"
bug gather_twice "all-gather of group tok issued again before its wait"
bug wait_gather "fsdrt_wait_gather(0) without an all-gather in flight"
bug reshard "fsdrt_reshard(0) of a group that is not gathered (or still gathering)"
bug reshard_gathering "fsdrt_reshard(0) of a group that is not gathered (or still gathering)"
bug alloc_twice "fsdrt_alloc_grads(1) of a group whose gradients are already allocated"
bug reduce_no_grads "fsdrt_reduce_scatter(1) without gradients, or with one in flight"
bug reduce_twice "fsdrt_reduce_scatter(1) without gradients, or with one in flight"
bug wait_reduce "fsdrt_wait_reduce(1) without a reduce-scatter (and, under replicate, its all-reduce) in flight"
bug free_reducing "fsdrt_free_grads(1) of gradients not allocated, or still reducing"
bug free_none "fsdrt_free_grads(1) of gradients not allocated, or still reducing"
bug end_gathering "fsdrt_end_step: group tok still has an all-gather in flight"
bug end_reducing "fsdrt_end_step: group root still has a reduce-scatter in flight"
bug end_grads "fsdrt_end_step: group root still has unsharded gradients allocated"
bug end_params "fsdrt_end_step: group tok still has unsharded parameters gathered"

mp 2 $TRAIN --help >"$TMP/out" 2>&1
st=$?
if [ $st = 0 ] && [ "$(grep -c '^usage: train' "$TMP/out")" = 1 ] && grep -q -- "--init-from FILE" "$TMP/out"; then
    ok "--help: usage once (rank 0), exit 0"
else bad "--help (status $st)" "$TMP/out"; fi

echo "     (training runs took $(($(date +%s) - t0)) s)" >&2
done_
