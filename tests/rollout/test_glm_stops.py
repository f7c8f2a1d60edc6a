"""GLM-4.1V / 4.6V stop at the next turn's header as well as at ``<|endoftext|>``: their
checkpoints' generation config lists ``eos_token_id`` [<|endoftext|>, <|user|>, <|observation|>]
(the template writes no end of turn). A sampled reply holding one of those headers before its
last token (text sampled past the turn's end, as an engine run without the full stop set gives
it: a hallucinated user turn) is refused on every rollout route, like ``<|im_end|>`` mid-reply
for Qwen; a reply ending with one is kept."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import mmpipe
from mmpipe import testing
from mmpipe.errors import InputError
from mmpipe.families import resolve_family
from mmpipe.records.columns import IGNORE_INDEX
from mmpipe.records.generation import Completion, Generation
from mmpipe.rollout import multiturn as mt
from mmpipe.rollout.results import rollout_rows
from mmpipe.rollout.support import stop_ids

from conftest import model_for, processor_for

RAW = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Q?"}]}],
       "images": [Image.new("RGB", (112, 112), (10, 200, 30))]}
HEADERS = ("<|user|>", "<|observation|>")


@pytest.fixture(scope="module")
def glm():
    proc = processor_for("glm4v")
    return proc, mmpipe.encode_row(RAW, proc), np.random.default_rng(0).integers(0, 200, 40).tolist()


def test_stop_set_is_the_checkpoints_generation_config():
    proc = processor_for("glm4v")
    eos = model_for("glm4v").generation_config.eos_token_id  # the offline builder writes the published list
    assert stop_ids(proc, resolve_family(proc)) == frozenset(eos) and len(eos) == 3


@pytest.mark.parametrize("family", ["glm46v", "qwen2_vl"])
def test_other_families_stop_sets(family):
    proc = processor_for(family)
    tok = proc.tokenizer
    got = stop_ids(proc, resolve_family(proc))
    if family == "glm46v":  # GLM-4.6V's generation config stops at the same headers
        assert {tok.convert_tokens_to_ids(t) for t in HEADERS} <= got
    else:
        assert got == {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}


@pytest.mark.parametrize("header", HEADERS)
def test_header_before_the_end_is_refused(glm, header):
    proc, row, body = glm
    h = proc.tokenizer.convert_tokens_to_ids(header)
    ids = body[:12] + [h] + body[12:30]  # the model went on into a turn it opened itself
    with pytest.raises(InputError, match="position 12") as e:
        rollout_rows([row], [Generation(0, [Completion(ids, [-1.0] * len(ids), finish_reason="stop")])], proc)
    assert e.value.column == "token_ids" and e.value.row == 0


@pytest.mark.parametrize("header", HEADERS)
def test_reply_ending_with_a_header_is_kept(glm, header):
    proc, row, body = glm
    ids = body[:12] + [proc.tokenizer.convert_tokens_to_ids(header)]
    out = rollout_rows([row], [Generation(0, [Completion(ids, [-1.0] * len(ids), finish_reason="stop")])], proc)[0]
    np.testing.assert_array_equal(out.labels[row.num_tokens:], ids)
    assert (out.labels[:row.num_tokens] == IGNORE_INDEX).all()


def test_multiturn_append_refuses_a_header_mid_reply(glm):
    proc, _, body = glm
    user = proc.tokenizer.convert_tokens_to_ids("<|user|>")
    conv = mt.start(RAW, proc)
    with pytest.raises(InputError, match="position 5"):
        mt.append_response(conv, body[:5] + [user] + body[5:9] + [user])
    kept = mt.append_response(conv, body[:9] + [user])  # stopped at the header: the next turn opens there
    start, end = kept.response_spans[-1]
    assert kept.row.input_ids[start:end].tolist() == body[:9] + [user]
    testing.invariants.assert_row_positions(kept.row)
