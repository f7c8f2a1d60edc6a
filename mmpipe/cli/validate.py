"""``mmpipe validate``: `mmpipe.validate_dataset` from the command line.

::

    mmpipe validate enc/                              # schema + every row; exit 1 on an error
    mmpipe validate enc/ --processor testing:gemma3   # tiled rows: + tile and token counts
    mmpipe validate enc/ --json                       # one JSON object: ok, counts, every issue

Prints the `mmpipe.data.report.ValidationReport` (one line per problem: column, rows, fix).
Exit status: 0 clean (warnings allowed), 1 errors, 2 bad arguments (no such dataset, a
processor that does not load, raw rows that were never encoded) or a damaged save (state.json,
a truncated or corrupt data file: `mmpipe.data.loading.DamagedDatasetError`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from mmpipe.cli.encode import CLIError, load_processor

__all__ = ["add_validate_parser", "run_validate"]

RAW_COLUMNS = ("messages", "prompt", "conversations")  # a raw row's chat column (`mmpipe.encode` parses them)


def run_validate(args) -> int:
    """``mmpipe validate``; returns the exit status."""
    import datasets

    from mmpipe.data.validate import validate_dataset
    from mmpipe.data.loading import DamagedDatasetError
    from mmpipe.errors import ArgumentError

    datasets.disable_progress_bars()
    path = split_path(str(args.path), getattr(args, "split", None))
    processor = load_processor(args.processor) if args.processor else None
    try:
        report = validate_dataset(path, processor=processor, positions=not args.no_positions)
    except (ArgumentError, DamagedDatasetError) as e:  # a wrong path or a damaged save: the user's to fix
        raise CLIError(str(e)) from None
    except json.JSONDecodeError as e:  # a damaged state.json / dataset_info.json
        raise CLIError(f"{args.path!r}: a metadata file of the saved dataset (state.json, dataset_info.json) is "
                       f"not valid JSON ({e}); re-save the dataset with Dataset.save_to_disk") from None
    missing = {i.column for i in report.issues if i.kind == "missing_column" and i.severity == "error"}
    raw = [i.column for i in report.issues if i.kind == "extra_column" and i.column in RAW_COLUMNS]
    if "input_ids" in missing and raw:
        raise CLIError(f"{args.path!r} holds raw rows (column {raw[0]!r}), not encoded ones; encode them first: "
                       f"mmpipe encode {args.path} --processor DIR --out ENC, then mmpipe validate ENC")
    if getattr(args, "json", False):
        print(json.dumps({"path": str(args.path), "ok": report.ok, "num_rows": report.num_rows,
                          "pixel_format": report.pixel_format, "labels": report.labels,
                          "errors": len(report.errors), "warnings": len(report.warnings),
                          "issues": [asdict(i) for i in report.issues]}, indent=2, default=_plain))
    else:
        print(report)
    return 0 if report.ok else 1


def split_path(path: str, split: Optional[str]) -> str:
    """The folder of one split of a saved ``DatasetDict`` (``save_to_disk`` writes each split to
    ``path/<split>``, listed in ``dataset_dict.json``), so that the split's files are checked as
    any saved Dataset's; ``path`` itself when it is no ``DatasetDict`` folder and no split is asked.
    A dict of one split needs no ``--split``. `CLIError` naming the splits otherwise."""
    if "://" in path:  # an object-store folder: the split's prefix
        return path if split is None else path.rstrip("/") + "/" + split
    listing = Path(path) / "dataset_dict.json"
    if not listing.is_file():
        if split is not None and Path(path).exists():
            raise CLIError(f"--split {split!r}: {path!r} is one dataset, not a DatasetDict (omit --split)")
        return path
    try:
        splits = list(json.loads(listing.read_text())["splits"])
    except (ValueError, KeyError, TypeError) as e:
        raise CLIError(f"{str(listing)!r} does not list the splits ({type(e).__name__}: {e}); re-save the "
                       "DatasetDict with save_to_disk") from None
    split = splits[0] if split is None and len(splits) == 1 else split
    if split not in splits:
        raise CLIError(f"{path!r} holds splits {sorted(splits)}" + (f", no split {split!r}" if split else "")
                       + "; pick one with --split")
    return str(Path(path) / split)


def _plain(value):
    """numpy scalars (row indexes) as Python numbers; anything else as its text."""
    return value.item() if hasattr(value, "item") else str(value)


def add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="check an encoded dataset's schema and rows (mmpipe.validate_dataset)",
                       description="Compare an encoded dataset with the stored-row schema and check every row; "
                                   "prints one line per problem (column, rows, fix). Exit 1 when any is an error.")
    p.add_argument("path", help="directory written by `mmpipe encode` (or Dataset.save_to_disk), a .parquet or "
                                ".arrow file, a folder or glob of parquet shards, or an s3:// URL of those")
    p.add_argument("--processor", default=None, metavar="DIR",
                   help="the processor the rows were encoded with (tiled families: exact tile / token counts)")
    p.add_argument("--split", default=None, help="split of a saved DatasetDict (not needed when it holds one)")
    p.add_argument("--no-positions", action="store_true", help="skip recomputing M-RoPE positions (faster)")
    p.add_argument("--json", action="store_true", help="print one JSON object (ok, counts, every issue) instead of text")
