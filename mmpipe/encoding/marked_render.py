"""One render for a conversation's text and its replies (labels), where that is provably exact.

Finding the replies by markers (`mmpipe.encoding.spans`, way 2) renders the conversation twice:
as it is, and with each reply's content between two marker strings. This module renders only
the marked conversation and reads the plain text off it (the markers removed), when the
template provably treated every marked content as data it only wrote out:

- each marked content is a `TrackedText`: a ``str`` whose every read - a method, ``in``,
  ``==``, ``len``, indexing, iteration, ``+``, ``%``, ``str()``, ``repr()``, hashing, copying,
  formatting - marks its conversation's `Probe` as touched. Only its truth value is answered
  without a mark, and as the content before marking would answer it;
- the template is compiled in an overlay of the processor's own sandboxed environment whose
  ``finalize`` writes a `TrackedText` out as the plain string (so writing it out is the one
  untouched use), and whose ``str.format`` wrapper and ``tojson`` filter mark the probe too
  (`overlay`); a template that captures output into a value (macros, set / filter / call
  blocks: the value can be changed after the reply was written into it) gets no such
  ``finalize``, so it never takes the one-render way;
- the result is used only when the probe is untouched, the overlay wrote each marked content
  out exactly once (so a render by any other path - transformers' own call turns every str
  subclass into a plain str - is never read this way), and each marker string (and its body,
  so a JSON-escaped copy counts) occurs exactly once, in order (`plain_text`).

Under those conditions the template's output outside the replies cannot depend on their
content: removing the markers gives, character for character, the conversation's own render.
Otherwise the caller renders the conversation as it is (the two-render way), so a template that
trims, splits, measures or escapes a reply costs the second render, never a wrong text.

The overlay also memoises the sandbox's attribute check by (type, name), which depends on
nothing else (jinja2's ``is_safe_attribute`` / ``is_internal_attribute`` /
``modifies_known_mutable`` test the object's type and the name only).
"""

from __future__ import annotations

import re
from typing import Any, Optional

__all__ = ["Probe", "TrackedText", "overlay", "plain_text", "untracked"]


class Probe:
    """Whether a conversation's marked contents were read other than written out (``touched``),
    how many there are (``made``) and how many times the overlay wrote one out (``written``)."""

    __slots__ = ("touched", "made", "written")

    def __init__(self) -> None:
        self.touched, self.made, self.written = False, 0, 0


class TrackedText(str):
    """A marked reply content (see the module doc): a str that tells its `Probe` it was read.
    ``nonempty``: the truth value of the content before marking."""

    def __new__(cls, text: str, probe: Probe, nonempty: bool):
        self = super().__new__(cls, text)
        self._probe, self._nonempty = probe, nonempty
        probe.made += 1
        return self

    def __bool__(self) -> bool:
        return self._nonempty

    def __int__(self) -> int:  # int() / float() of a str read its buffer without a call we see
        self._probe.touched = True
        return int(str.__str__(self))

    def __float__(self) -> float:
        self._probe.touched = True
        return float(str.__str__(self))

    def __radd__(self, other):  # str has no __radd__: ``x + content`` reaches it first
        self._probe.touched = True
        return str.__add__(other, str.__str__(self)) if isinstance(other, str) else NotImplemented


def _reader(name: str):
    method = getattr(str, name)

    def read(self, *args, **kwargs):
        self._probe.touched = True
        return method(self, *args, **kwargs)

    read.__name__ = read.__qualname__ = name
    return read


# every str attribute that reads the text (object's plumbing and the constructor left out)
_PLUMBING = {"__new__", "__init__", "__getattribute__", "__setattr__", "__delattr__", "__class__",
             "__init_subclass__", "__subclasshook__", "__dir__", "__sizeof__", "__doc__", "__bool__",
             "__class_getitem__"}
for _name in dir(str):
    if _name not in _PLUMBING and callable(getattr(str, _name)):
        setattr(TrackedText, _name, _reader(_name))
TrackedText.__hash__ = _reader("__hash__")


def untracked(value: Any) -> Any:
    """The overlay's ``finalize``: a `TrackedText` written out as its plain string (its one
    untracked use, counted), anything else as it is."""
    if type(value) is not TrackedText:
        return value
    value._probe.written += 1
    return str.__str__(value)


def overlay(template: Any, text: str) -> Any:
    """``text`` compiled in an overlay of ``template``'s environment (the processor's compiled
    chat template: same sandbox, filters, globals and extensions) that writes `TrackedText`
    out untracked, marks a probe on ``str.format`` of one, and memoises the attribute check."""
    from jinja2 import nodes

    base = template.environment
    # output captured into a value (a macro's, a set block's, a filter or call block's) can be
    # changed after it was written (Qwen3-VL lstrips its macro's output): no one-render way there
    captures = (nodes.Macro, nodes.CallBlock, nodes.FilterBlock, nodes.AssignBlock, nodes.Block, nodes.Include,
                nodes.Import, nodes.FromImport)
    one_render = next(base.parse(text).find_all(captures), None) is None
    env = base.overlay(finalize=untracked if one_render else None)
    safe, seen = base.is_safe_attribute, {}

    def is_safe_attribute(obj, attr, value):
        key = (type(obj), attr)
        if key not in seen:
            seen[key] = safe(obj, attr, value)
        return seen[key]

    wrap = base.wrap_str_format

    def wrap_str_format(value):
        owner = getattr(value, "__self__", None)
        if type(owner) is TrackedText:
            owner._probe.touched = True
        return wrap(value)

    env.is_safe_attribute, env.wrap_str_format = is_safe_attribute, wrap_str_format
    if "tojson" in base.filters:  # JSON encodes a str subclass without a call we see
        env.filters = dict(base.filters)
        env.filters["tojson"] = _seen_by(base.filters["tojson"])
    return env.from_string(text)


def _seen_by(filter_):
    """``filter_`` marking the probe of every `TrackedText` in its value (dicts, lists, tuples)."""
    import functools

    def mark(value) -> None:
        if type(value) is TrackedText:
            value._probe.touched = True
        elif isinstance(value, dict):
            for item in value.values():
                mark(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                mark(item)

    @functools.wraps(filter_)
    def seen(value, *args, **kwargs):
        mark(value)
        return filter_(value, *args, **kwargs)
    return seen


_MARKS = re.compile("\x02mmpipe[SE][0-9]+\x03")
_BODIES = re.compile("mmpipe([SE][0-9]+)")


def plain_text(marked: str, probe: Probe, replies: list) -> Optional[str]:
    """The conversation's own render read off ``marked`` (the render of its marked messages,
    replies ``replies`` marked: their message indices), or None when that is not provably it
    (module doc)."""
    if probe.touched or probe.written != probe.made:
        return None  # read, or not written out once each by the overlay (another renderer: plain copies)
    if _BODIES.findall(marked) != [f"{side}{k}" for k in replies for side in "SE"]:
        return None  # a marker dropped, repeated, moved or written escaped
    plain, n = _MARKS.subn("", marked)
    return plain if n == 2 * len(replies) and "\x02" not in plain else None
