#!/usr/bin/env bash
# run.sh — per-target mixed precision on the CPU build
# (docs/design.md#per-target-mixed-precision): tiny trained on 2 MPI ranks
# (and 3, for uneven shards) with `mixed_precision(...)` on some of its
# fully_shard lines.
#
#   1. the same setting written per target on every line as written once in
#      the shard section trains to the same losses, bit for bit, moving the
#      same bytes: a bf16 program with reduce = fp32 on blocks[*] and on root
#      against the shard section's mixed_precision(param = bf16, reduce = fp32);
#   2. reduce = fp32 on the blocks only (the root reduces in bf16) is a run
#      of its own: its losses differ from both the all-bf16 and the all-fp32
#      reduce runs (so each group used its own dtype) and stay within 1e-3
#      of them, and it reduce-scatters more bytes than the first and fewer
#      than the second;
#   3. an fp32 program whose blocks gather in bf16 (param = bf16 on
#      blocks[*]: widened to fp32 after the gather, computed in fp32) stays
#      within 1e-3 of fp32 and differs from it, all-gathering fewer bytes;
#   4. every run's bytes each step and its memory peak are fsdpc's plan for
#      the same world, exactly (its schedule's bytes per group dtype, its
#      memory plan's buffers per group dtype);
# and the model hash covers a group's own all-gather dtype, not its reduce
# dtype.
#
# Trainers and .fsd variants go to build/mixed/. Every test prints one
# line; the last line is "N passed, N failed".
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
OUT=build/mixed
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

need_tools "mixed precision tests" mpicc mpirun python3
t0=$(date +%s)
mkdir -p $OUT
build_base
FSDPC=build/fsdpc
CHECK="python3 tests/e2e/check.py"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mp() { local w=$1; shift; timeout 120 "${MPIRUN[@]}" -np "$w" "$@"; }

# the variants: tiny (2 blocks, then the root) with B 2 and one micro-batch
# per step, and the mixed precision each names
base() { sed 's/micro_batch *= *[0-9]*/micro_batch = 2/; s/grad_accum *= *[0-9]*/grad_accum = 1/' examples/tiny.fsd; }
shard16='s/^shard {/shard {\n  mixed_precision(param = bf16, reduce = bf16)/'
base >$OUT/fp32.fsd
base | sed "$shard16" >$OUT/bf16.fsd
base | sed 's/^shard {/shard {\n  mixed_precision(param = bf16, reduce = fp32)/' >$OUT/bf16_fp32.fsd
base | sed "$shard16; s/fully_shard blocks\[\*\]/fully_shard blocks[*] (mixed_precision(reduce = fp32))/; s/fully_shard root/fully_shard root (mixed_precision(reduce = fp32))/" >$OUT/every.fsd
base | sed "$shard16; s/fully_shard blocks\[\*\]/fully_shard blocks[*] (mixed_precision(reduce = fp32))/" >$OUT/some.fsd
base | sed 's/fully_shard blocks\[\*\]/fully_shard blocks[*] (mixed_precision(param = bf16))/' >$OUT/gather16.fsd
# the per-target lines must be there, or the runs below prove nothing
for v in every some gather16; do
    grep -q "(mixed_precision(" $OUT/$v.fsd || { bad "variant $v: tiny's fully_shard lines not found"; done_; }
done
VARIANTS=(fp32 bf16 bf16_fp32 every some gather16)
built=0
for v in "${VARIANTS[@]}"; do
    build_trainer "build: $v" trainer FSD=$OUT/$v.fsd BACKEND=cpu TRAINER=$OUT/$v && built=$((built + 1))
done
[ $built = ${#VARIANTS[@]} ] || done_
ok "build: ${#VARIANTS[@]} trainers without warnings ($(($(date +%s) - t0)) s)"

D=$TMP/data.bin
build/fsdata synth "$D" --tokens 60000 --seed 3 >/dev/null
# run V W: 10 steps of V on W ranks, and fsdpc's dumps for the same world
run() {
    local v=$1 w=$2
    mp $w $OUT/$v/train --data "$D" --steps 10 --log "$TMP/$v.w$w.log" --quiet >"$TMP/$v.w$w.out" 2>&1 ||
        { bad "$v on $w ranks: status $?" "$TMP/$v.w$w.out"; return 1; }
    $FSDPC $OUT/$v.fsd --world $w --dump-schedule >"$TMP/$v.w$w.sched" 2>&1 &&
        $FSDPC $OUT/$v.fsd --world $w --dump-schedule=json >"$TMP/$v.w$w.json" 2>&1 &&
        $FSDPC $OUT/$v.fsd --world $w --dump-memory >"$TMP/$v.w$w.mem" 2>&1 ||
        { bad "$v: fsdpc dumps at world $w" "$TMP/$v.w$w.sched"; return 1; }
}
bytes_of() { python3 -c "import json,sys; s=json.loads(open(sys.argv[1]).readline()); print(s['gather_bytes'], s['reduce_bytes'])" "$1" 2>/dev/null; }

for v in "${VARIANTS[@]}"; do run $v 2; done
run some 3
run gather16 3

# ── 1. per target on every line = the shard section's setting ──
if res=$($CHECK losses "$TMP/bf16_fp32.w2.log" "$TMP/every.w2.log" 0); then
    ok "reduce = fp32 on every fully_shard line = in the shard section, bit for bit: $res"
else bad "reduce = fp32 on every line vs the shard section's: $res"; fi
read -r ge re <<<"$(bytes_of "$TMP/every.w2.log")"
read -r gs rs <<<"$(bytes_of "$TMP/bf16_fp32.w2.log")"
check "reduce = fp32 on every line moves the shard section's bytes (${ge:-?}/${re:-?} vs ${gs:-?}/${rs:-?})" \
    '[ -n "${ge:-}" ] && [ "$ge" = "${gs:-}" ] && [ "$re" = "${rs:-}" ]'

# ── 2. fp32 reduce on the blocks only ──
for other in bf16 bf16_fp32; do
    if res=$($CHECK losses "$TMP/$other.w2.log" "$TMP/some.w2.log" 1e-3 1e-7); then
        ok "reduce = fp32 on blocks[*] only, against the $other run: close and not the same: $res"
    else bad "reduce = fp32 on blocks[*] only, against the $other run: $res"; fi
done
read -r _ r16 <<<"$(bytes_of "$TMP/bf16.w2.log")"
read -r _ rso <<<"$(bytes_of "$TMP/some.w2.log")"
check "reduce = fp32 on blocks[*] only: reduce-scatters ${rso:-?} bytes a step, between all-bf16's ${r16:-?} and all-fp32's ${rs:-?}" \
    '[ -n "${rso:-}" ] && [ -n "${r16:-}" ] && [ -n "${rs:-}" ] && [ "$r16" -lt "$rso" ] && [ "$rso" -lt "$rs" ]'

# ── 3. an fp32 program whose blocks gather in bf16 ──
if res=$($CHECK losses "$TMP/fp32.w2.log" "$TMP/gather16.w2.log" 1e-3 1e-7); then
    ok "param = bf16 on blocks[*] of an fp32 program, against fp32: close and not the same: $res"
else bad "param = bf16 on blocks[*] of an fp32 program, against fp32: $res"; fi
read -r g32 _ <<<"$(bytes_of "$TMP/fp32.w2.log")"
read -r g16 _ <<<"$(bytes_of "$TMP/gather16.w2.log")"
check "param = bf16 on blocks[*]: all-gathers ${g16:-?} bytes a step, fewer than fp32's ${g32:-?}, more than half" \
    '[ -n "${g16:-}" ] && [ -n "${g32:-}" ] && [ "$g16" -lt "$g32" ] && [ $((g16 * 2)) -gt "$g32" ]'

# ── the model hash: a group's own all-gather dtype is in it, a reduce dtype
# is not (per target as shard-wide: checkpoints move between them) ──
hash_of() { $FSDPC $OUT/$1.fsd -o "$TMP/$1.cu" 2>/dev/null && sed -n 's|^ *0x\([0-9a-f]*\)ull,  /\* hash \*/|\1|p' "$TMP/$1.cu"; }
h32=$(hash_of fp32) h16=$(hash_of gather16) hb=$(hash_of bf16) hbf=$(hash_of bf16_fp32) hs=$(hash_of some)
check "model hash: param = bf16 on blocks[*] changes it (${h32:-?} vs ${h16:-?}); reduce = fp32 on blocks[*] does not (${hb:-?} = ${hs:-?} = ${hbf:-?})" \
    '[ -n "$h32" ] && [ -n "$h16" ] && [ "$h32" != "$h16" ] && [ -n "$hb" ] && [ "$hb" = "$hs" ] && [ "$hs" = "$hbf" ]'

# ── 4. the plan holds ──
for run in fp32.w2 bf16.w2 bf16_fp32.w2 every.w2 some.w2 gather16.w2 some.w3 gather16.w3; do
    [ -f "$TMP/$run.log" ] || continue
    if res=$($CHECK bytes "$TMP/$run.log" "$TMP/$run.sched" "$TMP/$run.json"); then
        ok "plan bytes $run: every step $res, as fsdpc --dump-schedule says"
    else bad "plan bytes $run: $res" "$TMP/$run.sched"; fi
    if res=$($CHECK memory "$TMP/$run.log" "$TMP/$run.mem"); then
        ok "plan memory $run: $res"
    else bad "plan memory $run: $res" "$TMP/$run.mem"; fi
done
done_
