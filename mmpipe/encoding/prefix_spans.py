"""Where the assistant replies are, the old way (`mmpipe.encoding.spans`, way 3): the conversation
rendered up to each reply. Used only where the other ways do not locate the replies (a template
whose output outside the replies depends on their content); quadratic in the turns. A template
that does not render a conversation's prefixes as prefixes of the whole leaves a reply's span
undefined: the row is refused with where the renders differ (`prefix_error`).

`over_tool_calls`: where a template writes no stop token after a reply (GLM), a reply's tool calls
end where the conversation rendered up to it ends (the markers way stops at its content).
"""

from __future__ import annotations

from typing import Optional

from mmpipe.errors import InputError

__all__ = ["prefix_spans", "prefix_error", "over_tool_calls"]


def prefix_spans(enc, messages: list[dict], full: str, where: str, tools: Optional[list] = None,
                 full_agp: Optional[bool] = None) -> list[tuple[int, int]]:
    """Character spans of assistant responses in ``full``: from the end of the conversation
    rendered before each (with the generation prompt) to the end of the conversation rendered up
    to it, trailing newlines and spaces dropped. ``full_agp``: the ``add_generation_prompt`` of
    ``full``; when False, ``full`` is the last prefix, not rendered again. The other prefixes: at
    most two batched renders (``enc.render_many``)."""
    ks = [k for k, msg in enumerate(messages) if msg["role"] == "assistant"]
    again = [k for k in ks if not (k == len(messages) - 1 and full_agp is False)]
    befores = iter(enc.render_many([messages[:k] for k in ks if k], True, tools) if ks and ks[-1] else [])
    uptos = dict(zip(again, enc.render_many([messages[: k + 1] for k in again], False, tools) if again else []))
    spans = []
    for k in ks:
        before = next(befores) if k else ""
        upto = uptos.get(k, full)
        if not (full.startswith(before) and full.startswith(upto) and upto.startswith(before)):
            raise prefix_error(k, before, upto, full, where)
        # up to the end-of-turn token: trailing newlines/spaces dropped, never into ``before``
        spans.append((len(before), max(len(before), len(upto.rstrip("\n ")))))
    return spans


def prefix_error(k: int, before: str, upto: str, full: str, where: str) -> InputError:
    """The `InputError` of a template that does not render the conversation before reply ``k``
    (``before``, with the generation prompt) and up to it (``upto``) as prefixes of the whole
    (``full``): where the first that differs does, and what to do."""
    if not full.startswith(before):
        what, bad, ref = f"before message {k} (with the generation prompt)", before, full
    elif not full.startswith(upto):
        what, bad, ref = f"up to message {k}", upto, full
    else:  # both prefixes of the whole, the reply's end before its start
        what, bad, ref = f"up to message {k}", upto, before
    i = next((j for j, (x, y) in enumerate(zip(bad, ref)) if x != y), min(len(bad), len(ref)))
    think = any(tag in text[max(0, i - 16):i + 40] for text in (bad, ref) for tag in ("<think>", "</think>"))
    why = (" (they differ at a thinking block: the generation prompt closes it, e.g. enable_thinking=False, "
           "while the reply's reasoning is rendered there)") if think else ""
    return InputError(
        "the chat template does not render conversation prefixes as prefixes of the whole conversation, "
        f"and its replies cannot be located by markers either, so the span of reply {k} is not defined{why}",
        where=where, stage="template", column="messages",
        expected="the conversation rendered up to each reply = the start of the whole conversation's render",
        found=f"the conversation {what} renders {bad[i:i + 40]!r} at character {i}, where the "
              f"{'whole conversation' if ref is full else 'render before the reply'} has {ref[i:i + 40]!r}",
        fix=("drop the replies' reasoning (reasoning_content / <think> text) or encode with enable_thinking=True; or "
             if think else "") + "give the chat template {% generation %} blocks around each reply (mmpipe labels what "
            "they mark), or pass labels=False (no training targets)")


def over_tool_calls(enc, messages: list, full: str, spans: list, tools) -> list:
    """``spans`` (one per reply, in order) with each reply that carries ``tool_calls`` run over what
    the template writes for them after its content, where it writes no stop token after a reply
    (GLM-4.6V / GLM-OCR: ``<tool_call>name<arg_key>..</tool_call>`` and then the next turn's tag, so
    neither the markers nor `_with_stops` reach the calls): to the end of the conversation rendered
    up to that reply (trailing newlines and spaces dropped, as `prefix_spans`), where that render is
    a prefix of ``full`` ending before the next reply. One batched render of those prefixes
    (`mmpipe.encoding.spans.locate_replies`, after the markers way)."""
    ks = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    calls = [i for i, k in enumerate(ks) if messages[k].get("tool_calls")]
    if not calls or len(ks) != len(spans):
        return spans
    try:
        uptos = enc.render_many([messages[: ks[i] + 1] for i in calls], False, tools)
    except InputError:
        return spans
    out = list(spans)
    for i, upto in zip(calls, uptos):
        a, b = out[i]
        end = len(upto.rstrip("\n "))
        nxt = out[i + 1][0] if i + 1 < len(out) else len(full)
        if full.startswith(upto) and b <= end <= nxt:
            out[i] = (a, end)
    return out
