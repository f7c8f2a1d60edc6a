"""`VisionGRPOTrainer` handed encoded rows that failed under ``on_error="skip"`` (empty rows, their
failure in ``mmpipe_error``): refused at construction, naming the rows and the fix.

Before the fix the trainer built, and the first generation batch holding such a row raised
(``check_not_failed`` in ``_prompt_row``), possibly hours into training.
"""

from __future__ import annotations

import datasets
import pytest
pytest.importorskip("trl")
from trl import GRPOConfig  # noqa: E402

import mmpipe  # noqa: E402
from mmpipe import testing  # noqa: E402
from mmpipe.errors import InputError  # noqa: E402
from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings  # noqa: E402

from conftest import processor_for  # noqa: E402


def _reward(completions, **kwargs) -> list[float]:
    return [0.0 for _ in completions]


def test_failed_rows_are_refused_at_construction(tmp_path):
    proc = processor_for("qwen2_vl")
    rows = [{"prompt": [{"role": "user", "content": [{"type": "image"}] * k + [{"type": "text", "text": "Show"}]}],
             "images": [testing.tiny_image(56, 56, seed=j) for j in range(n)]} for k, n in ((1, 1), (1, 0), (0, 0))]
    src = datasets.Dataset.from_list(rows)
    enc = src.map(mmpipe.encode, fn_kwargs={"processor": proc, "labels": False, "on_error": "skip"},
                  with_indices=True, remove_columns=["images"])
    args = GRPOConfig(str(tmp_path / "out"), per_device_train_batch_size=2, num_generations=2, max_steps=1,
                      report_to="none", save_strategy="no", **grpo_settings())
    model = testing.build_model("qwen2_vl")
    with pytest.raises(InputError, match="drop_failed") as e:
        VisionGRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=enc, processing_class=proc)
    assert e.value.row == 1 and e.value.column == "mmpipe_error" and "VisionGRPOTrainer" in str(e.value)
    kept, _ = mmpipe.drop_failed(enc)
    VisionGRPOTrainer(model=model, reward_funcs=_reward, args=args, train_dataset=kept, processing_class=proc)
