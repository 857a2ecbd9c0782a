#!/usr/bin/env bash
# nonfinite.sh — a run that survives its own faults (docs/runtime.md,
# "Non-finite steps" and "Resuming with --log"):
#
#   1. a diverging run (--lr 1e3 on tiny) stops at its first non-finite
#      step, before the update, with the message, exit 4: the checkpoints on
#      disk are finite, none was pruned, latest names the last of them, no
#      --export is written; on 2 ranks every rank stops at the same step;
#   2. --on-nonfinite skip logs each skipped step ("skipped": true, and the
#      line on stdout), trains on, and stops after --max-skips in a row;
#   3. a run without a non-finite step is unchanged: its losses, norms and
#      lrs are the ones recorded from the trainer before the check existed
#      (tiny_losses.json, to 1e-6: BLAS kernels differ between CPUs), the
#      same bits with either --on-nonfinite, no "skipped" key, exit 0;
#   4. --log on --resume appends: the lines before the checkpoint stay, the
#      steps run again are not duplicated, an unfinished line is cut; a
#      fresh run still truncates;
#   5. --resume with --steps at the checkpoint's step: a note naming both,
#      exit 0; below it: refused, exit 1;
#   6. bad --on-nonfinite values are refused.
#
# Trainers go to build/faults/ (this suite's own). Every check prints one
# line; the last is "N passed, N failed". About 20 s on 2 cores.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

need_tools "non-finite tests" mpicc mpirun python3
build_trainer "build: make trainer FSD=examples/tiny.fsd" trainer FSD=examples/tiny.fsd \
    BACKEND=cpu TRAINER=build/faults/tiny || done_
ok "build: tiny without warnings"
[ -x build/fsdata ] || $MAKE --no-print-directory -s build/fsdata >/dev/null

TINY=build/faults/tiny/train
READ="python3 tests/ckpt/read_ckpt.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 60 "${MPIRUN[@]}" -np "$w" "$@"; }
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 60000 >/dev/null
# 2 sequences a step; with --lr 1e3 the loss overflows and the gradient
# norm is NaN at step 4 (the recorded divergence, checked below)
RUN=(--data "$D" --micro-batch 1 --grad-accum 2)
BAD=4

# every value of every section of every checkpoint under $1 finite
finite_ckpts() {
    python3 - "$1" <<'EOF'
import glob, json, math, os, struct, sys
dirs = sorted(glob.glob(os.path.join(sys.argv[1], "step_*")))
assert dirs
for d in dirs:
    m = json.load(open(os.path.join(d, "meta.json")))
    fmt = "f" if m["dtype"] == "F32" else "d"
    for f in m["files"]:
        blob = open(os.path.join(d, f["name"]), "rb").read()
        vals = struct.unpack_from("<%d%s" % ((len(blob) - 64) // struct.calcsize(fmt), fmt), blob, 64)
        assert all(map(math.isfinite, vals)), d
EOF
}
steps_of() { ls "$1" | grep '^step_' | tr '\n' ' '; }

# ── 1. stop (the default) ──
C=$TMP/stop
mp 1 $TINY "${RUN[@]}" --steps 12 --lr 1e3 --ckpt-dir $C --ckpt-every 2 --ckpt-keep 2 \
    --log $C.log --export $C.safetensors >$TMP/out 2>$TMP/err
st=$?
check "stop: exit 4" "[ $st = 4 ]" $TMP/err
check "stop: the message names the step, the value and what to try" \
    "grep -q 'train: step $BAD: the gradient norm is nan (loss [0-9.e+]*, gradient norm nan); stopping before its update; .*lower --lr (this step.s was 500), a grad_clip .*--on-nonfinite skip' $TMP/err" $TMP/err
check "stop: the step's log line is its last, with \"skipped\": true" \
    "[ \$(wc -l <$C.log) = $((BAD + 1)) ] && tail -1 $C.log | grep -q '\"step\": $BAD, .*\"grad_norm\": null, .*\"skipped\": true}' && ! head -$BAD $C.log | grep -q skipped" $C.log
check "stop: the stdout line says stopped" "grep -q '^step    $BAD/12 .* | not finite: stopped$' $TMP/out" $TMP/out
check "stop: the checkpoints before the step are kept (step_000002, step_000004), latest the last" \
    "[ \"\$(steps_of $C)\" = 'step_000002 step_000004 ' ] && [ \"\$(cat $C/latest)\" = step_000004 ]" $TMP/out
check "stop: every checkpoint is finite (params and optimizer state)" "finite_ckpts $C"
check "stop: no --export" "[ ! -e $C.safetensors ]"
# the weights of the last checkpoint are those a run of the finite steps alone saves
mp 1 $TINY "${RUN[@]}" --steps 4 --lr 1e3 --ckpt-dir $TMP/four --ckpt-every 4 --quiet 2>$TMP/err
check "stop: step_000004 is the bits of a 4-step run's" \
    "cmp -s $C/step_000004/rank_00000.bin $TMP/four/step_000004/rank_00000.bin" $TMP/err
# on 2 ranks (one sequence each) every rank stops at the same step
C2=$TMP/stop2
mp 2 $TINY --data "$D" --micro-batch 1 --grad-accum 1 --steps 12 --lr 1e3 --ckpt-dir $C2 \
    --ckpt-every 2 --ckpt-keep 2 --log $C2.log >$TMP/out 2>$TMP/err
st=$?
n=$(grep -c "^train: step $BAD: " $TMP/err)
check "stop, 2 ranks: exit 4, one message (rank 0), the same step" \
    "[ $st = 4 ] && [ $n = 1 ] && [ \$(wc -l <$C2.log) = $((BAD + 1)) ]" $TMP/err
check "stop, 2 ranks: finite checkpoints, none pruned past keep" \
    "finite_ckpts $C2 && [ \"\$(steps_of $C2)\" = 'step_000002 step_000004 ' ]" $TMP/err

# ── 2. skip ──
S=$TMP/skip
mp 1 $TINY "${RUN[@]}" --steps 12 --lr 1e3 --on-nonfinite skip --max-skips 3 --ckpt-dir $S \
    --ckpt-every 2 --log $S.log >$TMP/out 2>$TMP/err
st=$?
check "skip: steps 4-6 skipped and logged, the 4th in a row (step 7) stops the run, exit 4" \
    "[ $st = 4 ] && [ \"\$(grep -o '\"step\": [0-9]*, .*\"skipped\": true' $S.log | cut -d, -f1 | tr -d '\"step: ' | tr '\n' ' ')\" = '4 5 6 7 ' ]" $S.log
check "skip: the stdout lines say skipped, n in a row" \
    "grep -q '^step    5/12 .* | not finite: skipped (2 in a row, --max-skips 3)$' $TMP/out && grep -q '^step    7/12 .* | not finite: stopped$' $TMP/out" $TMP/out
check "skip: the stop message gives the budget" \
    "grep -q 'train: step 7: .* after 3 skipped steps in a row (--max-skips 3); .*a larger --max-skips' $TMP/err" $TMP/err
check "skip: checkpoints during the skips are saved, finite, and hold the weights before them" \
    "[ \"\$(steps_of $S)\" = 'step_000002 step_000004 step_000006 ' ] && finite_ckpts $S && cmp -s <(tail -c +65 $S/step_000004/rank_00000.bin) <(tail -c +65 $S/step_000006/rank_00000.bin)" $TMP/out
# within the budget the run reaches its end: exit 0
mp 1 $TINY "${RUN[@]}" --steps 8 --lr 1e3 --on-nonfinite skip --log $S.2.log --quiet 2>$TMP/err
st=$?
check "skip: a run that ends within --max-skips (default 10) exits 0, every later step logged" \
    "[ $st = 0 ] && [ \$(wc -l <$S.2.log) = 8 ] && [ \$(grep -c '\"skipped\": true' $S.2.log) = 4 ]" $TMP/err
mp 1 $TINY "${RUN[@]}" --steps 8 --lr 1e3 --on-nonfinite skip --max-skips 0 --quiet 2>$TMP/err
st=$?
check "skip: --max-skips 0 stops at the first, exit 4" "[ $st = 4 ] && grep -q '^train: step $BAD: ' $TMP/err" $TMP/err

# ── 3. a finite run is unchanged ──
F=$TMP/fin
fields() { sed -E 's/^(\{"step": [0-9]+, "loss": [^,]+, "lr": [^,]+, "grad_norm": [^,]+).*/\1}/' "$1"; }
mp 2 $TINY "${RUN[@]}" --steps 10 --log $F.a.log --quiet 2>$TMP/err
st=$?
mp 2 $TINY "${RUN[@]}" --steps 10 --log $F.b.log --quiet --on-nonfinite skip --max-skips 0 2>>$TMP/err
st2=$?
check "finite run: exit 0 in either mode, no \"skipped\" key" \
    "[ $st = 0 ] && [ $st2 = 0 ] && ! grep -q skipped $F.a.log $F.b.log" $TMP/err
check "finite run: the same loss, lr and norm bits with --on-nonfinite stop and skip" \
    "cmp -s <(fields $F.a.log) <(fields $F.b.log)"
fields $F.a.log >$F.fields
python3 - tests/faults/tiny_losses.json $F.fields >$TMP/cmp 2>&1 <<'EOF'
import json, sys
want = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
assert [x["step"] for x in got] == [x["step"] for x in want], "steps"
for a, b in zip(want, got):
    for k in ("loss", "lr", "grad_norm"):
        assert abs(a[k] - b[k]) <= 1e-6 * abs(a[k]), (a, b)
EOF
check "finite run: loss, lr and norm of 10 steps on 2 ranks as recorded before the check existed" \
    "[ $? = 0 ]" $TMP/cmp

# ── 4. --log on --resume ──
R=$TMP/res
mp 1 $TINY "${RUN[@]}" --steps 8 --ckpt-dir $R --ckpt-every 4 --log $R.log --quiet 2>$TMP/err
head -8 $R.log >$R.first8
# resumed from step_000004 with steps 4-7 already in the file: they are run again, once
mp 1 $TINY "${RUN[@]}" --steps 10 --ckpt-dir $R --resume $R/step_000004 --log $R.log --quiet 2>>$TMP/err
check "resume: the log keeps steps 0-3, then 4-9 once each" \
    "[ \"\$(cut -d, -f1 $R.log | tr -d '{\"step: ' | tr '\n' ' ')\" = '0 1 2 3 4 5 6 7 8 9 ' ] && cmp -s <(head -4 $R.log) <(head -4 $R.first8)" $R.log
check "resume: the steps run again log what they logged before" \
    "cmp -s <(fields $R.first8) <(head -8 $R.log | fields /dev/stdin)" $R.log
# a line a killed run left unfinished is cut
printf '{"step": 10, "loss": 5.4' >>$R.log
mp 1 $TINY "${RUN[@]}" --steps 12 --ckpt-dir $R --ckpt-every 4 --resume --log $R.log --quiet 2>>$TMP/err
check "resume: an unfinished last line is cut; 12 whole lines" \
    "[ \$(wc -l <$R.log) = 12 ] && python3 -c 'import json,sys; [json.loads(l) for l in open(sys.argv[1])]' $R.log" $R.log
mp 1 $TINY "${RUN[@]}" --steps 3 --log $R.log --quiet 2>>$TMP/err
check "resume: a fresh run (no --resume) still truncates its log" "[ \$(wc -l <$R.log) = 3 ]" $TMP/err

# ── 5. --steps at or below the checkpoint's ──
mp 1 $TINY "${RUN[@]}" --steps 12 --ckpt-dir $R --resume --log $R.eq.log --export $R.eq.safetensors \
    >$TMP/out 2>$TMP/err
st=$?
check "resume --steps 12 at step_000012: a note naming both, --export written, exit 0" \
    "[ $st = 0 ] && grep -q '^train: note: the checkpoint resumed from is at step 12 and --steps is 12: nothing left to train' $TMP/err && [ -s $R.eq.safetensors ]" $TMP/err
cp $R.log $R.before
mp 2 $TINY "${RUN[@]}" --steps 5 --ckpt-dir $R --resume --log $R.log >$TMP/out 2>$TMP/err
st=$?
check "resume --steps 5 below step_000012: refused on every rank, naming both, exit 1, log untouched" \
    "[ $st = 1 ] && [ \$(grep -c '^train: --steps 5 is below the step of the checkpoint resumed from (12)' $TMP/err) = 2 ] && cmp -s $R.log $R.before" $TMP/err

# ── 6. flags ──
mp 1 $TINY "${RUN[@]}" --steps 1 --on-nonfinite ignore >$TMP/out 2>$TMP/err
st=$?
check "--on-nonfinite ignore: refused, exit 1" \
    "[ $st = 1 ] && grep -q \"^train: --on-nonfinite: 'ignore' is neither stop nor skip\" $TMP/err" $TMP/err
mp 1 $TINY --help >$TMP/out 2>&1
check "--help lists --on-nonfinite and --max-skips" \
    "grep -q -- '--on-nonfinite stop|skip' $TMP/out && grep -q -- '--max-skips N' $TMP/out" $TMP/out

done_
