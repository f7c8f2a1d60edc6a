"""ShareGPT / LLaVA rows: a ``conversations`` column of ``{"from": "human" | "gpt" | "system",
"value": text with <image> markers}`` turns (LLaVA-Instruct, ShareGPT4V, LLaMA-Factory's sharegpt
datasets), read as chat messages by `mmpipe.encoding.parse` (the column's errors name it)."""

from __future__ import annotations

from typing import Any

from mmpipe.errors import ParseError

__all__ = ["SHAREGPT_ROLES", "sharegpt_messages"]

# ShareGPT / LLaVA speakers ("from") -> chat roles (LLaMA-Factory's sharegpt defaults, LLaVA's data)
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
                  "system": "system"}


def sharegpt_messages(turns: Any, where: str) -> Any:
    """A ShareGPT / LLaVA ``conversations`` list (``{"from": "human" | "gpt" | "system", "value":
    text with <image> markers}``) -> chat messages (``{"role", "content"}``); a turn already in
    ``{"role", "content"}`` form stays as it is. Tool turns (``function_call``, ``observation``)
    and other speakers are a `ParseError` naming the turn (their meaning differs between
    datasets); anything but a list is left to the caller's check."""
    if not isinstance(turns, (list, tuple)):
        return turns
    out = []
    for k, turn in enumerate(turns):
        if isinstance(turn, dict) and "from" in turn and "role" not in turn:
            speaker, value = turn.get("from"), turn.get("value")
            role = SHAREGPT_ROLES.get(speaker) if isinstance(speaker, str) else None
            if role is None or not isinstance(value, str):
                bad = f"from={speaker!r}" if role is None else f"value of type {type(value).__name__}"
                raise ParseError(f"conversation turn {k} is not a ShareGPT text turn", where=where,
                                 column="conversations", expected=f"from in {sorted(SHAREGPT_ROLES)} and a text value",
                                 found=bad, fix="convert tool turns (function_call / observation) to chat messages with "
                                 "tool_calls and role 'tool' in a 'messages' column, or drop the row")
            turn = {"role": role, "content": value}
        out.append(turn)
    return out
