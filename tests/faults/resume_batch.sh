#!/usr/bin/env bash
# resume_batch.sh — resuming with another global batch (docs/design.md#data-order,
# docs/checkpoint.md, "What a checkpoint holds"): a checkpoint records the
# next sequence of the data order (meta.json's data.next_seq), and a run
# resumed from it goes on from that sequence whatever its G (micro-batch x
# grad-accum x world), so no sequence is skipped or repeated; the log's
# first_seq says where each step started. A resume with the same G is still
# the straight run, loss for loss and state for state. A checkpoint without
# next_seq (an older fsdpc's) goes on at step x its recorded G, with a note.
#
# Tiny on 2 ranks (and 1), one OpenMP thread each; trainers in
# build/faults-seq/. About 30 s on 2 cores.
# Every check prints one line; the last is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=20
. tests/lib.sh

need_tools "resume-batch fault tests" mpicc mpirun python3
build_trainer "build: make trainer FSD=examples/tiny.fsd" build/fsdata trainer FSD=examples/tiny.fsd \
    BACKEND=cpu TRAINER=build/faults-seq/tiny || done_

TINY=build/faults-seq/tiny/train
READ="python3 tests/ckpt/read_ckpt.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local n=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$n" "$@"; }
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 30000 >/dev/null
T=64   # tiny's seq
# G = 2 on 2 ranks; --grad-accum 3 makes it 6, 1 rank makes it 1
RUN=(--data "$D" --micro-batch 1 --grad-accum 1 --quiet)

# first_seq of every step in a log, and the lines with the timings cut
seqs() { python3 -c 'import json, sys; print(" ".join(str(json.loads(l)["first_seq"]) for l in open(sys.argv[1])))' "$1"; }
steps() {
    python3 -c 'import json, sys
for l in open(sys.argv[1]):
    x = json.loads(l)
    print(x["step"], repr(x["loss"]), repr(x["lr"]), repr(x["grad_norm"]), x["first_seq"])' "$1"
}
loss_of() { python3 -c 'import json, sys; print(repr([json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2])]["loss"]))' "$1" "$2"; }
# shifted IN OUT K: IN without its first K sequences (K·T tokens): its
# sequence j is IN's sequence K + j
shifted() {
    python3 -c 'import struct, sys
src, dst, k = sys.argv[1], sys.argv[2], int(sys.argv[3]) * int(sys.argv[4])
b = open(src, "rb").read()
h = list(struct.unpack_from("<256i", b, 0))
w = 2 if h[1] == 1 else 4
h[2] -= k
open(dst, "wb").write(struct.pack("<256i", *h) + b[1024 + k * w:])' "$1" "$2" "$3" "$T"
}
copy_ckpt() { mkdir -p "$2" && cp -r "$1" "$2/" && basename "$1" >"$2/latest"; }

# ── the straight run, and its first 2 steps with a checkpoint ──
mp 2 $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$TMP/straight" --ckpt-every 4 --log "$TMP/straight.json" \
    >"$TMP/out" 2>&1 || bad "straight run of 4 steps" "$TMP/out"
check "a straight run at G = 2 logs first_seq 0 2 4 6" '[ "$(seqs "$TMP/straight.json")" = "0 2 4 6" ]' "$TMP/straight.json"
K=$TMP/k
mp 2 $TINY "${RUN[@]}" --steps 2 --ckpt-dir "$K" --ckpt-every 2 --export "$TMP/w2.st" --log "$TMP/first.json" \
    >"$TMP/out" 2>&1 || bad "2 steps with a checkpoint" "$TMP/out"
check "the checkpoint after 2 steps at G = 2 records next_seq 4 (and verifies)" \
    '$READ verify "$K/step_000002" >"$TMP/v" 2>&1 && [ "$($READ next-seq "$K/step_000002")" = 4 ] && grep -q "\"next_seq\": 4," "$K/step_000002/meta.json"' "$TMP/v"

# ── the same G: the straight run, bit for bit ──
copy_ckpt "$K/step_000002" "$TMP/same"
mp 2 $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$TMP/same" --ckpt-every 4 --resume --log "$TMP/same.json" \
    >"$TMP/out" 2>&1 || bad "resume at the same G" "$TMP/out"
cat "$TMP/first.json" "$TMP/same.json" >"$TMP/same.all"
check "resumed at the same G: steps 0-3 log the straight run's losses, norms and first_seq exactly" \
    '[ "$(steps "$TMP/same.all")" = "$(steps "$TMP/straight.json")" ] && ! grep -q "sequences a step" "$TMP/out"' "$TMP/out"
check "resumed at the same G: the step-4 checkpoint holds the straight run's state, bit for bit" \
    '$READ same-state "$TMP/same/step_000004" "$TMP/straight/step_000004" >"$TMP/v" 2>&1 && [ "$($READ next-seq "$TMP/same/step_000004")" = 8 ]' "$TMP/v"

# ── --grad-accum 3: G = 6 from sequence 4 on ──
copy_ckpt "$K/step_000002" "$TMP/ga3"
mp 2 $TINY "${RUN[@]}" --grad-accum 3 --steps 4 --ckpt-dir "$TMP/ga3" --ckpt-every 2 --resume \
    --log "$TMP/ga3.json" >"$TMP/out" 2>&1 || bad "resume at --grad-accum 3" "$TMP/out"
check "resumed at G = 6 (--grad-accum 3): steps 2 and 3 start at sequences 4 and 10, saying so once" \
    '[ "$(seqs "$TMP/ga3.json")" = "4 10" ] && [ "$(grep -c "train: note: checkpoint .*step_000002 was written taking 2 sequences a step; this run takes 6 (micro-batch x grad-accum x world), going on where the data stopped: step 2 reads sequences 4 to 9" "$TMP/out")" = 1 ]' "$TMP/out"
check "resumed at G = 6: the step-4 checkpoint records next_seq 16 and sequences_per_step 6" \
    '[ "$($READ next-seq "$TMP/ga3/step_000004")" = 16 ] && grep -q "\"next_seq\": 16, \"sequences_per_step\": 6," "$TMP/ga3/step_000004/meta.json"' \
    "$TMP/ga3/step_000004/meta.json"
# what step 2 read, from outside: the step-2 weights on the data less its
# first 4 sequences give the same loss (the old rule, 2 x 6, read 12 to 17)
shifted "$D" "$TMP/from4.bin" 4
mp 2 $TINY --data "$TMP/from4.bin" --micro-batch 1 --grad-accum 3 --quiet --steps 1 --init-from "$TMP/w2.st" \
    --log "$TMP/from4.json" >"$TMP/out" 2>&1 || bad "the step-2 weights on sequences 4 on" "$TMP/out"
check "resumed at G = 6: step 2's loss is that of the step-2 weights on sequences 4-9 ($(loss_of "$TMP/from4.json" 0))" \
    '[ "$(loss_of "$TMP/ga3.json" 0)" = "$(loss_of "$TMP/from4.json" 0)" ]' "$TMP/ga3.json"

# ── back to G = 2 from the G = 6 checkpoint: sequence 16 on ──
mp 2 $TINY "${RUN[@]}" --steps 6 --ckpt-dir "$TMP/ga3" --ckpt-every 2 --resume --log "$TMP/back.json" \
    >"$TMP/out" 2>&1 || bad "resume at G = 2 from the G = 6 checkpoint" "$TMP/out"
check "then resumed at G = 2 from step 4 (next_seq 16): steps 4 and 5 start at 16 and 18; step_000006 records 20" \
    '[ "$(seqs "$TMP/back.json")" = "16 18" ] && [ "$($READ next-seq "$TMP/ga3/step_000006")" = 20 ]' "$TMP/out"

# ── another world size: 1 rank, G = 1 ──
copy_ckpt "$K/step_000002" "$TMP/w1"
mp 1 $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$TMP/w1" --ckpt-every 4 --resume --log "$TMP/w1.json" \
    >"$TMP/out" 2>&1 || bad "resume on 1 rank" "$TMP/out"
mp 1 $TINY --data "$TMP/from4.bin" --micro-batch 1 --grad-accum 1 --quiet --steps 1 --init-from "$TMP/w2.st" \
    --log "$TMP/from4w1.json" >"$TMP/out2" 2>&1 || bad "the step-2 weights on sequence 4, 1 rank" "$TMP/out2"
check "resumed on 1 rank (G = 1): steps 2 and 3 start at sequences 4 and 5; step 2's loss is sequence 4's; step_000004 records 6" \
    '[ "$(seqs "$TMP/w1.json")" = "4 5" ] && [ "$(loss_of "$TMP/w1.json" 0)" = "$(loss_of "$TMP/from4w1.json" 0)" ] && [ "$($READ next-seq "$TMP/w1/step_000004")" = 6 ] && grep -q "this run takes 1 " "$TMP/out"' "$TMP/out"

# ── async saves record the position of the step they hold ──
mp 2 $TINY "${RUN[@]}" --steps 3 --ckpt-dir "$TMP/async" --ckpt-every 1 --ckpt-async >"$TMP/out" 2>&1 ||
    bad "3 steps saving asynchronously" "$TMP/out"
check "async saves after steps 0, 1, 2 record next_seq 2, 4, 6" \
    '[ "$(for s in 1 2 3; do $READ next-seq "$TMP/async/step_00000$s"; done | tr "\n" " ")" = "2 4 6 " ]' "$TMP/out"

# ── a checkpoint without next_seq (an older fsdpc's): step x its G ──
# (its sequences_per_step made 3 here, so the fallback shows: 2 x 3 = 6)
copy_ckpt "$K/step_000002" "$TMP/old"
O=$TMP/old/step_000002
sed -i 's/"next_seq": 4, "sequences_per_step": 2,/"sequences_per_step": 3,/' "$O/meta.json"
$READ seal "$O"
mp 2 $TINY "${RUN[@]}" --grad-accum 3 --steps 3 --ckpt-dir "$TMP/old" --ckpt-every 3 --resume \
    --log "$TMP/old.json" >"$TMP/out" 2>&1
st=$?
check "no next_seq: resumed at sequence step x its sequences_per_step (2 x 3 = 6), with a note" \
    '[ $st = 0 ] && [ "$(seqs "$TMP/old.json")" = 6 ] && grep -q "train: note: checkpoint .*step_000002 does not record its data position (data.next_seq: written by an older fsdpc); going on from sequence 6, step 2 x the 3 sequences a step it was written with" "$TMP/out" && [ "$($READ next-seq "$TMP/old/step_000003")" = 12 ]' "$TMP/out"

# ── a next_seq that is not a count is refused ──
copy_ckpt "$K/step_000002" "$TMP/neg"
sed -i 's/"next_seq": 4,/"next_seq": -4,/' "$TMP/neg/step_000002/meta.json"
$READ seal "$TMP/neg/step_000002"
mp 2 $TINY "${RUN[@]}" --steps 4 --ckpt-dir "$TMP/neg" --ckpt-every 4 --resume >"$TMP/out" 2>&1
st=$?
check "next_seq -4 is refused by both ranks, naming the field" \
    '[ $st != 0 ] && [ "$(grep -c "train: checkpoint .*step_000002: meta.json.s field data.next_seq is not a count of sequences" "$TMP/out")" = 2 ] && ! $READ verify "$TMP/neg/step_000002" >/dev/null 2>&1' "$TMP/out"

done_
