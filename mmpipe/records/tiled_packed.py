"""`TiledPackedInputs`: n rows of a tiled family (`mmpipe.families.TiledFamily` whose
``no_packing`` is None: InternVL, LLaVA-OneVision) packed into one padding-free ``[1, T]``
sequence, the packing collator's output (`mmpipe.batching.tiled_packing`).

Positions are 1-D: ``position_ids`` int64 ``[1, T]`` restart at 0 at each row, which is how
transformers finds the packed rows when no attention mask is given (a block-diagonal causal
mask). The pixels are the padded batch's (`TiledBatch`), one image after another in row order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from mmpipe.errors import ArgumentError
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.packed import PackedFacts
from mmpipe.records.tiled import TiledBatch

if TYPE_CHECKING:  # records never import torch at module level
    import torch

__all__ = ["TiledPackedInputs"]


@dataclass(eq=False)
class TiledPackedInputs(PackedFacts):
    """n tiled-family rows packed into one sequence of T tokens (numpy arrays, no padding).

    Attributes (n rows, T = sum of their lengths):
        input_ids:          int64 [1, T]
        mm_token_type_ids:  int64 [1, T], 1 at the family's feature tokens
        position_ids:       int64 [1, T], ``0..L_k-1`` for row k (restarting at 0 per row)
        cu_seqlens:         int32 [n+1]: row k owns tokens cu_seqlens[k]:cu_seqlens[k+1]
        labels:             int64 [1, T] or None; -100 on every row's first token, so the
                            shifted loss never trains row k's last token on row k+1's first
        first_labels:       int64 [n] or None: each row's own label at its first token (for unpack)
        meta:               the rows' `TiledBatch` (pixels in the family's layout, ``image_hw``,
                            ``tiles_per_image``, ``images_per_row``, ``extras`` such as
                            ``image_sizes``, lengths) with zero-width token arrays [n, 0].

    Shortcuts: ``pixel_values`` (InternVL float32 [N, 3, S, S]; LLaVA-OneVision float32
    [I, max tiles, 3, S, S]) or None, ``seq_lengths`` int64 [n], ``sequence_ids`` int64 [1, T].
    """

    input_ids: np.ndarray
    mm_token_type_ids: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    labels: Optional[np.ndarray]
    first_labels: Optional[np.ndarray]
    meta: TiledBatch

    @property
    def seq_lengths(self) -> np.ndarray:
        """int64 [n] the packed rows' lengths."""
        return self.meta.lengths

    @property
    def num_images(self) -> int:
        return int(self.meta.tiles_per_image.shape[0])

    @property
    def sequence_ids(self) -> np.ndarray:
        """int64 [1, T]: the packed row each token belongs to."""
        return np.repeat(np.arange(self.num_rows, dtype=np.int64), self.seq_lengths)[None]

    def model_inputs(self, device=None, *, labels: bool = True) -> dict[str, Any]:
        """torch kwargs for ``model(**packed.model_inputs())``: ``input_ids``, ``position_ids``
        [1, T], the token types under the family's ``token_type_key`` (when it has one),
        ``pixel_values`` and the family's extra inputs (``image_sizes``) when the pack holds
        images with pixels, ``labels`` [1, T] when any token is labelled, ``use_cache=False``.

        No ``attention_mask`` on purpose: transformers looks for packed rows in
        ``position_ids`` only when the mask is None (an all-ones mask would let the rows attend
        to each other), and only without a cache.
        """
        import torch

        m, fam = self.meta, self.meta.family_table
        out = {"input_ids": self.input_ids, "position_ids": self.position_ids}
        if fam.token_type_key is not None:
            out[fam.token_type_key] = self.mm_token_type_ids
        if m.pixel_values is not None and self.num_images:
            out["pixel_values"] = m.pixel_values
            out.update(m.extras)
        if labels and self.labels is not None and bool((self.labels != IGNORE_INDEX).any()):
            out["labels"] = self.labels
        kw: dict[str, Any] = {k: torch.from_numpy(np.ascontiguousarray(v)).to(device) for k, v in out.items()}
        kw["use_cache"] = False
        return kw

    def split(self, values: "torch.Tensor") -> list:
        """Per-row views of a packed ``[1, T, ...]`` or ``[T, ...]`` tensor or array, e.g. the
        logits: ``packed.split(out.logits)[k]`` is row k's ``[L_k, ...]``."""
        T = self.num_tokens
        if values.ndim >= 2 and values.shape[0] == 1 and values.shape[1] == T:
            values = values[0]
        if values.shape[0] != T:
            raise ArgumentError(f"split expects a [1, {T}, ...] or [{T}, ...] tensor (this pack's {T} tokens), "
                                f"found shape {tuple(values.shape)}")
        bounds = [int(x) for x in self.cu_seqlens]
        return [values[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def __repr__(self) -> str:
        return (f"TiledPackedInputs(family={self.family!r}, rows={self.num_rows}, tokens={self.num_tokens}, "
                f"lengths={self.seq_lengths.tolist()}, images={self.num_images}, "
                f"pixels={'none' if self.meta.pixel_values is None else 'float32'})")
