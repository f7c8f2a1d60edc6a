"""Hunt: ``mmpipe encode / inspect / validate`` driven as a user at a terminal would.

Inputs that are not rows (a JSONL line that is not JSON or not an object, empty files), outputs
that cannot be written or are interrupted (``--out`` is left as it was: an old dataset under
``--overwrite`` survives a failed save or Ctrl-C), numeric flags out of range, conflicting flags,
and ``inspect`` / ``validate`` on what is not an encoded dataset: each is one line on stderr with
exit status 2 (130 for Ctrl-C), never a traceback."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from mmpipe.cli.main import main
from mmpipe.testing import tiny_image

PROC = "testing:qwen2_vl"


def _row(i: int) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Describe {i}"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}"}]}],
            "images": ["a.png"]}


@pytest.fixture
def rows(tmp_path) -> Path:
    """Four good rows in ``rows.jsonl``, their image next to it."""
    tiny_image(32, 48, seed=1).save(tmp_path / "a.png")
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(_row(i)) + "\n" for i in range(4)))
    return path


def _encode(src, out, *extra) -> list:
    return ["encode", str(src), "--processor", PROC, "--out", str(out), "--quiet", *map(str, extra)]


def _err(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


# ---- inputs ----------------------------------------------------------------------------------
def test_a_jsonl_line_that_is_not_json_names_its_line(rows, capsys):
    # before: "JSON parse error: Invalid value. in row 3" (0-based, and relative to a 10 MB block:
    # a bad line 80,001 of a 20 MB file said only "Expected object or value at position 12")
    lines = rows.read_text().splitlines()
    lines[3] = '{"messages": [ broken'
    rows.write_text("\n".join(lines) + "\n")
    assert main(_encode(rows, rows.parent / "o")) == 2
    err = _err(capsys)
    assert "line 4 is not valid JSON" in err and "broken" in err and "row 3" not in err


@pytest.mark.parametrize("value, kind", [("[1, 2, 3]", "array"), ('"hello"', "string")])
def test_a_jsonl_line_that_is_not_an_object_names_its_line(rows, capsys, value, kind):
    # before: "Column() changed from object to string in row 0"
    lines = rows.read_text().splitlines()
    lines[2] = value
    rows.write_text("\n".join(lines) + "\n")
    assert main(_encode(rows, rows.parent / "o")) == 2
    assert f"line 3 holds a JSON {kind}, not an object" in _err(capsys)


def test_a_json_list_item_that_is_not_an_object_is_named(rows, capsys):
    src = rows.parent / "rows.json"
    src.write_text(json.dumps([_row(0), 5]))
    assert main(_encode(src, rows.parent / "o")) == 2
    assert "item 1 of its JSON list is a number" in _err(capsys)


@pytest.mark.parametrize("name, text", [("empty.jsonl", ""), ("blank.jsonl", "\n\n\n"), ("empty.json", "[]")])
def test_inputs_without_rows_say_so(tmp_path, capsys, name, text):
    # before: "StopIteration: ; every row must have the same column types ..." and
    # 'Instruction "train" corresponds to no data!'
    (tmp_path / name).write_text(text)
    assert main(_encode(tmp_path / name, tmp_path / "o")) == 2
    assert "holds no rows" in _err(capsys) and not (tmp_path / "o").exists()


def test_bom_crlf_and_trailing_blank_lines_read_as_the_plain_file(rows, capsys):
    text = rows.read_text()
    odd = rows.parent / "odd.jsonl"
    odd.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode() + b"\r\n\r\n")
    assert main(_encode(rows, rows.parent / "plain")) == 0
    assert main(_encode(odd, rows.parent / "odd")) == 0
    plain, other = (datasets.load_from_disk(str(rows.parent / n)) for n in ("plain", "odd"))
    assert len(plain) == 4 and plain.to_dict() == other.to_dict()


def test_a_damaged_saved_dataset_input_is_one_line(rows, tmp_path, capsys):
    # before: IndexError / ArrowInvalid traceback from datasets.load_from_disk
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([_row(0)]).save_to_disk(str(saved))
    arrow = next(saved.glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:40])
    assert main(_encode(saved, tmp_path / "o")) == 2
    assert "cannot read the saved dataset" in _err(capsys)


def test_encoding_an_encoded_dataset_says_it_is_encoded(rows, capsys):
    # before: ParseError for row 0 "... (pass --on-error skip ...)": skip would drop every row
    enc = rows.parent / "enc"
    assert main(_encode(rows, enc)) == 0
    capsys.readouterr()
    assert main(_encode(enc, rows.parent / "again")) == 2
    assert "is already encoded" in _err(capsys)


def test_split_on_a_file_input_is_refused(rows, capsys):
    # before: --split test on a .jsonl silently encoded every row
    assert main(_encode(rows, rows.parent / "o", "--split", "test")) == 2
    assert "--split 'test'" in _err(capsys) and not (rows.parent / "o").exists()


# ---- outputs ---------------------------------------------------------------------------------
def test_out_that_is_a_file_or_under_a_file_is_one_line_as_a_process(rows):
    # before: NotADirectoryError traceback (after encoding every row, for the second)
    for out in (rows, rows / "enc"):
        run = subprocess.run([sys.executable, "-m", "mmpipe", *_encode(rows, out)], capture_output=True, text=True,
                             timeout=300)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert run.stderr.startswith("mmpipe encode: --out ") and len(run.stderr.strip().splitlines()) == 1
    assert rows.is_file() and len(rows.read_text().splitlines()) == 4


def test_overwrite_that_would_delete_the_input_is_refused(rows, capsys):
    # before: --out a saved dataset that holds the input file -> the input was deleted with it
    assert main(_encode(rows, rows.parent / "enc")) == 0
    inner = rows.parent / "enc" / "rows.jsonl"
    inner.write_text(rows.read_text())
    (rows.parent / "enc" / "a.png").write_bytes((rows.parent / "a.png").read_bytes())
    capsys.readouterr()
    assert main(_encode(inner, rows.parent / "enc", "--overwrite")) == 2
    assert "--overwrite would delete it" in _err(capsys) and inner.is_file()


def _old_dataset(rows, capsys) -> Path:
    out = rows.parent / "enc"
    assert main(_encode(rows, out, "--limit", 2)) == 0
    capsys.readouterr()
    return out


def _failing_save(exc):
    def save(self, path, **kwargs):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "data-00000-of-00001.arrow").write_bytes(b"half")  # a half-written shard
        raise exc
    return save


def test_a_failed_save_leaves_the_old_dataset(rows, capsys, monkeypatch):
    # before: --overwrite deleted the old dataset first; a full disk then left half a shard and a traceback
    out = _old_dataset(rows, capsys)
    before = sorted(p.name for p in out.iterdir())
    monkeypatch.setattr(datasets.Dataset, "save_to_disk", _failing_save(OSError(errno.ENOSPC, "No space left")))
    assert main(_encode(rows, out, "--overwrite")) == 2
    assert "No space left" in _err(capsys)
    assert sorted(p.name for p in out.iterdir()) == before and len(datasets.load_from_disk(str(out))) == 2
    assert not [p for p in rows.parent.iterdir() if ".partial-" in p.name]


def test_ctrl_c_exits_130_and_leaves_out_as_it_was(rows, capsys, monkeypatch):
    # before: a KeyboardInterrupt traceback, and under --overwrite the old dataset was gone
    out = _old_dataset(rows, capsys)
    monkeypatch.setattr(datasets.Dataset, "save_to_disk", _failing_save(KeyboardInterrupt()))
    assert main(_encode(rows, out, "--overwrite")) == 130
    assert "interrupted" in _err(capsys)
    assert len(datasets.load_from_disk(str(out))) == 2
    assert not [p for p in rows.parent.iterdir() if ".partial-" in p.name]


def test_ctrl_c_under_num_proc_is_the_same(rows, capsys, monkeypatch):
    # datasets.map(num_proc=2) answers Ctrl-C with a multiprocess TimeoutError raised from its cleanup
    class PoolTimeout(Exception):
        pass

    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise PoolTimeout()

    monkeypatch.setattr("mmpipe.encode_dataset", interrupted)
    assert main(_encode(rows, rows.parent / "o", "--num-proc", 2)) == 130
    assert "interrupted" in _err(capsys) and not (rows.parent / "o").exists()


def test_the_saved_dataset_has_the_umasks_mode_and_a_complete_report(rows, capsys):
    out = rows.parent / "new" / "enc"
    assert main(_encode(rows, out)) == 0
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    record = json.loads((out / "mmpipe_encode.json").read_text())
    assert record["rows_out"] == len(datasets.load_from_disk(str(out))) == 4


# ---- flags -----------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, message", [
    (["--num-proc", "0"], "--num-proc must be >= 1, got 0"),  # before: ran in-process, rc 0
    (["--batch-size", "0"], "--batch-size must be >= 1"),  # before: the whole dataset as one map batch
    (["--limit", "0"], "--limit must be >= 1"),  # before: ValueError: Column 'mmpipe_drop_reason' doesn't exist
    (["--max-pixels", "0"], "--max-pixels must be >= 1"),  # before: 0 silently meant the processor's
    (["--min-pixels", "5000", "--max-pixels", "1000"], "--min-pixels 5000 is more than --max-pixels 1000"),
    (["--max-length", "-1"], "--max-length must be >= 1"),  # before: named max_length, not the flag
])
def test_numeric_flags_out_of_range_name_the_flag(rows, capsys, flags, message):
    assert main(_encode(rows, rows.parent / "o", *flags)) == 2
    err = _err(capsys)
    assert message in err and len(err.strip().splitlines()) == 1 and not (rows.parent / "o").exists()


def test_inspect_bins_out_of_range(rows, capsys):
    # before: --bins 0 ZeroDivisionError traceback, --bins -1 printed histograms anyway
    assert main(_encode(rows, rows.parent / "enc")) == 0
    for bins in ("0", "-1"):
        assert main(["inspect", str(rows.parent / "enc"), "--bins", bins]) == 2
        assert "--bins must be >= 1" in _err(capsys)
    from mmpipe.cli.inspect import dataset_stats
    from mmpipe.errors import ArgumentError

    for bins in (0, -1, 2.5):  # the library call too (it divided by zero)
        with pytest.raises(ArgumentError, match="bins must be an int >= 1"):
            dataset_stats(rows.parent / "enc", bins=bins, progress=False)


# ---- inspect / validate ----------------------------------------------------------------------
def test_inspect_with_a_run_record_that_is_not_one(rows, capsys):
    # before: AttributeError: 'list' object has no attribute 'get'
    out = rows.parent / "enc"
    assert main(_encode(rows, out)) == 0
    (out / "mmpipe_encode.json").write_text("[1, 2]")
    capsys.readouterr()
    assert main(["inspect", str(out), "--quiet"]) == 0
    assert "is not the run record" in capsys.readouterr().out


def test_validate_a_raw_dataset_says_encode_first(tmp_path, capsys):
    # before: exit 1 and eleven "missing column" lines
    datasets.Dataset.from_list([_row(0)]).save_to_disk(str(tmp_path / "raw"))
    assert main(["validate", str(tmp_path / "raw")]) == 2
    err = _err(capsys)
    assert "holds raw rows" in err and "mmpipe encode" in err


def test_validate_json_and_a_damaged_state_file(rows, capsys):
    out = rows.parent / "enc"
    assert main(_encode(rows, out)) == 0
    capsys.readouterr()
    assert main(["validate", str(out), "--json"]) == 0  # before: unrecognized arguments: --json
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["num_rows"] == 4 and report["issues"] == []
    (out / "state.json").write_text("{")  # before: "JSONDecodeError: Expecting ..." naming no file, exit 1
    assert main(["validate", str(out)]) == 2
    assert "state.json" in _err(capsys)
