"""Hunt: the files users bring to ``mmpipe encode`` and the processors they configure.

JSON-lines ``null`` lines (pyarrow crashed the process on a first one and read a later one as a row
of nulls), lines that are not UTF-8, columnar JSON (one object of column lists, read by
``datasets.load_dataset("json")`` as ONE row), ``data:`` image URIs that are not strict base64, and
image processors whose own pixel bounds are 0 or cross: each is a typed error naming where it is,
what was found and the fix; a bad data URI is its row's ImageError, skipped under ``--on-error skip``."""

from __future__ import annotations

import base64
import copy
import io
import json
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from mmpipe.cli.encode import CLIError, load_raw
from mmpipe.cli.main import main
from mmpipe.cli.resolve import ImageResolver
from mmpipe.errors import ArgumentError, ImageError
from mmpipe.images.spec import VisionSpec
from mmpipe.testing import build_processor, tiny_image

PROC = "testing:qwen2_vl"


def _row(i: int, image="a.png") -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"Describe {i}"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": f"Answer {i}"}]}],
            "images": [image]}


def _encode(src, out, *extra) -> list:
    return ["encode", str(src), "--processor", PROC, "--out", str(out), "--quiet", *map(str, extra)]


@pytest.fixture
def folder(tmp_path) -> Path:
    tiny_image(32, 48, seed=1).save(tmp_path / "a.png")
    return tmp_path


def _cannot_read(path: Path) -> str:
    with pytest.raises(CLIError) as info:
        load_raw(path)
    return str(info.value)


# ---- null lines, non-UTF-8 bytes ---------------------------------------------------------------
def test_a_first_null_line_is_named_not_a_crash(folder):
    # before: pyarrow's JSON reader killed the process (SIGSEGV, exit -11) inside load_dataset
    src = folder / "rows.jsonl"
    src.write_text("null\n" + json.dumps(_row(0)) + "\n")
    code = ("import sys; from pathlib import Path; from mmpipe.cli.encode import CLIError, load_raw\n"
            "try:\n    load_raw(Path(sys.argv[1]))\nexcept CLIError as e:\n    print(e)")
    run = subprocess.run([sys.executable, "-c", code, str(src)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stderr[-500:])  # in a process: a crash must not end pytest
    assert "line 1 holds a JSON null, not an object" in run.stdout


def test_a_later_null_line_is_named_not_a_row_of_nulls(folder, capsys):
    # before: read as a row of nulls -> "ParseError: row 1: found columns ['images', 'messages'];
    # expected a 'messages' column ... rename your column", exit 1 (and skipped, counted, under skip)
    src = folder / "rows.jsonl"
    src.write_text(json.dumps(_row(0)) + "\n \tnull \r\n" + json.dumps(_row(1)) + "\n")
    assert main(_encode(src, folder / "o")) == 2
    err = capsys.readouterr().err
    assert "line 2 holds a JSON null, not an object" in err and "remove the line" in err
    assert main(_encode(src, folder / "o", "--on-error", "skip")) == 2  # the file, not a row, is to fix


@pytest.mark.parametrize("text, item", [("[null, ROW]", 0), ("[ROW, null]", 1)])
def test_a_null_item_of_a_json_list_is_named(folder, text, item):
    # before: "[null, row]" crashed the process (SIGSEGV); "[row, null]" was a row of nulls
    src = folder / "rows.json"
    src.write_text(text.replace("ROW", json.dumps(_row(0))))
    assert f"item {item} of its JSON list is a null, not a row object" in _cannot_read(src)


def test_a_line_that_is_not_utf8_is_named(folder):
    # before: read without a word, then "UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9"
    # when the row was decoded: exit 1, no line named
    src = folder / "rows.jsonl"
    lines = [json.dumps(_row(i)).encode() for i in range(3)]
    lines[2] = lines[2].replace(b"Describe", b"D\xe9crire")
    src.write_bytes(b"\n".join(lines) + b"\n")
    msg = _cannot_read(src)
    assert "line 3 is not UTF-8 (byte 0xe9" in msg and "save the file as UTF-8" in msg


def test_a_utf16_file_is_named_as_such(folder):
    src = folder / "rows.jsonl"
    src.write_text(json.dumps(_row(0)) + "\n", encoding="utf-16")
    assert "UTF-16" in _cannot_read(src)


def test_one_pretty_printed_row_object_is_still_one_row(folder):
    src = folder / "row.json"
    src.write_text(json.dumps(_row(0), indent=2))
    assert len(load_raw(src)) == 1


# ---- columnar JSON -------------------------------------------------------------------------------
def _columns(n: int = 3) -> dict:
    rows = [_row(i) for i in range(n)]
    return {"messages": [r["messages"] for r in rows], "images": [r["images"] for r in rows]}


@pytest.mark.parametrize("indent", [None, 2])
def test_columnar_json_is_refused_as_datasets_reads_it_as_one_row(folder, capsys, indent):
    # before: "ImageError: row 0, image 0: unsupported image value of type list", exit 1; under
    # --on-error skip "encoded 0 of 1 rows", exit 0 (the file holds 3 rows)
    src = folder / "cols.json"
    src.write_text(json.dumps(_columns(), indent=indent))
    assert len(datasets.load_dataset("json", data_files=str(src), split="train")) == 1  # what datasets does
    for extra in ((), ("--on-error", "skip")):
        assert main(_encode(src, folder / "o", *extra)) == 2
        err = capsys.readouterr().err
        assert "columnar layout" in err and "messages: 3 values, images: 3 values" in err
        assert "one row object per line" in err and not (folder / "o").exists()


def test_columnar_json_of_unequal_columns_says_they_do_not_line_up(folder):
    cols = _columns()
    cols["images"] = cols["images"][:2]
    src = folder / "cols.json"
    src.write_text(json.dumps(cols))
    assert "columns differ in length (messages: 3 values, images: 2 values)" in _cannot_read(src)


@pytest.mark.parametrize("obj, hint", [
    ({"prompt": {"0": "a?", "1": "b?", "2": "c?"}}, "orient='records', lines=True"),  # pandas orient="columns"
    ({"prompt": ["a?", "b?", "c?"]}, "Dataset.from_dict"),
])
def test_columnar_prompt_columns_are_refused(folder, obj, hint):
    src = folder / "cols.json"
    src.write_text(json.dumps(obj))
    msg = _cannot_read(src)
    assert "columnar layout" in msg and "prompt: 3 values" in msg and hint in msg


# ---- data: image URIs ----------------------------------------------------------------------------
def _b64_png() -> str:
    buf = io.BytesIO()
    tiny_image(32, 48, seed=2).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def _resolve(uri: str, strict: bool = True) -> dict:
    resolver = ImageResolver(Path("."), strict=strict)
    return resolver({"messages": _row(0)["messages"], "images": [uri]}, 7)


@pytest.mark.parametrize("uri, found", [
    ("data:image/png;base64,!!!{b64}", "first odd character '!'"),  # before: the '!' silently dropped
    ("data:image/png;base64,{b64}-_", "first odd character '-'"),  # URL-safe alphabet
    ("data:image/png;base64,{short}", "characters"),  # before: binascii.Error, no row, exit 1 even under skip
    ("data:image/png;base64,", "an empty payload"),
    ("data:image/png,{b64}", "'data:image/png'"),
])
def test_bad_data_uris_are_the_rows_image_error(uri, found):
    b64 = _b64_png()
    uri = uri.format(b64=b64, short=b64.rstrip("=")[:-1])
    with pytest.raises(ImageError) as info:
        _resolve(uri)
    e = info.value
    assert (e.row, e.column) == (7, "images") and found in str(e) and e.fix
    out = _resolve(uri, strict=False)  # --on-error skip: the row is passed on to fail, with this reason
    assert json.loads(out["mmpipe_resolve_errors"])[0]["reason"] == str(e)


@pytest.mark.parametrize("wrap", [False, True])
def test_valid_data_uris_decode_as_transformers_load_image_does(wrap):
    from transformers.image_utils import load_image

    b64 = _b64_png()
    data = base64.encodebytes(base64.b64decode(b64)).decode() if wrap else b64  # MIME line-wrapped
    uri = f"data:image/png;base64,{data}"
    got = _resolve(uri)["images"][0]["bytes"]
    assert got == base64.b64decode(b64)
    assert load_image(uri).size == (48, 32)  # transformers reads the same URI


def test_a_bad_data_uri_row_is_skipped_and_counted(folder, capsys):
    src = folder / "rows.jsonl"
    bad = "data:image/png;base64," + _b64_png().rstrip("=")[:-1]
    src.write_text("".join(json.dumps(r) + "\n" for r in (_row(0), _row(1, bad), _row(2))))
    assert main(_encode(src, folder / "o", "--on-error", "skip")) == 0  # before: exit 1, binascii.Error, no row
    record = json.loads((folder / "o" / "mmpipe_encode.json").read_text())
    assert record["rows_out"] == 2 and [e["row"] for e in record["errors"]] == [1]
    assert "invalid base64" in record["errors"][0]["reason"]
    assert main(_encode(src, folder / "o2")) == 1
    assert "row 1, image 0: data URI" in capsys.readouterr().err


# ---- the processor's own pixel bounds --------------------------------------------------------------
def _with_size(shortest: int, longest: int):
    proc = copy.deepcopy(build_processor("qwen2_vl"))
    proc.image_processor.size = {"shortest_edge": shortest, "longest_edge": longest}
    return proc


@pytest.mark.parametrize("shortest, longest, key", [(0, 10**6, "shortest_edge=0"), (3136, 0, "longest_edge=0")])
def test_a_zero_bound_in_the_processor_is_refused_as_the_processor_does(shortest, longest, key):
    # before: read as unset, the family's default used (3136 / 1003520) while the processor itself
    # raises "`size` dict must contain 'shortest_edge' and 'longest_edge' keys"
    proc = _with_size(shortest, longest)
    with pytest.raises(ValueError, match="must contain"):
        proc.image_processor(images=[tiny_image(20, 30)], return_tensors="np")
    with pytest.raises(ArgumentError, match=rf"{type(proc.image_processor).__name__} has size {key}") as info:
        VisionSpec.from_processor(proc)
    assert "preprocessor_config.json" in str(info.value)
    assert VisionSpec.from_processor(proc, min_pixels=3136, max_pixels=10**6).min_pixels == 3136  # given wins


def test_crossing_bounds_in_the_processor_name_both_and_where_they_came_from():
    with pytest.raises(ArgumentError) as info:
        VisionSpec.from_processor(_with_size(10**6, 1000))
    msg = str(info.value)
    assert "min_pixels 1000000 is more than max_pixels 1000" in msg and "shortest_edge=1000000" in msg
    assert "longest_edge=1000" in msg and "--min-pixels" in msg


def test_min_pixels_zero_keeps_one_patch_window_for_tiny_images():
    # before: smart_resize(10, 10, 28, 0, ...) == (0, 0) and Encoder(min_pixels=0) failed a 10x10 image
    # with "cannot read the image (ValueError: height and width must be > 0) ... the bytes are corrupt"
    import numpy as np

    from mmpipe import Encoder
    from mmpipe.images.spec import smart_resize

    assert smart_resize(10, 10, 28, 0, 10**6) == (28, 28) and smart_resize(10, 40, 28, 0, 10**6) == (28, 28)
    enc = Encoder(build_processor("qwen2_vl"), min_pixels=1)  # 0 is refused now, as transformers 5 refuses it
    row = enc.encode_one({"prompt": "<image> hi", "images": [np.full((10, 10, 3), 90, np.uint8)]})
    assert row["image_grid_thw"].tolist() == [[1, 2, 2]]


# ---- inline audio / video files resolve against the input file, as images do ------------------------------
def test_inline_audio_paths_resolve_against_the_input_file_not_the_cwd(tmp_path, monkeypatch):
    """Old code: an inline audio item's relative path (``{"type": "audio", "audio": "media/a.wav"}``) was
    looked up in the working directory: run from elsewhere the row failed ("does not exist"), and a file
    of that name there was encoded instead, silently. Now it is the input file's folder's, as images."""
    import numpy as np
    import soundfile

    t = np.arange(16000) / 16000
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    for folder, hz in ((data, 440), (elsewhere, 1250)):  # a decoy of the same name in the cwd
        (folder / "media").mkdir(parents=True)
        soundfile.write(folder / "media" / "a.wav", (0.2 * np.sin(2 * np.pi * hz * t)).astype(np.float32), 16000)
    turn = [{"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    rows = [{"messages": [{"role": "user", "content": [{"type": "audio", key: "media/a.wav"},
                                                       {"type": "text", "text": "?"}]}] + turn}
            for key in ("audio", "path")]
    (data / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    outs = {}
    for cwd in (data, elsewhere):
        monkeypatch.chdir(cwd)
        out = tmp_path / f"enc-{cwd.name}"
        assert main(["encode", str(data / "rows.jsonl"), "--processor", "testing:qwen2_5_omni", "--out", str(out),
                     "--quiet"]) == 0
        outs[cwd.name] = datasets.load_from_disk(str(out))
    a, b = outs["data"], outs["elsewhere"]
    assert len(a) == len(b) == 2
    for col in a.column_names:
        assert a[col] == b[col], col
