#!/usr/bin/env bash
# Fuzz mmpipe's encode / collate / unbatch / validate (tests/test_fuzz.py) and report outcomes.
#
#   bash scripts/fuzz.sh                                 # CI size: ~2400 cases, fixed seed (~1 min)
#   MMPIPE_FUZZ_EXAMPLES=200000 bash scripts/fuzz.sh     # the longer run: random seeds, hours on 2 cores
#   bash scripts/fuzz.sh -k encode                       # extra arguments go to pytest
#
# Only errors of the mmpipe.errors hierarchy may escape; anything else fails the run with the
# falsifying example (paste it into tests/test_fuzz.py as a regression test). The outcome
# counts (ok / dropped / each documented error / crashes) are printed and written to
# $MMPIPE_FUZZ_REPORT (default: out/fuzz_report.json).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
mkdir -p out
export MMPIPE_FUZZ_REPORT="${MMPIPE_FUZZ_REPORT:-$PWD/out/fuzz_report.json}"
echo "[fuzz] ${MMPIPE_FUZZ_EXAMPLES:-2400} cases in total; report: $MMPIPE_FUZZ_REPORT"
rc=0
.venv/bin/python -m pytest -q -p no:cacheprovider tests/test_fuzz.py -k "test_fuzz_" -s "$@" || rc=$?
[ -f "$MMPIPE_FUZZ_REPORT" ] && cat "$MMPIPE_FUZZ_REPORT"
exit "$rc"
