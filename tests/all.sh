#!/usr/bin/env bash
# all.sh — everything `make test` runs, with one total at the end; with
# --quick, what `make check` runs, the edit-build-test loop's subset.
#
# The parts (each a suite of its own, or a few checks):
#   docs      tools/check_doc_refs.sh: every docs/<file>.md#<anchor>
#             reference names an existing heading, and nothing cites an
#             outside design page by section number;
#   compiler  tests/run.sh against build/fsdpc (the ordinary build);
#   unit      build/test_schedule: the schedule verifier both ways;
#             build/test_pattern: a step planned as a pattern of
#             micro-batches (first, middle x (n - 2), last) against its full
#             expansion: events, memory, bytes and simulated time;
#   san       tests/run.sh again against build/san/fsdpc (ASan + UBSan),
#             where any sanitizer report fails the run;
#   fuzz      the libFuzzer target replays tests/fuzz/seeds and examples/,
#             then fuzzes for FUZZ_SMOKE_SECONDS, when clang with libFuzzer
#             is installed (otherwise it says it was skipped and why);
#   kernels   tests/kernels/run.sh: the kernel templates (finite
#             differences, reference formulas, the nvcc compile check);
#   runtime   tests/runtime/run.sh: the CPU runtime on 1-4 MPI ranks, fsdata;
#   ckpt      tests/ckpt/run.sh: checkpoints, resume, resharding, HF weights;
#   hf        tests/hf/run.sh: Hugging Face model directories against
#             transformers itself (from .venv, tools/venv.sh; without it the
#             transformers checks are skipped, saying why): fsdpc --from-hf,
#             BF16 shards imported, the first loss, the export loaded back;
#   faults    tests/faults/*.sh: a run under faults: non-finite steps,
#             --log on resume (nonfinite.sh); SIGTERM, SIGINT, SIGUSR1 and
#             --resume auto (signals.sh); the checkpoint directory: failed
#             saves, a crash mid-replacement, two runs, an edited meta.json
#             (ckptdir.sh); ranks started with different settings, a stopped
#             rank (ranks.sh); devices and FIFOs as outputs and inputs, a
#             data file changed under a run (paths.sh); resuming with another
#             global batch, from the next unseen sequence (resume_batch.sh);
#   rtsan     tests/faults/sanitize.sh: tiny and tiny_llama on 1-3 ranks with
#             checkpoints under ASan and UBSan, the runtime built with
#             RT_SAN=1;
#   install   tests/install/run.sh: a trainer built outside the repository;
#   cuda      tests/cuda/run.sh: the CUDA build without a GPU;
#   cudasim   tests/cudasim/run.sh: the CUDA backend's host code on a
#             simulated device, against the CPU build;
#   e2e       tests/e2e/run.sh: emitted trainers end to end;
#   mixed     tests/mixed/run.sh: per-target mixed precision, trainers
#             against the shard-wide setting and the plan's bytes and memory;
#   recompute tests/recompute/run.sh: trainers with activation
#             recomputation against the same models without it, bit for bit,
#             and their memory peaks against the plan;
#   oracle    tests/oracle/run.sh: PyTorch as the reference;
#   mesh      tests/mesh/run.sh: HSDP (replicate = R) on 4 and 6 ranks
#             against plain FSDP, its bytes per mesh dimension against the
#             plan, checkpoints across R;
#   eval      tests/eval/run.sh: evaluation (val_loss on any number of ranks,
#             against PyTorch, at its steps, after a resume) and the
#             learning-rate schedules against torch.optim.lr_scheduler;
#   simcheck  tests/simcheck/run.sh (make sim-check): the simulator's
#             predictions against published runs, each within +-25%, and
#             tools/calibrate.py on a CPU trainer's trace;
#   data      tests/data/run.sh: token shards read by pattern, --shuffle
#             at any world size and resumed, tools/fstokens.py (with
#             .venv: a BPE trained, text tokenized and decoded back) and the
#             README's walk from a config.json and a corpus to a model
#             from_pretrained loads;
#   smoke     tests/smoke/run.sh: tiny's trainer on 1 and 2 ranks, resumed
#             from a checkpoint (--quick only: runtime, ckpt and e2e hold
#             all of it and more).
#
#   tests/all.sh            every part but smoke (make test);
#   tests/all.sh --quick    docs, compiler, unit, san and smoke (make check): the
#                           whole compiler suite, twice, and one trainer,
#                           about a minute on two idle cores;
#   tests/all.sh --serial   every part but smoke, one after another, each
#                           printed as it runs (for a machine with one core,
#                           or to time the parts alone).
#
# The parts run side by side, in lanes: a lane's parts run one after
# another, because they share build outputs (compiler and san both write
# build/errors/; ...). Parts in different lanes share nothing they write:
# the shared builds (build/fsdata, build/runtime's libraries) are made
# before the lanes start, and each suite builds its trainers in a folder of
# its own (build/ckpt, build/hf, build/faults*, build/oracle, build/e2e, build/mesh, build/smoke,
# build/kernels, build/recompute, build/mixed, build/eval; build/<model>/cpu and cudasim are cudasim's,
# build/<model>/cuda cuda's).
# Each part writes to its own log and scratch folder; its lines are printed
# as one block, under a header with its time, when it finishes.
#
# `make test` builds build/fsdpc, build/test_schedule, build/test_pattern and
# build/san/fsdpc first; this script builds the rest. Like run.sh, every test
# prints one line and the last line is "N passed, N failed", here summed over
# all parts.
set -u
cd "$(dirname "$0")/.."

MAKE=${MAKE:-make}
FUZZ_SMOKE_SECONDS=${FUZZ_SMOKE_SECONDS:-20}
mode=parallel
case "${1:-}" in
"") ;;
--quick) mode=quick ;;
--serial) mode=serial ;;
*) echo "usage: tests/all.sh [--quick | --serial]" >&2; exit 2 ;;
esac
TOP=$(mktemp -d)
trap 'rm -rf "$TOP"' EXIT
TMP=$TOP
. tests/lib.sh

# ── the parts: each runs in a subshell with its own $TMP and counters ──
part_docs() { suite "docs: " tools/check_doc_refs.sh; }

part_compiler() { suite "" env FSDPC=build/fsdpc tests/run.sh; }

part_unit() {
    suite "unit: " build/test_schedule examples/*.fsd tests/plan/*.fsd tests/mesh/tiny_hsdp.fsd
    suite "unit: " build/test_pattern examples/tiny.fsd examples/gpt2.fsd examples/mlp.fsd \
        examples/tiny_llama.fsd tests/plan/*.fsd
}

# Any report makes fsdpc exit with status 86. run.sh checks most statuses
# itself, but not all (pipelines, 2>/dev/null), so run.sh calls fsdpc through
# a wrapper that also notes every status 86; one note fails the run.
# LeakSanitizer is on: the arena stays reachable until exit, so only memory
# that escaped it is reported.
part_san() {
    cat >"$TMP/fsdpc-san" <<WRAP
#!/bin/sh
"$PWD/build/san/fsdpc" "\$@"
st=\$?
[ \$st = 86 ] && echo "fsdpc \$*" >>"$TMP/san-reports"
exit \$st
WRAP
    chmod +x "$TMP/fsdpc-san"
    suite "san: " env FSDPC="$TMP/fsdpc-san" SANITIZE=1 \
        ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:exitcode=86" \
        UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=86" \
        tests/run.sh
    if [ -s "$TMP/san-reports" ]; then
        bad "san: sanitizer reports (status 86) from:" "$TMP/san-reports"
    else
        ok "san: no sanitizer reports"
    fi
}

# Every seed and example is run first (a crash there is a regression), then
# new inputs are tried for a bounded time with a fixed seed.
part_fuzz() {
    local fuzz_skip="" st runs
    if ! command -v "${FUZZ_CC:-clang}" >/dev/null 2>&1; then
        fuzz_skip="${FUZZ_CC:-clang} not found"
    elif ! printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }\n' |
            "${FUZZ_CC:-clang}" -fsanitize=fuzzer -x c - -o "$TMP/probe" >/dev/null 2>&1; then
        fuzz_skip="${FUZZ_CC:-clang} cannot link libFuzzer (-fsanitize=fuzzer)"
    fi
    if [ -n "$fuzz_skip" ]; then
        echo "skip fuzz smoke test: $fuzz_skip; install clang and libclang-rt-dev (tools/setup.sh does, as root)"
    elif ! $MAKE --no-print-directory -s build/fuzz/fuzz_frontend >"$TMP/build" 2>&1; then
        bad "fuzz: cannot build build/fuzz/fuzz_frontend" "$TMP/build"
    else
        rm -rf build/fuzz/smoke
        mkdir -p build/fuzz/smoke/corpus
        build/fuzz/fuzz_frontend -timeout=5 -rss_limit_mb=2048 -max_len=8192 \
            -dict=tests/fuzz/fsd.dict -artifact_prefix=build/fuzz/smoke/ -seed=1 \
            -max_total_time="$FUZZ_SMOKE_SECONDS" build/fuzz/smoke/corpus tests/fuzz/seeds examples \
            >"$TMP/fuzz" 2>&1
        st=$?
        runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$TMP/fuzz")
        if [ $st = 0 ] && [ -n "$runs" ]; then
            ok "fuzz: seeds and examples, then ${FUZZ_SMOKE_SECONDS}s of fuzzing ($runs inputs)"
        else
            grep -v '^#[0-9]' "$TMP/fuzz" | tail -n 40 >"$TMP/fuzz.tail"
            bad "fuzz: status $st; the input is in build/fuzz/smoke/ (add it to tests/fuzz/seeds once fixed)" "$TMP/fuzz.tail"
        fi
    fi
}

part_kernels() { suite "" tests/kernels/run.sh; }
part_runtime() { suite "runtime: " env MAKE="$MAKE" tests/runtime/run.sh; }
part_ckpt()    { suite "ckpt: " env MAKE="$MAKE" tests/ckpt/run.sh; }
part_hf()      { suite "hf: " env MAKE="$MAKE" tests/hf/run.sh; }
part_faults() {
    local s
    for s in nonfinite signals ckptdir ranks paths resume_batch; do
        suite "faults: " env MAKE="$MAKE" tests/faults/$s.sh
    done
}
part_install() { suite "" tests/install/run.sh; }
part_cuda()    { suite "" env MAKE="$MAKE" tests/cuda/run.sh; }
part_cudasim() { suite "" env MAKE="$MAKE" tests/cudasim/run.sh; }
part_e2e()     { suite "e2e: " env MAKE="$MAKE" tests/e2e/run.sh; }
part_recompute() { suite "recompute: " env MAKE="$MAKE" tests/recompute/run.sh; }
part_mixed()   { suite "mixed: " env MAKE="$MAKE" tests/mixed/run.sh; }
part_oracle()  { suite "oracle: " env MAKE="$MAKE" tests/oracle/run.sh; }
part_mesh()    { suite "mesh: " env MAKE="$MAKE" tests/mesh/run.sh; }
part_eval()    { suite "eval: " env MAKE="$MAKE" tests/eval/run.sh; }
part_data()    { suite "data: " env MAKE="$MAKE" tests/data/run.sh; }
part_rtsan()   { suite "rtsan: " env MAKE="$MAKE" tests/faults/sanitize.sh; }
part_smoke()   { suite "" env MAKE="$MAKE" tests/smoke/run.sh; }
part_simcheck() { suite "" env MAKE="$MAKE" tests/simcheck/run.sh; }

# ── running them ──
# run_part NAME: part_NAME in a subshell, its lines to $TOP/NAME.out; then
# its counts and seconds to $TOP/NAME.counts, and $TOP/NAME.done last.
run_part() {
    local name=$1 start=$SECONDS
    mkdir -p "$TOP/$name"
    (
        TMP=$TOP/$name pass=0 fail=0
        "part_$name"
        echo "$pass $fail" >"$TOP/$name.counts"
    ) >"$TOP/$name.out" 2>&1 </dev/null
    echo "$((SECONDS - start))" >>"$TOP/$name.counts"
    touch "$TOP/$name.done"
}
# lane NAME...: the parts one after another
lane() { local p; for p; do run_part "$p"; done; }
# show NAME: a finished part's block, and its counts added to the totals
show() {
    local counts
    counts=$(head -n 1 "$TOP/$1.counts" 2>/dev/null)
    echo "── $1 ($(tail -n 1 "$TOP/$1.counts") s) ──"
    cat "$TOP/$1.out"
    if [ -z "$counts" ]; then
        bad "$1: the part ended without its counts"
    else
        pass=$((pass + ${counts% *}))
        fail=$((fail + ${counts#* }))
    fi
}

# The lanes, longest first. Times from a clean-clone run on two cores
# (about 25 minutes in all, 3,825 checks): cudasim 20.4 minutes (its fence
# mutants build three trainers each), recompute 85 s, eval and simcheck
# about a minute each; mixed 110 s, data 44 s, and (an earlier quiet run)
# kernels 6.9 minutes, cuda 5.7, rtsan 113 s, hf 98 s; e2e 271 s, mesh
# 139 s, and (earlier) compiler 34 s, unit 12 s, san 42 s, fuzz 53 s,
# runtime 92 s, ckpt 107 s, faults 4.3 minutes, install 6 s, oracle 134 s.
case $mode in
quick)  lanes=("smoke" "docs compiler unit san") ;;
*)      lanes=("cudasim recompute eval simcheck" "kernels cuda rtsan hf mixed data" "docs compiler unit san fuzz runtime ckpt faults install e2e oracle mesh") ;;
esac

if [ $mode = serial ]; then
    for p in ${lanes[*]}; do
        run_part "$p"
        show "$p"
    done
else
    # what several lanes use, built once before they start: `make trainer`
    # and `make runtime` in two lanes at once would write the same objects
    if [ $mode = parallel ] &&
            ! $MAKE --no-print-directory -s build/fsdata runtime >"$TOP/prebuild" 2>&1; then
        bad "make build/fsdata runtime" "$TOP/prebuild"
    fi
    for l in "${lanes[@]}"; do
        # shellcheck disable=SC2086
        lane $l &
    done
    left=(${lanes[*]})
    while [ ${#left[@]} -gt 0 ]; do
        still=()
        for p in "${left[@]}"; do
            if [ -e "$TOP/$p.done" ]; then show "$p"; else still+=("$p"); fi
        done
        left=(${still[@]+"${still[@]}"})
        [ ${#left[@]} -gt 0 ] && sleep 1
    done
    wait
fi

echo "$pass passed, $fail failed"
[ $fail = 0 ]
