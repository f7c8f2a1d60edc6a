"""Raw row -> `MultiModalInputs`: the map stage for ``dataset.map(mmpipe.encode, ...)``.

Accepted raw rows (the format is found by looking at the row):

(a) Hub convention: ``messages`` whose content lists hold ``{"type": "image"}`` placeholders,
    plus an ``images`` column (``Sequence(Image())``), consumed in order;
(b) inline images: content items ``{"type": "image", "image": <image>}``;
(c) verl style: ``prompt`` text (or a message list with string contents) containing
    ``<image>`` placeholders, plus an ``images`` column.

An image may be a ``datasets.Image()`` value (dict with bytes/path, or PIL), a path, raw
bytes, a PIL image or a uint8 array. Rows may also carry a ``completion`` (TRL
prompt-completion style) appended as the assistant turn.

Example::

    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": processor}, num_proc=2)
    enc = ds.map(mmpipe.encode, fn_kwargs={"processor": processor, "max_length": 4096,
                 "truncation": "drop"}, batched=True, remove_columns=ds.column_names)

Image placeholders are expanded at the token-id level (one ``<|image_pad|>`` id ->
``t*h*w/merge^2`` ids). This equals tokenizing the expanded text, because the pad token is
a special token that never merges with its neighbours, and avoids tokenizing thousands of
special tokens per image.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from concurrent.futures import wait
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from mmpipe.errors import ImageError, InputError, ParseError, PlaceholderError, TruncationError
from mmpipe.families import ModelFamily, family_of
from mmpipe.images.spec import VisionSpec
from mmpipe.images.threads import default_threads, thread_pool
from mmpipe.images.pixels import encode_image, image_grid
from mmpipe.records.columns import IGNORE_INDEX, PIXEL_FORMATS
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.columns import IMAGE_PLACEHOLDER

logger = logging.getLogger("mmpipe")

TRUNCATION_POLICIES = ("raise", "drop", "truncate_text")
ERROR_POLICIES = ("raise", "skip")
# Under on_error="skip" every output row carries this column: "" when encoded, else the
# JSON of {"row", "stage", "column", "reason"} (the row itself is then empty: 0 tokens).
ERROR_COLUMN = "mmpipe_error"


class RowDropped(Exception):
    """Raised inside the encoder when a row is dropped under ``truncation="drop"``."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


@dataclass
class EncodeStats:
    """Counts of this process's encoder: rows seen, encoded, dropped by reason."""

    rows: int = 0
    encoded: int = 0
    dropped: Counter = None  # type: ignore[assignment]
    failed: Counter = None  # type: ignore[assignment]  # on_error="skip": failures by stage

    def __post_init__(self):
        self.dropped = Counter() if self.dropped is None else self.dropped
        self.failed = Counter() if self.failed is None else self.failed


def _where(idx) -> str:
    return f"row {idx}" if idx is not None else "row (index unknown: pass with_indices=True to map)"


# ---- raw row parsing -------------------------------------------------------------------
def is_image_item(item: dict) -> bool:
    t = item.get("type")
    if t in ("image", "image_url"):
        return True
    return t is None and (item.get("image") is not None or item.get("image_url") is not None)


def inline_image(item: dict):
    if item.get("image") is not None:
        return item["image"]
    url = item.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    return url if url is not None else (item.get("path") or item.get("url"))


def _split_placeholders(text: str) -> list[dict]:
    parts = text.split(IMAGE_PLACEHOLDER)
    items: list[dict] = []
    for i, part in enumerate(parts):
        if i:
            items.append({"type": "image"})
        if part:
            items.append({"type": "text", "text": part})
    return items


def parse_row(example: dict, *, idx=None, images_column: str = "images") -> tuple[list[dict], list[Any]]:
    """Raw row -> (messages for the chat template, images in order of appearance).

    Returned messages carry only ``{"type": "image"}`` / ``{"type": "text", "text": ...}``
    items (or plain string contents); image values are returned separately.
    """
    where = _where(idx)
    if example.get("messages") is not None:
        raw = example["messages"]
        column = "messages"
    elif example.get("prompt") is not None:
        raw = example["prompt"]
        column = "prompt"
        if isinstance(raw, str):
            raw = [{"role": "user", "content": raw}]
    else:
        raise ParseError(
            f"found columns {sorted(example)}", where=where,
            expected="a 'messages' column (chat messages) or a 'prompt' column (text or chat messages)",
            fix="rename your column",
        )
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ParseError(f"column {column!r}: expected a non-empty list of chat messages, found {raw!r:.80}",
                         where=where, column=column,
                         fix="parse JSON-encoded messages first (json.loads)" if isinstance(raw, str) else
                             "drop rows without messages, or give at least one {'role', 'content'} message")
    completion = example.get("completion")
    if completion is not None:
        raw = list(raw) + ([{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion))

    column_images = example.get(images_column)
    if column_images is not None and not isinstance(column_images, (list, tuple)) and not (
            isinstance(column_images, np.ndarray) and column_images.dtype == object and column_images.ndim == 1):
        # one bare image (or a string) instead of a list: iterating it would crash or split it (found by fuzzing)
        raise ParseError(f"column {images_column!r} must hold a list of images", where=where, column=images_column,
                         expected="a list (datasets.Sequence(datasets.Image()))", found=type(column_images).__name__,
                         fix=f"wrap it: {{{images_column!r}: [image]}}")
    column_images = list(column_images) if column_images is not None else []
    has_column_images = bool(column_images)
    next_col = 0
    images: list[Any] = []
    messages: list[dict] = []
    for m_i, msg in enumerate(raw):
        if not isinstance(msg, dict) or "role" not in msg:
            raise ParseError(f"column {column!r}, message {m_i}: expected {{'role', 'content'}}, found {msg!r:.80}",
                             where=where, column=column, fix="give each message a 'role' and a 'content'")
        content = msg.get("content")
        if content is None:
            content = ""
        if isinstance(content, str):
            if IMAGE_PLACEHOLDER in content and has_column_images:
                content = _split_placeholders(content)
            else:
                messages.append({"role": msg["role"], "content": content})
                continue
        if not isinstance(content, (list, tuple)):
            raise ParseError(
                f"column {column!r}, message {m_i}: content must be a string or a list of items, "
                f"found {type(content).__name__}", where=where, column=column,
                fix="store text as a string, or as [{'type': 'text', 'text': ...}] items",
            )
        items = []
        for item in content:
            if isinstance(item, str):
                items.append({"type": "text", "text": item})
                continue
            if not isinstance(item, dict):
                raise ParseError(f"message {m_i}: content item {item!r:.60} is not a dict", where=where, column=column,
                                 expected="{'type': 'text', 'text': str} or {'type': 'image', ...}",
                                 found=type(item).__name__, fix="wrap the item in a dict")
            if is_image_item(item):
                inline = inline_image(item)
                if inline is None:
                    if next_col >= len(column_images):
                        raise PlaceholderError(
                            f"the messages hold more image placeholders than the "
                            f"{len(column_images)} image(s) of column {images_column!r}", where=where,
                            column=images_column, fix="give one image per placeholder",
                        )
                    inline = column_images[next_col]
                    next_col += 1
                images.append(inline)
                items.append({"type": "image"})
            elif item.get("type") == "video" or item.get("video") is not None:
                raise ParseError(
                    f"message {m_i}: video items are not supported by mmpipe.encode yet", where=where, column=column,
                    fix="encode videos with the transformers processor and mmpipe.rows_from_processor_output",
                )
            else:
                text = item.get("text")
                if text is None:
                    raise ParseError(f"message {m_i}: content item {item!r:.80} has neither text nor an image",
                                     where=where, column=column, fix="give text items a 'text' string")
                if not isinstance(text, str):
                    raise ParseError(f"message {m_i}: text must be a string, found {type(text).__name__}",
                                     where=where, column=column, expected="str", found=type(text).__name__,
                                     fix="convert the value to a string (str(x)) when building the dataset")
                items.append({"type": "text", "text": text})
        messages.append({"role": msg["role"], "content": items})
    if next_col != len(column_images):
        raise PlaceholderError(
            f"column {images_column!r} holds {len(column_images)} image(s) but the messages hold "
            f"{next_col} placeholder(s) for them", where=where, column=images_column,
            fix=f"every image needs exactly one placeholder ({{'type': 'image'}} in a content list, or "
                f"{IMAGE_PLACEHOLDER} in prompt text)",
        )
    return messages, images


# ---- the encoder -----------------------------------------------------------------------
class Encoder:
    """Raw rows -> `MultiModalInputs`. Picklable; configuration here, work in the call.

    Args:
        processor: a transformers Qwen-VL processor (or a tokenizer for text-only models).
        max_length: token budget per row (after image expansion); None = no limit.
        truncation: ``"raise"`` (ValueError naming the row), ``"drop"`` (the row is left out
            of a batched map and counted in ``stats``), or ``"truncate_text"`` (cut text from
            the end; an image's tokens are never cut - if the cut would reach one, raise).
        pixels: ``"uint8"`` (compact), ``"float32"`` (processor pixel_values) or ``"none"``
            (layout only: ids, grids and positions from image headers, no pixel decode).
        add_generation_prompt: None = add it when the last message is not the assistant's.
        labels: emit ``labels`` (-100 except assistant response tokens, incl. ``<|im_end|>``).
        min_pixels / max_pixels: override the processor's resize bounds.
        threads: threads decoding and resizing a row's images concurrently (PIL releases the
            GIL); None = `mmpipe.images.default_threads` (1 inside ``datasets.map(num_proc=...)``
            workers, where the processes already share the cores).
        on_error: ``"raise"`` (the row's `mmpipe.errors.InputError`) or ``"skip"``: a failing
            row becomes an empty row (0 tokens) whose `ERROR_COLUMN` holds the JSON record
            ``{"row", "stage", "column", "reason"}`` (``""`` on encoded rows), counted in
            ``stats.failed`` by stage. Nothing vanishes: `encode_dataset` filters those rows
            out into ``report.errors``; after a plain ``ds.map`` call `drop_failed`, and
            `Collator` refuses rows that carry an error.
    """

    def __init__(
        self,
        processor,
        *,
        max_length: Optional[int] = None,
        truncation: str = "raise",
        pixels: str = "uint8",
        add_generation_prompt: Optional[bool] = None,
        labels: bool = True,
        min_pixels: Optional[int] = None,
        max_pixels: Optional[int] = None,
        images_column: str = "images",
        chat_template_kwargs: Optional[dict] = None,
        threads: Optional[int] = None,
        on_error: str = "raise",
    ):
        if on_error not in ERROR_POLICIES:
            raise ValueError(f"on_error must be one of {ERROR_POLICIES}, got {on_error!r}")
        if truncation not in TRUNCATION_POLICIES:
            raise ValueError(f"truncation must be one of {TRUNCATION_POLICIES}, got {truncation!r}")
        if pixels not in PIXEL_FORMATS:
            raise ValueError(f"pixels must be one of {PIXEL_FORMATS}, got {pixels!r}")
        self.processor = processor
        self.family: ModelFamily = family_of(processor)
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.spec = VisionSpec.from_processor(processor, min_pixels, max_pixels) if self.family.is_vision else None
        self.max_length = max_length
        self.truncation = truncation
        self.pixels = pixels
        self.add_generation_prompt = add_generation_prompt
        self.labels = labels
        self.images_column = images_column
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.threads = threads
        self.on_error = on_error
        # encode_dataset sets this: dropped rows stay as empty rows with their reason in
        # DROP_REASON_COLUMN, so counts survive num_proc; the caller filters them out.
        self.mark_dropped = False
        tok = self.tokenizer
        fam = self.family
        self.image_token_id = tok.convert_tokens_to_ids(fam.image_token) if fam.is_vision else None
        self.video_token_id = tok.convert_tokens_to_ids(fam.video_token) if fam.is_vision else None
        self.vision_start_id = tok.convert_tokens_to_ids(fam.vision_start_token) if fam.is_vision else None
        self.stats = EncodeStats()

    # -- rendering ------------------------------------------------------------------
    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """The chat template applied to ``messages`` (text, not tokenized)."""
        target = self.processor if hasattr(self.processor, "apply_chat_template") else self.tokenizer
        try:
            return target.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, **self.chat_template_kwargs
            )
        except Exception as e:  # jinja raises its own types (TemplateError, TypeError, ...)
            raise InputError(f"the chat template failed on these messages ({type(e).__name__}: {e})",
                             stage="template", column="messages",
                             fix="check the roles and their order against the model's chat template") from e

    def _assistant_spans(self, messages: list[dict], full: str, where: str) -> list[tuple[int, int]]:
        """Character spans of assistant responses in ``full`` (content + end-of-turn token)."""
        spans = []
        for k, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            before = self.render(messages[:k], True) if k else ""
            upto = self.render(messages[: k + 1], False)
            if not (full.startswith(before) and full.startswith(upto) and upto.startswith(before)):
                raise InputError(
                    "the chat template does not render conversation prefixes as prefixes of the "
                    "whole conversation, so assistant tokens cannot be located", where=where, stage="template",
                    fix="pass labels=False or a prefix-stable chat template",
                )
            end = len(upto)
            while end > len(before) and upto[end - 1] in "\n ":
                end -= 1
            spans.append((len(before), end))
        return spans

    # -- one row --------------------------------------------------------------------
    def encode_row(self, example: dict, idx=None, *, _images=None) -> MultiModalInputs:
        """One raw row -> `MultiModalInputs`; bad input raises `mmpipe.errors.InputError`
        (a ValueError) naming the row index ``idx``. (``_images``: the row's image futures
        started by a batched call, see `_prefetch`.)"""
        try:
            return self._encode_row(example, idx, _images)
        except InputError as e:
            raise e.locate(row=idx)

    def _encode_row(self, example: dict, idx=None, prefetched=None) -> MultiModalInputs:
        where = _where(idx)
        fam = self.family
        messages, images = parse_row(example, idx=idx, images_column=self.images_column)
        if images and not fam.is_vision:
            raise PlaceholderError(f"holds {len(images)} image(s) but the processor is a text-only tokenizer",
                                   where=where, column=self.images_column,
                                   fix="encode with a vision-language processor, or drop the images")
        agp = self.add_generation_prompt
        if agp is None:
            agp = messages[-1]["role"] != "assistant"
        text = self.render(messages, agp)
        want_labels = self.labels
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=want_labels)
        ids = np.asarray(enc["input_ids"], dtype=np.int64)
        labels = None
        if want_labels:
            labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
            spans = self._assistant_spans(messages, text, where)
            if spans:
                starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64).reshape(-1)
                for a, b in spans:
                    sel = (starts >= a) & (starts < b)
                    labels[sel] = ids[sel]

        grids = np.zeros((0, 3), dtype=np.int64)
        u8_blocks: list[np.ndarray] = []
        if fam.is_vision:
            pad_pos = np.flatnonzero(ids == self.image_token_id)
            if len(pad_pos) != len(images):
                raise PlaceholderError(
                    f"the rendered prompt holds {len(pad_pos)} {fam.image_token} token(s) but the row "
                    f"has {len(images)} image(s)", where=where, column="messages",
                    expected=f"one {fam.image_token} per image", found=f"{len(pad_pos)}",
                    fix=(f"remove literal {fam.image_token} text from the messages" if len(pad_pos) > len(images)
                         else "the chat template did not render every image item (Qwen3-VL's template drops "
                              "images in system messages): move those images to a user turn"),
                )
            if (ids == self.video_token_id).any():
                raise ParseError(f"the prompt holds {fam.video_token} but videos are not supported by encode yet",
                                 where=where, column="messages", fix=f"remove literal {fam.video_token} text")
            grid_list = []
            if self.pixels == "none":
                grid_list = [self._at_image(i, image_grid, img, self.spec, where=f"{where}, image {i}")
                             for i, img in enumerate(images)]
            else:
                encoded = ([f.result() for f in prefetched] if prefetched is not None
                           else self._encode_images(images, where))
                for u8, g in encoded:
                    u8_blocks.append(u8)
                    grid_list.append(g)
            if grid_list:
                grids = np.asarray(grid_list, dtype=np.int64)
                n_tok = grids.prod(axis=1) // fam.merge_size**2
                reps = np.ones(ids.shape, dtype=np.int64)
                reps[pad_pos] = n_tok
                ids = np.repeat(ids, reps)
                if labels is not None:
                    labels = np.repeat(labels, reps)
        mm = np.zeros(ids.shape, dtype=np.int64)
        if fam.is_vision:
            mm[ids == self.image_token_id] = 1
            if labels is not None:
                labels[mm == 1] = IGNORE_INDEX

        ids, labels, mm, grids, u8_blocks = self._truncate(ids, labels, mm, grids, u8_blocks, where)
        return self._finish(ids, labels, mm, grids, u8_blocks)

    def _n_threads(self) -> int:
        return default_threads() if self.threads is None else max(1, int(self.threads))

    def _encode_images(self, images: list, where: str) -> list:
        """(uint8 patches, grid) per image, on worker threads when there are several."""
        n_threads = self._n_threads()
        spec = self.spec
        if n_threads <= 1 or len(images) <= 1:
            return [self._at_image(i, encode_image, img, spec, where=f"{where}, image {i}") for i, img in enumerate(images)]
        futures = self._submit_images(images, where, thread_pool())
        return [f.result() for f in futures]  # in order: the first failing image raises

    def _submit_images(self, images: list, where: str, pool) -> list:
        """One future of (uint8 patches, grid) per image on ``pool``. The same object twice
        is submitted once: a lazily decoded PIL image must not be loaded by two threads."""
        own, futures = {}, []
        for i, img in enumerate(images):
            f = own.get(id(img))
            if f is None:
                f = own[id(img)] = pool.submit(self._at_image, i, encode_image, img, self.spec,
                                               where=f"{where}, image {i}")
            futures.append(f)
        return futures

    def _at_image(self, i: int, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` with its `ImageError` located at image ``i`` of the images column."""
        try:
            return fn(*args, **kwargs)
        except ImageError as e:
            raise e.locate(column=self.images_column, image=i)

    def _truncate(self, ids, labels, mm, grids, u8_blocks, where):
        L, cap = len(ids), self.max_length
        if cap is None or L <= cap:
            return ids, labels, mm, grids, u8_blocks
        detail = f"{where}: {L} tokens (text + {int((mm > 0).sum())} image tokens) exceed max_length={cap}"
        if self.truncation == "raise":
            raise TruncationError(detail, where="", column="input_ids",
                                  fix="raise max_length, lower max_pixels, or pass truncation='drop' / 'truncate_text'")
        if self.truncation == "drop":
            raise RowDropped("too_long", detail)
        # truncate_text: cut at `cap` unless that reaches into an image block (its
        # <|vision_start|> ... tokens ... <|vision_end|> span).
        vis = np.flatnonzero(mm > 0)
        if len(vis):
            last_block_end = int(vis[-1]) + 2  # image tokens, then <|vision_end|>
            if cap < last_block_end:
                raise TruncationError(
                    detail + f"; truncating text only would cut into an image (its tokens end at {last_block_end})",
                    where="", column="input_ids", fix="use truncation='drop' or a larger max_length",
                )
        lab = labels[:cap] if labels is not None else None
        return ids[:cap], lab, mm[:cap], grids, u8_blocks

    def _finish(self, ids, labels, mm, grids, u8_blocks) -> MultiModalInputs:
        from mmpipe.rope import get_rope_index

        fam = self.family
        pos, delta = get_rope_index(ids[None], mm[None], image_grid_thw=grids if len(grids) else None, family=fam)
        row = MultiModalInputs(
            input_ids=ids,
            attention_mask=np.ones(ids.shape, dtype=np.int64),
            mm_token_type_ids=mm,
            position_ids=pos[:, 0, :].numpy(),
            rope_delta=int(delta.reshape(-1)[0]),
            family=fam.name,
            labels=labels,
            image_grid_thw=grids,
        )
        if self.pixels == "uint8":
            row.pixel_values_u8 = np.concatenate(u8_blocks) if u8_blocks else np.zeros((0, fam.patch_dim_u8), np.uint8)
        elif self.pixels == "float32":
            from mmpipe.images.pixels import u8_to_pixel_values

            # one expansion into one output array (expanding per image and concatenating would
            # write the 8x larger float32 data twice)
            u8 = np.concatenate(u8_blocks) if u8_blocks else np.zeros((0, fam.patch_dim_u8), np.uint8)
            row.pixel_values = u8_to_pixel_values(u8, self.lut(), self.spec.temporal_patch_size)
        return row

    def lut(self):
        """float32 [3, 256] pixel table of this encoder's `VisionSpec` (cached)."""
        if getattr(self, "_lut_cache", None) is None:
            self._lut_cache = self.spec.lut()
        return self._lut_cache

    # -- datasets.map entry point ----------------------------------------------------
    def __call__(self, example: dict, idx=None) -> dict:
        if _is_batch(example):
            return self._call_batch(example, idx)
        out = self._encode_one(example, idx)
        if out is None:
            raise TruncationError(  # a documented error, like every other refusal (found by fuzzing)
                f"{self._last_drop}; truncation='drop' can only leave rows out of a batched map", where="",
                fix="pass batched=True (and remove_columns=ds.column_names) to dataset.map, or use mmpipe.encode_dataset"
            )
        return out

    def _encode_one(self, example: dict, idx, images=None) -> Optional[dict]:
        """One row -> its output dict: the encoded row, or (on_error="skip" / marked drops)
        an empty row carrying why; None when a drop cannot be recorded (unmarked)."""
        self.stats.rows += 1
        extra = {}
        try:
            out = self.encode_row(example, idx, _images=images).to_dict()
            self.stats.encoded += 1
        except RowDropped as e:
            self.stats.dropped[e.reason] += 1
            if not self.mark_dropped:
                self._last_drop = e
                logger.warning("mmpipe.encode dropped %s", e)
                return None
            out, extra = _empty_row_dict(self), {DROP_REASON_COLUMN: e.reason}
        except Exception as e:
            if self.on_error != "skip" or isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            err = as_input_error(e, idx)
            self.stats.failed[err.stage] += 1
            out, extra = _empty_row_dict(self), {ERROR_COLUMN: json.dumps(err.record())}
        if self.mark_dropped:
            out[DROP_REASON_COLUMN] = ""
        if self.on_error == "skip":
            out[ERROR_COLUMN] = ""
        out.update(extra)
        return out

    def _call_batch(self, batch: dict, idx) -> dict:
        n = len(next(iter(batch.values())))
        examples = [{k: v[i] for k, v in batch.items()} for i in range(n)]
        rows_idx = [idx[i] if isinstance(idx, (list, tuple, range)) else None for i in range(n)]
        out_rows, kept = [], []
        for i, images in enumerate(_prefetched(self, examples, rows_idx)):
            row = self._encode_one(examples[i], rows_idx[i], images)
            if row is not None:
                out_rows.append(row)
                kept.append(i)
        if out_rows:
            keys = list(out_rows[0])
        else:
            keys = list(_empty_row_dict(self)) + ([DROP_REASON_COLUMN] if self.mark_dropped else []) \
                + ([ERROR_COLUMN] if self.on_error == "skip" else [])
        out = {k: [r[k] for r in out_rows] for k in keys}
        if len(kept) != n:
            # datasets keeps input columns unless removed: shorten them too, so a batch that
            # lost rows stays one consistent table.
            for k, v in batch.items():
                if k not in out:
                    out[k] = [v[i] for i in kept]
        return out


def _row_image_futures(enc: "Encoder", example: dict, idx, pool, started: set) -> Optional[list]:
    """Futures of (uint8 patches, grid) for one row's images, or None: no images, the row
    does not parse (its encode then raises, in order), or an image object already started
    for an earlier row (the row then encodes its images itself, after that row is done: a
    lazily decoded PIL image must never be loaded by two threads at once). ``started``: the
    ids of the image objects submitted so far."""
    try:
        _, images = parse_row(example, idx=idx, images_column=enc.images_column)
    except Exception:  # noqa: BLE001 - reported by the row's own encode
        return None
    if not images or any(id(img) in started for img in images):
        return None
    started.update(id(img) for img in images)
    return enc._submit_images(images, _where(idx), pool)


def _prefetched(enc: "Encoder", examples: list[dict], rows_idx: list):
    """Per row of a batch, its image futures (or None), with the images of the next rows
    already decoding on the image threads: a batch of one-image rows uses every thread, not
    one. At most ``2 * threads`` rows are in flight (bounded memory); results, errors and
    their order are those of encoding the rows one by one."""
    n_threads = enc._n_threads()
    if n_threads <= 1 or enc.pixels == "none" or not enc.family.is_vision or len(examples) <= 1:
        yield from (None for _ in examples)
        return
    pool, started, ahead = thread_pool(), set(), {}
    window = 2 * n_threads
    for i in range(len(examples)):
        for j in range(i, min(len(examples), i + window)):
            if j not in ahead:
                ahead[j] = _row_image_futures(enc, examples[j], rows_idx[j], pool, started)
        futures = ahead.pop(i)
        yield futures
        if futures:  # the row may have failed before reading them: let them finish before a
            wait(futures)  # later row that shares an image object loads it on this thread


def as_input_error(e: Exception, row=None) -> InputError:
    """Any exception raised while encoding row ``row`` -> a located `InputError` (stage
    ``"encode"`` for failures that were not anticipated as bad input)."""
    if isinstance(e, InputError):
        return e.locate(row=row)
    return InputError(
        f"unexpected {type(e).__name__} while encoding: {e}", row=row, stage="encode",
        fix="this input is not handled by mmpipe; please report it with the row",
    )


def drop_failed(ds, *, num_proc: Optional[int] = None):
    """A dataset mapped with ``on_error="skip"`` -> ``(dataset without the failed rows and
    without ERROR_COLUMN, [{"row", "stage", "column", "reason"}, ...])``."""
    if ERROR_COLUMN not in ds.column_names:
        return ds, []
    errors = [json.loads(x) for x in ds[ERROR_COLUMN] if x]
    if errors:
        ds = ds.filter(lambda r: [not x for x in r], input_columns=[ERROR_COLUMN], batched=True, num_proc=num_proc)
    return ds.remove_columns([ERROR_COLUMN]), errors


def _empty_row_dict(enc: Encoder) -> dict:
    fam = enc.family
    row = MultiModalInputs(
        input_ids=np.zeros(0, np.int64), attention_mask=np.zeros(0, np.int64),
        mm_token_type_ids=np.zeros(0, np.int64), position_ids=np.zeros((3, 0), np.int64),
        rope_delta=0, family=fam.name, labels=np.zeros(0, np.int64) if enc.labels else None,
    )
    if enc.pixels == "uint8":
        row.pixel_values_u8 = np.zeros((0, fam.patch_dim_u8), np.uint8)
    elif enc.pixels == "float32":
        row.pixel_values = np.zeros((0, fam.patch_dim), np.float32)
    return row.to_dict()


def _is_batch(example: dict) -> bool:
    """datasets passes dict-of-lists under batched=True; tell it from one row by shape."""
    for key in ("messages", "prompt"):
        v = example.get(key)
        if v is None:
            continue
        if isinstance(v, str):
            return False
        if isinstance(v, (list, tuple)):
            if not v:
                return False
            first = v[0]
            if isinstance(first, dict):
                return False
            return isinstance(first, (list, tuple, str)) or first is None
    return False


DROP_REASON_COLUMN = "mmpipe_drop_reason"


@dataclass
class EncodeReport:
    """What ``encode_dataset`` did: rows in, rows out, dropped rows counted by reason, and
    (``on_error="skip"``) every failed row as ``{"row", "stage", "column", "reason"}``.
    ``rows_in == rows_out + sum(dropped.values()) + len(errors)``."""

    rows_in: int
    rows_out: int
    dropped: dict
    errors: list = field(default_factory=list)

    @property
    def failed(self) -> dict:
        """Failed rows counted by stage (``"parse"``, ``"image"``, ...)."""
        return dict(Counter(e["stage"] for e in self.errors))

    def __str__(self) -> str:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(self.dropped.items())) or "none"
        out = f"encoded {self.rows_out} of {self.rows_in} rows; dropped: {why}"
        if self.errors:
            out += "; failed: " + ", ".join(f"{k}: {v}" for k, v in sorted(self.failed.items()))
        return out


def undecoded_images(ds):
    """``ds`` with every ``datasets.Image()`` feature (any nesting) set to ``decode=False``,
    so rows carry ``{"bytes", "path"}`` dicts instead of PIL images decoded by ``datasets``.
    Images with a forced ``mode`` are left decoding (datasets converts them)."""
    import copy

    features = getattr(ds, "features", None)
    if not features:
        return ds

    def undecode(f) -> bool:
        if type(f).__name__ == "Image":
            if getattr(f, "decode", False) and getattr(f, "mode", None) is None:
                f.decode = False
                return True
            return False
        if isinstance(f, dict):
            return any([undecode(v) for v in f.values()])
        if isinstance(f, (list, tuple)):
            return any([undecode(v) for v in f])
        inner = getattr(f, "feature", None)
        return undecode(inner) if inner is not None else False

    new = copy.deepcopy(features)
    if not undecode(dict(new)) or not hasattr(ds, "data"):
        return ds
    # Same Arrow data, other features: ``Dataset(table, info=...)`` re-labels without the
    # copy ``ds.cast`` would make of every image (the storage types are identical).
    import hashlib

    import datasets

    info = ds.info.copy()
    info.features = datasets.Features(dict(new))  # rebuilt: Features caches which columns decode
    fingerprint = hashlib.sha256(f"{ds._fingerprint}:mmpipe-undecoded".encode()).hexdigest()[:16]
    out = datasets.Dataset(ds.data, info=info, split=ds.split, indices_table=getattr(ds, "_indices", None),
                           fingerprint=fingerprint)
    fmt = ds.format
    if fmt.get("type") is not None or fmt.get("columns") is not None:
        out = out.with_format(fmt["type"], columns=fmt["columns"], output_all_columns=fmt["output_all_columns"],
                              **fmt["format_kwargs"])
    return out


def encode_dataset(ds, processor, *, num_proc: Optional[int] = None, batch_size: int = 64,
                   remove_columns: bool = True, **options):
    """Encode a ``datasets.Dataset`` and report exactly what was dropped, across processes.

    Returns ``(encoded_dataset, EncodeReport)``. Rows dropped under ``truncation="drop"``
    are counted by reason, and rows failing under ``on_error="skip"`` are recorded (row
    index, stage, column, reason), from columns every worker writes, so the counts hold for
    any ``num_proc`` (an in-process counter cannot see other workers).

    ``datasets.Image()`` columns are read undecoded (``decode=False``): mmpipe decodes the
    bytes itself (same pixels, EXIF orientation included), so a corrupt image becomes this
    row's `ImageError` - recorded under ``on_error="skip"`` - instead of a crash inside
    ``datasets`` before the row reaches mmpipe. (With a plain ``ds.map``, cast them yourself.)
    """
    enc = Encoder(processor, **options)
    enc.mark_dropped = True
    ds = undecoded_images(ds)
    out = ds.map(enc, batched=True, batch_size=batch_size, num_proc=num_proc, with_indices=True,
                 remove_columns=ds.column_names if remove_columns else None,
                 desc="mmpipe.encode")
    reasons = Counter(r for r in out[DROP_REASON_COLUMN] if r)
    marks = [DROP_REASON_COLUMN] + ([ERROR_COLUMN] if ERROR_COLUMN in out.column_names else [])
    errors = [json.loads(x) for x in out[ERROR_COLUMN] if x] if len(marks) == 2 else []
    if reasons or errors:
        out = out.filter(lambda *cols: [not any(v) for v in zip(*cols)], input_columns=marks, batched=True,
                         num_proc=num_proc)
    out = out.remove_columns(marks)
    return out, EncodeReport(rows_in=len(ds), rows_out=len(out), dropped=dict(reasons), errors=errors)


_ENCODERS: dict[tuple, Encoder] = {}


def encode(example: dict, idx=None, *, processor, **options) -> dict:
    """``dataset.map`` function: raw row(s) -> encoded row(s) (see `Encoder` for options).

    Works per row and with ``batched=True``, ``with_indices=True`` (errors then name the
    row index) and ``num_proc``. The encoder is built once per process per
    (processor, options) and reused.
    """
    key = (id(processor), tuple(sorted((k, repr(v)) for k, v in options.items())))
    enc = _ENCODERS.get(key)
    if enc is None or enc.processor is not processor:
        if len(_ENCODERS) > 16:
            _ENCODERS.clear()
        enc = _ENCODERS[key] = Encoder(processor, **options)
    return enc(example, idx)


def encode_row(example: dict, processor, idx=None, **options) -> MultiModalInputs:
    """One raw row -> a `MultiModalInputs` (the typed record, not the stored dict)."""
    return Encoder(processor, **options).encode_row(example, idx)


def rows_from_processor_output(outputs, processor, *, labels=None) -> list[MultiModalInputs]:
    """Rows of a transformers processor call (a ``BatchFeature`` for B texts, any padding)
    -> `MultiModalInputs`, float32 pixels, positions computed here.

    The route for inputs ``encode`` does not build itself (videos, custom prompts). Pixel
    blocks are split per row by each row's image/video token counts.
    ``labels``: optional int [B, L] aligned with ``input_ids``.
    """
    from mmpipe.rope import get_rope_index

    fam = family_of(processor)
    as_np = lambda v: v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)  # noqa: E731
    ids = as_np(outputs["input_ids"]).reshape(len(outputs["input_ids"]), -1)
    att = as_np(outputs["attention_mask"]) if "attention_mask" in outputs else np.ones_like(ids)
    mm = as_np(outputs["mm_token_type_ids"]) if "mm_token_type_ids" in outputs else np.zeros_like(ids)
    igrid = as_np(outputs["image_grid_thw"]).reshape(-1, 3) if outputs.get("image_grid_thw") is not None else np.zeros((0, 3), np.int64)
    vgrid = as_np(outputs["video_grid_thw"]).reshape(-1, 3) if outputs.get("video_grid_thw") is not None else np.zeros((0, 3), np.int64)
    secs = as_np(outputs["second_per_grid_ts"]).astype(np.float32) if outputs.get("second_per_grid_ts") is not None else np.ones(len(vgrid), np.float32)
    pv = as_np(outputs["pixel_values"]) if outputs.get("pixel_values") is not None else None
    pvv = as_np(outputs["pixel_values_videos"]) if outputs.get("pixel_values_videos") is not None else None
    m2 = fam.merge_size**2
    # Qwen3-VL splits each video into per-frame blocks in the text; count tokens per video
    i_tok = igrid.prod(axis=1) // m2
    v_tok = vgrid.prod(axis=1) // m2
    rows, gi, gv, pi, pvi = [], 0, 0, 0, 0
    for b in range(ids.shape[0]):
        keep = att[b].astype(bool)
        r_ids, r_mm = ids[b][keep], mm[b][keep]
        n_img_tok, n_vid_tok = int((r_mm == 1).sum()), int((r_mm == 2).sum())
        ni = _count_blocks(i_tok[gi:], n_img_tok, b, "image")
        nv = _count_blocks(v_tok[gv:], n_vid_tok, b, "video")
        g_i, g_v = igrid[gi:gi + ni], vgrid[gv:gv + nv]
        pos, delta = get_rope_index(r_ids[None], r_mm[None], image_grid_thw=g_i if ni else None,
                                    video_grid_thw=g_v if nv else None,
                                    second_per_grid_ts=secs[gv:gv + nv] if nv else None, family=fam)
        n_ip, n_vp = int(g_i.prod(axis=1).sum()), int(g_v.prod(axis=1).sum())
        row = MultiModalInputs(
            input_ids=r_ids.astype(np.int64), attention_mask=np.ones(len(r_ids), np.int64),
            mm_token_type_ids=r_mm.astype(np.int64), position_ids=pos[:, 0].numpy(),
            rope_delta=int(delta.reshape(-1)[0]), family=fam.name,
            labels=as_np(labels)[b][keep].astype(np.int64) if labels is not None else None,
            image_grid_thw=g_i.astype(np.int64), video_grid_thw=g_v.astype(np.int64),
            second_per_grid_ts=secs[gv:gv + nv].astype(np.float32),
            pixel_values=(pv[pi:pi + n_ip] if pv is not None else np.zeros((0, fam.patch_dim), np.float32)),
            pixel_values_videos=pvv[pvi:pvi + n_vp] if (pvv is not None and nv) else None,
        )
        rows.append(row.validate(b))
        gi, gv, pi, pvi = gi + ni, gv + nv, pi + n_ip, pvi + n_vp
    return rows


def _count_blocks(tokens_per_grid: np.ndarray, n_tokens: int, row: int, kind: str) -> int:
    csum = np.concatenate([[0], np.cumsum(tokens_per_grid)])
    hit = np.flatnonzero(csum == n_tokens)
    if not len(hit):
        raise ValueError(f"row {row}: {n_tokens} {kind} tokens do not match a whole number of the remaining {kind} grids")
    return int(hit[0])


def compact(row: MultiModalInputs, spec: Optional[VisionSpec] = None) -> MultiModalInputs:
    """float32 pixel storage -> compact uint8 storage, exactly (raises if the float values
    were not produced from uint8 pixels with these constants)."""
    from dataclasses import replace

    from mmpipe.images.pixels import pixel_values_to_u8, video_pixel_values_to_u8

    if row.pixel_format != "float32":
        return row
    spec = spec or VisionSpec.from_family(row.fam)
    lut = spec.lut()
    fam = row.fam
    u8 = pixel_values_to_u8(row.pixel_values, lut, spec.temporal_patch_size) if row.pixel_values is not None \
        else np.zeros((0, fam.patch_dim_u8), np.uint8)
    vu8 = video_pixel_values_to_u8(row.pixel_values_videos, lut) if row.pixel_values_videos is not None else None
    return replace(row, pixel_values=None, pixel_values_videos=None, pixel_values_u8=u8, pixel_values_videos_u8=vu8)
