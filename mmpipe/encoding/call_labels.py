"""Labels of a row whose ids come from a call mmpipe does not own (a processor's own chat template
and call: the generic path, `mmpipe.media.processor_encode`): the ids where a token overlaps an
assistant reply, -100 elsewhere, found without the call's offsets.

Four ways, cheapest first: a row without media whose ids are the tokenizer's for its text: the
replies' character spans (one render, `mmpipe.encoding.spans` via ``enc.reply_spans``) and the
tokenizer's offsets; a row with images whose ids are the tokenizer's for its text with tokens
added around and in place of its image placeholders: the same spans, the tokenizer's offsets
matched into the row's ids in order (`_aligned_labels`; PaliGemma moves ``<bos>`` after the last
image and appends ``"\\n"``, which no prefix's call reproduces); else each reply's edges from
the text after it tokenized alone (`tail_cuts`: the text between two edges once, linear in the
turns; the processor's call on it with its own media where it holds any), when the row's ids end
with those tokens; else the call
run on the conversation up to each edge (``ids_of``), the longest common prefix with the row's
ids (quadratic in the turns: each call holds every earlier image). The edges are the
same replies' spans (`_reply_edges`), so a row is labelled alike with and without media (a
template's ``{% generation %}`` blocks followed either way); the conversation rendered before and
up to each reply only where those spans are not one per reply.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Callable, Optional

import numpy as np

from mmpipe.encoding.render import span_labels
from mmpipe.encoding.tokenize import added_token_ids
from mmpipe.records.columns import IGNORE_INDEX

__all__ = ["call_labels", "suffix_cut", "tail_cuts"]


def _text_row_labels(enc, messages: list, agp: bool, tools, ids: np.ndarray, full: str) -> Optional[np.ndarray]:
    """Labels of a row without images from the replies' character spans in ``full`` and the
    tokenizer's offsets, when the tokenizer gives the processor's ids for ``full``; else None."""
    bos = getattr(enc.tokenizer, "bos_token", None)
    special = not (bos and full.startswith(bos))  # as the processor is called (no second BOS)
    try:
        out = enc.tokenizer(full, add_special_tokens=special, return_offsets_mapping=True)
    except (ValueError, TypeError, NotImplementedError):  # a slow tokenizer has no offsets
        return None
    if not np.array_equal(np.asarray(out["input_ids"], np.int64), ids):
        return None
    text, spans, _ = enc.reply_spans(messages, full, "", tools, agp)
    if text != full:
        return None
    return span_labels(ids, np.asarray(out["offset_mapping"], np.int64).reshape(-1, 2), spans)


def _aligned_labels(enc, messages: list, agp: bool, tools, ids: np.ndarray, full: str) -> Optional[np.ndarray]:
    """Labels of an image row from the replies' character spans in ``full`` and the tokenizer's
    offsets, when the tokenizer's ids of ``full`` are ``ids`` int64 [L] with added tokens put
    among them: matched in order, every token of ``ids`` that matches none is an added token (an
    image run, ``<bos>`` inserted after the last image) or follows the whole text (PaliGemma's
    ``"\\n"``); such tokens overlap no reply. The labels a row without images gets (its text's
    tokens are the same), with no processor call on prefixes: those differ from the row where the
    call rewrites the text around its LAST image (PaliGemma), and a common prefix stopping there
    labelled user text. None where the ids do not align so or the spans are not in ``full``."""
    bos = getattr(enc.tokenizer, "bos_token", None)
    try:
        text, spans, _ = enc.reply_spans(messages, full, "", tools, agp)
        out = enc.tokenizer(full, add_special_tokens=not (bos and full.startswith(bos)), return_offsets_mapping=True)
    except Exception:  # noqa: BLE001 - no spans (InputError) or no offsets (a slow tokenizer): not this way
        return None
    if text != full:
        return None
    own, offsets = list(out["input_ids"]), np.asarray(out["offset_mapping"], np.int64).reshape(-1, 2)
    added = added_token_ids(enc.tokenizer)
    mapped = np.full((len(ids), 2), -1, np.int64)  # a token put in overlaps no reply
    i, put = 0, None  # put: the last token of the run of put-in tokens so far (None: no run)
    for j, t in enumerate(ids.tolist()):
        if i < len(own) and t == own[i]:
            if put is not None and put not in added:  # a run of put-in tokens ends with an added one
                return None
            mapped[j], i, put = offsets[i], i + 1, None
        elif i < len(own):  # put in: a run opened by an added token (MiniCPM-V's <image_id>0</image_id>)
            if put is None and t not in added:  # a text token the text does not have here
                return None
            put = t
    return span_labels(ids, mapped, spans) if i == len(own) else None


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def call_labels(enc, messages: list, media: tuple, agp: bool, tools, ids: np.ndarray, full: str,
                ids_of: Callable, segment_ids_of: Optional[Callable] = None) -> np.ndarray:
    """int64 [L]: the ids where a token overlaps an assistant reply (its text and end-of-turn
    token, not the newline after), -100 elsewhere. A row without images whose ids are the
    tokenizer's for its text: the replies located in one render (`mmpipe.encoding.spans`) and
    the tokenizer's offsets (linear in the turns). Otherwise each reply's start and end (the same
    spans, `_reply_edges`): the text after it tokenized alone, when the row's ids end with those
    tokens and it holds no image or clip (no processor call); else the processor run on the
    conversation up to there (its images and clips included: their tokens count), a token merged
    across the edge labelled. ``media``: (the row's images, its audio waveforms); ``ids_of(enc, text, images, audios)``:
    the ids of the call on a prefix (the kind's processor call); ``segment_ids_of`` (same arguments,
    None where the call refuses): the call on the text between two edges, no special tokens added,
    so that each edge is found from the next one's (`tail_cuts`) with each image processed once."""
    images, audios = media
    if not images and not audios:
        found = _text_row_labels(enc, messages, agp, tools, ids, full)
        if found is not None:
            return found
    elif not audios and segment_ids_of is not None:  # images only (videos: their prefixes' calls)
        found = _aligned_labels(enc, messages, agp, tools, ids, full)
        if found is not None:
            return found
    labels = np.full(len(ids), IGNORE_INDEX, np.int64)
    counts = {kind: [sum(1 for c in m["content"] if isinstance(c, dict) and c.get("type") == kind)
                     if isinstance(m.get("content"), list) else 0 for m in messages] for kind in ("image", "audio")}
    n_images, n_audios = counts["image"], counts["audio"]

    def upto(text: str, k: int) -> np.ndarray:  # the ids of a prefix holding messages[:k]'s media
        return ids_of(enc, text, images[:sum(n_images[:k])], audios[:sum(n_audios[:k])])

    edges, replies = iter(_reply_edges(enc, messages, agp, tools, full) or ()), []
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        text_after = not any(n_images[k:]) and not any(n_audios[k:])  # no media at or after: the rest alone
        edge = next(edges, None)
        if edge is None or n_images[k] or n_audios[k]:  # a reply holding media: its text may follow them
            edge = _rendered_edges(enc, messages, k, tools)
        replies.append((k, *edge, text_after))
    held = list(zip(accumulate(n_images, initial=0), accumulate(n_audios, initial=0)))  # media before message k
    tails = [(edge, held[j]) for k, before, upto_text, after in replies if after or segment_ids_of is not None
             for edge, j in ((before, k), (upto_text, k + 1))]
    cuts = tail_cuts(enc, ids, full, tails, media, segment_ids_of)
    for k, before, upto_text, text_after in replies:
        start = cuts.get(before)
        if start is None:
            start = _common_prefix(upto(before, k), ids) if before else 0
        end = cuts.get(upto_text)
        if end is None:
            upto_ids = upto(upto_text, k + 1)
            shared = _common_prefix(upto_ids, ids)
            end = shared + (1 if shared < len(upto_ids) else 0)  # a last token merged with what follows
        labels[start:end] = ids[start:end]
    return labels


def _reply_edges(enc, messages: list, agp: bool, tools, full: str) -> Optional[list]:
    """[(the text before reply k, the text up to its end)] for each assistant message, both prefixes
    of ``full``: the replies' spans as a row without media gets them (`mmpipe.encoding.spans`: the
    template's ``{% generation %}`` blocks, else markers, else prefixes), so a row's labels do not
    depend on whether it holds images. None where those spans are not one per assistant message
    in ``full`` itself (stop tokens appended, empty replies without a span, no way applies)."""
    from mmpipe.errors import InputError

    try:
        text, spans, _ = enc.reply_spans(messages, full, "", tools, agp)
    except InputError:  # no way locates the replies: the renders below
        return None
    if text != full or len(spans) != sum(1 for m in messages if m["role"] == "assistant"):
        return None
    return [(full[:a], full[:b]) for a, b in spans]


def _rendered_edges(enc, messages: list, k: int, tools) -> tuple[str, str]:
    """(the conversation before reply ``k`` with the generation prompt, up to its end with trailing
    newlines and spaces dropped): reply ``k``'s edges where its span is not known."""
    before = enc.render(messages[:k], True, tools) if k else ""
    return before, enc.render(messages[: k + 1], False, tools).rstrip("\n ")


def tail_cuts(enc, ids: np.ndarray, full: str, edges: list, media: tuple = ((), ()),
              segment_ids_of: Optional[Callable] = None) -> dict:
    """{prefix: where it ends in ``ids``, or None} for ``edges`` [(a prefix of ``full``, (images,
    clips) before it)], found from the end: the tokens before a known cut must end with the text
    between the two, tokenized alone (the processor on it with its own media, ``segment_ids_of``,
    where it holds any). Each piece once: linear in the turns, each image processed once; `suffix_cut`
    (each rest whole, quadratic) where a text-only rest does not match; a processor whose pieces
    differ from its whole call is asked no more (the prefixes' calls, `call_labels`)."""
    images, audios = media
    out, at, cut, after = {}, len(full), len(ids), (len(images), len(audios))  # the last known cut
    for prefix, held in sorted(set(edges), key=lambda e: len(e[0]), reverse=True):
        found, text, seg = None, full[len(prefix):at], None
        if full.startswith(prefix) and held == after:
            seg = enc.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        elif full.startswith(prefix) and text and segment_ids_of is not None:
            seg = segment_ids_of(enc, text, images[held[0]:after[0]], audios[held[1]:after[1]])
        if seg is not None:
            seg = np.asarray(seg, np.int64)
            found = cut - len(seg) if len(seg) <= cut and np.array_equal(ids[cut - len(seg):cut], seg) else None
        if found is None and held != after:  # refused or unlike the whole call: each image once at most
            segment_ids_of = None
        if found is None and held == (len(images), len(audios)):
            found = suffix_cut(enc, ids, full, prefix)
        out[prefix] = found
        if found is not None:
            at, cut, after = len(prefix), found, held
    return out


def suffix_cut(enc, ids: np.ndarray, full: str, prefix: str) -> Optional[int]:
    """Where ``prefix`` ends in ``ids`` (the tokens of ``full``): ``len(ids)`` minus the
    tokens of ``full[len(prefix):]`` tokenized alone, when ``ids`` ends with them; else None."""
    if not full.startswith(prefix):
        return None
    rest = full[len(prefix):]
    if not rest:
        return len(ids)
    rest_ids = np.asarray(enc.tokenizer(rest, add_special_tokens=False)["input_ids"], np.int64)
    n = len(rest_ids)
    return len(ids) - n if n <= len(ids) and np.array_equal(ids[len(ids) - n:], rest_ids) else None
