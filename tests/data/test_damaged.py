"""Bad-input cases for loading encoded datasets (issue 15): a path that is not an encoded
dataset, and a ``save_to_disk`` directory damaged on disk. Each case states its outcome:
the error class, stage, column, row and words of the fix (the same shape as
``tests/bad_inputs.py``, so the cases can be merged into the corpus).

Before issue 15 every case here escaped as a raw ``FileNotFoundError`` / ``ArrowInvalid`` /
``OSError: Expected to be able to read ...`` naming neither the dataset file nor the rows.
"""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import dataclass
from typing import Callable, Optional

import datasets
import pyarrow as pa
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.data.loading import DamagedDatasetError
from mmpipe.data.validate import SchemaError, load_encoded, validate_dataset
from mmpipe.errors import ArgumentError, InputError

from conftest import processor_for

ROWS, PER_SHARD = 8, 2  # 4 shards of 2 rows: the damaged one is shard DAMAGED
DAMAGED = 2
SHARD = f"data-{DAMAGED:05d}-of-{ROWS // PER_SHARD:05d}.arrow"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A good ``save_to_disk`` directory of encoded rows, ``PER_SHARD`` rows per file."""
    proc = processor_for("qwen2_vl")
    rows = []
    for i in range(ROWS):
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{i}"}]},
                {"role": "assistant", "content": f"a{i}"}]
        rows.append(mmpipe.encode_row({"messages": msgs, "images": [testing.tiny_image(40, 60, seed=i)]}, proc, idx=i))
    ds = datasets.Dataset.from_list([r.to_dict() for r in rows],
                                    features=mmpipe.MultiModalInputs.features("uint8", labels=True))
    path = tmp_path_factory.mktemp("saved") / "good"
    ds.save_to_disk(str(path), num_shards=ROWS // PER_SHARD)
    assert os.path.isfile(path / SHARD)
    return path


def _truncate(file: str) -> None:
    os.truncate(file, os.path.getsize(file) // 2)


def _flip(offset: int) -> Callable[[str], None]:
    def flip(file: str) -> None:
        with open(file, "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0xFF]))
    return flip


@dataclass
class Damage:
    """A damaged copy of `saved`: ``damage(shard file)``; the stated outcome."""

    name: str
    damage: Callable[[str], None]
    words: tuple  # substrings of the message
    rows_readable: Optional[tuple] = (0, DAMAGED * PER_SHARD)


DAMAGES = [
    # cut in half: the record batch's body is short
    Damage("truncated_half", _truncate, ("record batch 0", "truncated or corrupted", "rows [0, 4)")),
    # empty file (a crashed copy)
    Damage("truncated_empty", lambda f: os.truncate(f, 0), ("schema header", "rows [0, 4)")),
    # the IPC continuation marker of the schema message
    Damage("flipped_continuation", _flip(0), ("schema header", "continuation")),
    # the schema message's length / flatbuffer
    Damage("flipped_metadata_length", _flip(4), ("flatbuffers", "rows [0, 4)")),
    # a data file listed in state.json is gone
    Damage("missing_data_file", os.remove, ("listed in state.json is missing", "rows [0, 4)")),
]


@pytest.mark.parametrize("case", DAMAGES, ids=lambda c: c.name)
@pytest.mark.parametrize("entry", [validate_dataset, load_encoded], ids=lambda f: f.__name__)
def test_damaged_saved_dataset_is_reported_with_file_and_rows(saved, tmp_path, case, entry):
    path = tmp_path / case.name
    shutil.copytree(saved, path)
    file = str(path / SHARD)
    case.damage(file)
    with pytest.raises(DamagedDatasetError) as ei:
        entry(str(path))
    e = ei.value
    assert isinstance(e, InputError) and isinstance(e, ValueError)
    assert (e.stage, e.column, e.row) == ("validate", None, None)
    assert e.file == file and e.rows_readable == case.rows_readable
    msg = str(e)
    assert file in msg and "re-save" in e.fix and "[stage: validate]" in msg
    for w in case.words:
        assert w in msg, (w, msg)


def _flip_pixel_byte(saved, path, row_in_shard: int) -> int:
    """Flip one byte inside a stored row's compact pixel bytes (found in the shard file by
    content), past the IPC framing: the file still reads. Returns the dataset row."""
    row = DAMAGED * PER_SHARD + row_in_shard
    blob = datasets.load_from_disk(str(saved))[row]["pixel_values_u8"]
    file = path / SHARD
    data = bytearray(file.read_bytes())
    at = data.find(blob[:-1])
    assert at > 0 and data.find(blob[:-1], at + 1) < 0
    data[at + len(blob) // 2] ^= 0x01
    file.write_bytes(bytes(data))
    return row


def test_flipped_pixel_byte_is_caught_by_the_digest(saved, tmp_path):
    """A byte flipped inside the pixel data (not the framing) reads as Arrow; the per-row pixel
    digest names the row in validate_dataset / load_encoded, and Collator(verify_pixels=True)
    refuses it at collate time (the default collate does not hash)."""
    path = tmp_path / "late_flip"
    shutil.copytree(saved, path)
    row = _flip_pixel_byte(saved, path, 1)
    report = validate_dataset(str(path))
    (issue,) = report.errors
    assert issue.rows == [row] and issue.column == "pixel_values_u8" and "pixel_digest" in issue.message
    with pytest.raises(SchemaError, match="pixel_digest"):
        load_encoded(str(path))
    ds = datasets.load_from_disk(str(path))
    proc = processor_for("qwen2_vl")
    mmpipe.Collator(proc)([ds[row]])  # not verified: the damage trains silently without the option
    with pytest.raises(mmpipe.errors.PixelDataError, match="pixel_digest") as ei:
        mmpipe.Collator(proc, verify_pixels=True)([ds[row - 1], ds[row]])
    assert ei.value.row == 1 and ei.value.stage == "collate"
    with pytest.raises(mmpipe.errors.PixelDataError, match="pixel_digest"):
        mmpipe.Collator(proc, verify_pixels=True)(mmpipe.ArrowRows(ds)[row])


def test_rows_without_a_digest_warn_and_fix_adds_it(saved):
    ds = datasets.load_from_disk(str(saved)).remove_columns(["pixel_digest"])
    report = validate_dataset(ds)
    assert report.ok and [w.column for w in report.warnings] == ["pixel_digest"]
    fixed = validate_dataset(ds, fix=True)
    assert fixed.ok and fixed.data["pixel_digest"] == datasets.load_from_disk(str(saved))["pixel_digest"]


def test_good_directory_still_loads(saved):
    assert validate_dataset(str(saved)).ok and load_encoded(str(saved)).num_rows == ROWS


def test_damaged_single_arrow_file(saved, tmp_path):
    """A lone ``.arrow`` file (a shard copied out) damaged: the same error, rows from 0."""
    file = tmp_path / "one.arrow"
    shutil.copy(saved / SHARD, file)
    _truncate(str(file))
    with pytest.raises(DamagedDatasetError, match="record batch 0") as ei:
        validate_dataset(str(file))
    assert ei.value.file == str(file) and ei.value.rows_readable == (0, 0) and ei.value.stage == "validate"
    again = pickle.loads(pickle.dumps(ei.value))  # crosses DataLoader / map workers intact
    assert (type(again), again.file, again.rows_readable, str(again)) == (
        DamagedDatasetError, str(file), (0, 0), str(ei.value))


def test_damaged_parquet_file(tmp_path):
    file = tmp_path / "cut.parquet"
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"input_ids": [[1, 2, 3]] * 100}), file)
    os.truncate(file, os.path.getsize(file) // 2)
    with pytest.raises(DamagedDatasetError, match="cannot be read as Parquet") as ei:
        load_encoded(str(file))
    assert ei.value.file == str(file) and ei.value.stage == "validate" and "re-save" in ei.value.fix


# ---- not an encoded dataset: bad arguments --------------------------------------------------------
@pytest.mark.parametrize("name, content, words", [
    ("missing_path", None, ("does not exist",)),
    ("rows.jsonl", '{"messages": []}\n', ("raw .jsonl file", "encode it first")),
    ("rows.csv", "a,b\n1,2\n", ("raw .csv file", "encode it first")),
    ("blob.bin", "not arrow at all", ("neither a directory, a .parquet file nor an Arrow IPC file",)),
    ("folder_of_jsonl", "<dir>", ("not a save_to_disk directory (no state.json)",)),
])
@pytest.mark.parametrize("entry", [validate_dataset, load_encoded], ids=lambda f: f.__name__)
def test_not_an_encoded_dataset_is_an_argument_error(tmp_path, name, content, words, entry):
    path = tmp_path / name
    if content == "<dir>":
        path.mkdir()
        (path / "rows.jsonl").write_text("{}\n")
    elif content is not None:
        path.write_text(content)
    with pytest.raises(ArgumentError) as ei:
        entry(str(path))
    msg = str(ei.value)
    assert str(path) in msg and "save_to_disk directory" in msg and ".parquet" in msg and "Table" in msg
    for w in words:
        assert w in msg, (w, msg)
