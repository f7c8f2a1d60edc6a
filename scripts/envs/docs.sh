#!/usr/bin/env bash
# The docs environment: .venv-docs with MkDocs, Material, mkdocstrings and Playwright, then
#   1. `mkdocs build --strict` (a broken link, reference or docstring fails the build);
#   2. tests/test_readme.py's tests marked needs_env("docs"): every built page loads in headless Chromium (Debian's
#      `chromium`, driven by Playwright) without a console error or a failed request.
#
#   bash scripts/envs/docs.sh                  # set up (idempotent), build, check the pages
#   bash scripts/envs/docs.sh -k index         # extra arguments go to pytest
#
# mkdocstrings reads mmpipe's source statically (griffe); the venv still holds mmpipe and torch
# because tests/conftest.py imports mmpipe.testing. The Performance tables are generated from bench/results/*.json at build time
# (docs/hooks/bench_tables.py). Chromium is installed with apt-get when missing (as root, as in
# CI); without it the check FAILS: it is never skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

NAME=docs
source scripts/envs/_common.bash

if ! env_ready "${BASH_SOURCE[0]}"; then
    # mmpipe (editable, core dependencies, torch==2.13.0 first via env_create): tests/conftest.py
    # imports mmpipe.testing; the docs extra brings MkDocs, Material, mkdocstrings and Playwright
    pip_install -c <(printf 'torch==2.13.0\n') -e ".[docs]" "pytest>=8" || fail "pip install -e .[docs] pytest"
    "$PY" -c 'import mkdocs, material, mkdocstrings, mkdocstrings_handlers.python, playwright, mmpipe' \
        || fail "import mkdocs, material, mkdocstrings, playwright, mmpipe"
    env_done "${BASH_SOURCE[0]}"
fi
if ! command -v chromium >/dev/null && [ ! -x /usr/bin/chromium ]; then
    say "chromium missing: apt-get install chromium"
    command -v apt-get >/dev/null || fail "no chromium and no apt-get to install it"
    (DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
        || fail "apt-get install chromium"
fi
say "set-up took $(env_took) s: $("$PY" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("mkdocs", "mkdocs-material", "mkdocstrings-python", "playwright")))')"

say "mkdocs build --strict"
SITE="$VENV/site"  # inside the ignored venv folder
rm -rf "$SITE"
"$VENV/bin/mkdocs" build --strict --quiet --site-dir "$SITE" || { say "mkdocs build --strict FAILED"; exit 1; }
say "built $(find "$SITE" -name '*.html' | wc -l) pages into $SITE"
MMPIPE_DOCS_SITE="$PWD/$SITE" MMPIPE_TEST_ENV=$NAME exec "$PY" -m pytest -q -p no:cacheprovider tests/test_readme.py "$@"
