"""Tiled families (Gemma 3, InternVL, LLaVA-OneVision): the processor-call image options an encoder
takes (``images_kwargs``) and the image processor's own settings. For each, either the collated rows
equal the processor's chat path with the same options (ids, pixel_values, every output both give),
or the encoder refuses with an `ArgumentError` naming the option: never a silent difference.

Before the fix, normalisation options (``image_mean``, ``do_normalize``, ``do_rescale``...) were
stored with the rows and ignored at collate (the collating processor's table), ``size`` made tiles
that collate then refused as "another processor's", LLaVA-OneVision's ``size`` crashed with a
ZeroDivisionError, its ``image_grid_pinpoints`` counted other tokens than the processor, and
Gemma 3's ``do_resize=False`` (given or the image processor's) was resized to a tile anyway.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.errors import ArgumentError

from conftest import processor_for
from helpers import chat_path

TILED = ("gemma3", "internvl", "llava_onevision")
IMAGES = [testing.tiny_image(40, 120, seed=1), testing.tiny_image(90, 50, seed=2)]


def _raw(n_images: int) -> dict:
    content = []
    for i in range(n_images):
        content += [{"type": "image"}, {"type": "text", "text": f" picture {i}."}]
    return {"messages": [{"role": "user", "content": content},
                         {"role": "assistant", "content": [{"type": "text", "text": "Seen."}]}],
            "images": IMAGES[:n_images]}


def _equal_or_refused(proc, raw: dict, images_kwargs: dict, name: str) -> str:
    """"refused" (an ArgumentError naming ``name``) or "equal" (the batch equals the chat path)."""
    try:
        enc = mmpipe.Encoder(proc, images_kwargs=images_kwargs or None)
    except ArgumentError as e:
        assert name in str(e), str(e)
        return "refused"
    batch = mmpipe.Collator(proc)([enc.encode_row(raw, 0)]).model_inputs()
    ref = chat_path(proc, raw, **images_kwargs)
    for key in ref:
        if key in batch:
            np.testing.assert_array_equal(np.asarray(batch[key]), np.asarray(ref[key]), err_msg=key)
    return "equal"


# options whose effect the stored tiles cannot carry (each differed from the processor, or crashed)
REFUSED = {
    "image_mean": {"image_mean": [0.1, 0.2, 0.3]},
    "image_std": {"image_std": [0.2, 0.3, 0.4]},
    "do_normalize": {"do_normalize": False},
    "do_rescale": {"do_rescale": False},
    "rescale_factor": {"rescale_factor": 1 / 128},
    "size": {"size": {"height": 64, "width": 64}},
}


@pytest.mark.parametrize("family", TILED)
@pytest.mark.parametrize("option", sorted(REFUSED))
def test_call_options_the_tiles_cannot_carry_are_refused(family, option):
    """Equal to the processor's call or refused; these are refused (the rows would otherwise differ)."""
    assert _equal_or_refused(processor_for(family), _raw(1), REFUSED[option], option) == "refused"


@pytest.mark.parametrize("family", ["gemma3", "llava_onevision"])
@pytest.mark.parametrize("where", ["images_kwargs", "image_processor"])
def test_do_resize_false_is_refused_where_the_processor_keeps_image_sizes(family, where):
    """Without do_resize, Gemma 3 keeps an image at its own size (pixel_values [1, 3, 40, 120], not a
    32x32 tile) and LLaVA-OneVision a conversation's several images ([2, 1, 3, 120, 120] base
    tiles): equal to that or refused, whether given in images_kwargs or set on the image processor."""
    proc, kwargs = processor_for(family), {"do_resize": False}
    if where == "image_processor":
        proc, kwargs = copy.deepcopy(proc), {}
        proc.image_processor.do_resize = False
    raw = _raw(1) if family == "gemma3" else dict(_raw(2), images=[IMAGES[0], IMAGES[0].copy()])
    assert _equal_or_refused(proc, raw, kwargs, "do_resize") == "refused"


def test_onevision_call_pinpoints_are_refused():
    """The processor tiles with call pinpoints but counts the image's tokens with its own (60 ids
    for 3 tiles); mmpipe counted with the call's (52): refused, naming the option."""
    proc = processor_for("llava_onevision")
    pins = {"image_grid_pinpoints": [[32, 32], [32, 64], [64, 32]]}
    assert _equal_or_refused(proc, _raw(1), pins, "image_grid_pinpoints") == "refused"
    # set on the image processor, the processor and mmpipe agree (guard)
    own = copy.deepcopy(proc)
    own.image_processor.image_grid_pinpoints = pins["image_grid_pinpoints"]
    assert _equal_or_refused(own, _raw(1), {}, "") == "equal"


HONOURED = {  # guards: options mmpipe reproduces exactly
    "gemma3": [{"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 4, "pan_and_scan_min_ratio_to_activate": 1.1},
               {"resample": 0}, {"do_resize": True}],
    "internvl": [{"crop_to_patches": False}, {"max_patches": 2}, {"min_patches": 2}, {"do_resize": False}],
    "llava_onevision": [{"resample": 0}, {"do_resize": True}],
}


@pytest.mark.parametrize("family,options", [(f, o) for f, opts in HONOURED.items() for o in opts],
                         ids=lambda v: v if isinstance(v, str) else ",".join(v))
@pytest.mark.parametrize("n_images", [1, 2])
def test_honoured_call_options_equal_the_chat_path(family, options, n_images):
    assert _equal_or_refused(processor_for(family), _raw(n_images), options, "") == "equal"
