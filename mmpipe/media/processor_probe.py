"""The generic path's probe (`mmpipe.media.processor_encode`): what a processor returns, found once
per encoder by calling it on tiny probe conversations and images - its sequence keys, vision keys,
row keys, joined keys, its fill of missing items and its low-precision outputs, typed as
`mmpipe.records.processor_layout.ProcessorLayout` (``encode_layout``, asked by the encoder as
``fam.media.encode_layout``)."""

from __future__ import annotations

import numpy as np

from mmpipe.audio import audio_extractor
from mmpipe.errors import ArgumentError
from mmpipe.images.settings import image_settings
from mmpipe.media.processor_encode import OWN_KEYS, plain_render, probe_call, run_processor, user_turn
from mmpipe.records.processor_layout import ProcessorLayout


def encode_layout(enc) -> ProcessorLayout:
    """The processor's outputs, found once per encoder by probes: a text-only row, one row holding
    two small images, one holding one, the processor's batch of the last two, one holding an elongated
    and a large image (`_other_images_probe`: keys only some images give), and (a processor
    with a feature extractor) one row holding two clips (`_audio_probe`) -> its `ProcessorLayout`:
    sequence keys, vision keys as (name, stored dtype, ndim), row keys, pads, joins, dtypes, the
    audio keys and the masks a one-clip call leaves out, and its image processor's settings
    (`image_settings`). Row keys: axis 0 of length 1 for the row (not a
    sequence), padded into ``[B, ...]``; joins: keys the batch call joins into ONE array along an
    axis > 0 (axis 0 stays 1); sequence keys: ``[1, L]``; the other outputs are vision keys
    (axis 0: images/patches), concatenated over the rows."""
    from PIL import Image

    im = Image.new("RGB", (64, 64), (120, 60, 30))
    text, out, low = _images_probe(enc, im)
    try:
        text_only = probe_call(enc, [])
    except (ValueError, TypeError, IndexError, KeyError):  # PaliGemma takes no row without an image
        text_only = {}
    seq = len(out["input_ids"][0])
    arrays = {k: v for k, v in out.items() if k not in OWN_KEYS}
    sequence = {k for k, v in arrays.items() if v.shape == (1, seq)}
    sequence |= {k for k, v in text_only.items() if k not in OWN_KEYS and v.shape == text_only["input_ids"].shape}
    _add_keys(_other_images_probe(enc, text), arrays, sequence)  # outputs only some images give (Step-3.7's local crops)
    audio, audio_low, single_masks = _audio_probe(enc)
    sequence |= {k for k, v in audio.items() if k not in OWN_KEYS and v.shape == audio["input_ids"].shape}
    audio_keys = tuple(sorted(k for k in audio if k not in OWN_KEYS and k not in sequence and k not in arrays))
    arrays.update({k: audio[k] for k in audio_keys})
    low = {**audio_low, **low}
    if getattr(enc, "use_audio_in_video", False):  # the video keys of videos with their sound
        video, video_low = _video_probe(enc)
        _add_keys(video, arrays, sequence)
        low = {**video_low, **low}
    row_keys = sorted(k for k, v in arrays.items() if k not in sequence and v.ndim >= 1 and v.shape[0] == 1)
    pads, joins = _batch_rules(enc, row_keys, im, out)
    row_keys = [k for k in row_keys if k not in dict(joins)]
    vision = tuple((k, str(v.dtype), v.ndim) for k, v in sorted(arrays.items()) if k not in sequence)
    dtypes = tuple(sorted((k, d) for k, d in low.items() if k not in OWN_KEYS))
    return ProcessorLayout(enc.processor_class, tuple(sorted(sequence)), vision, tuple(row_keys), pads, joins, dtypes,
                           settings=image_settings(enc.processor), single_masks=single_masks, audio=audio_keys)


def _images_probe(enc, im) -> tuple[str, dict, dict]:
    """One user turn of two images ``im`` rendered by the processor's template, and `run_processor` on it
    -> (the text, the outputs, their low-precision dtypes); a template that writes no image placeholder for
    them, or a call that fails, is an `ArgumentError`."""
    text, token = plain_render(enc, user_turn(2), True), _image_token(enc)
    if text == plain_render(enc, user_turn(0), True):
        raise _template_drops_images(enc, text, "the text is the same as with no image items")
    try:
        out, low = run_processor(enc, text=[text], images=[im, im])
    except (ValueError, TypeError, IndexError, KeyError) as e:
        if token and text.count(token) == 2:  # the placeholders are there: another cause
            raise ArgumentError(f"processor {enc.processor_class} failed on mmpipe's layout probe (one user turn of two "
                                f"64x64 images, rendered by its chat template): {type(e).__name__}: {e}; check that "
                                "the processor takes such a call (processor(text=[text], images=[image, image]))") from e
        raise _template_drops_images(enc, text, f"the processor's call failed: {type(e).__name__}: {e}") from e
    token_id = _image_token_id(enc)
    if token_id is not None and text.count(token) < 2 and not (np.asarray(out["input_ids"]) == token_id).any():
        # a call that does not count placeholders against images (transformers 4.57's LlavaProcessor)
        raise _template_drops_images(enc, text, "the processor's ids hold no image token for them")
    return text, out, low


def _image_token_id(enc):
    """The id of the processor's image placeholder in its tokenizer, or None (no token / not a single id)."""
    token = _image_token(enc)
    tid = getattr(enc.processor, "image_token_id", None)
    if not isinstance(tid, int) and token is not None:
        tid = enc.tokenizer.convert_tokens_to_ids(token)
    unk = getattr(enc.tokenizer, "unk_token_id", None)
    return tid if isinstance(tid, int) and tid != unk else None


def _add_keys(probe: dict, arrays: dict, sequence: set) -> None:
    """A probe's outputs that ``arrays`` lacks, added to it (and to ``sequence`` those shaped as its ids)."""
    for k, v in probe.items():
        if k not in OWN_KEYS and k not in arrays:
            arrays[k] = v
            if v.shape == probe["input_ids"].shape:
                sequence.add(k)


def _image_token(enc):
    """The processor's image placeholder (``processor.image_token``), or None where it names none."""
    token = getattr(enc.processor, "image_token", None)
    return token if isinstance(token, str) and token else None


def _template_drops_images(enc, text: str, what: str) -> ArgumentError:
    """The processor's chat template does not write its image placeholder for image items (e.g. a
    checkpoint template that renders media as a text reminder): every row's images would miss the
    model, so the encoder refuses at its first row. ``text``: the probe turn of two images, rendered."""
    token = _image_token(enc)
    found = f"{text.count(token)} x {token!r}" if token else "no placeholder the call takes"
    shown = text if len(text) <= 240 else text[:240] + "..."
    return ArgumentError(
        f"processor {enc.processor_class}: its chat template does not write an image placeholder per image item "
        f"({what}); expected 2 placeholders{f' ({token!r})' if token else ''} in a user "
        f"turn of 2 {{'type': 'image'}} items, found {found} in {shown!r}. The rows' images would never reach the "
        "model: set a chat template that writes the processor's image placeholder for each image item "
        "(processor.chat_template = TEMPLATE, or chat_template_kwargs={'chat_template': TEMPLATE})")


def _other_images_probe(enc, text: str) -> dict:
    """The processor's outputs for one user turn holding an elongated (48x160) and a large (2048x512)
    image (``text``: that turn rendered): keys a processor returns only for some images (Step-3.7's
    ``pixel_values_local``, the local crops of elongated or large images; the 64x64 probes give none);
    {} where the call fails."""
    from PIL import Image

    images = [Image.new("RGB", (160, 48), (30, 60, 120)), Image.new("RGB", (2048, 512), (120, 60, 30))]
    try:
        return run_processor(enc, text=[text], images=images)[0]
    except (ValueError, TypeError, IndexError, KeyError):
        return {}


def _audio_probe(enc) -> tuple[dict, dict, tuple]:
    """The processor's outputs for one user turn holding two short clips (0.5 s and 1 s of a tone,
    at the feature extractor's rate): the audio keys (axis 0: the clips, e.g. ``input_features``
    [2, mels, frames]); then the masks a call with ONE clip leaves out (Phi-4-multimodal's
    ``audio_attention_mask``), each with the feature key whose leading axes it covers ->
    (outputs, their low-precision dtypes, single masks); ({}, {}, ()) for a processor without audio."""
    fe = audio_extractor(enc.processor)
    if fe is None:
        return {}, {}, ()
    rate = int(fe.sampling_rate)
    t = np.arange(rate, dtype=np.float32) / rate
    clips = [0.1 * np.sin(2 * np.pi * 440 * t[: rate // 2]), 0.1 * np.sin(2 * np.pi * 220 * t)]
    try:
        two, low = run_processor(enc, text=[plain_render(enc, user_turn(0, 2), True)], audio=clips, sampling_rate=rate)
        one, _ = run_processor(enc, text=[plain_render(enc, user_turn(0, 1), True)], audio=clips[1:], sampling_rate=rate)
    except (ValueError, TypeError, IndexError, KeyError, RuntimeError):  # a template or call without audio (or one
        return {}, {}, ()  # failing in torch's default dtype: an audio row's own call says so, `default_dtype_failure`)
    masks = []
    for m, a in sorted(two.items()):
        if m in OWN_KEYS or m in one or a.dtype.kind not in "biu":
            continue
        feature = next((f for f, b in sorted(two.items()) if f in one and f not in OWN_KEYS and f != m
                        and b.ndim > a.ndim and b.shape[:a.ndim] == a.shape), None)
        if feature is not None:
            masks.append((m, feature))
    return two, low, tuple(masks)


def _video_probe(enc) -> tuple[dict, dict]:
    """``use_audio_in_video``: the processor's outputs for one user turn holding two small videos
    (4 and 6 frames, 56x56 and 84x56) with their sound (1 s and 1.5 s of a tone), as
    `mmpipe.encoding.video_sound` calls it: the video keys (``pixel_values_videos``,
    ``video_grid_thw``, ``video_second_per_grid``; axis 0: patches / videos) and the audio keys; a
    processor whose call fails on them takes no sound with a video (`ArgumentError`)."""
    from mmpipe.encoding.video_sound import video_call_kwargs

    rate = int(audio_extractor(enc.processor).sampling_rate)
    t = np.arange(rate * 3 // 2, dtype=np.float32) / rate
    waves = [0.1 * np.sin(2 * np.pi * 440 * t[:rate]), 0.1 * np.sin(2 * np.pi * 220 * t)]
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (4, 56, 56, 3), dtype=np.uint8),
              rng.integers(0, 256, (6, 84, 56, 3), dtype=np.uint8)]
    turn = [{"role": "user", "content": [{"type": "video"}, {"type": "video"}, {"type": "text", "text": "a"}]}]
    text = plain_render(enc, turn, True)
    try:
        return run_processor(enc, text=[text], sampling_rate=rate, **video_call_kwargs(enc, text, frames, waves, []))
    except (ValueError, TypeError, IndexError, KeyError) as e:  # Gemma 4: videos and clips, but no sound in a video
        raise ArgumentError(f"use_audio_in_video=True: processor {enc.processor_class} failed on mmpipe's probe of two "
                            f"videos with their sound ({type(e).__name__}: {e}); it needs a processor whose chat "
                            "template and call take each video's sound with it (the Omni thinkers: Qwen2.5-Omni, "
                            "Qwen3-Omni); leave use_audio_in_video out") from e


def _joined_axis(a: np.ndarray, b: np.ndarray, both: np.ndarray):
    """The axis > 0 along which ``both`` (the processor's batch of two rows) is ``a`` and ``b`` (each
    row alone) joined, every array's axis 0 being 1; None if it is not."""
    if not (a.ndim == b.ndim == both.ndim >= 2 and a.shape[0] == b.shape[0] == both.shape[0] == 1):
        return None
    for ax in range(1, a.ndim):
        if all(a.shape[i] == b.shape[i] for i in range(a.ndim) if i != ax) and \
                np.array_equal(both, np.concatenate([a, b], axis=ax)):
            return ax
    return None


def _batch_rules(enc, row_keys: list, im, two: dict) -> tuple:
    """What the processor's batch of a 1-image and a 2-image row shows beyond each row alone
    (``two``: the 2-image row's outputs) -> (pads, joins); ((), ()) where the batch call fails.
    pads: row keys whose missing items it pads with other values than 0 (Mllama's
    ``aspect_ratio_mask``: first tile 1): the first row's slot 1 (axis 1; token-aligned keys
    skipped). joins: (key, axis) of the outputs it joins into one array (MiniCPM-V's
    ``pixel_values`` [1, 3, 14, patches x 14] on axis 3)."""
    try:
        out, _ = run_processor(enc, text=[plain_render(enc, user_turn(n), True) for n in (1, 2)], images=[[im], [im, im]],
                      padding=True)
    except (ValueError, TypeError, IndexError, KeyError):
        return (), ()
    try:
        one = probe_call(enc, [im])
    except (ValueError, TypeError, IndexError, KeyError):
        one = {}
    L = out["input_ids"].shape[1]
    joins = tuple(sorted((k, ax) for k in out if k not in OWN_KEYS and k in one and k in two
                         and (ax := _joined_axis(one[k], two[k], out[k])) is not None))
    slots = {k: out[k][0, 1] for k in row_keys
             if k in out and k not in dict(joins) and out[k].ndim >= 3 and out[k].shape[1] == 2 != L}
    pads = tuple((k, tuple(v.reshape(-1).tolist())) for k, v in sorted(slots.items()) if v.any())
    return tuple(sorted(pads + _item_fills(enc, row_keys, joins, im, one))), joins


def _item_fills(enc, row_keys: list, joins: tuple, im, one: dict) -> tuple:
    """(key, (value,)) of the per-image outputs (axis 0 = images, not row keys) whose padded
    items (axis 1) the processor's batch fills with one value other than 0 (Phi-4-multimodal's
    ``image_attention_mask``: 1 for a missing crop): a batch of a small and a large image."""
    from PIL import Image

    big = Image.new("RGB", (2048, 512), (120, 60, 30))  # more crops than ``im`` where the count follows the size
    try:
        mixed, _ = run_processor(enc, text=[plain_render(enc, user_turn(1), True)] * 2, images=[[im], [big]], padding=True)
    except (ValueError, TypeError, IndexError, KeyError):
        return ()
    L, out = mixed["input_ids"].shape[1], []
    for k, a in one.items():
        if k in OWN_KEYS or k in row_keys or k in dict(joins) or k not in mixed or a.ndim < 3 or a.shape[1] == L:
            continue
        if mixed[k].shape[1] > a.shape[1]:
            values = np.unique(mixed[k][0, a.shape[1]:])
            if len(values) == 1 and values[0] != 0:
                out.append((k, (values[0].item(),)))
    return tuple(out)
