"""Videos with their sound (``use_audio_in_video``) on the Qwen2.5-Omni and Qwen3-Omni thinker
processors of transformers 5.24, in the "vision" environment (their video processor needs
torchvision): what the encode must equal, recorded on tiny thinkers built offline.

- the flat call takes the decoded sound as ``audio=`` + ``audio_from_video_indices`` +
  ``load_audio_from_video=True`` (`mmpipe.audio.omni_video.call_kwargs`); the deprecated
  ``use_audio_in_video=True`` keyword gives the same outputs;
- without the sound given, the flat call and the chat path decode it with torchcodec, which
  cannot load here (its wheel links CUDA): both refuse with ``ImportError``;
- the video's placeholder becomes `interleaved_placeholder` (Qwen2.5-Omni: 2 s chunks; Qwen3-Omni:
  merged by time position), the video's sound adds no placeholder of its own, and the outputs hold
  its features in slot order;
- the thinker's forward with ``use_audio_in_video=True`` == its forward with
  `mmpipe.audio.omni_video.position_ids`, and differs from the forward without the flag (so the
  flag, or stored positions, must reach the model)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.needs_env("vision")
av = pytest.importorskip("av")

from mmpipe.audio import load_video_audio  # noqa: E402
from mmpipe.audio.omni_video import call_kwargs, interleaved_placeholder, position_ids  # noqa: E402
from mmpipe.audio.samples import tone, video_with_sound  # noqa: E402
from mmpipe.errors import AudioError  # noqa: E402

RATE = 16000
# family -> (builder module, tokens, layout, position ids a second)
FAMILIES = {
    "qwen2_5_omni": ("mmpipe.offline.qwen_omni", dict(video_token="<|VIDEO|>", audio_token="<|AUDIO|>",
                     audio_bos="<|audio_bos|>", audio_eos="<|audio_eos|>", vision_bos="<|vision_bos|>",
                     vision_eos="<|vision_eos|>"), "chunks", 25),
    "qwen3_omni": ("mmpipe.offline.qwen3_omni", dict(video_token="<|video_pad|>", audio_token="<|audio_pad|>",
                   audio_bos="<|audio_start|>", audio_eos="<|audio_end|>", vision_bos="<|vision_start|>",
                   vision_eos="<|vision_end|>"), "time", 13),
}


def _module(family):
    import importlib

    return importlib.import_module(FAMILIES[family][0])


@pytest.fixture(scope="module", params=list(FAMILIES))
def omni(request):
    mod = _module(request.param)
    torch.manual_seed(0)
    return request.param, mod.build_processor(videos=True), mod.build_model()


def _frames(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _text(tok: dict, order) -> str:
    items = {"video": tok["vision_bos"] + tok["video_token"] + tok["vision_eos"],
             "audio": tok["audio_bos"] + tok["audio_token"] + tok["audio_eos"]}
    body = "".join(items[k] + f" item {i}. " for i, k in enumerate(order))
    return f"<|im_start|>user\n{body}What happens?<|im_end|>\n<|im_start|>assistant\n"


def _n_audio_tokens(processor, wave) -> int:
    return int(processor._get_num_audio_tokens(len(wave)))


def _call(processor, text, frames_list, **kw):
    return processor(text=[text], videos=list(frames_list), return_tensors="pt", **kw)


@pytest.mark.parametrize("seconds, fps", [(3.0, 4), (5.0, 2)])
def test_one_video_with_its_sound(omni, seconds, fps):
    family, proc, model = omni
    _, tok, layout, per_second = FAMILIES[family]
    data, _ = video_with_sound(seconds, fps=fps, fmt="mkv", rate=RATE, channels=2)
    frames, wave = _frames(data), load_video_audio(data, proc.feature_extractor.sampling_rate)
    text = _text(tok, ["video"])
    out = _call(proc, text, [frames], **call_kwargs(["video"], [], [wave]))
    # the deprecated keyword, with the sound given the same way: the same outputs
    old = _call(proc, text, [frames], audio=[wave], audio_from_video_indices=[0], use_audio_in_video=True)
    assert sorted(out) == sorted(old) and all(torch.equal(out[k], old[k]) for k in out)
    assert {"input_features", "feature_attention_mask", "pixel_values_videos", "video_grid_thw",
            "video_second_per_grid"} <= set(out)
    # the sound's features are those of the same waveform given as a standalone clip
    alone = proc(text=[_text(tok, ["audio"])], audio=[wave], return_tensors="pt")
    assert torch.equal(out["input_features"], alone["input_features"])
    assert torch.equal(out["feature_attention_mask"], alone["feature_attention_mask"])
    # the placeholder: the video's token replaced by the interleaved run, no audio placeholder of its own
    decoded = proc.tokenizer.decode(out["input_ids"][0])
    run = interleaved_placeholder(out["video_grid_thw"][0].tolist(), float(out["video_second_per_grid"][0]),
                                  _n_audio_tokens(proc, wave), merge_size=proc.video_processor.merge_size,
                                  position_id_per_seconds=per_second, layout=layout,
                                  **{k: tok[k] for k in ("video_token", "audio_token", "audio_bos", "audio_eos")})
    assert decoded == text.replace(tok["video_token"], run)
    ids = out["input_ids"][0].tolist()
    n_video = int(out["video_grid_thw"][0].prod()) // proc.video_processor.merge_size ** 2
    assert ids.count(proc.tokenizer.convert_tokens_to_ids(tok["video_token"])) == n_video
    assert ids.count(proc.tokenizer.convert_tokens_to_ids(tok["audio_token"])) == _n_audio_tokens(proc, wave)
    # video_second_per_grid: temporal patch / the processor's fps keyword (2.0 / 1.0 by default), not the file's
    assert float(out["video_second_per_grid"][0]) == (1.0 if family == "qwen2_5_omni" else 2.0)
    # the model needs the flag (or the positions): the forward without it differs
    pos = position_ids(model, out)
    with torch.no_grad():
        flag = model(**out, use_audio_in_video=True).logits
        stored = model(**out, position_ids=pos).logits
        plain = model(**out).logits
    assert torch.equal(flag, stored)
    assert (flag - plain).abs().max() > 1e-4


def test_standalone_clips_and_videos_in_text_order(omni):
    family, proc, model = omni
    _, tok, layout, per_second = FAMILIES[family]
    v0, _ = video_with_sound(2.0, fps=4, fmt="mkv", rate=RATE, seed=1)
    v1, _ = video_with_sound(3.0, fps=2, fmt="mp4", rate=44100, channels=2, seed=2)
    waves = [load_video_audio(v, RATE) for v in (v0, v1)]
    clips = [tone(RATE, RATE, seed=3)[0], tone(RATE * 3 // 2, RATE, seed=4)[0]]
    order = ["audio", "video", "audio", "video"]
    kw = call_kwargs(order, clips, waves)
    assert kw["audio_from_video_indices"] == [None, 0, None, 1]
    text = _text(tok, order)
    out = _call(proc, text, [_frames(v0), _frames(v1)], **kw)
    lens = out["feature_attention_mask"].sum(-1).tolist()
    want = [len(c) // proc.feature_extractor.hop_length for c in (clips[0], waves[0], clips[1], waves[1])]
    assert [abs(a - b) <= 1 for a, b in zip(lens, want)] == [True] * 4  # features in slot order
    with torch.no_grad():
        flag = model(**out, use_audio_in_video=True).logits
        stored = model(**out, position_ids=position_ids(model, out)).logits
    assert torch.equal(flag, stored)
    # the wrong slot order is not caught by the processor: the rope then reads the wrong lengths
    wrong = dict(kw, audio=[clips[0], clips[1], waves[0], waves[1]], audio_from_video_indices=[None, None, 0, 1])
    bad = _call(proc, text, [_frames(v0), _frames(v1)], **wrong)
    assert not torch.equal(bad["input_ids"], out["input_ids"]) or not torch.equal(
        bad["feature_attention_mask"], out["feature_attention_mask"])


def test_without_the_sound_given_the_processor_needs_torchcodec(omni, tmp_path):
    family, proc, _ = omni
    try:
        from torchcodec.decoders import AudioDecoder  # noqa: F401
        pytest.skip("torchcodec loads here: the processor decodes the sound itself")
    except (ImportError, OSError, RuntimeError):
        pass
    _, tok, _, _ = FAMILIES[family]
    data, _ = video_with_sound(2.0, fmt="mp4", rate=RATE)
    path = tmp_path / "clip.mp4"
    path.write_bytes(data)
    with pytest.raises(ImportError, match="torchcodec"):
        _call(proc, _text(tok, ["video"]), [_frames(data)], load_audio_from_video=True)
    conv = [{"role": "user", "content": [{"type": "video", "path": str(path)}, {"type": "text", "text": "What?"}]}]
    with pytest.raises(ImportError, match="torchcodec"):
        proc.apply_chat_template(conv, tokenize=True, return_dict=True, add_generation_prompt=True,
                                 load_audio_from_video=True)


def test_a_silent_video_is_refused_before_the_processor():
    data, _ = video_with_sound(1.0, fmt="mp4", sound=False)
    assert load_video_audio(data, RATE, missing="none") is None
    with pytest.raises(AudioError, match="has no sound") as e:
        call_kwargs(["video"], [], [None])
    assert "use_audio_in_video=False" in e.value.fix


def test_the_flag_changes_nothing_for_rows_without_videos(omni):
    """``use_audio_in_video=True`` on a batch is safe for its rows without videos (clips, images): their
    positions are the same with and without the flag; only a video without sound cannot share it."""
    from mmpipe import testing

    family, proc, model = omni
    _, tok, _, _ = FAMILIES[family]
    text = _text(tok, ["audio", "audio"]).replace("item 0.", tok["vision_bos"] + ("<|IMAGE|>" if family ==
                                                 "qwen2_5_omni" else "<|image_pad|>") + tok["vision_eos"])
    out = proc(text=[text], images=[testing.tiny_image(60, 80, seed=1)],
               audio=[tone(RATE, RATE)[0], tone(RATE * 3 // 2, RATE, seed=2)[0]], return_tensors="pt")
    assert torch.equal(position_ids(model, out, use_audio_in_video=True),
                       position_ids(model, out, use_audio_in_video=False))


def test_call_keywords_follow_the_processors_api(omni):
    """transformers 5.24's Omni processors take ``audio_from_video_indices`` / ``load_audio_from_video``;
    the older ones (5.19, the vLLM environment) ignore those keywords and take ``use_audio_in_video=True``
    with the clips in placeholder order (checked against vLLM's transformers: tests/rollout/test_omni_vllm.py)."""
    from mmpipe.audio.omni_video import takes_video_audio_indices

    proc = omni[1]
    clip, wave = np.zeros(1600, np.float32), np.ones(3200, np.float32)
    assert takes_video_audio_indices(proc)
    new = call_kwargs(["audio", "video"], [clip], [wave], proc)
    assert new["audio_from_video_indices"] == [None, 0] and new["load_audio_from_video"] is True
    assert call_kwargs(["audio", "video"], [clip], [wave]) == new  # no processor: the current API

    class Older:  # an Omni processor before OmniModalProcessorMixin
        pass

    old = call_kwargs(["audio", "video"], [clip], [wave], Older())
    assert sorted(old) == ["audio", "use_audio_in_video"] and old["use_audio_in_video"] is True
    assert [a is b for a, b in zip(old["audio"], [clip, wave])] == [True, True]
