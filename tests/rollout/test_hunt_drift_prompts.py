"""vLLM prompts built with a processor whose settings drifted from the encoder's: patch-grid rows
give prompts under which that processor re-creates the stored grids and its own normalisation of
them (what collate with it gives), bit for bit; a Gemma 3 row's stored tile stands in for its image
only when it is of the processor's tile size (else vLLM would upscale the tile, not tile the image)."""

from __future__ import annotations

import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import PixelDataError
from mmpipe.rollout import to_vllm_prompts

from helpers import edited_processor, one_image_row

IMAGES = [testing.tiny_image(60, 90), testing.tiny_image(100, 50)]


@pytest.mark.parametrize("settings", [dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5]),
                                      dict(size={"shortest_edge": 56 * 56, "longest_edge": 56 * 56})])
def test_patch_grid_prompts_recreate_the_rows_under_the_drifted_processor(settings):
    b = edited_processor("qwen2_vl", **settings)
    rows = [mmpipe.encode_row(r, edited_processor("qwen2_vl")) for r in [one_image_row(im) for im in IMAGES]]
    batch = mmpipe.collate(rows, processor=b)
    for k, prompt in enumerate(to_vllm_prompts(rows, b)):
        kw = dict(prompt["mm_processor_kwargs"])
        size = {"shortest_edge": kw.pop("min_pixels"), "longest_edge": kw.pop("max_pixels")}
        out = b.image_processor(images=prompt["multi_modal_data"]["image"], size=size, return_tensors="pt", **kw)
        assert out["image_grid_thw"].tolist() == rows[k].image_grid_thw.tolist()
        cut = slice(int(batch.patch_offsets[k]), int(batch.patch_offsets[k + 1]))
        assert torch.equal(out["pixel_values"], torch.as_tensor(batch.pixel_values)[cut])


def test_gemma3_stored_tile_of_another_size_is_refused_as_the_prompt_image():
    a, b = edited_processor("gemma3"), edited_processor("gemma3", size={"height": 64, "width": 64})
    rows = [mmpipe.encode_row(r, a) for r in [one_image_row(im) for im in IMAGES]]
    assert [p["multi_modal_data"]["image"][0].size for p in to_vllm_prompts(rows, a)] == [(32, 32)] * 2
    with pytest.raises(PixelDataError) as e:
        to_vllm_prompts(rows, b)
    assert e.value.row == 0 and e.value.column == "tile_hw" and "images=" in e.value.fix
    prompts = to_vllm_prompts(rows, b, images=[[im] for im in IMAGES])  # the originals: vLLM tiles them
    assert [p["multi_modal_data"]["image"][0].size for p in prompts] == [(90, 60), (50, 100)]


def test_patch_grid_rows_of_another_tokenizer_are_refused():
    """A row whose image slots hold another id than the processor's pads (simulated: moved to id
    5) would reach vLLM with no image placeholder its tokenizer knows."""
    import numpy as np

    p = edited_processor("qwen2_vl")
    rows = [mmpipe.encode_row(r, p).to_dict() for r in [one_image_row(im) for im in IMAGES]]
    ids = np.asarray(rows[1]["input_ids"]).copy()
    ids[np.asarray(rows[1]["mm_token_type_ids"]) == 1] = 5
    with pytest.raises(mmpipe.errors.InputError) as e:
        to_vllm_prompts([rows[0], {**rows[1], "input_ids": ids}], p)
    assert e.value.row == 1 and e.value.column == "input_ids" and e.value.stage == "rollout"
