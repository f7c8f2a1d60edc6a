"""The prompt side of `mmpipe.hosts.trl_grpo.VisionGRPOTrainer`: a dataset row of TRL's GRPO
loop -> the raw row mmpipe encodes as the generation prompt, and the ``prompts`` the reward
functions get, both as stock ``trl.GRPOTrainer`` reads its rows:

- TRL's VLM rows: ``prompt`` messages (structured, or with string contents: TRL puts the images
  before the first user turn's text) + an ``image`` / ``images`` column;
- no ``completion`` and no trailing assistant turns of ``messages`` in the prompt;
- reward functions get each prompt with its images in the image parts
  (``{"type": "image", "image": <PIL>}``, TRL's ``prepare_multimodal_messages``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Sequence

import numpy as np

from mmpipe.encoding.media import is_audio_item, is_video_item
from mmpipe.encoding.row_checks import is_image_item
from mmpipe.errors import ArgumentError
from mmpipe.records.columns import AUDIO_PLACEHOLDER, IGNORE_INDEX, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER
from mmpipe.records.row import MultiModalInputs

IMAGE_KEYS = ("image", "images")


def is_encoded_row(x: Any) -> bool:
    """Whether a dataset row was written by `mmpipe.encode_dataset` (its ``family`` marker and
    ``input_ids``), as opposed to a raw row that merely has a column named ``family``."""
    return isinstance(x, Mapping) and "family" in x and "input_ids" in x


def row_images(x: Mapping) -> list:
    """A raw row's images as a list: ``images``, else TRL's one-image ``image`` column (None = none)."""
    if "images" in x:
        return list(x["images"] or [])
    image = x.get("image")
    return [] if image is None else [image]


def raw_prompt(x: Mapping, i: int) -> dict:
    """Row ``i`` as the raw row to encode as a generation prompt: ``images`` (from ``image`` too),
    TRL's string-content prompt given its image placeholders, the answer left out."""
    raw = dict(x)
    if "images" not in raw and "image" in raw:  # TRL's one-image column
        raw["images"] = row_images({"image": raw.pop("image")})
    if raw.get("images") and _is_chat(raw.get("prompt")):
        raw["prompt"] = _with_image_parts(raw["prompt"], len(raw["images"]))
    return _prompt_only(raw, i)


def reward_prompts(prompts: Sequence, image_columns: Sequence[Mapping]) -> list:
    """The prompts as stock TRL hands them to reward functions: each conversational prompt with its
    row's images in the image parts (``trl.data_utils.prepare_multimodal_messages``). A prompt
    TRL could not fill (placeholders and images disagree) is passed as it is."""
    from trl.data_utils import prepare_multimodal_messages

    out = []
    for prompt, cols in zip(prompts, image_columns):
        images = row_images(cols)
        if images and _is_chat(prompt):
            try:
                prompt = prepare_multimodal_messages(prompt, images=images)
            except (ValueError, KeyError, TypeError):
                pass
        out.append(prompt)
    return out


def _is_chat(prompt: Any) -> bool:
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, Mapping) for m in prompt)


def _with_image_parts(prompt: Sequence[Mapping], n: int) -> list:
    """TRL's rule for prompts without image placeholders: ``n`` ``{"type": "image"}`` parts before
    the text of the first user turn with a string content. Prompts that hold placeholders
    (structured parts or ``<image>`` text) are left to mmpipe's own parsing."""
    if any(_has_media(m) for m in prompt):
        return list(prompt)
    out, done = [], False
    for m in prompt:
        if not done and m.get("role") == "user" and isinstance(m.get("content"), str):
            m = {**m, "content": [{"type": "image"}] * n + [{"type": "text", "text": m["content"]}]}
            done = True
        out.append(m)
    return out


def check_prompt_labels(row: MultiModalInputs, i: int) -> MultiModalInputs:
    """Refuse an encoded row with target tokens: it was encoded for SFT (``labels=True``), so its
    ids end with the assistant's answer, and the policy would be sampled after that answer."""
    if row.labels is not None:
        n = int((np.asarray(row.labels) != IGNORE_INDEX).sum())
        if n:
            raise ArgumentError(f"row {i}: an encoded row with {n} target tokens in 'labels': it was encoded for SFT "
                                "and its ids hold the assistant's answer, which VisionGRPOTrainer would prompt the "
                                "policy with; expected prompt rows; fix: encode the prompts with "
                                "mmpipe.encode_dataset(ds, processor, labels=False) from rows without the answer "
                                "(a 'prompt' column), or pass the raw rows (answers are then left out)")
    return row


def _prompt_only(raw: dict, i: int) -> dict:
    """A raw row as the prompt to generate from: without TRL's ``completion`` column (stock
    ``GRPOTrainer`` generates from ``prompt`` alone) and without the assistant turns that end a
    ``messages`` conversation (an SFT-style row's answer). Encoded as they are, both would put the
    reference answer into the prompt, and the model would be sampled after its end-of-turn token
    instead of after the assistant header. The reward functions get the row's whole ``messages``."""
    raw.pop("completion", None)
    messages = raw.get("messages")
    if "prompt" in raw or not isinstance(messages, (list, tuple)):
        return raw
    keep = len(messages)
    while keep and isinstance(messages[keep - 1], Mapping) and messages[keep - 1].get("role") == "assistant":
        keep -= 1
    if keep == len(messages):
        return raw
    if keep == 0:
        raise ArgumentError(f"row {i}: column 'messages' holds only assistant turns: nothing to prompt with; "
                            "expected a conversation ending with a user (or tool) turn; fix: give each row a "
                            "'prompt' (TRL style) or a 'messages' conversation with the user's question")
    if any(_has_media(m) for m in messages[keep:]):
        raise ArgumentError(f"row {i}: the assistant turns that end column 'messages' hold images / videos: "
                            "VisionGRPOTrainer generates from the conversation before them and cannot tell which "
                            "of the row's images they take; expected media in the prompt turns only; fix: "
                            "give the rows as 'prompt' (the turns to generate from) + 'images'")
    raw["messages"] = list(messages[:keep])
    return raw


def _has_media(message: Any) -> bool:
    """Whether a raw chat message holds an image / video / audio item or placeholder text (the
    classifiers `mmpipe.encode` parses items with)."""
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, str):
        return any(tag in content for tag in (IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, AUDIO_PLACEHOLDER))
    # Arrow gives every content item every key of the column's struct: an absent image is None
    return any(isinstance(item, Mapping) and (is_image_item(item) or is_video_item(item) or is_audio_item(item))
               for item in content or ())
