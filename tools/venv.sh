#!/bin/sh
# venv.sh — the tests' Python environment for Hugging Face's libraries:
# .venv/ in the repository (gitignored), made from Debian's /usr/bin/python3
# with --system-site-packages, so python3-torch (1.13) and numpy are the
# system's, and transformers, safetensors and tokenizers pip-installed from
# PyPI at the versions pinned in tools/hf-requirements.txt (the last
# transformers of the torch 1.x era that loads and saves with torch 1.13).
#
#   tools/venv.sh           make or repair .venv; prints what it did
#   tools/venv.sh --quiet   the same, silent when .venv is already usable
#   tools/venv.sh --check   only say whether .venv is usable (exit 0 or 1)
#
# An existing .venv is reused when its python imports the pinned versions
# (checked by import, not by the folder's presence); otherwise the pins are
# installed into it, or into a new one. Without PyPI (no network) it fails
# fast with a message and exit status 1: tests/hf/run.sh then skips what
# needs transformers and says why. tools/setup.sh runs it.
set -u
cd "$(dirname "$0")/.."

PY=/usr/bin/python3
VENV=.venv
REQ=tools/hf-requirements.txt

# the pinned versions, as `import` sees them
usable() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$REQ" >/dev/null 2>&1 <<'PYEOF'
import sys, importlib
pins = dict(l.split("==") for l in open(sys.argv[1]).read().split() if "==" in l)
import torch   # the system's python3-torch
for dist, mod in (("transformers", "transformers"), ("safetensors", "safetensors"),
                  ("tokenizers", "tokenizers"), ("huggingface-hub", "huggingface_hub")):
    if importlib.import_module(mod).__version__ != pins[dist]:
        sys.exit(1)
PYEOF
}

if [ "${1:-}" = --check ]; then
    usable
    exit
fi
if usable; then
    [ "${1:-}" = --quiet ] || echo "venv: $VENV has the pinned transformers, safetensors and tokenizers"
    exit 0
fi
if ! $PY -c 'import torch' >/dev/null 2>&1; then
    echo "venv: $PY has no torch (Debian's python3-torch; tools/setup.sh installs it as root)" >&2
    exit 1
fi
if ! $PY -c 'import ensurepip, venv' >/dev/null 2>&1; then
    echo "venv: $PY cannot make a virtual environment (Debian's python3-venv)" >&2
    exit 1
fi
start=$(date +%s)
if [ ! -x "$VENV/bin/python" ] && ! $PY -m venv --system-site-packages "$VENV"; then
    echo "venv: $PY -m venv --system-site-packages $VENV failed" >&2
    exit 1
fi
# no network: one quick try, not pip's five retries with back-off
if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --retries 1 \
        --timeout 20 -r "$REQ"; then
    echo "venv: pip could not install $REQ into $VENV (no network, or PyPI unreachable)" >&2
    exit 1
fi
if ! usable; then
    echo "venv: $VENV was made but does not import the pinned versions with torch" >&2
    exit 1
fi
echo "venv: made $VENV in $(($(date +%s) - start)) s (transformers, safetensors, tokenizers from PyPI)"
