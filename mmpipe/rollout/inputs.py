"""Encoded rows / batches -> what a rollout engine takes (rollout inputs stage): vLLM
prompts and transformers ``generate`` kwargs. The stored images themselves are rebuilt by
`mmpipe.rollout.images`; data-parallel padding is `mmpipe.rollout.data_parallel`.

Training ids hold every image's placeholder EXPANDED (one ``<|image_pad|>`` per LLM token);
vLLM wants exactly ONE pad per image and the image itself, and expands the pad again from
the grid its own processor computes. So a vLLM prompt is built from the same row as::

    collapsed ids  (one pad per vision block)  +  the stored resized images (PIL)
    + mm_processor_kwargs under which re-processing those images is a no-op

    prompts = to_vllm_prompts(rows, processor)          # list of vLLM prompt dicts
    outputs = llm.generate(prompts, sampling_params)    # vLLM expands the pads again

``expand_placeholders(collapse_placeholders(ids)) == ids`` exactly (`mmpipe.encoding.placeholders`), and
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
for an image whose stored aspect ratio exceeds the family's limit (``max_aspect_ratio``, 200; rounding can
push a 1:200 image to 1:201; the processor refuses those before resizing).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence

from mmpipe.batching.checks import check_not_failed
from mmpipe.compat import forward_accepts, is_transformers_5
from mmpipe.errors import ArgumentError, InputError, PixelDataError
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.support import check_row_families

__all__ = [
    "to_vllm_prompts",
    "as_rows",
    "prompt_rows",
    "to_generate_kwargs",
]


def as_rows(rows_or_batch) -> list[MultiModalInputs]:
    """Rows -> a `MultiModalInputs` list: a list (any iterable) of `MultiModalInputs` or stored
    dicts, one row (a `MultiModalInputs` or one stored dict, ``dataset[i]``), a dict of columns
    (``dataset[i:j]``, a batched map's output), an Arrow table or record batch (`ArrowRows`),
    or a collated batch. A string, None or any other non-iterable: `ArgumentError`."""
    import pyarrow as pa

    if isinstance(rows_or_batch, BatchedMultiModalInputs):
        from mmpipe.batching.unbatch import unbatch

        return unbatch(rows_or_batch)
    if isinstance(rows_or_batch, MultiModalInputs):
        return [rows_or_batch]
    if isinstance(rows_or_batch, (pa.Table, pa.RecordBatch)):
        from mmpipe.records.arrow import rows_from_arrow

        check_not_failed(rows_or_batch, "rollout")
        return rows_from_arrow(rows_or_batch)
    if isinstance(rows_or_batch, Mapping):
        check_not_failed(rows_or_batch, "rollout")  # an on_error="skip" placeholder is no prompt
        fam = rows_or_batch.get("family")
        if isinstance(fam, (list, tuple)) or (hasattr(fam, "ndim") and getattr(fam, "ndim", 0) == 1):
            return _column_rows(rows_or_batch, len(fam))
        return [MultiModalInputs.from_dict(rows_or_batch, row=0)]  # one stored row (or a raw row: refused)
    if isinstance(rows_or_batch, (str, bytes)) or not isinstance(rows_or_batch, Iterable):
        raise ArgumentError(
            "rows must be encoded rows (MultiModalInputs or the dicts mmpipe.encode stores; a list, a dataset, "
            f"an Arrow table, one row) or a collated batch, got {type(rows_or_batch).__name__}")
    rows = list(rows_or_batch)
    check_not_failed(rows, "rollout")
    return [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(rows)]


def prompt_rows(rows_or_batch) -> list[MultiModalInputs]:
    """`as_rows` for prompts (what the engines and `to_vllm_prompts` read): a row of 0 tokens is
    refused (`InputError` naming it, column ``input_ids``, stage "rollout"). Why: a row that failed
    to encode under ``on_error="skip"`` reads as one once it is a record (``MultiModalInputs.from_dict``
    keeps no failure); it went to vLLM as ``{"prompt_token_ids": []}`` and to `TransformersEngine` as a
    bare ``torch.cat(): expected a non-empty list of Tensors``."""
    rows = as_rows(rows_or_batch)
    for i, r in enumerate(rows):
        refuse_empty_prompt(r, "the prompt row holds no token", row=i)
    return rows


def refuse_empty_prompt(record: MultiModalInputs, detail: str, *, more_fix: str = "", **location) -> MultiModalInputs:
    """``record`` (an encoded prompt), refused when it holds no token: `InputError` (``detail``; column
    ``input_ids``, stage "rollout", ``location``: ``row=`` or ``where=``; the fix, then ``more_fix``).
    Such a row is what a row that failed to encode under ``on_error="skip"`` reads as once it is a
    record (``MultiModalInputs.from_dict`` keeps no failure). For `prompt_rows` and the cosmos-rl packers."""
    if record.num_tokens == 0:
        raise InputError(detail, column="input_ids", stage="rollout", expected="a prompt of at least one token",
                         found="0 tokens (an empty row: what a row that failed to encode under on_error='skip' "
                               "reads as)",
                         fix="filter failed rows out before making records of them: ds, errors = "
                             "mmpipe.drop_failed(ds), or encode with mmpipe.encode_dataset" + more_fix, **location)
    return record


def _column_rows(columns: Mapping, n: int) -> list[MultiModalInputs]:
    """A dict of equal-length columns (``dataset[i:j]``) -> its rows."""
    bad = {k: len(v) for k, v in columns.items() if not hasattr(v, "__len__") or len(v) != n}
    if bad:
        raise ArgumentError(f"a dict of columns must hold {n} values per column (the 'family' column's count), "
                            f"got {bad}")
    return [MultiModalInputs.from_dict({k: v[i] for k, v in columns.items()}, row=i) for i in range(n)]


def to_vllm_prompts(rows_or_batch, processor_or_spec=None, *, tokenizer=None, images=None, videos=None,
                    video_options=None, audios=None) -> list[dict]:
    """Rows (or a batch) -> vLLM prompt dicts, one per row, in order.

    Each prompt is a dict with
    ``"prompt_token_ids"``: list[int] (collapsed: one ``<|image_pad|>`` per image),
    ``"multi_modal_data"``: ``{"image": [PIL.Image RGB, ...]}`` (the stored resized images) and
    ``"mm_processor_kwargs"``: ``{"min_pixels", "max_pixels"[, "do_resize"]}`` (see
    `vllm_processor_kwargs`); rows without images or videos carry only ``"prompt_token_ids"``.
    vLLM re-expands the pads to exactly the row's training ``input_ids``::

        # a sketch: llm stands in for a vllm.LLM (docs/how-to/vllm.md runs real vLLM)
        prompts = to_vllm_prompts(rows, processor)
        outs = llm.generate(prompts, vllm.SamplingParams(max_tokens=64))

    processor_or_spec: the processor the rows were encoded with, or its `VisionSpec`
    (None: the family's defaults; only patch size and normalisation matter here).

    Rows with videos also get one ``<|video_pad|>`` per video (inside the row's own
    ``<|vision_start|>``/``<|vision_end|>``), ``multi_modal_data["video"]``: per video the
    stored frames uint8 [t*T, H, W, 3], with a metadata dict for Qwen2.5-VL (``fps`` giving
    back ``second_per_grid_ts``) and Qwen3-VL (``fps`` and ``frames_indices`` re-creating the
    timestamps, read from the row's text with ``tokenizer``, default the processor's), and
    ``mm_processor_kwargs["videos_kwargs"] = {"do_resize": False, "do_sample_frames": False}``
    (`mmpipe.rollout.videos`).

    What a row's prompt holds is its family's media strategy's (``fam.media.vllm_prompt``, in the
    prompt style the kind declares: `mmpipe.rollout.vllm_prompts`): the above for the patch grids;
    for the tiled families (Gemma 3, InternVL, LLaVA-OneVision) one image token per image and the
    ORIGINAL images, which vLLM tiles again (`mmpipe.rollout.vllm_prompts.splice_prompt`: the
    processor is required; ``images``: one list per row of the images it was encoded from, for rows
    encoded without ``pixels="source"``). The generic path's rows are refused
    (`mmpipe.rollout.support.RolloutRefusal` naming the row) but the Omni
    thinkers' (`mmpipe.rollout.processor_prompts`: clips and images as media, each run collapsed;
    ``videos``: one list per row of the video files a row encoded with ``use_audio_in_video`` was
    encoded from, sampled again at the row's own rate or by ``video_options`` as given at encode;
    ``audios``: one list per row of the clips of a row encoded without ``audio='source'``, any form
    `mmpipe.audio.load_audio` takes).

    Each row is checked against its own family first (`mmpipe.rollout.support.check_row_families`):
    the rows are one model's, the processor's (or, without one, row 0's family); the first row of
    another family raises `FamilyMismatchError` naming it, expected and found. Every error names
    its row.
    """
    rows = prompt_rows(rows_or_batch)
    _check_per_row(images, "images", "images", len(rows))
    _check_per_row(videos, "videos", "video files", len(rows))
    _check_per_row(audios, "audios", "audio clips", len(rows))
    check_row_families(rows, "vllm_prompts", processor_or_spec, argument="processor_or_spec")
    if video_options is not None and videos is None:
        raise ArgumentError("video_options= goes with videos= (the rows' video files, sampled again by those options)")
    if videos is not None and rows and not rows[0].fam.media.TAKES_VIDEO_SOUND:
        raise ArgumentError(f"videos= is for rows encoded with use_audio_in_video=True (the Omni thinkers); "
                            f"{rows[0].family} rows hold their video frames: drop videos=")
    return [_row_prompt(r, i, processor_or_spec, tokenizer, None if images is None else images[i],
                        None if videos is None else videos[i], video_options, None if audios is None else audios[i])
            for i, r in enumerate(rows)]


def _check_per_row(value, name: str, what: str, n: int) -> None:
    """``name=`` of `to_vllm_prompts`: None or one list of ``what`` per row (``n`` rows)."""
    if value is not None and (isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) != n):
        got = type(value).__name__ + (f" of {len(value)}" if isinstance(value, Sequence) else "")
        raise ArgumentError(f"{name}= must hold one list of {what} per row ({n} rows), got {got}")


def _row_prompt(r: MultiModalInputs, i: int, processor_or_spec, tokenizer, images, videos, video_options,
                audios=None) -> dict:
    """Row ``i``'s prompt (its family's media strategy's; ``videos`` / ``video_options``: the generic
    path's videos with their sound), any error naming row ``i``."""
    try:
        return r.fam.media.vllm_prompt(r, processor_or_spec, tokenizer=tokenizer, images=images, index=i,
                                       videos=videos, video_options=video_options, audios=audios)
    except InputError as e:
        raise e.locate(row=i)
    except ArgumentError as e:
        if type(e) is ArgumentError and not str(e).startswith(f"row {i}"):
            raise ArgumentError(f"row {i} ({r.family}): {e}") from e
        raise


# ---- transformers generate ---------------------------------------------------------------
def _check_tf4_positions(batch: BatchedMultiModalInputs, position_ids: bool, model) -> None:
    """transformers 4.x, `to_generate_kwargs`: ``position_ids=True`` refused (`ArgumentError`): 4.57's
    ``generate`` never extends passed positions in decoding (Qwen2-VL / Qwen2.5-VL raise a size
    mismatch, Qwen3-VL / GLM-4.1V drop them for their own). Its Qwen2.5-VL ``get_rope_index`` casts
    ``second_per_grid_ts`` to int64: for videos it numbers otherwise than the rows
    (`mmpipe.rollout.tf4_positions.tf4_video_mismatches`) a ``UserWarning`` names the rows and the
    fix, ``generate`` inside `mmpipe.rollout.tf4_positions.training_positions` (what
    `TransformersEngine` does; no warning when ``model`` is given and already inside it)."""
    import transformers

    from mmpipe.rollout.tf4_positions import inside_training_positions, tf4_video_mismatches

    v = transformers.__version__
    if position_ids:
        raise ArgumentError(
            f"to_generate_kwargs(position_ids=True) on transformers {v}: its generate does not extend passed "
            "position_ids while decoding (Qwen2-VL / Qwen2.5-VL raise a size mismatch, Qwen3-VL / GLM-4.1V "
            "ignore them); expected position_ids=False, found True: leave it False (generate numbers the prompt "
            "itself; for Qwen2.5-VL videos run it inside mmpipe.rollout.tf4_positions.training_positions), "
            "or install transformers>=5")
    bad = tf4_video_mismatches(batch.fam, batch)
    if not bad or (model is not None and inside_training_positions(model)):
        return
    owner = {vid: b for b, vids in enumerate(batch.sample_to_video_indices) for vid in vids}
    sec = [round(float(batch.second_per_grid_ts.reshape(-1)[i]), 4) for i in bad]
    warnings.warn(
        f"to_generate_kwargs: transformers {v}'s Qwen2.5-VL generate numbers the prompt's videos with "
        f"second_per_grid_ts cast to an integer: rows {sorted({owner.get(i, -1) for i in bad})} (videos {bad}, "
        f"seconds per grid {sec}) get other temporal positions than the batch's rows (the original Qwen rule "
        "that training, verl and vLLM use), so rollout logprobs drift from the training forward; run "
        f"model.generate inside mmpipe.rollout.tf4_positions.training_positions(model, {batch.fam.name!r}, "
        "tokenizer) (and pass model= here), use mmpipe.rollout.transformers_engine.TransformersEngine, or "
        "sample videos at 1 or 2 fps", UserWarning, stacklevel=3)


def to_generate_kwargs(batch: BatchedMultiModalInputs, device=None, *, position_ids: bool = False, model=None) -> dict:
    """Kwargs for a transformers Qwen-VL ``model.generate`` from a LEFT-padded batch.

    Returns input_ids / attention_mask / mm_token_type_ids int64 [B, L], pixel_values float32
    [N, 3*T*p*p] + image_grid_thw int64 [I, 3] and pixel_values_videos float32 [Nv, 3*T*p*p] +
    video_grid_thw int64 [V, 3] (+ second_per_grid_ts float32 [V] for Qwen2.5-VL) when the
    batch holds them (any mix of images and videos per row, zero included). A batch collated with
    ``pixels_on_device=True`` (uint8 pixels only) is expanded on ``device`` (`model_inputs`).

    No ``position_ids`` by default: ``generate`` builds the 3-D positions and rope deltas
    itself at prefill (``_prepare_position_ids_for_generation`` -> ``get_rope_index``) and
    extends them by ``last + 1`` per new token. ``position_ids=True`` passes the batch's own
    [4, B, L] positions (plain text row first, as ``generate`` builds them); in transformers
    5.23 that gives identical results for images (checked in the tests), and for long
    videos it keeps the original Qwen rule where 5.23's ``get_rope_index`` diverges (see
    FACTS). Older transformers (4.x) recomputed positions in decoding from rope deltas that
    are never set when positions are passed, so the default stays the portable choice.

    transformers 4.x (`_check_tf4_positions`): ``position_ids=True`` refused (`ArgumentError`: its
    ``generate`` never extends passed positions); Qwen2.5-VL videos 4.x numbers otherwise than the
    rows (`mmpipe.rollout.tf4_positions.tf4_video_mismatches`, e.g. at 3 fps) warned about.

    ``mm_token_type_ids`` is left out where ``generate`` would refuse it as an unused model
    kwarg (transformers 4.57: "model_kwargs are not used by the model"): decided by ``model``'s
    forward signature when ``model`` is given, else by the installed transformers (< 5 drops it).
    """
    if not isinstance(batch, BatchedMultiModalInputs):
        raise TypeError(
            f"to_generate_kwargs takes a BatchedMultiModalInputs, got {type(batch).__name__}; "
            "collate the rows first: mmpipe.collate(rows, processor=processor, padding_side='left')"
        )
    last = batch.attention_mask[:, -1].tolist()  # torch or numpy fields (`mmpipe.records.batch`)
    if batch.padding_side != "left" and 0 in last:
        rows = [b for b, v in enumerate(last) if v == 0]
        raise ArgumentError(
            f"rows {rows} are right-padded: generate appends new tokens after the pads, so those rows "
            f"would continue from padding; to_generate_kwargs takes a left-padded batch, got one collated "
            f"with padding_side={batch.padding_side!r}: collate with padding_side='left' for generation"
        )
    has_vision = bool(int(batch.image_offsets[-1])) or bool(batch.video_grid_thw.shape[0])
    in_vision = any(k.startswith("pixel_values") for k in (batch.vision or {}))  # the generic path's pixels
    # a batch collated with pixels_on_device holds its pixels as uint8 only (model_inputs expands them)
    held = ("pixel_values", "pixel_values_u8", "pixel_values_videos", "pixel_values_videos_u8")
    if has_vision and all(getattr(batch, k) is None for k in held) and not in_vision:
        rows = [b for b, (i, v) in enumerate(zip(batch.sample_to_image_indices, batch.sample_to_video_indices))
                if i or v]
        raise PixelDataError(
            f"rows {rows} hold images or videos but the batch has no pixel data (layout-only encoding?): the "
            "model would answer without seeing them", where="", stage="rollout", column="pixel_values",
            expected="pixel_values or pixel_values_u8 for the rows' images / videos", found="no pixel data",
            fix="re-encode with pixels='uint8'",
        )
    if not is_transformers_5():
        _check_tf4_positions(batch, position_ids, model)
    out = batch.model_inputs(device, positions="verl" if position_ids else "none", labels=False)
    if "mm_token_type_ids" in out:
        takes = forward_accepts(model, "mm_token_type_ids") if model is not None else is_transformers_5()
        if not takes:
            del out["mm_token_type_ids"]
    return out
