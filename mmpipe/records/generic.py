"""Records of the generic path (`mmpipe.encoding.generic`): rows and batches of a processor
mmpipe has no family table for, holding whatever that processor returns.

A row keeps each processor output as the processor gave it for a batch of one:

- sequence keys (``input_ids``, ``attention_mask`` and e.g. ``token_type_ids``,
  ``mm_token_type_ids``): int64 ``[L]``;
- row keys (`GenericInputs.row_keys`): axis 0 is the row, e.g. Idefics3 ``pixel_values``
  float32 ``[1, tiles, 3, H, W]`` and ``pixel_attention_mask`` bool ``[1, tiles, H, W]``;
- item keys (the other vision keys): axis 0 counts images or patches, e.g. Gemma 3
  ``pixel_values`` float32 ``[I, 3, H, W]``, LLaVA-OneVision ``image_sizes`` int64 ``[I, 2]``,
  GLM-4.1V ``pixel_values`` float32 ``[N, 1176]`` with ``image_grid_thw`` ``[I, 3]``.

Positions are 1-D (``0..L-1`` per row); families whose model needs other positions (M-RoPE)
are not handled here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from mmpipe.errors import InputError

__all__ = ["GenericInputs", "GenericBatch"]


@dataclass(eq=False)
class GenericInputs:
    """One row encoded by a processor's own chat template and call.

    Attributes (L tokens):
        input_ids:       int64 [L], placeholders expanded by the processor.
        attention_mask:  int64 [L] (all ones).
        sequence:        other int64 [L] outputs by name (``token_type_ids``, ...).
        vision:          the other outputs by name, numpy, the processor's dtypes (float32
                         pixels); shapes as in the module doc.
        row_keys:        names in ``vision`` whose axis 0 is the row (length 1 here).
        processor_class: the processor's transformers class name.
        labels:          optional int64 [L], -100 where not trained.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    processor_class: str
    sequence: dict[str, np.ndarray] = field(default_factory=dict)
    vision: dict[str, np.ndarray] = field(default_factory=dict)
    row_keys: tuple[str, ...] = ()
    labels: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def position_ids(self) -> np.ndarray:
        """int64 [L]: ``0..L-1``."""
        return np.arange(len(self.input_ids), dtype=np.int64)

    def validate(self, row=None) -> "GenericInputs":
        """Checks the lengths of the sequence keys and the leading axis of the row keys."""
        n = len(self.input_ids)
        for name, arr in [("attention_mask", self.attention_mask), ("labels", self.labels), *self.sequence.items()]:
            if arr is not None and arr.shape != (n,):
                raise InputError(f"{name} does not line up with input_ids", row=row, column=name, stage="encode",
                                 expected=f"shape ({n},)", found=f"shape {arr.shape}",
                                 fix="pass the processor outputs of this very row")
        for name in self.row_keys:
            if name in self.vision and self.vision[name].shape[:1] != (1,):
                raise InputError(f"{name} is a per-row output but holds {self.vision[name].shape[0]} rows", row=row,
                                 column=name, stage="encode", expected="axis 0 of length 1",
                                 found=f"shape {self.vision[name].shape}", fix="encode one row per processor call")
        return self

    def equals(self, other: "GenericInputs") -> bool:
        """Same keys, shapes, dtypes and values (NaN-free data)."""
        def same(a, b):
            return (a is None) == (b is None) and (a is None or (a.shape == b.shape and a.dtype == b.dtype
                                                                 and np.array_equal(a, b)))

        return (self.processor_class == other.processor_class and set(self.row_keys) == set(other.row_keys)
                and same(self.input_ids, other.input_ids) and same(self.attention_mask, other.attention_mask)
                and same(self.labels, other.labels)
                and all(d1.keys() == d2.keys() and all(same(d1[k], d2[k]) for k in d1)
                        for d1, d2 in ((self.sequence, other.sequence), (self.vision, other.vision))))


@dataclass(eq=False)
class GenericBatch:
    """A padded batch of `GenericInputs` (B rows, L the longest).

    Attributes:
        input_ids, attention_mask, position_ids: int64 [B, L] (pads: the pad id, 0, 0).
        sequence:  int64 [B, L] per sequence key (pads 0).
        vision:    per vision key: row keys [B, max..., ...] (missing rows and padding zero,
                   as the processor pads a batch), item keys concatenated on axis 0 with
                   trailing axes zero-padded to the largest.
        labels:    int64 [B, L] (pads -100) or None.
        lengths:   int64 [B] tokens per row; shapes: each row's own shape per vision key
                   (None where the row lacks it), what `unbatch_generic` cuts back to.
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    processor_class: str
    padding_side: str
    lengths: np.ndarray
    sequence: dict[str, np.ndarray] = field(default_factory=dict)
    vision: dict[str, np.ndarray] = field(default_factory=dict)
    row_keys: tuple[str, ...] = ()
    shapes: dict[str, list] = field(default_factory=dict)
    labels: Optional[np.ndarray] = None

    def model_inputs(self) -> dict:
        """torch tensors for ``model(**batch.model_inputs())``: ids, mask, ``position_ids``
        [B, L], the sequence keys and every vision key."""
        import torch

        out = {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "position_ids": self.position_ids,
               **self.sequence, **self.vision}
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}
