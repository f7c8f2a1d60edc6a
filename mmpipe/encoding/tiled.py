"""Native encoding of the tiled families (`mmpipe.families.ModelFamily`: Gemma 3, InternVL,
LLaVA-OneVision), with no processor call per row.

raw chat row -> the chat template (rendered once, one placeholder per image) -> each
placeholder replaced by the family's text (`mmpipe.images.<family>.expand_placeholder`, from
the image's (height, width) alone) with each run of K feature tokens written ONCE
(``placeholder_runs``) -> one tokenizer call on that short text -> each run's feature id
repeated K times (the feature token is an added token: atomic, so the ids equal those of the
fully written text, which `TiledEncoder.__init__` checks on probe texts) -> `MultiModalInputs`: ids, token types
(1 at the feature tokens), labels, and the images as compact uint8 tiles
(``tiles_u8``: uint8 [n, S, S, 3]; 1/4 of the processor's float32 bytes), with
``pixels="source"`` each image's encoded file as given (`mmpipe.encoding.sources.source_bytes`;
sizes and tile counts from the headers, ~1.0x the source files) or, with ``pixels="none"``,
nothing but their sizes (layout-only: headers only, no decode) -> `mmpipe.collate` expands the
tiles (decoding and tiling the source files first, in the DataLoader worker) to the processor's
float32 ``pixel_values``, bit-exact.

``mmpipe.encode`` / ``encode_row`` / ``encode_dataset`` come here by themselves for such a
processor (`mmpipe.encoding.dataset.make_encoder`)::

    >>> enc = TiledEncoder(processor)                                     # doctest: +SKIP
    >>> row = enc.encode_row({"messages": msgs, "images": [photo]})       # doctest: +SKIP
"""

from __future__ import annotations

import json
import weakref
from typing import Optional

import numpy as np

from mmpipe.encoding.fingerprint import CodeStamped
from mmpipe.encoding.mapping import EncodeStats, check_max_length, map_call
from mmpipe.encoding.options import ERROR_POLICIES, check_choice
from mmpipe.encoding.parse import check_text, parse_row, parse_tools, row_where
from mmpipe.encoding.sources import source_bytes
from mmpipe.errors import ArgumentError, ImageError, InputError, PlaceholderError
from mmpipe.families import processor_class_name, tiled_family_of
from mmpipe.images.load import check_image_root, confine_image, image_hw
from mmpipe.images.threads import default_threads, thread_pool
from mmpipe.images.tiles import effective_image_processor, image_tiles
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs

__all__ = ["TiledEncoder", "TILED_PIXELS"]

TILED_PIXELS = ("uint8", "source", "none")  # tiles, source files, layout-only (float32: the same values, 4x the bytes)
_COLLAPSE_CHECKED = weakref.WeakKeyDictionary()  # tokenizer -> {probe text: exact} (TiledEncoder._collapse_is_exact)
_REFUSED = {  # Encoder options without a meaning here -> what to do instead
    "min_pixels": "the family resizes to its fixed tile size: set size on the processor's image processor",
    "max_pixels": "the family resizes to its fixed tile size: set size on the processor's image processor",
    "videos_column": "tiled families take images only here", "video_options": "tiled families take images only here",
}


class TiledEncoder(CodeStamped):
    """Raw chat rows -> `MultiModalInputs` for a tiled family's processor (module doc).

    Options as `mmpipe.Encoder`'s: ``max_length`` with ``truncation`` ``"raise"`` / ``"drop"``,
    ``add_generation_prompt``, ``labels`` (-100 except the tokens overlapping an assistant
    reply; image texts never), ``images_column``, ``chat_template_kwargs``, ``on_error``,
    ``tools`` / ``tools_column``, ``image_root``, ``threads`` (unused). ``pixels``: ``"uint8"``
    (compact tiles), ``"source"`` (each image's file bytes, tiled at collate) or ``"none"``
    (layout-only). ``images_kwargs``: the processor call's image
    options (e.g. Gemma 3 ``{"do_pan_and_scan": True}``), as ``processor(..., **images_kwargs)``.
    ``image_backend``: ``"auto"`` (or the processor's own backend, ``"pil"`` / ``"torchvision"``:
    the tiles are resized as that backend resizes them, `mmpipe.images.tiles.resize_tile`).
    """

    RUNTIME_STATE = ("stats",)

    def __init__(self, processor, *, max_length: Optional[int] = None, truncation: str = "raise",
                 pixels: Optional[str] = None, add_generation_prompt: Optional[bool] = None, labels: bool = True,
                 images_column: str = "images", chat_template_kwargs: Optional[dict] = None, on_error: str = "raise",
                 tools: Optional[list] = None, tools_column: str = "tools", threads: Optional[int] = None,
                 images_kwargs: Optional[dict] = None, image_root: Optional[str] = None, image_backend: str = "auto",
                 **refused):
        fam = tiled_family_of(processor)
        cls = processor_class_name(processor)
        if fam is None:
            raise ArgumentError(f"processor {cls} is not a tiled family's (known: see mmpipe.families.TILED_FAMILIES); "
                                "encode it with mmpipe.encode, which picks the right encoder")
        for name in refused:
            if name not in _REFUSED:
                raise TypeError(f"TiledEncoder got an unexpected keyword argument {name!r}")
            if refused[name] is not None:
                raise ArgumentError(f"{name}= is not available for {cls} ({fam.name}): {_REFUSED[name]}")
        pixels = "uint8" if pixels is None else pixels
        if pixels not in TILED_PIXELS:
            raise ArgumentError(f"pixels={pixels!r} is not available for {fam.name}: use one of {TILED_PIXELS} "
                                "(uint8 tiles expand to the processor's float32 pixel_values at collate, bit-exact)")
        own = getattr(processor.image_processor, "backend", "pil")
        if image_backend not in ("auto", own):
            raise ArgumentError(f"{fam.name} rows are made with the processor's own image backend ({own!r}); got "
                                f"image_backend={image_backend!r}: load the processor with the backend you want "
                                f"(the family's ...ImageProcessorPil, or the torchvision one)")
        if own not in getattr(fam.images(), "BACKENDS", ("pil",)):
            raise ArgumentError(f"{fam.name}'s {own} image processor ({type(processor.image_processor).__name__}) is not "
                                f"reproduced (backends: {getattr(fam.images(), 'BACKENDS', ('pil',))}); use the family's "
                                f"...ImageProcessorPil, or GenericEncoder(processor) (its own float32 outputs)")
        if truncation not in ("raise", "drop"):
            raise ArgumentError(f"truncation={truncation!r} is not available for {fam.name}: use 'raise' or 'drop' "
                                "(cutting a row could cut an image's tokens)")
        check_choice("on_error", on_error, ERROR_POLICIES)
        if max_length is not None and (not isinstance(max_length, (int, np.integer)) or max_length < 1):
            raise ArgumentError(f"max_length must be a positive int or None, got {max_length!r}")
        self.processor, self.processor_class, self.family = processor, cls, fam
        self.tokenizer = processor.tokenizer
        self.images_kwargs = dict(images_kwargs or {})
        try:  # rows keep them (a JSON column): collate of source rows and vLLM prompts re-apply them
            json.dumps(self.images_kwargs)
        except (TypeError, ValueError) as e:
            raise ArgumentError(f"images_kwargs must be JSON values (numbers, strings, bools, lists, dicts): {e}") from e
        self.image_processor = effective_image_processor(processor, **self.images_kwargs)
        self.pixels, self.max_length, self.truncation, self.labels = pixels, max_length, truncation, labels
        self.add_generation_prompt = add_generation_prompt
        self.images_column, self.image_root = images_column, check_image_root(image_root)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if "tools" in self.chat_template_kwargs:
            if tools is not None:
                raise ArgumentError("pass tools once: tools= or chat_template_kwargs['tools'], not both")
            tools = self.chat_template_kwargs.pop("tools")
        self.tools, self.tools_column = tools, tools_column
        self.on_error, self.threads = on_error, threads
        self.mark_dropped = False  # encode_dataset sets it, as for mmpipe.Encoder
        self.feature_id = fam.token_ids(self.tokenizer)["feature"]
        self.collapse = self._collapse_is_exact()
        self.fresh_runtime_state()

    def fresh_runtime_state(self) -> None:
        self.stats = EncodeStats()

    # -- datasets.map entry point (the protocol of mmpipe.encoding.mapping) ----------------
    def __call__(self, example: dict, idx=None) -> dict:
        """One raw row or a batch (dict of lists) -> stored column(s)."""
        return map_call(self, example, idx)

    def image_threads(self) -> int:
        """Threads decoding and tiling images (``threads``, or `default_threads`; layout-only and
        source rows, which decode nothing: 1)."""
        if self.pixels != "uint8":
            return 1
        return default_threads() if self.threads is None else max(1, int(self.threads))

    def submit_images(self, images: list, where: str, pool) -> list:
        """One future of ((height, width), uint8 tiles [n, S, S, 3]) per image on ``pool`` (what
        `mmpipe.encoding.mapping.prefetch_images` starts for the next rows of a batch). The same
        object twice is submitted once: a lazily decoded PIL image must not be loaded by two threads."""
        own, futures = {}, []
        for i, value in enumerate(images):
            f = own.get(id(value))
            if f is None:
                f = own[id(value)] = pool.submit(self._image, i, value, where)
            futures.append(f)
        return futures

    def empty_row_dict(self) -> dict:
        """The stored dict of an empty row (0 tokens), with this encoder's columns."""
        z = np.zeros(0, np.int64)
        th, tw = self.tile_hw()
        u8 = np.zeros((0, th, tw, 3), np.uint8) if self.pixels == "uint8" else None
        return MultiModalInputs(family=self.family.name, input_ids=z, attention_mask=z, mm_token_type_ids=z,
                           image_hw=np.zeros((0, 2), np.int64), tiles_per_image=z, pixel_values_u8=u8,
                           image_sources=[] if self.pixels == "source" else None, **self._row_settings(),
                           labels=z if self.labels else None).to_dict()

    def _row_settings(self) -> dict:
        """What every row of this encoder records: its ``images_kwargs``; source rows their backend."""
        backend = getattr(self.image_processor, "backend", "pil") if self.pixels == "source" else "pil"
        return {"images_kwargs": self.images_kwargs or None, "image_backend": backend}

    def tile_hw(self) -> tuple[int, int]:
        """(S_h, S_w) of this processor's tiles (one tiny probe image)."""
        from PIL import Image

        return tuple(self.module.tiles_u8(Image.new("RGB", (8, 8)), self.image_processor).shape[1:3])

    def image_bytes(self) -> int:
        """Most stored pixel bytes of one image (`mmpipe.map_kwargs` sizing): the most tiles an
        image can have (the module's ``max_tiles``, else a 2048x2048 image's) x S x S x 3 (source
        rows: the same bound; an image file is rarely larger than its uint8 tiles)."""
        if self.pixels == "none":
            return 0
        most = getattr(self.module, "max_tiles", None)
        n = most(self.image_processor) if most is not None else self.module.tile_count(2048, 2048, self.image_processor)
        th, tw = self.tile_hw()
        return int(n) * th * tw * 3

    @property
    def module(self):
        return self.family.images()

    # -- one row ----------------------------------------------------------------------------
    def encode_row(self, example: dict, idx=None, *, _images=None) -> MultiModalInputs:
        """One raw row -> `MultiModalInputs`; bad input raises `mmpipe.errors.InputError` naming row
        ``idx``; a row over ``max_length`` raises `TruncationError` (or is dropped).
        (``_images``: the row's image futures started by a batched call, `submit_images`.)"""
        try:
            return self._encode_row(example, idx, _images)
        except InputError as e:
            raise e.locate(row=idx)

    def _encode_row(self, example: dict, idx, prefetched=None) -> MultiModalInputs:
        where = row_where(idx)
        messages, raw_images = parse_row(example, idx=idx, images_column=self.images_column)
        tools = parse_tools(example, idx=idx, column=self.tools_column, default=self.tools)
        agp = self.add_generation_prompt if self.add_generation_prompt is not None else messages[-1]["role"] != "assistant"
        text = check_text(self._render(messages, agp, tools), where=where, column="messages", what="the rendered prompt")
        sizes, payloads = self._images(raw_images, where, prefetched)
        tiles = payloads if self.pixels == "uint8" else None
        pieces, spans, images_at, runs = self._spliced(text, sizes, where)
        enc = self.tokenizer("".join(pieces), return_offsets_mapping=self.labels)
        short = np.asarray(enc["input_ids"], np.int64)  # each run of feature tokens as one id (collapse on)
        repeat, found = self._repeats(short, runs)
        want = sum(self.module.image_tokens(h, w, self.image_processor, self.processor) for h, w in sizes)
        if found != want:
            raise PlaceholderError(f"the expanded prompt holds {found} {self.family.feature_token} tokens "
                                   f"for {len(sizes)} image(s)", where=where, column="messages",
                                   expected=str(want), found=str(found),
                                   fix=f"remove literal {self.family.feature_token} text from the messages")
        ids = short if repeat is None else np.repeat(short, repeat)
        types = (ids == self.feature_id).astype(np.int64)
        labels = None
        if self.labels:
            labels = self._labels(short, np.asarray(enc["offset_mapping"], np.int64).reshape(-1, 2),
                                  self._assistant_spans(messages, text, where, tools, agp), spans, images_at)
            labels = labels if repeat is None else np.repeat(labels, repeat)
        self._check_length(ids, where)
        return MultiModalInputs(family=self.family.name, input_ids=ids, attention_mask=np.ones(len(ids), np.int64),
                           mm_token_type_ids=types, image_hw=np.asarray(sizes, np.int64).reshape(-1, 2),
                           tiles_per_image=np.asarray([len(t) for t in tiles] if tiles is not None else
                                                      [self.module.tile_count(h, w, self.image_processor)
                                                       for h, w in sizes], np.int64),
                           pixel_values_u8=None if tiles is None else self._stacked(tiles),
                           image_sources=payloads if self.pixels == "source" else None, **self._row_settings(),
                           labels=labels).validate(idx)

    def _stacked(self, tiles: list) -> np.ndarray:
        if tiles:
            return np.concatenate(tiles)
        th, tw = self.tile_hw()
        return np.zeros((0, th, tw, 3), np.uint8)

    def _images(self, raw_images: list, where: str, prefetched=None) -> tuple[list, Optional[list]]:
        """([(height, width)] per image, [uint8 tiles [n, S, S, 3]] or [source bytes] per image,
        or None for layout-only); several images on the image threads."""
        if self.pixels == "none":
            return [self._image(i, value, where)[0] for i, value in enumerate(raw_images)], None
        if prefetched is None and self.image_threads() > 1 and len(raw_images) > 1:
            prefetched = self.submit_images(raw_images, where, thread_pool())
        done = [f.result() for f in prefetched] if prefetched is not None else \
            [self._image(i, value, where) for i, value in enumerate(raw_images)]  # in order: the first failure raises
        return [hw for hw, _ in done], [t for _, t in done]

    def _image(self, i: int, value, where: str) -> tuple[tuple[int, int], Optional[np.ndarray]]:
        """Image ``i``: ((height, width) upright, its uint8 tiles, its source bytes (headers
        read, nothing decoded), or None for layout-only)."""
        at = f"{where}, image {i}"
        try:
            if self.image_root is not None:
                confine_image(value, self.image_root, where=at)
            if self.pixels == "none":
                return image_hw(value, where=at), None
            if self.pixels == "source":
                return image_hw(value, where=at), source_bytes(value, where=at)
            return image_tiles(value, self.image_processor, self.module, where=at)
        except ImageError as e:
            raise e.locate(column=self.images_column, image=i)

    def _render(self, messages: list, agp: bool, tools) -> str:
        extra = {"tools": tools} if tools is not None else {}
        try:
            return self.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp, **extra,
                                                      **self.chat_template_kwargs)
        except Exception as e:  # jinja raises its own types
            raise InputError(f"the chat template failed on these messages ({type(e).__name__}: {e})",
                             stage="template", column="messages",
                             fix="check the roles and their order against the model's chat template") from e

    def _collapse_is_exact(self) -> bool:
        """Whether tokenizing an image text with each feature-token run written once, then
        repeating the feature id, gives the ids of the fully written text: the family's text of
        a probe image between varied neighbours (spaces, newlines, letters, none), runs of 1
        and 3 against 1 (an added token is atomic; a tokenizer where it is not keeps the
        fully written path)."""
        text, runs = self.module.placeholder_runs(8, 8, self.processor, self.image_processor)
        tok = self.family.feature_token
        if not runs or text.count(tok) != len(runs):
            return bool(not runs)
        try:  # once per tokenizer and probe text
            return _COLLAPSE_CHECKED.setdefault(self.tokenizer, {})[text]
        except KeyError:
            pass
        except TypeError:  # a tokenizer that is no weakref-able dict key: probe every time
            return _collapse_exact(self.tokenizer, self.feature_id, tok, text)
        exact = _COLLAPSE_CHECKED[self.tokenizer][text] = _collapse_exact(self.tokenizer, self.feature_id, tok, text)
        return exact

    def _repeats(self, short: np.ndarray, runs: Optional[list]) -> tuple[Optional[np.ndarray], int]:
        """(how many times each id of ``short`` stands, or None for ids already written out;
        the feature tokens the written-out ids hold)."""
        at = np.flatnonzero(short == self.feature_id)
        if runs is None:
            return None, len(at)
        found = len(at) - len(runs) + sum(runs)  # a literal feature token in the text counts once
        if len(at) != len(runs):
            return None, found
        repeat = np.ones(len(short), np.int64)
        repeat[at] = runs
        return repeat, found

    def _spliced(self, text: str, sizes: list, where: str) -> tuple[list, list, list, Optional[list]]:
        """The rendered text cut at its image placeholders, each replaced by its image's text:
        (pieces, [(start, end) of each image text in the expanded text], [start of each
        placeholder in ``text``], the feature-token run lengths in order or None). With
        ``collapse`` each image's text has its runs of feature tokens written once
        (``placeholder_runs``); spans are then in that short text."""
        token = self.family.image_token
        at, k = [], text.find(token)
        while k >= 0:
            at.append(k)
            k = text.find(token, k + len(token))
        if len(at) != len(sizes):
            raise PlaceholderError(f"the rendered prompt holds {len(at)} {token} placeholder(s) but the row has "
                                   f"{len(sizes)} image(s)", where=where, column="messages",
                                   expected=f"one {token} per image", found=str(len(at)),
                                   fix=(f"remove literal {token} text from the messages" if len(at) > len(sizes)
                                        else "the chat template did not render every image item"))
        pieces, spans, last, pos, runs = [], [], 0, 0, [] if self.collapse else None
        for k, (h, w) in zip(at, sizes):
            pieces.append(text[last:k])
            pos += k - last
            if self.collapse:
                image_text, image_runs = self.module.placeholder_runs(h, w, self.processor, self.image_processor)
                runs += image_runs
            else:
                image_text = self.module.expand_placeholder(h, w, self.processor, self.image_processor)
            pieces.append(image_text)
            spans.append((pos, pos + len(image_text)))
            pos, last = pos + len(image_text), k + len(token)
        pieces.append(text[last:])
        return pieces, spans, at, runs

    def _assistant_spans(self, messages: list, full: str, where: str, tools, agp: bool) -> list[tuple[int, int]]:
        """Character spans of the assistant replies in the rendered (unexpanded) ``full`` text:
        each reply's text and end-of-turn token, not the newline after (as `mmpipe.Encoder`)."""
        spans = []
        for k, msg in enumerate(messages):
            if msg["role"] != "assistant":
                continue
            before = self._render(messages[:k], True, tools) if k else ""
            upto = full if (k == len(messages) - 1 and not agp) else self._render(messages[:k + 1], False, tools)
            if not (full.startswith(before) and full.startswith(upto) and upto.startswith(before)):
                raise InputError("the chat template does not render conversation prefixes as prefixes of the whole "
                                 "conversation, so assistant tokens cannot be located", where=where, stage="template",
                                 column="messages", fix="pass labels=False or a prefix-stable chat template")
            spans.append((len(before), max(len(before), len(upto.rstrip("\n ")))))
        return spans

    def _labels(self, ids: np.ndarray, offsets: np.ndarray, replies: list, images: list, at: list) -> np.ndarray:
        """int64 [L]: ids of the tokens overlapping a reply span (mapped into the expanded text),
        -100 elsewhere and on every token of an image's text."""
        token_len = len(self.family.image_token)
        grown = np.cumsum([0] + [(b - a) - token_len for a, b in images])  # text added before each placeholder

        def moved(x: int) -> int:
            return x + int(grown[int(np.searchsorted(np.asarray(at), x, side="left"))]) if at else x

        labels = np.full(len(ids), IGNORE_INDEX, np.int64)
        starts, ends = offsets[:, 0], offsets[:, 1]
        for a, b in replies:
            a, b = moved(a), moved(b)
            sel = (starts < b) & (ends > a)
            labels[sel] = ids[sel]
        for a, b in images:
            labels[(starts < b) & (ends > a)] = IGNORE_INDEX
        return labels

    def _check_length(self, ids: np.ndarray, where: str) -> None:
        check_max_length(len(ids), self.max_length, self.truncation, where, "raise max_length, use fewer images, or pass truncation='drop'")


def _collapse_exact(tokenizer, feature_id: int, tok: str, text: str) -> bool:
    """``text`` and ``tok`` alone, between varied neighbours: tokenized with each ``tok`` once,
    the feature id repeated 3 times == tokenized with each ``tok`` written 3 times."""
    sides = ["", "a", " ", "\n", "\n\n", "x \n\n", ". "]
    shorts = [left + body + right for body in (text, tok) for left in sides for right in sides[::-1]]
    one, three = (tokenizer(texts)["input_ids"] for texts in (shorts, [t.replace(tok, tok * 3) for t in shorts]))
    for t, a, b in zip(shorts, one, three):
        feature = np.asarray(a, np.int64) == feature_id
        if int(feature.sum()) != t.count(tok) or np.repeat(a, np.where(feature, 3, 1)).tolist() != list(b):
            return False
    return True
