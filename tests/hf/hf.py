#!/usr/bin/env python3
"""hf.py — tests/hf/run.sh's side of the checks that `transformers` itself
makes (run with .venv/bin/python, tools/venv.sh):

    hf.py make gpt2|llama|llama_tb|qwen2 DIR
        a tiny random GPT2LMHeadModel or LlamaForCausalLM (Llama: grouped-
        query attention, RoPE theta 500000, SwiGLU, RMSNorm; llama_tb: with
        a head tied to the embedding and biases, attention_bias and
        mlp_bias, RoPE theta 10000 and fp16 weights; qwen2: a
        Qwen2ForCausalLM, biases on q, k and v alone, a tied head, and a
        sliding window configured with use_sliding_window false), its weights
        drawn large enough (std 0.3, norm weights 1 ± 0.3) that a wrong
        layout or rotary convention moves the loss visibly, saved with
        save_pretrained in BF16 with a max_shard_size that gives 2 or 3 shards;
        prints that size in bytes.
    hf.py loss DIR TOKENS.bin B T LOG.json [BOUND]
        DIR loaded with from_pretrained in float32 (bf16 → fp32 is exact);
        its mean cross-entropy over sequences 0 … B−1 of TOKENS.bin (fsdpc's
        data order: sequence j is tokens [jT, jT + T], inputs then shifted
        targets) against the loss LOG.json's step 0 logged: the relative
        difference is printed and must be at most BOUND (default 2e-6).
    hf.py same ORIG EXPORT
        EXPORT (fsdpc's --export DIR, with the config.json it wrote)
        loads with from_pretrained, and every tensor of it equals ORIG's bit
        for bit, in ORIG's dtype (BF16, or F16); and EXPORT's files are ORIG's: the same shard
        names and the same index text as save_pretrained wrote.

Each prints why and exits 1 when its check fails.
"""
import json
import os
import sys

import torch

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import read_tokens  # noqa: E402

import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

transformers.logging.set_verbosity_error()


def die(msg):
    print(msg)
    sys.exit(1)


def make(kind, out):
    torch.manual_seed({"gpt2": 7, "llama": 11, "llama_tb": 13, "qwen2": 17}[kind])
    dtype = torch.float16 if kind == "llama_tb" else torch.bfloat16
    if kind == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                                      activation_function="gelu_new")
        model = transformers.GPT2LMHeadModel(cfg)
    elif kind == "qwen2":
        # biases on q, k and v only; a sliding window configured but off
        cfg = transformers.Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, rope_theta=1000000.0,
                                       max_position_embeddings=32, rms_norm_eps=1e-6,
                                       tie_word_embeddings=True, use_sliding_window=False,
                                       sliding_window=16)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, rope_theta=500000.0,
                                       max_position_embeddings=32, rms_norm_eps=1e-5)
        if kind == "llama_tb":
            cfg.rope_theta, cfg.tie_word_embeddings = 10000.0, True
            cfg.attention_bias = cfg.mlp_bias = True
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():   # a tied head is the embedding
            norm = "ln_" in name or "norm" in name
            if norm and name.endswith("weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model = model.to(dtype)
    total = sum(t.numel() * 2 for t in model.state_dict().values())
    size = total // 2 + 1   # two shards, three when tensors straddle the middle
    model.save_pretrained(out, max_shard_size=size, safe_serialization=True)
    print(size)


def loss(path, tokens_path, B, T, log_path, bound=2e-6):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    tokens = read_tokens(tokens_path)
    seqs = [tokens[j * T:j * T + T + 1] for j in range(B)]
    idx = torch.tensor([s[:-1] for s in seqs])
    tgt = torch.tensor([s[1:] for s in seqs])
    with torch.no_grad():
        logits = model(idx).logits
        want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tgt.reshape(-1)).item()
    got = json.loads(open(log_path).readline())["loss"]
    rel = abs(got - want) / abs(want)
    print(f"transformers {want:.9g}, fsdpc {got:.9g}, relative difference {rel:.2g}")
    if not rel <= bound:
        die(f"the losses differ by {rel:.3g} relative, more than {bound}")


def same(orig, export):
    dtype = getattr(torch, json.load(open(os.path.join(orig, "config.json")))["torch_dtype"])
    a = transformers.AutoModelForCausalLM.from_pretrained(orig, torch_dtype=dtype)
    b = transformers.AutoModelForCausalLM.from_pretrained(export, torch_dtype=dtype)
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        die(f"from_pretrained: parameters {sorted(set(sa) ^ set(sb))} differ")
    for k in sa:
        if not torch.equal(sa[k].view(torch.int16), sb[k].view(torch.int16)):
            die(f"from_pretrained: {k} differs")
    files = lambda d: sorted(f for f in os.listdir(d) if f.startswith("model"))  # noqa: E731
    if files(orig) != files(export):
        die(f"files: save_pretrained wrote {files(orig)}, fsdpc {files(export)}")
    for f in files(orig):
        if f.endswith(".json"):
            if open(os.path.join(orig, f)).read() != open(os.path.join(export, f)).read():
                die(f"{f}: fsdpc's text is not save_pretrained's")
            continue
        x, y = load_file(os.path.join(orig, f)), load_file(os.path.join(export, f))
        if x.keys() != y.keys():
            die(f"{f}: tensors {sorted(set(x) ^ set(y))} differ")
        for k in x:
            if x[k].dtype != dtype or y[k].dtype != dtype:
                die(f"{f}: {k} is {y[k].dtype} (save_pretrained's: {x[k].dtype})")
            if not torch.equal(x[k].view(torch.int16), y[k].view(torch.int16)):
                die(f"{f}: {k} is not bit for bit save_pretrained's")
    n = sum(len(load_file(os.path.join(export, f))) for f in files(export) if f.endswith("s"))
    print(f"{len(files(export))} files, {n} tensors, {len(sa)} parameters: all bit for bit")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "make":
        make(*args)
    elif cmd == "loss":
        loss(args[0], args[1], int(args[2]), int(args[3]), args[4],
             *(float(x) for x in args[5:]))
    elif cmd == "same":
        same(*args)
    else:
        die(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
