"""Encode, the batched layout-only path: a batch of raw rows under ``pixels="none"`` in a
native Qwen-machinery family (`ModelFamily` with M-RoPE: Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
GLM-4.1V) -> the stored columns, with the per-row work done once per batch:

- the chat templates rendered in one ``apply_chat_template`` call per (generation prompt,
  tools) group - the conversations with marked replies too (labels) - instead of per row;
- ONE tokenizer call over all rows' (unexpanded) texts: the ``tokenizers`` backend's batch
  call without offset tracking, same ids; with labels, the offsets from the tokens' byte lengths
  where that is exact (`mmpipe.encoding.backend_tokenize`);
- the image sizes from the headers, a plain JPEG's read from its bytes without PIL
  (`mmpipe.images.jpeg_header`);
- every row's image pads expanded by one ``np.repeat`` over the batch's concatenated ids;
- ONE M-RoPE computation over the batch's rows laid end to end (`packed_rope_index`);
- the columns written straight from the batch arrays (no per-row record objects).

The output equals `mmpipe.encoding.encoder.Encoder.encode_row` row by row: same columns,
dtypes and values. A row this path does not take (it fails anywhere - parse, template,
tokenizer, image header, pad count -, holds videos, runs over ``max_length``, or its text is
long enough to be tokenized in pieces) is left to the per-row path, which raises, drops or
records it exactly as before (`mmpipe.encoding.mapping` merges the two in batch order).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from mmpipe.encoding.backend_tokenize import backend_encode, offset_array
from mmpipe.encoding.parse import check_text, parse_media, row_where
from mmpipe.encoding.placeholders import expand_image_pads
from mmpipe.encoding.render import span_labels
from mmpipe.encoding.marked_render import Probe, plain_text
from mmpipe.encoding.spans import marked_messages, reply_indices
from mmpipe.encoding.tokenize import MIN_CHARS
from mmpipe.images.headers import plain_image_hw
from mmpipe.images.load import confine_image
from mmpipe.images.pixels import image_grid
from mmpipe.records.columns import IGNORE_INDEX

__all__ = ["takes_layout_batch", "encode_layout", "packed_rope_index"]

ROPE_CHUNK_TOKENS = 1 << 20  # rows laid end to end per M-RoPE call (bounds its int64 temporaries)


def takes_layout_batch(enc) -> bool:
    """Whether a batch of encoder ``enc`` takes the batched layout path: its family's encode
    settings say so (``pixels="none"`` of a patch-grid vision family: Qwen's M-RoPE machinery)."""
    return bool(getattr(enc, "batched_layout", False)) and getattr(enc, "spec", None) is not None


@dataclass
class _Row:
    """One row on its way through the batch (dropped to None when it leaves for the per-row path)."""

    where: str
    messages: list
    images: list
    tools: Optional[list]
    agp: bool
    full: Optional[str] = None  # the conversation's render
    marked: Optional[str] = None  # the render with marked replies (labels), None where not rendered
    text: str = ""
    spans: tuple = ()
    ids: Any = None  # the tokenizer's list of ids
    offsets: Any = None
    grids: Any = None  # [(t, h, w), ...]


def encode_layout(enc, examples: list[dict], rows_idx: list) -> tuple[dict, list]:
    """The batched layout path over ``examples`` (raw rows; ``rows_idx``: their dataset indices
    or None) -> ``(columns, good)``: the stored columns of the rows it encoded, in
    `MultiModalInputs.to_dict` order (``columns[k][j]`` is batch row ``good[j]``'s value); every
    other row is left to the per-row path. Counts the rows it encodes in ``enc.stats``."""
    rows = [_parse(enc, ex, idx) for ex, idx in zip(examples, rows_idx)]
    _render(enc, rows)
    _tokenize(enc, rows)
    _grids(enc, rows)
    good = [i for i, r in enumerate(rows) if r is not None]
    columns = _columns(enc, [rows[i] for i in good]) if good else {}
    enc.stats.count(rows=len(good), encoded=len(good))
    return columns, good


# ---- per row: parse, then the texts ---------------------------------------------------------
def _parse(enc, example: dict, idx) -> Optional[_Row]:
    try:
        messages, images, videos, audios = parse_media(example, idx=idx, images_column=enc.images_column,
                                                       videos_column=enc.videos_column)
        tools = enc.row_tools(example, idx)
        messages = enc.template_messages(messages, row_where(idx))
    except Exception:  # noqa: BLE001 - the per-row path raises (or records) it, located
        return None
    if videos or audios:  # the per-row path encodes (or refuses) them
        return None
    agp = enc.add_generation_prompt
    if agp is None:
        agp = messages[-1]["role"] != "assistant"
    return _Row(row_where(idx), messages, images, tools, agp)


class _Renders:
    """Conversations to render, grouped by (generation prompt, tools): one batched
    ``Encoder.render_many`` call per group; a group that fails is rendered one by one (None
    where a conversation fails alone)."""

    def __init__(self, enc):
        self.enc, self.groups, self.out = enc, {}, []

    def ask(self, conversation: list, agp: bool, tools) -> int:
        group = self.groups.setdefault((agp, id(tools)), (agp, tools, [], []))
        group[2].append(conversation)
        group[3].append(len(self.out))
        self.out.append(None)
        return len(self.out) - 1

    def run(self) -> list:
        for agp, tools, convs, slots in self.groups.values():
            try:
                texts = self.enc.render_many(convs, agp, tools)
            except Exception:  # noqa: BLE001 - find the failing conversations
                texts = [self._one(c, agp, tools) for c in convs]
            for s, t in zip(slots, texts):
                self.out[s] = t
        return self.out

    def _one(self, conversation, agp, tools) -> Optional[str]:
        try:
            return self.enc.render_many([conversation], agp, tools)[0]
        except Exception:  # noqa: BLE001
            return None


def _render(enc, rows: list) -> None:
    """Each row's text, and its assistant spans (labels), from batched renders: a row with
    replies renders its conversation with marked replies (`mmpipe.encoding.spans`, the per-row
    rule), its own text read off that render where that is exact (`mmpipe.encoding.marked_render`),
    else rendered too (one more batched render for those rows)."""
    live = [row for row in rows if row is not None]
    first, asks = _Renders(enc), []
    for row in live:
        probe = Probe() if enc.labels and any(m["role"] == "assistant" for m in row.messages) else None
        conversation = row.messages if probe is None else marked_messages(row.messages, probe)
        asks.append((first.ask(conversation, row.agp, row.tools), probe))
    out, again, pending = first.run(), _Renders(enc), []
    for row, (slot, probe) in zip(live, asks):
        row.full, row.marked = (out[slot], None) if probe is None else (None, out[slot])
        if probe is not None and row.marked is not None:
            row.full = plain_text(row.marked, probe, reply_indices(row.messages))
        if row.full is None:
            pending.append((row, again.ask(row.messages, row.agp, row.tools)))
    texts = again.run() if pending else []
    for row, slot in pending:
        row.full = texts[slot]
    for i, row in enumerate(rows):
        if row is not None:
            rows[i] = _texts(enc, row)


def _texts(enc, row: _Row) -> Optional[_Row]:
    text = row.full
    if text is None:
        return None
    try:
        enc.warn_ignored_tools(row.messages, row.agp, row.tools, text)
        check_text(text, where=row.where, column="messages", what="the rendered prompt")
        spans = ()
        if enc.labels:
            text, spans, _ = enc.reply_spans(row.messages, text, row.where, row.tools, row.agp,
                                             marked_text=row.marked)
    except Exception:  # noqa: BLE001 - the per-row path raises the template's error
        return None
    row.text, row.spans = text, tuple(spans)
    return row


def _tokenize(enc, rows: list) -> None:
    """One tokenizer call over every row's text (offsets when a row has labels to place)."""
    take = [i for i, r in enumerate(rows) if r is not None and len(r.text) < MIN_CHARS]
    for i, r in enumerate(rows):
        if r is not None and len(r.text) >= MIN_CHARS:
            rows[i] = None  # long: tokenized in verified pieces by the per-row path
    if not take:
        return
    offsets = any(rows[i].spans for i in take)
    texts = [rows[i].text for i in take]
    try:
        got = backend_encode(enc.tokenizer, texts, offsets)
        if got is None:
            enc_out = enc.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=offsets,
                                    return_attention_mask=False, return_token_type_ids=False)
            ids, off = enc_out["input_ids"], [offset_array(o) for o in enc_out.get("offset_mapping") or ()]
        else:
            ids, off = got
    except Exception:  # noqa: BLE001
        for i in take:
            rows[i] = None
        return
    off = off if offsets else [None] * len(take)
    for i, row_ids, o in zip(take, ids, off):
        rows[i].ids, rows[i].offsets = row_ids, o


# ---- per row: pads and image headers -------------------------------------------------------
def _grids(enc, rows: list) -> None:
    """Each row's image grids from the headers; rows whose pad count is off, whose image fails,
    that are empty or that run over ``max_length`` go to the per-row path."""
    img_id, vid_id = enc.image_token_id, enc.video_token_id
    fam, cap = enc.family, enc.max_length
    sizes: dict = {}  # (h, w) -> the resized (h, w): one resize rule per size in the batch
    for i, r in enumerate(rows):
        if r is None:
            continue
        if not r.ids or r.ids.count(img_id) != len(r.images) or (vid_id is not None and vid_id in r.ids):
            rows[i] = None
            continue
        try:
            grids = [_grid(img, enc, r.where, sizes) for img in r.images]
        except Exception:  # noqa: BLE001
            rows[i] = None
            continue
        r.grids = grids
        if cap is not None:
            extra = int((fam.tokens_per_grid(grids) - 1).sum()) if grids else 0
            if len(r.ids) + extra > cap:
                rows[i] = None  # truncation: the per-row path raises, drops or cuts


def _grid(img, enc, where: str, sizes: dict) -> tuple[int, int, int]:
    """`image_grid` of one image; a plain JPEG's, PNG's or WebP's size read from its bytes without
    PIL (`mmpipe.images.headers`: only where PIL reads the same size and no EXIF rotation)."""
    if enc.image_root is not None:
        confine_image(img, enc.image_root, where=where)
    data = img.get("bytes") if isinstance(img, dict) else img
    hw = plain_image_hw(data) if type(data) is bytes else None
    if hw is None:
        return image_grid(img, enc.spec, where=where)
    if hw not in sizes:
        sizes[hw] = enc.spec.target_size(*hw)  # a refused size raises: the row takes the per-row path
    th, tw = sizes[hw]
    return 1, th // enc.spec.patch_size, tw // enc.spec.patch_size


# ---- the batch: expand, positions, columns -------------------------------------------------
def _labels(rows: list, ids: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """labels int64 [T] of the concatenated unexpanded ids: a token overlapping an assistant span
    is its id. One `span_labels` over the batch: each row's character offsets and spans shifted
    by the lengths of the texts before it (+1 each, so no zero-width token at a row's edge meets
    a neighbour's span): the same labels as row by row, without per-row array work."""
    lab = [r for r in rows if r.spans]
    if not lab:
        return np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
    lens = np.fromiter((len(r.text) + 1 for r in rows), np.int64, len(rows))
    base = np.cumsum(lens) - lens  # each row's first character in the joined texts
    n_tok = np.diff(np.append(starts, len(ids)))
    off = np.concatenate([r.offsets for r in rows]) if rows else np.zeros((0, 2), np.int64)
    off += np.repeat(base, n_tok)[:, None]
    spans = [(a + b, e + b) for r, b in zip(rows, base.tolist()) for a, e in r.spans]
    return span_labels(ids, off, spans)


def _columns(enc, rows: list) -> dict:
    """The stored columns of the batched rows (`MultiModalInputs.to_dict` order and dtypes)."""
    fam = enc.family
    n = len(rows)
    lens = np.fromiter((len(r.ids) for r in rows), np.int64, n)
    starts = np.cumsum(lens) - lens
    ids = np.fromiter(itertools.chain.from_iterable(r.ids for r in rows), np.int64, int(lens.sum()))
    labels = enc.unlabel_vision(ids, _labels(rows, ids, starts)) if enc.labels else None
    n_img = np.fromiter((len(r.grids) for r in rows), np.int64, n)
    grids = np.asarray([g for r in rows for g in r.grids], dtype=np.int64).reshape(-1, 3)
    pads = np.flatnonzero(ids == enc.image_token_id)  # one per image: rows in order, images in order
    grown = np.concatenate([[0], np.cumsum(fam.tokens_per_grid(grids) - 1)])  # extra tokens before each pad
    ends = starts + lens
    ends += grown[np.searchsorted(pads, ends)]
    lens = np.diff(ends, prepend=0)
    ids, labels = expand_image_pads(ids, pads, grids, fam, labels)  # the per-row path's expansion, once
    mm = ids == enc.image_token_id
    if labels is not None:
        labels[mm] = IGNORE_INDEX  # image pads are inputs, never targets
    pos, deltas = packed_rope_index(ids, mm, grids, lens, n_img, fam, np.int32)
    ends = ends.tolist()
    bounds = list(zip([0] + ends[:-1], ends))
    g_ends = np.cumsum(n_img).tolist()
    g_bounds = list(zip([0] + g_ends[:-1], g_ends))
    ids32, mm8, grids32 = ids.astype(np.int32), mm.view(np.int8), grids.astype(np.int32)
    ones = np.ones(len(ids), np.int8)
    cols = {
        "input_ids": [ids32[a:b] for a, b in bounds],
        "attention_mask": [ones[a:b] for a, b in bounds],
        "mm_token_type_ids": [mm8[a:b] for a, b in bounds],
        "position_ids": pos,
        "rope_delta": [np.int32(d) for d in deltas.tolist()],
        "image_grid_thw": [grids32[a:b] for a, b in g_bounds],
        "video_grid_thw": [np.zeros((0, 3), np.int32) for _ in range(n)],
        "second_per_grid_ts": [np.zeros(0, np.float32) for _ in range(n)],
        "family": [fam.name] * n,
    }
    if labels is not None:
        lab32 = labels.astype(np.int32)
        cols["labels"] = [lab32[a:b] for a, b in bounds]
    return cols


def packed_rope_index(ids: np.ndarray, mm: np.ndarray, image_grid_thw: np.ndarray, lens: np.ndarray,
                      n_images: np.ndarray, family, dtype=np.int64) -> tuple[list, np.ndarray]:
    """M-RoPE positions of rows laid end to end, each row's as if computed alone.

    Args:
        ids / mm: int [T] / bool [T] (image tokens), the rows' tokens concatenated (T = sum(lens)).
        image_grid_thw: int64 [I, 3], the rows' images in order; lens: int64 [B] tokens per row
        (each > 0); n_images: int64 [B] images per row; dtype: of the returned positions.

    Returns (positions: one ``dtype`` [3, L_b] array per row, deltas int64 [B]). The rule is
    shift-invariant: laid end to end, row b's positions are its own plus the next position
    after row b - 1 (its max + 1, which its last token holds: every axis peaks there), so one
    `mmpipe.rope.get_rope_index` call per chunk of rows (at most `ROPE_CHUNK_TOKENS` tokens, or
    one row) and a subtraction per row give every row's positions and delta.
    """
    from mmpipe.rope import get_rope_index

    B = len(lens)
    rows, deltas = [], np.empty(B, dtype=np.int64)
    ends, g_ends = np.cumsum(lens), np.cumsum(n_images)
    b = 0
    while b < B:
        t0, g0 = (int(ends[b - 1]), int(g_ends[b - 1])) if b else (0, 0)
        e = max(b + 1, int(np.searchsorted(ends, t0 + ROPE_CHUNK_TOKENS, "right")))
        t1, g1 = int(ends[e - 1]), int(g_ends[e - 1])
        grid = image_grid_thw[g0:g1]
        with _one_torch_thread():
            p, _ = get_rope_index(ids[None, t0:t1], mm[None, t0:t1].view(np.int8),
                                  image_grid_thw=grid if len(grid) else None, family=family)
        p = p[:, 0].numpy()
        stops = ends[b:e] - t0
        row_max = p[:, stops - 1].max(0)
        shift = np.concatenate([[0], row_max[:-1] + 1])  # where each row starts in the chunk
        deltas[b:e] = row_max - shift + 1 - lens[b:e]
        q = np.empty(p.shape, dtype=dtype)
        np.subtract(p, np.repeat(shift, lens[b:e]), out=q, casting="unsafe")
        rows += [q[:, lo:hi].copy() for lo, hi in zip((stops - lens[b:e]).tolist(), stops.tolist())]
        b = e
    return rows, deltas


@contextmanager
def _one_torch_thread():
    """torch on one intra-op thread for the duration: the packed batch is large enough for torch
    to split its elementwise ops over threads, which on a shared host stall whenever another
    process holds a core (measured: a 200k-element fill 50 us on one thread, 240 us on two with
    the other core busy). The work is memory-bound; one thread loses nothing on an idle host."""
    import torch

    n = torch.get_num_threads()
    if n != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if n != 1:
            torch.set_num_threads(n)
