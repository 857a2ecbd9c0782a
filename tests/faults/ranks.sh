#!/usr/bin/env bash
# ranks.sh — ranks that disagree or stop, on the CPU build: ranks started
# with different settings (mpirun's MPMD form, one rank a side) are refused
# at start-up, the setting named with both values, by every rank, with a
# non-zero exit and no hang; a rank stopped with SIGSTOP mid-run makes the
# other report the collective, group and step it waited on after
# --collective-timeout and end the job, without spinning on its core; a
# normal run still trains (2 ranks give the losses of 1 rank on the same
# sequences), and the same data under another path is accepted.
#
# Trainers go to build/faults-ranks/. About 30 s on 2 cores.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

need_tools "rank fault tests" mpicc mpirun python3
if ! { $MAKE --no-print-directory -s runtime build/fsdata &&
       $MAKE --no-print-directory -s trainer FSD=examples/tiny.fsd TRAINER=build/faults-ranks/tiny; } \
       >"$TMP/build" 2>&1; then
    bad "build: runtime and the tiny trainer" "$TMP/build"
    done_
fi
T=$PWD/build/faults-ranks/tiny/train
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1

build/fsdata synth "$TMP/a.bin" --tokens 20000 --vocab 64 --seed 1 >/dev/null
build/fsdata synth "$TMP/b.bin" --tokens 20000 --vocab 64 --seed 2 >/dev/null
cp "$TMP/a.bin" "$TMP/a_copy.bin"
BASE=(--data "$TMP/a.bin" --steps 3 --quiet)

# ── settings that differ between ranks ──

# mismatch NAME 'RANK 0 FLAGS' 'RANK 1 FLAGS' MESSAGE: refused at start-up,
# both ranks printing MESSAGE (each prints it just before it exits 1), the
# job non-zero, no step run, no hang
mismatch() {
    local name=$1 f0=$2 f1=$3 msg=$4 st n
    # shellcheck disable=SC2086
    timeout 30 "${MPIRUN[@]}" -np 1 "$T" "${BASE[@]}" $f0 : -np 1 "$T" "${BASE[@]}" $f1 \
        >"$TMP/m.log" 2>&1
    st=$?
    n=$(grep -cF "train: $msg" "$TMP/m.log")
    if [ $st != 0 ] && [ $st != 124 ] && [ "$n" = 2 ] && ! grep -q "^step" "$TMP/m.log"; then
        ok "different $name: refused by both ranks: $msg"
    else
        bad "different $name: status $st, message on $n of 2 ranks (want: $msg)" "$TMP/m.log"
    fi
}
same="every rank must be started with the same settings"
mismatch --steps "--steps 5" "--steps 6" "rank 1 runs with --steps 6, rank 0 with 5: $same"
mismatch --grad-accum "--grad-accum 2" "--grad-accum 1" "rank 1 runs with --grad-accum 1, rank 0 with 2: $same"
mismatch --micro-batch "--micro-batch 4" "--micro-batch 2" "rank 1 runs with --micro-batch 2, rank 0 with 4: $same"
mismatch --lr "--lr 0.001" "--lr 0.002" "rank 1 runs with --lr 0.002, rank 0 with 0.001: $same"
mismatch --seed "--seed 1" "--seed 2" "rank 1 runs with --seed 2, rank 0 with 1: $same"
mismatch "data file" "--data $TMP/a.bin" "--data $TMP/b.bin" "rank 1 runs with --data $TMP/b.bin ("
mismatch --ckpt-every "--ckpt-every 0" "--ckpt-every 2" "rank 1 runs with --ckpt-every 2, rank 0 with 0: $same"

# the same tokens under another path are the same data
timeout 30 "${MPIRUN[@]}" -np 1 "$T" "${BASE[@]}" : -np 1 "$T" "${BASE[@]}" --data "$TMP/a_copy.bin" \
    >"$TMP/copy.log" 2>&1
check "the same data file under another path: accepted" '[ $? = 0 ]' "$TMP/copy.log"

# ── a normal run: 2 ranks see step by step the sequences 1 rank sees with
# twice the accumulation, so the losses agree ──
timeout 60 "${MPIRUN[@]}" -np 2 "$T" --data "$TMP/a.bin" --steps 4 --quiet --grad-accum 2 \
    --log "$TMP/w2.jsonl" >"$TMP/w2.out" 2>&1
st2=$?
timeout 60 "${MPIRUN[@]}" -np 1 "$T" --data "$TMP/a.bin" --steps 4 --quiet --grad-accum 4 \
    --log "$TMP/w1.jsonl" >"$TMP/w1.out" 2>&1
st1=$?
check "a normal run on 2 ranks trains 4 steps" \
    '[ $st2 = 0 ] && [ $st1 = 0 ] && [ "$(wc -l <"$TMP/w2.jsonl")" = 4 ]' "$TMP/w2.out"
check "its losses are 1 rank's on the same sequences (rel 1e-5)" "python3 - '$TMP/w1.jsonl' '$TMP/w2.jsonl' <<'EOF'
import json, sys
a, b = ([json.loads(l)['loss'] for l in open(p)] for p in sys.argv[1:3])
sys.exit(not (len(a) == len(b) == 4 and all(abs(x - y) <= 1e-5 * abs(x) for x, y in zip(a, b))))
EOF" "$TMP/w1.jsonl"

# ── a stopped rank ──

# cpu_ticks PID: user + system clock ticks so far
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

STALL_LOG=$TMP/stall.jsonl
timeout 40 "${MPIRUN[@]}" -np 2 "$T" --data "$TMP/a.bin" --steps 1000000 --collective-timeout 3 \
    --log "$STALL_LOG" >"$TMP/stall.out" 2>&1 &
job=$!
for _ in $(seq 200); do
    [ -s "$STALL_LOG" ] && break
    sleep 0.1
done
pids=$(pgrep -f -- "--log $STALL_LOG" | while read -r p; do
    [ "$(readlink "/proc/$p/exe")" = "$T" ] && echo "$p"; done)
set -- $pids
if [ $# != 2 ] || ! [ -s "$STALL_LOG" ]; then
    bad "stopped rank: the run did not start ($# ranks found)" "$TMP/stall.out"
    kill "$job" 2>/dev/null
else
    stopped=$2 waiting=$1
    t0=$(date +%s.%N)
    kill -STOP "$stopped"
    sleep 1
    c0=$(cpu_ticks "$waiting")
    sleep 1
    c1=$(cpu_ticks "$waiting")
    wait "$job"
    st=$?
    secs=$(echo "$(date +%s.%N) - $t0" | bc)
    check "stopped rank: the job ends non-zero after the timeout, not the guard's (status $st, ${secs%.*} s)" \
        '[ $st != 0 ] && [ $st != 124 ] && [ "${secs%.*}" -lt 20 ]' "$TMP/stall.out"
    # inside a step it names the collective, its group and the step; stopped
    # between steps, the other waits in the step boundary's all-reduce (the
    # ranks' agreement on stopping: runtime/stop.c), "before step N"
    check "stopped rank: the other names the collective, group and step it waited on" \
        "grep -Eq 'train: rank [01]: the [a-z -]+( of group [^ ]+)? (in|before) step [0-9]+ did not complete within 3 s \(--collective-timeout\)' '$TMP/stall.out'" \
        "$TMP/stall.out"
    check "stopped rank: the waiting rank sleeps, not spins ($((c1 - c0)) of ~$(getconf CLK_TCK) ticks in 1 s)" \
        '[ $((c1 - c0)) -lt $(( $(getconf CLK_TCK) / 2 )) ]'
    for p in $pids; do
        kill -CONT "$p" 2>/dev/null
        kill -KILL "$p" 2>/dev/null
    done
fi

done_
