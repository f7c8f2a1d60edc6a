"""Row-level shape checks that run before a raw row is parsed: the row is a mapping, it holds
one message source (``messages`` or ``prompt``), and its ``completion`` is text or messages.
Each failure is a `ParseError` naming the row and column (`mmpipe.encoding.parse` calls them)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mmpipe.errors import ParseError


def check_row(example: Any, where: str) -> None:
    """A raw row must be a mapping of columns (a dict, a datasets row)."""
    if not isinstance(example, Mapping):
        raise ParseError("a row must be a dict of columns", where=where, expected="a dict such as "
                         "{'messages': [...], 'images': [...]}", found=f"{type(example).__name__} {example!r:.60}",
                         fix="pass one row (a dict) per call; for a dataset use ds.map(mmpipe.encode, ...)")


def check_completion(completion: Any, where: str) -> None:
    """A ``completion`` (TRL prompt-completion style) is the assistant reply as text or as a
    list of chat messages."""
    if completion is not None and not isinstance(completion, (str, list, tuple)):
        raise ParseError("the completion is neither text nor chat messages", where=where, column="completion",
                         expected="a string or a list of {'role', 'content'} messages",
                         found=f"{type(completion).__name__} {completion!r:.60}",
                         fix="give the assistant reply as a string, or drop the column")


# ---- the steps of parse_row ---------------------------------------------------------------
def _message_texts(messages) -> set:
    """The text of each message (a string content, or its text items joined)."""
    contents = [m.get("content") for m in messages if isinstance(m, dict)]
    return {c if isinstance(c, str) else "".join(str(i.get("text") or "") for i in c if isinstance(i, dict)
                                                 and not is_image_item(i)) for c in contents
            if isinstance(c, (str, list, tuple, np.ndarray))}


def check_one_source(example: dict, where: str) -> None:
    """Refuse a row holding both ``messages`` and ``prompt`` (or either and ShareGPT
    ``conversations``): the other (and its image placeholders) would be ignored. A prompt repeating a message's text verbatim (the
    UltraChat layout: ``prompt`` = the first user turn) is allowed."""
    messages, prompt = example.get("messages"), example.get("prompt")
    filled = [v is not None and not (isinstance(v, (str, list, tuple, np.ndarray)) and len(v) == 0)
              for v in (messages, prompt, example.get("conversations"))]  # datasets fills a missing column with None
    if filled[2] and any(filled[:2]):
        column = "messages" if filled[0] else "prompt"
        raise ParseError(f"the row holds both a {column!r} and a 'conversations' column; mmpipe would encode "
                         f"{column!r} and ignore the conversations", where=where, column="conversations",
                         expected="one of 'messages', 'prompt' or 'conversations' per row", found="both filled",
                         fix=f"drop one of the two columns (ds.remove_columns('conversations') or {column!r})")
    filled = filled[:2]
    if not all(filled) or (isinstance(prompt, str) and isinstance(messages, (list, tuple, np.ndarray))
                           and prompt in _message_texts(messages)):
        return
    raise ParseError("the row holds both a 'messages' and a 'prompt' column; mmpipe would encode 'messages' and "
                     "ignore the prompt (and its image placeholders)", where=where, column="messages",
                     expected="one of 'messages' or 'prompt' per row", found="both filled",
                     fix="drop one of the two columns (ds.remove_columns('prompt') or 'messages'), or set it "
                         "to None in rows that use the other")


def is_image_item(item: dict) -> bool:
    """Whether a content item stands for an image (``{"type": "image" | "image_url" | "input_image"
    (OpenAI Responses), ...}``, or an untyped item holding an ``image`` / ``image_url`` value)."""
    t = item.get("type")
    if t in ("image", "image_url", "input_image"):
        return True
    return t is None and (item.get("image") is not None or item.get("image_url") is not None)

