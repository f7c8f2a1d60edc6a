"""Offline fixtures for Gemma 3 as a native tiled family (`mmpipe.families.GEMMA3`): its real
transformers processor and a tiny ``Gemma3ForConditionalGeneration``, built locally with no
download (`mmpipe.offline.other_vlms` makes both)::

    >>> proc = build_gemma3_processor()                      # doctest: +SKIP
    >>> model = build_gemma3_model()                         # doctest: +SKIP

- ``build_gemma3_processor()``: 32x32 tiles, 4 ``<image_soft_token>`` per tile (matching the
  tiny model: SigLIP 32x32 / patch 8, pooled to 2x2), fast in tests.
- ``build_gemma3_processor(real=True)``: the real checkpoints' image settings (896x896 tiles,
  256 soft tokens per tile, bilinear, mean/std 0.5): the sizes the bytes and speed figures use.
- ``save_gemma3_checkpoint(path)``: a vLLM-loadable tiny checkpoint + processor (head_dim 64 for
  vLLM's CPU attention; the tokenizer holds ``"\n"`` .. ``"\n\n\n\n"`` as tokens, as Gemma's
  does and as vLLM's ``gemma3_mm`` looks them up; the hub's ``vision_tower.vision_model.*`` keys).
"""

from __future__ import annotations

from mmpipe.errors import ArgumentError
from mmpipe.offline.other_vlms import build_foreign_model, build_foreign_processor
from mmpipe.offline.seeded import seeded_model
from mmpipe.offline.tf_lines import pil_image_processor

__all__ = ["GEMMA3_REAL_TILE", "GEMMA3_REAL_TOKENS", "build_gemma3_processor", "build_gemma3_model",
           "save_gemma3_checkpoint"]

GEMMA3_REAL_TILE = 896  # google/gemma-3-*-it preprocessor_config.json: size 896x896
GEMMA3_REAL_TOKENS = 256  # processor_config.json: image_seq_length


def build_gemma3_processor(*, real: bool = False, tokenizer: str = "offline"):
    """A real ``Gemma3Processor`` (offline tokenizer with the Gemma 3 image tokens, the PIL image
    processor); ``real=True``: the real checkpoints' tile size and token count; ``tokenizer="gemma"``:
    a tokenizer built like the published one and the published chat template
    (`mmpipe.offline.gemma_tokenizer`: SentencePiece-style BPE that adds its BOS, the template writing
    one too; transformers 5). A fresh object."""
    proc = build_foreign_processor("gemma3")
    if tokenizer == "gemma":
        import transformers

        from mmpipe.offline.gemma_tokenizer import build_gemma_tokenizer
        from mmpipe.offline.published_templates import published_template

        proc = transformers.Gemma3Processor(image_processor=proc.image_processor, tokenizer=build_gemma_tokenizer(),
                                            chat_template=published_template("gemma3"), image_seq_length=4)
    elif tokenizer != "offline":
        raise ArgumentError(f"tokenizer must be 'offline' or 'gemma', got {tokenizer!r}")
    if real:
        proc.image_processor = pil_image_processor("Gemma3ImageProcessorPil")(
            size={"height": GEMMA3_REAL_TILE, "width": GEMMA3_REAL_TILE})
        proc.image_seq_length = GEMMA3_REAL_TOKENS
        tok = proc.tokenizer
        proc.full_image_sequence = f"\n\n{tok.boi_token}{tok.image_token * GEMMA3_REAL_TOKENS}{tok.eoi_token}\n\n"
    return proc


def build_gemma3_model(seed: int = 0):
    """The tiny Gemma 3 model matching `build_gemma3_processor()` (text hidden 64, 2 layers: one
    sliding-window, one global; SigLIP hidden 32, 1 layer), fp32, eval, eager attention."""
    return build_foreign_model("gemma3", seed=seed)


def save_gemma3_checkpoint(path, *, seed: int = 0):
    """Write a tiny vLLM-loadable ``Gemma3ForConditionalGeneration`` (text hidden 64, 2 layers,
    head_dim 64; SigLIP hidden 32, 1 layer, no pooling head) and its ``Gemma3Processor`` (32x32
    tiles, 4 soft tokens, newline tokens added) to ``path``; returns it as a ``Path``."""
    from pathlib import Path

    import transformers
    from safetensors.torch import load_file, save_file
    from tokenizers import AddedToken

    proc = build_gemma3_processor()
    tok = proc.tokenizer
    tok.add_tokens([AddedToken("\n" * k, normalized=False, special=False) for k in (1, 2, 3, 4)])
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<image_soft_token>", "<start_of_image>", "<end_of_image>")}
    cfg = transformers.Gemma3Config(
        text_config=dict(model_type="gemma3_text", vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                         sliding_window=8, layer_types=["sliding_attention", "full_attention"],
                         max_position_embeddings=4096, pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id),  # not Gemma's 1 / 2 ('"', '#' here)
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, patch_size=8, image_size=32, vision_use_head=False),
        mm_tokens_per_image=4, image_token_index=ids["<image_soft_token>"], boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"])
    model = seeded_model("Gemma3ForConditionalGeneration", cfg, seed)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    proc.save_pretrained(path)
    weights = path / "model.safetensors"  # the hub's layout, what vLLM maps: vision_tower.vision_model.*
    state = {("vision_tower.vision_model." + k[len("vision_tower."):] if k.startswith("vision_tower.") else k): v
             for k, v in load_file(str(weights)).items()}
    save_file(state, str(weights), metadata={"format": "pt"})
    return path


def offline_processor(family: str, *, min_pixels: int | None = None, max_pixels: int | None = None):
    """`mmpipe.offline.build_processor` for Gemma 3 (`mmpipe.offline.tokenizer.OWN_BUILDERS`):
    fixed-size tiles, so pixel bounds do not apply."""
    if min_pixels is not None or max_pixels is not None:
        raise ArgumentError(f"{family} resizes to fixed-size tiles: min_pixels / max_pixels do not apply; set size "
                            "on the processor's image processor")
    return build_gemma3_processor()


def offline_model(family: str, seed: int = 0):
    """`mmpipe.offline.build_model` for Gemma 3."""
    return build_gemma3_model(seed)
