"""Encode, step 1: raw row -> (chat messages, images in order of appearance).

Accepted raw rows (the format is found by looking at the row):

(a) Hub convention: ``messages`` whose content lists hold ``{"type": "image"}`` placeholders,
    plus an ``images`` column (``Sequence(Image())``), consumed in order;
(b) inline images: content items ``{"type": "image", "image": <image>}``;
(c) verl style: ``prompt`` text (or a message list with string contents) containing
    ``<image>`` placeholders, plus an ``images`` column.

An image may be a ``datasets.Image()`` value (dict with bytes/path, or PIL), a path, raw
bytes, a PIL image or a uint8 array. Rows may also carry a ``completion`` (TRL
prompt-completion style) appended as the assistant turn.

Tool use (OpenAI format, what transformers' ``apply_chat_template`` takes): an assistant
message may carry ``tool_calls`` (``[{"type": "function", "function": {"name": str,
"arguments": dict | JSON object str}}]``); ``role: "tool"`` messages carry the tool's text
and images (their ``{"type": "image"}`` items take images from the ``images`` column in
order, like user turns) and may carry ``tool_call_id`` / ``name``; `parse_tools` reads a
row's ``tools`` column (a list of JSON-schema function specs, or that list as a JSON string).

The parsed messages carry only ``{"type": "image"}`` / ``{"type": "text", "text": str}``
items (or plain string contents), plus the tool fields above: what the chat template renders,
one image placeholder per image. Nothing here tokenizes or decodes; a malformed row raises `mmpipe.errors.ParseError`
or `mmpipe.errors.PlaceholderError` naming the row and column.
"""

from __future__ import annotations

from typing import Any, Optional

import json

import numpy as np

from mmpipe.errors import ParseError, PlaceholderError
from mmpipe.records.columns import IMAGE_PLACEHOLDER

__all__ = ["row_where", "is_image_item", "inline_image", "split_placeholders", "parse_tool_calls", "parse_tools",
           "parse_row"]


def row_where(idx: Optional[int]) -> str:
    """The location prefix of a raw row's errors: ``"row 7"``, or a hint to pass indices."""
    return f"row {idx}" if idx is not None else "row (index unknown: pass with_indices=True to map)"


def is_image_item(item: dict) -> bool:
    """Whether a content item stands for an image (``{"type": "image" | "image_url", ...}``,
    or an untyped item holding an ``image`` / ``image_url`` value)."""
    t = item.get("type")
    if t in ("image", "image_url"):
        return True
    return t is None and (item.get("image") is not None or item.get("image_url") is not None)


def inline_image(item: dict):
    """The image value an image item carries itself (``image``, ``image_url`` (str or
    ``{"url"}``), ``path`` or ``url``), or None when it is a bare placeholder."""
    if item.get("image") is not None:
        return item["image"]
    url = item.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    return url if url is not None else (item.get("path") or item.get("url"))


def split_placeholders(text: str) -> list[dict]:
    """Prompt text with ``<image>`` markers -> content items, one ``{"type": "image"}`` per
    marker and ``{"type": "text", "text": ...}`` for the (non-empty) text between them."""
    parts = text.split(IMAGE_PLACEHOLDER)
    items: list[dict] = []
    for i, part in enumerate(parts):
        if i:
            items.append({"type": "image"})
        if part:
            items.append({"type": "text", "text": part})
    return items


# ---- the steps of parse_row ---------------------------------------------------------------
def _raw_messages(example: dict, where: str) -> tuple[list, str]:
    """(the row's message list with its completion appended, the column it came from)."""
    if example.get("messages") is not None:
        raw = example["messages"]
        column = "messages"
    elif example.get("prompt") is not None:
        raw = example["prompt"]
        column = "prompt"
        if isinstance(raw, str):
            raw = [{"role": "user", "content": raw}]
    else:
        raise ParseError(
            f"found columns {sorted(example)}", where=where,
            expected="a 'messages' column (chat messages) or a 'prompt' column (text or chat messages)",
            fix="rename your column",
        )
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ParseError(f"column {column!r}: expected a non-empty list of chat messages, found {raw!r:.80}",
                         where=where, column=column,
                         fix="parse JSON-encoded messages first (json.loads)" if isinstance(raw, str) else
                             "drop rows without messages, or give at least one {'role', 'content'} message")
    completion = example.get("completion")
    if completion is not None:
        raw = list(raw) + ([{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion))
    return raw, column


def _column_images(example: dict, images_column: str, where: str) -> list:
    """The images column as a list ([] when absent)."""
    column_images = example.get(images_column)
    if column_images is not None and not isinstance(column_images, (list, tuple)) and not (
            isinstance(column_images, np.ndarray) and column_images.dtype == object and column_images.ndim == 1):
        # one bare image (or a string) instead of a list: iterating it would crash or split it (found by fuzzing)
        raise ParseError(f"column {images_column!r} must hold a list of images", where=where, column=images_column,
                         expected="a list (datasets.Sequence(datasets.Image()))", found=type(column_images).__name__,
                         fix=f"wrap it: {{{images_column!r}: [image]}}")
    return list(column_images) if column_images is not None else []


class _ImageQueue:
    """The images column, consumed in order by the placeholders of the messages."""

    def __init__(self, images: list, column: str, where: str):
        self.images, self.column, self.where, self.used = images, column, where, 0

    def take(self) -> Any:
        if self.used >= len(self.images):
            raise PlaceholderError(
                f"the messages hold more image placeholders than the "
                f"{len(self.images)} image(s) of column {self.column!r}", where=self.where,
                column=self.column, fix="give one image per placeholder",
            )
        self.used += 1
        return self.images[self.used - 1]

    def check_all_used(self) -> None:
        if self.used != len(self.images):
            raise PlaceholderError(
                f"column {self.column!r} holds {len(self.images)} image(s) but the messages hold "
                f"{self.used} placeholder(s) for them", where=self.where, column=self.column,
                fix=f"every image needs exactly one placeholder ({{'type': 'image'}} in a content list, or "
                    f"{IMAGE_PLACEHOLDER} in prompt text)",
            )


def _parse_item(item, m_i: int, queue: _ImageQueue, images: list, column: str, where: str) -> dict:
    """One content item -> its template item; an image item appends its image to ``images``."""
    if isinstance(item, str):
        return {"type": "text", "text": item}
    if not isinstance(item, dict):
        raise ParseError(f"message {m_i}: content item {item!r:.60} is not a dict", where=where, column=column,
                         expected="{'type': 'text', 'text': str} or {'type': 'image', ...}",
                         found=type(item).__name__, fix="wrap the item in a dict")
    if is_image_item(item):
        inline = inline_image(item)
        images.append(queue.take() if inline is None else inline)
        return {"type": "image"}
    if item.get("type") == "video" or item.get("video") is not None:
        raise ParseError(
            f"message {m_i}: video items are not supported by mmpipe.encode yet", where=where, column=column,
            fix="encode videos with the transformers processor and mmpipe.rows_from_processor_output",
        )
    text = item.get("text")
    if text is None:
        raise ParseError(f"message {m_i}: content item {item!r:.80} has neither text nor an image",
                         where=where, column=column, fix="give text items a 'text' string")
    if not isinstance(text, str):
        raise ParseError(f"message {m_i}: text must be a string, found {type(text).__name__}",
                         where=where, column=column, expected="str", found=type(text).__name__,
                         fix="convert the value to a string (str(x)) when building the dataset")
    return {"type": "text", "text": text}


def _parse_message(msg, m_i: int, queue: _ImageQueue, images: list, column: str, where: str) -> dict:
    """One raw message -> ``{"role", "content"}`` for the chat template."""
    if not isinstance(msg, dict) or "role" not in msg:
        raise ParseError(f"column {column!r}, message {m_i}: expected {{'role', 'content'}}, found {msg!r:.80}",
                         where=where, column=column, fix="give each message a 'role' and a 'content'")
    content = msg.get("content")
    if content is None:
        content = ""
    if isinstance(content, str):
        if not (IMAGE_PLACEHOLDER in content and queue.images):
            return {"role": msg["role"], "content": content}
        content = split_placeholders(content)
    if not isinstance(content, (list, tuple)):
        raise ParseError(
            f"column {column!r}, message {m_i}: content must be a string or a list of items, "
            f"found {type(content).__name__}", where=where, column=column,
            fix="store text as a string, or as [{'type': 'text', 'text': ...}] items",
        )
    items = [_parse_item(item, m_i, queue, images, column, where) for item in content]
    return {"role": msg["role"], "content": items}


def _tool_fields(msg: dict, m_i: int, column: str, where: str) -> dict:
    """The tool fields of one raw message that the chat template reads (None values left out:
    Arrow gives every message every key of the column's struct)."""
    out = {}
    calls = msg.get("tool_calls")
    if isinstance(calls, np.ndarray):
        calls = list(calls)
    if calls is not None and not (isinstance(calls, (list, tuple)) and not calls):  # None / [] = no calls
        if msg.get("role") != "assistant":
            raise ParseError(f"message {m_i} ({msg.get('role')!r}) carries tool_calls", where=where, column=column,
                             expected="tool_calls on assistant messages only", found=f"role {msg.get('role')!r}",
                             fix="move the calls to the assistant message that makes them")
        out["tool_calls"] = parse_tool_calls(calls, where=where, column=column, message=m_i)
    for key in ("tool_call_id", "name"):
        value = msg.get(key)
        if value is None or (not isinstance(value, str) and msg.get("role") != "tool"):
            continue  # only tool turns' ids and names matter to the templates: others are left as before
        if not isinstance(value, str):
            raise ParseError(f"message {m_i}: {key} must be a string", where=where, column=column,
                             expected="str", found=type(value).__name__, fix=f"store {key} as a string")
        out[key] = value
    return out


def _bad_call(what: str, where: str, column: str, message: int, k: int, found: Any) -> ParseError:
    return ParseError(
        f"message {message}, tool call {k}: {what}", where=where, column=column,
        expected='{"type": "function", "function": {"name": str, "arguments": dict or JSON object string}}',
        found=f"{found!r:.80}", fix="write tool calls in the OpenAI format (arguments as a dict or a JSON string)",
    )


def parse_tool_calls(calls: Any, *, where: str = "row", column: str = "messages", message: int = 0) -> list[dict]:
    """Validate an assistant message's ``tool_calls`` (OpenAI format) and return them as a list
    of plain dicts for the chat template, values unchanged (``arguments`` stays a dict or its
    JSON string, so the template renders exactly what transformers renders). A malformed value
    raises `ParseError` naming the row, the column, the message and the call."""
    if isinstance(calls, np.ndarray):
        calls = list(calls)
    if not isinstance(calls, (list, tuple)):
        raise ParseError(f"message {message}: tool_calls must be a list", where=where, column=column,
                         expected="a list of tool calls", found=type(calls).__name__,
                         fix="wrap a single call in a list; parse JSON-encoded tool_calls first (json.loads)")
    out = []
    for k, call in enumerate(calls):
        if not isinstance(call, dict):
            raise _bad_call("not a dict", where, column, message, k, call)
        fn = call.get("function") if call.get("function") is not None else call
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad_call("no function name", where, column, message, k, call)
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                decoded = json.loads(args)
            except ValueError:
                decoded = None
            if not isinstance(decoded, dict):
                raise _bad_call("arguments is not a JSON object string", where, column, message, k, args)
        elif not isinstance(args, dict):
            raise _bad_call("arguments must be a dict or a JSON object string", where, column, message, k, args)
        out.append({key: value for key, value in call.items() if value is not None})
    return out


def parse_tools(example: dict, *, idx=None, column: str = "tools", default: Optional[list] = None) -> Optional[list]:
    """The tool specs the chat template gets for this row: the row's ``column`` value when it is
    not None (a list of JSON-schema function specs, or that list as a JSON string), else
    ``default`` (the encode option ``tools=``). A malformed value raises `ParseError`."""
    value = example.get(column)
    if value is None:
        return default
    where = row_where(idx)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ParseError(f"column {column!r} holds a string that is not JSON ({e})", where=where, column=column,
                             expected="a list of tool specs or its JSON string", found=f"{value!r:.60}",
                             fix="store tools as a JSON string (json.dumps(tools)) or a list of dicts") from None
    if isinstance(value, np.ndarray):
        value = list(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, dict) for t in value):
        raise ParseError(f"column {column!r} must hold a list of tool specs", where=where, column=column,
                         expected='[{"type": "function", "function": {"name", "description", "parameters"}}]',
                         found=f"{value!r:.80}", fix="store tools as a list of dicts or its JSON string")
    return list(value)


def parse_row(example: dict, *, idx=None, images_column: str = "images") -> tuple[list[dict], list[Any]]:
    """Raw row -> (messages for the chat template, images in order of appearance).

    Returned messages carry only ``{"type": "image"}`` / ``{"type": "text", "text": ...}``
    items (or plain string contents), and the tool fields (``tool_calls`` on assistant
    messages, ``tool_call_id`` / ``name``); image values are returned separately. The row's
    ``tools`` are read by `parse_tools`.
    """
    where = row_where(idx)
    raw, column = _raw_messages(example, where)
    queue = _ImageQueue(_column_images(example, images_column, where), images_column, where)
    images: list[Any] = []
    messages = [_parse_message(msg, m_i, queue, images, column, where) for m_i, msg in enumerate(raw)]
    for m_i, (msg, raw_msg) in enumerate(zip(messages, raw)):
        msg.update(_tool_fields(raw_msg, m_i, column, where))
    queue.check_all_used()
    return messages, images
