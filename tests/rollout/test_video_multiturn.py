"""Multi-turn appends with videos (`mmpipe.rollout.multiturn`): a video in the first prompt
or arriving in a later turn (a tool that returns a clip), mixed with images. The incremental
row equals encoding the whole conversation at once (ids, labels, token types, grids,
``second_per_grid_ts``, pixels, positions) on all three families and pixel formats, the
model sees the appended video, and the finished conversation collates like any row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import PlaceholderError
from mmpipe.rollout.inputs import to_vllm_prompts
from mmpipe.rollout.multiturn import append_observation, append_response, start
from mmpipe.testing.invariants import assert_batched_logits_match, assert_roundtrip, assert_row_positions

from conftest import FAMILIES, model_for, processor_for
from helpers import VIDEO_BOUNDS, video_frames_list

IGNORE = mmpipe.IGNORE_INDEX


def _clip(n, h, w, seed):
    return {"frames": video_frames_list(n, h, w, seed), "fps": 2.0}


def _play(family, pixels="uint8", *, first_video=True):
    """user: [video?] + image + question; reply; tool turn: video + image; reply; user: video; reply."""
    proc = processor_for(family)
    first = [{"type": "video"}] if first_video else []
    prompt = {"messages": [{"role": "user", "content": first + [{"type": "image"}, {"type": "text", "text": "What?"}]}],
              "images": [testing.tiny_image(40, 52, seed=1)], "videos": [_clip(4, 40, 56, 1)] if first_video else []}
    conv = start(prompt, proc, pixels=pixels, video_options=VIDEO_BOUNDS)
    msgs, imgs, vids = list(prompt["messages"]), list(prompt["images"]), list(prompt["videos"])
    turns = [
        ([{"type": "text", "text": "Result: "}, {"type": "video"}, {"type": "image"}],
         [testing.tiny_image(36, 60, seed=2)], [_clip(5, 64, 48, 2)]),
        ([{"type": "video"}, {"type": "text", "text": "and this one?"}], [], [_clip(3, 40, 40, 3)]),
    ]
    for k, (content, t_imgs, t_vids) in enumerate(turns):
        reply = f"I see clip {k}."
        conv = append_response(conv, text=reply)
        msgs.append({"role": "assistant", "content": reply})
        conv = append_observation(conv, content, images=t_imgs, videos=t_vids)
        msgs.append({"role": "user", "content": content})
        imgs += t_imgs
        vids += t_vids
    conv = append_response(conv, text="Done.", done=True)
    msgs.append({"role": "assistant", "content": "Done."})
    return proc, conv, {"messages": msgs, "images": imgs, "videos": vids}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pixels", ["uint8", "float32"])
def test_incremental_video_appends_equal_the_whole_conversation(family, pixels):
    proc, conv, whole = _play(family, pixels)
    ref = mmpipe.encode_row(whole, proc, pixels=pixels, video_options=VIDEO_BOUNDS)
    assert conv.row.num_videos == 3 and conv.row.num_images == 2
    assert conv.row.diff(ref) == [], conv.row.diff(ref)
    conv.row.validate()
    # the M-RoPE rule (vLLM's; transformers 5 differs for clips longer than max(h, w)/merge, see FACTS.md)
    assert_row_positions(conv.row)
    assert (conv.row.labels[conv.row.mm_token_type_ids > 0] == IGNORE).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_first_video_in_a_later_turn(family):
    """A prompt without videos; the first video arrives from a tool: the row grows video fields."""
    proc, conv, whole = _play(family, first_video=False)
    assert conv.row.num_videos == 2
    assert conv.row.diff(mmpipe.encode_row(whole, proc, video_options=VIDEO_BOUNDS)) == []


def test_model_sees_the_appended_video_and_vllm_prompt_is_built():
    family = "qwen2_5_vl"
    proc, conv, _ = _play(family)
    model = model_for(family)
    other = mmpipe.encode_row({"messages": [{"role": "user", "content": "no media"}]}, proc)
    assert_roundtrip([conv.row, other], processor=proc)
    assert_batched_logits_match(model, [conv.row, other], proc, rtol=1e-5, atol=1e-5)
    prompt = to_vllm_prompts([conv.row], proc)[0]
    pad = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert prompt["prompt_token_ids"].count(pad) == 3 and len(prompt["multi_modal_data"]["video"]) == 3


def test_a_video_placeholder_without_a_video_names_the_conversation():
    proc = processor_for("qwen2_vl")
    conv = start({"messages": [{"role": "user", "content": "hi"}]}, proc)
    conv = append_response(conv, text="hello")
    with pytest.raises(PlaceholderError, match="video"):
        append_observation(conv, [{"type": "video"}, {"type": "text", "text": "x"}])
