#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the tests from the repository root; arguments go to pytest:
#
#   bash scripts/test.sh                                  # everything
#   bash scripts/test.sh tests/test_demo.py -x            # a subset
#
# Exits non-zero when a test fails or errors, and also when no test ran (pytest exit code 5).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
rc=0
.venv/bin/python -m pytest -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] no tests were collected: counted as a failure" >&2
fi
exit "$rc"
