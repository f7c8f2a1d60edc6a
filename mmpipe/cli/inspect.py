"""``mmpipe inspect``: what an encoded dataset holds, from its Arrow columns.

::

    mmpipe inspect enc/              # counts, then text histograms
    mmpipe inspect enc/ --json       # one JSON object (the same numbers)

`dataset_stats` reads the stored columns batch by batch (no row is decoded into records,
no pixel is expanded), of any family: rows, tokens (text / image / video / target), images and
videos, stored pixel bytes and what float32 ``pixel_values`` would take, the family and pixel
format, the per-row distributions (tokens per row, images per row, tokens per image), and
the run record ``mmpipe_encode.json`` that ``mmpipe encode`` writes (rows in, dropped rows
by reason, row errors) when it is there, and the failed rows that a plain
``ds.map(mmpipe.encode, fn_kwargs={..., "on_error": "skip"})`` left in the ``mmpipe_error``
column. What is counted per image (patches, tiles, a processor's output values) is the
family's kind's (``fam.media.table_counts``, `mmpipe.media`).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from mmpipe.cli.encode import REPORT_FILE, CLIError, dir_bytes
from mmpipe.errors import ArgumentError
from mmpipe.records.arrow import list_lengths
from mmpipe.records.columns import stored_pixel_format

BAR_WIDTH = 40


@dataclass
class Distribution:
    """Summary of one per-row (or per-image) quantity."""

    count: int
    total: int
    min: Optional[int]
    max: Optional[int]
    mean: Optional[float]
    median: Optional[float]
    p95: Optional[float]
    histogram: list = field(default_factory=list)  # [{"lo", "hi", "count"}], lo <= v <= hi

    @classmethod
    def of(cls, values: np.ndarray, bins: int) -> "Distribution":
        v = np.asarray(values, dtype=np.int64)
        if not v.size:
            return cls(0, 0, None, None, None, None, None, [])
        return cls(
            count=int(v.size), total=int(v.sum()), min=int(v.min()), max=int(v.max()),
            mean=round(float(v.mean()), 3), median=float(np.median(v)),
            p95=float(np.percentile(v, 95)), histogram=integer_histogram(v, bins),
        )


def integer_histogram(values: np.ndarray, bins: int) -> list[dict]:
    """Integer bins covering ``[min, max]``: one bin per value when the range allows it."""
    lo, hi = int(values.min()), int(values.max())
    span = hi - lo + 1
    width = max(1, -(-span // bins))  # ceil: at most `bins` bins of equal integer width
    edges = np.arange(lo, hi + 1, width)
    counts = np.bincount((values - lo) // width, minlength=len(edges))
    return [{"lo": int(e), "hi": int(min(e + width - 1, hi)), "count": int(c)} for e, c in zip(edges, counts)]


@dataclass
class DatasetStats:
    """Counts of an encoded dataset (see the module docstring). ``*_tokens`` are totals."""

    path: str
    rows: int
    families: dict
    pixel_format: str
    tokens: int
    text_tokens: int
    image_tokens: int
    video_tokens: int
    target_tokens: Optional[int]
    images: int
    videos: int
    rows_without_images: int
    image_patches: int
    pixel_bytes: int
    float32_pixel_bytes: int
    disk_bytes: int
    tokens_per_row: Distribution
    images_per_row: Distribution
    tokens_per_image: Distribution
    encode_report: Optional[dict]
    # rows of a plain ``ds.map(encode, on_error="skip")`` that failed: still in the dataset as
    # empty rows, their errors in the ``mmpipe_error`` column ({"row", "stage", "column", "reason"})
    failed_rows: list = field(default_factory=list)
    image_unit: str = "patches"  # what image_patches counts (the kind's PIXEL_UNIT: patches, tiles, ...)
    float32_unknown: Optional[str] = None  # why float32_pixel_bytes is unknown (no stored tile size)

    def to_dict(self) -> dict:
        return asdict(self)


def _per_row_count(list_array, value: int, *, negate: bool = False) -> np.ndarray:
    """Per row of a ``list<int>`` Arrow array: how many elements equal (or differ from) ``value``."""
    import pyarrow.compute as pc

    lengths = list_lengths(list_array)
    flat = pc.list_flatten(list_array).to_numpy(zero_copy_only=False)
    hit = (flat != value) if negate else (flat == value)
    cs = np.concatenate([[0], np.cumsum(hit, dtype=np.int64)])
    ends = np.cumsum(lengths)
    return cs[ends] - cs[ends - lengths]


def dataset_stats(path, *, split: Optional[str] = None, bins: int = 10, batch_size: int = 1024,
                  progress: bool = True) -> DatasetStats:
    """Stats of the encoded dataset saved at ``path`` (``Dataset.save_to_disk`` directory).

    The steps: open it (`open_encoded`), tally each Arrow batch (`_Tally.add`), then the
    distributions and the run record (`_Tally.stats`)."""
    import datasets

    for name, value in (("bins", bins), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ArgumentError(f"dataset_stats: {name} must be an int >= 1, got {value!r}")
    path = Path(path).expanduser()
    ds = open_encoded(path, split)
    cols = set(ds.column_names)
    pixel_format = stored_pixel_format(cols)
    tally = _Tally(cols, pixel_format)
    it = ds.with_format("arrow").iter(batch_size=batch_size)
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, total=-(-len(ds) // batch_size), desc="mmpipe inspect", unit="batch",
                  disable=not datasets.is_progress_bar_enabled(), file=sys.stderr)
    for table in it:
        tally.add(table)
    return tally.stats(path, len(ds), bins)


def open_encoded(path: Path, split: Optional[str] = None):
    """The ``datasets.Dataset`` saved at ``path`` (one split of a ``DatasetDict``); `CLIError`
    when it is missing, not a saved dataset, or not mmpipe-encoded."""
    import datasets

    if not path.is_dir():
        raise CLIError(f"{str(path)!r} is not a directory; pass a directory written by `mmpipe encode` or "
                       "Dataset.save_to_disk")
    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001
        raise CLIError(f"{str(path)!r} is not a saved dataset ({type(e).__name__}: {str(e)[:200]})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split is None and len(ds) == 1:
            split = next(iter(ds))
        if split not in ds:
            raise CLIError(f"{str(path)!r} holds splits {sorted(ds)}; pick one with --split")
        ds = ds[split]
    missing = [c for c in ("input_ids", "family") if c not in ds.column_names]
    if not missing and len(ds):  # the columns the rows' kind of family counts from (`mmpipe.media`)
        media = _family(ds.select_columns(["family"])[0]["family"], path).media
        missing = [c for c in media.STATS_COLUMNS if c not in ds.column_names]
    if missing:
        raise CLIError(f"{str(path)!r} is not an mmpipe-encoded dataset: column(s) {missing} missing "
                       f"(found {ds.column_names}); encode it first with `mmpipe encode`")
    return ds


def _family(name, path: Path):
    """The family a stored ``family`` value names; `CLIError` for an unknown one."""
    from mmpipe.families import get_family

    try:
        return get_family(name)
    except (ValueError, TypeError):
        raise CLIError(f"{str(path)!r} holds rows of an unknown family {name!r}; encode it with this "
                       "mmpipe (`mmpipe encode`)") from None


class _Tally:
    """The running counts of `dataset_stats`: per-row arrays (one per Arrow batch) and totals."""

    def __init__(self, cols: set, pixel_format: str):
        self.cols, self.pixel_format = cols, pixel_format
        self.tokens, self.img_tok, self.vid_tok, self.targets, self.n_img, self.per_image = [], [], [], [], [], []
        self.failed: list = []
        self.families: Counter = Counter()
        self.n_vid = self.pixel_bytes = self.f32_bytes = 0
        self.units: dict = {}  # image units (patches, tiles, ...) by name
        self.f32_unknown: Optional[str] = None

    def add(self, table) -> None:
        """Count one Arrow batch of stored rows: the text part and the source files here, the
        images by each kind's strategy over its rows (`mmpipe.media`: ``table_counts``)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from mmpipe.families import get_family
        from mmpipe.records.columns import ERROR_COLUMN

        cols = self.cols

        def col(name):
            return table.column(name).combine_chunks()

        fam_col = col("family").to_pylist()
        if ERROR_COLUMN in cols:
            self.failed.extend(json.loads(x) for x in col(ERROR_COLUMN).to_pylist() if x)
        self.families.update(fam_col)
        self.tokens.append(pc.list_value_length(col("input_ids")).to_numpy(zero_copy_only=False))
        for out, code in ((self.img_tok, 1), (self.vid_tok, 2)):  # the generic path marks no media tokens
            out.append(_per_row_count(col("mm_token_type_ids"), code) if "mm_token_type_ids" in cols
                       else np.zeros(table.num_rows, np.int64))
        if "labels" in cols:
            self.targets.append(_per_row_count(col("labels"), -100, negate=True))
        names = np.asarray(fam_col, dtype=object)
        by_kind: dict = {}
        for name in set(fam_col):
            by_kind.setdefault(get_family(name).media, []).append(name)
        for media, fams in by_kind.items():  # one dataset holds one kind; mixed ones count by kind
            rows = table if len(by_kind) == 1 else table.filter(pa.array(np.isin(names, fams)))
            c = media.table_counts(rows, rows.column("family").to_pylist())
            self.units[media.PIXEL_UNIT] = self.units.get(media.PIXEL_UNIT, 0) + c["units"]
            self.n_img.append(c["images_per_row"])
            self.per_image.append(c["tokens_per_image"])
            self.n_vid += c["videos"]
            self.pixel_bytes += c["pixel_bytes"]
            self.f32_bytes += c["float32_bytes"]
            self.f32_unknown = self.f32_unknown or c.get("float32_unknown")
        if "image_sources" in cols:  # pixels="source": the encoded image files themselves
            files = pc.list_flatten(col("image_sources"))
            self.pixel_bytes += int(pc.sum(pc.binary_length(files)).as_py() or 0)

    def stats(self, path: Path, rows: int, bins: int) -> DatasetStats:
        """The totals and distributions, with the run record found next to the data."""
        def cat(parts) -> np.ndarray:
            return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

        tok, itok, vtok, nimg = cat(self.tokens), cat(self.img_tok), cat(self.vid_tok), cat(self.n_img)
        has_labels = "labels" in self.cols
        return DatasetStats(
            path=str(path), rows=rows, families=dict(self.families), pixel_format=self.pixel_format,
            tokens=int(tok.sum()), text_tokens=int(tok.sum() - itok.sum() - vtok.sum()),
            image_tokens=int(itok.sum()), video_tokens=int(vtok.sum()),
            target_tokens=int(cat(self.targets).sum()) if has_labels else None,
            images=int(nimg.sum()), videos=self.n_vid, rows_without_images=int((nimg == 0).sum()),
            image_patches=sum(self.units.values()), pixel_bytes=self.pixel_bytes,
            float32_pixel_bytes=self.f32_bytes,
            disk_bytes=dir_bytes(path),
            tokens_per_row=Distribution.of(tok, bins), images_per_row=Distribution.of(nimg, bins),
            tokens_per_image=Distribution.of(cat(self.per_image), bins), encode_report=_run_record(path),
            failed_rows=self.failed, image_unit=" + ".join(sorted(self.units)) or "patches",
            float32_unknown=self.f32_unknown,
        )


def _run_record(path: Path) -> Optional[dict]:
    """``mmpipe_encode.json`` of ``mmpipe encode`` when it is there (None otherwise)."""
    report_file = path / REPORT_FILE
    if not report_file.is_file():
        return None
    try:
        record = json.loads(report_file.read_text())
    except ValueError:
        return {"error": f"{REPORT_FILE} is not valid JSON"}
    if not isinstance(record, dict) or not isinstance(record.get("dropped") or {}, dict) or not isinstance(
            record.get("errors") or [], list):  # edited by hand or by another tool: say so, do not crash
        return {"error": f"{REPORT_FILE} is not the run record `mmpipe encode` writes (a JSON object with "
                         "'dropped' {reason: count} and 'errors' [...]); re-encode to get one"}
    return record


# ---- text output -------------------------------------------------------------------------
def _size(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def format_histogram(title: str, d: Distribution) -> list[str]:
    if not d.count:
        return [f"{title}: none"]
    lines = [f"{title} (n={d.count}, min {d.min}, median {d.median:g}, mean {d.mean:g}, p95 {d.p95:g}, max {d.max})"]
    peak = max(b["count"] for b in d.histogram) or 1
    label_w = max(len(f"{b['lo']}-{b['hi']}") for b in d.histogram)
    for b in d.histogram:
        label = f"{b['lo']}" if b["lo"] == b["hi"] else f"{b['lo']}-{b['hi']}"
        bar = "#" * max(1 if b["count"] else 0, round(BAR_WIDTH * b["count"] / peak))
        lines.append(f"  {label.rjust(label_w)} | {bar.ljust(BAR_WIDTH)} {b['count']}")
    return lines


def _error_line(e) -> str:
    if isinstance(e, dict):
        where = ", ".join(str(x) for x in (e.get("stage"), e.get("column") and f"column {e['column']!r}") if x)
        return f"row {e.get('row')}" + (f" ({where})" if where else "") + f": {e.get('reason')}"
    return str(e)


def format_stats(s: DatasetStats) -> str:
    fams = ", ".join(f"{k} ({v} row{'s' * (v != 1)})" for k, v in sorted(s.families.items())) or "-"
    ratio = (f", {s.float32_pixel_bytes / s.pixel_bytes:.1f}x smaller than float32"
             if s.pixel_format in ("uint8", "source") and s.pixel_bytes and s.float32_pixel_bytes else "")
    f32 = (f"an unknown size ({s.float32_unknown})" if s.float32_unknown and not s.float32_pixel_bytes
           else _size(s.float32_pixel_bytes))
    stored = " (the image files; decoded at collate time)" if s.pixel_format == "source" else ""
    lines = [
        f"dataset      {s.path}  ({_size(s.disk_bytes)} on disk)",
        f"rows         {s.rows}  ({s.rows_without_images} without images)",
        f"family       {fams}",
        f"pixels       {s.pixel_format}: {_size(s.pixel_bytes)} stored{stored}; float32 pixel_values would take "
        f"{f32}{ratio}",
        f"images       {s.images}  ({s.image_patches} {s.image_unit})" + (f"; videos {s.videos}" if s.videos else ""),
        f"tokens       {s.tokens} = text {s.text_tokens} + image {s.image_tokens}"
        + (f" + video {s.video_tokens}" if s.video_tokens else "")
        + (f"; targets (labels != -100) {s.target_tokens}" if s.target_tokens is not None else "; no labels"),
    ]
    r = s.encode_report
    if r is None:
        lines.append(f"encode run   no {REPORT_FILE} (not written by `mmpipe encode`): dropped rows unknown")
    elif "error" in r:
        lines.append(f"encode run   {r['error']}")
    else:
        dropped = r.get("dropped") or {}
        why = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items())) or "none"
        lines.append(f"encode run   {r.get('rows_out')} of {r.get('rows_in')} rows encoded from {r.get('input')} "
                     f"with {r.get('processor')}; dropped: {why}")
        errors = r.get("errors") or []
        if errors:
            lines.append(f"failures     {len(errors)} row(s) failed to encode:")
            lines.extend(f"  {_error_line(e)}" for e in errors[:10])
            if len(errors) > 10:
                lines.append(f"  ... {len(errors) - 10} more in {REPORT_FILE}")
    if s.failed_rows:
        lines.append(f"failed rows  {len(s.failed_rows)} row(s) failed to encode and are still in the dataset as empty "
                     "rows (column mmpipe_error; mmpipe.drop_failed removes them):")
        lines.extend(f"  {_error_line(e)}" for e in s.failed_rows[:10])
        if len(s.failed_rows) > 10:
            lines.append(f"  ... {len(s.failed_rows) - 10} more (--json lists all)")
    lines.append("")
    lines += format_histogram("tokens per row", s.tokens_per_row)
    lines += format_histogram("images per row", s.images_per_row)
    lines += format_histogram("tokens per image", s.tokens_per_image)
    return "\n".join(lines)


def run_inspect(args) -> int:
    import datasets

    if args.json or args.quiet:
        datasets.disable_progress_bars()
    stats = dataset_stats(args.path, split=args.split, bins=args.bins, progress=not (args.json or args.quiet))
    print(json.dumps(stats.to_dict(), indent=2) if args.json else format_stats(stats))
    return 0


def add_inspect_parser(sub) -> None:
    p = sub.add_parser("inspect", help="counts and histograms of an encoded dataset",
                       description="Counts (rows, images, tokens, image tokens, pixel bytes, family, pixel format), "
                                   "histograms (tokens per row, images per row, tokens per image) and the dropped / "
                                   "failed rows of a dataset written by `mmpipe encode`.")
    p.add_argument("path", help="directory written by `mmpipe encode` (or Dataset.save_to_disk of encoded rows)")
    p.add_argument("--split", default=None, help="split of a saved DatasetDict")
    p.add_argument("--bins", type=int, default=10, help="histogram bins (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
