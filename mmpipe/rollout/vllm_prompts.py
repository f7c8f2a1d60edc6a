"""One row -> its vLLM prompt dict, by the prompt style its kind declares (``fam.media.VLLM_PROMPT``,
`STYLES`; `mmpipe.rollout.inputs.to_vllm_prompts` asks ``fam.media.vllm_prompt`` for each row,
`mmpipe.media.defaults.vllm_prompt`). vLLM takes a prompt as the chat template renders it and writes
each item's tokens itself, in one of three ways:

==============  ====================================================================================
style           the prompt
==============  ====================================================================================
``collapse``    vLLM expands ONE pad per image / video by the grid its own processor computes (the
                patch grids): the row's pads collapsed (`collapse_prompt`)
``splice``      vLLM writes each image's text itself after tiling the original image again (the
                tiled families): the row's image texts put back to the image token (`splice_prompt`)
``processor``   the processor's own prompt rule, per processor (the Omni thinkers,
                `mmpipe.rollout.processor_prompts`)
==============  ====================================================================================

Every style takes ``(r, processor, *, tokenizer, images, index, videos, video_options)``.

A spliced row whose ids vLLM cannot write back is refused (`_check_vllm_expansion`): vLLM tokenizes
each image's text apart from its neighbours and joins only some seams again (Gemma 3: three newline
runs), so a tokenizer merge across an image's edge would give vLLM other ids than the row's.
"""

from __future__ import annotations

from typing import Any, Optional


def collapse_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[list] = None,
                    index: int = 0, videos: Optional[list] = None, video_options: Any = None) -> dict:
    """A patch-grid row: ``"prompt_token_ids"`` with ONE pad per image / video (the row's
    placeholders collapsed), and for a row with media ``"multi_modal_data"`` (the stored resized
    images, PIL RGB; the stored video frames) and ``"mm_processor_kwargs"`` under which vLLM's
    processor gives the row's ids and pixels back. ``processor``: the processor, `VisionSpec` or
    family the row was encoded with (None: the family's defaults); ``tokenizer``: for video
    timestamps (default ``processor``)."""
    del videos, video_options  # the row stores its frames (to_vllm_prompts refuses videos= for it)
    from mmpipe.encoding.placeholders import collapse_placeholders
    from mmpipe.errors import ArgumentError
    from mmpipe.rollout.images import row_images, vision_spec_for, vllm_processor_kwargs
    from mmpipe.rollout.videos import vllm_video_prompt

    if images is not None:
        raise ArgumentError("images= is for tiled-family rows (Gemma 3, InternVL, LLaVA-OneVision); these rows "
                            "carry their own resized images")
    fam = r.fam
    spec = vision_spec_for(processor, fam) if (r.num_images or r.num_videos) else None
    if spec is not None and hasattr(processor, "tokenizer"):  # the row's pads are this tokenizer's?
        from mmpipe.media.patches_collate import check_pad_ids
        from mmpipe.records.vision_tokens import VisionTokens

        check_pad_ids([r], VisionTokens.from_processor(processor), stage="rollout", index=index)
    if r.num_videos:
        tok = tokenizer if tokenizer is not None else processor
        ids, videos, videos_kwargs = vllm_video_prompt(r, spec, tok, index=index)
    else:
        ids = collapse_placeholders(r.input_ids, r.mm_token_type_ids, r.image_grid_thw, family=fam, row=index)
    prompt: dict = {"prompt_token_ids": [int(t) for t in ids]}
    if r.num_images or r.num_videos:
        prompt["multi_modal_data"], prompt["mm_processor_kwargs"] = {}, {}
    if r.num_images:
        prompt["multi_modal_data"]["image"] = row_images(r, spec, index=index)
        prompt["mm_processor_kwargs"].update(vllm_processor_kwargs(r.image_grid_thw, spec, index=index, family=fam))
    if r.num_videos:
        prompt["multi_modal_data"]["video"] = videos
        prompt["mm_processor_kwargs"]["videos_kwargs"] = videos_kwargs
    return prompt


def _check_round_trip(tok, text: str, r, index: int) -> None:
    """The row's text must tokenize back to its ids (int [L]); else `InputError` naming the first difference."""
    import numpy as np

    from mmpipe.errors import InputError

    starts = np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.int64)
    if not np.array_equal(starts, r.input_ids):
        at = next((i for i, (a, b) in enumerate(zip(starts, r.input_ids)) if a != b),
                  min(len(starts), len(r.input_ids)))
        raise InputError("the row's ids do not decode to a text that tokenizes back to them", row=index,
                         column="input_ids", stage="rollout", expected=f"the row's {len(r.input_ids)} ids",
                         found=f"{len(starts)} ids, the first different at {at}",
                         fix="encode the rows with this processor")


def splice_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[list] = None,
                  index: int = 0, videos: Optional[list] = None, video_options: Any = None) -> dict:
    """A tiled row: vLLM takes its prompt as the chat template renders it, ONE ``image_token`` per
    image (``<start_of_image>``, ``<IMG_CONTEXT>``, ``<image>``), and writes each image's text
    itself after tiling the ORIGINAL image again (InternVL's thumbnail, LLaVA-OneVision's base tile
    and unpadded feature count, Gemma 3's pan-and-scan crops). So ``"prompt_token_ids"``: the row's
    text with each image's text put back to the image token, tokenized; for a row with images
    ``"multi_modal_data": {"image": [PIL RGB]}`` (`mmpipe.rollout.images.original_images`) and,
    where the family's vLLM processor takes image options, ``"mm_processor_kwargs"``
    (`mmpipe.rollout.images.vllm_image_options`). ``processor``: the one the row was encoded with
    (required: its tokenizer and image texts); ``images``: the images the row was encoded from, or
    None (the row's stored files, or its one stored tile where that re-creates the prompt). A row
    laid out in another multi-image mode than vLLM's (LLaVA-OneVision's per-conversation mode: one
    tile per image of a row of several, where vLLM tiles every image) is refused with an
    `InputError` saying how to encode rollout rows (`_check_vllm_mode`)."""
    del tokenizer, videos, video_options  # the processor's tokenizer; the rows take images only
    from mmpipe.encoding.placeholders import splice_text
    from mmpipe.errors import ArgumentError, InputError, UnsupportedProcessorError
    from mmpipe.families import family_of
    from mmpipe.images.tiles import effective_image_processor, with_images_kwargs
    from mmpipe.rollout.images import original_images, vllm_image_options

    fam = r.fam
    try:  # the processor's family (None for anything else: a spec, a name, None)
        pfam = family_of(processor) if hasattr(processor, "image_processor") else None
    except UnsupportedProcessorError:
        pfam = None
    if pfam is None or pfam.media is not fam.media:  # a processor of the row's kind
        raise ArgumentError(f"to_vllm_prompts needs the tiled family's processor for {fam.name} rows, got "
                            f"{type(processor).__name__}")
    if not fam.accepts(pfam.name):
        raise InputError(f"row encoded for {r.family!r}, prompted with a {pfam.name} processor", row=index,
                         column="family", stage="rollout", expected=f"a {r.family} processor", found=pfam.name,
                         fix="use the processor that encoded the rows")
    ids = [int(t) for t in r.input_ids]
    if not r.num_images:
        return {"prompt_token_ids": ids}
    _check_vllm_mode(r, index)
    _check_stored_tiles(r, processor, images, index)
    pictures = original_images(r, images, index)
    tok = processor.tokenizer
    text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ip = with_images_kwargs(effective_image_processor(processor), r.images_kwargs)
    texts = [fam.images().expand_placeholder(int(h), int(w), processor, ip) for h, w in r.image_hw]
    pieces, _, found = splice_text(text, texts, [fam.image_token] * len(texts))
    if len(found) < len(texts):
        raise InputError(f"image {len(found)}'s text is not in the row", row=index, column="input_ids",
                         stage="rollout", expected=f"the text of {len(texts)} image(s)", found=f"{len(found)}",
                         fix="encode the rows with this processor")
    out = [int(t) for t in tok("".join(pieces), add_special_tokens=False)["input_ids"]]
    _check_round_trip(tok, text, r, index)
    _check_vllm_expansion(r, out, texts, tok, index)
    prompt = {"prompt_token_ids": out, "multi_modal_data": {"image": pictures}}
    kwargs = vllm_image_options(r, ip, index)
    if kwargs:
        prompt["mm_processor_kwargs"] = kwargs
    return prompt


def _check_stored_tiles(r, processor, images: Optional[list], index: int) -> None:
    """Where a row's stored tile stands in for its image (`original_images`: Gemma 3 without
    pan-and-scan, no ``images=``, no source files), the tile must be of ``processor``'s tile size:
    vLLM would resize a tile of another processor's size again instead of the image
    (`mmpipe.media.tiles_collate.check_tile_size`, a `PixelDataError` naming the row)."""
    if not r.fam.vllm_tile_prompts or images is not None or r.image_sources is not None:
        return
    from mmpipe.images.tiles import effective_image_processor
    from mmpipe.media.tiles_collate import check_tile_size, tile_size

    check_tile_size([r], tile_size(effective_image_processor(processor), r.fam), stage="rollout", index=index,
                    fix="pass images= (each row's images, as encoded), or prompt with the processor the rows "
                        "were encoded with")


def _check_vllm_expansion(r, prompt: list, texts: list, tok, index: int) -> None:
    """Refuse a row that vLLM cannot expand its prompt back to: vLLM tokenizes each image's text
    apart from the text around it (the family's image module's ``vllm_prompt_ids``: how it joins
    them again; `mmpipe.images.gemma3.vllm_prompt_ids`), so a row whose
    tokenizer merged text across an image's edge (Gemma 3: a newline run of 3+ or a single "\\n"
    right after the image, under a template that does not trim text) would silently get other ids
    in vLLM, or a RuntimeError from deep inside it."""
    rule = getattr(r.fam.images(), "vllm_prompt_ids", None)
    if rule is None:
        return
    image_ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    got, found = rule(prompt, image_ids, int(tok.convert_tokens_to_ids(r.fam.image_token)), tok)
    want = [int(t) for t in r.input_ids]
    if found and (not got or got == want):
        return
    from mmpipe.errors import InputError

    k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    show = (lambda ids: tok.convert_ids_to_tokens(ids[max(0, k - 2):k + 3]))
    raise InputError(
        f"vLLM writes each {r.fam.name} image's text tokenized apart from the text around it, and this row's "
        "tokenizer merged text across an image's edge: "
        + (f"vLLM's prompt ids would differ from the row at token {k}" if got != want else
           "vLLM would not find the image's tokens again (it raises a RuntimeError)"),
        row=index, column="input_ids", stage="rollout", expected=f"the row's tokens {show(want)}",
        found=f"vLLM's {show(got)}", fix="keep newlines away from the images in the text (the published "
        "Gemma 3 chat template trims each text part), or generate with mmpipe.rollout.TransformersEngine")


def _check_vllm_mode(r, index: int) -> None:
    """Refuse a row whose multi-image mode (the family module's ``stored_mode``, from the row's
    ``tiles_per_image``) is not the one vLLM's processor runs (its ``VLLM_MODE``): vLLM would
    tile the images again its own way, and the prompt would not be the row."""
    module = r.fam.images()
    mode_of, vllm_mode = getattr(module, "stored_mode", None), getattr(module, "VLLM_MODE", None)
    mode = mode_of(r.tiles_per_image) if mode_of is not None else None
    if mode is None or vllm_mode is None or mode == vllm_mode:
        return
    from mmpipe.errors import InputError

    key = module.MODE_KEY
    raise InputError(
        f"the row was encoded in {r.fam.name}'s {mode!r} multi-image mode ({r.num_images} images, "
        f"tiles {r.tiles_per_image.tolist()}: the processor's chat path, TRL and the model's batch_num_images), "
        f"and vLLM runs the {vllm_mode!r} mode (every image of a prompt tiled), so its prompt would not be "
        "this row", row=index, column="tiles_per_image", stage="rollout",
        expected=f"a row encoded with images_kwargs={{{key!r}: {vllm_mode!r}}} (or of at most one image)",
        found=f"{key}={mode!r}",
        fix=f"encode rollout rows with mmpipe.Encoder(processor, images_kwargs={{{key!r}: {vllm_mode!r}}}) "
            "(and train on those rows, so rollout and training see the same tokens), or generate with "
            "mmpipe.rollout.TransformersEngine")


def _processor_prompt(r, processor: Any, **kw) -> dict:
    """The generic path's rows: the Omni thinkers' prompts (`mmpipe.rollout.processor_prompts.vllm_prompt`;
    ``videos``: the files of a row encoded with ``use_audio_in_video``); a row of any other processor
    is refused there (`RolloutRefusal` naming the row)."""
    from mmpipe.rollout.processor_prompts import vllm_prompt as processor_prompt

    return processor_prompt(r, processor, **kw)


STYLES = {"collapse": collapse_prompt, "splice": splice_prompt, "processor": _processor_prompt}
