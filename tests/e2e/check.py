#!/usr/bin/env python3
"""check.py — the Python half of tests/e2e/run.sh: it reads what an emitted
trainer wrote (--log JSON lines, --trace-out Chrome traces, --export
safetensors, through tests/fsdfiles.py) and what fsdpc planned
(--dump-schedule, --dump-schedule=json, --dump-memory), and holds one
against the other. Standard library only.

Every subcommand prints one short line of measured figures (run.sh puts it
in its own "ok" or "FAIL" line) and exits 0 when its check holds, 1 when it
does not.
"""
import json
import os
import re
import struct
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import FormatError, read_log, read_safetensors, write_safetensors


def die(msg):
    print(msg)
    sys.exit(1)


def rel(a, b):
    if a is None or b is None:
        return float("inf")   # a diverged run logs null
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


# ── losses ──

def cmd_losses(a, b, tol, least="0"):
    """every step's loss of log b within relative tol of log a's (and, when
    least is given, some step's further apart than that: not the same run)"""
    la, lb = read_log(a), read_log(b)
    if len(la) != len(lb):
        die(f"{len(la)} steps vs {len(lb)}")
    worst, at = max((rel(x["loss"], y["loss"]), x["step"]) for x, y in zip(la, lb))
    print(f"max relative loss difference {worst:.2e} (step {at}) over {len(la)} steps, bound {float(tol):.0e}"
          + (f", at least {float(least):.0e}" if float(least) else ""))
    sys.exit(0 if float(least) <= worst <= float(tol) else 1)


# ── the plan's bytes and memory ──

HEADER = re.compile(r"per rank per step: all-gather ([\d,]+) bytes, reduce-scatter ([\d,]+) bytes")


def num(s):
    return int(s.replace(",", ""))


def cmd_bytes(log, schedule_txt, schedule_json):
    """every step's gather_bytes and reduce_bytes equal the schedule's
    header, which equals the sum over its events"""
    m = HEADER.search(open(schedule_txt).read())
    if not m:
        die(f"{schedule_txt}: no 'per rank per step' header")
    gather, reduce = num(m.group(1)), num(m.group(2))
    ev = json.load(open(schedule_json))["events"]
    eg = sum(e["bytes"] * e["runs"] for e in ev if e["event"] == "all_gather")
    er = sum(e["bytes"] * e["runs"] for e in ev if e["event"] == "reduce_scatter")
    if (eg, er) != (gather, reduce):
        die(f"the schedule's header says {gather}/{reduce}, its events add up to {eg}/{er}")
    bad = [s for s in read_log(log) if (s["gather_bytes"], s["reduce_bytes"]) != (gather, reduce)
           or s["comm_bytes"] != gather + reduce]
    print(f"all-gather {gather:,}, reduce-scatter {reduce:,} bytes per step" +
          (f"; step {bad[0]['step']} moved {bad[0]['gather_bytes']:,}/{bad[0]['reduce_bytes']:,}" if bad else ""))
    sys.exit(1 if bad else 0)


def cmd_memory(log, memory_txt):
    """the runtime's peak (mem_peak_bytes) equals the plan's peak, exactly,
    on every step: both count the arena whole, allocated once at start-up,
    and the unsharded buffers as the schedule takes them; and every step's
    mem_plan_bytes, the trainer's own prediction for its world, says the same"""
    m = re.search(r"^  peak\s+([\d,]+)", open(memory_txt).read(), re.M)
    if not m:
        die(f"{memory_txt}: no 'peak' row")
    plan = num(m.group(1))
    steps = read_log(log)
    bad = [s for s in steps if s["mem_peak_bytes"] != plan or s.get("mem_plan_bytes") != plan]
    s = bad[0] if bad else steps[-1]
    print(f"step {s['step']}: measured peak {s['mem_peak_bytes']:,} bytes, predicted at start-up "
          f"{s.get('mem_plan_bytes', 0):,}, fsdpc's plan {plan:,}" +
          (f" ({len(bad)} of {len(steps)} steps differ)" if bad else f", every one of {len(steps)} steps"))
    sys.exit(1 if bad else 0)


# ── the trace against the schedule ──

def step_events(schedule_json):
    """the step's events in order: a pattern's micro-batch 1, written once,
    repeated as many times as it runs (its events' "runs")"""
    ev = json.load(open(schedule_json))["events"]
    out, i = [], 0
    while i < len(ev):
        j = i
        while j < len(ev) and ev[j]["micro"] == ev[i]["micro"]:
            j += 1
        out += ev[i:j] * ev[i]["runs"]
        i = j
    return out


def cmd_trace(trace, schedule_json, world, steps):
    """on every rank, the collectives in the order they were issued (their
    slices start at the issue) are the schedule's all_gather and
    reduce_scatter events, step after step"""
    planned = [(e["event"], e["group"]) for e in step_events(schedule_json)
               if e["event"] in ("all_gather", "reduce_scatter")]
    want = planned * int(steps)
    events = json.load(open(trace))["traceEvents"]
    for rank in range(int(world)):
        comm = [e for e in events if e.get("pid") == rank and e.get("cat") == "comm"]
        comm.sort(key=lambda e: e["ts"])
        got = [tuple(e["name"].split(" ", 1)) for e in comm]
        if got != want:
            i = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            die(f"rank {rank}: {len(got)} collectives, planned {len(want)}; first difference at "
                f"{i}: ran {got[i] if i < len(got) else None}, planned {want[i] if i < len(want) else None}")
    print(f"{len(planned)} collectives a step x {steps} steps, in the planned order on {world} ranks")


# ── grad check output ──

GC_LINE = re.compile(r"^grad check (\d+): gradient (\S+), central difference (\S+), relative error (\S+)")


def grad_lines(path):
    return [GC_LINE.match(l) for l in open(path) if GC_LINE.match(l)]


def cmd_gradcheck(out, n):
    """the trainer's own verdict, and n directions each under 1e-6"""
    lines = grad_lines(out)
    errs = [float(m.group(4)) for m in lines]
    text = open(out).read()
    if len(errs) != int(n) or "grad check passed" not in text:
        die(f"{len(errs)} of {n} directions printed; errors {errs}")
    print("relative errors " + ", ".join(f"{e:.1e}" for e in errs))
    sys.exit(0 if max(errs) < 1e-6 else 1)


def cmd_gradsame(a, b, tol):
    """two runs on the same G sequences (different world sizes) computed
    the same gradient along the same directions"""
    ga = [float(m.group(2)) for m in grad_lines(a)]
    gb = [float(m.group(2)) for m in grad_lines(b)]
    if not ga or len(ga) != len(gb):
        die(f"{len(ga)} vs {len(gb)} directions")
    worst = max(rel(x, y) for x, y in zip(ga, gb))
    print(f"Σ g·d agrees to {worst:.1e} relative")
    sys.exit(0 if worst <= float(tol) else 1)


# ── weights ──

def cmd_setbias(src, dst, name, value):
    """copies safetensors src to dst with tensor `name` set to +value,
    -value, +value, ... (an F32 vector)"""
    try:
        tensors, _ = read_safetensors(src)
    except FormatError as e:
        die(str(e))
    if name not in tensors:
        die(f"{src}: no tensor {name}")
    count = len(tensors[name].raw) // 4
    v = float(value)
    raw = struct.pack(f"<{count}f", *[v if i % 2 == 0 else -v for i in range(count)])
    write_safetensors(dst, {k: (t.shape, raw if k == name else t.raw) for k, t in tensors.items()})


def main():
    cmds = {"losses": cmd_losses, "bytes": cmd_bytes, "memory": cmd_memory, "trace": cmd_trace,
            "gradcheck": cmd_gradcheck, "gradsame": cmd_gradsame, "setbias": cmd_setbias}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        die("usage: check.py " + " | ".join(cmds) + " ARGS...")
    cmds[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    main()
