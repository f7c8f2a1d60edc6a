"""The checks every loaded clip passes (a file's, an array's, a video's sound track): samples there,
finite, within what the processor's call takes; each refusal an `AudioError` naming the row, the
column and the fix."""

from __future__ import annotations

import os
import stat

import numpy as np

from mmpipe.errors import AudioError

__all__ = ["checked_wave", "regular_file", "too_long", "too_short"]


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
        too_long(wave.size, sampling_rate, max_samples, where, column)
    return wave


def too_long(n: int, sampling_rate: int, max_samples: int, where: str, column: str):
    """Refuse a clip of ``n`` samples at ``sampling_rate`` over ``max_samples`` (`AudioError`)."""
    raise AudioError(f"the clip is {n / sampling_rate:.2f} s; the processor takes at most "
                     f"{max_samples / sampling_rate:.2f} s and would cut the rest", where=where, column=column,
                     expected=f"at most {max_samples} samples at {sampling_rate} Hz", found=f"{n} samples",
                     fix="split the clip into parts of at most that length (one audio item each), or drop the row")


def too_short(n: int, sampling_rate: int, window: int, extractor: str, where: str, column: str, *,
              what: str = "the clip",
              fix: str = "drop the clip (and its audio item) or the row, or pad the clip with silence"):
    """Refuse a clip (or a video's sound track) of ``n`` samples under one analysis ``window`` of the
    feature extractor named ``extractor`` (`AudioError`): Qwen2.5-Omni's call gives it no audio
    token (the model never hears it, silently), Qwen3-Omni's extractor crashes on it."""
    raise AudioError(f"{what} is {n / sampling_rate * 1000:.1f} ms, shorter than one analysis window of {extractor}",
                     where=where, column=column,
                     expected=f"at least {window} samples at {sampling_rate} Hz ({window / sampling_rate * 1000:.0f} ms)",
                     found=f"{n} samples", fix=fix)


def regular_file(path: str, what: str, where: str, column: str) -> None:
    """An `AudioError` where ``path`` (an existing path) is no regular file: libsndfile and FFmpeg open
    what they are given, and a FIFO without a writer blocked the encode forever (a device such as
    /dev/zero never ends); image paths are refused alike (`mmpipe.images.load.check_image_file`)."""
    from mmpipe.images.load import file_kind

    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        found = f"not readable ({e.strerror})"
    else:
        if stat.S_ISREG(mode):
            return
        found = file_kind(mode)
    raise AudioError(f"{what} path {path!r:.120} is {found}, not a regular file", where=where, column=column,
                     expected=f"a regular {what} file", found=found,
                     fix="point the path at the file itself: mmpipe opens only regular files (a FIFO, device or "
                         "socket could block or never end), or drop the row (on_error='skip')")
