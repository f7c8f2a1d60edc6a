"""Settings drift between the processor that encoded rows and the one that collates them
(patch-grid rows): compact uint8 rows take the collating processor's normalisation and equal its
own call bit for bit; float32 rows keep their encoder's, so rows normalised by another processor
are refused (`PixelDataError` naming the row), never mixed into the batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import PixelDataError

from helpers import edited_processor, one_image_row

IMAGES = [testing.tiny_image(60, 90), testing.tiny_image(100, 50)]


def _rows(processor, pixels):
    return [mmpipe.encode_row(one_image_row(im, "A."), processor, pixels=pixels) for im in IMAGES]


HALF = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


@pytest.mark.parametrize("settings", [HALF, dict(rescale_factor=1 / 127.5), dict(do_normalize=False),
                                      dict(temporal_patch_size=1)])
def test_compact_rows_take_the_collating_processors_settings_exactly(settings):
    b = edited_processor(**settings)
    batch = mmpipe.collate(_rows(edited_processor(), "uint8"), processor=b)
    ref = [b.image_processor(images=[im], return_tensors="pt") for im in IMAGES]
    assert torch.equal(torch.as_tensor(batch.image_grid_thw), torch.cat([r["image_grid_thw"] for r in ref]))
    assert torch.equal(torch.as_tensor(batch.pixel_values), torch.cat([r["pixel_values"] for r in ref]))


@pytest.mark.parametrize("settings", [HALF, dict(rescale_factor=1 / 127.5), dict(do_normalize=False),
                                      dict(temporal_patch_size=1)])
def test_float_rows_of_another_normalisation_are_refused(settings):
    rows = _rows(edited_processor(), "float32")
    with pytest.raises(PixelDataError) as e:
        mmpipe.collate(rows, processor=edited_processor(**settings))
    assert e.value.row == 0 and e.value.column == "pixel_values" and "pixels='uint8'" in str(e.value)
    with pytest.raises(PixelDataError):  # the Collator (a DataLoader's collate_fn) too
        mmpipe.Collator(edited_processor(**settings))([r.to_dict() for r in rows])


def test_float_rows_mixed_with_compact_rows_of_another_normalisation_are_refused():
    """A dataset concatenated from a float32 encode by a processor of its own normalisation and a
    uint8 encode: collated without a processor, the compact row expands with the family's table
    and the float row keeps its own; the batch would mix two normalisations."""
    own = edited_processor(**HALF)
    rows = [_rows(own, "float32")[0], _rows(own, "uint8")[1]]
    with pytest.raises(PixelDataError) as e:
        mmpipe.collate(rows)
    assert e.value.row == 0
    batch = mmpipe.collate(rows, processor=own)  # with the encoder's processor: one table, exact
    ref = [own.image_processor(images=[im], return_tensors="pt")["pixel_values"] for im in IMAGES]
    assert torch.equal(torch.as_tensor(batch.pixel_values), torch.cat(ref))


def test_float_rows_with_their_own_processor_pass():
    a = edited_processor(**HALF)
    rows = _rows(a, "float32")
    for p in (a, edited_processor(**HALF), None):  # the encoder's, an equal one, none (its floats as stored)
        batch = mmpipe.collate(rows, processor=p)
        assert np.array_equal(np.asarray(batch.pixel_values), np.concatenate([r.pixel_values for r in rows]))


def test_float_rows_of_two_normalisations_collated_without_a_processor_are_refused():
    """concatenate_datasets of two float32 encodes, by processors of different normalisations,
    collated without a processor: the family's table tells the rows apart (one of them is its)."""
    rows = [_rows(edited_processor(), "float32")[0], _rows(edited_processor(**HALF), "float32")[1]]
    with pytest.raises(PixelDataError) as e:
        mmpipe.collate(rows)
    assert e.value.row == 1 and e.value.column == "pixel_values"
    mmpipe.collate(_rows(edited_processor(**HALF), "float32"))  # one table, its own: as stored


def test_rows_of_another_tokenizer_are_refused():
    """Rows whose image slots hold another id than the collating processor's pads (encoded by a
    checkpoint of the family with another vocabulary): the model would find no image token where
    the pixels go. Simulated by moving the row's pads to another id."""
    p = edited_processor()
    d = _rows(p, "uint8")[0].to_dict()
    ids = np.asarray(d["input_ids"]).copy()
    ids[np.asarray(d["mm_token_type_ids"]) == 1] = 5
    with pytest.raises(mmpipe.errors.InputError) as e:
        mmpipe.collate([_rows(p, "uint8")[1], {**d, "input_ids": ids}], processor=p)
    assert e.value.row == 1 and e.value.column == "input_ids" and "id 5" in e.value.found
