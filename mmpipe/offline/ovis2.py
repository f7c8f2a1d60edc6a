"""Offline fixtures for Ovis2 (transformers 5.24 ``ovis2``): the stock ``Ovis2Processor`` around
the real ``Ovis2ImageProcessorPil`` at tiny settings, and a tiny random
``Ovis2ForConditionalGeneration`` (fp32), built locally with no download and no torchvision.
mmpipe has no family table for Ovis2: it takes the generic path (`mmpipe.media.processor_encode`)::

    >>> proc = build_ovis2_processor()                      # doctest: +SKIP
    >>> model = build_ovis2_model()                         # doctest: +SKIP

Facts from the published conversion (transformers' ``convert_ovis2_weights_to_hf.py``, which made
the ``thisisiron/Ovis2-*-hf`` checkpoints from AIDC-AI/Ovis2-*; the hub files themselves are not
reachable here): the tokenizer is the Qwen2.5 one with six special tokens added in this order,
``<IMG_ATOM>`` ``<IMG_START>`` ``<IMG_GRID>`` ``<IMG_COL>`` ``<IMG_ROW>`` ``<IMG_END>`` (ids
151665..151670: the config's ``image_token_id`` is ``<IMG_ATOM>``, its
``visual_indicator_token_ids`` the other five in that order); the chat template (`CHAT_TEMPLATE`,
written as published) always opens with a fixed system turn, writes each image as ``<image>``
plus a newline and has no ``{% generation %}`` tags. The processor replaces each plain-text
``<image>`` by ``<IMG_START>`` + ``image_seq_length`` x ``<IMG_ATOM>`` + ``<IMG_GRID>`` (+ one
block of atoms per tile, ``<IMG_COL>`` / ``<IMG_ROW>`` between them, when the image is cut into
more than one tile) + ``<IMG_END>``; ``<image>`` itself is no token of the vocabulary. The image
processor there: ``crop_to_patches=True``, 448x448 tiles (a thumbnail first when an image has
several tiles); ``pixel_values`` float32 ``[tiles of every image, 3, 448, 448]``; its ``grids``
output is dropped by the processor. The tokenizer here is mmpipe's offline BPE
(`mmpipe.offline.tokenizer`) in place of Qwen2.5's, so the ids differ; nothing was reconstructed.

Tiny settings here: 56x56 tiles, at most 4 per image (``max_patches``; published: 12); vision
patch 14 (4x4 patches) with ``hidden_stride`` 2 -> 4 visual tokens per tile
(``image_seq_length`` 4; published: 256), vision hidden 32, 1 layer, visual vocabulary 64;
text: Qwen2, hidden 64, 2 layers.
"""

from __future__ import annotations

import copy
import functools

__all__ = ["OVIS2_NAMES", "OVIS2_TOKENS", "CHAT_TEMPLATE", "TILE", "build_ovis2_processor", "build_ovis2_model"]

OVIS2_NAMES = ("ovis2",)
# the special tokens the conversion adds, in its order (ids 151665.. in the published vocabulary)
OVIS2_TOKENS = ("<IMG_ATOM>", "<IMG_START>", "<IMG_GRID>", "<IMG_COL>", "<IMG_ROW>", "<IMG_END>")
# the published chat template (convert_ovis2_weights_to_hf.py CHAT_TEMPLATE)
CHAT_TEMPLATE = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}"
    "{{ message['content'] }}"
    "{% else %}"
    "{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}"
    "{{ '<image>\n' }}"
    "{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}"
    "{% endif %}"
    "{% endfor %}"
    "{% endif %}"
    "{{'<|im_end|>\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{'<|im_start|>assistant\n' }}"
    "{% endif %}"
)
TILE = 56  # tiny tiles: 56x56 pixels, 4x4 patches of 14, hidden_stride 2 -> 4 tokens per tile
MAX_TILES = 4
IMAGE_SEQ_LENGTH = 4


@functools.lru_cache(maxsize=None)
def _tokenizer():
    """The offline BPE (Qwen special tokens, pad ``<|endoftext|>``, eos ``<|im_end|>``, as
    Qwen2.5's) with the six Ovis2 tokens added as the conversion adds them, and its template."""
    from mmpipe.compat import extra_special_tokens_key
    from mmpipe.offline.tokenizer import build_tokenizer

    tok = build_tokenizer()
    tok.add_special_tokens({extra_special_tokens_key(): list(OVIS2_TOKENS)}, **_keep_extra_tokens())
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _keep_extra_tokens() -> dict:
    """``add_special_tokens``' keyword that keeps the special tokens already there (renamed in 5.x)."""
    from mmpipe.compat import is_transformers_5

    return {"replace_extra_special_tokens" if is_transformers_5() else "replace_additional_special_tokens": False}


def build_ovis2_processor(name: str = "ovis2", **image_kwargs):
    """A real ``Ovis2Processor`` around the real ``Ovis2ImageProcessorPil`` (tiny: 56x56 tiles,
    ``crop_to_patches``, at most 4 tiles per image; ``image_kwargs`` override) and the offline
    tokenizer with the checkpoints' tokens; ``image_seq_length`` 4. A fresh object."""
    _check(name)
    import transformers

    kw = dict(crop_to_patches=True, size={"height": TILE, "width": TILE}, max_patches=MAX_TILES, **image_kwargs)
    tok = copy.deepcopy(_tokenizer())
    return transformers.Ovis2Processor(image_processor=transformers.Ovis2ImageProcessorPil(**kw), tokenizer=tok,
                                       chat_template=CHAT_TEMPLATE, image_seq_length=IMAGE_SEQ_LENGTH)


def _check(name: str) -> None:
    """`ArgumentError` for an unknown name or a transformers without the Ovis2 PIL image processor."""
    import transformers

    from mmpipe.errors import ArgumentError

    if name not in OVIS2_NAMES:
        raise ArgumentError(f"unknown offline Ovis2 processor {name!r}; use one of {OVIS2_NAMES}")
    if not hasattr(transformers, "Ovis2ImageProcessorPil"):
        raise ArgumentError(f"{name}: transformers {transformers.__version__} has no Ovis2ImageProcessorPil (it came "
                            "with transformers 5); install transformers>=5 to build the offline Ovis2 fixtures")


def _config():
    import transformers

    tok = _tokenizer()
    ids = [tok.convert_tokens_to_ids(t) for t in OVIS2_TOKENS]
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                pad_token_id=tok.pad_token_id)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=TILE,
                  patch_size=14, hidden_stride=2, vocab_size=64)
    return transformers.Ovis2Config(text_config=text, vision_config=vision, image_token_id=ids[0],
                                    visual_indicator_token_ids=ids[1:], vocab_size=len(tok), hidden_size=64)


@functools.lru_cache(maxsize=2)
def _cached_model(seed: int):
    from mmpipe.offline.seeded import seeded_model

    return seeded_model("Ovis2ForConditionalGeneration", _config(), seed, attn_implementation="eager").eval()


def build_ovis2_model(name: str = "ovis2", seed: int = 0):
    """A tiny random ``Ovis2ForConditionalGeneration`` matching `build_ovis2_processor` (module
    doc: sizes), fp32, eval, eager attention; a deep copy of a cached model per call."""
    _check(name)
    return copy.deepcopy(_cached_model(int(seed)))
