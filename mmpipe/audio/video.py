"""A video's sound track -> the mono float32 waveform [n] an Omni processor takes with
``use_audio_in_video`` (transformers 5.24: ``load_audio_from_video``).

What transformers 5.24 does (``OmniModalProcessorMixin._resolve_audio_from_video``): a video
without an audio stream (torchcodec's ``get_container_metadata``) gets no audio and keeps its plain
video placeholder; one with an audio stream is decoded by ``load_audio(video, backend="torchcodec",
sampling_rate=<the feature extractor's>)``, i.e. torchcodec's
``AudioDecoder(source, sample_rate=rate, num_channels=1).get_all_samples()``: the first audio
stream decoded by libavcodec and converted by libswresample (default options) to mono float
samples at the target rate in one step, its buffered tail flushed at the end. The chat path
(``apply_chat_template(load_audio_from_video=True)``) calls ``load_audio`` on the file too, which
picks torchcodec and, without it, refuses video containers (mp4, mkv, mov, avi...).

`load_video_audio` does that conversion with PyAV (the ``video`` extra): the same libavcodec decode
and a libswresample conversion (``av.AudioResampler(format="fltp", layout="mono", rate=rate)``, the
same defaults) flushed at the end. Without a resampling step (a mono float stream at the target
rate) the samples are the decoded ones as they are; PCM sound tracks come back exactly
(``int16 / 32768``). Accepted values: a path, the file's bytes, a ``{"path", "bytes"}`` dict
(bytes first), as a row's ``videos`` column holds them.

A video without an audio stream is an `AudioError` naming the row, the column (``videos``) and
the fix (``missing="none"``: None instead, which is what the processor does with it: no audio for
that video, its plain placeholder).
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np

from mmpipe.audio.checks import checked_wave, regular_file, too_long
from mmpipe.errors import ArgumentError, AudioError

__all__ = ["decoded_sound", "has_audio_stream", "load_video_audio"]

_FIX_SILENT = ("encode this row with use_audio_in_video=False (the video's frames only), add a sound track, "
               "or drop the row")


def _av():
    try:
        import av
    except ImportError as e:  # the `video` extra
        raise AudioError(f"the sound track of a video needs PyAV ({e})", expected="av importable",
                         found="not installed", fix="pip install 'mmpipe[video]' (av)") from None
    return av


def _source(value: Any, where: str, column: str):
    """A video value -> what ``av.open`` takes (a path or a BytesIO), and its name for messages."""
    if isinstance(value, dict):
        value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return io.BytesIO(bytes(value)), f"{len(value)} bytes"
    if isinstance(value, (str, os.PathLike)):
        path = os.fspath(value)
        if not os.path.exists(path):
            raise AudioError(f"video file {path!r:.120} does not exist", where=where, column=column,
                             expected="a readable video file", found="no such file",
                             fix="fix the path (relative paths are read from the working directory)")
        regular_file(path, "video", where, column)
        return path, f"file {path!r:.80}"
    raise AudioError("the sound track of a video is read from its file: a path, bytes or {'path', 'bytes'}",
                     where=where, column=column, expected="a video file", found=type(value).__name__,
                     fix="store the row's videos as files (paths or bytes) to use their sound")


def _open(av, source, what: str, where: str, column: str, media: str = "video"):
    """``av.open(source)``; what FFmpeg cannot open is an `AudioError` (``what``: the file, named)."""
    try:
        return av.open(source)
    except (av.error.FFmpegError, ValueError, OSError) as e:
        video = media == "video"
        raise AudioError(f"{what} cannot be {'opened' if video else 'decoded'} ({type(e).__name__}: {e})"[:300],
                         where=where, column=column,
                         expected="a video container FFmpeg reads (mp4, mkv, webm, mov, avi...)" if video else
                         "an audio file libsndfile or FFmpeg reads (WAV, FLAC, OGG, MP3, M4A, AAC, WebM...)",
                         found="a corrupt, truncated or unknown file",
                         fix="re-encode the video (e.g. ffmpeg -i in.mp4 -c:v libx264 -c:a aac out.mp4) or drop the row"
                         if video else "re-export the clip (e.g. ffmpeg -i in -ar 16000 -ac 1 out.wav) or drop the row"
                         ) from None


def has_audio_stream(value: Any, *, where: str = "row", column: str = "videos") -> bool:
    """Whether the video ``value`` (a path, bytes, ``{"path", "bytes"}``) holds an audio stream:
    what the processor checks before it loads a video's sound."""
    av = _av()
    source, what = _source(value, where, column)
    with _open(av, source, f"video {what}", where, column) as container:
        return bool(container.streams.audio)


def load_video_audio(value: Any, sampling_rate: int, *, where: str = "row", column: str = "videos",
                     max_samples: int = 0, missing: str = "error") -> np.ndarray | None:
    """The sound track of one video (a path, bytes, ``{"path", "bytes"}``) -> mono float32 [n] at
    ``sampling_rate``: its first audio stream decoded and converted by libswresample to mono at that
    rate (see the module doc). A video without an audio stream: `AudioError` (``missing="error"``)
    or None (``missing="none"``). Refused as `mmpipe.audio.load_audio` refuses clips: unreadable,
    no samples, non-finite samples, over ``max_samples`` (> 0; a stream over it by its header is
    refused before it is decoded)."""
    if missing not in ("error", "none"):
        raise ArgumentError(f"missing must be 'error' or 'none', not {missing!r}")
    return decoded_sound(value, sampling_rate, where=where, column=column, max_samples=max_samples,
                         missing=missing, media="video")


def decoded_sound(value: Any, sampling_rate: int, *, where: str, column: str, max_samples: int = 0,
                  missing: str = "error", media: str = "audio") -> np.ndarray | None:
    """The first audio stream of a file FFmpeg reads (``media``: "video", a video's sound track;
    "audio", an audio file libsndfile does not read: M4A / AAC, WebM / Opus, AMR, WMA...) -> mono
    float32 [n] at ``sampling_rate``, as torchcodec's ``AudioDecoder(source, sample_rate=rate,
    num_channels=1)`` gives it (the chat path's ``load_audio`` with torchcodec installed; see the
    module doc). No audio stream: `AudioError`, or None with ``missing="none"``."""
    av = _av()
    source, what = _source(value, where, column)
    what = f"{media} {what}"
    chunks = []
    with _open(av, source, what, where, column, media) as container:
        if not container.streams.audio:
            if missing == "none":
                return None
            kinds = sorted({s.type for s in container.streams}) or ["no streams"]
            raise AudioError(f"{'use_audio_in_video: the video' if media == 'video' else f'the {what}'} has no audio "
                             "stream", where=where, column=column, expected=f"a {media} with a sound track",
                             found=f"streams: {', '.join(kinds)}",
                             fix=_FIX_SILENT if media == "video" else "give an audio file, or drop the row")
        stream = container.streams.audio[0]
        if max_samples:  # the header's length first: an hour-long track is not decoded to be refused
            seconds = _header_seconds(container, stream)
            if seconds is not None and seconds * sampling_rate > max_samples * 1.01:
                too_long(int(seconds * sampling_rate), int(sampling_rate), max_samples, where, column)
        resampler = av.AudioResampler(format="fltp", layout="mono", rate=int(sampling_rate))
        end = 0.0  # seconds: where the decoded sound ends (`_check_declared`)
        try:
            for frame in container.decode(stream):
                if frame.time is not None and frame.sample_rate:
                    end = max(end, frame.time + frame.samples / frame.sample_rate)
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray()[0])
            for out in resampler.resample(None):  # the converter's buffered tail
                chunks.append(out.to_ndarray()[0])
        except av.error.FFmpegError as e:
            raise AudioError(f"the sound track of {what} cannot be decoded ({type(e).__name__}: {e})"[:300],
                             where=where, column=column, expected="an audio stream FFmpeg decodes",
                             found="a corrupt or truncated stream",
                             fix=f"re-encode the {media}'s audio (e.g. ffmpeg -i in.mp4 -c:v copy -c:a aac out.mp4) "
                                 "or drop the row" if media == "video" else
                                 "re-export the clip (e.g. ffmpeg -i in -ar 16000 -ac 1 out.wav) or drop the row") from None
        _check_declared(container, end, what, where, column)
    wave = np.concatenate(chunks).astype(np.float32, copy=False) if chunks else np.zeros(0, np.float32)
    return checked_wave(wave, int(sampling_rate), where=where, column=column, max_samples=max_samples)


def _header_seconds(container, stream) -> float | None:
    """The audio stream's length by its header (the stream's duration, else the container's), None
    where neither says."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    return container.duration / 1e6 if container.duration else None


def _check_declared(container, end: float, what: str, where: str, column: str) -> None:
    """An `AudioError` where a Matroska / WebM file of one (audio) stream declares more time than its
    sound holds by over a quarter second: a file cut short (an interrupted download), which FFmpeg
    (and torchcodec, the chat path's decoder) decodes up to where it ends, without a word; WAV,
    AIFF and AU are checked by their headers (`mmpipe.audio.headers`). With other streams the
    header's duration may be another track's."""
    from mmpipe.images.matroska_span import matroska_shortfall

    short = matroska_shortfall(container, end, 0.25) if len(container.streams) == 1 else None
    if short is not None:
        declared, held = short
        raise AudioError(f"the {what} is truncated: its header holds {declared:.2f} s, its sound {held:.2f} s",
                         where=where, column=column, expected=f"{declared:.2f} s (the Matroska / WebM header's duration)",
                         found=f"{held:.2f} s of sound", fix="re-download or re-export the clip, or drop the row")
