"""vLLM prompts for generic-path rows of the Omni thinkers (`SERVED`: Qwen2.5-Omni, Qwen3-Omni): images,
audio clips and videos with their sound.

A row encoded by the processor's own call holds its training ids with every placeholder expanded
(one audio token per encoder frame, one image token per merged patch) and the processor's
outputs, not the media vLLM takes. Its vLLM prompt is

- ``"prompt_token_ids"``: the training ids with each run of image tokens and each run of audio
  tokens collapsed to ONE token (vLLM's processor expands it again from the media: the same
  image processor and feature extractor give the same counts);
- ``"multi_modal_data"``: ``{"image": [PIL RGB, ...], "audio": [(float32 [n], rate), ...]}``, the row's
  images and clips in placeholder order: the clips decoded from the stored sources (``audio="source"``)
  or given (``audios=``, any form `mmpipe.audio.load_audio` takes), loaded as at encode (mono,
  the extractor's rate), the images given (``images=``, what the row was encoded from) or stored
  (``pixels="source"``), decoded as at encode (`mmpipe.images.load.decoded_rgb`: EXIF-upright RGB).

vLLM then gives back exactly the training ids (checked: tests/rollout/test_omni_vllm.py, vLLM 0.32
CPU, tiny Qwen2.5-Omni and Qwen3-Omni thinkers; vLLM's greedy tokens == the transformers thinker's).

Rows encoded with ``use_audio_in_video`` (the generic path's only videos) take the video files they were
encoded from (``videos=``, `video_prompt`): each video's frames are sampled again as at encode and its
sound loaded again, and `video_sound_prompt` collapses each video's interleaved run to one video token
(``mm_processor_kwargs``: ``use_audio_in_video``, the sampling ``fps`` and ``second_per_grid_ts``); vLLM
0.32 takes no standalone clips next to such videos. Other generic-path processors are refused (their
vLLM placeholder rules differ, or are not checked against vLLM).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, PlaceholderError

__all__ = ["SERVED", "check_served", "collapse_runs", "media_token_ids", "served_class", "video_prompt",
           "video_sound_prompt", "vllm_prompt"]

# which processors these prompts are built for: the Omni thinker processors (Qwen2.5-Omni's, Qwen3-Omni's), the
# transformers processors that split a video's sound into time chunks (`get_chunked_index`) and name audio
# and vision border tokens; their prompts are checked against real vLLM (tests/rollout/test_omni_vllm.py).
# Other generic-path processors (Gemma 3n, Phi-4-multimodal, Llama 4, Kimi) have other vLLM rules: refused.
SERVED = "the Omni thinker processors (Qwen2.5-Omni, Qwen3-Omni)"
NOT_SERVED = ("the generic path (a processor without a mmpipe family table) has no vLLM prompt rule but the "
              f"Omni thinkers' (vLLM prompts are built for {SERVED} only); generate with mmpipe.rollout.TransformersEngine, train on its rows with "
              "mmpipe.Collator(processor), or add a family row for its processor class (mmpipe.families) to "
              "roll it out")
_SERVED_NAMES = ("get_chunked_index", "audio_bos_token", "audio_eos_token", "audio_token", "image_token",
                 "video_token")


def served_class(processor) -> str | None:
    """The class name of ``processor`` when it is one `SERVED` (its stock class, or an offline subclass
    of it), else None."""
    if all(getattr(processor, n, None) is not None for n in _SERVED_NAMES):
        return type(processor).__name__
    return None


def check_served(processor, *, row: Optional[int] = None, stage: str = "vllm_prompts") -> None:
    """`mmpipe.rollout.support.RolloutRefusal` (naming ``row`` when given) unless ``processor`` is one
    `SERVED`: the refusal the generic path gave every processor before, worded as `check_rollout` words it."""
    if served_class(processor) is not None:
        return
    from mmpipe.rollout.support import ROLLOUT_STAGES, RolloutRefusal

    where = "" if row is None else f"row {row}: "
    raise RolloutRefusal(f"{where}{ROLLOUT_STAGES[stage]} are not available for generic rows: {NOT_SERVED} (not "
                         f"{type(processor).__name__})", stage=stage, family="generic", row=row)


def media_token_ids(processor) -> dict:
    """``{"image": id, "audio": id, "video": id}`` of the processor's media tokens (those it names)."""
    tok = getattr(processor, "tokenizer", processor)
    out = {}
    for kind in ("image", "audio", "video"):
        token_id = getattr(processor, f"{kind}_token_id", None)
        if token_id is None:
            token = getattr(processor, f"{kind}_token", None) or getattr(tok, f"{kind}_token", None)
            token_id = tok.convert_tokens_to_ids(token) if token else None
        if token_id is not None:
            out[kind] = int(token_id)
    return out


def collapse_runs(ids, token_ids: dict) -> tuple[np.ndarray, dict]:
    """``ids`` with each run of one media token collapsed to one token; returns (the ids, per kind
    the runs' lengths in order)."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    by_id = {v: k for k, v in token_ids.items()}
    keep = np.ones(len(ids), bool)
    runs: dict = {k: [] for k in token_ids}
    i = 0
    while i < len(ids):
        kind = by_id.get(int(ids[i]))
        if kind is None:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == ids[i]:
            j += 1
        keep[i + 1:j] = False
        runs[kind].append(j - i)
        i = j
    return ids[keep], runs


def vllm_prompt(r, processor: Any, *, tokenizer: Any = None, images: Optional[Sequence] = None,
                audios: Optional[Sequence] = None, videos: Optional[Sequence] = None, video_options: Any = None,
                index: int = 0) -> dict:
    """One generic-path row (`MultiModalInputs`) of an Omni thinker -> its vLLM prompt dict (see the
    module doc). ``processor``: the one the row was encoded with (its media tokens, its extractor's
    rate); ``images`` / ``audios``: the row's originals where the row does not store its sources.
    A row encoded with ``use_audio_in_video`` (video tokens in its ids) takes ``videos``: the video
    files it was encoded from, in order (`video_prompt`). `ArgumentError` naming the row when a
    medium is missing or its count differs from the row's placeholders."""
    from mmpipe.audio import audio_extractor, load_audio

    del tokenizer  # the ids are the row's own
    check_served(processor, row=index)  # None too: the processor the row was encoded with is needed
    token_ids = media_token_ids(processor)
    if token_ids.get("video") is not None and (np.asarray(r.input_ids) == token_ids["video"]).any():
        return video_prompt(r, processor, videos, video_options=video_options, images=images, index=index)
    if videos:
        raise ArgumentError(f"row {index}: {len(videos)} videos given for a row without video tokens; pass videos= "
                            "only for rows encoded with use_audio_in_video=True, in their order")
    ids, runs = collapse_runs(r.input_ids, token_ids)
    prompt: dict = {"prompt_token_ids": [int(t) for t in ids]}
    data: dict = {}
    if runs.get("image"):
        data["image"] = _row_images(r, len(runs["image"]), images, index)
    n_audios = len(runs.get("audio", []))
    if n_audios:
        if audios is not None and not isinstance(audios, (list, tuple)):
            raise ArgumentError(f"row {index}: audios= holds one list of clips per row, got {type(audios).__name__}")
        given = audios if audios is not None else r.audio_sources
        if given is None or len(given) != n_audios:
            raise ArgumentError(f"row {index}: {n_audios} audio placeholders; pass audios= (the row's clips) or "
                                f"encode with audio='source' (got {'none' if given is None else len(given)})")
        rate = int(audio_extractor(processor).sampling_rate)
        data["audio"] = [(load_audio(a, rate, where=f"row {index}, audio {k}"), rate) for k, a in enumerate(given)]
    if data:
        prompt["multi_modal_data"] = data
    return prompt


def _row_images(r, n_images: int, images: Optional[Sequence], index: int) -> list:
    """The row's ``n_images`` images for vLLM (PIL RGB): ``images`` as given, else its stored sources."""
    given = images if images is not None else r.image_sources
    if given is None or len(given) != n_images:
        raise ArgumentError(f"row {index}: {n_images} image placeholders; pass images= (the images the row was "
                            f"encoded from) or encode with pixels='source' (got "
                            f"{'none' if given is None else len(given)})")
    from mmpipe.images.load import decoded_rgb

    # what the encode handed the processor: the whole file decoded, EXIF-upright, RGB
    return [decoded_rgb(im, where=f"row {index}, image {k}") for k, im in enumerate(given)]


def video_prompt(r, processor: Any, videos: Optional[Sequence], *, video_options: Any = None,
                 images: Optional[Sequence] = None, index: int = 0) -> dict:
    """The vLLM prompt of a row encoded with ``use_audio_in_video`` (`mmpipe.Encoder`): each video's
    frames sampled from its file again as at encode and its sound loaded again
    (`mmpipe.encoding.video_sound.load_videos`), at the row's own rate (``temporal_patch_size /
    video_second_per_grid``) or by ``video_options`` as given at encode; the ids collapsed by
    `video_sound_prompt`; ``mm_processor_kwargs`` also carries that ``fps`` and, per video, its
    ``second_per_grid_ts`` (what vLLM's Qwen2.5-Omni processor times the interleaved chunks by).
    `ArgumentError` naming the row: no ``videos``, another count than the row's, frames sampled to
    another grid than the row's (other ``video_options`` than at encode)."""
    from mmpipe.audio import audio_extractor
    from mmpipe.encoding.video_sound import frames_fps, load_videos
    from mmpipe.encoding.videos import video_options as as_options

    vision = getattr(r, "vision", None) or {}
    grids = np.asarray(vision.get("video_grid_thw", np.zeros((0, 3))), np.int64).reshape(-1, 3)
    per_grid = np.asarray(vision.get("video_second_per_grid", np.zeros(0)), np.float64).reshape(-1)
    if not len(grids):
        raise PlaceholderError(f"row {index}: video tokens in a generic-path row without video outputs "
                               "(video_grid_thw)", row=index, expected="video outputs for its video tokens",
                               found="none", fix="re-encode the row with mmpipe.Encoder(processor, use_audio_in_video=True)")
    if videos is None or isinstance(videos, (str, bytes)) or len(videos) != len(grids):
        got = "none" if videos is None else (type(videos).__name__ if isinstance(videos, (str, bytes)) else len(videos))
        raise ArgumentError(f"row {index}: {len(grids)} videos with their sound; pass videos= (the row's video files, "
                            f"in order, as encoded with use_audio_in_video=True; got {got})")
    temporal = int(getattr(processor.video_processor, "temporal_patch_size", 2))
    opts = as_options(video_options)
    row_fps = [temporal / float(s) for s in per_grid]
    if video_options is None and row_fps:
        opts = as_options({"fps": row_fps[0]})
    fps = frames_fps(opts)
    if any(abs(f - fps) > 1e-6 * fps for f in row_fps):
        raise ArgumentError(f"row {index}: video_options fps {fps} differs from the {row_fps[0]:g} frames a second the "
                            "row was encoded at; pass the video_options given at encode")
    check_whole_time_positions(processor, temporal / fps, fps, index)
    frames, sounds = load_videos(videos, opts, int(audio_extractor(processor).sampling_rate), f"row {index}")
    for k, (clip, grid) in enumerate(zip(frames, grids)):
        if -(-len(clip) // temporal) != int(grid[0]):
            raise ArgumentError(f"row {index}, video {k}: {len(clip)} frames sampled at {fps:g} a second make "
                                f"{-(-len(clip) // temporal)} temporal grids, the row holds {int(grid[0])}; pass "
                                "the video_options (fps, min_frames, max_frames) given at encode")
    prompt = video_sound_prompt(r.input_ids, processor, frames, sounds, index=index)
    n_images = prompt["prompt_token_ids"].count(media_token_ids(processor).get("image", -1))
    if n_images:
        prompt["multi_modal_data"]["image"] = _row_images(r, n_images, images, index)
    prompt["mm_processor_kwargs"].update(fps=fps, second_per_grid_ts=[temporal / fps] * len(frames))
    return prompt


def check_whole_time_positions(processor: Any, second_per_grid: float, fps: float, index: int) -> None:
    """`RolloutRefusal` naming row ``index`` when vLLM would place the row's video tokens elsewhere than
    training did: a processor of `mmpipe.families.VLLM_FLOORED_TIME` (its thinker in vLLM 0.32 rounds
    a video's time positions, grid index x seconds per grid x position ids a second, down to whole
    numbers before interleaving the sound; transformers keeps them fractional) whose videos were
    sampled at a rate that makes a temporal grid last a fractional number of position ids (Qwen3-Omni
    at 4 fps: 6.5; Qwen2.5-Omni's 2 s chunks agree either way). Measured on vLLM 0.32 CPU with a tiny
    Qwen3-Omni thinker: the same ids, but prompt logprobs 0.12 apart at 4 fps against 1e-5 at 2 fps
    (tests/rollout/test_omni_vllm.py)."""
    from mmpipe.families import VLLM_FLOORED_TIME, processor_class_name

    per_second = VLLM_FLOORED_TIME.get(processor_class_name(processor))
    if per_second is None:
        return
    step = second_per_grid * per_second
    if abs(step - round(step)) > 1e-6:
        from mmpipe.rollout.support import RolloutRefusal

        raise RolloutRefusal(
            f"row {index}: its videos were sampled at {fps:g} frames a second, so each temporal grid lasts "
            f"{step:g} position ids; vLLM 0.32's {type(processor).__name__.replace('NoVideo', '')} thinker rounds "
            "those down before interleaving the sound, transformers does not, and rollouts would not see the "
            "training row's positions; encode rows for vLLM at 2 (or 1) frames a second "
            "(video_options={'fps': 2.0}), or generate with mmpipe.rollout.TransformersEngine",
            stage="vllm_prompts", family="generic", row=index)


def video_sound_prompt(input_ids, processor: Any, videos: Sequence, video_audios: Sequence, *,
                       index: int = 0) -> dict:
    """The vLLM prompt of ids the processor gave with ``use_audio_in_video`` (`mmpipe.audio.omni_video`):
    each ``<audio start> ... <audio end>`` run inside a video block (video and audio tokens interleaved)
    collapsed to one video token, image runs to one image token; ``multi_modal_data`` ``{"video": videos
    (frames uint8 [T, H, W, 3], as given to the processor), "audio": [(sound, rate)], "image": ...}`` and
    ``mm_processor_kwargs={"use_audio_in_video": True}``. vLLM 0.32 takes one sound per video and no
    standalone clip beside them ("use_audio_in_video requires equal number of audio and video items"):
    a row with standalone audio runs is refused (`ArgumentError`)."""
    from mmpipe.audio import audio_extractor

    check_served(processor, row=index)
    tok = getattr(processor, "tokenizer", processor)
    token_ids = media_token_ids(processor)
    a_bos, a_eos = (tok.convert_tokens_to_ids(getattr(processor, n)) for n in ("audio_bos_token", "audio_eos_token"))
    ids = [int(t) for t in np.asarray(input_ids).reshape(-1)]
    out, i, n_video = [], 0, 0
    while i < len(ids):
        if ids[i] == a_bos and i + 1 < len(ids) and ids[i + 1] == token_ids["video"]:  # a video with its sound
            end = ids.index(a_eos, i)
            out.append(token_ids["video"])
            n_video += 1
            i = end + 1
        else:
            out.append(ids[i])
            i += 1
    collapsed, runs = collapse_runs(out, {k: v for k, v in token_ids.items() if k != "video"})
    if runs.get("audio"):
        raise ArgumentError(f"row {index}: {len(runs['audio'])} standalone audio clips beside videos with their "
                            "sound; vLLM takes one sound per video and no other clip with use_audio_in_video")
    if n_video != len(videos) or len(video_audios) != len(videos):
        raise ArgumentError(f"row {index}: {n_video} videos with sound in the ids, {len(videos)} videos and "
                            f"{len(video_audios)} sounds given")
    rate = int(audio_extractor(processor).sampling_rate)
    data: dict = {"video": list(videos), "audio": [(np.asarray(w, np.float32), rate) for w in video_audios]}
    return {"prompt_token_ids": [int(t) for t in collapsed], "multi_modal_data": data,
            "mm_processor_kwargs": {"use_audio_in_video": True}}
