"""validate_dataset(processor=) with a processor whose image settings drifted from the encoder's
(patch-grid rows): float32 rows normalised by another processor are named, compact rows pass
(collate expands them with the given processor's table, exactly)."""

from __future__ import annotations

import datasets

import mmpipe
from mmpipe import testing

from helpers import edited_processor, one_image_row

IMAGES = [testing.tiny_image(60, 90), testing.tiny_image(100, 50)]
HALF = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def _rows(processor, pixels):
    return [mmpipe.encode_row(one_image_row(im), processor, pixels=pixels) for im in IMAGES]


def test_validate_with_another_processor_names_float_rows_of_another_normalisation():
    rows = _rows(edited_processor(), "float32")
    ds = datasets.Dataset.from_list([r.to_dict() for r in rows])
    assert mmpipe.validate_dataset(ds, processor=edited_processor()).ok
    report = mmpipe.validate_dataset(ds, processor=edited_processor(**HALF))
    assert [(i.column, i.rows) for i in report.errors] == [("pixel_values", [0, 1])], str(report)
    compact = datasets.Dataset.from_list([r.to_dict() for r in _rows(edited_processor(), "uint8")])
    assert mmpipe.validate_dataset(compact, processor=edited_processor(**HALF)).ok  # collate takes them exactly


def test_validate_with_another_processor_names_tiles_of_another_image_size():
    a, b = edited_processor("gemma3"), edited_processor("gemma3", size={"height": 64, "width": 64})
    raws = [one_image_row(im) for im in IMAGES]
    ds = datasets.Dataset.from_list([mmpipe.encode_row(r, a).to_dict() for r in raws])
    assert mmpipe.validate_dataset(ds, processor=a).ok
    report = mmpipe.validate_dataset(ds, processor=b)
    assert [(i.column, i.rows) for i in report.errors] == [("tile_hw", [0, 1])], str(report)


def test_validate_with_another_processor_names_rows_of_another_tokenizer():
    """Image slots holding another id than the processor's pads (simulated: the pads moved to id 5)."""
    import numpy as np

    p = edited_processor()
    rows = [r.to_dict() for r in _rows(p, "uint8")]
    ids = np.asarray(rows[1]["input_ids"]).copy()
    ids[np.asarray(rows[1]["mm_token_type_ids"]) == 1] = 5
    ds = datasets.Dataset.from_list([rows[0], {**rows[1], "input_ids": ids}])
    report = mmpipe.validate_dataset(ds, processor=p, positions=False)
    assert [(i.column, i.rows) for i in report.errors] == [("input_ids", [1])], str(report)
