"""What collate takes as its rows, in every form a user or a host hands over: a list of dicts
(or records), a dict of columns (``ds[i:j]``), pandas frames (``datasets``' pandas format), or
Arrow (a table, a record batch, ``ArrowRows``' one-row tables). `row_dicts` turns the Python
forms into a list of row dicts; `arrow_table` keeps Arrow as one table. The checks of the rows
themselves are `mmpipe.batching.checks`."""

from __future__ import annotations

import numpy as np

from mmpipe.errors import ArgumentError


def row_dicts(rows):
    """Rows as collate reads them, from what ``datasets``' pandas format hands over: a
    ``pandas.DataFrame`` (``ds.with_format("pandas")[a:b]``) or a list of one-row frames
    (``ds.with_format("pandas")[i]``) become a list of dicts, and in each dict row a nested list
    that pandas gives as a 1-D object array of equally long arrays (``position_ids`` [3, L], a
    grid [I, 3]) is stacked into its 2-D array (exact: the same values, their own dtype; a
    ragged one is left for the reader to refuse). Other rows are returned as they are (a
    cheap per-column dtype check). A dict of columns (``ds[i:j]`` in the python / numpy / torch
    formats, a batched map's batch) becomes its rows too (`_column_rows`)."""
    if isinstance(rows, dict):
        rows = _column_rows(rows)
    if _is_frame(rows):
        rows = rows.to_dict("records")
    elif isinstance(rows, (list, tuple)) and rows and all(_is_frame(r) for r in rows):
        rows = [d for r in rows for d in r.to_dict("records")]
    if not isinstance(rows, (list, tuple)) or not any(isinstance(r, dict) for r in rows):
        return rows
    return [_stacked(r) if isinstance(r, dict) else r for r in rows]


def _column_rows(cols: dict) -> list[dict]:
    """A dict of columns -> its rows, each value the column's entry ``i`` as the format holds it
    (a list, a numpy array or a tensor; exact). One row's dict (``ds[i]``: its ``family`` a
    string) or columns of unequal lengths raise `ArgumentError` (iterating a dict would take its
    keys for rows and blame a "row 0" that is a column name)."""
    fam = cols.get("family")
    if isinstance(fam, str) or fam is None:
        what = "one row's dict (ds[i])" if isinstance(fam, str) else f"a dict with keys {sorted(cols)[:8]}"
        raise ArgumentError(f"collate takes a list of rows, a dict of columns (ds[i:j]), an Arrow table or a "
                            f"DataFrame; got {what}: pass a list, e.g. [ds[i]]")
    try:
        lengths = {k: len(v) for k, v in cols.items()}
    except TypeError as e:
        raise ArgumentError(f"collate got a dict of columns with a value that is not a column ({e}): pass "
                            "ds[i:j] as datasets returns it, or a list of rows") from e
    n = len(fam)
    uneven = {k: m for k, m in lengths.items() if m != n}
    if uneven:
        raise ArgumentError(f"collate got a dict of columns of unequal lengths: 'family' has {n} rows, "
                            f"{uneven}; pass ds[i:j] as datasets returns it, or a list of rows")
    return [{k: v[i] for k, v in cols.items()} for i in range(n)]


def _is_frame(x) -> bool:
    return type(x).__name__ == "DataFrame" and hasattr(x, "to_dict") and hasattr(x, "iloc")


def _stacked(r: dict) -> dict:
    """``r`` with each 1-D object array of equally shaped numeric arrays stacked (see `row_dicts`)."""
    out = None
    for k, v in r.items():
        if not (isinstance(v, np.ndarray) and v.dtype == object and v.ndim == 1 and len(v)):
            continue
        parts = list(v)
        if not all(isinstance(p, np.ndarray) and p.dtype.kind in "biuf" and p.shape == parts[0].shape
                   for p in parts):
            continue
        if out is None:
            out = dict(r)
        out[k] = np.stack(parts)
    return r if out is None else out


def arrow_table(rows):
    """The rows as one Arrow table if they came as Arrow (a table, a record batch, or a list
    of one-row tables from ``ArrowRows.__getitem__``), else None. `mmpipe.collate` calls it
    once and hands the table to both `checked_records` and its pass-through columns."""
    import pyarrow as pa

    if isinstance(rows, (pa.Table, pa.RecordBatch)):
        return rows
    if isinstance(rows, (list, tuple)) and rows and isinstance(rows[0], (pa.Table, pa.RecordBatch)):
        return pa.concat_tables([r if isinstance(r, pa.Table) else pa.Table.from_batches([r]) for r in rows])
    return None
