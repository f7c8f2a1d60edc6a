"""The generic path: any transformers VLM processor mmpipe has no family table for.

raw chat row -> the processor's own chat template + processor call -> `MultiModalInputs`
(its outputs, its dtypes; labels from the assistant spans) -> stored row
(`MultiModalInputs.to_dict`, ``family="generic"``) -> `mmpipe.collate` / `mmpipe.Collator`
(`mmpipe.batching.generic`: padding, ragged tiles, 1-D positions) -> ``model(**batch.model_inputs())``.

``mmpipe.encode`` / ``encode_row`` / ``encode_dataset`` / ``Collator`` come here by themselves
for such a processor (`mmpipe.families.takes_generic_path`) and log one line per processor
class. None of mmpipe's speed features apply: no compact uint8 storage, no layout-only
encoding, no packing, positions ``0..n-1`` (right for 1-D rotary models; an M-RoPE model
of an unlisted family builds its own: ``model_inputs(positions="none")``)::

    >>> enc = GenericEncoder(processor)                                 # doctest: +SKIP
    >>> row = enc.encode_row({"messages": msgs, "images": [photo]})     # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Callable, Optional

import numpy as np

from mmpipe.encoding.fingerprint import CodeStamped
from mmpipe.encoding.mapping import EncodeStats, check_max_length, map_call
from mmpipe.encoding.options import ERROR_POLICIES, check_choice
from mmpipe.encoding.parse import parse_row, parse_tools, row_where
from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import GENERIC_FAMILY, UnsupportedProcessorError, family_of, processor_class_name, tiled_family_of
from mmpipe.images.load import load_image, to_rgb_image, upright
from mmpipe.records.columns import IGNORE_INDEX, to_numpy
from mmpipe.media.processor import ProcessorLayout
from mmpipe.records.row import MultiModalInputs

__all__ = ["GenericEncoder", "GENERIC_LOG", "generic_log_line"]

logger = logging.getLogger("mmpipe")

GENERIC_LOG = ("mmpipe: {cls} has no model-family table; encoding through the generic path (its own chat "
               "template and processor call, float pixel values as the processor returns them). It lacks: "
               "compact uint8 storage, layout-only encoding, packing; positions are 1-D (0..n-1 per row)")
_OWN = ("input_ids", "attention_mask", "labels")  # processor outputs mmpipe makes itself (labels: the replies)
LOGGED_CLASSES: set = set()  # processor classes this process has logged the line for

# Encoder options that have no meaning here: option -> what to do instead
_REFUSED = {
    "min_pixels": "set the bounds on the processor's image processor",
    "max_pixels": "set the bounds on the processor's image processor",
    "image_backend": "the processor's own image processor is used as it is",
    "image_root": "resolve and check image paths before encoding",
}


def generic_log_line(processor_class: str) -> str:
    """The one line logged when a processor of ``processor_class`` takes the generic path."""
    return GENERIC_LOG.format(cls=processor_class)


def _refuse(cls: str, what: str, fix: str) -> ArgumentError:
    return ArgumentError(f"{what} is not available for {cls}: it has no mmpipe family table and takes the generic "
                         f"path ({GENERIC_FAMILY}: the processor's own outputs, 1-D positions); {fix}")


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


class GenericEncoder(CodeStamped):
    """Raw chat rows -> `MultiModalInputs` through ``processor``'s own chat template and call.

    ``processor``: a transformers VLM processor of a family mmpipe has no table for (a native
    family is refused: its rows need `mmpipe.Encoder` and M-RoPE positions). The options are
    `mmpipe.Encoder`'s where they make sense: ``max_length``, ``truncation`` (``"raise"`` /
    ``"drop"``), ``add_generation_prompt``, ``labels`` (-100 except the tokens overlapping an
    assistant reply, as `mmpipe.Encoder`), ``images_column``, ``chat_template_kwargs``,
    ``on_error``, ``tools`` / ``tools_column``, ``threads`` (unused: one processor call per
    row), ``pixels`` (``"float32"`` only: the processor's outputs). Compact or layout-only
    pixels, ``truncation="truncate_text"`` and resize/backend options raise `ArgumentError`.
    ``log``: receives the one line saying which path is used (default: the ``mmpipe`` logger,
    once per processor class and process).

    Rows are those `mmpipe.encode` takes (``messages`` with image items, an ``images`` column).
    Called as a ``datasets.map`` function it returns stored dicts (`MultiModalInputs.to_dict`).
    """

    RUNTIME_STATE = ("stats", "_layout", "_image_bytes")

    def __init__(self, processor, *, max_length: Optional[int] = None, truncation: str = "raise",
                 add_generation_prompt: Optional[bool] = None, labels: bool = True, images_column: str = "images",
                 chat_template_kwargs: Optional[dict] = None, on_error: str = "raise", tools: Optional[list] = None,
                 tools_column: str = "tools", threads: Optional[int] = None, pixels: Optional[str] = None,
                 log: Optional[Callable[[str], None]] = None, **refused):
        try:
            fam = family_of(processor)
        except UnsupportedProcessorError:
            fam = None
        cls = processor_class_name(processor)
        if fam is not None and tiled_family_of(fam) is None:  # a tiled family may still take it explicitly
            raise ArgumentError(f"processor {cls} is mmpipe's native family {fam.name!r}; "
                                f"encode it with mmpipe.encoding.Encoder (the generic path gives 1-D positions)")
        for name in refused:
            if name not in _REFUSED:
                raise TypeError(f"GenericEncoder got an unexpected keyword argument {name!r}")
            raise _refuse(cls, f"{name}=", _REFUSED[name])
        if pixels not in (None, "float32"):
            raise _refuse(cls, f"pixels={pixels!r} (compact or layout-only storage)",
                          "leave pixels out (or pass 'float32'): the processor's own pixel values are stored")
        if truncation not in ("raise", "drop"):
            raise _refuse(cls, f"truncation={truncation!r}", "use truncation='raise' or 'drop'")
        check_choice("on_error", on_error, ERROR_POLICIES)
        if max_length is not None and (not isinstance(max_length, (int, np.integer)) or max_length < 1):
            raise ArgumentError(f"max_length must be a positive int or None, got {max_length!r}")
        self.processor = processor
        self.processor_class = cls
        self.family = GENERIC_FAMILY
        self.pixels = "float32"
        self.max_length, self.truncation, self.labels = max_length, truncation, labels
        self.add_generation_prompt = add_generation_prompt
        self.images_column = images_column
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if "tools" in self.chat_template_kwargs:  # tools have their own option, as for mmpipe.Encoder
            if tools is not None:
                raise ArgumentError("pass tools once: tools= or chat_template_kwargs['tools'], not both")
            tools = self.chat_template_kwargs.pop("tools")
        self.tools, self.tools_column = tools, tools_column
        self.on_error, self.threads = on_error, threads
        self.mark_dropped = False  # encode_dataset sets it, as for mmpipe.Encoder
        tok = getattr(processor, "tokenizer", processor)
        self.pad_token_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
        if log is not None:
            log(generic_log_line(cls))
        elif cls not in LOGGED_CLASSES:
            LOGGED_CLASSES.add(cls)
            logger.info(generic_log_line(cls))
        self.fresh_runtime_state()

    def fresh_runtime_state(self) -> None:
        self.stats = EncodeStats()
        self._layout: Optional[ProcessorLayout] = None
        self._image_bytes: Optional[int] = None

    # -- datasets.map entry point (the protocol of mmpipe.encoding.mapping) ----------------
    def __call__(self, example: dict, idx=None) -> dict:
        """One raw row or a batch (dict of lists) -> stored column(s)."""
        return map_call(self, example, idx)

    def image_threads(self) -> int:
        return 1  # the processor call decodes the row's images itself

    def empty_row_dict(self) -> dict:
        """The stored dict of an empty row (0 tokens): every column of the layout, empty."""
        row = MultiModalInputs(input_ids=np.zeros(0, np.int64), attention_mask=np.zeros(0, np.int64),
                               family=GENERIC_FAMILY, layout=self.layout(), image_hw=np.zeros((0, 2), np.int64),
                               labels=np.zeros(0, np.int64) if self.labels else None)
        return row.to_dict()

    # -- the processor's layout ------------------------------------------------------------
    def _call(self, messages: list, images: list, agp: bool, tools=None):
        return self.processor(text=[self._render(messages, agp, tools)], images=images or None, return_tensors="np")

    def layout(self) -> ProcessorLayout:
        """The processor's outputs, found once by two probes: a text-only row and one row
        holding two small images. Row keys: axis 0 of length 1 for the row (not a sequence);
        sequence keys: ``[1, L]``; the other outputs are vision keys (axis 0: images/patches)."""
        if self._layout is None:
            from PIL import Image

            im = Image.new("RGB", (64, 64), (120, 60, 30))
            msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "a"}]}]
            out = self._call(msgs, [im, im], True)
            try:
                text_only = self._call([{"role": "user", "content": [{"type": "text", "text": "a"}]}], [], True)
            except (ValueError, TypeError, IndexError, KeyError):  # PaliGemma takes no row without an image
                text_only = {}
            seq = len(to_numpy(out["input_ids"])[0])
            arrays = {k: np.asarray(to_numpy(v)) for k, v in out.items() if k not in _OWN}
            sequence = {k for k, v in arrays.items() if v.shape == (1, seq)}
            sequence |= {k for k, v in text_only.items() if k not in _OWN
                         and np.shape(v) == np.shape(text_only["input_ids"])}
            row_keys = sorted(k for k, v in arrays.items() if k not in sequence and v.ndim >= 1 and v.shape[0] == 1)
            vision = tuple((k, str(v.dtype), v.ndim) for k, v in sorted(arrays.items()) if k not in sequence)
            self._layout = ProcessorLayout(self.processor_class, tuple(sorted(sequence)), vision, tuple(row_keys),
                                         self._pads(row_keys, im))
        return self._layout

    def _pads(self, row_keys: list, im) -> tuple:
        """Row keys whose missing items the processor pads with other values than 0 (Mllama's
        ``aspect_ratio_mask``: first tile 1): its batch of a 1-image and a 2-image row, the
        first row's slot 1 (axis 1; token-aligned keys skipped). () where the batch call fails."""
        msgs = [[{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": "a"}]}] for n in (1, 2)]
        try:
            out = self.processor(text=[self._render(m, True, None) for m in msgs], images=[[im], [im, im]],
                                 padding=True, return_tensors="np")
        except (ValueError, TypeError, IndexError, KeyError):
            return ()
        L = np.shape(out["input_ids"])[1]
        slots = {k: np.asarray(to_numpy(out[k]))[0, 1] for k in row_keys
                 if k in out and np.ndim(out[k]) >= 3 and np.shape(out[k])[1] == 2 != L}
        return tuple((k, tuple(v.reshape(-1).tolist())) for k, v in sorted(slots.items()) if v.any())

    def row_keys(self) -> tuple[str, ...]:
        """Output names whose axis 0 is the row (see `layout`)."""
        return self.layout().row_keys

    def image_bytes(self) -> int:
        """Bytes of the processor's outputs for one large (2048x2048) image: the most one
        image takes for a processor that bounds its resize (`mmpipe.map_kwargs` sizing)."""
        if self._image_bytes is None:
            from PIL import Image

            msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a"}]}]
            out = self._call(msgs, [Image.new("RGB", (2048, 2048), (120, 60, 30))], True)
            self._image_bytes = int(sum(np.asarray(to_numpy(v)).nbytes for k, v in out.items()
                                        if k not in ("input_ids", "attention_mask")))
        return self._image_bytes

    # -- one row ----------------------------------------------------------------------------
    def encode_row(self, example: dict, idx=None, *, _images=None) -> MultiModalInputs:
        """One raw row -> `MultiModalInputs`; bad input raises `mmpipe.errors.InputError` naming
        row ``idx``; a row over ``max_length`` raises `TruncationError` (or `RowDropped`)."""
        try:
            return self._encode_row(example, idx)
        except InputError as e:
            raise e.locate(row=idx)

    def _encode_row(self, example: dict, idx) -> MultiModalInputs:
        where = row_where(idx)
        messages, raw_images = parse_row(example, idx=idx, images_column=self.images_column)
        images = [to_rgb_image(upright(load_image(v, where=f"{where}, image {i}"))) for i, v in enumerate(raw_images)]
        tools = parse_tools(example, idx=idx, column=self.tools_column, default=self.tools)
        agp = self.add_generation_prompt
        if agp is None:
            agp = messages[-1]["role"] != "assistant"
        try:
            out = self._call(messages, images, agp, tools)
        except (ValueError, TypeError, IndexError, KeyError) as e:
            raise InputError(f"the processor {self.processor_class} failed on this row ({type(e).__name__}: {e})",
                             where=where, stage="encode", column="messages",
                             fix="check the row's image items against its images and the chat template") from e
        ids = to_numpy(out["input_ids"])[0].astype(np.int64)
        layout = self.layout()
        sequence, vision = {}, {}
        vision_keys = {name for name, _, _ in layout.vision}
        for k, v in out.items():
            if k in _OWN:
                continue
            v = np.asarray(to_numpy(v))
            if k in layout.sequence:
                sequence[k] = v.reshape(-1).astype(np.int64)
            elif k in vision_keys:
                if v.ndim and v.shape[0]:  # an empty output is a key the row does not have
                    vision[k] = v
            else:
                raise InputError(f"the processor returned {k!r}, which its probe did not show", where=where,
                                 stage="encode", column=k, expected=f"one of {sorted(vision_keys | set(layout.sequence))}",
                                 found=k, fix="report the processor class; encode with labels and options unchanged")
        for k in layout.sequence:
            sequence.setdefault(k, np.zeros(len(ids), np.int64))
        labels = self._labels(messages, images, agp, tools, ids) if self.labels else None
        trained = np.flatnonzero(labels != IGNORE_INDEX) if labels is not None else ()
        if len(trained) and "labels" in out and "token_type_ids" in sequence:
            # the processor's labels are its token type 1 (PaliGemma's suffix: causal, trained; type 0 is the
            # bidirectional prefix): the suffix runs from the first labelled token (a reply) to the end
            sequence["token_type_ids"] = sequence["token_type_ids"].copy()
            sequence["token_type_ids"][trained[0]:] = 1
        self._check_length(ids, where)
        hw = np.asarray([(im.height, im.width) for im in images], np.int64).reshape(-1, 2)
        row = MultiModalInputs(input_ids=ids, attention_mask=np.ones(len(ids), np.int64), family=GENERIC_FAMILY,
                               sequence=sequence, vision=vision, labels=labels, layout=layout, image_hw=hw)
        return row.validate(idx)

    def _render(self, messages: list, agp: bool, tools) -> str:
        extra = {"tools": tools} if tools is not None else {}
        return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp, **extra,
                                                  **self.chat_template_kwargs)

    def _labels(self, messages: list, images: list, agp: bool, tools, ids: np.ndarray) -> np.ndarray:
        """int64 [L]: the ids where a token overlaps an assistant reply (its text and end-of-turn
        token, not the newline after), -100 elsewhere. Each reply's start and end: the text
        after it tokenized alone, when the row's ids end with those tokens and it holds no
        image (no processor call); else the processor run on the conversation up to there
        (its images included: image tokens count), a token merged across the edge labelled."""
        labels = np.full(len(ids), IGNORE_INDEX, np.int64)
        full = self._render(messages, agp, tools)
        n_images = [sum(1 for c in m["content"] if isinstance(c, dict) and c.get("type") == "image")
                    if isinstance(m.get("content"), list) else 0 for m in messages]
        for k, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            text_after = not any(n_images[k:])  # no image at or after this reply: tokenize the rest alone
            before = self._render(messages[:k], True, tools) if k else ""
            start = self._suffix_cut(ids, full, before) if text_after else None
            if start is None:
                start = _common_prefix(self._prefix_ids(before, images[:sum(n_images[:k])]), ids) if k else 0
            upto = self._render(messages[: k + 1], False, tools).rstrip("\n ")
            end = self._suffix_cut(ids, full, upto) if text_after else None
            if end is None:
                upto_ids = self._prefix_ids(upto, images[:sum(n_images[: k + 1])])
                shared = _common_prefix(upto_ids, ids)
                end = shared + (1 if shared < len(upto_ids) else 0)  # a last token merged with what follows
            labels[start:end] = ids[start:end]
        return labels

    def _suffix_cut(self, ids: np.ndarray, full: str, prefix: str) -> Optional[int]:
        """Where ``prefix`` ends in ``ids`` (the tokens of ``full``): ``len(ids)`` minus the
        tokens of ``full[len(prefix):]`` tokenized alone, when ``ids`` ends with them; else None."""
        if not full.startswith(prefix):
            return None
        rest = full[len(prefix):]
        if not rest:
            return len(ids)
        tok = getattr(self.processor, "tokenizer", self.processor)
        rest_ids = np.asarray(tok(rest, add_special_tokens=False)["input_ids"], np.int64)
        n = len(rest_ids)
        return len(ids) - n if n <= len(ids) and np.array_equal(ids[len(ids) - n:], rest_ids) else None

    def _prefix_ids(self, text: str, images: list) -> np.ndarray:
        """Token ids of a rendered conversation prefix with its own images."""
        out = self.processor(text=[text], images=images or None, return_tensors="np")
        return to_numpy(out["input_ids"])[0].astype(np.int64)

    def _check_length(self, ids: np.ndarray, where: str) -> None:
        check_max_length(len(ids), self.max_length, self.truncation, where, "raise max_length, shrink the images, or pass truncation='drop'")
