"""Cost in the samples per prompt, counted (never timed): VisionGRPOTrainer encodes each prompt of a
generation batch once, not once per generation TRL repeats it for."""

from __future__ import annotations

import datasets
import pytest

pytest.importorskip("trl")
from trl import GRPOConfig  # noqa: E402

from mmpipe import testing  # noqa: E402
from mmpipe.encoding.encoder import Encoder  # noqa: E402
from mmpipe.hosts.trl_grpo import VisionGRPOTrainer, grpo_settings  # noqa: E402

from conftest import processor_for  # noqa: E402


def _rows() -> list[dict]:
    """TRL's VLM format: prompt i holds i + 1 images."""
    content = [[{"type": "image"}] * (i + 1) + [{"type": "text", "text": f"q{i}"}] for i in range(2)]
    return [{"prompt": [{"role": "user", "content": content[i]}],
             "images": [testing.tiny_image(56, 56 + 28 * j, seed=i * 10 + j) for j in range(i + 1)]}
            for i in range(2)]


def test_grpo_encodes_each_prompt_once_per_generation_batch(tmp_path, monkeypatch):
    """TRL hands the trainer each prompt num_generations times in a row; each copy was encoded (its
    images processed) again: 64 prompts x 16 samples = 1,024 encodes a step for 64 prompts. Counted:
    one step of 2 prompts x 4 generations encoded 8 rows before, 2 now."""
    encoded = []
    real = Encoder.encode_row
    monkeypatch.setattr(Encoder, "encode_row", lambda self, *a, **k: encoded.append(1) or real(self, *a, **k))
    args = GRPOConfig(str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=4, max_steps=1, report_to="none", save_strategy="no", seed=0,
                      dataloader_num_workers=0, **grpo_settings())
    trainer = VisionGRPOTrainer(model=testing.build_model("qwen2_vl"), reward_funcs=lambda completions, **k: [
        float(len(str(c))) for c in completions], args=args, train_dataset=datasets.Dataset.from_list(_rows()),
        processing_class=processor_for("qwen2_vl"))
    rows = []
    real_rollout = trainer._mm_rollout
    monkeypatch.setattr(trainer, "_mm_rollout", lambda: (rows.extend(trainer._mm_pending.rows), real_rollout())[1])
    encoded.clear()
    trainer.train()
    assert len(rows) == 8 and sorted(r.num_images for r in rows) == [1] * 4 + [2] * 4
    assert len(encoded) == 2, len(encoded)


def test_verl_rows_read_the_batch_vision_inputs_once(monkeypatch):
    """verl_rows read the whole batch's vision inputs and its offsets (four lists of B+1) again for
    every row: quadratic in the rows (a verl step of 512 prompts x 16 samples is 8,192 rows).
    Counted: 12 rows read them 12 times before, once now; every row keeps its own images."""
    import mmpipe
    from mmpipe.hosts.verl import verl_rows
    from mmpipe.records.batch import BatchedMultiModalInputs

    processor = processor_for("qwen2_vl")
    rows = [mmpipe.encode_row(r, processor, labels=False) for r in _rows()] * 6
    reads = []
    real = BatchedMultiModalInputs.vision_inputs
    monkeypatch.setattr(BatchedMultiModalInputs, "vision_inputs",
                        lambda self, *a, **k: reads.append(1) or real(self, *a, **k))
    out = verl_rows(rows, processor)
    assert len(reads) == 1, len(reads)
    for row, rec in zip(out, rows):
        assert row["multi_modal_inputs"]["image_grid_thw"].tolist() == rec.image_grid_thw.tolist()
        assert row["multi_modal_inputs"]["pixel_values"].shape[0] == int(rec.image_grid_thw.prod(-1).sum())
