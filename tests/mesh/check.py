#!/usr/bin/env python3
"""check.py — tests/mesh/run.sh's checks of a trainer's --log against fsdpc's
plan, per mesh dimension (docs/design.md#hsdp), and of a resumed run
against a straight one.

  bytes LOG SCHEDULE_JSON   every step's gather_bytes, reduce_bytes,
                            replicate_bytes and reshard_bytes (0 when the
                            log has none) equal the schedule's all_gather,
                            reduce_scatter, all_reduce and gather_partial
                            events summed (bytes x runs), and comm_bytes
                            their sum
  resumed STRAIGHT RESUMED TOL
                            every step RESUMED logs has STRAIGHT's loss for
                            that step number within relative TOL
  tracks TRACE SCHEDULE_JSON WORLD STEPS
                            every rank's trace has the schedule's replica
                            all-reduces (slices named all_reduce GROUP, on
                            their own track), STEPS times over

Prints one line; exit status 0 when the check holds.
"""
import json
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import read_log  # noqa: E402


def die(msg):
    print(msg)
    sys.exit(1)


KINDS = (("all_gather", "gather_bytes"), ("reduce_scatter", "reduce_bytes"),
         ("all_reduce", "replicate_bytes"), ("gather_partial", "reshard_bytes"))


def cmd_bytes(log, schedule_json):
    ev = json.load(open(schedule_json))["events"]
    want = {key: sum(e["bytes"] * e["runs"] for e in ev if e["event"] == kind)
            for kind, key in KINDS}
    for s in read_log(log):
        got = {key: s.get(key, 0) for _, key in KINDS}
        if got != want or s["comm_bytes"] != sum(want.values()):
            die(f"step {s['step']} moved {got} (comm_bytes {s['comm_bytes']}), planned {want}")
    print("per step: " + ", ".join(f"{key} {v:,}" for key, v in want.items()) +
          ", as the schedule plans them")


def cmd_resumed(straight, resumed, tol):
    a = {s["step"]: s["loss"] for s in read_log(straight)}
    worst, at = 0.0, None
    steps = read_log(resumed)
    for s in steps:
        if s["step"] not in a:
            die(f"step {s['step']} of the resumed run is not in the straight run")
        x, y = a[s["step"]], s["loss"]
        d = abs(x - y) / max(abs(x), abs(y), 1e-30)
        if d >= worst:
            worst, at = d, s["step"]
    print(f"steps {steps[0]['step']}-{steps[-1]['step']}: max relative loss difference "
          f"{worst:.2e} (step {at}), bound {float(tol):.0e}")
    sys.exit(0 if worst <= float(tol) else 1)


def cmd_tracks(trace, schedule_json, world, steps):
    ev = json.load(open(schedule_json))
    pattern = ev["events"]
    planned = sum(e["runs"] for e in pattern if e["event"] == "all_reduce")
    events = json.load(open(trace))["traceEvents"]
    for rank in range(int(world)):
        mine = [e for e in events if e.get("pid") == rank]
        names = {e["args"]["name"] for e in mine
                 if e.get("name") == "thread_name" and "args" in e}
        ar = [e for e in mine if e.get("ph") == "X" and e["name"].startswith("all_reduce ")]
        if "all-reduce (replicate)" not in names:
            die(f"rank {rank}: no replicate track among {sorted(names)}")
        if len(ar) != planned * int(steps) or any(e["tid"] != 3 for e in ar):
            die(f"rank {rank}: {len(ar)} all_reduce slices, planned {planned} x {steps} steps "
                f"on track 3")
    print(f"{planned} replica all-reduces a step x {steps} steps on the replicate track of "
          f"each of {world} ranks")


def main():
    cmds = {"bytes": (cmd_bytes, 2), "resumed": (cmd_resumed, 3), "tracks": (cmd_tracks, 4)}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds or len(sys.argv) != 2 + cmds[sys.argv[1]][1]:
        die(__doc__)
    fn, _ = cmds[sys.argv[1]]
    fn(*sys.argv[2:])


if __name__ == "__main__":
    main()
