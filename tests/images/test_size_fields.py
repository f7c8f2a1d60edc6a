"""Image-processor ``size`` / ``crop_size`` as either form transformers stores them: a ``SizeDict``
(transformers 5, attributes) or a plain dict (4.57's slow image processors, e.g.
``LlavaOnevisionImageProcessor``, whose dict made every LLaVA-OneVision encoder on 4.57 fail with
``AttributeError: 'dict' object has no attribute 'height'``). Each family's settings read both alike."""

from __future__ import annotations

import copy

import pytest

from mmpipe.images import gemma3, internvl, onevision
from mmpipe.images.spec import VisionSpec
from mmpipe.images.tiles import effective_image_processor

from conftest import processor_for


def _as_dicts(ip):
    """A copy of image processor ``ip`` whose size fields are plain dicts, as 4.57 stores them."""
    ip = copy.deepcopy(ip)
    for name in ("size", "crop_size"):
        value = getattr(ip, name, None)
        if value is not None and not isinstance(value, dict):
            setattr(ip, name, {k: v for k, v in dict(value).items() if v is not None})
    return ip


@pytest.mark.parametrize("family, read", [("llava_onevision", onevision.settings), ("internvl", internvl.settings),
                                          ("gemma3", gemma3.tile_size)])
def test_tiled_settings_read_dict_sizes(family, read):
    ip = effective_image_processor(processor_for(family))
    plain = _as_dicts(ip)
    assert isinstance(plain.size, dict)
    assert read(plain) == read(ip)


def test_patch_grid_spec_reads_dict_sizes():
    proc = processor_for("qwen2_vl")
    plain = copy.copy(proc)
    plain.image_processor = _as_dicts(proc.image_processor)
    assert isinstance(plain.image_processor.size, dict)
    assert VisionSpec.from_processor(plain) == VisionSpec.from_processor(proc)
