"""The layout-only route for videos (`video_layout`: ``pixels="none"``, the container's metadata)
refuses exactly the cut video files the pixel route (`encode_video`: the sampled frames decoded)
refuses, with the same `VideoError`, and accepts every file the pixel route accepts. Swept over
cut offsets of small PyAV-made clips: MP4 and MOV with the ``moov`` box last and first
(``faststart``), Matroska, WebM. Before the fix an MP4 / MOV whose ``moov`` was whole but whose
``mdat`` was cut (a ``faststart`` file cut anywhere in its samples; a cut inside a last ``moov``
at a few offsets) was laid out from its header, and the row failed later in training."""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe.errors import InputError, VideoError
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import encode_video, video_layout
from mmpipe.images.video_container import Container
from mmpipe.testing import build_processor

from helpers import video_file

av = pytest.importorskip("av")

SPEC = VisionSpec(patch_size=14, temporal_patch_size=2, merge_size=2, min_pixels=56 * 56,
                  max_pixels=28 * 28 * 1280, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)


def _clip(fmt: str, codec: str, movflags: str = "", n: int = 16) -> bytes:
    """n frames 48x64 written to a file (``faststart`` rewrites the file after muxing)."""
    return video_file(n, 48, 64, fmt, codec=codec, movflags=movflags or None)


H264 = "libx264" if "libx264" in av.codecs_available else "mpeg4"
CLIPS = {
    "mp4": lambda: _clip("mp4", H264),
    "mp4_faststart": lambda: _clip("mp4", H264, "faststart"),
    "mov_faststart": lambda: _clip("mov", H264, "faststart"),
    "mkv": lambda: _clip("matroska", H264),
    "webm": lambda: _clip("webm", "libvpx"),
}


def _decision(fn, value):
    try:
        return fn(value, SPEC, where="row 2, video 0").grid
    except InputError as e:
        assert "row 2, video 0" in str(e), str(e)
        return f"{type(e).__name__}: {e.args[0] if e.args else e}"


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_layout_route_refuses_the_cuts_the_pixel_route_refuses(name, tmp_path):
    if name == "webm" and "libvpx" not in av.codecs_available:
        pytest.skip("no libvpx encoder")
    data = CLIPS[name]()
    n = len(data)
    refused = 0
    for k in sorted(set(range(0, n, max(1, n // 50))) | set(range(n - 12, n + 1))):
        cut = data[:k]
        want = _decision(encode_video, cut)
        refused += isinstance(want, str)
        assert _decision(video_layout, cut) == want, (name, k, n)
        if k % 5 == 0:
            path = tmp_path / f"cut{k}"
            path.write_bytes(cut)
            assert _decision(video_layout, str(path)) == _decision(encode_video, str(path)), (name, k, "path")
    assert not isinstance(_decision(encode_video, data), str)
    assert refused > 30, name


def test_whole_videos_are_not_decoded_past_the_first_frame(monkeypatch):
    """The check reads box headers only: a whole MP4's layout decodes its first frame alone (the
    display rotation), as before."""
    seen = []
    real = Container._next_frame
    monkeypatch.setattr(Container, "_next_frame", lambda self: seen.append(1) or real(self))
    for name in ("mp4", "mp4_faststart", "mov_faststart"):
        seen.clear()
        video_layout(CLIPS[name](), SPEC, where="v")
        assert len(seen) <= 1, name


def test_layout_only_encode_refuses_a_cut_faststart_mp4():
    """A length filter (``pixels="none"``) meets the cut row as the training encode does."""
    data = CLIPS["mp4_faststart"]()
    cut = data[: len(data) - len(data) // 3]  # moov first and whole, mdat cut
    proc = build_processor("qwen2_vl")
    rows = {"messages": [[{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "q"}]}]],
            "videos": [[cut]]}
    errors = []
    for pixels in ("uint8", "none"):
        with pytest.raises(VideoError) as e:
            mmpipe.encode(rows, processor=proc, pixels=pixels)
        errors.append(str(e.value))
    assert errors[0] == errors[1], errors
    whole = mmpipe.encode({**rows, "videos": [[data]]}, processor=proc, pixels="none")
    assert len(whole["input_ids"]) == 1
