"""vLLM prompts of Gemma 3 rows (to_vllm_prompts: the tiles strategy, mmpipe.media.tiles.vllm_prompt):
one <start_of_image> per image plus the stored tile; the processor run on that prompt (what vLLM's Gemma 3 does with
it) gives back the row's ids and its pixel_values bit for bit. Pan-and-scan uint8 rows are refused
(their crops come from the original image): tests/rollout/test_tiled_source_prompts.py prompts
them from source rows or images=."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError
from mmpipe.offline.gemma3 import build_gemma3_processor
from mmpipe.rollout import to_vllm_prompts
from mmpipe.testing import invariants


def _raw(n: int, k: int) -> dict:
    images = [testing.tiny_image(20 + 31 * j, 90 - 13 * k, seed=10 * k + j) for j in range(n)]
    content = [{"type": "text", "text": f"look {k}:"}] + [{"type": "image"} for _ in images] + \
              [{"type": "text", "text": "what?" * (k + 1)}]
    return {"messages": [{"role": "user", "content": content}], "images": images}


@pytest.mark.parametrize("real", [False, True], ids=["tiny", "real_896"])
def test_prompts_give_the_rows_back_through_the_processor(real):
    proc = build_gemma3_processor(real=real)
    rows = [mmpipe.encode_row(_raw(n, k), proc, idx=k) for k, n in enumerate([0, 1, 3, 2])]
    batch = mmpipe.collate(rows, processor=proc)
    invariants.assert_roundtrip(rows, batch)
    boi = proc.tokenizer.convert_tokens_to_ids("<start_of_image>")
    for source in (rows, [r.to_dict() for r in rows], batch):
        prompts = to_vllm_prompts(source, proc)
        for r, p in zip(rows, prompts):
            ids = np.asarray(p["prompt_token_ids"])
            assert int((ids == boi).sum()) == r.num_images
            if not r.num_images:
                assert "multi_modal_data" not in p and np.array_equal(ids, r.input_ids)
                continue
            text = proc.tokenizer.decode(ids, skip_special_tokens=False)
            again = proc(text=[text], images=p["multi_modal_data"]["image"], return_tensors="np",
                         **p["mm_processor_kwargs"])
            assert np.array_equal(again["input_ids"][0], r.input_ids)
            assert np.array_equal(again["pixel_values"], mmpipe.collate([r], processor=proc).pixel_values)


def test_pan_and_scan_uint8_rows_are_refused():
    proc = build_gemma3_processor()
    row = mmpipe.encode_row(_raw(1, 3), proc, images_kwargs={"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8})
    assert row.tiles_per_image.tolist() == [4]  # the image and 3 crops
    with pytest.raises(InputError, match="from the original image.*pixels='source', or pass images="):
        to_vllm_prompts([row], proc)
