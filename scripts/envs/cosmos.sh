#!/usr/bin/env bash
# Test environment "cosmos": mmpipe's packers against the real cosmos-rl package.
#
#   bash scripts/envs/cosmos.sh              # build .venv-cosmos (idempotent) and run its tests
#   bash scripts/envs/cosmos.sh -x -k mask   # extra arguments go to pytest
#
# cosmos-rl 0.4.7 pins transformers>=4.51.1,<5 and resolves here (pip --dry-run with
# torch==2.13.0 and transformers==4.57.6 held: 45 packages) to a GPU stack - torchvision 0.28.0
# (the registry's build is CUDA-linked and, once importable, breaks transformers' Qwen image
# processor import on CPU torch), nvidia-nccl-cu12, triton + liger_kernel, torchao, kernels -
# that cannot run on these CPU machines. So the environment holds: torch==2.13.0 first,
# transformers==$TF457_VERSION, mmpipe[test] editable (pins held by a constraints file), then
# cosmos-rl==$COSMOS_VERSION itself with --no-deps plus the dependencies that importing its data
# packers, config and utils needs ($COSMOS_IMPORT_DEPS). qwen_vl_utils (imported by cosmos-rl's
# Qwen2.5-VL packer) imports torchvision at top level: the tests get torchvision's pure-Python
# part only (the registry wheel unpacked into .envs-cache/cosmos/tv with its two native-op
# registration modules emptied, on PYTHONPATH for this run; never installed into the venv). The
# tests import cosmos-rl's own BaseDataPacker, Qwen2_5_VLM_DataPacker, compute_logprobs,
# decode_vision_info and comm/base.py's packer check from that installed package.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

NAME=cosmos
TF457_VERSION="${TF457_VERSION:-4.57.6}"
COSMOS_VERSION="${COSMOS_VERSION:-0.4.7}"
# what `import cosmos_rl.dispatcher.data.packer, cosmos_rl.utils.util, cosmos_rl.policy.config`
# needs beyond mmpipe[test] (found by importing them until they imported)
COSMOS_IMPORT_DEPS=(pydantic msgpack pynvml qwen-vl-utils "diffusers>=0.36.0" peft StrEnum redis boto3)
TV_WHEEL=torchvision-0.28.0-cp311-cp311-manylinux_2_28_x86_64.whl
TV_DIR=.envs-cache/cosmos/tv
source scripts/envs/_common.bash

if env_up_to_date "${BASH_SOURCE[0]}" && [ -f "$TV_DIR/torchvision/__init__.py" ]; then
    say "up to date ($PY)"
else
    env_create
    constraints="$VENV/constraints.txt"
    # diffusers would otherwise move huggingface-hub to 1.x, which transformers 4.57 refuses
    printf 'transformers==%s\ntorch==2.13.0\nhuggingface-hub<1.0\n' "$TF457_VERSION" > "$constraints"
    pip_quiet install -c "$constraints" "transformers==$TF457_VERSION" -e ".[test]" \
        || fail "pip install transformers==$TF457_VERSION and mmpipe[test]"
    pip_quiet install -c "$constraints" "${COSMOS_IMPORT_DEPS[@]}" || fail "pip install cosmos-rl's import dependencies"
    pip_quiet install --no-deps "cosmos-rl==$COSMOS_VERSION" || fail "pip install --no-deps cosmos-rl==$COSMOS_VERSION"
    "$PY" -c 'import torchvision' 2>/dev/null && fail "torchvision is installed in $VENV (CUDA-only build); remove it"
    unpack_torchvision_python "$TV_DIR" || fail "unpack torchvision 0.28.0's Python part into $TV_DIR"
    PYTHONPATH="$TV_DIR" "$PY" -c 'import cosmos_rl.dispatcher.data.packer, cosmos_rl.utils.util, cosmos_rl.policy.config' \
        2> >(grep -v "Failed to import VLLM Rollout" >&2) || fail "import cosmos_rl's packers, utils and config"
    env_done "${BASH_SOURCE[0]}"
fi
versions="$("$PY" -c 'import sys, torch, transformers, importlib.metadata as m; print(f"torch {torch.__version__}, transformers {transformers.__version__}, cosmos-rl {m.version(sys.argv[1])}")' cosmos-rl 2>/dev/null)"
say "set-up took $(env_took) s: $versions"

mapfile -t MARKED < <(marked_tests)
[ "${#MARKED[@]}" -gt 0 ] || fail "no test file is marked needs_env(\"$NAME\")"
# plus the packers' own tests, here with cosmos-rl's BaseDataPacker under them
PYTHONPATH="$TV_DIR" MMPIPE_TEST_ENV=$NAME exec "$PY" -m pytest -q -p no:cacheprovider "${MARKED[@]}" \
    tests/rollout/test_packers.py "$@"
