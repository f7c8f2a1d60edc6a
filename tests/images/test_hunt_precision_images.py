"""Precision hunt: images and video frames handed over as bfloat16 torch tensors (what a bf16
pipeline's tensors are). numpy has no bfloat16, and the loader's ``.numpy()`` leaked torch's bare
``TypeError: Got unsupported ScalarType BFloat16`` out of encode instead of the typed error every
other non-uint8 image gets (float32 and float16 tensors: `ImageError` "image arrays must be uint8")."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.errors import ImageError, VideoError

from helpers import VIDEO_BOUNDS

U8 = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 56, 56, 3), dtype=np.uint8))


def _row(kind: str, value) -> dict:
    media = {"images": [value]} if kind == "image" else {"videos": [{"frames": value, "fps": 2.0}]}
    return {"messages": [{"role": "user", "content": [{"type": kind}, {"type": "text", "text": "hi"}]},
                         {"role": "assistant", "content": "ok"}], **media}


@pytest.mark.parametrize("kind,value,error", [
    ("image", U8[0].bfloat16() / 255, ImageError),
    ("video", U8.bfloat16(), VideoError),  # a frame stack [n, H, W, 3]
    ("video", list(U8.bfloat16()), VideoError),  # a list of frames
], ids=["image", "frame-stack", "frame-list"])
def test_bfloat16_tensors_get_the_typed_dtype_error(kind, value, error):
    proc = testing.build_processor("qwen2_vl")
    assert mmpipe.encode_row(_row(kind, U8[0] if kind == "image" else U8), proc, video_options=VIDEO_BOUNDS)
    with pytest.raises(error, match="image arrays must be uint8") as e:
        mmpipe.encode_row(_row(kind, value), proc, video_options=VIDEO_BOUNDS)
    assert "torch.bfloat16" in str(e.value) and "to(torch.uint8)" in str(e.value)
