#!/usr/bin/env bash
# Idempotent set-up from a clean clone: ./.venv with torch and mmpipe (editable) with an extra.
#
#   bash scripts/setup.sh                        # mmpipe[test]: everything the test suite needs
#   MMPIPE_EXTRAS=demo bash scripts/setup.sh     # mmpipe[demo]: only what the demo needs
#   TORCH_SPEC="torch==2.13.0 --index-url URL" bash scripts/setup.sh   # another torch build
#
# torch is installed FIRST and on its own (TORCH_SPEC, default torch==2.13.0; its words are
# passed to pip as separate arguments, so an index URL can follow): with no torch installed,
# the plain `torch>=2.4` requirement of mmpipe would pull whatever build the index serves by
# default (on Linux x86_64 from PyPI: the CUDA build). PYTHON picks the interpreter for the
# venv. A re-run with an unchanged pyproject.toml does nothing; a venv set up for `test` also
# serves `demo` (test holds everything demo needs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${MMPIPE_EXTRAS:-test}"
VENV=.venv
PY="$VENV/bin/python"
say() { echo "[setup] $*" >&2; }

if [ ! -x "$PY" ]; then
    say "creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi

want="$(cat pyproject.toml scripts/setup.sh | "$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"
stamp_ok() {  # stamp_ok EXTRA: the venv was set up for EXTRA from these files
    [ -f "$VENV/.mmpipe-setup-$1" ] && [ "$(cat "$VENV/.mmpipe-setup-$1")" = "$want" ]
}
needs=(torch mmpipe)
[ "$EXTRAS" = test ] && needs+=(pytest)
[ "$EXTRAS" = demo ] && needs+=(matplotlib)
if { stamp_ok "$EXTRAS" || { [ "$EXTRAS" = demo ] && stamp_ok test; }; } \
    && "$PY" -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in sys.argv[1:]))' "${needs[@]}" 2>/dev/null; then
    say "up to date ($PY, mmpipe[$EXTRAS])"
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
    read -r -a torch_args <<< "$TORCH_SPEC"
    pip_install "${torch_args[@]}"
fi
say "installing mmpipe[$EXTRAS] (editable)"
pip_install -e ".[$EXTRAS]"
echo "$want" > "$VENV/.mmpipe-setup-$EXTRAS"
say "done: $("$PY" -c 'import torch, transformers, datasets; print(f"torch {torch.__version__}, transformers {transformers.__version__}, datasets {datasets.__version__}")')"
