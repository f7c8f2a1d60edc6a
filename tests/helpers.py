"""Reference computations with transformers itself, used by several test modules."""

from __future__ import annotations

import numpy as np


def processor_reference(processor, messages, images, add_generation_prompt=None):
    """What the transformers processor returns for a chat row (numpy)."""
    if add_generation_prompt is None:
        add_generation_prompt = messages[-1]["role"] != "assistant"
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    out = processor(text=[text], images=list(images) or None, return_tensors="np")
    return {k: np.asarray(v) for k, v in out.items()}


def assistant_texts(messages):
    out = []
    for m in messages:
        if m["role"] == "assistant":
            c = m["content"]
            out.append(c if isinstance(c, str) else "".join(i["text"] for i in c if i.get("type") == "text"))
    return out
