# lib.sh — what the test scripts share, sourced after they cd to the
# repository root: the pass/fail counters, ok and bad (each prints the
# check's one line; bad also shows the first SHOW_LINES lines, default 40,
# of a log when given one), and done_, which prints the summary line
# "N passed, N failed" every suite ends with and exits, non-zero on a failure;
# suite, which runs a suite inside another and adds up its counts.
pass=0
fail=0
ok()  { pass=$((pass + 1)); echo "ok   $1"; }
bad() {
    fail=$((fail + 1))
    echo "FAIL $1"
    [ -n "${2:-}" ] && [ -f "$2" ] && sed 's/^/     /' "$2" | head -"${SHOW_LINES:-40}"
    return 0
}
done_() { echo "$pass passed, $fail failed"; [ $fail = 0 ]; exit; }

# suite PREFIX CMD...: runs CMD, a suite or test program that prints
# "ok   ..." / "FAIL ..." lines and ends with "N passed, N failed" (in $TMP,
# the caller's scratch folder); prints its lines with PREFIX after the status
# word and adds its summary to the totals. A suite that exits non-zero with
# no failure counted, or ends without a summary, fails as well.
suite() {
    local prefix=$1
    shift
    "$@" >"$TMP/suite" 2>&1
    local st=$? last
    last=$(tail -n 1 "$TMP/suite")
    sed '$d' "$TMP/suite" | sed -E "s/^(ok   |FAIL )/\1$prefix/"
    case "$last" in
    *" passed, "*" failed")
        pass=$((pass + ${last%% passed*}))
        local f=${last#*, }
        fail=$((fail + ${f%% failed}))
        [ $st = 0 ] || [ "${f%% failed}" != 0 ] || bad "${prefix}$* exited with status $st"
        ;;
    *) echo "$last"; bad "${prefix}$* ended without a summary (status $st)" ;;
    esac
}

# relay FILE: a test program's "ok ..." and "FAIL ..." lines, in FILE, as
# this suite's checks; its other lines are left out.
relay() {
    local line
    while IFS= read -r line; do
        case "$line" in
        "ok "*) line=${line#ok }; ok "${line#"${line%%[! ]*}"}" ;;
        "FAIL "*) bad "${line#FAIL }" ;;
        esac
    done <"$1"
}

# check NAME CONDITION [LOG]: ok NAME when the shell condition holds, else
# bad NAME (showing LOG).
check() { if eval "$2"; then ok "$1"; else bad "$1" "${3:-}"; fi; }

# need_tools WHAT TOOL...: ends the suite, skipped with a line that says why,
# when a tool is missing (tools/setup.sh installs MPI and OpenBLAS).
need_tools() {
    local what=$1 tool
    shift
    for tool; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            echo "skip $what: $tool not found (tools/setup.sh installs MPI and OpenBLAS)"
            done_
        fi
    done
}

# need_torch WHAT: sets PY to the first Python that imports torch and numpy
# ($PYTHON, python3, /usr/bin/python3: the first python3 on PATH may be a
# venv or pyenv without them); ends the suite, skipped with a line that says
# why, when none does.
need_torch() {
    local py
    PY=""
    for py in ${PYTHON:-} python3 /usr/bin/python3; do
        if "$py" -c 'import torch, numpy' >/dev/null 2>&1; then PY=$py; return; fi
    done
    echo "skip $1: no Python with torch and numpy (tried ${PYTHON:+$PYTHON, }python3, /usr/bin/python3);" \
         "install Debian's python3-torch python3-numpy (tools/setup.sh does, as root)"
    done_
}

# build_base: builds build/fsdpc, build/fsdata and the runtime libraries
# (the suite's $MAKE, output in $TMP/build), or ends the suite with a
# failure that shows the build's output.
build_base() {
    if ! $MAKE --no-print-directory -s build/fsdpc build/fsdata runtime >"$TMP/build" 2>&1; then
        bad "build: fsdpc, fsdata and the runtime" "$TMP/build"
        done_
    fi
}

# build_trainer LABEL TARGET...: runs `$MAKE -s TARGET...` (a trainer: `trainer
# FSD=... TRAINER=build/SUITE/...`, this suite's own folder), which must
# succeed without a compiler warning; otherwise bad "LABEL (errors or
# warnings)" with the build's output, and a non-zero status.
build_trainer() {
    local label=$1
    shift
    if ${MAKE:-make} --no-print-directory -s "$@" >"$TMP/build" 2>&1 &&
            ! grep -q "warning:" "$TMP/build"; then
        return 0
    fi
    bad "$label (errors or warnings)" "$TMP/build"
    return 1
}

# MPIRUN: mpirun as every suite starts it: --oversubscribe (up to 4 ranks on
# two cores), --allow-run-as-root when run as root, and two settings that keep
# Open MPI's own bookkeeping out of the results:
#   orte_tmpdir_base  its session directory goes in the suite's $TMP, removed
#                     when the suite ends, instead of /tmp/ompi.<host>.<uid>,
#                     where every mpirun a test kills leaves a pid.N folder
#                     that a later mpirun given the same pid would meet again
#                     (pid_max is 32768 on the machines that run this);
#   orte_allowed_exit_without_sync  on a loaded machine, Open MPI 4.1's
#                     mpirun now and then reports a rank that did finish
#                     MPI_Finalize as "exiting improperly" (seen in runs of
#                     make test beside other work; Open MPI's issue 7833
#                     reports the same on one idle machine); with
#                     the setting a rank's exit status counts, so a rank that
#                     exits non-zero, on a signal or through MPI_Abort still
#                     fails the run, and only a rank that exits 0 without
#                     MPI_Finalize goes unnoticed (the runtime ends MPI in
#                     one place, bk_stop, on every path that returns).
MPIRUN=(mpirun --oversubscribe --mca orte_allowed_exit_without_sync 1)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
[ -n "${TMP:-}" ] && MPIRUN+=(--mca orte_tmpdir_base "$TMP")
