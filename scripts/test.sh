#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the tests from the repository root; arguments go to pytest:
#
#   bash scripts/test.sh                                  # everything, every environment
#   bash scripts/test.sh tests/test_demo.py -x            # a subset, main environment only
#   MMPIPE_ENVS="vllm" bash scripts/test.sh               # main suite + the vllm environment
#   MMPIPE_ENVS=none bash scripts/test.sh                 # main suite only
#
# The main environment (.venv) runs the whole suite. Tests that need packages whose pins clash
# with ours run afterwards in environments of their own: each scripts/envs/NAME.sh builds its
# venv (idempotent) and runs its tests with MMPIPE_TEST_ENV=NAME (see tests/conftest.py).
# Exits non-zero when any environment's tests fail or its set-up fails, and also when no test
# ran (pytest exit code 5).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# free disk space in GiB where the environments are built (each extra venv takes 2-4 GiB)
free_gib() { df -Pk . | awk 'NR==2 {printf "%d", $4 / 1048576}'; }
need_disk() {
    local free; free="$(free_gib)"
    echo "[test] $1: ${free} GiB free on $(df -P . | awk 'NR==2 {print $6}')" >&2
    [ "$free" -ge 5 ] || echo "[test] WARNING: under 5 GiB free; an environment set-up may fail with 'No space left on device'" >&2
}
need_disk "before set-up"
bash scripts/setup.sh
rc=0
.venv/bin/python -m pytest -q "$@" || rc=$?
if [ "$rc" -eq 5 ]; then
    echo "[test] no tests were collected: counted as a failure" >&2
fi

if [ -n "${MMPIPE_ENVS:-}" ]; then
    envs="$MMPIPE_ENVS"
elif [ "$#" -eq 0 ]; then
    envs="$(for f in scripts/envs/*.sh; do [ -e "$f" ] && basename "$f" .sh; done | sort | tr '\n' ' ')"
else
    envs=none
fi
summary=""
for name in $envs; do
    [ "$name" = none ] && continue
    echo "[test] environment $name: scripts/envs/$name.sh" >&2
    need_disk "environment $name"
    erc=0
    bash "scripts/envs/$name.sh" || erc=$?
    summary="$summary $name=$erc"
    [ "$erc" -ne 0 ] && rc=1
done
[ -n "$summary" ] && echo "[test] environments (exit codes):$summary" >&2
exit "$rc"
