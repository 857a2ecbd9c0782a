#!/usr/bin/env python3
"""check_hf.py — checks of `--export --hf-names` files against Hugging Face's
conventions, standard library only (tests/ckpt/run.sh runs them):

    check_hf.py gpt2-layout PLAIN.st HF.st
        HF.st holds GPT2LMHeadModel's tensors (names, shapes), each made from
        PLAIN.st's (fsdpc's names, the examples' naming: tok, pos,
        blocks.N.{ln1,attn,ln2,mlp}, ln_f) as transformers lays them out:
        Conv1D weights transposed, c_attn = concat(q, k, v)ᵀ, no lm_head.
    check_hf.py llama-layout PLAIN.st HF.st
        the same for LlamaForCausalLM from tok, layers.N.{attn_norm, attn,
        mlp_norm, mlp}, norm, head; with attention biases (q_proj.bias ...,
        Qwen2's: o_proj has none under bias = qkv) and qk_norm's q_norm and
        k_norm (Qwen3's self_attn.q_norm.weight, self_attn.k_norm.weight)
        where the model has them.
    check_hf.py randomize HF.st OUT.st SEED
        OUT.st: HF.st's tensors with random values large enough (std 0.3,
        norm weights 1 ± 0.3) that attention is far from uniform, so a
        wrong layout or rotary convention moves the loss visibly.
    check_hf.py gpt2-loss HF.st TOKENS.bin HEADS LOG.json
    check_hf.py llama-loss HF.st TOKENS.bin HEADS KV_HEADS THETA SEQ LOG.json [interleaved]
        the mean cross-entropy of sequence 0 of TOKENS.bin computed here, by
        transformers' GPT-2 (Conv1D: y = x·W + b) or Llama (rotate-half
        RoPE on the unpermuted q_proj, k_proj; repeat_kv; Qwen2's q, k, v
        biases and Qwen3's RMSNorm of each head of q and k before RoPE when
        the file has them) forward written
        out in Python, equals the loss LOG.json's step 0 logged (a run of
        one sequence a step), to 1e-5 relative. With `interleaved`, the
        forward uses Meta's original rotary pairing (x0,x1),(x2,x3)… instead,
        and the check passes only if the loss then DIFFERS (by 1e-3): the
        test can tell the two conventions apart.

Each prints why and exits 1 when its check fails.
"""
import json
import math
import os
import struct
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import read_safetensors, read_tokens, write_safetensors


def die(msg):
    print(msg)
    sys.exit(1)


def read_st(path):
    """{name: (shape, [floats])} of an export, with fsdpc's __metadata__"""
    tensors, meta = read_safetensors(path)
    if meta != {"format": "pt"}:
        die(f"{path}: __metadata__ {meta}")
    return {name: (t.shape, t.values()) for name, t in tensors.items()}


def matrix(t):
    shape, v = t
    rows, cols = shape
    return [v[i * cols:(i + 1) * cols] for i in range(rows)]


def transpose(m):
    return [list(c) for c in zip(*m)]


def expect(hf, name, shape, values):
    if name not in hf:
        die(f"no tensor {name}")
    if hf[name][0] != shape:
        die(f"{name}: shape {hf[name][0]}, expected {shape}")
    if hf[name][1] != values:
        die(f"{name}: values are not the expected layout of fsdpc's")


def flat(m):
    return [x for row in m for x in row]


def gpt2_layout(plain_path, hf_path):
    p, hf = read_st(plain_path), read_st(hf_path)
    C = p["tok.weight"][0][1]
    layers = len({k.split(".")[1] for k in p if k.startswith("blocks.")})
    want = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
            "transformer.ln_f.bias"}
    expect(hf, "transformer.wte.weight", p["tok.weight"][0], p["tok.weight"][1])
    expect(hf, "transformer.wpe.weight", p["pos.weight"][0], p["pos.weight"][1])
    for t in ("weight", "bias"):
        expect(hf, f"transformer.ln_f.{t}", [C], p[f"ln_f.{t}"][1])
    for n in range(layers):
        a, h = f"blocks.{n}.", f"transformer.h.{n}."
        for src, dst in (("ln1", "ln_1"), ("ln2", "ln_2")):
            for t in ("weight", "bias"):
                expect(hf, h + f"{dst}.{t}", [C], p[a + f"{src}.{t}"][1])
                want.add(h + f"{dst}.{t}")
        qkv = [matrix(p[a + f"attn.{x}.weight"]) for x in "qkv"]
        cat = [sum((row for row in rows), []) for rows in zip(*[transpose(w) for w in qkv])]
        expect(hf, h + "attn.c_attn.weight", [C, 3 * C], flat(cat))
        expect(hf, h + "attn.c_attn.bias", [3 * C],
               sum((p[a + f"attn.{x}.bias"][1] for x in "qkv"), []))
        expect(hf, h + "attn.c_proj.weight", [C, C], flat(transpose(matrix(p[a + "attn.o.weight"]))))
        expect(hf, h + "attn.c_proj.bias", [C], p[a + "attn.o.bias"][1])
        H = p[a + "mlp.fc.weight"][0][0]
        expect(hf, h + "mlp.c_fc.weight", [C, H], flat(transpose(matrix(p[a + "mlp.fc.weight"]))))
        expect(hf, h + "mlp.c_fc.bias", [H], p[a + "mlp.fc.bias"][1])
        expect(hf, h + "mlp.c_proj.weight", [H, C], flat(transpose(matrix(p[a + "mlp.proj.weight"]))))
        expect(hf, h + "mlp.c_proj.bias", [C], p[a + "mlp.proj.bias"][1])
        want |= {h + x for x in ("attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                                 "attn.c_proj.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                                 "mlp.c_proj.weight", "mlp.c_proj.bias")}
    if set(hf) != want:
        die(f"unexpected or missing tensors: {sorted(set(hf) ^ want)}")


def llama_layout(plain_path, hf_path):
    p, hf = read_st(plain_path), read_st(hf_path)
    C = p["tok.weight"][0][1]
    layers = len({k.split(".")[1] for k in p if k.startswith("layers.")})
    want = {"model.embed_tokens.weight", "model.norm.weight"}
    expect(hf, "model.embed_tokens.weight", p["tok.weight"][0], p["tok.weight"][1])
    expect(hf, "model.norm.weight", [C], p["norm.weight"][1])
    if "head.weight" in p:
        expect(hf, "lm_head.weight", p["head.weight"][0], p["head.weight"][1])
        want.add("lm_head.weight")
    for n in range(layers):
        a, h = f"layers.{n}.", f"model.layers.{n}."
        pairs = [("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm")]
        pairs += [(f"attn.{x}", f"self_attn.{x}_proj") for x in "qkvo"]
        pairs += [(f"mlp.{x}", f"mlp.{x}_proj") for x in ("gate", "up", "down")]
        for src, dst in pairs:   # no transposes, no rotary permutation
            expect(hf, h + dst + ".weight", p[a + src + ".weight"][0], p[a + src + ".weight"][1])
            want.add(h + dst + ".weight")
            if a + src + ".bias" in p:   # attention_bias (Qwen2: q, k, v only), mlp_bias
                expect(hf, h + dst + ".bias", p[a + src + ".bias"][0], p[a + src + ".bias"][1])
                want.add(h + dst + ".bias")
        for x in ("q_norm", "k_norm"):   # Qwen3's qk_norm: [head_dim]
            if a + f"attn.{x}.weight" in p:
                src = p[a + f"attn.{x}.weight"]
                expect(hf, h + f"self_attn.{x}.weight", src[0], src[1])
                want.add(h + f"self_attn.{x}.weight")
    if set(hf) != want:
        die(f"unexpected or missing tensors: {sorted(set(hf) ^ want)}")


# ── transformers' forward passes, written out ──

def matmul(x, w):
    """x [T, K] · w [K, N]"""
    wt = transpose(w)
    return [[sum(a * b for a, b in zip(row, col)) for col in wt] for row in x]


def linear(x, w):
    """nn.Linear: x · wᵀ, w [out, in]"""
    return [[sum(a * b for a, b in zip(row, wr)) for wr in w] for row in x]


def add_bias(x, b):
    return [[a + c for a, c in zip(row, b)] for row in x]


def layer_norm(x, w, b, eps=1e-5):
    out = []
    for row in x:
        mu = sum(row) / len(row)
        var = sum((v - mu) ** 2 for v in row) / len(row)
        r = 1 / math.sqrt(var + eps)
        out.append([(v - mu) * r * wi + bi for v, wi, bi in zip(row, w, b)])
    return out


def rms_norm(x, w, eps=1e-6):
    out = []
    for row in x:
        r = 1 / math.sqrt(sum(v * v for v in row) / len(row) + eps)
        out.append([v * r * wi for v, wi in zip(row, w)])
    return out


def head_norm(x, w, heads):
    """Qwen3's q_norm / k_norm: rms_norm of each head (w [head_dim])"""
    hd = len(x[0]) // heads
    return [sum(rms_norm([row[h * hd:(h + 1) * hd] for h in range(heads)], w), [])
            for row in x]


def gelu_new(x):
    return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + math.exp(-x))


def attention(q, k, v, heads, kv_heads):
    """causal softmax attention; q [T, heads·hd], k, v [T, kv_heads·hd];
    query head h reads kv head h // (heads / kv_heads) (repeat_kv)"""
    T = len(q)
    hd = len(q[0]) // heads
    out = [[0.0] * (heads * hd) for _ in range(T)]
    for h in range(heads):
        g = h // (heads // kv_heads)
        for t in range(T):
            qs = q[t][h * hd:(h + 1) * hd]
            s = [sum(a * b for a, b in zip(qs, k[u][g * hd:(g + 1) * hd])) / math.sqrt(hd)
                 for u in range(t + 1)]
            mx = max(s)
            e = [math.exp(x - mx) for x in s]
            z = sum(e)
            for u in range(t + 1):
                for d in range(hd):
                    out[t][h * hd + d] += e[u] / z * v[u][g * hd + d]
    return out


def rope(x, heads, theta, interleaved=False):
    """transformers' apply_rotary_pos_emb: rotate_half on each head (pairs
    (i, i + hd/2)); interleaved: Meta's original pairs (2i, 2i + 1)"""
    hd = len(x[0]) // heads
    half = hd // 2
    inv = [1 / theta ** (2 * i / hd) for i in range(half)]
    out = []
    for t, row in enumerate(x):
        r = []
        for h in range(heads):
            v = row[h * hd:(h + 1) * hd]
            if interleaved:
                for i in range(half):
                    c, s = math.cos(t * inv[i]), math.sin(t * inv[i])
                    a, b = v[2 * i], v[2 * i + 1]
                    v[2 * i], v[2 * i + 1] = a * c - b * s, b * c + a * s
                r += v
                continue
            cos = [math.cos(t * f) for f in inv] * 2
            sin = [math.sin(t * f) for f in inv] * 2
            rot = [-a for a in v[half:]] + v[:half]
            r += [a * c + b * s for a, b, c, s in zip(v, rot, cos, sin)]
        out.append(r)
    return out


def cross_entropy(logits, targets):
    total = 0.0
    for row, y in zip(logits, targets):
        mx = max(row)
        total += math.log(sum(math.exp(v - mx) for v in row)) + mx - row[y]
    return total / len(targets)


def gpt2_loss(w, ids, targets, heads):
    t = lambda name: w[f"transformer.{name}"]
    layers = len({k.split(".")[2] for k in w if k.startswith("transformer.h.")})
    wte, wpe = matrix(t("wte.weight")), matrix(t("wpe.weight"))
    x = [[a + b for a, b in zip(wte[i], wpe[p])] for p, i in enumerate(ids)]
    C = len(x[0])
    for n in range(layers):
        h = f"h.{n}."
        a = layer_norm(x, t(h + "ln_1.weight")[1], t(h + "ln_1.bias")[1])
        qkv = add_bias(matmul(a, matrix(t(h + "attn.c_attn.weight"))), t(h + "attn.c_attn.bias")[1])
        q, k, v = ([row[i * C:(i + 1) * C] for row in qkv] for i in range(3))
        y = attention(q, k, v, heads, heads)
        y = add_bias(matmul(y, matrix(t(h + "attn.c_proj.weight"))), t(h + "attn.c_proj.bias")[1])
        x = [[p + q_ for p, q_ in zip(r1, r2)] for r1, r2 in zip(x, y)]
        a = layer_norm(x, t(h + "ln_2.weight")[1], t(h + "ln_2.bias")[1])
        m = add_bias(matmul(a, matrix(t(h + "mlp.c_fc.weight"))), t(h + "mlp.c_fc.bias")[1])
        m = [[gelu_new(v_) for v_ in row] for row in m]
        m = add_bias(matmul(m, matrix(t(h + "mlp.c_proj.weight"))), t(h + "mlp.c_proj.bias")[1])
        x = [[p + q_ for p, q_ in zip(r1, r2)] for r1, r2 in zip(x, m)]
    x = layer_norm(x, t("ln_f.weight")[1], t("ln_f.bias")[1])
    return cross_entropy(linear(x, wte), targets)   # lm_head tied to wte


def llama_loss(w, ids, targets, heads, kv_heads, theta, interleaved=False):
    t = lambda name: w[f"model.{name}"]
    layers = len({k.split(".")[2] for k in w if k.startswith("model.layers.")})
    emb = matrix(t("embed_tokens.weight"))
    x = [list(emb[i]) for i in ids]
    for n in range(layers):
        h = f"layers.{n}."
        a = rms_norm(x, t(h + "input_layernorm.weight")[1])

        def proj(name, x_, w=w, h=h):   # nn.Linear, with its bias when the file has one
            y_ = linear(x_, matrix(t(h + f"self_attn.{name}_proj.weight")))
            b = w.get(f"model.{h}self_attn.{name}_proj.bias")
            return add_bias(y_, b[1]) if b else y_

        q, k = proj("q", a), proj("k", a)
        if f"model.{h}self_attn.q_norm.weight" in w:   # Qwen3: each head, before RoPE
            q = head_norm(q, t(h + "self_attn.q_norm.weight")[1], heads)
            k = head_norm(k, t(h + "self_attn.k_norm.weight")[1], kv_heads)
        q = rope(q, heads, theta, interleaved)
        k = rope(k, kv_heads, theta, interleaved)
        v = proj("v", a)
        y = proj("o", attention(q, k, v, heads, kv_heads))
        x = [[p + q_ for p, q_ in zip(r1, r2)] for r1, r2 in zip(x, y)]
        a = rms_norm(x, t(h + "post_attention_layernorm.weight")[1])
        g = linear(a, matrix(t(h + "mlp.gate_proj.weight")))
        u = linear(a, matrix(t(h + "mlp.up_proj.weight")))
        m = linear([[silu(p) * q_ for p, q_ in zip(r1, r2)] for r1, r2 in zip(g, u)],
                   matrix(t(h + "mlp.down_proj.weight")))
        x = [[p + q_ for p, q_ in zip(r1, r2)] for r1, r2 in zip(x, m)]
    x = rms_norm(x, t("norm.weight")[1])
    head = matrix(w["lm_head.weight"]) if "lm_head.weight" in w else emb
    return cross_entropy(linear(x, head), targets)


def sequence0(tokens_path, T):
    tok = read_tokens(tokens_path)
    return tok[:T], tok[1:T + 1]


def compare(loss, log_path, differ=False):
    with open(log_path) as f:
        first = json.loads(f.readline())
    close = first["step"] == 0 and abs(first["loss"] - loss) <= 1e-5 * abs(loss)
    if differ and abs(first["loss"] - loss) < 1e-3 * abs(loss):
        die(f"interleaved rotary pairs give loss {loss!r}, as the trainer's {first['loss']!r}: "
            "the check cannot tell the conventions apart")
    if not differ and not close:
        die(f"transformers' forward gives loss {loss!r}; the trainer logged {first['loss']!r}")
    print(f"loss {loss:.9f} (trainer {first['loss']})")


def randomize(src, dst, seed):
    """src's tensors, random values; written as fsdpc's export writes them"""
    import random
    rnd = random.Random(seed)
    out = {}
    for name, (shape, vals) in read_st(src).items():
        norm = name.endswith("norm.weight") or ".ln_" in name and name.endswith("weight")
        v = [(1.0 if norm else 0.0) + rnd.gauss(0, 0.3) for _ in vals]
        out[name] = (shape, struct.pack(f"<{len(v)}f", *v))
    write_safetensors(dst, out)


def main(argv):
    if len(argv) < 4:
        die(__doc__)
    cmd = argv[1]
    if cmd == "randomize":
        randomize(argv[2], argv[3], int(argv[4]))
    elif cmd == "gpt2-layout":
        gpt2_layout(argv[2], argv[3])
    elif cmd == "llama-layout":
        llama_layout(argv[2], argv[3])
    elif cmd == "gpt2-loss":
        w = read_st(argv[2])
        T = w["transformer.wpe.weight"][0][0]
        ids, targets = sequence0(argv[3], T)
        compare(gpt2_loss(w, ids, targets, int(argv[4])), argv[5])
    elif cmd == "llama-loss":
        w = read_st(argv[2])
        T = int(argv[7])
        ids, targets = sequence0(argv[3], T)
        inter = argv[9:] == ["interleaved"]
        compare(llama_loss(w, ids, targets, int(argv[4]), int(argv[5]), float(argv[6]), inter),
                argv[8], differ=inter)
    else:
        die(__doc__)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (KeyError, IndexError, OSError, ValueError) as e:
        die(f"{sys.argv[1]}: {type(e).__name__}: {e}")
