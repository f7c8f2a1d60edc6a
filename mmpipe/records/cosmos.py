"""`CosmosRow`: an encoded row (`MultiModalInputs`) that cosmos-rl's trainers can also read as
their per-sample record: what `mmpipe.rollout.packers`' ``get_policy_input`` and
``sft_process_sample`` return.

Not a stored record: no column of its own (Arrow, collate and unbatch see the `MultiModalInputs`
fields); the per-sample ``logprob_masks`` it adds is derived from the labels until cosmos-rl
assigns it.
"""

from __future__ import annotations

import numpy as np

from mmpipe.errors import ArgumentError
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.row import MultiModalInputs

__all__ = ["CosmosRow", "TokenIds"]


class TokenIds(np.ndarray):
    """A CosmosRow's ``input_ids``: the row's int64 [L] array (a view, no copy) that compares with
    a list or tuple AS A WHOLE (one bool, as two lists compare), and elementwise with anything
    else, as any array does. cosmos-rl 0.4.7's distillation teacher
    (``TorchEngine.map_student_text_to_tokenizer_student_token_ids_and_check``) asserts
    ``mapped_student_ids == sample.input_ids`` with the left side a list; on a bare array that
    ``assert`` raises "The truth value of an array ... is ambiguous"."""

    def __eq__(self, other):
        if isinstance(other, (list, tuple)):
            return self.ndim == 1 and self.tolist() == list(other)
        return super().__eq__(other)

    def __ne__(self, other):
        if isinstance(other, (list, tuple)):
            return not self.__eq__(other)
        return super().__ne__(other)

    __hash__ = None


def _logit_mask(labels, n: int) -> list[int]:
    """One row's label mask at logit positions as cosmos-rl's per-sample ``logprob_masks``:
    a list of n ints, 1 at t when ``labels[t + 1]`` is a target, last 0."""
    if labels is None:
        return [0] * n
    target = (np.asarray(labels) != IGNORE_INDEX).astype(np.int64)
    return target[1:].tolist() + [0] if n else []


class CosmosRow(MultiModalInputs):
    """What `get_policy_input` and `sft_process_sample` return: the `MultiModalInputs` row (every
    field and method of it) that also reads as the per-sample record cosmos-rl's trainer reads.

    cosmos-rl 0.4.7 reads a processed sample ``sample.logprob_masks`` when it has the attribute,
    else ``sample["logprob_masks"]`` (GRPO with ``use_rollout_logprobs_for_loss``; distillation
    with ``include_prompt`` REPLACES it with all ones but the last, and the packer's collate must
    follow), its reference engine reads ``input_ids`` the same way, and its SFT load balancer
    reads ``"input_ids" in sample`` / ``sample["input_ids"]``. So:

    - ``logprob_masks``: list of L ints at logit positions (1 at t when the logits at t predict a
      target token; last 0), built from the labels; assignable (attribute or item), and the one
      `DataPackerCore.policy_collate_fn` puts in the batch;
    - ``sample[key]`` for ``key in sample.keys()`` (``input_ids`` and ``label_ids`` as lists of
      ints, ``logprob_masks``); ``sample.input_ids`` stays the int64 array of the row, as a
      `TokenIds` view: ``ids_list == sample.input_ids`` is one bool (the distillation teacher's
      check of the student's mapped ids), elementwise comparisons stay elementwise.
    """

    COSMOS_KEYS = ("input_ids", "logprob_masks", "label_ids")

    @classmethod
    def of(cls, row: MultiModalInputs) -> "CosmosRow":
        """``row`` (a `MultiModalInputs`) as a CosmosRow sharing its arrays."""
        from dataclasses import fields

        return cls(**{f.name: getattr(row, f.name) for f in fields(MultiModalInputs)})

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.input_ids, np.ndarray) and not isinstance(self.input_ids, TokenIds):
            self.input_ids = self.input_ids.view(TokenIds)

    @property
    def logprob_masks(self) -> list:
        masks = self.__dict__.get("_logprob_masks")
        if masks is None:  # built once and kept: cosmos-rl edits the list in place
            masks = self.__dict__["_logprob_masks"] = _logit_mask(self.labels, self.num_tokens)
        return masks

    @logprob_masks.setter
    def logprob_masks(self, value) -> None:
        value = [int(bool(v)) for v in value]
        if len(value) != self.num_tokens:
            raise ArgumentError(
                f"logprob_masks: expected one value per token ({self.num_tokens}), found {len(value)}; "
                "fix: give a mask as long as the sample's input_ids (cosmos-rl: [1] * len(old mask))"
            )
        self.__dict__["_logprob_masks"] = value

    def keys(self) -> tuple:
        return self.COSMOS_KEYS if self.labels is not None else self.COSMOS_KEYS[:2]

    def __contains__(self, key) -> bool:
        return key in self.keys()

    def __getitem__(self, key: str):
        if key not in self.keys():
            raise KeyError(f"{key!r}: a CosmosRow reads as {list(self.keys())} (the record's fields are attributes)")
        if key == "logprob_masks":
            return self.logprob_masks
        if key == "label_ids":
            return np.asarray(self.labels).tolist()
        return np.asarray(self.input_ids).tolist()

    def __setitem__(self, key: str, value) -> None:
        if key != "logprob_masks":
            raise KeyError(f"{key!r}: only 'logprob_masks' of a CosmosRow can be set (cosmos-rl's distillation does)")
        self.logprob_masks = value

    def get(self, key: str, default=None):
        return self[key] if key in self.keys() else default

    def items(self):
        return [(k, self[k]) for k in self.keys()]
