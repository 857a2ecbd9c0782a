#!/usr/bin/python3
"""bench.py — what `make bench` prints: one table of fsdpc's measured and
predicted performance, with the figures it is compared against.

1. Training throughput of fsdpc's CPU trainer against PyTorch eager
   (bench/torch_gpt.py, Debian's python3-torch) on the same model, global
   batch, data, initial weights and thread count, run one after the other,
   alternating, for examples/tiny.fsd and bench/gpt6x384.fsd: 1 rank x N
   threads against PyTorch on N threads, for N = 1 and every core; 2 MPI
   ranks x 1 thread against PyTorch on 2 threads. Median step time after
   warm-up steps, peak resident memory (per process, /usr/bin/time), and
   the largest loss difference between the two, which says they trained the
   same model.
2. fsdpc's compile time for GPT-2 with 1 to 96 layers (examples/gpt2.fsd
   with `layers` changed) and Llama 3 8B at --world 1024, and the size of
   train.cu.
3. The simulator's predictions (--sim) for GPT-2 124M and Llama 3 8B on
   H100s, next to published figures (footnotes name them).

Run by `make bench` after it has built build/bench/<model>/train,
build/fsdpc and build/fsdata. Environment: BENCH_ROUNDS (default 2),
BENCH_QUICK=1 (fewer steps, for a smoke test). Writes the table to
standard output and to build/bench/bench.md, the raw figures to
build/bench/results.json.
"""
import ctypes
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "build", "bench")
FSDPC = os.path.join(ROOT, "build", "fsdpc")
FSDATA = os.path.join(ROOT, "build", "fsdata")
TORCH_PY = "/usr/bin/python3"   # Debian's python3-torch; the pyenv python has no torch
QUICK = os.environ.get("BENCH_QUICK") == "1"
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1" if QUICK else "2"))
CORES = os.cpu_count() or 1

# The two models, as their .fsd files say (PyTorch needs the same numbers).
# G is the global batch of a step: B × world sequences, grad_accum 1 on both
# sides, so 1 rank and 2 ranks do the same total work.
MODELS = [
    dict(name="tiny", fsd="examples/tiny.fsd", vocab=256, dim=64, layers=2, heads=4, seq=64,
         G=8, lr=3e-3, min_lr=3e-4, warmup=10, betas=(0.9, 0.95), wd=0.1, clip=1.0,
         steps=12 if QUICK else 40, warm=4 if QUICK else 10),
    dict(name="gpt6x384", fsd="bench/gpt6x384.fsd", vocab=256, dim=384, layers=6, heads=6,
         seq=256, G=8, lr=1e-3, min_lr=1e-4, warmup=5, betas=(0.9, 0.99), wd=0.1, clip=1.0,
         steps=4 if QUICK else 8, warm=1 if QUICK else 2),
]


def run(cmd, env=None, drop=()):
    e = {k: v for k, v in os.environ.items() if k not in drop}
    e.update(env or {})
    p = subprocess.run(cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd)} failed (status {p.returncode}):\n{p.stderr[-2000:]}")
    return p


# ── OpenBLAS: the kernels both sides get ──

def blas_coretype():
    """The OPENBLAS_CORETYPE fsdpc's runtime starts itself with
    (runtime/cpu.c, check_blas_core), so PyTorch can be given the same: the
    core OpenBLAS detects, and what the runtime overrides it with."""
    pre_avx2 = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge",
                "Katmai", "Coppermine", "Northwood", "Banias", "Barcelona", "Opteron",
                "Opteron_SSE3", "Bobcat"}
    if os.environ.get("OPENBLAS_CORETYPE"):
        return None, os.environ["OPENBLAS_CORETYPE"]
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        detected = lib.openblas_get_corename().decode()
    except OSError:
        return None, None
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if detected not in pre_avx2 or not {"avx2", "fma"} <= flags:
        return detected, None
    avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags
    return detected, "SkylakeX" if avx512 else "Haswell"


# ── throughput ──

def fsdpc_run(m, ranks, threads, data, blas_env):
    """One fsdpc run: median step ms after warm-up, losses, peak RSS per rank."""
    exe = os.path.join(OUT, m["name"], "train")
    tmp = tempfile.mkdtemp(dir=OUT)
    log = os.path.join(tmp, "log.json")
    args = [exe, "--data", data, "--steps", str(m["steps"]), "--micro-batch",
            str(m["G"] // ranks), "--grad-accum", "1", "--log", log, "--quiet"]
    env = dict(blas_env, OMP_NUM_THREADS=str(threads))
    # /usr/bin/time on each rank: its peak resident set
    timed = ["sh", "-c", 'exec /usr/bin/time -f %M -o "$0.${OMPI_COMM_WORLD_RANK:-0}" "$@"',
             os.path.join(tmp, "rss")] + args
    if ranks == 1:
        run(timed, env)
    else:
        mpi = ["mpirun", "--oversubscribe", "-np", str(ranks)]
        if os.geteuid() == 0:
            mpi.insert(1, "--allow-run-as-root")
        for k in env:
            mpi += ["-x", k]
        run(mpi + timed, env)
    rows = [json.loads(line) for line in open(log)]
    rss = [int(open(os.path.join(tmp, f"rss.{r}")).read().split()[-1]) for r in range(ranks)]
    shutil.rmtree(tmp)
    return dict(step_ms=[r["step_ms"] for r in rows][m["warm"]:],
                loss=[r["loss"] for r in rows], rss_kib=rss)


def torch_run(m, threads, data, init, blas_env, steps=None, warm=None, drop=()):
    steps = steps or m["steps"]
    warm = m["warm"] if warm is None else warm
    tmp = tempfile.mkdtemp(dir=OUT)
    cmd = ["/usr/bin/time", "-f", "%M", "-o", os.path.join(tmp, "rss"), TORCH_PY,
           os.path.join(ROOT, "bench", "torch_gpt.py")]
    for k in ("vocab", "dim", "layers", "heads", "seq", "warmup"):
        cmd += ["--" + k, str(m[k])]
    cmd += ["--batch", str(m["G"]), "--steps", str(steps), "--threads", str(threads),
            "--lr", str(m["lr"]), "--min-lr", str(m["min_lr"]), "--betas", str(m["betas"][0]),
            str(m["betas"][1]), "--weight-decay", str(m["wd"]), "--grad-clip", str(m["clip"]),
            "--init", init, "--data", data]
    out = run(cmd, dict(blas_env, OMP_NUM_THREADS=str(threads)), drop).stdout
    res = json.loads(out.strip().splitlines()[-1])
    rss = int(open(os.path.join(tmp, "rss")).read().split()[-1])
    shutil.rmtree(tmp)
    return dict(step_ms=res["step_ms"][warm:], loss=res["loss"], rss_kib=[rss])


def loss_gap(a, b):
    n = min(len(a), len(b))
    return max(abs(a[i] - b[i]) / abs(b[i]) for i in range(n))


def throughput(blas_env):
    data = os.path.join(OUT, "synth.bin")
    run([FSDATA, "synth", data, "--tokens", "2000000", "--seed", "1"])
    results = []
    threads = sorted({1, CORES})
    for m in MODELS:
        exe = os.path.join(OUT, m["name"], "train")
        init = os.path.join(OUT, m["name"] + ".init.safetensors")
        run([exe, "--steps", "0", "--export", init, "--quiet"], blas_env)
        # configurations: (label, fsdpc ranks, fsdpc threads, PyTorch threads)
        configs = [(f"1 rank x {n} thread{'s' if n > 1 else ''}", 1, n, n) for n in threads]
        if CORES >= 2:
            configs.append(("2 ranks x 1 thread", 2, 1, 2))
        acc = {c[0]: dict(f=[], t=[]) for c in configs}
        for _ in range(ROUNDS):
            for label, ranks, nt, tt in configs:   # alternate: fsdpc, then PyTorch
                acc[label]["f"].append(fsdpc_run(m, ranks, nt, data, blas_env))
                acc[label]["t"].append(torch_run(m, tt, data, init, blas_env))
        for label, ranks, nt, tt in configs:
            f, t = acc[label]["f"], acc[label]["t"]
            fms = statistics.median([x for r in f for x in r["step_ms"]])
            tms = statistics.median([x for r in t for x in r["step_ms"]])
            tokens = m["G"] * m["seq"]
            results.append(dict(
                model=m["name"], config=label, ranks=ranks, fsdpc_threads=nt, torch_threads=tt,
                fsdpc_tok_s=tokens / fms * 1e3, torch_tok_s=tokens / tms * 1e3,
                fsdpc_step_ms=fms, torch_step_ms=tms,
                fsdpc_rss_kib=max(max(r["rss_kib"]) for r in f),
                fsdpc_rss_total_kib=max(sum(r["rss_kib"]) for r in f),
                torch_rss_kib=max(r["rss_kib"][0] for r in t),
                loss_gap=max(loss_gap(a["loss"], b["loss"]) for a, b in zip(f, t)),
                steps=m["steps"], warm=m["warm"], rounds=ROUNDS))
    return results


def torch_default_env(blas):
    """PyTorch on gpt6x384, 1 thread, without OPENBLAS_CORETYPE: what a user
    of this machine gets by default (a footnote), when fsdpc overrides it."""
    if not (blas[0] and blas[1]):
        return None
    m = MODELS[-1]
    data = os.path.join(OUT, "synth.bin")
    init = os.path.join(OUT, m["name"] + ".init.safetensors")
    r = torch_run(m, 1, data, init, {}, steps=3, warm=1, drop=("OPENBLAS_CORETYPE",))
    return m["G"] * m["seq"] / statistics.median(r["step_ms"]) * 1e3


# ── compile time ──

def timed(cmd, reps):
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run(cmd)
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


def compile_times():
    src = open(os.path.join(ROOT, "examples", "gpt2.fsd")).read()
    if not re.search(r"\blayers = 12\b", src):
        sys.exit("bench: examples/gpt2.fsd no longer says `layers = 12`")
    rows = []
    tmp = tempfile.mkdtemp(dir=OUT)
    for L in (1, 2, 4, 8, 12, 24, 48, 96):
        f = os.path.join(tmp, f"gpt2_{L}.fsd")
        open(f, "w").write(re.sub(r"\blayers = 12\b", f"layers = {L}", src, count=1))
        cu = os.path.join(tmp, f"gpt2_{L}.cu")
        s = timed([FSDPC, f, "-o", cu], 3 if L < 48 else 2)
        rows.append(dict(model=f"GPT-2, {L} layer{'s' if L > 1 else ''}", what="-o train.cu",
                         seconds=s, bytes=os.path.getsize(cu)))
    llama = os.path.join(ROOT, "examples", "llama3_8b.fsd")
    cu = os.path.join(tmp, "llama.cu")
    s = timed([FSDPC, llama, "--world", "1024", "-o", cu], 3)
    rows.append(dict(model="Llama 3 8B, --world 1024", what="-o train.cu", seconds=s,
                     bytes=os.path.getsize(cu)))
    txt = os.path.join(tmp, "llama.txt")
    s = timed([FSDPC, llama, "--dump-schedule", "--dump-memory", "--sim", "h100:nodes=128",
               "-o", txt], 3)
    rows.append(dict(model="Llama 3 8B, h100:nodes=128 (world 1024)",
                     what="--dump-schedule --dump-memory --sim", seconds=s,
                     bytes=os.path.getsize(txt)))
    shutil.rmtree(tmp)
    return rows


# ── the simulator ──

def simulate(fsd, preset):
    out = run([FSDPC, os.path.join(ROOT, fsd), "--sim", preset]).stdout
    num = lambda pat: float(re.search(pat, out).group(1).replace(",", ""))
    return dict(step_ms=num(r"step\s+([\d.]+) ms"),
                exposed_ms=num(r"exposed comm\s+([\d.]+) ms"),
                exposed_pct=num(r"exposed comm.*?; ([\d.]+)% of the step"),
                mfu=num(r"MFU\s+([\d.]+)%"),
                tok_s_gpu=num(r"tokens/s\s+([\d,]+) per GPU"),
                mem_gib=num(r"memory\s+([\d.]+) GiB"),
                fits="DOES NOT FIT" not in out)


SIMS = [
    ("GPT-2 124M", "examples/gpt2.fsd", "h100:gpus=1", "1 x H100",
     "llm.c: not found for 1 x H100 [3]"),
    ("GPT-2 124M", "examples/gpt2.fsd", "h100", "8 x H100 (1 node)",
     "llm.c: ~463,000 tok/s/GPU, derived [3]"),
    ("Llama 3 8B", "examples/llama3_8b.fsd", "h100", "8 x H100 (1 node)",
     "torchtitan FSDP: 5,762 tok/s/GPU [2]"),
    ("Llama 3 8B", "examples/llama3_8b.fsd", "h100:nodes=8", "64 x H100 (8 nodes)", "not found"),
    ("Llama 3 8B", "examples/llama3_8b.fsd", "h100:nodes=64", "512 x H100 (64 nodes)", "not found"),
]


# ── the table ──

def mib(kib):
    return f"{kib / 1024:,.0f} MiB"


def table(thr, torch_default, blas, comp, sims, load=None):
    L = ["| measurement | setup | fsdpc | reference | fsdpc / reference |",
         "|---|---|---|---|---|"]
    for r in thr:
        ratio = r["fsdpc_tok_s"] / r["torch_tok_s"]
        verdict = "faster" if ratio >= 1 else "**slower**"
        L.append(f"| training tokens/s [1] | {r['model']}, {r['config']} "
                 f"(PyTorch {r['torch_threads']} thread{'s' if r['torch_threads'] > 1 else ''}) "
                 f"| {r['fsdpc_tok_s']:,.0f} ({r['fsdpc_step_ms']:,.1f} ms/step) "
                 f"| PyTorch {r['torch_tok_s']:,.0f} ({r['torch_step_ms']:,.1f} ms/step) "
                 f"| {ratio:.2f}x {verdict} |")
    for r in thr:
        per = " per rank" if r["ranks"] > 1 else ""
        total = f", {mib(r['fsdpc_rss_total_kib'])} both" if r["ranks"] > 1 else ""
        L.append(f"| peak resident memory | {r['model']}, {r['config']} "
                 f"| {mib(r['fsdpc_rss_kib'])}{per}{total} | PyTorch {mib(r['torch_rss_kib'])} "
                 f"| {r['fsdpc_rss_total_kib'] / r['torch_rss_kib']:.2f}x |")
    for r in thr:
        L.append(f"| same model: largest loss difference | {r['model']}, {r['config']} "
                 f"| {r['loss_gap']:.1e} relative, over {r['steps']} steps | | |")
    by = {(r["model"], r["config"]): r for r in thr}
    for m in MODELS:
        two = by.get((m["name"], "2 ranks x 1 thread"))
        one = by.get((m["name"], f"1 rank x {CORES} threads"))
        single = by.get((m["name"], "1 rank x 1 thread"))
        if two and one:
            change = two["fsdpc_tok_s"] / one["fsdpc_tok_s"] - 1
            L.append(f"| 1 rank -> 2 ranks, same global batch | {m['name']}: 2 ranks x 1 thread "
                     f"vs 1 rank x {CORES} threads | {change:+.1%} tokens/s | | |")
        if two and single:
            eff = two["fsdpc_tok_s"] / (2 * single["fsdpc_tok_s"])
            L.append(f"| scaling efficiency | {m['name']}: 2 ranks x 1 thread vs 2 x "
                     f"(1 rank x 1 thread) | {eff:.0%} | | |")
    for c in comp:
        L.append(f"| compile time | {c['model']}: fsdpc {c['what']} "
                 f"| {c['seconds'] * 1e3:,.0f} ms, output {c['bytes'] / 1024:,.0f} KiB | | |")
    for (name, _, _, where, ref), s in zip(SIMS, sims):
        fit = "" if s["fits"] else ", DOES NOT FIT in 80 GiB"
        pred = (f"step {s['step_ms']:,.1f} ms, MFU {s['mfu']:.1f}%, exposed comm "
                f"{s['exposed_ms']:,.1f} ms ({s['exposed_pct']:.1f}%), "
                f"{s['tok_s_gpu']:,.0f} tok/s/GPU, {s['mem_gib']:.1f} GiB{fit}")
        m = re.search(r"([\d,]+) tok/s/GPU", ref)
        ratio = (f"{s['tok_s_gpu'] / float(m.group(1).replace(',', '')):.2f}x predicted"
                 if m else "")
        L.append(f"| simulated (--sim) | {name}, {where} | {pred} | {ref} | {ratio} |")
    notes = [
        "",
        f"[1] This machine: {CORES} cores, {cpu_model()}; OpenBLAS {blas_note(blas)}; "
        f"PyTorch {torch_version()} eager (bench/torch_gpt.py, the same GPT written from "
        "docs/design.md#semantics-the-tests-rely-on), float32 throughout. Global batch G sequences per step on both "
        "sides (fsdpc: --micro-batch G/ranks --grad-accum 1); median step time over "
        f"{ROUNDS} alternating round(s) after warm-up steps; tokens/s = G x seq / step time. "
        "Both start from the same weights (fsdpc --steps 0 --export) on the same tokens; the "
        "loss difference row shows they trained the same model. Peak resident memory from "
        "/usr/bin/time per process. Shared machine: other jobs' load moves every figure; "
        "compare rows of one run."
        + (f" Load average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end of "
           "the throughput runs." if load else "")
        + (f" PyTorch in the default environment (no OPENBLAS_CORETYPE), gpt6x384, 1 thread: "
           f"{torch_default:,.0f} tokens/s." if torch_default else ""),
        "[2] torchtitan docs/performance.md, Table 1: Llama 3.1 8B, 8 H100 (96 GB HBM2e, "
        "500 W), FSDP, local batch 2, seq 8192, selective activation checkpointing: 5,762 "
        "TPS/GPU (5,605 on 128 GPUs, Table 3; fsdpc's figure here is local batch 1, no "
        "activation checkpointing, at 80 GiB per GPU).",
        "[3] llm.c: scripts/run_gpt2_124M.sh: 8 x A100 80GB SXM, 524,288 tokens/step at "
        "~300 ms/iter (about 1.75M tok/s, 218,000 per GPU, on A100s); the modded-nanogpt "
        "README: llm.c's GPT-2 (124M) replication needed 45 minutes on 8 x H100 and 10B "
        "tokens, i.e. about 3.7M tok/s, ~463,000 tok/s per GPU (derived from those two "
        "figures). No single-H100 figure was found.",
        "Simulator: compiler/sim.c (docs/simulator.md): roofline compute at the ideal kernel "
        "fractions, NCCL ring and tree collectives over a node/NIC topology, each .fsd's own "
        "batch and precision (bf16 parameters).",
    ]
    return "\n".join(L + notes)


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def blas_version():
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_config.restype = ctypes.c_char_p
        return " ".join(lib.openblas_get_config().decode().split()[1:2])
    except OSError:
        return "?"


def blas_note(blas):
    detected, forced = blas
    if forced and detected:
        return (f"{blas_version()} detects this CPU as {detected} (SSE3 kernels); fsdpc's "
                f"runtime restarts with OPENBLAS_CORETYPE={forced}, and PyTorch is given "
                "the same")
    if forced:
        return f"OPENBLAS_CORETYPE={forced} for both"
    return f"kernels {detected or 'as detected'} for both"


def torch_version():
    try:
        return run([TORCH_PY, "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    except Exception:
        return "?"


def main():
    os.makedirs(OUT, exist_ok=True)
    blas = blas_coretype()
    blas_env = {"OPENBLAS_CORETYPE": blas[1]} if blas[1] else {}
    t0 = time.time()
    print("bench: throughput (fsdpc and PyTorch, alternating) ...", file=sys.stderr)
    load0 = os.getloadavg()[0]
    thr = throughput(blas_env)
    load = (load0, os.getloadavg()[0])
    torch_default = torch_default_env(blas)
    print("bench: compile times ...", file=sys.stderr)
    comp = compile_times()
    print("bench: simulator ...", file=sys.stderr)
    sims = [simulate(fsd, preset) for _, fsd, preset, _, _ in SIMS]
    text = table(thr, torch_default, blas, comp, sims, load)
    print(text)
    open(os.path.join(OUT, "bench.md"), "w").write(text + "\n")
    json.dump(dict(throughput=thr, load_average=load, torch_default_env_tok_s=torch_default,
                   blas=blas,
                   compile=comp, simulated=[dict(zip(("model", "fsd", "preset", "where",
                                                      "reference"), s), **p)
                                            for s, p in zip(SIMS, sims)],
                   seconds=time.time() - t0),
              open(os.path.join(OUT, "results.json"), "w"), indent=1)
    print(f"bench: {time.time() - t0:.0f} s; build/bench/bench.md, build/bench/results.json",
          file=sys.stderr)


if __name__ == "__main__":
    main()
