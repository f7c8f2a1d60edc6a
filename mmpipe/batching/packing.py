"""Encoded rows -> ONE padding-free sequence (`PackedMultiModalInputs`), and back.

Padding-free packing puts the rows of a batch end to end in a single ``[1, T]`` sequence
(``T = sum of the row lengths``, no pad token) and tells the model where each row starts:

- ``position_ids`` int64 ``[4, 1, T]``: row 0 the plain text positions, restarting at 0 at
  each packed row; rows 1-3 each row's own stored M-RoPE positions (which restart at 0 too).
  This is the 4-row form verl feeds and transformers (5.x) Qwen-VL models accept: the model
  takes row 0 to find the sequence boundaries (``masking_utils.find_packed_sequence_indices``:
  a new sequence wherever the text position does not advance by 1) and builds a
  block-diagonal causal mask with sdpa/eager attention, or varlen boundaries with
  flash-attention; rows 1-3 rotate the queries and keys.
- ``cu_seqlens`` int32 ``[n+1]``: cumulative row lengths, for varlen kernels and for slicing.
- ``labels`` int64 ``[1, T]``: the rows' labels with -100 on each row's FIRST token.
  transformers shifts labels inside the loss (logits at t predict labels[t+1]), so without
  that the last token of row i would be trained to predict the first token of row i+1.
  With it, the packed loss is the token mean of exactly the per-row targets (the padded
  batch's loss); each row's first label is kept in ``first_labels`` so `unpack` is exact.

Rows are never split and an image never straddles rows: a row's image blocks stay inside
its own span, and its pixels are concatenated in row order (what the vision tower and the
``<|image_pad|>`` scatter expect). Pixel assembly is `mmpipe.collate`'s (uint8 -> float32
rebuilt bit for bit, grids concatenated), so a packed batch feeds the model the same
``pixel_values`` / ``image_grid_thw`` as a padded batch of the same rows.

The 1-D families (InternVL, LLaVA-OneVision) pack the same way with ``position_ids`` int64
``[1, T]`` (``0..L_k-1`` per row k) and the padded batch's pixels (InternVL float32 [N, 3, S, S];
LLaVA-OneVision [I, max tiles, 3, S, S] + ``image_sizes``); checked on the tiny offline models
(fp32, eager and sdpa, 0..3 images per row): packed logits equal each row's alone. A family
whose ``no_packing`` names a reason (Gemma 3's bidirectional image attention; the generic path,
whose model's attention is unknown) is refused with it (`mmpipe.batching.pack_batch.refuse_packing`).

Whether rows may share a sequence depends on the model's layers, not only on its processor
(Qwen3.5 checkpoints load with the Qwen3-VL processor, but their linear-attention layers carry
state from row to row). ``PackingCollator(processor, model=model)`` / ``pack(..., model=model)``
(a model, its config or a ``config.json`` dict) read its layer types and refuse with
`mmpipe.errors.PackingUnsupportedError` naming the layer type that does not keep the rows apart
(`mmpipe.batching.attention_layers`; the alternative: padded batches, `mmpipe.Collator`).
Without a model, the families known to pack pack as before and one warning per process says
the model's layers were not checked.

``model_inputs()`` leaves ``attention_mask`` out ON PURPOSE: transformers only looks for
packed sequences in ``position_ids`` when the attention mask is None (a 2-D all-ones mask
would make the rows attend to each other), and passes ``use_cache=False`` for the same
reason (a cache also switches the detection off). Checked: packed logits equal each row's
logits run alone, fp32, for Qwen2-VL, Qwen2.5-VL and Qwen3-VL (deepstack included).

Example::

    sampler = mmpipe.TokenBudgetBatchSampler.from_dataset(enc, max_tokens=16384, cost="packed")
    loader = DataLoader(enc, batch_sampler=sampler, collate_fn=PackingCollator(processor, model=model, max_tokens=16384))
    for packed in loader:                        # a PackedMultiModalInputs
        out = model(**packed.model_inputs(model.device))
        rows = unpack(packed)                    # the stored rows, exactly
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from mmpipe._fork import torch_fork_safe
from mmpipe.batching.attention_layers import ModelLayers, check_family_line, check_packing
from mmpipe.batching.checks import checked_records
from mmpipe.batching.collate import batch_family, batch_state, collate_packed, collator_family
from mmpipe.batching.pack_batch import pack_batch, pack_budgets, refuse_packing
from mmpipe.batching.text import pad_id
from mmpipe.batching.unbatch import unbatch
from mmpipe.images.spec import VisionSpec
from mmpipe.records.batch import BatchedMultiModalInputs
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.packed import PackedMultiModalInputs
from mmpipe.records.row import MultiModalInputs
from mmpipe.records.vision_tokens import VisionTokens

logger = logging.getLogger("mmpipe")
UNCHECKED_WARNED: set = set()  # non-empty once this process has logged that a model went unchecked
UNCHECKED_LOG = ("mmpipe: %s packs %s rows without knowing the model's layers; a model whose layers do not "
                 "keep packed rows apart (e.g. Qwen3.5's linear attention: its checkpoints load with the "
                 "Qwen3-VL processor) would get wrong logits, silently. Pass model=model (or its config) to "
                 "PackingCollator / pack to check (logged once per process)")


def model_packing(who: str, model: Any, fam: Any) -> Optional[ModelLayers]:
    """``model``'s layers when they keep packed rows apart (`check_packing`: else
    `PackingUnsupportedError` naming the layer type); None without a model (a family none of whose
    models packs on the installed transformers refused, `check_family_line`), after logging
    `UNCHECKED_LOG` once per process (the family's rows pack as before: they are exact on every
    model of the family's own line, and ``model=`` tells the ones that are not)."""
    if model is not None:
        return check_packing(model, who)
    check_family_line(fam, who)  # GLM-4.1V on transformers 4.x: no model of it packs there
    if not UNCHECKED_WARNED:
        UNCHECKED_WARNED.add(who)
        logger.warning(UNCHECKED_LOG, who, fam.name)
    return None


def pack(
    rows: Sequence[Any],
    *,
    processor=None,
    spec: Optional[VisionSpec] = None,
    family: Any = None,
    pad_token_id: Optional[int] = None,
    max_tokens: Optional[int] = None,
    max_images: Optional[int] = None,
    vision_tokens: Optional[VisionTokens] = None,
    model: Any = None,
    allow_layout_only: bool = False,
    oversize: str = "raise",
) -> PackedMultiModalInputs:
    """Pack encoded rows (``MultiModalInputs``, stored dicts or Arrow rows) into one sequence.

    ``max_tokens`` / ``max_images``: the pack's budgets (integers >= 1 / >= 0, or None); a batch
    over either raises (group rows with `mmpipe.batching.sampler.TokenBudgetBatchSampler(cost="packed")`,
    which never exceeds them); ``oversize="alone"``: a pack of one row may be over them (the
    sampler's ``oversize="alone"`` hands such a row out alone). Rows must be unpadded
    (attention_mask all ones), as ``mmpipe.encode`` stores them. ``pad_token_id`` is accepted as
    `mmpipe.collate` takes it, and unused: a pack has no padding.
    An image / video pad at a text position is refused as in collate (``vision_tokens``: the
    processor's by default, else the pads the rows' image blocks show). ``model``: the model the
    pack is for (or its config, or a ``config.json`` dict): its layers are checked
    (`mmpipe.batching.attention_layers.check_packing`; `PackingUnsupportedError` naming the layer
    type that does not keep packed rows apart); without it, one warning per process. Rows with
    images or videos but no pixel data (layout-only, ``pixels="none"``) are refused as in
    `mmpipe.collate` unless ``allow_layout_only=True`` (a pack of ids without pixels).

    The steps: the rows read and their family resolved as in `mmpipe.collate`; a family whose
    model does not take packed rows refused with the reason (`refuse_packing`: Gemma 3, the
    generic path), then the model's layers (`model_packing`); the rows' media collated as in
    `mmpipe.collate` and their tokens put end to end (`mmpipe.batching.collate.collate_packed`:
    no padded [B, L] array), then the pack (`mmpipe.batching.pack_batch`).
    """
    max_tokens, max_images = pack_budgets("pack", max_tokens, max_images, oversize)
    recs = checked_records(rows)
    fam, state = batch_state(recs, family, processor, spec=spec, vision_tokens=vision_tokens)
    refuse_packing("pack", fam, state.get("processor_class") or recs[0].processor_class)
    model_packing("pack", model, fam)
    meta, flat = collate_packed(recs, fam, state, allow_layout_only=allow_layout_only)
    return pack_batch(meta, flat, max_tokens, max_images, oversize)


def to_padded(packed: PackedMultiModalInputs, padding_side: str = "right") -> BatchedMultiModalInputs:
    """The same rows as a padded `BatchedMultiModalInputs` (what `mmpipe.collate` would build);
    a `PackedMultiModalInputs` gives a `BatchedMultiModalInputs`."""
    import torch

    m = packed.meta
    lengths = m.seq_lengths
    n, L = packed.num_rows, int(lengths.max())
    ar = torch.arange(L)[None, :]
    valid = ar < lengths[:, None] if padding_side == "right" else ar >= (L - lengths)[:, None]

    def place(flat, fill, lead=()):
        out = torch.full((*lead, n, L), fill, dtype=flat.dtype)
        out[..., valid] = flat
        return out

    lead = (3,) if m.position_ids.ndim == 3 else ()  # the M-RoPE rows, or 1-D positions [n, L]
    pos = packed.position_ids[1:, 0] if packed.position_ids.shape[0] == 4 else \
        packed.position_ids.expand(3, -1) if lead else packed.position_ids[0]
    labels = None
    if packed.labels is not None:
        flat = packed.labels[0].clone()
        flat[packed.cu_seqlens[:-1].long()] = packed.first_labels
        labels = place(flat, IGNORE_INDEX)
    return BatchedMultiModalInputs(**{
        **m.__dict__,
        "input_ids": place(packed.input_ids[0], 0),  # pad id: unbatch strips pads by length
        "attention_mask": valid.long(),
        "mm_token_type_ids": place(packed.mm_token_type_ids[0], 0),
        "position_ids": place(pos, 0, lead),
        "labels": labels,
        "padding_side": padding_side,
    })


def unpack(packed: PackedMultiModalInputs) -> list[MultiModalInputs]:
    """The packed rows back, exactly: ``unpack(pack(rows)) == rows``."""
    return unbatch(to_padded(packed))


class PackingCollator:
    """Picklable DataLoader ``collate_fn`` that packs each batch into one sequence.

    ``PackingCollator(processor, model=model, max_tokens=16384, max_images=64)``: a batch over a
    budget raises (use it with ``TokenBudgetBatchSampler(cost="packed")`` and the same budgets).
    Holds only the family, its strategy's collator state, the pad id and ``layers`` (the model's
    `ModelLayers`, None without ``model``), like `mmpipe.Collator`. Refused here, with the reason
    (`mmpipe.errors.PackingUnsupportedError`): a family whose model does not take packed rows,
    and a ``model`` (a transformers model, its config or a ``config.json`` dict) with a layer
    type that does not keep packed rows apart (`mmpipe.batching.attention_layers`). Without
    ``model``, one warning per process says its layers were not checked. ``allow_layout_only``:
    as in `pack` (layout-only rows are refused by default). ``oversize="alone"``: a batch of one
    row may be over the budgets (pair it with ``TokenBudgetBatchSampler(oversize="alone")``).
    """

    def __init__(self, processor=None, *, model: Any = None, max_tokens: Optional[int] = None,
                 max_images: Optional[int] = None, family: Any = None, pad_token_id: Optional[int] = None,
                 allow_layout_only: bool = False, oversize: str = "raise"):
        max_tokens, max_images = pack_budgets("PackingCollator", max_tokens, max_images, oversize)
        self.family, self.state = collator_family("PackingCollator", processor, family, packing=True)
        self.layers = model_packing("PackingCollator", model, self.family)
        self.pad_token_id = pad_id(processor, pad_token_id)
        self.max_tokens = max_tokens
        self.max_images = max_images
        self.allow_layout_only = bool(allow_layout_only)
        self.oversize = oversize

    def __call__(self, rows: Sequence[Any]) -> PackedMultiModalInputs:
        torch_fork_safe()  # a user's forked Pool after a parallel torch op: the packing ops deadlock otherwise
        recs = checked_records(rows)
        fam = batch_family(recs, self.family)
        meta, flat = collate_packed(recs, fam, self.state, allow_layout_only=getattr(self, "allow_layout_only", False))
        return pack_batch(meta, flat, self.max_tokens, self.max_images, getattr(self, "oversize", "raise"))
