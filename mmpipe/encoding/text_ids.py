"""Encode, text -> ids for the kinds that tokenize the rendered chat template themselves (the patch
grids, the tiled families; the generic path's processor tokenizes its own): the rendered
conversation tokenized with character offsets, labels from the assistant replies' spans
(`mmpipe.encoding.render.span_labels`).

- `rendered_ids`: the text as the template rendered it;
- `spliced_ids`: its placeholders first replaced by longer texts (`splice_text`; each run of a
  feature token in them maybe written once, `mmpipe.encoding.feature_runs`), tokenized in one
  call; `spliced_labels` moves the reply spans into the spliced text and gives every token of an
  inserted text -100.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from mmpipe.encoding.feature_runs import run_repeats
from mmpipe.encoding.placeholders import splice_text
from mmpipe.encoding.render import span_labels
from mmpipe.encoding.tokenize import tokenize_text
from mmpipe.records.columns import IGNORE_INDEX

__all__ = ["chat_special_tokens", "rendered_ids", "spliced_ids", "spliced_labels"]


def rendered_ids(enc, messages: list[dict], where: str, tools: Optional[list]) -> tuple:
    """Rendered messages -> (ids int64 [L], labels int64 [L] or None without ``enc.labels``; the
    family's vision tokens never labelled, `ChatTemplate.unlabel_vision`), the template's text as
    it is (one placeholder per image)."""
    text, spans = enc.text_and_replies(messages, tools, where)
    # memory (a 10 MB row): long texts are tokenized in verified pieces (encoding/tokenize.py)
    ids, offsets = tokenize_text(enc.tokenizer, text, bool(spans))
    return ids, (enc.unlabel_vision(ids, span_labels(ids, offsets, spans)) if enc.labels else None)


def spliced_ids(tokenizer, text: str, replies: list, olds: list, news: list, *, labels: bool, feature_id: int,
                runs: Optional[list] = None) -> tuple[np.ndarray, Optional[np.ndarray], int]:
    """``text`` with ``olds[k]`` replaced by ``news[k]`` (`splice_text`), tokenized in ONE call (special
    tokens as the processor's chat path adds them, `chat_special_tokens`) ->
    (ids int64 [L], labels int64 [L] or None without ``labels``, the ``feature_id`` tokens the ids
    hold). ``runs``: the lengths, in order, of the runs of the feature token that ``news`` write
    once (None: written out), each such id repeated to its run (`run_repeats`); ``replies``:
    [(start, end)] of the reply spans in ``text`` (`spliced_labels`)."""
    pieces, inserted, at = splice_text(text, olds, news)
    spliced = "".join(pieces)
    out = tokenizer(spliced, add_special_tokens=chat_special_tokens(tokenizer, spliced), return_offsets_mapping=labels)
    ids = np.asarray(out["input_ids"], np.int64)  # each collapsed run of feature tokens as one id
    repeat, found = run_repeats(ids, feature_id, runs)
    lab = None
    if labels:
        offsets = np.asarray(out["offset_mapping"], np.int64).reshape(-1, 2)
        lab = spliced_labels(ids, offsets, replies, inserted, at, [len(x) for x in olds])
    if repeat is not None:
        ids, lab = np.repeat(ids, repeat), None if lab is None else np.repeat(lab, repeat)
    return ids, lab, found


def chat_special_tokens(tokenizer, text: str) -> bool:
    """The ``add_special_tokens`` a processor's chat path tokenizes a rendered ``text`` with: False
    when the template wrote the tokenizer's BOS itself (Gemma 3's ``{{ bos_token }}``: its published
    tokenizer adds another one, which the chat path leaves out, as mmpipe does), else True (the
    tokenizer's own additions, as the chat path makes them). The processor's flat call on the text
    always adds them (a double BOS there)."""
    bos = getattr(tokenizer, "bos_token", None)
    return not (bos and text.startswith(str(bos)))


def spliced_labels(ids: np.ndarray, offsets: np.ndarray, replies: list, inserted: list, at: list,
                   old_lens: list) -> np.ndarray:
    """int64 [L]: ``ids`` of the tokens (character ``offsets`` int64 [L, 2] in the spliced text)
    overlapping a reply span (``replies``: [(start, end)] in the text before the splice, moved by
    the text inserted before them), -100 elsewhere and on every token of an inserted text.
    ``inserted``: [(start, end)] of each inserted text in the spliced text; ``at``: the start of
    each replaced placeholder (``old_lens`` characters each) in the text before (`splice_text`'s)."""
    grown = np.cumsum([0] + [(b - a) - n for (a, b), n in zip(inserted, old_lens)])  # text added before each one

    def moved(x: int) -> int:
        return x + int(grown[int(np.searchsorted(np.asarray(at), x, side="left"))]) if at else x

    labels = span_labels(ids, offsets, [(moved(a), moved(b)) for a, b in replies])
    starts, ends = offsets[:, 0], offsets[:, 1]
    for a, b in inserted:
        labels[(starts < b) & (ends > a)] = IGNORE_INDEX
    return labels
