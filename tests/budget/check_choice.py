#!/usr/bin/env python3
"""check_choice.py DUMP BUDGET_BYTES: holds the planner to its rule in the
tables of a dump:
  - --dump-plan's `recompute = auto` table: the chosen assignment fits (its
    peak within the budget) and no other assignment that fits has a faster
    simulated step;
  - --dump-memory's memory_budget policy table (reshard policy and prefetch
    depth, partial resharding's `to N ranks` among them): the chosen policy
    fits, none that fits is faster, and a policy as fast listed before it
    (a tie goes to the earlier: docs/compiler.md#the-planning-entry-point)
    is not passed over.
At least one of the tables must be there. Prints what it found; exit status
1 when the rule is broken."""
import re
import sys

UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
ROW = re.compile(r"^  (\S.*?)\s{2,}(\S+)\s+(does not fit|[\d.]+ \S+)(  <- .*)?$")
POLICY = re.compile(r"^ +(\d+)\. (\S.*?)\s+peak +([\d,]+)  (too big|fits, step ([\d.]+) ms)"
                    r"(  <- chosen)?$")


def recompute_table(text, budget):
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
        sys.exit(f"{faster[0][0]!r} fits and is faster ({faster[0][1]} ms) than the chosen "
                 f"{c[0]!r} ({c[1]} ms)")
    return f"{c[0]}: {c[1]} ms, the fastest of {len(fit)} that fit of {len(rows)}"


def policy_table(text, budget):
    rows = []
    for line in text.split("the fastest simulated step that fits is used:", 1)[1].splitlines()[1:]:
        m = POLICY.match(line)
        if not m:
            break
        k, what, peak, fit, step, mark = m.groups()
        rows.append({"k": int(k), "what": what, "peak": int(peak.replace(",", "")),
                     "fits": fit != "too big", "step": float(step) if step else None,
                     "chosen": bool(mark)})
    chosen = [r for r in rows if r["chosen"]]
    if len(rows) < 2 or len(chosen) != 1:
        sys.exit(f"expected one chosen policy among several, got {rows}")
    c = chosen[0]
    if not c["fits"] or c["peak"] > budget:
        sys.exit(f"the chosen policy {c['what']!r} does not fit {budget} bytes: {c}")
    if any(r["fits"] != (r["peak"] <= budget) for r in rows):
        sys.exit(f"a policy's fits/too big disagrees with its peak and the budget {budget}: {rows}")
    fit = [r for r in rows if r["fits"]]
    # steps are printed to 0.001 ms: a tie is the same printed step
    faster = [r for r in fit if r["step"] < c["step"] or (r["step"] == c["step"] and r["k"] < c["k"])]
    if faster:
        f = faster[0]
        sys.exit(f"{f['what']!r} fits and is {'faster' if f['step'] < c['step'] else 'as fast and listed earlier'} "
                 f"({f['step']} ms) than the chosen {c['what']!r} ({c['step']} ms)")
    return f"{c['what']}: {c['step']} ms, the fastest of {len(fit)} policies that fit of {len(rows)}"


text = open(sys.argv[1]).read()
budget = int(sys.argv[2])
found = []
if "recompute = auto under memory_budget" in text:
    found.append(recompute_table(text, budget))
if "the fastest simulated step that fits is used:" in text:
    found.append(policy_table(text, budget))
if not found:
    sys.exit("no recompute = auto table and no memory_budget policy table in the dump")
print("; ".join(found))
