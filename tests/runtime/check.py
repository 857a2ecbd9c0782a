#!/usr/bin/env python3
"""check.py — the Python half of tests/runtime/run.sh: an independent
reader of what the runtime writes (safetensors and token files through
tests/fsdfiles.py, JSON logs, Chrome traces), the initialisation formula
and the data order re-derived from docs/runtime.md, and makers of broken
input files. Standard library only.

Every subcommand exits 0 when its check holds and prints why when not.
"""
import json
import math
import os
import struct
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import (FormatError, TOKEN_MAGIC, layout, read_log, read_safetensors, read_tokens,
                      write_raw)


def die(msg):
    print(msg)
    sys.exit(1)


# ── safetensors ──

def write_variant(path, tensors, header_override=None, raw_header=None, cut=0, transform=None):
    """tensors: {name: (shape, bytes)} as a safetensors file, spelled or
    broken as the case needs: the header overridden as a dict, replaced by
    raw bytes or transformed as text, the data cut short."""
    header, data = layout(tensors)
    if header_override:
        header_override(header)
    text = json.dumps(header)
    h = raw_header if raw_header is not None else (transform(text) if transform else text).encode()
    write_raw(path, h, data[:len(data) - cut])


# ── the model of tests/runtime/trainer.c ──

V, T, C = 64, 16, 8
SHAPES = {"tok.weight": [V, C], "head.weight": [V, C], "head.bias": [V], "scale.weight": [C]}


def fnv1a64(s):
    h = 0xCBF29CE484222325
    for c in s.encode():
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def init_normal(name, seed, i):
    """docs/runtime.md's formula, element i of parameter `name`."""
    key = fnv1a64(name) ^ ((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    u1 = ((splitmix64((key + 2 * i) & 0xFFFFFFFFFFFFFFFF) >> 11) + 1) * 2.0 ** -53
    u2 = ((splitmix64((key + 2 * i + 1) & 0xFFFFFFFFFFFFFFFF) >> 11) + 1) * 2.0 ** -53
    return 0.02 * math.sqrt(-2 * math.log(u1)) * math.cos(2 * math.pi * u2)


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def cmd_init(path, seed):
    w, meta = read_safetensors(path)
    if meta != {"format": "pt"}:
        die(f"{path}: __metadata__ is {meta}")
    if {k: t.shape for k, t in w.items()} != SHAPES:
        die(f"{path}: tensors {sorted((k, t.shape) for k, t in w.items())}")
    seed = int(seed)
    for name, t in w.items():
        for i, got in enumerate(t.values()):
            want = {"head.bias": 0.0, "scale.weight": 1.0}.get(name)
            if want is None:
                want = f32(init_normal(name, seed, i))
            if abs(got - want) > 1e-9:
                die(f"{path}: {name}[{i}] = {got!r}, the formula gives {want!r}")
    std = math.sqrt(sum(v * v for v in w["tok.weight"].values()) / (V * C))
    if not 0.015 < std < 0.025:
        die(f"tok.weight's standard deviation is {std}, not about 0.02")


def cmd_weights(a, b, tol):
    """Tensor by tensor, ‖a − b‖ ≤ tol·‖a‖. Norm-wise, not element-wise:
    Adam moves every element by about lr whatever its gradient's size, so an
    element whose gradient cancels to nearly zero (the bias of a token that
    is both predicted and a target) turns fp32 rounding in the reduction
    order into a visible relative difference of that one element."""
    wa, _ = read_safetensors(a)
    wb, _ = read_safetensors(b)
    if {k: t.shape for k, t in wa.items()} != {k: t.shape for k, t in wb.items()}:
        die(f"{a} and {b} hold different tensors")
    tol = float(tol)
    for name in wa:
        x, y = wa[name].values(), wb[name].values()
        norm = math.sqrt(sum(v * v for v in x))
        diff = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y)))
        if diff > tol * norm:
            die(f"{name}: |a - b| = {diff:.3g} > {tol} x |a| = {tol * norm:.3g}")


def cmd_logs(a, b, tol):
    la, lb = read_log(a), read_log(b)
    if len(la) != len(lb) or not la:
        die(f"{a} has {len(la)} steps, {b} has {len(lb)}")
    tol = float(tol)
    keys = {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms", "mem_peak_bytes", "mem_plan_bytes", "comm_bytes",
            "gather_bytes", "reduce_bytes", "first_seq"}
    for x, y in zip(la, lb):
        if set(x) != keys:
            die(f"{a}: keys {sorted(x)}")
        if x["comm_bytes"] != x["gather_bytes"] + x["reduce_bytes"]:
            die(f"{a}: step {x['step']}: comm_bytes is not gather_bytes + reduce_bytes")
        if x["step"] != y["step"] or x["lr"] != y["lr"]:
            die(f"step {x['step']}: step/lr differ: {x} vs {y}")
        # the same G reads the same sequences (docs/design.md#data-order)
        if x["first_seq"] != y["first_seq"]:
            die(f"step {x['step']}: first_seq {x['first_seq']} vs {y['first_seq']}")
        for k in ("loss", "grad_norm"):
            if abs(x[k] - y[k]) > tol * abs(x[k]):
                die(f"step {x['step']}: {k} {x[k]!r} vs {y[k]!r} (relative {tol})")
    if [x["step"] for x in la] != list(range(len(la))):
        die(f"{a}: steps are not 0, 1, ...")


def cmd_lr(path, lr, warmup, min_lr, steps):
    """the cosine schedule of docs/design.md#learning-rate-schedule, step by step"""
    lr, warmup, min_lr, steps = float(lr), int(warmup), float(min_lr), int(steps)
    for x in read_log(path):
        s = x["step"]
        want = lr * (s + 1) / warmup if s < warmup else \
            min_lr + 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))) * (lr - min_lr)
        if abs(x["lr"] - want) > 1e-8 * want:
            die(f"step {s}: lr {x['lr']} expected {want}")


def cmd_trace(path, world):
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    world = int(world)
    slices = [e for e in ev if e.get("ph") == "X"]
    pids = {e["pid"] for e in slices}
    if pids != set(range(world)):
        die(f"trace has pids {sorted(pids)}, expected 0..{world - 1}")
    names = {e["name"] for e in slices}
    for want in ("embed tok", "matmul head", "all_gather tok", "all_gather root",
                 "reduce_scatter tok", "reduce_scatter root"):
        if want not in names:
            die(f"no slice named {want!r} in {sorted(names)}")
    for e in slices:
        if e["dur"] < 0 or e["ts"] < 0:
            die(f"bad times in {e}")
        if e["name"].startswith("all_gather") and e["args"]["bytes"] <= 0 and world > 1:
            die(f"all-gather without bytes: {e}")


# ── token files ──

def write_tokens(path, tokens, version=1, magic=TOKEN_MAGIC, count=None, cut=0):
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = magic, version, len(tokens) if count is None else count
    body = struct.pack("<%d%s" % (len(tokens), "H" if version == 1 else "I"), *tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + body[:len(body) - cut])


def cmd_order(data, B, A, W, steps, folder):
    """docs/runtime.md's data order, against what each rank loaded"""
    tok = read_tokens(data)
    B, A, W, steps = int(B), int(A), int(W), int(steps)
    nseq, G = (len(tok) - 1) // T, B * A * W
    want = []
    for s in range(steps):
        for m in range(A):
            for r in range(W):
                for b in range(B):
                    j = (s * G + (m * W + r) * B + b) % nseq
                    seq = tok[j * T:j * T + T + 1]
                    want.append(f"{s} {m} {r} {b}: " + " ".join(map(str, seq)))
    got = []
    for r in range(W):
        with open(os.path.join(folder, f"order.{r}")) as f:
            got += [line.rstrip("\n") for line in f]
    if sorted(got) != sorted(want):
        missing = sorted(set(want) - set(got))[:3]
        die(f"loaded sequences differ from the documented order; e.g. expected {missing}")
    if steps * G <= nseq:
        die("the run did not wrap around the file")


def cmd_mkdata(kind, out, good):
    tok = read_tokens(good)
    if kind == "magic":
        write_tokens(out, tok, magic=12345)
    elif kind == "version":
        write_tokens(out, tok, version=3)
    elif kind == "truncated":
        write_tokens(out, tok, cut=1000)
    elif kind == "short":
        write_tokens(out, tok[:T])           # T tokens: one short of a sequence
    elif kind == "token":
        bad = list(tok)
        bad[len(bad) * 5 // 6] = V + 23      # late, in the last rank's share
        write_tokens(out, bad)
        print(len(bad) * 5 // 6)
    elif kind == "v2":
        write_tokens(out, tok, version=2)    # the same tokens, uint32
    else:
        die(f"unknown kind {kind}")


def cmd_mkweights(kind, out, good):
    t, _ = read_safetensors(good)    # {name: (shape, bytes)}, as write_variant takes them
    if kind == "missing":
        del t["head.bias"]
        write_variant(out, t)
    elif kind == "shape":
        write_variant(out, t, header_override=lambda h: h["tok.weight"].update(shape=[C, V]))
    elif kind == "dtype":
        write_variant(out, t, header_override=lambda h: h["scale.weight"].update(dtype="F64"))
    elif kind == "json":
        write_variant(out, t, raw_header=b'{"tok.weight": {"dtype": "F32",, }')
    elif kind == "hlen":
        with open(out, "wb") as f:
            f.write(struct.pack("<Q", 1 << 40) + b"{}")
    elif kind == "truncated":
        write_variant(out, t, cut=64)
    elif kind == "escaped":
        # still valid: every name spelled in \u escapes, and metadata with a
        # surrogate pair (json.dumps writes U+1F600 as one), quotes, a tab
        def note(h):
            h["__metadata__"]["note"] = "\U0001F600 \"quoted\" \\ tab\t"

        def spell(text):
            for name in t:
                text = text.replace(json.dumps(name), '"%s"' % "".join("\\u%04x" % ord(c) for c in name))
            return text
        write_variant(out, t, header_override=note, transform=spell)
    else:
        die(f"unknown kind {kind}")


if __name__ == "__main__":
    cmds = {"init": cmd_init, "weights": cmd_weights, "logs": cmd_logs, "lr": cmd_lr,
            "trace": cmd_trace, "order": cmd_order, "mkdata": cmd_mkdata,
            "mkweights": cmd_mkweights}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        die("usage: check.py " + "|".join(cmds) + " ARGS...")
    try:
        cmds[sys.argv[1]](*sys.argv[2:])
    except FormatError as e:      # a fault in a file the runtime wrote
        die(str(e))
