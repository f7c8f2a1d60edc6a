"""The tokens of an appended turn's text (`mmpipe.rollout.multiturn`): the new suffix of the
chat text tokenized exactly as tokenizing the whole conversation would tokenize it.

The tokenizer splits at added (special) tokens, so re-tokenizing from the last one before the
suffix is equivalent to tokenizing everything. Byte-level BPE vocabularies with the real Qwen
merges join text across the border, though: a reply starting with ``"\\n"`` after the header
``"assistant\\n"`` becomes one ``"ĊĊ"`` token. A reply given as text may then re-tokenize the
generation prompt's last tokens with it (`tokenize_suffix` with ``merge_back``); everything else
must start at a token boundary.

Also here: what the template writes around a reply, found with probe renders (`end_of_turn`, and
`turn_headers`: the special tokens a following turn opens with, which GLM-4.1V samples as its stop),
and `seen_render`: the conversation as the model saw it under a thinking template (GLM-4.6V, Qwen3
thinking), each sampled reply right after its generation prompt, as verl's agent loop keeps it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import numpy as np

from mmpipe.encoding.spans import THINK_END
from mmpipe.encoding.tokenize import added_tokens
from mmpipe.errors import InputError
from mmpipe.records.conversation import Conversation

__all__ = ["tokenize_suffix", "drop_tail", "end_of_turn", "turn_headers", "seen_render", "thinking_turn",
           "kept_as_sampled"]


def tokenize_suffix(conv: Conversation, before: str, suffix: str, what: str, *, merge_back: bool = False):
    """Tokens of ``suffix`` exactly as tokenizing ``before + suffix`` whole would give them.

    Returns (ids int64 [n], char starts int64 [n], char ends int64 [n], k): offsets relative to
    ``suffix`` (negative where a token begins in ``before``), and k, the number of trailing
    tokens of ``before`` the new ids replace (0 unless a token straddles the border). With
    ``merge_back`` False a straddling token raises `InputError` (stage "template"); with it True
    (a reply as text after its generation prompt) the caller drops those k tokens (`drop_tail`).
    """
    tok = conv.encoder.tokenizer
    cut = max((before.rfind(t) + len(t) for t in added_tokens(tok) if before.rfind(t) >= 0), default=0)
    tail = before[cut:]
    enc = tok(tail + suffix, add_special_tokens=False, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    head = tok(tail, add_special_tokens=False)["input_ids"] if tail else []
    n = next((i for i, (a, b) in enumerate(zip(ids, head)) if a != b), min(len(ids), len(head)))
    if n < len(head) and not merge_back:
        raise InputError(
            f"{what} merges with the text before it into one token ({tail[-20:]!r} + "
            f"{suffix[:20]!r}); appending would disagree with encoding the whole conversation",
            where=conv.where, row=conv.index, stage="template", expected=f"the {len(head)} token(s) before it kept",
            found=f"a token merging {tail[-20:]!r} + {suffix[:20]!r}",
            fix="start the appended text at a token boundary, or append the generated ids (append_response(ids)) "
            "instead of text",
        )
    offs = np.asarray(offs[n:], np.int64).reshape(-1, 2) - len(tail)
    return np.asarray(ids[n:], np.int64), offs[:, 0], offs[:, 1], len(head) - n


def drop_tail(conv: Conversation, k: int) -> Conversation:
    """``conv`` without its row's last ``k`` tokens (text tokens of the generation prompt that a
    reply re-tokenizes with its first characters); its text and messages are unchanged."""
    row = conv.row
    if k == 0:
        return conv
    L = row.num_tokens - k
    if k > row.num_tokens or (row.mm_token_type_ids is not None and row.mm_token_type_ids[L:].any()):
        raise InputError(  # an image / video block never ends a generation prompt; guard, do not cut one
            f"the reply merges with {k} token(s) before it that are not plain text",
            where=conv.where, row=conv.index, stage="template", expected=f"{k} plain text token(s) to re-tokenize",
            found=f"{row.num_tokens} token(s)" if k > row.num_tokens else "image / video tokens among them",
            fix="re-encode the whole conversation with mmpipe.encode_row instead of appending",
        )
    cut = {name: (None if getattr(row, name) is None else getattr(row, name)[..., :L])
           for name in ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "labels")}
    sequence = {name: v[..., :L] for name, v in row.sequence.items()}
    return replace(conv, row=replace(row, **cut, sequence=sequence))


# ---- what the template writes around a reply -------------------------------------------------
def end_of_turn(conv: Conversation) -> str:
    """The text the chat template puts after an assistant reply (found with a probe reply). A
    thinking template that writes its turn otherwise than the generation prompt (GLM-4.6V's
    ``<think></think>\n`` before a reply without reasoning) is read from `seen_render`."""
    probe = "\x00mmpipe-probe\x00"
    msgs = list(conv.messages) + [{"role": "assistant", "content": probe}]
    full = conv.encoder.render(msgs, False, conv.tools)
    if full.find(probe) == len(conv.text) and full.startswith(conv.text):
        return full[len(conv.text) + len(probe):]
    if conv.sampled or thinking_turn(conv, full, probe):
        seen = seen_render(conv, msgs, False, extra=len(msgs) - 1)
        if seen is not None and seen.startswith(conv.text + probe):
            return seen[len(conv.text) + len(probe):]
    raise InputError(
        "the chat template does not render an assistant reply right after the generation prompt",
        where=conv.where, row=conv.index, stage="template", expected=f"the reply at character {len(conv.text)}",
        found="earlier text re-rendered" if not full.startswith(conv.text) else
        f"the reply at character {full.find(probe)}" if probe in full else "no reply in the rendered text",
        fix="re-encode the whole conversation with mmpipe.encode_row instead of appending",
    )


def kept_as_sampled(conv: Conversation, content: str, close: str, full: str) -> bool:
    """Whether the reply ``content`` is kept as sampled (`Conversation.sampled`): a thinking template
    (GLM-4.6V, Qwen3 thinking) writes its turn otherwise than the generation prompt followed by the
    reply, or rewrites it later (history reasoning dropped). ``full``: the conversation rendered with
    the reply. Raises `InputError` (stage "template") when such a template writes after the reply
    other text than the ``close`` it writes after a probe reply (the next turn's text is unknown)."""
    if not conv.sampled and full == conv.text + content + close and THINK_END not in content:
        return False
    probe = "\x00mmpipe-probe\x00"
    if not conv.sampled and not thinking_turn(conv, conv.encoder.render(
            list(conv.messages) + [{"role": "assistant", "content": probe}], False, conv.tools), probe):
        return False
    if not full.endswith(close):
        raise InputError(
            f"the thinking template writes {full[-len(close) - 20:]!r} after the reply, not the {close!r} it "
            "writes after a probe reply, so the next turn's text is unknown",
            where=f"{conv.where}, reply {conv.num_turns}", row=conv.index, stage="template",
            expected=f"the reply, then {close!r}", found=repr(full[-len(close) - 20:]),
            fix="re-encode the whole conversation with mmpipe.encode_row, or encode with "
                "chat_template_kwargs={'enable_thinking': False}")
    return True


def _role_line(conv: Conversation) -> tuple[str, str]:
    """(the generation prompt's role line, the rest of it): ``("<|assistant|>\n", "")`` for
    GLM-4.6V with thinking on, ``("<|im_start|>assistant\n", "<think>\n")`` for Qwen3 thinking."""
    header = conv.encoder.reply_header()
    line = header[:header.find("\n") + 1] or header
    return line, header[len(line):]


def thinking_turn(conv: Conversation, full: str, probe: str) -> bool:
    """Whether ``full`` (a render whose last reply is ``probe``) holds a thinking block between the
    reply's role line and the reply, or the generation prompt holds one (`THINK_END`)."""
    line, tail = _role_line(conv)
    at = full.find(probe)
    start = full.rfind(line, 0, at) if line and at >= 0 else -1
    return THINK_END in tail or (start >= 0 and THINK_END in full[start:at])


def seen_render(conv: Conversation, messages: list, agp: bool, extra: Optional[int] = None) -> Optional[str]:
    """The chat text the model saw: the template's render of ``messages`` with each reply of
    ``conv.sampled`` (and message ``extra``) written as it was sampled: its turn's role line, the rest
    of the generation prompt, then the reply's content verbatim (where the template writes a thinking
    block or drops the reasoning). None when a reply's turn is not found in the render."""
    keep = [k for k in conv.sampled if k < len(messages)] + ([extra] if extra is not None else [])
    probes = {k: f"\x00mmpipe-reply{k}\x00" for k in keep}
    msgs = [dict(m, content=probes[k]) if k in probes else m for k, m in enumerate(messages)]
    text = conv.encoder.render(msgs, agp, conv.tools)
    line, tail = _role_line(conv)
    out, pos = [], 0
    for k in keep:
        at = text.find(probes[k], pos)
        start = text.rfind(line, pos, at) if line and at >= 0 else -1
        if start < 0:
            return None
        out += [text[pos:start + len(line)], tail, messages[k]["content"]]
        pos = at + len(probes[k])
    return "".join(out) + text[pos:]


def turn_headers(conv: Conversation) -> set:
    """The added tokens the template opens a user or tool turn with right after a reply (GLM-4.1V:
    ``<|user|>``, ``<|observation|>``; Qwen: none, its turns follow ``<|im_end|>\\n``)."""
    probe, tok = "\x00mmpipe-probe\x00", conv.encoder.tokenizer
    base = list(conv.messages) + [{"role": "assistant", "content": probe}]
    out = set()
    for role in ("user", "tool"):
        try:
            text = conv.encoder.render(base + [{"role": role, "content": probe}], False, conv.tools)
        except Exception:  # noqa: BLE001 - a template may refuse a role; it then opens no such turn
            continue
        between = text[text.find(probe) + len(probe): text.rfind(probe)]
        out.update(t for t in added_tokens(tok) if between.startswith(t))
    return out
