"""The 2-rank Trainer job of test_hunt_distributed.py on transformers 4.57 (its own environment,
scripts/envs/tf457.sh), where gradient checkpointing is reentrant by default."""

from __future__ import annotations

import pytest

from test_hunt_distributed import run_job, trained

pytestmark = pytest.mark.needs_env("tf457")


def test_gradient_checkpointing_on_transformers_4_which_checkpoints_reentrantly(tmp_path):
    """transformers 4.57 checkpoints with use_reentrant=True by default: under find_unused_parameters=True
    DDP failed at step 1 ('Expected to mark a variable ready only once'), without it the ranks hung at
    the step where one rank's batch holds no image. trainer_settings() adds
    gradient_checkpointing_kwargs={'use_reentrant': False} there: the same 3 steps as without checkpointing."""
    job = run_job(tmp_path, "qwen2_vl", ["map", "map_gc"])
    ranks = trained(job, "map_gc")
    assert [r["batches"] for r in ranks] == [r["batches"] for r in trained(job, "map")]
