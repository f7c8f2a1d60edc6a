"""The README's async-engine block runs as written: four concurrent callers each get their own
group of n=2 completions, and the sync call returns one Generation per row."""

from __future__ import annotations

from mmpipe.records import Generation

from helpers import readme_block


def test_readme_async_block_runs_as_written():
    namespace: dict = {}
    exec(compile(readme_block("### Async engines and OpenAI-compatible servers"), "README.md", "exec"), namespace)
    groups, gens, rows = namespace["groups"], namespace["gens"], namespace["rows"]
    assert len(groups) == 4 and all(len(g) == 1 and g[0].n == 2 for g in groups)
    assert len(gens) == len(rows) and all(isinstance(g, Generation) and g.n == 2 for g in gens)
    assert all(0 < len(c.token_ids) <= 32 and len(c.logprobs) == len(c.token_ids) for g in gens for c in g.completions)
    assert namespace["server"].base_url == "http://127.0.0.1:8000/v1"
