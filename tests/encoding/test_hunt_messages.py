"""Chat rows as VL SFT / RL users bring them (found by a hunt over message shapes):

- OpenAI Responses-style parts (``{"type": "input_image", "image_url": ...}`` next to
  ``{"type": "input_text", ...}``) encode as the same row as the chat-completions form; the old
  code refused the image ("has neither text nor an image ... give text items a 'text' string");
  an ``input_image`` holding only a ``file_id`` is a `ParseError` that says so;
- a ``messages`` column holding a ShareGPT / Gemma speaker name for the assistant (``gpt`` /
  ``model``) or ``assistant`` in another case / with spaces (``Assistant``) is a `ParseError` naming
  the message and the role to use; the old code rendered ``<|im_start|>gpt`` and labelled nothing (an
  SFT row with no targets, silently); other roles (``narrator``) are still rendered as given;
- rows read through pandas / ``with_format("numpy")`` (messages and contents as object arrays, the
  numpy format's same-size images stacked as ``[n, H, W, C]`` uint8) parse as their lists; the old
  code refused them as "not a non-empty list of chat messages".
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.encoding.parse import parse_media
from mmpipe.errors import ParseError
from mmpipe.testing import build_processor, invariants

IMAGE = Image.new("RGB", (56, 42), (10, 120, 60))


def _data_url(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(image_item: dict, text_item: dict) -> dict:
    return {"messages": [{"role": "user", "content": [image_item, text_item]},
                         {"role": "assistant", "content": "A green box."}]}


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
@pytest.mark.parametrize("url_form", ["str", "dict"])
def test_responses_input_image_encodes_as_image_url(family, url_form):
    proc, url = build_processor(family), _data_url(IMAGE)
    value = url if url_form == "str" else {"url": url}
    responses = _chat({"type": "input_image", "image_url": value, "detail": "auto"},
                      {"type": "input_text", "text": "What is it?"})
    chat = _chat({"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is it?"})
    a, b = mmpipe.encode_row(responses, proc, idx=0), mmpipe.encode_row(chat, proc, idx=0)
    invariants.assert_rows_equal([a], [b])
    assert a.num_images == 1 and (a.labels != -100).sum() > 0


def test_responses_input_image_placeholder_takes_the_images_column():
    row = {"messages": [{"role": "user", "content": [{"type": "input_image"}, {"type": "input_text", "text": "q"}]}],
           "images": [IMAGE]}
    messages, images, _, _ = parse_media(row, idx=0)
    assert messages[0]["content"] == [{"type": "image"}, {"type": "text", "text": "q"}]
    assert images == [IMAGE]


def test_responses_input_image_file_id_is_refused():
    row = {"messages": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-abc"}]}]}
    with pytest.raises(ParseError, match="file_id") as e:
        parse_media(row, idx=3)
    assert "row 3" in str(e.value) and e.value.column == "messages"


@pytest.mark.parametrize("role", ["gpt", "model", "Assistant", " assistant", "ASSISTANT"])
def test_speaker_name_or_misspelled_assistant_role_is_refused(role):
    msgs = [{"role": "user", "content": "<image>What?"}, {"role": role, "content": "A cat."}]
    with pytest.raises(ParseError, match=f"role {role!r}") as e:
        mmpipe.encode_row({"messages": msgs, "images": [IMAGE]}, build_processor("qwen2_vl"), idx=5)
    assert "row 5" in str(e.value) and "'assistant'" in str(e.value)


@pytest.mark.parametrize("role", ["human", "USER", " user"])
def test_other_spellings_of_other_roles_render_as_given(role):
    """No answer is lost with these (only assistant turns are labelled): rendered as the row says."""
    msgs = [{"role": role, "content": "<image>What?"}, {"role": "assistant", "content": "A cat."}]
    row = mmpipe.encode_row({"messages": msgs, "images": [IMAGE]}, build_processor("qwen2_vl"), idx=5)
    assert (np.asarray(row.labels) != -100).any()


def test_object_array_messages_parse_as_lists():
    """What pandas (``pd.read_parquet(...).iloc[i]``) and ``ds.with_format("numpy")`` give."""
    content = np.array([{"type": "image", "text": None}, {"type": "text", "text": "q"}], dtype=object)
    reply = np.array([{"type": "text", "text": "a"}], dtype=object)
    messages = np.array([{"role": "user", "content": content}, {"role": "assistant", "content": reply}], dtype=object)
    images = np.empty(1, dtype=object)  # np.array([IMAGE], dtype=object) would unpack the pixels
    images[0] = IMAGE
    row = {"messages": messages, "images": images}
    plain = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "q"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "a"}]}], "images": [IMAGE]}
    assert parse_media(row, idx=0) == parse_media(plain, idx=0)
    proc = build_processor("qwen2_vl")
    invariants.assert_rows_equal([mmpipe.encode_row(row, proc, idx=0)], [mmpipe.encode_row(plain, proc, idx=0)])


def test_numpy_format_dataset_rows_encode():
    import datasets

    rows = [{"messages": [{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": "q"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "a"}]}], "images": [IMAGE]}]
    ds = datasets.Dataset.from_list(rows)
    row = ds.with_format("numpy")[0]
    assert row["images"].shape == (1, 42, 56, 3)  # numpy format stacks same-size images: [n, H, W, C] uint8
    messages, images, _, _ = parse_media(row, idx=0)
    assert messages == parse_media(ds[0], idx=0)[0] and len(images) == 1
    np.testing.assert_array_equal(images[0], np.asarray(IMAGE))
    proc = build_processor("qwen2_vl")
    invariants.assert_rows_equal([mmpipe.encode_row(row, proc, idx=0)], [mmpipe.encode_row(ds[0], proc, idx=0)])


def test_other_roles_still_render_as_given():
    messages, _, _, _ = parse_media({"messages": [{"role": "narrator", "content": "hi"}]}, idx=0)
    assert messages == [{"role": "narrator", "content": "hi"}]
