"""unbatch_rollout is the inverse of the rollout batching: data-parallel dummy rows
trimmed, n > 1 samples per prompt, every field back on its own sample."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mmpipe
from mmpipe.records.generation import Completion, Generation
from mmpipe.rollout.data_parallel import pad_to_multiple, trim
from mmpipe.testing.invariants import assert_roundtrip
from mmpipe.rollout.results import unbatch_rollout

from conftest import processor_for
from strategies import raw_rows


class ScriptedEngine:
    """A rollout engine whose completions are a known function of (prompt, sample): the
    prompt's batch position and length are encoded in the ids, so misrouted outputs show."""

    def __init__(self, n, lengths):
        self.n, self.lengths = n, lengths

    def generate(self, rows, params=None):
        out = []
        for i, r in enumerate(rows):
            row = mmpipe.MultiModalInputs.from_dict(r)
            comps = []
            for j in range(self.n):
                L = self.lengths[(i + j) % len(self.lengths)]
                ids = [(row.num_tokens * 7 + i * 13 + j * 3 + k) % 500 for k in range(L)]
                comps.append(Completion(ids, [-(k + 1) / 10 for k in range(L)], "length" if L else "stop"))
            out.append(Generation(i, comps))
        return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(raw_rows(max_turns=1, max_images=2, assistant=False), min_size=1, max_size=5),
       st.integers(1, 4), st.integers(1, 3), st.lists(st.integers(0, 6), min_size=1, max_size=4))
def test_unbatch_rollout_inverts_padded_batching(raws, multiple, n, lengths):
    proc = processor_for("qwen2_vl")
    prompts = [mmpipe.encode_row(r, proc, labels=False) for r in raws]
    padded, n_real = pad_to_multiple(prompts, multiple)
    assert len(padded) % multiple == 0 and n_real == len(prompts)
    engine = ScriptedEngine(n, lengths)
    gens = trim(engine.generate(padded), n_real)
    samples = unbatch_rollout(prompts, gens)
    assert len(samples) == n_real * n
    expected = ScriptedEngine(n, lengths).generate(prompts)
    for s in samples:
        want = expected[s.prompt_index].completions[s.sample_index]
        assert s.prompt is prompts[s.prompt_index]
        assert s.response_ids.tolist() == want.token_ids
        np.testing.assert_allclose(s.logprobs, want.logprobs)
        assert s.finish_reason == want.finish_reason
        row = s.to_row()
        row.validate()
        if s.prompt.num_images:
            assert row.pixel_values_u8 is s.prompt.pixel_values_u8  # shared, not copied
    # the policy rows batch and unbatch exactly, whatever the group sizes
    rows = [s.to_row() for s in samples]
    assert_roundtrip(rows, processor=proc)


def test_trim_a_padded_batch_equals_the_real_batch():
    proc = processor_for("qwen2_vl")
    from mmpipe import testing

    prompts = [mmpipe.encode_row({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "x"}]}],
                                  "images": [testing.tiny_image(40, 60, seed=i)]}, proc) for i in range(3)]
    padded, n_real = pad_to_multiple(prompts, 4)
    full = mmpipe.collate(padded, processor=proc)
    assert_roundtrip(prompts, batch=trim(full, n_real))
