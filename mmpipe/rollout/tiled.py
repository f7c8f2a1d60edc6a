"""vLLM prompts for the tiled families' rows (`mmpipe.records.tiled.TiledInputs`; Gemma 3).

vLLM's Gemma 3 (``gemma3_mm``) takes the prompt as the chat template renders it - ONE
``<start_of_image>`` per image - plus the images, and writes each image's text itself (the
processor's ``"\\n\\n<start_of_image>" + soft tokens + "<end_of_image>\\n\\n"``). A training row
holds that text expanded, so its prompt is the row's text with each image's text put back to
``<start_of_image>``, tokenized (``prompt_token_ids``), and the row's stored tile per image (the
image as the processor resized it: resizing it again to the same size changes nothing)::

    prompts = tiled_vllm_prompts(rows, processor)   # what to_vllm_prompts gives for tiled rows
    outs = llm.generate(prompts, sampling_params)

Rows whose images were panned and scanned (more than one tile per image) are refused: the
crops come from the original image, which a row does not keep.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import get_family, tiled_family_of
from mmpipe.records.tiled import TiledBatch, TiledInputs, is_tiled_row

__all__ = ["tiled_vllm_prompts", "is_tiled_input"]


def is_tiled_input(rows_or_batch: Any) -> bool:
    """Whether ``rows_or_batch`` (a `TiledBatch`, a `TiledInputs`, or a list of rows) holds tiled rows."""
    if isinstance(rows_or_batch, (TiledBatch, TiledInputs)):
        return True
    return isinstance(rows_or_batch, (list, tuple)) and bool(rows_or_batch) and is_tiled_row(rows_or_batch[0])


def _rows(rows_or_batch: Any) -> list[TiledInputs]:
    if isinstance(rows_or_batch, TiledBatch):
        from mmpipe.batching.tiled import unbatch_tiled

        return unbatch_tiled(rows_or_batch)
    if isinstance(rows_or_batch, TiledInputs):
        return [rows_or_batch]
    return [r if isinstance(r, TiledInputs) else TiledInputs.from_dict(r, i) for i, r in enumerate(rows_or_batch)]


def tiled_vllm_prompts(rows_or_batch: Any, processor) -> list[dict]:
    """Tiled rows (or a `TiledBatch`) -> vLLM prompt dicts, one per row, in order:
    ``"prompt_token_ids"`` (one ``image_token`` per image, the rest of the row's tokens as they
    are), and for rows with images ``"multi_modal_data": {"image": [PIL RGB per image]}`` (the
    stored tile) and ``"mm_processor_kwargs"`` (pan-and-scan off). ``processor``: the one the
    rows were encoded with (its tokenizer and image texts)."""
    from PIL import Image

    fam = tiled_family_of(processor)
    if fam is None:
        raise ArgumentError(f"tiled_vllm_prompts needs the tiled family's processor, got {type(processor).__name__}")
    tok, module = processor.tokenizer, fam.images()
    prompts = []
    for i, r in enumerate(_rows(rows_or_batch)):
        if not get_family(r.family).accepts(fam.name):
            raise InputError(f"row encoded for {r.family!r}, prompted with a {fam.name} processor", row=i,
                             column="family", stage="rollout", fix="use the processor that encoded the rows")
        ids = [int(t) for t in r.input_ids]
        if not r.num_images:
            prompts.append({"prompt_token_ids": ids})
            continue
        if (r.tiles_per_image != 1).any() or r.pixel_values_u8 is None:
            raise InputError("the row's images were panned and scanned (several tiles each) or not stored", row=i,
                             column="pixel_values_u8" if r.pixel_values_u8 is None else "tiles_per_image",
                             stage="rollout", expected="one stored tile per image", found=r.tiles_per_image.tolist(),
                             fix="encode rollout prompts with pixels='uint8' and without do_pan_and_scan")
        text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        pieces = [module.expand_placeholder(int(h), int(w), processor) for h, w in r.image_hw]
        prompt_text = _one_token_per_image(text, pieces, fam.image_token, i)
        out = np.asarray(tok(prompt_text, add_special_tokens=False)["input_ids"], np.int64)
        starts = np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.int64)
        if not np.array_equal(starts, r.input_ids):  # the row's text must tokenize back to its ids
            raise InputError("the row's ids do not decode to a text that tokenizes back to them", row=i,
                             column="input_ids", stage="rollout", fix="encode the rows with this processor")
        tiles = r.pixel_values_u8
        prompts.append({"prompt_token_ids": [int(t) for t in out],
                        "multi_modal_data": {"image": [Image.fromarray(np.ascontiguousarray(t)) for t in tiles]},
                        "mm_processor_kwargs": {"do_pan_and_scan": False}})
    return prompts


def _one_token_per_image(text: str, pieces: list, token: str, row: Optional[int]) -> str:
    """``text`` with each image's text (in order) put back to ``token``."""
    out, at = [], 0
    for k, piece in enumerate(pieces):
        j = text.find(piece, at)
        if j < 0:
            raise InputError(f"image {k}'s text is not in the row", row=row, column="input_ids", stage="rollout",
                             fix="encode the rows with this processor")
        out += [text[at:j], token]
        at = j + len(piece)
    return "".join(out + [text[at:]])
