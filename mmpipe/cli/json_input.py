"""Why a ``.jsonl`` / ``.json`` input of ``mmpipe encode`` is not rows, said before or after
``datasets.load_dataset("json")`` reads it (`json_problem`, `columnar_problem`).

Checked before the reader runs (``quick=True``), because pyarrow's JSON reader crashes the process
(a segmentation fault) on a JSON-lines file whose first line is ``null``, reads a later ``null``
line as a row of nulls without a word, and keeps non-UTF-8 bytes that fail only when a row is
decoded. A line that is not a JSON object (``null``, a number, an array, a string), a line that is
not UTF-8, an item of a JSON list that is not an object: each is named by its 1-based line (or
list index) with what was found and the fix. The quick check parses only suspicious lines (one
that does not start with ``{``, or is not UTF-8); the full check (``quick=False``, after the reader
failed) parses every line, to name the first one that is not valid JSON.

Also `json_object`: an option whose value is a JSON object (``--chat-template-kwargs``).
"""

from __future__ import annotations

import codecs
import json
import shlex
from pathlib import Path
from typing import Optional

__all__ = ["columnar_problem", "json_object", "json_problem", "wrapped_problem"]

_JSON_KIND = {"list": "array", "str": "string", "NoneType": "null", "bool": "boolean", "dict": "object"}
_UTF16_32 = (codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
_CHAT = ("messages", "conversations", "prompt")  # a raw row's chat column (`mmpipe.encode` parses them)
_ROW_COLUMNS = (*_CHAT, "instruction")  # any of them: the file holds rows (an alpaca row: instruction)


def _kind(value) -> str:
    return _JSON_KIND.get(type(value).__name__, "number")


def json_problem(path: Path, *, quick: bool = False) -> Optional[str]:
    """Why the .jsonl/.json file ``path`` is not rows: no rows, not UTF-8 (a UTF-16 file, a byte
    on a line), the first line (1-based) that is not JSON or not an object, the first item of a
    JSON list that is not an object; None: none found. ``quick``: parse only lines that do not
    start with ``{`` (before the reader); else every line (after it failed, to name the line)."""
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(_UTF16_32):
        return "it is UTF-16/UTF-32 text; save it as UTF-8 (one JSON object per line)"
    if head.lstrip(b"\xef\xbb\xbf").strip()[:1] == b"[":  # one JSON list of rows
        return _list_problem(path)
    return _lines_problem(path, quick)


def _list_problem(path: Path) -> Optional[str]:
    try:
        rows = json.loads(path.read_bytes().decode("utf-8-sig"))
    except ValueError as e:  # UnicodeDecodeError too
        return f"it is not valid UTF-8 JSON ({e}); write one JSON list of row objects, or one object per line"
    if not isinstance(rows, list):
        return None
    if not rows:
        return "it holds no rows (an empty JSON list)"
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is None:
        return None
    return (f"item {bad} of its JSON list is a {_kind(rows[bad])}, not a row object (found {json.dumps(rows[bad])[:80]}); "
            "each item must be one row object: remove it or write the row")


def _lines_problem(path: Path, quick: bool) -> Optional[str]:
    n_rows = 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.lstrip(b"\xef\xbb\xbf") if n == 1 else raw
            stripped = line.strip()
            if not stripped:
                continue
            try:
                text = line.decode("utf-8")
                if quick and stripped[:1] == b"{":
                    n_rows += 1
                    continue
                value = json.loads(text)
            except ValueError as e:  # UnicodeDecodeError too
                if _parses_whole(path):  # one pretty-printed object, not JSON lines
                    return None
                shown = repr(raw[:80].decode("utf-8", "replace").strip())
                if isinstance(e, UnicodeDecodeError):
                    return (f"line {n} is not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}): {shown}; "
                            "save the file as UTF-8")
                why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else str(e)
                return f"line {n} is not valid JSON ({why}): {shown}; each line must be one JSON object"
            if not isinstance(value, dict):
                if not n_rows and _parses_whole(path):
                    return None
                shown = repr(raw[:80].decode("utf-8", "replace").strip())
                return (f"line {n} holds a JSON {_kind(value)}, not an object: {shown}; each line must be one "
                        "row object: remove the line or write the row")
            n_rows += 1
    return None if n_rows else "it holds no rows (the file is empty or blank)"


def _parses_whole(path: Path) -> bool:
    try:
        return json.loads(path.read_bytes().decode("utf-8-sig")) is not None
    except ValueError:
        return False


def columnar_problem(ds) -> Optional[str]:
    """Why ``ds``, as ``datasets.load_dataset("json")`` read it, is ONE object of column lists
    rather than rows: ``{"messages": [m0, m1, ...], "images": [i0, i1, ...]}`` (a dict of lists, as
    ``json.dump(dataset.to_dict())`` writes) or pandas' ``to_json(orient="columns")``
    (``{"prompt": {"0": ..., "1": ...}}``). datasets reads either as one row (checked: datasets
    5.2), which no chat column parses as; said here with the fix instead of a row error.
    None: not that shape (a row whose chat column holds messages)."""
    if len(ds) != 1:
        return None
    row = ds[0]
    chat = next((c for c in _CHAT if row.get(c) is not None), None)
    if chat is None or not _is_column(row[chat], chat):
        return None
    given = {k: v for k, v in row.items() if v is not None}
    if not all(isinstance(v, (list, dict)) for v in given.values()):
        return None
    sizes = {k: len(v) for k, v in given.items()}
    pandas = isinstance(row[chat], dict)
    lengths = ", ".join(f"{k}: {n} values" for k, n in sizes.items())
    uneven = "" if len(set(sizes.values())) == 1 else (
        f"; its columns differ in length ({lengths}): the rows do not line up, fix the columns first")
    how = ("pandas.read_json(path).to_json('rows.jsonl', orient='records', lines=True)" if pandas else
           "datasets.Dataset.from_dict(json.load(open(path))).to_json('rows.jsonl')")
    layout = "pandas' to_json(orient='columns')" if pandas else "a dict of column lists"
    return (f"it holds one JSON object of columns ({lengths}), the columnar layout ({layout}), which "
            f"datasets.load_dataset('json') reads as ONE row whose {chat!r} is every row's{uneven}; "
            f"write one row object per line instead, e.g. {how}")


def wrapped_problem(ds, path: Path) -> Optional[str]:
    """Why ``ds``, as ``datasets.load_dataset("json")`` read ``path``, is ONE object whose field
    holds the rows: ``{"data": [row, row, ...]}`` (SQuAD style, often with ``"version"`` beside it)
    or ``{"train": [...], "test": [...]}``. datasets reads it as one row with a ``data`` column
    (checked: datasets 5.2), which fails later as a row without a chat column; said here with the
    field(s) and how to take the rows out. None: not that shape (no list of row objects in a field,
    or a chat column: a real row)."""
    if len(ds) != 1:
        return None
    row = ds[0]
    if any(row.get(c) is not None for c in _ROW_COLUMNS):
        return None
    fields = {k: len(v) for k, v in row.items() if isinstance(v, list) and v
              and all(isinstance(x, dict) and not set(x) <= {"bytes", "path"} for x in v)}  # not an image list
    if not fields:
        return None
    name = next(iter(fields))
    src, dst = shlex.quote(str(path)), shlex.quote(str(path.with_suffix(f".{name}.jsonl")))
    jq = shlex.quote(f".{name}[]" if name.isidentifier() else f".[{json.dumps(name)}][]")
    listed = ", ".join(f"{k!r} ({n} objects)" for k, n in fields.items())
    which = f"field {listed} holds" if len(fields) == 1 else f"fields {listed} hold"
    pick = "" if len(fields) == 1 else " (one field at a time)"
    return (f"it holds one JSON object whose {which} the rows ({{{name!r}: [row, row, ...]}}), which "
            f"datasets.load_dataset('json') reads as ONE row with a {name!r} column; name the field: "
            f"--field {shlex.quote(name)}{pick}, or write its rows one object per line next to it (relative "
            f"image paths) and encode that file: jq -c {jq} {src} > {dst}")


def _is_column(value, chat: str) -> bool:
    """``value`` is a whole column of chat values, not one row's: a list of message lists (a prompt
    column: of strings too), or a dict keyed by row numbers (pandas ``orient="columns"``)."""
    if isinstance(value, dict):
        return bool(value) and all(isinstance(k, str) and k.isdigit() for k in value)
    if not isinstance(value, list) or not value:
        return False
    kinds = (list, str) if chat == "prompt" else (list,)
    return all(isinstance(v, kinds) for v in value)


def json_object(flag: str):
    """An argparse ``type`` reading ``flag``'s value as a JSON object (a dict), else a usage error."""
    import argparse

    def parse(text: str) -> dict:
        try:
            value = json.loads(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object, e.g. '{{\"enable_thinking\": false}}' "
                                             f"({e})") from None
        if not isinstance(value, dict):
            raise argparse.ArgumentTypeError(f"{flag} must be a JSON object, got {text!r}")
        return value
    return parse
