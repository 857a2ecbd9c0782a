#!/usr/bin/env python3
"""oracle.py — PyTorch as the reference for fsdpc's trainers (design §8).

Builds each example model in PyTorch from the semantics of design §9 alone
(layer definitions, parameter names, data order, optimizer, schedule,
clipping), never from the emitted code or the kernel templates. It reads the
model's hyper-parameters from `fsdpc --dump-model`, loads the initial weights
the trainer exported (`--steps 0 --export`), trains on the same token file
with the same batches in the same order, and compares its loss and gradient
norm step by step with the trainer's `--log` JSON.

    oracle.py compare --case label=L model=DUMP.txt init=W.safetensors log=LOG.json \
        world=W data=TOKENS.bin steps=S prec=f32|f64 [--case ...]
    oracle.py weights DUMP.txt OUT.safetensors [--seed N]

A case is one trainer run: its model (the --dump-model text), the weights it
started from, its log, its world size, token file and --steps, and its
precision: f32 for an fp32 trainer (BACKEND=cpu) against float32 torch, f64
for the float64 build (BACKEND=cpu64) against float64 torch. `weights` writes weights
far from the default initialisation for the trainer's `--init-from` (see
far_weights), so the comparison also holds where every detail of the model
moves the loss.

Prints one line per case ("ok   ..." or "FAIL ...", with the largest relative
errors) and ends with "N passed, N failed", like the other suites.
"""
import argparse
import json
import math
import re
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Relative bars per precision: (loss at every step, loss at step 0, gradient
# norm). fp32 is the 1e-4 on the loss, with a tighter one at step 0,
# which depends on the weights and the data only, before any drift; the norm
# is looser. Both sides agree to about 1e-7 in fp32, but a wrong constant
# (GELU's erf for its tanh, a norm's eps) moves an fp32 loss by 1e-6 or less,
# under the bar. The float64 build against float64 torch agrees to the log's
# 9 significant digits (rounding: up to 5e-9 relative), so 1e-8 catches it.
BARS = {"f32": (1e-4, 1e-5, 1e-3), "f64": (1e-8, 1e-8, 1e-7)}
DTYPES = {"f32": torch.float32, "f64": torch.float64}
LR_RTOL = 1e-6       # the schedule is a formula: both sides must agree


# ── inputs: the typed model dump, safetensors, token files, the log ──

def split_args(text):
    """'dim=64, rope=rope(theta=10000)' -> {'dim': '64', 'rope': 'rope(theta=10000)'}"""
    out, depth, cur = {}, 0, ""
    for ch in text + ",":
        if ch == "," and depth == 0:
            if cur.strip():
                k, _, v = cur.strip().partition("=")
                out[k.strip()] = v.strip()
            cur = ""
            continue
        depth += (ch == "(") - (ch == ")")
        cur += ch
    return out


def parse_dump(text):
    """The parts of `fsdpc --dump-model` the reference needs: every layer
    (path -> (kind, args)), every parameter (name -> shape) and the train
    section (key -> value text)."""
    layers, params, train = {}, {}, {}
    section = None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            section = line.split()[0]
            continue
        s = line.strip()
        if not s:
            continue
        if section == "layers":
            m = re.match(r"(\S+)\s+\[([\d, ]*)\]\s", s)
            if m:
                params[m.group(1)] = [int(d) for d in m.group(2).split(",") if d.strip()]
                continue
            m = re.match(r"(\S+)\s+(\w+)(?:\[\d+\])?(?:\((.*)\))?$", s)
            if m:
                layers[m.group(1)] = (m.group(2), split_args(m.group(3) or ""))
        elif section == "train":
            k, _, v = s.partition("=")
            train[k.strip()] = v.strip()
    return layers, params, train


def read_safetensors(path):
    """{name: float32 array}, read with struct and json (F32 only)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack_from("<Q", blob, 0)
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {t['dtype']}, expected F32")
        b, e = t["data_offsets"]
        a = np.frombuffer(blob, dtype="<f4", count=(e - b) // 4, offset=8 + n + b)
        out[name] = a.reshape(t["shape"]).copy()
    return out


def write_safetensors(path, tensors):
    """{name: float32 array} -> a safetensors file (F32, data 8-byte aligned)."""
    header, at = {"__metadata__": {"format": "pt"}}, 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for a in tensors.values():
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def read_tokens(path):
    """An llm.c token file: 256 int32 header (magic, version, count), then
    uint16 (version 1) or uint32 (version 2) tokens."""
    with open(path, "rb") as f:
        blob = f.read()
    magic, version, count = struct.unpack_from("<3i", blob, 0)
    if magic != 20240520 or version not in (1, 2):
        raise ValueError(f"{path}: not a token file (magic {magic}, version {version})")
    dt = "<u2" if version == 1 else "<u4"
    return np.frombuffer(blob, dtype=dt, count=count, offset=1024).astype(np.int64)


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def num(v):
    return float(v)


def call_args(text):
    """'adamw(lr = 0.003, betas = (0.9, 0.95))' -> ('adamw', {...})"""
    m = re.match(r"(\w+)(?:\((.*)\))?$", text.strip())
    return m.group(1), split_args(m.group(2) or "")


# ── built-in layers (design §9), written from their definitions ──

class LayerNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Llama's: x / sqrt(mean(x²) + eps) · w."""
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    """q, k, v, o Linears; scale 1/sqrt(hd); causal; GQA as HF's repeat_kv
    (query head h reads kv head floor(h·kv/heads)); RoPE as HF's Llama
    (rotate half, frequencies theta^(-2i/hd), pairs (i, i + hd/2))."""
    def __init__(self, dim, heads, kv_heads, causal, bias, theta):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.causal, self.theta = causal, theta
        self.q = nn.Linear(dim, heads * self.hd, bias=bias)
        self.k = nn.Linear(dim, kv_heads * self.hd, bias=bias)
        self.v = nn.Linear(dim, kv_heads * self.hd, bias=bias)
        self.o = nn.Linear(heads * self.hd, dim, bias=bias)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.heads, self.hd).transpose(1, 2)
        k = self.k(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        v = self.v(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        if self.theta is not None:
            # the angles in float64, rounded once: the formula, not an
            # accident of one side's precision
            inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
            ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
            ang = torch.cat((ang, ang), dim=-1)
            cos, sin = ang.cos().to(q.dtype), ang.sin().to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        rep = self.heads // self.kv_heads
        k = k.repeat_interleave(rep, dim=1)          # HF repeat_kv
        v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        if self.causal:
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf"))
        y = att.softmax(-1) @ v
        return self.o(y.transpose(1, 2).reshape(B, T, self.heads * self.hd))


class MLP(nn.Module):
    """fc, proj for gelu (tanh, GPT-2's) and relu; gate, up, down for swiglu:
    down(silu(gate x) · up x)."""
    def __init__(self, dim, hidden, act, bias):
        super().__init__()
        self.act = act
        if act == "swiglu":
            self.gate = nn.Linear(dim, hidden, bias=bias)
            self.up = nn.Linear(dim, hidden, bias=bias)
            self.down = nn.Linear(hidden, dim, bias=bias)
        else:
            self.fc = nn.Linear(dim, hidden, bias=bias)
            self.proj = nn.Linear(hidden, dim, bias=bias)

    def forward(self, x):
        if self.act == "swiglu":
            return self.down(F.silu(self.gate(x)) * self.up(x))
        h = self.fc(x)
        h = F.gelu(h, approximate="tanh") if self.act == "gelu" else F.relu(h)
        return self.proj(h)


def boolean(v):
    return {"true": True, "false": False}[v]


def make_layer(kind, a):
    """One built-in layer from its --dump-model line."""
    if kind == "Embedding":
        return nn.Embedding(int(a["n"]), int(a["dim"]))
    if kind == "Linear":
        if "tie" in a:
            return None                      # uses the tied embedding's weight
        return nn.Linear(int(a["in"]), int(a["out"]), bias=boolean(a["bias"]))
    if kind == "LayerNorm":
        return LayerNorm(int(a["dim"]), num(a["eps"]))
    if kind == "RMSNorm":
        return RMSNorm(int(a["dim"]), num(a["eps"]))
    if kind == "Attention":
        theta = None
        if a["rope"] != "none":
            _, r = call_args(a["rope"])
            theta = num(r["theta"])
        return Attention(int(a["dim"]), int(a["heads"]), int(a["kv_heads"]),
                         boolean(a["causal"]), boolean(a["bias"]), theta)
    if kind == "MLP":
        return MLP(int(a["dim"]), int(a["hidden"]), a["act"], boolean(a["bias"]))
    raise ValueError(f"no reference for layer kind {kind}")


# ── the example models: their forward functions, as the .fsd files say ──

class Model(nn.Module):
    """Every top-level layer of the dump as a submodule under its .fsd name
    (arrays as ModuleLists), so parameter names are the trainer's."""
    def __init__(self, layers):
        super().__init__()
        self.lay = layers
        for path, (kind, a) in layers.items():
            if "." in path:
                continue
            if kind in ("Embedding", "Linear", "LayerNorm", "RMSNorm", "Attention", "MLP"):
                mod = make_layer(kind, a)
                if mod is not None:
                    self.add_module(path, mod)
            else:                            # a block array: Block[n]
                n = 0
                while f"{path}.{n}" in layers:
                    n += 1
                self.add_module(path, nn.ModuleList(self.block(f"{path}.{i}") for i in range(n)))

    def block(self, prefix):
        m = nn.Module()
        for path, (kind, a) in self.lay.items():
            if path.startswith(prefix + ".") and path.count(".") == prefix.count(".") + 1:
                m.add_module(path[len(prefix) + 1:], make_layer(kind, a))
        return m


class Tiny(Model):
    """tiny.fsd: learned positions, pre-norm blocks, tied head."""
    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = x + b.attn(b.ln1(x))
            x = x + b.mlp(b.ln2(x))
        return self.ln_f(x) @ self.tok.weight.t()      # head = Linear(tie = tok)


class TinyLlama(Model):
    """tiny_llama.fsd: RMSNorm, GQA with RoPE, SwiGLU, untied head."""
    def forward(self, idx):
        x = self.tok(idx)
        for b in self.layers:
            x = x + b.attn(b.attn_norm(x))
            x = x + b.mlp(b.mlp_norm(x))
        return self.head(self.norm(x))


class MlpLM(Model):
    """mlp.fsd: out(fc2(relu(fc1(emb(idx)))))."""
    def forward(self, idx):
        return self.out(self.fc2(F.relu(self.fc1(self.emb(idx)))))


MODELS = {"tiny": Tiny, "tiny_llama": TinyLlama, "mlp": MlpLM}


# ── training, as design §9 defines it ──

def lr_at(s, steps, kind, a, lr):
    """`constant`, or cosine(warmup, min_lr) over the run's S steps."""
    if kind == "constant":
        return lr
    warmup, min_lr = int(a["warmup"]), num(a["min_lr"])
    if s < warmup:
        return lr * (s + 1) / warmup
    return min_lr + 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))) * (lr - min_lr)


def make_optimizer(model, kind, a):
    if kind == "adamw":
        # weight decay only on parameters of two or more dimensions
        decay = [p for p in model.parameters() if p.dim() >= 2]
        other = [p for p in model.parameters() if p.dim() < 2]
        betas = tuple(num(b) for b in a["betas"].strip("()").split(","))
        wd = num(a["weight_decay"])
        return torch.optim.AdamW([{"params": decay, "weight_decay": wd},
                                  {"params": other, "weight_decay": 0.0}],
                                 lr=num(a["lr"]), betas=betas, eps=num(a["eps"]))
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=num(a["lr"]), momentum=num(a["momentum"]),
                               weight_decay=num(a["weight_decay"]), nesterov=boolean(a["nesterov"]))
    raise ValueError(f"no reference for optimizer {kind}")


def batch(tokens, s, G, T):
    """Step s's G sequences: sequence j is tokens [j·T, j·T + T], indices
    wrapping modulo the number of whole sequences."""
    nseq = (len(tokens) - 1) // T
    rows = [tokens[(j % nseq) * T:(j % nseq) * T + T + 1] for j in range(s * G, s * G + G)]
    a = torch.from_numpy(np.stack(rows))
    return a[:, :-1], a[:, 1:]


def run_case(label, dump_path, init_path, log_path, world, data_path, steps, prec):
    with open(dump_path) as f:
        dump = f.read()
    name = dump.split()[1]
    layers, params, train = parse_dump(dump)
    tokens = read_tokens(data_path)
    model = MODELS[name](layers)

    # the exported names and shapes are the model's (design §9), and load whole
    init = read_safetensors(init_path)
    mine = {k: list(v.shape) for k, v in model.state_dict().items()}
    if mine != params or {k: list(v.shape) for k, v in init.items()} != params:
        return False, (f"{label}: parameter names/shapes differ: dump {sorted(params)}, "
                       f"torch {sorted(mine)}, export {sorted(init)}")
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()}, strict=True)
    model.to(DTYPES[prec])                   # the float64 build widens the F32 file too

    T = int(re.search(r"^\s+seq\s+(\d+)", dump, re.M).group(1))
    V = int(re.search(r"^\s+vocab\s+(\d+)", dump, re.M).group(1))
    B, k = int(train["micro_batch"]), int(train["grad_accum"])
    G = B * k * world
    okind, oargs = call_args(train["optimizer"])
    skind, sargs = call_args(train["lr_schedule"])
    clip = None if train["grad_clip"] == "none" else num(train["grad_clip"])
    opt = make_optimizer(model, okind, oargs)
    peak = num(oargs["lr"])
    params_list = list(model.parameters())

    log = read_log(log_path)
    if len(log) != steps or [r["step"] for r in log] != list(range(steps)):
        return False, f"{label}: the log has {len(log)} steps, expected 0 … {steps - 1}"

    rows = []
    for s in range(steps):
        x, y = batch(tokens, s, G, T)
        opt.zero_grad(set_to_none=False)
        loss = F.cross_entropy(model(x).reshape(-1, V), y.reshape(-1))   # mean over G·T
        loss.backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(params_list, clip)
        else:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in params_list]))
        lr = lr_at(s, steps, skind, sargs, peak)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        rows.append((loss.item(), norm.item(), lr))

    def rel(a, b):
        if a is None or b is None:
            return math.inf
        return abs(a - b) / max(abs(b), 1e-30)

    eloss = [rel(r["loss"], ref[0]) for r, ref in zip(log, rows)]
    enorm = [rel(r["grad_norm"], ref[1]) for r, ref in zip(log, rows)]
    elr = [rel(r["lr"], ref[2]) for r, ref in zip(log, rows)]
    bar_loss, bar_step0, bar_norm = BARS[prec]
    good = (max(eloss) <= bar_loss and eloss[0] <= bar_step0 and max(enorm) <= bar_norm
            and max(elr) <= LR_RTOL)
    clipped = ("no clipping" if clip is None else
               f"{sum(1 for r in rows if r[1] > clip)} steps clipped")
    msg = (f"{label}: {steps} steps, loss max rel err {max(eloss):.1e} (bar {bar_loss:g}; "
           f"step 0 {eloss[0]:.1e}, bar {bar_step0:g}), grad norm max rel err {max(enorm):.1e} "
           f"(bar {bar_norm:g}), loss {rows[0][0]:.3f} -> {rows[-1][0]:.3f}, {clipped}")
    if not good:
        msg += "\n     step  loss(trainer)  loss(torch)   rel     norm(trainer) norm(torch)  rel     lr rel"
        for s, (r, ref) in enumerate(zip(log, rows)):
            msg += (f"\n     {s:4d}  {r['loss']:.8f}  {ref[0]:.8f}  {eloss[s]:.1e}  "
                    f"{r['grad_norm']:.8f}  {ref[1]:.8f}  {enorm[s]:.1e}  {elr[s]:.1e}")
    return good, msg


def far_weights(dump_path, out_path, seed):
    """Weights far from the default initialisation, for `--init-from`: at
    normal(0, 0.02), zero biases and unit norms the attention is almost
    uniform and the logits almost flat, so RoPE's pairing, the GQA mapping,
    GELU's variant or a bias path barely move the loss, and the gradient
    norm stays under the clipping threshold. Here matrices are normal with
    std 1/sqrt(fan-in) (attention scores of order 1), norm weights
    1 + 0.2·N(0, 1) and biases 0.1·N(0, 1)."""
    with open(dump_path) as f:
        layers, params, _ = parse_dump(f.read())
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in params.items():
        kind = layers[name.rsplit(".", 1)[0]][0]
        if name.endswith(".bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif kind in ("LayerNorm", "RMSNorm"):
            a = 1 + 0.2 * rng.standard_normal(shape)
        else:
            a = rng.standard_normal(shape) / math.sqrt(shape[-1])
        out[name] = a.astype(np.float32)
    write_safetensors(out_path, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("weights", help="write far-from-init weights for --init-from")
    w.add_argument("dump")
    w.add_argument("out")
    w.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("compare", help="train in PyTorch and compare with trainer logs")
    c.add_argument("--case", nargs="+", action="append", required=True, metavar="KEY=VALUE",
                   help="label, model, init, log, world, data, steps, prec (f32 or f64)")
    args = ap.parse_args()
    if args.cmd == "weights":
        far_weights(args.dump, args.out, args.seed)
        return 0

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    torch.manual_seed(0)

    passed = failed = 0
    for spec in args.case:
        c = dict(kv.partition("=")[::2] for kv in spec)
        label = c.get("label", " ".join(spec))
        try:
            good, msg = run_case(label, c["model"], c["init"], c["log"], int(c["world"]),
                                 c["data"], int(c["steps"]), c["prec"])
        except Exception as e:          # a broken input is a failed case, not a crash
            good, msg = False, f"{label}: {type(e).__name__}: {e}"
        print(("ok   " if good else "FAIL ") + msg, flush=True)
        passed += good
        failed += not good
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
