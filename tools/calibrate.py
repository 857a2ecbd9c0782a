#!/usr/bin/env python3
"""calibrate.py — writes a kernel calibration for `fsdpc --sim PRESET:calib=FILE`
(docs/simulator.md#calibration-files) from what a trainer measured.

  tools/calibrate.py --gpu h200 --plan plan.json --measured run.json [--skip-steps K] [-o out.calib]
  tools/calibrate.py --gpu h200 --plan plan.json --figures figures.txt [-o out.calib]

--plan is fsdpc's own `--trace` of the same .fsd at world 1 (`fsdpc m.fsd
--sim PRESET:gpus=1 --trace plan.json`): it names every op as the trainer's
trace does ("matmul_dx blocks.3.mlp.fc") and gives its FLOPs and bytes per
call. --measured is the trainer's `--trace-out` (on CUDA each op is timed on
the device; on the CPU build, host times): every compute slice of rank 0,
summed by op kind and shape class over all the steps it holds. --figures is a
text of per-step milliseconds by op kind, for measurements that exist only as
figures (the shipped H200 calibration); see compiler/calib/h200.figures.

For each op kind and shape class (the decade of the work per call: FLOPs for
products and attention, bytes for the rest) the rate is the work done over
the time measured: FLOP/s or bytes/s. The simulator then costs an op of that
kind and class at that rate (docs/simulator.md). Python 3 standard library only.
"""
import argparse
import collections
import json
import math
import sys

# Products and attention are costed by their FLOPs; every other op by its bytes.
BY_FLOPS = {"matmul", "matmul_bias", "matmul_bias_gelu", "matmul_dx", "matmul_dw",
            "attention", "attention_bwd"}


def fail(msg):
    sys.exit(f"calibrate.py: {msg}")


def load_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(f"cannot read {what} {path}: {e}")


def plan_ops(path):
    """name -> (kind, flops, bytes, calls a step, ideal seconds a step) from fsdpc --trace.
    A step planned as a pattern shows micro-batch 1 once and the rest as one
    elided slice whose args.runs says how many more times it ran."""
    t = load_json(path, "plan")
    evs = t.get("traceEvents") if isinstance(t, dict) else None
    if not isinstance(evs, list) or "otherData" not in t or "step_ms" not in t["otherData"]:
        fail(f"{path} is not an fsdpc --trace (no otherData.step_ms); "
             "write one with fsdpc M.fsd --sim PRESET:gpus=1 --trace plan.json")
    if t["otherData"].get("world") != 1:
        fail(f"{path} simulates world {t['otherData'].get('world')}; calibrate against a "
             "world-1 plan (--sim PRESET:gpus=1), where no collective slows an op")
    runs = 0
    for e in evs:
        if e.get("cat") == "elided":
            runs = e["args"]["runs"]
    ops = {}
    other_s = 0.0   # optimizer and gradient-norm events: not ops, never calibrated
    for e in evs:
        a = e.get("args", {})
        if e.get("ph") != "X" or e.get("tid") != 0 or e.get("cat") in ("elided", "wait"):
            continue
        w = 1 + runs if a.get("micro") == 1 and runs else 1
        if "op" not in a:
            other_s += w * e["dur"] * 1e-6
            continue
        name = e["name"]
        o = ops.setdefault(name, [name.split()[0], 0.0, 0.0, 0, 0.0])
        o[1] += w * a["flops"]
        o[2] += w * a["bytes"]
        o[3] += w
        o[4] += w * e["dur"] * 1e-6
    for o in ops.values():   # per call
        o[1] /= o[3]
        o[2] /= o[3]
    return ops, other_s


def work(kind, flops, nbytes):
    return (flops, "flops") if kind in BY_FLOPS else (nbytes, "bytes")


def decade(w):
    return int(math.floor(math.log10(w))) if w >= 1 else 0


def from_trace(ops, path, skip_steps=0):
    """(kind, class, by) -> [work, seconds, calls] from a trainer's --trace-out,
    leaving out its first skip_steps steps (a GPU's first step also pays for
    cuBLASLt's heuristics and first touches). The trace holds whole steps (the
    trainer writes every step it ran): their number is how often the first op
    ran over its calls a step in the plan."""
    t = load_json(path, "trace")
    evs = t.get("traceEvents") if isinstance(t, dict) else None
    if not isinstance(evs, list):
        fail(f"{path} is not a Chrome trace (no traceEvents)")
    acc = collections.defaultdict(lambda: [0.0, 0.0, 0])
    unknown = set()
    seen = 0
    slices = []
    for e in evs:
        if e.get("ph") != "X" or e.get("pid") != 0 or e.get("tid") != 0:
            continue
        name = e["name"]
        if name.endswith(" (recompute)"):
            name = name[: -len(" (recompute)")]
        if name not in ops:
            unknown.add(name)
            continue
        slices.append((e, name))
    if skip_steps and slices:
        # steps: how often the step's first op ran, over its calls a step
        slices.sort(key=lambda x: x[0]["ts"])
        first = slices[0][1]
        ran = sum(1 for _, n in slices if n == first)
        steps, odd = divmod(ran, ops[first][3])
        if odd or len(slices) % steps:
            fail(f"{path}: rank 0's {len(slices)} op slices ({first!r} {ran} times, "
                 f"{ops[first][3]} a step in the plan) are not whole steps; is the plan of the "
                 "same .fsd?")
        if skip_steps >= steps:
            fail(f"{path} holds {steps} step{'s' if steps != 1 else ''}: --skip-steps "
                 f"{skip_steps} would leave none")
        slices = slices[skip_steps * (len(slices) // steps):]
    for e, name in slices:
        kind, flops, nbytes = ops[name][:3]
        w, by = work(kind, flops, nbytes)
        if w <= 0 or e["dur"] <= 0:
            continue
        a = acc[(kind, decade(w), by)]
        a[0] += w
        a[1] += e["dur"] * 1e-6
        a[2] += 1
        seen += 1
    if not seen:
        fail(f"{path}: no compute slice of rank 0 names an op of the plan; was it written by "
             "the trainer of the same .fsd?")
    if unknown:
        print(f"calibrate.py: {len(unknown)} slice names not in the plan, left out "
              f"(e.g. {sorted(unknown)[0]!r})", file=sys.stderr)
    return acc


def from_figures(ops, other_s, path):
    """(kind, 'any', by) -> [work, seconds, calls] from per-step figures.

    Lines: `step_ms MS` (the step measured with launches asynchronous),
    `sync_overhead_us fit` or `sync_overhead_us US`, and `op KIND MS` (the
    kind's milliseconds a step, measured with launches synchronous). `#`
    starts a comment. With `fit`, the one overhead per synchronous launch is
    the one that makes the figures' kinds, less it, plus the other ops at
    their ideal cost, add up to step_ms."""
    figs, step_ms, overhead = {}, None, None
    try:
        lines = open(path).read().splitlines()
    except OSError as e:
        fail(f"cannot read figures {path}: {e}")
    for n, line in enumerate(lines, 1):
        tok = line.split("#")[0].split()
        if not tok:
            continue
        try:
            if tok[0] == "step_ms" and len(tok) == 2:
                step_ms = float(tok[1])
            elif tok[0] == "sync_overhead_us" and len(tok) == 2:
                overhead = tok[1] if tok[1] == "fit" else float(tok[1]) * 1e-6
            elif tok[0] == "op" and len(tok) == 3:
                figs[tok[1]] = float(tok[2]) * 1e-3
            else:
                raise ValueError
        except ValueError:
            fail(f"{path}:{n}: expected `step_ms MS`, `sync_overhead_us US|fit` or `op KIND MS`")
    kinds = {o[0] for o in ops.values()}
    for k in figs:
        if k not in kinds:
            fail(f"{path}: op kind {k} does not occur in the plan")
    calls = collections.Counter()
    for o in ops.values():
        if o[0] in figs:
            calls[o[0]] += o[3]
    if overhead == "fit":
        if step_ms is None:
            fail(f"{path}: sync_overhead_us fit needs step_ms")
        rest = other_s + sum(o[4] for o in ops.values() if o[0] not in figs)
        overhead = (sum(figs.values()) - (step_ms * 1e-3 - rest)) / sum(calls.values())
        print(f"calibrate.py: fitted {overhead * 1e6:.1f} us per synchronous launch "
              f"({sum(calls.values())} launches; the other ops {rest * 1e3:.3f} ms at their "
              "ideal cost)", file=sys.stderr)
    overhead = overhead or 0.0
    acc = {}
    for k, sec in figs.items():
        t = sec - calls[k] * overhead
        if t <= 0:
            fail(f"{path}: op {k}: {sec * 1e3} ms less {calls[k]} launches' overhead leaves nothing")
        wsum, by = 0.0, None
        for o in ops.values():
            if o[0] == k:
                w, by = work(k, o[1], o[2])
                wsum += w * o[3]
        acc[(k, "any", by)] = [wsum, t, calls[k]]
    return acc, overhead


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", required=True, help="the preset the measurement ran on (h200, ...)")
    ap.add_argument("--plan", required=True, help="fsdpc --sim PRESET:gpus=1 --trace of the .fsd")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--measured", help="the trainer's --trace-out")
    src.add_argument("--figures", help="per-step figures by op kind (see the docstring)")
    ap.add_argument("--skip-steps", type=int, default=0, metavar="K",
                    help="with --measured: leave out the trace's first K steps")
    ap.add_argument("-o", dest="out", help="write here instead of standard output")
    args = ap.parse_args()
    if args.skip_steps < 0 or (args.skip_steps and not args.measured):
        fail("--skip-steps K takes a whole number K >= 0, with --measured")

    ops, other_s = plan_ops(args.plan)
    note = ""
    if args.measured:
        acc = from_trace(ops, args.measured, args.skip_steps)
        source = f"measured: {args.measured}"
        if args.skip_steps:
            source += f" less its first {args.skip_steps} step{'s' if args.skip_steps > 1 else ''}"
    else:
        acc, overhead = from_figures(ops, other_s, args.figures)
        source = f"figures: {args.figures}"
        note = f"# less {overhead * 1e6:.2f} us per synchronous launch\n"
    lines = ["fsdpc-calibration 1",
             "# written by tools/calibrate.py (docs/simulator.md#calibration-files)",
             f"# {source}; plan {args.plan}", note.rstrip("\n"), f"gpu {args.gpu}",
             "# op KIND CLASS BY RATE     # work, seconds and calls it comes from"]
    for (kind, cls, by), (w, sec, calls) in sorted(acc.items(), key=lambda x: (x[0][0], str(x[0][1]))):
        c = cls if cls == "any" else f"1e{cls}"
        lines.append(f"op {kind} {c} {by} {w / sec:.6g}    # {w:.6g} {by} in {sec * 1e3:.4f} ms, "
                     f"{calls} calls")
    text = "\n".join(l for l in lines if l) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
