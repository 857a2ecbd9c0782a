#!/usr/bin/env python3
"""fstokens.py — text to the trainer's token files, with a real tokenizer.

    fstokens.py encode --tokenizer tokenizer.json --out DIR TEXT... 
    fstokens.py train-bpe --vocab N --out tokenizer.json TEXT...
    fstokens.py decode --tokenizer tokenizer.json FILE.bin

TEXT is UTF-8 files or directories (every regular file under a directory, in
sorted order). Run with .venv/bin/python (tools/venv.sh makes it, with the
`tokenizers` version pinned in tools/hf-requirements.txt).

encode tokenizes with Hugging Face's `tokenizers` and a local tokenizer.json
(a model directory's, or one train-bpe wrote) and writes llm.c's token files
(runtime/data.c reads them; docs/runtime.md#token-files): 256 int32 of header
(20240520, the version, the token count), then the tokens, uint16 (version 1)
when every id fits (a vocabulary of at most 65,536), else uint32 (version 2).
  - documents: each file is one (--docs file), or each non-empty line
    (--docs line), or each run of lines between blank lines (--docs
    paragraph); each is preceded by the end-of-text token, as llm.c's
    fineweb.py does, when the vocabulary has one (<|endoftext|>,
    <|end_of_text|>, </s>, or --eot TOKEN; --eot none: no separator);
  - the split: whole documents go to val so that val holds the
    --val-fraction of the tokens as nearly as documents allow (a document is
    val's when val is below its share of the tokens so far, the document
    counted), deterministic and in one pass; the rest is train;
  - shards: DIR/train_000000.bin, train_000001.bin, ... and val_000000.bin,
    ... of --shard-tokens tokens each (100,000,000, llm.c's fineweb shard
    size), the last one shorter; `train --data 'DIR/train_*.bin'` reads them
    in order;
  - progress on standard error (bytes read, tokens, rate), when it is a
    terminal or with --progress; --no-progress silences it.
train-bpe trains a byte-level BPE (GPT-2's scheme: every byte is a symbol,
so any text round-trips) with the vocabulary size asked for, <|endoftext|>
its one special token, and writes tokenizer.json.
decode prints a token file's text (special tokens included): what a round
trip checks.
"""
import argparse
import os
import struct
import sys
import time

MAGIC = 20240520
HEADER_INTS = 256
EOT_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>")


def fail(msg):
    print("fstokens: " + msg, file=sys.stderr)
    sys.exit(1)


def need_tokenizers():
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        fail("cannot import `tokenizers` (Hugging Face's); run this with .venv/bin/python "
             "(tools/venv.sh makes .venv with the version pinned in tools/hf-requirements.txt)")
    return tokenizers


def input_files(paths):
    """Every file a TEXT argument names: a file itself, or every regular
    file under a directory, in sorted order (so a run is repeatable)."""
    out = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for root, dirs, files in os.walk(p):
                dirs.sort()
                for f in files:
                    full = os.path.join(root, f)
                    if os.path.isfile(full):
                        found.append(full)
            if not found:
                fail("%s: a directory with no files in it" % p)
            out.extend(sorted(found))
        elif os.path.isfile(p):
            out.append(p)
        elif os.path.exists(p):
            fail("%s: not a regular file or a directory" % p)
        else:
            fail("%s: no such file or directory" % p)
    return out


def read_text(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (path, e.strerror))
    try:
        return raw.decode("utf-8"), len(raw)
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        fail("%s:%d: not UTF-8 (byte 0x%02x at offset %d); convert it first (iconv -t UTF-8)"
             % (path, line, raw[e.start], e.start))


def documents(files, mode):
    """(text, bytes read) for each document, in order."""
    for path in files:
        text, nbytes = read_text(path)
        if mode == "file":
            if text:
                yield text, nbytes
            else:
                yield None, nbytes
            continue
        if mode == "line":
            parts = [l for l in text.split("\n") if l.strip()]
        else:   # paragraph
            parts, cur = [], []
            for l in text.split("\n"):
                if l.strip():
                    cur.append(l)
                elif cur:
                    parts.append("\n".join(cur))
                    cur = []
            if cur:
                parts.append("\n".join(cur))
        # the file's bytes are counted with its last document
        for i, p in enumerate(parts):
            yield p, nbytes if i == len(parts) - 1 else 0
        if not parts:
            yield None, nbytes


class ShardWriter:
    """Token files DIR/<split>_NNNNNN.bin of at most `per` tokens each."""

    def __init__(self, out_dir, split, per, version):
        self.out_dir, self.split, self.per, self.version = out_dir, split, per, version
        self.width = 2 if version == 1 else 4
        self.f = None
        self.n = 0          # tokens in the open shard
        self.index = 0
        self.paths = []
        self.counts = []
        self.total = 0

    def _open(self):
        path = os.path.join(self.out_dir, "%s_%06d.bin" % (self.split, self.index))
        tmp = path + ".partial"
        self.f = open(tmp, "wb")
        self.f.write(b"\0" * (HEADER_INTS * 4))
        self.path, self.tmp, self.n = path, tmp, 0

    def _close(self):
        header = [0] * HEADER_INTS
        header[0], header[1], header[2] = MAGIC, self.version, self.n
        self.f.seek(0)
        self.f.write(struct.pack("<%di" % HEADER_INTS, *header))
        self.f.close()
        os.replace(self.tmp, self.path)   # only whole shards get their name
        self.paths.append(self.path)
        self.counts.append(self.n)
        self.f = None
        self.index += 1

    def write(self, ids):
        import numpy as np
        arr = np.asarray(ids, dtype=np.uint16 if self.version == 1 else np.uint32)
        at = 0
        while at < len(arr):
            if self.f is None:
                self._open()
            take = min(self.per - self.n, len(arr) - at)
            self.f.write(arr[at:at + take].astype("<u%d" % self.width).tobytes())
            self.n += take
            self.total += take
            at += take
            if self.n == self.per:
                self._close()

    def finish(self):
        if self.f is not None:
            self._close()


class Progress:
    def __init__(self, total_bytes, on):
        self.total, self.on = total_bytes, on
        self.done = 0
        self.t0 = self.last = time.time()

    def update(self, nbytes, tokens, force=False):
        self.done += nbytes
        now = time.time()
        if not self.on or (not force and now - self.last < 0.2):
            return
        self.last = now
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(frac * 30)
        rate = tokens / max(now - self.t0, 1e-9)
        sys.stderr.write("\r[%-30s] %5.1f%%  %.1f/%.1f MB  %d tokens  %.0f tokens/s"
                         % (bar, 100 * frac, self.done / 1e6, self.total / 1e6, tokens, rate))
        sys.stderr.flush()

    def end(self, tokens):
        if self.on:
            self.update(0, tokens, force=True)
            sys.stderr.write("\n")


def load_tokenizer(path):
    tk = need_tokenizers()
    if not os.path.isfile(path):
        fail("--tokenizer %s: no such file (a model directory's tokenizer.json, or one "
             "`fstokens.py train-bpe` wrote)" % path)
    try:
        return tk.Tokenizer.from_file(path)
    except Exception as e:   # the library's own error says what it disliked
        fail("--tokenizer %s: not a tokenizer.json the `tokenizers` library reads: %s" % (path, e))


def cmd_encode(a):
    tok = load_tokenizer(a.tokenizer)
    files = input_files(a.text)
    if not 0 <= a.val_fraction < 1:
        fail("--val-fraction %g: a fraction at least 0 and below 1" % a.val_fraction)
    if a.shard_tokens < 1:
        fail("--shard-tokens %d: at least 1" % a.shard_tokens)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab > 2 ** 32:
        fail("the tokenizer's vocabulary of %d does not fit uint32 tokens" % vocab)
    version = 1 if vocab <= 65536 else 2
    eot = None
    if a.eot is None:
        for cand in EOT_CANDIDATES:
            if tok.token_to_id(cand) is not None:
                eot = tok.token_to_id(cand)
                break
    elif a.eot != "none":
        eot = tok.token_to_id(a.eot)
        if eot is None:
            fail("--eot %s: no such token in %s's vocabulary" % (a.eot, a.tokenizer))
    os.makedirs(a.out, exist_ok=True)
    old = [f for f in os.listdir(a.out) if f.startswith(("train_", "val_")) and f.endswith(".bin")]
    if old and not a.force:
        fail("%s already holds token shards (%s, ...): a pattern would read them beside the new "
             "ones; name an empty directory, or pass --force to remove them first"
             % (a.out, sorted(old)[0]))
    for f in old:
        os.remove(os.path.join(a.out, f))
    train = ShardWriter(a.out, "train", a.shard_tokens, version)
    val = ShardWriter(a.out, "val", a.shard_tokens, version)
    total_bytes = sum(os.path.getsize(f) for f in files)
    on = a.progress if a.progress is not None else sys.stderr.isatty()
    prog = Progress(total_bytes, on)
    ndocs = [0, 0]
    batch, batch_bytes = [], 0

    def flush():
        nonlocal batch, batch_bytes
        if batch:
            encs = tok.encode_batch(batch, add_special_tokens=False)
            for e in encs:
                ids = ([eot] if eot is not None else []) + e.ids
                seen = train.total + val.total + len(ids)
                # val's when it is below its share, this document counted
                to_val = val.total < a.val_fraction * seen
                (val if to_val else train).write(ids)
                ndocs[to_val] += 1
        prog.update(batch_bytes, train.total + val.total)
        batch, batch_bytes = [], 0

    for text, nbytes in documents(files, a.docs):
        if text is not None:
            batch.append(text)
        batch_bytes += nbytes
        if len(batch) >= 256 or batch_bytes >= (8 << 20):
            flush()
    flush()
    train.finish()
    val.finish()
    prog.end(train.total + val.total)
    if train.total == 0:
        fail("no tokens for train: the input holds %d documents, all in val (lower "
             "--val-fraction)" % ndocs[1] if ndocs[1] else "no tokens: the input is empty")
    if a.val_fraction > 0 and val.total == 0:
        fail("--val-fraction %g left val empty: %d documents are too few to split (use --docs "
             "line or paragraph, or more text)" % (a.val_fraction, ndocs[0]))
    width = "uint16" if version == 1 else "uint32"
    print("fstokens: %d files, %d documents -> %d train tokens in %d shards, %d val tokens in %d "
          "shards (%s, vocabulary %d%s) in %s"
          % (len(files), ndocs[0] + ndocs[1], train.total, len(train.paths), val.total,
             len(val.paths), width, vocab,
             ", documents after %s" % tok.id_to_token(eot) if eot is not None else "", a.out))


def cmd_train_bpe(a):
    tk = need_tokenizers()
    files = input_files(a.text)
    if a.vocab < 257 + 1:
        fail("--vocab %d: a byte-level BPE needs at least 258 (256 bytes, <|endoftext|>, and a "
             "merge)" % a.vocab)
    for f in files:
        read_text(f)   # not UTF-8: refused with the file and line, before training
    tok = tk.Tokenizer(tk.models.BPE())
    tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=["<|endoftext|>"],
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
                                     show_progress=False)
    tok.train(files, trainer)
    tmp = a.out + ".partial"
    tok.save(tmp)
    os.replace(tmp, a.out)
    print("fstokens: trained a byte-level BPE of %d tokens on %d files -> %s"
          % (tok.get_vocab_size(), len(files), a.out))


def read_tokens(path):
    import numpy as np
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        fail("cannot read %s: %s" % (path, e.strerror))
    if len(raw) < HEADER_INTS * 4:
        fail("%s: %d bytes, too short for a token file's header" % (path, len(raw)))
    h = struct.unpack("<3i", raw[:12])
    if h[0] != MAGIC:
        fail("%s: header field 0 (magic) is %d, not %d" % (path, h[0], MAGIC))
    if h[1] not in (1, 2):
        fail("%s: header field 1 (version) is %d: 1 (uint16) or 2 (uint32)" % (path, h[1]))
    dt = "<u2" if h[1] == 1 else "<u4"
    toks = np.frombuffer(raw[HEADER_INTS * 4:], dtype=dt)
    if len(toks) != h[2]:
        fail("%s: header field 2 (tokens) says %d, the file holds %d" % (path, h[2], len(toks)))
    return toks


def cmd_decode(a):
    tok = load_tokenizer(a.tokenizer)
    ids = read_tokens(a.file).tolist()
    sys.stdout.write(tok.decode(ids, skip_special_tokens=False))


def main():
    ap = argparse.ArgumentParser(prog="fstokens.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("encode", help="text to token shards")
    e.add_argument("text", nargs="+", metavar="TEXT", help="UTF-8 files or directories")
    e.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    e.add_argument("--out", required=True, help="the directory for the shards")
    e.add_argument("--val-fraction", type=float, default=0.0, metavar="F",
                   help="the share of the tokens, in whole documents, that goes to val (0)")
    e.add_argument("--shard-tokens", type=int, default=100_000_000, metavar="N",
                   help="tokens per shard (100,000,000)")
    e.add_argument("--docs", choices=("file", "line", "paragraph"), default="file",
                   help="what one document is (file)")
    e.add_argument("--eot", metavar="TOKEN",
                   help="the token before each document (default: the vocabulary's end-of-text; "
                        "none: nothing)")
    e.add_argument("--force", action="store_true", help="remove the shards already in --out")
    g = e.add_mutually_exclusive_group()
    g.add_argument("--progress", dest="progress", action="store_true", default=None,
                   help="a progress bar on standard error even when it is not a terminal")
    g.add_argument("--no-progress", dest="progress", action="store_false",
                   help="no progress bar, even on a terminal")
    t = sub.add_parser("train-bpe", help="train a byte-level BPE tokenizer on local text")
    t.add_argument("text", nargs="+", metavar="TEXT", help="UTF-8 files or directories")
    t.add_argument("--vocab", type=int, required=True, help="the vocabulary size")
    t.add_argument("--out", required=True, help="the tokenizer.json to write")
    d = sub.add_parser("decode", help="a token file's text")
    d.add_argument("file", metavar="FILE.bin")
    d.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    a = ap.parse_args()
    {"encode": cmd_encode, "train-bpe": cmd_train_bpe, "decode": cmd_decode}[a.cmd](a)


if __name__ == "__main__":
    main()
