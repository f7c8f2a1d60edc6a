"""Judge replies that cost a naive JSON-in-text parser quadratic time (each JSONDecodeError counts
the lines up to its position): the shapes the judge's parse tests count work on and the
``judge_parse`` bench times, built at any length ``n`` (characters)."""

from __future__ import annotations

__all__ = ["BRACE_HEAVY"]

BRACE_HEAVY = {
    "open braces": lambda n: "{" * n,
    "object starts": lambda n: '{"a":1,' * (n // 7),
    "key starts": lambda n: '{"' * (n // 2),
    "nested past the recursion limit": lambda n: '{"a": ' * (n // 6),
    "unclosed think": lambda n: "<think>{" * (n // 8),
    "unclosed list of objects": lambda n: '[{"a": 1}, ' * (n // 11),
}
