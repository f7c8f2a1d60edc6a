"""Encode, step 1: raw row -> (chat messages, images in order of appearance).

Accepted raw rows (the format is found by looking at the row):

(a) Hub convention: ``messages`` whose content lists hold ``{"type": "image"}`` placeholders,
    plus an ``images`` column (``Sequence(Image())``), consumed in order;
(b) inline images: content items ``{"type": "image", "image": <image>}``;
(c) verl style: ``prompt`` text (or a message list with string contents) containing
    ``<image>`` placeholders, plus an ``images`` column.

Content items are read by `mmpipe.encoding.parse_items` (OpenAI chat ``image_url`` and Responses
``input_image`` / ``input_text`` parts too); lists that pandas or ``datasets``' numpy format hand
over as object arrays are read as lists. An assistant turn whose role is spelled otherwise (the
ShareGPT / Gemma speakers ``gpt`` / ``model``, ``Assistant``) is a `ParseError`
(`mmpipe.encoding.sharegpt.check_chat_role`); other roles render as given.

An image may be a ``datasets.Image()`` value (dict with bytes/path, or PIL), a path, raw
bytes, a PIL image or a uint8 array. Videos follow the same three conventions (``{"type": "video"}`` + a
``videos`` column, inline ``{"type": "video", "video": ...}``, ``<video>`` in prompt text;
`mmpipe.encoding.media`); a video is a path, bytes, a ``datasets.Video(decode=False)`` dict,
a list of frames, or ``{"frames": [...], "fps": float}`` (`mmpipe.encoding.videos`). Rows may also carry a ``completion`` (TRL
prompt-completion style) appended as the assistant turn.

Tool use (OpenAI format, what transformers' ``apply_chat_template`` takes): an assistant
message may carry ``tool_calls`` (``[{"type": "function", "function": {"name": str,
"arguments": dict | JSON object str}}]``); ``role: "tool"`` messages carry the tool's text
and images (their ``{"type": "image"}`` items take images from the ``images`` column in
order, like user turns) and may carry ``tool_call_id`` / ``name``; `parse_tools` reads a
row's ``tools`` column (a list of JSON-schema function specs, or that list as a JSON string).

The parsed messages carry only ``{"type": "image"}`` / ``{"type": "text", "text": str}``
items (or plain string contents), the tool fields above and every other key of the raw message
(``reasoning_content``, GLM-4.1V's ``metadata``, ...) as the processor's own chat path hands it to
the template (a None value left out: Arrow gives every message every key of the column's struct):
what the chat template renders, one image placeholder per image. Nothing here tokenizes or
decodes (but to name the bad image of a column ``datasets`` failed to decode:
`UnreadableImages`); a malformed row raises `mmpipe.errors.ParseError` or
`mmpipe.errors.PlaceholderError` naming the row and column.
"""

from __future__ import annotations

from typing import Any, Optional

import json
import re

import numpy as np

from mmpipe.encoding.media import MediaQueue, UnreadableImages, column_values, media_column
from mmpipe.encoding.parse_items import as_list, check_text, inline_image, is_image_item, parse_item
from mmpipe.encoding.row_checks import check_completion, check_one_source, check_row
from mmpipe.encoding.sharegpt import check_chat_role
from mmpipe.encoding.sft_formats import alpaca_messages, is_alpaca_row, with_system
from mmpipe.errors import ParseError
from mmpipe.records.columns import AUDIO_PLACEHOLDER, IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER

# The roles the Qwen-VL chat templates render as turns. Another string is rendered as given
# (a documented corpus case); a non-string or empty role is refused.
KNOWN_ROLES = ("system", "user", "assistant", "tool")
# the message keys parse reads itself; every other key reaches the template as it is (`_extra_fields`)
_OWN_KEYS = frozenset(("role", "content", "tool_calls", "tool_call_id", "name"))
_TEXT_KEYS = frozenset(("reasoning_content",))  # keys templates concatenate as text: a string or nothing

__all__ = ["KNOWN_ROLES", "UnreadableImages", "row_where", "check_text", "is_image_item", "inline_image",
           "split_placeholders", "parse_tool_calls", "parse_tools", "parse_row", "parse_media"]


def row_where(idx: Optional[int]) -> str:
    """The location prefix of a raw row's errors: ``"row 7"``, or a hint to pass indices."""
    return f"row {idx}" if idx is not None else "row (index unknown: pass with_indices=True to map)"


def split_placeholders(text: str, markers=(IMAGE_PLACEHOLDER,)) -> list[dict]:
    """Prompt text with ``<image>`` (and, when ``markers`` name it, ``<video>``) markers ->
    content items, one ``{"type": "image"}`` / ``{"type": "video"}`` per marker and
    ``{"type": "text", "text": ...}`` for the (non-empty) text between them."""
    kinds = {IMAGE_PLACEHOLDER: "image", VIDEO_PLACEHOLDER: "video", AUDIO_PLACEHOLDER: "audio"}
    parts = re.split("(" + "|".join(re.escape(m) for m in markers) + ")", text)
    items: list[dict] = []
    for i, part in enumerate(parts):
        if i % 2:
            items.append({"type": kinds[part]})
        elif part:
            items.append({"type": "text", "text": part})
    return items


def _raw_messages(example: dict, where: str) -> tuple[list, str, int]:
    """(the row's message list with its completion appended, the column it came from, the
    number of messages from that column)."""
    check_row(example, where)
    check_one_source(example, where)
    if example.get("messages") is not None:  # as_list: pandas / numpy-format rows hold object arrays
        raw = as_list(example["messages"])
        column = "messages"
    elif example.get("prompt") is not None:
        raw = as_list(example["prompt"])
        column = "prompt"
        if isinstance(raw, str):
            raw = [{"role": "user", "content": raw}]
    elif example.get("conversations") is not None:  # ShareGPT / LLaVA: [{"from": "human", "value": "<image>\n..."}]
        from mmpipe.encoding.sharegpt import sharegpt_messages

        raw, column = sharegpt_messages(as_list(example["conversations"]), where), "conversations"
    elif is_alpaca_row(example):  # LLaMA-Factory / ms-swift: instruction, input, output, history
        raw, column = alpaca_messages(example, where), "instruction"
    else:
        raise ParseError(
            f"found columns {sorted(example)}", where=where,
            expected="a 'messages' column (chat messages), a 'prompt' column (text or chat messages), a "
                     "'conversations' column (ShareGPT / LLaVA turns) or an alpaca 'instruction' column",
            fix="rename your column",
        )
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ParseError(f"column {column!r}", where=where, column=column,
                         expected="a non-empty list of chat messages", found=f"{raw!r:.80}",
                         fix="parse JSON-encoded messages first (json.loads)" if isinstance(raw, str) else
                             "drop rows without messages, or give at least one {'role', 'content'} message")
    raw = with_system(raw, example, where)  # a 'system' column (LLaMA-Factory, ms-swift): the first turn
    n_main = len(raw)
    completion = as_list(example.get("completion"))
    check_completion(completion, where)
    if completion is not None:
        raw = list(raw) + ([{"role": "assistant", "content": completion}] if isinstance(completion, str) else list(completion))
    return raw, column, n_main


class _Media:
    """A row's image, video and audio queues and the values taken so far, in order of appearance."""

    def __init__(self, example: dict, images_column: str, videos_column: str, where: str,
                 audios_column: str = "audios"):
        images_column, videos_column = media_column(example, images_column), media_column(example, videos_column)
        self.iq = MediaQueue(column_values(example, images_column, where), images_column, where)
        self.vq = MediaQueue(column_values(example, videos_column, where, "video"), videos_column, where, "video")
        self.aq = MediaQueue(column_values(example, audios_column, where, "audio"), audios_column, where, "audio")
        self.images: list = []
        self.videos: list = []
        self.audios: list = []

    def markers(self, text: str) -> list[str]:
        """The placeholder markers in ``text`` that have a non-empty column to take from."""
        return [m for m, q in ((IMAGE_PLACEHOLDER, self.iq), (VIDEO_PLACEHOLDER, self.vq), (AUDIO_PLACEHOLDER, self.aq))
                if q.images and m in text]


def _parse_message(msg, m_i: int, media: _Media, column: str, where: str) -> dict:
    """One raw message -> ``{"role", "content"}`` for the chat template."""
    if isinstance(msg, str) and column == "prompt":
        raise ParseError(f"column 'prompt', message {m_i}: a prompt must be a string or a list of chat messages, "
                         f"found a list of strings", where=where, column=column,
                         expected="str, or [{'role', 'content'}, ...]", found=f"{msg!r:.60}",
                         fix="join the strings into one prompt string, or pass batched=True to map if this is a batch")
    if not isinstance(msg, dict) or "role" not in msg:
        raise ParseError(f"column {column!r}, message {m_i}: expected {{'role', 'content'}}", found=f"{msg!r:.80}",
                         where=where, column=column, fix="give each message a 'role' and a 'content'")
    role = msg["role"]
    if not isinstance(role, str) or not role.strip():
        raise ParseError(f"message {m_i}: role must be a non-empty string (the template would render it as "
                         f"{str(role)!r})", where=where, column=column, expected=f"one of {KNOWN_ROLES}",
                         found=f"{role!r:.40} ({type(role).__name__})",
                         fix="set every message's role (e.g. 'user'); drop rows without roles")
    check_chat_role(role, m_i, column, where)
    content = as_list(msg.get("content"))
    if content is None:
        content = ""
    if isinstance(content, str):
        check_text(content, where=where, column=column, what=f"message {m_i}")
        markers = media.markers(content)
        if not markers:
            return {"role": msg["role"], "content": content}
        content = split_placeholders(content, markers)
    if not isinstance(content, (list, tuple)):
        raise ParseError(
            f"column {column!r}, message {m_i}: content must be a string or a list of items, "
            f"found {type(content).__name__}", where=where, column=column, expected="str or a list of content items",
            fix="store text as a string, or as [{'type': 'text', 'text': ...}] items",
        )
    items = [parse_item(item, m_i, media, column, where) for item in content]
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


def _extra_fields(msg: dict, m_i: int, column: str, where: str) -> dict:
    """The keys of one raw message that parse does not read itself (`_OWN_KEYS`), for the chat
    template as the processor's chat path gets them (templates read ``reasoning_content``,
    ``metadata``, ...). None values are left out (Arrow's filler); text is checked (`check_text`);
    ``reasoning_content`` must be a string (templates concatenate it into the reply)."""
    out = {}
    for key, value in msg.items():
        if key in _OWN_KEYS or value is None:
            continue
        if isinstance(value, np.ndarray):  # an Arrow list in numpy format: the list it stores
            value = value.tolist()
        if isinstance(value, str):
            check_text(value, where=where, column=column, what=f"message {m_i}, {key}")
        elif key in _TEXT_KEYS:
            raise ParseError(f"message {m_i}: {key} must be a string (the chat template writes it into the reply)",
                             where=where, column=column, expected="str or None", found=type(value).__name__,
                             fix=f"store {key} as a string (join a list of reasoning parts), or None")
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


def parse_media(example: dict, *, idx=None, images_column: str = "images", videos_column: str = "videos",
                audios_column: str = "audios") -> tuple[list[dict], list[Any], list[Any], list[Any]]:
    """Raw row -> (messages for the chat template, images, videos, audio clips), each in order of
    appearance.

    Returned messages carry only ``{"type": "image"}`` / ``{"type": "video"}`` / ``{"type": "audio"}`` /
    ``{"type": "text", "text": ...}`` items (or plain string contents), the tool fields
    (``tool_calls`` on assistant messages, ``tool_call_id`` / ``name``) and the message's other
    keys (``reasoning_content``, ...: `_extra_fields`); image and video values
    are returned separately (a video item's per-video options ride with its value, see
    `mmpipe.encoding.media`). The row's ``tools`` are read by `parse_tools`.
    """
    where = row_where(idx)
    raw, column, n_main = _raw_messages(example, where)
    media = _Media(example, images_column, videos_column, where, audios_column)
    columns = [column if m_i < n_main else "completion" for m_i in range(len(raw))]
    messages = [_parse_message(msg, m_i, media, columns[m_i], where) for m_i, msg in enumerate(raw)]
    for m_i, (msg, raw_msg) in enumerate(zip(messages, raw)):
        msg.update(_tool_fields(raw_msg, m_i, columns[m_i], where))
        msg.update(_extra_fields(raw_msg, m_i, columns[m_i], where))
    media.iq.check_all_used()
    media.vq.check_all_used()
    media.aq.check_all_used()
    return messages, media.images, media.videos, media.audios


def parse_row(example: dict, *, idx=None, images_column: str = "images") -> tuple[list[dict], list[Any]]:
    """Raw row -> (messages for the chat template, images in order of appearance): `parse_media`
    for the stages that take images only (a row with videos raises `ParseError`)."""
    messages, images, videos, audios = parse_media(example, idx=idx, images_column=images_column)
    images_only(videos, row_where(idx))
    no_audio(audios, row_where(idx))
    return messages, images


def video_families() -> list[str]:
    """The model families whose encoder takes videos (`mmpipe.families.FAMILIES`)."""
    from mmpipe.families import FAMILIES

    return [n for n, f in FAMILIES.items() if f.encodes_videos and f.video_token]


def images_only(videos: list, where: str, fix: Optional[str] = None, what: str = "this stage") -> None:
    """Refuse a row's videos (`ParseError`) where a stage or family takes images only; the fix says
    what takes them: ``what`` names the stage or processor."""
    if videos:
        fix = fix or (f"drop the row's videos (its video items and the videos column) to encode it here, or "
                      f"encode it with a processor of a family that takes videos ({', '.join(video_families())})")
        raise ParseError(f"the row holds {len(videos)} video(s) but {what} takes images only", where=where,
                         column="videos", expected="no video items", found=f"{len(videos)} video(s)", fix=fix)


def no_audio(audios: list, where: str, what: str = "this stage") -> None:
    """Refuse a row's audio clips (`ParseError`) where a stage or family takes none."""
    if audios:
        raise ParseError(f"the row holds {len(audios)} audio clip(s) but {what} takes no audio", where=where,
                         column="audios", expected="no audio items", found=f"{len(audios)} clip(s)",
                         fix="encode audio rows with an audio model's processor (Qwen2.5-Omni, Qwen3-Omni, Gemma 3n, "
                             "Phi-4-multimodal: the generic path), or drop the row's audio items and audios column")
