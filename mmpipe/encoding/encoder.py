"""Encode, step 2: the `Encoder` - one raw row -> `MultiModalInputs` (configuration in
``__init__``, work in the call).

Per row: parse (`mmpipe.encoding.parse`) -> render the chat template (with the row's tool
calls, tool turns and ``tools``) -> tokenize (labels from the assistant spans) -> decode and
resize the images on threads, expand each image's single ``<|image_pad|>`` to its
``t*h*w/merge^2`` pads (`mmpipe.encoding.placeholders`; videos: `mmpipe.encoding.videos`) ->
truncate -> M-RoPE positions. The encoded row holds::

    input_ids, attention_mask, mm_token_type_ids, labels   int64 [L]
    position_ids                                           int64 [3, L], rope_delta int
    image_grid_thw, video_grid_thw                         int64 [I, 3], [V, 3]; second_per_grid_ts float32 [V]
    pixel_values_u8  uint8 [N, 3*p*p]  (or pixel_values float32 [N, 3*T*p*p], or none)
    pixel_values_videos_u8  uint8 [Nv, 3*T*p*p]  (or pixel_values_videos float32, or none)

The ``datasets.map`` side (batches, drops, ``on_error="skip"``) is `mmpipe.encoding.mapping`;
``dataset.map(mmpipe.encode, ...)`` and `encode_dataset` are in `mmpipe.encoding.dataset`.
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from mmpipe.encoding.fingerprint import CodeStamped
from mmpipe.encoding.glm_videos import token_types
from mmpipe.encoding.mapping import EncodeStats, encode_or_drop, map_call
from mmpipe.encoding.options import ERROR_POLICIES, TRUNCATION_POLICIES, check_choice, check_options, truncate_row
from mmpipe.encoding.parse import check_text, parse_media, parse_tools, row_where
from mmpipe.encoding.placeholders import expand_image_pads
from mmpipe.encoding.tokenize import tokenize_text
from mmpipe.encoding.videos import add_videos, video_options as check_video_options
from mmpipe.errors import ArgumentError, ImageError, InputError, PlaceholderError
from mmpipe.families import ModelFamily, ModelFamily, family_of
from mmpipe.images.load import check_image_root, confine_image
from mmpipe.images.pixels import encode_image, image_grid
from mmpipe.images.spec import VisionSpec
from mmpipe.images.threads import default_threads, thread_pool
from mmpipe.encoding.sources import source_bytes
from mmpipe.records.columns import ENCODE_PIXEL_FORMATS, IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs

__all__ = ["TRUNCATION_POLICIES", "ERROR_POLICIES", "Encoder"]

logger = logging.getLogger(__name__)

class Encoder(CodeStamped):
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
        labels: emit ``labels`` (-100 except assistant response tokens, incl. ``<|im_end|>``):
            every token overlapping an assistant reply (its text, tool calls and end-of-turn
            token) is labelled, as transformers' ``return_assistant_tokens_mask`` does with a
            ``{% generation %}`` template - also a token that merges the header's newline
            with a reply starting with a newline (real Qwen tokenizers do).
        tools: JSON-schema tool specs (``[{"type": "function", "function": {...}}]``) passed
            to the chat template as ``tools=`` for every row; a row's ``tools_column`` value
            (a list or its JSON string), when not None, wins for that row.
        min_pixels / max_pixels: override the processor's resize bounds. image_backend: whose
            pixels to reproduce, ``"pil"``/``"torchvision"`` or ``"auto"`` (the processor's).
        threads: threads decoding and resizing a row's images concurrently (PIL releases the
            GIL); None = `mmpipe.images.default_threads` (1 inside ``datasets.map(num_proc=...)``
            workers, where the processes already share the cores).
        on_error: ``"raise"`` (the row's `mmpipe.errors.InputError`) or ``"skip"``: a failing
            row becomes an empty row (0 tokens) whose `ERROR_COLUMN` holds the JSON record
            ``{"row", "stage", "column", "reason"}`` (``""`` on encoded rows), counted in
            ``stats.failed`` by stage. Nothing vanishes: `encode_dataset` filters those rows
            out into ``report.errors``; after a plain ``ds.map`` call `drop_failed`, and
            `Collator` refuses rows that carry an error.
        image_root: a directory (None: no limit); an image path resolving (symlinks, ``..``) outside
            it raises `ImageError` (`mmpipe.images.confine_image`), for untrusted datasets.
        videos_column: the column ``{"type": "video"}`` items / ``<video>`` markers take videos from.
        video_options: frame sampling and sizing (`mmpipe.images.video.VideoOptions` or a dict of
            its fields); None: qwen-vl-utils' defaults. See `mmpipe.encoding.videos`.

    Bad option values raise `mmpipe.errors.ArgumentError` naming the accepted values.
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
        tools: Optional[list] = None,
        tools_column: str = "tools",
        image_root: Optional[str] = None,
        image_backend: str = "auto",
        videos_column: str = "videos",
        video_options=None,
    ):
        check_choice("on_error", on_error, ERROR_POLICIES)
        check_choice("truncation", truncation, TRUNCATION_POLICIES)
        check_choice("pixels", pixels, ENCODE_PIXEL_FORMATS)
        check_options(locals())  # pixel bounds 0: the processor's, as before
        self.processor = processor
        self.family: ModelFamily = family_of(processor)
        if self.family.kind == "tiles":  # Gemma 3, InternVL, LLaVA-OneVision: tiles, not patch grids
            raise ArgumentError(f"mmpipe.Encoder does not take {self.family.name} processors: use mmpipe.encode / encode_dataset (they pick mmpipe.encoding.tiled.TiledEncoder) or TiledEncoder(processor)")
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.spec = VisionSpec.from_processor(processor, min_pixels, max_pixels, image_backend) if self.family.is_vision else None
        self.max_length, self.truncation = max_length, truncation
        self.pixels = pixels
        self.add_generation_prompt = add_generation_prompt
        self.labels = labels
        self.images_column = images_column
        self.videos_column = videos_column
        self.video_opts = check_video_options(video_options)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if "tools" in self.chat_template_kwargs:  # tools have their own option (and a column)
            if tools is not None:
                raise ArgumentError("pass tools once: tools= or chat_template_kwargs['tools'], not both")
            tools = self.chat_template_kwargs.pop("tools")
        if tools is not None and (not isinstance(tools, (list, tuple)) or not all(isinstance(t, dict) for t in tools)):
            raise ArgumentError(f"tools must be a list of tool spec dicts, got {tools!r:.80}")
        self.tools = list(tools) if tools is not None else None
        self.tools_column, self.threads = tools_column, threads
        self.on_error = on_error
        self.image_root = check_image_root(image_root)
        # encode_dataset sets this: dropped rows stay as empty rows with their reason in
        # DROP_REASON_COLUMN, so counts survive num_proc; the caller filters them out.
        self.mark_dropped = False
        token_ids = self.family.vision_token_ids(self.tokenizer)  # None each for a text family
        self.image_token_id = token_ids["image"]
        self.video_token_id = token_ids["video"]
        self.vision_start_id = token_ids["vision_start"]
        self.vision_end_id = token_ids["vision_end"]
        self.fresh_runtime_state()

    RUNTIME_STATE = ("stats", "_checked_tool_fields", "_lut_cache")  # not hashed, not shipped (CodeStamped)

    def fresh_runtime_state(self) -> None:
        self.stats = EncodeStats()
        self._checked_tool_fields: set = set()  # "tool_calls" / "tools" once checked (see warn_ignored_tools)
        self.__dict__.pop("_lut_cache", None)

    # -- datasets.map entry point ----------------------------------------------------
    def __call__(self, example: dict, idx=None) -> dict:
        """One raw row or a batch (dict of lists) -> output column(s); see `mmpipe.encoding.mapping`."""
        return map_call(self, example, idx)

    # -- rendering ------------------------------------------------------------------
    def render(self, messages: list[dict], add_generation_prompt: bool, tools: Optional[list] = None) -> str:
        """The chat template applied to ``messages`` (text, not tokenized), with ``tools``
        (None: the encoder's ``tools`` option) passed as ``tools=``."""
        return self.render_many([messages], add_generation_prompt, tools)[0]

    def render_many(self, conversations: list, add_generation_prompt: bool, tools: Optional[list] = None) -> list:
        """`render` of each conversation in one batched ``apply_chat_template`` call (same strings)."""
        target = self.processor if hasattr(self.processor, "apply_chat_template") else self.tokenizer
        tools = self.tools if tools is None else tools
        extra = {"tools": tools} if tools is not None else {}
        try:
            out = target.apply_chat_template([list(c) for c in conversations], tokenize=False, **extra,
                                             add_generation_prompt=add_generation_prompt, **self.chat_template_kwargs)
        except Exception as e:  # jinja raises its own types (TemplateError, TypeError, ...)
            raise InputError(f"the chat template failed on these messages ({type(e).__name__}: {e})",
                             stage="template", column="messages",
                             fix="check the roles and their order against the model's chat template") from e
        return [out] if isinstance(out, str) else list(out)

    def row_tools(self, example: dict, idx=None) -> Optional[list]:
        """Row ``example``'s ``tools_column`` value when not None, else the ``tools`` option (`parse_tools`)."""
        return parse_tools(example, idx=idx, column=self.tools_column, default=self.tools)

    def _assistant_spans(self, messages: list[dict], full: str, where: str,
                         tools: Optional[list] = None, full_agp: Optional[bool] = None) -> list[tuple[int, int]]:
        """Character spans of assistant responses in ``full`` (content, tool calls and the end-of-turn token;
        not the newline after it). ``full_agp``: the ``add_generation_prompt`` of ``full``; when False, ``full``
        is the last prefix, not rendered again. The other prefixes: at most two batched renders."""
        ks = [k for k, msg in enumerate(messages) if msg["role"] == "assistant"]
        again = [k for k in ks if not (k == len(messages) - 1 and full_agp is False)]
        befores = iter(self.render_many([messages[:k] for k in ks if k], True, tools) if ks and ks[-1] else [])
        uptos = dict(zip(again, self.render_many([messages[: k + 1] for k in again], False, tools) if again else []))
        spans = []
        for k in ks:
            before = next(befores) if k else ""
            upto = uptos.get(k, full)
            if not (full.startswith(before) and full.startswith(upto) and upto.startswith(before)):
                raise InputError(
                    "the chat template does not render conversation prefixes as prefixes of the "
                    "whole conversation, so assistant tokens cannot be located", where=where, stage="template",
                    fix="pass labels=False or a prefix-stable chat template")
            # up to the end-of-turn token: trailing newlines/spaces dropped, never into ``before``
            spans.append((len(before), max(len(before), len(upto.rstrip("\n ")))))
        return spans

    # -- one row --------------------------------------------------------------------
    def encode_row(self, example: dict, idx=None, *, _images=None) -> MultiModalInputs:
        """One raw row -> `MultiModalInputs`; bad input raises `mmpipe.errors.InputError`
        (a ValueError) naming the row index ``idx``. (``_images``: the row's image futures
        started by a batched call, see `mmpipe.encoding.mapping.prefetch_images`.)"""
        try:
            return self._encode_row(example, idx, _images)
        except InputError as e:
            raise e.locate(row=idx)

    def encode_one(self, example: dict, idx=None, images=None) -> Optional[dict]:
        """One raw row -> its stored dict, or the empty row carrying why it failed or was
        dropped (see `mmpipe.encoding.mapping.encode_or_drop`); None for an unrecorded drop."""
        return encode_or_drop(self, example, idx, images)[0]

    def _encode_row(self, example: dict, idx=None, prefetched=None) -> MultiModalInputs:
        where = row_where(idx)
        messages, images, videos = parse_media(example, idx=idx, images_column=self.images_column,
                                               videos_column=self.videos_column)
        if (images or videos) and not self.family.is_vision:
            kind, column = ("image", self.images_column) if images else ("video", self.videos_column)
            raise PlaceholderError(f"holds {len(images or videos)} {kind}(s) but the processor is a text-only tokenizer",
                                   where=where, column=column, fix=f"encode with a vision-language processor, or drop the {kind}s")
        ids, labels = self._tokenize(messages, where, self.row_tools(example, idx))
        grids = np.zeros((0, 3), dtype=np.int64)
        u8_blocks: list[np.ndarray] = []
        vid = None
        if self.family.is_vision:  # videos first: their pads are found in the unexpanded ids
            ids, labels, *vid = add_videos(self, ids, labels, videos, where)
            ids, labels, grids, u8_blocks = self._add_images(ids, labels, images, where, prefetched)
        mm = self.token_types(ids)
        if labels is not None:
            labels[mm > 0] = IGNORE_INDEX  # image / video pads are inputs, never targets
        ids, labels, mm = truncate_row(self, ids, labels, mm, where)
        return self._finish(ids, labels, mm, grids, u8_blocks, vid)

    def token_types(self, ids: np.ndarray) -> np.ndarray:
        """``mm_token_type_ids`` int64 [L] of ids int64 [L]: 1 at image pads, 2 at video pads, else 0."""
        return token_types(self, ids)

    def _tokenize(self, messages: list[dict], where: str,
                  tools: Optional[list] = None) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """Rendered messages -> (ids int64 [L], labels int64 [L] or None), one pad per image.

        A token is labelled when it overlaps an assistant span (transformers' assistant-mask
        rule): a token merging the header's newline with a reply's leading newline counts."""
        agp = self.add_generation_prompt
        if agp is None:
            agp = messages[-1]["role"] != "assistant"
        text = self.render(messages, agp, tools)
        self.warn_ignored_tools(messages, agp, tools, text)
        check_text(text, where=where, column="messages", what="the rendered prompt")  # tool calls, tools
        spans = self._assistant_spans(messages, text, where, tools, agp) if self.labels else []
        # memory (a 10 MB row): long texts are tokenized in verified pieces (encoding/tokenize.py)
        ids, offsets = tokenize_text(self.tokenizer, text, bool(spans))
        if not self.labels:
            return ids, None
        labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int64)
        if spans:
            starts, ends = offsets[:, 0], offsets[:, 1]
            for a, b in spans:
                sel = (starts < b) & (ends > a)
                labels[sel] = ids[sel]
        return ids, labels

    def warn_ignored_tools(self, messages: list[dict], agp: bool, tools: Optional[list], text: str) -> None:
        """Log once per encoder when the chat template renders a row's ``tool_calls`` or
        ``tools`` as nothing (Qwen2-VL's / Qwen2.5-VL's processor templates ignore both, so the
        model would be trained on conversations without them)."""
        checks = (("tool_calls", any(m.get("tool_calls") for m in messages)), ("tools", bool(tools)))
        for field, present in checks:
            if not present or field in self._checked_tool_fields:
                continue
            self._checked_tool_fields.add(field)
            if field == "tools":
                without = self.render(messages, agp, [])
            else:
                without = self.render([{k: v for k, v in m.items() if k != "tool_calls"} for m in messages], agp, tools)
            if without == text:
                logger.warning("mmpipe.encode: the chat template ignores %s (it renders the conversation the same "
                               "without them); use a chat template that renders tool use", field)

    def _image_pads(self, ids: np.ndarray, n_images: int, where: str) -> np.ndarray:
        """Positions int [I] of the one ``<|image_pad|>`` per image the template rendered."""
        fam = self.family
        pad_pos = np.flatnonzero(self.token_types(ids) == 1)  # GLM-4.1V's videos hold <|image|> too
        if len(pad_pos) != n_images:
            raise PlaceholderError(
                f"the rendered prompt holds {len(pad_pos)} {fam.image_token} token(s) but the row "
                f"has {n_images} image(s)", where=where, column="messages",
                expected=f"one {fam.image_token} per image", found=f"{len(pad_pos)}",
                fix=(f"remove literal {fam.image_token} text from the messages" if len(pad_pos) > n_images
                     else "the chat template did not render every image item (Qwen3-VL's template drops "
                          "images in system messages): move those images to a user turn"),
            )
        return pad_pos

    def _add_images(self, ids, labels, images: list, where: str, prefetched):
        """Encode the images and expand their pads -> (ids, labels, grids int64 [I, 3], uint8 blocks)."""
        pad_pos = self._image_pads(ids, len(images), where)
        u8_blocks: list[np.ndarray] = []
        if self.pixels in ("none", "source"):  # grids from the image headers
            grid_list = [self._at_image(i, image_grid, img, self.spec, where=f"{where}, image {i}")
                         for i, img in enumerate(images)]
            if self.pixels == "source":  # the "blocks" are the encoded files, decoded at collate time
                u8_blocks = [source_bytes(img, where=f"{where}, image {i}") for i, img in enumerate(images)]
        else:
            encoded = ([f.result() for f in prefetched] if prefetched is not None
                       else self._encode_images(images, where))
            u8_blocks = [u8 for u8, _ in encoded]
            grid_list = [g for _, g in encoded]
        if not grid_list:
            return ids, labels, np.zeros((0, 3), dtype=np.int64), u8_blocks
        grids = np.asarray(grid_list, dtype=np.int64)
        ids, labels = expand_image_pads(ids, pad_pos, grids, self.family, labels)
        return ids, labels, grids, u8_blocks

    # -- images ---------------------------------------------------------------------
    def image_threads(self) -> int:
        """Threads decoding this encoder's images (``threads``, or `default_threads`)."""
        return default_threads() if self.threads is None else max(1, int(self.threads))

    def _encode_images(self, images: list, where: str) -> list:
        """(uint8 patches, grid) per image, on worker threads when there are several."""
        spec = self.spec
        if self.image_threads() <= 1 or len(images) <= 1:
            return [self._at_image(i, encode_image, img, spec, where=f"{where}, image {i}") for i, img in enumerate(images)]
        futures = self.submit_images(images, where, thread_pool())
        return [f.result() for f in futures]  # in order: the first failing image raises

    def submit_images(self, images: list, where: str, pool) -> list:
        """One future of (uint8 patches [n, 3*p*p], grid (t, h, w)) per image on ``pool``. The
        same object twice is submitted once: a lazily decoded PIL image must not be loaded by
        two threads."""
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
            if self.image_root is not None:  # untrusted datasets: paths must stay under the root
                confine_image(args[0], self.image_root, where=kwargs.get("where"))
            return fn(*args, **kwargs)
        except ImageError as e:
            raise e.locate(column=self.images_column, image=i)

    def lut(self):
        """float32 [3, 256] pixel table of this encoder's `VisionSpec` (cached)."""
        if getattr(self, "_lut_cache", None) is None:
            self._lut_cache = self.spec.lut()
        return self._lut_cache

    # -- truncation and the record ----------------------------------------------------
    def _finish(self, ids, labels, mm, grids, u8_blocks, vid=None) -> MultiModalInputs:
        """The record; ``vid``: (video grids int64 [V, 3], second_per_grid_ts float32 [V], uint8 blocks)."""
        from mmpipe.rope import get_rope_index

        fam = self.family
        vgrids, seconds, vblocks = vid if vid else (np.zeros((0, 3), np.int64), np.zeros(0, np.float32), [])
        pos, delta = get_rope_index(ids[None], mm[None], image_grid_thw=grids if len(grids) else None,
                                    video_grid_thw=vgrids if len(vgrids) else None,
                                    second_per_grid_ts=seconds if len(vgrids) else None, family=fam)
        row = MultiModalInputs(input_ids=ids, attention_mask=np.ones(ids.shape, dtype=np.int64), mm_token_type_ids=mm,
                               position_ids=pos[:, 0, :].numpy(), rope_delta=int(delta.reshape(-1)[0]),
                               family=fam.name, labels=labels, image_grid_thw=grids, video_grid_thw=vgrids,
                               second_per_grid_ts=seconds)
        if self.pixels == "source":
            row.image_sources = list(u8_blocks)
        elif self.pixels == "uint8":
            row.pixel_values_u8 = np.concatenate(u8_blocks) if u8_blocks else np.zeros((0, fam.patch_dim_u8), np.uint8)
            row.pixel_values_videos_u8 = np.concatenate(vblocks) if vblocks else None  # None as from_dict reads it
        elif self.pixels == "float32":
            from mmpipe.images.pixels import u8_to_pixel_values, u8_video_to_pixel_values

            if vblocks:
                row.pixel_values_videos = u8_video_to_pixel_values(np.concatenate(vblocks), self.spec.for_videos().lut())

            # one expansion into one output array (expanding per image and concatenating would
            # write the 8x larger float32 data twice)
            u8 = np.concatenate(u8_blocks) if u8_blocks else np.zeros((0, fam.patch_dim_u8), np.uint8)
            row.pixel_values = u8_to_pixel_values(u8, self.lut(), self.spec.temporal_patch_size)
        if self.spec is not None and self.pixels != "none":
            row.image_backend = self.spec.backend  # collate expands the pixels with this backend's table
        return row
