#!/usr/bin/env bash
# all.sh — everything `make test` runs, with one total at the end:
#
#   0. tools/check_doc_refs.sh: every docs/<file>.md#<anchor> reference
#      names an existing heading, and nothing cites an outside design
#      page by section number;
#   1. tests/run.sh against build/fsdpc (the ordinary build);
#   2. tests/run.sh again against build/san/fsdpc (ASan + UBSan), where any
#      sanitizer report fails the run;
#   3. a fuzz smoke test: the libFuzzer target replays tests/fuzz/seeds and
#      examples/, then fuzzes for FUZZ_SMOKE_SECONDS, when clang with
#      libFuzzer is installed (otherwise it says it was skipped and why);
#   4. tests/kernels/run.sh: the kernel templates (finite differences,
#      reference formulas, the nvcc compile check);
#   5. tests/runtime/run.sh: the CPU runtime (builds it with `make
#      runtime-tests`; trains a hand-written model on 1-4 MPI ranks) and
#      the fsdata tool.
#
# `make test` builds build/fsdpc and build/san/fsdpc first; this script
# builds the fuzz target itself. Like run.sh, every test prints one line and
# the last line is "N passed, N failed", here summed over all parts.
set -u
cd "$(dirname "$0")/.."

MAKE=${MAKE:-make}
FUZZ_SMOKE_SECONDS=${FUZZ_SMOKE_SECONDS:-20}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
. tests/lib.sh

# ── 0. the documentation's references resolve ──
suite "docs: " tools/check_doc_refs.sh

# ── 1. the ordinary build ──
suite "" env FSDPC=build/fsdpc tests/run.sh

# ── unit tests of the planner: the schedule verifier both ways ──
suite "unit: " build/test_schedule examples/*.fsd tests/plan/*.fsd

# ── 2. the same suite under AddressSanitizer and UBSan ──
# Any report makes fsdpc exit with status 86. run.sh checks most statuses
# itself, but not all (pipelines, 2>/dev/null), so run.sh calls fsdpc through
# a wrapper that also notes every status 86; one note fails the run.
# LeakSanitizer is on: the arena stays reachable until exit, so only memory
# that escaped it is reported.
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

# ── 3. fuzz smoke test ──
# Every seed and example is run first (a crash there is a regression), then
# new inputs are tried for a bounded time with a fixed seed.
fuzz_skip=""
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

# ── 4. kernel templates ──
suite "" tests/kernels/run.sh

# ── 5. the CPU runtime on 1-4 MPI ranks, and fsdata ──
suite "runtime: " env MAKE="$MAKE" tests/runtime/run.sh

# ── sharded checkpoints, resume, resharding; Hugging Face weights ──
suite "ckpt: " env MAKE="$MAKE" tests/ckpt/run.sh

# ── install: an emitted trainer built outside the repository ──
suite "" tests/install/run.sh

# ── the CUDA build without a GPU: nvcc, NCCL link, NVRTC, no host syncs ──
suite "" env MAKE="$MAKE" tests/cuda/run.sh

# ── the CUDA backend's host code on a simulated device, against the CPU build ──
suite "" env MAKE="$MAKE" tests/cudasim/run.sh

# ── emitted trainers end to end: gradient checks, 1-4 ranks, bf16, the plan ──
suite "e2e: " env MAKE="$MAKE" tests/e2e/run.sh

# ── PyTorch as the reference: the examples' losses step by step ──
suite "oracle: " env MAKE="$MAKE" tests/oracle/run.sh

echo "$pass passed, $fail failed"
[ $fail = 0 ]
