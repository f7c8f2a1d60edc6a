"""`mmpipe.map_kwargs` / `encode_dataset` size a writer batch so its encoded rows fit the byte
budget; with the image processor's ``do_resize=False`` the images are stored at their own size,
not at ``max_pixels``. Before the fix the bound still assumed ``max_pixels``: 980x980 photos under
the test processor's 50,176 pixels got ``writer_batch_size=223``, a writer batch of ~650 MB for a
256 MiB budget (1400x1400: 4.9x)."""

from __future__ import annotations

import io

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe.encoding.dataset import ROW_BUFFER_BYTES
from mmpipe.testing import build_processor, sample_photos


def _rows(side: int, n: int = 3) -> datasets.Dataset:
    photo = next(im for name, im in sample_photos() if name.endswith("grace_hopper.jpg"))
    buf = io.BytesIO()
    photo.convert("RGB").resize((side, side)).save(buf, "JPEG", quality=90)
    rows = [{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{i}"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": "a"}]}],
             "images": [{"bytes": buf.getvalue(), "path": None}]} for i in range(n)]
    return datasets.Dataset.from_list(rows).cast_column("images", datasets.Sequence(datasets.Image(decode=False)))


def _stored_bytes(out: dict) -> int:
    """Bytes of encoded row 0 (every column)."""
    def nb(x):
        if isinstance(x, (bytes, bytearray)):
            return len(x)
        if isinstance(x, (list, tuple)):
            return sum(nb(y) for y in x)
        return getattr(x, "nbytes", 0)
    return sum(nb(v[0]) for v in out.values())


@pytest.mark.parametrize("do_resize", [False, True])
def test_writer_batch_of_unresized_images_fits_the_budget(do_resize):
    proc = build_processor("qwen2_vl")
    proc.image_processor.do_resize = do_resize
    ds = _rows(980)
    kw = mmpipe.map_kwargs(proc, ds)
    row = _stored_bytes(mmpipe.encode(ds[:1], processor=proc))
    if not do_resize:
        assert row > 2_800_000  # the image kept at 980x980: 960,400 pixels x 3 bytes
    assert kw["writer_batch_size"] * row <= ROW_BUFFER_BYTES, (kw, row)
    if do_resize:  # unchanged where max_pixels bounds the images
        assert kw["writer_batch_size"] == 223


def test_streams_with_unresized_images_get_the_pil_bound():
    proc = build_processor("qwen2_vl")
    proc.image_processor.do_resize = False
    stream = _rows(56).to_iterable_dataset()
    assert mmpipe.map_kwargs(proc, stream)["batch_size"] == 1  # any image up to PIL's limit
    assert mmpipe.map_kwargs(proc, _rows(56))["batch_size"] > 200  # listed: small images, large batches
