"""Media strategies: what differs between the kinds of model family (`ModelFamily.kind`), and
nothing else. Every stage (encode, collate, pack, unbatch, validate, the views) works on the one
record type, `mmpipe.records.MultiModalInputs`, and asks the row's family's strategy
(``fam.media``) for the part that differs:

=============  ===================================================================================
kind           strategy
=============  ===================================================================================
``patches``    `mmpipe.media.patches`: patch grids ``image_grid_thw`` [I, 3], uint8 patches
               [N, 3*p*p] expanded to ``pixel_values`` [N, 3*T*p*p] at collate (Qwen-VL, GLM-4.1V,
               the text family)
``tiles``      `mmpipe.media.tiles`: fixed-size uint8 tiles [N, S, S, 3] per image (``image_hw``,
               ``tiles_per_image``), the processor's normalisation at collate (Gemma 3, InternVL,
               LLaVA-OneVision)
``processor``  `mmpipe.media.processor`: whatever the processor's own call returns, typed by its
               `ProcessorLayout` (the generic path)
=============  ===================================================================================

A strategy answers for one row: its stored media columns (``to_columns`` / ``from_columns``),
the checks of its media fields (``validate``), the media fields compared by ``diff``.
"""

from __future__ import annotations

import importlib

from mmpipe.errors import ArgumentError

KINDS = {"patches": "mmpipe.media.patches", "tiles": "mmpipe.media.tiles", "processor": "mmpipe.media.processor"}


def one_d_position_inputs(batch, positions) -> dict:
    """``position_ids`` [B, L] of a 1-D family: ``positions`` "1d" (the default) or "none" (the
    model computes them); anything else is an `ArgumentError`. Kind tiles always; kind processor
    through `mmpipe.media.processor.position_inputs`, which first asks whether the processor's
    model takes 1-D positions at all."""
    if (positions or "1d") not in ("1d", "none"):
        raise ArgumentError(f"positions must be '1d' or 'none' for {batch.family}, got {positions!r}")
    return {} if positions == "none" else {"position_ids": batch.position_ids}


def strategy(kind: str):
    """The strategy module of a family kind (imported on first use)."""
    try:
        return importlib.import_module(KINDS[kind])
    except KeyError:
        raise ArgumentError(f"unknown family kind {kind!r}; known: {sorted(KINDS)}") from None
