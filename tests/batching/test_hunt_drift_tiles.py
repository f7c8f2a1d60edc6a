"""Settings drift for tiled-family rows (Gemma 3, InternVL, LLaVA-OneVision): uint8 tiles take the
collating processor's normalisation and equal its own call bit for bit; tiles of another
processor's image size (a checkpoint of another resolution) are refused (`PixelDataError` naming
the row and ``tile_hw``), never normalised as they are and handed to a tower of another size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import PixelDataError

from helpers import edited_processor, one_image_row

IMAGES = [testing.tiny_image(60, 90), testing.tiny_image(100, 50)]
FAMILIES = ("gemma3", "internvl", "llava_onevision")


def _own_call(p):
    text = [p.apply_chat_template(one_image_row(im, "A.")["messages"], tokenize=False) for im in IMAGES]
    return p(text=text, images=[[im] for im in IMAGES], return_tensors="pt", padding=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_tiles_take_the_collating_processors_normalisation_exactly(family):
    b = edited_processor(family, image_mean=[0.1, 0.2, 0.3], image_std=[0.2, 0.3, 0.4])
    rows = [mmpipe.encode_row(one_image_row(im, "A."), edited_processor(family)) for im in IMAGES]
    pv = mmpipe.collate(rows, processor=b).model_inputs()["pixel_values"]
    assert torch.equal(pv, _own_call(b)["pixel_values"])


@pytest.mark.parametrize("family", FAMILIES)
def test_tiles_of_another_image_size_are_refused(family):
    a = edited_processor(family)
    side = int(np.asarray(mmpipe.encode_row(one_image_row(IMAGES[0], "A."), a).pixel_values_u8).shape[1])
    b = edited_processor(family, size={"height": 2 * side, "width": 2 * side})
    rows = [mmpipe.encode_row(one_image_row(im, "A."), a) for im in IMAGES]
    with pytest.raises(PixelDataError) as e:
        mmpipe.collate(rows, processor=b)
    assert e.value.row == 0 and e.value.column == "tile_hw"
    assert e.value.expected == str([2 * side] * 2) and e.value.found == str([side] * 2)
    mmpipe.collate(rows, processor=a)  # the encoder's processor: fine


def test_source_rows_are_tiled_by_the_collating_processor_exactly():
    """pixels='source' rows keep their files: a processor of another tile size tiles them itself,
    as its own call does (Gemma 3: the tile size does not change the text)."""
    b = edited_processor("gemma3", size={"height": 64, "width": 64})
    rows = [mmpipe.encode_row(one_image_row(im, "A."), edited_processor("gemma3"), pixels="source") for im in IMAGES]
    batch = mmpipe.collate(rows, processor=b)
    ref = _own_call(b)
    assert torch.equal(batch.model_inputs()["pixel_values"], ref["pixel_values"])
    for i, r in enumerate(rows):
        assert np.array_equal(r.input_ids, ref["input_ids"][i][ref["attention_mask"][i].bool()].numpy())


@pytest.mark.parametrize("family", FAMILIES)
def test_rows_of_another_tokenizer_are_refused(family):
    """Rows whose feature slots hold another id than the collating processor's feature token
    (InternVL checkpoints of one family ship different vocabularies): simulated by moving the
    row's feature tokens to another id."""
    from mmpipe.errors import InputError

    p = edited_processor(family)
    rows = [mmpipe.encode_row(one_image_row(im, "A."), p).to_dict() for im in IMAGES]
    ids = np.asarray(rows[1]["input_ids"]).copy()
    ids[np.asarray(rows[1]["mm_token_type_ids"]) == 1] = 5
    with pytest.raises(InputError) as e:
        mmpipe.collate([rows[0], {**rows[1], "input_ids": ids}], processor=p)
    assert e.value.row == 1 and e.value.column == "input_ids" and "id 5" in e.value.found
