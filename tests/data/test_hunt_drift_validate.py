"""validate_dataset(processor=) with a processor whose image settings drifted from the encoder's
(patch-grid rows): float32 rows normalised by another processor are named, compact rows pass
(collate expands them with the given processor's table, exactly)."""

from __future__ import annotations

import datasets

import mmpipe
from mmpipe import testing

IMAGES = [testing.tiny_image(60, 90), testing.tiny_image(100, 50)]
HALF = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def _processor(**settings):
    p = testing.build_processor("qwen2_vl")
    for k, v in settings.items():
        setattr(p.image_processor, k, v)
    return p


def _rows(processor, pixels):
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
             "images": [im]} for im in IMAGES]
    return [mmpipe.encode_row(r, processor, pixels=pixels) for r in raws]


def test_validate_with_another_processor_names_float_rows_of_another_normalisation():
    rows = _rows(_processor(), "float32")
    ds = datasets.Dataset.from_list([r.to_dict() for r in rows])
    assert mmpipe.validate_dataset(ds, processor=_processor()).ok
    report = mmpipe.validate_dataset(ds, processor=_processor(**HALF))
    assert [(i.column, i.rows) for i in report.errors] == [("pixel_values", [0, 1])], str(report)
    compact = datasets.Dataset.from_list([r.to_dict() for r in _rows(_processor(), "uint8")])
    assert mmpipe.validate_dataset(compact, processor=_processor(**HALF)).ok  # collate takes them exactly


def test_validate_with_another_processor_names_tiles_of_another_image_size():
    a = testing.build_processor("gemma3")
    b = testing.build_processor("gemma3")
    b.image_processor.size = {"height": 64, "width": 64}
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What?"}]}],
             "images": [im]} for im in IMAGES]
    ds = datasets.Dataset.from_list([mmpipe.encode_row(r, a).to_dict() for r in raws])
    assert mmpipe.validate_dataset(ds, processor=a).ok
    report = mmpipe.validate_dataset(ds, processor=b)
    assert [(i.column, i.rows) for i in report.errors] == [("tile_hw", [0, 1])], str(report)


def test_validate_with_another_processor_names_rows_of_another_tokenizer():
    """Image slots holding another id than the processor's pads (simulated: the pads moved to id 5)."""
    import numpy as np

    p = _processor()
    rows = [r.to_dict() for r in _rows(p, "uint8")]
    ids = np.asarray(rows[1]["input_ids"]).copy()
    ids[np.asarray(rows[1]["mm_token_type_ids"]) == 1] = 5
    ds = datasets.Dataset.from_list([rows[0], {**rows[1], "input_ids": ids}])
    report = mmpipe.validate_dataset(ds, processor=p, positions=False)
    assert [(i.column, i.rows) for i in report.errors] == [("input_ids", [1])], str(report)
