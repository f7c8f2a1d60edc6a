"""Collate and unbatch of the ``processor`` kind (the generic path, `mmpipe.media.processor`): which
rows may share a batch (one processor class, one set of image-processor settings), what a row's
outputs lack before padding (the audio of ``audio="source"`` rows, the masks a one-item call
leaves out), the warnings where a batch differs from each row alone; the padding itself is the
layout's (`mmpipe.batching.output_padding`: each key padded as the processor's own batch call
pads it, and cut back out).

`collator_state`, `collate_media` and `unbatch_media` are the kind's collate and unbatch, beyond
the layout of its images (`MEDIA_ITEMS`, `mmpipe.batching.media_fields`).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import replace

import numpy as np

from mmpipe.audio.clips import audio_outputs, warn_padded_audio as padded_audio_warning
from mmpipe.batching.media_fields import MediaItems
from mmpipe.batching.output_padding import collate_vision, cut_vision, join_vision
from mmpipe.errors import ArgumentError, FamilyMismatchError, InputError
from mmpipe.images.settings import image_settings
from mmpipe.records.processor_layout import ProcessorLayout
from mmpipe.records.columns import to_numpy

logger = logging.getLogger("mmpipe")

CROSS_ATTENTION_WARNED: set = set()  # processor classes warned about (once per process)
# each image's upright (height, width) int64 [I, 2] (None in a batch with rows of an earlier
# mmpipe, which stored none: their image counts are unknown, sample_to_image_indices refuses)
MEDIA_ITEMS = (MediaItems("image_offsets", (("image_hw", "int64", 2),)),)
ROW_FIELDS = (("audio_sources", "row_audio_sources"),)  # audio="source" rows: each row's clips (files)


def warn_cross_attention_counts(rows: list) -> None:
    """A cross-attention model (Mllama: ``cross_attention_mask`` [1, L, images, tiles]) attends
    from a row's text before its first image to every image slot of the batch, padding images
    included, so a batch of rows with different image counts differs from each row alone (the
    processor's own batch does the same). Logged once per processor class."""
    counts = {r.vision["cross_attention_mask"].shape[2] for r in rows if "cross_attention_mask" in r.vision}
    cls = rows[0].processor_class
    if len(counts) > 1 and cls not in CROSS_ATTENTION_WARNED:
        CROSS_ATTENTION_WARNED.add(cls)
        logger.warning("mmpipe: %s batch with %s images per row: its cross-attention sees the batch's padding "
                       "images, so logits differ from each row alone (as with the processor's own batch); batch "
                       "rows of equal image counts for per-row results (e.g. group the dataset by image count)",
                       cls, sorted(counts))


def warn_padded_audio(rows: list) -> None:
    """The rows' audio features (`ProcessorLayout.audio`, not their masks) of several frame shapes:
    `mmpipe.audio.clips.warn_padded_audio`'s warning, once per processor class."""
    layout = rows[0].layout
    keys = [k for k in (layout.audio if layout is not None else ()) if k not in dict(layout.single_masks)]
    frames = {tuple(r.vision[k].shape[1:]) for r in rows for k in keys if k in r.vision and r.vision[k].ndim >= 3}
    padded_audio_warning(rows[0].processor_class, frames)


def collator_state(processor, fam) -> dict:
    """``{"processor_class": str or None, "settings": str or None}``: the transformers class every
    row must have been encoded by, and its image-processor settings (`image_settings`); None
    without a processor (the rows' own then decide)."""
    from mmpipe.families import processor_class_name

    if processor is None:
        return {"processor_class": None, "settings": None, "processor": None}
    return {"processor_class": processor_class_name(processor), "settings": image_settings(processor) or None,
            "processor": processor}  # audio="source" rows: the processor computes their audio outputs


def _settings(r) -> str:
    return r.layout.settings if r.layout is not None else ""


def _most_common(values: list):
    """The most common of ``values`` (ties: the first of them)."""
    counts = Counter(values)
    return max(counts, key=lambda x: (counts[x], -values.index(x)))


def _check_settings(rows: list, want) -> None:
    """Every row's image-processor settings are one: ``want`` (the collator's processor's) when a row
    has it, else the rows' most common (ties: the first row's); a row of other settings raises,
    naming it. Rows encoded with other settings (a 32-px and a 48-px LLaVA) would be zero-padded
    into one shape while their ids keep their own image-token counts. The rows' pixels are their
    encode's, so a batch of one setting collates even when the collator's processor differs (a
    transformers upgrade that adds a setting). Rows of an earlier mmpipe (none stored): unchecked."""
    have = [_settings(r) for r in rows]
    known = [x for x in have if x]
    if not known:
        return
    want = want if want in known else _most_common(known)
    for i, x in enumerate(have):
        if x and x != want:
            raise InputError("encoded with other image-processor settings than the rest of the batch", row=i,
                             column="generic_layout", stage="collate", expected=want, found=x,
                             fix="encode (and collate) every row with one processor and one set of image "
                                 "settings; re-encode this row, or split the dataset by settings")


def _check_processor(rows: list, want, settings=None) -> None:
    """Every row encoded by the processor class ``want`` (when collated with a processor:
    `FamilyMismatchError`), and by the batch's class (`InputError`, naming the row that differs
    from the others), with the same image-processor settings (`_check_settings`)."""
    common = _most_common([r.processor_class for r in rows])
    for i, r in enumerate(rows):
        if want is not None and r.processor_class != want:
            raise FamilyMismatchError(f"encoded by {r.processor_class} (the generic path) but collated with {want}",
                                      row=i, column="generic_layout", expected=want, found=r.processor_class,
                                      fix="collate with the processor that encoded the rows, or re-encode them")
        if want is None and r.processor_class != common:
            raise InputError("rows of different processors in one batch", row=i, column="processor_class",
                             stage="collate", expected=common, found=r.processor_class,
                             fix="batch rows encoded by one processor")
    _check_settings(rows, settings)


def _with_audio(r, processor, index: int):
    """Row ``r`` with the audio outputs of its ``audio="source"`` clips computed by ``processor``
    (`mmpipe.audio.clips.audio_outputs`); other rows as they are."""
    if not r.audio_sources:  # none stored, or a row without clips
        return r
    if processor is None:
        raise ArgumentError(f"row {index} was encoded with audio='source': collate computes its audio features with "
                            "the processor; pass it: mmpipe.collate(rows, processor=processor) or "
                            "mmpipe.Collator(processor)")
    return replace(r, vision={**r.vision, **audio_outputs(processor, r.layout.audio, r.audio_sources, f"row {index}")})


def _with_masks(r):
    """Row ``r`` with each mask its processor leaves out of a one-item call
    (`ProcessorLayout.single_masks`) filled in, all valid over its feature's leading axes (one
    item: every frame is its own), as the processor's call on several items writes it."""
    layout = r.layout
    if layout is None or not layout.single_masks:
        return r
    kinds = {name: (dtype, ndim) for name, dtype, ndim in layout.vision}
    add = {m: np.ones(r.vision[f].shape[:kinds[m][1]], kinds[m][0]) for m, f in layout.single_masks
           if m not in r.vision and f in r.vision and m in kinds}
    return replace(r, vision={**r.vision, **add}) if add else r


def _without_filled_masks(row: dict, layout) -> dict:
    """An unbatched row's vision outputs without the masks `_with_masks` filled in (a one-item row)."""
    for m, f in (layout.single_masks if layout is not None else ()):
        if m in row and f in row and row[f].shape[0] == 1:
            del row[m]
    return row


def collate_media(rows: list, ctx) -> dict:
    """The media fields of a batch (numpy; see `mmpipe.records.batch.BatchedMultiModalInputs`):
    ``vision`` (each key padded as the processor pads it, `collate_vision`), each row's own
    ``shapes``, ``pixel_format`` ("float32", or "none" without vision outputs) and the rows'
    ``layout`` (the first row's; the layout of what the batch holds when the rows were probed
    differently). Rows must come from one processor class, ``ctx.state``'s when collated with a
    processor."""
    _check_processor(rows, ctx.state.get("processor_class"), ctx.state.get("settings"))
    sources = [r.audio_sources for r in rows]
    rows = [_with_audio(r, ctx.state.get("processor"), i) for i, r in enumerate(rows)]
    warn_cross_attention_counts(rows)
    warn_padded_audio(rows)
    rows = [_with_masks(r) for r in rows]
    row_keys = tuple(sorted({k for r in rows for k in r.row_keys}))
    joins = dict(rows[0].layout.joins) if rows[0].layout is not None else {}
    vision, shapes = {}, {}
    for key in sorted({k for r in rows for k in r.vision}):
        vision[key], shapes[key] = join_vision(rows, key, joins[key]) if key in joins else \
            collate_vision(rows, key, key in row_keys, ctx.length, ctx.padding_side)
    layout = first = rows[0].layout
    if any(r.layout != first for r in rows):
        first = first or ProcessorLayout("")
        layout = ProcessorLayout.of(rows[0].processor_class, rows[0].sequence, {k: v[:0] for k, v in vision.items()},
                                    row_keys, joins=first.joins, dtypes=first.dtypes)
    return dict(pixel_format="float32" if vision else "none", shapes=shapes, vision=vision, layout=layout,
                row_audio_sources=sources if any(x is not None for x in sources) else None)


def unbatch_media(batch, rows: list) -> list[dict]:
    """A batch -> each row's ``vision`` outputs cut back to its own shapes and the batch's
    `ProcessorLayout` (so rows written back store as before), beside its ``image_hw`` and
    ``audio_sources`` as unbatch cut them (``rows``)."""
    L = batch.input_ids.shape[1]
    vision = {k: to_numpy(v) for k, v in batch.vision.items()}
    row_keys = set(batch.layout.row_keys) if batch.layout is not None else set()
    joins = dict(batch.layout.joins) if batch.layout is not None else {}
    starts = {k: 0 for k in vision}
    for b, (row, n) in enumerate(zip(rows, to_numpy(batch.seq_lengths).tolist())):
        cols = slice(0, n) if batch.padding_side == "right" else slice(L - n, L)
        own = _without_filled_masks(cut_vision(vision, batch.shapes, row_keys, b, n, cols, starts, joins), batch.layout)
        if row["audio_sources"] is not None:  # computed at collate: the row stores its clips
            own = {k: v for k, v in own.items() if k not in batch.layout.audio}
        row.update(layout=batch.layout, vision=own)
    return rows
