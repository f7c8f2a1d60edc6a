"""Long multi-turn loops (VRAG-style: a reply, then a tool turn with an image, 60 times) on the
native families with multi-turn appends: the grown row equals encoding the whole conversation at
once (ids, labels, token types, grids, positions; positions == transformers' get_rope_index), and
each append costs the same number of chat-template renders at turn 60 as at turn 3 (counted, not
timed: a turn renders the conversation once or twice, it never re-renders every prefix).

Measured here (the module's design, not a fix): the per-turn renders are linear in the
conversation, so a loop is quadratic in its turns: 200 appends of a reply + tool image took ~1 s
(Qwen2-VL, 51k tokens), ~2.8 s (GLM-4.1V, 100k tokens: two more renders a reply for its turn
headers); an AgentLoop of 200 turns ~2.6 s a trajectory, next to minutes of generation."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.rollout import multiturn as mt
from mmpipe.testing.invariants import assert_row_positions

from conftest import model_for, processor_for
from helpers import count_renders

STOP = {"qwen2_vl": "<|im_end|>", "qwen3_vl": "<|im_end|>", "glm4v": "<|user|>"}  # what the model samples last


def _image(i: int) -> Image.Image:
    return Image.new("RGB", (28 + 28 * (i % 2), 28), (7 * i % 255, 40, 90))


def _loop(family: str, turns: int, counted=None):
    """Run ``turns`` rounds; returns (conversation, messages, images, renders per round)."""
    proc = processor_for(family)
    tok = proc.tokenizer
    msgs = [{"role": "system", "content": "You are a search agent."},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find the page."}]}]
    images = [_image(0)]
    conv = mt.start({"messages": msgs, "images": images}, proc)
    per_round = []
    for i in range(turns):
        before = None if counted is None else len(counted)
        reply = f"Searching {i}: " + "more " * (i % 7) + ("" if i % 5 else "\n")
        ids = tok(reply, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(STOP[family])]
        conv = mt.append_response(conv, ids)
        msgs.append({"role": "assistant", "content": reply})
        obs = [{"type": "image"}, {"type": "text", "text": f"result {i} " * (1 + i % 4)}]
        conv = mt.append_observation(conv, obs, images=[_image(i + 1)])
        msgs.append({"role": "user", "content": obs})
        images.append(_image(i + 1))
        if counted is not None:
            per_round.append(len(counted) - before)
    return conv, msgs, images, per_round


@pytest.mark.parametrize("family", sorted(STOP))
def test_sixty_rounds_equal_the_whole_conversation(family):
    conv, msgs, images, _ = _loop(family, 60)
    whole = mmpipe.encode_row({"messages": msgs, "images": images}, processor_for(family), add_generation_prompt=True)
    row = conv.row
    assert row.num_images == 61 and row.num_tokens > 2000
    np.testing.assert_array_equal(row.input_ids, whole.input_ids)
    np.testing.assert_array_equal(row.mm_token_type_ids, whole.mm_token_type_ids)
    np.testing.assert_array_equal(row.image_grid_thw, whole.image_grid_thw)
    np.testing.assert_array_equal(row.position_ids, whole.position_ids)
    assert row.rope_delta == whole.rope_delta
    # labels: every reply as sampled, nothing else; the whole encoding labels the same tokens, but
    # for GLM's sampled <|user|>, which opens the next turn there (the template writes no end of turn)
    sampled, whole_wants = np.zeros(row.num_tokens, bool), np.zeros(row.num_tokens, bool)
    for a, b in conv.response_spans:
        sampled[a:b] = True
        whole_wants[a:b - 1 if family == "glm4v" else b] = True
    assert len(conv.response_spans) == 60
    np.testing.assert_array_equal(row.labels != -100, sampled)
    np.testing.assert_array_equal(row.labels[sampled], row.input_ids[sampled])
    np.testing.assert_array_equal(whole.labels != -100, whole_wants)
    assert_row_positions(row, model=model_for(family) if family != "glm4v" else None)


@pytest.mark.parametrize("family", ["qwen2_vl", "glm4v"])
def test_renders_per_round_do_not_grow_with_the_turns(family, monkeypatch):
    counted = count_renders(monkeypatch)
    *_, per_round = _loop(family, 40, counted)
    assert set(per_round) == {3 if family == "qwen2_vl" else 5}, per_round  # GLM: 2 probes of its turn headers
