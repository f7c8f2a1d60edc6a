"""vLLM prompts of rows whose videos carry their sound (``Encoder(use_audio_in_video=True)``), built by
`mmpipe.rollout.to_vllm_prompts(rows, processor, videos=...)` for the tiny Qwen2.5-Omni and Qwen3-Omni
thinkers (vision environment: their video processor needs torchvision):

- each video's interleaved run collapses to one video token, and expanding it again by the thinker's
  own rule (`mmpipe.audio.omni_video.interleaved_placeholder`, from the row's grid, its rate and its
  sound's token count) gives the training ids back; image and clip runs likewise;
- the frames handed to vLLM are the frames the encode sampled (qwen-vl-utils' rule at the row's own
  rate, read back from ``video_second_per_grid``), the sound is the video's own, and
  ``mm_processor_kwargs`` carries ``use_audio_in_video``, the rate and ``second_per_grid_ts``;
- missing videos, another count, other sampling options than at encode, ``videos=`` for rows of a
  family that stores its frames: typed errors naming the row.
(Real vLLM expanding these prompts: tests/rollout/test_omni_vllm.py, vllm environment.)"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.needs_env("vision")
av = pytest.importorskip("av")

import mmpipe  # noqa: E402
from mmpipe.audio import load_video_audio  # noqa: E402
from mmpipe.audio.omni_video import interleaved_placeholder  # noqa: E402
from mmpipe.audio.samples import tone  # noqa: E402
from mmpipe.errors import ArgumentError  # noqa: E402
from mmpipe.rollout import to_vllm_prompts  # noqa: E402
from mmpipe.rollout.processor_prompts import media_token_ids  # noqa: E402
from audio_rows import write_videos  # noqa: E402

RATE = 16000


@pytest.fixture(scope="module", params=["qwen_omni", "qwen3_omni"])
def proc(request):
    import importlib

    return importlib.import_module(f"mmpipe.offline.{request.param}").build_processor(videos=True)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_videos(tmp_path_factory.mktemp("prompt-videos"), {"a.mkv": (3.0, 4, "mkv", RATE, 2, 1),
                                                                   "b.mp4": (2.0, 4, "mp4", 44100, 1, 2)})


def _raws(files) -> list[dict]:
    user = lambda *items: {"role": "user", "content": list(items)}  # noqa: E731
    text = lambda t: {"type": "text", "text": t}  # noqa: E731
    photo = mmpipe.testing.tiny_image(60, 80, seed=1)
    return [
        {"messages": [user({"type": "video"}, text("What happens?"))], "videos": [files["a.mkv"]]},
        {"messages": [user({"type": "video"}, {"type": "image"}, text("Both?")), {"role": "assistant", "content": "Yes."},
                      user({"type": "video"}, text("And this one?"))],
         "videos": [files["b.mp4"], files["a.mkv"]], "images": [photo]},
        {"messages": [user(text("Say hi."))]},
    ]


def _expand(proc, prompt: dict, row) -> list[int]:
    """``prompt``'s ids with each collapsed token expanded again: a video by the thinker's interleaving
    rule (its grid, its rate, its sound's token count), an image by its merged patches."""
    ids = media_token_ids(proc)
    qwen3 = "Qwen3" in type(proc).__name__
    layout, per_second = ("time", 13) if qwen3 else ("chunks", 25)
    merge = proc.video_processor.merge_size
    grids, rates = row.vision.get("video_grid_thw", []), row.vision.get("video_second_per_grid", [])
    images = iter(row.vision.get("image_grid_thw", []))
    sounds = iter(w for w, _ in prompt.get("multi_modal_data", {}).get("audio", []))
    tok = proc.tokenizer
    out, v = [], 0
    for t in prompt["prompt_token_ids"]:
        if t == ids["video"]:
            n_audio = int(proc._get_num_audio_tokens(len(next(sounds))))
            run = interleaved_placeholder(list(grids[v]), float(rates[v]), n_audio, merge_size=merge,
                                          video_token=proc.video_token, audio_token=proc.audio_token,
                                          audio_bos=proc.audio_bos_token, audio_eos=proc.audio_eos_token,
                                          position_id_per_seconds=per_second, layout=layout)
            out += tok(run, add_special_tokens=False)["input_ids"]
            v += 1
        elif t == ids.get("image"):
            out += [t] * (int(np.prod(next(images))) // proc.image_processor.merge_size ** 2)
        else:
            out.append(t)
    return out


@pytest.fixture(scope="module")
def encoded(proc, files):
    raws = _raws(files)
    enc = mmpipe.Encoder(proc, use_audio_in_video=True)
    return raws, [enc.encode_row(r, i) for i, r in enumerate(raws)]


def test_prompts_expand_back_to_the_training_ids(proc, encoded):
    raws, rows = encoded
    prompts = to_vllm_prompts(rows, proc, videos=[r.get("videos", []) for r in raws],
                              images=[r.get("images", []) for r in raws])
    ids = media_token_ids(proc)
    assert [p["prompt_token_ids"].count(ids["video"]) for p in prompts] == [1, 2, 0]
    for p, row in zip(prompts, rows):
        assert len(p["prompt_token_ids"]) < len(row.input_ids) or "multi_modal_data" not in p
        assert _expand(proc, p, row) == row.input_ids.tolist()
    assert prompts[2] == {"prompt_token_ids": rows[2].input_ids.tolist()}
    media = prompts[1]["multi_modal_data"]
    assert [len(media[k]) for k in ("video", "audio", "image")] == [2, 2, 1]
    kw = prompts[1]["mm_processor_kwargs"]
    assert kw == {"use_audio_in_video": True, "fps": 2.0, "second_per_grid_ts": [1.0, 1.0]}


def test_the_frames_and_sound_are_the_encodes(proc, encoded, files):
    """vLLM gets what the encode gave the processor: qwen-vl-utils' frames at 2 a second and the
    video's own sound at the extractor's rate; their grid is the row's."""
    from mmpipe.images.video import VideoOptions, sampled_frames

    raws, rows = encoded
    p = to_vllm_prompts(rows[:1], proc, videos=[raws[0]["videos"]])[0]
    frames = p["multi_modal_data"]["video"][0]
    np.testing.assert_array_equal(frames, sampled_frames(files["a.mkv"], VideoOptions(fps=2.0)))
    np.testing.assert_array_equal(p["multi_modal_data"]["audio"][0][0], load_video_audio(files["a.mkv"], RATE))
    assert p["multi_modal_data"]["audio"][0][1] == RATE
    assert -(-len(frames) // proc.video_processor.temporal_patch_size) == rows[0].vision["video_grid_thw"][0, 0]


def test_the_rows_own_rate_is_used(proc, files):
    """A row encoded at another rate is sampled again at that rate (read back from its
    ``video_second_per_grid``), without options given; other options than at encode are refused.
    Qwen2.5-Omni at 4 frames a second; Qwen3-Omni at 1 (at 4 its vLLM positions differ: next test)."""
    raw = _raws(files)[0]
    fps = 1.0 if "Qwen3" in type(proc).__name__ else 4.0
    row = mmpipe.Encoder(proc, use_audio_in_video=True, video_options={"fps": fps}).encode_row(raw, 0)
    p = to_vllm_prompts([row], proc, videos=[raw["videos"]])[0]
    assert p["mm_processor_kwargs"]["fps"] == fps and p["mm_processor_kwargs"]["second_per_grid_ts"] == [2 / fps]
    assert _expand(proc, p, row) == row.input_ids.tolist()
    given = to_vllm_prompts([row], proc, videos=[raw["videos"]], video_options={"fps": fps})[0]
    assert given["prompt_token_ids"] == p["prompt_token_ids"] and given["mm_processor_kwargs"] == p["mm_processor_kwargs"]
    with pytest.raises(ArgumentError, match=f"row 0: video_options fps 3.0 differs from the {fps:g} frames a second"):
        to_vllm_prompts([row], proc, videos=[raw["videos"]], video_options={"fps": 3.0})
    grids = int(row.vision["video_grid_thw"][0, 0])
    with pytest.raises(ArgumentError, match=rf"row 0, video 0: \d+ frames sampled at {fps:g} a second make \d+ "
                                            rf"temporal grids, the row holds {grids}"):
        to_vllm_prompts([row], proc, videos=[raw["videos"]], video_options={"fps": fps, "max_frames": 2})


def test_qwen3_omni_at_4_fps_is_refused_for_vllm(proc, files):
    """vLLM 0.32's Qwen3-Omni thinker rounds a grid's time positions (13 a second x 0.5 s = 6.5) down
    before interleaving the sound; transformers keeps them fractional: refused, naming the row and the
    rate to use. Qwen2.5-Omni (2 s chunks) agrees at 4 frames a second."""
    from mmpipe.rollout.support import RolloutRefusal

    raw = _raws(files)[0]
    row = mmpipe.Encoder(proc, use_audio_in_video=True, video_options={"fps": 4.0}).encode_row(raw, 0)
    if "Qwen3" not in type(proc).__name__:
        assert to_vllm_prompts([row], proc, videos=[raw["videos"]])[0]["mm_processor_kwargs"]["fps"] == 4.0
        return
    with pytest.raises(RolloutRefusal, match=r"row 0: its videos were sampled at 4 frames a second, so each temporal "
                                             r"grid lasts 6.5 position ids; vLLM 0.32's Qwen3OmniMoeProcessor") as e:
        to_vllm_prompts([row], proc, videos=[raw["videos"]])
    assert e.value.row == 0 and "video_options={'fps': 2.0}" in str(e.value)


def test_missing_or_miscounted_videos_are_refused(proc, encoded, files):
    raws, rows = encoded
    with pytest.raises(ArgumentError, match=r"row 1: 2 videos with their sound; pass videos= .*got 1\)"):
        to_vllm_prompts(rows, proc, videos=[raws[0]["videos"], raws[0]["videos"], []],
                        images=[[], raws[1]["images"], []])
    with pytest.raises(ArgumentError, match=r"row 0: 1 videos with their sound; pass videos= .*got none"):
        to_vllm_prompts(rows[:1], proc)
    with pytest.raises(ArgumentError, match="row 2: 1 videos given for a row without video tokens"):
        to_vllm_prompts(rows, proc, videos=[r.get("videos", []) for r in raws[:2]] + [[files["a.mkv"]]],
                        images=[[], raws[1]["images"], []])
    with pytest.raises(ArgumentError, match="videos= must hold one list of video files per row"):
        to_vllm_prompts(rows, proc, videos=[files["a.mkv"]])
    with pytest.raises(ArgumentError, match="video_options= goes with videos="):
        to_vllm_prompts(rows[2:], proc, video_options={"fps": 2.0})


def test_native_rows_refuse_videos(files):
    """A family that stores its video frames takes none from ``videos=`` (said, not ignored)."""
    p = mmpipe.testing.build_processor("qwen2_5_vl")
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, p)
    with pytest.raises(ArgumentError, match="videos= is for rows encoded with use_audio_in_video=True"):
        to_vllm_prompts([row], p, videos=[[files["a.mkv"]]])


def test_a_tone_is_not_a_video(proc, encoded):
    """A clip given where the video file belongs: the video's sound cannot be read from it (typed)."""
    from mmpipe.errors import AudioError, VideoError

    raws, rows = encoded
    clip = tone(RATE, RATE)[0]
    with pytest.raises((AudioError, VideoError), match="row 0"):
        to_vllm_prompts(rows[:1], proc, videos=[[clip]])
