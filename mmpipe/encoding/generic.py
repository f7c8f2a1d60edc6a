"""The generic path: any transformers VLM processor mmpipe has no family table for.

raw chat row -> the processor's own chat template + processor call -> `GenericInputs`
(its outputs, its dtypes) -> `collate_generic` -> `GenericBatch` (padding, ragged tiles,
1-D positions) -> ``model(**batch.model_inputs())``. None of mmpipe's speed features
(compact pixels, layout-only encoding) apply; batches are what the processor would give.
Not wired into `mmpipe.encoding.encoder.Encoder` yet::

    >>> enc = GenericEncoder(processor)                     # doctest: +SKIP
    >>> rows = [enc({"messages": msgs, "images": [photo]})] # doctest: +SKIP
    >>> batch = collate_generic(rows, pad_token_id=enc.pad_token_id)  # doctest: +SKIP
    >>> model(**batch.model_inputs()).logits                # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import numpy as np

from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import UnsupportedProcessorError, family_of, processor_class_name
from mmpipe.records.columns import to_numpy
from mmpipe.records.generic import GenericBatch, GenericInputs

__all__ = ["GenericEncoder", "collate_generic", "unbatch_generic"]

logger = logging.getLogger(__name__)


def _row_images(row: dict, messages: list) -> list:
    """The row's images: its ``images`` column, else the ``image`` values of its content items."""
    if row.get("images") is not None:
        return list(row["images"])
    return [item["image"] for m in messages if isinstance(m.get("content"), list)
            for item in m["content"] if isinstance(item, dict) and item.get("image") is not None]


def _template_messages(messages: list) -> list:
    """Messages with image objects replaced by ``{"type": "image"}`` (templates render the
    item, they must not see the pixels)."""
    def item(c):
        return {"type": "image"} if isinstance(c, dict) and (c.get("type") == "image" or "image" in c) else c

    return [dict(m, content=[item(c) for c in m["content"]]) if isinstance(m.get("content"), list) else m
            for m in messages]


class GenericEncoder:
    """Raw chat row -> `GenericInputs` through ``processor``'s own chat template and call.

    ``processor``: a transformers VLM processor of a family mmpipe has no table for (a native
    family is refused: its rows need mmpipe's Encoder and M-RoPE positions). Logs one line
    saying this path is used. ``log``: where that line goes (default: this module's logger).

    A row is ``{"messages": [...], "images": [...]}`` (``images`` optional: else the
    ``image`` values of the content items, in order). ``add_generation_prompt`` as in
    ``apply_chat_template``.
    """

    def __init__(self, processor, *, add_generation_prompt: bool = False,
                 log: Optional[Callable[[str], None]] = None):
        try:
            fam = family_of(processor)
        except UnsupportedProcessorError:
            fam = None
        if fam is not None:
            raise ArgumentError(f"processor {processor_class_name(processor)} is mmpipe's native family {fam.name!r}; "
                                f"encode it with mmpipe.encoding.Encoder (the generic path gives 1-D positions)")
        self.processor = processor
        self.processor_class = processor_class_name(processor)
        self.add_generation_prompt = add_generation_prompt
        self._row_keys: Optional[tuple[str, ...]] = None
        tok = getattr(processor, "tokenizer", processor)
        self.pad_token_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
        (log or logger.info)(f"mmpipe: {self.processor_class} has no family table; encoding through the generic path "
                             f"(its own chat template and processor call, 1-D positions, no compact pixels)")

    def row_keys(self) -> tuple[str, ...]:
        """Output names whose axis 0 is the row, found once by a probe: one row holding two
        small images (a per-image or per-patch output has 2 or more entries there)."""
        if self._row_keys is None:
            from PIL import Image

            im = Image.new("RGB", (64, 64), (120, 60, 30))
            msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "a"}]}]
            text = self.processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            out = self.processor(text=[text], images=[im, im], return_tensors="np")
            seq = len(to_numpy(out["input_ids"])[0])
            self._row_keys = tuple(sorted(k for k, v in out.items() if k not in ("input_ids", "attention_mask")
                                          and np.ndim(v) >= 1 and np.shape(v)[0] == 1
                                          and np.shape(v) != (1, seq)))
        return self._row_keys

    def __call__(self, row: dict, index: Optional[int] = None) -> GenericInputs:
        messages = row.get("messages")
        if not isinstance(messages, list):
            raise InputError("a generic row is a chat", row=index, column="messages", stage="parse",
                             expected="a list of {'role', 'content'} messages", found=type(messages).__name__,
                             fix="put the conversation in a 'messages' column")
        images = _row_images(row, messages)
        text = self.processor.apply_chat_template(_template_messages(messages), tokenize=False,
                                                  add_generation_prompt=self.add_generation_prompt)
        out = self.processor(text=[text], images=images or None, return_tensors="np")
        ids = to_numpy(out["input_ids"])[0].astype(np.int64)
        row_keys = self.row_keys() if images else ()
        sequence, vision = {}, {}
        for k, v in out.items():
            if k in ("input_ids", "attention_mask"):
                continue
            v = np.asarray(to_numpy(v))
            if v.shape == (1, len(ids)) and k not in row_keys:
                sequence[k] = v[0].astype(np.int64)
            else:
                vision[k] = v
        return GenericInputs(input_ids=ids, attention_mask=np.ones(len(ids), np.int64),
                             processor_class=self.processor_class, sequence=sequence, vision=vision,
                             row_keys=tuple(k for k in row_keys if k in vision)).validate(index)


def _padded(arr: np.ndarray, shape: tuple) -> np.ndarray:
    """``arr`` zero-padded at the end of every axis to ``shape``."""
    if arr.shape == tuple(shape):
        return arr
    out = np.zeros(shape, arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def _collate_vision(rows: list[GenericInputs], key: str, row_key: bool) -> tuple[np.ndarray, list]:
    present = [r.vision[key] for r in rows if key in r.vision]
    trailing = tuple(np.max([a.shape[1:] for a in present], axis=0))
    if row_key:  # [1, n, ...] per row; a row without it is all padding, as the processor pads
        blocks = [_padded(r.vision[key], (1, *trailing)) if key in r.vision else np.zeros((1, *trailing), present[0].dtype)
                  for r in rows]
    else:
        blocks = [_padded(a, (a.shape[0], *trailing)) for a in present]
    return np.concatenate(blocks), [r.vision[key].shape if key in r.vision else None for r in rows]


def collate_generic(rows: list[GenericInputs], *, pad_token_id: int = 0, padding_side: str = "right") -> GenericBatch:
    """`GenericInputs` rows -> one padded `GenericBatch` (see its doc for the shapes).

    Every row must come from the same processor class. ``position_ids`` are ``0..n-1`` over
    each row's own tokens (pads 0), so left and right padding give the per-row positions.
    """
    if not rows:
        raise ArgumentError("collate_generic needs at least one row")
    if padding_side not in ("left", "right"):
        raise ArgumentError(f"padding_side must be 'left' or 'right', found {padding_side!r}")
    for i, r in enumerate(rows):
        if r.processor_class != rows[0].processor_class:
            raise InputError("rows of different processors in one batch", row=i, column="processor_class",
                             stage="collate", expected=rows[0].processor_class, found=r.processor_class,
                             fix="batch rows encoded by one processor")
    lengths = np.array([len(r) for r in rows], np.int64)
    B, L = len(rows), int(lengths.max())

    def pad(get, fill):
        out = np.full((B, L), fill, np.int64)
        for b, r in enumerate(rows):
            cols = slice(0, lengths[b]) if padding_side == "right" else slice(L - lengths[b], L)
            out[b, cols] = get(r)
        return out

    row_keys = tuple(sorted({k for r in rows for k in r.row_keys}))
    vision, shapes = {}, {}
    for key in sorted({k for r in rows for k in r.vision}):
        vision[key], shapes[key] = _collate_vision(rows, key, key in row_keys)
    with_labels = any(r.labels is not None for r in rows)
    return GenericBatch(
        input_ids=pad(lambda r: r.input_ids, pad_token_id), attention_mask=pad(lambda r: r.attention_mask, 0),
        position_ids=pad(lambda r: r.position_ids, 0), processor_class=rows[0].processor_class,
        padding_side=padding_side, lengths=lengths, row_keys=row_keys, shapes=shapes, vision=vision,
        sequence={k: pad(lambda r, k=k: r.sequence[k], 0) for k in sorted({k for r in rows for k in r.sequence})},
        labels=pad(lambda r: r.labels if r.labels is not None else np.full(len(r), -100), -100) if with_labels else None,
    )


def unbatch_generic(batch: GenericBatch) -> list[GenericInputs]:
    """`GenericBatch` -> its rows, exactly as collated (``unbatch_generic(collate_generic(rows))``
    equals ``rows``)."""
    rows, offsets = [], {k: 0 for k in batch.vision}
    L = batch.input_ids.shape[1]
    for b, n in enumerate(batch.lengths):
        cols = slice(0, n) if batch.padding_side == "right" else slice(L - n, L)
        vision = {}
        for key, arr in batch.vision.items():
            shape = batch.shapes[key][b]
            if shape is None:
                continue
            start = b if key in batch.row_keys else offsets[key]
            vision[key] = arr[start:start + shape[0]][tuple(slice(0, s) for s in shape)]
            offsets[key] += 0 if key in batch.row_keys else shape[0]
        rows.append(GenericInputs(
            input_ids=batch.input_ids[b, cols], attention_mask=batch.attention_mask[b, cols],
            processor_class=batch.processor_class, sequence={k: v[b, cols] for k, v in batch.sequence.items()},
            vision=vision, row_keys=tuple(k for k in batch.row_keys if k in vision),
            labels=batch.labels[b, cols] if batch.labels is not None else None))
    return rows
