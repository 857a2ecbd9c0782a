#!/usr/bin/env python3
"""check_mesh.py DUMP NODES: `fsdpc --sim h100:nodes=NODES --dump-plan`'s
`replicate = auto` table holds the planner to its rule:
  - the meshes weighed are R = 1 and NODES / k for every k < NODES dividing
    NODES (shard groups of whole nodes; docs/design.md#replicate-auto);
  - exactly one is chosen; it fits (its peak within the limit the table's
    header names) and no other that fits has a faster predicted step;
  - the plan written is the chosen one: the `mesh:` line names its R (none
    for R = 1) and --sim's predicted step is the chosen row's.
Prints what it found; exit status 1 when the rule is broken."""
import re
import sys

UNIT = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
HEAD = re.compile(r"^  mesh: replicate = auto, .* fits (?:memory_budget|the GPU's HBM of) ([\d.]+) (\w+):$")
ROW = re.compile(r"^    replicate +(\d+) x shard +(\d+): (?:step +([\d.]+) ms, exposed comm +([\d.]+) ms, "
                 r"+\d+ tokens/s per GPU, peak +([\d.]+) (\w+) +(fits|too big)|(no reshard policy.*?))"
                 r"(  <- chosen.*)?$")


def size(v, u):
    return float(v) * UNIT[u]


def fail(msg):
    print(msg)
    sys.exit(1)


lines = open(sys.argv[1]).read().splitlines()
nodes = int(sys.argv[2])
head = [i for i, l in enumerate(lines) if HEAD.match(l)]
if len(head) != 1:
    fail("no `replicate = auto` table (or more than one) in the dump")
limit = size(*HEAD.match(lines[head[0]]).groups())
rows = []
for l in lines[head[0] + 1:]:
    m = ROW.match(l)
    if not m:
        if l.startswith("    (no --world"):
            continue
        break
    r, s, step, exposed, pv, pu, fit, unplanned, mark = m.groups()
    rows.append({"R": int(r), "S": int(s), "step": float(step) if step else None,
                 "peak": size(pv, pu) if pv else None, "fits": fit == "fits",
                 "chosen": bool(mark)})
want = [1] + [nodes // k for k in range(nodes - 1, 0, -1) if nodes % k == 0]
got = [r["R"] for r in rows]
if got != want:
    fail(f"meshes weighed {got}, expected {want} for {nodes} nodes")
world = nodes * 8
bad = [r for r in rows if r["R"] * r["S"] != world]
if bad:
    fail(f"R x S is not the world {world}: {bad}")
chosen = [r for r in rows if r["chosen"]]
if len(chosen) != 1:
    fail(f"expected one chosen mesh, got {chosen}")
c = chosen[0]
# peaks are printed to 0.01 of their unit: allow that rounding
if not c["fits"] or c["peak"] > limit * 1.0001:
    fail(f"the chosen replicate {c['R']} does not fit {limit:.0f} bytes: {c}")
fit = [r for r in rows if r["fits"]]
faster = [r for r in fit if r["step"] < c["step"]]
if faster:
    fail(f"replicate {faster[0]['R']} fits and is faster ({faster[0]['step']} ms) than the "
         f"chosen replicate {c['R']} ({c['step']} ms)")
mesh = [l for l in lines if l.startswith("  mesh: replicate ") and " x shard " in l]
if c["R"] > 1 and not (mesh and mesh[0].startswith(f"  mesh: replicate {c['R']} x shard {c['S']} ")):
    fail(f"the plan's mesh line {mesh} is not the chosen replicate {c['R']} x shard {c['S']}")
if c["R"] == 1 and mesh:
    fail(f"replicate 1 chosen but the plan shows a mesh: {mesh}")
sim = [l for l in lines if re.match(r"^  step +[\d.]+ ms", l)]
if not sim or abs(float(sim[0].split()[1]) - c["step"]) > 0.0015:
    fail(f"--sim's step {sim[:1]} is not the chosen replicate {c['R']}'s {c['step']} ms")
print(f"replicate {c['R']} x shard {c['S']}: {c['step']} ms, the fastest of {len(fit)} that fit "
      f"of {len(rows)} meshes")
