# Shared by scripts/envs/*.sh: sourced after NAME is set (scripts/test.sh runs only *.sh, so
# this file is not an environment). Defines the venv paths, messages, quiet pip and the
# idempotence stamp (a hash of pyproject.toml, the environment's script and this file).
PYTHON="${PYTHON:-python3}"
VENV=".venv-$NAME"
PY="$VENV/bin/python"
STAMP="$VENV/.mmpipe-setup"
ENV_START=$(date +%s)
say() { echo "[env $NAME] $*" >&2; }
fail() { say "SET-UP FAILED: $*"; exit 2; }
pip_quiet() { "$PY" -m pip "$@" --quiet --disable-pip-version-check 2> >(grep -v "is ignored: it is neither" >&2); }
pip_install() { pip_quiet install "$@"; }
env_stamp() { cat pyproject.toml "$1" scripts/envs/_common.bash | sha256sum | cut -d' ' -f1; }
# env_up_to_date SCRIPT: the venv was built from these files
env_up_to_date() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(env_stamp "$1")" ]; }
# env_create: the venv, with torch==2.13.0 FIRST (a bare torch requirement pulls the CUDA build)
env_create() {
    [ -x "$PY" ] || "$PYTHON" -m venv "$VENV" || fail "creating $VENV"
    "$PY" -c 'import torch' 2>/dev/null || pip_install "torch==2.13.0" || fail "pip install torch==2.13.0"
}
env_done() { env_stamp "$1" > "$STAMP"; }
# env_ready SCRIPT: 0 (saying so) when the venv is up to date, else creates it and returns 1:
#   if ! env_ready "${BASH_SOURCE[0]}"; then ...install...; env_done "${BASH_SOURCE[0]}"; fi
env_ready() {
    if env_up_to_date "$1"; then say "up to date ($PY)"; return 0; fi
    env_create
    return 1
}
env_took() { echo $(( $(date +%s) - ENV_START )); }
# the test files holding tests marked @pytest.mark.needs_env("$NAME")
marked_tests() { grep -rlE "needs_env\([^)]*\"$NAME\"" tests --include='test_*.py' | sort; }
# unpack_torchvision_python DIR: torchvision 0.28.0's pure-Python part in DIR/torchvision, for PYTHONPATH
# (never pip-installed: the registry's wheel is CUDA-linked and, once installed, breaks transformers'
# image-processor imports on CPU torch). The wheel is downloaded once into .envs-cache, unpacked
# without its .so files, and its two native-op registration modules are emptied.
TV_WHEEL="${TV_WHEEL:-torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl}"
unpack_torchvision_python() {
    local dir="$1"
    [ -f "$dir/torchvision/__init__.py" ] && return 0
    [ -f ".envs-cache/$TV_WHEEL" ] || pip_quiet download --no-deps torchvision==0.28.0 -d .envs-cache || return 1
    mkdir -p "$dir"
    "$PY" -c '
import sys, zipfile
dest, wheel = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)
z.extractall(dest, members=[n for n in z.namelist() if n.startswith("torchvision/") and not n.endswith(".so")])
for f in ("_meta_registrations.py", "_autograd_registrations.py"):  # they register CUDA-linked native ops
    open(f"{dest}/torchvision/{f}", "w").write("# emptied: only the Python transforms are used\n")
' "$dir" ".envs-cache/$TV_WHEEL"
}
