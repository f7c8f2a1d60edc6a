"""Vision special tokens in sampled responses (issue 14): banned at sampling by both engines,
and refused (or, by choice, masked) by every stage that turns a response into training input:
``RolloutSample.to_row``, collate / `Collator`, `PackingCollator`, the data packers'
``get_policy_input``, multi-turn appends and ReMA role encodings. One shared check,
`mmpipe.records.vision_tokens.VisionTokens`."""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe import rema, testing
from mmpipe.batching.packing import PackingCollator
from mmpipe.records.vision_tokens import VisionTokens
from mmpipe.errors import ArgumentError, PlaceholderError
from mmpipe.records.generation import SamplingParams
from mmpipe.records.rollout import RolloutSample
from mmpipe.rollout.multiturn import append_response, start
from mmpipe.rollout.packers import QwenVLDataPacker
from mmpipe.rollout.vllm_engine import BAN_BIAS, VLLMEngine, vllm_sampling_kwargs
from mmpipe.testing.invariants import assert_row_positions, assert_roundtrip

from helpers import FakeSamplingParams
from conftest import processor_for
from strategies import raw_rows, vision_token_injections

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
PROP = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---- the shared table ----------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_vision_tokens_come_from_the_family_table_and_the_tokenizer(family):
    proc = processor_for(family)
    vt = VisionTokens.from_processor(proc)
    fam = mmpipe.families.family_of(proc)
    spell = (fam.image_token, fam.video_token, fam.vision_start_token, fam.vision_end_token)
    assert vt.names == spell
    assert vt.ids == tuple(proc.tokenizer.convert_tokens_to_ids(t) for t in spell)
    assert vt.pad_ids == vt.ids[:2] and vt.replacement_id == proc.tokenizer.pad_token_id
    # a prompt row shows its image pad and block borders (no video: no video pad)
    row = mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q"}]}],
                             "images": [testing.tiny_image(40, 50)]}, proc, labels=False)
    shown = VisionTokens.from_rows([row])
    assert set(shown.ids) == {vt.ids[0], vt.ids[2], vt.ids[3]} and shown.pad_ids == (vt.ids[0],)
    assert VisionTokens.from_rows([mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, proc)]).ids == ()
    # the text family has none
    assert VisionTokens.from_processor(proc.tokenizer).ids == ()
    with pytest.raises(ArgumentError, match="on_vision_token must be one of"):
        VisionTokens.from_processor(proc, policy="drop")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=raw_rows(max_images=2), family=st.sampled_from(FAMILIES))
def test_an_encoded_row_never_trips_the_check(raw, family):
    proc = processor_for(family)
    try:
        row = mmpipe.encode_row(raw, proc)
    except mmpipe.errors.InputError:
        return
    vt = VisionTokens.from_processor(proc)
    assert vt.find(row.input_ids, row.mm_token_type_ids).tolist() == []
    assert_roundtrip([row], mmpipe.Collator(proc)([row]))


# ---- sampling ------------------------------------------------------------------------------
def test_n_above_one_with_temperature_zero_warns():
    with pytest.warns(UserWarning, match=r"n=4, temperature=0.0\) samples greedily.*temperature=1.0"):
        SamplingParams(n=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        SamplingParams(n=4, temperature=1.0)
        SamplingParams(n=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_sampling_kwargs_ban_the_vision_tokens(family):
    vt = VisionTokens.from_processor(processor_for(family))
    params = SamplingParams(max_new_tokens=7, n=2, temperature=1.0, seed=3)
    kw = vllm_sampling_kwargs(params, vt)
    assert kw["bad_words"] == list(vt.names) and "logit_bias" not in kw
    assert kw["n"] == 2 and kw["max_tokens"] == 7 and kw["logprobs"] == 0
    by_id = vllm_sampling_kwargs(params, vt, ban_with="logit_bias")
    assert by_id["logit_bias"] == {i: BAN_BIAS for i in vt.ids} and "bad_words" not in by_id
    free = vllm_sampling_kwargs(replace(params, allow_vision_tokens=True), vt)
    assert "bad_words" not in free and "logit_bias" not in free
    assert "bad_words" not in vllm_sampling_kwargs(params, VisionTokens.from_processor(processor_for(family).tokenizer))
    with pytest.raises(ArgumentError, match="ban_with"):
        vllm_sampling_kwargs(params, vt, ban_with="allowed_token_ids")


@dataclass
class _ParamsWithBadWords(FakeSamplingParams):
    """`FakeSamplingParams` plus vLLM's ban field (vLLM is not installed here)."""

    bad_words: Optional[list] = None


def test_vllm_engine_passes_the_ban_and_warns_when_a_factory_cannot_take_it():
    proc = processor_for("qwen2_vl")
    engine = VLLMEngine(object.__new__(type("LLM", (), {"generate": lambda *a, **k: []})), processor=proc,
                        sampling_params_factory=_ParamsWithBadWords)
    assert engine.sampling_params(SamplingParams()).bad_words == list(engine.vision_tokens.names)

    NoBan = FakeSamplingParams  # vllm.SamplingParams' fields without bad_words

    engine.sampling_params_factory = NoBan
    with pytest.warns(UserWarning, match="takes no bad_words: vision tokens are not banned"):
        engine.sampling_params(SamplingParams())
    with pytest.raises(ArgumentError, match="vision_token_ban"):
        VLLMEngine(engine.llm, processor=proc, sampling_params_factory=NoBan, vision_token_ban="mask")


# ---- every stage refuses (or masks) an injected vision token -----------------------------
@functools.lru_cache(maxsize=None)
def _setup(family):
    proc = processor_for(family)
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is it?"}]}],
           "images": [testing.tiny_image(44, 52, seed=5)]}
    prompt = mmpipe.encode_row(raw, proc, labels=False)
    vt = VisionTokens.from_processor(proc)
    text_ids = proc.tokenizer("a cat sat on the mat, 42 times.", add_special_tokens=False)["input_ids"]
    return proc, raw, prompt, vt, text_ids, QwenVLDataPacker(proc), QwenVLDataPacker(proc, on_vision_token="mask")


def _cases(family):
    _, _, _, vt, text_ids, _, _ = _setup(family)
    return vision_token_injections(vt.ids, text_ids)


def _check_refusal(e, vt, ids, positions, stage):
    first = positions[0]
    assert e.stage == stage and e.column == "input_ids"
    assert f"position {first}" in str(e) and vt.name(ids[first]) in str(e)
    assert "on_vision_token='mask'" in str(e)


@pytest.mark.parametrize("family", FAMILIES)
def test_to_row_refuses_or_masks_injected_vision_tokens(family):
    proc, _, prompt, vt, _, _, _ = _setup(family)
    P = prompt.num_tokens

    @PROP
    @given(case=_cases(family), index=st.integers(0, 5))
    def check(case, index):
        ids, positions = case
        sample = RolloutSample(prompt, index, 1, np.asarray(ids), None, "stop", vision_tokens=vt)
        with pytest.raises(PlaceholderError) as e:
            sample.to_row()
        _check_refusal(e.value, vt, ids, positions, "rollout")
        assert e.value.row == index and str(e.value).startswith(f"prompt {index}, sample 1: the response holds")
        # without the processor's table, to_row knows what the prompt shows (pads, block borders)
        shown = VisionTokens.from_rows([prompt])
        blind = replace(sample, vision_tokens=None)
        if any(i in shown.ids for i in ids):
            with pytest.raises(PlaceholderError):
                blind.to_row()
        else:  # only a video pad, which an image prompt does not show: collate with the processor catches it
            with pytest.raises(PlaceholderError, match="video pad"):
                mmpipe.collate([blind.to_row()], processor=proc)
        # "mask": the replacement id with label -100; nothing else changes; the row trains
        masked = replace(sample, vision_tokens=vt.with_policy("mask"))
        row = masked.to_row()
        resp, labels = row.input_ids[P:], row.labels[P:]
        assert resp[positions].tolist() == [vt.replacement_id] * len(positions)
        assert (labels[positions] == -100).all()
        keep = np.setdiff1d(np.arange(len(ids)), positions)
        assert resp[keep].tolist() == np.asarray(ids)[keep].tolist() == labels[keep].tolist()
        assert masked.response_mask.tolist() == [0 if k in positions else 1 for k in range(len(ids))]
        assert not len(vt.find(resp))
        assert_row_positions(row)
        assert_roundtrip([row], mmpipe.collate([row], processor=proc))

    check()


@pytest.mark.parametrize("family", FAMILIES)
def test_collate_and_pack_refuse_pads_at_text_positions(family):
    proc, _, prompt, vt, _, _, _ = _setup(family)
    good = RolloutSample(prompt, 0, 0, np.asarray(_setup(family)[4]), None, "stop").to_row()
    P = prompt.num_tokens

    @PROP
    @given(case=_cases(family))
    def check(case):
        ids, positions = case
        bad = replace(good, input_ids=np.concatenate([prompt.input_ids, ids]).astype(np.int64),
                      attention_mask=np.ones(P + len(ids), np.int64),
                      mm_token_type_ids=np.concatenate([prompt.mm_token_type_ids, np.zeros(len(ids), np.int64)]),
                      position_ids=RolloutSample(prompt, 0, 0, np.asarray(ids), None, "stop").position_ids,
                      labels=np.concatenate([np.full(P, -100), ids]).astype(np.int64))
        shown = VisionTokens.from_rows([good]).pad_ids  # what collate without a processor knows: the image pad
        builders = [(lambda rows: mmpipe.collate(rows, processor=proc), vt.pad_ids), (mmpipe.Collator(proc), vt.pad_ids),
                    (PackingCollator(proc), vt.pad_ids), (lambda rows: mmpipe.collate(rows), shown)]
        for build, known in builders:
            pads = [p for p in positions if ids[p] in known]
            if not pads:  # no pad: a stray start / end is to_row's to refuse; collate only guards the count
                build([good, bad])
                continue
            with pytest.raises(PlaceholderError) as e:
                build([good, bad])
            assert e.value.row == 1 and e.value.stage == "collate"
            assert f"position {P + pads[0]} of the row" in str(e.value)

    check()


@pytest.mark.parametrize("family", FAMILIES)
def test_packer_multiturn_and_rema_refuse_injected_vision_tokens(family):
    proc, raw, prompt, vt, _, packer, masking = _setup(family)
    conv = start(raw, proc, index=4)

    @PROP
    @given(case=_cases(family), at=st.integers(0, 12))
    def check(case, at):
        ids, positions = case
        # cosmos-rl packer: refused, or masked when the packer was built with on_vision_token="mask"
        with pytest.raises(PlaceholderError) as e:
            packer.get_policy_input(prompt, ids)
        _check_refusal(e.value, vt, ids, positions, "rollout")
        row = masking.get_policy_input(prompt, ids)
        assert not len(vt.find(row.input_ids[prompt.num_tokens:]))
        assert (row.labels[prompt.num_tokens:][positions] == -100).all()
        policy = masking.policy_collate_fn([row], masking.policy_compute_max_len([row]))
        assert policy["logprob_masks"].sum() == len(ids) - len(positions)
        # multi-turn append: refused with the message it always had
        with pytest.raises(PlaceholderError, match=r"conversation 4: the response holds \d+ .*token") as e:
            append_response(conv, ids)
        _check_refusal(e.value, vt, ids, positions, "rollout")
        # ReMA: rollout responses lose their special tokens (response_text); an assistant message
        # handed over with a vision token spelled out is refused
        tok = proc.tokenizer
        assert not any(name in rema.response_text(ids, tok) for name in vt.names)
        text = "the answer is 42"
        k = min(at, len(text))
        reply = text[:k] + vt.name(ids[positions[0]]) + text[k:]
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]},
                {"role": "assistant", "content": reply}]
        with pytest.raises(PlaceholderError, match=r"conversation, message 1: the response holds 1 ") as e:
            rema.encode_conversation(msgs, proc, images=raw["images"])
        assert e.value.stage == "rollout"

    check()
