#!/usr/bin/env bash
# run.sh — the runtime's part of `make check` (tests/all.sh --quick): one
# emitted trainer end to end, in seconds rather than the minutes of
# tests/runtime, tests/ckpt and tests/e2e, which hold the same things (and
# much more) in `make test`. examples/tiny.fsd compiled by build/fsdpc and
# built against the CPU runtime into build/smoke/tiny (this suite's own
# folder), then, with one OpenMP thread a rank:
#
#   - 20 steps on 2 ranks: the loss falls;
#   - the same 20 steps saving a checkpoint at step 10: the same losses;
#   - resumed from step 10 on 2 ranks: steps 10-19 and the final weights
#     exactly those of the straight run;
#   - resumed from step 10 on 1 rank (resharded 2 → 1, the same 4 sequences
#     a step): steps 10-19 within 1e-5 of the straight run, the same lr;
#   - the start-up restart (runtime/cpu.c, restart_tuned), seen by strace:
#     GOMP_SPINCOUNT=1000 in the restarted program's environment, and a
#     user's GOMP_SPINCOUNT left as it was.
#
# Every check prints one line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

need_tools "smoke tests" mpicc mpirun python3
build_trainer "smoke: make trainer FSD=examples/tiny.fsd" build/fsdata trainer FSD=examples/tiny.fsd \
    BACKEND=cpu TRAINER=build/smoke/tiny || done_
ok "smoke: tiny's trainer builds without warnings"

T=build/smoke/tiny/train
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 60000 >/dev/null
# 4 sequences a step on either world size; the cosine schedule spans 20 steps
RUN=(--data "$D" --steps 20 --grad-accum 2 --quiet)
# step, loss and lr of each log line, as the text the trainer wrote
losses() { sed -E 's/^(\{"step": [0-9]+, "loss": [^,]+, "lr": [^,]+).*/\1/' "$@"; }
steps_from() { awk -v k="$2" -F'[:,]' '$2 + 0 >= k' "$1"; }
# falls LOG: 20 steps logged, the last one's loss below the first one's
falls() { awk -F'"loss": ' '{ split($2, v, ","); l[NR] = v[1] + 0 } END { exit !(NR == 20 && l[NR] < l[1]) }' "$1"; }
# close A B FIRST LAST: B logs steps FIRST..LAST, each with A's lr and A's
# loss to 1e-5 relative
close() {
    python3 - "$@" <<'PY'
import json, sys
a = {x["step"]: x for x in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
first, last = int(sys.argv[3]), int(sys.argv[4])
sys.exit(not ([x["step"] for x in b] == list(range(first, last + 1)) and
              all(x["lr"] == a[x["step"]]["lr"] and
                  abs(x["loss"] - a[x["step"]]["loss"]) <= 1e-5 * abs(a[x["step"]]["loss"])
                  for x in b)))
PY
}

mp 2 $T "${RUN[@]}" --micro-batch 1 --log "$TMP/straight.json" --export "$TMP/straight.st" \
    >"$TMP/out" 2>&1
st=$?
check "smoke: tiny on 2 ranks, 20 steps: the loss falls" \
    '[ $st = 0 ] && falls "$TMP/straight.json"' "$TMP/out"

mp 2 $T "${RUN[@]}" --micro-batch 1 --ckpt-dir "$TMP/ck" --ckpt-every 10 --log "$TMP/saving.json" \
    >"$TMP/out" 2>&1
st=$?
check "smoke: saving a checkpoint at step 10 changes no loss" \
    '[ $st = 0 ] && [ -f "$TMP/ck/step_000010/meta.json" ] && [ "$(losses "$TMP/saving.json")" = "$(losses "$TMP/straight.json")" ]' \
    "$TMP/out"

mp 2 $T "${RUN[@]}" --micro-batch 1 --resume "$TMP/ck/step_000010" --log "$TMP/r2.json" \
    --export "$TMP/r2.st" >"$TMP/out" 2>&1
st=$?
check "smoke: resumed at step 10 on 2 ranks: steps 10-19 and the final weights exactly the straight run's" \
    '[ $st = 0 ] && [ "$(losses "$TMP/r2.json")" = "$(steps_from "$TMP/straight.json" 10 | losses)" ] && cmp -s "$TMP/straight.st" "$TMP/r2.st"' \
    "$TMP/out"

mp 1 $T "${RUN[@]}" --micro-batch 2 --resume "$TMP/ck/step_000010" --log "$TMP/r1.json" \
    >"$TMP/out" 2>&1
st=$?
check "smoke: resumed at step 10 on 1 rank (resharded): steps 10-19 within 1e-5 of the straight run" \
    '[ $st = 0 ] && close "$TMP/straight.json" "$TMP/r1.json" 10 19' "$TMP/out"

# execves SPIN: the trainer's execve calls, environments shown, with
# GOMP_SPINCOUNT unset (SPIN empty) or set to SPIN
execves() {
    env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT ${1:+GOMP_SPINCOUNT=$1} \
        strace -f -v -s 64 -e trace=execve -o "$TMP/strace" \
        $T --data "$D" --steps 1 --micro-batch 1 --quiet >"$TMP/out" 2>&1
}
if ! command -v strace >/dev/null; then
    echo "skip smoke: the start-up restart's GOMP_SPINCOUNT: strace not found"
else
    execves
    st=$?
    check "smoke: the trainer restarts itself with GOMP_SPINCOUNT=1000 when it is unset" \
        '[ $st = 0 ] && [ "$(grep -c "^[0-9]* *execve(\"/proc/self/exe\".*\"GOMP_SPINCOUNT=1000\\\"" "$TMP/strace")" = 1 ]' \
        "$TMP/strace"
    execves 77
    st=$?
    check "smoke: a user's GOMP_SPINCOUNT is kept" \
        '[ $st = 0 ] && grep -q "GOMP_SPINCOUNT=77" "$TMP/strace" && ! grep -q "GOMP_SPINCOUNT=1000\\\"" "$TMP/strace"' \
        "$TMP/strace"
fi

done_
