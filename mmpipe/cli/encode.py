"""``mmpipe encode``: a local raw dataset -> an encoded dataset saved with ``save_to_disk``.

::

    mmpipe encode rows.jsonl --processor /models/Qwen2.5-VL-3B-Instruct --out enc/ --num-proc 4
    mmpipe encode data.parquet --processor testing:qwen2_vl --out enc/ --max-length 2048 --truncation drop

Inputs (`load_raw`; one that cannot be read, e.g. a line that is not a JSON object or not UTF-8, is
named, checked before the reader runs: `mmpipe.cli.json_input`):

- ``.jsonl`` / ``.json`` (JSON lines or one JSON list): rows in any format `mmpipe.encode`
  accepts. Images are paths, relative to the file's directory or absolute, ``file://`` paths
  or ``data:image/...;base64,`` URIs, in the ``images`` column and/or inline in content
  items (``{"type": "image", "image": "cat.png"}``); video and audio file paths in the videos and
  audios columns are relative to the file's directory too (`mmpipe.cli.resolve.resolve_media_paths`);
- ``.parquet``: the same; a ``datasets.Image()`` column (``{"bytes", "path"}``) works as is;
- a directory written by ``Dataset.save_to_disk`` (a ``DatasetDict`` needs ``--split``).

Every image reference of a file input is resolved before encoding (`mmpipe.cli.resolve`): inline items become
``{"type": "image"}`` placeholders and their images move, in order, into the images column
as ``datasets.Image(decode=False)`` values, so paths relative to the input file's directory work
(never the working directory) and a missing file, a non-file (FIFO, device, ...) or a path
outside ``--image-root`` is reported with its row before any pixel is decoded (under
``--on-error skip``: recorded in the report with that reason). A saved dataset is encoded as is
(bytes or absolute paths).

The processor (`load_processor`): a saved processor or model directory (offline), or ``testing:FAMILY``.
Rows are encoded by `mmpipe.encode_dataset`, saved next to ``--out`` and moved there when complete
(a failed or interrupted run leaves ``--out`` as it was) with the run record ``mmpipe_encode.json``
(input, processor, options, rows in/out, dropped rows by reason) that ``mmpipe inspect`` reads.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from mmpipe.cli.json_input import columnar_problem, json_object, json_problem, wrapped_problem
from mmpipe.cli.resolve import (ImageResolver, explain_failures, resolve_images, resolve_media_paths,  # noqa: F401
                                resolver_errors)

REPORT_FILE = "mmpipe_encode.json"


class CLIError(Exception):
    """A user-facing error: printed as ``mmpipe <command>: <message>``, exit status 2."""


# ---- processor ---------------------------------------------------------------------------
def load_processor(spec: str, *, log=None):
    """``--processor``: ``testing:FAMILY`` or a local directory -> a processor (see
    `mmpipe.processors.load_processor`); its errors become `CLIError` (exit status 2)."""
    from mmpipe.processors import ProcessorLoadError
    from mmpipe.processors import load_processor as _load

    try:
        return _load(spec, log=log)
    except ProcessorLoadError as e:
        raise CLIError(f"--{e}") from None


# ---- raw rows ----------------------------------------------------------------------------
def input_format(path: Path) -> str:
    """"json" | "parquet" | "saved" (a ``save_to_disk`` directory). Raises `CLIError`."""
    if path.is_dir():
        if (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
            return "saved"
        raise CLIError(f"input {str(path)!r} is a directory but not one written by Dataset.save_to_disk "
                       "(no dataset_info.json / dataset_dict.json); pass a .jsonl, .json or .parquet file or a saved dataset")
    if not path.exists():
        raise CLIError(f"input {str(path)!r} does not exist; pass a .jsonl, .json or .parquet file or a "
                       "directory written by Dataset.save_to_disk")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "json"
    if suffix in (".parquet", ".pq"):
        return "parquet"
    raise CLIError(f"input {str(path)!r}: unknown file type {suffix!r}; expected .jsonl, .json or .parquet "
                   "(or a directory written by Dataset.save_to_disk)")


def load_raw(path: Path, *, split: Optional[str] = None, cache_dir: Optional[str] = None,
             field: Optional[str] = None):
    """The raw rows of ``path`` as a ``datasets.Dataset`` (see the module docstring); `CLIError`
    when it cannot be read (a JSON line that is not a row names its line), holds no rows, is one
    object of column lists (columnar JSON: `columnar_problem`) or of a field holding the rows
    (``{"data": [row, ...]}``: `wrapped_problem`; ``field="data"`` reads them), or is encoded already."""
    import datasets

    fmt = input_format(path)
    if field is not None and fmt != "json":
        raise CLIError(f"--field {field!r}: only a .json file holds its rows in a field ({str(path)!r} is {fmt})")
    if fmt == "saved":
        ds = _load_saved(path, split)
    elif split not in (None, "train"):
        raise CLIError(f"--split {split!r}: a .jsonl/.json/.parquet file is one split (omit --split)")
    else:
        builder = "json" if fmt == "json" else "parquet"
        # before the reader: pyarrow crashes (SIGSEGV) on a first line `null`, reads a later one as a row of nulls
        problem = json_problem(path, quick=True) if fmt == "json" else None
        if problem:
            raise CLIError(f"cannot read {str(path)!r}: {problem}")
        verbosity = datasets.logging.get_verbosity()
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)  # its "Failed to load JSON" line repeats ours
        try:
            ds = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=cache_dir,
                                       **({"field": field} if field is not None else {}))
        except Exception as e:  # noqa: BLE001 - a parse error becomes one clear message
            cause = e.__cause__ or e
            if field is not None:
                raise CLIError(f"cannot read {str(path)!r} with --field {field!r}: it must be one JSON object whose "
                               f"field {field!r} holds the row objects ({type(cause).__name__}: {str(cause)[:200]}); "
                               "a file of rows (one per line, or a JSON list) needs no --field") from None
            where = (json_problem(path) if fmt == "json" else None) or (
                "it holds no rows" if "corresponds to no data" in str(cause) else None)
            if where:
                raise CLIError(f"cannot read {str(path)!r}: {where}") from None
            raise CLIError(f"cannot read {str(path)!r} as {builder}: {type(cause).__name__}: {str(cause)[:400]}; "
                           "every row must have the same column types (e.g. message contents all lists "
                           "or all strings)") from None
        finally:
            datasets.logging.set_verbosity(verbosity)
    if not len(ds):
        raise CLIError(f"input {str(path)!r} holds no rows; nothing to encode")
    columnar = (columnar_problem(ds) or wrapped_problem(ds, path)) if fmt == "json" else None
    if columnar:  # {"messages": [...], "images": [...]} or {"data": [row, ...]}: datasets reads ONE row
        raise CLIError(f"cannot read {str(path)!r} as rows: {columnar}")
    cols = set(ds.column_names)
    if {"input_ids", "family"} <= cols and not cols & {"messages", "prompt", "conversations"}:
        raise CLIError(f"input {str(path)!r} is already encoded (columns input_ids, family); use it as is "
                       f"(mmpipe inspect {path}), or encode the raw rows it was made from")
    return ds


def _load_saved(path: Path, split: Optional[str]):
    """One split of the ``save_to_disk`` directory ``path``."""
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:  # noqa: BLE001 - a damaged or empty save: one line, not a traceback
        raise CLIError(f"cannot read the saved dataset {str(path)!r} ({type(e).__name__}: {str(e)[:200]}); "
                       "re-save it with Dataset.save_to_disk") from None
    if isinstance(ds, datasets.DatasetDict):
        split = next(iter(ds)) if split is None and len(ds) == 1 else split
        if split not in ds:
            raise CLIError(f"input {str(path)!r} holds splits {sorted(ds)}" + (f", no split {split!r}" if split else "")
                           + "; pick one with --split")
        ds = ds[split]
    elif split is not None:
        raise CLIError(f"--split {split!r}: {str(path)!r} is one Dataset, not a DatasetDict (omit --split)")
    return ds


# ---- the command -------------------------------------------------------------------------
def dir_bytes(path: Path) -> int:
    """Bytes of every file under ``path`` (a saved dataset's size on disk)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def encode_options(args) -> dict:
    """The `mmpipe.Encoder` options of the parsed ``mmpipe encode`` arguments."""
    opts: dict[str, Any] = {"truncation": args.truncation, "labels": not args.no_labels,
                            "images_column": args.images_column}
    if getattr(args, "end_of_turn", "template") != "template":
        opts["end_of_turn"] = args.end_of_turn
    # options not given are left to the encoder (no --pixels: uint8, the generic path's float32 outputs)
    given = {"pixels": args.pixels, "max_length": args.max_length, "min_pixels": args.min_pixels,
             "max_pixels": args.max_pixels, "audio": getattr(args, "audio", None)}
    opts.update({k: v for k, v in given.items() if v is not None})
    for name in ("videos_column", "audios_column"):
        if getattr(args, name, None):
            opts[name] = getattr(args, name)
    if getattr(args, "use_audio_in_video", False):
        opts["use_audio_in_video"] = True
    if getattr(args, "video_fps", None) is not None:
        if not args.video_fps > 0:
            raise CLIError(f"--video-fps must be a positive number of frames a second, got {args.video_fps}")
        opts["video_options"] = {"fps": args.video_fps}
    for name in ("chat_template_kwargs", "images_kwargs"):  # JSON objects (`json_object`)
        if getattr(args, name, None):
            opts[name] = getattr(args, name)
    if args.on_error != "raise":
        opts["on_error"] = args.on_error
    if getattr(args, "image_root", None) is not None:
        root = Path(args.image_root).expanduser()
        if not root.is_dir():
            raise CLIError(f"--image-root {args.image_root!r} is not a directory")
        opts["image_root"] = str(root.resolve())
    return opts


def run_encode(args) -> int:
    """``mmpipe encode``; returns the exit status (0 ok, 1 a row failed, 2 bad arguments). The steps:
    check the paths (`check_out_dir`; numbers: `mmpipe.cli.main.check_numbers`), load the processor, encode
    into a staging directory (`staging_dir`, `encode_to_disk`), add the run record and move it (`publish`)."""
    import datasets

    import mmpipe

    t0 = time.perf_counter()
    src = Path(args.input).expanduser()
    out = Path(args.out).expanduser()
    fmt = input_format(src)
    check_out_dir(out, src, overwrite=args.overwrite)
    if args.quiet:
        datasets.disable_progress_bars()
    options = encode_options(args)  # before the processor loads: a bad --image-root fails fast
    staging = staging_dir(out.resolve())  # (a symlink's target) an unwritable --out fails before any row
    try:
        processor = load_processor(args.processor)
        fam = mmpipe.families.resolve_family(processor)  # the generic path's processors too
        report = encode_to_disk(args, src, fmt, staging, processor, options)
        seconds = time.perf_counter() - t0
        publish(staging, out.resolve(), run_record(args, src, fmt, fam.name, options, report, seconds))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"{report}")
    print(f"saved to {out} ({dir_bytes(out) / 1e6:.2f} MB, family {fam.name}, pixels {options['pixels']}) "
          f"in {seconds:.1f} s; look at it with: mmpipe inspect {out}")
    return 0


def check_out_dir(out: Path, src: Path, *, overwrite: bool) -> None:
    """``--out`` must be new, empty, or (with ``--overwrite``) a saved dataset, and neither the
    input nor a directory holding it."""
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {str(out)!r} is a file, not a directory; pass a directory to save the dataset to")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise CLIError(f"--out {str(out)!r} exists and is not empty; pass --overwrite or another directory")
        if not any((out / f).is_file() for f in ("state.json", "dataset_dict.json", REPORT_FILE)):
            raise CLIError(f"--out {str(out)!r} is not a saved dataset; --overwrite only replaces one "
                           "(refusing to delete another directory)")
        if out.resolve() in src.resolve().parents:
            raise CLIError(f"--out {str(out)!r} holds the input {str(src)!r}; --overwrite would delete it: "
                           "pick another --out")
    if out.resolve() == src.resolve():
        raise CLIError("--out must differ from the input")


def staging_dir(out: Path) -> Path:
    """A new empty directory next to ``out`` that the run saves into (`publish` moves it to ``out``)."""
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"  # mkdir: the umask's mode, as save_to_disk's
    try:
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed run of the same process id
        staging.mkdir(parents=True)
        return staging
    except OSError as e:
        raise write_failed(out, e, "cannot write there") from None


def write_failed(out: Path, error: OSError, what: str = "writing the dataset failed") -> CLIError:
    """An OSError writing ``--out`` (unwritable, disk full) -> `CLIError`; ``--out`` is left as it was."""
    return CLIError(f"--out {str(out)!r}: {what} ({type(error).__name__}: {error}); --out was left as it was: "
                    "free some space or pick a directory you can write to")


def publish(staging: Path, out: Path, record: dict) -> None:
    """Write the run ``record`` into ``staging``, move it to ``out``; an old dataset there goes last."""
    old = staging.with_name(staging.name + "-old")
    try:
        (staging / REPORT_FILE).write_text(json.dumps(record, indent=2) + "\n")
        if out.is_dir() and any(out.iterdir()):
            os.replace(out, old)
        os.replace(staging, out)  # onto a missing or empty directory
    except OSError as e:
        if old.exists() and not out.exists():
            os.replace(old, out)
        raise write_failed(out, e) from None
    shutil.rmtree(old, ignore_errors=True)


def encode_to_disk(args, src: Path, fmt: str, out: Path, processor, options: dict):
    """Load the raw rows, resolve their images, encode (`mmpipe.encode_dataset`) and save
    to ``out`` (a new or empty directory); returns the `EncodeReport`. Intermediate Arrow files
    go to a temporary directory (never next to the user's input): only the saved result stays."""
    import datasets

    import mmpipe

    num_proc = args.num_proc if args.num_proc and args.num_proc > 1 else None
    caching = datasets.is_caching_enabled()
    datasets.disable_caching()
    try:
        with tempfile.TemporaryDirectory(prefix="mmpipe-encode-") as tmp:
            raw = load_raw(src, split=args.split, cache_dir=tmp, field=getattr(args, "field", None))
            if args.limit is not None:
                raw = raw.select(range(min(args.limit, len(raw))))
            unresolved: dict = {}
            if fmt != "saved":  # a saved dataset's images are bytes or absolute paths already
                raw = resolve_images(raw, src.parent.resolve(), images_column=args.images_column, num_proc=num_proc,
                                     strict=options.get("on_error", "raise") == "raise",
                                     image_root=options.get("image_root"))
                raw, unresolved = resolver_errors(raw)  # --on-error skip: their reasons, for the report
                raw = resolve_media_paths(raw, src.parent.resolve(), [options.get("videos_column", "videos"),
                                                                      options.get("audios_column", "audios")],
                                          num_proc=num_proc)
            try:
                enc, report = mmpipe.encode_dataset(raw, processor, num_proc=num_proc, batch_size=args.batch_size,
                                                    keep_columns=getattr(args, "keep_columns", []), **options)
            except mmpipe.errors.ArgumentError as e:  # --keep-columns naming no input column, an option refused
                raise CLIError(("--keep-columns: " if "keep_columns" in str(e) else "") + str(e)) from None
            report.errors = explain_failures(report.errors, unresolved)
            options.setdefault("pixels", mmpipe.records.columns.stored_pixel_format(enc.column_names))
            try:
                enc.save_to_disk(str(out), num_proc=num_proc)
            except OSError as e:  # disk full, a read-only file system, ...
                raise write_failed(Path(args.out), e) from None
    finally:
        if caching:
            datasets.enable_caching()
    return report


def run_record(args, src: Path, fmt: str, family: str, options: dict, report, seconds: float) -> dict:
    """What ``mmpipe_encode.json`` holds: input, processor, options, rows in/out, dropped rows
    by reason, row errors (``{"row", "stage", "column", "reason"}``), time, version."""
    import mmpipe

    return {
        "input": str(src.resolve()), "input_format": fmt, "processor": args.processor, "family": family,
        "options": options, "rows_in": report.rows_in, "rows_out": report.rows_out, "dropped": report.dropped,
        "errors": list(getattr(report, "errors", None) or []),  # {"row", "stage", "column", "reason"}
        "keep_columns": list(getattr(args, "keep_columns", [])),  # input columns kept next to the encoded ones
        "seconds": round(seconds, 3), "mmpipe_version": mmpipe.__version__,
    }


def add_encode_parser(sub) -> None:
    from mmpipe.encoding.encoder import ERROR_POLICIES, TRUNCATION_POLICIES
    from mmpipe.encoding.spans import END_OF_TURN
    from mmpipe.media.processor_encode import AUDIO_STORAGE
    from mmpipe.records.columns import ENCODE_PIXEL_FORMATS

    p = sub.add_parser("encode", help="encode a local dataset (jsonl/json/parquet/saved dir) and save it",
                       description="Encode raw chat rows with images into mmpipe rows (input_ids, grids, M-RoPE "
                                   "positions, compact pixels) and save them with Dataset.save_to_disk.")
    p.add_argument("input", help="a .jsonl/.json/.parquet file or a directory written by Dataset.save_to_disk")
    p.add_argument("--processor", required=True, metavar="DIR",
                   help="saved processor/model directory, or testing:FAMILY (offline test processors: qwen2_vl ... gemma3)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to save the encoded dataset to")
    p.add_argument("--split", default=None, help="split of a saved DatasetDict")
    p.add_argument("--field", default=None, metavar="NAME",
                   help="a .json file of one object holding the rows in this field ({\"data\": [row, ...]})")
    p.add_argument("--num-proc", type=int, default=None, help="datasets.map processes (default: in-process)")
    p.add_argument("--batch-size", type=int, default=None, help="rows per map batch (default: mmpipe.map_kwargs, <= 64)")
    p.add_argument("--max-length", type=int, default=None, help="token budget per row, image tokens included")
    p.add_argument("--truncation", choices=TRUNCATION_POLICIES, default="raise",
                   help="over --max-length: raise, drop the row (counted), or truncate_text (default: %(default)s)")
    p.add_argument("--pixels", choices=ENCODE_PIXEL_FORMATS, default=None,
                   help="stored pixels: uint8, processor float32, none (layout only), source (image files) (default: "
                        "uint8; the generic path: the processor's own float32 outputs)")
    p.add_argument("--images-column", default="images", help="column holding the images (default: %(default)s)")
    p.add_argument("--videos-column", default=None, help="column holding the videos (default: videos)")
    p.add_argument("--audios-column", default=None, help="column holding the audio clips (default: audios)")
    p.add_argument("--audio", choices=AUDIO_STORAGE, default=None,
                   help="stored audio clips: the processor's features, or source (each clip's file; collate computes "
                        "the features) (default: features)")
    p.add_argument("--use-audio-in-video", action="store_true",
                   help="encode each video with its sound track (the Omni thinkers: Qwen2.5-Omni, Qwen3-Omni)")
    p.add_argument("--video-fps", type=float, default=None, metavar="FPS",
                   help="frames sampled per second of video (default: 2.0, as qwen-vl-utils)")
    p.add_argument("--min-pixels", type=int, default=None, help="override the processor's min_pixels")
    p.add_argument("--max-pixels", type=int, default=None, help="override the processor's max_pixels")
    p.add_argument("--chat-template-kwargs", type=json_object("--chat-template-kwargs"), default=None, metavar="JSON",
                   help="chat template keywords as a JSON object, e.g. '{\"enable_thinking\": false}' or "
                        "'{\"add_vision_id\": true}' (as apply_chat_template(..., **kwargs))")
    p.add_argument("--images-kwargs", type=json_object("--images-kwargs"), default=None, metavar="JSON",
                   help="the processor call's image options of a tiled family as a JSON object, e.g. "
                        "'{\"do_pan_and_scan\": true}' (Gemma 3)")
    p.add_argument("--no-labels", action="store_true", help="do not store labels (e.g. RL prompts)")
    p.add_argument("--end-of-turn", choices=END_OF_TURN, default="template",
                   help="labels after each reply: what the chat template marks (template), or also the family's "
                        "stop token, appended where the template writes none (stop_token) (default: %(default)s)")
    p.add_argument("--on-error", choices=ERROR_POLICIES, default="raise",
                   help="a row that fails to encode: stop (raise) or leave it out and list it in the report (skip)")
    p.add_argument("--image-root", default=None, metavar="DIR",
                   help="refuse image paths that resolve (symlinks, ..) outside DIR: for untrusted datasets")
    p.add_argument("--keep-columns", type=lambda v: [c.strip() for c in v.split(",") if c.strip()], default=[], metavar="A,B",
                   help="input columns kept next to the encoded ones, e.g. id,data_source,reward_model,extra_info")
    p.add_argument("--limit", type=int, default=None, help="encode only the first N rows")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
