"""``mmpipe validate --split`` (docs hunt): `encode` and `inspect` take a saved `DatasetDict`'s split,
`validate` refused the folder and told a command-line user to call ``load_from_disk(path)[split]``
in Python (an unknown ``--split`` was a usage error). It checks the split's folder as any saved
dataset: clean -> 0, a damaged data file -> 2, rows in error -> 1."""

from __future__ import annotations

import datasets
import pytest

import mmpipe
from mmpipe.cli.main import main
from mmpipe.testing import build_processor, tiny_image


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    processor = build_processor("qwen2_vl")
    raw = datasets.Dataset.from_list([{"prompt": f"<image>Row {i}?", "images": [tiny_image(32, 40, seed=i)]}
                                      for i in range(3)])
    enc, _ = mmpipe.encode_dataset(raw, processor)
    root = tmp_path_factory.mktemp("dicts")
    datasets.DatasetDict({"train": enc, "test": enc.select([0])}).save_to_disk(root / "two")
    datasets.DatasetDict({"train": enc}).save_to_disk(root / "one")
    enc.save_to_disk(root / "plain")
    return root


def test_a_split_validates(saved, capsys):
    assert main(["validate", str(saved / "two"), "--split", "test"]) == 0
    assert "1 rows" in capsys.readouterr().out
    assert main(["validate", str(saved / "one")]) == 0  # one split: no --split needed
    assert "3 rows" in capsys.readouterr().out


def test_a_dict_without_split_names_the_splits_and_the_option(saved, capsys):
    assert main(["validate", str(saved / "two")]) == 2
    err = capsys.readouterr().err
    assert "['test', 'train']" in err and "--split" in err, err
    assert main(["validate", str(saved / "two"), "--split", "dev"]) == 2
    assert "no split 'dev'" in capsys.readouterr().err
    assert main(["validate", str(saved / "plain"), "--split", "test"]) == 2
    assert "not a DatasetDict" in capsys.readouterr().err


def test_a_damaged_split_is_named(saved, tmp_path, capsys):
    import shutil

    two = tmp_path / "two"
    shutil.copytree(saved / "two", two)
    data = next((two / "train").glob("*.arrow"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    assert main(["validate", str(two), "--split", "train"]) == 2
    assert "damaged" in capsys.readouterr().err
    assert main(["validate", str(two), "--split", "test"]) == 0


def test_parquet_shards_validate_as_the_page_says(saved, tmp_path, capsys):
    """`mmpipe validate` takes what `mmpipe.validate_dataset` reads: a folder or glob of parquet
    shards too (the CLI page said a directory, .parquet or .arrow only)."""
    from mmpipe.data.object_store import write_shards

    write_shards(datasets.load_from_disk(str(saved / "plain")), str(tmp_path / "shards"), num_shards=2)
    assert main(["validate", str(tmp_path / "shards")]) == 0
    assert main(["validate", str(tmp_path / "shards" / "*.parquet")]) == 0
    assert capsys.readouterr().out.count("3 rows") == 2
    from pathlib import Path

    page = " ".join((Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md").read_text().split())
    section = page[page.index("## mmpipe validate"):page.index("## mmpipe demo")]
    assert "folder or glob of parquet shards" in section and "s3://" in section, section
