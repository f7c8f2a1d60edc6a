"""The README's ReMA block runs as written (tiny offline Qwen2-VL, the transformers engine)."""

from __future__ import annotations

import torch

from mmpipe import testing
from mmpipe.rollout.transformers_engine import TransformersEngine

from conftest import model_for, processor_for
from helpers import readme_block


def test_readme_rema_block_runs_as_written():
    processor, model = processor_for("qwen2_vl"), model_for("qwen2_vl")
    questions = [{"question": "What is shown? <image>", "images": [testing.tiny_image(40, 52, seed=1)]},
                 "What is 3 + 4?"]
    ns = {"questions": questions, "engine": TransformersEngine(model, processor), "processor": processor,
          "model": model, "device": "cpu"}
    exec(compile(readme_block("## Multi-agent conversations (ReMA)"), "README.md", "exec"), ns)
    batch = ns["batch"]
    assert batch.batch["reasoning_labels"].shape == (2, 768)
    assert batch.batch["reasoning_num_gen_tokens"].shape == (2, 3)
    assert set(batch.non_tensor_batch["finish_reason"]) <= {None, "reach_max_turn", "completion_token_exceeded",
                                                           "stop_when_truncated"}
    assert torch.isfinite(ns["out"].loss)
