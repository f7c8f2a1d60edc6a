"""Bad-input cases for `mmpipe.unbatch` (issue 15): a batch whose fields disagree with each
other (edited by hand, or assembled by another tool). Before issue 15 ``unbatch`` returned
rows that disagree with themselves or with the batch (silently wrong); now it checks the
batch's internal consistency in a few vectorised passes and raises, at stage "validate",
naming the batch row and the field. Each case states its outcome (error class, stage,
column, row, words of the message and the fix), the same shape as ``tests/bad_inputs.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional

import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError, PixelDataError
from mmpipe.testing.invariants import assert_roundtrip, assert_unbatched_rows_valid

from conftest import processor_for

IMAGES = [0, 2, 1, 0]  # images per row; the edited row is EDIT (2 images)
EDIT = 1


def _encode(pixels: str = "uint8"):
    proc = processor_for("qwen2_vl")
    out = []
    for i, k in enumerate(IMAGES):
        content = []
        for j in range(k):
            content += [{"type": "image"}, {"type": "text", "text": f"img {j}"}]
        content.append({"type": "text", "text": "question " * (2 + 3 * i)})
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": f"answer {i}"}]
        imgs = [testing.tiny_image(40 + 8 * j, 60, seed=10 * i + j) for j in range(k)]
        out.append(mmpipe.encode_row({"messages": msgs, "images": imgs}, proc, idx=i, pixels=pixels))
    return out


@pytest.fixture(scope="module")
def rows():
    return _encode()


def _set(name: str, fn: Callable) -> Callable:
    """An edit: ``batch.name = fn(a clone of batch.name)``."""
    def edit(batch):
        return dataclasses.replace(batch, **{name: fn(getattr(batch, name).clone())})
    return edit


def _at(index, value):
    def fn(t):
        t[index] = value
        return t
    return fn


def _add(index, delta):
    def fn(t):
        t[index] += delta
        return t
    return fn


@dataclass
class Case:
    """An edited batch (``padding_side``), and the stated outcome."""

    name: str
    edit: Callable
    error: type
    column: str
    row: Optional[int]
    words: tuple
    padding_side: str = "right"


CASES = [
    # seq_lengths shorter than the row: real tokens would be dropped
    Case("seq_length_short_right", _set("seq_lengths", _add(EDIT, -3)), InputError, "seq_lengths", EDIT,
         ("attended tokens but seq_lengths",)),
    Case("seq_length_short_left", _set("seq_lengths", _add(EDIT, -3)), InputError, "seq_lengths", EDIT,
         ("attended tokens but seq_lengths",), "left"),
    # longer than the padded length
    Case("seq_length_past_L", _set("seq_lengths", _add(2, 10_000)), InputError, "seq_lengths", 2,
         ("the padded length",)),
    Case("seq_length_negative", _set("seq_lengths", _at(0, -1)), InputError, "seq_lengths", 0, ("0..",)),
    # a real token (attention 1) put in the padding after the row
    Case("attention_in_padding", lambda b: _set("attention_mask", _at((0, int(b.seq_lengths[0])), 1))(b),
         InputError, "seq_lengths", 0, ("seq_lengths and attention_mask disagree",)),
    # an image-typed token in the padding after the row
    Case("media_type_in_padding", lambda b: _set("mm_token_type_ids", _at((2, int(b.seq_lengths[2])), 1))(b),
         InputError, "seq_lengths", 2, ("mm_token_type_ids marks the token next to",)),
    # a label in the padding (the model would train on a pad)
    Case("label_in_padding", lambda b: _set("labels", _at((3, int(b.seq_lengths[3])), 5))(b),
         InputError, "seq_lengths", 3, ("labels marks the token next to",)),
    # the padding side recorded wrong (a right-padded batch said to be left-padded)
    Case("padding_side_flipped", lambda b: dataclasses.replace(b, padding_side="left"), InputError, "seq_lengths", 0,
         ("left padding",)),
    # image offsets not monotonic (row 2 would own -1 images)
    Case("image_offsets_decreasing", _set("image_offsets", _at(3, 1)), PixelDataError, "image_offsets", 2,
         ("non-decreasing",)),
    # offsets that do not cover the grids
    Case("image_offsets_short", _set("image_offsets", _add(slice(2, None), -1)), PixelDataError, "image_offsets",
         len(IMAGES) - 1, ("image_grid_thw rows",)),
    # a row's pixel rows shifted
    Case("patch_offsets_shifted", _set("patch_offsets", _add(2, 4)), PixelDataError, "patch_offsets", EDIT,
         ("disagree with the row's image_grid_thw",)),
    # a grid edited: its patches no longer match the offsets
    Case("grid_edited", _set("image_grid_thw", _add((0, 1), 2)), PixelDataError, "patch_offsets", EDIT,
         ("disagree with the row's image_grid_thw",)),
    # pixel rows dropped (only some images' pixels)
    Case("pixel_values_short", _set("pixel_values", lambda t: t[:-4]), PixelDataError, "pixel_values", None,
         ("from image_grid_thw",)),
    Case("pixel_values_u8_extra", _set("pixel_values_u8", lambda t: torch.cat([t, t[:4]])), PixelDataError,
         "pixel_values_u8", None, ("from image_grid_thw",)),
    # an image token turned into text: the row's tokens and grids disagree
    Case("image_token_retyped", lambda b: _set("mm_token_type_ids", _at(
        (EDIT, int(b.mm_token_type_ids[EDIT].nonzero()[0])), 0))(b), PixelDataError, "image_grid_thw", EDIT,
         ("image tokens (type 1) in mm_token_type_ids",)),
    # tokens typed image in a row without images
    Case("image_token_in_text_row", _set("mm_token_type_ids", _at((3, 0), 1)), PixelDataError, "image_grid_thw", 3,
         ("1 image tokens",)),
    # a field of the wrong shape
    Case("rope_deltas_shape", _set("rope_deltas", lambda t: t[:2]), InputError, "rope_deltas", None, ("shape",)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_inconsistent_batch_is_refused_naming_row_and_field(rows, case):
    batch = mmpipe.collate(rows, padding_side=case.padding_side)
    assert_roundtrip(rows, batch)  # the batch as collated is fine
    bad = case.edit(batch)
    with pytest.raises(case.error) as ei:
        assert_unbatched_rows_valid(bad)  # runs mmpipe.unbatch on the edited batch
    e = ei.value
    assert (e.stage, e.column, e.row) == ("validate", case.column, case.row), str(e)
    assert "mmpipe.collate" in e.fix and "[stage: validate" in str(e)
    for w in case.words:
        assert w in str(e), (w, str(e))


@pytest.mark.parametrize("padding_side", ["left", "right"])
@pytest.mark.parametrize("pixels", ["uint8", "float32"])
def test_consistent_batches_still_round_trip(rows, padding_side, pixels):
    """Documented handling: the checks never refuse a batch collate built (both padding sides,
    both pixel storages, rows with an all-zero attention mask, padding to a longer length)."""
    rs = _encode(pixels) if pixels == "float32" else [mmpipe.MultiModalInputs.from_dict(r.to_dict()) for r in rows]
    rs[0].attention_mask[:] = 0
    assert_roundtrip(rs, padding_side=padding_side)
    assert_roundtrip(rs, padding_side=padding_side, pad_to_multiple_of=64)


def _tiled_batch():
    from mmpipe.offline.gemma3 import build_gemma3_processor

    proc = build_gemma3_processor()
    rows = []
    for i, k in enumerate((1, 0, 2)):
        content = [{"type": "image"}] * k + [{"type": "text", "text": f"row {i}"}]
        msgs = [{"role": "user", "content": content}, {"role": "assistant", "content": f"ok {i}"}]
        imgs = [testing.tiny_image(30 + 9 * j, 40, seed=i * 3 + j) for j in range(k)]
        rows.append(mmpipe.encode_row({"messages": msgs, "images": imgs}, proc, idx=i))
    return rows, mmpipe.collate(rows, processor=proc)


TILED_CASES = [  # (edit of a tiled batch's numpy fields, column, row, words)
    (lambda b: dataclasses.replace(b, image_offsets=b.image_offsets * 0 + [0, 2, 1, 3]), "image_offsets", 1,
     ("non-decreasing",)),
    (lambda b: dataclasses.replace(b, patch_offsets=b.patch_offsets + [0, 1, 1, 1]), "patch_offsets", 0,
     ("disagree with the row's tiles_per_image",)),
    (lambda b: dataclasses.replace(b, pixel_values_u8=b.pixel_values_u8[:-1]), "pixel_values_u8", None,
     ("from tiles_per_image",)),
    (lambda b: dataclasses.replace(b, tiles_per_image=b.tiles_per_image[:-1]), "tiles_per_image", None,
     ("one per image",)),
]


@pytest.mark.parametrize("case", range(len(TILED_CASES)))
def test_tiled_batches_are_checked_by_the_same_declared_items(case):
    """The media-item checks are one implementation (`mmpipe.batching.media_checks`) driven by each
    kind's MEDIA_ITEMS: a tiled batch's image offsets, tile offsets, tiles and per-image fields
    are checked as the patch grids' are."""
    rows, batch = _tiled_batch()
    assert_roundtrip(rows, batch)
    edit, column, row, words = TILED_CASES[case]
    with pytest.raises(PixelDataError) as ei:
        assert_unbatched_rows_valid(edit(batch))  # runs mmpipe.unbatch on the edited batch
    e = ei.value
    assert (e.stage, e.column, e.row) == ("validate", column, row), str(e)
    for w in words:
        assert w in str(e), (w, str(e))
