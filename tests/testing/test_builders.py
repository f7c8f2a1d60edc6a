"""``mmpipe.testing.build_processor`` / ``build_model`` build every name the offline builders
know, and an unknown name's error lists them all (issue 28: it listed the three Qwen names)."""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe.errors import ArgumentError
from mmpipe.families import resolve_family
from mmpipe.offline.builders import OMNI
from mmpipe.offline.other_vlms import FOREIGN_PROCESSORS, MINICPMV_NAMES, MORE_MODELS, OVIS2_NAMES
from mmpipe.offline.qwen3_5 import MODEL_LINES
from mmpipe.offline.tokenizer import FAMILY_NAMES, OWN_BUILDERS
from mmpipe.testing import PROCESSOR_NAMES, build_model, build_processor, tiny_image

EVERY_MODULE = {*FAMILY_NAMES, *OWN_BUILDERS, *MODEL_LINES, *FOREIGN_PROCESSORS, *MORE_MODELS, *MINICPMV_NAMES,
                *OVIS2_NAMES, *OMNI}


def test_the_names_cover_every_offline_builder_module():
    assert set(PROCESSOR_NAMES) == EVERY_MODULE and len(PROCESSOR_NAMES) == len(set(PROCESSOR_NAMES))
    assert {"idefics3", "llava", "mllama", "paligemma", "minicpmv4_6", "ovis2", "gemma3", "glm46v"} <= set(PROCESSOR_NAMES)


@pytest.mark.parametrize("name", sorted(EVERY_MODULE))
def test_build_processor_builds_every_name(name):
    proc = build_processor(name)
    assert hasattr(proc, "image_processor") and hasattr(proc, "tokenizer") and proc.chat_template
    fam = resolve_family(proc)  # a native family's row, or the generic path
    if name in FAMILY_NAMES or name in OWN_BUILDERS:
        assert fam.name == name
    elif name in MODEL_LINES:
        assert fam.name == "qwen3_vl"
    # and it encodes a row with an image (the family table or the generic path)
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                             "images": [tiny_image(32, 32)]}, proc)
    assert row.num_images == 1 and row.num_tokens > 0


def test_an_unknown_name_lists_every_name():
    with pytest.raises(ArgumentError) as e:
        build_processor("idefics4")
    assert all(repr(n) in str(e.value) for n in EVERY_MODULE), str(e.value)
    with pytest.raises(ArgumentError) as e:
        build_model("idefics4")
    assert all(repr(n) in str(e.value) for n in ("idefics3", "gemma3", "qwen3_5", "ovis2", "mllama")), str(e.value)


def test_pixel_bounds_are_refused_where_they_do_not_apply():
    with pytest.raises(ArgumentError, match="image_processor"):
        build_processor("idefics3", max_pixels=1000)
    small = build_processor("qwen2_vl", max_pixels=8 * 28 * 28)
    assert small.image_processor.size["longest_edge"] == 8 * 28 * 28


def test_build_model_builds_a_generic_path_model():
    import torch

    proc, model = build_processor("idefics3"), build_model("idefics3")
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                                    add_generation_prompt=True)
    inputs = proc(text=[text], images=[[tiny_image(32, 32)]], return_tensors="pt")
    with torch.no_grad():
        assert model(**inputs).logits.shape[:2] == inputs["input_ids"].shape
