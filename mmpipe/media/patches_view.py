"""The view stage's part of the ``patches`` kind (Qwen2/2.5/3-VL, GLM-4.1V, the text family),
re-exported by `mmpipe.media.patches` under its ``# ---- view ----`` section: where a row's image
and video tokens are (each image's grid tells its token count), how a span is labelled (its
grid), the images and video frames rebuilt from the stored patches, and ``mmpipe inspect``'s
counts of stored rows read from their Arrow columns.

The same names exist in `mmpipe.media.tiles_view` and `mmpipe.media.processor_view`; the view
stage (`mmpipe.view`) and the CLI (`mmpipe.cli.inspect`) call them as ``fam.media.<name>``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

PIXEL_UNIT = "patches"  # what the stored pixel rows are (head lines, `mmpipe inspect`)
STATS_COLUMNS = ("mm_token_type_ids", "image_grid_thw")  # the columns `table_counts` reads


# ---- token spans and labels ------------------------------------------------------------------
def view_spans(row) -> list[tuple]:
    """The row's media token runs in order, ``(kind, start, end, index, last, part, parts)``.

    Images and videos take their tokens in order, each as many as its grid gives
    (``t*h*w // merge**2``), so touching images split where their grids say; a video over
    several runs (Qwen3-VL: one per frame group) gives one run per part (``part`` of
    ``parts``). ``index`` -1: media tokens that no grid accounts for."""
    mm = np.asarray(row.mm_token_type_ids)
    fam = row.fam
    left = {1: [int(n) for n in fam.tokens_per_grid(np.asarray(row.image_grid_thw).reshape(-1, 3))],
            2: [int(n) for n in fam.tokens_per_grid(np.asarray(row.video_grid_thw).reshape(-1, 3))]}
    cursor, parts, out = {1: 0, 2: 0}, {}, []
    bounds = [0, *(np.flatnonzero(np.diff(mm)) + 1).tolist(), len(mm)] if len(mm) else [0]
    for a, b in zip(bounds[:-1], bounds[1:]):
        code = int(mm[a])
        if code not in (1, 2):
            continue
        kind, pos = ("image" if code == 1 else "video"), a
        while pos < b:
            k = cursor[code]
            if k >= len(left[code]):  # more media tokens than the grids account for
                out.append((kind, pos, b, -1))
                break
            take = min(b - pos, left[code][k])
            out.append((kind, pos, pos + take, k))
            parts[(kind, k)] = parts.get((kind, k), 0) + 1
            left[code][k] -= take
            cursor[code] += left[code][k] == 0
            pos += take
    seen: dict = {}
    spans = []
    for kind, a, b, k in out:
        part = seen[(kind, k)] = seen.get((kind, k), -1) + 1
        spans.append((kind, a, b, k, k, part if k >= 0 else 0, parts.get((kind, k), 1)))
    return spans


def _grid(row, kind: str, index: int) -> Optional[tuple]:
    grids = np.asarray(row.image_grid_thw if kind == "image" else row.video_grid_thw).reshape(-1, 3)
    return tuple(int(x) for x in grids[index]) if 0 <= index < len(grids) else None


def view_layout(row, kind: str, first: int, last: int) -> str:
    """The layout part of a span label: ``"grid 1×4×6"`` (``"grid ?×?×?"`` without one)."""
    g = _grid(row, kind, first)
    return "grid " + "×".join(str(x) for x in (g if g is not None else "???"))


def view_size(row, kind: str, index: int) -> Optional[tuple[int, int]]:
    """(height, width) in pixels of an image (a video frame) as the model sees it: its grid times
    the patch size; None without a grid."""
    g, p = _grid(row, kind, index), row.fam.patch_size
    return None if g is None else (g[1] * p, g[2] * p)


def view_notes(row, kind: str, index: int) -> list[str]:
    """Facts that describe lines and captions add after the label: the resized size ``"W×H px"``."""
    size = view_size(row, kind, index)
    return [] if size is None else [f"{size[1]}×{size[0]} px"]


def view_summary(row) -> list[str]:
    """What a row's head line adds to its image count (nothing: the grids are per image)."""
    return []


# ---- pictures from the stored pixels -----------------------------------------------------------
def _spec(row, source: Any):
    """The `VisionSpec` the pixels are read with: ``source`` when it is one, a processor's own,
    else the family's constants."""
    from mmpipe.images.spec import VisionSpec

    if isinstance(source, VisionSpec):
        return source
    if source is not None and getattr(source, "image_processor", None) is not None:
        return VisionSpec.from_processor(source)
    return VisionSpec.from_family(row.fam)


def _approx_u8(x: np.ndarray, spec) -> np.ndarray:
    """float32 [n, 3, k] -> uint8 by undoing the normalisation arithmetically (rounded)."""
    mean = np.asarray(spec.image_mean, np.float64)[None, :, None] if spec.do_normalize else 0.0
    std = np.asarray(spec.image_std, np.float64)[None, :, None] if spec.do_normalize else 1.0
    v = x.astype(np.float64) * std + mean
    v = v / spec.rescale_factor if spec.do_rescale else v
    return np.clip(np.rint(v), 0, 255).astype(np.uint8)


def _image_patches_u8(row, spec) -> tuple[Optional[np.ndarray], bool]:
    """The row's image patches as uint8 [N, 3*p*p] (one temporal copy) and whether they are
    exact; None for a row without pixels."""
    from mmpipe.images.pixels import pixel_values_to_u8

    if row.pixel_values_u8 is not None:
        return np.asarray(row.pixel_values_u8), True
    if row.pixel_values is None:
        return None, True
    pv = np.asarray(row.pixel_values, np.float32)
    try:
        return pixel_values_to_u8(pv, spec.lut(), spec.temporal_patch_size), True
    except ValueError:  # other normalisation constants than `spec`: undo them approximately
        n, d = pv.shape
        T = spec.temporal_patch_size
        return _approx_u8(pv.reshape(n, 3, T, d // (3 * T))[:, :, 0, :], spec).reshape(n, -1), False


def view_images(row, source: Any = None) -> tuple[list[Optional[list[np.ndarray]]], bool]:
    """Per image, its pictures as the model sees them: one uint8 [h*p, w*p, 3] (the resized
    image, rebuilt from its patches), None without stored pixels; and whether they are exact
    (float32 rows read with other constants than ``source``'s are undone approximately).
    ``source``: a `VisionSpec` or processor (default: the family's constants)."""
    from mmpipe.images.pixels import unpatchify_u8

    spec = _spec(row, source)
    patches, exact = _image_patches_u8(row, spec)
    grids = np.asarray(row.image_grid_thw).reshape(-1, 3).tolist()
    if patches is None:
        return [None] * len(grids), exact
    out, at = [], 0
    for t, h, w in grids:
        out.append([unpatchify_u8(patches[at:at + h * w], h, w, spec)])
        at += t * h * w
    return out, exact


def view_video_frames(row, source: Any = None) -> list[list[np.ndarray]]:
    """Per video, the first frame of each temporal patch group, uint8 [h*p, w*p, 3] (the model
    sees ``T`` frames per group); an empty list for a video without stored pixels."""
    from mmpipe.images.pixels import unpatchify_u8, video_pixel_values_to_u8

    spec = _spec(row, source)
    T = spec.temporal_patch_size
    if row.pixel_values_videos_u8 is not None:
        patches = np.asarray(row.pixel_values_videos_u8)
    elif row.pixel_values_videos is not None:
        pv = np.asarray(row.pixel_values_videos, np.float32)
        try:
            patches = video_pixel_values_to_u8(pv, spec.for_videos().lut())
        except ValueError:
            patches = _approx_u8(pv.reshape(len(pv), 3, -1), spec).reshape(len(pv), -1)
    else:
        return [[] for _ in range(row.num_videos)]
    out, at = [], 0
    for t, h, w in np.asarray(row.video_grid_thw).reshape(-1, 3).tolist():
        frames = []
        for g in range(t):
            block = patches[at + g * h * w: at + (g + 1) * h * w]
            first = block.reshape(h * w, 3, T, -1)[:, :, 0, :].reshape(h * w, -1)  # frame 0 of the group
            frames.append(unpatchify_u8(first, h, w, spec))
        out.append(frames)
        at += t * h * w
    return out


# ---- mmpipe inspect: counts from the stored columns --------------------------------------------
def _grids(list_array) -> tuple[np.ndarray, np.ndarray]:
    """``list<list<int>>`` grids -> (per-row counts int64 [B], all grids int64 [n, 3])."""
    import pyarrow.compute as pc

    counts = pc.list_value_length(list_array).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(pc.list_flatten(list_array)).to_numpy(zero_copy_only=False)
    return counts, flat.astype(np.int64).reshape(-1, 3)


def _stored_pixel_bytes(col, names: set) -> int:
    """Bytes the stored pixel columns of one batch hold (compact: minus each end marker)."""
    import pyarrow.compute as pc

    total = 0
    for name in ("pixel_values_u8", "pixel_values_videos_u8"):  # one binary per row + an end marker
        if name in names:
            lengths = pc.binary_length(col(name)).to_numpy(zero_copy_only=False)
            total += int(np.maximum(lengths - 1, 0).sum())
    for name in ("pixel_values", "pixel_values_videos"):
        if name in names:
            total += 4 * len(pc.list_flatten(pc.list_flatten(col(name))))
    if "image_sources" in names:  # pixels="source": the encoded image files themselves
        total += int(pc.sum(pc.binary_length(pc.list_flatten(col("image_sources")))).as_py() or 0)
    return total


def table_counts(table, families: list[str]) -> dict:
    """``mmpipe inspect``'s counts of one Arrow batch of stored rows (``families``: each row's
    ``family``): ``images_per_row`` int64 [B], ``tokens_per_image`` int64 [I], ``videos``,
    ``units`` (image and video patches), ``pixel_bytes`` (stored) and ``float32_bytes`` (what
    float32 ``pixel_values`` would take)."""
    from mmpipe.families import get_family

    def col(name):
        return table.column(name).combine_chunks()

    names = set(table.column_names)
    counts, grids = _grids(col("image_grid_thw"))
    row_of_image = np.repeat(np.arange(len(counts)), counts)
    prod = grids.prod(axis=1)
    per_image = np.zeros(len(prod), np.int64)
    image_family = np.asarray(families, dtype=object)[row_of_image]
    for name in set(families):  # each family's own token rule, over its rows' images at once
        sel = image_family == name
        per_image[sel] = get_family(name).tokens_per_grid(grids[sel])
    row_patches = np.bincount(row_of_image, weights=prod, minlength=len(counts)).astype(np.int64)
    videos = 0
    if "video_grid_thw" in names:
        v_counts, v_grids = _grids(col("video_grid_thw"))
        videos = int(v_counts.sum())
        row_of_video = np.repeat(np.arange(len(v_counts)), v_counts)
        row_patches += np.bincount(row_of_video, weights=v_grids.prod(axis=1),
                                   minlength=len(v_counts)).astype(np.int64)
    patch_dim = np.asarray([get_family(f).patch_dim for f in families], dtype=np.int64)
    return {"images_per_row": counts, "tokens_per_image": per_image, "videos": videos,
            "units": int(prod.sum()), "pixel_bytes": _stored_pixel_bytes(col, names),
            "float32_bytes": int((row_patches * patch_dim * 4).sum())}
