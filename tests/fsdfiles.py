"""fsdfiles.py — the tests' one reader and writer of the files fsdpc's
trainers exchange: safetensors (--export, --init-from) and llm.c token
files (--data), written from their specifications, standard library only:
tests/ckpt runs under any python3, tests/oracle under one with torch.

A script in a folder below tests/ imports it with
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

Every fault in a file raises FormatError (a ValueError) naming the file
and, where there is one, the tensor.
"""
import collections
import json
import math
import struct

TOKEN_MAGIC = 20240520


class FormatError(ValueError):
    pass


class Tensor(collections.namedtuple("Tensor", "shape raw")):
    """An F32 tensor: its shape and its little-endian bytes."""

    def values(self):
        return list(struct.unpack(f"<{len(self.raw) // 4}f", self.raw))


# ── safetensors ──

def read_safetensors(path):
    """({name: Tensor} in the header's order, the __metadata__ or None).
    Checks what fsdpc's writer guarantees and its reader relies on: the
    header inside the file, the data 8-byte aligned, every tensor F32 with
    4 bytes an element, and the tensors tiling the data (no gap, no
    overlap, nothing after the last)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise FormatError(f"{path}: {len(blob)} bytes, too short for the header length")
    (n,) = struct.unpack_from("<Q", blob, 0)
    if 8 + n > len(blob):
        raise FormatError(f"{path}: header length {n} runs past the end of the file ({len(blob)} bytes)")
    if (8 + n) % 8:
        raise FormatError(f"{path}: data does not start 8-byte aligned (header length {n})")
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except ValueError as e:           # UnicodeDecodeError and JSONDecodeError alike
        raise FormatError(f"{path}: bad header: {e}") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: the header is not a JSON object")
    meta = header.pop("__metadata__", None)
    data = blob[8 + n:]
    tensors = {}
    for name, t in header.items():
        if t.get("dtype") != "F32":
            raise FormatError(f"{path}: tensor `{name}` has dtype {t.get('dtype')}; only F32 is read")
        shape, (b, e) = t["shape"], t["data_offsets"]
        if e - b != 4 * math.prod(shape):
            raise FormatError(f"{path}: tensor `{name}`: {e - b} bytes for F32 shape {shape}")
        tensors[name] = Tensor(shape, data[b:e])
    at = 0
    for name in sorted(header, key=lambda k: header[k]["data_offsets"]):
        b, e = header[name]["data_offsets"]
        if b != at:
            raise FormatError(f"{path}: tensor `{name}` starts at byte {b} of the data, not {at}: "
                              "the tensors must tile the data, without gaps or overlaps")
        at = e
    if at != len(data):
        raise FormatError(f"{path}: the data has {len(data)} bytes; the tensors end at {at}")
    return tensors, meta


def layout(tensors):
    """The header (as a dict, with fsdpc's __metadata__) and the data of
    {name: (shape, raw F32 bytes)}, laid end to end in the dict's order."""
    header, data, at = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, (shape, raw) in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + len(raw)]}
        data += raw
        at += len(raw)
    return header, data


def write_raw(path, header_bytes, data):
    """A safetensors file of these header bytes, padded with spaces so the
    data starts 8-byte aligned (as fsdpc writes it), and this data."""
    h = header_bytes + b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


def write_safetensors(path, tensors):
    """{name: (shape, raw F32 bytes)} -> a safetensors file."""
    header, data = layout(tensors)
    write_raw(path, json.dumps(header).encode(), data)


# ── token files ──

def read_tokens(path):
    """An llm.c token file's tokens: a header of 256 int32 (magic, version,
    count), then count uint16 (version 1) or uint32 (version 2) tokens."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 1024:
        raise FormatError(f"{path}: {len(blob)} bytes, shorter than the 1024-byte header")
    magic, version, count = struct.unpack_from("<3i", blob, 0)
    if magic != TOKEN_MAGIC or version not in (1, 2):
        raise FormatError(f"{path}: not a token file (magic {magic}, version {version})")
    fmt = f"<{count}{'H' if version == 1 else 'I'}"
    if 1024 + struct.calcsize(fmt) > len(blob):
        raise FormatError(f"{path} is truncated: its header says {count} tokens")
    return list(struct.unpack_from(fmt, blob, 1024))


# ── training logs ──

def read_log(path):
    """A trainer's --log: one JSON object a line, a step each (blank lines
    skipped); a line that is not JSON, or a log without steps, is a fault."""
    steps = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                steps.append(json.loads(line))
            except ValueError as e:
                raise FormatError(f"{path}:{n}: not a JSON line ({e})")
    if not steps:
        raise FormatError(f"{path}: no steps logged")
    return steps
