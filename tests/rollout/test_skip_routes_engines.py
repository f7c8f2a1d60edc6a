"""Rollout prompts and rows that failed to encode (skip / bad-input hunt): a record read from an
on_error="skip" placeholder (``MultiModalInputs.from_dict`` keeps no failure: 0 tokens) is refused as a
prompt by name, the row, column input_ids, stage rollout and the fix, not sent as an empty prompt."""

from __future__ import annotations

import pytest

from mmpipe.errors import InputError
from mmpipe.records.generation import SamplingParams
from mmpipe.records.row import MultiModalInputs
from mmpipe.rollout import to_vllm_prompts
from mmpipe.rollout.transformers_engine import TransformersEngine
from mmpipe.rollout.vllm_engine import VLLMEngine

from conftest import model_for
from helpers import FakeSamplingParams, mapped_with_a_failed_row


@pytest.fixture(scope="module")
def records():
    enc, proc = mapped_with_a_failed_row()
    return [MultiModalInputs.from_dict(enc[i]) for i in range(3)], proc


def _refused(e):
    assert (e.value.row, e.value.column, e.value.stage) == (1, "input_ids", "rollout")
    assert "drop_failed" in str(e.value)


def test_to_vllm_prompts_refuses_an_empty_prompt_row(records):
    """Old code: prompt 1 was {'prompt_token_ids': []}, silently."""
    recs, proc = records
    with pytest.raises(InputError, match="holds no token") as e:
        to_vllm_prompts(recs, proc)
    _refused(e)


def test_transformers_engine_refuses_an_empty_prompt_row(records):
    """Old code: a bare ValueError 'torch.cat(): expected a non-empty list of Tensors' from generate."""
    recs, proc = records
    with pytest.raises(InputError, match="holds no token") as e:
        TransformersEngine(model_for("qwen2_vl"), proc).generate(recs, SamplingParams(max_new_tokens=2))
    _refused(e)


def test_vllm_engine_refuses_an_empty_prompt_row_before_calling_vllm(records):
    """Old code: vLLM got the empty prompt (here the stand-in's AssertionError)."""
    class LLM:
        def generate(self, prompts, sampling_params, use_tqdm=True):
            raise AssertionError(f"vLLM was called with {[len(p['prompt_token_ids']) for p in prompts]} tokens")

    recs, proc = records
    engine = VLLMEngine(LLM(), processor=proc, sampling_params_factory=FakeSamplingParams)
    with pytest.raises(InputError, match="holds no token") as e:
        engine.generate(recs, SamplingParams(max_new_tokens=2))
    _refused(e)
    assert len(to_vllm_prompts([recs[0], recs[2]], proc)) == 2  # guard: the good rows are prompts
