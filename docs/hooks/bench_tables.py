"""MkDocs hook: the Performance page's tables, generated at build time from the benchmark's
JSON (`bash scripts/bench.sh` writes bench/results/*.json; the copies the site is built from
live in docs/assets/bench/ and are published beside the page).

A page line ``<!-- bench: NAME -->`` becomes the table of docs/assets/bench/NAME.json: a
bench run (``{"results": [...]}``) as one row per case, or the vLLM logprob-gap file
(``{family: {"backends": ...}}``) as one row per family and image backend. A marker naming a
missing or unreadable file fails the build (a hook error stops ``mkdocs build``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

MARKER = re.compile(r"^<!-- bench: ([\w.-]+) -->$", re.M)
DATA = Path(__file__).resolve().parents[1] / "assets" / "bench"


def _cell(value) -> str:
    if value is None:
        return "-"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(out)


def bench_run_table(run: dict) -> str:
    """One row per case of a ``bash scripts/bench.sh`` run (bench/results/latest.json)."""
    env = run.get("environment", {})
    rows = [[r["case"], r.get("baseline_name"), r["mmpipe"], r["baseline"], r["ratio_text"], r["target"],
             r["met"], r["identical"], None if r.get("load") is None else f"{r['load']:.1f}", r.get("floor") or None]
            for r in run["results"]]
    head = (f"Mode `{run.get('mode')}`, image backend `{run.get('image_backend')}`, "
            f"{env.get('usable_cpus', '?')} CPUs, torch {env.get('torch', '?')}, transformers "
            f"{env.get('transformers', '?')}, datasets {env.get('datasets', '?')}; "
            f"{len(rows)} cases, {run.get('seconds', 0):.0f} s.")
    return head + "\n\n" + _table(["case", "baseline", "mmpipe (median [min-max])", "baseline (median [min-max])",
                                   "ratio", "target", "met", "identical", "load", "floor"], rows)


def vllm_gap_table(gaps: dict) -> str:
    """One row per family and image backend of bench/results/vllm_gap.json: the largest
    |vLLM logprob - policy logprob| over every generated token."""
    rows = []
    for family, g in gaps.items():
        for backend, b in g["backends"].items():
            rows.append([f"`{family}`", g.get("vllm"), g.get("transformers"), g.get("engine_backend"), backend,
                         f"{b['engine_gap']:.1e}", f"{b['raw_images_gap']:.1e}", sum(b.get("completions_per_row", [])),
                         f"{b['generate_s']:.1f} s"])
    return _table(["family", "vLLM", "transformers", "vLLM image backend", "rows encoded with", "gap (rows' images)",
                   "gap (raw images to vLLM)", "completions", "generate"], rows)


def render(name: str) -> str:
    path = DATA / f"{name}.json"
    data = json.loads(path.read_text())  # a missing file stops the build: no silent empty table
    table = bench_run_table(data) if "results" in data else vllm_gap_table(data)
    return f"{table}\n\n*Generated from [`{name}.json`](assets/bench/{name}.json).*"


def on_page_markdown(markdown: str, page, config, files) -> str:
    return MARKER.sub(lambda m: render(m.group(1)), markdown)
