"""mmpipe.offline.gemma3: the Gemma 3 processor and tiny model built offline match each other
(soft tokens per image, token ids), the real-settings processor has the checkpoints' tile and
token count, and the model runs on the processor's own outputs."""

from __future__ import annotations

import pytest
import torch

from mmpipe.families import GEMMA3, family_of
from mmpipe.offline import tiny_image
from mmpipe.offline.gemma3 import GEMMA3_REAL_TILE, GEMMA3_REAL_TOKENS, build_gemma3_model, build_gemma3_processor


def test_processor_and_model_match():
    proc, model = build_gemma3_processor(), build_gemma3_model()
    assert family_of(proc) is GEMMA3 and family_of(model) is GEMMA3
    tok = proc.tokenizer
    assert model.config.mm_tokens_per_image == proc.image_seq_length == 4
    assert model.config.image_token_id == tok.convert_tokens_to_ids(GEMMA3.feature_token)
    assert model.config.boi_token_id == tok.convert_tokens_to_ids(GEMMA3.image_token)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}]
    text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    with torch.no_grad():
        out = model(**proc(text=[text], images=[tiny_image(40, 56)], return_tensors="pt"))
    assert torch.isfinite(out.logits).all()


def test_real_settings():
    proc = build_gemma3_processor(real=True)
    assert proc.image_seq_length == GEMMA3_REAL_TOKENS and proc.full_image_sequence.count("<image_soft_token>") == 256
    size = proc.image_processor.size
    assert (size.height, size.width) == (GEMMA3_REAL_TILE, GEMMA3_REAL_TILE)


@pytest.mark.parametrize("name", ["gemma3", "internvl", "llava_onevision"])
def test_build_processor_and_model_take_the_tiled_families(name):
    """`mmpipe.offline.build_processor` / `build_model` (and so ``testing:NAME``) hand the tiled
    families to their builder modules; pixel bounds do not apply to fixed-size tiles."""
    from mmpipe.errors import ArgumentError
    from mmpipe.families import tiled_family_of
    from mmpipe.offline import build_model, build_processor

    assert tiled_family_of(build_processor(name)).name == name
    assert build_model(name) is not None
    with pytest.raises(ArgumentError, match="fixed-size tiles"):
        build_processor(name, max_pixels=4096)


@pytest.mark.parametrize("name", ["gemma3", "idefics3", "llava", "llava_onevision1_5", "ovis2_5", "paligemma"])
def test_tiny_models_stop_where_their_chat_template_ends_a_turn(name):
    """The configs' default eos / bos (1 and 2: Gemma's and Llama's own ids) are '"' and '#' in
    the offline vocabulary, so a generation stopped at a quote mark and never at the turn's
    end. The tiny models now take their tokenizer's ids, as a checkpoint's config does."""
    from mmpipe.offline.other_vlms import MODELS, build_foreign_model, build_foreign_processor

    if name not in MODELS + ("paligemma",):
        pytest.skip(f"{name}: this transformers has no such model class")
    tok = build_foreign_processor(name).tokenizer
    gen = build_foreign_model(name).generation_config
    assert gen.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert gen.bos_token_id == tok.bos_token_id
    ended = tok.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                                    tokenize=False)
    assert ended.rstrip().endswith(tok.eos_token)
