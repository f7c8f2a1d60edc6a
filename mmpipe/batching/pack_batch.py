"""A batch's fields and its rows' tokens end to end -> one padding-free pack
(`PackedMultiModalInputs`), for every family whose model takes packed rows (the others are
refused with the reason, `refuse_packing`): the budgets and holes checked, positions
restarting per row, labels with -100 on each row's first token (see `mmpipe.batching.packing`
for why), the rest of the batch kept in ``meta``."""

from __future__ import annotations

from typing import Optional

from mmpipe.batching.token_counts import count_arg
from mmpipe.errors import ArgumentError, InputError, PackingUnsupportedError
from mmpipe.families import ModelFamily, get_family
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.packed import PackedMultiModalInputs


def refuse_packing(who: str, fam: ModelFamily, processor_class: Optional[str] = None) -> None:
    """Raise `PackingUnsupportedError` (an `ArgumentError`) with the family's ``no_packing`` reason
    when its model's attention does not allow packed rows (Gemma 3's bidirectional image
    attention; the generic path, named by ``processor_class``: whether an unlisted model allows
    them is unknown). What the model's own layers allow is checked apart, when the model is
    given (`mmpipe.batching.attention_layers.check_packing`)."""
    if fam.no_packing is not None:
        raise PackingUnsupportedError(
            f"{who}: packing is not available for {processor_class or fam.name}: {fam.no_packing}; "
            f"use mmpipe.Collator(processor) for padded batches", model_type=fam.name)


def pack_budgets(who: str, max_tokens, max_images, oversize: str = "raise") -> tuple[Optional[int], Optional[int]]:
    """``(max_tokens, max_images)`` checked when a packer is built: integers >= 1 / >= 0 or None,
    ``oversize`` one of ``("raise", "alone")`` (`ArgumentError` naming the argument otherwise,
    instead of every batch failing as over a budget of 0 or -5)."""
    if oversize not in ("raise", "alone"):
        raise ArgumentError(f"{who}: oversize must be 'raise' or 'alone', got {oversize!r}")
    return count_arg(who, "max_tokens", max_tokens, 1, example=16384), count_arg(who, "max_images", max_images, 0)


def pack_batch(meta: BatchedMultiModalInputs, flat: dict, max_tokens: Optional[int] = None,
               max_images: Optional[int] = None, oversize: str = "raise") -> PackedMultiModalInputs:
    """A batch's fields and its rows' tokens end to end (`mmpipe.batching.collate.collate_packed`:
    ``meta`` with zero-width token fields, ``flat`` the [T] token arrays; no [B, L] padded array
    is built, so memory is the sum of the row lengths, not rows x the longest) -> the pack:
    budgets and holes checked (`_check_pack`; ``oversize="alone"``: a pack of ONE row may be over
    them, as `TokenBudgetBatchSampler(oversize="alone")` hands such a row out alone), positions
    restarting per row (`_packed_positions`), labels -100 on each row's first token
    (`_packed_labels`), ``meta`` kept."""
    import torch

    lengths = meta.seq_lengths
    n = meta.batch_size
    if oversize == "alone" and n == 1:
        max_tokens = max_images = None
    _check_pack(meta, flat["attention_mask"], max_tokens, max_images)
    cu = torch.zeros(n + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    labels, first_labels = _packed_labels(flat["labels"], cu[:-1].long())
    return PackedMultiModalInputs(
        input_ids=torch.from_numpy(flat["input_ids"])[None],
        mm_token_type_ids=torch.from_numpy(flat["mm_token_type_ids"])[None],
        position_ids=_packed_positions(meta, flat), cu_seqlens=cu, labels=labels, first_labels=first_labels, meta=meta,
    )


# a row over a budget on its own: what a sampler with oversize="alone" hands out
_ALONE = ("; this row is over the budget on its own: if the sampler hands such rows out alone "
          "(TokenBudgetBatchSampler(oversize='alone')), build the packer with oversize='alone' too, "
          "or drop or truncate the row at encode time")


def _check_pack(b: BatchedMultiModalInputs, mask, max_tokens: Optional[int], max_images: Optional[int]) -> None:
    """The batch fits the pack budgets and every row is unpadded (``mask``: the rows'
    attention masks end to end, int [T])."""
    import numpy as np

    lengths = b.seq_lengths
    n, total = b.batch_size, int(lengths.sum())
    if max_tokens is not None and total > max_tokens:
        raise InputError(
            f"the {n} rows hold {total} tokens (lengths {lengths.tolist()}), over the pack budget "
            f"max_tokens={max_tokens}", where="", column="input_ids", stage="collate",
            expected=f"at most {max_tokens} tokens", found=f"{total} tokens",
            fix=f"build batches with TokenBudgetBatchSampler(cost='packed', max_tokens={max_tokens}) or raise "
                "max_tokens" + _ALONE * (n == 1),
        )
    n_img = int(b.image_offsets[-1])
    if max_images is not None and n_img > max_images:
        raise InputError(
            f"the {n} rows hold {n_img} images (per row {[len(x) for x in b.sample_to_image_indices]}), over the "
            f"pack budget max_images={max_images}", where="", column=b.fam.media.IMAGE_LAYOUT_COLUMN, stage="collate",
            expected=f"at most {max_images} images", found=f"{n_img} images",
            fix=f"build batches with TokenBudgetBatchSampler(max_images={max_images})" + _ALONE * (n == 1),
        )
    zeros = np.concatenate([[0], np.cumsum(np.asarray(mask) == 0)])
    ends = np.cumsum(np.asarray(lengths))
    holes = zeros[ends] - zeros[ends - np.asarray(lengths)]  # [n] zeros in each row
    if holes.any():
        r = int(np.flatnonzero(holes)[0])
        raise InputError(
            f"attention_mask has {int(holes[r])} zero(s) inside the row; packing attends every token of a "
            "row, so the row must be unpadded (attention_mask all ones)", row=r, column="attention_mask",
            stage="collate", expected="attention_mask all ones", found=f"{int(holes[r])} zero(s)",
            fix="strip the masked tokens",
        )


def _packed_positions(b: BatchedMultiModalInputs, flat: dict):
    """int64 [4, 1, T]: text positions restarting at 0 per row, then the rows' M-RoPE rows;
    int64 [1, T] (text positions only) for a text-only family."""
    import torch

    text_pos = torch.from_numpy(flat["text_positions"])
    if flat["position_ids"].ndim == 2 and get_family(b.family).is_vision:
        mrope = torch.from_numpy(flat["position_ids"])  # [3, T]
        return torch.cat([text_pos[None], mrope], 0)[:, None, :]  # [4, 1, T]
    return text_pos[None]  # [1, T]


def _packed_labels(flat_labels, starts):
    """``(labels int64 [1, T] with -100 on each row's first token, first_labels int64 [n])``,
    or ``(None, None)`` without labels (``flat_labels``: int64 [T] or None; ``starts``: int64
    [n] each row's first token)."""
    import torch

    if flat_labels is None:
        return None, None
    labels = torch.from_numpy(flat_labels)[None].clone()
    first_labels = labels[0, starts].clone()
    labels[0, starts] = IGNORE_INDEX
    return labels, first_labels
