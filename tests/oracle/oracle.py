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
        world=W data=TOKENS.bin steps=S prec=f32|f64|bf16 [lr=LR] [--case ...]
    oracle.py weights DUMP.txt OUT.safetensors [--seed N]
    oracle.py init DUMP.txt W.safetensors

A case is one trainer run: its model (the --dump-model text), the weights it
started from, its log, its world size, token file and --steps, its --lr if
it was given one, and its precision: f32 for an fp32 trainer (BACKEND=cpu)
against float32 torch, f64 for the float64 build (BACKEND=cpu64) against
float64 torch, bf16 for a CPU trainer whose policy is mixed_precision(param
= bf16, reduce = fp32 or bf16), which computes in bf16, against torch doing
what FSDP2 does under that policy (mixed_grads). `weights` writes weights
far from the default initialisation for the trainer's `--init-from` (see
far_weights), so the comparison also holds where every detail of the model
moves the loss. `init` checks weights a trainer exported before its first
step (`--steps 0 --export`) against the initialisation formula of
docs/runtime.md#initialisation, each parameter at the std the dump gives it,
and prints what it found (exit status 1 when they differ).

Prints one line per case ("ok   ..." or "FAIL ...", with the largest relative
errors) and ends with "N passed, N failed", like the other suites.
"""
import argparse
import collections
import copy
import math
import os
import re
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
import fsdfiles

# Relative bars per precision: (loss at every step, loss at the starting
# weights, gradient norm at every step, gradient norm at the starting
# weights). The steps at the starting weights are those before the first
# that moves a weight: step 0, or all of them with a learning rate too small
# to move an fp32 weight (--lr 1e-30); their bar holds the mean of their
# errors. They depend on the weights and the data only, before any drift.
#
# fp32 is the 1e-4 on the loss, with a tighter one at step 0; the
# norm is looser. Both sides agree to about 1e-7 in fp32, but a wrong
# constant (GELU's erf for its tanh, a norm's eps) moves an fp32 loss by
# 1e-6 or less, under the bar. The float64 build against float64 torch
# agrees to the log's 9 significant digits (rounding: up to 5e-9 relative),
# so 1e-8 catches it.
#
# bf16 must tell bf16 arithmetic from fp32, which the loss hardly shows: a
# mean over G·T = 1024 targets averages the roundings out. Measured on
# tiny / tiny_llama from far_weights, 2 ranks (tests/oracle/run.sh), mean
# relative errors at the starting weights (10 steps; 20 in the second row):
#   bf16 trainer against this reference      loss 5.9e-6 / 6.4e-6, norm 1.0e-4 / 9.8e-5
#   this reference against itself, products
#     summed in float64 (some roundings flip) loss 3.9e-6 / 4.5e-6, norm 4.3e-5 / 3.5e-5
#   fp32 trainer against this reference      loss 4.0e-5 / 5.9e-5, norm 1.3e-3 / 3.5e-4
#   fp32 arithmetic on bf16-rounded weights
#     (bf16 on the wire only)                loss 1.6e-5 / 3.2e-5, norm 2.5e-4 / 2.7e-4
# so 2e-5 and 4e-4 leave the bf16 trainers 3-4 times under and put the fp32
# ones 2 (tiny) and 3 (tiny_llama) times over on the loss, 3 times over on
# tiny's norm (tiny_llama's fp32 norm is under it; its loss fails). bf16
# weights with fp32 activations fail on tiny_llama's loss only (1.6 times
# over): closer bars would leave the bf16 trainers no margin. At
# step 0 of training alone: bf16 trainers 7.5e-7 / 4.6e-6 (loss), 1.0e-4 /
# 3.1e-5 (norm), fp32 3.3e-5 / 1.4e-4 and 1.2e-3 / 7.0e-5. A tensor rounded
# twice or not at all is within this noise (rounding a product before
# adding its bias, and a norm's x̂ before its affine, moves step 0 by 1.9e-5
# and 1.1e-4): only bf16 against fp32 and real errors are caught.
# Once a weight moves the runs drift apart (an fp32 weight one ulp off can
# round to another bf16 value): over 20 steps of training the bf16 trainers'
# largest errors are 5.7e-5 / 9.9e-5 (loss) and 1.0e-3 / 1.2e-3 (norm);
# 5e-4 and 1e-2 above that catch what is grossly wrong (a gradient not
# averaged over ranks, a lost 1/grad_accum).
BARS = {"f32": (1e-4, 1e-5, 1e-3, 1e-3), "f64": (1e-8, 1e-8, 1e-7, 1e-7),
        "bf16": (5e-4, 2e-5, 1e-2, 4e-4)}
# the master weights' dtype: bf16 trainers keep fp32 masters (mixed_grads)
MASTER = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.float32}
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


def parse_dump(text, inits=None):
    """The parts of `fsdpc --dump-model` the reference needs: every layer
    (path -> (kind, args)), every parameter (name -> shape), the shard
    section (key -> value text; `mixed_precision(...)` -> its arguments) and
    the train section (key -> value text). inits, when given, receives each
    parameter's initialisation (name -> "normal", "normal(std=X)", "zeros"
    or "ones")."""
    layers, params, shard, train = {}, {}, {}, {}
    section = None
    for line in text.splitlines():
        if line and not line.startswith(" "):
            section = line.strip()           # "shard", not "shard groups (...)"
            continue
        s = line.strip()
        if not s:
            continue
        if section == "shard":
            m = re.match(r"(\w+)\((.*)\)$", s)
            if m:
                shard[m.group(1)] = split_args(m.group(2))
            else:
                k, _, v = s.partition("=")
                shard[k.strip()] = v.strip()
        elif section == "layers":
            m = re.match(r"(\S+)\s+\[([\d, ]*)\]\s+[\d,]+\s+(\S+)\s", s)
            if m:
                params[m.group(1)] = [int(d) for d in m.group(2).split(",") if d.strip()]
                if inits is not None:
                    inits[m.group(1)] = m.group(3)
                continue
            m = re.match(r"(\S+)\s+(\w+)(?:\[\d+\])?(?:\((.*)\))?$", s)
            if m:
                layers[m.group(1)] = (m.group(2), split_args(m.group(3) or ""))
        elif section == "train":
            k, _, v = s.partition("=")
            train[k.strip()] = v.strip()
    return layers, params, shard, train


def read_safetensors(path):
    """{name: float32 array} (F32 only; tests/fsdfiles.py reads the file)."""
    tensors, _ = fsdfiles.read_safetensors(path)
    return {name: np.frombuffer(t.raw, dtype="<f4").reshape(t.shape).copy()
            for name, t in tensors.items()}


def write_safetensors(path, tensors):
    """{name: float32 array} -> a safetensors file (F32, data 8-byte aligned)."""
    fsdfiles.write_safetensors(path, {name: (a.shape, np.ascontiguousarray(a, dtype="<f4").tobytes())
                                      for name, a in tensors.items()})


def read_tokens(path):
    """An llm.c token file's tokens (fsdfiles.read_tokens), as int64."""
    return np.asarray(fsdfiles.read_tokens(path), dtype=np.int64)


def num(v):
    return float(v)


def call_args(text):
    """'adamw(lr = 0.003, betas = (0.9, 0.95))' -> ('adamw', {...})"""
    m = re.match(r"(\w+)(?:\((.*)\))?$", text.strip())
    return m.group(1), split_args(m.group(2) or "")


# ── built-in layers (design §9), written from their definitions ──
#
# Each layer computes in the dtype of its input, which is its parameters'
# dtype: float32 or float64, or bfloat16 for the working copy of a bf16
# trainer (mixed_grads). In bf16 a layer does what fsdpc's kernels do: it
# widens its bf16 inputs to float (wide), computes in float, and rounds its
# output to bf16 once (`.to(x.dtype)`); autograd then rounds each gradient
# once on its way back through the same casts. Products too: PyTorch's own
# bf16 CPU matrix-vector product sums in bf16, fsdpc's in fp32. Statistics
# (the norms', the softmax's, the loss) never leave float. In float32 and
# float64, wide and the casts do nothing.

def wide(t):
    """bf16 storage widened to float for the arithmetic (fsd_wide)."""
    return t.float() if t.dtype == torch.bfloat16 else t


def linear(x, weight, bias=None):
    """x·Wᵀ + b, summed in float, rounded once."""
    return F.linear(wide(x), wide(weight), None if bias is None else wide(bias)).to(x.dtype)


class Linear(nn.Linear):
    def forward(self, x):
        return linear(x, self.weight, self.bias)


class LayerNorm(nn.Module):
    """torch's LayerNorm; bias=False: none at all (LayerNorm(dim, bias = false))."""
    def __init__(self, dim, eps, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps

    def forward(self, x):
        b = None if self.bias is None else wide(self.bias)
        return F.layer_norm(wide(x), x.shape[-1:], wide(self.weight), b, self.eps).to(x.dtype)


class RMSNorm(nn.Module):
    """Llama's: x / sqrt(mean(x²) + eps) · w."""
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        xw = wide(x)
        return (xw * torch.rsqrt(xw.pow(2).mean(-1, keepdim=True) + self.eps)
                * wide(self.weight)).to(x.dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    """q, k, v, o Linears; scale 1/sqrt(hd); causal; GQA as HF's repeat_kv
    (query head h reads kv head floor(h·kv/heads)); RoPE as HF's Llama
    (rotate half, frequencies theta^(-2i/hd), pairs (i, i + hd/2)). bias
    "qkv": q, k and v have biases, o none (Qwen2). qk_eps: Qwen3's q_norm
    and k_norm, an RMSNorm of each head of q and k (one weight [hd] shared
    by the heads) before RoPE. In bf16 the normed and the rotated q and k
    are stored (rounded), and the attention itself is one fused kernel:
    scores, softmax and the weighted sum in float, its output rounded
    once."""
    def __init__(self, dim, heads, kv_heads, causal, bias, theta, qk_eps=None):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.causal, self.theta = causal, theta
        self.q = Linear(dim, heads * self.hd, bias=bias is not False)
        self.k = Linear(dim, kv_heads * self.hd, bias=bias is not False)
        self.v = Linear(dim, kv_heads * self.hd, bias=bias is not False)
        self.o = Linear(heads * self.hd, dim, bias=bias is True)
        if qk_eps is not None:
            self.q_norm = RMSNorm(self.hd, qk_eps)
            self.k_norm = RMSNorm(self.hd, qk_eps)
        self.qk_norm = qk_eps is not None

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.heads, self.hd)
        k = self.k(x).view(B, T, self.kv_heads, self.hd)
        if self.qk_norm:   # over each head's hd elements
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = self.v(x).view(B, T, self.kv_heads, self.hd).transpose(1, 2)
        if self.theta is not None:
            # the angles in float64, rounded once: the formula, not an
            # accident of one side's precision
            inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
            ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
            ang = torch.cat((ang, ang), dim=-1)
            cos, sin = ang.cos().to(wide(q).dtype), ang.sin().to(wide(q).dtype)
            q = (wide(q) * cos + rotate_half(wide(q)) * sin).to(x.dtype)
            k = (wide(k) * cos + rotate_half(wide(k)) * sin).to(x.dtype)
        rep = self.heads // self.kv_heads
        k = wide(k).repeat_interleave(rep, dim=1)    # HF repeat_kv
        v = wide(v).repeat_interleave(rep, dim=1)
        att = (wide(q) @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.hd))
        if self.causal:
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf"))
        y = (att.softmax(-1) @ v).to(x.dtype)
        return self.o(y.transpose(1, 2).reshape(B, T, self.heads * self.hd))


class MLP(nn.Module):
    """fc, proj for gelu (tanh, GPT-2's) and relu; gate, up, down for swiglu:
    down(silu(gate x) · up x), silu(g)·u one fused step."""
    def __init__(self, dim, hidden, act, bias):
        super().__init__()
        self.act = act
        if act == "swiglu":
            self.gate = Linear(dim, hidden, bias=bias)
            self.up = Linear(dim, hidden, bias=bias)
            self.down = Linear(hidden, dim, bias=bias)
        else:
            self.fc = Linear(dim, hidden, bias=bias)
            self.proj = Linear(hidden, dim, bias=bias)

    def forward(self, x):
        if self.act == "swiglu":
            return self.down((F.silu(wide(self.gate(x))) * wide(self.up(x))).to(x.dtype))
        h = wide(self.fc(x))
        h = F.gelu(h, approximate="tanh") if self.act == "gelu" else F.relu(h)
        return self.proj(h.to(x.dtype))


def boolean(v):
    return {"true": True, "false": False}[v]


def make_layer(kind, a):
    """One built-in layer from its --dump-model line."""
    if kind == "Embedding":
        return nn.Embedding(int(a["n"]), int(a["dim"]))
    if kind == "Linear":
        if "tie" in a:
            return None                      # uses the tied embedding's weight
        return Linear(int(a["in"]), int(a["out"]), bias=boolean(a["bias"]))
    if kind == "LayerNorm":
        return LayerNorm(int(a["dim"]), num(a["eps"]), boolean(a.get("bias", "true")))
    if kind == "RMSNorm":
        return RMSNorm(int(a["dim"]), num(a["eps"]))
    if kind == "Attention":
        theta = None
        if a["rope"] != "none":
            _, r = call_args(a["rope"])
            theta = num(r["theta"])
        qk_eps = None
        if "qk_norm" in a:
            _, r = call_args(a["qk_norm"])
            qk_eps = num(r["eps"])
        bias = "qkv" if a["bias"] == "qkv" else boolean(a["bias"])
        return Attention(int(a["dim"]), int(a["heads"]), int(a["kv_heads"]),
                         boolean(a["causal"]), bias, theta, qk_eps)
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
        return linear(self.ln_f(x), self.tok.weight)   # head = Linear(tie = tok)


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
        return self.out(self.fc2(F.relu(self.fc1(self.emb(idx)))))   # relu is exact in bf16


class TinyVariants(Model):
    """tests/oracle/tiny_variants.fsd: bias-free LayerNorms, Qwen's attention
    (q, k, v biases, each head of q and k RMS-normed before RoPE), GELU MLP,
    untied head."""
    def forward(self, idx):
        x = self.tok(idx)
        for b in self.blocks:
            x = x + b.attn(b.ln1(x))
            x = x + b.ffn(b.ln2(x))
        return self.head(self.ln_f(x))


MODELS = {"tiny": Tiny, "tiny_llama": TinyLlama, "mlp": MlpLM, "tiny_variants": TinyVariants}


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


def mean_loss(model, x, y):
    """The mean cross entropy over x's targets, from logits widened to float
    (the loss and its log-sum-exp are statistics)."""
    logits = model(x)
    return F.cross_entropy(wide(logits).reshape(-1, logits.shape[-1]), y.reshape(-1))


def whole_grads(model, x, y, **_):
    """The step's gradient in the model's own precision: the mean over all
    G·T targets, in one pass (the sum over ranks and micro-batches is the
    same function). Returns the loss."""
    loss = mean_loss(model, x, y)
    loss.backward()
    return loss.item()


def mixed_grads(model, x, y, work, world, B, k, reduce, accumulate):
    """The step's gradient as a trainer whose policy is
    mixed_precision(param = bf16, reduce = ...) computes it, which is what
    PyTorch FSDP2 does with MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=...): the fp32 master weights (model) are rounded to bf16
    (work, the unsharded parameters the all-gather writes); each rank runs
    forward and backward on each of its micro-batches in bf16 (the layers
    above), so the parameter gradients come out in bf16; they are widened
    to fp32 and averaged over ranks (reduce = fp32), or averaged and rounded
    to bf16 (reduce = bf16), and summed over micro-batches into the fp32
    gradient of the master weights. With accumulate = unsharded each rank
    first sums its micro-batches' gradients in bf16 and the average is taken
    once, after the last. Micro-batch m of rank r holds sequences
    (m·world + r)·B … + B − 1 of the step (README's data order); its loss is
    scaled by 1/grad_accum, as the trainer's. Returns the mean loss."""
    with torch.no_grad():
        for w, p in zip(work.parameters(), model.parameters()):
            w.copy_(p)                   # the all-gather's cast: round to nearest even
    total = [torch.zeros_like(p) for p in model.parameters()]
    held = [None] * world                # each rank's bf16 gradients not yet reduced
    loss_sum = 0.0
    for m in range(k):
        for r in range(world):
            rows = slice((m * world + r) * B, (m * world + r + 1) * B)
            loss = mean_loss(work, x[rows], y[rows])
            (loss / k).backward()
            loss_sum += loss.item()
            g = [w.grad for w in work.parameters()]
            work.zero_grad(set_to_none=True)
            held[r] = g if held[r] is None else [a + b for a, b in zip(held[r], g)]
        if accumulate == "sharded" or m == k - 1:
            for i, t in enumerate(total):
                avg = sum(h[i].float() for h in held) / world
                t += avg.bfloat16().float() if reduce == "bf16" else avg
            held = [None] * world
    for p, t in zip(model.parameters(), total):
        p.grad = t
    return loss_sum / (k * world)


def precision_policy(prec, shard, model):
    """The trainer's gradient function and its arguments, from the dump's
    shard section: prec bf16 is a policy gathering parameters in bf16 (the
    trainer then computes in bf16, design §4), f32 and f64 one that does
    not; anything else is a case set up wrong."""
    mp = shard["mixed_precision"]
    if (prec == "bf16") != (mp["param"] == "bf16"):
        raise ValueError(f"prec={prec} is for trainers that do{'' if prec == 'bf16' else ' not'} "
                         f"compute in bf16, but the policy is mixed_precision(param = {mp['param']}, "
                         f"reduce = {mp['reduce']})")
    if prec != "bf16":
        return whole_grads, {}
    if mp["reduce"] not in ("bf16", "fp32"):
        raise ValueError(f"no bf16 reference for reduce = {mp['reduce']}")
    return mixed_grads, {"work": copy.deepcopy(model).to(torch.bfloat16), "reduce": mp["reduce"],
                         "accumulate": shard["accumulate"]}


Step = collections.namedtuple("Step", "loss norm lr clipped fresh")


def train_reference(dump, init, tokens, world, steps, prec, lr=None):
    """Trains the dump's model from the weights init ({name: array}) in
    PyTorch, with peak learning rate lr when the trainer ran with --lr; one
    Step a step: the loss, the gradient norm, the learning rate, whether it
    clipped (None without clipping) and whether the step ran at the weights
    it started from (fresh: no step before it moved a weight)."""
    name = dump.split()[1]
    layers, params, shard, train = parse_dump(dump)
    model = MODELS[name](layers)

    # the exported names and shapes are the model's (design §9), and load whole
    mine = {k: list(v.shape) for k, v in model.state_dict().items()}
    if mine != params or {k: list(v.shape) for k, v in init.items()} != params:
        raise ValueError(f"parameter names/shapes differ: dump {sorted(params)}, "
                         f"torch {sorted(mine)}, export {sorted(init)}")
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()}, strict=True)
    model.to(MASTER[prec])                   # the float64 build widens the F32 file too
    grads, policy = precision_policy(prec, shard, model)

    T = int(re.search(r"^\s+seq\s+(\d+)", dump, re.M).group(1))
    B, k = int(train["micro_batch"]), int(train["grad_accum"])
    G = B * k * world
    okind, oargs = call_args(train["optimizer"])
    skind, sargs = call_args(train["lr_schedule"])
    clip = None if train["grad_clip"] == "none" else num(train["grad_clip"])
    opt = make_optimizer(model, okind, oargs)
    peak = num(oargs["lr"]) if lr is None else lr
    params_list = list(model.parameters())
    start = [p.detach().clone() for p in params_list]

    rows = []
    for s in range(steps):
        fresh = (not rows or rows[-1].fresh) and all(map(torch.equal, params_list, start))
        x, y = batch(tokens, s, G, T)
        opt.zero_grad(set_to_none=False)
        loss = grads(model, x, y, world=world, B=B, k=k, **policy)
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(params_list, clip).item()
        else:
            norm = torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in params_list])).item()
        rate = lr_at(s, steps, skind, sargs, peak)
        for g in opt.param_groups:
            g["lr"] = rate
        opt.step()
        rows.append(Step(loss, norm, rate, None if clip is None else norm > clip, fresh))
    return rows


def run_case(label, dump_path, init_path, log_path, world, data_path, steps, prec, lr=None):
    with open(dump_path) as f:
        dump = f.read()
    log = fsdfiles.read_log(log_path)
    if len(log) != steps or [r["step"] for r in log] != list(range(steps)):
        return False, f"{label}: the log has {len(log)} steps, expected 0 … {steps - 1}"
    rows = train_reference(dump, read_safetensors(init_path), read_tokens(data_path), world,
                           steps, prec, lr)

    def rel(a, b):
        if a is None or b is None:
            return math.inf
        return abs(a - b) / max(abs(b), 1e-30)

    eloss = [rel(r["loss"], ref.loss) for r, ref in zip(log, rows)]
    enorm = [rel(r["grad_norm"], ref.norm) for r, ref in zip(log, rows)]
    elr = [rel(r["lr"], ref.lr) for r, ref in zip(log, rows)]
    nfresh = sum(ref.fresh for ref in rows)
    floss = sum(eloss[:nfresh]) / nfresh     # the means over the fresh steps
    fnorm = sum(enorm[:nfresh]) / nfresh
    bar_loss, bar_floss, bar_norm, bar_fnorm = BARS[prec]
    good = (max(eloss) <= bar_loss and floss <= bar_floss and max(enorm) <= bar_norm
            and fnorm <= bar_fnorm and max(elr) <= LR_RTOL)
    fresh = "step 0" if nfresh == 1 else f"mean over steps 0-{nfresh - 1} at the starting weights"
    clipped = ("no clipping" if rows[0].clipped is None else
               f"{sum(r.clipped for r in rows)} steps clipped")
    msg = (f"{label}: {steps} steps, loss max rel err {max(eloss):.1e} (bar {bar_loss:g}; "
           f"{fresh} {floss:.1e}, bar {bar_floss:g}), grad norm max rel err {max(enorm):.1e} "
           f"(bar {bar_norm:g}; {fresh} {fnorm:.1e}, bar {bar_fnorm:g}), "
           f"loss {rows[0].loss:.3f} -> {rows[-1].loss:.3f}, {clipped}")
    if not good:
        msg += "\n     step  loss(trainer)  loss(torch)   rel     norm(trainer) norm(torch)  rel     lr rel"
        for s, (r, ref) in enumerate(zip(log, rows)):
            msg += (f"\n     {s:4d}  {r['loss']:.8f}  {ref.loss:.8f}  {eloss[s]:.1e}  "
                    f"{r['grad_norm']:.8f}  {ref.norm:.8f}  {enorm[s]:.1e}  {elr[s]:.1e}")
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
        layers, params, _, _ = parse_dump(f.read())
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


# ── the initialisation formula (docs/runtime.md#initialisation), vectorised ──

U64 = (1 << 64) - 1


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for c in text.encode():
        h = ((h ^ c) * 0x100000001B3) & U64
    return h


def splitmix64(x):
    """x: a uint64 array; numpy's uint64 arithmetic wraps mod 2^64."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def init_normal(name, seed, numel, std):
    """Elements 0 … numel − 1 of parameter `name`, in float64."""
    key = np.uint64(fnv1a64(name) ^ ((seed * 0x9E3779B97F4A7C15) & U64))
    with np.errstate(over="ignore"):
        i2 = np.arange(numel, dtype=np.uint64) * np.uint64(2) + key
        u = [((splitmix64(i2 + np.uint64(k)) >> np.uint64(11)).astype(np.float64) + 1) * 2.0**-53
             for k in (0, 1)]
    return std * np.sqrt(-2 * np.log(u[0])) * np.cos(2 * math.pi * u[1])


def check_init(dump_path, weights_path):
    """The exported initial weights against the formula, each parameter at
    its std: equal but for the last bit of an fp32 rounding (numpy's log
    and cos against the C library's)."""
    with open(dump_path) as f:
        text = f.read()
    inits = {}
    _, params, _, train = parse_dump(text, inits)
    seed = int(train["seed"])
    got = read_safetensors(weights_path)
    if sorted(got) != sorted(params):
        return False, f"tensors {sorted(got)}, the dump has {sorted(params)}"
    worst, stds = 0.0, collections.Counter()
    for name, kind in inits.items():
        a = got[name].astype(np.float64).reshape(-1)
        if kind in ("zeros", "ones"):
            if not np.all(a == (0.0 if kind == "zeros" else 1.0)):
                return False, f"{name} is not all {kind}"
            continue
        m = re.fullmatch(r"normal(?:\(std=(.*)\))?", kind)
        if not m:
            return False, f"{name}: unknown initialisation {kind!r}"
        std = float(m.group(1)) if m.group(1) else 0.02
        want = init_normal(name, seed, a.size, std)
        err = float(np.max(np.abs(a - want))) / std
        if err > 1e-6:
            return False, f"{name}: max |exported − formula| / std = {err:.1e} at std {std:g}"
        worst = max(worst, err)
        stds[f"{std:.6g}"] += 1
    what = ", ".join(f"{n} at std {s}" for s, n in sorted(stds.items()))
    return True, (f"{len(inits)} tensors, normal: {what} (max |exported − formula| / std "
                  f"{worst:.1e}); the rest zeros and ones")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("weights", help="write far-from-init weights for --init-from")
    w.add_argument("dump")
    w.add_argument("out")
    w.add_argument("--seed", type=int, default=1)
    i = sub.add_parser("init", help="check exported initial weights against the formula")
    i.add_argument("dump")
    i.add_argument("weights")
    c = sub.add_parser("compare", help="train in PyTorch and compare with trainer logs")
    c.add_argument("--case", nargs="+", action="append", required=True, metavar="KEY=VALUE",
                   help="label, model, init, log, world, data, steps, prec (f32, f64 or bf16), "
                        "optionally lr (the trainer's --lr)")
    args = ap.parse_args()
    if args.cmd == "weights":
        far_weights(args.dump, args.out, args.seed)
        return 0
    if args.cmd == "init":
        good, msg = check_init(args.dump, args.weights)
        print(msg)
        return 0 if good else 1

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
                                 c["data"], int(c["steps"]), c["prec"],
                                 float(c["lr"]) if "lr" in c else None)
        except Exception as e:          # a broken input is a failed case, not a crash
            good, msg = False, f"{label}: {type(e).__name__}: {e}"
        print(("ok   " if good else "FAIL ") + msg, flush=True)
        passed += good
        failed += not good
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
