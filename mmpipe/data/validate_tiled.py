"""Validate a stored dataset of a tiled family (Gemma 3, InternVL, LLaVA-OneVision:
`mmpipe.records.tiled.MultiModalInputs.to_dict` rows); `mmpipe.validate_dataset` comes here by itself
when the rows' ``family`` is a tiled one::

    report = mmpipe.validate_dataset("/data/encoded_gemma3")                   # structure
    report = mmpipe.validate_dataset("/data/encoded_gemma3", processor=proc)   # + exact counts

Checked on every row (each problem an `Issue` naming the column and the rows):

- the columns and their Arrow types (lists of integers; ``pixel_values_u8`` a list of uint8);
- each row read as collate reads it (`rows_from_arrow`): lengths line up, the stored
  pixel bytes are exactly ``tiles_per_image.sum()`` tiles of ``tile_hw``;
- the feature tokens: every token marked 1 in ``mm_token_type_ids`` holds the family's
  feature token and no unmarked token does; the marked tokens form one run per image (per
  tile for Gemma 3, whose every tile has its own text);
- with ``processor=`` (and the ``images_kwargs`` the rows were encoded with, e.g. Gemma 3
  pan-and-scan): each image's feature tokens and tile count vs its stored (height, width),
  as `mmpipe.encoding.tiled.TiledEncoder` computes them.

Pixel bytes: rows with uint8 tiles carry a ``pixel_digest`` of the tile bytes and rows encoded
with ``pixels="source"`` one over their image files; the reader checks it, so a changed byte is
reported for its row.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from mmpipe.data.report import REENCODE, Issue, ValidationReport
from mmpipe.errors import InputError
from mmpipe.families import TILED_FAMILIES, tiled_family_of
from mmpipe.records.arrow import rows_from_arrow

__all__ = ["is_tiled_table", "validate_tiled"]

_REQUIRED = ("input_ids", "attention_mask", "mm_token_type_ids", "image_hw", "tiles_per_image", "family")
_INT_LISTS = ("input_ids", "attention_mask", "labels", "mm_token_type_ids", "image_hw", "tiles_per_image", "tile_hw")


def is_tiled_table(table: pa.Table) -> bool:
    """Whether a stored table holds tiled-family rows (its first non-null ``family``)."""
    if "family" not in table.column_names or table.num_rows == 0:
        return "tiles_per_image" in table.column_names
    fams = table.column("family").drop_null()
    return len(fams) > 0 and str(fams[0]) in TILED_FAMILIES


def _type_issues(table: pa.Table) -> list[Issue]:
    out = []
    for name in _REQUIRED + (("tile_hw",) if "pixel_values_u8" in table.column_names else ()):
        if name not in table.column_names:
            out.append(Issue("error", "missing_column", name, "missing (a tiled row's column)", REENCODE))
    for name in table.column_names:
        t = table.column(name).type
        if name == "family":
            ok = pa.types.is_string(t) or pa.types.is_large_string(t)
        elif name == "pixel_values_u8":
            ok = (pa.types.is_list(t) or pa.types.is_large_list(t)) and t.value_type == pa.uint8()
        elif name in _INT_LISTS:
            ok = (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type)
        else:
            continue
        if not ok:
            out.append(Issue("error", "type", name, f"wrong Arrow type {t} for a tiled row's {name}", REENCODE))
    return out


def _runs(marked: np.ndarray) -> np.ndarray:
    """Lengths of the runs of True in ``marked`` (bool [L])."""
    edges = np.diff(np.concatenate([[0], marked.astype(np.int8), [0]]))
    return np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1)


def _bad(column: str, message: str, expected, found, row: int) -> InputError:
    return InputError(message, row=row, column=column, stage="validate", expected=str(expected), found=str(found))


def _check_features(r, i: int, feature_id: int, exact) -> None:
    """The feature tokens of row ``r`` (table row ``i``), see the module doc; ``exact``: the
    encoder whose family module gives each image's tokens and tiles, or None."""
    fam = TILED_FAMILIES[r.family]
    marked = r.mm_token_type_ids == 1
    wrong = np.flatnonzero(marked & (r.input_ids != feature_id))
    if len(wrong):
        raise _bad("input_ids", f"tokens marked as image features hold another token than {fam.feature_token}",
                   f"{fam.feature_token} (id {feature_id}) at every mm_token_type_ids == 1", f"positions {wrong[:5].tolist()}", i)
    unmarked = np.flatnonzero(~marked & (r.input_ids == feature_id))
    if len(unmarked):
        raise _bad("mm_token_type_ids", f"{fam.feature_token} tokens not marked in mm_token_type_ids",
                   "1 at every feature token", f"0 at positions {unmarked[:5].tolist()}", i)
    for k, (h, w) in enumerate(r.image_hw.tolist() if exact is not None else ()):
        tiles = int(exact.module.tile_count(h, w, exact.image_processor))
        if int(r.tiles_per_image[k]) != tiles:
            raise _bad("tiles_per_image", f"image {k} ({h}x{w}) has the wrong tile count", tiles,
                       int(r.tiles_per_image[k]), i)
    runs = _runs(marked)
    per_tile = fam.token_type_key is not None  # Gemma 3: each tile its own <start_of_image> text
    if per_tile:
        want, ok = f"{int(r.tiles_per_image.sum())} run(s) (one per tile)", len(runs) == int(r.tiles_per_image.sum())
    else:  # one per image; adjacent images' runs touch (LLaVA-OneVision renders <image><image>)
        want, ok = f"1..{r.num_images} run(s) (one per image)", (len(runs) > 0) == (r.num_images > 0) \
            and len(runs) <= r.num_images
    if not ok:
        raise _bad("mm_token_type_ids", "runs of image feature tokens do not match the images", want,
                   f"{len(runs)} run(s)", i)
    if exact is None:
        return
    mod, ip = exact.module, exact.image_processor
    total = sum(int(mod.image_tokens(h, w, ip, exact.processor)) for h, w in r.image_hw.tolist())
    if int(marked.sum()) != total:
        raise _bad("input_ids", f"the row holds the wrong number of {fam.feature_token} tokens for its images",
                   total, int(marked.sum()), i)


def _feature_id(table: pa.Table, exact) -> Optional[int]:
    """The feature token's id: the processor's, else the most common id at marked positions."""
    if exact is not None:
        return int(exact.feature_id)
    ids = table.column("input_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    types = table.column("mm_token_type_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
    marked = ids[types == 1]
    return int(np.bincount(marked.astype(np.int64)).argmax()) if len(marked) else None


def _check_rows(table: pa.Table, exact, chunk: int) -> dict[tuple, list]:
    feature_id = _feature_id(table, exact)
    problems: dict[tuple, list] = {}
    for start in range(0, table.num_rows, chunk):
        part = table.slice(start, chunk)
        try:
            rows = rows_from_arrow(part)
        except ValueError:
            rows = None
        for i in range(part.num_rows):
            try:
                r = rows[i] if rows is not None else rows_from_arrow(part.slice(i, 1))[0]
                if feature_id is not None:
                    _check_features(r, start + i, feature_id, exact)
            except InputError as e:
                problems.setdefault((e.column, e.message_body()), []).append(start + i)
            except ValueError as e:
                problems.setdefault((None, str(e)), []).append(start + i)
    return problems


def validate_tiled(table: pa.Table, *, processor=None, images_kwargs: Optional[dict] = None, rows: bool = True,
                   max_rows_listed: int = 10, chunk: int = 1024) -> ValidationReport:
    """`ValidationReport` of a table of tiled rows (module doc); ``report.data`` is ``table``."""
    report = ValidationReport(num_rows=table.num_rows, labels="labels" in table.column_names,
                              pixel_format="uint8" if "pixel_values_u8" in table.column_names else
                              "source" if "image_sources" in table.column_names else "none")
    report.data = table
    report.issues += _type_issues(table)
    fams = sorted({str(f) for f in table.column("family").to_pylist()}) if "family" in table.column_names else []
    if len(fams) > 1 or (fams and fams[0] not in TILED_FAMILIES):
        report.issues.append(Issue("error", "family", "family", f"rows of families {fams}: one tiled family expected "
                                   f"({sorted(TILED_FAMILIES)})", "re-encode with one processor, or split by family"))
    if not rows or not report.ok or not table.num_rows:
        return report
    exact = None
    if processor is not None:
        from mmpipe.encoding.tiled import TiledEncoder

        if tiled_family_of(processor) is None or tiled_family_of(processor).name != fams[0]:
            report.issues.append(Issue("error", "family", "family", f"rows of {fams[0]} but the processor is "
                                       f"{type(processor).__name__}", "pass the processor the rows were encoded with"))
            return report
        exact = TiledEncoder(processor, images_kwargs=images_kwargs, labels=False)
    for (col, msg), bad in _check_rows(table, exact, chunk).items():
        report.issues.append(Issue("error", "content", col, msg, REENCODE, bad[:max_rows_listed], len(bad)))
    return report
