#!/usr/bin/env python3
"""check.py — what tests/eval/run.sh holds a trainer's --log to.

    check.py vals LOG
        one line per evaluated step: "STEP VAL_LOSS" (the log's exact digits)
    check.py same LOG_A LOG_B
        the two runs trained alike: every step's loss, lr, grad_norm,
        first_seq, mem_peak_bytes and bytes moved are equal (an evaluation
        must change none of them); prints what differs
    check.py oracle DUMP INIT VAL K PREC BAR LOG
        every val_loss of LOG (a run at its starting weights) against
        PyTorch's mean loss over the first K sequences of the token file VAL,
        from the weights INIT, with tests/oracle/oracle.py's model of DUMP
        (`fsdpc --dump-model`) in float32 (PREC f32) or float64 (f64);
        relative error at most BAR
    check.py lr LOG SCHEDULE LR STEPS WARMUP MIN_LR DECAY
        the log's lr at every step against torch.optim.lr_scheduler's for the
        same schedule (constant, cosine, linear or wsd), built from PyTorch's
        own schedulers (LinearLR, CosineAnnealingLR, ConstantLR, chained by
        SequentialLR), to 1e-12 relative

Each prints one line and exits 0 when the check holds, 1 when it does not.
"""
import json
import math
import os
import sys
import warnings

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import read_log  # noqa: E402


def exact_vals(path):
    """(step, val_loss text) of each evaluated step, digits as written."""
    out = []
    with open(path) as f:
        for line in f:
            if '"val_loss"' in line:
                d = json.loads(line)
                text = line.split('"val_loss": ', 1)[1].split(",", 1)[0].rstrip("}\n")
                out.append((d["step"], text))
    return out


def cmd_vals(log):
    for step, text in exact_vals(log):
        print(step, text)
    return 0


TRAINED = ("step", "loss", "lr", "grad_norm", "first_seq", "mem_peak_bytes", "gather_bytes",
           "reduce_bytes", "comm_bytes")


def cmd_same(a, b):
    la, lb = read_log(a), read_log(b)
    if len(la) != len(lb):
        print(f"{len(la)} steps against {len(lb)}")
        return 1
    for x, y in zip(la, lb):
        diff = [k for k in TRAINED if x.get(k) != y.get(k)]
        if diff:
            print(f"step {x.get('step')}: " + ", ".join(f"{k} {x.get(k)} vs {y.get(k)}" for k in diff))
            return 1
    print(f"{len(la)} steps alike in {', '.join(TRAINED[1:])}")
    return 0


def cmd_oracle(dump_path, init, val, k, prec, bar, log):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracle"))
    import numpy as np
    import torch
    import oracle

    with open(dump_path) as f:
        dump = f.read()
    layers, _, _, _ = oracle.parse_dump(dump)
    model = oracle.MODELS[dump.split()[1]](layers)
    model.load_state_dict({n: torch.from_numpy(a) for n, a in oracle.read_safetensors(init).items()},
                          strict=True)
    model.to(torch.float64 if prec == "f64" else torch.float32)
    T = int(next(line.split()[1] for line in dump.splitlines() if line.split()[:1] == ["seq"]))
    tokens = oracle.read_tokens(val)
    k = int(k)
    rows = np.stack([tokens[j * T:j * T + T + 1] for j in range(k)])
    x, y = torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])
    with torch.no_grad():
        want = oracle.mean_loss(model, x, y).item()   # the mean over all K·T targets
    vals = exact_vals(log)
    if not vals:
        print(f"no val_loss in {log}")
        return 1
    worst = max(abs(float(v) - want) / abs(want) for _, v in vals)
    good = worst <= float(bar)
    print(f"{len(vals)} evaluations at {vals[0][1]}, PyTorch {want:.17g} ({prec}): "
          f"relative error {worst:.1e} (bar {bar})")
    return 0 if good else 1


def torch_rates(kind, lr, steps, warmup, min_lr, decay):
    """The rate of every step from torch.optim.lr_scheduler: the warmup a
    LinearLR from lr/W (step 0) to lr (step W − 1), then the schedule's own,
    chained by SequentialLR at its milestones."""
    import torch
    from torch.optim import lr_scheduler as L

    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=lr)
    parts, miles = [], []
    if warmup > 0:
        parts.append(L.LinearLR(opt, start_factor=1 / warmup, end_factor=1.0,
                                total_iters=warmup - 1))
        miles.append(warmup)
    rest = steps - warmup
    if kind == "constant":
        parts.append(L.ConstantLR(opt, factor=1.0, total_iters=0))
    elif kind == "cosine":
        parts.append(L.CosineAnnealingLR(opt, T_max=rest, eta_min=min_lr))
    elif kind == "linear":
        parts.append(L.LinearLR(opt, start_factor=1.0, end_factor=min_lr / lr, total_iters=rest))
    elif kind == "wsd":
        # D decay steps, the fraction rounded (runtime/lr.c); stable until E
        d = max(1, min(steps, math.floor(decay * steps + 0.5)))
        e = max(warmup, steps - d)
        if e > warmup:
            parts.append(L.ConstantLR(opt, factor=1.0, total_iters=0))
            miles.append(e)
        parts.append(L.LinearLR(opt, start_factor=1.0, end_factor=min_lr / lr,
                                total_iters=steps - e))
    else:
        raise ValueError(f"no schedule {kind}")
    sched = parts[0] if len(parts) == 1 else L.SequentialLR(opt, parts, milestones=miles[:len(parts) - 1])
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return rates


def cmd_lr(log, kind, lr, steps, warmup, min_lr, decay):
    warnings.simplefilter("ignore")   # SequentialLR's own deprecation notes
    lr, steps, warmup, min_lr, decay = float(lr), int(steps), int(warmup), float(min_lr), float(decay)
    rows = read_log(log)
    want = torch_rates(kind, lr, steps, warmup, min_lr, decay)
    if [r["step"] for r in rows] != list(range(steps)):
        print(f"the log has steps {[r['step'] for r in rows]}, expected 0 … {steps - 1}")
        return 1
    errs = [abs(r["lr"] - w) / w for r, w in zip(rows, want)]
    worst = max(errs)
    s = errs.index(worst)
    print(f"{steps} steps, largest relative difference {worst:.1e} at step {s} "
          f"(trainer {rows[s]['lr']!r}, torch {want[s]!r}); first {want[0]:.3g}, last {want[-1]:.3g}")
    return 0 if worst <= 1e-12 else 1


if __name__ == "__main__":
    cmds = {"vals": cmd_vals, "same": cmd_same, "oracle": cmd_oracle, "lr": cmd_lr}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    sys.exit(cmds[sys.argv[1]](*sys.argv[2:]))
