"""Audio clips for the models that take them (the Omni thinkers, Gemma 3n, Phi-4-multimodal on the
generic path): `load_audio` turns a row's clip (a path, bytes, a ``datasets.Audio`` value, an
array with its sampling rate) into the mono float32 waveform the processor's feature extractor
takes, at its sampling rate, checked (`mmpipe.errors.AudioError`); `load_video_audio` does the
same for a video's sound track (``use_audio_in_video``), `has_audio_stream` says whether it has one."""

from mmpipe.audio.checks import checked_wave
from mmpipe.audio.load import AUDIO_ITEM_KEYS, audio_extractor, audio_source, load_audio
from mmpipe.audio.video import has_audio_stream, load_video_audio

__all__ = ["AUDIO_ITEM_KEYS", "audio_extractor", "audio_source", "checked_wave", "has_audio_stream", "load_audio", "load_video_audio"]
