#!/usr/bin/env bash
# signals.sh — a run stopped by a signal, and one command line for a first
# start and a restart (docs/runtime.md, "Stopping"; docs/checkpoint.md):
#   - SIGTERM, SIGINT and SIGUSR1, to both ranks of 2 and to one of them:
#     the step running finishes, every rank stops at the same step and
#     exits 128 + the signal, a checkpoint of that step is written (with
#     checkpoints off, and with async ones still in flight), rank 0 prints
#     the --resume flag, and resuming from it gives the uninterrupted run's
#     losses exactly;
#   - a second signal exits at once, in the middle of the save;
#   - --resume auto: with no checkpoint, a fresh start (from the seed, or
#     from --init-from) logging a fresh run's losses; with one, a resume.
# Runs are signalled mid-run without timing assumptions: the trainer is
# slowed by FSD_TEST_STEP_SLEEP_MS (a test-only sleep in each step, cut
# short by the signal), the suite waits until the log shows step 1 and then
# signals; which step the run stops at is read from its log, not assumed.
# The trainer is built in build/faults-sig/, this suite's own. Every check
# prints one line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

need_tools "signal tests" mpicc mpirun python3 pgrep
build_trainer "build: make trainer FSD=examples/tiny.fsd" trainer FSD=examples/tiny.fsd \
    BACKEND=cpu TRAINER=build/faults-sig/tiny || done_
ok "build: tiny's trainer without warnings"

TINY=build/faults-sig/tiny/train
READ="python3 tests/ckpt/read_ckpt.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 20000 >/dev/null
STEPS=8
RUN=(--data "$D" --steps $STEPS --micro-batch 1 --grad-accum 2)

# step, loss and lr of each log line, as the text the trainer wrote
losses() { sed -E 's/^(\{"step": [0-9]+, "loss": [^,]+, "lr": [^,]+).*/\1/' "$@"; }
steps_from() { awk -v k="$2" -F'[:,]' '$2 + 0 >= k' "$1"; }
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
descendants() { local p; for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done; }
# rank_pids PID WHO: the trainer processes under PID, all of them or rank WHO's
rank_pids() {
    local p rank
    for p in $(descendants "$1"); do
        rank=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
        [ -n "$rank" ] && { [ "$2" = all ] || [ "$2" = "$rank" ]; } && echo "$p"
    done
}
# wait_for COND PID: until COND holds or the run PID has ended
wait_for() { while ! eval "$1" && kill -0 "$2" 2>/dev/null; do sleep 0.05; done; }

# the uninterrupted run the stopped and resumed ones are held to
mp 2 $TINY "${RUN[@]}" --quiet --log "$TMP/straight.json" >"$TMP/out" 2>&1
check "straight: $STEPS steps on 2 ranks" '[ $? = 0 ] && [ "$(lines "$TMP/straight.json")" = $STEPS ]' "$TMP/out"

# stop NAME SIG WHO [FLAG...]: a slowed 2-rank run with --ckpt-dir
# $TMP/NAME, signalled (rank WHO, or all) once its log shows step 1; sets
# st (its status) and n (the steps it logged)
stop() {
    local name=$1 sig=$2 who=$3 pid
    shift 3
    FSD_TEST_STEP_SLEEP_MS=300 mp 2 $TINY "${RUN[@]}" --quiet --ckpt-dir "$TMP/$name" \
        --log "$TMP/$name.json" "$@" >"$TMP/$name.out" 2>&1 &
    pid=$!
    wait_for '[ "$(lines "$TMP/$name.json")" -ge 2 ]' $pid
    kill -"$sig" $(rank_pids $pid "$who") 2>/dev/null
    wait $pid
    st=$?
    n=$(lines "$TMP/$name.json")
}

# signal_case NAME SIG NUMBER WHO [FLAG...]: the checks of one stop
signal_case() {
    local name=$1 sig=$2 num=$3 who=$4 to ck
    shift 4
    to=$([ "$who" = all ] && echo "both ranks" || echo "rank $who of 2")
    stop "$name" "$sig" "$who" "$@"
    ck=$(printf '%s/step_%06d' "$TMP/$name" "$n")
    check "$name: SIG$sig to $to: the run exits $((128 + num)) (128 + SIG$sig)" \
        '[ $st = $((128 + num)) ]' "$TMP/$name.out"
    check "$name: ... after finishing the step it was in: checkpoint step_$(printf %06d "$n") (the step after the last logged, $((n - 1)) < $STEPS), whole, named by latest" \
        '[ "$n" -ge 2 ] && [ "$n" -lt $STEPS ] && [ "$(cat "$TMP/$name/latest" 2>/dev/null)" = "$(basename "$ck")" ] && $READ verify "$ck" >"$TMP/v" 2>&1' "$TMP/$name.out"
    check "$name: ... rank 0 prints the flag that resumes: --resume $(basename "$ck")" \
        'grep -qF -- "SIG$sig: stopped before step $n of $STEPS" "$TMP/$name.out" && grep -qF -- "--resume $ck" "$TMP/$name.out"' "$TMP/$name.out"
}

# resumed NAME FLAG...: the run resumed with FLAG... logs the straight run's
# steps n … STEPS-1 exactly (losses and lr as text)
resumed() {
    local name=$1
    shift
    mp 2 $TINY "${RUN[@]}" --ckpt-dir "$TMP/$name" --log "$TMP/$name.resumed.json" "$@" >"$TMP/$name.rout" 2>&1
    local rst=$?
    check "$name: ... resumed ($*): steps $n-$((STEPS - 1)) log the uninterrupted run's losses exactly" \
        '[ $rst = 0 ] && [ -s "$TMP/$name.resumed.json" ] && [ "$(losses "$TMP/$name.resumed.json")" = "$(steps_from "$TMP/straight.json" "$n" | losses)" ]' "$TMP/$name.rout"
}

# ── one signal: to both ranks, and to one ──
signal_case term-all TERM 15 all
resumed term-all --quiet --resume "$TMP/term-all/step_$(printf %06d "$n")"
n_term_all=$n
signal_case term-one TERM 15 1
resumed term-one --quiet --resume "$TMP/term-one/step_$(printf %06d "$n")"
# a first start with --resume auto (nothing to resume yet), stopped on rank
# 0, then the same command line again: a requeued job's
signal_case int-one INT 2 0 --resume auto
check "int-one: ... the hint says the same command (with its --resume auto) goes on" \
    'grep -qF "the same command (its --resume auto finds it)" "$TMP/int-one.out"' "$TMP/int-one.out"
resumed int-one --quiet --resume auto
signal_case int-all INT 2 all
resumed int-all --quiet --resume "$TMP/int-all/step_$(printf %06d "$n")"
# async checkpoints (slowed writes, so one is in flight): the stop's save is
# complete before the exit
FSD_CKPT_TEST_SLEEP_MS=100 signal_case usr1-all-async USR1 10 all --ckpt-every 2 --ckpt-async
resumed usr1-all-async --quiet --resume "$TMP/usr1-all-async/step_$(printf %06d "$n")"
signal_case usr1-one USR1 10 1
resumed usr1-one --quiet --resume "$TMP/usr1-one/step_$(printf %06d "$n")"

# ── a second signal: at once, mid-save (its 9 sections slowed to 1 s each) ──
K=$TMP/second
FSD_CKPT_TEST_SLEEP_MS=1000 FSD_TEST_STEP_SLEEP_MS=300 mp 2 $TINY "${RUN[@]}" --quiet --ckpt-dir "$K" \
    --log "$TMP/second.json" >"$TMP/second.out" 2>&1 &
pid=$!
wait_for '[ "$(lines "$TMP/second.json")" -ge 2 ]' $pid
kill -TERM $(rank_pids $pid all) 2>/dev/null
wait_for 'ls -d "$K"/.tmp-step_* >/dev/null 2>&1' $pid
kill -INT $(rank_pids $pid all) 2>/dev/null
wait $pid
st=$?
check "second signal: SIGTERM, then SIGINT while the checkpoint is being written: exits 130 (128 + SIGINT) at once, the save left unfinished (.tmp- only, no latest)" \
    '[ $st = 130 ] && ls -d "$K"/.tmp-step_* >/dev/null 2>&1 && [ ! -e "$K/latest" ] && ! ls -d "$K"/step_* >/dev/null 2>&1' "$TMP/second.out"

# ── --resume auto ──
mp 2 $TINY "${RUN[@]}" --ckpt-dir "$TMP/auto-seed" --resume auto --log "$TMP/auto-seed.json" >"$TMP/out" 2>&1
st=$?
check "resume auto: no checkpoint: starts fresh from the seed, says so, and logs the straight run's losses" \
    '[ $st = 0 ] && grep -q "^--resume auto: no checkpoint in $TMP/auto-seed yet: starting fresh (seed " "$TMP/out" && [ "$(losses "$TMP/auto-seed.json")" = "$(losses "$TMP/straight.json")" ]' "$TMP/out"
mp 2 $TINY --steps 0 --seed 7 --export "$TMP/w.st" --quiet >"$TMP/out" 2>&1 ||
    bad "resume auto: exporting initial weights (seed 7)" "$TMP/out"
mp 2 $TINY "${RUN[@]}" --quiet --init-from "$TMP/w.st" --log "$TMP/init.json" >"$TMP/out" 2>&1 ||
    bad "resume auto: a fresh run from --init-from" "$TMP/out"
mp 2 $TINY "${RUN[@]}" --ckpt-dir "$TMP/auto-init" --resume auto --init-from "$TMP/w.st" \
    --log "$TMP/auto-init.json" >"$TMP/out" 2>&1
st=$?
check "resume auto: no checkpoint, --init-from: starts fresh from the file, says so, and logs that fresh run's losses" \
    '[ $st = 0 ] && grep -qF -- "--resume auto: no checkpoint in $TMP/auto-init yet: starting fresh from $TMP/w.st" "$TMP/out" && [ "$(losses "$TMP/auto-init.json")" = "$(losses "$TMP/init.json")" ] && [ "$(losses "$TMP/init.json")" != "$(losses "$TMP/straight.json")" ]' "$TMP/out"
n=$n_term_all
mp 2 $TINY "${RUN[@]}" --ckpt-dir "$TMP/term-all" --resume auto --init-from "$TMP/w.st" \
    --log "$TMP/auto-ckpt.json" >"$TMP/out" 2>&1
st=$?
check "resume auto: with a checkpoint (and --init-from, which then does not apply): resumes from latest, says so, steps $n-$((STEPS - 1)) as the straight run" \
    '[ $st = 0 ] && grep -qF "resumed from $TMP/term-all/step_$(printf %06d "$n"): step $n" "$TMP/out" && [ "$(losses "$TMP/auto-ckpt.json")" = "$(steps_from "$TMP/straight.json" "$n" | losses)" ]' "$TMP/out"

done_
