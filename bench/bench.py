#!/usr/bin/python3
"""bench.py — what `make bench` prints: one table of fsdpc's measured and
predicted performance, with the figures it is compared against.

1. Training throughput of fsdpc's CPU trainer against PyTorch
   (bench/torch_gpt.py) on the same model, global batch, data, initial
   weights and thread count: Debian's python3-torch 1.13 eager, and PyTorch 2
   from PyPI (.venv-torch2, tools/venv-torch2.sh) eager and torch.compile'd,
   run one after the other, alternating, for examples/tiny.fsd,
   bench/gpt4x256.fsd, bench/gpt6x384.fsd and bench/gpt2_124m.fsd: 1 rank x
   N threads against PyTorch on N threads, for N = 1 and every core; 2 MPI
   ranks x 1 thread against PyTorch on 2 threads. Median step time after
   warm-up steps, peak resident memory (per process, /usr/bin/time), and
   the largest loss difference between fsdpc and each PyTorch, which says
   they trained the same model (above LOSS_TOL the bench fails). Without
   PyTorch 2 (no PyPI) its columns say so and the rest runs.
2. fsdpc's compile time for GPT-2 with 1 to 96 layers (examples/gpt2.fsd
   with `layers` changed) and Llama 3 8B at --world 1024, and the size of
   train.cu.
3. The simulator's predictions (--sim) for GPT-2 124M and Llama 3 8B on
   H100s, next to published figures (footnotes name them).

Run by `make bench` after it has built build/bench/<model>/train,
build/fsdpc and build/fsdata. Environment: BENCH_ROUNDS (default 2),
BENCH_QUICK=1 (fewer steps, tiny and gpt4x256 only, no compile times or
simulator: a smoke test), BENCH_MODELS=name,name (a subset),
BENCH_LOADED=1 (every configuration also run with a busy process pinned to
one core during both sides' runs, alternating with the quiet runs; the
table adds the loaded figures and the ratios loaded vs quiet). Writes the
table to standard output and to build/bench/bench.md, the raw figures to
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
TORCH2_PY = os.path.join(ROOT, ".venv-torch2", "bin", "python")   # tools/venv-torch2.sh
QUICK = os.environ.get("BENCH_QUICK") == "1"
LOADED = os.environ.get("BENCH_LOADED") == "1"
LOSS_TOL = 1e-3   # relative; fp32 trainers of one model agree to ~1e-6 over these steps
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "1" if QUICK else "2"))
CORES = os.cpu_count() or 1

# The models, as their .fsd files say (PyTorch needs the same numbers).
# G is the global batch of a step: B × world sequences, grad_accum 1 on both
# sides, so 1 rank and 2 ranks do the same total work. torch.compile's
# first step compiles (seconds to minutes of gcc) and the second can still
# be slow, so `warm` is at least 2.
MODELS = [
    dict(name="tiny", fsd="examples/tiny.fsd", vocab=256, dim=64, layers=2, heads=4, seq=64,
         G=8, lr=3e-3, min_lr=3e-4, warmup=10, betas=(0.9, 0.95), wd=0.1, clip=1.0,
         steps=12 if QUICK else 40, warm=4 if QUICK else 10),
    dict(name="gpt4x256", fsd="bench/gpt4x256.fsd", vocab=512, dim=256, layers=4, heads=4,
         seq=128, G=8, lr=1e-3, min_lr=1e-4, warmup=5, betas=(0.9, 0.99), wd=0.1, clip=1.0,
         steps=6 if QUICK else 16, warm=2 if QUICK else 4),
    dict(name="gpt6x384", fsd="bench/gpt6x384.fsd", vocab=256, dim=384, layers=6, heads=6,
         seq=256, G=8, lr=1e-3, min_lr=1e-4, warmup=5, betas=(0.9, 0.99), wd=0.1, clip=1.0,
         steps=5 if QUICK else 8, warm=2),
    dict(name="gpt2_124m", fsd="bench/gpt2_124m.fsd", vocab=50304, dim=768, layers=12,
         heads=12, seq=64, G=4, lr=6e-4, min_lr=6e-5, warmup=5, betas=(0.9, 0.95), wd=0.1,
         clip=1.0, steps=5 if QUICK else 7, warm=2),
]
MODELS_ALL = MODELS
_names = os.environ.get("BENCH_MODELS") or ("tiny,gpt4x256" if QUICK else "")
if _names:
    _unknown = set(_names.split(",")) - {m["name"] for m in MODELS}
    if _unknown:
        sys.exit(f"bench: BENCH_MODELS names {', '.join(sorted(_unknown))}; the models are "
                 + ", ".join(m["name"] for m in MODELS))
    MODELS = [m for m in MODELS if m["name"] in _names.split(",")]

# The PyTorch sides: (key, label, python, torch_gpt.py flags). PyTorch 2's
# two are dropped when .venv-torch2 is not usable (torch2_state).
TORCHES = [("t1", "PyTorch 1.13 eager", TORCH_PY, []),
           ("t2", "PyTorch 2 eager", TORCH2_PY, []),
           ("t2c", "PyTorch 2 torch.compile", TORCH2_PY, ["--compile"])]


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
    (runtime/blas.c, fsdrt_blas_tune_core), so PyTorch can be given the same: the
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


def torch_run(m, threads, data, init, blas_env, steps=None, warm=None, drop=(), py=TORCH_PY,
              flags=()):
    steps = steps or m["steps"]
    warm = m["warm"] if warm is None else warm
    tmp = tempfile.mkdtemp(dir=OUT)
    cmd = ["/usr/bin/time", "-f", "%M", "-o", os.path.join(tmp, "rss"), py,
           os.path.join(ROOT, "bench", "torch_gpt.py")] + list(flags)
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


class Busy:
    """A process busy on one core (the last), for BENCH_LOADED: started
    before a run, stopped after it, so both sides meet the same load."""
    def __init__(self, on):
        self.on, self.p = on, None

    def __enter__(self):
        if self.on:
            self.p = subprocess.Popen(["taskset", "-c", str(CORES - 1), "sh", "-c",
                                       "while :; do :; done"])
        return self

    def __exit__(self, *exc):
        if self.p:
            self.p.kill()
            self.p.wait()


def torch2_state():
    """(usable, why not): .venv-torch2 as tools/venv-torch2.sh left it."""
    p = subprocess.run([os.path.join(ROOT, "tools", "venv-torch2.sh"), "--check"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if p.returncode == 0:
        return True, ""
    return False, ("not installed: tools/venv-torch2.sh could not make .venv-torch2 "
                   "(PyPI unreachable?); run it to see why")


def median_ms(runs):
    return statistics.median([x for r in runs for x in r["step_ms"]])


def throughput(blas_env, torches):
    results = []
    threads = sorted({1, CORES})
    loads = [False, True] if LOADED else [False]
    for m in MODELS:
        data = os.path.join(OUT, f"synth{m['vocab']}.bin")
        if not os.path.exists(data):
            run([FSDATA, "synth", data, "--tokens", "2000000", "--seed", "1",
                 "--vocab", str(m["vocab"])])
        exe = os.path.join(OUT, m["name"], "train")
        init = os.path.join(OUT, m["name"] + ".init.safetensors")
        run([exe, "--steps", "0", "--export", init, "--quiet"], blas_env)
        # configurations: (label, fsdpc ranks, fsdpc threads, PyTorch threads)
        configs = [(f"1 rank x {n} thread{'s' if n > 1 else ''}", 1, n, n) for n in threads]
        if CORES >= 2:
            configs.append(("2 ranks x 1 thread", 2, 1, 2))
        acc = {(c[0], ld): {k: [] for k in ["f"] + [t[0] for t in torches]}
               for c in configs for ld in loads}
        for rnd in range(ROUNDS):
            print(f"bench: {m['name']}, round {rnd + 1} of {ROUNDS} ...", file=sys.stderr)
            for label, ranks, nt, tt in configs:
                for ld in loads:   # alternate: quiet, loaded; in each fsdpc, then each PyTorch
                    a = acc[(label, ld)]
                    with Busy(ld):
                        a["f"].append(fsdpc_run(m, ranks, nt, data, blas_env))
                    for key, _, py, flags in torches:
                        with Busy(ld):
                            a[key].append(torch_run(m, tt, data, init, blas_env, py=py,
                                                    flags=flags))
        tokens = m["G"] * m["seq"]
        for label, ranks, nt, tt in configs:
            for ld in loads:
                a = acc[(label, ld)]
                f = a["f"]
                fms = median_ms(f)
                row = dict(model=m["name"], config=label, loaded=ld, ranks=ranks,
                           fsdpc_threads=nt, torch_threads=tt, fsdpc_step_ms=fms,
                           fsdpc_tok_s=tokens / fms * 1e3,
                           fsdpc_rss_kib=max(max(r["rss_kib"]) for r in f),
                           fsdpc_rss_total_kib=max(sum(r["rss_kib"]) for r in f),
                           steps=m["steps"], warm=m["warm"], rounds=ROUNDS, torch={})
                for key, name, _, _ in torches:
                    t = a[key]
                    tms = median_ms(t)
                    row["torch"][key] = dict(
                        name=name, step_ms=tms, tok_s=tokens / tms * 1e3,
                        rss_kib=max(r["rss_kib"][0] for r in t),
                        loss_gap=max(loss_gap(x["loss"], y["loss"]) for x, y in zip(f, t)))
                results.append(row)
    return results


def torch_default_env(blas):
    """PyTorch on gpt6x384, 1 thread, without OPENBLAS_CORETYPE: what a user
    of this machine gets by default (a footnote), when fsdpc overrides it."""
    m = next((m for m in MODELS if m["name"] == "gpt6x384"), None)
    if not (blas[0] and blas[1]) or not m:
        return None
    data = os.path.join(OUT, f"synth{m['vocab']}.bin")
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


def ms_cell(ms, tokens):
    return f"{ms:,.1f} ms ({tokens / ms * 1e3:,.0f} tok/s)"


def table(thr, torch_default, blas, comp, sims, torches, t2_note, load=None):
    keys = [t[0] for t in torches]
    names = {t[0]: t[1] for t in torches}
    head = ["model, configuration"] + (["machine"] if LOADED else []) + ["fsdpc step"] + \
        [f"{names[k]} step (fsdpc's speed-up)" for k in keys] + ["largest loss difference"]
    L = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in thr:
        tokens = r["fsdpc_tok_s"] * r["fsdpc_step_ms"] / 1e3
        cells = [f"{r['model']}, {r['config']} (PyTorch {r['torch_threads']} "
                 f"thread{'s' if r['torch_threads'] > 1 else ''})"]
        if LOADED:
            cells.append("loaded [4]" if r["loaded"] else "quiet")
        cells.append(ms_cell(r["fsdpc_step_ms"], tokens))
        for k in keys:
            t = r["torch"][k]
            cells.append(f"{t['step_ms']:,.1f} ms (**{t['step_ms'] / r['fsdpc_step_ms']:.2f}x**)")
        gaps = [r["torch"][k]["loss_gap"] for k in keys]
        cells.append(" / ".join(f"{g:.1e}" for g in gaps) + (" **DIFFER**" if max(gaps) > LOSS_TOL
                                                              else ""))
        L.append("| " + " | ".join(cells) + " |")
    if LOADED:
        L += ["", "Loaded against quiet (each side's step time loaded / quiet; fsdpc's speed-up "
              "loaded and quiet):", ""]
        hl = ["model, configuration", "fsdpc slowdown"] + \
            [f"{names[k]}: slowdown; speed-up loaded vs quiet" for k in keys]
        L += ["| " + " | ".join(hl) + " |", "|" + "---|" * len(hl)]
        by = {(r["model"], r["config"], r["loaded"]): r for r in thr}
        for r in thr:
            if r["loaded"]:
                continue
            q, ld = r, by[(r["model"], r["config"], True)]
            cells = [f"{r['model']}, {r['config']}",
                     f"{ld['fsdpc_step_ms'] / q['fsdpc_step_ms']:.2f}x"]
            for k in keys:
                tq, tl = q["torch"][k], ld["torch"][k]
                sq = tq["step_ms"] / q["fsdpc_step_ms"]
                sl = tl["step_ms"] / ld["fsdpc_step_ms"]
                cells.append(f"{tl['step_ms'] / tq['step_ms']:.2f}x; {sl:.2f}x vs {sq:.2f}x"
                             + (" (worse)" if sl < sq else ""))
            L.append("| " + " | ".join(cells) + " |")
    L += ["", "| measurement | setup | fsdpc | reference | fsdpc / reference |",
          "|---|---|---|---|---|"]
    for r in thr:
        if r["loaded"]:
            continue
        per = " per rank" if r["ranks"] > 1 else ""
        total = f", {mib(r['fsdpc_rss_total_kib'])} both" if r["ranks"] > 1 else ""
        ref = "; ".join(f"{names[k]} {mib(r['torch'][k]['rss_kib'])}" for k in keys)
        L.append(f"| peak resident memory | {r['model']}, {r['config']} "
                 f"| {mib(r['fsdpc_rss_kib'])}{per}{total} | {ref} "
                 f"| {r['fsdpc_rss_total_kib'] / r['torch']['t1']['rss_kib']:.2f}x 1.13's |")
    by = {(r["model"], r["config"]): r for r in thr if not r["loaded"]}
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
        f"[1] This machine: {CORES} cores, {cpu_model()}; fsdpc's products: "
        f"{runtime_blas()}; OpenBLAS {blas_note(blas)}; "
        f"PyTorch {torch_version(TORCH_PY)} (Debian) eager; PyTorch 2: {t2_note}; "
        "bench/torch_gpt.py, the same GPT written from "
        "docs/design.md#semantics-the-tests-rely-on (under PyTorch 2 with "
        "scaled_dot_product_attention), float32 throughout, torch.optim.AdamW as a user "
        "gets it. Speed-up = PyTorch's step time / fsdpc's. Global batch G sequences per "
        "step on both sides (fsdpc: --micro-batch G/ranks --grad-accum 1); median step time "
        f"over {ROUNDS} alternating round(s) after warm-up steps (torch.compile's compiling "
        "steps among them); tokens/s = G x seq / step time. All start from the same weights "
        "(fsdpc --steps 0 --export) on the same tokens; the loss column (1.13 / 2 eager / "
        f"compile, relative, largest over the steps; above {LOSS_TOL:g} the bench fails) "
        "shows they trained the same model. Peak resident memory from "
        "/usr/bin/time per process. Shared machine: other jobs' load moves every figure; "
        "compare rows of one run."
        + (f" Load average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end of "
           "the throughput runs." if load else "")
        + (f" PyTorch in the default environment (no OPENBLAS_CORETYPE), gpt6x384, 1 thread: "
           f"{torch_default:,.0f} tokens/s." if torch_default else ""),
    ]
    if sims:
        notes += [
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
    if LOADED:
        notes += [
        f"[4] Loaded: a shell loop busy on core {CORES - 1} (taskset) during each side's run, "
        "started before and stopped after it; the quiet and loaded runs of a configuration "
        "alternate. Quiet means no such loop, not an idle machine.",
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


def runtime_blas():
    """The library fsdpc's runtime was built with (Makefile BLAS=, runtime/blas.c)."""
    try:
        lib = open(os.path.join(ROOT, "build", "runtime", "blas.stamp")).read().split()[0]
    except (OSError, IndexError):
        return "?"
    return {"openblas": "OpenBLAS", "dnnl": "oneDNN (Debian's libdnnl)",
            "mkl": "MKL"}.get(lib, lib) + " (BLAS=%s, docs/performance.md#choosing-the-blas)" % lib


def blas_note(blas):
    detected, forced = blas
    if forced and detected:
        return (f"{blas_version()} detects this CPU as {detected} (SSE3 kernels); fsdpc's "
                f"runtime restarts with OPENBLAS_CORETYPE={forced}, and PyTorch is given "
                "the same")
    if forced:
        return f"OPENBLAS_CORETYPE={forced} for both"
    return f"kernels {detected or 'as detected'} for both"


def torch_version(py):
    try:
        return run([py, "-c", "import torch; print(torch.__version__)"]).stdout.strip()
    except Exception:
        return "?"


def main():
    os.makedirs(OUT, exist_ok=True)
    blas = blas_coretype()
    blas_env = {"OPENBLAS_CORETYPE": blas[1]} if blas[1] else {}
    t0 = time.time()
    ok2, why2 = torch2_state()
    torches = TORCHES if ok2 else TORCHES[:1]
    t2_note = (f"{torch_version(TORCH2_PY)} from PyPI (.venv-torch2, MKL and oneDNN), eager "
               "and torch.compile (inductor, C++)" if ok2 else why2)
    if not ok2:
        print(f"bench: PyTorch 2 {why2}; benching without it", file=sys.stderr)
    print("bench: throughput (fsdpc and PyTorch, alternating) ...", file=sys.stderr)
    load0 = os.getloadavg()[0]
    thr = throughput(blas_env, torches)
    load = (load0, os.getloadavg()[0])
    torch_default = torch_default_env(blas)
    comp, sims = [], []
    if not QUICK:
        print("bench: compile times ...", file=sys.stderr)
        comp = compile_times()
        print("bench: simulator ...", file=sys.stderr)
        sims = [simulate(fsd, preset) for _, fsd, preset, _, _ in SIMS]
    text = table(thr, torch_default, blas, comp, sims, torches, t2_note, load)
    print(text)
    open(os.path.join(OUT, "bench.md"), "w").write(text + "\n")
    json.dump(dict(throughput=thr, load_average=load, torch_default_env_tok_s=torch_default,
                   blas=blas, torch2=t2_note, loaded=LOADED,
                   compile=comp, simulated=[dict(zip(("model", "fsd", "preset", "where",
                                                      "reference"), s), **p)
                                            for s, p in zip(SIMS, sims)],
                   seconds=time.time() - t0),
              open(os.path.join(OUT, "results.json"), "w"), indent=1)
    print(f"bench: {time.time() - t0:.0f} s; build/bench/bench.md, build/bench/results.json",
          file=sys.stderr)
    bad = [f"{r['model']}, {r['config']}, {r['torch'][k]['name']}: {r['torch'][k]['loss_gap']:.1e}"
           for r in thr for k in r["torch"] if r["torch"][k]["loss_gap"] > LOSS_TOL]
    if bad:
        sys.exit("bench: losses differ by more than %g (relative):\n  " % LOSS_TOL
                 + "\n  ".join(bad))


if __name__ == "__main__":
    main()
