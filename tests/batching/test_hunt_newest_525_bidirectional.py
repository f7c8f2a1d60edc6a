"""ShieldGemma 2 (transformers 5.25 ``shieldgemma2``): its checkpoints load ``Gemma3ForConditionalGeneration``
(the image-text-to-text auto mapping) under their own model type, and that model's image tokens attend both
ways (``token_type_ids``), a mask transformers builds from positions in the whole pack. `check_packing` on
its model or config said the layers keep packed rows apart (sliding / full attention only); it now refuses
them as Gemma 3's, naming ``bidirectional_image``."""

from __future__ import annotations

import pytest

from mmpipe.batching.attention_layers import check_packing, model_layers
from mmpipe.errors import PackingUnsupportedError


def test_shieldgemma2_is_refused_as_gemma3():
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "ShieldGemma2Config"):
        pytest.skip(f"transformers {transformers.__version__} has no shieldgemma2")
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    assert MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES["shieldgemma2"] == "Gemma3ForConditionalGeneration"
    config = transformers.ShieldGemma2Config()
    for who in (config, config.to_dict()):
        assert "bidirectional_image" in model_layers(who).model_wide
        with pytest.raises(PackingUnsupportedError, match="bidirectional_image"):  # was: returned (packs)
            check_packing(who)


def test_t5gemma2_is_not_a_text_decoder():
    """T5Gemma 2 (``t5gemma2``, image-text-to-text, its checkpoints load ``Gemma3Processor``) is an
    encoder-decoder whose encoder holds the vision tower. Was: `family_of` called its config a text decoder
    (family "text", 1-D rope) and `check_packing` let it pack (the decoder's sliding / full layers only)."""
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "T5Gemma2Config"):
        pytest.skip(f"transformers {transformers.__version__} has no t5gemma2")
    from mmpipe.errors import UnsupportedProcessorError
    from mmpipe.families import GENERIC, family_of, resolve_family

    config = transformers.T5Gemma2Config()
    for who in (config, config.to_dict()):
        with pytest.raises(UnsupportedProcessorError, match="t5gemma2"):
            family_of(who)
        assert resolve_family(who) is GENERIC
    assert "encoder_decoder" in model_layers(config).model_wide
    with pytest.raises(PackingUnsupportedError, match="encoder_decoder"):
        check_packing(config)
