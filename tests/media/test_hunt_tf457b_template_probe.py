"""The generic path's layout probe (`mmpipe.media.processor_probe`) on a chat template that writes
image items as other text, on transformers 4.57 (scripts/envs/tf457.sh) and 5.x.

5.x's LlavaProcessor raises when the text holds fewer placeholders than images, and the probe turns
that into the typed "does not write an image placeholder" refusal. 4.57's LlavaProcessor does not
count: the probe passed and every row stored pixels no token referred to - the images never reached
the model, silently. The probe now also refuses a call whose ids hold no image token.
"""

from __future__ import annotations

import pytest

import mmpipe
from mmpipe.errors import ArgumentError
from mmpipe.offline import tiny_image
from mmpipe.offline.other_vlms import build_foreign_processor

RAW = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what?"}]},
                    {"role": "assistant", "content": "a cat"}],
       "images": [tiny_image(40, 56)]}


@pytest.mark.needs_env("main", "tf457")
@pytest.mark.parametrize("image_text", ["[an image is attached]"])
def test_a_template_writing_images_as_other_text_is_refused(image_text):
    """Before, on 4.57: encode_row returned a row with pixel_values [1, 3, 32, 32] and no image token."""
    proc = build_foreign_processor("llava")
    good = mmpipe.encode_row(RAW, proc)
    assert len(good.image_hw) == 1
    proc.chat_template = proc.chat_template.replace("<image>", image_text)
    with pytest.raises(ArgumentError, match=r"LlavaProcessor: its chat template does not write an image placeholder"
                                            r".*found 0 x '<image>'"):
        mmpipe.encode_row(RAW, proc)
