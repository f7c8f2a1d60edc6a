"""The ``processor`` kind's part of `mmpipe.Encoder`: the generic path, for any transformers VLM
processor mmpipe has no family table for (or a tiled family's, asked for with
``family="generic"``).

Videos: only with their sound (``use_audio_in_video=True``, the Omni thinkers:
`mmpipe.encoding.video_sound`); other video rows are refused. Audio clips: `mmpipe.audio.clips`.

raw chat row -> the processor's own chat template + processor call -> the row's fields (its
outputs, its dtypes, typed by its `mmpipe.media.processor.ProcessorLayout`; labels from the
assistant replies) -> stored row (``family="generic"``) -> `mmpipe.collate` (padding, ragged
tiles, positions where exact) -> ``model(**batch.model_inputs())``. It logs one line per processor
class. None of mmpipe's speed features apply: no compact uint8 storage, no layout-only
encoding, no packing; positions ``0..n-1`` only where the processor's model takes 1-D positions (else the
model builds its own, `mmpipe.model_rope`).

Reached as ``fam.media.encode_*`` (one of the kind's modules, `mmpipe.media.KINDS`).
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Optional, Sequence

import numpy as np

from mmpipe._fork import SharedCalls, torch_fork_safe
from mmpipe.audio import audio_extractor
from mmpipe.audio.clips import clip_files, load_clips
from mmpipe.encoding.call_labels import call_labels
from mmpipe.encoding.options import check_choice, kind_options, refusal
from mmpipe.encoding.parse import images_only
from mmpipe.encoding.video_sound import (
    call_media_kwargs, check_video_placeholders, load_video_sounds, video_sound_settings,
)
from mmpipe.errors import ArgumentError, ImageError, InputError
from mmpipe.families import GENERIC, resolve_family
from mmpipe.images.load import decoded_rgb
from mmpipe.records.columns import IGNORE_INDEX, to_numpy

__all__ = ["GENERIC_LOG", "LOGGED_CLASSES", "generic_log_line"]

logger = logging.getLogger("mmpipe")

GENERIC_LOG = ("mmpipe: {cls} has no model-family table; encoding through the generic path (its own chat "
               "template and processor call, float pixel values as the processor returns them). It lacks: "
               "compact uint8 storage, layout-only encoding, packing; positions 0..n-1 only where its model's rope is 1-D")
# processor outputs mmpipe makes itself (labels: the replies)
OWN_KEYS = ("input_ids", "attention_mask", "labels")
LOGGED_CLASSES: set = set()  # processor classes this process has logged the line for
# its stored pixel format (the processor's own values) and truncation policies, and why only those
# (`mmpipe.encoding.options.kind_options`)
ENCODE_PIXELS, TRUNCATIONS = ("float32",), ("raise", "drop")
CHOICE_NOTES = {"pixels": "the processor's own pixel values are stored: no compact or layout-only storage",
                "truncation": "a cut row would cut the processor's outputs"}
# how audio clips are stored: the processor's outputs, or each clip's file (the outputs computed at collate)
AUDIO_STORAGE = ("features", "source")
# the options of mmpipe.Encoder (`mmpipe.encoding.encoder.KIND_OPTIONS`) that have no meaning here ->
# what to do instead, and how the kind says so (option values too)
REFUSAL = ("{what} is not available for {cls}: it has no mmpipe family table and takes the generic path "
           "({fam}: the processor's own outputs, positions only where exact); {why}")
ENCODE_REFUSED = {
    "min_pixels": "set the bounds on the processor's image processor",
    "max_pixels": "set the bounds on the processor's image processor",
    "image_backend": "the processor's own image processor is used as it is",
    "image_root": "resolve and check image paths before encoding",
    "images_kwargs": "set them on the processor's image processor",
    **dict.fromkeys(("videos_column", "video_options"), "the generic path takes images, and videos only with their "
                    "sound: use_audio_in_video=True (the Omni thinkers)"),
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
    enc.use_audio_in_video = bool(getattr(enc, "use_audio_in_video", False))
    refused = ENCODE_REFUSED
    if enc.use_audio_in_video:  # videos with their sound (`mmpipe.encoding.video_sound`)
        refused = {k: v for k, v in ENCODE_REFUSED.items() if k not in ("videos_column", "video_options")}
    kind_options(enc, given, refused)
    if enc.use_audio_in_video:
        video_sound_settings(enc, given, REFUSAL)
    if getattr(enc.processor, "chat_template", None) is None and "chat_template" not in enc.chat_template_kwargs:
        # every row (and the layout probe) renders with the processor's template: refuse at once, not
        # per row (under on_error="skip" every row would fail the same way)
        raise ArgumentError(f"processor {cls} has no chat template: the generic path renders every row with the "
                            "processor's own chat template (expected processor.chat_template, found None); set "
                            "processor.chat_template (the model's chat_template.jinja / chat_template.json), or "
                            "pass chat_template_kwargs={'chat_template': TEMPLATE}")
    enc.audio_storage = given.get("audio", "features")
    check_choice("audio", enc.audio_storage, AUDIO_STORAGE)
    if enc.end_of_turn != "template":
        raise refusal(enc, REFUSAL, f"end_of_turn={enc.end_of_turn!r}", "its labels are the processor template's "
                      "replies as rendered; leave end_of_turn out")
    tok = enc.tokenizer
    enc.pad_token_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
    if given.get("log") is not None:
        given["log"](generic_log_line(cls))
    elif cls not in LOGGED_CLASSES:
        LOGGED_CLASSES.add(cls)
        logger.info(generic_log_line(cls))


def encode_image(enc, value, where: str) -> tuple:
    """One image -> ((height, width) upright, the upright RGB PIL image the processor takes),
    decoded here (`decoded_rgb`: a truncated or corrupt file is this image's `ImageError`, located
    at the images column by the encoder, not PIL's ``OSError`` inside the processor call)."""
    im = decoded_rgb(value, where=where)
    if min(im.height, im.width) <= 0:  # image processors divide by a side (ZeroDivisionError)
        raise ImageError(f"image has size {im.height}x{im.width}; an image needs at least one pixel each way",
                         where=where, expected="height >= 1 and width >= 1", found=f"{im.height}x{im.width}",
                         fix="drop the row or replace the empty image")
    return (im.height, im.width), im


def plain_render(enc, messages: list, agp: bool) -> str:
    """The processor's template without tools (the layout probes)."""
    return enc.processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=agp,
                                             **enc.chat_template_kwargs)


# float dtypes numpy lacks or mmpipe does not store as they are (Llama 4's bf16 pixels): stored float32
# (exact), handed to the model in the processor's dtype (`ProcessorLayout.dtypes`)
LOW_FLOATS = ("bfloat16", "float16")
_CALLS = SharedCalls()  # every generic-path processor call (`run_processor`)


def run_processor(enc, **kwargs) -> tuple[dict, dict]:
    """The processor's call -> ({key: numpy}, {key: dtype} of its `LOW_FLOATS` outputs, now float32).
    Asked for numpy; a processor whose outputs numpy cannot hold (bf16 tensors) is asked for torch
    (at once, once its layout says so). In a forked worker torch runs on one thread first: the
    processor's own torch ops (Whisper's STFT, a torch image processor; the layout probe's call
    included) deadlock there once the parent has run a parallel torch op (`torch_fork_safe`)."""
    torch_fork_safe()
    layout = getattr(enc, "_layout", None)
    pt = layout is not None and bool(layout.dtypes)
    bos, texts = getattr(enc.tokenizer, "bos_token", None), kwargs.get("text") or []
    if bos and texts and all(isinstance(t, str) and t.startswith(bos) for t in texts):
        # the template wrote the BOS (Llama 4, Gemma 3n): not again, as the processor's own chat path calls it
        kwargs.setdefault("add_special_tokens", False)
    # padding=True (the layout probe's) sets the tokenizer's padding, which a plain call by any other
    # encoder's thread resets mid-call (a ragged batch): such calls run alone
    with _CALLS.exclusive() if kwargs.get("padding") else _CALLS.shared():
        try:
            out = enc.processor(**kwargs, return_tensors="pt" if pt else "np")
        except ValueError as e:  # transformers 5: "Unable to convert output 'k'", 4.x: "Unable to create tensor"
            if pt or not str(e).startswith(("Unable to convert output", "Unable to create tensor")):
                raise
            out = enc.processor(**kwargs, return_tensors="pt")
    arrays, low = {}, {}
    for k, v in out.items():
        dtype = str(getattr(v, "dtype", "")).replace("torch.", "")
        if dtype in LOW_FLOATS:
            low[k] = dtype
            v = v.float() if hasattr(v, "float") else np.asarray(v, np.float32)
        arrays[k] = np.asarray(to_numpy(v))
    return arrays, low


def _call(enc, text: str, images: list, audios: Sequence = (), videos: tuple = ()) -> dict:
    """The processor's outputs (numpy) for one row; ``videos``: (the row's sampled frames, their
    sound tracks) with ``use_audio_in_video``, the first of them that ``text`` holds given."""
    return run_processor(enc, text=[text], images=images or None, **call_media_kwargs(enc, text, audios, videos))[0]


def user_turn(n_images: int, n_audios: int = 0) -> list:
    """A probe conversation: one user turn of ``n_audios`` audio and ``n_images`` image items and the text "a"."""
    return [{"role": "user", "content": [{"type": "audio"}] * n_audios + [{"type": "image"}] * n_images
             + [{"type": "text", "text": "a"}]}]


def load_audios(enc, audios: list, where: str) -> list:
    """The row's clips (`mmpipe.audio.clips.load_clips`); a processor without a feature extractor
    takes no audio (`ParseError`)."""
    from mmpipe.encoding.parse import no_audio

    if audio_extractor(enc.processor) is None:
        no_audio(audios, where, f"{enc.processor_class} (no audio feature extractor)")
    return load_clips(enc.processor, audios, where, column=enc.audios_column)


def probe_call(enc, images: list):
    """The processor's outputs for `user_turn` holding ``images`` (PIL)."""
    return _call(enc, plain_render(enc, user_turn(len(images)), True), images)


# what a processor's own call raises on a row it cannot take (its images are decoded and checked first):
# the row's `InputError`, not a raw error (MemoryError and interrupts pass)
_PROCESSOR_FAILURES = (ValueError, TypeError, IndexError, KeyError, ArithmeticError, OSError, RuntimeError,
                       AttributeError, AssertionError)


# per Encoder: whether its processor fails on the text-only probe, probed once (`_text_only_fails`). Kept
# here, not on the Encoder: a new attribute would change its pickled state (the map's cache fingerprint)
_TEXT_ONLY_FAILS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _text_only_fails(enc) -> bool:
    """Whether the processor fails on the smallest text-only conversation (`probe_call` with no
    image); one processor call per Encoder, however many rows fail."""
    fails = _TEXT_ONLY_FAILS.get(enc)
    if fails is None:
        try:
            probe_call(enc, [])
            fails = False
        except _PROCESSOR_FAILURES:
            fails = True
        _TEXT_ONLY_FAILS[enc] = fails
    return fails


def default_dtype_failure(e: Exception) -> Optional[str]:
    """torch's default dtype (e.g. ``"torch.float64"``) when the processor's failure ``e`` is a
    RuntimeError raised while it is not float32 (Qwen2.5-Omni's feature extractor under
    ``torch.set_default_dtype(torch.float64)``: "expected scalar type Double but found Float"); else None."""
    if not isinstance(e, RuntimeError):
        return None
    import torch

    default = torch.get_default_dtype()
    return None if default == torch.float32 else str(default)


def _failure(enc, e: Exception, where: str, has_images: bool, has_audios: bool = False) -> InputError:
    """The row's `InputError` for the processor's failure ``e`` (its message kept). One raised in a
    torch default dtype other than float32 names it (`default_dtype_failure`). A row without
    images whose failure the processor repeats on the smallest text-only conversation
    (`_text_only_fails`, probed once per Encoder) is refused for having none (PaliGemma on
    transformers 4.x: "`images` are expected"): the fix says so, not to check image items the row
    does not have."""
    what = f"the processor {enc.processor_class} failed on this row ({type(e).__name__}: {e})"
    dtype = default_dtype_failure(e)
    if dtype is not None:
        return InputError(f"{what}, while torch's default dtype is {dtype} (torch.set_default_dtype): the "
                          "processor's torch ops (an audio feature extractor's) fail in that default dtype",
                          where=where, stage="encode", column="audios" if has_audios else "messages",
                          expected="torch's default dtype torch.float32", found=dtype,
                          fix="encode with the default dtype torch.float32 (set another one after encoding, or "
                              "only around the model code)")
    if not has_images and _text_only_fails(enc):
        return InputError(f"{what}; it fails on every row without images (a text-only probe too): it needs at "
                          "least one image per row", where=where, stage="encode", column="images",
                          expected="at least one image (an image item in the messages and its image)",
                          found="no image",
                          fix="give every row an image, or filter the text-only rows out before encoding "
                              "(ds.filter(lambda r: len(r['images']) > 0)); on_error='skip' drops them")
    return InputError(what, where=where, stage="encode", column="messages",
                      expected="a row the processor accepts", found=f"{type(e).__name__}: {str(e):.80}",
                      fix="check the row's image items against its images and the chat template")


def encode_row(enc, messages: list, images: list, videos: list, *, where: str, tools, prefetched,
               audios: Sequence = ()) -> dict:
    """One parsed row -> the record's fields: the processor's outputs split by its layout into
    ``sequence`` (int [L]) and ``vision`` (audio clips: the feature extractor's outputs, e.g.
    ``input_features`` [A, mels, frames]); a row over ``max_length`` raises `TruncationError`
    (or is dropped)."""
    if not getattr(enc, "use_audio_in_video", False):
        images_only(videos, where, what=f"{enc.processor_class} on the generic path",
                    fix="drop the row's videos (the generic path takes a video only with its sound, for the Omni "
                        "thinkers: mmpipe.Encoder(processor, use_audio_in_video=True))"
                    if audio_extractor(enc.processor) is not None
                    and getattr(enc.processor, "video_processor", None) is not None else None)
    waves = load_audios(enc, list(audios), where) if len(audios) else []
    moving = load_video_sounds(enc, list(videos), where) if len(videos) else ()
    pil = [im for _, im in enc.load_images(images, where, prefetched)]
    agp = enc.generation_prompt(messages)
    text = enc.prompt_text(messages, agp, tools, where)
    layout = enc.layout()
    if moving:
        check_video_placeholders(enc, text, len(videos), where)
    kwargs = call_media_kwargs(enc, text, waves, moving)  # a silent video, a slot mismatch: the row's AudioError
    try:
        out, low = run_processor(enc, text=[text], images=pil or None, **kwargs)
    except _PROCESSOR_FAILURES as e:
        raise _failure(enc, e, where, bool(pil), bool(waves)) from e
    ids = out["input_ids"][0].astype(np.int64)
    sequence, vision = {}, {}
    vision_keys = {name for name, _, _ in layout.vision}
    unrecorded = sorted(set(low.items()) - set(layout.dtypes))
    if unrecorded:
        raise InputError(f"the processor returned {unrecorded[0][0]!r} in {unrecorded[0][1]}, which its probe did not "
                         "show", where=where, stage="encode", column=unrecorded[0][0],
                         expected=f"the probe's dtypes {dict(layout.dtypes)}", found=unrecorded[0][1],
                         fix="report the processor class; encode with labels and options unchanged")
    for k, v in out.items():
        if k in OWN_KEYS:
            continue
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
    # a prefix holds the videos its text names (their count: the text's video placeholders)
    ids_of = functools.partial(_prefix_ids, videos=moving)
    labels = call_labels(enc, messages, (pil, waves), agp, tools, ids, text, ids_of,
                         None if moving else _segment_ids) if enc.labels else None
    trained = np.flatnonzero(labels != IGNORE_INDEX) if labels is not None else ()
    if len(trained) and "labels" in out and "token_type_ids" in sequence:
        # the processor's labels are its token type 1 (PaliGemma's suffix: causal, trained; type 0 is the
        # bidirectional prefix): the suffix runs from the first labelled token (a reply) to the end
        sequence["token_type_ids"] = sequence["token_type_ids"].copy()
        sequence["token_type_ids"][trained[0]:] = 1
    enc.check_length(len(ids), where, "raise max_length, shrink the images, or pass truncation='drop'")
    hw = np.asarray([(im.height, im.width) for im in pil], np.int64).reshape(-1, 2)
    sources = _no_clips(enc)
    if waves and enc.audio_storage == "source":  # the clips' files; collate computes their outputs again
        sources = clip_files(enc.processor, audios, waves)
        vision = {k: v for k, v in vision.items() if k not in layout.audio}
    return dict(input_ids=ids, attention_mask=np.ones(len(ids), np.int64), sequence=sequence, vision=vision,
                labels=labels, layout=layout, image_hw=hw, audio_sources=sources)


def _prefix_ids(enc, text: str, images: list, audios: Sequence = (), videos: tuple = ()) -> np.ndarray:
    """Token ids of a rendered conversation prefix with its own images and clips (and ``videos``, `_call`)."""
    return _call(enc, text, images, audios, videos)["input_ids"][0].astype(np.int64)


def _segment_ids(enc, text: str, images: list, audios: Sequence = ()) -> Optional[np.ndarray]:
    """Token ids of a piece of a rendered conversation with its own images and clips, no special
    tokens added (a reply's edge found from the next one's, `mmpipe.encoding.call_labels.tail_cuts`);
    None where the processor refuses the piece."""
    try:
        out, _ = run_processor(enc, text=[text], images=images or None, add_special_tokens=False,
                               **call_media_kwargs(enc, text, audios))
    except _PROCESSOR_FAILURES:
        return None
    return out["input_ids"][0].astype(np.int64)


def _no_clips(enc):
    """``audio_sources`` of a row without clips: [] with ``audio="source"`` (every row then stores the
    column: ``datasets`` takes a map's columns from its first rows, and a row without it would drop
    every later row's clips), else None."""
    return [] if enc.audio_storage == "source" else None


def encode_empty(enc) -> dict:
    """The fields of an empty row (0 tokens): every column of the layout, empty."""
    return dict(input_ids=np.zeros(0, np.int64), attention_mask=np.zeros(0, np.int64), layout=enc.layout(),
                image_hw=np.zeros((0, 2), np.int64), labels=np.zeros(0, np.int64) if enc.labels else None,
                audio_sources=_no_clips(enc))


def encode_image_bytes(enc) -> int:
    """Bytes of the processor's outputs for one large (2048x2048) image: the most one image
    takes for a processor that bounds its resize (`mmpipe.map_kwargs` sizing)."""
    if enc._image_bytes is None:
        from PIL import Image

        out = probe_call(enc, [Image.new("RGB", (2048, 2048), (120, 60, 30))])
        enc._image_bytes = int(sum(v.nbytes for k, v in out.items() if k not in ("input_ids", "attention_mask")))
    return enc._image_bytes
