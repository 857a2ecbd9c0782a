#!/usr/bin/env bash
# ckptdir.sh — a checkpoint directory under faults (docs/checkpoint.md,
# "Failures", "Replacing a checkpoint", "One run, one directory",
# "meta.json's checksum"): a save that fails on a full disk (simulated with
# FSD_CKPT_TEST_FAIL_STEPS) leaves nothing behind and training goes on;
# failures in a row stop the run; a crash between the renames that replace
# a checkpoint resumes; a second run in the same directory and a fresh run
# into another run's checkpoints are refused; an edited meta.json is
# refused naming the file and the field.
#
# Tiny on 2 ranks, one OpenMP thread each; trainers in build/faults-ckpt/.
# Every check prints one line; the last is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

need_tools "checkpoint fault tests" mpicc mpirun python3
build_trainer "build: make trainer FSD=examples/tiny.fsd" trainer FSD=examples/tiny.fsd \
    BACKEND=cpu TRAINER=build/faults-ckpt/tiny || done_
$MAKE --no-print-directory -s build/fsdata >/dev/null 2>&1

TINY=build/faults-ckpt/tiny/train
READ="python3 tests/ckpt/read_ckpt.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { timeout 120 "${MPIRUN[@]}" -np 2 "$@"; }
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 30000 >/dev/null
RUN=(--data "$D" --micro-batch 1 --grad-accum 1 --quiet)
losses() { sed -E 's/^(\{"step": [0-9]+, "loss": [^,]+, "lr": [^,]+).*/\1/' "$@"; }
leftovers() { ls -A "$1" | grep -E '^\.(tmp|trash)-|^\.latest\.tmp$'; }

mp $TINY "${RUN[@]}" --steps 4 --log "$TMP/straight.json" >"$TMP/out" 2>&1 || bad "straight run of 4 steps" "$TMP/out"

# ── 4: a failed save cleans up; training and later saves go on ──
for mode in sync async; do
    K=$TMP/full.$mode
    flags=(--ckpt-dir "$K" --ckpt-every 1)
    [ $mode = async ] && flags+=(--ckpt-async)
    mkdir -p "$K/.tmp-step_000099" "$K/.trash-step_000001"   # a dead run's leftovers
    touch "$K/.tmp-step_000099/rank_00000.bin"
    FSD_CKPT_TEST_FAIL_STEPS=2 mp $TINY "${RUN[@]}" --steps 4 "${flags[@]}" --log "$TMP/$mode.json" >"$TMP/out" 2>&1
    st=$?
    check "full disk ($mode): the step-2 save fails with a warning on both ranks; the run ends with status 0" \
        '[ $st = 0 ] && [ "$(grep -c "warning: checkpoint save failed: cannot write checkpoint file .*step_000002/rank_00001.bin (write): No space left on device; training goes on" "$TMP/out")" = 2 ]' "$TMP/out"
    check "full disk ($mode): nothing of it is left (no .tmp-, .trash-, step_000002), and the old leftovers are swept" \
        '[ -z "$(leftovers "$K")" ] && [ ! -e "$K/step_000002" ]' "$TMP/out"
    check "full disk ($mode): training went on (the losses of the run without checkpoints); saves 3 and 4 verify, latest = step_000004" \
        '[ "$(losses "$TMP/$mode.json")" = "$(losses "$TMP/straight.json")" ] && $READ verify "$K/step_000003" >"$TMP/v" && $READ verify "$K/step_000004" >>"$TMP/v" && [ "$(cat "$K/latest")" = step_000004 ]' "$TMP/v"
done

# failures in a row stop the run: saves 2, 3, 4 fail, the run stops after
# step 3 (sync) or when the third failure is known (async: when every
# rank's writer is done, a step or two later)
for mode in sync async; do
    K=$TMP/stop.$mode
    flags=(--ckpt-dir "$K" --ckpt-every 1)
    [ $mode = async ] && flags+=(--ckpt-async)
    FSD_CKPT_TEST_FAIL_STEPS=2,3,4 mp $TINY "${RUN[@]}" --steps 8 "${flags[@]}" --log "$TMP/stop.json" >"$TMP/out" 2>&1
    st=$?
    n=$(wc -l <"$TMP/stop.json")
    lo=4 hi=4
    [ $mode = async ] && hi=6
    check "3 failures in a row ($mode): the run stops with status 1 after $n of 8 steps, saying why; latest = step_000001, nothing left over" \
        '[ $st != 0 ] && grep -q "train: 3 checkpoint saves in a row failed: stopping the run after step" "$TMP/out" && [ "$n" -ge $lo ] && [ "$n" -le $hi ] && [ "$(cat "$K/latest")" = step_000001 ] && [ -z "$(leftovers "$K")" ] && [ "$(cd "$K" && ls -d step_*)" = step_000001 ]' "$TMP/out"
done
K=$TMP/max1
FSD_CKPT_TEST_FAIL_STEPS=2 mp $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$K" --ckpt-every 1 --ckpt-max-failures 1 \
    --log "$TMP/max1.json" >"$TMP/out" 2>&1
st=$?
check "--ckpt-max-failures 1: the first failure stops the run after step 1 (status 1)" \
    '[ $st != 0 ] && [ "$(wc -l <"$TMP/max1.json")" = 2 ] && grep -q "1 checkpoint saves in a row failed" "$TMP/out"' "$TMP/out"
K=$TMP/last
FSD_CKPT_TEST_FAIL_STEPS=4 mp $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$K" --ckpt-every 2 >"$TMP/out" 2>&1
st=$?
check "the last save fails: all 4 steps run, status 1 (the final state is not saved), latest = step_000002" \
    '[ $st = 1 ] && grep -q "the last checkpoint save failed" "$TMP/out" && [ "$(cat "$K/latest")" = step_000002 ] && [ -z "$(leftovers "$K")" ]' "$TMP/out"

# ── 5: a crash between the two renames that replace step_000003 ──
K=$TMP/swap
mp $TINY "${RUN[@]}" --steps 3 --ckpt-dir "$K" --ckpt-every 1 >"$TMP/out" 2>&1 || bad "swap: the first run" "$TMP/out"
# the state a crash leaves where RENAME_EXCHANGE is missing: the old copy
# under .trash-, the new (complete) under .tmp-, latest naming neither
cp -r "$K/step_000003" "$K/.tmp-step_000003"
mv "$K/step_000003" "$K/.trash-step_000003"
mp $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$K" --ckpt-every 1 --resume --log "$TMP/swap.json" >"$TMP/out" 2>&1
st=$?
check "crash between renames: latest names a missing step_000003; start-up restores it from .trash- and --resume continues from step 3 exactly" \
    '[ $st = 0 ] && grep -q "restored it from $K/.trash-step_000003" "$TMP/out" && [ "$(losses "$TMP/swap.json")" = "$(losses "$TMP/straight.json" | sed -n 4p)" ] && [ -z "$(leftovers "$K")" ] && [ "$(cat "$K/latest")" = step_000004 ]' "$TMP/out"
# replacing in place (a rerun from step 1 saves 2, 3, 4 again)
mp $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$K" --ckpt-every 1 --resume "$K/step_000001" >"$TMP/out" 2>&1
st=$?
check "replace: a rerun from step 1 replaces step_000002 … 4 whole, nothing left over" \
    '[ $st = 0 ] && $READ verify "$K/step_000002" >"$TMP/v" && $READ verify "$K/step_000003" >"$TMP/v" && $READ verify "$K/step_000004" >"$TMP/v" && [ -z "$(leftovers "$K")" ]' "$TMP/out"
FSD_CKPT_TEST_NO_EXCHANGE=1 mp $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$K" --ckpt-every 1 --resume "$K/step_000002" \
    >"$TMP/out" 2>&1
st=$?
check "replace without RENAME_EXCHANGE (old copy to .trash-, new one in): step_000003 and 4 whole, nothing left over" \
    '[ $st = 0 ] && $READ verify "$K/step_000003" >"$TMP/v" && $READ verify "$K/step_000004" >"$TMP/v" && [ -z "$(leftovers "$K")" ] && [ "$(cat "$K/latest")" = step_000004 ]' "$TMP/out"

# ── 6: one run, one directory ──
K=$TMP/shared
FSD_CKPT_TEST_SLEEP_MS=150 mp $TINY "${RUN[@]}" --steps 2 --ckpt-dir "$K" --ckpt-every 1 >"$TMP/first" 2>&1 &
pid=$!
for _ in $(seq 400); do grep -q "^pid" "$K/.lock" 2>/dev/null && break; sleep 0.05; done
mp $TINY "${RUN[@]}" --steps 2 --ckpt-dir "$K" --ckpt-every 1 --log "$TMP/second.json" >"$TMP/out" 2>&1
st=$?
wait $pid
st1=$?
check "lock: a second run into a directory in use is refused (status 1), naming the directory and the holder's pid and host" \
    '[ $st = 1 ] && grep -q "checkpoint directory $K is in use by another run (pid [0-9]* on $(hostname)" "$TMP/out" && [ ! -s "$TMP/second.json" ]' "$TMP/out"
check "lock: the first run finishes undisturbed" '[ $st1 = 0 ] && [ "$(cat "$K/latest")" = step_000002 ]' "$TMP/first"
lineage=$(sed -n 's/.*"lineage": "\(.*\)".*/\1/p' "$K/step_000002/meta.json")
mp $TINY "${RUN[@]}" --steps 2 --ckpt-dir "$K" --ckpt-every 1 --log "$TMP/fresh.json" >"$TMP/out" 2>&1
st=$?
check "lineage: a fresh run into another run's checkpoints is refused (status 1), naming both lineages" \
    '[ $st = 1 ] && grep -q "checkpoint directory $K holds checkpoints of another run (step_00000[12] has lineage $lineage; this fresh run" "$TMP/out" && [ ! -s "$TMP/fresh.json" ]' "$TMP/out"
mp $TINY "${RUN[@]}" --steps 3 --ckpt-dir "$K" --ckpt-every 1 --resume >"$TMP/out" 2>&1
st=$?
check "lineage: a resumed run carries its checkpoint's lineage on (step_000003 has it)" \
    '[ $st = 0 ] && grep -q "\"lineage\": \"$lineage\"" "$K/step_000003/meta.json"' "$TMP/out"
mp $TINY "${RUN[@]}" --steps 2 --ckpt-dir "$K" --ckpt-every 2 --ckpt-overwrite >"$TMP/out" 2>&1
st=$?
check "lineage: --ckpt-overwrite accepts it: step_000002 is the new run's (a new lineage), latest = step_000002" \
    '[ $st = 0 ] && ! grep -q "\"lineage\": \"$lineage\"" "$K/step_000002/meta.json" && grep -q "\"lineage\": \"[0-9a-f]\{16\}\"" "$K/step_000002/meta.json" && [ "$(cat "$K/latest")" = step_000002 ]' "$TMP/out"

# ── 11: meta.json's checksum ──
C=$TMP/full.sync/step_000004
E=$TMP/edited
cp -r "$C" "$E"
python3 - "$E/meta.json" <<'PY'
import re, sys   # the second group's offset, one element further
t = open(sys.argv[1]).read()
m = list(re.finditer(r'("name": "[^"]*", "flat": \d+, "padded": \d+, "shard": \d+, "offset": )(\d+)', t))[1]
open(sys.argv[1], "w").write(t[:m.start(2)] + str(int(m.group(2)) + 4) + t[m.end(2):])
PY
mp $TINY "${RUN[@]}" --steps 6 --resume "$E" --log "$TMP/edited.json" >"$TMP/out" 2>&1
st=$?
check "meta.json: a changed group offset is refused (status 1) naming the file and the field meta_crc32c" \
    '[ $st = 1 ] && [ "$(grep -c "checkpoint $E: $E/meta.json fails its checksum: field meta_crc32c says" "$TMP/out")" = 2 ] && [ ! -s "$TMP/edited.json" ]' "$TMP/out"
check "meta.json: read_ckpt.py verify refuses it too; the unedited one verifies" \
    '! $READ verify "$E" >"$TMP/v" && grep -q "meta_crc32c" "$TMP/v" && $READ verify "$C" >"$TMP/v"' "$TMP/v"
cp "$C/meta.json" "$E/meta.json"
sed -i '0,/"offset": 0, "shape"/s//"offset": 8, "shape"/' "$E/meta.json"
$READ seal "$E"
mp $TINY "${RUN[@]}" --steps 6 --resume "$E" >"$TMP/out" 2>&1
st=$?
check "meta.json: a tensor's offset changed and the checksum redone is refused naming the field tensors[0].offset" \
    '[ $st = 1 ] && grep -q "checkpoint $E: $E/meta.json.s field tensors\[0\].offset does not match" "$TMP/out"' "$TMP/out"
head -c -32 "$C/meta.json" >"$E/meta.json" && printf '\n}\n' >>"$E/meta.json"
mp $TINY "${RUN[@]}" --steps 6 --resume "$E" >"$TMP/out" 2>&1
st=$?
check "meta.json: one without its checksum is refused" \
    '[ $st = 1 ] && grep -q "meta.json does not end with its checksum field meta_crc32c" "$TMP/out"' "$TMP/out"

done_
