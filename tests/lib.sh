# lib.sh — what the test scripts share, sourced after they cd to the
# repository root: the pass/fail counters, ok and bad (each prints the
# check's one line; bad also shows the first SHOW_LINES lines, default 40,
# of a log when given one), and done_, which prints the summary line
# "N passed, N failed" every suite ends with and exits, non-zero on a failure.
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
