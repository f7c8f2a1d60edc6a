"""Each row's token and image counts from an encoded dataset's stored columns, for
`mmpipe.batching.sampler.TokenBudgetBatchSampler` (its lengths and image budget) and length
statistics: `token_counts`; what batches of them occupy: `token_efficiency`; a budget, seed or
epoch argument checked: `count_arg`. Only Arrow list offsets are read: no row is decoded, no pixel
touched, so a layout-only encoding (``pixels="none"``) gives the same counts as the stored
training set.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from mmpipe.errors import ArgumentError, InputError, is_integer
from mmpipe.records.arrow import list_lengths
from mmpipe.records.columns import ERROR_COLUMN

__all__ = ["COUNT_COLUMNS", "COSTS", "IMAGE_COUNT_COLUMNS", "count_arg", "token_counts", "token_efficiency"]


def token_counts(dataset) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """``(lengths, num_images)``, int64 [n] each, of an encoded map-style ``datasets.Dataset``.

    Read from the Arrow list offsets of ``input_ids`` and of the column that says each row's
    image count (no row is decoded, no pixel touched): ``image_grid_thw`` (Qwen / GLM: one
    entry per image), ``tiles_per_image`` (tiled families: one entry per image) or
    ``image_hw`` (the generic path: each image's (height, width), 2 values per image, stored
    flat). So it works on a layout-only encoding (``mmpipe.encode(..., pixels="none")``) as
    well as on a stored training set. ``num_images`` is None when no column says it
    (generic-path rows of an earlier mmpipe store no ``image_hw``): never a silent 0. A list
    of rows (``MultiModalInputs`` or dicts) works too. An ``IterableDataset`` (streaming) has
    no length to plan an epoch with: `ArgumentError` (pass the lengths to the constructor). Rows that
    failed to encode under ``on_error="skip"`` (0 tokens, their failure in ``mmpipe_error``) are an
    `InputError` naming them (`mmpipe.batching.checks.check_none_failed`): drop them first
    (``mmpipe.drop_failed``).
    """
    from mmpipe.batching.checks import check_none_failed

    if isinstance(dataset, (list, tuple)):
        from mmpipe.records.row import MultiModalInputs

        check_none_failed([r.get(ERROR_COLUMN) if isinstance(r, dict) else None for r in dataset], _WHO)
        recs = [MultiModalInputs.from_dict(r, row=i) for i, r in enumerate(dataset)]
        # generic-path rows of an earlier mmpipe (no image_hw) do not know their image count
        unknown = any(r.image_hw is None and r.fam.media.IMAGE_LAYOUT_COLUMN == "image_hw" for r in recs)
        return (np.asarray([r.num_tokens for r in recs], np.int64),
                None if unknown else np.asarray([r.num_images for r in recs], np.int64))
    _check_map_style(dataset)
    names = set(getattr(dataset, "column_names", []) or [])
    if "input_ids" not in names:
        raise InputError(
            "token_counts needs an encoded dataset with an 'input_ids' column", where="", column="input_ids",
            stage="collate", expected="an encoded dataset (input_ids, image_grid_thw, ...)",
            found=f"columns {sorted(names)}",
            fix="encode first, e.g. layout-only: ds.map(mmpipe.encode, fn_kwargs={'processor': p, 'pixels': 'none'})",
        )
    table = dataset.select_columns(sorted(names & (COUNT_COLUMNS | {ERROR_COLUMN}))).with_format("arrow")[:]  # honours
    if ERROR_COLUMN in table.column_names:  # select/shuffle indices; a failed row (0 tokens) fits every budget
        check_none_failed(table.column(ERROR_COLUMN), _WHO)
    lengths = list_lengths(table.column("input_ids"))
    return lengths, _image_counts(table)


# the stored columns that say a row's image count, and how many of their values make one image:
# one image_grid_thw entry (patch grids), one tiles_per_image entry (tiles), two image_hw values
# (the generic path's (height, width), stored flat)
IMAGE_COUNT_COLUMNS = (("image_grid_thw", 1), ("tiles_per_image", 1), ("image_hw", 2))
_WHO = "token_counts (TokenBudgetBatchSampler.from_dataset)"
COUNT_COLUMNS = {"input_ids"} | {c for c, _ in IMAGE_COUNT_COLUMNS}


def _image_counts(table) -> Optional[np.ndarray]:
    """int64 [n] images per row from the first column of `IMAGE_COUNT_COLUMNS` the table has;
    None when none says it (generic-path rows of an earlier mmpipe store no ``image_hw``), so
    that a count is never a silent 0."""
    for name, per_image in IMAGE_COUNT_COLUMNS:
        if name in table.column_names:
            n = list_lengths(table.column(name))
            if per_image > 1 and (n % per_image).any():
                i = int(np.flatnonzero(n % per_image)[0])
                raise InputError(f"{name} holds {int(n[i])} values; it stores {per_image} per image",
                                 row=i, column=name, stage="collate",
                                 expected=f"a multiple of {per_image} values", found=f"{int(n[i])} values",
                                 fix="re-encode the row with mmpipe.encode")
            return n // per_image
    return None


def _check_map_style(dataset) -> None:
    """`ArgumentError` for a dataset the sampler cannot plan an epoch over: an
    ``IterableDataset`` (streaming; no length, no random access) or anything without columns."""
    try:
        import datasets
        iterable = isinstance(dataset, datasets.IterableDataset)
    except ImportError:  # pragma: no cover - datasets is a dependency
        iterable = False
    if iterable or not hasattr(dataset, "select_columns") or not hasattr(dataset, "__len__"):
        raise ArgumentError(
            f"token_counts / TokenBudgetBatchSampler.from_dataset need a map-style datasets.Dataset (random "
            f"access by row index, a known length), got {type(dataset).__name__}: a batch_sampler hands out row "
            "indices, which an IterableDataset (streaming) cannot take; load it map-style (load_dataset(..., "
            "streaming=False) or Dataset.from_generator), or pass the lengths yourself: "
            "TokenBudgetBatchSampler(lengths, num_images, max_tokens=...)")


COSTS = ("padded", "packed")


def token_efficiency(lengths: Sequence[int], batches: Sequence[Sequence[int]], *, cost: str = "padded",
                     slots_per_batch: Optional[int] = None) -> float:
    """Real tokens / token slots the batches occupy (1.0: no padding at all).

    ``cost="padded"``: a batch occupies rows x its longest row (a padded ``[B, L]`` batch);
    ``"packed"``: the sum of its lengths (a ``[1, T]`` pack: always 1.0), or
    ``slots_per_batch`` per batch when packs are padded to a fixed length (static shapes).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    real = int(sum(int(lengths[b].sum()) for b in batches))
    if slots_per_batch is not None:
        slots = slots_per_batch * len(batches)
    elif cost == "padded":
        slots = int(sum(len(b) * int(lengths[b].max()) for b in batches if len(b)))
    elif cost == "packed":
        slots = real
    else:
        raise ArgumentError(f"cost must be one of {COSTS}, got {cost!r}")
    return real / slots if slots else 1.0


def count_arg(who: str, name: str, value, minimum: int, *, none_ok: bool = True,
              example: Optional[int] = None) -> Optional[int]:
    """``value`` as an int >= ``minimum`` (None passes when ``none_ok``): a budget, a seed or an
    epoch of a sampler or a packer. Anything else (a string, a fraction, NaN, a bool, a number
    below ``minimum``) is an `ArgumentError` naming ``who``'s argument, at construction, rather
    than a TypeError or a numpy error on the first batch (``example``: a value to suggest)."""
    if value is None and none_ok:
        return None
    whole = is_integer(value)
    if isinstance(value, (float, np.floating)) and float(value).is_integer():
        whole = True
    if not whole or int(value) < minimum:
        allowed = f"an integer >= {minimum}" + (" or None" if none_ok else "")
        hint = f"e.g. {name}={example}" if example is not None else "a whole number" + " or None" * none_ok
        raise ArgumentError(f"{who}: {name} must be {allowed}, got {value!r}; pass {hint}")
    return int(value)


def count_array(who: str, name: str, values) -> np.ndarray:
    """``values`` (a sequence or array of per-row counts: token lengths, image counts) as int64
    [n], each a whole number >= 0. A fraction, NaN, a string, a bool or a negative count is an
    `ArgumentError` naming ``who``'s argument and the first bad row, never truncated (12.7 read
    as 12 tokens) or a bare numpy error."""
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError) as e:  # ragged nesting
        raise ArgumentError(f"{who}: {name} must be one count per row (a list of ints), got {e}") from None
    if arr.ndim > 1:  # e.g. per-rank lists, or [length, images] pairs: flattened they would be other rows
        raise ArgumentError(f"{who}: {name} must be one count per row (a flat list of ints), got an array of "
                            f"shape {arr.shape}; pass one int per row (e.g. lengths[:, 0] for the first column)")
    arr = arr.reshape(-1)
    kind = arr.dtype.kind
    if kind in "iu" and isinstance(values, (list, tuple)) and any(isinstance(v, (bool, np.bool_)) for v in values):
        kind = "O"  # True among ints: numpy reads it as 1
        arr = np.asarray(values, dtype=object)
    if kind in "iu":
        bad = np.flatnonzero(arr < 0)
    elif kind == "f":
        bad = np.flatnonzero(~np.isfinite(arr) | (arr != np.floor(arr)) | (arr < 0))
    elif kind == "O":  # mixed values (None, strings among ints)
        bad = np.flatnonzero([not (is_integer(v) and v >= 0) for v in arr])
    else:  # strings, bools
        bad = np.arange(len(arr))
    if len(bad):
        i = int(bad[0])
        found = arr[i].item() if isinstance(arr[i], np.generic) else arr[i]
        raise ArgumentError(f"{who}: {name} must hold whole numbers >= 0 (one per row), got {found!r} at row {i}"
                            f" ({len(bad)} such row(s)); pass each row's count as an int")
    return arr.astype(np.int64, copy=False)
