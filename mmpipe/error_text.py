"""What a torch DataLoader worker's error text gives back: the worker hands the main process only
the error's type and its traceback's text, and the DataLoader re-raises ``type(e)(text)``
(`torch._utils.ExceptionWrapper`). mmpipe's errors take their fields back from that text in their
``__init__`` (`mmpipe.errors`): from the message (`fields_from_message`, an `InputError`'s) and from
a fields note under it (`note_fields`, the fields a message does not say)."""

from __future__ import annotations

import ast
import math
import re
from typing import Any, Optional


def worker_original(text: Any, cls: type) -> Optional[str]:
    """The original message of ``cls``'s error inside ``text`` when ``text`` is what a torch
    DataLoader re-raises a worker's error with (``type(e)(text)``, torch._utils.ExceptionWrapper:
    ``Caught X in DataLoader worker process N.``, ``Original Traceback ...``, then a line
    ``module.X: <message>``), else None. An error whose ``__init__`` takes fields takes them back
    from it (`InputError`, the shard errors of `mmpipe.data.object_store`)."""
    if not (isinstance(text, str) and text.startswith(f"Caught {cls.__name__} ") and "\nOriginal Traceback" in text):
        return None
    lines = list(re.finditer(rf"^(?:[\w.]+\.)?{re.escape(cls.__name__)}: ", text, re.M))
    return text[lines[-1].end():].strip() if lines else ""


_STR = r"(?:'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\")"  # a str's repr
_TAGS = re.compile(rf"\[stage: (\w+)(?:, column: ({_STR}))?\]$")  # what `InputError._compose` ends with
_LOCATION = re.compile(rf"row (\d+|\(index unknown: pass with_indices=True to map\))(?:, image (\d+))?: ")
_COLUMN_LOCATION = re.compile(rf"(?:row (\d+), )?column ({_STR}): ")  # `column_in_location`
FIELDS_NOTE = "mmpipe fields: "  # what a fields note (`note_fields`) starts with
MAX_TRIES = 256  # splits `fields_from_message` tries before it gives up
MESSAGE_FIELDS = ("detail", "expected", "found", "fix")  # what `InputError.message_body` and the fix say


def _literal(text: str) -> Any:
    """``ast.literal_eval(text)``, parsed again when CPython 3.11 raises its spurious "AST constructor
    recursion depth mismatch" (gh-106905: ``ast.parse`` on threads at once; an error is built on
    any thread); None if every try hits it (the fields then ride as unknown)."""
    for _ in range(8):
        try:
            return ast.literal_eval(text)
        except SystemError:
            continue
    return None


def _column(text: Optional[str]) -> Optional[str]:
    return None if text is None else _literal(text)


def _reads_back(v: Any, depth: int = 0) -> bool:
    """Whether ``repr(v)`` reads back to ``v`` by `ast.literal_eval`: None, bool, int, str, bytes, a
    finite float or complex, and tuples / lists / sets / dicts of them (exact types: an IntEnum's or a numpy scalar's repr
    does not). Decided without parsing: an error is built on hot paths and on many threads at once."""
    t = type(v)
    if v is None or t in (bool, int, str, bytes):
        return True
    if t is float:
        return math.isfinite(v)
    if depth > 16:
        return False
    if t is complex:
        return math.isfinite(v.real) and math.isfinite(v.imag)
    if t in (tuple, list, set):
        return all(_reads_back(x, depth + 1) for x in v)
    if t is dict:
        return all(_reads_back(k, depth + 1) and _reads_back(x, depth + 1) for k, x in v.items())
    return False


def note_fields(e: BaseException, **fields) -> None:
    """Add to ``e`` a note ``"mmpipe fields: {name: value, ...}"`` of the ``fields`` whose repr reads
    back (`_reads_back`; None included; nothing when all are None): a torch DataLoader re-raises a
    worker's error as ``type(e)(text)``, the text holding the traceback with its notes, and the error's
    ``__init__`` takes them back (`split_fields_note`) where its message does not say them
    (``class_name``, ``layer_type``, ``file``). Shown under the message in a traceback; ``str(e)`` is
    unchanged."""
    kept = {k: v for k, v in fields.items() if _reads_back(v)}
    if any(v not in (None, ()) for v in kept.values()):
        e.add_note(FIELDS_NOTE + repr(kept))


def keep_fields(e: BaseException, text: Any, **fields) -> None:
    """Set ``fields`` (an error's own, e.g. ``class_name``, ``reason``) on ``e`` so that they cross a
    torch DataLoader worker: raised with them, they are noted (`note_fields`); rebuilt by the
    DataLoader as ``type(e)(text)`` (all of them None or empty, ``text`` the worker's text), they are
    taken back from that note."""
    original = None if any(v not in (None, ()) for v in fields.values()) else worker_original(text, type(e))
    if original is None:
        note_fields(e, **fields)
    else:
        noted = split_fields_note(original)[1]
        fields.update((k, noted[k]) for k in fields if k in noted)
    for k, v in fields.items():
        setattr(e, k, v)


def split_fields_note(original: str) -> tuple[str, dict]:
    """(message, fields) of a worker error's ``original`` text (`worker_original`): the message
    without the notes under it, and the fields its fields notes (`note_fields`) hold ({} if none)."""
    fields, message = {}, original
    notes = list(re.finditer(rf"^{re.escape(FIELDS_NOTE)}(\{{.*\}})$", original, re.M))
    for note in notes:
        try:
            said = _literal(note.group(1))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            continue
        fields.update(said if isinstance(said, dict) else {})
    if notes:
        message = original[:notes[0].start()].rstrip("\n")
    return message, fields


def fields_from_message(cls: type, message: str) -> Optional[dict]:
    """The fields of an ``cls`` (an `InputError`) whose composed message is ``message``: tags, then the
    location, the fix after a `` - ``, ``expected`` / ``found`` after their ``; `` (each split tried,
    the first that composes back to ``message`` kept; the fix after the last ``found`` / ``expected``
    first); None when none composes to it. ``expected`` / ``found`` come back as their text; a
    ``where`` text other than the standard location comes back inside ``detail``."""
    tag = _TAGS.search(message)
    if tag is None:
        return None
    rest, tags = message[:tag.start()].rstrip(" "), {"stage": tag.group(1), "column": _column(tag.group(2))}
    tries = 0
    for place, body in _places(rest, tags["column"]):
        for head, fix in _fixes(body):
            for said in _bodies(head):
                fields = {**tags, "where": None, "column_in_location": False, "row": None, "image": None,
                          **place, **said, "fix": fix}
                probe = cls.__new__(cls)
                vars(probe).update(fields)
                if probe._compose() == message:
                    return fields
                tries += 1
                if tries >= MAX_TRIES:  # a text of many splits: its fields ride in a note (InputError)
                    return None
    return None


def message_fields(cls: type, message: str) -> dict:
    """`fields_from_message`, or for a message no fields compose to (edited text) the ``stage`` and
    ``column`` of its closing tags alone ({} without them)."""
    fields = fields_from_message(cls, message)
    if fields is None:
        tag = _TAGS.search(message)
        fields = {} if tag is None else {"stage": tag.group(1), "column": _column(tag.group(2))}
    return fields


def _places(rest: str, column: Optional[str]):
    """(location fields, the text after the location) candidates of a composed message's start."""
    loc = _COLUMN_LOCATION.match(rest)
    if loc:
        yield ({"column_in_location": True, "column": _column(loc.group(2)),
                "row": None if loc.group(1) is None else int(loc.group(1))}, rest[loc.end():])
    loc = _LOCATION.match(rest)
    if loc:
        row = int(loc.group(1)) if loc.group(1).isdigit() else None
        yield {"row": row, "image": None if loc.group(2) is None else int(loc.group(2))}, rest[loc.end():]
    yield {}, rest


def _fixes(body: str):
    """(text before the fix, fix) candidates: each `` - `` split (those after the last ``found`` /
    ``expected`` first, earliest first), then no fix."""
    cuts = [m.start() for m in re.finditer(" - ", body)]
    last = max(body.rfind("found "), body.rfind("expected "), 0)
    for i in sorted(cuts, key=lambda i: (i < last, i)):
        yield body[:i], body[i + 3:]
    yield body, None


def _bodies(head: str):
    """{detail, expected, found} candidates of `InputError.message_body`'s text."""
    if head == "invalid input":
        yield {"detail": "", "expected": None, "found": None}
    parts = head.split("; ")
    ends = [k for k, p in enumerate(parts) if p.startswith("found ")] + [len(parts)]
    for j in ends:  # parts[:i] the detail, parts[i:j] an "expected" part, parts[j:] a "found" part
        starts = [k for k in range(j) if parts[k].startswith("expected ")] + [j]
        for i in starts:
            detail, exp, fnd = "; ".join(parts[:i]), "; ".join(parts[i:j]), "; ".join(parts[j:])
            yield {"detail": detail, "expected": exp[len("expected "):] if exp else None,
                   "found": fnd[len("found "):] if fnd else None}
