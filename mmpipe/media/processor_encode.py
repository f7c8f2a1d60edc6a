"""The ``processor`` kind's part of `mmpipe.Encoder`: the generic path, for any transformers VLM
processor mmpipe has no family table for (or a tiled family's, asked for with
``family="generic"``).

Videos: only with their sound (``use_audio_in_video=True``, the Omni thinkers:
`mmpipe.media.processor_videos`); other video rows are refused.

raw chat row -> the processor's own chat template + processor call -> the row's fields (its
outputs, its dtypes, typed by its `mmpipe.media.processor.ProcessorLayout`; labels from the
assistant replies) -> stored row (``family="generic"``) -> `mmpipe.collate` (padding, ragged
tiles, positions where exact) -> ``model(**batch.model_inputs())``. It logs one line per processor
class. None of mmpipe's speed features apply: no compact uint8 storage, no layout-only
encoding, no packing; positions ``0..n-1`` only where the processor's model takes 1-D positions (else the
model builds its own, `mmpipe.media.processor_rope`).

Reached as ``fam.media.encode_*`` (re-exported by `mmpipe.media.processor`).
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
from PIL import Image

from mmpipe.audio import audio_extractor
from mmpipe.encoding.call_labels import call_labels
from mmpipe.encoding.options import check_choice, refusal, refuse_options
from mmpipe.encoding.parse import images_only
from mmpipe.errors import ArgumentError, ImageError, InputError, PlaceholderError
from mmpipe.families import GENERIC, resolve_family
from mmpipe.images.load import bomb_error, load_image, to_rgb_image, unreadable_error, upright
from mmpipe.records.columns import IGNORE_INDEX, to_numpy

__all__ = ["GENERIC_LOG", "LOGGED_CLASSES", "generic_log_line"]

logger = logging.getLogger("mmpipe")

GENERIC_LOG = ("mmpipe: {cls} has no model-family table; encoding through the generic path (its own chat "
               "template and processor call, float pixel values as the processor returns them). It lacks: "
               "compact uint8 storage, layout-only encoding, packing; positions 0..n-1 only where its model's rope is 1-D")
# processor outputs mmpipe makes itself (labels: the replies)
OWN_KEYS = ("input_ids", "attention_mask", "labels")
LOGGED_CLASSES: set = set()  # processor classes this process has logged the line for
# its stored pixel format: the processor's own values
ENCODE_PIXELS = ("float32",)
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
    "videos_column": "the generic path takes images, and videos only with their sound: use_audio_in_video=True "
                     "(the Omni thinkers)",
    "video_options": "the generic path takes images, and videos only with their sound: use_audio_in_video=True "
                     "(the Omni thinkers)",
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
    enc.use_audio_in_video = bool(getattr(enc, "use_audio_in_video", False))
    refused = ENCODE_REFUSED
    if enc.use_audio_in_video:  # videos with their sound (`mmpipe.media.processor_videos`)
        refused = {k: v for k, v in ENCODE_REFUSED.items() if k not in ("videos_column", "video_options")}
    refuse_options(enc, given, refused, REFUSAL)
    if enc.use_audio_in_video:
        from mmpipe.encoding.videos import video_options
        from mmpipe.media.processor_videos import check_video_options

        if audio_extractor(enc.processor) is None or getattr(enc.processor, "video_processor", None) is None:
            raise refusal(enc, REFUSAL, "use_audio_in_video=True", "it needs a processor with a video processor and an "
                          "audio feature extractor (the Omni thinkers: Qwen2.5-Omni, Qwen3-Omni)")
        if given.get("audio") == "source":
            raise refusal(enc, REFUSAL, "audio='source' with use_audio_in_video=True", "a video's sound is stored as "
                          "the processor's features; leave audio out (or pass 'features')")
        enc.video_opts = video_options(given.get("video_options"))
        check_video_options(enc.video_opts)
    if getattr(enc.processor, "chat_template", None) is None and "chat_template" not in enc.chat_template_kwargs:
        # every row (and the layout probe) renders with the processor's template: refuse at once, not
        # per row (under on_error="skip" every row would fail the same way)
        raise ArgumentError(f"processor {cls} has no chat template: the generic path renders every row with the "
                            "processor's own chat template (expected processor.chat_template, found None); set "
                            "processor.chat_template (the model's chat_template.jinja / chat_template.json), or "
                            "pass chat_template_kwargs={'chat_template': TEMPLATE}")
    if given.get("pixels", "float32") != "float32":
        raise refusal(enc, REFUSAL, f"pixels={given['pixels']!r} (compact or layout-only storage)",
                      "leave pixels out (or pass 'float32'): the processor's own pixel values are stored")
    if enc.truncation not in ("raise", "drop"):
        raise refusal(enc, REFUSAL, f"truncation={enc.truncation!r}", "use truncation='raise' or 'drop'")
    enc.audio_storage = given.get("audio", "features")
    check_choice("audio", enc.audio_storage, AUDIO_STORAGE)
    if enc.end_of_turn != "template":
        raise refusal(enc, REFUSAL, f"end_of_turn={enc.end_of_turn!r}", "its labels are the processor template's "
                      "replies as rendered; leave end_of_turn out")
    enc.pixels = "float32"
    tok = enc.tokenizer
    enc.pad_token_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
    if given.get("log") is not None:
        given["log"](generic_log_line(cls))
    elif cls not in LOGGED_CLASSES:
        LOGGED_CLASSES.add(cls)
        logger.info(generic_log_line(cls))


def encode_image(enc, value, where: str) -> tuple:
    """One image -> ((height, width) upright, the upright RGB PIL image the processor takes),
    decoded here: a truncated or corrupt file is this image's `ImageError` (located at the
    images column by the encoder), not PIL's ``OSError`` inside the processor call."""
    im = load_image(value, where=where)
    try:
        im.load()  # PIL decodes lazily: the whole file, now
        im = to_rgb_image(upright(im))
    except InputError:
        raise
    except Image.DecompressionBombError as e:
        raise bomb_error(e, where) from e
    except (OSError, ValueError, SyntaxError) as e:  # PIL: truncated data, bad chunks, unknown modes
        raise unreadable_error(e, where) from e
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


def run_processor(enc, **kwargs) -> tuple[dict, dict]:
    """The processor's call -> ({key: numpy}, {key: dtype} of its `LOW_FLOATS` outputs, now float32).
    Asked for numpy; a processor whose outputs numpy cannot hold (bf16 tensors) is asked for torch
    (at once, once its layout says so)."""
    layout = getattr(enc, "_layout", None)
    pt = layout is not None and bool(layout.dtypes)
    bos, texts = getattr(enc.tokenizer, "bos_token", None), kwargs.get("text") or []
    if bos and texts and all(isinstance(t, str) and t.startswith(bos) for t in texts):
        # the template wrote the BOS (Llama 4, Gemma 3n): not again, as the processor's own chat path calls it
        kwargs.setdefault("add_special_tokens", False)
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
    return run_processor(enc, text=[text], images=images or None, **_media_kwargs(enc, text, audios, videos))[0]


def _media_kwargs(enc, text: str, audios: Sequence, videos: tuple = ()) -> dict:
    """The call's audio keywords (`_audio_kwargs`) and, for a text holding videos with their sound,
    its video keywords (`mmpipe.media.processor_videos.video_call_kwargs`: the sound tracks join
    ``audio=`` in slot order)."""
    kw = _audio_kwargs(enc, audios)
    if videos and len(videos[0]):
        from mmpipe.media.processor_videos import video_call_kwargs

        extra = video_call_kwargs(enc, text, videos[0], videos[1], list(audios))
        if extra:
            kw.update(extra, sampling_rate=int(audio_extractor(enc.processor).sampling_rate))
    return kw


def _audio_kwargs(enc, audios: Sequence) -> dict:
    """``audio=`` (and the rate they are at: ``sampling_rate=``) for a call with clips; a processor
    without audio never sees the keywords."""
    if not len(audios):
        return {}
    return {"audio": list(audios), "sampling_rate": int(audio_extractor(enc.processor).sampling_rate)}


def user_turn(n_images: int, n_audios: int = 0) -> list:
    """A probe conversation: one user turn of ``n_audios`` audio and ``n_images`` image items and the text "a"."""
    return [{"role": "user", "content": [{"type": "audio"}] * n_audios + [{"type": "image"}] * n_images
             + [{"type": "text", "text": "a"}]}]


def audio_outputs(processor, layout, sources: list, where: str = "row") -> dict:
    """The audio outputs (`ProcessorLayout.audio`) of a row stored with ``audio="source"``: its
    clips decoded as at encode (`mmpipe.audio.load_audio`) and run through the processor's own
    call together (its padding is per call), under a text of one audio token per clip; the same
    arrays encode would have stored."""
    from mmpipe.audio import load_audio

    fe = audio_extractor(processor)
    if fe is None:
        raise ArgumentError(f"{type(processor).__name__} has no audio feature extractor: collate rows encoded with "
                            "audio='source' with the processor that encoded them")
    rate = int(fe.sampling_rate)
    waves = [load_audio(b, rate, where=f"{where}, audio {i}") for i, b in enumerate(sources)]
    token = getattr(processor, "audio_token", None) or getattr(getattr(processor, "tokenizer", None), "audio_token")
    out = processor(text=[token * len(waves)], audio=waves, sampling_rate=rate, return_tensors="np")
    return {k: np.asarray(out[k]) for k in layout.audio if k in out and np.asarray(out[k]).size}


def load_audios(enc, audios: list, where: str) -> list:
    """The row's clips -> mono float32 waveforms at the feature extractor's sampling rate
    (`mmpipe.audio.load_audio`); a clip longer than a Whisper-style extractor takes (``n_samples``)
    refused where the processor's call would cut it. A processor without a feature extractor takes no audio (`ParseError`)."""
    from mmpipe.audio import load_audio
    from mmpipe.encoding.parse import no_audio

    fe = audio_extractor(enc.processor)
    if fe is None:
        no_audio(audios, where, f"{enc.processor_class} (no audio feature extractor)")
    limit = clip_limit(enc.processor, fe)
    return [load_audio(a, int(fe.sampling_rate), where=f"{where}, audio {i}", column=enc.audios_column,
                       max_samples=limit) for i, a in enumerate(audios)]


def clip_limit(processor, fe) -> int:
    """The most samples a clip may hold where the processor's call cuts longer ones (0: no limit)."""
    # the extractor cuts at n_samples only where the processor's call truncates (Qwen2.5-Omni's does; Qwen3-Omni's
    # sets truncation=False and takes a clip whole)
    truncates = dict(getattr(processor, "audio_kwargs", None) or {}).get("truncation", True)
    return int(getattr(fe, "n_samples", 0) or 0) if truncates else 0


def load_video_sounds(enc, videos: list, where: str) -> tuple[list, list]:
    """``use_audio_in_video``: the row's videos -> (sampled frames, sound tracks at the feature
    extractor's rate) (`mmpipe.media.processor_videos.load_videos`); a sound track longer than the
    processor takes is refused as a clip is."""
    from mmpipe.media.processor_videos import load_videos

    fe = audio_extractor(enc.processor)
    return load_videos(enc, videos, int(fe.sampling_rate), where, max_samples=clip_limit(enc.processor, fe))


def probe_call(enc, images: list):
    """The processor's outputs for `user_turn` holding ``images`` (PIL)."""
    return _call(enc, plain_render(enc, user_turn(len(images)), True), images)


# what a processor's own call raises on a row it cannot take (its images are decoded and checked first):
# the row's `InputError`, not a raw error (MemoryError and interrupts pass)
_PROCESSOR_FAILURES = (ValueError, TypeError, IndexError, KeyError, ArithmeticError, OSError, RuntimeError,
                       AttributeError, AssertionError)


def encode_row(enc, messages: list, images: list, videos: list, *, where: str, tools, prefetched,
               audios: Sequence = ()) -> dict:
    """One parsed row -> the record's fields: the processor's outputs split by its layout into
    ``sequence`` (int [L]) and ``vision`` (audio clips: the feature extractor's outputs, e.g.
    ``input_features`` [A, mels, frames]); a row over ``max_length`` raises `TruncationError`
    (or is dropped)."""
    if not getattr(enc, "use_audio_in_video", False):
        images_only(videos, where, what=f"{enc.processor_class} on the generic path",
                    fix="drop the row's videos, or encode videos with their sound: mmpipe.Encoder(processor, "
                        "use_audio_in_video=True) (the Omni thinkers)" if audio_extractor(enc.processor) is not None
                    and getattr(enc.processor, "video_processor", None) is not None else None)
    waves = load_audios(enc, list(audios), where) if len(audios) else []
    moving = load_video_sounds(enc, list(videos), where) if len(videos) else ()
    pil = [im for _, im in enc.load_images(images, where, prefetched)]
    agp = enc.generation_prompt(messages)
    text = enc.prompt_text(messages, agp, tools, where)
    layout = enc.layout()
    if moving:
        from mmpipe.media.processor_videos import media_order

        n_video = media_order(enc.processor, text).count("video")
        if n_video != len(videos):
            raise PlaceholderError(f"the rendered prompt holds {n_video} video placeholder(s) but the row has "
                                   f"{len(videos)} video(s)", where=where, column="messages",
                                   expected=f"one {enc.processor.video_token} per video", found=str(n_video),
                                   fix="one video item per video; remove literal video tokens from the text")
    kwargs = _media_kwargs(enc, text, waves, moving)  # a silent video, a slot mismatch: the row's AudioError
    try:
        out, low = run_processor(enc, text=[text], images=pil or None, **kwargs)
    except _PROCESSOR_FAILURES as e:
        raise InputError(f"the processor {enc.processor_class} failed on this row ({type(e).__name__}: {e})",
                         where=where, stage="encode", column="messages",
                         fix="check the row's image items against its images and the chat template") from e
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
    ids_of = _prefix_ids
    if moving:  # a prefix holds the videos its text names (their count: the text's video placeholders)
        def ids_of(enc, text, images, audios):
            return _call(enc, text, images, audios, moving)["input_ids"][0].astype(np.int64)
    labels = call_labels(enc, messages, (pil, waves), agp, tools, ids, text, ids_of) if enc.labels else None
    trained = np.flatnonzero(labels != IGNORE_INDEX) if labels is not None else ()
    if len(trained) and "labels" in out and "token_type_ids" in sequence:
        # the processor's labels are its token type 1 (PaliGemma's suffix: causal, trained; type 0 is the
        # bidirectional prefix): the suffix runs from the first labelled token (a reply) to the end
        sequence["token_type_ids"] = sequence["token_type_ids"].copy()
        sequence["token_type_ids"][trained[0]:] = 1
    enc.check_length(len(ids), where, "raise max_length, shrink the images, or pass truncation='drop'")
    hw = np.asarray([(im.height, im.width) for im in pil], np.int64).reshape(-1, 2)
    sources = None
    if waves and enc.audio_storage == "source":  # the clips' files; collate computes their outputs again
        from mmpipe.audio import audio_source

        rate = int(audio_extractor(enc.processor).sampling_rate)
        sources = [audio_source(a, w, rate) for a, w in zip(audios, waves)]
        vision = {k: v for k, v in vision.items() if k not in layout.audio}
    return dict(input_ids=ids, attention_mask=np.ones(len(ids), np.int64), sequence=sequence, vision=vision,
                labels=labels, layout=layout, image_hw=hw, audio_sources=sources)


def _prefix_ids(enc, text: str, images: list, audios: Sequence = ()) -> np.ndarray:
    """Token ids of a rendered conversation prefix with its own images and clips."""
    return _call(enc, text, images, audios)["input_ids"][0].astype(np.int64)


def encode_empty(enc) -> dict:
    """The fields of an empty row (0 tokens): every column of the layout, empty."""
    return dict(input_ids=np.zeros(0, np.int64), attention_mask=np.zeros(0, np.int64), layout=enc.layout(),
                image_hw=np.zeros((0, 2), np.int64), labels=np.zeros(0, np.int64) if enc.labels else None)


def encode_image_bytes(enc) -> int:
    """Bytes of the processor's outputs for one large (2048x2048) image: the most one image
    takes for a processor that bounds its resize (`mmpipe.map_kwargs` sizing)."""
    if enc._image_bytes is None:
        from PIL import Image

        out = probe_call(enc, [Image.new("RGB", (2048, 2048), (120, 60, 30))])
        enc._image_bytes = int(sum(v.nbytes for k, v in out.items() if k not in ("input_ids", "attention_mask")))
    return enc._image_bytes
