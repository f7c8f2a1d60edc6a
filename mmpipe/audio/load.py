"""One audio clip -> the mono float32 waveform [n] a feature extractor takes, at its sampling rate.

Accepted values (the same conventions as images and videos: a row's ``audios`` column, or inline
in an ``{"type": "audio"}`` item):

- a file path (``str`` / ``os.PathLike``), its bytes or a ``data:<type>;base64,<data>`` URI of them
  (as the chat path's ``load_audio`` takes): WAV, FLAC, OGG, MP3 (what libsndfile reads) and, with
  PyAV (the ``video`` extra), what FFmpeg reads beyond them (M4A / AAC, WebM, AMR, WMA...);
- a ``datasets.Audio(decode=False)`` dict ``{"path", "bytes"}`` (bytes first);
- a decoded ``datasets.Audio`` dict ``{"array", "sampling_rate"}``, or ``(array, sampling_rate)``
  (vLLM's form, and ``soundfile.read``'s): float samples, or integer PCM scaled as soundfile reads
  it (uint8: 8-bit WAV, offset binary); [n], [channels, n] or [n, channels] (the shorter axis is
  the channels); an object with ``get_all_samples()`` (torchcodec's ``AudioDecoder``, what
  ``datasets`` 4 decodes to).

Files are decoded as transformers' ``load_audio(..., backend="soundfile")`` and ``librosa.load``
decode them (the processor's own chat path): soundfile, channels averaged to mono, resampled with
soxr's ``soxr_hq`` and padded or cut to ``ceil(n * rate / source_rate)``; arrays at another rate are
resampled the same way. A bare array has no rate and is refused (`AudioError`): 16 kHz and 24 kHz
clips look alike. A file libsndfile does not recognise is decoded as the chat path decodes it with
torchcodec installed (without torchcodec, transformers refuses such formats): FFmpeg's decode,
converted to mono at the target rate by libswresample in one step (`mmpipe.audio.video.decoded_sound`).
``soundfile`` and ``soxr`` are the ``audio`` extra, imported on first use.
"""

from __future__ import annotations

import io
import math
import os
from typing import Any

import numpy as np

from mmpipe.audio.checks import checked_wave, regular_file, too_long
from mmpipe.audio.headers import declared_frames
from mmpipe.errors import AudioError

__all__ = ["AUDIO_ITEM_KEYS", "audio_source", "checked_wave", "load_audio"]

AUDIO_ITEM_KEYS = ("audio", "audio_url", "input_audio", "path")  # where an inline audio item holds its clip
MIN_RATE, MAX_RATE = 1000, 1_000_000  # sampling rates (Hz) of audio: telephony's 8000 to studio's 768000, with room
MAX_FLOAT_PEAK = 8.0  # float samples past +18 dBFS: unscaled integer PCM (whose audible peaks are in the hundreds or more)
_SF_UNRECOGNISED = 1  # libsndfile's SF_ERR_UNRECOGNISED_FORMAT: a container it does not read at all
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


def _data_uri(value: Any, where: str = "row", column: str = "audios") -> Any:
    """A ``data:[<type>];base64,<data>`` string -> its bytes (the chat path's ``load_audio`` takes such
    a URI, e.g. an OpenAI-style ``audio_url``; `mmpipe.images.load.data_uri_bytes`); any other value
    as it is."""
    if not (isinstance(value, str) and value.startswith("data:")):
        return value
    from mmpipe.images.load import data_uri_bytes

    return data_uri_bytes(value, where, error=AudioError, kind="audio", column=column)


def _decode_file(source, where: str, column: str, limit: tuple = (0, 0)) -> tuple[np.ndarray, int]:
    """A path, a ``data:`` URI or bytes -> (mono float32 [n], its rate). ``limit``: (max_samples > 0,
    at rate): a file whose header puts it clearly over (1 %: MP3 headers may estimate) is refused
    before it is decoded (an hour of 48 kHz stereo took 15 s and 2 GB to refuse after decoding)."""
    soundfile, _ = _modules()
    source = _data_uri(source, where, column)
    what = f"file {str(source)!r:.80}" if not isinstance(source, (bytes, bytearray)) else f"{len(source)} bytes"
    if not isinstance(source, (bytes, bytearray)) and not os.path.exists(source):
        remote = str(source).startswith(("http://", "https://", "s3://", "gs://", "hf://"))
        raise AudioError(f"audio file {str(source)!r:.120} does not exist", where=where, column=column,
                         expected="a readable audio file", found="a URL (not fetched)" if remote else "no such file",
                         fix="download the clip and give its path or bytes" if remote else
                         "fix the path (relative paths are read from the working directory; base64: give it as "
                         "'data:audio/wav;base64,...')")
    if not isinstance(source, (bytes, bytearray)):
        regular_file(source, "audio", where, column)
    try:
        with soundfile.SoundFile(io.BytesIO(bytes(source)) if isinstance(source, (bytes, bytearray)) else source) as f:
            rate = int(f.samplerate)
            max_samples, target = limit
            if max_samples and f.frames > 0 and math.ceil(f.frames * target / rate) > max_samples * 1.01:
                too_long(math.ceil(f.frames * target / rate), target, max_samples, where, column)
            # GSM 6.10, G.721 / G.723 WAV and AU are not seekable: soundfile reads them given their frames
            data = f.read(-1 if f.seekable() else f.frames, dtype="float32", always_2d=True).T  # [channels, n]
            subtype = f.subtype
        declared = declared_frames(source)
    except AudioError:  # too long by its header (a ValueError too)
        raise
    except (RuntimeError, soundfile.LibsndfileError, TypeError, ValueError, EOFError, OSError) as e:
        if getattr(e, "code", None) == _SF_UNRECOGNISED:  # not libsndfile's: M4A / AAC, WebM, AMR... (FFmpeg's)
            return _decode_ffmpeg(source, what, where, column, limit)
        raise AudioError(f"audio {what} cannot be decoded ({type(e).__name__}: {e})"[:300], where=where,
                         column=column, expected="a WAV, FLAC, OGG or MP3 file libsndfile reads",
                         found="a corrupt, truncated or unknown file",
                         fix="re-export the clip (e.g. ffmpeg -i in -ar 16000 -ac 1 out.wav) or drop the row") from None
    if declared is not None and declared[0] > data.shape[1]:
        # libsndfile reads what is there and says nothing (nor does the chat path): a cut file would train
        # the row on part of its clip
        (frames, container) = declared
        raise AudioError(f"the {container} {what} is truncated: its header holds {frames / rate:.2f} s, the file "
                         f"{data.shape[1] / rate:.2f} s", where=where, column=column,
                         expected=f"{frames} frames (the header's data size)", found=f"{data.shape[1]} frames",
                         fix="re-download or re-export the clip, or drop the row")
    # a float WAV / AIFF / CAF holds its samples as written, unscaled: int16 values saved as floats
    # (peaks in the thousands) reached the processor as they are, where the same samples as an array
    # are refused (integer formats read back at full scale 1.0; lossy decoders overshoot it slightly)
    _check_full_scale(data, where, column, found=f"{subtype} samples of the audio {what}",
                      fix="re-export the file with float samples in [-1, 1] (divide int16 values by 32768), or "
                          "as integer PCM (e.g. soundfile.write(path, samples, rate, subtype='PCM_16'))")
    return (data.mean(axis=0) if data.shape[0] > 1 else data[0]), rate


def _decode_ffmpeg(source, what: str, where: str, column: str, limit: tuple) -> tuple[np.ndarray, int]:
    """A file libsndfile does not recognise -> (mono float32 [n], the target rate): decoded by FFmpeg
    (PyAV, the ``video`` extra) and converted to mono at the target rate in one libswresample step,
    as the chat path's ``load_audio`` decodes such a file (torchcodec's ``AudioDecoder``; without
    torchcodec transformers refuses M4A, AAC, WebM, AMR, WMA...: soundfile cannot read them).
    Without PyAV, or where FFmpeg cannot read it either, an `AudioError` naming the file."""
    from mmpipe.audio.video import decoded_sound

    max_samples, target = limit
    try:
        import av  # noqa: F401  (the `video` extra)
    except ImportError:
        raise AudioError(f"audio {what} is no format libsndfile reads (WAV, FLAC, OGG, MP3), and FFmpeg's "
                         "decoder (PyAV) is not installed", where=where, column=column,
                         expected="a WAV, FLAC, OGG or MP3 file, or PyAV for M4A / AAC / WebM / AMR / WMA",
                         found="a file libsndfile does not recognise",
                         fix="pip install 'mmpipe[video]' (PyAV), or re-export the clip as WAV / FLAC") from None
    wave = decoded_sound(source, target, where=where, column=column, max_samples=max_samples)
    return wave, target


def _array(samples: Any, rate: Any, where: str, column: str) -> tuple[np.ndarray, int]:
    """Samples with a rate -> (mono float32 [n], rate). 2-D samples are [channels, n] (torchcodec,
    ``datasets``) or [n, channels] (``soundfile.read``, ``scipy.io.wavfile.read``): the shorter axis
    is the channels (a square array is refused: either reading fits), averaged as a file's are.
    Integer samples are PCM scaled as soundfile reads a file of that width: signed ``x / 2**(bits-1)``,
    unsigned offset binary ``(x - 2**(bits-1)) / 2**(bits-1)`` (8-bit WAV: 128 is silence); integers
    wider than 32 bits are refused (Python ints, e.g. int16 samples read back from an Arrow column,
    have lost their width)."""
    if getattr(rate, "ndim", None) == 0 and hasattr(rate, "item"):  # a numpy / torch scalar: np.float32(16000.7)
        rate = rate.item()
    given = rate
    try:
        rate = int(rate) if not isinstance(rate, float) or rate.is_integer() else 0  # 22050.5: no rate
    except (TypeError, ValueError, OverflowError):  # None, an array (scipy's (rate, data) order), inf, nan
        rate = 0
    if rate <= 0:
        found = repr(given)[:40] if isinstance(given, (int, float, str, type(None))) else type(given).__name__
        raise AudioError("audio array without a sampling rate", where=where, column=column,
                         expected="a positive integer sampling rate", found=found,
                         fix=_FIX_RATE + " (a tuple is (samples, rate); scipy.io.wavfile.read returns (rate, samples))")
    if hasattr(samples, "detach"):  # a torch tensor (bfloat16 has no numpy dtype; float32 holds it exactly)
        samples = samples.detach().cpu()
        samples = (samples.float() if str(samples.dtype) == "torch.bfloat16" else samples).numpy()
    try:
        arr = np.asarray(samples)
    except (TypeError, ValueError) as e:  # a ragged list: channels of different lengths
        raise AudioError("audio samples must be a 1-D (or [channels, n]) numeric array", where=where, column=column,
                         expected="float samples [n]", found=f"{type(samples).__name__} that is no array ({e})"[:160],
                         fix=_FIX_RATE) from None
    if arr.dtype.kind not in "fiu" or arr.ndim not in (1, 2):
        raise AudioError("audio samples must be a 1-D (or [channels, n]) numeric array", where=where, column=column,
                         expected="float samples [n]", found=f"{arr.dtype} array of shape {arr.shape}", fix=_FIX_RATE)
    if arr.dtype.kind in "iu" and arr.dtype.itemsize > 4:
        raise AudioError("integer audio samples wider than 32 bits: their PCM width (full scale) is unknown", where=where,
                         column=column, expected="float samples, or int8 / int16 / int32 (uint8: 8-bit WAV) PCM",
                         found=f"{arr.dtype} samples (e.g. int16 samples read back from a datasets / Arrow column as "
                               "Python ints)",
                         fix="give the samples with their width (np.asarray(samples, np.int16)) or as floats in [-1, 1]")
    if arr.ndim == 2 and not arr.size:  # [channels, 0]: no samples (not 2 channels of a 0-channel clip)
        arr = arr.reshape(0)
    if arr.ndim == 2:
        if arr.shape[0] == arr.shape[1] and arr.shape[0] > 1:
            raise AudioError("2-D audio samples whose channel axis is ambiguous", where=where, column=column,
                             expected="[channels, n] or [n, channels] with more samples than channels",
                             found=f"shape {arr.shape}", fix="give the samples as [channels, n] of a longer clip, or mono [n]")
        if arr.shape[0] > arr.shape[1] or not arr.shape[0]:  # [n, channels]: soundfile.read's layout
            arr = arr.T
    if arr.dtype.kind in "iu":  # integer PCM: the full scale is 1.0, as soundfile reads it
        half = float(2 ** (8 * arr.dtype.itemsize - 1))
        unsigned = arr.dtype.kind == "u"
        arr = arr.astype(np.float32)
        arr = (arr - half) / half if unsigned else arr / half
    else:
        _check_full_scale(arr, where, column)
    arr = arr.astype(np.float32, copy=False)
    return (arr.mean(axis=0) if arr.ndim == 2 else arr), rate


def _check_full_scale(arr: np.ndarray, where: str, column: str, *, found: str = "", fix: str = "") -> None:
    """Float samples have a full scale of 1.0; peaks over `MAX_FLOAT_PEAK` are integer PCM that lost
    its width on the way (``int16_array.astype(np.float32)``; a ``datasets`` column whose float rows
    turn its int16 rows into float32), which the processor takes as they are, silently: Whisper's
    features of such a clip differ by up to 2.3 from the scaled clip's. Non-finite samples are
    `checked_wave`'s to refuse."""
    peak = float(np.max(np.abs(arr), initial=0.0, where=np.isfinite(arr))) if arr.size else 0.0
    if peak > MAX_FLOAT_PEAK:
        raise AudioError(f"float audio samples peak at {peak:g}: integer PCM not scaled to full scale 1.0",
                         where=where, column=column, expected=f"float samples in [-1, 1] (peaks up to {MAX_FLOAT_PEAK:g})",
                         found=f"{found or f'{arr.dtype} samples'} with peak |sample| {peak:g}",
                         fix=fix or "give integer samples with their width (np.asarray(samples, np.int16): mmpipe scales them "
                             "as soundfile reads them) or divide them by their full scale (int16: 32768); a datasets "
                             "column with float and int16 clips stores them all as float: keep one dtype, or store files")


def _wave(value: Any, where: str, column: str, limit: tuple = (0, 0)) -> tuple[np.ndarray, int]:
    if isinstance(value, (str, os.PathLike, bytes, bytearray)):
        return _decode_file(os.fspath(value) if isinstance(value, os.PathLike) else value, where, column, limit)
    if isinstance(value, tuple) and len(value) == 2:
        return _array(value[0], value[1], where, column)
    if isinstance(value, dict):
        if value.get("array") is not None:
            return _array(value["array"], value.get("sampling_rate"), where, column)
        if value.get("bytes") is not None:
            return _decode_file(value["bytes"], where, column, limit)
        if value.get("path") is not None:
            return _decode_file(value["path"], where, column, limit)
    if hasattr(value, "get_all_samples"):  # torchcodec's AudioDecoder (datasets 4's decoded Audio)
        try:
            samples = value.get_all_samples()
        except (RuntimeError, ValueError, OSError) as e:  # a stream FFmpeg cannot decode (torchcodec raises these)
            raise AudioError(f"the audio decoder of the clip failed ({type(e).__name__}: {e})"[:300], where=where,
                             column=column, expected="a clip FFmpeg decodes", found="a corrupt or truncated stream",
                             fix="re-export the clip (e.g. ffmpeg -i in -ar 16000 -ac 1 out.wav) or drop the row") from None
        return _array(samples.data, samples.sample_rate, where, column)
    found = f"{type(value).__name__} of shape {np.shape(value)}" if isinstance(value, np.ndarray) else type(value).__name__
    if value is None or (isinstance(value, dict) and all(v is None for v in value.values())):  # a null Arrow value
        raise AudioError("the audio clip is missing", where=where, column=column, expected="an audio clip",
                         found=f"{value!r:.80}", fix="give the clip, or drop its audio item or the row")
    raise AudioError("an audio clip must be a path, bytes, {'path', 'bytes'}, {'array', 'sampling_rate'} or "
                     "(array, sampling_rate)", where=where, column=column, expected="an audio clip with its rate",
                     found=found, fix=_FIX_RATE if isinstance(value, (np.ndarray, list)) else
                     "store clips as paths, bytes or datasets.Audio values")


def load_audio(value: Any, sampling_rate: int, *, where: str = "row", column: str = "audios",
               max_samples: int = 0) -> np.ndarray:
    """One clip -> mono float32 [n] at ``sampling_rate`` (see the module doc). Refused with an
    `AudioError` naming ``where`` / ``column``: unreadable or cut short (WAV, RF64, Wave64, AIFF, AU: by
    their header, `mmpipe.audio.headers`), no rate or one outside
    `MIN_RATE`..`MAX_RATE` Hz (a rate in kHz), zero samples, non-finite samples, or over
    ``max_samples`` (> 0: what the feature extractor takes; a longer clip would be cut; a file over it
    by its header is refused before it is decoded)."""
    wave, rate = _wave(value, where, column, (int(max_samples or 0), int(sampling_rate)))
    if not MIN_RATE <= rate <= MAX_RATE:  # e.g. a rate in kHz: 16 would upsample the clip 1000x, silently
        raise AudioError(f"a sampling rate of {rate} Hz is no audio rate", where=where, column=column,
                         expected=f"a rate in Hz between {MIN_RATE} and {MAX_RATE} (16000, 44100, 48000...)",
                         found=f"{rate} Hz for {wave.size} samples",
                         fix="give the rate in Hz (16000, not 16), or re-export the file with its true rate")
    return checked_wave(_resampled(wave, rate, int(sampling_rate)), sampling_rate, where=where, column=column,
                        max_samples=max_samples)


def audio_source(value: Any, wave: np.ndarray, sampling_rate: int) -> bytes:
    """What ``audio="source"`` stores for one clip: its encoded file as given (a path's bytes,
    bytes, a ``{"path", "bytes"}`` dict's), which `load_audio` decodes again to ``wave`` bit for
    bit; for a clip given as samples, ``wave`` (the loaded float32 samples at ``sampling_rate``)
    as a 32-bit float WAV, which reads back exactly."""
    if isinstance(value, dict) and value.get("array") is None:
        value = value.get("bytes") if value.get("bytes") is not None else value.get("path")
    value = _data_uri(value)
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
