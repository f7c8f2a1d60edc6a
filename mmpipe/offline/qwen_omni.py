"""Offline fixtures for Qwen2.5-Omni's thinker (transformers ``qwen2_5_omni``): images and audio on
the generic path, in the main environment (the video processor needs torchvision, so these
processors take no videos here; ``build_processor(videos=True)`` has it, in the vision and vLLM
environments). ``save_checkpoint`` writes a tiny checkpoint vLLM serves (``Qwen2_5OmniForConditionalGeneration``: its
thinker), with the published weight names.

Published facts written into the builders: ``Qwen2_5OmniProcessor`` around
``Qwen2VLImageProcessor`` (patch 14, merge 2, temporal patch 2) and ``WhisperFeatureExtractor``
(128 mel bins, 16 kHz, hop 160, each clip padded to 30 s: ``input_features`` [A, 128, 3000],
``feature_attention_mask`` [A, 3000]); audio tokens per clip
``((frames - 1) // 2 + 1 - 2) // 2 + 1``; the checkpoint's chat template
(`QWEN2_5_OMNI_CHAT_TEMPLATE`: the default system turn, ``<|vision_bos|><|IMAGE|><|vision_eos|>``
per image, ``<|audio_bos|><|AUDIO|><|audio_eos|>`` per clip); the thinker's M-RoPE
(``mrope_section``) with audio positions at 25 per second (TMRoPE), computed by the model's own
``get_rope_index``.
"""

from __future__ import annotations

import copy
import functools

from mmpipe.compat import is_transformers_5
from mmpipe.offline.tf_lines import classes_by_name, pil_image_processor, rope_config_fields
from mmpipe.offline.vision_env_vlms import ids, offline_tokenizer

__all__ = ["QWEN2_5_OMNI_CHAT_TEMPLATE", "QWEN2_5_OMNI_TOKENS", "build_processor", "build_model", "checkpoint_model",
           "save_checkpoint"]

QWEN2_5_OMNI_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
                       "<|vision_bos|>", "<|vision_eos|>", "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>")
# the published chat_template.json of Qwen/Qwen2.5-Omni-7B (and -3B), as it is
QWEN2_5_OMNI_CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}{% set image_count = namespace(value=0) %}"
    "{% set video_count = namespace(value=0) %}{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
    "{% endif %}<|vision_bos|><|IMAGE|><|vision_eos|>"
    "{% elif content['type'] == 'audio' or 'audio' in content or 'audio_url' in content %}"
    "{% set audio_count.value = audio_count.value + 1 %}{% if add_audio_id %}Audio {{ audio_count.value }}: "
    "{% endif %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_bos|><|VIDEO|><|vision_eos|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MIN_PIXELS, MAX_PIXELS = 56 * 56, 112 * 112  # tiny: 4..16 merged tokens per image


@functools.lru_cache(maxsize=None)
def _tokenizer():
    named = dict(image_token="<|IMAGE|>", audio_token="<|AUDIO|>", video_token="<|VIDEO|>",
                 vision_bos_token="<|vision_bos|>", vision_eos_token="<|vision_eos|>",
                 audio_bos_token="<|audio_bos|>", audio_eos_token="<|audio_eos|>")
    return offline_tokenizer(QWEN2_5_OMNI_TOKENS, eos="<|im_end|>", pad="<|endoftext|>", named=named,
                             template=QWEN2_5_OMNI_CHAT_TEMPLATE)


def build_processor(videos: bool = False):
    """The stock ``Qwen2_5OmniProcessor``: the PIL ``Qwen2VLImageProcessor`` at tiny pixel bounds,
    the stock ``WhisperFeatureExtractor`` (128 mel bins), the offline tokenizer with the
    checkpoint's special tokens and `QWEN2_5_OMNI_CHAT_TEMPLATE`; a fresh object. No video
    processor unless ``videos`` (then the stock class with ``Qwen2VLVideoProcessor`` at the same
    pixel bounds: its class check needs torchvision, so the vision / vLLM environments only)."""
    import transformers

    ip = pil_image_processor("Qwen2VLImageProcessorPil")(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    fe = transformers.WhisperFeatureExtractor(feature_size=128)
    if videos:
        vp = transformers.Qwen2VLVideoProcessor(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
        return transformers.Qwen2_5OmniProcessor(image_processor=ip, video_processor=vp, feature_extractor=fe,
                                                 tokenizer=copy.deepcopy(_tokenizer()),
                                                 chat_template=QWEN2_5_OMNI_CHAT_TEMPLATE)
    return _class()(image_processor=ip, feature_extractor=fe, tokenizer=copy.deepcopy(_tokenizer()),
                    chat_template=QWEN2_5_OMNI_CHAT_TEMPLATE)


def no_video_class(base: type, extra: dict = None, *, module: str = __name__) -> type:
    """An Omni processor class ``base`` without its video processor (whose class check needs
    torchvision): ``ProcessorMixin`` takes the sub-processors from the ``__init__`` signature, so
    this one lists image processor, feature extractor and tokenizer; the stock class stays in the MRO
    (`mmpipe.families.processor_class_name`). ``extra``: further class attributes; ``module``: the
    module that builds it once and finds it by name (`classes_by_name`: pickle looks it up there)."""

    def __init__(self, image_processor=None, feature_extractor=None, tokenizer=None, chat_template=None):
        # the stock __init__ passes a video processor positionally: call the mixin's, then set what it sets
        super(base, self).__init__(image_processor, feature_extractor, tokenizer, chat_template=chat_template)
        for name in ("image", "audio", "video"):
            setattr(self, f"{name}_token", getattr(tokenizer, f"{name}_token"))
            setattr(self, f"{name}_token_id", getattr(tokenizer, f"{name}_token_id"))
        for name in ("vision_bos", "vision_eos", "audio_bos", "audio_eos"):
            setattr(self, f"{name}_token", getattr(tokenizer, f"{name}_token"))

    attrs = {"__init__": __init__, "__module__": module, **(extra or {})}
    if not is_transformers_5():  # 4.x's ProcessorMixin takes its sub-processors from this list
        attrs["attributes"] = ["image_processor", "feature_extractor", "tokenizer"]
        # 4.x's placeholder expansion reads the video processor's merge size on every call
        attrs["video_processor"] = property(lambda self: _NoVideos(self.image_processor.merge_size))
    return type(f"NoVideo{base.__name__}", (base,), attrs)


class _NoVideos:
    """What a 4.x Omni processor without a video processor reads as its ``video_processor``: the
    image processor's ``merge_size`` (4.x's placeholder expansion reads it on every call); calling
    it for videos is an ArgumentError naming the fix."""

    def __init__(self, merge_size: int):
        self.merge_size = merge_size

    def __call__(self, *args, **kwargs):
        from mmpipe.errors import ArgumentError

        raise ArgumentError("this offline Omni processor has no video processor (its class check needs "
                            "torchvision): build_processor(videos=True) in an environment with torchvision")


@functools.lru_cache(maxsize=None)
def _class() -> type:
    import transformers

    return no_video_class(transformers.Qwen2_5OmniProcessor)


# the class pickles by name (spawn DataLoader workers, pickled encoders)
__getattr__ = classes_by_name(__name__, lambda name: _class() if name == "NoVideoQwen2_5OmniProcessor" else None)


def build_model(head_dim: int = 16):
    """A tiny ``Qwen2_5OmniThinkerForConditionalGeneration``: text hidden 64 (4 heads of 16,
    ``mrope_section`` [2, 3, 3]), 2 layers; vision depth 2 (patch 14, merge 2, out 64); audio
    encoder 2 layers of width 32 (128 mel bins, output 64); fp32, eager attention. ``head_dim`` 64:
    hidden 128 (2 heads of 64, ``mrope_section`` [8, 12, 12]), the text side vLLM's CPU attention takes."""
    import torch
    import transformers

    tok = _tokenizer()
    audio_id, image_id, video_id, a_bos, a_eos, v_bos, v_eos = ids(
        tok, "<|AUDIO|>", "<|IMAGE|>", "<|VIDEO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>",
        "<|vision_eos|>")
    heads = 4 if head_dim == 16 else 2
    width = heads * head_dim
    section = [2, 3, 3] if head_dim == 16 else [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]
    text = dict(vocab_size=len(tok), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=2,
                num_attention_heads=heads, num_key_value_heads=2, max_position_embeddings=4096,
                **rope_config_fields({"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": section}),
                pad_token_id=tok.pad_token_id)
    if is_transformers_5():  # as before 4.57 support: older 5.x lines (the vLLM environment's) read rope_scaling
        text["rope_scaling"] = {"type": "default", "mrope_section": section}
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=width,
                  fullatt_block_indexes=[1], window_size=56)
    audio = dict(d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=128,
                 output_dim=width, n_window=100, max_source_positions=1500)
    cfg = transformers.Qwen2_5OmniThinkerConfig(
        text_config=text, vision_config=vision, audio_config=audio, audio_token_index=audio_id,
        image_token_index=image_id, video_token_index=video_id, audio_start_token_id=a_bos,
        audio_end_token_id=a_eos, vision_start_token_id=v_bos, vision_end_token_id=v_eos)
    return transformers.Qwen2_5OmniThinkerForConditionalGeneration._from_config(
        cfg, attn_implementation="eager", dtype=torch.float32).eval()


def checkpoint_model(seed: int = 0):
    """The thinker `save_checkpoint` saves: `build_model` at ``head_dim`` 64, seeded with ``seed``
    (the same weights every call, without reading the checkpoint back)."""
    from mmpipe.offline.seeded import seeded

    return seeded(int(seed), build_model, head_dim=64)


def save_checkpoint(path, *, seed: int = 0):
    """A tiny Qwen2.5-Omni checkpoint vLLM loads (``Qwen2_5OmniForConditionalGeneration``, whose
    thinker it serves): `build_model` at ``head_dim`` 64 seeded with ``seed``, its weights under
    ``thinker.`` as the published checkpoints hold them, a ``Qwen2_5OmniConfig`` with the
    thinker's config and no audio output, and the processor with its video processor
    (`build_processor` ``videos=True``: torchvision's Python part must import). Returns the path."""
    import json
    from pathlib import Path

    import torch
    import transformers
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model = checkpoint_model(seed)
    tensors = {_published_name(k): v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    cfg = transformers.Qwen2_5OmniConfig(thinker_config=model.config.to_dict(), enable_audio_output=False)
    cfg.architectures = ["Qwen2_5OmniForConditionalGeneration"]
    # the thinker's lm_head is its own (the thinker config says so); vLLM reads the text config's flag,
    # True by default, and would tie the head to the embeddings
    cfg.thinker_config.text_config.tie_word_embeddings = False
    cfg.save_pretrained(path)
    gen = {"eos_token_id": [_tokenizer().convert_tokens_to_ids("<|im_end|>"), _tokenizer().pad_token_id],
           "pad_token_id": _tokenizer().pad_token_id}
    (path / "generation_config.json").write_text(json.dumps(gen))
    build_processor(videos=True).save_pretrained(path)
    return path


def _published_name(name: str) -> str:
    """A thinker weight name -> the published checkpoint's (what vLLM maps): transformers 5.24's
    ``model.audio_tower.`` / ``model.visual.`` / ``model.language_model.`` / ``lm_head.`` become
    ``thinker.audio_tower.`` / ``thinker.visual.`` / ``thinker.model.`` / ``thinker.lm_head.`` (the
    inverse of its ``conversion_mapping`` for this class); older transformers (5.19, the vLLM
    environment's) name them as published already, under ``thinker.`` then."""
    for ours, published in (("model.audio_tower.", "thinker.audio_tower."), ("model.visual.", "thinker.visual."),
                            ("model.language_model.", "thinker.model."), ("lm_head.", "thinker.lm_head."),
                            ("audio_tower.", "thinker.audio_tower."), ("visual.", "thinker.visual."),
                            ("model.", "thinker.model.")):
        if name.startswith(ours):
            return published + name[len(ours):]
    from mmpipe.errors import ArgumentError

    raise ArgumentError(f"unexpected thinker weight {name!r}")
