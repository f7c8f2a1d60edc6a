"""verl: encoded rows -> verl's per-row dicts (RLHFDataset style) and ``DataProto``-ready batches.

::

    rows = verl_rows(enc.select(range(8)), processor, max_prompt_length=1024,
                     keep_columns=["data_source", "reward_model", "extra_info"])
    data = DataProto.from_single_dict(verl_batch(rows))     # or verl's own collate_fn(rows)

Each row dict (left-padded to ``max_prompt_length``, as verl pads prompts) holds:

- ``input_ids``, ``attention_mask``: torch int64 [Lp];
- ``position_ids``: torch int64 [4, Lp] for Qwen-VL (row 0 the plain text positions, rows 1-3
  M-RoPE, the row's own positions; pads 1 on every row, as verl's ``get_rope_index`` and its
  agent loop write them); [Lp] for a text-only family (verl's ``compute_position_id_with_mask``);
- ``raw_prompt_ids``: list[int], ONE ``<|image_pad|>`` per image (what vLLM / SGLang take);
- ``multi_modal_data``: ``{"image": [PIL.Image, ...]}``, the processor's resized images, and
  ``"video"``: the stored frames as vLLM takes them (see `verl_rows`) (``{}`` for a row
  without media, so every row has the key);
- ``multi_modal_inputs``: ``{"pixel_values": float32 [N, D], "image_grid_thw": int64 [I, 3],
  "images_seqlens": int64 [sum t]}`` (``{}`` without images): verl's actor concatenates these
  over the micro-batch (``verl.utils.model.extract_multi_modal_inputs``) and its trainer reads
  ``images_seqlens``;
- the pass-through columns (``keep_columns``, or a batch's ``batch.columns``), and, when
  ``extra_info`` is among them, ``index`` / ``tools_kwargs`` / ``interaction_kwargs`` taken
  from it as ``RLHFDataset.__getitem__`` does.

verl 0.9.x's stock ``RLHFDataset`` returns only ``raw_prompt`` messages and tokenizes in its
agent loop; these rows are what a custom dataset class (``data.custom_cls``) or a pre-agent-loop
pipeline feeds, and the tensor fields are those verl's actor reads from the training batch.
verl itself is never imported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.batching.collate import collate, collator_constants, kept_columns
from mmpipe.errors import ArgumentError
from mmpipe.families import resolve_family
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.inputs import to_vllm_prompts
from mmpipe.rollout.support import check_rollout

__all__ = ["verl_rows", "verl_batch", "collate_verl_rows"]

VERL_PAD_POSITION = 1  # verl's get_rope_index and agent loop start from torch.ones: pads read 1


def verl_rows(rows_or_batch, processor=None, *, max_prompt_length: Optional[int] = None,
              keep_columns: Optional[Sequence[str]] = None, family: Any = None,
              pad_token_id: Optional[int] = None) -> list[dict[str, Any]]:
    """Encoded rows (stored dicts, a ``datasets.Dataset``, an Arrow table as `mmpipe.ArrowRows`
    gives, `MultiModalInputs`) or a `BatchedMultiModalInputs` -> one verl row dict each (see the
    module docstring).

    Args:
        processor: the processor the rows were encoded with (pad id, resize bounds); else
            ``family`` / the rows' own family and pad id 0 (or ``pad_token_id``).
        max_prompt_length: left-pad every row to this length (verl's ``data.max_prompt_length``);
            a longer row raises `mmpipe.errors.InputError`. Default: the longest row.
        keep_columns: pass-through columns copied from each dict row; default none for rows,
            every ``batch.columns`` entry for a batch.

    Rows with videos: ``raw_prompt_ids`` hold one ``<|video_pad|>`` per video and
    ``multi_modal_data["video"]`` the frames as vLLM takes them (`mmpipe.rollout.videos`: uint8
    [t*T, H, W, 3], with a metadata dict for Qwen2.5-VL / Qwen3-VL), which verl's vLLM server
    passes on as ``multi_modal_data["video"]``; ``multi_modal_inputs`` adds
    ``pixel_values_videos`` / ``video_grid_thw`` (+ ``second_per_grid_ts`` for Qwen2.5-VL).
    """
    _check_families(rows_or_batch, processor, family)
    recs, kept = _inputs(rows_or_batch, keep_columns)
    fam_src = family if family is not None else (None if processor is not None else recs[0].family)
    fam, spec, pad_id = collator_constants("verl_rows", processor, fam_src, pad_token_id)
    batch = collate(recs, spec=spec, family=fam, padding_side="left", pad_token_id=pad_id,
                    pad_to_length=max_prompt_length)
    positions = _verl_positions(batch, fam.is_vision)
    prompts = to_vllm_prompts(recs, spec, tokenizer=processor)
    out = []
    for b, prompt in enumerate(prompts):
        row = {"input_ids": batch.input_ids[b].clone(), "attention_mask": batch.attention_mask[b].clone(),
               "position_ids": positions[b].clone(), "raw_prompt_ids": prompt["prompt_token_ids"]}
        if fam.is_vision:
            row["multi_modal_data"] = {k: prompt["multi_modal_data"][k] for k in ("image", "video")
                                       if k in prompt.get("multi_modal_data", {})}
            row["multi_modal_inputs"] = _row_vision_inputs(batch, b)
        row.update({name: values[b] for name, values in kept.items()})
        row.update(_extra_info_fields(row))
        out.append(row)
    return out


def verl_batch(rows_or_batch, processor=None, **kwargs) -> dict[str, Any]:
    """`verl_rows` collated the way verl's ``collate_fn`` does: tensors stacked to [B, ...]
    (``position_ids`` [B, 4, L]), every other field a numpy object array [B]. Ready for
    ``DataProto.from_single_dict``. Takes rows, a batch, or rows `verl_rows` already made."""
    if isinstance(rows_or_batch, list) and rows_or_batch and isinstance(rows_or_batch[0], dict) \
            and "raw_prompt_ids" in rows_or_batch[0]:
        return collate_verl_rows(rows_or_batch)
    return collate_verl_rows(verl_rows(rows_or_batch, processor, **kwargs))


def collate_verl_rows(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """verl's ``collate_fn`` semantics without importing verl: torch tensors stacked on a new
    dim 0, every other value (lists, dicts, strings, None) into a numpy object array [B]."""
    import torch

    keys = list(dict.fromkeys(k for r in rows for k in r))
    out: dict[str, Any] = {}
    for k in keys:
        missing = [i for i, r in enumerate(rows) if k not in r]
        if missing:
            raise ArgumentError(f"rows {missing} have no {k!r} while other rows do; verl's DataProto needs "
                                "every field on every row (keep the same columns for all rows)")
        vals = [r[k] for r in rows]
        if all(isinstance(v, torch.Tensor) for v in vals):
            out[k] = torch.stack(vals, 0)
        else:
            arr = np.empty(len(vals), dtype=object)
            for i, v in enumerate(vals):  # one by one: np.array would split lists into a 2-D array
                arr[i] = v
            out[k] = arr
    return out


def _check_families(rows_or_batch, processor, family) -> None:
    """Refuse the families verl rows are not for (`mmpipe.rollout.support`, stage "verl": the
    tiled families and the generic path), from the processor, ``family`` or the first row,
    with an `ArgumentError` saying what to use: verl's actor reads the patch grids'
    ``multi_modal_inputs`` (``pixel_values`` [N, D] + ``image_grid_thw``) and verl's vLLM server
    their prompts."""
    import pyarrow as pa

    x, first = rows_or_batch, None
    if isinstance(x, (BatchedMultiModalInputs, MultiModalInputs)):
        first = x.family
    elif isinstance(x, (pa.Table, pa.RecordBatch)):
        first = x.column("family")[0].as_py() if "family" in x.column_names and x.num_rows else None
    elif isinstance(x, Sequence) or hasattr(x, "column_names"):  # a list of rows or a datasets.Dataset
        head = x[0] if len(x) else None
        first = head.get("family") if isinstance(head, Mapping) else getattr(head, "family", None)
    for source in (processor, family, first):
        try:
            fam = resolve_family(source)
        except (TypeError, ArgumentError):  # None, or not a family: collate's own checks name it
            continue
        check_rollout(fam, "verl")


def _inputs(rows_or_batch, keep_columns) -> tuple[list[MultiModalInputs], dict[str, list]]:
    """(the records, the pass-through columns: name -> B values)."""
    if isinstance(keep_columns, str):
        raise ArgumentError(f"keep_columns must be a list of column names, got the string {keep_columns!r}")
    if isinstance(rows_or_batch, BatchedMultiModalInputs):
        from mmpipe.batching.unbatch import unbatch

        cols = rows_or_batch.columns or {}
        names = list(cols) if keep_columns is None else list(keep_columns)
        missing = [n for n in names if n not in cols]
        if missing:
            raise ArgumentError(f"keep_columns {missing} are not carried by the batch (it carries {sorted(cols)}); "
                                "collate with Collator(..., keep_columns=[...])")
        return unbatch(rows_or_batch), {n: list(cols[n]) for n in names}
    import pyarrow as pa

    if isinstance(rows_or_batch, (pa.Table, pa.RecordBatch)):  # ArrowRows / with_format("arrow")
        from mmpipe.records.arrow import rows_from_arrow

        if not rows_or_batch.num_rows:
            raise ArgumentError("verl_rows got no rows")
        return rows_from_arrow(rows_or_batch), kept_columns(rows_or_batch, list(keep_columns or ())) or {}
    rows = list(rows_or_batch) if not isinstance(rows_or_batch, MultiModalInputs) else [rows_or_batch]
    if not rows:
        raise ArgumentError("verl_rows got no rows")
    kept = kept_columns(rows, list(keep_columns or ())) or {}
    return [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(rows)], kept


def _verl_positions(batch: BatchedMultiModalInputs, vision: bool):
    """[B, 4, L] (text row + M-RoPE rows, pads 1) for VL families, [B, L] for text ones."""
    import torch

    from mmpipe.rope import text_positions

    valid = batch.attention_mask.bool()
    text = text_positions(batch.attention_mask)
    if not vision:
        return text
    pos = torch.cat([text[None], batch.position_ids], 0).transpose(0, 1).contiguous()
    return pos.masked_fill_(~valid[:, None, :], VERL_PAD_POSITION)


def _row_vision_inputs(batch: BatchedMultiModalInputs, b: int) -> dict[str, Any]:
    """Row ``b``'s share of ``batch.vision_inputs()`` (+ ``images_seqlens``), or {}."""
    import torch

    full = batch.vision_inputs()
    io, po = batch.image_offsets.tolist(), batch.patch_offsets.tolist()
    vo, vpo = batch.video_offsets.tolist(), batch.video_patch_offsets.tolist()
    parts = {"pixel_values": (po, b), "image_grid_thw": (io, b), "pixel_values_videos": (vpo, b),
             "video_grid_thw": (vo, b), "second_per_grid_ts": (vo, b)}
    out = {}
    for key, value in full.items():
        off, i = parts[key]
        if off[i + 1] > off[i]:
            out[key] = value[off[i]:off[i + 1]].clone()
    if "image_grid_thw" in out:
        g = out["image_grid_thw"]
        out["images_seqlens"] = torch.repeat_interleave(g[:, 1] * g[:, 2], g[:, 0])
    return out


def _extra_info_fields(row: dict) -> dict[str, Any]:
    """``index`` / ``tools_kwargs`` / ``interaction_kwargs`` from a kept ``extra_info``, as
    verl's ``RLHFDataset.__getitem__`` derives them."""
    if "extra_info" not in row:
        return {}
    info = row["extra_info"] = row["extra_info"] or {}
    return {"index": info.get("index", 0), "tools_kwargs": info.get("tools_kwargs", {}),
            "interaction_kwargs": info.get("interaction_kwargs", {})}
