#!/usr/bin/env python3
"""tokens.py — tests/data/run.sh's checks of tools/fstokens.py's output
(run with .venv/bin/python, tools/venv.sh):

    tokens.py gen DIR SEED N
        N documents of generated UTF-8 text (ASCII, accents, a dash, Japanese)
        as DIR/doc000.txt ...: a local corpus, the same for a seed.
    tokens.py split SRC.bin T M PREFIX
        SRC's sequences (of T + 1 tokens, sharing one) in shards of M:
        PREFIX_000.bin holds sequences 0 … M−1 (tokens [0, M·T]), the next
        M … 2M−1, ...: read by pattern, they are SRC's sequences in SRC's
        order (the last, shorter shard as long as SRC leaves). Plain python3.
    tokens.py shards TOKENIZER CORPUS SHARDS FRACTION PER
        SHARDS/train_*.bin and val_*.bin against CORPUS's files: every shard
        of PER tokens but each split's last; decoded, val and train are the
        documents (each after <|endoftext|>), each once, in the corpus's
        order within a split (the round trip: decode == text); val holds
        FRACTION of the tokens to within one document's tokens.
    tokens.py walk EXPORT VAL.bin T K LOG.json
        EXPORT (the trainer's --export DIR with config.json and
        tokenizer.json copied in) loads with from_pretrained and
        PreTrainedTokenizerFast; a sentence round-trips through the
        tokenizer; the model's mean cross-entropy over VAL.bin's sequences
        0 … K−1 (fsdpc's data order) equals the val_loss of LOG.json's last
        line to 1e-5 relative.

Each prints why and exits 1 when its check fails.
"""
import glob
import json
import os
import random
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import read_tokens  # noqa: E402


def die(msg):
    print("tokens.py: " + msg)
    sys.exit(1)


def gen(out, seed, n):
    r = random.Random(int(seed))
    subj = ["the model", "a rank", "the planner", "every shard", "la coupe", "the café",
            "日本の列車", "a gradient"]
    verb = ["gathers", "reduces", "shards", "reads", "writes", "mange", "走る", "checks"]
    obj = ["the weights", "its tokens", "a checkpoint", "the data — all of it", "les données",
           "次の駅", "one sequence"]
    os.makedirs(out, exist_ok=True)
    for d in range(int(n)):
        with open(os.path.join(out, "doc%03d.txt" % d), "w", encoding="utf-8") as f:
            for _ in range(r.randint(2, 5)):
                for _ in range(r.randint(2, 6)):
                    f.write("%s %s %s. " % (r.choice(subj), r.choice(verb), r.choice(obj)))
                f.write("\n\n")


def split(src, T, M, prefix):
    import struct
    T, M = int(T), int(M)
    toks = read_tokens(src)
    k = 0
    while k * M * T + T + 1 <= len(toks):
        part = toks[k * M * T:(k + 1) * M * T + 1]
        with open("%s_%03d.bin" % (prefix, k), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)))
            f.write(struct.pack("<%dH" % len(part), *part))
        k += 1
    print("%d shards" % k)


def shards(tokenizer, corpus, out, fraction, per):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tokenizer)
    fraction, per = float(fraction), int(per)
    docs = [open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(corpus, "*")))]
    split = {}
    for s in ("train", "val"):
        files = sorted(glob.glob(os.path.join(out, s + "_*.bin")))
        counts = [len(read_tokens(f)) for f in files]
        if any(c != per for c in counts[:-1]) or (counts and not 0 < counts[-1] <= per):
            die("%s shards hold %s tokens: every one but the last must hold %d" % (s, counts, per))
        ids = [t for f in files for t in read_tokens(f)]
        text = tok.decode(ids, skip_special_tokens=False)
        if not text.startswith("<|endoftext|>"):
            die("%s does not start with <|endoftext|>" % s)
        split[s] = (text.split("<|endoftext|>")[1:], len(ids))
    got = split["train"][0] + split["val"][0]
    if sorted(got) != sorted(docs) or len(got) != len(docs):
        die("decoded, the shards are not the corpus's documents each once (%d documents, %d "
            "decoded)" % (len(docs), len(got)))
    for s in ("train", "val"):
        order = [docs.index(d) for d in split[s][0]]
        if order != sorted(order):
            die("%s's documents are out of the corpus's order" % s)
    ntrain, nval = split["train"][1], split["val"][1]
    longest = max(len(tok.encode(d).ids) + 1 for d in docs)
    share = nval / (ntrain + nval)
    if abs(share - fraction) * (ntrain + nval) > longest:
        die("val holds %.4f of the tokens, more than one document (%d tokens) from %g"
            % (share, longest, fraction))
    print("%d documents round-trip; train %d tokens, val %d (%.4f of them, asked %g); shards of %d"
          % (len(docs), ntrain, nval, share, fraction, per))


def walk(export, val, T, K, log):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    T, K = int(T), int(K)
    model = transformers.AutoModelForCausalLM.from_pretrained(export, torch_dtype=torch.float32)
    tk = transformers.PreTrainedTokenizerFast(tokenizer_file=os.path.join(export, "tokenizer.json"))
    sample = "the café reads 次の駅 — les données."
    if tk.decode(tk.encode(sample)) != sample:
        die("the tokenizer does not round-trip %r" % sample)
    tokens = read_tokens(val)
    seqs = [tokens[j * T:j * T + T + 1] for j in range(K)]
    idx = torch.tensor([s[:-1] for s in seqs])
    tgt = torch.tensor([s[1:] for s in seqs])
    with torch.no_grad():
        logits = model(idx).logits
        want = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 tgt.reshape(-1)).item()
    got = json.loads(open(log).read().strip().split("\n")[-1])["val_loss"]
    rel = abs(got - want) / abs(want)
    print("transformers %.9g, the trainer's last val_loss %.9g, relative difference %.2g"
          % (want, got, rel))
    if not rel <= 1e-5:
        die("they differ by %.3g relative, more than 1e-5" % rel)


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"gen": gen, "split": split, "shards": shards, "walk": walk}.get(cmd, lambda *a: die("unknown command " + cmd))(*args)
