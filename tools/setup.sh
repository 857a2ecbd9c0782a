#!/bin/sh
# setup.sh — installs what fsdpc needs to build and test, if it is missing:
# the compiler's tools, and MPI and a BLAS for the CPU runtime. As root it
# uses apt-get; otherwise it prints the command to run.
#
# clang and its runtime libraries (libFuzzer) are optional: `make test` runs
# its fuzz smoke test only when they are there and says so when they are
# not, so a missing clang is installed as root but never an error. So is
# PyTorch (python3-torch, python3-numpy) for the oracle tests (tests/oracle),
# and .venv, transformers and its libraries from PyPI beside that torch
# (tools/venv.sh), for the Hugging Face tests (tests/hf): without network
# they are skipped, saying why.
set -e

need=""
command -v flex  >/dev/null 2>&1 || need="$need flex"
command -v bison >/dev/null 2>&1 || need="$need bison"
command -v cc    >/dev/null 2>&1 || need="$need gcc"
command -v g++   >/dev/null 2>&1 || need="$need g++"   # tests/cudasim's fakes are C++
command -v make  >/dev/null 2>&1 || need="$need make"
command -v python3 >/dev/null 2>&1 || need="$need python3"
# the CPU runtime (make runtime) and its tests: MPI, OpenBLAS, found with
# pkg-config (its cblas.h, not whichever one /usr/include's alternative
# names, declares openblas_set_num_threads)
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
{ command -v mpicc && command -v mpirun; } >/dev/null 2>&1 || need="$need openmpi-bin libopenmpi-dev"
if ! pkg-config --exists openblas 2>/dev/null; then
    ls /usr/include/*/openblas*/cblas.h /usr/include/openblas/cblas.h >/dev/null 2>&1 ||
        need="$need libopenblas-dev"
fi

# A faster BLAS than OpenBLAS where tools/blas.table measured one for this
# CPU (oneDNN: libdnnl-dev); optional: without it the runtime builds with
# OpenBLAS.
blas=$("$(dirname "$0")/blas.sh" wanted)

# libFuzzer lives in clang's runtime folder (Debian: libclang-rt-dev).
want=""
if ! command -v clang >/dev/null 2>&1; then
    want="clang libclang-rt-dev"
else
    rt=$(clang -print-runtime-dir 2>/dev/null || true)
    if [ ! -e "$rt/libclang_rt.fuzzer-$(uname -m).a" ] && [ ! -e "$rt/libclang_rt.fuzzer.a" ]; then
        want="libclang-rt-dev"
    fi
fi

# PyTorch for the oracle tests (tests/oracle): Debian's python3-torch,
# which installs for /usr/bin/python3 (the python3 first on PATH may be
# another one). Optional like clang: without it `make test` skips the oracle
# and says why. find_spec looks without importing, so this stays fast.
torch=""
has_torch='import importlib.util as u, sys; sys.exit(not (u.find_spec("torch") and u.find_spec("numpy")))'
python3 -c "$has_torch" >/dev/null 2>&1 || /usr/bin/python3 -c "$has_torch" >/dev/null 2>&1 ||
    torch="python3-torch python3-numpy"

# python3-venv: /usr/bin/python3 -m venv, for tools/venv.sh
venv=""
/usr/bin/python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || venv="python3-venv"

# .venv (tools/venv.sh), made or reused: never an error, like the optional
# packages; the Hugging Face tests say when it is missing
hf_venv() {
    tools/venv.sh --quiet ||
        echo "setup: no .venv with transformers (above: why), so \`make test\` skips the" \
             "transformers checks of tests/hf" >&2
}
cd "$(dirname "$0")/.."

if [ -z "$need$want$blas$torch$venv" ]; then
    hf_venv
    exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if [ -n "$need" ]; then
        echo "setup: installing$need"
        apt-get install -y -qq $need >/dev/null
    fi
    if [ -n "$want" ]; then
        echo "setup: installing $want (for the fuzz tests)"
        apt-get install -y -qq $want >/dev/null ||
            echo "setup: could not install $want; the fuzz smoke test will be skipped" >&2
    fi
    if [ -n "$blas" ]; then
        echo "setup: installing $blas (this CPU's fastest BLAS: tools/blas.table)"
        apt-get install -y -qq $blas >/dev/null ||
            echo "setup: could not install $blas; the CPU runtime builds with OpenBLAS" >&2
    fi
    if [ -n "$torch$venv" ]; then
        echo "setup: installing $torch $venv (for the PyTorch oracle and Hugging Face tests)"
        apt-get install -y -qq $torch $venv >/dev/null ||
            echo "setup: could not install $torch $venv; the oracle and Hugging Face tests will be skipped" >&2
    fi
elif [ -n "$need" ]; then
    echo "setup: missing$need; install with:" >&2
    echo "  sudo apt-get install -y$need${want:+ $want}${blas:+ $blas}${torch:+ $torch}" >&2
    exit 1
else
    if [ -n "$blas" ]; then
        echo "setup: the CPU runtime builds with OpenBLAS; $blas is faster on this CPU" \
             "(tools/blas.table): sudo apt-get install -y $blas" >&2
    fi
    if [ -n "$want" ]; then
        echo "setup: no clang with libFuzzer, so \`make test\` skips its fuzz smoke test;" \
             "install with: sudo apt-get install -y $want" >&2
    fi
    if [ -n "$torch$venv" ]; then
        echo "setup: no Python with torch (or venv), so \`make test\` skips its PyTorch oracle" \
             "and Hugging Face tests; install with: sudo apt-get install -y $torch $venv" >&2
    fi
fi
hf_venv
