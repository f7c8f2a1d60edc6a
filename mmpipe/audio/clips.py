"""A row's audio clips and a processor's own call: what any path that hands clips to a processor
(its feature extractor, `audio_extractor`) needs, whatever kind of family it is.

- `load_clips`: the row's clips -> mono float32 waveforms at the extractor's sampling rate
  (`load_audio`), a clip longer than the processor's call takes (`clip_limit`) or shorter than one
  analysis window of its extractor (`clip_window`) refused;
- `call_kwargs`: the call's ``audio=`` / ``sampling_rate=`` keywords; `clip_files`: each clip's file
  for a row stored with ``audio="source"``;
- `audio_outputs`: the audio outputs of a row stored with ``audio="source"`` (its clips' files),
  computed again at collate as encode computed them;
- `stored_sources`: such a row's stored ``audio_sources`` column, checked;
- `warn_padded_audio`: the one warning where a batch pads audio features of several lengths.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any, Optional, Sequence

import numpy as np

from mmpipe._fork import torch_fork_safe
from mmpipe.audio.checks import too_short
from mmpipe.audio.load import audio_extractor, audio_source, load_audio
from mmpipe.errors import ArgumentError, InputError
from mmpipe.records.columns import from_arrow_scalar

__all__ = ["audio_outputs", "call_kwargs", "clip_files", "clip_limit", "clip_window", "load_clips", "stored_sources",
           "warn_padded_audio"]

logger = logging.getLogger("mmpipe")


def clip_limit(processor, fe) -> int:
    """The most samples a clip may hold where the processor's call cuts longer ones (0: no limit).

    The call's audio keywords as transformers merges them (the processor's ``audio_kwargs``, then its
    kwargs class ``_defaults``) over the extractor's own ``__call__`` defaults: with ``truncation`` on,
    ``max_length`` samples, else the extractor's ``n_samples``. Whisper's (Qwen2.5-Omni) cuts at
    ``n_samples`` (30 s); Gemma 3n's and Gemma 4's at ``max_length=480000`` (30 s: a 60 s clip gave
    its first 30 s's features and tokens, silently); Qwen3-Omni's call sets ``truncation=False`` and
    Phi-4-multimodal's extractor does not truncate (0)."""
    kw = dict(getattr(processor, "audio_kwargs", None) or {})
    defaults = getattr(getattr(processor, "valid_processor_kwargs", None), "_defaults", None) or {}
    kw.update(defaults.get("audio_kwargs", None) or {})
    try:
        params = inspect.signature(type(fe).__call__).parameters
    except (TypeError, ValueError):
        params = {}

    def default(name):
        p = params.get(name)
        return None if p is None or p.default is inspect.Parameter.empty else p.default

    if not kw.get("truncation", default("truncation")):
        return 0
    return int(kw.get("max_length") or default("max_length") or getattr(fe, "n_samples", 0) or 0)


def clip_window(fe) -> int:
    """Samples of one analysis window of the feature extractor (``win_length``: Phi-4-multimodal's 400;
    ``n_fft``: Whisper's 400, the Omni thinkers'; ``frame_length`` + 1: Gemma 3n's 513, Gemma 4's 321,
    whose extractors unfold one sample more than a frame for pre-emphasis: Gemma 3n's gave a 512-sample
    clip no feature frame under its audio tokens), 0 when it names none."""
    for name in ("win_length", "frame_length", "n_fft"):
        value = getattr(fe, name, None)
        if isinstance(value, (int, np.integer)) and value > 0:
            return int(value) + (name == "frame_length")
    return 0


def load_clips(processor, audios: Sequence, where: str, *, column: str = "audios") -> list:
    """The row's clips -> mono float32 waveforms at the feature extractor's sampling rate
    (`mmpipe.audio.load_audio`); a clip longer than the processor's call takes (`clip_limit`) refused
    where that call would cut it, and one shorter than one analysis window (`clip_window`, 25 ms at
    16 kHz for Whisper's): such a clip gives Qwen2.5-Omni no audio token (the model never hears it,
    silently) and crashes Qwen3-Omni's and Phi-4-multimodal's extractors. ``processor`` has an
    extractor. In a forked worker torch is set to one thread first (`mmpipe._fork.torch_fork_safe`):
    Whisper's extractor runs a torch STFT, which hung ``datasets.map(num_proc=2)`` once the parent
    had run one (e.g. a first `encode_row` to look at a row)."""
    fe = audio_extractor(processor)
    limit, window, rate = clip_limit(processor, fe), clip_window(fe), int(fe.sampling_rate)
    if len(audios):  # the extractor's torch STFT follows: in a forked map worker it deadlocks otherwise
        torch_fork_safe()
    waves = []
    for i, a in enumerate(audios):
        wave = load_audio(a, rate, where=f"{where}, audio {i}", column=column, max_samples=limit)
        if wave.size < window:
            too_short(wave.size, rate, window, type(fe).__name__, f"{where}, audio {i}", column)
        waves.append(wave)
    return waves


def clip_files(processor, audios: Sequence, waves: Sequence) -> list[bytes]:
    """What a row stored with ``audio="source"`` keeps of each clip (`mmpipe.audio.audio_source`):
    its encoded file as given, or for a clip given as samples the float32 WAV of its loaded wave."""
    rate = int(audio_extractor(processor).sampling_rate)
    return [audio_source(a, w, rate) for a, w in zip(audios, waves)]


def call_kwargs(processor, audios: Sequence) -> dict:
    """``audio=`` (and the rate they are at: ``sampling_rate=``) for a call with clips; a processor
    without audio never sees the keywords."""
    if not len(audios):
        return {}
    return {"audio": list(audios), "sampling_rate": int(audio_extractor(processor).sampling_rate)}


def audio_outputs(processor, keys: Sequence[str], sources: list, where: str = "row") -> dict:
    """The audio outputs ``keys`` (`ProcessorLayout.audio`) of a row stored with ``audio="source"``:
    its clips decoded as at encode (`mmpipe.audio.load_audio`) and run through the processor's own
    call together (its padding is per call), under a text of one audio token per clip; the same
    arrays encode would have stored."""
    fe = audio_extractor(processor)
    if fe is None:
        raise ArgumentError(f"{type(processor).__name__} has no audio feature extractor: collate rows encoded with "
                            "audio='source' with the processor that encoded them")
    rate = int(fe.sampling_rate)
    torch_fork_safe()  # the extractor's torch STFT: a forked worker (datasets.map, a Pool) deadlocks otherwise
    waves = [load_audio(b, rate, where=f"{where}, audio {i}") for i, b in enumerate(sources)]
    token = getattr(processor, "audio_token", None) or getattr(getattr(processor, "tokenizer", None), "audio_token")
    out = processor(text=[token * len(waves)], audio=waves, sampling_rate=rate, return_tensors="np")
    return {k: np.asarray(out[k]) for k in keys if k in out and np.asarray(out[k]).size}


def stored_sources(value: Any, row: Any = None) -> Optional[list]:
    """A stored ``audio_sources`` value -> each clip's file bytes, or None (none stored); anything
    else is an `InputError` naming the row and the column."""
    value = from_arrow_scalar(value)
    if value is None:
        return None
    if not (isinstance(value, (list, tuple, np.ndarray)) and all(isinstance(b, (bytes, bytearray)) for b in value)):
        raise InputError("column 'audio_sources' must hold a list of audio file bytes", row=row, column="audio_sources",
                         stage="validate", expected="list<binary>", found=type(value).__name__,
                         fix="re-encode the row with mmpipe.encode(..., audio='source')")
    return [bytes(b) for b in value]


AUDIO_PADDING_WARNED: set = set()  # processor classes warned about (once per process)


def warn_padded_audio(processor_class: str, frames: set) -> None:
    """Audio features of different frame counts in one batch (``frames``: their shapes past axis 0)
    are padded to the longest, as the processor's own batch call pads them; an audio encoder that
    convolves over the padded frames (Gemma 3n's, Phi-4-multimodal's) then gives a row other logits
    than alone (measured on tiny models: 0.48 and 4.0e-3, the processor's own batch alike;
    Qwen2.5-Omni pads every clip to 30 s, Qwen3-Omni's encoder drops the padded frames:
    `mmpipe.families.MASKED_AUDIO`, measured 1.5e-7). Logged once per processor class."""
    from mmpipe.families import MASKED_AUDIO

    cls = processor_class
    if len(frames) > 1 and cls not in AUDIO_PADDING_WARNED and cls not in MASKED_AUDIO:
        AUDIO_PADDING_WARNED.add(cls)
        logger.warning("mmpipe: %s batch with audio features of %d shapes %s: they are padded to the largest, "
                       "and an audio encoder that convolves over padded frames (Gemma 3n's, Phi-4-multimodal's) gives "
                       "rows other logits than alone (as with the processor's own batch); batch clips of equal length "
                       "for per-row results, or check with mmpipe.testing.invariants.assert_batched_logits_match",
                       cls, len(frames), sorted(frames)[:6])
