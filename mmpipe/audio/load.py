"""One audio clip -> the mono float32 waveform [n] a feature extractor takes, at its sampling rate.

Accepted values (the same conventions as images and videos: a row's ``audios`` column, or inline
in an ``{"type": "audio"}`` item):

- a file path (``str`` / ``os.PathLike``) or its bytes (WAV, FLAC, OGG, MP3: what libsndfile reads);
- a ``datasets.Audio(decode=False)`` dict ``{"path", "bytes"}`` (bytes first);
- a decoded ``datasets.Audio`` dict ``{"array", "sampling_rate"}``, or ``(array, sampling_rate)``
  (vLLM's form); an object with ``get_all_samples()`` (torchcodec's ``AudioDecoder``, what
  ``datasets`` 4 decodes to).

Files are decoded as transformers' ``load_audio(..., backend="soundfile")`` and ``librosa.load``
decode them (the processor's own chat path): soundfile, channels averaged to mono, resampled with
soxr's ``soxr_hq`` and padded or cut to ``ceil(n * rate / source_rate)``; arrays at another rate are
resampled the same way. A bare array has no rate and is refused (`AudioError`): 16 kHz and 24 kHz
clips look alike. ``soundfile`` and ``soxr`` are the ``audio`` extra, imported on first use.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any

import numpy as np

from mmpipe.errors import AudioError

__all__ = ["AUDIO_ITEM_KEYS", "audio_source", "checked_wave", "load_audio"]

AUDIO_ITEM_KEYS = ("audio", "audio_url", "input_audio", "path")  # where an inline audio item holds its clip
_FIX_RATE = "give the clip with its sampling rate: {'array': samples, 'sampling_rate': rate}"


def _modules():
    try:
        import soundfile
        import soxr
    except ImportError as e:  # the `audio` extra
        raise AudioError(f"audio needs soundfile and soxr ({e})", expected="soundfile and soxr importable",
                         found="not installed", fix="pip install 'mmpipe[audio]' (soundfile, soxr)") from None
    return soundfile, soxr


def _resampled(wave: np.ndarray, rate: int, target: int) -> np.ndarray:
    """``wave`` float32 [n] at ``rate`` -> at ``target``: soxr_hq, padded / cut to the exact length."""
    if rate == target:
        return wave
    _, soxr = _modules()
    n = math.ceil(wave.shape[-1] * target / rate)
    out = soxr.resample(wave, rate, target, quality="soxr_hq")
    return np.pad(out, (0, max(0, n - len(out))))[:n]


def _decode_file(source, where: str, column: str) -> tuple[np.ndarray, int]:
    """A path or bytes -> (mono float32 [n], its rate)."""
    soundfile, _ = _modules()
    what = f"file {str(source)!r:.80}" if not isinstance(source, (bytes, bytearray)) else f"{len(source)} bytes"
    if not isinstance(source, (bytes, bytearray)) and not os.path.exists(source):
        raise AudioError(f"audio file {str(source)!r:.120} does not exist", where=where, column=column,
                         expected="a readable audio file", found="no such file",
                         fix="fix the path (relative paths are read from the working directory)")
    try:
        with soundfile.SoundFile(io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray)) else source) as f:
            rate = int(f.samplerate)
            data = f.read(dtype="float32", always_2d=True).T  # [channels, n]
    except (RuntimeError, soundfile.LibsndfileError, TypeError, ValueError, EOFError) as e:
        raise AudioError(f"audio {what} cannot be decoded ({type(e).__name__}: {e})"[:300], where=where,
                         column=column, expected="a WAV, FLAC, OGG or MP3 file libsndfile reads",
                         found="a corrupt, truncated or unknown file",
                         fix="re-export the clip (e.g. ffmpeg -i in -ar 16000 -ac 1 out.wav) or drop the row") from None
    return (data.mean(axis=0) if data.shape[0] > 1 else data[0]), rate


def _array(samples: Any, rate: Any, where: str, column: str) -> tuple[np.ndarray, int]:
    """Samples with a rate -> (mono float32 [n], rate); [channels, n] averaged."""
    try:
        rate = int(rate)
    except (TypeError, ValueError):
        rate = 0
    if rate <= 0:
        raise AudioError("audio array without a sampling rate", where=where, column=column,
                         expected="a positive integer sampling rate", found=repr(rate)[:40], fix=_FIX_RATE)
    if hasattr(samples, "detach"):  # a torch tensor
        samples = samples.detach().cpu().numpy()
    arr = np.asarray(samples)
    if arr.dtype.kind not in "fiu" or arr.ndim not in (1, 2):
        raise AudioError("audio samples must be a 1-D (or [channels, n]) numeric array", where=where, column=column,
                         expected="float samples [n]", found=f"{arr.dtype} array of shape {arr.shape}", fix=_FIX_RATE)
    if arr.dtype.kind in "iu":  # integer PCM: the full scale is 1.0, as soundfile reads it
        arr = arr.astype(np.float32) / float(np.iinfo(arr.dtype).max + 1)
    arr = arr.astype(np.float32, copy=False)
    return (arr.mean(axis=0) if arr.ndim == 2 else arr), rate


def _wave(value: Any, where: str, column: str) -> tuple[np.ndarray, int]:
    if isinstance(value, (str, os.PathLike, bytes, bytearray)):
        return _decode_file(os.fspath(value) if isinstance(value, os.PathLike) else value, where, column)
    if isinstance(value, tuple) and len(value) == 2:
        return _array(value[0], value[1], where, column)
    if isinstance(value, dict):
        if value.get("array") is not None:
            return _array(value["array"], value.get("sampling_rate"), where, column)
        if value.get("bytes") is not None:
            return _decode_file(value["bytes"], where, column)
        if value.get("path") is not None:
            return _decode_file(value["path"], where, column)
    if hasattr(value, "get_all_samples"):  # torchcodec's AudioDecoder (datasets 4's decoded Audio)
        samples = value.get_all_samples()
        return _array(samples.data, samples.sample_rate, where, column)
    found = f"{type(value).__name__} of shape {np.shape(value)}" if isinstance(value, np.ndarray) else type(value).__name__
    raise AudioError("an audio clip must be a path, bytes, {'path', 'bytes'}, {'array', 'sampling_rate'} or "
                     "(array, sampling_rate)", where=where, column=column, expected="an audio clip with its rate",
                     found=found, fix=_FIX_RATE if isinstance(value, (np.ndarray, list)) else
                     "store clips as paths, bytes or datasets.Audio values")


def load_audio(value: Any, sampling_rate: int, *, where: str = "row", column: str = "audios",
               max_samples: int = 0) -> np.ndarray:
    """One clip -> mono float32 [n] at ``sampling_rate`` (see the module doc). Refused with an
    `AudioError` naming ``where`` / ``column``: unreadable, no rate, zero samples, non-finite
    samples, or over ``max_samples`` (> 0: what the feature extractor takes; a longer clip would be
    cut)."""
    wave, rate = _wave(value, where, column)
    return checked_wave(_resampled(wave, rate, int(sampling_rate)), sampling_rate, where=where, column=column,
                        max_samples=max_samples)


def checked_wave(wave: np.ndarray, sampling_rate: int, *, where: str = "row", column: str = "audios",
                 max_samples: int = 0) -> np.ndarray:
    """``wave`` (samples at ``sampling_rate``) as contiguous float32, refused with an `AudioError`
    naming ``where`` / ``column`` when it is empty, holds non-finite samples, or is over
    ``max_samples`` (> 0)."""
    wave = np.ascontiguousarray(wave, dtype=np.float32)
    if not wave.size:
        raise AudioError("the audio clip has no samples", where=where, column=column, expected="at least one sample",
                         found="0 samples", fix="drop the empty clip (and its audio item) or the row")
    if not np.isfinite(wave).all():
        raise AudioError("the audio clip holds NaN or infinite samples", where=where, column=column,
                         expected="finite samples", found=f"{int((~np.isfinite(wave)).sum())} non-finite",
                         fix="clean or drop the clip")
    if max_samples and wave.size > max_samples:
        raise AudioError(f"the clip is {wave.size / sampling_rate:.2f} s; the processor takes at most "
                         f"{max_samples / sampling_rate:.2f} s and would cut the rest", where=where, column=column,
                         expected=f"at most {max_samples} samples at {sampling_rate} Hz", found=f"{wave.size} samples",
                         fix="split the clip into parts of at most that length (one audio item each), or drop the row")
    return wave


def audio_source(value: Any, wave: np.ndarray, sampling_rate: int) -> bytes:
    """What ``audio="source"`` stores for one clip: its encoded file as given (a path's bytes,
    bytes, a ``{"path", "bytes"}`` dict's), which `load_audio` decodes again to ``wave`` bit for
    bit; for a clip given as samples, ``wave`` (the loaded float32 samples at ``sampling_rate``)
    as a 32-bit float WAV, which reads back exactly."""
    if isinstance(value, dict) and value.get("array") is None:
        value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, (str, os.PathLike)):
        with open(value, "rb") as f:
            return f.read()
    soundfile, _ = _modules()
    buf = io.BytesIO()
    soundfile.write(buf, wave, int(sampling_rate), format="WAV", subtype="FLOAT")
    return buf.getvalue()


def audio_extractor(processor):
    """The processor's audio feature extractor (``feature_extractor``: Whisper's for the Omni
    thinkers, Gemma 3n's; ``audio_processor``: Phi-4-multimodal's), None when it has none (or one
    without a sampling rate)."""
    for name in ("feature_extractor", "audio_processor"):
        fe = getattr(processor, name, None)
        if fe is not None and getattr(fe, "sampling_rate", None):
            return fe
    return None
