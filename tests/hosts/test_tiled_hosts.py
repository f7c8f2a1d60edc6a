"""The host integrations with a tiled family's processor and rows (Gemma 3, InternVL,
LLaVA-OneVision): transformers' Trainer trains on them through TrainerCollator (its batch ==
the BatchedMultiModalInputs's model inputs, same loss), verl_rows refuses them with an ArgumentError naming
what to use, and so does collator_constants (which used to fail with an AttributeError);
mmpipe.Encoder takes them (one Encoder for every family)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
import torch
from PIL import Image

import mmpipe
from mmpipe.offline import build_processor
from mmpipe.batching.collate import collator_constants
from mmpipe.errors import ArgumentError
from mmpipe.hosts.trainer import TrainerCollator, trainer_settings
from mmpipe.hosts.verl import verl_batch, verl_rows
from mmpipe.offline.gemma3 import build_gemma3_model
from mmpipe.offline.tile_builders import build_tiled2_model

FAMILIES = ("gemma3", "internvl", "llava_onevision")
RNG = np.random.default_rng(21)
IMAGES = [Image.fromarray(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in [(40, 56), (70, 30), (33, 97)]]


def _processor(name):
    return build_processor(name)


def _model(name):
    return build_gemma3_model() if name == "gemma3" else build_tiled2_model(name)


def _raws(counts=(1, 0, 2, 3)) -> list[dict]:
    return [{"messages": [{"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": f"q {k}"}]},
                          {"role": "assistant", "content": [{"type": "text", "text": f"a cat {k}" * (k + 1)}]}],
             "images": IMAGES[:n]} for k, n in enumerate(counts)]


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):
    proc = _processor(request.param)
    enc, _ = mmpipe.encode_dataset(datasets.Dataset.from_list(_raws()), proc)
    return request.param, proc, enc


def test_trainer_collator_equals_the_tiled_batch(fam):
    name, proc, enc = fam
    rows = list(enc)
    out = TrainerCollator(proc)(rows)
    batch = mmpipe.Collator(proc, padding_side="right")(rows)
    want = batch.model_inputs()
    assert sorted(out) == sorted(want) and out["position_ids"].shape == out["input_ids"].shape
    for k in want:
        assert torch.equal(torch.as_tensor(out[k]), want[k]), k
    model = _model(name)
    with torch.no_grad():
        a, b = model(**out).loss, model(**want).loss
    assert torch.isfinite(a) and a == b


def test_transformers_trainer_trains_on_tiled_rows(fam, tmp_path):
    import transformers

    name, proc, enc = fam
    model = _model(name).train()
    args = transformers.TrainingArguments(str(tmp_path), per_device_train_batch_size=2, max_steps=2, use_cpu=True,
                                          report_to=[], save_strategy="no", logging_steps=1, learning_rate=1e-3,
                                          **trainer_settings())
    trainer = transformers.Trainer(model=model, args=args, train_dataset=enc, data_collator=TrainerCollator(proc))
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)


def test_verl_rows_refuse_tiled_rows(fam):
    name, proc, enc = fam
    rows = list(enc)
    batch = mmpipe.Collator(proc)(rows)
    for call in (lambda: verl_rows(rows, proc), lambda: verl_rows(rows), lambda: verl_rows(enc),
                 lambda: verl_rows(batch), lambda: verl_batch(rows, proc),
                 lambda: verl_rows(enc.with_format("arrow")[:2])):
        with pytest.raises(ArgumentError, match=f"{name} rows: .*to_vllm_prompts"):
            call()


def test_encoder_and_collator_constants_refuse_tiled_processors():
    for name in FAMILIES:
        proc = _processor(name)
        assert mmpipe.Encoder(proc).family.name == name  # one Encoder for every family (issue 26)
        with pytest.raises(ArgumentError, match=rf"verl_rows takes the Qwen-VL .*not {name}.*mmpipe\.Collator"):
            collator_constants("verl_rows", proc, None, None)
        with pytest.raises(ArgumentError, match=rf"not {name}"):
            collator_constants("x", None, name, 0)
