"""A phone video's display rotation read from its MP4 / MOV header (`mmpipe.images.mp4_rotation`)
instead of decoding its first frame: the same quarter turn as the decoded frame shows (PyAV's
``frame.rotation``) for every angle and layout, layout-only rows equal to the pixel rows' layout,
no frame decoded for a layout-only MP4, and every header the reader does not answer plainly (a
flip, a movie matrix, a damaged box, another container) left to the decoded frame."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

import mmpipe
from mmpipe.images import video_container
from mmpipe.images.mp4_rotation import mp4_rotation_degrees
from mmpipe.images.video_container import Container

av = pytest.importorskip("av")

from helpers import make_video  # noqa: E402

ANGLES = [0, 15, 30, 44.99, 45, 45.01, 89.5, 90, 134.99, 135, 135.01, 180, 225, 270, -90, -135, 315, 359]


def _decoded_rotation(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as c:
        return next(c.decode(video=0)).rotation


@pytest.mark.parametrize("fmt, movflags", [("mp4", None), ("mov", None), ("mp4", "frag_keyframe+empty_moov")])
def test_the_header_says_what_the_decoded_frame_says(fmt, movflags):
    for angle in ANGLES:
        data = make_video(2, 4, 16, 24, fmt=fmt, rotation=angle, movflags=movflags)
        c = Container(data, "row 0")
        assert c._header_rotation() == _decoded_rotation(data), (angle, fmt, movflags)
        assert sum(1 for _ in c.frames()) == 2  # the file is read on from where PyAV left it
        c.close()


@pytest.fixture(scope="module")
def proc():
    from mmpipe import testing

    return testing.build_processor("qwen2_vl")


def _row(video) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}],
            "videos": [video]}


@pytest.mark.parametrize("angle", [90, 180, 270])
def test_layout_only_rows_of_rotated_mp4s_decode_no_frame(proc, monkeypatch, tmp_path, angle):
    """Layout-only rows of a rotated MP4 (as a path and as bytes) == the pixel rows' ids, grids and
    positions, without a frame decoded; a Matroska file's rotation still comes from its first frame."""
    data = make_video(8, 4, 48, 96, fmt="mp4", rotation=angle)
    path = tmp_path / "v.mp4"
    path.write_bytes(data)
    full = mmpipe.encode_row(_row(str(path)), proc)
    decodes = []
    real = Container._next_frame
    monkeypatch.setattr(Container, "_next_frame", lambda self: decodes.append(1) or real(self))
    for value in (str(path), data):
        row = mmpipe.encode_row(_row(value), proc, pixels="none")
        assert row.video_grid_thw.tolist() == full.video_grid_thw.tolist()
        np.testing.assert_array_equal(row.input_ids, full.input_ids)
        np.testing.assert_array_equal(row.position_ids, full.position_ids)
    assert decodes == []
    mkv = make_video(8, 4, 48, 96, fmt="matroska")
    mmpipe.encode_row(_row(mkv), proc, pixels="none")
    assert decodes == [1]


def _patched(data: bytes, box: bytes, offset: int, values: tuple) -> bytes:
    """``data`` with the 9-value matrix of the first ``box`` (at ``offset`` past its version/flags) replaced."""
    at = data.index(box) + 4 + 4 + offset
    return data[:at] + struct.pack(">9i", *values) + data[at + 36:]


def test_headers_not_answered_plainly_are_left_to_the_decoded_frame(proc):
    """A flipped track matrix, a rotated movie matrix and a cut header give no header answer (None),
    so the decoded frame decides, as before; the rows still encode as they did."""
    plain = make_video(4, 4, 32, 48, fmt="mp4")
    mirrored = _patched(plain, b"tkhd", 4 * 5 + 8 + 2 * 4, (-0x10000, 0, 0, 0, 0x10000, 0, 0, 0, 0x40000000))
    movie = _patched(plain, b"mvhd", 4 * 5 + 2 + 10, (0, 0x10000, 0, -0x10000, 0, 0, 0, 0, 0x40000000))
    assert mp4_rotation_degrees(io.BytesIO(plain)) == 0.0
    for data in (mirrored, movie, plain[: plain.index(b"moov") + 40]):
        assert mp4_rotation_degrees(io.BytesIO(data)) is None
    for data in (mirrored, movie):
        c = Container(data, "row 0")
        assert c._header_rotation() is None
        assert c.rotation() == int(round(_decoded_rotation(data) / 90)) % 4
        c.close()
        row = mmpipe.encode_row(_row(data), proc, pixels="none")
        assert row.video_grid_thw.tolist() == mmpipe.encode_row(_row(data), proc).video_grid_thw.tolist()


def test_a_moov_over_the_bound_is_read_by_decoding(monkeypatch):
    monkeypatch.setattr("mmpipe.images.mp4_rotation.MAX_MOOV_BYTES", 16)
    data = make_video(2, 4, 16, 24, fmt="mp4", rotation=90)
    assert mp4_rotation_degrees(io.BytesIO(data)) is None
    assert video_container.Container(data, "row 0").rotation() == 1
