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
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$ROOT/.venv/bin/python" -m bench "$@"
