"""Qwen3-VL video rows on transformers 4.57 (scripts/envs/tf457.sh) against 4.57's own
``Qwen3VLProcessor.__call__`` and ``Qwen3VLModel.get_rope_index``.

4.57's processor replaces the chat template's ``<|vision_start|><|video_pad|><|vision_end|>`` with the
frame groups (``<t seconds><|vision_start|> pads <|vision_end|>`` each): the outer pair is dropped, as
5.25's processor drops it. `mmpipe.encoding.videos.keeps_video_wrapper` asked only the 5.x text step
(``get_text_with_replacements``), which 4.57 lacks, and kept the pair: every 4.57 Qwen3-VL video row
had two tokens more than the processor's (and its first timestamp tokenized apart from the text).

4.57's video processor needs torchvision, which this environment does not hold, so the processor's
``__call__`` gets a stand-in video processor returning the row's grid and the sampled frame indices
(``VideoMetadata``): what the real one returns for those frames; the text layout is 4.57's own code.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import mmpipe
from mmpipe.images.spec import VisionSpec
from mmpipe.images.video import VideoOptions, video_layout
from mmpipe.images.video_processor_plan import processor_options, processor_plan

from conftest import model_for, processor_for
from helpers import make_video

av = pytest.importorskip("av", reason="PyAV is a test extra")


class _Frames:
    """4.57's video processor as far as the text step reads it: the row's grid and frame indices."""

    def __init__(self, grid, indices, fps, merge_size, temporal_patch_size):
        self.grid, self.indices, self.fps = grid, indices, fps
        self.merge_size, self.temporal_patch_size = merge_size, temporal_patch_size

    def __call__(self, videos=None, **_):
        from transformers.video_utils import VideoMetadata

        meta = VideoMetadata(total_num_frames=int(max(self.indices)) + 1, fps=self.fps,
                             frames_indices=[int(i) for i in self.indices])
        return {"video_grid_thw": torch.tensor([self.grid]), "video_metadata": [meta]}


@pytest.mark.needs_env("tf457")
@pytest.mark.parametrize("sampling", ["qwen-vl-utils", "processor"])
@pytest.mark.parametrize("text", ["What?", "Describe the clip, in detail."])
def test_qwen3_vl_video_rows_equal_the_4_57_processor(tmp_path, sampling, text):
    """ids == 4.57 ``Qwen3VLProcessor(text=rendered, videos=...)``'s; positions == 4.57's get_rope_index.
    Before: 2 tokens more (the template's outer <|vision_start|>/<|vision_end|> kept)."""
    import transformers

    assert transformers.__version__.startswith("4.57")
    proc = processor_for("qwen3_vl")
    assert isinstance(proc, transformers.Qwen3VLProcessor)
    spec = VisionSpec.from_processor(proc)
    path = tmp_path / "a.mp4"
    path.write_bytes(make_video(30, 10, 64, 96, seed=3))
    opts = processor_options(proc) if sampling == "processor" else VideoOptions(max_pixels=64 * 96)
    msgs = [{"role": "user", "content": [{"type": "text", "text": text}, {"type": "video"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "A clip."}]}]
    row = mmpipe.encode_row({"messages": msgs, "videos": [str(path)]}, proc, video_options=opts, pixels="none")
    lay = video_layout(str(path), spec, opts, **({"plan": processor_plan} if sampling == "processor" else {}))

    stock = copy.copy(proc)
    stock.video_processor = _Frames(list(row.video_grid_thw[0]), lay.frame_indices, 10.0, spec.merge_size,
                                    spec.temporal_patch_size)
    rendered = proc.apply_chat_template(msgs, tokenize=False)
    out = stock(text=[rendered], videos=[np.zeros((2, 1, 1, 3), np.uint8)])
    assert row.input_ids.tolist() == list(out["input_ids"][0])
    assert row.video_grid_thw.tolist() == out["video_grid_thw"].tolist()

    model = model_for("qwen3_vl")
    ids = torch.as_tensor(row.input_ids)[None]
    pos, _ = model.model.get_rope_index(ids, None, torch.as_tensor(row.video_grid_thw), torch.ones_like(ids))
    assert np.array_equal(row.position_ids, pos[:, 0].numpy())


def test_a_processor_without_a_text_step_is_asked_through_its_call():
    """Main environment: a 4.x-style processor (no ``get_text_with_replacements``) that collapses the
    pair in ``__call__`` -> False, one that keeps it -> True, a bare tokenizer-like object -> True.
    Before: every processor without the text step counted as keeping the pair."""
    from types import SimpleNamespace

    from mmpipe.encoding.videos import keeps_video_wrapper

    base = processor_for("qwen3_vl")
    fam = mmpipe.family_of(base)
    tok = base.tokenizer
    wrapper = "<|vision_start|><|video_pad|><|vision_end|>"

    class FourX:
        image_processor, tokenizer, video_processor = object(), tok, None

        def __init__(self, collapse):
            self.collapse = collapse

        def __call__(self, text, videos=None):
            out = self.video_processor(videos=videos)
            n = int(out["video_grid_thw"][0, 1:].prod()) // fam.merge_size**2
            group = "<0.2 seconds><|vision_start|>" + "<|video_pad|>" * n + "<|vision_end|>"
            body = text[0].replace(wrapper if self.collapse else "<|video_pad|>", group)
            return {"input_ids": [tok(body, add_special_tokens=False)["input_ids"]]}

    assert keeps_video_wrapper(FourX(collapse=True), fam) is False
    assert keeps_video_wrapper(FourX(collapse=False), fam) is True
    assert keeps_video_wrapper(SimpleNamespace(), fam) is True
