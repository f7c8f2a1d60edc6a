"""Gemma 3 with its turn markers as single special tokens, as its published tokenizer has them
(``<bos>``, ``<start_of_turn>``, ``<end_of_turn>``: ids 2, 105, 106 in the checkpoints). The
shared offline Gemma 3 tokenizer spells them out in BPE pieces (``<end_of_turn>`` is 11 tokens
there), so the label tests on it never see the one end-of-turn token a real reply ends with; here
the same processor gets them as added special tokens and mmpipe's ids and labels must equal the
processor's own chat path with transformers' assistant mask (a ``{% generation %}`` copy of the
published template), each labelled reply ending in the one ``<end_of_turn>`` token."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from PIL import Image
from tokenizers import AddedToken

import mmpipe
from mmpipe.offline.gemma3 import build_gemma3_processor
from mmpipe.offline.published_templates import generation_template, published_template

TURN_TOKENS = ("<start_of_turn>", "<end_of_turn>")
IMAGE = Image.new("RGB", (40, 30), (30, 120, 60))


def _user(*parts):
    return {"role": "user", "content": [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]}


CONVERSATIONS = {
    "system, image, two replies": [{"role": "system", "content": "Be brief."}, _user(None, "what?"),
                                   {"role": "assistant", "content": "A cat."}, _user("more"),
                                   {"role": "assistant", "content": "Green."}],
    "reply ending in newlines, empty reply": [_user("q"), {"role": "assistant", "content": ""}, _user(None, "q2"),
                                              {"role": "assistant", "content": "x\n\n"}],
    "prompt row": [_user(None, "what?"), {"role": "assistant", "content": "A cat."}, _user("and?")],
}


@pytest.fixture(scope="module")
def processors():
    """(Gemma 3 processor with the published template and single-token turn markers, its
    generation-template copy)."""
    proc = build_gemma3_processor()
    tok = proc.tokenizer
    tok.add_special_tokens({"bos_token": "<bos>", "additional_special_tokens": [
        AddedToken(t, special=True, normalized=False) for t in TURN_TOKENS]})
    assert tok.tokenize("<bos><start_of_turn>user\n<end_of_turn>")[:2] == ["<bos>", "<start_of_turn>"]
    proc.chat_template = tok.chat_template = published_template("gemma3")
    ref = copy.deepcopy(proc)
    ref.chat_template = ref.tokenizer.chat_template = generation_template("gemma3")
    return proc, ref


def _with_images(conversation: list) -> list:
    return [{**m, "content": [{"type": "image", "image": IMAGE} if p.get("type") == "image" else p
                              for p in m["content"]]} if isinstance(m["content"], list) else m
            for m in conversation]


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_and_labels_equal_the_chat_path_with_single_turn_tokens(processors, name):
    proc, ref = processors
    conversation = CONVERSATIONS[name]
    n_images = sum(p.get("type") == "image" for m in conversation if isinstance(m["content"], list)
                   for p in m["content"])
    out = ref.apply_chat_template(_with_images(conversation), tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True, add_generation_prompt=name == "prompt row")
    ids, mask = (np.asarray(out[k]).reshape(-1) for k in ("input_ids", "assistant_masks"))
    row = mmpipe.Encoder(proc).encode_row({"messages": conversation, "images": [IMAGE] * n_images})
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, np.where(mask == 1, ids, -100))
    flat = proc(text=proc.apply_chat_template(conversation, tokenize=False, add_generation_prompt=name == "prompt row"),
                images=[IMAGE] * n_images or None)
    np.testing.assert_array_equal(row.input_ids, np.asarray(flat["input_ids"]).reshape(-1))
    end = proc.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert row.input_ids[0] == proc.tokenizer.convert_tokens_to_ids("<bos>")
    # each labelled reply is one run ending in the single <end_of_turn> token, which is labelled
    labelled = np.flatnonzero(row.labels != -100)
    runs = np.split(labelled, np.flatnonzero(np.diff(labelled) != 1) + 1) if len(labelled) else []
    replies = [m for m in conversation if m["role"] == "assistant"]
    assert len(runs) == len(replies)
    assert all(row.input_ids[r[-1]] == end for r in runs)
    assert [proc.tokenizer.decode(row.input_ids[r[:-1]]) for r in runs] == [m["content"].strip() for m in replies]  # the template trims
