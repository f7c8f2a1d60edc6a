"""Damaged media on every route (damaged-media hunt): the same damaged files through
``ds.map(mmpipe.encode, batched=True)`` (``on_error="raise"`` / ``"skip"``, ``num_proc=2``), the
layout-only `Encoder`, the Collator decoding ``pixels="source"`` rows in a DataLoader worker, and
`mmpipe.rollout.to_vllm_prompts`' original images: each is a typed error naming the row, the column,
expected vs found and the fix, or a skipped row that is counted; nothing hangs (a child in its own
session, killed on timeout) and PIL's global settings are left as they were."""

from __future__ import annotations

import dataclasses
import io
import os

import datasets
import numpy as np
import pytest
from PIL import Image, ImageFile

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError, VideoError
from mmpipe.rollout import to_vllm_prompts

from conftest import processor_for
from helpers import make_video, run_child_group, video_file

av = pytest.importorskip("av", reason="PyAV is a test extra (pip install mmpipe[test])")
SMALL = dict(min_pixels=28 * 28 * 2, max_pixels=28 * 28 * 12)


def _jpeg(seed: int, h: int = 60, w: int = 80) -> bytes:
    buf = io.BytesIO()
    testing.tiny_image(h, w, seed=seed).save(buf, "JPEG")
    return buf.getvalue()


def _video_row(video) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]},
                         {"role": "assistant", "content": [{"type": "text", "text": "A clip."}]}],
            "videos": [video]}


@pytest.fixture(scope="module")
def videos():
    mkv = make_video(40, 10, 48, 64, fmt="matroska")
    return {"good": make_video(12, 10, 48, 64), "cut mkv": mkv[: len(mkv) * 3 // 10],
            "size change": video_file(6, 48, 64, "mpegts") + video_file(6, 96, 128, "mpegts", seed=1),
            "zero bytes": b""}


# ---------------------------------------------------------------- findings
@pytest.mark.parametrize("num_proc", [None, 2])
def test_damaged_videos_are_skipped_and_counted_through_datasets_map(videos, num_proc):
    """A cut Matroska file and a stream whose frames change size were encoded (from the file's first
    part; resized to one grid) and kept; now each row is skipped and reported with its index, stage,
    column and reason, in one process or two. Before: rows_out 3, errors only for row 3."""
    proc = processor_for("qwen2_vl")
    ds = datasets.Dataset.from_list([_video_row(videos[k]) for k in ("good", "cut mkv", "size change", "zero bytes")])
    enc = ds.map(mmpipe.encode, batched=True, with_indices=True, remove_columns=ds.column_names, num_proc=num_proc,
                 batch_size=2, fn_kwargs={"processor": proc, "on_error": "skip", "video_options": SMALL})
    kept, errors = mmpipe.drop_failed(enc)
    assert len(kept) == 1
    assert [(e["row"], e["stage"], e["column"]) for e in errors] == [(r, "image", "videos") for r in (1, 2, 3)]
    assert "truncated" in errors[0]["reason"] and "change size" in errors[1]["reason"]


def test_damaged_videos_raise_naming_the_row_through_datasets_map_and_the_layout_encoder(videos):
    proc = processor_for("qwen2_vl")
    ds = datasets.Dataset.from_list([_video_row(videos["good"]), _video_row(videos["cut mkv"])])
    with pytest.raises(VideoError, match="truncated") as e:
        ds.map(mmpipe.encode, batched=True, with_indices=True, remove_columns=ds.column_names,
               fn_kwargs={"processor": proc, "video_options": SMALL})
    assert e.value.row == 1 and e.value.column == "videos" and e.value.expected and e.value.found
    layout = mmpipe.Encoder(proc, pixels="none", video_options=SMALL)
    assert np.asarray(layout.encode_one(_video_row(videos["good"]))["video_grid_thw"]).tolist() == [[2, 4, 4]]
    with pytest.raises(VideoError, match="truncated") as e:  # header-only route: refused by the header too
        layout.encode_one(_video_row(videos["cut mkv"]))
    assert e.value.column == "videos"
    with pytest.raises(VideoError, match="change size"):
        mmpipe.Encoder(proc, video_options=SMALL).encode_one(_video_row(videos["size change"]))


@pytest.mark.parametrize("family", ["internvl", "gemma3"])
def test_a_cut_original_image_for_vllm_is_the_rows_image_error(family):
    """to_vllm_prompts(images=...) re-reads each tiled row's original images: a truncated one raised
    PIL's bare OSError ('image file is truncated'), naming no row. Now the row's ImageError."""
    proc = processor_for(family)
    good = _jpeg(1)
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                             "images": [good]}, proc)
    assert len(to_vllm_prompts([row, row], proc, images=[[good], [good]])) == 2
    with pytest.raises(ImageError, match="truncated") as e:
        to_vllm_prompts([row, row], proc, images=[[good], [good[: len(good) // 2]]])
    assert e.value.row == 1 and "row 1, image 0" in str(e.value) and e.value.expected and "re-export" in e.value.fix


# ---------------------------------------------------------------- guards
def test_source_rows_with_damaged_stored_bytes_fail_in_the_collate_worker_naming_the_row():
    """pixels='source' rows decode at collate time: a row whose stored file bytes are cut raises its
    ImageError from inside a DataLoader worker, with its row index."""
    from torch.utils.data import DataLoader

    proc = processor_for("qwen2_vl")
    good = _jpeg(2)
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
    rows = [mmpipe.encode_row({"messages": msgs, "images": [good]}, proc, pixels="source") for _ in range(3)]
    rows[1] = dataclasses.replace(rows[1], image_sources=[good[: len(good) // 2]])
    with pytest.raises(ImageError, match="truncated") as e:
        list(DataLoader(rows, batch_size=3, collate_fn=mmpipe.Collator(proc), num_workers=1))
    assert e.value.row == 1


CHILD = """
import io, sys
sys.path.insert(0, {tests!r})
import numpy as np
from PIL import Image, ImageFile
import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError
from helpers import make_video
before = (ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS)
proc = testing.build_processor("qwen2_vl")
buf = io.BytesIO(); testing.tiny_image(60, 80, seed=0).save(buf, "JPEG"); jpg = buf.getvalue()
buf = io.BytesIO(); testing.tiny_image(60, 80, seed=0).save(buf, "PNG"); png = buf.getvalue()
mkv = make_video(40, 10, 48, 64, fmt="matroska")
mp4 = make_video(40, 10, 48, 64)
ask = lambda kind: [{{"role": "user", "content": [{{"type": kind}}, {{"type": "text", "text": "hi"}}]}}]
cases = [("image", jpg[: len(jpg) // 2]), ("image", png[: len(png) // 3]), ("image", b"\\xff\\xd8" + b"\\x00" * 5000),
         ("image", png[:33] + b"\\x00\\x00\\x00\\x00IDAT" + b"\\xff" * 4000), ("video", mkv[: len(mkv) // 3]),
         ("video", mkv[:1500]), ("video", mp4[:3000]), ("video", b"\\x1aE\\xdf\\xa3" + b"\\xff" * 4000)]
refused = 0
for kind, data in cases:
    for pixels in ("uint8", "none"):
        try:
            mmpipe.encode_row({{"messages": ask(kind), kind + "s": [data]}}, proc, pixels=pixels, video_options={small!r})
        except InputError as e:
            assert e.expected or e.found, e
            refused += 1
assert (ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS) == before
print("done", refused)
"""


def test_damaged_media_finish_in_a_child_without_hanging_or_changing_pil():
    """Cut and garbage images and videos on the pixel and layout-only routes, in a child in its own
    session (killed with its group past the timeout): every call ends (typed error or a row) and
    PIL's LOAD_TRUNCATED_IMAGES / MAX_IMAGE_PIXELS are as they were."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = run_child_group(CHILD.format(tests=tests, small=SMALL), 240, "encoding damaged media hung")
    assert "done" in out
    assert int(out.split()[-1]) >= 10  # the image cuts on the pixel route and the video damage on both


@pytest.mark.parametrize("family", ["qwen2_vl", "gemma3"])
def test_a_file_replaced_during_a_source_encode_gives_one_files_row(tmp_path, monkeypatch, family):
    """pixels='source' read an image path twice: its header for the grid / size, then its bytes to
    store. A file replaced between the two reads (a sync job, a re-export) gave a row with the old
    file's grid and the new file's bytes: encoded without a word, then refused at collate in a
    DataLoader worker ("decodes to grid (1, 14, 6) but the row stores (1, 4, 6)", fix: use the
    processor the rows were encoded with). Now the path is read once: grid and bytes are one file's."""
    import mmpipe.images.load as load

    proc = processor_for(family)
    path = tmp_path / "photo.jpg"
    path.write_bytes(_jpeg(3, 60, 80))
    opened = load.open_image_file

    def replaced_after_first_open(p, **kw):
        f = opened(p, **kw)
        if not (tmp_path / "replaced").exists():
            (tmp_path / "replaced").touch()
            (tmp_path / "new.jpg").write_bytes(_jpeg(4, 200, 80))  # another photo, another size,
            os.replace(tmp_path / "new.jpg", path)  # renamed over the path (as sync jobs write files)
        return f

    monkeypatch.setattr(load, "open_image_file", replaced_after_first_open)
    row = mmpipe.encode_row({"messages": ASK, "images": [str(path)]}, proc, pixels="source")
    monkeypatch.undo()
    stored = bytes(row.image_sources[0])
    again = mmpipe.encode_row({"messages": ASK, "images": [stored]}, proc)  # the stored file's own encode
    assert np.array_equal(row.input_ids, again.input_ids)
    batch = mmpipe.Collator(proc)([row])  # decodes the stored bytes: they fit the row's layout
    assert np.array_equal(np.asarray(batch.pixel_values), np.asarray(mmpipe.Collator(proc)([again]).pixel_values))


ASK = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]},
       {"role": "assistant", "content": [{"type": "text", "text": "ok"}]}]
