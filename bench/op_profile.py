#!/usr/bin/python3
"""op_profile.py — where a bench model's step goes, on both sides: fsdpc's CPU
trainer by its trace (--trace-out: each op's span, summed by op kind) and
PyTorch 2 eager and torch.compile by torch.profiler (self CPU time by ATen
op or compiled kernel), per step, after two warm-up steps on both sides.

    bench/op_profile.py MODEL [THREADS] [STEPS]

MODEL is one of bench/bench.py's (tiny, gpt4x256, gpt6x384, gpt2_124m),
built by `make bench` into build/bench/MODEL/train; PyTorch 2 is
.venv-torch2 (tools/venv-torch2.sh). THREADS defaults to 1, STEPS to 6.
Prints one table per side (the ops that take 1 % of the step or more) and
writes build/bench/profile_MODEL_THREADS.json. The sides run one after the
other: on a shared machine, compare shares of a step more than times.
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench   # noqa: E402  the models, the runners

USAGE = "usage: bench/op_profile.py MODEL [THREADS] [STEPS]"


def fsdpc_profile(m, threads, steps, data):
    """{op kind: ms per step} over steps 2.. from the trainer's trace, and
    the step time: each step starts at its `embed` of tok (the first op)."""
    tmp = tempfile.mkdtemp(dir=bench.OUT)
    trace = os.path.join(tmp, "trace.json")
    exe = os.path.join(bench.OUT, m["name"], "train")
    bench.run([exe, "--data", data, "--steps", str(steps), "--micro-batch", str(m["G"]),
               "--grad-accum", "1", "--quiet", "--trace-out", trace],
              {"OMP_NUM_THREADS": str(threads)})
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"
          and e.get("pid", 0) == 0]
    starts = sorted(e["ts"] for e in ev if e["name"] == "embed tok")
    if len(starts) != steps:
        sys.exit(f"profile: {trace}: {len(starts)} steps found by 'embed tok', not {steps}")
    t0 = starts[2]
    end = max(e["ts"] + e["dur"] for e in ev)
    ops = collections.Counter()
    for e in ev:
        if e["ts"] >= t0 and e.get("cat") == "compute":
            ops[e["name"].split(" ")[0]] += e["dur"] / 1e3
    n = steps - 2
    step = (end - t0) / 1e3 / n
    per = {k: v / n for k, v in ops.items()}
    per["(outside the ops: optimizer, collectives, waits)"] = step - sum(per.values())
    return dict(step_ms=step, self_ms=per)


def torch_profile(m, threads, steps, data, init, flags):
    tmp = tempfile.mkdtemp(dir=bench.OUT)
    out = os.path.join(tmp, "prof.json")
    bench.torch_run(dict(m, steps=steps, warm=0), threads, data, init, {}, py=bench.TORCH2_PY,
                    flags=list(flags) + ["--profile-out", out])
    return json.load(open(out))


def show(title, p):
    step = p["step_ms"]
    print(f"\n{title}: {step:,.1f} ms a step\n")
    print("| op | ms a step | share |\n|---|---|---|")
    rest = 0.0
    for k, v in sorted(p["self_ms"].items(), key=lambda kv: -kv[1]):
        if v >= 0.01 * step:
            print(f"| {k} | {v:,.2f} | {v / step:.0%} |")
        else:
            rest += v
    print(f"| (ops under 1 % each) | {rest:,.2f} | {rest / step:.0%} |")


def main():
    if len(sys.argv) < 2 or len(sys.argv) > 4:
        sys.exit(USAGE)
    m = next((x for x in bench.MODELS_ALL if x["name"] == sys.argv[1]), None)
    if not m:
        sys.exit(f"profile: no model {sys.argv[1]}; " + USAGE)
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    if steps < 3:
        sys.exit("profile: STEPS must be 3 or more (two warm-up steps)")
    data = os.path.join(bench.OUT, f"synth{m['vocab']}.bin")
    if not os.path.exists(data):
        bench.run([bench.FSDATA, "synth", data, "--tokens", "2000000", "--seed", "1",
                   "--vocab", str(m["vocab"])])
    init = os.path.join(bench.OUT, m["name"] + ".init.safetensors")
    bench.run([os.path.join(bench.OUT, m["name"], "train"), "--steps", "0", "--export", init,
               "--quiet"])
    res = dict(fsdpc=fsdpc_profile(m, threads, steps, data))
    show(f"fsdpc, {m['name']}, {threads} thread(s)", res["fsdpc"])
    ok2, why = bench.torch2_state()
    if not ok2:
        print(f"\nPyTorch 2: {why}")
    else:
        for key, flags in (("eager", []), ("compile", ["--compile"])):
            res[key] = torch_profile(m, threads, steps, data, init, flags)
            show(f"PyTorch 2 {key}, {m['name']}, {threads} thread(s)", res[key])
    json.dump(res, open(os.path.join(bench.OUT, f"profile_{m['name']}_{threads}.json"), "w"),
              indent=1)


if __name__ == "__main__":
    main()
