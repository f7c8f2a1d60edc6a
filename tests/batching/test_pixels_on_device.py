"""``pixels_on_device`` (issue 34): a patch-grid batch keeps its rows' compact uint8 pixels and
``model_inputs(device)`` expands them on the device with the processor's per-channel tables, bit for
bit the CPU expansion, for images and videos of every patch-grid family, through a Collator in
DataLoader workers; the tiles and processor kinds refuse the option (their batches hold the model's
float pixels); the bytes a trainer moves to the device are measured."""

from __future__ import annotations

import pickle

import pytest
import torch

import mmpipe
from mmpipe.testing import invariants

from helpers import encode_mixed, photo_paths

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LAYOUT = ["I", "", "IvI", "v"]  # images and videos per row (mixed_media_raws)


def _photo_rows(proc):
    raws = [{"messages": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": "hi"}]},
                          {"role": "assistant", "content": "ok"}], "images": photo_paths()[:k]} for k in (2, 0, 1)]
    return [mmpipe.encode_row(r, proc, idx=i) for i, r in enumerate(raws)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl", "glm4v"])
def test_device_expansion_equals_collate(family, device):
    proc = mmpipe.testing.build_processor(family)
    for rows in (_photo_rows(proc), encode_mixed(LAYOUT, proc)):
        want = mmpipe.collate(rows, processor=proc).model_inputs(device)
        batch = mmpipe.collate(rows, processor=proc, pixels_on_device=True)
        assert batch.pixel_values is None and batch.pixel_values_u8.dtype == torch.uint8
        got = batch.model_inputs(device)
        assert sorted(got) == sorted(want)
        for k in want:
            assert got[k].device.type == device
            assert torch.equal(got[k], want[k]), (family, k)
        invariants.assert_roundtrip(rows, batch)  # the rows come back out of the uint8 batch
        moved = batch.pixel_values_u8.nbytes + (0 if batch.pixel_values_videos_u8 is None
                                                else batch.pixel_values_videos_u8.nbytes)
        full = want["pixel_values"].nbytes + (want["pixel_values_videos"].nbytes if "pixel_values_videos" in want else 0)
        assert full == 4 * proc.image_processor.temporal_patch_size * batch.pixel_values_u8.nbytes + \
            (4 * (moved - batch.pixel_values_u8.nbytes))  # images: 4 bytes x T slots per byte; videos: 4 per byte


def test_collator_in_dataloader_workers():
    proc = mmpipe.testing.build_processor("qwen2_5_vl")
    rows = [r.to_dict() for r in encode_mixed(LAYOUT, proc)]
    collator = pickle.loads(pickle.dumps(mmpipe.Collator(proc, pixels_on_device=True)))
    loader = torch.utils.data.DataLoader(rows, batch_size=2, collate_fn=collator, num_workers=2)
    ref = torch.utils.data.DataLoader(rows, batch_size=2, collate_fn=mmpipe.Collator(proc), num_workers=0)
    for got, want in zip(loader, ref):
        assert got.pixel_values is None
        a, b = got.model_inputs(), want.model_inputs()
        assert all(torch.equal(a[k], b[k]) for k in b) and sorted(a) == sorted(b)


def test_other_kinds_refuse_the_option():
    gemma = mmpipe.testing.build_processor("gemma3")
    with pytest.raises(mmpipe.errors.ArgumentError, match="pixels_on_device=True is for the patch-grid families"):
        mmpipe.Collator(gemma, pixels_on_device=True)
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, gemma)
    with pytest.raises(mmpipe.errors.ArgumentError, match="patch-grid"):
        mmpipe.collate([row], processor=gemma, pixels_on_device=True)
