#!/usr/bin/env bash
# Set up ./.venv with mmpipe[demo] (torch, the core dependencies and matplotlib for its sample
# photos; scripts/setup.sh) and run the offline demo; arguments go to `python -m mmpipe.cli.demo`:
#
#   bash scripts/demo.sh                         # tiny offline Qwen2-VL, 12 rows
#   bash scripts/demo.sh --family qwen3_vl --rows 20 --out /tmp/encoded
#   bash scripts/demo.sh --model /path/to/Qwen2-VL-2B-Instruct    # a real local model
#
# Runs from any directory; relative paths in the arguments are taken from the current one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MMPIPE_EXTRAS=demo bash "$ROOT/scripts/setup.sh"
exec "$ROOT/.venv/bin/python" -m mmpipe.cli.demo "$@"
