#!/usr/bin/env bash
# sanitize.sh — the CPU runtime and its trainers under AddressSanitizer and
# UBSan (`make trainer ... RT_SAN=1`, build/runtime-san): tiny and
# tiny_llama, 6 steps of 6 sequences each, on 1 rank (started alone, MPI's
# singleton), 2 and 3 ranks (mpirun), with checkpoints, and an evaluation on
# 7 validation sequences after every second step:
#
#   - 1 rank and 2 ranks, saving at step 3; 2 ranks resumed from it on 2
#     ranks, and on 3 (resharded 2 → 3, saving again at the end on 3);
#   - no run has a sanitizer report: ASan, UBSan and LeakSanitizer stop the
#     process at the first, exit 86, and none is printed; Open MPI's own
#     leaks at exit are suppressed by library (tests/faults/lsan.supp);
#   - every run's losses and lrs are the ordinary build's (the same run
#     with build/faults-san/plain/*, -O2) to 1e-6 relative: the sanitizer
#     build is -O1 and may round differently;
#   - the resumed runs give the uninterrupted run's steps 3-5: on 2 ranks
#     exactly, on 3 to 1e-5.
#
# Trainers go to build/faults-san/ (this suite's own). Every check prints one
# line; the last is "N passed, N failed". About a minute on 2 cores.
set -u
cd "$(dirname "$0")/../.."

MAKE=${MAKE:-make}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
SHOW_LINES=30
. tests/lib.sh

need_tools "sanitizer tests" mpicc mpirun python3
MODELS="tiny tiny_llama"
[ -x build/fsdata ] || $MAKE --no-print-directory -s build/fsdata >/dev/null
for m in $MODELS; do
    for v in san plain; do
        out=build/faults-san/$m; flags=(RT_SAN=1)
        [ $v = plain ] && out=build/faults-san/plain/$m && flags=()
        if ! $MAKE --no-print-directory -s trainer FSD=examples/$m.fsd "${flags[@]}" TRAINER=$out \
                >"$TMP/build" 2>&1 || grep -q "warning:" "$TMP/build"; then
            bad "build: $m ($v) (errors or warnings)" "$TMP/build"
            done_
        fi
    done
done
ok "build: tiny and tiny_llama with RT_SAN=1 and without, no warnings"
# the trainer and every object of the runtime are instrumented (a build that
# quietly dropped the flags would pass every check below): every object
# calls ASan and was compiled with both sanitizers (its DWARF producer line
# records the flags; an object with nothing UBSan checks, such as blas.c's
# calls into oneDNN, calls no UBSan handler), and the library and the
# trainers call UBSan's handlers
# objects of LIB that call PREFIX (__asan_, __ubsan_)
calling() { nm -A "$1" 2>/dev/null | grep -F " U $2" | cut -d: -f2 | sort -u | wc -l; }
# objects of LIB compiled with -fsanitize=address,undefined
flagged() {
    readelf --debug-dump=info "$1" 2>/dev/null |
        grep "DW_AT_producer" | grep -c -- "-fsanitize=address,undefined"
}
L=build/runtime-san/libfsdrt_cpu.a
check "build: every object of $L calls ASan and was built with ASan and UBSan; it and the trainers call UBSan" \
    '[ "$(calling $L __asan_)" = "$(ar t $L | wc -l)" ] && [ "$(flagged $L)" = "$(ar t $L | wc -l)" ] &&
     [ "$(calling $L __ubsan_)" -gt 0 ] &&
     ( for m in $MODELS; do nm build/faults-san/$m/train | grep -q __ubsan_handle &&
         nm build/faults-san/$m/train | grep -q __asan_init || exit 1; done )'

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
SAN_ENV=(ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:exitcode=86:fast_unwind_on_malloc=0
         LSAN_OPTIONS=suppressions=$PWD/tests/faults/lsan.supp
         UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86)
REPORT='ERROR: (Address|Leak)Sanitizer|runtime error:|(Address|UndefinedBehavior)Sanitizer'
D=$TMP/data.bin
build/fsdata synth "$D" --tokens 20000 >/dev/null
build/fsdata synth "$TMP/val.bin" --tokens 2000 --seed 9 >/dev/null
# 6 sequences a step on 1, 2 and 3 ranks; evaluation in chunks of 6, 3 and 2
RUN=(--data "$D" --steps 6 --grad-accum 1 --quiet --val-data "$TMP/val.bin" --eval-every 2
     --eval-sequences 7)

# go BUILD NAME W ARGS...: the trainer of BUILD (san, plain) on W ranks (1:
# started alone), its output in $TMP/NAME.BUILD.out and its log in
# $TMP/NAME.BUILD.json; its status in $st
go() {
    local b=$1 name=$2 w=$3 t=build/faults-san/$m/train
    shift 3
    [ $b = plain ] && t=build/faults-san/plain/$m/train
    local cmd=("$t" "${RUN[@]}" --micro-batch $((6 / w)) --log "$TMP/$name.$b.json" "$@")
    [ $w -gt 1 ] && cmd=("${MPIRUN[@]}" -np $w "${cmd[@]}")
    env "${SAN_ENV[@]}" timeout 120 "${cmd[@]}" >"$TMP/$name.$b.out" 2>&1
    st=$?
}
# close A B FIRST LAST TOL: B logs steps FIRST..LAST, each with A's lr and A's
# loss to TOL relative
close() {
    python3 - "$@" <<'PY'
import json, sys
a = {x["step"]: x for x in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
first, last, tol = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
bad = [x for x in b if x["step"] not in a or x["lr"] != a[x["step"]]["lr"] or
       abs(x["loss"] - a[x["step"]]["loss"]) > tol * abs(a[x["step"]]["loss"])]
steps = [x["step"] for x in b]
if steps != list(range(first, last + 1)) or bad:
    print("steps", steps, "differing", bad)
    sys.exit(1)
PY
}
losses() { sed -E 's/^(\{"step": [0-9]+, "loss": [^,]+, "lr": [^,]+).*/\1/' "$@"; }
steps_from() { awk -v k="$2" -F'[:,]' '$2 + 0 >= k' "$1"; }

# run NAME W FIRST ARGS...: NAME in both builds; the sanitizer build's run is
# clean and its steps FIRST-5 are the ordinary build's to 1e-6
run() {
    local name=$1 w=$2 first=$3 what
    shift 3
    what="$m, $w rank$([ $w = 1 ] || echo s) ($name)"
    go plain "$name" "$w" "$@" --ckpt-dir "$TMP/$m.$name.plain.ck"
    [ $st = 0 ] || bad "$what: the ordinary build's run failed (status $st)" "$TMP/$name.plain.out"
    go san "$name" "$w" "$@" --ckpt-dir "$TMP/$m.$name.ck"
    check "$what: exit 0, no sanitizer report" \
        "[ $st = 0 ] && ! grep -Eq '$REPORT' '$TMP/$name.san.out'" "$TMP/$name.san.out"
    close "$TMP/$name.plain.json" "$TMP/$name.san.json" "$first" 5 1e-6 >"$TMP/cmp" 2>&1
    check "$what: steps $first-5, the ordinary build's losses and lrs to 1e-6" '[ $? = 0 ]' "$TMP/cmp"
}

for m in $MODELS; do
    run a1 1 0 --ckpt-every 3
    run a2 2 0 --ckpt-every 3
    check "$m: a checkpoint at step 3 on 1 and on 2 ranks" \
        "[ -f '$TMP/$m.a1.ck/step_000003/meta.json' ] && [ -f '$TMP/$m.a2.ck/step_000003/meta.json' ]"
    run r2 2 3 --resume "$TMP/$m.a2.ck/step_000003"
    check "$m: resumed at step 3 on 2 ranks: steps 3-5 exactly the uninterrupted run's" \
        '[ "$(losses "$TMP/r2.san.json")" = "$(steps_from "$TMP/a2.san.json" 3 | losses)" ]'
    # resharded 2 → 3 (the groups pad on 3 ranks), saving again on 3
    run r3 3 3 --resume "$TMP/$m.a2.ck/step_000003" --ckpt-every 3
    close "$TMP/a2.san.json" "$TMP/r3.san.json" 3 5 1e-5 >"$TMP/cmp" 2>&1
    check "$m: resumed at step 3 on 3 ranks (resharded): steps 3-5 the uninterrupted run's to 1e-5, saved at step 6" \
        "[ \$? = 0 ] && [ -f '$TMP/$m.r3.ck/step_000006/meta.json' ]" "$TMP/cmp"
done

done_
