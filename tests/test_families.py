"""The family comes from the processor / config class (issue 20.3): real transformers processors
of other VLM families, built offline, are never taken for a Qwen family; the Qwen ones resolve."""

from __future__ import annotations

import pytest
import transformers

from mmpipe.families import (
    FAMILIES, GENERIC_PATH, QWEN2_VL, TEXT, TILED_FAMILIES, UnsupportedProcessorError, family_of,
    processor_class_name,
)
from mmpipe.offline import build_model, build_processor, build_tokenizer, tiny_image
from mmpipe.offline.other_vlms import FOREIGN_PROCESSORS, build_foreign_processor

STOCK = {"glm4v": "Glm4vProcessor", "gemma3": "Gemma3Processor", "idefics3": "Idefics3Processor",
         "llava_onevision": "LlavaOnevisionProcessor", "internvl": "InternVLProcessor", "llava": "LlavaProcessor",
         "llava_onevision1_5": "Exaone4_5_Processor", "ovis2_5": "Ovis2_5Processor"}
# the offline processors of families without a table row (native and tiled families have one)
UNLISTED = [n for n in FOREIGN_PROCESSORS if not any(STOCK[n] in f.processor_classes
                                                     for f in (*FAMILIES.values(), *TILED_FAMILIES.values()))]


@pytest.mark.parametrize("name", UNLISTED)
def test_foreign_processor_is_refused_with_its_class_and_the_generic_path(name):
    proc = build_foreign_processor(name)
    assert processor_class_name(proc) == STOCK[name]
    with pytest.raises(UnsupportedProcessorError) as info:
        family_of(proc)
    msg = str(info.value)
    assert info.value.class_name == STOCK[name]
    assert STOCK[name] in msg and type(proc.image_processor).__name__ in msg and GENERIC_PATH in msg


@pytest.mark.parametrize("name", FOREIGN_PROCESSORS)
def test_foreign_processor_really_works_offline(name):
    """The refused processors are real, working processors (not stubs): one image through
    their own chat template and call gives ids and pixel values."""
    proc = build_foreign_processor(name)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    out = proc(text=[text], images=[tiny_image(40, 56)])
    assert len(out["input_ids"][0]) > 5 and len(out["pixel_values"]) > 0


def test_glm4v_is_not_taken_for_qwen2_vl_from_merge_size():
    """The old guess: an unknown processor whose image processor has ``merge_size`` was Qwen2-VL.
    GLM-4.1V is a native family now (tests/encoding/test_glm4v.py): found from its class."""
    proc = build_foreign_processor("glm4v")
    assert proc.image_processor.merge_size == 2 and proc.image_processor.patch_size == 14
    assert family_of(proc).name == "glm4v"


def test_subclass_of_a_foreign_processor_is_still_that_family():
    class MyIdefics(transformers.Idefics3Processor):
        pass

    proc = build_foreign_processor("idefics3")
    proc.__class__ = MyIdefics
    with pytest.raises(UnsupportedProcessorError, match="Idefics3Processor"):
        family_of(proc)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_qwen_processors_and_models_resolve(family):
    proc = build_processor(family)  # an image-only subclass (mmpipe.offline) of the stock class
    assert processor_class_name(proc) == FAMILIES[family].processor_classes[0]
    assert family_of(proc) is FAMILIES[family]
    model = build_model(family)
    assert family_of(model) is FAMILIES[family] and family_of(model.config) is FAMILIES[family]


def test_configs_by_model_type():
    vlm = transformers.Idefics3Config(text_config=dict(model_type="llama", hidden_size=32, num_hidden_layers=1))
    with pytest.raises(UnsupportedProcessorError, match="idefics3"):
        family_of(vlm)
    assert family_of(transformers.LlamaConfig(hidden_size=32, num_hidden_layers=1)) is TEXT
    assert family_of(build_tokenizer()) is TEXT
    assert family_of("qwen2_vl") is QWEN2_VL and family_of(QWEN2_VL) is QWEN2_VL


def test_unsupported_is_an_argument_error():
    """Callers that catch ValueError / ArgumentError keep working."""
    with pytest.raises(ValueError):
        family_of(build_foreign_processor("idefics3"))
