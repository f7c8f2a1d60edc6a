"""The demo (`python -m mmpipe.cli.demo`) runs end to end, offline, and its checks can fail."""

from __future__ import annotations

import re

import pytest

import mmpipe
from mmpipe.cli import demo


def test_demo_runs_and_checks_pass(capsys):
    # forked map workers and DataLoader workers, as in the README; 6 rows = 2 batches
    # with 0-3 images per row, rows with and without an assistant answer
    rc = demo.main(["--rows", "6", "--num-proc", "2", "--workers", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    last = out.strip().splitlines()[-1]
    assert re.match(r"rows 6, batches 2, [0-9.]+ s; ", last), last
    assert last.endswith(demo.SUMMARY_OK), last
    assert "pixel_values == processor's: OK" in last and "batch logits == each row alone: OK" in last
    table = [line.split() for line in out.splitlines() if re.match(r"\s*\d+\s+\d+\s+\d+\s", line)]
    assert [int(r[0]) for r in table] == list(range(6))
    assert {int(r[2]) for r in table} == {0, 1, 2, 3}  # images per row, zero included
    assert any("loss" in line for line in out.splitlines())
    assert "8x smaller" in out  # uint8 storage vs float32 pixel_values


def test_demo_exit_code_on_a_failed_check(monkeypatch, capsys):
    real = mmpipe.unbatch

    def broken(batch):
        rows = real(batch)
        rows[-1].input_ids = rows[-1].input_ids[:-1].copy()
        return rows

    monkeypatch.setattr(mmpipe, "unbatch", broken)
    rc = demo.main(["--rows", "2", "--num-proc", "1", "--workers", "0"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "CHECK FAILED: row 1: unbatch differs" in out
    assert out.strip().splitlines()[-1].endswith("unbatch(collate(rows)) == rows: FAILED")


def test_demo_arguments():
    a = demo._parse(["--model", "/models/qwen"])
    assert a.model == a.processor == "/models/qwen"
    a = demo._parse(["--processor", "/p", "--model", "/m", "--family", "qwen3_vl", "--out", "/tmp/x"])
    assert (a.processor, a.model, a.family, a.out) == ("/p", "/m", "qwen3_vl", "/tmp/x")
    a = demo._parse([])
    assert (a.family, a.rows, a.num_proc, a.workers, a.batch_size, a.processor, a.model) == (
        "qwen2_vl", 12, 2, 2, 4, None, None)
    for bad in (["--rows", "0"], ["--family", "llava"]):
        with pytest.raises(SystemExit) as e:
            demo._parse(bad)
        assert e.value.code == 2


def test_build_rows_formats():
    ds, names = demo.build_rows(9, demo.image_pool())
    assert ds.column_names == ["messages", "images"]
    counts = [len(r["images"]) for r in ds]
    assert 0 in counts and max(counts) == 3
    for row, n in zip(ds, counts):
        placeholders = sum(item["type"] == "image" for m in row["messages"] for item in m["content"])
        assert placeholders == n
    assert any(r["messages"][-1]["role"] == "assistant" for r in ds)
    assert any(r["messages"][-1]["role"] == "user" for r in ds)
    assert len({n for ns in names for n in ns}) >= 8  # photos and generated images


def _stock_qwen25_directory(path):
    """A processor directory as a Qwen2.5-VL checkpoint holds it: the stock processor class
    and a video processor config (whose class needs torchvision)."""
    import json

    from mmpipe import testing

    testing.build_processor("qwen2_5_vl").save_pretrained(str(path))
    for f in path.glob("*.json"):
        d = json.loads(f.read_text())
        if isinstance(d, dict) and "processor_class" in d:
            d["processor_class"] = "Qwen2_5_VLProcessor"
            f.write_text(json.dumps(d))
    pre = path / "preprocessor_config.json"
    video = json.loads(pre.read_text()) if pre.exists() else {}
    video.pop("image_processor_type", None)
    (path / "video_preprocessor_config.json").write_text(json.dumps(dict(video, video_processor_type="Qwen2VLVideoProcessor")))
    return path


def test_demo_on_a_stock_qwen25_directory_without_torchvision(tmp_path, capsys):
    """Issue 17.6: on a Qwen2.5-VL-style directory AutoProcessor needs torchvision (its video
    processor), which this environment does not have: the demo (and the Quickstart) load it
    through mmpipe.processors.load_processor, images-only, and run every check."""
    import importlib.util

    import transformers

    from mmpipe.processors import load_processor

    path = _stock_qwen25_directory(tmp_path)
    assert importlib.util.find_spec("torchvision") is None  # the main environment's promise
    with pytest.raises(ImportError, match="[Tt]orchvision"):
        transformers.AutoProcessor.from_pretrained(str(path), local_files_only=True)
    assert load_processor(str(path)).image_processor is not None
    rc = demo.main(["--processor", str(path), "--family", "qwen2_5_vl", "--rows", "4"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert out.strip().splitlines()[-1].endswith(demo.SUMMARY_OK)
