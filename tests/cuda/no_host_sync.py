#!/usr/bin/env python3
"""no_host_sync.py — a static check that a CUDA training step never makes the
host wait for the GPU between its first all-gather and the optimizer.

    no_host_sync.py [--runtime DIR] TRAIN.cu [TRAIN.cu ...]

(--runtime reads the runtime's sources from DIR instead of runtime/: the
suite checks that a planted synchronisation is caught.)

What it reads, and so what it proves:

  1. The emitted program (each TRAIN.cu): the whole file, pasted kernel
     templates included, holds none of the CUDA calls that wait for the GPU
     or that synchronise implicitly (cudaDeviceSynchronize,
     cudaStreamSynchronize, cudaEventSynchronize, cudaStreamQuery, the
     non-async cudaMemcpy*/cudaMemset*, cudaMalloc*/cudaFree*). Its step
     functions (`step` and every `micro_*`) call only the kernel launchers
     defined in the file and fsdrt_* functions: those are the roots of 2.

  2. The CUDA runtime (runtime/*.c of the CUDA library: common.c holds the
     collectives' entry points, which call the cuda_*.c files' bk_* hooks; and the
     typed views fsdrt.h defines inline over the library's calls): every
     function reachable from those roots through calls to functions defined
     in these files holds none of the calls above, no
     MPI call, and neither of the runtime's own host waits (cuda_host_wait,
     cuda_stream_wait_host). Functions that never return (the error exits:
     bk_abort, cuda_failed, rt_bug, ...) are not followed: they end the process.
     One cold path is allowed and named here: pool_grow, which a step
     reaches only when the start-up replay of the schedule's buffer events
     missed a buffer, and which then prints a note (tests/gpu/run.sh fails
     on that note). A finding names the path from the step's entry point
     (fsdrt_wait_gather → bk_wait_gather).

  3. Host buffers of asynchronous copies on that path are pinned: every
     cudaMemcpyAsync reachable from the step names its host side as a
     Backend field h_* (bk->h_stage, ...), and each h_* field is allocated
     with cudaMallocHost somewhere (a copy from pageable memory may
     synchronise).

  4. The step's end: what fsdrt_end_step (common.c) calls before bk_update
     (the check that no collective is left in flight) must be clean, and
     bk_update's first host wait comes after its last optimizer launch
     (cu_adamw / cu_sgd).

  5. `offload = cpu` (docs/cuda.md): the optimizer runs on the host, so the
     update must wait for the step once. That wait is allowed only behind
     bk_update's first statement, `if (r->m->offload_cpu) { F(r, ...);
     return; }`, and F must hold exactly one host wait of its own, first:
     before it F only queues work (CUDA_CHECK'd cudaMemcpyAsync,
     cudaMemsetAsync, cudaEventRecord), the event it waits for is recorded
     on the compute stream (so it covers everything the step queued), and
     the host optimizer (optim_step) comes after it. What F reaches after
     the wait holds no synchronising CUDA call; the only host wait there is
     the small NCCL all-reduce's (cuda_allreduce_small, for jobs MPI does not
     run), on a device that has finished the step. The rest of bk_update
     is held to 4. On the step's path, a host side of a copy may also be a
     shard (->master, ->grad) when bk_alloc_shard allocates shards with
     cudaHostAlloc and common.c allocates master and grad with it.

What it cannot see: synchronisation inside NCCL, cuBLASLt or the CUDA
runtime themselves (NCCL collectives and cublasLtMatmul on a stream are
asynchronous by their documentation; cuBLASLt's descriptors, layouts,
preferences and cublasLtMatmulAlgoGetHeuristic, which a product's first
call makes, are host-side set-up that queues nothing and waits for
nothing), and calls through function pointers
(the runtime has none on this path). Comments and strings are removed
before anything is read, so a call in a comment does not count.
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RUNTIME = os.path.join(ROOT, "runtime")

SYNC = re.compile(r"\b(cudaDeviceSynchronize|cudaStreamSynchronize|cudaEventSynchronize|"
                  r"cudaStreamQuery|cudaEventQuery|cudaMemcpy|cudaMemcpy2D|cudaMemcpyToSymbol|"
                  r"cudaMemcpyFromSymbol|cudaMemset|cudaMemset2D|cudaMalloc|cudaMallocHost|"
                  r"cudaMallocManaged|cudaHostAlloc|cudaFree|cudaFreeHost|cudaDeviceReset|"
                  r"cudaSetDevice)\s*\(")
HOST_WAIT = re.compile(r"\b(cuda_host_wait|cuda_stream_wait_host)\s*\(")
MPI = re.compile(r"\bMPI_\w+\s*\(")
COLD = {"pool_grow"}
KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "do", "else", "case"}


def strip(text):
    """Removes comments and the contents of string and character literals,
    keeping newlines, so offsets and line numbers stay meaningful."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


DEF = re.compile(r"^(?P<pre>[A-Za-z_][\w \t\*]*?)\b(?P<name>[A-Za-z_]\w*)\s*\((?P<args>[^;{}()]*(?:\([^()]*\)[^;{}()]*)*)\)\s*\{",
                 re.M)


def functions(text):
    """name -> (body, noreturn) for each function defined at column 0."""
    fns = {}
    for m in DEF.finditer(text):
        pre = m.group("pre")
        if pre.strip().startswith(("#", "typedef", "return", "else")):
            continue
        start = m.end() - 1
        depth, j = 0, start
        while j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                break
            j += 1
        fns[m.group("name")] = (text[start:j + 1], "_Noreturn" in pre)
    return fns


def calls(body):
    return {m.group(1) for m in re.finditer(r"\b([A-Za-z_]\w*)\s*\(", body)} - KEYWORDS


failures = []


def fail(msg):
    failures.append(msg)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def check_generated(path):
    raw = open(path).read()
    text = strip(raw)
    for m in SYNC.finditer(text):
        fail(f"{path}:{line_of(text, m.start())}: {m.group(1)} in the emitted program")
    fns = functions(text)
    launchers = {name for name, (body, _) in fns.items()
                 if re.search(r"^LAUNCHER\s+void\s+" + re.escape(name) + r"\b", text, re.M)}
    steps = [n for n in fns if n == "step" or n.startswith("micro_")]
    if "step" not in steps:
        fail(f"{path}: no step function found")
    # the program's function-like macros (OP, each op in its trace span):
    # a step function's use of one calls what the macro's body calls
    macros = {m.group(1): m.group(2) for m in
              re.finditer(r"^#[ \t]*define[ \t]+(\w+)\([^)]*\)((?:.*\\\n)*.*)$", text, re.M)}

    def expanded(body, seen=()):
        out = set()
        for c in calls(body):
            if c in macros and c not in seen:
                out |= expanded(macros[c], seen + (c,))
            else:
                out.add(c)
        return out

    roots = set()
    for s in steps:
        for c in expanded(fns[s][0]):
            if c.startswith("fsdrt_"):
                roots.add(c)
            elif c not in launchers and c not in fns:
                fail(f"{path}: step function {s} calls {c}, neither a launcher nor the runtime")
    return roots


def runtime_sources():
    """What libfsdrt_cuda.a is built from: every runtime .c but cpu.c; and
    fsdrt.h, whose static inline views (fsdrt_act, fsdrt_param, ...) the
    step calls in place of the library's untyped fsdrt_*_ptr."""
    fns, where = {}, {}
    for f in sorted(os.listdir(RUNTIME)):
        if (not f.endswith(".c") or f == "cpu.c") and f != "fsdrt.h":
            continue
        text = strip(open(os.path.join(RUNTIME, f)).read())
        for name, v in functions(text).items():
            fns[name] = v
            where[name] = f
    return fns, where


def reach(fns, roots):
    """The functions reachable from roots, each mapped to the one it was
    first reached from (None for a root)."""
    seen, todo = {}, [(r, None) for r in sorted(roots) if r in fns]
    while todo:
        f, parent = todo.pop(0)
        if f in seen:
            continue
        seen[f] = parent
        body, noreturn = fns[f]
        for c in sorted(calls(body)):
            if c in fns and c not in seen and c not in COLD and not fns[c][1]:
                todo.append((c, f))
    return seen


def path_to(seen, f):
    """root → ... → f, through the functions reach found them from"""
    path = [f]
    while seen[path[-1]] is not None:
        path.append(seen[path[-1]])
    return " → ".join(reversed(path))


def check_clean(fns, where, names, why):
    for f in sorted(names):
        body = fns[f][0]
        via = why if names[f] is None else f"{why}: {path_to(names, f)}"
        for pat, what in ((SYNC, "a synchronising CUDA call"), (HOST_WAIT, "a host wait"),
                          (MPI, "an MPI call")):
            for m in pat.finditer(body):
                fail(f"runtime/{where[f]}: {f} ({via}) calls {m.group(0).rstrip('(').strip()}: {what}")


def shards_pinned(fns):
    """bk_alloc_shard allocates pinned host memory (offload), and common.c's
    allocate gets the master and grad shards from it"""
    alloc = fns.get("bk_alloc_shard", ("", False))[0]
    allocate = fns.get("allocate", ("", False))[0]
    return (re.search(r"\bcudaHostAlloc\s*\(", alloc) is not None and
            all(re.search(r"->" + f + r"\s*=\s*bk_alloc_shard\s*\(", allocate) for f in ("master", "grad")))


def check_pinned(fns, where, names):
    all_text = "".join(b for b, _ in fns.values())
    shards = shards_pinned(fns)
    for f in sorted(names):
        for m in re.finditer(r"cudaMemcpyAsync\s*\(([^;]*?)(cudaMemcpy\w+)", fns[f][0], re.S):
            args, kind = m.group(1), m.group(2)
            if kind == "cudaMemcpyDeviceToDevice":
                continue
            fields = re.findall(r"\bbk->(h_\w+)", args)
            if not fields and shards and re.search(r"->(master|grad)\b", args):
                continue
            if not fields:
                fail(f"runtime/{where[f]}: {f}: a {kind} copy on the step's path whose host side is "
                     f"not a pinned h_* buffer")
            for h in fields:
                if not re.search(r"cudaMallocHost\s*\(\s*\(void\s*\*\*\)\s*&bk->" + h + r"\b", all_text):
                    fail(f"runtime/{where[f]}: bk->{h} is not allocated with cudaMallocHost")


OFFLOAD_BRANCH = re.compile(r"\{\s*if\s*\(\s*r->m->offload_cpu\s*\)\s*\{\s*(\w+)\s*\(\s*r\s*,[^;{}]*\)\s*;"
                            r"\s*return\s*;\s*\}")
OFFLOAD_ON = re.compile(r"\btrue,\s*/\*\s*offload_cpu\s*\*/")
QUEUE = {"CUDA_CHECK", "cudaMemcpyAsync", "cudaMemsetAsync", "cudaEventRecord"}
AFTER_WAIT_OK = {"cuda_allreduce_small"}
WAITS = {"cuda_host_wait", "cuda_stream_wait_host"}   # flagged where they are called


def check_offload(fns, where, name):
    """5: the offload update's one host wait, first, on a compute-stream event"""
    if name not in fns:
        fail(f"bk_update's offload branch calls {name}, which no CUDA runtime source defines")
        return
    body = fns[name][0]
    waits = list(HOST_WAIT.finditer(body))
    if len(waits) != 1:
        fail(f"runtime/{where[name]}: {name} (the offload update) holds {len(waits)} host waits; "
             f"it may hold exactly one")
        if not waits:
            return
    w = waits[0]
    before, after = body[:w.start()], body[w.start():]
    for c in sorted(calls(before) - QUEUE):
        fail(f"runtime/{where[name]}: {name} calls {c} before its host wait; only queueing "
             f"({', '.join(sorted(QUEUE))}) may come first")
    for m in SYNC.finditer(before):
        fail(f"runtime/{where[name]}: {name} calls {m.group(1)} before its host wait")
    ev = re.search(r"\b(?:cuda_host_wait|cuda_stream_wait_host)\s*\(\s*r\s*,\s*([^,]+?)\s*,", after)
    recorded = re.findall(r"cudaEventRecord\s*\(\s*([^,]+?)\s*,\s*bk->compute\s*\)", before)
    if not ev or ev.group(1) not in recorded:
        fail(f"runtime/{where[name]}: {name}'s host wait is not on an event recorded on the compute "
             f"stream just before it")
    if "optim_step" not in calls(after):
        fail(f"runtime/{where[name]}: {name} runs no host optimizer (optim_step) after its wait")
    later = set()
    for c in calls(after[w.end() - w.start():]):
        if c in fns and c not in COLD and not fns[c][1]:
            later |= set(reach(fns, {c}))
    for f in sorted(later - WAITS):
        for m in SYNC.finditer(fns[f][0]):
            fail(f"runtime/{where[f]}: {f} (after the offload update's wait) calls {m.group(1)}")
        if f not in AFTER_WAIT_OK:
            for m in HOST_WAIT.finditer(fns[f][0]):
                fail(f"runtime/{where[f]}: {f} (after the offload update's wait) calls "
                     f"{m.group(1)}: a second host wait")


def main(paths):
    roots = set()
    for p in paths:
        roots |= check_generated(p)
    fns, where = runtime_sources()
    missing = sorted(r for r in roots if r not in fns)
    for r in missing:
        fail(f"the step calls {r}, which no CUDA runtime source defines")
    step_path = reach(fns, roots)
    check_clean(fns, where, step_path, "on the step's path")
    check_pinned(fns, where, step_path)

    # the step's end: what fsdrt_end_step calls before bk_update, then bk_update
    end = fns.get("fsdrt_end_step")
    offload = None
    if not end or "bk_update" not in fns or not re.search(r"\bbk_update\s*\(", end[0]):
        fail("fsdrt_end_step, or its call of bk_update, not found")
    else:
        before_update = end[0][:re.search(r"\bbk_update\s*\(", end[0]).start()]
        first = {c for c in calls(before_update) if c in fns and c not in COLD and not fns[c][1]}
        check_clean(fns, where, reach(fns, first), "fsdrt_end_step, before the optimizer")
        body = fns["bk_update"][0]
        branch = OFFLOAD_BRANCH.match(body)
        if branch:   # 5: the offload update, on its own; the device path as before
            offload = branch.group(1)
            check_offload(fns, where, offload)
            body = "{" + body[branch.end():]
        opt = [m.end() for m in re.finditer(r"\bcu_(adamw|sgd)\s*\(", body)]
        waits = [m.start() for m in HOST_WAIT.finditer(body)]
        if not opt:
            fail("bk_update launches no optimizer (cu_adamw, cu_sgd)")
        elif waits and min(waits) < max(opt):
            fail("bk_update waits on the host before its optimizer launches")
        before = body[:max(opt)] if opt else body
        for m in SYNC.finditer(before):
            fail(f"bk_update calls {m.group(1)} before the optimizer")
        for c in calls(before):
            if c in fns and c not in COLD and not fns[c][1]:
                check_clean(fns, where, reach(fns, {c}), "bk_update, before the optimizer")

    if failures:
        for f in failures:
            print(f)
        return 1
    off = ""
    if offload:
        n = sum(1 for p in paths if OFFLOAD_ON.search(open(p).read()))
        off = (f"; offload = cpu ({n} program(s)): one host wait, first in {offload}, before "
               f"the host optimizer")
    print(f"no host synchronisation: {len(paths)} emitted program(s), {len(step_path)} runtime "
          f"functions on the step's path from {len(roots)} entry points, and bk_update up to the "
          f"optimizer{off}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "--runtime":
        RUNTIME = args[1]
        args = args[2:]
    sys.exit(main(args) if args else (print(__doc__) or 2))
