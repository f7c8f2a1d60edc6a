"""vLLM prompts for every tiled family (Gemma 3 with and without pan-and-scan, InternVL,
LLaVA-OneVision) from the SOURCE images: ``pixels="source"`` rows (their stored files) or any
rows with ``images=``. The prompt is what vLLM takes - one image token per image plus the
original images, and ``mm_processor_kwargs`` only where the family's vLLM processor takes them
(Gemma 3's pan-and-scan settings, as the row was encoded) - and the real processor run on it
gives back each row's ids and pixel values bit for bit. Rows that keep neither their files
nor a re-usable tile are refused, naming the fix."""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from mmpipe.offline import build_processor
from mmpipe import testing
from mmpipe.errors import ArgumentError, ImageError, InputError
from mmpipe.families import family_of
from mmpipe.offline.tile_builders import build_tiled2_processor
from mmpipe.rollout import to_vllm_prompts
from helpers import odd_images, photo_paths

PAN = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}
# LLaVA-OneVision rows for vLLM are encoded in vLLM's flat multi-image mode (every image tiled); the
# default per-conversation rows of several images are refused (tests/encoding/test_onevision_modes.py)
CASES = {"gemma3": ("gemma3", {}), "gemma3_pan_and_scan": ("gemma3", PAN),
         "internvl": ("internvl", {}), "llava_onevision": ("llava_onevision", {"multi_image": "flat"})}


def _processor(family: str):
    return build_processor(family)


def _raw(images: list, k: int) -> dict:
    content = [{"type": "text", "text": f"row {k}:"}] + [{"type": "image"}] * len(images) + \
              [{"type": "text", "text": "what is shown?"}]
    return {"messages": [{"role": "user", "content": content}], "images": images}


@pytest.fixture(params=list(CASES))
def case(request):
    family, kwargs = CASES[request.param]
    return _processor(family), kwargs


def _sets() -> list:
    paths, odd = photo_paths(), odd_images()
    return [[], [paths[1]], [paths[0], odd[2], odd[5]], [odd[3], paths[2], odd[1]]]


def _check_through_the_processor(proc, rows, prompts, kwargs):
    fam = family_of(proc)
    token = proc.tokenizer.convert_tokens_to_ids(fam.image_token)
    for r, p in zip(rows, prompts):
        ids = np.asarray(p["prompt_token_ids"])
        if not r.num_images:
            assert set(p) == {"prompt_token_ids"} and np.array_equal(ids, r.input_ids)
            continue
        assert int((ids == token).sum()) == r.num_images  # one placeholder per image
        assert len(p["multi_modal_data"]["image"]) == r.num_images
        mm_kwargs = p.get("mm_processor_kwargs", {})
        if fam.name == "gemma3":
            assert mm_kwargs["do_pan_and_scan"] is bool(kwargs.get("do_pan_and_scan", False))
            assert set(mm_kwargs) == set(fam.vllm_processor_kwargs)
        else:
            assert "mm_processor_kwargs" not in p  # vLLM's InternVL / OneVision processors take none
        text = proc.tokenizer.decode(ids, skip_special_tokens=False)
        again = proc(text=[text], images=p["multi_modal_data"]["image"], return_tensors="np",
                     add_special_tokens=False, **mm_kwargs)
        assert np.array_equal(again["input_ids"][0], r.input_ids)
        batch = mmpipe.collate([r], processor=proc)
        assert np.array_equal(again["pixel_values"], batch.pixel_values)
        if "image_sizes" in again:
            assert np.array_equal(again["image_sizes"], batch.extras["image_sizes"])


def test_source_rows_prompt_vllm_with_their_files(case):
    proc, kwargs = case
    rows = [mmpipe.encode_row(_raw(s, k), proc, images_kwargs=kwargs, pixels="source", labels=False)
            for k, s in enumerate(_sets())]
    for source in (rows, [r.to_dict() for r in rows]):
        _check_through_the_processor(proc, rows, to_vllm_prompts(source, proc), kwargs)


@pytest.mark.parametrize("pixels", ["uint8", "none"])
def test_any_rows_prompt_vllm_with_images_given(case, pixels):
    proc, kwargs = case
    sets = _sets()
    rows = [mmpipe.encode_row(_raw(s, k), proc, images_kwargs=kwargs, pixels=pixels, labels=False)
            for k, s in enumerate(sets)]
    prompts = to_vllm_prompts(rows, proc, images=sets)
    _check_through_the_processor(proc, [mmpipe.encode_row(_raw(s, k), proc, images_kwargs=kwargs, labels=False)
                                        for k, s in enumerate(sets)], prompts, kwargs)
    src = [mmpipe.encode_row(_raw(s, k), proc, images_kwargs=kwargs, pixels="source", labels=False)
           for k, s in enumerate(sets)]
    for a, b in zip(prompts, to_vllm_prompts(src, proc)):  # the same prompts as from the stored files
        assert a["prompt_token_ids"] == b["prompt_token_ids"] and a.get("mm_processor_kwargs") == b.get("mm_processor_kwargs")
        for x, y in zip(a.get("multi_modal_data", {}).get("image", []), b.get("multi_modal_data", {}).get("image", [])):
            assert np.array_equal(np.asarray(x), np.asarray(y))


def test_rows_without_their_images_are_refused_with_the_fix():
    for family, kwargs in (("internvl", {}), ("llava_onevision", {}), ("gemma3", CASES["gemma3_pan_and_scan"][1])):
        proc = _processor(family)
        for pixels in ("uint8", "none"):
            row = mmpipe.encode_row(_raw([testing.tiny_image(20, 90)], 0), proc, images_kwargs=kwargs, pixels=pixels)
            assert row.tiles_per_image[0] > 1
            with pytest.raises(InputError, match="from the original image.*pixels='source', or pass images=") as e:
                to_vllm_prompts([row], proc)
            assert "panned" not in str(e.value)
    proc = _processor("gemma3")  # one tile per image (no pan-and-scan): the stored tile re-creates the prompt
    row = mmpipe.encode_row(_raw([testing.tiny_image(20, 90)], 0), proc)
    assert to_vllm_prompts([row], proc)[0]["mm_processor_kwargs"]["do_pan_and_scan"] is False


def test_images_given_must_be_the_rows_images():
    proc = _processor("internvl")
    paths = photo_paths()
    row = mmpipe.encode_row(_raw([paths[1]], 0), proc)
    with pytest.raises(ImageError, match="encoded from"):
        to_vllm_prompts([row], proc, images=[[paths[0]]])  # another image (another size)
    with pytest.raises(InputError, match="images= gives 2"):
        to_vllm_prompts([row], proc, images=[[paths[1], paths[1]]])
    with pytest.raises(ArgumentError, match="one list of images per row"):
        to_vllm_prompts([row], proc, images=[[paths[1]], [paths[1]]])


def test_images_kwargs_vllm_does_not_take_are_refused():
    proc = build_tiled2_processor("internvl")
    row = mmpipe.encode_row(_raw([photo_paths()[1]], 0), proc, images_kwargs={"max_patches": 2}, pixels="source")
    with pytest.raises(InputError, match="does not take"):
        to_vllm_prompts([row], proc)
