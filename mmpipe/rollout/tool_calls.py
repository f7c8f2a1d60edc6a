"""Tool calls for the agent loop (`mmpipe.rollout.agent`): parse them from a reply, run them,
and turn their results into a tool turn (text and images).

Parsing is pluggable: a parser is any callable ``text -> list[ToolCall]``; an empty list
means the reply is a final answer. `parse_qwen_tool_calls` reads Qwen's format::

    <tool_call>
    {"name": "search", "arguments": {"q": "cat"}}
    </tool_call>

A tool is any callable ``tool(**arguments)`` returning text, an image, a list of texts and
images, or a ``(text, images)`` pair. Nothing a model or a tool does raises here: a
malformed call, an unknown tool or a tool that raises gives an error text for the model.
"""

from __future__ import annotations

import json
import re
import weakref
from typing import Any, Callable, Mapping, Sequence

from mmpipe.errors import ArgumentError
from mmpipe.records.trajectory import ToolCall

__all__ = ["parse_qwen_tool_calls", "tool_table", "run_tool_call", "tool_result_content", "tool_role_of",
           "ToolParser"]

ToolParser = Callable[[str], Sequence[ToolCall]]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_qwen_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>`` in ``text`` (Qwen2.5/Qwen3 format), in order.

    The JSON must be an object with a string ``"name"`` and an object ``"arguments"`` (a
    JSON-encoded object string is accepted too). A malformed call is returned with its
    ``error`` set; a ``<tool_call>`` left open at the end (the reply was cut) is one too.
    No call at all: ``[]`` (a final answer).
    """
    calls = [_parse_one(m.group(1)) for m in _CALL.finditer(text)]
    tail = text[text.rfind("</tool_call>") + len("</tool_call>"):] if calls else text
    if "<tool_call>" in tail:
        body = tail[tail.find("<tool_call>") + len("<tool_call>"):]
        calls.append(ToolCall(None, {}, body, error="the <tool_call> block is not closed with </tool_call>"))
    return calls


def _loads(text: str):
    """``json.loads``, with what it raises beyond `json.JSONDecodeError` on a sampled text (a
    number past Python's int digit limit: ValueError; nesting past the recursion limit:
    RecursionError) raised as a `json.JSONDecodeError` too."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except ValueError as e:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise json.JSONDecodeError(f"a number too long to read ({str(e).split(':')[0]})", text, 0) from None
    except RecursionError:
        raise json.JSONDecodeError("nested too deeply to read", text, 0) from None


def _parse_one(body: str) -> ToolCall:
    try:
        obj = _loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, {}, body, error=f"the tool call is not valid JSON ({e.msg} at character {e.pos})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(None, {}, body, error='the tool call must be a JSON object with a string "name"')
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = _loads(args)
        except json.JSONDecodeError:
            pass
    if not isinstance(args, dict):
        return ToolCall(obj["name"], {}, body, error='the tool call\'s "arguments" must be a JSON object')
    return ToolCall(obj["name"], args, body)


def tool_table(tools: Any) -> dict[str, Callable]:
    """``tools`` (a mapping name -> callable, or a sequence of callables named by
    ``__name__``) -> a dict. Raises `ArgumentError` for a non-callable or an unnamed tool."""
    if isinstance(tools, Mapping):
        table = dict(tools)
    else:
        table = {}
        for t in tools or ():
            name = getattr(t, "__name__", None)
            if not name or name == "<lambda>":
                raise ArgumentError(f"tools: {t!r} has no name; pass tools as a dict {{name: function}}")
            table[name] = t
    bad = [k for k, v in table.items() if not callable(v)]
    if bad:
        raise ArgumentError(f"tools: {bad} are not callable; tools are functions tool(**arguments)")
    return table


def run_tool_call(call: ToolCall, tools: Mapping[str, Callable]) -> tuple[list, bool]:
    """Run one call -> (result items: texts and images in order, is_error). Never raises on
    the model's or the tool's account: the error becomes the one text item."""
    if not call.ok:
        return [f"Error: {call.error}. Call a tool as <tool_call>{{\"name\": ..., \"arguments\": {{...}}}}</tool_call>."], True
    fn = tools.get(call.name)
    if fn is None:
        return [f"Error: unknown tool {call.name!r}; the tools are: {', '.join(sorted(tools)) or 'none'}."], True
    try:
        out = fn(**call.arguments)
    except Exception as e:  # the tool's failure is the model's observation, not the loop's crash
        return [f"Error: tool {call.name!r} raised {_describe(e)}"], True
    try:  # a return value that cannot become text (a str() that raises, an int past Python's digit limit)
        return _result_items(out), False
    except Exception as e:
        return [f"Error: tool {call.name!r} returned a value of type {_type_name(out)} that cannot be turned "
                f"into text ({_describe(e)}); return text, images, a list of them or a (text, images) pair"], True


def _type_name(x: Any) -> str:
    try:
        return str(type(x).__name__)
    except Exception:
        return "value"


def _describe(e: BaseException) -> str:
    """``"Type: message"`` for an exception, even when its ``str()`` raises or is not text
    (then ``"Type (its message could not be read: Type2)"``)."""
    name = _type_name(e)
    try:
        msg = str(e)
        if not isinstance(msg, str):
            raise TypeError(f"__str__ returned {_type_name(msg)}")
    except Exception as inner:
        return f"{name} (its message could not be read: {_type_name(inner)})"
    return f"{name}: {msg}"


def _result_items(out: Any) -> list:
    """A tool's return value -> [text | image, ...]: str is text, ``(text, images)`` a pair,
    a list its items; None, numbers, bools and plain dicts become JSON text; anything else
    (PIL image, array, bytes, path object, ``{"bytes"/"path"}`` dict) is an image."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str):
        text, images = out
        images = list(images) if isinstance(images, (list, tuple)) else [images]
        return ([text] if text else []) + images
    items = list(out) if isinstance(out, list) else [out]
    return [_as_item(x) for x in items]


def _as_item(x: Any) -> Any:
    if isinstance(x, str):
        return x
    if x is None or isinstance(x, (bool, int, float)) or (isinstance(x, dict) and not {"bytes", "path"} & set(x)):
        return json.dumps(x, default=str)
    return x


def tool_result_content(items: Sequence) -> tuple[Any, list]:
    """Result items -> (message content, images): a plain string when there is no image,
    else a content list of ``{"type": "text"}`` / ``{"type": "image"}`` items in order."""
    texts: list = []
    for x in items:  # adjacent texts merged: one text item between images
        if isinstance(x, str) and texts and texts[-1] is not None:
            texts[-1] += x
        else:
            texts.append(x if isinstance(x, str) else None)
    images = [x for x in items if not isinstance(x, str)]
    if not images:
        return "".join(t for t in texts if t is not None), []
    content = [{"type": "text", "text": t} if t is not None else {"type": "image"} for t in texts]
    return content, images


_PROBE = "\x00mmpipe-tool-probe\x00"
# encoder -> its tool role. Weak keys: every `AgentLoop.run` builds its own Encoder, and a
# dict holding them kept each one (and what it caches) alive for the whole run of the process.
_ROLES: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def tool_role_of(encoder) -> str:
    """``"tool"`` when the encoder's chat template renders a ``tool`` message (Qwen2-VL as
    ``<|im_start|>tool``, Qwen3-VL as ``<tool_response>`` inside a user turn), else ``"user"``
    (then results are wrapped in ``<tool_response>`` tags by the loop). Cached per encoder
    while the encoder lives."""
    hit = _ROLES.get(encoder)
    if hit is not None:
        return hit
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
            {"role": "tool", "content": _PROBE}]
    try:
        role = "tool" if _PROBE in encoder.render(msgs, True) else "user"
    except ValueError:  # the template refuses the role (raise_exception in jinja -> InputError)
        role = "user"
    _ROLES[encoder] = role
    return role
