#!/usr/bin/env bash
# paths.sh — output and input paths that are not plain files, and files
# that change under a run (docs/runtime.md, "Files"):
#   - fsdpc's -o and --trace on a device or FIFO write it directly, never
#     rename over it (as root that replaced /dev/null with a file); a full
#     device (/dev/full) as -o, --trace or standard output is exit 1 with a
#     message;
#   - the trainer refuses --export on a device or FIFO, and a --ckpt-dir
#     that is a file, at start-up; --log and --trace-out on /dev/null work
#     and leave it a device;
#   - --data, --val-data and --init-from naming a FIFO are refused at once
#     (no rank waits in open for a writer), naming the file;
#   - a data file truncated during a run ends the job with a message naming
#     it: caught by the check before each micro-batch, and (that check off,
#     FSD_TEST_DATA_NO_RECHECK) by the SIGBUS handler; no hang, non-zero.
# Every run has a timeout, so a regression that blocks fails instead of
# hanging. The trainer is built in build/faults-paths/, this suite's own.
# Every check prints one line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

FSDPC=${FSDPC:-build/fsdpc}
chardev() { [ -c "$1" ]; }

# ── fsdpc: -o and --trace ──
if [ -x "$FSDPC" ]; then
    timeout 60 "$FSDPC" examples/tiny.fsd --dump-plan -o /dev/null --trace /dev/null >"$TMP/out" 2>&1
    check "fsdpc: -o /dev/null --trace /dev/null: exit 0, both still character devices" \
        '[ $? = 0 ] && chardev /dev/null' "$TMP/out"
    timeout 60 "$FSDPC" examples/tiny.fsd -o /dev/null >"$TMP/out" 2>&1
    check "fsdpc: train.cu to -o /dev/null: exit 0, /dev/null still a character device" \
        '[ $? = 0 ] && chardev /dev/null' "$TMP/out"
    timeout 60 "$FSDPC" examples/tiny.fsd --dump-plan -o /dev/full >"$TMP/out" 2>&1
    check "fsdpc: --dump-plan -o /dev/full: exit 1, says the write failed" \
        '[ $? = 1 ] && grep -q "fsdpc: cannot write /dev/full: No space left on device" "$TMP/out" && chardev /dev/full' "$TMP/out"
    timeout 60 "$FSDPC" examples/tiny.fsd --dump-plan --trace /dev/full -o "$TMP/plan.txt" >"$TMP/out" 2>&1
    check "fsdpc: --trace /dev/full: exit 1, says the write failed, leaves no -o file" \
        '[ $? = 1 ] && grep -q "fsdpc: cannot write /dev/full: No space left on device" "$TMP/out" && [ ! -e "$TMP/plan.txt" ] && chardev /dev/full' "$TMP/out"
    timeout 60 "$FSDPC" examples/tiny.fsd --dump-plan >/dev/full 2>"$TMP/out"
    check "fsdpc: --dump-plan to a full standard output: exit 1, says so" \
        '[ $? = 1 ] && grep -q "cannot write standard output: No space left on device" "$TMP/out"' "$TMP/out"
    for what in -o --trace; do
        mkfifo "$TMP/fifo"
        timeout 20 cat "$TMP/fifo" >"$TMP/read" &
        reader=$!
        if [ $what = -o ]; then args=(--dump-plan -o "$TMP/fifo"); else args=(--dump-plan -o /dev/null --trace "$TMP/fifo"); fi
        timeout 20 "$FSDPC" examples/tiny.fsd "${args[@]}" >"$TMP/out" 2>&1
        st=$?
        wait $reader
        check "fsdpc: $what a FIFO with a reader: exit 0, the reader gets the output, the FIFO stays one" \
            '[ $st = 0 ] && [ -p "$TMP/fifo" ] && [ -s "$TMP/read" ] && ! ls "$TMP"/fifo.tmp.* >/dev/null 2>&1' "$TMP/out"
        rm -f "$TMP/fifo"
    done
else
    bad "fsdpc: $FSDPC not built (make)"
fi

# ── the trainer ──
need_tools "trainer path tests" mpicc mpirun python3 truncate mkfifo timeout
build_trainer "build: make trainer FSD=examples/tiny.fsd" trainer FSD=examples/tiny.fsd \
    BACKEND=cpu TRAINER=build/faults-paths/tiny || done_
ok "build: tiny's trainer without warnings"

TINY=build/faults-paths/tiny/train
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 60 "${MPIRUN[@]}" -np "$w" "$@"; }
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 20000 >/dev/null
RUN=(--steps 3 --micro-batch 1 --grad-accum 2 --quiet)
lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
wait_for() { while ! eval "$1" && kill -0 "$2" 2>/dev/null; do sleep 0.05; done; }

# outputs on devices and FIFOs
mp 2 $TINY --data "$D" "${RUN[@]}" --log /dev/null --trace-out /dev/null --resume auto \
    --ckpt-dir "$TMP/ck" >"$TMP/out" 2>&1
check "train: --log /dev/null --trace-out /dev/null (--resume auto, a fresh start): exit 0, /dev/null still a device" \
    '[ $? = 0 ] && chardev /dev/null' "$TMP/out"
mp 2 $TINY --data "$D" "${RUN[@]}" --export /dev/null >"$TMP/out" 2>&1
st=$?
check "train: --export /dev/null: refused at start-up (exit $st), naming it; /dev/null still a device" \
    '[ $st != 0 ] && [ $st != 124 ] && grep -qF -- "--export /dev/null is not a regular file (a device or socket)" "$TMP/out" && chardev /dev/null' "$TMP/out"
mkfifo "$TMP/wfifo"
mp 2 $TINY --steps 0 --export "$TMP/wfifo" >"$TMP/out" 2>&1
st=$?
check "train: --export FIFO: refused (exit $st, no hang), the FIFO stays one" \
    '[ $st != 0 ] && [ $st != 124 ] && grep -qF -- "--export $TMP/wfifo is not a regular file (a FIFO)" "$TMP/out" && [ -p "$TMP/wfifo" ] && ! ls "$TMP"/wfifo.tmp.* >/dev/null 2>&1' "$TMP/out"
echo "not a directory" >"$TMP/ckfile"
mp 2 $TINY --data "$D" "${RUN[@]}" --ckpt-dir "$TMP/ckfile" --ckpt-every 1 >"$TMP/out" 2>&1
st=$?
check "train: --ckpt-dir naming a file: refused at start-up, saying it is not a directory; the file untouched" \
    '[ $st != 0 ] && [ $st != 124 ] && grep -qF -- "--ckpt-dir $TMP/ckfile is not a directory (a file)" "$TMP/out" && [ "$(cat "$TMP/ckfile")" = "not a directory" ]' "$TMP/out"
mp 2 $TINY --data "$D" "${RUN[@]}" --ckpt-dir "$TMP/ckfile" >"$TMP/out" 2>&1
st=$?
check "train: ... with checkpoints off too (a signal's stop would save there)" \
    '[ $st != 0 ] && [ $st != 124 ] && grep -qF -- "--ckpt-dir $TMP/ckfile is not a directory" "$TMP/out"' "$TMP/out"

# inputs that are FIFOs: refused at open, not waited on
mkfifo "$TMP/rfifo"
for flag in --data --val-data --init-from; do
    case $flag in
    --data) args=(--data "$TMP/rfifo") want="data file $TMP/rfifo is not a regular file (a FIFO)" ;;
    --val-data) args=(--data "$D" --val-data "$TMP/rfifo") want="data file $TMP/rfifo is not a regular file (a FIFO)" ;;
    --init-from) args=(--data "$D" --init-from "$TMP/rfifo") want="--init-from file $TMP/rfifo is not a regular file (a FIFO)" ;;
    esac
    SECONDS=0
    timeout 20 "${MPIRUN[@]}" -np 2 $TINY "${args[@]}" "${RUN[@]}" >"$TMP/out" 2>&1
    st=$?
    check "train: $flag FIFO: refused at once (exit $st in ${SECONDS} s), naming it" \
        '[ $st != 0 ] && [ $st != 124 ] && grep -qF -- "$want" "$TMP/out" && [ -p "$TMP/rfifo" ]' "$TMP/out"
done

# a data file truncated during a run (slowed; truncated once step 1 is logged)
truncated() {
    local name=$1 size=$2 pid
    shift 2
    cp "$D" "$TMP/$name.bin"
    env FSD_TEST_STEP_SLEEP_MS=300 "$@" timeout 60 "${MPIRUN[@]}" -np 2 $TINY --data "$TMP/$name.bin" --steps 50 --micro-batch 1 \
        --grad-accum 2 --quiet --log "$TMP/$name.json" >"$TMP/$name.out" 2>&1 &
    pid=$!
    wait_for '[ "$(lines "$TMP/$name.json")" -ge 2 ]' $pid
    truncate -s "$size" "$TMP/$name.bin"
    wait $pid
    st=$?
    n=$(lines "$TMP/$name.json")
}
truncated shrink 20000
check "train: data file truncated mid-run: exit $st (not 0, no hang), before step 50, saying it changed and its sizes" \
    '[ $st != 0 ] && [ $st != 124 ] && [ "$n" -lt 50 ] && grep -qF "data file $TMP/shrink.bin changed under the run (size 41024 -> 20000 bytes)" "$TMP/shrink.out"' "$TMP/shrink.out"
truncated sigbus 0 FSD_TEST_DATA_NO_RECHECK=1
check "train: ... with the check off, the SIGBUS reading the lost pages: exit $st (not 0, no hang), naming the file" \
    '[ $st != 0 ] && [ $st != 124 ] && [ "$n" -lt 50 ] && grep -qF "data file $TMP/sigbus.bin changed under the run: part of its mapping is gone (SIGBUS" "$TMP/sigbus.out"' "$TMP/sigbus.out"

done_
