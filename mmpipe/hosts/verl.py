"""verl: encoded rows -> verl's per-row dicts (RLHFDataset style) and ``DataProto``-ready batches.

::

    rows = verl_rows(enc.select(range(8)), processor, max_prompt_length=1024,
                     keep_columns=["data_source", "reward_model", "extra_info"])
    data = DataProto.from_single_dict(verl_batch(rows))     # or verl's own collate_fn(rows)

Each row dict (left-padded to ``max_prompt_length``, as verl pads prompts) holds:

- ``input_ids``, ``attention_mask``: torch int64 [Lp];
- ``position_ids``: torch int64 [4, Lp] for Qwen-VL (row 0 the plain text positions, rows 1-3
  M-RoPE, the row's own positions; pads 1 on every row, as verl's
  ``verl.models.transformers.qwen2_vl.get_rope_index`` writes them; verl 0.9.1's agent loop
  writes 1 on the text row and 0 on the M-RoPE rows, which the forward never reads: masked); [Lp] for a text-only family (verl's ``compute_position_id_with_mask``);
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

verl 0.9.x's ``RayPPOTrainer.fit()`` does NOT take these rows: its ``_get_gen_batch`` hands every
non-tensor field to the agent loop, which reads ``raw_prompt`` messages and tokenizes them
itself, and ``fit()`` keeps the dataset's tensors, so ``input_ids`` / ``attention_mask`` /
``position_ids`` clash with the rollout's in ``batch.union``. For ``fit()`` use
`verl_prompt_rows`: key for key what verl's ``RLHFDataset.__getitem__`` returns (``raw_prompt``
with mmpipe's resized images inline, ``dummy_tensor``, the kept columns, ``index`` /
``tools_kwargs`` / ``interaction_kwargs``), with ``MMPipeRLHFDataset`` (this module, built on
first access; ``data.custom_cls.path=<this file>``, ``name=MMPipeRLHFDataset``) so verl's agent
loop takes those images as they are (`verl_images_from_messages`) instead of calling
``qwen_vl_utils``. `verl_rows` stays the actor-side view (the tensors verl's actor reads).
verl itself is imported only by ``MMPipeRLHFDataset``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.batching.checks import check_not_failed
from mmpipe.batching.collate import collate, collator_constants, kept_columns
from mmpipe.errors import ArgumentError
from mmpipe.families import resolve_family
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout.inputs import to_vllm_prompts
from mmpipe.rollout.support import check_rollout

__all__ = ["verl_rows", "verl_batch", "collate_verl_rows", "verl_prompt_rows", "verl_images_from_messages"]
HOST_CLASSES = ("MMPipeRLHFDataset",)  # built from verl's own classes on first access (ImportError without verl)

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
    _check_prompt_lengths(recs, max_prompt_length)
    batch = collate(recs, spec=spec, family=fam, padding_side="left", pad_token_id=pad_id,
                    pad_to_length=max_prompt_length)
    positions = _verl_positions(batch, fam.is_vision)
    prompts = to_vllm_prompts(recs, spec, tokenizer=processor)
    vision = _vision_parts(batch) if fam.is_vision else None
    out = []
    for b, prompt in enumerate(prompts):
        row = {"input_ids": batch.input_ids[b].clone(), "attention_mask": batch.attention_mask[b].clone(),
               "position_ids": positions[b].clone(), "raw_prompt_ids": prompt["prompt_token_ids"]}
        if fam.is_vision:
            row["multi_modal_data"] = {k: prompt["multi_modal_data"][k] for k in ("image", "video")
                                       if k in prompt.get("multi_modal_data", {})}
            row["multi_modal_inputs"] = _row_vision_inputs(vision, b)
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


def _check_prompt_lengths(recs: Sequence[MultiModalInputs], max_prompt_length: Optional[int]) -> None:
    """A row longer than ``max_prompt_length`` raises `TruncationError` naming verl's settings
    (verl's agent loop refuses a multimodal prompt over ``rollout.prompt_length`` too; cutting it
    would cut image tokens)."""
    if max_prompt_length is None:
        return
    if isinstance(max_prompt_length, bool) or not isinstance(max_prompt_length, (int, np.integer)) \
            or max_prompt_length < 1:
        raise ArgumentError(f"verl_rows: max_prompt_length must be an int >= 1 (verl's data.max_prompt_length) "
                            f"or None (the longest row), got {max_prompt_length!r}")
    from mmpipe.errors import TruncationError

    for i, r in enumerate(recs):
        if r.num_tokens > max_prompt_length:
            raise TruncationError("the prompt does not fit verl's prompt width", row=i, column="input_ids",
                                  stage="collate", expected=f"at most max_prompt_length={max_prompt_length} tokens (the "
                                  f"width every row is left-padded to: pad_to_length={max_prompt_length})",
                                  found=f"{r.num_tokens} tokens",
                                  fix=f"raise data.max_prompt_length / rollout.prompt_length to at least "
                                      f"{r.num_tokens}, or drop such rows (data.filter_overlong_prompts=true, or "
                                      f"encode with max_length={max_prompt_length}, truncation='drop')")


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
        check_not_failed(rows_or_batch, "rollout")
        return rows_from_arrow(rows_or_batch), kept_columns(rows_or_batch, list(keep_columns or ())) or {}
    rows = list(rows_or_batch) if not isinstance(rows_or_batch, MultiModalInputs) else [rows_or_batch]
    if not rows:
        raise ArgumentError("verl_rows got no rows")
    check_not_failed(rows, "rollout")  # an on_error="skip" placeholder is no prompt
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


def _vision_parts(batch: BatchedMultiModalInputs) -> dict[str, tuple]:
    """``{key: (batch.vision_inputs()[key], its row offsets [B+1])}``, read once for all rows (per
    row they were B reads of the batch and its offsets: quadratic in the rows)."""
    io, po = batch.image_offsets.tolist(), batch.patch_offsets.tolist()
    vo, vpo = batch.video_offsets.tolist(), batch.video_patch_offsets.tolist()
    offsets = {"pixel_values": po, "image_grid_thw": io, "pixel_values_videos": vpo, "video_grid_thw": vo,
               "second_per_grid_ts": vo}
    return {key: (value, offsets[key]) for key, value in batch.vision_inputs().items()}


def _row_vision_inputs(parts: dict[str, tuple], b: int) -> dict[str, Any]:
    """Row ``b``'s share of the batch's vision inputs (`_vision_parts`; + ``images_seqlens``), or {}."""
    import torch

    out = {}
    for key, (value, off) in parts.items():
        if off[b + 1] > off[b]:
            out[key] = value[off[b]:off[b + 1]].clone()
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


def verl_prompt_rows(rows_or_batch, processor=None, *, prompt_key: str = "prompt",
                     keep_columns: Optional[Sequence[str]] = None, family: Any = None) -> list[dict[str, Any]]:
    """Encoded rows -> what verl 0.9's ``RLHFDataset.__getitem__`` returns, key for key, so
    ``RayPPOTrainer.fit()`` and its agent loop take them (a ``data.custom_cls`` returns one):

    - ``raw_prompt``: the messages of the kept ``prompt_key`` column (verl style: string contents
      with ``<image>`` placeholders, or content lists with ``{"type": "image"}`` items), each
      image item ``{"type": "image", "image": PIL.Image}`` holding mmpipe's resized image (the
      one the encoded row's ``pixel_values`` came from), in order;
    - ``dummy_tensor``: torch uint8 [1] (verl's placeholder so ``DataProto.batch`` is not empty);
    - the kept columns (``keep_columns``; ``prompt_key`` must be among them: verl's
      ``_build_messages`` rewrites that column in place, so it holds ``raw_prompt`` too), ``extra_info``
      (``{}`` when absent), ``index`` / ``tools_kwargs`` / ``interaction_kwargs`` from it.

    No ``input_ids`` / ``attention_mask`` / ``position_ids``: verl's agent loop tokenizes
    ``raw_prompt`` and ``fit()`` unions its output with the dataset's tensors.
    Rows with videos raise `ArgumentError` (the agent loop needs verl's video dicts).
    """
    import torch

    names = list(keep_columns or ())
    if prompt_key not in names:
        raise ArgumentError(f"verl_prompt_rows builds raw_prompt from the {prompt_key!r} column: expected it "
                            f"in keep_columns, found {names}; fix: encode with keep_columns=[{prompt_key!r}, ...] "
                            f"and pass the same list here")
    _check_families(rows_or_batch, processor, family)
    recs, kept = _inputs(rows_or_batch, names)
    fam_src = family if family is not None else (None if processor is not None else recs[0].family)
    fam, spec, _ = collator_constants("verl_prompt_rows", processor, fam_src, None)
    prompts = to_vllm_prompts(recs, spec, tokenizer=processor)
    out = []
    for b, (rec, prompt) in enumerate(zip(recs, prompts)):
        mm = prompt.get("multi_modal_data", {}) or {}
        if mm.get("video"):
            raise ArgumentError(f"row {b}: verl_prompt_rows takes image rows; found {len(mm['video'])} video(s); "
                                "fix: use verl_rows for the actor side, or pass videos as verl's dataset does")
        row = {name: values[b] for name, values in kept.items()}
        row["raw_prompt"] = row[prompt_key] = _messages_with_images(row[prompt_key], list(mm.get("image", [])), b,
                                                                   prompt_key)
        row["dummy_tensor"] = torch.tensor([0], dtype=torch.uint8)
        row["extra_info"] = row.get("extra_info") or {}
        row.update(_extra_info_fields(row))
        out.append(row)
    return out


def _messages_with_images(messages, images: list, row: int, column: str = "prompt") -> list[dict]:
    """verl's ``RLHFDataset._build_messages`` on a prompt column, with ``images`` in order. A
    column that is not a string or a list of message dicts raises `InputError` (row, column)."""
    import copy
    import re

    from mmpipe.errors import InputError

    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    bad = next((m for m in messages if not isinstance(m, Mapping)), None) if isinstance(messages, (list, tuple)) \
        else messages
    if bad is not None or not isinstance(messages, (list, tuple)):
        raise InputError("verl_prompt_rows builds raw_prompt from the prompt column", row=row, column=column,
                         stage="rollout", expected="a list of {'role', 'content'} message dicts (or a string)",
                         found=f"{type(bad).__name__}: {str(bad)[:60]}",
                         fix="keep the source rows' own prompt column (verl's format) when encoding")
    out, k = [], 0
    for m in messages:
        m = dict(m)
        content = m.get("content")
        if isinstance(content, str):
            if "<image>" in content:
                parts = []
                for seg in (s for s in re.split("(<image>)", content) if s):
                    if seg == "<image>":
                        if k >= len(images):
                            raise ArgumentError(f"row {row}: the prompt has more <image> placeholders than the "
                                                f"encoded row's {len(images)} images; fix: encode the same prompt")
                        parts.append({"type": "image", "image": images[k]})
                        k += 1
                    else:
                        parts.append({"type": "text", "text": seg})
                m["content"] = parts
        elif isinstance(content, list):
            parts = []
            for item in content:
                item = copy.copy(item)
                if isinstance(item, Mapping) and item.get("type") == "image":
                    if k >= len(images):
                        raise ArgumentError(f"row {row}: the prompt has more image items than the encoded "
                                            f"row's {len(images)} images; fix: encode the same prompt")
                    item = {"type": "image", "image": images[k]}
                    k += 1
                parts.append(item)
            m["content"] = parts
        out.append(m)
    if k != len(images):
        raise ArgumentError(f"row {row}: the prompt places {k} images, the encoded row holds {len(images)}; "
                            "fix: encode the same prompt column")
    return out


def verl_images_from_messages(messages) -> Optional[list]:
    """The PIL images of ``{"type": "image", "image": PIL.Image}`` items in message order, or None:
    what ``MMPipeRLHFDataset.process_vision_info`` hands verl's agent loop (no re-resize: the
    processor's own resize keeps mmpipe's sizes, which are already multiples of its factor). Raw
    rows' items (a parquet's ``{"bytes", "path"}``, a path, bytes) are opened (`mmpipe.images.load_image`)."""
    from mmpipe.images.load import load_image

    images = [item["image"] for m in messages if isinstance(m.get("content"), list)
              for item in m["content"] if isinstance(item, Mapping) and item.get("type") == "image"]
    return [im if hasattr(im, "size") else load_image(im) for im in images] or None


def __getattr__(name: str):
    if name == "MMPipeRLHFDataset":  # one class however this file is loaded (verl loads it by path): pickles by name
        import importlib

        home = importlib.import_module("mmpipe.hosts.verl")
        if vars(home) is globals():
            from mmpipe.hosts.verl_dataset import make_dataset_class

            cls = globals()[name] = make_dataset_class(verl_prompt_rows, verl_images_from_messages)
        else:
            cls = globals()[name] = getattr(home, name)
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
