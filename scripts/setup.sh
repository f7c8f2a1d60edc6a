#!/usr/bin/env bash
# Idempotent set-up from a clean clone: ./.venv with CPU torch and mmpipe[test] (editable).
#
#   bash scripts/setup.sh            # from any directory
#
# torch is installed FIRST and on its own (TORCH_SPEC, default torch==2.13.0): with no torch
# installed, the plain `torch>=2.4` requirement of mmpipe would pull the multi-GB CUDA build.
# Set TORCH_SPEC to install another build; PYTHON picks the interpreter for the venv.
# A re-run with an unchanged pyproject.toml does nothing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.mmpipe-setup"
say() { echo "[setup] $*" >&2; }

if [ ! -x "$PY" ]; then
    say "creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi

want="$(cat pyproject.toml scripts/setup.sh | "$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$PY" -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ("torch", "mmpipe", "pytest")))' 2>/dev/null; then
    say "up to date ($PY)"
    exit 0
fi

# --quiet keeps progress off; also drop pip's notes about unreachable index locations.
pip_install() {
    "$PY" -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory" >&2)
}
if "$PY" -c 'import torch' 2>/dev/null; then
    say "torch $("$PY" -c 'import torch; print(torch.__version__)') already installed"
else
    say "installing $TORCH_SPEC"
    pip_install "$TORCH_SPEC"
fi
say "installing mmpipe[test] (editable)"
pip_install -e ".[test]"
echo "$want" > "$STAMP"
say "done: $("$PY" -c 'import torch, transformers, datasets; print(f"torch {torch.__version__}, transformers {transformers.__version__}, datasets {datasets.__version__}")')"
