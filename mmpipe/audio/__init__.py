"""Audio clips for the models that take them (the Omni thinkers, Gemma 3n, Phi-4-multimodal on the
generic path): `load_audio` turns a row's clip (a path, bytes, a ``datasets.Audio`` value, an
array with its sampling rate) into the mono float32 waveform the processor's feature extractor
takes, at its sampling rate, checked (`mmpipe.errors.AudioError`)."""

from mmpipe.audio.load import AUDIO_ITEM_KEYS, audio_source, load_audio

__all__ = ["AUDIO_ITEM_KEYS", "audio_source", "load_audio"]
