#!/usr/bin/env python3
"""check.py — fsdpc's memory plan (--dump-memory) against figures computed
here by hand, memory_budget's choice of policy, and golden dumps.

    tests/memory/check.py FSDPC [--regen]

tests/run.sh runs it as a suite of its own. Like run.sh, every test prints
one line, "ok   NAME" or "FAIL NAME" followed by indented details, the last
line is "N passed, N failed", and the exit status is 1 when any failed. With
--regen it rewrites its golden and expected files instead of comparing
(tests/golden/*.memory, tests/memory/*.expected).

The hand computation starts from the parameter shapes of each model, written
out below from its .fsd file and PyTorch's layouts (docs/design.md#parameter-names-and-layouts), and
never from fsdpc's own layout dump: a group's flat buffer lays its parameters
end to end, each starting at a multiple of 16 elements; it is padded to a
multiple of the world size W; each rank holds padded / W elements of it.
"""
import difflib
import os
import re
import subprocess
import sys
import tempfile

FSDPC = sys.argv[1] if len(sys.argv) > 1 else "build/fsdpc"
REGEN = "--regen" in sys.argv
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ALIGN = 16
passed = failed = 0


def ok(name):
    global passed
    passed += 1
    print(f"ok   {name}")


def bad(name, detail=""):
    global failed
    failed += 1
    print(f"FAIL {name}")
    for line in detail.splitlines()[:40]:
        print(f"     {line}")


def run(args):
    """fsdpc with args, from the repository root; (status, stdout, stderr)"""
    p = subprocess.run([FSDPC] + args, capture_output=True, text=True, cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def fmt(n):
    return f"{n:,}"


# ── the models, parameter by parameter ──

def align(n):
    return (n + ALIGN - 1) // ALIGN * ALIGN


def flat(numels):
    # every start aligned, the end too: the sum of the aligned sizes
    return sum(align(n) for n in numels)


def padded(flat_numel, world):
    return -(-flat_numel // world) * world


def gpt2():
    V, T, C, L = 50304, 1024, 768, 12
    block = [C, C,                        # ln1 weight, bias
             C * C, C, C * C, C,          # attn q, k: weight [C, C], bias [C]
             C * C, C, C * C, C,          # attn v, o
             C, C,                        # ln2
             4 * C * C, 4 * C,            # mlp fc [4C, C], bias [4C]
             C * 4 * C, C]                # mlp proj [C, 4C], bias [C]
    root = [V * C, T * C, C, C]           # tok, pos, ln_f weight and bias; head is tied to tok
    return dict(name="gpt2", file="examples/gpt2.fsd", root=root, block=block, blocks=L,
                param_bytes=2, grad_bytes=2, reduce_bytes=4, states=2, prefetch=1,
                grads_row="unsharded gradients (bf16+fp32 reduce)",
                B=8, H=12, T=T)


def llama3_8b():
    V, T, C, L, H, KV, F = 128256, 8192, 4096, 32, 32, 8, 14336
    hd = C // H
    block = [C,                           # attn_norm
             C * C, KV * hd * C,          # q [H·hd, C], k [KV·hd, C]
             KV * hd * C, C * C,          # v, o [C, H·hd]
             C,                           # mlp_norm
             F * C, F * C, C * F]         # gate, up [F, C], down [C, F]; no biases
    root = [V * C, C, V * C]              # tok, norm, head (untied)
    return dict(name="llama3_8b", file="examples/llama3_8b.fsd", root=root, block=block,
                blocks=L, param_bytes=2, grad_bytes=2, reduce_bytes=4, states=2, prefetch=1,
                grads_row="unsharded gradients (bf16+fp32 reduce)",
                B=1, H=H, T=T)


# A model whose every size is off the 16-element grid and whose groups do
# not divide by W: alignment and padding both matter. SGD with momentum
# keeps one state per parameter; fp32 throughout.
ODD_FSD = """model odd {
  const vocab = 13, dim = 10, hidden = 7, seq = 5
  emb = Embedding(vocab, dim)
  fc1 = Linear(dim, hidden)
  fc2 = Linear(hidden, dim)
  out = Linear(dim, vocab)
  forward(idx, targets) {
    h = relu(fc1(emb(idx)))
    return cross_entropy(out(fc2(h)), targets)
  }
}
shard {
  fully_shard fc1
  fully_shard fc2
}
train {
  micro_batch = 2
  optimizer = sgd(lr = 0.1, momentum = 0.9)
}
"""


def odd():
    return dict(name="odd", root=[13 * 10, 13 * 10, 13],       # emb, out weight and bias
                groups=[[7 * 10, 7], [10 * 7, 10]],            # fc1, fc2
                param_bytes=4, reduce_bytes=4, states=1)


# ── reading --dump-memory ──

ROW = re.compile(r"^  (\S.*?)\s{2,}(-?[\d,]+)\s+-?[\d.]+(\s|$)")


def memory(path, world, extra=()):
    st, out, err = run([path, "--dump-memory", "--world", str(world), *extra])
    if st != 0:
        return None, err
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m and m.group(1) not in rows:       # the first table wins: at the peak
            rows[m.group(1)] = int(m.group(2).replace(",", ""))
    return rows, out


def expect(name, got, want, how):
    if got == want:
        ok(f"{name} = {fmt(want)}: {how}")
    else:
        bad(name, f"fsdpc says {fmt(got) if got is not None else 'nothing'}, "
                  f"by hand {fmt(want)}: {how}")


def check_transformer(mdl, world):
    tag = f"memory {mdl['name']} W={world}"
    rows, out = memory(mdl["file"], world)
    if rows is None:
        bad(f"{tag}: fsdpc failed", out)
        return
    root_flat, block_flat = flat(mdl["root"]), flat(mdl["block"])
    root_pad, block_pad = padded(root_flat, world), padded(block_flat, world)
    L = mdl["blocks"]
    shards = root_pad // world + L * (block_pad // world)
    arith = (f"(root {fmt(root_flat)} padded to {fmt(root_pad)}, / {world} = {fmt(root_pad // world)};"
             f" {L} blocks of {fmt(block_flat)} padded to {fmt(block_pad)}, / {world} ="
             f" {fmt(block_pad // world)})")
    expect(f"{tag} sharded parameters", rows.get("sharded parameters (fp32)"), shards * 4,
           f"{fmt(shards)} elements x 4 {arith}")
    expect(f"{tag} sharded gradients", rows.get("sharded gradients (fp32)"), shards * 4,
           "the same")
    expect(f"{tag} adamw state", rows.get(f"optimizer state ({mdl['states']} x fp32)"),
           mdl["states"] * shards * 4, "m and v: 2 x sharded parameters")
    # Forward keeps the root gathered (reshard false; backward starts with
    # its head) and holds the block it computes plus `prefetch` blocks in
    # flight: each all-gather ahead is issued after the previous block was
    # resharded.
    p = mdl["prefetch"]
    expect(f"{tag} largest unsharded parameters", rows.get("largest unsharded parameters"),
           (root_pad + (1 + p) * block_pad) * mdl["param_bytes"],
           f"(root {fmt(root_pad)} + (1 + prefetch {p}) x block {fmt(block_pad)}) x 2 (bf16)")
    # Backward keeps the root's gradients until the embeddings' at the end,
    # writes one block's and has the previous block's reduce-scatter in
    # flight: it is freed when the next one is issued. With param = bf16 the
    # gradients are bf16 (2 bytes), and a reduce-scatter in fp32 widens them
    # into a 4-byte buffer while it runs: so either a block's in flight with
    # both, or, at the end, the root's and the last block's reduce-scatters
    # together.
    g, rb = mdl["grad_bytes"], mdl["reduce_bytes"]
    widen = rb if rb > g else 0
    in_backward = (root_pad + 2 * block_pad) * g + block_pad * widen
    at_end = (root_pad + block_pad) * (g + widen)
    expect(f"{tag} largest unsharded gradients", rows.get("largest unsharded gradients"),
           max(in_backward, at_end),
           f"max((root {fmt(root_pad)} + 2 x block {fmt(block_pad)}) x {g} + block x {widen}, "
           f"(root + block) x ({g} + {widen})): gradients {g} bytes, widened to {widen} "
           "while reduced")
    # templates/attention.h stores no B*H*T*T probabilities (an online
    # softmax forward, p recomputed one key at a time in backward), and the
    # runtime allocates no scratch for any op
    expect(f"{tag} largest workspace", rows.get("largest workspace"), 0,
           "the kernels keep no scratch, attention included")
    parts = ["sharded parameters (fp32)", "sharded gradients (fp32)",
             f"optimizer state ({mdl['states']} x fp32)", "unsharded parameters (bf16)",
             mdl["grads_row"], "activation arena", "workspace"]
    total = sum(rows.get(k, 0) for k in parts)
    expect(f"{tag} peak is its breakdown's sum", rows.get("peak"), total, " + ".join(parts))
    # The peak is what the trainer allocates: the arena is allocated once
    # and held whole, so the rank peaks where its unsharded buffers do
    resident = (2 + mdl["states"]) * shards * 4
    both, arena = rows.get("largest unsharded, both together"), rows.get("activation arena, as placed")
    if both is not None and arena is not None:
        expect(f"{tag} peak = resident + largest unsharded + arena", rows.get("peak"),
               resident + both + arena,
               f"{fmt(resident)} (shards and state) + {fmt(both)} + {fmt(arena)}, workspace 0")
    low = rows.get("activation lower bound")
    if arena is not None and low is not None and arena >= low > 0:
        ok(f"{tag} arena {fmt(arena)} >= lower bound {fmt(low)}")
    else:
        bad(f"{tag} arena {arena} >= lower bound {low}")
    live = rows.get("peak, activations freed as they die")
    if live is not None and 0 < live <= rows.get("peak", 0):
        ok(f"{tag} peak with activations freed {fmt(live)} <= peak {fmt(rows['peak'])}")
    else:
        bad(f"{tag} peak with activations freed {live} <= peak {rows.get('peak')}")


def check_odd(world):
    mdl = odd()
    tag = f"memory odd W={world}"
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "odd.fsd")
        with open(path, "w") as f:
            f.write(ODD_FSD)
        rows, out = memory(path, world)
    if rows is None:
        bad(f"{tag}: fsdpc failed", out)
        return
    groups = [mdl["root"]] + mdl["groups"]
    pads = [padded(flat(g), world) for g in groups]
    shards = sum(p // world for p in pads)
    how = " + ".join(f"{fmt(flat(g))}->{fmt(p)}" for g, p in zip(groups, pads))
    expect(f"{tag} sharded parameters", rows.get("sharded parameters (fp32)"), shards * 4,
           f"flat->padded {how}; / {world} x 4")
    expect(f"{tag} sgd momentum state", rows.get("optimizer state (1 x fp32)"), shards * 4,
           "1 x sharded parameters")
    # three small groups: the root is kept, fc1 and fc2 are all-gathered
    # one ahead, so all three are live together in forward, and all three
    # gradient buffers in backward
    expect(f"{tag} largest unsharded parameters", rows.get("largest unsharded parameters"),
           sum(pads) * 4, "every group, fp32")
    expect(f"{tag} largest unsharded gradients", rows.get("largest unsharded gradients"),
           sum(pads) * 4, "every group, fp32")
    expect(f"{tag} largest workspace", rows.get("largest workspace"), 0, "no attention")
    # The arena holds the activations and their gradients (parameters,
    # inputs and parameter gradients live elsewhere). Forward: emb.out,
    # fc1.out, relu, fc2.out, out.out, loss, logits.lse = 7; backward:
    # d.out.out, d.fc2.out, d.relu, d.fc1.out, d.emb.out = 5; 7 + 5 = 12. A
    # Linear with a bias is one matmul_bias writing its output directly: the
    # unbiased x·Wᵀ of fc1, fc2 and out is no tensor (with a separate bias
    # add it would be, 12 + 3 = 15).
    m = re.search(r"activation arena, as placed .*?(\d+) tensors", out)
    expect(f"{tag} arena tensors", int(m.group(1)) if m else None, 12,
           "7 forward + 5 gradients; no x·Wᵀ tensor for fc1, fc2, out")


# ── memory_budget ──

def with_budget(src, budget, path, open_policy=False):
    """src (an example) with `memory_budget = budget` added to its shard
    section; with open_policy, its written reshard_after_forward and
    prefetch removed, so the planner may choose them"""
    text = open(os.path.join(ROOT, src)).read()
    text, n = re.subn(r"(\nshard \{\n)", r"\1  memory_budget = " + budget + "\n", text, count=1)
    assert n == 1, src
    if open_policy:
        text, k = re.subn(r"\n *(reshard_after_forward *=[^\n]*|prefetch\([^\n]*)", "", text)
        assert k == 2, src
    with open(path, "w") as f:
        f.write(text)


TRY = re.compile(r"^    (\d)\. (.*?)\s+peak\s+([\d,]+)\s+(fits, step [\d.]+ ms|too big)(  <- chosen)?$")
GROUP = re.compile(r"^  \d+\s+(\S+)\s.*\s(after forward|after backward)")


def policies(out):
    """--dump-memory's candidates: [(policy, peak, chosen)]"""
    rows = []
    for line in out.splitlines():
        m = TRY.match(line)
        if m:
            rows.append((m.group(2), int(m.group(3).replace(",", "")), bool(m.group(5))))
    return rows


def steps(out):
    """--dump-memory's candidates' simulated steps in ms (None: too big)"""
    return [float(m.group(4).split()[2]) if m.group(4).startswith("fits") else None
            for m in map(TRY.match, out.splitlines()) if m]


def reshard_by_group(out):
    """--dump-plan's groups table: {group: 'after forward' | 'after backward'}"""
    return {m.group(1): m.group(2) for m in map(GROUP.match, out.splitlines()) if m}


WANT = ["keep parameters after forward, prefetch 1", "reshard after forward, prefetch 2",
        "reshard after forward, prefetch 1", "reshard after forward, prefetch 0"]


def check_budget():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "gpt2.fsd")
        # 1. gpt2 with its reshard_after_forward and prefetch removed, and a
        #    budget every policy fits: the fastest, keeping parameters
        with_budget("examples/gpt2.fsd", "1TiB", path, open_policy=True)
        st, out, err = run([path, "--dump-plan", "--dump-memory"])
        t = policies(out)
        groups = reshard_by_group(out)
        if st == 0 and [x[0] for x in t] == WANT and [x[2] for x in t] == [True, False, False, False] \
                and len(groups) == 13 and set(groups.values()) == {"after backward"} \
                and "prefetch: forward 1, backward 1 groups ahead" in out:
            ok("budget gpt2 1TiB, policy open: keeps every group's parameters after forward, prefetch 1")
        else:
            bad("budget gpt2 1TiB, policy open: expected the keep policy, chosen and in --dump-plan",
                err + out[:3000])
            return
        peaks = [x[1] for x in t]
        # the candidates' peaks are the peaks of their own memory plans, and
        # fall (or stay) from fastest to leanest: keeping parameters holds
        # every block at the end of forward; resharding peaks where the
        # backward's gradients do, which prefetching does not change
        plan_peak = memory(path, 8)[0].get("peak")
        if plan_peak == peaks[0] and peaks[0] > peaks[1] and peaks[1] >= peaks[2] >= peaks[3]:
            ok(f"budget gpt2: candidates peak at {', '.join(fmt(p) for p in peaks)}; the chosen is the plan's peak")
        else:
            bad("budget gpt2: candidates' peaks", f"peaks {peaks}, the plan's {plan_peak}")

        # 2. a budget at the second candidate's peak (rounded up to whole KB,
        #    1000 bytes), below the first's: the first does not fit, and of
        #    those that do (the resharding ones, which peak alike) the one with
        #    the fastest simulated step is chosen, in --dump-plan too
        kb = -(-peaks[1] // 1000)
        with_budget("examples/gpt2.fsd", f"{kb}KB", path, open_policy=True)
        st, out, err = run([path, "--dump-plan", "--dump-memory"])
        t = policies(out)
        ms = steps(out)
        groups = reshard_by_group(out)
        fit = [k for k in range(len(ms)) if ms[k] is not None]
        pick = [k for k in range(len(t)) if t[k][2]]
        fastest = min(fit, key=lambda k: (ms[k], k)) if fit else None
        pf = {1: 2, 2: 1, 3: 0}.get(fastest)
        if kb * 1000 < peaks[0] and st == 0 and ms[0] is None and pick == [fastest] \
                and fastest is not None and fastest > 0 \
                and groups.get("root") == "after backward" \
                and all(v == "after forward" for g, v in groups.items() if g != "root") \
                and f"prefetch: forward {pf}, backward {pf} groups ahead" in out:
            ok(f"budget gpt2 {kb}KB, policy open: chooses {WANT[fastest]}, the fastest of "
               f"{len(fit)} that fit ({', '.join(f'{ms[k]:.3f}' for k in fit)} ms), in --dump-plan too")
        else:
            bad(f"budget gpt2 {kb}KB, policy open: expected the fastest that fits", err + out[:3000])

        # 3. gpt2 as written (reshard_after_forward = true, prefetch 1 and 1):
        #    the planner keeps both, though keeping parameters would fit
        with_budget("examples/gpt2.fsd", "1TiB", path)
        st, out, err = run([path, "--dump-plan", "--dump-memory"])
        t = policies(out)
        groups = reshard_by_group(out)
        want = "reshard after forward (as written), prefetch 1 (as written)"
        if st == 0 and t == [(want, t[0][1], True)] \
                and all(v == "after forward" for g, v in groups.items() if g != "root") \
                and "prefetch: forward 1, backward 1 groups ahead" in out:
            ok("budget gpt2 1TiB, as written: its reshard_after_forward and prefetch are kept, the one candidate")
        else:
            bad("budget gpt2 1TiB, as written: expected its own policy alone", err + out[:3000])

        # 4. a budget no policy meets: an error at the setting, nothing written
        with_budget("examples/gpt2.fsd", "4GB", path, open_policy=True)
        o = os.path.join(d, "out.txt")
        st, out, err = run([path, "--dump-plan", "-o", o])
        line = 1 + open(path).read().split("memory_budget")[0].count("\n")
        if st == 1 and sorted(os.listdir(d)) == ["gpt2.fsd"] and \
                f"gpt2.fsd:{line}:3: error: memory_budget 3.73 GiB is less than the leanest plan" in err \
                and "resharding after forward and prefetching 0 groups ahead" in err:
            ok("budget gpt2 4GB: an error at the setting, nothing written")
        else:
            bad("budget gpt2 4GB: expected an error and no output", err)


def check_errors():
    """tests/memory/NAME.fsd fails planning with exactly NAME.expected on
    stderr; or, where NAME.memory is there instead, plans and prints exactly
    that with --dump-memory (at the default world, 8)"""
    for name in sorted(os.listdir(HERE)):
        if not name.endswith(".fsd"):
            continue
        src = os.path.join("tests/memory", name)
        gold = os.path.join(HERE, name[:-4] + ".memory")
        if os.path.exists(gold):
            st, out, err = run([src, "--dump-memory"])
            if REGEN and st == 0:
                with open(gold, "w") as f:
                    f.write(out)
                ok(f"golden {name[:-4]}.memory (regenerated)")
            elif st == 0 and open(gold).read() == out:
                ok(f"golden {name[:-4]}.memory")
            else:
                diff = difflib.unified_diff(open(gold).read().splitlines(), out.splitlines(),
                                            f"tests/memory/{name[:-4]}.memory", "fsdpc", lineterm="")
                bad(f"golden {name[:-4]}.memory: status {st}", err + "\n".join(diff))
            continue
        exp = os.path.join(HERE, name[:-4] + ".expected")
        st, out, err = run([src, "--dump-plan"])
        if REGEN:
            with open(exp, "w") as f:
                f.write(err)
            ok(f"error {name} (regenerated)")
            continue
        want = open(exp).read() if os.path.exists(exp) else None
        if st == 1 and err == want and out == "":
            ok(f"error {name}")
        else:
            bad(f"error {name}: status {st}", f"want:\n{want}\ngot:\n{err}")


# ── reshard_after_backward = false: gathered across micro-batches ──

def check_kept_gathered(world):
    """gpt2 accumulating unsharded over 2 micro-batches, with parameters
    resharded after each backward and kept gathered until the last one"""
    mdl = gpt2()
    tag = f"memory gpt2 reshard_after_backward = false W={world}"
    src = open(os.path.join(ROOT, mdl["file"])).read()
    text, n = re.subn(r"(\nshard \{\n)", r"\1  accumulate = unsharded\n", src, count=1)
    text, k = re.subn(r"grad_accum *= *\d+", "grad_accum = 2", text)
    assert n == 1 and k == 1
    keep = text.replace("accumulate = unsharded\n",
                        "accumulate = unsharded\n  reshard_after_backward = false\n", 1)
    with tempfile.TemporaryDirectory() as d:
        rows = {}
        for name, t in (("after", text), ("kept", keep)):
            path = os.path.join(d, name + ".fsd")
            with open(path, "w") as f:
                f.write(t)
            rows[name], out = memory(path, world)
            if rows[name] is None:
                bad(f"{tag}: fsdpc failed on the {name} variant", out)
                return
    root_pad, block_pad = padded(flat(mdl["root"]), world), padded(flat(mdl["block"]), world)
    L, p = mdl["blocks"], mdl["prefetch"]
    # the first micro-batch's backward leaves every group gathered, and the
    # second begins with all of them: the root and every block
    expect(f"{tag} largest unsharded parameters", rows["kept"].get("largest unsharded parameters"),
           (root_pad + L * block_pad) * mdl["param_bytes"],
           f"(root {fmt(root_pad)} + {L} x block {fmt(block_pad)}) x 2 (bf16)")
    expect(f"{tag}: resharding after backward holds",
           rows["after"].get("largest unsharded parameters"),
           (root_pad + (1 + p) * block_pad) * mdl["param_bytes"],
           f"(root {fmt(root_pad)} + (1 + prefetch {p}) x block {fmt(block_pad)}) x 2 (bf16)")
    # gpt2's peak stays in backward, where activations dominate: forward
    # reshards each kept block after its use (reshard_after_forward) before
    # activations grow, so the peak may not rise, but it may never fall
    kept, after = rows["kept"].get("peak", 0), rows["after"].get("peak", 0)
    if kept >= after > 0:
        ok(f"{tag}: peak {fmt(kept)} >= {fmt(after)} when resharding after backward")
    else:
        bad(f"{tag}: peak {fmt(kept)} is below {fmt(after)} (resharding after backward)")


# ── golden --dump-memory of every example at W = 8 ──

def check_golden():
    for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        if not name.endswith(".fsd"):
            continue
        base = name[:-4]
        gold = os.path.join(ROOT, "tests/golden", base + ".memory")
        st, out, err = run([os.path.join("examples", name), "--dump-memory", "--world", "8"])
        if st != 0:
            bad(f"golden {base}.memory: fsdpc failed", err)
        elif REGEN:
            with open(gold, "w") as f:
                f.write(out)
            ok(f"golden {base}.memory (regenerated)")
        elif not os.path.exists(gold):
            bad(f"golden {base}.memory: no expected file tests/golden/{base}.memory")
        elif open(gold).read() == out:
            ok(f"golden {base}.memory")
        else:
            diff = difflib.unified_diff(open(gold).read().splitlines(), out.splitlines(),
                                        f"tests/golden/{base}.memory", "fsdpc", lineterm="")
            bad(f"golden {base}.memory", "\n".join(diff))


if __name__ == "__main__":
    if not REGEN:
        for w in (8, 64, 7):      # 7: the groups do not divide, padding shows
            check_transformer(gpt2(), w)
            check_transformer(llama3_8b(), w)
        for w in (3, 8):
            check_odd(w)
        for w in (8, 7):
            check_kept_gathered(w)
        check_budget()
    check_errors()
    check_golden()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
