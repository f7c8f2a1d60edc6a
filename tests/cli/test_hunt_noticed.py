"""Items noticed in earlier hunts: a ``.json`` file whose one object holds the rows in a field
(``{"data": [row, ...]}``, SQuAD style; ``{"train": [...]}``) is named with the field and how to take
the rows out, and ``mmpipe encode --audio source`` stores what ``mmpipe.Encoder(audio="source")`` does."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from mmpipe.cli.encode import CLIError, encode_options, load_raw
from mmpipe.cli.main import main
from mmpipe.testing import tiny_image


def _row(i: int) -> dict:
    """A chat row with one image item (``a.png``, next to the input) and a reply."""
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    return {"messages": [{"role": "user", "content": [{"type": "image"}, text(f"Describe {i}")]},
                         {"role": "assistant", "content": [text(f"Answer {i}")]}], "images": ["a.png"]}


@pytest.fixture
def folder(tmp_path) -> Path:
    tiny_image(32, 48, seed=1).save(tmp_path / "a.png")
    return tmp_path


# ---- {"data": [row, ...]}: the rows in one field ---------------------------------------------------
@pytest.mark.parametrize("field,extra", [("data", {"version": "1.1"}), ("train", {})])
def test_rows_wrapped_in_a_field_name_the_field_and_the_fix(folder, capsys, field, extra):
    """Old code: datasets reads the file as ONE row with a ``data`` column, and the encoder failed it:
    "ParseError: row 0: found columns ['data', 'images']; expected a 'messages' column ... rename your
    column", exit 1 (nothing to rename). Now: exit 2 before any row is encoded, naming the field, how
    many rows it holds and the command that writes them one per line."""
    src = folder / "wrapped.json"
    src.write_text(json.dumps({**extra, field: [_row(i) for i in range(3)]}))
    assert len(datasets.load_dataset("json", data_files=str(src), split="train")) == 1  # what datasets does
    for on_error in ("raise", "skip"):
        status = main(["encode", str(src), "--processor", "testing:qwen2_vl", "--out", str(folder / "o"),
                       "--quiet", "--on-error", on_error])
        err = capsys.readouterr().err
        assert status == 2, err
        assert f"field {field!r} (3 objects) holds the rows" in err and "ParseError" not in err
        assert f"jq -c '.{field}[]' {src} > {folder / f'wrapped.{field}.jsonl'}" in err
        assert not (folder / "o").exists()
    # the fix, done: the rows one per line next to the input encode
    (folder / f"wrapped.{field}.jsonl").write_text("".join(json.dumps(_row(i)) + "\n" for i in range(3)))
    assert main(["encode", str(folder / f"wrapped.{field}.jsonl"), "--processor", "testing:qwen2_vl",
                 "--out", str(folder / "o"), "--quiet"]) == 0


def test_several_row_fields_are_all_named(folder):
    src = folder / "splits.json"
    src.write_text(json.dumps({"train": [_row(0), _row(1)], "test": [_row(2)]}))
    with pytest.raises(CLIError) as info:
        load_raw(src)
    msg = str(info.value)
    assert "fields 'train' (2 objects), 'test' (1 objects) hold the rows" in msg and "one field at a time" in msg


def test_one_row_whose_column_holds_objects_is_still_a_row(folder):
    """Not refused: a real row (it has a chat column) whose other columns hold lists of objects, and a
    row holding only image dicts ({"bytes", "path"}): the encoder's own row error is the right one."""
    row = {**_row(0), "tools": [{"name": "f", "description": "d"}]}
    (folder / "row.json").write_text(json.dumps(row, indent=2))
    assert len(load_raw(folder / "row.json")) == 1
    (folder / "img.json").write_text(json.dumps({"pics": [{"bytes": None, "path": "a.png"}]}))
    assert len(load_raw(folder / "img.json")) == 1


# ---- --audio source ----------------------------------------------------------------------------------
def _parse(*argv):
    from mmpipe.cli.main import _parser

    return _parser().parse_args(["encode", "rows.jsonl", "--processor", "p", "--out", "o", *argv])


def test_audio_option_becomes_the_encoder_option():
    """Old code: ``mmpipe encode --audio source`` was an argparse error (no such option)."""
    assert encode_options(_parse("--audio", "source"))["audio"] == "source"
    assert encode_options(_parse("--audio", "features"))["audio"] == "features"
    assert "audio" not in encode_options(_parse())  # left to the encoder (features)
    with pytest.raises(SystemExit):
        _parse("--audio", "wav")


def test_audio_source_through_the_command_equals_the_python_api(tmp_path, capsys):
    """The stored rows of ``mmpipe encode --audio source`` equal ``mmpipe.Encoder(processor,
    audio="source")``'s, clip files included; the run record names the option."""
    import numpy as np
    import soundfile

    import mmpipe
    from mmpipe.processors import load_processor
    from mmpipe.records.row import MultiModalInputs
    from mmpipe.testing.invariants import assert_rows_equal

    t = np.arange(8000) / 16000
    (tmp_path / "media").mkdir()
    soundfile.write(tmp_path / "media" / "a.wav", (0.2 * np.sin(2 * np.pi * 440 * t)).astype(np.float32), 16000)
    user = lambda *items: {"role": "user", "content": list(items)}  # noqa: E731
    rows = [{"messages": [user({"type": "audio"}, {"type": "text", "text": "What is it?"}),
                          {"role": "assistant", "content": "A tone."}], "audios": ["media/a.wav"]},
            {"messages": [user({"type": "text", "text": "Say hi."}), {"role": "assistant", "content": "Hi!"}],
             "audios": []}]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    status = main(["encode", str(tmp_path / "rows.jsonl"), "--processor", "testing:qwen2_5_omni", "--out",
                   str(tmp_path / "enc"), "--audio", "source", "--quiet"])
    assert status == 0, capsys.readouterr()
    stored = datasets.load_from_disk(str(tmp_path / "enc"))
    assert not stored[0]["input_features"] and stored[0]["audio_sources"]  # the clip file, not its features
    got = [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(stored)]
    absolute = [{**r, "audios": [str(tmp_path / a) for a in r["audios"]]} for r in rows]
    enc = mmpipe.Encoder(load_processor("testing:qwen2_5_omni"), audio="source")
    assert_rows_equal(got, [enc.encode_row(r, i) for i, r in enumerate(absolute)])
    assert json.loads((tmp_path / "enc" / "mmpipe_encode.json").read_text())["options"]["audio"] == "source"


# ---- --field: read the rows out of the field ---------------------------------------------------------
@pytest.mark.parametrize("indent", [None, 2])
def test_field_option_reads_the_wrapped_rows(folder, capsys, indent):
    """``--field data`` (what the refusal now offers first) encodes the field's rows, compact or
    pretty-printed, with image paths relative to the input file: the same rows as the file written
    one per line."""
    src = folder / "wrapped.json"
    src.write_text(json.dumps({"version": "1.1", "data": [_row(i) for i in range(3)]}, indent=indent))
    assert main(["encode", str(src), "--processor", "testing:qwen2_vl", "--out", str(folder / "o"),
                 "--quiet"]) == 2
    assert "--field data" in capsys.readouterr().err
    assert main(["encode", str(src), "--processor", "testing:qwen2_vl", "--out", str(folder / "o"), "--quiet",
                 "--field", "data"]) == 0, capsys.readouterr().err
    (folder / "rows.jsonl").write_text("".join(json.dumps(_row(i)) + "\n" for i in range(3)))
    assert main(["encode", str(folder / "rows.jsonl"), "--processor", "testing:qwen2_vl", "--out",
                 str(folder / "lines"), "--quiet"]) == 0
    got, want = datasets.load_from_disk(str(folder / "o")), datasets.load_from_disk(str(folder / "lines"))
    assert len(got) == 3 and got.to_list() == want.to_list()


def test_field_option_on_a_lines_file_is_refused(folder):
    (folder / "rows.jsonl").write_text(json.dumps(_row(0)) + "\n")
    with pytest.raises(CLIError, match="with --field .data.: it must be one JSON object"):
        load_raw(folder / "rows.jsonl", field="data")
