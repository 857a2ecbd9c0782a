#!/usr/bin/env python3
"""check_choice.py DUMP BUDGET_BYTES: --dump-plan's `recompute = auto` table
holds the planner to its rule: the chosen assignment fits (its peak within
the budget) and no other assignment that fits has a faster simulated step.
Prints what it found; exit status 1 when the rule is broken."""
import re
import sys

UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
ROW = re.compile(r"^  (\S.*?)\s{2,}(\S+)\s+(does not fit|[\d.]+ \S+)(  <- .*)?$")

text = open(sys.argv[1]).read()
budget = int(sys.argv[2])
if "recompute = auto under memory_budget" not in text:
    sys.exit("no recompute = auto table in the dump")
rows = []
for line in text.split("recompute = auto under memory_budget", 1)[1].splitlines()[2:]:
    m = ROW.match(line)
    if not m:
        break
    what, step, peak, mark = m.groups()
    fits = peak != "does not fit"
    size = None
    if fits:
        v, u = peak.split()
        size = float(v) * UNIT[u]
    rows.append((what, float(step) if fits else None, size, bool(mark and "chosen" in mark)))
chosen = [r for r in rows if r[3]]
fit = [r for r in rows if r[1] is not None]
if len(rows) < 2 or len(chosen) != 1:
    sys.exit(f"expected one chosen row among several, got {rows}")
c = chosen[0]
# the dump prints peaks to 0.01 of their unit: allow that rounding
if c[2] is None or c[2] > budget * 1.0001:
    sys.exit(f"the chosen assignment {c[0]!r} does not fit {budget} bytes: {c}")
faster = [r for r in fit if r[1] < c[1]]
if faster:
    sys.exit(f"{faster[0][0]!r} fits and is faster ({faster[0][1]} ms) than the chosen {c[0]!r} ({c[1]} ms)")
print(f"{c[0]}: {c[1]} ms, the fastest of {len(fit)} that fit of {len(rows)}")
