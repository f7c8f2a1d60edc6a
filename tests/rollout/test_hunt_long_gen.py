"""Long sampled responses (thousands of ids at temperature 1.0) through rollout result assembly:
`unbatch_rollout` / `rollout_rows` and the multi-turn `append_response`, fed by a fake engine.

- a long response is kept whole, labelled on every sampled token, positions continued;
- a stop id (eos / end of turn) before the last token - an engine's padded output, text
  sampled past ``<|im_end|>`` - is refused (typed, naming prompt, sample, position), never
  trained on as the reply;
- logprobs that are no log-probabilities (NaN, inf, > 0, vLLM's ``{id: Logprob}`` dicts) are
  refused with a typed error instead of poisoning the loss or a bare TypeError.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.generation import Completion, Generation
from mmpipe.rollout import multiturn as mt
from mmpipe.rollout.results import rollout_rows, unbatch_rollout

from conftest import processor_for

RAW = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
       "images": [Image.new("RGB", (56, 56), (10, 200, 30))]}


@pytest.fixture(scope="module")
def setup():
    proc = processor_for("qwen2_vl")
    tok = proc.tokenizer
    row = mmpipe.encode_row(RAW, proc)
    rng = np.random.default_rng(0)
    body = rng.integers(0, 200, 3000).tolist()  # plain text ids (no special / vision token)
    return proc, row, body, tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id


def _rows(proc, row, completion):
    return rollout_rows([row], [Generation(0, [completion])], proc)


def test_long_response_kept_whole_and_labelled(setup):
    proc, row, body, im_end, _ = setup
    ids = body + [im_end]
    out = _rows(proc, row, Completion(ids, [-1.0] * len(ids), finish_reason="stop", stop_reason=im_end))[0]
    P = row.num_tokens
    assert out.num_tokens == P + len(ids)
    np.testing.assert_array_equal(out.labels[P:], ids)
    assert (out.labels[:P] == IGNORE_INDEX).all()
    testing.invariants.assert_row_positions(out)


def test_cut_at_max_tokens_is_kept(setup):
    proc, row, body, _, _ = setup
    out = _rows(proc, row, Completion(body[:2048], [-0.5] * 2048, finish_reason="length"))[0]
    assert int((out.labels != IGNORE_INDEX).sum()) == 2048


@pytest.mark.parametrize("tail", ["pads", "text"])
def test_stop_token_before_the_end_is_refused(setup, tail):
    proc, row, body, im_end, pad = setup
    ids = body[:10] + [im_end] + ([pad] * 50 if tail == "pads" else body[10:60])
    lps = [-1.0] * len(ids)
    with pytest.raises(InputError, match="position 10") as e:
        _rows(proc, row, Completion(ids, lps, finish_reason="stop"))
    assert e.value.column == "token_ids" and e.value.row == 0
    with pytest.raises(InputError, match="position 10"):  # without a processor: the completion's stop_reason
        unbatch_rollout([row], [Generation(0, [Completion(ids, lps, stop_reason=im_end)])])


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf"), 2.5])
def test_bad_logprob_values_are_refused(setup, bad):
    proc, row, body, im_end, _ = setup
    ids = body[:20] + [im_end]
    lps = [-1.0] * len(ids)
    lps[7] = bad
    with pytest.raises(InputError, match="position 7") as e:
        _rows(proc, row, Completion(ids, lps))
    assert e.value.column == "logprobs"


def test_vllm_logprob_dicts_are_a_typed_error(setup):
    proc, row, body, im_end, _ = setup
    ids = body[:5] + [im_end]
    with pytest.raises(InputError, match="logprob") as e:
        _rows(proc, row, Completion(ids, [{t: -0.3} for t in ids]))
    assert e.value.column == "logprobs"


def test_multiturn_response_with_stop_before_end_is_refused(setup):
    proc, _, body, im_end, pad = setup
    conv = mt.start(RAW, proc)
    for ids in (body[:10] + [im_end] + [pad] * 5, body[:10] + [im_end] + body[10:20] + [im_end]):
        with pytest.raises(InputError, match="position 10"):
            mt.append_response(conv, ids)
    long = mt.append_response(conv, body[:2000] + [im_end])  # a long reply that ends once is kept
    assert int((long.row.labels != IGNORE_INDEX).sum()) == 2001


def test_transformers_engine_ends_responses_at_the_model_context():
    """generate() ran silently past max_position_embeddings (prompt 133 + 200 new tokens in a 256
    context); vLLM ends the completion at max_model_len and refuses a prompt that fills it."""
    import copy

    from mmpipe.records.generation import SamplingParams
    from mmpipe.rollout.transformers_engine import TransformersEngine

    from conftest import model_for

    proc = processor_for("qwen2_vl")
    model = copy.deepcopy(model_for("qwen2_vl"))
    model.config.text_config.max_position_embeddings = 64
    eng = TransformersEngine(model, proc)
    short = mmpipe.encode_row({"messages": [{"role": "user", "content": "hi"}]}, proc)
    long = mmpipe.encode_row({"messages": [{"role": "user", "content": "w " * 25}]}, proc)
    params = SamplingParams(max_new_tokens=40, n=2, temperature=1.0, seed=0, logprobs=True)
    gens = eng.generate([short, long], params)
    for row, gen in zip([short, long], gens):
        for c in gen.completions:
            assert row.num_tokens + len(c.token_ids) <= 64 and len(c.logprobs) == len(c.token_ids)
            if row is long and c.finish_reason == "length":
                assert row.num_tokens + len(c.token_ids) == 64
    huge = mmpipe.encode_row({"messages": [{"role": "user", "content": "w " * 60}]}, proc)
    with pytest.raises(InputError, match="context") as e:
        eng.generate([short, huge], params)
    assert e.value.row == 1
