"""Small videos with a sound track and audio files in FFmpeg's formats (M4A / AAC, WebM / Opus...),
made with PyAV, for tests and benchmarks of ``use_audio_in_video`` and of clips libsndfile does
not read: nothing is downloaded."""

from __future__ import annotations

import io
from fractions import Fraction

import numpy as np

__all__ = ["sound_file", "tone", "video_with_sound"]

# container -> (video codec, audio codec) PyAV's FFmpeg writes there
CODECS = {"mp4": ("mpeg4", "aac"), "mkv": ("mpeg4", "pcm_s16le"), "webm": ("libvpx", "libopus"),
          "mov": ("mpeg4", "pcm_f32le"), "avi": ("mpeg4", "pcm_s16le")}


def tone(n: int, rate: int, channels: int = 1, seed: int = 0) -> np.ndarray:
    """``n`` samples of a 440 Hz tone plus a little noise at ``rate``: float32 [channels, n] in [-0.4, 0.4]."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / rate
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.uniform(-1, 1, n)
    chans = [x, -0.5 * x + 0.05 * np.sin(2 * np.pi * 97 * t)][:channels]
    return np.stack(chans).astype(np.float32)


# audio-only container -> (PyAV's format name, the codec written there)
SOUND_FORMATS = {"m4a": ("ipod", "aac"), "aac": ("adts", "aac"), "webm": ("webm", "libopus"),
                 "mka": ("matroska", "pcm_s16le")}


def sound_file(samples: np.ndarray, rate: int, fmt: str = "m4a") -> bytes:
    """An audio-only file of ``samples`` (float32 [channels, n], 1 or 2 channels) at ``rate`` in
    container ``fmt`` (`SOUND_FORMATS`), as its bytes."""
    import av

    name, codec = SOUND_FORMATS[fmt]
    buf = io.BytesIO()
    with av.open(buf, "w", format=name) as c:
        _write_sound(c, _sound_stream(c, codec, rate, samples.shape[0]), samples, rate)
    return buf.getvalue()


def _sound_stream(c, codec: str, rate: int, channels: int):
    a = c.add_stream(codec, rate=rate)
    a.layout = "stereo" if channels == 2 else "mono"
    return a


def _write_sound(c, a, samples: np.ndarray, rate: int) -> None:
    """Encode ``samples`` float32 [channels, n] into audio stream ``a`` of container ``c`` (in the
    codec's sample format) and flush it."""
    import av

    fmt_name = a.codec_context.format.name
    step = a.codec_context.frame_size or 1024
    for s in range(0, samples.shape[1], step):
        chunk = np.ascontiguousarray(samples[:, s:s + step])
        if fmt_name == "s16":
            pcm = np.round(chunk.T.reshape(1, -1) * 32768).clip(-32768, 32767)
            data, layout_fmt = pcm.astype(np.int16), "s16"
        elif fmt_name == "flt":
            data, layout_fmt = chunk.T.reshape(1, -1), "flt"
        else:  # planar float (aac, opus)
            data, layout_fmt = chunk, "fltp"
        frame = av.AudioFrame.from_ndarray(data, format=layout_fmt, layout=a.layout.name)
        frame.sample_rate, frame.pts = rate, s
        for p in a.encode(frame):
            c.mux(p)
    for p in a.encode():
        c.mux(p)


def video_with_sound(seconds: float = 2.0, *, fps: float = 4, rate: int = 16000, channels: int = 1,
                     fmt: str = "mkv", audio_codec: str | None = None, size: tuple = (48, 64), seed: int = 0,
                     sound: bool = True) -> tuple[bytes, np.ndarray | None]:
    """A ``seconds``-long video in container ``fmt`` (`CODECS`): moving random frames of ``size``
    (h, w) at ``fps`` and, where ``sound``, a `tone` of ``channels`` at ``rate`` as its audio
    stream (``audio_codec``, default the container's in `CODECS`). Returns (the file's bytes, the
    samples written: float32 [channels, n], or None without sound)."""
    import av

    vcodec, acodec = CODECS[fmt]
    acodec = audio_codec or acodec
    h, w = size
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    samples = tone(int(round(seconds * rate)), rate, channels, seed) if sound else None
    if samples is not None and acodec == "pcm_s16le":  # what the file holds exactly
        samples = np.round(samples * 32767).astype(np.int16).astype(np.float32) / 32768
    buf = io.BytesIO()
    with av.open(buf, "w", format={"mkv": "matroska"}.get(fmt, fmt)) as c:
        v = c.add_stream(vcodec, rate=Fraction(fps).limit_denominator(1001))
        v.height, v.width, v.pix_fmt = h, w, "yuv420p"
        a = _sound_stream(c, acodec, rate, channels) if sound else None
        for i in range(int(round(seconds * fps))):
            frame = np.roll(base, i * 3, axis=1)
            for p in v.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                c.mux(p)
        for p in v.encode():
            c.mux(p)
        if a is not None:
            _write_sound(c, a, samples, rate)
    return buf.getvalue(), samples
