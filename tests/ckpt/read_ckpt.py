#!/usr/bin/env python3
"""read_ckpt.py — a reader of fsdpc checkpoints written from docs/checkpoint.md
alone (json + struct, standard library only), and the checks
tests/ckpt/run.sh makes with it.

As a module:
    ck = Checkpoint("ckpt/step_000100")      # or a checkpoint root: follows `latest`
    ck.verify()                              # sizes, CRC32C, headers; raises on a fault
    ck.tensor("blocks.0.attn.q.weight")      # (shape, [floats]) of the parameters
    ck.tensor("blocks.0.attn.q.weight", "adamw.m")   # or of an optimizer state

As a command (each prints why and exits 1 when its check fails):
    read_ckpt.py info DIR                    what the checkpoint holds
    read_ckpt.py next-seq DIR                its data position: the next sequence to train on
    read_ckpt.py verify DIR                  every file whole, every checksum right
                                             (meta.json's own meta_crc32c too)
    read_ckpt.py same-as-export DIR F.safetensors
                                             its parameters equal the export, bit for bit
    read_ckpt.py same-state DIR1 DIR2        two checkpoints hold the same state (any worlds)
    read_ckpt.py crc32c TEXT                 CRC32C of TEXT's bytes, in hex
    read_ckpt.py seal DIR                    rewrite meta.json's meta_crc32c after an edit
                                             (tests that make a consistent edit)
"""
import json
import os
import struct
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/fsdfiles.py
from fsdfiles import read_safetensors

# magic, version, rank, world, ngroups, nsections, elem_bytes, step, opt_t, seed, model_hash
HEADER = struct.Struct("<8sIIIIIIqqqQ")
MAGIC = b"FSDPCKPT"
# meta.json's last line: the CRC32C of every byte before it
META_TAIL = '  "meta_crc32c": "%08x"\n}\n'
META_TAIL_BYTES = 30


def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data, crc=0):
    """CRC32C (Castagnoli; reflected, init and final xor 0xFFFFFFFF)."""
    crc ^= 0xFFFFFFFF
    t = _TABLE
    for b in data:
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


class CheckpointError(Exception):
    pass


class Checkpoint:
    def __init__(self, path):
        if not os.path.exists(os.path.join(path, "meta.json")) and \
                os.path.exists(os.path.join(path, "latest")):
            with open(os.path.join(path, "latest")) as f:
                path = os.path.join(path, f.read().strip())
        self.dir = path
        with open(os.path.join(path, "meta.json"), "rb") as f:
            self.meta_bytes = f.read()
        self.meta = json.loads(self.meta_bytes)
        m = self.meta
        if m.get("format") != "fsdpc-checkpoint" or m.get("version") != 1:
            raise CheckpointError(f"{path}: not a version 1 fsdpc checkpoint")
        self.fmt = {"F32": "f", "F64": "d"}[m["dtype"]]
        self.elem = struct.calcsize(self.fmt)
        self.sections = m["sections"]
        self._flat = {}

    @property
    def next_seq(self):
        """The data position: the next sequence of the data order to train on
        (docs/checkpoint.md, "Data loader position"); a checkpoint without
        data.next_seq (an older fsdpc's) is at step x its sequences a step."""
        d = self.meta["data"]
        return d["next_seq"] if "next_seq" in d else self.meta["step"] * d["sequences_per_step"]

    def _rank_bytes(self, q):
        with open(os.path.join(self.dir, self.meta["files"][q]["name"]), "rb") as f:
            return f.read()

    def verify(self):
        m = self.meta
        raw, n = self.meta_bytes, META_TAIL_BYTES
        crc = crc32c(raw[:-n])
        if len(raw) <= n or raw[-n - 1:-n] != b"\n" or raw[-n:] != (META_TAIL % crc).encode():
            raise CheckpointError(f"{self.dir}/meta.json: field meta_crc32c is not the CRC32C "
                                  f"{crc:08x} of the bytes before it: the file was changed")
        for q, entry in enumerate(m["files"]):
            path = os.path.join(self.dir, entry["name"])
            if not os.path.exists(path):
                raise CheckpointError(f"{path} is missing")
            blob = self._rank_bytes(q)
            if len(blob) != entry["bytes"]:
                raise CheckpointError(f"{path}: {len(blob)} bytes, meta.json says {entry['bytes']}")
            crc = crc32c(blob)
            if crc != int(entry["crc32c"], 16):
                raise CheckpointError(f"{path}: CRC32C {crc:08x}, meta.json says {entry['crc32c']}")
            (magic, version, rank, world, ngroups, nsec, elem, step, t, seed,
             mhash) = HEADER.unpack_from(blob, 0)
            want = (MAGIC, 1, q, m["world"], len(m["groups"]), len(self.sections), self.elem,
                    m["step"], m["optimizer"]["t"], m["rng"]["seed"], int(m["model_hash"], 16))
            got = (magic, version, rank, world, ngroups, nsec, elem, step, t, seed, mhash)
            if got != want:
                raise CheckpointError(f"{path}: header {got}, meta.json says {want}")
        # layout: groups end to end after the header, sections within a group
        at = m["header_bytes"]
        for g in m["groups"]:
            if g["offset"] != at or g["padded"] != g["shard"] * m["world"]:
                raise CheckpointError(f"group {g['name']}: offset/padding do not follow the format")
            if g["ranges"] != [[q * g["shard"], (q + 1) * g["shard"]] for q in range(m["world"])]:
                raise CheckpointError(f"group {g['name']}: ranges {g['ranges']}")
            at += len(self.sections) * g["shard"] * self.elem
        if any(e["bytes"] != at for e in m["files"]):
            raise CheckpointError(f"rank files should be {at} bytes")

    def flat(self, group, section="params"):
        """Group `group`'s whole flat buffer (padded) of one section."""
        key = (group, section)
        if key not in self._flat:
            g = self.meta["groups"][group]
            s = self.sections.index(section)
            out = []
            for q in range(self.meta["world"]):
                blob = self._rank_bytes(q)
                start, end = g["ranges"][q]
                n = end - start
                off = g["offset"] + s * g["shard"] * self.elem
                out.extend(struct.unpack_from(f"<{n}{self.fmt}", blob, off))
            self._flat[key] = out
        return self._flat[key]

    def tensor(self, name, section="params"):
        for t in self.meta["tensors"]:
            if t["name"] == name:
                n = 1
                for d in t["shape"]:
                    n *= d
                return t["shape"], self.flat(t["group"], section)[t["offset"]:t["offset"] + n]
        raise KeyError(name)

    def names(self):
        return [t["name"] for t in self.meta["tensors"]]


def die(msg):
    print(msg)
    sys.exit(1)


def main(argv):
    if len(argv) < 2:
        die(__doc__)
    cmd, args = argv[1], argv[2:]
    try:
        if cmd == "crc32c":
            print(f"{crc32c(args[0].encode()):08x}")
        elif cmd == "seal":
            path = os.path.join(args[0], "meta.json")
            with open(path, "rb") as f:
                body = f.read()[:-META_TAIL_BYTES]
            with open(path, "wb") as f:
                f.write(body + (META_TAIL % crc32c(body)).encode())
        elif cmd == "info":
            ck = Checkpoint(args[0])
            m = ck.meta
            print(f"{ck.dir}: model {m['model']} (hash {m['model_hash']}), step {m['step']}, "
                  f"next sequence {ck.next_seq}, "
                  f"world {m['world']}, {m['dtype']}, sections {', '.join(ck.sections)}, "
                  f"{len(m['tensors'])} tensors in {len(m['groups'])} groups, "
                  f"{sum(e['bytes'] for e in m['files'])} bytes")
        elif cmd == "next-seq":
            print(Checkpoint(args[0]).next_seq)
        elif cmd == "verify":
            ck = Checkpoint(args[0])
            ck.verify()
            m = ck.meta
            # optimizer state that could be AdamW's: v is a mean of squares
            if "adamw.v" in ck.sections:
                for g in range(len(m["groups"])):
                    if min(ck.flat(g, "adamw.v")) < 0:
                        die(f"group {g}: negative adamw.v")
            if m["optimizer"]["t"] != m["step"] or m["data"]["next_step"] != m["step"]:
                die(f"t {m['optimizer']['t']} / next_step {m['data']['next_step']} != step {m['step']}")
            n = m["data"].get("next_seq", 0)
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                die(f"data.next_seq {n!r} is not a count of sequences")
        elif cmd == "same-as-export":
            ck = Checkpoint(args[0])
            ck.verify()
            st, _ = read_safetensors(args[1])
            if sorted(st) != sorted(ck.names()):
                die(f"names differ: {sorted(set(st) ^ set(ck.names()))}")
            for name in ck.names():
                shape, vals = ck.tensor(name)
                if st[name].shape != shape:
                    die(f"{name}: shape {shape} vs {st[name].shape}")
                # the export is F32; compare as F32 bit patterns
                if struct.pack(f"<{len(vals)}f", *vals) != st[name].raw:
                    die(f"{name}: values differ from the export")
        elif cmd == "same-state":
            a, b = Checkpoint(args[0]), Checkpoint(args[1])
            a.verify()
            b.verify()
            if a.meta["step"] != b.meta["step"] or a.sections != b.sections:
                die("different steps or sections")
            for name in a.names():
                for s in a.sections:
                    if a.tensor(name, s) != b.tensor(name, s):
                        die(f"{name} ({s}) differs")
        else:
            die(f"unknown command {cmd}\n{__doc__}")
    except (CheckpointError, OSError, KeyError, ValueError) as e:
        die(f"{cmd}: {e}")


if __name__ == "__main__":
    main(sys.argv)
