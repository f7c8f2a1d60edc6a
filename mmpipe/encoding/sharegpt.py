"""ShareGPT / LLaVA rows: a ``conversations`` column of ``{"from": "human" | "gpt" | "system",
"value": text with <image> markers}`` turns (LLaVA-Instruct, ShareGPT4V, LLaMA-Factory's sharegpt
datasets), read as chat messages by `mmpipe.encoding.parse` (the column's errors name it)."""

from __future__ import annotations

from typing import Any

from mmpipe.errors import ParseError

__all__ = ["SHAREGPT_ROLES", "check_chat_role", "sharegpt_messages"]

# ShareGPT / LLaVA speakers ("from") -> chat roles (LLaMA-Factory's sharegpt defaults, LLaVA's data)
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
                  "system": "system"}
# a role the templates would not recognise but a writer meant as a chat role (ShareGPT / Gemma speaker
# names, another case, stray spaces) -> that role: rendered as given it becomes a foreign turn
# (``<|im_start|>gpt``) that is never labelled (Gemma's template renders "model" as "assistant" does)
_MEANT_ROLES = SHAREGPT_ROLES


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


def check_chat_role(role: str, m_i: int, column: str, where: str) -> None:
    """Refuse (`ParseError`) a chat message whose ``role`` means the assistant but is spelled
    otherwise: a ShareGPT / Gemma speaker name (``gpt``, ``model``) or ``assistant`` in another
    case or with spaces (``"Assistant"``): templates would render it as an unknown turn and mmpipe
    labels only ``assistant`` turns, so the answer would silently never be a target. Other roles
    pass (a template renders them as given: ``"USER"``, ``"human"``, ``"narrator"``; no answer is
    lost)."""
    use = _MEANT_ROLES.get(role.strip().lower())
    if use == "assistant" and use != role:
        kind = "a chat role spelled otherwise" if role.strip().lower() == use else "a ShareGPT speaker name"
        raise ParseError(f"message {m_i} has role {role!r} ({kind}): the template would render it "
                         f"as a turn of its own and the turn would not be labelled", where=where, column=column,
                         expected="role 'system', 'user', 'assistant' or 'tool'", found=f"role {role!r}",
                         fix=f"rename role {role!r} to {use!r} (or give ShareGPT turns as a 'conversations' column "
                             "with 'from' / 'value')")
