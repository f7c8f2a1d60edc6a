"""The InternVL / LLaVA-OneVision offline fixtures (mmpipe/offline/internvl.py, onevision.py,
by name through tile_builders.py): real processor classes with 32x32 tiles, tiny models that
take the processor's outputs, and the model's own image-token count == the processor's (so the
tiny configs match the processors)."""

from __future__ import annotations

import pytest
import torch

from mmpipe import testing
from mmpipe.errors import ArgumentError
from mmpipe.families import processor_class_name
from mmpipe.offline.tile_builders import TILED2_FAMILIES, build_tiled2_model, build_tiled2_processor
from mmpipe.offline.tiny_towers import TILE

CLASSES = {"internvl": ("InternVLProcessor", "GotOcr2ImageProcessorPil", "InternVLForConditionalGeneration"),
           "llava_onevision": ("LlavaOnevisionProcessor", "LlavaOnevisionImageProcessorPil",
                               "LlavaOnevisionForConditionalGeneration")}


def _inputs(proc, counts, sizes=((50, 300), (64, 64), (333, 29))):
    texts, images = [], []
    for k, n in enumerate(counts):
        msgs = [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": f"row {k}"}]}]
        texts.append(proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
        images += [testing.tiny_image(*sizes[(k + i) % len(sizes)], seed=k + i) for i in range(n)]
    return proc(text=texts, images=images or None, return_tensors="pt", padding=True)


@pytest.mark.parametrize("name", TILED2_FAMILIES)
def test_builders_give_the_stock_classes(name):
    proc_cls, ip_cls, model_cls = CLASSES[name]
    proc = build_tiled2_processor(name)
    assert processor_class_name(proc) == proc_cls and type(proc.image_processor).__name__ == ip_cls
    assert proc.image_processor.size.height == proc.image_processor.size.width == TILE
    assert build_tiled2_processor(name) is not proc  # fresh objects
    model = build_tiled2_model(name)
    assert type(model).__name__ == model_cls and not model.training
    assert model is not build_tiled2_model(name)
    with pytest.raises(ArgumentError, match="use one of"):
        build_tiled2_processor("gemma3")
    with pytest.raises(ArgumentError, match="builds one of"):
        build_tiled2_model("llava")


@pytest.mark.parametrize("name", TILED2_FAMILIES)
def test_model_takes_the_processor_outputs(name):
    """A one-row forward with images: the model's image features fill exactly the processor's
    image tokens (transformers raises 'Image features and image tokens do not match' otherwise),
    with several tile counts (1, several, the thumbnail / base tile)."""
    proc, model = build_tiled2_processor(name), build_tiled2_model(name)
    for counts in ([1], [2], [3]):
        inputs = _inputs(proc, counts)
        with torch.no_grad():
            logits = model(**inputs).logits
        assert logits.shape[:2] == inputs["input_ids"].shape and torch.isfinite(logits).all()
