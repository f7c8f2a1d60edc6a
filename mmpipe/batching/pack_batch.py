"""One right-padded batch -> one padding-free pack (`PackedMultiModalInputs`), for every
family whose model takes packed rows (the others are refused with the reason,
`refuse_packing`): the budgets and holes checked, the valid tokens end to end, positions
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


def pack_batch(b: BatchedMultiModalInputs, max_tokens: Optional[int] = None,
               max_images: Optional[int] = None, oversize: str = "raise") -> PackedMultiModalInputs:
    """A right-padded batch of unpadded rows (of any family whose model takes packed rows) ->
    the pack of its rows: budgets and holes checked (`_check_pack`; ``oversize="alone"``: a pack
    of ONE row may be over them, as `TokenBudgetBatchSampler(oversize="alone")` hands such a row
    out alone), the valid tokens end to end (`_packed_positions`, `_packed_labels`), the rest
    kept in ``meta``."""
    import torch

    b = b.as_torch()
    lengths = b.seq_lengths
    n, L = b.batch_size, b.input_ids.shape[1]
    valid = torch.arange(L)[None, :] < lengths[:, None]  # [n, L], right padding
    if oversize == "alone" and n == 1:
        max_tokens = max_images = None
    _check_pack(b, valid, max_tokens, max_images)
    cu = torch.zeros(n + 1, dtype=torch.int32)
    cu[1:] = lengths.cumsum(0)
    labels, first_labels = _packed_labels(b, valid, cu[:-1].long())
    # the pack owns the tokens; `meta` keeps the rest with zero-width token tensors [n, 0]
    none = torch.zeros((n, 0), dtype=torch.int64)
    meta = BatchedMultiModalInputs(**{**b.__dict__, "input_ids": none, "attention_mask": none,
                                      "mm_token_type_ids": none, "labels": None,
                                      "position_ids": none if b.position_ids.ndim == 2
                                      else none[None].expand(b.position_ids.shape[0], n, 0)})
    return PackedMultiModalInputs(
        input_ids=b.input_ids[valid][None], mm_token_type_ids=b.mm_token_type_ids[valid][None],
        position_ids=_packed_positions(b, valid), cu_seqlens=cu, labels=labels, first_labels=first_labels, meta=meta,
    )


# a row over a budget on its own: what a sampler with oversize="alone" hands out
_ALONE = ("; this row is over the budget on its own: if the sampler hands such rows out alone "
          "(TokenBudgetBatchSampler(oversize='alone')), build the packer with oversize='alone' too, "
          "or drop or truncate the row at encode time")


def _check_pack(b: BatchedMultiModalInputs, valid, max_tokens: Optional[int], max_images: Optional[int]) -> None:
    """The batch fits the pack budgets and every row is unpadded (``valid``: bool [n, L])."""
    lengths = b.seq_lengths
    n, total = b.batch_size, int(lengths.sum())
    if max_tokens is not None and total > max_tokens:
        raise InputError(
            f"the {n} rows hold {total} tokens (lengths {lengths.tolist()}), over the pack budget "
            f"max_tokens={max_tokens}", where="", column="input_ids", stage="collate",
            fix=f"build batches with TokenBudgetBatchSampler(cost='packed', max_tokens={max_tokens}) or raise "
                "max_tokens" + _ALONE * (n == 1),
        )
    n_img = int(b.image_offsets[-1])
    if max_images is not None and n_img > max_images:
        raise InputError(
            f"the {n} rows hold {n_img} images (per row {[len(x) for x in b.sample_to_image_indices]}), over the "
            f"pack budget max_images={max_images}", where="", column=b.fam.media.IMAGE_LAYOUT_COLUMN, stage="collate",
            fix=f"build batches with TokenBudgetBatchSampler(max_images={max_images})" + _ALONE * (n == 1),
        )
    holes = (b.attention_mask == 0) & valid
    if bool(holes.any()):
        r = int(holes.any(1).nonzero()[0, 0])
        raise InputError(
            f"attention_mask has {int(holes[r].sum())} zero(s) inside the row; packing attends every token of a "
            "row, so the row must be unpadded (attention_mask all ones)", row=r, column="attention_mask",
            stage="collate", fix="strip the masked tokens",
        )


def _packed_positions(b: BatchedMultiModalInputs, valid):
    """int64 [4, 1, T]: text positions restarting at 0 per row, then the rows' M-RoPE rows;
    int64 [1, T] (text positions only) for a text-only family."""
    import torch

    n, L = valid.shape
    text_pos = (torch.arange(L)[None, :].expand(n, L))[valid]
    if b.position_ids.ndim == 3 and get_family(b.family).is_vision:
        mrope = b.position_ids[:, valid]  # [3, T]
        return torch.cat([text_pos[None], mrope], 0)[:, None, :]  # [4, 1, T]
    return text_pos[None]  # [1, T]


def _packed_labels(b: BatchedMultiModalInputs, valid, starts):
    """``(labels int64 [1, T] with -100 on each row's first token, first_labels int64 [n])``,
    or ``(None, None)`` without labels (``starts``: int64 [n] each row's first token)."""
    if b.labels is None:
        return None, None
    labels = b.labels[valid][None].clone()
    first_labels = labels[0, starts].clone()
    labels[0, starts] = IGNORE_INDEX
    return labels, first_labels
