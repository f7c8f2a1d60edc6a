"""The command line with the tiled families (Gemma 3, InternVL, LLaVA-OneVision):
``mmpipe encode --processor testing:NAME`` gives the rows mmpipe.encode gives, ``mmpipe inspect``
counts their images, tiles and image tokens, ``mmpipe validate`` checks them (and names a
damaged row), options a tiled family refuses exit 2 naming the option; a saved tiled processor
directory loads."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.cli.main import main
from mmpipe.families import family_of
from mmpipe.processors import ProcessorLoadError, load_processor
from mmpipe.records.row import MultiModalInputs

FAMILIES = ("gemma3", "internvl", "llava_onevision")
COUNTS = (0, 1, 2, 1)


@pytest.fixture(scope="module")
def jsonl(tmp_path_factory) -> Path:
    """rows.jsonl next to two PNGs: rows with 0, 1, 2 and 1 images (paths relative to the file)."""
    d = tmp_path_factory.mktemp("raw")
    rng = np.random.default_rng(5)
    for i, (h, w) in enumerate([(40, 56), (70, 30)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(d / f"img{i}.png")
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": f"q{k}"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
             "images": [f"img{i}.png" for i in range(n)]} for k, n in enumerate(COUNTS)]
    (d / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return d / "rows.jsonl"


def _reference(path: Path, proc) -> list[MultiModalInputs]:
    raws = [json.loads(line) for line in path.read_text().splitlines()]
    for r in raws:
        r["images"] = [Image.open(path.parent / p) for p in r["images"]]
    return [mmpipe.encode_row(r, proc) for r in raws]


@pytest.mark.parametrize("name", FAMILIES)
def test_encode_inspect_validate(name, jsonl, tmp_path, capsys):
    proc = load_processor(f"testing:{name}")
    assert family_of(proc).name == name
    out = tmp_path / "enc"
    assert main(["encode", str(jsonl), "--processor", f"testing:{name}", "--out", str(out), "--quiet"]) == 0
    assert f"family {name}" in capsys.readouterr().out
    saved = datasets.load_from_disk(str(out))
    got = [MultiModalInputs.from_dict(r, i) for i, r in enumerate(saved)]
    for a, b in zip(got, _reference(jsonl, proc)):
        assert a.equals(b), a.diff(b)

    assert main(["inspect", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["families"] == {name: 4} and stats["images"] == sum(COUNTS) and stats["rows_without_images"] == 1
    assert stats["image_unit"] == "tiles" and stats["image_patches"] == sum(int(r.tiles_per_image.sum()) for r in got)
    assert stats["image_tokens"] == sum(int(r.mm_token_type_ids.sum()) for r in got)
    assert stats["tokens_per_image"]["count"] == sum(COUNTS)
    assert stats["pixel_bytes"] == sum(r.pixel_values_u8.size for r in got)
    assert stats["float32_pixel_bytes"] == 4 * stats["pixel_bytes"]
    assert main(["inspect", str(out), "--quiet"]) == 0
    assert f"{stats['image_patches']} tiles" in capsys.readouterr().out

    assert main(["validate", str(out), "--processor", f"testing:{name}"]) == 0
    assert "OK" in capsys.readouterr().out
    rows = saved.to_list()
    rows[2]["input_ids"][int(np.flatnonzero(np.asarray(rows[2]["mm_token_type_ids"]) == 1)[0])] = rows[2]["input_ids"][0]
    bad = tmp_path / "bad"
    datasets.Dataset.from_list(rows, features=saved.features).save_to_disk(str(bad))
    assert main(["validate", str(bad)]) == 1
    assert "column 'input_ids', rows [2]" in capsys.readouterr().out


def test_layout_only_and_refused_options(jsonl, tmp_path, capsys):
    out = tmp_path / "none"
    assert main(["encode", str(jsonl), "--processor", "testing:internvl", "--out", str(out), "--quiet",
                 "--pixels", "none"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["pixel_format"] == "none" and stats["pixel_bytes"] == 0 and stats["images"] == sum(COUNTS)
    src = tmp_path / "source"
    assert main(["encode", str(jsonl), "--processor", "testing:gemma3", "--out", str(src), "--quiet",
                 "--pixels", "source"]) == 0
    capsys.readouterr()
    assert main(["inspect", str(src), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "pixels       source: " in text and "an unknown size (the tile size is not stored" in text
    assert main(["validate", str(src), "--processor", "testing:gemma3"]) == 0
    for extra, word in ((["--min-pixels", "100"], "min_pixels"), (["--pixels", "float32"], "float32")):
        assert main(["encode", str(jsonl), "--processor", "testing:gemma3", "--out", str(tmp_path / word),
                     "--quiet", *extra]) == 2
        err = capsys.readouterr().err
        assert word in err and "gemma3" in err and "--keep-columns" not in err


def test_saved_tiled_processor_directory_loads(tmp_path):
    for name in FAMILIES:
        load_processor(f"testing:{name}").save_pretrained(tmp_path / name)
        proc = load_processor(str(tmp_path / name))
        assert family_of(proc).name == name
    with pytest.raises(ProcessorLoadError, match="testing:gemma3"):
        load_processor("testing:gemma4")
