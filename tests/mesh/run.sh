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
#   5. replicate = auto (docs/design.md#replicate-auto): tiny planned for
#      --world 16 (two nodes of 8) gets the planner's R = 2; trained at
#      world 4 it notes the planned world and has plain FSDP's losses; at
#      world 3 it is refused on every rank naming the planned world.
#   6. partial resharding (docs/design.md#partial-resharding): tiny with
#      reshard_after_forward = 2 at worlds 4 and 6, tiny_llama at world 4,
#      and per target (the blocks and the root, N = 2) under replicate = 2
#      at world 8 (shard groups of 4: a real partial case beside HSDP), the
#      same losses as plain FSDP (1e-5), the bytes per kind (reshard_bytes
#      for the gathers within N ranks) and the memory peak equal the plan;
#      a bad N refused by the trainer (every rank) and by fsdpc --world (at
#      its line and column), N = 0 by fsdpc.
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
build_base
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
variant tiny_rauto examples/tiny.fsd 'replicate = auto'
variant tiny_n2 examples/tiny.fsd 'reshard_after_forward = 2'
variant tiny_llama_n2 examples/tiny_llama.fsd 'reshard_after_forward = 2'
# per target: the blocks and the root keep copies over 2 ranks; the shard
# section sets none (FSDP2's per-call reshard_after_forward)
sed 's/^shard {/shard {\n  replicate = 2/; s/^  fully_shard blocks\[\*\]$/  fully_shard blocks[*] (reshard_after_forward = 2)/; s/^  fully_shard root$/  fully_shard root (reshard_after_forward = 2)/' \
    examples/tiny.fsd >"$OUT/tiny_r2_tgt.fsd"
VARIANTS=(tiny tiny_r2 tiny_r3 tiny_r4 tiny_llama tiny_llama_r2 tiny_rauto tiny_n2 tiny_llama_n2 tiny_r2_tgt)
build_one() {
    local flags=
    [ "$1" = tiny_rauto ] && flags="--world 16"   # the world replicate = auto plans for
    $MAKE --no-print-directory -s trainer FSD="$OUT/$1.fsd" BACKEND=cpu TRAINER="$OUT/$1" \
        FSDPC_FLAGS="$flags" >"$TMP/build.$1" 2>&1
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
    local v=$1 w=$2 b=$((${GB:-12} / $2))
    RUN=$v.w$w${GB:+.g$GB}
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
    if grep -q '"gather_partial"' "$TMP/$RUN.json"; then
        n=$(grep -c '"gather_partial"' "$TMP/$RUN.json")
        m=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline()).get('reshard_bytes', 0))" "$TMP/$RUN.log")
        check "partial resharding $RUN: $n gather_partial events a step, reshard_bytes $m > 0" '[ "$m" -gt 0 ]'
    fi
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

# ── 6. partial resharding ──
same tiny_n2 4 tiny.w1 tiny.w4
same tiny_n2 6 tiny.w1
same tiny_llama_n2 4 tiny_llama.w1
# world 8, replicate = 2: shard groups of 4, copies over 2 of them; a
# global batch of 24 (8 does not divide 12), against world 1 at 24
GB=24 run tiny 1 || done_
GB=24 same tiny_r2_tgt 8 tiny.w1.g24
for g in blocks.0 blocks.1 root; do
    check "per target: $g gathers from its copy over 2 ranks in backward (tiny_r2_tgt, world 8)" \
        "grep -q '\"event\": \"gather_partial\", \"group\": \"$g\"' '$TMP/tiny_r2_tgt.w8.g24.json'" "$TMP/tiny_r2_tgt.w8.g24.json"
done
# a bad N: 2 does not divide a shard group of 3
mp 3 $OUT/tiny_n2/train --data "$D" --steps 1 --micro-batch 4 >"$TMP/badn" 2>&1
st=$?
n=$(grep -c "train: group blocks.0 of model tiny has reshard_after_forward = 2, which does not divide its shard group of 3 ranks (world 3)" "$TMP/badn")
check "trainer: reshard_after_forward = 2 at world 3 refused on every rank with the numbers, exit 1" \
    '[ $st = 1 ] && [ "$n" = 3 ]' "$TMP/badn"
variant tiny_n3 examples/tiny.fsd 'reshard_after_forward = 3'
line=$(grep -n "reshard_after_forward = 3" "$OUT/tiny_n3.fsd" | cut -d: -f1)
$FSDPC "$OUT/tiny_n3.fsd" --world 4 --dump-plan >"$TMP/badnc" 2>&1
st=$?
check "fsdpc --world 4: reshard_after_forward = 3 refused at $OUT/tiny_n3.fsd:$line:27, exit 1" \
    '[ $st = 1 ] && grep -q "^$OUT/tiny_n3.fsd:$line:27: error: \`reshard_after_forward = 3\` does not divide the shard group of 4 ranks (world 4, --world)" "$TMP/badnc"' "$TMP/badnc"
$FSDPC "$OUT/tiny_n3.fsd" --dump-plan >"$TMP/default" 2>&1
check "fsdpc without --world: reshard_after_forward = 3 plans for world 9 (a multiple of 3 from 8)" \
    'grep -q "^plan tiny for world 9" "$TMP/default" && grep -q "after forward to 3 ranks" "$TMP/default"' "$TMP/default"
variant tiny_n0 examples/tiny.fsd 'reshard_after_forward = 0'
$FSDPC "$OUT/tiny_n0.fsd" --check >"$TMP/badn0" 2>&1
st=$?
check "fsdpc: reshard_after_forward = 0 refused, exit 1" \
    '[ $st = 1 ] && grep -q "error: \`reshard_after_forward = 0\`: a number of ranks must be at least 1" "$TMP/badn0"' "$TMP/badn0"
# N = S with the world known is plain resharding; N = 1 is false
$FSDPC "$OUT/tiny_n2.fsd" --world 2 --dump-schedule >"$TMP/ns" 2>&1
variant tiny_n1 examples/tiny.fsd 'reshard_after_forward = 1'
$FSDPC "$OUT/tiny_n1.fsd" --world 4 --dump-plan >"$TMP/n1" 2>&1
check "fsdpc: N = S (2 at world 2) plans as true, N = 1 as false" \
    '! grep -q "partial" "$TMP/ns" && grep -q " reshard " "$TMP/ns" && grep -q "blocks.0 .*after backward" "$TMP/n1"' "$TMP/ns"

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

# ── 5. replicate = auto: R chosen for the planned world ──
check "replicate = auto planned for --world 16: the trainer has replicate 2 (chosen) for plan world 16" \
    'grep -q "^    2, 1,  /\* replicate (replicas of world / replicate ranks), replicate_auto " "$OUT/tiny_rauto/train.cu" && grep -q "^    16, [0-9]*, 0,  /\* plan_world" "$OUT/tiny_rauto/train.cu"' \
    "$OUT/tiny_rauto/train.cu"
# at world 4 fsdpc would plan another mesh (one node of 4: R = 1), so the
# run is held to replicate = 2's plan at world 4 (tiny_r2.w4's dumps)
mp 4 "$OUT/tiny_rauto/train" --data "$D" --steps 10 --micro-batch 3 --grad-accum 1 \
    --log "$TMP/tiny_rauto.w4.log" --quiet >"$TMP/tiny_rauto.w4.out" 2>&1 ||
    bad "tiny_rauto.w4: status $?" "$TMP/tiny_rauto.w4.out"
for ref in tiny.w1 tiny_r2.w4; do
    if res=$($E2E losses "$TMP/$ref.log" "$TMP/tiny_rauto.w4.log" 1e-5); then
        ok "losses tiny_rauto.w4 = $ref: $res"
    else bad "losses tiny_rauto.w4 vs $ref: $res"; fi
done
if res=$($CHECK bytes "$TMP/tiny_rauto.w4.log" "$TMP/tiny_r2.w4.json"); then
    ok "plan bytes tiny_rauto.w4 (replicate = 2's plan at world 4): $res"
else bad "plan bytes tiny_rauto.w4: $res" "$TMP/tiny_r2.w4.json"; fi
check "replicate = auto at world 4, planned for 16: one note naming both worlds" \
    '[ "$(grep -c "train: note: replicate = 2 was chosen by \`replicate = auto\` for a world of 16 ranks; at 4 ranks it trains the same" "$TMP/tiny_rauto.w4.out")" = 1 ]' \
    "$TMP/tiny_rauto.w4.out"
mp 3 $OUT/tiny_rauto/train --data "$D" --steps 1 >"$TMP/bad3" 2>&1
st=$?
n=$(grep -c "train: model tiny has replicate = 2, which \`replicate = auto\` chose for the world of 16 ranks fsdpc planned; this run has 3 ranks, not a multiple of 2: run on a multiple of 2 (16 as planned), or recompile for this world (fsdpc --world 3" "$TMP/bad3")
check "trainer: replicate = auto's R = 2 at world 3 refused on every rank naming the planned world 16, exit 1" \
    '[ $st = 1 ] && [ "$n" = 3 ]' "$TMP/bad3"

echo "($(($(date +%s) - t0)) s)"
done_
