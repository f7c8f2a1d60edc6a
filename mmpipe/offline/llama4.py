"""Offline fixtures for Llama 4 (transformers 5.24 ``llama4``) on the generic path, in the
"vision" test environment: `mmpipe.offline.vision_env_vlms.build_vision_env_processor` /
``build_vision_env_model("llama4")`` call `build_processor` / `build_model` here.

Llama 4 (``Llama4Processor``, ``Llama4ImageProcessor`` - torchvision): the published chat
template is the processor module's own default (``<|header_start|>role<|header_end|>\\n\\n``
... ``<|eot|>``, ``{{ bos_token }}`` first, each image ``<|image|>``); the tokenizer adds
``<|begin_of_text|>`` itself (as the published one does); the processor expands each image to
``<|image_start|>`` [tiles of ``<|patch|>`` with ``<|tile_x_separator|>`` /
``<|tile_y_separator|>``] ``<|image|>`` + global ``<|patch|>`` x n ``<|image_end|>``; the
model's ``image_token_index`` is ``<|patch|>``; pixels come back **bf16** ``[tiles, 3, s, s]``
(the image processor normalises in bf16).

transformers 5.24 bug worked around by `build_model` (the stock class otherwise untouched):
``Llama4ForConditionalGeneration.forward`` reads ``image_outputs`` from its language model's
output, which has no such field (AttributeError on every call, ``return_dict=False`` too): the
builder gives that output the field (None). The vision tower and projector hold bf16 weights (the
pixels are bf16; Module.to(bfloat16) is not used: it would drop the imaginary part of the complex
vision rope table ``freqs_ci``, which a bf16 checkpoint keeps complex64).
"""

from __future__ import annotations

import copy
import functools

from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["LLAMA4_TOKENS", "LLAMA4_TILE", "LLAMA4_MAX_TILES", "build_processor", "build_model"]

LLAMA4_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|header_start|>", "<|header_end|>", "<|eom|>", "<|eot|>",
                 "<|python_start|>", "<|python_end|>", "<|finetune_right_pad|>", "<|image_start|>", "<|image_end|>",
                 "<|patch|>", "<|tile_x_separator|>", "<|tile_y_separator|>", "<|image|>")
LLAMA4_TILE = 56  # tiny tiles: 56x56 = 4x4 patches of 14, pixel shuffle 0.5 -> 4 tokens per tile
LLAMA4_MAX_TILES = 4


@functools.lru_cache(maxsize=None)
def _llama4_tokenizer():
    from transformers.models.llama4.processing_llama4 import chat_template

    return offline_tokenizer(LLAMA4_TOKENS, bos="<|begin_of_text|>", eos="<|eot|>", pad="<|finetune_right_pad|>",
                             add_bos=True, template=chat_template)


def build_processor():
    """The stock ``Llama4Processor`` (patch 14, pixel shuffle 0.5, as published) around the stock
    ``Llama4ImageProcessor`` at `LLAMA4_TILE` tiles (at most `LLAMA4_MAX_TILES`) and the offline tokenizer
    (adds the BOS) with the published template; a fresh object."""
    import transformers

    tok = copy.deepcopy(_llama4_tokenizer())
    ip = transformers.Llama4ImageProcessor(size={"height": LLAMA4_TILE, "width": LLAMA4_TILE},
                                           max_patches=LLAMA4_MAX_TILES)
    return transformers.Llama4Processor(image_processor=ip, tokenizer=tok, patch_size=14, pixel_shuffle_ratio=0.5,
                                        chat_template=tok.chat_template)


def build_model():
    """Text: 4 layers (chunked / full attention alternating, layers 1 and 3 MoE of 2 experts, 1 and
    3 NoPE), hidden 64; vision hidden 32, 1 layer, 56x56 tiles, pixel shuffle 0.5. The vision
    model and projector hold bf16 weights (the processor's pixels are bf16, as the checkpoint's
    weights), the text model fp32."""
    import types

    import torch
    import transformers

    tok = _llama4_tokenizer()
    pad, bos, eot, patch, start, end = ids(tok, "<|finetune_right_pad|>", "<|begin_of_text|>", "<|eot|>",
                                            "<|patch|>", "<|image_start|>", "<|image_end|>")
    vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=128,
                  image_size=LLAMA4_TILE, patch_size=14, pixel_shuffle_ratio=0.5, projector_input_dim=64,
                  projector_output_dim=64, vision_output_dim=64)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=64, intermediate_size_mlp=128,
                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=2,
                interleave_moe_layer_step=2, no_rope_layer_interval=2, max_position_embeddings=4096,
                pad_token_id=pad, bos_token_id=bos, eos_token_id=eot)
    cfg = transformers.Llama4Config(vision_config=vision, text_config=text, image_token_index=patch,
                                    boi_token_index=start, eoi_token_index=end)
    model = transformers.Llama4ForConditionalGeneration._from_config(cfg, attn_implementation="eager",
                                                                     dtype=torch.float32)
    for part in (model.vision_model, model.multi_modal_projector):  # not Module.to: it would drop the imaginary
        for t in [*part.parameters(), *(b for b in part.buffers() if b.is_floating_point())]:  # part of the complex
            t.data = t.data.to(torch.bfloat16)  # vision rope table (freqs_ci), as a bf16 checkpoint keeps it complex64
    lm = model.language_model
    forward = type(lm).forward

    def with_image_outputs(self, *args, **kwargs):  # transformers 5.24: see the module doc
        out = forward(self, *args, **kwargs)
        if not hasattr(out, "image_outputs"):
            out.image_outputs = None
        return out

    lm.forward = types.MethodType(with_image_outputs, lm)
    return model
