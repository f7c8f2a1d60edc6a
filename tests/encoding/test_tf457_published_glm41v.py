"""GLM-4.1V's chat template as published (`mmpipe.offline.glm4v.GLM4V_PUBLISHED_CHAT_TEMPLATE`) on
transformers 4.57's ``Glm4vProcessor`` (scripts/envs/tf457.sh): rows and labels equal the processor's
own outputs there, with a system prompt, ``tools=``, a tool-call turn and its response, images in two
turns, ``enable_thinking`` left out / False (the conversations of test_hunt_published_glm46v.py).

4.57's processor chat path (``tokenize=True``) takes only content lists (a string content fails in its
image gathering: ``content["type"]`` of a str), and this template prints a content list verbatim, so
the references are the flat call on the rendered text (ids, pixels) and the tokenizer's assistant
mask on the template's ``{% generation %}`` copy, its image tokens expanded by the grids (labels).
"""

from __future__ import annotations

import numpy as np
import pytest

import mmpipe

from test_hunt_published_glm46v import CONVERSATIONS, KW_IDS, KWARGS, TOOLS, _images, glm41v  # noqa: F401 (fixture)

pytestmark = pytest.mark.needs_env("tf457")


@pytest.mark.parametrize("kw", KWARGS, ids=KW_IDS)
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_glm41v_published_rows_and_labels_on_4_57(glm41v, name, kw):
    import transformers

    assert transformers.__version__.startswith("4.57")
    proc, ref = glm41v
    conv, images = CONVERSATIONS[name], _images(CONVERSATIONS[name])
    row = mmpipe.Encoder(proc, tools=TOOLS, **({"chat_template_kwargs": kw} if kw else {})).encode_row(
        {"messages": conv, "images": images})
    flat = proc(text=[proc.apply_chat_template(conv, tools=TOOLS, tokenize=False, **kw)], images=images or None,
                return_tensors="np")
    assert row.input_ids.tolist() == flat["input_ids"][0].tolist()
    if images:
        got = mmpipe.collate([row], processor=proc).model_inputs()
        np.testing.assert_array_equal(got["pixel_values"].numpy(), flat["pixel_values"])
    masked = ref.tokenizer.apply_chat_template(conv, tools=TOOLS, tokenize=True, return_dict=True,
                                               return_assistant_tokens_mask=True, **kw)
    image_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
    grids = iter(flat["image_grid_thw"]) if images else iter(())
    ids, mask = [], []
    for tok, m in zip(masked["input_ids"], masked["assistant_masks"]):
        n = int(np.prod(next(grids))) // proc.image_processor.merge_size ** 2 if tok == image_id else 1
        ids, mask = ids + [tok] * n, mask + [m] * n
    assert ids == row.input_ids.tolist()
    assert row.labels.tolist() == np.where(np.asarray(mask) == 1, ids, -100).tolist()
    assert (row.labels != -100).any()
