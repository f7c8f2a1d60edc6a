"""``mmpipe validate``: `mmpipe.validate_dataset` from the command line.

::

    mmpipe validate enc/                              # schema + every row; exit 1 on an error
    mmpipe validate enc/ --processor testing:gemma3   # tiled rows: + tile and token counts

Prints the `mmpipe.data.report.ValidationReport` (one line per problem: column, rows, fix).
Exit status: 0 clean (warnings allowed), 1 errors, 2 bad arguments (no such dataset, a
processor that does not load).
"""

from __future__ import annotations

from mmpipe.cli.encode import CLIError, load_processor

__all__ = ["add_validate_parser", "run_validate"]


def run_validate(args) -> int:
    """``mmpipe validate``; returns the exit status."""
    import datasets

    from mmpipe.data.validate import validate_dataset
    from mmpipe.errors import ArgumentError

    datasets.disable_progress_bars()
    processor = load_processor(args.processor) if args.processor else None
    try:
        report = validate_dataset(args.path, processor=processor, positions=not args.no_positions)
    except ArgumentError as e:
        raise CLIError(str(e)) from None
    print(report)
    return 0 if report.ok else 1


def add_validate_parser(sub) -> None:
    p = sub.add_parser("validate", help="check an encoded dataset's schema and rows (mmpipe.validate_dataset)",
                       description="Compare an encoded dataset with the stored-row schema and check every row; "
                                   "prints one line per problem (column, rows, fix). Exit 1 when any is an error.")
    p.add_argument("path", help="directory written by `mmpipe encode` (or Dataset.save_to_disk), .parquet or .arrow")
    p.add_argument("--processor", default=None, metavar="DIR",
                   help="the processor the rows were encoded with (tiled families: exact tile / token counts)")
    p.add_argument("--no-positions", action="store_true", help="skip recomputing M-RoPE positions (faster)")
