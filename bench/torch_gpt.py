#!/usr/bin/python3
"""torch_gpt.py — the PyTorch side of `make bench`: the GPT of an fsdpc
model file, trained in PyTorch eager mode on the same data, from the same
initial weights, with the same optimizer, so the two trainers' tokens/s
compare like for like.

The architecture is written from docs/design.md#semantics-the-tests-rely-on (GPT-2's: pre-norm
blocks, learned positions, tanh GELU, tied head, Linear layers with biases,
causal attention with scale 1/sqrt(head_dim)); the parameter names are
fsdpc's, so the initial weights come from the fsdpc trainer's
`--steps 0 --export F.safetensors`. The data order is docs/runtime.md's for
one rank: step s reads sequences s*G ... s*G + G - 1 (G = --batch), sequence
j being tokens [j*T, j*T + T]. The optimizer is torch.optim.AdamW with weight
decay on parameters of two or more dimensions only, clip_grad_norm_ and the
cosine schedule, as fsdpc's runtime does.

Runs under Debian's python3-torch 1.13 (/usr/bin/python3) and under
PyTorch 2 from PyPI (.venv-torch2/bin/python, tools/venv-torch2.sh), with
numpy. Under PyTorch 2 attention is F.scaled_dot_product_attention (what
nanoGPT and a PyTorch 2 user run; 1.13 has none), and `--compile` trains
torch.compile(model) (inductor: C++ kernels built with the system's C
compiler; the first steps compile, the bench counts them as warm-up). Set
OMP_NUM_THREADS before starting it (OpenBLAS and MKL read it when they
load); the script also calls torch.set_num_threads. Prints one JSON object:
per-step losses and wall times (ms) and the process's peak resident memory.
"""
import argparse
import json
import math
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import fsdfiles   # tests/fsdfiles.py: the one safetensors reader

SDPA = hasattr(F, "scaled_dot_product_attention")   # PyTorch 2


def read_safetensors(path):
    """{name: float32 tensor} of an fsdpc --export file"""
    try:
        tensors, _ = fsdfiles.read_safetensors(path)
    except fsdfiles.FormatError as e:
        sys.exit(str(e))
    return {name: torch.from_numpy(np.frombuffer(t.raw, dtype="<f4").reshape(t.shape).copy())
            for name, t in tensors.items()}


def read_tokens(path):
    """llm.c's token file: 256 int32 of header, then uint16 (v1) or uint32 (v2)."""
    head = np.fromfile(path, dtype="<i4", count=256)
    if head[0] != 20240520:
        sys.exit(f"{path}: not a token file")
    dt = {1: "<u2", 2: "<u4"}[int(head[1])]
    return np.fromfile(path, dtype=dt, count=int(head[2]), offset=1024).astype(np.int64)


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)

    def forward(self, x):
        B, T, C = x.shape
        H, hd = self.heads, C // self.heads
        q = self.q(x).view(B, T, H, hd).transpose(1, 2)
        k = self.k(x).view(B, T, H, hd).transpose(1, 2)
        v = self.v(x).view(B, T, H, hd).transpose(1, 2)
        if SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o(y.transpose(1, 2).reshape(B, T, C))
        # torch 1.13 has no scaled_dot_product_attention: nanoGPT's eager path
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        return self.o(y)


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = Attention(dim, heads)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = MLP(dim, 4 * dim)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(T))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.tok.weight)   # head, tied to tok
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def lr_at(s, steps, lr, warmup, min_lr):
    if s < warmup:
        return lr * (s + 1) / warmup
    return min_lr + 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))) * (lr - min_lr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("vocab", "dim", "layers", "heads", "seq", "batch", "steps", "threads", "warmup"):
        ap.add_argument("--" + name, type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--min-lr", type=float, required=True)
    ap.add_argument("--betas", type=float, nargs=2, required=True)
    ap.add_argument("--weight-decay", type=float, required=True)
    ap.add_argument("--grad-clip", type=float, required=True)
    ap.add_argument("--init", required=True, help="initial weights (fsdpc --export)")
    ap.add_argument("--data", required=True)
    ap.add_argument("--compile", action="store_true", help="train torch.compile(model)")
    ap.add_argument("--profile-out", help="profile the steps after the first two (torch.profiler) "
                    "and write {op: self CPU ms per step} to this JSON file")
    a = ap.parse_args()
    if a.compile and not hasattr(torch, "compile"):
        sys.exit(f"torch_gpt.py: --compile needs PyTorch 2; this is {torch.__version__}")

    torch.set_num_threads(a.threads)
    model = GPT(a.vocab, a.dim, a.layers, a.heads, a.seq)
    weights = read_safetensors(a.init)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing:
        sys.exit(f"{a.init}: no weights for {missing}")
    step_model = torch.compile(model) if a.compile else model
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=tuple(a.betas), eps=1e-8)

    tokens = torch.from_numpy(read_tokens(a.data))
    T, G = a.seq, a.batch
    nseq = (len(tokens) - 1) // T
    losses, ms = [], []
    prof = None
    for s in range(a.steps):
        if a.profile_out and s == 2:   # past torch.compile's compiling steps
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            prof.__enter__()
        t0 = time.perf_counter()
        rows = [(s * G + b) % nseq for b in range(G)]
        chunk = torch.stack([tokens[j * T: j * T + T + 1] for j in rows])
        idx, targets = chunk[:, :-1], chunk[:, 1:]
        for group in opt.param_groups:
            group["lr"] = lr_at(s, a.steps, a.lr, a.warmup, a.min_lr)
        loss = step_model(idx, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        losses.append(loss.item())
        ms.append((time.perf_counter() - t0) * 1e3)
    if prof:
        prof.__exit__(None, None, None)
        n = a.steps - 2
        ops = {e.key: e.self_cpu_time_total / 1e3 / n for e in prof.key_averages()
               if e.self_cpu_time_total > 0}
        with open(a.profile_out, "w") as f:
            json.dump(dict(steps=n, step_ms=sum(ms[2:]) / n, self_ms=ops), f, indent=1)
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"loss": losses, "step_ms": ms, "max_rss_kib": rss_kib,
                      "torch": torch.__version__, "threads": torch.get_num_threads(),
                      "compile": a.compile, "sdpa": SDPA}))


if __name__ == "__main__":
    main()
