"""The benchmark suite (bench/) in --quick mode: every case runs and finds mmpipe's outputs
identical to the baseline's. Timings are not checked here (they belong to `python -m bench`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_quick_runs_every_case_with_identical_outputs(tmp_path):
    out = tmp_path / "quick.json"
    proc = subprocess.run([sys.executable, "-m", "bench", "--quick", "--json", str(out)], cwd=ROOT,
                          capture_output=True, text=True,
                          timeout=1200)  # a hang guard: 90 s at load average 5 here (300 s was 3.3x that)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "quick"
    results = report["results"]
    cases = {r["detail"]["case_id"] for r in results}
    assert cases == {"rope", "layout", "encode", "bytes", "collate", "video", "job", "map_scaling", "rss", "rss_real",
                     "packing", "families", "audio"}
    # every native family (bench/families_case.py FAMILIES): encode, layout-only x2, bytes lines
    families = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v", "gemma3", "internvl", "llava_onevision")
    fam_lines = [r["case"].split(":")[0].strip() for r in results if r["detail"]["case_id"] == "families"]
    assert {f: fam_lines.count(f) for f in families} == {f: 4 for f in families}, fam_lines
    for r in results:
        assert r["identical"] is True, f"{r['case']}: outputs differ from the baseline ({r['detail']})"
        assert r["mmpipe"] != "error", r["detail"]
        assert r["baseline_name"], r["case"]  # every line names what it is compared with
        for t in r["detail"].get("timing", {}).values():  # medians with spread and the load, per sample
            if isinstance(t, dict) and "times_s" in t:
                assert t["min_s"] <= t["median_s"] <= t["max_s"]
                assert len(t["other_cores_busy"]) == len(t["times_s"])
    assert "| identical?" in proc.stdout and "baseline (median [min-max])" in proc.stdout  # the table was printed
