#!/usr/bin/env bash
# Test environment "tf457": mmpipe's core on transformers 4.57.x (the line cosmos-rl and EasyR1
# need), next to the main suite's transformers 5.x.
#
#   bash scripts/envs/tf457.sh               # build .venv-tf457 (idempotent) and run its tests
#   bash scripts/envs/tf457.sh -x -k rope    # extra arguments go to pytest
#
# Builds .venv-tf457: torch==2.13.0 first (a bare torch requirement pulls the CUDA build), then
# transformers==$TF457_VERSION, then mmpipe[test] editable with that pin held (a constraints
# file, so the test extra cannot move it). Runs the core tests (encode, collate, rope, model
# logits, rollout consistency) with MMPIPE_TEST_ENV=tf457, plus every test marked
# @pytest.mark.needs_env("tf457").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

NAME=tf457
TF457_VERSION="${TF457_VERSION:-4.57.6}"
source scripts/envs/_common.bash

if ! env_ready "${BASH_SOURCE[0]}"; then
    constraints="$VENV/constraints.txt"
    printf 'transformers==%s\ntorch==2.13.0\n' "$TF457_VERSION" > "$constraints"
    pip_install -c "$constraints" "transformers==$TF457_VERSION" || fail "pip install transformers==$TF457_VERSION"
    pip_install -c "$constraints" -e ".[test]" || fail "pip install -e .[test] with transformers==$TF457_VERSION"
    got="$("$PY" -c 'import transformers; print(transformers.__version__)')" || fail "import transformers"
    [ "$got" = "$TF457_VERSION" ] || fail "transformers is $got, expected $TF457_VERSION"
    env_done "${BASH_SOURCE[0]}"
fi
say "set-up took $(env_took) s: $("$PY" -c 'import torch, transformers; print(f"torch {torch.__version__}, transformers {transformers.__version__}")')"

# The core: encode, collate, rope, model logits, generate kwargs, rollout consistency (and the
# ReMA encoding, which builds on all of them). Tests
# that cannot hold on 4.57 carry a skip naming the reason (they call transformers 5's API).
CORE=(
    tests/encoding/test_encode.py
    tests/batching/test_collate.py
    tests/batching/test_properties.py
    tests/test_rope.py
    tests/rollout/test_model_sees_images.py
    tests/rollout/test_rollout_consistency.py
    tests/rollout/test_inputs.py
    tests/offline/test_fixtures.py
    tests/batching/test_packing_models.py
    tests/rema/test_rema.py
    tests/rema/test_rema_fidelity.py
)
# Files holding tests marked for this environment (the conftest keeps only those in them).
mapfile -t MARKED < <(marked_tests)
MMPIPE_TEST_ENV=$NAME exec "$PY" -m pytest -q -p no:cacheprovider "${CORE[@]}" "${MARKED[@]}" "$@"
