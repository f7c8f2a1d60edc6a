#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the benchmark suite; arguments go to `python -m bench`:
#
#   bash scripts/bench.sh                  # full suite: prints the table, writes bench/results/latest.json
#   bash scripts/bench.sh --quick          # small data, every case and equality check (~50 s)
#   bash scripts/bench.sh --only rope,collate --repeat 7
#
# Runs from any directory; relative paths in the arguments are taken from the current one.
# Exits non-zero when a case fails or its outputs differ from the
# baseline's (a missed speed target is reported in the table, not in the exit code).
#
#   bash scripts/bench.sh --torchvision    # encode, collate and video against the torchvision processors,
#                                          # in the vLLM test environment (the only one with torchvision;
#                                          # set up by scripts/envs/vllm.sh, plus TRL for the collate
#                                          # baseline); writes bench/results/torchvision.json
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${1:-}" = --torchvision ]; then
    shift
    MMPIPE_ENV_SETUP_ONLY=1 bash "$ROOT/scripts/envs/vllm.sh"
    PY="$ROOT/.venv-vllm/bin/python"
    if ! "$PY" -c 'import trl' 2>/dev/null; then  # the collate baseline; vLLM's torch/transformers pins kept
        "$PY" -m pip install --quiet --disable-pip-version-check -c "$ROOT/.venv-vllm/constraints.txt" "trl==1.16.0"
    fi
    PYTHONPATH="$ROOT:$ROOT/.venv-vllm/torchvision-transforms${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m bench \
        --backend torchvision --only encode,collate,video --json "$ROOT/bench/results/torchvision.json" "$@"
fi
bash "$ROOT/scripts/setup.sh"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$ROOT/.venv/bin/python" -m bench "$@"
