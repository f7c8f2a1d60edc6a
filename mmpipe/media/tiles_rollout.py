"""The ``tiles`` kind's vLLM prompt (Gemma 3, InternVL, LLaVA-OneVision): what
`mmpipe.media.tiles.vllm_prompt` hands a row to (`mmpipe.rollout.inputs.to_vllm_prompts` asks
every row's strategy).

vLLM takes a tiled model's prompt as the chat template renders it - ONE image token per image
(the family's ``image_token``: ``<start_of_image>``, ``<IMG_CONTEXT>``, ``<image>``) - plus the
ORIGINAL images, and writes each image's text itself after tiling the image again (InternVL's
thumbnail, LLaVA-OneVision's base tile and unpadded feature count, Gemma 3's pan-and-scan crops
all come from the original image). A training row holds that text expanded, so its prompt is
the row's text with each image's text put back to the image token, tokenized
(``prompt_token_ids``), and its source images.

The source images come from the row (``pixels="source"``: its stored files), from ``images=``
(the images it was encoded from: PIL, bytes, ``{"bytes"}``, paths), or - where the family's
``vllm_tile_prompts`` says the stored tile re-creates the prompt (Gemma 3 without
pan-and-scan: one tile per image, the whole image resized) - from the row's uint8 tiles.
``mm_processor_kwargs`` carries the image options the family's vLLM processor takes
(`mmpipe.families.ModelFamily.vllm_processor_kwargs`: Gemma 3's pan-and-scan settings, as the
row was encoded); none for InternVL / LLaVA-OneVision, whose vLLM processors take the
checkpoint's own settings.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.errors import ArgumentError, ImageError, InputError, UnsupportedProcessorError
from mmpipe.families import ModelFamily, family_of
from mmpipe.images.load import load_image, to_rgb_image, upright
from mmpipe.images.tiles import effective_image_processor, with_images_kwargs


def vllm_prompt(r, processor: Any, *, images: Optional[list] = None, index: int = 0) -> dict:
    """One tiles-kind row -> its vLLM prompt dict: ``"prompt_token_ids"`` (one ``image_token``
    per image, the rest of the row's tokens as they are), and for a row with images
    ``"multi_modal_data": {"image": [PIL RGB per image]}`` (the source images, upright, see the
    module doc) and, where the family's vLLM processor takes image options,
    ``"mm_processor_kwargs"``. ``processor``: the one the row was encoded with (its tokenizer and
    image texts); ``images``: the images the row was encoded from, or None."""
    fam, pfam = r.fam, _processor_family(processor)
    if pfam is None or pfam.kind != "tiles":
        raise ArgumentError(f"to_vllm_prompts needs the tiled family's processor for {fam.name} rows, got "
                            f"{type(processor).__name__}")
    if not fam.accepts(pfam.name):
        raise InputError(f"row encoded for {r.family!r}, prompted with a {pfam.name} processor", row=index,
                         column="family", stage="rollout", fix="use the processor that encoded the rows")
    ids = [int(t) for t in r.input_ids]
    if not r.num_images:
        return {"prompt_token_ids": ids}
    pictures = _source_images(r, fam, images, index)
    tok = processor.tokenizer
    text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ip = with_images_kwargs(effective_image_processor(processor), r.images_kwargs)
    module = fam.images()
    pieces = [module.expand_placeholder(int(h), int(w), processor, ip) for h, w in r.image_hw]
    prompt_text = _one_token_per_image(text, pieces, fam.image_token, index)
    out = np.asarray(tok(prompt_text, add_special_tokens=False)["input_ids"], np.int64)
    starts = np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.int64)
    if not np.array_equal(starts, r.input_ids):  # the row's text must tokenize back to its ids
        raise InputError("the row's ids do not decode to a text that tokenizes back to them", row=index,
                         column="input_ids", stage="rollout", fix="encode the rows with this processor")
    prompt = {"prompt_token_ids": [int(t) for t in out], "multi_modal_data": {"image": pictures}}
    kwargs = _processor_kwargs(r, fam, ip, index)
    if kwargs:
        prompt["mm_processor_kwargs"] = kwargs
    return prompt


def _processor_family(processor: Any) -> Optional[ModelFamily]:
    """The family of a processor (None for anything else: a spec, a name, None)."""
    if not hasattr(processor, "image_processor"):
        return None
    try:
        return family_of(processor)
    except UnsupportedProcessorError:
        return None


def _source_images(r, fam: ModelFamily, given: Optional[list], i: int) -> list:
    """The row's images as vLLM takes them (upright RGB PIL), checked against its sizes."""
    from PIL import Image

    if given is not None:
        one = isinstance(given, (str, bytes, dict))
        if one or len(given) != r.num_images:
            raise InputError(f"images= gives {1 if one else len(given)} image(s) for a row of {r.num_images}",
                             row=i, column="images", stage="rollout", expected=f"a list of {r.num_images}",
                             fix="pass each row's images as a list, in order")
        values = list(given)
    elif r.image_sources is not None:
        values = [{"bytes": bytes(b), "path": None} for b in r.image_sources]
    elif fam.vllm_tile_prompts and r.pixel_values_u8 is not None and bool((r.tiles_per_image == 1).all()):
        # one tile per image, the whole image resized: vLLM resizes it again to its own size (no change)
        return [Image.fromarray(np.ascontiguousarray(t)) for t in r.pixel_values_u8]
    else:
        held = "uint8 tiles" if r.pixel_values_u8 is not None else "no pixels (layout-only)"
        raise InputError(f"vLLM tiles each {fam.name} image again from the original image, and this row "
                         f"holds {held}, not its images ({r.tiles_per_image.tolist()} tile(s) per image)",
                         row=i, column="image_sources", stage="rollout", expected="the row's source images",
                         found=held, fix="encode rollout rows with pixels='source', or pass images= (each "
                                         "row's images, as encoded) to to_vllm_prompts; a collated "
                                         "BatchedMultiModalInputs holds tiles only: pass the rows")
    out = []
    for k, value in enumerate(values):
        where = f"row {i}, image {k}"
        rgb = to_rgb_image(upright(load_image(value, where=where)))
        want = tuple(int(x) for x in r.image_hw[k])
        if (rgb.height, rgb.width) != want:
            raise ImageError(f"image {k} is {rgb.height}x{rgb.width} (upright) but the row was encoded from a "
                             f"{want[0]}x{want[1]} image", where=where, expected=str(want),
                             found=str((rgb.height, rgb.width)), fix="pass the images each row was encoded "
                                                                     "from, in order")
        out.append(rgb)
    return out


def _processor_kwargs(r, fam: ModelFamily, ip, i: int) -> dict:
    """The image options vLLM's processor for ``fam`` takes, as the row was encoded."""
    extra = sorted(set(r.images_kwargs or {}) - set(fam.vllm_processor_kwargs))
    if extra:
        raise InputError(f"the row was encoded with images_kwargs {extra}, which vLLM's {fam.name} processor "
                         "does not take (it uses the checkpoint's image processor settings)", row=i,
                         column="images_kwargs", stage="rollout",
                         fix="put these settings in the checkpoint's preprocessor_config.json and encode "
                             "without images_kwargs")
    return {k: getattr(ip, k) for k in fam.vllm_processor_kwargs if hasattr(ip, k)}


def _one_token_per_image(text: str, pieces: list, token: str, row: Optional[int]) -> str:
    """``text`` with each image's text (in order) put back to ``token``."""
    out, at = [], 0
    for k, piece in enumerate(pieces):
        j = text.find(piece, at)
        if j < 0:
            raise InputError(f"image {k}'s text is not in the row", row=row, column="input_ids",
                             stage="rollout", fix="encode the rows with this processor")
        out += [text[at:j], token]
        at = j + len(piece)
    return "".join(out + [text[at:]])
