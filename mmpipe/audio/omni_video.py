"""Videos with their sound for the Omni thinkers (Qwen2.5-Omni, Qwen3-Omni): what transformers
5.24's processor needs with ``use_audio_in_video`` and what the encode must equal.

The processor (``OmniModalProcessorMixin.__call__``, ``load_audio_from_video=True``; the old
``use_audio_in_video=True`` keyword is mapped to it with a deprecation warning):

- takes the decoded sound tracks as ``audio=`` with ``audio_from_video_indices`` (one entry per
  audio slot, in the order the audio placeholders appear in the text: ``None`` for a standalone
  clip, ``i`` for the sound of ``videos[i]``); given no sound for a video it decodes the file itself
  with torchcodec (>= 0.17), which the chat path (``apply_chat_template(load_audio_from_video=True)``)
  always does: without a usable torchcodec both refuse (``ImportError``);
- leaves the text's video placeholder ``<|vision_bos|><|VIDEO|><|vision_eos|>`` (Qwen2.5-Omni; Qwen3-Omni:
  ``<|vision_start|><|video_pad|><|vision_end|>``) and replaces the video token with the interleaved
  run `interleaved_placeholder` builds: the audio-start token, then per chunk of ``seconds_per_chunk``
  (2 s) the video tokens of the temporal patches starting in it (a patch at
  ``t * video_second_per_grid * position_id_per_seconds`` positions) followed by the chunk's audio
  tokens (``position_id_per_seconds * seconds_per_chunk`` per chunk), then the audio-end token. The
  video's sound has no audio placeholder of its own in the text;
- returns the usual outputs (``input_features`` / ``feature_attention_mask`` of every clip in slot
  order, ``pixel_values_videos``, ``video_grid_thw``, ``video_second_per_grid``); nothing says
  that a video carries its sound: the model is told by ``use_audio_in_video=True`` at forward, a
  flag for the whole batch, and its ``get_rope_index`` then counts a video as one opened by
  ``<vision start><audio start>`` and gives the video and audio tokens of one chunk their own
  time positions (TMRoPE). A batch (or a row) mixing videos with and without sound has no
  correct flag: `position_ids` computes each row's positions with the row's own flag instead.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mmpipe.errors import ArgumentError, AudioError

__all__ = ["call_kwargs", "chunked_index", "interleaved_placeholder", "position_ids"]


def call_kwargs(order: Sequence[str], audios: Sequence, video_audios: Sequence, processor=None) -> dict:
    """The processor's audio keywords for one row with ``use_audio_in_video``: ``order`` names the
    row's audio and video items as its text holds them ("audio" / "video"); ``audios`` the
    standalone clips, ``video_audios`` each video's sound (mono float32 at the extractor's rate,
    `mmpipe.audio.load_video_audio`). Returns ``audio`` (all clips in placeholder order) and, for a
    processor of the omni-modal API (transformers >= 5.2x, `takes_video_audio_indices`; None: that
    API), ``audio_from_video_indices`` and ``load_audio_from_video=True``; for an older one
    ``use_audio_in_video=True``, which takes the next clip for every video (the same ids and outputs
    for the same clips in the same order). A video without sound (None) is refused: the model's one
    flag cannot position it next to videos with sound."""
    n_audio, n_video = order.count("audio"), order.count("video")
    if n_audio != len(audios) or n_video != len(video_audios):
        raise AudioError("the row's audio / video items do not match its clips", column="videos",
                         expected=f"{n_audio} clips and {n_video} videos", found=f"{len(audios)} clips and "
                         f"{len(video_audios)} videos", fix="give one clip per audio item and one video per video item")
    clips, slots, a, v = [], [], iter(audios), 0
    for kind in order:
        if kind == "audio":
            clips.append(next(a))
            slots.append(None)
        elif kind == "video":
            wave = video_audios[v]
            if wave is None:
                # no `where`: the caller's locate(row=...) then names the row in the message
                raise AudioError(f"use_audio_in_video: video {v} of this row has no sound",
                                 column="videos", expected="a sound track for every video", found="none",
                                 fix="encode the row with use_audio_in_video=False, or drop the silent video")
            clips.append(wave)
            slots.append(v)
            v += 1
        else:
            raise ArgumentError(f"order holds 'audio' / 'video', not {kind!r}")
    if processor is not None and not takes_video_audio_indices(processor):
        return {"audio": clips, "use_audio_in_video": True}
    return {"audio": clips, "audio_from_video_indices": slots, "load_audio_from_video": True}


def takes_video_audio_indices(processor) -> bool:
    """Whether ``processor`` is of transformers' omni-modal processor API (``OmniModalProcessorMixin``:
    ``audio_from_video_indices`` / ``load_audio_from_video``, transformers 5.24); the older Omni
    processors (5.19) take ``use_audio_in_video=True`` and ignore those keywords (silently: the
    video would lose its sound)."""
    return any(c.__name__ == "OmniModalProcessorMixin" for c in type(processor).__mro__)


def chunked_index(token_indices: np.ndarray, tokens_per_chunk: int) -> list[tuple[int, int]]:
    """(start, end) of the runs of ``token_indices`` (increasing time positions) that fall in
    ``[k * tokens_per_chunk, (k + 1) * tokens_per_chunk)``, as the processor and ``get_rope_index`` split them
    (an empty chunk between two occupied ones gives an empty run; one run at least)."""
    out, start, chunk = [], 0, 1
    for i, value in enumerate(np.asarray(token_indices).tolist()):
        if value >= chunk * tokens_per_chunk:
            out.append((start, i))
            start, chunk = i, chunk + 1
    out.append((start, len(token_indices)))
    return out


def interleaved_placeholder(grid_thw: Sequence[int], second_per_grid: float, n_audio_tokens: int, *,
                            merge_size: int, video_token: str, audio_token: str, audio_bos: str, audio_eos: str,
                            position_id_per_seconds: float = 25, seconds_per_chunk: float = 2.0,
                            layout: str = "chunks") -> str:
    """What the processor puts in place of one video's token when the video carries its sound
    (``replace_video_with_audio_token``): ``audio_bos``, the video's and its sound's tokens, ``audio_eos``.
    ``layout="chunks"`` (Qwen2.5-Omni, 25 positions a second): chunk by chunk of ``seconds_per_chunk``,
    that chunk's video tokens then its audio tokens. ``layout="time"`` (Qwen3-Omni, 13 a second):
    merged by time position, a video token before an audio token of the same or a later position
    (audio token i sits at i). ``grid_thw``: the video's grid; ``n_audio_tokens``: its sound's
    audio tokens (the processor's ``num_audio_tokens``)."""
    t, h, w = (int(x) for x in grid_thw)
    per_frame = (h // merge_size) * (w // merge_size)
    video_idx = np.repeat(np.arange(t), per_frame) * float(second_per_grid) * position_id_per_seconds
    if layout == "time":
        n_v, n_a, parts, i, j = len(video_idx), int(n_audio_tokens), [audio_bos], 0, 0
        while i < n_v and j < n_a:
            if video_idx[i] <= j:
                parts.append(video_token)
                i += 1
            else:
                parts.append(audio_token)
                j += 1
        parts += [video_token * (n_v - i), audio_token * (n_a - j), audio_eos]
        return "".join(parts)
    if layout != "chunks":
        raise ArgumentError(f"layout is 'chunks' or 'time', not {layout!r}")
    per_chunk = int(position_id_per_seconds * seconds_per_chunk)
    vchunks = chunked_index(video_idx, per_chunk)
    achunks = chunked_index(np.arange(int(n_audio_tokens)), per_chunk)
    parts = [audio_bos]
    for j in range(max(len(vchunks), len(achunks))):
        if j < len(vchunks):
            parts.append(video_token * (vchunks[j][1] - vchunks[j][0]))
        if j < len(achunks):
            parts.append(audio_token * (achunks[j][1] - achunks[j][0]))
    parts.append(audio_eos)
    return "".join(parts)


def position_ids(model, outputs: dict, *, use_audio_in_video: bool = True):
    """The thinker's TMRoPE positions [3, B, L] for processor ``outputs`` (one row or a batch the
    processor made) with ``use_audio_in_video``: ``model.get_rope_index`` with the audio lengths
    (``feature_attention_mask.sum(-1)``) and ``video_second_per_grid``, as the model's forward
    computes them when given ``use_audio_in_video=True``. Per row, so rows with and without sound
    can share a batch once their positions are stored."""
    import torch

    def t(name):
        v = outputs.get(name)
        return None if v is None else torch.as_tensor(np.asarray(v))

    mask = t("feature_attention_mask")
    pos, _ = model.get_rope_index(t("input_ids"), t("image_grid_thw"), t("video_grid_thw"), t("attention_mask"),
                                  use_audio_in_video, None if mask is None else mask.sum(-1),
                                  t("video_second_per_grid"))
    return pos
