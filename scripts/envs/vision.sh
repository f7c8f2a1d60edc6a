#!/usr/bin/env bash
# Test environment "vision": the generic path (mmpipe.encode_row(row, processor) on a processor
# with no family row) on the transformers 5.25 VLM processors whose image processors need
# torchvision (Kimi-K2.5, Phi-4-multimodal, Llama 4, Step-3.7; Gemma 4's and GLM-5.3-Flash's video
# processors) or whose vision tower needs timm (Gemma 3n), which the main .venv must never hold.
#
#   bash scripts/envs/vision.sh              # build .venv-vision (idempotent) and run its tests
#   bash scripts/envs/vision.sh -x -k llama4 # extra arguments go to pytest
#
# Builds .venv-vision: torch==2.13.0 first (a bare torch requirement pulls the CUDA build), then
# transformers==$VISION_TF_VERSION (the main suite's) and mmpipe[test] editable, pins held by a
# constraints file, then timm==$TIMM_VERSION with --no-deps (its requirements are torch,
# torchvision, pyyaml, huggingface_hub and safetensors: all but torchvision come with
# transformers). torchvision is never installed: the registry's 0.28.0 wheel is CUDA-linked, so
# the tests get its pure-Python part only (unpacked into .envs-cache/vision/tv with its two
# native-op registration modules emptied, `unpack_torchvision_python` in _common.bash, on
# PYTHONPATH for this run). Runs every test marked @pytest.mark.needs_env("vision").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

NAME=vision
VISION_TF_VERSION="${VISION_TF_VERSION:-5.25.0}"
TIMM_VERSION="${TIMM_VERSION:-1.0.31}"
TV_DIR=.envs-cache/vision/tv
source scripts/envs/_common.bash

if env_up_to_date "${BASH_SOURCE[0]}" && [ -f "$TV_DIR/torchvision/__init__.py" ]; then
    say "up to date ($PY)"
else
    env_create
    constraints="$VENV/constraints.txt"
    printf 'transformers==%s\ntorch==2.13.0\n' "$VISION_TF_VERSION" > "$constraints"
    pip_install -c "$constraints" "transformers==$VISION_TF_VERSION" -e ".[test]" \
        || fail "pip install transformers==$VISION_TF_VERSION -e .[test]"
    pip_install --no-deps "timm==$TIMM_VERSION" || fail "pip install --no-deps timm==$TIMM_VERSION"
    "$PY" -c 'import torchvision' 2>/dev/null && fail "torchvision is installed in $VENV (CUDA-only build); remove it"
    unpack_torchvision_python "$TV_DIR" || fail "unpack torchvision 0.28.0's Python part into $TV_DIR"
    PYTHONPATH="$TV_DIR" "$PY" -c '
import timm, transformers
for name in ("Kimi_K25ImageProcessor", "Phi4MultimodalImageProcessor", "Llama4ImageProcessor", "TimmWrapperModel"):
    getattr(transformers, name)
' || fail "import timm and the torchvision image processors with $TV_DIR on PYTHONPATH"
    env_done "${BASH_SOURCE[0]}"
fi
versions="$(PYTHONPATH="$TV_DIR" "$PY" -c 'import torch, torchvision, transformers, timm; print(f"torch {torch.__version__}, transformers {transformers.__version__}, timm {timm.__version__}, torchvision {torchvision.__version__} (Python part)")')"
say "set-up took $(env_took) s: $versions"

mapfile -t MARKED < <(marked_tests)
[ "${#MARKED[@]}" -gt 0 ] || fail "no test file is marked needs_env(\"$NAME\")"
PYTHONPATH="$TV_DIR" MMPIPE_TEST_ENV=$NAME exec "$PY" -m pytest -q -p no:cacheprovider "${MARKED[@]}" "$@"
