#!/bin/sh
# venv-torch2.sh — PyTorch 2 from PyPI for `make bench`: .venv-torch2/ in
# the repository (gitignored), a virtual environment of Debian's
# /usr/bin/python3 WITHOUT the system's site-packages (so Debian's torch 1.13
# cannot shadow it), with the exact versions of tools/torch2-requirements.txt.
# The tests' .venv (tools/venv.sh: torch 1.13 and pinned transformers) is a
# different folder and is never touched, so test references do not move.
#
#   tools/venv-torch2.sh           make or repair .venv-torch2; says what it did
#   tools/venv-torch2.sh --check   only say whether it is usable (exit 0 or 1)
#
# Usable = its python imports torch at the pinned version and multiplies two
# matrices (checked by running, not by the folder's presence); a usable one
# is reused as it is. Otherwise the pins are installed with --no-deps: the
# wheel's own dependency list would also pull triton and cuda-bindings,
# which a CPU never uses. About 2 GB is downloaded (torch 540 MB, the CUDA
# libraries it links, cuDNN the largest), 4.4 GB on disk; at PyPI's ~30-60
# MB/s here that took under a minute. A new environment is checked once with
# torch.compile too (it needs the system's C compiler). Without PyPI it
# fails fast, exit status 1; bench/bench.py then benches without PyTorch 2
# and says so.
set -u
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
VENV=.venv-torch2
REQ=tools/torch2-requirements.txt

usable() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$REQ" >/dev/null 2>&1 <<'PYEOF'
import sys
pins = dict(l.split("==") for l in open(sys.argv[1]).read().split() if "==" in l)
import torch
if torch.__version__.split("+")[0] != pins["torch"]:
    sys.exit(1)
x = torch.ones(2, 2) @ torch.ones(2, 2)
sys.exit(0 if float(x.sum()) == 8.0 else 1)
PYEOF
}

if [ "${1:-}" = --check ]; then
    usable
    exit
fi
if usable; then
    echo "venv-torch2: $VENV has torch $(sed -n 's/^torch==//p' "$REQ")"
    exit 0
fi
if ! $PY -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "venv-torch2: $PY cannot make a virtual environment (Debian's python3-venv)" >&2
    exit 1
fi
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ] && ! $PY -m venv "$VENV"; then
    echo "venv-torch2: $PY -m venv $VENV failed" >&2
    exit 1
fi
echo "venv-torch2: installing $REQ into $VENV (about 2 GB from PyPI) ..." >&2
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --retries 1 \
        --timeout 30 --no-deps -r "$REQ"; then
    echo "venv-torch2: pip could not install $REQ into $VENV (no network, or PyPI unreachable)" >&2
    exit 1
fi
if ! usable; then
    echo "venv-torch2: $VENV was made but its torch does not import and multiply" >&2
    exit 1
fi
# torch.compile on the CPU: inductor writes C++ and builds it with cc
if ! "$VENV/bin/python" -c '
import torch
f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x, approximate="tanh"))
x = torch.randn(8, 8)
d = (f(x) - torch.nn.functional.gelu(x @ x, approximate="tanh")).abs().max()
assert d < 1e-5, d
' >/dev/null 2>&1; then
    echo "venv-torch2: torch in $VENV imports, but torch.compile fails on this CPU" >&2
    exit 1
fi
echo "venv-torch2: made $VENV in $(($(date +%s) - start)) s (torch $(sed -n 's/^torch==//p' "$REQ") from PyPI)"
