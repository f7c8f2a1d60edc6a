"""The ``processor`` kind's part of `mmpipe.Encoder`: the generic path, for any transformers VLM
processor mmpipe has no family table for (or a tiled family's, asked for with
``family="generic"``).

raw chat row -> the processor's own chat template + processor call -> the row's fields (its
outputs, its dtypes, typed by its `mmpipe.media.processor.ProcessorLayout`; labels from the
assistant replies) -> stored row (``family="generic"``) -> `mmpipe.collate` (padding, ragged
tiles, 1-D positions) -> ``model(**batch.model_inputs())``. It logs one line per processor
class. None of mmpipe's speed features apply: no compact uint8 storage, no layout-only
encoding, no packing, positions ``0..n-1`` (right for 1-D rotary models; an M-RoPE model of an
unlisted family builds its own: ``model_inputs(positions="none")``).

Reached as ``fam.media.encode_*`` (re-exported by `mmpipe.media.processor`).
"""

from __future__ import annotations

import logging
from typing import Optional

import numpy as np

from mmpipe.encoding.options import refusal, refuse_options
from mmpipe.encoding.parse import images_only
from mmpipe.errors import ArgumentError, InputError
from mmpipe.families import GENERIC, resolve_family
from mmpipe.images.load import load_image, to_rgb_image, upright
from mmpipe.records.columns import IGNORE_INDEX, to_numpy

__all__ = ["GENERIC_LOG", "LOGGED_CLASSES", "generic_log_line", "probe", "suffix_cut"]

logger = logging.getLogger("mmpipe")

GENERIC_LOG = ("mmpipe: {cls} has no model-family table; encoding through the generic path (its own chat "
               "template and processor call, float pixel values as the processor returns them). It lacks: "
               "compact uint8 storage, layout-only encoding, packing; positions are 1-D (0..n-1 per row)")
# processor outputs mmpipe makes itself (labels: the replies)
_OWN = ("input_ids", "attention_mask", "labels")
LOGGED_CLASSES: set = set()  # processor classes this process has logged the line for
# its stored pixel format: the processor's own values
ENCODE_PIXELS = ("float32",)
# the options of mmpipe.Encoder (`mmpipe.encoding.encoder.KIND_OPTIONS`) that have no meaning here ->
# what to do instead, and how the kind says so (option values too)
REFUSAL = ("{what} is not available for {cls}: it has no mmpipe family table and takes the generic path "
           "({fam}: the processor's own outputs, 1-D positions); {why}")
ENCODE_REFUSED = {
    "min_pixels": "set the bounds on the processor's image processor",
    "max_pixels": "set the bounds on the processor's image processor",
    "image_backend": "the processor's own image processor is used as it is",
    "image_root": "resolve and check image paths before encoding",
    "videos_column": "the generic path takes images only",
    "video_options": "the generic path takes images only",
    "images_kwargs": "set them on the processor's image processor",
}


def generic_log_line(processor_class: str) -> str:
    """The one line logged when a processor of ``processor_class`` takes the generic path."""
    return GENERIC_LOG.format(cls=processor_class)


def encode_settings(enc, given: dict) -> None:
    """Check the options (a native patch-grid family is refused: its rows need M-RoPE
    positions), set ``pixels="float32"`` and the pad id, log the one line."""
    cls, native = enc.processor_class, resolve_family(enc.processor)
    if native is not GENERIC and native.kind != "tiles":  # a tiled family may take it explicitly
        raise ArgumentError(f"processor {cls} is mmpipe's native family {native.name!r}; "
                            "encode it with mmpipe.Encoder(processor) (the generic path gives 1-D "
                            "positions)")
    refuse_options(enc, given, ENCODE_REFUSED, REFUSAL)
    if given.get("pixels", "float32") != "float32":
        raise refusal(enc, REFUSAL, f"pixels={given['pixels']!r} (compact or layout-only storage)",
                      "leave pixels out (or pass 'float32'): the processor's own pixel values are stored")
    if enc.truncation not in ("raise", "drop"):
        raise refusal(enc, REFUSAL, f"truncation={enc.truncation!r}", "use truncation='raise' or 'drop'")
    enc.pixels = "float32"
    tok = enc.tokenizer
    enc.pad_token_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
    if given.get("log") is not None:
        given["log"](generic_log_line(cls))
    elif cls not in LOGGED_CLASSES:
        LOGGED_CLASSES.add(cls)
        logger.info(generic_log_line(cls))


def encode_image(enc, value, where: str) -> tuple:
    """One image -> ((height, width) upright, the upright RGB PIL image the processor takes)."""
    im = to_rgb_image(upright(load_image(value, where=where)))
    return (im.height, im.width), im


def _plain(enc, messages: list, agp: bool) -> str:
    """The processor's template without tools (the layout probes)."""
    return enc.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp,
                                             **enc.chat_template_kwargs)


def _call(enc, text: str, images: list):
    return enc.processor(text=[text], images=images or None, return_tensors="np")


def _user_turn(n_images: int) -> list:
    """A probe conversation: one user turn of ``n_images`` image items and the text "a"."""
    return [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": "a"}]}]


def _probe_call(enc, images: list):
    """The processor's outputs for `_user_turn` holding ``images`` (PIL)."""
    return _call(enc, _plain(enc, _user_turn(len(images)), True), images)


def encode_row(enc, messages: list, images: list, videos: list, *, where: str, tools, prefetched) -> dict:
    """One parsed row -> the record's fields: the processor's outputs split by its layout into
    ``sequence`` (int [L]) and ``vision``; a row over ``max_length`` raises `TruncationError`
    (or is dropped)."""
    images_only(videos, where)
    pil = [im for _, im in enc.load_images(images, where, prefetched)]
    agp = enc.generation_prompt(messages)
    text = enc.prompt_text(messages, agp, tools, where)
    try:
        out = _call(enc, text, pil)
    except (ValueError, TypeError, IndexError, KeyError) as e:
        raise InputError(f"the processor {enc.processor_class} failed on this row ({type(e).__name__}: {e})",
                         where=where, stage="encode", column="messages",
                         fix="check the row's image items against its images and the chat template") from e
    ids = to_numpy(out["input_ids"])[0].astype(np.int64)
    layout = enc.layout()
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
            known = sorted(vision_keys | set(layout.sequence))
            raise InputError(f"the processor returned {k!r}, which its probe did not show", where=where,
                             stage="encode", column=k, expected=f"one of {known}", found=k,
                             fix="report the processor class; encode with labels and options unchanged")
    for k in layout.sequence:
        sequence.setdefault(k, np.zeros(len(ids), np.int64))
    labels = _labels(enc, messages, pil, agp, tools, ids, text) if enc.labels else None
    trained = np.flatnonzero(labels != IGNORE_INDEX) if labels is not None else ()
    if len(trained) and "labels" in out and "token_type_ids" in sequence:
        # the processor's labels are its token type 1 (PaliGemma's suffix: causal, trained; type 0 is the
        # bidirectional prefix): the suffix runs from the first labelled token (a reply) to the end
        sequence["token_type_ids"] = sequence["token_type_ids"].copy()
        sequence["token_type_ids"][trained[0]:] = 1
    enc.check_length(len(ids), where, "raise max_length, shrink the images, or pass truncation='drop'")
    hw = np.asarray([(im.height, im.width) for im in pil], np.int64).reshape(-1, 2)
    return dict(input_ids=ids, attention_mask=np.ones(len(ids), np.int64), sequence=sequence, vision=vision,
                labels=labels, layout=layout, image_hw=hw)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def _labels(enc, messages: list, images: list, agp: bool, tools, ids: np.ndarray, full: str) -> np.ndarray:
    """int64 [L]: the ids where a token overlaps an assistant reply (its text and end-of-turn
    token, not the newline after), -100 elsewhere. Each reply's start and end: the text
    after it tokenized alone, when the row's ids end with those tokens and it holds no
    image (no processor call); else the processor run on the conversation up to there
    (its images included: image tokens count), a token merged across the edge labelled."""
    labels = np.full(len(ids), IGNORE_INDEX, np.int64)
    n_images = [sum(1 for c in m["content"] if isinstance(c, dict) and c.get("type") == "image")
                if isinstance(m.get("content"), list) else 0 for m in messages]
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        text_after = not any(n_images[k:])  # no image at or after this reply: tokenize the rest alone
        before = enc.render(messages[:k], True, tools) if k else ""
        start = suffix_cut(enc, ids, full, before) if text_after else None
        if start is None:
            start = _common_prefix(_prefix_ids(enc, before, images[:sum(n_images[:k])]), ids) if k else 0
        upto = enc.render(messages[: k + 1], False, tools).rstrip("\n ")
        end = suffix_cut(enc, ids, full, upto) if text_after else None
        if end is None:
            upto_ids = _prefix_ids(enc, upto, images[:sum(n_images[: k + 1])])
            shared = _common_prefix(upto_ids, ids)
            end = shared + (1 if shared < len(upto_ids) else 0)  # a last token merged with what follows
        labels[start:end] = ids[start:end]
    return labels


def suffix_cut(enc, ids: np.ndarray, full: str, prefix: str) -> Optional[int]:
    """Where ``prefix`` ends in ``ids`` (the tokens of ``full``): ``len(ids)`` minus the
    tokens of ``full[len(prefix):]`` tokenized alone, when ``ids`` ends with them; else None."""
    if not full.startswith(prefix):
        return None
    rest = full[len(prefix):]
    if not rest:
        return len(ids)
    rest_ids = np.asarray(enc.tokenizer(rest, add_special_tokens=False)["input_ids"], np.int64)
    n = len(rest_ids)
    return len(ids) - n if n <= len(ids) and np.array_equal(ids[len(ids) - n:], rest_ids) else None


def _prefix_ids(enc, text: str, images: list) -> np.ndarray:
    """Token ids of a rendered conversation prefix with its own images."""
    return to_numpy(_call(enc, text, images)["input_ids"])[0].astype(np.int64)


def probe(enc) -> tuple:
    """The processor's outputs, found by two probes: a text-only row and one row holding two
    small images -> (sequence keys, vision keys as (name, dtype, ndim), row keys, pads). Row
    keys: axis 0 of length 1 for the row (not a sequence); sequence keys: ``[1, L]``; the other
    outputs are vision keys (axis 0: images/patches)."""
    from PIL import Image

    im = Image.new("RGB", (64, 64), (120, 60, 30))
    out = _probe_call(enc, [im, im])
    try:
        text_only = _probe_call(enc, [])
    except (ValueError, TypeError, IndexError, KeyError):  # PaliGemma takes no row without an image
        text_only = {}
    seq = len(to_numpy(out["input_ids"])[0])
    arrays = {k: np.asarray(to_numpy(v)) for k, v in out.items() if k not in _OWN}
    sequence = {k for k, v in arrays.items() if v.shape == (1, seq)}
    sequence |= {k for k, v in text_only.items() if k not in _OWN
                 and np.shape(v) == np.shape(text_only["input_ids"])}
    row_keys = sorted(k for k, v in arrays.items() if k not in sequence and v.ndim >= 1 and v.shape[0] == 1)
    vision = tuple((k, str(v.dtype), v.ndim) for k, v in sorted(arrays.items()) if k not in sequence)
    return tuple(sorted(sequence)), vision, tuple(row_keys), _pads(enc, row_keys, im)


def _pads(enc, row_keys: list, im) -> tuple:
    """Row keys whose missing items the processor pads with other values than 0 (Mllama's
    ``aspect_ratio_mask``: first tile 1): its batch of a 1-image and a 2-image row, the
    first row's slot 1 (axis 1; token-aligned keys skipped). () where the batch call fails."""
    try:
        out = enc.processor(text=[_plain(enc, _user_turn(n), True) for n in (1, 2)],
                            images=[[im], [im, im]], padding=True, return_tensors="np")
    except (ValueError, TypeError, IndexError, KeyError):
        return ()
    L = np.shape(out["input_ids"])[1]
    slots = {k: np.asarray(to_numpy(out[k]))[0, 1] for k in row_keys
             if k in out and np.ndim(out[k]) >= 3 and np.shape(out[k])[1] == 2 != L}
    return tuple((k, tuple(v.reshape(-1).tolist())) for k, v in sorted(slots.items()) if v.any())


def encode_empty(enc) -> dict:
    """The fields of an empty row (0 tokens): every column of the layout, empty."""
    return dict(input_ids=np.zeros(0, np.int64), attention_mask=np.zeros(0, np.int64), layout=enc.layout(),
                image_hw=np.zeros((0, 2), np.int64), labels=np.zeros(0, np.int64) if enc.labels else None)


def encode_image_bytes(enc) -> int:
    """Bytes of the processor's outputs for one large (2048x2048) image: the most one image
    takes for a processor that bounds its resize (`mmpipe.map_kwargs` sizing)."""
    if enc._image_bytes is None:
        from PIL import Image

        out = _probe_call(enc, [Image.new("RGB", (2048, 2048), (120, 60, 30))])
        enc._image_bytes = int(sum(np.asarray(to_numpy(v)).nbytes for k, v in out.items()
                                   if k not in ("input_ids", "attention_mask")))
    return enc._image_bytes
