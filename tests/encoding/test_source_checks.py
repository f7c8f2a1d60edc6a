"""``pixels="source"`` rows are checked when they are encoded (issue 29.4): a file whose header is
whole but whose pixel data is cut decodes nowhere, so it is its row's `ImageError` at encode - on
the patch-grid and the tiled families, by path and by bytes - and ``on_error="skip"`` records it
(`mmpipe.encode_dataset`, a plain map, `encode_stream`); the other rows collate to the uint8 rows'
pixels. (Before, the row was stored and failed only at collate, inside a DataLoader worker.)"""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe.data.streaming import encode_stream
from mmpipe.errors import ImageError

from helpers import photo_paths

FAMILIES = {"qwen2_vl": {}, "gemma3": {}}


def _row(image) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "a photo"}]}], "images": [image]}


def _cut(tmp_path: Path) -> tuple[bytes, bytes, str]:
    jpeg = Path(photo_paths()[1]).read_bytes()
    cut = jpeg[: len(jpeg) // 2]
    path = tmp_path / "cut.jpg"
    path.write_bytes(cut)
    return jpeg, cut, str(path)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cut_source_fails_at_encode(family, tmp_path):
    proc = mmpipe.testing.build_processor(family)
    jpeg, cut, path = _cut(tmp_path)
    for value in (cut, {"bytes": cut, "path": None}, path):
        with pytest.raises(ImageError, match=r"^row 3, image 0: cannot read the image") as info:
            mmpipe.encode_row(_row(value), proc, idx=3, pixels="source")
        assert info.value.column == "images" and info.value.stage == "image"
    # the layout-only route (a length filter) refuses the cut file too, with the same error: it decodes
    # a file that does not reach its end marker (tests/images/test_hunt_layout_cuts_images.py)
    with pytest.raises(ImageError, match=r"^row 3, image 0: cannot read the image"):
        mmpipe.encode_row(_row(cut), proc, idx=3, pixels="none")
    # a whole file still stores its own bytes, unchanged
    row = mmpipe.encode_row(_row(jpeg), proc, idx=3, pixels="source")
    assert [bytes(s) for s in row.image_sources] == [jpeg]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_cut_source_is_skipped_and_counted(family, tmp_path):
    proc = mmpipe.testing.build_processor(family)
    jpeg, cut, _ = _cut(tmp_path)
    img = lambda b: {"bytes": b, "path": None}  # noqa: E731
    ds = datasets.Dataset.from_list([_row(img(jpeg)), _row(img(cut)), _row(img(jpeg))])
    enc, report = mmpipe.encode_dataset(ds, proc, pixels="source", on_error="skip")
    assert [(e["row"], e["stage"], e["column"]) for e in report.errors] == [(1, "image", "images")]
    assert len(enc) == 2
    batch = mmpipe.Collator(proc)(mmpipe.ArrowRows(enc).__getitems__([0, 1]))
    ref = mmpipe.Collator(proc)([mmpipe.encode_row(_row(jpeg), proc, idx=i, pixels="uint8").to_dict()
                                 for i in (0, 2)])
    np.testing.assert_array_equal(np.asarray(batch.pixel_values), np.asarray(ref.pixel_values))
    # the plain map keeps the row visible, its error recorded
    out = ds.map(mmpipe.encode, fn_kwargs={"processor": proc, "pixels": "source", "on_error": "skip"},
                 with_indices=True, remove_columns=ds.column_names)
    assert [json.loads(x)["row"] if x else None for x in out["mmpipe_error"]] == [None, 1, None]
    # and a stream leaves it out, counted
    errors: list = []
    rows = list(encode_stream(ds.to_iterable_dataset(), proc, pixels="source", on_error="skip", errors=errors))
    assert len(rows) == 2 and [e["row"] for e in errors] == [1]
