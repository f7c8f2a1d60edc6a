"""Which rollout stages take which family's rows (`mmpipe.rollout.support`): the patch grids
every stage, the tiled families all but multi-turn appends and verl rows, the generic path none,
each refusal an ArgumentError naming the stage, the family and what to use; the three media
strategies answer the rollout questions with the same functions."""

from __future__ import annotations

import inspect

import pytest

from mmpipe.errors import ArgumentError
from mmpipe.families import ALL_FAMILIES, GEMMA3, GENERIC, QWEN2_VL
from mmpipe.media import KINDS, strategy
from mmpipe.offline import tiny_image
from mmpipe.offline.other_vlms import build_foreign_processor
from mmpipe.records.generation import Completion, Generation
from mmpipe.rollout.support import ROLLOUT_STAGES, check_rollout

ROLLOUT_FUNCTIONS = ("vision_tokens", "rollout_refusal", "vllm_prompt")


def test_every_strategy_has_the_rollout_functions_with_one_signature():
    for name in ROLLOUT_FUNCTIONS:
        sigs = {kind: inspect.signature(getattr(strategy(kind), name)) for kind in KINDS}
        assert len(set(map(str, sigs.values()))) == 1, sigs


@pytest.mark.parametrize("stage", sorted(ROLLOUT_STAGES))
def test_which_stage_takes_which_kind(stage):
    assert check_rollout(QWEN2_VL, stage) is QWEN2_VL
    if stage in ("multiturn", "verl"):
        use = "TransformersEngine" if stage == "multiturn" else "to_vllm_prompts"
        with pytest.raises(ArgumentError, match=f"not available for gemma3 rows: .*{use}"):
            check_rollout(GEMMA3, stage)
    else:
        assert check_rollout(GEMMA3, stage) is GEMMA3
    if stage in ("generate", "vllm_prompts"):  # TransformersEngine: the model's own positions, the processor's
        # named tokens banned; vLLM prompts: the Omni thinkers', other processors refused per processor
        assert check_rollout(GENERIC, stage) is GENERIC
    elif stage == "vllm_engine":
        with pytest.raises(ArgumentError, match="not available for generic rows: VLLMEngine does not take .*to_vllm_prompts"):
            check_rollout(GENERIC, stage)
    else:
        with pytest.raises(ArgumentError, match="not available for generic rows: the generic path"):
            check_rollout(GENERIC, stage)
    with pytest.raises(ArgumentError, match="stage must be one of"):
        check_rollout(QWEN2_VL, "nope")


def test_every_family_names_its_vision_tokens_by_kind():
    for fam in ALL_FAMILIES.values():
        table = fam.media.vision_tokens(fam)
        assert set(table) <= {"image", "video", "vision_start", "vision_end", "audio", "audio_start", "audio_end"}
    want = {"image": "<image_soft_token>", "vision_start": "<start_of_image>"}
    assert GEMMA3.media.vision_tokens(GEMMA3) == want
    assert GENERIC.media.vision_tokens(GENERIC) == {}


@pytest.fixture(scope="module")
def generic():
    import mmpipe

    proc = build_foreign_processor("idefics3")
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
           "images": [tiny_image(40, 56)]}
    return proc, raw, mmpipe.encode_row(raw, proc, labels=False)


def test_the_generic_path_is_refused_by_every_rollout_stage_but_generation(generic):
    """Every stage but generation with TransformersEngine (tests/encoding/test_omni_audio.py) and
    the Omni thinkers' vLLM prompts (tests/rollout/test_processor_prompts.py): a generic row of
    another processor (Idefics3 here) gets no vLLM prompt, and VLLMEngine takes no generic rows."""
    from mmpipe.hosts.verl import verl_rows
    from mmpipe.rollout import VLLMEngine, start, to_vllm_prompts, unbatch_rollout

    proc, raw, row = generic
    done = Completion(token_ids=[1, 2], logprobs=None, finish_reason="stop")
    gens = [Generation(prompt_index=0, completions=[done])]

    class LLM:
        def generate(self, *args, **kwargs):
            return []

    stored = row.to_dict()
    calls = {"vllm_prompts": [lambda: to_vllm_prompts([row], proc), lambda: to_vllm_prompts([stored])],
             "samples": [lambda: unbatch_rollout([row], gens),
                         lambda: unbatch_rollout([row], gens, processor=proc)],
             "vllm_engine": [lambda: VLLMEngine(LLM(), processor=proc, sampling_params_factory=dict)],
             "verl": [lambda: verl_rows([stored], proc), lambda: verl_rows([stored])],
             "multiturn": [lambda: start(raw, proc)]}
    assert sorted(calls) == sorted(set(ROLLOUT_STAGES) - {"generate"})
    for stage, fns in calls.items():
        what = ROLLOUT_STAGES[stage].split(" (")[0]
        why = "VLLMEngine does not take" if stage == "vllm_engine" else "the generic path"
        for fn in fns:
            with pytest.raises(ArgumentError, match=f"{what} .*not available for generic rows: {why}"):
                fn()
