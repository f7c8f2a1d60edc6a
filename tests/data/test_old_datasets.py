"""Datasets encoded by the previous release (before the one-record change, issue 26) load.

tests/data/fixtures/previous_release/ holds four tiny datasets written by that release's code
(``make_fixtures.py`` there says how): Qwen2-VL (patch grids), Gemma 3 and InternVL (tiles)
and the generic path (Idefics3). Each is read with today's code: `validate_dataset` is
clean, collate gives the same token ids and pixels as the same raw rows encoded now, and
``unbatch(collate(rows)) == rows``.

Measured: all four load. The one gap: generic rows of that release stored no ``image_hw``,
so today's code cannot tell which row owns which image: their batch's
``sample_to_image_indices`` raise an `InputError` with the re-encode fix and validate warns;
ids, pixels, model inputs and the round trip are unaffected. Re-encoding (``mmpipe encode``)
writes ``image_hw``.
"""

from __future__ import annotations

import pathlib

import datasets
import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.testing.invariants import as_rows, assert_roundtrip

OLD = pathlib.Path(__file__).resolve().parent / "fixtures" / "previous_release"

# The raw rows make_fixtures.py encoded (kept in step with it by hand: it imports the old tree).
IMAGES = [testing.tiny_image(32, 32, seed=1), testing.tiny_image(30, 44, seed=2)]
DATASETS = {  # name -> (processor builder, images per row, family stored)
    "qwen2_vl": (lambda: testing.build_processor("qwen2_vl"), (1, 0, 2), "qwen2_vl"),
    "gemma3": (lambda: testing.build_processor("gemma3"), (1, 0, 2), "gemma3"),
    "internvl": (lambda: testing.build_processor("internvl"), (1, 0, 2), "internvl"),
    "generic_idefics3": (lambda: build_foreign_processor("idefics3"), (1, 0), "generic"),
}
NO_IMAGE_HW = {"generic_idefics3"}  # stored before rows carried their images' sizes


def _raw(n: int, k: int) -> dict:
    content = [{"type": "image"} for _ in range(n)] + [{"type": "text", "text": f"what is in row {k}?"}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}"}]}],
            "images": IMAGES[:n]}


@pytest.fixture(scope="module", params=sorted(DATASETS))
def old(request):
    """(name, processor, old stored rows, the same raw rows encoded now, stored family)."""
    build, counts, family = DATASETS[request.param]
    proc = build()
    stored = datasets.load_from_disk(str(OLD / request.param))
    raws = datasets.Dataset.from_list([_raw(n, k) for k, n in enumerate(counts)])
    new, _ = mmpipe.encode_dataset(raws, proc)
    return request.param, proc, stored, new, family


def test_the_fixtures_are_small_and_complete():
    names = sorted(p.name for p in OLD.iterdir() if p.is_dir())
    assert names == sorted(DATASETS), "see tests/data/fixtures/previous_release/make_fixtures.py"
    assert sum(f.stat().st_size for f in OLD.rglob("*") if f.is_file()) < 300_000


def test_old_datasets_validate_clean(old):
    name, _, stored, _, family = old
    report = mmpipe.validate_dataset(str(OLD / name))
    assert report.ok and [w.column for w in report.warnings] == (["image_hw"] if name in NO_IMAGE_HW else []), \
        str(report)
    assert report.num_rows == len(stored) and report.labels
    assert set(stored["family"]) == {family}


def test_old_rows_read_as_the_rows_encoded_now(old):
    name, _, stored, new, _ = old
    gap = {"image_hw"} if name in NO_IMAGE_HW else set()
    for i, (a, b) in enumerate(zip(as_rows(list(stored)), as_rows(list(new)))):
        assert set(a.diff(b)) == gap, f"row {i}: {a.diff(b)}"


def test_old_rows_collate_to_the_batch_of_rows_encoded_now(old):
    name, proc, stored, new, _ = old
    got, want = mmpipe.collate(list(stored), processor=proc), mmpipe.collate(list(new), processor=proc)
    for f in ("input_ids", "attention_mask", "mm_token_type_ids", "position_ids", "labels", "pixel_values",
              "pixel_values_u8", "image_grid_thw", "tiles_per_image"):
        a, b = getattr(got, f), getattr(want, f)
        assert (a is None) == (b is None), f
        assert a is None or np.array_equal(np.asarray(a), np.asarray(b)), f
    assert got.vision.keys() == want.vision.keys()
    for k in got.vision:
        assert np.array_equal(np.asarray(got.vision[k]), np.asarray(want.vision[k])), k
    model = got.as_torch().model_inputs()
    assert sorted(model) == sorted(want.as_torch().model_inputs())
    if name not in NO_IMAGE_HW:
        assert got.sample_to_image_indices == want.sample_to_image_indices == [[0], [], [1, 2]]


def test_old_rows_round_trip_through_collate(old):
    name, proc, stored, _, _ = old
    assert_roundtrip(list(stored), processor=proc)


def test_old_generic_rows_say_their_images_are_unknown():
    """They collate and round-trip exactly, but which row owns which image is refused with the
    re-encode fix (not answered with empty lists), and validate warns with the same fix."""
    proc, stored = build_foreign_processor("idefics3"), datasets.load_from_disk(str(OLD / "generic_idefics3"))
    batch = mmpipe.collate(list(stored), processor=proc)
    assert batch.image_hw is None
    with pytest.raises(mmpipe.errors.InputError, match="image_hw") as info:
        batch.sample_to_image_indices
    assert "re-encode" in str(info.value)
    assert_roundtrip(list(stored), batch=batch)
    report = mmpipe.validate_dataset(str(OLD / "generic_idefics3"))
    assert report.ok and [w.column for w in report.warnings] == ["image_hw"], str(report)
    assert "re-encode" in report.warnings[0].fix
