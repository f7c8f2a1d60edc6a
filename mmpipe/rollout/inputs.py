"""Encoded rows / batches -> what a rollout engine takes: vLLM prompts, transformers
``generate`` kwargs, and data-parallel padding.

Training ids hold every image's placeholder EXPANDED (one ``<|image_pad|>`` per LLM token);
vLLM wants exactly ONE pad per image and the image itself, and expands the pad again from
the grid its own processor computes. So a vLLM prompt is built from the same row as::

    collapsed ids  (one pad per vision block)  +  the stored resized images (PIL)
    + mm_processor_kwargs under which re-processing those images is a no-op

    prompts = to_vllm_prompts(rows, processor)          # list of vLLM prompt dicts
    outputs = llm.generate(prompts, sampling_params)    # vLLM expands the pads again

``expand_placeholders(collapse_placeholders(ids)) == ids`` exactly (`check_roundtrip`), and
vLLM's ``RequestOutput.prompt_token_ids`` equals the row's ``input_ids`` (checked by
`mmpipe.rollout.vllm_engine`).

Re-processing a stored image. The stored image is the processor's own resize (both sides
multiples of ``patch * merge``). With bounds that contain its area, ``smart_resize`` returns
its size unchanged, and resizing to the same size is the identity in both transformers
backends (Pillow returns a copy; torchvision returns the input), so the processor gives the
stored grid and the stored ``pixel_values`` bit for bit. With the *training* bounds this is
not always so: ``smart_resize`` can leave an image above ``max_pixels`` (a side clamped up to
one ``factor`` for very elongated images) and a second pass then shrinks it again - this
happens with small ``max_pixels`` such as 128 tokens. `vllm_processor_kwargs` therefore
widens the bounds to contain every stored area (the training bounds themselves in the
common case, so one processor configuration serves all rows), and adds ``do_resize=False``
for an image whose stored aspect ratio exceeds the processor's limit of 200 (rounding can
push a 1:200 image to 1:201; the processor refuses those before resizing).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.families import ModelFamily, family_of
from mmpipe.images.spec import VisionSpec, smart_resize
from mmpipe.images.pixels import pixel_values_to_u8, unpatchify_u8, video_pixel_values_to_u8
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs

__all__ = [
    "collapse_placeholders",
    "expand_placeholders",
    "check_roundtrip",
    "row_images",
    "row_video_frames",
    "vllm_processor_kwargs",
    "to_vllm_prompts",
    "as_rows",
    "to_generate_kwargs",
    "pad_to_multiple",
    "trim",
]

MAX_ASPECT_RATIO = 200  # the Qwen image processors refuse larger ratios


def _where(row) -> str:
    return f"row {row}" if row is not None else "row"


def _np(v) -> np.ndarray:
    return v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)


# ---- placeholders ----------------------------------------------------------------------
def _blocks(grid: np.ndarray, fam: ModelFamily, kind: str) -> list[int]:
    """Token count of each vision block in the text, in order.

    One block per image; one per video, except Qwen3-VL (``rope == "mrope_frames"``) whose
    videos are laid out as one ``<|vision_start|> pads <|vision_end|>`` block per frame group
    (``t`` blocks of ``h*w/merge^2`` tokens, a timestamp text before each).
    """
    m2 = fam.merge_size**2
    out: list[int] = []
    for t, h, w in np.asarray(grid, dtype=np.int64).reshape(-1, 3).tolist():
        if kind == "video" and fam.rope == "mrope_frames":
            out += [h * w // m2] * t
        else:
            out.append(t * h * w // m2)
    return out


def _runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    d = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.flatnonzero(d == 1), np.flatnonzero(d == -1)


def _block_starts(ids, types, code, blocks, kind, where) -> list[int]:
    """Start index of each block; each run of ``types == code`` must be whole blocks."""
    starts, ends = _runs(types == code)
    out, k = [], 0
    for s, e in zip(starts.tolist(), ends.tolist()):
        pos = s
        while pos < e:  # adjacent blocks with no separator share one run
            if k >= len(blocks):
                raise ValueError(
                    f"{where}: {int((types == code).sum())} {kind} tokens but the {kind} grids need "
                    f"{sum(blocks)} in {len(blocks)} block(s) of {blocks}; the text holds {kind} tokens "
                    f"without a grid - re-encode the row"
                )
            n = blocks[k]
            if pos + n > e:
                raise ValueError(
                    f"{where}: {kind} block {k} is a run of {e - pos} {kind} token(s) at position {pos} "
                    f"but its grid needs {n}; the tokens were cut (truncation?) or the grids belong "
                    f"to other tokens - re-encode the row"
                )
            if not (ids[pos:pos + n] == ids[pos]).all():
                raise ValueError(f"{where}: {kind} block {k} at position {pos} mixes token ids; expected one pad id")
            out.append(pos)
            pos += n
            k += 1
    if k != len(blocks):
        raise ValueError(
            f"{where}: the text holds {k} {kind} block(s) but the {kind} grids need {len(blocks)} "
            f"({blocks} tokens); the {kind} data and the text disagree - re-encode the row"
        )
    return out


def collapse_placeholders(
    input_ids,
    mm_token_type_ids,
    image_grid_thw,
    video_grid_thw=None,
    *,
    family,
    row: Any = None,
) -> np.ndarray:
    """Training ids -> ids with ONE pad token per vision block (what vLLM expects).

    Args:
        input_ids: int [L], placeholders expanded (``t*h*w/merge^2`` pads per image).
        mm_token_type_ids: int [L], 0 text, 1 image, 2 video.
        image_grid_thw: int [I, 3]; video_grid_thw: int [V, 3] or None.
        family: family name, `ModelFamily` or processor.
        row: named in errors.

    Returns int64 [L - sum(block tokens) + num blocks]. Each image block (its pads, between
    ``<|vision_start|>`` and ``<|vision_end|>``) becomes one ``<|image_pad|>``; each video
    block one ``<|video_pad|>``. Qwen3-VL videos have one block per frame group (timestamp
    text before each), so a video keeps ``t`` single-pad blocks and its timestamps: that
    form is lossless (`expand_placeholders` restores the ids) but it is NOT a vLLM video
    prompt (vLLM wants one ``<|vision_start|><|video_pad|><|vision_end|>`` per video and
    writes the timestamps itself from the video metadata), see `to_vllm_prompts`.
    Raises ValueError naming the row when a block's token run does not match its grid.
    """
    fam = family_of(family)
    where = _where(row)
    ids = _np(input_ids).astype(np.int64).reshape(-1)
    types = _np(mm_token_type_ids).astype(np.int64).reshape(-1)
    if types.shape != ids.shape:
        raise ValueError(f"{where}: mm_token_type_ids has shape {types.shape}, input_ids {ids.shape}")
    keep = np.ones(ids.shape, dtype=bool)
    for kind, code, grid in (("image", 1, image_grid_thw), ("video", 2, video_grid_thw)):
        blocks = _blocks(np.zeros((0, 3)) if grid is None else _np(grid), fam, kind)
        for s, n in zip(_block_starts(ids, types, code, blocks, kind, where), blocks):
            keep[s + 1:s + n] = False
    return ids[keep]


def _pad_ids(family, image_token_id, video_token_id) -> tuple[Optional[int], Optional[int]]:
    if image_token_id is None or video_token_id is None:
        tok = getattr(family, "tokenizer", family)
        if hasattr(tok, "convert_tokens_to_ids"):
            fam = family_of(family)
            image_token_id = tok.convert_tokens_to_ids(fam.image_token) if image_token_id is None else image_token_id
            video_token_id = tok.convert_tokens_to_ids(fam.video_token) if video_token_id is None else video_token_id
    return image_token_id, video_token_id


def expand_placeholders(
    collapsed_ids,
    image_grid_thw,
    video_grid_thw=None,
    *,
    family,
    image_token_id: Optional[int] = None,
    video_token_id: Optional[int] = None,
    row: Any = None,
) -> np.ndarray:
    """Inverse of `collapse_placeholders`: each single pad -> its block's token count.

    ``family``: a processor (the pad ids are read from its tokenizer) or a family name /
    `ModelFamily` together with ``image_token_id`` / ``video_token_id``.
    Returns int64 [L] (training ids).
    """
    fam = family_of(family)
    where = _where(row)
    img_id, vid_id = _pad_ids(family, image_token_id, video_token_id)
    ids = _np(collapsed_ids).astype(np.int64).reshape(-1)
    reps = np.ones(ids.shape, dtype=np.int64)
    for kind, tok_id, grid in (("image", img_id, image_grid_thw), ("video", vid_id, video_grid_thw)):
        blocks = _blocks(np.zeros((0, 3)) if grid is None else _np(grid), fam, kind)
        if not blocks:
            continue
        if tok_id is None:
            raise ValueError(
                f"{where}: cannot tell the {kind} pad id; pass the processor as family= or "
                f"{kind}_token_id="
            )
        pos = np.flatnonzero(ids == tok_id)
        if len(pos) != len(blocks):
            raise ValueError(
                f"{where}: {len(pos)} {kind} pad token(s) in the collapsed ids but the {kind} grids "
                f"need {len(blocks)} (one per block); were the ids already expanded? expand only "
                "ids from collapse_placeholders"
            )
        reps[pos] = blocks
    return np.repeat(ids, reps)


def check_roundtrip(row, *, index: Any = None) -> np.ndarray:
    """Raise AssertionError unless ``expand(collapse(ids)) == ids`` for this row exactly.

    The pad ids are read from the row itself. Returns the collapsed ids.
    """
    r = MultiModalInputs.from_dict(row, row=index)
    ids, types = r.input_ids, r.mm_token_type_ids
    img = int(ids[types == 1][0]) if (types == 1).any() else None
    vid = int(ids[types == 2][0]) if (types == 2).any() else None
    collapsed = collapse_placeholders(ids, types, r.image_grid_thw, r.video_grid_thw, family=r.family, row=index)
    back = expand_placeholders(collapsed, r.image_grid_thw, r.video_grid_thw, family=r.family,
                               image_token_id=img, video_token_id=vid, row=index)
    if back.shape != ids.shape or not np.array_equal(back, ids):
        n = min(len(back), len(ids))
        diff = np.flatnonzero(back[:n] != ids[:n])
        at = int(diff[0]) if len(diff) else n
        raise AssertionError(
            f"{_where(index)}: expand(collapse(input_ids)) differs from input_ids "
            f"({len(back)} vs {len(ids)} tokens, first difference at {at})"
        )
    return collapsed


# ---- images ----------------------------------------------------------------------------
def _spec_for(processor_or_spec, fam: ModelFamily) -> VisionSpec:
    if isinstance(processor_or_spec, VisionSpec):
        spec = processor_or_spec
    elif processor_or_spec is None or isinstance(processor_or_spec, (str, ModelFamily)):
        spec = VisionSpec.from_family(family_of(processor_or_spec) if processor_or_spec is not None else fam)
    else:
        other = family_of(processor_or_spec)
        if other.name != fam.name:
            raise ValueError(
                f"the rows were encoded for {fam.name!r} but the processor is {other.name!r}; "
                "use the processor the rows were encoded with"
            )
        spec = VisionSpec.from_processor(processor_or_spec)
    if fam.is_vision and spec.patch_size != fam.patch_size:
        raise ValueError(f"VisionSpec patch size {spec.patch_size} does not match {fam.name} ({fam.patch_size})")
    return spec


def _image_u8(r: MultiModalInputs, spec: VisionSpec, where: str) -> np.ndarray:
    if r.pixel_values_u8 is not None:
        return r.pixel_values_u8
    if r.pixel_values is not None:
        try:
            return pixel_values_to_u8(r.pixel_values, spec.lut(), spec.temporal_patch_size)
        except ValueError as e:
            raise ValueError(
                f"{where}: cannot recover the images from float32 pixel_values ({e}); were they made "
                "with other normalisation constants? pass the processor the row was encoded with"
            ) from None
    raise ValueError(
        f"{where}: holds {r.num_images} image(s) but no pixel data (encoded with pixels='none', "
        "layout only); a rollout engine needs the images - re-encode with pixels='uint8' (the default)"
    )


def row_images(row, spec: VisionSpec, *, index: Any = None) -> list:
    """The row's images as PIL RGB images, exactly the processor's resized images.

    Each image ``i`` is ``W = gw*p`` by ``H = gh*p`` (its ``image_grid_thw`` (1, gh, gw)), from
    compact ``pixel_values_u8`` [N, 3*p*p] or, exactly inverted, from float32
    ``pixel_values`` [N, 3*T*p*p]. Re-processing them under `vllm_processor_kwargs` gives
    the stored grid and ``pixel_values`` bit for bit.
    """
    from PIL import Image

    r = MultiModalInputs.from_dict(row, row=index)
    where = _where(index)
    if not r.num_images:
        return []
    u8 = _image_u8(r, spec, where)
    p = spec.patch_size
    if u8.shape[1] != 3 * p * p:
        raise ValueError(f"{where}: image patches are {u8.shape[1]} wide, expected 3*{p}*{p} for this VisionSpec")
    out, start = [], 0
    for i, (t, h, w) in enumerate(r.image_grid_thw.tolist()):
        if t != 1:
            raise ValueError(f"{where}, image {i}: grid {(t, h, w)} has t != 1; images have one temporal step")
        arr = unpatchify_u8(u8[start:start + h * w], h, w, spec)
        out.append(Image.fromarray(arr, "RGB"))
        start += h * w
    return out


def row_video_frames(row, spec: VisionSpec, *, index: Any = None) -> list[np.ndarray]:
    """The row's videos as uint8 frame arrays [t*T, gh*p, gw*p, 3] (T = temporal patch size).

    Compact video storage ``pixel_values_videos_u8`` is uint8 [Nv, 3*T*p*p] in the video
    processor's layout: rows ordered (frame group, h/merge, w/merge, merge_h, merge_w), each
    row (channel, frame-in-group, patch_y, patch_x). Frame ``g*T + k`` is frame ``k`` of group
    ``g``; a video whose frame count was odd carries its last frame twice (the processor pads).
    """
    r = MultiModalInputs.from_dict(row, row=index)
    where = _where(index)
    if not r.num_videos:
        return []
    if r.pixel_values_videos_u8 is not None:
        u8 = r.pixel_values_videos_u8
    elif r.pixel_values_videos is not None:
        u8 = video_pixel_values_to_u8(r.pixel_values_videos, spec.lut())
    else:
        raise ValueError(f"{where}: holds {r.num_videos} video(s) but no pixel data - re-encode with pixels")
    p, m, T = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    out, start = [], 0
    for t, h, w in r.video_grid_thw.tolist():
        x = u8[start:start + t * h * w].reshape(t, h // m, w // m, m, m, 3, T, p, p)
        x = x.transpose(0, 6, 1, 3, 7, 2, 4, 8, 5)  # (t, T, h/m, m, p, w/m, m, p, C)
        out.append(np.ascontiguousarray(x).reshape(t * T, h * p, w * p, 3))
        start += t * h * w
    return out


# ---- vLLM ------------------------------------------------------------------------------
def vllm_processor_kwargs(grids, spec: VisionSpec, *, index: Any = None) -> dict:
    """``mm_processor_kwargs`` under which the processor re-creates these stored images as-is.

    grids: int [I, 3] image grids of one prompt. Returns ``{"min_pixels", "max_pixels"}``:
    the spec's bounds widened to contain every stored image's area (so ``smart_resize`` is
    the identity for each), plus ``"do_resize": False`` when a stored image's aspect ratio
    exceeds 200 (the processor would refuse it; the stored image needs no resize anyway).
    """
    g = np.asarray(grids, dtype=np.int64).reshape(-1, 3)
    p, f = spec.patch_size, spec.factor
    hw = [(h * p, w * p) for _, h, w in g.tolist()]
    areas = [H * W for H, W in hw]
    kw: dict = {"min_pixels": int(min([spec.min_pixels, *areas])), "max_pixels": int(max([spec.max_pixels, *areas]))}
    for i, (H, W) in enumerate(hw):
        if max(H, W) / min(H, W) > MAX_ASPECT_RATIO:
            kw["do_resize"] = False
            continue
        got = smart_resize(H, W, f, kw["min_pixels"], kw["max_pixels"])
        if got != (H, W):  # cannot happen for sides that are multiples of the factor; keep the guard
            raise ValueError(f"{_where(index)}, image {i}: re-processing {H}x{W} would give {got[0]}x{got[1]}")
    return kw


def as_rows(rows_or_batch) -> list[MultiModalInputs]:
    """Rows (`MultiModalInputs` or stored dicts), one row, or a batch -> `MultiModalInputs` list."""
    if isinstance(rows_or_batch, BatchedMultiModalInputs):
        from mmpipe.batching.unbatch import unbatch

        return unbatch(rows_or_batch)
    if isinstance(rows_or_batch, MultiModalInputs):
        return [rows_or_batch]
    return [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(rows_or_batch)]


def to_vllm_prompts(rows_or_batch, processor_or_spec=None) -> list[dict]:
    """Rows (or a batch) -> vLLM prompt dicts, one per row, in order.

    Each prompt is a dict with
    ``"prompt_token_ids"``: list[int] (collapsed: one ``<|image_pad|>`` per image),
    ``"multi_modal_data"``: ``{"image": [PIL.Image RGB, ...]}`` (the stored resized images) and
    ``"mm_processor_kwargs"``: ``{"min_pixels", "max_pixels"[, "do_resize"]}`` (see
    `vllm_processor_kwargs`); rows without images carry only ``"prompt_token_ids"``.
    vLLM re-expands the pads to exactly the row's training ``input_ids``::

        prompts = to_vllm_prompts(rows, processor)
        outs = llm.generate(prompts, vllm.SamplingParams(max_tokens=64))

    processor_or_spec: the processor the rows were encoded with, or its `VisionSpec`
    (None: the family's defaults; only patch size and normalisation matter here).
    Rows holding videos raise NotImplementedError (see the message).
    """
    rows = as_rows(rows_or_batch)
    prompts = []
    for i, r in enumerate(rows):
        fam = r.fam
        where = _where(i)
        if r.num_videos:
            raise NotImplementedError(
                f"{where} holds {r.num_videos} video(s): vLLM video prompts are not built yet. vLLM wants "
                "one '<|vision_start|><|video_pad|><|vision_end|>' per video plus the frames and (Qwen3-VL) "
                "frame metadata to re-create timestamps, and re-samples/resizes frames with its own video "
                "settings; the stored frames are available from mmpipe.rollout.inputs.row_video_frames"
            )
        ids = collapse_placeholders(r.input_ids, r.mm_token_type_ids, r.image_grid_thw, family=fam, row=i)
        prompt: dict = {"prompt_token_ids": [int(t) for t in ids]}
        if r.num_images:
            spec = _spec_for(processor_or_spec, fam)
            prompt["multi_modal_data"] = {"image": row_images(r, spec, index=i)}
            prompt["mm_processor_kwargs"] = vllm_processor_kwargs(r.image_grid_thw, spec, index=i)
        prompts.append(prompt)
    return prompts


# ---- transformers generate ---------------------------------------------------------------
def to_generate_kwargs(batch: BatchedMultiModalInputs, device=None, *, position_ids: bool = False) -> dict:
    """Kwargs for a transformers Qwen-VL ``model.generate`` from a LEFT-padded batch.

    Returns input_ids / attention_mask / mm_token_type_ids int64 [B, L], pixel_values float32
    [N, 3*T*p*p] + image_grid_thw int64 [I, 3] (and pixel_values_videos, video_grid_thw,
    second_per_grid_ts [V] for Qwen2.5-VL) when the batch holds them.

    No ``position_ids`` by default: ``generate`` builds the 3-D positions and rope deltas
    itself at prefill (``_prepare_position_ids_for_generation`` -> ``get_rope_index``) and
    extends them by ``last + 1`` per new token. ``position_ids=True`` passes the batch's own
    [4, B, L] positions (plain text row first, as ``generate`` builds them); in transformers
    5.23 that gives identical results for images (checked in the tests), and for long
    videos it keeps the original Qwen rule where 5.23's ``get_rope_index`` diverges (see
    FACTS). Older transformers (4.x) recomputed positions in decoding from rope deltas that
    are never set when positions are passed, so the default stays the portable choice.
    """
    if not isinstance(batch, BatchedMultiModalInputs):
        raise TypeError(
            f"to_generate_kwargs takes a BatchedMultiModalInputs, got {type(batch).__name__}; "
            "collate the rows first: mmpipe.collate(rows, processor=processor, padding_side='left')"
        )
    att = batch.attention_mask
    if batch.padding_side != "left" and bool((att[:, -1] == 0).any()):
        rows = [int(b) for b in (att[:, -1] == 0).nonzero().reshape(-1)]
        raise ValueError(
            f"rows {rows} are right-padded: generate appends new tokens after the pads, so those rows "
            "would continue from padding; collate with padding_side='left' for generation"
        )
    has_vision = bool(batch.image_grid_thw.shape[0]) or bool(batch.video_grid_thw.shape[0])
    if has_vision and batch.pixel_values is None and batch.pixel_values_videos is None:
        rows = [b for b, idx in enumerate(batch.sample_to_image_indices) if idx]
        raise ValueError(
            f"rows {rows} hold images but the batch has no pixel data (layout-only encoding?): the model "
            "would answer without seeing them; re-encode with pixels='uint8'"
        )
    return batch.model_inputs(device, positions="verl" if position_ids else "none", labels=False)


# ---- data-parallel padding -------------------------------------------------------------
def _dummy(row):
    if isinstance(row, MultiModalInputs):
        return replace(row)  # shallow: shares every array with the real row
    if isinstance(row, dict):
        return dict(row)
    return row


def pad_to_multiple(rows: Sequence, multiple: int) -> tuple[list, int]:
    """Append dummy rows (shallow copies of the first row, sharing its arrays: no pixel
    copy) until ``len`` is a multiple of ``multiple`` (e.g. the data-parallel world size).

    Returns ``(padded_rows, n_real)``; undo on any output with ``trim(outputs, n_real)``.
    """
    if int(multiple) < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    rows = list(rows)
    if not rows:
        raise ValueError("pad_to_multiple got no rows; there is nothing to copy as a dummy row")
    n = len(rows)
    return rows + [_dummy(rows[0]) for _ in range((-n) % int(multiple))], n


def _leading(v) -> Optional[int]:
    if isinstance(v, (str, bytes)) or v is None:
        return None
    if hasattr(v, "shape"):
        return int(v.shape[0]) if len(v.shape) else None
    if isinstance(v, (list, tuple)):
        return len(v)
    return None


def trim(outputs, n_real: int):
    """Drop the dummy rows that `pad_to_multiple` appended (they are last).

    outputs: a list/tuple (e.g. of `Generation`), a numpy array / torch tensor [P, ...], a
    dict whose sized values all have leading dim P (scalars and strings are kept), or a
    `BatchedMultiModalInputs` (every per-row field, pixel rows by ``patch_offsets``, grids
    by ``image_offsets``; offsets keep their prefix).
    """
    n = int(n_real)
    if isinstance(outputs, BatchedMultiModalInputs):
        return _trim_batch(outputs, n)
    if isinstance(outputs, dict):
        sizes = {k: _leading(v) for k, v in outputs.items()}
        P = {s for s in sizes.values() if s is not None}
        if len(P) > 1:
            raise ValueError(
                f"trim: the dict's fields have different leading sizes {sizes}; every array/list field "
                "must have the padded batch as its first dim (move the batch axis first)"
            )
        if P and n > P.pop():
            raise ValueError(f"trim: n_real={n} exceeds the padded size {sizes}")
        return {k: (v[:n] if sizes[k] is not None else v) for k, v in outputs.items()}
    size = _leading(outputs)
    if size is None:
        raise TypeError(f"trim: cannot trim a {type(outputs).__name__}")
    if n > size:
        raise ValueError(f"trim: n_real={n} exceeds the {size} padded rows")
    return outputs[:n]


def _trim_batch(b: BatchedMultiModalInputs, n: int) -> BatchedMultiModalInputs:
    B = b.batch_size
    if not 0 < n <= B:
        raise ValueError(f"trim: n_real={n} must be in 1..{B} (the batch size)")
    if n == B:
        return b
    io, po = b.image_offsets[: n + 1], b.patch_offsets[: n + 1]
    vo, vpo = b.video_offsets[: n + 1], b.video_patch_offsets[: n + 1]
    ni, npatch, nv, nvp = int(io[-1]), int(po[-1]), int(vo[-1]), int(vpo[-1])
    has_labels = b.row_has_labels[:n] if b.row_has_labels is not None else None
    keep_labels = b.labels is not None and (has_labels is None or bool(has_labels.any()))
    formats = list(b.row_pixel_formats[:n]) if b.row_pixel_formats is not None else None
    pixel_format = b.pixel_format
    if pixel_format != "none" and formats is not None:
        vis = {formats[r] for r in range(n)
               if int(io[r + 1] - io[r]) or int(vo[r + 1] - vo[r])}
        pixel_format = vis.pop() if len(vis) == 1 else ("mixed" if vis else "none")
    cut = lambda v, k: (v[:k] if (v is not None and k) else None)  # noqa: E731
    return replace(
        b,
        input_ids=b.input_ids[:n],
        attention_mask=b.attention_mask[:n],
        mm_token_type_ids=b.mm_token_type_ids[:n],
        position_ids=b.position_ids[:, :n],
        rope_deltas=b.rope_deltas[:n],
        labels=b.labels[:n] if keep_labels else None,
        image_grid_thw=b.image_grid_thw[:ni],
        image_offsets=io,
        patch_offsets=po,
        video_grid_thw=b.video_grid_thw[:nv],
        second_per_grid_ts=b.second_per_grid_ts[:nv],
        video_offsets=vo,
        video_patch_offsets=vpo,
        seq_lengths=b.seq_lengths[:n],
        row_has_labels=has_labels,
        row_pixel_formats=formats,
        pixel_format=pixel_format,
        pixel_values=cut(b.pixel_values, npatch),
        pixel_values_u8=cut(b.pixel_values_u8, npatch),
        pixel_values_videos=cut(b.pixel_values_videos, nvp),
        pixel_values_videos_u8=cut(b.pixel_values_videos_u8, nvp),
    )

