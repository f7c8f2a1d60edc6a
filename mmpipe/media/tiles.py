"""The ``tiles`` kind (Gemma 3, InternVL, LLaVA-OneVision): each image resized to fixed-size
tiles, stored as uint8 [N, S, S, 3] (the resized tiles before the processor's per-pixel
normalisation; 1/4 of the float32 bytes) or, ``pixels="source"``, as its encoded file; the
family's image module (`ModelFamily.images`) gives tile counts and placeholder texts from the
image size, collate expands the tiles (`mmpipe.images.tiles.normalise_tiles`, bit-exact).
Positions are 1-D ([L], ``0..L-1``). Stored columns: `COLUMNS`; rows written before the
one-record change stored ``mm_token_type_ids`` as int32: they read back the same.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import numpy as np

from mmpipe.errors import InputError
from mmpipe.records.codec import DIGEST, FAMILY, SOURCES, Column, backend_column, check_token_shapes
from mmpipe.records.columns import as_array

IMAGE_LAYOUT_COLUMN = "tiles_per_image"  # the stored per-image layout (what error messages name)
COLUMNS = (  # the stored columns of a tiles-kind row, in order (`mmpipe.records.codec.Column`)
    Column("input_ids", "int32"), Column("attention_mask", "int8"), Column("labels", "int32", missing="none"),
    Column("mm_token_type_ids", "int8"),  # 1 at the family's feature tokens
    Column("image_hw", "int64", ndim=2, width=2, flat=True),  # [2*I]: each image's upright (height, width)
    Column("tiles_per_image", "int64"), FAMILY,
    # pixels="uint8": the tiles flat [N*S*S*3] and their size (S, S); read back by read_media
    Column("pixel_values_u8", "uint8", read=None, ndim=4, flat=True, pixels=("uint8",), missing="none"),
    Column("tile_hw", "int64", read=None, pixels=("uint8",),
           value=lambda r: np.asarray(r.pixel_values_u8.shape[1:3])),
    SOURCES, DIGEST, backend_column(("source",)),  # a torchvision-backend processor's source rows say so
    Column("images_kwargs", "object", read=None, missing="none",  # the processor call's images_kwargs, JSON
           value=lambda r: json.dumps(r.images_kwargs, sort_keys=True) if r.images_kwargs else None),
)
HAS_PIXELS = ("uint8", "source")  # stored tiles, or stored source files (collate decodes and tiles those)
CHECK_ON_READ = True  # every row read is validated, its stored digest checked (a tile byte changed)


def read_media(d, kw: dict, fam, row) -> dict:
    """What `COLUMNS` leave to this kind: the flat tiles back to [N, S, S, 3] (N tiles of
    ``tile_hw`` (S, S), a wrong byte count is an `InputError`), ``images_kwargs``."""
    u8, tiles = d.get("pixel_values_u8"), kw["tiles_per_image"]
    if u8 is not None:
        hw = as_array(d.get("tile_hw"), np.int64, 1, "tile_hw", row)
        flat = np.frombuffer(u8, np.uint8) if isinstance(u8, (bytes, bytearray)) else \
            as_array(u8, np.uint8, 1, "pixel_values_u8", row)
        want = int(tiles.sum()) * int(np.prod(hw)) * 3
        if flat.size != want:
            raise InputError(f"pixel_values_u8 holds {flat.size} bytes", row=row, column="pixel_values_u8",
                             stage="validate", expected=f"{want} ({int(tiles.sum())} tiles of {hw.tolist()} x 3)",
                             found=str(flat.size), fix="re-encode the row with mmpipe.encode")
        u8 = flat.reshape(int(tiles.sum()), int(hw[0]), int(hw[1]), 3)
    kwargs = d.get("images_kwargs")
    return dict(pixel_values_u8=u8, images_kwargs=json.loads(kwargs) if isinstance(kwargs, str) and kwargs else None)


def validate(r, row: Any = None) -> None:
    """Lengths line up, the tiles match ``tiles_per_image``, sources one per image."""
    def bad(column, expected, found):
        return InputError(f"{column} does not match the row", row=row, column=column, stage="validate",
                          expected=expected, found=found, fix="re-encode the row with mmpipe.encode")

    check_token_shapes(r, row)
    if r.tiles_per_image is None or r.image_hw is None:
        raise bad("tiles_per_image", "the per-image layout (image_hw, tiles_per_image)", "none")
    if r.image_hw.shape != (len(r.tiles_per_image), 2):
        raise bad("image_hw", f"shape ({len(r.tiles_per_image)}, 2)", f"shape {r.image_hw.shape}")
    u8, n = r.pixel_values_u8, int(r.tiles_per_image.sum())
    if u8 is not None and (u8.ndim != 4 or u8.shape[0] != n or u8.shape[3] != 3):
        raise bad("pixel_values_u8", f"[{n}, S, S, 3]", f"shape {u8.shape}")
    if r.image_sources is not None and len(r.image_sources) != r.num_images:
        raise bad("image_sources", f"{r.num_images} sources", str(len(r.image_sources)))


def layout_repr(r) -> str:
    return f"tiles={r.tiles_per_image.tolist()}"


def model_inputs(batch, token_types) -> dict:
    """The media kwargs of a tiles family's ``forward``: the token types under the family's
    ``token_type_key`` (Gemma 3: ``token_type_ids``), ``pixel_values`` and the family's extras
    (LLaVA-OneVision ``image_sizes``) when the batch holds images with pixels."""
    fam, out = batch.fam, {}
    if fam.token_type_key is not None:
        out[fam.token_type_key] = token_types
    if batch.pixel_values is not None and batch.tiles_per_image is not None and len(batch.tiles_per_image):
        out["pixel_values"] = batch.pixel_values
        out.update(batch.extras)
    return out


# ---- rollout ----
_NO_ROLLOUT = {
    "multiturn": "encode each turn's whole conversation with mmpipe.encode and generate with TransformersEngine",
    "verl": "verl's actor reads the patch grids' multi_modal_inputs (pixel_values [N, D] + image_grid_thw) and "
            "its vLLM server their prompts, so these rows have no verl row layout here: batch them with "
            "mmpipe.Collator(processor) (BatchedMultiModalInputs.model_inputs() for the actor's forward), make "
            "rollout prompts with mmpipe.rollout.to_vllm_prompts(rows, processor)",
}


def vision_tokens(fam, processor: Any = None) -> dict[str, Optional[str]]:
    """The tokens a sampled response must not hold (`mmpipe.records.vision_tokens`), by kind: the
    feature token the model fills with image features (the image's slots) and, where the chat
    template renders another token per image (Gemma 3's ``<start_of_image>``), that one: it
    opens the image's block. A stray one breaks the row's image-token count."""
    out = {"image": fam.feature_token}
    if fam.image_token != fam.feature_token:
        out["vision_start"] = fam.image_token
    return out


def rollout_refusal(fam, stage: str) -> Optional[str]:
    """Why rollout ``stage`` (`mmpipe.rollout.support.ROLLOUT_STAGES`) cannot take tiled rows
    (multi-turn appends, verl rows), or None."""
    return _NO_ROLLOUT.get(stage)


def vllm_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[list] = None,
                index: int = 0, videos: Optional[list] = None, video_options: Any = None) -> dict:
    """One row -> its vLLM prompt dict. vLLM takes a tiled model's prompt as the chat template
    renders it, ONE ``image_token`` per image (``<start_of_image>``, ``<IMG_CONTEXT>``,
    ``<image>``), and writes each image's text itself after tiling the ORIGINAL image again
    (InternVL's thumbnail, LLaVA-OneVision's base tile and unpadded feature count, Gemma 3's
    pan-and-scan crops). So ``"prompt_token_ids"``: the row's text with each image's text put
    back to the image token, tokenized; for a row with images ``"multi_modal_data": {"image":
    [PIL RGB]}`` (`mmpipe.rollout.images.original_images`) and, where the family's vLLM processor
    takes image options, ``"mm_processor_kwargs"`` (`mmpipe.rollout.images.vllm_image_options`).
    ``processor``: the one the row was encoded with (required: its tokenizer and image texts);
    ``images``: the images the row was encoded from, or None (the row's stored files, or its one
    stored tile where that re-creates the prompt). A row laid out in another multi-image mode
    than vLLM's (LLaVA-OneVision's per-conversation mode: one tile per image of a row of
    several, where vLLM tiles every image) is refused with an `InputError` saying how to encode
    rollout rows (`_check_vllm_mode`)."""
    del videos, video_options  # the row stores its frames (to_vllm_prompts refuses videos= for it)
    import numpy as np

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
    if pfam is None or pfam.kind != "tiles":
        raise ArgumentError(f"to_vllm_prompts needs the tiled family's processor for {fam.name} rows, got "
                            f"{type(processor).__name__}")
    if not fam.accepts(pfam.name):
        raise InputError(f"row encoded for {r.family!r}, prompted with a {pfam.name} processor", row=index,
                         column="family", stage="rollout", fix="use the processor that encoded the rows")
    ids = [int(t) for t in r.input_ids]
    if not r.num_images:
        return {"prompt_token_ids": ids}
    _check_vllm_mode(r, index)
    pictures = original_images(r, images, index)
    tok = processor.tokenizer
    text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    ip = with_images_kwargs(effective_image_processor(processor), r.images_kwargs)
    texts = [fam.images().expand_placeholder(int(h), int(w), processor, ip) for h, w in r.image_hw]
    pieces, _, found = splice_text(text, texts, [fam.image_token] * len(texts))
    if len(found) < len(texts):
        raise InputError(f"image {len(found)}'s text is not in the row", row=index, column="input_ids",
                         stage="rollout", fix="encode the rows with this processor")
    out = np.asarray(tok("".join(pieces), add_special_tokens=False)["input_ids"], np.int64)
    starts = np.asarray(tok(text, add_special_tokens=False)["input_ids"], np.int64)
    if not np.array_equal(starts, r.input_ids):  # the row's text must tokenize back to its ids
        raise InputError("the row's ids do not decode to a text that tokenizes back to them", row=index,
                         column="input_ids", stage="rollout", fix="encode the rows with this processor")
    prompt = {"prompt_token_ids": [int(t) for t in out], "multi_modal_data": {"image": pictures}}
    kwargs = vllm_image_options(r, ip, index)
    if kwargs:
        prompt["mm_processor_kwargs"] = kwargs
    return prompt


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


# ---- what the stages ask beyond these functions (the rest: mmpipe/media/tiles_{encode,collate,validate,view}.py;
# 1-D positions, no device pixels, no audio: `mmpipe.media.defaults`)
BATCH_ROWS = "tiled-family"  # a batch of this kind's rows, in error messages
FOREIGN_ROW = "a row of another family"  # a row of another kind in such a batch
COLLATOR_NEEDS_PROCESSOR = "its pixel normalisation"  # what a Collator cannot do without the processor
