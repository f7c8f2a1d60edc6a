"""Precision / device hunt, rollout side: a batch collated with ``pixels_on_device=True`` (issue 34:
uint8 pixels in the batch, expanded on the device by ``model_inputs``) goes to ``generate``
through `to_generate_kwargs` as the float32 batch does. Before the fix it was refused with a
PixelDataError saying the rows had no pixel data and to re-encode with pixels='uint8' (they were
uint8 already)."""

from __future__ import annotations

import pytest
import torch

import mmpipe
from mmpipe import testing
from mmpipe.rollout.inputs import to_generate_kwargs

from helpers import encode_mixed, prompt_rows


@pytest.mark.parametrize("family,layout", [("qwen2_vl", None), ("qwen2_5_vl", ["I", "", "v"])])
def test_generate_kwargs_of_a_pixels_on_device_batch(family, layout):
    proc = testing.build_processor(family)
    rows = prompt_rows(proc, (1, 0, 2)) if layout is None else encode_mixed(layout, proc, answer=False)
    want = to_generate_kwargs(mmpipe.collate(rows, processor=proc, padding_side="left"))
    compact = mmpipe.collate(rows, processor=proc, padding_side="left", pixels_on_device=True)
    assert compact.pixel_values is None and compact.pixel_values_videos is None
    got = to_generate_kwargs(compact, "cpu")
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k


def test_greedy_generate_in_bfloat16_from_a_pixels_on_device_batch():
    proc = testing.build_processor("qwen2_vl")
    model = testing.build_model("qwen2_vl").to(torch.bfloat16).eval()
    rows = prompt_rows(proc, (2, 1))
    outs = []
    for on_device in (False, True):
        batch = mmpipe.collate(rows, processor=proc, padding_side="left", pixels_on_device=on_device)
        with torch.no_grad():
            outs.append(model.generate(**to_generate_kwargs(batch, "cpu", model=model), max_new_tokens=4,
                                       do_sample=False, pad_token_id=proc.tokenizer.pad_token_id))
    assert torch.equal(outs[0], outs[1])


def test_bfloat16_logprob_tensors_are_taken_as_their_values():
    """An engine over a bf16 model that hands back its logprobs as they come (a bfloat16 tensor):
    before the fix an InputError said the values were not numbers ('Got unsupported ScalarType
    BFloat16') and told the caller to pass the sampled token's logprob, which it had done."""
    from mmpipe.records.generation import Completion, Generation
    from mmpipe.rollout.results import unbatch_rollout

    proc = testing.build_processor("qwen2_vl")
    prompts = prompt_rows(proc, (1,))
    lp = torch.tensor([-0.5, -1.25, -0.0078125], dtype=torch.bfloat16)  # exact in bf16 and float32
    got, want = (unbatch_rollout(prompts, [Generation(0, [Completion(ids, lps, "length")])], processor=proc)
                 for ids, lps in ((torch.tensor([40, 41, 42]), lp), ([40, 41, 42], lp.float().tolist())))
    assert got[0].logprobs.dtype == want[0].logprobs.dtype
    assert got[0].logprobs.tolist() == want[0].logprobs.tolist() == [-0.5, -1.25, -0.0078125]
