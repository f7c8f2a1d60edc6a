"""Image paths that are not image files, and image-path confinement (issue 15).

Corpus cases, each with its stated outcome (mergeable into ``tests/bad_inputs.py``):

- ``KINDS``: an image path that is a FIFO, a directory, a symlink loop, a character device
  (/dev/zero), a socket, a missing file, a dangling symlink, or a file over
  ``$MMPIPE_MAX_IMAGE_BYTES`` -> `ImageError` [stage image, column images, row 7, image 0]
  naming the path and what it is, with the fix; the same layout-only (``pixels="none"``),
  through ``datasets.map(mmpipe.encode)`` with string paths, and through ``mmpipe encode``.
  Nothing may hang: every call that could block on a FIFO runs under a timeout.
- ``image_root`` (``Encoder(image_root=DIR)``, ``mmpipe encode --image-root DIR``): a path
  escaping with ``..``, an absolute path outside, a symlink inside pointing outside, a
  ``datasets.Image()`` dict naming an outside file -> `ImageError` naming the path and the root;
  paths inside (absolute, relative, via an inside symlink) and in-memory images -> encoded
  exactly as without the option.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import datasets
import numpy as np
import pytest

import mmpipe
from bad_inputs import ROW, photo, png_bytes, user_row, write
from conftest import processor_for
from mmpipe.cli.main import main
from mmpipe.errors import ArgumentError, ImageError
from mmpipe.images import confine_image, image_hw, load_image, max_image_bytes
from helpers import FIFOS, bounded

FAMILY = "qwen2_vl"


def _fifo(tmp: Path) -> str:
    path = str(tmp / "pipe.png")
    os.mkfifo(path)
    FIFOS.append(path)
    return path


def _socket(tmp: Path) -> str:
    d = tempfile.mkdtemp(prefix="mmpipe-test15-sock-", dir="/tmp")  # AF_UNIX paths are limited to ~100 bytes
    path = os.path.join(d, "s.png")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    _SOCKETS.append(s)
    return path


_SOCKETS: list = []


def _loop(tmp: Path) -> str:
    os.symlink(tmp / "loop_b.png", tmp / "loop_a.png")
    os.symlink(tmp / "loop_a.png", tmp / "loop_b.png")
    return str(tmp / "loop_a.png")


def _dangling(tmp: Path) -> str:
    os.symlink(tmp / "gone.png", tmp / "link.png")
    return str(tmp / "link.png")


def _directory(tmp: Path) -> str:
    (tmp / "dir.png").mkdir()
    return str(tmp / "dir.png")


@dataclass(frozen=True)
class Kind:
    name: str
    make: Callable[[Path], str]  # tmp dir -> the image path
    words: tuple  # what the message must say (besides the path, row and image)


KINDS = [
    Kind("fifo", _fifo, ("is a FIFO (named pipe)", "opens only regular files")),
    Kind("directory", _directory, ("is a directory", "point the path at an image file")),
    Kind("symlink_loop", _loop, ("is a symlink loop", "fix the path")),
    Kind("char_device", lambda tmp: "/dev/zero", ("is a character device", "opens only regular files")),
    Kind("socket", _socket, ("is a socket", "opens only regular files")),
    Kind("missing", lambda tmp: str(tmp / "nope.png"), ("no such file", "a missing path", "fix the path")),
    Kind("dangling_symlink", _dangling, ("no such file", "a dangling symlink")),
    Kind("oversized", lambda tmp: write(tmp, "big.png", png_bytes(photo(64, 64))),
         ("more than the 100-byte limit", "MMPIPE_MAX_IMAGE_BYTES")),
]


def _assert_names(e: ImageError, path: str, words: tuple, row=ROW) -> None:
    msg = str(e)
    assert e.stage == "image" and e.column == "images", (e.stage, e.column)
    assert f"row {row}, image 0" in msg and path in msg, msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("pixels", ["uint8", "none"])
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_non_file_path_is_a_named_image_error(kind, pixels, tmp_path, monkeypatch):
    path = kind.make(tmp_path)
    if kind.name == "oversized":
        monkeypatch.setenv("MMPIPE_MAX_IMAGE_BYTES", "100")
    with pytest.raises(ImageError) as info:
        bounded(mmpipe.encode_row, user_row([path]), processor_for(FAMILY), idx=ROW, pixels=pixels)
    _assert_names(info.value, path, kind.words)


def test_kinds_through_datasets_dict_and_file_url(tmp_path):
    """The same check for a ``datasets.Image()`` dict and a ``file://`` path."""
    fifo = _fifo(tmp_path)
    for value in ({"bytes": None, "path": fifo}, "file://" + fifo):
        with pytest.raises(ImageError, match="is a FIFO"):
            bounded(load_image, value)
        with pytest.raises(ImageError, match="is a FIFO"):
            bounded(image_hw, value)


def test_bound_reads_env_and_refuses_nonsense(monkeypatch, tmp_path):
    monkeypatch.delenv("MMPIPE_MAX_IMAGE_BYTES", raising=False)
    assert max_image_bytes() == 256 * 2**20
    monkeypatch.setenv("MMPIPE_MAX_IMAGE_BYTES", "lots")
    with pytest.raises(ArgumentError, match="MMPIPE_MAX_IMAGE_BYTES"):
        load_image(write(tmp_path, "a.png", png_bytes(photo())))
    data = png_bytes(photo())
    monkeypatch.setenv("MMPIPE_MAX_IMAGE_BYTES", str(len(data)))  # exactly at the bound: read
    assert load_image(write(tmp_path, "b.png", data)).size == (60, 40)


def test_regular_path_encodes_as_before(tmp_path):
    """A plain file path encodes exactly as the same image given as bytes."""
    proc = processor_for(FAMILY)
    data = png_bytes(photo())
    by_path = mmpipe.encode_row(user_row([write(tmp_path, "a.png", data)]), proc, idx=ROW)
    by_bytes = mmpipe.encode_row(user_row([data]), proc, idx=ROW)
    np.testing.assert_array_equal(by_path.pixel_values_u8, by_bytes.pixel_values_u8)
    np.testing.assert_array_equal(by_path.input_ids, by_bytes.input_ids)


def test_datasets_map_with_string_paths(tmp_path):
    """A plain ``ds.map(mmpipe.encode)`` over string paths: the FIFO row fails, naming itself
    (before: the map blocked forever); under ``on_error="skip"`` the row is recorded."""
    good = write(tmp_path, "a.png", png_bytes(photo()))
    rows = [user_row([good]), user_row([_fifo(tmp_path)]), user_row([_directory(tmp_path)])]
    ds = datasets.Dataset.from_list(rows)
    proc = processor_for(FAMILY)
    with pytest.raises(ImageError, match=r"row 1, image 0: image path .*pipe.png' is a FIFO"):
        bounded(ds.map, mmpipe.encode, fn_kwargs={"processor": proc}, with_indices=True,
                remove_columns=ds.column_names)
    enc, report = bounded(mmpipe.encode_dataset, ds, proc, on_error="skip")
    assert len(enc) == 1 and [e["row"] for e in report.errors] == [1, 2]
    assert ["is a FIFO" in e["reason"] for e in report.errors] == [True, False]
    assert "is a directory" in report.errors[1]["reason"] and {e["stage"] for e in report.errors} == {"image"}


# ---- image_root ----------------------------------------------------------------------------
@pytest.fixture
def tree(tmp_path):
    """root/ with imgs/a.png, a symlink inside -> outside, one inside -> inside; secret.png outside."""
    root = tmp_path / "root"
    (root / "imgs").mkdir(parents=True)
    data = png_bytes(photo())
    write(root / "imgs", "a.png", data)
    secret = write(tmp_path, "secret.png", png_bytes(photo(seed=5)))
    os.symlink(secret, root / "imgs" / "out.png")
    os.symlink(root / "imgs" / "a.png", root / "in.png")
    return {"root": root, "secret": secret, "data": data, "inside": str(root / "imgs" / "a.png")}


def _outside_values(tree) -> dict:
    root = tree["root"]
    return {
        "dotdot": str(root / "imgs" / ".." / ".." / "secret.png"),
        "absolute": tree["secret"],
        "symlink_out": str(root / "imgs" / "out.png"),
        "dict_path": {"bytes": None, "path": tree["secret"]},
        "file_url": "file://" + tree["secret"],
    }


@pytest.mark.parametrize("pixels", ["uint8", "none"])
@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink_out", "dict_path", "file_url"])
def test_image_root_refuses_paths_outside(case, pixels, tree):
    value = _outside_values(tree)[case]
    with pytest.raises(ImageError) as info:
        mmpipe.encode_row(user_row([value]), processor_for(FAMILY), idx=ROW, pixels=pixels,
                          image_root=str(tree["root"]))
    e = info.value
    path = value["path"] if isinstance(value, dict) else value.removeprefix("file://")
    _assert_names(e, path, ("outside the image root", os.path.realpath(tree["root"]), "image_root"))
    assert os.path.realpath(tree["secret"]) in str(e)


@pytest.mark.parametrize("case", ["absolute", "relative", "symlink_in", "bytes_named_outside", "pil"])
def test_image_root_allows_inside_and_in_memory(case, tree, monkeypatch):
    """Inside the root (and in-memory images, whatever their name): encoded exactly as without it."""
    monkeypatch.chdir(tree["root"])
    value = {"absolute": tree["inside"], "relative": "imgs/a.png", "symlink_in": "in.png",
             "bytes_named_outside": {"bytes": tree["data"], "path": tree["secret"]},
             "pil": load_image(tree["data"])}[case]
    proc = processor_for(FAMILY)
    got = mmpipe.encode_row(user_row([value]), proc, idx=ROW, image_root=str(tree["root"]))
    want = mmpipe.encode_row(user_row([tree["data"]]), proc, idx=ROW)
    np.testing.assert_array_equal(got.pixel_values_u8, want.pixel_values_u8)
    np.testing.assert_array_equal(got.input_ids, want.input_ids)


def test_image_root_must_be_a_directory(tree):
    proc = processor_for(FAMILY)
    for bad in (str(tree["root"] / "missing"), tree["secret"], 5):
        with pytest.raises(ArgumentError, match="image_root must be an existing directory"):
            mmpipe.Encoder(proc, image_root=bad)
    confine_image(b"not a path", str(tree["root"]))  # in-memory values pass


def test_image_root_through_datasets_map(tree):
    ds = datasets.Dataset.from_list([user_row([tree["inside"]]), user_row([tree["secret"]])])
    with pytest.raises(ImageError, match=r"row 1, image 0: image path .*secret.png.* outside the image root"):
        ds.map(mmpipe.encode, fn_kwargs={"processor": processor_for(FAMILY), "image_root": str(tree["root"])},
               with_indices=True, remove_columns=ds.column_names)


# ---- mmpipe encode -------------------------------------------------------------------------
def _cli(*args, timeout=300):
    """``python -m mmpipe.cli encode ...`` in a process; a hang fails via TimeoutExpired (a hang
    guard: one call imports mmpipe and builds a processor, ~9-11 s on 2 idle cores; 90 s was
    under 10x that, what a loaded CI machine can take)."""
    return subprocess.run([sys.executable, "-m", "mmpipe.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def _jsonl(path: Path, images: list) -> Path:
    path.write_text("".join(json.dumps(user_row([im])) + "\n" for im in images))
    return path


def test_cli_fifo_row_names_itself(tree):
    data = tree["root"] / "data"
    data.mkdir()
    os.symlink(tree["inside"], data / "ok.png")
    fifo = _fifo(data)
    src = _jsonl(data / "rows.jsonl", ["ok.png", "pipe.png"])
    run = _cli("encode", src, "--processor", f"testing:{FAMILY}", "--out", tree["root"] / "out", "--quiet")
    assert run.returncode == 1, run.stderr
    assert "row 1, image 0" in run.stderr and "is a FIFO (named pipe)" in run.stderr, run.stderr
    assert os.path.realpath(fifo) in run.stderr or fifo in run.stderr, run.stderr


def test_cli_image_root(tree, tmp_path):
    """``--image-root``: rows escaping it (``..``, absolute, symlink out) and a FIFO are listed in
    the report under ``--on-error skip``; the row inside is encoded."""
    root = tree["root"]
    fifo = _fifo(root)
    src = _jsonl(root / "rows.jsonl", ["imgs/a.png", "../secret.png", tree["secret"], "imgs/out.png", fifo])
    out = tmp_path / "out"
    run = _cli("encode", src, "--processor", f"testing:{FAMILY}", "--out", out, "--image-root", root,
               "--on-error", "skip", "--quiet")
    assert run.returncode == 0, run.stderr
    record = json.loads((out / "mmpipe_encode.json").read_text())
    assert record["rows_out"] == 1 and record["options"]["image_root"] == str(root.resolve())
    errors = {e["row"]: e for e in record["errors"]}
    assert sorted(errors) == [1, 2, 3, 4] and {e["stage"] for e in errors.values()} == {"image"}
    for r in (1, 2, 3):
        assert "outside the image root" in errors[r]["reason"], errors[r]
    assert "is a FIFO" in errors[4]["reason"]
    # raise mode: the resolver refuses the first escaping row before any pixel is decoded
    run = _cli("encode", src, "--processor", f"testing:{FAMILY}", "--out", tmp_path / "out2", "--image-root", root)
    assert run.returncode == 1 and "row 1, image 0" in run.stderr and "outside the image root" in run.stderr


def test_cli_bad_image_root(tree, capsys):
    src = _jsonl(tree["root"] / "rows.jsonl", ["imgs/a.png"])
    status = main(["encode", str(src), "--processor", f"testing:{FAMILY}", "--out", str(tree["root"] / "o"),
                   "--image-root", str(tree["root"] / "nowhere")])
    assert status == 2 and "--image-root" in capsys.readouterr().err


def teardown_module(module):
    import shutil

    for s in _SOCKETS:
        path = s.getsockname()
        s.close()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)
