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


@pytest.mark.needs_env("tf457")
def test_qwen2_5_vl_processor_sampling_is_refused_on_4_57(tmp_path):
    """4.57's Qwen2_5_VLProcessor writes second_per_grid_ts = T / its fps argument (2.0 without one),
    not the sampled rate (checked against its stock chat path: every frame of a 24 fps clip gives 1.0
    where the frames say 2/24): sampling='processor' rows cannot equal it, so the encoder refuses,
    naming sampling='qwen-vl-utils'. Before: rows with second_per_grid_ts 0.0833 where the processor
    writes 1.0, silently. The default sampling keeps encoding; its second_per_grid_ts is what the 4.57
    processor writes when handed qwen-vl-utils' sample fps (the model card's call)."""
    from mmpipe.errors import ArgumentError

    proc = processor_for("qwen2_5_vl")
    path = tmp_path / "a.mp4"
    path.write_bytes(make_video(30, 10, 64, 96, seed=3))
    msgs = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "What?"}]}]
    with pytest.raises(ArgumentError, match="sampling='qwen-vl-utils'.*transformers >= 5"):
        mmpipe.encode_row({"messages": msgs, "videos": [str(path)]}, proc,
                          video_options=processor_options(proc), pixels="none")
    row = mmpipe.encode_row({"messages": msgs, "videos": [str(path)]}, proc,
                            video_options=VideoOptions(max_pixels=64 * 96), pixels="none")
    spec = VisionSpec.from_processor(proc)
    lay = video_layout(str(path), spec, VideoOptions(max_pixels=64 * 96))
    stock = copy.copy(proc)
    stock.video_processor = _Frames(list(row.video_grid_thw[0]), lay.frame_indices, 10.0, spec.merge_size,
                                    spec.temporal_patch_size)
    out = stock(text=[proc.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)], videos=[np.zeros((2, 1, 1, 3), np.uint8)],
                fps=lay.sample_fps)
    assert row.input_ids.tolist() == list(out["input_ids"][0])
    np.testing.assert_allclose(row.second_per_grid_ts, out["second_per_grid_ts"], rtol=1e-6)


@pytest.mark.needs_env("main")
def test_5x_processors_are_not_refused():
    """Main environment (5.x: the processor takes the sampled rate): no refusal for any family."""
    from mmpipe.encoding.videos import check_processor_seconds

    for name in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        proc = processor_for(name)
        check_processor_seconds(proc, mmpipe.family_of(proc))
