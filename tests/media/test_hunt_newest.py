"""The newest model lines as users name them: Qwen3.5 / Qwen3.5-MoE / Qwen3-VL-MoE / GLM-4.5V rows are
their native family's (qwen3_vl / glm4v), so a ``family=`` argument given as the model type
(``config.model_type``, ``"qwen3_5"``) or as the checkpoint's config.json read into a dict means that
family; anything that names no family is an `ArgumentError` (still a ``TypeError`` for callers that
caught the old one), never a bare ``TypeError`` from deep inside."""

from __future__ import annotations

import pytest
import torch

from mmpipe.errors import ArgumentError
from mmpipe.families import GEMMA3, GLM4V, QWEN3_VL, family_of
from mmpipe.rope import get_rope_index

IDS = torch.ones(1, 4, dtype=torch.long)
TYPES = torch.zeros(1, 4, dtype=torch.long)


@pytest.mark.parametrize("model_type, fam", [("qwen3_5", QWEN3_VL), ("qwen3_5_moe", QWEN3_VL),
                                             ("qwen3_vl_moe", QWEN3_VL), ("glm4v_moe", GLM4V)])
def test_model_type_names_resolve_to_their_family(model_type, fam):
    """Was: ArgumentError "unknown model family 'qwen3_5'" (collate, rope.get_rope_index, ...)."""
    assert family_of(model_type) is fam
    assert family_of({"model_type": model_type, "vision_config": {}}) is fam
    pos, _ = get_rope_index(IDS, TYPES, family=model_type)
    assert pos[:, 0].tolist() == [[0, 1, 2, 3]] * 3


def test_config_dict_of_a_tiled_family():
    assert family_of({"model_type": "gemma3", "vision_config": {}}) is GEMMA3


@pytest.mark.parametrize("bad", [None, 3, {"no_model_type": 1}, 1.5])
def test_what_names_no_family_is_a_typed_error(bad):
    """Was: builtins.TypeError "cannot tell the model family of NoneType" from get_rope_index(family=None)."""
    with pytest.raises(ArgumentError, match="family") as info:
        get_rope_index(IDS, TYPES, family=bad)
    assert isinstance(info.value, TypeError)  # callers that caught the old TypeError still do
    assert type(bad).__name__ in str(info.value)


def test_unknown_names_still_refused():
    with pytest.raises(ArgumentError, match="unknown model family 'qwen9'"):
        family_of("qwen9")


# ---- the Omni thinkers' rollout prompts: rows that do not store their clips take them as audios= ----------


@pytest.fixture(scope="module")
def omni():
    from mmpipe.offline.qwen3_omni import build_processor

    return build_processor()


def _omni_row(proc):
    import numpy as np

    import mmpipe
    from mmpipe import testing

    clip = {"array": (np.sin(np.arange(8000) / 7.0) * 0.3).astype(np.float32), "sampling_rate": 16000}
    imgs = [testing.tiny_image(40, 56, seed=1)]
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "image"}, {"type": "audio"}, {"type": "text", "text": "What?"}]}]
    return mmpipe.encode({"messages": msgs, "images": imgs, "audios": [clip]}, processor=proc), imgs, clip


def test_omni_prompt_takes_the_clips_the_error_names(omni):
    """Was: ArgumentError "pass audios= (the row's clips)", and to_vllm_prompts(..., audios=) a
    TypeError (no such argument): a row stored without its clips had no prompt at all."""
    import numpy as np

    import mmpipe
    from mmpipe.rollout import to_vllm_prompts

    enc, imgs, clip = _omni_row(omni)
    row = mmpipe.MultiModalInputs.from_dict(enc)
    with pytest.raises(ArgumentError, match="audios="):
        to_vllm_prompts([row], omni, images=[imgs])
    p = to_vllm_prompts([row], omni, images=[imgs], audios=[[clip]])[0]
    mm = p["multi_modal_data"]
    text = omni.tokenizer.decode(p["prompt_token_ids"])
    out = omni(text=[text], images=mm["image"], audio=[a for a, _ in mm["audio"]], return_tensors="np")
    assert out["input_ids"][0].tolist() == [int(t) for t in enc["input_ids"]]  # vLLM's expansion is the row
    np.testing.assert_array_equal(mm["audio"][0][0], clip["array"])


def test_audios_argument_is_checked(omni):
    import mmpipe
    from mmpipe import testing
    from mmpipe.rollout import to_vllm_prompts

    enc, imgs, clip = _omni_row(omni)
    with pytest.raises(ArgumentError, match=r"audios= must hold one list of audio clips per row \(1 rows\)"):
        to_vllm_prompts([enc], omni, images=[imgs], audios=[[clip], [clip]])  # 2 lists for 1 row
    with pytest.raises(ArgumentError, match="row 0: audios= holds one list of clips per row, got dict"):
        to_vllm_prompts([enc], omni, images=[imgs], audios=[clip])  # the clip, not a list of clips
    qwen = testing.build_processor("qwen3_vl")
    q = mmpipe.encode({"messages": [{"role": "user", "content": "hi"}]}, processor=qwen)
    with pytest.raises(ArgumentError, match="audios= is for"):
        to_vllm_prompts([q], qwen, audios=[[clip]])
