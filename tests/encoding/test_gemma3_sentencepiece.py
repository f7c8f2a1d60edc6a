"""Gemma 3 with a tokenizer built like its published one (`mmpipe.offline.gemma_tokenizer`: a
SentencePiece-style BPE with byte fallback and learned merges that adds its own ``<bos>``, newline
runs as plain added tokens) and the published chat template, which writes ``{{ bos_token }}`` too.

Found with it (both fail on the old code): the native (tiled) encoder tokenized the rendered text
with the tokenizer's special tokens, so every row began ``<bos><bos>`` where the processor's chat
path (which leaves them out when the text starts with the BOS) has one; and a reply's labels took
the ``"\\n"`` after ``<end_of_turn>`` because the end-of-turn probe counted any added token, the
newline ones included. Ids and labels must equal the processor's chat path with transformers'
assistant mask (a ``{% generation %}`` copy of the published template), on the native path and
the generic one; the flat call on the rendered text has the double BOS (transformers' behaviour)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.compat import is_transformers_5
from mmpipe.testing import invariants

from helpers import reply, user_turn  # noqa: E402

pytestmark = pytest.mark.skipif(not is_transformers_5(), reason="transformers 5's GemmaTokenizer builds from vocab and merges")

IMAGE = Image.new("RGB", (40, 30), (30, 120, 60))


CONVERSATIONS = {
    "system, image, two replies": [{"role": "system", "content": "Be brief."}, user_turn(None, "what?"),
                                   reply("A cat."), user_turn("more"), reply("Green.")],
    "bytes beyond the vocabulary": [user_turn(None, "Über café 東京 🙂 naïve?"), reply("Ja — 🙂 東京!  two  spaces")],
    "spaces and newlines": [user_turn("  leading and trailing  ", None, " after the image"),
                            reply("  indented\n\n\ncode  ")],
    "two images side by side": [user_turn(None, None, "compare"), reply("Same.")],
    "a long row": [user_turn(None, "the picture shows " * 600), reply("a long reply " * 400)],
    "prompt row": [user_turn(None, "what?"), reply("A cat."), user_turn("and?")],
}


@pytest.fixture(scope="module")
def processors():
    """(the Gemma 3 processor with the Gemma-structured tokenizer and published template, its
    generation-template copy)."""
    from mmpipe.offline.gemma3 import build_gemma3_processor
    from mmpipe.offline.published_templates import generation_template

    proc = build_gemma3_processor(tokenizer="gemma")
    assert proc.tokenizer("a").input_ids[0] == proc.tokenizer.bos_token_id  # it adds its BOS
    ref = copy.deepcopy(proc)
    ref.chat_template = ref.tokenizer.chat_template = generation_template("gemma3")
    return proc, ref


def _images(conversation: list) -> int:
    return sum(p.get("type") == "image" for m in conversation if isinstance(m["content"], list) for p in m["content"])


def _chat_path(ref, conversation: list, agp: bool) -> tuple[np.ndarray, np.ndarray]:
    with_images = [{**m, "content": [{"type": "image", "image": IMAGE} if p.get("type") == "image" else p
                                     for p in m["content"]]} if isinstance(m["content"], list) else m
                   for m in conversation]
    out = ref.apply_chat_template(with_images, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                                  add_generation_prompt=agp)
    ids, mask = (np.asarray(out[k]).reshape(-1) for k in ("input_ids", "assistant_masks"))
    return ids, np.where(mask == 1, ids, -100)


@pytest.mark.parametrize("family", [None, "generic"])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_ids_and_labels_equal_the_chat_path(processors, name, family):
    proc, ref = processors
    conversation, agp = CONVERSATIONS[name], name == "prompt row"
    ids, labels = _chat_path(ref, conversation, agp)
    row = mmpipe.Encoder(proc, family=family).encode_row({"messages": conversation,
                                                          "images": [IMAGE] * _images(conversation)})
    np.testing.assert_array_equal(row.input_ids, ids)
    np.testing.assert_array_equal(row.labels, labels)
    tok = proc.tokenizer
    assert row.input_ids[0] == tok.bos_token_id and row.input_ids[1] != tok.bos_token_id
    end = tok.convert_tokens_to_ids("<end_of_turn>")
    labelled = np.flatnonzero(row.labels != -100)
    runs = np.split(labelled, np.flatnonzero(np.diff(labelled) != 1) + 1) if len(labelled) else []
    assert runs and all(row.input_ids[r[-1]] == end for r in runs)  # each reply ends at its <end_of_turn>
    flat = proc(text=proc.apply_chat_template(conversation, tokenize=False, add_generation_prompt=agp),
                images=[IMAGE] * _images(conversation) or None)
    np.testing.assert_array_equal(np.asarray(flat["input_ids"]).reshape(-1), np.r_[tok.bos_token_id, row.input_ids])


def test_rows_batch_as_the_processor_call(processors):
    """The rows' tiles expand to the processor's own pixel values, and unbatch(collate(rows)) == rows."""
    proc, _ = processors
    names = ["system, image, two replies", "two images side by side", "prompt row"]
    rows = [mmpipe.encode_row({"messages": CONVERSATIONS[n], "images": [IMAGE] * _images(CONVERSATIONS[n])}, proc)
            for n in names]
    batch = invariants.assert_roundtrip(rows, processor=proc)
    n = sum(_images(CONVERSATIONS[k]) for k in names)
    own = proc(images=[IMAGE] * n, text=["<start_of_image>" * n], return_tensors="np")
    np.testing.assert_array_equal(np.asarray(batch.pixel_values), own["pixel_values"])
