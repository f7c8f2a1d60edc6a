"""``video_options={"sampling": "processor"}`` rows against transformers 4.57's STOCK processors' chat
path on video files (``apply_chat_template([{"type": "video", "path": file}, ...], tokenize=True,
return_dict=True)``, which decodes and samples with the family's 4.57 video processor), in the tf457
environment (scripts/envs/tf457.sh).

4.57's video processors import torchvision, which this environment does not hold: the child process
here gets torchvision 0.28's pure-Python part (the folder scripts/envs/vision.sh unpacks into
.envs-cache/vision/tv) with a distribution record, since 4.57 asks importlib.metadata whether
torchvision is installed; the chat path decodes with transformers' own PyAV reader (as the vision
environment's tests do). Without that folder (vision.sh not run) the test skips, saying so.

Held equal (Qwen2-VL, Qwen3-VL, GLM-4.1V; each clip untold and with fps=2): ids, video_grid_thw and
float32 pixel_values_videos. Qwen2.5-VL's 4.57 processor writes second_per_grid_ts from the fps
argument, not the sampled rate: the encoder refuses sampling='processor' for it (its rows would differ).
4.57's video processors have no ``cap_pixels_per_frame``: asking for it is refused (their chat path ignores it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import run_child_group

pytestmark = pytest.mark.needs_env("tf457")
pytest.importorskip("av", reason="PyAV is a test extra")

ROOT = Path(__file__).resolve().parents[2]
TV = ROOT / ".envs-cache" / "vision" / "tv" / "torchvision"

CHILD = r"""
import sys
sys.path.insert(0, {tests!r}); sys.path.insert(0, {tests!r} + "/encoding")
import numpy as np, mmpipe, transformers
from transformers import video_processing_utils as vpu
from transformers.video_utils import load_video
from helpers import make_video
from mmpipe.errors import ArgumentError
from mmpipe.images.video_processor_plan import processor_options
from mmpipe.offline.checkpoints import build_checkpoint_processor
from mmpipe import testing

assert transformers.__version__.startswith("4.57") and transformers.utils.is_torchvision_available()

def fetch(self, v, sample_indices_fn=None):
    if isinstance(v, list):
        return list(zip(*[fetch(self, x, sample_indices_fn) for x in v]))
    return load_video(v, backend="pyav", sample_indices_fn=sample_indices_fn)

vpu.BaseVideoProcessor.fetch_videos = fetch

def glm_stock():
    from mmpipe.families import GLM4V
    from mmpipe.offline.glm4v import GLM4V_CHAT_TEMPLATE, build_image_processor, build_tokenizer
    video = transformers.Glm4vVideoProcessor(
        size={{"shortest_edge": 28 * 28 * 2 * 4, "longest_edge": 28 * 28 * 2 * 16 * 4}},
        patch_size=GLM4V.patch_size, temporal_patch_size=GLM4V.temporal_patch_size, merge_size=GLM4V.merge_size,
        image_mean=list(GLM4V.image_mean), image_std=list(GLM4V.image_std))
    return transformers.Glm4vProcessor(image_processor=build_image_processor(), tokenizer=build_tokenizer(),
                                       video_processor=video, chat_template=GLM4V_CHAT_TEMPLATE)

tmp = {tmp!r}
clips = []
for n, fps in ((89, 24), (20, 10)):
    path = f"{{tmp}}/clip{{n}}.mp4"
    open(path, "wb").write(make_video(n, fps, 48, 64, seed=n))
    clips.append(path)
row_msgs = [{{"role": "user", "content": [{{"type": "video"}}, {{"type": "text", "text": "What?"}}]}}]
checked = 0
for family in ("qwen2_vl", "qwen3_vl", "glm4v"):
    if family == "glm4v":
        proc, proc0 = glm_stock(), testing.build_processor("glm4v")
    else:
        proc = proc0 = build_checkpoint_processor(family)
    for path in clips:
        for kw in ({{}}, {{"fps": 2.0}}):
            msgs = [{{"role": "user", "content": [{{"type": "video", "path": path}}, {{"type": "text", "text": "What?"}}]}}]
            out = proc.apply_chat_template(msgs, tokenize=True, return_dict=True, add_generation_prompt=True,
                                           return_tensors="pt", **kw)
            row = mmpipe.encode_row({{"messages": row_msgs, "videos": [path]}}, proc0, pixels="float32",
                                    video_options=processor_options(proc, **kw))
            where = (family, path, kw)
            assert row.input_ids.tolist() == out["input_ids"][0].tolist(), where
            assert row.video_grid_thw.tolist() == out["video_grid_thw"].tolist(), where
            assert np.array_equal(row.pixel_values_videos, out["pixel_values_videos"].numpy()), where
            checked += 1
for family in ("qwen2_vl", "qwen3_vl"):  # 4.57's video processors have no per-frame cap: their chat path ignores it
    proc = build_checkpoint_processor(family)
    try:
        processor_options(proc, cap_pixels_per_frame=True, max_video_tokens=8)
    except ArgumentError as e:
        assert "no per-frame pixel cap" in str(e), e
    else:
        raise AssertionError(family + ": cap_pixels_per_frame not refused on 4.57")
proc = build_checkpoint_processor("qwen2_5_vl")
try:
    mmpipe.encode_row({{"messages": row_msgs, "videos": [clips[0]]}}, proc, video_options=processor_options(proc))
except ArgumentError as e:
    assert "second_per_grid_ts" in str(e) and "sampling='qwen-vl-utils'" in str(e), e
else:
    raise AssertionError("qwen2_5_vl: sampling='processor' not refused on 4.57")
print("checked", checked)
"""


def test_processor_sampled_rows_equal_the_4_57_stock_chat_path(tmp_path, monkeypatch):
    """Before 7634492 the Qwen3-VL rows held 2 ids more (the template's outer pair); before 350d10a
    Qwen2.5-VL's rows were encoded with a second_per_grid_ts its 4.57 processor does not write."""
    if not (TV / "__init__.py").is_file():
        pytest.skip("torchvision's Python part is unpacked by scripts/envs/vision.sh (.envs-cache/vision/tv)")
    site = tmp_path / "site"
    (site / "torchvision-0.28.0.dist-info").mkdir(parents=True)
    (site / "torchvision-0.28.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchvision\nVersion: 0.28.0\n")
    (site / "torchvision").symlink_to(TV)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    out = run_child_group(CHILD.format(tests=str(ROOT / "tests"), tmp=str(tmp_path)), 300,
                          "the 4.57 stock video chat path hung")
    assert "checked 12" in out, out[-2000:]
