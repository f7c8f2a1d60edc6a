"""`PackedMultiModalInputs`: n rows of one family packed into one padding-free ``[1, T]``
sequence (the packing collator's output), whatever the family's kind. Positions: for the M-RoPE
families the batch layout of `mmpipe.records` with B = 1, i.e. ``[3, 1, T]``, plus verl's plain
text row in front: ``[4, 1, T]``; for 1-D families ``[1, T]``, restarting at 0 per row (how
transformers finds the packed rows when no attention mask is given).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from mmpipe._fork import torch_fork_safe
from mmpipe.errors import ArgumentError
from mmpipe.families import get_family
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.batch_arrow import packed_arrow_schema, packed_to_arrow
from mmpipe.records.columns import IGNORE_INDEX

if TYPE_CHECKING:  # records never import torch: the tensors are made by the packing collator
    import pyarrow as pa
    import torch


class PackedFacts:
    """What every packed record derives the same way from its ``input_ids`` [1, T],
    ``cu_seqlens`` [n+1], ``seq_lengths`` and ``meta`` (the padded batch of its rows)."""

    @property
    def num_rows(self) -> int:
        return int(self.cu_seqlens.shape[0]) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def max_seqlen(self) -> int:
        return int(self.seq_lengths.max()) if self.num_rows else 0

    @property
    def family(self) -> str:
        return self.meta.family

    @property
    def pixel_values(self):
        return self.meta.pixel_values


@dataclass(eq=False)
class PackedMultiModalInputs(PackedFacts):
    """n rows packed into one sequence of T tokens (torch tensors, no padding).

    Attributes (torch tensors; n rows, T = sum of their lengths, I images, N image patches):
        input_ids:          int64 [1, T]
        mm_token_type_ids:  int64 [1, T] 0 text, 1 image, 2 video
        position_ids:       int64 [4, 1, T]: row 0 the text positions restarting at 0 per row
                            (how transformers finds the packed rows), rows 1-3 the batch layout
                            [3, 1, T] of `mmpipe.records` (M-RoPE t, h, w). Text family and
                            the 1-D families (tiles kind): [1, T], restarting at 0 per row.
        cu_seqlens:         int32 [n+1] row k owns tokens cu_seqlens[k]:cu_seqlens[k+1]
        labels:             int64 [1, T] or None; -100 on every row's first token
        first_labels:       int64 [n] or None, each row's own label at its first token (for `unpack`)
        meta:               the rows' `BatchedMultiModalInputs` (pixels, grids, offsets, rope
                            deltas, lengths, pixel storage) with zero-width token tensors [n, 0].

    Shortcuts: ``pixel_values`` float32 [N, 3*T*p*p] or None, ``image_grid_thw`` int64 [I, 3],
    ``seq_lengths`` int64 [n], ``sequence_ids`` int64 [1, T] (the row of each token).
    """

    input_ids: torch.Tensor
    mm_token_type_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    labels: Optional[torch.Tensor]
    first_labels: Optional[torch.Tensor]
    meta: BatchedMultiModalInputs

    # ---- derived facts -----------------------------------------------------------------
    @property
    def seq_lengths(self) -> torch.Tensor:
        """int64 [n] the packed rows' lengths."""
        return self.meta.seq_lengths

    @property
    def image_grid_thw(self) -> torch.Tensor:
        return self.meta.image_grid_thw

    @property
    def num_images(self) -> int:
        return int(self.meta.image_offsets[-1])

    @property
    def sequence_ids(self) -> torch.Tensor:
        """int64 [1, T]: the packed row each token belongs to."""
        import torch

        return torch.repeat_interleave(torch.arange(self.num_rows), self.seq_lengths)[None]

    def model_inputs(self, device=None, *, labels: bool = True) -> dict[str, Any]:
        """The kwargs a transformers Qwen-VL (or text LLM) ``forward`` takes for this pack.

        No ``attention_mask`` (see the module docstring: the packed rows are found from
        ``position_ids`` row 0 only when the mask is None) and ``use_cache=False``. Pixel keys
        only when the pack holds images; ``labels`` only when it holds a target token. In a forked
        child torch runs on one thread first (`mmpipe._fork.torch_fork_safe`).
        """
        torch_fork_safe()
        dev = device if device is not None else self.input_ids.device
        m, fam = self.meta, get_family(self.meta.family)
        out: dict[str, Any] = {"input_ids": self.input_ids, "position_ids": self.position_ids}
        out.update(fam.media.pack_token_types(fam, self.mm_token_type_ids))
        out.update(m.vision_inputs(self.mm_token_type_ids))
        if labels and self.labels is not None and bool((self.labels != IGNORE_INDEX).any()):
            out["labels"] = self.labels
        out = {k: v.to(dev) for k, v in out.items()}
        out["use_cache"] = False
        return out

    def pin_memory(self) -> "PackedMultiModalInputs":
        """The same pack with its tensors (and ``meta``'s, `BatchedMultiModalInputs.pin_memory`) in
        pinned host memory: what ``DataLoader(pin_memory=True)`` calls (an object without this
        method is handed over unpinned, silently)."""
        import dataclasses

        import torch

        change = {f.name: v.pin_memory() for f in dataclasses.fields(self)
                  if f.name != "meta" and isinstance(v := getattr(self, f.name), torch.Tensor)}
        return dataclasses.replace(self, meta=self.meta.pin_memory(), **change)

    def split(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Per-row views of a packed ``[1, T, ...]`` or ``[T, ...]`` tensor, e.g. the logits:
        ``packed.split(out.logits)[k]`` is row k's ``[L_k, ...]``."""
        T = self.num_tokens
        if values.ndim >= 2 and values.shape[0] == 1 and values.shape[1] == T:
            values = values[0]
        if values.shape[0] != T:
            raise ArgumentError(f"split expects a [1, {T}, ...] or [{T}, ...] tensor (this pack's {T} tokens), "
                             f"found shape {tuple(values.shape)}")
        bounds = [int(x) for x in self.cu_seqlens]
        return [values[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def to_arrow(self) -> "pa.Table":
        """This pack as a one-row Arrow table with `arrow_schema` (for logging or shipping)."""
        return packed_to_arrow(self)

    @staticmethod
    def arrow_schema() -> "pa.Schema":
        """A pack of any family as one Arrow record: its [1, T] token columns, then its rows' batch
        (`mmpipe.records.batch_arrow`; dtypes as in torch)."""
        return packed_arrow_schema()

    def __repr__(self) -> str:
        return (
            f"PackedMultiModalInputs(family={self.family!r}, rows={self.num_rows}, tokens={self.num_tokens}, "
            f"lengths={self.seq_lengths.tolist()}, images={self.num_images}, pixels={self.meta.pixel_format})"
        )

