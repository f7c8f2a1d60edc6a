"""SFT dataset layouts beside chat messages, as LLaMA-Factory and ms-swift define them, read as chat
messages by `mmpipe.encoding.parse` (their errors name the column):

- a ``system`` column (LLaMA-Factory's sharegpt and openai layouts, ms-swift): the row's system
  prompt, the conversation's first turn (`with_system`);
- alpaca rows (`alpaca_messages`): ``instruction`` (+ ``input``, joined by a newline), ``output``
  (a string; LLaMA-Factory's ranking lists are refused), ``history`` (``[[query, response], ...]``
  before it) and ``system``; ``<image>`` / ``<video>`` / ``<audio>`` markers in the text, media in
  the ``images`` / ``videos`` / ``audios`` columns, as in the other layouts.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from mmpipe.errors import ParseError

__all__ = ["ALPACA_COLUMNS", "alpaca_messages", "is_alpaca_row", "with_system"]

ALPACA_COLUMNS = ("instruction", "input", "output", "history")
SYSTEM_COLUMN = "system"


def _text(example: dict, column: str, where: str, required: bool = False) -> Optional[str]:
    """Column ``column`` of a row as text: None (or empty, when not ``required``) where the row
    has none; anything but a string is a `ParseError` naming the column."""
    value = example.get(column)
    if value is None or (not required and isinstance(value, str) and not value):
        if required:
            raise ParseError(f"column {column!r} is empty", where=where, column=column, expected="a string",
                             found="None", fix=f"drop the row or give its {column}")
        return None
    if not isinstance(value, str):
        raise ParseError(f"column {column!r} holds {type(value).__name__}", where=where, column=column,
                         expected="a string", found=type(value).__name__,
                         fix=f"store {column!r} as text (json.dumps a structured value, or drop the column)")
    return value


def with_system(raw: list, example: dict, where: str) -> list:
    """The conversation ``raw`` with the row's ``system`` column (a string) as its first turn. A
    first system turn holding the same text stays as it is; one holding another text is a
    `ParseError` (one of them would be lost). No column, None or "": ``raw`` unchanged."""
    system = _text(example, SYSTEM_COLUMN, where)
    if system is None:
        return raw
    first = raw[0] if len(raw) else None
    if isinstance(first, dict) and first.get("role") == "system":
        if first.get("content") == system:
            return raw
        raise ParseError("the row holds a 'system' column and a first system turn with another text; one of "
                         "the two system prompts would be lost", where=where, column=SYSTEM_COLUMN,
                         expected="the system prompt in one place", found=f"{system[:60]!r} and a system turn",
                         fix="drop the 'system' column or the system turn")
    return [{"role": "system", "content": system}] + list(raw)


def is_alpaca_row(example: dict) -> bool:
    """Whether a row is in the alpaca layout: an ``instruction`` column, filled."""
    return example.get("instruction") is not None


def alpaca_messages(example: dict, where: str) -> list:
    """An alpaca row -> chat messages: each ``history`` pair as a user and an assistant turn,
    then ``instruction`` (and ``input`` after a newline, as LLaMA-Factory joins them) as the user
    turn and ``output`` as the reply (no output: a prompt, the row ends with the user turn).
    `ParseError` naming the column for a value of another type or a malformed history."""
    query = _text(example, "instruction", where, required=True)
    extra = _text(example, "input", where)
    if extra:
        query = f"{query}\n{extra}"
    history = example.get("history")
    if isinstance(history, np.ndarray):  # numpy / pandas formatted rows
        history = history.tolist()
    out: list = []
    for k, pair in enumerate(history or []):
        pair = pair.tolist() if isinstance(pair, np.ndarray) else pair
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(t, str) for t in pair)):
            raise ParseError(f"history entry {k} is not a [query, response] pair of strings", where=where,
                             column="history", expected="[[query, response], ...]", found=repr(pair)[:80],
                             fix="give each history turn as a [query, response] pair of strings")
        out += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    out.append({"role": "user", "content": query})
    output: Any = example.get("output")
    if isinstance(output, (list, tuple, np.ndarray)):
        raise ParseError("column 'output' holds a list (LLaMA-Factory's ranking layout: chosen and rejected)",
                         where=where, column="output", expected="the reply as a string",
                         found=f"a list of {len(output)}", fix="use a preference trainer, or keep the chosen reply")
    reply = _text(example, "output", where)
    if reply is not None:
        out.append({"role": "assistant", "content": reply})
    return out
