"""Figures the guide pages quote from the benchmark are the ones of the JSON the site publishes
(docs/assets/bench/latest.json, the run the Performance page renders): a page that quotes a bench
figure quotes that run's (docs hunt: getting-started said a peak RSS of 1.72-1.76 GiB and
storage.md the sizes and times of an older run, 167 KiB / 14.9x / 536 ms, while the published run
says 1.81 GiB, 150.8 KiB / 15.56x / 648 ms)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = json.loads((ROOT / "docs" / "assets" / "bench" / "latest.json").read_text())["results"]


def _case(start: str) -> dict:
    found = [r for r in RESULTS if r["case"].strip().startswith(start)]
    assert len(found) == 1, (start, [r["case"] for r in found])
    return found[0]


def _page(rel: str) -> str:
    return " ".join((ROOT / "docs" / rel).read_text().split())  # line breaks as spaces


def _ms(case: dict) -> str:
    return f"{case['detail']['timing']['mmpipe']['median_s'] * 1000:.0f} ms"


def _claims() -> list:
    rss = _case("peak RSS, README's map(num_proc=2")
    source = _case("bytes/image on disk, pixels='source'")
    whole = _case("whole saved dataset, pixels='source'")
    uint8 = _case("bytes/image on disk, pixels='uint8'")
    vs_trl = _case("collate 8 rows x 2 images (244 MiB out) vs TRL")
    arrow = _case("same, ArrowRows batch vs TRL")
    from_files = _case("same, pixels='source' rows (decode + resize at collate)")
    trl = re.sub(r" \[[^]]*\]", "", vs_trl["baseline"])  # "1.96 [1.92-2.72] s" -> "1.96 s"
    ray2 = _case("Ray map_batches(RayBatchEncoder)")
    ray1 = _case("same, 1 worker vs map num_proc=2")
    ray21 = _case("same, 2 workers vs 1 worker")
    rows_s = lambda case: case["mmpipe"].replace(" rows/s", "")  # noqa: E731
    return [
        ("how-to/scale-out.md", f"{ray2['detail']['rows']} rows of real-size photos, 0-2 per row, "
                                f"{ray2['detail']['images']} images"),
        ("how-to/scale-out.md", f"Ray with 1 actor {rows_s(ray1)} rows/s, with 2 actors {rows_s(ray2)} rows/s, "
                                f"`datasets.map(num_proc=2)` {ray2['baseline']}"),
        ("how-to/scale-out.md", f"2 actors vs 1 {ray21['ratio_text'].split(' ')[0]}, 1 and 2 actors vs the map "
                                f"{ray1['ratio_text'].split(' ')[0]} and {ray2['ratio_text'].split(' ')[0]}"),
        ("getting-started.md", f"peak RSS {rss['ratio_text']}"),
        ("performance.md", f"peaks at {rss['ratio_text']}"),
        ("concepts/storage.md", f"1.00x the source JPEG/PNG bytes, {source['mmpipe'].split('/')[0].strip()} per image"),
        ("concepts/storage.md", whole["ratio_text"]),
        ("concepts/storage.md", f"collates 8 rows x 2 photos in {_ms(from_files)}"),
        ("concepts/storage.md", f"takes {trl} for the same batch"),
        ("concepts/storage.md", f"stores {uint8['ratio_text'].split(' ')[0]} the files and collates in {_ms(vs_trl)}"
                                f" ({_ms(arrow)} from `ArrowRows`)"),
    ]


@pytest.mark.parametrize("page, text", _claims())
def test_quoted_bench_figures_are_the_published_runs(page, text):
    assert text in _page(page), f"docs/{page} does not quote the published run's figure: {text!r}"
