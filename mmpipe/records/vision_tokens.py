"""THE one check for vision special tokens where they do not belong (a sampled response).

A VL model sampled at temperature 1.0 emits ``<|image_pad|>``, ``<|video_pad|>``,
``<|vision_start|>`` and ``<|vision_end|>`` inside its responses. Fed back as text, a pad is
read as an image slot with no image ("Image features and image tokens do not match") and a
start/end token as the border of a block that is not there. Two defences, one table:

- at sampling, the engines ban the ids (`VisionTokens.ids`) unless
  ``SamplingParams(allow_vision_tokens=True)`` (`mmpipe.rollout.transformers_engine`,
  `mmpipe.rollout.vllm_engine`);
- every stage that turns a response into training input runs `VisionTokens.apply` (or
  `VisionTokens.find` on a whole row): ``RolloutSample.to_row``, the data packers'
  ``get_policy_input``, multi-turn appends, ReMA role encodings, and collate/pack.

Policies (``on_vision_token=``): ``"raise"`` (default) refuses with a `PlaceholderError`
naming the row, the response position, the token and the fix; ``"mask"`` replaces each stray
vision token by `VisionTokens.replacement_id` (the tokenizer's pad id, else its EOS id) with
label -100, so no vision token reaches the model and the loss ignores the position. Later
tokens were sampled after the vision token, so their rollout logprobs no longer equal a
forward over the masked row: prefer the engines' ban; "mask" is for responses made elsewhere.

Which tokens count is the family's media strategy's answer (``fam.media.vision_tokens(fam, processor)``,
`mmpipe.media`): the pads and block borders of the patch grids, the feature token (and Gemma 3's
``<start_of_image>``) of the tiles, on the generic path the media tokens its processor names. A value object of ids: it lives
with the records, so `RolloutSample.to_row` needs no stage module.

    >>> vt = VisionTokens(ids=(5, 7), names=("<|image_pad|>", "<|vision_start|>"),
    ...                   kinds=("image pad", "vision start"), pad_ids=(5,), replacement_id=0)
    >>> vt.find(np.array([1, 5, 2])).tolist()
    [1]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

from mmpipe.errors import ArgumentError, PlaceholderError
from mmpipe.families import ModelFamily, family_of, get_family
from mmpipe.records.columns import IGNORE_INDEX

VISION_TOKEN_POLICIES = ("raise", "mask")
_KINDS = ("image", "video", "vision_start", "vision_end", "audio", "audio_start", "audio_end")
_KIND_NAMES = {"image": "image pad", "video": "video pad", "vision_start": "vision start", "vision_end": "vision end",
               "audio": "audio pad", "audio_start": "audio start", "audio_end": "audio end"}


def check_policy(policy: str) -> str:
    """``policy`` if it is one of `VISION_TOKEN_POLICIES`, else `ArgumentError`."""
    if policy not in VISION_TOKEN_POLICIES:
        raise ArgumentError(f"on_vision_token must be one of {VISION_TOKEN_POLICIES}, got {policy!r}")
    return policy


# the media tokens a processor (or its tokenizer) names itself, by kind: its attribute names
_NAMED = {"image": ("image_token",), "video": ("video_token",), "audio": ("audio_token",),
          "vision_start": ("vision_bos_token", "vision_start_token", "boi_token", "image_start_token"),
          "vision_end": ("vision_eos_token", "vision_end_token", "eoi_token", "image_end_token"),
          "audio_start": ("audio_bos_token", "boa_token", "audio_start_token"),
          "audio_end": ("audio_eos_token", "eoa_token", "audio_end_token")}


def named_tokens(processor: Any = None) -> dict[str, str]:
    """kind -> the media token ``processor`` (or its tokenizer) names itself (``image_token``,
    ``audio_token``, ``vision_bos_token``, ``boa_token``...: `_NAMED`); {} without a processor or
    names. Any processor: what a processor without a family table tells of its tokens."""
    out: dict[str, str] = {}
    for kind, names in _NAMED.items():
        for owner in (processor, getattr(processor, "tokenizer", None)):
            found = next((getattr(owner, n, None) for n in names if isinstance(getattr(owner, n, None), str)), None)
            if found:
                out[kind] = found
                break
    return out


def _spellings(fam: ModelFamily, processor: Any = None) -> dict[str, str]:
    """kind ("image", "video", "vision_start", "vision_end", "audio", "audio_start", "audio_end")
    -> the family's spelling of it, for the kinds the family has (its media strategy's table; the
    generic path's: the tokens ``processor`` names)."""
    return {k: t for k, t in fam.media.vision_tokens(fam, processor).items() if t is not None}


@dataclass(frozen=True)
class VisionTokens:
    """A family's vision special tokens in one tokenizer, and what to do with a stray one.

    Attributes:
        ids: int ids of the family's vision tokens present in the tokenizer (image pad, video
            pad, vision start, vision end; empty for a text-only family).
        names: their spellings, aligned with ``ids``.
        kinds: what each is ("image pad", "video pad", "vision start", "vision end"), aligned.
        pad_ids: the ids that mark a vision slot (image / video pad), a subset of ``ids``.
        policy: ``"raise"`` or ``"mask"`` (`VISION_TOKEN_POLICIES`).
        replacement_id: what ``"mask"`` puts in place of a vision token (None: unknown, so
            "mask" is refused).

    Picklable (tuples and ints), so collators holding one ship to DataLoader workers.
    """

    ids: tuple[int, ...] = ()
    names: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()
    pad_ids: tuple[int, ...] = ()
    policy: str = "raise"
    replacement_id: Optional[int] = None

    # ---- construction --------------------------------------------------------------------
    @classmethod
    def from_processor(cls, processor, *, family: Any = None, policy: str = "raise") -> "VisionTokens":
        """The tokens of ``processor`` (a processor or tokenizer); ``family`` overrides the
        family found from it. The replacement id is the tokenizer's pad id, else its EOS id."""
        fam = family_of(family if family is not None else processor)
        tok = getattr(processor, "tokenizer", processor)
        spell = _spellings(fam, processor)
        found = {k: tok.convert_tokens_to_ids(t) for k, t in spell.items()}
        unk = getattr(tok, "unk_token_id", None)
        kinds = [k for k in _KINDS if found.get(k) is not None and found[k] != unk]
        rep = getattr(tok, "pad_token_id", None)
        rep = getattr(tok, "eos_token_id", None) if rep is None else rep
        return cls(ids=tuple(int(found[k]) for k in kinds), names=tuple(str(spell[k]) for k in kinds),
                   kinds=tuple(_KIND_NAMES[k] for k in kinds),
                   pad_ids=tuple(int(found[k]) for k in kinds if k in ("image", "video", "audio")),
                   policy=check_policy(policy), replacement_id=None if rep is None else int(rep))

    @classmethod
    def from_rows(cls, rows, *, policy: str = "raise") -> "VisionTokens":
        """The tokens the rows themselves show, for stages without a tokenizer: the ids at
        image / video positions (``mm_token_type_ids`` 1 / 2) are the pads; the token right
        before / after every block is the vision start / end when the family has one (its
        table spells it), it is the same everywhere and never shows up elsewhere in the rows.
        Rows without images show nothing (an empty set: nothing is checked)."""
        seen: dict[str, set] = {k: set() for k in _KINDS}
        elsewhere: set = set()  # ids at text positions that border no block
        fam = None
        for r in rows:
            ids, mm = np.asarray(r.input_ids), np.asarray(r.mm_token_type_ids)
            if not (mm != 0).any():
                continue
            fam = fam or get_family(r.family)
            seen["image"].update(np.unique(ids[mm == 1]).tolist())
            seen["video"].update(np.unique(ids[mm == 2]).tolist())
            edge = np.diff(np.concatenate([[0], (mm != 0).astype(np.int8), [0]]))
            starts, ends = np.flatnonzero(edge == 1), np.flatnonzero(edge == -1)
            seen["vision_start"].update(ids[starts[starts > 0] - 1].tolist())
            seen["vision_end"].update(ids[ends[ends < len(ids)]].tolist())
            border = np.zeros(len(ids), bool)
            border[starts[starts > 0] - 1] = True
            border[ends[ends < len(ids)]] = True
            elsewhere.update(np.unique(ids[(mm == 0) & ~border]).tolist())
        if fam is None:
            return cls(policy=check_policy(policy))
        spell = _spellings(fam)
        # only the kinds the family has: in one without a vision end (LLaVA-OneVision) the token after every
        # block is plain text, which a response may hold
        kinds = [k for k in _KINDS if k in spell and len(seen[k]) == 1
                 and (k in ("image", "video") or not seen[k] & elsewhere)]
        ids = tuple(int(next(iter(seen[k]))) for k in kinds)
        return cls(ids=ids, names=tuple(str(spell.get(k) or "?") for k in kinds), kinds=tuple(_KIND_NAMES[k] for k in kinds),
                   pad_ids=tuple(i for k, i in zip(kinds, ids) if k in ("image", "video")), policy=check_policy(policy))

    def with_policy(self, policy: Optional[str]) -> "VisionTokens":
        """The same tokens under another policy (None: unchanged)."""
        return self if policy is None or policy == self.policy else replace(self, policy=check_policy(policy))

    # ---- finding -------------------------------------------------------------------------
    def find(self, ids, mm_token_type_ids=None, *, pads_only: bool = False) -> np.ndarray:
        """Positions int64 [K] of stray vision tokens in ``ids`` int [L].

        Without ``mm_token_type_ids`` (a response: every token is text) every vision token is
        stray. With it (a whole row, int [L]) a pad is stray where the type says text, and a
        vision start / end is stray unless it borders a vision block; ``pads_only`` checks
        the pads alone."""
        ids = np.asarray(ids)
        if not self.ids or not ids.size:
            return np.zeros(0, np.int64)
        if mm_token_type_ids is None:
            return np.flatnonzero(np.isin(ids, self.ids if not pads_only else self.pad_ids))
        text = np.asarray(mm_token_type_ids) == 0
        bad = np.isin(ids, self.pad_ids) & text
        if not pads_only:
            vision = ~text
            before = np.concatenate([vision[1:], [False]])  # a block starts right after
            after = np.concatenate([[False], vision[:-1]])  # a block ends right before
            edges = np.isin(ids, [i for i in self.ids if i not in self.pad_ids])
            bad |= edges & text & ~(before | after)
        return np.flatnonzero(bad)

    def name(self, token_id: int) -> str:
        """The spelling of a vision token id."""
        return self.names[self.ids.index(int(token_id))] if int(token_id) in self.ids else str(token_id)

    # ---- the policy ----------------------------------------------------------------------
    def refuse(self, ids, bad: np.ndarray, *, where: str, row: Optional[int], offset: Optional[int] = 0,
               stage: str = "rollout", what: str = "the response") -> None:
        """Raise the `PlaceholderError` for stray tokens at ``bad`` (positions in ``ids``; ``ids``
        is a response starting at token ``offset`` of its row, or the row itself: None)."""
        ids = np.asarray(ids)
        k = int(bad[0])
        tid = int(ids[k])
        name, kind = self.name(tid), self.kinds[self.ids.index(tid)]
        n_same = int((ids[bad] == tid).sum())
        at = f"position {k} of the row" if offset is None else f"response position {k} (token {offset + k} of the row)"
        raise PlaceholderError(
            f"{what} holds {n_same} {kind} token(s) ({name}, id {tid}), the first at {at}; "
            f"{len(bad)} vision token(s) in all. A vision token outside an image "
            "block is read as an image slot or block border with no image ('Image features and image tokens do "
            "not match')", where=where, row=row, column="input_ids", stage=stage,
            expected="vision tokens only inside image blocks", found=f"{len(bad)} outside, the first {name} at {at}",
            fix="keep the engines' default ban (SamplingParams(allow_vision_tokens=False)), or replace them with "
                "on_vision_token='mask' (unbatch_rollout / DataPacker), which puts the pad id there with label -100",
        )

    def apply(self, ids, labels=None, *, where: str, row: Optional[int], offset: int = 0,
              stage: str = "rollout", what: str = "the response") -> tuple[np.ndarray, Optional[np.ndarray]]:
        """A response's ids int64 [R] (and its labels int64 [R], or None) under the policy.

        No stray vision token: returned as given. ``"raise"``: `refuse`. ``"mask"``: copies with
        each vision token replaced by `replacement_id`, its label -100 (labels None: ids only).
        ``offset``: where the response starts in its row (for the message)."""
        ids = np.asarray(ids)
        bad = self.find(ids)
        if not len(bad):
            return ids, labels
        if self.policy == "raise":
            self.refuse(ids, bad, where=where, row=row, offset=offset, stage=stage, what=what)
        if self.replacement_id is None:
            raise ArgumentError("on_vision_token='mask' needs a replacement id (the tokenizer's pad or EOS id): "
                                "build VisionTokens.from_processor(processor, policy='mask')")
        ids = ids.copy()
        ids[bad] = self.replacement_id
        if labels is not None:
            labels = np.array(labels, copy=True)
            labels[bad] = IGNORE_INDEX
        return ids, labels
