"""The tokens of an appended turn's text (`mmpipe.rollout.multiturn`): the new suffix of the
chat text tokenized exactly as tokenizing the whole conversation would tokenize it.

The tokenizer splits at added (special) tokens, so re-tokenizing from the last one before the
suffix is equivalent to tokenizing everything. Byte-level BPE vocabularies with the real Qwen
merges join text across the border, though: a reply starting with ``"\\n"`` after the header
``"assistant\\n"`` becomes one ``"ĊĊ"`` token. A reply given as text may then re-tokenize the
generation prompt's last tokens with it (`tokenize_suffix` with ``merge_back``); everything else
must start at a token boundary.

Also here: what the template writes around a reply, found with probe renders (`end_of_turn`, and
`turn_headers`: the special tokens a following turn opens with, which GLM-4.1V samples as its stop).
"""

from __future__ import annotations

from dataclasses import replace
import numpy as np

from mmpipe.encoding.tokenize import added_tokens
from mmpipe.errors import InputError
from mmpipe.records.conversation import Conversation

__all__ = ["tokenize_suffix", "drop_tail", "end_of_turn", "turn_headers"]


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
    """The text the chat template puts after an assistant reply (found with a probe reply)."""
    probe = "\x00mmpipe-probe\x00"
    full = conv.encoder.render(list(conv.messages) + [{"role": "assistant", "content": probe}], False, conv.tools)
    if full.find(probe) != len(conv.text) or not full.startswith(conv.text):
        raise InputError(
            "the chat template does not render an assistant reply right after the generation prompt",
            where=conv.where, row=conv.index, stage="template", expected=f"the reply at character {len(conv.text)}",
            found="earlier text re-rendered" if not full.startswith(conv.text) else
            f"the reply at character {full.find(probe)}" if probe in full else "no reply in the rendered text",
            fix="re-encode the whole conversation with mmpipe.encode_row instead of appending",
        )
    return full[len(conv.text) + len(probe):]


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
