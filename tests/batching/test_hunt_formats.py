"""Encoded datasets read back in every ``datasets`` format before collate: found by the formats hunt.

- ``pixel_digest`` is an int64 column that is null in rows written without a digest (layout-only
  rows, older mmpipe); a dataset holding both (``concatenate_datasets`` of two encodes) read in the
  numpy / torch / pandas formats turns the whole column into floats: NaN for the nulls ("cannot
  convert float NaN to integer", no row named) and the other digests rounded, which the digest
  check took for damaged pixel bytes (a false `PixelDataError` on good rows; always for the tiled
  families, whose reader checks every digest; with ``verify_pixels=True`` for the others);
- a pixel column of the row's format dropped (``remove_columns`` / ``select_columns``) while the
  row's other pixel column is kept: the row read as if it had no such items' pixels, and collate
  crashed with a bare ``ValueError: zero-dimensional arrays cannot be concatenated`` (uint8) or a
  batch error telling the user not to edit the batch in place, naming no row (float32).
"""

from __future__ import annotations

import datasets
import pytest
import torch

import mmpipe
from mmpipe.batching.collate import ArrowRows
from mmpipe.errors import PixelDataError
from mmpipe.testing import invariants

from conftest import processor_for
from helpers import VIDEO_BOUNDS, generic_chat_rows, mixed_media_raws


def _encode(family: str, pixels: str, raws: list, **kw) -> datasets.Dataset:
    ds = datasets.Dataset.from_list(raws)
    return ds.map(mmpipe.encode, batched=True, remove_columns=ds.column_names,
                  fn_kwargs={"processor": processor_for(family), "pixels": pixels, **kw})


def _chat_raws():
    return [{k: v for k, v in r.items() if k != "id"} for r in generic_chat_rows([1, 0, 2, 1])]


@pytest.fixture(scope="module", params=["qwen2_vl", "gemma3"])
def mixed_digests(request):
    """uint8 rows (digests) then layout-only rows (null digests), one dataset."""
    fam = request.param
    both = datasets.concatenate_datasets([_encode(fam, "uint8", _chat_raws()), _encode(fam, "none", _chat_raws())])
    assert both["pixel_digest"][4] is None and both["pixel_digest"][0] is not None  # the case
    return fam, both


READS = {  # how users read rows of a dataset before collate
    "numpy slice": lambda d: d.with_format("numpy")[0:len(d)],
    "torch slice": lambda d: d.with_format("torch")[0:len(d)],
    "pandas slice": lambda d: d.with_format("pandas")[0:len(d)],
    "to_pandas": lambda d: d.to_pandas(),
    "numpy rows": lambda d: [d.with_format("numpy")[i] for i in range(len(d))],
    "torch rows": lambda d: [d.with_format("torch")[i] for i in range(len(d))],
}


@pytest.mark.parametrize("read", sorted(READS))
def test_rows_beside_rows_without_a_digest_collate_in_every_format(mixed_digests, read):
    fam, both = mixed_digests
    col = mmpipe.Collator(processor_for(fam), verify_pixels=True)
    # uint8 rows with images and a layout-only text-only row: one batch, the digest column holds a null
    part = both.select([0, 5, 2])
    want = col(part.to_list())
    assert part.with_format("numpy")[0:3]["pixel_digest"].dtype.kind == "f"  # the case: digests as floats
    _same_inputs(col(READS[read](part)), want)
    # layout-only rows alone, read as floats (NaN digests)
    lo = both.select([4, 6, 7])
    col = mmpipe.Collator(processor_for(fam), allow_layout_only=True, verify_pixels=True)
    invariants.assert_roundtrip(lo.to_list(), col(READS[read](lo)), label=read)


def _same_inputs(got, want) -> None:
    """The two batches give the model the same inputs (every tensor equal, by name)."""
    a, b = got.model_inputs(), want.model_inputs()
    assert sorted(a) == sorted(b)
    for k in a:
        x, y = a[k], b[k]
        assert (x is None) == (y is None), k
        assert x is None or (x.shape == y.shape and bool((torch.as_tensor(x) == torch.as_tensor(y)).all())), k


@pytest.mark.parametrize("read", ["numpy slice", "pandas slice", "torch rows"])
def test_a_damaged_row_is_still_caught_through_a_rounded_digest(mixed_digests, read):
    fam, both = mixed_digests
    rows = both.select([0, 5, 2]).to_list()
    blob = rows[2]["pixel_values_u8"]
    if isinstance(blob, bytes):  # patch grids: raw bytes + end marker
        rows[2]["pixel_values_u8"] = bytes([blob[0] ^ 1]) + blob[1:]
    else:  # tiles: a flat list of uint8
        rows[2]["pixel_values_u8"] = [blob[0] ^ 1] + blob[1:]
    damaged = datasets.Dataset.from_list(rows, features=both.features)
    with pytest.raises(PixelDataError, match="bytes changed after encoding") as e:
        mmpipe.Collator(processor_for(fam), verify_pixels=True)(READS[read](damaged))
    assert e.value.row == 2


@pytest.fixture(scope="module")
def videos():
    raws = mixed_media_raws(["vI", "", "I", "v"])
    return {p: _encode("qwen2_5_vl", p, raws, video_options=VIDEO_BOUNDS) for p in ("uint8", "float32")}


@pytest.mark.parametrize("pixels,dropped", [("uint8", "pixel_values_videos_u8"), ("uint8", "pixel_values_u8"),
                                            ("float32", "pixel_values_videos"), ("float32", "pixel_values")])
@pytest.mark.parametrize("read", ["python", "arrow", "torch"])
def test_a_dropped_pixel_column_names_the_row_and_the_column(videos, pixels, dropped, read):
    ds = videos[pixels].remove_columns([dropped])
    rows = {"python": lambda: ds.select([1, 0]).to_list(), "arrow": lambda: ArrowRows(ds).__getitems__([1, 0]),
            "torch": lambda: [ds.with_format("torch")[i] for i in (1, 0)]}[read]()
    with pytest.raises(PixelDataError, match="dropped") as e:
        mmpipe.Collator(processor_for("qwen2_5_vl"))(rows)
    assert e.value.row == 1 and e.value.column == dropped


def test_rows_without_the_dropped_items_still_collate(videos):
    # image-only rows lose nothing when the video pixel column is dropped (what was accepted stays)
    ds = videos["uint8"].remove_columns(["pixel_values_videos_u8"])
    batch = mmpipe.Collator(processor_for("qwen2_5_vl"))(ds.select([1, 2]).to_list())
    assert batch.image_grid_thw.shape[0] == 1 and batch.pixel_values is not None
    full = videos["uint8"].select([1, 2]).to_list()
    assert torch.equal(batch.pixel_values, mmpipe.Collator(processor_for("qwen2_5_vl"))(full).pixel_values)
