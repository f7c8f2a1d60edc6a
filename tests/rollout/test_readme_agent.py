"""The README's agent-loop block runs as written, and what it claims holds: 8 trajectories from 4
prompts at n=2, every row valid after every tool turn, one batched engine call per turn, labels
on the model's own tokens only, and a rollout/training logprob gap under 1e-4."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import torch

from mmpipe.records import IGNORE_INDEX

from helpers import readme_block


def test_readme_agent_block_runs_as_written():
    block = readme_block("### Agent loops whose tools return images")
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(block, "README.md", "exec"), namespace)
    trajectories, loop = namespace["trajectories"], namespace["loop"]
    assert len(trajectories) == 8
    assert loop.engine_calls == max(t.num_turns for t in trajectories)  # one batched call per turn
    for t in trajectories:
        t.row.validate()
        assert t.num_turns <= 4 and t.row.num_images <= 6 and t.row.num_tokens <= 1024
        trained = t.row.labels != IGNORE_INDEX
        assert trained.sum() == t.num_model_tokens and not (t.row.mm_token_type_ids[trained] != 0).any()
    assert torch.isfinite(namespace["out"].logits).all()
    gap = float(out.getvalue().rsplit("rollout/training logprob gap:", 1)[1])
    assert np.isfinite(gap) and gap < 1e-4
