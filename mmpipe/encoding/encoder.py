"""Encode, step 2: the `Encoder` - one raw row -> `MultiModalInputs`, for every model family
(configuration in ``__init__``, work in the call).

The family is resolved once, from the processor's class (`mmpipe.families.resolve_family`).
Per row, the same for every family: parse (`mmpipe.encoding.parse`) -> the row's tools and
generation prompt -> the family's media strategy (``fam.media``, `mmpipe.media`) renders,
tokenizes and lays out the images its own way -> the typed record, validated. What the kinds
share lives here and in `mmpipe.encoding.render`: option checks, the chat template and the
assistant spans, image loading on threads (confined to ``image_root``, errors located at the
image), length checks, empty rows, stats, the ``datasets.map`` protocol
(`mmpipe.encoding.mapping`) and the code stamp in the fingerprint. What differs per kind is the
strategy's encode section (``encode_settings``, ``encode_image``, ``encode_row``,
``encode_empty``, ``encode_image_bytes``; the processor kind's ``encode_layout``):

=============  =================================================================================
kind           a row holds
=============  =================================================================================
patches        Qwen-VL, GLM-4.1V, text: ids with each image's pads expanded to ``t*h*w/merge^2``,
               ``position_ids`` int64 [3, L] (M-RoPE), ``image_grid_thw`` int64 [I, 3],
               ``pixel_values_u8`` uint8 [N, 3*p*p] (or float32 ``pixel_values``, source files,
               or none); videos (`mmpipe.encoding.videos`)
tiles          Gemma 3, InternVL, LLaVA-OneVision: each image's placeholder text, ``image_hw``
               int64 [I, 2], ``tiles_per_image`` int64 [I], uint8 tiles [N, S, S, 3] (or source
               files, or none); positions [L]
processor      the generic path: the processor's own template and call (``family="generic"``
               takes it for a tiled family's processor too); its outputs typed by its layout
=============  =================================================================================

The ``datasets.map`` side (batches, drops, ``on_error="skip"``) is `mmpipe.encoding.mapping`;
``dataset.map(mmpipe.encode, ...)`` and `encode_dataset` are in `mmpipe.encoding.dataset`.
"""

from __future__ import annotations

import sys
from typing import Optional

import numpy as np

from mmpipe._fork import ForkSafeLock
from mmpipe.encoding.fingerprint import CodeStamped, processor_settings, quick_state
from mmpipe.encoding.glm_videos import token_types
from mmpipe.encoding.mapping import EncodeStats, check_max_length, encode_or_drop, map_call
from mmpipe.encoding.options import (ERROR_POLICIES, TRUNCATION_POLICIES, check_choice, check_options,
                                    check_template_kwargs)
from mmpipe.encoding.parse import no_audio, parse_media, row_where
from mmpipe.encoding.placeholders import check_rendered_images
from mmpipe.encoding.render import ChatTemplate
from mmpipe.encoding.spans import END_OF_TURN
from mmpipe.errors import ArgumentError, ImageError, InputError
from mmpipe.families import GENERIC, ModelFamily, get_family, processor_class_name, resolve_family
from mmpipe.images.load import check_image_root, confine_image
from mmpipe.images.threads import default_threads, thread_pool
from mmpipe.records.row import MultiModalInputs

__all__ = ["TRUNCATION_POLICIES", "ERROR_POLICIES", "Encoder"]

# Options that only some kinds of family take (None: not given); each strategy's
# ``encode_settings`` takes its own and refuses the others, saying what to do instead.
KIND_OPTIONS = ("pixels", "min_pixels", "max_pixels", "image_backend", "image_root", "videos_column",
                "video_options", "images_kwargs", "log", "audio")


class Encoder(ChatTemplate, CodeStamped):
    """Raw rows -> `MultiModalInputs`, for a processor of any family. Picklable.

    Args:
        processor: a transformers VLM processor (Qwen-VL, GLM-4.1V, Gemma 3, InternVL,
            LLaVA-OneVision natively; any other through the generic path), or a tokenizer for
            text-only models.
        max_length: token budget per row (after image expansion); None = no limit.
        truncation: ``"raise"`` (`TruncationError` naming the row), ``"drop"`` (the row is left
            out of a batched map and counted in ``stats``), or ``"truncate_text"`` (patch-grid
            families: cut text from the end - a prompt row, rendered with a generation prompt,
            keeps its last turn's end and the generation prompt, its text before them cut; an
            image's tokens are never cut - if the cut would reach one, raise).
        pixels: ``"uint8"`` (compact; the default), ``"float32"`` (processor pixel_values;
            patch grids; the generic path's only format), ``"source"`` (each image's file) or
            ``"none"`` (layout only: ids, layouts and positions from image headers, no decode).
        add_generation_prompt: None = add it when the last message is not the assistant's.
        labels: emit ``labels`` (-100 except assistant response tokens): every token overlapping
            an assistant reply is labelled, as transformers' ``return_assistant_tokens_mask``
            masks a ``{% generation %}`` template's blocks; image tokens never. A template with
            such blocks is followed as it marks; without them a reply is its text as rendered
            (trailing spaces and newlines included), its tool calls and the family's stop token
            where the template writes it after the reply (`mmpipe.encoding.spans`).
        end_of_turn: ``"template"`` (default: what the template marks, above) or
            ``"stop_token"``: also the family's stop token (``ModelFamily.stop_token``) after
            every reply - labelled where the template writes it unmarked (LLaVA-OneVision's
            blocks end before ``<|im_end|>``), appended to the reply where it writes none
            (GLM-4.1V/4.6V: ``<|endoftext|>``, as LLaMA-Factory trains them).
        tools: JSON-schema tool specs (``[{"type": "function", "function": {...}}]``) passed
            to the chat template as ``tools=`` for every row; a row's ``tools_column`` value
            (a list or its JSON string), when not None, wins for that row.
        min_pixels / max_pixels: override the processor's resize bounds (patch grids).
        image_backend: whose pixels to reproduce, ``"pil"``/``"torchvision"`` or ``"auto"`` (the
            processor's; tiled families: the processor's own only).
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
        videos_column / video_options: where ``{"type": "video"}`` items / ``<video>`` markers take
            videos from, and their frame sampling and sizing (`mmpipe.images.video.VideoOptions`
            or a dict of its fields; None: qwen-vl-utils' defaults). Patch-grid families.
        audios_column: where ``{"type": "audio"}`` items / ``<audio>`` markers take clips from
            (default ``"audios"``; `mmpipe.audio.load_audio` reads them). Processors that take
            audio (the Omni thinkers, Gemma 3n, Phi-4-multimodal), on the generic path.
        audio: how those clips are stored: ``"features"`` (default: the processor's outputs, e.g.
            Qwen2.5-Omni's float32 ``input_features`` [A, 128, 3000], 1.5 MB a clip) or
            ``"source"`` (each clip's file bytes, a float WAV of the loaded samples for arrays; collate
            computes the features with the processor's own call, bit for bit).
        use_audio_in_video: the generic path, the Omni thinkers: encode the row's videos (files) with
            their sound tracks interleaved (`mmpipe.media.processor_videos`; frames sampled by
            ``video_options`` fps / min_frames / max_frames); a video without sound is the row's
            `AudioError`. Collate then tells the model (``use_audio_in_video=True`` in ``model_inputs()``).
        images_kwargs: the processor call's image options of a tiled family (e.g. Gemma 3
            ``{"do_pan_and_scan": True}``), as ``processor(..., **images_kwargs)``.
        family: None (the processor's, `mmpipe.families.resolve_family`) or ``"generic"``: the
            generic path (the processor's own template and call) for a tiled family's processor.
        log: the generic path: receives the one line saying which path is used (default: the
            ``mmpipe`` logger, once per processor class and process).

    Bad option values raise `mmpipe.errors.ArgumentError` naming the accepted values; an option
    without a meaning for the family raises it saying what to do instead.
    """

    RUNTIME_STATE = ("stats", "_checked_tool_fields", "_lut_cache", "_layout", "_layout_dtype", "_image_bytes", "_content_forms",
                     "_stop_rule", "_reply_header", "_direct_kwargs", "_generation_templates", "_processor_quick")

    def __init__(self, processor, *, max_length: Optional[int] = None, truncation: str = "raise",
                 pixels: Optional[str] = None, add_generation_prompt: Optional[bool] = None,
                 labels: bool = True, min_pixels: Optional[int] = None, max_pixels: Optional[int] = None,
                 images_column: str = "images", chat_template_kwargs: Optional[dict] = None,
                 threads: Optional[int] = None, on_error: str = "raise", tools: Optional[list] = None,
                 tools_column: str = "tools", image_root: Optional[str] = None,
                 image_backend: Optional[str] = None, videos_column: Optional[str] = None,
                 video_options=None, images_kwargs: Optional[dict] = None, family: Optional[str] = None,
                 log=None, end_of_turn: str = "template", audios_column: Optional[str] = None,
                 audio: Optional[str] = None, use_audio_in_video: bool = False):
        check_choice("on_error", on_error, ERROR_POLICIES)
        check_choice("end_of_turn", end_of_turn, END_OF_TURN)
        check_choice("truncation", truncation, TRUNCATION_POLICIES)
        check_options(locals())  # pixel bounds 0: the processor's, as before
        self.processor = processor
        self.family: ModelFamily = _family(processor, family)
        self.processor_class = processor_class_name(processor)
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.max_length, self.truncation, self.labels = max_length, truncation, labels
        self.end_of_turn = end_of_turn
        self.add_generation_prompt = add_generation_prompt
        self.images_column, self.tools_column = images_column, tools_column
        self.threads, self.on_error = threads, on_error
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if "tools" in self.chat_template_kwargs:  # tools have their own option (and a column)
            if tools is not None:
                raise ArgumentError("pass tools once: tools= or chat_template_kwargs['tools'], not both")
            tools = self.chat_template_kwargs.pop("tools")
        check_template_kwargs(self.chat_template_kwargs)
        if tools is not None and (not isinstance(tools, (list, tuple))
                                  or not all(isinstance(t, dict) for t in tools)):
            raise ArgumentError(f"tools must be a list of tool spec dicts, got {tools!r:.80}")
        self.tools = list(tools) if tools is not None else None
        # encode_dataset sets this: dropped rows stay as empty rows with their reason in
        # DROP_REASON_COLUMN, so counts survive num_proc; the caller filters them out.
        self.mark_dropped = False
        # what the kind's settings may change: no pixel spec, nothing decoded on threads, no
        # batched layout path, no video options
        self.spec, self.video_opts, self.decodes_images, self.batched_layout = None, None, False, False
        options = locals()
        given = {k: options[k] for k in KIND_OPTIONS if options[k] is not None}
        self.videos_column = "videos" if videos_column is None else videos_column
        self.audios_column = "audios" if audios_column is None else audios_column
        if not isinstance(use_audio_in_video, bool):
            raise ArgumentError(f"use_audio_in_video must be True or False, got {use_audio_in_video!r}")
        if use_audio_in_video and not self.family.media.TAKES_VIDEO_SOUND:
            raise ArgumentError(f"use_audio_in_video=True is not available for {self.processor_class} "
                                f"({self.family.name}): a video's sound is encoded on the generic path, for the Omni "
                                "thinkers (Qwen2.5-Omni, Qwen3-Omni); leave it out")
        self.use_audio_in_video = use_audio_in_video
        self.family.media.encode_settings(self, given)  # sets pixels and the kind's own attributes
        self.image_root = check_image_root(image_root)
        # what the settings above were taken from (`processor_settings`: hashed with the encoder, the
        # same in any process), set by fresh_runtime_state
        self.processor_settings = None
        self.fresh_runtime_state()

    def fresh_runtime_state(self) -> None:
        self.stats = EncodeStats()
        self._checked_tool_fields: set = set()  # "tool_calls" / "tools" once checked (see warn_ignored_tools)
        for name in ("_lut_cache", "_content_forms", "_stop_rule", "_reply_header", "_direct_kwargs",
                     "_generation_templates"):  # probed again on first use (encoding/render.py, spans.py)
            self.__dict__.pop(name, None)
        self._layout = None
        self._layout_dtype = None  # torch's default dtype when `_layout` was probed (see `layout`)
        self._image_bytes: Optional[int] = None
        # an unpickled encoder (num_proc workers) whose processor was changed before it was sent
        # fails its first call, as one changed later does (`check_processor`)
        now = processor_settings(self.processor)
        self.processor_settings = self.__dict__.get("processor_settings") or now  # an older pickle: none recorded
        self._processor_quick = quick_state(self.processor) if now == self.processor_settings else None

    def check_processor(self) -> None:
        """`ArgumentError` when the processor was changed in place (image processor settings, chat
        template, tokens) after this encoder took its settings from it: its rows would mix the old
        settings (pixel bounds, tiles, token ids) with the new ones, and ``datasets`` would cache
        them under the new processor's fingerprint."""
        if self._processor_quick is not None and quick_state(self.processor) == self._processor_quick:
            return
        now = processor_settings(self.processor)
        changed = sorted(k for k in set(now) | set(self.processor_settings)
                         if now.get(k) != self.processor_settings.get(k))
        if not changed:  # changed back, or a pickled form that differs only in bytes
            self._processor_quick = quick_state(self.processor)
            return
        raise ArgumentError(f"the processor's {', '.join(changed)} changed after this Encoder was built from it; "
                            "an Encoder takes its settings from the processor once: build a new "
                            "mmpipe.Encoder(processor, ...) after changing the processor")

    # -- datasets.map entry point ----------------------------------------------------
    def __call__(self, example: dict, idx=None) -> dict:
        """One raw row or a batch (dict of lists) -> output column(s); see `mmpipe.encoding.mapping`.
        A processor changed in place since this encoder was built: `check_processor`'s error."""
        self.check_processor()
        return map_call(self, example, idx)

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
        messages, images, videos, audios = parse_media(example, idx=idx, images_column=self.images_column,
                                                       videos_column=self.videos_column,
                                                       audios_column=self.audios_column)
        messages = self.template_messages(messages, row_where(idx))
        with_audio = {}
        if audios:  # only the kinds that take audio see the keyword
            if not self.family.media.TAKES_AUDIO:
                no_audio(audios, row_where(idx), f"{self.family.name} ({self.processor_class})")
            with_audio["audios"] = audios
        fields = self.family.media.encode_row(self, messages, images, videos, where=row_where(idx),
                                              tools=self.row_tools(example, idx), prefetched=prefetched, **with_audio)
        return MultiModalInputs(family=self.family.name, **fields).validate(idx)

    def text_and_replies(self, messages: list, tools, where: str) -> tuple[str, list]:
        """The row's rendered prompt (`prompt_text`) and, with labels, the character spans of its
        replies (`reply_spans`: the text then gains the family's stop tokens under
        ``end_of_turn="stop_token"``); ([] without labels)."""
        agp = self.generation_prompt(messages)
        if not (self.labels and any(m["role"] == "assistant" for m in messages)):
            text = self.prompt_text(messages, agp, tools, where)
            check_rendered_images(text, messages, self.family.image_token, where)
            return text, []
        text, marked = self.marked_render([messages], agp, tools)[0]  # one render where it is exact
        text = self.prompt_text(messages, agp, tools, where, text)
        check_rendered_images(text, messages, self.family.image_token, where)
        text, spans, _ = self.reply_spans(messages, text, where, tools, agp, marked_text=marked)
        return text, spans

    def check_length(self, n_tokens: int, where: str, fix: str) -> None:
        """A row of ``n_tokens`` over ``max_length``: dropped or refused (`check_max_length`)."""
        check_max_length(n_tokens, self.max_length, self.truncation, where, fix)

    def token_types(self, ids: np.ndarray) -> np.ndarray:
        """``mm_token_type_ids`` int64 [L] of ids int64 [L]: 1 at image pads, 2 at video pads, else 0
        (patch-grid families)."""
        return token_types(self, ids)

    def empty_row_dict(self) -> dict:
        """The stored dict of an empty row (0 tokens), with this encoder's columns."""
        return MultiModalInputs(family=self.family.name, **self.family.media.encode_empty(self)).to_dict()

    def layout(self):
        """The generic path: the processor's outputs (`mmpipe.media.processor.ProcessorLayout`),
        found once by probe calls; None for the families mmpipe lays out itself."""
        layout = getattr(self.family.media, "encode_layout", None)  # the processor kind's probe
        if layout is None:
            return None
        # probed again when torch's default dtype changed since: a processor's torch ops may fail in
        # one (Qwen2.5-Omni's audio features under float64: no audio keys) and work in another
        dtype = _default_dtype()
        if self._layout is None or self._layout_dtype != dtype:
            # threads sharing a fresh encoder probe once, and wait for it: the probe's padding=True calls
            # set the tokenizer's padding, which a concurrent plain call reset mid-probe (IndexError)
            with _PROBE_LOCK:
                if self._layout is None or self._layout_dtype != dtype:
                    probed = layout(self)
                    self._layout, self._layout_dtype = probed, dtype
        return self._layout

    def row_keys(self) -> tuple[str, ...]:
        """The generic path: output names whose axis 0 is the row (see `layout`); () otherwise."""
        layout = self.layout()
        return layout.row_keys if layout is not None else ()

    def image_bytes(self) -> int:
        """Most stored bytes of one image (`mmpipe.map_kwargs` sizing): at ``max_pixels`` in the
        stored pixel format, a tiled family's most tiles, the generic path's processor outputs
        for one 2048x2048 image."""
        return self.family.media.encode_image_bytes(self)

    @property
    def module(self):
        """The tiled family's image module (`ModelFamily.images`)."""
        return self.family.images()

    # -- images ---------------------------------------------------------------------
    def image_threads(self) -> int:
        """Threads decoding this encoder's images (``threads``, or `default_threads`; 1 when
        nothing is decoded here: layout-only, source files, the processor's own call)."""
        if not self.decodes_images:
            return 1
        return default_threads() if self.threads is None else max(1, int(self.threads))

    def load_images(self, images: list, where: str, prefetched=None) -> list:
        """``fam.media.encode_image`` of each image: (its layout, its stored payload), on the
        image threads when there are several (in order: the first failing image raises)."""
        if prefetched is None and self.image_threads() > 1 and len(images) > 1:
            # a pool of exactly image_threads(): on the shared 8-thread one, every image of the row
            # was decoded at once, each at full size (threads=2, 8 photos of 12 MP: 441 MB, not 120)
            prefetched = self.submit_images(images, where, thread_pool(self.image_threads()))
        if prefetched is not None:
            return [f.result() for f in prefetched]
        return [self.load_image(i, value, where) for i, value in enumerate(images)]

    def submit_images(self, images: list, where: str, pool) -> list:
        """One future of `load_image` per image on ``pool``. The same object twice is submitted
        once: a lazily decoded PIL image must not be loaded by two threads."""
        own, futures = {}, []
        for i, value in enumerate(images):
            f = own.get(id(value))
            if f is None:
                f = own[id(value)] = pool.submit(self.load_image, i, value, where)
            futures.append(f)
        return futures

    def load_image(self, i: int, value, where: str):
        """Image ``i`` of the row -> ``fam.media.encode_image``; its `ImageError` located at image
        ``i`` of the images column; a path outside ``image_root`` refused first."""
        at = f"{where}, image {i}"
        try:
            if self.image_root is not None:  # untrusted datasets: paths must stay under the root
                confine_image(value, self.image_root, where=at)
            return self.family.media.encode_image(self, value, at)
        except ImageError as e:
            raise e.locate(column=self.images_column, image=i)

    def lut(self):
        """float32 [3, 256] pixel table of this encoder's `VisionSpec` (cached)."""
        if getattr(self, "_lut_cache", None) is None:
            self._lut_cache = self.spec.lut()
        return self._lut_cache


_PROBE_LOCK = ForkSafeLock(reentrant=True)


def _default_dtype():
    """torch's default dtype (None while torch is not imported: no processor has run torch ops)."""
    torch = sys.modules.get("torch")
    return None if torch is None else torch.get_default_dtype()


def _family(processor, asked: Optional[str]) -> ModelFamily:
    """The family to encode for: the processor's, or the generic path when asked for."""
    if asked is None:
        return resolve_family(processor)
    if get_family(asked) is not GENERIC:  # another family's rows need that family's processor
        raise ArgumentError(f"family must be None (the processor's own) or {GENERIC.name!r} (the "
                            f"processor's own template and call), got {asked!r}")
    return GENERIC
