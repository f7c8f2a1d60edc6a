"""The command line: local files -> saved encoded datasets, and a look at them.

One module per step::

    main.py         the ``mmpipe`` parser, ``judge ping``, exit statuses (main)
    encode.py       ``mmpipe encode``: local rows -> resolved images -> encode -> save_to_disk
                    (run_encode, load_raw, CLIError)
    json_input.py   why a .jsonl / .json input is not rows (null or non-object lines, not UTF-8,
                    one object of columns), said before pyarrow's reader runs (json_problem)
    resolve.py      its image references -> Image(decode=False) values, relative to the input
                    file's directory (resolve_images, ImageResolver)
    inspect.py      ``mmpipe inspect``: counts and histograms of a saved dataset (dataset_stats)
    demo.py         ``python -m mmpipe.cli.demo``: the whole pipeline offline, with checks
    demo_checks.py  the demo's per-batch checks (DemoChecks)

Public names are re-exported lazily (``mmpipe.cli.run_encode``), so ``python -m
mmpipe.cli.demo`` does not find its module imported before it runs; ``main`` is not
re-exported (it is a submodule's name): use ``mmpipe.cli.main.main``.
"""

from __future__ import annotations

from mmpipe._lazy import lazy_exports

_EXPORTS = {
    "mmpipe.cli.encode": ("REPORT_FILE", "CLIError", "load_processor", "input_format", "load_raw",
        "dir_bytes", "encode_options", "run_encode", "check_out_dir",
        "encode_to_disk", "run_record", "add_encode_parser"),
    "mmpipe.cli.inspect": ("BAR_WIDTH", "Distribution", "integer_histogram", "DatasetStats",
        "dataset_stats", "open_encoded", "format_histogram", "format_stats", "run_inspect",
        "add_inspect_parser"),
    "mmpipe.cli.resolve": ("RESOLVE_ERRORS", "ImageResolver", "resolve_images", "resolver_errors",
        "explain_failures"),
    "mmpipe.cli.main": ("DEFAULT_PRIMITIVES",),
    "mmpipe.cli.demo": ("image_pool", "build_rows"),
    "mmpipe.cli.demo_checks": ("SUMMARY_OK", "DemoChecks"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS, globals())
