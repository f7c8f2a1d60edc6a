"""Tolerant parsing of the judge's answers.

Servers that honour ``response_format`` return bare JSON; others (or models told only in
the prompt) wrap it in code fences, put text around it, or prefix a ``<think>`` block.
`extract_json` finds the first JSON object that carries the wanted keys; `parse_action` /
`parse_progress` validate it. Neither raises: they return ``(value, None)`` or
``(None, "why")`` so a bad answer becomes an invalid `Answer`, not an exception.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any, Iterable, Optional

from mmpipe.records.reward import ActionVerdict, ProgressEstimate

_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_OBJECT_START = re.compile(r"\{\s*[\"}]")  # a JSON object opens with '{"' or '{}'
_TRUE = {"true", "yes", "y", "1"}
_FALSE = {"false", "no", "n", "0"}

# The search for objects after text stops once the decoder has gone through this many
# characters per character of the reply, or has tried one object start per
# `SEARCH_CHARS_PER_START` characters (each with a floor): it keeps the search linear in the
# reply's length on brace-heavy answers (2 MB: under 1 s); a normal answer is searched
# exhaustively.
SEARCH_WORK_FACTOR = 4
SEARCH_CHARS_PER_START = 16
_SEARCH_WORK_FLOOR = 1 << 16
_SEARCH_STARTS_FLOOR = 4096
_WINDOW = 1024  # first window decoded at a '{' (grown x4 while the value runs past it)

# Raw answer text kept in an `Answer` (the rest is counted, not kept): 64 frames of 4 MB
# replies must not put 512 MB into a dataset.
RAW_TEXT_LIMIT = 16 * 1024


class _Contradictory(dict):
    """A decoded object that gave a key twice with different values (``conflicts``)."""

    conflicts: list


def _object_pairs(pairs: list) -> dict:
    """``object_pairs_hook``: the last value wins (as in `json`), contradictions are noted."""
    obj: dict = {}
    conflicts = []
    for key, value in pairs:
        if key in obj and obj[key] != value and key not in conflicts:
            conflicts.append(key)
        obj[key] = value
    if conflicts:
        obj = _Contradictory(obj)
        obj.conflicts = conflicts
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_object_pairs)


def _loads(text: str):
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's limit
        return None


def _drop_think(text: str) -> str:
    """``text`` without ``<think>...</think>`` blocks (a linear scan; a regex is quadratic on
    many unclosed ``<think>``)."""
    low, out, pos = text.lower(), [], 0
    while (i := low.find("<think>", pos)) >= 0 and (j := low.find("</think>", i + 7)) >= 0:
        out.append(text[pos:i])
        pos = j + len("</think>")
    out.append(text[pos:])
    return "".join(out)


def _decode_at(text: str, i: int):
    """``(value, work)`` for the JSON value at ``text[i]`` (value None when none decodes).

    Decodes a window (grown while the value runs past it), so a failure costs about the
    characters read, not the reply's length (a `JSONDecodeError` counts lines up to its
    position)."""
    w, work = _WINDOW, 0
    while True:
        chunk = text[i:i + w]
        try:
            value, end = _DECODER.raw_decode(chunk)
            return value, work + end
        except RecursionError:
            return None, work + len(chunk)
        except json.JSONDecodeError as e:
            work += max(e.pos, 1)
            cut = i + w < len(text) and (e.pos >= len(chunk) - 8 or e.msg.startswith("Unterminated string"))
            if not cut:
                return None, work
            w *= 4


def _decoded_objects(text: str):
    """JSON values found in ``text``, in order of preference: the whole text, each fenced
    block, then a value starting at each ``{"`` / ``{}`` (text around the JSON), until the
    budgets (`SEARCH_WORK_FACTOR`, `SEARCH_CHARS_PER_START`) are spent."""
    for cand in [text, *(m.group(1).strip() for m in _FENCE.finditer(text))]:
        value = _loads(cand)
        if value is not None:
            yield value
    budget = SEARCH_WORK_FACTOR * len(text) + _SEARCH_WORK_FLOOR
    starts = max(len(text) // SEARCH_CHARS_PER_START, _SEARCH_STARTS_FLOOR)
    for m in itertools.islice(_OBJECT_START.finditer(text), starts):
        value, work = _decode_at(text, m.start())
        budget -= work
        if value is not None:
            yield value
        if budget <= 0:
            return


def extract_json(text: str, required: Iterable[str] = ()) -> Optional[dict]:
    """The first JSON object in ``text`` that has all ``required`` keys (else the first one).

    Tries, in order: the whole text, each fenced block (```json ... ```), then every ``{``
    in the text (``json.JSONDecoder.raw_decode``, so text before/after is ignored).
    A ``<think>...</think>`` block is dropped first. Returns None when nothing decodes to a
    JSON object. Linear in the text's length: the search after text stops after
    ``SEARCH_WORK_FACTOR`` characters decoded per character of text, or one object start
    tried per ``SEARCH_CHARS_PER_START`` characters (brace-heavy replies are then invalid,
    not slow).
    An object that gives a key twice with different values is returned with the key listed
    in its ``conflicts`` attribute (`parse_action` / `parse_progress` call it invalid).

    Example::

        >>> extract_json('Sure!\\n```json\\n{"progress": 0.4}\\n```')
        {'progress': 0.4}
    """
    if not isinstance(text, str):
        return None
    text = _drop_think(text).strip()
    required = tuple(required)
    found: list[dict] = []
    for obj in _decoded_objects(text):
        if isinstance(obj, dict):
            found.append(obj)
            if all(k in obj for k in required):
                return obj
    return found[0] if found else None


def clip_raw(text: str, limit: int = RAW_TEXT_LIMIT) -> tuple[str, int]:
    """``(kept, dropped)``: the first ``limit`` characters of a raw answer (with a note of
    how many more there were) and the number of characters not kept."""
    text = text if isinstance(text, str) else ""
    dropped = max(len(text) - limit, 0)
    if not dropped:
        return text, 0
    return f"{text[:limit]}... [{dropped} more characters not kept]", dropped


def _contradiction(obj: dict) -> Optional[str]:
    conflicts = getattr(obj, "conflicts", None)
    if not conflicts:
        return None
    return (f"answer JSON gives {conflicts} more than once with different values; "
            "expected each key once")


def _as_bool(value: Any) -> Optional[bool]:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    return None


def _as_unit(value: Any) -> Optional[float]:
    """A number in [0, 1]: accepts numbers and numeric strings ("0.7", "70%")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        s = value.strip()
        try:
            value = float(s[:-1]) / 100.0 if s.endswith("%") else float(s)
        except ValueError:
            return None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value) if 0.0 <= value <= 1.0 else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ("" if value is None else json.dumps(value))


def parse_action(text: str, p_true: Optional[float] = None) -> tuple[Optional[ActionVerdict], Optional[str]]:
    """Raw answer -> (`ActionVerdict`, None) or (None, reason it is invalid).

    Needs ``reasonable`` (bool, or "true"/"false"/"yes"/"no") and ``confidence`` (number in
    [0, 1], numeric string or "NN%"); ``reason`` is optional.
    """
    obj = extract_json(text, ("reasonable", "confidence"))
    if obj is None:
        return None, ("no JSON object in the answer (expected {\"reasonable\", \"confidence\", \"reason\"}), "
                      f"found {_clip(text)!r}")
    missing = [k for k in ("reasonable", "confidence") if k not in obj]
    if missing:
        return None, f"answer JSON lacks {missing} (expected reasonable, confidence, reason), found keys {sorted(obj)}"
    if _contradiction(obj):
        return None, _contradiction(obj)
    reasonable = _as_bool(obj["reasonable"])
    if reasonable is None:
        return None, f"'reasonable' must be true/false, found {obj['reasonable']!r}"
    confidence = _as_unit(obj["confidence"])
    if confidence is None:
        return None, f"'confidence' must be a number in [0, 1], found {obj['confidence']!r}"
    return ActionVerdict(reasonable, confidence, _text(obj.get("reason")), p_true), None


def parse_progress(text: str) -> tuple[Optional[ProgressEstimate], Optional[str]]:
    """Raw answer -> (`ProgressEstimate`, None) or (None, reason it is invalid).

    Needs ``progress`` (number in [0, 1], numeric string or "NN%"); ``stage`` and
    ``next_step`` are optional.
    """
    obj = extract_json(text, ("progress",))
    if obj is None:
        return None, ("no JSON object in the answer (expected {\"progress\", \"stage\", \"next_step\"}), "
                      f"found {_clip(text)!r}")
    if "progress" not in obj:
        return None, f"answer JSON lacks 'progress' (expected progress, stage, next_step), found keys {sorted(obj)}"
    if _contradiction(obj):
        return None, _contradiction(obj)
    progress = _as_unit(obj["progress"])
    if progress is None:
        return None, f"'progress' must be a number in [0, 1], found {obj['progress']!r}"
    return ProgressEstimate(progress, _text(obj.get("stage")), _text(obj.get("next_step"))), None


def verdict_probability(tokens: Optional[list]) -> Optional[float]:
    """P(true) / (P(true) + P(false)) at the token that spells the ``reasonable`` value.

    ``tokens`` is the chat completion's ``logprobs.content``: items with ``.token``,
    ``.logprob`` and ``.top_logprobs`` (objects or dicts). Returns None when the verdict
    token cannot be located. With top-logprobs the alternatives at that position are used;
    without them the sampled token's own probability (1 - p for "false").
    """
    if not tokens:
        return None
    get = lambda o, k: o.get(k) if isinstance(o, dict) else getattr(o, k, None)  # noqa: E731
    pieces = [get(t, "token") or "" for t in tokens]
    text = "".join(pieces)
    m = re.search(r'"reasonable"\s*:\s*"?(true|false)', text, re.IGNORECASE)
    if not m:
        return None
    pos, at = 0, None
    for i, piece in enumerate(pieces):
        if pos <= m.start(1) < pos + len(piece):
            at = i
            break
        pos += len(piece)
    if at is None:
        return None
    p_true = p_false = 0.0
    for alt in get(tokens[at], "top_logprobs") or []:
        word = _letters(get(alt, "token"))
        p = math.exp(get(alt, "logprob"))
        if word and "true".startswith(word):
            p_true += p
        elif word and "false".startswith(word):
            p_false += p
    if p_true + p_false > 0:
        return p_true / (p_true + p_false)
    p = math.exp(get(tokens[at], "logprob"))
    return p if m.group(1).lower() == "true" else 1.0 - p


def _letters(token: Optional[str]) -> str:
    """The first run of letters in a token, lower-cased (':true,' -> 'true')."""
    m = re.search(r"[a-zA-Z]+", token or "")
    return m.group(0).lower() if m else ""


def _clip(text: str, n: int = 120) -> str:
    text = text if isinstance(text, str) else repr(text)
    return text if len(text) <= n else text[:n] + "..."
