"""Tokenization seams under a vocabulary with the real Qwen punctuation merges (hunt): the offline
tokenizer's ``merges="qwen-punct"`` set joins text across the places where mmpipe assembles chat
text from pieces (``" <"``, ``".\\n\\n"``, ``":\\n"``, ``"?!"``, ``"</"``), which the default set hides.

Against the processors' own chat path (``apply_chat_template(tokenize=True,
return_assistant_tokens_mask=True)`` on a ``{% generation %}`` copy of each published template):
ids and labels of rows users write (trailing spaces / colons / question marks / newlines before an
image, text right after it, replies beginning or ending with punctuation or newlines, multi-turn,
tool calls, reasoning), per row (``pixels="uint8"`` and ``"none"``) and through the batched layout
path; positions against ``get_rope_index``; vLLM prompts of prompt rows; Qwen3-VL / GLM-4.1V video
rows whose first timestamp follows punctuation; long texts tokenized in pieces.

Found here: on the generic path a row WITH images ignored the template's ``{% generation %}``
blocks (LLaVA-1.5's published template: ``"ASSISTANT: "`` + reply + ``" "`` in a block, the
generation prompt ``"ASSISTANT:"``): it labelled the header's space and dropped the reply's own
trailing space, while the same row without images (and transformers' assistant mask) did the opposite.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe.encoding import layout_batch
from mmpipe.encoding.dataset import make_encoder
from mmpipe.encoding.tokenize import tokenize_text
from mmpipe.offline.published_templates import generation_template, published_template
from mmpipe.offline.tokenizer import base_tokenizer, build_tokenizer

U, A = "user", "assistant"
MERGES = "qwen-punct"
TOOL_CALL = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}


def _user(*parts) -> dict:
    return {"role": U, "content": [{"type": "image"} if p is None else {"type": "text", "text": p} for p in parts]}


def _reply(content, **kw) -> dict:
    return {"role": A, "content": content, **kw}


CONVERSATIONS = {
    "colon and space before the image": [_user("Look at this: ", None, "\nWhat is it?\n"), _reply("It is a cat.\n\n")],
    "question mark before the image": [_user("What is this?", None), _reply("A dog.")],
    "newlines before, punctuation after": [_user("Describe.\n\n", None, ". And?"), _reply("...well, (maybe) a dog!")],
    "reply starts with newlines": [_user(None, "Q:"), _reply("\n\n**Answer:** 42.\n")],
    "reply starts with ' <'": [_user("Tag it:", None), _reply(" <b>bold</b> ")],
    "punctuation only": [_user("?", None, "?"), _reply("?!\n")],
    "multi-turn": [_user("First: ", None), _reply("A: cat."), _user("And now? ", None, " (second)"),
                   _reply("\"B\": dog.\n\n")],
    "tool call": [_user("weather in Paris? "), _reply("Let me check:\n", tool_calls=[TOOL_CALL]),
                  {"role": "tool", "content": "{\"temp\": 20}\n"}, _reply("It is 20 degrees.")],
    "system ends in newlines": [{"role": "system", "content": "Be brief.\n\n"}, _user(None, ":"), _reply(": yes.")],
    "reasoning in the reply": [_user("Why? ", None), _reply("<think>\nhmm... ok.\n</think>\n\nBecause: reasons.")],
}


def _n_images(conversation: list) -> int:
    return sum(1 for m in conversation if isinstance(m["content"], list)
               for p in m["content"] if p.get("type") == "image")


def _images(n: int) -> list:
    return [Image.new("RGB", (40 + 12 * i, 30 + 5 * i), (30 * i, 120, 60)) for i in range(n)]


def _glm_tokenizer():
    """GLM-4.1V's offline tokenizer (`mmpipe.offline.glm4v`) over the punctuation merges."""
    from tokenizers import AddedToken

    from mmpipe.compat import extra_special_tokens_key
    from mmpipe.offline.glm4v import GLM4V_EXTRA_TOKENS, GLM4V_SPECIAL_TOKENS

    tok = base_tokenizer(MERGES)
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in GLM4V_SPECIAL_TOKENS], special_tokens=True)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in GLM4V_EXTRA_TOKENS])
    tok.add_special_tokens({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
                            extra_special_tokens_key(): [t for t in GLM4V_SPECIAL_TOKENS if t != "<|endoftext|>"]})
    return tok


def _processor(family: str, template: str):
    """The family's offline processor class around the punctuation-merge tokenizer and ``template``."""
    from mmpipe.testing import build_processor

    base = build_processor(family)
    tok = _glm_tokenizer() if family == "glm4v" else build_tokenizer(family, merges=MERGES)
    tok.chat_template = template
    return type(base)(image_processor=base.image_processor, tokenizer=tok, chat_template=template)


def _as_family_takes(family: str, conversation: list) -> list:
    """GLM-4.1V's template prints assistant / system content verbatim: give it strings."""
    if family != "glm4v":
        return conversation
    return [{**m, "content": "".join(p["text"] for p in m["content"])}
            if m["role"] in (A, "system") and isinstance(m["content"], list) else m for m in conversation]


def _reference(ref, conversation: list, images: list) -> tuple[np.ndarray, np.ndarray]:
    """transformers' ids and labels (assistant mask): the processor's chat path, the tokenizer's
    for a row without images."""
    it = iter(images)
    conv = [{**m, "content": [{"type": "image", "image": next(it)} if p.get("type") == "image" else p
                              for p in m["content"]]} if isinstance(m["content"], list) else m for m in conversation]
    target = ref if images else ref.tokenizer
    out = target.apply_chat_template(conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = np.asarray(out["input_ids"]).reshape(-1), np.asarray(out["assistant_masks"]).reshape(-1)
    return ids, np.where(mask == 1, ids, -100)


FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(family, processor with the published template, with its generation copy, the rows, references)."""
    fam = request.param
    proc, ref = _processor(fam, published_template(fam)), _processor(fam, generation_template(fam))
    raws, refs = [], []
    for conversation in CONVERSATIONS.values():
        conversation = _as_family_takes(fam, conversation)
        images = _images(_n_images(conversation))
        raws.append({"messages": conversation, "images": images})
        refs.append(_reference(ref, conversation, images))
    return fam, proc, raws, refs


def test_the_merge_set_joins_across_seams():
    tok = build_tokenizer("qwen2_vl", merges=MERGES)
    pieces = tok.convert_ids_to_tokens(tok("Look: <a>?\n\nend.\n\nx \n", add_special_tokens=False)["input_ids"])
    assert {"Ġ<", "?ĊĊ", ".ĊĊ", "ĠĊ"} <= set(pieces), pieces
    assert MERGES in mmpipe.offline.tokenizer.MERGE_SETS


@pytest.mark.parametrize("pixels", ["uint8", "none"])
def test_rows_equal_the_chat_path(family, pixels):
    fam, proc, raws, refs = family
    for name, raw, (ids, labels) in zip(CONVERSATIONS, raws, refs):
        row = mmpipe.encode_row(raw, proc, pixels=pixels)
        np.testing.assert_array_equal(row.input_ids, ids, err_msg=f"{fam} {name}")
        np.testing.assert_array_equal(row.labels, labels, err_msg=f"{fam} {name}")


def test_batched_layout_path_equals_the_chat_path(family):
    fam, proc, raws, refs = family
    cols, fast = layout_batch.encode_layout(make_encoder(proc, pixels="none"), raws, list(range(len(raws))))
    assert fast == list(range(len(raws)))
    for j, (ids, labels) in enumerate(refs):
        np.testing.assert_array_equal(np.asarray(cols["input_ids"][j]), ids, err_msg=f"{fam} row {j}")
        np.testing.assert_array_equal(np.asarray(cols["labels"][j]), labels, err_msg=f"{fam} row {j}")


def test_positions_and_vllm_prompts(family):
    """Positions == the model's get_rope_index; a prompt row's vLLM prompt is the template's text with
    the generation prompt, which the processor expands back into the row."""
    from mmpipe.offline import build_model
    from mmpipe.rollout import to_vllm_prompts
    from mmpipe.testing.invariants import assert_positions_match_rows

    fam, proc, raws, _ = family
    model = build_model(fam)
    rows = [mmpipe.encode_row(raw, proc) for raw in raws if raw["images"]]
    assert_positions_match_rows(mmpipe.collate(rows, processor=proc), rows, model=model)
    for raw in raws:
        last_user = max(i for i, m in enumerate(raw["messages"]) if m["role"] == U)
        msgs = raw["messages"][:last_user + 1]
        images = raw["images"][:_n_images(msgs)]
        row = mmpipe.encode_row({"messages": msgs, "images": images}, proc)
        prompt = to_vllm_prompts([row], proc)[0]
        text = proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        assert prompt["prompt_token_ids"] == proc.tokenizer(text, add_special_tokens=False)["input_ids"]
        if images:
            out = proc(text=[text], images=prompt["multi_modal_data"]["image"], images_kwargs={"do_resize": False})
            assert out["input_ids"][0] == row.input_ids.tolist()


def test_text_family_equals_the_tokenizer_chat_path():
    from mmpipe.offline.chat_templates import chat_template

    tok = build_tokenizer("qwen2_vl", merges=MERGES)
    ref = copy.deepcopy(tok)
    ref.chat_template = chat_template("qwen2_vl", generation=True)
    for name, conversation in CONVERSATIONS.items():
        conversation = [{**m, "content": "".join(p.get("text", "") for p in m["content"])}
                        if isinstance(m["content"], list) else m for m in conversation]
        ids, labels = _reference(type("P", (), {"tokenizer": ref})(), conversation, [])
        row = mmpipe.encode_row({"messages": conversation}, tok)
        np.testing.assert_array_equal(row.input_ids, ids, err_msg=name)
        np.testing.assert_array_equal(row.labels, labels, err_msg=name)


@pytest.mark.parametrize("fam", ["qwen3_vl", "glm4v"])
def test_video_after_punctuation_round_trips(fam):
    """A video right after text ending in punctuation or a space (Qwen3-VL on transformers >= 5.25
    glues its first timestamp to that text): the row's ids are the tokenizer's for its own text, the
    reply is labelled, and the vLLM prompt is the template's text."""
    from mmpipe.rollout import to_vllm_prompts

    proc = _processor(fam, published_template(fam))
    tok = proc.tokenizer
    rng = np.random.default_rng(0)
    opts = {"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 16}
    for before in ("What happens in ", "Watch (", "Look:  ", "a<", "x \n"):
        content = [{"type": "text", "text": before}, {"type": "video"}, {"type": "text", "text": "? ok"}]
        video = {"frames": [rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for _ in range(4)], "fps": 2.0}
        row = mmpipe.encode_row({"messages": [{"role": U, "content": content}, _reply("A thing.")], "videos": [video]},
                                proc, video_options=opts)
        text = tok.decode(row.input_ids.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert tok(text, add_special_tokens=False)["input_ids"] == row.input_ids.tolist(), before
        assert tok.decode(row.input_ids[row.labels != -100].tolist()).startswith("A thing."), before
        msgs = [{"role": U, "content": content}]
        prompt = to_vllm_prompts([mmpipe.encode_row({"messages": msgs, "videos": [video]}, proc, video_options=opts)],
                                 proc)[0]
        want = tok(proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
        assert prompt["prompt_token_ids"] == want["input_ids"], before


def test_long_text_pieces_equal_one_call():
    """Pieces cut only where the punctuation-merge tokenizer itself splits: == one call, offsets too."""
    tok = build_tokenizer("qwen2_vl", merges=MERGES)
    parts = ["word", " word", ".", ".\n", ".\n\n", ":", ": ", " <", "<", "?\n", "!\n\n", " (", ")", " \"", "\n\n",
             "  ", "}\n", "...", " \n", "\u4e2d", "e\u0301", "\r\n", "<|im_end|>", "<think>", " </", ">\n\n"]
    rng = random.Random(0)
    for _ in range(150):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(20, 150)))
        whole = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = tokenize_text(tok, text, True, min_chars=0, piece=rng.randint(4, 40), window=rng.randint(2, 20))
        assert ids.tolist() == whole["input_ids"], repr(text)
        assert offsets.tolist() == [list(o) for o in whole["offset_mapping"]], repr(text)


# ---- the generic path: LLaVA-1.5's published template ---------------------------------------------
LLAVA_15 = (
    "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}{% endfor %}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


@pytest.mark.parametrize("merges", ["default", MERGES])
def test_generic_rows_with_images_follow_the_generation_blocks(merges):
    """The generic path labels a row with images as the template's ``{% generation %}`` blocks mark
    it (transformers' assistant mask), as it labels the same row without images. Was: the header's
    space after ``ASSISTANT:`` labelled, the reply's trailing space not (from the generation-prompt
    render ``ASSISTANT:``, which is no prefix of the conversation's)."""
    import tempfile

    from mmpipe.offline.other_vlms import build_foreign_processor

    base = build_foreign_processor("llava")
    tok = build_tokenizer("qwen2_vl", merges=merges)
    with tempfile.TemporaryDirectory() as d:  # the LLaVA processor reads tokenizer.image_token
        tok.save_pretrained(d)
        tok = type(tok).from_pretrained(d, extra_special_tokens={"image_token": "<image>"})
    tok.chat_template = LLAVA_15
    proc = type(base)(image_processor=base.image_processor, tokenizer=tok, chat_template=LLAVA_15, patch_size=16,
                      vision_feature_select_strategy="default", num_additional_image_tokens=1)
    conversations = [[_user(None, "What is it?"), _reply([{"type": "text", "text": "A cat."}])],
                     [_user("Q:", None), _reply([{"type": "text", "text": " <b>x</b>"}]), _user("and", None),
                      _reply([{"type": "text", "text": "\n(no)."}])],
                     [_user("What is it?"), _reply([{"type": "text", "text": "A cat."}])]]
    for conversation in conversations:
        images = _images(_n_images(conversation))
        ids, labels = _reference(proc, conversation, images)
        row = mmpipe.Encoder(proc, pixels="float32").encode_row({"messages": conversation, "images": images})
        assert row.family == "generic"
        np.testing.assert_array_equal(row.input_ids, ids)
        got = [tok.decode([i]) for i in row.input_ids[row.labels != -100]]
        assert got == [tok.decode([i]) for i in ids[labels != -100]], got
