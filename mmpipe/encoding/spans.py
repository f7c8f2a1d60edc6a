"""Where the assistant replies are in a rendered conversation: the character spans ``labels``
train on, found from the chat template itself, whatever its whitespace:

1. **generation blocks**: a template with ``{% generation %}`` marks its replies itself; the
   spans are exactly what transformers' ``return_assistant_tokens_mask`` masks (its own
   renderer's indices, checked to render the same text).
2. **markers**: otherwise each assistant message's content is rendered once more between two
   marker strings; the text the template writes outside the replies is then the same in both
   renders, so each reply is what lies between those pieces in the real render: its exact
   text (trailing spaces and newlines included), tool calls and end-of-turn token following it.
   Where the template provably only writes each reply out untouched (`mmpipe.encoding.marked_render`
   sees every read of it), the marked render alone gives the real text too: one render, not two.
   A template that splits a reply's reasoning out of its content (``<think>...</think>``:
   GLM-4.6V, Qwen3 thinking templates; reasoning kept after the last user turn only) drops the
   first marker with the reasoning: those replies are marked once more around their answer
   (all that follows the last ``</think>``), and each such reply starts where its turn's header
   ends, so it is what the template wrote for it: the reasoning as rendered (``<think></think>``
   in history turns), then the answer (one more render).
3. **prefixes**: a template whose output outside the replies depends on their content (one
   that writes a newline only before a non-empty reply) is located the old way, by rendering
   the conversation up to each reply (quadratic in the turns); a template that does not render
   prefixes as prefixes is refused (`mmpipe.encoding.prefix_spans`: where they differ, and what to do).

Every way costs one to three renders of the conversation, linear in its turns (the prefixes way
excepted).

End of turn (`StopRule`): what the template marks (its generation blocks; without them the
reply and the family's stop token where the template writes it right after the reply:
``<|im_end|>``, ``<end_of_turn>``). ``end_of_turn="stop_token"`` also labels the stop token
after every reply where the template writes it unmarked (LLaVA-OneVision's tags stop before
``<|im_end|>``) and, where it writes none (GLM-4.1V), appends the family's ``stop_token`` to
the reply in the text, as LLaMA-Factory does.
"""

from __future__ import annotations

import logging
import re
from typing import NamedTuple, Optional

from mmpipe.encoding.marked_render import TrackedText
from mmpipe.encoding.prefix_spans import over_tool_calls, prefix_spans
from mmpipe.errors import InputError

logger = logging.getLogger("mmpipe.encoding.encoder")

__all__ = ["GENERATION_TAG", "END_OF_TURN", "THINK_END", "ReplySpans", "StopRule", "locate_replies"]

GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
END_OF_TURN = ("template", "stop_token")  # the Encoder's end_of_turn choices
_MARK = "\x02mmpipe{}{}\x03"  # a marker string: never in a rendered text (`_markable`), kept by templates
THINK_END = "</think>"  # where a reply's reasoning ends in its content (the thinking templates split there)


class ReplySpans(NamedTuple):
    """The text to tokenize (the render, or with stop tokens appended) and the replies' spans
    ``[(start, end)]`` in it, in order; ``how``: "generation", "markers" or "prefixes"."""

    text: str
    spans: list
    how: str


class StopRule(NamedTuple):
    """What ends a reply: ``token`` (the family's ``stop_token``, else the tokenizer's eos),
    whether the template writes it after a reply (``written``, probed once per encoder), and
    whether to label it after every reply, appending it where the template writes none
    (``always``: ``end_of_turn="stop_token"``)."""

    token: Optional[str]
    written: bool
    always: bool


def locate_replies(enc, messages: list, full: str, where: str, tools, agp: Optional[bool],
                   stop: StopRule, marked_text: Optional[str] = None) -> ReplySpans:
    """The replies of ``messages`` in ``full`` (their render) by the first way that applies
    (module doc), then the end-of-turn rule ``stop``. ``marked_text``: the render of
    `marked_messages` when the caller rendered it (batched), else rendered here."""
    if not _any_reply(messages):
        return ReplySpans(full, [], "none")
    found = _generation_spans(enc, messages, full, tools, agp)
    how = "generation"
    if found is None:
        if marked_text is None and "\x02" not in full:
            try:
                marked_text = enc.render(marked_messages(messages), bool(agp), tools)
            except InputError:
                marked_text = None
        found, how = _marker_spans(enc, messages, full, marked_text), "markers"
        if found is None:
            found = _answer_spans(enc, messages, full, tools, agp)
    if found is None:
        found, how = prefix_spans(enc, messages, full, where, tools, agp), "prefixes"
    elif how == "markers" and not stop.written:
        found = over_tool_calls(enc, messages, full, found, tools)
    text, spans = _with_stops(full, found, stop, marked=how == "generation")
    return ReplySpans(text, spans, how)


def _any_reply(messages: list) -> bool:
    for m in messages:
        if m["role"] == "assistant":
            return True
    return False


# ---- 1. generation blocks ---------------------------------------------------------------------
def template_source(enc) -> Optional[str]:
    """The chat template text ``enc`` renders with (None when it cannot be read)."""
    target = enc.processor if hasattr(enc.processor, "apply_chat_template") else enc.tokenizer
    try:
        if hasattr(target, "_resolve_chat_template"):  # a processor (transformers 5)
            template = target._resolve_chat_template(enc.chat_template_kwargs.get("chat_template"))
        else:
            template = getattr(target, "chat_template", None) or enc.tokenizer.chat_template
            if hasattr(enc.tokenizer, "get_chat_template"):
                template = enc.tokenizer.get_chat_template(template)
    except Exception:  # noqa: BLE001 - no template to read: the other ways apply
        return None
    return template if isinstance(template, str) else None


def _generation_template(enc) -> Optional[str]:
    """The template ``enc`` renders with when it has ``{% generation %}`` blocks, else None; read
    once per encoder and template (the regex search costs ~4 us a row otherwise)."""
    template = template_source(enc)
    if template is None:
        return None
    seen = enc.__dict__.setdefault("_generation_templates", {})  # template text -> has blocks
    if template not in seen:
        seen[template] = bool(GENERATION_TAG.search(template))
    return template if seen[template] else None


def _generation_spans(enc, messages: list, full: str, tools, agp) -> Optional[list]:
    """The spans of the template's ``{% generation %}`` blocks (contiguous ones joined), as
    transformers' renderer reports them; None without blocks or when it renders another text."""
    template = _generation_template(enc)
    if template is None:
        return None
    from transformers.utils.chat_template_utils import render_jinja_template

    kwargs = {**getattr(enc.tokenizer, "special_tokens_map", {}), **enc.chat_template_kwargs}
    kwargs.pop("chat_template", None)
    try:
        rendered, indices = render_jinja_template(
            conversations=[list(messages)], tools=tools, chat_template=template,
            return_assistant_tokens_mask=True, add_generation_prompt=bool(agp), **kwargs)
    except Exception as e:  # noqa: BLE001 - the processor's own render worked: locate another way
        logger.debug("generation blocks not rendered (%s: %s); locating replies by markers", type(e).__name__, e)
        return None
    if rendered[0] != full:
        logger.debug("transformers' renderer gives another text than the processor's; locating replies by markers")
        return None
    spans: list = []
    for a, b in sorted((int(a), int(b)) for a, b in indices[0]):
        if spans and a <= spans[-1][1]:  # LLaVA-OneVision: a block per text part
            spans[-1] = (spans[-1][0], max(b, spans[-1][1]))
        else:
            spans.append((a, b))
    return spans


# ---- 2. markers ------------------------------------------------------------------------------
_MARKS_MADE: list = []  # _marks(k) for k < len: the strings are made once, not twice per reply and call


def _marks(k: int) -> tuple[str, str]:
    if k < len(_MARKS_MADE):
        return _MARKS_MADE[k]
    if k < 256:
        _MARKS_MADE.extend((_MARK.format("S", j), _MARK.format("E", j)) for j in range(len(_MARKS_MADE), k + 1))
        return _MARKS_MADE[k]
    return _MARK.format("S", k), _MARK.format("E", k)


def _answer_at(message: dict) -> Optional[tuple]:
    """(index of the text part holding the reply's last `THINK_END`, None for a string content;
    where its answer starts in that text: right after the tag (whitespace a template strips there
    is then not in its render, whitespace it keeps is the reply's), None when nothing but
    whitespace follows), or None when the content holds no tag."""
    content = message.get("content")
    texts = [(None, content)] if isinstance(content, str) else [
        (i, p["text"]) for i, p in enumerate(content or ()) if isinstance(p, dict) and isinstance(p.get("text"), str)]
    for n, (i, text) in enumerate(reversed(texts)):
        at = text.rfind(THINK_END)
        if at >= 0:
            empty = not text[at + len(THINK_END):].strip() and not any(t.strip() for _, t in texts[len(texts) - n:])
            return i, None if empty else at + len(THINK_END)
    return None


def _marked(message: dict, k: int, probe=None, answer: Optional[tuple] = None) -> dict:
    """Assistant message ``k`` with its content between its two markers (a content list: inside
    its first and last text parts, or as text parts of their own); with a ``probe``
    (`mmpipe.encoding.marked_render`) each marked string a `TrackedText` reporting to it.
    ``answer`` (`_answer_at`): the first marker where the answer starts, not before the content."""
    start, end = _marks(k)

    def mark(before: str, text: str, after: str) -> str:
        return before + text + after if probe is None else TrackedText(before + text + after, probe, bool(text))

    content = message.get("content")
    if answer is not None:
        i, at = answer
        if i is None:
            return {**message, "content": content[:at] + start + content[at:] + end}
        parts = [dict(p) if isinstance(p, dict) else p for p in content]
        parts[i]["text"] = parts[i]["text"][:at] + start + parts[i]["text"][at:]
        last = max(j for j, p in enumerate(parts) if isinstance(p, dict) and isinstance(p.get("text"), str))
        parts[last]["text"] += end
        return {**message, "content": parts}
    if isinstance(content, str):
        return {**message, "content": mark(start, content, end)}
    parts = [dict(p) if isinstance(p, dict) else p for p in content]
    texts = [i for i, p in enumerate(parts) if isinstance(p, dict) and p.get("type") == "text"]
    if len(texts) == 1:
        parts[texts[0]]["text"] = mark(start, str(parts[texts[0]].get("text", "")), end)
    elif texts:
        parts[texts[0]]["text"] = mark(start, str(parts[texts[0]].get("text", "")), "")
        parts[texts[-1]]["text"] = mark("", str(parts[texts[-1]].get("text", "")), end)
    else:
        if probe is not None:
            probe.touched = True  # parts of their own change the structure: not one render
        parts = [{"type": "text", "text": start}, *parts, {"type": "text", "text": end}]
    return {**message, "content": parts}


def _has_text(message: dict) -> bool:
    """Whether a reply has content to mark (an empty one may change what the template writes
    around it: Qwen3-VL's newline before a tool call)."""
    content = message.get("content")
    if not content:
        return False
    if isinstance(content, str):
        return True
    for p in content:  # a loop, not any() over a generator: ~2x faster on the short lists chats hold
        if isinstance(p, dict) and p.get("type") == "text" and p.get("text"):
            return True
    return False


def reply_indices(messages: list) -> list:
    """The indices of the replies `marked_messages` marks (those with text)."""
    return [k for k, m in enumerate(messages) if m["role"] == "assistant" and _has_text(m)]


def marked_messages(messages: list, probe=None, answers: Optional[dict] = None, unmarked=frozenset()) -> list:
    """``messages`` with each reply that has text between its two markers (`_marked`; ``probe``:
    marked strings tracked, `mmpipe.encoding.marked_render`; ``answers``: reply index ->
    `_answer_at`, those replies marked around their answer; ``unmarked``: replies left as they are)."""
    ks, answers = set(reply_indices(messages)) - set(unmarked), answers or {}
    return [(_marked(m, k, probe, answers.get(k)) if k in ks else m) for k, m in enumerate(messages)]


def _answer_spans(enc, messages: list, full: str, tools, agp) -> Optional[list]:
    """The replies located by markers with each reply that holds reasoning (`THINK_END`) marked
    around its answer (module doc, way 2): one more render; None where that does not locate them.
    A reply of reasoning alone (a tool call's) is left unmarked where the template writes a stop
    token: it runs from its turn's header to that token (`_empty_reply_spans`)."""
    answers, unmarked = {}, set()
    for k in reply_indices(messages):
        at = _answer_at(messages[k])
        if at is not None and at[1] is not None:
            answers[k] = at
        elif at is not None and enc.stop_rule().written:
            unmarked.add(k)
    if not (answers or unmarked) or "\x02" in full:
        return None
    try:
        text = enc.render(marked_messages(messages, answers=answers, unmarked=unmarked), bool(agp), tools)
    except InputError:
        return None
    return _marker_spans(enc, messages, full, text, set(answers), unmarked)


def _marker_spans(enc, messages: list, full: str, text: Optional[str], answers=frozenset(),
                  unmarked=frozenset()) -> Optional[list]:
    """Each reply's span in ``full``: between the pieces of text the template writes around the
    replies, read from ``text``, the render of `marked_messages` (an empty reply is not marked:
    it starts after its turn's header, `_empty_reply_spans`); each reply starts after its turn's
    header where the template writes text between the two (GLM-4.6V's ``<think></think>``); None
    when ``text`` does not show the replies as pieces of ``full`` (the template writes
    something else around a marked reply). ``answers``: the replies marked around their answer;
    None when one of them has a ``</think>`` before it that its turn's header does not precede
    (reasoning written where its start is unknown); ``unmarked``: replies located as empty ones."""
    if text is None or "\x02" in full:
        return None
    ks = [k for k in reply_indices(messages) if k not in unmarked]
    pieces, pos = [], 0  # the text outside the replies: before the first, between them, after the last
    for k in ks:
        start, end = _marks(k)
        a = text.find(start, pos)
        b = text.find(end, a + len(start)) if a >= 0 else -1
        if b < 0:
            return None  # the template dropped a reply's content (or part of it)
        pieces.append(text[pos:a])
        pos = b + len(end)
    pieces.append(text[pos:])
    for piece in pieces:
        if "\x02" in piece:
            return None
    if not ks:  # every reply located as an empty one
        empty = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        return _empty_reply_spans(enc, messages, full, ks, empty, pieces, [0]) if text == full else None
    if not full.startswith(pieces[0]) or not full.endswith(pieces[-1]):
        return None
    spans, at, stop = [], len(pieces[0]), len(full) - len(pieces[-1])
    where = [0]  # each piece's start in ``full``
    for piece in pieces[1:-1]:
        if not piece:
            return None  # two replies with nothing between: not separable
        b = full.find(piece, at, stop)
        if b < 0:
            return None
        spans.append((at, b))
        where.append(b)
        at = b + len(piece)
    if at > stop:
        return None
    spans.append((at, stop))
    where.append(stop)
    header = enc.reply_header()
    tag = header.split("\n", 1)[0] or header  # the header's role tag ("<|im_start|>assistant")
    for i, (piece, (a, b), k) in enumerate(zip(pieces, spans, ks)):
        own = piece[piece.rfind(tag):] if tag and tag in piece else piece  # the reply's turn before it
        if header and own.startswith(header):  # a reply starts where its turn's header ends
            spans[i] = (a - (len(own) - len(header)), b)
        elif (k in answers and THINK_END in own) or _other_thinking(header, own + full[a:b]):
            return None  # reasoning where the prompt closes the block ("done</think>ans" too), or its start unknown
    empty = [k for k, m in enumerate(messages) if m["role"] == "assistant" and k not in ks]
    if empty:
        found = _empty_reply_spans(enc, messages, full, ks, empty, pieces, where)
        if found is None:
            return None
        spans = sorted(spans + found)
    return spans


def _other_thinking(prompt: str, turn: str) -> bool:
    """Whether a reply's ``turn`` holds reasoning where the generation ``prompt`` closes the block."""
    end = THINK_END
    return end in prompt and end in turn and turn[:turn.find(end)] != prompt[:prompt.find(end)]


def _empty_reply_spans(enc, messages, full, ks, empty, pieces, where) -> Optional[list]:
    """Spans of the empty replies: each starts after its turn's header (the generation prompt's text, found
    in order in its piece; where the template writes only its first line, a thinking template's history turn
    ``<|im_start|>assistant\n`` without ``<think>\n``, after that line) and runs to the stop token the template
    writes (tool calls included), else over the thinking block the model writes (GLM-4.6V's ``<think></think>``)."""
    header = enc.reply_header()
    if not header:
        return None
    line = header[:header.find("\n") + 1] or header  # the role line of the header
    stop = enc.stop_rule()
    out, piece, pos = [], -1, 0
    for k in empty:
        p = sum(1 for j in ks if j < k)  # the piece holding reply k
        if p != piece:
            piece, pos = p, where[p]
        limit = where[p] + len(pieces[p])
        a = full.find(line, pos, limit)
        if a < 0:
            return None
        turn = full[a + len(line):max(full.find(line, a + len(line), limit), 0) or limit]  # to the next
        if not full.startswith(header, a) and _other_thinking(header[len(line):], turn):
            return None  # its reasoning rendered where the generation prompt closes the thinking block
        a += len(header) if full.startswith(header, a) else len(line)
        b = full.find(stop.token, a, limit) if stop.written and stop.token else -1
        end = b + len(stop.token) if b >= 0 else a
        if b < 0 and THINK_END not in header and full.startswith("<think>", a):  # the model writes the block
            end = max(full.find(THINK_END, a, limit) + len(THINK_END), a)
        out.append((a, end))
        pos = out[-1][1]
    return out


# ---- the end of each turn ---------------------------------------------------------------------
def _with_stops(full: str, spans: list, stop: StopRule, marked: bool) -> tuple[str, list]:
    """``spans`` each extended over the stop token the template writes after a reply (the first
    one before the next reply; generation blocks: only with ``stop.always``), and with
    ``stop.always`` the token appended to each reply where the template writes none -> (text, spans)."""
    token = stop.token
    if not token or not spans or (marked and not stop.always) or not (stop.written or stop.always):
        return full, spans
    out, pieces, shift, last = [], [], 0, 0
    for i, (a, b) in enumerate(spans):
        nxt = spans[i + 1][0] if i + 1 < len(spans) else len(full)
        at = -1 if full[a:b].endswith(token) or not stop.written else full.find(token, b, nxt)
        if at >= 0:
            b = at + len(token)
        elif stop.always and not full[a:b].endswith(token):
            pieces.append(full[last:b] + token)
            last = b
            shift += len(token)
            out.append((a + shift - len(token), b + shift))
            continue
        out.append((a + shift, b + shift))
    return "".join(pieces) + full[last:], out
