"""Videos with their sound (``use_audio_in_video``) for a processor's own call (the Omni thinkers,
Qwen2.5-Omni and Qwen3-Omni, on the generic path: `mmpipe.media.processor_encode`): they take a
row's videos and each video's sound track interleaved with its frames (`mmpipe.audio.omni_video`).
The modality, not the kind: the kind asks `load_video_sounds`, `call_media_kwargs` and `media_order`.

A video value is a file (a path, its bytes, a ``datasets.Video(decode=False)`` dict): its frames are
sampled by qwen-vl-utils' rule (`mmpipe.images.video.sample_count` / ``sample_indices``: ``fps``
frames a second, 2.0 by default; ``min_frames`` / ``max_frames``) at the file's own size
(the processor's video processor resizes them), and its sound is `mmpipe.audio.load_video_audio`'s
(mono float32 at the feature extractor's rate). The processor is called with the frames, the sound
tracks as ``audio=`` with ``audio_from_video_indices`` (`mmpipe.audio.omni_video.call_kwargs`: the
slots in the order the text's audio and video placeholders appear) and ``fps``: the rate the
frames were sampled at (one per call, as the processor takes it: its ``video_second_per_grid`` is
``temporal_patch_size / fps``). A video without an audio stream is an `AudioError` naming the row,
the column and the fix; frame lists have no sound (refused the same way).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, ImageError, PlaceholderError, VideoError

__all__ = ["VIDEO_OPTIONS", "call_media_kwargs", "check_video_options", "check_video_placeholders", "frames_fps",
           "load_video_sounds", "load_videos", "media_order", "sampled_frames", "video_call_kwargs",
           "video_sound_settings"]

# the `mmpipe.images.video.VideoOptions` fields the generic path takes: frame sampling (the processor's video
# processor sizes the frames; it takes one fps per call, so no per-video frame count)
VIDEO_OPTIONS = ("fps", "min_frames", "max_frames")


def check_video_options(opts) -> None:
    """Refuse the fields of ``opts`` (`VideoOptions`) the generic path does not take: the sizing ones
    (the processor sizes the frames) and ``nframes`` (the processor is told the sampling ``fps``)."""
    from mmpipe.images.video import VideoOptions

    default = VideoOptions()
    other = [name for name in ("nframes", "min_pixels", "max_pixels", "total_pixels")
             if getattr(opts, name) != getattr(default, name)]
    if other:
        raise ArgumentError(f"video_options {other} are not taken on the generic path: the processor's video "
                            "processor sizes the frames (set them on processor.video_processor) and is told the "
                            f"sampling fps; accepted: {list(VIDEO_OPTIONS)}")


def video_sound_settings(enc, given: dict, template: str) -> None:
    """``Encoder(use_audio_in_video=True)``: refuse a processor without a video processor and an
    audio feature extractor, and ``audio="source"`` (``template``: the kind's ``REFUSAL``); set
    ``enc.video_opts`` (`check_video_options`)."""
    from mmpipe.audio.load import audio_extractor
    from mmpipe.encoding.options import refusal
    from mmpipe.encoding.videos import video_options

    if audio_extractor(enc.processor) is None or getattr(enc.processor, "video_processor", None) is None:
        raise refusal(enc, template, "use_audio_in_video=True", "it needs a processor with a video processor and an "
                      "audio feature extractor (the Omni thinkers: Qwen2.5-Omni, Qwen3-Omni)")
    if given.get("audio") == "source":
        raise refusal(enc, template, "audio='source' with use_audio_in_video=True", "a video's sound is stored as "
                      "the processor's features; leave audio out (or pass 'features')")
    enc.video_opts = video_options(given.get("video_options"))
    check_video_options(enc.video_opts)


def check_video_placeholders(enc, text: str, n_videos: int, where: str) -> None:
    """The rendered ``text`` holds one video placeholder per video of the row, else its
    `PlaceholderError`."""
    n_video = media_order(enc.processor, text).count("video")
    if n_video != n_videos:
        raise PlaceholderError(f"the rendered prompt holds {n_video} video placeholder(s) but the row has "
                               f"{n_videos} video(s)", where=where, column="messages",
                               expected=f"one {enc.processor.video_token} per video", found=str(n_video),
                               fix="one video item per video; remove literal video tokens from the text")


def frames_fps(opts) -> float:
    """The rate frames are sampled at and the processor is told (``fps``): ``opts.fps`` (the encoder's
    `VideoOptions`), else 2.0 (qwen-vl-utils' FPS)."""
    fps = getattr(opts, "fps", None)
    return float(fps) if fps is not None else 2.0


def sampled_frames(value: Any, opts, where: str) -> np.ndarray:
    """One video file -> uint8 [n, H, W, 3] RGB frames at the file's own size, sampled by qwen-vl-utils'
    rule (`mmpipe.images.video.sampled_frames`); a frame list is refused: its sound is not in it."""
    from mmpipe.images.video import sampled_frames as file_frames

    if isinstance(value, (list, tuple, np.ndarray)):
        raise VideoError("use_audio_in_video takes a video's sound from its file; a frame list has none", where=where,
                         expected="a video file (a path, bytes or {'path', 'bytes'})", found="a frame list",
                         fix="store the row's videos as files, or encode it with use_audio_in_video=False")
    return file_frames(value, opts, where=where)


def media_order(processor, text: str) -> list[str]:
    """The kinds ("audio" / "video") of the audio and video placeholders of a rendered ``text``, in
    order: the processor's audio slots (`mmpipe.audio.omni_video.call_kwargs`)."""
    tokens = {getattr(processor, "audio_token", None): "audio", getattr(processor, "video_token", None): "video"}
    tokens.pop(None, None)
    found = sorted((i, kind) for tok, kind in tokens.items() for i in _find_all(text, tok))
    return [kind for _, kind in found]


def _find_all(text: str, token: str) -> list[int]:
    out, i = [], text.find(token)
    while i >= 0:
        out.append(i)
        i = text.find(token, i + len(token))
    return out


def load_videos(videos: Sequence, opts, rate: int, where: str, *, column: str = "videos",
                max_samples: int = 0, window: tuple = (0, "")) -> tuple[list, list]:
    """A row's videos -> (their frames sampled by ``opts`` (`VideoOptions`, None: the defaults), their
    sound tracks: mono float32 at ``rate``, at most ``max_samples`` (> 0) each, at least ``window``
    ((samples, the feature extractor's name): one analysis window, `mmpipe.audio.clips.clip_window`)
    each); each video's `AudioError` / `VideoError` located at ``column``."""
    from mmpipe.audio import load_video_audio
    from mmpipe.audio.checks import too_short
    from mmpipe.images.video import VideoOptions

    frames, waves = [], []
    opts = opts or VideoOptions()
    for i, value in enumerate(videos):
        at = f"{where}, video {i}"
        if isinstance(value, dict) and "video" in value:  # an inline item's value, and its per-video options
            from mmpipe.encoding.media import VIDEO_ITEM_OPTIONS

            extra = sorted(k for k in VIDEO_ITEM_OPTIONS if value.get(k) is not None)
            if extra:  # one fps per processor call: not per video
                raise VideoError(f"per-video options {extra} are not taken with use_audio_in_video", where=at,
                                 column=column, expected="a video item without options",
                                 found=str(extra), fix="drop them; sample every video alike with the encoder's "
                                                       "video_options={'fps': ...}")
            value = value["video"]
        if hasattr(value, "_hf_encoded"):  # a decoded datasets.Video(): its file
            value = value._hf_encoded
        try:
            waves.append(load_video_audio(value, rate, where=at, column=column, max_samples=max_samples))
            if waves[-1].size < window[0]:  # Qwen2.5-Omni: no audio token for the video's sound, silently
                too_short(waves[-1].size, rate, window[0], window[1], at, column, what="the video's sound track",
                          fix="encode this row with use_audio_in_video=False (the frames only), or drop the row")
            frames.append(sampled_frames(value, opts, at))
        except ImageError as e:  # VideoError
            raise e.locate(column=column) from None
    return frames, waves


def video_call_kwargs(enc, text: str, frames: Sequence, video_waves: Sequence, clips: Sequence) -> dict:
    """The processor call's video and audio keywords for a rendered ``text`` holding the first
    ``len(frames)`` videos and clips of its row in order: ``videos``, ``fps``, and `call_kwargs`'s
    ``audio`` / ``audio_from_video_indices`` / ``load_audio_from_video``; {} without videos (the
    plain audio keywords then apply)."""
    from mmpipe.audio.omni_video import call_kwargs

    order = media_order(enc.processor, text)
    n_audio, n_video = order.count("audio"), order.count("video")
    if not n_video:
        return {}
    kw = call_kwargs(order, list(clips[:n_audio]), list(video_waves[:n_video]), enc.processor)
    return {"videos": list(frames[:n_video]), "fps": frames_fps(enc.video_opts), **kw}


def load_video_sounds(enc, videos: list, where: str) -> tuple[list, list]:
    """``use_audio_in_video``: the row's videos -> (sampled frames, sound tracks at the feature
    extractor's rate) (`load_videos`); a sound track longer than the processor takes or shorter than
    one analysis window is refused as a clip is (`mmpipe.audio.clips.clip_limit`, ``clip_window``)."""
    from mmpipe.audio.clips import clip_limit, clip_window
    from mmpipe.audio.load import audio_extractor

    from mmpipe._fork import torch_fork_safe

    torch_fork_safe()  # the extractor's torch STFT: a forked map worker deadlocks otherwise (`load_clips`)
    fe = audio_extractor(enc.processor)
    return load_videos(videos, enc.video_opts, int(fe.sampling_rate), where, column=enc.videos_column,
                       max_samples=clip_limit(enc.processor, fe), window=(clip_window(fe), type(fe).__name__))


def call_media_kwargs(enc, text: str, audios: Sequence, videos: tuple = ()) -> dict:
    """The call's audio keywords (`mmpipe.audio.clips.call_kwargs`) and, for a text holding videos
    with their sound (``videos``: (the row's sampled frames, their sound tracks)), its video
    keywords (`video_call_kwargs`: the sound tracks join ``audio=`` in slot order)."""
    from mmpipe.audio.clips import call_kwargs
    from mmpipe.audio.load import audio_extractor

    kw = call_kwargs(enc.processor, audios)
    if videos and len(videos[0]):
        extra = video_call_kwargs(enc, text, videos[0], videos[1], list(audios))
        if extra:
            kw.update(extra, sampling_rate=int(audio_extractor(enc.processor).sampling_rate))
    return kw
