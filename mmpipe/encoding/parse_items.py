"""Encode, step 1 (part): one content item of a chat message -> its chat-template item
(`mmpipe.encoding.parse` calls `parse_item` for each item of a content list).

Accepted items: text (``{"type": "text", "text": str}``, a bare string, or any item with a
``text`` string: OpenAI Responses' ``input_text`` / ``output_text``); images (``{"type":
"image"}`` as a placeholder for the next value of the images column, or carrying the image:
``image``, ``image_url`` (a string or ``{"url"}``), ``path``, ``url``; OpenAI Responses'
``{"type": "input_image", "image_url": str}`` the same way); videos and audio clips
(`mmpipe.encoding.media`). Datasets read through pandas or ``with_format("numpy")`` hold lists
as object arrays: `as_list` turns them back into lists.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from mmpipe.encoding.media import inline_audio, inline_video, is_audio_item, is_video_item
from mmpipe.encoding.row_checks import is_image_item
from mmpipe.errors import ParseError

__all__ = ["RESPONSES_IMAGE", "as_list", "check_text", "is_image_item", "inline_image", "parse_item"]

_SURROGATE = re.compile("[\ud800-\udfff]")
# OpenAI Responses API image part: {"type": "input_image", "image_url": str, "detail": ...} or {"file_id": str}
RESPONSES_IMAGE = "input_image"


def as_list(value: Any) -> Any:
    """``value``, or the list a 1-D object array stores (how pandas and ``datasets``' numpy
    format hand over a list column's value: messages, content items)."""
    if isinstance(value, np.ndarray) and value.dtype == object and value.ndim == 1:
        return value.tolist()
    return value


def inline_image(item: dict):
    """The image value an image item carries itself (``image``, ``image_url`` (str or
    ``{"url"}``), ``path`` or ``url``), or None when it is a bare placeholder."""
    if item.get("image") is not None:
        return item["image"]
    url = item.get("image_url")
    if isinstance(url, dict):
        url = url.get("url")
    return url if url is not None else (item.get("path") or item.get("url"))


def check_text(text: str, *, where: str, column: str, what: str) -> str:
    """``text``, refused with `ParseError` when it holds a lone UTF-16 surrogate (``"\\ud800"``:
    no tokenizer can encode it). ``what`` names the text (``"message 2"``)."""
    if not text.isascii():
        bad = _SURROGATE.search(text)
        if bad is not None:
            raise ParseError(f"{what}: the text holds a lone UTF-16 surrogate at character {bad.start()}",
                             where=where, column=column, expected="valid Unicode text",
                             found=f"{bad.group()!r} at character {bad.start()}",
                             fix="repair the text when building the dataset (a split pair: "
                                 "s.encode('utf-16', 'surrogatepass').decode('utf-16'); else drop it: "
                                 "s.encode('utf-8', 'replace').decode())")
    return text


def _image_value(item: dict, m_i: int, column: str, where: str):
    """The image an image item carries, or None (a placeholder); an OpenAI Responses
    ``input_image`` that names an uploaded file (``file_id``) instead is a `ParseError`."""
    inline = inline_image(item)
    if inline is None and item.get("type") == RESPONSES_IMAGE and item.get("file_id") is not None:
        raise ParseError(f"message {m_i}: an input_image item names an uploaded file (file_id "
                         f"{item['file_id']!r:.40}) that mmpipe cannot read", where=where, column=column,
                         expected="the image itself: image_url as a data URL, a path or an http(s) URL",
                         found=f"{item!r:.80}", fix="download the file and give its bytes, path or data URL "
                                                    "as image_url, or put it in the images column")
    return inline


def parse_item(item, m_i: int, media, column: str, where: str) -> dict:
    """One content item -> its template item; an image / video / audio item appends its value to
    ``media.images`` / ``media.videos`` / ``media.audios`` (a bare placeholder takes the next value
    of the row's column from ``media.iq`` / ``vq`` / ``aq``: `mmpipe.encoding.media.MediaQueue`)."""
    if isinstance(item, str):
        return {"type": "text", "text": item}
    if not isinstance(item, dict):
        raise ParseError(f"message {m_i}: content item {item!r:.60} is not a dict", where=where, column=column,
                         expected="{'type': 'text', 'text': str} or {'type': 'image', ...}",
                         found=type(item).__name__, fix="wrap the item in a dict")
    if is_image_item(item):
        inline = _image_value(item, m_i, column, where)
        media.images.append(media.iq.take() if inline is None else inline)
        return {"type": "image"}
    if is_video_item(item):
        inline = inline_video(item)
        media.videos.append(media.vq.take() if inline is None else inline)
        return {"type": "video"}
    if is_audio_item(item):
        inline = inline_audio(item)
        media.audios.append(media.aq.take() if inline is None else inline)
        return {"type": "audio"}
    text = item.get("text")
    if text is None:
        raise ParseError(f"message {m_i}: content item {item!r:.80} has neither text nor an image, video or audio",
                         where=where, column=column, expected="a 'text' string, or an image, video or audio",
                         found=f"keys {sorted(map(str, item))}", fix="give text items a 'text' string")
    if not isinstance(text, str):
        raise ParseError(f"message {m_i}: text must be a string, found {type(text).__name__}",
                         where=where, column=column, expected="str", found=type(text).__name__,
                         fix="convert the value to a string (str(x)) when building the dataset")
    return {"type": "text", "text": check_text(text, where=where, column=column, what=f"message {m_i}")}
