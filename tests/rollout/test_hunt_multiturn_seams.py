"""Multi-turn appends under the real Qwen punctuation merges (hunt): the offline tokenizer's
``merges="qwen-punct"`` set joins text across the borders where a conversation grows (the header
``"assistant\\n"`` + a reply starting with ``"\\n"`` -> one ``"ĊĊ"``), which the default set hides.

Every appended row is compared with ``mmpipe.encode_row`` of the whole conversation (ids, labels,
mm_token_type_ids, grids, pixels, positions, rope_delta), its labels with transformers' assistant mask
(the processor's chat path on a ``{% generation %}`` copy of the published template) and its positions
with ``get_rope_index``.

Found here: ``append_response(conv, text=...)`` refused a reply starting with ``"\\n"`` (an
InputError "merges with the text before it") for Qwen2-VL, Qwen3-VL and GLM-4.1V, while
``encode_row`` of the whole conversation encodes it (one labelled ``"ĊĊ"`` token in place of the
header's ``"\\n"``). The reply now re-tokenizes the generation prompt's last token with it.
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe
from encoding.test_hunt_seams import _images, _processor, _reference
from mmpipe.offline.published_templates import generation_template, published_template
from mmpipe.rollout.multiturn import append_observation, append_response, start
from mmpipe.testing.invariants import assert_row_positions

U, A = "user", "assistant"


def _content(*parts) -> list:
    return [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_vl", "glm4v"])
def family(request):
    """(family, processor with the published template, one with its generation copy)."""
    fam = request.param
    return fam, _processor(fam, published_template(fam)), _processor(fam, generation_template(fam))


def _play(proc, turns: list, images: list):
    """Append ``turns`` (assistant replies as text, observations with their images) after the first
    user turn; returns the conversation and the whole raw row."""
    it = iter(images)
    first = turns[0]
    n = sum(1 for p in first["content"] if p.get("type") == "image")
    used = [next(it) for _ in range(n)]
    conv = start({"messages": [first], "images": list(used)}, proc)
    for m in turns[1:]:
        if m["role"] == A:
            conv = append_response(conv, text=m["content"])
        else:
            k = sum(1 for p in m["content"] if p.get("type") == "image")
            new = [next(it) for _ in range(k)]
            conv = append_observation(conv, m["content"], images=new, role=m["role"])
            used += new
    return conv, {"messages": turns, "images": used}


def _check(fam, proc, ref, turns):
    conv, whole = _play(proc, turns, _images(4))
    row = mmpipe.encode_row(whole, proc)
    assert conv.row.diff(row) == [], (fam, conv.row.diff(row))
    ids, labels = _reference(ref, turns, whole["images"])
    np.testing.assert_array_equal(conv.row.input_ids, ids, err_msg=fam)
    np.testing.assert_array_equal(conv.row.labels, labels, err_msg=fam)
    assert np.array_equal(conv.response_mask == 1, conv.row.labels != -100), fam
    assert_row_positions(conv.row)
    return conv


@pytest.mark.parametrize("reply", ["\n\n**Answer:** 42.\n", "\nx", "\n"])
def test_text_reply_starting_with_a_newline_equals_the_whole_encode(family, reply):
    """Was: InputError "the response merges with the text before it into one token"."""
    fam, proc, ref = family
    turns = [{"role": U, "content": _content("Q:", None)}, {"role": A, "content": reply},
             {"role": U, "content": _content("\n\nmore: ", None)}, {"role": A, "content": reply}]
    conv = _check(fam, proc, ref, turns)
    tok = proc.tokenizer
    a, b = conv.response_spans[0]
    assert tok.convert_ids_to_tokens(int(conv.row.input_ids[a])).startswith("ĊĊ")  # the merged token, labelled
    assert (conv.row.labels[a:b] == conv.row.input_ids[a:b]).all()


@pytest.mark.parametrize("reply, obs", [(" <b>x</b> ", " (result) "), ("?!\n", ".\n"), ("ok.\n\n", ":"),
                                        ("...well.", "?"), (": yes", "<tool>x</tool>\n")])
def test_punctuation_at_every_border_equals_the_whole_encode(family, reply, obs):
    """Replies and observations (with two images) beginning / ending with punctuation; the second
    reply is the first reversed, so two of the cases start it with a newline (those failed before)."""
    fam, proc, ref = family
    turns = [{"role": U, "content": _content("Tag:", None)}, {"role": A, "content": reply},
             {"role": U, "content": _content(obs, None, None, obs)}, {"role": A, "content": reply[::-1]}]
    _check(fam, proc, ref, turns)


@pytest.mark.parametrize("stop, role", [("<|user|>", "user"), ("<|observation|>", "tool")])
def test_glm_reply_ending_with_the_next_turns_header(stop, role):
    """GLM-4.1V writes no end of turn and stops at the next turn's header (its generation config:
    <|endoftext|>, <|user|>, <|observation|>). Was: the next append rendered that header again, so the
    row held ``<|user|><|user|>`` (``<|observation|><|observation|>``). Now the sampled header (kept
    and labelled, as all generated ids) opens the next turn: the row equals the whole encode but for
    that label; a turn of another kind is refused by name."""
    from mmpipe.testing import build_processor

    proc = build_processor("glm4v")
    tok = proc.tokenizer
    img = _images(2)
    user = {"role": U, "content": _content(None, "Q?")}
    obs = {"role": role, "content": "more?" if role == "tool" else _content(None, "more?")}
    conv = start({"messages": [user], "images": img[:1]}, proc)
    ids = tok("A cat.", add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids(stop)]
    replied = append_response(conv, ids)
    grown = append_observation(replied, obs["content"], images=img[1:] if role == U else [], role=role)
    whole = mmpipe.encode_row({"messages": [user, {"role": A, "content": "A cat."}, obs],
                               "images": img if role == U else img[:1]}, proc)
    assert grown.row.diff(whole) == ["labels"]
    at = conv.num_tokens + len(ids) - 1
    assert tok.convert_ids_to_tokens(int(grown.row.input_ids[at])) == stop
    assert (grown.row.labels != whole.labels).sum() == 1 and grown.row.labels[at] == whole.input_ids[at]
    assert_row_positions(grown.row)
    with pytest.raises(mmpipe.errors.InputError, match="ended with .* opens the next turn"):
        append_observation(replied, "x", role="tool" if role == U else U)


@pytest.mark.parametrize("fam", ["glm4v", "qwen3_vl"])
def test_observation_with_images_and_videos_equals_the_whole_encode(fam):
    """Was (GLM-4.1V): any video in an appended observation failed with a PlaceholderError "the new turn
    renders 4 <|image|> token(s) for 0 image(s)": its frames are <|image|> tokens, and the turn's images
    were counted after the video was expanded. The first prompt (start) was not affected."""
    from mmpipe.testing import build_processor

    proc, rng = build_processor(fam), np.random.default_rng(0)
    opts = {"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 16}
    videos = [{"frames": [rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for _ in range(4)], "fps": 2.0}
              for _ in range(3)]
    images = _images(3)
    user = {"role": U, "content": [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "Q:"}]}
    obs = [{"type": "text", "text": "a: "}, {"type": "image"}, {"type": "video"}, {"type": "image"},
           {"type": "text", "text": "b"}, {"type": "video"}]
    conv = start({"messages": [user], "images": images[:1], "videos": videos[:1]}, proc, video_options=opts)
    conv = append_observation(append_response(conv, text="look."), obs, images=images[1:], videos=videos[1:])
    conv = append_response(conv, text="ok")
    turns = [user, {"role": A, "content": "look."}, {"role": U, "content": obs}, {"role": A, "content": "ok"}]
    whole = {"messages": turns, "images": images, "videos": videos}
    assert conv.row.diff(mmpipe.encode_row(whole, proc, video_options=opts)) == []
    assert conv.row.num_videos == 3 and conv.row.num_images == 3
