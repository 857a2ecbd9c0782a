#!/usr/bin/env bash
# run.sh — the device mesh on the CPU build (docs/design.md#hsdp):
# `replicate = R` (HSDP, FSDP2's 2-D DeviceMesh) trained on MPI ranks.
#
#   1. the same losses as plain FSDP: tiny (GPT-shaped) and tiny_llama at
#      world 4 with replicate = 2, and tiny at world 6 with replicate = 2
#      and 3, against plain FSDP at world 1 (and tiny at world 4), with
#      the same global batch G = 12 over 10 steps, within 1e-5;
#   2. the float64 gradient check passes under replicate = 2 at world 4;
#      the plan holds per mesh dimension: every step's all-gather and
#      reduce-scatter bytes (shard group) and replica all-reduce bytes
#      (replicate_bytes) equal fsdpc's --dump-schedule=json at that world;
#      the measured memory peak equals --dump-memory's; the trace has the
#      replicate track with every planned all-reduce;
#   3. checkpoints move across R: saved at world 4 under replicate = 2
#      (written by one replica: 2 rank files, world 2 in meta.json) and
#      resumed under R = 1 (worlds 1 and 2), 2 and 4 (world 4); saved under
#      R = 1 and resumed under R = 2 and 4; each resumed run has the
#      straight run's losses within 1e-5;
#   4. a bad R: a world R does not divide refused by the trainer (every
#      rank, exit 1, the numbers in the message) and by fsdpc --world (at
#      the setting's line and column); replicate = 0 refused by fsdpc.
#
# Trainers and the .fsd variants go to build/mesh/. One line per check,
# then "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
OUT=build/mesh
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=30
. tests/lib.sh

need_tools "mesh tests" mpicc mpirun python3
t0=$(date +%s)
mkdir -p $OUT
if ! $MAKE --no-print-directory -s build/fsdpc build/fsdata runtime >"$TMP/build" 2>&1; then
    bad "build: fsdpc, fsdata and the runtime" "$TMP/build"
    done_
fi
FSDPC=build/fsdpc
CHECK="python3 tests/mesh/check.py"
E2E="python3 tests/e2e/check.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 180 "${MPIRUN[@]}" -np "$w" "$@"; }

# variant NAME SRC SETTINGS: $OUT/NAME.fsd is SRC with SETTINGS (sed's \n
# between lines) at the top of its shard section
variant() { sed "s/^shard {/shard {\\n  $3/" "$2" >"$OUT/$1.fsd"; }
cp examples/tiny.fsd "$OUT/tiny.fsd"
cp examples/tiny_llama.fsd "$OUT/tiny_llama.fsd"
variant tiny_r2 examples/tiny.fsd 'replicate = 2'
variant tiny_r3 examples/tiny.fsd 'replicate = 3'
variant tiny_r4 examples/tiny.fsd 'replicate = 4'
variant tiny_llama_r2 examples/tiny_llama.fsd 'replicate = 2'
VARIANTS=(tiny tiny_r2 tiny_r3 tiny_r4 tiny_llama tiny_llama_r2)
build_one() {
    $MAKE --no-print-directory -s trainer FSD="$OUT/$1.fsd" BACKEND=cpu TRAINER="$OUT/$1" \
        >"$TMP/build.$1" 2>&1
    echo $? >"$TMP/status.$1"
}
build_one "${VARIANTS[0]}"
i=0
for v in "${VARIANTS[@]:1}"; do
    build_one "$v" &
    i=$((i + 1))
    [ $((i % 2)) = 0 ] && wait
done
wait
built=0
for v in "${VARIANTS[@]}"; do
    if [ "$(cat "$TMP/status.$v")" != 0 ] || [ ! -x "$OUT/$v/train" ]; then
        bad "build: $v" "$TMP/build.$v"
    elif grep -q "warning:" "$TMP/build.$v"; then
        bad "build: $v has warnings" "$TMP/build.$v"
    else
        built=$((built + 1))
    fi
done
[ $built = ${#VARIANTS[@]} ] || done_
ok "build: ${#VARIANTS[@]} trainers without warnings ($(($(date +%s) - t0)) s)"

D=$TMP/data.bin
build/fsdata synth "$D" --tokens 60000 --seed 3 >/dev/null

# ── 1 and 2. losses, bytes, memory, tracks ──
# run V W: V's trainer on W ranks, G = 12 (micro-batch 12 / W, one
# micro-batch), 10 steps; the plan's dumps for the same world and batch
# from $OUT/V.wW.fsd. Sets $RUN to V.wW and returns the trainer's status.
run() {
    local v=$1 w=$2 b=$((12 / $2))
    RUN=$v.w$w
    sed "s/micro_batch *= *[0-9]*/micro_batch = $b/; s/grad_accum *= *[0-9]*/grad_accum = 1/" \
        "$OUT/$v.fsd" >"$OUT/$RUN.fsd"
    $FSDPC "$OUT/$RUN.fsd" --world "$w" --dump-schedule=json >"$TMP/$RUN.json" 2>&1 &&
        $FSDPC "$OUT/$RUN.fsd" --world "$w" --dump-memory >"$TMP/$RUN.mem" 2>&1 ||
        { bad "$RUN: fsdpc dumps" "$TMP/$RUN.json"; return 1; }
    mp "$w" "$OUT/$v/train" --data "$D" --steps 10 --micro-batch $b --grad-accum 1 \
        --log "$TMP/$RUN.log" --trace-out "$TMP/$RUN.trace" --quiet "${@:3}" >"$TMP/$RUN.out" 2>&1 ||
        { bad "$RUN: status $?" "$TMP/$RUN.out"; return 1; }
}
# same V W REF...: run V on W ranks, then its losses against each REF log
# (1e-5), its bytes and memory against the plan
same() {
    local v=$1 w=$2 ref res
    shift 2
    run "$v" "$w" || return
    for ref; do
        if res=$($E2E losses "$TMP/$ref.log" "$TMP/$RUN.log" 1e-5); then
            ok "losses $RUN = $ref: $res"
        else bad "losses $RUN vs $ref: $res"; fi
    done
    if res=$($CHECK bytes "$TMP/$RUN.log" "$TMP/$RUN.json"); then
        ok "plan bytes $RUN: $res"
    else bad "plan bytes $RUN: $res" "$TMP/$RUN.json"; fi
    if res=$($E2E memory "$TMP/$RUN.log" "$TMP/$RUN.mem"); then
        ok "plan memory $RUN: $res"
    else bad "plan memory $RUN: $res" "$TMP/$RUN.mem"; fi
    if grep -q '"all_reduce"' "$TMP/$RUN.json"; then
        if res=$($CHECK tracks "$TMP/$RUN.trace" "$TMP/$RUN.json" "$w" 10); then
            ok "trace $RUN: $res"
        else bad "trace $RUN: $res"; fi
    fi
}
run tiny 1 || done_
run tiny_llama 1 || done_
same tiny 4 tiny.w1
same tiny_r2 4 tiny.w1 tiny.w4
same tiny_r2 6 tiny.w1
same tiny_r3 6 tiny.w1
same tiny_llama_r2 4 tiny_llama.w1
# replicate = 4 at world 4: shard groups of one rank, all-reduce only
same tiny_r4 4 tiny.w1

# the replica all-reduce is what makes the replicas one model: the HSDP
# run's replicate_bytes are non-zero, and each replica's shard group moves
# what plain FSDP at its size moves (tiny_r2 at 4 = tiny at 2, per rank)
run tiny 2 || done_
g2=$(python3 -c "import json,sys; s=json.loads(open(sys.argv[1]).readline()); print(s['gather_bytes'], s['reduce_bytes'])" "$TMP/tiny.w2.log")
gr=$(python3 -c "import json,sys; s=json.loads(open(sys.argv[1]).readline()); print(s['gather_bytes'], s['reduce_bytes'], s.get('replicate_bytes', 0))" "$TMP/tiny_r2.w4.log")
check "bytes: replicate = 2 at world 4 gathers and reduce-scatters what world 2 does ($g2), plus ${gr##* } replica all-reduce bytes" \
    '[ "${gr% *}" = "$g2" ] && [ "${gr##* }" -gt 0 ]'

# the float64 build's gradient check under HSDP: step 0's gradient at world
# 4, replicate = 2, against central differences (the directional
# derivative sums one replica's shards: the others hold the same)
if $MAKE --no-print-directory -s trainer FSD="$OUT/tiny_r2.fsd" BACKEND=cpu64 TRAINER="$OUT/tiny_r2_64" \
        >"$TMP/build64" 2>&1 && ! grep -q "warning:" "$TMP/build64"; then
    mp 4 $OUT/tiny_r2_64/train --data "$D" --micro-batch 2 --grad-accum 2 --grad-check 3 >"$TMP/gc" 2>&1
    st=$?
    if [ $st = 0 ] && res=$($E2E gradcheck "$TMP/gc" 3); then
        ok "grad check, replicate = 2 on 4 ranks (float64): $res"
    else bad "grad check, replicate = 2 on 4 ranks: status $st" "$TMP/gc"; fi
else bad "build: tiny_r2 float64" "$TMP/build64"; fi

# ── 3. checkpoints across R ──
# straight: tiny_r2 at world 4 for 10 steps, a checkpoint after step 5
STRAIGHT=(--data "$D" --steps 10 --micro-batch 3 --grad-accum 1 --quiet)
mp 4 $OUT/tiny_r2/train "${STRAIGHT[@]}" --ckpt-dir "$TMP/ck_r2" --ckpt-every 5 \
    --log "$TMP/ck_r2.log" >"$TMP/out" 2>&1
st=$?
nfiles=$(ls "$TMP/ck_r2/step_000005" 2>/dev/null | grep -c '^rank_.*\.bin$')
world=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['world'])" "$TMP/ck_r2/step_000005/meta.json" 2>/dev/null)
check "checkpoint under replicate = 2 at world 4: written by one replica (2 rank files, world 2)" \
    '[ $st = 0 ] && [ "$nfiles" = 2 ] && [ "$world" = 2 ]' "$TMP/out"
# resume V W CKPT STRAIGHT_LOG LABEL: steps 5-9 from CKPT on W ranks
resume() {
    local v=$1 w=$2 ck=$3 ref=$4 label=$5 res
    mp "$w" "$OUT/$v/train" --data "$D" --steps 10 --micro-batch $((12 / w)) --grad-accum 1 \
        --resume "$ck" --log "$TMP/res.$v.$w.log" --quiet >"$TMP/out" 2>&1 ||
        { bad "$label: status $?" "$TMP/out"; return; }
    if res=$($CHECK resumed "$ref" "$TMP/res.$v.$w.log" 1e-5); then
        ok "$label: $res"
    else bad "$label: $res" "$TMP/out"; fi
}
resume tiny 1 "$TMP/ck_r2/step_000005" "$TMP/ck_r2.log" "checkpoint R = 2 (world 4) resumed under R = 1, world 1"
resume tiny 2 "$TMP/ck_r2/step_000005" "$TMP/ck_r2.log" "checkpoint R = 2 (world 4) resumed under R = 1, world 2"
resume tiny_r2 4 "$TMP/ck_r2/step_000005" "$TMP/ck_r2.log" "checkpoint R = 2 (world 4) resumed under R = 2, world 4"
resume tiny_r4 4 "$TMP/ck_r2/step_000005" "$TMP/ck_r2.log" "checkpoint R = 2 (world 4) resumed under R = 4, world 4"
mp 4 $OUT/tiny/train "${STRAIGHT[@]}" --ckpt-dir "$TMP/ck_r1" --ckpt-every 5 \
    --log "$TMP/ck_r1.log" >"$TMP/out" 2>&1 || bad "checkpoint under R = 1 at world 4: status $?" "$TMP/out"
resume tiny_r2 4 "$TMP/ck_r1/step_000005" "$TMP/ck_r1.log" "checkpoint R = 1 (world 4) resumed under R = 2, world 4"
resume tiny_r4 4 "$TMP/ck_r1/step_000005" "$TMP/ck_r1.log" "checkpoint R = 1 (world 4) resumed under R = 4, world 4"

# ── 4. a bad R ──
mp 3 $OUT/tiny_r2/train --data "$D" --steps 1 >"$TMP/bad3" 2>&1
st=$?
n=$(grep -c "train: model tiny has replicate = 2 (HSDP: 2 replicas of world / 2 ranks), but this run has 3 ranks, not a multiple of 2: run on 2 or 4 ranks" "$TMP/bad3")
check "trainer: replicate = 2 at world 3 refused on every rank with the numbers, exit 1" \
    '[ $st = 1 ] && [ "$n" = 3 ]' "$TMP/bad3"
line=$(grep -n "replicate = 2" "$OUT/tiny_r2.fsd" | cut -d: -f1)
$FSDPC "$OUT/tiny_r2.fsd" --world 3 --dump-plan >"$TMP/badc" 2>&1
st=$?
check "fsdpc --world 3: replicate = 2 refused at $OUT/tiny_r2.fsd:$line:15, exit 1" \
    '[ $st = 1 ] && grep -q "^$OUT/tiny_r2.fsd:$line:15: error: \`replicate = 2\` does not divide the world of 3 ranks (--world)" "$TMP/badc"' "$TMP/badc"
$FSDPC "$OUT/tiny_r2.fsd" --dump-plan >"$TMP/default" 2>&1
check "fsdpc without --world: the default world 8 is a multiple of 2 (plan for world 8, mesh 2 x 4)" \
    'grep -q "^plan tiny for world 8" "$TMP/default" && grep -q "mesh: replicate 2 x shard 4" "$TMP/default"' "$TMP/default"
variant tiny_r0 examples/tiny.fsd 'replicate = 0'
$FSDPC "$OUT/tiny_r0.fsd" --check >"$TMP/bad0" 2>&1
st=$?
check "fsdpc: replicate = 0 refused, exit 1" '[ $st = 1 ] && grep -q "error: .*replicate" "$TMP/bad0"' "$TMP/bad0"

echo "($(($(date +%s) - t0)) s)"
done_
