"""`mmpipe.rollout.processor_prompts.vllm_prompt` in the main environment: a Qwen2.5-Omni generic
row's vLLM prompt is its training ids with each image / audio run collapsed to one token, and its
clips (loaded as at encode: mono, 16 kHz) and images as media; expanding the runs again by the
processor's own counts gives the training ids back. Missing media and videos are refused naming
the row. (Real vLLM: tests/rollout/test_omni_vllm.py.)"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("soundfile")

import mmpipe  # noqa: E402
from mmpipe import testing  # noqa: E402
from mmpipe.audio.samples import tone  # noqa: E402
from mmpipe.errors import ArgumentError, PlaceholderError  # noqa: E402
from mmpipe.offline import qwen_omni  # noqa: E402
from mmpipe.records.row import MultiModalInputs  # noqa: E402
from mmpipe.rollout.processor_prompts import collapse_runs, media_token_ids, vllm_prompt  # noqa: E402

RATE = 16000


@pytest.fixture(scope="module")
def proc():
    return qwen_omni.build_processor()


def _row(order, audios, images):
    content = [{"type": k} for k in order] + [{"type": "text", "text": "What is there?"}]
    return {"messages": [{"role": "user", "content": content}], "audios": audios, "images": images}


def test_prompt_collapses_and_carries_the_media(proc):
    photo = testing.tiny_image(90, 120, seed=3)
    a22 = {"array": tone(22050, 22050, seed=5)[0], "sampling_rate": 22050}
    a16 = {"array": tone(RATE * 2, RATE, seed=6)[0], "sampling_rate": RATE}
    raw = _row(["audio", "image", "audio"], [a22, a16], [photo])
    r = MultiModalInputs.from_dict(mmpipe.encode(raw, processor=proc), row=0)
    p = vllm_prompt(r, proc, images=raw["images"], audios=raw["audios"])
    ids = media_token_ids(proc)
    got = np.asarray(p["prompt_token_ids"])
    assert (got == ids["audio"]).sum() == 2 and (got == ids["image"]).sum() == 1
    # expanding each run by the processor's own count gives the training ids back
    _, runs = collapse_runs(r.input_ids, ids)
    out, k = [], {"audio": iter(runs["audio"]), "image": iter(runs["image"])}
    for t in got.tolist():
        kind = {v: n for n, v in ids.items()}.get(t)
        out += [t] * (next(k[kind]) if kind in k else 1)
    assert out == r.input_ids.tolist()
    media = p["multi_modal_data"]
    assert [rate for _, rate in media["audio"]] == [RATE, RATE]
    assert media["audio"][0][0].shape == (RATE,)  # 22050 Hz -> 16 kHz, as at encode
    np.testing.assert_array_equal(media["audio"][1][0], a16["array"])
    assert media["image"][0].size == photo.size and media["image"][0].mode == "RGB"
    want = [int(proc._get_num_audio_tokens(len(w))) for w, _ in media["audio"]]
    assert runs["audio"] == want


def test_text_only_rows_and_stored_sources(proc):
    r = MultiModalInputs.from_dict(mmpipe.encode(_row([], [], []), processor=proc), row=0)
    assert vllm_prompt(r, proc) == {"prompt_token_ids": r.input_ids.tolist()}
    clip = {"array": tone(RATE, RATE, seed=1)[0], "sampling_rate": RATE}
    enc = mmpipe.encode(_row(["audio"], [clip], []), processor=proc, audio="source")
    r = MultiModalInputs.from_dict(enc, row=0)
    p = vllm_prompt(r, proc)  # the clip from its stored source
    np.testing.assert_array_equal(p["multi_modal_data"]["audio"][0][0], clip["array"])


def test_missing_media_and_videos_are_refused(proc):
    clip = {"array": tone(RATE, RATE, seed=1)[0], "sampling_rate": RATE}
    r = MultiModalInputs.from_dict(mmpipe.encode(_row(["audio"], [clip], []), processor=proc), row=0)
    with pytest.raises(ArgumentError, match="row 4: 1 audio placeholders"):
        vllm_prompt(r, proc, index=4)
    with pytest.raises(ArgumentError, match="row 4: 1 audio placeholders"):
        vllm_prompt(r, proc, audios=[clip, clip], index=4)
    ids = media_token_ids(proc)
    r.input_ids = np.concatenate([r.input_ids, [ids["video"]] * 3])
    with pytest.raises(PlaceholderError, match="video"):
        vllm_prompt(r, proc, audios=[clip], index=4)


def test_other_generic_processors_are_refused(proc):
    r = MultiModalInputs.from_dict(mmpipe.encode(_row([], [], []), processor=proc), row=0)
    from mmpipe.rollout.support import RolloutRefusal

    with pytest.raises(RolloutRefusal, match="row 2: vLLM prompts .*not available for generic rows: the generic path") as e:
        vllm_prompt(r, object(), index=2)  # e.g. Gemma 3n's, Phi-4-multimodal's: other placeholder rules
    assert "built for the Omni thinker processors" in str(e.value) and e.value.row == 2


def test_video_sound_prompt_collapses_the_interleaved_run(proc):
    from mmpipe.audio.omni_video import interleaved_placeholder
    from mmpipe.rollout.processor_prompts import video_sound_prompt

    run = interleaved_placeholder([3, 4, 4], 1.0, 80, merge_size=2, video_token="<|VIDEO|>", audio_token="<|AUDIO|>",
                                  audio_bos="<|audio_bos|>", audio_eos="<|audio_eos|>")
    text = f"<|im_start|>user\n<|vision_bos|>{run}<|vision_eos|>hi<|im_end|>\n"
    ids = proc.tokenizer(text)["input_ids"]
    frames, wave = np.zeros((6, 56, 56, 3), np.uint8), tone(RATE * 3, RATE)[0]
    p = video_sound_prompt(ids, proc, [frames], [wave], index=1)
    short = proc.tokenizer("<|im_start|>user\n<|vision_bos|><|VIDEO|><|vision_eos|>hi<|im_end|>\n")["input_ids"]
    assert p["prompt_token_ids"] == short
    assert p["mm_processor_kwargs"] == {"use_audio_in_video": True}
    assert p["multi_modal_data"]["audio"][0][1] == RATE and p["multi_modal_data"]["video"][0] is frames
    clip = proc.tokenizer("<|audio_bos|><|AUDIO|><|AUDIO|><|audio_eos|>")["input_ids"]
    with pytest.raises(ArgumentError, match="row 1: 1 standalone audio"):
        video_sound_prompt(ids + clip, proc, [frames], [wave], index=1)
    with pytest.raises(ArgumentError, match="1 videos with sound in the ids, 2 videos"):
        video_sound_prompt(ids, proc, [frames, frames], [wave, wave], index=1)


def test_both_thinker_processors_are_served(proc):
    from mmpipe.offline import qwen3_omni
    from mmpipe.rollout.processor_prompts import served_class

    assert served_class(proc) and served_class(qwen3_omni.build_processor())
    assert served_class(proc.tokenizer) is None and served_class(proc.image_processor) is None


def test_to_vllm_prompts_builds_the_thinkers_prompts(proc):
    """The public entry (`mmpipe.rollout.to_vllm_prompts`) reaches the thinker's prompt builder
    through the processor kind: the same prompts as `vllm_prompt` row by row."""
    from mmpipe.rollout import to_vllm_prompts

    clip = {"array": tone(RATE, RATE, seed=2)[0], "sampling_rate": RATE}
    photo = testing.tiny_image(64, 80, seed=4)
    raws = [_row(["audio"], [clip], []), _row(["image"], [], [photo]), _row([], [], [])]
    rows = [mmpipe.encode_row(x, proc, idx=i, audio="source") for i, x in enumerate(raws)]
    got = to_vllm_prompts(rows, proc, images=[[], [photo], []])
    want = [vllm_prompt(r, proc, images=x["images"], index=i) for i, (r, x) in enumerate(zip(rows, raws))]
    assert [p["prompt_token_ids"] for p in got] == [p["prompt_token_ids"] for p in want]
    np.testing.assert_array_equal(got[0]["multi_modal_data"]["audio"][0][0], clip["array"])
    assert got[1]["multi_modal_data"]["image"][0].size == photo.size and "multi_modal_data" not in got[2]
