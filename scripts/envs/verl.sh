#!/usr/bin/env bash
# Test environment "verl": mmpipe.hosts.verl against the real verl package. verl pins its own
# transformers range (verl 0.9.1: >=5.5.3,<5.11, so transformers 5.10.x here), which clashes
# with the main .venv, hence a venv of its own.
#
#   bash scripts/envs/verl.sh               # build .venv-verl (idempotent) and run its tests
#   bash scripts/envs/verl.sh -x -k rope    # extra arguments go to pytest
#
# Builds .venv-verl: torch==2.13.0 first (a bare torch requirement pulls the CUDA build), then
# verl==$VERL_VERSION with its dependencies and mmpipe[test] editable, torch held by a
# constraints file. Runs tests/hosts/test_verl.py (its unmarked tests too: mmpipe on verl's
# transformers) with MMPIPE_TEST_ENV=verl, plus every test marked @pytest.mark.needs_env("verl").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

NAME=verl
VERL_VERSION="${VERL_VERSION:-0.9.1}"
source scripts/envs/_common.bash

if ! env_ready "${BASH_SOURCE[0]}"; then
    constraints="$VENV/constraints.txt"
    printf 'torch==2.13.0\n' > "$constraints"
    # cachetools: verl 0.9.1's agent loop (workers/rollout/router.py) imports it without declaring it
    pip_install -c "$constraints" "verl==$VERL_VERSION" cachetools -e ".[test]" || fail "pip install verl==$VERL_VERSION -e .[test]"
    "$PY" -c 'import verl.protocol, verl.utils.dataset.rl_dataset, verl.models.transformers.qwen2_vl' \
        || fail "import verl (protocol, rl_dataset, qwen2_vl rope)"
    env_done "${BASH_SOURCE[0]}"
fi
say "set-up took $(env_took) s: $("$PY" -c 'import torch, transformers, verl; print(f"torch {torch.__version__}, transformers {transformers.__version__}, verl {verl.__version__}")')"

# Files holding tests marked for this environment (the conftest keeps only those in them), and
# tests/hosts/test_verl.py whole.
mapfile -t MARKED < <(marked_tests)
MMPIPE_TEST_ENV=$NAME exec "$PY" -m pytest -q -p no:cacheprovider tests/hosts/test_verl.py "${MARKED[@]}" "$@"
