"""Hunt: ``mmpipe encode`` on inputs users bring (an images value that is one path, not a list)."""

from __future__ import annotations

import json

from mmpipe.cli.main import main
from mmpipe.testing import tiny_image


def _rows(tmp_path):
    tiny_image(32, 48, seed=1).save(tmp_path / "a.png")
    row = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Describe"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "A gradient."}]}],
           "images": "a.png"}  # one path, not ["a.png"]
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row) + "\n")
    return path


def test_images_value_that_is_one_path_names_the_column_and_fix(tmp_path, capsys):
    # before: list("a.png") made each character an image -> "image file 'a' not found"
    src = _rows(tmp_path)
    assert main(["encode", str(src), "--processor", "testing:qwen2_vl", "--out", str(tmp_path / "o"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "row 0" in err and "column 'images' holds one value, not a list" in err and "wrap it in a list" in err
    assert "'a' not found" not in err and not (tmp_path / "o").exists()


def test_images_value_that_is_one_path_under_on_error_skip_is_reported(tmp_path, capsys):
    src = _rows(tmp_path)
    out = tmp_path / "o"
    assert main(["encode", str(src), "--processor", "testing:qwen2_vl", "--out", str(out), "--on-error", "skip",
                 "--quiet"]) == 0
    report = json.loads((out / "mmpipe_encode.json").read_text())
    assert report["rows_out"] == 0 and len(report["errors"]) == 1
    assert "not a list of images" in report["errors"][0]["reason"]


def test_judge_ping_on_a_damaged_image_prints_a_message_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "frame.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    # the server is never asked: the frame fails before any request
    code = main(["judge", "ping", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--image", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("mmpipe judge ping: ImageError: ") and "cannot read the image" in err
