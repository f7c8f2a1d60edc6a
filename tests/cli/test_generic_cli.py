"""The command line on the generic path (a saved processor without a family table: Idefics3):
``mmpipe encode`` stores the rows mmpipe.encode gives (the processor's own float32 outputs, with
no --pixels), ``mmpipe inspect`` counts their images and stored output values from the columns,
``mmpipe validate`` passes them - the same three commands as for every family."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
from PIL import Image

import mmpipe
from mmpipe.cli.main import main
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.records.row import MultiModalInputs

COUNTS = (0, 1, 2)


def test_encode_inspect_validate_a_generic_processor(tmp_path, capsys):
    proc = build_foreign_processor("idefics3")
    proc.save_pretrained(tmp_path / "proc")
    rng = np.random.default_rng(3)
    for i, (h, w) in enumerate([(40, 56), (70, 30)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(tmp_path / f"img{i}.png")
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": f"q{k}"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
             "images": [f"img{i}.png" for i in range(n)]} for k, n in enumerate(COUNTS)]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in raws) + "\n")
    out = tmp_path / "enc"
    assert main(["encode", str(tmp_path / "rows.jsonl"), "--processor", str(tmp_path / "proc"), "--out", str(out),
                 "--quiet"]) == 0
    assert "family generic, pixels float32" in capsys.readouterr().out
    assert json.loads((out / "mmpipe_encode.json").read_text())["options"]["pixels"] == "float32"
    got = [MultiModalInputs.from_dict(r, i) for i, r in enumerate(datasets.load_from_disk(str(out)))]
    for r, want in zip(raws, got):
        r["images"] = [Image.open(tmp_path / p) for p in r["images"]]
        assert mmpipe.encode_row(r, proc).diff(want) == []

    assert main(["inspect", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["families"] == {"generic": 3} and stats["pixel_format"] == "float32"
    assert stats["images"] == sum(COUNTS) and stats["rows_without_images"] == 1
    assert stats["tokens"] == sum(r.num_tokens for r in got) and stats["image_tokens"] == 0
    assert stats["image_unit"] == "output values"
    assert stats["image_patches"] == sum(v.size for r in got for v in r.vision.values())
    assert stats["pixel_bytes"] == sum(v.nbytes for r in got for v in r.vision.values())
    assert stats["float32_pixel_bytes"] == sum(r.vision["pixel_values"].nbytes for r in got if r.num_images)
    assert stats["tokens_per_image"]["count"] == 0  # the processor's placeholders are not marked
    assert main(["inspect", str(out), "--quiet"]) == 0
    assert f"images       3  ({stats['image_patches']} output values)" in capsys.readouterr().out

    assert main(["validate", str(out)]) == 0
    assert "OK" in capsys.readouterr().out
